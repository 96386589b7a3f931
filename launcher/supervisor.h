/*
 * Worker supervisor (internal to launcher/): spawns nproc_per_node workers of the same
 * binary, talks to them over the wctl channel (wctl.h), watches their heartbeats and
 * exits, and drives them through generations for the agent. Runs on the agent's loop.
 */
#ifndef GANGLION_LAUNCHER_SUPERVISOR_H
#define GANGLION_LAUNCHER_SUPERVISOR_H

#include <stdint.h>

#include "ganglion/common.h"
#include "ganglion/engine.h"
#include "ganglion/rendezvous.h"
#include "wctl.h"

typedef struct gang_sup gang_sup;

typedef struct gang_sup_callbacks {
    void *ctx;
    /* Local rank 0 produced the bootstrap blob for gen. */
    void (*on_blob)(void *ctx, uint64_t gen, const uint8_t *blob, uint32_t len);
    /* Every local rank is READY in gen. */
    void (*on_all_ready)(void *ctx, uint64_t gen);
    /* A local rank failed in gen (exit, silence, data-plane error); rank is global. */
    void (*on_failure)(void *ctx, uint64_t gen, int32_t rank, int32_t code, const char *reason);
    /* Every worker is alive, connected and outside any generation. */
    void (*on_idle)(void *ctx);
    /* Local rank 0 (global rank 0 on node 0): a TOKEN message (generation, id, index,
     * token, logprobs) as rank 0 sent it. May be NULL. */
    void (*on_token)(void *ctx, const gang_req_msg *tok);
    /* Local rank 0: a DONE message (generation, id; code 0, finish "length"/"stop", the
     * cached tokens in index, the P/D transfer's kv_* fields; or code < 0 and a reason).
     * May be NULL. */
    void (*on_done)(void *ctx, const gang_req_msg *done);
    /* A worker exited with a code that says a retry cannot help (2 usage/layout, 3 model):
     * the agent should stop with that exit code. May be NULL. */
    void (*on_fatal)(void *ctx, int exit_code, const char *reason);
} gang_sup_callbacks;

/* What the supervisor needs; filled by gang_agent_config_from_params (layout.c). */
typedef struct gang_sup_config {
    const char *exe;                /* the binary to run ("/proc/self/exe"), borrowed */
    uint32_t node_index;            /* this node: global rank = node x nproc + local rank */
    uint32_t nproc_per_node;        /* workers to keep alive */
    uint64_t heartbeat_interval_ms; /* paces the deadline tick */
    uint64_t heartbeat_timeout_ms;  /* a worker silent this long has failed */
    uint64_t abort_timeout_ms;      /* ABORT / SHUTDOWN confirmation deadline */
    gang_args worker_args;          /* the forwarded registry flags of every worker
                                       (gang_params_forward_args); copied at start */
} gang_sup_config;

/*
 * Spawns cfg->nproc_per_node workers on uv_loop as `EXE worker --agent-socket=PATH
 * --local-rank=L` followed by cfg->worker_args. Returns 0 or a GANG_E* code.
 */
int gang_sup_start(void *uv_loop, const gang_sup_config *cfg, const gang_sup_callbacks *cb,
                   gang_sup **out);
void gang_sup_request_blob(gang_sup *s, uint64_t gen);
void gang_sup_start_gen(gang_sup *s, uint64_t gen, uint32_t world, const uint8_t *blob,
                        uint32_t len);
/* Aborts gen in place; workers that do not confirm within the abort timeout are killed. */
void gang_sup_abort(gang_sup *s, uint64_t gen);

/*
 * Sends a request message (SUBMIT, PROMPT or CANCEL, with its generation) to local rank 0.
 * Returns 0, GANG_EINVAL for a message that cannot be encoded, or GANG_EPEER when rank 0
 * is not connected or its channel is full (the caller keeps the request and submits it
 * again later).
 */
int gang_sup_submit(gang_sup *s, const gang_req_msg *r);
int gang_sup_is_idle(const gang_sup *s);
/* 1 when every local rank is READY in gen. */
int gang_sup_all_ready(const gang_sup *s, uint64_t gen);

typedef struct gang_sup_rank {
    int pid;                   /* 0 when no process */
    uint8_t state;             /* gang_rank_state */
    uint32_t heartbeat_age_ms; /* GANG_HEARTBEAT_NEVER when no process */
    uint64_t restarts;         /* times this slot's worker was respawned */
} gang_sup_rank;

uint32_t gang_sup_nranks(const gang_sup *s);
void gang_sup_rank_info(const gang_sup *s, uint32_t local_rank, gang_sup_rank *out);
struct gang_gpu_sample;
/*
 * The latest GPU sample local_rank's worker sent (its GPU's index, metrics and health),
 * kept across the worker's restarts: 1 with *out filled, 0 when it never sent one (no
 * NVML, no GPU for it, --gpu-health-interval-ms 0).
 */
int gang_sup_gpu(const gang_sup *s, uint32_t local_rank, struct gang_gpu_sample *out);
/* The MoE layers' load local_rank last reported (a worker serving a MoE model): 1 with
 * *out filled (n_experts and ep bounded), 0 when it never sent one. */
int gang_sup_moe(const gang_sup *s, uint32_t local_rank, gang_moe_load_sample *out);
/* The KV cache local_rank's last READY reported (a worker with a model): 1 with *out
 * filled, 0 when none did. */
int gang_sup_kv(const gang_sup *s, uint32_t local_rank, gang_engine_kv *out);
/* Sends SHUTDOWN, waits up to the abort timeout, kills the rest; done(ctx) when all gone. */
void gang_sup_shutdown(gang_sup *s, void (*done)(void *ctx), void *ctx);

/*
 * Removes the control directories that killed agents left in dir ("/tmp" for the
 * supervisor): entries named "ganglion-agent-*", owned by this user, last changed at
 * least min_age_s seconds ago, whose ctl.sock is missing or has no listener (connect
 * refused). A live agent's directory always has a listening socket, and a directory
 * younger than min_age_s may belong to an agent still starting, so neither is touched.
 * Returns how many were removed (0 when dir cannot be read). Called by gang_sup_start.
 */
int gang_sup_sweep_stale(const char *dir, uint64_t min_age_s);

#endif
