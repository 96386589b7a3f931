/*
 * Wire protocol v2 codec: gang_msg <-> frame bytes. docs/protocol.md is the normative
 * description; the layout comment in include/ganglion/rendezvous.h is its summary.
 *
 * Each layout (the header and one payload per message struct) is written down exactly
 * once, as a function that walks the fields in wire order with the common codec
 * (gang_codec, common.h): the same walk encodes or decodes depending on the cursor's
 * direction, so the encoder and the decoder cannot drift apart.
 *
 * The decoder is the trust boundary of the rendezvous port: everything it reads comes
 * from a peer that may be broken or hostile. The codec never reads outside the bytes it
 * was given and checks every length against both the remaining input and the
 * destination's capacity before copying; a payload is accepted only when it is consumed
 * exactly. Strings travel as a u16 length and their bytes.
 */
#include <string.h>

#include "ganglion/rendezvous.h"

/* ---------------------------------------------------------------------------------
 * Layouts, one per struct, fields in declaration order.
 * --------------------------------------------------------------------------------- */

/* The 20-byte header (rendezvous.h). */
static void codec_header(gang_codec *c, gang_wire_header *h)
{
    gang_codec_u32(c, &h->magic);
    gang_codec_u16(c, &h->version);
    gang_codec_u16(c, &h->type);
    gang_codec_u64(c, &h->generation);
    gang_codec_u32(c, &h->payload_len);
}

static void codec_challenge(gang_codec *c, gang_msg_challenge *x)
{
    gang_codec_bytes(c, x->nonce, sizeof x->nonce);
    gang_codec_u8(c, &x->auth_required);
}

static void codec_join(gang_codec *c, gang_msg_join *x)
{
    gang_codec_str(c, x->job, sizeof x->job, 2);
    gang_codec_u32(c, &x->node_index);
    gang_codec_u32(c, &x->nnodes);
    gang_codec_u32(c, &x->nproc_per_node);
    gang_codec_u32(c, &x->tp);
    gang_codec_u32(c, &x->pp);
    gang_codec_bytes(c, x->model_digest, sizeof x->model_digest);
    gang_codec_u64(c, &x->generation_seen);
    gang_codec_str(c, x->host, sizeof x->host, 2);
    gang_codec_bytes(c, x->client_nonce, sizeof x->client_nonce);
    gang_codec_bytes(c, x->mac, sizeof x->mac);
}

static void codec_welcome(gang_codec *c, gang_msg_welcome *x)
{
    gang_codec_bytes(c, x->mac, sizeof x->mac);
    gang_codec_u32(c, &x->heartbeat_interval_ms);
    gang_codec_u32(c, &x->heartbeat_timeout_ms);
    gang_codec_u64(c, &x->generation);
}

static void codec_reject(gang_codec *c, gang_msg_reject *x)
{
    gang_codec_i32(c, &x->code);
    gang_codec_str(c, x->reason, sizeof x->reason, 2);
}

/* BLOB_REQUEST, BLOB and START: world_size, then the blob as u32 length + bytes. */
static void codec_blob(gang_codec *c, gang_msg_blob *x)
{
    gang_codec_u32(c, &x->world_size);
    gang_codec_blob(c, &x->len, 4, x->data, GANG_BLOB_MAX);
}

/*
 * Only the first nranks entries of each array travel: all nranks rank_state bytes first,
 * then all nranks rank_age_ms values, following the struct's field order.
 */
static void codec_heartbeat(gang_codec *c, gang_msg_heartbeat *x)
{
    gang_codec_u32(c, &x->node_index);
    gang_codec_u32(c, &x->state);
    gang_codec_blob(c, &x->nranks, 4, x->rank_state, GANG_MAX_LOCAL_RANKS);
    for (uint32_t i = 0; gang_codec_ok(c) && i < x->nranks; i++)
        gang_codec_u32(c, &x->rank_age_ms[i]);
}

static void codec_abort(gang_codec *c, gang_msg_abort *x)
{
    gang_codec_i32(c, &x->rank);
    gang_codec_i32(c, &x->code);
    gang_codec_str(c, x->reason, sizeof x->reason, 2);
}

/*
 * Walks the payload of m->type. Returns 0, or GANG_EINVAL for a type outside the protocol
 * (the decoder never gets here with one: the header check refuses it first).
 */
static int codec_payload(gang_codec *c, gang_msg *m)
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
        gang_codec_u32(c, &m->u.ready.node_index);
        return 0;
    case GANG_MSG_HEARTBEAT:
        codec_heartbeat(c, &m->u.heartbeat);
        return 0;
    case GANG_MSG_ABORT:
        codec_abort(c, &m->u.abort);
        return 0;
    case GANG_MSG_REJOIN:
        gang_codec_u32(c, &m->u.rejoin.node_index);
        return 0;
    case GANG_MSG_GIVE_UP:
        gang_codec_str(c, m->u.give_up.reason, sizeof m->u.give_up.reason, 2);
        return 0;
    case GANG_MSG_API:
        /* u32 length + opaque bytes, at most GANG_API_FRAME_MAX. */
        gang_codec_blob(c, &m->u.api.len, 4, m->u.api.data, GANG_API_FRAME_MAX);
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
    int room = buf != NULL && cap >= GANG_WIRE_HEADER_SIZE;
    gang_codec c;
    gang_wire_header h;
    int rc;

    /* The payload first, after the header's room, to learn its length. */
    gang_codec_encoder(&c, room ? buf + GANG_WIRE_HEADER_SIZE : NULL,
                       room ? cap - GANG_WIRE_HEADER_SIZE : 0);
    /* One walk serves both directions and writes through its pointer when decoding:
     * encoding walks a copy (about 9 KiB, against a syscall per frame). */
    gang_msg copy = *m;
    rc = codec_payload(&c, &copy);
    if (rc == 0)
        rc = gang_codec_finish(&c, NULL);
    if (rc < 0 && rc != GANG_EMSGSIZE)
        return rc;
    /* No v2 message can reach the limit; the check keeps a future field from producing
     * a frame that every receiver would refuse. */
    if (c.off > GANG_WIRE_MAX_PAYLOAD)
        return GANG_EINVAL;
    if (!room || rc == GANG_EMSGSIZE)
        return GANG_EMSGSIZE;

    h = (gang_wire_header){.magic = GANG_WIRE_MAGIC,
                           .version = GANG_WIRE_VERSION,
                           .type = m->type,
                           .generation = m->generation,
                           .payload_len = (uint32_t)c.off};
    gang_codec_encoder(&c, buf, GANG_WIRE_HEADER_SIZE);
    codec_header(&c, &h);
    rc = gang_codec_finish(&c, NULL);
    if (rc < 0)
        return rc;
    *out_len = GANG_WIRE_HEADER_SIZE + (size_t)h.payload_len;
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
    gang_codec c;

    if (len < GANG_WIRE_HEADER_SIZE)
        return GANG_EAGAIN;
    gang_codec_decoder(&c, buf, GANG_WIRE_HEADER_SIZE);
    codec_header(&c, h);
    if (gang_codec_finish(&c, NULL) < 0)
        return GANG_EPROTO; /* cannot happen: 20 bytes hold the header exactly */

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
    gang_codec c;
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
    gang_codec_decoder(&c, buf + GANG_WIRE_HEADER_SIZE, h.payload_len);
    rc = codec_payload(&c, m);
    /* A truncated field, an out-of-bounds one and trailing bytes are all the same
     * protocol error: the peer does not speak v2 correctly. */
    if (rc < 0 || gang_codec_finish(&c, NULL) < 0)
        goto out_invalid;
    if (consumed)
        *consumed = GANG_WIRE_HEADER_SIZE + (size_t)h.payload_len;
    return 0;

out_invalid:
    memset(m, 0, sizeof *m);
    return GANG_EPROTO;
}
