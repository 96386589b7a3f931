/*
 * Tests of the one pipeline schedule (parallel/pipeline.c, gang_pipeline_run) and of the
 * serving path built on it (engine/engine-run.c's callbacks around the batched TP layers).
 *
 * The schedule alone, with recording callbacks: the exact order of every stage's
 * operations, that every send meets a recv of the same microbatch, peer and tag, and
 * that the whole gang completes under RENDEZVOUS semantics (a send finishes only when
 * its receiver is at the matching recv: NCCL, MPI) for P in 1..4 and K in 1..9; the
 * uneven microbatch rule; argument checks; the deadline (checked before every callback)
 * and a callback's error stopping the run.
 *
 * The serving path: the engine of model/ on a random Llama model (tests/unit/
 * engine-fixture.c) over the socket backend, ranks as threads, for TP in {1, 2, 4} x PP
 * in {1, 2, 3} x microbatches in {1, 2, 3}: the tokens of a script of eight concurrent
 * requests (greedy and seeded sampling, chunked prefill) equal the naive reference's,
 * and the last stage's logits of a three-sequence step equal the single rank's within
 * 1e-4. An abort in the middle of a 2 x 3 step makes every rank return GANG_EABORTED
 * within 1 s; the next generation refuses communicators of the wrong sizes and then
 * serves the reference tokens again.
 */
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

/* ---------------------------------------------------------------------------------
 * Recording callbacks
 * --------------------------------------------------------------------------------- */
#define MAX_STAGES 4
#define MAX_OPS 64

enum { OP_WORK, OP_SEND_ACT, OP_RECV_ACT, OP_SEND_RESULT, OP_RECV_RESULT };

typedef struct rec_op {
    int op;
    uint32_t index, first, count, peer, tag;
} rec_op;

typedef struct rec_stage {
    rec_op ops[MAX_OPS];
    uint32_t n;
    char text[1024];  /* the same, as "W0 SA0>1#0 ..." */
    uint32_t fail_at; /* the op number that returns fail_rc (UINT32_MAX: none) */
    int fail_rc;
    uint32_t sleep_ms; /* every WORK sleeps this long */
} rec_stage;

static int rec(void *ctx, int op, const gang_pipeline_mb *mb, uint32_t peer, uint32_t tag)
{
    static const char *names[] = {"W", "SA", "RA", "SR", "RR"};
    rec_stage *s = ctx;
    size_t len = strlen(s->text);

    if (s->n >= MAX_OPS)
        return GANG_EINTERNAL;
    s->ops[s->n] = (rec_op){op, mb->index, mb->first, mb->count, peer, tag};
    if (op == OP_WORK)
        snprintf(s->text + len, sizeof(s->text) - len, "W%u ", mb->index);
    else
        snprintf(s->text + len, sizeof(s->text) - len, "%s%u%s%u#%u ", names[op], mb->index,
                 op == OP_SEND_ACT || op == OP_SEND_RESULT ? ">" : "<", peer, tag);
    if (op == OP_WORK && s->sleep_ms > 0)
        gang_sleep_ms(s->sleep_ms);
    return s->n++ == s->fail_at ? s->fail_rc : 0;
}

static int rec_work(void *ctx, const gang_pipeline_mb *mb, uint64_t deadline)
{
    (void)deadline;
    return rec(ctx, OP_WORK, mb, 0, 0);
}

#define REC_XFER(name, op)                                                                         \
    static int name(void *ctx, const gang_pipeline_mb *mb, uint32_t peer, uint32_t tag,            \
                    uint64_t deadline)                                                             \
    {                                                                                              \
        (void)deadline;                                                                            \
        return rec(ctx, op, mb, peer, tag);                                                        \
    }
REC_XFER(rec_send_act, OP_SEND_ACT)
REC_XFER(rec_recv_act, OP_RECV_ACT)
REC_XFER(rec_send_result, OP_SEND_RESULT)
REC_XFER(rec_recv_result, OP_RECV_RESULT)

static gang_pipeline_ops rec_ops(rec_stage *s)
{
    return (gang_pipeline_ops){.ctx = s,
                               .work = rec_work,
                               .send_act = rec_send_act,
                               .recv_act = rec_recv_act,
                               .send_result = rec_send_result,
                               .recv_result = rec_recv_result};
}

/* Runs every stage of a P-stage, K-microbatch schedule over `batch` units into st[]. */
static void record(rec_stage *st, uint32_t p, uint32_t batch, uint32_t k)
{
    uint32_t s;

    for (s = 0; s < p; s++) {
        gang_pipeline_ops ops = rec_ops(&st[s]);

        memset(&st[s], 0, sizeof(st[s]));
        st[s].fail_at = UINT32_MAX;
        assert_int_equal(gang_pipeline_run(&ops, s, p, batch, k, gang_deadline_after(10000)), 0);
    }
}

static int is_send(int op)
{
    return op == OP_SEND_ACT || op == OP_SEND_RESULT;
}

/*
 * Replays the recorded stages under rendezvous semantics: a WORK completes alone, a send
 * only together with its receiver's matching recv (same microbatch, sizes and tag, the
 * right peers, activation to activation and result to result). Fails on a mismatch or
 * when no stage can move while some have operations left (a deadlock).
 */
static void replay_rendezvous(const rec_stage *st, uint32_t p, uint32_t k)
{
    uint32_t pc[MAX_STAGES] = {0}, s, left, moved;

    do {
        moved = 0;
        left = 0;
        for (s = 0; s < p; s++) {
            const rec_op *a, *b;

            if (pc[s] >= st[s].n)
                continue;
            left++;
            a = &st[s].ops[pc[s]];
            if (a->op == OP_WORK) {
                pc[s]++;
                moved = 1;
                continue;
            }
            if (!is_send(a->op) || pc[a->peer] >= st[a->peer].n)
                continue;
            b = &st[a->peer].ops[pc[a->peer]];
            if (b->op != a->op + 1 || b->peer != s)
                continue; /* the receiver is elsewhere: wait */
            if (b->index != a->index || b->first != a->first || b->count != a->count ||
                b->tag != a->tag)
                fail_msg("P=%u K=%u: stage %u sends mb %u tag %u, stage %u receives mb %u tag %u",
                         p, k, s, a->index, a->tag, a->peer, b->index, b->tag);
            pc[s]++;
            pc[a->peer]++;
            moved = 1;
        }
    } while (moved);
    if (left != 0)
        fail_msg("P=%u K=%u: the schedule deadlocks under rendezvous", p, k);
}

/* ---------------------------------------------------------------------------------
 * Tests: the schedule
 * --------------------------------------------------------------------------------- */

/* The exact order of every stage for P = 3, K = 4 (and P = 1), over 7 units. */
static void test_schedule_order(void **state)
{
    static rec_stage st[MAX_STAGES];

    (void)state;
    record(st, 3, 7, 4);
    assert_string_equal(st[0].text, "W0 SA0>1#0 W1 SA1>1#1 W2 RR0<2#4 SA2>1#2 W3 RR1<2#5 "
                                    "SA3>1#3 RR2<2#6 RR3<2#7 ");
    assert_string_equal(st[1].text, "RA0<0#0 W0 SA0>2#0 RA1<0#1 W1 SA1>2#1 RA2<0#2 W2 SA2>2#2 "
                                    "RA3<0#3 W3 SA3>2#3 ");
    assert_string_equal(st[2].text, "RA0<1#0 W0 SR0>0#4 RA1<1#1 W1 SR1>0#5 RA2<1#2 W2 SR2>0#6 "
                                    "RA3<1#3 W3 SR3>0#7 ");
    /* Uneven units: 7 over 4 microbatches is 2 + 2 + 2 + 1. */
    assert_int_equal(st[1].ops[1].first, 0);
    assert_int_equal(st[1].ops[1].count, 2);
    assert_int_equal(st[1].ops[10].first, 6);
    assert_int_equal(st[1].ops[10].count, 1);
    /* One stage: the microbatches in turn, no transfers (and none needed). */
    record(st, 1, 3, 3);
    assert_string_equal(st[0].text, "W0 W1 W2 ");
}

/* Every P in 1..4 and K in 1..9 completes under rendezvous and matches its messages. */
static void test_schedule_rendezvous(void **state)
{
    static rec_stage st[MAX_STAGES];
    uint32_t p, k;

    (void)state;
    for (p = 1; p <= MAX_STAGES; p++) {
        for (k = 1; k <= 9; k++) {
            record(st, p, 11, k);
            replay_rendezvous(st, p, k);
        }
    }
}

/* The uneven microbatch rule and the argument checks of the schedule. */
static void test_microbatch_and_invalid(void **state)
{
    static const uint32_t want_first[] = {0, 3, 6}, want_count[] = {3, 3, 2};
    static rec_stage st;
    gang_pipeline_ops ops = rec_ops(&st);
    uint64_t dl = gang_deadline_after(10000), left;
    uint32_t first, count, i;

    (void)state;
    for (i = 0; i < 3; i++) {
        assert_int_equal(gang_pipeline_microbatch(8, 3, i, &first, &count), 0);
        assert_int_equal(first, want_first[i]);
        assert_int_equal(count, want_count[i]);
    }
    assert_int_equal(gang_pipeline_microbatch(8, 9, 0, &first, &count), GANG_EINVAL);
    assert_int_equal(gang_pipeline_microbatch(8, 0, 0, &first, &count), GANG_EINVAL);
    assert_int_equal(gang_pipeline_microbatch(8, 4, 4, &first, &count), GANG_EINVAL);
    assert_int_equal(gang_pipeline_microbatch(8, 4, 0, NULL, &count), GANG_EINVAL);

    memset(&st, 0, sizeof(st));
    st.fail_at = UINT32_MAX;
    assert_int_equal(gang_pipeline_run(NULL, 0, 1, 4, 2, dl), GANG_EINVAL);
    assert_int_equal(gang_pipeline_run(&ops, 2, 2, 4, 2, dl), GANG_EINVAL);
    assert_int_equal(gang_pipeline_run(&ops, 0, 0, 4, 2, dl), GANG_EINVAL);
    assert_int_equal(gang_pipeline_run(&ops, 0, 2, 4, 0, dl), GANG_EINVAL);
    assert_int_equal(gang_pipeline_run(&ops, 0, 2, 4, 5, dl), GANG_EINVAL);
    ops.recv_result = NULL;
    assert_int_equal(gang_pipeline_run(&ops, 0, 2, 4, 2, dl), GANG_EINVAL);
    assert_int_equal(gang_pipeline_run(&ops, 0, 1, 4, 2, dl), 0); /* not needed on 1 stage */
    ops.work = NULL;
    assert_int_equal(gang_pipeline_run(&ops, 0, 1, 4, 2, dl), GANG_EINVAL);
    assert_int_equal(st.n, 2);
    /* An empty step calls nothing. */
    ops = rec_ops(&st);
    assert_int_equal(gang_pipeline_run(&ops, 1, 3, 0, 0, dl), 0);
    assert_int_equal(st.n, 2);
    assert_int_equal(gang_deadline_left(dl, NULL), GANG_EINVAL);
    assert_int_equal(gang_deadline_left(dl, &left), 0);
    assert_true(left >= 1 && left <= 10000);
    assert_int_equal(gang_deadline_after(UINT64_MAX), UINT64_MAX);
}

/* The deadline is checked before every callback; a callback's error stops the run. */
static void test_deadline_and_errors(void **state)
{
    static rec_stage st;
    gang_pipeline_ops ops = rec_ops(&st);
    uint64_t t0;

    (void)state;
    /* Already past: nothing is called. */
    memset(&st, 0, sizeof(st));
    st.fail_at = UINT32_MAX;
    assert_int_equal(gang_pipeline_run(&ops, 1, 2, 4, 4, gang_now_ms() - 1), GANG_ETIMEDOUT);
    assert_int_equal(st.n, 0);
    /* Work of 40 ms per microbatch against 100 ms: the third or fourth step times out. */
    st.sleep_ms = 40;
    t0 = gang_now_ms();
    assert_int_equal(gang_pipeline_run(&ops, 0, 1, 8, 8, gang_deadline_after(100)), GANG_ETIMEDOUT);
    assert_true(st.n >= 2 && st.n <= 4);
    assert_true(gang_now_ms() - t0 < 1000);
    /* The third operation of a middle stage fails: the run returns its error at once. */
    memset(&st, 0, sizeof(st));
    st.fail_at = 2;
    st.fail_rc = GANG_EPEER;
    assert_int_equal(gang_pipeline_run(&ops, 1, 3, 4, 4, gang_deadline_after(10000)), GANG_EPEER);
    assert_int_equal(st.n, 3);
    assert_string_equal(st.text, "RA0<0#0 W0 SA0>2#0 ");
}

/* ---------------------------------------------------------------------------------
 * Tests: the serving path
 * --------------------------------------------------------------------------------- */

/* The engine's schedule over TP {1, 2, 4} x PP {1, 2, 3} x microbatches {1, 2, 3}. */
static void test_engine_equivalence_matrix(void **state)
{
    static const uint32_t tps[] = {1, 2, 4}, pps[] = {1, 2, 3};
    static script sc;
    static script_out exp[MAX_REQS];
    full_model *fm = full_model_new(21, 0);
    uint32_t i, j, mb;

    (void)state;
    make_script(fm, &sc);
    expected_outputs(fm, &sc, exp);
    for (i = 0; i < 3; i++)
        for (j = 0; j < 3; j++)
            for (mb = 1; mb <= 3; mb++)
                check_layout(fm, &sc, exp, tps[i], pps[j], mb);
    free(fm);
}

#define ABORT_TP 2
#define ABORT_PP 3
#define SLEEPER 2 /* stage 1, tp rank 0 */
static _Atomic uint64_t abort_at_ms;

/*
 * Every rank starts stepping the script except SLEEPER, which waits for the abort: its
 * TP peer blocks in an all-reduce, stage 0 in a send or a recv, stage 2 in a recv.
 */
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

/* Communicators of the wrong sizes (tp and pp swapped, no world) are refused first. */
static int bad_comms_body(rank_ctx *x, gang_comm *world, gang_comm *tp, gang_comm *pp)
{
    gang_kernels *k = NULL;
    int rc, rc2;

    rc = gang_kernels_open("cpu", &k);
    if (rc != 0)
        return rc;
    rc = gang_engine_step(x->engine, k, world, pp, NULL, tp, STEP_TIMEOUT_MS);
    rc2 = gang_engine_step(x->engine, k, NULL, tp, NULL, pp, STEP_TIMEOUT_MS);
    gang_kernels_close(k);
    if (rc != GANG_EINVAL || rc2 != GANG_EINVAL)
        return GANG_EINTERNAL;
    return script_body(x, world, tp, pp);
}

static void test_engine_abort_then_next_generation(void **state)
{
    static rank_ctx xs[MAX_RANKS];
    static script sc;
    static script_out exp[MAX_REQS];
    gang_engine_config cfg = engine_config(3);
    full_model *fm = full_model_new(31, 0);
    layout lo;
    uint32_t r;

    (void)state;
    make_script(fm, &sc);
    expected_outputs(fm, &sc, exp);
    layout_init(&lo, fm, ABORT_TP, ABORT_PP, &cfg);
    atomic_store(&abort_at_ms, 0);
    run_gang(ABORT_TP, ABORT_PP, lo.engines, &sc, abort_body, abort_controller, xs);
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
    run_gang(ABORT_TP, ABORT_PP, lo.engines, &sc, bad_comms_body, NULL, xs);
    for (r = 0; r < lo.n; r++)
        if (xs[r].body_rc != 0)
            fail_msg("next generation: rank %u: %s", r, gang_err_name(xs[r].body_rc));
    check_script(&sc, exp, "after the abort");
    layout_free(&lo);
    free(fm);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_schedule_order),
        cmocka_unit_test(test_schedule_rendezvous),
        cmocka_unit_test(test_microbatch_and_invalid),
        cmocka_unit_test(test_deadline_and_errors),
        cmocka_unit_test(test_engine_equivalence_matrix),
        cmocka_unit_test(test_engine_abort_then_next_generation),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
