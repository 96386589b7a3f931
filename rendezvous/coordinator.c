/*
 * The gang coordinator (inside agent 0).
 *
 * Membership is a table of nnodes slots. A slot is filled by an authenticated JOIN and
 * emptied when its connection closes or falls silent. The gang moves through:
 *
 *   WAITING --all slots filled and available--> STARTING --READY from all--> SERVING
 *      ^                                          |  (BLOB_REQUEST to node 0,    |
 *      |                                          |   START with its blob)       |
 *      +--- ABORTING <--------- any failure ------+------------------------------+
 *              |  (ABORT broadcast; members abort in place and REJOIN)
 *              +--all available--> BACKOFF --delay over--> STARTING (generation + 1)
 *
 * "Available" means the member sent REJOIN: its workers are idle and can join a new
 * generation. A failure is a lost or silent member, an ABORT report from a member, or a
 * START that did not reach READY within the start timeout. Each failure spends one
 * restart of the budget (max_restarts within restart_window); when it is spent the gang
 * goes FAILED and every member gets GIVE_UP. Messages that carry an older generation than
 * the current one are logged and ignored: they cannot move the state machine.
 */
#include <stdlib.h>
#include <string.h>

#include "conn.h"

typedef struct coord_peer coord_peer;

typedef struct node_slot {
    coord_peer *peer;            /* authenticated member connection, or NULL */
    int available;               /* REJOIN received since the last START / ABORT */
    int ready;                   /* READY for the current generation */
    uint64_t generation_seen;    /* highest generation the member reported */
    gang_msg_heartbeat hb;       /* last heartbeat from the member */
    uint64_t hb_rx_ms;           /* when it arrived (monotonic) */
    uint64_t rejoin_deadline_ms; /* REJOIN due by then after an abort; 0 = no deadline */
} node_slot;

struct coord_peer {
    gang__conn conn; /* first: conn callbacks cast back to the peer */
    gang_coord *coord;
    int joined;    /* passed JOIN validation */
    uint32_t node; /* slot index once joined */
    uint8_t server_nonce[GANG_NONCE_SIZE];
    coord_peer *prev, *next;
};

struct gang_coord {
    uv_loop_t *loop;
    gang_log_limit peer_log; /* warnings an unjoined peer causes (a flood: a few per window) */
    uv_tcp_t listener;
    uv_timer_t tick;  /* deadlines: handshakes, silence, start, backoff */
    uv_timer_t beat;  /* heartbeats to members */
    int open_handles; /* closed handles still pending; free at 0 */
    int closing;
    gang_coord_config cfg;
    char job[GANG_JOB_MAX];
    int port;

    coord_peer *peers; /* every live connection, joined or not */
    uint32_t npeers;
    uint64_t refused;           /* connections closed at once over max_connections */
    node_slot *slots;           /* nnodes */
    uint32_t world;             /* nnodes * nproc_per_node */
    gang_coord_rank *rank_view; /* world, rebuilt for status */

    gang_state state;
    uint64_t generation;
    int blob_sent; /* START sent for the current generation */
    uint64_t start_deadline_ms;
    uint64_t backoff_until_ms;
    gang_backoff backoff;
    uint64_t restarts_total;
    uint64_t *restart_ms; /* ring of the last max_restarts+1 restart times */
    uint32_t restart_head;
    uint64_t round_start_ms; /* start of the current (re)formation round */
    double rendezvous_seconds;
    double formation_seconds;    /* last time from BLOB_REQUEST (all members in) to SERVING */
    uint64_t formation_start_ms; /* when the current generation's BLOB_REQUEST went out */
    uint32_t n_ready;            /* slots that sent READY for the current generation */
    uint32_t n_avail;            /* slots whose member is available (REJOIN or JOIN) */
    uint64_t serving_since_wall_ms;
    int32_t last_failure_rank, last_failure_code;
    uint64_t last_failure_wall_ms;
    char last_failure[GANG_REASON_MAX];
    gang_msg *scratch;        /* outgoing message builder */
    uint64_t frames_rejected; /* connections closed for a bad session tag */
};

static void coord_fail(gang_coord *c, int32_t rank, int32_t code, const char *reason);
static void on_beat(uv_timer_t *t);

static gang_msg *scratch_msg(gang_coord *c, uint16_t type)
{
    memset(c->scratch, 0, sizeof(*c->scratch));
    c->scratch->type = type;
    c->scratch->generation = c->generation;
    return c->scratch;
}

/* Drops one reference held by an open handle; the last one after close frees c. */
static void coord_unref(gang_coord *c)
{
    if (--c->open_handles == 0 && c->closing) {
        free(c->slots);
        free(c->rank_view);
        free(c->restart_ms);
        free(c->scratch);
        free(c);
    }
}

static void handle_closed(uv_handle_t *h)
{
    coord_unref(h->data);
}

static void broadcast(gang_coord *c, const gang_msg *m)
{
    for (uint32_t i = 0; i < c->cfg.nnodes; i++) {
        if (c->slots[i].peer)
            gang__conn_send(&c->slots[i].peer->conn, m);
    }
}

static void set_state(gang_coord *c, gang_state s)
{
    if (c->state != s)
        gang_info("coordinator: gang %s -> %s (generation %llu)", gang_state_name(c->state),
                  gang_state_name(s), (unsigned long long)c->generation);
    c->state = s;
}

/* Restarts inside the sliding window, counting the ring's recorded times. */
static uint32_t restarts_in_window(gang_coord *c, uint64_t now)
{
    uint32_t n = 0, cap = c->cfg.max_restarts + 1;
    for (uint32_t i = 0; i < cap; i++) {
        if (c->restart_ms[i] && now - c->restart_ms[i] < c->cfg.restart_window_ms)
            n++;
    }
    return n;
}

/*
 * Begins generation G = max(current, highest reported) + 1: asks node 0 for the bootstrap
 * blob; START follows when it arrives. The start deadline covers both steps.
 */
static void begin_generation(gang_coord *c)
{
    uint64_t g = c->generation;
    for (uint32_t i = 0; i < c->cfg.nnodes; i++) {
        if (c->slots[i].generation_seen > g)
            g = c->slots[i].generation_seen;
        c->slots[i].ready = 0;
        c->slots[i].available = 0;
    }
    c->n_avail = 0;
    c->generation = g + 1;
    gang_log_set_generation((int64_t)c->generation);
    c->blob_sent = 0;
    c->n_ready = 0;
    c->formation_start_ms = gang_now_ms();
    c->start_deadline_ms = gang_now_ms() + c->cfg.start_timeout_ms;
    set_state(c, GANG_STATE_STARTING);
    gang_msg *m = scratch_msg(c, GANG_MSG_BLOB_REQUEST);
    m->u.blob.world_size = c->world;
    gang__conn_send(&c->slots[0].peer->conn, m);
}

/* Starts the next generation once every slot is filled by an available member. */
static void maybe_begin(gang_coord *c)
{
    if (c->state != GANG_STATE_WAITING && c->state != GANG_STATE_ABORTING &&
        c->state != GANG_STATE_BACKOFF)
        return;
    /* A count, not a scan per message: an available slot always has its member. */
    if (c->n_avail < c->cfg.nnodes) {
        if (c->state == GANG_STATE_BACKOFF)
            set_state(c, GANG_STATE_ABORTING);
        return;
    }
    if (gang_now_ms() < c->backoff_until_ms) {
        set_state(c, GANG_STATE_BACKOFF);
        return;
    }
    begin_generation(c);
}

static void give_up(gang_coord *c, const char *reason)
{
    set_state(c, GANG_STATE_FAILED);
    gang_error("coordinator: restart budget spent (%u restarts in %llu s): gang stays down; "
               "last failure: %s",
               c->cfg.max_restarts, (unsigned long long)(c->cfg.restart_window_ms / 1000), reason);
    gang_msg *m = scratch_msg(c, GANG_MSG_GIVE_UP);
    snprintf(m->u.give_up.reason, sizeof(m->u.give_up.reason), "restart budget spent: %s", reason);
    broadcast(c, m);
}

/*
 * A failure of the current generation: record it, spend one restart, and either abort
 * the gang (every member aborts in place and rejoins) or give up for good.
 */
static void coord_fail(gang_coord *c, int32_t rank, int32_t code, const char *reason)
{
    if (c->state != GANG_STATE_STARTING && c->state != GANG_STATE_SERVING) {
        gang_info("coordinator: %s (gang %s, no restart needed)", reason,
                  gang_state_name(c->state));
        if (c->state == GANG_STATE_BACKOFF)
            set_state(c, GANG_STATE_ABORTING);
        return;
    }
    uint64_t now = gang_now_ms();
    c->last_failure_rank = rank;
    c->last_failure_code = code;
    c->last_failure_wall_ms = gang_wall_ms();
    gang_strlcpy(c->last_failure, reason, sizeof(c->last_failure));
    c->restarts_total++;
    c->restart_ms[c->restart_head] = now;
    c->restart_head = (c->restart_head + 1) % (c->cfg.max_restarts + 1);
    c->round_start_ms = now;
    gang_warn("coordinator: generation %llu failed: rank %d: %s (%s)",
              (unsigned long long)c->generation, rank, reason, gang_err_name(code));

    uint32_t used = restarts_in_window(c, now);
    if (used > c->cfg.max_restarts) {
        give_up(c, reason);
        return;
    }
    gang_msg *m = scratch_msg(c, GANG_MSG_ABORT);
    m->u.abort.rank = rank;
    m->u.abort.code = code;
    gang_strlcpy(m->u.abort.reason, reason, sizeof(m->u.abort.reason));
    broadcast(c, m);
    for (uint32_t i = 0; i < c->cfg.nnodes; i++) {
        c->slots[i].available = 0;
        c->slots[i].ready = 0;
        c->n_ready = 0;
        c->n_avail = 0;
        /* Members that got this ABORT owe a REJOIN; newcomers are not bound by it. */
        c->slots[i].rejoin_deadline_ms = c->slots[i].peer ? now + c->cfg.start_timeout_ms : 0;
    }
    /* The delay grows with the restarts inside the window, so a crash loop slows down. */
    c->backoff.attempt = used ? used - 1 : 0;
    c->backoff_until_ms = now + gang_backoff_next(&c->backoff);
    set_state(c, GANG_STATE_ABORTING);
}

/* Checks a JOIN against the gang's shape; writes why not into why. */
static int validate_join(gang_coord *c, coord_peer *p, const gang_msg_join *j, char *why,
                         size_t cap)
{
    if (c->cfg.token.present && gang_auth_verify_join(&c->cfg.token, p->server_nonce, j)) {
        snprintf(why, cap, "authentication failed: the member does not hold the gang's token");
        return GANG_EAUTH;
    }
    if (strcmp(j->job, c->job) != 0) {
        snprintf(why, cap, "job name '%s' differs from the coordinator's '%s'", j->job, c->job);
        return GANG_EMISMATCH;
    }
    if (j->nnodes != c->cfg.nnodes || j->nproc_per_node != c->cfg.nproc_per_node) {
        snprintf(why, cap,
                 "world shape %ux%u differs from the coordinator's %ux%u (nnodes x "
                 "nproc-per-node)",
                 j->nnodes, j->nproc_per_node, c->cfg.nnodes, c->cfg.nproc_per_node);
        return GANG_EMISMATCH;
    }
    if (j->tp != c->cfg.tp || j->pp != c->cfg.pp) {
        snprintf(why, cap, "tp=%u pp=%u differ from the coordinator's tp=%u pp=%u", j->tp, j->pp,
                 c->cfg.tp, c->cfg.pp);
        return GANG_EMISMATCH;
    }
    if (memcmp(j->model_digest, c->cfg.model_digest, GANG_DIGEST_SIZE) != 0) {
        snprintf(why, cap, "model digest differs from the coordinator's (another model?)");
        return GANG_EMISMATCH;
    }
    if (j->node_index >= c->cfg.nnodes) {
        snprintf(why, cap, "node index %u outside [0, %u)", j->node_index, c->cfg.nnodes);
        return GANG_EMISMATCH;
    }
    if (c->slots[j->node_index].peer != NULL) {
        snprintf(why, cap, "node %u is already a member (from %s)", j->node_index,
                 c->slots[j->node_index].peer->conn.peer);
        return GANG_EDUPLICATE;
    }
    if (c->state == GANG_STATE_FAILED) {
        snprintf(why, cap, "the gang gave up: %s", c->last_failure);
        return GANG_EBUDGET;
    }
    return 0;
}

static void on_join(gang_coord *c, coord_peer *p, const gang_msg *m)
{
    const gang_msg_join *j = &m->u.join;
    char why[GANG_REASON_MAX];
    int rc = validate_join(c, p, j, why, sizeof(why));
    if (rc != 0) {
        gang__conn_peer_warn(&c->peer_log, "coordinator: refused JOIN from %s as node %u: %s",
                             p->conn.peer, j->node_index, why);
        gang__conn_reject(&p->conn, rc, why);
        return;
    }
    p->joined = 1;
    p->node = j->node_index;
    node_slot *s = &c->slots[p->node];
    s->peer = p;
    c->n_avail -= s->available != 0;
    s->available = 0;
    c->n_ready -= s->ready != 0;
    s->ready = 0;
    s->generation_seen = j->generation_seen;
    s->rejoin_deadline_ms = 0;
    memset(&s->hb, 0, sizeof(s->hb));
    s->hb_rx_ms = gang_now_ms();
    /* After a coordinator restart the generation continues from what members served. */
    if (j->generation_seen > c->generation && c->state != GANG_STATE_STARTING &&
        c->state != GANG_STATE_SERVING) {
        c->generation = j->generation_seen;
        gang_log_set_generation((int64_t)c->generation);
    }
    if (c->round_start_ms == 0)
        c->round_start_ms = gang_now_ms();
    gang_info("coordinator: node %u joined from %s (host %s, generation seen %llu)", p->node,
              p->conn.peer, j->host, (unsigned long long)j->generation_seen);
    gang_msg *w = scratch_msg(c, GANG_MSG_WELCOME);
    gang_auth_sign_welcome(&c->cfg.token, j->client_nonce, p->server_nonce, w->u.welcome.mac);
    w->u.welcome.heartbeat_interval_ms = (uint32_t)c->cfg.heartbeat_interval_ms;
    w->u.welcome.heartbeat_timeout_ms = (uint32_t)c->cfg.heartbeat_timeout_ms;
    w->u.welcome.generation = c->generation;
    gang__conn_send(&p->conn, w);
    /* WELCOME is the last untagged frame: everything after it carries a session tag. */
    gang__conn_start_session(&p->conn, &c->cfg.token, p->server_nonce, j->client_nonce, 1);
}

/* Messages of an older generation cannot move the state machine; say so and drop them. */
static int is_stale(gang_coord *c, coord_peer *p, const gang_msg *m, const char *what)
{
    if (m->generation == c->generation)
        return 0;
    gang_warn("coordinator: ignoring stale %s from node %u: generation %llu, current %llu", what,
              p->node, (unsigned long long)m->generation, (unsigned long long)c->generation);
    return 1;
}

static void on_member_msg(gang_coord *c, coord_peer *p, const gang_msg *m)
{
    node_slot *s = &c->slots[p->node];
    switch (m->type) {
    case GANG_MSG_HEARTBEAT:
        s->hb = m->u.heartbeat;
        s->hb_rx_ms = gang_now_ms();
        return;
    case GANG_MSG_REJOIN:
        if (m->generation > s->generation_seen)
            s->generation_seen = m->generation;
        c->n_avail += s->available == 0;
        s->available = 1;
        s->rejoin_deadline_ms = 0;
        maybe_begin(c);
        return;
    case GANG_MSG_BLOB:
        if (is_stale(c, p, m, "BLOB"))
            return;
        if (p->node != 0 || c->state != GANG_STATE_STARTING || c->blob_sent) {
            gang_warn("coordinator: unexpected BLOB from node %u", p->node);
            return;
        }
        c->blob_sent = 1;
        gang_msg *st = scratch_msg(c, GANG_MSG_START);
        st->u.blob = m->u.blob;
        st->u.blob.world_size = c->world;
        broadcast(c, st);
        return;
    case GANG_MSG_READY: {
        if (is_stale(c, p, m, "READY"))
            return;
        if (c->state != GANG_STATE_STARTING || !c->blob_sent) {
            gang_warn("coordinator: READY from node %u while %s", p->node,
                      gang_state_name(c->state));
            return;
        }
        /* A count, not a scan of every slot per READY: a formation stays O(n). */
        if (!s->ready)
            c->n_ready++;
        s->ready = 1;
        if (c->n_ready < c->cfg.nnodes)
            return;
        uint64_t now = gang_now_ms();
        c->rendezvous_seconds = (double)(now - c->round_start_ms) / 1000.0;
        c->formation_seconds = (double)(now - c->formation_start_ms) / 1000.0;
        c->serving_since_wall_ms = gang_wall_ms();
        set_state(c, GANG_STATE_SERVING);
        /* Tell members at once rather than at the next beat: /readyz turns 200 sooner. */
        on_beat(&c->beat);
        gang_info("coordinator: gang serving generation %llu: %u ranks on %u nodes, formed "
                  "in %.3f s",
                  (unsigned long long)c->generation, c->world, c->cfg.nnodes,
                  c->rendezvous_seconds);
        return;
    }
    case GANG_MSG_ABORT:
        if (is_stale(c, p, m, "ABORT"))
            return;
        coord_fail(c, m->u.abort.rank, m->u.abort.code, m->u.abort.reason);
        return;
    case GANG_MSG_API:
        /* A forwarded request's traffic: the agent checks its generation and bytes. */
        if (c->cfg.on_api)
            c->cfg.on_api(c->cfg.api_ctx, p->node, m->generation, m->u.api.data, m->u.api.len);
        else
            gang_warn("coordinator: API frame from node %u dropped (no API here)", p->node);
        return;
    default:
        gang_warn("coordinator: unexpected message type %u from node %u: closing", m->type,
                  p->node);
        gang__conn_close(&p->conn, GANG_EPROTO);
    }
}

static void peer_on_msg(gang__conn *conn, const gang_msg *m)
{
    coord_peer *p = (coord_peer *)conn;
    gang_coord *c = p->coord;
    if (!p->joined) {
        if (m->type != GANG_MSG_JOIN) {
            gang__conn_peer_warn(&c->peer_log,
                                 "coordinator: %s sent message type %u before JOIN: closing",
                                 conn->peer, m->type);
            gang__conn_reject(conn, GANG_EPROTO, "expected JOIN");
            return;
        }
        on_join(c, p, m);
        return;
    }
    on_member_msg(c, p, m);
}

static void peer_on_close(gang__conn *conn, int err)
{
    coord_peer *p = (coord_peer *)conn;
    gang_coord *c = p->coord;
    if (p->prev)
        p->prev->next = p->next;
    else
        c->peers = p->next;
    if (p->next)
        p->next->prev = p->prev;
    c->npeers--;
    if (err == GANG_EAUTH && p->joined)
        c->frames_rejected++;
    if (p->joined && c->slots[p->node].peer == p) {
        node_slot *s = &c->slots[p->node];
        s->peer = NULL;
        c->n_avail -= s->available != 0;
        s->available = 0;
        c->n_ready -= s->ready != 0;
        s->ready = 0;
        if (!c->closing) {
            char why[GANG_REASON_MAX];
            snprintf(why, sizeof(why), "node %u (%s) lost: %s", p->node, conn->peer,
                     err ? gang_strerror(err) : "closed");
            coord_fail(c, (int32_t)(p->node * c->cfg.nproc_per_node), GANG_EPEER, why);
        }
    }
    free(p);
    coord_unref(c);
}

static void on_connection(uv_stream_t *server, int status)
{
    gang_coord *c = server->data;
    if (status < 0 || c->closing)
        return;
    coord_peer *p = calloc(1, sizeof(*p));
    if (p == NULL || gang__conn_init(c->loop, &p->conn, c, peer_on_msg, peer_on_close) != 0) {
        free(p);
        return;
    }
    p->coord = c;
    p->conn.warn_limit = &c->peer_log;
    c->open_handles++;
    p->next = c->peers;
    if (c->peers)
        c->peers->prev = p;
    c->peers = p;
    c->npeers++;
    if (uv_accept(server, (uv_stream_t *)&p->conn.tcp) != 0) {
        gang__conn_close(&p->conn, GANG_EIO);
        return;
    }
    /* Over the limit: accept (to drain the backlog) and close at once. */
    if (c->npeers > c->cfg.max_connections) {
        gang__conn_peer_warn(&c->peer_log,
                             "coordinator: %u connections at the limit: closing a "
                             "new one",
                             c->cfg.max_connections);
        c->refused++;
        gang__conn_close(&p->conn, GANG_EAGAIN);
        return;
    }
    if (gang__conn_start(&p->conn) != 0) {
        gang__conn_close(&p->conn, GANG_EIO);
        return;
    }
    gang_auth_random(p->server_nonce, sizeof(p->server_nonce));
    gang_msg *m = scratch_msg(c, GANG_MSG_CHALLENGE);
    memcpy(m->u.challenge.nonce, p->server_nonce, GANG_NONCE_SIZE);
    m->u.challenge.auth_required = (uint8_t)c->cfg.token.present;
    gang__conn_send(&p->conn, m);
}

/* Enforces every deadline: handshakes, member silence, the start timeout, the backoff. */
static void on_tick(uv_timer_t *t)
{
    gang_coord *c = t->data;
    uint64_t now = gang_now_ms();
    for (coord_peer *p = c->peers, *next; p; p = next) {
        next = p->next;
        if (p->conn.closing)
            continue;
        if (!p->joined && now - p->conn.opened_ms > c->cfg.handshake_timeout_ms) {
            gang__conn_peer_warn(&c->peer_log,
                                 "coordinator: %s did not complete JOIN within %llu ms: closing",
                                 p->conn.peer, (unsigned long long)c->cfg.handshake_timeout_ms);
            gang__conn_close(&p->conn, GANG_ETIMEDOUT);
        } else if (p->joined && now - p->conn.last_rx_ms > c->cfg.heartbeat_timeout_ms) {
            gang_warn("coordinator: node %u silent for %llu ms: dropping it", p->node,
                      (unsigned long long)(now - p->conn.last_rx_ms));
            gang__conn_close(&p->conn, GANG_ETIMEDOUT);
        }
    }
    if (c->state == GANG_STATE_STARTING && now > c->start_deadline_ms) {
        char why[GANG_REASON_MAX];
        int n = snprintf(why, sizeof(why), "start timeout: not READY after %llu ms:",
                         (unsigned long long)c->cfg.start_timeout_ms);
        for (uint32_t i = 0; i < c->cfg.nnodes && n < (int)sizeof(why) - 8; i++) {
            if (!c->slots[i].ready)
                n += snprintf(why + n, sizeof(why) - (size_t)n, " node %u", i);
        }
        coord_fail(c, -1, GANG_ETIMEDOUT, why);
    }
    /*
     * A member that has not rejoined within the start timeout of the abort it received is
     * dropped, so that it reconnects and rejoins afresh instead of holding the gang down.
     * A member that joined after the abort (a replacement Pod still loading) has no such
     * deadline: its agent rejoins once its workers are up.
     */
    if (c->state == GANG_STATE_ABORTING || c->state == GANG_STATE_BACKOFF) {
        for (uint32_t i = 0; i < c->cfg.nnodes; i++) {
            node_slot *s = &c->slots[i];
            if (s->peer && !s->available && !s->peer->conn.closing && s->rejoin_deadline_ms &&
                now > s->rejoin_deadline_ms) {
                gang_warn("coordinator: node %u did not rejoin within %llu ms of the abort: "
                          "dropping it",
                          i, (unsigned long long)c->cfg.start_timeout_ms);
                s->rejoin_deadline_ms = 0;
                gang__conn_close(&s->peer->conn, GANG_ETIMEDOUT);
            }
        }
    }
    if (c->state == GANG_STATE_BACKOFF || c->state == GANG_STATE_ABORTING ||
        c->state == GANG_STATE_WAITING)
        maybe_begin(c);
}

static void on_beat(uv_timer_t *t)
{
    gang_coord *c = t->data;
    gang_msg *m = scratch_msg(c, GANG_MSG_HEARTBEAT);
    m->u.heartbeat.node_index = UINT32_MAX;
    m->u.heartbeat.state = c->state;
    broadcast(c, m);
}

int gang_coord_start(void *uv_loop, const gang_coord_config *cfg, gang_coord **out)
{
    int rc = GANG_ENOMEM;
    gang_coord *c = calloc(1, sizeof(*c));
    if (c == NULL)
        return GANG_ENOMEM;
    c->loop = uv_loop;
    c->cfg = *cfg;
    gang_strlcpy(c->job, cfg->job ? cfg->job : "", sizeof(c->job));
    c->cfg.job = c->job;
    c->cfg.bind_address = NULL;
    c->world = cfg->nnodes * cfg->nproc_per_node;
    c->slots = calloc(cfg->nnodes, sizeof(*c->slots));
    c->rank_view = calloc(c->world, sizeof(*c->rank_view));
    c->restart_ms = calloc(cfg->max_restarts + 1, sizeof(*c->restart_ms));
    c->scratch = calloc(1, sizeof(*c->scratch));
    if (!c->slots || !c->rank_view || !c->restart_ms || !c->scratch)
        goto out_free;
    c->state = GANG_STATE_WAITING;
    c->last_failure_rank = -1;
    gang_backoff_init(&c->backoff, cfg->restart_backoff_ms, cfg->restart_backoff_max_ms,
                      gang_now_ns() ^ (uint64_t)(uintptr_t)c);

    struct sockaddr_storage ss;
    if (uv_ip4_addr(cfg->bind_address, cfg->port, (struct sockaddr_in *)&ss) != 0 &&
        uv_ip6_addr(cfg->bind_address, cfg->port, (struct sockaddr_in6 *)&ss) != 0) {
        rc = GANG_EINVAL;
        goto out_free;
    }
    uv_tcp_init(c->loop, &c->listener);
    c->listener.data = c;
    c->open_handles = 1;
    rc = uv_tcp_bind(&c->listener, (struct sockaddr *)&ss, 0);
    if (rc == 0)
        rc = uv_listen((uv_stream_t *)&c->listener, 1024, on_connection);
    if (rc != 0) {
        rc = gang__uv_err(rc);
        c->closing = 1;
        uv_close((uv_handle_t *)&c->listener, handle_closed);
        return rc;
    }
    struct sockaddr_storage bound;
    int blen = sizeof(bound);
    uv_tcp_getsockname(&c->listener, (struct sockaddr *)&bound, &blen);
    c->port = ntohs(((struct sockaddr_in *)&bound)->sin_port);

    uint64_t tick = cfg->heartbeat_interval_ms / 4;
    tick = tick < 5 ? 5 : (tick > 100 ? 100 : tick);
    uv_timer_init(c->loop, &c->tick);
    uv_timer_init(c->loop, &c->beat);
    c->tick.data = c;
    c->beat.data = c;
    c->open_handles += 2;
    uv_timer_start(&c->tick, on_tick, tick, tick);
    uv_timer_start(&c->beat, on_beat, cfg->heartbeat_interval_ms, cfg->heartbeat_interval_ms);
    if (!cfg->token.present)
        gang_warn("coordinator: NO TOKEN configured (--token-file): any process that can "
                  "reach port %d can join the gang",
                  c->port);
    gang_info("coordinator: listening on %s:%d for %u nodes x %u ranks (job %s)", cfg->bind_address,
              c->port, cfg->nnodes, cfg->nproc_per_node, c->job);
    *out = c;
    return 0;
out_free:
    free(c->slots);
    free(c->rank_view);
    free(c->restart_ms);
    free(c->scratch);
    free(c);
    return rc;
}

int gang_coord_send_api(gang_coord *c, uint32_t node, uint64_t gen, const uint8_t *data,
                        uint32_t len)
{
    if (node >= c->cfg.nnodes || len > GANG_API_FRAME_MAX)
        return GANG_EINVAL;
    if (c->closing || c->slots[node].peer == NULL)
        return GANG_ECLOSED;
    gang_msg *m = scratch_msg(c, GANG_MSG_API);
    m->generation = gen;
    m->u.api.len = len;
    memcpy(m->u.api.data, data, len);
    return gang__conn_send_api(&c->slots[node].peer->conn, m);
}

int gang_coord_port(const gang_coord *c)
{
    return c->port;
}

void gang_coord_close(gang_coord *c)
{
    if (c == NULL || c->closing)
        return;
    c->closing = 1;
    for (coord_peer *p = c->peers; p; p = p->next)
        gang__conn_close(&p->conn, 0);
    uv_close((uv_handle_t *)&c->tick, handle_closed);
    uv_close((uv_handle_t *)&c->beat, handle_closed);
    uv_close((uv_handle_t *)&c->listener, handle_closed);
}

void gang_coord_get_status(gang_coord *c, gang_coord_status *st)
{
    uint64_t now = gang_now_ms();
    memset(st, 0, sizeof(*st));
    st->state = c->state;
    st->generation = c->generation;
    for (uint32_t i = 0; i < c->cfg.nnodes; i++)
        st->members += c->slots[i].peer != NULL;
    st->members_max = c->cfg.nnodes;
    st->connections = c->npeers;
    st->connections_max = c->cfg.max_connections;
    st->connections_refused = c->refused;
    st->restarts_total = c->restarts_total;
    uint32_t used = restarts_in_window(c, now);
    st->budget_left = used >= c->cfg.max_restarts ? 0 : c->cfg.max_restarts - used;
    if (c->state == GANG_STATE_FAILED)
        st->budget_left = 0;
    st->rendezvous_seconds = c->rendezvous_seconds;
    st->formation_seconds = c->formation_seconds;
    st->serving_since_wall_ms = c->state == GANG_STATE_SERVING ? c->serving_since_wall_ms : 0;
    st->last_failure_rank = c->last_failure_rank;
    st->last_failure_code = c->last_failure_code;
    st->last_failure_wall_ms = c->last_failure_wall_ms;
    gang_strlcpy(st->last_failure, c->last_failure, sizeof(st->last_failure));
    st->world_size = c->world;
    st->frames_rejected = c->frames_rejected;
    for (uint32_t n = 0; n < c->cfg.nnodes; n++) {
        node_slot *s = &c->slots[n];
        for (uint32_t l = 0; l < c->cfg.nproc_per_node; l++) {
            gang_coord_rank *r = &c->rank_view[n * c->cfg.nproc_per_node + l];
            if (s->peer && l < s->hb.nranks) {
                uint32_t age = s->hb.rank_age_ms[l];
                r->state = s->hb.rank_state[l];
                r->heartbeat_age_ms = age == GANG_HEARTBEAT_NEVER
                                          ? GANG_HEARTBEAT_NEVER
                                          : gang_heartbeat_age(age + (now - s->hb_rx_ms));
            } else {
                r->state = GANG_RANK_DOWN;
                r->heartbeat_age_ms = GANG_HEARTBEAT_NEVER;
            }
        }
    }
    st->ranks = c->rank_view;
}
