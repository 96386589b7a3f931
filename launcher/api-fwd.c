/*
 * The codec of forwarded API requests (api-fwd.h has the layout): the engine's request
 * messages (gang_req_codec, the same description the worker channel uses) behind a kind
 * byte, plus the forwarding's own NACK and the token's stamp. One walk serves both
 * directions; the decoder is a trust boundary (a member or coordinator with the token may
 * still be broken): the codec never reads past the payload, checks every count against
 * its bound before copying and accepts a payload only when it is consumed exactly.
 */
#include <string.h>
#include <time.h>

#include "api-fwd.h"

/* Walks the payload of m->kind; 0, or GANG_EPROTO for a kind outside the direction. */
static int fc_payload(gang_codec *c, gang_req_msg *m, int from_coordinator, uint64_t *stamp_us)
{
    uint32_t kind = m->kind;
    gang_codec_uint(c, &kind, 1, 0xFF);
    if (!gang_codec_ok(c))
        return GANG_EPROTO;
    int coord_kind = kind == GANG_REQ_TOKEN || kind == GANG_REQ_DONE || kind == GANG_FWD_NACK;
    int member_kind = kind == GANG_REQ_SUBMIT || kind == GANG_REQ_PROMPT || kind == GANG_REQ_CANCEL;
    if (from_coordinator ? !coord_kind : !member_kind)
        return GANG_EPROTO;
    if (kind == GANG_FWD_NACK) {
        m->kind = kind;
        gang_codec_u64(c, &m->id);
        gang_codec_u32(c, &m->index);
    } else {
        /* The engine's request message, as the worker channel carries it. */
        gang_req_codec(c, kind, m);
        if (kind == GANG_REQ_TOKEN)
            gang_codec_u64(c, stamp_us);
    }
    if (gang_codec_ok(c) && m->id > GANG_FWD_ID_MASK)
        return GANG_EPROTO;
    return 0;
}

int gang_fwd_encode(const gang_req_msg *m, uint64_t stamp_us, uint8_t *buf, size_t cap, size_t *len)
{
    int from_coordinator =
        m->kind == GANG_REQ_TOKEN || m->kind == GANG_REQ_DONE || m->kind == GANG_FWD_NACK;
    gang_codec c;
    gang_codec_encoder(&c, buf, cap);
    /* One walk serves both directions and writes through its pointer when decoding:
     * encoding walks a copy. */
    gang_req_msg copy = *m;
    int rc = fc_payload(&c, &copy, from_coordinator, &stamp_us);
    if (rc != 0)
        return GANG_EINVAL;
    return gang_codec_finish(&c, len);
}

int gang_fwd_decode(const uint8_t *buf, size_t len, int from_coordinator, gang_req_msg *m,
                    uint64_t *stamp_us)
{
    gang_codec c;
    gang_codec_decoder(&c, buf, len);
    memset(m, 0, sizeof(*m));
    *stamp_us = 0;
    int rc = fc_payload(&c, m, from_coordinator, stamp_us);
    if (rc != 0 || gang_codec_finish(&c, NULL) != 0) {
        memset(m, 0, sizeof(*m));
        return GANG_EPROTO;
    }
    return 0;
}

/* ------------------------------------------------------------------ the relay */

uint64_t gang__fwd_wall_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

void gang_fwd_relay_set_gen(gang_fwd_relay *r, uint64_t gen)
{
    r->gen = gen;
    r->n_holes = 0;
}

/* The index of the hole of engine request id, or n_holes when it has none. */
static uint32_t hole_find(const gang_fwd_relay *r, uint64_t id)
{
    uint32_t i = 0;
    while (i < r->n_holes && r->holes[i].id != id)
        i++;
    return i;
}

/* Sends m (a NACK, token or end) for generation gen to node; counts a failure. */
static void relay_send(gang_fwd_relay *r, uint32_t node, uint64_t gen, const gang_req_msg *m,
                       uint64_t stamp_us)
{
    size_t len = 0;
    int rc = r->coord ? gang_fwd_encode(m, stamp_us, r->buf, sizeof(r->buf), &len) : GANG_ECLOSED;
    if (rc == 0)
        rc = gang_coord_send_api(r->coord, node, gen, r->buf, (uint32_t)len);
    if (rc != 0) {
        r->send_failures++;
        gang_debug("fwd: cannot send a %u to node %u: %s", m->kind, node, gang_strerror(rc));
    }
}

static void relay_nack(gang_fwd_relay *r, uint32_t node, uint64_t gen, uint64_t id, uint32_t index)
{
    gang_req_msg *n = &r->pkt;
    memset(n, 0, sizeof(*n));
    n->kind = GANG_FWD_NACK;
    n->id = id;
    n->index = index;
    r->nacks++;
    relay_send(r, node, gen, n, 0);
}

/*
 * Whether a packet of request id at prompt offset index may go to rank 0 now, given the
 * holes: a request with a hole takes only the piece at the hole (which fills it); a new
 * hole cannot be remembered when the table is full, so then nothing is taken.
 */
static int hole_admits(gang_fwd_relay *r, uint64_t id, uint32_t index)
{
    uint32_t h = hole_find(r, id);
    if (h < r->n_holes)
        return r->holes[h].index == index;
    return r->n_holes < GANG_FWD_HOLES_MAX;
}

static void hole_set(gang_fwd_relay *r, uint64_t id, uint32_t index, int filled)
{
    uint32_t h = hole_find(r, id);
    if (filled) {
        if (h < r->n_holes)
            r->holes[h] = r->holes[--r->n_holes];
    } else if (h == r->n_holes && r->n_holes < GANG_FWD_HOLES_MAX) {
        r->holes[r->n_holes].id = id;
        r->holes[r->n_holes++].index = index;
    }
}

void gang_fwd_relay_in(gang_fwd_relay *r, uint32_t node, uint64_t gen, const uint8_t *data,
                       uint32_t len)
{
    uint64_t stamp;
    gang_req_msg *m = &r->pkt;
    if (node == 0 || gang_fwd_decode(data, len, 0, m, &stamp) != 0) {
        r->frames_refused++;
        gang_warn("fwd: refused a malformed API frame of %u bytes from node %u", len, node);
        return;
    }
    if (gen == 0 || (r->gen != 0 && gen < r->gen))
        return; /* an older generation's: the member submits it again after START */
    uint64_t member_id = m->id, id = gang_fwd_id(node, member_id);
    uint32_t index = m->kind == GANG_REQ_SUBMIT ? 0 : m->index;
    if (m->kind == GANG_REQ_CANCEL) {
        /* The member gave the request up: a hole it left will not be filled. */
        hole_set(r, id, 0, 1);
        m->generation = gen;
        m->id = id;
        if (gen == r->gen && gang_sup_submit(r->sup, m) == 0) /* best effort, as local */
            r->cancels++;
        return;
    }
    if (gen != r->gen || !hole_admits(r, id, index)) {
        relay_nack(r, node, gen, member_id, index);
        return;
    }
    m->generation = gen;
    m->id = id;
    int rc = gang_sup_submit(r->sup, m);
    hole_set(r, id, index, rc == 0);
    if (rc != 0) {
        relay_nack(r, node, gen, member_id, index);
        return;
    }
    r->packets++;
    r->submits += m->kind == GANG_REQ_SUBMIT;
}

int gang_fwd_relay_token(gang_fwd_relay *r, const gang_req_msg *tok)
{
    uint32_t node = gang_fwd_node(tok->id);
    if (node == 0)
        return 0;
    gang_req_msg *m = &r->pkt;
    memcpy(m, tok, sizeof(*m));
    m->kind = GANG_REQ_TOKEN;
    m->id = tok->id & GANG_FWD_ID_MASK;
    relay_send(r, node, tok->generation, m, gang__fwd_wall_us());
    return 1;
}

int gang_fwd_relay_done(gang_fwd_relay *r, const gang_req_msg *done)
{
    uint32_t node = gang_fwd_node(done->id);
    if (node == 0)
        return 0;
    gang_req_msg *m = &r->pkt;
    memset(m, 0, sizeof(*m));
    m->kind = GANG_REQ_DONE;
    m->id = done->id & GANG_FWD_ID_MASK;
    m->code = done->code;
    m->index = done->index;
    gang_strlcpy(m->finish, done->finish, sizeof(m->finish));
    gang_strlcpy(m->reason, done->reason, sizeof(m->reason));
    m->kv_id = done->kv_id;
    m->kv_blocks = done->kv_blocks;
    m->kv_ms = done->kv_ms;
    m->kv_mismatch = done->kv_mismatch;
    m->kv_device = done->kv_device;
    m->kv_layout = done->kv_layout;
    relay_send(r, node, done->generation, m, 0);
    return 1;
}

void gang_fwd_relay_metrics(const gang_fwd_relay *r, gang_metrics_buf *b)
{
    const gang_metric_counter cs[] = {
        {"ganglion_forwarded_in_requests_total",
         "Requests forwarded by members that this coordinator handed to rank 0", r->submits},
        {"ganglion_forwarded_in_cancels_total",
         "Cancels of forwarded requests (client gone, deadline) handed to rank 0", r->cancels},
        {"ganglion_forwarded_in_refused_total",
         "Forwarded packets refused for now (generation not started here, rank 0 busy)", r->nacks},
        {"ganglion_forwarded_in_frames_rejected_total", "Malformed forwarded API frames dropped",
         r->frames_refused},
        {"ganglion_forwarded_out_failures_total",
         "Tokens or ends of forwarded requests that could not be queued to their member",
         r->send_failures},
    };
    (void)gang_metrics_counters(b, cs, sizeof(cs) / sizeof(cs[0]));
}
