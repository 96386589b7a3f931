/*
 * Internals of the generation engine (engine/engine*.c, engine/sample.c): the engine
 * struct, the step plan and its wire form, the scheduler of rank 0, the stage runner and
 * the sampler. Not a public header: only model/ and the engine's own tests include it.
 */
#ifndef GANGLION_MODEL_ENGINE_INTERNAL_H
#define GANGLION_MODEL_ENGINE_INTERNAL_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "ganglion/engine.h"
#include "ganglion/text.h"

/* ---------------------------------------------------------------------------------
 * The plan of one step, as every rank holds it after the broadcast. Its wire form is
 * described in engine-wire.c.
 * --------------------------------------------------------------------------------- */
#define GANG__PLAN_MAGIC 0x4e414c50u /* "PLAN" */
#define GANG__PLAN_HDR_WORDS 5u
/* Bytes of one entry (engine-wire.c, plan_seq_fields): 5 words, the sampling, whose stop
 * and bias lists make it 39 to 615 bytes, and the grammar (a u16 length and its text). */
#define GANG__PLAN_SEQ_MIN_BYTES 61u
#define GANG__PLAN_SEQ_MAX_BYTES (637u + GANG_GRAMMAR_MAX_BYTES)

#define GANG__GRAPHS 8 /* decode-step graphs an engine keeps (one per batch size) */

typedef struct gang__plan_seq {
    uint32_t slot;      /* slot of the sequence (its table, its history) */
    uint32_t pos0;      /* position of its first token of this step */
    uint32_t n;         /* tokens of this step (1 for a decode) */
    uint32_t sample;    /* 1: the last token's logits are sampled this step */
    gang_sampling sp;   /* sampling parameters (when sample; logprobs and top_logprobs say
                           what to report) */
    uint32_t n_prompt;  /* the request's prompt length: positions below are prompt */
    uint32_t tok_off;   /* offset of its tokens in the plan's token array (derived) */
    uint32_t g_len;     /* bytes of the grammar this entry carries (0: none): the first
                           sampling entry of a request after each admission to a slot
                           carries its grammar; the sampling rank keeps it by slot */
    char *g_text;       /* encode: the grammar (rank 0's request) */
    const char *g_wire; /* decode: the grammar, in the received plan */
} gang__plan_seq;

/*
 * What the last stage reports for one sampled sequence when the microbatch has a
 * sequence that asked for logprobs (otherwise only the token ids travel). Every field
 * is 4 bytes, so the struct has no padding and goes over the world as it is.
 */
typedef struct gang__result {
    int32_t token;
    float logprob;
    uint32_t n_top;
    int32_t top_ids[GANG_MAX_TOP_LOGPROBS];
    float top_lp[GANG_MAX_TOP_LOGPROBS];
} gang__result;

typedef struct gang__plan {
    uint32_t n_seq;       /* sequences of the step, <= slots */
    uint32_t n_tokens;    /* their tokens, <= max_tokens */
    gang__plan_seq *seqs; /* [slots] */
    int32_t *tokens;      /* [max_tokens] */
    uint32_t *seq_tokens; /* [slots] n of each sequence, for the batched layers */
    uint32_t *seq_pos0;   /* [slots] pos0 of each sequence */
    int32_t *out;         /* [slots] the sampled token of each sequence (-1: none) */
    gang__result *res;    /* [slots] logprobs of each sequence (when it asked for them) */
    /* The step's P/D transfer (engine-xfer.c), at most one, run by every rank before the
     * step's compute: copy its part of kv_n blocks out (export), start fetching its part
     * of an import in the background (import, into job kv_job), or copy a finished fetch
     * into the blocks (commit); and with kv_poll every rank reports its fetches to rank 0. */
    uint32_t kv_kind;   /* GANG__KV_NONE, _EXPORT, _IMPORT or _COMMIT */
    uint32_t kv_job;    /* import, commit: the fetch, < GANG__KV_JOBS */
    uint32_t kv_poll;   /* 1: every rank reports its fetches' state this step */
    uint32_t no_graphs; /* 1: rank 0 turned the decode step's graphs off (graphs_off), so
                           no rank captures or replays one (the choice must be the same on
                           every rank: gang__dev_graph_ok) */
    uint32_t kv_n;      /* blocks, <= max_bps */
    int32_t *kv_blocks; /* [max_bps] their ids in the pools */
    gang_kv_xfer kv;    /* id; for an import also the source (host, port) */
} gang__plan;

#define GANG__KV_NONE 0u
#define GANG__KV_EXPORT 1u
#define GANG__KV_IMPORT 2u
#define GANG__KV_COMMIT 3u
#define GANG__KV_JOBS 4u /* imports in flight at once */
/* Bytes the transfer adds to a plan's body at most: u8 poll, u8 kind, u8 job, u64 id, u32
 * n, the ids, u16 port, u8 length + host, the source's layout (gang_kv_layout_codec). */
#define GANG__PLAN_KV_MAX_BYTES(max_bps)                                                           \
    (3u + 8u + 4u + 4u * (max_bps) + 2u + GANG_KV_HOST_MAX + 11u + 4u * GANG_KV_NODES_MAX)

/*
 * One background fetch of a P/D import (engine-xfer.c). Every rank: a thread of its own
 * runs hooks.get into buf by `until`, then sets done and rc under mu; the data thread only
 * reads them under mu, copies buf into the pools when a plan commits it, and joins the
 * thread before the job is reused (bounded by `until`). Rank 0 also keeps the books: the
 * request it belongs to and whether every rank has it.
 */
typedef struct gang__kv_job {
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int live;     /* a thread was started and is not joined yet */
    int done, rc; /* under mu: the fetch ended, with 0 or an error */
    gang_kv_hooks hooks;
    gang_kv_xfer src;
    gang_kv_part *parts; /* [n_parts] what to fetch from which source rank (gang_kv_parts) */
    uint32_t n_parts;
    uint32_t layer_first; /* this rank's first layer */
    size_t layer_bytes;   /* one layer's K and V rows of one block */
    uint8_t *buf;         /* [bytes] this rank's part */
    gang_kernels *dk;     /* the device path: buf is device memory of dk (else NULL) */
    int on_dev;           /* this job ran on the device path (kept after the join) */
    size_t bytes;
    uint32_t n;              /* blocks */
    uint64_t until;          /* the fetch's deadline (gang_now_ms) */
    struct gang__request *q; /* rank 0: the importing request (NULL once it is gone) */
    uint32_t state;          /* rank 0: 0 free, 1 fetching, 2 every rank has it: commit */
    uint64_t t0, got;        /* rank 0: when it started; bytes every rank fetched */
} gang__kv_job;

/* ---------------------------------------------------------------------------------
 * Rank 0's request bookkeeping.
 * --------------------------------------------------------------------------------- */
typedef struct gang__request {
    gang_gen_request r;         /* the request; r.prompt points at prompt below */
    int32_t *prompt;            /* owned: the prompt, then the generated tokens (room for
                                   n_prompt + max_tokens), what a preempted request
                                   recomputes */
    int running;                /* holds a slot (and n_blocks blocks) */
    uint32_t slot;              /* when running */
    uint32_t n_fed;             /* tokens already in the cache (prompt, then output) */
    uint32_t n_blocks;          /* blocks reserved in its slot's table (rank 0's tables) */
    uint32_t n_hashed;          /* its leading full blocks whose hash chain is known */
    uint64_t hash;              /* the chain's hash after those blocks */
    uint32_t n_cached;          /* prompt tokens its last admission found in the cache */
    uint32_t planned;           /* in the plan being built (not a preemption victim) */
    uint32_t n_gen;             /* tokens generated so far */
    char *grammar;              /* r.sampling.grammar_bytes of its grammar (in prompt's
                                   allocation, after the room for the output), or NULL */
    uint32_t g_sent;            /* its grammar went out since its last admission */
    int32_t last;               /* the last generated token (the next decode's input) */
    uint32_t kv_state;          /* P/D import: 0 not tried, 1 fetching (not scheduled), 2 done */
    uint32_t kv_got;            /* blocks its import brought (0: none or failed) */
    uint32_t kv_ms;             /* milliseconds its import took */
    uint32_t kv_mismatch;       /* its import's source layout cannot feed this gang */
    uint32_t kv_device;         /* its import came over the device path */
    struct gang__request *next; /* arrival order */
} gang__request;

/* Sampling scratch: candidates of one row, allocated once for the vocabulary. */
typedef struct gang__cand {
    float logit;
    int32_t id;
} gang__cand;

typedef struct gang__sampler {
    gang__cand *cand; /* [vocab] */
    double *prob;     /* [vocab] */
    float *adj;       /* [vocab] the penalised logits */
    uint32_t *count;  /* [vocab] occurrences in the output; all zero between calls */
    uint32_t vocab;
    /* Grammars (gang__sampler_vocab, gang__sampler_grammar): the tokenizer's table, the
     * grammar of each slot, the mask's scratch, the model's EOS ids. */
    gang_jgram_vocab *gv;              /* NULL: no tokenizer, grammars are not enforced */
    struct gang__vocab_loader *loader; /* the table being read in the background, or NULL */
    gang_jgram **slot_g;               /* [n_slots] */
    uint32_t n_slots;
    uint8_t *allowed; /* [vocab] */
    int32_t eos[GANG_MAX_EOS];
    uint32_t n_eos;
} gang__sampler;

/* The tokens a sequence has fed so far, for the penalties (the last stage keeps them). */
typedef struct gang__history {
    const int32_t *ids; /* [n] the tokens at positions 0 .. n - 1 */
    uint32_t n;         /* the position of the token being drawn */
    uint32_t n_prompt;  /* ids [0, n_prompt) are the prompt, the rest the output */
    uint32_t slot;      /* the sequence's slot (its grammar) */
} gang__history;

struct gang_engine {
    gang_model *m;       /* borrowed */
    gang_kernels *k;     /* whose tensor memory holds the buffers below marked (T) */
    gang_kernels *own_k; /* a "cpu" handle init opened for itself (k NULL at init), or NULL */
    gang_engine_config cfg;
    uint32_t slots;             /* sequence slots (same on every rank) */
    uint32_t max_ctx;           /* positions per slot */
    uint32_t max_tokens;        /* tokens one step may carry: slots + max_step_tokens */
    uint32_t vocab;             /* model vocabulary */
    uint32_t vpad;              /* ceil(vocab / tp): the padded logits of one TP rank */
    uint32_t is_first, is_last; /* this rank's stage is 0 / pp - 1 */
    size_t plan_max_words;      /* largest body a valid plan can have */

    gang_tp_kv_cache *caches; /* [layer_count x slots], layer-major: every slot of a
                                 layer sees that layer's block pool through its table */
    char *kv_mem;             /* (T) the block pools: per layer, K then V, each
                                 [n_blocks, block_size, kv cols] */
    uint32_t block_size;      /* positions per KV block */
    uint32_t n_blocks;        /* blocks of every layer's pool */
    uint32_t n_usable;        /* blocks rank 0 hands out: n_blocks, or the gang's
                                 smallest pool (gang_engine_limit_blocks) */
    uint32_t max_bps;         /* table entries per slot: ceil(max_ctx / block_size) */
    int32_t *tables;          /* host: [slots, max_bps] each slot's block table */
    int32_t *tables_dev;      /* (T) the same, what the attention kernels read */
    uint32_t *block_seen;     /* [n_blocks] which sequence of a received plan writes
                                 each block (1 + its index), 0 none */
    int32_t *pc_hits;         /* rank 0: [max_bps] a lookup's cached blocks */
    uint32_t *free_blocks;    /* rank 0: [n_blocks] stack of the free block ids (no
                                 sequence holds them, no cached content) */
    uint32_t n_free;          /* rank 0: entries of free_blocks */
    uint64_t n_preempted;     /* rank 0: sequences preempted so far */

    /* Rank 0, automatic prefix caching (engine-kv.c): full blocks keyed
     * by the hash chain of their tokens, shared by reference count; cached blocks no
     * sequence holds wait in an LRU list and are evicted when the free stack is empty. */
    uint32_t *blk_ref;   /* [n_blocks] sequences holding each block */
    uint64_t *blk_hash;  /* [n_blocks] chain hash of a cached block */
    int32_t *blk_parent; /* [n_blocks] the block before it in its chain, -1 for the first */
    int32_t *blk_tokens; /* [n_blocks, block_size] its tokens (a hit is checked exactly) */
    uint8_t *blk_cached; /* [n_blocks] in the hash table */
    int32_t *ht_head;    /* [ht_cap] first cached block of each bucket, -1 none */
    int32_t *ht_next;    /* [n_blocks] next cached block of the same bucket */
    uint32_t ht_cap;     /* buckets, a power of two */
    int32_t *lru_prev;   /* [n_blocks] the LRU list of cached blocks nobody holds */
    int32_t *lru_next;
    int32_t lru_head; /* the least recently released (evicted first), -1 none */
    int32_t lru_tail;
    uint32_t n_lru;
    uint64_t prefix_query_tokens;  /* prefill tokens of the admissions */
    uint64_t prefix_hit_tokens;    /* of those, found in the cache */
    gang_tp_kv_cache **cache_ptrs; /* [slots] per-sequence caches of one batched call */
    gang_tp_scratch scratch;       /* (T) the batched layers' scratch */
    float *act;                    /* (T) [max_tokens, hidden] activations of the step */
    int32_t *tokens_dev;           /* (T) stage 0: [max_tokens] the plan's token ids */
    float *head_in;                /* (T) last stage: [slots, hidden] normed last tokens */
    float *head_out;               /* (T) last stage: [slots, vocab_count] this rank's logits */
    float *head_pad;               /* (T) last stage, tp > 1: [slots, vpad] the same, padded */
    float *gathered;               /* (T) last stage, tp > 1: [tp, slots, vpad] every rank's */
    float *logits_dev;             /* (T) last stage, tp > 1, device: [slots, vocab] the rows
                                      assembled before their one download; NULL on the host */
    float *logits;                 /* host, last stage: [slots, vocab] the sampled rows, in
                                      the order they were sampled (head_row) */
    uint32_t *head_row;            /* [slots] row of logits of each plan sequence */
    uint32_t n_head_rows;          /* rows of logits filled in this step */
    gang_tp_stage stage;           /* host staging of the PP transfers and the logits
                                      all-gather when k is a device (else empty) */
    gang_tp_shard *shards;         /* [tp] every TP rank's shard (vocab ranges) */
    gang__sampler sampler;
    int32_t *hist; /* last stage, TP rank 0: [slots, max_ctx] every token fed to each
                      slot, at its position (what the penalties count) */
    /* The device path of a step (engine-device.c; a device handle only, else NULL). */
    int32_t *tables_held;                     /* host: [slots, max_bps] what tables_dev holds */
    int32_t *tab_pairs;                       /* host: [2 x slots x max_bps] a step's (index,
                                                 block) updates of tables_dev */
    int32_t *tab_pairs_dev;                   /* (T) the same, for the scatter */
    gang_kernels_sample_param *samp;          /* last stage, host: [slots] by head row */
    gang_kernels_sample_param *samp_dev;      /* (T) the same */
    int32_t *ids_dev;                         /* (T) last stage: [slots] ids drawn, by head row */
    int32_t *ids;                             /* host: the same, once downloaded */
    uint32_t host_sample;                     /* this step samples on the host (a host handle, or
                                                 a sequence with logprobs or penalties) */
    uint32_t ids_first, ids_pending;          /* head rows drawn on the device, not yet fetched */
    gang_kernels_graph *graphs[GANG__GRAPHS]; /* captured decode steps (cfg.cuda_graphs) */
    uint32_t graph_batch[GANG__GRAPHS];       /* the batch size each was captured for */
    uint32_t n_graphs, graph_next;            /* held; the next one evicted when full */
    uint64_t graph_replays;                   /* decode steps run as a graph (tests) */
    uint32_t graphs_off;                      /* the device has no graphs, or a capture
                                                 failed: every step runs its kernels (rank
                                                 0's goes out as the plan's no_graphs),
                                                 until gang_engine_reset */
    int32_t *plan_buf;                        /* header + body of the wire form */
    int32_t *wire_tables; /* [slots, max_bps] the tables of a plan on the wire, by sequence */
    uint8_t *slot_seen;   /* [slots] duplicate check of a received plan */
    gang__plan plan;
    uint32_t plan_valid; /* the plan of the last step ran to completion */

    /* P/D transfers (engine-xfer.c). Every rank: the hooks, a host staging buffer of
     * max_bps blocks (allocated at the first transfer), the counters. Rank 0: the exports
     * waiting for a step (a ring of [slots], each with max_bps pinned blocks) and the
     * request whose import is in the current plan. */
    gang_kv_hooks kv_hooks;
    uint64_t kv_timeout_ms;
    uint8_t *kv_stage;
    uint64_t *kvx_id;       /* rank 0: [slots] ring of pending exports */
    uint32_t *kvx_n;        /* rank 0: [slots] their block counts */
    int32_t *kvx_blocks;    /* rank 0: [slots, max_bps] their pinned blocks */
    gang_gen_event *kvx_ev; /* rank 0: [slots] their requests' DONE, held until exported */
    uint32_t kvx_head, kvx_count;
    uint64_t kvx_next;               /* rank 0: the next export id (random start, never 0) */
    gang__kv_job kvj[GANG__KV_JOBS]; /* the background fetches (mu and cv: kvj_init) */
    int kvj_init;
    uint64_t kv_exports, kv_imports, kv_import_failures, kv_import_mismatches, kv_bytes;

    /* Rank 0 only. */
    gang__request *queue_head, *queue_tail; /* every live request, in arrival order */
    gang__request **slot_req;               /* [slots] the request holding each slot, or NULL */
    uint32_t n_pending;
    gang_gen_event *events; /* ring of [ev_cap] */
    uint32_t ev_cap, ev_head, ev_count;
};

/* ---- the scheduler (engine-sched.c) and the commit of a step (engine-events.c) ---- */

/* Rank 0: builds this step's plan from the queue (continuous batching) into e->plan. */
void gang__sched_build(gang_engine *e);
/* Rank 0: applies the sampled tokens of a completed step: events, finished requests. */
void gang__sched_commit(gang_engine *e);
/* Rank 0, between steps: drops request id (queued or running; its slot is free for the
 * next plan). 0, or GANG_ENOENT when no live request has that id. */
int gang__sched_cancel(gang_engine *e, uint64_t id);
/* Drops every request and event (rank 0); used by reset and free. */
void gang__sched_clear(gang_engine *e);

/* ---- P/D transfers (engine-xfer.c) ---- */

/* Rank 0, building a plan: puts at most one transfer into it -- the oldest pending
 * export, else a commit, else the start of waiting request q's import when it can be
 * admitted now (it then holds a slot and the blocks of its prompt, and is not scheduled
 * until its fetch is settled: committed, or failed and prefilled). Returns 1 when q was
 * admitted so, 2 when q must wait for a later plan (this one already moves blocks, or
 * every fetch is in use), 0 when q is admitted as usual (no transfer, or none to try). */
int gang__xfer_admit(gang_engine *e, gang__request *q, uint32_t free_slot);
/* Rank 0, building a plan: the oldest pending export into it, when there is one. */
void gang__xfer_plan_export(gang_engine *e);
/* Rank 0, building a plan after the export: a fetch every rank has into it (commit) when
 * it has no transfer yet, and the poll while any fetch is in flight. */
void gang__xfer_plan_import(gang_engine *e);
/* Rank 0: request q is going away (finished, cancelled): its fetch, if any, is not
 * committed (the blocks go back with q). */
void gang__xfer_forget(gang_engine *e, const gang__request *q);
/* Rank 0, at the end of request q (before its blocks go back): pins its prompt's full
 * blocks for an export when it asked for one and keeps its DONE event ev (with the
 * export's id) until the export ran, so that nobody can fetch an export before it
 * exists: returns 1 then (the caller does not emit ev), else fills ev's kv fields and
 * returns 0. */
int gang__xfer_on_done(gang_engine *e, gang__request *q, gang_gen_event *ev);
/* Every rank, after the plan's exchange: runs the plan's transfer (copy out and agree
 * with rank 0 over world; start a background fetch; copy a finished one in), then the
 * poll of the fetches, then rank 0's bookkeeping. Never waits for a fetch. 0 or a
 * communication error (a failed fetch is not one: the request falls back). */
int gang__xfer_run(gang_engine *e, gang_comm *world, uint64_t deadline);
/* Allocates rank 0's export ring and every rank's fetch locks (init). 0 or GANG_ENOMEM. */
int gang__xfer_alloc(gang_engine *e);
void gang__xfer_free(gang_engine *e);
/* Rank 0: drops the pending exports and the fetches' books (reset; a fetch thread still
 * running is joined when its job is reused, or at free). */
void gang__xfer_clear(gang_engine *e);
/* Wire: the plan's flags and transfer fields (engine-wire.c calls it at the end of the
 * body). */
void gang__plan_kv_fields(gang_codec *c, const gang_engine *e, gang__plan *p);

/* ---- KV blocks and the prefix cache (engine-kv.c, rank 0 but the upload) ---- */

/* Rank 0: drops one reference on block b (a pinned export's): nobody else holding it, it
 * goes to the LRU list when cached, else to the free stack. */
void gang__kv_unpin(gang_engine *e, int32_t b);

/* Rank 0: every block free again and the prefix cache empty (init and reset). */
void gang__kv_reset(gang_engine *e);
/* Blocks a sequence can take now: the free stack and the cached blocks nobody holds. */
uint32_t gang__kv_avail(const gang_engine *e);
/* Grows q's table to n blocks: from the free stack, else by evicting the least recently
 * released cached block. The caller checked the room (gang__kv_avail). */
void gang__kv_take(gang_engine *e, gang__request *q, uint32_t n);
/* Gives q's blocks back (a cached one nobody else holds goes to the LRU list) and its
 * slot to the free slots; q stops running. */
void gang__kv_release(gang_engine *e, gang__request *q);
/*
 * The leading full blocks of q's first `limit` prompt tokens found in the prefix cache,
 * into hits [max_bps]; *held_free counts those nobody holds now (they leave the available
 * room when taken), *hash the chain's hash after them. Returns their count.
 */
uint32_t gang__pc_lookup(const gang_engine *e, const gang__request *q, uint32_t limit,
                         int32_t *hits, uint32_t *held_free, uint64_t *hash);
/* Takes a reference on cached block b (a hit of gang__pc_lookup), out of the LRU list. */
void gang__pc_hold(gang_engine *e, int32_t b);
/* Registers q's blocks that became full with its last step's tokens. */
void gang__pc_register(gang_engine *e, gang__request *q);
/* Brings e->tables_dev up to the decoded plan's tables: a host handle copies each
 * sequence's row; a device updates the changed entries in place (engine-device.c). 0 or
 * the first error. */
int gang__plan_upload_tables(gang_engine *e);

/* ---- the device path of a step (engine-device.c) ---- */

/* Allocates the device path's buffers (nothing for a host handle) and sets the device
 * tables to the host's zeros: init only. 0, GANG_ENOMEM or the upload's error. */
int gang__dev_alloc(gang_engine *e);
void gang__dev_free(gang_engine *e);
/* Decides, for the decoded plan, whether this step samples on the host, clears the
 * pending ids and, on a device's sampling rank, uploads the step's sampling parameters
 * (one upload without a wait, in head-row order). Every rank calls it before running the
 * stage. 0 or the upload's error. */
int gang__dev_step_begin(gang_engine *e);
/*
 * The last stage's TP rank 0, device path: draws the ns sampling sequences of plan
 * sequences [first, first + count) from rows [ns, vocab] (tensor memory: head rows row0
 * ..) into ids_dev, with the parameters gang__dev_step_begin uploaded; sets head_row. The
 * ids come down at gang__dev_fetch_ids. 0 or the first kernels error.
 */
int gang__dev_sample(gang_engine *e, gang_kernels *k, const float *rows, uint32_t first,
                     uint32_t count, uint32_t row0, uint32_t ns);
/* Downloads the ids drawn since the last fetch (one host wait) into e->plan.out. */
int gang__dev_fetch_ids(gang_engine *e, gang_kernels *k);
/*
 * Graphs of the decode step (cfg.cuda_graphs). ok: this step may be captured or replayed
 * (a device with graphs, one stage, TP 1 or a TP group whose collectives a graph may hold
 * (gang_comm_graph_ok: NCCL; the decision is the same on every TP rank, from the plan they
 * share), one microbatch, every sequence one token that
 * samples on the device, no per-sequence RoPE tables, no MoE layer: those route on the
 * host). find: the graph of this batch
 * size, or NULL. prepare: the uploads a replay cannot make (the layers' positions and
 * table offsets; the ids, tables and sampling parameters went up already). store: keeps
 * a new graph (evicting the oldest of GANG__GRAPHS). done: what the head of a replayed
 * step would have recorded on the host (TP rank 0: head rows, pending ids).
 */
int gang__dev_graph_ok(const gang_engine *e, const gang_comm *tp, uint32_t nmb);
gang_kernels_graph *gang__dev_graph_find(const gang_engine *e);
int gang__dev_graph_prepare(gang_engine *e, gang_kernels *k);
void gang__dev_graph_store(gang_engine *e, gang_kernels_graph *g);
void gang__dev_graph_done(gang_engine *e);
/* Frees every graph (gang_engine_reset: a new generation's communicators; a graph holds
 * the old ones' collectives). A graph still running is freed when it ends. */
void gang__dev_graph_clear(gang_engine *e);

/* Blocks that cover positions 0 .. n - 1. */
static inline uint32_t gang__blocks_for(const gang_engine *e, uint32_t n)
{
    return (n + e->block_size - 1) / e->block_size;
}

/* ---- the plan's wire form (engine-wire.c) ---- */

/* The plan's header, the first GANG__PLAN_HDR_WORDS words on the wire. */
typedef struct gang__plan_hdr {
    uint32_t magic; /* GANG__PLAN_MAGIC */
    uint32_t n_seq;
    uint32_t n_tokens;
    uint32_t n_table;    /* block-table entries of the body */
    uint32_t body_bytes; /* bytes after the header (the broadcast rounds up to words) */
} gang__plan_hdr;

/* The header's fields, both directions (the tests build headers with it too). */
void gang__plan_hdr_fields(gang_codec *c, gang__plan_hdr *h);
/*
 * Writes plan p, with sequence i's block table at tables[i * max_bps], as header + body
 * into buf (room for GANG__PLAN_HDR_WORDS + plan_max_words words). 0 and the body's size
 * in words (its bytes rounded up, padded with zeros); GANG_EINVAL for counts or fields
 * past e's or the codec's bounds. No other check: receivers validate (the tests write
 * plans a scheduler would never build). tables is only read; it is not const because the
 * codec's one walk serves both directions.
 */
int gang__plan_write(const gang_engine *e, const gang__plan *p, int32_t *tables, int32_t *buf,
                     uint32_t *body_words);
/* Rank 0: encodes e->plan (tables from e->tables by slot) into e->plan_buf; returns the
 * body's word count. */
uint32_t gang__plan_encode(gang_engine *e);
/*
 * Validates a received header against this rank's bounds. Returns 0 and the body's
 * size in words (what the second broadcast carries), or GANG_EPROTO.
 */
int gang__plan_check_header(const gang_engine *e, const int32_t *hdr, uint32_t *body_words);
/* Decodes and validates header and body in e->plan_buf into e->plan (the block tables
 * into e->tables, only once the whole plan is valid). 0 or GANG_EPROTO. */
int gang__plan_decode(gang_engine *e);
/* Whether sp's penalties and bias are in range: presence and frequency in [-2, 2], repetition
 * 0 (off) or > 0, all finite, at most GANG_MAX_LOGIT_BIAS biases in [-100, 100] (submit
 * and the plan's receivers check the same). */
int gang__penalties_ok(const gang_sampling *sp);

/* ---- the stages (engine-run.c) ---- */

/*
 * Runs e->plan through this rank's stage: embedding on stage 0, the layers, the LM head
 * and sampling on the last stage, microbatches through the pipeline; rank 0 ends with
 * e->plan.out. Activations go over pp, the sampled tokens over world (a host
 * communicator; pp may be nccl). Returns 0 or the first error.
 */
int gang__engine_run(gang_engine *e, gang_kernels *k, gang_comm *world, gang_comm *tp,
                     gang_comm *pp, uint64_t deadline);

/*
 * The logits [vocab] the last step computed for plan sequence i, on the last stage's
 * TP rank 0 (for tests and the reference tool), or NULL when that sequence did not
 * sample or this rank does not hold them. A device step that sampled on the device kept
 * them there: the row is downloaded (a host wait) into e->logits first.
 */
const float *gang__engine_logits(gang_engine *e, uint32_t i);

/* ---- sampling (sample.c) ---- */

int gang__sampler_init(gang__sampler *s, uint32_t vocab);
void gang__sampler_free(gang__sampler *s);
/* The sampler takes table gv (owned from here on, NULL: grammars are not enforced) and
 * the model's EOS ids, which a grammar lets through once its value is whole. */
void gang__sampler_vocab(gang__sampler *s, gang_jgram_vocab *gv, const int32_t *eos,
                         uint32_t n_eos);
/* Waits for the background read of the tokens' table (gang_engine_load_vocab), if one
 * runs, and takes its result. The data thread (or free) only. */
void gang__sampler_vocab_wait(gang__sampler *s);
/* Compiles the grammar text[0..len) of the request now in slot (of n_slots) for its
 * sampling (the plan's decoder, on the sampling rank). A text that does not compile (the
 * API compiled it before, so only a different build) leaves the slot unconstrained and
 * is logged. 0 or GANG_ENOMEM. */
int gang__sampler_grammar(gang__sampler *s, uint32_t n_slots, uint32_t slot, const char *text,
                          uint32_t len);
/*
 * Draws the token at position `position` from logits [vocab] with sp: greedy (argmax,
 * lowest index on ties, NaN ignored) when temperature is 0 or top_k is 1, otherwise
 * top-k, then temperature softmax, then top-p, then one uniform draw keyed by
 * (sp->seed, position).
 */
int32_t gang__sample(gang__sampler *s, const float *logits, const gang_sampling *sp,
                     uint64_t position);
/*
 * gang__sample after the penalties of sp (presence, frequency, repetition; none set:
 * exactly gang__sample) applied to a copy of logits, counted over h: the repetition
 * penalty over every distinct id of h->ids [0, n), the others over the output part
 * [n_prompt, n); then sp's logit bias, then the mask of the grammar of h->slot when sp
 * has one (gang_jgram_mask over the output part; an output the grammar refuses, or a
 * mask that leaves nothing, leaves the EOS ids alone). The draw's position is h->n.
 * logits is left as it was.
 */
int32_t gang__sample_seq(gang__sampler *s, const float *logits, const gang_sampling *sp,
                         const gang__history *h);
/*
 * The raw log-probability (log-softmax in double) of `token` in logits into r->logprob,
 * r->token = token, and the n_top highest ones (descending, ties by lower id, NaN
 * skipped) into r->top_ids / top_lp, r->n_top = n_top (<= GANG_MAX_TOP_LOGPROBS).
 */
void gang__logprobs(const gang__sampler *s, const float *logits, int32_t token, uint32_t n_top,
                    gang__result *r);
/* The uniform draw in [0, 1) of (seed, position): a counter-based generator. */
double gang__sample_uniform(uint64_t seed, uint64_t position);

#endif /* GANGLION_MODEL_ENGINE_INTERNAL_H */
