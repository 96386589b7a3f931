/*
 * The agent's /status and /metrics (agent-status.h), from the view agent.c fills. The
 * field and metric names are what docs/operations.md documents and the multi-process
 * tests read: change them there too.
 */
#include <stdio.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "agent-status.h"
#include "ganglion/gpu.h"
#include "ganglion/model.h"

/* A heartbeat age in /status: ms, or -1 for GANG_HEARTBEAT_NEVER. */
static double age_ms_json(uint32_t age_ms)
{
    return age_ms == GANG_HEARTBEAT_NEVER ? -1 : (double)age_ms;
}

/* The global rank of local rank i of this node. */
static uint64_t view_rank(const gang__agent_view *v, uint32_t i)
{
    return (uint64_t)v->cfg->id.node_index * (uint64_t)v->cfg->layout.tc.nproc_per_node + i;
}

/* ---------------------------------------------------------------------------------
 * /status
 * --------------------------------------------------------------------------------- */

/* The "gpu" object of a local rank in /status: its GPU and health, null when unknown. */
static void status_gpu(const gang__agent_view *v, cJSON *e, uint32_t local)
{
    gang_gpu_sample s;
    if (!gang_sup_gpu(v->sup, local, &s)) {
        cJSON_AddNullToObject(e, "gpu");
        return;
    }
    cJSON *g = cJSON_AddObjectToObject(e, "gpu");
    cJSON_AddNumberToObject(g, "index", s.gpu);
    cJSON_AddStringToObject(g, "uuid", s.uuid);
    cJSON_AddStringToObject(g, "bus_id", s.bus_id);
    cJSON_AddBoolToObject(g, "healthy", !s.fatal);
    cJSON_AddStringToObject(g, "fault", s.fault);
    cJSON_AddBoolToObject(g, "throttled", s.warning);
    cJSON_AddNumberToObject(g, "throttle_reasons", (double)s.throttle_reasons);
}

/* The "kv_cache" object of a local rank in /status (what its engine holds), null without
 * a model. */
static void status_kv(const gang__agent_view *v, cJSON *e, uint32_t local)
{
    gang_engine_kv kv;
    if (!gang_sup_kv(v->sup, local, &kv)) {
        cJSON_AddNullToObject(e, "kv_cache");
        return;
    }
    cJSON *o = cJSON_AddObjectToObject(e, "kv_cache");
    cJSON_AddStringToObject(o, "dtype", gang_dtype_name(kv.dtype));
    cJSON_AddNumberToObject(o, "block_size", kv.block_size);
    cJSON_AddNumberToObject(o, "blocks", kv.blocks);
    cJSON_AddNumberToObject(o, "tokens", (double)kv.tokens);
    cJSON_AddNumberToObject(o, "context", kv.max_ctx);
    cJSON_AddNumberToObject(o, "full_context_sequences", kv.full_seqs);
    cJSON_AddNumberToObject(o, "max_sequences", kv.slots);
}

/* A "last_failure" object (null when wall_ms is 0) under name in o. */
static void status_failure(cJSON *o, int32_t rank, int32_t code, const char *reason,
                           uint64_t wall_ms)
{
    if (wall_ms == 0) {
        cJSON_AddNullToObject(o, "last_failure");
        return;
    }
    cJSON *f = cJSON_AddObjectToObject(o, "last_failure");
    cJSON_AddNumberToObject(f, "rank", rank);
    cJSON_AddStringToObject(f, "code", gang_err_name(code));
    cJSON_AddStringToObject(f, "reason", reason);
    cJSON_AddNumberToObject(f, "wall_ms", (double)wall_ms);
}

/* The "local_ranks" array: this node's workers. */
static void status_local_ranks(const gang__agent_view *v, cJSON *o)
{
    cJSON *lr = cJSON_AddArrayToObject(o, "local_ranks");
    for (uint32_t i = 0; i < gang_sup_nranks(v->sup); i++) {
        gang_sup_rank r;
        gang_sup_rank_info(v->sup, i, &r);
        cJSON *e = cJSON_CreateObject();
        cJSON_AddNumberToObject(e, "local_rank", i);
        cJSON_AddNumberToObject(e, "rank", (double)view_rank(v, i));
        cJSON_AddNumberToObject(e, "pid", r.pid);
        cJSON_AddStringToObject(e, "state", gang_rank_state_name(r.state));
        cJSON_AddNumberToObject(e, "heartbeat_age_ms", age_ms_json(r.heartbeat_age_ms));
        cJSON_AddNumberToObject(e, "restarts", (double)r.restarts);
        status_gpu(v, e, i);
        status_kv(v, e, i);
        cJSON_AddItemToArray(lr, e);
    }
}

/* The coordinator's "gang" object: the authoritative view of every rank. */
static void status_gang(const gang__agent_view *v, cJSON *o)
{
    const gang_coord_status *cs = v->cs;
    cJSON *g = cJSON_AddObjectToObject(o, "gang");
    cJSON_AddStringToObject(g, "state", gang_state_name(cs->state));
    cJSON_AddNumberToObject(g, "generation", (double)cs->generation);
    cJSON_AddNumberToObject(g, "members", cs->members);
    cJSON_AddNumberToObject(g, "world_size", cs->world_size);
    cJSON_AddNumberToObject(g, "restarts_total", (double)cs->restarts_total);
    cJSON_AddNumberToObject(g, "budget_left", cs->budget_left);
    cJSON_AddNumberToObject(g, "rendezvous_seconds", cs->rendezvous_seconds);
    cJSON_AddNumberToObject(g, "formation_seconds", cs->formation_seconds);
    cJSON_AddNumberToObject(g, "serving_since_wall_ms", (double)cs->serving_since_wall_ms);
    status_failure(g, cs->last_failure_rank, cs->last_failure_code, cs->last_failure,
                   cs->last_failure_wall_ms);
    cJSON *rk = cJSON_AddArrayToObject(g, "ranks");
    for (uint32_t i = 0; i < cs->world_size; i++) {
        cJSON *e = cJSON_CreateObject();
        cJSON_AddNumberToObject(e, "rank", i);
        cJSON_AddNumberToObject(e, "node",
                                (double)(i / (uint32_t)v->cfg->layout.tc.nproc_per_node));
        cJSON_AddStringToObject(e, "state", gang_rank_state_name(cs->ranks[i].state));
        cJSON_AddNumberToObject(e, "heartbeat_age_ms", age_ms_json(cs->ranks[i].heartbeat_age_ms));
        cJSON_AddItemToArray(rk, e);
    }
}

char *gang__agent_status_json(const gang__agent_view *v)
{
    const gang_agent_config *c = v->cfg;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "node_index", c->id.node_index);
    cJSON_AddNumberToObject(o, "nnodes", (double)c->layout.tc.nnodes);
    cJSON_AddNumberToObject(o, "nproc_per_node", (double)c->layout.tc.nproc_per_node);
    cJSON_AddBoolToObject(o, "is_coordinator", v->cs != NULL);
    cJSON_AddStringToObject(o, "identity_source", gang_identity_source_name(c->id.source));
    cJSON_AddStringToObject(o, "job", c->job_name);
    cJSON_AddNumberToObject(o, "generation", (double)v->ms.generation);
    cJSON_AddStringToObject(o, "state", v->state);
    cJSON_AddBoolToObject(o, "ready", v->ready);
    cJSON_AddBoolToObject(o, "healthy", v->healthy);
    cJSON *co = cJSON_AddObjectToObject(o, "coordinator");
    cJSON_AddBoolToObject(co, "connected", v->ms.connected);
    cJSON_AddStringToObject(co, "address", v->coord_addr);
    cJSON_AddStringToObject(co, "gang_state", gang_state_name(v->ms.gang_state));
    cJSON_AddNumberToObject(co, "heartbeat_age_ms",
                            age_ms_json(v->ms.coordinator_heartbeat_age_ms));
    cJSON_AddNumberToObject(co, "reconnects", (double)v->ms.reconnects);
    status_local_ranks(v, o);
    status_failure(o, v->fail_rank, v->fail_code, v->fail_reason, v->fail_wall_ms);
    cJSON_AddNumberToObject(o, "last_abort_wall_ms", (double)v->ms.last_abort_wall_ms);
    cJSON_AddNumberToObject(o, "ready_wall_ms", (double)v->ready_wall_ms);
    cJSON_AddNumberToObject(o, "restarts_total", (double)v->aborts_seen);
    cJSON_AddBoolToObject(o, "gpu_fault_persistent", v->gpu->persistent);
    if (v->gpu->persistent)
        cJSON_AddStringToObject(o, "gpu_fault", v->gpu->reason);
    if (v->cs != NULL)
        status_gang(v, o);
    char *text = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return text;
}

/* ---------------------------------------------------------------------------------
 * /metrics
 * --------------------------------------------------------------------------------- */

#define M_STATE "ganglion_state"
#define M_HEARTBEAT_AGE "ganglion_heartbeat_age_seconds"

/* The one-hot gang state as this node sees it. */
static void metrics_state(const gang__agent_view *v, gang_metrics_buf *b,
                          const gang_metric_label *nl)
{
    static const char *const states[] = {"waiting", "backoff",  "starting",
                                         "serving", "aborting", "failed"};

    gang_metrics_family(b, M_STATE, GANG_METRIC_GAUGE, "Gang state as this node sees it (one-hot)");
    for (size_t i = 0; i < sizeof(states) / sizeof(states[0]); i++) {
        gang_metric_label sl[2] = {*nl, {.name = "state", .value = states[i]}};
        gang_metrics_sample_i64(b, M_STATE, sl, 2, strcmp(v->state, states[i]) == 0);
    }
}

static void rank_age_sample(gang_metrics_buf *b, uint64_t rank, uint32_t age_ms)
{
    char rs[24];
    snprintf(rs, sizeof(rs), "%llu", (unsigned long long)rank);
    gang_metric_label l = {.name = "rank", .value = rs};
    gang_metrics_sample_double(b, M_HEARTBEAT_AGE, &l, 1,
                               age_ms == GANG_HEARTBEAT_NEVER ? -1.0 : (double)age_ms / 1000.0);
}

/* Every rank's heartbeat age on the coordinator, the local ranks' elsewhere. */
static void metrics_heartbeat_ages(const gang__agent_view *v, gang_metrics_buf *b)
{
    gang_metrics_family(b, M_HEARTBEAT_AGE, GANG_METRIC_GAUGE,
                        "Seconds since each rank's last heartbeat (-1: no process)");
    if (v->cs != NULL) {
        for (uint32_t i = 0; i < v->cs->world_size; i++)
            rank_age_sample(b, i, v->cs->ranks[i].heartbeat_age_ms);
        return;
    }
    for (uint32_t i = 0; i < gang_sup_nranks(v->sup); i++) {
        gang_sup_rank r;
        gang_sup_rank_info(v->sup, i, &r);
        rank_age_sample(b, view_rank(v, i), r.heartbeat_age_ms);
    }
}

/* The coordinator's own gauges and counters (node 0 only). */
static void metrics_coordinator(const gang_coord_status *cs, gang_metrics_buf *b)
{
    const gang_metric_scalar t[] = {
        {"ganglion_rendezvous_seconds",
         "Seconds the last (re)formation took, from the first member or the failure to SERVING",
         GANG_METRIC_GAUGE, .is_double = 1, .d = cs->rendezvous_seconds},
        {"ganglion_gang_members", "Nodes currently joined to the coordinator", GANG_METRIC_GAUGE,
         .v = cs->members},
        {"ganglion_gang_members_max", "Members the coordinator admits: one per node of the gang",
         GANG_METRIC_GAUGE, .v = cs->members_max},
        {"ganglion_coordinator_connections", "Rendezvous connections held, joined or not",
         GANG_METRIC_GAUGE, .v = cs->connections},
        {"ganglion_coordinator_connections_max",
         "Rendezvous connections held at once (--max-connections)", GANG_METRIC_GAUGE,
         .v = cs->connections_max},
        {"ganglion_coordinator_connections_refused_total",
         "Rendezvous connections closed at once for being over the limit", GANG_METRIC_COUNTER,
         .v = cs->connections_refused},
        {"ganglion_restart_budget_left", "Gang restarts left in the current window",
         GANG_METRIC_GAUGE, .v = cs->budget_left},
        {"ganglion_rendezvous_frames_rejected_total",
         "Rendezvous connections closed for a frame whose session tag did not verify (forged, "
         "modified, replayed or reordered)",
         GANG_METRIC_COUNTER, .v = cs->frames_rejected},
    };
    gang_metrics_scalars(b, t, sizeof(t) / sizeof(t[0]));
}

/*
 * The load balance of the node's MoE ranks (issue #25), from each worker's last MOE packet
 * (gang_sup_moe): routed (token, choice) pairs by rank and expert and by rank and EP rank,
 * MoE layer calls, and max / mean slots per expert (the last call's, and the average).
 */
static void metrics_moe(gang_metrics_buf *b, const gang_sup *sup, uint64_t first, uint32_t nproc)
{
    static const char *const fam[][2] = {
        {"ganglion_moe_expert_tokens_total",
         "(token, choice) pairs this rank's router sent to each expert, over its MoE layers"},
        {"ganglion_moe_ep_rank_tokens_total",
         "(token, choice) pairs this rank sent to each EP rank's experts"},
        {"ganglion_moe_layer_steps_total", "MoE layer calls of this rank (steps x layers)"},
        {"ganglion_moe_load_max_over_mean",
         "Max over mean pairs per expert in this rank's last MoE layer call (1: balanced)"},
        {"ganglion_moe_load_max_over_mean_avg", "The same, averaged over every call"}};
    gang_moe_load_sample m;
    char rank[24], idx[16];

    for (size_t f = 0; f < sizeof(fam) / sizeof(fam[0]); f++) {
        int any = 0;

        for (uint32_t i = 0; i < nproc; i++) {
            if (!gang_sup_moe(sup, i, &m))
                continue;
            if (!any)
                gang_metrics_family(b, fam[f][0], f < 3 ? GANG_METRIC_COUNTER : GANG_METRIC_GAUGE,
                                    fam[f][1]);
            any = 1;
            snprintf(rank, sizeof(rank), "%llu", (unsigned long long)(first + i));
            gang_metric_label l[2] = {{.name = "rank", .value = rank},
                                      {.name = f == 0 ? "expert" : "ep_rank", .value = idx}};
            uint32_t n = f == 0 ? m.n_experts : f == 1 ? m.ep : 0;
            n = n > (f == 0 ? GANG_MOE_LOAD_EXPERTS : GANG_MOE_LOAD_RANKS)
                    ? (f == 0 ? GANG_MOE_LOAD_EXPERTS : GANG_MOE_LOAD_RANKS)
                    : n;
            for (uint32_t e = 0; e < n; e++) {
                snprintf(idx, sizeof(idx), "%u", e);
                gang_metrics_sample_u64(b, fam[f][0], l, 2,
                                        f == 0 ? m.expert_slots[e] : m.rank_slots[e]);
            }
            if (f == 2)
                gang_metrics_sample_u64(b, fam[f][0], l, 1, m.steps);
            else if (f >= 3)
                gang_metrics_sample_double(b, fam[f][0], l, 1,
                                           f == 3 ? m.last_max_over_mean : m.mean_max_over_mean);
        }
    }
}

/* Node 0 (global rank 0 is its local rank 0, whose engine schedules): the KV cache's
 * blocks and the requests' states, as rank 0 last reported them (every 250 ms at most while
 * requests are live, at once when none is). */
static void metrics_kv(const gang__agent_view *v, gang_metrics_buf *b)
{
    gang_engine_kv kv;
    if (!v->cfg->id.is_coordinator || !gang_sup_kv(v->sup, 0, &kv))
        return;
    uint32_t free_blocks = kv.free_blocks <= kv.blocks ? kv.free_blocks : kv.blocks;
    const gang_metric_scalar t[] = {
        {"ganglion_kv_cache_blocks", "Blocks of the paged KV cache the gang uses",
         GANG_METRIC_GAUGE, .v = kv.blocks},
        {"ganglion_kv_cache_blocks_used", "KV blocks held by live sequences", GANG_METRIC_GAUGE,
         .v = kv.blocks - free_blocks},
        {"ganglion_kv_cache_blocks_free",
         "KV blocks no sequence holds (prefix-cached ones included)", GANG_METRIC_GAUGE,
         .v = free_blocks},
        {"ganglion_kv_cache_blocks_cached",
         "Free KV blocks that still hold a cached prompt prefix (evictable)", GANG_METRIC_GAUGE,
         .v = kv.cached_blocks},
        {"ganglion_sequences_running", "Requests holding a slot in the engine (prefill or decode)",
         GANG_METRIC_GAUGE, .v = kv.running},
        {"ganglion_sequences_waiting", "Requests queued in the engine for a slot",
         GANG_METRIC_GAUGE, .v = kv.waiting},
        {"ganglion_sequences_preempted_total",
         "Sequences preempted for KV blocks (recomputed later), this generation's engine",
         GANG_METRIC_COUNTER, .v = kv.preempted},
    };
    gang_metrics_scalars(b, t, sizeof(t) / sizeof(t[0]));
}

int gang__agent_metrics(const gang__agent_view *v, gang_metrics_buf *b)
{
    const gang_agent_config *c = v->cfg;
    char node[16];
    snprintf(node, sizeof(node), "%d", c->id.node_index);
    const gang_metric_label nl = {.name = "node", .value = node};
    const gang_metric_scalar head[] = {
        {"ganglion_generation", "Generation (epoch) of the gang this node last started",
         GANG_METRIC_GAUGE, &nl, 1, .v = v->ms.generation},
        {"ganglion_gang_restarts_total",
         "Gang restarts: counted by the coordinator on node 0, ABORTs seen elsewhere",
         GANG_METRIC_COUNTER, &nl, 1, .v = v->cs ? v->cs->restarts_total : v->aborts_seen},
        {"ganglion_ready", "1 while the whole gang serves and this node's ranks are ready",
         GANG_METRIC_GAUGE, &nl, 1, .v = (uint64_t)v->ready},
    };
    const gang_metric_scalar connected = {"ganglion_coordinator_connected",
                                          "1 while this node is a member of the coordinator",
                                          GANG_METRIC_GAUGE,
                                          &nl,
                                          1,
                                          .v = (uint64_t)v->ms.connected};
    const gang_metric_scalar fwd_rejected = {"ganglion_forwarded_frames_rejected_total",
                                             "Malformed API frames from the coordinator dropped",
                                             GANG_METRIC_COUNTER, .v = v->fwd_rejected};

    gang_metrics_scalars(b, head, sizeof(head) / sizeof(head[0]));
    metrics_state(v, b, &nl);
    metrics_heartbeat_ages(v, b);
    gang_metrics_scalars(b, &connected, 1);
    if (v->cs != NULL)
        metrics_coordinator(v->cs, b);
    gang__gpu_metrics(b, v->sup, (uint32_t)c->id.node_index, (uint32_t)c->layout.tc.nproc_per_node,
                      v->gpu);
    metrics_moe(b, v->sup, (uint64_t)c->id.node_index * (uint64_t)c->layout.tc.nproc_per_node,
                (uint32_t)c->layout.tc.nproc_per_node);
    metrics_kv(v, b);
    if (v->api != NULL)
        gang_api_metrics(v->api, b);
    if (v->relay != NULL)
        gang_fwd_relay_metrics(v->relay, b);
    if (!c->id.is_coordinator)
        gang_metrics_scalars(b, &fwd_rejected, 1);
    return b->err;
}
