/*
 * Internal interface of the kernels module: the backend vtable and the CPU backend's
 * entries. Only kernels/ includes this file.
 *
 * The front (kernels/backend.c) validates every argument against the contracts in
 * include/ganglion/kernels.h before it calls an entry, so a backend may assume non-NULL
 * pointers and consistent, non-zero sizes that fit its index types. Entries return 0 or a
 * negative GANG_E* code, like the public functions.
 */
#ifndef GANGLION_KERNELS_CPU_H
#define GANGLION_KERNELS_CPU_H

#include <stddef.h>
#include <stdint.h>

#include "ganglion/kernels.h"

/* One backend. Entries other than name may be NULL; the front answers GANG_ENOSYS then. */
typedef struct gang__kernels_ops {
    const char *name; /* device name accepted by gang_kernels_open() */
    int (*init)(void); /* probes the device at open; NULL when there is nothing to probe */
    int (*gemm)(int trans_b, size_t m, size_t n, size_t kdim, float alpha, const float *a,
                const float *b, float beta, float *c);
    int (*rmsnorm)(const float *x, const float *w, float eps, size_t rows, size_t dim,
                   float *out);
    int (*rope)(float *x, const int32_t *positions, size_t tokens, size_t heads,
                size_t head_dim, float theta);
    int (*softmax)(float *x, size_t rows, size_t cols);
    int (*attention)(const float *q, const float *kc, const float *vc, size_t tq, size_t tk,
                     size_t n_heads, size_t n_kv_heads, size_t head_dim, size_t pos0,
                     float *out);
    int (*silu_mul)(const float *gate, const float *up, size_t n, float *out);
    int (*embedding)(const float *table, size_t vocab, size_t dim, const int32_t *ids,
                     size_t n_ids, float *out);
    int (*add)(float *x, const float *y, size_t n);
    int (*add_rows)(float *x, const float *bias, size_t rows, size_t cols);
    int (*argmax)(const float *x, size_t rows, size_t cols, int32_t *out);
} gang__kernels_ops;

/* cpu-gemm.c */
int gang__cpu_gemm(int trans_b, size_t m, size_t n, size_t kdim, float alpha, const float *a,
                   const float *b, float beta, float *c);

/* cpu-ops.c */
int gang__cpu_rmsnorm(const float *x, const float *w, float eps, size_t rows, size_t dim,
                      float *out);
int gang__cpu_rope(float *x, const int32_t *positions, size_t tokens, size_t heads,
                   size_t head_dim, float theta);
int gang__cpu_softmax(float *x, size_t rows, size_t cols);
int gang__cpu_silu_mul(const float *gate, const float *up, size_t n, float *out);
int gang__cpu_embedding(const float *table, size_t vocab, size_t dim, const int32_t *ids,
                        size_t n_ids, float *out);
int gang__cpu_add(float *x, const float *y, size_t n);
int gang__cpu_add_rows(float *x, const float *bias, size_t rows, size_t cols);
int gang__cpu_argmax(const float *x, size_t rows, size_t cols, int32_t *out);

/* cpu-attention.c */
int gang__cpu_attention(const float *q, const float *kc, const float *vc, size_t tq, size_t tk,
                        size_t n_heads, size_t n_kv_heads, size_t head_dim, size_t pos0,
                        float *out);

#endif /* GANGLION_KERNELS_CPU_H */
