/*
 * The worker's data plane for one generation. This is a PLACEHOLDER for the real
 * communicators of parallel/ (NCCL, socket, MPI): it moves no tensors, but it fails the
 * way a real data plane fails (a peer closes, a peer hangs, a result is wrong) and it
 * aborts the way a real one must (promptly, in place, from another thread), so that the
 * agent, the coordinator and their tests can be built against it today.
 *
 * The placeholder is a TCP star around global rank 0:
 *
 *   forming (deadline min(start timeout, 10 s)):
 *     rank 0 listens (the socket was opened for BLOB_REQUEST, the blob is "host:port");
 *     every rank r > 0 connects and sends HELLO(G, r, world);
 *     rank 0 keeps a connection only if G is the current generation, r is in [1, world),
 *       no other connection claimed r and world agrees; any other is closed;
 *     once all world - 1 ranks are in, rank 0 sends WELCOME(G, world) to each of them;
 *     a rank is READY when it has WELCOME (rank 0: when it has sent them all).
 *   serving (one step every step interval, a placeholder all-reduce):
 *     rank r > 0 sends STEP(G, step, value = r + 1 + step) to rank 0;
 *     rank 0 waits for every STEP (deadline: the heartbeat timeout, counted from the end
 *       of the previous step), adds its own value 1 + step, and sends SUM(G, step, sum)
 *       to every rank;
 *     rank r > 0 waits for SUM (deadline: heartbeat timeout + step interval, counted from
 *       its STEP) and checks sum == world(world+1)/2 + world * step, the all-reduce of
 *       the values above.
 *
 * The deadlines are staggered on purpose. When rank r hangs, rank 0 gives up on it about
 * two step intervals before the other peers give up on rank 0 (they start counting a step
 * interval later and wait a step interval longer), so the agent hears the true cause,
 * "rank r silent", before the echoes, "rank 0 silent". Rank 0 waits at least two step
 * intervals, so that a step interval longer than the heartbeat timeout cannot make a
 * healthy gang look silent. Every wait of the thread also polls the abort pipe, which is
 * how gang__wstep_stop() gets the thread out of any wait within milliseconds.
 *
 * On a failure the thread records the first cause (later ones are its consequences),
 * reports it once as a FAILED event, and returns. It does not close its sockets: closing
 * them would make the other ranks report "rank 0 closed its connection" at once, racing
 * the report of the real cause to the agent. Sockets are closed by gang__wstep_stop().
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "worker.h"

#define WSTEP_START_CAP_MS 10000    /* forming never waits longer, whatever start timeout */
#define WSTEP_PENDING_MAX 64        /* connections rank 0 holds before their HELLO */
#define WSTEP_CONNECT_RETRY_MS 20   /* pause between connection attempts to rank 0 */
#define WSTEP_MAX_WORLD (4096 * 64) /* nnodes * nproc_per_node at their registry maxima */

_Static_assert(sizeof(gang__wevent) <= PIPE_BUF, "events must be written atomically");

/* One data connection and the frame that is arriving on it. */
typedef struct wconn {
    int fd;                         /* -1 when closed */
    size_t len;                     /* bytes of buf filled */
    uint8_t buf[GANG__WFRAME_SIZE]; /* the frame being received */
    uint64_t last_rx_ms;            /* when bytes last arrived (or the connection began) */
} wconn;

struct gang__wstep {
    gang__wstep_config cfg; /* own copy; start timeout already capped */
    pthread_t thread;
    int thread_started; /* the thread must be joined */
    int abort_rd;       /* becomes readable, and stays so, once stop() is called */
    int abort_wr;
    wconn *conns; /* rank 0: indexed by global rank (0 unused); others: [0] = rank 0 */
    size_t nconns;
    wconn pending[WSTEP_PENDING_MAX]; /* rank 0 while forming: accepted, HELLO not yet in */
    size_t npending;
    struct pollfd *pfds; /* poll scratch of the rank-0 loops */
    uint32_t *pidx;      /* rank or pending index behind each pfds entry */
    uint8_t *got;        /* rank 0: which ranks' STEP arrived in this step */
    size_t npfds;        /* capacity of pfds, pidx */
    int fail_code;       /* first failure, 0 while none */
};

/* -------------------------------------------------------------------------------------
 * Frames
 * ------------------------------------------------------------------------------------- */

static void put_u32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void put_u64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t get_u32(const uint8_t *p)
{
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

static uint64_t get_u64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

void gang__wframe_encode(const gang__wframe *f, uint8_t out[GANG__WFRAME_SIZE])
{
    put_u32(out + 0, GANG__WFRAME_MAGIC);
    put_u32(out + 4, f->kind);
    put_u64(out + 8, f->generation);
    put_u32(out + 16, f->rank);
    put_u32(out + 20, f->world);
    put_u64(out + 24, f->step);
    put_u64(out + 32, f->value);
}

int gang__wframe_decode(const uint8_t in[GANG__WFRAME_SIZE], gang__wframe *f)
{
    if (get_u32(in) != GANG__WFRAME_MAGIC)
        return GANG_EPROTO;
    f->kind = get_u32(in + 4);
    if (f->kind < GANG__WF_HELLO || f->kind > GANG__WF_SUM)
        return GANG_EPROTO;
    f->generation = get_u64(in + 8);
    f->rank = get_u32(in + 16);
    f->world = get_u32(in + 20);
    f->step = get_u64(in + 24);
    f->value = get_u64(in + 32);
    return 0;
}

/* -------------------------------------------------------------------------------------
 * Failure reports and waits
 * ------------------------------------------------------------------------------------- */

/* Writes one event for the main thread; a lost event is logged (the pipe cannot fill). */
static void wstep_report(gang__wstep *s, const gang__wevent *ev)
{
    for (;;) {
        ssize_t n = write(s->cfg.event_fd, ev, sizeof(*ev));
        if (n == (ssize_t)sizeof(*ev))
            return;
        if (n < 0 && errno == EINTR)
            continue;
        gang_error("data plane: could not report an event to the main thread: %s",
                   n < 0 ? strerror(errno) : "short write");
        return;
    }
}

/*
 * Records a failure of the data plane and returns code, so that call sites read
 * `return wstep_fail(...)`. Only the first failure is reported to the main thread: the
 * ones after it are its consequences. GANG_EABORTED is not a failure and is passed
 * through silently.
 */
static int wstep_fail(gang__wstep *s, int code, uint32_t rank, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int wstep_fail(gang__wstep *s, int code, uint32_t rank, const char *fmt, ...)
{
    if (code == GANG_EABORTED || s->fail_code != 0)
        return code;
    s->fail_code = code;
    gang__wevent ev;
    memset(&ev, 0, sizeof(ev));
    ev.type = GANG__WEV_FAILED;
    ev.code = code;
    ev.generation = s->cfg.generation;
    ev.rank = (int32_t)rank;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ev.reason, sizeof(ev.reason), fmt, ap);
    va_end(ap);
    gang_error("data plane (placeholder) failed: %s (%s)", ev.reason, gang_err_name(code));
    wstep_report(s, &ev);
    return code;
}

/* Milliseconds from now until deadline as a poll() timeout (0 when passed). */
static int ms_until(uint64_t deadline)
{
    uint64_t now = gang_now_ms();
    if (now >= deadline)
        return 0;
    return deadline - now > INT_MAX ? INT_MAX : (int)(deadline - now);
}

/*
 * Waits until fd reports one of events, the deadline passes or the thread is aborted; fd
 * -1 just sleeps until the deadline. Returns 0 when fd is ready, GANG_ETIMEDOUT at the
 * deadline, GANG_EABORTED once stop() was called (checked first, so an abort wins over
 * a ready socket), or a poll() error.
 */
static int wstep_wait(gang__wstep *s, int fd, short events, uint64_t deadline)
{
    for (;;) {
        struct pollfd pfd[2] = {{.fd = s->abort_rd, .events = POLLIN},
                                {.fd = fd, .events = events}};
        int timeout = ms_until(deadline);
        int n = poll(pfd, 2, timeout);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return gang_err_from_errno(errno);
        }
        if (pfd[0].revents)
            return GANG_EABORTED;
        if (fd >= 0 && pfd[1].revents)
            return 0;
        if (timeout == 0)
            return GANG_ETIMEDOUT;
    }
}

/* Whether an errno of send/recv means the other end is gone rather than a local fault. */
static int errno_is_closed(int e)
{
    return e == ECONNRESET || e == EPIPE || e == ENOTCONN || e == ECONNABORTED;
}

/*
 * Reads what has arrived on c without blocking, never past the end of one frame. Returns
 * 1 once c->buf holds a whole frame (the caller consumes it by setting c->len = 0), 0
 * when more bytes are needed, GANG_ECLOSED when the peer closed or reset the connection,
 * or another system error.
 */
static int wconn_read(wconn *c)
{
    while (c->len < GANG__WFRAME_SIZE) {
        ssize_t n = recv(c->fd, c->buf + c->len, GANG__WFRAME_SIZE - c->len, MSG_DONTWAIT);
        if (n > 0) {
            c->len += (size_t)n;
            c->last_rx_ms = gang_now_ms();
            continue;
        }
        if (n == 0)
            return GANG_ECLOSED;
        if (errno == EINTR)
            continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK)
            return 0;
        return errno_is_closed(errno) ? GANG_ECLOSED : gang_err_from_errno(errno);
    }
    return 1;
}

/*
 * Sends one frame on fd before the deadline. Returns 0, GANG_ECLOSED when the other end
 * is gone, GANG_ETIMEDOUT when it stopped reading, GANG_EABORTED, or a system error.
 */
static int wstep_send(gang__wstep *s, int fd, const gang__wframe *f, uint64_t deadline)
{
    uint8_t buf[GANG__WFRAME_SIZE];
    gang__wframe_encode(f, buf);
    size_t off = 0;
    while (off < sizeof(buf)) {
        ssize_t n = send(fd, buf + off, sizeof(buf) - off, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n >= 0) {
            off += (size_t)n;
            continue;
        }
        if (errno == EINTR)
            continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK)
            return errno_is_closed(errno) ? GANG_ECLOSED : gang_err_from_errno(errno);
        int rc = wstep_wait(s, fd, POLLOUT, deadline);
        if (rc != 0)
            return rc;
    }
    return 0;
}

/*
 * Receives one frame on c before the deadline. Returns 0 with *f filled, GANG_ECLOSED,
 * GANG_ETIMEDOUT, GANG_EABORTED, GANG_EPROTO for a frame that does not decode, or a
 * system error.
 */
static int wstep_recv(gang__wstep *s, wconn *c, gang__wframe *f, uint64_t deadline)
{
    for (;;) {
        int rc = wconn_read(c);
        if (rc < 0)
            return rc;
        if (rc == 1) {
            c->len = 0;
            return gang__wframe_decode(c->buf, f);
        }
        rc = wstep_wait(s, c->fd, POLLIN, deadline);
        if (rc != 0)
            return rc;
    }
}

static void set_nodelay(int fd)
{
    int one = 1;
    /* Frames are tiny and every step waits for them: Nagle would only add latency. */
    if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) != 0)
        gang_debug("data plane: TCP_NODELAY: %s", strerror(errno));
}

/* -------------------------------------------------------------------------------------
 * Rank 0
 * ------------------------------------------------------------------------------------- */

/*
 * Judges the HELLO that arrived on pending connection c. Returns the rank it may serve,
 * or 0 (never a peer rank) after logging why the connection must be closed.
 */
static uint32_t root_check_hello(gang__wstep *s, const wconn *c)
{
    gang__wframe f;
    if (gang__wframe_decode(c->buf, &f) != 0 || f.kind != GANG__WF_HELLO) {
        gang_warn("data plane: closing a connection whose first frame is not a HELLO");
        return 0;
    }
    if (f.generation != s->cfg.generation) {
        gang_warn("data plane: closing a connection of generation %llu (serving %llu)",
                  (unsigned long long)f.generation, (unsigned long long)s->cfg.generation);
        return 0;
    }
    if (f.rank == 0 || f.rank >= s->cfg.world) {
        gang_warn("data plane: closing a connection claiming rank %u (world %u)", f.rank,
                  s->cfg.world);
        return 0;
    }
    if (f.world != s->cfg.world) {
        gang_warn("data plane: closing rank %u's connection: it was started with world %u, "
                  "this gang has %u",
                  f.rank, f.world, s->cfg.world);
        return 0;
    }
    if (s->conns[f.rank].fd >= 0) {
        gang_warn("data plane: closing a second connection claiming rank %u", f.rank);
        return 0;
    }
    return f.rank;
}

/* Accepts every connection waiting on the listener into the pending list. */
static int root_accept(gang__wstep *s)
{
    while (s->npending < WSTEP_PENDING_MAX) {
        int fd = accept4(s->cfg.listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                return 0;
            return gang_err_from_errno(errno);
        }
        set_nodelay(fd);
        wconn *c = &s->pending[s->npending++];
        c->fd = fd;
        c->len = 0;
        c->last_rx_ms = gang_now_ms();
    }
    return 0;
}

/* Names the missing rank that has been silent longest, for a timeout report. */
static uint32_t root_first_missing(gang__wstep *s, int forming)
{
    uint32_t worst = 0;
    for (uint32_t r = 1; r < s->cfg.world; r++) {
        int missing = forming ? s->conns[r].fd < 0 : !s->got[r];
        if (missing && (worst == 0 || s->conns[r].last_rx_ms < s->conns[worst].last_rx_ms))
            worst = r;
    }
    return worst;
}

/*
 * Forms rank 0's side of the star: accepts until every rank 1..world-1 has a connection
 * with a valid HELLO, then welcomes them all. Connections that say anything else are
 * closed and the wait goes on: a stray or stale connection must not fail the gang.
 */
static int root_form(gang__wstep *s)
{
    uint64_t start = gang_now_ms();
    uint64_t deadline = start + (uint64_t)s->cfg.start_timeout_ms;
    uint32_t joined = 0, need = s->cfg.world - 1;
    for (uint32_t r = 1; r < s->cfg.world; r++)
        s->conns[r].last_rx_ms = start;

    while (joined < need) {
        size_t n = 0;
        s->pfds[n++] = (struct pollfd){.fd = s->abort_rd, .events = POLLIN};
        s->pfds[n++] = (struct pollfd){
            .fd = s->npending < WSTEP_PENDING_MAX ? s->cfg.listen_fd : -1, .events = POLLIN};
        for (size_t i = 0; i < s->npending; i++) {
            s->pidx[n] = (uint32_t)i;
            s->pfds[n++] = (struct pollfd){.fd = s->pending[i].fd, .events = POLLIN};
        }
        int timeout = ms_until(deadline);
        if (timeout == 0) {
            uint32_t r = root_first_missing(s, 1);
            return wstep_fail(s, GANG_ETIMEDOUT, r,
                              "rank 0 waited %lld ms for the gang: %u of %u ranks never "
                              "joined (rank %u is one)",
                              (long long)s->cfg.start_timeout_ms, need - joined, need, r);
        }
        if (poll(s->pfds, (nfds_t)n, timeout) < 0) {
            if (errno == EINTR)
                continue;
            return wstep_fail(s, gang_err_from_errno(errno), 0, "poll: %s", strerror(errno));
        }
        if (s->pfds[0].revents)
            return GANG_EABORTED;

        for (size_t k = 2; k < n; k++) {
            if (!s->pfds[k].revents)
                continue;
            wconn *c = &s->pending[s->pidx[k]];
            int rc = wconn_read(c);
            if (rc == 0)
                continue;
            uint32_t r = rc == 1 ? root_check_hello(s, c) : 0;
            if (r == 0) {
                close(c->fd);
            } else {
                s->conns[r] = *c;
                s->conns[r].len = 0;
                joined++;
                gang_debug("data plane: rank %u joined (%u of %u)", r, joined, need);
            }
            c->fd = -1;
        }
        size_t kept = 0;
        for (size_t i = 0; i < s->npending; i++) {
            if (s->pending[i].fd >= 0)
                s->pending[kept++] = s->pending[i];
        }
        s->npending = kept;

        if (s->pfds[1].revents) {
            int rc = root_accept(s);
            if (rc != 0)
                return wstep_fail(s, rc, 0, "rank 0 cannot accept connections: %s",
                                  gang_strerror(rc));
        }
    }

    /* Connections still without a HELLO are strays: every rank is in. */
    for (size_t i = 0; i < s->npending; i++)
        close(s->pending[i].fd);
    s->npending = 0;

    gang__wframe w = {
        .kind = GANG__WF_WELCOME, .generation = s->cfg.generation, .world = s->cfg.world};
    uint64_t send_deadline = gang_now_ms() + (uint64_t)s->cfg.heartbeat_timeout_ms;
    for (uint32_t r = 1; r < s->cfg.world; r++) {
        int rc = wstep_send(s, s->conns[r].fd, &w, send_deadline);
        if (rc == GANG_ECLOSED)
            return wstep_fail(s, GANG_EPEER, r, "rank %u closed its connection", r);
        if (rc != 0)
            return wstep_fail(s, rc, r, "welcoming rank %u: %s", r, gang_strerror(rc));
    }
    return 0;
}

/*
 * Rank 0's steps: gathers every peer's STEP, adds its own value and returns the sum to
 * everyone. While it gathers it polls every rank still missing, so a rank that dies is
 * noticed at once (its connection reports EOF or a reset) and a rank that hangs is
 * noticed at the deadline. Returns only on failure or abort.
 */
static int root_loop(gang__wstep *s)
{
    uint32_t need = s->cfg.world - 1;
    uint64_t wait_ms = (uint64_t)s->cfg.heartbeat_timeout_ms;
    if (wait_ms < 2 * (uint64_t)s->cfg.step_interval_ms)
        wait_ms = 2 * (uint64_t)s->cfg.step_interval_ms;

    for (uint64_t step = 0;; step++) {
        memset(s->got, 0, s->cfg.world);
        uint32_t ngot = 0;
        uint64_t sum = 1 + step; /* rank 0's own value, r + 1 + step */
        uint64_t deadline = gang_now_ms() + wait_ms;

        while (ngot < need) {
            size_t n = 0;
            s->pfds[n++] = (struct pollfd){.fd = s->abort_rd, .events = POLLIN};
            for (uint32_t r = 1; r < s->cfg.world; r++) {
                if (s->got[r])
                    continue;
                s->pidx[n] = r;
                s->pfds[n++] = (struct pollfd){.fd = s->conns[r].fd, .events = POLLIN};
            }
            int timeout = ms_until(deadline);
            if (timeout == 0) {
                uint32_t r = root_first_missing(s, 0);
                return wstep_fail(s, GANG_ETIMEDOUT, r, "rank %u silent for %llu ms", r,
                                  (unsigned long long)(gang_now_ms() - s->conns[r].last_rx_ms));
            }
            if (poll(s->pfds, (nfds_t)n, timeout) < 0) {
                if (errno == EINTR)
                    continue;
                return wstep_fail(s, gang_err_from_errno(errno), 0, "poll: %s", strerror(errno));
            }
            if (s->pfds[0].revents)
                return GANG_EABORTED;
            for (size_t k = 1; k < n; k++) {
                if (!s->pfds[k].revents)
                    continue;
                uint32_t r = s->pidx[k];
                wconn *c = &s->conns[r];
                int rc = wconn_read(c);
                if (rc == GANG_ECLOSED)
                    return wstep_fail(s, GANG_EPEER, r, "rank %u closed its connection", r);
                if (rc < 0)
                    return wstep_fail(s, rc, r, "receiving from rank %u: %s", r, gang_strerror(rc));
                if (rc == 0)
                    continue;
                c->len = 0;
                gang__wframe f;
                if (gang__wframe_decode(c->buf, &f) != 0 || f.kind != GANG__WF_STEP ||
                    f.generation != s->cfg.generation || f.rank != r || f.step != step)
                    return wstep_fail(s, GANG_EPROTO, r,
                                      "rank %u sent a bad frame in step %llu (kind %u, "
                                      "generation %llu, step %llu)",
                                      r, (unsigned long long)step, f.kind,
                                      (unsigned long long)f.generation, (unsigned long long)f.step);
                s->got[r] = 1;
                ngot++;
                sum += f.value;
            }
        }

        gang__wframe out = {.kind = GANG__WF_SUM,
                            .generation = s->cfg.generation,
                            .world = s->cfg.world,
                            .step = step,
                            .value = sum};
        uint64_t send_deadline = gang_now_ms() + (uint64_t)s->cfg.heartbeat_timeout_ms;
        for (uint32_t r = 1; r < s->cfg.world; r++) {
            int rc = wstep_send(s, s->conns[r].fd, &out, send_deadline);
            if (rc == GANG_ECLOSED)
                return wstep_fail(s, GANG_EPEER, r, "rank %u closed its connection", r);
            if (rc == GANG_ETIMEDOUT)
                return wstep_fail(s, rc, r, "rank %u stopped reading for %lld ms", r,
                                  (long long)s->cfg.heartbeat_timeout_ms);
            if (rc != 0)
                return wstep_fail(s, rc, r, "sending to rank %u: %s", r, gang_strerror(rc));
        }
    }
}

/* -------------------------------------------------------------------------------------
 * Ranks > 0
 * ------------------------------------------------------------------------------------- */

/*
 * Connects to rank 0 before the deadline. A refused or unreachable connection is tried
 * again every WSTEP_CONNECT_RETRY_MS: rank 0 may still be binding, or the network of a
 * freshly started Pod may not be up yet. Returns 0 with *out a connected non-blocking
 * socket, or a failure already recorded.
 */
static int peer_connect(gang__wstep *s, uint64_t deadline, int *out)
{
    struct addrinfo hints, *ai = NULL;
    memset(&hints, 0, sizeof(hints));
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV;
    char port[8];
    snprintf(port, sizeof(port), "%u", (unsigned)s->cfg.root_port);
    /* The blob holds a numeric address, so this never blocks on DNS. */
    int gai = getaddrinfo(s->cfg.root_host, port, &hints, &ai);
    if (gai != 0)
        return wstep_fail(s, GANG_ERESOLVE, 0, "bootstrap address '%s' is not numeric: %s",
                          s->cfg.root_host, gai_strerror(gai));

    int rc, err = 0;
    for (;;) {
        int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0) {
            rc = wstep_fail(s, gang_err_from_errno(errno), s->cfg.rank, "socket: %s",
                            strerror(errno));
            goto out_free;
        }
        err = 0;
        if (connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
            err = errno;
            if (err == EINPROGRESS) {
                rc = wstep_wait(s, fd, POLLOUT, deadline);
                if (rc != 0) {
                    close(fd);
                    err = 0;
                    goto out_timeout;
                }
                socklen_t len = sizeof(err);
                if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0)
                    err = errno;
            }
        }
        if (err == 0) {
            set_nodelay(fd);
            *out = fd;
            rc = 0;
            goto out_free;
        }
        close(fd);
        if (err != ECONNREFUSED && err != ENETUNREACH && err != EHOSTUNREACH && err != ETIMEDOUT &&
            err != ECONNRESET) {
            rc = wstep_fail(s, gang_err_from_errno(err), 0, "cannot connect to rank 0 at %s:%u: %s",
                            s->cfg.root_host, (unsigned)s->cfg.root_port, strerror(err));
            goto out_free;
        }
        uint64_t retry = gang_now_ms() + WSTEP_CONNECT_RETRY_MS;
        rc = wstep_wait(s, -1, 0, retry < deadline ? retry : deadline);
        if (rc != GANG_ETIMEDOUT || gang_now_ms() >= deadline)
            goto out_timeout;
    }

out_timeout:
    if (rc == GANG_ETIMEDOUT)
        rc = wstep_fail(s, rc, 0, "rank 0 at %s:%u unreachable for %lld ms%s%s", s->cfg.root_host,
                        (unsigned)s->cfg.root_port, (long long)s->cfg.start_timeout_ms,
                        err ? ": " : "", err ? strerror(err) : "");
    else
        rc = wstep_fail(s, rc, s->cfg.rank, "connecting to rank 0: %s", gang_strerror(rc));
out_free:
    freeaddrinfo(ai);
    return rc;
}

/* Forms a peer's side of the star: connect, HELLO, wait for rank 0's WELCOME. */
static int peer_form(gang__wstep *s)
{
    uint64_t deadline = gang_now_ms() + (uint64_t)s->cfg.start_timeout_ms;
    wconn *root = &s->conns[0];
    int rc = peer_connect(s, deadline, &root->fd);
    if (rc != 0)
        return rc;
    root->len = 0;
    root->last_rx_ms = gang_now_ms();

    gang__wframe f = {.kind = GANG__WF_HELLO,
                      .generation = s->cfg.generation,
                      .rank = s->cfg.rank,
                      .world = s->cfg.world};
    rc = wstep_send(s, root->fd, &f, deadline);
    if (rc == 0)
        rc = wstep_recv(s, root, &f, deadline);
    if (rc == GANG_ECLOSED)
        return wstep_fail(s, GANG_EPEER, 0,
                          "rank 0 closed its connection before the gang "
                          "formed (it rejects a stale generation or a wrong world size)");
    if (rc == GANG_ETIMEDOUT)
        return wstep_fail(s, rc, 0, "rank 0 did not complete the gang within %lld ms",
                          (long long)s->cfg.start_timeout_ms);
    if (rc != 0)
        return wstep_fail(s, rc, 0, "joining rank 0: %s", gang_strerror(rc));
    if (f.kind != GANG__WF_WELCOME || f.generation != s->cfg.generation || f.world != s->cfg.world)
        return wstep_fail(s, GANG_EPROTO, 0,
                          "rank 0 answered HELLO with a bad frame (kind "
                          "%u, generation %llu, world %u)",
                          f.kind, (unsigned long long)f.generation, f.world);
    return 0;
}

/*
 * A peer's steps: every step interval, send this rank's value and check the sum that
 * comes back. Returns only on failure or abort.
 */
static int peer_loop(gang__wstep *s)
{
    wconn *root = &s->conns[0];
    uint64_t world = s->cfg.world;
    uint64_t wait_ms = (uint64_t)(s->cfg.heartbeat_timeout_ms + s->cfg.step_interval_ms);
    uint64_t next = gang_now_ms();

    for (uint64_t step = 0;; step++) {
        /* A late step starts at once but does not try to catch up with the ones missed. */
        next += (uint64_t)s->cfg.step_interval_ms;
        uint64_t now = gang_now_ms();
        if (next < now)
            next = now;
        int rc = wstep_wait(s, -1, 0, next);
        if (rc != GANG_ETIMEDOUT)
            return rc;

        gang__wframe f = {.kind = GANG__WF_STEP,
                          .generation = s->cfg.generation,
                          .rank = s->cfg.rank,
                          .world = s->cfg.world,
                          .step = step,
                          .value = s->cfg.rank + 1 + step};
        rc = wstep_send(s, root->fd, &f, gang_now_ms() + (uint64_t)s->cfg.heartbeat_timeout_ms);
        if (rc == 0)
            rc = wstep_recv(s, root, &f, gang_now_ms() + wait_ms);
        if (rc == GANG_ECLOSED)
            return wstep_fail(s, GANG_EPEER, 0, "rank 0 closed its connection");
        if (rc == GANG_ETIMEDOUT)
            return wstep_fail(s, rc, 0, "rank 0 silent for %llu ms",
                              (unsigned long long)(gang_now_ms() - root->last_rx_ms));
        if (rc != 0)
            return wstep_fail(s, rc, 0, "exchanging with rank 0: %s", gang_strerror(rc));
        uint64_t want = world * (world + 1) / 2 + world * step;
        if (f.kind != GANG__WF_SUM || f.generation != s->cfg.generation || f.step != step)
            return wstep_fail(s, GANG_EPROTO, 0,
                              "rank 0 sent a bad frame in step %llu (kind "
                              "%u, generation %llu, step %llu)",
                              (unsigned long long)step, f.kind, (unsigned long long)f.generation,
                              (unsigned long long)f.step);
        if (f.value != want)
            return wstep_fail(s, GANG_EPROTO, 0,
                              "all-reduce of step %llu returned %llu, "
                              "expected %llu",
                              (unsigned long long)step, (unsigned long long)f.value,
                              (unsigned long long)want);
    }
}

/* -------------------------------------------------------------------------------------
 * The thread and its lifetime
 * ------------------------------------------------------------------------------------- */

static void *wstep_thread(void *arg)
{
    gang__wstep *s = arg;
    const gang__wstep_config *c = &s->cfg;
    int rc = 0;

    if (c->world > 1)
        rc = c->rank == 0 ? root_form(s) : peer_form(s);
    if (rc == 0) {
        gang__wevent ev;
        memset(&ev, 0, sizeof(ev));
        ev.type = GANG__WEV_READY;
        ev.generation = c->generation;
        gang_info("data plane (placeholder star) up: rank %u of %u", c->rank, c->world);
        wstep_report(s, &ev);
        if (c->world == 1)
            rc = wstep_wait(s, -1, 0, UINT64_MAX); /* nothing to exchange: wait for stop */
        else
            rc = c->rank == 0 ? root_loop(s) : peer_loop(s);
    }
    if (rc == GANG_EABORTED)
        gang_debug("data plane: aborted");
    else if (rc != 0)
        wstep_fail(s, rc, c->rank, "data plane failed: %s", gang_strerror(rc));
    return NULL;
}

int gang__wstep_start(const gang__wstep_config *cfg, gang__wstep **out)
{
    int rc;
    int fds[2];

    if (cfg->world < 1 || cfg->world > WSTEP_MAX_WORLD || cfg->rank >= cfg->world ||
        cfg->event_fd < 0 || (cfg->world > 1 && cfg->rank == 0 && cfg->listen_fd < 0) ||
        (cfg->rank > 0 && (cfg->root_port == 0 || cfg->root_host[0] == '\0')))
        return GANG_EINVAL;

    gang__wstep *s = calloc(1, sizeof(*s));
    if (s == NULL)
        return GANG_ENOMEM;
    s->cfg = *cfg;
    if (s->cfg.start_timeout_ms > WSTEP_START_CAP_MS)
        s->cfg.start_timeout_ms = WSTEP_START_CAP_MS;
    s->abort_rd = s->abort_wr = -1;

    s->nconns = cfg->rank == 0 ? cfg->world : 1;
    s->conns = calloc(s->nconns, sizeof(*s->conns));
    if (cfg->rank == 0) {
        s->npfds = (cfg->world > WSTEP_PENDING_MAX ? cfg->world : WSTEP_PENDING_MAX) + 2;
        s->pfds = calloc(s->npfds, sizeof(*s->pfds));
        s->pidx = calloc(s->npfds, sizeof(*s->pidx));
        s->got = calloc(cfg->world, 1);
    }
    if (s->conns == NULL || (cfg->rank == 0 && (!s->pfds || !s->pidx || !s->got))) {
        rc = GANG_ENOMEM;
        goto out_free;
    }
    for (size_t i = 0; i < s->nconns; i++)
        s->conns[i].fd = -1;

    if (pipe2(fds, O_CLOEXEC | O_NONBLOCK) != 0) {
        rc = gang_err_from_errno(errno);
        goto out_free;
    }
    s->abort_rd = fds[0];
    s->abort_wr = fds[1];

    int err = pthread_create(&s->thread, NULL, wstep_thread, s);
    if (err != 0) {
        rc = gang_err_from_errno(err);
        goto out_free;
    }
    s->thread_started = 1;
    *out = s;
    return 0;

out_free:
    gang__wstep_stop(s);
    return rc;
}

void gang__wstep_stop(gang__wstep *s)
{
    if (s == NULL)
        return;
    if (s->thread_started) {
        /* The pipe is never drained, so every later wait of the thread sees it too. */
        char b = 1;
        while (write(s->abort_wr, &b, 1) < 0 && errno == EINTR)
            ;
        pthread_join(s->thread, NULL);
    }
    for (size_t i = 0; i < s->nconns; i++) {
        if (s->conns[i].fd >= 0)
            close(s->conns[i].fd);
    }
    for (size_t i = 0; i < s->npending; i++)
        close(s->pending[i].fd);
    if (s->abort_rd >= 0)
        close(s->abort_rd);
    if (s->abort_wr >= 0)
        close(s->abort_wr);
    free(s->conns);
    free(s->pfds);
    free(s->pidx);
    free(s->got);
    free(s);
}

int gang__wstep_listen(const char *advertise, int *fd_out, uint8_t *blob, size_t cap,
                       size_t *blob_len)
{
    const char *host = advertise;
    /* A wildcard is not an address a peer can dial; loopback serves a one-host gang. */
    if (host[0] == '\0' || strcmp(host, "0.0.0.0") == 0 || strcmp(host, "::") == 0)
        host = "127.0.0.1";

    struct addrinfo hints, *ai = NULL;
    memset(&hints, 0, sizeof(hints));
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV;
    int gai = getaddrinfo(host, "0", &hints, &ai);
    if (gai != 0) {
        gang_error("data plane: cannot resolve advertise address '%s': %s", host,
                   gai_strerror(gai));
        return GANG_ERESOLVE;
    }

    int rc = 0, fd = -1;
    for (struct addrinfo *a = ai; a != NULL; a = a->ai_next) {
        fd = socket(a->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0) {
            rc = gang_err_from_errno(errno);
            continue;
        }
        if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 && listen(fd, SOMAXCONN) == 0)
            break;
        rc = gang_err_from_errno(errno);
        close(fd);
        fd = -1;
    }
    freeaddrinfo(ai);
    if (fd < 0) {
        gang_error("data plane: cannot listen on %s: %s", host, gang_strerror(rc));
        return rc ? rc : GANG_ERESOLVE;
    }

    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    char nhost[GANG_HOST_MAX], nport[8];
    if (getsockname(fd, (struct sockaddr *)&ss, &sl) != 0) {
        rc = gang_err_from_errno(errno);
        goto out_close;
    }
    gai = getnameinfo((struct sockaddr *)&ss, sl, nhost, sizeof(nhost), nport, sizeof(nport),
                      NI_NUMERICHOST | NI_NUMERICSERV);
    if (gai != 0) {
        rc = GANG_ERESOLVE;
        goto out_close;
    }
    int n;
    if (ss.ss_family == AF_INET6)
        n = snprintf((char *)blob, cap, "[%s]:%s", nhost, nport);
    else
        n = snprintf((char *)blob, cap, "%s:%s", nhost, nport);
    if (n < 0 || (size_t)n >= cap) {
        rc = GANG_EMSGSIZE;
        goto out_close;
    }
    *blob_len = (size_t)n;
    *fd_out = fd;
    return 0;

out_close:
    close(fd);
    return rc;
}
