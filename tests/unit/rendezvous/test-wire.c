/*
 * Wire protocol v2 codec and streaming reader tests: every message type round-trips with
 * varied field values, the byte layout matches the normative header table, every kind of
 * malformed frame is refused with the documented code, and the reader delivers frames
 * exactly when they complete, whatever the chunking of the stream.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "ganglion/rendezvous.h"
#include "rdzv-tests.h"

/* ---------------------------------------------------------------------------------
 * Helpers
 * --------------------------------------------------------------------------------- */

/* Deterministic xorshift64 so that a failure reproduces run after run. */
static uint64_t rng_next(uint64_t *s)
{
    uint64_t x = *s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    *s = x;
    return x;
}

static uint32_t rng_below(uint64_t *s, uint32_t n)
{
    return (uint32_t)(rng_next(s) % n);
}

static void rng_bytes(uint64_t *s, uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (uint8_t)rng_next(s);
}

/*
 * A string of capacity cap: mode 0 = random length, 1 = the longest that fits, 2 = empty.
 * Any byte but NUL is legal on the wire, so the contents are not restricted to ASCII.
 */
static void rng_str(uint64_t *s, char *dst, size_t cap, int mode)
{
    size_t len = mode == 1 ? cap - 1 : mode == 2 ? 0 : rng_below(s, (uint32_t)cap);

    memset(dst, 0, cap);
    for (size_t i = 0; i < len; i++)
        dst[i] = (char)(1 + rng_below(s, 255));
}

/* Fills m with a message of type t; mode as for rng_str, also applied to lengths. */
static void fill_msg(uint64_t *s, uint16_t t, int mode, gang_msg *m)
{
    memset(m, 0, sizeof *m);
    m->type = t;
    m->generation = rng_next(s);
    switch (t) {
    case GANG_MSG_CHALLENGE:
        rng_bytes(s, m->u.challenge.nonce, GANG_NONCE_SIZE);
        m->u.challenge.auth_required = (uint8_t)rng_next(s);
        break;
    case GANG_MSG_JOIN: {
        gang_msg_join *j = &m->u.join;
        rng_str(s, j->job, sizeof j->job, mode);
        j->node_index = (uint32_t)rng_next(s);
        j->nnodes = (uint32_t)rng_next(s);
        j->nproc_per_node = (uint32_t)rng_next(s);
        j->tp = (uint32_t)rng_next(s);
        j->pp = (uint32_t)rng_next(s);
        rng_bytes(s, j->model_digest, sizeof j->model_digest);
        j->generation_seen = rng_next(s);
        rng_str(s, j->host, sizeof j->host, mode);
        rng_bytes(s, j->client_nonce, sizeof j->client_nonce);
        rng_bytes(s, j->mac, sizeof j->mac);
        break;
    }
    case GANG_MSG_WELCOME:
        rng_bytes(s, m->u.welcome.mac, GANG_MAC_SIZE);
        m->u.welcome.heartbeat_interval_ms = (uint32_t)rng_next(s);
        m->u.welcome.heartbeat_timeout_ms = (uint32_t)rng_next(s);
        m->u.welcome.generation = rng_next(s);
        break;
    case GANG_MSG_REJECT:
        m->u.reject.code = (int32_t)rng_next(s);
        rng_str(s, m->u.reject.reason, sizeof m->u.reject.reason, mode);
        break;
    case GANG_MSG_BLOB_REQUEST:
    case GANG_MSG_BLOB:
    case GANG_MSG_START:
        m->u.blob.world_size = (uint32_t)rng_next(s);
        m->u.blob.len = mode == 1 ? GANG_BLOB_MAX : mode == 2 ? 0 : rng_below(s, GANG_BLOB_MAX + 1);
        rng_bytes(s, m->u.blob.data, m->u.blob.len);
        break;
    case GANG_MSG_READY:
        m->u.ready.node_index = (uint32_t)rng_next(s);
        break;
    case GANG_MSG_HEARTBEAT: {
        gang_msg_heartbeat *h = &m->u.heartbeat;
        h->node_index = (uint32_t)rng_next(s);
        h->state = (uint32_t)rng_next(s);
        h->nranks = mode == 1   ? GANG_MAX_LOCAL_RANKS
                    : mode == 2 ? 0
                                : rng_below(s, GANG_MAX_LOCAL_RANKS + 1);
        rng_bytes(s, h->rank_state, h->nranks);
        for (uint32_t i = 0; i < h->nranks; i++)
            h->rank_age_ms[i] = (uint32_t)rng_next(s);
        break;
    }
    case GANG_MSG_ABORT:
        m->u.abort.rank = (int32_t)rng_next(s);
        m->u.abort.code = (int32_t)rng_next(s);
        rng_str(s, m->u.abort.reason, sizeof m->u.abort.reason, mode);
        break;
    case GANG_MSG_REJOIN:
        m->u.rejoin.node_index = (uint32_t)rng_next(s);
        break;
    case GANG_MSG_GIVE_UP:
        rng_str(s, m->u.give_up.reason, sizeof m->u.give_up.reason, mode);
        break;
    case GANG_MSG_API:
        m->u.api.len = mode == 1   ? GANG_API_FRAME_MAX
                       : mode == 2 ? 1
                                   : 1 + rng_below(s, GANG_API_FRAME_MAX);
        rng_bytes(s, m->u.api.data, m->u.api.len);
        break;
    default:
        fail_msg("fill_msg: unknown type %u", t);
    }
}

static void put_le(uint8_t *p, uint64_t v, int n)
{
    for (int i = 0; i < n; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

/* Hand-built frames, for the malformed cases an encoder refuses to produce. */
typedef struct frame_builder {
    uint8_t buf[GANG_WIRE_MAX_FRAME + 64];
    size_t len;
} frame_builder;

static void fb_begin(frame_builder *f, uint16_t type)
{
    memset(f, 0, sizeof *f);
    put_le(f->buf, GANG_WIRE_MAGIC, 4);
    put_le(f->buf + 4, GANG_WIRE_VERSION, 2);
    put_le(f->buf + 6, type, 2);
    put_le(f->buf + 8, 7, 8);
    f->len = GANG_WIRE_HEADER_SIZE;
}

static void fb_int(frame_builder *f, uint64_t v, int n)
{
    put_le(f->buf + f->len, v, n);
    f->len += (size_t)n;
}

static void fb_fill(frame_builder *f, uint8_t byte, size_t n)
{
    memset(f->buf + f->len, byte, n);
    f->len += n;
}

/* Patches payload_len to match what was appended. */
static void fb_end(frame_builder *f)
{
    put_le(f->buf + 16, f->len - GANG_WIRE_HEADER_SIZE, 4);
}

static int decode_fb(const frame_builder *f)
{
    gang_msg m;
    size_t used = 0;
    return gang_wire_decode(f->buf, f->len, &m, &used);
}

static size_t encode_ok(const gang_msg *m, uint8_t *buf, size_t cap)
{
    size_t len = 0;
    assert_int_equal(gang_wire_encode(m, buf, cap, &len), 0);
    assert_true(len >= GANG_WIRE_HEADER_SIZE && len <= cap);
    return len;
}

static uint8_t frame[GANG_WIRE_MAX_FRAME + 64];
static gang_msg msg_a, msg_b;

/* ---------------------------------------------------------------------------------
 * Round trips and layout
 * --------------------------------------------------------------------------------- */

static void test_roundtrip_every_type(void **state)
{
    uint64_t s = 0x9E3779B97F4A7C15ull;
    (void)state;

    for (uint16_t t = GANG_MSG_CHALLENGE; t <= GANG_MSG_TYPE_MAX_; t++) {
        for (int iter = 0; iter < 64; iter++) {
            size_t len, used = 0;
            /* The first iterations pin the extremes: every field at capacity, then empty. */
            fill_msg(&s, t, iter < 2 ? iter + 1 : 0, &msg_a);
            len = encode_ok(&msg_a, frame, sizeof frame);
            memset(&msg_b, 0x5A, sizeof msg_b);
            assert_int_equal(gang_wire_decode(frame, len, &msg_b, &used), 0);
            assert_int_equal(used, len);
            assert_int_equal(msg_b.type, t);
            assert_true(msg_b.generation == msg_a.generation);
            assert_memory_equal(&msg_a, &msg_b, sizeof msg_a);
        }
    }
}

/* The normative header table, byte for byte, plus a READY payload. */
static void test_header_layout(void **state)
{
    static const uint8_t want[] = {
        'G',  'A',  'N',  'G',                          /* magic 0x474E4147 LE */
        0x02, 0x00,                                     /* version 2 */
        0x08, 0x00,                                     /* type READY */
        0x08, 0x07, 0x06, 0x05, 0x04, 0x03, 0x02, 0x01, /* generation */
        0x04, 0x00, 0x00, 0x00,                         /* payload_len */
        0x44, 0x33, 0x22, 0x11,                         /* node_index */
    };
    gang_wire_header h;
    size_t len;
    (void)state;

    memset(&msg_a, 0, sizeof msg_a);
    msg_a.type = GANG_MSG_READY;
    msg_a.generation = 0x0102030405060708ull;
    msg_a.u.ready.node_index = 0x11223344u;
    len = encode_ok(&msg_a, frame, sizeof frame);
    assert_int_equal(len, sizeof want);
    assert_memory_equal(frame, want, sizeof want);

    assert_int_equal(gang_wire_decode_header(frame, len, &h), 0);
    assert_int_equal(h.magic, GANG_WIRE_MAGIC);
    assert_int_equal(h.version, 2);
    assert_int_equal(h.type, GANG_MSG_READY);
    assert_true(h.generation == 0x0102030405060708ull);
    assert_int_equal(h.payload_len, 4);
}

/* Strings travel as u16 length + bytes, integers of the heartbeat arrays after the states. */
static void test_payload_layout(void **state)
{
    size_t len;
    (void)state;

    memset(&msg_a, 0, sizeof msg_a);
    msg_a.type = GANG_MSG_GIVE_UP;
    strcpy(msg_a.u.give_up.reason, "budget");
    len = encode_ok(&msg_a, frame, sizeof frame);
    assert_int_equal(len, GANG_WIRE_HEADER_SIZE + 2 + 6);
    assert_memory_equal(frame + GANG_WIRE_HEADER_SIZE,
                        "\x06\x00"
                        "budget",
                        8);

    memset(&msg_a, 0, sizeof msg_a);
    msg_a.type = GANG_MSG_HEARTBEAT;
    msg_a.u.heartbeat.node_index = 1;
    msg_a.u.heartbeat.state = 3;
    msg_a.u.heartbeat.nranks = 2;
    msg_a.u.heartbeat.rank_state[0] = GANG_RANK_READY;
    msg_a.u.heartbeat.rank_state[1] = GANG_RANK_FAILED;
    msg_a.u.heartbeat.rank_age_ms[0] = 0x0A0B;
    msg_a.u.heartbeat.rank_age_ms[1] = 0x0C0D;
    msg_a.u.heartbeat.rank_state[2] = 9; /* beyond nranks: must not travel */
    len = encode_ok(&msg_a, frame, sizeof frame);
    assert_int_equal(len, GANG_WIRE_HEADER_SIZE + 12 + 2 + 8);
    assert_memory_equal(frame + GANG_WIRE_HEADER_SIZE,
                        "\x01\0\0\0"
                        "\x03\0\0\0"
                        "\x02\0\0\0"
                        "\x03\x05"
                        "\x0B\x0A\0\0"
                        "\x0D\x0C\0\0",
                        22);
}

/* Decode zeroes the output first: strings end in NUL whatever m held before. */
static void test_decode_zeroes_output(void **state)
{
    size_t len, used = 0;
    (void)state;

    memset(&msg_a, 0, sizeof msg_a);
    msg_a.type = GANG_MSG_GIVE_UP;
    strcpy(msg_a.u.give_up.reason, "x");
    len = encode_ok(&msg_a, frame, sizeof frame);
    memset(&msg_b, 0xAA, sizeof msg_b);
    assert_int_equal(gang_wire_decode(frame, len, &msg_b, &used), 0);
    assert_string_equal(msg_b.u.give_up.reason, "x");
    for (size_t i = 1; i < sizeof msg_b.u.give_up.reason; i++)
        assert_int_equal(msg_b.u.give_up.reason[i], 0);

    /* On failure the output is all zero, never half filled. */
    frame[len - 1] = '\0';
    memset(&msg_b, 0xAA, sizeof msg_b);
    assert_int_equal(gang_wire_decode(frame, len, &msg_b, &used), GANG_EPROTO);
    memset(&msg_a, 0, sizeof msg_a);
    assert_memory_equal(&msg_a, &msg_b, sizeof msg_b);
}

/* ---------------------------------------------------------------------------------
 * Header rejections
 * --------------------------------------------------------------------------------- */

static void test_bad_magic(void **state)
{
    gang_wire_header h;
    size_t len, used;
    uint64_t s = 1;
    (void)state;

    fill_msg(&s, GANG_MSG_READY, 0, &msg_a);
    len = encode_ok(&msg_a, frame, sizeof frame);
    for (int i = 0; i < 4; i++) {
        frame[i] ^= 0x20;
        assert_int_equal(gang_wire_decode_header(frame, len, &h), GANG_EPROTO);
        assert_int_equal(gang_wire_decode(frame, len, &msg_b, &used), GANG_EPROTO);
        frame[i] ^= 0x20;
    }
    assert_int_equal(gang_wire_decode(frame, len, &msg_b, &used), 0);
}

static void test_unknown_version(void **state)
{
    /* 1: a v1 peer (no session tags) is refused, not misread. */
    static const uint16_t bad[] = {0, 1, 3, 0x100, 0xFFFF};
    gang_wire_header h;
    size_t len, used;
    uint64_t s = 2;
    (void)state;

    fill_msg(&s, GANG_MSG_REJOIN, 0, &msg_a);
    len = encode_ok(&msg_a, frame, sizeof frame);
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        put_le(frame + 4, bad[i], 2);
        assert_int_equal(gang_wire_decode_header(frame, len, &h), GANG_EVERSION);
        assert_int_equal(h.version, bad[i]);
        assert_int_equal(gang_wire_decode(frame, len, &msg_b, &used), GANG_EVERSION);
    }
}

static void test_unknown_type(void **state)
{
    static const uint16_t bad[] = {0, GANG_MSG_TYPE_MAX_ + 1, 0x0100, 0xFFFF};
    gang_wire_header h;
    size_t len, used;
    uint64_t s = 3;
    (void)state;

    fill_msg(&s, GANG_MSG_READY, 0, &msg_a);
    len = encode_ok(&msg_a, frame, sizeof frame);
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        put_le(frame + 6, bad[i], 2);
        assert_int_equal(gang_wire_decode_header(frame, len, &h), GANG_EPROTO);
        assert_int_equal(gang_wire_decode(frame, len, &msg_b, &used), GANG_EPROTO);
    }
}

static void test_oversized_payload_len(void **state)
{
    gang_wire_header h;
    frame_builder *f = malloc(sizeof *f);
    size_t used;
    (void)state;

    assert_non_null(f);
    fb_begin(f, GANG_MSG_BLOB);
    put_le(f->buf + 16, GANG_WIRE_MAX_PAYLOAD + 1, 4);
    /* Only the header is present: the length alone must be enough to refuse it. */
    assert_int_equal(gang_wire_decode_header(f->buf, f->len, &h), GANG_EMSGSIZE);
    assert_int_equal(gang_wire_decode(f->buf, f->len, &msg_b, &used), GANG_EMSGSIZE);
    put_le(f->buf + 16, 0xFFFFFFFFu, 4);
    assert_int_equal(gang_wire_decode(f->buf, f->len, &msg_b, &used), GANG_EMSGSIZE);
    /* The maximum itself is a legal length: the frame is merely incomplete. */
    put_le(f->buf + 16, GANG_WIRE_MAX_PAYLOAD, 4);
    assert_int_equal(gang_wire_decode_header(f->buf, f->len, &h), 0);
    assert_int_equal(gang_wire_decode(f->buf, f->len, &msg_b, &used), GANG_EAGAIN);
    free(f);
}

/* A short buffer is "not yet", at every length below the frame's, for every type. */
static void test_incomplete_is_eagain(void **state)
{
    gang_wire_header h;
    uint64_t s = 4;
    (void)state;

    for (uint16_t t = GANG_MSG_CHALLENGE; t <= GANG_MSG_TYPE_MAX_; t++) {
        size_t len, used = 12345;
        fill_msg(&s, t, 0, &msg_a);
        len = encode_ok(&msg_a, frame, sizeof frame);
        for (size_t cut = 0; cut < len; cut++) {
            assert_int_equal(gang_wire_decode(frame, cut, &msg_b, &used), GANG_EAGAIN);
            assert_int_equal(used, 12345);
        }
        assert_int_equal(gang_wire_decode_header(frame, GANG_WIRE_HEADER_SIZE - 1, &h),
                         GANG_EAGAIN);
    }
}

/* ---------------------------------------------------------------------------------
 * Payload rejections
 * --------------------------------------------------------------------------------- */

/* A payload_len shorter than the fields it announces is a truncated payload. */
static void test_truncated_payload(void **state)
{
    uint64_t s = 5;
    (void)state;

    for (uint16_t t = GANG_MSG_CHALLENGE; t <= GANG_MSG_TYPE_MAX_; t++) {
        size_t len, used;
        uint32_t plen;
        fill_msg(&s, t, 0, &msg_a);
        len = encode_ok(&msg_a, frame, sizeof frame);
        plen = (uint32_t)(len - GANG_WIRE_HEADER_SIZE);
        assert_true(plen > 0);
        for (uint32_t k = 1; k <= plen; k++) {
            put_le(frame + 16, plen - k, 4);
            assert_int_equal(gang_wire_decode(frame, len - k, &msg_b, &used), GANG_EPROTO);
        }
    }
}

static void test_trailing_bytes(void **state)
{
    uint64_t s = 6;
    (void)state;

    for (uint16_t t = GANG_MSG_CHALLENGE; t <= GANG_MSG_TYPE_MAX_; t++) {
        size_t len, used;
        fill_msg(&s, t, 0, &msg_a);
        len = encode_ok(&msg_a, frame, sizeof frame);
        frame[len] = 0;
        put_le(frame + 16, len + 1 - GANG_WIRE_HEADER_SIZE, 4);
        assert_int_equal(gang_wire_decode(frame, len + 1, &msg_b, &used), GANG_EPROTO);
    }
}

static void test_string_too_long(void **state)
{
    frame_builder *f = malloc(sizeof *f);
    (void)state;

    assert_non_null(f);
    /* GIVE_UP: reason capacity 256 holds 255 bytes. */
    fb_begin(f, GANG_MSG_GIVE_UP);
    fb_int(f, GANG_REASON_MAX - 1, 2);
    fb_fill(f, 'r', GANG_REASON_MAX - 1);
    fb_end(f);
    assert_int_equal(decode_fb(f), 0);
    fb_begin(f, GANG_MSG_GIVE_UP);
    fb_int(f, GANG_REASON_MAX, 2);
    fb_fill(f, 'r', GANG_REASON_MAX);
    fb_end(f);
    assert_int_equal(decode_fb(f), GANG_EPROTO);
    fb_begin(f, GANG_MSG_GIVE_UP);
    fb_int(f, 0xFFFF, 2);
    fb_fill(f, 'r', 300);
    fb_end(f);
    assert_int_equal(decode_fb(f), GANG_EPROTO);

    /* JOIN: job capacity 64; the rest of the payload is well-formed. */
    for (int joblen = GANG_JOB_MAX - 1; joblen <= GANG_JOB_MAX; joblen++) {
        fb_begin(f, GANG_MSG_JOIN);
        fb_int(f, (uint64_t)joblen, 2);
        fb_fill(f, 'j', (size_t)joblen);
        fb_fill(f, 1, 5 * 4 + GANG_DIGEST_SIZE + 8); /* indices, digest, generation_seen */
        fb_int(f, 4, 2);
        fb_fill(f, 'h', 4);
        fb_fill(f, 2, GANG_NONCE_SIZE + GANG_MAC_SIZE);
        fb_end(f);
        assert_int_equal(decode_fb(f), joblen < GANG_JOB_MAX ? 0 : GANG_EPROTO);
    }
    free(f);
}

static void test_nul_in_string(void **state)
{
    size_t len, used;
    uint64_t s = 7;
    (void)state;

    memset(&msg_a, 0, sizeof msg_a);
    msg_a.type = GANG_MSG_REJECT;
    strcpy(msg_a.u.reject.reason, "hello");
    len = encode_ok(&msg_a, frame, sizeof frame);
    assert_int_equal(gang_wire_decode(frame, len, &msg_b, &used), 0);
    frame[GANG_WIRE_HEADER_SIZE + 4 + 2 + 2] = '\0'; /* code, length, "he" */
    assert_int_equal(gang_wire_decode(frame, len, &msg_b, &used), GANG_EPROTO);

    /* The last byte of a string, and a string in the middle of a payload (JOIN's host). */
    fill_msg(&s, GANG_MSG_JOIN, 0, &msg_a);
    strcpy(msg_a.u.join.job, "job");
    strcpy(msg_a.u.join.host, "node-1");
    len = encode_ok(&msg_a, frame, sizeof frame);
    assert_int_equal(gang_wire_decode(frame, len, &msg_b, &used), 0);
    frame[GANG_WIRE_HEADER_SIZE + 2 + 2] = '\0';
    assert_int_equal(gang_wire_decode(frame, len, &msg_b, &used), GANG_EPROTO);
    frame[GANG_WIRE_HEADER_SIZE + 2 + 2] = 'b';
    frame[GANG_WIRE_HEADER_SIZE + 2 + 3 + 20 + 32 + 8 + 2 + 3] = '\0'; /* "nod\0-1" */
    assert_int_equal(gang_wire_decode(frame, len, &msg_b, &used), GANG_EPROTO);
}

/* API frames: an opaque payload of at most GANG_API_FRAME_MAX bytes, length exact. */
static void test_api_len_bounds(void **state)
{
    frame_builder *f = malloc(sizeof *f);
    (void)state;

    assert_non_null(f);
    fb_begin(f, GANG_MSG_API);
    fb_int(f, GANG_API_FRAME_MAX, 4);
    fb_fill(f, 0xA9, GANG_API_FRAME_MAX);
    fb_end(f);
    size_t used = 0;
    assert_int_equal(gang_wire_decode(f->buf, f->len, &msg_b, &used), 0);
    assert_int_equal(used, f->len);
    assert_int_equal(msg_b.u.api.len, GANG_API_FRAME_MAX);
    assert_int_equal(msg_b.u.api.data[GANG_API_FRAME_MAX - 1], 0xA9);

    fb_begin(f, GANG_MSG_API);
    fb_int(f, GANG_API_FRAME_MAX + 1, 4);
    fb_fill(f, 0xA9, GANG_API_FRAME_MAX + 1);
    fb_end(f);
    assert_int_equal(decode_fb(f), GANG_EPROTO);

    fb_begin(f, GANG_MSG_API);
    fb_int(f, 100, 4);
    fb_fill(f, 0xA9, 99);
    fb_end(f);
    assert_int_equal(decode_fb(f), GANG_EPROTO);

    msg_a.type = GANG_MSG_API;
    msg_a.u.api.len = GANG_API_FRAME_MAX + 1;
    size_t len = 0;
    assert_int_equal(gang_wire_encode(&msg_a, frame, sizeof frame, &len), GANG_EINVAL);
    free(f);
}

static void test_blob_len_bounds(void **state)
{
    frame_builder *f = malloc(sizeof *f);
    (void)state;

    assert_non_null(f);
    for (uint16_t t = GANG_MSG_BLOB_REQUEST; t <= GANG_MSG_START; t++) {
        fb_begin(f, t);
        fb_int(f, 4, 4);
        fb_int(f, GANG_BLOB_MAX, 4);
        fb_fill(f, 0xB0, GANG_BLOB_MAX);
        fb_end(f);
        assert_int_equal(decode_fb(f), 0);

        fb_begin(f, t);
        fb_int(f, 4, 4);
        fb_int(f, GANG_BLOB_MAX + 1, 4);
        fb_fill(f, 0xB0, GANG_BLOB_MAX + 1);
        fb_end(f);
        assert_int_equal(decode_fb(f), GANG_EPROTO);

        /* A length that claims more than the payload holds. */
        fb_begin(f, t);
        fb_int(f, 4, 4);
        fb_int(f, 100, 4);
        fb_fill(f, 0xB0, 50);
        fb_end(f);
        assert_int_equal(decode_fb(f), GANG_EPROTO);

        fb_begin(f, t);
        fb_int(f, 4, 4);
        fb_int(f, 0xFFFFFFFFu, 4);
        fb_end(f);
        assert_int_equal(decode_fb(f), GANG_EPROTO);
    }
    free(f);
}

static void test_nranks_bounds(void **state)
{
    frame_builder *f = malloc(sizeof *f);
    static const uint32_t bad[] = {GANG_MAX_LOCAL_RANKS + 1, 0x10000, 0xFFFFFFFFu};
    (void)state;

    assert_non_null(f);
    fb_begin(f, GANG_MSG_HEARTBEAT);
    fb_int(f, 1, 4);
    fb_int(f, 0, 4);
    fb_int(f, GANG_MAX_LOCAL_RANKS, 4);
    fb_fill(f, GANG_RANK_READY, GANG_MAX_LOCAL_RANKS);
    fb_fill(f, 0, 4 * GANG_MAX_LOCAL_RANKS);
    fb_end(f);
    assert_int_equal(decode_fb(f), 0);

    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        fb_begin(f, GANG_MSG_HEARTBEAT);
        fb_int(f, 1, 4);
        fb_int(f, 0, 4);
        fb_int(f, bad[i], 4);
        /* Enough bytes for 65 entries, so only the bound can refuse it. */
        fb_fill(f, GANG_RANK_READY, GANG_MAX_LOCAL_RANKS + 1);
        fb_fill(f, 0, 4 * (GANG_MAX_LOCAL_RANKS + 1));
        fb_end(f);
        assert_int_equal(decode_fb(f), GANG_EPROTO);
    }
    free(f);
}

/* ---------------------------------------------------------------------------------
 * Encoder rejections
 * --------------------------------------------------------------------------------- */

static void test_encode_invalid_fields(void **state)
{
    size_t len = 777;
    uint64_t s = 8;
    (void)state;

    memset(&msg_a, 0, sizeof msg_a);
    msg_a.type = 0;
    assert_int_equal(gang_wire_encode(&msg_a, frame, sizeof frame, &len), GANG_EINVAL);
    msg_a.type = GANG_MSG_TYPE_MAX_ + 1;
    assert_int_equal(gang_wire_encode(&msg_a, frame, sizeof frame, &len), GANG_EINVAL);

    /* A string that fills its whole capacity has no NUL: it cannot be sent. */
    fill_msg(&s, GANG_MSG_JOIN, 0, &msg_a);
    memset(msg_a.u.join.job, 'j', sizeof msg_a.u.join.job);
    assert_int_equal(gang_wire_encode(&msg_a, frame, sizeof frame, &len), GANG_EINVAL);
    fill_msg(&s, GANG_MSG_JOIN, 0, &msg_a);
    memset(msg_a.u.join.host, 'h', sizeof msg_a.u.join.host);
    assert_int_equal(gang_wire_encode(&msg_a, frame, sizeof frame, &len), GANG_EINVAL);
    fill_msg(&s, GANG_MSG_ABORT, 0, &msg_a);
    memset(msg_a.u.abort.reason, 'r', sizeof msg_a.u.abort.reason);
    assert_int_equal(gang_wire_encode(&msg_a, frame, sizeof frame, &len), GANG_EINVAL);

    fill_msg(&s, GANG_MSG_START, 0, &msg_a);
    msg_a.u.blob.len = GANG_BLOB_MAX + 1;
    assert_int_equal(gang_wire_encode(&msg_a, frame, sizeof frame, &len), GANG_EINVAL);
    /* An invalid field wins over a small buffer: the message can never be sent. */
    assert_int_equal(gang_wire_encode(&msg_a, NULL, 0, &len), GANG_EINVAL);

    fill_msg(&s, GANG_MSG_HEARTBEAT, 0, &msg_a);
    msg_a.u.heartbeat.nranks = GANG_MAX_LOCAL_RANKS + 1;
    assert_int_equal(gang_wire_encode(&msg_a, frame, sizeof frame, &len), GANG_EINVAL);
    assert_int_equal(len, 777);
}

static void test_encode_cap_too_small(void **state)
{
    uint64_t s = 9;
    (void)state;

    for (uint16_t t = GANG_MSG_CHALLENGE; t <= GANG_MSG_TYPE_MAX_; t++) {
        size_t len, out = 0;
        fill_msg(&s, t, 1, &msg_a);
        len = encode_ok(&msg_a, frame, sizeof frame);
        assert_int_equal(gang_wire_encode(&msg_a, NULL, 0, &out), GANG_EMSGSIZE);
        for (size_t cap = 0; cap < len; cap += (cap < 64 ? 1 : 97))
            assert_int_equal(gang_wire_encode(&msg_a, frame, cap, &out), GANG_EMSGSIZE);
        assert_int_equal(gang_wire_encode(&msg_a, frame, len - 1, &out), GANG_EMSGSIZE);
        assert_int_equal(gang_wire_encode(&msg_a, frame, len, &out), 0);
        assert_int_equal(out, len);
    }
}

/* ---------------------------------------------------------------------------------
 * Streaming reader
 * --------------------------------------------------------------------------------- */

/* One frame of every type, back to back; ends[i] is the end offset of frame i. */
static size_t build_stream(uint64_t *s, uint8_t *buf, size_t cap, gang_msg *msgs, size_t *ends)
{
    size_t off = 0;

    for (uint16_t t = GANG_MSG_CHALLENGE; t <= GANG_MSG_TYPE_MAX_; t++) {
        gang_msg *m = &msgs[t - 1];
        size_t len = 0;
        fill_msg(s, t, 0, m);
        /* Keep blobs modest so that the stream stays small enough to feed byte by byte. */
        if (t >= GANG_MSG_BLOB_REQUEST && t <= GANG_MSG_START) {
            m->u.blob.len %= 300;
            memset(m->u.blob.data + m->u.blob.len, 0, GANG_BLOB_MAX - m->u.blob.len);
        }
        assert_int_equal(gang_wire_encode(m, buf + off, cap - off, &len), 0);
        off += len;
        ends[t - 1] = off;
    }
    return off;
}

static void test_reader_byte_by_byte(void **state)
{
    static gang_msg msgs[GANG_MSG_TYPE_MAX_];
    size_t ends[GANG_MSG_TYPE_MAX_];
    gang_wire_reader *r = gang_wire_reader_new();
    uint64_t s = 10;
    size_t total, got = 0;
    (void)state;

    assert_non_null(r);
    assert_int_equal(gang_wire_reader_space(r), GANG_WIRE_MAX_FRAME);
    assert_int_equal(gang_wire_reader_pending(r), 0);
    total = build_stream(&s, frame, sizeof frame, msgs, ends);
    for (size_t i = 0; i < total; i++) {
        assert_int_equal(gang_wire_reader_feed(r, frame + i, 1), 0);
        if (got < GANG_MSG_TYPE_MAX_ && i + 1 == ends[got]) {
            /* The message appears exactly when its last byte arrives... */
            assert_int_equal(gang_wire_reader_next(r, &msg_b), 1);
            assert_memory_equal(&msgs[got], &msg_b, sizeof msg_b);
            got++;
        }
        /* ...and never earlier. */
        assert_int_equal(gang_wire_reader_next(r, &msg_b), 0);
    }
    assert_int_equal(got, GANG_MSG_TYPE_MAX_);
    assert_int_equal(gang_wire_reader_pending(r), 0);
    assert_int_equal(gang_wire_reader_space(r), GANG_WIRE_MAX_FRAME);
    gang_wire_reader_free(r);
}

static void test_reader_two_frames_one_feed(void **state)
{
    gang_wire_reader *r = gang_wire_reader_new();
    uint64_t s = 11;
    size_t l1, l2, l3;
    gang_msg m1, m2;
    (void)state;

    assert_non_null(r);
    fill_msg(&s, GANG_MSG_HEARTBEAT, 0, &m1);
    fill_msg(&s, GANG_MSG_ABORT, 0, &m2);
    fill_msg(&s, GANG_MSG_JOIN, 0, &msg_a);
    l1 = encode_ok(&m1, frame, sizeof frame);
    l2 = encode_ok(&m2, frame + l1, sizeof frame - l1);
    l3 = encode_ok(&msg_a, frame + l1 + l2, sizeof frame - l1 - l2);

    /* Two whole frames and half of a third in one feed. */
    assert_int_equal(gang_wire_reader_feed(r, frame, l1 + l2 + l3 / 2), 0);
    assert_int_equal(gang_wire_reader_pending(r), l1 + l2 + l3 / 2);
    assert_int_equal(gang_wire_reader_next(r, &msg_b), 1);
    assert_memory_equal(&m1, &msg_b, sizeof msg_b);
    assert_int_equal(gang_wire_reader_next(r, &msg_b), 1);
    assert_memory_equal(&m2, &msg_b, sizeof msg_b);
    assert_int_equal(gang_wire_reader_next(r, &msg_b), 0);
    assert_int_equal(gang_wire_reader_pending(r), l3 / 2);
    assert_int_equal(gang_wire_reader_feed(r, frame + l1 + l2 + l3 / 2, l3 - l3 / 2), 0);
    assert_int_equal(gang_wire_reader_next(r, &msg_b), 1);
    assert_memory_equal(&msg_a, &msg_b, sizeof msg_b);
    assert_int_equal(gang_wire_reader_next(r, &msg_b), 0);
    assert_int_equal(gang_wire_reader_pending(r), 0);
    gang_wire_reader_free(r);
}

/* Feeds just a header, one byte at a time; returns what next() says once it is whole. */
static int reader_header_verdict(const uint8_t *hdr)
{
    gang_wire_reader *r = gang_wire_reader_new();
    int rc;

    assert_non_null(r);
    for (size_t i = 0; i + 1 < GANG_WIRE_HEADER_SIZE; i++) {
        assert_int_equal(gang_wire_reader_feed(r, hdr + i, 1), 0);
        assert_int_equal(gang_wire_reader_next(r, &msg_b), 0);
    }
    assert_int_equal(gang_wire_reader_feed(r, hdr + GANG_WIRE_HEADER_SIZE - 1, 1), 0);
    rc = gang_wire_reader_next(r, &msg_b);
    if (rc < 0) {
        /* The error is sticky: the stream cannot be resynchronised. */
        assert_int_equal(gang_wire_reader_next(r, &msg_b), rc);
        assert_int_equal(gang_wire_reader_feed(r, hdr, 1), rc);
    }
    gang_wire_reader_free(r);
    return rc;
}

static void test_reader_bad_header_early(void **state)
{
    uint8_t hdr[GANG_WIRE_HEADER_SIZE];
    (void)state;

    /* A header that announces a 1000-byte payload: no payload byte is ever sent. */
    put_le(hdr, GANG_WIRE_MAGIC, 4);
    put_le(hdr + 4, GANG_WIRE_VERSION, 2);
    put_le(hdr + 6, GANG_MSG_BLOB, 2);
    put_le(hdr + 8, 1, 8);
    put_le(hdr + 16, 1000, 4);
    assert_int_equal(reader_header_verdict(hdr), 0);

    hdr[0] = 'H'; /* an HTTP client on the rendezvous port */
    assert_int_equal(reader_header_verdict(hdr), GANG_EPROTO);
    hdr[0] = 'G';
    put_le(hdr + 4, 1, 2);
    assert_int_equal(reader_header_verdict(hdr), GANG_EVERSION);
    put_le(hdr + 4, GANG_WIRE_VERSION, 2);
    put_le(hdr + 6, 99, 2);
    assert_int_equal(reader_header_verdict(hdr), GANG_EPROTO);
    put_le(hdr + 6, GANG_MSG_BLOB, 2);
    put_le(hdr + 16, GANG_WIRE_MAX_PAYLOAD + 1, 4);
    assert_int_equal(reader_header_verdict(hdr), GANG_EMSGSIZE);
}

/* decode() says GANG_EAGAIN for an incomplete frame; the reader says 0 (not an error). */
static void test_reader_eagain_semantics(void **state)
{
    gang_wire_reader *r = gang_wire_reader_new();
    size_t len, used;
    uint64_t s = 12;
    (void)state;

    assert_non_null(r);
    fill_msg(&s, GANG_MSG_WELCOME, 0, &msg_a);
    len = encode_ok(&msg_a, frame, sizeof frame);
    assert_int_equal(gang_wire_decode(frame, len - 1, &msg_b, &used), GANG_EAGAIN);
    assert_int_equal(gang_wire_reader_next(r, &msg_b), 0);
    assert_int_equal(gang_wire_reader_feed(r, frame, len - 1), 0);
    assert_int_equal(gang_wire_reader_next(r, &msg_b), 0);
    assert_int_equal(gang_wire_reader_next(r, &msg_b), 0);
    assert_int_equal(gang_wire_reader_pending(r), len - 1);
    assert_int_equal(gang_wire_reader_feed(r, frame + len - 1, 1), 0);
    assert_int_equal(gang_wire_reader_next(r, &msg_b), 1);
    assert_memory_equal(&msg_a, &msg_b, sizeof msg_b);

    /* A complete frame with a bad payload is an error, not "more bytes needed". */
    put_le(frame + 16, len - GANG_WIRE_HEADER_SIZE - 1, 4);
    assert_int_equal(gang_wire_reader_feed(r, frame, len - 1), 0);
    assert_int_equal(gang_wire_reader_next(r, &msg_b), GANG_EPROTO);
    assert_int_equal(gang_wire_reader_next(r, &msg_b), GANG_EPROTO);
    gang_wire_reader_free(r);
}

static void test_reader_feed_overflow(void **state)
{
    gang_wire_reader *r = gang_wire_reader_new();
    static uint8_t big[GANG_WIRE_MAX_FRAME + 1];
    (void)state;

    assert_non_null(r);
    assert_int_equal(gang_wire_reader_feed(r, big, sizeof big), GANG_EMSGSIZE);
    assert_int_equal(gang_wire_reader_pending(r), 0);
    assert_int_equal(gang_wire_reader_feed(r, big, 0), 0);

    /* A frame in progress: room is what is left, all or nothing. */
    put_le(big, GANG_WIRE_MAGIC, 4);
    put_le(big + 4, GANG_WIRE_VERSION, 2);
    put_le(big + 6, GANG_MSG_BLOB, 2);
    put_le(big + 16, GANG_WIRE_MAX_PAYLOAD, 4);
    assert_int_equal(gang_wire_reader_feed(r, big, 100), 0);
    assert_int_equal(gang_wire_reader_space(r), GANG_WIRE_MAX_FRAME - 100);
    assert_int_equal(gang_wire_reader_feed(r, big, GANG_WIRE_MAX_FRAME - 99), GANG_EMSGSIZE);
    assert_int_equal(gang_wire_reader_pending(r), 100);
    assert_int_equal(gang_wire_reader_feed(r, big + 100, GANG_WIRE_MAX_FRAME - 100), 0);
    assert_int_equal(gang_wire_reader_space(r), 0);
    assert_int_equal(gang_wire_reader_feed(r, big, 1), GANG_EMSGSIZE);
    /* A maximal frame fits the buffer exactly (this one's payload is mostly trailing
     * bytes, so it is refused once complete). */
    assert_int_equal(gang_wire_reader_next(r, &msg_b), GANG_EPROTO);
    gang_wire_reader_free(r);
}

/*
 * A long stream of large frames in irregular chunks, drained after every feed: the
 * buffer fills past its end many times over, so compaction must keep frames intact.
 */
static void test_reader_random_chunks(void **state)
{
    enum { NMSG = 40 };
    static gang_msg msgs[NMSG];
    static uint8_t stream[NMSG * (GANG_BLOB_MAX + 64)];
    gang_wire_reader *r = gang_wire_reader_new();
    uint64_t s = 13;
    size_t total = 0, off = 0, got = 0;
    (void)state;

    assert_non_null(r);
    for (int i = 0; i < NMSG; i++) {
        uint16_t t = (uint16_t)(i % 3 == 0 ? GANG_MSG_START : 1 + rng_below(&s, 12));
        size_t len = 0;
        fill_msg(&s, t, i % 3 == 0 ? 1 : 0, &msgs[i]);
        assert_int_equal(gang_wire_encode(&msgs[i], stream + total, sizeof stream - total, &len),
                         0);
        total += len;
    }
    assert_true(total > 2 * GANG_WIRE_MAX_FRAME);
    while (off < total) {
        size_t n = 1 + rng_below(&s, 20000);
        int rc;
        if (n > total - off)
            n = total - off;
        if (n > gang_wire_reader_space(r))
            n = gang_wire_reader_space(r);
        assert_int_equal(gang_wire_reader_feed(r, stream + off, n), 0);
        off += n;
        while ((rc = gang_wire_reader_next(r, &msg_b)) == 1) {
            assert_true(got < NMSG);
            assert_memory_equal(&msgs[got], &msg_b, sizeof msg_b);
            got++;
        }
        assert_int_equal(rc, 0);
    }
    assert_int_equal(got, NMSG);
    assert_int_equal(gang_wire_reader_pending(r), 0);
    gang_wire_reader_free(r);
}

static void test_state_names(void **state)
{
    (void)state;
    assert_string_equal(gang_state_name(GANG_STATE_SERVING), "serving");
    assert_string_equal(gang_state_name(GANG_STATE_WAITING), "waiting");
    assert_string_equal(gang_state_name(GANG_STATE_BACKOFF), "backoff");
    assert_string_equal(gang_state_name(GANG_STATE_FAILED), "failed");
    assert_string_equal(gang_state_name(-1), "unknown");
    assert_string_equal(gang_state_name(6), "unknown");
    assert_string_equal(gang_rank_state_name(GANG_RANK_READY), "ready");
    assert_string_equal(gang_rank_state_name(GANG_RANK_DOWN), "down");
    assert_string_equal(gang_rank_state_name(GANG_RANK_ABORTING), "aborting");
    assert_string_equal(gang_rank_state_name(255), "unknown");
}

int gang_test_wire(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip_every_type),
        cmocka_unit_test(test_header_layout),
        cmocka_unit_test(test_payload_layout),
        cmocka_unit_test(test_decode_zeroes_output),
        cmocka_unit_test(test_bad_magic),
        cmocka_unit_test(test_unknown_version),
        cmocka_unit_test(test_unknown_type),
        cmocka_unit_test(test_oversized_payload_len),
        cmocka_unit_test(test_incomplete_is_eagain),
        cmocka_unit_test(test_truncated_payload),
        cmocka_unit_test(test_trailing_bytes),
        cmocka_unit_test(test_string_too_long),
        cmocka_unit_test(test_nul_in_string),
        cmocka_unit_test(test_blob_len_bounds),
        cmocka_unit_test(test_api_len_bounds),
        cmocka_unit_test(test_nranks_bounds),
        cmocka_unit_test(test_encode_invalid_fields),
        cmocka_unit_test(test_encode_cap_too_small),
        cmocka_unit_test(test_reader_byte_by_byte),
        cmocka_unit_test(test_reader_two_frames_one_feed),
        cmocka_unit_test(test_reader_bad_header_early),
        cmocka_unit_test(test_reader_eagain_semantics),
        cmocka_unit_test(test_reader_feed_overflow),
        cmocka_unit_test(test_reader_random_chunks),
        cmocka_unit_test(test_state_names),
    };
    return cmocka_run_group_tests_name("wire", tests, NULL, NULL);
}
