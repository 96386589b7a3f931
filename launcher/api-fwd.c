/*
 * The codec of forwarded API requests (api-fwd.h has the layout). Like the rendezvous
 * codec, one walk per kind serves both directions, so encoder and decoder cannot drift;
 * the decoder is a trust boundary (a member or coordinator with the token may still be
 * broken): it never reads past the payload, checks every count against its bound before
 * copying and accepts a payload only when it is consumed exactly.
 */
#include <string.h>
#include <time.h>

#include "api-fwd.h"

typedef struct fwd_codec {
    int decoding;
    uint8_t *w;       /* encode: destination */
    const uint8_t *r; /* decode: source */
    size_t cap;       /* encode: room at w; decode: bytes at r */
    size_t off;
    int invalid;
    int full; /* encode: the buffer was too small */
} fwd_codec;

static void fc_bytes(fwd_codec *c, void *p, size_t n)
{
    if (c->invalid || n == 0)
        return;
    if (n > c->cap - c->off) {
        c->full = !c->decoding;
        c->invalid = 1;
        return;
    }
    if (c->decoding)
        memcpy(p, c->r + c->off, n);
    else
        memcpy(c->w + c->off, p, n);
    c->off += n;
}

static void fc_uint(fwd_codec *c, uint64_t *v, int n)
{
    uint8_t b[8] = {0};
    if (!c->decoding)
        for (int i = 0; i < n; i++)
            b[i] = (uint8_t)(*v >> (8 * i));
    fc_bytes(c, b, (size_t)n);
    if (c->decoding && !c->invalid) {
        *v = 0;
        for (int i = n - 1; i >= 0; i--)
            *v = (*v << 8) | b[i];
    }
}

static void fc_u8(fwd_codec *c, uint32_t *v)
{
    uint64_t x = *v;
    if (!c->decoding && x > 0xFF)
        c->invalid = 1;
    fc_uint(c, &x, 1);
    *v = (uint32_t)x;
}

static void fc_u32(fwd_codec *c, uint32_t *v)
{
    uint64_t x = *v;
    fc_uint(c, &x, 4);
    *v = (uint32_t)x;
}

static void fc_i32(fwd_codec *c, int32_t *v)
{
    uint32_t u = (uint32_t)*v;
    fc_u32(c, &u);
    *v = (int32_t)u;
}

static void fc_f32(fwd_codec *c, float *v)
{
    uint32_t u;
    memcpy(&u, v, 4);
    fc_u32(c, &u);
    memcpy(v, &u, 4);
}

static void fc_u64(fwd_codec *c, uint64_t *v)
{
    fc_uint(c, v, 8);
}

/* A count (u8 or u32) then that many i32 into ids[0..max). */
static void fc_ids(fwd_codec *c, uint32_t *n, int32_t *ids, uint32_t max, int u8_count)
{
    if (u8_count)
        fc_u8(c, n);
    else
        fc_u32(c, n);
    if (c->invalid || *n > max) {
        c->invalid = 1;
        return;
    }
    for (uint32_t i = 0; i < *n; i++)
        fc_i32(c, &ids[i]);
}

/* A string of capacity cap (NUL included) as a u8/u16 length and its bytes. */
static void fc_str(fwd_codec *c, char *s, size_t cap, int u8_len)
{
    uint32_t n = 0;
    if (!c->decoding)
        n = (uint32_t)strnlen(s, cap);
    if (u8_len)
        fc_u8(c, &n);
    else {
        uint64_t x = n;
        if (!c->decoding && x > 0xFFFF)
            c->invalid = 1;
        fc_uint(c, &x, 2);
        n = (uint32_t)x;
    }
    if (c->invalid || n >= cap) {
        c->invalid = 1;
        return;
    }
    fc_bytes(c, s, n);
    if (c->decoding && !c->invalid) {
        if (memchr(s, '\0', n) != NULL)
            c->invalid = 1;
        s[n] = '\0';
    }
}

/* The prompt ids of a SUBMIT or PROMPT, kept in m->blob as int32 like the worker's. */
static void fc_prompt_ids(fwd_codec *c, gang_wctl *m)
{
    int32_t ids[GANG_WCTL_MAX_PROMPT];
    uint32_t n = m->blob_len / 4;
    if (!c->decoding) {
        if (m->blob_len % 4 != 0 || n > GANG_WCTL_MAX_PROMPT) {
            c->invalid = 1;
            return;
        }
        memcpy(ids, m->blob, m->blob_len);
    }
    fc_ids(c, &n, ids, GANG_WCTL_MAX_PROMPT, 0);
    if (c->decoding && !c->invalid) {
        m->blob_len = n * 4;
        memcpy(m->blob, ids, m->blob_len);
    }
}

static void fc_submit(fwd_codec *c, gang_wctl *m)
{
    fc_u32(c, &m->n_prompt);
    fc_u32(c, &m->max_tokens);
    fc_u32(c, &m->top_k);
    fc_f32(c, &m->temperature);
    fc_f32(c, &m->top_p);
    fc_u64(c, &m->seed);
    fc_f32(c, &m->presence_penalty);
    fc_f32(c, &m->frequency_penalty);
    fc_f32(c, &m->repetition_penalty);
    fc_u8(c, &m->ignore_eos);
    fc_u8(c, &m->logprobs);
    fc_u8(c, &m->top_logprobs);
    fc_ids(c, &m->n_stop, m->stop, (uint32_t)(sizeof(m->stop) / sizeof(m->stop[0])), 1);
    fc_prompt_ids(c, m);
    /* A SUBMIT carries the start of its prompt: no more ids than the whole prompt. */
    if (c->decoding && !c->invalid && m->n_prompt != 0 && m->blob_len / 4 > m->n_prompt)
        c->invalid = 1;
}

static void fc_token(fwd_codec *c, gang_wctl *m, uint64_t *stamp_us)
{
    fc_u32(c, &m->index);
    fc_i32(c, &m->token);
    fc_f32(c, &m->logprob);
    fc_ids(c, &m->n_top, m->top_ids, GANG_MAX_TOP_LOGPROBS, 1);
    for (uint32_t i = 0; !c->invalid && i < m->n_top; i++)
        fc_f32(c, &m->top_lp[i]);
    fc_u64(c, stamp_us);
}

/* Walks the payload of m->type; 0, or GANG_EPROTO for a kind outside the direction. */
static int fc_payload(fwd_codec *c, gang_wctl *m, int from_coordinator, uint64_t *stamp_us)
{
    uint32_t kind = m->type;
    fc_u8(c, &kind);
    fc_u64(c, &m->req_id);
    if (c->invalid || m->req_id > GANG_FWD_ID_MASK)
        return GANG_EPROTO;
    m->type = kind;
    int coord_kind = kind == GANG_WCTL_TOKEN || kind == GANG_WCTL_DONE || kind == GANG_FWD_NACK;
    int member_kind =
        kind == GANG_WCTL_SUBMIT || kind == GANG_WCTL_PROMPT || kind == GANG_WCTL_CANCEL;
    if (from_coordinator ? !coord_kind : !member_kind)
        return GANG_EPROTO;
    switch (kind) {
    case GANG_WCTL_SUBMIT:
        fc_submit(c, m);
        break;
    case GANG_WCTL_PROMPT:
        fc_u32(c, &m->n_prompt);
        fc_u32(c, &m->index);
        fc_prompt_ids(c, m);
        break;
    case GANG_WCTL_TOKEN:
        fc_token(c, m, stamp_us);
        break;
    case GANG_WCTL_DONE:
        fc_i32(c, &m->code);
        fc_u32(c, &m->index);
        fc_str(c, m->finish, sizeof(m->finish), 1);
        fc_str(c, m->reason, sizeof(m->reason), 0);
        break;
    case GANG_FWD_NACK:
        fc_u32(c, &m->index);
        break;
    default: /* CANCEL: the id is all */
        break;
    }
    return 0;
}

int gang_fwd_encode(const gang_wctl *m, uint64_t stamp_us, uint8_t *buf, size_t cap, size_t *len)
{
    int from_coordinator =
        m->type == GANG_WCTL_TOKEN || m->type == GANG_WCTL_DONE || m->type == GANG_FWD_NACK;
    fwd_codec c = {.decoding = 0, .w = buf, .cap = cap};
    /* One walk serves both directions and writes through its pointer when decoding:
     * encoding walks a copy. */
    gang_wctl copy = *m;
    int rc = fc_payload(&c, &copy, from_coordinator, &stamp_us);
    if (rc != 0)
        return GANG_EINVAL;
    if (c.invalid)
        return c.full ? GANG_EMSGSIZE : GANG_EINVAL;
    *len = c.off;
    return 0;
}

int gang_fwd_decode(const uint8_t *buf, size_t len, int from_coordinator, gang_wctl *m,
                    uint64_t *stamp_us)
{
    fwd_codec c = {.decoding = 1, .r = buf, .cap = len};
    memset(m, 0, sizeof(*m));
    *stamp_us = 0;
    int rc = fc_payload(&c, m, from_coordinator, stamp_us);
    if (rc != 0 || c.invalid || c.off != len) {
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
static void relay_send(gang_fwd_relay *r, uint32_t node, uint64_t gen, const gang_wctl *m,
                       uint64_t stamp_us)
{
    size_t len = 0;
    int rc = r->coord ? gang_fwd_encode(m, stamp_us, r->buf, sizeof(r->buf), &len) : GANG_ECLOSED;
    if (rc == 0)
        rc = gang_coord_send_api(r->coord, node, gen, r->buf, (uint32_t)len);
    if (rc != 0) {
        r->send_failures++;
        gang_debug("fwd: cannot send a %u to node %u: %s", m->type, node, gang_strerror(rc));
    }
}

static void relay_nack(gang_fwd_relay *r, uint32_t node, uint64_t gen, uint64_t id, uint32_t index)
{
    gang_wctl *n = &r->pkt;
    memset(n, 0, sizeof(*n));
    n->type = GANG_FWD_NACK;
    n->req_id = id;
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
    gang_wctl *m = &r->pkt;
    if (node == 0 || gang_fwd_decode(data, len, 0, m, &stamp) != 0) {
        r->frames_refused++;
        gang_warn("fwd: refused a malformed API frame of %u bytes from node %u", len, node);
        return;
    }
    if (gen == 0 || (r->gen != 0 && gen < r->gen))
        return; /* an older generation's: the member submits it again after START */
    uint64_t member_id = m->req_id, id = gang_fwd_id(node, member_id);
    uint32_t index = m->type == GANG_WCTL_SUBMIT ? 0 : m->index;
    if (m->type == GANG_WCTL_CANCEL) {
        /* The member gave the request up: a hole it left will not be filled. */
        hole_set(r, id, 0, 1);
        m->generation = gen;
        m->req_id = id;
        if (gen == r->gen && gang_sup_submit(r->sup, m) == 0) /* best effort, as local */
            r->cancels++;
        return;
    }
    if (gen != r->gen || !hole_admits(r, id, index)) {
        relay_nack(r, node, gen, member_id, index);
        return;
    }
    m->generation = gen;
    m->req_id = id;
    int rc = gang_sup_submit(r->sup, m);
    hole_set(r, id, index, rc == 0);
    if (rc != 0) {
        relay_nack(r, node, gen, member_id, index);
        return;
    }
    r->packets++;
    r->submits += m->type == GANG_WCTL_SUBMIT;
}

int gang_fwd_relay_token(gang_fwd_relay *r, const gang_wctl *tok)
{
    uint32_t node = gang_fwd_node(tok->req_id);
    if (node == 0)
        return 0;
    gang_wctl *m = &r->pkt;
    memcpy(m, tok, sizeof(*m));
    m->type = GANG_WCTL_TOKEN;
    m->req_id = tok->req_id & GANG_FWD_ID_MASK;
    relay_send(r, node, tok->generation, m, gang__fwd_wall_us());
    return 1;
}

int gang_fwd_relay_done(gang_fwd_relay *r, uint64_t gen, uint64_t id, int32_t code, uint32_t cached,
                        const char *finish, const char *reason)
{
    uint32_t node = gang_fwd_node(id);
    if (node == 0)
        return 0;
    gang_wctl *m = &r->pkt;
    memset(m, 0, sizeof(*m));
    m->type = GANG_WCTL_DONE;
    m->req_id = id & GANG_FWD_ID_MASK;
    m->code = code;
    m->index = cached;
    gang_strlcpy(m->finish, finish, sizeof(m->finish));
    gang_strlcpy(m->reason, reason, sizeof(m->reason));
    relay_send(r, node, gen, m, 0);
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
