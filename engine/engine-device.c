/*
 * The decode step on a device (issue #24): what every rank keeps on the device so that a
 * step makes at most one host synchronisation, and what the last stage brings back.
 *
 *  - Block tables stay in tensor memory and are updated in place: the host remembers what
 *    the device holds (tables_held); a step uploads only the (index, block) pairs of the
 *    entries its plan changed, plus each sequence's current entry so that the step's
 *    launches do not depend on whether a block boundary was crossed, in one upload
 *    without a host wait and one scatter launch. (Before: one blocking upload per
 *    sequence per step.)
 *  - Sampling runs on the device (gang_kernels_sample): the sampling parameters of the
 *    step's rows go up without a wait, one launch draws every row, and only the ids come
 *    back, in the step's one download (at the end of the step with one stage; per
 *    microbatch on a pipeline's last stage, which must send them on). A step in which a
 *    sequence asked for logprobs or penalties samples on the host instead (the rows of
 *    logits come down, one download): those need the whole row and the history.
 *  - The logits stay on the device after the step; gang__engine_logits downloads a row
 *    when a test or the reference tool asks for it.
 * A host engine ("cpu") keeps its own path: it has no device to spare a copy to.
 */
#include <stdlib.h>
#include <string.h>

#include "engine-internal.h"

/* Whether e's handle is a device (tensor memory the host cannot read). */
static int dev_is_device(const gang_engine *e)
{
    return (gang_kernels_caps(e->k) & GANG_KERNELS_CAP_DEVICE_MEM) != 0;
}

int gang__dev_alloc(gang_engine *e)
{
    size_t n_tab = (size_t)e->slots * e->max_bps;
    int rc;

    if (!dev_is_device(e))
        return 0;
    e->tables_held = calloc(n_tab, sizeof(int32_t));
    e->tab_pairs = malloc(2 * n_tab * sizeof(int32_t));
    if (e->tables_held == NULL || e->tab_pairs == NULL)
        return GANG_ENOMEM;
    rc = gang_kernels_alloc(e->k, 2 * n_tab * sizeof(int32_t), (void **)&e->tab_pairs_dev);
    if (rc != 0)
        return rc;
    /* The device tables start as the host's copy says: all zeros (init waits, not a step). */
    rc = gang_kernels_upload(e->k, e->tables_dev, e->tables_held, n_tab * sizeof(int32_t));
    if (rc != 0 || !e->is_last)
        return rc;
    e->samp = calloc(e->slots, sizeof(*e->samp));
    e->ids = calloc(e->slots, sizeof(int32_t));
    if (e->samp == NULL || e->ids == NULL)
        return GANG_ENOMEM;
    rc = gang_kernels_alloc(e->k, e->slots * sizeof(*e->samp), (void **)&e->samp_dev);
    if (rc == 0)
        rc = gang_kernels_alloc(e->k, e->slots * sizeof(int32_t), (void **)&e->ids_dev);
    return rc;
}

void gang__dev_free(gang_engine *e)
{
    gang__dev_graph_clear(e);
    if (e->k != NULL) {
        gang_kernels_free(e->k, e->tab_pairs_dev);
        gang_kernels_free(e->k, e->samp_dev);
        gang_kernels_free(e->k, e->ids_dev);
    }
    free(e->tables_held);
    free(e->tab_pairs);
    free(e->samp);
    free(e->ids);
}

/*
 * A host engine's tables: each plan sequence's row is copied (host memory, no wait). A
 * device engine's: the changed entries (and each sequence's current one) as pairs, one
 * upload without a wait and one scatter; tables_held follows once both are enqueued.
 */
int gang__plan_upload_tables(gang_engine *e)
{
    const gang__plan *p = &e->plan;
    uint32_t i, j, n = 0, nb;
    int rc = 0;

    if (!dev_is_device(e)) {
        for (i = 0; i < p->n_seq && rc == 0; i++) {
            size_t off = (size_t)p->seqs[i].slot * e->max_bps;

            rc = gang_kernels_upload(e->k, e->tables_dev + off, e->tables + off,
                                     gang__blocks_for(e, p->seqs[i].pos0 + p->seqs[i].n) *
                                         sizeof(int32_t));
        }
        return rc;
    }
    for (i = 0; i < p->n_seq; i++) {
        size_t off = (size_t)p->seqs[i].slot * e->max_bps;

        nb = gang__blocks_for(e, p->seqs[i].pos0 + p->seqs[i].n);
        for (j = 0; j < nb; j++) {
            if (e->tables[off + j] == e->tables_held[off + j] && j + 1 < nb)
                continue;
            e->tab_pairs[2 * n] = (int32_t)(off + j);
            e->tab_pairs[2 * n + 1] = e->tables[off + j];
            n++;
        }
    }
    if (n == 0)
        return 0;
    rc = gang_kernels_upload_async(e->k, e->tab_pairs_dev, e->tab_pairs,
                                   2 * (size_t)n * sizeof(int32_t));
    if (rc == 0)
        rc = gang_kernels_scatter_i32(e->k, e->tables_dev, (size_t)e->slots * e->max_bps,
                                      e->tab_pairs_dev, n);
    for (i = 0; rc == 0 && i < n; i++)
        e->tables_held[e->tab_pairs[2 * i]] = e->tab_pairs[2 * i + 1];
    return rc;
}

/* Whether sp needs the host's sampler: logprobs (the whole row) or a penalty (the history). */
static int dev_needs_host(const gang_sampling *sp)
{
    return sp->logprobs || (sp->repetition_penalty > 0.0f && sp->repetition_penalty != 1.0f) ||
           sp->frequency_penalty != 0.0f || sp->presence_penalty != 0.0f;
}

int gang__dev_step_begin(gang_engine *e)
{
    uint32_t i, j = 0;

    e->host_sample = !dev_is_device(e);
    for (i = 0; i < e->plan.n_seq && !e->host_sample; i++)
        if (e->plan.seqs[i].sample && dev_needs_host(&e->plan.seqs[i].sp))
            e->host_sample = 1;
    e->ids_first = 0;
    e->ids_pending = 0;
    if (e->host_sample || !e->is_last || e->m->place.tp_rank != 0)
        return 0;
    /* Head rows are handed out in plan order (microbatch after microbatch). */
    for (i = 0; i < e->plan.n_seq; i++) {
        const gang__plan_seq *s = &e->plan.seqs[i];

        if (!s->sample)
            continue;
        e->samp[j++] = (gang_kernels_sample_param){.temperature = s->sp.temperature,
                                                   .top_k = s->sp.top_k,
                                                   .top_p = s->sp.top_p,
                                                   .seed = s->sp.seed,
                                                   .position = (uint64_t)s->pos0 + s->n};
    }
    return j == 0 ? 0 : gang_kernels_upload_async(e->k, e->samp_dev, e->samp, j * sizeof(*e->samp));
}

int gang__dev_sample(gang_engine *e, gang_kernels *k, const float *rows, uint32_t first,
                     uint32_t count, uint32_t row0, uint32_t ns)
{
    uint32_t i, j = 0;
    int rc;

    for (i = first; i < first + count; i++)
        if (e->plan.seqs[i].sample)
            e->head_row[i] = row0 + j++;
    rc = gang_kernels_sample(k, rows, ns, e->vocab, e->samp_dev + row0, e->ids_dev + row0);
    if (rc != 0)
        return rc;
    if (e->ids_pending == 0)
        e->ids_first = row0;
    e->ids_pending = row0 + ns - e->ids_first;
    return 0;
}

int gang__dev_fetch_ids(gang_engine *e, gang_kernels *k)
{
    uint32_t i, lo = e->ids_first, hi = e->ids_first + e->ids_pending;
    int rc;

    if (e->ids_pending == 0)
        return 0;
    rc = gang_kernels_download(k, e->ids + lo, e->ids_dev + lo, e->ids_pending * sizeof(int32_t));
    if (rc != 0)
        return rc;
    for (i = 0; i < e->plan.n_seq; i++)
        if (e->plan.seqs[i].sample && e->head_row[i] >= lo && e->head_row[i] < hi)
            e->plan.out[i] = e->ids[e->head_row[i]];
    e->ids_pending = 0;
    return 0;
}

/* ---------------------------------------------------------------------------------
 * Graphs of the decode step. A captured step reads everything that changes from tensor
 * memory written before its launch (ids, positions and table offsets, tables, sampling
 * parameters); what is baked into it depends only on the batch size, which keys it.
 * --------------------------------------------------------------------------------- */
int gang__dev_graph_ok(const gang_engine *e, const gang_comm *tp, uint32_t nmb)
{
    const gang_model *m = e->m;

    if (!e->cfg.cuda_graphs || e->plan.no_graphs || e->host_sample || !dev_is_device(e) ||
        (m->topo.tp != 1 && !gang_comm_graph_ok(tp)) || m->topo.pp != 1 || nmb != 1 ||
        m->layer_count == 0 || m->layers[0].rope_dyn_factor > 0.0f)
        return 0;
    /* A MoE block routes on the host (downloads inside the step): never captured. */
    for (uint32_t i = 0; i < m->layer_count; i++)
        if (m->layers[i].moe != NULL)
            return 0;
    for (uint32_t i = 0; i < e->plan.n_seq; i++)
        if (e->plan.seqs[i].n != 1 || !e->plan.seqs[i].sample)
            return 0;
    return 1;
}

gang_kernels_graph *gang__dev_graph_find(const gang_engine *e)
{
    for (uint32_t i = 0; i < e->n_graphs; i++)
        if (e->graph_batch[i] == e->plan.n_seq)
            return e->graphs[i];
    return NULL;
}

/* Layer 0's call stands for every layer's: the same batch, the same slots' tables. */
int gang__dev_graph_prepare(gang_engine *e, gang_kernels *k)
{
    for (uint32_t i = 0; i < e->plan.n_seq; i++)
        e->cache_ptrs[i] = &e->caches[e->plan.seqs[i].slot];
    return gang_tp_scratch_prepare(&e->scratch, &e->m->layers[0], k, e->plan.n_seq,
                                   e->plan.seq_tokens, e->plan.seq_pos0, e->cache_ptrs);
}

/* The step's ids download that follows ends every launch, so no evicted graph is running. */
void gang__dev_graph_store(gang_engine *e, gang_kernels_graph *g)
{
    uint32_t at = e->n_graphs;

    if (at == GANG__GRAPHS) {
        at = e->graph_next;
        e->graph_next = (e->graph_next + 1) % GANG__GRAPHS;
        gang_kernels_graph_free(e->k, e->graphs[at]);
    } else {
        e->n_graphs++;
    }
    e->graphs[at] = g;
    e->graph_batch[at] = e->plan.n_seq;
}

void gang__dev_graph_clear(gang_engine *e)
{
    for (uint32_t i = 0; i < e->n_graphs; i++)
        gang_kernels_graph_free(e->k, e->graphs[i]);
    e->n_graphs = 0;
    e->graph_next = 0;
}

void gang__dev_graph_done(gang_engine *e)
{
    e->graph_replays++;
    if (e->m->place.tp_rank != 0) /* as run_head: only TP rank 0 samples */
        return;
    for (uint32_t i = 0; i < e->plan.n_seq; i++)
        e->head_row[i] = i;
    e->n_head_rows = e->plan.n_seq;
    e->ids_first = 0;
    e->ids_pending = e->plan.n_seq;
}

const float *gang__engine_logits(gang_engine *e, uint32_t i)
{
    const float *rows;
    float *dst;

    if (e == NULL || !e->plan_valid || !e->is_last || e->m->place.tp_rank != 0 ||
        i >= e->plan.n_seq || !e->plan.seqs[i].sample)
        return NULL;
    dst = e->logits + (size_t)e->head_row[i] * e->vocab;
    if (e->host_sample)
        return dst;
    /* The device kept them: this row comes down now (a wait the step itself never makes). */
    rows = e->m->topo.tp > 1 ? e->logits_dev : e->head_out;
    if (gang_kernels_download(e->k, dst, rows + (size_t)e->head_row[i] * e->vocab,
                              (size_t)e->vocab * sizeof(float)) != 0)
        return NULL;
    return dst;
}
