/*
 * Private to the kernels module and the GEMM benchmarks (bench/bench-gemm.c,
 * bench/bench-matmul.c): what they cannot do through the public API, timing our GEMM
 * against the backend's reference library (cuBLAS for "cuda") on the device, and setting
 * the CPU backend's thread counts. Not installed, not part
 * of include/ganglion/.
 */
#ifndef GANGLION_KERNELS_BENCH_H
#define GANGLION_KERNELS_BENCH_H

#include <stddef.h>

#include "ganglion/kernels.h"

/*
 * One round: c_ours = a . op(b) through gang_kernels_gemm_ex's path, then c_ref = the same
 * product through the backend's reference GEMM, on the same stream; *ours_ms and *ref_ms
 * receive each one's device time. Tensors are the handle's (gang_kernels_alloc), layout
 * and dt as gang_kernels_gemm_ex (alpha 1, beta 0). Returns when both finished: 0,
 * GANG_EINVAL / GANG_ERANGE for bad arguments, GANG_ENOSYS on a backend without a
 * reference (the cpu backend), or the device's error.
 */
int gang__kernels_gemm_pair(gang_kernels *k, gang_dtype dt, int trans_b, size_t m, size_t n,
                            size_t kdim, const void *a, const void *b, void *c_ours, void *c_ref,
                            float *ours_ms, float *ref_ms);

/*
 * Threads of the "cpu" backend for `bench matmul`: n > 0 sets both the typed matmul's
 * pool (1: every call on its caller) and OpenBLAS's thread count; n = 0 changes nothing.
 * Returns the threads the pool has (the caller included), the most n can usefully be.
 */
unsigned gang__kernels_cpu_threads(unsigned n);

#endif /* GANGLION_KERNELS_BENCH_H */
