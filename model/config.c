/*
 * config.json of a Hugging Face Llama-family checkpoint: which architecture, and the
 * shape and numerics fields the loader and the engine need. Everything a model file
 * declares is bounded here (model.h), and every feature we do not implement (other RoPE
 * scaling types, sliding-window attention, another activation, MLP biases) is refused with a
 * message that names it, rather than computed wrongly.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>

#include "ganglion/model.h"
#include "gguf.h"
#include "model-internal.h"
#include "safetensors.h"

/* Bounds on fields model.h does not bound itself. */
#define CFG_MAX_FFN (1u << 20)
#define CFG_MAX_POS (1u << 24)

/* What a config reader pass shares: the parsed object and where messages go. */
typedef struct cfg_ctx {
    const cJSON *root;
    const char *path;
    char *err;
    size_t errlen;
} cfg_ctx;

/* The member `key`, or NULL when it is absent or JSON null (HF writes null for "unset"). */
static const cJSON *cfg_get(const cfg_ctx *c, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(c->root, key);

    return cJSON_IsNull(v) ? NULL : v;
}

/*
 * Reads integer field key into *out, within [lo, hi]. An absent field takes def when
 * def >= 0 and is an error otherwise. Returns 0 or GANG_EMODEL with a message.
 */
static int cfg_uint(const cfg_ctx *c, const char *key, int64_t def, uint32_t lo, uint32_t hi,
                    uint32_t *out)
{
    const cJSON *v = cfg_get(c, key);
    double d;

    if (v == NULL) {
        if (def < 0) {
            gang_set_err(c->err, c->errlen, "%s: field \"%s\" is missing", c->path, key);
            return GANG_EMODEL;
        }
        *out = (uint32_t)def;
        return 0;
    }
    d = cJSON_IsNumber(v) ? v->valuedouble : NAN;
    if (!(d == floor(d))) {
        gang_set_err(c->err, c->errlen, "%s: field \"%s\" is not an integer", c->path, key);
        return GANG_EMODEL;
    }
    if (d < (double)lo || d > (double)hi) {
        gang_set_err(c->err, c->errlen, "%s: field \"%s\" = %.0f is outside [%u, %u]", c->path, key,
                     d, lo, hi);
        return GANG_EMODEL;
    }
    *out = (uint32_t)d;
    return 0;
}

/* Reads a positive finite number field no larger than hi; when absent, def, or an error
 * when def < 0 (a required field). */
static int cfg_float(const cfg_ctx *c, const char *key, double def, double hi, float *out)
{
    const cJSON *v = cfg_get(c, key);
    double d;

    if (v == NULL) {
        if (def < 0) {
            gang_set_err(c->err, c->errlen, "%s: field \"%s\" is missing", c->path, key);
            return GANG_EMODEL;
        }
        *out = (float)def;
        return 0;
    }
    d = cJSON_IsNumber(v) ? v->valuedouble : NAN;
    if (!(d > 0.0) || !(d <= hi)) {
        gang_set_err(c->err, c->errlen, "%s: field \"%s\" is not a number in (0, %g]", c->path, key,
                     hi);
        return GANG_EMODEL;
    }
    *out = (float)d;
    return 0;
}

/* Reads a boolean field (def when absent). */
static int cfg_bool(const cfg_ctx *c, const char *key, int def, int32_t *out)
{
    const cJSON *v = cfg_get(c, key);

    if (v == NULL) {
        *out = def;
        return 0;
    }
    if (!cJSON_IsBool(v)) {
        gang_set_err(c->err, c->errlen, "%s: field \"%s\" is not a boolean", c->path, key);
        return GANG_EMODEL;
    }
    *out = cJSON_IsTrue(v) ? 1 : 0;
    return 0;
}

/*
 * A token id field (bos_token_id): absent or null -> -1; an integer in [0, vocab); or a
 * non-empty list of them, of which the first is kept.
 */
static int cfg_token(const cfg_ctx *c, const char *key, uint32_t vocab, int32_t *out)
{
    const cJSON *v = cfg_get(c, key);
    double d;

    *out = -1;
    if (v == NULL)
        return 0;
    if (cJSON_IsArray(v))
        v = cJSON_GetArrayItem(v, 0);
    d = cJSON_IsNumber(v) ? v->valuedouble : NAN;
    if (!(d == floor(d)) || d < 0 || d >= (double)vocab) {
        gang_set_err(c->err, c->errlen,
                     "%s: field \"%s\" is not a token id (or a list of them) in [0, %u)", c->path,
                     key, vocab);
        return GANG_EMODEL;
    }
    *out = (int32_t)d;
    return 0;
}

/*
 * Appends the ids of the end-of-sequence field `key` (an integer or a non-empty list of
 * them; absent or null adds nothing) to cfg->eos_ids, skipping ids already there, so
 * config.json's come first and generation_config.json's follow. A non-integer, an id
 * outside [0, vocab), an empty list or more than GANG_MAX_EOS distinct ids in all is
 * GANG_EMODEL naming the file and the field.
 */
static int cfg_eos(const cfg_ctx *c, const char *key, gang_model_config *cfg)
{
    const cJSON *v = cfg_get(c, key), *item;
    uint32_t j;
    int32_t id;
    double d;

    if (v == NULL)
        return 0;
    if (cJSON_IsArray(v) && cJSON_GetArraySize(v) == 0) {
        gang_set_err(c->err, c->errlen, "%s: field \"%s\" is an empty list", c->path, key);
        return GANG_EMODEL;
    }
    for (item = cJSON_IsArray(v) ? v->child : v; item != NULL;
         item = cJSON_IsArray(v) ? item->next : NULL) {
        d = cJSON_IsNumber(item) ? item->valuedouble : NAN;
        if (!(d == floor(d)) || d < 0 || d >= (double)cfg->vocab) {
            gang_set_err(c->err, c->errlen,
                         "%s: field \"%s\" is not a token id (or a list of them) in [0, %u)",
                         c->path, key, cfg->vocab);
            return GANG_EMODEL;
        }
        id = (int32_t)d;
        for (j = 0; j < cfg->n_eos && cfg->eos_ids[j] != id; j++)
            ;
        if (j < cfg->n_eos)
            continue;
        if (cfg->n_eos == GANG_MAX_EOS) {
            gang_set_err(c->err, c->errlen,
                         "%s: field \"%s\" brings the end-of-sequence ids to more than %d", c->path,
                         key, GANG_MAX_EOS);
            return GANG_EMODEL;
        }
        cfg->eos_ids[cfg->n_eos++] = id;
    }
    cfg->eos_token_id = cfg->eos_ids[0];
    return 0;
}

/* The architecture from "architectures" (first known entry wins) or "model_type". */
static int cfg_arch(const cfg_ctx *c, gang_model_arch *arch)
{
    static const struct {
        const char *cls, *type;
        gang_model_arch arch;
    } known[] = {
        {"LlamaForCausalLM", "llama", GANG_ARCH_LLAMA},
        {"MistralForCausalLM", "mistral", GANG_ARCH_MISTRAL},
        {"Qwen2ForCausalLM", "qwen2", GANG_ARCH_QWEN2},
        {"Qwen3ForCausalLM", "qwen3", GANG_ARCH_QWEN3},
        {"Gemma3ForCausalLM", "gemma3_text", GANG_ARCH_GEMMA3},
        /* Mixture of experts: the attention of their dense family (config-moe.c). */
        {"MixtralForCausalLM", "mixtral", GANG_ARCH_MISTRAL},
        {"Qwen2MoeForCausalLM", "qwen2_moe", GANG_ARCH_QWEN2},
        {"Qwen3MoeForCausalLM", "qwen3_moe", GANG_ARCH_QWEN3},
    };
    const cJSON *archs = cfg_get(c, "architectures"), *type = cfg_get(c, "model_type"), *a;
    size_t i;

    if (cJSON_IsArray(archs)) {
        cJSON_ArrayForEach(a, archs)
        {
            for (i = 0; cJSON_IsString(a) && i < sizeof(known) / sizeof(known[0]); i++) {
                if (strcmp(a->valuestring, known[i].cls) == 0) {
                    *arch = known[i].arch;
                    return 0;
                }
            }
        }
        a = cJSON_GetArrayItem(archs, 0);
        gang_set_err(c->err, c->errlen,
                     "%s: unsupported architecture \"%.64s\" (LlamaForCausalLM, "
                     "MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, "
                     "Gemma3ForCausalLM, MixtralForCausalLM, Qwen2MoeForCausalLM and "
                     "Qwen3MoeForCausalLM are)",
                     c->path, cJSON_IsString(a) ? a->valuestring : "?");
        return GANG_EMODEL;
    }
    if (cJSON_IsString(type)) {
        for (i = 0; i < sizeof(known) / sizeof(known[0]); i++) {
            if (strcmp(type->valuestring, known[i].type) == 0) {
                *arch = known[i].arch;
                return 0;
            }
        }
        gang_set_err(c->err, c->errlen,
                     "%s: unsupported model_type \"%.64s\" (llama, mistral, qwen2, qwen3, "
                     "gemma3_text, mixtral, qwen2_moe and qwen3_moe are)",
                     c->path, type->valuestring);
        return GANG_EMODEL;
    }
    gang_set_err(c->err, c->errlen,
                 "%s: neither \"architectures\" nor \"model_type\" names the architecture",
                 c->path);
    return GANG_EMODEL;
}

/* torch_dtype (or "dtype" in newer files): float32 when absent. */
static int cfg_dtype(const cfg_ctx *c, gang_dtype *dt)
{
    const cJSON *v = cfg_get(c, "torch_dtype");

    if (v == NULL)
        v = cfg_get(c, "dtype");
    *dt = GANG_DTYPE_F32;
    if (v == NULL)
        return 0;
    if (cJSON_IsString(v) && strcmp(v->valuestring, "float32") == 0)
        return 0;
    if (cJSON_IsString(v) && strcmp(v->valuestring, "float16") == 0) {
        *dt = GANG_DTYPE_F16;
        return 0;
    }
    if (cJSON_IsString(v) && strcmp(v->valuestring, "bfloat16") == 0) {
        *dt = GANG_DTYPE_BF16;
        return 0;
    }
    gang_set_err(c->err, c->errlen,
                 "%s: field \"torch_dtype\" is not \"float32\", \"float16\" or \"bfloat16\"",
                 c->path);
    return GANG_EMODEL;
}

/*
 * Gemma 3's local / global layers: "layer_types" ("sliding_attention" or
 * "full_attention" per layer) when present, which must follow a period p (every p-th
 * layer global, the others local), else "sliding_window_pattern" (or the newer
 * "_sliding_window_pattern"), 6 when absent. Sets cfg->window_pattern.
 */
static int cfg_gemma_pattern(const cfg_ctx *c, gang_model_config *cfg)
{
    const cJSON *types = cfg_get(c, "layer_types"), *t;
    uint32_t p = 0, i = 0;
    int rc;

    if (types == NULL) {
        const char *key = cfg_get(c, "sliding_window_pattern") != NULL ? "sliding_window_pattern"
                                                                       : "_sliding_window_pattern";
        rc = cfg_uint(c, key, 6, 1, GANG_MODEL_MAX_LAYERS, &cfg->window_pattern);
        return rc;
    }
    if (!cJSON_IsArray(types) || (uint32_t)cJSON_GetArraySize(types) != cfg->n_layers) {
        gang_set_err(c->err, c->errlen, "%s: \"layer_types\" is not a list of %u layer types",
                     c->path, cfg->n_layers);
        return GANG_EMODEL;
    }
    cJSON_ArrayForEach(t, types)
    {
        int full = cJSON_IsString(t) && strcmp(t->valuestring, "full_attention") == 0;
        if (!full && !(cJSON_IsString(t) && strcmp(t->valuestring, "sliding_attention") == 0)) {
            gang_set_err(c->err, c->errlen,
                         "%s: layer_types[%u] is not \"sliding_attention\" or \"full_attention\"",
                         c->path, i);
            return GANG_EMODEL;
        }
        if (full && p == 0)
            p = i + 1;
        i++;
    }
    cfg->window_pattern = p == 0 ? cfg->n_layers + 1 : p; /* no global layer: all local */
    for (i = 0; i < cfg->n_layers; i++) {
        t = cJSON_GetArrayItem(types, (int)i);
        if ((strcmp(t->valuestring, "full_attention") == 0) !=
            ((i + 1) % cfg->window_pattern == 0)) {
            gang_set_err(c->err, c->errlen,
                         "%s: \"layer_types\" does not repeat one local/global pattern (layer %u); "
                         "only a periodic one is implemented",
                         c->path, i);
            return GANG_EMODEL;
        }
    }
    return 0;
}

/*
 * The sliding window (transformers' current semantics): Mistral's "sliding_window" applies
 * to every layer; Qwen2's and Qwen3's only when "use_sliding_window" is true, to the layers
 * from "max_window_layers" on. A window as long as the context never binds and is dropped
 * (it costs nothing). Sets cfg->sliding_window (0: none) and cfg->window_first_layer.
 */
static int cfg_window(const cfg_ctx *c, gang_model_config *cfg)
{
    int32_t use_sw = 1;
    uint32_t sw = 0, first = 0;
    int rc;

    cfg->sliding_window = 0;
    cfg->window_first_layer = 0;
    /* Qwen2/3 carry a window they do not use unless use_sliding_window is true. */
    if (cfg->arch == GANG_ARCH_QWEN2 || cfg->arch == GANG_ARCH_QWEN3) {
        rc = cfg_bool(c, "use_sliding_window", 0, &use_sw);
        if (rc != 0)
            return rc;
        if (use_sw && cfg_get(c, "max_window_layers") != NULL) {
            rc = cfg_uint(c, "max_window_layers", -1, 0, GANG_MODEL_MAX_LAYERS, &first);
            if (rc != 0)
                return rc;
        }
    }
    if (cfg->arch == GANG_ARCH_GEMMA3) {
        rc = cfg_gemma_pattern(c, cfg);
        if (rc != 0)
            return rc;
    }
    /* Gemma 3's config class defaults the window to 4096. */
    if (!use_sw || (cfg_get(c, "sliding_window") == NULL && cfg->arch != GANG_ARCH_GEMMA3))
        return 0;
    rc = cfg_uint(c, "sliding_window", cfg->arch == GANG_ARCH_GEMMA3 ? 4096 : -1, 1, UINT32_MAX,
                  &sw);
    if (rc != 0)
        return rc;
    if (sw < cfg->max_ctx_allowed && sw < cfg->max_pos && first < cfg->n_layers) {
        cfg->sliding_window = sw;
        cfg->window_first_layer = first;
    }
    return 0;
}

uint32_t gang_model_layer_window(const gang_model_config *cfg, uint32_t layer)
{
    if (cfg == NULL || cfg->sliding_window == 0)
        return 0;
    if (cfg->window_pattern > 0)
        return (layer + 1) % cfg->window_pattern != 0 ? cfg->sliding_window : 0;
    return layer >= cfg->window_first_layer ? cfg->sliding_window : 0;
}

void gang__model_gemma_defaults(gang_model_config *cfg, float qpas)
{
    cfg->qk_norm = 1;
    cfg->post_norms = 1;
    cfg->norm_plus_one = 1;
    cfg->act = GANG_ACT_GELU_TANH;
    cfg->embed_scale = (float)sqrt((double)cfg->hidden); /* transformers: a f32 buffer */
    /* Attention divides by sqrt(head_dim); Gemma by sqrt(query_pre_attn_scalar). */
    cfg->q_scale = qpas == (float)cfg->head_dim ? 0.0f : (float)sqrt((double)cfg->head_dim / qpas);
}

/*
 * Gemma 3's own fields: no logit soft-capping (Gemma 2 has it; Gemma 3 sets both null), no
 * bidirectional attention, query_pre_attn_scalar (256 when absent) into q_scale,
 * rope_local_base_freq (10000), and the constant features (q/k norm, sandwich norms,
 * (1 + w) norm weights, sqrt(hidden) embedding scale).
 */
static int cfg_gemma(const cfg_ctx *c, gang_model_config *cfg)
{
    static const char *const refused[] = {"final_logit_softcapping", "attn_logit_softcapping"};
    float qpas;
    int32_t bidir = 0;
    size_t i;
    int rc;

    for (i = 0; i < sizeof(refused) / sizeof(refused[0]); i++) {
        if (cfg_get(c, refused[i]) != NULL) {
            gang_set_err(c->err, c->errlen,
                         "%s: \"%s\" is set; logit soft-capping is not implemented", c->path,
                         refused[i]);
            return GANG_EMODEL;
        }
    }
    rc = cfg_bool(c, "use_bidirectional_attention", 0, &bidir);
    if (rc == 0 && bidir) {
        gang_set_err(c->err, c->errlen,
                     "%s: \"use_bidirectional_attention\" is true; only causal attention is "
                     "implemented",
                     c->path);
        rc = GANG_EMODEL;
    }
    if (rc == 0)
        rc = cfg_float(c, "query_pre_attn_scalar", 256.0, 1e9, &qpas);
    if (rc == 0 && !(qpas > 0.0f)) {
        gang_set_err(c->err, c->errlen, "%s: \"query_pre_attn_scalar\" is not positive", c->path);
        rc = GANG_EMODEL;
    }
    if (rc == 0)
        rc = cfg_float(c, "rope_local_base_freq", 10000.0, 1e12, &cfg->rope_local_theta);
    if (rc == 0 && !(cfg->rope_local_theta > 0.0f)) {
        gang_set_err(c->err, c->errlen, "%s: \"rope_local_base_freq\" is not positive", c->path);
        rc = GANG_EMODEL;
    }
    if (rc != 0)
        return rc;
    gang__model_gemma_defaults(cfg, qpas);
    return 0;
}

/*
 * The features we do not implement. A different activation changes every output, as do
 * MLP biases and partial RoPE.
 */
static int cfg_unsupported(const cfg_ctx *c, gang_model_config *cfg)
{
    const char *want, *key;
    const cJSON *v;
    int32_t mlp_bias = 0;
    int rc;

    /* transformers rotates only the first partial_rotary_factor x head_dim of a head. */
    v = cfg_get(c, "partial_rotary_factor");
    if (v != NULL && !(cJSON_IsNumber(v) && v->valuedouble == 1.0)) {
        gang_set_err(c->err, c->errlen,
                     "%s: \"partial_rotary_factor\" is not 1; partial RoPE is not implemented",
                     c->path);
        return GANG_EMODEL;
    }
    rc = cfg->arch == GANG_ARCH_GEMMA3 ? cfg_gemma(c, cfg) : 0;
    if (rc != 0)
        return rc;
    key = cfg->arch == GANG_ARCH_GEMMA3 && cfg_get(c, "hidden_activation") != NULL
              ? "hidden_activation"
              : "hidden_act";
    v = cfg_get(c, key);
    want = cfg->arch == GANG_ARCH_GEMMA3 ? "gelu_pytorch_tanh" : "silu";
    if (v != NULL && !(cJSON_IsString(v) && strcmp(v->valuestring, want) == 0)) {
        gang_set_err(c->err, c->errlen, "%s: \"%s\" is not \"%s\"; only %s MLPs are implemented",
                     c->path, key, want, cfg->arch == GANG_ARCH_GEMMA3 ? "GeGLU" : "SwiGLU");
        return GANG_EMODEL;
    }
    cfg->act = cfg->arch == GANG_ARCH_GEMMA3 ? GANG_ACT_GELU_TANH : GANG_ACT_SILU;
    rc = cfg_bool(c, "mlp_bias", 0, &mlp_bias);
    if (rc != 0)
        return rc;
    if (mlp_bias) {
        gang_set_err(c->err, c->errlen,
                     "%s: \"mlp_bias\" is true; MLP biases are not "
                     "implemented",
                     c->path);
        return GANG_EMODEL;
    }
    return cfg_window(c, cfg);
}

/* Bounds of the rope_scaling fields. */
#define CFG_MAX_ROPE_FACTOR 1024.0
#define CFG_MAX_ROPE_BETA 1024.0
#define CFG_MAX_ATTN_FACTOR 16.0

/* The rope_scaling type names (rope_type, or the legacy "type"), in gang_rope_type order. */
static const char *const cfg_rope_names[] = {"default", "linear", "dynamic", "llama3", "yarn"};

/*
 * The "type" of the rope_scaling object c (rope_type first, then the legacy "type"); an
 * unknown one (longrope, su, mrope, ...) is refused naming it.
 */
static int cfg_rope_type(const cfg_ctx *c, gang_rope_type *type)
{
    const cJSON *v = cfg_get(c, "rope_type");
    size_t i;

    if (v == NULL)
        v = cfg_get(c, "type");
    if (v == NULL) {
        *type = GANG_ROPE_DEFAULT;
        return 0;
    }
    for (i = 0; cJSON_IsString(v) && i < sizeof(cfg_rope_names) / sizeof(cfg_rope_names[0]); i++) {
        if (strcmp(v->valuestring, cfg_rope_names[i]) == 0) {
            *type = (gang_rope_type)i;
            return 0;
        }
    }
    gang_set_err(c->err, c->errlen,
                 "%s: rope_type \"%.64s\" is not implemented (default, linear, dynamic, llama3 and "
                 "yarn are)",
                 c->path, cJSON_IsString(v) ? v->valuestring : "?");
    return GANG_EMODEL;
}

/* The fields of a llama3 or yarn block (the caller has read factor). */
static int cfg_rope_fields(const cfg_ctx *c, const gang_model_config *cfg, gang_rope_scaling *r)
{
    int rc = 0;

    r->orig_max_pos = cfg->max_pos;
    if (r->type == GANG_ROPE_LLAMA3) {
        rc = cfg_float(c, "low_freq_factor", -1.0, CFG_MAX_ROPE_FACTOR, &r->low_freq_factor);
        if (rc == 0)
            rc = cfg_float(c, "high_freq_factor", -1.0, CFG_MAX_ROPE_FACTOR, &r->high_freq_factor);
        if (rc == 0)
            rc = cfg_uint(c, "original_max_position_embeddings", -1, 1, CFG_MAX_POS,
                          &r->orig_max_pos);
        if (rc == 0 && !(r->high_freq_factor > r->low_freq_factor)) {
            gang_set_err(c->err, c->errlen,
                         "%s: high_freq_factor must be larger than low_freq_factor", c->path);
            rc = GANG_EMODEL;
        }
        return rc;
    }
    if (r->type == GANG_ROPE_YARN) {
        r->attn_factor = (float)(0.1 * log((double)r->factor) + 1.0);
        rc = cfg_float(c, "attention_factor", r->attn_factor, CFG_MAX_ATTN_FACTOR, &r->attn_factor);
        if (rc == 0)
            rc = cfg_float(c, "beta_fast", 32.0, CFG_MAX_ROPE_BETA, &r->beta_fast);
        if (rc == 0)
            rc = cfg_float(c, "beta_slow", 1.0, CFG_MAX_ROPE_BETA, &r->beta_slow);
        if (rc == 0)
            rc = cfg_uint(c, "original_max_position_embeddings", cfg->max_pos, 1, CFG_MAX_POS,
                          &r->orig_max_pos);
    }
    return rc;
}

/*
 * config.json's "rope_scaling" into cfg->rope and the context it allows into
 * cfg->max_ctx_allowed. Absent, null, {"rope_type": "default"} and linear factor 1.0
 * change nothing and are accepted; every field of the known types is bounded; unknown
 * types are refused naming them. The context: max_position_embeddings, or for linear,
 * dynamic and YaRN factor x the original context when that is larger.
 */
static int cfg_rope_scaling(const cfg_ctx *c, gang_model_config *cfg)
{
    const cJSON *v = cfg_get(c, "rope_scaling");
    gang_rope_scaling *r = &cfg->rope;
    char path[4200];
    cfg_ctx sub = *c;
    double ctx;
    int rc;

    memset(r, 0, sizeof(*r));
    cfg->max_ctx_allowed = cfg->max_pos;
    if (v == NULL)
        return 0;
    snprintf(path, sizeof(path), "%s: rope_scaling", c->path);
    sub.root = v;
    sub.path = path;
    if (!cJSON_IsObject(v)) {
        gang_set_err(c->err, c->errlen, "%s is not an object", path);
        return GANG_EMODEL;
    }
    rc = cfg_rope_type(&sub, &r->type);
    if (rc != 0 || r->type == GANG_ROPE_DEFAULT)
        return rc;
    rc = cfg_float(&sub, "factor", -1.0, CFG_MAX_ROPE_FACTOR, &r->factor);
    if (rc == 0 && !(r->factor >= 1.0f)) {
        gang_set_err(c->err, c->errlen, "%s: field \"factor\" is below 1", path);
        rc = GANG_EMODEL;
    }
    if (rc == 0 && r->type == GANG_ROPE_DYNAMIC && r->factor > 1.0f && cfg->head_dim <= 2) {
        gang_set_err(c->err, c->errlen, "%s: dynamic NTK needs a head_dim above 2", path);
        rc = GANG_EMODEL;
    }
    if (rc == 0)
        rc = cfg_rope_fields(&sub, cfg, r);
    if (rc != 0)
        return rc;
    if (r->factor == 1.0f && (r->type == GANG_ROPE_LINEAR || r->type == GANG_ROPE_DYNAMIC)) {
        memset(r, 0, sizeof(*r)); /* a no-op block */
        return 0;
    }
    ctx = (double)r->factor * (double)(r->type == GANG_ROPE_YARN ? r->orig_max_pos : cfg->max_pos);
    if (r->type != GANG_ROPE_LLAMA3 && ctx > (double)cfg->max_pos)
        cfg->max_ctx_allowed = ctx > (double)CFG_MAX_POS ? CFG_MAX_POS : (uint32_t)ctx;
    return 0;
}

/*
 * head_dim (absent: hidden / n_heads, which must then divide), then the checks that need
 * it: even (RoPE pairs), at most GANG_MODEL_MAX_HEAD_DIM, and an attention width
 * n_heads x head_dim within GANG_MODEL_MAX_HIDDEN x 4.
 */
static int cfg_head_dim(const cfg_ctx *c, gang_model_config *cfg)
{
    int rc;

    if (cfg_get(c, "head_dim") == NULL && cfg->hidden % cfg->n_heads != 0) {
        gang_set_err(c->err, c->errlen,
                     "%s: hidden_size %u is not divisible by num_attention_heads %u", c->path,
                     cfg->hidden, cfg->n_heads);
        return GANG_EMODEL;
    }
    rc = cfg_uint(c, "head_dim", cfg->hidden / cfg->n_heads, 2, GANG_MODEL_MAX_HEAD_DIM,
                  &cfg->head_dim);
    if (rc != 0)
        return rc;
    if (cfg->head_dim % 2 != 0 ||
        (uint64_t)cfg->n_heads * cfg->head_dim > 4ull * GANG_MODEL_MAX_HIDDEN) {
        gang_set_err(c->err, c->errlen,
                     "%s: head_dim %u is odd or num_attention_heads x head_dim exceeds %u", c->path,
                     cfg->head_dim, 4u * GANG_MODEL_MAX_HIDDEN);
        return GANG_EMODEL;
    }
    return 0;
}

/* Reads every field of the parsed config into *cfg. */
static int cfg_fill(const cfg_ctx *c, gang_model_config *cfg)
{
    int rc;

    rc = cfg_arch(c, &cfg->arch);
    if (rc == 0)
        rc = cfg_uint(c, "hidden_size", -1, 1, GANG_MODEL_MAX_HIDDEN, &cfg->hidden);
    if (rc == 0)
        rc = cfg_uint(c, "intermediate_size", -1, 1, CFG_MAX_FFN, &cfg->ffn);
    if (rc == 0)
        rc = cfg_uint(c, "num_attention_heads", -1, 1, GANG_MODEL_MAX_HEADS, &cfg->n_heads);
    if (rc == 0)
        rc = cfg_uint(c, "num_key_value_heads", cfg->n_heads, 1, GANG_MODEL_MAX_HEADS,
                      &cfg->n_kv_heads);
    if (rc == 0)
        rc = cfg_uint(c, "num_hidden_layers", -1, 1, GANG_MODEL_MAX_LAYERS, &cfg->n_layers);
    if (rc == 0)
        rc = cfg_uint(c, "vocab_size", -1, 1, GANG_MODEL_MAX_VOCAB, &cfg->vocab);
    if (rc == 0)
        rc = cfg_uint(c, "max_position_embeddings", -1, 1, CFG_MAX_POS, &cfg->max_pos);
    if (rc == 0)
        rc = cfg_float(c, "rms_norm_eps", 1e-6, 1.0, &cfg->rms_eps);
    if (rc == 0)
        rc = cfg_float(c, "rope_theta", 10000.0, 1e12, &cfg->rope_theta);
    if (rc == 0)
        rc =
            cfg_bool(c, "tie_word_embeddings", cfg->arch == GANG_ARCH_GEMMA3, &cfg->tie_embeddings);
    if (rc == 0)
        rc = cfg_bool(c, "attention_bias", 0, &cfg->attn_bias);
    if (rc == 0)
        rc = cfg_token(c, "bos_token_id", cfg->vocab, &cfg->bos_token_id);
    cfg->eos_token_id = -1;
    if (rc == 0)
        rc = cfg_eos(c, "eos_token_id", cfg);
    if (rc == 0)
        rc = cfg_dtype(c, &cfg->dtype);
    if (rc != 0)
        return rc;
    /*
     * Qwen2 always has q/k/v biases (its config does not say so). Llama's attention_bias
     * also puts a bias on o_proj, which the TP layers do not carry, so it is refused
     * rather than half applied.
     */
    if (cfg->arch == GANG_ARCH_QWEN2) {
        cfg->attn_bias = 1;
    } else if (cfg->attn_bias) {
        gang_set_err(c->err, c->errlen,
                     "%s: \"attention_bias\" is true; the o_proj bias it implies is not "
                     "implemented",
                     c->path);
        return GANG_EMODEL;
    }
    cfg->qk_norm = cfg->arch == GANG_ARCH_QWEN3; /* Gemma 3: cfg_gemma sets it */
    rc = cfg_head_dim(c, cfg);
    if (rc == 0)
        rc = cfg_rope_scaling(c, cfg);
    if (rc != 0)
        return rc;
    if (cfg->n_kv_heads > cfg->n_heads || cfg->n_heads % cfg->n_kv_heads != 0) {
        gang_set_err(c->err, c->errlen,
                     "%s: num_attention_heads %u is not divisible by num_key_value_heads %u",
                     c->path, cfg->n_heads, cfg->n_kv_heads);
        return GANG_EMODEL;
    }
    rc = gang__config_moe(c->root, c->path, cfg, c->err, c->errlen);
    return rc != 0 ? rc : cfg_unsupported(c, cfg);
}

/*
 * An optional number field of generation_config.json: *has stays 0 when it is absent or
 * null; otherwise it must be a finite number in [lo, hi] (lo excluded when open_lo).
 */
static int gen_number(const cfg_ctx *c, const char *key, double lo, int open_lo, double hi,
                      uint32_t *has, float *out)
{
    const cJSON *v = cfg_get(c, key);
    double d;

    if (v == NULL)
        return 0;
    d = cJSON_IsNumber(v) ? v->valuedouble : NAN;
    if (!(open_lo ? d > lo : d >= lo) || !(d <= hi)) {
        gang_set_err(c->err, c->errlen, "%s: field \"%s\" is not a number in %s%g, %g]", c->path,
                     key, open_lo ? "(" : "[", lo, hi);
        return GANG_EMODEL;
    }
    *has = 1;
    *out = (float)d;
    return 0;
}

/*
 * The sampling defaults of a parsed generation_config.json into *g (which starts zeroed):
 * temperature, top_p, top_k, repetition_penalty, and do_sample false = greedy.
 */
static int gen_fill(const cfg_ctx *c, gang_gen_defaults *g)
{
    int32_t do_sample = 1;
    int rc;

    rc = gen_number(c, "temperature", 0.0, 0, 1e6, &g->has_temperature, &g->temperature);
    if (rc == 0)
        rc = gen_number(c, "top_p", 0.0, 1, 1.0, &g->has_top_p, &g->top_p);
    if (rc == 0)
        rc = gen_number(c, "repetition_penalty", 0.0, 1, 1e6, &g->has_repetition_penalty,
                        &g->repetition_penalty);
    if (rc == 0 && cfg_get(c, "top_k") != NULL) {
        rc = cfg_uint(c, "top_k", -1, 0, INT32_MAX, &g->top_k);
        g->has_top_k = rc == 0;
    }
    if (rc == 0)
        rc = cfg_bool(c, "do_sample", 1, &do_sample);
    if (rc != 0)
        return rc;
    /* transformers samples only with do_sample true: false means greedy. */
    if (!do_sample) {
        g->has_temperature = 1;
        g->temperature = 0.0f;
    }
    return 0;
}

/*
 * Reads PATH (at most max bytes) and parses it as a JSON object into *root (the caller
 * deletes it). 0, or the reader's error / GANG_EMODEL ("not a JSON object") with err.
 */
static int json_object_read(const char *path, size_t max, cJSON **root, char *err, size_t errlen)
{
    char *text = NULL;
    size_t len = 0;
    int rc = gang__read_small_file(path, max, &text, &len, err, errlen);
    *root = NULL;
    if (rc != 0)
        return rc;
    *root = cJSON_ParseWithLength(text, len);
    free(text);
    if (*root == NULL || !cJSON_IsObject(*root)) {
        cJSON_Delete(*root);
        *root = NULL;
        gang_set_err(err, errlen, "%s: not a JSON object", path);
        return GANG_EMODEL;
    }
    return 0;
}

/*
 * DIR/generation_config.json, when it exists: its eos_token_id ids join cfg->eos_ids
 * (after config.json's) and its sampling defaults fill cfg->gen. An absent file changes
 * nothing; any other problem is GANG_EMODEL naming the file (and field).
 */
static int gen_config_read(const char *dir, gang_model_config *cfg, char *err, size_t errlen)
{
    char path[4096];
    struct stat st;
    cfg_ctx c;
    cJSON *root = NULL;
    int rc;

    if (snprintf(path, sizeof(path), "%s/generation_config.json", dir) >= (int)sizeof(path)) {
        gang_set_err(err, errlen, "%s: model directory path too long", dir);
        return GANG_EMODEL;
    }
    if (stat(path, &st) != 0 && errno == ENOENT)
        return 0;
    rc = json_object_read(path, GANG_MODEL_MAX_GEN_CONFIG_BYTES, &root, err, errlen);
    if (rc != 0)
        return rc;
    c.root = root;
    c.path = path;
    c.err = err;
    c.errlen = errlen;
    rc = cfg_eos(&c, "eos_token_id", cfg);
    if (rc == 0)
        rc = gen_fill(&c, &cfg->gen);
    cJSON_Delete(root);
    return rc;
}

int gang_model_config_read(const char *dir, gang_model_config *cfg, char *err, size_t errlen)
{
    char path[4096];
    gang_model_config out;
    cfg_ctx c;
    cJSON *root = NULL;
    int rc;

    if (err != NULL && errlen > 0)
        err[0] = '\0';
    if (dir == NULL || cfg == NULL)
        return GANG_EINVAL;
    if (gang__gguf_is_path(dir)) /* a GGUF file: its metadata (model/gguf-config.c) */
        return gang__gguf_config_read(dir, cfg, err, errlen);
    if (snprintf(path, sizeof(path), "%s/config.json", dir) >= (int)sizeof(path)) {
        gang_set_err(err, errlen, "%s: model directory path too long", dir);
        return GANG_EMODEL;
    }
    rc = json_object_read(path, GANG_MODEL_MAX_CONFIG_BYTES, &root, err, errlen);
    if (rc != 0)
        return rc;
    memset(&out, 0, sizeof(out));
    c.root = root;
    c.path = path;
    c.err = err;
    c.errlen = errlen;
    rc = cfg_fill(&c, &out);
    if (rc == 0)
        rc = gen_config_read(dir, &out, err, errlen);
    if (rc == 0)
        *cfg = out;
    cJSON_Delete(root);
    return rc;
}

int gang_model_topology(const gang_model_config *mc, uint32_t nnodes, uint32_t nproc_per_node,
                        uint32_t tp, uint32_t pp, gang_topology *t, char *err, size_t errlen)
{
    gang_topology_config tc;
    memset(&tc, 0, sizeof(tc));
    gang_model_topology_config(mc, &tc);
    tc.nnodes = (int32_t)nnodes;
    tc.nproc_per_node = (int32_t)nproc_per_node;
    tc.tp = (int32_t)tp;
    tc.pp = (int32_t)pp;
    return gang_topology_init(&tc, t, err, errlen);
}

void gang_model_topology_config(const gang_model_config *mc, gang_topology_config *tc)
{
    if (mc == NULL || tc == NULL)
        return;
    tc->n_layers = (int32_t)mc->n_layers;
    tc->n_heads = (int32_t)mc->n_heads;
    tc->n_kv_heads = (int32_t)mc->n_kv_heads;
    tc->ffn = (int32_t)mc->ffn;
    tc->hidden = (int32_t)mc->hidden;
    tc->vocab = (int32_t)mc->vocab;
    tc->head_dim = (int32_t)mc->head_dim;
}
