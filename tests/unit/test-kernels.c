/*
 * cmocka tests of the kernels module: every CPU operation against a naive reference written
 * here (double accumulation, no shared code with the backend) on random inputs of odd
 * sizes, plus hand-computed cases, causality and GQA checks, the dtype conversions and the
 * error paths of the front.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <unistd.h>

#include <cmocka.h>

#include "ganglion/common.h"
#include "ganglion/kernels.h"
#include "cpu/cpu.h" /* the CPU kernels' AVX2 and thread switches */

static const size_t sizes[] = {1, 3, 17, 64, 129};
#define N_SIZES (sizeof(sizes) / sizeof(sizes[0]))

/* ---------------------------------------------------------------------------------
 * Helpers.
 * --------------------------------------------------------------------------------- */

/* xorshift64*: deterministic across runs and platforms, so a failure reproduces. */
static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static float rnd(void)
{
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    uint64_t r = rng_state * 0x2545f4914f6cdd1dull;
    return (float)((double)(r >> 11) / (double)(1ull << 53) * 2.0 - 1.0);
}

static float *rnd_buf(size_t n, float scale)
{
    float *p = malloc(n * sizeof(*p));
    assert_non_null(p);
    for (size_t i = 0; i < n; i++)
        p[i] = rnd() * scale;
    return p;
}

/* Mixed tolerance: relative for large values, absolute (scaled by 1) near zero, where a
 * relative error is meaningless. */
static void assert_close(const float *got, const double *ref, size_t n, double tol,
                         const char *what)
{
    for (size_t i = 0; i < n; i++) {
        double err = fabs((double)got[i] - ref[i]);
        double lim = tol * fmax(1.0, fabs(ref[i]));
        if (!(err <= lim))
            fail_msg("%s: element %zu is %.9g, reference %.9g (error %.3g > %.3g)", what, i,
                     (double)got[i], ref[i], err, lim);
    }
}

static double *dbuf(size_t n)
{
    double *p = calloc(n, sizeof(*p));
    assert_non_null(p);
    return p;
}

/* 1 when a mapping of this process's address space names a file containing what. */
static int self_maps(const char *what)
{
    char line[1024];
    int found = 0;
    FILE *f = fopen("/proc/self/maps", "r");

    assert_non_null(f);
    while (!found && fgets(line, sizeof(line), f) != NULL)
        found = strstr(line, what) != NULL;
    fclose(f);
    return found;
}

/*
 * OpenBLAS is loaded at run time (kernels/cpu/cpu-blas.c), not at exec: it is not mapped
 * before the first CPU handle is opened, and it is after. Runs first (see main).
 */
static void test_blas_loaded_on_open(void **state)
{
    gang_kernels *k = NULL;

    (void)state;
    assert_false(self_maps("libopenblas"));
    assert_int_equal(gang_kernels_open("cpu", &k), 0);
    assert_true(self_maps("libopenblas"));
    gang_kernels_close(k);
}

/* A missing library, or one without cblas_sgemm, is GANG_ENOENT and no function; the real
 * one's cblas_sgemm multiplies. */
static void test_blas_open_errors(void **state)
{
    gang__cpu_sgemm_fn fn = NULL;
    const float a[2 * 3] = {1, 2, 3, 4, 5, 6}, b[3 * 2] = {7, 8, 9, 10, 11, 12};
    float c[2 * 2] = {0};

    (void)state;
    assert_int_equal(gang__cpu_blas_open("libganglion-no-such-blas.so.0", "/nonexistent", &fn),
                     GANG_ENOENT);
    assert_null(fn);
    assert_int_equal(gang__cpu_blas_open("libm.so.6", NULL, &fn), GANG_ENOENT);
    assert_null(fn);
    assert_int_equal(gang__cpu_blas_open(GANG_CPU_BLAS_SONAME, NULL, &fn), 0);
    assert_non_null(fn);
    fn(CblasRowMajor, CblasNoTrans, CblasNoTrans, 2, 2, 3, 1.0f, a, 3, b, 2, 0.0f, c, 2);
    assert_true(c[0] == 58.0f && c[1] == 64.0f && c[2] == 139.0f && c[3] == 154.0f);
}

static int setup(void **state)
{
    gang_kernels *k = NULL;
    if (gang_kernels_open("cpu", &k) != 0)
        return -1;
    *state = k;
    return 0;
}

static int teardown(void **state)
{
    gang_kernels_close(*state);
    return 0;
}

static uint32_t bits_of(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof(u));
    return u;
}

static float float_of(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

/* ---------------------------------------------------------------------------------
 * Handle and registration.
 * --------------------------------------------------------------------------------- */
static void test_open_names(void **state)
{
    (void)state;
    gang_kernels *k = NULL;

    assert_int_equal(gang_kernels_open("cpu", &k), 0);
    assert_non_null(k);
    assert_string_equal(gang_kernels_name(k), "cpu");
    /* Host tensors, f32 GEMM only: a half GEMM is refused as not implemented. */
    assert_int_equal(gang_kernels_caps(k), GANG_KERNELS_CAP_HOST_MEM);
    {
        uint16_t h[4] = {0};
        assert_int_equal(
            gang_kernels_gemm_ex(k, GANG_DTYPE_BF16, 0, 1, 1, 1, 1.0f, h, h + 1, 0.0f, h + 2),
            GANG_ENOSYS);
    }
    gang_kernels_close(k);

    assert_int_equal(gang_kernels_open("auto", &k), 0);
    assert_string_equal(gang_kernels_name(k), "cpu");
    gang_kernels_close(k);

    k = (gang_kernels *)&rng_state; /* must be reset to NULL on error */
    assert_int_equal(gang_kernels_open("tpu", &k), GANG_EINVAL);
    assert_null(k);
    assert_int_equal(gang_kernels_open(NULL, &k), GANG_EINVAL);
    assert_int_equal(gang_kernels_open("cpu", NULL), GANG_EINVAL);
    assert_string_equal(gang_kernels_name(NULL), "?");
    assert_int_equal(gang_kernels_caps(NULL), 0);
    gang_kernels_close(NULL);
}

/* "cuda" is not built: GANG_ENOSYS, no handle, and a log line that names the device and
 * says why, so an operator who asked for --device cuda knows what happened. */
static void test_cuda_not_built(void **state)
{
    (void)state;
    gang_kernels *k = (gang_kernels *)&rng_state;
    int fds[2];
    char buf[1024];

    assert_int_equal(pipe(fds), 0);
    gang_log_set_fd(fds[1]);
    int rc = gang_kernels_open("cuda", &k);
    gang_log_set_fd(2);
    close(fds[1]);
    ssize_t len = read(fds[0], buf, sizeof(buf) - 1);
    close(fds[0]);
    if (rc != GANG_ENOSYS) {
        /* The CUDA kernels are built: test-cuda (unit-cuda) covers them. */
        gang_kernels_close(rc == 0 ? k : NULL);
        print_message("cuda kernels built (open: %s): covered by test-cuda\n", gang_err_name(rc));
        skip();
        return;
    }

    assert_int_equal(rc, GANG_ENOSYS);
    assert_null(k);
    assert_true(len > 0);
    buf[len] = '\0';
    assert_non_null(strstr(buf, "'cuda'"));
    assert_non_null(strstr(buf, "not built into this binary"));
    assert_non_null(strstr(buf, "GANG_ENOSYS"));
}

/* ---------------------------------------------------------------------------------
 * GEMM.
 * --------------------------------------------------------------------------------- */
static void ref_gemm(int trans_b, size_t m, size_t n, size_t kd, double alpha, const float *a,
                     const float *b, double beta, const float *c0, double *ref)
{
    for (size_t i = 0; i < m; i++) {
        for (size_t j = 0; j < n; j++) {
            double s = 0.0;
            for (size_t p = 0; p < kd; p++) {
                double bv = trans_b ? b[j * kd + p] : b[p * n + j];
                s += (double)a[i * kd + p] * bv;
            }
            ref[i * n + j] = alpha * s + (c0 ? beta * c0[i * n + j] : 0.0);
        }
    }
}

static void test_gemm(void **state)
{
    gang_kernels *k = *state;
    char what[96];

    for (size_t im = 0; im < N_SIZES; im++) {
        for (size_t in = 0; in < N_SIZES; in++) {
            for (size_t ik = 0; ik < N_SIZES; ik++) {
                size_t m = sizes[im], n = sizes[in], kd = sizes[ik];
                float *a = rnd_buf(m * kd, 1.0f);
                float *b = rnd_buf(kd * n, 1.0f);
                float *c0 = rnd_buf(m * n, 1.0f);
                float *c = malloc(m * n * sizeof(*c));
                double *ref = dbuf(m * n);
                assert_non_null(c);

                for (int tb = 0; tb < 2; tb++) {
                    /* beta != 0 accumulates into C. */
                    memcpy(c, c0, m * n * sizeof(*c));
                    assert_int_equal(gang_kernels_gemm(k, tb, m, n, kd, 0.75f, a, b, -0.5f, c), 0);
                    ref_gemm(tb, m, n, kd, 0.75, a, b, -0.5, c0, ref);
                    snprintf(what, sizeof(what), "gemm tb=%d m=%zu n=%zu k=%zu", tb, m, n, kd);
                    assert_close(c, ref, m * n, 1e-4, what);

                    /* beta == 0 must not read C: NaN there must not leak into the result. */
                    for (size_t i = 0; i < m * n; i++)
                        c[i] = NAN;
                    assert_int_equal(gang_kernels_gemm(k, tb, m, n, kd, 1.0f, a, b, 0.0f, c), 0);
                    ref_gemm(tb, m, n, kd, 1.0, a, b, 0.0, NULL, ref);
                    assert_close(c, ref, m * n, 1e-4, what);
                }
                free(a), free(b), free(c0), free(c), free(ref);
            }
        }
    }
}

/* A hand-checked case of the Hugging Face layout: y = x . W^T with W stored [out, in]. */
static void test_gemm_hf_linear(void **state)
{
    gang_kernels *k = *state;
    const float x[2 * 3] = {1, 2, 3, 4, 5, 6};        /* [tokens=2, in=3] */
    const float w[2 * 3] = {1, 0, -1, 0.5f, 1, 0.5f}; /* [out=2, in=3] */
    float y[4];

    assert_int_equal(gang_kernels_gemm(k, 1, 2, 2, 3, 1.0f, x, w, 0.0f, y), 0);
    assert_float_equal(y[0], -2.0f, 1e-6);
    assert_float_equal(y[1], 4.0f, 1e-6);
    assert_float_equal(y[2], -2.0f, 1e-6);
    assert_float_equal(y[3], 10.0f, 1e-6);
}

/* ---------------------------------------------------------------------------------
 * RMSNorm.
 * --------------------------------------------------------------------------------- */
static void test_rmsnorm(void **state)
{
    gang_kernels *k = *state;
    const float scales[] = {1.0f, 1000.0f, 1e-3f};
    char what[96];

    for (size_t ir = 0; ir < N_SIZES; ir++) {
        for (size_t id = 0; id < N_SIZES; id++) {
            for (size_t is = 0; is < 3; is++) {
                size_t rows = sizes[ir], dim = sizes[id];
                float *x = rnd_buf(rows * dim, scales[is]);
                float *w = rnd_buf(dim, 2.0f);
                float *out = malloc(rows * dim * sizeof(*out));
                double *ref = dbuf(rows * dim);
                float eps = 1e-5f;
                assert_non_null(out);

                for (size_t r = 0; r < rows; r++) {
                    double ss = 0.0;
                    for (size_t i = 0; i < dim; i++)
                        ss += (double)x[r * dim + i] * x[r * dim + i];
                    double inv = 1.0 / sqrt(ss / (double)dim + eps);
                    for (size_t i = 0; i < dim; i++)
                        ref[r * dim + i] = x[r * dim + i] * inv * w[i];
                }
                snprintf(what, sizeof(what), "rmsnorm rows=%zu dim=%zu scale=%g", rows, dim,
                         (double)scales[is]);
                assert_int_equal(gang_kernels_rmsnorm(k, x, w, eps, rows, dim, out), 0);
                assert_close(out, ref, rows * dim, 1e-5, what);
                /* In place gives the same answer. */
                assert_int_equal(gang_kernels_rmsnorm(k, x, w, eps, rows, dim, x), 0);
                assert_close(x, ref, rows * dim, 1e-5, what);
                free(x), free(w), free(out), free(ref);
            }
        }
    }
}

/* ---------------------------------------------------------------------------------
 * RoPE.
 * --------------------------------------------------------------------------------- */
/* Direct formula: pair i of token t turns by pos[t] * inv[i]; cos and sin times scale. */
static void ref_rope(const float *x, const int32_t *pos, size_t tokens, size_t heads, size_t hd,
                     const float *inv, double scale, double *ref)
{
    size_t half = hd / 2;
    for (size_t t = 0; t < tokens; t++) {
        for (size_t h = 0; h < heads; h++) {
            const float *v = x + (t * heads + h) * hd;
            double *o = ref + (t * heads + h) * hd;
            for (size_t i = 0; i < half; i++) {
                double ang = pos[t] * (double)inv[i];
                o[i] = scale * (v[i] * cos(ang) - v[i + half] * sin(ang));
                o[i + half] = scale * (v[i + half] * cos(ang) + v[i] * sin(ang));
            }
        }
    }
}

/* Plain RoPE's table theta^(-2i/hd) in f32. */
static void plain_freq(size_t hd, double theta, float *inv)
{
    for (size_t i = 0; i < hd / 2; i++)
        inv[i] = (float)(1.0 / pow(theta, (double)(2 * i) / (double)hd));
}

/*
 * Every shape with plain RoPE's table and scale 1, and with a scrambled table (each
 * frequency divided by a different factor, as RoPE scaling does) and scale 1.25.
 */
static void test_rope(void **state)
{
    gang_kernels *k = *state;
    const size_t head_dims[] = {2, 4, 64, 128};
    float inv[64];
    char what[128];

    for (size_t it = 0; it < N_SIZES; it++) {
        for (size_t ih = 0; ih < 3; ih++) {
            for (size_t id = 0; id < 8; id++) {
                size_t tokens = sizes[it], heads = sizes[ih], hd = head_dims[id % 4];
                size_t n = tokens * heads * hd;
                double scale = id < 4 ? 1.0 : 1.25;
                float *x = rnd_buf(n, 1.0f);
                float *orig = malloc(n * sizeof(*orig));
                int32_t *pos = malloc(tokens * sizeof(*pos));
                double *ref = dbuf(n);
                assert_non_null(orig);
                assert_non_null(pos);
                memcpy(orig, x, n * sizeof(*x));
                for (size_t t = 0; t < tokens; t++)
                    pos[t] = (int32_t)(t * 37 % 4099); /* out of order, up to 4098 */
                plain_freq(hd, 500000.0, inv);
                for (size_t i = 0; id >= 4 && i < hd / 2; i++)
                    inv[i] /= (float)(1 + (i * 7) % 5);

                ref_rope(orig, pos, tokens, heads, hd, inv, scale, ref);
                assert_int_equal(gang_kernels_rope(k, x, pos, tokens, heads, hd, inv, (float)scale),
                                 0);
                snprintf(what, sizeof(what), "rope tokens=%zu heads=%zu hd=%zu scale=%g", tokens,
                         heads, hd, scale);
                assert_close(x, ref, n, 1e-5, what);
                free(x), free(orig), free(pos), free(ref);
            }
        }
    }
}

/* Hand-computed: head_dim 4, theta 10000, so the pair frequencies are 1 and 0.01. The pairs
 * are (0,2) and (1,3) (rotate_half); the interleaved convention would give other numbers. */
static void test_rope_hand(void **state)
{
    gang_kernels *k = *state;
    float x[2 * 4] = {1, 2, 3, 4, 1, 2, 3, 4}, inv[2];
    const int32_t pos[2] = {0, 1};

    plain_freq(4, 10000.0, inv);
    assert_int_equal(gang_kernels_rope(k, x, pos, 2, 1, 4, inv, 1.0f), 0);
    /* Position 0 is the identity. */
    assert_float_equal(x[0], 1.0f, 1e-6);
    assert_float_equal(x[1], 2.0f, 1e-6);
    assert_float_equal(x[2], 3.0f, 1e-6);
    assert_float_equal(x[3], 4.0f, 1e-6);
    /* Position 1: x0' = cos1 - 3 sin1, x2' = 3 cos1 + sin1, x1' = 2 cos.01 - 4 sin.01,
     * x3' = 4 cos.01 + 2 sin.01. */
    assert_float_equal(x[4], -1.9841106485555495f, 1e-6);
    assert_float_equal(x[5], 1.959900667496664f, 1e-6);
    assert_float_equal(x[6], 2.4623779024123156f, 1e-6);
    assert_float_equal(x[7], 4.019799668334994f, 1e-6);
}

/* ---------------------------------------------------------------------------------
 * Softmax.
 * --------------------------------------------------------------------------------- */
static void test_softmax(void **state)
{
    gang_kernels *k = *state;
    char what[96];

    for (size_t ir = 0; ir < N_SIZES; ir++) {
        for (size_t ic = 0; ic < N_SIZES; ic++) {
            size_t rows = sizes[ir], cols = sizes[ic];
            /* Logits around +-1000 overflow a naive exp() in f32: this checks stability. */
            float *x = rnd_buf(rows * cols, 20.0f);
            double *ref = dbuf(rows * cols);
            for (size_t r = 0; r < rows; r++)
                for (size_t i = 0; i < cols; i++)
                    x[r * cols + i] += (r % 2 ? 1000.0f : -1000.0f);
            for (size_t r = 0; r < rows; r++) {
                double mx = -INFINITY, s = 0.0;
                for (size_t i = 0; i < cols; i++)
                    mx = fmax(mx, x[r * cols + i]);
                for (size_t i = 0; i < cols; i++)
                    s += exp((double)x[r * cols + i] - mx);
                for (size_t i = 0; i < cols; i++)
                    ref[r * cols + i] = exp((double)x[r * cols + i] - mx) / s;
            }
            assert_int_equal(gang_kernels_softmax(k, x, rows, cols), 0);
            snprintf(what, sizeof(what), "softmax rows=%zu cols=%zu", rows, cols);
            /* Probabilities are <= 1, so this is an absolute 1e-6 bound. */
            assert_close(x, ref, rows * cols, 1e-6, what);
            free(x), free(ref);
        }
    }
}

static void test_softmax_masked(void **state)
{
    gang_kernels *k = *state;
    float x[2 * 3] = {-INFINITY, 0.0f, -INFINITY, -INFINITY, -INFINITY, -INFINITY};

    assert_int_equal(gang_kernels_softmax(k, x, 2, 3), 0);
    assert_float_equal(x[0], 0.0f, 0.0);
    assert_float_equal(x[1], 1.0f, 0.0);
    assert_float_equal(x[2], 0.0f, 0.0);
    for (int i = 3; i < 6; i++)
        assert_true(x[i] == 0.0f); /* all masked: zeros, not NaN */
}

/* ---------------------------------------------------------------------------------
 * Attention.
 * --------------------------------------------------------------------------------- */
static void ref_attention(const float *q, const float *kc, const float *vc, size_t tq,
                          size_t n_heads, size_t n_kv, size_t hd, size_t pos0, double *ref)
{
    double *w = dbuf(pos0 + tq);
    for (size_t i = 0; i < tq; i++) {
        for (size_t h = 0; h < n_heads; h++) {
            /* Written as heads-per-group arithmetic on purpose, unlike the backend. */
            size_t g = h * n_kv / n_heads;
            size_t nk = pos0 + i + 1;
            double mx = -INFINITY, s = 0.0;
            for (size_t j = 0; j < nk; j++) {
                double d = 0.0;
                for (size_t e = 0; e < hd; e++)
                    d += (double)q[(i * n_heads + h) * hd + e] * kc[(j * n_kv + g) * hd + e];
                w[j] = d / sqrt((double)hd);
                mx = fmax(mx, w[j]);
            }
            for (size_t j = 0; j < nk; j++) {
                w[j] = exp(w[j] - mx);
                s += w[j];
            }
            for (size_t e = 0; e < hd; e++) {
                double acc = 0.0;
                for (size_t j = 0; j < nk; j++)
                    acc += w[j] * vc[(j * n_kv + g) * hd + e];
                ref[(i * n_heads + h) * hd + e] = acc / s;
            }
        }
    }
    free(w);
}

struct attn_case {
    size_t tq, tk, pos0, n_heads, n_kv, hd;
};

static const struct attn_case attn_cases[] = {
    {1, 1, 0, 1, 1, 1},       /* smallest */
    {17, 17, 0, 4, 2, 64},    /* prefill, GQA 2:1 */
    {1, 129, 128, 8, 1, 17},  /* decode at the end of the cache, MQA */
    {3, 40, 5, 3, 3, 3},      /* chunk in the middle of a larger cache, MHA */
    {64, 129, 64, 6, 2, 129}, /* long prefill continuing a cache */
    {1, 300, 299, 20, 1, 64}, /* decode: five key tiles, a group of 20 heads (3 items) */
    {7, 255, 248, 9, 3, 64},  /* SmolLM2's heads, just under the blocked path */
    /* The CPU backend's blocked sgemm path (>= 64 queries, >= 2048 keys): */
    {130, 2200, 2048, 4, 2, 16}, /* three blocks, the last one partial */
    {64, 2048, 1984, 3, 1, 8},   /* exactly the thresholds, MQA */
};

/* Every case against the double reference, with the AVX2 item kernel and the portable
 * one (where the CPU has AVX2; otherwise only the portable one, said so). */
static void test_attention(void **state)
{
    gang_kernels *k = *state;
    char what[128];
    int simd_modes = gang__cpu_avx2_usable() ? 2 : 1;

    if (simd_modes == 1)
        print_message("[  NOTE    ] no AVX2+FMA+F16C here: only the portable kernel is tested\n");
    for (int simd = 0; simd < simd_modes; simd++) {
        gang__cpu_simd_force(simd);
        for (size_t c = 0; c < sizeof(attn_cases) / sizeof(attn_cases[0]); c++) {
            const struct attn_case *ac = &attn_cases[c];
            size_t nq = ac->tq * ac->n_heads * ac->hd, nkv = ac->tk * ac->n_kv * ac->hd;
            float *q = rnd_buf(nq, 2.0f), *kc = rnd_buf(nkv, 2.0f), *vc = rnd_buf(nkv, 1.0f);
            float *out = malloc(nq * sizeof(*out));
            double *ref = dbuf(nq);
            assert_non_null(out);

            ref_attention(q, kc, vc, ac->tq, ac->n_heads, ac->n_kv, ac->hd, ac->pos0, ref);
            assert_int_equal(gang_kernels_attention(k, q, kc, vc, ac->tq, ac->tk, ac->n_heads,
                                                    ac->n_kv, ac->hd, ac->pos0, out),
                             0);
            snprintf(what, sizeof(what), "attention case %zu (%s)", c, simd ? "avx2" : "portable");
            assert_close(out, ref, nq, 1e-5, what);

            /* out == q is allowed. */
            assert_int_equal(gang_kernels_attention(k, q, kc, vc, ac->tq, ac->tk, ac->n_heads,
                                                    ac->n_kv, ac->hd, ac->pos0, q),
                             0);
            assert_close(q, ref, nq, 1e-5, what);
            free(q), free(kc), free(vc), free(out), free(ref);
        }
    }
    gang__cpu_simd_force(-1);
}

/* Changing the key and value at position p changes the outputs of queries at positions
 * >= p and of no query before it. The second half makes sure the test can notice. */
static void test_attention_causal(void **state)
{
    gang_kernels *k = *state;
    const size_t tq = 9, tk = 12, pos0 = 2, nh = 4, nkv = 2, hd = 8, p = 6; /* query i=4 */
    size_t nq = tq * nh * hd, nkvs = tk * nkv * hd;
    float *q = rnd_buf(nq, 1.0f), *kc = rnd_buf(nkvs, 1.0f), *vc = rnd_buf(nkvs, 1.0f);
    float *a = malloc(nq * sizeof(*a)), *b = malloc(nq * sizeof(*b));
    assert_non_null(a);
    assert_non_null(b);

    assert_int_equal(gang_kernels_attention(k, q, kc, vc, tq, tk, nh, nkv, hd, pos0, a), 0);
    for (size_t e = 0; e < nkv * hd; e++) {
        kc[p * nkv * hd + e] += 3.0f;
        vc[p * nkv * hd + e] -= 5.0f;
    }
    /* Rows past the last query's position are never read: poison them. */
    for (size_t e = (pos0 + tq) * nkv * hd; e < nkvs; e++)
        kc[e] = vc[e] = NAN;
    assert_int_equal(gang_kernels_attention(k, q, kc, vc, tq, tk, nh, nkv, hd, pos0, b), 0);

    size_t first_affected = p - pos0;
    for (size_t i = 0; i < tq; i++) {
        int same = memcmp(a + i * nh * hd, b + i * nh * hd, nh * hd * sizeof(float)) == 0;
        if (i < first_affected)
            assert_true(same);
        else
            assert_false(same);
        for (size_t e = 0; e < nh * hd; e++)
            assert_false(isnan(b[i * nh * hd + e]));
    }
    free(q), free(kc), free(vc), free(a), free(b);
}

/*
 * Sliding window: each query of a windowed call equals an unwindowed single-query call on
 * the cache rows of its window only, on the double path (short) and the blocked path
 * (>= 64 queries over >= 2048 keys); and the window changes the answer (it is applied).
 */
static void test_attention_window(void **state)
{
    gang_kernels *k = *state;
    const struct {
        size_t tq, pos0, window;
    } cases[] = {{5, 40, 8}, {1, 100, 16}, {70, 2000, 300}, {3, 2, 64}};
    const size_t nh = 4, nkv = 2, hd = 8, row = nkv * hd;

    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        size_t tq = cases[c].tq, pos0 = cases[c].pos0, w = cases[c].window, tk = pos0 + tq;
        float *q = rnd_buf(tq * nh * hd, 2.0f), *kc = rnd_buf(tk * row, 2.0f);
        float *vc = rnd_buf(tk * row, 1.0f), *out = malloc(tq * nh * hd * sizeof(float));
        float *full = malloc(tq * nh * hd * sizeof(float)), one[4 * 8];
        double ref[4 * 8];
        int differs = 0;
        char what[64];
        assert_non_null(out);
        assert_non_null(full);
        assert_int_equal(
            gang_kernels_attention_window(k, q, kc, vc, tq, tk, nh, nkv, hd, pos0, w, out), 0);
        assert_int_equal(gang_kernels_attention(k, q, kc, vc, tq, tk, nh, nkv, hd, pos0, full), 0);
        for (size_t i = 0; i < tq; i++) {
            size_t p = pos0 + i, start = p + 1 > w ? p + 1 - w : 0;
            assert_int_equal(gang_kernels_attention(k, q + i * nh * hd, kc + start * row,
                                                    vc + start * row, 1, tk - start, nh, nkv, hd,
                                                    p - start, one),
                             0);
            for (size_t e = 0; e < nh * hd; e++)
                ref[e] = one[e];
            snprintf(what, sizeof(what), "window case %zu query %zu", c, i);
            assert_close(out + i * nh * hd, ref, nh * hd, 1e-5, what);
            for (size_t e = 0; e < nh * hd; e++)
                differs |= start > 0 && fabsf(full[i * nh * hd + e] - one[e]) > 1e-4f;
        }
        /* A window longer than every query's context binds nowhere: equal to no window. */
        assert_true(differs || pos0 + tq <= w);
        free(q), free(kc), free(vc), free(out), free(full);
    }
}

/* GQA mapping: make every value of kv head g equal to g + 1; head h must then output
 * exactly h / (n_heads / n_kv) + 1 everywhere (any softmax weights average a constant). */
static void test_attention_gqa(void **state)
{
    gang_kernels *k = *state;
    const size_t tq = 3, tk = 5, pos0 = 2, nh = 6, nkv = 3, hd = 4;
    float *q = rnd_buf(tq * nh * hd, 1.0f), *kc = rnd_buf(tk * nkv * hd, 1.0f);
    float *vc = malloc(tk * nkv * hd * sizeof(*vc)), *out = malloc(tq * nh * hd * sizeof(*out));
    assert_non_null(vc);
    assert_non_null(out);

    for (size_t j = 0; j < tk; j++)
        for (size_t g = 0; g < nkv; g++)
            for (size_t e = 0; e < hd; e++)
                vc[(j * nkv + g) * hd + e] = (float)(g + 1);
    assert_int_equal(gang_kernels_attention(k, q, kc, vc, tq, tk, nh, nkv, hd, pos0, out), 0);
    for (size_t i = 0; i < tq; i++)
        for (size_t h = 0; h < nh; h++)
            for (size_t e = 0; e < hd; e++)
                assert_float_equal(out[(i * nh + h) * hd + e], (float)(h / 2 + 1), 1e-6);
    free(q), free(kc), free(vc), free(out);
}

/* Decoding one token at a time over the same cache reproduces the prefill rows. */
static void test_attention_decode_matches_prefill(void **state)
{
    gang_kernels *k = *state;
    const size_t t = 17, nh = 4, nkv = 1, hd = 16, row = nh * hd;
    float *q = rnd_buf(t * row, 1.0f), *kc = rnd_buf(t * nkv * hd, 1.0f);
    float *vc = rnd_buf(t * nkv * hd, 1.0f);
    float *pre = malloc(t * row * sizeof(*pre)), one[4 * 16];
    double ref[4 * 16];
    assert_non_null(pre);

    assert_int_equal(gang_kernels_attention(k, q, kc, vc, t, t, nh, nkv, hd, 0, pre), 0);
    for (size_t i = 0; i < t; i++) {
        assert_int_equal(gang_kernels_attention(k, q + i * row, kc, vc, 1, t, nh, nkv, hd, i, one),
                         0);
        for (size_t e = 0; e < row; e++)
            ref[e] = pre[i * row + e];
        assert_close(one, ref, row, 1e-6, "decode vs prefill");
    }
    free(q), free(kc), free(vc), free(pre);
}

/*
 * A paged cache gives exactly (bit for bit) the contiguous cache's result: the rows of a
 * contiguous cache scattered over the blocks of a pool in a shuffled order, read through
 * the table, for decode, a short prefill, a window, and the blocked path (>= 64 queries
 * over >= 2048 keys), with block sizes that do and do not divide the length. A wrong
 * table entry changes the answer (the table is read), and the front refuses bad pages.
 */
static void test_attention_paged(void **state)
{
    gang_kernels *k = *state;
    const struct {
        size_t tq, pos0, window, bs;
    } cases[] = {{1, 37, 0, 16}, {5, 20, 0, 7}, {4, 30, 9, 16}, {70, 2000, 0, 16}, {3, 0, 0, 1}};
    const size_t nh = 4, nkv = 2, hd = 8, row = nkv * hd;

    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        size_t tq = cases[c].tq, pos0 = cases[c].pos0, bs = cases[c].bs, tk = pos0 + tq;
        size_t nb = (tk + bs - 1) / bs, pool = nb + 3, qn = tq * nh * hd;
        float *q = rnd_buf(qn, 2.0f), *kc = rnd_buf(tk * row, 2.0f), *vc = rnd_buf(tk * row, 1.0f);
        float *kp = rnd_buf(pool * bs * row, 5.0f), *vp = rnd_buf(pool * bs * row, 5.0f);
        float *flat = malloc(qn * sizeof(float)), *paged = malloc(qn * sizeof(float));
        int32_t *table = malloc(nb * sizeof(int32_t));
        char what[64];
        assert_non_null(flat);
        assert_non_null(paged);
        assert_non_null(table);
        /* Block b of the sequence lives in pool block (b * 5 + 2) % pool: pool is coprime
         * with 5 for these sizes, so the blocks are distinct and out of order. */
        for (size_t b = 0; b < nb; b++) {
            size_t rows = tk - b * bs < bs ? tk - b * bs : bs;
            table[b] = (int32_t)((b * 5 + 2) % pool);
            memcpy(kp + (size_t)table[b] * bs * row, kc + b * bs * row, rows * row * sizeof(float));
            memcpy(vp + (size_t)table[b] * bs * row, vc + b * bs * row, rows * row * sizeof(float));
        }
        gang_kernels_kv_pages pg = {table, bs, pool, GANG_DTYPE_F32};
        assert_int_equal(gang_kernels_attention_window(k, q, kc, vc, tq, tk, nh, nkv, hd, pos0,
                                                       cases[c].window, flat),
                         0);
        assert_int_equal(gang_kernels_attention_paged(k, q, kp, vp, &pg, tq, tk, nh, nkv, hd, pos0,
                                                      cases[c].window, paged),
                         0);
        snprintf(what, sizeof(what), "paged case %zu", c);
        if (memcmp(flat, paged, qn * sizeof(float)) != 0)
            fail_msg("%s: paged and contiguous differ", what);
        /* A bf16 / f16 pool: exactly the contiguous f32 call on the rows rounded to it. */
        for (int d = 0; d < 2; d++) {
            gang_dtype dt = d == 0 ? GANG_DTYPE_BF16 : GANG_DTYPE_F16;
            size_t pn = pool * bs * row;
            uint16_t *kh = malloc(pn * 2), *vh = malloc(pn * 2);
            float *kr = malloc(pn * sizeof(float)), *vr = malloc(pn * sizeof(float));
            gang_kernels_kv_pages ph = {table, bs, pool, dt};
            assert_non_null(kh);
            assert_non_null(vh);
            assert_non_null(kr);
            assert_non_null(vr);
            assert_int_equal(gang_kernels_convert(k, GANG_DTYPE_F32, kp, dt, kh, pn), 0);
            assert_int_equal(gang_kernels_convert(k, GANG_DTYPE_F32, vp, dt, vh, pn), 0);
            assert_int_equal(gang_kernels_convert(k, dt, kh, GANG_DTYPE_F32, kr, pn), 0);
            assert_int_equal(gang_kernels_convert(k, dt, vh, GANG_DTYPE_F32, vr, pn), 0);
            gang_kernels_kv_pages pr = {table, bs, pool, GANG_DTYPE_F32};
            assert_int_equal(gang_kernels_attention_paged(k, q, kr, vr, &pr, tq, tk, nh, nkv, hd,
                                                          pos0, cases[c].window, flat),
                             0);
            assert_int_equal(gang_kernels_attention_paged(k, q, kh, vh, &ph, tq, tk, nh, nkv, hd,
                                                          pos0, cases[c].window, paged),
                             0);
            if (memcmp(flat, paged, qn * sizeof(float)) != 0)
                fail_msg("%s: the %s pool differs from its rows widened", what,
                         gang_dtype_name(dt));
            ph.dtype = GANG_DTYPE_I32;
            assert_int_equal(gang_kernels_attention_paged(k, q, kh, vh, &ph, tq, tk, nh, nkv, hd,
                                                          pos0, 0, paged),
                             GANG_EINVAL);
            free(kh), free(vh), free(kr), free(vr);
        }
        assert_int_equal(gang_kernels_attention_window(k, q, kc, vc, tq, tk, nh, nkv, hd, pos0,
                                                       cases[c].window, flat),
                         0);
        /* Point the first block at a block holding noise: the answer changes. */
        table[0] = (int32_t)(pool - 1) == table[0] ? 0 : (int32_t)(pool - 1);
        if (cases[c].window == 0) {
            assert_int_equal(gang_kernels_attention_paged(k, q, kp, vp, &pg, tq, tk, nh, nkv, hd,
                                                          pos0, 0, paged),
                             0);
            assert_true(memcmp(flat, paged, qn * sizeof(float)) != 0);
        }
        /* NULL pages is the contiguous call. */
        assert_int_equal(gang_kernels_attention_paged(k, q, kc, vc, NULL, tq, tk, nh, nkv, hd, pos0,
                                                      cases[c].window, paged),
                         0);
        assert_memory_equal(flat, paged, qn * sizeof(float));
        pg.block_size = 0;
        assert_int_equal(
            gang_kernels_attention_paged(k, q, kp, vp, &pg, tq, tk, nh, nkv, hd, pos0, 0, paged),
            GANG_EINVAL);
        pg.block_size = bs;
        pg.n_blocks = 0;
        assert_int_equal(
            gang_kernels_attention_paged(k, q, kp, vp, &pg, tq, tk, nh, nkv, hd, pos0, 0, paged),
            GANG_EINVAL);
        pg.n_blocks = pool;
        pg.table = NULL;
        assert_int_equal(
            gang_kernels_attention_paged(k, q, kp, vp, &pg, tq, tk, nh, nkv, hd, pos0, 0, paged),
            GANG_EINVAL);
        free(q), free(kc), free(vc), free(kp), free(vp), free(flat), free(paged), free(table);
    }
}

/*
 * The batch entry is the per-sequence calls, bit for bit: five sequences of one step (a
 * decode and a 3-token prefill on contiguous f32 caches, a short prefill and a decode
 * sharing one bf16 pool through their block tables, and a 12-token prefill over 312 keys
 * of an f32 pool, which takes the blocked path), with and without a window, with each
 * item kernel, on one thread and on the pool, out apart from q and out == q. Then the
 * front's checks: one bad descriptor refuses the whole batch before anything runs.
 */
struct batch_fixture {
    gang_kernels_attn_seq seq[5];
    gang_kernels_kv_pages pg[3];
    float *q[5], *ck[2], *cv[2], *pk32, *pv32;
    uint16_t *pk16, *pv16;
    int32_t tab_a[2], tab_b[5], tab_c[20];
    size_t qn[5];
};

static void batch_fixture_init(gang_kernels *k, struct batch_fixture *f, size_t nh, size_t nkv,
                               size_t hd)
{
    static const size_t tq[5] = {1, 3, 5, 1, 12}, pos0[5] = {40, 0, 20, 70, 300};
    size_t row = nkv * hd, n16 = 8 * 16 * row, n32 = 20 * 16 * row;
    float *tmp;

    for (size_t i = 0; i < 5; i++) {
        f->qn[i] = tq[i] * nh * hd;
        f->q[i] = rnd_buf(f->qn[i], 2.0f);
        f->seq[i] = (gang_kernels_attn_seq){
            .q = f->q[i], .tq = tq[i], .tk = pos0[i] + tq[i], .pos0 = pos0[i]};
    }
    for (size_t i = 0; i < 2; i++) {
        f->ck[i] = rnd_buf(f->seq[i].tk * row, 2.0f);
        f->cv[i] = rnd_buf(f->seq[i].tk * row, 1.0f);
        f->seq[i].kc = f->ck[i], f->seq[i].vc = f->cv[i];
    }
    f->pk16 = malloc(n16 * 2), f->pv16 = malloc(n16 * 2);
    assert_non_null(f->pk16);
    assert_non_null(f->pv16);
    tmp = rnd_buf(n16, 2.0f);
    assert_int_equal(gang_kernels_convert(k, GANG_DTYPE_F32, tmp, GANG_DTYPE_BF16, f->pk16, n16),
                     0);
    free(tmp);
    tmp = rnd_buf(n16, 1.0f);
    assert_int_equal(gang_kernels_convert(k, GANG_DTYPE_F32, tmp, GANG_DTYPE_BF16, f->pv16, n16),
                     0);
    free(tmp);
    f->pk32 = rnd_buf(n32, 2.0f), f->pv32 = rnd_buf(n32, 1.0f);
    memcpy(f->tab_a, (int32_t[]){5, 1}, sizeof(f->tab_a));
    memcpy(f->tab_b, (int32_t[]){0, 7, 2, 6, 3}, sizeof(f->tab_b));
    for (int32_t b = 0; b < 20; b++)
        f->tab_c[b] = (b * 7 + 3) % 20; /* a permutation: 7 and 20 are coprime */
    f->pg[0] = (gang_kernels_kv_pages){f->tab_a, 16, 8, GANG_DTYPE_BF16};
    f->pg[1] = (gang_kernels_kv_pages){f->tab_b, 16, 8, GANG_DTYPE_BF16};
    f->pg[2] = (gang_kernels_kv_pages){f->tab_c, 16, 20, GANG_DTYPE_F32};
    for (size_t i = 2; i < 5; i++) {
        f->seq[i].pages = &f->pg[i - 2];
        f->seq[i].kc = i < 4 ? (const void *)f->pk16 : f->pk32;
        f->seq[i].vc = i < 4 ? (const void *)f->pv16 : f->pv32;
    }
}

static void batch_fixture_free(struct batch_fixture *f)
{
    for (size_t i = 0; i < 5; i++)
        free(f->q[i]);
    for (size_t i = 0; i < 2; i++)
        free(f->ck[i]), free(f->cv[i]);
    free(f->pk16), free(f->pv16), free(f->pk32), free(f->pv32);
}

static void test_attention_batch(void **state)
{
    gang_kernels *k = *state;
    const size_t nh = 6, nkv = 2, hd = 32, windows[] = {0, 16};
    int simd_modes = gang__cpu_avx2_usable() ? 2 : 1;
    unsigned all = gang__cpu_threads();
    struct batch_fixture f;
    float *want[5], *got[5];

    batch_fixture_init(k, &f, nh, nkv, hd);
    for (size_t i = 0; i < 5; i++) {
        want[i] = malloc(f.qn[i] * sizeof(float));
        got[i] = malloc(f.qn[i] * sizeof(float));
        assert_non_null(want[i]);
        assert_non_null(got[i]);
    }
    for (int simd = 0; simd < simd_modes; simd++) {
        gang__cpu_simd_force(simd);
        for (size_t w = 0; w < 2; w++) {
            for (size_t i = 0; i < 5; i++) {
                const gang_kernels_attn_seq *sq = &f.seq[i];
                assert_int_equal(gang_kernels_attention_paged(k, sq->q, sq->kc, sq->vc, sq->pages,
                                                              sq->tq, sq->tk, nh, nkv, hd, sq->pos0,
                                                              windows[w], want[i]),
                                 0);
            }
            for (unsigned threads = 1; threads <= all; threads += all > 1 ? all - 1 : 1) {
                gang__cpu_set_threads(threads);
                for (size_t i = 0; i < 5; i++)
                    f.seq[i].out = got[i];
                assert_int_equal(gang_kernels_attention_batch(k, f.seq, 5, nh, nkv, hd, windows[w]),
                                 0);
                for (size_t i = 0; i < 5; i++)
                    if (memcmp(want[i], got[i], f.qn[i] * sizeof(float)) != 0)
                        fail_msg("batch sequence %zu differs from its own call (simd %d, window "
                                 "%zu, %u threads)",
                                 i, simd, windows[w], threads);
            }
            gang__cpu_set_threads(all);
            /* out == q: each sequence's queries are replaced by its output. */
            for (size_t i = 0; i < 5; i++) {
                memcpy(got[i], f.q[i], f.qn[i] * sizeof(float));
                f.seq[i].q = f.seq[i].out = got[i];
            }
            assert_int_equal(gang_kernels_attention_batch(k, f.seq, 5, nh, nkv, hd, windows[w]), 0);
            for (size_t i = 0; i < 5; i++) {
                assert_memory_equal(want[i], got[i], f.qn[i] * sizeof(float));
                f.seq[i].q = f.q[i];
            }
        }
    }
    gang__cpu_simd_force(-1);

    /* One bad descriptor: nothing is written, whichever it is. */
    for (size_t i = 0; i < 5; i++) {
        f.seq[i].out = got[i];
        for (size_t e = 0; e < f.qn[i]; e++)
            got[i][e] = 7.0f;
    }
    f.seq[3].tq = 0;
    assert_int_equal(gang_kernels_attention_batch(k, f.seq, 5, nh, nkv, hd, 0), GANG_EINVAL);
    f.seq[3].tq = 1;
    f.seq[4].pos0 = f.seq[4].tk; /* its last query would sit past the cache */
    assert_int_equal(gang_kernels_attention_batch(k, f.seq, 5, nh, nkv, hd, 0), GANG_EINVAL);
    f.seq[4].pos0 = 300;
    f.pg[1].dtype = GANG_DTYPE_I32;
    assert_int_equal(gang_kernels_attention_batch(k, f.seq, 5, nh, nkv, hd, 0), GANG_EINVAL);
    f.pg[1].dtype = GANG_DTYPE_BF16;
    f.seq[0].out = NULL;
    assert_int_equal(gang_kernels_attention_batch(k, f.seq, 5, nh, nkv, hd, 0), GANG_EINVAL);
    f.seq[0].out = got[0];
    for (size_t i = 0; i < 5; i++)
        for (size_t e = 0; e < f.qn[i]; e++)
            assert_true(got[i][e] == 7.0f);
    assert_int_equal(gang_kernels_attention_batch(k, f.seq, 5, nh, 4, hd, 0), GANG_EINVAL);
    assert_int_equal(gang_kernels_attention_batch(k, NULL, 5, nh, nkv, hd, 0), GANG_EINVAL);
    assert_int_equal(gang_kernels_attention_batch(k, f.seq, 0, nh, nkv, hd, 0), GANG_EINVAL);
    assert_int_equal(gang_kernels_attention_batch(NULL, f.seq, 5, nh, nkv, hd, 0), GANG_EINVAL);
    /* And the fixed batch runs. */
    assert_int_equal(gang_kernels_attention_batch(k, f.seq, 5, nh, nkv, hd, 0), 0);
    for (size_t i = 0; i < 5; i++) {
        assert_false(got[i][0] == 7.0f);
        free(want[i]), free(got[i]);
    }
    batch_fixture_free(&f);
}

/* ---------------------------------------------------------------------------------
 * Element-wise operations, embedding, argmax.
 * --------------------------------------------------------------------------------- */
/* GeGLU (PyTorch's tanh gelu, in double here; both kernels where AVX2 is usable, sizes
 * below and above the pool's threshold, with tails, gates far into both tails) and the
 * in-place scale. */
static void test_gelu_mul_scale(void **state)
{
    gang_kernels *k = *state;
    const size_t ns[] = {1, 5, 64, 1031, 70001};
    const size_t nn = sizeof(ns) / sizeof(ns[0]);
    int simd_modes = gang__cpu_avx2_usable() ? 2 : 1;

    for (size_t c = 0; c < simd_modes * nn; c++) {
        size_t n = ns[c % nn];

        gang__cpu_simd_force(c < nn ? 0 : 1);
        float *g = rnd_buf(n, 12.0f), *u = rnd_buf(n, 2.0f), *out = malloc(n * sizeof(*out));
        double *ref = dbuf(n);
        assert_non_null(out);
        if (n > 2)
            g[0] = -60.0f, g[1] = 60.0f; /* tanh saturated both ways */

        for (size_t i = 0; i < n; i++) {
            double x = g[i];
            ref[i] = 0.5 * x *
                     (1.0 + tanh(sqrt(2.0 / 3.14159265358979323846) * (x + 0.044715 * x * x * x))) *
                     u[i];
        }
        assert_int_equal(gang_kernels_gelu_mul(k, g, u, n, out), 0);
        assert_close(out, ref, n, 1e-5, "gelu_mul");
        assert_int_equal(gang_kernels_gelu_mul(k, g, u, n, u), 0); /* out == up */
        assert_close(u, ref, n, 1e-5, "gelu_mul in place");
        for (size_t i = 0; i < n; i++)
            ref[i] = (double)out[i] * 25.298221;
        assert_int_equal(gang_kernels_scale(k, out, 25.298221f, n), 0);
        assert_close(out, ref, n, 1e-5, "scale");
        free(g), free(u), free(out), free(ref);
    }
    gang__cpu_simd_force(-1);
    assert_int_equal(gang_kernels_gelu_mul(k, NULL, NULL, 4, NULL), GANG_EINVAL);
    assert_int_equal(gang_kernels_scale(k, NULL, 1.0f, 4), GANG_EINVAL);
}

/* SiLU x up against double (both kernels where AVX2 is usable; sizes below and above the
 * pool's threshold, with tails), and the residual add. */
static void test_silu_mul_add(void **state)
{
    gang_kernels *k = *state;
    const size_t ns[] = {1, 3, 17, 64, 129, 4099, 40003};
    int simd_modes = gang__cpu_avx2_usable() ? 2 : 1;

    for (size_t c = 0; c < simd_modes * sizeof(ns) / sizeof(ns[0]); c++) {
        size_t n = ns[c % (sizeof(ns) / sizeof(ns[0]))];

        gang__cpu_simd_force(c < sizeof(ns) / sizeof(ns[0]) ? 0 : 1);
        float *g = rnd_buf(n, 30.0f), *u = rnd_buf(n, 2.0f), *out = malloc(n * sizeof(*out));
        double *ref = dbuf(n);
        assert_non_null(out);

        for (size_t i = 0; i < n; i++)
            ref[i] = (double)g[i] / (1.0 + exp(-(double)g[i])) * u[i];
        assert_int_equal(gang_kernels_silu_mul(k, g, u, n, out), 0);
        assert_close(out, ref, n, 1e-5, "silu_mul");
        assert_int_equal(gang_kernels_silu_mul(k, g, u, n, g), 0); /* out == gate */
        assert_close(g, ref, n, 1e-5, "silu_mul in place");

        for (size_t i = 0; i < n; i++)
            ref[i] = (double)out[i] + u[i];
        assert_int_equal(gang_kernels_add(k, out, u, n), 0);
        assert_close(out, ref, n, 1e-6, "add");
        for (size_t i = 0; i < n; i++)
            ref[i] = 2.0 * u[i];
        assert_int_equal(gang_kernels_add(k, u, u, n), 0); /* y == x */
        assert_close(u, ref, n, 1e-6, "add self");
        free(g), free(u), free(out), free(ref);
    }
    gang__cpu_simd_force(-1);
}

/* An element's SiLU or GELU does not depend on where it sits: the same values at every
 * offset of a longer array (the tail of one call is the body of another) give the same bits. */
static void test_silu_position_free(void **state)
{
    gang_kernels *k = *state;
    float g[13], u[13], ref[13], big_g[64 + 13], big_u[64 + 13], out[64 + 13];

    for (int gelu = 0; gelu < 2; gelu++) {
        int (*fn)(gang_kernels *, const float *, const float *, size_t, float *) =
            gelu ? gang_kernels_gelu_mul : gang_kernels_silu_mul;
        for (size_t i = 0; i < 13; i++)
            g[i] = rnd() * 20.0f, u[i] = rnd();
        assert_int_equal(fn(k, g, u, 13, ref), 0);
        for (size_t off = 0; off < 64; off += 5) {
            for (size_t i = 0; i < 64 + 13; i++)
                big_g[i] = rnd(), big_u[i] = rnd();
            memcpy(big_g + off, g, sizeof(g));
            memcpy(big_u + off, u, sizeof(u));
            assert_int_equal(fn(k, big_g, big_u, off + 13, out), 0);
            assert_memory_equal(out + off, ref, sizeof(ref));
        }
    }
}

static void test_embedding(void **state)
{
    gang_kernels *k = *state;
    const size_t vocab = 129, dim = 17, n = 64;
    float *table = rnd_buf(vocab * dim, 1.0f), *out = malloc(n * dim * sizeof(*out));
    int32_t ids[64];
    assert_non_null(out);

    for (size_t t = 0; t < n; t++)
        ids[t] = (int32_t)((t * 53 + 7) % vocab);
    ids[0] = 0;
    ids[1] = (int32_t)vocab - 1;
    assert_int_equal(gang_kernels_embedding(k, table, vocab, dim, ids, n, out), 0);
    for (size_t t = 0; t < n; t++)
        assert_memory_equal(out + t * dim, table + (size_t)ids[t] * dim, dim * sizeof(float));

    /* A bad id anywhere (here the last one) writes nothing. */
    for (size_t i = 0; i < n * dim; i++)
        out[i] = -7.0f;
    ids[n - 1] = (int32_t)vocab;
    assert_int_equal(gang_kernels_embedding(k, table, vocab, dim, ids, n, out), GANG_EINVAL);
    ids[n - 1] = -1;
    assert_int_equal(gang_kernels_embedding(k, table, vocab, dim, ids, n, out), GANG_EINVAL);
    for (size_t i = 0; i < n * dim; i++)
        assert_true(out[i] == -7.0f);
    free(table), free(out);
}

static void test_argmax(void **state)
{
    gang_kernels *k = *state;

    for (size_t ir = 0; ir < N_SIZES; ir++) {
        for (size_t ic = 0; ic < N_SIZES; ic++) {
            size_t rows = sizes[ir], cols = sizes[ic];
            float *x = rnd_buf(rows * cols, 1.0f);
            int32_t *out = malloc(rows * sizeof(*out));
            assert_non_null(out);
            assert_int_equal(gang_kernels_argmax(k, x, rows, cols, out), 0);
            for (size_t r = 0; r < rows; r++) {
                size_t best = 0;
                for (size_t i = 1; i < cols; i++)
                    if (x[r * cols + i] > x[r * cols + best])
                        best = i;
                assert_int_equal(out[r], (int32_t)best);
            }
            free(x), free(out);
        }
    }

    /* Ties go to the lowest index; NaN is ignored; an all-NaN row gives 0. */
    const float t[4 * 4] = {1, 5, 5, 2, NAN, 3, NAN, 3, NAN, NAN, NAN, NAN, -1, -1, -1, -1};
    int32_t o[4];
    assert_int_equal(gang_kernels_argmax(k, t, 4, 4, o), 0);
    assert_int_equal(o[0], 1);
    assert_int_equal(o[1], 1);
    assert_int_equal(o[2], 0);
    assert_int_equal(o[3], 0);
}

/* ---------------------------------------------------------------------------------
 * Dtype conversions.
 * --------------------------------------------------------------------------------- */
static int half_is_nan(uint16_t h)
{
    return (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) != 0;
}

/* Every f16 value converts to f32 and back unchanged (NaNs stay NaN with the same sign). */
static void test_f16_round_trip(void **state)
{
    (void)state;
    for (uint32_t h = 0; h <= 0xffffu; h++) {
        float f = gang_f16_to_f32((uint16_t)h);
        uint16_t back = gang_f32_to_f16(f);
        if (half_is_nan((uint16_t)h)) {
            assert_true(isnan(f));
            assert_true(half_is_nan(back));
            assert_int_equal(back & 0x8000u, h & 0x8000u);
        } else {
            assert_int_equal(back, h);
        }
    }
    /* Known values, including the subnormal range and the largest finite half. */
    assert_true(gang_f16_to_f32(0x3c00) == 1.0f);
    assert_true(gang_f16_to_f32(0xc000) == -2.0f);
    assert_true(gang_f16_to_f32(0x7bff) == 65504.0f);
    assert_true(gang_f16_to_f32(0x0001) == ldexpf(1.0f, -24));
    assert_true(gang_f16_to_f32(0x03ff) == ldexpf(1023.0f, -24));
    assert_true(gang_f16_to_f32(0x0400) == ldexpf(1.0f, -14));
    assert_true(isinf(gang_f16_to_f32(0x7c00)) && gang_f16_to_f32(0x7c00) > 0);
}

/* Round to nearest even, checked exhaustively: for every pair of adjacent finite positive
 * halves the exact midpoint (representable in f32) rounds to the even one, and the f32
 * neighbours of the midpoint round to the nearer half. */
static void test_f16_rounding(void **state)
{
    (void)state;
    for (uint32_t h = 0; h < 0x7bffu; h++) {
        float lo = gang_f16_to_f32((uint16_t)h), hi = gang_f16_to_f32((uint16_t)(h + 1));
        float mid = (float)(((double)lo + (double)hi) / 2.0);
        uint16_t even = (h & 1u) ? (uint16_t)(h + 1) : (uint16_t)h;
        assert_int_equal(gang_f32_to_f16(mid), even);
        assert_int_equal(gang_f32_to_f16(nextafterf(mid, 0.0f)), h);
        assert_int_equal(gang_f32_to_f16(nextafterf(mid, INFINITY)), h + 1);
        assert_int_equal(gang_f32_to_f16(-mid), 0x8000u | even);
    }
    assert_int_equal(gang_f32_to_f16(1.0f + ldexpf(1.0f, -11)), 0x3c00);     /* tie -> even */
    assert_int_equal(gang_f32_to_f16(1.0f + 3 * ldexpf(1.0f, -11)), 0x3c02); /* tie -> even */
    assert_int_equal(gang_f32_to_f16(65519.0f), 0x7bff);
    assert_int_equal(gang_f32_to_f16(65520.0f), 0x7c00); /* overflow rounds to infinity */
    assert_int_equal(gang_f32_to_f16(1e10f), 0x7c00);
    assert_int_equal(gang_f32_to_f16(-1e10f), 0xfc00);
    assert_int_equal(gang_f32_to_f16(ldexpf(1.0f, -25)), 0x0000); /* tie -> zero */
    assert_int_equal(gang_f32_to_f16(ldexpf(1.5f, -25)), 0x0001);
    assert_int_equal(gang_f32_to_f16(ldexpf(3.0f, -25)), 0x0002); /* tie -> even */
    assert_int_equal(gang_f32_to_f16(ldexpf(1.0f, -30)), 0x0000);
    assert_int_equal(gang_f32_to_f16(-0.0f), 0x8000);
    assert_int_equal(gang_f32_to_f16(INFINITY), 0x7c00);
    assert_true(half_is_nan(gang_f32_to_f16(NAN)));
    /* A NaN whose payload lives only in the low f32 bits must not become infinity. */
    assert_true(half_is_nan(gang_f32_to_f16(float_of(0x7f800001u))));
}

static void test_bf16(void **state)
{
    (void)state;
    /* Exhaustive round trip and midpoint rounding over all finite positive bf16 values. */
    for (uint32_t h = 0; h <= 0xffffu; h++) {
        float f = gang_bf16_to_f32((uint16_t)h);
        assert_int_equal(bits_of(f), h << 16);
        if (isnan(f))
            assert_true(isnan(gang_bf16_to_f32(gang_f32_to_bf16(f))));
        else
            assert_int_equal(gang_f32_to_bf16(f), h);
    }
    for (uint32_t h = 0; h < 0x7f7fu; h++) {
        uint32_t mid = (h << 16) | 0x8000u;
        uint16_t even = (h & 1u) ? (uint16_t)(h + 1) : (uint16_t)h;
        assert_int_equal(gang_f32_to_bf16(float_of(mid)), even);
        assert_int_equal(gang_f32_to_bf16(float_of(mid - 1)), h);
        assert_int_equal(gang_f32_to_bf16(float_of(mid + 1)), h + 1);
    }
    assert_int_equal(gang_f32_to_bf16(1.0f), 0x3f80);
    assert_int_equal(gang_f32_to_bf16(float_of(0x3f808000u)), 0x3f80); /* tie -> even */
    assert_int_equal(gang_f32_to_bf16(float_of(0x3f818000u)), 0x3f82); /* tie -> even */
    assert_int_equal(gang_f32_to_bf16(float_of(0x7f7fffffu)), 0x7f80); /* FLT_MAX -> inf */
    assert_int_equal(gang_f32_to_bf16(-INFINITY), 0xff80);
    /* A NaN with only low payload bits stays NaN instead of rounding to infinity. */
    assert_true(isnan(gang_bf16_to_f32(gang_f32_to_bf16(float_of(0x7f800001u)))));
    assert_true(isnan(gang_bf16_to_f32(gang_f32_to_bf16(float_of(0xffffffffu)))));
}

static void test_convert_arrays(void **state)
{
    (void)state;
    const float src[5] = {1.0f, -2.5f, 65504.0f, 1e-8f, 3.14159f};
    uint16_t h[5], b[5];
    float back[5];

    assert_int_equal(gang_f32_to_f16_array(src, h, 5), 0);
    assert_int_equal(gang_f16_to_f32_array(h, back, 5), 0);
    for (int i = 0; i < 5; i++) {
        assert_int_equal(h[i], gang_f32_to_f16(src[i]));
        assert_true(back[i] == gang_f16_to_f32(h[i]));
    }
    assert_float_equal(back[4], 3.140625f, 0.0);
    assert_int_equal(gang_f32_to_bf16_array(src, b, 5), 0);
    assert_int_equal(gang_bf16_to_f32_array(b, back, 5), 0);
    for (int i = 0; i < 5; i++)
        assert_true(back[i] == gang_bf16_to_f32(gang_f32_to_bf16(src[i])));
    assert_float_equal(back[4], 3.140625f, 0.0);

    assert_int_equal(gang_f32_to_f16_array(NULL, h, 1), GANG_EINVAL);
    assert_int_equal(gang_f16_to_f32_array(h, NULL, 1), GANG_EINVAL);
    assert_int_equal(gang_f32_to_bf16_array(src, NULL, 1), GANG_EINVAL);
    assert_int_equal(gang_bf16_to_f32_array(NULL, back, 1), GANG_EINVAL);
    assert_int_equal(gang_bf16_to_f32_array(NULL, NULL, 0), 0);
}

/* ---------------------------------------------------------------------------------
 * Error paths of the front.
 * --------------------------------------------------------------------------------- */
static void test_errors(void **state)
{
    gang_kernels *k = *state;
    float x[64] = {0}, y[64] = {0};
    int32_t ids[2] = {0, 1}, pos[2] = {0, 1}, am[2];

    /* NULL handle and pointers, zero sizes. */
    assert_int_equal(gang_kernels_gemm(NULL, 0, 2, 2, 2, 1, x, y, 0, x + 8), GANG_EINVAL);
    assert_int_equal(gang_kernels_gemm(k, 0, 0, 2, 2, 1, x, y, 0, x + 8), GANG_EINVAL);
    assert_int_equal(gang_kernels_gemm(k, 0, 2, 2, 2, 1, NULL, y, 0, x + 8), GANG_EINVAL);
    assert_int_equal(gang_kernels_gemm(k, 0, (size_t)1 << 31, 2, 2, 1, x, y, 0, x + 8),
                     GANG_ERANGE);
    assert_int_equal(gang_kernels_rmsnorm(k, x, y, 1e-5f, 2, 0, x), GANG_EINVAL);
    assert_int_equal(gang_kernels_rmsnorm(k, x, NULL, 1e-5f, 2, 2, x), GANG_EINVAL);
    assert_int_equal(gang_kernels_rmsnorm(k, x, y, -1.0f, 2, 2, x), GANG_EINVAL);
    assert_int_equal(gang_kernels_rmsnorm(k, x, y, NAN, 2, 2, x), GANG_EINVAL);
    assert_int_equal(gang_kernels_rmsnorm(k, x, y, 1e-5f, SIZE_MAX / 2, 4, x), GANG_ERANGE);

    /* RoPE: odd head_dim, negative position, no table, bad scale. */
    const float inv[2] = {1.0f, 0.01f};
    assert_int_equal(gang_kernels_rope(k, x, pos, 2, 1, 3, inv, 1.0f), GANG_EINVAL);
    assert_int_equal(gang_kernels_rope(k, x, pos, 2, 1, 0, inv, 1.0f), GANG_EINVAL);
    assert_int_equal(gang_kernels_rope(k, x, pos, 2, 1, 4, NULL, 1.0f), GANG_EINVAL);
    assert_int_equal(gang_kernels_rope(k, x, pos, 2, 1, 4, inv, 0.0f), GANG_EINVAL);
    assert_int_equal(gang_kernels_rope(k, x, pos, 2, 1, 4, inv, NAN), GANG_EINVAL);
    pos[1] = -1;
    memcpy(y, x, sizeof(x));
    assert_int_equal(gang_kernels_rope(k, x, pos, 2, 1, 4, inv, 1.0f), GANG_EINVAL);
    assert_memory_equal(x, y, sizeof(x));

    assert_int_equal(gang_kernels_softmax(k, x, 0, 3), GANG_EINVAL);
    assert_int_equal(gang_kernels_softmax(k, NULL, 1, 3), GANG_EINVAL);

    /* Attention: heads not divisible, cache too short for pos0 + tq, zero sizes. */
    assert_int_equal(gang_kernels_attention(k, x, x, x, 1, 4, 3, 2, 2, 0, y), GANG_EINVAL);
    assert_int_equal(gang_kernels_attention(k, x, x, x, 2, 4, 2, 1, 2, 3, y), GANG_EINVAL);
    assert_int_equal(gang_kernels_attention(k, x, x, x, 1, 4, 2, 1, 2, 5, y), GANG_EINVAL);
    assert_int_equal(gang_kernels_attention(k, x, x, x, 1, 4, 2, 1, 2, 3, y), 0);
    assert_int_equal(gang_kernels_attention(k, x, x, x, 0, 4, 2, 1, 2, 0, y), GANG_EINVAL);
    assert_int_equal(gang_kernels_attention(k, x, x, x, 1, 4, 2, 0, 2, 0, y), GANG_EINVAL);
    assert_int_equal(gang_kernels_attention(k, x, NULL, x, 1, 4, 2, 1, 2, 0, y), GANG_EINVAL);

    assert_int_equal(gang_kernels_silu_mul(k, x, y, 0, x), GANG_EINVAL);
    assert_int_equal(gang_kernels_silu_mul(k, x, NULL, 4, x), GANG_EINVAL);
    assert_int_equal(gang_kernels_add(k, x, y, 0), GANG_EINVAL);
    assert_int_equal(gang_kernels_add(k, NULL, y, 4), GANG_EINVAL);

    /* Embedding: id == vocab is one past the end. */
    assert_int_equal(gang_kernels_embedding(k, x, 2, 4, ids, 2, y), 0);
    assert_int_equal(gang_kernels_embedding(k, x, 1, 4, ids, 2, y), GANG_EINVAL);
    assert_int_equal(gang_kernels_embedding(k, x, 2, 0, ids, 2, y), GANG_EINVAL);
    assert_int_equal(gang_kernels_embedding(k, x, 2, 4, NULL, 2, y), GANG_EINVAL);

    assert_int_equal(gang_kernels_argmax(k, x, 0, 4, am), GANG_EINVAL);
    assert_int_equal(gang_kernels_argmax(k, x, 1, 4, NULL), GANG_EINVAL);
    assert_int_equal(gang_kernels_argmax(k, x, 1, (size_t)INT32_MAX + 1, am), GANG_ERANGE);
}

/* ---------------------------------------------------------------------------------
 * Typed weights: packing, matmul and embedding over bf16 / f16 / int8 storage.
 * --------------------------------------------------------------------------------- */

/* Element (o, i) of a packed weight as the kernels must see it (I8: q x scale). */
static double packed_elem(gang_kernels_wtype t, const void *blob, size_t n, size_t kdim, size_t o,
                          size_t i)
{
    gang_kernels_weight w = gang_kernels_weight_view(t, blob, n, kdim);
    size_t j = o * kdim + i;

    switch (t) {
    case GANG_KW_BF16:
        return gang_bf16_to_f32(((const uint16_t *)w.data)[j]);
    case GANG_KW_F16:
        return gang_f16_to_f32(((const uint16_t *)w.data)[j]);
    case GANG_KW_I8:
        return (double)((const int8_t *)w.data)[j] * (double)w.scales[o];
    default: /* f32 (block types: test-kernels-blocks.c) */
        break;
    }
    return ((const float *)w.data)[j];
}

static void *pack_new(gang_kernels_wtype t, const float *src, size_t n, size_t kdim)
{
    size_t bytes = gang_kernels_weight_bytes(t, n, kdim);
    void *blob = malloc(bytes);

    assert_true(bytes > 0);
    assert_non_null(blob);
    assert_int_equal(gang_kernels_weight_pack(t, src, n, kdim, blob), 0);
    return blob;
}

static void test_weight_pack(void **state)
{
    const size_t n = 5, kd = 67;
    float *src = rnd_buf(n * kd, 3.0f);
    void *blob;

    (void)state;
    assert_int_equal(gang_kernels_weight_bytes(GANG_KW_F32, 3, 5), 60);
    assert_int_equal(gang_kernels_weight_bytes(GANG_KW_BF16, 3, 5), 30);
    assert_int_equal(gang_kernels_weight_bytes(GANG_KW_I8, 3, 5), 64 + 12);
    assert_int_equal(gang_kernels_weight_bytes(GANG_KW_I8, 1, 64), 64 + 4);
    assert_int_equal(gang_kernels_weight_bytes((gang_kernels_wtype)9, 3, 5), 0);
    assert_int_equal(gang_kernels_weight_bytes(GANG_KW_F32, SIZE_MAX, 2), 0);
    assert_string_equal(gang_kernels_wtype_name(GANG_KW_I8), "int8");
    assert_string_equal(gang_kernels_wtype_name(GANG_KW_BF16), "bf16");

    blob = pack_new(GANG_KW_BF16, src, n, kd);
    for (size_t i = 0; i < n * kd; i++)
        assert_int_equal(((uint16_t *)blob)[i], gang_f32_to_bf16(src[i]));
    free(blob);
    blob = pack_new(GANG_KW_F16, src, n, kd);
    for (size_t i = 0; i < n * kd; i++)
        assert_int_equal(((uint16_t *)blob)[i], gang_f32_to_f16(src[i]));
    free(blob);

    /* int8: the scale is the row's max |w| / 127, each element within half a step. */
    for (size_t i = 0; i < kd; i++)
        src[2 * kd + i] = 0.0f; /* an all-zero row: scale 0, q 0 */
    blob = pack_new(GANG_KW_I8, src, n, kd);
    for (size_t o = 0; o < n; o++) {
        gang_kernels_weight w = gang_kernels_weight_view(GANG_KW_I8, blob, n, kd);
        float amax = 0.0f;

        for (size_t i = 0; i < kd; i++)
            amax = fmaxf(amax, fabsf(src[o * kd + i]));
        assert_true(w.scales[o] == amax / 127.0f);
        for (size_t i = 0; i < kd; i++) {
            double err = fabs(packed_elem(GANG_KW_I8, blob, n, kd, o, i) - src[o * kd + i]);

            assert_true(err <= 0.5 * w.scales[o] * (1 + 1e-6));
            assert_true(abs(((const int8_t *)w.data)[o * kd + i]) <= 127);
        }
    }
    free(blob);

    /* Refusals: NULL, zero sizes, an unknown type, a non-finite element for int8. */
    blob = malloc(gang_kernels_weight_bytes(GANG_KW_I8, n, kd));
    assert_int_equal(gang_kernels_weight_pack(GANG_KW_I8, NULL, n, kd, blob), GANG_EINVAL);
    assert_int_equal(gang_kernels_weight_pack(GANG_KW_I8, src, 0, kd, blob), GANG_EINVAL);
    assert_int_equal(gang_kernels_weight_pack((gang_kernels_wtype)7, src, n, kd, blob),
                     GANG_EINVAL);
    src[3] = NAN;
    assert_int_equal(gang_kernels_weight_pack(GANG_KW_I8, src, n, kd, blob), GANG_EINVAL);
    free(blob);
    free(src);
}

/* One matmul of type t checked against a double reference over the packed elements. */
static void check_matmul(gang_kernels *k, gang_kernels_wtype t, size_t m, size_t n, size_t kd)
{
    float *x = rnd_buf(m * kd, 1.0f), *wf = rnd_buf(n * kd, 0.5f);
    float *y = malloc(m * n * sizeof(float));
    void *blob = pack_new(t, wf, n, kd);
    gang_kernels_weight w = gang_kernels_weight_view(t, blob, n, kd);
    char what[96];

    assert_non_null(y);
    for (size_t i = 0; i < m * n; i++)
        y[i] = NAN; /* y is written, never read */
    assert_int_equal(gang_kernels_matmul(k, m, n, kd, x, &w, y), 0);
    snprintf(what, sizeof(what), "matmul %s m=%zu n=%zu k=%zu", gang_kernels_wtype_name(t), m, n,
             kd);
    for (size_t r = 0; r < m; r++) {
        for (size_t o = 0; o < n; o++) {
            double ref = 0.0, mag = 0.0;

            for (size_t i = 0; i < kd; i++) {
                double p = (double)x[r * kd + i] * packed_elem(t, blob, n, kd, o, i);
                ref += p;
                mag += fabs(p);
            }
            /* f32 accumulation: a few ulps of the magnitude of the terms. */
            if (!(fabs(y[r * n + o] - ref) <= 2e-6 * (mag + 1e-30) * (1 + log2((double)kd))))
                fail_msg("%s: y[%zu,%zu] = %.9g, reference %.9g", what, r, o, (double)y[r * n + o],
                         ref);
        }
    }
    free(x), free(wf), free(y), free(blob);
}

static void test_matmul_types(void **state)
{
    static const size_t ms[] = {1, 2, 3, 4, 5, 9, 33}, ns[] = {1, 3, 8, 17, 67},
                        ks[] = {1, 7, 8, 9, 64, 67};
    static const gang_kernels_wtype types[] = {GANG_KW_BF16, GANG_KW_F16, GANG_KW_I8, GANG_KW_F32};
    gang_kernels *k = *state;
    int simd_modes = gang__cpu_avx2_usable() ? 2 : 1;

    if (simd_modes == 1)
        print_message("[  NOTE    ] no AVX2+FMA+F16C here: only the portable kernel is tested\n");
    for (int simd = 0; simd < simd_modes; simd++) {
        gang__cpu_simd_force(simd);
        for (size_t ti = 0; ti < sizeof(types) / sizeof(types[0]); ti++)
            for (size_t a = 0; a < sizeof(ms) / sizeof(ms[0]); a++)
                for (size_t b = 0; b < sizeof(ns) / sizeof(ns[0]); b++)
                    for (size_t c = 0; c < sizeof(ks) / sizeof(ks[0]); c++)
                        check_matmul(k, types[ti], ms[a], ns[b], ks[c]);
    }
    gang__cpu_simd_force(-1);
}

/* What the pool test's chunks record: how often each ran, and by whom in which order. */
#define POOL_T_CHUNKS 64
static struct {
    _Atomic int runs[POOL_T_CHUNKS];
    pthread_t caller;
    _Atomic int order[POOL_T_CHUNKS]; /* the chunks in the order they were taken */
    _Atomic int by_caller[POOL_T_CHUNKS];
    _Atomic int next;
    _Atomic int slow_claimed; /* the first worker chunk sleeps (a preempted thread) */
    int slow_chunk;
} pool_t;

static void pool_t_chunk(void *arg, size_t c)
{
    int i = atomic_fetch_add(&pool_t.next, 1),
        caller = pthread_equal(pthread_self(), pool_t.caller);

    (void)arg;
    pool_t.order[i] = (int)c;
    pool_t.by_caller[c] = caller;
    atomic_fetch_add(&pool_t.runs[c], 1);
    if (!caller && arg != NULL && atomic_exchange(&pool_t.slow_claimed, 1) == 0) {
        pool_t.slow_chunk = (int)c;
        usleep(50 * 1000);
    }
}

static void pool_t_reset(void)
{
    memset(&pool_t, 0, sizeof(pool_t));
    pool_t.caller = pthread_self();
    pool_t.slow_chunk = -1;
}

/*
 * The pool (kernels/cpu/cpu-pool.c): every chunk runs exactly once for any count; the
 * caller owns the first contiguous range and takes it from its front (0, 1, 2, ...); a
 * worker that stalls in its first chunk (50 ms) has the rest of its range finished by the
 * others, the caller taking a worker's range from its back.
 */
static void test_pool_ranges(void **state)
{
    unsigned threads;

    (void)state;
    gang__cpu_set_threads(64);
    threads = gang__cpu_threads();
    if (threads < 2) {
        print_message("[  SKIP    ] the pool has one thread on this machine: no ranges to share\n");
        skip();
    }
    for (size_t chunks = 1; chunks <= POOL_T_CHUNKS; chunks += chunks < 8 ? 1 : 7) {
        pool_t_reset();
        gang__cpu_parallel(pool_t_chunk, NULL, chunks);
        for (size_t c = 0; c < chunks; c++)
            assert_int_equal(pool_t.runs[c], 1);
        assert_int_equal(pool_t.next, (int)chunks);
        for (int i = 0, want = 0; i < (int)chunks; i++) {
            int c = pool_t.order[i];

            if (pool_t.by_caller[c] && c < (int)(chunks / threads)) /* its own range, in order */
                assert_int_equal(c, want++);
        }
    }
    for (int rep = 0; rep < 3; rep++) {
        int own_end, stolen = 0, last = POOL_T_CHUNKS;

        pool_t_reset();
        gang__cpu_parallel(pool_t_chunk, &pool_t, POOL_T_CHUNKS);
        for (size_t c = 0; c < POOL_T_CHUNKS; c++)
            assert_int_equal(pool_t.runs[c], 1);
        if (pool_t.slow_chunk < 0)
            continue; /* no worker woke in time: the caller ran it all (allowed) */
        /* The slow worker's range starts at its chunk; the others took all the rest of it. */
        own_end = POOL_T_CHUNKS;
        for (unsigned t = 1; t <= threads; t++)
            if ((int)(POOL_T_CHUNKS * t / threads) > pool_t.slow_chunk) {
                own_end = (int)(POOL_T_CHUNKS * t / threads);
                break;
            }
        for (int c = pool_t.slow_chunk + 1; c < own_end; c++)
            if (pool_t.by_caller[c])
                stolen++;
        if (threads == 2) { /* then the caller took every one, from the back */
            assert_int_equal(stolen, own_end - pool_t.slow_chunk - 1);
            for (int i = 0; i < POOL_T_CHUNKS; i++)
                if (pool_t.order[i] > pool_t.slow_chunk) {
                    assert_true(pool_t.order[i] < last);
                    last = pool_t.order[i];
                }
        }
        print_message("[  NOTE    ] a worker stalled in chunk %d: the caller took %d of the %d "
                      "after it in its range\n",
                      pool_t.slow_chunk, stolen, own_end - pool_t.slow_chunk - 1);
    }
}

/*
 * Threads and kernels: the pool splits the rows of W, each output is one dot product in
 * a fixed order, so one thread and the whole pool give the same bits; the AVX2 kernel
 * agrees with the portable one to f32 rounding. A SmolLM2-sized shape (k 576, n 1536),
 * at batch 1 and 32.
 */
static void test_matmul_threads(void **state)
{
    gang_kernels *k = *state;
    const size_t n = 1536, kd = 576;
    static const size_t ms[] = {1, 32};
    float *wf = rnd_buf(n * kd, 0.1f);

    for (size_t mi = 0; mi < 2; mi++) {
        size_t m = ms[mi];
        float *x = rnd_buf(m * kd, 1.0f), *y1 = malloc(m * n * 4), *yp = malloc(m * n * 4);
        float *yr = malloc(m * n * 4);

        for (int t = GANG_KW_BF16; t <= GANG_KW_I8; t++) {
            void *blob = pack_new((gang_kernels_wtype)t, wf, n, kd);
            gang_kernels_weight w = gang_kernels_weight_view((gang_kernels_wtype)t, blob, n, kd);

            gang__cpu_set_threads(1);
            assert_int_equal(gang_kernels_matmul(k, m, n, kd, x, &w, y1), 0);
            gang__cpu_set_threads(64);
            assert_int_equal(gang_kernels_matmul(k, m, n, kd, x, &w, yp), 0);
            assert_memory_equal(y1, yp, m * n * sizeof(float));
            gang__cpu_matmul_rows_ref(m, kd, x, &w, 0, n, yr, n);
            for (size_t i = 0; i < m * n; i++)
                assert_true(fabsf(yp[i] - yr[i]) <= 1e-4f * (1.0f + fabsf(yr[i])));
            free(blob);
        }
        free(x), free(y1), free(yp), free(yr);
    }
    print_message("[  NOTE    ] matmul pool: %u threads\n", gang__cpu_threads());
    free(wf);
}

/*
 * The AVX2 kernel's row ranges against the portable one: every batch m from 1 to 40 (the
 * dot tiles below 4, then each balanced split of the 6-row panel tiles), W ranges that
 * start mid-panel and end in a partial panel (the prefetch of the next panel stops at
 * the range's end), odd k. Outputs outside the range stay untouched.
 */
static void test_matmul_rows_avx2(void **state)
{
    static const size_t ranges[][2] = {{0, 1}, {0, 16}, {3, 20}, {5, 38}, {0, 67}};
    static const size_t ks[] = {1, 7, 9, 67, 131};
    static const gang_kernels_wtype types[] = {GANG_KW_BF16, GANG_KW_F16, GANG_KW_I8, GANG_KW_F32};
    const size_t n = 67, mmax = 40;
    float *ya = malloc(mmax * n * sizeof(float)), *yr = malloc(mmax * n * sizeof(float));

    (void)state;
    if (!gang__cpu_avx2_usable()) {
        free(ya), free(yr);
        print_message("[  SKIP    ] no AVX2+FMA+F16C on this CPU: no AVX2 kernel to compare\n");
        skip();
    }
    assert_non_null(ya);
    assert_non_null(yr);
    for (size_t ti = 0; ti < sizeof(types) / sizeof(types[0]); ti++) {
        for (size_t ki = 0; ki < sizeof(ks) / sizeof(ks[0]); ki++) {
            size_t kd = ks[ki];
            float *x = rnd_buf(mmax * kd, 1.0f), *wf = rnd_buf(n * kd, 0.5f);
            void *blob = pack_new(types[ti], wf, n, kd);
            gang_kernels_weight w = gang_kernels_weight_view(types[ti], blob, n, kd);

            for (size_t m = 1; m <= mmax; m++) {
                for (size_t ri = 0; ri < sizeof(ranges) / sizeof(ranges[0]); ri++) {
                    size_t o0 = ranges[ri][0], o1 = ranges[ri][1];

                    for (size_t i = 0; i < m * n; i++)
                        ya[i] = yr[i] = -7.0f;
                    gang__cpu_matmul_rows_avx2(m, kd, x, &w, o0, o1, ya, n);
                    gang__cpu_matmul_rows_ref(m, kd, x, &w, o0, o1, yr, n);
                    for (size_t r = 0; r < m; r++) {
                        double xs = 0.0; /* |x row| x max |w|: the terms' magnitude */

                        for (size_t i = 0; i < kd; i++)
                            xs += fabs(x[r * kd + i]);
                        for (size_t o = 0; o < n; o++) {
                            float a = ya[r * n + o], b = yr[r * n + o];
                            int in = o >= o0 && o < o1;

                            if (in ? !(fabs(a - b) <= 1e-6 * xs * 0.5 * (2 + log2((double)kd)))
                                   : a != -7.0f)
                                fail_msg("%s m=%zu k=%zu rows [%zu,%zu): y[%zu,%zu] = %.9g, "
                                         "portable %.9g",
                                         gang_kernels_wtype_name(types[ti]), m, kd, o0, o1, r, o,
                                         (double)a, (double)b);
                        }
                    }
                }
            }
            free(x), free(wf), free(blob);
        }
    }
    free(ya), free(yr);
}

/* Panel path of m = 8 at a small k, a large one (the thread's panel buffer grows), then the
 * small one again; 0 when each agrees with the portable kernel. */
static void *panel_sizes(void *unused)
{
    static const size_t ks[] = {8, 2053, 8};
    const size_t m = 8, n = 19;
    intptr_t bad = 0;

    (void)unused;
    for (size_t ki = 0; ki < 3; ki++) {
        size_t kd = ks[ki];
        float *x = rnd_buf(m * kd, 1.0f), *wf = rnd_buf(n * kd, 0.5f);
        float *ya = malloc(m * n * sizeof(float)), *yr = malloc(m * n * sizeof(float));
        void *blob = pack_new(GANG_KW_BF16, wf, n, kd);
        gang_kernels_weight w = gang_kernels_weight_view(GANG_KW_BF16, blob, n, kd);

        assert_non_null(ya);
        assert_non_null(yr);
        gang__cpu_matmul_rows_avx2(m, kd, x, &w, 0, n, ya, n);
        gang__cpu_matmul_rows_ref(m, kd, x, &w, 0, n, yr, n);
        for (size_t i = 0; i < m * n; i++)
            bad += !(fabsf(ya[i] - yr[i]) <= 1e-4f * (1.0f + fabsf(yr[i])) * sqrtf((float)kd));
        free(x), free(wf), free(ya), free(yr), free(blob);
    }
    return (void *)bad;
}

/*
 * The panel buffer each thread keeps from call to call: it grows with k, on the caller
 * and on a thread that then exits (the buffer goes with it: LeakSanitizer or valgrind
 * report it otherwise).
 */
static void test_matmul_panel_buffer(void **state)
{
    pthread_t th;
    void *bad = (void *)1;

    (void)state;
    if (!gang__cpu_avx2_usable()) {
        print_message("[  SKIP    ] no AVX2+FMA+F16C on this CPU: the portable kernel has no "
                      "panel buffer\n");
        skip();
    }
    assert_null(panel_sizes(NULL));
    assert_int_equal(pthread_create(&th, NULL, panel_sizes, NULL), 0);
    assert_int_equal(pthread_join(th, &bad), 0);
    assert_null(bad);
}

/* AnonHugePages (kB) of the mapping that holds p, from /proc/self/smaps; -1 if unknown. */
static long huge_kb_at(const void *p)
{
    FILE *f = fopen("/proc/self/smaps", "r");
    char line[256];
    int inside = 0;
    long kb = -1;

    while (f != NULL && fgets(line, sizeof(line), f) != NULL) {
        unsigned long lo, hi;

        if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2 && strchr(line, '-') < strchr(line, ' '))
            inside = (uintptr_t)p >= lo && (uintptr_t)p < hi;
        else if (inside && sscanf(line, "AnonHugePages: %ld kB", &kb) == 1)
            break;
    }
    if (f != NULL)
        fclose(f);
    return kb;
}

/*
 * Host weight blocks: alignment (64 bytes, 2 MiB from 2 MiB on), every byte writable up
 * to the size asked, 0 bytes refused. Whether huge pages back a block is the host's
 * choice (THP mode, fragmentation): printed, not asserted.
 */
static void test_weight_host_alloc(void **state)
{
    static const size_t lens[] = {
        1, 100, 4096, (2u << 20) - 1, 2u << 20, (3u << 20) + 5, (31u << 20) + 7, 33u << 20};
    const size_t two_mib = 2u << 20;

    (void)state;
    assert_null(gang_kernels_weight_host_alloc(0));
    for (size_t i = 0; i < sizeof(lens) / sizeof(lens[0]); i++) {
        unsigned char *p = gang_kernels_weight_host_alloc(lens[i]);

        assert_non_null(p);
        assert_int_equal((uintptr_t)p % (lens[i] >= two_mib ? two_mib : 64), 0);
        memset(p, 0x5a, lens[i]);
        assert_int_equal(p[lens[i] - 1], 0x5a);
        if (lens[i] == (31u << 20) + 7)
            print_message("[  NOTE    ] a 31 MiB weight block: %ld kB of it on huge pages\n",
                          huge_kb_at(p));
        free(p);
    }
}

/*
 * The weight arena: pieces 64-byte aligned, side by side in allocation order within a
 * region, every byte writable and kept (a piece's bytes survive the allocations after it),
 * owned by their arena and by no other, a new region when one is full (its first piece on
 * a 2 MiB boundary), a piece larger than a region in a region of its own, refusals (0
 * bytes, an overflowing size, no arena). Huge pages: printed, not asserted (the host's
 * choice, as above).
 */
static void test_weight_arena(void **state)
{
    static const size_t lens[] = {1, 100, 4096, (2u << 20) - 1, 576 * 34, 7u << 20, 13u << 20};
    const size_t two_mib = 2u << 20, n = sizeof(lens) / sizeof(lens[0]);
    gang_kernels_arena *a = gang_kernels_arena_new(), *b = gang_kernels_arena_new();
    unsigned char *p[sizeof(lens) / sizeof(lens[0])], *big, *after;
    size_t sum = 0;

    (void)state;
    assert_non_null(a);
    assert_non_null(b);
    assert_null(gang_kernels_arena_alloc(a, 0));
    assert_null(gang_kernels_arena_alloc(a, SIZE_MAX));
    assert_null(gang_kernels_arena_alloc(a, SIZE_MAX - 32));
    assert_null(gang_kernels_arena_alloc(NULL, 64));
    assert_false(gang_kernels_arena_owns(NULL, a));
    for (size_t i = 0; i < n; i++) {
        p[i] = gang_kernels_arena_alloc(a, lens[i]);
        assert_non_null(p[i]);
        assert_int_equal((uintptr_t)p[i] % 64, 0);
        if (i == 0)
            assert_int_equal((uintptr_t)p[i] % two_mib, 0);
        else /* the next piece of the same region (all of these fit in one) */
            assert_ptr_equal(p[i], p[i - 1] + (lens[i - 1] + 63) / 64 * 64);
        memset(p[i], (int)(0x11 * (i + 1)), lens[i]);
        sum += (lens[i] + 63) / 64 * 64;
    }
    assert_true(sum <= GANG_KERNELS_ARENA_REGION);
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(p[i][0], (unsigned char)(0x11 * (i + 1)));
        assert_int_equal(p[i][lens[i] - 1], (unsigned char)(0x11 * (i + 1)));
        assert_true(gang_kernels_arena_owns(a, p[i]));
        assert_true(gang_kernels_arena_owns(a, p[i] + lens[i] - 1));
        assert_false(gang_kernels_arena_owns(b, p[i]));
    }
    assert_false(gang_kernels_arena_owns(a, p[n - 1] + (lens[n - 1] + 63) / 64 * 64));
    assert_false(gang_kernels_arena_owns(a, &sum));
    /* The rest of the region is too small: a new one, 2 MiB-aligned; then a piece larger
     * than a region, in one of its own; then pieces continue in that one's rest. */
    after = gang_kernels_arena_alloc(a, GANG_KERNELS_ARENA_REGION - sum + 64);
    assert_non_null(after);
    assert_int_equal((uintptr_t)after % two_mib, 0);
    big = gang_kernels_arena_alloc(a, GANG_KERNELS_ARENA_REGION + 5);
    assert_non_null(big);
    assert_int_equal((uintptr_t)big % two_mib, 0);
    memset(big, 0x7e, GANG_KERNELS_ARENA_REGION + 5);
    assert_true(gang_kernels_arena_owns(a, big + GANG_KERNELS_ARENA_REGION + 4));
    assert_ptr_equal(gang_kernels_arena_alloc(a, 10), big + GANG_KERNELS_ARENA_REGION + 64);
    assert_int_equal(p[3][0], 0x44); /* the first region is still there */
    print_message("[  NOTE    ] a weight arena's 32 MiB piece: %ld kB of it on huge pages\n",
                  huge_kb_at(big));
    gang_kernels_arena_free(a);
    gang_kernels_arena_free(b);
    gang_kernels_arena_free(NULL);
}

static void test_embedding_w(void **state)
{
    gang_kernels *k = *state;
    const size_t vocab = 37, dim = 19, n = 6;
    float *table = rnd_buf(vocab * dim, 2.0f), *out = malloc(n * dim * sizeof(float));
    int32_t ids[6] = {0, 36, 5, 5, 17, 2};

    for (int t = GANG_KW_F32; t <= GANG_KW_I8; t++) {
        void *blob = pack_new((gang_kernels_wtype)t, table, vocab, dim);
        gang_kernels_weight w = gang_kernels_weight_view((gang_kernels_wtype)t, blob, vocab, dim);

        assert_int_equal(gang_kernels_embedding_w(k, &w, vocab, dim, ids, n, out), 0);
        for (size_t r = 0; r < n; r++)
            for (size_t d = 0; d < dim; d++)
                assert_true(out[r * dim + d] == (float)packed_elem((gang_kernels_wtype)t, blob,
                                                                   vocab, dim, (size_t)ids[r], d));
        ids[3] = (int32_t)vocab; /* a bad id: refused, nothing written */
        for (size_t i = 0; i < n * dim; i++)
            out[i] = -3.0f;
        assert_int_equal(gang_kernels_embedding_w(k, &w, vocab, dim, ids, n, out), GANG_EINVAL);
        for (size_t i = 0; i < n * dim; i++)
            assert_true(out[i] == -3.0f);
        ids[3] = 5;
        free(blob);
    }
    free(table), free(out);
}

static void test_matmul_errors(void **state)
{
    gang_kernels *k = *state;
    float x[8] = {0}, y[8], wf[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    void *blob = pack_new(GANG_KW_I8, wf, 2, 4);
    gang_kernels_weight w = gang_kernels_weight_view(GANG_KW_I8, blob, 2, 4), bad;
    int32_t ids[1] = {0};

    assert_int_equal(gang_kernels_matmul(k, 1, 2, 4, x, &w, y), 0);
    assert_int_equal(gang_kernels_matmul(NULL, 1, 2, 4, x, &w, y), GANG_EINVAL);
    assert_int_equal(gang_kernels_matmul(k, 1, 2, 4, NULL, &w, y), GANG_EINVAL);
    assert_int_equal(gang_kernels_matmul(k, 1, 2, 4, x, NULL, y), GANG_EINVAL);
    assert_int_equal(gang_kernels_matmul(k, 1, 2, 4, x, &w, NULL), GANG_EINVAL);
    assert_int_equal(gang_kernels_matmul(k, 0, 2, 4, x, &w, y), GANG_EINVAL);
    assert_int_equal(gang_kernels_matmul(k, 1, 0, 4, x, &w, y), GANG_EINVAL);
    assert_int_equal(gang_kernels_matmul(k, 1, 2, 0, x, &w, y), GANG_EINVAL);
    assert_int_equal(gang_kernels_matmul(k, (size_t)INT32_MAX + 1, 2, 4, x, &w, y), GANG_ERANGE);
    bad = w;
    bad.scales = NULL; /* int8 without scales */
    assert_int_equal(gang_kernels_matmul(k, 1, 2, 4, x, &bad, y), GANG_EINVAL);
    assert_int_equal(gang_kernels_embedding_w(k, &bad, 2, 4, ids, 1, y), GANG_EINVAL);
    bad = w;
    bad.type = GANG_KW_BF16; /* scales on a type that has none */
    assert_int_equal(gang_kernels_matmul(k, 1, 2, 4, x, &bad, y), GANG_EINVAL);
    bad.type = (gang_kernels_wtype)9;
    bad.scales = NULL;
    assert_int_equal(gang_kernels_matmul(k, 1, 2, 4, x, &bad, y), GANG_EINVAL);
    bad = w;
    bad.data = NULL;
    assert_int_equal(gang_kernels_matmul(k, 1, 2, 4, x, &bad, y), GANG_EINVAL);
    free(blob);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_blas_loaded_on_open),
        cmocka_unit_test(test_blas_open_errors),
        cmocka_unit_test(test_open_names),
        cmocka_unit_test(test_cuda_not_built),
        cmocka_unit_test_setup_teardown(test_gemm, setup, teardown),
        cmocka_unit_test_setup_teardown(test_gemm_hf_linear, setup, teardown),
        cmocka_unit_test_setup_teardown(test_rmsnorm, setup, teardown),
        cmocka_unit_test_setup_teardown(test_rope, setup, teardown),
        cmocka_unit_test_setup_teardown(test_rope_hand, setup, teardown),
        cmocka_unit_test_setup_teardown(test_softmax, setup, teardown),
        cmocka_unit_test_setup_teardown(test_softmax_masked, setup, teardown),
        cmocka_unit_test_setup_teardown(test_attention, setup, teardown),
        cmocka_unit_test_setup_teardown(test_attention_causal, setup, teardown),
        cmocka_unit_test_setup_teardown(test_attention_window, setup, teardown),
        cmocka_unit_test_setup_teardown(test_attention_gqa, setup, teardown),
        cmocka_unit_test_setup_teardown(test_attention_paged, setup, teardown),
        cmocka_unit_test_setup_teardown(test_attention_decode_matches_prefill, setup, teardown),
        cmocka_unit_test_setup_teardown(test_attention_batch, setup, teardown),
        cmocka_unit_test_setup_teardown(test_silu_mul_add, setup, teardown),
        cmocka_unit_test_setup_teardown(test_silu_position_free, setup, teardown),
        cmocka_unit_test_setup_teardown(test_gelu_mul_scale, setup, teardown),
        cmocka_unit_test_setup_teardown(test_embedding, setup, teardown),
        cmocka_unit_test_setup_teardown(test_argmax, setup, teardown),
        cmocka_unit_test(test_f16_round_trip),
        cmocka_unit_test(test_f16_rounding),
        cmocka_unit_test(test_bf16),
        cmocka_unit_test(test_convert_arrays),
        cmocka_unit_test_setup_teardown(test_errors, setup, teardown),
        cmocka_unit_test(test_weight_pack),
        cmocka_unit_test_setup_teardown(test_matmul_types, setup, teardown),
        cmocka_unit_test_setup_teardown(test_matmul_threads, setup, teardown),
        cmocka_unit_test(test_matmul_rows_avx2),
        cmocka_unit_test(test_matmul_panel_buffer),
        cmocka_unit_test(test_weight_host_alloc),
        cmocka_unit_test(test_weight_arena),
        cmocka_unit_test(test_pool_ranges),
        cmocka_unit_test_setup_teardown(test_embedding_w, setup, teardown),
        cmocka_unit_test_setup_teardown(test_matmul_errors, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
