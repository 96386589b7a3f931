/*
 * ganglion bench matmul: the CPU typed-weight matmul (gang_kernels_matmul over bf16, f16
 * and int8 weights, kernels/cpu/cpu-matmul*.c) against OpenBLAS's sgemm on the same
 * weights in f32, in the same run, at 1 thread and at every thread of the process.
 *
 * Method: per shape (N x K weights, Hugging Face's [out, in]) enough copies of the
 * weights to exceed 64 MiB in f32 (more than this machine's L3), so that each call reads
 * its weights from memory as a decode step does; per batch m and thread count, `--warmup`
 * untimed rounds, then `--iters` timed rounds, each a pass over every copy with each
 * storage type in turn. One JSON line per (shape, m, threads, type): median / min / max
 * microseconds per call, the weight bytes it read per second (GB/s, from the median),
 * GFLOP/s (2 m N K), and "vs_sgemm" = sgemm's median time / this one (> 1: faster than
 * f32 OpenBLAS). The read bandwidth that decode's roofline needs is the GB/s of the
 * m = 1 rows. A short table goes to stderr.
 */
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "bench.h"
#include "report.h"
#include "ganglion/common.h"
#include "ganglion/kernels.h"

#include "../kernels/kernels-bench.h" /* thread counts of the CPU backend and OpenBLAS */

#define BM_MAX_SHAPES 16
#define BM_MAX_BATCHES 8
#define BM_MAX_ITERS 1000
#define BM_WORKING_SET (64u << 20)
#define BM_TYPES 4 /* f32 (sgemm), bf16, f16, int8 */

typedef struct bm_flags {
    char shapes[256], batch[64];
    int64_t iters, warmup;
} bm_flags;

#define BM_INT(f_, fld, d, l, h, hp) GANG_OPT_INT(bm_flags, f_, fld, #d, l, h, hp)
static const gang_param_info bm_items[] = {
    {.flag = "shapes",
     .type = GANG_PARAM_STR,
     .def = "1536x576,576x1536,49152x576",
     .help = "NxK[,NxK...]: weights [N out, K in] (default: SmolLM2-135M's gate/up, down and "
             "LM head)",
     .offset = offsetof(bm_flags, shapes),
     .str_cap = sizeof(((bm_flags *)0)->shapes)},
    {.flag = "batch",
     .type = GANG_PARAM_STR,
     .def = "1,32",
     .help = "rows of x per call, comma-separated",
     .offset = offsetof(bm_flags, batch),
     .str_cap = sizeof(((bm_flags *)0)->batch)},
    BM_INT("iters", iters, 15, 1, BM_MAX_ITERS, "timed rounds"),
    BM_INT("warmup", warmup, 2, 0, BM_MAX_ITERS, "untimed rounds first"),
};
static const gang_opt_table bm_table = GANG_OPT_TABLE(bm_items);
static const gang_opt_cmd bm_cmd = {
    "bench matmul", "[flags]",
    "The CPU matmul over bf16 / f16 / int8 weights against OpenBLAS sgemm on f32 weights,\n"
    "at 1 thread and all; JSON lines with median/min/max us, GB/s of weights read, GFLOP/s\n"
    "and the speed-up over sgemm.",
    &bm_table, 0};

/* Parses "a[,b...]" of positive integers (<= 1e6) into v; returns the count or -1. */
static int bm_list(const char *s, char sep2, size_t *v, int cap)
{
    int n = 0;

    while (*s != '\0' && n < cap) {
        char *end;
        unsigned long long x;

        errno = 0;
        x = strtoull(s, &end, 10);
        if (errno != 0 || end == s || x == 0 || x > 1000000ull)
            return -1;
        v[n++] = (size_t)x;
        s = end;
        if (*s == ',' || (sep2 != '\0' && *s == sep2))
            s++;
        else if (*s != '\0')
            return -1;
    }
    return *s == '\0' ? n : -1;
}

static double bm_now_us(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

/* One shape's weights: `copies` packed copies of each type, and x / y for the largest m. */
typedef struct bm_set {
    size_t n, k, copies;
    void *w[BM_TYPES][64];
} bm_set;

static const gang_kernels_wtype bm_types[BM_TYPES] = {GANG_KW_F32, GANG_KW_BF16, GANG_KW_F16,
                                                      GANG_KW_I8};

static int bm_set_init(bm_set *s, size_t n, size_t k)
{
    float *src = malloc(n * k * sizeof(float));
    uint32_t x = 12345u;
    int rc = 0;

    memset(s, 0, sizeof(*s));
    s->n = n, s->k = k;
    s->copies = BM_WORKING_SET / (n * k * sizeof(float)) + 1;
    if (s->copies > 64)
        s->copies = 64;
    if (src == NULL)
        return GANG_ENOMEM;
    for (size_t i = 0; i < n * k; i++) {
        x = x * 1664525u + 1013904223u;
        src[i] = ((float)(x >> 8) / (float)(1u << 23) - 1.0f) * 0.05f;
    }
    for (int t = 0; t < BM_TYPES && rc == 0; t++) {
        for (size_t c = 0; c < s->copies && rc == 0; c++) {
            s->w[t][c] = malloc(gang_kernels_weight_bytes(bm_types[t], n, k));
            rc = s->w[t][c] == NULL ? GANG_ENOMEM
                                    : gang_kernels_weight_pack(bm_types[t], src, n, k, s->w[t][c]);
        }
    }
    free(src);
    return rc;
}

static void bm_set_free(bm_set *s)
{
    for (int t = 0; t < BM_TYPES; t++)
        for (size_t c = 0; c < s->copies; c++)
            free(s->w[t][c]);
}

/* Times[t][it]: microseconds per call of type t in timed round it. */
static int bm_run(gang_kernels *kh, const bm_set *s, size_t m, int warmup, int iters,
                  const float *x, float *y, double times[BM_TYPES][BM_MAX_ITERS])
{
    for (int it = 0; it < warmup + iters; it++) {
        for (int t = 0; t < BM_TYPES; t++) {
            double t0 = bm_now_us();

            for (size_t c = 0; c < s->copies; c++) {
                gang_kernels_weight w =
                    gang_kernels_weight_view(bm_types[t], s->w[t][c], s->n, s->k);
                int rc = gang_kernels_matmul(kh, m, s->n, s->k, x, &w, y);

                if (rc != 0)
                    return rc;
            }
            if (it >= warmup)
                times[t][it - warmup] = (bm_now_us() - t0) / (double)s->copies;
        }
    }
    return 0;
}

static void bm_emit(const bm_set *s, size_t m, unsigned threads, int t, double *v, int iters,
                    double sgemm_us)
{
    cJSON *o = gang_report_new("matmul");
    double med, bytes = (double)gang_kernels_weight_bytes(bm_types[t], s->n, s->k);

    cJSON_AddStringToObject(o, "type", t == 0 ? "f32-sgemm" : gang_kernels_wtype_name(bm_types[t]));
    cJSON_AddNumberToObject(o, "n", (double)s->n);
    cJSON_AddNumberToObject(o, "k", (double)s->k);
    cJSON_AddNumberToObject(o, "m", (double)m);
    cJSON_AddNumberToObject(o, "threads", threads);
    cJSON_AddNumberToObject(o, "copies", (double)s->copies);
    med = gang_report_add_stats(o, "us", v, iters, 1);
    gang_report_add_num(o, "gb_per_s", bytes / med / 1e3, 2);
    gang_report_add_num(o, "gflop_per_s", 2.0 * (double)m * (double)s->n * (double)s->k / med / 1e3,
                        2);
    gang_report_add_num(o, "vs_sgemm", sgemm_us / med, 3);
    fprintf(stderr, "%6zu x %-6zu m %-3zu thr %u %-9s %9.1f us %7.2f GB/s %8.2f GF/s  x%.2f\n",
            s->n, s->k, m, threads, t == 0 ? "f32-sgemm" : gang_kernels_wtype_name(bm_types[t]),
            med, bytes / med / 1e3, 2.0 * (double)m * (double)s->n * (double)s->k / med / 1e3,
            sgemm_us / med);
    gang_report_emit(o);
}

static double bm_times[BM_TYPES][BM_MAX_ITERS];

/* One shape at every batch and thread count. */
static int bm_shape(gang_kernels *kh, size_t n, size_t k, const size_t *ms, int nm, int warmup,
                    int iters)
{
    size_t mmax = 0;
    unsigned all = gang__kernels_cpu_threads(0);
    float *x, *y;
    static bm_set s; /* 6 KiB of pointers: off the stack */
    int rc;

    memset(&s, 0, sizeof(s));
    for (int i = 0; i < nm; i++)
        mmax = ms[i] > mmax ? ms[i] : mmax;
    x = malloc(mmax * k * sizeof(float));
    y = malloc(mmax * n * sizeof(float));
    rc = x == NULL || y == NULL ? GANG_ENOMEM : bm_set_init(&s, n, k);
    for (size_t i = 0; rc == 0 && i < mmax * k; i++)
        x[i] = (float)((i * 7) % 13) / 13.0f - 0.5f;
    for (int i = 0; rc == 0 && i < nm; i++) {
        for (unsigned th = 1; rc == 0 && th <= all; th = th == all ? all + 1 : all) {
            gang__kernels_cpu_threads(th);
            rc = bm_run(kh, &s, ms[i], warmup, iters, x, y, bm_times);
            for (int t = 0; rc == 0 && t < BM_TYPES; t++) {
                double sg;

                gang_report_sort(bm_times[0], iters);
                sg = gang_report_median(bm_times[0], iters);
                bm_emit(&s, ms[i], th, t, bm_times[t], iters, sg);
            }
        }
    }
    gang__kernels_cpu_threads(all);
    bm_set_free(&s);
    free(x);
    free(y);
    return rc;
}

int gang_bench_matmul_main(int argc, char **argv)
{
    size_t shp[2 * BM_MAX_SHAPES], ms[BM_MAX_BATCHES];
    bm_flags f;
    gang_kernels *kh = NULL;
    int ns, nm, rc;

    memset(&f, 0, sizeof(f));
    rc = gang_opts_cli(&bm_cmd, &f, argc, argv, NULL, NULL);
    if (rc != 0)
        return rc == GANG_OPTS_HELP ? GANG_EXIT_OK : GANG_EXIT_USAGE;
    ns = bm_list(f.shapes, 'x', shp, 2 * BM_MAX_SHAPES);
    nm = bm_list(f.batch, '\0', ms, BM_MAX_BATCHES);
    if (ns <= 0 || ns % 2 != 0 || nm <= 0)
        return gang_opts_usage_error(&bm_cmd, "--shapes NxK[,NxK...] and --batch M[,M...] with "
                                              "each 1..1000000");
    if ((rc = gang_kernels_open("cpu", &kh)) != 0)
        return gang_exit_code_for(rc);
    fprintf(stderr, "weights read from memory: >= %u MiB of f32 copies per shape\n",
            BM_WORKING_SET >> 20);
    for (int i = 0; rc == 0 && i < ns; i += 2)
        rc = bm_shape(kh, shp[i], shp[i + 1], ms, nm, (int)f.warmup, (int)f.iters);
    gang_kernels_close(kh);
    if (rc != 0) {
        fprintf(stderr, "ganglion bench matmul: %s\n", gang_strerror(rc));
        return gang_exit_code_for(rc);
    }
    return GANG_EXIT_OK;
}
