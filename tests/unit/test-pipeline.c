/*
 * Tests of the pipeline (parallel/pipeline.c): a random stack of small Llama layers and a
 * random batch of 8 sequences x 3 tokens. The reference is the same layers applied one
 * after the other on one rank (tp = 1, no communicator). For TP in {1, 2, 4}, PP in
 * {1, 2, 3} and microbatches in {1, 2, 3, 4, 8} (3 is the uneven rule), with the ranks as
 * threads over the socket backend on 127.0.0.1, every TP rank of stage 0 gets the
 * reference output within 1e-4 relative error; also with 7 layers over 2 and 3 stages
 * (uneven layer split). A gang abort in the middle of a pipelined step makes every rank
 * return GANG_EABORTED within 1 s, and the next generation's communicators, on the same
 * pipelines, compute the reference again.
 */
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "test-util.h"
#include "ganglion/comm.h"
#include "ganglion/kernels.h"
#include "ganglion/parallel.h"
#include "stack-fixture.h"

#define MAX_RANKS 12
#define OP_TIMEOUT_MS 20000

static const uint32_t mb_counts[] = {1, 2, 3, 4, 8};
#define N_MB (sizeof(mb_counts) / sizeof(mb_counts[0]))

/* ---------------------------------------------------------------------------------
 * A gang of threads over the socket backend, with TP and PP sub-communicators.
 * --------------------------------------------------------------------------------- */
typedef struct rank_ctx rank_ctx;
typedef int (*rank_body)(rank_ctx *x, gang_comm *tp, gang_comm *pp);
typedef void (*gang_controller)(rank_ctx *xs, uint32_t n);

typedef struct gang_run {
    tu_gang g;  /* the threads, their communicators and barrier (test-util.h) */
    uint32_t n, tp, pp;
    rank_body body;
    stack_model *m;
} gang_run;

struct rank_ctx {
    gang_run *run;
    uint32_t rank;
    gang_comm_listener *listener; /* rank 0 only */
    gang_comm *_Atomic comms[3];  /* world, tp, pp; published for the controller */
    gang_pipeline *pipe;          /* this rank's pipeline, made by main */
    int init_rc, body_rc;
    uint64_t done_ms;     /* when the body returned */
    float out[N_MB][ACT]; /* stage 0: the output for each microbatch count */
};

static void *rank_main(void *arg)
{
    rank_ctx *x = arg;

    x->init_rc = tu_gang_rank_enter(&x->run->g, x->rank, x->listener, x->comms);
    if (x->init_rc == 0)
        x->body_rc = x->run->body(x, atomic_load(&x->comms[1]), atomic_load(&x->comms[2]));
    x->done_ms = gang_now_ms();
    tu_gang_rank_leave(&x->run->g, x->comms);
    return NULL;
}

/*
 * Runs body on tp x pp ranks with the pipelines pipes[] (made by the caller, so that they
 * outlive a generation); controller (may be NULL) runs on the main thread meanwhile.
 */
static void run_gang(uint32_t tp, uint32_t pp, stack_model *m, gang_pipeline **pipes, rank_body body,
                     gang_controller controller, rank_ctx *xs)
{
    static gang_run run;
    pthread_t th[MAX_RANKS];
    uint32_t r, n = tp * pp;

    memset(&run, 0, sizeof(run));
    memset(xs, 0, sizeof(*xs) * n);
    run.n = n;
    run.tp = tp;
    run.pp = pp;
    run.body = body;
    run.m = m;
    for (r = 0; r < n; r++) {
        xs[r].run = &run;
        xs[r].rank = r;
        xs[r].pipe = pipes[r];
    }
    tu_gang_start(&run.g, n, tp, controller != NULL, &xs[0].listener, rank_main, xs,
                  sizeof(xs[0]), th);
    if (controller != NULL)
        controller(xs, n);
    tu_gang_finish(&run.g, th);
    for (r = 0; r < n; r++)
        if (xs[r].init_rc != 0)
            fail_msg("rank %u: comm init %s", r, gang_err_name(xs[r].init_rc));
}

static void make_pipes(uint32_t tp, uint32_t pp, const stack_model *m, gang_pipeline **pipes)
{
    gang_topology t;
    gang_pipeline_config cfg;
    uint32_t r;

    assert_int_equal(stack_topology(tp, pp, m->n_layers, &t), 0);
    for (r = 0; r < tp * pp; r++) {
        cfg = (gang_pipeline_config){.topo = &t,
                                     .rank = r,
                                     .layers = m->w,
                                     .rope_theta = ROPE_THETA,
                                     .norm_eps = NORM_EPS,
                                     .max_batch = BATCH,
                                     .max_tokens = TOKENS};
        assert_int_equal(gang_pipeline_init(&cfg, &pipes[r]), 0);
    }
}

static void free_pipes(uint32_t n, gang_pipeline **pipes)
{
    uint32_t r;

    for (r = 0; r < n; r++)
        gang_pipeline_free(pipes[r]);
}

/* Every microbatch count in turn on the same pipeline; stage 0 keeps each output. */
static int forward_body(rank_ctx *x, gang_comm *tp, gang_comm *pp)
{
    gang_kernels *k = NULL;
    int is_first = x->rank < x->run->tp, rc;
    size_t i;

    rc = gang_kernels_open("cpu", &k);
    if (rc != 0)
        return rc;
    for (i = 0; i < N_MB; i++) {
        if (is_first)
            memcpy(x->out[i], x->run->m->x, sizeof(x->out[i]));
        rc = gang_pipeline_forward(x->pipe, k, tp, pp, is_first ? x->out[i] : NULL, BATCH, TOKENS,
                                   mb_counts[i], OP_TIMEOUT_MS);
        if (rc != 0)
            break;
    }
    gang_kernels_close(k);
    return rc;
}

/* Checks every stage-0 rank's outputs against the reference. */
static void check_outputs(const rank_ctx *xs, uint32_t tp, uint32_t pp, const stack_model *m)
{
    uint32_t r;
    size_t i;

    for (r = 0; r < tp * pp; r++)
        if (xs[r].body_rc != 0)
            fail_msg("tp=%u pp=%u layers=%u rank=%u: %s", tp, pp, m->n_layers, r,
                     gang_err_name(xs[r].body_rc));
    for (r = 0; r < tp; r++) {
        for (i = 0; i < N_MB; i++) {
            double e = stack_rel_err(xs[r].out[i], m->ref, ACT);

            if (!(e <= REL_TOL))
                fail_msg("tp=%u pp=%u layers=%u microbatches=%u rank=%u: relative error %g", tp, pp,
                         m->n_layers, mb_counts[i], r, e);
        }
    }
}

static void check_layout(stack_model *m, uint32_t tp, uint32_t pp)
{
    static rank_ctx xs[MAX_RANKS];
    gang_pipeline *pipes[MAX_RANKS];

    make_pipes(tp, pp, m, pipes);
    run_gang(tp, pp, m, pipes, forward_body, NULL, xs);
    check_outputs(xs, tp, pp, m);
    free_pipes(tp * pp, pipes);
}

/* ---------------------------------------------------------------------------------
 * Tests
 * --------------------------------------------------------------------------------- */

/* The uneven microbatch rule and the argument checks. */
static void test_microbatch_and_invalid(void **state)
{
    static const uint32_t want_first[] = {0, 3, 6}, want_count[] = {3, 3, 2};
    gang_pipeline_config cfg;
    gang_pipeline *p = NULL;
    gang_kernels *k = NULL;
    gang_topology t;
    uint32_t first, count, i;
    float x[ACT];
    stack_model *m;

    (void)state;
    for (i = 0; i < 3; i++) {
        assert_int_equal(gang_pipeline_microbatch(8, 3, i, &first, &count), 0);
        assert_int_equal(first, want_first[i]);
        assert_int_equal(count, want_count[i]);
    }
    assert_int_equal(gang_pipeline_microbatch(8, 9, 0, &first, &count), GANG_EINVAL);
    assert_int_equal(gang_pipeline_microbatch(8, 0, 0, &first, &count), GANG_EINVAL);
    assert_int_equal(gang_pipeline_microbatch(8, 4, 4, &first, &count), GANG_EINVAL);

    m = stack_model_new(6);
    assert_int_equal(stack_topology(2, 3, 6, &t), 0);
    cfg = (gang_pipeline_config){.topo = &t,
                                 .rank = 6,
                                 .layers = m->w,
                                 .rope_theta = ROPE_THETA,
                                 .norm_eps = NORM_EPS,
                                 .max_batch = BATCH,
                                 .max_tokens = TOKENS};
    assert_int_equal(gang_pipeline_init(&cfg, &p), GANG_EINVAL); /* rank outside the gang */
    assert_null(p);
    cfg.rank = 0;
    cfg.max_batch = 0;
    assert_int_equal(gang_pipeline_init(&cfg, &p), GANG_EINVAL);
    cfg.max_batch = UINT32_MAX;
    cfg.max_tokens = UINT32_MAX;
    assert_int_equal(gang_pipeline_init(&cfg, &p), GANG_EINVAL);
    cfg.max_batch = BATCH;
    cfg.max_tokens = TOKENS;
    cfg.rope_theta = 0.0f;
    assert_int_equal(gang_pipeline_init(&cfg, &p), GANG_EINVAL);
    cfg.rope_theta = ROPE_THETA;
    assert_int_equal(gang_pipeline_init(&cfg, &p), 0);
    assert_int_equal(gang_pipeline_place(p)->pp_stage, 0);
    assert_int_equal(gang_kernels_open("cpu", &k), 0);
    /* A 2 x 3 gang needs both communicators; K must be in [1, B]; B and T must fit. */
    assert_int_equal(gang_pipeline_forward(p, k, NULL, NULL, x, BATCH, TOKENS, 2, 1000),
                     GANG_EINVAL);
    assert_int_equal(gang_pipeline_forward(p, k, NULL, NULL, x, BATCH, TOKENS, 9, 1000),
                     GANG_EINVAL);
    assert_int_equal(gang_pipeline_forward(p, k, NULL, NULL, x, BATCH + 1, TOKENS, 1, 1000),
                     GANG_EINVAL);
    assert_int_equal(gang_pipeline_forward(p, k, NULL, NULL, x, BATCH, TOKENS + 1, 1, 1000),
                     GANG_EINVAL);
    assert_int_equal(gang_pipeline_forward(p, k, NULL, NULL, NULL, BATCH, TOKENS, 1, 1000),
                     GANG_EINVAL);
    gang_pipeline_free(p);
    gang_pipeline_free(NULL);

    /* A single rank needs no communicator at all and equals the reference. */
    assert_int_equal(stack_topology(1, 1, 6, &t), 0);
    assert_int_equal(gang_pipeline_init(&cfg, &p), 0);
    memcpy(x, m->x, sizeof(x));
    assert_int_equal(gang_pipeline_forward(p, k, NULL, NULL, x, BATCH, TOKENS, 4, OP_TIMEOUT_MS),
                     0);
    assert_true(stack_rel_err(x, m->ref, ACT) <= REL_TOL);
    gang_pipeline_free(p);
    gang_kernels_close(k);
    free(m);
}

/* 6 layers, TP in {1, 2, 4} x PP in {1, 2, 3} (up to 12 ranks), every microbatch count. */
static void test_equivalence_matrix(void **state)
{
    static const uint32_t tps[] = {1, 2, 4}, pps[] = {1, 2, 3};
    stack_model *m = stack_model_new(6);
    size_t i, j;

    (void)state;
    for (i = 0; i < 3; i++)
        for (j = 0; j < 3; j++)
            check_layout(m, tps[i], pps[j]);
    free(m);
}

/* 7 layers: stages of 4 + 3 and 3 + 2 + 2 layers. */
static void test_equivalence_uneven_layers(void **state)
{
    stack_model *m = stack_model_new(7);

    (void)state;
    check_layout(m, 1, 2);
    check_layout(m, 2, 2);
    check_layout(m, 1, 3);
    check_layout(m, 2, 3);
    free(m);
}

/* ---------------------------------------------------------------------------------
 * Abort in the middle of a pipelined step.
 * --------------------------------------------------------------------------------- */
#define ABORT_TP 2
#define ABORT_PP 3
#define SLEEPER 2 /* stage 1, tp rank 0 */
static _Atomic uint64_t abort_at_ms;

/*
 * Every rank enters gang_pipeline_forward with 4 microbatches, except SLEEPER, which
 * waits until the gang has been aborted before its first recv: so its TP peer blocks in
 * an all-reduce, stage 0 in a recv of a result and stage 2 in a recv of activations.
 */
static int abort_body(rank_ctx *x, gang_comm *tp, gang_comm *pp)
{
    gang_kernels *k = NULL;
    int is_first = x->rank < x->run->tp, rc;

    rc = gang_kernels_open("cpu", &k);
    if (rc != 0)
        return rc;
    if (is_first)
        memcpy(x->out[0], x->run->m->x, sizeof(x->out[0]));
    while (x->rank == SLEEPER && atomic_load(&abort_at_ms) == 0)
        gang_sleep_ms(2);
    rc = gang_pipeline_forward(x->pipe, k, tp, pp, is_first ? x->out[0] : NULL, BATCH, TOKENS, 4,
                               30000);
    gang_kernels_close(k);
    return rc;
}

static void abort_controller(rank_ctx *xs, uint32_t n)
{
    uint32_t r;
    int i;

    gang_sleep_ms(300); /* let every rank block inside the pipelined step */
    atomic_store(&abort_at_ms, gang_now_ms());
    for (r = 0; r < n; r++)
        for (i = 0; i < 3; i++)
            gang_comm_abort(atomic_load(&xs[r].comms[i]));
}

static void test_abort_then_next_generation(void **state)
{
    static rank_ctx xs[MAX_RANKS];
    gang_pipeline *pipes[MAX_RANKS];
    stack_model *m = stack_model_new(6);
    uint32_t r;

    (void)state;
    make_pipes(ABORT_TP, ABORT_PP, m, pipes);
    atomic_store(&abort_at_ms, 0);
    run_gang(ABORT_TP, ABORT_PP, m, pipes, abort_body, abort_controller, xs);
    for (r = 0; r < ABORT_TP * ABORT_PP; r++) {
        uint64_t took = xs[r].done_ms - atomic_load(&abort_at_ms);

        if (xs[r].body_rc != GANG_EABORTED)
            fail_msg("rank %u returned %s, not GANG_EABORTED", r, gang_err_name(xs[r].body_rc));
        if (xs[r].done_ms < atomic_load(&abort_at_ms) || took >= 1000)
            fail_msg("rank %u returned %lld ms after the abort", r,
                     (long long)xs[r].done_ms - (long long)atomic_load(&abort_at_ms));
    }
    /* The next generation: new communicators, the same pipelines (weights stay loaded). */
    run_gang(ABORT_TP, ABORT_PP, m, pipes, forward_body, NULL, xs);
    check_outputs(xs, ABORT_TP, ABORT_PP, m);
    free_pipes(ABORT_TP * ABORT_PP, pipes);
    free(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_microbatch_and_invalid),
        cmocka_unit_test(test_equivalence_matrix),
        cmocka_unit_test(test_equivalence_uneven_layers),
        cmocka_unit_test(test_abort_then_next_generation),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
