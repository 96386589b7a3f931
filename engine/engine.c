/*
 * The generation engine: one rank's share of serving a model with a KV cache,
 * continuous batching and sampling, on the tensor-parallel layers and the pipeline
 * schedule of parallel/.
 *
 * Design.
 *
 *  - Rank 0 (stage 0, TP rank 0) owns the requests: submit queues them, the scheduler
 *    (engine-sched.c) turns the queue into one step's plan, poll hands out the events.
 *    Every other rank only ever sees plans.
 *  - A paged KV cache. Every rank holds, for each layer of its stage, one pool of
 *    n_blocks blocks of block_size positions of its kv-head shard; a sequence's block
 *    table (the same for every layer) maps its positions to blocks. n_blocks = kv budget
 *    / bytes per block of the gang's LARGEST stage shard (the stage with the most layers
 *    is the one that must fit), capped at max_batch whole contexts; ranks with different
 *    budgets agree on the smallest (gang_engine_limit_blocks). `slots` (= max_batch)
 *    sequences run at once; rank 0 allocates the blocks (engine-kv.c) and the plan
 *    carries the tables.
 *  - A step is a collective call. Rank 0 builds the plan (per sequence: slot, pos0, n
 *    tokens, token ids, sampling parameters, whether to sample) and broadcasts it over
 *    the world communicator: a fixed-size header, then the variable part, whose size
 *    every rank checks against its own bounds first (GANG_EPROTO otherwise). An empty
 *    plan is an idle tick: every rank returns after the broadcast.
 *  - Every rank then runs its stage (engine-run.c): stage 0 embeds, every stage runs its
 *    layers with gang_tp_layer_forward_batch on the TP communicator, activations go
 *    point-to-point over the PP communicator to the same TP rank of the next stage,
 *    tagged by microbatch, in the GPipe schedule; the last stage norms the last token of
 *    each sampling sequence, applies its vocabulary rows of the LM head, all-gathers the
 *    logits over TP, and its TP rank 0 samples (sample.c) and sends the tokens to rank 0
 *    over the world communicator (host data; pp carries only activations, in one
 *    direction per pair of neighbours, which nccl's untagged point-to-point needs).
 *  - Rank 0 commits the tokens: TOKEN events, DONE on a stop token or at max_tokens,
 *    and the slot and blocks are free for the next waiting request in the next step.
 *  - Every buffer a step needs is allocated here, at init, from the config's bounds:
 *    a step carries at most `slots` sequences and slots + max_step_tokens tokens.
 *    Nothing is allocated in the step loop (submit allocates the request it queues).
 *  - Memory: every buffer a step touches (KV pools and tables, activations, the layers' scratch,
 * the head's buffers, the token ids) is tensor memory of the engine's kernels handle
 *    (gang_engine_init_on; a "cpu" handle of its own otherwise), and the model's arrays
 *    must live there too (gang_model_to_device), so the same code runs on host and
 *    device memory. Sampling stays on the host: the sampled logits rows come back in one
 *    download per microbatch. With a device handle and host communicators, the TP
 *    all-reduces, the activation transfers and the logits all-gather are staged through
 *    host buffers allocated here (gang_tp_stage_*); with nccl tp and pp communicators
 *    the device buffers go to NCCL as they are. The plan and the tokens are host data
 *    and travel as they are over the world communicator, which must be a host one.
 *  - Sampling draws are keyed by (seed, position), so a request's tokens do not depend
 *    on how it was batched, cut into microbatches or chunked, or on a gang restart.
 *  - A failed step (abort, lost peer, deadline) leaves the communicators unusable; the
 *    caller resets the engine (requests dropped, slots forgotten, weights and buffers
 *    kept) and re-submits from the prompts in the next generation.
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine-internal.h"

/* a x b into *out; 0, or GANG_EINVAL when the product does not fit a size_t. */
static int eng_mul(size_t a, size_t b, size_t *out)
{
    if (a != 0 && b > SIZE_MAX / a)
        return GANG_EINVAL;
    *out = a * b;
    return 0;
}

void gang_engine_free(gang_engine *e)
{
    if (e == NULL)
        return;
    gang__sched_clear(e);
    /* Nothing enqueued may still use the buffers when they return to the pool. */
    if (e->k != NULL)
        gang_kernels_sync(e->k);
    free(e->caches);
    free(e->cache_ptrs);
    free(e->tables);
    free(e->block_seen);
    free(e->free_blocks);
    free(e->blk_ref);
    free(e->blk_hash);
    free(e->blk_parent);
    free(e->blk_tokens);
    free(e->blk_cached);
    free(e->ht_head);
    free(e->ht_next);
    free(e->lru_prev);
    free(e->lru_next);
    free(e->pc_hits);
    gang_tp_scratch_free(&e->scratch);
    gang__dev_free(e);
    if (e->k != NULL) {
        gang_kernels_free(e->k, e->kv_mem);
        gang_kernels_free(e->k, e->tables_dev);
        gang_kernels_free(e->k, e->act);
        gang_kernels_free(e->k, e->tokens_dev);
        gang_kernels_free(e->k, e->head_in);
        gang_kernels_free(e->k, e->head_out);
        gang_kernels_free(e->k, e->head_pad);
        gang_kernels_free(e->k, e->gathered);
        gang_kernels_free(e->k, e->logits_dev);
    }
    gang_kernels_close(e->own_k);
    free(e->logits);
    free(e->head_row);
    free(e->stage.host);
    free(e->shards);
    gang__sampler_free(&e->sampler);
    free(e->hist);
    free(e->plan_buf);
    free(e->wire_tables);
    free(e->slot_seen);
    free(e->plan.seqs);
    free(e->plan.tokens);
    free(e->plan.seq_tokens);
    free(e->plan.seq_pos0);
    free(e->plan.out);
    free(e->plan.res);
    gang__xfer_free(e);
    free(e->slot_req);
    free(e->events);
    free(e);
}

/* Checks that the model holds what its stage needs. */
static int eng_check_model(const gang_model *m, char *err, size_t errlen)
{
    uint32_t first, count;

    if (gang_topology_stage_layers(&m->topo, m->place.pp_stage, &first, &count) != 0 ||
        first != m->layer_first || count != m->layer_count || m->layers == NULL) {
        gang_set_err(err, errlen, "model shard does not match its topology (stage layers)");
        return GANG_EINVAL;
    }
    if (m->place.pp_stage == 0 && m->embed == NULL) {
        gang_set_err(err, errlen, "stage 0 has no embedding table");
        return GANG_EINVAL;
    }
    if (m->place.pp_stage + 1 == m->topo.pp && (m->final_norm == NULL || m->lm_head == NULL)) {
        gang_set_err(err, errlen, "the last stage has no final norm or LM head");
        return GANG_EINVAL;
    }
    if (m->topo.vocab == 0 || m->topo.vocab > GANG_MODEL_MAX_VOCAB || m->topo.hidden == 0) {
        gang_set_err(err, errlen, "model vocabulary or width out of bounds");
        return GANG_EINVAL;
    }
    return 0;
}

static int eng_talloc(gang_engine *e, size_t n, void *out);

/*
 * KV blocks: the budget over the bytes one block takes on the gang's largest stage shard
 * (the first stages hold one more layer when the split is uneven), computed from the
 * topology and the config alone so that every rank arrives at the same count. The pool
 * must hold at least one sequence of the whole context (a lone sequence can always
 * finish), and no more than max_batch such sequences could use; slots (sequences in
 * flight) = min(max_batch, blocks).
 */
static int eng_blocks(gang_engine *e, char *err, size_t errlen)
{
    const gang_topology *t = &e->m->topo;
    uint32_t max_layers = t->n_layers / t->pp + (t->n_layers % t->pp != 0 ? 1u : 0u);
    size_t per_block, es = gang_dtype_size(e->cfg.kv_dtype);
    uint64_t n;

    e->block_size = e->cfg.block_size != 0 ? e->cfg.block_size : GANG_KV_BLOCK_DEFAULT;
    e->max_bps = (e->max_ctx + e->block_size - 1) / e->block_size;
    if (eng_mul((size_t)max_layers * 2u * es, e->block_size, &per_block) != 0 ||
        eng_mul(per_block, (size_t)t->kv_heads_per_rank * t->head_dim, &per_block) != 0) {
        gang_set_err(err, errlen, "KV block size overflows");
        return GANG_EINVAL;
    }
    n = e->cfg.kv_cache_bytes / per_block;
    if (n < e->max_bps) {
        gang_set_err(err, errlen,
                     "KV cache budget of %" PRIu64 " bytes holds %" PRIu64 " blocks of %u "
                     "positions, fewer than one sequence of the context (%u positions) needs: "
                     "%u blocks of %zu bytes (%u layers x 2 x %u positions x %u kv heads x %u "
                     "x %zu bytes)",
                     e->cfg.kv_cache_bytes, n, e->block_size, e->max_ctx, e->max_bps, per_block,
                     max_layers, e->block_size, t->kv_heads_per_rank, t->head_dim, es);
        return GANG_ENOMEM;
    }
    /* More than max_batch sequences of the whole context could never use. */
    if (n > (uint64_t)e->cfg.max_batch * e->max_bps)
        n = (uint64_t)e->cfg.max_batch * e->max_bps;
    if (n > INT32_MAX)
        n = INT32_MAX;
    e->n_blocks = (uint32_t)n;
    e->n_usable = e->n_blocks;
    e->slots = n < e->cfg.max_batch ? (uint32_t)n : e->cfg.max_batch;
    return 0;
}

/* Allocates this rank's block pools, the slots' tables and their per-layer caches. */
static int eng_alloc_caches(gang_engine *e)
{
    const gang_model *m = e->m;
    size_t row = (size_t)m->shard.kv_head_count * m->topo.head_dim, pool, n, l, i;
    size_t es = gang_dtype_size(e->cfg.kv_dtype);
    size_t n_tab = (size_t)e->slots * e->max_bps;
    int rc;

    n = (size_t)m->layer_count * e->slots;
    pool = row * e->block_size * e->n_blocks;
    e->caches = calloc(n, sizeof(*e->caches));
    e->cache_ptrs = calloc(e->slots, sizeof(*e->cache_ptrs));
    e->tables = calloc(n_tab, sizeof(int32_t));
    e->block_seen = calloc(e->n_blocks, sizeof(*e->block_seen));
    if (e->caches == NULL || e->cache_ptrs == NULL || e->tables == NULL || e->block_seen == NULL)
        return GANG_ENOMEM;
    if (m->place.rank == 0) {
        size_t nb = e->n_blocks;

        e->ht_cap = 1;
        while (e->ht_cap < nb && e->ht_cap < (1u << 30))
            e->ht_cap <<= 1;
        e->free_blocks = malloc(nb * sizeof(uint32_t));
        e->blk_ref = calloc(nb, sizeof(uint32_t));
        e->blk_hash = calloc(nb, sizeof(uint64_t));
        e->blk_parent = calloc(nb, sizeof(int32_t));
        e->blk_tokens = malloc(nb * e->block_size * sizeof(int32_t));
        e->blk_cached = calloc(nb, 1);
        e->ht_head = malloc((size_t)e->ht_cap * sizeof(int32_t));
        e->ht_next = calloc(nb, sizeof(int32_t));
        e->lru_prev = calloc(nb, sizeof(int32_t));
        e->lru_next = calloc(nb, sizeof(int32_t));
        e->pc_hits = calloc(e->max_bps, sizeof(int32_t));
        if (e->free_blocks == NULL || e->blk_ref == NULL || e->blk_hash == NULL ||
            e->blk_parent == NULL || e->blk_tokens == NULL || e->blk_cached == NULL ||
            e->ht_head == NULL || e->ht_next == NULL || e->lru_prev == NULL ||
            e->lru_next == NULL || e->pc_hits == NULL)
            return GANG_ENOMEM;
        gang__kv_reset(e);
    }
    rc = eng_talloc(e, n_tab, &e->tables_dev);
    if (rc != 0)
        return rc;
    /* Rows are always written before they are read, so the pools need no clearing. */
    rc = gang_kernels_alloc(e->k, 2 * m->layer_count * pool * es, (void **)&e->kv_mem);
    if (rc != 0)
        return rc;
    for (l = 0; l < m->layer_count; l++) {
        for (i = 0; i < e->slots; i++) {
            gang_tp_kv_cache *c = &e->caches[l * e->slots + i];

            /* (bf16 / f16 pools: k and v point at half-precision data, see parallel.h) */
            c->k = (float *)(void *)(e->kv_mem + 2 * l * pool * es);
            c->v = (float *)(void *)(e->kv_mem + (2 * l + 1) * pool * es);
            c->dtype = e->cfg.kv_dtype;
            c->cap = e->max_ctx;
            c->table = e->tables_dev + i * e->max_bps;
            c->table_host = e->tables + i * e->max_bps;
            c->table_base = e->tables_dev;
            c->table_off = i * e->max_bps;
            c->block_size = e->block_size;
            c->n_blocks = e->n_blocks;
        }
    }
    return 0;
}

/* Tensor memory of e->k for n floats (or int32s). */
static int eng_talloc(gang_engine *e, size_t n, void *out)
{
    return gang_kernels_alloc(e->k, n * sizeof(float), (void **)out);
}

/*
 * The last stage's head buffers. The padding columns of head_pad are never written by a
 * step (only the vocab_count columns of each row are), so they are zeroed once here and
 * the all-gather always carries defined values.
 */
static int eng_alloc_head(gang_engine *e)
{
    const gang_model *m = e->m;
    size_t hidden = m->topo.hidden, slots = e->slots;
    float *zeros;
    int rc;

    rc = eng_talloc(e, slots * hidden, &e->head_in);
    if (rc == 0)
        rc = eng_talloc(e, slots * m->shard.vocab_count, &e->head_out);
    if (rc == 0 && m->topo.tp > 1)
        rc = eng_talloc(e, slots * e->vpad, &e->head_pad);
    if (rc == 0 && m->topo.tp > 1)
        rc = eng_talloc(e, (size_t)m->topo.tp * slots * e->vpad, &e->gathered);
    if (rc == 0 && m->topo.tp > 1 && (gang_kernels_caps(e->k) & GANG_KERNELS_CAP_DEVICE_MEM))
        rc = eng_talloc(e, slots * e->vocab, &e->logits_dev);
    if (rc != 0)
        return rc;
    e->logits = malloc(slots * e->vocab * sizeof(float));
    e->head_row = calloc(slots, sizeof(uint32_t));
    if (e->logits == NULL || e->head_row == NULL)
        return GANG_ENOMEM;
    if (m->topo.tp > 1) {
        zeros = calloc(slots * e->vpad, sizeof(float));
        if (zeros == NULL)
            return GANG_ENOMEM;
        rc = gang_kernels_upload(e->k, e->head_pad, zeros, slots * e->vpad * sizeof(float));
        free(zeros);
    }
    return rc;
}

/*
 * Host staging of a device engine over host communicators: one buffer for the largest
 * of an activation transfer (max_tokens x hidden) and the logits all-gather (its send
 * part and the tp parts it receives). A host engine needs none.
 */
static int eng_alloc_stage(gang_engine *e)
{
    size_t act = (size_t)e->max_tokens * e->m->topo.hidden, head = 0;

    if (!(gang_kernels_caps(e->k) & GANG_KERNELS_CAP_DEVICE_MEM))
        return 0;
    if (e->is_last && e->m->topo.tp > 1)
        head = (size_t)(e->m->topo.tp + 1) * e->slots * e->vpad;
    e->stage.bytes = (act > head ? act : head) * sizeof(float);
    e->stage.host = malloc(e->stage.bytes);
    return e->stage.host == NULL ? GANG_ENOMEM : 0;
}

/* Allocates the activations, the head's buffers, the plan and rank 0's bookkeeping. */
static int eng_alloc_buffers(gang_engine *e)
{
    const gang_model *m = e->m;
    size_t hidden = m->topo.hidden, n;
    uint32_t r;
    int rc;

    if (eng_mul((size_t)e->max_tokens, hidden, &n) != 0 || n > SIZE_MAX / sizeof(float))
        return GANG_EINVAL;
    rc = eng_talloc(e, n, &e->act);
    if (rc == 0 && e->is_first)
        rc = eng_talloc(e, e->max_tokens, &e->tokens_dev);
    if (rc == 0)
        rc = eng_alloc_stage(e);
    if (rc != 0)
        return rc;
    if (m->layer_count > 0) {
        rc = gang_tp_scratch_init_on(&e->scratch, &m->layers[0], e->max_tokens, e->k);
        if (rc != 0)
            return rc;
    }
    if (e->is_last) {
        rc = eng_alloc_head(e);
        if (rc != 0)
            return rc;
        e->shards = calloc(m->topo.tp, sizeof(*e->shards));
        if (e->shards == NULL)
            return GANG_ENOMEM;
        for (r = 0; r < m->topo.tp; r++) {
            rc = gang_topology_tp_shard(&m->topo, r, &e->shards[r]);
            if (rc != 0)
                return rc;
        }
        rc = gang__sampler_init(&e->sampler, e->vocab);
        if (rc != 0)
            return rc;
        /* The penalties' token history: only the rank that samples needs it. */
        if (m->place.tp_rank == 0) {
            e->hist = malloc((size_t)e->slots * e->max_ctx * sizeof(int32_t));
            if (e->hist == NULL)
                return GANG_ENOMEM;
        }
    }
    e->plan_max_words = ((size_t)e->slots * GANG__PLAN_SEQ_MAX_BYTES + 3) / 4 +
                        (size_t)e->slots * e->max_bps + e->max_tokens +
                        (GANG__PLAN_KV_MAX_BYTES(e->max_bps) + 3) / 4;
    e->plan_buf = malloc((GANG__PLAN_HDR_WORDS + e->plan_max_words) * sizeof(int32_t));
    e->wire_tables = malloc((size_t)e->slots * e->max_bps * sizeof(int32_t));
    e->slot_seen = calloc(e->slots, 1);
    e->plan.seqs = calloc(e->slots, sizeof(*e->plan.seqs));
    e->plan.tokens = malloc((size_t)e->max_tokens * sizeof(int32_t));
    e->plan.seq_tokens = calloc(e->slots, sizeof(uint32_t));
    e->plan.seq_pos0 = calloc(e->slots, sizeof(uint32_t));
    e->plan.out = calloc(e->slots, sizeof(int32_t));
    e->plan.res = calloc(e->slots, sizeof(*e->plan.res));
    e->plan.kv_blocks = calloc(e->max_bps, sizeof(int32_t));
    if (e->plan_buf == NULL || e->wire_tables == NULL || e->slot_seen == NULL ||
        e->plan.seqs == NULL || e->plan.tokens == NULL || e->plan.seq_tokens == NULL ||
        e->plan.seq_pos0 == NULL || e->plan.out == NULL || e->plan.res == NULL ||
        e->plan.kv_blocks == NULL || gang__xfer_alloc(e) != 0)
        return GANG_ENOMEM;
    if (m->place.rank == 0) {
        e->slot_req = calloc(e->slots, sizeof(*e->slot_req));
        e->ev_cap = 4 * e->slots;
        e->events = calloc(e->ev_cap, sizeof(*e->events));
        if (e->slot_req == NULL || e->events == NULL)
            return GANG_ENOMEM;
    }
    return 0;
}

int gang_engine_init(gang_model *m, const gang_engine_config *cfg, gang_engine **out, char *err,
                     size_t errlen)
{
    return gang_engine_init_on(m, NULL, cfg, out, err, errlen);
}

/* The model's arrays must be tensor memory of k: moved to k for a device, host for cpu. */
static int eng_check_memory(const gang_model *m, gang_kernels *k, char *err, size_t errlen)
{
    if ((gang_kernels_caps(k) & GANG_KERNELS_CAP_DEVICE_MEM) && m->mem != k) {
        gang_set_err(err, errlen,
                     "the model is not on the engine's '%s' device "
                     "(call gang_model_to_device first)",
                     gang_kernels_name(k));
        return GANG_EINVAL;
    }
    if (!(gang_kernels_caps(k) & GANG_KERNELS_CAP_DEVICE_MEM) && m->mem != NULL) {
        gang_set_err(err, errlen, "the model lives on a device, the engine's handle is '%s'",
                     gang_kernels_name(k));
        return GANG_EINVAL;
    }
    return 0;
}

gang_dtype gang_engine_kv_dtype_auto(gang_kernels_wtype wt)
{
    return wt == GANG_KW_BF16  ? GANG_DTYPE_BF16
           : wt == GANG_KW_F16 ? GANG_DTYPE_F16
                               : GANG_DTYPE_F32;
}

int gang_engine_init_on(gang_model *m, gang_kernels *k, const gang_engine_config *cfg,
                        gang_engine **out, char *err, size_t errlen)
{
    gang_engine *e = NULL;
    int rc;

    gang_set_err(err, errlen, "%s", "");
    if (out != NULL)
        *out = NULL;
    if (m == NULL || cfg == NULL || out == NULL) {
        gang_set_err(err, errlen, "NULL argument");
        return GANG_EINVAL;
    }
    if (cfg->max_batch == 0 || cfg->max_ctx < 2 || cfg->microbatches == 0 ||
        cfg->max_step_tokens == 0 || cfg->max_batch > UINT32_MAX / 2 ||
        cfg->max_step_tokens > UINT32_MAX / 2 ||
        (cfg->kv_dtype != GANG_DTYPE_F32 && cfg->kv_dtype != GANG_DTYPE_BF16 &&
         cfg->kv_dtype != GANG_DTYPE_F16)) {
        gang_set_err(err, errlen,
                     "engine config out of range (max_batch >= 1, max_ctx >= 2, microbatches >= 1, "
                     "max_step_tokens >= 1, kv_dtype f32, bf16 or f16)");
        return GANG_EINVAL;
    }
    rc = eng_check_model(m, err, errlen);
    if (rc == 0 && k != NULL)
        rc = eng_check_memory(m, k, err, errlen);
    if (rc == 0 && k == NULL && m->mem != NULL) {
        gang_set_err(err, errlen, "the model lives on a device: use gang_engine_init_on");
        rc = GANG_EINVAL;
    }
    if (rc != 0)
        return rc;
    e = calloc(1, sizeof(*e));
    if (e == NULL)
        return GANG_ENOMEM;
    e->m = m;
    e->k = k;
    if (k == NULL) {
        rc = gang_kernels_open("cpu", &e->own_k);
        if (rc != 0)
            goto out_free;
        e->k = e->own_k;
    }
    e->cfg = *cfg;
    e->max_ctx = cfg->max_ctx;
    uint32_t allowed = m->cfg.max_ctx_allowed > 0 ? m->cfg.max_ctx_allowed : m->cfg.max_pos;
    if (allowed > 0 && e->max_ctx > allowed)
        e->max_ctx = allowed;
    e->vocab = m->topo.vocab;
    e->vpad = (e->vocab + m->topo.tp - 1) / m->topo.tp;
    e->is_first = m->place.pp_stage == 0;
    e->is_last = m->place.pp_stage + 1 == m->topo.pp;
    rc = eng_blocks(e, err, errlen);
    if (rc != 0)
        goto out_free;
    e->max_tokens = e->slots + cfg->max_step_tokens;
    rc = eng_alloc_caches(e);
    if (rc == 0)
        rc = eng_alloc_buffers(e);
    if (rc == 0)
        rc = gang__dev_alloc(e);
    if (rc != 0) {
        if (err != NULL && errlen > 0 && err[0] == '\0')
            gang_set_err(err, errlen, "engine buffers: %s", gang_strerror(rc));
        goto out_free;
    }
    *out = e;
    return 0;

out_free:
    gang_engine_free(e);
    return rc;
}

uint32_t gang_engine_slots(const gang_engine *e)
{
    return e == NULL ? 0 : e->slots;
}

int gang_engine_kv_info(const gang_engine *e, gang_engine_kv *out)
{
    if (e == NULL || out == NULL)
        return GANG_EINVAL;
    memset(out, 0, sizeof(*out));
    out->block_size = e->block_size;
    out->blocks = e->n_usable;
    out->tokens = (uint64_t)e->n_usable * e->block_size;
    out->full_seqs = e->n_usable / e->max_bps;
    out->free_blocks = e->free_blocks != NULL ? e->n_free + e->n_lru : 0;
    out->preempted = e->n_preempted;
    out->slots = e->slots;
    out->max_ctx = e->max_ctx;
    out->dtype = e->cfg.kv_dtype;
    out->prefix_query_tokens = e->prefix_query_tokens;
    out->prefix_hit_tokens = e->prefix_hit_tokens;
    out->cached_blocks = e->n_lru;
    for (const gang__request *r = e->queue_head; r != NULL; r = r->next) {
        out->running += r->running != 0;
        out->waiting += r->running == 0;
    }
    return 0;
}

int gang_engine_limit_blocks(gang_engine *e, uint32_t n)
{
    if (e == NULL || n < e->max_bps)
        return GANG_EINVAL;
    if (e->n_pending != 0)
        return GANG_EAGAIN;
    e->n_usable = n < e->n_blocks ? n : e->n_blocks;
    if (e->free_blocks != NULL)
        gang__kv_reset(e);
    return 0;
}

uint32_t gang_engine_max_ctx(const gang_engine *e)
{
    return e == NULL ? 0 : e->max_ctx;
}

int gang_engine_cancel(gang_engine *e, uint64_t id)
{
    if (e == NULL)
        return GANG_EINVAL;
    return gang__sched_cancel(e, id);
}

uint32_t gang_engine_pending(const gang_engine *e)
{
    /* (A pending export needs a step too, with no request left.) */
    return e == NULL ? 0 : e->n_pending + e->kvx_count;
}

/* Validates r against the engine; 0 or GANG_EINVAL with the reason in err. */
static int eng_check_request(const gang_engine *e, const gang_gen_request *r, char *err,
                             size_t errlen)
{
    const gang__request *q;
    uint32_t i;

    if (r->prompt == NULL || r->n_prompt == 0) {
        gang_set_err(err, errlen, "request %" PRIu64 ": empty prompt", r->id);
        return GANG_EINVAL;
    }
    for (i = 0; i < r->n_prompt; i++) {
        if (r->prompt[i] < 0 || (uint32_t)r->prompt[i] >= e->vocab) {
            gang_set_err(err, errlen,
                         "request %" PRIu64 ": prompt token %u is %d, outside the "
                         "vocabulary of %u",
                         r->id, i, r->prompt[i], e->vocab);
            return GANG_EINVAL;
        }
    }
    if (r->max_tokens == 0) {
        gang_set_err(err, errlen, "request %" PRIu64 ": max_tokens must be >= 1", r->id);
        return GANG_EINVAL;
    }
    if ((uint64_t)r->n_prompt + r->max_tokens > e->max_ctx) {
        gang_set_err(err, errlen,
                     "request %" PRIu64 ": prompt (%u) + max_tokens (%u) exceeds the "
                     "context of %u",
                     r->id, r->n_prompt, r->max_tokens, e->max_ctx);
        return GANG_EINVAL;
    }
    if (r->sampling.n_stop > GANG_MAX_STOP_TOKENS) {
        gang_set_err(err, errlen, "request %" PRIu64 ": %u stop tokens, at most %d", r->id,
                     r->sampling.n_stop, GANG_MAX_STOP_TOKENS);
        return GANG_EINVAL;
    }
    if (!(r->sampling.temperature >= 0.0f) || !isfinite(r->sampling.temperature) ||
        !(r->sampling.top_p > 0.0f && r->sampling.top_p <= 1.0f)) {
        gang_set_err(err, errlen,
                     "request %" PRIu64 ": temperature must be >= 0 and top_p in (0, 1]", r->id);
        return GANG_EINVAL;
    }
    if (!gang__penalties_ok(&r->sampling)) {
        gang_set_err(err, errlen,
                     "request %" PRIu64 ": presence_penalty and frequency_penalty must be in "
                     "[-2, 2], repetition_penalty 0 (off) or > 0, logit_bias values in [-100, 100]",
                     r->id);
        return GANG_EINVAL;
    }
    if (r->sampling.ignore_eos > 1 || r->sampling.logprobs > 1 ||
        r->sampling.top_logprobs > GANG_MAX_TOP_LOGPROBS ||
        (r->sampling.top_logprobs > 0 && !r->sampling.logprobs)) {
        gang_set_err(err, errlen,
                     "request %" PRIu64 ": ignore_eos and logprobs are 0 or 1, top_logprobs "
                     "at most %d and only with logprobs",
                     r->id, GANG_MAX_TOP_LOGPROBS);
        return GANG_EINVAL;
    }
    for (q = e->queue_head; q != NULL; q = q->next) {
        if (q->r.id == r->id) {
            gang_set_err(err, errlen, "request %" PRIu64 ": duplicate id", r->id);
            return GANG_EINVAL;
        }
    }
    return 0;
}

int gang_engine_submit(gang_engine *e, const gang_gen_request *r, char *err, size_t errlen)
{
    gang__request *q;
    int rc;

    gang_set_err(err, errlen, "%s", "");
    if (e == NULL || r == NULL) {
        gang_set_err(err, errlen, "NULL argument");
        return GANG_EINVAL;
    }
    if (e->m->place.rank != 0) {
        gang_set_err(err, errlen, "requests are submitted on rank 0 only");
        return GANG_EINVAL;
    }
    /* A grammar travels after the prompt (gang_gen_request): the prompt is what is before. */
    gang_gen_request rr = *r;
    uint32_t gw = GANG_GRAMMAR_WORDS(r->sampling.grammar_bytes);
    if (r->sampling.grammar_bytes > GANG_GRAMMAR_MAX_BYTES || (gw > 0 && gw >= r->n_prompt)) {
        gang_set_err(err, errlen, "request %" PRIu64 ": a grammar of %u bytes in %u ids", r->id,
                     r->sampling.grammar_bytes, r->n_prompt);
        return GANG_EINVAL;
    }
    rr.n_prompt -= gw;
    rc = eng_check_request(e, &rr, err, errlen);
    if (rc != 0)
        return rc;
    q = calloc(1, sizeof(*q));
    if (q == NULL)
        return GANG_ENOMEM;
    /* Room for the output too: a preempted request recomputes prompt and output. The
     * grammar's words stay after that room. */
    q->prompt = malloc(((size_t)r->n_prompt + r->max_tokens) * sizeof(int32_t));
    if (q->prompt == NULL) {
        free(q);
        return GANG_ENOMEM;
    }
    memcpy(q->prompt, r->prompt, (size_t)rr.n_prompt * sizeof(int32_t));
    if (gw > 0) {
        int32_t *gwords = q->prompt + rr.n_prompt + r->max_tokens;
        memcpy(gwords, r->prompt + rr.n_prompt, (size_t)gw * sizeof(int32_t));
        q->grammar = (char *)gwords;
    }
    q->r = rr;
    q->r.prompt = q->prompt;
    q->r.kv.host[GANG_KV_HOST_MAX - 1] = '\0';
    if (e->queue_tail != NULL)
        e->queue_tail->next = q;
    else
        e->queue_head = q;
    e->queue_tail = q;
    e->n_pending++;
    return 0;
}

int gang_engine_poll(gang_engine *e, gang_gen_event *ev)
{
    if (e == NULL || ev == NULL || e->ev_count == 0)
        return 0;
    *ev = e->events[e->ev_head];
    e->ev_head = (e->ev_head + 1) % e->ev_cap;
    e->ev_count--;
    return 1;
}

void gang_engine_reset(gang_engine *e)
{
    if (e == NULL)
        return;
    gang__sched_clear(e);
    gang__xfer_clear(e);
    /*
     * Cache rows are always written before they are read (a sequence's step writes rows
     * pos0 .. pos0 + n - 1 and attends to rows below), so forgetting the slots is only
     * forgetting who held them; the plan of the failed step is dropped too.
     */
    e->plan.n_seq = 0;
    e->plan.n_tokens = 0;
    e->plan_valid = 0;
    /* A graph holds the collectives of the communicators it was captured with. Graphs
     * dropped after a failed capture are tried again: what failed (a peer's capture, memory
     * short at that moment) may not fail in this generation; a capture that always fails
     * costs one recording per batch size and generation. */
    gang__dev_graph_clear(e);
    e->graphs_off = 0;
}

/* Checks a communicator against the size and rank the topology gives this rank. */
static int eng_check_comm(gang_comm *c, uint32_t size, uint32_t rank)
{
    if (c == NULL)
        return size == 1 ? 0 : GANG_EINVAL;
    return gang_comm_size(c) == size && gang_comm_rank(c) == rank ? 0 : GANG_EINVAL;
}

/* Broadcasts rank 0's plan to every rank and decodes it; every rank validates it. */
static int eng_exchange_plan(gang_engine *e, gang_comm *world, uint64_t deadline)
{
    uint32_t body = 0;
    uint64_t left;
    int rc;

    if (e->m->place.rank == 0)
        gang__plan_encode(e);
    if (world != NULL && gang_comm_size(world) > 1) {
        rc = gang_deadline_left(deadline, &left);
        if (rc != 0)
            return rc;
        rc = gang_comm_broadcast(world, e->plan_buf, GANG__PLAN_HDR_WORDS, GANG_DTYPE_I32, 0, left);
        if (rc != 0)
            return rc;
    }
    rc = gang__plan_check_header(e, e->plan_buf, &body);
    if (rc != 0)
        return rc;
    if (body > 0 && world != NULL && gang_comm_size(world) > 1) {
        rc = gang_deadline_left(deadline, &left);
        if (rc != 0)
            return rc;
        rc = gang_comm_broadcast(world, e->plan_buf + GANG__PLAN_HDR_WORDS, body, GANG_DTYPE_I32, 0,
                                 left);
        if (rc != 0)
            return rc;
    }
    rc = gang__plan_decode(e);
    return rc != 0 ? rc : gang__plan_upload_tables(e);
}

int gang_engine_step(gang_engine *e, gang_kernels *k, gang_comm *world, gang_comm *tp,
                     gang_comm *ep, gang_comm *pp, uint64_t timeout_ms)
{
    const gang_model *m;
    uint64_t deadline;
    int rc;

    if (e == NULL || k == NULL || timeout_ms == 0)
        return GANG_EINVAL;
    /* Device buffers are only valid on the handle they came from; host ones on any host
     * handle. */
    if ((gang_kernels_caps(k) & GANG_KERNELS_CAP_DEVICE_MEM)
            ? k != e->k
            : (gang_kernels_caps(e->k) & GANG_KERNELS_CAP_DEVICE_MEM))
        return GANG_EINVAL;
    m = e->m;
    if (eng_check_comm(world, m->topo.world_size, m->place.rank) != 0 ||
        eng_check_comm(tp, m->topo.tp, m->place.tp_rank) != 0 ||
        eng_check_comm(pp, m->topo.pp, m->place.pp_stage) != 0 ||
        (m->topo.tp_replicas > 1 && eng_check_comm(ep, m->topo.stage_ranks, m->place.ep_rank) != 0))
        return GANG_EINVAL;
    /* The MoE blocks of a stage wider than its TP group run over the EP group. */
    e->scratch.moe_comm = m->topo.tp_replicas > 1 ? ep : NULL;
    /* The plan and the tokens are host data: they need a world that takes host buffers
     * (tp and pp may take device buffers; gang_tp_stage_* decides per call). */
    if (world != NULL && (gang_comm_caps(world) & GANG_COMM_CAP_HOST_MEM) == 0)
        return GANG_EINVAL;
    deadline = gang_deadline_after(timeout_ms);
    e->plan_valid = 0;
    if (m->place.rank == 0)
        gang__sched_build(e);
    rc = eng_exchange_plan(e, world, deadline);
    if (rc == 0)
        rc = gang__xfer_run(e, world, deadline);
    if (rc != 0)
        return rc;
    if (e->plan.n_seq == 0)
        return 0;
    rc = gang__engine_run(e, k, world, tp, pp, deadline);
    if (rc != 0)
        return rc;
    e->plan_valid = 1;
    if (m->place.rank == 0)
        gang__sched_commit(e);
    return 0;
}
