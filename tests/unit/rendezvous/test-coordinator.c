/*
 * Coordinator and member state machine tests. Everything runs in this process on one
 * libuv loop: a coordinator on 127.0.0.1 (ephemeral port) and a few members whose agent
 * callbacks do at once what a real agent would do (produce the blob, report READY,
 * rejoin after an abort). The tests drive the loop with run_until(), which fails the test
 * when its condition is not met before a deadline, so a hang is a failure and never a
 * stuck binary. Timings are small (heartbeat 20 ms, timeouts 200 ms, backoff 5 ms) to keep
 * the whole group to a few seconds.
 *
 * A peer that falls silent or misbehaves cannot be a real member or coordinator on the
 * shared loop (stopping it would stop everything), so "raw peers" play those parts: plain
 * non-blocking sockets that speak the wire format by hand, driven between loop turns.
 */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <cmocka.h>
#include <uv.h>

#include "ganglion/rendezvous.h"
#include "rdzv-tests.h"

/* ---------------------------------------------------------------------------------
 * Test environment: one loop, one coordinator, a table of fake agents
 * --------------------------------------------------------------------------------- */

#define NNODES 3u
#define NPROC 2u
#define TP 2u
#define PP 3u
#define WORLD (NNODES * NPROC)
#define MAX_AGENTS 12
#define WAIT_MS 3000u /* deadline for anything that should take milliseconds */
#define HEARTBEAT_MS 20u
#define TIMEOUT_MS 200u
#define HANDSHAKE_MS 200u
#define JOB "test-job"

typedef struct test_env test_env;

/* A fake agent: what it was told by its member, and how it answers. */
typedef struct agent {
    gang_member *m;     /* NULL when not started or closed */
    int in_gang;        /* expected to be part of the formed gang */
    int hold_blob;      /* do not answer BLOB_REQUEST (the test sends the blob) */
    int hold_ready;     /* do not answer START with READY */
    uint8_t rank_state; /* reported for every local rank in heartbeats */
    int blob_requests;
    uint64_t blob_request_gen;
    int starts;
    uint64_t start_gen; /* generation of the last START */
    uint32_t world_size;
    char blob[64]; /* blob of the last START, NUL-terminated */
    int aborts;
    uint64_t abort_gen;
    int32_t abort_rank;
    int32_t abort_code;
    char abort_reason[GANG_REASON_MAX];
    int give_ups;
    char give_up_reason[GANG_REASON_MAX];
    int rejections;
    int32_t reject_code;
    char reject_reason[GANG_REASON_MAX];
} agent;

/*
 * A hand-driven protocol peer on a plain non-blocking socket: it plays a misbehaving
 * member against the real coordinator, or a coordinator against a real member.
 */
typedef struct raw_peer {
    int fd; /* -1 when unused */
    gang_wire_reader *rd;
    gang_msg *msg; /* the message raw_next() took last */
    int closed;    /* EOF or reset seen */
    uint64_t opened_ms, closed_ms;
    int received;          /* messages taken */
    int heartbeats;        /* HEARTBEATs skipped by pred_raw_got() */
    uint64_t last_tx_ms;   /* when this peer last sent a frame */
    uint64_t last_hb_ms;   /* when raw_pump() last sent a heartbeat */
    uint32_t node;         /* node index when playing a member */
    int plays_coordinator; /* raw_pump() only heartbeats (with hb_state), never reads */
    uint32_t hb_state;     /* gang_state a played coordinator reports */
    int alive;             /* raw_pump(): heartbeat (members: and answer START) */
    int hold_ready;        /* a played member records START but does not answer */
    uint64_t start_gen;    /* generation of the last START a played member saw */
    /* Session MACs (docs/protocol.md §5.3): a played member starts them when its WELCOME
     * arrives, a played coordinator with raw_start_session() after sending WELCOME. */
    gang_session sess;
    int await_welcome; /* raw_member_join() sent a signed JOIN; WELCOME starts sess */
    gang_token token;
    uint8_t server_nonce[GANG_NONCE_SIZE], client_nonce[GANG_NONCE_SIZE];
} raw_peer;

#define MAX_RAW 4

struct test_env {
    uv_loop_t loop;
    gang_coord *coord;      /* NULL when not started or closed */
    gang_coord_config ccfg; /* the coordinator's config; tests adjust it first */
    int port;               /* where the coordinator listens */
    agent agents[MAX_AGENTS];
    int raw_fd[16]; /* plain sockets of the tests, -1 when unused */
    raw_peer raw[MAX_RAW];
    void (*pump)(test_env *e); /* runs on every loop turn of run_until / run_holding */
};

/*
 * The blob node 0 produces for generation gen. It names the generation, so a START that
 * carried another generation's blob would show.
 */
static void blob_for(uint64_t gen, char *out, size_t cap)
{
    snprintf(out, cap, "blob-%llu", (unsigned long long)gen);
}

static void agent_on_blob_request(void *ctx, uint64_t gen)
{
    agent *a = ctx;
    char blob[32];

    a->blob_requests++;
    a->blob_request_gen = gen;
    if (a->hold_blob)
        return;
    blob_for(gen, blob, sizeof(blob));
    gang_member_send_blob(a->m, gen, (const uint8_t *)blob, (uint32_t)strlen(blob));
}

static void agent_on_start(void *ctx, uint64_t gen, uint32_t world_size, const uint8_t *blob,
                           uint32_t len)
{
    agent *a = ctx;
    size_t n = len < sizeof(a->blob) - 1 ? len : sizeof(a->blob) - 1;

    a->starts++;
    a->start_gen = gen;
    a->world_size = world_size;
    memcpy(a->blob, blob, n);
    a->blob[n] = '\0';
    if (a->hold_ready)
        return;
    a->rank_state = GANG_RANK_READY;
    gang_member_send_ready(a->m, gen);
}

static void agent_on_abort(void *ctx, uint64_t gen, int32_t rank, int32_t code, const char *reason)
{
    agent *a = ctx;

    a->aborts++;
    a->abort_gen = gen;
    a->abort_rank = rank;
    a->abort_code = code;
    gang_strlcpy(a->abort_reason, reason, sizeof(a->abort_reason));
    /* An agent aborts its workers in place; here they are idle again at once. */
    a->rank_state = GANG_RANK_IDLE;
    gang_member_set_available(a->m, 1);
}

static void agent_on_give_up(void *ctx, const char *reason)
{
    agent *a = ctx;

    a->give_ups++;
    gang_strlcpy(a->give_up_reason, reason, sizeof(a->give_up_reason));
}

static void agent_on_rejected(void *ctx, int32_t code, const char *reason)
{
    agent *a = ctx;

    a->rejections++;
    a->reject_code = code;
    gang_strlcpy(a->reject_reason, reason, sizeof(a->reject_reason));
}

static void agent_fill_heartbeat(void *ctx, gang_msg_heartbeat *hb)
{
    agent *a = ctx;

    hb->nranks = NPROC;
    for (uint32_t l = 0; l < NPROC; l++) {
        hb->rank_state[l] = a->rank_state;
        /* The last local rank reports "never heard", as an agent does for a worker that has
         * no process; the coordinator must pass that on, not age it. */
        hb->rank_age_ms[l] = l == NPROC - 1 ? GANG_HEARTBEAT_NEVER : 1;
    }
}

static void default_coord_config(gang_coord_config *c)
{
    memset(c, 0, sizeof(*c));
    c->bind_address = "127.0.0.1";
    c->port = 0;
    c->job = JOB;
    c->nnodes = NNODES;
    c->nproc_per_node = NPROC;
    c->tp = TP;
    c->pp = PP;
    memset(c->model_digest, 0xA5, sizeof(c->model_digest));
    c->heartbeat_interval_ms = HEARTBEAT_MS;
    c->heartbeat_timeout_ms = TIMEOUT_MS;
    c->handshake_timeout_ms = HANDSHAKE_MS;
    c->start_timeout_ms = 2000;
    c->max_restarts = 10;
    c->restart_window_ms = 60000;
    c->restart_backoff_ms = 5;
    c->restart_backoff_max_ms = 20;
    c->max_connections = 64;
}

/* A member config that matches the coordinator's, for node `node`. */
static void default_member_config(test_env *e, uint32_t node, gang_member_config *mc)
{
    memset(mc, 0, sizeof(*mc));
    mc->coordinator_host = "127.0.0.1";
    mc->coordinator_port = (uint16_t)e->port;
    gang_strlcpy(mc->join.job, JOB, sizeof(mc->join.job));
    mc->join.node_index = node;
    mc->join.nnodes = NNODES;
    mc->join.nproc_per_node = NPROC;
    mc->join.tp = TP;
    mc->join.pp = PP;
    memset(mc->join.model_digest, 0xA5, sizeof(mc->join.model_digest));
    gang_strlcpy(mc->join.host, "127.0.0.1", sizeof(mc->join.host));
    mc->token = e->ccfg.token;
    mc->heartbeat_interval_ms = HEARTBEAT_MS;
    mc->heartbeat_timeout_ms = TIMEOUT_MS;
    mc->connect_timeout_ms = 200;
    mc->backoff_initial_ms = 5;
    mc->backoff_max_ms = 50;
}

static void start_coord(test_env *e)
{
    assert_null(e->coord);
    assert_int_equal(gang_coord_start(&e->loop, &e->ccfg, &e->coord), 0);
    e->port = gang_coord_port(e->coord);
    assert_true(e->port > 0);
}

static void close_coord(test_env *e)
{
    gang_coord_close(e->coord);
    e->coord = NULL;
}

/* Starts agent slot idx with config mc; like a real agent it declares itself available. */
static agent *start_agent_with(test_env *e, int idx, const gang_member_config *mc, int in_gang)
{
    agent *a = &e->agents[idx];
    gang_member_callbacks cb;

    assert_true(idx < MAX_AGENTS);
    assert_null(a->m);
    memset(a, 0, sizeof(*a));
    a->in_gang = in_gang;
    a->rank_state = GANG_RANK_IDLE;
    memset(&cb, 0, sizeof(cb));
    cb.ctx = a;
    cb.on_blob_request = agent_on_blob_request;
    cb.on_start = agent_on_start;
    cb.on_abort = agent_on_abort;
    cb.on_give_up = agent_on_give_up;
    cb.on_rejected = agent_on_rejected;
    cb.fill_heartbeat = agent_fill_heartbeat;
    assert_int_equal(gang_member_start(&e->loop, mc, &cb, &a->m), 0);
    gang_member_set_available(a->m, 1);
    return a;
}

/* Starts agent slot idx as a regular gang member for node `node`. */
static agent *start_member(test_env *e, int idx, uint32_t node)
{
    gang_member_config mc;

    default_member_config(e, node, &mc);
    return start_agent_with(e, idx, &mc, 1);
}

static void close_agent(agent *a)
{
    gang_member_close(a->m);
    a->m = NULL;
    a->in_gang = 0;
}

static gang_coord_status coord_status(test_env *e)
{
    gang_coord_status st;

    gang_coord_get_status(e->coord, &st);
    return st;
}

static gang_member_status member_status(const agent *a)
{
    gang_member_status st;

    gang_member_get_status(a->m, &st);
    return st;
}

/* ---------------------------------------------------------------------------------
 * Driving the loop: every wait has a deadline
 * --------------------------------------------------------------------------------- */

typedef int (*pred_fn)(test_env *e, const void *arg);

/* One turn: libuv callbacks that are due, then the raw peers' pump, if any. */
static void turn(test_env *e)
{
    uv_run(&e->loop, UV_RUN_NOWAIT);
    if (e->pump)
        e->pump(e);
}

/*
 * Runs the loop until pred(e, arg) holds; fails the test, at the caller's line, when it
 * still does not after timeout_ms. The loop is polled (never blocked) so the deadline is
 * always honoured.
 */
static void run_until_at(test_env *e, pred_fn pred, const void *arg, uint64_t timeout_ms,
                         const char *what, const char *file, int line)
{
    uint64_t deadline = gang_now_ms() + timeout_ms;

    while (!pred(e, arg)) {
        if (gang_now_ms() > deadline) {
            print_error("ERROR: timed out after %llu ms waiting for: %s\n",
                        (unsigned long long)timeout_ms, what);
            _fail(file, line);
        }
        turn(e);
        gang_sleep_ms(1);
    }
}

#define run_until(e, pred, arg, timeout_ms, what)                                                  \
    run_until_at(e, pred, arg, timeout_ms, what, __FILE__, __LINE__)

/* Runs the loop for ms milliseconds; fails the test as soon as invariant stops holding. */
static void run_holding_at(test_env *e, uint64_t ms, pred_fn invariant, const void *arg,
                           const char *what, const char *file, int line)
{
    uint64_t end = gang_now_ms() + ms;

    while (gang_now_ms() < end) {
        turn(e);
        if (invariant && !invariant(e, arg)) {
            print_error("ERROR: broken within %llu ms: %s\n", (unsigned long long)ms, what);
            _fail(file, line);
        }
        gang_sleep_ms(1);
    }
}

#define run_holding(e, ms, invariant, arg, what)                                                   \
    run_holding_at(e, ms, invariant, arg, what, __FILE__, __LINE__)

/* The coordinator serves generation *arg and every in-gang agent has started it. */
static int pred_serving(test_env *e, const void *arg)
{
    uint64_t gen = *(const uint64_t *)arg;
    gang_coord_status st = coord_status(e);

    if (st.state != GANG_STATE_SERVING || st.generation != gen)
        return 0;
    for (int i = 0; i < MAX_AGENTS; i++) {
        if (e->agents[i].in_gang && e->agents[i].start_gen != gen)
            return 0;
    }
    return 1;
}

static void wait_serving_at(test_env *e, uint64_t gen, const char *file, int line)
{
    char what[96];

    snprintf(what, sizeof(what), "gang SERVING generation %llu", (unsigned long long)gen);
    run_until_at(e, pred_serving, &gen, WAIT_MS, what, file, line);
}

#define wait_serving(e, gen) wait_serving_at(e, gen, __FILE__, __LINE__)

/* Still SERVING generation *arg with every node present (used as an invariant). */
static int pred_still_serving(test_env *e, const void *arg)
{
    gang_coord_status st = coord_status(e);

    return st.state == GANG_STATE_SERVING && st.generation == *(const uint64_t *)arg &&
           st.members == NNODES;
}

/* Every in-gang agent has seen at least *arg aborts. */
static int pred_all_aborted(test_env *e, const void *arg)
{
    int n = *(const int *)arg;

    for (int i = 0; i < MAX_AGENTS; i++) {
        if (e->agents[i].in_gang && e->agents[i].aborts < n)
            return 0;
    }
    return 1;
}

static void wait_all_aborted_at(test_env *e, int n, const char *file, int line)
{
    run_until_at(e, pred_all_aborted, &n, WAIT_MS, "every member aborted", file, line);
}

#define wait_all_aborted(e, n) wait_all_aborted_at(e, n, __FILE__, __LINE__)

static int pred_all_gave_up(test_env *e, const void *arg)
{
    (void)arg;
    for (int i = 0; i < MAX_AGENTS; i++) {
        if (e->agents[i].in_gang && e->agents[i].give_ups == 0)
            return 0;
    }
    return 1;
}

static int pred_rejected(test_env *e, const void *arg)
{
    (void)e;
    return ((const agent *)arg)->rejections > 0;
}

static int pred_disconnected(test_env *e, const void *arg)
{
    (void)arg;
    for (int i = 0; i < MAX_AGENTS; i++) {
        if (e->agents[i].in_gang && member_status(&e->agents[i]).connected)
            return 0;
    }
    return 1;
}

/* Every in-gang agent has had a START. */
static int pred_agents_started(test_env *e, const void *arg)
{
    (void)arg;
    for (int i = 0; i < MAX_AGENTS; i++) {
        if (e->agents[i].in_gang && e->agents[i].starts == 0)
            return 0;
    }
    return 1;
}

/* The coordinator counts *arg members. */
static int pred_members(test_env *e, const void *arg)
{
    return coord_status(e).members == *(const uint32_t *)arg;
}

/* The coordinator is in state *arg. */
static int pred_state(test_env *e, const void *arg)
{
    return coord_status(e).state == *(const gang_state *)arg;
}

/* Asserts what every in-gang agent saw of generation gen's START. */
static void check_started(test_env *e, uint64_t gen, int starts)
{
    char blob[32];

    blob_for(gen, blob, sizeof(blob));
    for (int i = 0; i < MAX_AGENTS; i++) {
        const agent *a = &e->agents[i];
        if (!a->in_gang)
            continue;
        assert_int_equal(a->starts, starts);
        assert_int_equal(a->start_gen, gen);
        assert_int_equal(a->world_size, WORLD);
        assert_string_equal(a->blob, blob);
        assert_int_equal(member_status(a).generation, gen);
    }
}

/* Starts the coordinator and NNODES members in agent slots 0..NNODES-1; waits for gen 1. */
static void form_gang(test_env *e)
{
    start_coord(e);
    for (uint32_t n = 0; n < NNODES; n++)
        start_member(e, (int)n, n);
    wait_serving(e, 1);
}

/* Has agent a report a failure of rank `rank` in generation gen and waits for gen + 1. */
static void fail_and_reform(test_env *e, agent *a, uint64_t gen, int32_t rank, const char *reason)
{
    assert_int_equal(gang_member_report_failure(a->m, gen, rank, GANG_EIO, reason), 0);
    wait_serving(e, gen + 1);
}

/* ---------------------------------------------------------------------------------
 * Setup and teardown: each test gets a fresh loop and leaves no handle behind
 * --------------------------------------------------------------------------------- */

static int env_setup(void **state)
{
    test_env *e = calloc(1, sizeof(*e));

    if (e == NULL || uv_loop_init(&e->loop) != 0) {
        free(e);
        return -1;
    }
    default_coord_config(&e->ccfg);
    for (size_t i = 0; i < sizeof(e->raw_fd) / sizeof(e->raw_fd[0]); i++)
        e->raw_fd[i] = -1;
    for (int i = 0; i < MAX_RAW; i++)
        e->raw[i].fd = -1;
    *state = e;
    return 0;
}

static void print_handle(uv_handle_t *h, void *arg)
{
    (void)arg;
    print_error("  leaked handle: %s%s\n", uv_handle_type_name(h->type),
                uv_is_closing(h) ? " (closing)" : "");
}

/*
 * Closes every member and the coordinator, then runs the loop until uv_loop_close()
 * succeeds: a handle or request left behind fails the test (and the loop is not freed).
 */
static int env_teardown(void **state)
{
    test_env *e = *state;
    uint64_t deadline;
    int rc;

    for (int i = 0; i < MAX_AGENTS; i++) {
        if (e->agents[i].m)
            close_agent(&e->agents[i]);
    }
    if (e->coord)
        close_coord(e);
    for (size_t i = 0; i < sizeof(e->raw_fd) / sizeof(e->raw_fd[0]); i++) {
        if (e->raw_fd[i] >= 0)
            close(e->raw_fd[i]);
    }
    e->pump = NULL;
    for (int i = 0; i < MAX_RAW; i++) {
        if (e->raw[i].fd >= 0)
            close(e->raw[i].fd);
        gang_wire_reader_free(e->raw[i].rd);
        free(e->raw[i].msg);
    }
    deadline = gang_now_ms() + 5000;
    while ((rc = uv_loop_close(&e->loop)) == UV_EBUSY && gang_now_ms() < deadline) {
        uv_run(&e->loop, UV_RUN_NOWAIT);
        gang_sleep_ms(1);
    }
    if (rc != 0) {
        print_error("teardown: the loop did not close: %s\n", uv_strerror(rc));
        uv_walk(&e->loop, print_handle, NULL);
        return -1;
    }
    free(e);
    return 0;
}

/* ---------------------------------------------------------------------------------
 * Raw protocol peers: plain sockets speaking the wire format by hand
 * --------------------------------------------------------------------------------- */

/* Takes a free raw peer slot for the connected socket fd (made non-blocking here). */
static raw_peer *raw_adopt(test_env *e, int fd)
{
    raw_peer *p = NULL;

    for (int i = 0; i < MAX_RAW && p == NULL; i++) {
        if (e->raw[i].fd < 0 && e->raw[i].rd == NULL)
            p = &e->raw[i];
    }
    if (p == NULL)
        close(fd);
    assert_non_null(p);
    memset(p, 0, sizeof(*p));
    p->fd = fd;
    p->opened_ms = gang_now_ms();
    p->rd = gang_wire_reader_new();
    p->msg = calloc(1, sizeof(*p->msg));
    assert_non_null(p->rd);
    assert_non_null(p->msg);
    assert_int_equal(fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK), 0);
    return p;
}

/* Closes p's socket and frees its slot for the next raw_adopt(). */
static void raw_release(raw_peer *p)
{
    if (p->fd >= 0)
        close(p->fd);
    gang_wire_reader_free(p->rd);
    free(p->msg);
    gang_auth_session_clear(&p->sess);
    p->fd = -1;
    p->rd = NULL;
    p->msg = NULL;
}

/* Connects to 127.0.0.1:port; a loopback connect completes in the kernel's backlog. */
static int connect_local(int port)
{
    struct sockaddr_in sa;
    int fd = socket(AF_INET, SOCK_STREAM, 0);

    assert_true(fd >= 0);
    memset(&sa, 0, sizeof(sa));
    sa.sin_family = AF_INET;
    sa.sin_port = htons((uint16_t)port);
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
        close(fd);
        fail_msg("connect to port %d: %s", port, strerror(errno));
    }
    return fd;
}

static raw_peer *raw_connect(test_env *e)
{
    return raw_adopt(e, connect_local(e->port));
}

/*
 * Opens a non-blocking listening socket on 127.0.0.1 (ephemeral port) in raw_fd[slot] and
 * points e->port at it: the stand-in for a coordinator in member tests.
 */
static int listen_local(test_env *e, int slot)
{
    struct sockaddr_in sa;
    socklen_t salen = sizeof(sa);
    int fd = socket(AF_INET, SOCK_STREAM, 0);

    assert_true(fd >= 0);
    e->raw_fd[slot] = fd;
    memset(&sa, 0, sizeof(sa));
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    assert_int_equal(listen(fd, 16), 0);
    assert_int_equal(getsockname(fd, (struct sockaddr *)&sa, &salen), 0);
    assert_int_equal(fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK), 0);
    e->port = ntohs(sa.sin_port);
    return fd;
}

static int raw_tag_check(void *ctx, const uint8_t *frame, size_t len,
                         const uint8_t tag[GANG_WIRE_TAG_SIZE])
{
    return gang_auth_session_verify(ctx, frame, len, tag);
}

/* Starts p's session MACs from the handshake's nonces (no-op without a token). */
static void raw_start_session(raw_peer *p, const gang_token *t, const uint8_t *server_nonce,
                              const uint8_t *client_nonce, int coordinator_side)
{
    gang_auth_session_start(&p->sess, t, server_nonce, client_nonce, coordinator_side);
    if (p->sess.active)
        gang_wire_reader_set_tag_check(p->rd, raw_tag_check, &p->sess);
}

/* Takes the next whole message into p->msg: 1, or 0 when none is complete yet. */
static int raw_next(raw_peer *p)
{
    uint8_t buf[4096];

    for (;;) {
        int rc = gang_wire_reader_next(p->rd, p->msg);
        if (rc < 0)
            fail_msg("raw peer: bad frame from the other side: %s", gang_strerror(rc));
        if (rc == 1) {
            p->received++;
            if (p->await_welcome && p->msg->type == GANG_MSG_WELCOME) {
                p->await_welcome = 0;
                raw_start_session(p, &p->token, p->server_nonce, p->client_nonce, 0);
            }
            return 1;
        }
        if (p->closed)
            return 0;
        size_t room = gang_wire_reader_space(p->rd);
        ssize_t n = recv(p->fd, buf, room < sizeof(buf) ? room : sizeof(buf), 0);
        if (n > 0) {
            assert_int_equal(gang_wire_reader_feed(p->rd, buf, (size_t)n), 0);
            continue;
        }
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
            return 0;
        p->closed = 1; /* EOF, or a reset: either way the other side hung up */
        p->closed_ms = gang_now_ms();
    }
}

/* Sends bytes as they are (a frame built or tampered with by the test). */
static void raw_send_bytes(raw_peer *p, const uint8_t *data, size_t len)
{
    assert_int_equal(send(p->fd, data, len, MSG_NOSIGNAL), (ssize_t)len);
    p->last_tx_ms = gang_now_ms();
}

/*
 * Encodes m into frame[0..*len), tagged with p's next send sequence number when its
 * session is active (as a real peer would send it).
 */
static void raw_encode(raw_peer *p, const gang_msg *m, uint8_t *frame, size_t cap, size_t *len)
{
    assert_int_equal(gang_wire_encode(m, frame, cap - GANG_WIRE_TAG_SIZE, len), 0);
    if (p->sess.active) {
        assert_int_equal(gang_auth_session_sign(&p->sess, frame, *len, frame + *len), 0);
        *len += GANG_WIRE_TAG_SIZE;
    }
}

static void raw_send_msg(raw_peer *p, const gang_msg *m)
{
    static uint8_t frame[GANG_WIRE_MAX_FRAME];
    size_t len = 0;

    raw_encode(p, m, frame, sizeof(frame), &len);
    raw_send_bytes(p, frame, len);
}

/* A zeroed message of type `type` and generation gen, ready to fill and send. */
static gang_msg *raw_out(uint16_t type, uint64_t gen)
{
    static gang_msg out;

    memset(&out, 0, sizeof(out));
    out.type = type;
    out.generation = gen;
    return &out;
}

typedef struct raw_want {
    raw_peer *p;
    uint16_t type;
} raw_want;

/* A message of the wanted type arrived (heartbeats are counted and skipped). */
static int pred_raw_got(test_env *e, const void *arg)
{
    const raw_want *w = arg;

    (void)e;
    while (raw_next(w->p)) {
        uint16_t t = w->p->msg->type;
        if (t == w->type)
            return 1;
        if (t != GANG_MSG_HEARTBEAT)
            fail_msg("raw peer: expected message type %u, got %u", w->type, t);
        w->p->heartbeats++;
    }
    return 0;
}

static const gang_msg *raw_expect_at(test_env *e, raw_peer *p, uint16_t type, const char *file,
                                     int line)
{
    raw_want w = {p, type};
    char what[64];

    snprintf(what, sizeof(what), "raw peer receives message type %u", type);
    run_until_at(e, pred_raw_got, &w, WAIT_MS, what, file, line);
    return p->msg;
}

#define raw_expect(e, p, type) raw_expect_at(e, p, type, __FILE__, __LINE__)

/* The other side closed the raw peer's connection (messages still in flight are dropped). */
static int pred_raw_peer_closed(test_env *e, const void *arg)
{
    raw_peer *p = (raw_peer *)(uintptr_t)arg;

    (void)e;
    while (raw_next(p))
        ;
    return p->closed;
}

/* Plays a member: answers the CHALLENGE with a JOIN for node `node` (signed if e has a token). */
static void raw_member_join(test_env *e, raw_peer *p, uint32_t node)
{
    uint8_t server_nonce[GANG_NONCE_SIZE];
    gang_msg *j;

    raw_expect(e, p, GANG_MSG_CHALLENGE);
    memcpy(server_nonce, p->msg->u.challenge.nonce, GANG_NONCE_SIZE);
    j = raw_out(GANG_MSG_JOIN, 0);
    gang_strlcpy(j->u.join.job, JOB, sizeof(j->u.join.job));
    j->u.join.node_index = node;
    j->u.join.nnodes = NNODES;
    j->u.join.nproc_per_node = NPROC;
    j->u.join.tp = TP;
    j->u.join.pp = PP;
    memset(j->u.join.model_digest, 0xA5, sizeof(j->u.join.model_digest));
    gang_strlcpy(j->u.join.host, "127.0.0.1", sizeof(j->u.join.host));
    gang_auth_random(j->u.join.client_nonce, GANG_NONCE_SIZE);
    gang_auth_sign_join(&e->ccfg.token, server_nonce, &j->u.join);
    p->node = node;
    p->token = e->ccfg.token;
    memcpy(p->server_nonce, server_nonce, GANG_NONCE_SIZE);
    memcpy(p->client_nonce, j->u.join.client_nonce, GANG_NONCE_SIZE);
    p->await_welcome = 1;
    raw_send_msg(p, j);
}

/*
 * Pump for raw peers (e->pump). An alive one heartbeats every interval; a played member
 * also answers START with READY, like a well-behaved agent. A member that is not alive only
 * reads (so its hang-up is noticed) and never sends. A played coordinator never reads here:
 * the test reads its messages with raw_expect().
 */
static void raw_pump(test_env *e)
{
    for (int i = 0; i < MAX_RAW; i++) {
        raw_peer *p = &e->raw[i];
        if (p->fd < 0 || p->closed)
            continue;
        while (!p->plays_coordinator && raw_next(p)) {
            if (p->msg->type == GANG_MSG_START)
                p->start_gen = p->msg->generation;
            if (p->alive && !p->hold_ready && p->msg->type == GANG_MSG_START) {
                gang_msg *r = raw_out(GANG_MSG_READY, p->msg->generation);
                r->u.ready.node_index = p->node;
                raw_send_msg(p, r);
            }
        }
        if (p->alive && !p->closed && gang_now_ms() - p->last_hb_ms >= HEARTBEAT_MS) {
            gang_msg *hb = raw_out(GANG_MSG_HEARTBEAT, 0);
            if (p->plays_coordinator) {
                hb->u.heartbeat.node_index = UINT32_MAX;
                hb->u.heartbeat.state = p->hb_state;
            } else {
                hb->u.heartbeat.node_index = p->node;
                hb->u.heartbeat.nranks = NPROC;
                for (uint32_t l = 0; l < NPROC; l++)
                    hb->u.heartbeat.rank_state[l] = GANG_RANK_READY;
            }
            raw_send_msg(p, hb);
            p->last_hb_ms = p->last_tx_ms;
        }
    }
}

typedef struct accept_want {
    int lfd; /* listening socket */
    int fd;  /* the accepted connection, -1 until then */
} accept_want;

static int pred_accepted(test_env *e, const void *arg)
{
    accept_want *w = (accept_want *)(uintptr_t)arg;

    (void)e;
    if (w->fd < 0)
        w->fd = accept(w->lfd, NULL, NULL);
    return w->fd >= 0;
}

/* Waits for the next connection on the listening socket lfd and adopts it as a raw peer. */
static raw_peer *raw_accept(test_env *e, int lfd)
{
    accept_want w = {lfd, -1};

    run_until(e, pred_accepted, &w, WAIT_MS, "a member connects");
    return raw_adopt(e, w.fd);
}

/* ---------------------------------------------------------------------------------
 * 1. Formation
 * --------------------------------------------------------------------------------- */

static int pred_members_see_serving(test_env *e, const void *arg)
{
    (void)arg;
    for (int i = 0; i < MAX_AGENTS; i++) {
        const agent *a = &e->agents[i];
        if (a->in_gang && member_status(a).gang_state != GANG_STATE_SERVING)
            return 0;
    }
    return 1;
}

static int pred_ranks_ready(test_env *e, const void *arg)
{
    gang_coord_status st = coord_status(e);

    (void)arg;
    for (uint32_t r = 0; r < st.world_size; r++) {
        if (st.ranks[r].state != GANG_RANK_READY)
            return 0;
    }
    return 1;
}

/* Every rank's age in st is below limit_ms, but the last local rank of each node's, which
 * its agent reports as GANG_HEARTBEAT_NEVER (agent_fill_heartbeat). */
static void check_rank_ages(const gang_coord_status *st, uint64_t limit_ms)
{
    for (uint32_t r = 0; r < st->world_size; r++) {
        if (r % NPROC == NPROC - 1)
            assert_int_equal(st->ranks[r].heartbeat_age_ms, GANG_HEARTBEAT_NEVER);
        else
            assert_true(st->ranks[r].heartbeat_age_ms < limit_ms);
    }
}

/* A real age is clamped below the sentinel, however old. */
static void test_heartbeat_age_clamp(void **state)
{
    (void)state;
    assert_int_equal(gang_heartbeat_age(0), 0);
    assert_int_equal(gang_heartbeat_age(1234), 1234);
    assert_int_equal(gang_heartbeat_age(GANG_HEARTBEAT_NEVER - 1ull), GANG_HEARTBEAT_NEVER - 1u);
    assert_int_equal(gang_heartbeat_age(GANG_HEARTBEAT_NEVER), GANG_HEARTBEAT_NEVER - 1u);
    assert_int_equal(gang_heartbeat_age(UINT64_MAX), GANG_HEARTBEAT_NEVER - 1u);
}

static void test_gang_forms(void **state)
{
    test_env *e = *state;
    gang_coord_status st;
    gang_coord_config cfg2;
    gang_coord *other = NULL;
    uint64_t gen = 1;

    /* No member yet: every rank and a member's coordinator are "never heard". */
    start_coord(e);
    st = coord_status(e);
    assert_int_equal(st.world_size, WORLD);
    for (uint32_t r = 0; r < st.world_size; r++)
        assert_int_equal(st.ranks[r].heartbeat_age_ms, GANG_HEARTBEAT_NEVER);
    for (uint32_t n = 0; n < NNODES; n++) {
        start_member(e, (int)n, n);
        if (n == 0)
            assert_int_equal(member_status(&e->agents[0]).coordinator_heartbeat_age_ms,
                             GANG_HEARTBEAT_NEVER);
    }
    wait_serving(e, 1);
    st = coord_status(e);
    assert_int_equal(st.state, GANG_STATE_SERVING);
    assert_int_equal(st.generation, 1);
    assert_int_equal(st.members, NNODES);
    assert_int_equal(st.world_size, WORLD);
    assert_int_equal(st.restarts_total, 0);
    assert_int_equal(st.budget_left, e->ccfg.max_restarts);
    assert_int_equal(st.last_failure_rank, -1);
    assert_int_equal(st.last_failure_wall_ms, 0);
    assert_true(st.serving_since_wall_ms > 0);
    assert_true(st.rendezvous_seconds >= 0.0 && st.rendezvous_seconds < 3.0);
    check_started(e, 1, 1);

    /* Only node 0 is asked for the bootstrap blob, once. */
    assert_int_equal(e->agents[0].blob_requests, 1);
    assert_int_equal(e->agents[0].blob_request_gen, 1);
    assert_int_equal(e->agents[1].blob_requests, 0);
    assert_int_equal(e->agents[2].blob_requests, 0);
    for (int i = 0; i < (int)NNODES; i++) {
        assert_int_equal(e->agents[i].aborts, 0);
        assert_int_equal(member_status(&e->agents[i]).connected, 1);
        /* A numeric coordinator address is parsed, not looked up (no resolver threads). */
        assert_int_equal(member_status(&e->agents[i]).resolves, 0);
    }

    /* Members learn the gang state from heartbeats; the coordinator sees every rank READY. */
    run_until(e, pred_members_see_serving, NULL, WAIT_MS, "members see SERVING");
    run_until(e, pred_ranks_ready, NULL, WAIT_MS, "every rank READY in the coordinator's view");
    st = coord_status(e);
    check_rank_ages(&st, TIMEOUT_MS * 5);
    for (int i = 0; i < (int)NNODES; i++)
        assert_true(member_status(&e->agents[i]).coordinator_heartbeat_age_ms < TIMEOUT_MS * 5);

    /* A second coordinator cannot take the port; the failed start leaks nothing. */
    cfg2 = e->ccfg;
    cfg2.port = e->port;
    assert_int_equal(gang_coord_start(&e->loop, &cfg2, &other), GANG_EEXIST);

    /* Heartbeats keep the gang together well past the heartbeat timeout. */
    run_holding(e, TIMEOUT_MS * 2, pred_still_serving, &gen, "gang keeps serving generation 1");
    check_started(e, 1, 1);
    for (int i = 0; i < (int)NNODES; i++)
        assert_int_equal(e->agents[i].aborts, 0);
}

/* ---------------------------------------------------------------------------------
 * 2. A member reports a failure: everyone aborts, the gang re-forms in generation 2
 * --------------------------------------------------------------------------------- */

static void test_failure_report(void **state)
{
    test_env *e = *state;
    gang_coord_status st;
    const char *reason = "worker 5 died: signal 9";

    form_gang(e);
    assert_int_equal(gang_member_report_failure(e->agents[2].m, 1, 5, GANG_EIO, reason), 0);
    wait_all_aborted(e, 1);
    for (int i = 0; i < (int)NNODES; i++) {
        const agent *a = &e->agents[i];
        assert_int_equal(a->aborts, 1);
        assert_int_equal(a->abort_gen, 1);
        assert_int_equal(a->abort_rank, 5);
        assert_int_equal(a->abort_code, GANG_EIO);
        assert_string_equal(a->abort_reason, reason);
    }
    wait_serving(e, 2);
    check_started(e, 2, 2);
    assert_int_equal(e->agents[0].blob_requests, 2);
    assert_int_equal(e->agents[0].blob_request_gen, 2);

    st = coord_status(e);
    assert_int_equal(st.restarts_total, 1);
    assert_int_equal(st.budget_left, e->ccfg.max_restarts - 1);
    assert_int_equal(st.last_failure_rank, 5);
    assert_int_equal(st.last_failure_code, GANG_EIO);
    assert_true(st.last_failure_wall_ms > 0);
    assert_string_equal(st.last_failure, reason);
    assert_int_equal(st.members, NNODES);
}

/* ---------------------------------------------------------------------------------
 * 3. A member is lost; a fresh member for the same node brings the gang back
 * --------------------------------------------------------------------------------- */

/* Nothing new may start while a node is missing. */
static int pred_not_started(test_env *e, const void *arg)
{
    gang_coord_status st = coord_status(e);

    (void)arg;
    return st.generation == 1 && st.members == NNODES - 1 &&
           (st.state == GANG_STATE_ABORTING || st.state == GANG_STATE_BACKOFF ||
            st.state == GANG_STATE_WAITING);
}

static void test_lost_member(void **state)
{
    test_env *e = *state;
    gang_coord_status st;
    agent *fresh;

    form_gang(e);
    close_agent(&e->agents[1]);
    wait_all_aborted(e, 1);
    for (int i = 0; i < (int)NNODES; i += 2) {
        assert_int_equal(e->agents[i].abort_gen, 1);
        assert_int_equal(e->agents[i].abort_rank, 1 * NPROC);
        assert_int_equal(e->agents[i].abort_code, GANG_EPEER);
        assert_non_null(strstr(e->agents[i].abort_reason, "node 1"));
    }
    run_holding(e, 100, pred_not_started, NULL, "no generation starts without node 1");
    st = coord_status(e);
    assert_int_equal(st.restarts_total, 1);
    assert_int_equal(st.last_failure_code, GANG_EPEER);

    fresh = start_member(e, 3, 1);
    wait_serving(e, 2);
    assert_int_equal(fresh->starts, 1);
    assert_int_equal(fresh->world_size, WORLD);
    assert_string_equal(fresh->blob, "blob-2");
    assert_int_equal(e->agents[0].starts, 2);
    assert_int_equal(e->agents[2].starts, 2);
    st = coord_status(e);
    assert_int_equal(st.members, NNODES);
    assert_int_equal(st.restarts_total, 1);
}

/* ---------------------------------------------------------------------------------
 * 4. Messages of another generation change nothing
 * --------------------------------------------------------------------------------- */

static void test_stale_generation(void **state)
{
    test_env *e = *state;
    gang_coord_status st;
    uint64_t gen = 2;

    form_gang(e);
    fail_and_reform(e, &e->agents[2], 1, 4, "first failure");

    /* READY, BLOB and ABORT of generation 1 arrive while generation 2 serves. */
    assert_int_equal(gang_member_send_ready(e->agents[0].m, 1), 0);
    assert_int_equal(gang_member_send_blob(e->agents[0].m, 1, (const uint8_t *)"old", 3), 0);
    assert_int_equal(gang_member_report_failure(e->agents[1].m, 1, 2, GANG_EIO, "stale"), 0);
    assert_int_equal(gang_member_report_failure(e->agents[0].m, 1, 0, GANG_EIO, "stale"), 0);
    run_holding(e, 150, pred_still_serving, &gen, "gang keeps serving generation 2");
    st = coord_status(e);
    assert_int_equal(st.restarts_total, 1);
    assert_string_equal(st.last_failure, "first failure");
    for (int i = 0; i < (int)NNODES; i++) {
        assert_int_equal(e->agents[i].aborts, 1);
        assert_int_equal(e->agents[i].starts, 2);
    }

    /* A generation newer than the current one is no more valid than an older one. */
    assert_int_equal(gang_member_report_failure(e->agents[1].m, 7, 2, GANG_EIO, "future"), 0);
    run_holding(e, 50, pred_still_serving, &gen, "a future generation changes nothing");

    /* Control: the same report with the current generation does restart the gang. */
    fail_and_reform(e, &e->agents[1], 2, 2, "current failure");
    st = coord_status(e);
    assert_int_equal(st.restarts_total, 2);
    assert_string_equal(st.last_failure, "current failure");
}

/* ---------------------------------------------------------------------------------
 * 5. A second member claiming a node that is taken is refused for now, and retries
 * --------------------------------------------------------------------------------- */

static void test_duplicate_node(void **state)
{
    test_env *e = *state;
    gang_coord_status st;
    agent *dup;
    uint64_t gen = 1;

    form_gang(e);
    dup = start_member(e, 3, 0);
    dup->in_gang = 0;
    run_holding(e, 300, pred_still_serving, &gen, "gang serves on while a duplicate knocks");
    assert_int_equal(dup->starts, 0);
    assert_int_equal(dup->blob_requests, 0);
    assert_int_equal(dup->aborts, 0);
    assert_int_equal(dup->rejections, 0); /* EDUPLICATE is not final */
    assert_int_equal(member_status(dup).connected, 0);
    st = coord_status(e);
    assert_int_equal(st.restarts_total, 0);
    check_started(e, 1, 1);
    for (int i = 0; i < (int)NNODES; i++)
        assert_int_equal(e->agents[i].aborts, 0);

    /* It kept retrying: when node 0's first member goes, the duplicate takes its place. */
    close_agent(&e->agents[0]);
    dup->in_gang = 1;
    wait_serving(e, 2);
    assert_int_equal(dup->starts, 1);
    assert_int_equal(dup->blob_requests, 1);
    assert_string_equal(dup->blob, "blob-2");
    assert_int_equal(coord_status(e).members, NNODES);
}

/* ---------------------------------------------------------------------------------
 * 6. Members started with another job, shape or model are refused for good
 * --------------------------------------------------------------------------------- */

static void test_mismatch(void **state)
{
    test_env *e = *state;
    gang_coord_status st;
    gang_member_config mc;
    uint64_t gen = 1;
    static const char *const expect[] = {
        "job", "world shape", "world shape", "tp=", "tp=", "model digest", "node index",
    };
    const int nvariants = (int)(sizeof(expect) / sizeof(expect[0]));

    form_gang(e);
    for (int v = 0; v < nvariants; v++) {
        default_member_config(e, 1, &mc);
        switch (v) {
        case 0:
            gang_strlcpy(mc.join.job, "other-job", sizeof(mc.join.job));
            break;
        case 1:
            mc.join.nnodes = NNODES + 1;
            break;
        case 2:
            mc.join.nproc_per_node = NPROC + 1;
            break;
        case 3:
            mc.join.tp = 1;
            mc.join.pp = NNODES * NPROC;
            break;
        case 4:
            mc.join.pp = PP + 1;
            break;
        case 5:
            mc.join.model_digest[7] ^= 1;
            break;
        default:
            mc.join.node_index = NNODES;
            break;
        }
        start_agent_with(e, 3 + v, &mc, 0);
    }
    for (int v = 0; v < nvariants; v++) {
        agent *a = &e->agents[3 + v];
        run_until(e, pred_rejected, a, WAIT_MS, "a mismatched member is rejected");
        assert_int_equal(a->reject_code, GANG_EMISMATCH);
        if (strstr(a->reject_reason, expect[v]) == NULL)
            fail_msg("variant %d: reason '%s' does not mention '%s'", v, a->reject_reason,
                     expect[v]);
    }
    /* Refused for good: they do not retry (a retry would be rejected, and reported, again). */
    run_holding(e, 150, pred_still_serving, &gen, "gang unaffected by mismatched members");
    for (int v = 0; v < nvariants; v++) {
        agent *a = &e->agents[3 + v];
        assert_int_equal(a->rejections, 1);
        assert_int_equal(a->starts, 0);
        assert_int_equal(a->blob_requests, 0);
        assert_int_equal(member_status(a).connected, 0);
    }
    st = coord_status(e);
    assert_int_equal(st.restarts_total, 0);
    assert_int_equal(st.members, NNODES);
    check_started(e, 1, 1);
}

/* ---------------------------------------------------------------------------------
 * 7. Authentication: only members that hold the coordinator's token join
 * --------------------------------------------------------------------------------- */

static void test_auth(void **state)
{
    test_env *e = *state;
    gang_member_config mc;
    gang_coord_status st;
    agent *wrong, *none, *stranger;
    raw_peer *probe;
    gang_state waiting = GANG_STATE_WAITING;

    e->ccfg.token.present = 1;
    memset(e->ccfg.token.key, 0x11, sizeof(e->ccfg.token.key));
    start_coord(e);
    /* The CHALLENGE says a token is required, so a member without one can tell at once. */
    probe = raw_connect(e);
    assert_int_equal(raw_expect(e, probe, GANG_MSG_CHALLENGE)->u.challenge.auth_required, 1);
    start_member(e, 0, 0);
    start_member(e, 1, 1);

    /* Node 2 is free; neither a wrong key nor no token at all may take it. */
    default_member_config(e, 2, &mc);
    memset(mc.token.key, 0x22, sizeof(mc.token.key));
    wrong = start_agent_with(e, 3, &mc, 0);
    default_member_config(e, 2, &mc);
    memset(&mc.token, 0, sizeof(mc.token));
    none = start_agent_with(e, 4, &mc, 0);
    /* The MAC is checked before anything else: a stranger learns nothing of the gang. */
    default_member_config(e, 2, &mc);
    memset(mc.token.key, 0x22, sizeof(mc.token.key));
    gang_strlcpy(mc.join.job, "other-job", sizeof(mc.join.job));
    stranger = start_agent_with(e, 5, &mc, 0);
    run_until(e, pred_rejected, wrong, WAIT_MS, "member with the wrong key rejected");
    run_until(e, pred_rejected, none, WAIT_MS, "member without a token rejected");
    run_until(e, pred_rejected, stranger, WAIT_MS, "stranger rejected");
    assert_int_equal(wrong->reject_code, GANG_EAUTH);
    assert_int_equal(none->reject_code, GANG_EAUTH);
    assert_int_equal(stranger->reject_code, GANG_EAUTH);
    run_holding(e, 100, pred_state, &waiting, "gang waits for node 2");
    st = coord_status(e);
    assert_int_equal(st.members, NNODES - 1);
    assert_int_equal(st.generation, 0);
    assert_int_equal(wrong->rejections, 1);
    assert_int_equal(none->rejections, 1);
    assert_int_equal(wrong->starts, 0);
    assert_int_equal(none->starts, 0);

    /* The right token completes the gang (the coordinator's WELCOME proof verifies too). */
    start_member(e, 2, 2);
    wait_serving(e, 1);
    check_started(e, 1, 1);
    assert_int_equal(coord_status(e).members, NNODES);
}

/* ---------------------------------------------------------------------------------
 * 7b. After a token handshake every frame carries a session tag (protocol.md §5.3)
 *
 * A played member joins with the token, then sends heartbeats that are correctly tagged,
 * or tampered with in one way each: a wrong tag, a modified header, a replay, two frames
 * swapped, a frame tagged for the other direction, no tag at all. Only the first keeps
 * its connection; every other one is closed at once and counted as a rejected frame.
 * --------------------------------------------------------------------------------- */

enum {
    TAG_OK,
    TAG_WRONG,
    TAG_MODIFIED,
    TAG_REPLAYED,
    TAG_REORDERED,
    TAG_REFLECTED,
    TAG_MISSING,
    TAG_NVARIANTS
};

/* The raw peer is still connected; reading verifies the coordinator's tags on the way. */
static int pred_raw_open(test_env *e, const void *arg)
{
    raw_peer *p = (raw_peer *)(uintptr_t)arg;

    (void)e;
    while (raw_next(p))
        ;
    return !p->closed;
}

static void session_variant(test_env *e, int variant)
{
    static uint8_t f1[GANG_WIRE_MAX_FRAME], f2[GANG_WIRE_MAX_FRAME];
    uint64_t rejected_before = coord_status(e).frames_rejected;
    size_t l1 = 0, l2 = 0;
    gang_session other;
    raw_peer *p;
    gang_msg *hb;
    uint64_t t0;

    p = raw_connect(e);
    raw_member_join(e, p, 2);
    raw_expect(e, p, GANG_MSG_WELCOME);
    assert_true(p->sess.active);
    hb = raw_out(GANG_MSG_HEARTBEAT, 0);
    hb->u.heartbeat.node_index = 2;
    hb->u.heartbeat.nranks = NPROC;
    raw_encode(p, hb, f1, sizeof(f1), &l1); /* sequence number 0 */
    raw_encode(p, hb, f2, sizeof(f2), &l2); /* sequence number 1 */
    t0 = gang_now_ms();
    switch (variant) {
    case TAG_OK:
        raw_send_bytes(p, f1, l1);
        raw_send_bytes(p, f2, l2);
        break;
    case TAG_WRONG:
        f1[l1 - 1] ^= 0x01;
        raw_send_bytes(p, f1, l1);
        break;
    case TAG_MODIFIED:
        f1[8] ^= 0x01; /* the generation: still a valid header, but not what was tagged */
        raw_send_bytes(p, f1, l1);
        break;
    case TAG_REPLAYED:
        raw_send_bytes(p, f1, l1);
        raw_send_bytes(p, f1, l1);
        break;
    case TAG_REORDERED:
        raw_send_bytes(p, f2, l2);
        raw_send_bytes(p, f1, l1);
        break;
    case TAG_REFLECTED:
        /* Tagged with the right key and sequence number, but for the other direction. */
        gang_auth_session_start(&other, &e->ccfg.token, p->server_nonce, p->client_nonce, 1);
        assert_int_equal(gang_auth_session_sign(&other, f1, l1 - GANG_WIRE_TAG_SIZE,
                                                f1 + l1 - GANG_WIRE_TAG_SIZE),
                         0);
        gang_auth_session_clear(&other);
        raw_send_bytes(p, f1, l1);
        break;
    default:
        /* Untagged frames as before v2: the next frame's first bytes are read as a tag. */
        raw_send_bytes(p, f1, l1 - GANG_WIRE_TAG_SIZE);
        raw_send_bytes(p, f1, l1 - GANG_WIRE_TAG_SIZE);
        break;
    }
    if (variant == TAG_OK) {
        /* Shorter than the heartbeat timeout: only a rejected frame could close it. */
        run_holding(e, TIMEOUT_MS / 2, pred_raw_open, p, "a correctly tagged member stays");
        assert_int_equal(coord_status(e).members, 1);
        assert_int_equal(coord_status(e).frames_rejected, rejected_before);
        /* CHALLENGE, WELCOME and tagged coordinator heartbeats that verified here. */
        assert_true(p->received >= 3);
    } else {
        run_until(e, pred_raw_peer_closed, p, WAIT_MS, "the coordinator closes on a bad tag");
        if (p->closed_ms - t0 >= TIMEOUT_MS)
            fail_msg("variant %d: closed after %llu ms, not at once", variant,
                     (unsigned long long)(p->closed_ms - t0));
        run_until(e, pred_members, &(uint32_t){0}, WAIT_MS, "the slot is free again");
        assert_int_equal(coord_status(e).frames_rejected, rejected_before + 1);
    }
    raw_release(p);
    run_until(e, pred_members, &(uint32_t){0}, WAIT_MS, "the slot is free again");
}

static void test_session_tags(void **state)
{
    test_env *e = *state;

    e->ccfg.token.present = 1;
    memset(e->ccfg.token.key, 0x11, sizeof(e->ccfg.token.key));
    e->ccfg.heartbeat_timeout_ms = 5000; /* a silent raw member is not what is tested */
    start_coord(e);
    for (int v = 0; v < TAG_NVARIANTS; v++)
        session_variant(e, v);
    assert_int_equal(coord_status(e).state, GANG_STATE_WAITING);
}

/* ---------------------------------------------------------------------------------
 * 8. The restart budget stops a crash loop
 * --------------------------------------------------------------------------------- */

static void test_restart_budget(void **state)
{
    test_env *e = *state;
    gang_coord_status st;
    gang_state failed = GANG_STATE_FAILED;
    char reason[64];
    uint32_t two = NNODES - 1;
    raw_peer *p;
    const gang_msg *m;

    e->ccfg.max_restarts = 2;
    e->ccfg.restart_window_ms = 60000;
    form_gang(e);
    for (uint64_t gen = 1; gen <= 2; gen++) {
        snprintf(reason, sizeof(reason), "crash %llu", (unsigned long long)gen);
        fail_and_reform(e, &e->agents[gen % NNODES], gen, 0, reason);
        st = coord_status(e);
        assert_int_equal(st.restarts_total, gen);
        assert_int_equal(st.budget_left, 2 - gen);
    }
    assert_int_equal(gang_member_report_failure(e->agents[0].m, 3, 1, GANG_EIO, "crash 3"), 0);
    run_until(e, pred_all_gave_up, NULL, WAIT_MS, "every member gets GIVE_UP");
    st = coord_status(e);
    assert_int_equal(st.state, GANG_STATE_FAILED);
    assert_int_equal(st.budget_left, 0);
    assert_int_equal(st.restarts_total, 3);
    assert_int_equal(st.generation, 3);
    assert_string_equal(st.last_failure, "crash 3");
    for (int i = 0; i < (int)NNODES; i++) {
        const agent *a = &e->agents[i];
        assert_int_equal(a->give_ups, 1);
        assert_non_null(strstr(a->give_up_reason, "crash 3"));
        assert_int_equal(a->aborts, 2);
        assert_int_equal(member_status(a).gang_state, GANG_STATE_FAILED);
    }
    /* The gang stays down: nothing restarts, however long we wait. */
    run_holding(e, 150, pred_state, &failed, "gang stays FAILED");
    st = coord_status(e);
    assert_int_equal(st.generation, 3);
    check_started(e, 3, 3);

    /* A node that leaves now is no new failure, and nobody may join a gang that gave up. */
    close_agent(&e->agents[2]);
    run_until(e, pred_members, &two, WAIT_MS, "node 2 has left");
    p = raw_connect(e);
    raw_member_join(e, p, 2);
    m = raw_expect(e, p, GANG_MSG_REJECT);
    assert_int_equal(m->u.reject.code, GANG_EBUDGET);
    run_until(e, pred_raw_peer_closed, p, WAIT_MS, "the refused member is hung up on");
    st = coord_status(e);
    assert_int_equal(st.state, GANG_STATE_FAILED);
    assert_int_equal(st.restarts_total, 3);
    assert_int_equal(st.members, NNODES - 1);
}

/* ---------------------------------------------------------------------------------
 * 9. The coordinator restarts; members rejoin and the generation keeps growing
 * --------------------------------------------------------------------------------- */

static void test_coordinator_restart(void **state)
{
    test_env *e = *state;
    gang_coord_status st;

    form_gang(e);
    fail_and_reform(e, &e->agents[1], 1, 3, "before the restart");
    close_coord(e);
    wait_all_aborted(e, 2);
    for (int i = 0; i < (int)NNODES; i++) {
        const agent *a = &e->agents[i];
        assert_int_equal(a->abort_code, GANG_ECLOSED);
        assert_int_equal(a->abort_gen, 2);
        assert_int_equal(a->abort_rank, -1);
    }
    run_until(e, pred_disconnected, NULL, WAIT_MS, "members notice the lost coordinator");
    /* Members retry (and are refused) while no coordinator listens. */
    run_holding(e, 30, NULL, NULL, "");

    e->ccfg.port = e->port;
    start_coord(e);
    assert_int_equal(e->port, e->ccfg.port);
    /* The new coordinator continues from the highest generation the members served. */
    wait_serving(e, 3);
    check_started(e, 3, 3);
    st = coord_status(e);
    assert_int_equal(st.generation, 3);
    assert_int_equal(st.restarts_total, 0);
    assert_int_equal(st.members, NNODES);
    for (int i = 0; i < (int)NNODES; i++) {
        gang_member_status ms = member_status(&e->agents[i]);
        assert_int_equal(ms.connected, 1);
        assert_int_equal(ms.reconnects, 1);
        assert_int_equal(e->agents[i].aborts, 2);
    }
}

/* ---------------------------------------------------------------------------------
 * 10. Raw clients: silence, garbage and a message before JOIN are closed; the gang serves
 * --------------------------------------------------------------------------------- */

static void test_raw_clients(void **state)
{
    test_env *e = *state;
    raw_peer *silent, *garbage, *early, *extra;
    uint8_t junk[GANG_WIRE_HEADER_SIZE];
    uint64_t gen = 1;
    gang_coord_status st;

    /* Three members and three raw clients fill the connection limit; a fourth is refused. */
    e->ccfg.max_connections = NNODES + 3;
    form_gang(e);
    silent = raw_connect(e);
    garbage = raw_connect(e);
    early = raw_connect(e);
    extra = raw_connect(e);
    run_until(e, pred_raw_peer_closed, extra, WAIT_MS, "connection over the limit closed");
    assert_int_equal(extra->received, 0); /* not even a CHALLENGE */
    assert_true(extra->closed_ms - extra->opened_ms < HANDSHAKE_MS);

    /* Garbage: a bad magic closes the connection at once. */
    memset(junk, 0xFF, sizeof(junk));
    assert_int_equal(send(garbage->fd, junk, sizeof(junk), MSG_NOSIGNAL), (ssize_t)sizeof(junk));
    run_until(e, pred_raw_peer_closed, garbage, WAIT_MS, "garbage client closed");
    assert_true(garbage->closed_ms - garbage->opened_ms < HANDSHAKE_MS);

    /* A valid frame before JOIN, but not JOIN: refused with EPROTO, then closed. */
    raw_expect(e, early, GANG_MSG_CHALLENGE);
    raw_send_msg(early, raw_out(GANG_MSG_HEARTBEAT, 1));
    assert_int_equal(raw_expect(e, early, GANG_MSG_REJECT)->u.reject.code, GANG_EPROTO);
    run_until(e, pred_raw_peer_closed, early, WAIT_MS, "early-message client closed");
    assert_true(early->closed_ms - early->opened_ms < HANDSHAKE_MS);

    /* Silence: one CHALLENGE, then closed once the handshake timeout has passed, not before. */
    assert_int_equal(raw_expect(e, silent, GANG_MSG_CHALLENGE)->u.challenge.auth_required, 0);
    run_until(e, pred_raw_peer_closed, silent, WAIT_MS, "silent client closed");
    assert_true(silent->closed_ms - silent->opened_ms >= HANDSHAKE_MS - 1);
    assert_true(silent->closed_ms - silent->opened_ms < HANDSHAKE_MS + 500);
    assert_int_equal(gang_wire_reader_pending(silent->rd), 0);

    run_holding(e, 30, pred_still_serving, &gen, "gang unaffected by raw clients");
    st = coord_status(e);
    assert_int_equal(st.restarts_total, 0);
    assert_int_equal(st.members, NNODES);
    for (int i = 0; i < (int)NNODES; i++)
        assert_int_equal(e->agents[i].aborts, 0);
}

/* ---------------------------------------------------------------------------------
 * 11. A START that does not reach READY in time fails the generation
 * --------------------------------------------------------------------------------- */

static void test_start_timeout(void **state)
{
    test_env *e = *state;
    gang_coord_status st;
    gang_state starting = GANG_STATE_STARTING;

    e->ccfg.start_timeout_ms = 250;
    start_coord(e);
    for (uint32_t n = 0; n < NNODES; n++)
        start_member(e, (int)n, n);
    e->agents[2].hold_ready = 1;
    run_until(e, pred_state, &starting, WAIT_MS, "generation 1 STARTING");
    run_holding(e, 150, pred_state, &starting, "still STARTING before the start timeout");
    wait_all_aborted(e, 1);
    st = coord_status(e);
    assert_int_equal(st.restarts_total, 1);
    assert_int_equal(st.last_failure_code, GANG_ETIMEDOUT);
    assert_int_equal(st.last_failure_rank, -1);
    assert_non_null(strstr(st.last_failure, "node 2"));
    assert_null(strstr(st.last_failure, "node 0"));
    for (int i = 0; i < (int)NNODES; i++) {
        assert_int_equal(e->agents[i].abort_gen, 1);
        assert_int_equal(e->agents[i].abort_code, GANG_ETIMEDOUT);
    }

    /* Once node 2 answers, generation 2 serves. */
    e->agents[2].hold_ready = 0;
    wait_serving(e, 2);
    check_started(e, 2, 2);
}

/* ---------------------------------------------------------------------------------
 * 12. READY counts only after START
 * --------------------------------------------------------------------------------- */

static void test_early_ready(void **state)
{
    test_env *e = *state;
    raw_peer *p;
    gang_msg *out;
    gang_state starting = GANG_STATE_STARTING;
    char blob[32];

    start_coord(e);
    start_member(e, 0, 0)->hold_blob = 1;
    start_member(e, 1, 1);
    p = raw_connect(e);
    raw_member_join(e, p, 2);
    raw_expect(e, p, GANG_MSG_WELCOME);
    out = raw_out(GANG_MSG_REJOIN, 0);
    out->u.rejoin.node_index = 2;
    raw_send_msg(p, out);
    p->alive = 1;
    p->hold_ready = 1;
    e->pump = raw_pump;
    run_until(e, pred_state, &starting, WAIT_MS, "generation 1 STARTING");

    /* Node 2 claims READY before any START was sent: that must not count. */
    out = raw_out(GANG_MSG_READY, 1);
    out->u.ready.node_index = 2;
    raw_send_msg(p, out);
    run_holding(e, 30, pred_state, &starting, "READY before START changes nothing");
    assert_int_equal(e->agents[0].blob_request_gen, 1);
    blob_for(1, blob, sizeof(blob));
    assert_int_equal(
        gang_member_send_blob(e->agents[0].m, 1, (const uint8_t *)blob, (uint32_t)strlen(blob)), 0);
    run_until(e, pred_agents_started, NULL, WAIT_MS, "START reaches the real members");
    run_holding(e, 100, pred_state, &starting, "still STARTING without node 2's READY");
    assert_int_equal(p->start_gen, 1);

    out = raw_out(GANG_MSG_READY, 1);
    out->u.ready.node_index = 2;
    raw_send_msg(p, out);
    wait_serving(e, 1);
    assert_int_equal(coord_status(e).restarts_total, 0);
}

/* ---------------------------------------------------------------------------------
 * 13. The restart backoff grows with the restarts inside the window
 * --------------------------------------------------------------------------------- */

/* Milliseconds from a failure report of generation gen to generation gen + 1 serving. */
static uint64_t time_restart(test_env *e, uint64_t gen)
{
    uint64_t t0 = gang_now_ms();

    assert_int_equal(gang_member_report_failure(e->agents[1].m, gen, 2, GANG_EIO, "crash"), 0);
    wait_serving(e, gen + 1);
    return gang_now_ms() - t0;
}

static void test_restart_backoff(void **state)
{
    test_env *e = *state;
    uint64_t d1, d2, d3;

    /* Nominal delays 60, 120, 240 ms; each is drawn from [d/2, d]. */
    e->ccfg.restart_backoff_ms = 60;
    e->ccfg.restart_backoff_max_ms = 1000;
    form_gang(e);
    d1 = time_restart(e, 1);
    d2 = time_restart(e, 2);
    d3 = time_restart(e, 3);
    print_message("restart delays: %llu %llu %llu ms\n", (unsigned long long)d1,
                  (unsigned long long)d2, (unsigned long long)d3);
    assert_true(d1 >= 30);
    assert_true(d2 >= 60);
    assert_true(d3 >= 120); /* longer than the first delay could ever be: it grew */
    assert_int_equal(coord_status(e).restarts_total, 3);
}

/* ---------------------------------------------------------------------------------
 * 14. A member that falls silent is dropped after the heartbeat timeout; its replacement,
 *     refused as a duplicate until then, takes the slot
 * --------------------------------------------------------------------------------- */

static void test_silent_member(void **state)
{
    test_env *e = *state;
    raw_peer *p;
    agent *fresh;
    const gang_msg *w;
    gang_msg *out;
    gang_coord_status st;
    uint64_t gen = 1, silent_since;

    start_coord(e);
    start_member(e, 0, 0);
    start_member(e, 1, 1);
    /* Node 2 is a raw member: it heartbeats and answers START while alive. */
    p = raw_connect(e);
    raw_member_join(e, p, 2);
    w = raw_expect(e, p, GANG_MSG_WELCOME);
    assert_int_equal(w->u.welcome.heartbeat_interval_ms, HEARTBEAT_MS);
    assert_int_equal(w->u.welcome.heartbeat_timeout_ms, TIMEOUT_MS);
    out = raw_out(GANG_MSG_REJOIN, 0);
    out->u.rejoin.node_index = 2;
    raw_send_msg(p, out);
    p->alive = 1;
    e->pump = raw_pump;
    wait_serving(e, 1);
    run_holding(e, TIMEOUT_MS * 2, pred_still_serving, &gen, "a heartbeating member stays");

    /*
     * Node 2's Pod is "recreated": a fresh member for node 2 is refused as a duplicate while
     * the old connection lives (docs/protocol.md 6.2), and keeps retrying.
     */
    fresh = start_member(e, 3, 2);
    fresh->in_gang = 0;
    run_holding(e, 100, pred_still_serving, &gen, "the old node 2 still holds the slot");
    assert_int_equal(fresh->starts, 0);

    /* The old one stops sending anything (its connection stays open): dropped after the
     * timeout, which fails generation 1 and frees the slot for the fresh member. */
    p->alive = 0;
    silent_since = p->last_tx_ms;
    wait_all_aborted(e, 1);
    assert_true(gang_now_ms() - silent_since >= TIMEOUT_MS);
    assert_true(gang_now_ms() - silent_since < TIMEOUT_MS + 500);
    for (int i = 0; i < 2; i++) {
        const agent *a = &e->agents[i];
        assert_int_equal(a->abort_gen, 1);
        assert_int_equal(a->abort_rank, 2 * NPROC);
        assert_int_equal(a->abort_code, GANG_EPEER);
        assert_non_null(strstr(a->abort_reason, "node 2"));
        assert_non_null(strstr(a->abort_reason, gang_strerror(GANG_ETIMEDOUT)));
    }
    run_until(e, pred_raw_peer_closed, p, WAIT_MS, "the coordinator hangs up on node 2");
    fresh->in_gang = 1;
    wait_serving(e, 2);
    assert_int_equal(fresh->starts, 1);
    assert_string_equal(fresh->blob, "blob-2");
    st = coord_status(e);
    assert_int_equal(st.members, NNODES);
    assert_int_equal(st.restarts_total, 1);
}

/* ---------------------------------------------------------------------------------
 * 15. The member against a hand-played coordinator: generation fencing and silence
 * --------------------------------------------------------------------------------- */

static void send_challenge(raw_peer *p)
{
    gang_msg *c = raw_out(GANG_MSG_CHALLENGE, 0);

    gang_auth_random(c->u.challenge.nonce, GANG_NONCE_SIZE);
    raw_send_msg(p, c);
}

static void send_start(raw_peer *p, uint64_t gen)
{
    gang_msg *m = raw_out(GANG_MSG_START, gen);

    m->u.blob.world_size = WORLD;
    blob_for(gen, (char *)m->u.blob.data, sizeof(m->u.blob.data));
    m->u.blob.len = (uint32_t)strlen((char *)m->u.blob.data);
    raw_send_msg(p, m);
}

static void test_member_fencing(void **state)
{
    test_env *e = *state;
    int lfd = listen_local(e, 0);
    raw_peer *p, *q;
    const gang_msg *m;
    gang_msg *out;
    agent *a;
    uint8_t zero[GANG_MAC_SIZE] = {0};
    uint64_t silent_since;

    a = start_member(e, 0, 1);
    p = raw_accept(e, lfd);
    send_challenge(p);
    m = raw_expect(e, p, GANG_MSG_JOIN);
    assert_string_equal(m->u.join.job, JOB);
    assert_int_equal(m->u.join.node_index, 1);
    assert_int_equal(m->u.join.nnodes, NNODES);
    assert_int_equal(m->u.join.nproc_per_node, NPROC);
    assert_int_equal(m->u.join.generation_seen, 0);
    assert_memory_equal(m->u.join.mac, zero, GANG_MAC_SIZE); /* no token, no MAC */
    out = raw_out(GANG_MSG_WELCOME, 0);
    out->u.welcome.heartbeat_interval_ms = HEARTBEAT_MS;
    out->u.welcome.heartbeat_timeout_ms = TIMEOUT_MS;
    raw_send_msg(p, out);
    /* From now on the played coordinator heartbeats, until it falls silent below. */
    p->plays_coordinator = 1;
    p->hb_state = GANG_STATE_WAITING;
    p->alive = 1;
    e->pump = raw_pump;
    m = raw_expect(e, p, GANG_MSG_REJOIN);
    assert_int_equal(m->u.rejoin.node_index, 1);
    assert_int_equal(m->generation, 0);
    assert_int_equal(member_status(a).connected, 1);

    send_start(p, 2);
    m = raw_expect(e, p, GANG_MSG_READY);
    assert_int_equal(m->generation, 2);
    assert_int_equal(m->u.ready.node_index, 1);
    assert_int_equal(a->starts, 1);
    assert_int_equal(a->start_gen, 2);
    assert_int_equal(a->world_size, WORLD);
    assert_string_equal(a->blob, "blob-2");

    /* Old (and repeated) START, BLOB_REQUEST and ABORT are ignored; a heartbeat marks the end. */
    send_start(p, 1);
    send_start(p, 2);
    raw_send_msg(p, raw_out(GANG_MSG_BLOB_REQUEST, 1));
    raw_send_msg(p, raw_out(GANG_MSG_ABORT, 1));
    p->hb_state = GANG_STATE_SERVING;
    out = raw_out(GANG_MSG_HEARTBEAT, 2);
    out->u.heartbeat.node_index = UINT32_MAX;
    out->u.heartbeat.state = GANG_STATE_SERVING;
    raw_send_msg(p, out);
    run_until(e, pred_members_see_serving, NULL, WAIT_MS, "member sees SERVING");
    assert_int_equal(a->starts, 1);
    assert_int_equal(a->blob_requests, 0);
    assert_int_equal(a->aborts, 0);
    assert_int_equal(member_status(a).generation, 2);

    /* ABORT of the current generation reaches the agent, which rejoins for the next one. */
    out = raw_out(GANG_MSG_ABORT, 2);
    out->u.abort.rank = 3;
    out->u.abort.code = GANG_EIO;
    gang_strlcpy(out->u.abort.reason, "boom", sizeof(out->u.abort.reason));
    raw_send_msg(p, out);
    m = raw_expect(e, p, GANG_MSG_REJOIN);
    assert_int_equal(m->generation, 2);
    assert_int_equal(a->aborts, 1);
    assert_int_equal(a->abort_gen, 2);
    assert_int_equal(a->abort_rank, 3);
    assert_int_equal(a->abort_code, GANG_EIO);
    assert_string_equal(a->abort_reason, "boom");
    assert_true(p->heartbeats > 0);

    /* The coordinator falls silent: the member gives up on it after the timeout. */
    p->alive = 0;
    silent_since = p->last_tx_ms;
    wait_all_aborted(e, 2);
    assert_true(gang_now_ms() - silent_since >= TIMEOUT_MS);
    assert_true(gang_now_ms() - silent_since < TIMEOUT_MS + 500);
    assert_int_equal(a->abort_code, GANG_ECLOSED);
    assert_int_equal(a->abort_rank, -1);
    assert_int_equal(member_status(a).reconnects, 1);

    /* It reconnects and reports the generation it served, for a coordinator to continue. */
    q = raw_accept(e, lfd);
    q->plays_coordinator = 1;
    send_challenge(q);
    assert_int_equal(raw_expect(e, q, GANG_MSG_JOIN)->u.join.generation_seen, 2);
}

/* ---------------------------------------------------------------------------------
 * 16. A member with a token joins only a coordinator that proves the same token
 * --------------------------------------------------------------------------------- */

/* Drains p until the other side hangs up; fails if a REJOIN (a completed join) shows up. */
static int pred_closed_without_rejoin(test_env *e, const void *arg)
{
    raw_peer *p = (raw_peer *)(uintptr_t)arg;

    (void)e;
    while (raw_next(p)) {
        if (p->msg->type == GANG_MSG_REJOIN)
            fail_msg("the member joined a coordinator that did not prove the token");
    }
    return p->closed;
}

static void test_member_refuses_impostor(void **state)
{
    test_env *e = *state;
    int lfd = listen_local(e, 0);
    uint8_t server_nonce[GANG_NONCE_SIZE], client_nonce[GANG_NONCE_SIZE];
    raw_peer *p;
    const gang_msg *m;
    gang_msg *out;
    agent *a;

    e->ccfg.token.present = 1;
    memset(e->ccfg.token.key, 0x11, sizeof(e->ccfg.token.key));
    a = start_member(e, 0, 0);

    /* An impostor asks for a token it does not hold; the member's JOIN proves the token. */
    p = raw_accept(e, lfd);
    p->plays_coordinator = 1;
    out = raw_out(GANG_MSG_CHALLENGE, 0);
    gang_auth_random(out->u.challenge.nonce, GANG_NONCE_SIZE);
    out->u.challenge.auth_required = 1;
    memcpy(server_nonce, out->u.challenge.nonce, GANG_NONCE_SIZE);
    raw_send_msg(p, out);
    m = raw_expect(e, p, GANG_MSG_JOIN);
    assert_int_equal(gang_auth_verify_join(&e->ccfg.token, server_nonce, &m->u.join), 0);
    raw_send_msg(p, raw_out(GANG_MSG_WELCOME, 0)); /* all-zero MAC: no proof */
    run_until(e, pred_closed_without_rejoin, p, WAIT_MS, "the member hangs up on an impostor");
    assert_int_equal(member_status(a).connected, 0);
    assert_int_equal(a->aborts, 0);

    /* It tries again; this time the coordinator proves the token and the member joins. */
    p = raw_accept(e, lfd);
    p->plays_coordinator = 1;
    out = raw_out(GANG_MSG_CHALLENGE, 0);
    gang_auth_random(out->u.challenge.nonce, GANG_NONCE_SIZE);
    out->u.challenge.auth_required = 1;
    memcpy(server_nonce, out->u.challenge.nonce, GANG_NONCE_SIZE);
    raw_send_msg(p, out);
    m = raw_expect(e, p, GANG_MSG_JOIN);
    memcpy(client_nonce, m->u.join.client_nonce, GANG_NONCE_SIZE);
    out = raw_out(GANG_MSG_WELCOME, 0);
    gang_auth_sign_welcome(&e->ccfg.token, client_nonce, server_nonce, out->u.welcome.mac);
    raw_send_msg(p, out);
    raw_start_session(p, &e->ccfg.token, server_nonce, client_nonce, 1);
    raw_expect(e, p, GANG_MSG_REJOIN);
    assert_int_equal(member_status(a).connected, 1);
}

/* ---------------------------------------------------------------------------------
 * 17. A coordinator that accepts the connection but never speaks is not waited for forever
 *
 * The member's connect deadline also bounds the handshake: a peer that accepts and says
 * nothing (a wedged coordinator, another service on the port) must not hold it forever.
 * --------------------------------------------------------------------------------- */

typedef struct mute_listener {
    int fd;
    int accepted; /* connections taken from the backlog (and kept open) */
} mute_listener;

/* Accepts what is pending, keeping each connection open and silent. */
static int pred_accepted_two(test_env *e, const void *arg)
{
    mute_listener *ml = (mute_listener *)(uintptr_t)arg;
    int fd;

    while ((fd = accept(ml->fd, NULL, NULL)) >= 0) {
        ml->accepted++;
        if (ml->accepted < (int)(sizeof(e->raw_fd) / sizeof(e->raw_fd[0])))
            e->raw_fd[ml->accepted] = fd;
        else
            close(fd);
    }
    return ml->accepted >= 2;
}

static void test_member_handshake_deadline(void **state)
{
    test_env *e = *state;
    mute_listener ml = {-1, 0};
    agent *a;

    /* A plain listening socket: the kernel completes the TCP handshake, nobody answers. */
    ml.fd = listen_local(e, 0);

    /*
     * The member must give up on a handshake that never completes (connect timeout or
     * heartbeat timeout, both 200 ms here) and try again: a second connection must come.
     */
    a = start_member(e, 0, 0);
    run_until(e, pred_accepted_two, &ml, 1500, "the member retries a mute coordinator");
    assert_int_equal(member_status(a).connected, 0);
    assert_int_equal(a->aborts, 0);
}

/* ---------------------------------------------------------------------------------
 * 18. A member adopts the coordinator's heartbeat settings
 *
 * The coordinator drops members by its own heartbeat timeout, so WELCOME's interval and
 * timeout win over the member's configuration. Members configured with 1000/5000 ms send
 * a heartbeat right after WELCOME and after READY, then only every interval: were the
 * settings not adopted, the coordinator (20/200 ms) would drop them 200 ms into SERVING,
 * and a member would notice a silent coordinator only after 5 s.
 * --------------------------------------------------------------------------------- */

#define SLOW_HEARTBEAT_MS 1000u
#define SLOW_TIMEOUT_MS 5000u

/* Agent *arg has seen an abort. */
static int pred_agent_aborted(test_env *e, const void *arg)
{
    (void)e;
    return ((const agent *)arg)->aborts > 0;
}

/* Drains a played coordinator's inbox: at least 5 heartbeats from the member since reset. */
static int pred_raw_five_heartbeats(test_env *e, const void *arg)
{
    raw_peer *p = (raw_peer *)(uintptr_t)arg;

    (void)e;
    while (raw_next(p)) {
        if (p->msg->type != GANG_MSG_HEARTBEAT)
            fail_msg("raw peer: expected heartbeats only, got message type %u", p->msg->type);
        p->heartbeats++;
    }
    return p->heartbeats >= 5;
}

static void slow_member_config(test_env *e, uint32_t node, gang_member_config *mc)
{
    default_member_config(e, node, mc);
    mc->heartbeat_interval_ms = SLOW_HEARTBEAT_MS;
    mc->heartbeat_timeout_ms = SLOW_TIMEOUT_MS;
}

static void test_member_adopts_heartbeat(void **state)
{
    test_env *e = *state;
    gang_member_config mc;
    gang_coord_status st;
    raw_peer *p;
    gang_msg *out;
    agent *a;
    uint64_t gen = 1, silent_since;
    int lfd;

    /* The real coordinator: members with the slow beat stay well past 3x its timeout. */
    start_coord(e);
    for (uint32_t n = 0; n < NNODES; n++) {
        slow_member_config(e, n, &mc);
        start_agent_with(e, (int)n, &mc, 1);
    }
    wait_serving(e, 1);
    run_holding(e, TIMEOUT_MS * 3 + 50, pred_still_serving, &gen,
                "members configured with a slower beat stay in the gang");
    st = coord_status(e);
    assert_int_equal(st.restarts_total, 0);
    assert_int_equal(st.members, NNODES);
    check_rank_ages(&st, TIMEOUT_MS);
    check_started(e, 1, 1);
    for (int i = 0; i < (int)NNODES; i++) {
        gang_member_status ms = member_status(&e->agents[i]);
        assert_int_equal(e->agents[i].aborts, 0);
        assert_int_equal(ms.connected, 1);
        assert_int_equal(ms.reconnects, 0);
    }

    /*
     * A played coordinator: another slow member heartbeats at WELCOME's interval and gives
     * up on the coordinator's silence after WELCOME's timeout, not its own 5 s.
     */
    lfd = listen_local(e, 0);
    slow_member_config(e, 1, &mc);
    a = start_agent_with(e, 3, &mc, 0);
    p = raw_accept(e, lfd);
    send_challenge(p);
    raw_expect(e, p, GANG_MSG_JOIN);
    out = raw_out(GANG_MSG_WELCOME, 0);
    out->u.welcome.heartbeat_interval_ms = HEARTBEAT_MS;
    out->u.welcome.heartbeat_timeout_ms = TIMEOUT_MS;
    raw_send_msg(p, out);
    p->plays_coordinator = 1;
    p->hb_state = GANG_STATE_WAITING;
    p->alive = 1;
    e->pump = raw_pump;
    raw_expect(e, p, GANG_MSG_REJOIN);
    p->heartbeats = 0;
    run_until(e, pred_raw_five_heartbeats, p, 500, "the member heartbeats every 20 ms");

    p->alive = 0;
    silent_since = p->last_tx_ms;
    run_until(e, pred_agent_aborted, a, TIMEOUT_MS + 500,
              "the member gives up on a silent coordinator after 200 ms");
    assert_true(gang_now_ms() - silent_since >= TIMEOUT_MS);
    assert_int_equal(a->abort_code, GANG_ECLOSED);
    assert_int_equal(a->abort_rank, -1);
    assert_int_equal(member_status(a).reconnects, 1);
}

/* ---------------------------------------------------------------------------------
 * 19. A member that does not rejoin after an abort is dropped
 *
 * Node 2 is a raw member that heartbeats (so the silence timeout never drops it) but never
 * sends REJOIN after the abort. The coordinator hangs up on it once start_timeout has
 * passed since the abort, not before; the real members, which rejoined, stay; and a fresh
 * member for node 2 lets the gang re-form in generation 2 without spending another restart.
 * --------------------------------------------------------------------------------- */

#define REJOIN_TIMEOUT_MS 300u

/* ABORTING generation 1 with every node still a member and raw peer *arg still connected. */
static int pred_waiting_for_rejoin(test_env *e, const void *arg)
{
    const raw_peer *p = arg;
    gang_coord_status st = coord_status(e);

    return st.state == GANG_STATE_ABORTING && st.generation == 1 && st.members == NNODES &&
           !p->closed;
}

static void test_no_rejoin_dropped(void **state)
{
    test_env *e = *state;
    raw_peer *p;
    agent *fresh;
    gang_msg *out;
    gang_coord_status st;
    uint32_t two = NNODES - 1;
    uint64_t aborted_at, hold_until, dropped_after;

    e->ccfg.start_timeout_ms = REJOIN_TIMEOUT_MS;
    start_coord(e);
    start_member(e, 0, 0);
    start_member(e, 1, 1);
    p = raw_connect(e);
    raw_member_join(e, p, 2);
    raw_expect(e, p, GANG_MSG_WELCOME);
    out = raw_out(GANG_MSG_REJOIN, 0);
    out->u.rejoin.node_index = 2;
    raw_send_msg(p, out);
    p->alive = 1;
    e->pump = raw_pump;
    wait_serving(e, 1);
    assert_int_equal(p->start_gen, 1);

    /* Node 1 reports a failure; nodes 0 and 1 abort and rejoin, node 2 only heartbeats. */
    aborted_at = gang_now_ms();
    assert_int_equal(gang_member_report_failure(e->agents[1].m, 1, 2, GANG_EIO, "crash"), 0);
    wait_all_aborted(e, 1);
    hold_until = aborted_at + REJOIN_TIMEOUT_MS - 60;
    if (gang_now_ms() < hold_until)
        run_holding(e, hold_until - gang_now_ms(), pred_waiting_for_rejoin, p,
                    "node 2 keeps its slot until the rejoin deadline");
    run_until(e, pred_raw_peer_closed, p, 500, "the coordinator drops node 2");
    dropped_after = p->closed_ms - aborted_at;
    print_message("node 2 dropped %llu ms after the abort\n", (unsigned long long)dropped_after);
    assert_true(dropped_after >= REJOIN_TIMEOUT_MS);
    assert_true(dropped_after < REJOIN_TIMEOUT_MS + 500);

    /* The drop is no new failure: no restart spent, no second abort, nothing starts. */
    run_until(e, pred_members, &two, WAIT_MS, "node 2 has left");
    run_holding(e, 50, pred_not_started, NULL, "no generation starts without node 2");
    st = coord_status(e);
    assert_int_equal(st.restarts_total, 1);
    assert_string_equal(st.last_failure, "crash");
    for (int i = 0; i < 2; i++) {
        gang_member_status ms = member_status(&e->agents[i]);
        assert_int_equal(e->agents[i].aborts, 1);
        assert_int_equal(ms.connected, 1);
        assert_int_equal(ms.reconnects, 0);
    }

    fresh = start_member(e, 2, 2);
    wait_serving(e, 2);
    assert_int_equal(e->agents[0].starts, 2);
    assert_int_equal(e->agents[1].starts, 2);
    assert_int_equal(fresh->starts, 1);
    st = coord_status(e);
    assert_int_equal(st.members, NNODES);
    assert_int_equal(st.restarts_total, 1);
    assert_string_equal(fresh->blob, "blob-2");
}

int gang_test_coordinator(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_heartbeat_age_clamp),
        cmocka_unit_test_setup_teardown(test_gang_forms, env_setup, env_teardown),
        cmocka_unit_test_setup_teardown(test_failure_report, env_setup, env_teardown),
        cmocka_unit_test_setup_teardown(test_lost_member, env_setup, env_teardown),
        cmocka_unit_test_setup_teardown(test_stale_generation, env_setup, env_teardown),
        cmocka_unit_test_setup_teardown(test_duplicate_node, env_setup, env_teardown),
        cmocka_unit_test_setup_teardown(test_mismatch, env_setup, env_teardown),
        cmocka_unit_test_setup_teardown(test_auth, env_setup, env_teardown),
        cmocka_unit_test_setup_teardown(test_session_tags, env_setup, env_teardown),
        cmocka_unit_test_setup_teardown(test_restart_budget, env_setup, env_teardown),
        cmocka_unit_test_setup_teardown(test_coordinator_restart, env_setup, env_teardown),
        cmocka_unit_test_setup_teardown(test_raw_clients, env_setup, env_teardown),
        cmocka_unit_test_setup_teardown(test_start_timeout, env_setup, env_teardown),
        cmocka_unit_test_setup_teardown(test_early_ready, env_setup, env_teardown),
        cmocka_unit_test_setup_teardown(test_restart_backoff, env_setup, env_teardown),
        cmocka_unit_test_setup_teardown(test_silent_member, env_setup, env_teardown),
        cmocka_unit_test_setup_teardown(test_member_fencing, env_setup, env_teardown),
        cmocka_unit_test_setup_teardown(test_member_refuses_impostor, env_setup, env_teardown),
        cmocka_unit_test_setup_teardown(test_member_handshake_deadline, env_setup, env_teardown),
        cmocka_unit_test_setup_teardown(test_member_adopts_heartbeat, env_setup, env_teardown),
        cmocka_unit_test_setup_teardown(test_no_rejoin_dropped, env_setup, env_teardown),
    };

    /* A peer that hangs up while we write must be an error value, not a signal. */
    signal(SIGPIPE, SIG_IGN);
    if (gang_auth_init() != 0)
        return 1;
    return cmocka_run_group_tests_name("coordinator", tests, NULL, NULL);
}
