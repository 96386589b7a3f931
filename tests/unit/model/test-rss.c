/*
 * Peak resident memory of one rank's load. A 64 MiB f32 model is written once; then, for
 * each rank of tp 4 x pp 1 and tp 4 x pp 2 (and the whole model for reference), a forked
 * child loads its shard and exits, and wait4 reports that child's own peak RSS. A child
 * that loads nothing gives the baseline a fork starts from. The shard's peak above that
 * baseline must stay close to the bytes it keeps (weight_bytes) and well below the file:
 * the loader reads (pread) only its bands of the file, never the whole of it.
 * The figures are printed (docs/model.md quotes them).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "fixtures.h"

/* What a shard may hold above its weights: the release chunk of the reader (1 MiB), the
 * pages around it, malloc bookkeeping and the cJSON header parse. */
#define RSS_SLACK_BYTES (6u << 20)

/* ThreadSanitizer keeps shadow memory next to every page the loader touches, which counts
 * in the RSS: the figures say nothing about the loader then (gcc and clang spell it
 * differently). AddressSanitizer's overhead stays within the slack. */
#if defined(__SANITIZE_THREAD__)
#define RSS_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define RSS_TSAN 1
#endif
#endif

static void rss_make_model(const char *dir)
{
    gang_mkmodel_opts o;
    char err[ERRLEN];
    int status;
    pid_t pid;

    memset(&o, 0, sizeof(o));
    o.out_dir = dir;
    o.arch = GANG_ARCH_LLAMA;
    o.layers = 4;
    o.hidden = 512;
    o.heads = 8;
    o.kv_heads = 4;
    o.ffn = 1536;
    o.vocab = 4096;
    o.max_pos = 256;
    o.seed = 3;
    o.dtype = GANG_DTYPE_F32;
    o.shards = 1;
    /* In a child, so that the generator's buffers never count in the parent's RSS. */
    pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int rc = gang_mkmodel(&o, err, sizeof(err));
        if (rc != 0)
            fprintf(stderr, "mkmodel: %s\n", err);
        _exit(rc == 0 ? 0 : 1);
    }
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

/*
 * Forks a child that loads rank `rank` of layout t (nothing when t is NULL) and exits.
 * Returns the child's peak RSS in bytes; *weight_bytes receives the shard's weight bytes.
 */
static uint64_t rss_child(const char *dir, const gang_topology *t, uint32_t rank,
                          uint64_t *weight_bytes)
{
    struct rusage ru;
    uint64_t wb = 0;
    int fds[2], status;
    pid_t pid;

    assert_int_equal(pipe(fds), 0);
    pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        char err[ERRLEN];
        gang_model *m = NULL;
        int code = 0;

        close(fds[0]);
        if (t != NULL) {
            if (gang_model_load(dir, t, rank, &m, err, sizeof(err)) != 0) {
                fprintf(stderr, "load: %s\n", err);
                code = 1;
            } else {
                wb = m->weight_bytes;
                gang_model_free(m);
            }
        }
        if (write(fds[1], &wb, sizeof(wb)) != (ssize_t)sizeof(wb))
            code = 1;
        _exit(code);
    }
    close(fds[1]);
    assert_int_equal(read(fds[0], &wb, sizeof(wb)), (ssize_t)sizeof(wb));
    close(fds[0]);
    assert_int_equal(wait4(pid, &status, 0, &ru), pid);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    *weight_bytes = wb;
    return (uint64_t)ru.ru_maxrss * 1024; /* Linux reports KiB */
}

void test_load_peak_rss(void **state)
{
    static const uint32_t layouts[][2] = {{1, 1}, {4, 1}, {4, 2}};
    char *dir = fx_tmpdir(), path[4096];
    struct stat st;
    uint64_t base, file, wb, peak;
    size_t i;
    uint32_t r;
    (void)state;

#ifdef RSS_TSAN
    printf("test_load_peak_rss skipped: built with ThreadSanitizer, whose shadow memory "
           "counts in the peak RSS\n");
    fx_rmtree(dir);
    skip();
#endif
    rss_make_model(dir);
    fx_path(path, sizeof(path), dir, "model.safetensors");
    assert_int_equal(stat(path, &st), 0);
    file = (uint64_t)st.st_size;
    base = rss_child(dir, NULL, 0, &wb);
    printf("# peak RSS per rank: model file %.1f MiB, fork baseline %.1f MiB\n", file / 1048576.0,
           base / 1048576.0);
    printf("# %-8s %4s %5s %12s %14s %12s\n", "layout", "rank", "stage", "weights MiB",
           "peak-base MiB", "of file");
    for (i = 0; i < sizeof(layouts) / sizeof(layouts[0]); i++) {
        gang_topology t = fx_topo(dir, layouts[i][0], layouts[i][1]);

        for (r = 0; r < t.world_size; r++) {
            uint64_t delta;

            peak = rss_child(dir, &t, r, &wb);
            delta = peak > base ? peak - base : 0;
            printf("# tp%u.pp%u   %4u %5u %12.1f %14.1f %11.0f%%\n", t.tp, t.pp, r, r / t.tp,
                   wb / 1048576.0, delta / 1048576.0, 100.0 * (double)delta / (double)file);
            /* The load keeps its weights and not much more: never the file on top. */
            assert_true(delta <= wb + RSS_SLACK_BYTES);
            if (t.world_size > 1)
                assert_true((double)delta < 0.6 * (double)file);
        }
    }
    fflush(stdout);
    fx_rmtree(dir);
}
