/*
 * CUDA kernels of the block weights (include/ganglion/kernels.h, "Block types", issue #27):
 * y = x . W^T with W a GGUF file's own blocks, uploaded as the file's bytes, and the
 * embedding lookup over a block table. Every type (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K,
 * Q5_K, Q6_K) is one instantiation of the same templates: a weight is read as groups of
 * 32 elements, each dequantized to f32 in registers by gang_qb_group (cuda-qblocks.h, the
 * text the host test unit-cuda-qblocks holds to the formats' reference; the threads' bodies
 * live there too, gang_qb_gemv_lane and gang_qb_group_of, which that test runs lane by
 * lane on the host).
 *
 * Decode (m <= QG_ROWS): a GEMV that reads each block once. A warp per output row, QG_WARPS
 * rows per thread block; the block stages a tile of the m rows of x in shared memory (one
 * float of padding per 32, so that the 32 lanes, each on its own group, read 32 different
 * banks), each lane takes the row's groups lane, lane + 32, ..., dequantizes a group into
 * 32 registers and multiplies it with the m staged rows; the lane sums are reduced over the
 * warp once per output. Activations stay f32 (the CPU kernels' int8 rounding of x is not
 * done here), so the result is the f32 product on the dequantized weight up to summation
 * order. The blocks are 34 (Q8_0), 18, 20, 22, 24, 144, 176 and 210 bytes: only Q4_K's
 * and Q5_K's quants sit on 16-byte boundaries, so loads are the compiler's from byte
 * addresses; consecutive lanes read consecutive groups, so a warp's loads cover whole
 * cache lines. Each warp first asks for its row's first tile of bytes to be brought into L2
 * (prefetch, no registers held), so that HBM works while the block stages x; launched as a
 * programmatic dependent (gang_kernels_options.pdl, cuda-pdl.h) it does so before the kernel
 * it reads has ended, and waits for that kernel before it stages x.
 *
 * Prefill (m > QG_ROWS): the weight is dequantized to a bf16 matrix [n, kdim] (a scratch of
 * the handle, cuda-backend.c) by a kernel with one thread per group, x is converted to
 * bf16, and cuBLASLt multiplies them with f32 accumulation and f32 output, as for a bf16
 * weight. A bf16 of the dequantized value is its rounding to 8 significant bits, so this
 * path agrees with the f32 product within 2^-8 x sum |x w| (x and w each rounded once,
 * relative error 2^-9) plus summation order.
 */
#include <cuda_bf16.h>

#include "cuda-internal.h"
#include "cuda-pdl.h"
#include "cuda-qblocks.h"
#include "cuda-vec.h"

#define QG_WARPS 8 /* output rows per thread block */
#define QG_ROWS GANG_QB_ROWS
#define QG_TILE 1024 /* elements of each x row staged per pass: a multiple of 256 */
#define QD_THREADS 256
#define QD_MAX_BLOCKS 65535

#if QG_ROWS != GANG_CUDA_QGEMV_ROWS
#error "the GEMV's rows (cuda-qblocks.h) and the backend's threshold (cuda-internal.h) differ"
#endif

/* The decode GEMV (file comment): warp w of block b computes output row b x QG_WARPS + w. */
template <int T>
__global__ static void gemv_q_kernel(size_t m, size_t n, size_t kdim, const float *x, int glu,
                                     const uint8_t *w, float *y)
{
    __shared__ float xs[QG_ROWS][GANG_QB_PAD(QG_TILE)];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const size_t o = (size_t)blockIdx.x * QG_WARPS + warp;
    const uint8_t *row = w + (o < n ? o : 0) * gang_qb_row_bytes(T, kdim);
    float acc[QG_ROWS];

    pdl_trigger(); /* the next GEMV may start its prefetches */
    if (o < n) {
        /* The first tile's bytes of the row toward L2 (at most 1,088: Q8_0's 1,024
         * elements), lines of 128 from the row's start, the last lane the tail's line. */
        const size_t first = gang_qb_row_bytes(T, kdim < QG_TILE ? kdim : QG_TILE);
        const size_t at = (size_t)lane * 128;

        if (at < first + 128)
            prefetch_l2(row + (at < first ? at : first - 1));
    }
    for (int r = 0; r < QG_ROWS; r++)
        acc[r] = 0.0f;
    pdl_wait(); /* x, and y's last readers, are the earlier kernels' */
    for (size_t k0 = 0; k0 < kdim; k0 += QG_TILE) {
        size_t kt = kdim - k0 < QG_TILE ? kdim - k0 : QG_TILE;
        const unsigned ukt = (unsigned)kt, total = (unsigned)(m * kt); /* <= 8192 */

        __syncthreads(); /* the previous tile is no longer read */
        for (unsigned i = threadIdx.x; i < total; i += 32 * QG_WARPS) {
            unsigned r = i / ukt, e = i - r * ukt; /* 32-bit division: a few instructions */

            xs[r][GANG_QB_PAD(e)] = gemv_x(x, glu, kdim, r, k0 + e);
        }
        __syncthreads();
        if (o < n)
            gang_qb_gemv_lane(T, row, k0, kt, &xs[0][0], GANG_QB_PAD(QG_TILE), m, lane, acc);
    }
    if (o >= n)
        return;
    for (int r = 0; r < QG_ROWS && (size_t)r < m; r++) {
        const float v = warp_sum(acc[r]);

        if (lane == 0)
            y[(size_t)r * n + o] = v;
    }
}

/* The weight [n, kdim] dequantized to bf16 out [n, kdim]: a thread per group of 32. */
template <int T>
__global__ static void dequant_q_bf16_kernel(size_t n, size_t kdim, const uint8_t *w,
                                             __nv_bfloat16 *out)
{
    const size_t groups = n * (kdim / 32);

    for (size_t g = blockIdx.x * (size_t)blockDim.x + threadIdx.x; g < groups;
         g += (size_t)gridDim.x * blockDim.x) {
        size_t r, e0;
        float wv[32];
        uint4 v[4];
        __nv_bfloat162 *h = (__nv_bfloat162 *)v;

        gang_qb_group_of(T, w, kdim, g, &r, &e0, wv);
#pragma unroll
        for (int l = 0; l < 16; l++)
            h[l] = __floats2bfloat162_rn(wv[2 * l], wv[2 * l + 1]);
        /* 64-byte aligned: the scratch is 256-aligned and r kdim + e0 a multiple of 32 */
        uint4 *dst = (uint4 *)(out + r * kdim + e0);
        GANG_EMU_ALIGNED(dst, 16, "dequant_q_bf16 store");
#pragma unroll
        for (int i = 0; i < 4; i++)
            dst[i] = v[i];
    }
}

/* out[t, :] = the dequantized row ids[t] of the block table, unless *flag (a bad id). */
template <int T>
__global__ static void embedding_q_kernel(const uint8_t *table, size_t dim, const int32_t *ids,
                                          size_t n_ids, const int *flag, float *out)
{
    const size_t per_row = dim / 32, groups = n_ids * per_row;

    if (*flag != 0)
        return;
    for (size_t g = blockIdx.x * (size_t)blockDim.x + threadIdx.x; g < groups;
         g += (size_t)gridDim.x * blockDim.x) {
        size_t t = g / per_row, e0 = g % per_row * 32;
        float wv[32];

        gang_qb_group_at(T, table + (size_t)ids[t] * gang_qb_row_bytes(T, dim), e0, wv);
#pragma unroll
        for (int l = 0; l < 32; l++)
            out[t * dim + e0 + l] = wv[l];
    }
}

static unsigned qd_blocks(size_t groups)
{
    size_t b = (groups + QD_THREADS - 1) / QD_THREADS;

    return (unsigned)(b > QD_MAX_BLOCKS ? QD_MAX_BLOCKS : (b == 0 ? 1 : b));
}

/* The launches of one type (the callers' switch picks T). */
template <int T> struct qlaunch {
    static void gemv(cudaStream_t s, int glu, int pdl, size_t m, size_t n, size_t kdim,
                     const float *x, const void *w, float *y)
    {
        size_t blocks = (n + QG_WARPS - 1) / QG_WARPS;

#if defined(__CUDACC__) /* nvcc; the emulator runs a stream's kernels in order anyway */
        if (pdl) {
            cudaLaunchAttribute at;
            cudaLaunchConfig_t cfg =
                pdl_config(dim3((unsigned)blocks), dim3(32 * QG_WARPS), s, &at);

            /* its status is cudaGetLastError's too */
            (void)cudaLaunchKernelEx(&cfg, gemv_q_kernel<T>, m, n, kdim, x, glu, (const uint8_t *)w,
                                     y);
            return;
        }
#else
        (void)pdl;
#endif
        gemv_q_kernel<T>
            <<<(unsigned)blocks, 32 * QG_WARPS, 0, s>>>(m, n, kdim, x, glu, (const uint8_t *)w, y);
    }
    static void dequant(cudaStream_t s, size_t n, size_t kdim, const void *w, void *out)
    {
        dequant_q_bf16_kernel<T><<<qd_blocks(n * (kdim / 32)), QD_THREADS, 0, s>>>(
            n, kdim, (const uint8_t *)w, (__nv_bfloat16 *)out);
    }
    static void embedding(cudaStream_t s, const void *table, size_t dim, const int32_t *ids,
                          size_t n_ids, const int *flag, float *out)
    {
        embedding_q_kernel<T><<<qd_blocks(n_ids * (dim / 32)), QD_THREADS, 0, s>>>(
            (const uint8_t *)table, dim, ids, n_ids, flag, out);
    }
};

/* Calls qlaunch<T>::F(args) for the block type wtype; 0, or -1 for another type. */
#define QL_DISPATCH(wtype, F, ...)                                                                 \
    switch (wtype) {                                                                               \
    case GANG_QB_Q8_0:                                                                             \
        qlaunch<GANG_QB_Q8_0>::F(__VA_ARGS__);                                                     \
        break;                                                                                     \
    case GANG_QB_Q4_0:                                                                             \
        qlaunch<GANG_QB_Q4_0>::F(__VA_ARGS__);                                                     \
        break;                                                                                     \
    case GANG_QB_Q4_1:                                                                             \
        qlaunch<GANG_QB_Q4_1>::F(__VA_ARGS__);                                                     \
        break;                                                                                     \
    case GANG_QB_Q5_0:                                                                             \
        qlaunch<GANG_QB_Q5_0>::F(__VA_ARGS__);                                                     \
        break;                                                                                     \
    case GANG_QB_Q5_1:                                                                             \
        qlaunch<GANG_QB_Q5_1>::F(__VA_ARGS__);                                                     \
        break;                                                                                     \
    case GANG_QB_Q4_K:                                                                             \
        qlaunch<GANG_QB_Q4_K>::F(__VA_ARGS__);                                                     \
        break;                                                                                     \
    case GANG_QB_Q5_K:                                                                             \
        qlaunch<GANG_QB_Q5_K>::F(__VA_ARGS__);                                                     \
        break;                                                                                     \
    case GANG_QB_Q6_K:                                                                             \
        qlaunch<GANG_QB_Q6_K>::F(__VA_ARGS__);                                                     \
        break;                                                                                     \
    case GANG_QB_IQ4_NL:                                                                           \
        qlaunch<GANG_QB_IQ4_NL>::F(__VA_ARGS__);                                                   \
        break;                                                                                     \
    case GANG_QB_IQ4_XS:                                                                           \
        qlaunch<GANG_QB_IQ4_XS>::F(__VA_ARGS__);                                                   \
        break;                                                                                     \
    default:                                                                                       \
        return GANG_ENOSYS;                                                                        \
    }

extern "C" int gang__cuda_launch_gemv_q(cudaStream_t s, int wtype, int glu, int pdl, size_t m,
                                        size_t n, size_t kdim, const float *x, const void *w,
                                        float *y)
{
    if (m > QG_ROWS || kdim % 32 != 0)
        return GANG_EINVAL;
    QL_DISPATCH(wtype, gemv, s, glu, pdl, m, n, kdim, x, w, y)
    return gang__cuda_err(cudaGetLastError(), "block gemv launch");
}

extern "C" int gang__cuda_launch_dequant_q_bf16(cudaStream_t s, int wtype, size_t n, size_t kdim,
                                                const void *w, void *out)
{
    if (kdim % 32 != 0)
        return GANG_EINVAL;
    QL_DISPATCH(wtype, dequant, s, n, kdim, w, out)
    return gang__cuda_err(cudaGetLastError(), "block dequantize launch");
}

extern "C" int gang__cuda_launch_embedding_q(cudaStream_t s, int wtype, const void *table,
                                             size_t dim, const int32_t *ids, size_t n_ids,
                                             const int *flag, float *out)
{
    if (dim % 32 != 0)
        return GANG_EINVAL;
    QL_DISPATCH(wtype, embedding, s, table, dim, ids, n_ids, flag, out)
    return gang__cuda_err(cudaGetLastError(), "block embedding launch");
}
