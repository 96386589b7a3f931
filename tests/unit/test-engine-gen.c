/*
 * Tests of what ends and shapes a generation (part of test-engine): the model's EOS ids
 * (ignore_eos), the presence / frequency / repetition penalties and the raw logprobs of
 * TOKEN events, on every TP x PP layout the fixture supports.
 *
 * The references are the fixture's naive double-precision forward (ref_logits): the
 * penalties are applied to its logits by hand here and the argmax taken, and the
 * logprobs are the log-softmax of its logits, so neither goes through the engine's
 * sampler.
 */
#include <arpa/inet.h>
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "engine-fixture.h"
#include "engine-internal.h"

/* test-engine.c: writes a one-sequence plan and decodes it. */
int test_plan_decode_one(gang_engine *e, const gang__plan_seq *s, const int32_t *tokens,
                         const int32_t *table, const gang__plan_hdr *hdr);

#define N_LAYOUTS 4
static const uint32_t layouts[N_LAYOUTS][2] = {{1, 1}, {2, 1}, {1, 2}, {2, 2}};

/*
 * Runs sc on a tp x pp gang of fm whose models declare the EOS ids eos [n_eos], engines
 * of cfg; every rank must step without error.
 */
static void run_on_layout(const full_model *fm, script *sc, uint32_t tp, uint32_t pp,
                          const gang_engine_config *cfg, const int32_t *eos, uint32_t n_eos)
{
    static rank_ctx xs[MAX_RANKS];
    layout lo;
    uint32_t r;

    layout_init(&lo, fm, tp, pp, cfg);
    for (r = 0; r < lo.n; r++) {
        if (n_eos > 0) /* memcpy from NULL is undefined even for 0 bytes */
            memcpy(lo.models[r]->cfg.eos_ids, eos, n_eos * sizeof(int32_t));
        lo.models[r]->cfg.n_eos = n_eos;
    }
    run_gang(tp, pp, lo.engines, sc, script_body, NULL, xs);
    for (r = 0; r < lo.n; r++)
        if (xs[r].body_rc != 0)
            fail_msg("tp=%u pp=%u: rank %u: %s", tp, pp, r, gang_err_name(xs[r].body_rc));
    layout_free(&lo);
}

/* ---------------------------------------------------------------------------------
 * EOS
 * --------------------------------------------------------------------------------- */

/*
 * A greedy request runs to max_tokens without EOS; with the token it produced at index 3
 * as the model's EOS it ends right after emitting it (4 tokens, "stop", that token the
 * last event); with ignore_eos it runs to max_tokens with the same tokens. On 1x1, 2x1,
 * 1x2 and 2x2.
 */
void test_eos(void **state)
{
    enum { MAX_T = 10 };
    static script sc;
    gang_engine_config cfg = engine_config(2);
    full_model *fm = full_model_new(31, 0);
    int32_t base[MAX_T], eos[2];
    uint64_t id;
    uint32_t l, j;
    int found = 0;

    (void)state;
    /* A prompt whose greedy token 3 does not occur among tokens 0..2. */
    for (id = 1; id < 40 && !found; id++) {
        memset(&sc, 0, sizeof(sc));
        add_req(&sc, id, 0, 5, MAX_T, greedy);
        ref_greedy(fm, sc.reqs[0].prompt, 5, MAX_T, base);
        found = base[3] != base[0] && base[3] != base[1] && base[3] != base[2];
    }
    assert_true(found);
    sc.steps = 20;
    eos[0] = (base[3] + 1) % VOCAB == base[0] ? (base[3] + 2) % VOCAB : (base[3] + 1) % VOCAB;
    eos[1] = base[3];
    for (j = 0; j < 4; j++)
        if (base[j] == eos[0])
            eos[0] = -1; /* never produced first: keep the list meaningful */
    if (eos[0] < 0)
        eos[0] = eos[1];
    for (l = 0; l < N_LAYOUTS; l++) {
        uint32_t tp = layouts[l][0], pp = layouts[l][1];

        /* No EOS: the whole run, equal to the reference. */
        sc.reqs[0].ignore_eos = 0;
        run_on_layout(fm, &sc, tp, pp, &cfg, NULL, 0);
        if (sc.out[0].n != MAX_T || strcmp(sc.out[0].finish, "length") != 0)
            fail_msg("tp=%u pp=%u, no eos: %u tokens (%s)", tp, pp, sc.out[0].n, sc.out[0].finish);
        for (j = 0; j < MAX_T; j++)
            assert_int_equal(sc.out[0].tokens[j], base[j]);
        /* EOS = token 3 (second in the model's list): ends after it, with it. */
        run_on_layout(fm, &sc, tp, pp, &cfg, eos, 2);
        if (sc.out[0].bad || !sc.out[0].done || sc.out[0].n != 4 ||
            strcmp(sc.out[0].finish, "stop") != 0)
            fail_msg("tp=%u pp=%u, eos %d: %u tokens (%s)", tp, pp, base[3], sc.out[0].n,
                     sc.out[0].finish);
        for (j = 0; j < 4; j++)
            assert_int_equal(sc.out[0].tokens[j], base[j]);
        /* ignore_eos: to max_tokens, the same tokens. */
        sc.reqs[0].ignore_eos = 1;
        run_on_layout(fm, &sc, tp, pp, &cfg, eos, 2);
        if (sc.out[0].n != MAX_T || strcmp(sc.out[0].finish, "length") != 0)
            fail_msg("tp=%u pp=%u, ignore_eos: %u tokens (%s)", tp, pp, sc.out[0].n,
                     sc.out[0].finish);
        for (j = 0; j < MAX_T; j++)
            assert_int_equal(sc.out[0].tokens[j], base[j]);
    }
    free(fm);
}

/* ---------------------------------------------------------------------------------
 * Penalties
 * --------------------------------------------------------------------------------- */

/*
 * The reference of a greedy request with penalties: the naive logits, the penalties
 * applied by hand in double (repetition over the distinct ids of prompt and output,
 * then frequency x count and presence over the output), the argmax.
 */
static void ref_penalised(const full_model *fm, const script_req *r, int32_t *out)
{
    int32_t ids[MAX_POS];
    double lg[VOCAB], rp = r->sp.repetition_penalty;
    uint32_t i, t, j, n = r->n_prompt, count[VOCAB];
    int seen[VOCAB];

    memcpy(ids, r->prompt, n * sizeof(int32_t));
    for (i = 0; i < r->max_tokens; i++) {
        ref_logits(fm, ids, n, lg);
        memset(seen, 0, sizeof(seen));
        memset(count, 0, sizeof(count));
        for (j = 0; j < n; j++)
            seen[ids[j]] = 1;
        for (j = r->n_prompt; j < n; j++)
            count[ids[j]]++;
        for (t = 0; t < VOCAB; t++) {
            if (seen[t] && rp > 0.0 && rp != 1.0)
                lg[t] = lg[t] > 0.0 ? lg[t] / rp : lg[t] * rp;
            lg[t] -= r->sp.frequency_penalty * (double)count[t];
            if (count[t] > 0)
                lg[t] -= r->sp.presence_penalty;
        }
        out[i] = ref_argmax(lg, VOCAB);
        ids[n++] = out[i];
    }
}

#define N_PEN 5
static const float pens[N_PEN][3] = {
    /* presence, frequency, repetition */
    {1.5f, 0.0f, 0.0f}, {0.0f, 1.0f, 0.0f},
    {0.0f, 0.0f, 2.5f}, {0.0f, 0.0f, 0.4f}, /* < 1 favours repeats */
    {0.5f, 0.7f, 1.3f},
};

/* The penalty script: one greedy request per row of pens, prompts from their ids. */
static void make_penalty_script(script *sc)
{
    uint32_t i;

    memset(sc, 0, sizeof(*sc));
    for (i = 0; i < N_PEN; i++) {
        gang_sampling sp = greedy;

        sp.presence_penalty = pens[i][0];
        sp.frequency_penalty = pens[i][1];
        sp.repetition_penalty = pens[i][2];
        add_req(sc, 40 + i, i, 4 + i, 8, sp);
    }
    sc->steps = 60;
}

/*
 * Greedy tokens with each penalty alone and combined equal the hand-made reference (and
 * differ from plain greedy, so the penalty is really applied), alone on one rank and
 * together (queued for 3 slots, so slots are reused) on every layout.
 */
void test_penalties(void **state)
{
    static script sc, alone;
    static int32_t want[N_PEN][MAX_GEN];
    gang_engine_config cfg = engine_config(2);
    full_model *fm = full_model_new(44, 0);
    gang_model *m = shard_new(fm, 1, 1, 0);
    gang_engine *e = NULL;
    int32_t plain[MAX_GEN];
    char err[256];
    uint32_t i, j, l;
    int differs;

    (void)state;
    make_penalty_script(&sc);
    assert_int_equal(gang_engine_init(m, &cfg, &e, err, sizeof(err)), 0);
    for (i = 0; i < N_PEN; i++) {
        ref_penalised(fm, &sc.reqs[i], want[i]);
        ref_greedy(fm, sc.reqs[i].prompt, sc.reqs[i].n_prompt, 8, plain);
        differs = 0;
        for (j = 0; j < 8; j++)
            differs |= plain[j] != want[i][j];
        if (!differs)
            fail_msg("penalty row %u does not change the greedy tokens: a weak test", i);
        memset(&alone, 0, sizeof(alone));
        alone.reqs[0] = sc.reqs[i];
        alone.reqs[0].arrive = 0;
        alone.n_reqs = 1;
        alone.steps = 20;
        script_run_local(e, &alone);
        assert_int_equal(alone.out[0].n, 8);
        for (j = 0; j < 8; j++)
            if (alone.out[0].tokens[j] != want[i][j])
                fail_msg("penalty row %u alone: token %u is %d, reference %d", i, j,
                         alone.out[0].tokens[j], want[i][j]);
    }
    gang_engine_free(e);
    shard_free(m);
    for (l = 0; l < N_LAYOUTS; l++) {
        run_on_layout(fm, &sc, layouts[l][0], layouts[l][1], &cfg, NULL, 0);
        for (i = 0; i < N_PEN; i++) {
            if (sc.out[i].bad || sc.out[i].n != 8)
                fail_msg("tp=%u pp=%u: penalty row %u: %u tokens", layouts[l][0], layouts[l][1], i,
                         sc.out[i].n);
            for (j = 0; j < 8; j++)
                if (sc.out[i].tokens[j] != want[i][j])
                    fail_msg("tp=%u pp=%u: penalty row %u: token %u is %d, reference %d",
                             layouts[l][0], layouts[l][1], i, j, sc.out[i].tokens[j], want[i][j]);
        }
    }
    free(fm);
}

/*
 * Seeded sampling with penalties depends on nothing but the request: the same tokens
 * alone (a batch of 1), next to three other penalised requests (a batch of 4), and when
 * the engine is reset in the middle and the request submitted again.
 */
void test_penalties_seeded(void **state)
{
    static script sc;
    gang_engine_config cfg = engine_config(1);
    full_model *fm = full_model_new(43, 0);
    gang_model *m = shard_new(fm, 1, 1, 0);
    gang_engine *e = NULL;
    gang_kernels *k = NULL;
    gang_sampling sp = {.temperature = 0.9f,
                        .top_p = 0.95f,
                        .seed = 4242,
                        .presence_penalty = 0.4f,
                        .frequency_penalty = 0.6f,
                        .repetition_penalty = 1.4f};
    int32_t alone[12];
    char err[256];
    uint32_t i, s;

    (void)state;
    cfg.max_batch = 4;
    assert_int_equal(gang_engine_init(m, &cfg, &e, err, sizeof(err)), 0);
    assert_int_equal(gang_engine_slots(e), 4);
    memset(&sc, 0, sizeof(sc));
    add_req(&sc, 7, 0, 5, 12, sp);
    sc.steps = 30;
    script_run_local(e, &sc);
    assert_int_equal(sc.out[0].n, 12);
    memcpy(alone, sc.out[0].tokens, sizeof(alone));

    /* A batch of four. */
    for (i = 1; i < 4; i++) {
        gang_sampling o = sp;

        o.seed = 100 + i;
        o.repetition_penalty = 1.0f + 0.3f * (float)i;
        add_req(&sc, 7 + i, 0, 3 + i, 10, o);
    }
    script_run_local(e, &sc);
    for (i = 0; i < 12; i++)
        assert_int_equal(sc.out[0].tokens[i], alone[i]);

    /* Reset after a few steps, then submit it again. */
    assert_int_equal(gang_kernels_open("cpu", &k), 0);
    memset(sc.out, 0, sizeof(sc.out));
    assert_int_equal(script_submit(e, &sc, 0), 0);
    for (s = 0; s < 5; s++)
        assert_int_equal(gang_engine_step(e, k, NULL, NULL, NULL, NULL, STEP_TIMEOUT_MS), 0);
    gang_engine_reset(e);
    sc.n_reqs = 1;
    script_run_local(e, &sc);
    for (i = 0; i < 12; i++)
        assert_int_equal(sc.out[0].tokens[i], alone[i]);
    /* And the penalties matter: without them the same seed draws otherwise. */
    sc.reqs[0].sp.presence_penalty = sc.reqs[0].sp.frequency_penalty = 0.0f;
    sc.reqs[0].sp.repetition_penalty = 0.0f;
    script_run_local(e, &sc);
    s = 0;
    for (i = 0; i < 12; i++)
        s |= sc.out[0].tokens[i] != alone[i];
    assert_true(s);
    gang_kernels_close(k);
    gang_engine_free(e);
    shard_free(m);
    free(fm);
}

/* ---------------------------------------------------------------------------------
 * Logprobs
 * --------------------------------------------------------------------------------- */

/* The log-softmax of the reference logits of ids [n]. */
static void ref_logsoftmax(const full_model *fm, const int32_t *ids, uint32_t n, double *lp)
{
    double mx, sum = 0.0;
    uint32_t t;

    ref_logits(fm, ids, n, lp);
    mx = lp[ref_argmax(lp, VOCAB)];
    for (t = 0; t < VOCAB; t++)
        sum += exp(lp[t] - mx);
    for (t = 0; t < VOCAB; t++)
        lp[t] -= mx + log(sum);
}

/*
 * Fails unless request r's output o carries, for each token, the reference's raw
 * logprob of it and its top n_top (ids in order, values) within 1e-4.
 */
static void check_logprobs(const full_model *fm, const script_req *r, const script_out *o,
                           const char *what)
{
    int32_t ids[MAX_POS];
    double lp[VOCAB], tmp[VOCAB];
    uint32_t i, j, n = r->n_prompt;
    int32_t best;

    memcpy(ids, r->prompt, n * sizeof(int32_t));
    if (o->bad || o->n == 0)
        fail_msg("%s: request %llu: no tokens", what, (unsigned long long)r->id);
    for (i = 0; i < o->n; i++) {
        ref_logsoftmax(fm, ids, n, lp);
        if (!(fabs(o->logprob[i] - lp[o->tokens[i]]) <= 1e-4))
            fail_msg("%s: request %llu token %u: logprob %g, reference %g", what,
                     (unsigned long long)r->id, i, (double)o->logprob[i], lp[o->tokens[i]]);
        assert_int_equal(o->n_top[i], r->top_logprobs);
        memcpy(tmp, lp, sizeof(tmp));
        for (j = 0; j < r->top_logprobs; j++) {
            best = ref_argmax(tmp, VOCAB);
            if (o->top_ids[i][j] != best || !(fabs(o->top_lp[i][j] - lp[best]) <= 1e-4))
                fail_msg("%s: request %llu token %u: top %u is %d (%g), reference %d (%g)", what,
                         (unsigned long long)r->id, i, j, o->top_ids[i][j], (double)o->top_lp[i][j],
                         best, lp[best]);
            tmp[best] = -INFINITY;
        }
        ids[n++] = o->tokens[i];
    }
}

/*
 * Logprobs (chosen token and top 5, or top 20) equal the log-softmax of the naive
 * reference's logits within 1e-4 on every layout, also for a penalised and a sampled
 * request (raw logprobs: before penalties and temperature), and are equal across
 * layouts; a request that does not ask gets none.
 */
void test_logprobs(void **state)
{
    static script sc;
    static script_out first[4];
    gang_engine_config cfg = engine_config(2);
    full_model *fm = full_model_new(47, 1);
    gang_sampling pen = greedy, hot = {.temperature = 1.2f, .top_p = 1.0f, .seed = 9};
    uint32_t l, i, j, t;

    (void)state;
    pen.repetition_penalty = 2.0f;
    memset(&sc, 0, sizeof(sc));
    add_req(&sc, 60, 0, 5, 6, greedy);
    add_req(&sc, 61, 0, 3, 6, pen);
    add_req(&sc, 62, 1, 8, 6, hot);
    add_req(&sc, 63, 1, 4, 3, greedy);
    sc.reqs[0].logprobs = sc.reqs[1].logprobs = sc.reqs[2].logprobs = 1;
    sc.reqs[0].top_logprobs = 5;
    sc.reqs[1].top_logprobs = 5;
    sc.reqs[2].top_logprobs = GANG_MAX_TOP_LOGPROBS;
    sc.steps = 30;
    for (l = 0; l < N_LAYOUTS; l++) {
        char what[32];

        snprintf(what, sizeof(what), "tp=%u pp=%u", layouts[l][0], layouts[l][1]);
        run_on_layout(fm, &sc, layouts[l][0], layouts[l][1], &cfg, NULL, 0);
        for (i = 0; i < 3; i++)
            check_logprobs(fm, &sc.reqs[i], &sc.out[i], what);
        for (j = 0; j < sc.out[3].n; j++)
            assert_true(sc.out[3].logprob[j] == 0.0f && sc.out[3].n_top[j] == 0);
        if (l == 0) {
            memcpy(first, sc.out, sizeof(first));
            continue;
        }
        for (i = 0; i < 3; i++) {
            assert_int_equal(sc.out[i].n, first[i].n);
            for (j = 0; j < sc.out[i].n; j++) {
                assert_int_equal(sc.out[i].tokens[j], first[i].tokens[j]);
                assert_true(fabsf(sc.out[i].logprob[j] - first[i].logprob[j]) <= 1e-4f);
                for (t = 0; t < sc.out[i].n_top[j]; t++) {
                    assert_int_equal(sc.out[i].top_ids[j][t], first[i].top_ids[j][t]);
                    assert_true(fabsf(sc.out[i].top_lp[j][t] - first[i].top_lp[j][t]) <= 1e-4f);
                }
            }
        }
    }
    free(fm);
}

/* ---------------------------------------------------------------------------------
 * Validation
 * --------------------------------------------------------------------------------- */

/* Submit refuses out-of-range penalties and logprob flags; the plan's receivers too. */
void test_gen_validation(void **state)
{
    gang_engine_config cfg = engine_config(1);
    full_model *fm = full_model_new(5, 0);
    gang_model *m = shard_new(fm, 1, 1, 0);
    gang_engine *e = NULL;
    int32_t prompt[3] = {1, 2, 3};
    gang_gen_request r, bad;
    char err[256];
    uint32_t i;

    (void)state;
    assert_int_equal(gang_engine_init(m, &cfg, &e, err, sizeof(err)), 0);
    memset(&r, 0, sizeof(r));
    r.id = 1;
    r.prompt = prompt;
    r.n_prompt = 3;
    r.max_tokens = 2;
    r.sampling = greedy;
    for (i = 0; i < 10; i++) {
        bad = r;
        switch (i) {
        case 0:
            bad.sampling.presence_penalty = 2.5f;
            break;
        case 1:
            bad.sampling.frequency_penalty = -2.1f;
            break;
        case 2:
            bad.sampling.repetition_penalty = -1.0f;
            break;
        case 3:
            bad.sampling.repetition_penalty = INFINITY;
            break;
        case 4:
            bad.sampling.presence_penalty = NAN;
            break;
        case 5:
            bad.sampling.ignore_eos = 2;
            break;
        case 6:
            bad.sampling.logprobs = 2;
            break;
        case 7:
            bad.sampling.top_logprobs = 3;
            break; /* without logprobs */
        case 8:
            bad.sampling.logprobs = 1;
            bad.sampling.top_logprobs = GANG_MAX_TOP_LOGPROBS + 1;
            break;
        default:
            bad.sampling.frequency_penalty = 3.0f;
            break;
        }
        if (gang_engine_submit(e, &bad, err, sizeof(err)) != GANG_EINVAL)
            fail_msg("bad request %u accepted", i);
        assert_true(err[0] != '\0');
    }
    assert_int_equal(gang_engine_pending(e), 0);
    r.sampling.presence_penalty = -2.0f;
    r.sampling.frequency_penalty = 2.0f;
    r.sampling.repetition_penalty = 1.0f;
    r.sampling.logprobs = 1;
    r.sampling.top_logprobs = GANG_MAX_TOP_LOGPROBS;
    r.sampling.ignore_eos = 1;
    assert_int_equal(gang_engine_submit(e, &r, err, sizeof(err)), 0);

    /* A received plan with logprobs or a prompt length out of bounds. */
    {
        gang__plan_seq s = {.n = 2, .sample = 1, .n_prompt = 2};
        int32_t ids[2] = {0, 0}, table[16] = {0};
        /* top_logprobs on the wire: after 5 words of the entry and 32 bytes of sampling
         * values, the flags ignore_eos, logprobs, top_logprobs (engine-request.c) */
        uint8_t *top = (uint8_t *)e->plan_buf + 4 * GANG__PLAN_HDR_WORDS + 20 + 32 + 2;

        s.sp.top_p = 1.0f;
        s.sp.logprobs = 1;
        s.sp.top_logprobs = 5;
        assert_int_equal(test_plan_decode_one(e, &s, ids, table, NULL), 0);
        assert_int_equal(e->plan.seqs[0].sp.top_logprobs, 5);
        assert_int_equal(*top, 5);
        *top = GANG_MAX_TOP_LOGPROBS + 1; /* over its maximum, sent anyway */
        assert_int_equal(gang__plan_decode(e), GANG_EPROTO);
        *top = 5; /* the same plan, intact, passes */
        assert_int_equal(gang__plan_decode(e), 0);
        s.sp.logprobs = 0; /* alternatives without logprobs */
        assert_int_equal(test_plan_decode_one(e, &s, ids, table, NULL), GANG_EPROTO);
        s.sp.top_logprobs = 0;
        s.n_prompt = 3; /* a sampling sequence whose prompt is not fed yet */
        assert_int_equal(test_plan_decode_one(e, &s, ids, table, NULL), GANG_EPROTO);
        s.n_prompt = 0;
        assert_int_equal(test_plan_decode_one(e, &s, ids, table, NULL), GANG_EPROTO);
        s.n_prompt = 1;
        s.sp.presence_penalty = 5.0f;
        assert_int_equal(test_plan_decode_one(e, &s, ids, table, NULL), GANG_EPROTO);
    }
    gang_engine_free(e);
    shard_free(m);
    free(fm);
}

/* P/D between gangs of different PP: the layer runs a decode rank fetches from each
 * prefill stage, by hand for the two cases and against the split of every small
 * layout (each layer from the one stage that holds it, runs in order, exact cover). */
static void kv_spans_check_all(void)
{
    gang_kv_span sp[16];
    uint32_t n = 0;
    for (uint32_t L = 1; L <= 13; L++)
        for (uint32_t spp = 1; spp <= L; spp++)
            for (uint32_t dpp = 1; dpp <= L; dpp++)
                for (uint32_t d = 0; d < dpp; d++) {
                    gang_topology dt, st;
                    uint32_t df, dc, at = 0, prev = 0;
                    memset(&dt, 0, sizeof(dt));
                    dt.n_layers = L;
                    dt.pp = dpp;
                    st = dt;
                    st.pp = spp;
                    assert_int_equal(gang_topology_stage_layers(&dt, d, &df, &dc), 0);
                    assert_int_equal(gang_kv_layer_spans(L, spp, df, dc, sp, 16, &n), 0);
                    assert_true(n >= 1 && n <= spp);
                    for (uint32_t i = 0; i < n; i++) {
                        uint32_t sf, sc;
                        assert_true(i == 0 || sp[i].src_stage > prev);
                        prev = sp[i].src_stage;
                        assert_int_equal(sp[i].dst_first, at);
                        assert_true(sp[i].count >= 1);
                        assert_int_equal(gang_topology_stage_layers(&st, sp[i].src_stage, &sf, &sc),
                                         0);
                        /* the run lies in that stage, at the same model layers */
                        assert_true(sp[i].src_first + sp[i].count <= sc);
                        assert_int_equal(sf + sp[i].src_first, df + sp[i].dst_first);
                        at += sp[i].count;
                    }
                    assert_int_equal(at, dc);
                }
}

void test_kv_layer_spans(void **state)
{
    gang_kv_span sp[8];
    uint32_t n = 99;
    (void)state;
    /* prefill PP 2 -> decode PP 1: 30 layers come from stages 0 and 1 */
    assert_int_equal(gang_kv_layer_spans(30, 2, 0, 30, sp, 8, &n), 0);
    assert_int_equal(n, 2);
    assert_int_equal(sp[0].src_stage, 0);
    assert_int_equal(sp[0].src_first, 0);
    assert_int_equal(sp[0].dst_first, 0);
    assert_int_equal(sp[0].count, 15);
    assert_int_equal(sp[1].src_stage, 1);
    assert_int_equal(sp[1].src_first, 0);
    assert_int_equal(sp[1].dst_first, 15);
    assert_int_equal(sp[1].count, 15);
    /* prefill PP 1 -> decode PP 2, stage 1 (layers 15..29): one run of stage 0 */
    assert_int_equal(gang_kv_layer_spans(30, 1, 15, 15, sp, 8, &n), 0);
    assert_int_equal(n, 1);
    assert_int_equal(sp[0].src_stage, 0);
    assert_int_equal(sp[0].src_first, 15);
    assert_int_equal(sp[0].dst_first, 0);
    assert_int_equal(sp[0].count, 15);
    /* errors: bad layouts, ranges, too small an output (*n 0) */
    assert_int_equal(gang_kv_layer_spans(30, 0, 0, 30, sp, 8, &n), GANG_EINVAL);
    assert_int_equal(gang_kv_layer_spans(3, 4, 0, 3, sp, 8, &n), GANG_EINVAL);
    assert_int_equal(gang_kv_layer_spans(30, 2, 0, 0, sp, 8, &n), GANG_EINVAL);
    assert_int_equal(gang_kv_layer_spans(30, 2, 20, 11, sp, 8, &n), GANG_EINVAL);
    assert_int_equal(gang_kv_layer_spans(30, 2, 0, 30, NULL, 8, &n), GANG_EINVAL);
    assert_int_equal(gang_kv_layer_spans(30, 3, 0, 30, sp, 2, &n), GANG_ERANGE);
    assert_int_equal(n, 0);
    kv_spans_check_all();
}

/* Every decode rank of every small layout of equal TP fetches each of its layers exactly
 * once, in order, from the prefill rank that holds it (its stage's, the same TP shard). */
static void kv_parts_check_all(void)
{
    gang_kv_part pt[16];
    for (uint32_t L = 1; L <= 9; L++)
        for (uint32_t tp = 1; tp <= 2; tp++)
            for (uint32_t spp = 1; spp <= L; spp++)
                for (uint32_t dpp = 1; dpp <= L; dpp++)
                    for (uint32_t d = 0; d < dpp * tp; d++) {
                        gang_topology dt, st;
                        gang_kv_layout l = {.layers = L, .pp = spp, .tp = tp};
                        uint32_t df, dc, n = 0, at;
                        memset(&dt, 0, sizeof(dt));
                        dt.n_layers = L;
                        dt.pp = dpp;
                        st = dt;
                        st.pp = spp;
                        assert_int_equal(gang_topology_stage_layers(&dt, d / tp, &df, &dc), 0);
                        assert_int_equal(
                            gang_kv_parts(&l, "h", L, tp, d, d % tp, df, dc, pt, 16, &n), 0);
                        at = df;
                        for (uint32_t i = 0; i < n; i++) {
                            uint32_t sf, sc;
                            assert_int_equal(pt[i].layer_first, at);
                            assert_int_equal(pt[i].rank % tp, d % tp);
                            assert_true(pt[i].rank / tp < spp);
                            assert_int_equal(
                                gang_topology_stage_layers(&st, pt[i].rank / tp, &sf, &sc), 0);
                            assert_true(pt[i].layer_first >= sf &&
                                        pt[i].layer_first + pt[i].layer_count <= sf + sc);
                            assert_string_equal(pt[i].host, "h");
                            at += pt[i].layer_count;
                        }
                        assert_int_equal(at, df + dc);
                    }
}

/* P/D between gangs of different PP (and nodes): which prefill rank, at which address,
 * serves which layers of a decode rank (gang_kv_parts), and the layout's bounds and wire
 * form (gang_kv_layout_valid, gang_kv_layout_codec). */
void test_kv_parts(void **state)
{
    gang_kv_part pt[8];
    uint32_t n = 99;
    (void)state;
    /* no layout: the same one, one part from the rank of the same index */
    gang_kv_layout same = {0};
    assert_int_equal(gang_kv_parts(&same, "10.1.1.1", 30, 2, 3, 1, 15, 15, pt, 8, &n), 0);
    assert_int_equal(n, 1);
    assert_int_equal(pt[0].rank, 3);
    assert_int_equal(pt[0].layer_first, 15);
    assert_int_equal(pt[0].layer_count, 15);
    assert_string_equal(pt[0].host, "10.1.1.1");
    /* prefill PP 2, TP 2 on two nodes (ranks 0, 1 and 2, 3) -> decode PP 1, TP rank 1:
     * layers 0..14 from rank 1 on node 0, 15..29 from rank 3 on node 1 */
    gang_kv_layout two = {.layers = 30, .pp = 2, .tp = 2, .n_nodes = 2, .ranks_per_node = 2};
    two.node_addr[0] = htonl(0x0a000001u);
    two.node_addr[1] = htonl(0x0a000002u);
    assert_true(gang_kv_layout_valid(&two));
    assert_int_equal(gang_kv_parts(&two, "10.9.9.9", 30, 2, 1, 1, 0, 30, pt, 8, &n), 0);
    assert_int_equal(n, 2);
    assert_int_equal(pt[0].rank, 1);
    assert_int_equal(pt[0].layer_first, 0);
    assert_int_equal(pt[0].layer_count, 15);
    assert_string_equal(pt[0].host, "10.0.0.1");
    assert_int_equal(pt[1].rank, 3);
    assert_int_equal(pt[1].layer_first, 15);
    assert_int_equal(pt[1].layer_count, 15);
    assert_string_equal(pt[1].host, "10.0.0.2");
    /* a node without an address: the transfer's host */
    two.node_addr[1] = 0;
    assert_int_equal(gang_kv_parts(&two, "10.9.9.9", 30, 2, 1, 1, 0, 30, pt, 8, &n), 0);
    assert_string_equal(pt[1].host, "10.9.9.9");
    /* prefill PP 1 -> decode PP 2, stage 1 TP rank 0 (layers 15..29): rank 0 serves them */
    gang_kv_layout one = {.layers = 30, .pp = 1, .tp = 2};
    assert_int_equal(gang_kv_parts(&one, "10.9.9.9", 30, 2, 2, 0, 15, 15, pt, 8, &n), 0);
    assert_int_equal(n, 1);
    assert_int_equal(pt[0].rank, 0);
    assert_int_equal(pt[0].layer_first, 15);
    assert_int_equal(pt[0].layer_count, 15);
    /* another model or TP: a mismatch; bad arguments; too many parts */
    assert_int_equal(gang_kv_parts(&one, "h", 24, 2, 0, 0, 0, 24, pt, 8, &n), GANG_EMISMATCH);
    assert_int_equal(gang_kv_parts(&one, "h", 30, 1, 0, 0, 0, 30, pt, 8, &n), GANG_EMISMATCH);
    gang_kv_layout bad = {.layers = 30, .pp = 31, .tp = 1};
    assert_int_equal(gang_kv_parts(&bad, "h", 30, 1, 0, 0, 0, 30, pt, 8, &n), GANG_EMISMATCH);
    assert_int_equal(gang_kv_parts(&one, "h", 30, 2, 0, 0, 20, 11, pt, 8, &n), GANG_EINVAL);
    assert_int_equal(gang_kv_parts(&one, NULL, 30, 2, 0, 0, 0, 30, pt, 8, &n), GANG_EINVAL);
    gang_kv_layout many = {.layers = 30, .pp = 30, .tp = 1};
    assert_int_equal(gang_kv_parts(&many, "h", 30, 1, 0, 0, 0, 30, pt, 8, &n), GANG_ERANGE);
    assert_int_equal(n, 0);
    /* bounds of a layout */
    gang_kv_layout v = {.layers = 4, .pp = 2, .tp = 2, .n_nodes = 3, .ranks_per_node = 2};
    assert_false(gang_kv_layout_valid(&v)); /* 3 x 2 ranks for a gang of 4 */
    v.n_nodes = 2;
    assert_true(gang_kv_layout_valid(&v));
    v.tp = GANG_KV_RANKS_MAX;
    assert_false(gang_kv_layout_valid(&v));
    /* the wire form: a round trip, and a decoded layout out of bounds is refused */
    uint8_t buf[256];
    size_t len = 0;
    gang_codec c;
    gang_kv_layout back;
    two.node_addr[1] = htonl(0x0a000002u);
    gang_codec_encoder(&c, buf, sizeof buf);
    gang_kv_layout_codec(&c, &two);
    assert_int_equal(gang_codec_finish(&c, &len), 0);
    gang_codec_decoder(&c, buf, len);
    gang_kv_layout_codec(&c, &back);
    assert_int_equal(gang_codec_finish(&c, NULL), 0);
    assert_memory_equal(&back, &two, sizeof two);
    buf[4] = 31; /* pp (u16 after the u32 layers) above the 30 layers */
    gang_codec_decoder(&c, buf, len);
    gang_kv_layout_codec(&c, &back);
    assert_int_equal(gang_codec_finish(&c, NULL), GANG_EPROTO);
    gang_codec_encoder(&c, buf, sizeof buf);
    gang_kv_layout_codec(&c, &bad);
    assert_int_equal(gang_codec_finish(&c, NULL), GANG_EINVAL);
    kv_parts_check_all();
}
