/*
 * ganglion engine module (engine/): the generation engine that runs a gang's forward passes
 * over one rank's model shard: requests and their sampling, the scheduler with continuous
 * batching and chunked prefill, the paged KV cache with its block allocator and prefix
 * cache, the stage runner (embedding, layers, LM head through the one pipeline schedule),
 * sampling, and the plan that rank 0 broadcasts every step.
 *
 * Layering: engine/ sits on model/ (the shard it runs), parallel/ (communicators, TP
 * layers, the pipeline schedule) and kernels/; launcher/ and serve/ sit on top of it. No
 * CUDA, MPI or libuv types.
 */
#ifndef GANGLION_ENGINE_H
#define GANGLION_ENGINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ganglion/comm.h"
#include "ganglion/common.h"
#include "ganglion/kernels.h"
#include "ganglion/model.h"

/* ================================ generation engine ================================ */

#define GANG_MAX_STOP_TOKENS 16
#define GANG_MAX_TOP_LOGPROBS 20
#define GANG_MAX_LOGIT_BIAS 64        /* logit_bias entries of one request */
#define GANG_LOGIT_BIAS_BAN (-100.0f) /* a bias at or below it removes the token */
#define GANG_GRAMMAR_MAX_BYTES 16384u /* a request's grammar text (a JSON schema) */
#define GANG_GRAMMAR_WORDS(bytes) (((uint32_t)(bytes) + 3u) / 4u)

/*
 * How the tokens of one request are drawn, reported and stopped (vLLM's SamplingParams):
 * the one struct every layer carries, from the API's parser through the request
 * messages and the engine's submit to the plan each rank samples with.
 *
 * temperature 0 = greedy (argmax, lowest index on ties). Penalties (vLLM's and
 * transformers' meaning) change the logits before temperature, top-k and top-p, greedy
 * included: repetition_penalty over every distinct token of the prompt and of the output
 * so far (a positive logit is divided by it, a negative one multiplied), then
 * frequency_penalty x (count of the token in the output so far) and presence_penalty once
 * for a token that occurs in the output so far are subtracted. Then logit_bias is added
 * (OpenAI's: a bias <= GANG_LOGIT_BIAS_BAN removes the token), and a grammar, when the
 * request has one, removes every token that would leave the output no prefix of a value
 * of the grammar (text.h, gang_jgram_mask; the model's EOS ids are let through only once
 * the output is a whole value, and are the only ones left then). A zero-initialised
 * struct (with top_p 1) is plain greedy.
 */
typedef struct gang_sampling {
    float temperature;        /* >= 0 */
    uint32_t top_k;           /* 0 = off */
    float top_p;              /* (0, 1]; 1 = off */
    uint64_t seed;            /* draws depend only on (seed, position), never on batching */
    float presence_penalty;   /* 0 = off; the API bounds them to [-2, 2] */
    float frequency_penalty;  /* 0 = off; [-2, 2] */
    float repetition_penalty; /* 0 or 1 = off, else > 0 */
    uint32_t ignore_eos;      /* 1: the model's EOS ids (cfg.eos_ids) do not end it */
    uint32_t logprobs;        /* 1: TOKEN events carry the chosen token's logprob */
    uint32_t top_logprobs;    /* 0..GANG_MAX_TOP_LOGPROBS alternatives (needs logprobs) */
    uint32_t n_stop;          /* generation ends after emitting one of stop[0..n_stop) */
    int32_t stop[GANG_MAX_STOP_TOKENS];
    uint32_t n_bias;                       /* entries of bias_ids / bias */
    int32_t bias_ids[GANG_MAX_LOGIT_BIAS]; /* token ids (< vocab; others are ignored) */
    float bias[GANG_MAX_LOGIT_BIAS];       /* added to the token's logit, [-100, 100] */
    uint32_t grammar_bytes; /* 0: none; else the length of the request's JSON schema, whose
                               text travels with the prompt (gang_gen_request) */
} gang_sampling;

/*
 * The wire form of a gang_sampling (common.h's codec, either direction), little-endian:
 * u32 top_k, f32 temperature, f32 top_p, u64 seed, f32 presence, f32 frequency, f32
 * repetition, u8 ignore_eos, u8 logprobs, u8 top_logprobs, u8 n_stop, n_stop x i32 stop,
 * u8 n_bias, n_bias x i32 bias_ids, n_bias x f32 bias, u16 grammar_bytes (39 to 615
 * bytes). Decoding refuses flags over 1, top_logprobs over GANG_MAX_TOP_LOGPROBS, n_stop
 * over GANG_MAX_STOP_TOKENS, n_bias over GANG_MAX_LOGIT_BIAS and grammar_bytes over
 * GANG_GRAMMAR_MAX_BYTES; the values (temperature, penalties, ...) are checked by
 * whoever uses them (submit, a received plan).
 */
void gang_sampling_codec(gang_codec *c, gang_sampling *sp);

/*
 * One completion request, as the rank-0 worker receives it. Copied by submit. A request
 * with a grammar (sampling.grammar_bytes > 0) carries its text after the prompt, in the
 * same array, so that every transport of prompts carries it unchanged: the last
 * GANG_GRAMMAR_WORDS(grammar_bytes) entries of prompt[0..n_prompt) are the grammar's
 * bytes, four to an entry in memory order (gang_req_grammar_pack), and the prompt proper
 * is the entries before them.
 */
/*
 * Disaggregated prefill/decode (issue #26): what a request says about moving its prompt's
 * KV blocks between gangs. A prefill gang's request asks for an export: when it ends, rank
 * 0 pins the full blocks of its prompt, every rank copies its part of them out at the next
 * step (gang_kv_hooks.put) and the DONE event names the transfer (kv_id, kv_blocks). A
 * decode gang's request may name such a transfer: at its admission every rank starts
 * fetching its part (gang_kv_hooks.get) in the background, rank 0 learns at later steps
 * that every rank has it, a later step copies the parts into the blocks rank 0 gave the
 * request, which then starts with those blocks in its cache (and in the prefix cache);
 * on any failure it prefills them itself. No step waits for a fetch.
 */
#define GANG_KV_HOST_MAX 64u    /* the address of a transfer's source, NUL included */
#define GANG_KV_NODES_MAX 32u   /* nodes of a source gang whose addresses a transfer lists */
#define GANG_KV_RANKS_MAX 4096u /* ranks (pp x tp) of a source gang's layout */

/*
 * The layout of the gang that exported a transfer (issue #26: the pools may differ in
 * PP): its model's layer count, PP and TP (rank stage * tp + t holds TP shard t of stage
 * `stage`'s layers, gang_topology_stage_layers' rule), and where its ranks serve: node n
 * holds ranks [n * ranks_per_node, (n + 1) * ranks_per_node) at IPv4 address
 * node_addr[n] (network byte order). layers 0: unknown, the importer assumes its own
 * layout (rank r fetches from rank r). n_nodes 0 (or an address 0): every rank at the
 * transfer's host.
 */
typedef struct gang_kv_layout {
    uint32_t layers, pp, tp;
    uint32_t n_nodes, ranks_per_node;
    uint32_t node_addr[GANG_KV_NODES_MAX];
} gang_kv_layout;

/* Whether l is a layout a transfer may carry (layers 0, or 1 <= pp <= layers, tp >= 1,
 * pp x tp <= GANG_KV_RANKS_MAX, and n_nodes <= GANG_KV_NODES_MAX with n_nodes x
 * ranks_per_node == pp x tp when n_nodes > 0). 1 or 0. */
int gang_kv_layout_valid(const gang_kv_layout *l);

typedef struct gang_kv_xfer {
    uint64_t id;                 /* import: the transfer to fetch; 0 = none */
    uint32_t blocks;             /* import: full prompt blocks the transfer holds */
    uint32_t port;               /* import: the source gang's --kv-port (rank r: + r) */
    char host[GANG_KV_HOST_MAX]; /* import: the source gang's address */
    uint32_t do_export;          /* 1: export the prompt's full blocks when it ends */
    gang_kv_layout src;          /* import: the source gang's layout (zero: this gang's) */
} gang_kv_xfer;

typedef struct gang_gen_request {
    uint64_t id;           /* caller's id, unique among live requests */
    const int32_t *prompt; /* token ids, each < vocab (then the grammar's words) */
    uint32_t n_prompt;     /* >= 1 (+ the grammar's words) */
    uint32_t max_tokens;   /* >= 1; prompt + max_tokens <= the engine's context */
    gang_sampling sampling;
    gang_kv_xfer kv; /* P/D: export or import of its KV blocks (zero: neither) */
} gang_gen_request;

/* ------------------------------------------------------------------------------------
 * Request messages: how a request travels between whoever accepted it (the API, on any
 * agent) and rank 0's engine, and how its tokens come back. The launcher carries them
 * (the agent<->worker channel, a member's forwarding to the coordinator); the API builds
 * and reads them. One struct, one codec (gang_req_codec), whatever the transport.
 *
 *   SUBMIT(id, n_prompt, max_tokens, sampling, ids)  a request and its first prompt ids
 *   PROMPT(id, n_prompt, index = offset, ids)        the rest of a longer prompt, in order
 *   CANCEL(id)                                       stop generating it, free its slot
 *   TOKEN(id, index, token, logprob, top ids/lps)    one generated token, in order
 *   DONE(id, code, index = cached, finish, reason)   finished (code 0, "length"/"stop") or
 *                                                    refused (code < 0, reason says why)
 * The kinds keep the numbers of the rendezvous v2 API frames (docs/protocol.md).
 * ------------------------------------------------------------------------------------ */
typedef enum gang_req_kind {
    GANG_REQ_SUBMIT = 11,
    GANG_REQ_TOKEN = 12,
    GANG_REQ_DONE = 13,
    GANG_REQ_CANCEL = 14,
    GANG_REQ_PROMPT = 15
} gang_req_kind;

#define GANG_REQ_MAX_IDS 2048u   /* prompt ids of one SUBMIT or PROMPT */
#define GANG_REQ_REASON_MAX 256u /* DONE's reason, NUL included */
#define GANG_REQ_WIRE_MAX 9130u  /* the largest request message gang_req_codec writes */

typedef struct gang_req_msg {
    uint32_t kind;            /* gang_req_kind (a transport may add its own kinds) */
    uint64_t generation;      /* the gang generation it belongs to (the transport's) */
    uint64_t id;              /* the request */
    uint32_t n_prompt;        /* SUBMIT, PROMPT: ids of the whole prompt */
    uint32_t index;           /* PROMPT: offset of ids; TOKEN: 0-based index among the
                                 generated tokens; DONE: prompt tokens the cache held */
    uint32_t max_tokens;      /* SUBMIT */
    gang_sampling sampling;   /* SUBMIT */
    gang_kv_xfer kv;          /* SUBMIT: P/D export or import */
    uint64_t kv_id;           /* DONE: the export of its blocks (0: none) */
    uint32_t kv_blocks;       /* DONE: blocks exported; or imported when kv_id is 0 */
    uint32_t kv_ms;           /* DONE: milliseconds its import took (0: none) */
    uint32_t kv_mismatch;     /* DONE: 1: its import's source layout cannot feed this gang */
    uint32_t kv_device;       /* DONE: 1: its import's rows moved device to device (a pair) */
    gang_kv_layout kv_layout; /* DONE with kv_id: the exporting gang's layout */
    uint32_t n_ids;           /* SUBMIT, PROMPT: entries of ids */
    int32_t ids[GANG_REQ_MAX_IDS];
    int32_t token;  /* TOKEN */
    float logprob;  /* TOKEN, with logprobs */
    uint32_t n_top; /* TOKEN: entries of top_ids / top_lp */
    int32_t top_ids[GANG_MAX_TOP_LOGPROBS];
    float top_lp[GANG_MAX_TOP_LOGPROBS];
    int32_t code;                     /* DONE: 0, or the GANG_E* of a refusal */
    char finish[8];                   /* DONE: "length" or "stop" */
    char reason[GANG_REQ_REASON_MAX]; /* DONE with code < 0 */
} gang_req_msg;

/*
 * The fields of request message m after its kind (the caller's transport writes the kind
 * and the generation): u64 id, then per kind
 *   SUBMIT  u32 n_prompt, u32 max_tokens, the sampling (gang_sampling_codec), u32 n_ids,
 *           n_ids x i32, then the KV transfer: u64 id, u32 blocks, u16 port, u8 length +
 *           host (< GANG_KV_HOST_MAX), u8 do_export, the source's layout
 *           (gang_kv_layout_codec)
 *   PROMPT  u32 n_prompt, u32 index, u32 n_ids, n_ids x i32
 *   CANCEL  nothing
 *   TOKEN   u32 index, i32 token, f32 logprob, u8 n_top, n_top x i32, n_top x f32
 *   DONE    i32 code, u32 index, u8 length + finish (< 8), u16 length + reason (< 256),
 *           u64 kv_id, u32 kv_blocks, u32 kv_ms, u8 kv_mismatch, u8 kv_device, then the layout
 *           (gang_kv_layout_codec)
 * n_ids is at most GANG_REQ_MAX_IDS, and a SUBMIT's at most its n_prompt. A kind outside
 * gang_req_kind fails the codec (GANG_EINVAL / GANG_EPROTO).
 */
void gang_req_codec(gang_codec *c, uint32_t kind, gang_req_msg *m);
/* A gang_kv_layout: u32 layers, then with layers > 0: u16 pp, u16 tp, u8 n_nodes, u16
 * ranks_per_node, n_nodes x u32 addresses; a layout gang_kv_layout_valid refuses fails
 * it (GANG_EPROTO decoding, GANG_EINVAL encoding). */
void gang_kv_layout_codec(gang_codec *c, gang_kv_layout *l);
/* Whether kind is one of gang_req_kind. */
int gang_req_kind_valid(uint32_t kind);
/* Packs text[0..len) into GANG_GRAMMAR_WORDS(len) words at out (the last one padded
 * with zeros), as gang_gen_request carries a grammar. */
void gang_req_grammar_pack(const char *text, uint32_t len, int32_t *out);

typedef enum gang_gen_event_kind {
    GANG_GEN_TOKEN = 1, /* one generated token */
    GANG_GEN_DONE = 2   /* the request finished: reason "length" or "stop" */
} gang_gen_event_kind;

/*
 * Log-probabilities (when the request asked for logprobs) are the log-softmax of the
 * model's raw logits, before penalties and temperature (vLLM's default "raw logprobs"):
 * logprob of the chosen token, and the n_top highest ones, descending, ties by lower id.
 */
typedef struct gang_gen_event {
    uint32_t kind;            /* gang_gen_event_kind */
    uint64_t id;              /* the request */
    int32_t token;            /* TOKEN: the token id (also an EOS that ended the request) */
    uint32_t index;           /* TOKEN: 0-based index among the generated tokens; DONE: the prompt
                                 tokens found in the prefix cache (not computed) */
    char finish[8];           /* DONE: "length" or "stop" (a stop id or an EOS id) */
    uint64_t kv_id;           /* DONE: the export of its prompt's blocks (0: none) */
    uint32_t kv_blocks;       /* DONE: blocks exported; or imported when kv_id is 0 */
    uint32_t kv_ms;           /* DONE: milliseconds its import took on rank 0 (0: none) */
    uint32_t kv_mismatch;     /* DONE: 1: its import's source layout cannot feed this gang (the
                                 layer count or TP differ, or this gang has EP): it prefilled */
    uint32_t kv_device;       /* DONE: 1: its imported blocks moved device to device, over the
                                 transport's pair communicator (put_dev / get_dev), not TCP */
    gang_kv_layout kv_layout; /* DONE with kv_id: this gang's layout and nodes' addresses */
    float logprob;            /* TOKEN with logprobs: the token's raw log-probability, else 0 */
    uint32_t n_top;           /* TOKEN: entries of top_* (the request's top_logprobs), else 0 */
    int32_t top_ids[GANG_MAX_TOP_LOGPROBS];
    float top_logprobs[GANG_MAX_TOP_LOGPROBS];
} gang_gen_event;

#define GANG_KV_BLOCK_DEFAULT 16u /* positions per KV block when the config says 0 */

/* The prefix cache's key of a full block: h_i = gang_kv_block_hash(h_{i-1}, the block's
 * ids, block_size) with h_{-1} = 0, so equal keys mean equal prefixes. A router keys the
 * prompts it sends the same way (router/). Pure; any thread. */
uint64_t gang_kv_block_hash(uint64_t prev, const int32_t *ids, uint32_t n);

typedef struct gang_engine_config {
    uint32_t max_batch;       /* sequences in flight at once (slots), >= 1 */
    uint32_t max_ctx;         /* positions per sequence (prompt + generated), >= 2,
                                 capped at the model's max_pos */
    uint64_t kv_cache_bytes;  /* KV budget of this rank: the paged cache holds budget / bytes
                                 per block (of the gang's largest stage shard) blocks, the
                                 same number on every rank; fewer blocks than one sequence
                                 of max_ctx needs is GANG_ENOMEM */
    uint32_t microbatches;    /* sequences of a step are cut into this many microbatches */
    uint32_t max_step_tokens; /* prompt tokens admitted per step (chunking bound), >= 1 */
    uint32_t block_size;      /* positions per KV block; 0: GANG_KV_BLOCK_DEFAULT */
    gang_dtype kv_dtype;      /* the cache's elements: GANG_DTYPE_F32 (0), _BF16 or _F16
                                 (half the bytes per block; rows rounded as stored) */
    uint32_t prefix_caching;  /* 1: full blocks are cached by the hash chain of their tokens
                                 and reused by later requests with the same prefix */
    uint32_t cuda_graphs;     /* 1: a device that has graphs (cuda) captures each batch
                                 size's decode step once and replays it (engine-device.c;
                                 one stage, TP 1 or TP over NCCL, no logprobs or
                                 penalties in the step) */
} gang_engine_config;

/* `--kv-cache-dtype auto`: the cache type that follows weights stored as wt (bf16 and f16
 * keep their type, f32 and int8 weights get an f32 cache). */
gang_dtype gang_engine_kv_dtype_auto(gang_kernels_wtype wt);

/* What the paged KV cache of an engine holds (gang_engine_kv_info). */
typedef struct gang_engine_kv {
    uint32_t block_size;  /* positions per block */
    uint32_t blocks;      /* blocks of the pool */
    uint64_t tokens;      /* positions the pool holds: blocks x block_size */
    uint32_t full_seqs;   /* sequences of the whole context the pool holds at once */
    uint32_t free_blocks; /* rank 0: blocks no sequence holds now, cached ones included (0 on
                             other ranks) */
    uint64_t preempted;   /* rank 0: sequences preempted (recomputed later) so far */
    uint32_t slots;       /* sequences in flight at most (max_batch, or fewer blocks) */
    uint32_t max_ctx;     /* positions of one sequence's whole context */
    gang_dtype dtype;     /* the cache's elements */
    uint64_t prefix_query_tokens; /* rank 0: prefill tokens of every admission so far */
    uint64_t prefix_hit_tokens;   /* rank 0: of those, found in the prefix cache */
    uint32_t cached_blocks;       /* rank 0: cached blocks no sequence holds (evictable;
                                     counted in free_blocks) */
    uint32_t running;             /* rank 0: requests holding a slot (prefill or decode) */
    uint32_t waiting;             /* rank 0: requests queued for a slot (preempted included) */
} gang_engine_kv;

typedef struct gang_engine gang_engine;

/*
 * Creates the engine of one rank around a loaded model (borrowed; it must outlive the
 * engine). Allocates every buffer the steps need (KV pools, activations, logits) once:
 * nothing is allocated in the step loop. Returns 0 and *out; GANG_EINVAL; GANG_ENOMEM
 * (also when the budget holds fewer blocks than one sequence of max_ctx needs: the
 * message in err says how much that is).
 */
int gang_engine_init(gang_model *m, const gang_engine_config *cfg, gang_engine **out, char *err,
                     size_t errlen);

/*
 * gang_engine_init with every buffer (KV pools, activations, layer scratch, head buffers)
 * allocated from k's tensor memory. With a device k the model must have been moved to k
 * (gang_model_to_device; GANG_EINVAL otherwise), every step must be given this k, and
 * only the sampled logits rows come back to the host (one download per microbatch that
 * samples); collectives over host communicators are staged through host buffers
 * allocated here. k NULL, or a "cpu" handle, is gang_engine_init (host memory; the engine
 * then keeps a "cpu" handle of its own for allocations). k must outlive the engine.
 */
int gang_engine_init_on(gang_model *m, gang_kernels *k, const gang_engine_config *cfg,
                        gang_engine **out, char *err, size_t errlen);

/*
 * How `serve` sets up an engine, the one set-up its workers and the decode benchmark
 * share (engine/engine-setup.c), so that a benchmark measures the engine serve runs: the
 * serving flags, before the weights and the memory are known.
 */
typedef struct gang_engine_setup {
    uint32_t max_batch;       /* --max-batch */
    uint32_t max_ctx;         /* positions per sequence (the layout's context) */
    uint32_t microbatches;    /* --microbatches */
    uint32_t max_step_tokens; /* --max-step-tokens */
    uint64_t kv_cache_bytes;  /* --kv-cache-mb in bytes; 0: sized from free memory */
    int kv_dtype_auto;        /* --kv-cache-dtype auto: gang_engine_kv_dtype_auto(weights) */
    gang_dtype kv_dtype;      /* --kv-cache-dtype f32, bf16 or f16, when not auto */
    uint32_t prefix_caching;  /* --enable-prefix-caching */
    uint32_t cuda_graphs;     /* --cuda-graphs */
    uint32_t ranks_per_host;  /* ranks sharing this host's memory (--nproc-per-node); 0: 1 */
    const char *model_dir;    /* --model (its tokenizer, for grammars); NULL or "": none */
} gang_engine_setup;

/* Of the memory left after the weights, the KV cache's share when no budget is given:
 * on a device, of the pool's largest free block (the rest is the activations' and the
 * scratch's); on the host, of MemAvailable, split between the host's ranks (the host pool
 * is touched only as blocks are first used). Like vLLM's gpu_memory_utilization. */
#define GANG_KV_DEVICE_SHARE 90u
#define GANG_KV_HOST_SHARE 40u

/*
 * The KV budget of one rank set up as s on k (after its weights are loaded onto k):
 * s->kv_cache_bytes when non-zero; else GANG_KV_DEVICE_SHARE percent of the largest free
 * block of k's pool when k has one (a device); else GANG_KV_HOST_SHARE percent of the
 * host's MemAvailable over s->ranks_per_host (0 when /proc/meminfo cannot be read: the
 * engine then refuses with GANG_ENOMEM and says how much one sequence needs).
 */
uint64_t gang_engine_kv_budget(const gang_engine_setup *s, const gang_kernels *k);

/*
 * The engine config of s for weights stored as wt with the KV budget kv_bytes (from
 * gang_engine_kv_budget): s's sizes, the budget, and the cache type (s->kv_dtype, or for
 * auto gang_engine_kv_dtype_auto(wt)). A pure function: equal inputs, equal configs.
 */
void gang_engine_setup_config(const gang_engine_setup *s, gang_kernels_wtype wt, uint64_t kv_bytes,
                              gang_engine_config *out);

/*
 * The engine of a loaded model m (on k, as gang_engine_init_on wants it) set up as s:
 * gang_engine_setup_config with m's storage and gang_engine_kv_budget, then
 * gang_engine_init_on. The config used goes to *used when not NULL (for the logs).
 * Returns 0 and *out, or gang_engine_init_on's error with its message in err.
 */
int gang_engine_setup_init(const gang_engine_setup *s, gang_model *m, gang_kernels *k,
                           gang_engine **out, gang_engine_config *used, char *err, size_t errlen);

/*
 * Grammars (gang_sampling.grammar_bytes) need the tokens' bytes where the logits are
 * sampled: on that rank (the last stage's TP rank 0) this starts a background thread, at
 * the lowest CPU priority, that reads the tokenizer of the model at model_dir (its
 * tokenizer.json, or a GGUF file's vocabulary: tens of seconds for Gemma 3's 262k tokens
 * on a busy host, which must not delay the rank's start) into the sampler's table; the
 * first grammar to be sampled waits for it. On every other rank it does nothing.
 * gang_engine_setup_init calls it when s->model_dir is set. Without a table (no usable
 * tokenizer), grammars are not enforced and a warning says so. Returns 0, or
 * GANG_ENOMEM / the thread's error with a message in err.
 */
int gang_engine_load_vocab(gang_engine *e, const char *model_dir, char *err, size_t errlen);

void gang_engine_free(gang_engine *e);
/* Slots (sequences that can be in flight at once) and context length of the engine. */
uint32_t gang_engine_slots(const gang_engine *e);
uint32_t gang_engine_max_ctx(const gang_engine *e);
/* The paged KV cache's size and use into *out. 0, or GANG_EINVAL on NULL. */
int gang_engine_kv_info(const gang_engine *e, gang_engine_kv *out);

/*
 * The transport of P/D transfers (gang_kv_xfer), plugged in by the launcher. put runs on
 * the data thread inside gang_engine_step, every rank of the gang at the same step; get
 * runs on a fetch thread of the engine's (up to four at once, while steps go on), so it
 * must be safe to call concurrently with itself and with put.
 *   put: keep a copy of this rank's part of export `id` (n_blocks blocks, `bytes` at data,
 *        laid out block after block, each layer after layer, K then V rows); 0 or an error
 *        (the transfer is then simply not there to fetch).
 *   get: fill data (`bytes`) with the part `part` names of the transfer src names (the
 *        layers [layer_first, + layer_count) of n_blocks blocks, laid out as put's, from
 *        the source gang's rank part->rank at part->host, port src->port + part->rank),
 *        by deadline_ms (gang_now_ms clock); 0 or an error, after which the request
 *        prefills those blocks itself. A rank whose layers the source gang splits over
 *        several stages (another PP) calls it once per stage (gang_kv_layer_spans).
 *   addr: this rank's IPv4 address (network order) for decode ranks to reach its exports
 *        at, 0 when unknown; rank 0 lists the nodes' addresses in an export's DONE.
 * Without hooks an export is dropped and an import fails (and falls back).
 *
 * The device path (issue #26): an engine whose kernels hold device memory the host
 * cannot read (GANG_KERNELS_CAP_DEVICE_MEM: cuda, fake) uses put_dev and get_dev instead
 * when both are set, so that the blocks never pass through host memory:
 *   put_dev: takes export `id` as `dev`, `bytes` of device memory of k (from
 *        gang_kernels_alloc, filled as put's data, the handle synchronised); on 0 the
 *        hooks own it and free it with gang_kernels_free on k, on the data thread (a later
 *        put_dev) or after the engine stopped stepping; else the engine frees it.
 *   get_dev: like get, into device memory of k: run bytes of each of n_blocks blocks,
 *        block b's at dev + b * block_bytes + at (a part of fewer layers than this rank's
 *        fills its layers of each block). k is the engine's handle: the fetch thread may
 *        only make its device current (gang_kernels_bind_thread), never enqueue on it.
 */
typedef struct gang_kv_part {
    uint32_t rank;        /* the source gang's rank that holds these layers */
    uint32_t layer_first; /* model layers [layer_first, + layer_count) */
    uint32_t layer_count;
    char host[GANG_KV_HOST_MAX]; /* its address (the node's, else the transfer's host) */
} gang_kv_part;

typedef struct gang_kv_hooks {
    void *ctx;
    int (*put)(void *ctx, uint64_t id, const void *data, size_t bytes, uint32_t n_blocks);
    int (*get)(void *ctx, const gang_kv_xfer *src, const gang_kv_part *part, void *data,
               size_t bytes, uint32_t n_blocks, uint64_t deadline_ms);
    int (*put_dev)(void *ctx, uint64_t id, gang_kernels *k, void *dev, size_t bytes,
                   uint32_t n_blocks);
    int (*get_dev)(void *ctx, const gang_kv_xfer *src, const gang_kv_part *part, gang_kernels *k,
                   void *dev, size_t block_bytes, size_t at, size_t run, uint32_t n_blocks,
                   uint64_t deadline_ms);
    uint32_t addr;
} gang_kv_hooks;

/* What one block of this rank's KV pools is: its part of a transfer must match the
 * source's rank exactly (same layers, same kv columns, same element and block size). */
typedef struct gang_kv_shape {
    uint32_t layer_first, layer_count; /* this rank's layers */
    uint32_t kv_cols;                  /* kv heads of this rank x head_dim */
    uint32_t elem_bytes;               /* the cache's element size */
    uint32_t block_size;               /* positions per block */
    uint64_t block_bytes;              /* this rank's part of one block: layers x 2 x rows */
} gang_kv_shape;

/* Sets e's transfer hooks (copied; NULL clears them) and the deadline of an import. Any
 * rank, before or between steps. */
void gang_engine_set_kv_hooks(gang_engine *e, const gang_kv_hooks *h, uint64_t timeout_ms);
/* This rank's block shape into *out. 0, or GANG_EINVAL for a NULL argument. */
int gang_engine_kv_shape(const gang_engine *e, gang_kv_shape *out);

/* One run of a rank's layers that one stage of the source gang holds (P/D between gangs of
 * different PP, issue #26): layers [dst_first, dst_first + count) of this rank's part are
 * layers [src_first, src_first + count) of source stage src_stage's part. */
typedef struct gang_kv_span {
    uint32_t src_stage; /* the source gang's pp stage that holds these layers */
    uint32_t src_first; /* the run's first layer, counted in that stage's layers */
    uint32_t dst_first; /* the run's first layer, counted in this rank's layers */
    uint32_t count;     /* layers in the run, >= 1 */
} gang_kv_span;

/* The runs of layers [first, first + count) of a model of n_layers that a source gang
 * split in src_pp stages (gang_topology_stage_layers' rule) holds, in layer order, into
 * out[0..*n). Each source stage appears at most once; the runs cover the range exactly.
 * 0, GANG_EINVAL for a NULL pointer, src_pp 0 or > n_layers, count 0 or a range past
 * n_layers, GANG_ERANGE when more than max runs are needed (*n then 0). */
int gang_kv_layer_spans(uint32_t n_layers, uint32_t src_pp, uint32_t first, uint32_t count,
                        gang_kv_span *out, uint32_t max, uint32_t *n);

/*
 * The parts this rank (global rank `rank`, TP rank tp_rank, layers [first, first + count)
 * of n_layers) fetches of an import from a source gang of layout src (validated by
 * gang_kv_layout_valid), host being the transfer's address: src->layers 0 means the
 * source's layout is this gang's, one part from source rank `rank` covering the rank's
 * layers; else the source must have n_layers layers and src->tp must equal tp (this
 * gang's TP), and each source stage holding some of the layers gives one part from its
 * rank stage * tp + tp_rank (gang_kv_layer_spans), at its node's address when src lists
 * it. Parts in layer order into out[0..*n) (at most max, and at most 64). 0, GANG_EINVAL
 * (NULL, or a range past n_layers), GANG_EMISMATCH (layers or TP differ), GANG_ERANGE (more
 * parts than that).
 */
int gang_kv_parts(const gang_kv_layout *src, const char *host, uint32_t n_layers, uint32_t tp,
                  uint32_t rank, uint32_t tp_rank, uint32_t first, uint32_t count,
                  gang_kv_part *out, uint32_t max, uint32_t *n);
/*
 * Between generations, with no request live: the blocks rank 0 may hand out become
 * min(n, this pool's), so that ranks whose budgets differ (sized from their own free
 * memory) agree on the gang's smallest pool. 0; GANG_EINVAL (NULL, or n below one
 * sequence of the context); GANG_EAGAIN while requests are live.
 */
int gang_engine_limit_blocks(gang_engine *e, uint32_t n);

/*
 * Rank 0 only: queues a request. Validates it first (GANG_EINVAL with a message in err:
 * empty prompt, a token id outside the vocabulary, max_tokens 0, prompt + max_tokens
 * beyond the context, a duplicate id, too many stop tokens, a sampling parameter or
 * penalty out of range, top_logprobs above GANG_MAX_TOP_LOGPROBS or without logprobs,
 * flags other than 0 / 1) and changes nothing on error. A request ends after a stop id,
 * after one of the model's EOS ids (unless ignore_eos; finish "stop", and that token is
 * its last TOKEN event) or at max_tokens ("length").
 * Requests wait for a free slot and KV blocks; there is no bound other than GANG_ENOMEM.
 */
int gang_engine_submit(gang_engine *e, const gang_gen_request *r, char *err, size_t errlen);

/*
 * Rank 0 only, between steps: drops request id, queued or running (its slot and KV blocks are free
 * for the next plan, and no more events of it follow; events already produced stay in the ring).
 * Returns 0, or GANG_ENOENT when no live request has that id (already finished).
 */
int gang_engine_cancel(gang_engine *e, uint64_t id);

/* Rank 0 only: requests queued or in flight. */
uint32_t gang_engine_pending(const gang_engine *e);

/*
 * One engine step: a collective call on every rank of the gang (world, tp, ep and pp
 * communicators of the current generation; tp may be NULL when tp == 1, pp when pp == 1,
 * world when the gang is one rank; ep is the stage's EP group when it is wider than the
 * TP group (topology tp_replicas > 1: the MoE blocks run over it), and is ignored
 * otherwise (NULL: the MoE blocks run over tp, the EP group being the TP group)). world carries
 * host data (the plan, and the sampled tokens from the last stage back to rank 0), so it must be a
 * host backend (socket or mpi; an nccl world is GANG_EINVAL); tp and pp carry activations and may
 * be nccl communicators over device memory (they are then used in the same order on both sides of
 * every pair, as NCCL's untagged send/recv needs). A communicator whose size or rank does not match
 * the model's topology is GANG_EINVAL before anything is sent. Rank 0 builds the step's plan
 * (continuous batching: running sequences decode one token, waiting requests take free slots and
 * prefill, up to max_step_tokens prompt tokens) and broadcasts it over world; an empty plan is
 * legal and is how idle ranks keep a deadline (every rank returns after it). The plan's sequences
 * run through the stages in microbatches; the last stage samples and sends the tokens back to rank
 * 0 over world. Rank 0 then has events to poll. k is the handle the engine's memory came from when
 * that is a device (gang_engine_init_on), any "cpu" handle otherwise (GANG_EINVAL for a
 * mismatch). Returns 0, or a communicator error as is (the
 * communicators are then unusable; call gang_engine_reset before the next generation),
 * GANG_EPROTO for a plan that does not fit this rank's buffers, or a kernel error.
 */
int gang_engine_step(gang_engine *e, gang_kernels *k, gang_comm *world, gang_comm *tp,
                     gang_comm *ep, gang_comm *pp, uint64_t timeout_ms);

/*
 * Rank 0 only: the next event, 1 when one was written to *ev, 0 when none. Events are
 * kept in a ring of 4 x slots allocated at init; a step schedules a sequence to sample
 * only when the ring has room for its TOKEN and DONE events, so a caller that does not
 * poll stalls generation (steps become empty) but never loses an event. Poll after
 * every step.
 */
int gang_engine_poll(gang_engine *e, gang_gen_event *ev);

/*
 * Drops every request (rank 0) and forgets every KV slot's contents, after a gang abort:
 * the caller re-submits the requests it still owes from their prompts. Keeps the weights
 * and buffers; drops the captured decode-step graphs (they hold the old communicators'
 * collectives; the next decode steps capture new ones).
 */
void gang_engine_reset(gang_engine *e);

#endif /* GANGLION_ENGINE_H */
