/*
 * ganglion kernels module: the compute operations of a llama-family forward pass behind a
 * backend vtable (ggml / NCCL style). The "cpu" backend runs on host memory with OpenBLAS;
 * the "cuda" backend plugs into the same vtable and, while it is not built, answers
 * GANG_ENOSYS.
 *
 * No CUDA types appear here. Every tensor is a dense f32 array in row-major order (the last
 * dimension is contiguous); for the cpu backend the pointers are host pointers. Shapes are
 * given in element counts and must all be at least 1: an empty operation is a caller bug
 * and is refused with GANG_EINVAL rather than silently skipped.
 *
 * Every function returns 0 or a negative GANG_E* code: GANG_EINVAL for a NULL pointer, a
 * zero or inconsistent size, or an out-of-range index; GANG_ERANGE for a size the backend
 * cannot address (OpenBLAS takes int dimensions); GANG_ENOMEM when scratch memory cannot be
 * allocated; GANG_ENOSYS for an operation the backend does not provide. On error the
 * output buffers are left untouched unless the contract says otherwise.
 *
 * Threads: a handle is not synchronised. Use one handle per thread, or serialise calls.
 */
#ifndef GANGLION_KERNELS_H
#define GANGLION_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "ganglion/common.h"

/* Opaque handle on one kernel backend, allocated by gang_kernels_open(). */
typedef struct gang_kernels gang_kernels;

/*
 * Opens a kernel backend. device is "cpu", "cuda" or "auto" ("auto" picks "cpu" until the
 * CUDA kernels exist). On success *out receives a handle that the caller releases with
 * gang_kernels_close(). Returns GANG_EINVAL for a NULL argument or an unknown device name,
 * GANG_ENOSYS (with a log line naming the device) when the backend is not built into this
 * binary, GANG_ENOMEM when the handle cannot be allocated. *out is set to NULL on error.
 */
int gang_kernels_open(const char *device, gang_kernels **out);

/* Releases a handle from gang_kernels_open(). NULL is accepted and ignored. */
void gang_kernels_close(gang_kernels *k);

/* The backend's static name ("cpu"), valid for the life of the program; "?" for NULL. */
const char *gang_kernels_name(const gang_kernels *k);

/*
 * GEMM: C[m,n] = alpha * A[m,k] . op(B) + beta * C[m,n].
 * trans_b == 0: B is [k,n]; trans_b != 0: B is stored [n,k] and used transposed, which is
 * how Hugging Face stores linear weights ([out_features, in_features]), so y = x . W^T is
 * gemm(trans_b = 1, m = tokens, n = out_features, k = in_features, A = x, B = W).
 * When beta == 0, C is not read (it may hold NaN or garbage), as in BLAS.
 * Aliasing: C must not overlap A or B. A and B may overlap each other.
 */
int gang_kernels_gemm(gang_kernels *k, int trans_b, size_t m, size_t n, size_t kdim,
                      float alpha, const float *a, const float *b, float beta, float *c);

/*
 * RMSNorm as in Hugging Face Llama: out[r,:] = x[r,:] * rsqrt(mean(x[r,:]^2) + eps) * w[:].
 * x and out are [rows, dim], w is [dim]. The mean of squares is accumulated in double so
 * that long rows of large activations keep their precision. eps must be finite and >= 0.
 * Aliasing: out may be x exactly (in place); no other overlap is allowed.
 */
int gang_kernels_rmsnorm(gang_kernels *k, const float *x, const float *w, float eps,
                         size_t rows, size_t dim, float *out);

/*
 * Rotary position embedding, applied in place to x laid out [tokens, heads, head_dim]; token
 * t is rotated by the angle positions[t] * theta^(-2i/head_dim) for pair i. The pairs follow
 * Hugging Face's "rotate_half" convention: element i is paired with element i + head_dim/2
 * (not the interleaved GPT-J pairs 2i, 2i+1):
 *   x'[i]        = x[i] * cos - x[i + h/2] * sin
 *   x'[i + h/2]  = x[i + h/2] * cos + x[i] * sin
 * head_dim must be even, positions[] (length tokens) must be >= 0, theta > 0 and finite.
 * Angles are computed in double, so large positions keep their accuracy.
 */
int gang_kernels_rope(gang_kernels *k, float *x, const int32_t *positions, size_t tokens,
                      size_t heads, size_t head_dim, float theta);

/*
 * Softmax over each row of x [rows, cols], in place: subtracts the row maximum before
 * exponentiating (numerically stable) and sums in double. Entries of -INFINITY get weight
 * 0; a row that is entirely -INFINITY becomes all zeros rather than NaN.
 */
int gang_kernels_softmax(gang_kernels *k, float *x, size_t rows, size_t cols);

/*
 * Causal scaled-dot-product attention with grouped-query heads, for prefill (tq > 1) and
 * decode (tq == 1) alike.
 *   q      [tq, n_heads, head_dim]     queries of the tokens at absolute positions pos0+i
 *   kc, vc [tk, n_kv_heads, head_dim]  key / value cache holding positions 0 .. tk-1
 *   out    [tq, n_heads, head_dim]
 * Query i attends to keys 0 .. pos0+i (inclusive) with scale 1/sqrt(head_dim); cache rows
 * beyond that are never read, so a cache may be allocated larger than it is filled.
 * Head h reads kv head h / (n_heads / n_kv_heads); n_kv_heads must divide n_heads and
 * pos0 + tq must be <= tk.
 * Aliasing: out may be q exactly (each output row is written after its query row was
 * read); out must not overlap kc or vc.
 */
int gang_kernels_attention(gang_kernels *k, const float *q, const float *kc, const float *vc,
                           size_t tq, size_t tk, size_t n_heads, size_t n_kv_heads,
                           size_t head_dim, size_t pos0, float *out);

/*
 * SwiGLU gate: out[i] = silu(gate[i]) * up[i] with silu(x) = x / (1 + exp(-x)), n elements.
 * Aliasing: out may be gate or up exactly.
 */
int gang_kernels_silu_mul(gang_kernels *k, const float *gate, const float *up, size_t n,
                          float *out);

/*
 * Embedding lookup: out[t,:] = table[ids[t],:] for t < n_ids; table is [vocab, dim]. Every
 * id is checked before anything is written: an id < 0 or >= vocab returns GANG_EINVAL and
 * leaves out untouched. out must not overlap table.
 */
int gang_kernels_embedding(gang_kernels *k, const float *table, size_t vocab, size_t dim,
                           const int32_t *ids, size_t n_ids, float *out);

/* Residual add in place: x[i] += y[i] for i < n. y may be x exactly (doubling). */
int gang_kernels_add(gang_kernels *k, float *x, const float *y, size_t n);

/*
 * Greedy sampling: out[r] = the index of the largest value of row r of x [rows, cols]. On
 * ties the lowest index wins, so results do not depend on the backend's reduction order.
 * NaN entries are ignored; a row that is entirely NaN yields 0. cols must be <= INT32_MAX.
 */
int gang_kernels_argmax(gang_kernels *k, const float *x, size_t rows, size_t cols,
                        int32_t *out);

/* ---------------------------------------------------------------------------------
 * Dtype conversion (host memory, independent of the backend). Safetensors checkpoints
 * store F16 and BF16 weights; the kernels compute in f32.
 *   f16 -> f32 and bf16 -> f32 are exact (subnormals, infinities and NaN payloads kept).
 *   f32 -> f16 and f32 -> bf16 round to nearest, ties to even; values beyond the f16
 *   range become infinity; NaN stays a (quiet) NaN with its sign.
 * --------------------------------------------------------------------------------- */
float gang_f16_to_f32(uint16_t h);
uint16_t gang_f32_to_f16(float f);
float gang_bf16_to_f32(uint16_t h);
uint16_t gang_f32_to_bf16(float f);

/* Array forms of the above: n elements from src to dst, which must not overlap. Return 0,
 * or GANG_EINVAL for a NULL pointer with n > 0. */
int gang_f16_to_f32_array(const uint16_t *src, float *dst, size_t n);
int gang_f32_to_f16_array(const float *src, uint16_t *dst, size_t n);
int gang_bf16_to_f32_array(const uint16_t *src, float *dst, size_t n);
int gang_f32_to_bf16_array(const float *src, uint16_t *dst, size_t n);

#endif /* GANGLION_KERNELS_H */
