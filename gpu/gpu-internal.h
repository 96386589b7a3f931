/* Internal to gpu/: the loaded NVML (nvml.c) that health.c and place.c use. */
#ifndef GANGLION_GPU_INTERNAL_H
#define GANGLION_GPU_INTERNAL_H

#include <stdint.h>

#include "nvml-api.h"

struct gang_nvml {
    void *lib;
#define GANG_NVML_FIELD(field, type, symbol) type field;
    GANG_NVML_ENTRIES(GANG_NVML_FIELD)
#undef GANG_NVML_FIELD
};

/* The text of an NVML return code (nvmlErrorString when present). */
const char *gang__nvml_error(const struct gang_nvml *n, nvml_ret r);
/* The handle of GPU index: 0, GANG_EINVAL (no such index) or GANG_EIO (lost, error). */
int gang__nvml_device(struct gang_nvml *n, uint32_t index, nvml_device *dev);

#endif
