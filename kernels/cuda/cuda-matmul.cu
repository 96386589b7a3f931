/*
 * CUDA kernels of the typed weights (include/ganglion/kernels.h, "Typed weights"): the
 * weight-only int8 matmul, the bf16 / f16 decode GEMV, and the embedding lookup over a
 * bf16 / f16 / int8 table. The bf16 / f16 matmul of more than MM_ROWS rows (a prefill) is
 * cuBLASLt's (cuda-backend.c, cuda-gemm.c).
 *
 * int8 matmul, decode (m <= MM_ROWS, kdim a multiple of 16): the GEMV of issue #24. A warp
 * per output row o of W, GEMV_WARPS rows per block: the block stages a tile of the m rows of
 * x in shared memory (every warp of the block reads it from there instead of from L2; the
 * tile as long as 32 KiB hold for m rows, gemv_tile), and
 * each lane loads 16 int8 weights at a time (one 16-byte load; a warp covers 512 bytes of
 * the row per load), multiplies them with the m staged rows, and the lane sums are reduced
 * over the warp once per output; the row's scale is applied once. Each weight byte is read
 * once per call, which is the point of the format. The same kernel (gemv_kernel, one
 * instance per element type) is the bf16 / f16 decode GEMV, 8 elements a load, x rounded
 * to the weight's type as it is staged.
 *
 * int8 matmul, otherwise (a prefill, or a kdim that is not a multiple of 16). One block per
 * output row o of W: its threads read the row's int8 elements once (consecutive threads,
 * consecutive bytes), convert them to f32, and multiply them with up to MM_ROWS rows of x
 * at once (x comes from L2); each partial sum is reduced over the block and multiplied by
 * the row's scale once. The weight row is read again only for every further MM_ROWS rows of
 * x.
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda-internal.h"
#include "cuda-pdl.h"
#include "cuda-vec.h"

#define MM_THREADS 128
#define MM_ROWS GANG_CUDA_GEMV_ROWS
#define EMB_THREADS 256
#define EMB_MAX_BLOCKS 4096

/* Sum of v over the block (MM_THREADS threads); thread 0 gets the result. */
__device__ static float mm_block_sum(float v, float *shared)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    if ((threadIdx.x & 31) == 0)
        shared[threadIdx.x >> 5] = v;
    __syncthreads();
    v = threadIdx.x < MM_THREADS / 32 ? shared[threadIdx.x] : 0.0f;
    if (threadIdx.x < 32)
        for (int o = 16; o > 0; o >>= 1)
            v += __shfl_xor_sync(0xffffffffu, v, o);
    __syncthreads(); /* shared is reused by the next call */
    return v;
}

__global__ static void matmul_i8_kernel(size_t m, size_t n, size_t kdim, const float *x,
                                        const int8_t *w, const float *scales, int add, float *y)
{
    __shared__ float shared[MM_THREADS / 32];
    size_t o = blockIdx.x;
    const int8_t *row = w + o * kdim;

    for (size_t r0 = 0; r0 < m; r0 += MM_ROWS) {
        float acc[MM_ROWS];
        size_t nr = m - r0 < MM_ROWS ? m - r0 : MM_ROWS;

        for (int r = 0; r < MM_ROWS; r++)
            acc[r] = 0.0f;
        for (size_t i = threadIdx.x; i < kdim; i += MM_THREADS) {
            float wv = (float)row[i];

            for (int r = 0; r < MM_ROWS; r++)
                if ((size_t)r < nr)
                    acc[r] += x[(r0 + r) * kdim + i] * wv;
        }
        for (int r = 0; r < MM_ROWS; r++) {
            float s;

            if ((size_t)r >= nr)
                break;
            s = mm_block_sum(acc[r], shared);
            if (threadIdx.x == 0) {
                const float p = s * scales[o];

                y[(r0 + r) * n + o] = add ? y[(r0 + r) * n + o] + p : p;
            }
        }
    }
}

#define GEMV_WARPS 8   /* output rows per block */
#define GEMV_SMEM 8192 /* floats of x staged per pass (32 KiB): a tile of each of the m rows */

/* The tile (elements of each x row staged per pass) for m rows: as much of the rows as the
 * shared array holds, a multiple of 512 (the int8 lanes' stride; 256 for half weights), so
 * a lane reads the same elements of x in the same order whatever the tile, and the tile
 * is whole chunks of vec_swz's transposed layout: m = 1 stages
 * 8192 elements at once (a whole 4096-wide row: one barrier pair per call), m = 8 1024. */
static unsigned gemv_tile(size_t m)
{
    return (unsigned)(GEMV_SMEM / m / 512 * 512);
}

/*
 * The decode GEMV (file comment) over weights of element type T: warp w of block b computes
 * output row o = b x GEMV_WARPS + w, times scales[o] when scales is not NULL (int8). x row
 * r's tile is xs[r tile ..]; with g (gemv_stage_norm) x is RMS-normed with weights g as it
 * is staged, and with add the output is added to y (a residual add). Per tile, each lane first
 * issues its first GEMV_PRE weight loads, then the block stages x (four elements a load when xv: x
 * 16-byte aligned), so the memory streams weights while the block waits at the barrier (a grid of
 * one wave, as the 8B shape's q|k|v, o and down projections are, would otherwise leave it idle
 * there); then gemv_stream keeps GEMV_PRE loads of the lane in flight to the tile's end, the
 * products summed in the order of the elements. Launched as a programmatic dependent (cuda-pdl.h)
 * it issues the first tile's weight loads before it waits for the kernel before it, whose output x
 * is. sm_90 (ptxas -v): 64 registers under the launch bounds, no spills (4 loads a lane live in the
 * loop; the two-loop form, a batch of loads then its uses, spilled there); tests/sass-loads.py
 * reads the SASS for the loads in flight.
 */
#define GEMV_PRE 4 /* 16-byte weight loads per lane in flight (2 KB a warp) */
#define GEMV_XU 2  /* x's 4-element groups a thread loads at once when it stages x */

/* acc[r] += the V weights wf times the elements i .. i + V - 1 (i = (lane + 32 c) V) of
 * staged row r, r < m: with vec_swz (cuda-vec.h), element i + j of the tile is at c 32 V + j 32 +
 * lane. */
template <int V>
__device__ static inline void gemv_fma(float *acc, size_t m, const float *xs, unsigned tile,
                                       unsigned i, const float *wf)
{
    const unsigned at = i / (32u * V) * (32u * V) + (i / V) % 32u;

    for (int r = 0; r < MM_ROWS; r++) {
        if ((size_t)r >= m)
            break;
        for (int e = 0; e < V; e++)
            acc[r] += xs[r * tile + at + 32u * e] * wf[e];
    }
}

/* The first GEMV_PRE 16-byte weight loads of a lane in a tile: elements i0, i0 + 32 V, ...
 * (those < kt), issued before the block stages x. */
template <typename T>
__device__ static inline void gemv_first_loads(uint4 *wv, const T *row, unsigned i0, unsigned kt)
{
    constexpr int V = vec_io<T>::VEC;

#pragma unroll
    for (int j = 0; j < GEMV_PRE; j++) {
        const unsigned i = i0 + 32u * V * j;

        if (i < kt)
            wv[j] = vec_load16(row + i);
    }
}

/*
 * acc[r] += the products of a lane's weights in the tile from element i0 on (i0, + 32 V,
 * ... < kt), in that order, wv holding the first GEMV_PRE of them (gemv_first_loads): as
 * each load is taken apart, the load GEMV_PRE places further on is issued into its
 * registers, so GEMV_PRE loads stay in flight however many products follow. Written out
 * because ptxas does not do it: the loop of load-then-use this replaced, unrolled 4 times,
 * issued each load only after the previous one's products (read from the SASS, nvdisasm,
 * 2026-12-05): one 512-byte load in flight per warp, about half of what an SM needs in
 * flight to stream HBM at its rate.
 */
template <typename T>
__device__ static inline void gemv_stream(float *acc, size_t m, const float *xs, unsigned tile,
                                          uint4 *wv, const T *row, unsigned i0, unsigned kt)
{
    constexpr int V = vec_io<T>::VEC;

    for (; i0 < kt; i0 += 32u * V * GEMV_PRE) {
#pragma unroll
        for (int j = 0; j < GEMV_PRE; j++) {
            const unsigned i = i0 + 32u * V * j, next = i + 32u * V * GEMV_PRE;
            float wf[V];

            if (i >= kt)
                break;
            vec_io<T>::from16(wv[j], wf);
            if (next < kt)
                wv[j] = vec_load16(row + next);
            gemv_fma<V>(acc, m, xs, tile, i, wf);
        }
    }
}

/*
 * The GEMV's input RMS-normed as it is staged (gang_kernels_matmul_fused's norm): the m
 * rows of x [m, kdim] whole in the tile (kdim <= tile, so k0 = 0 is the only tile) and
 * the weights g after them (at xs + m tile, laid out as a row of x: gemv_launch leaves a
 * tile's room), staged as they are; each row's sum of squares reduced in double over the
 * block; then every staged element replaced by round(x * scale * g[e]) with rms_scale's
 * scale: what rmsnorm_kernel writes, then the GEMV stages of it (the double sums' order
 * aside, which moves the f32 scale with a probability of about 1e-9). The passes after
 * the staging walk the tile in the order of its banks (vec_unswz), g's copy too. Every
 * thread of the block calls it; x 16-byte aligned, kdim % 4 == 0 (xv). Its loops are not
 * unrolled: unrolled (or g read from global memory in the last pass) they pushed the
 * kernel past its 64 registers (ptxas -v: 4-32 bytes of spills), so the staging is a
 * round trip to L2 per 4 elements of x a thread (4 for the 8B shape's rows of 4096); the
 * weight loads issued before it (gemv_first_loads) stream meanwhile.
 */
template <typename T>
__device__ static void gemv_stage_norm(float *xs, unsigned tile, const float *x, size_t m,
                                       unsigned kdim, const float *g, float eps)
{
    constexpr int V = vec_io<T>::VEC;
    constexpr unsigned NT = 32 * GEMV_WARPS;
    __shared__ double red[MM_ROWS][GEMV_WARPS];
    float *const gs = xs + m * tile;
    const unsigned groups = (unsigned)m * kdim / 4, chunk = 32u * V;
    const unsigned kpad = (kdim + chunk - 1) / chunk * chunk; /* <= tile */
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;

#pragma unroll 1
    for (unsigned q = threadIdx.x; q < groups; q += NT) {
        const unsigned r = 4 * q / kdim, e = 4 * q - r * kdim;
        float v[4];

        gemv_x4(x, GANG_CUDA_GLU_NONE, kdim, r, e, v);
        if (r == 0) /* at x's positions: the last pass reads both in the banks' order */
            for (int d = 0; d < 4; d++)
                gs[vec_swz<V>(e + d)] = g[e + d];
        for (int d = 0; d < 4; d++)
            xs[r * tile + vec_swz<V>(e + d)] = v[d];
    }
    __syncthreads();
#pragma unroll 1
    for (unsigned r = 0; r < m; r++) {
        double ss = 0.0;

#pragma unroll 1
        for (unsigned p = threadIdx.x; p < kpad; p += NT)
            if (vec_unswz<V>(p) < kdim) {
                const double v = xs[r * tile + p];

                ss += v * v;
            }
        ss = warp_sum(ss);
        if (lane == 0)
            red[r][warp] = ss;
    }
    __syncthreads();
#pragma unroll 1
    for (unsigned r = 0; r < m; r++) {
        double ss = 0.0;

        for (int w = 0; w < GEMV_WARPS; w++)
            ss += red[r][w];
        const float scale = rms_scale(ss, kdim, eps);

#pragma unroll 1
        for (unsigned p = threadIdx.x; p < kpad; p += NT) {
            const unsigned e = vec_unswz<V>(p);

            if (e < kdim)
                xs[r * tile + p] = vec_io<T>::round(xs[r * tile + p] * scale * gs[p]);
        }
    }
}

/*
 * The gated unit of a [gate | up] product as the GEMV's output (gout, gemv_kernel): the
 * reduced sums of the block's 8 rows (acc, times the row's scale when scales is not NULL)
 * meet in shared memory, warp w < 4's gate row with warp w + 4's up row of the same index
 * idx, and lane 0 of warp w writes y[r n + idx] = glu(gate, up): what gang_cuda_glu gives of
 * the two products the plain GEMV would write. Every warp of the block calls it (a barrier).
 */
__device__ static void gemv_glu_out(const float *acc, size_t m, size_t n, int gout, int valid,
                                    size_t o, size_t idx, const float *scales, float *y)
{
    /* [r][0: gate, 1: up][warp % 4], rows of 32 floats: a gate's sum and its up's are 128
     * bytes apart, as tests/ptx-loads.py wants every shared read of the GEMV to be */
    __shared__ float part[MM_ROWS][2][32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, half = GEMV_WARPS / 2;

    for (int r = 0; r < MM_ROWS && (size_t)r < m; r++) {
        const float v = warp_sum(acc[r]);

        if (lane == 0)
            part[r][warp / half][warp % half] = valid && scales != NULL ? v * scales[o] : v;
    }
    __syncthreads();
    if (lane != 0 || warp >= half || !valid)
        return;
    for (int r = 0; r < MM_ROWS && (size_t)r < m; r++)
        y[r * n + idx] =
            gang_cuda_glu(gout == GANG_CUDA_GLU_GELU, part[r][0][warp], part[r][1][warp]);
}

template <typename T>
__global__ static void __launch_bounds__(32 * GEMV_WARPS, 4)
    gemv_kernel(size_t m, size_t n, size_t kdim, unsigned tile, const float *x, int xv, int glu,
                int gout, const T *w, const float *scales, const float *g, float eps, int add,
                float *y)
{
    constexpr int V = vec_io<T>::VEC;
    __shared__ float xs[GEMV_SMEM];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    /* gout: W is [2 n, kdim], gate rows then up rows; the block's warps w < 4 take gate
     * rows idx = 4 b + w, the others the up rows of the same idx (gemv_glu_out) */
    const size_t idx = (size_t)blockIdx.x * (GEMV_WARPS / 2) + (size_t)(warp % (GEMV_WARPS / 2));
    const size_t o = gout == GANG_CUDA_GLU_NONE ? (size_t)blockIdx.x * GEMV_WARPS + warp
                     : warp < GEMV_WARPS / 2    ? idx
                                                : n + idx;
    const int valid = gout == GANG_CUDA_GLU_NONE ? o < n : idx < n;
    const T *row = w + (valid ? o : 0) * kdim;
    float acc[MM_ROWS];

    pdl_trigger(); /* the next GEMV may start its weight loads */
    for (int r = 0; r < MM_ROWS; r++)
        acc[r] = 0.0f;
    for (size_t k0 = 0; k0 < kdim; k0 += tile) {
        const unsigned kt = kdim - k0 < tile ? (unsigned)(kdim - k0) : tile;
        const unsigned total = (unsigned)m * kt; /* <= GEMV_SMEM */
        uint4 wv[GEMV_PRE] = {};
        unsigned i0 = (unsigned)lane * V;

        if (valid)
            gemv_first_loads<T>(wv, row + k0, i0, kt);
        /* x, and y's last readers, are the earlier kernels': the first tile waits for them
         * (the later ones return at once), on a path tests/ptx-pdl.py sees every pass take */
        pdl_wait();
        __syncthreads(); /* the previous tile is no longer read */
        if (g != NULL)
            gemv_stage_norm<T>(xs, tile, x, m, kt, g, eps); /* one tile: kt = kdim */
        else if (xv) {
            /* GEMV_XU of the thread's 4-element groups loaded before the first is stored */
            for (unsigned q0 = threadIdx.x; q0 < total / 4; q0 += 32 * GEMV_WARPS * GEMV_XU) {
                float v[GEMV_XU][4];

#pragma unroll
                for (int u = 0; u < GEMV_XU; u++) {
                    const unsigned q = q0 + u * 32 * GEMV_WARPS;
                    const unsigned r = 4 * q / kt, e = 4 * q - r * kt; /* kt % 4 == 0 */

                    if (q < total / 4)
                        gemv_x4(x, glu, kdim, r, k0 + e, v[u]);
                }
#pragma unroll
                for (int u = 0; u < GEMV_XU; u++) {
                    const unsigned q = q0 + u * 32 * GEMV_WARPS;
                    const unsigned r = 4 * q / kt, e = 4 * q - r * kt;

                    if (q < total / 4)
                        for (int d = 0; d < 4; d++)
                            xs[r * tile + vec_swz<V>(e + d)] = vec_io<T>::round(v[u][d]);
                }
            }
        } else {
            for (unsigned i = threadIdx.x; i < total; i += 32 * GEMV_WARPS) {
                unsigned r = i / kt, e = i - r * kt;

                xs[r * tile + vec_swz<V>(e)] = vec_io<T>::round(gemv_x(x, glu, kdim, r, k0 + e));
            }
        }
        __syncthreads();
        if (!valid)
            continue;
        gemv_stream<T>(acc, m, xs, tile, wv, row + k0, i0, kt);
    }
    pdl_wait(); /* at once after a tile's; a grid with no tile (kdim 0) still writes y after */
    if (gout != GANG_CUDA_GLU_NONE) {
        gemv_glu_out(acc, m, n, gout, valid, o, idx, scales, y);
        return;
    }
    if (!valid)
        return;
    for (int r = 0; r < MM_ROWS && (size_t)r < m; r++) {
        const float v = warp_sum(acc[r]);

        if (lane == 0) {
            const float p = scales != NULL ? v * scales[o] : v;

            y[r * n + o] = add ? y[r * n + o] + p : p; /* the residual add's numbers */
        }
    }
}

/* 1 when the decode GEMV takes a weight of element type T for m rows of x: at most MM_ROWS,
 * rows of whole 16-byte loads starting on 16-byte boundaries. */
template <typename T> static int gemv_takes(size_t m, size_t kdim, const void *w)
{
    return m != 0 && m <= MM_ROWS && kdim % vec_io<T>::VEC == 0 && ((uintptr_t)w & 15) == 0;
}

extern "C" int gang__cuda_gemv_takes(int wtype, size_t m, size_t kdim, const void *w)
{
    if (wtype == GANG_KW_BF16 || wtype == GANG_KW_F16)
        return gemv_takes<__half>(m, kdim, w);
    return wtype == GANG_KW_I8 && gemv_takes<int8_t>(m, kdim, w);
}

/*
 * The decode GEMV a (cuda-internal.h) over weights of element type T where it applies
 * (gemv_takes; with a norm, x 16-byte aligned and its rows and the norm's weights in one
 * tile each): launched, its launch status returned; GANG_ENOSYS where it does not apply
 * (the caller takes another kernel).
 */
template <typename T>
static int gemv_launch(cudaStream_t s, int pdl, const gang__cuda_gemv_fused &a)
{
    const size_t per = a.glu_out == GANG_CUDA_GLU_NONE ? GEMV_WARPS : GEMV_WARPS / 2;
    size_t blocks = (a.n + per - 1) / per;

    if (!gemv_takes<T>(a.m, a.kdim, a.w) || blocks > INT32_MAX ||
        (a.glu_in != GANG_CUDA_GLU_NONE && a.glu_out != GANG_CUDA_GLU_NONE) ||
        (a.acc && a.glu_out != GANG_CUDA_GLU_NONE))
        return GANG_ENOSYS;
    /* x staged four elements a load where its rows are 16-byte aligned (kdim % 4 == 0: V is
     * 8 or 16) */
    const int xv = ((uintptr_t)a.x & 15) == 0;
    /* a norm's tile: the whole rows, a multiple of 512 (gemv_tile), the weights after them */
    const size_t ntile = (a.kdim + 511) / 512 * 512;
    const unsigned tile = a.norm != NULL ? (unsigned)ntile : gemv_tile(a.m);
    const T *w = (const T *)a.w;

    if (a.norm != NULL && (!xv || a.glu_in != GANG_CUDA_GLU_NONE || (a.m + 1) * ntile > GEMV_SMEM))
        return GANG_ENOSYS;
#if defined(__CUDACC__) /* nvcc; the emulator runs a stream's kernels in order anyway */
    if (pdl) {
        cudaLaunchAttribute at;
        cudaLaunchConfig_t cfg = pdl_config(dim3((unsigned)blocks), dim3(32 * GEMV_WARPS), s, &at);

        return gang__cuda_err(cudaLaunchKernelEx(&cfg, gemv_kernel<T>, a.m, a.n, a.kdim, tile, a.x,
                                                 xv, a.glu_in, a.glu_out, w, a.scales, a.norm,
                                                 a.eps, a.acc, a.y),
                              "gemv launch (PDL)");
    }
#else
    (void)pdl;
#endif
    gemv_kernel<T><<<(unsigned)blocks, 32 * GEMV_WARPS, 0, s>>>(a.m, a.n, a.kdim, tile, a.x, xv,
                                                                a.glu_in, a.glu_out, w, a.scales,
                                                                a.norm, a.eps, a.acc, a.y);
    return gang__cuda_err(cudaGetLastError(), "gemv launch");
}

/* The arguments of a plain decode GEMV (no norm, no gated output): y [+]= in(x) . W^T. */
static gang__cuda_gemv_fused gemv_plain(size_t m, size_t n, size_t kdim, const float *x,
                                        const void *w, const float *scales, int glu, int add,
                                        float *y)
{
    return {m, n, kdim, x, w, scales, NULL, 0.0f, glu, GANG_CUDA_GLU_NONE, add, y};
}

extern "C" int gang__cuda_launch_matmul_i8(cudaStream_t s, int glu, int pdl, size_t m, size_t n,
                                           size_t kdim, const float *x, const int8_t *w,
                                           const float *scales, int add, float *y)
{
    int rc = gemv_launch<int8_t>(s, pdl, gemv_plain(m, n, kdim, x, w, scales, glu, add, y));

    if (rc != GANG_ENOSYS || glu != GANG_CUDA_GLU_NONE)
        return rc;
    matmul_i8_kernel<<<(unsigned)n, MM_THREADS, 0, s>>>(m, n, kdim, x, w, scales, add, y);
    return gang__cuda_err(cudaGetLastError(), "int8 matmul launch");
}

/* The bf16 / f16 decode GEMV: gemv_kernel over half weights (8 elements a load), x rounded to
 * the weight's type as it is staged, the products summed in f32. */
extern "C" int gang__cuda_launch_gemv_half(cudaStream_t s, int glu, int pdl, int bf16, size_t m,
                                           size_t n, size_t kdim, const float *x, const void *w,
                                           float *y)
{
    const gang__cuda_gemv_fused a = gemv_plain(m, n, kdim, x, w, NULL, glu, 0, y);

    return bf16 ? gemv_launch<__nv_bfloat16>(s, pdl, a) : gemv_launch<__half>(s, pdl, a);
}

/* The decode GEMV with its fusions (gang__cuda_gemv_fused, cuda-internal.h); GANG_ENOSYS where it
 * does not apply. */
extern "C" int gang__cuda_launch_gemv_fused(cudaStream_t s, int wtype, int pdl,
                                            const gang__cuda_gemv_fused *a)
{
    if (wtype == GANG_KW_BF16)
        return gemv_launch<__nv_bfloat16>(s, pdl, *a);
    if (wtype == GANG_KW_F16)
        return gemv_launch<__half>(s, pdl, *a);
    if (wtype == GANG_KW_I8)
        return gemv_launch<int8_t>(s, pdl, *a);
    return GANG_ENOSYS;
}

/* Element d of table row id as f32 (wtype: GANG_KW_BF16, _F16 or _I8). */
__device__ static float emb_elem(int wtype, const void *table, const float *scales, size_t id,
                                 size_t dim, size_t d)
{
    size_t i = id * dim + d;

    if (wtype == GANG_KW_BF16)
        return __bfloat162float(((const __nv_bfloat16 *)table)[i]);
    if (wtype == GANG_KW_F16)
        return __half2float(((const __half *)table)[i]);
    return (float)((const int8_t *)table)[i] * scales[id];
}

__global__ static void embedding_w_kernel(int wtype, const void *table, const float *scales,
                                          size_t dim, const int32_t *ids, size_t n_ids,
                                          const int *flag, float *out)
{
    size_t total = n_ids * dim;

    if (*flag != 0)
        return;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t t = i / dim, d = i % dim;

        out[i] = emb_elem(wtype, table, scales, (size_t)ids[t], dim, d);
    }
}

extern "C" int gang__cuda_launch_embedding_w(cudaStream_t s, int wtype, const void *table,
                                             const float *scales, size_t dim, const int32_t *ids,
                                             size_t n_ids, const int *flag, float *out)
{
    size_t b = (n_ids * dim + EMB_THREADS - 1) / EMB_THREADS;
    unsigned blocks = (unsigned)(b > EMB_MAX_BLOCKS ? EMB_MAX_BLOCKS : (b == 0 ? 1 : b));

    embedding_w_kernel<<<blocks, EMB_THREADS, 0, s>>>(wtype, table, scales, dim, ids, n_ids, flag,
                                                      out);
    return gang__cuda_err(cudaGetLastError(), "typed embedding launch");
}
