/*
 * unit-cuda-qblocks: the per-group dequantization the CUDA block kernels run
 * (kernels/cuda/cuda-qblocks.h, compiled here for the host from the same text nvcc compiles
 * for the device) against the formats' reference, gang_kernels_block_dequant
 * (kernels/weight-blocks.c), for every block type: random blocks, an all-zero block, the
 * largest and smallest quants with the largest finite f16 scale (and min / dmin), zero and
 * negative scales, subnormal, signed-zero, infinite and NaN f16 scales. Every element must
 * be equal bit for bit (NaN where the reference has NaN): the functions evaluate the
 * reference's expression in its order. The kernels' thread bodies too (gang_qb_gemv_lane,
 * gang_qb_group_of), run here lane by lane as the kernels run them. Runs everywhere: no
 * GPU and no CUDA toolkit needed.
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
#include "cuda/cuda-qblocks.h"

#define N_BLOCKS 400

/* f16 bit patterns of the edge scales: +-0, the smallest and largest subnormals, the
 * smallest normal, 1, -1, the largest finite (65504) both signs, +-infinity, a NaN. */
static const uint16_t edge_f16[] = {0x0000, 0x8000, 0x0001, 0x03ff, 0x0400, 0x3c00,
                                    0xbc00, 0x7bff, 0xfbff, 0x7c00, 0xfc00, 0x7e00};
#define N_EDGE (sizeof(edge_f16) / sizeof(edge_f16[0]))

static void put_u16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)(v & 0xff);
    p[1] = (uint8_t)(v >> 8);
}

/*
 * N_BLOCKS blocks of t: random bytes with random finite scales; then block 0 all zero,
 * block 1 all 0xff quants with scales 65504 / -65504, block 2 all zero quants with scale
 * -1, and blocks 3 .. 3 + N_EDGE^2 every pair of edge values in the f16 fields.
 */
static uint8_t *make_blocks(gang_kernels_wtype t, size_t bb)
{
    size_t at[2], nf = bf_f16_fields(t, at);
    uint8_t *w = malloc(N_BLOCKS * bb);

    assert_non_null(w);
    for (size_t i = 0; i < N_BLOCKS * bb; i++)
        w[i] = (uint8_t)bf_rnd();
    for (size_t i = 0; i < N_BLOCKS; i++)
        for (size_t f = 0; f < nf; f++)
            put_u16(w + i * bb + at[f], (uint16_t)((bf_rnd() & 0x7bffu) | (bf_rnd() & 1u) << 15));
    memset(w, 0, bb);
    memset(w + bb, 0xff, bb);
    for (size_t f = 0; f < nf; f++)
        put_u16(w + bb + at[f], f == 0 ? 0x7bff : 0xfbff);
    memset(w + 2 * bb, 0, bb);
    for (size_t f = 0; f < nf; f++)
        put_u16(w + 2 * bb + at[f], 0xbc00);
    for (size_t e = 0; e < N_EDGE * N_EDGE && 3 + e < N_BLOCKS; e++) {
        put_u16(w + (3 + e) * bb + at[0], edge_f16[e % N_EDGE]);
        if (nf > 1)
            put_u16(w + (3 + e) * bb + at[1], edge_f16[e / N_EDGE]);
    }
    return w;
}

static int same_value(float a, float b)
{
    return (isnan(a) && isnan(b)) || memcmp(&a, &b, sizeof(a)) == 0;
}

/* Every group of every block of every type equals the reference, bit for bit. */
static void test_groups_equal_reference(void **state)
{
    (void)state;
    for (size_t ti = 0; ti < BF_N_TYPES; ti++) {
        gang_kernels_wtype t = bf_types[ti];
        size_t e, bb, bad = 0;
        float w[32];

        assert_true(gang_kernels_wtype_block(t, &e, &bb));
        assert_int_equal(gang_qb_elems((int)t), (int)e);
        assert_int_equal(gang_qb_bytes((int)t), (int)bb);
        uint8_t *blocks = make_blocks(t, bb);
        float *ref = malloc(N_BLOCKS * e * sizeof(float));
        assert_non_null(ref);
        assert_int_equal(gang_kernels_block_dequant(t, blocks, N_BLOCKS * e, ref), 0);
        for (size_t b = 0; b < N_BLOCKS; b++) {
            for (size_t g = 0; g < e / 32; g++) {
                gang_qb_group((int)t, blocks + b * bb, (int)g, w);
                for (size_t l = 0; l < 32; l++) {
                    float r = ref[b * e + g * 32 + l];
                    if (!same_value(w[l], r) && bad++ < 5)
                        print_message("%s block %zu element %zu: %a, reference %a\n",
                                      gang_kernels_wtype_name(t), b, g * 32 + l, (double)w[l],
                                      (double)r);
                }
            }
        }
        assert_int_equal(bad, 0);
        free(ref);
        free(blocks);
    }
}

/*
 * The GEMV's thread bodies run here as the kernel runs them (cuda-qmatmul.cu): per output
 * row, x staged tile by tile (1024 elements) in the padded layout, 32 lanes each calling
 * gang_qb_gemv_lane, the lanes' sums added; against the double product on the weight
 * dequantized by the reference, within the kernel's bound (unit-cuda-blocks): 1e-5 x
 * sum |x w|. Sizes: kdim 1280 and 2304 (whole and partial tiles), 96 for the 32-element
 * types; m = 1 .. 8; 5 rows.
 */
#define EMU_TILE 1024
static void emulate_gemv(gang_kernels_wtype t, size_t m, size_t n, size_t kdim)
{
    size_t e, bb;
    assert_true(gang_kernels_wtype_block(t, &e, &bb));
    size_t rb = kdim / e * bb;
    uint8_t *w = malloc(n * rb);
    float *wd = malloc(n * kdim * sizeof(float)), *x = malloc(m * kdim * sizeof(float));
    static float xs[GANG_QB_ROWS][GANG_QB_PAD(EMU_TILE)];
    size_t at[2], nf = bf_f16_fields(t, at);

    assert_true(w != NULL && wd != NULL && x != NULL);
    for (size_t i = 0; i < n * rb; i++)
        w[i] = (uint8_t)bf_rnd();
    for (size_t b = 0; b < n * kdim / e; b++)
        for (size_t f = 0; f < nf; f++)
            put_u16(w + b * bb + at[f], (uint16_t)((bf_rnd() % 0x2c00u) | (bf_rnd() & 1u) << 15));
    memset(w, 0, bb); /* an all-zero block */
    assert_int_equal(gang_kernels_block_dequant(t, w, n * kdim, wd), 0);
    for (size_t i = 0; i < m * kdim; i++)
        x[i] = (float)((int)(bf_rnd() % 4001u) - 2000) / 1000.0f;
    for (size_t o = 0; o < n; o++) {
        float acc[32][GANG_QB_ROWS] = {{0}};
        for (size_t k0 = 0; k0 < kdim; k0 += EMU_TILE) {
            size_t kt = kdim - k0 < EMU_TILE ? kdim - k0 : EMU_TILE;
            for (size_t i = 0; i < m * kt; i++)
                xs[i / kt][GANG_QB_PAD(i % kt)] = x[(i / kt) * kdim + k0 + i % kt];
            for (int lane = 0; lane < 32; lane++)
                gang_qb_gemv_lane((int)t, w + o * rb, k0, kt, &xs[0][0], GANG_QB_PAD(EMU_TILE), m,
                                  lane, acc[lane]);
        }
        for (size_t r = 0; r < m; r++) {
            double ref = 0.0, mag = 0.0;
            float got = 0.0f;
            for (int lane = 0; lane < 32; lane++)
                got += acc[lane][r];
            for (size_t i = 0; i < kdim; i++) {
                double p = (double)x[r * kdim + i] * (double)wd[o * kdim + i];
                ref += p;
                mag += fabs(p);
            }
            if (!(fabs((double)got - ref) <= 1e-5 * mag))
                fail_msg("%s m=%zu k=%zu: y[%zu,%zu] = %.9g, reference %.9g",
                         gang_kernels_wtype_name(t), m, kdim, r, o, (double)got, ref);
        }
    }
    free(w), free(wd), free(x);
}

static void test_gemv_lanes(void **state)
{
    (void)state;
    for (size_t ti = 0; ti < BF_N_TYPES; ti++) {
        size_t e;
        assert_true(gang_kernels_wtype_block(bf_types[ti], &e, NULL));
        for (size_t m = 1; m <= GANG_QB_ROWS; m++) {
            emulate_gemv(bf_types[ti], m, 5, 1280);
            emulate_gemv(bf_types[ti], m, 5, 2304);
            if (e == 32)
                emulate_gemv(bf_types[ti], m, 5, 96);
        }
    }
}

/* The bf16 dequantization's and the embedding's thread body: group g of the whole weight
 * lands where the reference puts it, with its values, for every g. */
static void test_group_of_covers_weight(void **state)
{
    (void)state;
    for (size_t ti = 0; ti < BF_N_TYPES; ti++) {
        gang_kernels_wtype t = bf_types[ti];
        size_t e, bb, n = 7, kdim = 768;
        assert_true(gang_kernels_wtype_block(t, &e, &bb));
        size_t bytes = n * (kdim / e) * bb;
        uint8_t *w = malloc(bytes);
        float *ref = malloc(n * kdim * sizeof(float)), *got = malloc(n * kdim * sizeof(float));
        assert_true(w != NULL && ref != NULL && got != NULL);
        for (size_t i = 0; i < bytes; i++)
            w[i] = (uint8_t)bf_rnd();
        assert_int_equal(gang_qb_row_bytes((int)t, kdim), (size_t)(kdim / e * bb));
        assert_int_equal(gang_kernels_block_dequant(t, w, n * kdim, ref), 0);
        for (size_t i = 0; i < n * kdim; i++)
            got[i] = -12345.0f;
        for (size_t g = 0; g < n * kdim / 32; g++) {
            size_t r, e0;
            float wv[32];
            gang_qb_group_of((int)t, w, kdim, g, &r, &e0, wv);
            assert_true(r < n && e0 + 32 <= kdim);
            memcpy(got + r * kdim + e0, wv, sizeof(wv));
        }
        for (size_t i = 0; i < n * kdim; i++)
            if (!same_value(got[i], ref[i]))
                fail_msg("%s element %zu: %a, reference %a", gang_kernels_wtype_name(t), i,
                         (double)got[i], (double)ref[i]);
        free(w), free(ref), free(got);
    }
}

/* The half conversion against the common one over all 65536 bit patterns. */
static void test_half_all_patterns(void **state)
{
    (void)state;
    for (uint32_t h = 0; h < 65536u; h++) {
        uint8_t p[2];
        put_u16(p, (uint16_t)h);
        assert_true(same_value(gang_qb_half(p), gang_f16_to_f32((uint16_t)h)));
    }
}

/* A type that is not a block type has no size (the kernels' launcher refuses it). */
static void test_sizes_of_other_types(void **state)
{
    (void)state;
    assert_int_equal(gang_qb_elems((int)GANG_KW_F32), 0);
    assert_int_equal(gang_qb_bytes((int)GANG_KW_I8), 0);
    assert_int_equal(gang_qb_elems(GANG_KW_LAST + 1), 0);
}

int main(void)
{
    bf_seed(0x9e3779b97f4a7c15ull);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_groups_equal_reference),
        cmocka_unit_test(test_half_all_patterns),
        cmocka_unit_test(test_gemv_lanes),
        cmocka_unit_test(test_group_of_covers_weight),
        cmocka_unit_test(test_sizes_of_other_types),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
