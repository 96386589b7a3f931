/*
 * Programmatic dependent launch (Hopper, compute capability 9.0; gang_kernels_options.pdl),
 * for the decode GEMVs. A kernel launched with the programmatic-serialization attribute may
 * start once every block of the kernel before it on the stream has called pdl_trigger (or
 * ended), instead of once that kernel has ended and its writes are flushed; it must then
 * call pdl_wait before it reads anything an earlier kernel wrote, or writes anything an
 * earlier kernel may still read: pdl_wait returns once the kernel before it has ended,
 * its writes visible (and so every kernel before that one). What may come before pdl_wait
 * is work on data no kernel writes: the GEMV's first weight loads, so the weights stream
 * while the kernel before it finishes instead of after its launch.
 *
 * Both are no-ops where they do not apply: in a kernel launched without the attribute
 * (pdl_wait returns at once), when compiled for an older device, and on the CUDA emulator
 * (tests/cuda-emu), which runs a stream's kernels one after another. So the rule above is
 * held on the PTX instead (tests/ptx-pdl.py): on every path of a waiting kernel, nothing
 * but read-only loads and prefetches before a wait. That analysis does not follow
 * conditions: wait where every path passes (a second pdl_wait returns at once).
 */
#ifndef GANG_CUDA_PDL_H
#define GANG_CUDA_PDL_H

/* Lets the stream's next kernel, if launched as a programmatic dependent, start now. */
__device__ static inline void pdl_trigger(void)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    cudaTriggerProgrammaticLaunchCompletion();
#endif
}

/* Waits until the kernel before this one has ended and its writes are visible. */
__device__ static inline void pdl_wait(void)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    cudaGridDependencySynchronize();
#endif
}

/* Asks for the 128-byte line at p to be brought into L2 (a hint: nothing waits for it,
 * nothing is read into registers); a no-op off the device. For data no kernel writes. */
__device__ static inline void prefetch_l2(const void *p)
{
#if defined(__CUDA_ARCH__)
    asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
#else
    (void)p;
#endif
}

#if defined(__CUDACC__) /* nvcc; the emulator runs a stream's kernels in order anyway */
/* The configuration that launches a grid x block kernel on s as a programmatic dependent
 * (cudaLaunchKernelEx); at: its one attribute, the caller's until the launch. */
static inline cudaLaunchConfig_t pdl_config(dim3 grid, dim3 block, cudaStream_t s,
                                            cudaLaunchAttribute *at)
{
    cudaLaunchConfig_t cfg = {};

    at->id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at->val.programmaticStreamSerializationAllowed = 1;
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.stream = s;
    cfg.attrs = at;
    cfg.numAttrs = 1;
    return cfg;
}
#endif

#endif
