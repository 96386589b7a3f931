/*
 * The codec of forwarded API requests (launcher/api-fwd.c): every kind round-trips, each
 * direction takes only its own kinds, and the decoder refuses every truncation, trailing
 * bytes and every count, flag or string out of bounds (a malformed forwarded frame is
 * refused). The byte offsets the tests poke at are those of the v2 forwarding frames.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "api-fwd.h"
#include "launcher-tests.h"

static gang_req_msg in, out;
static uint8_t buf[GANG_API_FRAME_MAX];

static void fill(gang_req_msg *m, uint32_t type)
{
    memset(m, 0, sizeof(*m));
    m->kind = type;
    m->id = 0x123456789ABull;
    switch (type) {
    case GANG_REQ_SUBMIT:
        m->n_prompt = 5000;
        m->max_tokens = 77;
        m->sampling.top_k = 40;
        m->sampling.temperature = 0.7f;
        m->sampling.top_p = 0.9f;
        m->sampling.seed = 0xDEADBEEFCAFEull;
        m->sampling.presence_penalty = 0.5f;
        m->sampling.frequency_penalty = -0.25f;
        m->sampling.repetition_penalty = 1.1f;
        m->sampling.ignore_eos = 1;
        m->sampling.logprobs = 1;
        m->sampling.top_logprobs = 5;
        m->sampling.n_stop = 3;
        m->sampling.stop[0] = 2, m->sampling.stop[1] = 7, m->sampling.stop[2] = -1;
        m->n_ids = GANG_REQ_MAX_IDS;
        for (uint32_t i = 0; i < GANG_REQ_MAX_IDS; i++)
            m->ids[i] = (int32_t)(i * 31);
        break;
    case GANG_REQ_PROMPT:
        m->n_prompt = 5000;
        m->index = 2048;
        m->n_ids = 3;
        memcpy(m->ids, (int32_t[]){1, 2, 3}, 12);
        break;
    case GANG_REQ_TOKEN:
        m->index = 9;
        m->token = 4242;
        m->logprob = -1.5f;
        m->n_top = GANG_MAX_TOP_LOGPROBS;
        for (uint32_t i = 0; i < m->n_top; i++) {
            m->top_ids[i] = (int32_t)i + 100;
            m->top_lp[i] = -(float)i;
        }
        break;
    case GANG_REQ_DONE:
        m->code = GANG_EINVAL;
        m->index = 12;
        strcpy(m->finish, "stop");
        strcpy(m->reason, "prompt too long");
        break;
    case GANG_FWD_NACK:
        m->index = 4096;
        break;
    default: /* CANCEL */
        break;
    }
}

static const uint32_t from_member[] = {GANG_REQ_SUBMIT, GANG_REQ_PROMPT, GANG_REQ_CANCEL};
static const uint32_t from_coord[] = {GANG_REQ_TOKEN, GANG_REQ_DONE, GANG_FWD_NACK};

static size_t encode_ok(uint32_t type, uint64_t stamp)
{
    size_t len = 0;
    fill(&in, type);
    assert_int_equal(gang_fwd_encode(&in, stamp, buf, sizeof(buf), &len), 0);
    assert_true(len >= 9 && len <= GANG_API_FRAME_MAX);
    return len;
}

static void test_roundtrip(void **state)
{
    (void)state;
    for (int dir = 0; dir < 2; dir++) {
        const uint32_t *kinds = dir ? from_coord : from_member;
        for (int k = 0; k < 3; k++) {
            uint64_t stamp = 0;
            size_t len = encode_ok(kinds[k], 1234567);
            assert_int_equal(gang_fwd_decode(buf, len, dir, &out, &stamp), 0);
            assert_int_equal(out.kind, in.kind);
            assert_true(out.id == in.id);
            assert_int_equal(out.index, in.index);
            assert_int_equal(out.n_prompt, in.n_prompt);
            assert_int_equal(out.max_tokens, in.max_tokens);
            assert_int_equal(out.n_ids, in.n_ids);
            assert_memory_equal(out.ids, in.ids, in.n_ids * sizeof(int32_t));
            /* The sampling comes back whole (gang_sampling_codec), padding aside. */
            const gang_sampling *a = &out.sampling, *b = &in.sampling;
            assert_true(a->seed == b->seed && a->top_k == b->top_k);
            assert_true(a->temperature == b->temperature && a->top_p == b->top_p);
            assert_true(a->presence_penalty == b->presence_penalty &&
                        a->frequency_penalty == b->frequency_penalty &&
                        a->repetition_penalty == b->repetition_penalty);
            assert_true(a->ignore_eos == b->ignore_eos && a->logprobs == b->logprobs &&
                        a->top_logprobs == b->top_logprobs);
            assert_int_equal(a->n_stop, b->n_stop);
            assert_memory_equal(a->stop, b->stop, sizeof(b->stop));
            assert_int_equal(out.token, in.token);
            assert_int_equal(out.n_top, in.n_top);
            assert_memory_equal(out.top_lp, in.top_lp, sizeof(in.top_lp));
            assert_int_equal(out.code, in.code);
            assert_string_equal(out.finish, in.finish);
            assert_string_equal(out.reason, in.reason);
            assert_true(stamp == (kinds[k] == GANG_REQ_TOKEN ? 1234567u : 0u));
            /* The other direction refuses it. */
            assert_int_equal(gang_fwd_decode(buf, len, !dir, &out, &stamp), GANG_EPROTO);
        }
    }
}

static void test_truncated_and_trailing(void **state)
{
    (void)state;
    for (int dir = 0; dir < 2; dir++) {
        const uint32_t *kinds = dir ? from_coord : from_member;
        for (int k = 0; k < 3; k++) {
            uint64_t stamp;
            size_t len = encode_ok(kinds[k], 9);
            for (size_t cut = 0; cut < len; cut++)
                assert_int_equal(gang_fwd_decode(buf, cut, dir, &out, &stamp), GANG_EPROTO);
            buf[len] = 0;
            assert_int_equal(gang_fwd_decode(buf, len + 1, dir, &out, &stamp), GANG_EPROTO);
        }
    }
}

static void test_bounds(void **state)
{
    uint64_t stamp;
    size_t len;
    (void)state;
    /* An unknown kind, and an id above the 48 bits a forwarded id keeps. */
    len = encode_ok(GANG_REQ_CANCEL, 0);
    buf[0] = 99;
    assert_int_equal(gang_fwd_decode(buf, len, 0, &out, &stamp), GANG_EPROTO);
    buf[0] = GANG_REQ_CANCEL;
    buf[8] = 1; /* bits 56..63 of the id */
    assert_int_equal(gang_fwd_decode(buf, len, 0, &out, &stamp), GANG_EPROTO);
    fill(&in, GANG_REQ_CANCEL);
    in.id = GANG_FWD_ID_MASK + 1;
    assert_int_equal(gang_fwd_encode(&in, 0, buf, sizeof(buf), &len), GANG_EINVAL);

    /* More prompt ids than one piece, stop ids, alternatives. */
    fill(&in, GANG_REQ_PROMPT);
    in.n_ids = GANG_REQ_MAX_IDS + 1;
    assert_int_equal(gang_fwd_encode(&in, 0, buf, sizeof(buf), &len), GANG_EINVAL);
    len = encode_ok(GANG_REQ_PROMPT, 0); /* u8 kind, u64 id, u32 n_prompt, u32 index */
    buf[17] = 0xFF, buf[18] = 0xFF;      /* n_ids = 65535 + ... */
    assert_int_equal(gang_fwd_decode(buf, len, 0, &out, &stamp), GANG_EPROTO);
    fill(&in, GANG_REQ_SUBMIT);
    in.sampling.n_stop = GANG_MAX_STOP_TOKENS + 1;
    assert_int_equal(gang_fwd_encode(&in, 0, buf, sizeof(buf), &len), GANG_EINVAL);
    fill(&in, GANG_REQ_TOKEN);
    in.n_top = GANG_MAX_TOP_LOGPROBS + 1;
    assert_int_equal(gang_fwd_encode(&in, 0, buf, sizeof(buf), &len), GANG_EINVAL);
    len = encode_ok(GANG_REQ_TOKEN, 0); /* kind, id, index, token, logprob, n_top at 21 */
    buf[21] = GANG_MAX_TOP_LOGPROBS + 1;
    assert_int_equal(gang_fwd_decode(buf, len, 1, &out, &stamp), GANG_EPROTO);
    /* A SUBMIT with more ids than its whole prompt: never sent, refused on receipt (its
     * n_prompt at offset 9, after kind and id). */
    fill(&in, GANG_REQ_SUBMIT);
    in.n_prompt = 3;
    assert_int_equal(gang_fwd_encode(&in, 0, buf, sizeof(buf), &len), GANG_EINVAL);
    len = encode_ok(GANG_REQ_SUBMIT, 0);
    assert_int_equal(gang_fwd_decode(buf, len, 0, &out, &stamp), 0);
    buf[9] = 3, buf[10] = 0;
    assert_int_equal(gang_fwd_decode(buf, len, 0, &out, &stamp), GANG_EPROTO);
    /* A NUL inside DONE's reason (before its 22 bytes of kv_id, kv_blocks, kv_ms,
     * kv_mismatch, kv_device and an empty layout); a buffer too small. */
    len = encode_ok(GANG_REQ_DONE, 0);
    buf[len - 22 - 3] = '\0';
    assert_int_equal(gang_fwd_decode(buf, len, 1, &out, &stamp), GANG_EPROTO);
    fill(&in, GANG_REQ_DONE);
    assert_int_equal(gang_fwd_encode(&in, 0, buf, 20, &len), GANG_EMSGSIZE);
    fill(&in, 2); /* not a request kind (the worker channel's HEARTBEAT) */
    assert_int_equal(gang_fwd_encode(&in, 0, buf, sizeof(buf), &len), GANG_EINVAL);
    /* Flags over 1 are refused on receipt (a SUBMIT's ignore_eos: after kind, id,
     * n_prompt, max_tokens and the 32 bytes of sampling values). */
    len = encode_ok(GANG_REQ_SUBMIT, 0);
    assert_int_equal(buf[1 + 8 + 4 + 4 + 32], 1);
    buf[1 + 8 + 4 + 4 + 32] = 2;
    assert_int_equal(gang_fwd_decode(buf, len, 0, &out, &stamp), GANG_EPROTO);
}

static void test_ids(void **state)
{
    (void)state;
    uint64_t id = gang_fwd_id(3, 77);
    assert_int_equal(gang_fwd_node(id), 3);
    assert_true((id & GANG_FWD_ID_MASK) == 77);
    assert_int_equal(gang_fwd_node(12345), 0); /* the coordinator's own requests */
}

/* Encodes a member's packet of request id (SUBMIT at index 0, else PROMPT at index). */
static size_t member_pkt(uint32_t type, uint64_t id, uint32_t index)
{
    size_t len = 0;
    fill(&in, type);
    in.id = id;
    in.index = index;
    assert_int_equal(gang_fwd_encode(&in, 0, buf, sizeof(buf), &len), 0);
    return len;
}

/*
 * The coordinator's relay without a rank 0 (sup NULL: every packet is refused) and without
 * members to answer (coord NULL: every NACK fails to go out): what it refuses, remembers
 * and forgets.
 */
static void test_relay_holes(void **state)
{
    (void)state;
    gang_fwd_relay *r = calloc(1, sizeof(*r));
    assert_non_null(r);
    gang_fwd_relay_set_gen(r, 5);
    size_t len = member_pkt(GANG_REQ_SUBMIT, 7, 0);
    gang_fwd_relay_in(r, 1, 5, buf, (uint32_t)len);
    assert_true(r->nacks == 1 && r->n_holes == 1 && r->send_failures == 1);
    assert_true(r->holes[0].id == gang_fwd_id(1, 7) && r->holes[0].index == 0);
    /* A later piece of that request is refused until the hole is filled. */
    len = member_pkt(GANG_REQ_PROMPT, 7, 2048);
    gang_fwd_relay_in(r, 1, 5, buf, (uint32_t)len);
    assert_true(r->nacks == 2 && r->n_holes == 1 && r->packets == 0);
    /* The same id from another node is another request. */
    len = member_pkt(GANG_REQ_SUBMIT, 7, 0);
    gang_fwd_relay_in(r, 2, 5, buf, (uint32_t)len);
    assert_true(r->n_holes == 2);
    /* A cancel forgets the hole. */
    len = member_pkt(GANG_REQ_CANCEL, 7, 0);
    gang_fwd_relay_in(r, 1, 5, buf, (uint32_t)len);
    assert_true(r->n_holes == 1 && r->holes[0].id == gang_fwd_id(2, 7));
    /* An older generation's packet is dropped silently; a newer one is refused for now. */
    len = member_pkt(GANG_REQ_SUBMIT, 8, 0);
    gang_fwd_relay_in(r, 1, 4, buf, (uint32_t)len);
    assert_true(r->nacks == 3);
    gang_fwd_relay_in(r, 1, 6, buf, (uint32_t)len);
    assert_true(r->nacks == 4 && r->n_holes == 1);
    /* Malformed frames and frames claiming node 0 are refused and counted. */
    gang_fwd_relay_in(r, 1, 5, buf, 3);
    gang_fwd_relay_in(r, 0, 5, buf, (uint32_t)len);
    len = encode_ok(GANG_REQ_TOKEN, 1); /* a coordinator's kind from a member */
    gang_fwd_relay_in(r, 1, 5, buf, (uint32_t)len);
    assert_true(r->frames_refused == 3 && r->nacks == 4);
    /* A full table refuses every new request (nothing could keep its pieces in order). */
    for (uint64_t id = 100; r->n_holes < GANG_FWD_HOLES_MAX; id++) {
        len = member_pkt(GANG_REQ_SUBMIT, id, 0);
        gang_fwd_relay_in(r, 1, 5, buf, (uint32_t)len);
    }
    uint64_t nacks = r->nacks;
    len = member_pkt(GANG_REQ_SUBMIT, 99999, 0);
    gang_fwd_relay_in(r, 1, 5, buf, (uint32_t)len);
    assert_true(r->nacks == nacks + 1 && r->n_holes == GANG_FWD_HOLES_MAX);
    gang_fwd_relay_set_gen(r, 0); /* the generation ended: the holes go with it */
    assert_int_equal(r->n_holes, 0);
    /* Tokens: the coordinator's own requests are not the relay's; forwarded ones are. */
    fill(&in, GANG_REQ_TOKEN);
    in.id = 12;
    assert_int_equal(gang_fwd_relay_token(r, &in), 0);
    in.id = gang_fwd_id(2, 12);
    uint64_t fails = r->send_failures;
    assert_int_equal(gang_fwd_relay_token(r, &in), 1);
    gang_req_msg done = {.kind = GANG_REQ_DONE, .generation = 5, .id = gang_fwd_id(2, 12)};
    memcpy(done.finish, "length", 7);
    assert_int_equal(gang_fwd_relay_done(r, &done), 1);
    done.id = 12;
    assert_int_equal(gang_fwd_relay_done(r, &done), 0);
    assert_true(r->send_failures == fails + 2);
    free(r);
}

int gang_test_fwd(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip),   cmocka_unit_test(test_truncated_and_trailing),
        cmocka_unit_test(test_bounds),      cmocka_unit_test(test_ids),
        cmocka_unit_test(test_relay_holes),
    };
    return cmocka_run_group_tests_name("fwd", tests, NULL, NULL);
}
