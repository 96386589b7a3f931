/*
 * Rank 0's KV block allocator and automatic prefix cache: which blocks of the pools each
 * running sequence holds (the slots' block tables), the free stack, and the cache of full
 * prompt blocks shared by reference count. (The upload of a plan's tables, which every
 * rank does, is engine-device.c's.)
 *
 * Prefix cache: a full block's key is the hash chain h_i = mix(h_{i-1}, its block_size
 * tokens) from the sequence's start, so equal keys mean equal prefixes up to that block
 * (a hit is also checked exactly: the block's tokens and its parent block). Blocks are
 * registered once their last position is in the cache, whoever computed them; a block
 * several sequences hold is never written (a sequence writes only positions past its full
 * blocks). Cached blocks nobody holds wait in an LRU list and are evicted, least recently
 * released first, when the free stack is empty.
 *
 * Nothing here allocates: the arrays are sized at init (engine.c).
 */
#include <string.h>

#include "engine-internal.h"

static uint64_t pc_mix(uint64_t h, const int32_t *ids, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++) {
        h ^= (uint64_t)(uint32_t)ids[i] + 0x9e3779b97f4a7c15u + (h << 6) + (h >> 2);
        h *= 0xff51afd7ed558ccdu;
        h ^= h >> 33;
    }
    return h;
}

uint64_t gang_kv_block_hash(uint64_t prev, const int32_t *ids, uint32_t n)
{
    return pc_mix(prev, ids, n);
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
uint32_t gang__kv_avail(const gang_engine *e)
{
    return e->n_free + e->n_lru;
}

/* Grows q's table (in rank 0's tables) to n blocks: from the free stack, else by
 * evicting the least recently released cached block. The caller checked the room. */
void gang__kv_take(gang_engine *e, gang__request *q, uint32_t n)
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
void gang__kv_release(gang_engine *e, gang__request *q)
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
uint32_t gang__pc_lookup(const gang_engine *e, const gang__request *q, uint32_t limit,
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
void gang__pc_register(gang_engine *e, gang__request *q)
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

void gang__pc_hold(gang_engine *e, int32_t b)
{
    if (e->blk_ref[b]++ == 0)
        pc_lru_remove(e, b);
}

void gang__kv_reset(gang_engine *e)
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

void gang__kv_unpin(gang_engine *e, int32_t b)
{
    if (e->blk_ref[b] == 0 || --e->blk_ref[b] > 0)
        return;
    if (e->blk_cached[b])
        pc_lru_push(e, b);
    else
        e->free_blocks[e->n_free++] = (uint32_t)b;
}
