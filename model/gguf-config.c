/*
 * gang_model_config from a GGUF file's metadata (llama.cpp's keys), and the names of the
 * tensors a GGUF file gives the Hugging Face weights the loader asks for.
 *
 *   general.architecture                 "llama" (Llama, Mistral and SmolLM2 convert to it),
 *                                        "qwen2" (q/k/v biases; the keys below then
 *                                        start with "qwen2."), "qwen3" (q/k norms) or
 *                                        "gemma3" (see g_gemma)
 *   llama.block_count                    layers
 *   llama.embedding_length               hidden
 *   llama.feed_forward_length            ffn
 *   llama.attention.head_count           heads
 *   llama.attention.head_count_kv        kv heads (= heads when absent)
 *   llama.context_length                 max positions
 *   llama.attention.layer_norm_rms_epsilon, llama.rope.freq_base
 *   llama.attention.key_length           head_dim (= hidden / heads when absent)
 *   tokenizer.ggml.tokens                vocab (the count; llama.vocab_size must agree)
 *   tokenizer.ggml.bos_token_id, eos_token_id, eot_token_id
 *   tensor output.weight                 absent: the LM head is tied to token_embd
 *   tensor rope_freqs.weight             [head_dim / 2] factors dividing RoPE's inverse
 *                                        frequencies (Llama 3.1 / 3.2 files: llama3 scaling)
 *
 * Refused, naming the key: another architecture, rope scaling, a rope dimension or value
 * length other than the key length, experts (MoE), and the bounds of config.json.
 */
#include <stdio.h>
#include <string.h>

#include "ganglion/model.h"
#include "gguf.h"

typedef struct gcfg {
    const gang__gguf *g;
    const char *path;
    char *err;
    size_t errlen;
    const char *arch; /* "llama" or "qwen2": the prefix of the model's keys */
} gcfg;

/* The entry of key, whose "llama." prefix stands for the architecture's (qwen2.block_count
 * for a qwen2 file); the resolved name goes to full (64 bytes) for messages. */
static const gang__gguf_kv *g_find(const gcfg *c, const char *key, char full[64])
{
    if (strncmp(key, "llama.", 6) == 0)
        snprintf(full, 64, "%s.%s", c->arch, key + 6);
    else
        snprintf(full, 64, "%s", key);
    return gang__gguf_find_kv(c->g, full);
}

/* An unsigned integer key into *out within [lo, hi]; absent: def (< 0: refused). */
static int g_uint(const gcfg *c, const char *name, int64_t def, uint64_t lo, uint64_t hi,
                  uint32_t *out)
{
    char key[64];
    const gang__gguf_kv *kv = g_find(c, name, key);
    int64_t v;

    if (kv == NULL) {
        if (def < 0) {
            gang_set_err(c->err, c->errlen, "%s: metadata %s is missing", c->path, key);
            return GANG_EMODEL;
        }
        *out = (uint32_t)def;
        return 0;
    }
    switch (kv->type) {
    case GANG__GGUF_U8:
    case GANG__GGUF_U16:
    case GANG__GGUF_U32:
    case GANG__GGUF_U64:
        v = kv->num.u > INT64_MAX ? -1 : (int64_t)kv->num.u;
        break;
    case GANG__GGUF_I8:
    case GANG__GGUF_I16:
    case GANG__GGUF_I32:
    case GANG__GGUF_I64:
        v = kv->num.i;
        break;
    default:
        gang_set_err(c->err, c->errlen, "%s: metadata %s is not an integer", c->path, key);
        return GANG_EMODEL;
    }
    if (v < 0 || (uint64_t)v < lo || (uint64_t)v > hi) {
        gang_set_err(c->err, c->errlen, "%s: metadata %s = %lld is outside [%llu, %llu]", c->path,
                     key, (long long)v, (unsigned long long)lo, (unsigned long long)hi);
        return GANG_EMODEL;
    }
    *out = (uint32_t)v;
    return 0;
}

/* A float key in (0, hi]; absent: def. */
static int g_float(const gcfg *c, const char *name, double def, double hi, float *out)
{
    char key[64];
    const gang__gguf_kv *kv = g_find(c, name, key);
    double v = def;

    if (kv != NULL) {
        if (kv->type != GANG__GGUF_F32 && kv->type != GANG__GGUF_F64) {
            gang_set_err(c->err, c->errlen, "%s: metadata %s is not a float", c->path, key);
            return GANG_EMODEL;
        }
        v = kv->num.f;
    }
    if (!(v > 0.0 && v <= hi)) {
        gang_set_err(c->err, c->errlen, "%s: metadata %s = %g is outside (0, %g]", c->path, key, v,
                     hi);
        return GANG_EMODEL;
    }
    *out = (float)v;
    return 0;
}

/* Whether string key equals want (absent: -1). */
static int g_str_is(const gcfg *c, const char *name, const char *want)
{
    char key[64];
    const gang__gguf_kv *kv = g_find(c, name, key);
    gang__gguf_str s;

    if (kv == NULL || kv->type != GANG__GGUF_STRING)
        return -1;
    s = gang__gguf_arr_str(c->g, kv, 0);
    return s.n == strlen(want) && memcmp(s.p, want, s.n) == 0;
}

/* general.architecture and the features we do not implement. */
static int g_arch(gcfg *c, gang_model_config *cfg)
{
    const gang__gguf_kv *kv = gang__gguf_find_kv(c->g, "general.architecture");
    gang__gguf_str s;
    uint32_t v;
    char key[64];

    if (kv == NULL || kv->type != GANG__GGUF_STRING) {
        gang_set_err(c->err, c->errlen, "%s: metadata general.architecture is missing", c->path);
        return GANG_EMODEL;
    }
    s = gang__gguf_arr_str(c->g, kv, 0);
    if (s.n == 5 && memcmp(s.p, "llama", 5) == 0) {
        c->arch = "llama";
        cfg->arch = GANG_ARCH_LLAMA;
    } else if (s.n == 5 && memcmp(s.p, "qwen2", 5) == 0) {
        c->arch = "qwen2"; /* q/k/v biases; llama.cpp leaves its q/k rows unpermuted */
        cfg->arch = GANG_ARCH_QWEN2;
        cfg->attn_bias = 1;
    } else if (s.n == 5 && memcmp(s.p, "qwen3", 5) == 0) {
        c->arch = "qwen3"; /* q/k norms, no biases, rows unpermuted */
        cfg->arch = GANG_ARCH_QWEN3;
        cfg->qk_norm = 1;
    } else if (s.n == 8 && memcmp(s.p, "qwen2moe", 8) == 0) {
        c->arch = "qwen2moe"; /* Qwen2's attention, experts and a shared expert */
        cfg->arch = GANG_ARCH_QWEN2;
        cfg->attn_bias = 1;
        cfg->moe = GANG_MOE_QWEN2;
    } else if (s.n == 8 && memcmp(s.p, "qwen3moe", 8) == 0) {
        c->arch = "qwen3moe"; /* Qwen3's attention, experts */
        cfg->arch = GANG_ARCH_QWEN3;
        cfg->qk_norm = 1;
        cfg->moe = GANG_MOE_QWEN3;
    } else if (s.n == 6 && memcmp(s.p, "gemma3", 6) == 0) {
        c->arch = "gemma3"; /* rows unpermuted; norms hold 1 + w already */
        cfg->arch = GANG_ARCH_GEMMA3;
    } else {
        gang_set_err(c->err, c->errlen,
                     "%s: general.architecture \"%.*s\" is not supported (llama, qwen2, qwen3, "
                     "gemma3, qwen2moe and qwen3moe are)",
                     c->path, (int)(s.n > 64 ? 64 : s.n), s.p);
        return GANG_EMODEL;
    }
    (void)v;
    if (g_find(c, "llama.rope.scaling.type", key) != NULL &&
        g_str_is(c, "llama.rope.scaling.type", "none") != 1) {
        gang_set_err(c->err, c->errlen, "%s: metadata %s: rope scaling is not implemented", c->path,
                     key);
        return GANG_EMODEL;
    }
    return 0;
}

/*
 * Mixture of experts (issue #25): llama with an expert_count (Mixtral: every layer sparse,
 * experts of feed_forward_length, renormalised), qwen2moe (experts of
 * expert_feed_forward_length, a shared expert of expert_shared_feed_forward_length, not
 * renormalised) and qwen3moe (renormalised), as llama.cpp converts them; expert_weights_norm
 * overrides the rule when present. A layer is sparse when its ffn_gate_inp.weight exists.
 */
static int g_moe(const gcfg *c, gang_model_config *cfg)
{
    const gang__gguf_kv *norm;
    char key[64];

    if (g_uint(c, "llama.expert_count", 0, 0, GANG_MOE_MAX_EXPERTS, &cfg->n_experts) != 0)
        return GANG_EMODEL;
    if (cfg->n_experts == 0 && cfg->moe == GANG_MOE_NONE)
        return 0;
    if (cfg->n_experts == 0 ||
        g_uint(c, "llama.expert_used_count", -1, 1, GANG_MOE_MAX_TOPK, &cfg->top_k) != 0 ||
        cfg->top_k > cfg->n_experts) {
        gang_set_err(c->err, c->errlen,
                     "%s: metadata %s.expert_count / expert_used_count: %u experts, %u used "
                     "(1 <= used <= experts, at most %u)",
                     c->path, c->arch, cfg->n_experts, cfg->top_k, GANG_MOE_MAX_TOPK);
        return GANG_EMODEL;
    }
    if (cfg->moe == GANG_MOE_NONE) { /* llama + experts: Mixtral */
        cfg->moe = GANG_MOE_MIXTRAL;
        cfg->moe_ffn = cfg->ffn;
    } else if (g_uint(c, "llama.expert_feed_forward_length", -1, 1, 1u << 20, &cfg->moe_ffn) ||
               g_uint(c, "llama.expert_shared_feed_forward_length", 0, 0, 1u << 20,
                      &cfg->shared_ffn)) {
        return GANG_EMODEL;
    }
    cfg->norm_topk = cfg->moe != GANG_MOE_QWEN2;
    norm = g_find(c, "llama.expert_weights_norm", key);
    if (norm != NULL && norm->type == GANG__GGUF_BOOL)
        cfg->norm_topk = norm->num.u != 0;
    cfg->sparse_step = 1;
    for (uint32_t i = 0; i < cfg->n_layers && i < GANG_MODEL_MAX_LAYERS; i++) {
        snprintf(key, sizeof(key), "blk.%u.ffn_gate_inp.weight", i);
        if (gang__gguf_find(c->g, key) == NULL)
            cfg->mlp_only[i / 64] |= 1ull << (i % 64);
    }
    return 0;
}

/* vocab (tokenizer.ggml.tokens, llama.vocab_size) and the special ids. */
static int g_vocab(const gcfg *c, gang_model_config *cfg)
{
    const gang__gguf_kv *toks = gang__gguf_find_kv(c->g, "tokenizer.ggml.tokens");
    static const char *const eos_keys[] = {"tokenizer.ggml.eos_token_id",
                                           "tokenizer.ggml.eot_token_id"};
    uint32_t v, i, j;

    if (toks != NULL && (toks->type != GANG__GGUF_ARRAY || toks->arr_type != GANG__GGUF_STRING ||
                         toks->n == 0 || toks->n > GANG_MODEL_MAX_VOCAB)) {
        gang_set_err(c->err, c->errlen,
                     "%s: metadata tokenizer.ggml.tokens is not a list of 1 to "
                     "%u strings",
                     c->path, GANG_MODEL_MAX_VOCAB);
        return GANG_EMODEL;
    }
    if (g_uint(c, "llama.vocab_size", toks ? (int64_t)toks->n : -1, 1, GANG_MODEL_MAX_VOCAB,
               &cfg->vocab) != 0)
        return GANG_EMODEL;
    if (toks != NULL && toks->n != cfg->vocab) {
        gang_set_err(c->err, c->errlen, "%s: llama.vocab_size %u differs from the %llu tokens",
                     c->path, cfg->vocab, (unsigned long long)toks->n);
        return GANG_EMODEL;
    }
    cfg->bos_token_id = -1;
    cfg->eos_token_id = -1;
    if (gang__gguf_find_kv(c->g, "tokenizer.ggml.bos_token_id") != NULL) {
        if (g_uint(c, "tokenizer.ggml.bos_token_id", 0, 0, cfg->vocab - 1, &v) != 0)
            return GANG_EMODEL;
        cfg->bos_token_id = (int32_t)v;
    }
    for (i = 0; i < 2; i++) {
        if (gang__gguf_find_kv(c->g, eos_keys[i]) == NULL)
            continue;
        if (g_uint(c, eos_keys[i], 0, 0, cfg->vocab - 1, &v) != 0)
            return GANG_EMODEL;
        for (j = 0; j < cfg->n_eos && cfg->eos_ids[j] != (int32_t)v; j++)
            ;
        if (j == cfg->n_eos)
            cfg->eos_ids[cfg->n_eos++] = (int32_t)v;
    }
    if (cfg->n_eos > 0)
        cfg->eos_token_id = cfg->eos_ids[0];
    return 0;
}

/* The shape fields, bounded as config.json's are. */
static int g_shape(const gcfg *c, gang_model_config *cfg)
{
    uint32_t v;

    if (g_uint(c, "llama.block_count", -1, 1, GANG_MODEL_MAX_LAYERS, &cfg->n_layers) ||
        g_uint(c, "llama.embedding_length", -1, 1, GANG_MODEL_MAX_HIDDEN, &cfg->hidden) ||
        g_uint(c, "llama.feed_forward_length", -1, 1, 1u << 20, &cfg->ffn) ||
        g_uint(c, "llama.attention.head_count", -1, 1, GANG_MODEL_MAX_HEADS, &cfg->n_heads) ||
        g_uint(c, "llama.attention.head_count_kv", cfg->n_heads, 1, GANG_MODEL_MAX_HEADS,
               &cfg->n_kv_heads) ||
        g_uint(c, "llama.context_length", -1, 1, 1u << 24, &cfg->max_pos) ||
        g_float(c, "llama.attention.layer_norm_rms_epsilon", 1e-6, 1.0, &cfg->rms_eps) ||
        g_float(c, "llama.rope.freq_base", 10000.0, 1e12, &cfg->rope_theta))
        return GANG_EMODEL;
    /* head_dim: attention.key_length (Gemma 3, Qwen3, Mistral Nemo), else hidden / heads. */
    if (g_uint(c, "llama.attention.key_length",
               cfg->hidden % cfg->n_heads ? 0 : cfg->hidden / cfg->n_heads, 0,
               GANG_MODEL_MAX_HEAD_DIM, &cfg->head_dim))
        return GANG_EMODEL;
    if (cfg->head_dim == 0 || cfg->head_dim % 2 != 0 || cfg->n_heads % cfg->n_kv_heads != 0) {
        gang_set_err(c->err, c->errlen,
                     "%s: hidden %u, heads %u, kv heads %u, head_dim %u do not fit together",
                     c->path, cfg->hidden, cfg->n_heads, cfg->n_kv_heads, cfg->head_dim);
        return GANG_EMODEL;
    }
    if (g_uint(c, "llama.rope.dimension_count", cfg->head_dim, cfg->head_dim, cfg->head_dim, &v) ||
        g_uint(c, "llama.attention.value_length", cfg->head_dim, cfg->head_dim, cfg->head_dim, &v))
        return GANG_EMODEL;
    return 0;
}

/*
 * Gemma 3 as llama.cpp converts it: "gemma3.attention.sliding_window" on the local layers
 * (every sliding_window_pattern-th layer, 6 when absent, is global), local RoPE base
 * "gemma3.rope.freq_base_swa" (10000 when absent), query_pre_attn_scalar not stored:
 * head_dim, except hidden / heads for the 62-layer 27B (llama.cpp's own rule).
 */
static int g_gemma(const gcfg *c, gang_model_config *cfg)
{
    uint32_t sw = 0;
    float qpas = (float)cfg->head_dim;

    if (g_uint(c, "llama.attention.sliding_window", 0, 0, UINT32_MAX, &sw) != 0 ||
        g_uint(c, "llama.attention.sliding_window_pattern", 6, 1, GANG_MODEL_MAX_LAYERS,
               &cfg->window_pattern) != 0 ||
        g_float(c, "llama.rope.freq_base_swa", 10000.0, 1e12, &cfg->rope_local_theta) != 0)
        return GANG_EMODEL;
    if (sw > 0 && sw < cfg->max_pos)
        cfg->sliding_window = sw;
    if (cfg->n_layers == 62)
        qpas = (float)(cfg->hidden / cfg->n_heads);
    gang__model_gemma_defaults(cfg, qpas);
    return 0;
}

int gang__gguf_config_read(const char *path, gang_model_config *cfg, char *err, size_t errlen)
{
    gang_model_config out;
    gang__gguf g;
    gcfg c;
    int rc;

    rc = gang__gguf_open(path, &g, err, errlen);
    if (rc != 0)
        return rc;
    memset(&out, 0, sizeof(out));
    c.g = &g;
    c.path = path;
    c.err = err;
    c.errlen = errlen;
    c.arch = "llama";
    rc = g_arch(&c, &out);
    if (rc == 0)
        rc = g_shape(&c, &out);
    if (rc == 0)
        rc = g_vocab(&c, &out);
    if (rc == 0 && out.arch == GANG_ARCH_GEMMA3)
        rc = g_gemma(&c, &out);
    if (rc == 0)
        rc = g_moe(&c, &out);
    if (rc == 0) {
        out.tie_embeddings = gang__gguf_find(&g, "output.weight") == NULL;
        out.rope_freq_factors = gang__gguf_find(&g, "rope_freqs.weight") != NULL;
        out.dtype = GANG_DTYPE_F32;
        out.max_ctx_allowed = out.max_pos; /* no RoPE scaling (refused above) */
        *cfg = out;
    }
    gang__gguf_close(&g);
    return rc;
}

int gang__gguf_is_path(const char *path)
{
    size_t n = path != NULL ? strlen(path) : 0;
    return n > 5 && strcmp(path + n - 5, ".gguf") == 0;
}

int gang__gguf_hf_name(int arch, const char *hf, char *out, size_t cap)
{
    /* Gemma's sandwich norms (its post_attention_layernorm is not Llama's pre-MLP norm). */
    static const char *const gemma[][2] = {
        {"post_attention_layernorm.weight", "post_attention_norm.weight"},
        {"pre_feedforward_layernorm.weight", "ffn_norm.weight"},
        {"post_feedforward_layernorm.weight", "post_ffw_norm.weight"}};
    static const char *const map[][2] = {{"self_attn.q_norm.weight", "attn_q_norm.weight"},
                                         {"self_attn.k_norm.weight", "attn_k_norm.weight"},
                                         {"input_layernorm.weight", "attn_norm.weight"},
                                         {"self_attn.q_proj.weight", "attn_q.weight"},
                                         {"self_attn.k_proj.weight", "attn_k.weight"},
                                         {"self_attn.v_proj.weight", "attn_v.weight"},
                                         {"self_attn.o_proj.weight", "attn_output.weight"},
                                         {"self_attn.q_proj.bias", "attn_q.bias"},
                                         {"self_attn.k_proj.bias", "attn_k.bias"},
                                         {"self_attn.v_proj.bias", "attn_v.bias"},
                                         {"post_attention_layernorm.weight", "ffn_norm.weight"},
                                         {"mlp.gate_proj.weight", "ffn_gate.weight"},
                                         {"mlp.up_proj.weight", "ffn_up.weight"},
                                         {"mlp.down_proj.weight", "ffn_down.weight"}};
    unsigned layer;
    int used = 0;
    size_t i;

    if (strcmp(hf, "model.embed_tokens.weight") == 0)
        return snprintf(out, cap, "token_embd.weight") < (int)cap ? 0 : GANG_ENOENT;
    if (strcmp(hf, "model.norm.weight") == 0)
        return snprintf(out, cap, "output_norm.weight") < (int)cap ? 0 : GANG_ENOENT;
    if (strcmp(hf, "lm_head.weight") == 0)
        return snprintf(out, cap, "output.weight") < (int)cap ? 0 : GANG_ENOENT;
    if (strcmp(hf, "rope_freqs.weight") == 0) /* llama.cpp's own: no Hugging Face twin */
        return snprintf(out, cap, "rope_freqs.weight") < (int)cap ? 0 : GANG_ENOENT;
    if (sscanf(hf, "model.layers.%u.%n", &layer, &used) != 1 || used == 0)
        return GANG_ENOENT;
    for (i = 0; arch == GANG_ARCH_GEMMA3 && i < sizeof(gemma) / sizeof(gemma[0]); i++)
        if (strcmp(hf + used, gemma[i][0]) == 0)
            return snprintf(out, cap, "blk.%u.%s", layer, gemma[i][1]) < (int)cap ? 0 : GANG_ENOENT;
    for (i = 0; i < sizeof(map) / sizeof(map[0]); i++)
        if (strcmp(hf + used, map[i][0]) == 0)
            return snprintf(out, cap, "blk.%u.%s", layer, map[i][1]) < (int)cap ? 0 : GANG_ENOENT;
    return gang__gguf_moe_name(hf, out, cap, NULL);
}

int gang_model_is_gguf(const char *path)
{
    return gang__gguf_is_path(path);
}
