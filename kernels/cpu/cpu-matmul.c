/*
 * CPU backend: y = x . W^T over typed weights (bf16, f16, int8; gang_kernels_matmul) and
 * the embedding lookup over a typed table.
 *
 * Work split. The output rows of W (columns of y) are cut into chunks of a multiple of
 * GANG__MM_ROWS rows (twice that, a whole packed panel, from batch 4 on) and shared by the thread
 * pool (cpu-pool.c); each chunk computes every row of x against its rows of W, so each weight
 * element is read from memory once per call whatever m is (a decode step of batch 32 streams the
 * weights once, not 32 times), and the x rows stay in the core's L2. A call too small to pay for a
 * wake-up
 * (< GANG__MM_MIN_MACS multiply-adds) runs on the caller.
 *
 * Kernels. cpu-matmul-avx2.c (AVX2 + FMA + F16C, chosen at run time when the CPU has
 * them) does the arithmetic in register tiles; the portable loop below is the fallback
 * and the reference the tests compare it with. Both accumulate each output in f32 and
 * apply an int8 row's scale once, to the finished sum.
 */
#include <string.h>

#include "cpu.h"

#define GANG__MM_ROWS 8
/* Below this many multiply-adds a call runs on its caller alone. SmolLM2's k and v
 * projections at batch 1 (192 x 576: 110 K, 221 KB of bf16) were cheaper alone than with a
 * worker woken for half of them: an A/B of the decode step's matmuls (30 layers + LM head,
 * 2 threads, medians of 25) was 2.5-7% faster with this at 200 K than at 64 K, in each of
 * five runs. */
#define GANG__MM_MIN_MACS 200000
#define GANG__MM_CHUNKS_PER_THREAD 8

/* The portable kernel: rows [o0, o1) of W against every row of x. */
void gang__cpu_matmul_rows_ref(size_t m, size_t kdim, const float *x, const gang_kernels_weight *w,
                               size_t o0, size_t o1, float *y, size_t ldy)
{
    size_t es = gang_kernels_wtype_size(w->type);

    for (size_t o = o0; o < o1; o++) {
        const void *row = (const char *)w->data + o * kdim * es;
        float scale = w->type == GANG_KW_I8 ? w->scales[o] : 1.0f;

        for (size_t r = 0; r < m; r++) {
            const float *xr = x + r * kdim;
            float acc = 0.0f;

            for (size_t i = 0; i < kdim; i++)
                acc += xr[i] * gang__cpu_welem(w->type, row, i);
            y[r * ldy + o] = acc * scale;
        }
    }
}

/* The weights of a call; weight i's chunks are [c0[i], c0[i + 1]) (gang__cpu_split). */
typedef struct mm_job {
    size_t m, kdim;
    const float *x;
    const gang_kernels_weight *w;
    const size_t *n;
    float *const *y;
    size_t rows[GANG_KERNELS_MATMUL_N_MAX]; /* rows per chunk */
    size_t c0[GANG_KERNELS_MATMUL_N_MAX + 1];
    int simd;
} mm_job;

static void mm_chunk(void *arg, size_t c)
{
    const mm_job *j = arg;
    size_t i = gang__cpu_part_of(j->c0, c), n = j->n[i];
    size_t o0 = (c - j->c0[i]) * j->rows[i];
    size_t o1 = o0 + j->rows[i] < n ? o0 + j->rows[i] : n;

    if (j->simd)
        gang__cpu_matmul_rows_avx2(j->m, j->kdim, j->x, &j->w[i], o0, o1, j->y[i], n);
    else
        gang__cpu_matmul_rows_ref(j->m, j->kdim, j->x, &j->w[i], o0, o1, j->y[i], n);
}

/*
 * The typed products of one x against count weights as one job: every weight's rows cut
 * into chunks of whole units (GANG__MM_ROWS rows, a packed panel of twice that from batch
 * 4 on), GANG__MM_CHUNKS_PER_THREAD chunks per thread in all (gang__cpu_split); a call
 * below GANG__MM_MIN_MACS multiply-adds in all runs on the caller. F32 weights need the
 * AVX2 kernels here (the caller sends them to OpenBLAS otherwise).
 */
static void cpu_matmul_parts(size_t m, size_t kdim, const float *x, size_t count,
                             const gang_kernels_weight *w, const size_t *n, float *const *y,
                             int simd)
{
    mm_job j = {.m = m, .kdim = kdim, .x = x, .w = w, .n = n, .y = y, .simd = simd};
    size_t unit = m >= 4 ? 2 * GANG__MM_ROWS : GANG__MM_ROWS, units[GANG_KERNELS_MATMUL_N_MAX];
    unsigned threads = gang__cpu_threads();
    double macs = 0.0;
    size_t chunks;

    for (size_t i = 0; i < count; i++) {
        units[i] = (n[i] + unit - 1) / unit;
        macs += (double)m * (double)n[i] * (double)kdim;
    }
    if (macs < GANG__MM_MIN_MACS)
        threads = 1;
    chunks = gang__cpu_split(units, count, threads, GANG__MM_CHUNKS_PER_THREAD, j.rows, j.c0);
    for (size_t i = 0; i < count; i++)
        j.rows[i] *= unit;
    gang__cpu_run(mm_chunk, &j, chunks, threads);
}

int gang__cpu_matmul(size_t m, size_t n, size_t kdim, const float *x, const gang_kernels_weight *w,
                     float *y)
{
    int simd = gang__cpu_simd();

    /* f32 weights: the AVX2 kernels where the CPU has them (decode streamed at twice
     * OpenBLAS's rate: SmolLM2 f32 at batch 1, 9.4 tokens/s through sgemm), else OpenBLAS
     * and its threads (the portable loop is the tests' reference, not a fast path). */
    if (w->type == GANG_KW_F32 && !simd)
        return gang__cpu_gemm(1, m, n, kdim, 1.0f, x, w->data, 0.0f, y);
    if (gang_kernels_wtype_block(w->type, NULL, NULL))
        return gang__cpu_qmatmul(m, n, kdim, x, w, y); /* a GGUF file's blocks */
    cpu_matmul_parts(m, kdim, x, 1, w, &n, &y, simd);
    return 0;
}

int gang__cpu_matmul_n(size_t m, size_t kdim, const float *x, size_t count,
                       const gang_kernels_weight *w, const size_t *n, float *const *y)
{
    int simd = gang__cpu_simd(), blocks = 0, rc;

    for (size_t i = 0; i < count; i++)
        blocks += gang_kernels_wtype_block(w[i].type, NULL, NULL);
    if (blocks == (int)count)
        return gang__cpu_qmatmul_n(m, kdim, x, count, w, n, y);
    for (size_t i = 0; blocks == 0 && i < count; i++)
        blocks = w[i].type == GANG_KW_F32 && !simd; /* OpenBLAS's: one call each */
    if (blocks == 0) {
        cpu_matmul_parts(m, kdim, x, count, w, n, y, simd);
        return 0;
    }
    for (size_t i = 0; i < count; i++) /* a mix of block and typed weights */
        if ((rc = gang__cpu_matmul(m, n[i], kdim, x, &w[i], y[i])) != 0)
            return rc;
    return 0;
}

int gang__cpu_embedding_w(const gang_kernels_weight *table, size_t dim, const int32_t *ids,
                          size_t n_ids, float *out)
{
    size_t es = gang_kernels_wtype_size(table->type);

    if (es == 0) { /* a block table: each row dequantized */
        size_t rb = gang_kernels_weight_row_bytes(table->type, dim);
        gang__cpu_rp rp;
        if (gang__cpu_rp_peek(table, &rp)) /* repacked (a tied head): rows rebuilt */
            return gang__cpu_rp_embedding(&rp, dim, ids, n_ids, out);
        for (size_t t = 0; t < n_ids; t++) {
            const char *row = (const char *)table->data + (size_t)ids[t] * rb;
            int rc = gang_kernels_block_dequant(table->type, row, dim, out + t * dim);
            if (rc != 0)
                return rc;
        }
        return 0;
    }
    for (size_t t = 0; t < n_ids; t++) {
        const void *row = (const char *)table->data + (size_t)ids[t] * dim * es;
        float scale = table->type == GANG_KW_I8 ? table->scales[ids[t]] : 1.0f;

        if (table->type == GANG_KW_F32) {
            memcpy(out + t * dim, row, dim * sizeof(float));
            continue;
        }
        for (size_t i = 0; i < dim; i++)
            out[t * dim + i] = gang__cpu_welem(table->type, row, i) * scale;
    }
    return 0;
}
