/*
 * Disaggregated prefill/decode (issue #26): moving a prompt's KV blocks between two gangs
 * of the same model with equal TP and any PP: rank (stage s, tp t) of the decode gang
 * holds layers [a, b) and the kv columns of TP shard t, which the prefill gang's ranks
 * (stage s', tp t) of every stage s' holding some of [a, b) hold in parts (gang_kv_parts:
 * one rank or several for one decode rank, one prefill rank for several decode ranks).
 * The prefill gang's DONE names its layout (layers, PP, TP, the nodes' addresses), which
 * the router hands over with the export's id; a decode gang that cannot be fed by that
 * layout (another layer count or TP, or EP here) prefills instead (counted, logged). The
 * transport is the launcher's (gang_kv_hooks); this file decides when every rank of a
 * gang moves which blocks, and keeps rank 0's books.
 *
 * Why through the plan: only rank 0 knows which blocks hold a prompt, and every rank must
 * move its part of the same blocks at a point where nothing writes them. The plan carries
 * at most one transfer per step, which every rank runs right after receiving it and
 * before the step's compute:
 *
 *   export (a prefill gang): a request that asked for one pins its prompt's full blocks
 *     when it ends (gang__xfer_on_done); the next plan names them; every rank copies its
 *     part out (block after block, each layer after layer, K rows then V rows) and hands
 *     it to hooks.put; rank 0 unpins them after the copy. The DONE event already named the
 *     export's id, which the API answers and a router forwards to the decode gang.
 *   import (a decode gang): a waiting request naming a transfer is admitted with a slot
 *     and the blocks of its prompt, but instead of a prefill chunk the plan names the
 *     first blocks to fetch and a job (one of GANG__KV_JOBS in flight); every rank starts
 *     a thread that fetches its part through hooks.get (part after part: one per source
 *     stage holding some of its layers, by the import deadline) into a buffer of its
 *     own, and the step goes on:
 *     a fetch never blocks a step, so a slow prefill gang stalls no decoding stream. While
 *     any fetch is in flight, each plan asks every rank for the state of its fetches
 *     (kv_poll: pending, done, failed; one small message to rank 0 per rank and step).
 *     Once every rank's part is there, the next plan commits it: every rank copies its
 *     buffer into the blocks, and rank 0 counts them as computed (and registers them in
 *     the prefix cache). When every rank is done but one failed (or was late), the
 *     request prefills those blocks itself (the fallback). The request is not scheduled
 *     in between, and nothing is written into its blocks before the commit, so a fetch
 *     that failed on one rank, or whose request went away, never leaves a wrong block in
 *     use.

 * On a device whose memory the host cannot read, with hooks that take device memory
 * (put_dev / get_dev: the launcher's pair communicator over NCCL, worker-kv-pair.c), the
 * export's copy and the fetch's buffer are device memory and the copies run on the
 * device (gang_kernels_copy): no host staging. Otherwise they go through host memory.
 *
 * A fetched part is checked by the transport (shape and authenticity); here its size
 * must be exact. An export that finds no room in rank 0's ring (slots pending) is not
 * made: its DONE says so (kv_id 0) and the decode gang prefills.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "engine-internal.h"

#define XFER_TAG 0x4b56u  /* the export status messages to rank 0 ("KV") */
#define XFER_POLL 0x4b57u /* the fetches' states to rank 0 */
#define XFER_PENDING 1    /* a fetch's state: still running */
#define XFER_IDLE_MS 5u   /* a poll-only step waits this long for a fetch to end */

int gang__xfer_alloc(gang_engine *e)
{
    for (uint32_t j = 0; j < GANG__KV_JOBS; j++) {
        pthread_mutex_init(&e->kvj[j].mu, NULL);
        pthread_cond_init(&e->kvj[j].cv, NULL);
    }
    e->kvj_init = 1;
    if (e->m->place.rank != 0)
        return 0;
    e->kvx_id = calloc(e->slots, sizeof(uint64_t));
    e->kvx_n = calloc(e->slots, sizeof(uint32_t));
    e->kvx_blocks = calloc((size_t)e->slots * e->max_bps, sizeof(int32_t));
    e->kvx_ev = calloc(e->slots, sizeof(*e->kvx_ev));
    if (e->kvx_id == NULL || e->kvx_n == NULL || e->kvx_blocks == NULL || e->kvx_ev == NULL)
        return GANG_ENOMEM;
    /* Ids from a clock-and-pid start: an id a restarted gang hands out again could only
     * fetch another export of the same gang, and a fetch checks the shape and size. */
    e->kvx_next = ((uint64_t)time(NULL) << 24 ^ (uint64_t)getpid() << 8) | 1u;
    return 0;
}

/* Joins job j's thread (it ends by its deadline) and drops its buffer. */
static void xfer_join(gang__kv_job *j)
{
    if (j->live)
        pthread_join(j->thread, NULL);
    j->live = 0;
    if (j->dk != NULL)
        gang_kernels_free(j->dk, j->buf); /* (on the data thread: the handle's) */
    else
        free(j->buf);
    j->buf = NULL;
    j->dk = NULL;
    free(j->parts);
    j->parts = NULL;
    j->n_parts = 0;
}

void gang__xfer_free(gang_engine *e)
{
    for (uint32_t j = 0; e->kvj_init && j < GANG__KV_JOBS; j++) {
        xfer_join(&e->kvj[j]);
        pthread_mutex_destroy(&e->kvj[j].mu);
        pthread_cond_destroy(&e->kvj[j].cv);
    }
    free(e->kvx_id);
    free(e->kvx_n);
    free(e->kvx_blocks);
    free(e->kvx_ev);
    free(e->kv_stage);
    free(e->plan.kv_blocks);
}

void gang__xfer_clear(gang_engine *e)
{
    /* (The pins go with the reset of every block.) */
    e->kvx_head = e->kvx_count = 0;
    for (uint32_t j = 0; j < GANG__KV_JOBS; j++) {
        e->kvj[j].q = NULL;
        e->kvj[j].state = 0;
    }
    e->plan.kv_kind = GANG__KV_NONE;
    e->plan.kv_poll = 0;
}

void gang__xfer_forget(gang_engine *e, const gang__request *q)
{
    for (uint32_t j = 0; q->kv_state == 1 && j < GANG__KV_JOBS; j++)
        if (e->kvj[j].q == q)
            e->kvj[j].q = NULL;
}

void gang_engine_set_kv_hooks(gang_engine *e, const gang_kv_hooks *h, uint64_t timeout_ms)
{
    if (e == NULL)
        return;
    if (h != NULL)
        e->kv_hooks = *h;
    else
        memset(&e->kv_hooks, 0, sizeof(e->kv_hooks));
    e->kv_timeout_ms = timeout_ms;
}

int gang_engine_kv_shape(const gang_engine *e, gang_kv_shape *out)
{
    if (e == NULL || out == NULL)
        return GANG_EINVAL;
    out->layer_first = e->m->layer_first;
    out->layer_count = e->m->layer_count;
    out->kv_cols = e->m->shard.kv_head_count * e->m->topo.head_dim;
    out->elem_bytes = (uint32_t)gang_dtype_size(e->cfg.kv_dtype);
    out->block_size = e->block_size;
    out->block_bytes =
        (uint64_t)out->layer_count * 2u * e->block_size * out->kv_cols * out->elem_bytes;
    return 0;
}

int gang_kv_layer_spans(uint32_t n_layers, uint32_t src_pp, uint32_t first, uint32_t count,
                        gang_kv_span *out, uint32_t max, uint32_t *n)
{
    gang_topology t;
    uint32_t got = 0, end = first + count;

    if (out == NULL || n == NULL)
        return GANG_EINVAL;
    *n = 0;
    if (src_pp == 0 || src_pp > n_layers || count == 0 || first >= n_layers ||
        count > n_layers - first)
        return GANG_EINVAL;
    memset(&t, 0, sizeof(t));
    t.n_layers = n_layers;
    t.pp = src_pp;
    for (uint32_t s = 0; s < src_pp; s++) {
        uint32_t sf, sc;
        if (gang_topology_stage_layers(&t, s, &sf, &sc) != 0)
            return GANG_EINVAL;
        uint32_t lo = sf > first ? sf : first, hi = sf + sc < end ? sf + sc : end;
        if (lo >= hi)
            continue;
        if (got == max)
            return GANG_ERANGE;
        out[got].src_stage = s;
        out[got].src_first = lo - sf;
        out[got].dst_first = lo - first;
        out[got].count = hi - lo;
        got++;
    }
    *n = got;
    return 0;
}

/* The address of source rank r: its node's in l, else host. */
static void part_host(const gang_kv_layout *l, const char *host, uint32_t r, char *out)
{
    uint32_t node = l->n_nodes > 0 ? r / l->ranks_per_node : 0;
    if (l->n_nodes > 0 && node < l->n_nodes && l->node_addr[node] != 0) {
        struct in_addr a = {.s_addr = l->node_addr[node]};
        if (inet_ntop(AF_INET, &a, out, GANG_KV_HOST_MAX) != NULL)
            return;
    }
    gang_strlcpy(out, host, GANG_KV_HOST_MAX);
}

int gang_kv_parts(const gang_kv_layout *src, const char *host, uint32_t n_layers, uint32_t tp,
                  uint32_t rank, uint32_t tp_rank, uint32_t first, uint32_t count,
                  gang_kv_part *out, uint32_t max, uint32_t *n)
{
    gang_kv_span sp[64];
    uint32_t ns = 0;
    if (src == NULL || host == NULL || out == NULL || n == NULL)
        return GANG_EINVAL;
    *n = 0;
    if (count == 0 || first >= n_layers || count > n_layers - first || max == 0)
        return GANG_EINVAL;
    if (src->layers == 0) {
        out[0] = (gang_kv_part){.rank = rank, .layer_first = first, .layer_count = count};
        gang_strlcpy(out[0].host, host, sizeof(out[0].host));
        *n = 1;
        return 0;
    }
    if (!gang_kv_layout_valid(src) || src->layers != n_layers || src->tp != tp || tp_rank >= tp)
        return GANG_EMISMATCH;
    int rc = gang_kv_layer_spans(n_layers, src->pp, first, count, sp, max < 64 ? max : 64, &ns);
    if (rc != 0)
        return rc;
    for (uint32_t i = 0; i < ns; i++) {
        uint32_t sf = first + sp[i].dst_first, r = sp[i].src_stage * src->tp + tp_rank;
        out[i] = (gang_kv_part){.rank = r, .layer_first = sf, .layer_count = sp[i].count};
        part_host(src, host, r, out[i].host);
    }
    *n = ns;
    return 0;
}

/* Rank 0: whether this gang can import from a source of layout l (else logged). */
static int xfer_layout_ok(const gang_engine *e, const gang_kv_xfer *kv)
{
    const gang_topology *t = &e->m->topo;
    const gang_kv_layout *l = &kv->src;
    if (l->layers == 0)
        return 1; /* the same layout as this gang's, as before layouts travelled */
    if (gang_kv_layout_valid(l) && l->layers == t->n_layers && l->tp == t->tp &&
        t->stage_ranks == t->tp)
        return 1;
    gang_warn("P/D: transfer %llx comes from a gang of %u layers, PP %u, TP %u; this gang has "
              "%u layers, PP %u, TP %u%s: the request prefills its prompt here (the pools "
              "need the same model and TP)",
              (unsigned long long)kv->id, l->layers, l->pp, l->tp, t->n_layers, t->pp, t->tp,
              t->stage_ranks != t->tp ? " and EP" : "");
    return 0;
}

int gang__xfer_on_done(gang_engine *e, gang__request *q, gang_gen_event *ev)
{
    ev->kv_blocks = q->kv_got;
    ev->kv_ms = q->kv_ms;
    ev->kv_mismatch = q->kv_mismatch;
    ev->kv_device = q->kv_device;
    if (!q->r.kv.do_export || !q->running || e->kvx_count == e->slots)
        return 0;
    uint32_t n = q->r.n_prompt / e->block_size, at = (e->kvx_head + e->kvx_count) % e->slots;
    if (n > q->n_blocks)
        n = q->n_blocks;
    if (n == 0)
        return 0;
    const int32_t *row = e->tables + (size_t)q->slot * e->max_bps;
    int32_t *pin = e->kvx_blocks + (size_t)at * e->max_bps;
    for (uint32_t i = 0; i < n; i++) {
        pin[i] = row[i];
        e->blk_ref[row[i]]++; /* q holds it: the release that follows leaves it pinned */
    }
    e->kvx_id[at] = e->kvx_next;
    e->kvx_next += 2; /* odd, never 0 */
    e->kvx_n[at] = n;
    e->kvx_count++;
    ev->kv_id = e->kvx_id[at];
    ev->kv_blocks = n;
    e->kvx_ev[at] = *ev;
    return 1;
}

void gang__xfer_plan_export(gang_engine *e)
{
    gang__plan *p = &e->plan;
    if (e->kvx_count == 0 || p->kv_kind != GANG__KV_NONE)
        return;
    p->kv_kind = GANG__KV_EXPORT;
    p->kv_n = e->kvx_n[e->kvx_head];
    memset(&p->kv, 0, sizeof(p->kv));
    p->kv.id = e->kvx_id[e->kvx_head];
    memcpy(p->kv_blocks, e->kvx_blocks + (size_t)e->kvx_head * e->max_bps,
           p->kv_n * sizeof(int32_t));
}

int gang__xfer_admit(gang_engine *e, gang__request *q, uint32_t free_slot)
{
    gang__plan *p = &e->plan;
    uint32_t target = q->r.n_prompt, n, j = 0;
    if (q->r.kv.id == 0 || q->kv_state != 0 || q->n_gen != 0 || e->kv_hooks.get == NULL)
        return 0;
    if (!xfer_layout_ok(e, &q->r.kv)) {
        q->kv_state = 2; /* never fetched: the prompt is prefilled here */
        q->kv_mismatch = 1;
        e->kv_import_mismatches++;
        return 0;
    }
    while (j < GANG__KV_JOBS && e->kvj[j].state != 0)
        j++;
    if (p->kv_kind != GANG__KV_NONE || j == GANG__KV_JOBS)
        return 2; /* this plan moves other blocks, or every fetch is busy: a later one */
    /* At least the last prompt token is computed here: its logits give the first token. */
    n = q->r.kv.blocks;
    if (n > (target - 1) / e->block_size)
        n = (target - 1) / e->block_size;
    if (n == 0 || gang__kv_avail(e) < gang__blocks_for(e, target)) {
        q->kv_state = n == 0 ? 2 : 0; /* no room now: try again at a later step */
        return 0;
    }
    q->kv_state = 1;
    q->running = 1;
    q->slot = free_slot;
    q->g_sent = 0;
    q->n_blocks = 0;
    q->n_fed = 0;
    q->n_hashed = 0;
    q->hash = 0;
    q->planned = 1;
    e->slot_req[free_slot] = q;
    gang__kv_take(e, q, gang__blocks_for(e, target));
    p->kv_kind = GANG__KV_IMPORT;
    p->kv_job = j;
    p->kv_n = n;
    p->kv = q->r.kv;
    memcpy(p->kv_blocks, e->tables + (size_t)free_slot * e->max_bps, n * sizeof(int32_t));
    e->kvj[j].q = q;
    e->kvj[j].state = 1;
    e->kvj[j].n = n;
    e->kvj[j].t0 = gang_now_ms();
    e->kvj[j].got = 0;
    return 1;
}

void gang__xfer_plan_import(gang_engine *e)
{
    gang__plan *p = &e->plan;
    p->kv_poll = 0;
    for (uint32_t j = 0; j < GANG__KV_JOBS; j++) {
        gang__kv_job *b = &e->kvj[j];
        p->kv_poll |= b->state == 1;
        if (b->state != 2 || p->kv_kind != GANG__KV_NONE)
            continue;
        if (b->q == NULL) {
            b->state = 0; /* its request went away: nothing to commit */
            continue;
        }
        p->kv_kind = GANG__KV_COMMIT;
        p->kv_job = j;
        p->kv_n = b->n;
        p->kv = b->q->r.kv;
        memcpy(p->kv_blocks, e->tables + (size_t)b->q->slot * e->max_bps, b->n * sizeof(int32_t));
    }
}

/* This rank's part of block b's layer l, K (kv 0) or V (kv 1), in the pools. */
static char *xfer_rows(gang_engine *e, uint32_t l, uint32_t kv, int32_t b, size_t rows_bytes)
{
    size_t pool = rows_bytes * e->n_blocks; /* bytes of one layer's K (or V) pool */
    return e->kv_mem + (2 * (size_t)l + kv) * pool + (size_t)b * rows_bytes;
}

/* Whether e moves its blocks on the device path (put_dev / get_dev, no host staging). */
static int xfer_on_device(const gang_engine *e)
{
    return (gang_kernels_caps(e->k) & GANG_KERNELS_CAP_DEVICE_MEM) != 0 &&
           e->kv_hooks.put_dev != NULL && e->kv_hooks.get_dev != NULL;
}

/* Copies the plan's blocks between the pools and buffer stage (out: pools -> stage), stage
 * being device memory of e->k when on_dev (a copy on the device), else host memory. 0 or
 * the kernels' error. */
static int xfer_copy(gang_engine *e, const gang_kv_shape *sh, int out, uint8_t *stage, int on_dev)
{
    size_t rows = (size_t)sh->block_size * sh->kv_cols * sh->elem_bytes, at = 0;
    int dev = (gang_kernels_caps(e->k) & GANG_KERNELS_CAP_DEVICE_MEM) != 0, rc = 0;
    for (uint32_t j = 0; j < e->plan.kv_n && rc == 0; j++) {
        for (uint32_t l = 0; l < sh->layer_count && rc == 0; l++) {
            for (uint32_t kv = 0; kv < 2 && rc == 0; kv++, at += rows) {
                char *pool = xfer_rows(e, l, kv, e->plan.kv_blocks[j], rows);
                if (on_dev)
                    rc = out ? gang_kernels_copy(e->k, stage + at, pool, rows)
                             : gang_kernels_copy(e->k, pool, stage + at, rows);
                else if (!dev && out)
                    memcpy(stage + at, pool, rows);
                else if (!dev)
                    memcpy(pool, stage + at, rows);
                else if (out)
                    rc = gang_kernels_download(e->k, stage + at, pool, rows);
                else
                    rc = gang_kernels_upload(e->k, pool, stage + at, rows);
            }
        }
    }
    return rc;
}

/* Rank 0: rank r's address (st[2]) into the layout's list of the nodes' addresses. */
static void xfer_note_addr(const gang_engine *e, uint32_t r, int64_t addr, gang_kv_layout *l)
{
    const gang_topology *t = &e->m->topo;
    if (l->n_nodes > 0 && r % t->nproc_per_node == 0)
        l->node_addr[r / t->nproc_per_node] = (uint32_t)addr;
}

/* Every rank's status of an export (status, bytes, its address) to rank 0; rank 0's
 * verdict (1: all succeeded), and with several nodes their addresses into l. */
static int xfer_agree(gang_engine *e, gang_comm *world, int64_t mine[3], uint64_t deadline,
                      int *all_ok, uint64_t *bytes, gang_kv_layout *l)
{
    uint32_t n = world != NULL ? (uint32_t)gang_comm_size(world) : 1;
    uint64_t left;
    int rc;
    *all_ok = mine[0] == 0;
    *bytes = mine[0] == 0 ? (uint64_t)mine[1] : 0;
    if (e->m->place.rank == 0)
        xfer_note_addr(e, 0, mine[2], l);
    if (n == 1)
        return 0;
    rc = gang_deadline_left(deadline, &left);
    if (rc != 0)
        return rc;
    if (e->m->place.rank != 0)
        return gang_comm_send(world, mine, 3 * sizeof(int64_t), 0, XFER_TAG, left);
    for (uint32_t r = 1; r < n; r++) {
        int64_t st[3];
        rc = gang_deadline_left(deadline, &left);
        if (rc == 0)
            rc = gang_comm_recv(world, st, sizeof st, r, XFER_TAG, left);
        if (rc != 0)
            return rc;
        *all_ok &= st[0] == 0;
        *bytes += st[0] == 0 ? (uint64_t)st[1] : 0;
        xfer_note_addr(e, r, st[2], l);
    }
    return 0;
}

/* Rank 0: this gang's layout for an export's DONE (layers 0 with EP: only a gang of the
 * same layout can fetch it), the nodes' addresses still to be filled in. */
static void xfer_layout(const gang_engine *e, gang_kv_layout *l)
{
    const gang_topology *t = &e->m->topo;
    memset(l, 0, sizeof(*l));
    if (t->stage_ranks != t->tp)
        return;
    l->layers = t->n_layers;
    l->pp = t->pp;
    l->tp = t->tp;
    if (t->nnodes > 1 && t->nnodes <= GANG_KV_NODES_MAX) {
        l->n_nodes = t->nnodes;
        l->ranks_per_node = t->nproc_per_node;
    }
    if (!gang_kv_layout_valid(l))
        memset(l, 0, sizeof(*l));
}

/* Rank 0, when fetch b is settled: its request starts from the fetched blocks (ok), or
 * prefills them itself. */
static void xfer_import_done(gang_engine *e, gang__kv_job *b, int ok)
{
    gang__request *q = b->q;
    b->q = NULL;
    b->state = 0;
    if (q == NULL || !q->running || q->kv_state != 1)
        return;
    q->kv_state = 2;
    q->kv_ms = (uint32_t)(gang_now_ms() - b->t0);
    e->prefix_query_tokens += q->r.n_prompt;
    if (!ok) {
        e->kv_import_failures++;
        return; /* n_fed stays 0: the prompt is prefilled into the same blocks */
    }
    q->kv_got = b->n;
    q->kv_device = (uint32_t)b->on_dev;
    q->n_fed = b->n * e->block_size;
    q->n_cached = q->n_fed;
    e->prefix_hit_tokens += q->n_fed;
    if (e->cfg.prefix_caching)
        gang__pc_register(e, q);
    e->kv_imports++;
    e->kv_bytes += b->got;
}

/* The device path of an export: the plan's blocks into a device buffer of their own,
 * handed to put_dev (which owns it on success). 0 or an error. */
static int xfer_export_dev(gang_engine *e, const gang_kv_shape *sh, size_t total)
{
    void *dev = NULL;
    int rc = gang_kernels_alloc(e->k, total, &dev);
    if (rc != 0)
        return rc;
    rc = xfer_copy(e, sh, 1, dev, 1);
    if (rc == 0)
        rc = gang_kernels_sync(e->k); /* (the transport sends it from another stream) */
    if (rc == 0)
        rc = e->kv_hooks.put_dev(e->kv_hooks.ctx, e->plan.kv.id, e->k, dev, total, e->plan.kv_n);
    if (rc != 0)
        gang_kernels_free(e->k, dev);
    return rc;
}

/*
 * Every rank: copies its part of the plan's export out to the hooks, then agrees with rank
 * 0, which unpins the blocks and only then emits the request's DONE naming the export (so
 * that no fetch can arrive at a rank before its part exists; a rank that could not keep
 * its part makes the DONE name no export, and the decode gang prefills).
 */
static int xfer_export(gang_engine *e, gang_comm *world, const gang_kv_shape *sh, size_t total,
                       uint64_t deadline)
{
    gang__plan *p = &e->plan;
    int64_t st[3] = {GANG_ENOMEM, (int64_t)total, (int64_t)e->kv_hooks.addr};
    uint64_t bytes;
    gang_kv_layout lay;
    int ok;
    if (xfer_on_device(e)) {
        st[0] = xfer_export_dev(e, sh, total);
    } else if (e->kv_stage != NULL && e->kv_hooks.put != NULL) {
        st[0] = xfer_copy(e, sh, 1, e->kv_stage, 0);
        if (st[0] == 0)
            st[0] = e->kv_hooks.put(e->kv_hooks.ctx, p->kv.id, e->kv_stage, total, p->kv_n);
    }
    xfer_layout(e, &lay);
    int rc = xfer_agree(e, world, st, deadline, &ok, &bytes, &lay);
    if (rc != 0 || e->m->place.rank != 0)
        return rc;
    for (uint32_t i = 0; i < lay.n_nodes; i++)
        if (lay.node_addr[i] == 0)
            lay.n_nodes = lay.ranks_per_node = 0; /* an address unknown: the replica's for all */
    if (lay.n_nodes == 0)
        memset(lay.node_addr, 0, sizeof(lay.node_addr));
    const int32_t *pin = e->kvx_blocks + (size_t)e->kvx_head * e->max_bps;
    for (uint32_t i = 0; i < e->kvx_n[e->kvx_head]; i++)
        gang__kv_unpin(e, pin[i]);
    gang_gen_event *ev = &e->kvx_ev[e->kvx_head];
    if (ok) {
        e->kv_exports++;
        e->kv_bytes += bytes;
        ev->kv_layout = lay;
    } else {
        ev->kv_id = 0;
        ev->kv_blocks = 0;
    }
    /* (The room was reserved when the plan was built.) */
    e->events[(e->ev_head + e->ev_count) % e->ev_cap] = *ev;
    e->ev_count++;
    e->kvx_head = (e->kvx_head + 1) % e->slots;
    e->kvx_count--;
    return 0;
}

/* Fetches part p of job j into j's buffer: straight in when it is all of this rank's
 * layers, else through a buffer of its own, scattered into each block's layers. */
static int xfer_fetch_part(gang__kv_job *j, const gang_kv_part *p)
{
    size_t run = (size_t)p->layer_count * j->layer_bytes, bytes = run * j->n;
    if (j->dk != NULL)
        return j->hooks.get_dev(j->hooks.ctx, &j->src, p, j->dk, j->buf, j->bytes / j->n,
                                (size_t)(p->layer_first - j->layer_first) * j->layer_bytes, run,
                                j->n, j->until);
    if (bytes == j->bytes)
        return j->hooks.get(j->hooks.ctx, &j->src, p, j->buf, j->bytes, j->n, j->until);
    uint8_t *tmp = malloc(bytes);
    if (tmp == NULL)
        return GANG_ENOMEM;
    int rc = j->hooks.get(j->hooks.ctx, &j->src, p, tmp, bytes, j->n, j->until);
    size_t at = (size_t)(p->layer_first - j->layer_first) * j->layer_bytes;
    size_t block = j->bytes / j->n;
    for (uint32_t b = 0; rc == 0 && b < j->n; b++)
        memcpy(j->buf + (size_t)b * block + at, tmp + (size_t)b * run, run);
    free(tmp);
    return rc;
}

/* A fetch's thread: this rank's part, part after part, by the job's deadline, then done. */
static void *xfer_thread(void *arg)
{
    gang__kv_job *j = arg;
    int rc = 0;
    for (uint32_t i = 0; i < j->n_parts && rc == 0; i++) {
        const gang_kv_part *p = &j->parts[i];
        rc = xfer_fetch_part(j, p);
        if (rc != 0)
            gang_warn("P/D: fetching layers %u..%u of %u KV blocks of transfer %llx from rank %u "
                      "at %s:%u failed: %s; the request prefills them",
                      p->layer_first, p->layer_first + p->layer_count - 1, j->n,
                      (unsigned long long)j->src.id, p->rank, p->host, j->src.port + p->rank,
                      gang_strerror(rc));
    }
    pthread_mutex_lock(&j->mu);
    j->rc = rc;
    j->done = 1;
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
    return NULL;
}

/* Every rank: starts the plan's fetch in its job (one that cannot start is done, failed). */
static void xfer_start(gang_engine *e, const gang_kv_shape *sh, size_t total)
{
    gang__plan *p = &e->plan;
    gang__kv_job *j = &e->kvj[p->kv_job];
    const gang_model *m = e->m;
    int rc = 0;
    xfer_join(j); /* (a job is reused only after rank 0 saw it end on every rank) */
    j->src = p->kv;
    j->n = p->kv_n;
    j->bytes = total;
    j->hooks = e->kv_hooks;
    j->until = gang_now_ms() + (e->kv_timeout_ms ? e->kv_timeout_ms : 10000);
    j->layer_first = sh->layer_first;
    j->layer_bytes = 2u * (size_t)sh->block_size * sh->kv_cols * sh->elem_bytes;
    if (xfer_on_device(e)) {
        void *dev = NULL;
        if (gang_kernels_alloc(e->k, total, &dev) == 0) {
            j->buf = dev;
            j->dk = e->k;
        }
        j->on_dev = 1;
    } else {
        j->buf = malloc(total);
        j->on_dev = 0;
    }
    j->parts = calloc(sh->layer_count, sizeof(gang_kv_part));
    pthread_mutex_lock(&j->mu);
    j->done = 0;
    j->rc = 0;
    pthread_mutex_unlock(&j->mu);
    if (j->buf == NULL || j->parts == NULL || (j->hooks.get == NULL && j->dk == NULL))
        rc = GANG_ENOMEM;
    else
        rc = gang_kv_parts(&p->kv.src, p->kv.host, m->topo.n_layers, m->topo.tp, m->place.rank,
                           m->place.tp_rank, sh->layer_first, sh->layer_count, j->parts,
                           sh->layer_count, &j->n_parts);
    /* (Rank 0 checked the layout at the admission: a rank that disagrees fails the job.) */
    if (rc == 0 && pthread_create(&j->thread, NULL, xfer_thread, j) != 0)
        rc = GANG_ENOMEM;
    j->live = rc == 0;
    if (rc != 0) {
        pthread_mutex_lock(&j->mu);
        j->done = 1;
        j->rc = rc;
        pthread_mutex_unlock(&j->mu);
    }
}

/* Every rank: copies the plan's finished fetch into its blocks; rank 0 counts them. 0, or
 * GANG_EPROTO when this rank's part is not there (rank 0 saw it there), or the kernels'
 * error. */
static int xfer_commit(gang_engine *e, const gang_kv_shape *sh, size_t total)
{
    gang__plan *p = &e->plan;
    gang__kv_job *j = &e->kvj[p->kv_job];
    int done, rc;
    pthread_mutex_lock(&j->mu);
    done = j->done;
    rc = j->rc;
    pthread_mutex_unlock(&j->mu);
    if (!done || rc != 0 || j->buf == NULL || j->n != p->kv_n || j->bytes != total)
        return GANG_EPROTO;
    rc = xfer_copy(e, sh, 0, j->buf, j->dk != NULL);
    if (rc == 0 && j->dk != NULL)
        rc = gang_kernels_sync(e->k); /* (the copy reads buf, which goes next) */
    xfer_join(j);
    if (rc == 0 && e->m->place.rank == 0)
        xfer_import_done(e, j, 1);
    return rc;
}

/* This rank's fetches' states into st ([2 x jobs]: XFER_PENDING, 0 or an error; bytes). A
 * step with nothing to compute first waits a little for a running one to end. */
static void xfer_states(gang_engine *e, int64_t *st)
{
    int idle = e->plan.n_seq == 0;
    for (uint32_t i = 0; i < GANG__KV_JOBS; i++) {
        gang__kv_job *j = &e->kvj[i];
        pthread_mutex_lock(&j->mu);
        if (idle && j->live && !j->done) {
            idle = 0; /* (once a step) */
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += (long)XFER_IDLE_MS * 1000000L;
            ts.tv_sec += ts.tv_nsec / 1000000000L;
            ts.tv_nsec %= 1000000000L;
            while (!j->done && pthread_cond_timedwait(&j->cv, &j->mu, &ts) != ETIMEDOUT)
                ;
        }
        st[2 * i] = !j->done ? XFER_PENDING : j->rc;
        st[2 * i + 1] = (int64_t)j->bytes;
        pthread_mutex_unlock(&j->mu);
    }
}

/* Rank 0: folds one rank's states st into the fetches' tallies. */
static void xfer_tally(const int64_t *st, int *pending, int *failed, uint64_t *bytes)
{
    for (uint32_t i = 0; i < GANG__KV_JOBS; i++) {
        pending[i] |= st[2 * i] == XFER_PENDING;
        failed[i] |= st[2 * i] != XFER_PENDING && st[2 * i] != 0;
        bytes[i] += (uint64_t)st[2 * i + 1];
    }
}

/* Every rank: the poll. Ranks > 0 send rank 0 their fetches' states; rank 0 settles each
 * fetch in flight: still running somewhere, or every rank has it (a later plan commits
 * it), or it failed somewhere (its request prefills). */
static int xfer_poll(gang_engine *e, gang_comm *world, uint64_t deadline)
{
    uint32_t n = world != NULL ? (uint32_t)gang_comm_size(world) : 1;
    int64_t st[2 * GANG__KV_JOBS];
    int pending[GANG__KV_JOBS] = {0}, failed[GANG__KV_JOBS] = {0};
    uint64_t bytes[GANG__KV_JOBS] = {0}, left;
    int rc;
    xfer_states(e, st);
    if (n > 1 && e->m->place.rank != 0) {
        rc = gang_deadline_left(deadline, &left);
        return rc != 0 ? rc : gang_comm_send(world, st, sizeof st, 0, XFER_POLL, left);
    }
    xfer_tally(st, pending, failed, bytes);
    for (uint32_t r = 1; r < n; r++) {
        rc = gang_deadline_left(deadline, &left);
        if (rc == 0)
            rc = gang_comm_recv(world, st, sizeof st, r, XFER_POLL, left);
        if (rc != 0)
            return rc;
        xfer_tally(st, pending, failed, bytes);
    }
    for (uint32_t i = 0; i < GANG__KV_JOBS; i++) {
        gang__kv_job *b = &e->kvj[i];
        if (b->state != 1 || pending[i])
            continue;
        if (failed[i]) {
            xfer_import_done(e, b, 0);
        } else {
            b->state = 2;
            b->got = bytes[i];
        }
    }
    return 0;
}

int gang__xfer_run(gang_engine *e, gang_comm *world, uint64_t deadline)
{
    gang__plan *p = &e->plan;
    gang_kv_shape sh;
    int rc = 0;
    gang_engine_kv_shape(e, &sh);
    size_t total = (size_t)sh.block_bytes * p->kv_n;
    if (p->kv_kind == GANG__KV_EXPORT) {
        if (e->kv_stage == NULL && !xfer_on_device(e))
            e->kv_stage = malloc((size_t)sh.block_bytes * e->max_bps);
        rc = xfer_export(e, world, &sh, total, deadline);
    } else if (p->kv_kind == GANG__KV_IMPORT) {
        xfer_start(e, &sh, total);
    } else if (p->kv_kind == GANG__KV_COMMIT) {
        rc = xfer_commit(e, &sh, total);
    }
    if (rc == 0 && p->kv_poll)
        rc = xfer_poll(e, world, deadline);
    return rc;
}
