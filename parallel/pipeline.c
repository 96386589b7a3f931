/*
 * Pipeline parallelism: the one microbatched GPipe schedule of the project. It knows
 * nothing of models: a stage's work and its transfers are callbacks (gang_pipeline_ops,
 * include/ganglion/parallel.h), so the engine serves with it (engine/engine-run.c), the
 * benchmark measures it (bench/bench-pipeline.c) and the tests check it, all through the
 * same code.
 */
#include <stdint.h>
#include <stdlib.h>

#include "ganglion/parallel.h"

int gang_pipeline_microbatch(uint32_t batch, uint32_t microbatches, uint32_t mb, uint32_t *first,
                             uint32_t *count)
{
    uint32_t base, extra;

    if (first == NULL || count == NULL || microbatches == 0 || microbatches > batch ||
        mb >= microbatches)
        return GANG_EINVAL;
    /* As the layer split: batch / K each, and the first batch % K get one more. */
    base = batch / microbatches;
    extra = batch % microbatches;
    *first = mb * base + (mb < extra ? mb : extra);
    *count = base + (mb < extra ? 1u : 0u);
    return 0;
}

/* ---------------------------------------------------------------------------------
 * The schedule
 *
 * P stages, K microbatches; m(k) is microbatch k. Every rank of a stage runs the same
 * sequence of operations (the TP collectives inside its work pair up with its peers'),
 * and talks point-to-point only with the neighbouring stages:
 *
 *   stage 0:       for k = 0 .. K-1:  WORK(k);  if k >= P-1: RECV_RESULT k-P+1 from P-1
 *                                     (tag K + k-P+1);  SEND_ACT m(k) to stage 1 (tag k)
 *                  then RECV_RESULT the results not yet received, in order (tag K + j)
 *   0 < s < P-1:   for k:  RECV_ACT m(k) from s-1 (tag k);  WORK(k);  SEND_ACT to s+1 (tag k)
 *   stage P-1:     for k:  RECV_ACT m(k) from P-2 (tag k);  WORK(k);  SEND_RESULT to 0
 *                          (tag K + k)
 *
 * With unit work per stage, stage s computes m(k) in time slot k + s, which is the GPipe
 * forward: stage s works on k while stage s+1 works on k-1, and the pipeline fills and
 * drains in P-1 slots each. Stage 0 works on m(k) before waiting for result k-P+1, which
 * the last stage produces in the same slot, so that wait overlaps real work.
 *
 * Why it cannot deadlock, even on a backend whose send blocks until the receiver posts
 * its recv (NCCL, MPI rendezvous; the socket backend happens to buffer, but we do not
 * rely on it). Give every operation a key, ordered first by the first number, then by
 * the second in DECREASING order:
 *
 *   message m(k) from stage s to s+1 (s = P-1: the result, to stage 0)   (k + s, s)
 *   the collectives of WORK(k) on stage s                                (k + s - 1, s - 3/2)
 *
 * The two ends of a message share its key, and the collectives of one WORK(k) are shared
 * by the ranks of one stage only, with a key no other operation has. Reading the loops
 * above, every rank issues its operations in strictly increasing key order: a middle
 * stage does RECV m(k) (k+s-1, s-1), WORK(k) (k+s-1, s-3/2), SEND m(k) (k+s, s), RECV
 * m(k+1) (k+s, s-1), ...; stage 0 does WORK(k) (k-1, -3/2), RECV result k-P+1 (k, P-1),
 * SEND m(k) (k, 0), WORK(k+1) (k, -3/2), ... Now take the incomplete operation with the
 * smallest key. Every rank taking part in it has completed all its operations of smaller
 * key, and issues its operations in key order, so it is blocked in exactly this one (or
 * about to issue it): both ends of the message, or all ranks of the collective, are
 * present, so it completes. By induction every operation completes. The rule that makes
 * stage 0 receive result k-P+1 BEFORE sending m(k) is what breaks the cycle stage 0 ->
 * 1 -> ... -> P-1 -> 0 that "send everything, then receive everything" would create once
 * K exceeds the messages the pipe can hold.
 *
 * A callback may skip a transfer (the engine moves its sampled tokens between one TP
 * rank of each end only) as long as both ends skip it: a skipped operation is simply
 * absent from the order above, which stays increasing.
 *
 * A failure anywhere (abort, lost peer, deadline) makes the failing rank return at once;
 * its peers then see GANG_EABORTED (the gang aborts every communicator), GANG_EPEER or
 * their own deadline, so no rank waits past the deadline.
 * --------------------------------------------------------------------------------- */

/* Which callback a schedule step calls. */
enum pipe_op { PIPE_WORK, PIPE_SEND_ACT, PIPE_RECV_ACT, PIPE_SEND_RESULT, PIPE_RECV_RESULT };

/* One run of the schedule: the callbacks and the shape every rank agrees on. */
typedef struct pipe_run {
    const gang_pipeline_ops *ops;
    uint32_t stage, stages, batch, nmb;
    uint64_t deadline;
} pipe_run;

/*
 * Calls the callback `op` on microbatch idx (peer and tag for the transfers), after
 * checking the deadline. Returns 0, GANG_ETIMEDOUT, or the callback's error.
 */
static int pipe_step(const pipe_run *r, enum pipe_op op, uint32_t idx, uint32_t peer, uint32_t tag)
{
    const gang_pipeline_ops *o = r->ops;
    gang_pipeline_mb mb = {.index = idx};
    uint64_t left;
    int rc;

    rc = gang_pipeline_microbatch(r->batch, r->nmb, idx, &mb.first, &mb.count);
    if (rc == 0)
        rc = gang_deadline_left(r->deadline, &left);
    if (rc != 0)
        return rc;
    switch (op) {
    case PIPE_WORK:
        return o->work(o->ctx, &mb, r->deadline);
    case PIPE_SEND_ACT:
        return o->send_act(o->ctx, &mb, peer, tag, r->deadline);
    case PIPE_RECV_ACT:
        return o->recv_act(o->ctx, &mb, peer, tag, r->deadline);
    case PIPE_SEND_RESULT:
        return o->send_result(o->ctx, &mb, peer, tag, r->deadline);
    case PIPE_RECV_RESULT:
        return o->recv_result(o->ctx, &mb, peer, tag, r->deadline);
    }
    return GANG_EINVAL;
}

/* Stage 0 of a pipeline with P >= 2 stages: see the schedule above. */
static int pipe_first_stage(const pipe_run *r)
{
    uint32_t lag = r->stages - 1, last = r->stages - 1, k, j;
    int rc;

    for (k = 0; k < r->nmb; k++) {
        rc = pipe_step(r, PIPE_WORK, k, 0, 0);
        /* The result of microbatch k - lag comes back in the slot we just worked in. */
        if (rc == 0 && k >= lag)
            rc = pipe_step(r, PIPE_RECV_RESULT, k - lag, last, r->nmb + k - lag);
        if (rc == 0)
            rc = pipe_step(r, PIPE_SEND_ACT, k, 1, k);
        if (rc != 0)
            return rc;
    }
    /* Drain: the last lag results (all of them when K <= lag). */
    for (j = r->nmb > lag ? r->nmb - lag : 0; j < r->nmb; j++) {
        rc = pipe_step(r, PIPE_RECV_RESULT, j, last, r->nmb + j);
        if (rc != 0)
            return rc;
    }
    return 0;
}

/* A stage s >= 1: receive, work, pass on (the last stage passes its result to stage 0). */
static int pipe_later_stage(const pipe_run *r)
{
    uint32_t s = r->stage, k;
    int is_last = s + 1 == r->stages, rc;

    for (k = 0; k < r->nmb; k++) {
        rc = pipe_step(r, PIPE_RECV_ACT, k, s - 1, k);
        if (rc == 0)
            rc = pipe_step(r, PIPE_WORK, k, 0, 0);
        if (rc == 0 && is_last)
            rc = pipe_step(r, PIPE_SEND_RESULT, k, 0, r->nmb + k);
        else if (rc == 0)
            rc = pipe_step(r, PIPE_SEND_ACT, k, s + 1, k);
        if (rc != 0)
            return rc;
    }
    return 0;
}

int gang_pipeline_run(const gang_pipeline_ops *ops, uint32_t stage, uint32_t stages, uint32_t batch,
                      uint32_t microbatches, uint64_t deadline)
{
    pipe_run r = {.ops = ops,
                  .stage = stage,
                  .stages = stages,
                  .batch = batch,
                  .nmb = microbatches,
                  .deadline = deadline};
    uint32_t k;
    int rc;

    if (ops == NULL || ops->work == NULL || stages == 0 || stage >= stages)
        return GANG_EINVAL;
    if (stages > 1 && (ops->send_act == NULL || ops->recv_act == NULL || ops->send_result == NULL ||
                       ops->recv_result == NULL))
        return GANG_EINVAL;
    if (batch == 0 && microbatches == 0)
        return 0; /* an empty step: nothing to run, nothing to exchange */
    /* Tags K + k of the results must not wrap onto the activations' tags. */
    if (microbatches == 0 || microbatches > batch || microbatches > UINT32_MAX / 2)
        return GANG_EINVAL;
    if (stages == 1) {
        /* One stage: no point-to-point traffic, the microbatches simply run in turn. */
        for (k = 0; k < microbatches; k++) {
            rc = pipe_step(&r, PIPE_WORK, k, 0, 0);
            if (rc != 0)
                return rc;
        }
        return 0;
    }
    if (stage == 0)
        return pipe_first_stage(&r);
    return pipe_later_stage(&r);
}
