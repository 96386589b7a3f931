/* cmocka tests of the router module's policy: longest prefix, the load bound, replicas
 * down, the LRU bound, the alternative policies, the block hashes, the picks of
 * disaggregated prefill/decode by role, and the free KV blocks in the load. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <cjson/cJSON.h>

#include "ganglion/engine.h"
#include "ganglion/router.h"
#include "ganglion/serve.h"
#include "router-internal.h"

static gang_router_policy *mk(uint32_t n, uint32_t lru, uint32_t slack, gang_router_kind kind)
{
    gang_router_policy_config c = {
        .nreplicas = n, .lru_blocks = lru, .load_slack = slack, .kind = kind};
    gang_router_policy *p = NULL;
    assert_int_equal(gang_router_policy_init(&c, &p), 0);
    for (uint32_t i = 0; i < n; i++)
        gang_router_policy_set_up(p, i, 1);
    return p;
}

static void set_load(gang_router_policy *p, uint32_t i, uint32_t reported, uint32_t inflight)
{
    gang_router_load l = {.reported = reported, .inflight = inflight, .kv_free_blocks = 100};
    gang_router_policy_set_load(p, i, &l);
}

/* A prompt of nb blocks: ids start at base, so prompts with equal base share a prefix. */
static uint32_t prompt_hashes(int32_t base, uint32_t nb, uint32_t diverge_at, uint64_t *out)
{
    int32_t ids[64 * GANG_ROUTER_BLOCK];
    for (uint32_t i = 0; i < nb * GANG_ROUTER_BLOCK; i++)
        ids[i] = base + (int32_t)i + (i >= diverge_at * GANG_ROUTER_BLOCK ? 100000 : 0);
    return gang_router_hash_ids(ids, nb * GANG_ROUTER_BLOCK, out, 64);
}

static void test_longest_prefix(void **state)
{
    (void)state;
    gang_router_policy *p = mk(3, 1024, 100, GANG_ROUTER_PREFIX);
    uint64_t a[64], b[64], q[64];
    assert_int_equal(prompt_hashes(7, 8, 8, a), 8);
    assert_int_equal(prompt_hashes(7, 8, 3, b), 8); /* shares 3 blocks with a */
    gang_router_policy_record(p, 0, b, 8);
    gang_router_policy_record(p, 2, a, 5); /* the first 5 blocks of a */
    /* q shares 6 blocks with a: replica 2 holds 5 of them, replica 0 only 3. */
    assert_int_equal(prompt_hashes(7, 10, 6, q), 10);
    gang_router_pick pk;
    assert_int_equal(gang_router_policy_pick(p, q, 10, 0, &pk), 0);
    assert_int_equal(pk.replica, 2);
    assert_int_equal(pk.matched, 5);
    assert_int_equal(pk.reason, GANG_ROUTER_R_PREFIX);
    assert_int_equal(gang_router_policy_match(p, 0, q, 10), 3);
    assert_int_equal(gang_router_policy_match(p, 1, q, 10), 0);
    /* A prompt nobody holds goes to the least loaded replica. */
    uint64_t z[64];
    prompt_hashes(900000, 4, 4, z);
    set_load(p, 0, 3, 0);
    set_load(p, 1, 1, 0);
    set_load(p, 2, 2, 0);
    assert_int_equal(gang_router_policy_pick(p, z, 4, 0, &pk), 0);
    assert_int_equal(pk.replica, 1);
    assert_int_equal(pk.matched, 0);
    assert_int_equal(pk.reason, GANG_ROUTER_R_LEAST_LOADED);
    /* Excluding the prefix's replica (a retry) falls back to the next longest. */
    assert_int_equal(gang_router_policy_pick(p, q, 10, 1u << 2, &pk), 0);
    assert_int_equal(pk.replica, 0);
    assert_int_equal(pk.matched, 3);
    gang_router_policy_free(p);
}

static void test_load_bound(void **state)
{
    (void)state;
    gang_router_policy *p = mk(2, 1024, 4, GANG_ROUTER_PREFIX);
    uint64_t a[64];
    prompt_hashes(1, 6, 6, a);
    gang_router_policy_record(p, 0, a, 6);
    gang_router_pick pk;
    /* Within the slack: the prefix wins even over a less loaded replica. */
    set_load(p, 0, 5, 0);
    set_load(p, 1, 1, 0);
    assert_int_equal(gang_router_policy_pick(p, a, 6, 0, &pk), 0);
    assert_int_equal(pk.replica, 0);
    assert_int_equal(pk.reason, GANG_ROUTER_R_PREFIX);
    /* Over it, by the router's own in-flight count (the replica's report is stale). */
    set_load(p, 0, 1, 6);
    assert_int_equal(gang_router_policy_load(p, 0), 6);
    assert_int_equal(gang_router_policy_pick(p, a, 6, 0, &pk), 0);
    assert_int_equal(pk.replica, 1);
    assert_int_equal(pk.matched, 0);
    assert_int_equal(pk.reason, GANG_ROUTER_R_OVERLOADED);
    gang_router_policy_free(p);
}

static void test_replica_down(void **state)
{
    (void)state;
    gang_router_policy *p = mk(3, 1024, 100, GANG_ROUTER_PREFIX);
    uint64_t a[64];
    prompt_hashes(1, 4, 4, a);
    gang_router_policy_record(p, 1, a, 4);
    gang_router_policy_set_up(p, 1, 0);
    assert_false(gang_router_policy_is_up(p, 1));
    gang_router_pick pk;
    for (int k = 0; k < 6; k++) {
        assert_int_equal(gang_router_policy_pick(p, a, 4, 0, &pk), 0);
        assert_int_not_equal(pk.replica, 1);
    }
    /* Back up: it restarted with an empty cache, so it holds nothing now. */
    gang_router_policy_set_up(p, 1, 1);
    assert_int_equal(gang_router_policy_cached(p, 1), 0);
    assert_int_equal(gang_router_policy_match(p, 1, a, 4), 0);
    /* Everything down or excluded: GANG_EAGAIN. */
    gang_router_policy_set_up(p, 0, 0);
    gang_router_policy_set_up(p, 2, 0);
    assert_int_equal(gang_router_policy_pick(p, a, 4, 1u << 1, &pk), GANG_EAGAIN);
    assert_int_equal(gang_router_policy_pick(p, a, 4, 0, &pk), 0);
    assert_int_equal(pk.replica, 1);
    gang_router_policy_set_up(p, 1, 0);
    assert_int_equal(gang_router_policy_pick(p, a, 4, 0, &pk), GANG_EAGAIN);
    gang_router_policy_free(p);
}

static void test_lru_bound(void **state)
{
    (void)state;
    gang_router_policy *p = mk(1, 10, 100, GANG_ROUTER_PREFIX);
    uint64_t a[64], b[64];
    prompt_hashes(1, 8, 8, a);
    prompt_hashes(50000, 8, 8, b);
    gang_router_policy_record(p, 0, a, 8);
    assert_int_equal(gang_router_policy_cached(p, 0), 8);
    assert_int_equal(gang_router_policy_match(p, 0, a, 8), 8);
    /* 8 more blocks into a table of 10: a's tail is evicted first, its head survives. */
    gang_router_policy_record(p, 0, b, 8);
    assert_int_equal(gang_router_policy_cached(p, 0), 10);
    assert_int_equal(gang_router_policy_match(p, 0, b, 8), 8);
    assert_int_equal(gang_router_policy_match(p, 0, a, 8), 2);
    /* Touching a again makes it the recent one; b loses its tail. */
    gang_router_policy_record(p, 0, a, 8);
    assert_int_equal(gang_router_policy_cached(p, 0), 10);
    assert_int_equal(gang_router_policy_match(p, 0, a, 8), 8);
    assert_int_equal(gang_router_policy_match(p, 0, b, 8), 2);
    /* Many prompts: the table never exceeds its bound and keeps matching the newest. */
    for (int32_t k = 0; k < 1000; k++) {
        uint64_t c[64];
        prompt_hashes(200000 + 1000 * k, 3, 3, c);
        gang_router_policy_record(p, 0, c, 3);
        assert_true(gang_router_policy_cached(p, 0) <= 10);
        assert_int_equal(gang_router_policy_match(p, 0, c, 3), 3);
    }
    gang_router_policy_free(p);
}

static void test_alternatives(void **state)
{
    (void)state;
    gang_router_policy *p = mk(3, 64, 0, GANG_ROUTER_ROUND_ROBIN);
    uint64_t a[64];
    prompt_hashes(1, 4, 4, a);
    gang_router_policy_record(p, 2, a, 4);
    gang_router_policy_set_up(p, 1, 0);
    int seen[3] = {0, 0, 0};
    gang_router_pick pk;
    for (int k = 0; k < 10; k++) {
        assert_int_equal(gang_router_policy_pick(p, a, 4, 0, &pk), 0);
        assert_int_equal(pk.reason, GANG_ROUTER_R_ROUND_ROBIN);
        seen[pk.replica]++;
    }
    assert_int_equal(seen[1], 0);
    assert_true(seen[0] >= 4 && seen[2] >= 4); /* alternating, prefix ignored */
    gang_router_policy_free(p);

    p = mk(3, 64, 0, GANG_ROUTER_LEAST_LOADED);
    gang_router_policy_record(p, 2, a, 4);
    set_load(p, 0, 4, 0);
    set_load(p, 1, 0, 2);
    set_load(p, 2, 3, 0);
    assert_int_equal(gang_router_policy_pick(p, a, 4, 0, &pk), 0);
    assert_int_equal(pk.replica, 1);
    assert_int_equal(pk.reason, GANG_ROUTER_R_LEAST_LOADED);
    gang_router_policy_free(p);

    gang_router_kind k;
    assert_int_equal(gang_router_kind_parse("least-loaded", &k), 0);
    assert_int_equal(k, GANG_ROUTER_LEAST_LOADED);
    assert_int_equal(gang_router_kind_parse("random", &k), GANG_EINVAL);
    assert_string_equal(gang_router_reason_name(GANG_ROUTER_R_OVERLOADED), "overloaded");
    gang_router_policy_config bad = {.nreplicas = 0, .lru_blocks = 1};
    assert_int_equal(gang_router_policy_init(&bad, &p), GANG_EINVAL);
    bad.nreplicas = GANG_ROUTER_MAX_REPLICAS + 1;
    assert_int_equal(gang_router_policy_init(&bad, &p), GANG_EINVAL);
}

static void test_hashes(void **state)
{
    (void)state;
    int32_t ids[40];
    for (int i = 0; i < 40; i++)
        ids[i] = 3 * i + 1;
    uint64_t h[4];
    /* Two full blocks of 40 ids; the chain is the engine's prefix-cache key. */
    assert_int_equal(gang_router_hash_ids(ids, 40, h, 4), 2);
    uint64_t e0 = gang_kv_block_hash(0, ids, 16);
    assert_true(h[0] == e0);
    assert_true(h[1] == gang_kv_block_hash(e0, ids + 16, 16));
    assert_int_equal(gang_router_hash_ids(ids, 40, h, 1), 1);
    assert_int_equal(gang_router_hash_ids(ids, 15, h, 4), 0);
    /* Raw text: 64-byte chunks; a change in the first chunk changes every later hash. */
    char t1[200], t2[200];
    memset(t1, 'a', sizeof(t1));
    memcpy(t2, t1, sizeof(t2));
    t2[3] = 'b';
    uint64_t x[4], y[4];
    assert_int_equal(gang_router_hash_text(t1, 200, x, 4), 3);
    assert_int_equal(gang_router_hash_text(t2, 200, y, 4), 3);
    for (int i = 0; i < 3; i++)
        assert_true(x[i] != y[i]);
    t2[3] = 'a';
    t2[150] = 'z';
    assert_int_equal(gang_router_hash_text(t2, 200, y, 4), 3);
    assert_true(x[0] == y[0] && x[1] == y[1] && x[2] != y[2]);
}

/* P/D: replicas 0, 1 prefill, 2, 3 decode, 4 both. The prefill pick sees only 0 and 1
 * (by prefix, then load), the answer's pick only 2, 3 and 4 while one of them is up; a
 * prefill replica answers only when no other is up; P/D needs a prefill replica and a
 * decode or both one up. */
static void test_pd_roles(void **state)
{
    (void)state;
    gang_router_policy *p = mk(5, 1024, 2, GANG_ROUTER_PREFIX);
    static const uint32_t roles[5] = {GANG_ROLE_PREFILL, GANG_ROLE_PREFILL, GANG_ROLE_DECODE,
                                      GANG_ROLE_DECODE, GANG_ROLE_BOTH};
    uint64_t a[64];
    gang_router_pick pk;
    assert_int_equal(prompt_hashes(3, 6, 6, a), 6);
    for (uint32_t i = 0; i < 5; i++) {
        gang_router_policy_set_role(p, i, roles[i]);
        set_load(p, i, 0, 0);
    }
    assert_true(gang_router_policy_pd(p));
    /* Without anything cached: the least loaded of each pool. */
    set_load(p, 0, 3, 0);
    set_load(p, 2, 0, 5);
    set_load(p, 4, 0, 9);
    assert_int_equal(gang_router_policy_pick_phase(p, a, 6, 0, GANG_ROUTER_PHASE_PREFILL, &pk), 0);
    assert_int_equal(pk.replica, 1);
    assert_int_equal(pk.reason, GANG_ROUTER_R_LEAST_LOADED);
    assert_int_equal(gang_router_policy_pick_phase(p, a, 6, 0, GANG_ROUTER_PHASE_DECODE, &pk), 0);
    assert_int_equal(pk.replica, 3);
    /* By prefix inside each pool: replica 0 and replica 2 hold the prompt. */
    gang_router_policy_record(p, 0, a, 6);
    gang_router_policy_record(p, 2, a, 6);
    set_load(p, 0, 1, 0);
    set_load(p, 2, 1, 0);
    assert_int_equal(gang_router_policy_pick_phase(p, a, 6, 0, GANG_ROUTER_PHASE_PREFILL, &pk), 0);
    assert_int_equal(pk.replica, 0);
    assert_int_equal(pk.reason, GANG_ROUTER_R_PREFIX);
    assert_int_equal(pk.matched, 6);
    assert_int_equal(gang_router_policy_pick_phase(p, a, 6, 0, GANG_ROUTER_PHASE_DECODE, &pk), 0);
    assert_int_equal(pk.replica, 2);
    assert_int_equal(pk.reason, GANG_ROUTER_R_PREFIX);
    /* The load bound holds inside a pool: replica 2 over 3 + 2 goes to the least loaded. */
    set_load(p, 2, 6, 0);
    assert_int_equal(gang_router_policy_pick_phase(p, a, 6, 0, GANG_ROUTER_PHASE_DECODE, &pk), 0);
    assert_int_equal(pk.replica, 3);
    assert_int_equal(pk.reason, GANG_ROUTER_R_OVERLOADED);
    /* Excluded (tried) replicas are skipped; a prefill replica is never the answer while
     * a decode or both one is eligible. */
    uint64_t ex = 1u << 2 | 1u << 3;
    assert_int_equal(gang_router_policy_pick_phase(p, a, 6, ex, GANG_ROUTER_PHASE_DECODE, &pk), 0);
    assert_int_equal(pk.replica, 4);
    ex |= 1u << 4;
    assert_int_equal(gang_router_policy_pick_phase(p, a, 6, ex, GANG_ROUTER_PHASE_DECODE, &pk), 0);
    assert_true(pk.replica == 0 || pk.replica == 1);
    /* Prefill pool down: no prefill pick (the caller sends the call to decode), no P/D. */
    gang_router_policy_set_up(p, 0, 0);
    gang_router_policy_set_up(p, 1, 0);
    assert_int_equal(gang_router_policy_pick_phase(p, a, 6, 0, GANG_ROUTER_PHASE_PREFILL, &pk),
                     GANG_EAGAIN);
    assert_false(gang_router_policy_pd(p));
    assert_int_equal(gang_router_policy_pick_phase(p, a, 6, 0, GANG_ROUTER_PHASE_DECODE, &pk), 0);
    assert_true(pk.replica >= 2);
    /* Decode pool down, one prefill replica up: no P/D, and it answers the calls itself. */
    gang_router_policy_set_up(p, 1, 1);
    for (uint32_t i = 2; i < 5; i++)
        gang_router_policy_set_up(p, i, 0);
    assert_false(gang_router_policy_pd(p));
    assert_int_equal(gang_router_policy_pick_phase(p, a, 6, 0, GANG_ROUTER_PHASE_DECODE, &pk), 0);
    assert_int_equal(pk.replica, 1);
    /* An unknown role reads as both; with every replica both, no P/D. */
    for (uint32_t i = 0; i < 5; i++) {
        gang_router_policy_set_up(p, i, 1);
        gang_router_policy_set_role(p, i, i == 0 ? 77u : GANG_ROLE_BOTH);
    }
    assert_false(gang_router_policy_pd(p));
    assert_int_equal(gang_router_policy_pick_phase(p, a, 6, 0, GANG_ROUTER_PHASE_PREFILL, &pk),
                     GANG_EAGAIN);
    gang_router_policy_free(p);
}

static void set_kv(gang_router_policy *p, uint32_t i, uint32_t reported, uint32_t kv_free)
{
    gang_router_load l = {.reported = reported, .inflight = 0, .kv_free_blocks = kv_free};
    gang_router_policy_set_load(p, i, &l);
}

/*
 * KV free blocks in the load: a new prompt goes to the least loaded replica with room for
 * its blocks (a less loaded one without the room only when none has it); equal loads go to
 * the one with more free blocks; a replica that does not report them has the room; and the
 * replica holding a prompt's prefix is overloaded when it has no room for the rest of the
 * prompt while another replica has room for all of it.
 */
static void test_kv_free_blocks(void **state)
{
    (void)state;
    gang_router_policy *p = mk(3, 1024, 100, GANG_ROUTER_PREFIX);
    uint64_t q[64], z[64];
    gang_router_pick pk;
    assert_int_equal(prompt_hashes(50000, 8, 8, z), 8);
    set_kv(p, 0, 0, 2);  /* idle, but 2 free blocks for an 8-block prompt */
    set_kv(p, 1, 3, 40); /* busier, room */
    set_kv(p, 2, 5, 40);
    assert_int_equal(gang_router_policy_pick(p, z, 8, 0, &pk), 0);
    assert_int_equal(pk.replica, 1);
    assert_int_equal(pk.reason, GANG_ROUTER_R_LEAST_LOADED);
    /* Nobody has the room: the least loaded after all. */
    set_kv(p, 1, 3, 4);
    set_kv(p, 2, 5, 4);
    assert_int_equal(gang_router_policy_pick(p, z, 8, 0, &pk), 0);
    assert_int_equal(pk.replica, 0);
    /* Equal loads, all with room: the most free blocks, whatever the rotation. */
    for (int k = 0; k < 3; k++) {
        set_kv(p, 0, 1, 30);
        set_kv(p, 1, 1, 90);
        set_kv(p, 2, 1, 60);
        assert_int_equal(gang_router_policy_pick(p, z, 8, 0, &pk), 0);
        assert_int_equal(pk.replica, 1);
    }
    /* Not reported (UINT32_MAX): room. */
    set_kv(p, 0, 0, UINT32_MAX);
    set_kv(p, 1, 1, 90);
    assert_int_equal(gang_router_policy_pick(p, z, 8, 0, &pk), 0);
    assert_int_equal(pk.replica, 0);
    /* The prefix's replica (2) holds 4 of q's 10 blocks; 6 more must fit there. */
    assert_int_equal(prompt_hashes(7, 10, 10, q), 10);
    gang_router_policy_record(p, 2, q, 4);
    set_kv(p, 0, 1, 50);
    set_kv(p, 1, 1, 50);
    set_kv(p, 2, 1, 6);
    assert_int_equal(gang_router_policy_pick(p, q, 10, 0, &pk), 0);
    assert_int_equal(pk.replica, 2);
    assert_int_equal(pk.reason, GANG_ROUTER_R_PREFIX);
    set_kv(p, 2, 1, 5);
    assert_int_equal(gang_router_policy_pick(p, q, 10, 0, &pk), 0);
    assert_true(pk.replica != 2);
    assert_int_equal(pk.reason, GANG_ROUTER_R_OVERLOADED);
    /* ...unless no other replica has the room either. */
    set_kv(p, 0, 1, 9);
    set_kv(p, 1, 1, 9);
    assert_int_equal(gang_router_policy_pick(p, q, 10, 0, &pk), 0);
    assert_int_equal(pk.replica, 2);
    assert_int_equal(pk.reason, GANG_ROUTER_R_PREFIX);
    gang_router_policy_free(p);
}

/* What the client received of a relayed stream. */
typedef struct sink {
    char buf[8192];
    size_t len;
    int gone; /* answer "client gone" */
} sink;

static int sink_out(void *ctx, const char *bytes, size_t len)
{
    sink *k = ctx;
    if (k->gone)
        return GANG_EPEER;
    assert_true(k->len + len < sizeof(k->buf));
    memcpy(k->buf + k->len, bytes, len);
    k->len += len;
    k->buf[k->len] = '\0';
    return 0;
}

/* Feeds text as a replica's bytes, in pieces of `piece` bytes (events split anywhere). */
static int feed(router_stream *s, sink *k, const char *text, size_t piece)
{
    size_t n = strlen(text);
    for (size_t at = 0; at < n; at += piece) {
        int rc = gang__router_stream_feed(s, text + at, n - at < piece ? n - at : piece, 1 << 16,
                                          sink_out, k);
        if (rc != 0)
            return rc;
    }
    return 0;
}

/* The client's view of k: concatenated text and tokens of choice 0, the ids, [DONE]. */
static void client_view(const sink *k, char *text, int32_t *toks, uint32_t *nt, int *done,
                        int *ids_a)
{
    const char *l = k->buf;
    *nt = 0;
    *done = 0;
    *ids_a = 1;
    text[0] = '\0';
    while ((l = strstr(l, "data: ")) != NULL) {
        l += 6;
        const char *end = strstr(l, "\n\n");
        assert_non_null(end);
        if (strncmp(l, "[DONE]", 6) == 0) {
            *done = 1;
            l = end;
            continue;
        }
        cJSON *o = cJSON_ParseWithLength(l, (size_t)(end - l));
        assert_non_null(o);
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(o, "id");
        *ids_a &= cJSON_IsString(id) && strcmp(id->valuestring, "A") == 0;
        const cJSON *ch = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(o, "choices"), 0);
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(ch, "text"), *tk;
        if (cJSON_IsString(t))
            strcat(text, t->valuestring);
        cJSON_ArrayForEach(tk, cJSON_GetObjectItemCaseSensitive(ch, "tokens"))
        {
            toks[(*nt)++] = (int32_t)tk->valuedouble;
        }
        cJSON_Delete(o);
        l = end;
    }
}

#define CHUNK(id, text, toks, fin)                                                                 \
    "data: {\"id\":\"" id "\",\"choices\":[{\"index\":0,\"text\":\"" text "\",\"tokens\":[" toks   \
    "],\"logprobs\":null,\"finish_reason\":" fin "}]}\n\n"

/*
 * A stream resumed on another replica (router/stream.c): the client gets whole events only,
 * the first replica's as they are; the second replica's stream, whose chunks group the
 * tokens and hold text back differently, is checked against what the client has and cut
 * to the rest, under the first id: the client's text and tokens are exactly one healthy
 * stream's, none twice. A continuation with another token or another byte of text is
 * refused (GANG_EMISMATCH); a stream of two choices is not resumable.
 */
static void test_stream_resume(void **state)
{
    (void)state;
    router_stream s = {0};
    static sink k;
    char text[256];
    int32_t toks[16];
    uint32_t nt;
    int done, ids_a;
    /* The first replica: "He" [1], "llo" [2], then a part of an event, then it dies. */
    assert_int_equal(feed(&s, &k,
                          CHUNK("A", "He", "1", "null")
                              CHUNK("A", "llo", "2", "null") "data: {\"id\":\"A\",\"choi",
                          7),
                     0);
    /* Only the two whole events reached the client, as they were. */
    assert_string_equal(k.buf, CHUNK("A", "He", "1", "null") CHUNK("A", "llo", "2", "null"));
    assert_int_equal(gang__router_stream_resume(&s), 1);
    /* The second: "Hel" [1, 2] (the rest held back), "lo w" [3], the end, [DONE]. */
    assert_int_equal(feed(&s, &k,
                          CHUNK("B", "Hel", "1,2", "null") CHUNK("B", "lo w", "3", "null")
                              CHUNK("B", "", "", "\"length\"") "data: [DONE]\n\n",
                          5),
                     0);
    client_view(&k, text, toks, &nt, &done, &ids_a);
    assert_string_equal(text, "Hello w");
    assert_int_equal(nt, 3);
    assert_int_equal(toks[0], 1);
    assert_int_equal(toks[1], 2);
    assert_int_equal(toks[2], 3);
    assert_true(done);
    assert_true(ids_a);
    assert_non_null(strstr(k.buf, "\"finish_reason\":\"length\""));
    /* A third replica that continues with another token, or another text: refused. */
    assert_int_equal(gang__router_stream_resume(&s), 1);
    size_t before = k.len;
    assert_int_equal(feed(&s, &k, CHUNK("C", "Hello", "1,9", "null"), 64), GANG_EMISMATCH);
    s.a_toks = s.a_text = 0;
    assert_int_equal(feed(&s, &k, CHUNK("C", "Hexlo", "1,2", "null"), 64), GANG_EMISMATCH);
    assert_int_equal(k.len, before);                     /* nothing of it reached the client */
    assert_int_equal(gang__router_stream_resume(&s), 1); /* the third... */
    assert_int_equal(gang__router_stream_resume(&s), 0); /* ...is the last (ROUTER_MAX_RESUMES) */
    gang__router_stream_free(&s);
    /* Two choices: relayed, but not resumable. */
    k.len = 0;
    assert_int_equal(feed(&s, &k,
                          "data: {\"id\":\"A\",\"choices\":[{\"index\":0,\"text\":\"a\","
                          "\"tokens\":[1]},{\"index\":1,\"text\":\"b\",\"tokens\":[2]}]}\n\n",
                          64),
                     0);
    assert_true(k.len > 0);
    assert_int_equal(gang__router_stream_resume(&s), 0);
    /* The client gone: the feed says so. */
    k.gone = 1;
    assert_int_equal(feed(&s, &k, CHUNK("A", "x", "4", "null"), 64), GANG_EPEER);
    gang__router_stream_free(&s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_longest_prefix), cmocka_unit_test(test_load_bound),
        cmocka_unit_test(test_replica_down),   cmocka_unit_test(test_lru_bound),
        cmocka_unit_test(test_alternatives),   cmocka_unit_test(test_hashes),
        cmocka_unit_test(test_pd_roles),       cmocka_unit_test(test_kv_free_blocks),
        cmocka_unit_test(test_stream_resume),
    };
    return cmocka_run_group_tests_name("router", tests, NULL, NULL);
}
