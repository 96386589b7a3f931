/*
 * The CPU backend's arithmetic, behind its vtable (kernels/cpu/cpu-backend.c). Only
 * kernels/cpu/ includes this file.
 *
 * The front (kernels/backend.c) validates every argument against the contracts in
 * include/ganglion/kernels.h and cpu-backend.c checks the values (positions, ids) before
 * these are called, so they may assume non-NULL pointers and consistent, non-zero sizes
 * that fit their index types. They return 0 or a negative GANG_E* code.
 */
#ifndef GANGLION_KERNELS_CPU_H
#define GANGLION_KERNELS_CPU_H

#include <stddef.h>
#include <stdint.h>

#include <cblas.h>

#include "ganglion/kernels.h"

/* Element i of a row of a typed weight as f32 (an int8 row's scale is the caller's to
 * apply): the scalar load of the portable matmul and of the AVX2 kernels' tails. */
static inline float gang__cpu_welem(gang_kernels_wtype t, const void *row, size_t i)
{
    switch (t) {
    case GANG_KW_BF16:
        return gang_bf16_to_f32(((const uint16_t *)row)[i]);
    case GANG_KW_F16:
        return gang_f16_to_f32(((const uint16_t *)row)[i]);
    case GANG_KW_I8:
        return (float)((const int8_t *)row)[i];
    default: /* f32 (block types never come here) */
        break;
    }
    return ((const float *)row)[i];
}

/* cpu-backend.c: the SIMD level the kernels run at, decided from the CPU at the first call:
 * 0 the portable kernels, 1 the AVX2 ones (matmul, attention items, SiLU, block products;
 * gang__cpu_avx2_usable), 2 the same plus the AVX-512 VNNI block products
 * (gang__cpu_avx512_usable; every other kernel stays AVX2 there). Tests:
 * gang__cpu_simd_force(level) forces a level (only one the CPU runs), -1 decides again
 * from the CPU. */
int gang__cpu_simd(void);
void gang__cpu_simd_force(int simd);

/* cpu-blas.c: OpenBLAS through dlopen (cblas_sgemm, and its thread count). */
#define GANG_CPU_BLAS_SONAME "libopenblas.so.0"
typedef void (*gang__cpu_sgemm_fn)(enum CBLAS_ORDER order, enum CBLAS_TRANSPOSE ta,
                                   enum CBLAS_TRANSPOSE tb, blasint m, blasint n, blasint k,
                                   float alpha, const float *a, blasint lda, const float *b,
                                   blasint ldb, float beta, float *c, blasint ldc);
/*
 * Opens OpenBLAS once per process (thread-safe) and gives its cblas_sgemm in *out (may be
 * NULL to only check). 0, or GANG_ENOENT (logged once) when the library or the symbol is
 * missing; every later call answers the same.
 */
int gang__cpu_blas_load(gang__cpu_sgemm_fn *out);
/* OpenBLAS's openblas_set_num_threads(n), through the library gang__cpu_blas_load opened:
 * 0, the load's error, or GANG_ENOSYS when the library has no such routine. */
int gang__cpu_blas_set_threads(int n);
/*
 * One attempt: soname through dlopen's search, then dir/soname. The library stays loaded.
 * 0 with *out, or GANG_ENOENT with a log line naming what was tried. For tests.
 */
int gang__cpu_blas_open(const char *soname, const char *dir, gang__cpu_sgemm_fn *out);

/* cpu-gemm.c */
int gang__cpu_gemm(int trans_b, size_t m, size_t n, size_t kdim, float alpha, const float *a,
                   const float *b, float beta, float *c);

/* cpu-matmul.c: y = x . W^T over a typed weight (gang_kernels_matmul), rows of W split
 * over the pool; the portable kernel of rows [o0, o1) of W (y has leading dimension ldy);
 * the embedding over a typed table (ids already checked). */
int gang__cpu_matmul(size_t m, size_t n, size_t kdim, const float *x, const gang_kernels_weight *w,
                     float *y);
/* gang_kernels_matmul_n: block weights through gang__cpu_qmatmul_n, typed ones (bf16, f16,
 * int8, f32 with AVX2) as one pool job of all their rows, any other mix one call each. */
int gang__cpu_matmul_n(size_t m, size_t kdim, const float *x, size_t count,
                       const gang_kernels_weight *w, const size_t *n, float *const *y);
void gang__cpu_matmul_rows_ref(size_t m, size_t kdim, const float *x, const gang_kernels_weight *w,
                               size_t o0, size_t o1, float *y, size_t ldy);
int gang__cpu_embedding_w(const gang_kernels_weight *table, size_t dim, const int32_t *ids,
                          size_t n_ids, float *out);

/* cpu-matmul-avx2.c (compiled with -mavx2 -mfma -mf16c on x86-64): 1 when this build has
 * the AVX2 kernels and the CPU runs them; the same contract as the portable kernel. */
int gang__cpu_avx2_usable(void);
void gang__cpu_matmul_rows_avx2(size_t m, size_t kdim, const float *x, const gang_kernels_weight *w,
                                size_t o0, size_t o1, float *y, size_t ldy);

/* cpu-qmatmul.c: y = x . W^T over a block weight (gang_kernels_matmul with a block type).
 * x is first quantized per 32 elements (gang__cpu_quantize_x): for row r and group g of
 * 32, q[r kdim + 32 g + j] = round(x / d) in [-127, 127] with d[r G + g] = max |x| / 127
 * (G = kdim / 32) and ds[r G + g] = d x the sum of the group's q (for the offsets of
 * Q4_1, Q5_1, Q4_K, Q5_K). The row kernels add, for each group, d (a0 s0 + a1 s1) + b ds
 * with s0, s1 the int32 products of its two halves (gang__kw_unpack's a, b). */
typedef struct gang__cpu_qx {
    int8_t *q;
    float *d;
    float *ds;
} gang__cpu_qx;
void gang__cpu_quantize_x(const float *x, size_t m, size_t kdim, const gang__cpu_qx *qx);
/* sx[2 g], sx[2 g + 1]: the int sums of the two halves of each group g of 32 of qx's int8
 * copy of m rows of kdim (the repacked kernels' offsets). */
void gang__cpu_qx_sums(size_t m, size_t kdim, const gang__cpu_qx *qx, int32_t *sx);
int gang__cpu_qmatmul(size_t m, size_t n, size_t kdim, const float *x, const gang_kernels_weight *w,
                      float *y);
void gang__cpu_qmatmul_rows_ref(size_t m, size_t kdim, const gang__cpu_qx *qx,
                                const gang_kernels_weight *w, size_t o0, size_t o1, float *y,
                                size_t ldy);
/* cpu-qmatmul-avx2.c: the same rows with AVX2 (the integer products by maddubs). */
void gang__cpu_qmatmul_rows_avx2(size_t m, size_t kdim, const gang__cpu_qx *qx,
                                 const gang_kernels_weight *w, size_t o0, size_t o1, float *y,
                                 size_t ldy);
/* cpu-qmatmul-avx512.c (compiled with the AVX-512 F/BW/VL/VNNI flags on x86-64): 1 when
 * this build has the VNNI kernel and the CPU runs it; the same rows by vpdpbusd. */
int gang__cpu_avx512_usable(void);
void gang__cpu_qmatmul_rows_avx512(size_t m, size_t kdim, const gang__cpu_qx *qx,
                                   const gang_kernels_weight *w, size_t o0, size_t o1, float *y,
                                   size_t ldy);
/* gang__cpu_quantize_x's output to the bit, and sx[2 g], sx[2 g + 1] the int sums of the
 * two halves of x's group g (the repacked kernels' offsets), by AVX-512. */
void gang__cpu_quantize_x_avx512(const float *x, size_t m, size_t kdim, const gang__cpu_qx *qx,
                                 int32_t *sx);
/* The block products of one x against n_parts <= GANG_KERNELS_MATMUL_N_MAX weights
 * (gang_kernels_matmul_n): x quantized once, one job on the pool. */
int gang__cpu_qmatmul_n(size_t m, size_t kdim, const float *x, size_t n_parts,
                        const gang_kernels_weight *w, const size_t *n, float *const *y);

/* Full unrolling of the repacked kernels' loops over the rows of x (at most 8), the four
 * steps of a half group and the unpacking of a column block's codes, so that the code
 * vectors and the rows' accumulators stay in registers (left to itself clang kept them on
 * the stack: 5-10% of a batch-32 step, and IQ4_NL's kernel ran 2.6x slower). */
#if defined(__clang__)
#define RP_UNROLL8 _Pragma("unroll 8")
#define RP_UNROLL4 _Pragma("unroll 4")
#elif defined(__GNUC__)
#define RP_UNROLL8 _Pragma("GCC unroll 8")
#define RP_UNROLL4 _Pragma("GCC unroll 4")
#else
#define RP_UNROLL8
#define RP_UNROLL4
#endif

/*
 * The repacked layout of the block types (cpu-qrepack.c; the K types' column blocks in
 * cpu-qrepack-k.c): groups of
 * GANG__RP_ROWS W rows interleaved for the AVX-512 kernel (cpu-qrepack-avx512.c), behind a
 * header of GANG__RP_HEADER bytes. gang__cpu_rp_get: 1 and *out when w is a repacked weight
 * of n x kdim, 0 when it is in the file's layout, GANG_EINVAL when it is repacked with
 * other sizes; gang__cpu_rp_peek the same with the sizes it was made with.
 * gang__cpu_rp_embedding: rows ids of a repacked table dequantized (GANG_EINVAL for an id
 * out of range or another dim). gang__cpu_rp_block: row's block blk in the file's layout
 * (bytes of the type's block). gang__cpu_rp_build: the repacked copy of src (file layout),
 * in arena when not NULL, NULL for another type or when memory is out. The rows kernels:
 * groups [g0, g1) against the m rows of x (sx: the int sums of the two halves of each group
 * of 32 of x, two per qx's d).
 */
#define GANG__RP_ROWS 16
#define GANG__RP_HEADER 64
typedef struct gang__cpu_rp {
    gang_kernels_wtype type;
    size_t n, kdim, groups, nb, cb;
    const uint8_t *body;
} gang__cpu_rp;
int gang__cpu_rp_type(gang_kernels_wtype t);
int gang__cpu_rp_usable(void);
int gang__cpu_rp_get(const gang_kernels_weight *w, size_t n, size_t kdim, gang__cpu_rp *out);
int gang__cpu_rp_peek(const gang_kernels_weight *w, gang__cpu_rp *out);
int gang__cpu_rp_embedding(const gang__cpu_rp *rp, size_t dim, const int32_t *ids, size_t n_ids,
                           float *out);
void gang__cpu_rp_block(const gang__cpu_rp *rp, size_t row, size_t blk, uint8_t *out);
void *gang__cpu_rp_build(gang_kernels_wtype t, const void *src, size_t n, size_t kdim,
                         gang_kernels_arena *arena);
int gang__cpu_rp_rows_ref(size_t m, const gang__cpu_qx *qx, const gang__cpu_rp *rp, size_t g0,
                          size_t g1, float *y, size_t ldy);
void gang__cpu_rp_rows_avx512(size_t m, const gang__cpu_qx *qx, const int32_t *sx,
                              const gang__cpu_rp *rp, size_t g0, size_t g1, float *y, size_t ldy);
/* cpu-qrepack-k.c: the K types' column blocks (Q4_K, Q5_K, Q6_K). gang__cpu_rpk_cb: a
 * column block's bytes, 0 for another type; gang__cpu_rpk_put: block p (file layout) at
 * lane r of column block c; gang__cpu_rpk_block: lane r's block given back. Their kernel
 * (cpu-qrepack-k-avx512.c), called by gang__cpu_rp_rows_avx512 for those types. */
size_t gang__cpu_rpk_cb(gang_kernels_wtype t);
void gang__cpu_rpk_put(gang_kernels_wtype t, const uint8_t *p, size_t r, uint8_t *c);
void gang__cpu_rpk_block(gang_kernels_wtype t, const uint8_t *c, size_t r, uint8_t *out);
void gang__cpu_rpk_rows_avx512(size_t m, const gang__cpu_qx *qx, const int32_t *sx,
                               const gang__cpu_rp *rp, size_t g0, size_t g1, float *y, size_t ldy);

/* cpu-pool.c: runs fn(arg, c) for every chunk c < chunks on the pool's threads and the
 * caller, returning when all are done (see the file's comment). gang__cpu_threads: the
 * threads a job may use; gang__cpu_set_threads(1) makes every job run on its caller
 * (tests), a larger value restores the whole pool. */
typedef void (*gang__cpu_task)(void *arg, size_t chunk);
void gang__cpu_parallel(gang__cpu_task fn, void *arg, size_t chunks);
unsigned gang__cpu_threads(void);
/* cpu-pool.c: the chunks of one job over count <= GANG_KERNELS_MATMUL_N_MAX parts of
 * units[i] work units each (the products of one x against several weights): the same units
 * per chunk across the parts, about per_thread chunks per thread in all, no chunk across two
 * parts; threads <= 1: one chunk per part. upc[i]: part i's units per chunk; its chunks are
 * [c0[i], c0[i + 1]) (c0 has count + 1 entries; c0[count], the job's chunks, is returned).
 * gang__cpu_part_of: the part of chunk c. gang__cpu_run: the chunks on the pool, or on the
 * caller alone when threads <= 1. */
size_t gang__cpu_split(const size_t *units, size_t count, unsigned threads, size_t per_thread,
                       size_t *upc, size_t *c0);
static inline size_t gang__cpu_part_of(const size_t *c0, size_t c)
{
    size_t i = 0;

    while (c >= c0[i + 1])
        i++;
    return i;
}
void gang__cpu_run(gang__cpu_task fn, void *arg, size_t chunks, unsigned threads);
void gang__cpu_set_threads(unsigned n);

/* cpu-ops.c */
int gang__cpu_rmsnorm(const float *x, const float *w, float eps, size_t rows, size_t dim,
                      float *out);
int gang__cpu_rope(float *x, const int32_t *positions, size_t tokens, size_t heads, size_t head_dim,
                   const float *inv_freq, float scale);
int gang__cpu_softmax(float *x, size_t rows, size_t cols);
int gang__cpu_silu_mul(const float *gate, const float *up, size_t n, float *out);
/* cpu-ops-avx2.c: SiLU(gate) x up and GELU-tanh(gate) x up on 8 lanes (cpu-avx2.h's exp);
 * gang__cpu_gelu_mul_ref the portable GELU (tanhf, as PyTorch writes it). */
void gang__cpu_silu_mul_avx2(const float *gate, const float *up, size_t n, float *out);
void gang__cpu_gelu_mul_avx2(const float *gate, const float *up, size_t n, float *out);
int gang__cpu_gelu_mul(const float *gate, const float *up, size_t n, float *out);
int gang__cpu_gelu_mul_ref(const float *gate, const float *up, size_t n, float *out);
int gang__cpu_scale(float *x, float a, size_t n);
int gang__cpu_embedding(const float *table, size_t vocab, size_t dim, const int32_t *ids,
                        size_t n_ids, float *out);
int gang__cpu_add(float *x, const float *y, size_t n);
int gang__cpu_add_rows(float *x, const float *bias, size_t rows, size_t cols);
int gang__cpu_argmax(const float *x, size_t rows, size_t cols, int32_t *out);

/* cpu-step.c: the decode step's operations (values checked there, nothing written on a
 * bad position, block or index). */
int gang__cpu_attention_step(const gang_kernels_step_kv *kv, const float *knew, const float *vnew,
                             const float *q, size_t tokens, size_t n_heads, size_t n_kv_heads,
                             size_t head_dim, size_t window, float *out);
int gang__cpu_scatter_i32(int32_t *dst, size_t dst_n, const int32_t *pairs, size_t n_pairs);
int gang__cpu_sample(const float *logits, size_t rows, size_t cols,
                     const gang_kernels_sample_param *params, int32_t *out);
int gang__cpu_split_cols3(const float *x, size_t rows, size_t w0, size_t w1, size_t w2, float *o0,
                          float *o1, float *o2);
int gang__cpu_glu(int gelu, const float *x, size_t rows, size_t cols, float *out);
int gang__cpu_split_qkv_rope(const gang_kernels_qkv_rope *a);
int gang__cpu_add_rmsnorm(float *x, const float *y, const float *w, float eps, size_t rows,
                          size_t dim, float *out);

/* cpu-attention.c */
/* pages NULL: contiguous cache; else rows through its block table (gang_kernels_kv_pages). */
int gang__cpu_attention(const float *q, const void *kc, const void *vc,
                        const gang_kernels_kv_pages *pages, size_t tq, size_t tk, size_t n_heads,
                        size_t n_kv_heads, size_t head_dim, size_t pos0, size_t window, float *out);
/* Every sequence of a step (gang_kernels_attention_batch), items shared by the pool. */
int gang__cpu_attention_batch(const gang_kernels_attn_seq *seqs, size_t n_seq, size_t n_heads,
                              size_t n_kv_heads, size_t head_dim, size_t window);

/*
 * One work item of the CPU attention (cpu-attention-item.h): `heads` consecutive query
 * heads of one query row, all reading kv head g, over the keys [first, n_keys) of a cache
 * (rows of row_w elements of dtype dt, this head's columns from off; through pg's block
 * table when pg is not NULL), `tile` keys at a time. q and out point at the first head's
 * head_dim floats (out may be q); acc is scratch of heads x head_dim floats, kt and vt of
 * tile x head_dim each.
 */
/* The cache row of position j: j itself, or its row in its block of a paged cache. */
static inline size_t gang__cpu_kv_row(const gang_kernels_kv_pages *pg, size_t j)
{
    return pg == NULL ? j
                      : (size_t)pg->table[j / pg->block_size] * pg->block_size + j % pg->block_size;
}

#define GANG__ATTN_HEADS 8          /* heads one item holds at most */
#define GANG__ATTN_TILE 64          /* keys scored at once at most (the online softmax's step) */
#define GANG__ATTN_TILE_FLOATS 8192 /* a tile's key rows: tile = this / head_dim, 1 .. 64 */
typedef struct gang__cpu_attn_item {
    const float *q;
    float *out;
    const void *kc, *vc;
    const gang_kernels_kv_pages *pg;
    gang_dtype dt;
    size_t row_w, off, first, n_keys, heads, head_dim, tile;
    float scale;
    float *acc, *kt, *vt;
} gang__cpu_attn_item;
void gang__cpu_attn_item_ref(const gang__cpu_attn_item *it);
/* cpu-attention-avx2.c: the same item with AVX2 + FMA + F16C (gang__cpu_avx2_usable()). */
void gang__cpu_attn_item_avx2(const gang__cpu_attn_item *it);

#endif /* GANGLION_KERNELS_CPU_H */
