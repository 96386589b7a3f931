/*
 * Disaggregated prefill/decode (issue #26): moving a prompt's KV blocks between two gangs
 * of the same model and the same split (equal TP and PP: rank r of one holds exactly the
 * layers and kv columns of rank r of the other). The transport is the launcher's
 * (gang_kv_hooks); this file decides when every rank of a gang moves which blocks, and
 * keeps rank 0's books.
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
 *     first blocks to fetch; every rank fetches its part through hooks.get (from the
 *     source gang's rank of the same index, by the import deadline), writes it into those
 *     blocks, and sends rank 0 its status over the world. Only when every rank succeeded
 *     does rank 0 count the blocks as computed (and register them in the prefix cache);
 *     otherwise the request prefills them itself into the same blocks (the fallback),
 *     so a transfer that failed on one rank can never leave a wrong block in use.
 *
 * A fetched part is checked by the transport (shape and authenticity); here its size
 * must be exact. An export that finds no room in rank 0's ring (slots pending) is not
 * made: its DONE says so (kv_id 0) and the decode gang prefills.
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "engine-internal.h"

#define XFER_TAG 0x4b56u /* the status messages to rank 0 ("KV") */

int gang__xfer_alloc(gang_engine *e)
{
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

void gang__xfer_free(gang_engine *e)
{
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
    e->kv_imp = NULL;
    e->plan.kv_kind = GANG__KV_NONE;
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

int gang__xfer_on_done(gang_engine *e, gang__request *q, gang_gen_event *ev)
{
    ev->kv_blocks = q->kv_got;
    ev->kv_ms = q->kv_ms;
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
    uint32_t target = q->r.n_prompt, n;
    if (q->r.kv.id == 0 || q->kv_state != 0 || q->n_gen != 0 || e->kv_hooks.get == NULL)
        return 0;
    if (p->kv_kind != GANG__KV_NONE)
        return 2; /* this plan moves other blocks: it waits for the next one */
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
    p->kv_n = n;
    p->kv = q->r.kv;
    memcpy(p->kv_blocks, e->tables + (size_t)free_slot * e->max_bps, n * sizeof(int32_t));
    e->kv_imp = q;
    return 1;
}

/* This rank's part of block b's layer l, K (kv 0) or V (kv 1), in the pools. */
static char *xfer_rows(gang_engine *e, uint32_t l, uint32_t kv, int32_t b, size_t rows_bytes)
{
    size_t pool = rows_bytes * e->n_blocks; /* bytes of one layer's K (or V) pool */
    return e->kv_mem + (2 * (size_t)l + kv) * pool + (size_t)b * rows_bytes;
}

/* Copies the plan's blocks between the pools and the staging buffer (out: pools ->
 * stage). 0 or the kernels' error. */
static int xfer_copy(gang_engine *e, const gang_kv_shape *sh, int out)
{
    size_t rows = (size_t)sh->block_size * sh->kv_cols * sh->elem_bytes, at = 0;
    int dev = (gang_kernels_caps(e->k) & GANG_KERNELS_CAP_DEVICE_MEM) != 0, rc = 0;
    for (uint32_t j = 0; j < e->plan.kv_n && rc == 0; j++) {
        for (uint32_t l = 0; l < sh->layer_count && rc == 0; l++) {
            for (uint32_t kv = 0; kv < 2 && rc == 0; kv++, at += rows) {
                char *pool = xfer_rows(e, l, kv, e->plan.kv_blocks[j], rows);
                if (!dev && out)
                    memcpy(e->kv_stage + at, pool, rows);
                else if (!dev)
                    memcpy(pool, e->kv_stage + at, rows);
                else if (out)
                    rc = gang_kernels_download(e->k, e->kv_stage + at, pool, rows);
                else
                    rc = gang_kernels_upload(e->k, pool, e->kv_stage + at, rows);
            }
        }
    }
    return rc;
}

/* Every rank's status of an import to rank 0; rank 0's verdict (1: all succeeded). */
static int xfer_agree(gang_engine *e, gang_comm *world, int64_t mine[2], uint64_t deadline,
                      int *all_ok, uint64_t *bytes)
{
    uint32_t n = world != NULL ? (uint32_t)gang_comm_size(world) : 1;
    uint64_t left;
    int rc;
    *all_ok = mine[0] == 0;
    *bytes = mine[0] == 0 ? (uint64_t)mine[1] : 0;
    if (n == 1)
        return 0;
    rc = gang_deadline_left(deadline, &left);
    if (rc != 0)
        return rc;
    if (e->m->place.rank != 0)
        return gang_comm_send(world, mine, 2 * sizeof(int64_t), 0, XFER_TAG, left);
    for (uint32_t r = 1; r < n; r++) {
        int64_t st[2];
        rc = gang_deadline_left(deadline, &left);
        if (rc == 0)
            rc = gang_comm_recv(world, st, sizeof st, r, XFER_TAG, left);
        if (rc != 0)
            return rc;
        *all_ok &= st[0] == 0;
        *bytes += st[0] == 0 ? (uint64_t)st[1] : 0;
    }
    return 0;
}

/* Rank 0, after an import's verdict: the request starts from the fetched blocks, or
 * prefills them itself. */
static void xfer_import_done(gang_engine *e, int ok, uint64_t bytes, uint64_t t0)
{
    gang__request *q = e->kv_imp;
    e->kv_imp = NULL;
    if (q == NULL || !q->running || q->kv_state != 1)
        return;
    q->kv_state = 2;
    q->kv_ms = (uint32_t)(gang_now_ms() - t0);
    e->prefix_query_tokens += q->r.n_prompt;
    if (!ok) {
        e->kv_import_failures++;
        return; /* n_fed stays 0: the prompt is prefilled into the same blocks */
    }
    q->kv_got = e->plan.kv_n;
    q->n_fed = e->plan.kv_n * e->block_size;
    q->n_cached = q->n_fed;
    e->prefix_hit_tokens += q->n_fed;
    if (e->cfg.prefix_caching)
        gang__pc_register(e, q);
    e->kv_imports++;
    e->kv_bytes += bytes;
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
    int64_t st[2] = {GANG_ENOMEM, (int64_t)total};
    uint64_t bytes;
    int ok;
    if (e->kv_stage != NULL && e->kv_hooks.put != NULL) {
        st[0] = xfer_copy(e, sh, 1);
        if (st[0] == 0)
            st[0] = e->kv_hooks.put(e->kv_hooks.ctx, p->kv.id, e->kv_stage, total, p->kv_n);
    }
    int rc = xfer_agree(e, world, st, deadline, &ok, &bytes);
    if (rc != 0 || e->m->place.rank != 0)
        return rc;
    const int32_t *pin = e->kvx_blocks + (size_t)e->kvx_head * e->max_bps;
    for (uint32_t i = 0; i < e->kvx_n[e->kvx_head]; i++)
        gang__kv_unpin(e, pin[i]);
    gang_gen_event *ev = &e->kvx_ev[e->kvx_head];
    if (ok) {
        e->kv_exports++;
        e->kv_bytes += bytes;
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

int gang__xfer_run(gang_engine *e, gang_comm *world, uint64_t deadline)
{
    gang__plan *p = &e->plan;
    gang_kv_shape sh;
    uint64_t t0 = gang_now_ms(), bytes;
    int64_t st[2] = {0, 0};
    int rc = 0, ok;
    if (p->kv_kind == GANG__KV_NONE)
        return 0;
    gang_engine_kv_shape(e, &sh);
    size_t total = (size_t)sh.block_bytes * p->kv_n;
    if (e->kv_stage == NULL)
        e->kv_stage = malloc((size_t)sh.block_bytes * e->max_bps);
    if (p->kv_kind == GANG__KV_EXPORT)
        return xfer_export(e, world, &sh, total, deadline);
    uint64_t until = gang_now_ms() + (e->kv_timeout_ms ? e->kv_timeout_ms : 10000);
    if (until > deadline)
        until = deadline;
    st[0] = e->kv_stage == NULL || e->kv_hooks.get == NULL ? GANG_ENOMEM : 0;
    if (st[0] == 0)
        st[0] = e->kv_hooks.get(e->kv_hooks.ctx, &p->kv, e->kv_stage, total, p->kv_n, until);
    if (st[0] == 0)
        st[0] = xfer_copy(e, &sh, 0);
    st[1] = (int64_t)total;
    if (st[0] != 0)
        gang_warn("P/D: fetching %u KV blocks of transfer %llx from %s:%u + rank failed: %s; "
                  "the request prefills them",
                  p->kv_n, (unsigned long long)p->kv.id, p->kv.host, p->kv.port,
                  gang_strerror((int)st[0]));
    rc = xfer_agree(e, world, st, deadline, &ok, &bytes);
    if (rc != 0)
        return rc;
    if (e->m->place.rank == 0)
        xfer_import_done(e, ok, bytes, t0);
    return 0;
}
