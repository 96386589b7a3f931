/*
 * The agent<->worker channel's packets (wctl.h has the layout): one description per
 * control message, written once with the common codec (gang_codec) for both directions;
 * request messages are engine.h's (gang_req_codec), behind the same type byte and
 * generation. The decoder is a process boundary, so it never trusts a length.
 */
#include <string.h>

#include "wctl.h"

/* Whether type is a control type of this channel. */
static int wctl_control_type(uint32_t type)
{
    return (type >= GANG_WCTL_HELLO && type <= GANG_WCTL_SHUTDOWN) || type == GANG_WCTL_GPU ||
           type == GANG_WCTL_MOE || type == GANG_WCTL_KV;
}

/* The blob of BLOB, READY, GPU, MOE and START: a u32 length and its bytes. */
static void wctl_blob(gang_codec *c, gang_wctl *m)
{
    gang_codec_blob(c, &m->blob_len, 4, m->blob, GANG_BLOB_MAX);
}

/* Every packet's header, control or request: its type in one byte, then the generation. */
static void wctl_header(gang_codec *c, uint32_t *type, uint64_t *gen)
{
    gang_codec_uint(c, type, 1, 0xFF);
    gang_codec_u64(c, gen);
}

/* The fields of control message m after its type and generation. */
static void wctl_fields(gang_codec *c, gang_wctl *m)
{
    switch (m->type) {
    case GANG_WCTL_HELLO:
        gang_codec_u32(c, &m->local_rank);
        gang_codec_i32(c, &m->pid);
        break;
    case GANG_WCTL_HEARTBEAT:
        gang_codec_u32(c, &m->state);
        break;
    case GANG_WCTL_BLOB:
    case GANG_WCTL_READY:
    case GANG_WCTL_GPU:
    case GANG_WCTL_MOE:
    case GANG_WCTL_KV:
        wctl_blob(c, m);
        break;
    case GANG_WCTL_START:
        gang_codec_u32(c, &m->rank);
        gang_codec_u32(c, &m->world_size);
        wctl_blob(c, m);
        break;
    case GANG_WCTL_ERROR:
        gang_codec_i32(c, &m->code);
        gang_codec_u32(c, &m->rank);
        gang_codec_str(c, m->reason, sizeof(m->reason), 2);
        break;
    default: /* BLOB_REQUEST, ABORT, ABORTED, SHUTDOWN: the header is all */
        break;
    }
}

int gang_wctl_encode(const gang_wctl *m, uint8_t *buf, size_t cap, size_t *len)
{
    gang_codec c;
    uint32_t type = m->type;
    uint64_t gen = m->generation;

    if (!wctl_control_type(type))
        return GANG_EINVAL;
    gang_codec_encoder(&c, buf, cap);
    wctl_header(&c, &type, &gen);
    /* One walk serves both directions and writes through its pointer when decoding:
     * encoding walks a copy. */
    gang_wctl copy = *m;
    wctl_fields(&c, &copy);
    return gang_codec_finish(&c, len);
}

int gang_wctl_encode_req(const gang_req_msg *r, uint8_t *buf, size_t cap, size_t *len)
{
    gang_codec c;
    uint32_t type = r->kind;
    uint64_t gen = r->generation;

    if (!gang_req_kind_valid(type))
        return GANG_EINVAL;
    gang_codec_encoder(&c, buf, cap);
    wctl_header(&c, &type, &gen);
    gang_req_msg copy = *r; /* the walk writes when decoding: encode a copy */
    gang_req_codec(&c, type, &copy);
    return gang_codec_finish(&c, len);
}

int gang_wctl_decode(const uint8_t *buf, size_t len, gang_wctl *m, gang_req_msg *r)
{
    gang_codec c;
    uint32_t type = 0;
    uint64_t gen = 0;
    int req;

    memset(m, 0, sizeof(*m));
    gang_codec_decoder(&c, buf, len);
    wctl_header(&c, &type, &gen);
    if (!gang_codec_ok(&c))
        return GANG_EPROTO;
    req = gang_req_kind_valid(type);
    if (req) {
        memset(r, 0, sizeof(*r));
        r->generation = gen;
        gang_req_codec(&c, type, r);
    } else if (wctl_control_type(type)) {
        m->type = type;
        m->generation = gen;
        wctl_fields(&c, m);
    } else {
        return GANG_EPROTO;
    }
    if (gang_codec_finish(&c, NULL) != 0) {
        memset(m, 0, sizeof(*m));
        if (req)
            memset(r, 0, sizeof(*r));
        return GANG_EPROTO;
    }
    return (int)type;
}
