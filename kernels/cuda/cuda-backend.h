/*
 * The CUDA backend's device discovery, for the kernels front (kernels/backend.c). No CUDA
 * types: backend.c includes this file in every build, and only the registration (#if
 * GANG_HAVE_CUDA_KERNELS in backend.c) decides whether the real CUDA table
 * (gang__kernels_cuda_backend, kernels-backend.h) exists.
 *
 * The backend keeps per-handle state (stream, pool, cuBLASLt plans) behind ctx. Its
 * tensors are device memory: ids, positions and the like are validated on the device.
 */
#ifndef GANGLION_KERNELS_CUDA_BACKEND_H
#define GANGLION_KERNELS_CUDA_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "ganglion/kernels.h"

#include "../kernels-backend.h"

/* Device discovery (cuda-device.c); the front answers for builds without CUDA. */
int gang__cuda_device_count(void);
/* cuda-blas.c: loads cuBLASLt/cuBLAS, writes the cuBLASLt file mapped ("" on failure). */
int gang__blas_library(char *path, size_t cap);
int gang__cuda_device_info(int index, gang_device_info *out);
int gang__cuda_device_can_access_peer(int a, int b);

#endif
