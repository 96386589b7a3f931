/*
 * The codec of forwarded API requests (launcher/api-fwd.c): every kind round-trips, each
 * direction takes only its own kinds, and the decoder refuses every truncation, trailing
 * bytes and every count or string out of bounds (a malformed forwarded frame is refused).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "api-fwd.h"
#include "launcher-tests.h"

static gang_wctl in, out;
static uint8_t buf[GANG_API_FRAME_MAX];

static void fill(gang_wctl *m, uint32_t type)
{
    memset(m, 0, sizeof(*m));
    m->type = type;
    m->req_id = 0x123456789ABull;
    switch (type) {
    case GANG_WCTL_SUBMIT:
        m->n_prompt = 5000;
        m->max_tokens = 77;
        m->top_k = 40;
        m->temperature = 0.7f;
        m->top_p = 0.9f;
        m->seed = 0xDEADBEEFCAFEull;
        m->presence_penalty = 0.5f;
        m->frequency_penalty = -0.25f;
        m->repetition_penalty = 1.1f;
        m->ignore_eos = 1;
        m->logprobs = 1;
        m->top_logprobs = 5;
        m->n_stop = 3;
        m->stop[0] = 2, m->stop[1] = 7, m->stop[2] = -1;
        m->blob_len = GANG_WCTL_MAX_PROMPT * 4;
        for (uint32_t i = 0; i < GANG_WCTL_MAX_PROMPT; i++)
            ((int32_t *)(void *)m->blob)[i] = (int32_t)(i * 31);
        break;
    case GANG_WCTL_PROMPT:
        m->n_prompt = 5000;
        m->index = 2048;
        m->blob_len = 12;
        memcpy(m->blob, (int32_t[]){1, 2, 3}, 12);
        break;
    case GANG_WCTL_TOKEN:
        m->index = 9;
        m->token = 4242;
        m->logprob = -1.5f;
        m->n_top = GANG_MAX_TOP_LOGPROBS;
        for (uint32_t i = 0; i < m->n_top; i++) {
            m->top_ids[i] = (int32_t)i + 100;
            m->top_lp[i] = -(float)i;
        }
        break;
    case GANG_WCTL_DONE:
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

static const uint32_t from_member[] = {GANG_WCTL_SUBMIT, GANG_WCTL_PROMPT, GANG_WCTL_CANCEL};
static const uint32_t from_coord[] = {GANG_WCTL_TOKEN, GANG_WCTL_DONE, GANG_FWD_NACK};

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
            assert_int_equal(out.type, in.type);
            assert_true(out.req_id == in.req_id);
            assert_int_equal(out.index, in.index);
            assert_int_equal(out.blob_len, in.blob_len);
            assert_memory_equal(out.blob, in.blob, in.blob_len);
            assert_int_equal(out.n_stop, in.n_stop);
            assert_memory_equal(out.stop, in.stop, sizeof(in.stop));
            assert_true(out.seed == in.seed);
            assert_true(out.temperature == in.temperature && out.top_p == in.top_p);
            assert_true(out.frequency_penalty == in.frequency_penalty);
            assert_int_equal(out.token, in.token);
            assert_int_equal(out.n_top, in.n_top);
            assert_memory_equal(out.top_lp, in.top_lp, sizeof(in.top_lp));
            assert_int_equal(out.code, in.code);
            assert_string_equal(out.finish, in.finish);
            assert_string_equal(out.reason, in.reason);
            assert_true(stamp == (kinds[k] == GANG_WCTL_TOKEN ? 1234567u : 0u));
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
    len = encode_ok(GANG_WCTL_CANCEL, 0);
    buf[0] = 99;
    assert_int_equal(gang_fwd_decode(buf, len, 0, &out, &stamp), GANG_EPROTO);
    buf[0] = GANG_WCTL_CANCEL;
    buf[8] = 1; /* bits 56..63 of the id */
    assert_int_equal(gang_fwd_decode(buf, len, 0, &out, &stamp), GANG_EPROTO);
    fill(&in, GANG_WCTL_CANCEL);
    in.req_id = GANG_FWD_ID_MASK + 1;
    assert_int_equal(gang_fwd_encode(&in, 0, buf, sizeof(buf), &len), GANG_EINVAL);

    /* More prompt ids than one piece, stop ids, alternatives. */
    fill(&in, GANG_WCTL_PROMPT);
    in.blob_len = (GANG_WCTL_MAX_PROMPT + 1) * 4;
    assert_int_equal(gang_fwd_encode(&in, 0, buf, sizeof(buf), &len), GANG_EINVAL);
    len = encode_ok(GANG_WCTL_PROMPT, 0); /* u8 kind, u64 id, u32 n_prompt, u32 index */
    buf[17] = 0xFF, buf[18] = 0xFF;       /* n_ids = 65535 + ... */
    assert_int_equal(gang_fwd_decode(buf, len, 0, &out, &stamp), GANG_EPROTO);
    fill(&in, GANG_WCTL_SUBMIT);
    in.n_stop = 17;
    assert_int_equal(gang_fwd_encode(&in, 0, buf, sizeof(buf), &len), GANG_EINVAL);
    fill(&in, GANG_WCTL_TOKEN);
    in.n_top = GANG_MAX_TOP_LOGPROBS + 1;
    assert_int_equal(gang_fwd_encode(&in, 0, buf, sizeof(buf), &len), GANG_EINVAL);
    len = encode_ok(GANG_WCTL_TOKEN, 0); /* kind, id, index, token, logprob, n_top at 21 */
    buf[21] = GANG_MAX_TOP_LOGPROBS + 1;
    assert_int_equal(gang_fwd_decode(buf, len, 1, &out, &stamp), GANG_EPROTO);
    /* A SUBMIT with more ids than its whole prompt. */
    fill(&in, GANG_WCTL_SUBMIT);
    in.n_prompt = 3;
    assert_int_equal(gang_fwd_encode(&in, 0, buf, sizeof(buf), &len), 0);
    assert_int_equal(gang_fwd_decode(buf, len, 0, &out, &stamp), GANG_EPROTO);
    /* A NUL inside DONE's reason; a buffer too small. */
    len = encode_ok(GANG_WCTL_DONE, 0);
    buf[len - 3] = '\0';
    assert_int_equal(gang_fwd_decode(buf, len, 1, &out, &stamp), GANG_EPROTO);
    fill(&in, GANG_WCTL_DONE);
    assert_int_equal(gang_fwd_encode(&in, 0, buf, 20, &len), GANG_EMSGSIZE);
    fill(&in, GANG_WCTL_HEARTBEAT);
    assert_int_equal(gang_fwd_encode(&in, 0, buf, sizeof(buf), &len), GANG_EINVAL);
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
    in.req_id = id;
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
    size_t len = member_pkt(GANG_WCTL_SUBMIT, 7, 0);
    gang_fwd_relay_in(r, 1, 5, buf, (uint32_t)len);
    assert_true(r->nacks == 1 && r->n_holes == 1 && r->send_failures == 1);
    assert_true(r->holes[0].id == gang_fwd_id(1, 7) && r->holes[0].index == 0);
    /* A later piece of that request is refused until the hole is filled. */
    len = member_pkt(GANG_WCTL_PROMPT, 7, 2048);
    gang_fwd_relay_in(r, 1, 5, buf, (uint32_t)len);
    assert_true(r->nacks == 2 && r->n_holes == 1 && r->packets == 0);
    /* The same id from another node is another request. */
    len = member_pkt(GANG_WCTL_SUBMIT, 7, 0);
    gang_fwd_relay_in(r, 2, 5, buf, (uint32_t)len);
    assert_true(r->n_holes == 2);
    /* A cancel forgets the hole. */
    len = member_pkt(GANG_WCTL_CANCEL, 7, 0);
    gang_fwd_relay_in(r, 1, 5, buf, (uint32_t)len);
    assert_true(r->n_holes == 1 && r->holes[0].id == gang_fwd_id(2, 7));
    /* An older generation's packet is dropped silently; a newer one is refused for now. */
    len = member_pkt(GANG_WCTL_SUBMIT, 8, 0);
    gang_fwd_relay_in(r, 1, 4, buf, (uint32_t)len);
    assert_true(r->nacks == 3);
    gang_fwd_relay_in(r, 1, 6, buf, (uint32_t)len);
    assert_true(r->nacks == 4 && r->n_holes == 1);
    /* Malformed frames and frames claiming node 0 are refused and counted. */
    gang_fwd_relay_in(r, 1, 5, buf, 3);
    gang_fwd_relay_in(r, 0, 5, buf, (uint32_t)len);
    len = encode_ok(GANG_WCTL_TOKEN, 1); /* a coordinator's kind from a member */
    gang_fwd_relay_in(r, 1, 5, buf, (uint32_t)len);
    assert_true(r->frames_refused == 3 && r->nacks == 4);
    /* A full table refuses every new request (nothing could keep its pieces in order). */
    for (uint64_t id = 100; r->n_holes < GANG_FWD_HOLES_MAX; id++) {
        len = member_pkt(GANG_WCTL_SUBMIT, id, 0);
        gang_fwd_relay_in(r, 1, 5, buf, (uint32_t)len);
    }
    uint64_t nacks = r->nacks;
    len = member_pkt(GANG_WCTL_SUBMIT, 99999, 0);
    gang_fwd_relay_in(r, 1, 5, buf, (uint32_t)len);
    assert_true(r->nacks == nacks + 1 && r->n_holes == GANG_FWD_HOLES_MAX);
    gang_fwd_relay_set_gen(r, 0); /* the generation ended: the holes go with it */
    assert_int_equal(r->n_holes, 0);
    /* Tokens: the coordinator's own requests are not the relay's; forwarded ones are. */
    fill(&in, GANG_WCTL_TOKEN);
    in.req_id = 12;
    assert_int_equal(gang_fwd_relay_token(r, &in), 0);
    in.req_id = gang_fwd_id(2, 12);
    uint64_t fails = r->send_failures;
    assert_int_equal(gang_fwd_relay_token(r, &in), 1);
    assert_int_equal(gang_fwd_relay_done(r, 5, gang_fwd_id(2, 12), 0, 0, "length", ""), 1);
    assert_int_equal(gang_fwd_relay_done(r, 5, 12, 0, 0, "length", ""), 0);
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
