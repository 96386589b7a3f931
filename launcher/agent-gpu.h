/*
 * The agent's view of its GPUs (internal to launcher/; agent-gpu.c): the GPU faults its
 * workers reported, whether one persisted across a gang restart (then /healthz fails),
 * and the per-GPU metrics with DCGM-exporter names.
 */
#ifndef GANGLION_LAUNCHER_AGENT_GPU_H
#define GANGLION_LAUNCHER_AGENT_GPU_H

#include <stdint.h>

#include "ganglion/rendezvous.h"
#include "ganglion/serve.h"
#include "supervisor.h"

#define GANG_AGENT_GPU_KINDS 32 /* distinct (rank, GPU, kind) fault counters */

typedef struct gang__gpu_faults {
    uint64_t fault_gen[GANG_MAX_LOCAL_RANKS]; /* generation of each local rank's last GPU
                                                 fault since the node last served; 0 none */
    int persistent;                           /* a fault persisted across a restart */
    char reason[GANG_REASON_MAX];             /* the fault that persisted */
    uint64_t total;                           /* GPU faults recorded */
    uint32_t n;
    struct {
        int32_t rank;
        int32_t gpu;
        char kind[24];
        uint64_t count;
    } kinds[GANG_AGENT_GPU_KINDS];
} gang__gpu_faults;

/*
 * Records a GPU fault (an ERROR with GANG_EGPU) of local rank `local` (global `rank`) in
 * generation gen. A second fault of the same local rank in a later generation, with no
 * serving generation between them, persisted across the restart: f->persistent is set
 * for good (the GPU needs a reset; kubelet should replace the Pod). Returns 1 when this
 * call set it.
 */
int gang__gpu_faults_record(gang__gpu_faults *f, uint64_t gen, int32_t rank, uint32_t local,
                            const char *reason);
/* The node's ranks all served a generation: earlier faults did not persist. */
void gang__gpu_faults_served(gang__gpu_faults *f);

/*
 * Appends the GPU families to b: one sample per local rank that reported a GPU (DCGM
 * names and labels gpu, UUID, device, modelName, plus rank), the Xid counts by code, the
 * health gauges, and the fault counters of f by rank, GPU and kind.
 */
void gang__gpu_metrics(gang_metrics_buf *b, const gang_sup *sup, uint32_t node, uint32_t nproc,
                       const gang__gpu_faults *f);

#endif
