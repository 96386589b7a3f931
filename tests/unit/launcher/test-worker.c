/*
 * The worker process, tested from the agent's side of its control channel. The test
 * plays the agent: it listens on a SOCK_SEQPACKET socket in a fresh temporary directory,
 * forks children that run gang_worker_main() with small timings, and talks wctl.h to
 * them. The workers form the real data plane among themselves (the socket backend of
 * parallel/), with or without a model made by gang_mkmodel.
 *
 * Every child is reaped: tests wait for the exits they expect (with a deadline, then
 * SIGKILL), and the teardown SIGKILLs and reaps whatever is left, even after a failed
 * assertion. While a test waits for anything it keeps reading every worker's channel
 * ("pumping"), as a real agent would, so that no worker blocks on a full channel.
 */
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>
#include <time.h>
#include <utime.h>

#include <cmocka.h>

#include "ganglion/common.h"
#include "ganglion/model.h"
#include "launcher-tests.h"
#include "supervisor.h"
#include "wctl.h"
#include "worker.h"

#define TW_MAX 8          /* workers one test may run */
#define TW_QMAX 16        /* non-heartbeat messages queued per worker */
#define TW_HB_INTERVAL 50 /* --heartbeat-interval-ms given to workers */
#define TW_HB_TIMEOUT 400 /* --heartbeat-timeout-ms where a test measures silence */
/* --heartbeat-timeout-ms elsewhere: long enough that a worker descheduled on a loaded
 * machine is not reported silent in a test that is about something else. */
#define TW_HB_TIMEOUT_CALM 2000
#define TW_SLACK 300 /* scheduling slack of a loaded 2-core CI machine */

/* One worker as the fake agent sees it. */
typedef struct tw_worker {
    pid_t pid; /* 0 once reaped */
    int fd;    /* agent side of the channel, -1 once closed */
    int eof;   /* the worker closed its side */
    uint32_t local_rank;
    uint64_t nhb;         /* heartbeats received */
    uint64_t last_hb_ms;  /* when the last one arrived */
    uint32_t last_state;  /* its state */
    uint64_t last_hb_gen; /* its generation */
    gang_wctl q[TW_QMAX]; /* other messages, oldest first */
    size_t qlen;
} tw_worker;

typedef struct tw_ctx {
    char dir[64];
    char path[128];
    int lfd;           /* the agent's listening socket */
    int hb_timeout_ms; /* --heartbeat-timeout-ms of the workers spawned next */
    char model[160];   /* --model of the workers spawned next ("" = none) */
    tw_worker w[TW_MAX];
    size_t n;
} tw_ctx;

/* -------------------------------------------------------------------------------------
 * The fake agent
 * ------------------------------------------------------------------------------------- */

static int tw_setup(void **state)
{
    tw_ctx *c = calloc(1, sizeof(*c));
    if (c == NULL)
        return -1;
    for (size_t i = 0; i < TW_MAX; i++)
        c->w[i].fd = -1;
    c->hb_timeout_ms = TW_HB_TIMEOUT_CALM;
    snprintf(c->dir, sizeof(c->dir), "/tmp/gang-test-worker-XXXXXX");
    if (mkdtemp(c->dir) == NULL)
        goto out_free;
    snprintf(c->path, sizeof(c->path), "%s/agent.sock", c->dir);
    c->lfd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (c->lfd < 0)
        goto out_rmdir;
    struct sockaddr_un sa;
    memset(&sa, 0, sizeof(sa));
    sa.sun_family = AF_UNIX;
    gang_strlcpy(sa.sun_path, c->path, sizeof(sa.sun_path));
    if (bind(c->lfd, (struct sockaddr *)&sa, sizeof(sa)) != 0 || listen(c->lfd, 16) != 0)
        goto out_close;
    *state = c;
    return 0;

out_close:
    close(c->lfd);
out_rmdir:
    rmdir(c->dir);
out_free:
    free(c);
    return -1;
}

/* SIGKILLs and reaps every worker still there, then removes the socket and directory. */
static int tw_teardown(void **state)
{
    tw_ctx *c = *state;
    for (size_t i = 0; i < c->n; i++) {
        tw_worker *w = &c->w[i];
        if (w->fd >= 0)
            close(w->fd);
        if (w->pid > 0) {
            kill(w->pid, SIGKILL);
            while (waitpid(w->pid, NULL, 0) < 0 && errno == EINTR)
                ;
        }
    }
    close(c->lfd);
    unlink(c->path);
    if (c->model[0] != '\0') { /* tw_bad_model's, under c->dir */
        char cmd[200];
        snprintf(cmd, sizeof(cmd), "rm -rf '%s'", c->model);
        if (system(cmd) != 0)
            fprintf(stderr, "cannot remove %s\n", c->model);
    }
    rmdir(c->dir);
    free(c);
    return 0;
}

/* Reads everything worker i has sent: heartbeats are recorded, the rest is queued. */
static void tw_drain(tw_ctx *c, size_t i)
{
    tw_worker *w = &c->w[i];
    static uint8_t buf[GANG_WCTL_PACKET_MAX + 1];
    static gang_wctl m;
    static gang_req_msg r;
    for (;;) {
        ssize_t n = recv(w->fd, buf, sizeof(buf), MSG_DONTWAIT);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return;
        if (n <= 0) {
            w->eof = 1;
            return;
        }
        int type = (size_t)n < sizeof(buf) ? gang_wctl_decode(buf, (size_t)n, &m, &r) : GANG_EPROTO;
        if (type < 0 || gang_req_kind_valid((uint32_t)type))
            fail_msg("worker %zu sent a packet of %zd bytes that is no control message", i, n);
        if (m.type == GANG_WCTL_HEARTBEAT) {
            /* Heartbeats are small packets of their own, not the largest message. */
            if (n >= 256)
                fail_msg("worker %zu sent a heartbeat of %zd bytes", i, n);
            w->nhb++;
            w->last_hb_ms = gang_now_ms();
            w->last_state = m.state;
            w->last_hb_gen = m.generation;
            continue;
        }
        if (w->qlen == TW_QMAX)
            fail_msg("worker %zu sent more than %d unread messages", i, TW_QMAX);
        w->q[w->qlen++] = m;
    }
}

/* Waits up to timeout_ms for any worker to send something, and reads it. */
static void tw_pump(tw_ctx *c, int timeout_ms)
{
    struct pollfd pfd[TW_MAX];
    size_t idx[TW_MAX], n = 0;
    for (size_t i = 0; i < c->n; i++) {
        if (c->w[i].fd >= 0 && !c->w[i].eof) {
            idx[n] = i;
            pfd[n++] = (struct pollfd){.fd = c->w[i].fd, .events = POLLIN};
        }
    }
    if (poll(pfd, (nfds_t)n, timeout_ms) <= 0)
        return;
    for (size_t k = 0; k < n; k++) {
        if (pfd[k].revents)
            tw_drain(c, idx[k]);
    }
}

/* Keeps reading every channel for ms milliseconds. */
static void tw_pump_for(tw_ctx *c, uint64_t ms)
{
    uint64_t end = gang_now_ms() + ms;
    for (uint64_t now = gang_now_ms(); now < end; now = gang_now_ms())
        tw_pump(c, (int)(end - now));
}

/*
 * Reads the channels until worker i's latest heartbeat reports state, and fails the test
 * if that takes longer than timeout_ms. Waiting for the state, rather than sampling it
 * after a fixed time, keeps the check meaningful on a heavily loaded machine.
 */
static void tw_wait_state(tw_ctx *c, size_t i, uint32_t state, int timeout_ms)
{
    uint64_t deadline = gang_now_ms() + (uint64_t)timeout_ms;
    while (c->w[i].last_state != state || c->w[i].nhb == 0) {
        uint64_t now = gang_now_ms();
        if (now >= deadline)
            fail_msg("worker %zu: heartbeats say %s, not %s, after %d ms", i,
                     gang_rank_state_name((int)c->w[i].last_state),
                     gang_rank_state_name((int)state), timeout_ms);
        tw_pump(c, (int)(deadline - now));
    }
}

/*
 * Takes worker i's next message that is not a heartbeat, pumping until the deadline (a
 * gang_now_ms() time); fails the test, naming the type it waited for and timeout_ms, when
 * none comes by then or the channel closed.
 */
static gang_wctl tw_next(tw_ctx *c, size_t i, uint32_t type, uint64_t deadline, int timeout_ms)
{
    tw_worker *w = &c->w[i];
    while (w->qlen == 0) {
        uint64_t now = gang_now_ms();
        if (now >= deadline || w->eof)
            fail_msg("worker %zu: no message of type %u within %d ms%s", i, type, timeout_ms,
                     w->eof ? " (channel closed)" : "");
        tw_pump(c, (int)(deadline - now));
    }
    gang_wctl m = w->q[0];
    memmove(&w->q[0], &w->q[1], (w->qlen - 1) * sizeof(w->q[0]));
    w->qlen--;
    return m;
}

/*
 * Takes worker i's next message that is not a heartbeat (skipping any of type skip, 0 for
 * none) within timeout_ms, and fails the test unless it is of type and generation gen.
 */
static gang_wctl tw_expect(tw_ctx *c, size_t i, uint32_t type, uint64_t gen, int timeout_ms,
                           uint32_t skip)
{
    uint64_t deadline = gang_now_ms() + (uint64_t)timeout_ms;
    for (;;) {
        gang_wctl m = tw_next(c, i, type, deadline, timeout_ms);
        if (skip != 0 && m.type == skip)
            continue;
        if (m.type != type || m.generation != gen)
            fail_msg("worker %zu: expected type %u generation %llu, got type %u generation "
                     "%llu (reason '%s')",
                     i, type, (unsigned long long)gen, m.type, (unsigned long long)m.generation,
                     m.reason);
        return m;
    }
}

/* Sends one control message to worker i; returns what send(2) did (the message is whole
 * or not sent: the channel is SOCK_SEQPACKET). */
static ssize_t tw_try_send(tw_ctx *c, size_t i, uint32_t type, uint64_t gen, uint32_t rank,
                           uint32_t world, const uint8_t *blob, uint32_t blob_len)
{
    static gang_wctl m;
    static uint8_t buf[GANG_WCTL_PACKET_MAX];
    size_t len = 0;
    memset(&m, 0, sizeof(m));
    m.type = type;
    m.local_rank = c->w[i].local_rank;
    m.generation = gen;
    m.rank = rank;
    m.world_size = world;
    m.blob_len = blob_len;
    if (blob_len > 0)
        memcpy(m.blob, blob, blob_len);
    assert_int_equal(gang_wctl_encode(&m, buf, sizeof(buf), &len), 0);
    ssize_t n = send(c->w[i].fd, buf, len, MSG_NOSIGNAL);
    assert_true(n < 0 || n == (ssize_t)len);
    return n;
}

/* Sends one control message to worker i, which must take it. */
static void tw_send(tw_ctx *c, size_t i, uint32_t type, uint64_t gen, uint32_t rank, uint32_t world,
                    const uint8_t *blob, uint32_t blob_len)
{
    assert_true(tw_try_send(c, i, type, gen, rank, world, blob, blob_len) >= 0);
}

/* Closes every descriptor of the fake agent; for forked children. */
static void tw_close_all(tw_ctx *c)
{
    close(c->lfd);
    for (size_t i = 0; i < c->n; i++) {
        if (c->w[i].fd >= 0)
            close(c->w[i].fd);
    }
}

/* Runs a worker in this (forked) process with the test's timings and exits with its code. */
static void tw_run_worker(tw_ctx *c, uint32_t local_rank)
{
    char lr[16], hbt[48], model[200];
    snprintf(lr, sizeof(lr), "%u", local_rank);
    snprintf(hbt, sizeof(hbt), "--heartbeat-timeout-ms=%d", c->hb_timeout_ms);
    snprintf(model, sizeof(model), "--model=%s", c->model);
    char *argv[] = {"worker", "--agent-socket",
                    c->path,  "--local-rank",
                    lr,       "--node-index",
                    "0",      "--heartbeat-interval-ms=50",
                    hbt,      "--start-timeout-ms",
                    "3000",   "--advertise-address=127.0.0.1",
                    model,    NULL};
    tw_close_all(c);
    _exit(gang_worker_main((int)(sizeof(argv) / sizeof(argv[0])) - 1, argv));
}

/*
 * Accepts the next worker connection into slot c->n (whose pid is already set) and checks
 * its HELLO: local rank, and the pid when known (0 = take it from the HELLO).
 */
static size_t tw_accept(tw_ctx *c, uint32_t local_rank)
{
    size_t i = c->n - 1;
    tw_worker *w = &c->w[i];
    struct pollfd pfd = {.fd = c->lfd, .events = POLLIN};
    if (poll(&pfd, 1, 3000) != 1)
        fail_msg("worker with local rank %u did not connect within 3 s", local_rank);
    w->fd = accept4(c->lfd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
    assert_true(w->fd >= 0);
    gang_wctl m = tw_expect(c, i, GANG_WCTL_HELLO, 0, 2000, 0);
    assert_int_equal(m.local_rank, local_rank);
    if (w->pid == 0)
        w->pid = m.pid;
    assert_int_equal(m.pid, w->pid);
    return i;
}

/* Forks a worker with local rank local_rank, accepts it and checks its HELLO. */
static size_t tw_spawn(tw_ctx *c, uint32_t local_rank)
{
    assert_true(c->n < TW_MAX);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0)
        tw_run_worker(c, local_rank);
    tw_worker *w = &c->w[c->n++];
    memset(w, 0, sizeof(*w));
    w->pid = pid;
    w->fd = -1;
    w->local_rank = local_rank;
    return tw_accept(c, local_rank);
}

/*
 * Waits up to timeout_ms for worker i to exit, reading the channels meanwhile, and returns
 * its wait status. A worker still there at the deadline is SIGKILLed, reaped, and fails
 * the test.
 */
static int tw_reap(tw_ctx *c, size_t i, int timeout_ms)
{
    tw_worker *w = &c->w[i];
    uint64_t deadline = gang_now_ms() + (uint64_t)timeout_ms;
    int status = 0;
    for (;;) {
        pid_t r = waitpid(w->pid, &status, WNOHANG);
        if (r == w->pid)
            break;
        assert_true(r == 0 || errno == EINTR);
        if (gang_now_ms() >= deadline) {
            kill(w->pid, SIGKILL);
            waitpid(w->pid, NULL, 0);
            w->pid = 0;
            fail_msg("worker %zu did not exit within %d ms", i, timeout_ms);
        }
        tw_pump(c, 5);
    }
    w->pid = 0;
    return status;
}

static void tw_assert_exit(int status, int code)
{
    if (!WIFEXITED(status))
        fail_msg("worker did not exit normally (status 0x%x)", status);
    assert_int_equal(WEXITSTATUS(status), code);
}

/*
 * Forms generation gen over workers idx[0..n): BLOB_REQUEST to the first (rank 0), START
 * to all with rank = position, then READY from all. The blob goes to blob/blob_len.
 */
static void tw_form(tw_ctx *c, uint64_t gen, const size_t *idx, uint32_t n, uint8_t *blob,
                    uint32_t *blob_len)
{
    tw_send(c, idx[0], GANG_WCTL_BLOB_REQUEST, gen, 0, 0, NULL, 0);
    gang_wctl b = tw_expect(c, idx[0], GANG_WCTL_BLOB, gen, 2000, 0);
    assert_true(b.blob_len > 0 && b.blob_len < 128);
    assert_non_null(memchr(b.blob, ':', b.blob_len));
    memcpy(blob, b.blob, b.blob_len);
    *blob_len = b.blob_len;
    for (uint32_t k = 0; k < n; k++)
        tw_send(c, idx[k], GANG_WCTL_START, gen, k, n, blob, *blob_len);
    for (uint32_t k = 0; k < n; k++)
        tw_expect(c, idx[k], GANG_WCTL_READY, gen, 3000, 0);
}

/* Sends ABORT(gen) to each of idx[0..n) and expects ABORTED from each within 200 ms. */
static void tw_abort_all(tw_ctx *c, uint64_t gen, const size_t *idx, size_t n)
{
    for (size_t k = 0; k < n; k++) {
        uint64_t t0 = gang_now_ms();
        tw_send(c, idx[k], GANG_WCTL_ABORT, gen, 0, 0, NULL, 0);
        /* An ERROR that raced the ABORT (a peer's view of the same failure) is fine. */
        tw_expect(c, idx[k], GANG_WCTL_ABORTED, gen, 200, GANG_WCTL_ERROR);
        uint64_t dt = gang_now_ms() - t0;
        if (dt > 200)
            fail_msg("ABORTED after %llu ms", (unsigned long long)dt);
    }
}

/* Sends SHUTDOWN to each of idx[0..n) and expects each to exit 0. */
static void tw_shutdown_all(tw_ctx *c, const size_t *idx, size_t n)
{
    for (size_t k = 0; k < n; k++)
        tw_send(c, idx[k], GANG_WCTL_SHUTDOWN, 0, 0, 0, NULL, 0);
    for (size_t k = 0; k < n; k++)
        tw_assert_exit(tw_reap(c, idx[k], 1000), GANG_EXIT_OK);
}

/* -------------------------------------------------------------------------------------
 * The data plane from outside
 * ------------------------------------------------------------------------------------- */

/* Connects to the data-plane listener named by a socket-backend blob ("host:port ..."). */
static int tw_peer_connect(const uint8_t *blob, uint32_t len, int *err)
{
    char text[128], host[GANG_HOST_MAX];
    uint16_t port;
    assert_true(len < sizeof(text));
    memcpy(text, blob, len);
    text[len] = '\0';
    text[strcspn(text, "/")] = '\0'; /* the session id follows the address */
    assert_int_equal(gang_parse_host_port(text, host, sizeof(host), &port), 0);
    struct addrinfo hints, *ai = NULL;
    memset(&hints, 0, sizeof(hints));
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICHOST;
    char ports[8];
    snprintf(ports, sizeof(ports), "%u", (unsigned)port);
    assert_int_equal(getaddrinfo(host, ports, &hints, &ai), 0);
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(fd >= 0);
    *err = connect(fd, ai->ai_addr, ai->ai_addrlen) == 0 ? 0 : errno;
    freeaddrinfo(ai);
    if (*err != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

/* -------------------------------------------------------------------------------------
 * Tests
 * ------------------------------------------------------------------------------------- */

/* Usage errors return 2 before the worker touches anything (so this runs in-process). */
static void test_usage_errors(void **state)
{
    (void)state;
    char *no_args[] = {"worker", NULL};
    char *no_socket[] = {"worker", "--local-rank", "0", NULL};
    char *no_rank[] = {"worker", "--agent-socket", "/nonexistent/a.sock", NULL};
    char *bad_rank[] = {"worker", "--agent-socket", "/x", "--local-rank", "64", NULL};
    char *unknown[] = {"worker", "--agent-socket", "/x", "--local-rank", "0", "--bogus", NULL};
    char *no_value[] = {"worker", "--local-rank", "0", "--agent-socket", NULL};
    char *bad_param[] = {
        "worker", "--agent-socket=/x", "--local-rank=0", "--heartbeat-interval-ms", "soon", NULL};
    assert_int_equal(gang_worker_main(1, no_args), GANG_EXIT_USAGE);
    assert_int_equal(gang_worker_main(3, no_socket), GANG_EXIT_USAGE);
    assert_int_equal(gang_worker_main(3, no_rank), GANG_EXIT_USAGE);
    assert_int_equal(gang_worker_main(5, bad_rank), GANG_EXIT_USAGE);
    assert_int_equal(gang_worker_main(6, unknown), GANG_EXIT_USAGE);
    assert_int_equal(gang_worker_main(4, no_value), GANG_EXIT_USAGE);
    assert_int_equal(gang_worker_main(5, bad_param), GANG_EXIT_USAGE);
}

/* HELLO, then IDLE heartbeats on the configured period, then SHUTDOWN exits 0. */
static void test_heartbeat_and_shutdown(void **state)
{
    tw_ctx *c = *state;
    size_t w = tw_spawn(c, 0);
    uint64_t t0 = gang_now_ms(), nhb0 = c->w[w].nhb;
    tw_pump_for(c, 500);
    uint64_t dt = gang_now_ms() - t0, nhb = c->w[w].nhb - nhb0;
    /* About dt / 50 heartbeats; demand a solid fraction of them, and not a flood. */
    if (nhb < dt / TW_HB_INTERVAL / 4 || nhb > dt / TW_HB_INTERVAL + 2)
        fail_msg("%llu heartbeats in %llu ms", (unsigned long long)nhb, (unsigned long long)dt);
    assert_int_equal(c->w[w].last_state, GANG_RANK_IDLE);
    assert_int_equal(c->w[w].qlen, 0);
    tw_shutdown_all(c, &w, 1);
}

/* The agent closes the channel: the worker exits 75 (retryable). */
static void test_agent_eof_exits_75(void **state)
{
    tw_ctx *c = *state;
    size_t w = tw_spawn(c, 0);
    close(c->w[w].fd);
    c->w[w].fd = -1;
    tw_assert_exit(tw_reap(c, w, 1000), GANG_EXIT_TEMPFAIL);
}

/* A packet that does not decode is a protocol error: the channel is dropped, exit 75. */
static void test_bad_packet_exits_75(void **state)
{
    tw_ctx *c = *state;
    size_t w = tw_spawn(c, 0);
    char junk[10] = {0};
    assert_int_equal(send(c->w[w].fd, junk, sizeof(junk), MSG_NOSIGNAL), (ssize_t)sizeof(junk));
    tw_assert_exit(tw_reap(c, w, 1000), GANG_EXIT_TEMPFAIL);
}

/* The agent process dies: PR_SET_PDEATHSIG kills the worker. */
static void test_dies_with_agent(void **state)
{
    tw_ctx *c = *state;
    /* Orphans come to this process instead of init, so the worker can be reaped here. */
    assert_int_equal(prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
    int gate[2];
    assert_int_equal(pipe(gate), 0);
    pid_t mid = fork();
    assert_true(mid >= 0);
    if (mid == 0) {
        /* The "agent": starts the worker, then exits when the test closes the gate. */
        close(gate[1]);
        pid_t pid = fork();
        if (pid < 0)
            _exit(1);
        if (pid == 0) {
            close(gate[0]);
            tw_run_worker(c, 3);
        }
        char b;
        while (read(gate[0], &b, 1) < 0 && errno == EINTR)
            ;
        _exit(0);
    }
    close(gate[0]);
    /* The "agent" gets a slot too, so that the teardown reaps it whatever happens. */
    tw_worker *a = &c->w[c->n++];
    memset(a, 0, sizeof(*a));
    a->pid = mid;
    a->fd = -1;
    tw_worker *w = &c->w[c->n++];
    memset(w, 0, sizeof(*w));
    w->fd = -1;
    w->local_rank = 3;
    size_t i = tw_accept(c, 3); /* the pid comes from HELLO */
    close(gate[1]);
    int st;
    assert_int_equal(waitpid(mid, &st, 0), mid);
    a->pid = 0;
    st = tw_reap(c, i, 1000);
    assert_true(WIFSIGNALED(st));
    assert_int_equal(WTERMSIG(st), SIGKILL);
}

/* A gang of one needs no sockets and no BLOB_REQUEST. */
static void test_world_of_one(void **state)
{
    tw_ctx *c = *state;
    size_t w = tw_spawn(c, 0);
    tw_send(c, w, GANG_WCTL_START, 7, 0, 1, NULL, 0);
    tw_expect(c, w, GANG_WCTL_READY, 7, 2000, 0);
    tw_wait_state(c, w, GANG_RANK_READY, 1000);
    assert_int_equal(c->w[w].last_hb_gen, 7);
    tw_abort_all(c, 7, &w, 1);
    tw_shutdown_all(c, &w, 1);
}

/*
 * The whole life of a gang: form generation 5 over three workers, heartbeats say READY,
 * stale messages are ignored, a killed rank is named by rank 0 within 1 s, the survivors
 * abort within 200 ms, and generation 6 forms with the survivors and a fresh worker.
 */
static void test_gang_lifecycle(void **state)
{
    tw_ctx *c = *state;
    uint8_t blob[GANG_BLOB_MAX];
    uint32_t blob_len;
    size_t g[3];
    for (uint32_t k = 0; k < 3; k++)
        g[k] = tw_spawn(c, k);
    tw_form(c, 5, g, 3, blob, &blob_len);

    uint64_t nhb[3];
    for (int k = 0; k < 3; k++)
        nhb[k] = c->w[g[k]].nhb;
    for (int k = 0; k < 3; k++)
        tw_wait_state(c, g[k], GANG_RANK_READY, 1000);
    tw_pump_for(c, 300);
    for (int k = 0; k < 3; k++) {
        assert_true(c->w[g[k]].nhb >= nhb[k] + 2);
        assert_int_equal(c->w[g[k]].last_hb_gen, 5);
    }

    /* Older generations are ignored: no reply, no state change, the data plane runs on. */
    tw_send(c, g[1], GANG_WCTL_START, 4, 1, 3, blob, blob_len);
    tw_send(c, g[2], GANG_WCTL_ABORT, 4, 0, 0, NULL, 0);
    tw_send(c, g[0], GANG_WCTL_BLOB_REQUEST, 3, 0, 0, NULL, 0);
    tw_pump_for(c, 200);
    for (int k = 0; k < 3; k++) {
        assert_int_equal(c->w[g[k]].qlen, 0);
        assert_int_equal(c->w[g[k]].last_state, GANG_RANK_READY);
    }

    /* Rank 2 dies: rank 0 sees its connection close within a tick and reports it. */
    uint64_t t0 = gang_now_ms();
    assert_int_equal(kill(c->w[g[2]].pid, SIGKILL), 0);
    gang_wctl e = tw_expect(c, g[0], GANG_WCTL_ERROR, 5, 1000, 0);
    uint64_t dt = gang_now_ms() - t0;
    print_message("rank 0 reported '%s' after %llu ms\n", e.reason, (unsigned long long)dt);
    assert_true(dt <= 1000);
    assert_int_equal(e.code, GANG_EPEER);
    assert_non_null(strstr(e.reason, "rank 0"));
    int st = tw_reap(c, g[2], 1000);
    assert_true(WIFSIGNALED(st));
    tw_wait_state(c, g[0], GANG_RANK_FAILED, 1000);

    tw_abort_all(c, 5, g, 2);
    tw_wait_state(c, g[0], GANG_RANK_IDLE, 1000);
    tw_wait_state(c, g[1], GANG_RANK_IDLE, 1000);

    /* Generation 6: the survivors and a freshly started worker. */
    g[2] = tw_spawn(c, 2);
    tw_form(c, 6, g, 3, blob, &blob_len);
    for (int k = 0; k < 3; k++)
        tw_wait_state(c, g[k], GANG_RANK_READY, 1000);
    tw_pump_for(c, 150);
    for (int k = 0; k < 3; k++)
        assert_int_equal(c->w[g[k]].qlen, 0); /* the barriers go on everywhere */
    tw_shutdown_all(c, g, 3);
}

/*
 * A stopped worker (SIGSTOP: a hang) goes silent on the control channel, and rank 0's
 * data plane times out within heartbeat timeout + two ticks.
 */
static void test_stopped_worker(void **state)
{
    tw_ctx *c = *state;
    uint8_t blob[GANG_BLOB_MAX];
    uint32_t blob_len;
    size_t g[3];
    c->hb_timeout_ms = TW_HB_TIMEOUT;
    for (uint32_t k = 0; k < 3; k++)
        g[k] = tw_spawn(c, k);
    tw_form(c, 1, g, 3, blob, &blob_len);
    tw_pump_for(c, 100);

    uint64_t t0 = gang_now_ms();
    assert_int_equal(kill(c->w[g[1]].pid, SIGSTOP), 0);
    int budget = TW_HB_TIMEOUT + 3 * TW_HB_INTERVAL + TW_SLACK;
    gang_wctl e = tw_expect(c, g[0], GANG_WCTL_ERROR, 1, budget, 0);
    uint64_t dt = gang_now_ms() - t0;
    print_message("rank 0 reported '%s' after %llu ms\n", e.reason, (unsigned long long)dt);
    assert_int_equal(e.code, GANG_ETIMEDOUT);

    /* Its heartbeats stopped with it; everyone else's go on. */
    uint64_t more = gang_now_ms() - t0 < 400 ? 400 - (gang_now_ms() - t0) : 0;
    tw_pump_for(c, more + TW_HB_INTERVAL);
    uint64_t silence = gang_now_ms() - c->w[g[1]].last_hb_ms;
    if (silence <= 300)
        fail_msg("the stopped worker's heartbeats went on (silent only %llu ms)",
                 (unsigned long long)silence);
    assert_true(gang_now_ms() - c->w[g[0]].last_hb_ms < TW_HB_TIMEOUT);
    tw_wait_state(c, g[0], GANG_RANK_FAILED, 1000);

    assert_int_equal(kill(c->w[g[1]].pid, SIGKILL), 0);
    tw_reap(c, g[1], 1000);
    size_t rest[2] = {g[0], g[2]};
    tw_abort_all(c, 1, rest, 2);
    tw_shutdown_all(c, rest, 2);
}

/* Rank 0 dies: a peer names it. */
static void test_rank0_dies(void **state)
{
    tw_ctx *c = *state;
    uint8_t blob[GANG_BLOB_MAX];
    uint32_t blob_len;
    size_t g[2];
    for (uint32_t k = 0; k < 2; k++)
        g[k] = tw_spawn(c, k);
    tw_form(c, 2, g, 2, blob, &blob_len);
    assert_int_equal(kill(c->w[g[0]].pid, SIGKILL), 0);
    gang_wctl e = tw_expect(c, g[1], GANG_WCTL_ERROR, 2, 1000, 0);
    assert_int_equal(e.code, GANG_EPEER);
    assert_non_null(strstr(e.reason, "rank 1"));
    tw_reap(c, g[0], 1000);
    tw_abort_all(c, 2, &g[1], 1);
    tw_shutdown_all(c, &g[1], 1);
}

/*
 * Writes a tiny model under the test's directory whose weights file is cut in half (its
 * header parses, its data section is short) and makes it the --model of the workers
 * spawned next.
 */
static void tw_bad_model(tw_ctx *c)
{
    char dir[160], st[200], err[256];
    snprintf(dir, sizeof(dir), "%s/model", c->dir);
    gang_mkmodel_opts o = {.out_dir = dir,
                           .arch = GANG_ARCH_LLAMA,
                           .layers = 2,
                           .hidden = 64,
                           .heads = 4,
                           .kv_heads = 2,
                           .ffn = 128,
                           .vocab = 97,
                           .max_pos = 64,
                           .seed = 5,
                           .dtype = GANG_DTYPE_F32,
                           .shards = 1};
    gang_strlcpy(c->model, dir, sizeof(c->model));
    if (gang_mkmodel(&o, err, sizeof(err)) != 0)
        fail_msg("mkmodel: %s", err);
    snprintf(st, sizeof(st), "%s/model.safetensors", dir);
    struct stat sb;
    assert_int_equal(stat(st, &sb), 0);
    assert_int_equal(truncate(st, sb.st_size / 2), 0);
}

/*
 * Takes worker i's next message within timeout_ms and fails unless it is an ERROR of
 * generation 0 or gen carrying GANG_EMODEL and naming the weights file.
 */
static void tw_expect_model_error(tw_ctx *c, size_t i, uint64_t gen, int timeout_ms)
{
    gang_wctl m = tw_next(c, i, GANG_WCTL_ERROR, gang_now_ms() + (uint64_t)timeout_ms, timeout_ms);
    if (m.type != GANG_WCTL_ERROR || (m.generation != 0 && m.generation != gen) ||
        m.code != GANG_EMODEL || strstr(m.reason, "model.safetensors") == NULL)
        fail_msg("worker %zu: expected ERROR (GANG_EMODEL) of generation 0 or %llu, got type "
                 "%u generation %llu code %d ('%s')",
                 i, (unsigned long long)gen, m.type, (unsigned long long)m.generation, m.code,
                 m.reason);
}

/*
 * A shard that cannot be loaded is fatal, never retried: the worker says why (ERROR with
 * GANG_EMODEL naming the weights file) and exits 3, which stops its agent. Both when the
 * loader fails while the worker is idle, and when a START came at once (a world of one:
 * the data thread waits for the loader and meets the failure) and an ABORT follows the
 * ERROR: that ABORT's teardown drains the event pipe, and the worker must not go back to
 * IDLE for the next START of a gang that cannot form (CI saw it restart until its budget
 * ran out, then exit 75, when the loader's LOADED event was drained with the data thread's
 * FAILED; the verdict is now read from the loader's state).
 */
static void test_bad_model_exits_3(void **state)
{
    tw_ctx *c = *state;
    tw_bad_model(c);

    size_t a = tw_spawn(c, 0);
    tw_expect_model_error(c, a, 0, 5000);
    tw_assert_exit(tw_reap(c, a, 3000), GANG_EXIT_MODEL);

    size_t b = tw_spawn(c, 0);
    tw_send(c, b, GANG_WCTL_START, 3, 0, 1, NULL, 0);
    tw_expect_model_error(c, b, 3, 5000);
    tw_try_send(c, b, GANG_WCTL_ABORT, 3, 0, 0, NULL, 0); /* fails once it has gone: fine */
    tw_assert_exit(tw_reap(c, b, 3000), GANG_EXIT_MODEL);
}

/* ABORT reaches a data thread blocked forming the communicator (no peer comes) promptly. */
static void test_abort_while_starting(void **state)
{
    tw_ctx *c = *state;
    size_t w = tw_spawn(c, 0);
    tw_send(c, w, GANG_WCTL_BLOB_REQUEST, 9, 0, 0, NULL, 0);
    gang_wctl b = tw_expect(c, w, GANG_WCTL_BLOB, 9, 2000, 0);
    tw_send(c, w, GANG_WCTL_START, 9, 0, 2, b.blob, b.blob_len);
    tw_wait_state(c, w, GANG_RANK_STARTING, 1000);
    uint64_t t0 = gang_now_ms();
    tw_send(c, w, GANG_WCTL_ABORT, 9, 0, 0, NULL, 0);
    tw_expect(c, w, GANG_WCTL_ABORTED, 9, 200, 0);
    uint64_t dt = gang_now_ms() - t0;
    print_message("ABORTED after %llu ms\n", (unsigned long long)dt);
    assert_true(dt < 200);
    int err;
    assert_int_equal(tw_peer_connect(b.blob, b.blob_len, &err), -1);
    assert_int_equal(err, ECONNREFUSED);
    tw_shutdown_all(c, &w, 1);
}

/* -------------------------------------------------------------------------------------
 * The bootstrap blob reaching START (its format is tested in tests/unit/test-comm.c)
 * ------------------------------------------------------------------------------------- */

#define TB_SOCK "127.0.0.1:40123/00112233445566778899aabbccddeeff"

/* A syntactically valid NCCL id: 256 lowercase hex digits. */
static void tb_fake_id(uint8_t *id)
{
    static const char hex[] = "0123456789abcdef";
    for (size_t i = 0; i < GANG_BOOTSTRAP_NCCL_HEX; i++)
        id[i] = (uint8_t)hex[(i * 7 + 3) % 16];
}

/* Which workers run TP / PP over nccl: --model, --device cuda, --backend nccl or auto. */
static void test_uses_nccl(void **state)
{
    (void)state;
    gang_params p;
    gang_params_defaults(&p);
    gang_strlcpy(p.backend, "auto", sizeof(p.backend));
    gang_strlcpy(p.device, "cuda", sizeof(p.device));
    assert_int_equal(gang__worker_uses_nccl(&p), 0); /* no model: no TP / PP groups */
    gang_strlcpy(p.model, "/models/x", sizeof(p.model));
    assert_int_equal(gang__worker_uses_nccl(&p), gang_comm_backend_built(GANG_COMM_NCCL));
    gang_strlcpy(p.backend, "nccl", sizeof(p.backend));
    assert_int_equal(gang__worker_uses_nccl(&p), 1);
    gang_strlcpy(p.backend, "socket", sizeof(p.backend));
    assert_int_equal(gang__worker_uses_nccl(&p), 0);
    gang_strlcpy(p.backend, "auto", sizeof(p.backend));
    gang_strlcpy(p.device, "cpu", sizeof(p.device));
    assert_int_equal(gang__worker_uses_nccl(&p), 0);
    gang_strlcpy(p.device, "auto", sizeof(p.device));
    assert_int_equal(gang__worker_uses_nccl(&p), 0);
    gang_strlcpy(p.backend, "nccl", sizeof(p.backend));
    assert_int_equal(gang__worker_uses_nccl(&p), 0); /* refused by the agent before this */
}

/* The GPU of each worker: one per local rank, or shared with --share-gpus; refusals. */
static void test_gpu_of(void **state)
{
    int gpu = -7;

    (void)state;
    assert_int_equal(gang__wres_gpu_of(5, 4, 8, 0, &gpu), 0);
    assert_int_equal(gpu, 1); /* global rank 5, 4 per node: local rank 1 */
    assert_int_equal(gang__wres_gpu_of(3, 2, 1, 0, &gpu), GANG_EUSAGE); /* 2 workers, 1 GPU */
    assert_int_equal(gang__wres_gpu_of(3, 2, 1, 1, &gpu), 0);
    assert_int_equal(gpu, 0); /* shared: local rank 1 on GPU 1 mod 1 */
    assert_int_equal(gang__wres_gpu_of(7, 4, 3, 1, &gpu), 0);
    assert_int_equal(gpu, 0); /* local rank 3 of 4 on GPU 3 mod 3 */
    assert_int_equal(gang__wres_gpu_of(6, 4, 3, 1, &gpu), 0);
    assert_int_equal(gpu, 2);
    gpu = -7;
    assert_int_equal(gang__wres_gpu_of(0, 1, 0, 1, &gpu), GANG_EUSAGE); /* no GPU at all */
    assert_int_equal(gang__wres_gpu_of(0, 1, -1, 0, &gpu), GANG_EUSAGE);
    assert_int_equal(gang__wres_gpu_of(0, 0, 1, 0, &gpu), GANG_EUSAGE);
    assert_int_equal(gpu, -7); /* untouched on a refusal */
}

/* --gpu-memory-percent with --share-gpus: split among the workers on each GPU. */
static void test_pool_percent(void **state)
{
    (void)state;
    assert_int_equal(gang__wres_pool_percent(90, 4, 8, 1), 90); /* a GPU each */
    assert_int_equal(gang__wres_pool_percent(90, 2, 2, 0), 90);
    assert_int_equal(gang__wres_pool_percent(90, 2, 1, 0), 45); /* two on one GPU */
    assert_int_equal(gang__wres_pool_percent(90, 4, 1, 0), 22);
    /* 5 workers on 3 GPUs: local ranks 0, 3 on GPU 0; 1, 4 on GPU 1; 2 alone on GPU 2 */
    assert_int_equal(gang__wres_pool_percent(90, 5, 3, 0), 45);
    assert_int_equal(gang__wres_pool_percent(90, 5, 3, 1), 45);
    assert_int_equal(gang__wres_pool_percent(90, 5, 3, 2), 90);
    assert_int_equal(gang__wres_pool_percent(1, 4, 1, 0), 1);   /* never 0 */
    assert_int_equal(gang__wres_pool_percent(90, 2, 0, 0), 90); /* no GPU: refused elsewhere */
    assert_int_equal(gang__wres_pool_percent(90, 2, 1, 3), 90);
}

/*
 * START with a blob the worker must refuse: a malformed nccl line (GANG_EPROTO), and a
 * well-formed NCCL id sent to a CPU worker (GANG_EMISMATCH: the nodes were started with
 * different --device / --backend). The worker reports ERROR with the reason, stays alive
 * and takes the next generation.
 */
static void test_start_bad_blob(void **state)
{
    tw_ctx *c = *state;
    uint8_t id[GANG_BOOTSTRAP_NCCL_HEX], blob[GANG_BLOB_MAX];
    size_t w = tw_spawn(c, 0), len;
    static const char bad[] = TB_SOCK "\nnccl:12";

    tw_send(c, w, GANG_WCTL_START, 3, 1, 2, (const uint8_t *)bad, sizeof(bad) - 1);
    gang_wctl e = tw_expect(c, w, GANG_WCTL_ERROR, 3, 2000, 0);
    assert_int_equal(e.code, GANG_EPROTO);
    assert_non_null(strstr(e.reason, "NCCL unique id has 2 characters"));
    tw_send(c, w, GANG_WCTL_ABORT, 3, 0, 0, NULL, 0);
    tw_expect(c, w, GANG_WCTL_ABORTED, 3, 1000, 0);

    tb_fake_id(id);
    assert_int_equal(gang_bootstrap_format((const uint8_t *)TB_SOCK, strlen(TB_SOCK), id,
                                           sizeof(id), blob, sizeof(blob), &len),
                     0);
    tw_send(c, w, GANG_WCTL_START, 4, 1, 2, blob, (uint32_t)len);
    e = tw_expect(c, w, GANG_WCTL_ERROR, 4, 2000, 0);
    assert_int_equal(e.code, GANG_EMISMATCH);
    assert_non_null(strstr(e.reason, "carries an NCCL unique id"));
    tw_send(c, w, GANG_WCTL_ABORT, 4, 0, 0, NULL, 0);
    tw_expect(c, w, GANG_WCTL_ABORTED, 4, 1000, 0);

    /* Still serving: a gang of one forms in generation 5. */
    tw_send(c, w, GANG_WCTL_START, 5, 0, 1, NULL, 0);
    tw_expect(c, w, GANG_WCTL_READY, 5, 2000, 0);
    tw_abort_all(c, 5, &w, 1);
    tw_shutdown_all(c, &w, 1);
}

/* A "ganglion-agent-" directory under root with, per mode, a socket that listens (1), a
 * socket whose listener is gone (0) or no socket (-1); aged by age_s seconds. *fd
 * receives the listening socket (mode 1; -1 otherwise). */
static void stale_dir(const char *root, const char *name, int mode, long age_s, int *fd)
{
    char dir[512], sock[600];
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    struct utimbuf t;

    *fd = -1;
    snprintf(dir, sizeof(dir), "%s/%s", root, name);
    assert_int_equal(mkdir(dir, 0700), 0);
    snprintf(sock, sizeof(sock), "%s/ctl.sock", dir);
    if (mode >= 0) {
        int s = socket(AF_UNIX, SOCK_SEQPACKET, 0);
        assert_true(s >= 0);
        gang_strlcpy(sa.sun_path, sock, sizeof(sa.sun_path));
        assert_int_equal(bind(s, (struct sockaddr *)&sa, sizeof(sa)), 0);
        assert_int_equal(listen(s, 4), 0);
        if (mode == 0)
            close(s); /* the file stays, nobody listens: what a SIGKILLed agent leaves */
        else
            *fd = s;
    }
    t.actime = t.modtime = time(NULL) - age_s;
    assert_int_equal(utime(dir, &t), 0);
}

static int dir_exists(const char *root, const char *name)
{
    char p[512];
    struct stat st;

    snprintf(p, sizeof(p), "%s/%s", root, name);
    return stat(p, &st) == 0;
}

/*
 * gang_sup_sweep_stale removes only old directories whose socket nobody listens on (or
 * that have none): a live agent's (listening) and a young one (maybe still starting)
 * stay, and so do entries with other names.
 */
static void test_sweep_stale_dirs(void **state)
{
    char root[] = "/tmp/gang-test-sweep-XXXXXX";
    int live, fd;

    (void)state;
    assert_non_null(mkdtemp(root));
    stale_dir(root, "ganglion-agent-dead", 0, 3600, &fd);
    stale_dir(root, "ganglion-agent-nosock", -1, 3600, &fd);
    stale_dir(root, "ganglion-agent-live", 1, 3600, &live);
    stale_dir(root, "ganglion-agent-young", 0, 0, &fd);
    stale_dir(root, "other-dead", 0, 3600, &fd);
    assert_int_equal(gang_sup_sweep_stale(root, 60), 2);
    assert_false(dir_exists(root, "ganglion-agent-dead"));
    assert_false(dir_exists(root, "ganglion-agent-nosock"));
    assert_true(dir_exists(root, "ganglion-agent-live"));
    assert_true(dir_exists(root, "ganglion-agent-young"));
    assert_true(dir_exists(root, "other-dead"));
    assert_int_equal(gang_sup_sweep_stale(root, 60), 0); /* nothing more to take */
    /* Once the live agent's listener is gone, its directory goes too. */
    close(live);
    assert_int_equal(gang_sup_sweep_stale(root, 60), 1);
    assert_false(dir_exists(root, "ganglion-agent-live"));
    assert_int_equal(gang_sup_sweep_stale("/nonexistent-gang-dir", 60), 0);
    /* Clean up what the sweep rightly kept. */
    char p[600];
    const char *left[] = {"ganglion-agent-young", "other-dead"};
    for (size_t i = 0; i < 2; i++) {
        snprintf(p, sizeof(p), "%s/%s/ctl.sock", root, left[i]);
        unlink(p);
        snprintf(p, sizeof(p), "%s/%s", root, left[i]);
        assert_int_equal(rmdir(p), 0);
    }
    assert_int_equal(rmdir(root), 0);
}

int gang_test_worker(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_usage_errors),
        cmocka_unit_test(test_uses_nccl),
        cmocka_unit_test(test_sweep_stale_dirs),
        cmocka_unit_test_setup_teardown(test_start_bad_blob, tw_setup, tw_teardown),
        cmocka_unit_test_setup_teardown(test_heartbeat_and_shutdown, tw_setup, tw_teardown),
        cmocka_unit_test_setup_teardown(test_agent_eof_exits_75, tw_setup, tw_teardown),
        cmocka_unit_test_setup_teardown(test_bad_packet_exits_75, tw_setup, tw_teardown),
        cmocka_unit_test_setup_teardown(test_dies_with_agent, tw_setup, tw_teardown),
        cmocka_unit_test(test_gpu_of),
        cmocka_unit_test(test_pool_percent),
        cmocka_unit_test_setup_teardown(test_world_of_one, tw_setup, tw_teardown),
        cmocka_unit_test_setup_teardown(test_gang_lifecycle, tw_setup, tw_teardown),
        cmocka_unit_test_setup_teardown(test_stopped_worker, tw_setup, tw_teardown),
        cmocka_unit_test_setup_teardown(test_rank0_dies, tw_setup, tw_teardown),
        cmocka_unit_test_setup_teardown(test_abort_while_starting, tw_setup, tw_teardown),
        cmocka_unit_test_setup_teardown(test_bad_model_exits_3, tw_setup, tw_teardown),
    };
    return cmocka_run_group_tests_name("worker", tests, NULL, NULL);
}
