/*
 * ganglion model module: Llama-family models in the Hugging Face layout (config.json and
 * safetensors), one rank's shard of them, the random-model generator behind
 * `ganglion mkmodel`, and the generation engine that runs a gang's forward passes with a
 * KV cache, continuous batching and sampling.
 *
 * Layering: model/ sits on kernels/ and parallel/ (it fills gang_tp_layer shards and
 * drives the communicators); launcher/ sits on top of it. No CUDA, MPI or libuv types.
 *
 * Numerics follow the Hugging Face implementation of LlamaForCausalLM, MistralForCausalLM,
 * Qwen2ForCausalLM and Qwen3ForCausalLM (RMSNorm, rotate_half RoPE with rope_scaling
 * linear / dynamic / llama3 / yarn, GQA, a head_dim apart from hidden / heads, SwiGLU, q/k/v
 * biases for Qwen2, per-head q/k RMSNorm for Qwen3, tied or separate LM head); weights
 * stored as F32, F16 or BF16 are computed in f32.
 */
#ifndef GANGLION_MODEL_H
#define GANGLION_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ganglion/comm.h"
#include "ganglion/common.h"
#include "ganglion/kernels.h"
#include "ganglion/parallel.h"

/* ================================ model configuration ================================ */

typedef enum gang_model_arch {
    GANG_ARCH_LLAMA = 0,   /* LlamaForCausalLM */
    GANG_ARCH_MISTRAL = 1, /* MistralForCausalLM */
    GANG_ARCH_QWEN2 = 2,   /* Qwen2ForCausalLM: q/k/v projections carry biases */
    GANG_ARCH_QWEN3 = 3,   /* Qwen3ForCausalLM: per-head RMSNorm of q and k before RoPE */
    GANG_ARCH_GEMMA3 = 4   /* Gemma3ForCausalLM (text): q/k norm, sandwich norms, (1 + w)
                              RMSNorm weights, scaled embeddings, GeGLU, local and global
                              layers with their own RoPE bases */
} gang_model_arch;

/* config.json's "rope_scaling" ("rope_type", or the legacy "type"). */
typedef enum gang_rope_type {
    GANG_ROPE_DEFAULT = 0, /* absent, null or "default": theta^(-2i/d) */
    GANG_ROPE_LINEAR = 1,  /* every frequency divided by factor */
    GANG_ROPE_DYNAMIC = 2, /* dynamic NTK: the base grows with each sequence's length */
    GANG_ROPE_LLAMA3 = 3,  /* Llama 3.1: low frequencies / factor, a smooth band between */
    GANG_ROPE_YARN = 4     /* YaRN: ramp between interpolation and extrapolation, and an
                              attention factor on cos and sin */
} gang_rope_type;

/* The validated "rope_scaling" block (only the fields of its type are meaningful). */
typedef struct gang_rope_scaling {
    gang_rope_type type;
    float factor;               /* linear, dynamic, llama3, yarn: >= 1 */
    float low_freq_factor;      /* llama3 */
    float high_freq_factor;     /* llama3: > low_freq_factor */
    uint32_t orig_max_pos;      /* llama3, yarn: original_max_position_embeddings (yarn: =
                                   max_position_embeddings when absent) */
    float attn_factor;          /* yarn: "attention_factor", else 0.1 ln(factor) + 1 */
    float beta_fast, beta_slow; /* yarn: 32 and 1 when absent */
} gang_rope_scaling;

/* Bounds on what config.json may declare (inputs from model files are bounded). */
#define GANG_MODEL_MAX_LAYERS 1024
#define GANG_MODEL_MAX_HIDDEN 65536
#define GANG_MODEL_MAX_VOCAB (1u << 22)
#define GANG_MODEL_MAX_HEADS 1024
#define GANG_MODEL_MAX_HEAD_DIM 512 /* "head_dim" (even); the CUDA attention takes <= 256 */
#define GANG_MODEL_MAX_CONFIG_BYTES (1u << 20)
#define GANG_MODEL_MAX_HEADER_BYTES (100u << 20) /* safetensors JSON header */

#define GANG_MAX_EOS 8                             /* end-of-sequence ids a model may declare */
#define GANG_MODEL_MAX_GEN_CONFIG_BYTES (1u << 20) /* generation_config.json */

/*
 * Sampling defaults from DIR/generation_config.json, for the API to use when a request
 * omits a parameter; has_X says the file set X. "do_sample": false sets temperature 0
 * (greedy), as transformers reads it, whatever "temperature" says. Validated on read:
 * temperature >= 0, top_p in (0, 1], top_k an integer >= 0, repetition_penalty > 0.
 */
typedef struct gang_gen_defaults {
    uint32_t has_temperature, has_top_p, has_top_k, has_repetition_penalty;
    float temperature, top_p, repetition_penalty;
    uint32_t top_k;
} gang_gen_defaults;

typedef struct gang_model_config {
    gang_model_arch arch;
    uint32_t hidden;             /* hidden_size */
    uint32_t ffn;                /* intermediate_size */
    uint32_t n_heads;            /* num_attention_heads */
    uint32_t n_kv_heads;         /* num_key_value_heads (= n_heads when absent) */
    uint32_t n_layers;           /* num_hidden_layers */
    uint32_t vocab;              /* vocab_size */
    uint32_t head_dim;           /* "head_dim", else hidden / n_heads; q width n_heads x head_dim */
    uint32_t max_pos;            /* max_position_embeddings */
    uint32_t max_ctx_allowed;    /* the context the model may serve: max_pos, or for linear,
                                    dynamic and YaRN scaling factor x the original context
                                    when that is larger */
    gang_rope_scaling rope;      /* rope_scaling (type GANG_ROPE_DEFAULT when absent) */
    int32_t qk_norm;             /* Qwen3: q_norm / k_norm RMSNorm weights [head_dim] */
    uint32_t sliding_window;     /* keys a query sees (itself included) in a windowed layer;
                                    0: none (also when the window never binds) */
    uint32_t window_first_layer; /* layers from this one on are windowed (Qwen2's
                                    max_window_layers; 0 for Mistral) */
    uint32_t window_pattern;     /* Gemma 3: when > 0, layer i is windowed ("local") unless
                                    (i + 1) % window_pattern == 0 (a "global" layer); see
                                    gang_model_layer_window */
    float rope_local_theta;      /* Gemma 3: the RoPE base of windowed layers (plain RoPE,
                                    rope_scaling applies to the global ones); 0: rope_theta */
    float q_scale;               /* factor on q before attention: sqrt(head_dim /
                                    query_pre_attn_scalar) for Gemma; 0: none */
    float embed_scale;           /* factor on the embedding rows (Gemma: sqrt(hidden)); 0: none */
    int32_t post_norms;          /* Gemma: RMSNorm of each block's output before its residual
                                    add (post_attention / post_feedforward_layernorm) */
    int32_t norm_plus_one;       /* Gemma: RMSNorm weights stored as w for (1 + w); the loader
                                    adds 1 when reading a Hugging Face checkpoint (a GGUF file
                                    holds 1 + w already) */
    gang_tp_act act;             /* the MLP's gate activation (hidden_act / hidden_activation) */
    int32_t rope_freq_factors;   /* GGUF: a rope_freqs.weight tensor of head_dim / 2 factors
                                    divides the inverse frequencies (llama.cpp's form of
                                    Llama 3.1's llama3 scaling); the loader applies it */
    float rms_eps;               /* rms_norm_eps */
    float rope_theta;            /* rope_theta (10000 when absent) */
    int32_t tie_embeddings;      /* tie_word_embeddings: the LM head is the embedding table */
    int32_t attn_bias;           /* q/k/v biases present (Qwen2, or "attention_bias": true) */
    int32_t bos_token_id;        /* -1 when absent */
    int32_t eos_token_id;        /* -1 when absent; else eos_ids[0] */
    gang_dtype dtype;            /* torch_dtype (F32, F16 or BF16), informational */
    /* Every end-of-sequence id: config.json's eos_token_id (an int or a list), then
     * generation_config.json's when that file exists, in that order, deduplicated, each
     * < vocab. The engine ends a request after emitting one (unless it asks ignore_eos). */
    int32_t eos_ids[GANG_MAX_EOS];
    uint32_t n_eos;
    gang_gen_defaults gen; /* sampling defaults of generation_config.json (none: all unset) */
} gang_model_config;

/*
 * Reads and validates DIR/config.json, then DIR/generation_config.json when it exists
 * (its eos_token_id and sampling defaults). Returns 0 and *cfg; GANG_EMODEL with a
 * one-line message in err (naming the file and the field) for a missing config.json, a
 * file larger than GANG_MODEL_MAX_CONFIG_BYTES (GANG_MODEL_MAX_GEN_CONFIG_BYTES), invalid
 * JSON, an unknown architecture, a missing, non-integer or out-of-bounds field, an EOS id
 * outside the vocabulary or more than GANG_MAX_EOS of them, a bad sampling default, or a
 * field combination that cannot work (hidden % n_heads, n_heads % n_kv_heads, rope
 * scaling we do not implement); GANG_EINVAL for NULL arguments. err is always
 * NUL-terminated when errlen > 0.
 */
int gang_model_config_read(const char *dir, gang_model_config *cfg, char *err, size_t errlen);

/*
 * The model's RoPE tables, computed once per model: inv_freq[head_dim / 2] (f32, as
 * transformers keeps them) for cfg's rope_theta and rope_scaling, and *attn_scale, the
 * factor on cos and sin (YaRN's attention factor, else 1). For dynamic NTK it is the table
 * of sequences within the original context; the TP layers rescale longer ones
 * (gang_tp_layer.rope_dyn_factor). Returns 0, or GANG_EINVAL for NULL arguments or an odd
 * head_dim.
 */
int gang_rope_inv_freq(const gang_model_config *cfg, float *inv_freq, float *attn_scale);

/*
 * The sliding window of decoder layer `layer` (keys a query sees, itself included), or 0
 * when the layer attends to every earlier key: cfg->sliding_window on the windowed layers
 * (from window_first_layer on, or Gemma 3's local layers by window_pattern).
 */
uint32_t gang_model_layer_window(const gang_model_config *cfg, uint32_t layer);

/*
 * Fills the model fields of a topology config (layers, heads, kv heads, ffn, hidden,
 * vocab) from mc; the caller sets nnodes, nproc_per_node, tp, pp, allow_cross_node_tp
 * and then calls gang_topology_init, which refuses layouts the model cannot take.
 */
void gang_model_topology_config(const gang_model_config *mc, gang_topology_config *tc);

/*
 * The layout of mc on nnodes x nproc_per_node ranks as tp x pp (TP groups inside a node):
 * gang_model_topology_config, those four fields, then gang_topology_init, whose return
 * value (0, or GANG_EUSAGE with a one-line message in err) it returns.
 */
int gang_model_topology(const gang_model_config *mc, uint32_t nnodes, uint32_t nproc_per_node,
                        uint32_t tp, uint32_t pp, gang_topology *t, char *err, size_t errlen);

/* ================================ one rank's shard ================================ */

/*
 * One rank's share of a model: the layers of its pipeline stage cut for its TP rank,
 * the embedding table on stage 0, the final norm and this TP rank's vocabulary rows of
 * the LM head on the last stage. Every array is malloc'd and owned by the model: f32, or
 * for the matrices (embedding, LM head, the layers' projections) packed weights of
 * wtype when the model was loaded with --dtype bf16 / f16 or --quantize int8.
 * Fields are public so that the engine and tests can build one by hand
 * (gang_model_free releases whatever non-NULL arrays it holds with free()).
 */
typedef struct gang_model {
    gang_model_config cfg;
    gang_topology topo;    /* the layout this shard was cut for */
    gang_rank_place place; /* this rank */
    gang_tp_shard shard;   /* heads, ffn columns and vocab rows of this TP rank */
    uint32_t layer_first;  /* layers [layer_first, layer_first + layer_count) */
    uint32_t layer_count;
    gang_tp_layer *layers;    /* [layer_count] shards (gang_tp_layer_free each) */
    gang_kernels_wtype wtype; /* storage of embed, lm_head and the layers' matrices
                                 (gang_kernels_weight_bytes; GANG_KW_F32 = 0: f32 arrays) */
    void *embed;              /* stage 0: [vocab, hidden] embed_tokens (packed), else NULL */
    float *final_norm;        /* last stage: [hidden] model.norm (f32), else NULL */
    void *lm_head;            /* last stage: [shard.vocab_count, hidden] rows of lm_head
                                 (of embed_tokens when tied), packed, else NULL */
    int32_t lm_head_tied;     /* 1: tied and embed is held here too (pp 1), so lm_head is
                                 not an array of its own but points at embed's rows
                                 shard.vocab_first ..; read it through gang_model_head */
    size_t weight_bytes;      /* bytes of weights this rank holds, in their storage */
    gang_kernels *mem;        /* after gang_model_to_device: the device handle holding every
                                 array (embed, final_norm, lm_head and the layers'); NULL
                                 while they are host arrays */
} gang_model;

/*
 * The LM head of m (its last stage) as a typed weight view [shard.vocab_count, hidden]:
 * lm_head's own array, or the rows of the embedding table it is tied to (an int8 view then
 * takes the table's scales from row vocab_first on). Pointers into m's memory (host or
 * device). A zeroed view (data NULL) when m holds no head.
 */
gang_kernels_weight gang_model_head(const gang_model *m);

/*
 * Loads rank `rank`'s shard of the model in DIR for the validated layout t (built from
 * this model's config). Reads config.json, then model.safetensors or the shards named by
 * model.safetensors.index.json; opens each file read-only and reads (pread) only the
 * tensors of its stage and the rows / columns of its TP shard, converting them to f32,
 * so peak resident memory tracks the shard, not the file (docs/model.md has figures).
 * Validation (GANG_EMODEL, one-line message in err naming file and tensor): a missing
 * file or tensor, a header length beyond the file or GANG_MODEL_MAX_HEADER_BYTES, a
 * header that is not JSON or not an object of tensors, an unknown dtype, a shape that
 * differs from what the config implies, data offsets outside the file or overlapping
 * or not matching dtype x shape, a config that differs from the one t was built for.
 * Returns 0 and *out (release with gang_model_free); GANG_EINVAL for NULL arguments or
 * a rank outside t; GANG_ENOMEM. *out is NULL on error.
 */
int gang_model_load(const char *dir, const gang_topology *t, uint32_t rank, gang_model **out,
                    char *err, size_t errlen);

/*
 * How gang_model_load_ex stores the weights (`--dtype`, `--quantize`); o NULL is
 * gang_model_load's behaviour (every weight f32, as the tests and hand-built shards
 * expect).
 *   dtype:    NULL or "auto": the checkpoint's own precision (torch_dtype of a
 *             safetensors model: F32, BF16 or F16, so nothing is rounded; f32 for a GGUF
 *             file, whose quantized tensors are dequantized); "f32", "bf16", "f16".
 *   quantize: NULL or "none"; "int8": weight-only int8 with one scale per output row
 *             (per output channel of the rank's shard), whatever dtype says.
 * The matrices (the layers' projections, the embedding table, the LM head) are stored so
 * (m->wtype); norms, biases and RoPE tables stay f32. After a load, m->weight_bytes is
 * the bytes of weights this rank holds in the chosen storage (what a decode step
 * streams), whatever the storage is.
 */
typedef struct gang_load_options {
    const char *dtype;
    const char *quantize;
} gang_load_options;

/*
 * gang_model_load with options o (NULL: f32 storage). A dtype or quantize value outside
 * the lists above is GANG_EINVAL with a message in err naming the flag and the value; a
 * weight that cannot be stored as int8 (not finite) is GANG_EMODEL.
 */
int gang_model_load_ex(const char *dir, const gang_topology *t, uint32_t rank,
                       const gang_load_options *o, gang_model **out, char *err, size_t errlen);

/*
 * Stores the matrices of a host model m as t (gang_kernels_weight_pack: bf16 / f16
 * rounding, int8 with a scale per output row of the shard): every layer not yet of type t
 * (gang_tp_layer_pack; a layer already of type t, on the host or moved to a device, is
 * left alone, so a builder may pack and move each layer as it goes), then the embedding
 * table and the LM head, and sets m->wtype = t. m->weight_bytes, which must count the
 * matrices' f32 bytes before, changes by the difference. For loaders and models built in
 * memory (`ganglion bench decode --device cuda`); t = m->wtype changes nothing. Returns
 * 0; GANG_EINVAL for NULL, a t that is not a storage, m of another packed type or already
 * on a device (m->mem), a layer of another type on a device, or a weight int8 cannot hold
 * (not finite); GANG_ENOMEM. On error the layers converted so far stay converted (each
 * records its type), the embedding table, the LM head and m->wtype are unchanged: the
 * model is consistent for gang_model_free, not for serving.
 */
int gang_model_pack(gang_model *m, gang_kernels_wtype t);

/*
 * Fills the layout fields of m for global rank `rank` of t (topo, place, shard, layer
 * range) and allocates m->layers[layer_count] zeroed, for loaders and hand-built shards.
 * Returns 0, GANG_EINVAL (NULL, rank outside t) or GANG_ENOMEM.
 */
int gang_model_place(gang_model *m, const gang_topology *t, uint32_t rank);

/* Releases a model (every non-NULL array, the layers with gang_tp_layer_free). NULL ok.
 * A model moved to a device is first released from it (gang_model_device_release), so
 * its kernels handle must still be open. */
void gang_model_free(gang_model *m);

/*
 * Moves a host model (from gang_model_load or built by hand) into the tensor memory of k
 * once, for the engine to run on a device (model/device.c): every array is allocated
 * from k and uploaded, then its host copy is freed, so no host copy of the weights stays
 * resident on a GPU worker; m->mem = k. Peak host memory does not grow (arrays move one
 * at a time). On the "cpu" backend it is a no-op (host arrays are its tensor memory).
 * Returns 0, GANG_EINVAL (NULL, or already on another handle), or k's allocation /
 * upload error (GANG_ENOMEM when the device pool is too small); on error the arrays
 * moved so far stay on the device and the model remains consistent: release it with
 * gang_model_device_release + gang_model_free.
 */
int gang_model_to_device(gang_model *m, gang_kernels *k);

/*
 * Returns the device arrays of a model moved by gang_model_to_device to m->mem (which
 * must still be open) and sets them to NULL; a host model is left alone. Call it before
 * gang_model_free (or shard_free-like code) and before closing the handle. NULL ok.
 */
void gang_model_device_release(gang_model *m);

/* ================================ mkmodel ================================ */

typedef struct gang_mkmodel_opts {
    const char *out_dir; /* created if absent; config.json and model.safetensors written */
    gang_model_arch arch;
    uint32_t layers, hidden, heads, kv_heads, ffn, vocab, max_pos;
    uint64_t seed;    /* same options and seed -> byte-identical files */
    gang_dtype dtype; /* F32, F16 or BF16 */
    int32_t tie_embeddings;
    uint32_t shards; /* 1: model.safetensors; > 1: model-0000i-of-0000n.safetensors
                        + model.safetensors.index.json */
    /* config.json's eos_token_id: null when n_eos is 0, an int when 1, else a list. */
    int32_t eos_ids[GANG_MAX_EOS];
    uint32_t n_eos;
    uint32_t head_dim;        /* 0: hidden / heads; else q width heads x head_dim (even) */
    const char *rope_scaling; /* NULL: "rope_scaling": null; else a JSON object written as
                                 is (the config reader validates it) */
    float rope_theta;         /* 0: 1e6 for Qwen2/3, 1e4 otherwise */
} gang_mkmodel_opts;

/*
 * Writes a deterministic random model of the given shape in the Hugging Face layout.
 * Weights are drawn so that activations stay O(1) through the layers (a scaled normal
 * distribution from a seeded counter-based generator; norms near 1). Returns 0;
 * GANG_EUSAGE (message in err) for a shape the config reader would refuse; a system
 * error when a file cannot be written (nothing half-written is left under the final
 * names: files are written to temporary names and renamed).
 */
int gang_mkmodel(const gang_mkmodel_opts *o, char *err, size_t errlen);

/* ================================ generation engine ================================ */

/*
 * Sampling of one request. temperature 0 = greedy (argmax, lowest index on ties).
 * Penalties (vLLM's and transformers' meaning) change the logits before temperature,
 * top-k and top-p, greedy included: repetition_penalty over every distinct token of the
 * prompt and of the output so far (a positive logit is divided by it, a negative one
 * multiplied), then frequency_penalty x (count of the token in the output so far) and
 * presence_penalty once for a token that occurs in the output so far are subtracted.
 * A zero-initialised struct (with top_p 1) is plain greedy.
 */
typedef struct gang_sampling {
    float temperature;        /* >= 0 */
    uint32_t top_k;           /* 0 = off */
    float top_p;              /* (0, 1]; 1 = off */
    uint64_t seed;            /* draws depend only on (seed, position), never on batching */
    float presence_penalty;   /* 0 = off; the API bounds them to [-2, 2] */
    float frequency_penalty;  /* 0 = off; [-2, 2] */
    float repetition_penalty; /* 0 or 1 = off, else > 0 */
} gang_sampling;

#define GANG_MAX_STOP_TOKENS 16
#define GANG_MAX_TOP_LOGPROBS 20

/* One completion request, as the rank-0 worker receives it. Copied by submit. */
typedef struct gang_gen_request {
    uint64_t id;           /* caller's id, unique among live requests */
    const int32_t *prompt; /* token ids, each < vocab */
    uint32_t n_prompt;     /* >= 1 */
    uint32_t max_tokens;   /* >= 1; prompt + max_tokens <= the engine's context */
    int32_t stop[GANG_MAX_STOP_TOKENS];
    uint32_t n_stop; /* generation ends after emitting one of these */
    gang_sampling sampling;
    uint32_t ignore_eos;   /* 1: the model's EOS ids (cfg.eos_ids) do not end it */
    uint32_t logprobs;     /* 1: TOKEN events carry the chosen token's logprob */
    uint32_t top_logprobs; /* 0..GANG_MAX_TOP_LOGPROBS alternatives (needs logprobs) */
} gang_gen_request;

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
    uint32_t kind;  /* gang_gen_event_kind */
    uint64_t id;    /* the request */
    int32_t token;  /* TOKEN: the token id (also an EOS that ended the request) */
    uint32_t index; /* TOKEN: 0-based index among the generated tokens; DONE: the prompt
                       tokens found in the prefix cache (not computed) */
    char finish[8]; /* DONE: "length" or "stop" (a stop id or an EOS id) */
    float logprob;  /* TOKEN with logprobs: the token's raw log-probability, else 0 */
    uint32_t n_top; /* TOKEN: entries of top_* (the request's top_logprobs), else 0 */
    int32_t top_ids[GANG_MAX_TOP_LOGPROBS];
    float top_logprobs[GANG_MAX_TOP_LOGPROBS];
} gang_gen_event;

#define GANG_KV_BLOCK_DEFAULT 16u /* positions per KV block when the config says 0 */

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
 * share (model/engine-setup.c), so that a benchmark measures the engine serve runs: the
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
    uint32_t ranks_per_host;  /* ranks sharing this host's memory (--nproc-per-node); 0: 1 */
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
void gang_engine_free(gang_engine *e);
/* Slots (sequences that can be in flight at once) and context length of the engine. */
uint32_t gang_engine_slots(const gang_engine *e);
uint32_t gang_engine_max_ctx(const gang_engine *e);
/* The paged KV cache's size and use into *out. 0, or GANG_EINVAL on NULL. */
int gang_engine_kv_info(const gang_engine *e, gang_engine_kv *out);
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
 * One engine step: a collective call on every rank of the gang (world, tp and pp
 * communicators of the current generation; tp may be NULL when tp == 1, pp when pp == 1,
 * world when the gang is one rank). world carries host data (the plan, and the sampled
 * tokens from the last stage back to rank 0), so it must be a host backend (socket or
 * mpi; an nccl world is GANG_EINVAL); tp and pp carry activations and may be nccl
 * communicators over device memory (they are then used in the same order on both sides
 * of every pair, as NCCL's untagged send/recv needs). A communicator whose size or rank
 * does not match the model's topology is GANG_EINVAL before anything is sent.
 * Rank 0 builds the step's plan (continuous batching: running sequences decode one token,
 * waiting requests take free slots and prefill, up to max_step_tokens prompt tokens) and
 * broadcasts it over world; an empty plan is legal and is how idle ranks keep a deadline
 * (every rank returns after it). The plan's sequences run through the stages in
 * microbatches; the last stage samples and sends the tokens back to rank 0 over world.
 * Rank 0 then has events to poll. k is the handle the engine's memory came from when
 * that is a device (gang_engine_init_on), any "cpu" handle otherwise (GANG_EINVAL for a
 * mismatch). Returns 0, or a communicator error as is (the
 * communicators are then unusable; call gang_engine_reset before the next generation),
 * GANG_EPROTO for a plan that does not fit this rank's buffers, or a kernel error.
 */
int gang_engine_step(gang_engine *e, gang_kernels *k, gang_comm *world, gang_comm *tp,
                     gang_comm *pp, uint64_t timeout_ms);

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
 * and buffers.
 */
void gang_engine_reset(gang_engine *e);

/* ==================================== tokenizer ===================================== */

/*
 * A tokenizer read from a Hugging Face `tokenizer.json` (model/tokenizer.c, tok-*.c).
 * Supported exactly: the BPE model (merges as "a b" strings or [a, b] pairs,
 * ignore_merges, byte_fallback, unk_token with fuse_unk), the normalizers Prepend and
 * Replace (and Sequence), the pre-tokenizers ByteLevel, Split (regex or string pattern),
 * Digits and Sequence, the decoders ByteLevel and the SentencePiece chain Replace* /
 * ByteFallback / Fuse / Strip (leading only), the post-processors ByteLevel and
 * TemplateProcessing (single sequence), and added tokens with their
 * special/normalized/lstrip/rstrip flags. Anything else (WordPiece, Unigram, any other
 * normalizer, pre-tokenizer, decoder or post-processor, dropout, a subword prefix or
 * suffix, single_word added tokens) is refused at load with a message naming the
 * component. Encoding is thread-safe on one loaded tokenizer (it is read-only).
 */
#define GANG_TOK_MAX_FILE_BYTES (64u << 20) /* tokenizer.json size */
#define GANG_TOK_MAX_VOCAB (1u << 20)       /* vocabulary entries + added tokens */
#define GANG_TOK_MAX_MERGES (1u << 21)      /* BPE merges */
#define GANG_TOK_MAX_TOKEN_BYTES 4096u      /* one token's content */
#define GANG_TOK_MAX_ADDED 16384u           /* added tokens (Gemma 3 has 6,249 control tokens) */
#define GANG_TOK_MAX_TEXT_BYTES (64u << 20) /* one encode call's input */

typedef struct gang_tokenizer gang_tokenizer;

/* Reads and validates PATH (at most GANG_TOK_MAX_FILE_BYTES). 0 and *out on success;
 * GANG_EMODEL (unsupported or malformed content), GANG_EIO, GANG_ENOENT or GANG_ENOMEM
 * with a message in err otherwise. */
int gang_tokenizer_load(const char *path, gang_tokenizer **out, char *err, size_t errlen);
/* The same from a buffer of LEN bytes (need not be NUL-terminated). */
int gang_tokenizer_load_buffer(const char *json, size_t len, gang_tokenizer **out, char *err,
                               size_t errlen);
void gang_tokenizer_free(gang_tokenizer *tok);

/* Encodes LEN bytes of UTF-8 TEXT (GANG_EINVAL if it is not valid UTF-8). With
 * ADD_SPECIAL the post-processor's tokens (BOS) are added. *n is always set to the number
 * of ids the text needs; ids[0..cap) receives them; GANG_ERANGE when cap is too small. */
int gang_tokenizer_encode(const gang_tokenizer *tok, const char *text, size_t len, bool add_special,
                          int32_t *ids, size_t cap, size_t *n);

/* Number of ids (vocabulary and added tokens): every id is below it. */
int32_t gang_tokenizer_n_ids(const gang_tokenizer *tok);
/* The id of the token whose content is CONTENT (a vocabulary or added token, e.g.
 * "<|im_end|>"), or -1. */
int32_t gang_tokenizer_token_id(const gang_tokenizer *tok, const char *content);
/* The content of token ID as it appears in tokenizer.json, or NULL. */
const char *gang_tokenizer_token_text(const gang_tokenizer *tok, int32_t id);
/* Whether ID is an added token marked special. */
bool gang_tokenizer_is_special(const gang_tokenizer *tok, int32_t id);

/* Incremental decoding: ids go in one at a time, text comes out as soon as it is final.
 * ByteLevel decoders: an incomplete multi-byte character is held back until it
 * completes; bytes that can never form a character come out as U+FFFD, one per maximal
 * invalid subpart (as Python's and Rust's lossy decoders do). SentencePiece chains
 * (Replace, ByteFallback, Fuse, Strip): a run of <0xXX> byte tokens is held until the
 * next other token and comes out as its text when it is valid UTF-8, else as one U+FFFD
 * per byte (as tokenizers does); a run longer than GANG_TOK_DEC_RUN bytes is let out at
 * that length (the one place where a decode in pieces can differ from tokenizers, and
 * only for invalid runs that long). Concatenated steps plus the flush equal the decode of
 * the whole sequence. */
#define GANG_TOK_DEC_RUN 64u
/* Room a step needs beyond 3 x the token's length. */
#define GANG_TOK_DECODE_SLACK (3u * GANG_TOK_DEC_RUN + 8u)

typedef struct gang_tok_decoder {
    const gang_tokenizer *tok;
    bool skip_special;     /* drop special added tokens (as tokenizers' default) */
    unsigned char pend[4]; /* ByteLevel: held-back prefix of one character */
    unsigned npend;
    unsigned char run[GANG_TOK_DEC_RUN]; /* chain: held run of byte-fallback bytes */
    unsigned nrun;
    unsigned nstripped; /* chain: leading Strip characters dropped so far */
    bool started;       /* chain: text other than them has come out */
} gang_tok_decoder;

void gang_tok_decoder_init(gang_tok_decoder *d, const gang_tokenizer *tok, bool skip_special);
/* Appends the text ID completes to out[0..cap); *n is the number of bytes written.
 * GANG_EINVAL for an id out of range, GANG_ERANGE when cap is below
 * GANG_TOK_DECODE_SLACK + 3 x the token's length (nothing consumed). */
int gang_tokenizer_decode_step(gang_tok_decoder *d, int32_t id, char *out, size_t cap, size_t *n);
/* Ends the stream: what is held back comes out (cap: GANG_TOK_DECODE_SLACK). */
int gang_tokenizer_decode_flush(gang_tok_decoder *d, char *out, size_t cap, size_t *n);

/* ---------------------------------------------------------------------------------
 * Chat templates (model/chat-*.c): a bounded interpreter for the subset of Jinja that
 * the `chat_template` of tokenizer_config.json uses, rendering as transformers'
 * apply_chat_template does (jinja2 sandbox, trim_blocks, lstrip_blocks, loopcontrols).
 * Anything outside the subset is refused with a message naming it. Rendering is bounded
 * in steps, output, memory and recursion. A parsed template is immutable: several
 * threads may render it at once.
 * --------------------------------------------------------------------------------- */
typedef struct gang_chat_template gang_chat_template;
#define GANG_CHAT_MAX_TEMPLATE_BYTES (1u << 20)
/* Parses a template source. GANG_EMODEL with a message naming line/column and the
 * construct for a syntax error or an unsupported construct; GANG_EINVAL for NULL;
 * GANG_ENOMEM. */
int gang_chat_template_parse(const char *src, size_t len, gang_chat_template **out, char *err,
                             size_t errlen);
/* Reads DIR/tokenizer_config.json: "chat_template" (a string, or a list of
 * {"name","template"} objects: the one named "default"), and the "bos_token"/"eos_token"
 * strings (plain strings or AddedToken objects with "content"). Bounded size. GANG_ENOENT
 * when the file or the key is missing (message says which), GANG_EMODEL for a bad
 * file/template. */
int gang_chat_template_load(const char *dir, gang_chat_template **out, char *err, size_t errlen);
typedef struct gang_chat_render_opts {
    int add_generation_prompt;
    const char *bos_token, *eos_token; /* NULL: the values read by _load, or "" */
    uint64_t max_steps;                /* 0: a default (GANG_CHAT_DEFAULT_STEPS) */
    size_t max_output;                 /* 0: a default (GANG_CHAT_DEFAULT_OUTPUT) */
    /* NULL, or a JSON object (extra_len bytes) whose members become template variables,
     * as apply_chat_template's keyword arguments do: {"tools": [...]} (JSON schemas),
     * {"date_string": ...}, {"enable_thinking": false}; they override the ones above. */
    const char *extra_json;
    size_t extra_len;
} gang_chat_render_opts;
#define GANG_CHAT_DEFAULT_STEPS 1000000u
#define GANG_CHAT_DEFAULT_OUTPUT (4u << 20)
/* Renders with `messages` = the JSON array in messages_json (objects with "role" and
 * "content"; content may be a string or an array of parts, passed through as JSON
 * values), plus add_generation_prompt, bos_token, eos_token, tools = documents = none,
 * and the globals templates use (raise_exception, strftime_now, namespace, range, dict).
 * O may be NULL (defaults). On success 0 and *out (malloc'd, NUL-terminated, *out_len
 * bytes; free with free()). GANG_EINVAL (message) for a raise_exception() from the
 * template (its message) or bad JSON; GANG_ERANGE for step/output/memory/recursion
 * limits; GANG_EMODEL for a runtime error (undefined operation, type error) with the
 * line. Memory is bounded by 16 x max_output + 16 MiB. */
int gang_chat_render(const gang_chat_template *t, const char *messages_json, size_t len,
                     const gang_chat_render_opts *o, char **out, size_t *out_len, char *err,
                     size_t errlen);
void gang_chat_template_free(gang_chat_template *t);

/* ==================================== GGUF files ==================================== */

/*
 * A model may be one GGUF file (llama.cpp's format, docs/model.md "GGUF files"): every
 * function that takes a model directory (gang_model_config_read, gang_model_load, the
 * digest) also takes a path ending in ".gguf". Its config comes from the llama.*
 * metadata, its weights from the GGUF tensors (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0,
 * Q5_1, Q4_K, Q5_K, Q6_K, dequantized to f32 at load), and its tokenizer and chat
 * template from the tokenizer.* metadata, through the two loaders below.
 */
/* Whether path names a GGUF file (it ends in ".gguf"). */
int gang_model_is_gguf(const char *path);
/* The tokenizer of a GGUF file: the equivalent tokenizer.json of its tokenizer.ggml.*
 * metadata ("gpt2" byte-level BPE vocabularies; pre-tokenizers smollm, gpt-2, default,
 * llama-bpe), loaded with gang_tokenizer_load_buffer. GANG_EMODEL naming what is not
 * supported, the reader's errors, GANG_ENOMEM. */
int gang_gguf_tokenizer_load(const char *path, gang_tokenizer **out, char *err, size_t errlen);
/* Its tokenizer.chat_template, with bos_token / eos_token the texts of its bos and eos
 * ids. GANG_ENOENT when it has none; otherwise as gang_chat_template_load. */
int gang_gguf_chat_template_load(const char *path, gang_chat_template **out, char *err,
                                 size_t errlen);

#endif /* GANGLION_MODEL_H */
