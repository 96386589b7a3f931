/*
 * The agent's GPU view: fault persistence and the per-GPU metrics (agent-gpu.h).
 *
 * Metric names follow dcgm-exporter's default counters where one exists, with its label
 * names (gpu, UUID, device, modelName), so dashboards built for it work on these Pods;
 * ganglion adds the rank label and the families it alone knows (health verdicts, faults
 * by kind). The agent never calls NVML: the values are the samples the workers send with
 * their heartbeats (wctl.h GPU), so they are at most one heartbeat interval plus one
 * sampling interval old.
 */
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "agent-gpu.h"
#include "ganglion/gpu.h"

int gang__gpu_faults_record(gang__gpu_faults *f, uint64_t gen, int32_t rank, uint32_t local,
                            const char *reason)
{
    int32_t gpu;
    char kind[24];
    int became = 0;
    gang_gpu_fault_kind(reason, &gpu, kind, sizeof(kind));
    f->total++;
    uint32_t i;
    for (i = 0; i < f->n; i++)
        if (f->kinds[i].rank == rank && f->kinds[i].gpu == gpu &&
            strcmp(f->kinds[i].kind, kind) == 0)
            break;
    if (i == f->n && f->n < GANG_AGENT_GPU_KINDS) {
        f->kinds[i].rank = rank;
        f->kinds[i].gpu = gpu;
        gang_strlcpy(f->kinds[i].kind, kind, sizeof(f->kinds[i].kind));
        f->n++;
    }
    if (i < f->n)
        f->kinds[i].count++;
    if (local >= GANG_MAX_LOCAL_RANKS)
        return 0;
    if (f->fault_gen[local] != 0 && gen > f->fault_gen[local] && !f->persistent) {
        f->persistent = 1;
        gang_strlcpy(f->reason, reason, sizeof(f->reason));
        became = 1;
    }
    f->fault_gen[local] = gen;
    return became;
}

void gang__gpu_faults_served(gang__gpu_faults *f)
{
    memset(f->fault_gen, 0, sizeof(f->fault_gen));
}

/* One per-GPU family: its name, type, help and how to read the value from a sample. */
typedef struct gpu_family {
    const char *name;
    gang_metric_type type;
    const char *help;
    size_t offset; /* of the field in gang_gpu_sample */
    int is_u64;    /* field is uint64_t, else uint32_t */
    double scale;  /* value = field x scale */
} gpu_family;

#define GF(n, t, h, f, s)                                                                          \
    {                                                                                              \
        n, t, h, offsetof(gang_gpu_sample, f), sizeof(((gang_gpu_sample *)0)->f) == 8, s           \
    }

static const gpu_family gpu_families[] = {
    GF("DCGM_FI_DEV_GPU_UTIL", GANG_METRIC_GAUGE, "GPU utilization (in %)", util_gpu, 1),
    GF("DCGM_FI_DEV_MEM_COPY_UTIL", GANG_METRIC_GAUGE, "Memory utilization (in %)", util_mem, 1),
    GF("DCGM_FI_DEV_FB_USED", GANG_METRIC_GAUGE, "Framebuffer memory used (in MiB)", fb_used_mib,
       1),
    GF("DCGM_FI_DEV_FB_FREE", GANG_METRIC_GAUGE, "Framebuffer memory free (in MiB)", fb_free_mib,
       1),
    GF("DCGM_FI_DEV_FB_TOTAL", GANG_METRIC_GAUGE, "Framebuffer memory total (in MiB)", fb_total_mib,
       1),
    GF("DCGM_FI_DEV_GPU_TEMP", GANG_METRIC_GAUGE, "GPU temperature (in C)", temp_c, 1),
    GF("DCGM_FI_DEV_POWER_USAGE", GANG_METRIC_GAUGE, "Power draw (in W)", power_mw, 0.001),
    GF("DCGM_FI_DEV_SM_CLOCK", GANG_METRIC_GAUGE, "SM clock frequency (in MHz)", sm_clock_mhz, 1),
    GF("DCGM_FI_DEV_MEM_CLOCK", GANG_METRIC_GAUGE, "Memory clock frequency (in MHz)", mem_clock_mhz,
       1),
    GF("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", GANG_METRIC_GAUGE,
       "Current clock throttle reasons (bitmask of nvmlClocksThrottleReason*)", throttle_reasons,
       1),
    GF("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", GANG_METRIC_GAUGE,
       "Single-bit ECC errors since the driver loaded", ecc_sbe_volatile, 1),
    GF("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", GANG_METRIC_GAUGE,
       "Double-bit ECC errors since the driver loaded", ecc_dbe_volatile, 1),
    GF("DCGM_FI_DEV_RETIRED_PENDING", GANG_METRIC_GAUGE, "1 while pages wait for retirement",
       retired_pending, 1),
    GF("DCGM_FI_DEV_ROW_REMAP_PENDING", GANG_METRIC_GAUGE, "1 while rows wait for remapping",
       remap_pending, 1),
    GF("DCGM_FI_DEV_XID_ERRORS", GANG_METRIC_GAUGE, "Value of the last Xid error seen", last_xid,
       1),
    GF("ganglion_gpu_lost", GANG_METRIC_GAUGE, "1 while the GPU does not answer NVML", lost, 1),
    GF("ganglion_gpu_fatal", GANG_METRIC_GAUGE,
       "1 while the GPU has a fatal condition (the rank fails; see docs/operations.md)", fatal, 1),
    GF("ganglion_gpu_throttled", GANG_METRIC_GAUGE,
       "1 while the clocks are throttled for thermal or power reasons (a warning)", warning, 1),
};

static double family_value(const gpu_family *f, const gang_gpu_sample *s)
{
    const char *p = (const char *)s + f->offset;
    uint64_t v64;
    uint32_t v32;
    if (f->is_u64) {
        memcpy(&v64, p, sizeof(v64));
        return (double)v64 * f->scale;
    }
    memcpy(&v32, p, sizeof(v32));
    return (double)v32 * f->scale;
}

typedef struct gpu_labels {
    char gpu[16], device[24], rank[16];
    gang_metric_label l[5];
} gpu_labels;

static void labels_of(gpu_labels *g, const gang_gpu_sample *s, uint64_t rank)
{
    snprintf(g->gpu, sizeof(g->gpu), "%u", s->gpu);
    snprintf(g->device, sizeof(g->device), "nvidia%u", s->gpu);
    snprintf(g->rank, sizeof(g->rank), "%llu", (unsigned long long)rank);
    g->l[0] = (gang_metric_label){.name = "gpu", .value = g->gpu};
    g->l[1] = (gang_metric_label){.name = "UUID", .value = s->uuid};
    g->l[2] = (gang_metric_label){.name = "device", .value = g->device};
    g->l[3] = (gang_metric_label){.name = "modelName", .value = s->name};
    g->l[4] = (gang_metric_label){.name = "rank", .value = g->rank};
}

/* The Xid counts of every reported GPU, by code. */
static void xid_metrics(gang_metrics_buf *b, const gang_sup *sup, uint64_t first, uint32_t nproc)
{
    gang_gpu_sample s;
    gang_metrics_family(b, "ganglion_gpu_xid_errors_total", GANG_METRIC_COUNTER,
                        "Xid events the worker saw on its GPU, by code");
    for (uint32_t i = 0; i < nproc; i++) {
        if (!gang_sup_gpu(sup, i, &s))
            continue;
        gpu_labels g;
        labels_of(&g, &s, first + i);
        for (uint32_t k = 0; k < s.n_xid && k < GANG_GPU_XID_SLOTS; k++) {
            char code[16];
            snprintf(code, sizeof(code), "%u", s.xid[k].code);
            gang_metric_label l[3] = {g.l[0], g.l[4], {.name = "xid", .value = code}};
            gang_metrics_sample_u64(b, "ganglion_gpu_xid_errors_total", l, 3, s.xid[k].count);
        }
    }
}

/* The agent's fault record: faults by rank, GPU and kind, and the persistence verdict. */
static void fault_metrics(gang_metrics_buf *b, const gang__gpu_faults *f)
{
    gang_metrics_family(b, "ganglion_gpu_faults_total", GANG_METRIC_COUNTER,
                        "GPU faults that failed a rank, by rank, GPU and kind (xid_<code>, "
                        "lost, dbe, retired_pending, remap_pending)");
    for (uint32_t i = 0; i < f->n; i++) {
        char rank[16], gpu[16];
        snprintf(rank, sizeof(rank), "%d", f->kinds[i].rank);
        snprintf(gpu, sizeof(gpu), "%d", f->kinds[i].gpu);
        gang_metric_label l[3] = {{.name = "rank", .value = rank},
                                  {.name = "gpu", .value = gpu},
                                  {.name = "kind", .value = f->kinds[i].kind}};
        gang_metrics_sample_u64(b, "ganglion_gpu_faults_total", l, 3, f->kinds[i].count);
    }
    gang_metrics_family(b, "ganglion_gpu_fault_persistent", GANG_METRIC_GAUGE,
                        "1 once a GPU fault persisted across a gang restart (/healthz fails)");
    gang_metrics_sample_i64(b, "ganglion_gpu_fault_persistent", NULL, 0, f->persistent);
}

void gang__gpu_metrics(gang_metrics_buf *b, const gang_sup *sup, uint32_t node, uint32_t nproc,
                       const gang__gpu_faults *f)
{
    gang_gpu_sample s;
    uint64_t first = (uint64_t)node * nproc;
    int any = 0;
    for (uint32_t i = 0; i < nproc && !any; i++)
        any = gang_sup_gpu(sup, i, &s);
    for (size_t k = 0; any && k < sizeof(gpu_families) / sizeof(gpu_families[0]); k++) {
        const gpu_family *fam = &gpu_families[k];
        gang_metrics_family(b, fam->name, fam->type, fam->help);
        for (uint32_t i = 0; i < nproc; i++) {
            if (!gang_sup_gpu(sup, i, &s))
                continue;
            gpu_labels g;
            labels_of(&g, &s, first + i);
            gang_metrics_sample_double(b, fam->name, g.l, 5, family_value(fam, &s));
        }
    }
    if (any)
        xid_metrics(b, sup, first, nproc);
    fault_metrics(b, f);
}
