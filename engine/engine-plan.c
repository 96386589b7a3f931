/*
 * The step plan: rank 0's scheduler (continuous batching over the paged KV cache) that
 * builds it, its wire form and the validation every rank applies on receipt, and the
 * commit of a completed step's sampled tokens into events.
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
 *   3. Events are bounded: a sampling sequence can produce two (TOKEN and DONE), and a
 *      sequence is only scheduled to sample when the event ring has room for them, so a
 *      caller that stops polling stalls the engine (empty plans) instead of losing
 *      events or allocating.
 *
 * Nothing here allocates; requests are allocated by submit, outside the step loop.
 * Which sequences share a step changes only what runs together, never the numbers of a
 * sequence: each one attends to its own slot, and sampling is keyed by position.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine-internal.h"

/* ---------------------------------------------------------------------------------
 * Building the plan (rank 0)
 * --------------------------------------------------------------------------------- */

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
    s->logprobs = q->r.logprobs;
    s->n_top = q->r.top_logprobs;
    s->tok_off = p->n_tokens;
    memcpy(p->tokens + p->n_tokens, ids, (size_t)n * sizeof(int32_t));
    p->n_tokens += n;
    q->planned = 1;
}

/* Blocks that cover positions 0 .. n - 1. */
static uint32_t sched_blocks_for(const gang_engine *e, uint32_t n)
{
    return (n + e->block_size - 1) / e->block_size;
}

/*
 * The tokens q must have in its cache before it decodes: the prompt, and after a
 * preemption also every generated token but the last (the next decode's input).
 */
static uint32_t sched_target(const gang__request *q)
{
    return q->r.n_prompt + (q->n_gen > 0 ? q->n_gen - 1 : 0);
}

/* ---------------------------------------------------------------------------------
 * Prefix cache (rank 0)
 *
 * A full block's key is the hash chain h_i = mix(h_{i-1}, its block_size tokens) from the
 * sequence's start, so equal keys mean equal prefixes up to that block (a hit is also
 * checked exactly: the block's tokens and its parent block). Blocks are registered once
 * their last position is in the cache, whoever computed them; a block several sequences
 * hold is never written (a sequence writes only positions past its full blocks).
 * --------------------------------------------------------------------------------- */

static uint64_t pc_mix(uint64_t h, const int32_t *ids, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++) {
        h ^= (uint64_t)(uint32_t)ids[i] + 0x9e3779b97f4a7c15u + (h << 6) + (h >> 2);
        h *= 0xff51afd7ed558ccdu;
        h ^= h >> 33;
    }
    return h;
}

static uint32_t pc_bucket(const gang_engine *e, uint64_t h)
{
    return (uint32_t)(h ^ (h >> 32)) & (e->ht_cap - 1);
}

static void pc_lru_remove(gang_engine *e, int32_t b)
{
    int32_t p = e->lru_prev[b], n = e->lru_next[b];

    if (p >= 0)
        e->lru_next[p] = n;
    else
        e->lru_head = n;
    if (n >= 0)
        e->lru_prev[n] = p;
    else
        e->lru_tail = p;
    e->n_lru--;
}

static void pc_lru_push(gang_engine *e, int32_t b)
{
    e->lru_prev[b] = e->lru_tail;
    e->lru_next[b] = -1;
    if (e->lru_tail >= 0)
        e->lru_next[e->lru_tail] = b;
    else
        e->lru_head = b;
    e->lru_tail = b;
    e->n_lru++;
}

/* Drops cached block b from the hash table (it is about to hold other tokens). */
static void pc_unregister(gang_engine *e, int32_t b)
{
    int32_t *pp = &e->ht_head[pc_bucket(e, e->blk_hash[b])];

    while (*pp >= 0 && *pp != b)
        pp = &e->ht_next[*pp];
    if (*pp == b)
        *pp = e->ht_next[b];
    e->blk_cached[b] = 0;
}

/* The cached block holding ids [block_size] after parent with chain hash h, or -1. */
static int32_t pc_find(const gang_engine *e, uint64_t h, int32_t parent, const int32_t *ids)
{
    for (int32_t b = e->ht_head[pc_bucket(e, h)]; b >= 0; b = e->ht_next[b]) {
        if (e->blk_hash[b] == h && e->blk_parent[b] == parent &&
            memcmp(e->blk_tokens + (size_t)b * e->block_size, ids,
                   e->block_size * sizeof(int32_t)) == 0)
            return b;
    }
    return -1;
}

/* Blocks a sequence can take now: the free stack and the cached blocks nobody holds. */
static uint32_t sched_avail(const gang_engine *e)
{
    return e->n_free + e->n_lru;
}

/* Grows q's table (in rank 0's tables) to n blocks: from the free stack, else by
 * evicting the least recently released cached block. The caller checked the room. */
static void sched_take(gang_engine *e, gang__request *q, uint32_t n)
{
    int32_t *row = e->tables + (size_t)q->slot * e->max_bps, b;

    while (q->n_blocks < n) {
        if (e->n_free > 0) {
            b = (int32_t)e->free_blocks[--e->n_free];
        } else {
            b = e->lru_head;
            pc_lru_remove(e, b);
            pc_unregister(e, b);
        }
        e->blk_ref[b] = 1;
        row[q->n_blocks++] = b;
    }
}

/* Gives q's blocks back (a cached one nobody else holds goes to the LRU list, the last
 * of the chain first, so that it is evicted first) and its slot to the free slots. */
static void sched_release(gang_engine *e, gang__request *q)
{
    const int32_t *row = e->tables + (size_t)q->slot * e->max_bps;

    while (q->n_blocks > 0) {
        int32_t b = row[--q->n_blocks];

        if (--e->blk_ref[b] > 0)
            continue;
        if (e->blk_cached[b])
            pc_lru_push(e, b);
        else
            e->free_blocks[e->n_free++] = (uint32_t)b;
    }
    q->n_hashed = 0;
    e->slot_req[q->slot] = NULL;
    q->running = 0;
}

/*
 * The leading full blocks of q's first `limit` tokens found in the cache, into hits
 * [max_bps]; *held_free counts those nobody holds now (they leave the available room
 * when taken). Returns their count.
 */
static uint32_t pc_lookup(const gang_engine *e, const gang__request *q, uint32_t limit,
                          int32_t *hits, uint32_t *held_free, uint64_t *hash)
{
    uint32_t n = 0, bs = e->block_size;
    uint64_t h = 0;

    *held_free = 0;
    if (!e->cfg.prefix_caching)
        return 0;
    while ((n + 1) * bs <= limit) {
        uint64_t hn = pc_mix(h, q->prompt + (size_t)n * bs, bs);
        int32_t b = pc_find(e, hn, n > 0 ? hits[n - 1] : -1, q->prompt + (size_t)n * bs);

        if (b < 0)
            break;
        *held_free += e->blk_ref[b] == 0;
        hits[n++] = b;
        h = hn;
    }
    *hash = h;
    return n;
}

/* Registers q's blocks that became full with its last step's tokens. */
static void pc_register(gang_engine *e, gang__request *q)
{
    const int32_t *row = e->tables + (size_t)q->slot * e->max_bps;
    uint32_t bs = e->block_size;

    while ((q->n_hashed + 1) * bs <= q->n_fed) {
        const int32_t *ids = q->prompt + (size_t)q->n_hashed * bs;
        int32_t b = row[q->n_hashed], parent = q->n_hashed > 0 ? row[q->n_hashed - 1] : -1;

        q->hash = pc_mix(q->hash, ids, bs);
        q->n_hashed++;
        if (e->blk_cached[b] || pc_find(e, q->hash, parent, ids) >= 0)
            continue; /* a hit, or the same prefix cached by another sequence */
        e->blk_hash[b] = q->hash;
        e->blk_parent[b] = parent;
        memcpy(e->blk_tokens + (size_t)b * bs, ids, bs * sizeof(int32_t));
        e->blk_cached[b] = 1;
        e->ht_next[b] = e->ht_head[pc_bucket(e, q->hash)];
        e->ht_head[pc_bucket(e, q->hash)] = b;
    }
}

/*
 * Preemption by recompute (vLLM's): the victim gives back its slot and blocks and goes
 * back to waiting at its place in arrival order; when it is admitted again it prefills
 * its prompt and its output so far (without sampling) and decodes on. Sampling is keyed
 * by position, so its tokens are those of an uncontended run.
 */
static void sched_preempt(gang_engine *e, gang__request *v)
{
    sched_release(e, v);
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
    while (sched_avail(e) < need) {
        gang__request *v = NULL, *it;

        for (it = e->queue_head; it != NULL; it = it->next)
            if (it->running && !it->planned && it != q)
                v = it; /* the last one in arrival order: the youngest */
        if (v == NULL) {
            sched_preempt(e, q);
            return 0;
        }
        sched_preempt(e, v);
    }
    return 1;
}

void gang__sched_blocks_reset(gang_engine *e)
{
    uint32_t i;

    /* Handed out from the top: block 0 first, so the lowest ids are the busy ones. */
    for (i = 0; i < e->n_usable; i++)
        e->free_blocks[i] = e->n_usable - 1 - i;
    e->n_free = e->n_usable;
    memset(e->blk_ref, 0, (size_t)e->n_blocks * sizeof(uint32_t));
    memset(e->blk_cached, 0, e->n_blocks);
    for (i = 0; i < e->ht_cap; i++)
        e->ht_head[i] = -1;
    e->lru_head = e->lru_tail = -1;
    e->n_lru = 0;
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
    for (q = e->queue_head; q != NULL; q = q->next)
        q->planned = 0;
    /* 1. Decodes, oldest first; a decode that needs a block nobody has left preempts the
     *    youngest running sequence (possibly itself). */
    for (q = e->queue_head; q != NULL; q = q->next) {
        if (!q->running || q->n_gen == 0 || q->n_fed != sched_target(q))
            continue;
        if (sched_event_room(e, reserved) < 2)
            break;
        need = sched_blocks_for(e, q->n_fed + 1);
        if (need > q->n_blocks && !sched_make_room(e, q, need - q->n_blocks))
            continue;
        sched_take(e, q, need);
        reserved += 2;
        sched_add(e, q, q->n_fed, &q->last, 1, 1);
    }
    /* 2. Prefill chunks, in arrival order, within the prompt-token budget. A waiting
     *    request is admitted when a slot and the blocks of its whole prefill are free
     *    (first come, first served: later requests wait behind it). */
    free_slot = 0;
    for (q = e->queue_head; q != NULL && budget > 0; q = q->next) {
        target = sched_target(q);
        if (q->running && q->n_fed >= target)
            continue;
        if (q->planned)
            continue;
        n_hit = 0;
        fed = q->n_fed;
        if (!q->running) {
            while (free_slot < e->slots && e->slot_req[free_slot] != NULL)
                free_slot++;
            if (free_slot == e->slots)
                break;
            /* Its leading full blocks already cached are taken as they are (at least one
             * token is left to compute, the one whose logits it samples). */
            n_hit = pc_lookup(e, q, target - 1, hits, &held_free, &hash);
            if (sched_avail(e) - held_free < sched_blocks_for(e, target) - n_hit)
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
            q->n_blocks = 0;
            e->slot_req[free_slot] = q;
            for (uint32_t i = 0; i < n_hit; i++) {
                if (e->blk_ref[hits[i]]++ == 0)
                    pc_lru_remove(e, hits[i]);
                row[q->n_blocks++] = hits[i];
            }
            q->n_fed = fed;
            q->n_hashed = n_hit;
            q->hash = hash;
            if (q->n_gen == 0)
                q->n_cached = fed;
            e->prefix_query_tokens += target;
            e->prefix_hit_tokens += fed;
            sched_take(e, q, sched_blocks_for(e, target));
        }
        sched_add(e, q, q->n_fed, q->prompt + q->n_fed, chunk, slot);
        budget -= chunk;
    }
}

/* ---------------------------------------------------------------------------------
 * Committing a step (rank 0)
 * --------------------------------------------------------------------------------- */

static void sched_event(gang_engine *e, const gang_gen_event *ev)
{
    /* The scheduler reserved the room when it planned the sampling sequence. */
    e->events[(e->ev_head + e->ev_count) % e->ev_cap] = *ev;
    e->ev_count++;
}

/* Unlinks q from the queue, frees its slot and the request. */
static void sched_finish(gang_engine *e, gang__request *q)
{
    gang__request **pp;

    for (pp = &e->queue_head; *pp != NULL; pp = &(*pp)->next) {
        if (*pp == q) {
            *pp = q->next;
            break;
        }
    }
    if (e->queue_tail == q) {
        e->queue_tail = e->queue_head;
        while (e->queue_tail != NULL && e->queue_tail->next != NULL)
            e->queue_tail = e->queue_tail->next;
    }
    if (q->running)
        sched_release(e, q);
    e->n_pending--;
    free(q->prompt);
    free(q);
}

/* The logprobs the last stage reported for a sequence into its TOKEN event. */
static void sched_logprobs(const gang__result *r, gang_gen_event *ev)
{
    uint32_t n = r->n_top <= GANG_MAX_TOP_LOGPROBS ? r->n_top : GANG_MAX_TOP_LOGPROBS;

    ev->logprob = r->logprob;
    ev->n_top = n;
    memcpy(ev->top_ids, r->top_ids, n * sizeof(int32_t));
    memcpy(ev->top_logprobs, r->top_lp, n * sizeof(float));
}

int gang__penalties_ok(const gang_sampling *sp)
{
    return sp->presence_penalty >= -2.0f && sp->presence_penalty <= 2.0f &&
           sp->frequency_penalty >= -2.0f && sp->frequency_penalty <= 2.0f &&
           sp->repetition_penalty >= 0.0f && isfinite(sp->repetition_penalty);
}

int gang__sched_cancel(gang_engine *e, uint64_t id)
{
    for (gang__request *q = e->queue_head; q != NULL; q = q->next) {
        if (q->r.id == id) {
            sched_finish(e, q);
            return 0;
        }
    }
    return GANG_ENOENT;
}

void gang__sched_commit(gang_engine *e)
{
    gang_gen_event ev;
    gang__request *q;
    uint32_t i, j;
    int stop;

    for (i = 0; i < e->plan.n_seq; i++) {
        const gang__plan_seq *s = &e->plan.seqs[i];

        q = e->slot_req[s->slot];
        if (q == NULL)
            continue;
        q->n_fed += s->n;
        if (e->cfg.prefix_caching)
            pc_register(e, q);
        if (!s->sample)
            continue;
        q->last = e->plan.out[i];
        q->prompt[q->r.n_prompt + q->n_gen] = q->last; /* n_gen < max_tokens here */
        memset(&ev, 0, sizeof(ev));
        ev.kind = GANG_GEN_TOKEN;
        ev.id = q->r.id;
        ev.token = q->last;
        ev.index = q->n_gen;
        if (q->r.logprobs)
            sched_logprobs(&e->plan.res[i], &ev);
        sched_event(e, &ev);
        q->n_gen++;
        stop = 0;
        for (j = 0; j < q->r.n_stop; j++)
            stop |= q->r.stop[j] == q->last;
        for (j = 0; !q->r.ignore_eos && j < e->m->cfg.n_eos && j < GANG_MAX_EOS; j++)
            stop |= e->m->cfg.eos_ids[j] == q->last;
        if (stop || q->n_gen >= q->r.max_tokens) {
            memset(&ev, 0, sizeof(ev));
            ev.kind = GANG_GEN_DONE;
            ev.id = q->r.id;
            ev.index = q->n_cached;
            memcpy(ev.finish, stop ? "stop" : "length", stop ? 5 : 7);
            sched_event(e, &ev);
            sched_finish(e, q);
        }
    }
}

void gang__sched_clear(gang_engine *e)
{
    gang__request *q, *next;

    for (q = e->queue_head; q != NULL; q = next) {
        next = q->next;
        free(q->prompt);
        free(q);
    }
    e->queue_head = e->queue_tail = NULL;
    e->n_pending = 0;
    if (e->slot_req != NULL)
        memset(e->slot_req, 0, (size_t)e->slots * sizeof(*e->slot_req));
    if (e->free_blocks != NULL)
        gang__sched_blocks_reset(e);
    e->ev_head = e->ev_count = 0;
}

/* ---------------------------------------------------------------------------------
 * Wire form
 * --------------------------------------------------------------------------------- */

static int32_t f2w(float f)
{
    int32_t w;

    memcpy(&w, &f, sizeof(w));
    return w;
}

static float w2f(int32_t w)
{
    float f;

    memcpy(&f, &w, sizeof(f));
    return f;
}

uint32_t gang__plan_encode(gang_engine *e)
{
    const gang__plan *p = &e->plan;
    int32_t *w = e->plan_buf + GANG__PLAN_HDR_WORDS;
    uint32_t i, n_table = 0, body;

    for (i = 0; i < p->n_seq; i++)
        n_table += sched_blocks_for(e, p->seqs[i].pos0 + p->seqs[i].n);
    body = p->n_seq * GANG__PLAN_SEQ_WORDS + p->n_tokens + n_table;
    e->plan_buf[0] = (int32_t)GANG__PLAN_MAGIC;
    e->plan_buf[1] = (int32_t)p->n_seq;
    e->plan_buf[2] = (int32_t)p->n_tokens;
    e->plan_buf[3] = (int32_t)n_table;
    e->plan_buf[4] = (int32_t)body;
    for (i = 0; i < p->n_seq; i++) {
        const gang__plan_seq *s = &p->seqs[i];

        w[0] = (int32_t)s->slot;
        w[1] = (int32_t)s->pos0;
        w[2] = (int32_t)s->n;
        w[3] = (int32_t)s->sample;
        w[4] = f2w(s->sp.temperature);
        w[5] = (int32_t)s->sp.top_k;
        w[6] = f2w(s->sp.top_p);
        w[7] = (int32_t)(uint32_t)(s->sp.seed & 0xffffffffu);
        w[8] = (int32_t)(uint32_t)(s->sp.seed >> 32);
        w[9] = (int32_t)s->n_prompt;
        w[10] = f2w(s->sp.presence_penalty);
        w[11] = f2w(s->sp.frequency_penalty);
        w[12] = f2w(s->sp.repetition_penalty);
        w[13] = s->logprobs ? (int32_t)(1 + s->n_top) : 0;
        w += GANG__PLAN_SEQ_WORDS;
    }
    /* Rank 0 built its tokens in place; encoding copies them after the entries. */
    memmove(w, p->tokens, (size_t)p->n_tokens * sizeof(int32_t));
    w += p->n_tokens;
    for (i = 0; i < p->n_seq; i++) {
        uint32_t nb = sched_blocks_for(e, p->seqs[i].pos0 + p->seqs[i].n);

        memcpy(w, e->tables + (size_t)p->seqs[i].slot * e->max_bps, nb * sizeof(int32_t));
        w += nb;
    }
    return body;
}

int gang__plan_check_header(const gang_engine *e, const int32_t *hdr, uint32_t *body_words)
{
    uint32_t n_seq = (uint32_t)hdr[1], n_tokens = (uint32_t)hdr[2], n_table = (uint32_t)hdr[3];
    uint32_t body = (uint32_t)hdr[4];

    if ((uint32_t)hdr[0] != GANG__PLAN_MAGIC || n_seq > e->slots || n_tokens > e->max_tokens)
        return GANG_EPROTO;
    if ((uint64_t)n_table > (uint64_t)n_seq * e->max_bps)
        return GANG_EPROTO;
    if (n_tokens < n_seq ||
        (uint64_t)body != (uint64_t)n_seq * GANG__PLAN_SEQ_WORDS + n_tokens + n_table)
        return GANG_EPROTO;
    *body_words = body;
    return 0;
}

int gang__plan_decode(gang_engine *e)
{
    gang__plan *p = &e->plan;
    const int32_t *w = e->plan_buf + GANG__PLAN_HDR_WORDS;
    uint32_t i, j, lp, off = 0, n_seq = (uint32_t)e->plan_buf[1],
                       n_tokens = (uint32_t)e->plan_buf[2];
    uint32_t n_table = (uint32_t)e->plan_buf[3], tab = 0;
    const int32_t *ids;

    memset(e->slot_seen, 0, e->slots);
    for (i = 0; i < n_seq; i++) {
        gang__plan_seq *s = &p->seqs[i];

        s->slot = (uint32_t)w[0];
        s->pos0 = (uint32_t)w[1];
        s->n = (uint32_t)w[2];
        s->sample = (uint32_t)w[3];
        s->sp.temperature = w2f(w[4]);
        s->sp.top_k = (uint32_t)w[5];
        s->sp.top_p = w2f(w[6]);
        s->sp.seed = (uint64_t)(uint32_t)w[7] | (uint64_t)(uint32_t)w[8] << 32;
        s->n_prompt = (uint32_t)w[9];
        s->sp.presence_penalty = w2f(w[10]);
        s->sp.frequency_penalty = w2f(w[11]);
        s->sp.repetition_penalty = w2f(w[12]);
        lp = (uint32_t)w[13];
        s->logprobs = lp != 0;
        s->n_top = lp != 0 ? lp - 1 : 0;
        w += GANG__PLAN_SEQ_WORDS;
        /* Everything that sizes a buffer or indexes one is checked against our bounds. */
        if (s->slot >= e->slots || e->slot_seen[s->slot] || s->n == 0 || s->sample > 1)
            return GANG_EPROTO;
        if (s->n > n_tokens - off || s->pos0 > e->max_ctx || s->n > e->max_ctx - s->pos0)
            return GANG_EPROTO;
        if (!(s->sp.temperature >= 0.0f) || !isfinite(s->sp.temperature) ||
            !(s->sp.top_p > 0.0f && s->sp.top_p <= 1.0f) || !gang__penalties_ok(&s->sp))
            return GANG_EPROTO;
        /* The penalties read the slot's history below the sampled position. */
        if (s->n_prompt > e->max_ctx || lp > GANG_MAX_TOP_LOGPROBS + 1 ||
            (s->sample && (s->n_prompt == 0 || s->n_prompt > s->pos0 + s->n)))
            return GANG_EPROTO;
        e->slot_seen[s->slot] = 1;
        s->tok_off = off;
        p->seq_tokens[i] = s->n;
        p->seq_pos0[i] = s->pos0;
        p->out[i] = -1;
        off += s->n;
    }
    if (off != n_tokens)
        return GANG_EPROTO;
    ids = w;
    for (i = 0; i < n_tokens; i++) {
        if (ids[i] < 0 || (uint32_t)ids[i] >= e->vocab)
            return GANG_EPROTO;
    }
    /* The tables: the right count per sequence, every block in the pool, and a block this
     * step writes (one holding positions pos0 .. pos0 + n - 1 of its sequence) in no
     * other sequence of the step, not even to be read (a cached prefix block shared by
     * several sequences is only read). block_seen: 1 + the sequence writing a block. */
    memset(e->block_seen, 0, (size_t)e->n_blocks * sizeof(*e->block_seen));
    w = ids + n_tokens;
    for (i = 0; i < n_seq; i++) {
        uint32_t nb = sched_blocks_for(e, p->seqs[i].pos0 + p->seqs[i].n);

        if (nb > n_table - tab)
            return GANG_EPROTO;
        for (j = 0; j < nb; j++) {
            if (w[j] < 0 || (uint32_t)w[j] >= e->n_blocks)
                return GANG_EPROTO;
            if (j >= p->seqs[i].pos0 / e->block_size) {
                if (e->block_seen[w[j]] != 0)
                    return GANG_EPROTO;
                e->block_seen[w[j]] = i + 1;
            }
        }
        w += nb;
        tab += nb;
    }
    if (tab != n_table)
        return GANG_EPROTO;
    w = ids + n_tokens;
    for (i = 0; i < n_seq; i++) {
        uint32_t nb = sched_blocks_for(e, p->seqs[i].pos0 + p->seqs[i].n);

        for (j = 0; j < nb; j++)
            if (e->block_seen[w[j]] != 0 && e->block_seen[w[j]] != i + 1)
                return GANG_EPROTO;
        /* (On rank 0, the entries its scheduler wrote there.) */
        memcpy(e->tables + (size_t)p->seqs[i].slot * e->max_bps, w, nb * sizeof(int32_t));
        w += nb;
    }
    memmove(p->tokens, ids, (size_t)n_tokens * sizeof(int32_t));
    p->n_seq = n_seq;
    p->n_tokens = n_tokens;
    return 0;
}

int gang__plan_upload_tables(gang_engine *e)
{
    const gang__plan *p = &e->plan;
    uint32_t i;
    int rc = 0;

    for (i = 0; i < p->n_seq && rc == 0; i++) {
        size_t off = (size_t)p->seqs[i].slot * e->max_bps;

        rc = gang_kernels_upload(e->k, e->tables_dev + off, e->tables + off,
                                 sched_blocks_for(e, p->seqs[i].pos0 + p->seqs[i].n) *
                                     sizeof(int32_t));
    }
    return rc;
}
