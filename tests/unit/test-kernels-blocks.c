/*
 * unit-kernels-blocks: the block weights of GGUF files (include/ganglion/kernels.h, "Block
 * types") in the CPU kernels. For every block type, random blocks with edge cases (an
 * all-zero block, zero and negative scales, the largest and smallest quants, the f16
 * scale's largest finite value) against the dequantize-then-f32 reference computed here
 * in double: gang_kernels_matmul at m = 1, 2, 3, 8 (decode) and 17, 40 (batched, more than
 * the SIMD kernels' 16 rows per pass), with the portable, the AVX2 and the AVX-512 VNNI
 * kernel (each where the CPU has it; a NOTE says which are skipped), within the bound
 * the contract states for the activations' rounding; each SIMD kernel against the
 * portable one much tighter; the embedding
 * rows of a block table equal to the dequantized rows; the sizes and refusals; x's int8
 * copy by AVX-512 equal to the portable one; gang_kernels_matmul_n equal to one
 * gang_kernels_matmul per weight, to the bit.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <cmocka.h>
#include "ganglion/common.h"
#include "ganglion/kernels.h"
#include "blocks-fixture.h"
#include "cpu/cpu.h" /* the SIMD levels */

static const char *const level_name[] = {"portable", "avx2", "avx512-vnni"};

/* The SIMD levels this CPU runs (gang__cpu_simd_force's), saying once which are skipped. */
static int simd_levels(void)
{
    static int said;
    int n = gang__cpu_avx512_usable() ? 3 : gang__cpu_avx2_usable() ? 2 : 1;

    if (!said && n < 3)
        print_message(
            "[  SKIP    ] %s: this CPU (or build) lacks it; those kernels untested here\n",
            n == 1 ? "AVX2+FMA+F16C and AVX-512 VNNI" : "AVX-512 F/BW/VL/VNNI");
    said = 1;
    return n;
}

/*
 * n rows of nb blocks of type t: random bytes with random scales, and the edge cases in
 * row 0: block 0 all zero bytes, block 1 its quants all 0xff with the largest f16 scale
 * (65504; its min / dmin negative), block 2 (when there is one) quants all 0 with
 * scale -1; row 1 block 0 with zero scales over random quants.
 */
static uint8_t *make_blocks(gang_kernels_wtype t, size_t n, size_t nb)
{
    size_t e, bb, at[2], nf = bf_f16_fields(t, at);
    assert_true(gang_kernels_wtype_block(t, &e, &bb));
    uint8_t *w = malloc(n * nb * bb);
    assert_non_null(w);
    for (size_t i = 0; i < n * nb * bb; i++)
        w[i] = (uint8_t)bf_rnd();
    for (size_t i = 0; i < n * nb; i++)
        for (size_t f = 0; f < nf; f++)
            bf_put_f16(w + i * bb + at[f], bf_rndf(0.05f));
    memset(w, 0, bb); /* an all-zero block */
    if (nb > 1) {
        memset(w + bb, 0xff, bb);
        for (size_t f = 0; f < nf; f++)
            bf_put_f16(w + bb + at[f], f == 0 ? 65504.0f : -65504.0f);
    }
    if (nb > 2) {
        memset(w + 2 * bb, 0, bb);
        for (size_t f = 0; f < nf; f++)
            bf_put_f16(w + 2 * bb + at[f], -1.0f);
    }
    if (n > 1)
        for (size_t f = 0; f < nf; f++)
            bf_put_f16(w + nb * bb + at[f], 0.0f);
    return w;
}

/* x [m, kdim]: random, with a zero group in row 0 and one large group in the last row. */
static float *make_x(size_t m, size_t kdim)
{
    float *x = malloc(m * kdim * sizeof(float));
    assert_non_null(x);
    for (size_t i = 0; i < m * kdim; i++)
        x[i] = bf_rndf(2.0f);
    memset(x, 0, 32 * sizeof(float));
    for (size_t j = 0; j < 32 && kdim > 64; j++)
        x[(m - 1) * kdim + 32 + j] = bf_rndf(3000.0f);
    return x;
}

/*
 * The reference y[r, o] = sum x w in double on the dequantized rows wd, and the contract's
 * bound: per 32 elements (max |x| / 254) x sum |w| (the activations' rounding) plus f32
 * summation error, 1e-5 of sum |x w|.
 */
static void reference(const float *x, const float *wd, size_t m, size_t n, size_t kdim, double *ref,
                      double *tol)
{
    for (size_t r = 0; r < m; r++) {
        for (size_t o = 0; o < n; o++) {
            double s = 0.0, mag = 0.0, q = 0.0;
            for (size_t g = 0; g < kdim; g += 32) {
                double amax = 0.0, wsum = 0.0;
                for (size_t j = g; j < g + 32; j++) {
                    double xv = x[r * kdim + j], wv = wd[o * kdim + j];
                    s += xv * wv;
                    mag += fabs(xv * wv);
                    amax = fabs(xv) > amax ? fabs(xv) : amax;
                    wsum += fabs(wv);
                }
                q += amax / 254.0 * wsum;
            }
            ref[r * n + o] = s;
            tol[r * n + o] = 1.0001 * q + 1e-5 * mag + 1e-30;
        }
    }
}

static void test_block_matmul(void **state)
{
    gang_kernels *k = *state;
    const size_t ms[] = {1, 2, 3, 8, 17, 40};
    const size_t n = 21; /* not a multiple of the 8-row chunks */
    int modes = simd_levels();

    for (size_t ti = 0; ti < BF_N_TYPES; ti++) {
        gang_kernels_wtype t = bf_types[ti];
        size_t e, bb;
        assert_true(gang_kernels_wtype_block(t, &e, &bb));
        for (size_t mi = 0; mi < sizeof(ms) / sizeof(ms[0]); mi++) {
            /* An odd and an even number of 32-element blocks in turn (the VNNI decode
             * tiles take them in pairs). */
            size_t m = ms[mi], nb = e == 32 ? 5 + mi % 2 : 3, kdim = nb * e;
            uint8_t *w = make_blocks(t, n, nb);
            float *wd = malloc(n * kdim * sizeof(float));
            assert_non_null(wd);
            assert_int_equal(gang_kernels_block_dequant(t, w, n * kdim, wd), 0);
            float *x = make_x(m, kdim), *y[3];
            double *ref = malloc(m * n * sizeof(double)), *tol = malloc(m * n * sizeof(double));
            assert_non_null(ref);
            assert_non_null(tol);
            reference(x, wd, m, n, kdim, ref, tol);
            gang_kernels_weight v = gang_kernels_weight_view(t, w, n, kdim);
            for (int simd = 0; simd < modes; simd++) {
                y[simd] = malloc(m * n * sizeof(float));
                assert_non_null(y[simd]);
                gang__cpu_simd_force(simd);
                assert_int_equal(gang_kernels_matmul(k, m, n, kdim, x, &v, y[simd]), 0);
                for (size_t i = 0; i < m * n; i++)
                    if (!(fabs(y[simd][i] - ref[i]) <= tol[i]))
                        fail_msg("%s %s m %zu: y[%zu, %zu] = %.9g, reference %.9g (bound %.3g)",
                                 gang_kernels_wtype_name(t), level_name[simd], m, i / n, i % n,
                                 (double)y[simd][i], ref[i], tol[i]);
            }
            /* The AVX-512 VNNI kernel sums in the AVX2 kernel's order: equal to the bit (the
             * int8 rounding of the next layer's activations would magnify any difference). */
            for (size_t i = 0; modes == 3 && i < m * n; i++)
                if (memcmp(&y[1][i], &y[2][i], sizeof(float)) != 0)
                    fail_msg("%s m %zu: avx2 %.9g and avx512-vnni %.9g differ at %zu",
                             gang_kernels_wtype_name(t), m, (double)y[1][i], (double)y[2][i], i);
            /* The kernels compute the same integers: only f32 summation order differs. */
            for (int simd = 1; simd < modes; simd++)
                for (size_t i = 0; i < m * n; i++)
                    if (!(fabs(y[0][i] - y[simd][i]) <= 1e-5 * (tol[i] + fabs(ref[i]))))
                        fail_msg("%s m %zu: portable %.9g and %s %.9g differ at %zu",
                                 gang_kernels_wtype_name(t), m, (double)y[0][i], level_name[simd],
                                 (double)y[simd][i], i);
            for (int simd = 0; simd < modes; simd++)
                free(y[simd]);
            free(x), free(ref), free(tol);
            free(w), free(wd);
        }
    }
    gang__cpu_simd_force(-1);
}

/* The activations' rounding is what the bound allows, not more: an x exactly on the
 * int8 grid (every group has max |x| = 127 units) gives the f32 result. */
static void test_block_exact_grid(void **state)
{
    gang_kernels *k = *state;
    int modes = simd_levels();

    for (size_t ti = 0; ti < BF_N_TYPES; ti++) {
        gang_kernels_wtype t = bf_types[ti];
        size_t e, bb;
        assert_true(gang_kernels_wtype_block(t, &e, &bb));
        size_t n = 9, kdim = 2 * e;
        uint8_t *w = make_blocks(t, n, 2);
        float *wd = malloc(n * kdim * sizeof(float)), x[512], y[9];
        double ref[9], tol[9];
        assert_non_null(wd);
        assert_int_equal(gang_kernels_block_dequant(t, w, n * kdim, wd), 0);
        for (size_t i = 0; i < kdim; i++)
            x[i] = 0.25f * (float)((int)(bf_rnd() % 255u) - 127);
        for (size_t g = 0; g < kdim; g += 32)
            x[g] = 0.25f * 127.0f;
        reference(x, wd, 1, n, kdim, ref, tol);
        gang_kernels_weight v = gang_kernels_weight_view(t, w, n, kdim);
        for (int simd = 0; simd < modes; simd++) {
            gang__cpu_simd_force(simd);
            assert_int_equal(gang_kernels_matmul(k, 1, n, kdim, x, &v, y), 0);
            for (size_t o = 0; o < n; o++) {
                double mag = 0.0;
                for (size_t i = 0; i < kdim; i++)
                    mag += fabs((double)x[i] * wd[o * kdim + i]);
                if (!(fabs(y[o] - ref[o]) <= 2e-6 * mag + 1e-30))
                    fail_msg("%s %s: on the grid y[%zu] = %.9g, reference %.9g",
                             gang_kernels_wtype_name(t), level_name[simd], o, (double)y[o], ref[o]);
            }
        }
        free(w), free(wd);
    }
    gang__cpu_simd_force(-1);
}

/* y[m, n] of the block weight w (file layout) repacked, at level simd; the 16 floats after
 * y are a sentinel the kernel must not write (the last group's padding rows). */
static float *repacked_product(gang_kernels *k, int simd, gang_kernels_wtype t, const void *rp,
                               size_t m, size_t n, size_t kdim, const float *x)
{
    float *y = malloc((m * n + 16) * sizeof(float));
    assert_non_null(y);
    for (size_t i = 0; i < 16; i++)
        y[m * n + i] = -7.0f;
    gang__cpu_simd_force(simd);
    gang_kernels_weight v = gang_kernels_weight_view(t, rp, n, kdim);
    assert_int_equal(gang_kernels_matmul(k, m, n, kdim, x, &v, y), 0);
    for (size_t i = 0; i < 16; i++)
        assert_true(y[m * n + i] == -7.0f);
    return y;
}

/*
 * The repacked layout of the block types (kernels/cpu/cpu-qrepack.c, the K types'
 * cpu-qrepack-k.c, with the edge blocks of make_blocks): lossless (each
 * row's blocks given back to the byte), its products at m = 1, 3, 8, 17, 32, 40 over row counts
 * that are and are not multiples of 16 within the contract's bound of the double reference
 * and equal to the bit to the portable kernel on the file's layout (the AVX-512 kernel on
 * the repacked layout rounds in the reference's order), and
 * each row's result independent of where it falls in a group (a band of rows repacked on
 * its own, as a TP shard is, gives the same bits).
 */
static void test_block_repacked(void **state)
{
    gang_kernels *k = *state;
    const gang_kernels_wtype rts[] = {GANG_KW_Q8_0,   GANG_KW_Q4_0,  GANG_KW_Q4_1, GANG_KW_Q5_0,
                                      GANG_KW_Q5_1,   GANG_KW_Q4_K,  GANG_KW_Q5_K, GANG_KW_Q6_K,
                                      GANG_KW_IQ4_NL, GANG_KW_IQ4_XS};
    const size_t ms[] = {1, 3, 8, 17, 32, 40}, ns[] = {37, 16, 5};
    int vnni = simd_levels() == 3;

    for (size_t ti = 0; ti < sizeof(rts) / sizeof(rts[0]); ti++)
        for (size_t ni = 0; ni < sizeof(ns) / sizeof(ns[0]); ni++)
            for (size_t mi = 0; mi < sizeof(ms) / sizeof(ms[0]); mi++) {
                gang_kernels_wtype t = rts[ti];
                size_t n = ns[ni], m = ms[mi], nb = 4 + mi % 3, e, bb;
                assert_true(gang_kernels_wtype_block(t, &e, &bb));
                if (e == 256) /* the K types: fewer, longer blocks */
                    nb = 1 + mi % 3;
                size_t kdim = e * nb;
                uint8_t *w = make_blocks(t, n, nb), blk[256];
                void *rp = gang__cpu_rp_build(t, w, n, kdim, NULL);
                assert_non_null(rp);
                gang__cpu_rp r;
                assert_int_equal(gang__cpu_rp_get(&(gang_kernels_weight){t, rp, NULL}, n, kdim, &r),
                                 1);
                assert_int_equal(
                    gang__cpu_rp_get(&(gang_kernels_weight){t, rp, NULL}, n + 1, kdim, &r),
                    GANG_EINVAL);
                assert_int_equal(gang__cpu_rp_get(&(gang_kernels_weight){t, w, NULL}, n, kdim, &r),
                                 0);
                gang__cpu_rp_get(&(gang_kernels_weight){t, rp, NULL}, n, kdim, &r);
                for (size_t o = 0; o < n; o++)
                    for (size_t b = 0; b < nb; b++) {
                        gang__cpu_rp_block(&r, o, b, blk);
                        if (memcmp(blk, w + (o * nb + b) * bb, bb) != 0)
                            fail_msg("%s: row %zu block %zu not given back",
                                     gang_kernels_wtype_name(t), o, b);
                    }
                float *wd = malloc(n * kdim * sizeof(float)), *x = make_x(m, kdim), *y0, *yp;
                double *ref = malloc(m * n * sizeof(double)), *tol = malloc(m * n * sizeof(double));
                assert_non_null(wd);
                assert_non_null(ref);
                assert_non_null(tol);
                assert_int_equal(gang_kernels_block_dequant(t, w, n * kdim, wd), 0);
                reference(x, wd, m, n, kdim, ref, tol);
                y0 = repacked_product(k, 0, t, w, m, n, kdim, x);  /* portable, file layout */
                yp = repacked_product(k, 0, t, rp, m, n, kdim, x); /* portable, repacked */
                assert_memory_equal(y0, yp, m * n * sizeof(float));
                free(yp);
                if (vnni) {
                    yp = repacked_product(k, 2, t, rp, m, n, kdim, x);
                    for (size_t i = 0; i < m * n; i++)
                        if (!(fabs(yp[i] - ref[i]) <= tol[i]) || memcmp(&y0[i], &yp[i], 4) != 0)
                            fail_msg("%s repacked n %zu m %zu: y[%zu, %zu] = %.9g, portable %.9g, "
                                     "reference %.9g (bound %.3g)",
                                     gang_kernels_wtype_name(t), n, m, i / n, i % n, (double)yp[i],
                                     (double)y0[i], ref[i], tol[i]);
                    if (n > 16) { /* rows 3 .. n of their own: other groups, the same bits */
                        void *band = gang__cpu_rp_build(t, w + 3 * nb * bb, n - 3, kdim, NULL);
                        float *yb = repacked_product(k, 2, t, band, m, n - 3, kdim, x);
                        for (size_t i = 0; i < m * (n - 3); i++)
                            if (memcmp(&yb[i], &yp[(i / (n - 3)) * n + 3 + i % (n - 3)], 4) != 0)
                                fail_msg("%s: row %zu moved by its group",
                                         gang_kernels_wtype_name(t), 3 + i % (n - 3));
                        free(yb), free(band);
                    }
                    free(yp);
                }
                /* a repacked table's embedding rows: the file layout's, to the bit */
                int32_t ids[3] = {(int32_t)n - 1, 0, (int32_t)(n / 2)};
                float *e0 = malloc(3 * kdim * sizeof(float)),
                      *e1 = malloc(3 * kdim * sizeof(float));
                assert_non_null(e0);
                assert_non_null(e1);
                gang_kernels_weight tv = gang_kernels_weight_view(t, w, n, kdim);
                gang_kernels_weight rv = gang_kernels_weight_view(t, rp, n, kdim);
                assert_int_equal(gang_kernels_embedding_w(k, &tv, n, kdim, ids, 3, e0), 0);
                assert_int_equal(gang_kernels_embedding_w(k, &rv, n, kdim, ids, 3, e1), 0);
                assert_memory_equal(e0, e1, 3 * kdim * sizeof(float));
                free(e0), free(e1);
                gang__cpu_simd_force(vnni ? 2 : 1);
                void *pub = gang_kernels_block_repack(t, w, n, kdim, NULL);
                assert_true(vnni ? pub != NULL : pub == NULL); /* made where the kernel runs */
                if (pub != NULL) { /* in an arena: the same bytes, in one of its pieces */
                    gang_kernels_arena *a = gang_kernels_arena_new();
                    void *in = gang_kernels_block_repack(t, w, n, kdim, a);
                    assert_non_null(in);
                    assert_true(gang_kernels_arena_owns(a, in));
                    assert_memory_equal(in, rp, GANG__RP_HEADER + r.groups * r.nb * r.cb);
                    assert_memory_equal(pub, rp, GANG__RP_HEADER + r.groups * r.nb * r.cb);
                    gang_kernels_arena_free(a);
                }
                free(pub);
                free(y0), free(rp), free(w), free(wd), free(x), free(ref), free(tol);
            }
    if (!vnni)
        print_message("[  SKIP    ] the repacked AVX-512 VNNI kernel: this CPU (or build) lacks "
                      "it; the layout and its portable path tested\n");
    assert_null(gang_kernels_block_repack(GANG_KW_Q4_K, &bf_types, 1, 320, NULL)); /* not whole */
    gang__cpu_simd_force(-1);
}

/*
 * x's int8 copy by AVX-512 (gang__cpu_quantize_x_avx512): the portable function's bytes,
 * scales and sums to the bit, and the half-group sums of the repacked kernels, on groups
 * of every kind: random, all zero, one huge value, exact halves (round to even), values
 * just under a rounding boundary, denormals, a NaN and an infinity (the portable path).
 */
static void test_quantize_x_simd(void **state)
{
    (void)state;
    if (simd_levels() < 3) {
        skip(); /* simd_levels printed why */
        return;
    }
    const size_t m = 3, kdim = 32 * 9, groups = kdim / 32;
    float *x = make_x(m, kdim);
    for (int j = 0; j < 32; j++) {
        x[64 + j] = (float)(j - 16) + 0.5f;            /* ties: 127 / 15.5 scales them */
        x[96 + j] = j == 5 ? 1e30f : 1e-3f * (float)j; /* one huge value */
        x[128 + j] = 1e-40f * (float)(j + 1);          /* denormals */
        x[160 + j] = j == 7 ? NAN : (float)j;          /* a NaN */
        x[192 + j] = j == 9 ? -INFINITY : (float)j;    /* an infinity */
        x[224 + j] = j == 0 ? 127.0f : (float)j + 0.49999997f;
    }
    int8_t *q0 = calloc(m * kdim, 1), *q1 = calloc(m * kdim, 1);
    float *f0 = calloc(4 * m * groups, sizeof(float)), *f1 = calloc(4 * m * groups, sizeof(float));
    int32_t *sx = calloc(2 * m * groups, sizeof(int32_t));
    assert_non_null(q0);
    assert_non_null(q1);
    assert_non_null(f0);
    assert_non_null(f1);
    assert_non_null(sx);
    gang__cpu_qx a = {q0, f0, f0 + m * groups}, b = {q1, f1, f1 + m * groups};
    gang__cpu_quantize_x(x, m, kdim, &a);
    gang__cpu_quantize_x_avx512(x, m, kdim, &b, sx);
    assert_memory_equal(q0, q1, m * kdim);
    assert_memory_equal(f0, f1, 2 * m * groups * sizeof(float)); /* d and ds, NaN bits too */
    for (size_t h = 0; h < 2 * m * groups; h++) {
        int32_t v = 0;
        for (size_t j = 0; j < 16; j++)
            v += q0[16 * h + j];
        assert_int_equal(sx[h], v);
    }
    assert_true(isnan(f1[6])); /* the infinity's group (6) says so */
    free(x), free(q0), free(q1), free(f0), free(f1), free(sx);
}

/* y of w alone through gang_kernels_matmul (the reference gang_kernels_matmul_n must equal). */
static float *single_product(gang_kernels *k, const gang_kernels_weight *w, size_t m, size_t n,
                             size_t kdim, const float *x)
{
    float *y = malloc(m * n * sizeof(float));
    assert_non_null(y);
    assert_int_equal(gang_kernels_matmul(k, m, n, kdim, x, w, y), 0);
    return y;
}

/*
 * gang_kernels_matmul_n: each output to the bit what gang_kernels_matmul gives for its
 * weight alone, at every SIMD level, for a mix of a repacked weight (where the kernel
 * runs), block weights in the file's layout of other types, and for a bf16 + int8 + f32
 * mix (one job of typed rows), at sizes run on the caller and shared over the pool; the
 * refusals checked before anything is written.
 */
static void test_block_matmul_n(void **state)
{
    gang_kernels *k = *state;
    const size_t kdim = 256, ns[3] = {160, 48, 40}, ms[] = {1, 5, 17};
    const gang_kernels_wtype ts[3] = {GANG_KW_Q4_1, GANG_KW_Q6_K, GANG_KW_Q8_0};
    int levels = simd_levels();
    uint8_t *w[3];
    void *rp = NULL;

    for (int i = 0; i < 3; i++) {
        size_t e, bb;
        assert_true(gang_kernels_wtype_block(ts[i], &e, &bb));
        w[i] = make_blocks(ts[i], ns[i], kdim / e);
    }
    if (levels == 3)
        rp = gang__cpu_rp_build(ts[0], w[0], ns[0], kdim, NULL);
    for (int lv = 0; lv < levels; lv++)
        for (size_t mi = 0; mi < sizeof(ms) / sizeof(ms[0]); mi++) {
            size_t m = ms[mi];
            float *x = make_x(m, kdim), *y[3], *one[3];
            gang_kernels_weight v[3];
            gang__cpu_simd_force(lv);
            for (int i = 0; i < 3; i++) {
                v[i] = gang_kernels_weight_view(ts[i], i == 0 && lv == 2 ? rp : w[i], ns[i], kdim);
                y[i] = malloc(m * ns[i] * sizeof(float));
                assert_non_null(y[i]);
                one[i] = single_product(k, &v[i], m, ns[i], kdim, x);
            }
            assert_int_equal(gang_kernels_matmul_n(k, m, kdim, x, 3, v, ns, y), 0);
            for (int i = 0; i < 3; i++) {
                if (memcmp(y[i], one[i], m * ns[i] * sizeof(float)) != 0)
                    fail_msg("matmul_n %s m %zu level %s: not the single product's bits",
                             gang_kernels_wtype_name(ts[i]), m, level_name[lv]);
                free(y[i]), free(one[i]);
            }
            free(x);
        }
    gang__cpu_simd_force(-1);
    /* typed weights (bf16, int8, f32) as one job, shared over the pool or not: the same
     * bits as one matmul each */
    for (size_t m = 1; m <= 5; m += 4) {
        size_t n = 200;
        float *wf = malloc(n * kdim * sizeof(float)), *x = make_x(m, kdim), *y[3], *one[3];
        uint16_t *wb = malloc(n * kdim * sizeof(uint16_t));
        void *wi = malloc(gang_kernels_weight_bytes(GANG_KW_I8, n, kdim));
        assert_non_null(wf);
        assert_non_null(wb);
        assert_non_null(wi);
        for (size_t i = 0; i < n * kdim; i++)
            wf[i] = bf_rndf(0.1f);
        assert_int_equal(gang_kernels_weight_pack(GANG_KW_BF16, wf, n, kdim, wb), 0);
        assert_int_equal(gang_kernels_weight_pack(GANG_KW_I8, wf, n, kdim, wi), 0);
        gang_kernels_weight v[3] = {gang_kernels_weight_view(GANG_KW_BF16, wb, n, kdim),
                                    gang_kernels_weight_view(GANG_KW_I8, wi, n / 2, kdim),
                                    gang_kernels_weight_view(GANG_KW_F32, wf, n / 8, kdim)};
        size_t nn[3] = {n, n / 2, n / 8};
        for (int i = 0; i < 3; i++) {
            y[i] = malloc(m * nn[i] * sizeof(float));
            assert_non_null(y[i]);
            one[i] = single_product(k, &v[i], m, nn[i], kdim, x);
        }
        assert_int_equal(gang_kernels_matmul_n(k, m, kdim, x, 3, v, nn, y), 0);
        for (int i = 0; i < 3; i++) {
            if (memcmp(y[i], one[i], m * nn[i] * sizeof(float)) != 0)
                fail_msg("matmul_n typed weight %d m %zu: not the single product's bits", i, m);
            free(y[i]), free(one[i]);
        }
        free(wf), free(wb), free(wi), free(x);
    }
    /* refusals, nothing written: a kdim that is not whole Q6_K blocks, a NULL output, counts */
    {
        float x[512] = {0}, y0[160], y1[160], *ys[3] = {y0, y1, NULL};
        gang_kernels_weight v[3] = {gang_kernels_weight_view(ts[0], w[0], 2, 128),
                                    gang_kernels_weight_view(ts[1], w[1], 2, 128),
                                    gang_kernels_weight_view(ts[2], w[2], 2, 128)};
        size_t nn[3] = {2, 2, 2};
        for (size_t i = 0; i < 160; i++)
            y0[i] = -7.0f;
        assert_int_equal(gang_kernels_matmul_n(k, 1, 128, x, 2, v, nn, ys), GANG_EINVAL);
        assert_true(y0[0] == -7.0f); /* the Q4_1 product did not run before the Q6_K refusal */
        assert_int_equal(gang_kernels_matmul_n(k, 1, 256, x, 3, v, nn, ys), GANG_EINVAL);
        assert_int_equal(gang_kernels_matmul_n(k, 1, 256, x, 0, v, nn, ys), GANG_EINVAL);
        assert_int_equal(
            gang_kernels_matmul_n(k, 1, 256, x, GANG_KERNELS_MATMUL_N_MAX + 1, v, nn, ys),
            GANG_EINVAL);
        assert_true(y0[0] == -7.0f);
    }
    free(rp);
    for (int i = 0; i < 3; i++)
        free(w[i]);
}

/*
 * Q6_K's repacked kernel leaves out the reference's 0 ds term except in a call where some
 * ds is infinite (a group of x near FLT_MAX): there the reference's 0 inf makes NaNs,
 * and so must the kernel, while the other rows of x keep the portable kernel's bits.
 */
static void test_block_repacked_q6k_inf(void **state)
{
    gang_kernels *k = *state;
    const size_t n = 20, nb = 2, kdim = 256 * nb, m = 2;

    if (simd_levels() < 3) {
        print_message("[  SKIP    ] Q6_K's repacked kernel: no AVX-512 VNNI here\n");
        skip();
    }
    uint8_t *w = make_blocks(GANG_KW_Q6_K, n, nb);
    void *rp = gang__cpu_rp_build(GANG_KW_Q6_K, w, n, kdim, NULL);
    float *x = make_x(m, kdim);
    assert_non_null(rp);
    for (size_t i = 0; i < 32; i++)
        x[kdim + 96 + i] = 3.0e38f; /* row 1, group 3: ds = d 4064 overflows */
    float *y0 = repacked_product(k, 0, GANG_KW_Q6_K, w, m, n, kdim, x);
    float *yp = repacked_product(k, 2, GANG_KW_Q6_K, rp, m, n, kdim, x);
    for (size_t o = 0; o < n; o++) {
        assert_memory_equal(&y0[o], &yp[o], sizeof(float));
        if (!isnan(y0[n + o]) || !isnan(yp[n + o]))
            fail_msg("Q6_K row %zu with an infinite ds: portable %g, repacked %g", o,
                     (double)y0[n + o], (double)yp[n + o]);
    }
    gang__cpu_simd_force(-1);
    free(y0), free(yp), free(x), free(rp), free(w);
}

static void test_block_embedding_and_sizes(void **state)
{
    gang_kernels *k = *state;
    for (size_t ti = 0; ti < BF_N_TYPES; ti++) {
        gang_kernels_wtype t = bf_types[ti];
        size_t e, bb;
        assert_true(gang_kernels_wtype_block(t, &e, &bb));
        size_t vocab = 7, dim = 2 * e;
        uint8_t *w = make_blocks(t, vocab, 2);
        float *wd = malloc(vocab * dim * sizeof(float)), *out = malloc(3 * dim * sizeof(float));
        int32_t ids[3] = {6, 0, 3};
        assert_non_null(wd);
        assert_non_null(out);
        assert_int_equal(gang_kernels_block_dequant(t, w, vocab * dim, wd), 0);
        gang_kernels_weight v = gang_kernels_weight_view(t, w, vocab, dim);
        assert_null(v.scales);
        assert_int_equal(gang_kernels_embedding_w(k, &v, vocab, dim, ids, 3, out), 0);
        for (size_t i = 0; i < 3; i++)
            assert_memory_equal(out + i * dim, wd + (size_t)ids[i] * dim, dim * sizeof(float));
        /* Sizes: whole blocks per row, nothing else. */
        assert_int_equal(gang_kernels_weight_row_bytes(t, dim), 2 * bb);
        assert_int_equal(gang_kernels_weight_bytes(t, vocab, dim), vocab * 2 * bb);
        assert_int_equal(gang_kernels_weight_row_bytes(t, dim + 16), 0);
        assert_int_equal(gang_kernels_weight_bytes(t, vocab, dim + 16), 0);
        assert_int_equal(gang_kernels_wtype_size(t), 0);
        /* Refusals: a kdim that is not whole blocks, packing from f32, a partial dequant. */
        float x[600] = {0}, y[7];
        assert_int_equal(gang_kernels_matmul(k, 1, vocab, dim - 16, x, &v, y), GANG_EINVAL);
        assert_int_equal(gang_kernels_embedding_w(k, &v, vocab, dim - 16, ids, 1, out),
                         GANG_EINVAL);
        assert_int_equal(gang_kernels_weight_pack(t, x, 1, dim, w), GANG_EINVAL);
        assert_int_equal(gang_kernels_block_dequant(t, w, e + 16, out), GANG_EINVAL);
        assert_string_not_equal(gang_kernels_wtype_name(t), "?");
        free(w), free(wd), free(out);
    }
    assert_false(gang_kernels_wtype_block(GANG_KW_I8, NULL, NULL));
    assert_false(gang_kernels_wtype_block(GANG_KW_BF16, NULL, NULL));
    assert_int_equal(gang_kernels_block_dequant(GANG_KW_F32, &bf_types, 1, (float[1]){0}),
                     GANG_EINVAL);
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

int main(void)
{
    bf_seed(0x2545f4914f6cdd1dull);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_block_matmul),
        cmocka_unit_test(test_block_exact_grid),
        cmocka_unit_test(test_block_repacked),
        cmocka_unit_test(test_block_repacked_q6k_inf),
        cmocka_unit_test(test_quantize_x_simd),
        cmocka_unit_test(test_block_matmul_n),
        cmocka_unit_test(test_block_embedding_and_sizes),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
