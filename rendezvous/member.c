/*
 * The member side of the rendezvous, one per agent.
 *
 * It keeps one connection to the coordinator. The coordinator's name is resolved again
 * before every connect (a recreated Pod has a new IP) and failures are retried with
 * bounded exponential backoff and jitter, so Pods may start in any order and DNS records
 * may appear late. After CHALLENGE -> JOIN -> WELCOME the member sends REJOIN whenever
 * its agent says the local ranks are available, forwards BLOB_REQUEST / START / ABORT /
 * GIVE_UP to the agent, and heartbeats every interval. Silence from the coordinator for
 * longer than the heartbeat timeout counts as a lost coordinator: the agent aborts its
 * workers in place (they stay alive) and the member reconnects until it is back.
 */
#include <stdlib.h>
#include <string.h>

#include "conn.h"

typedef struct member_conn {
    gang__conn conn; /* first: conn callbacks cast back */
    gang_member *m;
    uv_connect_t connect_req;
    int connected;
} member_conn;

struct gang_member {
    uv_loop_t *loop;
    gang_member_config cfg;
    char host[GANG_HOST_MAX];
    gang_member_callbacks cb;
    uv_timer_t retry; /* reconnect delay, then the connect deadline */
    uv_timer_t beat;  /* heartbeats and coordinator silence */
    uv_getaddrinfo_t gai;
    int gai_pending;
    member_conn *mc; /* current connection attempt or session */
    int open_handles;
    int closing;

    int welcomed;
    int available; /* agent: local ranks idle and able to join */
    int rejoin_sent;
    int rejected; /* refused for good: stop retrying */
    uint8_t server_nonce[GANG_NONCE_SIZE];
    uint8_t client_nonce[GANG_NONCE_SIZE];
    gang_backoff backoff;
    uint32_t failed_attempts;
    uint64_t resolves; /* name lookups through the resolver (not for a numeric address) */

    gang_state gang_state;
    uint64_t generation; /* generation of the last START */
    uint64_t reconnects;
    uint64_t last_abort_wall_ms;
    uint64_t connected_since_ms;
    gang_msg *scratch;
};

static void schedule_connect(gang_member *m, uint64_t delay_ms);
static void on_beat(uv_timer_t *t);

static void member_unref(gang_member *m)
{
    if (--m->open_handles == 0 && m->closing) {
        free(m->scratch);
        free(m);
    }
}

static void handle_closed(uv_handle_t *h)
{
    member_unref(h->data);
}

static gang_msg *scratch_msg(gang_member *m, uint16_t type)
{
    memset(m->scratch, 0, sizeof(*m->scratch));
    m->scratch->type = type;
    m->scratch->generation = m->generation;
    return m->scratch;
}

static int send_msg(gang_member *m, const gang_msg *msg)
{
    if (m->mc == NULL || !m->welcomed)
        return GANG_ECLOSED;
    return gang__conn_send(&m->mc->conn, msg);
}

/* Sends the local ranks' states now; also used right after WELCOME and READY so the
 * coordinator's view is never older than the state change it reports. */
static void send_heartbeat(gang_member *m)
{
    gang_msg *msg = scratch_msg(m, GANG_MSG_HEARTBEAT);
    if (m->cb.fill_heartbeat)
        m->cb.fill_heartbeat(m->cb.ctx, &msg->u.heartbeat);
    msg->u.heartbeat.node_index = m->cfg.join.node_index;
    send_msg(m, msg);
}

static void send_rejoin_if_due(gang_member *m)
{
    if (!m->welcomed || !m->available || m->rejoin_sent)
        return;
    gang_msg *msg = scratch_msg(m, GANG_MSG_REJOIN);
    msg->u.rejoin.node_index = m->cfg.join.node_index;
    if (send_msg(m, msg) == 0)
        m->rejoin_sent = 1;
}

/* Tells the agent that the current generation is over because the coordinator is gone. */
static void coordinator_lost(gang_member *m, const char *why)
{
    m->last_abort_wall_ms = gang_wall_ms();
    m->gang_state = GANG_STATE_WAITING;
    m->available = 0;
    m->rejoin_sent = 0;
    m->reconnects++;
    gang_warn("member: lost the coordinator (%s); aborting local ranks in place and "
              "reconnecting",
              why);
    if (m->cb.on_abort)
        m->cb.on_abort(m->cb.ctx, m->generation, -1, GANG_ECLOSED, why);
}

static void mc_on_close(gang__conn *conn, int err)
{
    member_conn *mc = (member_conn *)conn;
    gang_member *m = mc->m;
    int was_welcomed = m->mc == mc && m->welcomed;
    if (m->mc == mc) {
        m->mc = NULL;
        m->welcomed = 0;
    }
    free(mc);
    if (m->closing) {
        member_unref(m);
        return;
    }
    if (was_welcomed)
        coordinator_lost(m, err ? gang_strerror(err) : "connection closed");
    /* The connection's reference goes last: m is not touched after it. */
    if (!m->rejected)
        schedule_connect(m, was_welcomed ? 0 : gang_backoff_next(&m->backoff));
    member_unref(m);
}

static void on_challenge(gang_member *m, const gang_msg *msg)
{
    if (msg->u.challenge.auth_required && !m->cfg.token.present) {
        m->rejected = 1;
        gang_error("member: the coordinator requires a token; pass --token-file");
        if (m->cb.on_rejected)
            m->cb.on_rejected(m->cb.ctx, GANG_EAUTH, "coordinator requires a token");
        gang__conn_close(&m->mc->conn, GANG_EAUTH);
        return;
    }
    memcpy(m->server_nonce, msg->u.challenge.nonce, GANG_NONCE_SIZE);
    gang_auth_random(m->client_nonce, GANG_NONCE_SIZE);
    gang_msg *j = scratch_msg(m, GANG_MSG_JOIN);
    j->u.join = m->cfg.join;
    j->u.join.generation_seen = m->generation;
    memcpy(j->u.join.client_nonce, m->client_nonce, GANG_NONCE_SIZE);
    gang_auth_sign_join(&m->cfg.token, m->server_nonce, &j->u.join);
    gang__conn_send(&m->mc->conn, j);
}

static void on_welcome(gang_member *m, const gang_msg *msg)
{
    if (m->cfg.token.present &&
        gang_auth_verify_welcome(&m->cfg.token, m->client_nonce, m->server_nonce,
                                 msg->u.welcome.mac) != 0) {
        gang_error("member: the coordinator at %s failed to prove the token: not joining",
                   m->mc->conn.peer);
        gang__conn_close(&m->mc->conn, GANG_EAUTH);
        return;
    }
    /* WELCOME was the last untagged frame: both directions are tagged from here on. */
    gang__conn_start_session(&m->mc->conn, &m->cfg.token, m->server_nonce, m->client_nonce, 0);
    m->welcomed = 1;
    uv_timer_stop(&m->retry);
    /* The coordinator's heartbeat settings win: it drops members by its own timeout. */
    uint64_t iv = msg->u.welcome.heartbeat_interval_ms;
    uint64_t to = msg->u.welcome.heartbeat_timeout_ms;
    if (iv && to > iv &&
        (iv != m->cfg.heartbeat_interval_ms || to != m->cfg.heartbeat_timeout_ms)) {
        gang_warn("member: adopting the coordinator's heartbeat settings %llu/%llu ms "
                  "(configured here: %llu/%llu ms)",
                  (unsigned long long)iv, (unsigned long long)to,
                  (unsigned long long)m->cfg.heartbeat_interval_ms,
                  (unsigned long long)m->cfg.heartbeat_timeout_ms);
        m->cfg.heartbeat_interval_ms = iv;
        m->cfg.heartbeat_timeout_ms = to;
        uv_timer_start(&m->beat, on_beat, iv, iv);
    }
    m->failed_attempts = 0;
    gang_backoff_reset(&m->backoff);
    m->connected_since_ms = gang_now_ms();
    gang_info("member: joined the coordinator at %s as node %u (its generation %llu)",
              m->mc->conn.peer, m->cfg.join.node_index,
              (unsigned long long)msg->u.welcome.generation);
    send_heartbeat(m);
    send_rejoin_if_due(m);
}

/*
 * A REJECT of the coordinator. A wrong token or shape is final (on_rejected: exit 64); a
 * spent restart budget is final too and ends this node as GIVE_UP does (on_give_up: exit
 * 75 after the linger): a member that was not connected when the gang gave up (dropped
 * for silence, as node 0's own member is when its agent's loop stalls) learns it only
 * this way, and retrying would keep the agent up and answering probes forever. The rest
 * (a duplicate node while the old connection is being dropped) is retried. Loop thread.
 */
static void on_reject(gang_member *m, const gang_msg *msg)
{
    int32_t code = msg->u.reject.code;
    if (code == GANG_EBUDGET) {
        m->gang_state = GANG_STATE_FAILED;
        m->rejected = 1;
        gang_error("member: the gang gave up: %s", msg->u.reject.reason);
        if (m->cb.on_give_up)
            m->cb.on_give_up(m->cb.ctx, msg->u.reject.reason);
    } else if (code == GANG_EAUTH || code == GANG_EMISMATCH) {
        m->rejected = 1;
        gang_error("member: the coordinator refused this node for good: %s (%s)",
                   msg->u.reject.reason, gang_err_name(code));
        if (m->cb.on_rejected)
            m->cb.on_rejected(m->cb.ctx, code, msg->u.reject.reason);
    } else {
        gang_warn("member: the coordinator refused this node for now: %s (%s); retrying",
                  msg->u.reject.reason, gang_err_name(code));
    }
}

static void mc_on_msg(gang__conn *conn, const gang_msg *msg)
{
    member_conn *mc = (member_conn *)conn;
    gang_member *m = mc->m;
    if (!m->welcomed) {
        if (msg->type == GANG_MSG_CHALLENGE)
            on_challenge(m, msg);
        else if (msg->type == GANG_MSG_WELCOME)
            on_welcome(m, msg);
        else if (msg->type == GANG_MSG_REJECT)
            on_reject(m, msg);
        else
            gang__conn_close(conn, GANG_EPROTO);
        return;
    }
    switch (msg->type) {
    case GANG_MSG_HEARTBEAT:
        m->gang_state = (gang_state)msg->u.heartbeat.state;
        return;
    case GANG_MSG_BLOB_REQUEST:
        if (msg->generation <= m->generation)
            goto out_stale;
        if (m->cb.on_blob_request)
            m->cb.on_blob_request(m->cb.ctx, msg->generation);
        return;
    case GANG_MSG_START:
        if (msg->generation <= m->generation)
            goto out_stale;
        m->generation = msg->generation;
        gang_log_set_generation((int64_t)m->generation);
        m->gang_state = GANG_STATE_STARTING;
        m->available = 0;
        m->rejoin_sent = 0;
        if (m->cb.on_start)
            m->cb.on_start(m->cb.ctx, msg->generation, msg->u.blob.world_size, msg->u.blob.data,
                           msg->u.blob.len);
        return;
    case GANG_MSG_ABORT:
        if (msg->generation < m->generation)
            goto out_stale;
        m->last_abort_wall_ms = gang_wall_ms();
        m->gang_state = GANG_STATE_ABORTING;
        m->available = 0;
        m->rejoin_sent = 0;
        gang_warn("member: ABORT of generation %llu: rank %d: %s",
                  (unsigned long long)msg->generation, msg->u.abort.rank, msg->u.abort.reason);
        if (m->cb.on_abort)
            m->cb.on_abort(m->cb.ctx, msg->generation, msg->u.abort.rank, msg->u.abort.code,
                           msg->u.abort.reason);
        return;
    case GANG_MSG_GIVE_UP:
        m->gang_state = GANG_STATE_FAILED;
        m->rejected = 1;
        gang_error("member: the gang gave up: %s", msg->u.give_up.reason);
        if (m->cb.on_give_up)
            m->cb.on_give_up(m->cb.ctx, msg->u.give_up.reason);
        return;
    case GANG_MSG_REJECT:
        on_reject(m, msg);
        gang__conn_close(conn, msg->u.reject.code);
        return;
    case GANG_MSG_API:
        if (m->cb.on_api)
            m->cb.on_api(m->cb.ctx, msg->generation, msg->u.api.data, msg->u.api.len);
        return;
    default:
        gang_warn("member: unexpected message type %u from the coordinator", msg->type);
        return;
    }
out_stale:
    gang_warn("member: ignoring stale message type %u of generation %llu (current %llu)", msg->type,
              (unsigned long long)msg->generation, (unsigned long long)m->generation);
}

static void on_connect(uv_connect_t *req, int status)
{
    member_conn *mc = req->data;
    gang_member *m = mc->m;
    if (status < 0) {
        if (m->failed_attempts++ % 20 == 0)
            gang_info("member: connect to %s:%u failed: %s; retrying", m->host,
                      m->cfg.coordinator_port, uv_strerror(status));
        gang__conn_close(&mc->conn, gang__uv_err(status));
        return;
    }
    mc->connected = 1;
    /* The connect deadline keeps running: it also bounds CHALLENGE -> JOIN -> WELCOME. */
    if (gang__conn_start(&mc->conn) != 0)
        gang__conn_close(&mc->conn, GANG_EIO);
}

/*
 * The connect deadline covers the TCP connect (a SYN into a black hole must not wait for
 * the kernel's minutes) and the handshake (a peer that accepts and never speaks, or stalls
 * after JOIN, must not hold the member forever).
 */
static void on_connect_deadline(uv_timer_t *t)
{
    gang_member *m = t->data;
    if (m->mc && !m->welcomed) {
        gang_info("member: %s to %s:%u timed out", m->mc->connected ? "handshake" : "connect",
                  m->host, m->cfg.coordinator_port);
        gang__conn_close(&m->mc->conn, GANG_ETIMEDOUT);
    }
}

/* Opens the connection attempt to the coordinator at sa (the connect deadline starts). */
static void member_connect_to(gang_member *m, const struct sockaddr *sa)
{
    member_conn *mc = calloc(1, sizeof(*mc));
    if (mc == NULL || gang__conn_init(m->loop, &mc->conn, m, mc_on_msg, mc_on_close) != 0) {
        free(mc);
        schedule_connect(m, gang_backoff_next(&m->backoff));
        return;
    }
    mc->m = m;
    mc->connect_req.data = mc;
    m->mc = mc;
    m->open_handles++;
    int rc = uv_tcp_connect(&mc->connect_req, &mc->conn.tcp, sa, on_connect);
    if (rc != 0) {
        gang__conn_close(&mc->conn, gang__uv_err(rc));
        return;
    }
    uv_timer_start(&m->retry, on_connect_deadline, m->cfg.connect_timeout_ms, 0);
}

static void on_resolved(uv_getaddrinfo_t *req, int status, struct addrinfo *res)
{
    gang_member *m = req->data;
    m->gai_pending = 0;
    if (m->closing) {
        uv_freeaddrinfo(res);
        member_unref(m);
        return;
    }
    member_unref(m);
    if (status < 0 || res == NULL) {
        if (m->failed_attempts++ % 20 == 0)
            gang_info("member: coordinator name %s does not resolve yet (%s); retrying with "
                      "backoff",
                      m->host, uv_strerror(status));
        uv_freeaddrinfo(res);
        schedule_connect(m, gang_backoff_next(&m->backoff));
        return;
    }
    member_connect_to(m, res->ai_addr);
    uv_freeaddrinfo(res);
}

/*
 * Resolves the coordinator's name afresh and connects: called for every attempt. A
 * numeric address (local mode, --coordinator IP:PORT) needs no resolver: it is parsed in
 * place, so the agent does not start libuv's resolver thread pool (four threads per
 * agent, on the start-up path of every node; issue #14).
 */
static void on_retry(uv_timer_t *t)
{
    gang_member *m = t->data;
    if (m->closing || m->mc || m->gai_pending || m->rejected)
        return;
    struct sockaddr_storage ss;
    if (uv_ip4_addr(m->host, (int)m->cfg.coordinator_port, (struct sockaddr_in *)&ss) == 0 ||
        uv_ip6_addr(m->host, (int)m->cfg.coordinator_port, (struct sockaddr_in6 *)&ss) == 0) {
        member_connect_to(m, (const struct sockaddr *)&ss);
        return;
    }
    char port[8];
    snprintf(port, sizeof(port), "%u", m->cfg.coordinator_port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
    m->gai.data = m;
    m->gai_pending = 1;
    m->resolves++;
    m->open_handles++;
    int rc = uv_getaddrinfo(m->loop, &m->gai, on_resolved, m->host, port, &hints);
    if (rc != 0) {
        m->gai_pending = 0;
        member_unref(m);
        schedule_connect(m, gang_backoff_next(&m->backoff));
    }
}

static void schedule_connect(gang_member *m, uint64_t delay_ms)
{
    if (m->closing || m->rejected)
        return;
    uv_timer_start(&m->retry, on_retry, delay_ms, 0);
}

static void on_beat(uv_timer_t *t)
{
    gang_member *m = t->data;
    if (m->mc == NULL || !m->welcomed)
        return;
    uint64_t silent = gang_now_ms() - m->mc->conn.last_rx_ms;
    if (silent > m->cfg.heartbeat_timeout_ms) {
        gang_warn("member: coordinator silent for %llu ms", (unsigned long long)silent);
        gang__conn_close(&m->mc->conn, GANG_ETIMEDOUT);
        return;
    }
    send_heartbeat(m);
}

int gang_member_start(void *uv_loop, const gang_member_config *cfg, const gang_member_callbacks *cb,
                      gang_member **out)
{
    gang_member *m = calloc(1, sizeof(*m));
    if (m == NULL)
        return GANG_ENOMEM;
    m->scratch = calloc(1, sizeof(*m->scratch));
    if (m->scratch == NULL) {
        free(m);
        return GANG_ENOMEM;
    }
    m->loop = uv_loop;
    m->cfg = *cfg;
    gang_strlcpy(m->host, cfg->coordinator_host, sizeof(m->host));
    m->cfg.coordinator_host = m->host;
    m->cb = *cb;
    m->gang_state = GANG_STATE_WAITING;
    gang_backoff_init(&m->backoff, cfg->backoff_initial_ms, cfg->backoff_max_ms,
                      gang_now_ns() ^ ((uint64_t)cfg->join.node_index << 32));
    uv_timer_init(m->loop, &m->retry);
    uv_timer_init(m->loop, &m->beat);
    m->retry.data = m;
    m->beat.data = m;
    m->open_handles = 2;
    uv_timer_start(&m->beat, on_beat, cfg->heartbeat_interval_ms, cfg->heartbeat_interval_ms);
    schedule_connect(m, 0);
    *out = m;
    return 0;
}

void gang_member_close(gang_member *m)
{
    if (m == NULL || m->closing)
        return;
    m->closing = 1;
    if (m->gai_pending)
        uv_cancel((uv_req_t *)&m->gai);
    if (m->mc)
        gang__conn_close(&m->mc->conn, 0);
    uv_close((uv_handle_t *)&m->retry, handle_closed);
    uv_close((uv_handle_t *)&m->beat, handle_closed);
}

void gang_member_set_available(gang_member *m, int available)
{
    m->available = available;
    if (!available)
        m->rejoin_sent = 0;
    send_rejoin_if_due(m);
}

int gang_member_send_blob(gang_member *m, uint64_t gen, const uint8_t *blob, uint32_t len)
{
    if (len > GANG_BLOB_MAX)
        return GANG_EINVAL;
    gang_msg *msg = scratch_msg(m, GANG_MSG_BLOB);
    msg->generation = gen;
    msg->u.blob.len = len;
    memcpy(msg->u.blob.data, blob, len);
    return send_msg(m, msg);
}

int gang_member_send_ready(gang_member *m, uint64_t gen)
{
    gang_msg *msg = scratch_msg(m, GANG_MSG_READY);
    msg->generation = gen;
    msg->u.ready.node_index = m->cfg.join.node_index;
    int rc = send_msg(m, msg);
    if (rc == 0)
        send_heartbeat(m);
    return rc;
}

int gang_member_report_failure(gang_member *m, uint64_t gen, int32_t rank, int32_t code,
                               const char *reason)
{
    gang_msg *msg = scratch_msg(m, GANG_MSG_ABORT);
    msg->generation = gen;
    msg->u.abort.rank = rank;
    msg->u.abort.code = code;
    gang_strlcpy(msg->u.abort.reason, reason, sizeof(msg->u.abort.reason));
    return send_msg(m, msg);
}

int gang_member_send_api(gang_member *m, uint64_t gen, const uint8_t *data, uint32_t len)
{
    if (len > GANG_API_FRAME_MAX)
        return GANG_EINVAL;
    if (m->mc == NULL || !m->welcomed)
        return GANG_ECLOSED;
    gang_msg *msg = scratch_msg(m, GANG_MSG_API);
    msg->generation = gen;
    msg->u.api.len = len;
    memcpy(msg->u.api.data, data, len);
    return gang__conn_send_api(&m->mc->conn, msg);
}

void gang_member_get_status(const gang_member *m, gang_member_status *st)
{
    memset(st, 0, sizeof(*st));
    st->connected = m->welcomed;
    st->gang_state = m->gang_state;
    st->generation = m->generation;
    st->coordinator_heartbeat_age_ms =
        m->mc && m->welcomed ? gang_heartbeat_age(gang_now_ms() - m->mc->conn.last_rx_ms)
                             : GANG_HEARTBEAT_NEVER;
    st->reconnects = m->reconnects;
    st->last_abort_wall_ms = m->last_abort_wall_ms;
    st->resolves = m->resolves;
    st->connected_since_ms = m->welcomed ? m->connected_since_ms : 0;
}
