/*
 * Placement: which GPU each local rank gets, and binding a process next to its GPU.
 *
 * The mapping. A TP group's ranks all-reduce twice per layer, so they belong on GPUs that
 * talk over NVLink: local ranks are cut into groups of tp_local consecutive ranks (the TP
 * groups of the node; with TP 1 every rank is a group of one) and every group, in order,
 * takes tp_local free GPUs of one island: the island with the fewest free GPUs that still
 * fit the group (best fit keeps big islands whole for later groups), ties broken by the
 * NUMA node of its first free GPU and then by index. A group no island can hold takes the
 * lowest free GPUs. Within a group, GPUs go in index order. With TP 1 there is no TP
 * traffic and the map is the identity. On a machine without NVLink
 * every GPU is its own island, so TP 1 gives the identity map and larger groups fall back
 * to index order, which is also the identity.
 *
 * The binding. CPUs: the GPU's local CPUs (NVML affinity) intersected with what the
 * process may use (its cpuset in a container); memory: MPOL_PREFERRED on the GPU's NUMA
 * node, so that host staging buffers land next to the GPU but allocations never fail for
 * lack of local memory.
 */
#include <ctype.h>
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "ganglion/common.h"
#include "ganglion/gpu.h"

#define PLACE_MPOL_PREFERRED 1 /* <linux/mempolicy.h>; libnuma is not needed for one call */

/* Free GPUs of island id in t (used[] marks taken ones), in index order, into out. */
static uint32_t island_free(const gang_gpu_topology *t, int32_t id, const uint8_t *used,
                            uint32_t *out)
{
    uint32_t n = 0;
    for (uint32_t g = 0; g < t->count; g++)
        if (t->island[g] == id && !used[g])
            out[n++] = g;
    return n;
}

/* The island that best fits a group of size k, or -1 when none has k free GPUs. */
static int32_t best_island(const gang_gpu_topology *t, const uint8_t *used, uint32_t k)
{
    int32_t best = -1;
    uint32_t best_free = 0, free_gpus[GANG_GPU_MAX];
    int32_t best_numa = 0;
    for (uint32_t id = 0; id < t->nislands; id++) {
        uint32_t nf = island_free(t, (int32_t)id, used, free_gpus);
        if (nf < k)
            continue;
        int32_t numa = t->gpu[free_gpus[0]].numa_node;
        if (best < 0 || nf < best_free || (nf == best_free && numa < best_numa)) {
            best = (int32_t)id;
            best_free = nf;
            best_numa = numa;
        }
    }
    return best;
}

int gang_gpu_place(const gang_gpu_topology *t, uint32_t nproc, uint32_t tp_local, uint32_t *map)
{
    uint8_t used[GANG_GPU_MAX] = {0};
    uint32_t free_gpus[GANG_GPU_MAX];
    if (nproc == 0 || tp_local == 0 || nproc % tp_local != 0 || t->count < nproc ||
        t->count > GANG_GPU_MAX)
        return GANG_EINVAL;
    if (tp_local == 1) { /* no TP traffic inside the node: islands do not matter */
        for (uint32_t l = 0; l < nproc; l++)
            map[l] = l;
        return 0;
    }
    for (uint32_t first = 0; first < nproc; first += tp_local) {
        int32_t id = best_island(t, used, tp_local);
        uint32_t n = 0;
        if (id >= 0) {
            island_free(t, id, used, free_gpus);
            n = tp_local;
        } else {
            for (uint32_t g = 0; g < t->count && n < tp_local; g++)
                if (!used[g])
                    free_gpus[n++] = g;
        }
        for (uint32_t i = 0; i < tp_local; i++) {
            map[first + i] = free_gpus[i];
            used[free_gpus[i]] = 1;
        }
    }
    return 0;
}

void gang_gpu_cpus_format(const uint8_t *cpus, char *buf, size_t cap)
{
    size_t len = 0;
    buf[0] = '\0';
    for (int i = 0; i < GANG_GPU_CPUS_MAX; i++) {
        if (!(cpus[i / 8] & (1u << (i % 8))))
            continue;
        int j = i;
        while (j + 1 < GANG_GPU_CPUS_MAX && (cpus[(j + 1) / 8] & (1u << ((j + 1) % 8))))
            j++;
        int w = j > i ? snprintf(buf + len, cap - len, "%s%d-%d", len ? "," : "", i, j)
                      : snprintf(buf + len, cap - len, "%s%d", len ? "," : "", i);
        if (w < 0 || (size_t)w >= cap - len)
            return;
        len += (size_t)w;
        i = j;
    }
}

int gang_gpu_bind(const gang_gpu_info *g, char *desc, size_t cap)
{
    cpu_set_t allowed, want;
    char list[256];
    int n = 0;
    if (sched_getaffinity(0, sizeof(allowed), &allowed) != 0)
        return gang_err_from_errno(errno);
    CPU_ZERO(&want);
    for (int i = 0; i < GANG_GPU_CPUS_MAX && i < CPU_SETSIZE; i++) {
        if ((g->cpus[i / 8] & (1u << (i % 8))) && CPU_ISSET(i, &allowed)) {
            CPU_SET(i, &want);
            n++;
        }
    }
    gang_gpu_cpus_format(g->cpus, list, sizeof(list));
    if (n == 0) {
        snprintf(desc, cap, "GPU %u: none of its CPUs (%s) is allowed here; affinity unchanged",
                 g->index, list[0] ? list : "unknown");
    } else {
        if (sched_setaffinity(0, sizeof(want), &want) != 0)
            return gang_err_from_errno(errno);
        snprintf(desc, cap, "GPU %u: bound to %d CPU(s) of %s", g->index, n, list);
    }
    if (g->numa_node >= 0 && g->numa_node < 64) {
        unsigned long mask = 1ul << g->numa_node;
        size_t len = strlen(desc);
        /* A kernel without NUMA support refuses: the CPU binding alone still helps. */
        if (syscall(SYS_set_mempolicy, PLACE_MPOL_PREFERRED, &mask, 8 * sizeof(mask) + 1) == 0)
            snprintf(desc + len, cap - len, ", memory preferred on NUMA node %d", g->numa_node);
        else
            snprintf(desc + len, cap - len, ", NUMA node %d not bindable (%s)", g->numa_node,
                     strerror(errno));
    }
    return 0;
}

/* Parses "dddd:bb:dd.f" with any domain width; 0 or -1. */
static int bus_parse(const char *s, unsigned long v[4])
{
    char *end;
    for (int i = 0; i < 4; i++) {
        if (!isxdigit((unsigned char)*s))
            return -1;
        v[i] = strtoul(s, &end, 16);
        if (i < 3 && *end != (i == 2 ? '.' : ':'))
            return -1;
        s = end + (i < 3);
    }
    return *s == '\0' ? 0 : -1;
}

int gang_gpu_bus_id_equal(const char *a, const char *b)
{
    unsigned long x[4], y[4];
    if (bus_parse(a, x) != 0 || bus_parse(b, y) != 0)
        return 0;
    return memcmp(x, y, sizeof(x)) == 0;
}
