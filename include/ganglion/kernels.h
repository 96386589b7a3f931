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
/* Host memory for weights that live as long as their model (gang_kernels_arena_new). */
typedef struct gang_kernels_arena gang_kernels_arena;

/*
 * Opens a kernel backend. device is "cpu", "cuda", "auto" ("auto" picks "cpu" until the
 * CUDA kernels exist) or "fake": a test device, built everywhere, that computes with the
 * CPU kernels on memory the host cannot read (a device pointer dereferenced on the host
 * faults) and aborts the process when a host pointer reaches one of its operations, so
 * that the engine's host/device boundary is tested without a GPU (kernels/fake/). On success *out
 * receives a handle that the caller releases with gang_kernels_close(). Returns GANG_EINVAL for a
 * NULL argument or an unknown device name, GANG_ENOSYS (with a log line naming the device) when the
 * backend is not built into this binary, GANG_ENOMEM when the handle cannot be allocated. *out is
 * set to NULL on error.
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
int gang_kernels_gemm(gang_kernels *k, int trans_b, size_t m, size_t n, size_t kdim, float alpha,
                      const float *a, const float *b, float beta, float *c);

/*
 * Typed weights (issue #13): a linear weight [n, kdim] (Hugging Face's [out, in], row-major)
 * kept in its own storage, so that a decode step streams half (bf16, f16) or a quarter
 * (int8) of the f32 bytes. Activations stay f32 and every product is accumulated in f32.
 *   GANG_KW_F32   f32 elements (the OpenBLAS / cuBLAS f32 path);
 *   GANG_KW_BF16  bfloat16 elements (converted exactly to f32 in the kernel);
 *   GANG_KW_F16   IEEE half elements (exactly to f32);
 *   GANG_KW_I8    weight-only int8: q[o, i] in [-127, 127] and one f32 scale per output
 *                 row o, w[o, i] = scales[o] * q[o, i] (symmetric, per output channel).
 * A weight lives in one tensor allocation of gang_kernels_weight_bytes(type, n, kdim)
 * bytes (the "packed" form that loaders and the model hold): the elements row-major, and
 * for I8 the n scales after them at byte offset GANG_KW_SCALES_OFFSET(n * kdim).
 *
 * Block types (issue #27): a GGUF file's own quantized blocks, kept as they lie in the
 * file. Each row of kdim elements is kdim / E consecutive blocks of B bytes (kdim must be
 * a multiple of E), rows one after the other, no scales array:
 *   GANG_KW_Q8_0  E 32,  B 34    GANG_KW_Q4_0  E 32, B 18    GANG_KW_Q4_1  E 32, B 20
 *   GANG_KW_Q5_0  E 32,  B 22    GANG_KW_Q5_1  E 32, B 24    GANG_KW_Q4_K  E 256, B 144
 *   GANG_KW_Q5_K  E 256, B 176   GANG_KW_Q6_K  E 256, B 210   GANG_KW_IQ4_NL E 32, B 18
 *   GANG_KW_IQ4_XS E 256, B 136
 * (the layouts are described in kernels/weight-blocks.c). Their products quantize each
 * row of x per 32 elements to int8 with one f32 scale (max |x| / 127), as the formats'
 * integer dot products are defined, and accumulate the integer sums in int32 and the
 * scaled sums in f32.
 */
typedef enum gang_kernels_wtype {
    GANG_KW_F32 = 0,
    GANG_KW_BF16 = 1,
    GANG_KW_F16 = 2,
    GANG_KW_I8 = 3,
    GANG_KW_Q8_0 = 4,
    GANG_KW_Q4_0 = 5,
    GANG_KW_Q4_1 = 6,
    GANG_KW_Q5_0 = 7,
    GANG_KW_Q5_1 = 8,
    GANG_KW_Q4_K = 9,
    GANG_KW_Q5_K = 10,
    GANG_KW_Q6_K = 11,
    GANG_KW_IQ4_NL = 12,
    GANG_KW_IQ4_XS = 13
} gang_kernels_wtype;

#define GANG_KW_LAST GANG_KW_IQ4_XS

/* Bytes of one element of a weight of type t (its scales aside): 4, 2, 2 or 1; 0 for a
 * block type (gang_kernels_wtype_block). Inline, so that kernels instantiated per type
 * fold it to a constant. */
static inline size_t gang_kernels_wtype_size(gang_kernels_wtype t)
{
    return t == GANG_KW_F32 ? 4 : t == GANG_KW_I8 ? 1 : t <= GANG_KW_F16 ? 2 : 0;
}

/* 1 with *elems and *bytes of one block when t is a block type, else 0 (both untouched;
 * either pointer may be NULL). */
int gang_kernels_wtype_block(gang_kernels_wtype t, size_t *elems, size_t *bytes);

/* Bytes of one row of kdim elements of type t (for I8 without its scale); 0 for an
 * unknown type, a kdim that is not a whole number of blocks, or an overflow. */
size_t gang_kernels_weight_row_bytes(gang_kernels_wtype t, size_t kdim);

/*
 * Dequantizes n elements (a whole number of blocks) of the block type t at src into f32
 * dst, the formats' definition (weight-blocks.c): the reference the tests hold the
 * kernels to, and the embedding lookup of a block table. GANG_EINVAL for a type that is
 * not a block type or an n that is not a whole number of blocks.
 */
int gang_kernels_block_dequant(gang_kernels_wtype t, const void *src, size_t n, float *dst);

/*
 * The CPU kernels' own layout of a block weight [n, kdim] at src (the file's layout), made
 * once at load (issue #27): where the CPU runs the AVX-512 VNNI kernels (gang__cpu_simd level
 * 2) and t is Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K, IQ4_NL or IQ4_XS, a new
 * allocation (release with free()), or a piece of arena when one is given (released with
 * the arena, gang_kernels_arena_free), holding the blocks of 16 rows interleaved so that
 * one 512-bit vpdpbusd computes 16 rows' partial products (kernels/cpu/cpu-qrepack.c and
 * cpu-qrepack-k.c have the layout): about the same bytes as src (a 64-byte header, the last group
 * of 16 rows padded with zero rows, and Q4_K / Q5_K 4 more bytes a block for their scales
 * unpacked: 2.8% / 2.3%). The caller then frees or unmaps src and hands the new buffer, with the
 * same type and sizes, to gang_kernels_matmul, which recognises it. NULL (src stays the weight) for
 * another type or CPU, a kdim that is not a whole number of blocks, or when memory is out. A
 * repacked buffer is for gang_kernels_matmul with exactly these n and kdim (GANG_EINVAL otherwise)
 * and gang_kernels_embedding_w (a tied table: its rows rebuilt); not for
 * gang_kernels_block_dequant or views of some of its rows.
 */
void *gang_kernels_block_repack(gang_kernels_wtype t, const void *src, size_t n, size_t kdim,
                                gang_kernels_arena *arena);

#define GANG_KW_SCALES_OFFSET(elems) (((size_t)(elems) + 63u) / 64u * 64u)

/* A view of one packed weight: data points at the elements, scales (I8 only, else NULL)
 * at the per-row scales. Both are tensor memory of the handle that computes with it. */
typedef struct gang_kernels_weight {
    gang_kernels_wtype type;
    const void *data;
    const float *scales;
} gang_kernels_weight;

/* Bytes of a packed [n, kdim] weight of type t (0 for an unknown type or an overflow). */
size_t gang_kernels_weight_bytes(gang_kernels_wtype t, size_t n, size_t kdim);

/* The view of the packed weight at blob (tensor memory, not read): data = blob, and for
 * I8 scales = blob + GANG_KW_SCALES_OFFSET(n * kdim). */
gang_kernels_weight gang_kernels_weight_view(gang_kernels_wtype t, const void *blob, size_t n,
                                             size_t kdim);

/*
 * Host-side packing: converts the f32 matrix src [n, kdim] into the packed form of type t
 * at dst (host memory of gang_kernels_weight_bytes(t, n, kdim) bytes). BF16 / F16 round to
 * nearest even; I8 takes scales[o] = max_i |src[o, i]| / 127 (0 for an all-zero row, whose
 * q are all 0) and q = round(src / scale). Returns 0, or GANG_EINVAL for NULL, a zero size,
 * an unknown type, a non-finite element (I8), or a block type (those come from a file).
 * Large BF16 / F16 matrices are converted on several threads (gang_parallel_slices).
 */
int gang_kernels_weight_pack(gang_kernels_wtype t, const float *src, size_t n, size_t kdim,
                             void *dst);

/*
 * Host memory for packed weights that the CPU matmul streams, released with free(). A
 * block of 2 MiB or more starts on a 2 MiB boundary and its whole 2 MiB pieces are
 * advised MADV_HUGEPAGE (transparent huge pages in "madvise" mode; rounded up to the next
 * 2 MiB when that adds at most 1/16 of the size, so that a large matrix is covered to its
 * end): a decode step reads every weight once, and over 4 KiB pages that read paid a TLB
 * miss every 4 KiB (SmolLM2's bf16 step: 8-14% slower). Smaller blocks are 64-byte
 * aligned. The advice is best effort: where madvise fails or THP is off the memory is
 * ordinary pages and nothing is reported. Returns NULL for 0 bytes or when memory is out.
 * Callers pack several matrices into one block (a layer's seven: each is smaller than
 * 2 MiB in a small model) to give the advice something to cover.
 */
void *gang_kernels_weight_host_alloc(size_t bytes);

/*
 * An arena of host memory for weights that live as long as their model (kernels/weight.c):
 * 64-byte-aligned pieces cut in allocation order from regions of at least
 * GANG_KERNELS_ARENA_REGION bytes, each 2 MiB-aligned and advised MADV_HUGEPAGE as a whole,
 * released together by gang_kernels_arena_free (never one by one). Where the matrices are
 * each under 2 MiB (a small model's seven per layer) gang_kernels_weight_host_alloc leaves
 * them on 4 KiB pages, and a decode step that streams every weight once pays a TLB miss
 * every 4 KiB of them; in an arena a layer's matrices sit side by side on huge pages in the
 * order the step reads them. A region is mapped, not touched: its pages become resident as
 * pieces are written, so the arena holds what was asked plus at most the rest of the last
 * huge page of each region. gang_kernels_arena_new: NULL when memory is out.
 * gang_kernels_arena_alloc: NULL for 0 bytes, an overflow or when memory is out.
 * gang_kernels_arena_owns: 1 when p lies in one of a's pieces (a may be NULL: 0).
 */
#define GANG_KERNELS_ARENA_REGION ((size_t)32 << 20)
gang_kernels_arena *gang_kernels_arena_new(void);
void *gang_kernels_arena_alloc(gang_kernels_arena *a, size_t bytes);
int gang_kernels_arena_owns(const gang_kernels_arena *a, const void *p);
void gang_kernels_arena_free(gang_kernels_arena *a);

/* "f32", "bf16", "f16", "int8", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q4_k", "q5_k",
 * "q6_k" ("?" otherwise). */
const char *gang_kernels_wtype_name(gang_kernels_wtype t);

/*
 * y[m, n] = x[m, kdim] . W^T with W the typed weight w [n, kdim], f32 in and out,
 * products accumulated in f32 (the I8 scale applied once per output). For GANG_KW_F32 it
 * is gang_kernels_gemm(trans_b = 1, alpha 1, beta 0) up to summation order. y is written,
 * never read, and must not overlap x or the weight. CPU: vectorised kernels (AVX2 + FMA +
 * F16C when the CPU has them; without them OpenBLAS for f32 and portable C for the other
 * types) that read
 * each weight element once per call whatever m is, split over the rows of W on a small
 * pool of threads (kernels/cpu/cpu-matmul.c). CUDA: bf16 / f16 through cuBLASLt with x
 * converted to the weight's type and f32 output, I8 through a kernel that dequantizes on
 * the fly. The result agrees with the f32 GEMM on the dequantized weight up to f32
 * summation order (on the CPU within 2e-6 x (1 + log2 kdim) of sum |x w|, unit-kernels;
 * on CUDA bf16 / f16 also round x to the half type). Block types on the CPU: x quantized
 * per 32 elements to int8 (above), then integer block products
 * (kernels/cpu/cpu-qmatmul.c, portable and AVX2), so the result is the f32 product on
 * the dequantized weight within the activations' rounding: at most the sum over blocks
 * of (max |x| of the block / 254) x sum |w| of the block, plus f32 summation order. Block
 * types on CUDA (kernels/cuda/cuda-qmatmul.cu): m <= 8 dequantizes in registers and keeps
 * x in f32 (f32 summation order only); a larger m dequantizes W to bf16 and runs cuBLASLt
 * with x rounded to bf16 (within 2^-8 x sum |x w| plus summation order).
 * GANG_EINVAL for NULL, a zero size, an unknown type, an I8 weight without scales or a
 * kdim that is not a whole number of the type's blocks; GANG_ERANGE for sizes beyond int.
 */
int gang_kernels_matmul(gang_kernels *k, size_t m, size_t n, size_t kdim, const float *x,
                        const gang_kernels_weight *w, float *y);

/*
 * Several products of one x in one call: y[i] = x . w[i]^T for i < count, w[i] [n[i], kdim],
 * each y[i] exactly what gang_kernels_matmul(k, m, n[i], kdim, x, &w[i], y[i]) writes (the
 * same kernels on the same rows, to the bit). Why: the projections that read the same
 * activations (q, k and v; gate and up) share their preparation and their threads: on the
 * CPU, x is quantized once for block weights and every weight's rows are one job on the
 * pool, so a small matrix (SmolLM2's k and v: 192 rows) no longer runs on the caller alone.
 * Backends without their own version get count calls of gang_kernels_matmul. count is 1 ..
 * GANG_KERNELS_MATMUL_N_MAX; the outputs must not overlap x, the weights or each other.
 * Errors: gang_kernels_matmul's, for any of the weights (checked before anything runs).
 */
#define GANG_KERNELS_MATMUL_N_MAX 4
int gang_kernels_matmul_n(gang_kernels *k, size_t m, size_t kdim, const float *x, size_t count,
                          const gang_kernels_weight *w, const size_t *n, float *const *y);

/*
 * The MLP's down projection of a concatenated gate/up product in one call (issue #24):
 * y[m, n] = glu(gu) . W^T, where gu is [m, 2 kdim] (each row the gate's kdim columns then
 * up's) and glu(gu) [m, kdim] is what gang_kernels_glu(k, gelu, gu, m, kdim, ...) writes.
 * The numbers are those of gang_kernels_glu into scratch then gang_kernels_matmul of
 * scratch: a backend whose decode GEMV computes the gated unit as it stages x (CUDA, m <=
 * 8, bf16 / f16 / int8 / block weights) does so and leaves scratch alone; otherwise
 * scratch [m, kdim] receives the gated unit first (its contents are unspecified after
 * the call). One launch counted (gang_kernels_counters) either way on a backend that has
 * it; backends without it (the CPU) get the two calls. gu, scratch and y must not overlap
 * each other or the weight. Errors: gang_kernels_matmul's and gang_kernels_glu's.
 */
int gang_kernels_matmul_glu(gang_kernels *k, int gelu, size_t m, size_t n, size_t kdim,
                            const float *gu, const gang_kernels_weight *w, float *scratch,
                            float *y);

/*
 * The MLP's gated unit straight from its concatenated gate/up weight, in one launch where
 * the backend has a kernel for it (issue #24): y[m, ffn] = glu(x . W^T), W [2 ffn, kdim]
 * the gate's ffn rows then up's, glu what gang_kernels_glu(k, gelu, ...) writes of the
 * [m, 2 ffn] product gang_kernels_matmul would write: the same numbers, the product never
 * written. The CUDA decode GEMV does it (m <= 8; bf16 / f16 unless half_gemv is off, int8
 * with kdim a multiple of 16): a block pairs each gate row with its up row, so the down
 * product reads the unit instead of computing it again in each of its blocks
 * (gang_kernels_matmul_glu). GANG_ENOSYS, having done nothing, elsewhere (other backends,
 * more rows, other storage): the caller takes gang_kernels_matmul then
 * gang_kernels_matmul_glu. One launch counted when done. gang_kernels_matmul_fused with
 * glu_out gelu (and no other step) is the same call. y must not overlap x or the
 * weight. Errors: GANG_EINVAL for a NULL, an invalid weight or a zero size; GANG_ERANGE
 * for sizes past the index range; the backend's.
 */
int gang_kernels_matmul_to_glu(gang_kernels *k, int gelu, size_t m, size_t ffn, size_t kdim,
                               const float *x, const gang_kernels_weight *w, float *y);

/*
 * What a product's own launch does around it (gang_kernels_matmul_fused). The zero value
 * is not a plain product: glu_in and glu_out must be -1 for none.
 */
typedef struct gang_kernels_fusion {
    /* x [m, kdim] RMS-normed first with these [kdim] weights and eps, as gang_kernels_rmsnorm
     * computes it (NULL: x as it is) */
    const float *norm;
    float eps;
    /* -1, or 0 (SiLU) / 1 (GELU-tanh): x is [m, 2 kdim], each row the gate's kdim columns
     * then up's, and the product's input their gated unit (gang_kernels_matmul_glu); not
     * with norm */
    int glu_in;
    /* -1, or 0 / 1: W is [2 n, kdim], the gate's n rows then up's, and y [m, n] the gated unit
     * of the product (gang_kernels_matmul_to_glu); not with accumulate */
    int glu_out;
    /* 1: y += the product (a residual add, as gang_kernels_add adds); 0: y = the product */
    int accumulate;
} gang_kernels_fusion;

/*
 * y [m, n] = [y +] out(in(x) . W^T), in and out the steps f names (gang_kernels_fusion), in
 * one call: one launch counted, whatever the backend runs for it. The numbers are those of
 * the separate calls (gang_kernels_rmsnorm or gang_kernels_glu into scratch,
 * gang_kernels_matmul, gang_kernels_glu, gang_kernels_add). Why (issue #24): the decode
 * step's residual stream without a norm or an add kernel between its products, where the
 * CUDA decode GEMV (m <= 8; bf16 / f16 unless half_gemv is off, int8 with kdim a multiple
 * of 16) norms x as it stages it (rows that fit its tile at once with the norm's weights:
 * kdim <= 4096 at one row, 2048 at two or three, ...), computes either gated unit and adds
 * in its epilogue. For another
 * shape or storage the backend runs the separate kernels itself: scratch [m, kdim] (only
 * with norm or glu_in; NULL otherwise allowed) receives the normed or gated input, its
 * contents unspecified after the call. glu_out is only ever fused: where no kernel does
 * it, GANG_ENOSYS having written nothing but scratch (the caller writes the product and
 * lets the next product's glu_in take the unit). Backends without the call (the CPU): GANG_ENOSYS
 * for every f, having done nothing; the caller makes the separate calls. y must not overlap x,
 * scratch or the weight, nor scratch x. Errors: GANG_EINVAL for a NULL (scratch where needed), an
 * invalid weight, a zero size, a step value other than those above, norm with glu_in, glu_out with
 * accumulate, an eps gang_kernels_rmsnorm refuses; GANG_ERANGE for sizes past the index range; the
 * backend's.
 */
int gang_kernels_matmul_fused(gang_kernels *k, size_t m, size_t n, size_t kdim, const float *x,
                              const gang_kernels_weight *w, const gang_kernels_fusion *f,
                              float *scratch, float *y);

/*
 * gang_kernels_embedding over a typed table [vocab, dim] (I8: each row times its scale;
 * a block type: the row dequantized, gang_kernels_block_dequant): out[t, :] =
 * f32(table[ids[t], :]). Same checks and errors as gang_kernels_embedding, and
 * GANG_EINVAL for a dim that is not a whole number of blocks.
 */
int gang_kernels_embedding_w(gang_kernels *k, const gang_kernels_weight *table, size_t vocab,
                             size_t dim, const int32_t *ids, size_t n_ids, float *out);

/*
 * RMSNorm as in Hugging Face Llama: out[r,:] = x[r,:] * rsqrt(mean(x[r,:]^2) + eps) * w[:].
 * x and out are [rows, dim], w is [dim]. The mean of squares is accumulated in double so
 * that long rows of large activations keep their precision. eps must be finite and >= 0.
 * Aliasing: out may be x exactly (in place); no other overlap is allowed.
 */
int gang_kernels_rmsnorm(gang_kernels *k, const float *x, const float *w, float eps, size_t rows,
                         size_t dim, float *out);

/*
 * Rotary position embedding, applied in place to x laid out [tokens, heads, head_dim]; token
 * t is rotated by the angle positions[t] * inv_freq[i] for pair i, and both cos and sin
 * are multiplied by scale (YaRN's attention factor; 1 otherwise). inv_freq[head_dim/2] is
 * the model's inverse-frequency table (theta^(-2i/head_dim) for plain RoPE, rescaled by
 * the model's rope_scaling: gang_rope_inv_freq in model.h), computed once per model and
 * held in tensor memory of k (device memory on a device backend). The pairs follow
 * Hugging Face's "rotate_half" convention: element i is paired with element i + head_dim/2
 * (not the interleaved GPT-J pairs 2i, 2i+1):
 *   x'[i]        = scale * (x[i] * cos - x[i + h/2] * sin)
 *   x'[i + h/2]  = scale * (x[i + h/2] * cos + x[i] * sin)
 * head_dim must be even, positions[] (length tokens) must be >= 0, scale > 0 and finite.
 * Angles are computed in double from the f32 table, so large positions keep their
 * accuracy.
 */
int gang_kernels_rope(gang_kernels *k, float *x, const int32_t *positions, size_t tokens,
                      size_t heads, size_t head_dim, const float *inv_freq, float scale);

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
                           size_t tq, size_t tk, size_t n_heads, size_t n_kv_heads, size_t head_dim,
                           size_t pos0, float *out);
/*
 * gang_kernels_attention with a sliding window (Mistral v0.1, Qwen2 with
 * use_sliding_window): query i at position p = pos0 + i attends to the window keys
 * max(0, p + 1 - window) .. p, the current one included (transformers' semantics);
 * window 0 is no window. Keys before the window are never read.
 */
int gang_kernels_attention_window(gang_kernels *k, const float *q, const float *kc, const float *vc,
                                  size_t tq, size_t tk, size_t n_heads, size_t n_kv_heads,
                                  size_t head_dim, size_t pos0, size_t window, float *out);

/*
 * The layout of a paged key/value cache (engine/engine.c's block pool): kc and vc hold
 * n_blocks blocks of block_size rows [block_size, n_kv_heads, head_dim] each, elements
 * of dtype (F32, or BF16 / F16, read as f32), and position j of the sequence lives in
 * row j % block_size of block table[j / block_size].
 * table is tensor memory of the handle, with at least ceil(tk / block_size) entries, each
 * < n_blocks (the kernels trust it: the caller validated it when it built it).
 */
typedef struct gang_kernels_kv_pages {
    const int32_t *table; /* [ceil(tk / block_size)] block of each run of positions */
    size_t block_size;    /* positions per block, >= 1 */
    size_t n_blocks;      /* blocks kc and vc hold */
    gang_dtype dtype;     /* their elements: GANG_DTYPE_F32 (0), _BF16 or _F16 */
} gang_kernels_kv_pages;

/*
 * gang_kernels_attention_window over a paged cache: key / value row j is read through
 * pages (above) instead of at kc + j rows; the numbers are those of the contiguous call
 * with the same rows (the same operations in the same order). pages NULL is the
 * contiguous call (kc and vc f32 then). A half-precision pool is read as f32: the result
 * is the f32 call's on the rows rounded to that type. GANG_EINVAL also for a block_size
 * of 0, no table, no blocks or another dtype.
 */
int gang_kernels_attention_paged(gang_kernels *k, const float *q, const void *kc, const void *vc,
                                 const gang_kernels_kv_pages *pages, size_t tq, size_t tk,
                                 size_t n_heads, size_t n_kv_heads, size_t head_dim, size_t pos0,
                                 size_t window, float *out);

/* One sequence of gang_kernels_attention_batch: the arguments of one
 * gang_kernels_attention_paged call that the batch shares no value of. */
typedef struct gang_kernels_attn_seq {
    const float *q;                     /* [tq, n_heads, head_dim] */
    float *out;                         /* [tq, n_heads, head_dim]; may be q exactly */
    const void *kc, *vc;                /* its cache rows (contiguous f32) or the pool */
    const gang_kernels_kv_pages *pages; /* NULL: contiguous */
    size_t tq, tk, pos0;
} gang_kernels_attn_seq;

/*
 * The attention of every sequence of a batch step in one call: exactly (bit for bit)
 * gang_kernels_attention_paged(k, s->q, s->kc, s->vc, s->pages, s->tq, s->tk, n_heads,
 * n_kv_heads, head_dim, s->pos0, window, s->out) for each of the n_seq descriptors
 * (host memory), which a backend may run in any order or at once: one sequence's out must
 * not overlap another's q or out, nor any cache. The CPU backend shares the (query, kv
 * head) pairs of all of them among its threads; a backend without a batch entry runs the
 * calls one after the other. Every descriptor is validated first (nothing runs when one
 * is invalid): GANG_EINVAL / GANG_ERANGE as the single call, GANG_EINVAL for NULL seqs or
 * n_seq 0.
 */
int gang_kernels_attention_batch(gang_kernels *k, const gang_kernels_attn_seq *seqs, size_t n_seq,
                                 size_t n_heads, size_t n_kv_heads, size_t head_dim, size_t window);

/*
 * Where the sequences of a decode step keep their keys and values (the paged pools of
 * gang_kernels_kv_pages) and which rows the step's tokens are, all in tensor memory, so
 * that one call serves every sequence of the step without a descriptor per sequence:
 * token t is at position positions[t] of the sequence whose block table starts at
 * tables + table_rows[t] (the engine's slots' tables are rows of one array).
 */
typedef struct gang_kernels_step_kv {
    void *kc, *vc;             /* the pools: n_blocks blocks of [block_size, n_kv_heads,
                                  head_dim] elements of dtype */
    const int32_t *tables;     /* block tables, entries < n_blocks (trusted, as pages) */
    const int32_t *positions;  /* [tokens] each token's position, >= 0 */
    const int32_t *table_rows; /* [tokens] offset of its sequence's table in tables */
    size_t block_size;         /* positions per block, >= 1 */
    size_t n_blocks;           /* blocks of each pool */
    gang_dtype dtype;          /* F32, BF16 or F16 */
    size_t max_keys;           /* > every positions[t] (the sequences' context), or 0: lets a
                                  device split a long context's keys across blocks when the
                                  step has few tokens (CUDA: flash-decoding), which the
                                  launch must plan before the positions are known */
} gang_kernels_step_kv;

/*
 * The attention of a whole step with the KV append fused: for every token t, its key row
 * knew[t] and value row vnew[t] ([tokens, n_kv_heads, head_dim], f32) are stored at its
 * position (rounded to the pool's dtype), then every query row q[t] ([tokens, n_heads,
 * head_dim]) attends, as gang_kernels_attention_paged with window, to the keys 0 ..
 * positions[t] of its own sequence, and the result goes to out[t]. The numbers are those
 * of writing the rows and calling gang_kernels_attention_paged per sequence (same rows,
 * same order). A position below positions[t] must hold its key already or be written by
 * this call. Tokens of one sequence must have distinct positions. out may be q exactly;
 * out must not overlap the pools, knew or vnew. One launch whatever the batch: the decode
 * step's attention on a device (CUDA: a block per token and kv head, the grouped query
 * heads sharing each K/V load). GANG_EINVAL for NULL, a zero size, heads that do not
 * group or another dtype; a position or block id the kernel finds out of range is
 * reported at the next sync (device) or at once (cpu).
 */
int gang_kernels_attention_step(gang_kernels *k, const gang_kernels_step_kv *kv, const float *knew,
                                const float *vnew, const float *q, size_t tokens, size_t n_heads,
                                size_t n_kv_heads, size_t head_dim, size_t window, float *out);

/*
 * Writes dst[pairs[2i]] = pairs[2i + 1] for i < n_pairs, in place in tensor memory (the
 * decode step's block-table updates: only the entries that changed travel). pairs is
 * tensor memory; its indices must be distinct and < dst_n (an index out of range is
 * skipped and reported as GANG_EINVAL at the next sync on a device, at once on the cpu).
 */
int gang_kernels_scatter_i32(gang_kernels *k, int32_t *dst, size_t dst_n, const int32_t *pairs,
                             size_t n_pairs);

/*
 * Sampling parameters of one row of gang_kernels_sample (tensor memory, 32 bytes, no
 * padding): the engine's gang_sampling without its penalties, and the draw's position.
 */
typedef struct gang_kernels_sample_param {
    float temperature; /* <= 0: greedy */
    uint32_t top_k;    /* 0 = off; 1 = greedy */
    float top_p;       /* (0, 1) keeps the smallest prefix of that mass; else off */
    uint32_t reserved; /* 0 */
    uint64_t seed;     /* the draw is a function of (seed, position) only */
    uint64_t position;
} gang_kernels_sample_param;

/*
 * Draws one token per row of logits [rows, cols] into out [rows] (tensor memory), with
 * params [rows] (tensor memory), so that a decode step brings back ids, not logits. The
 * rule is the engine's sampler (engine/sample.c): greedy (argmax, NaN ignored, lowest
 * index on ties, 0 for an all-NaN row) when temperature <= 0 or top_k == 1; otherwise the
 * non-NaN candidates ordered by logit descending then id ascending, the first top_k of
 * them, an infinite first logit taking all the mass, probabilities exp((l - l0) / T) in
 * double, top-p's shortest prefix reaching top_p of their sum, and the first candidate
 * whose cumulative mass exceeds gang_kernels_uniform(seed, position) times the kept sum.
 * The cpu backend follows that walk exactly (the same token as the engine's sampler);
 * "cuda" reduces in parallel, so its sums may differ in the last bits and a draw within
 * that of a boundary may pick the neighbour. cols <= INT32_MAX.
 */
int gang_kernels_sample(gang_kernels *k, const float *logits, size_t rows, size_t cols,
                        const gang_kernels_sample_param *params, int32_t *out);

/*
 * The output of one GEMM over weights concatenated by rows (q/k/v, issue #24) cut back
 * into its parts: x is [rows, w0 + w1 + w2]; o0 [rows, w0], o1 [rows, w1] and o2 [rows,
 * w2] receive columns [0, w0), [w0, w0 + w1) and the rest of every row. One launch. The
 * outputs must not overlap x or each other. Exact (a copy).
 */
int gang_kernels_split_cols3(gang_kernels *k, const float *x, size_t rows, size_t w0, size_t w1,
                             size_t w2, float *o0, float *o1, float *o2);

/*
 * The q/k/v split of a concatenated projection with its biases and RoPE, in one launch
 * (gang_kernels_split_qkv_rope; a decode step's attention block on a device, issue #24).
 * All arrays are tensor memory of the handle.
 */
typedef struct gang_kernels_qkv_rope {
    const float *x;            /* [rows, (n_heads + 2 n_kv_heads) head_dim]: q | k | v */
    size_t rows;               /* tokens, >= 1 */
    size_t n_heads;            /* query heads, >= 1 */
    size_t n_kv_heads;         /* key/value heads, >= 1 */
    size_t head_dim;           /* even, >= 2 */
    const float *bq, *bk, *bv; /* optional biases [n_heads head_dim], [n_kv_heads head_dim] x2 */
    const int32_t *positions;  /* [rows], >= 0 (checked as gang_kernels_rope does) */
    const float *inv_freq;     /* [head_dim / 2], gang_kernels_rope's table */
    float scale;               /* gang_kernels_rope's scale: > 0, finite */
    float *q;                  /* out [rows, n_heads head_dim] */
    float *k;                  /* out [rows, n_kv_heads head_dim] */
    float *v;                  /* out [rows, n_kv_heads head_dim] */
} gang_kernels_qkv_rope;

/*
 * Exactly gang_kernels_split_cols3 of a->x into q, k and v, then gang_kernels_add_rows of
 * each bias present to its part, then gang_kernels_rope of q (n_heads) and of k
 * (n_kv_heads) at a->positions: the same numbers, in one launch instead of up to six.
 * The outputs must not overlap x, each other, the biases or the table. GANG_EINVAL for
 * NULL (but a bias), a zero or odd size, a scale rope refuses; GANG_ERANGE on overflow.
 */
int gang_kernels_split_qkv_rope(gang_kernels *k, const gang_kernels_qkv_rope *a);

/*
 * The gated unit of an MLP whose gate and up projections are one GEMM (issue #24): x is
 * [rows, 2 cols], each row the gate's cols then the up's cols, and out [rows, cols] gets
 * silu(gate) * up (gelu 0) or gelu_tanh(gate) * up (gelu 1), element by element as
 * gang_kernels_silu_mul / gang_kernels_gelu_mul compute them. out must not overlap x.
 */
int gang_kernels_glu(gang_kernels *k, int gelu, const float *x, size_t rows, size_t cols,
                     float *out);

/* The uniform draw in [0, 1) of (seed, position) that gang_kernels_sample uses: two rounds
 * of the splitmix64 finaliser, the top 53 bits. Host code; the same function as the
 * engine's gang__sample_uniform (unit-fake-device holds them equal). */
double gang_kernels_uniform(uint64_t seed, uint64_t position);

/*
 * SwiGLU gate: out[i] = silu(gate[i]) * up[i] with silu(x) = x / (1 + exp(-x)), n elements.
 * Aliasing: out may be gate or up exactly.
 */
int gang_kernels_silu_mul(gang_kernels *k, const float *gate, const float *up, size_t n,
                          float *out);

/*
 * GeGLU gate (Gemma): out[i] = gelu_tanh(gate[i]) * up[i], with PyTorch's tanh
 * approximation gelu_tanh(x) = x / 2 (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))), n
 * elements. Aliasing: out may be gate or up exactly.
 */
int gang_kernels_gelu_mul(gang_kernels *k, const float *gate, const float *up, size_t n,
                          float *out);

/* Scale in place: x[i] *= a for i < n (Gemma's embedding scale). */
int gang_kernels_scale(gang_kernels *k, float *x, float a, size_t n);

/*
 * Embedding lookup: out[t,:] = table[ids[t],:] for t < n_ids; table is [vocab, dim]. Every
 * id is checked before anything is written: an id < 0 or >= vocab leaves out untouched
 * and is GANG_EINVAL, returned by the call on "cpu" and by the next gang_kernels_sync or
 * download on a device (which does not wait for its ids: a decode step's embedding makes
 * no host synchronisation). out must not overlap table.
 */
int gang_kernels_embedding(gang_kernels *k, const float *table, size_t vocab, size_t dim,
                           const int32_t *ids, size_t n_ids, float *out);

/* Residual add in place: x[i] += y[i] for i < n. y may be x exactly (doubling). */
int gang_kernels_add(gang_kernels *k, float *x, const float *y, size_t n);

/*
 * The residual add and the next RMSNorm in one launch: x[r,:] += y[r,:], then out[r,:] =
 * RMSNorm(x[r,:]) * w as gang_kernels_rmsnorm computes it, for r < rows (x, y and out
 * [rows, dim], w [dim]): the same numbers as gang_kernels_add then gang_kernels_rmsnorm.
 * y may be x exactly; out must not overlap x, y or w. eps as gang_kernels_rmsnorm.
 */
int gang_kernels_add_rmsnorm(gang_kernels *k, float *x, const float *y, const float *w, float eps,
                             size_t rows, size_t dim, float *out);

/*
 * Bias add over rows, in place: x[r, c] += bias[c] for r < rows, c < cols (x is
 * [rows, cols], bias [cols]); one launch whatever rows is. bias must not overlap x.
 */
int gang_kernels_add_rows(gang_kernels *k, float *x, const float *bias, size_t rows, size_t cols);

/*
 * Greedy sampling: out[r] = the index of the largest value of row r of x [rows, cols]. On
 * ties the lowest index wins, so results do not depend on the backend's reduction order.
 * NaN entries are ignored; a row that is entirely NaN yields 0. cols must be <= INT32_MAX.
 */
int gang_kernels_argmax(gang_kernels *k, const float *x, size_t rows, size_t cols, int32_t *out);

/* ---------------------------------------------------------------------------------
 * Device backends (kernels/cuda/). Opening with options, device memory, half-precision
 * GEMM and device discovery. The "cpu" backend answers every call here too, with host
 * memory, so code written against this API runs on either backend.
 *
 * Memory model of a device backend: every tensor pointer given to the operations above is
 * a device pointer obtained from gang_kernels_alloc() (or an offset into one). Operations
 * are enqueued on the handle's one stream and may still run when the call returns; a
 * later operation on the same handle sees their results (stream order). Results reach the
 * host through gang_kernels_download(), which waits. Errors that only the device can see
 * (a negative position in gang_kernels_rope(), a kernel fault) are reported by the next
 * gang_kernels_sync() or gang_kernels_download() on the handle.
 *
 * "auto" keeps meaning "cpu" even when the CUDA kernels are built, because callers of
 * the operations above that pass host pointers must not be handed a device backend; ask
 * for "cuda" explicitly (after gang_kernels_device_count() > 0).
 * --------------------------------------------------------------------------------- */

/* Storage types of gang_kernels_gemm_ex() and gang_kernels_convert(). */

/* Options of gang_kernels_open_opts(); gang_kernels_options_init() fills the defaults. */
typedef struct gang_kernels_options {
    const char *device;    /* "cpu", "cuda" or "auto" (as gang_kernels_open) */
    int device_index;      /* cuda: which visible GPU, default 0 */
    uint64_t pool_mb;      /* cuda: device memory pool in MiB; 0 = use pool_percent */
    uint32_t pool_percent; /* cuda: share of the GPU's total memory, 1..100 (default 90),
                              when pool_mb is 0; capped by the memory free at open */
    int half_gemv;         /* cuda: products of up to 8 rows by a bf16 / f16 weight with
                              ganglion's GEMV (1, default) or cuBLASLt (0) */
    int pdl;               /* cuda: launch the decode GEMVs as programmatic dependents of
                              the kernel before them (Hopper's PDL: their first weight loads
                              start before it ends; 1), or after it as usual (0, default) */
    int trace;             /* cuda: record the device's kernels for gang_kernels_trace_*
                              (1; CUPTI must load, else open fails), or not (0, default) */
    int fuse_residual;     /* cuda: gang_kernels_matmul_fused's input norm and residual add
                              (1, default), or GANG_ENOSYS for them, so that the caller
                              makes the separate calls (0: the step before they were fused,
                              for measuring the difference) */
    int pool_split;        /* cuda: every buffer its own cudaMalloc, the pool's size still
                              the cap (1: a debugging mode, compute-sanitizer then sees each
                              buffer's bounds), or pieces of one allocation (0, default) */
} gang_kernels_options;

/* Fills o with the defaults: device "auto", index 0, pool_mb 0, pool_percent 90,
 * half_gemv 1, pdl 0, trace 0, fuse_residual 1, pool_split from the environment twin of
 * --gpu-pool-split (GANGLION_GPU_POOL_SPLIT; 0 when unset). */
void gang_kernels_options_init(gang_kernels_options *o);

/*
 * Opens a backend with options (gang_kernels_open(device, out) is this with defaults).
 * For "cuda" it selects the GPU, creates the handle's stream and cuBLASLt handle and
 * allocates the whole device pool at once (no device allocation happens afterwards); a
 * pool_mb larger than the free device memory is GANG_ENOMEM with a log line giving both
 * sizes. GANG_ENOSYS when the CUDA kernels are not built, GANG_EIO when no usable GPU (or
 * driver) is present, GANG_EINVAL for bad options. *out is NULL on error.
 */
int gang_kernels_open_opts(const gang_kernels_options *o, gang_kernels **out);

/*
 * Changes the launch choices of an open handle for what is enqueued after the call:
 * o->half_gemv, o->pdl and o->fuse_residual, read as gang_kernels_open_opts reads them; the
 * other fields are not read (the device, its pool and tracing stay as opened). A graph
 * captured before replays with the choices it was captured with. So one model on one
 * handle can be measured with and without a choice (`bench decode --variants`). A backend
 * without these choices ("cpu", "fake": their open ignores them too) returns 0 and changes
 * nothing. GANG_EINVAL for NULL, and while the handle captures a graph.
 */
int gang_kernels_retune(gang_kernels *k, const gang_kernels_options *o);

/*
 * Capabilities of a handle's backend, so that callers ask what it can do instead of which
 * backend it is:
 *  - GANG_KERNELS_CAP_HOST_MEM: tensors are host memory, any host pointer works ("cpu");
 *  - GANG_KERNELS_CAP_DEVICE_MEM: tensors are device memory from gang_kernels_alloc, moved
 *    with upload / download ("cuda");
 *  - GANG_KERNELS_CAP_HALF_GEMM: gang_kernels_gemm_ex takes f16 and bf16 (else only f32).
 * gang_kernels_caps(NULL) is 0.
 */
#define GANG_KERNELS_CAP_HOST_MEM (1u << 0)
#define GANG_KERNELS_CAP_DEVICE_MEM (1u << 1)
#define GANG_KERNELS_CAP_HALF_GEMM (1u << 2)

uint32_t gang_kernels_caps(const gang_kernels *k);

/*
 * Allocates bytes (> 0) of tensor memory for this handle, aligned to 256 bytes: from the
 * device pool for "cuda" (GANG_ENOMEM with a log line naming the pool size, what is in
 * use and the largest free block when it does not fit), from the heap for "cpu". Contents
 * are undefined. Released with gang_kernels_free() on the same handle, before close.
 */
int gang_kernels_alloc(gang_kernels *k, size_t bytes, void **out);

/* Returns p (from gang_kernels_alloc on k) to its pool; NULL is ignored. A pointer that
 * did not come from k is logged and ignored. The memory must no longer be in use by
 * enqueued operations (call gang_kernels_sync first when in doubt). */
void gang_kernels_free(gang_kernels *k, void *p);

/* Copies bytes from host src to tensor memory dst (upload), or from tensor memory src to
 * host dst (download). Both return once the host buffer may be reused; download first
 * waits for every operation enqueued before it and reports their deferred errors. */
int gang_kernels_upload(gang_kernels *k, void *dst, const void *src, size_t bytes);
int gang_kernels_download(gang_kernels *k, void *dst, const void *src, size_t bytes);

/*
 * gang_kernels_upload without a host wait: the copy is enqueued on the handle's queue
 * (stream order with the operations around it) and the call returns at once; src may be
 * reused as soon as it returns ("cuda" stages the bytes in pinned memory of the handle,
 * whose room is reclaimed at every host synchronisation; a transfer larger than the room
 * left waits like gang_kernels_upload). What a decode step uploads (token ids, positions,
 * table updates, sampling parameters) goes this way. Counted as a launch, not a sync.
 */
int gang_kernels_upload_async(gang_kernels *k, void *dst, const void *src, size_t bytes);

/*
 * Copies bytes from tensor memory src to tensor memory dst of the same handle: device to
 * device on "cuda", enqueued on the handle's stream (stream order, no host wait), memmove
 * on "cpu". bytes 0 is a no-op. dst and src must not overlap unless dst == src. Used for
 * KV-cache writes, row gathers and the copy-bandwidth measurement of `bench decode`.
 */
int gang_kernels_copy(gang_kernels *k, void *dst, const void *src, size_t bytes);

/*
 * Strided copy between tensor buffers of the handle: rows rows of width bytes, row r read
 * at src + r * spitch and written at dst + r * dpitch (pitches >= width). Enqueued like
 * gang_kernels_copy (cudaMemcpy2DAsync on "cuda"). GANG_EINVAL for a NULL pointer, a zero
 * width or rows, or a pitch below width. The rows of dst and src must not overlap.
 */
int gang_kernels_copy_2d(gang_kernels *k, void *dst, size_t dpitch, const void *src, size_t spitch,
                         size_t width, size_t rows);

/*
 * Graphs (CUDA graphs, issue #24): the operations enqueued on k between
 * gang_kernels_graph_begin and gang_kernels_graph_end are recorded, not run, into a
 * graph that gang_kernels_graph_launch replays on k's queue as one launch, with the same
 * arguments (the same tensors: what changes between replays must be in tensor memory the
 * graph reads, written before the launch). While capturing, every call that would wait on
 * the host or read host memory later (sync, download, upload, upload_async) is refused
 * with GANG_EINVAL and ends the capture's usefulness: graph_end then fails. A backend
 * without graphs answers GANG_ENOSYS to begin (the caller runs the operations itself).
 * end returns the graph in *out (GANG_EIO when the capture failed; nothing to free);
 * free releases it (NULL ignored). Graphs belong to k and must be freed before close.
 */
typedef struct gang_kernels_graph gang_kernels_graph;
int gang_kernels_graph_begin(gang_kernels *k);
int gang_kernels_graph_end(gang_kernels *k, gang_kernels_graph **out);
int gang_kernels_graph_launch(gang_kernels *k, gang_kernels_graph *g);
void gang_kernels_graph_free(gang_kernels *k, gang_kernels_graph *g);

/* Waits for every enqueued operation of k; returns 0 or the first deferred error
 * (GANG_EINVAL for an invalid rope position, GANG_EIO for a device fault). */
int gang_kernels_sync(gang_kernels *k);

/*
 * The queue in which k's device work runs, as an opaque pointer (a cudaStream_t on
 * "cuda", the handle itself on "fake"), so that a device communicator can order its work
 * after k's and k's later work after its own on the device, without a host wait
 * (gang_comm_order_after). NULL for a host backend ("cpu") and for NULL. Valid until k
 * is closed. Callers never dereference it.
 */
void *gang_kernels_device_stream(gang_kernels *k);

/*
 * Makes k's device current on the calling thread, for libraries that take the thread's
 * current device rather than a handle: NCCL uses the device current at communicator
 * init (gang_comm_init with the nccl backend), so a thread that creates nccl
 * communicators for k's buffers calls this first. "cuda": cudaSetDevice of the handle's
 * GPU (and, as a side effect, a gang_kernels_sync of the handle: its deferred error, if
 * any, is returned); "cpu": a no-op returning 0. GANG_EINVAL for NULL. Operations on k
 * make its device current by themselves; this is only for code outside the kernels.
 */
int gang_kernels_bind_thread(gang_kernels *k);

/*
 * What a handle asked of its backend so far, counted by the front (kernels/backend.c) for
 * every backend alike, so that the host/device traffic of a code path can be measured
 * without a GPU (the "fake" device, `bench decode --device fake`) and compared with the
 * same path on "cuda":
 *  - host_syncs: calls that make the host wait for the device: sync, download and the
 *    blocking upload (upload_async does not);
 *  - launches: operations enqueued on the handle's queue: every kernel above, the device
 *    copies and upload_async (a call the front splits per sequence counts once per part);
 *  - allocs: successful gang_kernels_alloc calls;
 *  - h2d_bytes / d2h_bytes: bytes of upload + upload_async / download.
 * Counters only grow; a caller measures a span by the difference of two reads. The "cpu"
 * backend is counted too (its uploads are memcpy: the counts say what a device would do).
 */
typedef struct gang_kernels_counters {
    uint64_t host_syncs;
    uint64_t launches;
    uint64_t allocs;
    uint64_t h2d_bytes;
    uint64_t d2h_bytes;
} gang_kernels_counters;

/* Copies k's counters into *out: 0, or GANG_EINVAL for NULL. */
int gang_kernels_counters_get(const gang_kernels *k, gang_kernels_counters *out);

/*
 * Kernel traces (issue #24): where a decode step's device time goes, measured as its graph
 * replays, not estimated. A handle opened with options.trace ("cuda" only: other backends
 * refuse the option with GANG_ENOSYS) has NVIDIA's CUPTI activity API (libcupti, found at
 * run time as cuBLAS is: common/dynlib.c) record the start and end of every kernel the
 * process runs on the device, graph nodes included. The caller brackets the spans it wants
 * measured: gang_kernels_trace_begin before a decode step, gang_kernels_trace_end after the
 * step's host wait (cheap: a timestamp each, no wait); gang_kernels_trace_collect waits for
 * k's work, gathers what CUPTI recorded and sums the kernels that started inside the spans:
 *  - wall_ns: the spans' lengths (host time, the same clock as the kernels');
 *  - device_ns: per span, from its first kernel's start to its last kernel's end;
 *  - busy_ns: per span, the union of its kernels' intervals (kernels that overlap, as PDL
 *    launches do, count once), so device_ns - busy_ns is the device idle between kernels
 *    inside a step (launch gaps) and wall_ns - device_ns the host's share before and after;
 *  - ops: the kernels grouped by name and grid ("gemv_kernel<bfloat16> 512x1x1"), by
 *    summed duration, largest first; past GANG_KERNELS_TRACE_OPS - 1 the rest are summed
 *    into one last op named "(other)".
 * The record is process-wide (CUPTI's), so a span counts every kernel the process runs on
 * any device meanwhile: trace one rank per process. One handle traces at a time: begin on
 * another while spans are uncollected is GANG_EAGAIN. begin with a span open, end without
 * one, and any of the three on a handle opened without trace are GANG_EINVAL; collect with
 * a span open or while capturing a graph (it waits) is GANG_EINVAL; with no span it
 * returns zeros. Collect
 * empties the spans and the records; kernels recorded outside every span are dropped
 * (memory is bounded: past a million kernels in uncollected spans the rest are counted in
 * dropped, as are the records CUPTI itself lost).
 */
#define GANG_KERNELS_TRACE_OPS 24
#define GANG_KERNELS_TRACE_NAME 64
typedef struct gang_kernels_trace_op {
    char name[GANG_KERNELS_TRACE_NAME]; /* "gemv_kernel<bfloat16> 512x1x1", truncated */
    uint64_t count;                     /* kernels of this op in the spans */
    uint64_t total_ns;                  /* their durations, summed */
} gang_kernels_trace_op;

typedef struct gang_kernels_trace {
    uint64_t spans;                       /* spans summed */
    uint64_t kernels;                     /* kernels that started inside them */
    uint64_t graph_kernels;               /* of those, nodes of a graph */
    uint64_t wall_ns, device_ns, busy_ns; /* as above, summed over the spans */
    uint64_t dropped;                     /* kernel records lost */
    uint32_t n_ops;
    gang_kernels_trace_op ops[GANG_KERNELS_TRACE_OPS];
} gang_kernels_trace;

int gang_kernels_trace_begin(gang_kernels *k);
int gang_kernels_trace_end(gang_kernels *k);
/* Fills *out (zeroed first); 0 or a negative GANG_E* code (GANG_EIO: CUPTI failed). */
int gang_kernels_trace_collect(gang_kernels *k, gang_kernels_trace *out);

/* Pool accounting (device backends; the cpu backend reports zeros). */
typedef struct gang_kernels_pool_stats {
    uint64_t pool_bytes;   /* size of the pool allocated at open */
    uint64_t used_bytes;   /* held by live allocations (including the GEMM workspace) */
    uint64_t largest_free; /* largest single allocation that would succeed now */
} gang_kernels_pool_stats;
int gang_kernels_pool_stats_get(const gang_kernels *k, gang_kernels_pool_stats *out);

/*
 * GEMM with half-precision storage and f32 accumulation: a, b and c hold elements of dt,
 * the layout and semantics are those of gang_kernels_gemm(), alpha/beta are applied in
 * f32 and the result is rounded once to dt. dt = GANG_DTYPE_F32 is gang_kernels_gemm().
 * The cpu backend provides only F32 (GANG_ENOSYS otherwise).
 */
int gang_kernels_gemm_ex(gang_kernels *k, gang_dtype dt, int trans_b, size_t m, size_t n,
                         size_t kdim, float alpha, const void *a, const void *b, float beta,
                         void *c);

/* Converts n elements of tensor memory from one storage type to another (round to
 * nearest even when narrowing). src and dst must not overlap unless from == to. */
int gang_kernels_convert(gang_kernels *k, gang_dtype from, const void *src, gang_dtype to,
                         void *dst, size_t n);

/* Facts about one visible GPU, for `ganglion info` (no CUDA types). */
typedef struct gang_device_info {
    int index;              /* CUDA ordinal (after CUDA_VISIBLE_DEVICES) */
    char name[256];         /* "NVIDIA H200" */
    char uuid[64];          /* "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" */
    char pci_bus_id[32];    /* "0000:19:00.0" */
    uint64_t total_bytes;   /* device memory */
    uint64_t free_bytes;    /* free at the time of the query */
    int cc_major, cc_minor; /* compute capability */
    int sm_count;           /* multiprocessors */
    int integrated;         /* 1 for an integrated GPU */
} gang_device_info;

/* Number of visible GPUs; 0 when the CUDA kernels are not built, no driver is installed
 * or no device is present. Never fails or aborts. It initialises the CUDA driver in the
 * calling process (as do the two queries below), and CUDA does not survive fork(): the
 * agent, which forks its workers, must leave these queries to the workers or to a child. */
int gang_kernels_device_count(void);
/*
 * Loads cuBLASLt and cuBLAS now (common/dynlib.c's search, once per process) and writes the
 * cuBLASLt file the loader mapped into path[cap]. 0; GANG_EIO when they cannot be loaded
 * (logged); GANG_ENOSYS when the CUDA kernels are not built. Needs no GPU.
 */
int gang_kernels_cuda_library(char *path, size_t cap);

/* Fills *out for GPU index (0 .. count-1): 0, GANG_EINVAL for a bad index or NULL,
 * GANG_ENOSYS when not built, GANG_EIO when the driver refuses the query. */
int gang_kernels_device_info(int index, gang_device_info *out);

/* 1 when GPU a can access GPU b's memory directly (peer access), 0 when not, a negative
 * GANG_E* code on error (as gang_kernels_device_info). a == b is 1. */
int gang_kernels_device_can_access_peer(int a, int b);

#endif /* GANGLION_KERNELS_H */
