/*
 * The CUDA emulator's view from a kernel (tests/cuda-emu/, issue #24): force-included
 * (g++ -include) into each of kernels/cuda's .cu files, after rewrite-launch.py has turned its
 * `kernel<<<grid, block, shared, stream>>>(args)` launches into gang_emu_launch calls, so
 * that the kernels the device runs are compiled as host C++ and executed by
 * emu-runtime.cpp: every CUDA thread of a block a fiber, blocks one after another (in
 * alternating orders), __syncthreads and the warp shuffles the points where fibers switch,
 * a block's shared arrays poisoned as it starts. The device code is
 * the same text nvcc compiles for the H200; only the qualifiers and the built-ins below are
 * host definitions: those the kernels use (a kernel that calls another built-in fails to
 * compile here until it is added).
 *
 * What it checks beyond the arithmetic: a __syncthreads that not every live thread of the
 * block reaches, a shuffle whose partner lane has exited and a kernel argument pointing to
 * host memory (all abort with the kernel's name; on a GPU they hang, read garbage or
 * fault), a 16-byte vector access at an address that is not a multiple of 16 (a
 * misaligned-address fault on the device), launch shapes over the device's limits, and, in
 * the runtime, a host
 * synchronisation or allocation inside a graph capture.
 */
#ifndef GANGLION_CUDA_EMU_KERNEL_H
#define GANGLION_CUDA_EMU_KERNEL_H

#define __device__
#define __global__
#define __host__
#define __shared__ static
#define __constant__ static
#define __forceinline__ inline
#define __launch_bounds__(...)

#include <cuda_runtime_api.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#ifdef __cplusplus
#include <functional>
#include <tuple>
#include <type_traits>

/* A launch's <<<grid, block[, shared bytes[, stream]]>>>. */
struct gang_emu_cfg {
    dim3 grid, block;
    size_t shared;
    cudaStream_t stream;
    gang_emu_cfg(dim3 g, dim3 b, size_t s = 0, cudaStream_t st = 0)
        : grid(g), block(b), shared(s), stream(st)
    {
    }
};

/* Runs body once per thread of the grid (now, or when the graph captured on cfg.stream is
 * launched); a bad shape sets the error cudaGetLastError returns. */
void gang_emu_launch(const gang_emu_cfg &cfg, const char *name, std::function<void()> body);

/* Aborts, naming the kernel and the argument, when p (not NULL) lies in no allocation of
 * cudaMalloc or cudaMallocHost: a host pointer handed to a kernel, which faults on the
 * device (an illegal address that ends the context) and would read fine here. */
void gang_emu_check_pointer(const char *kernel, int arg, const void *p);

/* Aborts, naming the running kernel and what (the access), unless p is n-byte aligned: the
 * kernels' 16-byte loads and stores (uint4, float4) fault on the device at a misaligned
 * address and work here. kernels/cuda/cuda-vec.h calls it as GANG_EMU_ALIGNED. */
void gang_emu_check_aligned(const void *p, unsigned n, const char *what);
#define GANG_EMU_ALIGNED(p, n, what) gang_emu_check_aligned((p), (n), (what))

template <typename T> static inline void gang_emu_check_arg(const char *k, int i, const T &v)
{
    if constexpr (std::is_pointer<T>::value)
        gang_emu_check_pointer(k, i, (const void *)v);
}

/* The launch the rewritten code calls: the arguments already copied (args), each pointer
 * among them checked, then fn(args...) run by every thread of the grid. */
template <typename Tuple, typename Fn>
static inline void gang_emu_launch_args(const gang_emu_cfg &cfg, const char *name, Tuple args,
                                        Fn fn)
{
    std::apply(
        [name](const auto &...a) {
            int i = 0;
            (gang_emu_check_arg(name, i++, a), ...);
        },
        args);
    gang_emu_launch(cfg, name, [args, fn]() { std::apply(fn, args); });
}

/* Called by the first thread of a block to reach a __shared__ array's declaration (the
 * call rewrite-launch.py appends to it): sets its bytes to 0xff, once per block, as the
 * device gives a block shared memory it did not write (emu-runtime.cpp). */
void gang_emu_shared_fresh(void *p, size_t bytes);

/* Runs op now, or records it into the graph being captured on stream (the emulated
 * cuBLASLt enqueues its products with it). */
cudaError_t gang_emu_enqueue(cudaStream_t stream, std::function<void()> op);

/* The running thread's coordinates (emu-runtime.cpp sets them at every fiber switch). */
extern uint3 gang_emu_thread_idx, gang_emu_block_idx;
extern dim3 gang_emu_block_dim, gang_emu_grid_dim;
#define threadIdx gang_emu_thread_idx
#define blockIdx gang_emu_block_idx
#define blockDim gang_emu_block_dim
#define gridDim gang_emu_grid_dim

void gang_emu_syncthreads(void);
/* The value of lane (own lane ^ lane_xor, or src lane for mode 1, or lane + delta for mode
 * 2) within groups of width lanes: every live lane of the warp in mask deposits its own. */
uint64_t gang_emu_shfl(unsigned mask, uint64_t v, int mode, int arg, int width);

static inline void __syncthreads(void)
{
    gang_emu_syncthreads();
}

template <typename T> static inline T gang_emu_shfl_t(unsigned mask, T v, int mode, int arg, int w)
{
    static_assert(sizeof(T) <= 8, "shuffle of at most 8 bytes");
    uint64_t u = 0;
    T r;

    memcpy(&u, &v, sizeof(v));
    u = gang_emu_shfl(mask, u, mode, arg, w);
    memcpy(&r, &u, sizeof(r));
    return r;
}
template <typename T> static inline T __shfl_xor_sync(unsigned mask, T v, int lane_xor, int w = 32)
{
    return gang_emu_shfl_t(mask, v, 0, lane_xor, w);
}
template <typename T> static inline T __shfl_sync(unsigned mask, T v, int src, int w = 32)
{
    return gang_emu_shfl_t(mask, v, 1, src, w);
}
template <typename T> static inline T __shfl_down_sync(unsigned mask, T v, unsigned d, int w = 32)
{
    return gang_emu_shfl_t(mask, v, 2, (int)d, w);
}

/* Fibers switch only at the synchronisation points above, so a read-modify-write is
 * atomic here as it is on the device. */
template <typename T> static inline T atomicOr(T *p, T v)
{
    T old = *p;
    *p = old | v;
    return old;
}
template <typename T> static inline T atomicAdd(T *p, T v)
{
    T old = *p;
    *p = old + v;
    return old;
}
/* glibc declares __expf itself (its internal name): a macro, not a function. */
#define __expf(x) expf(x)
static inline unsigned __float_as_uint(float x)
{
    unsigned u;
    memcpy(&u, &x, sizeof(u));
    return u;
}
#endif

#endif
