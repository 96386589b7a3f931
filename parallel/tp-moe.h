/*
 * Internal to parallel/: what the MoE block's host path (tp-moe.c) and its device path
 * (tp-moe-dev.c) share.
 */
#ifndef GANGLION_PARALLEL_TP_MOE_H
#define GANGLION_PARALLEL_TP_MOE_H

#include "ganglion/parallel.h"

/* The step scratch of one layer, grown to the most tokens a call passed. */
typedef struct gang_tp_moe_scratch {
    size_t cap_tokens;    /* tokens the arrays below were sized for */
    float *logits;        /* [cap, n_experts] */
    int32_t *expert;      /* [cap, top_k] */
    float *weight;        /* [cap, top_k] */
    gang_moe_plan plan;   /* for a run of at most cap tokens */
    gang_moe_exchange xc; /* send / recv [cap * top_k * ep rows] */
    float *rows_in;       /* [cap * top_k * ep, hidden]: one expert's rows, gathered */
    float *rows_out;      /* [cap * top_k * ep, hidden] */
    float *gate, *up;     /* [cap * top_k * ep, max(ffn_count, sh_count)] */
    float *sh_scale;      /* [cap] */
    size_t *run_first;    /* [ep * expert_count]: where each (source, expert) run starts */
} gang_tp_moe_scratch;

/* The test fault GANGLION_FAULT_MOE_A2A of a dispatch as EP rank `rank` (moe.c): returns
 * at once unless the environment asks for it. */
void gang__moe_fault_point(uint32_t rank);
/* The host scratch of m for a call of `tokens` tokens (grown, kept): 0 or GANG_ENOMEM. */
int gang__tp_moe_scratch(gang_tp_moe *m, size_t tokens, gang_tp_moe_scratch **out);
/* The load counters of one call from the plan of this rank's run. */
void gang__tp_moe_count(gang_tp_moe *m, const gang_moe_plan *p);
/* y[token of slot] += weight[slot] x rows[i] for the plan's slots in order (host). */
void gang__tp_moe_accumulate(const gang_moe_plan *p, const float *weight, const float *rows,
                             size_t h, float *y);
/* One SwiGLU expert (shard) on n rows of k's memory: out = (silu(in Wg^T) * in Wu^T) Wd^T. */
int gang__tp_moe_swiglu(gang_kernels *k, const float *in, size_t n, size_t hidden, const float *wg,
                        const float *wu, const float *wd, size_t ffn, float *gate, float *up,
                        float *out);
/* Adds one call to gang_tp_moe_timing_get's sums when it had the timed token count. */
void gang__tp_moe_timed(size_t tokens, uint64_t block_ns, uint64_t a2a_ns);
/* gang_tp_moe_forward on a device handle k holding m (tp-moe-dev.c). */
int gang__tp_moe_forward_dev(gang_tp_moe *m, gang_kernels *k, gang_comm *comm, const float *x,
                             size_t tokens, float *y, uint64_t timeout_ms);
/* Releases m's device arrays and buffers to m->mem (nothing on the host); NULLs them. */
void gang__tp_moe_dev_free(gang_tp_moe *m);

#endif /* GANGLION_PARALLEL_TP_MOE_H */
