/*
 * The agent: one per Pod (node). CUDA-free so that it can always answer probes and kill
 * a stuck worker. It wires four parts together on one libuv loop:
 *
 *   coordinator (node 0 only)  <-TCP->  member  <->  supervisor  <->  workers
 *                                          |
 *                                  HTTP: /healthz /readyz /metrics /status, the API
 *
 * The member turns coordinator messages into supervisor actions (BLOB_REQUEST -> blob
 * from local rank 0, START -> start the generation, ABORT -> abort in place) and the
 * supervisor's events back into messages (BLOB, READY, failure reports). Every agent serves
 * the inference API: the coordinator's hands its requests to rank 0 and relays members'
 * forwarded ones (api-fwd.h); a member's forwards its own to the coordinator. The agent also
 * owns the process's fate: SIGTERM stops it cleanly (exit 0), a refusal for good exits 2,
 * and a spent restart budget keeps /status up for --give-up-linger-ms, writes the reason
 * to the termination log and exits 75.
 */
#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <uv.h>

#include <cjson/cJSON.h>

#include "agent-gpu.h"
#include "agent-status.h"
#include "agent.h"
#include "api-fwd.h"
#include "ganglion/serve.h"
#include "ganglion/gpu.h"
#include "ganglion/model.h"
#include "ganglion/parallel.h"
#include "ganglion/rendezvous.h"
#include "supervisor.h"

/* HTTP connections beyond --http-max-connections kept for the probes (serve.h). */
#define AGENT_PROBE_RESERVE 16

typedef struct agent {
    gang_agent_config cfg; /* derived once from the parameters (layout.c) */
    uv_loop_t loop;
    gang_http_server *http;
    gang_coord *coord;
    gang_member *member;
    gang_sup *sup;
    gang_api *api;         /* the OpenAI-compatible API (api.h); a member forwards it */
    gang_fwd_relay *relay; /* coordinator only: members' forwarded requests (api-fwd.h) */
    uint8_t fwd_buf[GANG_API_FRAME_MAX];
    gang_req_msg fwd_pkt;  /* a member: the coordinator's last decoded API frame */
    uint64_t fwd_rejected; /* a member: malformed API frames from the coordinator */
    uv_signal_t sigterm, sigint;
    uv_timer_t linger;
    int linger_started;
    int stopping;
    int exit_code;
    char coord_addr[GANG_HOST_MAX + 8];

    uint64_t started_ms;
    uint64_t last_serving_ms; /* monotonic; last time /readyz would have said 200 */
    uint64_t ready_gen;       /* generation in which all local ranks became READY */
    uint64_t ready_wall_ms;
    uint64_t aborts_seen;
    int gave_up;
    int32_t fail_rank, fail_code;
    uint64_t fail_wall_ms;
    char fail_reason[GANG_REASON_MAX];
    gang__gpu_faults gpu; /* GPU faults of the workers (agent-gpu.h) */
} agent;

static void record_failure(agent *a, int32_t rank, int32_t code, const char *reason)
{
    a->fail_rank = rank;
    a->fail_code = code;
    a->fail_wall_ms = gang_wall_ms();
    gang_strlcpy(a->fail_reason, reason, sizeof(a->fail_reason));
}

/* Kubernetes shows this file's contents as the container's termination message. */
static void write_termination_log(const agent *a, const char *reason)
{
    if (a->cfg.termination_log[0] == '\0')
        return;
    int fd = open(a->cfg.termination_log, O_WRONLY | O_TRUNC | O_CLOEXEC);
    if (fd < 0)
        return;
    ssize_t w = write(fd, reason, strlen(reason));
    (void)w;
    close(fd);
}

static void sup_done(void *ctx)
{
    (void)ctx;
}

static void close_walk(uv_handle_t *h, void *arg)
{
    (void)arg;
    if (!uv_is_closing(h))
        uv_close(h, NULL);
}

/* Starts the orderly stop; uv_run returns once every handle has closed. */
static void agent_stop(agent *a, int exit_code)
{
    if (a->stopping)
        return;
    a->stopping = 1;
    a->exit_code = exit_code;
    gang_info("agent: stopping (exit code %d)", exit_code);
    if (a->api)
        gang_api_close(a->api);
    a->api = NULL;
    if (a->relay)
        a->relay->coord = NULL; /* closed below: nothing more goes to members */
    if (a->sup)
        gang_sup_shutdown(a->sup, sup_done, a);
    gang_member_close(a->member);
    gang_coord_close(a->coord);
    if (a->http)
        gang_http_server_close(a->http);
    uv_close((uv_handle_t *)&a->sigterm, NULL);
    uv_close((uv_handle_t *)&a->sigint, NULL);
    uv_close((uv_handle_t *)&a->linger, NULL);
}

static void on_signal(uv_signal_t *h, int signum)
{
    agent *a = h->data;
    gang_info("agent: signal %d", signum);
    agent_stop(a, GANG_EXIT_OK);
}

static void on_linger_done(uv_timer_t *t)
{
    agent_stop(t->data, GANG_EXIT_TEMPFAIL);
}

/*
 * Removes the node's shared-memory segments that no formation will use again (the
 * socket data plane's, gang_comm_shm_sweep): at start, at every generation before its
 * workers form it, and at exit once they are gone (generation UINT64_MAX: all of ours).
 * Segments of a killed formation would otherwise fill the Pod's memory-backed /dev/shm.
 */
static void agent_sweep_shm(agent *a, uint64_t gen)
{
    uint32_t n = 0;
    int rc = gang_comm_shm_sweep("/dev/shm", a->cfg.job_name, gen, (int)getpid(), &n);

    if (rc != 0 && rc != GANG_ENOENT)
        gang_warn("agent: cannot sweep /dev/shm: %s", gang_strerror(rc));
    if (n > 0)
        gang_info("agent: removed %u stale shared-memory segment%s of killed formations", n,
                  n == 1 ? "" : "s");
}

/* --- member callbacks ------------------------------------------------------------- */

static void m_on_blob_request(void *ctx, uint64_t gen)
{
    agent *a = ctx;
    gang_sup_request_blob(a->sup, gen);
}

static void m_on_start(void *ctx, uint64_t gen, uint32_t world, const uint8_t *blob, uint32_t len)
{
    agent *a = ctx;
    gang_info("agent: START generation %llu (world %u)", (unsigned long long)gen, world);
    agent_sweep_shm(a, gen);
    gang_sup_start_gen(a->sup, gen, world, blob, len);
    if (a->relay)
        gang_fwd_relay_set_gen(a->relay, gen);
    if (a->api)
        gang_api_on_start(a->api, gen);
}

static void m_on_abort(void *ctx, uint64_t gen, int32_t rank, int32_t code, const char *reason)
{
    agent *a = ctx;
    a->aborts_seen++;
    if (code != GANG_ECLOSED)
        record_failure(a, rank, code, reason);
    if (a->relay)
        gang_fwd_relay_set_gen(a->relay, 0);
    if (a->api)
        gang_api_on_abort(a->api, gen);
    gang_sup_abort(a->sup, gen);
}

static void m_on_give_up(void *ctx, const char *reason)
{
    agent *a = ctx;
    if (a->gave_up)
        return;
    a->gave_up = 1;
    record_failure(a, a->fail_rank, GANG_EBUDGET, reason);
    write_termination_log(a, reason);
    gang_error("agent: gang gave up: %s; exiting 75 in %llu ms", reason,
               (unsigned long long)a->cfg.give_up_linger_ms);
    if (a->api)
        gang_api_on_give_up(a->api, reason);
    gang_sup_abort(a->sup, 0);
    a->linger_started = 1;
    uv_timer_start(&a->linger, on_linger_done, a->cfg.give_up_linger_ms, 0);
}

static void m_on_rejected(void *ctx, int32_t code, const char *reason)
{
    agent *a = ctx;
    char msg[GANG_REASON_MAX + 64];
    snprintf(msg, sizeof(msg), "refused by the coordinator: %s", reason);
    record_failure(a, -1, code, msg);
    write_termination_log(a, msg);
    agent_stop(a, GANG_EXIT_USAGE);
}

static void m_fill_heartbeat(void *ctx, gang_msg_heartbeat *hb)
{
    agent *a = ctx;
    uint32_t n = gang_sup_nranks(a->sup);
    hb->nranks = n > GANG_MAX_LOCAL_RANKS ? GANG_MAX_LOCAL_RANKS : n;
    for (uint32_t i = 0; i < hb->nranks; i++) {
        gang_sup_rank r;
        gang_sup_rank_info(a->sup, i, &r);
        hb->rank_state[i] = r.state;
        hb->rank_age_ms[i] = r.heartbeat_age_ms;
    }
}

/* --- supervisor callbacks --------------------------------------------------------- */

static void s_on_blob(void *ctx, uint64_t gen, const uint8_t *blob, uint32_t len)
{
    agent *a = ctx;
    gang_member_send_blob(a->member, gen, blob, len);
}

static void s_on_all_ready(void *ctx, uint64_t gen)
{
    agent *a = ctx;
    a->ready_gen = gen;
    a->ready_wall_ms = gang_wall_ms();
    gang_info("agent: all %u local ranks READY in generation %llu", gang_sup_nranks(a->sup),
              (unsigned long long)gen);
    gang__gpu_faults_served(&a->gpu);
    gang_member_send_ready(a->member, gen);
}

static void s_on_failure(void *ctx, uint64_t gen, int32_t rank, int32_t code, const char *reason)
{
    agent *a = ctx;
    record_failure(a, rank, code, reason);
    gang_member_report_failure(a->member, gen, rank, code, reason);
    if (code == GANG_EGPU) {
        /* A GPU fault restarts the gang like any failure; the Pod learns it from the
         * termination log, and /healthz fails once the same rank's GPU fails again in the
         * next generation without having served in between (it needs a reset). */
        uint64_t first = (uint64_t)a->cfg.id.node_index * (uint64_t)a->cfg.layout.tc.nproc_per_node;
        uint32_t local =
            rank >= 0 && (uint64_t)rank >= first ? (uint32_t)((uint64_t)rank - first) : UINT32_MAX;
        write_termination_log(a, reason);
        if (gang__gpu_faults_record(&a->gpu, gen, rank, local, reason))
            gang_error("agent: the GPU fault persisted across a gang restart; /healthz fails "
                       "from now on: %s",
                       reason);
    }
}

static void s_on_token(void *ctx, const gang_req_msg *tok)
{
    agent *a = ctx;
    if (a->relay && gang_fwd_relay_token(a->relay, tok))
        return;
    if (a->api)
        gang_api_on_token(a->api, tok);
}

static void s_on_done(void *ctx, const gang_req_msg *done)
{
    agent *a = ctx;
    if (a->relay && gang_fwd_relay_done(a->relay, done))
        return;
    if (a->api)
        gang_api_on_done(a->api, done);
}

/* --- forwarding (api-fwd.h) ------------------------------------------------------- */

/* The coordinator's API hands its messages to rank 0 through the supervisor. */
static int api_submit_local(void *ctx, const gang_req_msg *pkt)
{
    agent *a = ctx;
    return gang_sup_submit(a->sup, pkt);
}

/* A member's API forwards its messages to the coordinator as API frames. */
static int api_submit_forward(void *ctx, const gang_req_msg *pkt)
{
    agent *a = ctx;
    size_t len = 0;
    int rc = gang_fwd_encode(pkt, 0, a->fwd_buf, sizeof(a->fwd_buf), &len);
    if (rc != 0)
        return rc;
    return gang_member_send_api(a->member, pkt->generation, a->fwd_buf, (uint32_t)len);
}

/* The coordinator: an API frame from a member's forwarded request. */
static void c_on_api(void *ctx, uint32_t node, uint64_t gen, const uint8_t *data, uint32_t len)
{
    agent *a = ctx;
    if (a->relay)
        gang_fwd_relay_in(a->relay, node, gen, data, len);
}

/* A member: tokens, ends and refusals of its forwarded requests from the coordinator. */
static void m_on_api(void *ctx, uint64_t gen, const uint8_t *data, uint32_t len)
{
    agent *a = ctx;
    gang_req_msg *m = &a->fwd_pkt;
    uint64_t stamp_us = 0;
    if (a->api == NULL || a->relay != NULL)
        return;
    if (gang_fwd_decode(data, len, 1, m, &stamp_us) != 0) {
        a->fwd_rejected++;
        gang_warn("agent: refused a malformed API frame of %u bytes from the coordinator", len);
        return;
    }
    m->generation = gen;
    if (m->kind == GANG_REQ_TOKEN) {
        gang_api_on_token(a->api, m);
        uint64_t now = gang__fwd_wall_us();
        if (stamp_us != 0)
            gang_api_observe_relay(a->api, now >= stamp_us ? (double)(now - stamp_us) / 1e6 : 0);
    } else if (m->kind == GANG_REQ_DONE) {
        gang_api_on_done(a->api, m);
    } else {
        gang_api_on_nack(a->api, gen, m->id, m->index);
    }
}

/* A worker says a retry cannot help (bad model, impossible layout): stop with its code. */
static void s_on_fatal(void *ctx, int exit_code, const char *reason)
{
    agent *a = ctx;
    if (a->stopping)
        return;
    record_failure(a, a->fail_rank, exit_code == GANG_EXIT_MODEL ? GANG_EMODEL : GANG_EUSAGE,
                   reason);
    write_termination_log(a, reason);
    gang_error("agent: %s; exiting %d", reason, exit_code);
    agent_stop(a, exit_code);
}

static void s_on_idle(void *ctx)
{
    agent *a = ctx;
    if (!a->gave_up)
        gang_member_set_available(a->member, 1);
}

/* --- probes, status, metrics ------------------------------------------------------ */

static int agent_ready(agent *a)
{
    gang_member_status ms;
    gang_member_get_status(a->member, &ms);
    int ready = !a->gave_up && ms.connected && ms.gang_state == GANG_STATE_SERVING &&
                gang_sup_all_ready(a->sup, ms.generation);
    if (ready)
        a->last_serving_ms = gang_now_ms();
    return ready;
}

/*
 * Liveness fails only when a restart of this container could help: the gang gave up, or
 * this node has not been part of a serving gang for longer than the rendezvous timeout.
 */
static int agent_healthy(agent *a)
{
    if (a->gave_up || a->gpu.persistent)
        return 0;
    agent_ready(a);
    uint64_t since = a->last_serving_ms ? a->last_serving_ms : a->started_ms;
    return gang_now_ms() - since <= a->cfg.rendezvous_timeout_ms;
}

static const char *agent_state_name(agent *a, const gang_member_status *ms)
{
    if (a->gave_up)
        return "failed";
    if (!ms->connected)
        return "waiting";
    return gang_state_name(ms->gang_state);
}

/*
 * Fills v with what /status and /metrics show of a (agent-status.h), cs being the storage
 * of the coordinator's status on node 0. /readyz's and /healthz's answers are computed
 * once here, as the probes would (they note when the node last served).
 */
static void agent_view(agent *a, gang__agent_view *v, gang_coord_status *cs)
{
    memset(v, 0, sizeof(*v));
    v->cfg = &a->cfg;
    gang_member_get_status(a->member, &v->ms);
    if (a->coord) {
        gang_coord_get_status(a->coord, cs);
        v->cs = cs;
    }
    v->sup = a->sup;
    v->api = a->api;
    v->relay = a->relay;
    v->gpu = &a->gpu;
    v->state = agent_state_name(a, &v->ms);
    v->coord_addr = a->coord_addr;
    v->ready = agent_ready(a);
    v->healthy = agent_healthy(a);
    v->ready_wall_ms = a->ready_wall_ms;
    v->aborts_seen = a->aborts_seen;
    v->fwd_rejected = a->fwd_rejected;
    v->fail_rank = a->fail_rank;
    v->fail_code = a->fail_code;
    v->fail_wall_ms = a->fail_wall_ms;
    v->fail_reason = a->fail_reason;
}

static void on_http(void *ctx, gang_http_exchange *x, const gang_http_request *req)
{
    agent *a = ctx;
    if (gang_api_handle(a->api, x, req))
        return;
    if (strcmp(req->method, "GET") != 0 && strcmp(req->method, "HEAD") != 0) {
        const char *b = "{\"error\":\"method not allowed\"}";
        gang_http_reply(x, 405, "application/json", b, strlen(b));
        return;
    }
    if (strcmp(req->path, "/healthz") == 0 || strcmp(req->path, "/health") == 0) {
        int ok = agent_healthy(a);
        const char *b = ok                  ? "ok\n"
                        : a->gave_up        ? "gave up\n"
                        : a->gpu.persistent ? "GPU fault persists across restarts\n"
                                            : "not rejoined in time\n";
        gang_http_reply(x, ok ? 200 : 503, NULL, b, strlen(b));
    } else if (strcmp(req->path, "/readyz") == 0) {
        int ok = agent_ready(a);
        const char *b = ok ? "ready\n" : "not ready\n";
        gang_http_reply(x, ok ? 200 : 503, NULL, b, strlen(b));
    } else if (strcmp(req->path, "/status") == 0) {
        gang__agent_view v;
        gang_coord_status cs;
        agent_view(a, &v, &cs);
        char *text = gang__agent_status_json(&v);
        if (text == NULL) {
            gang_http_reply(x, 500, NULL, "out of memory\n", 14);
            return;
        }
        gang_http_reply(x, 200, "application/json", text, strlen(text));
        cJSON_free(text);
    } else if (strcmp(req->path, "/metrics") == 0) {
        gang__agent_view v;
        gang_coord_status cs;
        gang_metrics_buf b;
        agent_view(a, &v, &cs);
        gang_metrics_buf_init(&b);
        gang__agent_metrics(&v, &b);
        if (b.err) {
            gang_http_reply(x, 500, NULL, "metrics error\n", 14);
        } else {
            const char *t = gang_metrics_buf_text(&b);
            gang_http_reply(x, 200, "text/plain; version=0.0.4; charset=utf-8", t, strlen(t));
        }
        gang_metrics_buf_free(&b);
    } else {
        const char *b = "{\"error\":{\"message\":\"not found\",\"type\":"
                        "\"invalid_request_error\",\"param\":null,\"code\":\"not_found\"}}";
        gang_http_reply(x, 404, "application/json", b, strlen(b));
    }
}

/* --- start-up --------------------------------------------------------------------- */

/*
 * The address peers use to reach this node's workers: --advertise-address, else the bind
 * address when it is a concrete one, else the first non-loopback IPv4 of this host.
 */
static void pick_advertise_address(gang_params *p)
{
    if (p->advertise_address[0])
        return;
    if (strcmp(p->bind_address, "0.0.0.0") != 0 && strcmp(p->bind_address, "::") != 0) {
        gang_strlcpy(p->advertise_address, p->bind_address, sizeof(p->advertise_address));
        return;
    }
    gang_strlcpy(p->advertise_address, "127.0.0.1", sizeof(p->advertise_address));
    struct ifaddrs *ifs = NULL;
    if (getifaddrs(&ifs) != 0)
        return;
    for (struct ifaddrs *i = ifs; i; i = i->ifa_next) {
        if (i->ifa_addr == NULL || i->ifa_addr->sa_family != AF_INET)
            continue;
        struct sockaddr_in *sin = (struct sockaddr_in *)i->ifa_addr;
        if ((ntohl(sin->sin_addr.s_addr) >> 24) == 127)
            continue;
        inet_ntop(AF_INET, &sin->sin_addr, p->advertise_address, sizeof(p->advertise_address));
        break;
    }
    freeifaddrs(ifs);
}

int gang_agent_prepare(gang_params *p, char *const *envp, gang_identity *id, char *err,
                       size_t errlen)
{
    char host[256] = "";
    gethostname(host, sizeof(host) - 1);
    int rc = gang_identity_discover(p, envp, host, id, err, errlen);
    if (rc != 0)
        return rc;
    if (id->nnodes != (int32_t)p->nnodes)
        p->nnodes = id->nnodes;
    /* Workers inherit the parameters: they need the node index the agent discovered
     * (hostname ordinal, MPI, LWS) to cut their shard of the model. */
    p->node_index = id->node_index;
    if ((uint64_t)p->nnodes * (uint64_t)p->nproc_per_node > 65536) {
        snprintf(err, errlen, "world size %lld x %lld is too large", (long long)p->nnodes,
                 (long long)p->nproc_per_node);
        return GANG_EUSAGE;
    }
    if (p->heartbeat_timeout_ms <= p->heartbeat_interval_ms) {
        snprintf(err, errlen,
                 "--heartbeat-timeout-ms (%lld) must exceed "
                 "--heartbeat-interval-ms (%lld)",
                 (long long)p->heartbeat_timeout_ms, (long long)p->heartbeat_interval_ms);
        return GANG_EUSAGE;
    }
    pick_advertise_address(p);
    return 0;
}

/* The coordinator of the gang (node 0 only), configured from the agent's config. */
static int agent_start_coord(agent *a)
{
    const gang_agent_config *c = &a->cfg;
    gang_coord_config cc = {
        .bind_address = c->bind_address,
        .port = c->rdzv_port,
        .job = c->job_name,
        .nnodes = (uint32_t)c->layout.tc.nnodes,
        .nproc_per_node = (uint32_t)c->layout.tc.nproc_per_node,
        .tp = (uint32_t)c->layout.tc.tp,
        .pp = (uint32_t)c->layout.tc.pp,
        .token = c->token,
        .heartbeat_interval_ms = c->heartbeat_interval_ms,
        .heartbeat_timeout_ms = c->heartbeat_timeout_ms,
        .handshake_timeout_ms = c->handshake_timeout_ms,
        .start_timeout_ms = c->start_timeout_ms,
        .max_restarts = c->max_restarts,
        .restart_window_ms = c->restart_window_ms,
        .restart_backoff_ms = c->restart_backoff_ms,
        .restart_backoff_max_ms = c->restart_backoff_max_ms,
        .max_connections = c->max_connections,
        .on_api = c_on_api,
        .api_ctx = a,
    };
    memcpy(cc.model_digest, c->digest, GANG_DIGEST_SIZE);
    int rc = gang_coord_start(&a->loop, &cc, &a->coord);
    if (rc != 0)
        gang_error("agent: coordinator on %s:%d: %s", c->bind_address, c->rdzv_port,
                   gang_strerror(rc));
    return rc;
}

/* The workers of this node, and on the coordinator the inference API in front of them. */
static int agent_start_workers(agent *a)
{
    gang_sup_callbacks sc = {.ctx = a,
                             .on_blob = s_on_blob,
                             .on_all_ready = s_on_all_ready,
                             .on_failure = s_on_failure,
                             .on_idle = s_on_idle,
                             .on_token = s_on_token,
                             .on_done = s_on_done,
                             .on_fatal = s_on_fatal};
    int rc = gang_sup_start(&a->loop, &a->cfg.sup, &sc, &a->sup);
    if (rc != 0) {
        gang_error("agent: cannot start workers: %s", gang_strerror(rc));
        return rc;
    }
    /* Every agent serves the API; a member forwards its requests to the coordinator. */
    int coordinator = a->cfg.id.is_coordinator;
    a->cfg.api.forward_node = coordinator ? 0 : (uint32_t)a->cfg.id.node_index;
    if (coordinator) {
        a->relay = calloc(1, sizeof(*a->relay));
        if (a->relay == NULL)
            return GANG_ENOMEM;
        a->relay->sup = a->sup;
        a->relay->coord = a->coord;
    }
    rc = gang_api_init(&a->loop, &a->cfg.api, coordinator ? api_submit_local : api_submit_forward,
                       a, &a->api);
    if (rc != 0)
        gang_error("agent: API: %s", gang_strerror(rc));
    return rc;
}

/* This node's membership of the gang: JOIN, heartbeats, and the coordinator's orders. */
static int agent_start_member(agent *a)
{
    const gang_agent_config *c = &a->cfg;
    gang_member_config mc = {
        .coordinator_host = c->id.coordinator_host,
        .coordinator_port = c->id.coordinator_port,
        .token = c->token,
        .heartbeat_interval_ms = c->heartbeat_interval_ms,
        .heartbeat_timeout_ms = c->heartbeat_timeout_ms,
        .connect_timeout_ms = c->connect_timeout_ms,
        .backoff_initial_ms = c->dns_backoff_initial_ms,
        .backoff_max_ms = c->dns_backoff_max_ms,
    };
    gang_strlcpy(mc.join.job, c->job_name, sizeof(mc.join.job));
    mc.join.node_index = (uint32_t)c->id.node_index;
    mc.join.nnodes = (uint32_t)c->layout.tc.nnodes;
    mc.join.nproc_per_node = (uint32_t)c->layout.tc.nproc_per_node;
    mc.join.tp = (uint32_t)c->layout.tc.tp;
    mc.join.pp = (uint32_t)c->layout.tc.pp;
    memcpy(mc.join.model_digest, c->digest, GANG_DIGEST_SIZE);
    gang_strlcpy(mc.join.host, c->advertise_address, sizeof(mc.join.host));
    gang_member_callbacks mcb = {.ctx = a,
                                 .on_blob_request = m_on_blob_request,
                                 .on_start = m_on_start,
                                 .on_abort = m_on_abort,
                                 .on_give_up = m_on_give_up,
                                 .on_rejected = m_on_rejected,
                                 .fill_heartbeat = m_fill_heartbeat,
                                 .on_api = m_on_api};
    int rc = gang_member_start(&a->loop, &mc, &mcb, &a->member);
    if (rc != 0)
        gang_error("agent: member: %s", gang_strerror(rc));
    return rc;
}

/*
 * Derives the agent's config from the parameters and checks it (identity, token, model,
 * layout). Returns 0, or the exit code of a refusal after logging it and writing it to
 * the termination log.
 */
static int agent_configure(agent *a, const gang_params *params, char *const *envp)
{
    char err[512] = "";
    int rc = gang_agent_config_from_params(params, envp, &a->cfg, err, sizeof(err));
    if (rc != 0) {
        gang_error("agent: %s", err);
        write_termination_log(a, err);
        return gang_exit_code_for(rc);
    }
    gang_log_set_identity(a->cfg.id.node_index, -1);
    if (!a->cfg.token.present)
        gang_warn("agent: running WITHOUT a rendezvous token (--token-file): the gang is not "
                  "authenticated");
    snprintf(a->coord_addr, sizeof(a->coord_addr), "%s:%u", a->cfg.id.coordinator_host,
             a->cfg.id.coordinator_port);
    return 0;
}

/*
 * Starts everything on the loop: HTTP, the coordinator (node 0), the workers and API,
 * the membership, the signal handlers. Returns GANG_EXIT_OK to run the loop (a failure
 * after the workers started stops the agent through agent_stop, whose exit code the loop
 * then returns), or the exit code of a failure before anything needs stopping.
 */
static int agent_start(agent *a)
{
    /* The probes' paths, served on AGENT_PROBE_RESERVE more connections when every one of
     * --http-max-connections is being answered (a stream each, say). */
    static const char *const probes[] = {"/healthz", "/readyz",  "/health",
                                         "/status",  "/metrics", NULL};
    const gang_agent_config *c = &a->cfg;
    gang_http_config hc = {.bind_address = c->bind_address,
                           .port = c->http_port,
                           .max_body = 8 << 20,
                           .max_conns = c->http_max_connections > 0 ? c->http_max_connections : 256,
                           .idle_timeout_ms = 10000,
                           .cors_origin = c->cors_allow_origin,
                           .probe_reserve = AGENT_PROBE_RESERVE,
                           .probe_paths = probes};
    int rc = gang_http_server_start(&a->loop, &hc, on_http, a, &a->http);
    if (rc != 0) {
        gang_error("agent: HTTP on %s:%d: %s", c->bind_address, c->http_port,
                   rc == GANG_EEXIST ? "address already in use" : gang_strerror(rc));
        return GANG_EXIT_TEMPFAIL;
    }
    if (c->id.is_coordinator && agent_start_coord(a) != 0)
        goto out_http;
    rc = agent_start_workers(a);
    if (rc != 0 && a->sup == NULL)
        goto out_coord;
    if (rc == 0)
        rc = agent_start_member(a);
    if (rc != 0) {
        agent_stop(a, GANG_EXIT_INTERNAL);
        return GANG_EXIT_OK;
    }
    uv_signal_start(&a->sigterm, on_signal, SIGTERM);
    uv_signal_start(&a->sigint, on_signal, SIGINT);
    gang_info("agent: node %d of %d (%s), %d workers, coordinator %s, HTTP %s:%d", c->id.node_index,
              c->layout.tc.nnodes, gang_identity_source_name(c->id.source),
              c->layout.tc.nproc_per_node, a->coord_addr, c->bind_address, c->http_port);
    return GANG_EXIT_OK;
out_coord:
    gang_coord_close(a->coord);
out_http:
    gang_http_server_close(a->http);
    return GANG_EXIT_TEMPFAIL;
}

int gang_agent_main(const gang_params *params, char *const *envp)
{
    agent *a = calloc(1, sizeof(*a));
    if (a == NULL)
        return GANG_EXIT_INTERNAL;
    a->fail_rank = -1;
    a->started_ms = gang_now_ms();
    int exit_code = agent_configure(a, params, envp);
    if (exit_code != GANG_EXIT_OK)
        goto out_free;

    uv_loop_init(&a->loop);
    /* Initialised now so agent_stop() can close them on any path; started at the end. */
    uv_signal_init(&a->loop, &a->sigterm);
    uv_signal_init(&a->loop, &a->sigint);
    uv_timer_init(&a->loop, &a->linger);
    a->sigterm.data = a->sigint.data = a->linger.data = a;
    agent_sweep_shm(a, 0);
    exit_code = agent_start(a);
    uv_run(&a->loop, UV_RUN_DEFAULT);
    if (exit_code == GANG_EXIT_OK)
        exit_code = a->exit_code;
    uv_walk(&a->loop, close_walk, NULL);
    uv_run(&a->loop, UV_RUN_DEFAULT);
    uv_loop_close(&a->loop);
    agent_sweep_shm(a, UINT64_MAX);
out_free:
    gang_agent_config_free(&a->cfg);
    free(a->relay);
    free(a);
    return exit_code;
}
