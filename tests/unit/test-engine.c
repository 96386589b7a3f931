/*
 * Tests of the generation engine (engine/engine*.c, engine/sample.c) and of the batched
 * ragged layer it runs on (gang_tp_layer_forward_batch).
 *
 * The models are random and built by hand per rank (full weights drawn by the fixture,
 * engine-fixture.c, shards cut with gang_tp_layer_init), so most tests do not depend on
 * the model files. The reference is an independent naive forward pass of the whole model
 * in the fixture, plain double-precision loops (no kernels, no engine code): the engine's
 * single-rank logits must agree with it within 1e-4 relative, decoding with the KV cache
 * must agree with re-running the prefix, and greedy tokens must equal the reference's
 * greedy tokens for TP x PP in {1x1, 2x1, 1x2, 2x2} with 1 and 2 microbatches, several
 * concurrent requests of different lengths arriving at different steps (continuous
 * batching and chunked prefill). Seeded sampling must not depend on batching; top_k = 1 is greedy.
 * Submit validation, a KV budget below one slot, an abort in the middle of a step (every
 * rank returns GANG_EABORTED promptly, and after gang_engine_reset the next generation
 * gives the same tokens) and a Qwen2-like model with q/k/v biases are covered too; so is
 * a model written by gang_mkmodel and loaded per rank by gang_model_load (2x2 = 1x1).
 * EOS, penalties, logprobs and the P/D layer runs between gangs of different PP
 * (gang_kv_layer_spans) are tested in test-engine-gen.c (registered below).
 */
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
#include <unistd.h>

#include <cmocka.h>

#include "engine-fixture.h"
#include "engine-internal.h"

/* ---------------------------------------------------------------------------------
 * Tests: the batched ragged layer
 * --------------------------------------------------------------------------------- */

/*
 * Two steps of three ragged sequences (a prefill of 4, 2 and 3 tokens, then a decode, a
 * chunk of 3 and a decode) through gang_tp_layer_forward_batch equal the same sequences
 * through it one by one (batches of one), outputs and cache rows, with and without
 * biases; invalid batches are refused.
 */
static void test_layer_batch(void **state)
{
    static const uint32_t len1[3] = {4, 2, 3}, pos1[3] = {0, 0, 0};
    static const uint32_t len2[3] = {1, 3, 1}, pos2[3] = {4, 2, 3};
    const uint32_t *lens[2] = {len1, len2}, *poss[2] = {pos1, pos2};
    enum { CAP = 16, MAXT = 16 };
    gang_kernels *k = NULL;
    gang_topology t;
    int with_bias;

    (void)state;
    assert_int_equal(gang_kernels_open("cpu", &k), 0);
    assert_int_equal(topology_for(1, 1, &t), 0);
    for (with_bias = 0; with_bias < 2; with_bias++) {
        full_model *fm = full_model_new(3, with_bias);
        float ka[3][CAP * KV_DIM], va[3][CAP * KV_DIM], kb[3][CAP * KV_DIM], vb[3][CAP * KV_DIM];
        gang_tp_kv_cache ca[3], cb[3], *pb[3];
        float x[MAXT * HIDDEN], xb[MAXT * HIDDEN];
        uint32_t bad_len[3] = {4, 12, 1};
        gang_tp_scratch s;
        gang_tp_layer l;
        size_t off, i, step;

        assert_int_equal(gang_tp_layer_init(&l, &t, 0, &fm->w[0], ROPE_THETA, NORM_EPS), 0);
        assert_true(with_bias ? l.bq != NULL && l.bk != NULL && l.bv != NULL : l.bq == NULL);
        assert_int_equal(gang_tp_scratch_init(&s, &l, MAXT), 0);
        for (i = 0; i < 3; i++) {
            ca[i] = (gang_tp_kv_cache){.k = ka[i], .v = va[i], .cap = CAP};
            cb[i] = (gang_tp_kv_cache){.k = kb[i], .v = vb[i], .cap = CAP};
            pb[i] = &cb[i];
        }
        for (step = 0; step < 2; step++) {
            fill(x, MAXT * HIDDEN, 1.0f, 0.0f);
            memcpy(xb, x, sizeof(x));
            for (i = 0, off = 0; i < 3; i++) {
                gang_tp_kv_cache *one[1] = {&ca[i]};

                /* A lone sequence is a batch of one (it writes straight into its cache). */
                assert_int_equal(gang_tp_layer_forward_batch(&l, k, NULL, x + off * HIDDEN, 1,
                                                             &lens[step][i], &poss[step][i], one,
                                                             &s, STEP_TIMEOUT_MS),
                                 0);
                off += lens[step][i];
            }
            assert_int_equal(gang_tp_layer_forward_batch(&l, k, NULL, xb, 3, lens[step], poss[step],
                                                         pb, &s, STEP_TIMEOUT_MS),
                             0);
            assert_true(rel_err_ff(xb, x, off * HIDDEN) <= 1e-5);
            for (i = 0; i < 3; i++) {
                size_t rows = poss[step][i] + lens[step][i];

                assert_true(rel_err_ff(kb[i], ka[i], rows * KV_DIM) <= 1e-6);
                assert_true(rel_err_ff(vb[i], va[i], rows * KV_DIM) <= 1e-6);
            }
        }
        /* Refused: no sequence, more tokens than the scratch, a sequence past its cache. */
        assert_int_equal(
            gang_tp_layer_forward_batch(&l, k, NULL, xb, 0, len1, pos1, pb, &s, STEP_TIMEOUT_MS),
            GANG_EINVAL);
        bad_len[1] = 13;
        assert_int_equal(
            gang_tp_layer_forward_batch(&l, k, NULL, xb, 3, bad_len, pos1, pb, &s, STEP_TIMEOUT_MS),
            GANG_EINVAL);
        bad_len[1] = 2;
        assert_int_equal(
            gang_tp_layer_forward_batch(&l, k, NULL, xb, 3, bad_len, pos2, pb, &s, STEP_TIMEOUT_MS),
            0);
        bad_len[0] = CAP;
        assert_int_equal(
            gang_tp_layer_forward_batch(&l, k, NULL, xb, 1, bad_len, pos2, pb, &s, STEP_TIMEOUT_MS),
            GANG_EINVAL);
        gang_tp_scratch_free(&s);
        gang_tp_layer_free(&l);
        free(fm);
    }
    gang_kernels_close(k);
}

/* ---------------------------------------------------------------------------------
 * Tests: single-rank numerics
 * --------------------------------------------------------------------------------- */

/* Steps e until plan sequence 0 samples; returns its logits. */
static const float *step_until_logits(gang_engine *e, gang_kernels *k)
{
    const float *lg = NULL;
    int i;

    for (i = 0; i < 8 && lg == NULL; i++) {
        assert_int_equal(gang_engine_step(e, k, NULL, NULL, NULL, NULL, STEP_TIMEOUT_MS), 0);
        lg = gang__engine_logits(e, 0);
    }
    assert_non_null(lg);
    return lg;
}

/*
 * (a) The engine's single-rank logits of the last prompt position equal the naive
 * reference within 1e-4 (a 7-token prompt, prefilled in chunks of 6 + 1), for a Llama
 * model with GQA and a Qwen2-like model with q/k/v biases.
 */
static void test_logits_match_reference(void **state)
{
    gang_engine_config cfg = engine_config(1);
    gang_kernels *k = NULL;
    double ref[VOCAB];
    char err[256];
    int with_bias;

    (void)state;
    assert_int_equal(gang_kernels_open("cpu", &k), 0);
    for (with_bias = 0; with_bias < 2; with_bias++) {
        full_model *fm = full_model_new(7, with_bias);
        gang_model *m = shard_new(fm, 1, 1, 0);
        gang_engine *e = NULL;
        script_req sr;
        gang_gen_request r;
        double err_rel;

        assert_int_equal(gang_engine_init(m, &cfg, &e, err, sizeof(err)), 0);
        memset(&sr, 0, sizeof(sr));
        sr.id = 1;
        sr.n_prompt = 7;
        sr.max_tokens = 1;
        sr.sp = greedy;
        for (uint32_t i = 0; i < 7; i++)
            sr.prompt[i] = (int32_t)((i * 5 + 3) % VOCAB);
        r = req_of(&sr);
        assert_int_equal(gang_engine_submit(e, &r, err, sizeof(err)), 0);
        ref_logits(fm, sr.prompt, 7, ref);
        err_rel = rel_err_fd(step_until_logits(e, k), ref, VOCAB);
        if (!(err_rel <= REL_TOL))
            fail_msg("bias=%d: relative error %g against the naive reference", with_bias, err_rel);
        gang_engine_free(e);
        shard_free(m);
        free(fm);
    }
    gang_kernels_close(k);
}

/*
 * (b) Decoding with the KV cache equals re-running the whole prefix: the logits of every
 * decode step of a greedy request equal those of a fresh request whose prompt is the
 * prompt plus the tokens generated so far (and the naive reference).
 */
static void test_decode_equals_prefix(void **state)
{
    enum { GEN = 5, PROMPT = 5 };
    gang_engine_config cfg = engine_config(1);
    full_model *fm = full_model_new(11, 0);
    gang_model *m = shard_new(fm, 1, 1, 0);
    gang_engine *e = NULL;
    gang_kernels *k = NULL;
    float got[GEN][VOCAB];
    int32_t gen[GEN];
    script_req sr;
    gang_gen_request r;
    gang_gen_event ev;
    double ref[VOCAB];
    char err[256];
    uint32_t i;

    (void)state;
    assert_int_equal(gang_kernels_open("cpu", &k), 0);
    assert_int_equal(gang_engine_init(m, &cfg, &e, err, sizeof(err)), 0);
    memset(&sr, 0, sizeof(sr));
    sr.id = 1;
    sr.n_prompt = PROMPT;
    sr.max_tokens = GEN;
    sr.sp = greedy;
    for (i = 0; i < PROMPT; i++)
        sr.prompt[i] = (int32_t)((i * 11 + 2) % VOCAB);
    r = req_of(&sr);
    assert_int_equal(gang_engine_submit(e, &r, err, sizeof(err)), 0);
    for (i = 0; i < GEN; i++) {
        memcpy(got[i], step_until_logits(e, k), sizeof(got[i]));
        assert_int_equal(gang_engine_poll(e, &ev), 1);
        assert_int_equal(ev.kind, GANG_GEN_TOKEN);
        assert_int_equal(ev.index, i);
        gen[i] = ev.token;
    }
    assert_int_equal(gang_engine_poll(e, &ev), 1);
    assert_int_equal(ev.kind, GANG_GEN_DONE);
    assert_string_equal(ev.finish, "length");
    assert_int_equal(gang_engine_pending(e), 0);

    for (i = 0; i < GEN; i++) {
        double rel;

        memset(&sr, 0, sizeof(sr));
        sr.id = 100 + i;
        sr.n_prompt = PROMPT + i;
        sr.max_tokens = 1;
        sr.sp = greedy;
        for (uint32_t j = 0; j < PROMPT; j++)
            sr.prompt[j] = (int32_t)((j * 11 + 2) % VOCAB);
        memcpy(sr.prompt + PROMPT, gen, i * sizeof(int32_t));
        r = req_of(&sr);
        gang_engine_reset(e);
        assert_int_equal(gang_engine_submit(e, &r, err, sizeof(err)), 0);
        rel = rel_err_ff(step_until_logits(e, k), got[i], VOCAB);
        if (!(rel <= 1e-5))
            fail_msg("decode step %u: relative error %g against the re-run prefix", i, rel);
        ref_logits(fm, sr.prompt, sr.n_prompt, ref);
        assert_true(rel_err_fd(got[i], ref, VOCAB) <= REL_TOL);
        assert_int_equal(gen[i], ref_argmax(ref, VOCAB));
    }
    gang_engine_free(e);
    shard_free(m);
    free(fm);
    gang_kernels_close(k);
}

/* ---------------------------------------------------------------------------------
 * Tests: layouts, continuous batching, sampling
 * --------------------------------------------------------------------------------- */

/*
 * (c) + (d) The script's tokens for TP x PP in {1x1, 2x1, 1x2, 2x2}, 1 and 2
 * microbatches, equal the naive reference's (greedy requests: its argmax; seeded ones:
 * its logits through the sampler at the same positions), and equal each request run
 * alone on one rank: batching, chunking and the layout change nothing.
 */
/*
 * Preemption: a pool of 8 blocks of 4 positions (the context of 24 needs 6) under the
 * eight-request script, whose sequences need 2 to 4 blocks each and up to 8 run at once.
 * Blocks run out as they grow, the youngest are preempted and recomputed, and every
 * request still gives exactly the tokens of the reference (which the uncontended runs of
 * test_layouts_and_batching give too), on one rank, on a pool limited to 6 blocks, and
 * on a 2 x 2 gang (the tables travel in the plans). At the end every block is free.
 */
static void test_preemption(void **state)
{
    static rank_ctx xs[MAX_RANKS];
    static script sc;
    static script_out exp[MAX_REQS];
    gang_engine_config cfg = engine_config(1);
    full_model *fm = full_model_new(21, 0);
    gang_model *m;
    gang_engine *e = NULL;
    gang_engine_kv kv;
    layout lo;
    char err[256];
    uint32_t r;

    (void)state;
    make_script(fm, &sc);
    expected_outputs(fm, &sc, exp);
    sc.steps = 200;
    cfg.max_batch = 8;
    cfg.max_ctx = 24;
    cfg.block_size = 4;
    cfg.max_step_tokens = 16;
    cfg.kv_cache_bytes = 8 * (3 * 2 * 4 * N_KV_HEADS * HEAD_DIM * 4);

    m = shard_new(fm, 1, 1, 0);
    assert_int_equal(gang_engine_init(m, &cfg, &e, err, sizeof(err)), 0);
    assert_int_equal(gang_engine_kv_info(e, &kv), 0);
    assert_int_equal(kv.blocks, 8);
    script_run_local(e, &sc);
    check_script(&sc, exp, "preempted, 1x1");
    assert_int_equal(gang_engine_kv_info(e, &kv), 0);
    assert_true(kv.preempted > 0);
    assert_int_equal(kv.free_blocks, 8);
    /* A smaller agreed pool: the same tokens again, with more preemptions. */
    assert_int_equal(gang_engine_limit_blocks(e, 5), GANG_EINVAL); /* < one context (6) */
    assert_int_equal(gang_engine_limit_blocks(e, 6), 0);
    uint64_t before = kv.preempted;
    script_run_local(e, &sc);
    check_script(&sc, exp, "preempted, 6 blocks");
    assert_int_equal(gang_engine_kv_info(e, &kv), 0);
    assert_int_equal(kv.blocks, 6);
    assert_int_equal(kv.free_blocks, 6);
    assert_true(kv.preempted > before);
    gang_engine_free(e);
    shard_free(m);

    /* 2 x 2: a block holds 2 layers (the larger stage) of 1 kv head: 8 blocks again. */
    cfg.kv_cache_bytes = 8 * (2 * 2 * 4 * (N_KV_HEADS / 2) * HEAD_DIM * 4);
    layout_init(&lo, fm, 2, 2, &cfg);
    assert_int_equal(gang_engine_kv_info(lo.engines[3], &kv), 0);
    assert_int_equal(kv.blocks, 8);
    run_gang(2, 2, lo.engines, &sc, script_body, NULL, xs);
    for (r = 0; r < lo.n; r++)
        if (xs[r].body_rc != 0)
            fail_msg("2x2: rank %u: %s", r, gang_err_name(xs[r].body_rc));
    check_script(&sc, exp, "preempted, 2x2");
    assert_int_equal(gang_engine_kv_info(lo.engines[0], &kv), 0);
    assert_true(kv.preempted > 0);
    layout_free(&lo);
    free(fm);
}

/*
 * A bf16 or f16 KV cache (--kv-cache-dtype): half the bytes per block (twice the blocks
 * in the same budget), and the logits of a prefill and of the decodes after it stay
 * within the documented tolerance of the f32 cache (bf16: 1e-2, f16: 1e-3 of the largest
 * |logit|) while differing from them (the rows really are rounded). Greedy tokens are
 * not required to agree; the eight-request script still completes.
 */
static void test_kv_dtype(void **state)
{
    static script sc;
    const gang_dtype dts[2] = {GANG_DTYPE_BF16, GANG_DTYPE_F16};
    const double tol[2] = {1e-2, 1e-3};
    gang_engine_config cfg = engine_config(1);
    full_model *fm = full_model_new(21, 0);
    gang_model *m = shard_new(fm, 1, 1, 0);
    gang_engine *ef = NULL, *eh = NULL;
    gang_engine_kv kf, kh;
    gang_kernels *k = NULL;
    char err[256];

    (void)state;
    assert_int_equal(gang_kernels_open("cpu", &k), 0);
    cfg.kv_cache_bytes = 4 * (3 * 2 * 16 * N_KV_HEADS * HEAD_DIM * 4); /* 4 f32 blocks */
    cfg.max_step_tokens = 16; /* the prompt in one step: every step samples */
    assert_int_equal(gang_engine_init(m, &cfg, &ef, err, sizeof(err)), 0);
    assert_int_equal(gang_engine_kv_info(ef, &kf), 0);
    {
        gang_engine_config bad = cfg;

        bad.kv_dtype = GANG_DTYPE_I32;
        assert_int_equal(gang_engine_init(m, &bad, &eh, err, sizeof(err)), GANG_EINVAL);
        assert_null(eh);
    }
    for (int d = 0; d < 2; d++) {
        gang_engine_config ch = cfg;
        int32_t prompt[13];
        double max_ref = 0.0, max_diff = 0.0;

        ch.kv_dtype = dts[d];
        assert_int_equal(gang_engine_init(m, &ch, &eh, err, sizeof(err)), 0);
        assert_int_equal(gang_engine_kv_info(eh, &kh), 0);
        assert_int_equal(kh.blocks, 2 * kf.blocks);
        assert_int_equal(kh.dtype, dts[d]);
        for (uint32_t i = 0; i < 13; i++)
            prompt[i] = (int32_t)((i * 7 + 3) % VOCAB);
        gang_gen_request r = {
            .id = 1, .prompt = prompt, .n_prompt = 13, .max_tokens = 4, .sampling = greedy};
        r.sampling.ignore_eos = 1;
        assert_int_equal(gang_engine_submit(ef, &r, err, sizeof(err)), 0);
        assert_int_equal(gang_engine_submit(eh, &r, err, sizeof(err)), 0);
        for (int step = 0; step < 4; step++) {
            gang_gen_event ev;

            assert_int_equal(gang_engine_step(ef, k, NULL, NULL, NULL, NULL, STEP_TIMEOUT_MS), 0);
            assert_int_equal(gang_engine_step(eh, k, NULL, NULL, NULL, NULL, STEP_TIMEOUT_MS), 0);
            const float *lf = gang__engine_logits(ef, 0), *lh = gang__engine_logits(eh, 0);
            assert_non_null(lf);
            assert_non_null(lh);
            for (uint32_t v = 0; v < VOCAB; v++) {
                double diff = fabs((double)lf[v] - (double)lh[v]);
                max_ref = fabs((double)lf[v]) > max_ref ? fabs((double)lf[v]) : max_ref;
                max_diff = diff > max_diff ? diff : max_diff;
            }
            while (gang_engine_poll(ef, &ev) == 1 || gang_engine_poll(eh, &ev) == 1)
                ;
        }
        print_message("%s KV cache: logits within %.2e of the f32 cache's (max |logit| %.3f)\n",
                      gang_dtype_name(dts[d]), max_diff, max_ref);
        assert_true(max_diff > 0.0);
        assert_true(max_diff <= tol[d] * max_ref);
        gang_engine_reset(ef);
        make_script(fm, &sc);
        sc.steps = 80;
        script_run_local(eh, &sc);
        for (uint32_t i = 0; i < sc.n_reqs; i++)
            assert_true(sc.out[i].done && !sc.out[i].bad);
        gang_engine_free(eh);
        eh = NULL;
    }
    gang_engine_free(ef);
    gang_kernels_close(k);
    shard_free(m);
    free(fm);
}

/*
 * Prefix caching: a request whose prompt shares its first 12 tokens (3 blocks of 4) with
 * a finished one reuses those blocks (12 hit tokens, reported in its DONE event) and
 * still gives the reference tokens; one that shares only 11 reuses 2 blocks; with
 * caching off nothing is reused. The eight-request script under preemption with caching
 * on (blocks released to the LRU list, evicted as the pool runs short) still gives the
 * reference tokens.
 */
static void test_prefix_cache(void **state)
{
    static script sc, one;
    static script_out exp[MAX_REQS], e1;
    gang_engine_config cfg = engine_config(1);
    full_model *fm = full_model_new(21, 0);
    gang_model *m = shard_new(fm, 1, 1, 0);
    gang_engine *e = NULL;
    gang_engine_kv kv;
    char err[256];
    const uint32_t want_hits[3] = {12, 8, 0};

    (void)state;
    cfg.block_size = 4;
    cfg.max_step_tokens = 16;
    cfg.prefix_caching = 1;
    for (int c = 0; c < 3; c++) {
        if (c == 2)
            cfg.prefix_caching = 0;
        assert_int_equal(gang_engine_init(m, &cfg, &e, err, sizeof(err)), 0);
        memset(&one, 0, sizeof(one));
        add_req(&one, 1, 0, 14, 5, greedy);
        one.steps = 12;
        script_run_local(e, &one); /* fills the cache with its blocks */
        for (uint32_t i = 0; i < 14; i++)
            one.reqs[0].prompt[i] = (int32_t)((i * 5 + 1) % VOCAB);
        script_run_local(e, &one);
        assert_int_equal(gang_engine_kv_info(e, &kv), 0);
        uint64_t before = kv.prefix_hit_tokens;
        /* The same 12 (or 11) leading tokens, another tail. */
        one.reqs[0].id = 2;
        one.reqs[0].prompt[c == 1 ? 10 : 12] = (int32_t)((one.reqs[0].prompt[12] + 7) % VOCAB);
        one.reqs[0].prompt[13] = 3;
        ref_sampled(fm, &one.reqs[0], &e1);
        script_run_local(e, &one);
        check_script(&one, &e1, "prefix hit");
        assert_int_equal(gang_engine_kv_info(e, &kv), 0);
        assert_int_equal(kv.prefix_hit_tokens - before, want_hits[c]);
        if (c < 2)
            assert_true(kv.cached_blocks > 0);
        else
            assert_int_equal(kv.cached_blocks, 0);
        gang_engine_free(e);
        e = NULL;
    }

    make_script(fm, &sc);
    expected_outputs(fm, &sc, exp);
    sc.steps = 200;
    cfg.prefix_caching = 1;
    cfg.max_batch = 8;
    cfg.max_ctx = 24;
    cfg.kv_cache_bytes = 8 * (3 * 2 * 4 * N_KV_HEADS * HEAD_DIM * 4);
    assert_int_equal(gang_engine_init(m, &cfg, &e, err, sizeof(err)), 0);
    script_run_local(e, &sc);
    check_script(&sc, exp, "preempted, prefix caching");
    script_run_local(e, &sc); /* again: now prefixes are cached */
    check_script(&sc, exp, "preempted, prefix caching, second run");
    assert_int_equal(gang_engine_kv_info(e, &kv), 0);
    assert_true(kv.prefix_hit_tokens > 0);
    assert_int_equal(kv.free_blocks, 8);
    gang_engine_free(e);
    shard_free(m);
    free(fm);
}

static void test_layouts_and_batching(void **state)
{
    static const uint32_t lay[4][2] = {{1, 1}, {2, 1}, {1, 2}, {2, 2}};
    static script sc, alone;
    static script_out exp[MAX_REQS];
    gang_engine_config cfg = engine_config(1);
    full_model *fm = full_model_new(21, 0);
    gang_model *m;
    gang_engine *e = NULL;
    char err[256];
    uint32_t i, j;
    int differs = 0;

    (void)state;
    make_script(fm, &sc);
    expected_outputs(fm, &sc, exp);
    /* The sampled requests really sample: their tokens differ from greedy somewhere. */
    for (i = 0; i < sc.n_reqs; i++) {
        int32_t g[MAX_GEN];

        if (sc.reqs[i].sp.temperature == 0.0f || sc.reqs[i].sp.top_k == 1)
            continue;
        ref_greedy(fm, sc.reqs[i].prompt, sc.reqs[i].n_prompt, sc.reqs[i].max_tokens, g);
        for (j = 0; j < exp[i].n; j++)
            differs |= g[j] != exp[i].tokens[j];
    }
    assert_true(differs);

    /* Each request alone on one rank. */
    m = shard_new(fm, 1, 1, 0);
    assert_int_equal(gang_engine_init(m, &cfg, &e, err, sizeof(err)), 0);
    for (i = 0; i < sc.n_reqs; i++) {
        memset(&alone, 0, sizeof(alone));
        alone.reqs[0] = sc.reqs[i];
        alone.reqs[0].arrive = 0;
        alone.n_reqs = 1;
        alone.steps = 20;
        script_run_local(e, &alone);
        check_script(&alone, &exp[i], "alone");
    }
    /* All of them together, on one rank without communicators. */
    script_run_local(e, &sc);
    check_script(&sc, exp, "local");
    gang_engine_free(e);
    shard_free(m);

    for (i = 0; i < 4; i++)
        for (j = 1; j <= 2; j++)
            check_layout(fm, &sc, exp, lay[i][0], lay[i][1], j);
    free(fm);
}

/* One-pass greedy reference: the first strict maximum of the non-NaN values, 0 if none. */
static int32_t ref_argmax_f(const float *x, uint32_t n)
{
    int32_t best = -1;

    for (uint32_t i = 0; i < n; i++)
        if (!isnan(x[i]) && (best < 0 || x[i] > x[best]))
            best = (int32_t)i;
    return best < 0 ? 0 : best;
}

/* Greedy over rows with NaNs, infinities, +0 / -0 ties and repeated maxima at every
 * length up to VOCAB (the vector body and its tail): the one-pass reference's index. */
static void sampler_greedy_edges(gang__sampler *s, float *lg)
{
    const float pool[] = {NAN, -INFINITY, INFINITY, 0.0f, -0.0f, 1.0f, -1.0f, 2.5f, 2.5f};
    gang_sampling sp = {.temperature = 0.0f, .top_k = 0, .top_p = 1.0f, .seed = 1};
    uint32_t vocab = s->vocab, seed = 12345;

    for (uint32_t n = 1; n <= vocab; n++) {
        for (int trial = 0; trial < 8; trial++) {
            for (uint32_t i = 0; i < n; i++) {
                seed = seed * 1103515245u + 12345u;
                lg[i] = pool[(seed >> 16) % (trial < 4 ? 9u : 5u)]; /* some rows: no finite max */
            }
            s->vocab = n;
            if (gang__sample(s, lg, &sp, 0) != ref_argmax_f(lg, n))
                fail_msg("greedy over %u logits (trial %d): %d, reference %d", n, trial,
                         gang__sample(s, lg, &sp, 0), ref_argmax_f(lg, n));
        }
    }
    for (uint32_t i = 0; i < vocab; i++)
        lg[i] = NAN;
    s->vocab = vocab;
    assert_int_equal(gang__sample(s, lg, &sp, 0), 0); /* every logit NaN */
}

/*
 * (d) The sampler: the counter-based draws are in [0, 1), depend on (seed, position)
 * only; temperature 0 and top_k 1 are the argmax (lowest index on ties); top_k bounds the
 * candidates; a tiny top_p leaves only the argmax; a flat distribution really spreads.
 */
static void test_sampler(void **state)
{
    gang__sampler s;
    float lg[VOCAB];
    gang_sampling sp;
    uint32_t i, hits[VOCAB] = {0}, distinct = 0;
    double u;

    (void)state;
    assert_int_equal(gang__sampler_init(&s, VOCAB), 0);
    for (i = 0; i < 1000; i++) {
        u = gang__sample_uniform(42, i);
        assert_true(u >= 0.0 && u < 1.0);
        assert_true(u == gang__sample_uniform(42, i));
    }
    assert_true(gang__sample_uniform(42, 7) != gang__sample_uniform(43, 7));
    assert_true(gang__sample_uniform(42, 7) != gang__sample_uniform(42, 8));

    for (i = 0; i < VOCAB; i++)
        lg[i] = (float)((i * 17) % VOCAB) / VOCAB;
    lg[20] = 5.0f;
    lg[30] = 5.0f; /* a tie: the lower index wins */
    sp = (gang_sampling){.temperature = 0.0f, .top_k = 0, .top_p = 1.0f, .seed = 1};
    assert_int_equal(gang__sample(&s, lg, &sp, 3), 20);
    sp.temperature = 2.0f;
    sp.top_k = 1;
    assert_int_equal(gang__sample(&s, lg, &sp, 3), 20);
    sp.top_k = 0;
    sp.top_p = 0.01f;
    assert_int_equal(gang__sample(&s, lg, &sp, 3), 20);
    sampler_greedy_edges(&s, lg);

    /* Flat logits at a high temperature: many tokens, all within top_k when it is set. */
    for (i = 0; i < VOCAB; i++)
        lg[i] = 0.01f * (float)i;
    sp = (gang_sampling){.temperature = 1.0f, .top_k = 0, .top_p = 1.0f, .seed = 77};
    for (i = 0; i < 400; i++) {
        int32_t t = gang__sample(&s, lg, &sp, i);

        assert_true(t >= 0 && t < VOCAB);
        assert_int_equal(t, gang__sample(&s, lg, &sp, i)); /* deterministic */
        hits[t]++;
    }
    for (i = 0; i < VOCAB; i++)
        distinct += hits[i] > 0;
    assert_true(distinct > VOCAB / 2);
    sp.top_k = 3;
    for (i = 0; i < 200; i++) {
        int32_t t = gang__sample(&s, lg, &sp, i);

        assert_true(t >= VOCAB - 3);
    }
    gang__sampler_free(&s);
}

/* ---------------------------------------------------------------------------------
 * Tests: validation
 * --------------------------------------------------------------------------------- */

/* (e) Submit refuses bad requests and changes nothing; a KV budget below a slot is ENOMEM. */
/*
 * The shared set-up (gang_engine_setup_init, what the workers and `bench decode` call):
 * the config it reports is the one the engine runs (the weights' cache type for auto,
 * the explicit type otherwise, the budget given or sized from free memory), and a budget
 * below one sequence is refused with the engine's error and message, leaving no engine.
 */
static void test_engine_setup(void **state)
{
    full_model *fm = full_model_new(5, 0);
    gang_model *m = shard_new(fm, 1, 1, 0);
    gang_engine_setup s = {.max_batch = 2,
                           .max_ctx = MAX_POS,
                           .microbatches = 1,
                           .max_step_tokens = 16,
                           .kv_cache_bytes = 1u << 20,
                           .kv_dtype_auto = 1,
                           .ranks_per_host = 1};
    gang_engine_config used;
    gang_engine_kv kv;
    gang_engine *e = NULL;
    gang_kernels *k = NULL;
    char err[256] = "";

    (void)state;
    assert_int_equal(gang_kernels_open("cpu", &k), 0);
    assert_int_equal(gang_engine_setup_init(&s, m, k, &e, &used, err, sizeof(err)), 0);
    assert_int_equal(used.kv_dtype, gang_engine_kv_dtype_auto(m->wtype));
    assert_int_equal(used.kv_cache_bytes, 1u << 20);
    assert_int_equal(used.max_batch, 2);
    assert_int_equal(used.max_ctx, MAX_POS);
    assert_int_equal(gang_engine_kv_info(e, &kv), 0);
    assert_int_equal(kv.dtype, used.kv_dtype);
    gang_engine_free(e);
    e = NULL;

    s.kv_cache_bytes = 0; /* sized from the host's free memory */
    s.kv_dtype_auto = 0;
    s.kv_dtype = GANG_DTYPE_F16;
    assert_int_equal(gang_engine_setup_init(&s, m, k, &e, &used, err, sizeof(err)), 0);
    assert_true(used.kv_cache_bytes > 0);
    assert_int_equal(gang_engine_kv_info(e, &kv), 0);
    assert_int_equal(kv.dtype, GANG_DTYPE_F16);
    gang_engine_free(e);
    e = NULL;

    s.kv_cache_bytes = 1; /* less than one block */
    assert_int_equal(gang_engine_setup_init(&s, m, k, &e, &used, err, sizeof(err)), GANG_ENOMEM);
    assert_null(e);
    assert_true(err[0] != '\0');
    gang_kernels_close(k);
    shard_free(m);
    free(fm);
}

static void test_validation(void **state)
{
    gang_engine_config cfg = engine_config(1);
    full_model *fm = full_model_new(5, 0);
    gang_model *m = shard_new(fm, 1, 1, 0), *m2;
    gang_engine *e = NULL;
    int32_t prompt[4] = {1, 2, 3, 4};
    gang_gen_request r;
    char err[256];

    (void)state;
    assert_int_equal(gang_engine_init(m, &cfg, &e, err, sizeof(err)), 0);
    assert_int_equal(gang_engine_max_ctx(e), 40);
    memset(&r, 0, sizeof(r));
    r.id = 1;
    r.prompt = prompt;
    r.n_prompt = 4;
    r.max_tokens = 3;
    r.sampling = greedy;
    assert_int_equal(gang_engine_submit(e, &r, err, sizeof(err)), 0);
    assert_int_equal(gang_engine_pending(e), 1);

    r.id = 2;
    r.n_prompt = 0;
    assert_int_equal(gang_engine_submit(e, &r, err, sizeof(err)), GANG_EINVAL);
    assert_non_null(strstr(err, "empty prompt"));
    r.n_prompt = 4;
    prompt[2] = VOCAB;
    assert_int_equal(gang_engine_submit(e, &r, err, sizeof(err)), GANG_EINVAL);
    assert_non_null(strstr(err, "vocabulary"));
    prompt[2] = -1;
    assert_int_equal(gang_engine_submit(e, &r, err, sizeof(err)), GANG_EINVAL);
    prompt[2] = 3;
    r.max_tokens = 0;
    assert_int_equal(gang_engine_submit(e, &r, err, sizeof(err)), GANG_EINVAL);
    assert_non_null(strstr(err, "max_tokens"));
    r.max_tokens = 37; /* 4 + 37 > 40 */
    assert_int_equal(gang_engine_submit(e, &r, err, sizeof(err)), GANG_EINVAL);
    assert_non_null(strstr(err, "context"));
    r.max_tokens = 36; /* exactly the context */
    r.id = 1;
    assert_int_equal(gang_engine_submit(e, &r, err, sizeof(err)), GANG_EINVAL);
    assert_non_null(strstr(err, "duplicate"));
    r.id = 2;
    r.sampling.n_stop = GANG_MAX_STOP_TOKENS + 1;
    assert_int_equal(gang_engine_submit(e, &r, err, sizeof(err)), GANG_EINVAL);
    r.sampling.n_stop = 0;
    r.sampling.top_p = 0.0f;
    assert_int_equal(gang_engine_submit(e, &r, err, sizeof(err)), GANG_EINVAL);
    r.sampling.top_p = 1.0f;
    r.sampling.temperature = -1.0f;
    assert_int_equal(gang_engine_submit(e, &r, err, sizeof(err)), GANG_EINVAL);
    r.sampling.temperature = 0.0f;
    assert_int_equal(gang_engine_pending(e), 1); /* nothing changed */
    assert_int_equal(gang_engine_submit(e, &r, err, sizeof(err)), 0);
    assert_int_equal(gang_engine_pending(e), 2);
    gang_engine_reset(e);
    assert_int_equal(gang_engine_pending(e), 0);
    gang_engine_free(e);

    /* The context is capped at max_pos; bad configs are refused. */
    cfg.max_ctx = 1000;
    assert_int_equal(gang_engine_init(m, &cfg, &e, err, sizeof(err)), 0);
    assert_int_equal(gang_engine_max_ctx(e), MAX_POS);
    gang_engine_free(e);
    cfg = engine_config(1);
    cfg.max_ctx = 1;
    assert_int_equal(gang_engine_init(m, &cfg, &e, err, sizeof(err)), GANG_EINVAL);
    assert_null(e);
    cfg = engine_config(1);
    cfg.microbatches = 0;
    assert_int_equal(gang_engine_init(m, &cfg, &e, err, sizeof(err)), GANG_EINVAL);

    /*
     * One block of 3 layers x 2 x 16 positions x 2 kv heads x 8 x 4 bytes = 6144 bytes;
     * the pool must hold one sequence of the context, 3 blocks for 40 positions.
     */
    cfg = engine_config(1);
    cfg.kv_cache_bytes = 3 * 6144 - 1;
    assert_int_equal(gang_engine_init(m, &cfg, &e, err, sizeof(err)), GANG_ENOMEM);
    assert_null(e);
    assert_non_null(strstr(err, "3 blocks of 6144 bytes"));
    cfg.kv_cache_bytes = 5 * 6144 + 100;
    assert_int_equal(gang_engine_init(m, &cfg, &e, err, sizeof(err)), 0);
    {
        gang_engine_kv kv;

        assert_int_equal(gang_engine_kv_info(e, &kv), 0);
        assert_int_equal(kv.blocks, 5);
        assert_int_equal(kv.block_size, 16);
        assert_int_equal(kv.tokens, 80);
        assert_int_equal(kv.full_seqs, 1);
        assert_int_equal(kv.free_blocks, 5);
        assert_int_equal(gang_engine_kv_info(NULL, &kv), GANG_EINVAL);
    }
    /* Slots are max_batch, no longer bounded by whole contexts. */
    assert_int_equal(gang_engine_slots(e), 3);
    gang_engine_free(e);
    /*
     * On a 1 x 2 gang the largest stage holds 2 of the 3 layers: every rank, even the
     * 1-layer stage, sizes its blocks by 2 layers (4096 bytes), so all agree.
     */
    cfg.kv_cache_bytes = 7 * 4096;
    m2 = shard_new(fm, 1, 2, 1);
    assert_int_equal(m2->layer_count, 1);
    assert_int_equal(gang_engine_init(m2, &cfg, &e, err, sizeof(err)), 0);
    {
        gang_engine_kv kv;

        assert_int_equal(gang_engine_kv_info(e, &kv), 0);
        assert_int_equal(kv.blocks, 7);
        assert_int_equal(kv.free_blocks, 0); /* not rank 0: no allocator */
    }
    /* A step of a 2-rank gang without its communicators is refused. */
    {
        gang_kernels *k = NULL;

        assert_int_equal(gang_kernels_open("cpu", &k), 0);
        assert_int_equal(gang_engine_step(e, k, NULL, NULL, NULL, NULL, 1000), GANG_EINVAL);
        gang_kernels_close(k);
    }
    gang_engine_free(e);
    shard_free(m2);
    shard_free(m);
    free(fm);
}

int test_plan_decode_one(gang_engine *e, const gang__plan_seq *s, const int32_t *tokens,
                         const int32_t *table, const gang__plan_hdr *hdr);

/* Encodes header h into hdr[GANG__PLAN_HDR_WORDS] with the wire's own description. */
static void plan_hdr_put(int32_t *hdr, gang__plan_hdr h)
{
    gang_codec c;

    gang_codec_encoder(&c, hdr, GANG__PLAN_HDR_WORDS * sizeof(int32_t));
    gang__plan_hdr_fields(&c, &h);
    assert_int_equal(gang_codec_finish(&c, NULL), 0);
}

/*
 * Writes a one-sequence plan (entry s, its tokens, its block table) into e->plan_buf with
 * the wire encoder, replaces the header by *hdr when hdr is not NULL, and returns what
 * the receiving side's decoder says.
 */
int test_plan_decode_one(gang_engine *e, const gang__plan_seq *s, const int32_t *tokens,
                         const int32_t *table, const gang__plan_hdr *hdr)
{
    gang__plan_seq seq = *s;
    int32_t toks[16], tables[16] = {0};
    gang__plan p = {.n_seq = 1, .n_tokens = s->n, .seqs = &seq, .tokens = toks};
    uint32_t body = 0;

    assert_true(s->n <= 16 && e->max_bps <= 16);
    memcpy(toks, tokens, s->n * sizeof(int32_t));
    memcpy(tables, table, e->max_bps * sizeof(int32_t));
    assert_int_equal(gang__plan_write(e, &p, tables, e->plan_buf, &body), 0);
    if (hdr != NULL)
        plan_hdr_put(e->plan_buf, *hdr);
    return gang__plan_decode(e);
}

/*
 * The request messages' codec (engine-request.c): the sampling travels whole and in the
 * v2 forwarding's byte order, the largest message fits GANG_REQ_WIRE_MAX, and what a
 * receiver must refuse is refused (bounds, a SUBMIT with more ids than its prompt, an
 * unknown kind, every truncation).
 */
static void test_request_codec(void **state)
{
    static gang_req_msg in, out;
    static uint8_t buf[GANG_REQ_WIRE_MAX + 16];
    gang_codec c;
    size_t len = 0;

    (void)state;
    memset(&in, 0, sizeof(in));
    in.id = 42;
    in.n_prompt = in.n_ids = GANG_REQ_MAX_IDS;
    in.max_tokens = 9;
    in.sampling = (gang_sampling){.top_k = 0x01020304u,
                                  .temperature = 0.5f,
                                  .top_p = 0.25f,
                                  .seed = 7,
                                  .repetition_penalty = 1.5f,
                                  .ignore_eos = 1,
                                  .logprobs = 1,
                                  .top_logprobs = 3,
                                  .n_stop = GANG_MAX_STOP_TOKENS};
    for (uint32_t i = 0; i < GANG_MAX_STOP_TOKENS; i++)
        in.sampling.stop[i] = (int32_t)(100 + i);
    for (uint32_t i = 0; i < in.n_ids; i++)
        in.ids[i] = (int32_t)i;
    /* The largest P/D import: the longest host, a layout of the most nodes. */
    in.kv = (gang_kv_xfer){.id = 5, .blocks = 3, .port = 29500};
    memset(in.kv.host, 'h', GANG_KV_HOST_MAX - 1);
    in.kv.src = (gang_kv_layout){
        .layers = 64, .pp = 32, .tp = 8, .n_nodes = GANG_KV_NODES_MAX, .ranks_per_node = 8};
    for (uint32_t i = 0; i < GANG_KV_NODES_MAX; i++)
        in.kv.src.node_addr[i] = 0x0100000au + (i << 24);
    gang_codec_encoder(&c, buf, sizeof(buf));
    gang_req_codec(&c, GANG_REQ_SUBMIT, &in);
    assert_int_equal(gang_codec_finish(&c, &len), 0);
    assert_true(len <= GANG_REQ_WIRE_MAX);
    /* id, n_prompt, max_tokens, then the sampling: top_k first, little-endian. */
    assert_memory_equal(buf + 16, "\x04\x03\x02\x01", 4);
    gang_codec_decoder(&c, buf, len);
    gang_req_codec(&c, GANG_REQ_SUBMIT, &out);
    assert_int_equal(gang_codec_finish(&c, NULL), 0);
    assert_true(out.id == 42 && out.max_tokens == 9 && out.n_ids == GANG_REQ_MAX_IDS);
    assert_true(out.sampling.top_k == in.sampling.top_k && out.sampling.seed == 7);
    assert_true(out.sampling.top_p == 0.25f && out.sampling.repetition_penalty == 1.5f);
    assert_int_equal(out.sampling.top_logprobs, 3);
    assert_memory_equal(out.sampling.stop, in.sampling.stop, sizeof(in.sampling.stop));
    assert_memory_equal(out.ids, in.ids, in.n_ids * sizeof(int32_t));
    assert_true(out.kv.id == 5 && out.kv.blocks == 3 && out.kv.port == 29500);
    assert_string_equal(out.kv.host, in.kv.host);
    assert_memory_equal(&out.kv.src, &in.kv.src, sizeof(in.kv.src)); /* (u32 only) */
    for (size_t cut = 0; cut < len; cut += 97) {
        gang_codec_decoder(&c, buf, cut);
        gang_req_codec(&c, GANG_REQ_SUBMIT, &out);
        assert_int_equal(gang_codec_finish(&c, NULL), GANG_EPROTO);
    }
    /* A SUBMIT with more ids than its prompt, an unknown kind, top_logprobs over 20. */
    in.n_prompt = 5;
    gang_codec_encoder(&c, buf, sizeof(buf));
    gang_req_codec(&c, GANG_REQ_SUBMIT, &in);
    assert_int_equal(gang_codec_finish(&c, NULL), GANG_EINVAL);
    gang_codec_decoder(&c, buf, len);
    gang_req_codec(&c, 99, &out);
    assert_int_equal(gang_codec_finish(&c, NULL), GANG_EPROTO);
    in.n_prompt = in.n_ids;
    in.sampling.top_logprobs = GANG_MAX_TOP_LOGPROBS + 1;
    gang_codec_encoder(&c, buf, sizeof(buf));
    gang_sampling_codec(&c, &in.sampling);
    assert_int_equal(gang_codec_finish(&c, NULL), GANG_EINVAL);
}

/* A plan that does not fit this rank's bounds is GANG_EPROTO. */
static void test_plan_validation(void **state)
{
    gang_engine_config cfg = engine_config(1);
    full_model *fm = full_model_new(5, 0);
    gang_model *m = shard_new(fm, 1, 1, 0);
    gang_engine *e = NULL;
    int32_t hdr[GANG__PLAN_HDR_WORDS];
    uint32_t body;
    char err[256];
    /* one sequence of 2 tokens without stops; one block covers positions 0 .. 1; no
     * transfer (its kind byte) */
    gang__plan_hdr h = {GANG__PLAN_MAGIC, 1, 2, 1, GANG__PLAN_SEQ_MIN_BYTES + 12 + 1}, bad;

    (void)state;
    assert_int_equal(gang_engine_init(m, &cfg, &e, err, sizeof(err)), 0);
    plan_hdr_put(hdr, h);
    assert_int_equal(gang__plan_check_header(e, hdr, &body), 0);
    assert_int_equal(body, (GANG__PLAN_SEQ_MIN_BYTES + 12 + 1 + 3) / 4);
    bad = h;
    bad.n_seq = 4; /* more sequences than slots */
    bad.body_bytes = 4 * GANG__PLAN_SEQ_MIN_BYTES + 12;
    plan_hdr_put(hdr, bad);
    assert_int_equal(gang__plan_check_header(e, hdr, &body), GANG_EPROTO);
    bad = h;
    bad.n_tokens = 3 + 6 + 1; /* more tokens than slots + max_step_tokens */
    bad.body_bytes = GANG__PLAN_SEQ_MIN_BYTES + 44;
    plan_hdr_put(hdr, bad);
    assert_int_equal(gang__plan_check_header(e, hdr, &body), GANG_EPROTO);
    bad = h;
    bad.n_table = 4; /* more table entries than one sequence of the context has (3) */
    bad.body_bytes = GANG__PLAN_SEQ_MIN_BYTES + 24;
    plan_hdr_put(hdr, bad);
    assert_int_equal(gang__plan_check_header(e, hdr, &body), GANG_EPROTO);
    bad = h;
    bad.body_bytes = 5; /* a body smaller than its counts need */
    plan_hdr_put(hdr, bad);
    assert_int_equal(gang__plan_check_header(e, hdr, &body), GANG_EPROTO);
    /* larger than its largest entry and the largest transfer */
    bad.body_bytes = GANG__PLAN_SEQ_MAX_BYTES + 12 + GANG__PLAN_KV_MAX_BYTES(e->max_bps) + 1;
    plan_hdr_put(hdr, bad);
    assert_int_equal(gang__plan_check_header(e, hdr, &body), GANG_EPROTO);
    bad.body_bytes = GANG__PLAN_SEQ_MAX_BYTES + 12 + GANG__PLAN_KV_MAX_BYTES(e->max_bps);
    plan_hdr_put(hdr, bad);
    assert_int_equal(gang__plan_check_header(e, hdr, &body), 0);
    bad = h;
    bad.magic = 0;
    plan_hdr_put(hdr, bad);
    assert_int_equal(gang__plan_check_header(e, hdr, &body), GANG_EPROTO);

    /* A body with a slot out of range, a position past the context, a bad token, a
     * block outside the pool, a table of another length than the header's. */
    {
        gang_engine_kv kv;
        gang__plan_seq s = {.slot = 0, .pos0 = 0, .n = 2, .sp = {.top_p = 1.0f}}, b2;
        int32_t ids[2] = {3, 4}, table[16] = {0};

        assert_int_equal(gang_engine_kv_info(e, &kv), 0);
        table[0] = (int32_t)kv.blocks - 1;
        assert_int_equal(test_plan_decode_one(e, &s, ids, table, NULL), 0);
        assert_int_equal(e->tables[0], (int32_t)kv.blocks - 1);
        assert_int_equal(e->plan.n_seq, 1);
        assert_memory_equal(e->plan.tokens, ids, sizeof(ids));
        b2 = s;
        b2.slot = 3;
        assert_int_equal(test_plan_decode_one(e, &b2, ids, table, NULL), GANG_EPROTO);
        b2 = s;
        b2.pos0 = 39;
        assert_int_equal(test_plan_decode_one(e, &b2, ids, table, NULL), GANG_EPROTO);
        table[0] = (int32_t)kv.blocks;
        assert_int_equal(test_plan_decode_one(e, &s, ids, table, NULL), GANG_EPROTO);
        table[0] = -1;
        assert_int_equal(test_plan_decode_one(e, &s, ids, table, NULL), GANG_EPROTO);
        table[0] = 0;
        /* A refused plan leaves the tables as they were. */
        assert_int_equal(e->tables[0], (int32_t)kv.blocks - 1);
        b2 = s;
        b2.pos0 = 15; /* positions 15 .. 16 span 2 blocks: a header saying 1 is short */
        table[1] = 1;
        assert_int_equal(test_plan_decode_one(e, &b2, ids, table, NULL), 0);
        assert_int_equal(test_plan_decode_one(e, &b2, ids, table, &h), GANG_EPROTO);
        bad = h;
        bad.n_table = 2; /* one entry more than the sequence has */
        bad.body_bytes += 4;
        assert_int_equal(test_plan_decode_one(e, &s, ids, table, &bad), GANG_EPROTO);
        ids[1] = VOCAB;
        assert_int_equal(test_plan_decode_one(e, &s, ids, table, NULL), GANG_EPROTO);
    }
    gang_engine_free(e);
    shard_free(m);
    free(fm);
}

/*
 * The plan's flags byte (bit 0 the P/D poll, bit 1 no graphs: rank 0's choice that every
 * rank follows) comes out as it went in, and an unknown bit is refused. Rank 0's encode
 * says no graphs once its graphs are off.
 */
static void test_plan_flags(void **state)
{
    gang_engine_config cfg = engine_config(1);
    full_model *fm = full_model_new(5, 0);
    gang_model *m = shard_new(fm, 1, 1, 0);
    gang_engine *e = NULL;
    gang__plan_seq seq = {
        .slot = 0, .pos0 = 0, .n = 2, .sample = 1, .n_prompt = 2, .sp = {.top_p = 1.0f}};
    int32_t toks[2] = {1, 2}, tables[16] = {0};
    const size_t hdr_bytes = GANG__PLAN_HDR_WORDS * sizeof(int32_t);
    uint32_t body = 0, f, hb[GANG__PLAN_HDR_WORDS];
    char err[256];

    (void)state;
    assert_int_equal(gang_engine_init(m, &cfg, &e, err, sizeof(err)), 0);
    for (f = 0; f < 4; f++) {
        gang__plan p = {.n_seq = 1,
                        .n_tokens = 2,
                        .seqs = &seq,
                        .tokens = toks,
                        .kv_poll = f & 1u,
                        .no_graphs = f >> 1};

        assert_int_equal(gang__plan_write(e, &p, tables, e->plan_buf, &body), 0);
        e->plan.kv_poll = e->plan.no_graphs = 7;
        assert_int_equal(gang__plan_decode(e), 0);
        assert_int_equal(e->plan.kv_poll, f & 1u);
        assert_int_equal(e->plan.no_graphs, f >> 1);
    }
    /* no transfer: the body ends with the flags byte and the transfer's kind byte */
    memcpy(hb, e->plan_buf, sizeof(hb));
    assert_int_equal(((uint8_t *)e->plan_buf)[hdr_bytes + hb[4] - 2], 3);
    ((uint8_t *)e->plan_buf)[hdr_bytes + hb[4] - 2] = 4;
    assert_int_equal(gang__plan_decode(e), GANG_EPROTO);
    /* rank 0 */
    e->plan.n_seq = e->plan.n_tokens = 0;
    e->graphs_off = 1;
    assert_int_not_equal(gang__plan_encode(e), 0);
    e->plan.no_graphs = 0;
    assert_int_equal(gang__plan_decode(e), 0);
    assert_int_equal(e->plan.no_graphs, 1);
    gang_engine_free(e);
    shard_free(m);
    free(fm);
}

/* An entry's size on the wire is within GANG__PLAN_SEQ_MIN_BYTES and _MAX_BYTES (no stop
 * ids, all of them): the header check and the buffer's size depend on it. */
static void test_plan_entry_size(void **state)
{
    gang_engine_config cfg = engine_config(1);
    full_model *fm = full_model_new(5, 0);
    gang_model *m = shard_new(fm, 1, 1, 0);
    gang_engine *e = NULL;
    char err[256];
    gang__plan_seq s = {.n = 1, .sp = {.top_p = 1.0f}};
    int32_t tok = 1, tables[16] = {0};
    gang__plan p = {.n_seq = 1, .n_tokens = 1, .seqs = &s, .tokens = &tok};
    uint32_t body = 0;

    (void)state;
    assert_int_equal(gang_engine_init(m, &cfg, &e, err, sizeof(err)), 0);
    assert_int_equal(gang__plan_write(e, &p, tables, e->plan_buf, &body), 0);
    assert_int_equal(body, (GANG__PLAN_SEQ_MIN_BYTES + 8 + 3) / 4);
    assert_int_equal(gang__plan_decode(e), 0);
    /* The largest entry: every stop id, every bias, the largest grammar (a schema padded
     * with spaces), which the sampling rank compiles for the entry's slot. */
    static char grammar[GANG_GRAMMAR_MAX_BYTES];
    memset(grammar, ' ', sizeof(grammar));
    grammar[0] = '{';
    grammar[sizeof(grammar) - 1] = '}';
    s.sp.n_stop = GANG_MAX_STOP_TOKENS;
    s.sp.n_bias = GANG_MAX_LOGIT_BIAS;
    s.sp.grammar_bytes = GANG_GRAMMAR_MAX_BYTES;
    s.sample = 1;
    s.n_prompt = 1;
    s.g_len = GANG_GRAMMAR_MAX_BYTES;
    s.g_text = grammar;
    assert_int_equal(gang__plan_write(e, &p, tables, e->plan_buf, &body), 0);
    assert_int_equal(body, (GANG__PLAN_SEQ_MAX_BYTES + 8 + 3) / 4);
    assert_int_equal(gang__plan_decode(e), 0);
    assert_int_equal(e->plan.seqs[0].sp.n_stop, GANG_MAX_STOP_TOKENS);
    assert_int_equal(e->plan.seqs[0].sp.n_bias, GANG_MAX_LOGIT_BIAS);
    assert_int_equal(e->plan.seqs[0].g_len, GANG_GRAMMAR_MAX_BYTES);
    assert_non_null(e->sampler.slot_g);
    assert_non_null(e->sampler.slot_g[0]);
    /* A grammar on an entry that does not sample, or of another length, is refused. */
    s.sample = 0;
    assert_int_equal(gang__plan_write(e, &p, tables, e->plan_buf, &body), 0);
    assert_int_equal(gang__plan_decode(e), GANG_EPROTO);
    s.sample = 1;
    s.sp.grammar_bytes = 10;
    assert_int_equal(gang__plan_write(e, &p, tables, e->plan_buf, &body), 0);
    assert_int_equal(gang__plan_decode(e), GANG_EPROTO);
    s.sp.grammar_bytes = 0;
    s.g_len = 0;
    s.sample = 0;
    s.n_prompt = 0;
    s.sp.n_bias = 0;
    s.sp.n_stop = GANG_MAX_STOP_TOKENS + 1; /* the writer refuses what no receiver takes */
    assert_int_equal(gang__plan_write(e, &p, tables, e->plan_buf, &body), GANG_EINVAL);
    s.sp.n_stop = 0;
    p.n_seq = 0;
    p.n_tokens = 0;
    assert_int_equal(gang__plan_write(e, &p, tables, e->plan_buf, &body), 0);
    assert_int_equal(body, 1); /* the transfer's kind byte, in one word */
    s.sp.logprobs = 1;
    s.sp.top_logprobs = GANG_MAX_TOP_LOGPROBS + 1;
    p.n_seq = p.n_tokens = 1;
    assert_int_equal(gang__plan_write(e, &p, tables, e->plan_buf, &body), GANG_EINVAL);
    gang_engine_free(e);
    shard_free(m);
    free(fm);
}

/*
 * Events are never lost: a caller that stops polling stalls the engine (steps plan only
 * what the event ring can take) and, once it polls again, gets every token in order.
 */
static void test_event_backpressure(void **state)
{
    static script sc;
    static script_out exp[MAX_REQS];
    gang_engine_config cfg = engine_config(1);
    full_model *fm = full_model_new(51, 0);
    gang_model *m = shard_new(fm, 1, 1, 0);
    gang_engine *e = NULL;
    gang_kernels *k = NULL;
    gang_gen_request r;
    char err[256];
    uint32_t i;

    (void)state;
    memset(&sc, 0, sizeof(sc));
    add_req(&sc, 1, 0, 3, 12, greedy);
    add_req(&sc, 2, 0, 2, 12, greedy);
    add_req(&sc, 3, 0, 4, 12, greedy);
    expected_outputs(fm, &sc, exp);
    assert_int_equal(gang_kernels_open("cpu", &k), 0);
    assert_int_equal(gang_engine_init(m, &cfg, &e, err, sizeof(err)), 0);
    for (i = 0; i < sc.n_reqs; i++) {
        r = req_of(&sc.reqs[i]);
        assert_int_equal(gang_engine_submit(e, &r, err, sizeof(err)), 0);
    }
    /* 20 steps without polling: far more tokens than the ring (4 per slot) holds. */
    for (i = 0; i < 20; i++)
        assert_int_equal(gang_engine_step(e, k, NULL, NULL, NULL, NULL, STEP_TIMEOUT_MS), 0);
    assert_int_equal(gang_engine_pending(e), 3);
    for (i = 0; i < 40 && gang_engine_pending(e) > 0; i++) {
        script_poll(e, &sc);
        assert_int_equal(gang_engine_step(e, k, NULL, NULL, NULL, NULL, STEP_TIMEOUT_MS), 0);
    }
    script_poll(e, &sc);
    check_script(&sc, exp, "backpressure");
    gang_engine_free(e);
    gang_kernels_close(k);
    shard_free(m);
    free(fm);
}

/*
 * gang_engine_cancel: a running request and a queued one are dropped between steps (no
 * event of them follows, their slots go to the others), a second cancel or an unknown id
 * is GANG_ENOENT, and the requests left finish with exactly their reference tokens.
 */
static void test_cancel(void **state)
{
    static script sc;
    static script_out exp[MAX_REQS];
    gang_engine_config cfg = engine_config(1);
    full_model *fm = full_model_new(53, 0);
    gang_model *m = shard_new(fm, 1, 1, 0);
    gang_engine *e = NULL;
    gang_kernels *k = NULL;
    gang_gen_request r;
    gang_gen_event ev;
    int32_t got[MAX_REQS][MAX_GEN];
    uint32_t n_got[MAX_REQS] = {0}, i, steps;
    int done[MAX_REQS] = {0};
    char err[256];

    (void)state;
    memset(&sc, 0, sizeof(sc));
    for (i = 0; i < 4; i++)
        add_req(&sc, i + 1, 0, 3 + i, 10, greedy);
    expected_outputs(fm, &sc, exp);
    assert_int_equal(gang_kernels_open("cpu", &k), 0);
    assert_int_equal(gang_engine_init(m, &cfg, &e, err, sizeof(err)), 0);
    for (i = 0; i < sc.n_reqs; i++) {
        r = req_of(&sc.reqs[i]);
        assert_int_equal(gang_engine_submit(e, &r, err, sizeof(err)), 0);
    }
    for (i = 0; i < 3; i++)
        assert_int_equal(gang_engine_step(e, k, NULL, NULL, NULL, NULL, STEP_TIMEOUT_MS), 0);
    while (gang_engine_poll(e, &ev) == 1) {
        if (ev.kind == GANG_GEN_TOKEN)
            got[ev.id - 1][n_got[ev.id - 1]++] = ev.token;
    }
    /* Request 1 runs by now (it arrived first); request 4 waits for a slot or runs. */
    assert_int_equal(gang_engine_cancel(e, 1), 0);
    assert_int_equal(gang_engine_cancel(e, 4), 0);
    assert_int_equal(gang_engine_cancel(e, 1), GANG_ENOENT);
    assert_int_equal(gang_engine_cancel(e, 99), GANG_ENOENT);
    assert_int_equal(gang_engine_pending(e), 2);
    for (steps = 0; steps < 60 && gang_engine_pending(e) > 0; steps++) {
        assert_int_equal(gang_engine_step(e, k, NULL, NULL, NULL, NULL, STEP_TIMEOUT_MS), 0);
        while (gang_engine_poll(e, &ev) == 1) {
            assert_true(ev.id == 2 || ev.id == 3); /* nothing of a cancelled request */
            if (ev.kind == GANG_GEN_TOKEN)
                got[ev.id - 1][n_got[ev.id - 1]++] = ev.token;
            else
                done[ev.id - 1] = 1;
        }
    }
    assert_int_equal(gang_engine_pending(e), 0);
    for (i = 1; i <= 2; i++) {
        assert_true(done[i]);
        assert_int_equal(n_got[i], exp[i].n);
        assert_memory_equal(got[i], exp[i].tokens, exp[i].n * sizeof(int32_t));
    }
    gang_engine_free(e);
    gang_kernels_close(k);
    shard_free(m);
    free(fm);
}

/* ---------------------------------------------------------------------------------
 * Tests: abort and the next generation; biases; logits across layouts
 * --------------------------------------------------------------------------------- */
#define SLEEPER 3 /* stage 1, tp rank 1 of a 2 x 2 gang */
static _Atomic uint64_t abort_at_ms;

/* Every rank but SLEEPER enters the script's steps; SLEEPER waits for the abort. */
static int abort_body(rank_ctx *x, gang_comm *world, gang_comm *tp, gang_comm *pp)
{
    while (x->rank == SLEEPER && atomic_load(&abort_at_ms) == 0)
        gang_sleep_ms(2);
    return script_body(x, world, tp, pp);
}

static void abort_controller(rank_ctx *xs, uint32_t n)
{
    uint32_t r;
    int i;

    gang_sleep_ms(300); /* let every rank block inside the first step */
    atomic_store(&abort_at_ms, gang_now_ms());
    for (r = 0; r < n; r++)
        for (i = 0; i < 3; i++)
            gang_comm_abort(atomic_load(&xs[r].comms[i]));
}

/*
 * (f) An abort from another thread while a 2 x 2 gang is inside a step makes every rank
 * return GANG_EABORTED within 1 s; after gang_engine_reset, the same engines with new
 * communicators give the reference tokens for the same requests.
 */
static void test_abort_then_next_generation(void **state)
{
    static rank_ctx xs[MAX_RANKS];
    static script sc;
    static script_out exp[MAX_REQS];
    gang_engine_config cfg = engine_config(2);
    full_model *fm = full_model_new(31, 0);
    layout lo;
    uint32_t r;

    (void)state;
    make_script(fm, &sc);
    expected_outputs(fm, &sc, exp);
    layout_init(&lo, fm, 2, 2, &cfg);
    atomic_store(&abort_at_ms, 0);
    run_gang(2, 2, lo.engines, &sc, abort_body, abort_controller, xs);
    for (r = 0; r < lo.n; r++) {
        uint64_t at = atomic_load(&abort_at_ms);

        if (xs[r].body_rc != GANG_EABORTED)
            fail_msg("rank %u returned %s, not GANG_EABORTED", r, gang_err_name(xs[r].body_rc));
        if (xs[r].done_ms < at || xs[r].done_ms - at >= 1000)
            fail_msg("rank %u returned %lld ms after the abort", r,
                     (long long)xs[r].done_ms - (long long)at);
    }
    for (r = 0; r < lo.n; r++)
        gang_engine_reset(lo.engines[r]);
    run_gang(2, 2, lo.engines, &sc, script_body, NULL, xs);
    for (r = 0; r < lo.n; r++)
        if (xs[r].body_rc != 0)
            fail_msg("next generation: rank %u: %s", r, gang_err_name(xs[r].body_rc));
    check_script(&sc, exp, "after reset");
    layout_free(&lo);
    free(fm);
}

/*
 * A Qwen2-like model (q/k/v biases): the script's tokens on 1 x 1 and 2 x 2 equal the
 * reference's, and the 2 x 2 gang's last-position logits (on the last stage's TP rank 0)
 * equal the single rank's within 1e-4 and the naive reference's.
 */
static void test_qwen2_biases_and_layout_logits(void **state)
{
    static rank_ctx xs[MAX_RANKS];
    static script sc, one;
    static script_out exp[MAX_REQS];
    gang_engine_config cfg = engine_config(2);
    full_model *fm = full_model_new(41, 1);
    double ref[VOCAB];
    layout lo, l1;
    const float *lg2, *lg1;

    (void)state;
    make_script(fm, &sc);
    expected_outputs(fm, &sc, exp);
    layout_init(&l1, fm, 1, 1, &cfg);
    script_run_local(l1.engines[0], &sc);
    check_script(&sc, exp, "qwen2 1x1");
    layout_init(&lo, fm, 2, 2, &cfg);
    run_gang(2, 2, lo.engines, &sc, script_body, NULL, xs);
    for (uint32_t r = 0; r < lo.n; r++)
        if (xs[r].body_rc != 0)
            fail_msg("qwen2 2x2: rank %u: %s", r, gang_err_name(xs[r].body_rc));
    check_script(&sc, exp, "qwen2 2x2");

    /* One request of 5 tokens, one step: compare the logits the last stages hold. */
    memset(&one, 0, sizeof(one));
    one.reqs[0] = sc.reqs[0];
    one.reqs[0].max_tokens = 1;
    one.n_reqs = 1;
    one.steps = 1;
    run_gang(2, 2, lo.engines, &one, script_body, NULL, xs);
    for (uint32_t r = 0; r < lo.n; r++)
        assert_int_equal(xs[r].body_rc, 0);
    script_run_local(l1.engines[0], &one);
    lg2 = gang__engine_logits(lo.engines[2], 0); /* stage 1, tp rank 0 */
    lg1 = gang__engine_logits(l1.engines[0], 0);
    assert_non_null(lg2);
    assert_non_null(lg1);
    assert_null(gang__engine_logits(lo.engines[3], 0)); /* tp rank 1 holds no full row */
    assert_true(rel_err_ff(lg2, lg1, VOCAB) <= REL_TOL);
    ref_logits(fm, one.reqs[0].prompt, one.reqs[0].n_prompt, ref);
    assert_true(rel_err_fd(lg2, ref, VOCAB) <= REL_TOL);
    layout_free(&lo);
    layout_free(&l1);
    free(fm);
}

/*
 * A model written by gang_mkmodel (o, written to dir) and loaded per rank by
 * gang_model_load: a 2 x 2 gang gives the single rank's tokens for a batch of greedy and
 * sampled requests, and the same last-position logits.
 */
static void check_loaded_layouts(gang_mkmodel_opts o, char *dir)
{
    static rank_ctx xs[MAX_RANKS];
    static script sc, one;
    static script_out exp[MAX_REQS];
    char err[512];
    gang_engine_config cfg = engine_config(2);
    gang_model_config mc;
    gang_topology t1, t4;
    gang_model *m1 = NULL, *m4[4] = {NULL, NULL, NULL, NULL};
    gang_engine *e1 = NULL, *e4[4] = {NULL, NULL, NULL, NULL};
    const float *lg1, *lg4;
    double rel;
    uint32_t r;

    o.out_dir = dir;
    if (gang_mkmodel(&o, err, sizeof(err)) != 0)
        fail_msg("mkmodel: %s", err);
    if (gang_model_config_read(dir, &mc, err, sizeof(err)) != 0)
        fail_msg("config: %s", err);
    assert_int_equal(mc.attn_bias, o.arch == GANG_ARCH_QWEN2);
    assert_int_equal(mc.qk_norm, o.arch == GANG_ARCH_QWEN3);
    assert_int_equal(gang_model_topology(&mc, 1, 1, 1, 1, &t1, NULL, 0), 0);
    assert_int_equal(gang_model_topology(&mc, 2, 2, 2, 2, &t4, NULL, 0), 0);
    if (gang_model_load(dir, &t1, 0, &m1, err, sizeof(err)) != 0)
        fail_msg("load 1x1: %s", err);
    assert_int_equal(gang_engine_init(m1, &cfg, &e1, err, sizeof(err)), 0);
    for (r = 0; r < 4; r++) {
        if (gang_model_load(dir, &t4, r, &m4[r], err, sizeof(err)) != 0)
            fail_msg("load 2x2 rank %u: %s", r, err);
        assert_int_equal(gang_engine_init(m4[r], &cfg, &e4[r], err, sizeof(err)), 0);
    }

    memset(&sc, 0, sizeof(sc));
    sc.steps = 30;
    add_req(&sc, 1, 0, 9, 6, greedy);
    add_req(&sc, 2, 0, 3, 5,
            (gang_sampling){.temperature = 0.8f, .top_k = 20, .top_p = 0.9f, .seed = 3});
    add_req(&sc, 3, 2, 14, 4, greedy);
    add_req(&sc, 4, 3, 2, 7,
            (gang_sampling){.temperature = 1.1f, .top_k = 0, .top_p = 1.0f, .seed = 8});
    script_run_local(e1, &sc);
    memcpy(exp, sc.out, sizeof(exp));
    run_gang(2, 2, e4, &sc, script_body, NULL, xs);
    for (r = 0; r < 4; r++)
        if (xs[r].body_rc != 0)
            fail_msg("loaded 2x2: rank %u: %s", r, gang_err_name(xs[r].body_rc));
    check_script(&sc, exp, "loaded 2x2 vs 1x1");

    memset(&one, 0, sizeof(one));
    one.reqs[0] = sc.reqs[2];
    one.reqs[0].arrive = 0;
    one.reqs[0].max_tokens = 1;
    one.n_reqs = 1;
    one.steps = 3; /* a 14-token prompt takes 3 chunks of <= 6 */
    script_run_local(e1, &one);
    run_gang(2, 2, e4, &one, script_body, NULL, xs);
    lg1 = gang__engine_logits(e1, 0);
    lg4 = gang__engine_logits(e4[2], 0);
    assert_non_null(lg1);
    assert_non_null(lg4);
    rel = rel_err_ff(lg4, lg1, 97);
    if (!(rel <= REL_TOL))
        fail_msg("loaded 2x2 logits: relative error %g against 1x1", rel);

    gang_engine_free(e1);
    gang_model_free(m1);
    for (r = 0; r < 4; r++) {
        gang_engine_free(e4[r]);
        gang_model_free(m4[r]);
    }
}

/*
 * Qwen2 with biases, tied embeddings, bf16, two shard files; then Qwen3 (q/k norms) with
 * head_dim 24 over hidden 64 and dynamic NTK over an original context of 8, so the
 * prompts (9 and 14 tokens in chunks of <= 6) and their decodes run past it with
 * per-sequence tables in a batch.
 */
static void test_loaded_model_layouts(void **state)
{
    char dir[] = "/tmp/ganglion-test-engine-XXXXXX", cmd[128];
    gang_mkmodel_opts o = {.arch = GANG_ARCH_QWEN2,
                           .layers = 3,
                           .hidden = 64,
                           .heads = 4,
                           .kv_heads = 2,
                           .ffn = 128,
                           .vocab = 97,
                           .max_pos = 64,
                           .seed = 9,
                           .dtype = GANG_DTYPE_BF16,
                           .tie_embeddings = 1,
                           .shards = 2};

    (void)state;
    assert_non_null(mkdtemp(dir));
    check_loaded_layouts(o, dir);
    o.arch = GANG_ARCH_QWEN3;
    o.head_dim = 24;
    o.max_pos = 8;
    o.dtype = GANG_DTYPE_F32;
    o.shards = 1;
    o.rope_scaling = "{\"rope_type\": \"dynamic\", \"factor\": 6.0}";
    check_loaded_layouts(o, dir);
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
}

/*
 * Dynamic NTK in a batch: each sequence is rotated with the tables of its own length. Two
 * requests prefilled in the same step (4 and 2 tokens, original context 2) and decoded
 * together give each the tokens and top-5 logprobs (1e-4) it gets alone (same chunking),
 * so neither borrows the other's table.
 */
static void test_dynamic_ntk_batch(void **state)
{
    static script sc, alone;
    char dir[] = "/tmp/ganglion-test-engine-XXXXXX", err[512], cmd[128];
    gang_mkmodel_opts o = {.arch = GANG_ARCH_LLAMA,
                           .layers = 2,
                           .hidden = 32,
                           .heads = 4,
                           .kv_heads = 2,
                           .ffn = 64,
                           .vocab = 97,
                           .max_pos = 2,
                           .seed = 17,
                           .dtype = GANG_DTYPE_F32,
                           .shards = 1,
                           .rope_scaling = "{\"rope_type\": \"dynamic\", \"factor\": 16.0}"};
    gang_engine_config cfg = engine_config(1);
    gang_model_config mc;
    gang_topology t1;
    gang_model *m = NULL;
    gang_engine *e = NULL;
    script_out exp[2];
    uint32_t i;

    (void)state;
    assert_non_null(mkdtemp(dir));
    o.out_dir = dir;
    if (gang_mkmodel(&o, err, sizeof(err)) != 0 ||
        gang_model_config_read(dir, &mc, err, sizeof(err)) != 0)
        fail_msg("model: %s", err);
    assert_int_equal(gang_model_topology(&mc, 1, 1, 1, 1, &t1, NULL, 0), 0);
    if (gang_model_load(dir, &t1, 0, &m, err, sizeof(err)) != 0)
        fail_msg("load: %s", err);
    assert_int_equal(gang_engine_init(m, &cfg, &e, err, sizeof(err)), 0);
    memset(&sc, 0, sizeof(sc));
    sc.steps = 12;
    add_req(&sc, 1, 0, 4, 6, greedy);
    add_req(&sc, 2, 0, 2, 6, greedy);
    for (i = 0; i < 2; i++) {
        sc.reqs[i].logprobs = 1;
        sc.reqs[i].top_logprobs = 5;
    }
    for (i = 0; i < 2; i++) {
        memset(&alone, 0, sizeof(alone));
        alone.reqs[0] = sc.reqs[i];
        alone.n_reqs = 1;
        alone.steps = 12;
        script_run_local(e, &alone);
        exp[i] = alone.out[0];
    }
    script_run_local(e, &sc);
    check_script(&sc, exp, "dynamic NTK: batch vs alone");
    for (i = 0; i < 2; i++)
        for (uint32_t j = 0; j < exp[i].n; j++)
            for (uint32_t t = 0; t < 5; t++)
                if (!(fabsf(sc.out[i].top_lp[j][t] - exp[i].top_lp[j][t]) <= 1e-4f))
                    fail_msg("dynamic NTK: request %u step %u: logprob %g in the batch, %g alone",
                             i, j, (double)sc.out[i].top_lp[j][t], (double)exp[i].top_lp[j][t]);
    gang_engine_free(e);
    gang_model_free(m);
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
}

/* ---- P/D transfers (engine-xfer.c): an in-memory transport between two engines ---- */

typedef struct mem_xfer {
    uint64_t id;
    uint8_t data[1 << 16];
    size_t bytes;
    uint32_t n, puts, gets;
    int fail;          /* get answers GANG_EPEER */
    int corrupt;       /* get hands out every byte + 1 */
    uint32_t delay_ms; /* get answers only after this long (a slow prefill gang) */
    atomic_int busy;   /* a get is running (it runs on the engine's fetch thread) */
} mem_xfer;

static int mem_put(void *ctx, uint64_t id, const void *data, size_t bytes, uint32_t n)
{
    mem_xfer *x = ctx;
    if (bytes > sizeof(x->data))
        return GANG_ENOMEM;
    memcpy(x->data, data, bytes);
    x->id = id;
    x->bytes = bytes;
    x->n = n;
    x->puts++;
    return 0;
}

static int mem_get(void *ctx, const gang_kv_xfer *src, const gang_kv_part *part, void *data,
                   size_t bytes, uint32_t n, uint64_t deadline_ms)
{
    mem_xfer *x = ctx;
    (void)deadline_ms;
    /* One engine of one rank: its one part is rank 0's every layer, at the transfer's host. */
    assert_int_equal(part->rank, 0);
    assert_int_equal(part->layer_first, 0);
    assert_string_equal(part->host, src->host);
    atomic_store(&x->busy, 1);
    if (x->delay_ms > 0)
        usleep(x->delay_ms * 1000u);
    atomic_store(&x->busy, 0);
    x->gets++;
    if (x->fail || src->id != x->id || n > x->n || bytes > x->bytes)
        return GANG_EPEER;
    memcpy(data, x->data, bytes); /* block-major: the first n blocks are a prefix */
    for (size_t i = 0; x->corrupt && i < bytes; i++)
        ((uint8_t *)data)[i] = (uint8_t)(((uint8_t *)data)[i] + 1u);
    return 0;
}

/* Runs request r alone on e until its DONE (and e has nothing pending); its tokens. */
static uint32_t run_alone(gang_engine *e, const gang_gen_request *r, int32_t *toks,
                          gang_gen_event *done)
{
    gang_kernels *k = NULL;
    gang_gen_event ev;
    char err[256];
    uint32_t n = 0;
    assert_int_equal(gang_kernels_open("cpu", &k), 0);
    int rc = gang_engine_submit(e, r, err, sizeof(err));
    if (rc != 0)
        fail_msg("submit: %s", err);
    for (int s = 0; s < 200 && gang_engine_pending(e) > 0; s++) {
        assert_int_equal(gang_engine_step(e, k, NULL, NULL, NULL, NULL, STEP_TIMEOUT_MS), 0);
        while (gang_engine_poll(e, &ev)) {
            if (ev.kind == GANG_GEN_TOKEN)
                toks[n++] = ev.token;
            else
                *done = ev;
        }
    }
    assert_int_equal(gang_engine_pending(e), 0);
    gang_kernels_close(k);
    return n;
}

/*
 * A prefill engine exports a prompt's full blocks when its request (max_tokens 1) ends; a
 * decode engine importing them gives the reference's greedy tokens with those blocks
 * counted as cached (not computed); a corrupted transfer changes the tokens (so the
 * imported rows are what the decode attends to); a failed one falls back to a prefill
 * with the same tokens; a prompt of whole blocks imports all but its last block.
 */
static void test_kv_transfer(void **state)
{
    (void)state;
    static mem_xfer mx;
    gang_engine_config cfg = engine_config(1);
    full_model *fm = full_model_new(33, 0);
    gang_model *m = shard_new(fm, 1, 1, 0);
    gang_engine *pe = NULL, *de = NULL;
    gang_engine_kv kv;
    gang_kv_shape sh;
    gang_gen_event done;
    int32_t prompt[14], want[8], got[8];
    char err[256];
    cfg.block_size = 4;
    cfg.max_step_tokens = 16;
    cfg.prefix_caching = 1;
    for (uint32_t i = 0; i < 14; i++)
        prompt[i] = (int32_t)((i * 7 + 3) % VOCAB);
    ref_greedy(fm, prompt, 14, 8, want);
    gang_kv_hooks h = {.ctx = &mx, .put = mem_put, .get = mem_get};
    assert_int_equal(gang_engine_init(m, &cfg, &pe, err, sizeof(err)), 0);
    gang_engine_set_kv_hooks(pe, &h, 1000);
    gang_gen_request r = {.id = 1, .prompt = prompt, .n_prompt = 14, .max_tokens = 1};
    r.sampling.top_p = 1.0f; /* greedy */
    r.kv.do_export = 1;
    assert_int_equal(run_alone(pe, &r, got, &done), 1);
    assert_int_equal(got[0], want[0]);
    assert_true(done.kv_id != 0 && done.kv_id == mx.id);
    assert_int_equal(done.kv_blocks, 3);
    assert_int_equal(gang_engine_kv_shape(pe, &sh), 0);
    assert_int_equal(mx.puts, 1);
    assert_int_equal(mx.bytes, 3 * sh.block_bytes);
    assert_int_equal(sh.block_bytes, (uint64_t)N_LAYERS * 2 * 4 * KV_DIM * 4);
    assert_int_equal(gang_engine_kv_info(pe, &kv), 0);
    uint32_t free_after = kv.free_blocks; /* the pins are gone: every block is free again */
    assert_int_equal(free_after, kv.blocks);
    gang_engine_free(pe);

    for (int c = 0; c < 4; c++) {
        /* 0: imported; 1: corrupted; 2: failed (fallback); 3: a prompt of whole blocks. */
        assert_int_equal(gang_engine_init(m, &cfg, &de, err, sizeof(err)), 0);
        gang_engine_set_kv_hooks(de, &h, 1000);
        mx.fail = c == 2;
        mx.corrupt = c == 1;
        mx.gets = 0;
        gang_gen_request d = {
            .id = 7, .prompt = prompt, .n_prompt = c == 3 ? 12 : 14, .max_tokens = 8};
        d.sampling.top_p = 1.0f;
        d.kv.id = mx.id;
        d.kv.blocks = 3;
        int32_t w3[8];
        ref_greedy(fm, prompt, d.n_prompt, 8, w3);
        assert_int_equal(run_alone(de, &d, got, &done), 8);
        assert_int_equal(mx.gets, 1);
        assert_int_equal(gang_engine_kv_info(de, &kv), 0);
        if (c == 1) {
            assert_true(memcmp(got, want, sizeof(want)) != 0);
        } else {
            assert_memory_equal(got, c == 3 ? w3 : want, sizeof(want));
        }
        assert_int_equal(done.kv_id, 0);
        assert_int_equal(done.kv_blocks, c == 2 ? 0 : c == 3 ? 2 : 3);
        assert_int_equal(done.index, c == 2 ? 0 : c == 3 ? 8 : 12); /* cached tokens */
        assert_int_equal(kv.prefix_hit_tokens, done.index);
        gang_engine_free(de);
        de = NULL;
    }
    /* Without hooks, an import is not tried: a plain prefill. */
    assert_int_equal(gang_engine_init(m, &cfg, &de, err, sizeof(err)), 0);
    gang_gen_request d = {.id = 8, .prompt = prompt, .n_prompt = 14, .max_tokens = 8};
    d.sampling.top_p = 1.0f;
    d.kv.id = mx.id;
    d.kv.blocks = 3;
    assert_int_equal(run_alone(de, &d, got, &done), 8);
    assert_memory_equal(got, want, sizeof(want));
    assert_int_equal(done.kv_blocks, 0);
    gang_engine_free(de);
    shard_free(m);
    free(fm);
}

/*
 * A slow fetch blocks no step: a decode engine admits an import whose transport answers
 * only after 700 ms while another stream decodes on it; that stream produces all its
 * tokens in quick steps that begin and end while the fetch is still running (a fetch
 * inside a step would hold that step for the whole 700 ms), and the import then commits
 * the fetched blocks: the reference's tokens, from 3 cached blocks.
 */
static void test_kv_transfer_background(void **state)
{
    (void)state;
    static mem_xfer mx;
    gang_engine_config cfg = engine_config(1);
    full_model *fm = full_model_new(33, 0);
    gang_model *m = shard_new(fm, 1, 1, 0);
    gang_engine *pe = NULL, *de = NULL;
    gang_kernels *k = NULL;
    gang_gen_event ev, done = {0};
    int32_t prompt[14], other[6], want[8], want_a[30], got[30], got_b[8];
    uint32_t n_a = 0, n_b = 0, during = 0, a_done_during = 0;
    uint64_t worst = 0;
    char err[256];
    cfg.block_size = 4;
    cfg.max_step_tokens = 16;
    for (uint32_t i = 0; i < 14; i++)
        prompt[i] = (int32_t)((i * 7 + 3) % VOCAB);
    for (uint32_t i = 0; i < 6; i++)
        other[i] = (int32_t)((i * 5 + 1) % VOCAB);
    ref_greedy(fm, prompt, 14, 8, want);
    ref_greedy(fm, other, 6, 30, want_a);
    gang_kv_hooks h = {.ctx = &mx, .put = mem_put, .get = mem_get};
    assert_int_equal(gang_engine_init(m, &cfg, &pe, err, sizeof(err)), 0);
    gang_engine_set_kv_hooks(pe, &h, 1000);
    gang_gen_request r = {.id = 1, .prompt = prompt, .n_prompt = 14, .max_tokens = 1};
    r.sampling.top_p = 1.0f;
    r.kv.do_export = 1;
    assert_int_equal(run_alone(pe, &r, got, &done), 1);
    gang_engine_free(pe);

    assert_int_equal(gang_kernels_open("cpu", &k), 0);
    assert_int_equal(gang_engine_init(m, &cfg, &de, err, sizeof(err)), 0);
    gang_engine_set_kv_hooks(de, &h, 5000);
    mx.delay_ms = 700;
    gang_gen_request a = {.id = 2, .prompt = other, .n_prompt = 6, .max_tokens = 30};
    a.sampling.top_p = 1.0f;
    gang_gen_request b = {.id = 3, .prompt = prompt, .n_prompt = 14, .max_tokens = 8};
    b.sampling.top_p = 1.0f;
    b.kv.id = mx.id;
    b.kv.blocks = 3;
    assert_int_equal(gang_engine_submit(de, &a, err, sizeof(err)), 0);
    for (int s = 0, b_in = 0; s < 2000 && gang_engine_pending(de) > 0; s++) {
        if (n_a == 2 && !b_in) {
            assert_int_equal(gang_engine_submit(de, &b, err, sizeof(err)), 0);
            b_in = 1;
        }
        int busy0 = atomic_load(&mx.busy);
        uint64_t t0 = gang_now_ms();
        assert_int_equal(gang_engine_step(de, k, NULL, NULL, NULL, NULL, STEP_TIMEOUT_MS), 0);
        uint64_t took = gang_now_ms() - t0;
        int busy = busy0 && atomic_load(&mx.busy);
        /* Once B is admitted, the test waits (up to 2 s) until its fetch has begun: on a
         * loaded machine the fetch thread may start only after a few of A's quick steps. */
        for (int w = 0; b_in == 1 && w < 2000 && !atomic_load(&mx.busy); w++)
            usleep(1000);
        b_in += b_in == 1;
        worst = took > worst ? took : worst;
        while (gang_engine_poll(de, &ev)) {
            if (ev.kind == GANG_GEN_TOKEN && ev.id == 2) {
                got[n_a++] = ev.token;
                during += busy;
            } else if (ev.kind == GANG_GEN_TOKEN) {
                got_b[n_b++] = ev.token;
            } else if (ev.id == 2) {
                a_done_during = (uint32_t)busy;
            } else {
                done = ev;
            }
        }
        if (n_a == 30 && gang_engine_pending(de) > 0)
            usleep(1000); /* (B's fetch: the test's own loop need not spin) */
    }
    assert_int_equal(gang_engine_pending(de), 0);
    print_message("while a 700 ms fetch ran: %u of the other stream's tokens, the slowest step "
                  "%llu ms\n",
                  during, (unsigned long long)worst);
    assert_int_equal(n_a, 30);
    assert_memory_equal(got, want_a, sizeof(want_a));
    assert_true(during >= 20);
    assert_true(a_done_during);
    assert_true(worst < 350);
    assert_int_equal(n_b, 8);
    assert_memory_equal(got_b, want, sizeof(want));
    assert_int_equal(done.kv_blocks, 3); /* imported, not prefilled */
    assert_int_equal(done.index, 12);
    assert_true(done.kv_ms >= 600);
    gang_engine_free(de);
    gang_kernels_close(k);
    shard_free(m);
    free(fm);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layer_batch),
        cmocka_unit_test(test_logits_match_reference),
        cmocka_unit_test(test_decode_equals_prefix),
        cmocka_unit_test(test_sampler),
        cmocka_unit_test(test_validation),
        cmocka_unit_test(test_request_codec),
        cmocka_unit_test(test_engine_setup),
        cmocka_unit_test(test_plan_validation),
        cmocka_unit_test(test_plan_flags),
        cmocka_unit_test(test_plan_entry_size),
        cmocka_unit_test(test_event_backpressure),
        cmocka_unit_test(test_cancel),
        cmocka_unit_test(test_layouts_and_batching),
        cmocka_unit_test(test_preemption),
        cmocka_unit_test(test_kv_dtype),
        cmocka_unit_test(test_prefix_cache),
        cmocka_unit_test(test_kv_transfer),
        cmocka_unit_test(test_kv_transfer_background),
        cmocka_unit_test(test_kv_layer_spans),
        cmocka_unit_test(test_kv_parts),
        cmocka_unit_test(test_abort_then_next_generation),
        cmocka_unit_test(test_qwen2_biases_and_layout_logits),
        cmocka_unit_test(test_loaded_model_layouts),
        cmocka_unit_test(test_dynamic_ntk_batch),
        cmocka_unit_test(test_gen_validation),
        cmocka_unit_test(test_eos),
        cmocka_unit_test(test_penalties),
        cmocka_unit_test(test_penalties_seeded),
        cmocka_unit_test(test_logprobs),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
