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

/* cpu-blas.c: OpenBLAS through dlopen (only cblas_sgemm is used). */
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
/*
 * One attempt: soname through dlopen's search, then dir/soname. The library stays loaded.
 * 0 with *out, or GANG_ENOENT with a log line naming what was tried. For tests.
 */
int gang__cpu_blas_open(const char *soname, const char *dir, gang__cpu_sgemm_fn *out);

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
