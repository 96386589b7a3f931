/*
 * Internal interface between the kernels front (kernels/backend.c) and device backends.
 * No CUDA types: backend.c includes this file in every build, and only the registration
 * (#if GANG_HAVE_CUDA_KERNELS in backend.c) decides whether the real CUDA table exists.
 *
 * A device backend keeps per-handle state (stream, pool, cuBLASLt plans) behind ctx; every
 * entry takes it first. The front has validated sizes and pointers for NULL as for the
 * cpu backend, but it never dereferences a tensor pointer: ids, positions and the like
 * are device memory, and the backend validates their values on the device.
 */
#ifndef GANGLION_KERNELS_CUDA_BACKEND_H
#define GANGLION_KERNELS_CUDA_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "ganglion/kernels.h"

typedef struct gang__kernels_dev_ops {
    const char *name;
    int (*open)(const gang_kernels_options *o, void **ctx);
    void (*close)(void *ctx);
    int (*alloc)(void *ctx, size_t bytes, void **out);
    int (*free)(void *ctx, void *p);
    int (*upload)(void *ctx, void *dst, const void *src, size_t bytes);
    int (*download)(void *ctx, void *dst, const void *src, size_t bytes);
    int (*sync)(void *ctx);
    int (*pool_stats)(void *ctx, gang_kernels_pool_stats *out);
    int (*gemm)(void *ctx, gang_dtype dt, int trans_b, size_t m, size_t n, size_t kdim,
                float alpha, const void *a, const void *b, float beta, void *c);
    int (*convert)(void *ctx, gang_dtype from, const void *src, gang_dtype to,
                   void *dst, size_t n);
    int (*gemm_bench)(void *ctx, gang_dtype dt, int trans_b, size_t m, size_t n,
                      size_t kdim, int warmup, int iters, double *ours_ms, double *ref_ms,
                      double *max_rel_diff);
    int (*rmsnorm)(void *ctx, const float *x, const float *w, float eps, size_t rows, size_t dim,
                   float *out);
    int (*rope)(void *ctx, float *x, const int32_t *positions, size_t tokens, size_t heads,
                size_t head_dim, float theta);
    int (*softmax)(void *ctx, float *x, size_t rows, size_t cols);
    int (*attention)(void *ctx, const float *q, const float *kc, const float *vc, size_t tq,
                     size_t tk, size_t n_heads, size_t n_kv_heads, size_t head_dim, size_t pos0,
                     float *out);
    int (*silu_mul)(void *ctx, const float *gate, const float *up, size_t n, float *out);
    int (*embedding)(void *ctx, const float *table, size_t vocab, size_t dim, const int32_t *ids,
                     size_t n_ids, float *out);
    int (*add)(void *ctx, float *x, const float *y, size_t n);
    int (*add_rows)(void *ctx, float *x, const float *bias, size_t rows, size_t cols);
    int (*copy)(void *ctx, void *dst, const void *src, size_t bytes);
    int (*copy_2d)(void *ctx, void *dst, size_t dpitch, const void *src, size_t spitch,
                   size_t width, size_t rows);
    int (*argmax)(void *ctx, const float *x, size_t rows, size_t cols, int32_t *out);
} gang__kernels_dev_ops;

/* The CUDA backend's table (cuda-backend.c), defined only when the kernels are built. */
extern const gang__kernels_dev_ops gang__kernels_cuda_dev_ops;

/* Device discovery (cuda-device.c); the front answers for builds without CUDA. */
int gang__cuda_device_count(void);
int gang__cuda_device_info(int index, gang_device_info *out);
int gang__cuda_device_can_access_peer(int a, int b);

#endif
