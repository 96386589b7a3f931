/*
 * The worker's GPU: where it sits and whether it is healthy (see worker.h, gang__wgpu_*).
 *
 * Every worker of a node computes the same placement from the same NVML topology
 * (gang_gpu_place is deterministic), so no process has to hand the map out: local rank L
 * takes map[L], binds itself next to it and watches it. The agent stays NVML-free, as it
 * stays CUDA-free; it learns the GPU index and health from the GPU packets the worker
 * sends with its heartbeats (wctl.h).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ganglion/gpu.h"
#include "worker.h"

struct gang__wgpu {
    gang_nvml *nvml;
    gang_gpu_watch *watch;
    int event_fd;
    uint32_t gpu;
};

/* The watch thread's callback: wake the main thread through its event pipe. */
static void wgpu_on_fault(void *ctx)
{
    gang__wgpu *g = ctx;
    gang__wevent ev;
    memset(&ev, 0, sizeof(ev));
    ev.type = GANG__WEV_GPU;
    ssize_t n = write(g->event_fd, &ev, sizeof(ev));
    (void)n; /* the pipe outlives the watch; a full pipe blocks, it never drops */
}

/*
 * The GPU of local rank l. With --gpu-bind and a placement that applies (a GPU per local
 * rank, TP groups that divide the node): map[l], whose bus id goes to the CUDA side
 * (c->res.gpu_bus_id). Otherwise the GPU of index l modulo the GPUs NVML lists, watched
 * only: with fewer GPUs than local ranks (MIG instances or time-slicing share one GPU,
 * which NVML lists once) several ranks watch the same GPU, and CUDA keeps choosing by
 * local rank. Binds to the GPU's NUMA node with --gpu-bind (not when the topology cannot
 * be read). Returns the NVML index, or -1 when NVML lists no GPU.
 */
static int wgpu_place(gang_worker_config *c, gang_nvml *n, uint32_t l)
{
    char err[256], desc[512];
    uint32_t map[GANG_GPU_MAX];
    gang_gpu_topology *t = malloc(sizeof(*t));
    uint32_t count = 0;
    int gpu = -1;
    if (t == NULL || gang_nvml_topology(n, t, err, sizeof(err)) != 0) {
        /* A GPU that does not answer spoils the topology, not the watch: watch the local
         * rank's own GPU, whose first sample then says whether it is the lost one. */
        if (gang_nvml_count(n, &count) == 0 && count > 0)
            gpu = (int)(l % count);
        gang_warn("GPU placement: no topology (%s); local rank %u watches GPU %d unplaced",
                  t == NULL ? "out of memory" : err, l, gpu);
        goto out;
    }
    uint32_t nproc = c->nproc_per_node, tp = (uint32_t)c->res.layout.tc.tp;
    uint32_t tp_local = tp < nproc ? tp : nproc;
    if (c->gpu_bind && gang_gpu_place(t, nproc, tp_local, map) == 0) {
        gpu = (int)map[l];
        gang_strlcpy(c->res.gpu_bus_id, t->gpu[gpu].bus_id, sizeof(c->res.gpu_bus_id));
    } else if (t->count > 0) {
        gpu = (int)(l % t->count);
        if (t->count < nproc)
            gang_info("GPU placement: %u GPU(s) for %u local ranks (shared: MIG or "
                      "time-slicing): local rank %u watches GPU %d",
                      t->count, nproc, l, gpu);
    } else {
        gang_info("GPU placement: NVML lists no GPU");
        goto out;
    }
    if (c->gpu_bind) {
        int rc = gang_gpu_bind(&t->gpu[gpu], desc, sizeof(desc));
        if (rc != 0)
            gang_warn("GPU placement: cannot bind to GPU %d: %s", gpu, gang_strerror(rc));
        else
            gang_info("GPU placement: local rank %u -> %s (island %d, TP group of %u)", l, desc,
                      t->island[gpu], tp_local);
    }
out:
    free(t);
    return gpu;
}

int gang__wgpu_open(gang_worker_config *c, uint32_t local_rank, int event_fd, gang__wgpu **out)
{
    char err[256];
    *out = NULL;
    if (!c->gpu_bind && c->gpu_health_interval_ms == 0)
        return 0;
    gang__wgpu *g = calloc(1, sizeof(*g));
    if (g == NULL)
        return GANG_ENOMEM;
    g->event_fd = event_fd;
    int rc = gang_nvml_open(c->nvml_library, &g->nvml, err, sizeof(err));
    if (rc != 0) {
        /* A CPU node has no NVML; a named library that does not load is a mistake. */
        if (c->nvml_library[0] != '\0')
            gang_warn("GPU health and placement off: %s", err);
        else
            gang_debug("GPU health and placement off: %s", err);
        free(g);
        return 0;
    }
    int gpu = wgpu_place(c, g->nvml, local_rank);
    if (gpu < 0 || c->gpu_health_interval_ms == 0) {
        gang__wgpu_close(g);
        return 0;
    }
    g->gpu = (uint32_t)gpu;
    gang_gpu_watch_config wc = {.nvml = g->nvml,
                                .gpu = g->gpu,
                                .interval_ms = c->gpu_health_interval_ms,
                                .on_fault = wgpu_on_fault,
                                .ctx = g};
    rc = gang_gpu_watch_start(&wc, &g->watch);
    if (rc != 0) {
        gang_warn("GPU health watch of GPU %u not started: %s", g->gpu, gang_strerror(rc));
        gang__wgpu_close(g);
        return 0;
    }
    gang_info("GPU health watch of GPU %u every %llu ms", g->gpu,
              (unsigned long long)c->gpu_health_interval_ms);
    *out = g;
    return 0;
}

void gang__wgpu_close(gang__wgpu *g)
{
    if (g == NULL)
        return;
    gang_gpu_watch_stop(g->watch);
    gang_nvml_close(g->nvml);
    free(g);
}

int gang__wgpu_fault(gang__wgpu *g, int ack, char *reason, size_t cap)
{
    return g != NULL && g->watch != NULL && gang_gpu_watch_fault(g->watch, ack, reason, cap);
}

int gang__wgpu_sample(gang__wgpu *g, gang_gpu_sample *s)
{
    if (g == NULL || g->watch == NULL)
        return GANG_ENOENT;
    gang_gpu_watch_get(g->watch, s);
    return 0;
}
