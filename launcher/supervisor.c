/*
 * Worker supervision for one agent.
 *
 * Each local rank has a slot holding its process (uv_process_t) and its control channel
 * (a SOCK_SEQPACKET connection watched with uv_poll). The slot knows whether the worker
 * is in a generation, READY in it, or has an abort pending. Failures are reported to the
 * agent once per generation and slot:
 *   - the process exits (crash, OOM kill): reported at once from the exit callback;
 *   - the heartbeat stops (hang, SIGSTOP): reported after heartbeat_timeout_ms;
 *   - the worker sends ERROR (its data plane lost a peer).
 * An abort asks every worker in the generation to tear down its data plane and confirm
 * with ABORTED; a worker that has not confirmed by the abort deadline is SIGKILLed and
 * respawned. Dead workers are always respawned: the agent's node is available for the
 * next generation once every slot is alive, connected and idle.
 */
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>
#include <uv.h>

#include "ganglion/gpu.h"
#include "ganglion/rendezvous.h"
#include "supervisor.h"
#include "wctl.h"

/* Age below which a control directory may belong to an agent still starting. */
#define GANG_SUP_STALE_AGE_S 60

#define ARGV_MAX 256
#define SUP_HELLO_TIMEOUT_MS 10000 /* silence allowed before a new worker's HELLO */

typedef struct wslot {
    gang_sup *sup;
    uint32_t local_rank;
    uv_process_t proc;
    int proc_alive; /* the process has not been reaped */
    int pid;
    int fd; /* control connection, -1 when none */
    uv_poll_t poll;
    int poll_open;  /* poll handle initialised and not closed */
    int hello;      /* HELLO received on fd */
    uint32_t state; /* last reported gang_rank_state */
    uint64_t last_hb_ms;
    uint64_t gen; /* generation the worker is in (0 = none) */
    int ready;    /* READY for gen */
    int abort_pending;
    uint64_t abort_deadline_ms;
    int failure_reported; /* for gen */
    uint64_t restarts;
    uint32_t spawn_failures;          /* consecutive uv_spawn failures */
    char last_error[GANG_REASON_MAX]; /* reason of its last ERROR, any generation */
    gang_gpu_sample gpu;              /* its GPU's latest sample (GPU packets) */
    int has_gpu;
    gang_moe_load_sample moe; /* its MoE layers' latest load (MOE packets) */
    int has_moe;
    gang_engine_kv kv; /* its KV cache, from its last READY with a model */
    int has_kv;
} wslot;

struct gang_sup {
    uv_loop_t *loop;
    uint32_t node;
    uint32_t n;
    uint64_t heartbeat_timeout_ms;
    uint64_t abort_timeout_ms;
    gang_args worker_args; /* the forwarded registry flags (owned copy) */
    char exe[512];
    char dir[128];  /* private directory of the control socket */
    char path[160]; /* control socket path */
    int listen_fd;
    uv_poll_t listen_poll;
    uv_timer_t tick;
    gang_sup_callbacks cb;
    wslot *slots;
    uint64_t gen; /* generation being started/served, 0 = none */
    int idle_notified;
    int shutting_down;
    int tick_closed;
    uint64_t shutdown_deadline_ms;
    void (*done)(void *);
    void *done_ctx;
    int open_handles;
    gang_wctl pkt;                         /* control message scratch (receive and send) */
    gang_req_msg req;                      /* request message scratch (receive) */
    uint8_t buf[GANG_WCTL_PACKET_MAX + 1]; /* one packet, encoded; + 1 sees an oversize one */
};

static void spawn_worker(wslot *w);

static int32_t global_rank(const gang_sup *s, const wslot *w)
{
    return (int32_t)(s->node * s->n + w->local_rank);
}

static void sup_unref(gang_sup *s)
{
    if (--s->open_handles > 0)
        return;
    if (s->listen_fd >= 0)
        close(s->listen_fd);
    unlink(s->path);
    rmdir(s->dir);
    void (*done)(void *) = s->done;
    void *ctx = s->done_ctx;
    gang_args_free(&s->worker_args);
    free(s->slots);
    free(s);
    if (done)
        done(ctx);
}

static void handle_closed(uv_handle_t *h)
{
    sup_unref(h->data);
}

static void slot_poll_closed(uv_handle_t *h)
{
    wslot *w = h->data;
    sup_unref(w->sup);
}

/* Sends the len bytes of w->sup->buf as one packet; 0 or why not (channel full, gone). */
static int send_buf(wslot *w, size_t len)
{
    if (w->fd < 0)
        return GANG_ECLOSED;
    ssize_t n = send(w->fd, w->sup->buf, len, MSG_NOSIGNAL | MSG_DONTWAIT);
    return n == (ssize_t)len ? 0 : gang_err_from_errno(errno);
}

/* Sends control message pkt to w's worker. */
static int send_pkt(wslot *w, const gang_wctl *pkt)
{
    size_t len = 0;
    int rc = gang_wctl_encode(pkt, w->sup->buf, sizeof(w->sup->buf), &len);
    return rc != 0 ? rc : send_buf(w, len);
}

static void report_failure(wslot *w, int32_t rank, int32_t code, const char *reason)
{
    gang_sup *s = w->sup;
    if (w->failure_reported || s->gen == 0 || w->gen != s->gen || s->shutting_down)
        return;
    w->failure_reported = 1;
    w->state = GANG_RANK_FAILED;
    gang_warn("supervisor: %s", reason);
    if (s->cb.on_failure)
        s->cb.on_failure(s->cb.ctx, s->gen, rank, code, reason);
}

/* Fires on_idle once every slot is alive, connected and outside any generation. */
static void check_idle(gang_sup *s)
{
    if (s->idle_notified || s->shutting_down || !gang_sup_is_idle(s))
        return;
    s->idle_notified = 1;
    if (s->cb.on_idle)
        s->cb.on_idle(s->cb.ctx);
}

static void close_conn(wslot *w)
{
    if (w->poll_open) {
        uv_poll_stop(&w->poll);
        w->poll_open = 0;
        uv_close((uv_handle_t *)&w->poll, slot_poll_closed);
    }
    if (w->fd >= 0) {
        close(w->fd);
        w->fd = -1;
    }
    w->hello = 0;
}

static void on_worker_packet(wslot *w, const gang_wctl *pkt)
{
    gang_sup *s = w->sup;
    switch (pkt->type) {
    case GANG_WCTL_HEARTBEAT:
        w->state = pkt->state;
        w->last_hb_ms = gang_now_ms();
        return;
    case GANG_WCTL_GPU:
        if (pkt->blob_len == sizeof(w->gpu)) {
            memcpy(&w->gpu, pkt->blob, sizeof(w->gpu));
            w->gpu.uuid[sizeof(w->gpu.uuid) - 1] = w->gpu.name[sizeof(w->gpu.name) - 1] = '\0';
            w->gpu.bus_id[sizeof(w->gpu.bus_id) - 1] = w->gpu.fault[sizeof(w->gpu.fault) - 1] =
                '\0';
            w->has_gpu = 1;
        }
        return;
    case GANG_WCTL_MOE:
        /* Bounded before anything indexes by them: a worker is another process. */
        if (pkt->blob_len == sizeof(w->moe)) {
            memcpy(&w->moe, pkt->blob, sizeof(w->moe));
            w->has_moe = w->moe.n_experts <= GANG_MOE_MAX_EXPERTS && w->moe.ep >= 1 &&
                         w->moe.ep_rank < w->moe.ep;
        }
        return;
    case GANG_WCTL_BLOB:
        if (pkt->generation == s->gen && s->cb.on_blob)
            s->cb.on_blob(s->cb.ctx, pkt->generation, pkt->blob, pkt->blob_len);
        return;
    case GANG_WCTL_READY:
        if (pkt->generation != s->gen || w->gen != s->gen)
            return;
        w->ready = 1;
        w->state = GANG_RANK_READY;
        if (pkt->blob_len == sizeof(w->kv)) {
            memcpy(&w->kv, pkt->blob, sizeof(w->kv));
            w->has_kv = 1;
        }
        if (gang_sup_all_ready(s, s->gen) && s->cb.on_all_ready)
            s->cb.on_all_ready(s->cb.ctx, s->gen);
        return;
    case GANG_WCTL_KV: /* rank 0's KV use, for /metrics */
        if (pkt->generation == s->gen && pkt->blob_len == sizeof(w->kv)) {
            memcpy(&w->kv, pkt->blob, sizeof(w->kv));
            w->has_kv = 1;
        }
        return;
    case GANG_WCTL_ERROR: {
        memcpy(w->last_error, pkt->reason, sizeof(w->last_error));
        w->last_error[sizeof(w->last_error) - 1] = '\0';
        if (pkt->generation != s->gen)
            return;
        char why[GANG_REASON_MAX];
        snprintf(why, sizeof(why), "rank %d (node %u local %u): %.200s", global_rank(s, w), s->node,
                 w->local_rank, pkt->reason);
        report_failure(w, (int32_t)pkt->rank, pkt->code ? pkt->code : GANG_EPEER, why);
        return;
    }
    case GANG_WCTL_ABORTED:
        if (pkt->generation < w->gen)
            return;
        w->gen = 0;
        w->ready = 0;
        w->abort_pending = 0;
        w->state = GANG_RANK_IDLE;
        check_idle(s);
        return;
    default:
        gang_warn("supervisor: unexpected control message %u from local rank %u", pkt->type,
                  w->local_rank);
    }
}

/* A request message from a worker: rank 0's tokens and ends, for the agent. The codec
 * NUL-terminated the strings. */
static void on_worker_req(wslot *w, const gang_req_msg *r)
{
    gang_sup *s = w->sup;
    if (w->local_rank != 0)
        return;
    if (r->kind == GANG_REQ_TOKEN && s->cb.on_token)
        s->cb.on_token(s->cb.ctx, r);
    else if (r->kind == GANG_REQ_DONE && s->cb.on_done)
        s->cb.on_done(s->cb.ctx, r);
    else if (r->kind != GANG_REQ_TOKEN && r->kind != GANG_REQ_DONE)
        gang_warn("supervisor: unexpected request message %u from local rank %u", r->kind,
                  w->local_rank);
}

static void on_conn_readable(uv_poll_t *h, int status, int events)
{
    wslot *w = h->data;
    gang_sup *s = w->sup;
    (void)events;
    /* An error status (a worker that exits with our messages unread makes the socket
     * report a reset) still leaves what it sent before readable: drain, then close. */
    for (;;) {
        ssize_t n = recv(w->fd, s->buf, sizeof(s->buf), MSG_DONTWAIT);
        if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
            if (status < 0)
                close_conn(w);
            return;
        }
        int type = n > 0 && (size_t)n < sizeof(s->buf)
                       ? gang_wctl_decode(s->buf, (size_t)n, &s->pkt, &s->req)
                       : GANG_EPROTO;
        if (type < 0) {
            /* EOF or a malformed packet: the process exit (if any) is reported by exit_cb. */
            if (n > 0)
                gang_warn("supervisor: malformed packet of %zd bytes from local rank %u", n,
                          w->local_rank);
            close_conn(w);
            return;
        }
        if (gang_req_kind_valid((uint32_t)type))
            on_worker_req(w, &s->req);
        else
            on_worker_packet(w, &s->pkt);
        if (w->fd < 0)
            return;
    }
}

/* A new worker connected: its first packet says which local rank it is. */
static void on_listen_readable(uv_poll_t *h, int status, int events)
{
    gang_sup *s = h->data;
    (void)events;
    if (status < 0)
        return;
    for (;;) {
        int fd = accept4(s->listen_fd, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0)
            return;
        struct timeval tv = {.tv_sec = 1};
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
        gang_wctl *pkt = &s->pkt;
        ssize_t n = recv(fd, s->buf, sizeof(s->buf), 0);
        struct ucred cred;
        socklen_t cl = sizeof(cred);
        int ok = n > 0 && (size_t)n < sizeof(s->buf) &&
                 gang_wctl_decode(s->buf, (size_t)n, pkt, &s->req) == GANG_WCTL_HELLO &&
                 pkt->local_rank < s->n && getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &cl) == 0;
        wslot *w = ok ? &s->slots[pkt->local_rank] : NULL;
        /* Only the process we spawned for that slot may take it. */
        if (!ok || !w->proc_alive || cred.pid != w->pid || w->fd >= 0) {
            gang_warn("supervisor: refused a control connection (bad HELLO or unknown pid)");
            close(fd);
            continue;
        }
        w->fd = fd;
        w->hello = 1;
        w->state = GANG_RANK_IDLE;
        w->last_hb_ms = gang_now_ms();
        uv_poll_init(s->loop, &w->poll, fd);
        w->poll.data = w;
        w->poll_open = 1;
        s->open_handles++;
        uv_poll_start(&w->poll, UV_READABLE, on_conn_readable);
        gang_info("supervisor: worker local rank %u (pid %d) connected", w->local_rank, w->pid);
        check_idle(s);
    }
}

static void on_proc_closed(uv_handle_t *h)
{
    wslot *w = h->data;
    gang_sup *s = w->sup;
    if (!s->shutting_down && w->spawn_failures < 3) {
        spawn_worker(w);
    } else if (s->shutting_down && !s->tick_closed) {
        int alive = 0;
        for (uint32_t i = 0; i < s->n; i++)
            alive += s->slots[i].proc_alive;
        if (!alive) {
            s->tick_closed = 1;
            uv_close((uv_handle_t *)&s->tick, handle_closed);
        }
    }
    sup_unref(s);
}

static void on_exit_cb(uv_process_t *proc, int64_t status, int sig)
{
    wslot *w = proc->data;
    gang_sup *s = w->sup;
    /* What the worker said last (an ERROR with the reason it exits) may still sit in the
     * channel, or its connection may not even be accepted yet: SIGCHLD can be handled
     * before either becomes readable. Take both now, while the slot still counts as
     * alive (accepting checks that). */
    if (w->fd < 0 && !s->shutting_down)
        on_listen_readable(&s->listen_poll, 0, UV_READABLE);
    if (w->fd >= 0 && w->poll_open)
        on_conn_readable(&w->poll, 0, UV_READABLE);
    w->proc_alive = 0;
    char why[GANG_REASON_MAX];
    if (sig)
        snprintf(why, sizeof(why),
                 "worker rank %d (node %u local %u, pid %d) killed by signal "
                 "%d (%s)",
                 global_rank(s, w), s->node, w->local_rank, w->pid, sig, strsignal(sig));
    else
        snprintf(why, sizeof(why),
                 "worker rank %d (node %u local %u, pid %d) exited with "
                 "status %lld",
                 global_rank(s, w), s->node, w->local_rank, w->pid, (long long)status);
    report_failure(w, global_rank(s, w), GANG_EPEER, why);
    if (!sig && (status == GANG_EXIT_USAGE || status == GANG_EXIT_MODEL) && !s->shutting_down &&
        s->cb.on_fatal) {
        char fatal[GANG_REASON_MAX];
        snprintf(fatal, sizeof(fatal), "%s (not retried): %s: %s",
                 status == GANG_EXIT_MODEL ? "the model cannot be loaded"
                                           : "the configuration cannot work",
                 w->last_error[0] ? w->last_error : "see its log", why);
        s->cb.on_fatal(s->cb.ctx, (int)status, fatal);
    }
    if (!w->failure_reported || s->shutting_down)
        gang_info("supervisor: %s", why);
    close_conn(w);
    w->pid = 0;
    w->gen = 0;
    w->ready = 0;
    w->abort_pending = 0;
    w->state = GANG_RANK_DOWN;
    s->idle_notified = 0;
    uv_close((uv_handle_t *)proc, on_proc_closed);
}

/* An argv under construction: pointers into one flat store. */
typedef struct argv_builder {
    char **argv;
    size_t argc;
    char *store;
    size_t used, cap;
} argv_builder;

/* Appends one formatted argument; GANG_ERANGE when the store or argv is full. */
static int push_arg(argv_builder *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int push_arg(argv_builder *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(b->store + b->used, b->cap - b->used, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= b->cap - b->used || b->argc + 2 >= ARGV_MAX)
        return GANG_ERANGE;
    b->argv[b->argc++] = b->store + b->used;
    b->argv[b->argc] = NULL;
    b->used += (size_t)n + 1;
    return 0;
}

/*
 * The worker's command line: the binary, "worker", its own --agent-socket and
 * --local-rank, then the registry's forwarded flags (gang_params_forward_args), so the
 * worker sees the parameters the agent sees.
 */
static int build_argv(gang_sup *s, wslot *w, char **argv, char *store, size_t cap)
{
    argv_builder b = {.argv = argv, .store = store, .cap = cap};
    int rc = push_arg(&b, "%s", s->exe);
    if (rc == 0)
        rc = push_arg(&b, "worker");
    if (rc == 0)
        rc = push_arg(&b, "--agent-socket=%s", s->path);
    if (rc == 0)
        rc = push_arg(&b, "--local-rank=%u", w->local_rank);
    for (int i = 0; i < s->worker_args.argc && rc == 0; i++)
        rc = push_arg(&b, "%s", s->worker_args.argv[i]);
    return rc;
}

static void spawn_worker(wslot *w)
{
    gang_sup *s = w->sup;
    char *argv[ARGV_MAX];
    char store[16384];
    if (build_argv(s, w, argv, store, sizeof(store)) != 0) {
        gang_error("supervisor: worker command line too long");
        return;
    }
    uv_process_options_t o;
    memset(&o, 0, sizeof(o));
    o.file = s->exe;
    o.args = argv;
    o.exit_cb = on_exit_cb;
    uv_stdio_container_t stdio[3] = {{.flags = UV_IGNORE},
                                     {.flags = UV_INHERIT_FD, .data.fd = 1},
                                     {.flags = UV_INHERIT_FD, .data.fd = 2}};
    o.stdio = stdio;
    o.stdio_count = 3;
    w->proc.data = w;
    int rc = uv_spawn(s->loop, &w->proc, &o);
    if (rc != 0) {
        gang_error("supervisor: cannot spawn worker %u: %s", w->local_rank, uv_strerror(rc));
        /* A failed uv_spawn still needs its handle closed; the close callback retries. */
        w->spawn_failures++;
        s->open_handles++;
        w->proc_alive = 0;
        uv_close((uv_handle_t *)&w->proc, on_proc_closed);
        return;
    }
    s->open_handles++;
    w->spawn_failures = 0;
    w->proc_alive = 1;
    w->pid = w->proc.pid;
    w->state = GANG_RANK_IDLE;
    w->last_hb_ms = gang_now_ms();
    w->failure_reported = 0;
    if (w->restarts++ > 0)
        gang_info("supervisor: respawned worker local rank %u as pid %d", w->local_rank, w->pid);
}

/* Deadlines: heartbeat silence, abort confirmation, shutdown. */
static void on_tick(uv_timer_t *t)
{
    gang_sup *s = t->data;
    uint64_t now = gang_now_ms();
    for (uint32_t i = 0; i < s->n; i++) {
        wslot *w = &s->slots[i];
        if (!w->proc_alive)
            continue;
        if (s->shutting_down) {
            if (now > s->shutdown_deadline_ms)
                uv_process_kill(&w->proc, SIGKILL);
            continue;
        }
        uint64_t silent = now - w->last_hb_ms;
        /* A worker that has not said HELLO yet is starting (exec, dynamic loading of
         * CUDA/NCCL/MPI on a busy machine): it gets a start-up allowance of its own. */
        uint64_t allowed = s->heartbeat_timeout_ms;
        if (!w->hello && allowed < SUP_HELLO_TIMEOUT_MS)
            allowed = SUP_HELLO_TIMEOUT_MS;
        if (silent > allowed) {
            char why[GANG_REASON_MAX];
            snprintf(why, sizeof(why),
                     "worker rank %d (node %u local %u, pid %d) silent for "
                     "%llu ms: hung or stopped",
                     global_rank(s, w), s->node, w->local_rank, w->pid, (unsigned long long)silent);
            if (w->gen != 0 && w->gen == s->gen) {
                report_failure(w, global_rank(s, w), GANG_ETIMEDOUT, why);
            } else if (!w->abort_pending) {
                /* Outside a generation nobody will abort it: replace it now. */
                gang_warn("supervisor: %s; killing it", why);
                uv_process_kill(&w->proc, SIGKILL);
            }
        }
        if (w->abort_pending && now > w->abort_deadline_ms) {
            gang_warn("supervisor: worker local rank %u (pid %d) did not confirm the abort "
                      "within %llu ms: SIGKILL",
                      w->local_rank, w->pid, (unsigned long long)s->abort_timeout_ms);
            w->abort_pending = 0;
            uv_process_kill(&w->proc, SIGKILL);
        }
    }
}

/* 1 when path is a socket nobody listens on (connect refused) or does not exist. */
static int sup_sock_dead(const char *path)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    int fd, dead;

    if (access(path, F_OK) != 0)
        return errno == ENOENT;
    if (strlen(path) >= sizeof(sa.sun_path))
        return 0;
    gang_strlcpy(sa.sun_path, path, sizeof(sa.sun_path));
    fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0)
        return 0;
    dead = connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0 && errno == ECONNREFUSED;
    close(fd);
    return dead;
}

int gang_sup_sweep_stale(const char *dir, uint64_t min_age_s)
{
    char sub[512], sock[600];
    struct dirent *e;
    struct stat st;
    int removed = 0;
    time_t now = time(NULL);
    DIR *d = opendir(dir);

    if (d == NULL)
        return 0;
    while ((e = readdir(d)) != NULL) {
        if (strncmp(e->d_name, "ganglion-agent-", 15) != 0)
            continue;
        snprintf(sub, sizeof(sub), "%s/%s", dir, e->d_name);
        if (lstat(sub, &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != geteuid() ||
            now - st.st_mtime < (time_t)min_age_s)
            continue;
        snprintf(sock, sizeof(sock), "%s/ctl.sock", sub);
        if (!sup_sock_dead(sock))
            continue;
        unlink(sock);
        if (rmdir(sub) == 0)
            removed++;
    }
    closedir(d);
    if (removed > 0)
        gang_info("supervisor: removed %d control directories of dead agents from %s", removed,
                  dir);
    return removed;
}

int gang_sup_start(void *uv_loop, const gang_sup_config *cfg, const gang_sup_callbacks *cb,
                   gang_sup **out)
{
    int rc = GANG_ENOMEM;
    gang_sup *s = calloc(1, sizeof(*s));
    if (s == NULL)
        return GANG_ENOMEM;
    s->loop = uv_loop;
    s->node = cfg->node_index;
    s->n = cfg->nproc_per_node;
    s->heartbeat_timeout_ms = cfg->heartbeat_timeout_ms;
    s->abort_timeout_ms = cfg->abort_timeout_ms;
    s->cb = *cb;
    s->listen_fd = -1;
    gang_strlcpy(s->exe, cfg->exe, sizeof(s->exe));
    s->slots = calloc(s->n, sizeof(*s->slots));
    if (s->slots == NULL || gang_args_copy(&cfg->worker_args, &s->worker_args) != 0)
        goto out_free;
    /* An agent killed with SIGKILL cannot remove its directory: its successors do. */
    (void)gang_sup_sweep_stale("/tmp", GANG_SUP_STALE_AGE_S);
    /* A private 0700 directory keeps other users off the control socket. */
    snprintf(s->dir, sizeof(s->dir), "/tmp/ganglion-agent-XXXXXX");
    if (mkdtemp(s->dir) == NULL) {
        rc = gang_err_from_errno(errno);
        goto out_free;
    }
    snprintf(s->path, sizeof(s->path), "%s/ctl.sock", s->dir);
    s->listen_fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    gang_strlcpy(sa.sun_path, s->path, sizeof(sa.sun_path));
    if (s->listen_fd < 0 || bind(s->listen_fd, (struct sockaddr *)&sa, sizeof(sa)) != 0 ||
        listen(s->listen_fd, 64) != 0) {
        rc = gang_err_from_errno(errno);
        goto out_socket;
    }
    uv_poll_init(s->loop, &s->listen_poll, s->listen_fd);
    uv_timer_init(s->loop, &s->tick);
    s->listen_poll.data = s;
    s->tick.data = s;
    s->open_handles = 2;
    uv_poll_start(&s->listen_poll, UV_READABLE, on_listen_readable);
    uint64_t tick = cfg->heartbeat_interval_ms / 4;
    tick = tick < 5 ? 5 : (tick > 100 ? 100 : tick);
    uv_timer_start(&s->tick, on_tick, tick, tick);
    for (uint32_t i = 0; i < s->n; i++) {
        s->slots[i].sup = s;
        s->slots[i].local_rank = i;
        s->slots[i].fd = -1;
        spawn_worker(&s->slots[i]);
    }
    *out = s;
    return 0;
out_socket:
    if (s->listen_fd >= 0)
        close(s->listen_fd);
    rmdir(s->dir);
out_free:
    gang_args_free(&s->worker_args);
    free(s->slots);
    free(s);
    return rc;
}

void gang_sup_request_blob(gang_sup *s, uint64_t gen)
{
    s->gen = gen;
    gang_wctl *pkt = &s->pkt;
    memset(pkt, 0, sizeof(*pkt));
    pkt->type = GANG_WCTL_BLOB_REQUEST;
    pkt->generation = gen;
    if (send_pkt(&s->slots[0], pkt) != 0 && s->cb.on_failure)
        s->cb.on_failure(s->cb.ctx, gen, global_rank(s, &s->slots[0]), GANG_EPEER,
                         "local rank 0 is not connected: cannot produce the bootstrap blob");
}

void gang_sup_start_gen(gang_sup *s, uint64_t gen, uint32_t world, const uint8_t *blob,
                        uint32_t len)
{
    s->gen = gen;
    s->idle_notified = 0;
    gang_wctl *pkt = &s->pkt;
    for (uint32_t i = 0; i < s->n; i++) {
        wslot *w = &s->slots[i];
        memset(pkt, 0, sizeof(*pkt));
        pkt->type = GANG_WCTL_START;
        pkt->generation = gen;
        pkt->rank = (uint32_t)global_rank(s, w);
        pkt->world_size = world;
        pkt->blob_len = len > GANG_BLOB_MAX ? GANG_BLOB_MAX : len;
        memcpy(pkt->blob, blob, pkt->blob_len);
        w->gen = gen;
        w->ready = 0;
        w->failure_reported = 0;
        w->state = GANG_RANK_STARTING;
        if (send_pkt(w, pkt) != 0) {
            char why[GANG_REASON_MAX];
            snprintf(why, sizeof(why), "worker rank %d is not connected at START",
                     global_rank(s, w));
            report_failure(w, global_rank(s, w), GANG_EPEER, why);
        }
    }
}

void gang_sup_abort(gang_sup *s, uint64_t gen)
{
    uint64_t now = gang_now_ms();
    s->idle_notified = 0;
    gang_wctl *pkt = &s->pkt;
    for (uint32_t i = 0; i < s->n; i++) {
        wslot *w = &s->slots[i];
        w->ready = 0;
        if (w->gen == 0 || w->abort_pending)
            continue;
        memset(pkt, 0, sizeof(*pkt));
        pkt->type = GANG_WCTL_ABORT;
        pkt->generation = gen > w->gen ? gen : w->gen;
        w->state = GANG_RANK_ABORTING;
        w->abort_pending = 1;
        w->abort_deadline_ms = now + s->abort_timeout_ms;
        if (send_pkt(w, pkt) != 0 && w->proc_alive) {
            /* No channel to ask it: it cannot confirm, so replace it. */
            w->abort_pending = 0;
            uv_process_kill(&w->proc, SIGKILL);
        }
    }
    s->gen = 0;
    check_idle(s);
}

int gang_sup_is_idle(const gang_sup *s)
{
    for (uint32_t i = 0; i < s->n; i++) {
        const wslot *w = &s->slots[i];
        if (!w->proc_alive || !w->hello || w->gen != 0 || w->abort_pending)
            return 0;
    }
    return 1;
}

int gang_sup_all_ready(const gang_sup *s, uint64_t gen)
{
    for (uint32_t i = 0; i < s->n; i++) {
        if (!s->slots[i].ready || s->slots[i].gen != gen)
            return 0;
    }
    return gen != 0;
}

uint32_t gang_sup_nranks(const gang_sup *s)
{
    return s->n;
}

void gang_sup_rank_info(const gang_sup *s, uint32_t local_rank, gang_sup_rank *out)
{
    const wslot *w = &s->slots[local_rank];
    out->pid = w->proc_alive ? w->pid : 0;
    out->state =
        (uint8_t)(w->proc_alive ? (w->hello ? w->state : GANG_RANK_STARTING) : GANG_RANK_DOWN);
    if (w->proc_alive && w->hello && w->state == GANG_RANK_IDLE && w->gen == 0)
        out->state = GANG_RANK_IDLE;
    out->heartbeat_age_ms =
        w->proc_alive ? gang_heartbeat_age(gang_now_ms() - w->last_hb_ms) : GANG_HEARTBEAT_NEVER;
    out->restarts = w->restarts ? w->restarts - 1 : 0;
}

int gang_sup_gpu(const gang_sup *s, uint32_t local_rank, struct gang_gpu_sample *out)
{
    const wslot *w = &s->slots[local_rank];
    if (!w->has_gpu)
        return 0;
    *out = w->gpu;
    return 1;
}

int gang_sup_moe(const gang_sup *s, uint32_t local_rank, gang_moe_load_sample *out)
{
    const wslot *w = &s->slots[local_rank];
    if (!w->has_moe)
        return 0;
    *out = w->moe;
    return 1;
}

int gang_sup_kv(const gang_sup *s, uint32_t local_rank, gang_engine_kv *out)
{
    const wslot *w = &s->slots[local_rank];
    if (!w->has_kv)
        return 0;
    *out = w->kv;
    return 1;
}

void gang_sup_shutdown(gang_sup *s, void (*done)(void *ctx), void *ctx)
{
    s->shutting_down = 1;
    s->done = done;
    s->done_ctx = ctx;
    s->shutdown_deadline_ms = gang_now_ms() + s->abort_timeout_ms;
    gang_wctl *pkt = &s->pkt;
    for (uint32_t i = 0; i < s->n; i++) {
        wslot *w = &s->slots[i];
        memset(pkt, 0, sizeof(*pkt));
        pkt->type = GANG_WCTL_SHUTDOWN;
        if (send_pkt(w, pkt) != 0 && w->proc_alive)
            uv_process_kill(&w->proc, SIGTERM);
    }
    uv_poll_stop(&s->listen_poll);
    uv_close((uv_handle_t *)&s->listen_poll, handle_closed);
    int alive = 0;
    for (uint32_t i = 0; i < s->n; i++)
        alive += s->slots[i].proc_alive;
    if (!alive && !s->tick_closed) {
        s->tick_closed = 1;
        uv_close((uv_handle_t *)&s->tick, handle_closed);
    }
    /* The tick keeps enforcing the shutdown deadline; it closes once the workers are gone. */
}

int gang_sup_submit(gang_sup *s, const gang_req_msg *r)
{
    size_t len = 0;
    if (s == NULL || s->n == 0 || s->slots[0].fd < 0)
        return GANG_EPEER;
    int rc = gang_wctl_encode_req(r, s->buf, sizeof(s->buf), &len);
    if (rc != 0)
        return rc;
    return send_buf(&s->slots[0], len) == 0 ? 0 : GANG_EPEER;
}
