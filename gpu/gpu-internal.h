/* Internal to gpu/: the loaded NVML (nvml.c) that health.c and place.c use. */
#ifndef GANGLION_GPU_INTERNAL_H
#define GANGLION_GPU_INTERNAL_H

#include <stdint.h>

#include "nvml-api.h"

struct gang_nvml {
    void *lib;
    nvml_init_fn init;
    nvml_init_fn shutdown;
    nvml_error_string_fn error_string;
    nvml_count_fn count;
    nvml_by_index_fn by_index;
    nvml_text_fn name;
    nvml_text_fn uuid;
    nvml_pci_fn pci;
    nvml_util_fn util;
    nvml_memory_fn memory;
    nvml_temp_fn temp;
    nvml_uint_fn power;
    nvml_clock_fn clock;
    nvml_u64_fn throttle;
    nvml_ecc_fn ecc;
    nvml_enable_fn retired_pending;
    nvml_remap_fn remapped;
    nvml_cpu_affinity_fn cpu_affinity;
    nvml_mem_affinity_fn mem_affinity;
    nvml_p2p_fn p2p;
    nvml_set_create_fn set_create;
    nvml_set_free_fn set_free;
    nvml_register_fn reg;
    nvml_wait_fn wait;
};

/* The text of an NVML return code (nvmlErrorString when present). */
const char *gang__nvml_error(const struct gang_nvml *n, nvml_ret r);
/* The handle of GPU index: 0, GANG_EINVAL (no such index) or GANG_EIO (lost, error). */
int gang__nvml_device(struct gang_nvml *n, uint32_t index, nvml_device *dev);

#endif
