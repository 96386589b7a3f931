/* cmocka tests of the common module: errors, parameters, backoff, logging. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cmocka.h>

#include "ganglion/common.h"

static void test_error_names(void **state)
{
    (void)state;
    assert_string_equal(gang_err_name(GANG_ETIMEDOUT), "GANG_ETIMEDOUT");
    assert_string_equal(gang_strerror(GANG_ESTALE), "message of an older generation");
    assert_string_equal(gang_err_name(-99999), "GANG_E?");
    assert_string_equal(gang_strerror(0), "success");
    assert_int_equal(gang_err_from_errno(110), GANG_ETIMEDOUT);
    assert_int_equal(gang_err_from_errno(32), GANG_ECONNRESET); /* EPIPE */
    assert_int_equal(gang_exit_code_for(GANG_EUSAGE), 2);
    assert_int_equal(gang_exit_code_for(GANG_EMODEL), 3);
    assert_int_equal(gang_exit_code_for(GANG_EPEER), 75);
    assert_int_equal(gang_exit_code_for(GANG_EINTERNAL), 70);
}

static void test_params_defaults_and_flags(void **state)
{
    (void)state;
    gang_params p;
    char err[256];
    gang_params_defaults(&p);
    assert_int_equal(p.heartbeat_interval_ms, 500);
    assert_int_equal(p.rdzv_port, 29400);
    assert_string_equal(p.backend, "auto");
    assert_int_equal(p.local, 0);

    char *argv[] = {"--tp", "4", "--pp=2", "--local", "serve-extra", "--model", "/m"};
    char *rest[8];
    int nrest = 0;
    assert_int_equal(gang_params_parse_args(&p, 7, argv, rest, &nrest, err, sizeof(err)), 0);
    assert_int_equal(p.tp, 4);
    assert_int_equal(p.pp, 2);
    assert_int_equal(p.local, 1);
    assert_string_equal(p.model, "/m");
    assert_int_equal(nrest, 1);
    assert_string_equal(rest[0], "serve-extra");
}

static void test_params_errors(void **state)
{
    (void)state;
    gang_params p;
    char err[256];
    gang_params_defaults(&p);
    char *bad_int[] = {"--tp", "4x"};
    assert_int_equal(gang_params_parse_args(&p, 2, bad_int, NULL, NULL, err, sizeof(err)),
                     GANG_EUSAGE);
    assert_non_null(strstr(err, "--tp"));
    char *range[] = {"--http-port=70000"};
    assert_int_equal(gang_params_parse_args(&p, 1, range, NULL, NULL, err, sizeof(err)),
                     GANG_EUSAGE);
    char *missing[] = {"--model"};
    assert_int_equal(gang_params_parse_args(&p, 1, missing, NULL, NULL, err, sizeof(err)),
                     GANG_EUSAGE);
    char *unknown[] = {"--no-such-flag"};
    assert_int_equal(gang_params_parse_args(&p, 1, unknown, NULL, NULL, err, sizeof(err)),
                     GANG_EUSAGE);
    char *badbool[] = {"--local=maybe"};
    assert_int_equal(gang_params_parse_args(&p, 1, badbool, NULL, NULL, err, sizeof(err)),
                     GANG_EUSAGE);
    /* A failed parse of one flag leaves earlier defaults intact. */
    assert_int_equal(p.tp, 1);
}

static void test_params_env_and_precedence(void **state)
{
    (void)state;
    gang_params p;
    char err[256];
    gang_params_defaults(&p);
    char *envp[] = {"PATH=/bin", "GANGLION_HEARTBEAT_TIMEOUT_MS=1234", "GANGLION_SERVICE=gang",
                    "GANGLION_LOCAL=true", NULL};
    assert_int_equal(gang_params_from_env(&p, envp, err, sizeof(err)), 0);
    assert_int_equal(p.heartbeat_timeout_ms, 1234);
    assert_string_equal(p.service, "gang");
    assert_int_equal(p.local, 1);
    /* Flags come after the environment and win. */
    char *argv[] = {"--heartbeat-timeout-ms", "99"};
    assert_int_equal(gang_params_parse_args(&p, 2, argv, NULL, NULL, err, sizeof(err)), 0);
    assert_int_equal(p.heartbeat_timeout_ms, 99);

    char *bad[] = {"GANGLION_TP=zero", NULL};
    assert_int_equal(gang_params_from_env(&p, bad, err, sizeof(err)), GANG_EUSAGE);
    assert_non_null(strstr(err, "GANGLION_TP"));

    /* gang_params_load: defaults, then the environment, then flags, in one call. */
    char *rest[2];
    int nrest = -1;
    char *args[] = {"--heartbeat-timeout-ms", "99", "extra"};
    assert_int_equal(gang_params_load(&p, envp, 3, args, rest, &nrest, err, sizeof(err)), 0);
    assert_int_equal(p.heartbeat_timeout_ms, 99);
    assert_string_equal(p.service, "gang");
    assert_int_equal(p.tp, 1);
    assert_int_equal(nrest, 1);
    assert_string_equal(rest[0], "extra");
    assert_int_equal(gang_params_load(&p, bad, 0, NULL, NULL, NULL, err, sizeof(err)), GANG_EUSAGE);
}

/* The process's minor page faults so far. */
static long minor_faults(void)
{
    struct rusage ru;

    assert_int_equal(getrusage(RUSAGE_SELF, &ru), 0);
    return ru.ru_minflt;
}

/* Pages faulted in by three rounds of a 64 MiB block allocated, written and freed, the
 * first round not counted. */
static long heap_rounds(void)
{
    const size_t n = (size_t)64 << 20;
    long f = 0;

    for (int i = 0; i < 3; i++) {
        char *p = malloc(n);

        assert_non_null(p);
        memset(p, i + 1, n);
        assert_true(p[n - 1] == (char)(i + 1));
        free(p);
        if (i == 0)
            f = minor_faults();
    }
    return minor_faults() - f;
}

/*
 * gang_heap_reuse_begin / _end: inside (nested, the outer end what counts) a freed 64 MiB
 * block's pages serve the next one (a handful of faults where a fresh block takes
 * 16,384 pages); after the last end glibc maps such a block apart again, fresh each time.
 */
static void test_heap_reuse(void **state)
{
    const long pages = (64l << 20) / 4096;
    long inside, nested, after;

    (void)state;
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
    print_message("test_heap_reuse: skipped: the sanitizer's allocator replaces glibc's malloc, "
                  "which mallopt tunes\n");
    skip();
#endif
    gang_heap_single_arena();
    gang_heap_reuse_begin();
    inside = heap_rounds();
    gang_heap_reuse_begin();
    gang_heap_reuse_end(); /* an inner end: still inside */
    nested = heap_rounds();
    gang_heap_reuse_end();
    gang_heap_reuse_end(); /* one end too many: ignored */
    after = heap_rounds();
    print_message("faults of two 64 MiB rounds: inside %ld, after an inner end %ld, after the "
                  "last end %ld (a fresh block: %ld)\n",
                  inside, nested, after, pages);
    assert_true(inside < pages / 10);
    assert_true(nested < pages / 10);
    assert_true(after > pages); /* two fresh blocks */
}

/* The environment twin of a registered boolean, read alone (gang_param_env_bool): unset
 * leaves the value, a boolean sets it, anything else is refused and leaves it, and a flag
 * that is not a registered boolean is refused. */
static void test_param_env_bool(void **state)
{
    int v = 7;

    (void)state;
    unsetenv("GANGLION_CUDA_PDL");
    assert_int_equal(gang_param_env_bool("cuda-pdl", &v), 0);
    assert_int_equal(v, 7);
    setenv("GANGLION_CUDA_PDL", "on", 1);
    assert_int_equal(gang_param_env_bool("cuda-pdl", &v), 1);
    assert_int_equal(v, 1);
    setenv("GANGLION_CUDA_PDL", "false", 1);
    assert_int_equal(gang_param_env_bool("cuda-pdl", &v), 1);
    assert_int_equal(v, 0);
    setenv("GANGLION_CUDA_PDL", "2", 1);
    v = 7;
    assert_int_equal(gang_param_env_bool("cuda-pdl", &v), GANG_EUSAGE);
    assert_int_equal(v, 7);
    unsetenv("GANGLION_CUDA_PDL");
    assert_int_equal(gang_param_env_bool("tp", &v), GANG_EINVAL);
    assert_int_equal(gang_param_env_bool("no-such-flag", &v), GANG_EINVAL);
    assert_int_equal(v, 7);
}

static void test_params_registry_complete(void **state)
{
    (void)state;
    size_t n = 0;
    const gang_param_info *r = gang_params_registry(&n);
    assert_true(n > 20);
    char env[96];
    for (size_t i = 0; i < n; i++) {
        assert_non_null(r[i].help);
        assert_true(strlen(r[i].help) > 5);
        gang_param_env_name(r[i].flag, env, sizeof(env));
        assert_int_equal(strncmp(env, "GANGLION_", 9), 0);
        assert_null(strchr(env, '-'));
        for (size_t j = i + 1; j < n; j++)
            assert_string_not_equal(r[i].flag, r[j].flag);
    }
    gang_param_env_name("heartbeat-interval-ms", env, sizeof(env));
    assert_string_equal(env, "GANGLION_HEARTBEAT_INTERVAL_MS");
    /* --help mentions every flag and its twin. */
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    gang_params_print_help(f);
    fclose(f);
    for (size_t i = 0; i < n; i++) {
        gang_param_env_name(r[i].flag, env, sizeof(env));
        assert_non_null(strstr(buf, env));
    }
    free(buf);
}

/* An option table over a private struct: every type, bounds, str_cap, rest and help. */
typedef struct opt_demo {
    int64_t n;
    double x;
    int flag;
    char name[8];
} opt_demo;

static const gang_param_info opt_demo_items[] = {
    {"n", GANG_PARAM_INT, "3", 1, 10, "count", offsetof(opt_demo, n), 0, 0, 0},
    {"x", GANG_PARAM_DOUBLE, "0.5", 0, 0, "ratio", offsetof(opt_demo, x), 0.0, 1.0, 0},
    {"flag", GANG_PARAM_BOOL, "0", 0, 1, "switch", offsetof(opt_demo, flag), 0, 0, 0},
    {"name", GANG_PARAM_STR, "ab", 0, 0, "label", offsetof(opt_demo, name), 0, 0, 8},
};
static const gang_opt_table opt_demo_table = {opt_demo_items, 4};

static void test_option_tables(void **state)
{
    (void)state;
    opt_demo o;
    char err[256];
    memset(&o, 0x5a, sizeof(o));
    gang_opts_defaults(&opt_demo_table, &o);
    assert_int_equal(o.n, 3);
    assert_true(o.x == 0.5);
    assert_int_equal(o.flag, 0);
    assert_string_equal(o.name, "ab");

    char *argv[] = {"--n", "7", "pos", "--x=0.25", "--flag", "--other", "--name", "seven"};
    char *rest[8];
    int nrest = 0;
    assert_int_equal(
        gang_opts_parse_args(&opt_demo_table, &o, 8, argv, rest, &nrest, err, sizeof(err)), 0);
    assert_int_equal(o.n, 7);
    assert_true(o.x == 0.25);
    assert_int_equal(o.flag, 1);
    assert_string_equal(o.name, "seven");
    assert_int_equal(nrest, 2);
    assert_string_equal(rest[0], "pos");
    assert_string_equal(rest[1], "--other");

    /* Unknown flags are refused when rest is NULL; every bound is checked. */
    char *bad1[] = {"--other"};
    assert_int_equal(
        gang_opts_parse_args(&opt_demo_table, &o, 1, bad1, NULL, NULL, err, sizeof(err)),
        GANG_EUSAGE);
    assert_non_null(strstr(err, "--other"));
    assert_int_equal(gang_opts_set(&opt_demo_table, &o, "x", "1.5", err, sizeof(err)), GANG_EUSAGE);
    assert_non_null(strstr(err, "[0, 1]"));
    assert_int_equal(gang_opts_set(&opt_demo_table, &o, "x", "0.3abc", err, sizeof(err)),
                     GANG_EUSAGE);
    assert_int_equal(gang_opts_set(&opt_demo_table, &o, "x", "nan", err, sizeof(err)), GANG_EUSAGE);
    assert_int_equal(gang_opts_set(&opt_demo_table, &o, "n", "11", err, sizeof(err)), GANG_EUSAGE);
    assert_int_equal(gang_opts_set(&opt_demo_table, &o, "name", "eightchr", err, sizeof(err)),
                     GANG_EUSAGE);
    assert_non_null(strstr(err, "7 bytes"));
    assert_int_equal(gang_opts_set(&opt_demo_table, &o, "name", "sevench", err, sizeof(err)), 0);
    char *noval[] = {"--n"};
    assert_int_equal(
        gang_opts_parse_args(&opt_demo_table, &o, 1, noval, NULL, NULL, err, sizeof(err)),
        GANG_EUSAGE);
    assert_non_null(strstr(err, "needs a value"));

    /* Help names every option with its default, env twins only when asked. */
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    assert_non_null(f);
    gang_opts_print_help(&opt_demo_table, f, 0);
    fclose(f);
    assert_non_null(strstr(buf, "--x X"));
    assert_non_null(strstr(buf, "default '0.5'"));
    assert_null(strstr(buf, "GANGLION_"));
    free(buf);
}

/* Subcommand command lines: --help, unknown flags, choices and integer lists. */
static void test_option_cli(void **state)
{
    (void)state;
    static const gang_opt_cmd cmd = {"demo", "[flags]", "A demo.", &opt_demo_table, 0};
    opt_demo o;
    char err[256];

    char *ok[] = {"demo", "--n=4", "--name", "q"};
    assert_int_equal(gang_opts_cli(&cmd, &o, 4, ok, NULL, NULL), 0);
    assert_int_equal(o.n, 4);
    assert_true(o.x == 0.5); /* defaults are filled first */
    char *none[] = {"demo"};
    assert_int_equal(gang_opts_cli(&cmd, &o, 1, none, NULL, NULL), 0);
    assert_int_equal(o.n, 3);
    char *bad[] = {"demo", "--n", "99"};
    assert_int_equal(gang_opts_cli(&cmd, &o, 3, bad, NULL, NULL), GANG_EUSAGE);
    char *unk[] = {"demo", "--bogus"};
    assert_int_equal(gang_opts_cli(&cmd, &o, 2, unk, NULL, NULL), GANG_EUSAGE);
    /* --help wins wherever it stands before "--", even after a bad flag. */
    char *help[] = {"demo", "--bogus", "--help"};
    assert_int_equal(gang_opts_cli(&cmd, &o, 3, help, NULL, NULL), GANG_OPTS_HELP);
    char *after[] = {"demo", "--", "--help"};
    char *rest[3];
    int nrest = 0;
    assert_int_equal(gang_opts_cli(&cmd, &o, 3, after, rest, &nrest), 0);
    assert_int_equal(nrest, 2);

    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    assert_non_null(f);
    gang_opts_cli_help(&cmd, f);
    fclose(f);
    assert_non_null(strstr(buf, "usage: ganglion demo [flags]"));
    assert_non_null(strstr(buf, "--n N"));
    free(buf);

    assert_int_equal(gang_opts_choice("backend", "mpi", "socket|mpi", err, sizeof(err)), 1);
    assert_int_equal(gang_opts_choice("backend", "socket", "socket|mpi", err, sizeof(err)), 0);
    assert_int_equal(gang_opts_choice("backend", "sock", "socket|mpi", err, sizeof(err)),
                     GANG_EUSAGE);
    assert_non_null(strstr(err, "socket|mpi"));

    int64_t v[3];
    assert_int_equal(gang_parse_i64_list("1,8", 1, 256, v, 3), 2);
    assert_int_equal(v[0], 1);
    assert_int_equal(v[1], 8);
    assert_int_equal(gang_parse_i64_list("1,2,3,4", 1, 256, v, 3), GANG_EINVAL);
    assert_int_equal(gang_parse_i64_list("1,,2", 1, 256, v, 3), GANG_EINVAL);
    assert_int_equal(gang_parse_i64_list("", 1, 256, v, 3), GANG_EINVAL);
    assert_int_equal(gang_parse_i64_list("0", 1, 256, v, 3), GANG_EINVAL);
    assert_int_equal(gang_parse_i64_list("7x", 1, 256, v, 3), GANG_EINVAL);
}

static void test_backoff(void **state)
{
    (void)state;
    gang_backoff b;
    gang_backoff_init(&b, 100, 1000, 42);
    uint64_t nominal = 100;
    for (int i = 0; i < 10; i++) {
        uint64_t d = gang_backoff_next(&b);
        assert_true(d >= nominal / 2);
        assert_true(d <= nominal);
        nominal = nominal * 2 > 1000 ? 1000 : nominal * 2;
    }
    gang_backoff_reset(&b);
    uint64_t d = gang_backoff_next(&b);
    assert_true(d >= 50 && d <= 100);
    /* Jitter: two seeds do not produce the same sequence. */
    gang_backoff a, c;
    gang_backoff_init(&a, 1000, 100000, 1);
    gang_backoff_init(&c, 1000, 100000, 2);
    int differ = 0;
    for (int i = 0; i < 8; i++)
        differ |= gang_backoff_next(&a) != gang_backoff_next(&c);
    assert_true(differ);
}

/* The limit on lines a peer causes: a burst per window, then held back and counted, the
 * count said by the next line written (in the next window). */
static void test_log_limit(void **state)
{
    (void)state;
    gang_log_limit l = {0};
    uint64_t held = 99;
    for (int i = 0; i < GANG_LOG_LIMIT_BURST; i++) {
        assert_true(gang_log_limit_allow(&l, 1000 + (uint64_t)i, &held));
        assert_int_equal(held, 0);
    }
    for (int i = 0; i < 100; i++)
        assert_false(gang_log_limit_allow(&l, 2000, &held));
    assert_false(gang_log_limit_allow(&l, 1000 + GANG_LOG_LIMIT_WINDOW_MS - 1, &held));
    assert_true(gang_log_limit_allow(&l, 1000 + GANG_LOG_LIMIT_WINDOW_MS, &held));
    assert_int_equal(held, 101);
    assert_true(gang_log_limit_allow(&l, 1000 + GANG_LOG_LIMIT_WINDOW_MS + 1, &held));
    assert_int_equal(held, 0);
}

static void test_log_lines_carry_identity(void **state)
{
    (void)state;
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    gang_log_set_fd(fds[1]);
    gang_log_set_identity(3, 7);
    gang_log_set_generation(42);
    gang_log_configure(GANG_LOG_JSON, GANG_LOG_INFO);
    gang_info("hello \"world\"");
    gang_debug("filtered out");
    gang_log_configure(GANG_LOG_TEXT, GANG_LOG_INFO);
    gang_warn("plain %d", 5);
    gang_log_set_fd(2);
    close(fds[1]);
    char buf[2048] = {0};
    ssize_t n = read(fds[0], buf, sizeof(buf) - 1);
    close(fds[0]);
    assert_true(n > 0);
    assert_non_null(
        strstr(buf, "\"node\":3,\"rank\":7,\"gen\":42,\"msg\":\"hello \\\"world\\\"\""));
    assert_null(strstr(buf, "filtered out"));
    assert_non_null(strstr(buf, "WARN  node=3 rank=7 gen=42"));
    assert_non_null(strstr(buf, "plain 5"));
    gang_log_format f;
    assert_int_equal(gang_log_parse_format("yaml", &f), GANG_EINVAL);
}

static void test_parse_and_strlcpy(void **state)
{
    (void)state;
    int64_t v;
    assert_int_equal(gang_parse_i64("12", 0, 100, &v), 0);
    assert_int_equal(v, 12);
    assert_int_equal(gang_parse_i64("", 0, 100, &v), GANG_EINVAL);
    assert_int_equal(gang_parse_i64("1 ", 0, 100, &v), GANG_EINVAL);
    assert_int_equal(gang_parse_i64("101", 0, 100, &v), GANG_ERANGE);
    char small[4];
    assert_int_equal(gang_strlcpy(small, "abcdef", sizeof(small)), GANG_ERANGE);
    assert_string_equal(small, "abc");
    assert_int_equal(gang_strlcpy(small, "ab", sizeof(small)), 0);
}

/* ---- the message codec ---- */

/* A message with one field of every kind, described once for both directions. */
typedef struct codec_msg {
    uint8_t kind;
    uint16_t port;
    uint32_t count;
    uint64_t big;
    int32_t neg;
    float temp;
    uint32_t flag; /* one byte on the wire, at most 1 */
    uint8_t nonce[5];
    float pair[2];
    uint32_t n_ids;
    int32_t ids[4];
    uint32_t blob_len;
    uint8_t blob[6];
    char name[8];
    char reason[300];
} codec_msg;

static void codec_msg_fields(gang_codec *c, codec_msg *m)
{
    gang_codec_u8(c, &m->kind);
    gang_codec_u16(c, &m->port);
    gang_codec_u32(c, &m->count);
    gang_codec_u64(c, &m->big);
    gang_codec_i32(c, &m->neg);
    gang_codec_f32(c, &m->temp);
    gang_codec_uint(c, &m->flag, 1, 1);
    gang_codec_bytes(c, m->nonce, sizeof(m->nonce));
    gang_codec_f32_array(c, m->pair, 2);
    gang_codec_i32_list(c, &m->n_ids, 1, m->ids, 4);
    gang_codec_blob(c, &m->blob_len, 4, m->blob, sizeof(m->blob));
    gang_codec_str(c, m->name, sizeof(m->name), 1);
    gang_codec_str(c, m->reason, sizeof(m->reason), 2);
}

static codec_msg codec_sample(void)
{
    codec_msg m = {.kind = 7,
                   .port = 29400,
                   .count = 0x01020304u,
                   .big = 0x1122334455667788u,
                   .neg = -5,
                   .temp = 0.75f,
                   .flag = 1,
                   .nonce = {1, 2, 3, 4, 5},
                   .pair = {-1.5f, 3.25f},
                   .n_ids = 3,
                   .ids = {10, -20, 30},
                   .blob_len = 2,
                   .blob = {0xAB, 0xCD}};
    strcpy(m.name, "worker");
    memset(m.reason, 'r', 260); /* longer than a u8 length can say */
    return m;
}

/* Encodes m into buf; returns the length (asserting success). */
static size_t codec_encode(codec_msg *m, uint8_t *buf, size_t cap)
{
    gang_codec c;
    size_t len = 0;
    gang_codec_encoder(&c, buf, cap);
    codec_msg_fields(&c, m);
    assert_int_equal(gang_codec_finish(&c, &len), 0);
    return len;
}

/* Decodes buf[0..len) from a heap copy of exactly len bytes (a read past it is a bug the
 * sanitizers see); returns finish's answer. */
static int codec_decode(const uint8_t *buf, size_t len, codec_msg *out)
{
    uint8_t *copy = malloc(len > 0 ? len : 1);
    gang_codec c;
    assert_non_null(copy);
    memcpy(copy, buf, len);
    memset(out, 0x5A, sizeof(*out));
    gang_codec_decoder(&c, copy, len);
    codec_msg_fields(&c, out);
    int rc = gang_codec_finish(&c, NULL);
    free(copy);
    return rc;
}

/* gang_parallel_slices: every index exactly once, slices aligned, the small cases. */
typedef struct slices_seen {
    unsigned char *hits;
    size_t align, bad_lo, calls;
    pthread_mutex_t lock;
} slices_seen;

static void slices_mark(void *ctx, size_t lo, size_t hi)
{
    slices_seen *s = ctx;

    pthread_mutex_lock(&s->lock);
    s->calls++;
    if (lo % s->align != 0 || lo >= hi)
        s->bad_lo++;
    pthread_mutex_unlock(&s->lock);
    for (size_t i = lo; i < hi; i++)
        s->hits[i]++; /* slices are disjoint: no two threads touch one element */
}

static void test_parallel_slices(void **state)
{
    static const size_t ns[] = {1, 2, 3, 17, 1000, 65537, 1u << 20};
    static const size_t aligns[] = {1, 2, 7, 64};

    (void)state;
    for (size_t a = 0; a < 4; a++)
        for (size_t k = 0; k < 7; k++) {
            slices_seen s = {.hits = calloc(ns[k], 1), .align = aligns[a]};

            assert_non_null(s.hits);
            pthread_mutex_init(&s.lock, NULL);
            gang_parallel_slices(ns[k], aligns[a], 100, slices_mark, &s);
            for (size_t i = 0; i < ns[k]; i++)
                if (s.hits[i] != 1)
                    fail_msg("n %zu align %zu: element %zu ran %u times", ns[k], aligns[a], i,
                             s.hits[i]);
            assert_int_equal(s.bad_lo, 0);
            assert_true(s.calls >= 1 && s.calls <= GANG_SLICES_MAX);
            if (ns[k] < 200) /* min_per_thread 100: one slice */
                assert_int_equal(s.calls, 1);
            pthread_mutex_destroy(&s.lock);
            free(s.hits);
        }
    /* n = 0: fn never runs */
    slices_seen z = {.hits = NULL, .align = 1};
    pthread_mutex_init(&z.lock, NULL);
    gang_parallel_slices(0, 1, 1, slices_mark, &z);
    assert_int_equal(z.calls, 0);
    pthread_mutex_destroy(&z.lock);
}

static void test_codec_round_trip(void **state)
{
    (void)state;
    codec_msg m = codec_sample(), back;
    uint8_t buf[512];
    size_t len = codec_encode(&m, buf, sizeof(buf));
    /* 1+2+4+8+4+4+1+5+8 + 1+12 + 4+2 + 1+6 + 2+260 */
    assert_int_equal(len, 37 + 13 + 6 + 7 + 262);
    /* Little-endian on every host: the u16, then the u32's lowest byte first. */
    assert_int_equal(buf[1], 29400 & 0xFF);
    assert_int_equal(buf[2], 29400 >> 8);
    assert_memory_equal(buf + 3, "\x04\x03\x02\x01", 4);
    assert_int_equal(buf[7], 0x88);
    assert_int_equal(codec_decode(buf, len, &back), 0);
    assert_int_equal(back.kind, 7);
    assert_int_equal(back.port, 29400);
    assert_int_equal(back.count, m.count);
    assert_true(back.big == m.big);
    assert_int_equal(back.neg, -5);
    assert_true(back.temp == 0.75f);
    assert_int_equal(back.flag, 1);
    assert_memory_equal(back.nonce, m.nonce, sizeof(m.nonce));
    assert_true(back.pair[0] == -1.5f && back.pair[1] == 3.25f);
    assert_int_equal(back.n_ids, 3);
    assert_memory_equal(back.ids, m.ids, 3 * sizeof(int32_t));
    assert_int_equal(back.ids[3], 0x5A5A5A5A); /* nothing past the count was written */
    assert_int_equal(back.blob_len, 2);
    assert_memory_equal(back.blob, m.blob, 2);
    assert_string_equal(back.name, "worker");
    assert_int_equal(strlen(back.reason), 260);

    /* Measuring (NULL buffer) and a buffer one byte short: the size either way. */
    gang_codec c;
    gang_codec_encoder(&c, NULL, 0);
    codec_msg_fields(&c, &m);
    assert_int_equal(gang_codec_finish(&c, NULL), GANG_EMSGSIZE);
    assert_int_equal(c.off, len);
    gang_codec_encoder(&c, buf, len - 1);
    codec_msg_fields(&c, &m);
    assert_int_equal(gang_codec_finish(&c, NULL), GANG_EMSGSIZE);
    assert_int_equal(c.off, len);
}

static void test_codec_truncation_and_trailing(void **state)
{
    (void)state;
    codec_msg m = codec_sample(), back;
    uint8_t buf[512];
    size_t len = codec_encode(&m, buf, sizeof(buf));
    /* Every proper prefix of the message is refused. */
    for (size_t cut = 0; cut < len; cut++)
        assert_int_equal(codec_decode(buf, cut, &back), GANG_EPROTO);
    /* So is one extra byte. */
    buf[len] = 0;
    assert_int_equal(codec_decode(buf, len + 1, &back), GANG_EPROTO);
    assert_int_equal(codec_decode(buf, len, &back), 0);
}

static void test_codec_bounds(void **state)
{
    (void)state;
    codec_msg m = codec_sample(), back;
    uint8_t buf[512];
    gang_codec c;

    /* Encoding a field out of its bounds is EINVAL whatever the room. */
    codec_msg bad = m;
    bad.n_ids = 5;
    gang_codec_encoder(&c, buf, sizeof(buf));
    codec_msg_fields(&c, &bad);
    assert_int_equal(gang_codec_finish(&c, NULL), GANG_EINVAL);
    gang_codec_encoder(&c, NULL, 0);
    codec_msg_fields(&c, &bad);
    assert_int_equal(gang_codec_finish(&c, NULL), GANG_EINVAL);
    bad = m;
    bad.flag = 2;
    gang_codec_encoder(&c, buf, sizeof(buf));
    codec_msg_fields(&c, &bad);
    assert_int_equal(gang_codec_finish(&c, NULL), GANG_EINVAL);
    bad = m;
    memset(bad.name, 'x', sizeof(bad.name)); /* no NUL within its capacity */
    gang_codec_encoder(&c, buf, sizeof(buf));
    codec_msg_fields(&c, &bad);
    assert_int_equal(gang_codec_finish(&c, NULL), GANG_EINVAL);
    char longname[300];
    memset(longname, 'y', 299);
    longname[299] = '\0';
    gang_codec_encoder(&c, buf, sizeof(buf));
    gang_codec_str(&c, longname, sizeof(longname), 1); /* 299 does not fit a u8 length */
    assert_int_equal(gang_codec_finish(&c, NULL), GANG_EINVAL);

    /* Decoding: a count, a flag, a blob length or a string length over its maximum, and
     * a string with a NUL inside, are refused. Offsets follow codec_msg_fields. */
    size_t len = codec_encode(&m, buf, sizeof(buf));
    const size_t off_flag = 23, off_nids = off_flag + 1 + 5 + 8, off_blob = off_nids + 1 + 12;
    const size_t off_name = off_blob + 4 + 2;
    assert_int_equal(buf[off_flag], 1);
    assert_int_equal(buf[off_nids], 3);
    assert_int_equal(buf[off_blob], 2);
    assert_int_equal(buf[off_name], 6);
    const struct {
        size_t at;
        uint8_t value;
    } corrupt[] = {{off_flag, 2},     {off_nids, 5}, {off_nids, 0xFF},  {off_blob, 7},
                   {off_blob + 3, 1}, {off_name, 8}, {off_name + 3, 0}, {off_name + 7 + 1, 0x2C}};
    for (size_t i = 0; i < sizeof(corrupt) / sizeof(corrupt[0]); i++) {
        uint8_t copy[512];
        memcpy(copy, buf, len);
        copy[corrupt[i].at] = corrupt[i].value;
        assert_int_equal(codec_decode(copy, len, &back), GANG_EPROTO);
    }

    /* A refusal by the description itself sticks and wins over later fields. */
    gang_codec_decoder(&c, buf, len);
    gang_codec_fail(&c, GANG_ERANGE);
    codec_msg_fields(&c, &back);
    assert_int_equal(c.off, 0);
    assert_int_equal(gang_codec_finish(&c, NULL), GANG_ERANGE);
    assert_false(gang_codec_ok(&c));
    /* A width the codec does not know is a broken description. */
    uint32_t v = 1;
    gang_codec_encoder(&c, buf, sizeof(buf));
    gang_codec_uint(&c, &v, 3, 10);
    assert_int_equal(gang_codec_finish(&c, NULL), GANG_EINVAL);
}

int gang_test_dynlib(void); /* test-dynlib.c */

int main(void)
{
    int failed;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_error_names),
        cmocka_unit_test(test_log_limit),
        cmocka_unit_test(test_params_defaults_and_flags),
        cmocka_unit_test(test_parallel_slices),
        cmocka_unit_test(test_params_errors),
        cmocka_unit_test(test_params_env_and_precedence),
        cmocka_unit_test(test_param_env_bool),
        cmocka_unit_test(test_heap_reuse),
        cmocka_unit_test(test_params_registry_complete),
        cmocka_unit_test(test_option_tables),
        cmocka_unit_test(test_option_cli),
        cmocka_unit_test(test_backoff),
        cmocka_unit_test(test_log_lines_carry_identity),
        cmocka_unit_test(test_parse_and_strlcpy),
        cmocka_unit_test(test_codec_round_trip),
        cmocka_unit_test(test_codec_truncation_and_trailing),
        cmocka_unit_test(test_codec_bounds),
    };
    failed = cmocka_run_group_tests_name("common", tests, NULL, NULL);
    failed += gang_test_dynlib();
    return failed ? 1 : 0;
}
