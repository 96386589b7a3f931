/*
 * The worker process: the control side of one rank. See worker.h for what it is and
 * wctl.h for the protocol it speaks with its agent.
 *
 * Threads. The main thread owns the agent channel and never blocks for long: it polls
 * the agent socket and the data thread's event pipe, and sends HEARTBEAT(state) every
 * heartbeat interval whatever the data plane is doing. That is how the agent tells a
 * hung worker from a busy one: a worker whose data plane waits on a dead peer still
 * heartbeats (and reports ERROR), while a stopped or wedged process goes silent. The
 * loader thread reads the model shard once; the data thread (worker-engine.c, one per
 * generation) forms the communicator and runs the engine; both report through the event
 * pipe (READY, FAILED, TOKEN, DONE, LOADED) and the data thread is stopped, from any of
 * its waits, by gang__wstep_stop(). A model that cannot be loaded ends the worker with
 * exit code 3 (never retried), after it told the agent why.
 *
 * Generations. The worker remembers the highest generation the agent has named in any
 * message (gen). A message of an older generation is ignored and logged at debug level:
 * it was overtaken in flight by a newer decision of the agent. A newer generation
 * supersedes anything still running for an older one.
 *
 * Exit codes: 0 after SHUTDOWN; 75 when the agent channel closes, fails, carries a packet
 * of the wrong size, or the agent process is gone; 2 for a usage error or a layout the
 * model cannot take; 3 when the model cannot be loaded.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "ganglion/gpu.h"
#include "wctl.h"
#include "worker-state.h"
#include "worker.h"

extern char **environ;

/* -------------------------------------------------------------------------------------
 * Command line
 * ------------------------------------------------------------------------------------- */

/* The worker's own flags, parsed with the registry's machinery (an option table). */
typedef struct worker_opts {
    char agent_socket[sizeof(((struct sockaddr_un *)0)->sun_path)];
    int64_t local_rank; /* -1 = not given */
} worker_opts;

static const gang_param_info worker_opt_items[] = {
    {"agent-socket", GANG_PARAM_STR, "", 0, 0, "the agent's control socket (set by the agent)",
     offsetof(worker_opts, agent_socket), 0, 0, sizeof(((worker_opts *)0)->agent_socket)},
    {"local-rank", GANG_PARAM_INT, "-1", -1, GANG_MAX_LOCAL_RANKS - 1,
     "this worker's rank on its node (set by the agent)", offsetof(worker_opts, local_rank), 0, 0,
     0},
};
static const gang_opt_table worker_opts_table = GANG_OPT_TABLE(worker_opt_items);

/*
 * Fills w->conf from the environment and argv (argv[0] is the subcommand): the registry's
 * flags into a transient gang_params, what remains against the worker's own table
 * (--agent-socket, --local-rank; anything else is an error), then
 * gang_worker_config_from_params. Returns 0 or GANG_EUSAGE after logging what is wrong.
 */
static int worker_parse(gang__worker *w, int argc, char **argv)
{
    char err[256];
    int rc, nrest = 0;
    worker_opts o;
    gang_params *p = malloc(sizeof(*p));
    char **rest = calloc((size_t)(argc > 0 ? argc : 1), sizeof(*rest));
    if (rest == NULL || p == NULL) {
        rc = GANG_ENOMEM;
        snprintf(err, sizeof(err), "out of memory");
        goto out_free;
    }
    gang_opts_defaults(&worker_opts_table, &o);
    rc = gang_params_load(p, environ, argc - 1, argv + 1, rest, &nrest, err, sizeof(err));
    if (rc == 0)
        rc =
            gang_opts_parse_args(&worker_opts_table, &o, nrest, rest, NULL, NULL, err, sizeof(err));
    if (rc == 0 && (o.agent_socket[0] == '\0' || o.local_rank < 0)) {
        snprintf(err, sizeof(err),
                 "--agent-socket PATH and --local-rank L are required "
                 "(the agent starts workers; see `ganglion serve`)");
        rc = GANG_EUSAGE;
    }
    if (rc == 0)
        rc = gang_worker_config_from_params(p, o.agent_socket, (uint32_t)o.local_rank, &w->conf,
                                            err, sizeof(err));
    if (rc == 0) {
        w->local_rank = w->conf.local_rank;
        w->node = w->conf.node;
        gang_log_configure(w->conf.log_format, w->conf.log_level);
    }
out_free:
    if (rc != 0)
        gang_error("worker: %s", err);
    free(rest);
    free(p);
    return rc == 0 ? 0 : GANG_EUSAGE;
}

/* -------------------------------------------------------------------------------------
 * Agent channel
 * ------------------------------------------------------------------------------------- */

/* Milliseconds from now until deadline as a poll() timeout (0 when passed). */
static int ms_until(uint64_t deadline)
{
    uint64_t now = gang_now_ms();
    if (now >= deadline)
        return 0;
    return deadline - now > INT_MAX ? INT_MAX : (int)(deadline - now);
}

/* A message of type for generation gen, addressed from this worker. */
static void worker_msg(const gang__worker *w, gang_wctl *m, gang_wctl_type type, uint64_t gen)
{
    memset(m, 0, sizeof(*m));
    m->type = type;
    m->local_rank = w->local_rank;
    m->generation = gen;
    m->pid = (int32_t)getpid();
    m->state = w->state;
    m->rank = w->rank;
}

/*
 * Sends m to the agent. A heartbeat (wait = 0) is dropped when the channel is full: the
 * agent is behind, and a newer heartbeat follows. Any other message waits for room up to
 * the heartbeat timeout; an agent that reads nothing for that long is gone as far as
 * this worker can tell. Returns 0, GANG_EAGAIN (heartbeat dropped), or an error after
 * which the channel is lost: the caller leaves with exit code 75.
 */
static int worker_send_bytes(gang__worker *w, const uint8_t *buf, size_t len, int wait)
{
    uint64_t deadline = gang_now_ms() + w->conf.heartbeat_timeout_ms;
    for (;;) {
        ssize_t n = send(w->agent_fd, buf, len, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n == (ssize_t)len)
            return 0;
        if (n >= 0)
            return GANG_EIO; /* SEQPACKET sends whole packets; this cannot happen */
        if (errno == EINTR)
            continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK)
            return gang_err_from_errno(errno);
        if (!wait)
            return GANG_EAGAIN;
        struct pollfd pfd = {.fd = w->agent_fd, .events = POLLOUT};
        int timeout = ms_until(deadline);
        if (timeout == 0)
            return GANG_ETIMEDOUT;
        if (poll(&pfd, 1, timeout) < 0 && errno != EINTR)
            return gang_err_from_errno(errno);
    }
}

/* Sends control message m (see worker_send_bytes). */
static int worker_send(gang__worker *w, const gang_wctl *m, int wait)
{
    uint8_t buf[GANG_WCTL_PACKET_MAX];
    size_t len = 0;
    int rc = gang_wctl_encode(m, buf, sizeof(buf), &len);
    return rc != 0 ? rc : worker_send_bytes(w, buf, len, wait);
}

/* Marks the channel lost: the loop ends and the worker exits 75. */
static void worker_channel_lost(gang__worker *w, const char *what, int err)
{
    gang_error("agent channel lost (%s: %s); exiting %d", what, gang_strerror(err),
               GANG_EXIT_TEMPFAIL);
    w->quit = 1;
    w->exit_code = GANG_EXIT_TEMPFAIL;
}

/* Sends a reply that must arrive (not a heartbeat); a failure ends the worker. */
static void worker_reply(gang__worker *w, const gang_wctl *m)
{
    int rc = worker_send(w, m, 1);
    if (rc != 0)
        worker_channel_lost(w, "send", rc);
}

/* Sends request message r (TOKEN, DONE), which must arrive; a failure ends the worker. */
void gang__worker_reply_req(gang__worker *w, const gang_req_msg *r)
{
    uint8_t buf[GANG_WCTL_PACKET_MAX];
    size_t len = 0;
    int rc = gang_wctl_encode_req(r, buf, sizeof(buf), &len);
    if (rc == 0)
        rc = worker_send_bytes(w, buf, len, 1);
    if (rc != 0)
        worker_channel_lost(w, "send", rc);
}

/*
 * Sends the GPU's latest sample (a GPU packet) when the worker watches one: the agent
 * exports it in /metrics and shows it in /status. Dropped like a heartbeat when the
 * channel is full. Returns 0, GANG_EAGAIN, or a channel error.
 */
static int worker_send_gpu(gang__worker *w)
{
    gang_wctl m;
    gang_gpu_sample gs;
    if (gang__wgpu_sample(w->gpu, &gs) != 0)
        return 0;
    worker_msg(w, &m, GANG_WCTL_GPU, w->gen);
    memcpy(m.blob, &gs, sizeof(gs));
    m.blob_len = (uint32_t)sizeof(gs);
    return worker_send(w, &m, 0);
}

/*
 * Sends the MoE layers' load (a MOE packet) when the shard has them and the data thread
 * published it: the agent exports it in /metrics. Dropped like a heartbeat when the
 * channel is full. Returns 0, GANG_EAGAIN, or a channel error.
 */
static int worker_send_moe(gang__worker *w)
{
    gang_wctl m;
    gang_moe_load_sample ms;
    _Static_assert(sizeof(ms) <= GANG_BLOB_MAX, "a MoE sample fits one packet");
    if (!gang__wres_moe_sample(w->res, &ms))
        return 0;
    worker_msg(w, &m, GANG_WCTL_MOE, w->gen);
    memcpy(m.blob, &ms, sizeof(ms));
    m.blob_len = (uint32_t)sizeof(ms);
    return worker_send(w, &m, 0);
}

static void worker_heartbeat(gang__worker *w)
{
    gang_wctl m;
    worker_msg(w, &m, GANG_WCTL_HEARTBEAT, w->gen);
    int rc = worker_send(w, &m, 0);
    if (rc == 0)
        rc = worker_send_gpu(w);
    if (rc == 0)
        rc = worker_send_moe(w);
    if (rc == GANG_EAGAIN)
        gang_debug("agent channel full: heartbeat dropped");
    else if (rc != 0)
        worker_channel_lost(w, "heartbeat", rc);
}

/*
 * Reports a failure of generation gen to the agent: ERROR(gen, code, rank, reason) with
 * rank the global rank at fault (the own rank, or WORKER_NO_RANK before START, when the
 * fault is local). The worker is FAILED until the agent aborts the generation (or, when
 * it is leaving, w->quit, until it exits).
 */
static void worker_report_error(gang__worker *w, uint64_t gen, int code, uint32_t rank,
                                const char *fmt, ...) __attribute__((format(printf, 5, 6)));
static void worker_report_error(gang__worker *w, uint64_t gen, int code, uint32_t rank,
                                const char *fmt, ...)
{
    gang_wctl m;
    w->state = GANG_RANK_FAILED;
    worker_msg(w, &m, GANG_WCTL_ERROR, gen);
    m.code = code;
    m.rank = rank;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m.reason, sizeof(m.reason), fmt, ap);
    va_end(ap);
    gang_error("generation %llu failed: %s (%s); %s", (unsigned long long)gen, m.reason,
               gang_err_name(code), w->quit ? "exiting" : "waiting for ABORT");
    worker_reply(w, &m);
}

/*
 * Fails the generation the worker is in when its GPU has a fatal condition: ERROR with
 * GANG_EGPU and the watch's sentence (GPU, Xid or condition), which the agent prefixes
 * with the rank. The Xid is acknowledged: it made this generation fail once; a level
 * condition (device lost, double-bit ECC, pending retirement) is seen again at the next
 * START if it persists. Outside a generation, or already failed in it (at_start = 0),
 * nothing happens now: the next START checks, whatever the state. Returns 1 when it
 * reported.
 */
static int worker_gpu_check(gang__worker *w, uint64_t gen, int at_start)
{
    char why[GANG_GPU_FAULT_MAX];
    if ((!at_start && w->state == GANG_RANK_FAILED) ||
        !gang__wgpu_fault(w->gpu, 0, why, sizeof(why)))
        return 0;
    gang__wgpu_fault(w->gpu, 1, why, sizeof(why));
    worker_report_error(w, gen, GANG_EGPU, w->rank, "%s", why);
    worker_send_gpu(w); /* the metrics show the fault with the failure, not a beat later */
    return 1;
}

/* -------------------------------------------------------------------------------------
 * Data plane lifetime
 * ------------------------------------------------------------------------------------- */

/*
 * Acts on a failed load of the shard, which a retry cannot fix: reports it as ERROR of the
 * current generation and makes the worker leave its loop with the model's exit code (3),
 * so that its agent stops instead of restarting it. The loader's state decides, not its
 * LOADED event: a data thread that waited for the load reports the same error as FAILED
 * and may be torn down (its events drained, LOADED among them) before LOADED is read.
 * Returns 1 when the worker is leaving (now or already), 0 while the load is fine or
 * still running.
 */
static int worker_load_failed(gang__worker *w)
{
    char why[GANG_REASON_MAX];
    if (w->quit)
        return 1;
    int rc = gang__wres_load_error(w->res, why, sizeof(why));
    if (rc == 0)
        return 0;
    w->quit = 1;
    w->exit_code = gang_exit_code_for(rc);
    worker_report_error(w, w->gen, rc, w->rank, "%s", why);
    return 1;
}

/*
 * Drops every event in the pipe: those of a data thread that has been joined, and the
 * loader's or the GPU watch's that came meanwhile. Neither is lost: a failed load is read
 * back from the loader's state here, and a GPU fault stays pending in the watch until the
 * next START checks it.
 */
static void worker_drain_events(gang__worker *w)
{
    gang__wevent ev;
    while (read(w->ev_rd, &ev, sizeof(ev)) > 0)
        ;
    worker_load_failed(w);
}

/*
 * Stops the data plane and closes the listener: after this no data socket of any
 * generation is open and no event of one is pending. Bounded by the abort latency of the
 * data thread (milliseconds).
 */
static void worker_teardown(gang__worker *w)
{
    gang__worker_drop_pieces(w);
    if (w->step != NULL) {
        gang__wstep_stop(w->step);
        w->step = NULL;
        worker_drain_events(w);
    }
    gang_bootstrap_free(w->boot);
    w->boot = NULL;
    w->rank = WORKER_NO_RANK;
    gang_log_set_identity(w->node, -1);
}

/*
 * Accepts the generation of an incoming message. Returns 0 when it is current or newer
 * (a newer one supersedes a data plane still running for an older generation), or
 * GANG_ESTALE after logging that it is ignored.
 */
int gang__worker_fence(gang__worker *w, uint64_t gen, const char *what)
{
    if (gen < w->gen) {
        gang_debug("ignoring %s of generation %llu: generation %llu is current", what,
                   (unsigned long long)gen, (unsigned long long)w->gen);
        return GANG_ESTALE;
    }
    if (gen > w->gen && (w->step != NULL || w->boot != NULL)) {
        if (w->step != NULL)
            gang_warn("%s of generation %llu supersedes generation %llu: tearing it down", what,
                      (unsigned long long)gen, (unsigned long long)w->step_gen);
        worker_teardown(w);
        w->state = GANG_RANK_IDLE;
    }
    w->gen = gen;
    gang_log_set_generation((int64_t)w->gen);
    return 0;
}

/* -------------------------------------------------------------------------------------
 * Messages from the agent
 * ------------------------------------------------------------------------------------- */

/*
 * BLOB_REQUEST(G): rank 0 makes the data-plane bootstrap of G (gang_bootstrap_create: its
 * listener, plus an NCCL unique id for a worker whose TP / PP groups run over nccl) and
 * replies with the blob, which the agent carries opaquely to every rank. The NCCL
 * bootstrap root lives as long as the worker: the data thread of G joins it like every
 * other rank.
 */
static void on_blob_request(gang__worker *w, const gang_wctl *m)
{
    if (gang__worker_fence(w, m->generation, "BLOB_REQUEST") != 0)
        return;
    if (w->node != 0 || w->local_rank != 0)
        gang_warn("BLOB_REQUEST sent to node %d local rank %u; expected node 0 local rank 0",
                  w->node, w->local_rank);
    gang_bootstrap_free(w->boot);
    w->boot = NULL;

    gang_wctl r;
    worker_msg(w, &r, GANG_WCTL_BLOB, m->generation);
    size_t len = 0;
    char err[GANG_REASON_MAX] = "";
    const char *adv = w->conf.advertise;
    int nccl = w->conf.res.layout.uses_nccl;
    /* Only the pairs that talk connect: the stages (TP groups, or the EP group when it is
     * wider: every pair of its ranks) and PP rings of a model, else none. */
    const gang_layout *lay = &w->conf.res.layout;
    uint32_t stage = (uint32_t)(lay->tc.ep > lay->tc.tp ? lay->tc.ep : lay->tc.tp);
    gang_comm_socket_opts so = {.job = w->conf.job,
                                .generation = m->generation,
                                .sparse = 1,
                                .tp = lay->model[0] != '\0' ? stage : 0};
    int rc = gang_bootstrap_create_opts(adv, &so, nccl, &w->boot, r.blob, sizeof(r.blob), &len, err,
                                        sizeof(err));
    if (rc != 0) {
        worker_report_error(w, m->generation, rc, w->rank, "rank 0 %s", err);
        return;
    }
    w->listen_gen = m->generation;
    r.blob_len = (uint32_t)len;
    gang_info("BLOB for generation %llu: %u bytes%s", (unsigned long long)m->generation, r.blob_len,
              nccl ? "; TP / PP over nccl (unique id attached)" : "");
    worker_reply(w, &r);
}

/* START(G, rank, world, blob): join the data plane of G on a new data thread. */
static void on_start(gang__worker *w, const gang_wctl *m)
{
    uint64_t g = m->generation;
    if (gang__worker_fence(w, m->generation, "START") != 0)
        return;
    if (worker_load_failed(w)) /* said so already, or now: a new data plane cannot serve */
        return;
    if (w->step != NULL && w->step_gen == g) {
        gang_warn("duplicate START of generation %llu ignored", (unsigned long long)g);
        return;
    }
    if (w->step != NULL) {
        /* Defensive: gang__worker_fence() tears down older generations, and a data plane
         * of another generation must never run beside this one. */
        gang__wstep_stop(w->step);
        w->step = NULL;
        worker_drain_events(w);
        if (w->quit) /* the drain found the load failed */
            return;
    }

    w->rank = m->rank;
    gang_log_set_identity(w->node,
                          m->world_size > 0 && m->rank < m->world_size ? (int)m->rank : -1);
    if (m->world_size == 0 || m->rank >= m->world_size || m->blob_len > GANG_BLOB_MAX) {
        worker_report_error(w, g, GANG_EINVAL, w->rank,
                            "START with rank %u, world %u, blob of %u bytes", m->rank,
                            m->world_size, m->blob_len);
        return;
    }

    /* The blob must carry the nccl part exactly when this worker runs TP / PP over nccl
     * (rank 0 decided from the same parameters; a mismatch is a gang started with
     * different --device / --backend per node). */
    gang_bootstrap_parts parts;
    char err[GANG_REASON_MAX];
    int want_nccl = w->conf.res.layout.uses_nccl;
    if (gang_bootstrap_parse(m->blob, m->blob_len, &parts, err, sizeof(err)) != 0) {
        worker_report_error(w, g, GANG_EPROTO, w->rank, "START: %s", err);
        return;
    }
    if (want_nccl != (parts.nccl != NULL)) {
        worker_report_error(w, g, GANG_EMISMATCH, w->rank,
                            "START: the bootstrap blob %s an NCCL unique id, but this worker "
                            "(--device %s --backend %s) runs its TP / PP groups over %s; "
                            "every node must serve with the same --device and --backend",
                            parts.nccl != NULL ? "carries" : "lacks", w->conf.device,
                            w->conf.backend, want_nccl ? "nccl" : "the socket backend");
        return;
    }

    /* A GPU that failed its health check does not join: the gang restarts without it
     * waiting for a timeout, and the agent sees whether the fault persists. */
    if (worker_gpu_check(w, g, 1))
        return;

    gang__wstep_config cfg;
    memset(&cfg, 0, sizeof(cfg));
    cfg.generation = g;
    cfg.rank = m->rank;
    cfg.world = m->world_size;
    cfg.blob = m->blob;
    cfg.blob_len = m->blob_len;
    cfg.nccl = want_nccl;
    cfg.res = w->res;
    cfg.event_fd = w->ev_wr;
    cfg.start_timeout_ms = (int64_t)w->conf.start_timeout_ms;
    cfg.heartbeat_interval_ms = (int64_t)w->conf.heartbeat_interval_ms;
    cfg.heartbeat_timeout_ms = (int64_t)w->conf.heartbeat_timeout_ms;
    cfg.step_timeout_ms = (int64_t)w->conf.step_timeout_ms;
    gang_strlcpy(cfg.advertise, w->conf.advertise, sizeof(cfg.advertise));
    if (m->rank == 0 && m->world_size > 1) {
        if (w->boot == NULL || w->listen_gen != g) {
            worker_report_error(w, g, GANG_EPROTO, w->rank,
                                "START of generation %llu makes this worker rank 0, but no "
                                "BLOB_REQUEST of that generation came first",
                                (unsigned long long)g);
            return;
        }
        cfg.root = w->boot;
        w->boot = NULL; /* gang__wstep_start consumes it */
    }

    int rc = gang__wstep_start(&cfg, &w->step);
    if (rc != 0) {
        worker_report_error(w, g, rc, w->rank, "cannot start the data thread: %s",
                            gang_strerror(rc));
        return;
    }
    w->step_gen = g;
    w->state = GANG_RANK_STARTING;
    gang_info("START: rank %u of %u joins the data plane", m->rank, m->world_size);
}

/* ABORT(G): tear the data plane down in place and confirm with ABORTED(G). */
static void on_abort(gang__worker *w, const gang_wctl *m)
{
    if (gang__worker_fence(w, m->generation, "ABORT") != 0)
        return;
    uint64_t t0 = gang_now_ms();
    w->state = GANG_RANK_ABORTING;
    worker_teardown(w);
    w->state = GANG_RANK_IDLE;

    gang_wctl r;
    worker_msg(w, &r, GANG_WCTL_ABORTED, m->generation);
    gang_info("ABORT of generation %llu done in %llu ms", (unsigned long long)m->generation,
              (unsigned long long)(gang_now_ms() - t0));
    worker_reply(w, &r);
}

/*
 * Receives one packet from the agent and acts on it. A closed channel, an error or a
 * packet that does not decode ends the worker with exit code 75.
 */
static void worker_on_agent(gang__worker *w)
{
    uint8_t buf[GANG_WCTL_PACKET_MAX + 1]; /* + 1: an oversize packet is seen */
    gang_wctl m;
    gang_req_msg r;
    struct iovec iov = {.iov_base = buf, .iov_len = sizeof(buf)};
    struct msghdr mh;
    memset(&mh, 0, sizeof(mh));
    mh.msg_iov = &iov;
    mh.msg_iovlen = 1;
    ssize_t n = recvmsg(w->agent_fd, &mh, MSG_DONTWAIT);
    if (n < 0) {
        if (errno != EINTR && errno != EAGAIN && errno != EWOULDBLOCK)
            worker_channel_lost(w, "receive", gang_err_from_errno(errno));
        return;
    }
    if (n == 0) {
        worker_channel_lost(w, "agent closed the channel", GANG_ECLOSED);
        return;
    }
    int type = (size_t)n < sizeof(buf) && !(mh.msg_flags & MSG_TRUNC)
                   ? gang_wctl_decode(buf, (size_t)n, &m, &r)
                   : GANG_EPROTO;
    if (type < 0) {
        gang_error("agent sent a malformed packet of %zd bytes", n);
        worker_channel_lost(w, "protocol", GANG_EPROTO);
        return;
    }
    if (gang_req_kind_valid((uint32_t)type)) {
        gang__worker_on_req(w, &r);
        return;
    }
    switch (m.type) {
    case GANG_WCTL_BLOB_REQUEST:
        on_blob_request(w, &m);
        break;
    case GANG_WCTL_START:
        on_start(w, &m);
        break;
    case GANG_WCTL_ABORT:
        on_abort(w, &m);
        break;
    case GANG_WCTL_SHUTDOWN:
        gang_info("SHUTDOWN from the agent");
        w->state = GANG_RANK_ABORTING;
        worker_teardown(w);
        w->quit = 1;
        w->exit_code = GANG_EXIT_OK;
        break;
    default:
        gang_warn("ignoring agent message of type %u", m.type);
        break;
    }
}

/* Acts on what the data thread reported: READY goes to the agent, a failure as ERROR. */
static void worker_on_events(gang__worker *w)
{
    gang__wevent ev;
    for (;;) {
        ssize_t n = read(w->ev_rd, &ev, sizeof(ev));
        if (n < 0 && errno == EINTR)
            continue;
        if (n != (ssize_t)sizeof(ev))
            return; /* empty (EAGAIN); events are written whole, so never partial */
        if (ev.type == GANG__WEV_LOADED) {
            /* A model that cannot be loaded will not load on a retry either. */
            if (ev.code != 0 && worker_load_failed(w))
                return;
            continue;
        }
        if (ev.type == GANG__WEV_GPU) {
            if (w->step != NULL)
                worker_gpu_check(w, w->step_gen, 0);
            continue;
        }
        if (w->step == NULL || ev.generation != w->step_gen) {
            gang_debug("ignoring a data-plane event of generation %llu",
                       (unsigned long long)ev.generation);
            continue;
        }
        if (ev.type == GANG__WEV_READY && w->state == GANG_RANK_STARTING) {
            gang_wctl r;
            w->state = GANG_RANK_READY;
            worker_msg(w, &r, GANG_WCTL_READY, ev.generation);
            if (ev.has_kv) { /* the agent shows it in /status */
                memcpy(r.blob, &ev.kv, sizeof(ev.kv));
                r.blob_len = (uint32_t)sizeof(ev.kv);
            }
            gang_info("READY in generation %llu", (unsigned long long)ev.generation);
            worker_reply(w, &r);
        } else if (ev.type == GANG__WEV_KV && ev.has_kv) { /* /metrics: dropped when full */
            gang_wctl r;
            worker_msg(w, &r, GANG_WCTL_KV, ev.generation);
            memcpy(r.blob, &ev.kv, sizeof(ev.kv));
            r.blob_len = (uint32_t)sizeof(ev.kv);
            int rc = worker_send(w, &r, 0);
            if (rc != 0 && rc != GANG_EAGAIN)
                worker_channel_lost(w, "KV report", rc);
        } else if (ev.type == GANG__WEV_FAILED) {
            if (worker_load_failed(w)) /* the load's error, which the thread waited for */
                return;
            ev.reason[sizeof(ev.reason) - 1] = '\0';
            worker_report_error(w, ev.generation, ev.code, (uint32_t)ev.rank, "%s", ev.reason);
        } else if (ev.type == GANG__WEV_TOKEN || ev.type == GANG__WEV_DONE) {
            gang_req_msg r;
            memset(&r, 0, sizeof(r));
            r.kind = ev.type == GANG__WEV_TOKEN ? GANG_REQ_TOKEN : GANG_REQ_DONE;
            r.generation = ev.generation;
            r.id = ev.req_id;
            r.token = ev.token;
            r.index = ev.index;
            r.logprob = ev.logprob;
            r.n_top = ev.n_top <= GANG_MAX_TOP_LOGPROBS ? ev.n_top : 0;
            memcpy(r.top_ids, ev.top_ids, sizeof(r.top_ids));
            memcpy(r.top_lp, ev.top_lp, sizeof(r.top_lp));
            r.code = ev.code;
            memcpy(r.finish, ev.finish, sizeof(r.finish));
            r.finish[sizeof(r.finish) - 1] = '\0';
            r.kv_id = ev.kv_id;
            r.kv_blocks = ev.kv_blocks;
            r.kv_ms = ev.kv_ms;
            r.kv_mismatch = ev.kv_mismatch != 0;
            r.kv_device = ev.kv_device != 0;
            r.kv_layout = gang_kv_layout_valid(&ev.kv_layout) ? ev.kv_layout : (gang_kv_layout){0};
            ev.reason[sizeof(ev.reason) - 1] = '\0';
            gang_strlcpy(r.reason, ev.reason, sizeof(r.reason));
            gang__worker_reply_req(w, &r);
        }
    }
}

/* -------------------------------------------------------------------------------------
 * Entry point
 * ------------------------------------------------------------------------------------- */

/* Connects to the agent's socket and says HELLO. Returns 0 or an error (exit 75). */
static int worker_connect(gang__worker *w)
{
    struct sockaddr_un sa;
    memset(&sa, 0, sizeof(sa));
    sa.sun_family = AF_UNIX;
    memcpy(sa.sun_path, w->conf.agent_path, sizeof(sa.sun_path));

    w->agent_fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (w->agent_fd < 0)
        return gang_err_from_errno(errno);
    /* The agent is local and listening before it spawns us: connect does not wait. */
    if (connect(w->agent_fd, (struct sockaddr *)&sa, sizeof(sa)) != 0)
        return gang_err_from_errno(errno);
    int fl = fcntl(w->agent_fd, F_GETFL);
    if (fl < 0 || fcntl(w->agent_fd, F_SETFL, fl | O_NONBLOCK) != 0)
        return gang_err_from_errno(errno);

    gang_wctl m;
    worker_msg(w, &m, GANG_WCTL_HELLO, 0);
    return worker_send(w, &m, 1);
}

/* The main thread's loop: heartbeats on time, agent messages, data-plane events. */
static void worker_loop(gang__worker *w)
{
    while (!w->quit) {
        uint64_t now = gang_now_ms();
        if (now >= w->next_hb_ms) {
            worker_heartbeat(w);
            w->next_hb_ms = now + w->conf.heartbeat_interval_ms;
            if (w->quit)
                break;
        }
        /* PR_SET_PDEATHSIG covers this too; the check also covers a subreaper. */
        if (getppid() != w->ppid) {
            worker_channel_lost(w, "parent", GANG_ECLOSED);
            break;
        }
        struct pollfd pfd[2] = {{.fd = w->agent_fd, .events = POLLIN},
                                {.fd = w->ev_rd, .events = POLLIN}};
        int n = poll(pfd, 2, ms_until(w->next_hb_ms));
        if (n < 0) {
            if (errno != EINTR)
                worker_channel_lost(w, "poll", gang_err_from_errno(errno));
            continue;
        }
        if (pfd[1].revents)
            worker_on_events(w);
        if (pfd[0].revents && !w->quit)
            worker_on_agent(w);
    }
}

int gang_worker_main(int argc, char **argv)
{
    gang__worker w;
    memset(&w, 0, sizeof(w));
    w.agent_fd = w.ev_rd = w.ev_wr = -1;
    w.rank = WORKER_NO_RANK;
    w.state = GANG_RANK_IDLE;
    w.exit_code = GANG_EXIT_TEMPFAIL;

    if (worker_parse(&w, argc, argv) != 0)
        return GANG_EXIT_USAGE;
    gang_log_set_identity(w.node, -1);
    gang_log_set_generation(-1);

    /* Die with the agent: it is the one that can restart us, and a worker without it
     * would hold its GPU for nothing. The parent may have died before prctl() took
     * effect, hence the check right after it. */
    w.ppid = getppid();
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0)
        gang_warn("prctl(PR_SET_PDEATHSIG): %s", strerror(errno));
    if (getppid() != w.ppid) {
        gang_error("the agent exited while this worker started");
        return GANG_EXIT_TEMPFAIL;
    }

    int fds[2];
    int rc = pipe2(fds, O_CLOEXEC);
    if (rc != 0) {
        rc = gang_err_from_errno(errno);
        gang_error("worker: pipe: %s", gang_strerror(rc));
        goto out;
    }
    w.ev_rd = fds[0];
    w.ev_wr = fds[1];
    /* Only the reader is non-blocking: an event must never be lost by the data thread. */
    int fl = fcntl(w.ev_rd, F_GETFL);
    if (fl < 0 || fcntl(w.ev_rd, F_SETFL, fl | O_NONBLOCK) != 0) {
        rc = gang_err_from_errno(errno);
        gang_error("worker: fcntl: %s", gang_strerror(rc));
        goto out;
    }

    /* Placement binds this thread before the loader starts, so every thread inherits. It
     * comes before HELLO: nvmlInit can take seconds on a node without persistence mode,
     * which the supervisor's start-up allowance covers and its heartbeat timeout would
     * not. */
    rc = gang__wgpu_open(&w.conf, w.local_rank, w.ev_wr, &w.gpu);
    if (rc != 0) {
        gang_error("worker: GPU placement: %s", gang_strerror(rc));
        goto out;
    }
    rc = worker_connect(&w);
    if (rc != 0) {
        gang_error("cannot reach the agent at %s: %s", w.conf.agent_path, gang_strerror(rc));
        goto out;
    }
    if (w.conf.res.layout.model[0] != '\0' && w.node < 0) {
        gang_error("worker: --model needs the node index (--node-index) to cut its shard");
        w.exit_code = GANG_EXIT_USAGE;
        goto out;
    }
    rc = gang__wres_open(&w.conf.res,
                         (uint32_t)(w.node < 0 ? 0 : w.node) * w.conf.nproc_per_node + w.local_rank,
                         w.ev_wr, &w.res);
    if (rc != 0) {
        gang_error("worker: cannot start the model loader: %s", gang_strerror(rc));
        goto out;
    }
    const char *model = w.conf.res.layout.model;
    gang_info("worker local rank %u up (pid %d)%s%s", w.local_rank, (int)getpid(),
              model[0] ? "; loading " : "; no model", model);
    w.next_hb_ms = gang_now_ms();
    worker_loop(&w);

out:
    worker_teardown(&w);
    gang__wres_close(w.res);
    gang__wgpu_close(w.gpu);
    if (w.agent_fd >= 0) {
        /* Closing with the agent's packets unread would reset the channel, and the agent
         * could lose the ERROR that says why we exit: read what is queued first. */
        uint8_t junk[64]; /* a longer packet's rest is discarded with it */
        while (recv(w.agent_fd, junk, sizeof(junk), MSG_DONTWAIT) > 0)
            ;
        close(w.agent_fd);
    }
    if (w.ev_rd >= 0)
        close(w.ev_rd);
    if (w.ev_wr >= 0)
        close(w.ev_wr);
    gang_info("worker exits with %d", w.exit_code);
    return w.exit_code;
}
