/*
 * NVML through dlopen: loading, device identity, samples and topology.
 *
 * Only nvmlInit_v2, nvmlShutdown, nvmlDeviceGetCount_v2 and nvmlDeviceGetHandleByIndex_v2
 * are required; every other entry point is optional (older drivers, fake libraries) and a
 * missing one leaves its fields at zero. A call that answers NVML_ERROR_GPU_IS_LOST marks
 * the sample lost: the device fell off the bus or the driver gave up on it.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ganglion/common.h"
#include "ganglion/gpu.h"
#include "gpu-internal.h"

/* Resolves name into *slot (a function pointer of any type); NULL when absent. */
static void nvml_sym(gang_nvml *n, void *slot, const char *name)
{
    void *p = dlsym(n->lib, name);
    memcpy(slot, &p, sizeof(p));
}

static void nvml_resolve(gang_nvml *n)
{
#define GANG_NVML_SYM(field, type, symbol) nvml_sym(n, &n->field, #symbol);
    GANG_NVML_ENTRIES(GANG_NVML_SYM)
#undef GANG_NVML_SYM
    /* The throttle reasons under their newer name, preferred when the library has it. */
    void *events = dlsym(n->lib, "nvmlDeviceGetCurrentClocksEventReasons");
    if (events != NULL)
        memcpy(&n->throttle, &events, sizeof(events));
}

int gang_nvml_open(const char *path, gang_nvml **out, char *err, size_t errlen)
{
    int rc;
    const char *lib = path != NULL && path[0] != '\0' ? path : GANG_GPU_DEFAULT_LIB;
    gang_nvml *n = calloc(1, sizeof(*n));
    *out = NULL;
    if (n == NULL) {
        snprintf(err, errlen, "out of memory");
        return GANG_ENOMEM;
    }
    n->lib = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
    if (n->lib == NULL) {
        snprintf(err, errlen, "cannot load %s: %s", lib, dlerror());
        rc = GANG_ENOENT;
        goto out_free;
    }
    nvml_resolve(n);
    if (n->init == NULL || n->shutdown == NULL || n->count == NULL || n->by_index == NULL) {
        snprintf(err, errlen, "%s lacks nvmlInit_v2, nvmlShutdown or the device queries", lib);
        rc = GANG_EIO;
        goto out_close;
    }
    nvml_ret r = n->init();
    if (r != NVML_SUCCESS) {
        snprintf(err, errlen, "nvmlInit_v2 of %s: %s (%d)", lib, gang__nvml_error(n, r), r);
        rc = r == NVML_ERROR_DRIVER_NOT_LOADED ? GANG_ENOENT : GANG_EIO;
        goto out_close;
    }
    *out = n;
    return 0;
out_close:
    dlclose(n->lib);
out_free:
    free(n);
    return rc;
}

void gang_nvml_close(gang_nvml *n)
{
    if (n == NULL)
        return;
    n->shutdown();
    dlclose(n->lib);
    free(n);
}

const char *gang__nvml_error(const gang_nvml *n, nvml_ret r)
{
    const char *s = n->error_string != NULL ? n->error_string(r) : NULL;
    return s != NULL ? s : "NVML error";
}

int gang_nvml_count(gang_nvml *n, uint32_t *count)
{
    unsigned int c = 0;
    *count = 0;
    if (n->count(&c) != NVML_SUCCESS)
        return GANG_EIO;
    *count = c > GANG_GPU_MAX ? GANG_GPU_MAX : c;
    return 0;
}

int gang__nvml_device(gang_nvml *n, uint32_t index, nvml_device *dev)
{
    uint32_t count;
    int rc = gang_nvml_count(n, &count);
    if (rc != 0)
        return rc;
    if (index >= count)
        return GANG_EINVAL;
    nvml_ret r = n->by_index(index, dev);
    if (r == NVML_ERROR_GPU_IS_LOST)
        return GANG_EIO;
    return r == NVML_SUCCESS ? 0 : GANG_EIO;
}

/* Name, UUID and PCI bus id of dev into the three buffers (empty when unknown). */
static void nvml_identity(gang_nvml *n, nvml_device dev, char *name, char *uuid, char *bus)
{
    nvml_pci_info pci;
    name[0] = uuid[0] = bus[0] = '\0';
    if (n->name != NULL && n->name(dev, name, GANG_GPU_TEXT_MAX) != NVML_SUCCESS)
        name[0] = '\0';
    if (n->uuid != NULL && n->uuid(dev, uuid, GANG_GPU_TEXT_MAX) != NVML_SUCCESS)
        uuid[0] = '\0';
    memset(&pci, 0, sizeof(pci));
    if (n->pci != NULL && n->pci(dev, &pci) == NVML_SUCCESS) {
        pci.bus_id[sizeof(pci.bus_id) - 1] = '\0';
        gang_strlcpy(bus, pci.bus_id, GANG_GPU_BUS_MAX);
    }
    name[GANG_GPU_TEXT_MAX - 1] = uuid[GANG_GPU_TEXT_MAX - 1] = '\0';
}

/* Records r: 1 when the call succeeded, 0 otherwise, marking the sample lost on GPU_IS_LOST. */
static int nvml_ok(gang_gpu_sample *s, nvml_ret r)
{
    if (r == NVML_ERROR_GPU_IS_LOST)
        s->lost = 1;
    return r == NVML_SUCCESS;
}

/* The ECC and retirement fields of a sample (a GPU without ECC answers NOT_SUPPORTED). */
static void nvml_sample_errors(gang_nvml *n, nvml_device dev, gang_gpu_sample *s)
{
    unsigned long long v;
    int state;
    unsigned int corr, unc, pending, failed;
    if (n->ecc != NULL) {
        if (nvml_ok(s, n->ecc(dev, NVML_MEMORY_ERROR_CORRECTED, NVML_VOLATILE_ECC, &v)))
            s->ecc_sbe_volatile = v;
        if (nvml_ok(s, n->ecc(dev, NVML_MEMORY_ERROR_UNCORRECTED, NVML_VOLATILE_ECC, &v)))
            s->ecc_dbe_volatile = v;
    }
    if (n->retired_pending != NULL && nvml_ok(s, n->retired_pending(dev, &state)))
        s->retired_pending = state != 0;
    if (n->remapped != NULL && nvml_ok(s, n->remapped(dev, &corr, &unc, &pending, &failed)))
        s->remap_pending = pending != 0;
}

int gang_nvml_sample(gang_nvml *n, uint32_t index, gang_gpu_sample *s)
{
    nvml_device dev;
    nvml_utilization u;
    nvml_memory m;
    unsigned int v;
    unsigned long long reasons;

    memset(s, 0, sizeof(*s));
    s->gpu = index;
    int rc = gang__nvml_device(n, index, &dev);
    if (rc == GANG_EINVAL)
        return rc;
    s->valid = 1;
    if (rc != 0) {
        s->lost = 1;
        return 0;
    }
    nvml_identity(n, dev, s->name, s->uuid, s->bus_id);
    if (n->util != NULL && nvml_ok(s, n->util(dev, &u))) {
        s->util_gpu = u.gpu;
        s->util_mem = u.memory;
    }
    if (n->memory != NULL && nvml_ok(s, n->memory(dev, &m))) {
        s->fb_used_mib = m.used >> 20;
        s->fb_free_mib = m.free >> 20;
        s->fb_total_mib = m.total >> 20;
    }
    if (n->temp != NULL && nvml_ok(s, n->temp(dev, NVML_TEMPERATURE_GPU, &v)))
        s->temp_c = v;
    if (n->power != NULL && nvml_ok(s, n->power(dev, &v)))
        s->power_mw = v;
    if (n->clock != NULL && nvml_ok(s, n->clock(dev, NVML_CLOCK_SM, &v)))
        s->sm_clock_mhz = v;
    if (n->clock != NULL && nvml_ok(s, n->clock(dev, NVML_CLOCK_MEM, &v)))
        s->mem_clock_mhz = v;
    if (n->throttle != NULL && nvml_ok(s, n->throttle(dev, &reasons)))
        s->throttle_reasons = reasons;
    nvml_sample_errors(n, dev, s);
    return 0;
}

/* Sets bit i of a CPU bitmap from an NVML unsigned-long mask of nwords words. */
static uint32_t nvml_mask_to_cpus(const unsigned long *mask, unsigned nwords, uint8_t *cpus)
{
    uint32_t set = 0;
    const unsigned bits = 8 * sizeof(unsigned long);
    memset(cpus, 0, GANG_GPU_CPUS_MAX / 8);
    for (unsigned i = 0; i < GANG_GPU_CPUS_MAX && i / bits < nwords; i++) {
        if (mask[i / bits] & (1ul << (i % bits))) {
            cpus[i / 8] |= (uint8_t)(1u << (i % 8));
            set++;
        }
    }
    return set;
}

/* The placement facts of GPU index: identity, NUMA node, local CPUs. */
static int nvml_info(gang_nvml *n, uint32_t index, gang_gpu_info *g)
{
    enum { WORDS = GANG_GPU_CPUS_MAX / (8 * sizeof(unsigned long)) };
    unsigned long mask[WORDS];
    nvml_device dev;
    memset(g, 0, sizeof(*g));
    g->index = index;
    g->numa_node = -1;
    int rc = gang__nvml_device(n, index, &dev);
    if (rc != 0)
        return rc;
    nvml_identity(n, dev, g->name, g->uuid, g->bus_id);
    memset(mask, 0, sizeof(mask));
    if (n->cpu_affinity != NULL && n->cpu_affinity(dev, WORDS, mask) == NVML_SUCCESS)
        g->ncpus = nvml_mask_to_cpus(mask, WORDS, g->cpus);
    memset(mask, 0, sizeof(mask));
    if (n->mem_affinity != NULL &&
        n->mem_affinity(dev, WORDS, mask, NVML_AFFINITY_SCOPE_NODE) == NVML_SUCCESS) {
        for (unsigned i = 0; i < 8 * sizeof(mask); i++) {
            if (mask[i / (8 * sizeof(unsigned long))] &
                (1ul << (i % (8 * sizeof(unsigned long))))) {
                g->numa_node = (int32_t)i;
                break;
            }
        }
    }
    return 0;
}

/* Labels the connected components of the NVLink graph, in order of their lowest GPU. */
static void nvml_islands(gang_gpu_topology *t)
{
    t->nislands = 0;
    for (uint32_t i = 0; i < t->count; i++)
        t->island[i] = -1;
    for (uint32_t i = 0; i < t->count; i++) {
        if (t->island[i] >= 0)
            continue;
        int32_t id = (int32_t)t->nislands++;
        uint32_t stack[GANG_GPU_MAX], sp = 0;
        t->island[i] = id;
        stack[sp++] = i;
        while (sp > 0) {
            uint32_t a = stack[--sp];
            for (uint32_t b = 0; b < t->count; b++) {
                if (t->nvlink[a][b] && t->island[b] < 0) {
                    t->island[b] = id;
                    stack[sp++] = b;
                }
            }
        }
    }
}

int gang_nvml_topology(gang_nvml *n, gang_gpu_topology *t, char *err, size_t errlen)
{
    nvml_device devs[GANG_GPU_MAX];
    memset(t, 0, sizeof(*t));
    int rc = gang_nvml_count(n, &t->count);
    if (rc != 0) {
        snprintf(err, errlen, "nvmlDeviceGetCount_v2 failed");
        return rc;
    }
    for (uint32_t i = 0; i < t->count; i++) {
        rc = nvml_info(n, i, &t->gpu[i]);
        if (rc == 0)
            rc = gang__nvml_device(n, i, &devs[i]);
        if (rc != 0) {
            snprintf(err, errlen, "GPU %u does not answer NVML", i);
            return GANG_EIO;
        }
    }
    for (uint32_t a = 0; a < t->count && n->p2p != NULL; a++) {
        for (uint32_t b = a + 1; b < t->count; b++) {
            int st = -1;
            if (n->p2p(devs[a], devs[b], NVML_P2P_CAPS_INDEX_NVLINK, &st) == NVML_SUCCESS &&
                st == NVML_P2P_STATUS_OK)
                t->nvlink[a][b] = t->nvlink[b][a] = 1;
        }
    }
    nvml_islands(t);
    return 0;
}
