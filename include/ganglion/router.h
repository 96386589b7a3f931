/*
 * ganglion router module (router/): data-parallel replicas behind one front door. A
 * replica is a whole gang (its coordinator's HTTP port); the router forwards each
 * completion to one replica, chosen by prefix-cache affinity, and retries it on another
 * when the chosen one fails before it answered.
 *
 * Two layers. The routing policy (router/policy.c) is pure C without I/O: per replica, the
 * chained hashes of the 16-token prompt blocks it was sent recently (a bounded LRU), its
 * health and its load; it picks a replica for a prompt's block hashes. The process
 * (`ganglion router`, router/router.c, router/proxy.c) owns the HTTP front door, the
 * replicas' polling and the forwarding; it runs on one libuv loop.
 *
 * Layering: router/ sits on serve/ (HTTP server, metrics renderers), text/ (tokenizer,
 * chat template) and engine/ (the prefix cache's block hash); only cli/ includes it. No
 * libuv type appears here.
 */
#ifndef GANGLION_ROUTER_H
#define GANGLION_ROUTER_H

#include <stddef.h>
#include <stdint.h>

#include "ganglion/common.h"

/* ============================== routing policy ===================================== */

#define GANG_ROUTER_BLOCK 16u          /* tokens per prompt block, as the engine's KV block */
#define GANG_ROUTER_TEXT_BLOCK 64u     /* bytes of raw text standing for one block */
#define GANG_ROUTER_MAX_REPLICAS 64u   /* replicas of one router (a 64-bit exclusion mask) */
#define GANG_ROUTER_MAX_BLOCKS 8192u   /* blocks of one prompt that are hashed */
#define GANG_ROUTER_MAX_LRU (1u << 20) /* remembered blocks per replica, at most */

typedef enum gang_router_kind {
    GANG_ROUTER_PREFIX = 0,      /* longest cached prefix unless overloaded, else least loaded */
    GANG_ROUTER_ROUND_ROBIN = 1, /* the next replica that is up */
    GANG_ROUTER_LEAST_LOADED = 2 /* the replica with the smallest load */
} gang_router_kind;

/* Why a replica was picked (the router's decisions by reason in /metrics). */
typedef enum gang_router_reason {
    GANG_ROUTER_R_PREFIX = 0,       /* it holds the longest prefix of the prompt */
    GANG_ROUTER_R_OVERLOADED = 1,   /* the prefix's replica was over the load bound */
    GANG_ROUTER_R_LEAST_LOADED = 2, /* no replica holds a prefix (or the least-loaded policy) */
    GANG_ROUTER_R_ROUND_ROBIN = 3,  /* the round-robin policy */
    GANG_ROUTER_R_COUNT = 4
} gang_router_reason;

/* The printable name of a reason ("prefix", "overloaded", "least_loaded", "round_robin"). */
const char *gang_router_reason_name(gang_router_reason r);
/* The kind named NAME ("prefix", "round-robin", "least-loaded") into *out; GANG_EINVAL. */
int gang_router_kind_parse(const char *name, gang_router_kind *out);

/* What a replica last reported, plus the router's own count of requests it holds there. */
typedef struct gang_router_load {
    uint32_t reported;       /* requests the replica holds (queued + running), last poll */
    uint32_t inflight;       /* requests this router sent there and has not seen answered */
    uint32_t kv_free_blocks; /* free KV blocks; UINT32_MAX when the replica does not say */
} gang_router_load;

typedef struct gang_router_policy_config {
    uint32_t nreplicas;  /* 1 .. GANG_ROUTER_MAX_REPLICAS */
    uint32_t lru_blocks; /* block hashes remembered per replica, 1 .. GANG_ROUTER_MAX_LRU */
    uint32_t load_slack; /* a prefix replica whose load exceeds the least-loaded one's by
                            more than this is overloaded */
    gang_router_kind kind;
} gang_router_policy_config;

typedef struct gang_router_pick {
    uint32_t replica;          /* the replica chosen */
    uint32_t matched;          /* leading blocks of the prompt it is believed to hold */
    gang_router_reason reason; /* why */
} gang_router_pick;

typedef struct gang_router_policy gang_router_policy;

/*
 * Allocates a policy for cfg->nreplicas replicas, all down, with empty block tables (a
 * replica is routed to only once gang_router_policy_set_up says it is up). All memory is
 * allocated here: nothing later allocates. Returns 0 and *out, GANG_EINVAL for a config
 * out of bounds, or GANG_ENOMEM. Single-threaded: one caller owns a policy.
 */
int gang_router_policy_init(const gang_router_policy_config *cfg, gang_router_policy **out);
void gang_router_policy_free(gang_router_policy *p);

/*
 * Marks replica i up or down. A replica going down forgets every block it was sent (its
 * gang restarts with an empty cache, or is gone): a later prefix hit there would be a
 * guess. Out-of-range i is ignored.
 */
void gang_router_policy_set_up(gang_router_policy *p, uint32_t i, int up);
int gang_router_policy_is_up(const gang_router_policy *p, uint32_t i);
/* Replaces replica i's load (its report and the router's in-flight count). */
void gang_router_policy_set_load(gang_router_policy *p, uint32_t i, const gang_router_load *l);
/* Replica i's load: max(reported, in-flight), the measure the policy compares. */
uint32_t gang_router_policy_load(const gang_router_policy *p, uint32_t i);

/*
 * Chooses a replica for a prompt whose chained block hashes are hashes[0..n) (n may be
 * 0), among those that are up and whose bit is clear in `exclude` (replicas a retry has
 * already tried). Prefix policy: the replica holding the longest leading run of the
 * hashes, unless it is overloaded: its load exceeds the least loaded's by more than
 * load_slack, or its free KV blocks are fewer than the prompt's blocks it does not hold
 * while the least loaded has room for the whole prompt; ties of equal length go to the
 * less loaded. With no prefix held anywhere (or when overloaded), the least loaded among
 * the replicas with free KV blocks for the n blocks of the prompt (all of them when none
 * has the room), ties broken by more free KV blocks and then by a rotating start, so that
 * equal replicas share new prompts. A replica that does not report its free blocks
 * (UINT32_MAX) always has the room. Returns 0 and *out, or GANG_EAGAIN when no
 * replica is eligible. Reads only: recording is gang_router_policy_record's.
 */
int gang_router_policy_pick(gang_router_policy *p, const uint64_t *hashes, uint32_t n,
                            uint64_t exclude, gang_router_pick *out);
/*
 * Disaggregated prefill/decode (issue #26). Replica i's role is what its gang reports as
 * ganglion_role (GANG_ROLE_BOTH, _PREFILL or _DECODE, serve.h); every replica starts as
 * BOTH. A call in P/D goes through two picks: GANG_ROUTER_PHASE_PREFILL chooses among the
 * prefill replicas only (GANG_EAGAIN when none is eligible: the caller sends the call
 * straight to its decode pick, whose gang then prefills itself), then
 * GANG_ROUTER_PHASE_DECODE among the decode and both replicas -- or, when none of those
 * is eligible, among the prefill ones too, so that a call is never refused while a gang
 * that can answer it is up. Within a phase the choice is gang_router_policy_pick's.
 */
typedef enum gang_router_phase {
    GANG_ROUTER_PHASE_DECODE = 0, /* the call's answer: decode and both replicas first */
    GANG_ROUTER_PHASE_PREFILL = 1 /* its prefill and first token: prefill replicas only */
} gang_router_phase;

/* Sets replica i's role (a GANG_ROLE_*; others read as BOTH). Out-of-range i is ignored. */
void gang_router_policy_set_role(gang_router_policy *p, uint32_t i, uint32_t role);
/* 1 when P/D applies now: a prefill replica and a decode or both replica are up. */
int gang_router_policy_pd(const gang_router_policy *p);
/* gang_router_policy_pick among the replicas of phase (see above). 0, or GANG_EAGAIN. */
int gang_router_policy_pick_phase(gang_router_policy *p, const uint64_t *hashes, uint32_t n,
                                  uint64_t exclude, gang_router_phase phase, gang_router_pick *out);

/* Leading blocks of hashes[0..n) that replica i is believed to hold (0 when down). */
uint32_t gang_router_policy_match(const gang_router_policy *p, uint32_t i, const uint64_t *hashes,
                                  uint32_t n);
/*
 * Remembers that replica i was sent a prompt with these block hashes: each becomes the
 * most recently used of i's table, the first block last (so the least recently used end
 * holds the tails of old prompts, which are evicted first, and a kept block's chain
 * stays whole as long as possible). When the table is full, the least recently used
 * entries are evicted.
 */
void gang_router_policy_record(gang_router_policy *p, uint32_t i, const uint64_t *hashes,
                               uint32_t n);
/* Block hashes replica i remembers now (<= lru_blocks). */
uint32_t gang_router_policy_cached(const gang_router_policy *p, uint32_t i);

/* ============================== prompt block hashes ================================ */

/*
 * The chained hashes of the full GANG_ROUTER_BLOCK-token blocks of ids[0..n), with the
 * engine's prefix-cache hash (gang_kv_block_hash), into out[0..cap). Returns the count.
 */
uint32_t gang_router_hash_ids(const int32_t *ids, size_t n, uint64_t *out, uint32_t cap);
/*
 * The same over raw text, when the router has no tokenizer: full GANG_ROUTER_TEXT_BLOCK-byte
 * chunks (about 16 tokens of English each) are the blocks, chained with the same hash
 * (the bytes packed four to an id). Returns the count.
 */
uint32_t gang_router_hash_text(const char *text, size_t len, uint64_t *out, uint32_t cap);

/* ============================== the router process ================================= */

/* `ganglion router [flags]`: argv[0] is "router". Returns an exit code. */
int gang_router_main(int argc, char **argv);

#endif
