/*
 * GPU health and topology (module gpu/): NVML, opened with dlopen at run time, read
 * through a small subset declared in gpu/nvml-api.h (no NVML type leaves the module).
 *
 * Three mechanisms:
 *   - samples (gpu/nvml.c): per GPU, the DCGM-exporter fields (utilisation, frame
 *     buffer, temperature, power, clocks, throttle reasons, ECC counts, retired or
 *     remapped rows pending) and whether the device still answers;
 *   - the health watch (gpu/health.c): a thread that waits for Xid events of one GPU
 *     (nvmlEventSet) and samples it every interval; it classifies what it sees into
 *     fatal conditions (the documented list of gang_gpu_xid_is_fatal, a double-bit ECC
 *     error, pending page retirement or row remapping, a device that no longer answers)
 *     and warnings (thermal and power throttling), and tells its owner through a
 *     callback;
 *   - placement (gpu/place.c): the node's topology (NUMA node and local CPUs of every
 *     GPU, NVLink peers and islands), the mapping of local ranks onto GPUs that keeps a
 *     TP group's ranks on one NVLink island, and the binding of a process to the CPUs and
 *     memory of its GPU's NUMA node.
 *
 * The library path is a parameter (--nvml-library): tests load a fake NVML
 * (tests/fake-nvml/) through the same dlopen path. Every function is safe without a GPU
 * or driver: gang_nvml_open answers GANG_ENOENT and nothing else runs.
 */
#ifndef GANGLION_GPU_H
#define GANGLION_GPU_H

#include <stddef.h>
#include <stdint.h>

#define GANG_GPU_MAX 64        /* GPUs of one node the module looks at */
#define GANG_GPU_CPUS_MAX 1024 /* CPUs an affinity mask can name */
#define GANG_GPU_TEXT_MAX 96   /* name, UUID */
#define GANG_GPU_BUS_MAX 32    /* PCI bus id "00000000:19:00.0" */
#define GANG_GPU_XID_SLOTS 8   /* distinct Xid codes counted per GPU */
#define GANG_GPU_FAULT_MAX 200 /* one fault sentence */
#define GANG_GPU_DEFAULT_LIB "libnvidia-ml.so.1"

typedef struct gang_nvml gang_nvml;

/*
 * Loads NVML from path (NULL or "" = GANG_GPU_DEFAULT_LIB) and initialises it. Returns 0
 * and *out (release with gang_nvml_close), GANG_ENOENT when the library is absent or has
 * no GPU driver behind it, GANG_EIO when it loads but lacks an entry point this module
 * needs or fails to initialise; err says which. Thread-safe once open (NVML is).
 */
int gang_nvml_open(const char *path, gang_nvml **out, char *err, size_t errlen);
void gang_nvml_close(gang_nvml *n);
/* GPUs NVML sees (capped at GANG_GPU_MAX). 0 or GANG_EIO. */
int gang_nvml_count(gang_nvml *n, uint32_t *count);

/* What placement needs to know of one GPU. */
typedef struct gang_gpu_info {
    uint32_t index;
    char name[GANG_GPU_TEXT_MAX];
    char uuid[GANG_GPU_TEXT_MAX];
    char bus_id[GANG_GPU_BUS_MAX];
    int32_t numa_node;                   /* -1: unknown */
    uint8_t cpus[GANG_GPU_CPUS_MAX / 8]; /* CPUs local to the GPU (bit i = CPU i) */
    uint32_t ncpus;                      /* bits set in cpus */
} gang_gpu_info;

typedef struct gang_gpu_topology {
    uint32_t count;
    gang_gpu_info gpu[GANG_GPU_MAX];
    uint8_t nvlink[GANG_GPU_MAX][GANG_GPU_MAX]; /* 1: the two GPUs are NVLink peers */
    int32_t island[GANG_GPU_MAX]; /* NVLink island (connected component), 0-based; a GPU
                                     without NVLink is an island of its own */
    uint32_t nislands;
} gang_gpu_topology;

/*
 * Reads every GPU's identity, NUMA node and local CPUs (nvmlDeviceGetCpuAffinity,
 * nvmlDeviceGetMemoryAffinity) and the NVLink peer matrix (nvmlDeviceGetP2PStatus on the
 * NVLink capability), and computes the islands. Returns 0 or GANG_EIO with err set.
 */
int gang_nvml_topology(gang_nvml *n, gang_gpu_topology *t, char *err, size_t errlen);

/* Throttle-reason bits that are warnings (nvmlClocksThrottleReason*). */
#define GANG_GPU_THROTTLE_SW_POWER 0x4ull
#define GANG_GPU_THROTTLE_HW_SLOWDOWN 0x8ull
#define GANG_GPU_THROTTLE_SW_THERMAL 0x20ull
#define GANG_GPU_THROTTLE_HW_THERMAL 0x40ull
#define GANG_GPU_THROTTLE_HW_POWER_BRAKE 0x80ull
#define GANG_GPU_THROTTLE_WARN_MASK 0xecull

/* One reading of one GPU: the metric values and the health verdict. Plain data, so it
 * travels between processes as bytes (same binary on both sides). */
typedef struct gang_gpu_sample {
    uint32_t gpu; /* NVML index */
    uint32_t valid;
    char uuid[GANG_GPU_TEXT_MAX];
    char name[GANG_GPU_TEXT_MAX];
    char bus_id[GANG_GPU_BUS_MAX];
    uint32_t util_gpu; /* percent */
    uint32_t util_mem; /* percent */
    uint64_t fb_used_mib;
    uint64_t fb_free_mib;
    uint64_t fb_total_mib;
    uint32_t temp_c;
    uint32_t power_mw;
    uint32_t sm_clock_mhz;
    uint32_t mem_clock_mhz;
    uint64_t throttle_reasons; /* nvmlClocksThrottleReason* bits */
    uint64_t ecc_sbe_volatile; /* corrected, since the driver loaded */
    uint64_t ecc_dbe_volatile; /* uncorrected, since the driver loaded */
    uint32_t retired_pending;  /* pages waiting for retirement at the next reset */
    uint32_t remap_pending;    /* rows waiting for remapping at the next reset */
    uint32_t lost;             /* the device stopped answering (NVML_ERROR_GPU_IS_LOST) */
    uint32_t last_xid;         /* most recent Xid code seen, 0: none */
    uint32_t n_xid;            /* used entries of xid[] */
    struct {
        uint32_t code;
        uint32_t pad;
        uint64_t count;
    } xid[GANG_GPU_XID_SLOTS];      /* Xid events seen by this process, by code */
    uint64_t fatal_total;           /* fatal conditions reported */
    uint32_t fatal;                 /* a fatal condition holds now (or an Xid was not yet
                                       acknowledged) */
    uint32_t warning;               /* a warning holds now (throttling) */
    char fault[GANG_GPU_FAULT_MAX]; /* the fatal condition, "" when none */
} gang_gpu_sample;

/*
 * Reads one sample of GPU index into s (Xid fields, fatal and fault left zero). A device
 * that does not answer gives 0 with s->lost = 1. Fields a GPU does not support stay 0.
 * Returns 0, GANG_EINVAL for a bad index.
 */
int gang_nvml_sample(gang_nvml *n, uint32_t index, gang_gpu_sample *s);

/* 1 when an Xid code is fatal for the gang (the list in docs/operations.md). */
int gang_gpu_xid_is_fatal(uint32_t xid);
/* A short description of an Xid code ("GPU has fallen off the bus"), never NULL. */
const char *gang_gpu_xid_text(uint32_t xid);
/*
 * The level conditions of a sample: returns 1 and a sentence in reason when one is fatal
 * (device lost, double-bit ECC errors, pending retirement or remapping), 0 otherwise.
 */
int gang_gpu_sample_fatal(const gang_gpu_sample *s, char *reason, size_t cap);

/*
 * Reads back a fault sentence of this module (possibly behind a prefix such as the
 * agent's "rank R (node N local L): "): *gpu the GPU index and kind one of "xid_<code>",
 * "lost", "dbe", "retired_pending", "remap_pending", "other". Returns 1 when it names a
 * GPU, 0 otherwise (*gpu = -1, kind "other"). For metric labels, which must not carry
 * free text.
 */
int gang_gpu_fault_kind(const char *reason, int32_t *gpu, char *kind, size_t cap);

/* --- the health watch -------------------------------------------------------------- */

typedef struct gang_gpu_watch gang_gpu_watch;

typedef struct gang_gpu_watch_config {
    gang_nvml *nvml;      /* borrowed; outlives the watch */
    uint32_t gpu;         /* NVML index of the watched GPU */
    uint64_t interval_ms; /* sampling period, >= 1; Xid events wake the watch at once */
    /* Called on the watch thread when a fatal condition appears (each new Xid, or a
     * level condition that was not there before). Must be async-safe for the owner: a
     * write to a pipe. */
    void (*on_fault)(void *ctx);
    void *ctx;
} gang_gpu_watch_config;

/*
 * Starts the watch thread: registers for Xid events on the GPU (a GPU that does not
 * support them is sampled only) and samples it every interval. Returns 0 and *out
 * (release with gang_gpu_watch_stop), or GANG_EINVAL, or a system error.
 */
int gang_gpu_watch_start(const gang_gpu_watch_config *cfg, gang_gpu_watch **out);
/* Stops and joins the thread (within one interval plus an NVML call), frees w. */
void gang_gpu_watch_stop(gang_gpu_watch *w);
/* The latest sample, with the Xid counts and the verdict. Any thread. */
void gang_gpu_watch_get(gang_gpu_watch *w, gang_gpu_sample *out);
/*
 * 1 and the reason when a fatal condition holds now or a fatal Xid arrived since the last
 * acknowledgement; ack = 1 acknowledges the Xid (the level conditions stay until they
 * clear). 0 when the GPU is healthy. Any thread.
 */
int gang_gpu_watch_fault(gang_gpu_watch *w, int ack, char *reason, size_t cap);

/* --- placement ------------------------------------------------------------------- */

/*
 * Maps local ranks 0..nproc-1 onto GPUs of t: map[l] = NVML index of local rank l's GPU.
 * Local ranks are cut into TP groups of tp_local consecutive ranks (tp_local divides
 * nproc); each group gets GPUs of one NVLink island when an island has enough free GPUs
 * (the smallest such island, ties broken by NUMA node then index), else the lowest free
 * GPUs. Within a group the GPUs are in index order. Deterministic: every worker of a node
 * computes the same map. Returns 0, or GANG_EINVAL when t has fewer GPUs than nproc or
 * tp_local does not divide nproc.
 */
int gang_gpu_place(const gang_gpu_topology *t, uint32_t nproc, uint32_t tp_local, uint32_t *map);

/*
 * Binds the calling thread (and the threads it starts afterwards) to the CPUs local to g
 * that the process may use (sched_setaffinity), and prefers g's NUMA node for memory
 * (set_mempolicy MPOL_PREFERRED). When none of g's CPUs is allowed, the affinity is left
 * alone. Writes what it did to desc. Returns 0, or a system error.
 */
int gang_gpu_bind(const gang_gpu_info *g, char *desc, size_t cap);

/* 1 when two PCI bus ids name the same function ("00000000:19:00.0" == "0000:19:00.0"). */
int gang_gpu_bus_id_equal(const char *a, const char *b);
/* Writes a CPU bitmap as a list ("0-3,8") into buf. */
void gang_gpu_cpus_format(const uint8_t *cpus, char *buf, size_t cap);

#endif /* GANGLION_GPU_H */
