/*
 * Wire protocol v2 codec: gang_msg <-> frame bytes. docs/protocol.md is the normative
 * description; the layout comment in include/ganglion/rendezvous.h is its summary.
 *
 * Each payload layout is written down exactly once, as a "codec" function that walks
 * the fields of one message struct in order. The same walk encodes (struct -> bytes) or
 * decodes (bytes -> struct) depending on the direction of the wire_codec it is given, so
 * the encoder and the decoder cannot drift apart: a field added to one is added to both.
 *
 * The decoder is the trust boundary of the rendezvous port: everything it reads comes
 * from a peer that may be broken or hostile. It therefore never reads outside the bytes it
 * was given, checks every length against both the remaining input and the destination
 * capacity before copying, and accepts a payload only when it is consumed exactly.
 */
#include <string.h>

#include "ganglion/rendezvous.h"

/* ---------------------------------------------------------------------------------
 * Little-endian loads and stores. Byte by byte, so they work on any host byte order
 * and at any alignment.
 * --------------------------------------------------------------------------------- */
static void store_le16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

static void store_le32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void store_le64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint16_t load_le16(const uint8_t *p)
{
    return (uint16_t)(p[0] | (p[1] << 8));
}

static uint32_t load_le32(const uint8_t *p)
{
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

static uint64_t load_le64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

/* ---------------------------------------------------------------------------------
 * The bounded two-way codec.
 *
 * Encoding writes into wbuf[0..cap) but keeps counting in `off` once the buffer is full,
 * so that one pass tells an invalid field (GANG_EINVAL) from a buffer that is merely too
 * small (GANG_EMSGSIZE) and knows the frame's length either way. Decoding reads from
 * rbuf[0..end) and marks the codec invalid on the first field that is truncated or out of
 * bounds; later fields then become no-ops, so a codec function needs no error checks of
 * its own and the caller looks at `invalid` once at the end.
 * --------------------------------------------------------------------------------- */
typedef struct wire_codec {
    int decoding;        /* 1: rbuf -> struct, 0: struct -> wbuf */
    uint8_t *wbuf;       /* encode destination (may be NULL when cap is 0) */
    size_t cap;          /* bytes available at wbuf */
    const uint8_t *rbuf; /* decode source */
    size_t end;          /* decode: offset one past the payload's last byte */
    size_t off;          /* bytes produced or consumed so far, header included */
    int invalid;         /* a field was truncated or out of bounds */
} wire_codec;

/* Moves n raw bytes between the wire and p, in the codec's direction. */
static void codec_bytes(wire_codec *c, void *p, size_t n)
{
    if (c->invalid || n == 0)
        return;
    if (c->decoding) {
        /* off <= end always holds while decoding, so the subtraction cannot wrap. */
        if (n > c->end - c->off) {
            c->invalid = 1;
            return;
        }
        memcpy(p, c->rbuf + c->off, n);
    } else if (c->off <= c->cap && n <= c->cap - c->off) {
        memcpy(c->wbuf + c->off, p, n);
    }
    c->off += n;
}

static void codec_u8(wire_codec *c, uint8_t *v)
{
    codec_bytes(c, v, 1);
}

static void codec_u16(wire_codec *c, uint16_t *v)
{
    uint8_t b[2] = {0};

    if (!c->decoding)
        store_le16(b, *v);
    codec_bytes(c, b, sizeof b);
    if (c->decoding && !c->invalid)
        *v = load_le16(b);
}

static void codec_u32(wire_codec *c, uint32_t *v)
{
    uint8_t b[4] = {0};

    if (!c->decoding)
        store_le32(b, *v);
    codec_bytes(c, b, sizeof b);
    if (c->decoding && !c->invalid)
        *v = load_le32(b);
}

static void codec_u64(wire_codec *c, uint64_t *v)
{
    uint8_t b[8] = {0};

    if (!c->decoding)
        store_le64(b, *v);
    codec_bytes(c, b, sizeof b);
    if (c->decoding && !c->invalid)
        *v = load_le64(b);
}

/* Signed 32-bit fields travel as their two's complement bit pattern. */
static void codec_i32(wire_codec *c, int32_t *v)
{
    uint32_t u = (uint32_t)*v;

    codec_u32(c, &u);
    if (c->decoding && !c->invalid)
        *v = (int32_t)u;
}

/*
 * A string field of capacity cap (NUL included): u16 length, then the bytes without a
 * NUL. Encoding rejects a string that does not fit its capacity (it could not be decoded
 * into the same struct); decoding rejects a length >= cap and an embedded NUL, which
 * would make the C string silently shorter than what the peer sent.
 */
static void codec_str(wire_codec *c, char *s, size_t cap)
{
    uint16_t n = 0;

    if (!c->decoding) {
        size_t len = strnlen(s, cap);
        if (len >= cap || len > UINT16_MAX) {
            c->invalid = 1;
            return;
        }
        n = (uint16_t)len;
    }
    codec_u16(c, &n);
    if (c->invalid)
        return;
    if (c->decoding && n >= cap) {
        c->invalid = 1;
        return;
    }
    codec_bytes(c, s, n);
    if (c->decoding && !c->invalid) {
        if (memchr(s, '\0', n) != NULL) {
            c->invalid = 1;
            return;
        }
        s[n] = '\0';
    }
}

/* ---------------------------------------------------------------------------------
 * Payload layouts, one per message struct, fields in declaration order.
 * --------------------------------------------------------------------------------- */
static void codec_challenge(wire_codec *c, gang_msg_challenge *x)
{
    codec_bytes(c, x->nonce, sizeof x->nonce);
    codec_u8(c, &x->auth_required);
}

static void codec_join(wire_codec *c, gang_msg_join *x)
{
    codec_str(c, x->job, sizeof x->job);
    codec_u32(c, &x->node_index);
    codec_u32(c, &x->nnodes);
    codec_u32(c, &x->nproc_per_node);
    codec_u32(c, &x->tp);
    codec_u32(c, &x->pp);
    codec_bytes(c, x->model_digest, sizeof x->model_digest);
    codec_u64(c, &x->generation_seen);
    codec_str(c, x->host, sizeof x->host);
    codec_bytes(c, x->client_nonce, sizeof x->client_nonce);
    codec_bytes(c, x->mac, sizeof x->mac);
}

static void codec_welcome(wire_codec *c, gang_msg_welcome *x)
{
    codec_bytes(c, x->mac, sizeof x->mac);
    codec_u32(c, &x->heartbeat_interval_ms);
    codec_u32(c, &x->heartbeat_timeout_ms);
    codec_u64(c, &x->generation);
}

static void codec_reject(wire_codec *c, gang_msg_reject *x)
{
    codec_i32(c, &x->code);
    codec_str(c, x->reason, sizeof x->reason);
}

/* BLOB_REQUEST, BLOB and START: world_size, then the blob as u32 length + bytes. */
static void codec_blob(wire_codec *c, gang_msg_blob *x)
{
    codec_u32(c, &x->world_size);
    codec_u32(c, &x->len);
    if (c->invalid)
        return;
    if (x->len > GANG_BLOB_MAX) {
        c->invalid = 1;
        return;
    }
    codec_bytes(c, x->data, x->len);
}

/*
 * Only the first nranks entries of each array travel: all nranks rank_state bytes first,
 * then all nranks rank_age_ms values, following the struct's field order.
 */
static void codec_heartbeat(wire_codec *c, gang_msg_heartbeat *x)
{
    codec_u32(c, &x->node_index);
    codec_u32(c, &x->state);
    codec_u32(c, &x->nranks);
    if (c->invalid)
        return;
    if (x->nranks > GANG_MAX_LOCAL_RANKS) {
        c->invalid = 1;
        return;
    }
    codec_bytes(c, x->rank_state, x->nranks);
    for (uint32_t i = 0; i < x->nranks; i++)
        codec_u32(c, &x->rank_age_ms[i]);
}

/* API: u32 length + opaque bytes, at most GANG_API_FRAME_MAX. */
static void codec_api(wire_codec *c, gang_msg_api *x)
{
    codec_u32(c, &x->len);
    if (c->invalid)
        return;
    if (x->len > GANG_API_FRAME_MAX) {
        c->invalid = 1;
        return;
    }
    codec_bytes(c, x->data, x->len);
}

static void codec_abort(wire_codec *c, gang_msg_abort *x)
{
    codec_i32(c, &x->rank);
    codec_i32(c, &x->code);
    codec_str(c, x->reason, sizeof x->reason);
}

/*
 * Walks the payload of m->type. Returns 0, or GANG_EINVAL for a type outside the protocol
 * (the decoder never gets here with one: the header check refuses it first).
 */
static int codec_payload(wire_codec *c, gang_msg *m)
{
    switch (m->type) {
    case GANG_MSG_CHALLENGE:
        codec_challenge(c, &m->u.challenge);
        return 0;
    case GANG_MSG_JOIN:
        codec_join(c, &m->u.join);
        return 0;
    case GANG_MSG_WELCOME:
        codec_welcome(c, &m->u.welcome);
        return 0;
    case GANG_MSG_REJECT:
        codec_reject(c, &m->u.reject);
        return 0;
    case GANG_MSG_BLOB_REQUEST:
    case GANG_MSG_BLOB:
    case GANG_MSG_START:
        codec_blob(c, &m->u.blob);
        return 0;
    case GANG_MSG_READY:
        codec_u32(c, &m->u.ready.node_index);
        return 0;
    case GANG_MSG_HEARTBEAT:
        codec_heartbeat(c, &m->u.heartbeat);
        return 0;
    case GANG_MSG_ABORT:
        codec_abort(c, &m->u.abort);
        return 0;
    case GANG_MSG_REJOIN:
        codec_u32(c, &m->u.rejoin.node_index);
        return 0;
    case GANG_MSG_GIVE_UP:
        codec_str(c, m->u.give_up.reason, sizeof m->u.give_up.reason);
        return 0;
    case GANG_MSG_API:
        codec_api(c, &m->u.api);
        return 0;
    default:
        return GANG_EINVAL;
    }
}

/* ---------------------------------------------------------------------------------
 * Public entry points.
 * --------------------------------------------------------------------------------- */

/*
 * Encodes m as one frame into buf[0..cap) (see rendezvous.h). Field validity is checked
 * before room, so a message that can never be sent gets GANG_EINVAL whatever cap is. buf
 * is left in an unspecified state on failure; *out_len is set only on success.
 */
int gang_wire_encode(const gang_msg *m, uint8_t *buf, size_t cap, size_t *out_len)
{
    wire_codec c = {.decoding = 0, .wbuf = buf, .cap = buf ? cap : 0, .off = GANG_WIRE_HEADER_SIZE};
    size_t payload_len;
    int rc;

    /* One walk serves both directions and writes through its pointer when decoding:
     * encoding walks a copy (about 9 KiB, against a syscall per frame). */
    gang_msg copy = *m;

    rc = codec_payload(&c, &copy);
    if (rc < 0)
        return rc;
    if (c.invalid)
        return GANG_EINVAL;
    payload_len = c.off - GANG_WIRE_HEADER_SIZE;
    /* No v2 message can reach the limit; the check keeps a future field from producing
     * a frame that every receiver would refuse. */
    if (payload_len > GANG_WIRE_MAX_PAYLOAD)
        return GANG_EINVAL;
    if (c.off > c.cap)
        return GANG_EMSGSIZE;

    store_le32(buf, GANG_WIRE_MAGIC);
    store_le16(buf + 4, GANG_WIRE_VERSION);
    store_le16(buf + 6, m->type);
    store_le64(buf + 8, m->generation);
    store_le32(buf + 16, (uint32_t)payload_len);
    *out_len = c.off;
    return 0;
}

/*
 * Parses and validates the 20-byte header at buf (see rendezvous.h). When at least 20
 * bytes are present *h is filled even if the header is then refused, so that the caller
 * can log what the peer sent. The checks run in the order magic, version, type, length:
 * a stream that is not ganglion at all is reported as such rather than as a bad version.
 */
int gang_wire_decode_header(const uint8_t *buf, size_t len, gang_wire_header *h)
{
    if (len < GANG_WIRE_HEADER_SIZE)
        return GANG_EAGAIN;
    h->magic = load_le32(buf);
    h->version = load_le16(buf + 4);
    h->type = load_le16(buf + 6);
    h->generation = load_le64(buf + 8);
    h->payload_len = load_le32(buf + 16);

    if (h->magic != GANG_WIRE_MAGIC)
        return GANG_EPROTO;
    if (h->version != GANG_WIRE_VERSION)
        return GANG_EVERSION;
    if (h->type < GANG_MSG_CHALLENGE || h->type > GANG_MSG_TYPE_MAX_)
        return GANG_EPROTO;
    if (h->payload_len > GANG_WIRE_MAX_PAYLOAD)
        return GANG_EMSGSIZE;
    return 0;
}

/*
 * Decodes one whole frame from buf[0..len) into m (see rendezvous.h). m is zeroed first,
 * so every string comes out NUL-terminated and every array entry past a decoded length
 * is 0; on any error m is left all zero rather than half filled. consumed may be NULL.
 */
int gang_wire_decode(const uint8_t *buf, size_t len, gang_msg *m, size_t *consumed)
{
    gang_wire_header h;
    wire_codec c;
    int rc;

    memset(m, 0, sizeof *m);
    rc = gang_wire_decode_header(buf, len, &h);
    if (rc < 0)
        return rc;
    /* The header check bounds payload_len, so the sum cannot overflow. */
    if (len - GANG_WIRE_HEADER_SIZE < h.payload_len)
        return GANG_EAGAIN;

    m->type = h.type;
    m->generation = h.generation;
    c = (wire_codec){.decoding = 1,
                     .rbuf = buf,
                     .end = GANG_WIRE_HEADER_SIZE + h.payload_len,
                     .off = GANG_WIRE_HEADER_SIZE};
    rc = codec_payload(&c, m);
    if (rc < 0)
        goto out_invalid;
    /* A truncated field, an out-of-bounds one and trailing bytes are all the same
     * protocol error: the peer does not speak v2 correctly. */
    if (c.invalid || c.off != c.end)
        goto out_invalid;
    if (consumed)
        *consumed = c.end;
    return 0;

out_invalid:
    memset(m, 0, sizeof *m);
    return GANG_EPROTO;
}
