/*
 * The agent<->worker channel's packets (launcher/wctl.c): every control type and every
 * request kind round-trips, a heartbeat is a small packet, and the decoder refuses every
 * truncation, trailing bytes, unknown types and fields out of bounds.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "launcher-tests.h"
#include "wctl.h"

static gang_wctl cin, cout;
static gang_req_msg rin, rout;
static uint8_t buf[GANG_WCTL_PACKET_MAX + 1];

static const uint32_t control_types[] = {
    GANG_WCTL_HELLO,   GANG_WCTL_HEARTBEAT, GANG_WCTL_BLOB_REQUEST, GANG_WCTL_BLOB,
    GANG_WCTL_START,   GANG_WCTL_READY,     GANG_WCTL_ERROR,        GANG_WCTL_ABORT,
    GANG_WCTL_ABORTED, GANG_WCTL_SHUTDOWN,  GANG_WCTL_GPU};
#define N_CONTROL (sizeof(control_types) / sizeof(control_types[0]))

static const uint32_t req_kinds[] = {GANG_REQ_SUBMIT, GANG_REQ_PROMPT, GANG_REQ_CANCEL,
                                     GANG_REQ_TOKEN, GANG_REQ_DONE};

/* A control message of type with every field its type carries set. */
static void fill_control(gang_wctl *m, uint32_t type)
{
    memset(m, 0, sizeof(*m));
    m->type = type;
    m->generation = 0x0102030405060708ull;
    m->local_rank = 3;
    m->pid = 4321;
    m->state = 2;
    m->rank = 7;
    m->world_size = 8;
    m->code = GANG_EGPU;
    strcpy(m->reason, "Xid 79 on GPU 0");
    if (type == GANG_WCTL_BLOB || type == GANG_WCTL_START || type == GANG_WCTL_READY ||
        type == GANG_WCTL_GPU) {
        m->blob_len = type == GANG_WCTL_START ? GANG_BLOB_MAX : 40;
        for (uint32_t i = 0; i < m->blob_len; i++)
            m->blob[i] = (uint8_t)(i * 7);
    }
}

/* A request message of kind with its fields set (a SUBMIT with the most ids and stops). */
static void fill_req(gang_req_msg *m, uint32_t kind)
{
    memset(m, 0, sizeof(*m));
    m->kind = kind;
    m->generation = 9;
    m->id = 0xABCDEF12345ull;
    m->n_prompt = 9000;
    m->index = 11;
    m->max_tokens = 64;
    m->sampling = (gang_sampling){.temperature = 0.8f,
                                  .top_k = 50,
                                  .top_p = 0.95f,
                                  .seed = 77,
                                  .presence_penalty = 0.1f,
                                  .frequency_penalty = 0.2f,
                                  .repetition_penalty = 1.3f,
                                  .ignore_eos = 1,
                                  .logprobs = 1,
                                  .top_logprobs = GANG_MAX_TOP_LOGPROBS,
                                  .n_stop = GANG_MAX_STOP_TOKENS};
    for (uint32_t i = 0; i < GANG_MAX_STOP_TOKENS; i++)
        m->sampling.stop[i] = (int32_t)i + 1;
    m->n_ids = kind == GANG_REQ_SUBMIT || kind == GANG_REQ_PROMPT ? GANG_REQ_MAX_IDS : 0;
    for (uint32_t i = 0; i < m->n_ids; i++)
        m->ids[i] = (int32_t)(i * 3);
    if (kind == GANG_REQ_TOKEN) {
        m->token = 5;
        m->logprob = -0.5f;
        m->n_top = 2;
        m->top_ids[0] = 5, m->top_ids[1] = 6;
        m->top_lp[0] = -0.5f, m->top_lp[1] = -1.0f;
    }
    if (kind == GANG_REQ_DONE) {
        m->code = 0;
        strcpy(m->finish, "length");
        strcpy(m->reason, "");
    }
}

/* Decodes buf[0..len) from an exact heap copy (a read past it is a sanitizer report). */
static int decode_exact(size_t len)
{
    uint8_t *copy = malloc(len > 0 ? len : 1);
    assert_non_null(copy);
    memcpy(copy, buf, len);
    int rc = gang_wctl_decode(copy, len, &cout, &rout);
    free(copy);
    return rc;
}

static void test_control_roundtrip(void **state)
{
    (void)state;
    size_t len = 0;
    for (size_t k = 0; k < N_CONTROL; k++) {
        fill_control(&cin, control_types[k]);
        assert_int_equal(gang_wctl_encode(&cin, buf, sizeof(buf), &len), 0);
        assert_true(len <= GANG_WCTL_PACKET_MAX);
        assert_int_equal(decode_exact(len), (int)control_types[k]);
        assert_int_equal(cout.type, cin.type);
        assert_true(cout.generation == cin.generation);
        switch (cin.type) {
        case GANG_WCTL_HELLO:
            assert_int_equal(cout.local_rank, 3);
            assert_int_equal(cout.pid, 4321);
            break;
        case GANG_WCTL_HEARTBEAT:
            assert_int_equal(cout.state, 2);
            assert_int_equal(cout.pid, 0); /* only what its type carries travels */
            break;
        case GANG_WCTL_ERROR:
            assert_int_equal(cout.code, GANG_EGPU);
            assert_int_equal(cout.rank, 7);
            assert_string_equal(cout.reason, cin.reason);
            break;
        case GANG_WCTL_START:
            assert_int_equal(cout.rank, 7);
            assert_int_equal(cout.world_size, 8);
            /* fall through: START carries a blob too */
        case GANG_WCTL_BLOB:
        case GANG_WCTL_READY:
        case GANG_WCTL_GPU:
            assert_int_equal(cout.blob_len, cin.blob_len);
            assert_memory_equal(cout.blob, cin.blob, cin.blob_len);
            break;
        default:
            assert_int_equal(len, 9); /* type and generation */
            break;
        }
        /* Every proper prefix and one byte more are refused. */
        for (size_t cut = 0; cut < len; cut++)
            assert_int_equal(decode_exact(cut), GANG_EPROTO);
        buf[len] = 0;
        assert_int_equal(decode_exact(len + 1), GANG_EPROTO);
    }
}

/* A heartbeat is a packet of its own size: type, generation, state. */
static void test_heartbeat_is_small(void **state)
{
    (void)state;
    size_t len = 0;
    fill_control(&cin, GANG_WCTL_HEARTBEAT);
    assert_int_equal(gang_wctl_encode(&cin, buf, sizeof(buf), &len), 0);
    assert_int_equal(len, 1 + 8 + 4);
    assert_true(len < 256);
    print_message("wctl: a heartbeat is %zu bytes (the in-memory gang_wctl is %zu)\n", len,
                  sizeof(gang_wctl));
}

static void test_request_roundtrip(void **state)
{
    (void)state;
    size_t len = 0;
    for (size_t k = 0; k < sizeof(req_kinds) / sizeof(req_kinds[0]); k++) {
        fill_req(&rin, req_kinds[k]);
        if (rin.kind == GANG_REQ_SUBMIT)
            rin.n_prompt = rin.n_ids; /* a SUBMIT carries at most its whole prompt */
        assert_int_equal(gang_wctl_encode_req(&rin, buf, sizeof(buf), &len), 0);
        assert_true(len <= GANG_WCTL_PACKET_MAX && len - 9 <= GANG_REQ_WIRE_MAX);
        assert_int_equal(decode_exact(len), (int)rin.kind);
        assert_int_equal(rout.kind, rin.kind);
        assert_true(rout.generation == rin.generation && rout.id == rin.id);
        if (rin.kind == GANG_REQ_SUBMIT) {
            assert_int_equal(rout.max_tokens, rin.max_tokens);
            assert_true(rout.sampling.temperature == rin.sampling.temperature &&
                        rout.sampling.seed == rin.sampling.seed);
            assert_int_equal(rout.sampling.top_logprobs, GANG_MAX_TOP_LOGPROBS);
            assert_memory_equal(rout.sampling.stop, rin.sampling.stop, sizeof(rin.sampling.stop));
        }
        if (rin.kind == GANG_REQ_SUBMIT || rin.kind == GANG_REQ_PROMPT) {
            assert_int_equal(rout.n_ids, rin.n_ids);
            assert_memory_equal(rout.ids, rin.ids, rin.n_ids * sizeof(int32_t));
        }
        if (rin.kind == GANG_REQ_TOKEN) {
            assert_int_equal(rout.token, 5);
            assert_int_equal(rout.n_top, 2);
            assert_true(rout.top_lp[1] == -1.0f);
        }
        if (rin.kind == GANG_REQ_DONE)
            assert_string_equal(rout.finish, "length");
        for (size_t cut = 0; cut < len; cut++)
            assert_int_equal(decode_exact(cut), GANG_EPROTO);
    }
}

static void test_bounds(void **state)
{
    (void)state;
    size_t len = 0;
    /* Types of the other kind, or of neither, are refused by the encoders. */
    fill_control(&cin, GANG_REQ_SUBMIT);
    assert_int_equal(gang_wctl_encode(&cin, buf, sizeof(buf), &len), GANG_EINVAL);
    fill_req(&rin, GANG_WCTL_HEARTBEAT);
    assert_int_equal(gang_wctl_encode_req(&rin, buf, sizeof(buf), &len), GANG_EINVAL);
    /* A SUBMIT with more ids than its prompt, too many ids, a flag over 1. */
    fill_req(&rin, GANG_REQ_SUBMIT);
    rin.n_prompt = 10;
    assert_int_equal(gang_wctl_encode_req(&rin, buf, sizeof(buf), &len), GANG_EINVAL);
    fill_req(&rin, GANG_REQ_PROMPT);
    rin.n_ids = GANG_REQ_MAX_IDS + 1;
    assert_int_equal(gang_wctl_encode_req(&rin, buf, sizeof(buf), &len), GANG_EINVAL);
    fill_req(&rin, GANG_REQ_SUBMIT);
    rin.n_prompt = rin.n_ids;
    rin.sampling.logprobs = 2;
    assert_int_equal(gang_wctl_encode_req(&rin, buf, sizeof(buf), &len), GANG_EINVAL);
    /* A blob over its maximum, and a small buffer. */
    fill_control(&cin, GANG_WCTL_BLOB);
    cin.blob_len = GANG_BLOB_MAX + 1;
    assert_int_equal(gang_wctl_encode(&cin, buf, sizeof(buf), &len), GANG_EINVAL);
    fill_control(&cin, GANG_WCTL_START);
    assert_int_equal(gang_wctl_encode(&cin, buf, 100, &len), GANG_EMSGSIZE);

    /* Decoding: an unknown type; a blob length over GANG_BLOB_MAX (BLOB: type, gen, u32). */
    fill_control(&cin, GANG_WCTL_ABORT);
    assert_int_equal(gang_wctl_encode(&cin, buf, sizeof(buf), &len), 0);
    buf[0] = 99;
    assert_int_equal(decode_exact(len), GANG_EPROTO);
    buf[0] = 0;
    assert_int_equal(decode_exact(len), GANG_EPROTO);
    fill_control(&cin, GANG_WCTL_BLOB);
    assert_int_equal(gang_wctl_encode(&cin, buf, sizeof(buf), &len), 0);
    buf[9 + 2] = 1; /* 40 + 65536 */
    assert_int_equal(decode_exact(len), GANG_EPROTO);
    /* An ERROR's reason with a NUL inside. */
    fill_control(&cin, GANG_WCTL_ERROR);
    assert_int_equal(gang_wctl_encode(&cin, buf, sizeof(buf), &len), 0);
    buf[len - 2] = '\0';
    assert_int_equal(decode_exact(len), GANG_EPROTO);
    assert_int_equal(cout.type, 0); /* refused messages come back empty */
}

int gang_test_wctl(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_control_roundtrip),
        cmocka_unit_test(test_heartbeat_is_small),
        cmocka_unit_test(test_request_roundtrip),
        cmocka_unit_test(test_bounds),
    };
    return cmocka_run_group_tests_name("wctl", tests, NULL, NULL);
}
