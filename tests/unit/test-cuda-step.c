/*
 * The decode step's CUDA operations (issue #24) against the CPU backend on the same
 * inputs (CTest unit-cuda-step; every case skips, visibly, without a GPU):
 *   upload_async            bytes arrive in stream order, no host sync counted, the
 *                           staging room reused after a sync
 *   scatter_i32             exact; an index out of range is GANG_EINVAL at the next sync
 *   attention_step          decodes and a prefill chunk of several sequences on a paged
 *                           pool (f32 and bf16), the KV rows appended: 1e-4 of the CPU's
 *                           (f32 online softmax and __expf against the CPU's double), the
 *                           pools' new rows exact; also at long positions, where the keys
 *                           are split across blocks and merged (flash-decoding); a
 *                           block table entry outside the pool is GANG_EINVAL at the
 *                           next sync
 *   sample                  greedy rows exact; seeded rows (top-k, top-p) the CPU's token
 *                           (parallel sums: a draw within rounding of a boundary could
 *                           differ, which these random rows never come near)
 *   split_cols3, glu        the concatenated q/k/v and gate/up GEMMs' helpers: the split
 *                           exact, the gated unit 1e-6 (expf / tanhf against the CPU's)
 *   split_qkv_rope,         the decode step's fusions, with and without biases: bit for bit
 *   add_rmsnorm             the GPU's unfused kernels in turn (split_cols3, add_rows, rope;
 *                           add, rmsnorm), and the CPU's within rope's 2e-5 and rmsnorm's
 *                           1e-5 (test-cuda's); a negative position reported at the next
 *                           sync; the front's refusals (also without a GPU, on the CPU,
 *                           where the fusions are the unfused kernels in turn, bit for bit)
 *   matmul_glu              the down projection of a [gate | up] product, bf16 / f16 / int8
 *                           / f32 weights, m = 1, 3, 8 (the GEMVs, which compute the gated
 *                           unit as they stage x) and 12 (glu, then the matmul), SiLU and
 *                           GELU: the GPU's glu + matmul within 1e-5 (the same formula,
 *                           compiled into another kernel), one launch counted
 *   matmul_to_glu           the gated unit of a [gate | up] weight's product in one
 *                           launch (the GEMV pairing gate and up rows: bf16 / f16 / int8, m
 *                           = 1, 3, 8, SiLU and GELU): the GPU's matmul + glu within 1e-5;
 *                           GANG_ENOSYS, nothing written or counted, for m = 12, f32
 *                           weights, int8 rows of 8, and on the CPU; the front's refusals
 *   matmul_fused            a product with its input norm, its residual add, the gated
 *                           unit of its input with the add, its norm with its output's
 *                           gated unit, or nothing (bf16 / f16 / int8 / f32, m = 1, 3, 8,
 *                           12, k = 8 and 576, and the 1B / 8B norms' rows of 2048 and
 *                           4096): the GPU's separate calls bit for bit (a residual add
 *                           in cuBLASLt's epilogue, half weights past 8 rows: 2 ulp), one
 *                           launch counted; GANG_ENOSYS, nothing written, where a gated output is
 *                           not fused and for f32 weights, and on the CPU; the front's
 *                           refusals
 *   graphs                  a captured add + scale does nothing until launched, each
 *                           launch runs it once; a sync while capturing is refused and
 *                           voids the graph
 *   retune                  new launch choices on the open handle: fuse_residual 0 turns
 *                           a fused norm off, half_gemv 0 a fused gated output of bf16
 *                           (GANG_ENOSYS), the defaults turn them on again, with PDL
 *                           either way; refused while capturing (the capture unharmed);
 *                           nothing to do on the CPU
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "ganglion/common.h"
#include "ganglion/kernels.h"

static gang_kernels *gpu, *cpu;

#define NEED_GPU()                                                                                 \
    do {                                                                                           \
        if (gpu == NULL) {                                                                         \
            print_message("[  SKIP    ] no GPU: gang_kernels_device_count() = %d; this test "      \
                          "needs an NVIDIA GPU and driver\n",                                      \
                          gang_kernels_device_count());                                            \
            skip();                                                                                \
        }                                                                                          \
    } while (0)

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static float rnd(void)
{
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(rng >> 11) / (double)(1ull << 53) * 2.0 - 1.0);
}

/* a[i] = scale x rnd() + offset for i < n. */
static void fill(float *a, size_t n, float scale, float offset)
{
    for (size_t i = 0; i < n; i++)
        a[i] = scale * rnd() + offset;
}

static void *dev_copy(const void *host, size_t bytes)
{
    void *d = NULL;

    assert_int_equal(gang_kernels_alloc(gpu, bytes, &d), 0);
    assert_int_equal(gang_kernels_upload(gpu, d, host, bytes), 0);
    return d;
}

static void fetch(void *host, const void *dev, size_t bytes)
{
    assert_int_equal(gang_kernels_download(gpu, host, dev, bytes), 0);
}

static int setup(void **state)
{
    gang_kernels_options o;

    (void)state;
    if (gang_kernels_open("cpu", &cpu) != 0)
        return -1;
    if (gang_kernels_device_count() == 0) {
        print_message("test-cuda-step: no GPU visible; GPU cases will be skipped\n");
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
    gang_kernels_close(cpu);
    return 0;
}

static void test_upload_async(void **state)
{
    int32_t a[1000], b[1000], got[1000];
    gang_kernels_counters c0, c1;
    int32_t *d = NULL;

    (void)state;
    NEED_GPU();
    for (int i = 0; i < 1000; i++)
        a[i] = i, b[i] = -i;
    assert_int_equal(gang_kernels_alloc(gpu, sizeof(a), (void **)&d), 0);
    assert_int_equal(gang_kernels_counters_get(gpu, &c0), 0);
    /* Many more bytes than the staging room: the later ones wait, all arrive in order. */
    for (int r = 0; r < 600; r++)
        assert_int_equal(gang_kernels_upload_async(gpu, d, r % 2 ? b : a, sizeof(a)), 0);
    a[0] = 777; /* the caller's buffer is free at once */
    assert_int_equal(gang_kernels_counters_get(gpu, &c1), 0);
    assert_int_equal(c1.host_syncs, c0.host_syncs);
    fetch(got, d, sizeof(got));
    assert_memory_equal(got, b, sizeof(b));
    gang_kernels_free(gpu, d);
}

static void test_scatter(void **state)
{
    int32_t tab[64], pairs[8] = {3, 30, 7, 70, 63, 630, 0, 5}, got[64];
    int32_t *dt, *dp;

    (void)state;
    NEED_GPU();
    for (int i = 0; i < 64; i++)
        tab[i] = i;
    dt = dev_copy(tab, sizeof(tab));
    dp = dev_copy(pairs, sizeof(pairs));
    assert_int_equal(gang_kernels_scatter_i32(gpu, dt, 64, dp, 4), 0);
    fetch(got, dt, sizeof(got));
    tab[3] = 30, tab[7] = 70, tab[63] = 630, tab[0] = 5;
    assert_memory_equal(got, tab, sizeof(tab));
    pairs[0] = 64; /* out of range: skipped, reported at the next sync */
    assert_int_equal(gang_kernels_upload(gpu, dp, pairs, sizeof(pairs)), 0);
    assert_int_equal(gang_kernels_scatter_i32(gpu, dt, 64, dp, 4), 0);
    assert_int_equal(gang_kernels_sync(gpu), GANG_EINVAL);
    assert_int_equal(gang_kernels_sync(gpu), 0);
    gang_kernels_free(gpu, dt), gang_kernels_free(gpu, dp);
}

/*
 * Three sequences in one step: a decode at position 9, a prefill chunk of 5 tokens at
 * positions 3..7, a decode at 20 with a window of 8; paged pool of 4-row blocks, the
 * earlier rows random. The GPU and the CPU run the same call on copies of the same pool.
 * longctx: the same shape at long positions (a decode at 700, a chunk at 254..258 across
 * a split's edge, a decode at 500 with the window 200 when window is set) on 16-row
 * blocks with max_keys 768, so the GPU splits the keys across blocks (flash-decoding:
 * chunks of 128 keys, empty ones past a position or before a window) and merges them.
 */
static void step_case_at(gang_dtype dt, size_t nh, size_t nkv, size_t hd, size_t window,
                         int longctx, int bad_block)
{
    enum { TOK = 7, MAXT = 3 * 48 };
    const int32_t pos_s[TOK] = {9, 3, 4, 5, 6, 7, 20},
                  pos_l[TOK] = {700, 254, 255, 256, 257, 258, 500};
    const size_t BS = longctx ? 16 : 4, MAXB = longctx ? 48 : 8, NB = 3 * MAXB;
    const int32_t rows[TOK] = {0,
                               (int32_t)MAXB,
                               (int32_t)MAXB,
                               (int32_t)MAXB,
                               (int32_t)MAXB,
                               (int32_t)MAXB,
                               (int32_t)(2 * MAXB)};
    const int32_t *pos = longctx ? pos_l : pos_s;
    int32_t tables[MAXT];
    size_t w = nkv * hd, es = gang_dtype_size(dt), pool = NB * BS * w * es;
    size_t qn = TOK * nh * hd, kn = TOK * w;
    float *q = malloc(qn * 4), *kn_h = malloc(kn * 4), *vn_h = malloc(kn * 4);
    /* pf holds the pool's elements in f32 (pool / es of them) before they are converted. */
    float *out_c = malloc(qn * 4), *out_g = malloc(qn * 4), *pf = malloc(pool / es * 4);
    unsigned char *kc = malloc(pool), *vc = malloc(pool), *kg = malloc(pool), *vg = malloc(pool);
    int32_t meta[2 * TOK];
    gang_kernels_step_kv kc_kv, kg_kv;
    void *dq, *dk, *dv, *dkc, *dvc, *dtab, *dmeta;

    assert_non_null(pf);
    for (size_t i = 0; i < NB; i++) /* a permutation: 7 is prime to 24 and to 144 */
        tables[i] = (int32_t)((i * 7 + 3) % NB);
    for (size_t i = 0; i < qn; i++)
        q[i] = rnd();
    for (size_t i = 0; i < kn; i++)
        kn_h[i] = rnd(), vn_h[i] = rnd();
    for (size_t i = 0; i < pool / es; i++)
        pf[i] = rnd();
    assert_int_equal(gang_kernels_convert(cpu, GANG_DTYPE_F32, pf, dt, kc, pool / es), 0);
    for (size_t i = 0; i < pool / es; i++)
        pf[i] = rnd();
    assert_int_equal(gang_kernels_convert(cpu, GANG_DTYPE_F32, pf, dt, vc, pool / es), 0);
    memcpy(meta, pos, TOK * sizeof(int32_t));
    memcpy(meta + TOK, rows, sizeof(rows));
    dq = dev_copy(q, qn * 4), dk = dev_copy(kn_h, kn * 4), dv = dev_copy(vn_h, kn * 4);
    dkc = dev_copy(kc, pool), dvc = dev_copy(vc, pool), dtab = dev_copy(tables, NB * 4);
    dmeta = dev_copy(meta, sizeof(meta));
    kc_kv = (gang_kernels_step_kv){kc, vc, tables, meta, meta + TOK, BS, NB, dt, 0};
    kg_kv = (gang_kernels_step_kv){
        dkc, dvc, dtab, dmeta, (int32_t *)dmeta + TOK, BS, NB, dt, longctx ? MAXB * BS : 0};
    assert_int_equal(
        gang_kernels_attention_step(cpu, &kc_kv, kn_h, vn_h, q, TOK, nh, nkv, hd, window, out_c),
        0);
    assert_int_equal(
        gang_kernels_attention_step(gpu, &kg_kv, dk, dv, dq, TOK, nh, nkv, hd, window, dq), 0);
    fetch(out_g, dq, qn * 4);
    fetch(kg, dkc, pool);
    fetch(vg, dvc, pool);
    assert_memory_equal(kg, kc, pool);
    assert_memory_equal(vg, vc, pool);
    for (size_t i = 0; i < qn; i++)
        if (!(fabs((double)out_g[i] - (double)out_c[i]) <= 1e-4 * fmax(1.0, fabs(out_c[i]))))
            fail_msg("%s nh %zu nkv %zu hd %zu window %zu%s: element %zu is %g, cpu %g",
                     gang_dtype_name(dt), nh, nkv, hd, window, longctx ? " long" : "", i,
                     (double)out_g[i], (double)out_c[i]);
    if (bad_block) {
        /* A block id outside the pool among token 6's keys (block 1 of its table: keys it
         * reads, not the one it appends to): the kernel leaves those keys out and the next
         * sync reports it, once. */
        tables[2 * MAXB + 1] = (int32_t)NB;
        assert_int_equal(gang_kernels_upload(gpu, dtab, tables, NB * 4), 0);
        assert_int_equal(gang_kernels_sync(gpu), 0);
        assert_int_equal(
            gang_kernels_attention_step(gpu, &kg_kv, dk, dv, dq, TOK, nh, nkv, hd, window, dq), 0);
        assert_int_equal(gang_kernels_sync(gpu), GANG_EINVAL);
        assert_int_equal(gang_kernels_sync(gpu), 0);
    }
    gang_kernels_free(gpu, dq), gang_kernels_free(gpu, dk), gang_kernels_free(gpu, dv);
    gang_kernels_free(gpu, dkc), gang_kernels_free(gpu, dvc), gang_kernels_free(gpu, dtab);
    gang_kernels_free(gpu, dmeta);
    free(q), free(kn_h), free(vn_h), free(out_c), free(out_g), free(pf);
    free(kc), free(vc), free(kg), free(vg);
}

static void step_case(gang_dtype dt, size_t nh, size_t nkv, size_t hd, size_t window)
{
    step_case_at(dt, nh, nkv, hd, window, 0, 0);
}

static void test_attention_step(void **state)
{
    (void)state;
    NEED_GPU();
    step_case(GANG_DTYPE_F32, 4, 2, 64, 0);
    step_case(GANG_DTYPE_BF16, 8, 2, 128, 0);
    step_case(GANG_DTYPE_F16, 6, 2, 64, 8);
    step_case(GANG_DTYPE_BF16, 32, 2, 128, 0); /* groups of 16: two passes over the keys */
    /* a key a warp (32 lanes: f32 rows of 128 and 256, the latter two loads a lane) */
    step_case(GANG_DTYPE_F32, 4, 2, 128, 0);
    step_case(GANG_DTYPE_F32, 4, 2, 256, 0);
    step_case(GANG_DTYPE_BF16, 4, 2, 256, 5);
    /* long contexts, few tokens: the keys split across blocks and merged */
    step_case_at(GANG_DTYPE_F32, 4, 2, 64, 0, 1, 0);
    step_case_at(GANG_DTYPE_BF16, 8, 2, 128, 200, 1, 0);
    step_case_at(GANG_DTYPE_F16, 32, 2, 128, 0, 1, 0);
    /* a block table entry outside the pool (short and split contexts) */
    step_case_at(GANG_DTYPE_BF16, 8, 2, 128, 0, 0, 1);
    step_case_at(GANG_DTYPE_F32, 4, 2, 64, 0, 1, 1);
}

static void test_sample(void **state)
{
    enum { ROWS = 48, COLS = 32000 };
    float *x = malloc((size_t)ROWS * COLS * 4);
    gang_kernels_sample_param p[ROWS];
    int32_t want[ROWS], got[ROWS];
    void *dx, *dp, *dout;

    (void)state;
    NEED_GPU();
    for (size_t i = 0; i < (size_t)ROWS * COLS; i++)
        x[i] = 6.0f * rnd();
    x[5 * COLS + 17] = NAN;
    for (uint32_t r = 0; r < ROWS; r++)
        p[r] = (gang_kernels_sample_param){.temperature = r % 4 == 0 ? 0.0f : 0.5f + 0.1f * (r % 7),
                                           .top_k = r % 3 == 0 ? 0 : 1 + r % 40,
                                           .top_p = r % 5 == 0 ? 1.0f : 0.6f + 0.05f * (r % 6),
                                           .seed = 77 + r,
                                           .position = 11 * r};
    dx = dev_copy(x, (size_t)ROWS * COLS * 4);
    dp = dev_copy(p, sizeof(p));
    assert_int_equal(gang_kernels_alloc(gpu, sizeof(got), &dout), 0);
    assert_int_equal(gang_kernels_sample(cpu, x, ROWS, COLS, p, want), 0);
    assert_int_equal(gang_kernels_sample(gpu, dx, ROWS, COLS, dp, dout), 0);
    fetch(got, dout, sizeof(got));
    for (uint32_t r = 0; r < ROWS; r++)
        if (got[r] != want[r])
            fail_msg("row %u (T %.2f, top_k %u, top_p %.2f): gpu drew %d, cpu %d", r,
                     (double)p[r].temperature, p[r].top_k, (double)p[r].top_p, got[r], want[r]);
    gang_kernels_free(gpu, dx), gang_kernels_free(gpu, dp), gang_kernels_free(gpu, dout);
    free(x);
}

/* |got - want| <= tol * max(1, |want|) for every element. */
static void near(const float *got, const float *want, size_t n, double tol, const char *what)
{
    for (size_t i = 0; i < n; i++)
        if (!(fabs((double)got[i] - (double)want[i]) <= tol * fmax(1.0, fabs((double)want[i]))))
            fail_msg("%s: element %zu is %.9g, reference %.9g", what, i, (double)got[i],
                     (double)want[i]);
}

static void test_split_glu(void **state)
{
    enum { ROWS = 5, W0 = 64, W1 = 16, W2 = 16, F = 96 };
    float x[ROWS * (W0 + W1 + W2)], o[3][ROWS * W0], g[ROWS * 2 * F], want[ROWS * F];
    float got[ROWS * F], part[ROWS * W0];
    void *dx, *d0, *d1, *d2, *dg, *dout;
    const size_t w[3] = {W0, W1, W2};

    (void)state;
    NEED_GPU();
    for (size_t i = 0; i < sizeof(x) / 4; i++)
        x[i] = rnd();
    for (size_t i = 0; i < sizeof(g) / 4; i++)
        g[i] = 4.0f * rnd();
    dx = dev_copy(x, sizeof(x)), dg = dev_copy(g, sizeof(g));
    assert_int_equal(gang_kernels_alloc(gpu, sizeof(o[0]), &d0), 0);
    assert_int_equal(gang_kernels_alloc(gpu, sizeof(o[0]), &d1), 0);
    assert_int_equal(gang_kernels_alloc(gpu, sizeof(o[0]), &d2), 0);
    assert_int_equal(gang_kernels_alloc(gpu, sizeof(got), &dout), 0);
    assert_int_equal(gang_kernels_split_cols3(cpu, x, ROWS, W0, W1, W2, o[0], o[1], o[2]), 0);
    assert_int_equal(gang_kernels_split_cols3(gpu, dx, ROWS, W0, W1, W2, d0, d1, d2), 0);
    for (int p = 0; p < 3; p++) {
        fetch(part, p == 0 ? d0 : p == 1 ? d1 : d2, ROWS * w[p] * 4);
        assert_memory_equal(part, o[p], ROWS * w[p] * 4);
    }
    for (int gelu = 0; gelu < 2; gelu++) {
        assert_int_equal(gang_kernels_glu(cpu, gelu, g, ROWS, F, want), 0);
        assert_int_equal(gang_kernels_glu(gpu, gelu, dg, ROWS, F, dout), 0);
        fetch(got, dout, sizeof(got));
        near(got, want, ROWS * F, 1e-6,
             gelu ? "glu (gelu 1) against the cpu" : "glu (gelu 0) against the cpu");
    }
    gang_kernels_free(gpu, dx), gang_kernels_free(gpu, dg), gang_kernels_free(gpu, d0);
    gang_kernels_free(gpu, d1), gang_kernels_free(gpu, d2), gang_kernels_free(gpu, dout);
}

/* The qkv rope arguments over x [ROWS, (H + 2 KV) HD] with biases b (or none). */
enum { FR = 3, FH = 4, FKV = 2, FHD = 16, FW = (FH + 2 * FKV) * FHD };

static gang_kernels_qkv_rope qkv_args(const float *x, const float *const b[3], const int32_t *pos,
                                      const float *inv, float *q, float *kk, float *v)
{
    return (gang_kernels_qkv_rope){.x = x,
                                   .rows = FR,
                                   .n_heads = FH,
                                   .n_kv_heads = FKV,
                                   .head_dim = FHD,
                                   .bq = b != NULL ? b[0] : NULL,
                                   .bk = b != NULL ? b[1] : NULL,
                                   .bv = b != NULL ? b[2] : NULL,
                                   .positions = pos,
                                   .inv_freq = inv,
                                   .scale = 1.25f,
                                   .q = q,
                                   .k = kk,
                                   .v = v};
}

/* The unfused kernels in turn on handle h (what split_qkv_rope must equal). */
static void qkv_unfused(gang_kernels *h, const gang_kernels_qkv_rope *a)
{
    size_t qc = FH * FHD, kc = FKV * FHD;

    assert_int_equal(gang_kernels_split_cols3(h, a->x, FR, qc, kc, kc, a->q, a->k, a->v), 0);
    if (a->bq != NULL) {
        assert_int_equal(gang_kernels_add_rows(h, a->q, a->bq, FR, qc), 0);
        assert_int_equal(gang_kernels_add_rows(h, a->k, a->bk, FR, kc), 0);
        assert_int_equal(gang_kernels_add_rows(h, a->v, a->bv, FR, kc), 0);
    }
    assert_int_equal(gang_kernels_rope(h, a->q, a->positions, FR, FH, FHD, a->inv_freq, a->scale),
                     0);
    assert_int_equal(gang_kernels_rope(h, a->k, a->positions, FR, FKV, FHD, a->inv_freq, a->scale),
                     0);
}

static float fx_in[FR * FW], fx_b[3][FH * FHD], fx_inv[FHD / 2];
static int32_t fx_pos[FR] = {0, 7, 4099};

static void fusion_inputs(void)
{
    for (size_t i = 0; i < FR * FW; i++)
        fx_in[i] = rnd();
    for (int p = 0; p < 3; p++)
        for (size_t i = 0; i < FH * FHD; i++)
            fx_b[p][i] = rnd();
    for (size_t i = 0; i < FHD / 2; i++)
        fx_inv[i] = (float)(1.0 / pow(10000.0, (double)(2 * i) / FHD));
}

/* On the CPU (no GPU needed): the front's refusals and the fusions equal to the unfused
 * kernels in turn, bit for bit. */
static void test_fusions_cpu(void **state)
{
    float q[2][FR * FH * FHD], kk[2][FR * FKV * FHD], v[2][FR * FKV * FHD];
    float x[2][FR * 40], y[FR * 40], w[40], out[2][FR * 40];
    const float *b[3] = {fx_b[0], fx_b[1], fx_b[2]};
    gang_kernels_qkv_rope a;

    (void)state;
    fusion_inputs();
    for (int with_b = 0; with_b < 2; with_b++) {
        a = qkv_args(fx_in, with_b ? b : NULL, fx_pos, fx_inv, q[0], kk[0], v[0]);
        assert_int_equal(gang_kernels_split_qkv_rope(cpu, &a), 0);
        a = qkv_args(fx_in, with_b ? b : NULL, fx_pos, fx_inv, q[1], kk[1], v[1]);
        qkv_unfused(cpu, &a);
        assert_memory_equal(q[0], q[1], sizeof(q[0]));
        assert_memory_equal(kk[0], kk[1], sizeof(kk[0]));
        assert_memory_equal(v[0], v[1], sizeof(v[0]));
    }
    assert_int_equal(gang_kernels_split_qkv_rope(cpu, NULL), GANG_EINVAL);
    a.head_dim = 15;
    assert_int_equal(gang_kernels_split_qkv_rope(cpu, &a), GANG_EINVAL);
    a.head_dim = FHD, a.scale = 0.0f;
    assert_int_equal(gang_kernels_split_qkv_rope(cpu, &a), GANG_EINVAL);
    a.scale = 1.0f, a.v = NULL;
    assert_int_equal(gang_kernels_split_qkv_rope(cpu, &a), GANG_EINVAL);
    a.v = v[0], a.rows = SIZE_MAX / 4;
    assert_int_equal(gang_kernels_split_qkv_rope(cpu, &a), GANG_ERANGE);
    a.rows = FR, a.n_kv_heads = SIZE_MAX / 2;
    assert_int_equal(gang_kernels_split_qkv_rope(cpu, &a), GANG_ERANGE);

    for (size_t i = 0; i < FR * 40; i++)
        x[0][i] = x[1][i] = 3.0f * rnd(), y[i] = rnd();
    for (size_t i = 0; i < 40; i++)
        w[i] = 1.0f + rnd();
    assert_int_equal(gang_kernels_add_rmsnorm(cpu, x[0], y, w, 1e-6f, FR, 40, out[0]), 0);
    assert_int_equal(gang_kernels_add(cpu, x[1], y, FR * 40), 0);
    assert_int_equal(gang_kernels_rmsnorm(cpu, x[1], w, 1e-6f, FR, 40, out[1]), 0);
    assert_memory_equal(x[0], x[1], sizeof(x[0]));
    assert_memory_equal(out[0], out[1], sizeof(out[0]));
    assert_int_equal(gang_kernels_add_rmsnorm(cpu, x[0], y, w, -1.0f, FR, 40, out[0]), GANG_EINVAL);
    assert_int_equal(gang_kernels_add_rmsnorm(cpu, x[0], y, w, NAN, FR, 40, out[0]), GANG_EINVAL);
    assert_int_equal(gang_kernels_add_rmsnorm(cpu, x[0], NULL, w, 0.0f, FR, 40, out[0]),
                     GANG_EINVAL);
    assert_int_equal(gang_kernels_add_rmsnorm(cpu, x[0], y, w, 0.0f, 0, 40, out[0]), GANG_EINVAL);
    assert_int_equal(gang_kernels_add_rmsnorm(cpu, x[0], y, w, 0.0f, SIZE_MAX / 2, 40, out[0]),
                     GANG_ERANGE);
}

static void test_fusions(void **state)
{
    enum { QN = FR * FH * FHD, KN = FR * FKV * FHD, D = 3000 };
    float q[2][QN], kk[2][KN], v[2][KN], cq[QN], ck[KN], cv[KN];
    const float *cb[3] = {fx_b[0], fx_b[1], fx_b[2]};
    float *dq[2], *dk[2], *dv[2], *db[3], *dx, *dinv;
    int32_t *dpos, bad[FR];
    gang_kernels_qkv_rope a;

    (void)state;
    NEED_GPU();
    fusion_inputs();
    dx = dev_copy(fx_in, sizeof(fx_in)), dinv = dev_copy(fx_inv, sizeof(fx_inv));
    dpos = dev_copy(fx_pos, sizeof(fx_pos));
    for (int p = 0; p < 3; p++)
        db[p] = dev_copy(fx_b[p], sizeof(fx_b[p]));
    for (int i = 0; i < 2; i++) {
        assert_int_equal(gang_kernels_alloc(gpu, sizeof(q[0]), (void **)&dq[i]), 0);
        assert_int_equal(gang_kernels_alloc(gpu, sizeof(kk[0]), (void **)&dk[i]), 0);
        assert_int_equal(gang_kernels_alloc(gpu, sizeof(v[0]), (void **)&dv[i]), 0);
    }
    for (int with_b = 0; with_b < 2; with_b++) {
        const float *const *bb = with_b ? (const float *const *)db : NULL;

        a = qkv_args(dx, bb, dpos, dinv, dq[0], dk[0], dv[0]);
        assert_int_equal(gang_kernels_split_qkv_rope(gpu, &a), 0);
        a = qkv_args(dx, bb, dpos, dinv, dq[1], dk[1], dv[1]);
        qkv_unfused(gpu, &a);
        for (int i = 0; i < 2; i++) {
            fetch(q[i], dq[i], sizeof(q[0]));
            fetch(kk[i], dk[i], sizeof(kk[0]));
            fetch(v[i], dv[i], sizeof(v[0]));
        }
        assert_memory_equal(q[0], q[1], sizeof(q[0]));
        assert_memory_equal(kk[0], kk[1], sizeof(kk[0]));
        assert_memory_equal(v[0], v[1], sizeof(v[0]));
        a = qkv_args(fx_in, with_b ? cb : NULL, fx_pos, fx_inv, cq, ck, cv);
        assert_int_equal(gang_kernels_split_qkv_rope(cpu, &a), 0);
        near(q[0], cq, QN, 2e-5, "split_qkv_rope q");
        near(kk[0], ck, KN, 2e-5, "split_qkv_rope k");
        near(v[0], cv, KN, 0.0, "split_qkv_rope v");
    }
    /* A negative position: reported by the next sync, once. */
    memcpy(bad, fx_pos, sizeof(bad));
    bad[1] = -3;
    assert_int_equal(gang_kernels_upload(gpu, dpos, bad, sizeof(bad)), 0);
    a = qkv_args(dx, NULL, dpos, dinv, dq[0], dk[0], dv[0]);
    assert_int_equal(gang_kernels_split_qkv_rope(gpu, &a), 0);
    assert_int_equal(gang_kernels_sync(gpu), GANG_EINVAL);
    assert_int_equal(gang_kernels_sync(gpu), 0);

    /* add_rmsnorm over rows longer than a block's threads, and y == x (doubling). */
    float *x = malloc(2 * FR * D * 4), *y = malloc(FR * D * 4), *w = malloc(D * 4);
    float *got = malloc(2 * FR * D * 4), *want = malloc(2 * FR * D * 4);
    float *dxs[2], *dy, *dw, *douts[2];

    assert_non_null(x), assert_non_null(y), assert_non_null(w), assert_non_null(got);
    assert_non_null(want);
    for (size_t i = 0; i < FR * D; i++)
        x[i] = 4.0f * rnd(), y[i] = rnd();
    for (size_t i = 0; i < D; i++)
        w[i] = 1.0f + rnd();
    for (int self = 0; self < 2; self++) {
        for (int i = 0; i < 2; i++) {
            dxs[i] = dev_copy(x, FR * D * 4);
            assert_int_equal(gang_kernels_alloc(gpu, FR * D * 4, (void **)&douts[i]), 0);
        }
        dy = self ? dxs[0] : dev_copy(y, FR * D * 4), dw = dev_copy(w, D * 4);
        assert_int_equal(gang_kernels_add_rmsnorm(gpu, dxs[0], dy, dw, 1e-5f, FR, D, douts[0]), 0);
        assert_int_equal(gang_kernels_add(gpu, dxs[1], self ? dxs[1] : dy, FR * D), 0);
        assert_int_equal(gang_kernels_rmsnorm(gpu, dxs[1], dw, 1e-5f, FR, D, douts[1]), 0);
        for (int i = 0; i < 2; i++) {
            fetch(got + i * FR * D, dxs[i], FR * D * 4);
            fetch(want + i * FR * D, douts[i], FR * D * 4);
        }
        assert_memory_equal(got, got + FR * D, FR * D * 4);   /* x after the add */
        assert_memory_equal(want, want + FR * D, FR * D * 4); /* the norm */
        memcpy(got + FR * D, x, FR * D * 4);
        assert_int_equal(gang_kernels_add_rmsnorm(cpu, got + FR * D, self ? got + FR * D : y, w,
                                                  1e-5f, FR, D, want + FR * D),
                         0);
        near(want, want + FR * D, FR * D, 1e-5, self ? "add_rmsnorm (y = x)" : "add_rmsnorm");
        if (!self)
            gang_kernels_free(gpu, dy);
        for (int i = 0; i < 2; i++)
            gang_kernels_free(gpu, dxs[i]), gang_kernels_free(gpu, douts[i]);
        gang_kernels_free(gpu, dw);
    }
    free(x), free(y), free(w), free(got), free(want);
    for (int i = 0; i < 2; i++)
        gang_kernels_free(gpu, dq[i]), gang_kernels_free(gpu, dk[i]), gang_kernels_free(gpu, dv[i]);
    for (int p = 0; p < 3; p++)
        gang_kernels_free(gpu, db[p]);
    gang_kernels_free(gpu, dx), gang_kernels_free(gpu, dinv), gang_kernels_free(gpu, dpos);
}

/* One matmul_glu case on the GPU against its glu + matmul, and the launch it counts. */
static void matmul_glu_case(gang_kernels_wtype t, size_t m, size_t n, size_t kd, int gelu)
{
    size_t wbytes = gang_kernels_weight_bytes(t, n, kd);
    float *wf = malloc(n * kd * 4), *gu = malloc(m * 2 * kd * 4), *got = malloc(m * n * 4);
    float *want = malloc(m * n * 4);
    void *blob = malloc(wbytes), *dw, *dgu, *dscr, *dy, *dy2, *dscr2;
    gang_kernels_counters c0, c1;
    gang_kernels_weight v;
    char what[128];

    assert_non_null(wf), assert_non_null(gu), assert_non_null(got), assert_non_null(want);
    assert_non_null(blob);
    fill(wf, n * kd, 1.0f, 0.0f), fill(gu, m * 2 * kd, 3.0f, 0.0f);
    assert_int_equal(gang_kernels_weight_pack(t, wf, n, kd, blob), 0);
    dw = dev_copy(blob, wbytes), dgu = dev_copy(gu, m * 2 * kd * 4);
    assert_int_equal(gang_kernels_alloc(gpu, m * kd * 4, &dscr), 0);
    assert_int_equal(gang_kernels_alloc(gpu, m * kd * 4, &dscr2), 0);
    assert_int_equal(gang_kernels_alloc(gpu, m * n * 4, &dy), 0);
    assert_int_equal(gang_kernels_alloc(gpu, m * n * 4, &dy2), 0);
    v = gang_kernels_weight_view(t, dw, n, kd);
    assert_int_equal(gang_kernels_counters_get(gpu, &c0), 0);
    assert_int_equal(gang_kernels_matmul_glu(gpu, gelu, m, n, kd, dgu, &v, dscr, dy), 0);
    assert_int_equal(gang_kernels_counters_get(gpu, &c1), 0);
    assert_int_equal(c1.launches - c0.launches, t == GANG_KW_F32 ? 2 : 1);
    assert_int_equal(gang_kernels_glu(gpu, gelu, dgu, m, kd, dscr2), 0);
    assert_int_equal(gang_kernels_matmul(gpu, m, n, kd, dscr2, &v, dy2), 0);
    fetch(got, dy, m * n * 4);
    fetch(want, dy2, m * n * 4);
    snprintf(what, sizeof(what),
             "matmul_glu (%s, m %zu, n %zu, k %zu, gelu %d) against glu + matmul",
             gang_kernels_wtype_name(t), m, n, kd, gelu);
    near(got, want, m * n, 1e-5, what);
    gang_kernels_free(gpu, dw), gang_kernels_free(gpu, dgu), gang_kernels_free(gpu, dscr);
    gang_kernels_free(gpu, dscr2), gang_kernels_free(gpu, dy), gang_kernels_free(gpu, dy2);
    free(wf), free(gu), free(got), free(want), free(blob);
}

/* fn(t, m, 67, k, gelu) over the [gate | up] tests' cases: bf16 / f16 / int8 / f32
 * weights, m = 1, 3, 8 (the GEMVs) and 12, k = 8 and 576, SiLU and GELU. */
static void glu_sweep(void (*fn)(gang_kernels_wtype t, size_t m, size_t n, size_t kd, int gelu))
{
    static const size_t ms[] = {1, 3, 8, 12}, ks[] = {8, 576};
    static const gang_kernels_wtype ts[] = {GANG_KW_BF16, GANG_KW_F16, GANG_KW_I8, GANG_KW_F32};

    for (size_t t = 0; t < 4; t++)
        for (size_t a = 0; a < 4; a++)
            for (size_t b = 0; b < 2; b++)
                for (int gelu = 0; gelu < 2; gelu++)
                    fn(ts[t], ms[a], 67, ks[b], gelu);
}

static void test_matmul_glu(void **state)
{
    float gu[2 * 2 * 16], w[3 * 16], y[2][2 * 3], scr[2 * 16];
    gang_kernels_counters c0, c1;
    gang_kernels_weight v;

    (void)state;
    /* The CPU has no fused kernel: the front's glu + matmul, two launches, bit for bit. */
    fill(gu, sizeof(gu) / 4, 1.0f, 0.0f), fill(w, sizeof(w) / 4, 1.0f, 0.0f);
    v = gang_kernels_weight_view(GANG_KW_F32, w, 3, 16);
    assert_int_equal(gang_kernels_counters_get(cpu, &c0), 0);
    assert_int_equal(gang_kernels_matmul_glu(cpu, 1, 2, 3, 16, gu, &v, scr, y[0]), 0);
    assert_int_equal(gang_kernels_counters_get(cpu, &c1), 0);
    assert_int_equal(c1.launches - c0.launches, 2);
    assert_int_equal(gang_kernels_glu(cpu, 1, gu, 2, 16, scr), 0);
    assert_int_equal(gang_kernels_matmul(cpu, 2, 3, 16, scr, &v, y[1]), 0);
    assert_memory_equal(y[0], y[1], sizeof(y[0]));
    assert_int_equal(gang_kernels_matmul_glu(cpu, 0, 2, 3, 16, gu, &v, NULL, y[0]), GANG_EINVAL);
    assert_int_equal(gang_kernels_matmul_glu(cpu, 0, 0, 3, 16, gu, &v, scr, y[0]), GANG_EINVAL);
    assert_int_equal(gang_kernels_matmul_glu(cpu, 0, 2, 3, 16, gu, NULL, scr, y[0]), GANG_EINVAL);
    assert_int_equal(gang_kernels_matmul_glu(cpu, 0, 2, 3, (size_t)1 << 40, gu, &v, scr, y[0]),
                     GANG_ERANGE);
    NEED_GPU();
    glu_sweep(matmul_glu_case);
}

/* One matmul_to_glu case on the GPU: against the GPU's matmul + glu where the GEMV takes
 * it (one launch counted), else GANG_ENOSYS with y untouched and nothing counted. */
static void matmul_to_glu_case(gang_kernels_wtype t, size_t m, size_t ffn, size_t kd, int gelu)
{
    const size_t n = 2 * ffn, wbytes = gang_kernels_weight_bytes(t, n, kd);
    const int fused = m <= 8 && t != GANG_KW_F32 && !(t == GANG_KW_I8 && kd % 16 != 0);
    float *wf = malloc(n * kd * 4), *x = malloc(m * kd * 4), *got = malloc(m * ffn * 4);
    float *want = malloc(m * ffn * 4);
    void *blob = malloc(wbytes), *dw, *dx, *dy, *dgu, *dy2;
    gang_kernels_counters c0, c1;
    gang_kernels_weight v;
    char what[128];

    assert_non_null(wf), assert_non_null(x), assert_non_null(got), assert_non_null(want);
    assert_non_null(blob);
    fill(wf, n * kd, 1.0f, 0.0f), fill(x, m * kd, 3.0f, 0.0f);
    fill(want, m * ffn, 0.0f, -7.0f); /* y's contents where nothing may be written */
    assert_int_equal(gang_kernels_weight_pack(t, wf, n, kd, blob), 0);
    dw = dev_copy(blob, wbytes), dx = dev_copy(x, m * kd * 4), dy = dev_copy(want, m * ffn * 4);
    assert_int_equal(gang_kernels_alloc(gpu, m * n * 4, &dgu), 0);
    assert_int_equal(gang_kernels_alloc(gpu, m * ffn * 4, &dy2), 0);
    v = gang_kernels_weight_view(t, dw, n, kd);
    snprintf(what, sizeof(what), "matmul_to_glu (%s, m %zu, ffn %zu, k %zu, gelu %d)",
             gang_kernels_wtype_name(t), m, ffn, kd, gelu);
    assert_int_equal(gang_kernels_counters_get(gpu, &c0), 0);
    assert_int_equal(gang_kernels_matmul_to_glu(gpu, gelu, m, ffn, kd, dx, &v, dy),
                     fused ? 0 : GANG_ENOSYS);
    assert_int_equal(gang_kernels_counters_get(gpu, &c1), 0);
    assert_int_equal(c1.launches - c0.launches, fused ? 1 : 0);
    fetch(got, dy, m * ffn * 4);
    if (!fused) {
        near(got, want, m * ffn, 0.0, what); /* untouched */
    } else {
        assert_int_equal(gang_kernels_matmul(gpu, m, n, kd, dx, &v, dgu), 0);
        assert_int_equal(gang_kernels_glu(gpu, gelu, dgu, m, ffn, dy2), 0);
        fetch(want, dy2, m * ffn * 4);
        near(got, want, m * ffn, 1e-5, what);
    }
    gang_kernels_free(gpu, dw), gang_kernels_free(gpu, dx), gang_kernels_free(gpu, dy);
    gang_kernels_free(gpu, dgu), gang_kernels_free(gpu, dy2);
    free(wf), free(x), free(got), free(want), free(blob);
}

static void test_matmul_to_glu(void **state)
{
    float x[2 * 16], w[2 * 3 * 16], y[2 * 3];
    gang_kernels_counters c0, c1;
    gang_kernels_weight v;

    (void)state;
    /* The CPU has no such kernel: GANG_ENOSYS, nothing written or counted. */
    fill(x, sizeof(x) / 4, 1.0f, 0.0f), fill(w, sizeof(w) / 4, 1.0f, 0.0f);
    fill(y, sizeof(y) / 4, 0.0f, -7.0f);
    v = gang_kernels_weight_view(GANG_KW_F32, w, 6, 16);
    assert_int_equal(gang_kernels_counters_get(cpu, &c0), 0);
    assert_int_equal(gang_kernels_matmul_to_glu(cpu, 0, 2, 3, 16, x, &v, y), GANG_ENOSYS);
    assert_int_equal(gang_kernels_counters_get(cpu, &c1), 0);
    assert_int_equal(c1.launches, c0.launches);
    for (size_t i = 0; i < sizeof(y) / 4; i++)
        assert_true(y[i] == -7.0f);
    assert_int_equal(gang_kernels_matmul_to_glu(cpu, 0, 2, 3, 16, NULL, &v, y), GANG_EINVAL);
    assert_int_equal(gang_kernels_matmul_to_glu(cpu, 0, 2, 0, 16, x, &v, y), GANG_EINVAL);
    assert_int_equal(gang_kernels_matmul_to_glu(cpu, 0, 2, 3, 16, x, NULL, y), GANG_EINVAL);
    assert_int_equal(gang_kernels_matmul_to_glu(cpu, 0, 2, 3, 16, x, &v, NULL), GANG_EINVAL);
    assert_int_equal(gang_kernels_matmul_to_glu(cpu, 0, 2, SIZE_MAX / 2 + 1, 16, x, &v, y),
                     GANG_ERANGE);
    assert_int_equal(gang_kernels_matmul_to_glu(cpu, 0, 2, (size_t)1 << 31, 16, x, &v, y),
                     GANG_ERANGE);
    NEED_GPU();
    glu_sweep(matmul_to_glu_case);
    matmul_to_glu_case(GANG_KW_BF16, 1, 4, 576, 0); /* one block, every index valid */
}

/* The steps of a matmul_fused case (fused_case). */
enum { FUSE_NORM = 1, FUSE_ACC = 2, FUSE_GLU_IN = 4, FUSE_GLU_OUT = 8 };

/*
 * One gang_kernels_matmul_fused case on the GPU against the GPU's separate calls (rmsnorm
 * or glu into a scratch, matmul, glu, add), bit for bit: where the GEMV takes it (m <= 8,
 * a norm's rows in its tile) the same products in the same order (the norm's double sum
 * aside, which moves no f32 scale on these rows), elsewhere the same kernels. One launch
 * counted; glu_out where the GEMV does not fuse it (m > 8, f32, int8 rows of 8): nothing
 * done, GANG_ENOSYS, as f32 weights anywhere (the front's).
 */
static void matmul_fused_case(gang_kernels_wtype t, size_t m, size_t n, size_t kd, int steps)
{
    const int gelu = (int)(m % 2), glu_out = (steps & FUSE_GLU_OUT) != 0;
    const size_t rows = glu_out ? 2 * n : n, xk = steps & FUSE_GLU_IN ? 2 * kd : kd;
    const size_t wbytes = gang_kernels_weight_bytes(t, rows, kd);
    const int done =
        t != GANG_KW_F32 && (!glu_out || (m <= 8 && !(t == GANG_KW_I8 && kd % 16 != 0)));
    const gang_kernels_fusion f = {.norm = NULL,
                                   .eps = 1e-5f,
                                   .glu_in = steps & FUSE_GLU_IN ? gelu : -1,
                                   .glu_out = glu_out ? gelu : -1,
                                   .accumulate = (steps & FUSE_ACC) != 0};
    gang_kernels_fusion fn = f;
    float *wf = malloc(rows * kd * 4), *x = malloc(m * xk * 4), *g = malloc(kd * 4);
    float *y0 = malloc(m * n * 4), *got = malloc(m * n * 4), *want = malloc(m * n * 4);
    void *blob = malloc(wbytes), *dw, *dx, *dg, *dy, *dscr, *dprod, *dy2, *dscr2;
    gang_kernels_counters c0, c1;
    gang_kernels_weight v;
    char what[160];
    int rc;

    assert_non_null(wf), assert_non_null(x), assert_non_null(g), assert_non_null(y0);
    assert_non_null(got), assert_non_null(want), assert_non_null(blob);
    fill(wf, rows * kd, 1.0f, 0.0f), fill(x, m * xk, 3.0f, 0.0f);
    fill(g, kd, 0.5f, 1.0f), fill(y0, m * n, 1.0f, 0.0f);
    assert_int_equal(gang_kernels_weight_pack(t, wf, rows, kd, blob), 0);
    dw = dev_copy(blob, wbytes), dx = dev_copy(x, m * xk * 4), dg = dev_copy(g, kd * 4);
    dy = dev_copy(y0, m * n * 4), dy2 = dev_copy(y0, m * n * 4);
    assert_int_equal(gang_kernels_alloc(gpu, m * kd * 4, &dscr), 0);
    assert_int_equal(gang_kernels_alloc(gpu, m * kd * 4, &dscr2), 0);
    assert_int_equal(gang_kernels_alloc(gpu, m * rows * 4, &dprod), 0);
    v = gang_kernels_weight_view(t, dw, rows, kd);
    if (steps & FUSE_NORM)
        fn.norm = dg;
    snprintf(what, sizeof(what), "matmul_fused (%s, m %zu, n %zu, k %zu, steps %d, gelu %d)",
             gang_kernels_wtype_name(t), m, n, kd, steps, gelu);
    assert_int_equal(gang_kernels_counters_get(gpu, &c0), 0);
    rc = gang_kernels_matmul_fused(gpu, m, n, kd, dx, &v, &fn, dscr, dy);
    if (rc != (done ? 0 : GANG_ENOSYS))
        fail_msg("%s: %s", what, gang_err_name(rc));
    assert_int_equal(gang_kernels_counters_get(gpu, &c1), 0);
    assert_int_equal(c1.launches - c0.launches, done ? 1 : 0);
    fetch(got, dy, m * n * 4);
    if (!done) {
        assert_memory_equal(got, y0, m * n * 4); /* untouched */
    } else {
        const float *in = dx;

        /* the separate calls, into dy2 (holding y0 too) */
        if (steps & FUSE_NORM) {
            assert_int_equal(gang_kernels_rmsnorm(gpu, dx, dg, f.eps, m, kd, dscr2), 0);
            in = dscr2;
        }
        if (steps & FUSE_GLU_IN)
            assert_int_equal(gang_kernels_matmul_glu(gpu, gelu, m, n, kd, dx, &v, dscr2, dprod), 0);
        else if (glu_out)
            assert_int_equal(gang_kernels_matmul_to_glu(gpu, gelu, m, n, kd, in, &v, dy2), 0);
        else
            assert_int_equal(gang_kernels_matmul(gpu, m, n, kd, in, &v, dprod), 0);
        if (steps & FUSE_ACC)
            assert_int_equal(gang_kernels_add(gpu, dy2, dprod, m * n), 0);
        else if (!glu_out)
            assert_int_equal(gang_kernels_download(gpu, want, dprod, m * n * 4), 0);
        if ((steps & FUSE_ACC) || glu_out)
            fetch(want, dy2, m * n * 4);
        /* half weights past the GEMV's rows add in cuBLASLt's epilogue (beta 1), which a
         * split-K algorithm may round differently from the add kernel: within 2 ulp */
        if ((steps & FUSE_ACC) && m > 8 && (t == GANG_KW_BF16 || t == GANG_KW_F16))
            near(got, want, m * n, 2.5e-7, what);
        else
            for (size_t i = 0; i < m * n; i++)
                if (memcmp(&got[i], &want[i], 4) != 0)
                    fail_msg("%s: y[%zu] = %.9g, the separate calls %.9g", what, i, (double)got[i],
                             (double)want[i]);
    }
    gang_kernels_free(gpu, dw), gang_kernels_free(gpu, dx), gang_kernels_free(gpu, dg);
    gang_kernels_free(gpu, dy), gang_kernels_free(gpu, dy2), gang_kernels_free(gpu, dscr);
    gang_kernels_free(gpu, dscr2), gang_kernels_free(gpu, dprod);
    free(wf), free(x), free(g), free(y0), free(got), free(want), free(blob);
}

static void test_matmul_fused(void **state)
{
    static const int steps[] = {FUSE_NORM, FUSE_ACC, FUSE_GLU_IN | FUSE_ACC,
                                FUSE_NORM | FUSE_GLU_OUT, 0};
    static const size_t ms[] = {1, 3, 8, 12}, ks[] = {8, 576};
    static const gang_kernels_wtype ts[] = {GANG_KW_BF16, GANG_KW_F16, GANG_KW_I8, GANG_KW_F32};
    float x[2 * 32], g[16], w[2 * 3 * 16], y[2 * 3], scr[2 * 32];
    gang_kernels_fusion f = {.norm = g, .eps = 1e-5f, .glu_in = -1, .glu_out = -1};
    gang_kernels_weight v;

    (void)state;
    fill(x, sizeof(x) / 4, 1.0f, 0.0f), fill(w, sizeof(w) / 4, 1.0f, 0.0f);
    fill(g, 16, 0.0f, 1.0f), fill(y, sizeof(y) / 4, 0.0f, -7.0f);
    v = gang_kernels_weight_view(GANG_KW_BF16, w, 3, 16);
    /* The CPU has none: GANG_ENOSYS, nothing done (the engine makes the separate calls). */
    assert_int_equal(gang_kernels_matmul_fused(cpu, 2, 3, 16, x, &v, &f, scr, y), GANG_ENOSYS);
    for (size_t i = 0; i < sizeof(y) / 4; i++)
        assert_true(y[i] == -7.0f);
    /* The front's refusals, on any backend. */
    assert_int_equal(gang_kernels_matmul_fused(cpu, 2, 3, 16, x, &v, NULL, scr, y), GANG_EINVAL);
    assert_int_equal(gang_kernels_matmul_fused(cpu, 2, 3, 16, x, &v, &f, NULL, y), GANG_EINVAL);
    f.eps = -1.0f;
    assert_int_equal(gang_kernels_matmul_fused(cpu, 2, 3, 16, x, &v, &f, scr, y), GANG_EINVAL);
    f.eps = 1e-5f, f.glu_in = 0; /* a norm of the gate | up rows */
    assert_int_equal(gang_kernels_matmul_fused(cpu, 2, 3, 16, x, &v, &f, scr, y), GANG_EINVAL);
    f = (gang_kernels_fusion){.glu_in = -1, .glu_out = 1, .accumulate = 1};
    assert_int_equal(gang_kernels_matmul_fused(cpu, 2, 3, 16, x, &v, &f, scr, y), GANG_EINVAL);
    f = (gang_kernels_fusion){.glu_in = 2, .glu_out = -1};
    assert_int_equal(gang_kernels_matmul_fused(cpu, 2, 3, 16, x, &v, &f, scr, y), GANG_EINVAL);
    f = (gang_kernels_fusion){.glu_in = -1, .glu_out = -1, .accumulate = 2};
    assert_int_equal(gang_kernels_matmul_fused(cpu, 2, 3, 16, x, &v, &f, scr, y), GANG_EINVAL);
    f = (gang_kernels_fusion){.glu_in = 0, .glu_out = -1};
    assert_int_equal(gang_kernels_matmul_fused(cpu, 2, 3, 16, x, &v, &f, NULL, y), GANG_EINVAL);
    assert_int_equal(gang_kernels_matmul_fused(cpu, 2, 3, (size_t)1 << 40, x, &v, &f, scr, y),
                     GANG_ERANGE);
    NEED_GPU();
    for (size_t t = 0; t < 4; t++)
        for (size_t a = 0; a < 4; a++)
            for (size_t b = 0; b < 2; b++)
                for (size_t s = 0; s < sizeof(steps) / sizeof(steps[0]); s++)
                    matmul_fused_case(ts[t], ms[a], 67, ks[b], steps[s]);
    /* The decode shapes of the 1B and 8B models' norms: rows of 2048 and 4096, one row in
     * the GEMV's tile (8192 floats with the weights), two of 2048; three rows of 4096 are
     * the norm kernel then the GEMV, in the same call. */
    matmul_fused_case(GANG_KW_BF16, 1, 40, 4096, FUSE_NORM);
    matmul_fused_case(GANG_KW_BF16, 2, 40, 2048, FUSE_NORM | FUSE_GLU_OUT);
    matmul_fused_case(GANG_KW_I8, 3, 40, 4096, FUSE_NORM);
    matmul_fused_case(GANG_KW_BF16, 1, 40, 4096, FUSE_ACC);
}

/*
 * gang_kernels_retune: the launch choices change on the open handle. Observed through
 * matmul_fused, which answers GANG_ENOSYS (nothing written) where a choice turns its fused
 * kernel off: fuse_residual 0 for a norm, half_gemv 0 for a gated output of a bf16 weight
 * (only the GEMV has it); back to the defaults it runs again. Refused while capturing.
 */
static void test_retune(void **state)
{
    float x[16], g[16], w[6 * 16], y[3], scr[16];
    const gang_kernels_fusion glu = {.glu_in = -1, .glu_out = 0};
    gang_kernels_fusion norm = {.eps = 1e-5f, .glu_in = -1, .glu_out = -1};
    gang_kernels_options o;
    gang_kernels_graph *gr = NULL;
    gang_kernels_weight v, v2;
    uint16_t wb[6 * 16];
    void *dx, *dg, *dw, *dy, *dscr;

    (void)state;
    gang_kernels_options_init(&o);
    assert_int_equal(gang_kernels_retune(NULL, &o), GANG_EINVAL);
    assert_int_equal(gang_kernels_retune(cpu, NULL), GANG_EINVAL);
    o.pdl = 1, o.fuse_residual = 0, o.half_gemv = 0;
    assert_int_equal(gang_kernels_retune(cpu, &o), 0); /* no such choices: nothing to do */
    NEED_GPU();
    fill(x, 16, 1.0f, 0.0f), fill(g, 16, 0.0f, 1.0f), fill(w, 6 * 16, 1.0f, 0.0f);
    fill(y, 3, 0.0f, -7.0f), fill(scr, 16, 0.0f, 0.0f);
    assert_int_equal(gang_f32_to_bf16_array(w, wb, 6 * 16), 0);
    dx = dev_copy(x, sizeof(x)), dg = dev_copy(g, sizeof(g)), dw = dev_copy(wb, sizeof(wb));
    dy = dev_copy(y, sizeof(y)), dscr = dev_copy(scr, sizeof(scr));
    v = gang_kernels_weight_view(GANG_KW_BF16, dw, 3, 16);  /* a plain product's 3 rows */
    v2 = gang_kernels_weight_view(GANG_KW_BF16, dw, 6, 16); /* gate | up, 3 rows each */
    norm.norm = dg;
    for (int pass = 0; pass < 2; pass++) {
        gang_kernels_options_init(&o);
        o.pdl = pass; /* either way: these products do not depend on it */
        assert_int_equal(gang_kernels_retune(gpu, &o), 0);
        assert_int_equal(gang_kernels_matmul_fused(gpu, 1, 3, 16, dx, &v, &norm, dscr, dy), 0);
        assert_int_equal(gang_kernels_matmul_fused(gpu, 1, 3, 16, dx, &v2, &glu, dscr, dy), 0);
        o.fuse_residual = 0;
        assert_int_equal(gang_kernels_retune(gpu, &o), 0);
        assert_int_equal(gang_kernels_matmul_fused(gpu, 1, 3, 16, dx, &v, &norm, dscr, dy),
                         GANG_ENOSYS);
        o.fuse_residual = 1, o.half_gemv = 0;
        assert_int_equal(gang_kernels_retune(gpu, &o), 0);
        assert_int_equal(gang_kernels_matmul_fused(gpu, 1, 3, 16, dx, &v2, &glu, dscr, dy),
                         GANG_ENOSYS);
    }
    /* While capturing: refused, the capture unharmed, the choices as they were. */
    assert_int_equal(gang_kernels_graph_begin(gpu), 0);
    gang_kernels_options_init(&o);
    assert_int_equal(gang_kernels_retune(gpu, &o), GANG_EINVAL);
    assert_int_equal(gang_kernels_graph_end(gpu, &gr), 0);
    gang_kernels_graph_free(gpu, gr);
    assert_int_equal(gang_kernels_matmul_fused(gpu, 1, 3, 16, dx, &v2, &glu, dscr, dy),
                     GANG_ENOSYS);
    assert_int_equal(gang_kernels_retune(gpu, &o), 0);
    assert_int_equal(gang_kernels_matmul_fused(gpu, 1, 3, 16, dx, &v2, &glu, dscr, dy), 0);
    assert_int_equal(gang_kernels_sync(gpu), 0);
    gang_kernels_free(gpu, dx), gang_kernels_free(gpu, dg), gang_kernels_free(gpu, dw);
    gang_kernels_free(gpu, dy), gang_kernels_free(gpu, dscr);
}

static void test_graphs(void **state)
{
    float x[256], y[256], got[256];
    gang_kernels_graph *g = NULL;
    void *dx, *dy;

    (void)state;
    NEED_GPU();
    for (int i = 0; i < 256; i++)
        x[i] = (float)i, y[i] = 1.0f;
    dx = dev_copy(x, sizeof(x)), dy = dev_copy(y, sizeof(y));
    assert_int_equal(gang_kernels_graph_begin(gpu), 0);
    assert_int_equal(gang_kernels_add(gpu, dx, dy, 256), 0);
    assert_int_equal(gang_kernels_scale(gpu, dx, 2.0f, 256), 0);
    assert_int_equal(gang_kernels_graph_end(gpu, &g), 0);
    assert_non_null(g);
    fetch(got, dx, sizeof(got));
    assert_memory_equal(got, x, sizeof(x)); /* recorded, not run */
    assert_int_equal(gang_kernels_graph_launch(gpu, g), 0);
    assert_int_equal(gang_kernels_graph_launch(gpu, g), 0);
    fetch(got, dx, sizeof(got));
    for (int i = 0; i < 256; i++)
        assert_true(got[i] == ((float)i + 1.0f) * 2.0f * 2.0f + 2.0f);
    gang_kernels_graph_free(gpu, g);
    assert_int_equal(gang_kernels_graph_begin(gpu), 0);
    assert_int_equal(gang_kernels_sync(gpu), GANG_EINVAL);
    assert_int_equal(gang_kernels_graph_end(gpu, &g), GANG_EIO);
    assert_null(g);
    assert_int_equal(gang_kernels_sync(gpu), 0);
    gang_kernels_free(gpu, dx), gang_kernels_free(gpu, dy);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_upload_async),   cmocka_unit_test(test_scatter),
        cmocka_unit_test(test_attention_step), cmocka_unit_test(test_sample),
        cmocka_unit_test(test_split_glu),      cmocka_unit_test(test_fusions_cpu),
        cmocka_unit_test(test_fusions),        cmocka_unit_test(test_matmul_glu),
        cmocka_unit_test(test_matmul_to_glu),  cmocka_unit_test(test_matmul_fused),
        cmocka_unit_test(test_graphs),         cmocka_unit_test(test_retune),
    };

    return cmocka_run_group_tests(tests, setup, teardown);
}
