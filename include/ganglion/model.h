/*
 * ganglion model module: the weights and their file formats. Llama-family configs in the
 * Hugging Face layout (config.json, generation_config.json) or a GGUF file's metadata, RoPE
 * tables, the safetensors and GGUF readers, one rank's shard of a model loaded and placed on
 * a device, and the random-model generator behind `ganglion mkmodel`. The generation
 * engine that runs a shard is engine/ (ganglion/engine.h).
 *
 * Layering: model/ sits on kernels/ and parallel/ (it fills gang_tp_layer shards); its GGUF
 * adapters build a tokenizer and a chat template through text/ (ganglion/text.h). engine/
 * and launcher/ sit on top of it. No CUDA, MPI or libuv types.
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
#include "ganglion/text.h"

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

/* The mixture-of-experts family of a config (its routing and tensor names). */
typedef enum gang_moe_family {
    GANG_MOE_NONE = 0,
    GANG_MOE_MIXTRAL = 1, /* MixtralForCausalLM: block_sparse_moe.{gate, experts.E.w1/w2/w3} */
    GANG_MOE_QWEN2 = 2,   /* Qwen2MoeForCausalLM: mlp.{gate, experts.E.*, shared_expert*} */
    GANG_MOE_QWEN3 = 3    /* Qwen3MoeForCausalLM: mlp.{gate, experts.E.*} */
} gang_moe_family;

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
    /* Mixture of experts (issue #25, model/config-moe.c): n_experts 0 for a dense model.
     * arch stays the attention's family (Mistral for Mixtral, Qwen2 / Qwen3 for their MoE
     * models); moe says which MoE family, whose sparse layers (gang_model_layer_moe) have
     * a router and experts instead of the dense MLP of ffn columns. */
    gang_moe_family moe;
    uint32_t n_experts;   /* num_local_experts / num_experts */
    uint32_t top_k;       /* num_experts_per_tok */
    int32_t norm_topk;    /* the top_k weights renormalised (Mixtral; norm_topk_prob) */
    uint32_t moe_ffn;     /* each expert's width (Mixtral: intermediate_size) */
    uint32_t shared_ffn;  /* Qwen2-MoE shared_expert_intermediate_size; 0: none */
    uint32_t sparse_step; /* decoder_sparse_step: layer i is sparse when (i + 1) % step == 0 */
    uint64_t mlp_only[GANG_MODEL_MAX_LAYERS / 64]; /* mlp_only_layers: bit i = dense layer */
} gang_model_config;

/*
 * Whether decoder layer `layer` of cfg is a mixture-of-experts layer: the model has
 * experts, the layer is not in mlp_only_layers and (layer + 1) % decoder_sparse_step == 0.
 */
int gang_model_layer_moe(const gang_model_config *cfg, uint32_t layer);

/*
 * Whether cfg's experts can be held as `ep` on TP groups of tp ranks (parallel.h, "Mixture-
 * of-experts layers"): ep 1 (experts cut by columns over the TP group: moe_ffn % tp) or
 * ep == tp (experts split whole: n_experts % ep), shared_ffn % tp, and ep 1 for a dense
 * model. 0, or GANG_EUSAGE with a one-line message naming the values in err.
 */
/*
 * The parameters of cfg as its files hold them (*total) and those one token reads
 * (*active: the router, top_k experts and the shared expert of a sparse layer instead of
 * all experts; the embedding row and the LM head counted whole). Either may be NULL.
 */
void gang_model_params(const gang_model_config *cfg, uint64_t *total, uint64_t *active);

/*
 * The load balance of a rank's MoE layers (issue #25), summed over them since they were
 * loaded: what its router sent to each expert and to each EP rank. Plain data, copied
 * between threads and over the agent <-> worker channel as it is.
 */
#define GANG_MOE_LOAD_EXPERTS 256 /* experts reported one by one (the rest only in slots) */
#define GANG_MOE_LOAD_RANKS 64    /* EP ranks reported one by one */
typedef struct gang_moe_load_sample {
    uint32_t n_experts;        /* of the model; per-expert counts for the first 256 */
    uint32_t ep, ep_rank;      /* the layers' EP group and this rank in it */
    uint32_t layers;           /* MoE layers of this rank's shard */
    uint64_t steps;            /* layer calls (steps x layers) */
    uint64_t slots;            /* (token, choice) pairs this rank routed */
    double last_max_over_mean; /* the last call's max / mean slots per expert (1: even) */
    double mean_max_over_mean; /* the same averaged over every call */
    uint64_t expert_slots[GANG_MOE_LOAD_EXPERTS];
    uint64_t rank_slots[GANG_MOE_LOAD_RANKS]; /* slots sent to each EP rank's experts */
} gang_moe_load_sample;

struct gang_model;
/* Fills *out from m's MoE layers; 1 when m has any, else 0 (and *out zeroed). The caller
 * must be the thread that runs m's layers, or hold it off. */
int gang_model_moe_load(const struct gang_model *m, gang_moe_load_sample *out);

/*
 * Whether a model's experts can be held as --ep says with --tp: ep 1 (every expert cut
 * by columns over the TP group), ep = tp (the experts split whole over the TP group), or
 * ep = k x tp, k > 1 (a stage of ep ranks: attention and dense layers TP over groups of
 * tp ranks replicated k times, the experts and the shared expert's columns split over
 * the stage's ep ranks). A dense model takes only ep 1. Returns 0; GANG_EUSAGE with a
 * one-line message naming what is supported (1 < ep < tp, ep not a multiple of tp, ep
 * not dividing the experts, tp / ep not dividing a width); GANG_EINVAL on NULL or 0.
 */
int gang_model_moe_layout(const gang_model_config *cfg, uint32_t tp, uint32_t ep, char *err,
                          size_t errlen);

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
    gang_tp_layer *layers;        /* [layer_count] shards (gang_tp_layer_free each) */
    gang_kernels_wtype wtype;     /* storage of embed, lm_head and the layers' matrices
                                     (gang_kernels_weight_bytes; GANG_KW_F32 = 0: f32 arrays) */
    void *embed;                  /* stage 0: [vocab, hidden] embed_tokens (packed), else NULL */
    float *final_norm;            /* last stage: [hidden] model.norm (f32), else NULL */
    void *lm_head;                /* last stage: [shard.vocab_count, hidden] rows of lm_head
                                     (of embed_tokens when tied), packed, else NULL */
    int32_t lm_head_tied;         /* 1: tied and embed is held here too (pp 1), so lm_head is
                                     not an array of its own but points at embed's rows
                                     shard.vocab_first ..; read it through gang_model_head */
    size_t weight_bytes;          /* bytes of weights this rank holds, in their storage */
    int32_t blocks;               /* 1: loaded keeping a GGUF file's blocks (issue #27): the
                                     layers are mixed (gang_tp_layer.mtype), embed is of wtype
                                     and an own lm_head of head_type */
    gang_kernels_wtype head_type; /* blocks: the storage of an own (untied) lm_head */
    int32_t repacked;             /* blocks: some weights are in the CPU kernels' own layout
                                     (gang_kernels_block_repack), which no device reads */
    char storage[160];            /* how the matrices are stored, for the logs */
    gang_kernels *mem;            /* after gang_model_to_device: the device handle holding every
                                     array (embed, final_norm, lm_head and the layers'); NULL
                                     while they are host arrays */
    void *wmap;                   /* blocks without no_mmap: the GGUF file mapped read-only
                                     (private), wmap_len bytes; the matrices that are whole-row
                                     bands in the file's order point into it (not malloc'd:
                                     gang_model_free unmaps it), the others are copies */
    size_t wmap_len;
    gang_kernels_arena *warena; /* blocks repacked for the CPU: the layers' matrices, on huge
                                   pages in the order a step reads them (not malloc'd:
                                   gang_model_free releases the arena); NULL otherwise */
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
 *             safetensors model: F32, BF16 or F16, so nothing is rounded; for a GGUF file
 *             its own types tensor by tensor: the quantized blocks as they lie in the
 *             file (m->blocks; a TP cut off a tensor's block boundaries dequantizes that
 *             tensor to f32, with a warning naming it), other tensors f32); "f32",
 *             "bf16", "f16" (a GGUF file's blocks are dequantized).
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
    uint32_t ep; /* a MoE model's experts (`--ep`): 0 or 1 cut by columns over the TP group,
                    tp split whole over it (gang_model_moe_layout); the load fails with
                    GANG_EMODEL and the layout's message otherwise */
    int no_mmap; /* `--no-mmap`: a GGUF file's blocks are read (pread) into arrays of their
                    own; 0: the file is mapped and whole-row bands point into it (m->wmap) */
    /* 1: block weights keep the file's layout, never the CPU kernels' own
     * (gang_kernels_block_repack): for a model that gang_model_to_device moves to a device,
     * whose kernels read the file's blocks. */
    int keep_layout;
} gang_load_options;

/*
 * Releases the resident pages of the bytes [p, p + n) of m's mapped file (m->wmap):
 * for a caller that took a copy of a mapped matrix (a kernels backend repacking it into
 * a layout of its own) and will not read the original again, so that the copy and the
 * file's pages are not both resident. Only whole pages inside the range go
 * (madvise MADV_DONTNEED; the mapping is read-only and private, so a later read faults
 * the file's bytes back in). Nothing happens for a range outside the mapping or a model
 * without one.
 */
void gang_model_release_mapped(const gang_model *m, const void *p, size_t n);

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
 * A GGUF file's blocks (m->blocks) move as the file's bytes, those mapped from the file
 * uploaded from the mapping, which is released afterwards; a model whose blocks the CPU
 * repacked (m->repacked: loaded without gang_load_options.keep_layout) is GANG_EINVAL.
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
    /* Mixture of experts (GANG_MOE_NONE: a dense model). The family names the class and
     * the tensors (Mixtral needs arch Mistral, Qwen2 / Qwen3 their arch); every layer from
     * dense_layers on is sparse (mlp_only_layers lists the first dense_layers; Mixtral: 0). */
    gang_moe_family moe;
    uint32_t experts, top_k, moe_ffn, shared_ffn, dense_layers;
    int32_t norm_topk;
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
