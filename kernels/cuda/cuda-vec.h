/*
 * The CUDA kernels' 16-byte loads of one element type (CUDA C++ only: included by the .cu
 * files, never by C). vec_io<T>: VEC, the elements of T one 16-byte load holds; load(p,
 * out), those elements at p (16-byte aligned) widened to f32; round(x), x rounded to T and
 * back (what a value stored as T then read again is); store(x), x as T (rounded to
 * nearest even). The decode step's attention reads its KV pool with them (cuda-step.cu),
 * the decode GEMV its weights (cuda-matmul.cu). The 16 bytes are taken apart with memcpy,
 * never through a pointer cast: reading a uint4 through a bf16 / half pointer is undefined
 * (strict aliasing), and the CUDA emulator's host compiler (tests/cuda-emu/) read zeros.
 * from16(v, out) widens 16 bytes already loaded (the decode GEMV issues some loads early);
 * load is vec_load16 then from16.
 *
 * Also the gated unit's formula (gang_cuda_glu), which the GLU kernel and the decode GEMVs
 * that stage it (gemv_x) share, so that the fused product sees the unfused values.
 */
#ifndef GANGLION_CUDA_VEC_H
#define GANGLION_CUDA_VEC_H

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>
#include <string.h>

#include "cuda-internal.h"

/* GANG_EMU_ALIGNED(p, n, what): nothing here; the CUDA emulator (tests/cuda-emu/emu-kernel.h,
 * force-included first) defines it to abort, naming the kernel, when p is not n-byte
 * aligned. A 16-byte load or store (uint4, float4) at an address that is not a multiple of
 * 16 faults on the device ("misaligned address", which ends the context) and reads fine in
 * the emulator's host build; every vector access of the kernels is checked with it. */
#ifndef GANG_EMU_ALIGNED
#define GANG_EMU_ALIGNED(p, n, what) ((void)0)
#endif

/*
 * The 16 bytes at p (16-byte aligned, in memory no thread writes while the kernel runs:
 * weights, KV rows of earlier steps) in registers. On the device one 16-byte load through
 * the read-only path (__ldg of a uint4: ld.global.nc.v4.u32, an intrinsic, so no C++
 * aliasing question); in the emulator's host build a memcpy, which may read any object.
 * Taking the bytes apart straight from global memory instead (a memcpy from a reference to
 * it, a char pointer into it, even a memcpy told the alignment) compiles to sixteen byte
 * loads: what the decode GEMV's loop and the step attention did from 08e3041 (2026-12-04)
 * to 2026-12-05, which ptxas -v does not show (tests/ptx-loads.py now counts them).
 */
__device__ static inline uint4 vec_load16(const void *p)
{
#if defined(__CUDA_ARCH__)
    return __ldg((const uint4 *)p);
#else
    uint4 v;

    GANG_EMU_ALIGNED(p, 16, "vec_load16");
    memcpy(&v, p, sizeof(v));
    return v;
#endif
}

/*
 * Where element e of a run of x is kept in shared memory when lanes read it V at a time
 * (V = vec_io<T>::VEC: the elements of the lane's 16-byte load of weights or K/V). Lane l
 * multiplies the V consecutive elements (l + 32 c) V .. + V - 1, so the warp's 32 lanes
 * read x at a stride of V floats: stored in order, each of those shared loads would hit 4
 * of the 32 banks (V = 8: an 8-way conflict; 16-way for int8), and the decode GEMV would
 * wait on shared memory rather than HBM (~8 B of weights a cycle per SM, where the H200's
 * HBM gives each SM ~18). So each chunk of 32 V elements is stored transposed: element j of
 * lane l's run at j x 32 + l, and the warp reads 32 consecutive words, one per bank (its
 * read of element j of its run: chunk c's base + 32 j + lane). Found by reading the code
 * (2026-12-05), before any device ran it; tests/ptx-loads.py holds the GEMV's shared loads
 * to that stride.
 *
 * vec_swz_lanes is the layout for runs read by groups of L lanes (L a power of two up to
 * 32: the step attention's key streams, step_lanes): chunks of L V, element j of lane l's
 * run at j L + l, so a group reads L consecutive words and the groups of a warp, reading
 * the same q, the same words. vec_swz is a whole warp's (L = 32): the GEMV's staged x.
 */
template <int V> __device__ static inline unsigned vec_swz_lanes(unsigned e, unsigned L)
{
    const unsigned chunk = L * V, w = e % chunk;

    return e - w + (w % V) * L + w / V;
}

template <int V> __device__ static inline unsigned vec_swz(unsigned e)
{
    return vec_swz_lanes<V>(e, 32u);
}

/* The element vec_swz keeps at position p: its inverse (p - w + (w % 32) V + w / 32 in a
 * chunk's w), for a pass over the staged x in the order of the banks. */
template <int V> __device__ static inline unsigned vec_unswz(unsigned p)
{
    const unsigned chunk = 32u * V, w = p % chunk;

    return p - w + (w % 32u) * V + w / 32u;
}

/*
 * load(u, i) then use(u, i) for a thread's elements i = threadIdx.x, + THREADS, ... < n, U
 * at a time: the U loads of a round first, so their round trips overlap, then the uses in
 * the same order (sums keep their order). A block-per-row kernel (the norms, the sampler)
 * is one block at batch 1, and its elements taken one at a time were a round trip each: a
 * load cannot pass the store before it when the buffers may alias. The caller keeps the U
 * values in arrays its lambdas index by u (registers once unrolled).
 */
template <int U, unsigned THREADS, typename Load, typename Use>
__device__ static inline void strided_rounds(size_t n, Load load, Use use)
{
    for (size_t i0 = threadIdx.x; i0 < n; i0 += (size_t)THREADS * U) {
        if (i0 + (size_t)(U - 1) * THREADS < n) {
            /* A whole round, without a bound per element: with U predicates (and an SM has
             * 7) ptxas interleaved the loads with the uses, rmsnorm's sum of squares keeping
             * 2 or 3 loads in flight rather than 8 (read from the SASS, 2026-12-05). */
#pragma unroll
            for (int u = 0; u < U; u++)
                load(u, i0 + (size_t)u * THREADS);
#pragma unroll
            for (int u = 0; u < U; u++)
                use(u, i0 + (size_t)u * THREADS);
            continue;
        }
#pragma unroll
        for (int u = 0; u < U; u++)
            if (i0 + (size_t)u * THREADS < n)
                load(u, i0 + (size_t)u * THREADS);
#pragma unroll
        for (int u = 0; u < U; u++)
            if (i0 + (size_t)u * THREADS < n)
                use(u, i0 + (size_t)u * THREADS);
    }
}

template <typename T> struct vec_io;

template <> struct vec_io<float> {
    static constexpr int VEC = 4;
    __device__ static void from16(const uint4 &v, float *out)
    {
        memcpy(out, &v, 4 * sizeof(float));
    }
    __device__ static void load(const float *p, float *out)
    {
        GANG_EMU_ALIGNED(p, 16, "vec_io<float>::load");
        float4 v = *(const float4 *)p;
        out[0] = v.x, out[1] = v.y, out[2] = v.z, out[3] = v.w;
    }
    __device__ static float round(float x)
    {
        return x;
    }
    __device__ static float store(float x)
    {
        return x;
    }
};

template <> struct vec_io<__nv_bfloat16> {
    static constexpr int VEC = 8;
    __device__ static void from16(const uint4 &v, float *out)
    {
        __nv_bfloat16 h[8];
        memcpy((void *)h, &v, sizeof(h)); /* not a cast: reading a uint4 as bf16 breaks aliasing */
        for (int i = 0; i < 8; i++)
            out[i] = __bfloat162float(h[i]);
    }
    __device__ static void load(const __nv_bfloat16 *p, float *out)
    {
        from16(vec_load16(p), out);
    }
    __device__ static float round(float x)
    {
        return __bfloat162float(__float2bfloat16_rn(x));
    }
    __device__ static __nv_bfloat16 store(float x)
    {
        return __float2bfloat16_rn(x);
    }
};

template <> struct vec_io<__half> {
    static constexpr int VEC = 8;
    __device__ static void from16(const uint4 &v, float *out)
    {
        __half h[8];
        memcpy((void *)h, &v, sizeof(h));
        for (int i = 0; i < 8; i++)
            out[i] = __half2float(h[i]);
    }
    __device__ static void load(const __half *p, float *out)
    {
        from16(vec_load16(p), out);
    }
    __device__ static float round(float x)
    {
        return __half2float(__float2half_rn(x));
    }
    __device__ static __half store(float x)
    {
        return __float2half_rn(x);
    }
};

/* int8 weights (their row scale applied by the caller): round is the identity on f32. */
template <> struct vec_io<int8_t> {
    static constexpr int VEC = 16;
    __device__ static void from16(const uint4 &v, float *out)
    {
        const int8_t *q = (const int8_t *)&v; /* a char type may read any object */
        for (int i = 0; i < 16; i++)
            out[i] = (float)q[i];
    }
    __device__ static void load(const int8_t *p, float *out)
    {
        from16(vec_load16(p), out);
    }
    __device__ static float round(float x)
    {
        return x;
    }
};

/* The sum of v over the 32 lanes of the warp, in every lane (the decode GEMVs' reduction of
 * a row's lane sums: butterfly shuffles, 16 lanes apart first). */
__device__ static inline float warp_sum(float v)
{
    for (int d = 16; d > 0; d >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, d);
    return v;
}

/* The same in double: the row sums of squares of the RMSNorms (block_sum, the GEMV's). */
__device__ static inline double warp_sum(double v)
{
    for (int d = 16; d > 0; d >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, d);
    return v;
}

/* RMSNorm's factor of a row of dim elements whose squares sum (in double) to ss: the one
 * formula of rmsnorm_kernel, add_rmsnorm_kernel and the GEMV that norms its input as it
 * stages it (gemv_stage_norm), each element then x * scale * w in f32, in that order. */
__device__ static inline float rms_scale(double ss, size_t dim, float eps)
{
    return (float)(1.0 / sqrt(ss / (double)dim + (double)eps));
}

/* silu(g) * u (gelu 0) or gelu_tanh(g) * u (gelu 1): gang_kernels_silu_mul / gelu_mul's
 * formulas, as glu_kernel computes them. */
__device__ static inline float gang_cuda_glu(int gelu, float g, float u)
{
    return gelu ? 0.5f * g * (1.0f + tanhf(0.7978845608028654f * (g + 0.044715f * g * g * g))) * u
                : g / (1.0f + expf(-g)) * u;
}

/* Element k of row r of a decode GEMV's input: x [m, kdim] itself (glu GANG_CUDA_GLU_NONE), or
 * the gated unit of the [gate | up] rows x [m, 2 kdim] (the down projection's input, which
 * the GEMV computes as it stages it instead of a GLU launch writing it first). */
__device__ static inline float gemv_x(const float *x, int glu, size_t kdim, size_t r, size_t k)
{
    const float *row;

    if (glu == GANG_CUDA_GLU_NONE)
        return x[r * kdim + k];
    row = x + r * 2 * kdim;
    return gang_cuda_glu(glu == GANG_CUDA_GLU_GELU, row[k], row[kdim + k]);
}

/* Elements k .. k + 3 of row r of a decode GEMV's input, as gemv_x gives them one by one,
 * from 16-byte loads (x, k and kdim 16-byte / 4-element aligned). */
__device__ static inline void gemv_x4(const float *x, int glu, size_t kdim, size_t r, size_t k,
                                      float *out)
{
    if (glu == GANG_CUDA_GLU_NONE) {
        GANG_EMU_ALIGNED(x + r * kdim + k, 16, "gemv_x4");
        float4 v = *(const float4 *)(x + r * kdim + k);
        out[0] = v.x, out[1] = v.y, out[2] = v.z, out[3] = v.w;
        return;
    }
    const float *row = x + r * 2 * kdim;
    GANG_EMU_ALIGNED(row + k, 16, "gemv_x4 (gate)");
    GANG_EMU_ALIGNED(row + kdim + k, 16, "gemv_x4 (up)");
    float4 g = *(const float4 *)(row + k), u = *(const float4 *)(row + kdim + k);
    const int gelu = glu == GANG_CUDA_GLU_GELU;
    out[0] = gang_cuda_glu(gelu, g.x, u.x);
    out[1] = gang_cuda_glu(gelu, g.y, u.y);
    out[2] = gang_cuda_glu(gelu, g.z, u.z);
    out[3] = gang_cuda_glu(gelu, g.w, u.w);
}

#endif
