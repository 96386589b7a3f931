/* The fixture of the engine tests; see engine-fixture.h. */
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

#include "test-util.h"
#include "engine-fixture.h"
#include "engine-internal.h"

/* ---------------------------------------------------------------------------------
 * A random full model
 * --------------------------------------------------------------------------------- */
static uint64_t rng_state;

/* The next draw of this file's deterministic sequence (test-util.c). */
static float rnd(void)
{
    return tu_rnd(&rng_state);
}

void fill(float *a, size_t n, float scale, float offset)
{
    size_t i;

    for (i = 0; i < n; i++)
        a[i] = rnd() * scale + offset;
}

/* Draws a model from seed; with_bias gives Qwen2-like q/k/v biases. */
full_model *full_model_new(uint64_t seed, int with_bias)
{
    full_model *fm = calloc(1, sizeof(*fm));
    float s_h = 1.0f / sqrtf((float)HIDDEN), s_f = 1.0f / sqrtf((float)FFN);
    uint32_t i;

    assert_non_null(fm);
    rng_state = seed * 0x9e3779b97f4a7c15ull + 1;
    fm->cfg = (gang_model_config){.arch = with_bias ? GANG_ARCH_QWEN2 : GANG_ARCH_LLAMA,
                                  .hidden = HIDDEN,
                                  .ffn = FFN,
                                  .n_heads = N_HEADS,
                                  .n_kv_heads = N_KV_HEADS,
                                  .n_layers = N_LAYERS,
                                  .vocab = VOCAB,
                                  .head_dim = HEAD_DIM,
                                  .max_pos = MAX_POS,
                                  .rms_eps = NORM_EPS,
                                  .rope_theta = ROPE_THETA,
                                  .attn_bias = with_bias,
                                  .bos_token_id = -1,
                                  .eos_token_id = -1,
                                  .dtype = GANG_DTYPE_F32};
    for (i = 0; i < N_LAYERS; i++) {
        full_layer *p = &fm->layer[i];

        fill(p->attn_norm, HIDDEN, 0.2f, 1.0f);
        fill(p->mlp_norm, HIDDEN, 0.2f, 1.0f);
        /* Large q/k weights give peaked softmaxes, so a wrong head or slot cannot hide. */
        fill(p->wq, Q_DIM * HIDDEN, 3.0f * s_h, 0.0f);
        fill(p->wk, KV_DIM * HIDDEN, 3.0f * s_h, 0.0f);
        fill(p->wv, KV_DIM * HIDDEN, s_h, 0.0f);
        fill(p->wo, HIDDEN * Q_DIM, s_h, 0.0f);
        fill(p->w_gate, FFN * HIDDEN, 2.0f * s_h, 0.0f);
        fill(p->w_up, FFN * HIDDEN, s_h, 0.0f);
        fill(p->w_down, HIDDEN * FFN, s_f, 0.0f);
        fill(p->bq, Q_DIM, 0.5f, 0.0f);
        fill(p->bk, KV_DIM, 0.5f, 0.0f);
        fill(p->bv, KV_DIM, 0.5f, 0.0f);
        fm->w[i] = (gang_layer_weights){.attn_norm = p->attn_norm,
                                        .wq = p->wq,
                                        .wk = p->wk,
                                        .wv = p->wv,
                                        .wo = p->wo,
                                        .mlp_norm = p->mlp_norm,
                                        .w_gate = p->w_gate,
                                        .w_up = p->w_up,
                                        .w_down = p->w_down,
                                        .bq = with_bias ? p->bq : NULL,
                                        .bk = with_bias ? p->bk : NULL,
                                        .bv = with_bias ? p->bv : NULL};
    }
    fill(fm->embed, VOCAB * HIDDEN, 1.0f, 0.0f);
    fill(fm->final_norm, HIDDEN, 0.2f, 1.0f);
    fill(fm->lm_head, VOCAB * HIDDEN, 3.0f * s_h, 0.0f);
    return fm;
}

int topology_for(uint32_t tp, uint32_t pp, gang_topology *t)
{
    gang_topology_config cfg = {.nnodes = (int32_t)pp,
                                .nproc_per_node = (int32_t)tp,
                                .tp = (int32_t)tp,
                                .pp = (int32_t)pp,
                                .allow_cross_node_tp = 0,
                                .n_layers = N_LAYERS,
                                .n_heads = N_HEADS,
                                .n_kv_heads = N_KV_HEADS,
                                .ffn = FFN,
                                .hidden = HIDDEN,
                                .vocab = VOCAB};

    return gang_topology_init(&cfg, t, NULL, 0);
}

/* Copies n floats into a new array. */
static float *dup_floats(const float *src, size_t n)
{
    float *p = malloc(n * sizeof(float));

    assert_non_null(p);
    memcpy(p, src, n * sizeof(float));
    return p;
}

/* Rank `rank`'s shard of fm for tp x pp, built by hand as gang_model_load would. */
gang_model *shard_new(const full_model *fm, uint32_t tp, uint32_t pp, uint32_t rank)
{
    gang_model *m = calloc(1, sizeof(*m));
    uint32_t i;

    assert_non_null(m);
    m->cfg = fm->cfg;
    assert_int_equal(topology_for(tp, pp, &m->topo), 0);
    assert_int_equal(gang_topology_rank(&m->topo, rank, &m->place), 0);
    assert_int_equal(gang_topology_tp_shard(&m->topo, m->place.tp_rank, &m->shard), 0);
    assert_int_equal(
        gang_topology_stage_layers(&m->topo, m->place.pp_stage, &m->layer_first, &m->layer_count),
        0);
    m->layers = calloc(m->layer_count, sizeof(*m->layers));
    assert_non_null(m->layers);
    for (i = 0; i < m->layer_count; i++)
        assert_int_equal(gang_tp_layer_init(&m->layers[i], &m->topo, m->place.tp_rank,
                                            &fm->w[m->layer_first + i], ROPE_THETA, NORM_EPS),
                         0);
    if (m->place.pp_stage == 0)
        m->embed = dup_floats(fm->embed, VOCAB * HIDDEN);
    if (m->place.pp_stage + 1 == pp) {
        m->final_norm = dup_floats(fm->final_norm, HIDDEN);
        m->lm_head = dup_floats(fm->lm_head + (size_t)m->shard.vocab_first * HIDDEN,
                                (size_t)m->shard.vocab_count * HIDDEN);
    }
    return m;
}

/* Releases a hand-built shard (independent of gang_model_free, which model I/O owns). */
void shard_free(gang_model *m)
{
    uint32_t i;

    if (m == NULL)
        return;
    for (i = 0; i < m->layer_count; i++)
        gang_tp_layer_free(&m->layers[i]);
    free(m->layers);
    free(m->embed);
    free(m->final_norm);
    free(m->lm_head);
    free(m);
}

/* ---------------------------------------------------------------------------------
 * The naive reference: the Hugging Face Llama / Qwen2 forward in double, plain loops.
 * --------------------------------------------------------------------------------- */

/* out[r] = x[r] * rsqrt(mean(x[r]^2) + eps) * w, rows of HIDDEN. */
static void ref_rmsnorm(const double *x, const float *w, size_t rows, double *out)
{
    size_t r, i;

    for (r = 0; r < rows; r++) {
        double ss = 0.0, inv;

        for (i = 0; i < HIDDEN; i++)
            ss += x[r * HIDDEN + i] * x[r * HIDDEN + i];
        inv = 1.0 / sqrt(ss / HIDDEN + (double)NORM_EPS);
        for (i = 0; i < HIDDEN; i++)
            out[r * HIDDEN + i] = x[r * HIDDEN + i] * inv * (double)w[i];
    }
}

/* y [rows, out] = x [rows, in] . W^T (+ b), W [out, in]. */
static void ref_linear(const double *x, size_t rows, size_t in, const float *w, const float *b,
                       size_t out, double *y)
{
    size_t r, o, i;

    for (r = 0; r < rows; r++)
        for (o = 0; o < out; o++) {
            double acc = b != NULL ? (double)b[o] : 0.0;

            for (i = 0; i < in; i++)
                acc += x[r * in + i] * (double)w[o * in + i];
            y[r * out + o] = acc;
        }
}

/* rotate_half RoPE of heads x HEAD_DIM per row, row t at position t. */
static void ref_rope(double *x, size_t rows, size_t heads)
{
    size_t t, h, i, half = HEAD_DIM / 2;

    for (t = 0; t < rows; t++)
        for (h = 0; h < heads; h++) {
            double *v = x + (t * heads + h) * HEAD_DIM;

            for (i = 0; i < half; i++) {
                double ang = (double)t * pow((double)ROPE_THETA, -2.0 * (double)i / HEAD_DIM);
                double a = v[i], b = v[i + half];

                v[i] = a * cos(ang) - b * sin(ang);
                v[i + half] = b * cos(ang) + a * sin(ang);
            }
        }
}

/* The logits [VOCAB] of the last position of ids [n] under fm. */
void ref_logits(const full_model *fm, const int32_t *ids, size_t n, double *logits)
{
    double *x = calloc(n * HIDDEN, sizeof(double)), *xn = calloc(n * HIDDEN, sizeof(double));
    double *q = calloc(n * Q_DIM, sizeof(double)), *k = calloc(n * KV_DIM, sizeof(double));
    double *v = calloc(n * KV_DIM, sizeof(double)), *att = calloc(n * Q_DIM, sizeof(double));
    double *g = calloc(n * FFN, sizeof(double)), *u = calloc(n * FFN, sizeof(double));
    double *d = calloc(n * HIDDEN, sizeof(double)), sc[MAX_POS];
    int with_bias = fm->cfg.attn_bias;
    size_t l, t, h, j, i;

    assert_true(x && xn && q && k && v && att && g && u && d && n <= MAX_POS);
    for (t = 0; t < n; t++)
        for (i = 0; i < HIDDEN; i++)
            x[t * HIDDEN + i] = fm->embed[(size_t)ids[t] * HIDDEN + i];
    for (l = 0; l < N_LAYERS; l++) {
        const full_layer *p = &fm->layer[l];

        ref_rmsnorm(x, p->attn_norm, n, xn);
        ref_linear(xn, n, HIDDEN, p->wq, with_bias ? p->bq : NULL, Q_DIM, q);
        ref_linear(xn, n, HIDDEN, p->wk, with_bias ? p->bk : NULL, KV_DIM, k);
        ref_linear(xn, n, HIDDEN, p->wv, with_bias ? p->bv : NULL, KV_DIM, v);
        ref_rope(q, n, N_HEADS);
        ref_rope(k, n, N_KV_HEADS);
        for (t = 0; t < n; t++)
            for (h = 0; h < N_HEADS; h++) {
                size_t kvh = h / (N_HEADS / N_KV_HEADS);
                double mx = -INFINITY, sum = 0.0;

                for (j = 0; j <= t; j++) {
                    double dot = 0.0;

                    for (i = 0; i < HEAD_DIM; i++)
                        dot += q[(t * N_HEADS + h) * HEAD_DIM + i] *
                               k[(j * N_KV_HEADS + kvh) * HEAD_DIM + i];
                    sc[j] = dot / sqrt((double)HEAD_DIM);
                    mx = fmax(mx, sc[j]);
                }
                for (j = 0; j <= t; j++) {
                    sc[j] = exp(sc[j] - mx);
                    sum += sc[j];
                }
                for (i = 0; i < HEAD_DIM; i++) {
                    double acc = 0.0;

                    for (j = 0; j <= t; j++)
                        acc += sc[j] * v[(j * N_KV_HEADS + kvh) * HEAD_DIM + i];
                    att[(t * N_HEADS + h) * HEAD_DIM + i] = acc / sum;
                }
            }
        ref_linear(att, n, Q_DIM, p->wo, NULL, HIDDEN, d);
        for (i = 0; i < n * HIDDEN; i++)
            x[i] += d[i];
        ref_rmsnorm(x, p->mlp_norm, n, xn);
        ref_linear(xn, n, HIDDEN, p->w_gate, NULL, FFN, g);
        ref_linear(xn, n, HIDDEN, p->w_up, NULL, FFN, u);
        for (i = 0; i < n * FFN; i++)
            g[i] = g[i] / (1.0 + exp(-g[i])) * u[i];
        ref_linear(g, n, FFN, p->w_down, NULL, HIDDEN, d);
        for (i = 0; i < n * HIDDEN; i++)
            x[i] += d[i];
    }
    ref_rmsnorm(x + (n - 1) * HIDDEN, fm->final_norm, 1, xn);
    ref_linear(xn, 1, HIDDEN, fm->lm_head, NULL, VOCAB, logits);
    free(x);
    free(xn);
    free(q);
    free(k);
    free(v);
    free(att);
    free(g);
    free(u);
    free(d);
}

/* Greedy argmax of a double row, lowest index on ties. */
int32_t ref_argmax(const double *x, size_t n)
{
    size_t i, best = 0;

    for (i = 1; i < n; i++)
        if (x[i] > x[best])
            best = i;
    return (int32_t)best;
}

/* The reference's greedy continuation of prompt: max_tokens tokens into out. */
void ref_greedy(const full_model *fm, const int32_t *prompt, uint32_t n_prompt, uint32_t max_tokens,
                int32_t *out)
{
    int32_t ids[MAX_POS];
    double logits[VOCAB];
    uint32_t i, n = n_prompt;

    memcpy(ids, prompt, n_prompt * sizeof(int32_t));
    for (i = 0; i < max_tokens; i++) {
        ref_logits(fm, ids, n, logits);
        out[i] = ref_argmax(logits, VOCAB);
        ids[n++] = out[i];
    }
}

/* Norm-wise relative error of a float row against a double row: max |d| / max |ref|. */
double rel_err_fd(const float *got, const double *ref, size_t n)
{
    double num = 0.0, den = 0.0;
    size_t i;

    for (i = 0; i < n; i++) {
        num = fmax(num, fabs((double)got[i] - ref[i]));
        den = fmax(den, fabs(ref[i]));
    }
    return den > 0.0 ? num / den : num;
}

double rel_err_ff(const float *got, const float *ref, size_t n)
{
    double num = 0.0, den = 0.0;
    size_t i;

    for (i = 0; i < n; i++) {
        num = fmax(num, fabs((double)got[i] - (double)ref[i]));
        den = fmax(den, fabs((double)ref[i]));
    }
    return den > 0.0 ? num / den : num;
}

/* ---------------------------------------------------------------------------------
 * Scripts: requests that arrive at given steps, and what rank 0 saw of them.
 * --------------------------------------------------------------------------------- */

gang_gen_request req_of(const script_req *s)
{
    gang_gen_request r;

    memset(&r, 0, sizeof(r));
    r.id = s->id;
    r.prompt = s->prompt;
    r.n_prompt = s->n_prompt;
    r.max_tokens = s->max_tokens;
    r.sampling = s->sp;
    r.sampling.n_stop = s->n_stop;
    r.sampling.stop[0] = s->stop;
    r.sampling.ignore_eos = s->ignore_eos;
    r.sampling.logprobs = s->logprobs;
    r.sampling.top_logprobs = s->top_logprobs;
    return r;
}

/* Rank 0: submits the requests that arrive before step `step`. */
int script_submit(gang_engine *e, script *sc, uint32_t step)
{
    gang_gen_request r;
    char err[256];
    uint32_t i;
    int rc;

    for (i = 0; i < sc->n_reqs; i++) {
        if (sc->reqs[i].arrive != step)
            continue;
        r = req_of(&sc->reqs[i]);
        rc = gang_engine_submit(e, &r, err, sizeof(err));
        if (rc != 0)
            return rc;
    }
    return 0;
}

/* Rank 0: drains the events into the script's outputs, checking their order. */
void script_poll(gang_engine *e, script *sc)
{
    gang_gen_event ev;
    uint32_t i;

    while (gang_engine_poll(e, &ev) == 1) {
        script_out *o = NULL;

        for (i = 0; i < sc->n_reqs; i++)
            if (sc->reqs[i].id == ev.id)
                o = &sc->out[i];
        if (o == NULL || o->done) {
            if (o != NULL)
                o->bad = 1;
            continue;
        }
        if (ev.kind == GANG_GEN_TOKEN) {
            if (ev.index != o->n || o->n >= MAX_GEN || ev.n_top > GANG_MAX_TOP_LOGPROBS) {
                o->bad = 1;
            } else {
                o->logprob[o->n] = ev.logprob;
                o->n_top[o->n] = ev.n_top;
                memcpy(o->top_ids[o->n], ev.top_ids, sizeof(ev.top_ids));
                memcpy(o->top_lp[o->n], ev.top_logprobs, sizeof(ev.top_logprobs));
                o->tokens[o->n++] = ev.token;
            }
        } else if (ev.kind == GANG_GEN_DONE) {
            o->done = 1;
            memcpy(o->finish, ev.finish, sizeof(o->finish));
        } else {
            o->bad = 1;
        }
    }
}

/* Runs a script on one rank with no communicators (a 1 x 1 gang). */
void script_run_local(gang_engine *e, script *sc)
{
    gang_kernels *k = NULL;
    uint32_t s;

    memset(sc->out, 0, sizeof(sc->out));
    assert_int_equal(gang_kernels_open("cpu", &k), 0);
    for (s = 0; s < sc->steps; s++) {
        assert_int_equal(script_submit(e, sc, s), 0);
        assert_int_equal(gang_engine_step(e, k, NULL, NULL, NULL, NULL, STEP_TIMEOUT_MS), 0);
        script_poll(e, sc);
    }
    assert_int_equal(gang_engine_pending(e), 0);
    gang_kernels_close(k);
}

/* ---------------------------------------------------------------------------------
 * A gang of threads over the socket backend, with TP and PP sub-communicators.
 * --------------------------------------------------------------------------------- */

static void *rank_main(void *arg)
{
    rank_ctx *x = arg;

    x->init_rc = tu_gang_rank_enter(&x->run->g, x->rank, x->listener, x->comms);
    if (x->init_rc == 0)
        x->body_rc = x->run->body(x, atomic_load(&x->comms[0]),
                                  x->run->tp > 1 ? atomic_load(&x->comms[1]) : NULL,
                                  x->run->pp > 1 ? atomic_load(&x->comms[2]) : NULL);
    x->done_ms = gang_now_ms();
    tu_gang_rank_leave(&x->run->g, x->comms);
    return NULL;
}

/* Runs body on tp x pp rank threads around engines[]; controller on the main thread. */
void run_gang(uint32_t tp, uint32_t pp, gang_engine **engines, script *sc, rank_body body,
              gang_controller controller, rank_ctx *xs)
{
    run_gang_on(tp, pp, engines, NULL, sc, body, controller, xs);
}

void run_gang_on(uint32_t tp, uint32_t pp, gang_engine **engines, gang_kernels **kernels,
                 script *sc, rank_body body, gang_controller controller, rank_ctx *xs)
{
    static gang_run run;
    pthread_t th[MAX_RANKS];
    uint32_t r, n = tp * pp;

    memset(&run, 0, sizeof(run));
    memset(xs, 0, sizeof(*xs) * n);
    if (sc != NULL)
        memset(sc->out, 0, sizeof(sc->out));
    run.n = n;
    run.tp = tp;
    run.pp = pp;
    run.body = body;
    run.sc = sc;
    run.kernels = kernels;
    for (r = 0; r < n; r++) {
        xs[r].run = &run;
        xs[r].rank = r;
        xs[r].engine = engines[r];
    }
    tu_gang_start(&run.g, n, tp, controller != NULL, &xs[0].listener, rank_main, xs, sizeof(xs[0]),
                  th);
    if (controller != NULL)
        controller(xs, n);
    tu_gang_finish(&run.g, th);
    for (r = 0; r < n; r++)
        if (xs[r].init_rc != 0)
            fail_msg("rank %u: comm init %s", r, gang_err_name(xs[r].init_rc));
}

/* Every rank steps the script's number of steps; rank 0 submits and polls. */
int script_body(rank_ctx *x, gang_comm *world, gang_comm *tp, gang_comm *pp)
{
    gang_kernels *k = NULL;
    script *sc = x->run->sc;
    uint32_t s;
    int rc;

    if (x->run->kernels != NULL)
        k = x->run->kernels[x->rank];
    else if ((rc = gang_kernels_open("cpu", &k)) != 0)
        return rc;
    for (s = 0; s < sc->steps; s++) {
        if (x->rank == 0) {
            rc = script_submit(x->engine, sc, s);
            if (rc != 0)
                break;
        }
        rc = gang_engine_step(x->engine, k, world, tp, NULL, pp, STEP_TIMEOUT_MS);
        if (rc != 0)
            break;
        x->steps_done++;
        if (x->rank == 0)
            script_poll(x->engine, sc);
    }
    if (rc == 0 && x->rank == 0 && gang_engine_pending(x->engine) != 0)
        rc = GANG_EINTERNAL;
    if (x->run->kernels == NULL)
        gang_kernels_close(k);
    return rc;
}

/* ---------------------------------------------------------------------------------
 * Engines of a layout
 * --------------------------------------------------------------------------------- */
gang_engine_config engine_config(uint32_t microbatches)
{
    return (gang_engine_config){.max_batch = 3,
                                .max_ctx = 40,
                                .kv_cache_bytes = 64u << 20,
                                .microbatches = microbatches,
                                .max_step_tokens = 6};
}

void layout_init(layout *lo, const full_model *fm, uint32_t tp, uint32_t pp,
                 const gang_engine_config *cfg)
{
    char err[256];
    uint32_t r;

    memset(lo, 0, sizeof(*lo));
    lo->tp = tp;
    lo->pp = pp;
    lo->n = tp * pp;
    for (r = 0; r < lo->n; r++) {
        lo->models[r] = shard_new(fm, tp, pp, r);
        if (gang_engine_init(lo->models[r], cfg, &lo->engines[r], err, sizeof(err)) != 0)
            fail_msg("engine init tp=%u pp=%u rank=%u: %s", tp, pp, r, err);
    }
}

void layout_init_on(layout *lo, const full_model *fm, uint32_t tp, uint32_t pp,
                    const gang_engine_config *cfg, const char *device)
{
    gang_kernels_options o;
    char err[256];
    uint32_t r;
    int rc;

    memset(lo, 0, sizeof(*lo));
    lo->tp = tp;
    lo->pp = pp;
    lo->n = tp * pp;
    for (r = 0; r < lo->n; r++) {
        gang_kernels_options_init(&o);
        o.device = device;
        o.pool_mb = 256; /* several ranks share one GPU */
        rc = gang_kernels_open_opts(&o, &lo->kernels[r]);
        if (rc != 0)
            fail_msg("open %s for rank %u: %s", device, r, gang_err_name(rc));
        lo->models[r] = shard_new(fm, tp, pp, r);
        rc = gang_model_to_device(lo->models[r], lo->kernels[r]);
        if (rc != 0)
            fail_msg("model to %s, rank %u: %s", device, r, gang_err_name(rc));
        if (gang_engine_init_on(lo->models[r], lo->kernels[r], cfg, &lo->engines[r], err,
                                sizeof(err)) != 0)
            fail_msg("engine init on %s tp=%u pp=%u rank=%u: %s", device, tp, pp, r, err);
    }
}

void layout_free(layout *lo)
{
    uint32_t r;

    for (r = 0; r < lo->n; r++) {
        gang_engine_free(lo->engines[r]);
        gang_model_device_release(lo->models[r]);
        shard_free(lo->models[r]);
        gang_kernels_close(lo->kernels[r]);
    }
}

/* ---------------------------------------------------------------------------------
 * The script of the equivalence tests and its expected outputs
 * --------------------------------------------------------------------------------- */
const gang_sampling greedy = {.temperature = 0.0f, .top_k = 0, .top_p = 1.0f, .seed = 0};

void add_req(script *sc, uint64_t id, uint32_t arrive, uint32_t n_prompt, uint32_t max_tokens,
             gang_sampling sp)
{
    script_req *r = &sc->reqs[sc->n_reqs++];
    uint32_t i;

    memset(r, 0, sizeof(*r));
    r->id = id;
    r->arrive = arrive;
    r->n_prompt = n_prompt;
    for (i = 0; i < n_prompt; i++)
        r->prompt[i] = (int32_t)((id * 7 + i * 13 + i * i) % VOCAB);
    r->max_tokens = max_tokens;
    r->sp = sp;
}

/*
 * Eight requests over three slots: prompts of 1 to 13 tokens (those above 6 are prefilled
 * in chunks), arrivals at steps 0 to 5, so requests queue for slots and join running
 * ones; one stops on a stop token, two sample with seeds, one samples with top_k = 1.
 */
void make_script(const full_model *fm, script *sc)
{
    int32_t toks[MAX_GEN];

    memset(sc, 0, sizeof(*sc));
    sc->steps = 45;
    add_req(sc, 11, 0, 5, 6, greedy);
    add_req(sc, 12, 0, 9, 4, greedy);
    add_req(sc, 13, 2, 1, 7, greedy);
    add_req(sc, 14, 3, 13, 3, greedy);
    add_req(sc, 15, 5, 4, 8, greedy);
    /* Request 15 stops on the third token of its greedy continuation. */
    ref_greedy(fm, sc->reqs[4].prompt, sc->reqs[4].n_prompt, 3, toks);
    sc->reqs[4].n_stop = 1;
    sc->reqs[4].stop = toks[2];
    add_req(sc, 16, 1, 6, 6,
            (gang_sampling){.temperature = 0.9f, .top_k = 0, .top_p = 0.95f, .seed = 1234});
    add_req(sc, 17, 4, 3, 5,
            (gang_sampling){.temperature = 1.3f, .top_k = 5, .top_p = 1.0f, .seed = 99});
    add_req(sc, 18, 2, 7, 4,
            (gang_sampling){.temperature = 0.7f, .top_k = 1, .top_p = 1.0f, .seed = 5});
}

/*
 * The reference sampling of a request: the naive forward's logits (as float) through the
 * sampler, token by token, so that seeded draws are checked against an independent
 * forward pass too.
 */
void ref_sampled(const full_model *fm, const script_req *r, script_out *o)
{
    gang__sampler smp;
    int32_t ids[MAX_POS];
    double logits[VOCAB];
    float lf[VOCAB];
    uint32_t i, j, n = r->n_prompt;

    assert_int_equal(gang__sampler_init(&smp, VOCAB), 0);
    memcpy(ids, r->prompt, n * sizeof(int32_t));
    memset(o, 0, sizeof(*o));
    for (i = 0; i < r->max_tokens; i++) {
        ref_logits(fm, ids, n, logits);
        for (j = 0; j < VOCAB; j++)
            lf[j] = (float)logits[j];
        o->tokens[o->n++] = gang__sample(&smp, lf, &r->sp, n);
        ids[n++] = o->tokens[i];
        if (r->n_stop > 0 && o->tokens[i] == r->stop) {
            memcpy(o->finish, "stop", 5);
            break;
        }
    }
    if (o->finish[0] == '\0')
        memcpy(o->finish, "length", 7);
    o->done = 1;
    gang__sampler_free(&smp);
}

/* Fails unless every request of sc produced exactly what exp holds. */
void check_script(const script *sc, const script_out *exp, const char *what)
{
    uint32_t i, j;

    for (i = 0; i < sc->n_reqs; i++) {
        const script_out *o = &sc->out[i];

        if (o->bad || !o->done)
            fail_msg("%s: request %llu: %s", what, (unsigned long long)sc->reqs[i].id,
                     o->bad ? "events out of order" : "never finished");
        if (strcmp(o->finish, exp[i].finish) != 0 || o->n != exp[i].n)
            fail_msg("%s: request %llu: %u tokens (%s), expected %u (%s)", what,
                     (unsigned long long)sc->reqs[i].id, o->n, o->finish, exp[i].n, exp[i].finish);
        for (j = 0; j < o->n; j++)
            if (o->tokens[j] != exp[i].tokens[j])
                fail_msg("%s: request %llu: token %u is %d, expected %d", what,
                         (unsigned long long)sc->reqs[i].id, j, o->tokens[j], exp[i].tokens[j]);
    }
}

/* The expected outputs of a script: the reference forward, greedy or sampled. */
void expected_outputs(const full_model *fm, const script *sc, script_out *exp)
{
    uint32_t i;

    for (i = 0; i < sc->n_reqs; i++)
        ref_sampled(fm, &sc->reqs[i], &exp[i]);
}

/* ---------------------------------------------------------------------------------
 * The serving path across layouts
 * --------------------------------------------------------------------------------- */
void make_logits_script(script *one)
{
    uint32_t i;

    memset(one, 0, sizeof(*one));
    for (i = 0; i < 3; i++)
        add_req(one, 900 + i, 0, 2, 1, greedy);
    one->steps = 1;
}

void check_step_logits(gang_engine *e, gang_engine *ref_e, const full_model *fm, const script *one,
                       const char *what)
{
    double ref[VOCAB];
    const float *got, *want;
    uint32_t i;

    for (i = 0; i < one->n_reqs; i++) {
        got = gang__engine_logits(e, i);
        want = gang__engine_logits(ref_e, i);
        if (got == NULL || want == NULL)
            fail_msg("%s: no logits for sequence %u", what, i);
        if (!(rel_err_ff(got, want, VOCAB) <= REL_TOL))
            fail_msg("%s: sequence %u: logits differ from the single rank's by %g", what, i,
                     rel_err_ff(got, want, VOCAB));
        ref_logits(fm, one->reqs[i].prompt, one->reqs[i].n_prompt, ref);
        if (!(rel_err_fd(got, ref, VOCAB) <= REL_TOL))
            fail_msg("%s: sequence %u: logits differ from the reference by %g", what, i,
                     rel_err_fd(got, ref, VOCAB));
    }
}

void check_layout(const full_model *fm, script *sc, const script_out *exp, uint32_t tp, uint32_t pp,
                  uint32_t microbatches)
{
    static rank_ctx xs[MAX_RANKS];
    static script one;
    gang_engine_config cfg = engine_config(microbatches);
    uint32_t r, last_root = (pp - 1) * tp;
    char what[64];
    layout lo, l1;

    snprintf(what, sizeof(what), "tp=%u pp=%u microbatches=%u", tp, pp, microbatches);
    layout_init(&lo, fm, tp, pp, &cfg);
    for (r = 0; r < lo.n; r++)
        assert_int_equal(gang_engine_slots(lo.engines[r]), 3);
    run_gang(tp, pp, lo.engines, sc, script_body, NULL, xs);
    for (r = 0; r < lo.n; r++)
        if (xs[r].body_rc != 0)
            fail_msg("%s: rank %u: %s", what, r, gang_err_name(xs[r].body_rc));
    check_script(sc, exp, what);

    /* One step of three sequences: the last stage's logits equal the single rank's. */
    make_logits_script(&one);
    run_gang(tp, pp, lo.engines, &one, script_body, NULL, xs);
    for (r = 0; r < lo.n; r++)
        if (xs[r].body_rc != 0)
            fail_msg("%s, logits step: rank %u: %s", what, r, gang_err_name(xs[r].body_rc));
    layout_init(&l1, fm, 1, 1, &cfg);
    make_logits_script(&one);
    script_run_local(l1.engines[0], &one);
    check_step_logits(lo.engines[last_root], l1.engines[0], fm, &one, what);
    for (r = 0; r < lo.n; r++)
        if (r != last_root && gang__engine_logits(lo.engines[r], 0) != NULL)
            fail_msg("%s: rank %u holds logits", what, r);
    layout_free(&l1);
    layout_free(&lo);
}
