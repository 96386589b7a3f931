/*
 * Device discovery for `ganglion info` and for choosing "auto": how many GPUs are
 * visible and what each one is.
 *
 * The CUDA runtime is linked statically and loads the driver (libcuda.so.1) itself on the
 * first call, so on a node without a driver every query here fails cleanly with
 * cudaErrorInsufficientDriver or cudaErrorNoDevice: the count is then 0 and nothing
 * aborts. The first failing call leaves a sticky "last error", which is cleared so that
 * later CUDA calls of the process do not report it.
 */
#include <stdio.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "cuda-backend.h"
#include "cuda-internal.h"

int gang__cuda_device_count(void)
{
    int n = 0;

    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return n;
}

/* Formats the 16 UUID bytes the way nvidia-smi prints them: GPU-8-4-4-4-12 hex digits. */
static void format_uuid(const unsigned char *b, char *out, size_t cap)
{
    snprintf(out, cap, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
             b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13],
             b[14], b[15]);
}

/*
 * Fills out from cudaGetDeviceProperties and cudaMemGetInfo. The free memory needs a
 * context on the device, which the runtime creates on first use (a few hundred MiB of
 * device memory for the life of the process); a failure there only leaves free_bytes 0.
 */
int gang__cuda_device_info(int index, gang_device_info *out)
{
    struct cudaDeviceProp prop;
    size_t free_b = 0, total_b = 0;
    int n = gang__cuda_device_count(), prev = 0;

    if (index < 0 || index >= n)
        return GANG_EINVAL;
    memset(out, 0, sizeof(*out));
    if (cudaGetDeviceProperties(&prop, index) != cudaSuccess) {
        cudaGetLastError();
        return GANG_EIO;
    }
    out->index = index;
    snprintf(out->name, sizeof(out->name), "%s", prop.name);
    format_uuid((const unsigned char *)prop.uuid.bytes, out->uuid, sizeof(out->uuid));
    snprintf(out->pci_bus_id, sizeof(out->pci_bus_id), "%04x:%02x:%02x.0",
             (unsigned)prop.pciDomainID, (unsigned)prop.pciBusID, (unsigned)prop.pciDeviceID);
    out->total_bytes = prop.totalGlobalMem;
    out->cc_major = prop.major;
    out->cc_minor = prop.minor;
    out->sm_count = prop.multiProcessorCount;
    out->integrated = prop.integrated;
    cudaGetDevice(&prev);
    if (cudaSetDevice(index) == cudaSuccess && cudaMemGetInfo(&free_b, &total_b) == cudaSuccess)
        out->free_bytes = free_b;
    else
        cudaGetLastError();
    cudaSetDevice(prev);
    return 0;
}

int gang__cuda_device_can_access_peer(int a, int b)
{
    int n = gang__cuda_device_count(), can = 0;

    if (a < 0 || b < 0 || a >= n || b >= n)
        return GANG_EINVAL;
    if (a == b)
        return 1;
    if (cudaDeviceCanAccessPeer(&can, a, b) != cudaSuccess) {
        cudaGetLastError();
        return GANG_EIO;
    }
    return can ? 1 : 0;
}
