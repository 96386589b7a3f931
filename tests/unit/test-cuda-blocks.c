/*
 * unit-cuda-blocks: the block weights of GGUF files on the GPU (kernels/cuda/cuda-qmatmul.cu,
 * issue #27): gang_kernels_matmul for every block type at m = 1, 4, 8 (the GEMV that
 * dequantizes in registers) and 64 (dequantize to bf16, then cuBLASLt), and the embedding
 * of a block table, against the CPU reference: the weight dequantized on the host by
 * gang_kernels_block_dequant (kernels/weight-blocks.c) and the product in double.
 *
 * Tolerances, on |gpu - ref| per output, S = sum_i |x_i w_i| of that output:
 *   m <= 8    1e-5 S    f32 products of the exact dequantized values, summed 32 at a time
 *                       per lane, the lanes' sums over at most kdim / 1024 tiles and a
 *                       5-step warp tree: at most (32 + kdim / 1024 + 5) 2^-24 S, 2.4e-6 S
 *                       at kdim 1280; x stays f32 (no int8 rounding as on the CPU).
 *   m > 8     4.2e-3 S  x and w each rounded once to bf16 (2^-9 relative each, 2^-8 + 2^-18
 *                       for the product) plus cuBLASLt's f32 summation.
 *   embedding exact     the same dequantized values (gang_qb_group = the reference).
 *   matmul_glu  1e-5    the down projection of a [gate | up] product (the GEMV computing
 *               (rel.)  the gated unit as it stages x, m <= 8; glu then the bf16 path at
 *                       m = 12) against the GPU's glu + matmul on the same weight.
 * A prefill over a weight of more than one band (32 Mi elements) is checked at the bands'
 * edges. The GEMV launched as a programmatic dependent gives what it gives otherwise,
 * bit for bit (test_block_gemv_pdl).
 * Weights: random quants with random f16 scales, an all-zero block, a block of the
 * largest quants with a large scale (1024; and a negative min / dmin), a block with zero
 * scales. Without a GPU every case calls skip() after printing why.
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
#include "mlp-chain.h"

static gang_kernels *gpu; /* NULL without a GPU */

#define NEED_GPU()                                                                                 \
    do {                                                                                           \
        if (gpu == NULL) {                                                                         \
            print_message("[  SKIP    ] no GPU: gang_kernels_device_count() = %d; this test "      \
                          "needs an NVIDIA GPU and driver\n",                                      \
                          gang_kernels_device_count());                                            \
            skip();                                                                                \
        }                                                                                          \
    } while (0)

/* n rows of nb blocks of t with the edge cases of the file comment in rows 0 and 1. */
static uint8_t *make_blocks(gang_kernels_wtype t, size_t n, size_t nb, size_t bb)
{
    size_t at[2], nf = bf_f16_fields(t, at);
    uint8_t *w = malloc(n * nb * bb);

    assert_non_null(w);
    for (size_t i = 0; i < n * nb * bb; i++)
        w[i] = (uint8_t)bf_rnd();
    for (size_t i = 0; i < n * nb; i++)
        for (size_t f = 0; f < nf; f++)
            bf_put_f16(w + i * bb + at[f], bf_rndf(0.05f));
    memset(w, 0, bb);
    if (nb > 1) {
        memset(w + bb, 0xff, bb);
        for (size_t f = 0; f < nf; f++)
            bf_put_f16(w + bb + at[f], f == 0 ? 1024.0f : -1024.0f);
    }
    if (n > 1)
        for (size_t f = 0; f < nf; f++)
            bf_put_f16(w + nb * bb + at[f], 0.0f);
    return w;
}

static void *dev_copy(const void *host, size_t bytes)
{
    void *d = NULL;
    assert_int_equal(gang_kernels_alloc(gpu, bytes, &d), 0);
    assert_int_equal(gang_kernels_upload(gpu, d, host, bytes), 0);
    return d;
}

static void *dev_fetch(const void *dev, size_t bytes)
{
    void *h = malloc(bytes);
    assert_non_null(h);
    assert_int_equal(gang_kernels_download(gpu, h, dev, bytes), 0);
    return h;
}

/* One product on the GPU against the double reference on the dequantized weight. */
static void matmul_case(gang_kernels_wtype t, size_t m, size_t n, size_t kd)
{
    size_t e, bb;
    assert_true(gang_kernels_wtype_block(t, &e, &bb));
    size_t nb = kd / e, bytes = n * nb * bb;
    uint8_t *w = make_blocks(t, n, nb, bb);
    float *wd = malloc(n * kd * 4), *x = malloc(m * kd * 4), *got;
    double tol = m <= 8 ? 1e-5 : 4.2e-3;
    void *dw, *dx, *dy = NULL;
    gang_kernels_weight gw;

    assert_true(wd != NULL && x != NULL);
    assert_int_equal(gang_kernels_block_dequant(t, w, n * kd, wd), 0);
    for (size_t i = 0; i < m * kd; i++)
        x[i] = bf_rndf(2.0f);
    dw = dev_copy(w, bytes);
    dx = dev_copy(x, m * kd * 4);
    assert_int_equal(gang_kernels_alloc(gpu, m * n * 4, &dy), 0);
    gw = gang_kernels_weight_view(t, dw, n, kd);
    assert_int_equal(gang_kernels_matmul(gpu, m, n, kd, dx, &gw, dy), 0);
    got = dev_fetch(dy, m * n * 4);
    for (size_t r = 0; r < m; r++) {
        for (size_t o = 0; o < n; o++) {
            double s = 0.0, mag = 0.0;
            for (size_t i = 0; i < kd; i++) {
                double p = (double)x[r * kd + i] * (double)wd[o * kd + i];
                s += p;
                mag += fabs(p);
            }
            double err = fabs((double)got[r * n + o] - s);
            if (!(err <= tol * mag + 1e-30))
                fail_msg("%s m=%zu n=%zu k=%zu: y[%zu,%zu] = %.9g, reference %.9g (error %.3g > "
                         "%.3g)",
                         gang_kernels_wtype_name(t), m, n, kd, r, o, (double)got[r * n + o], s, err,
                         tol * mag);
        }
    }
    gang_kernels_free(gpu, dw);
    gang_kernels_free(gpu, dx);
    gang_kernels_free(gpu, dy);
    free(w), free(wd), free(x), free(got);
}

/* Every type at m = 1, 4, 8 and 64; 67 rows (not a multiple of the GEMV's 8 per thread
 * block) and 1; kdim 1280 (a tile of 1024 and a partial one) and, for the 32-element types,
 * 96 (three blocks). */
static void test_block_matmul(void **state)
{
    static const size_t ms[] = {1, 4, 8, 64}, ns[] = {67, 1};

    (void)state;
    NEED_GPU();
    for (size_t ti = 0; ti < BF_N_TYPES; ti++) {
        size_t e;
        assert_true(gang_kernels_wtype_block(bf_types[ti], &e, NULL));
        for (size_t a = 0; a < 4; a++)
            for (size_t b = 0; b < 2; b++) {
                matmul_case(bf_types[ti], ms[a], ns[b], 1280);
                if (e == 32)
                    matmul_case(bf_types[ti], ms[a], ns[b], 96);
            }
    }
}

/* gang_kernels_matmul_glu over block weights (SiLU and GELU) against glu + matmul. */
static void test_block_matmul_glu(void **state)
{
    static const size_t ms[] = {1, 8, 12};
    const size_t n = 67, kd = 256;

    (void)state;
    NEED_GPU();
    for (size_t ti = 0; ti < BF_N_TYPES; ti++)
        for (size_t a = 0; a < 3; a++)
            for (int gelu = 0; gelu < 2; gelu++) {
                gang_kernels_wtype t = bf_types[ti];
                size_t e, bb, m = ms[a];
                assert_true(gang_kernels_wtype_block(t, &e, &bb));
                uint8_t *w = make_blocks(t, n, kd / e, bb);
                float *gu = malloc(m * 2 * kd * 4), *got, *want;
                void *dw, *dgu, *dscr, *dy, *dy2;
                gang_kernels_weight gw;

                assert_non_null(gu);
                for (size_t i = 0; i < m * 2 * kd; i++)
                    gu[i] = bf_rndf(3.0f);
                dw = dev_copy(w, n * (kd / e) * bb), dgu = dev_copy(gu, m * 2 * kd * 4);
                assert_int_equal(gang_kernels_alloc(gpu, m * kd * 4, &dscr), 0);
                assert_int_equal(gang_kernels_alloc(gpu, m * n * 4, &dy), 0);
                assert_int_equal(gang_kernels_alloc(gpu, m * n * 4, &dy2), 0);
                gw = gang_kernels_weight_view(t, dw, n, kd);
                assert_int_equal(gang_kernels_matmul_glu(gpu, gelu, m, n, kd, dgu, &gw, dscr, dy),
                                 0);
                assert_int_equal(gang_kernels_glu(gpu, gelu, dgu, m, kd, dscr), 0);
                assert_int_equal(gang_kernels_matmul(gpu, m, n, kd, dscr, &gw, dy2), 0);
                got = dev_fetch(dy, m * n * 4), want = dev_fetch(dy2, m * n * 4);
                for (size_t i = 0; i < m * n; i++)
                    if (!(fabs((double)got[i] - (double)want[i]) <=
                          1e-5 * fmax(1.0, fabs((double)want[i]))))
                        fail_msg("matmul_glu %s m=%zu gelu %d: y[%zu] = %.9g, glu + matmul %.9g",
                                 gang_kernels_wtype_name(t), m, gelu, i, (double)got[i],
                                 (double)want[i]);
                gang_kernels_free(gpu, dw), gang_kernels_free(gpu, dgu);
                gang_kernels_free(gpu, dscr), gang_kernels_free(gpu, dy);
                gang_kernels_free(gpu, dy2);
                free(w), free(gu), free(got), free(want);
            }
}

/*
 * A prefill over a weight larger than one band (32 Mi elements, cuda-backend.c): kdim 1024
 * and 32805 rows, so two bands, the second of 37 rows; the outputs of the rows at the
 * bands' edges and a few others, every row of x, against the reference (4.2e-3 x S).
 */
static void test_block_matmul_bands(void **state)
{
    static const gang_kernels_wtype bt[] = {GANG_KW_Q8_0, GANG_KW_Q4_K};
    const size_t m = 16, kd = 1024, band = ((size_t)32 << 20) / kd, n = band + 37;
    const size_t rows[] = {0, 1, 4097, band - 1, band, band + 1, n - 1};

    (void)state;
    NEED_GPU();
    for (size_t ti = 0; ti < 2; ti++) {
        gang_kernels_wtype t = bt[ti];
        size_t e, bb;
        assert_true(gang_kernels_wtype_block(t, &e, &bb));
        size_t rb = kd / e * bb;
        uint8_t *w = make_blocks(t, n, kd / e, bb);
        float *x = malloc(m * kd * 4), *wd = malloc(kd * 4), *got;
        void *dw, *dx, *dy = NULL;
        gang_kernels_weight gw;

        assert_true(x != NULL && wd != NULL);
        for (size_t i = 0; i < m * kd; i++)
            x[i] = bf_rndf(2.0f);
        dw = dev_copy(w, n * rb);
        dx = dev_copy(x, m * kd * 4);
        assert_int_equal(gang_kernels_alloc(gpu, m * n * 4, &dy), 0);
        gw = gang_kernels_weight_view(t, dw, n, kd);
        assert_int_equal(gang_kernels_matmul(gpu, m, n, kd, dx, &gw, dy), 0);
        got = dev_fetch(dy, m * n * 4);
        for (size_t j = 0; j < sizeof(rows) / sizeof(rows[0]); j++) {
            size_t o = rows[j];
            assert_int_equal(gang_kernels_block_dequant(t, w + o * rb, kd, wd), 0);
            for (size_t r = 0; r < m; r++) {
                double s = 0.0, mag = 0.0;
                for (size_t i = 0; i < kd; i++) {
                    s += (double)x[r * kd + i] * (double)wd[i];
                    mag += fabs((double)x[r * kd + i] * (double)wd[i]);
                }
                if (!(fabs((double)got[r * n + o] - s) <= 4.2e-3 * mag + 1e-30))
                    fail_msg("%s bands: y[%zu,%zu] = %.9g, reference %.9g",
                             gang_kernels_wtype_name(t), r, o, (double)got[r * n + o], s);
            }
        }
        gang_kernels_free(gpu, dw);
        gang_kernels_free(gpu, dx);
        gang_kernels_free(gpu, dy);
        free(w), free(x), free(wd), free(got);
    }
}

/* The rows of a block table, equal to the dequantized rows; a bad id is the deferred
 * GANG_EINVAL of the next sync, as for the other tables. */
static void test_block_embedding(void **state)
{
    const size_t vocab = 50, dim = 512;
    int32_t ids[6] = {0, 49, 7, 7, 1, 25};

    (void)state;
    NEED_GPU();
    for (size_t ti = 0; ti < BF_N_TYPES; ti++) {
        gang_kernels_wtype t = bf_types[ti];
        size_t e, bb;
        assert_true(gang_kernels_wtype_block(t, &e, &bb));
        uint8_t *w = make_blocks(t, vocab, dim / e, bb);
        float *wd = malloc(vocab * dim * 4), *got;
        void *dt = dev_copy(w, vocab * (dim / e) * bb), *dout = NULL;
        int32_t *di = dev_copy(ids, sizeof(ids));
        gang_kernels_weight gw = gang_kernels_weight_view(t, dt, vocab, dim);

        assert_non_null(wd);
        assert_int_equal(gang_kernels_block_dequant(t, w, vocab * dim, wd), 0);
        assert_int_equal(gang_kernels_alloc(gpu, 6 * dim * 4, &dout), 0);
        assert_int_equal(gang_kernels_embedding_w(gpu, &gw, vocab, dim, di, 6, dout), 0);
        got = dev_fetch(dout, 6 * dim * 4);
        for (size_t i = 0; i < 6; i++)
            assert_memory_equal(got + i * dim, wd + (size_t)ids[i] * dim, dim * 4);
        ids[3] = (int32_t)vocab;
        assert_int_equal(gang_kernels_upload(gpu, di, ids, sizeof(ids)), 0);
        assert_int_equal(gang_kernels_embedding_w(gpu, &gw, vocab, dim, di, 6, dout), 0);
        assert_int_equal(gang_kernels_sync(gpu), GANG_EINVAL);
        assert_int_equal(gang_kernels_sync(gpu), 0);
        ids[3] = 7;
        gang_kernels_free(gpu, dt);
        gang_kernels_free(gpu, di);
        gang_kernels_free(gpu, dout);
        free(w), free(wd), free(got);
    }
}

/*
 * The block GEMV as a programmatic dependent launch (gang_kernels_options.pdl, Hopper): it
 * prefetches its row before the kernel it reads has ended and must wait for that kernel
 * before it stages x. A handle opened with pdl runs the chain above 8 times without a host
 * wait (mlp_chain) and must give, bit for bit, what the test's handle (no pdl) gives, for Q8_0 and
 * Q4_K at m = 1 and 5; a GEMV that read its input early would read the previous round's.
 * Below compute capability 9, and on the emulator, pdl changes nothing but the launch path,
 * and the results must still be equal. (make_blocks' block of the largest quants is
 * replaced by an ordinary one, so that 8 rounds stay finite.)
 */
static void test_block_gemv_pdl(void **state)
{
    static const gang_kernels_wtype ts[] = {GANG_KW_Q8_0, GANG_KW_Q4_K};
    const size_t hid = 1024, ffn = 768;
    gang_kernels_options o;
    gang_kernels *kp = NULL;

    (void)state;
    NEED_GPU();
    gang_kernels_options_init(&o);
    o.device = "cuda";
    o.pool_mb = 128;
    o.pdl = 1;
    assert_int_equal(gang_kernels_open_opts(&o, &kp), 0);
    for (size_t ti = 0; ti < 2; ti++) {
        size_t e, bb;
        assert_true(gang_kernels_wtype_block(ts[ti], &e, &bb));
        uint8_t *w1 = make_blocks(ts[ti], 2 * ffn, hid / e, bb);
        uint8_t *w2 = make_blocks(ts[ti], hid, ffn / e, bb);
        float *nw = malloc(hid * 4), *x0 = malloc(5 * hid * 4);

        assert_true(nw != NULL && x0 != NULL);
        memcpy(w1 + bb, w1 + 2 * bb, bb);
        memcpy(w2 + bb, w2 + 2 * bb, bb);
        for (size_t i = 0; i < hid; i++)
            nw[i] = 1.0f + bf_rndf(0.5f);
        for (size_t i = 0; i < 5 * hid; i++)
            x0[i] = bf_rndf(1.0f);
        for (size_t m = 1; m <= 5; m += 4) {
            float *xa, *xb;

            mlp_chain(gpu, ts[ti], m, hid, ffn, w1, w2, nw, x0, 8, &xa, NULL);
            mlp_chain(kp, ts[ti], m, hid, ffn, w1, w2, nw, x0, 8, &xb, NULL);

            for (size_t i = 0; i < m * hid; i++)
                if (memcmp(&xa[i], &xb[i], 4) != 0 || !isfinite(xa[i]))
                    fail_msg("%s m=%zu: x[%zu] with pdl %.9g, without %.9g",
                             gang_kernels_wtype_name(ts[ti]), m, i, (double)xb[i], (double)xa[i]);
            print_message("%s pdl chain m=%zu: 8 rounds equal bit for bit (x[0] %.6g)\n",
                          gang_kernels_wtype_name(ts[ti]), m, (double)xa[0]);
            free(xa), free(xb);
        }
        free(w1), free(w2), free(nw), free(x0);
    }
    gang_kernels_close(kp);
}

/* A kdim that is not a whole number of blocks is refused by the front on every backend. */
static void test_block_matmul_refusals(void **state)
{
    gang_kernels *cpu = NULL;
    float x[300] = {0}, y[4];
    uint8_t w[4 * 10 * 34] = {0};
    gang_kernels_weight hw = gang_kernels_weight_view(GANG_KW_Q8_0, w, 4, 300);

    (void)state;
    assert_int_equal(gang_kernels_open("cpu", &cpu), 0);
    assert_int_equal(gang_kernels_matmul(cpu, 1, 4, 300, x, &hw, y), GANG_EINVAL);
    gang_kernels_close(cpu);
    NEED_GPU();
    assert_int_equal(gang_kernels_matmul(gpu, 1, 4, 300, x, &hw, y), GANG_EINVAL);
}

static int setup(void **state)
{
    gang_kernels_options o;

    (void)state;
    if (gang_kernels_device_count() <= 0) {
        print_message("test-cuda-blocks: no GPU visible; GPU cases will be skipped\n");
        return 0;
    }
    gang_kernels_options_init(&o);
    o.device = "cuda";
    o.pool_mb = 1024;
    return gang_kernels_open_opts(&o, &gpu) == 0 ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    gang_kernels_close(gpu);
    return 0;
}

int main(void)
{
    bf_seed(0x853c49e6748fea9bull);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_block_matmul),          cmocka_unit_test(test_block_matmul_glu),
        cmocka_unit_test(test_block_matmul_bands),    cmocka_unit_test(test_block_embedding),
        cmocka_unit_test(test_block_matmul_refusals), cmocka_unit_test(test_block_gemv_pdl),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
