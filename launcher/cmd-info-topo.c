/*
 * ganglion info: the GPU topology NVML reports and the placement serve would choose
 * (gpu/: gang_nvml_topology, gang_gpu_place), so an operator sees before serving which
 * GPU each local rank gets and which CPUs it will be bound to.
 */
#include <stdio.h>
#include <stdlib.h>

#include "cmds.h"
#include "ganglion/common.h"
#include "ganglion/gpu.h"

/* One line per GPU: identity, NUMA node, local CPUs, island and NVLink peers. */
static void print_topology(const gang_gpu_topology *t)
{
    char cpus[256];
    printf("GPU topology (NVML): %u GPU(s), %u NVLink island(s)\n", t->count, t->nislands);
    for (uint32_t i = 0; i < t->count; i++) {
        const gang_gpu_info *g = &t->gpu[i];
        gang_gpu_cpus_format(g->cpus, cpus, sizeof(cpus));
        printf("  GPU %u  %s  %s  bus %s  NUMA %d  CPUs %s  island %d  NVLink peers:", i,
               g->name[0] ? g->name : "?", g->uuid[0] ? g->uuid : "?",
               g->bus_id[0] ? g->bus_id : "?", g->numa_node, cpus[0] ? cpus : "?", t->island[i]);
        int any = 0;
        for (uint32_t j = 0; j < t->count; j++) {
            if (t->nvlink[i][j]) {
                printf(" %u", j);
                any = 1;
            }
        }
        printf("%s\n", any ? "" : " none");
    }
}

int gang__info_topology(const char *lib, int64_t nproc, int64_t tp)
{
    char err[256];
    gang_nvml *n = NULL;
    uint32_t map[GANG_GPU_MAX];
    int rc = gang_nvml_open(lib, &n, err, sizeof(err));
    if (rc != 0) {
        printf("GPU topology: NVML not available (%s)\n", err);
        return GANG_EXIT_OK;
    }
    gang_gpu_topology *t = malloc(sizeof(*t));
    if (t == NULL || gang_nvml_topology(n, t, err, sizeof(err)) != 0) {
        printf("GPU topology: %s\n", t == NULL ? "out of memory" : err);
        free(t);
        gang_nvml_close(n);
        return GANG_EXIT_OK;
    }
    print_topology(t);
    uint32_t np = nproc > 0 ? (uint32_t)nproc : t->count;
    uint32_t tpl = (uint32_t)tp < np ? (uint32_t)tp : np;
    if (np == 0 || gang_gpu_place(t, np, tpl, map) != 0) {
        printf("placement: none for --nproc-per-node %u with TP groups of %u on %u GPU(s)\n", np,
               tpl, t->count);
    } else {
        printf("placement for --nproc-per-node %u, TP groups of %u (serve --gpu-bind):\n", np, tpl);
        for (uint32_t l = 0; l < np; l++) {
            char cpus[256];
            gang_gpu_cpus_format(t->gpu[map[l]].cpus, cpus, sizeof(cpus));
            printf("  local rank %u -> GPU %u  island %d  NUMA %d  CPUs %s\n", l, map[l],
                   t->island[map[l]], t->gpu[map[l]].numa_node, cpus[0] ? cpus : "?");
        }
    }
    free(t);
    gang_nvml_close(n);
    return GANG_EXIT_OK;
}
