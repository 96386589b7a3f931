/*
 * What an agent shows of itself (internal to launcher/): the JSON of /status and the
 * Prometheus text of /metrics (docs/operations.md lists both), rendered from a view the
 * agent fills on its loop thread. The agent owns the state; this file owns the names,
 * help texts and layout, each metric name written once (a table of gang_metric_scalar).
 */
#ifndef GANGLION_LAUNCHER_AGENT_STATUS_H
#define GANGLION_LAUNCHER_AGENT_STATUS_H

#include <stdint.h>

#include "agent-gpu.h"
#include "agent.h"
#include "api-fwd.h"
#include "ganglion/serve.h"
#include "ganglion/rendezvous.h"
#include "supervisor.h"

/* One agent as /status and /metrics show it; every pointer borrowed for one rendering. */
typedef struct gang__agent_view {
    const gang_agent_config *cfg;
    gang_member_status ms;        /* this node's member */
    const gang_coord_status *cs;  /* the coordinator's view on node 0, else NULL */
    const gang_sup *sup;          /* the local ranks */
    gang_api *api;                /* the inference API, or NULL */
    const gang_fwd_relay *relay;  /* node 0: members' forwarded requests, or NULL */
    const gang__gpu_faults *gpu;  /* the workers' GPU faults */
    const char *state;            /* failed, waiting or the gang state's name */
    const char *coord_addr;       /* the coordinator's resolved host:port */
    int ready, healthy;           /* what /readyz and /healthz answer now */
    uint64_t ready_wall_ms;       /* when every local rank last became READY */
    uint64_t aborts_seen;         /* ABORTs this node saw */
    uint64_t fwd_rejected;        /* a member: malformed API frames from the coordinator */
    int32_t fail_rank, fail_code; /* this node's last recorded failure */
    uint64_t fail_wall_ms;        /* 0: none */
    const char *fail_reason;
} gang__agent_view;

/* The /status JSON of v (one line), or NULL on GANG_ENOMEM; release with cJSON_free. */
char *gang__agent_status_json(const gang__agent_view *v);

/* Appends v's /metrics families to b: the agent's table, then the GPU, API and forwarding
 * metrics. Returns 0 or b->err. */
int gang__agent_metrics(const gang__agent_view *v, gang_metrics_buf *b);

#endif
