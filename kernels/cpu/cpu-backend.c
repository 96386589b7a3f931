/*
 * The CPU backend's vtable: tensors are host memory (the heap, memmove), the arithmetic is
 * in cpu-gemm.c (OpenBLAS), cpu-ops.c and cpu-attention.c. The handle has no state, so
 * every entry ignores ctx. What the front cannot check without reading tensor memory (a
 * negative position, an id outside the vocabulary) is checked here, before anything is
 * written.
 */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "../kernels-backend.h"
#include "cpu.h"

/* -1 until the first gang__cpu_simd decides it (a relaxed atomic: every thread that races
 * on the first call stores the same answer). */
static atomic_int cpu_simd = -1;

int gang__cpu_simd(void)
{
    int s = atomic_load_explicit(&cpu_simd, memory_order_relaxed);

    if (s < 0) {
        s = gang__cpu_avx512_usable() ? 2 : gang__cpu_avx2_usable();
        atomic_store_explicit(&cpu_simd, s, memory_order_relaxed);
    }
    return s;
}

void gang__cpu_simd_force(int simd)
{
    atomic_store_explicit(&cpu_simd, simd < 0 ? -1 : simd, memory_order_relaxed);
}

/* Tensors are 256-byte aligned, like the device pool's, so code tested on the CPU keeps
 * the alignment it will get on a GPU. */
static int cpu_alloc(void *ctx, size_t bytes, void **out)
{
    void *p;

    (void)ctx;
    if (bytes > SIZE_MAX - 255)
        return GANG_ERANGE;
    p = aligned_alloc(256, (bytes + 255) / 256 * 256);
    if (p == NULL)
        return GANG_ENOMEM;
    *out = p;
    return 0;
}

static int cpu_free(void *ctx, void *p)
{
    (void)ctx;
    free(p);
    return 0;
}

/* upload, download and copy are all one host memmove (dst and src may overlap). */
static int cpu_move(void *ctx, void *dst, const void *src, size_t bytes)
{
    (void)ctx;
    memmove(dst, src, bytes);
    return 0;
}

static int cpu_copy_2d(void *ctx, void *dst, size_t dpitch, const void *src, size_t spitch,
                       size_t width, size_t rows)
{
    (void)ctx;
    for (size_t r = 0; r < rows; r++)
        memmove((char *)dst + r * dpitch, (const char *)src + r * spitch, width);
    return 0;
}

/* Host work is synchronous: nothing to wait for, no device to bind. */
static int cpu_sync(void *ctx)
{
    (void)ctx;
    return 0;
}

/* No pool: the front has zeroed out. */
static int cpu_pool_stats(void *ctx, gang_kernels_pool_stats *out)
{
    (void)ctx;
    (void)out;
    return 0;
}

/* f32 only (OpenBLAS sgemm); half-precision GEMM is a device capability. */
static int cpu_gemm(void *ctx, gang_dtype dt, int trans_b, size_t m, size_t n, size_t kdim,
                    float alpha, const void *a, const void *b, float beta, void *c)
{
    (void)ctx;
    if (dt != GANG_DTYPE_F32)
        return GANG_ENOSYS;
    return gang__cpu_gemm(trans_b, m, n, kdim, alpha, a, b, beta, c);
}

/* Host conversion through f32 with the module's rounding. */
static float cpu_load(const void *p, gang_dtype dt, size_t i)
{
    if (dt == GANG_DTYPE_F16)
        return gang_f16_to_f32(((const uint16_t *)p)[i]);
    if (dt == GANG_DTYPE_BF16)
        return gang_bf16_to_f32(((const uint16_t *)p)[i]);
    return ((const float *)p)[i];
}

static void cpu_store(void *p, gang_dtype dt, size_t i, float v)
{
    if (dt == GANG_DTYPE_F16)
        ((uint16_t *)p)[i] = gang_f32_to_f16(v);
    else if (dt == GANG_DTYPE_BF16)
        ((uint16_t *)p)[i] = gang_f32_to_bf16(v);
    else
        ((float *)p)[i] = v;
}

static int cpu_convert(void *ctx, gang_dtype from, const void *src, gang_dtype to, void *dst,
                       size_t n)
{
    (void)ctx;
    if (from == to) {
        memmove(dst, src, n * gang_dtype_size(from));
        return 0;
    }
    for (size_t i = 0; i < n; i++)
        cpu_store(dst, to, i, cpu_load(src, from, i));
    return 0;
}

static int cpu_rmsnorm(void *ctx, const float *x, const float *w, float eps, size_t rows,
                       size_t dim, float *out)
{
    (void)ctx;
    return gang__cpu_rmsnorm(x, w, eps, rows, dim, out);
}

static int cpu_rope(void *ctx, float *x, const int32_t *positions, size_t tokens, size_t heads,
                    size_t head_dim, const float *inv_freq, float scale)
{
    (void)ctx;
    for (size_t t = 0; t < tokens; t++)
        if (positions[t] < 0)
            return GANG_EINVAL;
    return gang__cpu_rope(x, positions, tokens, heads, head_dim, inv_freq, scale);
}

static int cpu_softmax(void *ctx, float *x, size_t rows, size_t cols)
{
    (void)ctx;
    return gang__cpu_softmax(x, rows, cols);
}

static int cpu_attention(void *ctx, const float *q, const void *kc, const void *vc,
                         const gang_kernels_kv_pages *pages, size_t tq, size_t tk, size_t n_heads,
                         size_t n_kv_heads, size_t head_dim, size_t pos0, size_t window, float *out)
{
    (void)ctx;
    return gang__cpu_attention(q, kc, vc, pages, tq, tk, n_heads, n_kv_heads, head_dim, pos0,
                               window, out);
}

static int cpu_attention_batch(void *ctx, const gang_kernels_attn_seq *seqs, size_t n_seq,
                               size_t n_heads, size_t n_kv_heads, size_t head_dim, size_t window)
{
    (void)ctx;
    return gang__cpu_attention_batch(seqs, n_seq, n_heads, n_kv_heads, head_dim, window);
}

static int cpu_silu_mul(void *ctx, const float *gate, const float *up, size_t n, float *out)
{
    (void)ctx;
    return gang__cpu_silu_mul(gate, up, n, out);
}

static int cpu_gelu_mul(void *ctx, const float *gate, const float *up, size_t n, float *out)
{
    (void)ctx;
    return gang__cpu_gelu_mul(gate, up, n, out);
}

static int cpu_scale(void *ctx, float *x, float a, size_t n)
{
    (void)ctx;
    return gang__cpu_scale(x, a, n);
}

static int cpu_matmul(void *ctx, size_t m, size_t n, size_t kdim, const float *x,
                      const gang_kernels_weight *w, float *y)
{
    (void)ctx;
    return gang__cpu_matmul(m, n, kdim, x, w, y);
}

static int cpu_matmul_n(void *ctx, size_t m, size_t kdim, const float *x, size_t count,
                        const gang_kernels_weight *w, const size_t *n, float *const *y)
{
    (void)ctx;
    return gang__cpu_matmul_n(m, kdim, x, count, w, n, y);
}

/* Every id is checked before the first row is copied: nothing is written on a bad id. */
static int cpu_embedding(void *ctx, const gang_kernels_weight *table, size_t vocab, size_t dim,
                         const int32_t *ids, size_t n_ids, float *out)
{
    (void)ctx;
    for (size_t t = 0; t < n_ids; t++) {
        if (ids[t] < 0 || (size_t)ids[t] >= vocab) {
            gang_debug("kernels: token id %d at index %zu is outside the vocabulary (%zu)",
                       (int)ids[t], t, vocab);
            return GANG_EINVAL;
        }
    }
    if (table->type == GANG_KW_F32)
        return gang__cpu_embedding(table->data, vocab, dim, ids, n_ids, out);
    return gang__cpu_embedding_w(table, dim, ids, n_ids, out);
}

static int cpu_add(void *ctx, float *x, const float *y, size_t n)
{
    (void)ctx;
    return gang__cpu_add(x, y, n);
}

static int cpu_add_rows(void *ctx, float *x, const float *bias, size_t rows, size_t cols)
{
    (void)ctx;
    return gang__cpu_add_rows(x, bias, rows, cols);
}

static int cpu_argmax(void *ctx, const float *x, size_t rows, size_t cols, int32_t *out)
{
    (void)ctx;
    return gang__cpu_argmax(x, rows, cols, out);
}

static int cpu_attention_step(void *ctx, const gang_kernels_step_kv *kv, const float *knew,
                              const float *vnew, const float *q, size_t tokens, size_t n_heads,
                              size_t n_kv_heads, size_t head_dim, size_t window, float *out)
{
    (void)ctx;
    return gang__cpu_attention_step(kv, knew, vnew, q, tokens, n_heads, n_kv_heads, head_dim,
                                    window, out);
}

static int cpu_scatter_i32(void *ctx, int32_t *dst, size_t dst_n, const int32_t *pairs,
                           size_t n_pairs)
{
    (void)ctx;
    return gang__cpu_scatter_i32(dst, dst_n, pairs, n_pairs);
}

static int cpu_sample(void *ctx, const float *logits, size_t rows, size_t cols,
                      const gang_kernels_sample_param *params, int32_t *out)
{
    (void)ctx;
    return gang__cpu_sample(logits, rows, cols, params, out);
}

static int cpu_split_cols3(void *ctx, const float *x, size_t rows, size_t w0, size_t w1, size_t w2,
                           float *o0, float *o1, float *o2)
{
    (void)ctx;
    return gang__cpu_split_cols3(x, rows, w0, w1, w2, o0, o1, o2);
}

static int cpu_glu(void *ctx, int gelu, const float *x, size_t rows, size_t cols, float *out)
{
    (void)ctx;
    return gang__cpu_glu(gelu, x, rows, cols, out);
}

static int cpu_split_qkv_rope(void *ctx, const gang_kernels_qkv_rope *a)
{
    (void)ctx;
    return gang__cpu_split_qkv_rope(a);
}

static int cpu_add_rmsnorm(void *ctx, float *x, const float *y, const float *w, float eps,
                           size_t rows, size_t dim, float *out)
{
    (void)ctx;
    return gang__cpu_add_rmsnorm(x, y, w, eps, rows, dim, out);
}

/* No per-handle state; opening one loads OpenBLAS, so a missing library fails here, once,
 * with its log line, rather than at the first GEMM. */
static int cpu_open(const gang_kernels_options *o, void **ctx)
{
    (void)o;
    *ctx = NULL;
    return gang__cpu_blas_load(NULL);
}

const gang__kernels_backend gang__kernels_cpu_backend = {
    .name = "cpu",
    .caps = GANG_KERNELS_CAP_HOST_MEM,
    .open = cpu_open,
    .close = NULL,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .upload = cpu_move,
    .upload_async = cpu_move,
    .download = cpu_move,
    .copy = cpu_move,
    .copy_2d = cpu_copy_2d,
    .sync = cpu_sync,
    .pool_stats = cpu_pool_stats,
    .gemm = cpu_gemm,
    .convert = cpu_convert,
    .rmsnorm = cpu_rmsnorm,
    .rope = cpu_rope,
    .softmax = cpu_softmax,
    .attention = cpu_attention,
    .attention_batch = cpu_attention_batch,
    .silu_mul = cpu_silu_mul,
    .gelu_mul = cpu_gelu_mul,
    .scale = cpu_scale,
    .matmul = cpu_matmul,
    .matmul_f32 = 1,
    .matmul_n = cpu_matmul_n,
    .embedding = cpu_embedding,
    .add = cpu_add,
    .add_rows = cpu_add_rows,
    .argmax = cpu_argmax,
    .attention_step = cpu_attention_step,
    .scatter_i32 = cpu_scatter_i32,
    .sample = cpu_sample,
    .split_cols3 = cpu_split_cols3,
    .glu = cpu_glu,
    .split_qkv_rope = cpu_split_qkv_rope,
    .add_rmsnorm = cpu_add_rmsnorm,
};
