/* cmocka tests of the bench module: the report statistics and the subcommand tables. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "bench.h"
#include "decode-agree.h"
#include "decode.h"
#include "ganglion/kernels.h"
#include "layout.h"
#include "report.h"
#include "worker.h"

/* MemAvailable of /proc/meminfo in bytes, 0 when unreadable. */
static uint64_t host_available(void)
{
    unsigned long long kb = 0;
    char line[256];
    FILE *f = fopen("/proc/meminfo", "r");

    while (f != NULL && fgets(line, sizeof(line), f) != NULL) {
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1)
            break;
    }
    if (f != NULL)
        fclose(f);
    return (uint64_t)kb * 1024;
}

/*
 * One engine set-up: a worker started by `serve` with its defaults (prefix caching off,
 * as the benchmark's distinct prompts make it moot) and `bench decode`'s point with the
 * same batch, context, microbatches and ranks on one host build the same set-up, hence
 * the same KV cache type for every weight storage and the same budget; and the budget
 * follows its rules (explicit bytes as given; auto: GANG_KV_HOST_SHARE percent of the
 * host's free memory over the ranks on the CPU).
 */
static void test_engine_setup_matches_serve(void **state)
{
    static const struct {
        gang_kernels_wtype wt;
        gang_dtype kv;
    } storages[] = {{GANG_KW_F32, GANG_DTYPE_F32},
                    {GANG_KW_BF16, GANG_DTYPE_BF16},
                    {GANG_KW_F16, GANG_DTYPE_F16},
                    {GANG_KW_I8, GANG_DTYPE_F32}};
    gang_params p;
    gang_worker_config wc;
    bd_opts o;
    gang_engine_setup ws, bs;
    gang_engine_config wcfg, bcfg;
    gang_kernels *k = NULL;
    char err[256];

    (void)state;
    gang_params_defaults(&p);
    p.nnodes = 1;
    p.nproc_per_node = 4;
    p.tp = 2;
    p.pp = 2;
    p.max_batch = 8;
    p.microbatches = 2;
    p.max_step_tokens = 8 * 32;
    p.enable_prefix_caching = 0;
    assert_int_equal(gang_worker_config_from_params(&p, "/tmp/a.sock", 0, &wc, err, sizeof(err)),
                     0);
    wc.res.layout.ctx = 32 + 16; /* what gang_layout_read_model takes from the model */
    memset(&o, 0, sizeof(o));
    o.prompt = 32;
    o.tokens = 16;
    o.microbatches = 2;
    o.cuda_graphs = 1; /* bench decode's default, as serve's --cuda-graphs */
    gang__wres_engine_setup(&wc.res, &ws);
    gang__bd_engine_setup(&o, 2 * 2, 8, &bs);
    assert_int_equal(ws.max_batch, bs.max_batch);
    assert_int_equal(ws.max_ctx, bs.max_ctx);
    assert_int_equal(ws.microbatches, bs.microbatches);
    assert_int_equal(ws.max_step_tokens, bs.max_step_tokens);
    assert_int_equal(ws.kv_cache_bytes, 0);
    assert_int_equal(bs.kv_cache_bytes, 0);
    assert_int_equal(ws.kv_dtype_auto, 1);
    assert_int_equal(bs.kv_dtype_auto, 1);
    assert_int_equal(ws.prefix_caching, bs.prefix_caching);
    assert_int_equal(ws.cuda_graphs, 1);
    assert_int_equal(ws.cuda_graphs, bs.cuda_graphs);
    assert_int_equal(ws.ranks_per_host, bs.ranks_per_host);
    for (size_t i = 0; i < sizeof(storages) / sizeof(storages[0]); i++) {
        gang_engine_setup_config(&ws, storages[i].wt, 12345, &wcfg);
        gang_engine_setup_config(&bs, storages[i].wt, 12345, &bcfg);
        assert_memory_equal(&wcfg, &bcfg, sizeof(wcfg));
        assert_int_equal(wcfg.kv_dtype, storages[i].kv);
    }

    /* The budget: explicit as given; auto on the CPU a share of MemAvailable per rank. */
    assert_int_equal(gang_kernels_open("cpu", &k), 0);
    ws.kv_cache_bytes = 3u << 20;
    assert_int_equal(gang_engine_kv_budget(&ws, k), 3u << 20);
    uint64_t avail = host_available();
    if (avail == 0) {
        gang_kernels_close(k);
        printf("skipped: no MemAvailable in /proc/meminfo to check the auto KV budget with\n");
        skip();
    }
    uint64_t want = avail / 100 * GANG_KV_HOST_SHARE / 4;
    uint64_t got_b = gang_engine_kv_budget(&bs, k);
    ws.kv_cache_bytes = 0;
    uint64_t got_w = gang_engine_kv_budget(&ws, k);
    gang_kernels_close(k);
    /* Free memory moves between the reads: within 5% of each other and of the rule. */
    assert_true(got_w > want / 100 * 95 && got_w < want / 100 * 105);
    assert_true(got_b > want / 100 * 95 && got_b < want / 100 * 105);
}

static void test_median_and_percentiles(void **state)
{
    (void)state;
    double odd[] = {5, 1, 3};
    assert_true(gang_report_median(odd, 3) == 3);
    assert_true(odd[0] == 1 && odd[2] == 5); /* sorted in place */
    double even[] = {4, 1, 3, 2};
    assert_true(gang_report_median(even, 4) == 2.5);
    assert_true(isnan(gang_report_median(even, 0)));
    double v[] = {10, 20, 30, 40, 50};
    assert_true(gang_report_percentile(v, 5, 0) == 10);
    assert_true(gang_report_percentile(v, 5, 100) == 50);
    assert_true(gang_report_percentile(v, 5, 25) == 20);
    assert_true(fabs(gang_report_percentile(v, 5, 90) - 46) < 1e-9);
    double one[] = {7};
    assert_true(gang_report_percentile(one, 1, 99) == 7);
    assert_true(gang_report_round(1.23456, 2) == 1.23);
    assert_true(gang_report_round(-1.235, 1) == -1.2);
    assert_true(gang_report_round(2.5, 0) == 3);
}

static void test_add_stats(void **state)
{
    (void)state;
    double v[] = {3.14159, 1.0, 2.71828};
    cJSON *o = gang_report_new("demo");
    double p50 = gang_report_add_stats(o, "t_ms", v, 3, 2);
    assert_true(fabs(p50 - 2.71828) < 1e-12);
    char *s = cJSON_PrintUnformatted(o);
    assert_string_equal(s,
                        "{\"bench\":\"demo\",\"t_ms_p50\":2.72,\"t_ms_min\":1,\"t_ms_max\":3.14}");
    cJSON_free(s);
    assert_true(isnan(gang_report_add_stats(o, "none", v, 0, 2)));
    assert_null(cJSON_GetObjectItem(o, "none_p50"));
    cJSON_Delete(o);
}

/*
 * The shared statistics give bit for bit what the private copies of bench-pipeline.c and
 * bench-gemm.c computed before they went through report.c: the median of the middle
 * element (odd n) or the plain mean of the middle two (even n), and round(x * 10^d) / 10^d,
 * so that no JSON value those benchmarks print changed.
 */
static void test_stats_match_old_formulas(void **state)
{
    (void)state;
    uint64_t x = 88172645463325252ull;
    double v[64], w[64];

    for (int n = 1; n <= 64; n++) {
        for (int i = 0; i < n; i++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            v[i] = (double)(x >> 11) / 9007199254740992.0 * 1000.0;
        }
        memcpy(w, v, sizeof(v));
        double p50 = gang_report_median(v, n);
        gang_report_sort(w, n);
        double old = n % 2 ? w[n / 2] : (w[n / 2 - 1] + w[n / 2]) / 2.0;
        assert_memory_equal(&p50, &old, sizeof(old));
        static const double scale[] = {1, 10, 100, 1e3, 1e4};
        for (int d = 0; d <= 4; d++) {
            double a = gang_report_round(v[0], d), b = round(v[0] * scale[d]) / scale[d];
            assert_memory_equal(&a, &b, sizeof(b));
        }
    }
}

/* The tables of every benchmark: --help exits 0, an unknown or out-of-range flag 2. */
static void test_bench_tables(void **state)
{
    (void)state;
    /* Writable strings: an argv is char *[]. */
    static char names[][16] = {"rendezvous", "failover", "allreduce", "pipeline", "decode", "gemm"};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        char *help[] = {"bench", names[i], "--help"};
        char *bogus[] = {"bench", names[i], "--bogus"};
        char *range[] = {"bench", names[i], "--timeout-s", "0"};
        assert_int_equal(gang_bench_main(3, help), GANG_EXIT_OK);
        assert_int_equal(gang_bench_main(3, bogus), GANG_EXIT_USAGE);
        if (strcmp(names[i], "gemm") != 0) /* gemm has no --timeout-s */
            assert_int_equal(gang_bench_main(4, range), GANG_EXIT_USAGE);
    }
    char *unknown[] = {"bench", "nosuch"};
    assert_int_equal(gang_bench_main(2, unknown), GANG_EXIT_USAGE);
    char *kinds[] = {"bench", "failover", "--kinds", "neither"};
    assert_int_equal(gang_bench_main(4, kinds), GANG_EXIT_USAGE);
    char *serve[] = {"bench", "rendezvous", "--nodes", "2", "--", "--no-such-serve-flag"};
    assert_int_equal(gang_bench_main(6, serve), GANG_EXIT_USAGE);
    char *dev[] = {"bench", "decode", "--device", "tpu"};
    assert_int_equal(gang_bench_main(4, dev), GANG_EXIT_USAGE);
    char *batch[] = {"bench", "decode", "--batch", "1,,8"};
    assert_int_equal(gang_bench_main(4, batch), GANG_EXIT_USAGE);
    /* --shape: 8b only with --device cuda / fake; --dtypes and --layouts of the cuda path
     * are checked before any GPU is looked for. */
    char *shape[] = {"bench", "decode", "--shape", "8b"};
    assert_int_equal(gang_bench_main(4, shape), GANG_EXIT_USAGE);
    char *shape2[] = {"bench", "decode", "--device", "fake", "--shape", "70b"};
    assert_int_equal(gang_bench_main(6, shape2), GANG_EXIT_USAGE);
    char *dt[] = {"bench", "decode", "--device", "cuda", "--dtypes", "f32,int4"};
    assert_int_equal(gang_bench_main(6, dt), GANG_EXIT_USAGE);
    char *lay[] = {"bench", "decode", "--device", "cuda", "--layouts", "2x1,1x1"};
    assert_int_equal(gang_bench_main(6, lay), GANG_EXIT_USAGE);
    char *lay2[] = {"bench", "decode", "--device", "cuda", "--layouts", "1x1,ncc"};
    assert_int_equal(gang_bench_main(6, lay2), GANG_EXIT_USAGE);
}

/* A decision with token t whose two best candidates are t (lp a) and t + 1 (lp b). */
static gang__decision dec(int32_t t, float a, float b)
{
    gang__decision d = {.token = t, .n_top = 2, .ids = {t, t + 1}, .lps = {a, b}};

    return d;
}

/*
 * Layout agreement by the logits: equal tokens agree; a flip at a near-tie of 1x1 is a
 * divergence but no failure; a flip at a wide gap is a failure; nothing after a
 * divergence in the same sequence is compared (the contexts differ).
 */
static void test_decode_agreement(void **state)
{
    gang__decision base[2][3], got[2][3];
    gang__agreement ag;

    (void)state;
    /* Sequence 0: the same three decisions, one log-prob 1e-4 apart. */
    base[0][0] = dec(5, -0.5f, -2.0f), got[0][0] = dec(5, -0.5f, -2.0f);
    base[0][1] = dec(6, -0.5f, -2.0f), got[0][1] = dec(6, -0.5001f, -2.0f);
    base[0][2] = dec(7, -0.5f, -2.0f), got[0][2] = dec(7, -0.5f, -2.0f);
    /* Sequence 1: a flip at a 0.001 gap, then anything. */
    base[1][0] = dec(3, -0.7f, -0.701f);
    got[1][0] = (gang__decision){.token = 4, .n_top = 2, .ids = {4, 3}, .lps = {-0.7f, -0.7005f}};
    base[1][1] = dec(9, -0.1f, -5.0f), got[1][1] = dec(1, -0.1f, -5.0f);
    base[1][2] = dec(9, -0.1f, -5.0f), got[1][2] = dec(1, -0.1f, -5.0f);
    gang__decode_agree(&base[0][0], &got[0][0], 2, 3, 1e-2, &ag);
    assert_int_equal(ag.compared, 4);
    assert_int_equal(ag.agree, 3);
    assert_int_equal(ag.divergences, 1);
    assert_int_equal(ag.over_tol, 0);
    /* The largest difference: candidate 4 of sequence 1, -0.701 against -0.7. */
    assert_true(fabs(ag.max_abs_diff - 1e-3) < 1e-4);
    assert_true(ag.max_gap_diverged > 0.0 && ag.max_gap_diverged < 2e-3);
    /* The same flip is a failure when the tolerance is below 1x1's gap. */
    gang__decode_agree(&base[0][0], &got[0][0], 2, 3, 1e-4, &ag);
    assert_int_equal(ag.over_tol, 1);
    /* A flip at the first decision of a wide gap fails at the stated tolerance. */
    got[0][0] = dec(8, -0.5f, -2.0f);
    gang__decode_agree(&base[0][0], &got[0][0], 2, 3, 1e-2, &ag);
    assert_int_equal(ag.compared, 2);
    assert_int_equal(ag.divergences, 2);
    assert_int_equal(ag.over_tol, 1);
}

/*
 * The read-bandwidth measurement of bench decode --model: a zero size, thread count or
 * pass count is refused; a small buffer over two threads gives median, min and max in
 * order and positive.
 */
static void test_read_bandwidth(void **state)
{
    double g[3] = {0, 0, 0};

    (void)state;
    assert_int_equal(gang__read_bandwidth(0, 2, 3, g), GANG_EINVAL);
    assert_int_equal(gang__read_bandwidth(1 << 20, 0, 3, g), GANG_EINVAL);
    assert_int_equal(gang__read_bandwidth(1 << 20, 2, 0, g), GANG_EINVAL);
    assert_int_equal(gang__read_bandwidth((1 << 20) + 12, 2, 5, g), 0);
    assert_true(g[1] > 0.0);
    assert_true(g[1] <= g[0] && g[0] <= g[2]);
}

/*
 * The bytes a decode step streams: the weights a rank holds less its embedding table, at
 * the model's mean bytes per parameter (f32: exact; half the bytes: half of it); a rank
 * without the table (a later pipeline stage) streams everything it holds.
 */
static void test_stream_bytes(void **state)
{
    float dummy[1];
    gang_model m;
    /* hidden 8, q 2 x 4, kv 1 x 4, ffn 16: 64 + 2 x 32 + 64 + 3 x 128 + 16 = 592 a layer */
    double layer = 592.0, table = 10.0 * 8.0, params = 2 * layer + table + 8.0 + table;

    (void)state;
    memset(&m, 0, sizeof(m));
    m.cfg.hidden = 8;
    m.cfg.n_heads = 2;
    m.cfg.head_dim = 4;
    m.cfg.n_kv_heads = 1;
    m.cfg.ffn = 16;
    m.cfg.vocab = 10;
    m.cfg.n_layers = 2;
    m.topo.tp = 1;
    m.layer_count = 2;
    m.embed = m.final_norm = m.lm_head = dummy;
    m.shard.vocab_count = 10;
    m.weight_bytes = (size_t)(4.0 * params);
    assert_true(fabs(gang__bd_stream_bytes(&m) - 4.0 * (params - table)) < 1e-6);
    m.weight_bytes = (size_t)(2.0 * params);
    assert_true(fabs(gang__bd_stream_bytes(&m) - 2.0 * (params - table)) < 1e-6);
    m.embed = NULL;
    assert_true(fabs(gang__bd_stream_bytes(&m) - 2.0 * params) < 1e-6);
}

/*
 * --variants: the names each once, in the order given, and each a change from the flags
 * (a variant the flags already say is refused, as are an unknown name, a repeat and an
 * over-long list); "" is none.
 */
static void test_parse_variants(void **state)
{
    char err[256], lng[80];
    bd_opts o;

    (void)state;
    memset(&o, 0, sizeof(o));
    o.half_gemv = 1, o.fuse_residual = 1, o.cuda_pdl = 0;
    assert_int_equal(gang__bd_parse_variants(&o, "", err, sizeof(err)), 0);
    assert_int_equal(o.n_variants, 0);
    assert_int_equal(gang__bd_parse_variants(&o, "unfused,pdl,cublas", err, sizeof(err)), 0);
    assert_int_equal(o.n_variants, 3);
    assert_int_equal(o.variants[0], 1), assert_int_equal(o.variants[1], 0);
    assert_int_equal(o.variants[2], 2);
    assert_int_equal(gang__bd_parse_variants(&o, "pdl,nope", err, sizeof(err)), GANG_EUSAGE);
    assert_non_null(strstr(err, "'nope' is not a variant"));
    assert_int_equal(gang__bd_parse_variants(&o, "pdl,pdl", err, sizeof(err)), GANG_EUSAGE);
    assert_non_null(strstr(err, "named twice"));
    o.fuse_residual = 0; /* --fuse-residual 0: the unfused variant would be the same point */
    assert_int_equal(gang__bd_parse_variants(&o, "unfused", err, sizeof(err)), GANG_EUSAGE);
    assert_non_null(strstr(err, "--fuse-residual 0, which the flags already say"));
    memset(lng, 'p', sizeof(lng) - 1), lng[sizeof(lng) - 1] = '\0';
    assert_int_equal(gang__bd_parse_variants(&o, lng, err, sizeof(err)), GANG_EUSAGE);
    assert_non_null(strstr(err, "too long"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_median_and_percentiles),
        cmocka_unit_test(test_engine_setup_matches_serve),
        cmocka_unit_test(test_add_stats),
        cmocka_unit_test(test_stats_match_old_formulas),
        cmocka_unit_test(test_bench_tables),
        cmocka_unit_test(test_decode_agreement),
        cmocka_unit_test(test_read_bandwidth),
        cmocka_unit_test(test_stream_bytes),
        cmocka_unit_test(test_parse_variants),
    };
    return cmocka_run_group_tests_name("bench", tests, NULL, NULL);
}
