/*
 * The subset of NVML this module uses, declared from the NVML API reference (there is no
 * nvml.h at build time: the library is opened with dlopen). Internal to gpu/ and to the
 * fake NVML of the tests (tests/fake-nvml/), which implements exactly these entry points;
 * keep the two in step. Every function returns an nvml_ret (nvmlReturn_t).
 */
#ifndef GANGLION_GPU_NVML_API_H
#define GANGLION_GPU_NVML_API_H

typedef int nvml_ret;
typedef struct nvml_device_st *nvml_device;
typedef struct nvml_event_set_st *nvml_event_set;

/* nvmlReturn_t values used here. */
#define NVML_SUCCESS 0
#define NVML_ERROR_INVALID_ARGUMENT 2
#define NVML_ERROR_NOT_SUPPORTED 3
#define NVML_ERROR_NOT_FOUND 6
#define NVML_ERROR_DRIVER_NOT_LOADED 9
#define NVML_ERROR_TIMEOUT 10
#define NVML_ERROR_GPU_IS_LOST 15
#define NVML_ERROR_UNKNOWN 999

/* nvmlPciInfo_t (the v3 layout of nvmlDeviceGetPciInfo_v3). */
typedef struct nvml_pci_info {
    char bus_id_legacy[16];
    unsigned int domain;
    unsigned int bus;
    unsigned int device;
    unsigned int pci_device_id;
    unsigned int pci_subsystem_id;
    char bus_id[32];
} nvml_pci_info;

typedef struct nvml_utilization {
    unsigned int gpu;
    unsigned int memory;
} nvml_utilization;

typedef struct nvml_memory {
    unsigned long long total;
    unsigned long long free;
    unsigned long long used;
} nvml_memory;

/* nvmlEventData_t */
typedef struct nvml_event_data {
    nvml_device device;
    unsigned long long event_type;
    unsigned long long event_data; /* the Xid code for an Xid event */
    unsigned int gpu_instance_id;
    unsigned int compute_instance_id;
} nvml_event_data;

#define NVML_EVENT_TYPE_XID_CRITICAL_ERROR 0x8ull
#define NVML_TEMPERATURE_GPU 0
#define NVML_CLOCK_SM 1
#define NVML_CLOCK_MEM 2
#define NVML_MEMORY_ERROR_CORRECTED 0
#define NVML_MEMORY_ERROR_UNCORRECTED 1
#define NVML_VOLATILE_ECC 0
#define NVML_AFFINITY_SCOPE_NODE 0
#define NVML_P2P_CAPS_INDEX_NVLINK 2
#define NVML_P2P_STATUS_OK 0

typedef nvml_ret (*nvml_init_fn)(void);
typedef const char *(*nvml_error_string_fn)(nvml_ret r);
typedef nvml_ret (*nvml_count_fn)(unsigned int *count);
typedef nvml_ret (*nvml_by_index_fn)(unsigned int index, nvml_device *dev);
typedef nvml_ret (*nvml_text_fn)(nvml_device dev, char *buf, unsigned int len);
typedef nvml_ret (*nvml_pci_fn)(nvml_device dev, nvml_pci_info *pci);
typedef nvml_ret (*nvml_util_fn)(nvml_device dev, nvml_utilization *u);
typedef nvml_ret (*nvml_memory_fn)(nvml_device dev, nvml_memory *m);
typedef nvml_ret (*nvml_temp_fn)(nvml_device dev, int sensor, unsigned int *celsius);
typedef nvml_ret (*nvml_uint_fn)(nvml_device dev, unsigned int *value);
typedef nvml_ret (*nvml_clock_fn)(nvml_device dev, int clock, unsigned int *mhz);
typedef nvml_ret (*nvml_u64_fn)(nvml_device dev, unsigned long long *value);
typedef nvml_ret (*nvml_ecc_fn)(nvml_device dev, int error_type, int counter_type,
                                unsigned long long *count);
typedef nvml_ret (*nvml_enable_fn)(nvml_device dev, int *state);
typedef nvml_ret (*nvml_remap_fn)(nvml_device dev, unsigned int *corr, unsigned int *unc,
                                  unsigned int *pending, unsigned int *failed);
typedef nvml_ret (*nvml_cpu_affinity_fn)(nvml_device dev, unsigned int n, unsigned long *set);
typedef nvml_ret (*nvml_mem_affinity_fn)(nvml_device dev, unsigned int n, unsigned long *set,
                                         int scope);
typedef nvml_ret (*nvml_p2p_fn)(nvml_device a, nvml_device b, int caps_index, int *status);
typedef nvml_ret (*nvml_set_create_fn)(nvml_event_set *set);
typedef nvml_ret (*nvml_set_free_fn)(nvml_event_set set);
typedef nvml_ret (*nvml_register_fn)(nvml_device dev, unsigned long long types, nvml_event_set set);
typedef nvml_ret (*nvml_wait_fn)(nvml_event_set set, nvml_event_data *data,
                                 unsigned int timeout_ms);

/*
 * Every NVML entry point gpu/ calls, once: X(field of struct gang_nvml, pointer type,
 * symbol). It makes the struct's fields (gpu-internal.h), the dlsym loop (nvml.c; the
 * throttle reasons are looked up under their newer name first) and the fake NVML's check of
 * its own signatures against these types (tests/fake-nvml/fake-nvml.c).
 */
#define GANG_NVML_ENTRIES(X)                                                                       \
    X(init, nvml_init_fn, nvmlInit_v2)                                                             \
    X(shutdown, nvml_init_fn, nvmlShutdown)                                                        \
    X(error_string, nvml_error_string_fn, nvmlErrorString)                                         \
    X(count, nvml_count_fn, nvmlDeviceGetCount_v2)                                                 \
    X(by_index, nvml_by_index_fn, nvmlDeviceGetHandleByIndex_v2)                                   \
    X(name, nvml_text_fn, nvmlDeviceGetName)                                                       \
    X(uuid, nvml_text_fn, nvmlDeviceGetUUID)                                                       \
    X(pci, nvml_pci_fn, nvmlDeviceGetPciInfo_v3)                                                   \
    X(util, nvml_util_fn, nvmlDeviceGetUtilizationRates)                                           \
    X(memory, nvml_memory_fn, nvmlDeviceGetMemoryInfo)                                             \
    X(temp, nvml_temp_fn, nvmlDeviceGetTemperature)                                                \
    X(power, nvml_uint_fn, nvmlDeviceGetPowerUsage)                                                \
    X(clock, nvml_clock_fn, nvmlDeviceGetClockInfo)                                                \
    X(throttle, nvml_u64_fn, nvmlDeviceGetCurrentClocksThrottleReasons)                            \
    X(ecc, nvml_ecc_fn, nvmlDeviceGetTotalEccErrors)                                               \
    X(retired_pending, nvml_enable_fn, nvmlDeviceGetRetiredPagesPendingStatus)                     \
    X(remapped, nvml_remap_fn, nvmlDeviceGetRemappedRows)                                          \
    X(cpu_affinity, nvml_cpu_affinity_fn, nvmlDeviceGetCpuAffinity)                                \
    X(mem_affinity, nvml_mem_affinity_fn, nvmlDeviceGetMemoryAffinity)                             \
    X(p2p, nvml_p2p_fn, nvmlDeviceGetP2PStatus)                                                    \
    X(set_create, nvml_set_create_fn, nvmlEventSetCreate)                                          \
    X(set_free, nvml_set_free_fn, nvmlEventSetFree)                                                \
    X(reg, nvml_register_fn, nvmlDeviceRegisterEvents)                                             \
    X(wait, nvml_wait_fn, nvmlEventSetWait_v2)

#endif /* GANGLION_GPU_NVML_API_H */
