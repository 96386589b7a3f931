/*
 * Pipeline parallelism: a rank's share of the layers of its stage, the KV caches of those
 * layers, and the microbatched schedule that moves activations from stage to stage and
 * the results back to stage 0. The layout and the contracts are in
 * include/ganglion/parallel.h; this file holds the schedule and its bookkeeping.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ganglion/parallel.h"

struct gang_pipeline {
    gang_topology topo;       /* the layout, copied at init */
    gang_rank_place place;    /* where this rank sits */
    uint32_t layer_first;     /* the stage's layers are [layer_first, +layer_count) */
    uint32_t layer_count;     /* >= 1, since pp <= n_layers */
    uint32_t max_batch;       /* sequence slots of every cache */
    uint32_t max_tokens;      /* positions of every cache slot */
    gang_tp_layer *layers;    /* [layer_count] shards of this rank's tp_rank */
    gang_tp_kv_cache *caches; /* [layer_count x max_batch], layer-major */
    float *kv_mem;            /* backing store of every cache's k and v arrays */
    float *scratch;           /* stages > 0: one microbatch of activations; else NULL */
};

/* ---------------------------------------------------------------------------------
 * Small helpers
 * --------------------------------------------------------------------------------- */

/* a x b into *out; returns 0, or GANG_EINVAL when the product does not fit a size_t. */
static int pipe_mul(size_t a, size_t b, size_t *out)
{
    if (a != 0 && b > SIZE_MAX / a)
        return GANG_EINVAL;
    *out = a * b;
    return 0;
}

/* The absolute deadline timeout_ms from now, saturating instead of wrapping. */
static uint64_t pipe_deadline(uint64_t timeout_ms)
{
    uint64_t now = gang_now_ms();

    return timeout_ms > UINT64_MAX - now ? UINT64_MAX : now + timeout_ms;
}

/*
 * The time left until deadline, for the next operation. Returns 0 and *left (>= 1), or
 * GANG_ETIMEDOUT once the deadline has passed: the operations reject a zero timeout, and
 * a pipeline step that ran out of time has failed whichever operation comes next.
 */
static int pipe_left(uint64_t deadline, uint64_t *left)
{
    uint64_t now = gang_now_ms();

    if (now >= deadline)
        return GANG_ETIMEDOUT;
    *left = deadline - now;
    return 0;
}

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
 * Init and free
 * --------------------------------------------------------------------------------- */

void gang_pipeline_free(gang_pipeline *p)
{
    uint32_t i;

    if (p == NULL)
        return;
    if (p->layers != NULL) {
        for (i = 0; i < p->layer_count; i++)
            gang_tp_layer_free(&p->layers[i]);
    }
    free(p->layers);
    free(p->caches);
    free(p->kv_mem);
    free(p->scratch);
    free(p);
}

int gang_pipeline_init(const gang_pipeline_config *cfg, gang_pipeline **out)
{
    gang_pipeline *p = NULL;
    gang_tp_shard shard;
    size_t kv_row, slot_floats, cache_floats, slots, act_floats, i;
    uint32_t l;
    int rc;

    if (out != NULL)
        *out = NULL;
    if (cfg == NULL || out == NULL || cfg->topo == NULL || cfg->layers == NULL ||
        cfg->max_batch == 0 || cfg->max_tokens == 0)
        return GANG_EINVAL;
    p = calloc(1, sizeof(*p));
    if (p == NULL)
        return GANG_ENOMEM;
    p->topo = *cfg->topo;
    p->max_batch = cfg->max_batch;
    p->max_tokens = cfg->max_tokens;
    rc = gang_topology_rank(&p->topo, cfg->rank, &p->place);
    if (rc != 0)
        goto out_free;
    rc = gang_topology_stage_layers(&p->topo, p->place.pp_stage, &p->layer_first, &p->layer_count);
    if (rc != 0)
        goto out_free;
    rc = gang_topology_tp_shard(&p->topo, p->place.tp_rank, &shard);
    if (rc != 0)
        goto out_free;

    /*
     * Size everything before allocating anything, so that an absurd max_batch or
     * max_tokens is refused as such rather than as an allocation failure.
     */
    kv_row = (size_t)shard.kv_head_count * p->topo.head_dim;
    slots = (size_t)p->layer_count * p->max_batch;
    if (pipe_mul(kv_row, p->max_tokens, &slot_floats) != 0 ||
        pipe_mul(slot_floats, slots, &cache_floats) != 0 ||
        pipe_mul(cache_floats, 2 * sizeof(float), &i) != 0 ||
        pipe_mul((size_t)p->max_batch * p->max_tokens, p->topo.hidden, &act_floats) != 0 ||
        pipe_mul(act_floats, sizeof(float), &i) != 0) {
        rc = GANG_EINVAL;
        goto out_free;
    }

    p->layers = calloc(p->layer_count, sizeof(*p->layers));
    p->caches = calloc(slots, sizeof(*p->caches));
    p->kv_mem = calloc(2 * cache_floats, sizeof(float));
    if (p->layers == NULL || p->caches == NULL || p->kv_mem == NULL) {
        rc = GANG_ENOMEM;
        goto out_free;
    }
    if (p->place.pp_stage != 0) {
        p->scratch = malloc(act_floats * sizeof(float));
        if (p->scratch == NULL) {
            rc = GANG_ENOMEM;
            goto out_free;
        }
    }
    for (l = 0; l < p->layer_count; l++) {
        rc = gang_tp_layer_init(&p->layers[l], &p->topo, p->place.tp_rank,
                                &cfg->layers[p->layer_first + l], cfg->rope_theta, cfg->norm_eps);
        if (rc != 0)
            goto out_free;
    }
    /* Every cache slot gets its own k band followed by its own v band. */
    for (i = 0; i < slots; i++) {
        p->caches[i].k = p->kv_mem + 2 * i * slot_floats;
        p->caches[i].v = p->kv_mem + (2 * i + 1) * slot_floats;
        p->caches[i].cap = p->max_tokens;
    }
    *out = p;
    return 0;

out_free:
    gang_pipeline_free(p);
    return rc;
}

const gang_rank_place *gang_pipeline_place(const gang_pipeline *p)
{
    return p == NULL ? NULL : &p->place;
}

/* ---------------------------------------------------------------------------------
 * The schedule
 *
 * P stages, K microbatches; m(k) is microbatch k. Every TP rank of a stage runs the same
 * sequence of operations (its TP all-reduces inside the layers pair up with its peers'),
 * and talks point-to-point only with the same tp_rank of the neighbouring stages over the
 * PP communicator:
 *
 *   stage 0:      for k = 0 .. K-1:  F(k);  if k >= P-1: RECV result k-P+1 from P-1;
 *                                    SEND m(k) to stage 1 (tag k)
 *                 then RECV the results not yet received, in order (tag K + j)
 *   stage 0<s<P-1: for k:  RECV m(k) from s-1 (tag k);  F(k);  SEND m(k) to s+1 (tag k)
 *   stage P-1:    for k:  RECV m(k) from P-2 (tag k);  F(k);  SEND m(k) to 0 (tag K + k)
 *
 * With unit work per stage, stage s computes m(k) in time slot k + s, which is the GPipe
 * forward: stage s works on k while stage s+1 works on k-1, and the pipeline fills and
 * drains in P-1 slots each. Stage 0 computes F(k) before waiting for result k-P+1, which
 * the last stage produces in the same slot, so that wait overlaps real work.
 *
 * Why it cannot deadlock, even on a backend whose send blocks until the receiver posts
 * its recv (NCCL, MPI rendezvous; the socket backend happens to buffer, but we do not
 * rely on it). Give every operation a key, ordered first by the first number, then by
 * the second in DECREASING order:
 *
 *   message m(k) from stage s to s+1 (s = P-1: the result, to stage 0)   (k + s, s)
 *   the TP collectives of F(k) on stage s                                (k + s - 1, s - 3/2)
 *
 * The two ends of a message share its key, and the collectives of one F(k) are shared by
 * the TP ranks of one stage only, with a key no other operation has. Reading the loops
 * above, every rank issues its operations in strictly increasing key order: a middle
 * stage does RECV m(k) (k+s-1, s-1), F(k) (k+s-1, s-3/2), SEND m(k) (k+s, s), RECV
 * m(k+1) (k+s, s-1), ...; stage 0 does F(k) (k-1, -3/2), RECV result k-P+1 (k, P-1),
 * SEND m(k) (k, 0), F(k+1) (k, -3/2), ... Now take the incomplete operation with the
 * smallest key. Every rank taking part in it has completed all its operations of smaller
 * key, and issues its operations in key order, so it is blocked in exactly this one (or
 * about to issue it): both ends of the message, or all ranks of the collective, are
 * present, so it completes. By induction every operation completes. The rule that makes
 * stage 0 receive result k-P+1 BEFORE sending m(k) is what breaks the cycle stage 0 ->
 * 1 -> ... -> P-1 -> 0 that "send everything, then receive everything" would create once
 * K exceeds the messages the pipe can hold.
 *
 * A failure anywhere (abort, lost peer, deadline) makes the failing rank return at once;
 * its peers then see GANG_EABORTED (the gang aborts every communicator), GANG_EPEER or
 * their own deadline, so no rank waits past timeout_ms.
 * --------------------------------------------------------------------------------- */

/*
 * F(k): runs the sequences [first, first + count) of the batch, whose activations start
 * at h ([count x tokens, hidden]), through the stage's layers, in place, sequence by
 * sequence (each sequence attends only to itself, through its own cache slot). Every TP
 * rank of the stage makes the same calls in the same order. Returns 0 or the first error.
 */
static int pipe_run_layers(gang_pipeline *p, gang_kernels *k, gang_comm *tp_comm, float *h,
                           uint32_t first, uint32_t count, uint32_t tokens, uint64_t deadline)
{
    size_t seq_floats = (size_t)tokens * p->topo.hidden;
    uint64_t left;
    uint32_t s, l;
    int rc;

    for (s = 0; s < count; s++) {
        for (l = 0; l < p->layer_count; l++) {
            gang_tp_kv_cache *cache = &p->caches[(size_t)l * p->max_batch + first + s];

            rc = pipe_left(deadline, &left);
            if (rc != 0)
                return rc;
            /* Prefill only for now: every call starts its sequences at position 0. */
            rc = gang_tp_layer_forward(&p->layers[l], k, tp_comm, h + s * seq_floats, tokens, 0,
                                       cache, left);
            if (rc != 0)
                return rc;
        }
    }
    return 0;
}

/* Sends or receives count sequences at h to or from PP rank peer, within deadline. */
static int pipe_xfer(int is_send, gang_comm *pp_comm, float *h, uint32_t count, size_t seq_floats,
                     uint32_t peer, uint32_t tag, uint64_t deadline)
{
    size_t bytes = (size_t)count * seq_floats * sizeof(float);
    uint64_t left;
    int rc;

    rc = pipe_left(deadline, &left);
    if (rc != 0)
        return rc;
    if (is_send)
        return gang_comm_send(pp_comm, h, bytes, peer, tag, left);
    return gang_comm_recv(pp_comm, h, bytes, peer, tag, left);
}

/* Checks that comm (NULL allowed only when size == 1) is a group of `size` led as `rank`. */
static int pipe_check_comm(gang_comm *comm, uint32_t size, uint32_t rank)
{
    if (comm == NULL)
        return size == 1 ? 0 : GANG_EINVAL;
    if (gang_comm_size(comm) != size || gang_comm_rank(comm) != rank)
        return GANG_EINVAL;
    return 0;
}

/* Stage 0 of a pipeline with P >= 2 stages: see the schedule above. */
static int pipe_first_stage(gang_pipeline *p, gang_kernels *k, gang_comm *tp_comm,
                            gang_comm *pp_comm, float *x, uint32_t batch, uint32_t tokens,
                            uint32_t nmb, uint64_t deadline)
{
    size_t seq_floats = (size_t)tokens * p->topo.hidden;
    uint32_t lag = p->topo.pp - 1, last = p->topo.pp - 1, mb, first, count, rfirst, rcount, j;
    int rc;

    for (mb = 0; mb < nmb; mb++) {
        rc = gang_pipeline_microbatch(batch, nmb, mb, &first, &count);
        if (rc != 0)
            return rc;
        rc = pipe_run_layers(p, k, tp_comm, x + first * seq_floats, first, count, tokens, deadline);
        if (rc != 0)
            return rc;
        if (mb >= lag) {
            /* The result of microbatch mb - lag comes back in the slot we just worked in. */
            j = mb - lag;
            rc = gang_pipeline_microbatch(batch, nmb, j, &rfirst, &rcount);
            if (rc != 0)
                return rc;
            rc = pipe_xfer(0, pp_comm, x + rfirst * seq_floats, rcount, seq_floats, last, nmb + j,
                           deadline);
            if (rc != 0)
                return rc;
        }
        rc = pipe_xfer(1, pp_comm, x + first * seq_floats, count, seq_floats, 1, mb, deadline);
        if (rc != 0)
            return rc;
    }
    /* Drain: the last lag results (all of them when nmb <= lag). */
    for (j = nmb > lag ? nmb - lag : 0; j < nmb; j++) {
        rc = gang_pipeline_microbatch(batch, nmb, j, &first, &count);
        if (rc != 0)
            return rc;
        rc = pipe_xfer(0, pp_comm, x + first * seq_floats, count, seq_floats, last, nmb + j,
                       deadline);
        if (rc != 0)
            return rc;
    }
    return 0;
}

/* A stage s >= 1: receive, compute, pass on (the last stage passes on to stage 0). */
static int pipe_later_stage(gang_pipeline *p, gang_kernels *k, gang_comm *tp_comm,
                            gang_comm *pp_comm, uint32_t batch, uint32_t tokens, uint32_t nmb,
                            uint64_t deadline)
{
    size_t seq_floats = (size_t)tokens * p->topo.hidden;
    uint32_t s = p->place.pp_stage, is_last = s + 1 == p->topo.pp, mb, first, count;
    int rc;

    for (mb = 0; mb < nmb; mb++) {
        rc = gang_pipeline_microbatch(batch, nmb, mb, &first, &count);
        if (rc != 0)
            return rc;
        rc = pipe_xfer(0, pp_comm, p->scratch, count, seq_floats, s - 1, mb, deadline);
        if (rc != 0)
            return rc;
        rc = pipe_run_layers(p, k, tp_comm, p->scratch, first, count, tokens, deadline);
        if (rc != 0)
            return rc;
        rc = pipe_xfer(1, pp_comm, p->scratch, count, seq_floats, is_last ? 0 : s + 1,
                       is_last ? nmb + mb : mb, deadline);
        if (rc != 0)
            return rc;
    }
    return 0;
}

int gang_pipeline_forward(gang_pipeline *p, gang_kernels *k, gang_comm *tp_comm, gang_comm *pp_comm,
                          float *x, uint32_t batch, uint32_t tokens, uint32_t microbatches,
                          uint64_t timeout_ms)
{
    uint64_t deadline;
    uint32_t mb, first, count;
    size_t seq_floats;
    int rc;

    if (p == NULL || k == NULL || batch == 0 || tokens == 0 || timeout_ms == 0)
        return GANG_EINVAL;
    if (batch > p->max_batch || tokens > p->max_tokens || microbatches == 0 || microbatches > batch)
        return GANG_EINVAL;
    if (p->place.pp_stage == 0 && x == NULL)
        return GANG_EINVAL;
    /* Tags K + k of the results must not wrap onto the activations' tags. */
    if (microbatches > UINT32_MAX / 2)
        return GANG_EINVAL;
    rc = pipe_check_comm(tp_comm, p->topo.tp, p->place.tp_rank);
    if (rc != 0)
        return rc;
    rc = pipe_check_comm(pp_comm, p->topo.pp, p->place.pp_stage);
    if (rc != 0)
        return rc;
    deadline = pipe_deadline(timeout_ms);

    if (p->topo.pp == 1) {
        /* One stage: no point-to-point traffic, the microbatches simply run in turn. */
        seq_floats = (size_t)tokens * p->topo.hidden;
        for (mb = 0; mb < microbatches; mb++) {
            rc = gang_pipeline_microbatch(batch, microbatches, mb, &first, &count);
            if (rc != 0)
                return rc;
            rc = pipe_run_layers(p, k, tp_comm, x + first * seq_floats, first, count, tokens,
                                 deadline);
            if (rc != 0)
                return rc;
        }
        return 0;
    }
    if (p->place.pp_stage == 0)
        return pipe_first_stage(p, k, tp_comm, pp_comm, x, batch, tokens, microbatches, deadline);
    return pipe_later_stage(p, k, tp_comm, pp_comm, batch, tokens, microbatches, deadline);
}
