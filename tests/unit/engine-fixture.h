/*
 * The fixture of the engine tests (test-engine.c): a small random Llama / Qwen2 model
 * built by hand per rank, an independent naive reference forward of it in double, request
 * scripts and their expected outputs, and a gang of rank threads over the socket backend.
 * Every function fails the current cmocka test on a setup error.
 */
#ifndef GANG_TEST_ENGINE_FIXTURE_H
#define GANG_TEST_ENGINE_FIXTURE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "test-util.h"
#include "ganglion/comm.h"
#include "ganglion/kernels.h"
#include "ganglion/engine.h"
#include "ganglion/parallel.h"

#define MAX_RANKS 12 /* tp 4 x pp 3 */
#define HOST "127.0.0.1"
#define STEP_TIMEOUT_MS 20000

/* Model shape: small enough for milliseconds, large enough for TP 2 with GQA. */
#define N_LAYERS 3 /* uneven over 2 stages: 2 + 1 */
#define HIDDEN 32
#define N_HEADS 4
#define N_KV_HEADS 2
#define HEAD_DIM (HIDDEN / N_HEADS)
#define Q_DIM (N_HEADS * HEAD_DIM)
#define KV_DIM (N_KV_HEADS * HEAD_DIM)
#define FFN 48
#define VOCAB 37 /* odd: TP 2 holds 19 + 18 rows, the all-gather pads to 19 */
#define MAX_POS 64
#define ROPE_THETA 10000.0f
#define NORM_EPS 1e-5f
#define REL_TOL 1e-4

/* The full weights of a random model (host f32, Hugging Face layout). */
typedef struct full_layer {
    float attn_norm[HIDDEN], mlp_norm[HIDDEN];
    float wq[Q_DIM * HIDDEN], wk[KV_DIM * HIDDEN], wv[KV_DIM * HIDDEN], wo[HIDDEN * Q_DIM];
    float w_gate[FFN * HIDDEN], w_up[FFN * HIDDEN], w_down[HIDDEN * FFN];
    float bq[Q_DIM], bk[KV_DIM], bv[KV_DIM];
} full_layer;

typedef struct full_model {
    gang_model_config cfg;
    full_layer layer[N_LAYERS];
    gang_layer_weights w[N_LAYERS];
    float embed[VOCAB * HIDDEN];
    float final_norm[HIDDEN];
    float lm_head[VOCAB * HIDDEN];
} full_model;

/* Scripts: requests that arrive at given steps, and what rank 0 saw of them. */
#define MAX_REQS 10
#define MAX_GEN 16
#define MAX_PROMPT 24

typedef struct script_req {
    uint64_t id;
    uint32_t arrive; /* the step before which it is submitted */
    uint32_t n_prompt;
    int32_t prompt[MAX_PROMPT];
    uint32_t max_tokens;
    gang_sampling sp;
    uint32_t n_stop;
    int32_t stop;
    uint32_t ignore_eos, logprobs, top_logprobs; /* copied into the request */
} script_req;

typedef struct script_out {
    int32_t tokens[MAX_GEN];
    uint32_t n;
    float logprob[MAX_GEN]; /* the TOKEN events' logprobs, when the request asked */
    uint32_t n_top[MAX_GEN];
    int32_t top_ids[MAX_GEN][GANG_MAX_TOP_LOGPROBS];
    float top_lp[MAX_GEN][GANG_MAX_TOP_LOGPROBS];
    char finish[8];
    int done;
    int bad; /* an event out of order, or for an unknown id */
} script_out;

typedef struct script {
    script_req reqs[MAX_REQS];
    uint32_t n_reqs;
    uint32_t steps;
    script_out out[MAX_REQS];
} script;

/* A gang of threads over the socket backend, with TP and PP sub-communicators. */
typedef struct rank_ctx rank_ctx;
typedef int (*rank_body)(rank_ctx *x, gang_comm *world, gang_comm *tp, gang_comm *pp);
typedef void (*gang_controller)(rank_ctx *xs, uint32_t n);

typedef struct gang_run {
    tu_gang g; /* the threads, their communicators and barrier (test-util.h) */
    uint32_t n, tp, pp;
    rank_body body;
    script *sc;
    gang_kernels **kernels; /* [n] each rank's handle, or NULL: ranks open "cpu" */
} gang_run;

struct rank_ctx {
    gang_run *run;
    uint32_t rank;
    gang_comm_listener *listener;
    gang_comm *_Atomic comms[3]; /* world, tp, pp; published for the controller */
    gang_engine *engine;
    int init_rc, body_rc;
    uint32_t steps_done; /* script_body: the engine steps that returned 0 */
    uint64_t done_ms;
};

/* The shards and engines of every rank of one layout. */
typedef struct layout {
    uint32_t tp, pp, n;
    gang_model *models[MAX_RANKS];
    gang_engine *engines[MAX_RANKS];
    gang_kernels *kernels[MAX_RANKS]; /* layout_init_on: each rank's handle, else NULL */
} layout;

/* ---- the model ---- */

/* n uniform values in [offset - scale, offset + scale) from the fixture's generator. */
void fill(float *a, size_t n, float scale, float offset);
/* Draws a model from seed (release with free()); with_bias gives Qwen2-like q/k/v biases. */
full_model *full_model_new(uint64_t seed, int with_bias);
/* The validated topology of tp x pp ranks (pp nodes of tp) for the fixture's shape. */
int topology_for(uint32_t tp, uint32_t pp, gang_topology *t);
/* Rank `rank`'s shard of fm for tp x pp, built by hand as gang_model_load would. */
gang_model *shard_new(const full_model *fm, uint32_t tp, uint32_t pp, uint32_t rank);
/* Releases a shard of shard_new (independent of gang_model_free). */
void shard_free(gang_model *m);

/* ---- the naive reference ---- */

/* The logits [VOCAB] of the last position of ids [n] (n <= MAX_POS), in double. */
void ref_logits(const full_model *fm, const int32_t *ids, size_t n, double *logits);
/* The argmax of x [n], lowest index on ties. */
int32_t ref_argmax(const double *x, size_t n);
/* The reference's greedy continuation of prompt: max_tokens tokens into out. */
void ref_greedy(const full_model *fm, const int32_t *prompt, uint32_t n_prompt, uint32_t max_tokens,
                int32_t *out);
/* Norm-wise relative error, max |got - ref| / max |ref|, against a double or float row. */
double rel_err_fd(const float *got, const double *ref, size_t n);
double rel_err_ff(const float *got, const float *ref, size_t n);

/* ---- scripts ---- */

extern const gang_sampling greedy;
gang_gen_request req_of(const script_req *s);
/* Rank 0: submits the requests that arrive before step `step`; 0 or the submit error. */
int script_submit(gang_engine *e, script *sc, uint32_t step);
/* Rank 0: drains the events into the script's outputs, checking their order. */
void script_poll(gang_engine *e, script *sc);
/* Runs a script on one rank with no communicators (a 1 x 1 gang); all must finish. */
void script_run_local(gang_engine *e, script *sc);
/* Appends a request whose prompt is derived from its id. */
void add_req(script *sc, uint64_t id, uint32_t arrive, uint32_t n_prompt, uint32_t max_tokens,
             gang_sampling sp);
/* The eight-request script of the equivalence tests (see engine-fixture.c). */
void make_script(const full_model *fm, script *sc);
/* The reference output of one request: the naive logits through the sampler. */
void ref_sampled(const full_model *fm, const script_req *r, script_out *o);
/* The reference outputs of every request of sc. */
void expected_outputs(const full_model *fm, const script *sc, script_out *exp);
/* Fails unless every request of sc produced exactly what exp holds. */
void check_script(const script *sc, const script_out *exp, const char *what);

/* ---- gangs ---- */

/* Runs body on tp x pp rank threads around engines[]; controller (or NULL) meanwhile. */
void run_gang(uint32_t tp, uint32_t pp, gang_engine **engines, script *sc, rank_body body,
              gang_controller controller, rank_ctx *xs);
/* run_gang with each rank stepping on kernels[rank] (NULL: each opens "cpu"). */
void run_gang_on(uint32_t tp, uint32_t pp, gang_engine **engines, gang_kernels **kernels,
                 script *sc, rank_body body, gang_controller controller, rank_ctx *xs);
/* Every rank steps the script's number of steps; rank 0 submits and polls. */
int script_body(rank_ctx *x, gang_comm *world, gang_comm *tp, gang_comm *pp);
/* 3 slots, 40 positions, 6 prompt tokens per step, `microbatches`. */
gang_engine_config engine_config(uint32_t microbatches);
void layout_init(layout *lo, const full_model *fm, uint32_t tp, uint32_t pp,
                 const gang_engine_config *cfg);
/* layout_init with one handle of device per rank (pool 256 MiB each for "cuda"), the
 * shards moved to it and the engines on it; layout_free releases all of it. */
void layout_init_on(layout *lo, const full_model *fm, uint32_t tp, uint32_t pp,
                    const gang_engine_config *cfg, const char *device);
void layout_free(layout *lo);

/* ---- the serving path across layouts (the pipeline schedule and the TP layers) ---- */

/* One step of three 2-token greedy prompts (ids 900..902): three sequences that sample. */
void make_logits_script(script *one);
/*
 * Fails unless the logits engine e holds for each of the n_seq sequences of its last
 * step equal those of ref_e (a 1 x 1 engine that ran the same script) within REL_TOL,
 * and the naive reference's of the matching request of one. what names the layout.
 */
void check_step_logits(gang_engine *e, gang_engine *ref_e, const full_model *fm, const script *one,
                       const char *what);
/*
 * The serving path of a tp x pp gang with `microbatches`: the script sc gives exactly
 * exp, and the one-step logits script gives, on the last stage's TP rank 0, the logits
 * of a single rank (and no other rank holds any).
 */
void check_layout(const full_model *fm, script *sc, const script_out *exp, uint32_t tp, uint32_t pp,
                  uint32_t microbatches);

/* ---- tests of test-engine-gen.c (EOS, penalties, logprobs), run by test-engine.c ---- */
void test_eos(void **state);
void test_kv_layer_spans(void **state);
void test_kv_parts(void **state);
void test_penalties(void **state);
void test_penalties_seeded(void **state);
void test_logprobs(void **state);
void test_gen_validation(void **state);

#endif /* GANG_TEST_ENGINE_FIXTURE_H */
