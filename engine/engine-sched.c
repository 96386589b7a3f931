/*
 * Rank 0's scheduler: continuous batching over the paged KV cache, which builds each
 * step's plan (its blocks come from engine-kv.c, its wire form is engine-wire.c's, the
 * commit of its sampled tokens engine-events.c's).
 *
 * Scheduling, once per step, on rank 0:
 *
 *   1. Every running sequence whose context is fully in its cache decodes one token, in
 *      arrival order: its last generated token at position n_prompt + n_gen - 1,
 *      sampled. One that crosses into a new block takes one from the free stack; when
 *      none is left the youngest running sequence not yet in the plan is preempted (it
 *      frees its blocks and waits to be recomputed; see sched_preempt), possibly the
 *      decoding one itself.
 *   2. Then, in arrival order, requests still prefilling continue, and waiting requests
 *      take the lowest free slot and the blocks of their whole prefill and start (or, if
 *      either is missing, they and every later request wait), each with a chunk of at
 *      most the prompt tokens left in the step's budget (max_step_tokens). A chunk
 *      samples only when it completes the prompt: its last logits give the first
 *      generated token.
 *      A waiting request that names a P/D transfer is admitted the same way, but instead
 *      of a chunk its first step starts the background fetch of the transfer's blocks,
 *      and it is not scheduled (nor preempted) until that fetch is settled
 *      (engine-xfer.c).
 *   3. Events are bounded: a sampling sequence can produce two (TOKEN and DONE), and a
 *      sequence is only scheduled to sample when the event ring has room for them, so a
 *      caller that stops polling stalls the engine (empty plans) instead of losing
 *      events or allocating.
 *
 * Nothing here allocates; requests are allocated by submit, outside the step loop.
 * Which sequences share a step changes only what runs together, never the numbers of a
 * sequence: each one attends to its own slot, and sampling is keyed by position.
 */
#include <string.h>

#include "engine-internal.h"

/* Event-ring room left for this step, after what already sits in the ring. */
static uint32_t sched_event_room(const gang_engine *e, uint32_t reserved)
{
    uint32_t used = e->ev_count + reserved;

    return used >= e->ev_cap ? 0 : e->ev_cap - used;
}

/* Appends a sequence of n tokens taken from ids to the plan. */
static void sched_add(gang_engine *e, gang__request *q, uint32_t pos0, const int32_t *ids,
                      uint32_t n, uint32_t sample)
{
    gang__plan *p = &e->plan;
    gang__plan_seq *s = &p->seqs[p->n_seq++];

    s->slot = q->slot;
    s->pos0 = pos0;
    s->n = n;
    s->sample = sample;
    s->sp = q->r.sampling;
    s->n_prompt = q->r.n_prompt;
    s->tok_off = p->n_tokens;
    /* The sampling rank gets a request's grammar with its first draw in a slot. */
    s->g_len = 0;
    s->g_text = q->grammar;
    if (sample && q->grammar != NULL && !q->g_sent) {
        s->g_len = q->r.sampling.grammar_bytes;
        q->g_sent = 1;
    }
    memcpy(p->tokens + p->n_tokens, ids, (size_t)n * sizeof(int32_t));
    p->n_tokens += n;
    q->planned = 1;
}

/*
 * The tokens q must have in its cache before it decodes: the prompt, and after a
 * preemption also every generated token but the last (the next decode's input).
 */
static uint32_t sched_target(const gang__request *q)
{
    return q->r.n_prompt + (q->n_gen > 0 ? q->n_gen - 1 : 0);
}

/*
 * Preemption by recompute (vLLM's): the victim gives back its slot and blocks and goes
 * back to waiting at its place in arrival order; when it is admitted again it prefills
 * its prompt and its output so far (without sampling) and decodes on. Sampling is keyed
 * by position, so its tokens are those of an uncontended run.
 */
static void sched_preempt(gang_engine *e, gang__request *v)
{
    gang__kv_release(e, v);
    v->n_fed = 0;
    e->n_preempted++;
}

/*
 * Makes room for `need` free blocks for q by preempting the youngest running sequences
 * not already in the plan. Returns 1 when the room is there, 0 when q itself had to be
 * preempted (it then sits this step out).
 */
static int sched_make_room(gang_engine *e, gang__request *q, uint32_t need)
{
    while (gang__kv_avail(e) < need) {
        gang__request *v = NULL, *it;

        for (it = e->queue_head; it != NULL; it = it->next)
            if (it->running && !it->planned && it != q && it->kv_state != 1)
                v = it; /* the last one in arrival order: the youngest */
        if (v == NULL) {
            sched_preempt(e, q);
            return 0;
        }
        sched_preempt(e, v);
    }
    return 1;
}

void gang__sched_build(gang_engine *e)
{
    gang__request *q;
    uint32_t slot, budget = e->cfg.max_step_tokens, reserved = 0, chunk, free_slot, target, need;
    uint32_t n_hit, held_free, fed;
    uint64_t hash = 0;
    int32_t *hits = e->pc_hits;

    e->plan.n_seq = 0;
    e->plan.n_tokens = 0;
    e->plan.kv_kind = GANG__KV_NONE;
    for (q = e->queue_head; q != NULL; q = q->next)
        q->planned = 0;
    gang__xfer_plan_export(e);
    gang__xfer_plan_import(e);
    reserved = e->plan.kv_kind == GANG__KV_EXPORT; /* the exported request's DONE */
    /* 1. Decodes, oldest first; a decode that needs a block nobody has left preempts the
     *    youngest running sequence (possibly itself). */
    for (q = e->queue_head; q != NULL; q = q->next) {
        if (!q->running || q->n_gen == 0 || q->n_fed != sched_target(q))
            continue;
        if (sched_event_room(e, reserved) < 2)
            break;
        need = gang__blocks_for(e, q->n_fed + 1);
        if (need > q->n_blocks && !sched_make_room(e, q, need - q->n_blocks))
            continue;
        gang__kv_take(e, q, need);
        reserved += 2;
        sched_add(e, q, q->n_fed, &q->last, 1, 1);
    }
    /* 2. Prefill chunks, in arrival order, within the prompt-token budget. A waiting
     *    request is admitted when a slot and the blocks of its whole prefill are free
     *    (first come, first served: later requests wait behind it). */
    free_slot = 0;
    for (q = e->queue_head; q != NULL && budget > 0; q = q->next) {
        target = sched_target(q);
        if (q->running && (q->n_fed >= target || q->kv_state == 1))
            continue; /* (kv_state 1: its blocks are being fetched) */
        if (q->planned)
            continue;
        n_hit = 0;
        fed = q->n_fed;
        if (!q->running) {
            while (free_slot < e->slots && e->slot_req[free_slot] != NULL)
                free_slot++;
            if (free_slot == e->slots)
                break;
            /* A request naming a P/D transfer fetches its blocks this step instead (or
             * waits for a plan that moves no other blocks). */
            if (gang__xfer_admit(e, q, free_slot) != 0)
                continue;
            /* Its leading full blocks already cached are taken as they are (at least one
             * token is left to compute, the one whose logits it samples). */
            n_hit = gang__pc_lookup(e, q, target - 1, hits, &held_free, &hash);
            if (gang__kv_avail(e) - held_free < gang__blocks_for(e, target) - n_hit)
                break;
            fed = n_hit * e->block_size;
        }
        chunk = target - fed;
        if (chunk > budget)
            chunk = budget;
        slot = q->n_gen == 0 && fed + chunk == q->r.n_prompt; /* samples */
        if (slot) {
            if (sched_event_room(e, reserved) < 2)
                break;
            reserved += 2;
        }
        if (!q->running) {
            int32_t *row = e->tables + (size_t)free_slot * e->max_bps;

            q->running = 1;
            q->slot = free_slot;
            q->g_sent = 0;
            q->n_blocks = 0;
            e->slot_req[free_slot] = q;
            for (uint32_t i = 0; i < n_hit; i++) {
                gang__pc_hold(e, hits[i]);
                row[q->n_blocks++] = hits[i];
            }
            q->n_fed = fed;
            q->n_hashed = n_hit;
            q->hash = hash;
            if (q->n_gen == 0)
                q->n_cached = fed;
            e->prefix_query_tokens += target;
            e->prefix_hit_tokens += fed;
            gang__kv_take(e, q, gang__blocks_for(e, target));
        }
        sched_add(e, q, q->n_fed, q->prompt + q->n_fed, chunk, slot);
        budget -= chunk;
    }
}
