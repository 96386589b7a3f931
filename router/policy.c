/*
 * The routing policy: which replica gets a prompt. Pure computation over what the router
 * knows; no I/O, no clock, no allocation after init.
 *
 * Per replica, a bounded LRU set of the chained block hashes it was sent (hash chaining
 * with intrusive doubly-linked recency order; slots are reused in place once the table
 * is full). Because block i's hash covers blocks 0..i, "replica r holds the first k
 * blocks" is k consecutive hits from the start; the first miss ends the match, even if
 * a later block is still remembered (the engine needs the whole chain too).
 *
 * The router does not see the replicas' caches: it remembers what it sent. A replica's
 * cache may have evicted blocks the router still remembers (its LRU bound should not
 * exceed the replica's KV blocks), and a replica that restarts loses everything, which is
 * why going down clears its table.
 */
#include <stdlib.h>
#include <string.h>

#include "ganglion/engine.h"
#include "ganglion/router.h"
#include "ganglion/serve.h"

typedef struct lru_table {
    uint64_t *key;
    int32_t *prev, *next; /* recency: prev is more recent */
    int32_t *chain;       /* next slot of the same bucket */
    int32_t *bucket;      /* first slot of each bucket */
    uint32_t nbuckets;    /* a power of two */
    uint32_t cap, used;
    int32_t mru, lru;
} lru_table;

typedef struct replica_state {
    int up;
    uint32_t role; /* GANG_ROLE_* */
    gang_router_load load;
    lru_table t;
} replica_state;

struct gang_router_policy {
    gang_router_policy_config cfg;
    uint32_t rr; /* the round-robin cursor, also the tie-break's rotating start */
    replica_state *r;
};

static const char *const reason_names[GANG_ROUTER_R_COUNT] = {"prefix", "overloaded",
                                                              "least_loaded", "round_robin"};

const char *gang_router_reason_name(gang_router_reason r)
{
    return (unsigned)r < GANG_ROUTER_R_COUNT ? reason_names[r] : "unknown";
}

int gang_router_kind_parse(const char *name, gang_router_kind *out)
{
    static const char *const names[] = {"prefix", "round-robin", "least-loaded"};
    for (int i = 0; i < 3; i++) {
        if (strcmp(name, names[i]) == 0) {
            *out = (gang_router_kind)i;
            return 0;
        }
    }
    return GANG_EINVAL;
}

static uint32_t bucket_of(const lru_table *t, uint64_t h)
{
    return (uint32_t)(h ^ (h >> 29) ^ (h >> 47)) & (t->nbuckets - 1);
}

static void lru_clear(lru_table *t)
{
    t->used = 0;
    t->mru = t->lru = -1;
    for (uint32_t i = 0; i < t->nbuckets; i++)
        t->bucket[i] = -1;
}

static int lru_init(lru_table *t, uint32_t cap)
{
    memset(t, 0, sizeof(*t));
    t->cap = cap;
    t->nbuckets = 1;
    while (t->nbuckets < 2 * cap)
        t->nbuckets <<= 1;
    t->key = malloc(cap * sizeof(*t->key));
    t->prev = malloc(cap * sizeof(int32_t));
    t->next = malloc(cap * sizeof(int32_t));
    t->chain = malloc(cap * sizeof(int32_t));
    t->bucket = malloc(t->nbuckets * sizeof(int32_t));
    if (!t->key || !t->prev || !t->next || !t->chain || !t->bucket)
        return GANG_ENOMEM;
    lru_clear(t);
    return 0;
}

static void lru_free(lru_table *t)
{
    free(t->key);
    free(t->prev);
    free(t->next);
    free(t->chain);
    free(t->bucket);
}

static int32_t lru_find(const lru_table *t, uint64_t h)
{
    for (int32_t s = t->bucket[bucket_of(t, h)]; s >= 0; s = t->chain[s]) {
        if (t->key[s] == h)
            return s;
    }
    return -1;
}

static void list_unlink(lru_table *t, int32_t s)
{
    if (t->prev[s] >= 0)
        t->next[t->prev[s]] = t->next[s];
    else
        t->mru = t->next[s];
    if (t->next[s] >= 0)
        t->prev[t->next[s]] = t->prev[s];
    else
        t->lru = t->prev[s];
}

static void list_push_front(lru_table *t, int32_t s)
{
    t->prev[s] = -1;
    t->next[s] = t->mru;
    if (t->mru >= 0)
        t->prev[t->mru] = s;
    else
        t->lru = s;
    t->mru = s;
}

static void chain_unlink(lru_table *t, int32_t s)
{
    int32_t *pp = &t->bucket[bucket_of(t, t->key[s])];
    while (*pp != s)
        pp = &t->chain[*pp];
    *pp = t->chain[s];
}

/* Makes h the most recently used key, inserting it (evicting the LRU end when full). */
static void lru_touch(lru_table *t, uint64_t h)
{
    int32_t s = lru_find(t, h);
    if (s >= 0) {
        list_unlink(t, s);
        list_push_front(t, s);
        return;
    }
    if (t->used < t->cap) {
        s = (int32_t)t->used++;
    } else {
        s = t->lru;
        list_unlink(t, s);
        chain_unlink(t, s);
    }
    t->key[s] = h;
    uint32_t b = bucket_of(t, h);
    t->chain[s] = t->bucket[b];
    t->bucket[b] = s;
    list_push_front(t, s);
}

int gang_router_policy_init(const gang_router_policy_config *cfg, gang_router_policy **out)
{
    int rc = GANG_EINVAL;
    if (cfg->nreplicas < 1 || cfg->nreplicas > GANG_ROUTER_MAX_REPLICAS || cfg->lru_blocks < 1 ||
        cfg->lru_blocks > GANG_ROUTER_MAX_LRU || (unsigned)cfg->kind > GANG_ROUTER_LEAST_LOADED)
        return rc;
    gang_router_policy *p = calloc(1, sizeof(*p));
    if (p == NULL)
        return GANG_ENOMEM;
    p->cfg = *cfg;
    p->r = calloc(cfg->nreplicas, sizeof(*p->r));
    rc = GANG_ENOMEM;
    if (p->r == NULL)
        goto out_free;
    for (uint32_t i = 0; i < cfg->nreplicas; i++) {
        p->r[i].load.kv_free_blocks = UINT32_MAX;
        rc = lru_init(&p->r[i].t, cfg->lru_blocks);
        if (rc != 0)
            goto out_free;
    }
    *out = p;
    return 0;
out_free:
    gang_router_policy_free(p);
    return rc;
}

void gang_router_policy_free(gang_router_policy *p)
{
    if (p == NULL)
        return;
    for (uint32_t i = 0; p->r != NULL && i < p->cfg.nreplicas; i++)
        lru_free(&p->r[i].t);
    free(p->r);
    free(p);
}

void gang_router_policy_set_up(gang_router_policy *p, uint32_t i, int up)
{
    if (i >= p->cfg.nreplicas)
        return;
    if (!up)
        lru_clear(&p->r[i].t);
    p->r[i].up = up != 0;
}

int gang_router_policy_is_up(const gang_router_policy *p, uint32_t i)
{
    return i < p->cfg.nreplicas && p->r[i].up;
}

void gang_router_policy_set_load(gang_router_policy *p, uint32_t i, const gang_router_load *l)
{
    if (i < p->cfg.nreplicas)
        p->r[i].load = *l;
}

uint32_t gang_router_policy_load(const gang_router_policy *p, uint32_t i)
{
    if (i >= p->cfg.nreplicas)
        return UINT32_MAX;
    const gang_router_load *l = &p->r[i].load;
    return l->reported > l->inflight ? l->reported : l->inflight;
}

uint32_t gang_router_policy_match(const gang_router_policy *p, uint32_t i, const uint64_t *hashes,
                                  uint32_t n)
{
    if (i >= p->cfg.nreplicas || !p->r[i].up)
        return 0;
    uint32_t k = 0;
    while (k < n && lru_find(&p->r[i].t, hashes[k]) >= 0)
        k++;
    return k;
}

void gang_router_policy_record(gang_router_policy *p, uint32_t i, const uint64_t *hashes,
                               uint32_t n)
{
    if (i >= p->cfg.nreplicas)
        return;
    for (uint32_t k = n; k-- > 0;)
        lru_touch(&p->r[i].t, hashes[k]);
}

uint32_t gang_router_policy_cached(const gang_router_policy *p, uint32_t i)
{
    return i < p->cfg.nreplicas ? p->r[i].t.used : 0;
}

static int eligible(const gang_router_policy *p, uint32_t i, uint64_t exclude)
{
    return p->r[i].up && !(exclude >> i & 1u);
}

/* Replica i reports at least `need` free KV blocks, or does not report them. */
static int kv_fits(const gang_router_policy *p, uint32_t i, uint32_t need)
{
    return p->r[i].load.kv_free_blocks >= need;
}

/*
 * The least-loaded eligible replica, or -1: first those whose free KV blocks hold the
 * `need` blocks of the prompt (a replica without the room would preempt or queue it), then
 * the lowest load; ties: more free KV, then the rotating start.
 */
static int32_t least_loaded(const gang_router_policy *p, uint64_t exclude, uint32_t need)
{
    int32_t best = -1;
    uint32_t n = p->cfg.nreplicas;
    for (uint32_t k = 0; k < n; k++) {
        uint32_t i = (p->rr + k) % n;
        if (!eligible(p, i, exclude))
            continue;
        if (best < 0) {
            best = (int32_t)i;
            continue;
        }
        uint32_t b = (uint32_t)best, li = gang_router_policy_load(p, i),
                 lb = gang_router_policy_load(p, b);
        int fi = kv_fits(p, i, need), fb = kv_fits(p, b, need);
        if (fi != fb) {
            best = fi ? (int32_t)i : best;
            continue;
        }
        if (li < lb || (li == lb && p->r[i].load.kv_free_blocks > p->r[b].load.kv_free_blocks))
            best = (int32_t)i;
    }
    return best;
}

static int32_t round_robin(gang_router_policy *p, uint64_t exclude)
{
    uint32_t n = p->cfg.nreplicas;
    for (uint32_t k = 0; k < n; k++) {
        uint32_t i = (p->rr + k) % n;
        if (eligible(p, i, exclude))
            return (int32_t)i;
    }
    return -1;
}

int gang_router_policy_pick(gang_router_policy *p, const uint64_t *hashes, uint32_t n,
                            uint64_t exclude, gang_router_pick *out)
{
    int32_t ll = p->cfg.kind == GANG_ROUTER_ROUND_ROBIN ? round_robin(p, exclude)
                                                        : least_loaded(p, exclude, n);
    if (ll < 0)
        return GANG_EAGAIN;
    /* Round robin continues after the replica it chose; the others' tie-break rotates. */
    p->rr =
        (p->cfg.kind == GANG_ROUTER_ROUND_ROBIN ? (uint32_t)ll + 1 : p->rr + 1) % p->cfg.nreplicas;
    out->replica = (uint32_t)ll;
    out->matched = gang_router_policy_match(p, (uint32_t)ll, hashes, n);
    out->reason = p->cfg.kind == GANG_ROUTER_ROUND_ROBIN ? GANG_ROUTER_R_ROUND_ROBIN
                                                         : GANG_ROUTER_R_LEAST_LOADED;
    if (p->cfg.kind != GANG_ROUTER_PREFIX)
        return 0;
    int32_t best = -1;
    uint32_t best_m = 0;
    for (uint32_t i = 0; i < p->cfg.nreplicas; i++) {
        if (!eligible(p, i, exclude))
            continue;
        uint32_t m = gang_router_policy_match(p, i, hashes, n);
        if (m > best_m ||
            (m == best_m && m > 0 &&
             gang_router_policy_load(p, i) < gang_router_policy_load(p, (uint32_t)best))) {
            best = (int32_t)i;
            best_m = m;
        }
    }
    if (best < 0)
        return 0;
    uint32_t lb = gang_router_policy_load(p, (uint32_t)best),
             lmin = gang_router_policy_load(p, (uint32_t)ll);
    /* Overloaded: too many requests, or too few free KV blocks for the prompt's uncached
     * blocks where the least-loaded replica has the room. */
    if (lb > lmin + p->cfg.load_slack ||
        (!kv_fits(p, (uint32_t)best, n - best_m) && kv_fits(p, (uint32_t)ll, n))) {
        out->reason = GANG_ROUTER_R_OVERLOADED;
        return 0;
    }
    out->replica = (uint32_t)best;
    out->matched = best_m;
    out->reason = GANG_ROUTER_R_PREFIX;
    return 0;
}

void gang_router_policy_set_role(gang_router_policy *p, uint32_t i, uint32_t role)
{
    if (i < p->cfg.nreplicas)
        p->r[i].role =
            role == GANG_ROLE_PREFILL || role == GANG_ROLE_DECODE ? role : GANG_ROLE_BOTH;
}

/* The replicas that are up with a role in the set `roles` (bit r for role r), as a mask. */
static uint64_t up_with_role(const gang_router_policy *p, uint32_t roles)
{
    uint64_t m = 0;
    for (uint32_t i = 0; i < p->cfg.nreplicas; i++) {
        if (p->r[i].up && (roles >> p->r[i].role & 1u))
            m |= 1ull << i;
    }
    return m;
}

#define ROLES_PREFILL (1u << GANG_ROLE_PREFILL)
#define ROLES_ANSWER (1u << GANG_ROLE_BOTH | 1u << GANG_ROLE_DECODE)

int gang_router_policy_pd(const gang_router_policy *p)
{
    return up_with_role(p, ROLES_PREFILL) != 0 && up_with_role(p, ROLES_ANSWER) != 0;
}

int gang_router_policy_pick_phase(gang_router_policy *p, const uint64_t *hashes, uint32_t n,
                                  uint64_t exclude, gang_router_phase phase, gang_router_pick *out)
{
    uint64_t prefill = up_with_role(p, ROLES_PREFILL), answer = up_with_role(p, ROLES_ANSWER);
    if (phase == GANG_ROUTER_PHASE_PREFILL)
        return (prefill & ~exclude) != 0
                   ? gang_router_policy_pick(p, hashes, n, exclude | ~prefill, out)
                   : GANG_EAGAIN;
    /* The answer: never a prefill replica while a decode or both replica is eligible. */
    if ((answer & ~exclude) != 0)
        exclude |= prefill;
    return gang_router_policy_pick(p, hashes, n, exclude, out);
}

uint32_t gang_router_hash_ids(const int32_t *ids, size_t n, uint64_t *out, uint32_t cap)
{
    uint32_t k = 0;
    uint64_t h = 0;
    for (size_t at = 0; k < cap && at + GANG_ROUTER_BLOCK <= n; at += GANG_ROUTER_BLOCK) {
        h = gang_kv_block_hash(h, ids + at, GANG_ROUTER_BLOCK);
        out[k++] = h;
    }
    return k;
}

uint32_t gang_router_hash_text(const char *text, size_t len, uint64_t *out, uint32_t cap)
{
    uint32_t k = 0;
    uint64_t h = 0;
    int32_t ids[GANG_ROUTER_TEXT_BLOCK / 4];
    for (size_t at = 0; k < cap && at + GANG_ROUTER_TEXT_BLOCK <= len;
         at += GANG_ROUTER_TEXT_BLOCK) {
        for (uint32_t j = 0; j < GANG_ROUTER_TEXT_BLOCK / 4; j++) {
            const unsigned char *b = (const unsigned char *)text + at + 4 * j;
            ids[j] = (int32_t)((uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 |
                               (uint32_t)b[3] << 24);
        }
        h = gang_kv_block_hash(h, ids, GANG_ROUTER_TEXT_BLOCK / 4);
        out[k++] = h;
    }
    return k;
}
