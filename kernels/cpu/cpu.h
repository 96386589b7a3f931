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

#include "ganglion/kernels.h"

/* cpu-gemm.c */
int gang__cpu_gemm(int trans_b, size_t m, size_t n, size_t kdim, float alpha, const float *a,
                   const float *b, float beta, float *c);

/* cpu-ops.c */
int gang__cpu_rmsnorm(const float *x, const float *w, float eps, size_t rows, size_t dim,
                      float *out);
int gang__cpu_rope(float *x, const int32_t *positions, size_t tokens, size_t heads, size_t head_dim,
                   const float *inv_freq, float scale);
int gang__cpu_softmax(float *x, size_t rows, size_t cols);
int gang__cpu_silu_mul(const float *gate, const float *up, size_t n, float *out);
int gang__cpu_gelu_mul(const float *gate, const float *up, size_t n, float *out);
int gang__cpu_scale(float *x, float a, size_t n);
int gang__cpu_embedding(const float *table, size_t vocab, size_t dim, const int32_t *ids,
                        size_t n_ids, float *out);
int gang__cpu_add(float *x, const float *y, size_t n);
int gang__cpu_add_rows(float *x, const float *bias, size_t rows, size_t cols);
int gang__cpu_argmax(const float *x, size_t rows, size_t cols, int32_t *out);

/* cpu-attention.c */
/* pages NULL: contiguous cache; else rows through its block table (gang_kernels_kv_pages). */
int gang__cpu_attention(const float *q, const void *kc, const void *vc,
                        const gang_kernels_kv_pages *pages, size_t tq, size_t tk, size_t n_heads,
                        size_t n_kv_heads, size_t head_dim, size_t pos0, size_t window, float *out);

#endif /* GANGLION_KERNELS_CPU_H */
