/*
 * The mixture-of-experts fields of a Hugging Face config.json (issue #25): Mixtral
 * (MixtralForCausalLM), Qwen2-MoE (Qwen2MoeForCausalLM) and Qwen3-MoE (Qwen3MoeForCausalLM).
 * config.c reads the attention's fields as for Mistral, Qwen2 and Qwen3 (the same layers
 * apart from the MLP); this file reads the experts, the routing rule and which layers are
 * sparse, every field bounded.
 */
#include <math.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "ganglion/model.h"
#include "model-internal.h"

/* A member, or NULL when absent or JSON null. */
static const cJSON *moe_get(const cJSON *root, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);

    return cJSON_IsNull(v) ? NULL : v;
}

/* An integer field in [lo, hi]; def when absent (def < 0: required). */
static int moe_uint(const cJSON *root, const char *path, const char *key, int64_t def, uint32_t lo,
                    uint32_t hi, uint32_t *out, char *err, size_t errlen)
{
    const cJSON *v = moe_get(root, key);
    double d;

    if (v == NULL) {
        if (def < 0) {
            gang_set_err(err, errlen, "%s: field \"%s\" is missing", path, key);
            return GANG_EMODEL;
        }
        *out = (uint32_t)def;
        return 0;
    }
    d = cJSON_IsNumber(v) ? v->valuedouble : NAN;
    if (!(d == floor(d)) || d < (double)lo || d > (double)hi) {
        gang_set_err(err, errlen, "%s: field \"%s\" is not an integer in [%u, %u]", path, key, lo,
                     hi);
        return GANG_EMODEL;
    }
    *out = (uint32_t)d;
    return 0;
}

/* The family named by "architectures" or "model_type" (GANG_MOE_NONE for a dense one). */
static gang_moe_family moe_family(const cJSON *root)
{
    static const struct {
        const char *cls, *type;
        gang_moe_family f;
    } known[] = {{"MixtralForCausalLM", "mixtral", GANG_MOE_MIXTRAL},
                 {"Qwen2MoeForCausalLM", "qwen2_moe", GANG_MOE_QWEN2},
                 {"Qwen3MoeForCausalLM", "qwen3_moe", GANG_MOE_QWEN3}};
    const cJSON *archs = moe_get(root, "architectures"), *type = moe_get(root, "model_type"), *a;

    for (size_t i = 0; i < sizeof(known) / sizeof(known[0]); i++) {
        cJSON_ArrayForEach(a, archs)
        {
            if (cJSON_IsString(a) && strcmp(a->valuestring, known[i].cls) == 0)
                return known[i].f;
        }
        if (!cJSON_IsArray(archs) && cJSON_IsString(type) &&
            strcmp(type->valuestring, known[i].type) == 0)
            return known[i].f;
    }
    return GANG_MOE_NONE;
}

/* mlp_only_layers: a list of distinct layer indices below n_layers, as bits. */
static int moe_dense_layers(const cJSON *root, const char *path, gang_model_config *cfg, char *err,
                            size_t errlen)
{
    const cJSON *v = moe_get(root, "mlp_only_layers"), *e;

    if (v == NULL)
        return 0;
    if (!cJSON_IsArray(v)) {
        gang_set_err(err, errlen, "%s: \"mlp_only_layers\" is not a list", path);
        return GANG_EMODEL;
    }
    cJSON_ArrayForEach(e, v)
    {
        double d = cJSON_IsNumber(e) ? e->valuedouble : -1.0;

        if (!(d == floor(d)) || d < 0.0 || d >= (double)cfg->n_layers) {
            gang_set_err(err, errlen,
                         "%s: \"mlp_only_layers\" holds %s, not a layer index below %u", path,
                         cJSON_IsNumber(e) ? "a number" : "a non-number", cfg->n_layers);
            return GANG_EMODEL;
        }
        cfg->mlp_only[(uint32_t)d / 64] |= 1ull << ((uint32_t)d % 64);
    }
    return 0;
}

/* Qwen2-MoE and Qwen3-MoE: experts, routing, sparse layers, the shared expert (Qwen2). */
static int moe_qwen(const cJSON *root, const char *path, gang_model_config *cfg, char *err,
                    size_t errlen)
{
    const cJSON *norm = moe_get(root, "norm_topk_prob");
    int rc;

    rc = moe_uint(root, path, "num_experts", -1, 0, GANG_MOE_MAX_EXPERTS, &cfg->n_experts, err,
                  errlen);
    if (rc == 0)
        rc = moe_uint(root, path, "num_experts_per_tok", -1, 1, GANG_MOE_MAX_TOPK, &cfg->top_k, err,
                      errlen);
    if (rc == 0)
        rc = moe_uint(root, path, "moe_intermediate_size", -1, 1, 1u << 20, &cfg->moe_ffn, err,
                      errlen);
    if (rc == 0 && cfg->moe == GANG_MOE_QWEN2)
        rc = moe_uint(root, path, "shared_expert_intermediate_size", 0, 0, 1u << 20,
                      &cfg->shared_ffn, err, errlen);
    if (rc == 0)
        rc = moe_uint(root, path, "decoder_sparse_step", 1, 1, GANG_MODEL_MAX_LAYERS,
                      &cfg->sparse_step, err, errlen);
    if (rc == 0)
        rc = moe_dense_layers(root, path, cfg, err, errlen);
    if (rc != 0)
        return rc;
    if (norm != NULL && !cJSON_IsBool(norm)) {
        gang_set_err(err, errlen, "%s: field \"norm_topk_prob\" is not a boolean", path);
        return GANG_EMODEL;
    }
    cfg->norm_topk = cJSON_IsTrue(norm) ? 1 : 0;
    return 0;
}

int gang__config_moe(const cJSON *root, const char *path, gang_model_config *cfg, char *err,
                     size_t errlen)
{
    int rc = 0;

    cfg->moe = moe_family(root);
    cfg->sparse_step = 1;
    if (cfg->moe == GANG_MOE_NONE)
        return 0;
    if (cfg->moe == GANG_MOE_MIXTRAL) {
        /* Mixtral: every layer sparse, intermediate_size is each expert's, always
         * renormalised over the top_k. */
        rc = moe_uint(root, path, "num_local_experts", -1, 1, GANG_MOE_MAX_EXPERTS, &cfg->n_experts,
                      err, errlen);
        if (rc == 0)
            rc = moe_uint(root, path, "num_experts_per_tok", -1, 1, GANG_MOE_MAX_TOPK, &cfg->top_k,
                          err, errlen);
        cfg->moe_ffn = cfg->ffn;
        cfg->norm_topk = 1;
    } else {
        rc = moe_qwen(root, path, cfg, err, errlen);
    }
    if (rc == 0 && cfg->n_experts > 0 && cfg->top_k > cfg->n_experts) {
        gang_set_err(err, errlen, "%s: num_experts_per_tok %u is above the %u experts", path,
                     cfg->top_k, cfg->n_experts);
        rc = GANG_EMODEL;
    }
    return rc;
}

int gang_model_layer_moe(const gang_model_config *cfg, uint32_t layer)
{
    if (cfg == NULL || cfg->n_experts == 0 || layer >= GANG_MODEL_MAX_LAYERS)
        return 0;
    if (cfg->mlp_only[layer / 64] & (1ull << (layer % 64)))
        return 0;
    return cfg->sparse_step > 0 && (layer + 1) % cfg->sparse_step == 0;
}

int gang_model_moe_layout(const gang_model_config *cfg, uint32_t tp, uint32_t ep, char *err,
                          size_t errlen)
{
    if (cfg == NULL || tp == 0 || ep == 0)
        return GANG_EINVAL;
    if (cfg->n_experts == 0) {
        if (ep == 1)
            return 0;
        gang_set_err(err, errlen, "--ep %u: the model has no experts (only --ep 1 serves it)", ep);
        return GANG_EUSAGE;
    }
    if (ep != 1 && ep % tp != 0) {
        gang_set_err(err, errlen,
                     "--ep %u with --tp %u: experts are cut by columns (--ep 1), split over a TP "
                     "group's ranks (--ep equal to --tp) or over a stage of --ep ranks holding "
                     "--ep / --tp replicas of the TP group (--ep a multiple of --tp); an EP "
                     "group narrower than the TP group is not supported",
                     ep, tp);
        return GANG_EUSAGE;
    }
    if (cfg->n_experts % ep != 0) {
        gang_set_err(err, errlen, "--ep %u does not divide the model's %u experts", ep,
                     cfg->n_experts);
        return GANG_EUSAGE;
    }
    if (ep == 1 && cfg->moe_ffn % tp != 0) {
        gang_set_err(err, errlen,
                     "--tp %u does not divide the experts' width %u (with --ep 1 each expert is "
                     "cut by columns)",
                     tp, cfg->moe_ffn);
        return GANG_EUSAGE;
    }
    if (cfg->shared_ffn % tp != 0) {
        gang_set_err(err, errlen, "--tp %u does not divide the shared expert's width %u", tp,
                     cfg->shared_ffn);
        return GANG_EUSAGE;
    }
    /* Wider than TP, the MoE block runs over the stage's EP group: the shared expert's
     * columns too, so that one all-reduce over it sums the block. */
    if (ep > tp && cfg->shared_ffn % ep != 0) {
        gang_set_err(err, errlen,
                     "--ep %u does not divide the shared expert's width %u (with --ep above "
                     "--tp its columns are split over the EP group)",
                     ep, cfg->shared_ffn);
        return GANG_EUSAGE;
    }
    return 0;
}

void gang_model_params(const gang_model_config *c, uint64_t *total, uint64_t *active)
{
    uint64_t h = c->hidden, q = (uint64_t)c->n_heads * c->head_dim;
    uint64_t kv = (uint64_t)c->n_kv_heads * c->head_dim, all, act;
    uint64_t attn = 2 * h + 2 * q * h + 2 * kv * h, dense = 3 * (uint64_t)c->ffn * h;
    uint64_t expert = 3 * (uint64_t)c->moe_ffn * h;
    uint64_t shared = c->shared_ffn > 0 ? 3 * (uint64_t)c->shared_ffn * h + h : 0;

    if (c->attn_bias)
        attn += q + 2 * kv;
    if (c->qk_norm)
        attn += 2 * (uint64_t)c->head_dim;
    if (c->post_norms)
        attn += 2 * h;
    all = act = (uint64_t)c->vocab * h * (c->tie_embeddings ? 1 : 2) + h;
    for (uint32_t i = 0; i < c->n_layers; i++) {
        int sparse = gang_model_layer_moe(c, i);
        uint64_t router = (uint64_t)c->n_experts * h;

        all += attn + (sparse ? router + c->n_experts * expert + shared : dense);
        act += attn + (sparse ? router + c->top_k * expert + shared : dense);
    }
    if (total != NULL)
        *total = all;
    if (active != NULL)
        *active = act;
}
