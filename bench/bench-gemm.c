/*
 * ganglion bench gemm: our GEMM path (cuBLASLt with the per-shape plan cache of the
 * "cuda" kernels backend) against a direct cublasGemmEx call, on the same GPU, buffers,
 * stream and workspace, in the same run.
 *
 * Method (nccl-tests style): per shape, random inputs, `--warmup` untimed rounds, then
 * `--iters` timed rounds; each round runs ours then the peer, each between its own pair
 * of CUDA events, so both see the same clocks and caches. One JSON line per shape with
 * the median, min and max milliseconds of each, TFLOP/s from the medians (2*m*n*k flops),
 * the ratio ours/peer, and the largest relative difference between the two outputs; then
 * a summary line. A short human table goes to stderr.
 *
 * Shapes: "MxNxK" with C[M,N] = A[M,K] . B^T, B stored [N,K] as Hugging Face stores
 * linear weights (trans_b = 1). The default set is the squares 4096^3 and 8192^3 and the
 * projections of a Llama-3.2-1B-like model (hidden 2048, 32 heads / 8 KV heads of 64,
 * FFN 8192, vocab 128256) at m = 1 (decode), 64 and 512 (prefill chunks).
 *
 * Without a GPU (or without CUDA in the build) it prints why, one JSON line with
 * "skipped", and exits 0.
 */
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "bench.h"
#include "report.h"
#include "ganglion/common.h"
#include "ganglion/kernels.h"

/* The measuring primitive (our GEMM against cuBLAS on the device); private to the
 * kernels module and this benchmark. */
#include "../kernels/kernels-bench.h"

#define BG_MAX_SHAPES 64
#define BG_MAX_ITERS 10000

typedef struct bg_shape {
    size_t m, n, k;
    char what[32]; /* "square", "qkv", ... */
} bg_shape;

typedef struct bg_opts {
    bg_shape shapes[BG_MAX_SHAPES];
    int nshapes;
    gang_dtype dt;
    int warmup, iters, device_index;
    uint64_t pool_mb; /* 0: sized from the largest shape */
} bg_opts;

static const char *bg_dtype_name(gang_dtype dt)
{
    return dt == GANG_DTYPE_BF16 ? "bf16" : dt == GANG_DTYPE_F16 ? "f16" : "f32";
}

static void bg_add(bg_opts *o, size_t m, size_t n, size_t k, const char *what)
{
    if (o->nshapes >= BG_MAX_SHAPES)
        return;
    o->shapes[o->nshapes] = (bg_shape){.m = m, .n = n, .k = k};
    snprintf(o->shapes[o->nshapes].what, sizeof(o->shapes[0].what), "%s", what);
    o->nshapes++;
}

static void bg_default_shapes(bg_opts *o)
{
    static const size_t ms[] = {1, 64, 512};

    bg_add(o, 4096, 4096, 4096, "square");
    bg_add(o, 8192, 8192, 8192, "square");
    for (int i = 0; i < 3; i++) {
        bg_add(o, ms[i], 3072, 2048, "llama1b-qkv");
        bg_add(o, ms[i], 2048, 2048, "llama1b-o");
        bg_add(o, ms[i], 8192, 2048, "llama1b-gate/up");
        bg_add(o, ms[i], 2048, 8192, "llama1b-down");
        bg_add(o, ms[i], 128256, 2048, "llama1b-lm-head");
    }
}

/* Parses "MxNxK[,MxNxK...]"; GANG_EUSAGE with a message on a malformed entry. */
static int bg_parse_shapes(bg_opts *o, const char *spec)
{
    const char *p = spec;

    o->nshapes = 0;
    while (*p != '\0') {
        unsigned long long v[3];
        char *end;

        for (int i = 0; i < 3; i++) {
            errno = 0;
            v[i] = strtoull(p, &end, 10);
            if (errno != 0 || end == p || v[i] == 0 || v[i] > 1000000ull ||
                (i < 2 && *end != 'x')) {
                fprintf(stderr,
                        "ganglion bench gemm: bad shape in '%s' (expected MxNxK with "
                        "1 <= each <= 1000000, comma-separated)\n",
                        spec);
                return GANG_EUSAGE;
            }
            p = end + (i < 2);
        }
        bg_add(o, (size_t)v[0], (size_t)v[1], (size_t)v[2], "custom");
        if (*p == ',')
            p++;
        else if (*p != '\0')
            return GANG_EUSAGE;
    }
    return o->nshapes > 0 ? 0 : GANG_EUSAGE;
}

/* The command line as the option table holds it. */
typedef struct bg_flags {
    char shapes[1024];
    char dtype[8];
    int64_t iters, warmup, device_index, pool_mb;
} bg_flags;

#define BG_INT(f_, fld, d, l, h, hp) GANG_OPT_INT(bg_flags, f_, fld, #d, l, h, hp)
static const gang_param_info bg_items[] = {
    {.flag = "shapes",
     .type = GANG_PARAM_STR,
     .def = "",
     .offset = offsetof(bg_flags, shapes),
     .help = "MxNxK[,MxNxK...] (default: 4096^3, 8192^3 and Llama-1B-like shapes at m = 1, "
             "64, 512)",
     .str_cap = sizeof(((bg_flags *)0)->shapes)},
    {.flag = "dtype",
     .type = GANG_PARAM_STR,
     .def = "bf16",
     .help = "bf16, f16 or f32",
     .offset = offsetof(bg_flags, dtype),
     .str_cap = sizeof(((bg_flags *)0)->dtype)},
    BG_INT("iters", iters, 20, 1, BG_MAX_ITERS, "timed rounds per shape"),
    BG_INT("warmup", warmup, 5, 0, BG_MAX_ITERS, "untimed rounds first"),
    BG_INT("device-index", device_index, 0, 0, 1023, "the GPU"),
    BG_INT("gpu-memory-mb", pool_mb, 0, 64, 16777216, "the pool (default: from the largest shape)"),
};
static const gang_opt_table bg_table = GANG_OPT_TABLE(bg_items);
static const gang_opt_cmd bg_cmd = {
    "bench gemm", "[flags]",
    "Our cuBLASLt GEMM path against a direct cublasGemmEx, C = A . B^T (B stored [N,K]);\n"
    "JSON lines with median/min/max ms, TFLOP/s and the ratio. Without a GPU: one\n"
    "\"skipped\" line, exit 0.",
    &bg_table, 0};

/* Parses argv into o; returns 0, GANG_OPTS_HELP, or GANG_EUSAGE (printed). */
static int bg_parse(int argc, char **argv, bg_opts *o)
{
    bg_flags f;
    char err[128];
    int rc;

    memset(o, 0, sizeof(*o));
    memset(&f, 0, sizeof(f));
    rc = gang_opts_cli(&bg_cmd, &f, argc, argv, NULL, NULL);
    if (rc != 0)
        return rc;
    rc = gang_opts_choice("dtype", f.dtype, "bf16|f16|f32", err, sizeof(err));
    if (rc < 0)
        return gang_opts_usage_error(&bg_cmd, "%s", err);
    o->dt = rc == 0 ? GANG_DTYPE_BF16 : rc == 1 ? GANG_DTYPE_F16 : GANG_DTYPE_F32;
    o->iters = (int)f.iters;
    o->warmup = (int)f.warmup;
    o->device_index = (int)f.device_index;
    o->pool_mb = (uint64_t)f.pool_mb;
    if (f.shapes[0] == '\0')
        bg_default_shapes(o);
    else if (bg_parse_shapes(o, f.shapes) < 0)
        return GANG_EUSAGE;
    return 0;
}

/* Pool for the largest shape: A, B and two outputs, plus the workspace and some slack. */
static uint64_t bg_pool_mb(const bg_opts *o)
{
    size_t es = o->dt == GANG_DTYPE_F32 ? 4 : 2;
    double worst = 0.0;

    for (int i = 0; i < o->nshapes; i++) {
        const bg_shape *s = &o->shapes[i];
        double b = ((double)s->m * s->k + (double)s->n * s->k + 2.0 * s->m * s->n) * es;
        if (b > worst)
            worst = b;
    }
    return (uint64_t)(worst * 1.1 / 1048576.0) + 256;
}

static int bg_skip(const char *why)
{
    cJSON *o = gang_report_new("gemm");

    fprintf(stderr, "ganglion bench gemm: skipped: %s\n", why);
    cJSON_AddStringToObject(o, "skipped", why);
    gang_report_emit(o);
    return GANG_EXIT_OK;
}

/* Fills n elements of dt with a fixed pseudo-random sequence in [-1, 1) (seed: 1 for A,
 * 2 for B, as the benchmark always did). */
static void bg_fill(void *p, gang_dtype dt, size_t n, uint32_t seed)
{
    uint32_t x = seed * 2654435761u + 1u;

    for (size_t i = 0; i < n; i++) {
        x = x * 1664525u + 1013904223u;
        float v = (float)(x >> 8) / (float)(1u << 23) - 1.0f;
        if (dt == GANG_DTYPE_F16)
            ((uint16_t *)p)[i] = gang_f32_to_f16(v);
        else if (dt == GANG_DTYPE_BF16)
            ((uint16_t *)p)[i] = gang_f32_to_bf16(v);
        else
            ((float *)p)[i] = v;
    }
}

static double bg_load(const void *p, gang_dtype dt, size_t i)
{
    if (dt == GANG_DTYPE_F16)
        return gang_f16_to_f32(((const uint16_t *)p)[i]);
    if (dt == GANG_DTYPE_BF16)
        return gang_bf16_to_f32(((const uint16_t *)p)[i]);
    return ((const float *)p)[i];
}

/* Largest |x - y| / max(1, |y|) over count elements of dt; NaN counts as the worst. */
static double bg_max_rel_diff(const void *x, const void *y, gang_dtype dt, size_t count)
{
    double worst = 0.0;

    for (size_t i = 0; i < count; i++) {
        double u = bg_load(x, dt, i), v = bg_load(y, dt, i);
        double d = fabs(u - v) / fmax(1.0, fabs(v));

        if (!(d <= worst))
            worst = isnan(d) ? INFINITY : d;
    }
    return worst;
}

/*
 * Measures one shape: random inputs uploaded once, then warmup + iters rounds of our GEMM
 * and the cuBLAS peer on the same inputs (gang__kernels_gemm_pair, each timed on the
 * device), writing the timed rounds to ours_ms[] and ref_ms[] (iters entries each), and
 * the largest relative difference of the two outputs of the last round. Buffers come from
 * the handle's pool and are returned before this does (a shape too big is GANG_ENOMEM).
 */
static int bg_measure(gang_kernels *k, gang_dtype dt, int trans_b, size_t m, size_t n, size_t kdim,
                      int warmup, int iters, double *ours_ms, double *ref_ms, double *max_rel_diff)
{
    size_t es = gang_dtype_size(dt), na, nb, nc, nmax;
    void *a = NULL, *b = NULL, *c1 = NULL, *c2 = NULL, *hx = NULL, *hy = NULL;
    int rc;

    if (es == 0 || dt == GANG_DTYPE_I32 || warmup < 0 || iters < 1)
        return GANG_EINVAL;
    if (__builtin_mul_overflow(m, kdim, &na) || __builtin_mul_overflow(n, kdim, &nb) ||
        __builtin_mul_overflow(m, n, &nc))
        return GANG_ERANGE;
    nmax = na > nb ? (na > nc ? na : nc) : (nb > nc ? nb : nc);
    if (nmax > SIZE_MAX / es)
        return GANG_ERANGE;
    hx = malloc(nmax * es);
    hy = malloc(nc * es);
    if (hx == NULL || hy == NULL) {
        rc = GANG_ENOMEM;
        goto out_free;
    }
    if ((rc = gang_kernels_alloc(k, na * es, &a)) < 0 ||
        (rc = gang_kernels_alloc(k, nb * es, &b)) < 0 ||
        (rc = gang_kernels_alloc(k, nc * es, &c1)) < 0 ||
        (rc = gang_kernels_alloc(k, nc * es, &c2)) < 0)
        goto out_free;
    bg_fill(hx, dt, na, 1);
    if ((rc = gang_kernels_upload(k, a, hx, na * es)) < 0)
        goto out_free;
    bg_fill(hx, dt, nb, 2);
    if ((rc = gang_kernels_upload(k, b, hx, nb * es)) < 0)
        goto out_free;
    for (int it = 0; it < warmup + iters; it++) {
        float t_ours = 0.0f, t_ref = 0.0f;

        rc = gang__kernels_gemm_pair(k, dt, trans_b, m, n, kdim, a, b, c1, c2, &t_ours, &t_ref);
        if (rc < 0)
            goto out_free;
        if (it >= warmup) {
            ours_ms[it - warmup] = t_ours;
            ref_ms[it - warmup] = t_ref;
        }
    }
    if ((rc = gang_kernels_download(k, hx, c1, nc * es)) < 0 ||
        (rc = gang_kernels_download(k, hy, c2, nc * es)) < 0)
        goto out_free;
    *max_rel_diff = bg_max_rel_diff(hx, hy, dt, nc);

out_free:
    gang_kernels_free(k, c2);
    gang_kernels_free(k, c1);
    gang_kernels_free(k, b);
    gang_kernels_free(k, a);
    free(hy);
    free(hx);
    return rc;
}

int gang_bench_gemm_main(int argc, char **argv)
{
    bg_opts o;
    gang_kernels_options ko;
    gang_kernels *k = NULL;
    double *ours = NULL, *ref = NULL, ratio_sum = 0.0, worst_diff = 0.0;
    int rc, done = 0, failed = 0;

    rc = bg_parse(argc, argv, &o);
    if (rc != 0)
        return rc == GANG_OPTS_HELP ? GANG_EXIT_OK : GANG_EXIT_USAGE;
    if (gang_kernels_device_count() == 0) {
        gang_device_info probe;

        if (gang_kernels_device_info(0, &probe) == GANG_ENOSYS)
            return bg_skip("CUDA support is not built into this binary");
        return bg_skip("no GPU visible (no NVIDIA driver or device)");
    }
    gang_kernels_options_init(&ko);
    ko.device = "cuda";
    ko.device_index = o.device_index;
    ko.pool_mb = o.pool_mb != 0 ? o.pool_mb : bg_pool_mb(&o);
    rc = gang_kernels_open_opts(&ko, &k);
    if (rc < 0) {
        fprintf(stderr, "ganglion bench gemm: cannot open the cuda backend: %s\n",
                gang_strerror(rc));
        return gang_exit_code_for(rc);
    }
    ours = calloc((size_t)o.iters, sizeof(*ours));
    ref = calloc((size_t)o.iters, sizeof(*ref));
    if (ours == NULL || ref == NULL) {
        rc = GANG_ENOMEM;
        goto out;
    }
    fprintf(stderr, "%-18s %6s %6s %6s %10s %10s %7s\n", "shape", "m", "n", "k", "ours TF/s",
            "cublas TF/s", "ratio");
    for (int i = 0; i < o.nshapes; i++) {
        const bg_shape *s = &o.shapes[i];
        double diff = 0.0, flops = 2.0 * (double)s->m * (double)s->n * (double)s->k;
        cJSON *line = gang_report_new("gemm");

        cJSON_AddStringToObject(line, "shape", s->what);
        cJSON_AddStringToObject(line, "dtype", bg_dtype_name(o.dt));
        cJSON_AddNumberToObject(line, "m", (double)s->m);
        cJSON_AddNumberToObject(line, "n", (double)s->n);
        cJSON_AddNumberToObject(line, "k", (double)s->k);
        cJSON_AddNumberToObject(line, "trans_b", 1);
        cJSON_AddNumberToObject(line, "iters", o.iters);
        rc = bg_measure(k, o.dt, 1, s->m, s->n, s->k, o.warmup, o.iters, ours, ref, &diff);
        if (rc < 0) {
            cJSON_AddStringToObject(line, "error", gang_err_name(rc));
            gang_report_emit(line);
            failed++;
            continue;
        }
        double p_ours = gang_report_add_stats(line, "ours_ms", ours, o.iters, 4);
        double p_ref = gang_report_add_stats(line, "cublas_ms", ref, o.iters, 4);
        double tf_ours = flops / (p_ours * 1e-3) / 1e12, tf_ref = flops / (p_ref * 1e-3) / 1e12;
        gang_report_add_num(line, "ours_tflops", tf_ours, 2);
        gang_report_add_num(line, "cublas_tflops", tf_ref, 2);
        gang_report_add_num(line, "ratio", tf_ours / tf_ref, 3);
        cJSON_AddNumberToObject(line, "max_rel_diff", diff);
        gang_report_emit(line);
        fprintf(stderr, "%-18s %6zu %6zu %6zu %10.2f %10.2f %7.3f\n", s->what, s->m, s->n, s->k,
                tf_ours, tf_ref, tf_ours / tf_ref);
        ratio_sum += tf_ours / tf_ref;
        if (diff > worst_diff)
            worst_diff = diff;
        done++;
    }
    {
        cJSON *sum = gang_report_new("gemm");

        cJSON_AddStringToObject(sum, "summary", "ours vs cublasGemmEx");
        cJSON_AddStringToObject(sum, "dtype", bg_dtype_name(o.dt));
        cJSON_AddNumberToObject(sum, "shapes", done);
        cJSON_AddNumberToObject(sum, "failed", failed);
        if (done > 0)
            gang_report_add_num(sum, "mean_ratio", ratio_sum / done, 3);
        cJSON_AddNumberToObject(sum, "max_rel_diff", worst_diff);
        gang_report_emit(sum);
    }
    rc = failed > 0 ? GANG_EIO : 0;
out:
    free(ours);
    free(ref);
    gang_kernels_close(k);
    if (rc < 0)
        return rc == GANG_EIO ? GANG_EXIT_INTERNAL : gang_exit_code_for(rc);
    return GANG_EXIT_OK;
}
