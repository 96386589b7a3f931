/*
 * Internal interface of the kernels module: the one backend vtable. Only kernels/ includes
 * this file. No CUDA types: the front includes it in every build.
 *
 * The front (kernels/backend.c) validates every argument against the contracts in
 * include/ganglion/kernels.h (NULLs, zero and overflowing sizes, int-sized GEMM
 * dimensions) and then calls the entry of the handle's backend, whatever the backend is;
 * an entry that is NULL answers GANG_ENOSYS. So an entry may assume non-NULL pointers and
 * consistent, non-zero sizes. The front never dereferences a tensor pointer: values that
 * need checking (rope's positions, embedding's ids) are checked by the backend, which
 * knows where its tensors live. Every entry takes the handle's state first (ctx: what
 * open returned; NULL for a backend without open). Entries return 0 or a negative GANG_E*.
 */
#ifndef GANGLION_KERNELS_BACKEND_H
#define GANGLION_KERNELS_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "ganglion/kernels.h"

typedef struct gang__kernels_backend {
    const char *name; /* device name accepted by gang_kernels_open() */
    uint32_t caps;    /* GANG_KERNELS_CAP_* of include/ganglion/kernels.h */
    /* Handle state: open validates the options that concern it and probes the device;
     * NULL when there is nothing to open (ctx is then NULL). */
    int (*open)(const gang_kernels_options *o, void **ctx);
    void (*close)(void *ctx);
    /* Optional: new launch choices (gang_kernels_retune); NULL: the backend has none. */
    int (*retune)(void *ctx, const gang_kernels_options *o);

    /* Tensor memory (bytes > 0 for all but sync; dst != src for copies). */
    int (*alloc)(void *ctx, size_t bytes, void **out);
    int (*free)(void *ctx, void *p); /* GANG_EINVAL: not a live allocation */
    int (*upload)(void *ctx, void *dst, const void *src, size_t bytes);
    /* Optional: upload without a host wait (NULL: the front calls upload). */
    int (*upload_async)(void *ctx, void *dst, const void *src, size_t bytes);
    int (*download)(void *ctx, void *dst, const void *src, size_t bytes);
    int (*copy)(void *ctx, void *dst, const void *src, size_t bytes);
    int (*copy_2d)(void *ctx, void *dst, size_t dpitch, const void *src, size_t spitch,
                   size_t width, size_t rows);
    /* Waits for the handle's work and makes its device current on the calling thread. */
    int (*sync)(void *ctx);
    /* The handle's queue of device work as an opaque pointer (cudaStream_t for "cuda"),
     * for gang_kernels_device_stream; NULL entry: the backend has none (host memory). */
    void *(*stream)(void *ctx);
    int (*pool_stats)(void *ctx, gang_kernels_pool_stats *out); /* out is zeroed */

    /* Operations. */
    int (*gemm)(void *ctx, gang_dtype dt, int trans_b, size_t m, size_t n, size_t kdim, float alpha,
                const void *a, const void *b, float beta, void *c);
    int (*convert)(void *ctx, gang_dtype from, const void *src, gang_dtype to, void *dst, size_t n);
    /* One timed round of the GEMM benchmark (kernels-bench.h); NULL without a peer. */
    int (*gemm_pair)(void *ctx, gang_dtype dt, int trans_b, size_t m, size_t n, size_t kdim,
                     const void *a, const void *b, void *c_ours, void *c_ref, float *ours_ms,
                     float *ref_ms);
    int (*rmsnorm)(void *ctx, const float *x, const float *w, float eps, size_t rows, size_t dim,
                   float *out);
    int (*rope)(void *ctx, float *x, const int32_t *positions, size_t tokens, size_t heads,
                size_t head_dim, const float *inv_freq, float scale);
    int (*softmax)(void *ctx, float *x, size_t rows, size_t cols);
    int (*attention)(void *ctx, const float *q, const void *kc, const void *vc,
                     const gang_kernels_kv_pages *pages, size_t tq, size_t tk, size_t n_heads,
                     size_t n_kv_heads, size_t head_dim, size_t pos0, size_t window, float *out);
    /* Optional: every sequence at once (gang_kernels_attention_batch); NULL: the front calls
     * attention once per sequence. */
    int (*attention_batch)(void *ctx, const gang_kernels_attn_seq *seqs, size_t n_seq,
                           size_t n_heads, size_t n_kv_heads, size_t head_dim, size_t window);
    int (*silu_mul)(void *ctx, const float *gate, const float *up, size_t n, float *out);
    int (*gelu_mul)(void *ctx, const float *gate, const float *up, size_t n, float *out);
    int (*scale)(void *ctx, float *x, float a, size_t n);
    /* y = x . W^T over a typed weight (gang_kernels_matmul); F32 weights reach it only when
     * matmul_f32 is set, else the front sends them to gemm (when the backend has one). */
    int (*matmul)(void *ctx, size_t m, size_t n, size_t kdim, const float *x,
                  const gang_kernels_weight *w, float *y);
    int matmul_f32; /* 1: matmul takes F32 weights itself (the CPU: its own kernels) */
    /* Optional: several weights of one x (gang_kernels_matmul_n, weights the front checked);
     * NULL: the front calls matmul once per weight. */
    int (*matmul_n)(void *ctx, size_t m, size_t kdim, const float *x, size_t count,
                    const gang_kernels_weight *w, const size_t *n, float *const *y);
    int (*embedding)(void *ctx, const gang_kernels_weight *table, size_t vocab, size_t dim,
                     const int32_t *ids, size_t n_ids, float *out);
    int (*add)(void *ctx, float *x, const float *y, size_t n);
    int (*add_rows)(void *ctx, float *x, const float *bias, size_t rows, size_t cols);
    int (*argmax)(void *ctx, const float *x, size_t rows, size_t cols, int32_t *out);
    /* The decode step's operations (gang_kernels_attention_step, _scatter_i32, _sample). */
    int (*attention_step)(void *ctx, const gang_kernels_step_kv *kv, const float *knew,
                          const float *vnew, const float *q, size_t tokens, size_t n_heads,
                          size_t n_kv_heads, size_t head_dim, size_t window, float *out);
    int (*scatter_i32)(void *ctx, int32_t *dst, size_t dst_n, const int32_t *pairs, size_t n_pairs);
    int (*sample)(void *ctx, const float *logits, size_t rows, size_t cols,
                  const gang_kernels_sample_param *params, int32_t *out);
    /* Optional graphs (gang_kernels_graph_*): the graph is the backend's opaque object. */
    int (*graph_begin)(void *ctx);
    int (*graph_end)(void *ctx, void **graph);
    int (*graph_launch)(void *ctx, void *graph);
    void (*graph_free)(void *ctx, void *graph);
    /* The fused projections' helpers (gang_kernels_split_cols3, gang_kernels_glu). */
    int (*split_cols3)(void *ctx, const float *x, size_t rows, size_t w0, size_t w1, size_t w2,
                       float *o0, float *o1, float *o2);
    int (*glu)(void *ctx, int gelu, const float *x, size_t rows, size_t cols, float *out);
    /* The decode step's fusions (gang_kernels_split_qkv_rope, gang_kernels_add_rmsnorm). */
    int (*split_qkv_rope)(void *ctx, const gang_kernels_qkv_rope *a);
    int (*add_rmsnorm)(void *ctx, float *x, const float *y, const float *w, float eps, size_t rows,
                       size_t dim, float *out);
    /* Optional (gang_kernels_matmul_glu; NULL: the front calls glu then matmul). Never
     * given F32 weights unless matmul_f32 is set. */
    int (*matmul_glu)(void *ctx, int gelu, size_t m, size_t n, size_t kdim, const float *gu,
                      const gang_kernels_weight *w, float *scratch, float *y);
    /* Optional (gang_kernels_matmul_fused and _to_glu; NULL: GANG_ENOSYS). The front has
     * checked f and the sizes; never given F32 weights unless matmul_f32 is set. With
     * glu_out: GANG_ENOSYS, having done nothing, where no kernel of the backend fuses these
     * sizes and storage; every other f is done, by separate kernels where need be. */
    int (*matmul_fused)(void *ctx, size_t m, size_t n, size_t kdim, const float *x,
                        const gang_kernels_weight *w, const gang_kernels_fusion *f, float *scratch,
                        float *y);
    /* Optional kernel traces (gang_kernels_trace_*; NULL: the front refuses options.trace
     * with GANG_ENOSYS). The front keeps the span state (begin / end alternate, only on a
     * handle opened with trace) and zeroes *out; collect waits for the handle's work. */
    int (*trace_begin)(void *ctx);
    int (*trace_end)(void *ctx);
    int (*trace_collect)(void *ctx, gang_kernels_trace *out);
} gang__kernels_backend;

/* A handle: its backend's static vtable and the backend's per-handle state (the front's:
 * kernels/backend.c, kernels/backend-step.c). */
struct gang_kernels {
    const gang__kernels_backend *be;
    void *ctx;                 /* what be->open returned; NULL for a backend without open */
    gang_kernels_counters cnt; /* gang_kernels_counters_get */
    int capturing;             /* between graph_begin and graph_end */
    int capture_broken;        /* a host wait was refused during the capture */
    int traced;                /* opened with options.trace */
    int span_open;             /* between gang_kernels_trace_begin and _end */
};

/* The front's shared checks (kernels/backend.c). elems: *out = a * b elements, GANG_ERANGE
 * when an f32 buffer of them could not be addressed; elems3 likewise for a * b * c;
 * norm_check: an RMSNorm's arguments (gang_kernels_rmsnorm's contract), 0, GANG_EINVAL or
 * GANG_ERANGE. */
int gang__kernels_elems(size_t a, size_t b, size_t *out);
int gang__kernels_elems3(size_t a, size_t b, size_t c, size_t *out);
int gang__kernels_norm_check(const float *x, const float *w, const float *out, float eps,
                             size_t rows, size_t dim);

/* The backends (kernels/cpu/cpu-backend.c, kernels/cuda/cuda-backend.c). The CUDA table
 * is defined only when the CUDA kernels are built; backend.c registers a stub otherwise. */
extern const gang__kernels_backend gang__kernels_cpu_backend;
extern const gang__kernels_backend gang__kernels_cuda_backend;
/* The fake device (kernels/fake/fake-backend.c), built in every configuration. */
extern const gang__kernels_backend gang__kernels_fake_backend;

/* The backend state of k when k is a handle of be, else NULL (for backend-private
 * queries such as the fake device's counters). */
void *gang__kernels_ctx_of(gang_kernels *k, const gang__kernels_backend *be);

#endif /* GANGLION_KERNELS_BACKEND_H */
