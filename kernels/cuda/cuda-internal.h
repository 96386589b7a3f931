/*
 * Private to kernels/cuda/: the per-handle state of the CUDA backend, the device pool and
 * the launchers of the CUDA kernels (cuda-ops.cu, cuda-attention.cu). Included by the C
 * host files and by the .cu files, hence the extern "C" guard. Nothing outside
 * kernels/cuda/ may include it (it pulls in the CUDA runtime and cuBLASLt headers).
 */
#ifndef GANGLION_KERNELS_CUDA_INTERNAL_H
#define GANGLION_KERNELS_CUDA_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "ganglion/common.h"
#include "ganglion/kernels.h"

/* ---------------------------------------------------------------------------------
 * Pool (cuda-pool.c): first-fit over one region allocated at open. Pure bookkeeping on
 * offsets, no CUDA calls, so it is tested without a GPU.
 * --------------------------------------------------------------------------------- */
#define GANG_CUDA_POOL_ALIGN 256u

typedef struct gang__cuda_seg {
    size_t off;  /* from the pool base */
    size_t size; /* bytes, a multiple of GANG_CUDA_POOL_ALIGN */
    int used;    /* 1 while allocated */
} gang__cuda_seg;

typedef struct gang__cuda_pool {
    uintptr_t base;       /* first byte of the region (device address) */
    size_t size;          /* bytes of the region */
    size_t used;          /* bytes held by live allocations */
    gang__cuda_seg *segs; /* sorted by off, covering [0, size) without gaps */
    size_t nsegs, cap;
} gang__cuda_pool;

/* Starts bookkeeping over [base, base + size); size is rounded down to the alignment. */
int gang__cuda_pool_init(gang__cuda_pool *p, uintptr_t base, size_t size);
void gang__cuda_pool_fini(gang__cuda_pool *p);
/* First fit: GANG_ENOMEM (with a log line) when no free block holds bytes. */
int gang__cuda_pool_alloc(gang__cuda_pool *p, size_t bytes, uintptr_t *out);
/* GANG_EINVAL for an address that is not a live allocation; merges free neighbours. */
int gang__cuda_pool_free(gang__cuda_pool *p, uintptr_t addr);
size_t gang__cuda_pool_largest_free(const gang__cuda_pool *p);

/* A buffer of a split pool (gang_kernels_options.pool_split): its own device allocation
 * and the address the pool's bookkeeping gave it. */
typedef struct gang__cuda_split_buf {
    void *dev;
    uintptr_t book;
} gang__cuda_split_buf;

/* ---------------------------------------------------------------------------------
 * Per-handle state.
 * --------------------------------------------------------------------------------- */
#define GANG_CUDA_PLANS 64               /* cached GEMM shapes per handle */
#define GANG_CUDA_ALGOS 4                /* cuBLASLt candidates a plan keeps, best first */
#define GANG_CUDA_WORKSPACE (32u << 20)  /* cuBLASLt workspace (Hopper: 32 MiB) */
#define GANG_CUDA_ATT_SCRATCH (4u << 20) /* split-key attention partial states */
#define GANG_CUDA_STAGE (1u << 20)       /* pinned staging of upload_async */

typedef struct gang__cuda_plan
    gang__cuda_plan; /* cuda-trace.c: kernel traces through CUPTI (gang_kernels_trace_*). enable
                      * loads CUPTI and turns its kernel records on, once per process (0, or the
                      * first call's error); owner is the handle's state. collect expects the
                      * owner's work finished; release (at close) drops the owner's spans. */
int gang__cuda_trace_enable(void);
int gang__cuda_trace_begin(const void *owner);
int gang__cuda_trace_end(const void *owner);
int gang__cuda_trace_collect(const void *owner, gang_kernels_trace *out);
void gang__cuda_trace_release(const void *owner);

/* cuda-gemm.c */

typedef struct gang__cuda_ctx {
    int device;          /* CUDA ordinal */
    cudaStream_t stream; /* every operation of the handle runs here */
    void *pool_mem;      /* the one cudaMalloc of the handle (NULL when split) */
    gang__cuda_pool pool;
    /* gang_kernels_options.pool_split: every buffer its own cudaMalloc (split_bufs, nsplit
     * of split_cap), the pool's bookkeeping over addresses never dereferenced */
    int split;
    gang__cuda_split_buf *split_bufs;
    size_t nsplit, split_cap;
    void *lt;        /* cublasLtHandle_t */
    void *blas;      /* cublasHandle_t, created by the first benchmark */
    void *workspace; /* GANG_CUDA_WORKSPACE bytes from the pool (or less) */
    size_t workspace_bytes;
    gang__cuda_plan *plans; /* GANG_CUDA_PLANS entries */
    unsigned plan_next;     /* round-robin victim when the cache is full */
    int *dev_flag;          /* device word: kernels OR error bits into it */
    float *att_scratch;     /* partial states of split-key attention (pool) */
    size_t att_scratch_floats;
    void *mm_scratch; /* x converted to half for gang_kernels_matmul (pool) */
    size_t mm_scratch_bytes;
    void *fuse_tmp; /* a product for gang_kernels_matmul_fused's add, where no GEMV adds (pool) */
    size_t fuse_tmp_bytes;
    void *mq_scratch; /* a band of a block weight dequantized to bf16 for a prefill (pool) */
    size_t mq_scratch_bytes;
    void *mq_out; /* a band's product when the weight takes several bands (pool) */
    size_t mq_out_bytes;
    int sm_count;   /* multiprocessors of the device */
    int *host_flag; /* pinned host copy for reading it back */
    /* upload_async's pinned staging: bytes [0, stage_used) are copies the stream may still
     * read; the whole buffer is free again after every host synchronisation. */
    char *stage;
    size_t stage_used;
    /* Captures started so far: once there is one, a buffer a graph may use (the matmul's
     * x scratch) is never returned to the pool when it grows, since a graph replays the
     * old address (also one captured earlier in the same graph). */
    unsigned graphs;
    int half_gemv;     /* gang_kernels_options.half_gemv */
    int fuse_residual; /* gang_kernels_options.fuse_residual */
    int pdl;           /* gang_kernels_options.pdl, on a device of compute capability >= 9 */
    int trace;         /* gang_kernels_options.trace: CUPTI enabled for this handle */
} gang__cuda_ctx;

/* Device memory of a handle (cuda-mem.c): a piece of the pool or, split, its own
 * allocation; GANG_ENOMEM (with the pool's log line) when the pool cannot hold it. */
int gang__cuda_mem_alloc(gang__cuda_ctx *c, size_t bytes, void **out);
/* GANG_EINVAL for a pointer that is not a live buffer of the handle. */
int gang__cuda_mem_free(gang__cuda_ctx *c, void *p);

/* Bits of dev_flag. */
#define GANG_CUDA_FLAG_BAD_POSITION 1 /* rope: a negative position */
#define GANG_CUDA_FLAG_BAD_ID 2       /* embedding: id out of range */
#define GANG_CUDA_FLAG_BAD_INDEX 4    /* scatter_i32: index out of range */
#define GANG_CUDA_FLAG_BAD_BLOCK 8    /* attention_step: a block id outside the pool */

/* Maps a CUDA runtime error to a GANG_E* code and logs it with what was being done. */
int gang__cuda_err(cudaError_t e, const char *what);

/* cuda-gemm.c */
int gang__cuda_gemm_init(gang__cuda_ctx *c);
void gang__cuda_gemm_fini(gang__cuda_ctx *c);
int gang__cuda_gemm(void *ctx, gang_dtype dt, int trans_b, size_t m, size_t n, size_t kdim,
                    float alpha, const void *a, const void *b, float beta, void *cmat);
/* y[m, n] (f32) = a[m, k] . b[n, k]^T + beta y with a and b of half type dt (bf16 / f16),
 * f32 accumulation: the cuBLASLt half of gang_kernels_matmul (beta 0), and of a residual
 * add (beta 1: y + the product, rounded once, the add's numbers). The device is current. */
int gang__cuda_gemm_half_f32(gang__cuda_ctx *c, gang_dtype dt, size_t m, size_t n, size_t kdim,
                             const void *a, const void *b, float beta, float *cmat);
int gang__cuda_gemm_pair(void *ctx, gang_dtype dt, int trans_b, size_t m, size_t n, size_t kdim,
                         const void *a, const void *b, void *c_ours, void *c_ref, float *ours_ms,
                         float *ref_ms);

/* ---------------------------------------------------------------------------------
 * Kernel launchers (cuda-ops.cu, cuda-attention.cu). They enqueue on stream and return
 * the launch error (cudaGetLastError) mapped to GANG_E*; sizes were validated.
 * --------------------------------------------------------------------------------- */
int gang__cuda_launch_rmsnorm(cudaStream_t s, const float *x, const float *w, float eps,
                              size_t rows, size_t dim, float *out);
/* The same rows' RMSNorm stored as odt (f32, bf16, f16: rounded as gang__cuda_launch_convert
 * rounds): the norm and the conversion of a half GEMM's input in one launch. */
int gang__cuda_launch_rmsnorm_to(cudaStream_t s, const float *x, const float *w, float eps,
                                 size_t rows, size_t dim, gang_dtype odt, void *out);
int gang__cuda_launch_rope(cudaStream_t s, float *x, const int32_t *positions, size_t tokens,
                           size_t heads, size_t head_dim, const float *inv_freq, float scale,
                           int *flag);
int gang__cuda_launch_add_rmsnorm(cudaStream_t s, float *x, const float *y, const float *w,
                                  float eps, size_t rows, size_t dim, float *out);
int gang__cuda_launch_split_qkv_rope(cudaStream_t s, const gang_kernels_qkv_rope *a, int *flag);
int gang__cuda_launch_softmax(cudaStream_t s, float *x, size_t rows, size_t cols);
int gang__cuda_launch_silu_mul(cudaStream_t s, const float *gate, const float *up, size_t n,
                               float *out);
int gang__cuda_launch_gelu_mul(cudaStream_t s, const float *gate, const float *up, size_t n,
                               float *out);
int gang__cuda_launch_scale(cudaStream_t s, float *x, float a, size_t n);
/* Sets words[1] (this call's "bad id", which the embedding kernels read) and ORs
 * GANG_CUDA_FLAG_BAD_ID into words[0] (the deferred error of the next sync). */
int gang__cuda_launch_check_ids(cudaStream_t s, const int32_t *ids, size_t n_ids, size_t vocab,
                                int *words);
int gang__cuda_launch_embedding(cudaStream_t s, const float *table, size_t dim, const int32_t *ids,
                                size_t n_ids, const int *flag, float *out);
int gang__cuda_launch_add(cudaStream_t s, float *x, const float *y, size_t n);
int gang__cuda_launch_add_rows(cudaStream_t s, float *x, const float *bias, size_t rows,
                               size_t cols);
int gang__cuda_launch_argmax(cudaStream_t s, const float *x, size_t rows, size_t cols,
                             int32_t *out);
/* The decode GEMVs' input (glu): x [m, kdim] itself, or the gated unit of x [m, 2 kdim]'s
 * [gate | up] rows, SiLU or GELU-tanh (gang_kernels_matmul_glu), computed as x is staged. */
#define GANG_CUDA_GLU_NONE 0
#define GANG_CUDA_GLU_SILU 1
#define GANG_CUDA_GLU_GELU 2
/* cuda-matmul.cu: y [+]= x . W^T (add) for an int8 weight (w, scales), dequantized on the fly
 * (glu other than NONE: only where the GEMV applies, else GANG_ENOSYS); the embedding
 * over a typed table (wtype a gang_kernels_wtype; scales for int8). */
int gang__cuda_launch_matmul_i8(cudaStream_t s, int glu, int pdl, size_t m, size_t n, size_t kdim,
                                const float *x, const int8_t *w, const float *scales, int add,
                                float *y);
/* y = x . W^T for m <= 8 rows of x by a bf16 (bf16 != 0) or f16 weight, kdim a multiple
 * of 8 and w 16-byte aligned (else GANG_ENOSYS): x rounded to the weight's type. pdl (of
 * both GEMVs): launched as a programmatic dependent of the kernel before it (cuda-pdl.h). */
int gang__cuda_launch_gemv_half(cudaStream_t s, int glu, int pdl, int bf16, size_t m, size_t n,
                                size_t kdim, const float *x, const void *w, float *y);
#define GANG_CUDA_GEMV_ROWS 8 /* the most rows of x the decode GEMVs take */
/* One decode GEMV with its fusions (gang_kernels_matmul_fused): y [m, n] = [y +]
 * out(in(x) . W^T), W [n, kdim] (glu_out: [2 n, kdim], gate rows then up rows, y the gated
 * unit) in wtype (GANG_KW_BF16, _F16 or _I8 with its scales); in: x RMS-normed with norm
 * and eps, or (glu_in, a GANG_CUDA_GLU_*) the gated unit of x [m, 2 kdim]; acc: y +=. */
typedef struct gang__cuda_gemv_fused {
    size_t m, n, kdim;
    const float *x;
    const void *w;
    const float *scales;
    const float *norm;
    float eps;
    int glu_in, glu_out, acc;
    float *y;
} gang__cuda_gemv_fused;
/* Launched by the decode GEMV; GANG_ENOSYS where it does not apply (m > 8, a norm whose rows
 * do not fit its tile at once, glu_in with a norm or glu_out with acc, other storage). */
int gang__cuda_launch_gemv_fused(cudaStream_t s, int wtype, int pdl,
                                 const gang__cuda_gemv_fused *a);
/* 1 when the decode GEMV takes a weight w of wtype (GANG_KW_BF16, _F16, _I8) for m rows of x
 * (at most GANG_CUDA_GEMV_ROWS, rows of whole 16-byte loads on 16-byte boundaries). */
int gang__cuda_gemv_takes(int wtype, size_t m, size_t kdim, const void *w);
int gang__cuda_launch_embedding_w(cudaStream_t s, int wtype, const void *table, const float *scales,
                                  size_t dim, const int32_t *ids, size_t n_ids, const int *flag,
                                  float *out);
/* cuda-qmatmul.cu: the block weights (wtype a block gang_kernels_wtype, rows of kdim a
 * whole number of blocks; GANG_ENOSYS for another type). gemv_q: y = x . W^T for m <=
 * GANG_CUDA_QGEMV_ROWS, dequantizing in registers (pdl as the other GEMVs'); dequant_q_bf16: the
 * weight [n, kdim] as bf16 into out (2 n kdim bytes, 16-byte aligned), for the cuBLASLt path of a
 * larger m; embedding_q: the rows ids of a block table as f32 (flag as the other embeddings). */
#define GANG_CUDA_QGEMV_ROWS 8
#define GANG_CUDA_QBAND_ELEMS ((size_t)32 << 20) /* most weight elements dequantized at once */
int gang__cuda_launch_gemv_q(cudaStream_t s, int wtype, int glu, int pdl, size_t m, size_t n,
                             size_t kdim, const float *x, const void *w, float *y);
int gang__cuda_launch_dequant_q_bf16(cudaStream_t s, int wtype, size_t n, size_t kdim,
                                     const void *w, void *out);
int gang__cuda_launch_embedding_q(cudaStream_t s, int wtype, const void *table, size_t dim,
                                  const int32_t *ids, size_t n_ids, const int *flag, float *out);
int gang__cuda_launch_convert(cudaStream_t s, gang_dtype from, const void *src, gang_dtype to,
                              void *dst, size_t n);
/* dtype: the cache's elements (f32 for a contiguous one). table NULL: contiguous cache,
 * else the block table of a paged one (block_size rows per
 * block). scratch (scratch_floats f32, may be NULL) holds the partial states when the keys are
 * split across blocks; n_sm is the device's multiprocessor count. */
int gang__cuda_launch_attention(cudaStream_t s, const float *q, const void *kc, const void *vc,
                                gang_dtype dtype, const int32_t *table, size_t block_size,
                                size_t tq, size_t tk, size_t n_heads, size_t n_kv_heads,
                                size_t head_dim, size_t pos0, size_t window, float *out,
                                float *scratch, size_t scratch_floats, int n_sm);

/* cuda-step.cu: the decode step's kernels (gang_kernels_attention_step, _scatter_i32,
 * _sample). attention_step answers GANG_ENOSYS for a head_dim over 256 or not a multiple
 * of 8 (its 16-byte loads); out-of-range values OR their bit into flag. */
int gang__cuda_launch_attention_step(cudaStream_t s, const gang_kernels_step_kv *kv,
                                     const float *knew, const float *vnew, const float *q,
                                     size_t tokens, size_t n_heads, size_t n_kv_heads,
                                     size_t head_dim, size_t window, float *out, int *flag,
                                     float *scratch, size_t scratch_floats, int n_sm);
/* Split-key attention (flash-decoding, cuda-attention.cu), shared by the per-sequence and
 * the step attention. splits: how many chunks to cut the keys (a bound of max_keys) into
 * for a launch of `blocks` blocks and `pairs` (query, head) states: 1 unless the blocks
 * would leave most of the n_sm SMs idle; else about two waves of blocks, chunks of at
 * least 128 keys, at most 64, within the scratch (head_dim + 2 floats per pair and
 * split). merge: part holds, per (query, head) pair, splits states of m, l and head_dim
 * numerators; out[pair] their combination. */
unsigned gang__cuda_attention_splits(size_t blocks, size_t pairs, size_t max_keys, size_t head_dim,
                                     size_t scratch_floats, int n_sm);
int gang__cuda_launch_attention_merge(cudaStream_t s, const float *part, size_t pairs,
                                      unsigned splits, size_t head_dim, float *out);
int gang__cuda_launch_scatter_i32(cudaStream_t s, int32_t *dst, size_t dst_n, const int32_t *pairs,
                                  size_t n_pairs, int *flag);
int gang__cuda_launch_sample(cudaStream_t s, const float *logits, size_t rows, size_t cols,
                             const gang_kernels_sample_param *params, int32_t *out);
int gang__cuda_launch_split_cols3(cudaStream_t s, const float *x, size_t rows, size_t w0, size_t w1,
                                  size_t w2, float *o0, float *o1, float *o2);
int gang__cuda_launch_glu(cudaStream_t s, int gelu, const float *x, size_t rows, size_t cols,
                          float *out);

#ifdef __cplusplus
}
#endif

#endif
