/*
 * libFuzzer target for the wire protocol v2 decoder and the streaming reader: the code
 * that parses bytes from any peer that can reach the rendezvous port.
 *
 * For each input it checks three properties, and abort()s (a fuzzer finding) on any
 * violation; the sanitizers catch every out-of-bounds access on the way:
 *
 *   1. Exact round trip: a frame that decodes re-encodes to the very same bytes, and
 *      decoding those again yields the very same message. The encoding is canonical, so a
 *      decoder that accepts something the encoder would not produce is a bug.
 *   2. The input, read as a stream of frames with gang_wire_decode(), and the same input
 *      fed to a gang_wire_reader in pseudo-random chunk sizes give the same messages and
 *      the same final verdict (error code, or "more bytes needed" with the same leftover).
 *   3. Every decoded message stays within its declared bounds.
 *   4. The same input read as a tagged stream (each frame followed by its session tag, as
 *      after a token handshake) by a reader with a tag check and by a reference loop
 *      gives the same messages and the same verdict. The tag is fake-tag.h's stand-in,
 *      so seeds can carry valid tags without libsodium.
 *   5. The payload of an API frame, read as what a member's forwarding carries (a kind
 *      byte and the engine's request message, gang_req_codec with gang_sampling_codec),
 *      round-trips exactly when it decodes: the request decoder is reachable from the
 *      rendezvous port too.
 *
 * Random mutations rarely keep payload_len consistent with the bytes that follow, which
 * would leave the payload decoders mostly unexplored. So the input is also decoded once
 * more as a single frame with payload_len patched to cover the rest of the input exactly.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ganglion/engine.h"
#include "ganglion/rendezvous.h"
#include "fake-tag.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static gang_msg msg, again;
static uint8_t reencoded[GANG_WIRE_MAX_FRAME];

static void die(const char *what)
{
    fprintf(stderr, "fuzz-wire: %s\n", what);
    abort();
}

/* Property 3: bounds that every consumer of a decoded message relies on. */
static void check_bounds(const gang_msg *m)
{
    if (m->type < GANG_MSG_CHALLENGE || m->type > GANG_MSG_TYPE_MAX_)
        die("decoded an unknown type");
    switch (m->type) {
    case GANG_MSG_JOIN:
        if (memchr(m->u.join.job, 0, sizeof m->u.join.job) == NULL ||
            memchr(m->u.join.host, 0, sizeof m->u.join.host) == NULL)
            die("JOIN string without NUL");
        break;
    case GANG_MSG_REJECT:
        if (memchr(m->u.reject.reason, 0, sizeof m->u.reject.reason) == NULL)
            die("REJECT reason without NUL");
        break;
    case GANG_MSG_ABORT:
        if (memchr(m->u.abort.reason, 0, sizeof m->u.abort.reason) == NULL)
            die("ABORT reason without NUL");
        break;
    case GANG_MSG_GIVE_UP:
        if (memchr(m->u.give_up.reason, 0, sizeof m->u.give_up.reason) == NULL)
            die("GIVE_UP reason without NUL");
        break;
    case GANG_MSG_BLOB_REQUEST:
    case GANG_MSG_BLOB:
    case GANG_MSG_START:
        if (m->u.blob.len > GANG_BLOB_MAX)
            die("blob len out of bounds");
        break;
    case GANG_MSG_API:
        if (m->u.api.len > GANG_API_FRAME_MAX)
            die("API frame len out of bounds");
        break;
    case GANG_MSG_HEARTBEAT:
        if (m->u.heartbeat.nranks > GANG_MAX_LOCAL_RANKS)
            die("nranks out of bounds");
        /* The names must be total functions: any wire value gets a printable name. */
        for (uint32_t i = 0; i < m->u.heartbeat.nranks; i++)
            if (gang_rank_state_name(m->u.heartbeat.rank_state[i]) == NULL)
                die("rank state without a name");
        if (gang_state_name((int)m->u.heartbeat.state) == NULL)
            die("gang state without a name");
        break;
    default:
        break;
    }
}

/* Property 5: an API payload read as a kind byte and a request message. */
static void check_api_request(const gang_msg_api *a)
{
    static gang_req_msg r, r2;
    static uint8_t out[GANG_API_FRAME_MAX];
    gang_codec c;
    uint32_t kind = 0;
    size_t len = 0;

    gang_codec_decoder(&c, a->data, a->len);
    gang_codec_uint(&c, &kind, 1, 0xFF);
    if (!gang_codec_ok(&c) || !gang_req_kind_valid(kind))
        return;
    memset(&r, 0, sizeof r);
    gang_req_codec(&c, kind, &r);
    if (gang_codec_finish(&c, NULL) != 0)
        return;
    if (r.n_ids > GANG_REQ_MAX_IDS || r.n_top > GANG_MAX_TOP_LOGPROBS ||
        r.sampling.n_stop > GANG_MAX_STOP_TOKENS ||
        r.sampling.top_logprobs > GANG_MAX_TOP_LOGPROBS ||
        memchr(r.reason, 0, sizeof r.reason) == NULL ||
        memchr(r.finish, 0, sizeof r.finish) == NULL)
        die("a decoded request message is out of its bounds");
    gang_codec_encoder(&c, out, sizeof out);
    gang_codec_uint(&c, &kind, 1, 0xFF);
    gang_req_codec(&c, kind, &r);
    if (gang_codec_finish(&c, &len) != 0)
        die("a decoded request message does not encode");
    if (len != a->len || memcmp(out, a->data, len) != 0)
        die("re-encoding a request message differs from its bytes");
    memset(&r2, 0, sizeof r2);
    gang_codec_decoder(&c, out, len);
    gang_codec_uint(&c, &kind, 1, 0xFF);
    gang_req_codec(&c, kind, &r2);
    if (gang_codec_finish(&c, NULL) != 0 || memcmp(&r, &r2, sizeof r) != 0)
        die("re-decoding a request message yields another one");
}

/* Property 1 for one frame frame[0..len) that decoded into m. */
static void check_roundtrip(const uint8_t *frame, size_t len, const gang_msg *m)
{
    size_t out = 0, used = 0;

    check_bounds(m);
    if (gang_wire_encode(m, reencoded, sizeof reencoded, &out) != 0)
        die("a decoded message does not encode");
    if (out != len || memcmp(reencoded, frame, len) != 0)
        die("re-encoding differs from the frame");
    if (gang_wire_decode(reencoded, out, &again, &used) != 0 || used != out)
        die("a re-encoded frame does not decode");
    if (memcmp(&again, m, sizeof again) != 0)
        die("re-decoding yields another message");
    if (m->type == GANG_MSG_API)
        check_api_request(&m->u.api);
}

/* The input as one frame whose payload_len covers the rest of it exactly. */
static void check_patched_length(const uint8_t *data, size_t size)
{
    static uint8_t patched[GANG_WIRE_MAX_FRAME];
    size_t plen, used = 0;

    if (size < GANG_WIRE_HEADER_SIZE || size > sizeof patched)
        return;
    plen = size - GANG_WIRE_HEADER_SIZE;
    memcpy(patched, data, size);
    for (int i = 0; i < 4; i++)
        patched[16 + i] = (uint8_t)(plen >> (8 * i));
    if (gang_wire_decode(patched, size, &msg, &used) == 0) {
        if (used != size)
            die("a patched frame decoded short");
        check_roundtrip(patched, size, &msg);
    }
}

static uint64_t rng_next(uint64_t *s)
{
    uint64_t x = *s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    *s = x;
    return x;
}

/* Chunk sizes derive from the input itself, so every finding reproduces exactly. */
static uint64_t seed_of(const uint8_t *data, size_t size)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < size; i++)
        h = (h ^ data[i]) * 0x100000001b3ull;
    return h | 1;
}

/* Reader tag check: the ctx counts the frames of the stream, like a session's recv_seq. */
static int fuzz_tag_check(void *ctx, const uint8_t *frame, size_t len,
                          const uint8_t tag[GANG_WIRE_TAG_SIZE])
{
    uint64_t *seq = ctx;
    int rc = fake_tag_verify(*seq, frame, len, tag);

    if (rc == 0)
        (*seq)++;
    return rc;
}

/* Property 4: the input as a tagged stream, through a reader and a reference loop. */
static void check_tagged_stream(const uint8_t *data, size_t size)
{
    gang_wire_reader *r;
    gang_wire_header h;
    size_t off = 0, used = 0, nframes = 0, fed = 0, roff = 0, nread = 0;
    uint64_t s = seed_of(data, size) ^ 0x5A5A5A5Aull, seq = 0;
    int final_rc, rc;

    for (;;) {
        final_rc = gang_wire_decode_header(data + off, size - off, &h);
        if (final_rc != 0)
            break;
        size_t flen = GANG_WIRE_HEADER_SIZE + (size_t)h.payload_len;
        if (size - off < flen + GANG_WIRE_TAG_SIZE) {
            final_rc = GANG_EAGAIN;
            break;
        }
        final_rc = fake_tag_verify(nframes, data + off, flen, data + off + flen);
        if (final_rc != 0)
            break;
        final_rc = gang_wire_decode(data + off, flen, &msg, &used);
        if (final_rc == GANG_EAGAIN)
            final_rc = GANG_EPROTO;
        if (final_rc != 0)
            break;
        if (used != flen)
            die("a tagged frame decoded short");
        check_roundtrip(data + off, used, &msg);
        off += flen + GANG_WIRE_TAG_SIZE;
        nframes++;
    }

    r = gang_wire_reader_new();
    if (r == NULL)
        die("out of memory");
    gang_wire_reader_set_tag_check(r, fuzz_tag_check, &seq);
    rc = 0;
    while (fed < size && rc >= 0) {
        size_t n = rng_next(&s) % 8 == 0 ? 1 + rng_next(&s) % 4096 : 1 + rng_next(&s) % 48;
        if (n > size - fed)
            n = size - fed;
        if (n > gang_wire_reader_space(r))
            n = gang_wire_reader_space(r);
        if (n == 0)
            die("tagged reader has no room although it was drained");
        if (gang_wire_reader_feed(r, data + fed, n) != 0)
            die("tagged feed within space failed");
        fed += n;
        while ((rc = gang_wire_reader_next(r, &msg)) == 1) {
            size_t out = 0;
            if (gang_wire_encode(&msg, reencoded, sizeof reencoded, &out) != 0)
                die("a message from the tagged reader does not encode");
            if (nread >= nframes || out + GANG_WIRE_TAG_SIZE > size - roff ||
                memcmp(reencoded, data + roff, out))
                die("tagged reader and reference disagree on a message");
            roff += out + GANG_WIRE_TAG_SIZE;
            nread++;
        }
    }
    if (nread != nframes || seq != nframes)
        die("tagged reader and reference disagree on the number of messages");
    if (final_rc == GANG_EAGAIN) {
        if (rc != 0 || gang_wire_reader_pending(r) != size - off)
            die("tagged reader and reference disagree on an incomplete tail");
    } else if (rc != final_rc) {
        die("tagged reader and reference disagree on the error");
    }
    gang_wire_reader_free(r);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    gang_wire_reader *r;
    size_t off = 0, used = 0, nframes = 0;
    size_t fed = 0, roff = 0, nread = 0;
    uint64_t s = seed_of(data, size);
    int final_rc, rc;

    /* Property 1, and the reference reading for property 2. */
    for (;;) {
        final_rc = gang_wire_decode(data + off, size - off, &msg, &used);
        if (final_rc != 0)
            break;
        check_roundtrip(data + off, used, &msg);
        off += used;
        nframes++;
    }

    r = gang_wire_reader_new();
    if (r == NULL)
        die("out of memory");
    rc = 0;
    while (fed < size && rc >= 0) {
        size_t n = rng_next(&s) % 8 == 0 ? 1 + rng_next(&s) % 4096 : 1 + rng_next(&s) % 48;
        if (n > size - fed)
            n = size - fed;
        if (n > gang_wire_reader_space(r))
            n = gang_wire_reader_space(r);
        if (n == 0)
            die("reader has no room although it was drained");
        if (gang_wire_reader_feed(r, data + fed, n) != 0)
            die("feed within space failed");
        fed += n;
        while ((rc = gang_wire_reader_next(r, &msg)) == 1) {
            size_t out = 0;
            if (gang_wire_encode(&msg, reencoded, sizeof reencoded, &out) != 0)
                die("a message from the reader does not encode");
            if (nread >= nframes || out > size - roff || memcmp(reencoded, data + roff, out))
                die("reader and decode disagree on a message");
            roff += out;
            nread++;
        }
    }
    if (nread != nframes)
        die("reader and decode disagree on the number of messages");
    if (final_rc == GANG_EAGAIN) {
        if (rc != 0 || gang_wire_reader_pending(r) != size - off)
            die("reader and decode disagree on an incomplete tail");
    } else if (rc != final_rc) {
        die("reader and decode disagree on the error");
    }
    gang_wire_reader_free(r);

    check_patched_length(data, size);
    check_tagged_stream(data, size);
    return 0;
}
