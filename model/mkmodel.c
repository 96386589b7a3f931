/*
 * mkmodel: a deterministic random Llama-family model in the Hugging Face layout, for
 * tests, benchmarks and demos without downloading a checkpoint.
 *
 * Values. Every element is a function of (seed, tensor name, element index) only: a
 * splitmix64 mix of the three gives two uniforms per pair of elements and Box-Muller
 * turns them into two normals. So the same options give byte-identical files, and the
 * values of a tensor do not depend on which shard file it lands in or on the other
 * tensors. Scales keep activations O(1): linear weights N(0, 1/in_features) (the
 * variance-preserving init), the embedding N(0, 1), norm weights 1 + 0.1 N(0, 1) and
 * biases 0.02 N(0, 1).
 *
 * Files. config.json as Hugging Face writes it; model.safetensors (or shards
 * model-0000i-of-0000n.safetensors plus model.safetensors.index.json) with tensors in
 * name order, contiguous, and the JSON header padded with spaces so that the data
 * section starts 8-byte aligned. Each file is written under a temporary name and
 * renamed; config.json is renamed last, so a directory with a config holds a whole model.
 */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ganglion/model.h"
#include "safetensors.h"

#define MK_MAX_SHARDS 99999
#define MK_MAX_FFN (1u << 20)
#define MK_MAX_POS (1u << 24)

/* MK_GNORM: a Gemma norm weight w of a (1 + w) norm, drawn around 0. */
enum mk_kind { MK_EMBED, MK_LINEAR, MK_NORM, MK_BIAS, MK_GNORM };

/* One tensor to write. */
typedef struct mk_tensor {
    char name[96];
    uint64_t rows;  /* 0 for a 1-D tensor [cols] */
    uint64_t cols;  /* in_features of a linear weight */
    int kind;       /* enum mk_kind */
    uint32_t shard; /* file it goes to */
    uint64_t begin; /* byte range in its file's data section */
    uint64_t end;
} mk_tensor;

typedef struct mk_list {
    mk_tensor *v;
    size_t n, cap;
} mk_list;

/* ---------------------------------------------------------------------------------
 * Values
 * --------------------------------------------------------------------------------- */

static uint64_t mk_mix(uint64_t z)
{
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* A uniform double in (0, 1) from counter i of stream key. */
static double mk_uniform(uint64_t key, uint64_t i)
{
    return ((double)(mk_mix(key ^ mk_mix(i)) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

/* The stream of one tensor: FNV-1a of its name mixed with the seed. */
static uint64_t mk_key(uint64_t seed, const char *name)
{
    uint64_t h = 0xcbf29ce484222325ull;

    for (; *name != '\0'; name++)
        h = (h ^ (uint8_t)*name) * 0x100000001b3ull;
    return mk_mix(seed ^ mk_mix(h));
}

/* What every slice of one tensor's values shares (mk_fill). */
typedef struct mk_fill_job {
    uint64_t key;
    double scale, offset;
    float *dst;
    size_t n;
} mk_fill_job;

/* Values [lo, hi) of the tensor (lo even: a Box-Muller pair never splits). */
static void mk_fill_slice(void *arg, size_t lo, size_t hi)
{
    const double two_pi = 6.283185307179586;
    const mk_fill_job *j = arg;

    for (size_t i = lo; i < hi; i += 2) {
        double r = sqrt(-2.0 * log(mk_uniform(j->key, i)));
        double th = two_pi * mk_uniform(j->key, i + 1);

        j->dst[i] = (float)(j->offset + j->scale * r * cos(th));
        if (i + 1 < j->n)
            j->dst[i + 1] = (float)(j->offset + j->scale * r * sin(th));
    }
}

/*
 * Fills dst[0 .. n) with the values of tensor t (f32), large tensors on several threads
 * (gang_parallel_slices, slices of whole pairs): every value depends on its index only, so
 * the bytes do not depend on the split (a 1B-parameter model took ~45 s on one core).
 */
static void mk_fill(const mk_tensor *t, uint64_t seed, float *dst, size_t n)
{
    mk_fill_job j = {.key = mk_key(seed, t->name), .scale = 1.0, .offset = 0.0, .dst = dst, .n = n};

    switch (t->kind) {
    case MK_LINEAR:
        j.scale = 1.0 / sqrt((double)t->cols);
        break;
    case MK_NORM:
        j.scale = 0.1;
        j.offset = 1.0;
        break;
    case MK_BIAS:
        j.scale = 0.02;
        break;
    case MK_GNORM:
        j.scale = 0.1;
        break;
    default:
        break;
    }
    gang_parallel_slices(n, 2, (size_t)1 << 18, mk_fill_slice, &j);
}

/* ---------------------------------------------------------------------------------
 * The tensor list
 * --------------------------------------------------------------------------------- */

static int mk_add(mk_list *l, int kind, uint64_t rows, uint64_t cols, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

static int mk_add(mk_list *l, int kind, uint64_t rows, uint64_t cols, const char *fmt, ...)
{
    va_list ap;
    mk_tensor *t;

    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 64;
        mk_tensor *v = realloc(l->v, cap * sizeof(*v));
        if (v == NULL)
            return GANG_ENOMEM;
        l->v = v;
        l->cap = cap;
    }
    t = &l->v[l->n++];
    memset(t, 0, sizeof(*t));
    va_start(ap, fmt);
    vsnprintf(t->name, sizeof(t->name), fmt, ap);
    va_end(ap);
    t->kind = kind;
    t->rows = rows;
    t->cols = cols;
    return 0;
}

static int mk_cmp_name(const void *a, const void *b)
{
    return strcmp(((const mk_tensor *)a)->name, ((const mk_tensor *)b)->name);
}

/* The router and experts of sparse layer i (each family's names), and the shared expert. */
static int mk_add_moe(mk_list *l, const gang_mkmodel_opts *o, uint32_t i)
{
    int mix = o->moe == GANG_MOE_MIXTRAL;
    const char *pre = mix ? "block_sparse_moe" : "mlp";
    const char *g = mix ? "w1" : "gate_proj", *u = mix ? "w3" : "up_proj",
               *d = mix ? "w2" : "down_proj";
    uint64_t h = o->hidden, f = mix ? o->ffn : o->moe_ffn, sh = o->shared_ffn;
    int rc = mk_add(l, MK_LINEAR, o->experts, h, "model.layers.%u.%s.gate.weight", i, pre);

    for (uint32_t e = 0; e < o->experts; e++) {
        rc |= mk_add(l, MK_LINEAR, f, h, "model.layers.%u.%s.experts.%u.%s.weight", i, pre, e, g);
        rc |= mk_add(l, MK_LINEAR, f, h, "model.layers.%u.%s.experts.%u.%s.weight", i, pre, e, u);
        rc |= mk_add(l, MK_LINEAR, h, f, "model.layers.%u.%s.experts.%u.%s.weight", i, pre, e, d);
    }
    if (o->moe == GANG_MOE_QWEN2 && sh > 0) {
        rc |= mk_add(l, MK_LINEAR, sh, h, "model.layers.%u.mlp.shared_expert.gate_proj.weight", i);
        rc |= mk_add(l, MK_LINEAR, sh, h, "model.layers.%u.mlp.shared_expert.up_proj.weight", i);
        rc |= mk_add(l, MK_LINEAR, h, sh, "model.layers.%u.mlp.shared_expert.down_proj.weight", i);
        rc |= mk_add(l, MK_LINEAR, 1, h, "model.layers.%u.mlp.shared_expert_gate.weight", i);
    }
    return rc;
}

/* Every tensor of the model, sorted by name. */
static int mk_build_list(const gang_mkmodel_opts *o, mk_list *l)
{
    uint64_t h = o->hidden, hd = o->head_dim > 0 ? o->head_dim : o->hidden / o->heads;
    uint64_t q = (uint64_t)o->heads * hd;
    uint64_t kv = (uint64_t)o->kv_heads * hd;
    const char *p = "model.layers.";
    int gemma = o->arch == GANG_ARCH_GEMMA3;
    enum mk_kind norm = gemma ? MK_GNORM : MK_NORM;
    uint32_t i;
    int rc = 0;

    rc |= mk_add(l, MK_EMBED, o->vocab, h, "model.embed_tokens.weight");
    rc |= mk_add(l, norm, 0, h, "model.norm.weight");
    if (!o->tie_embeddings)
        rc |= mk_add(l, MK_LINEAR, o->vocab, h, "lm_head.weight");
    for (i = 0; i < o->layers && rc == 0; i++) {
        rc |= mk_add(l, norm, 0, h, "%s%u.input_layernorm.weight", p, i);
        rc |= mk_add(l, MK_LINEAR, q, h, "%s%u.self_attn.q_proj.weight", p, i);
        rc |= mk_add(l, MK_LINEAR, kv, h, "%s%u.self_attn.k_proj.weight", p, i);
        rc |= mk_add(l, MK_LINEAR, kv, h, "%s%u.self_attn.v_proj.weight", p, i);
        rc |= mk_add(l, MK_LINEAR, h, q, "%s%u.self_attn.o_proj.weight", p, i);
        if (o->arch == GANG_ARCH_QWEN2) {
            rc |= mk_add(l, MK_BIAS, 0, q, "%s%u.self_attn.q_proj.bias", p, i);
            rc |= mk_add(l, MK_BIAS, 0, kv, "%s%u.self_attn.k_proj.bias", p, i);
            rc |= mk_add(l, MK_BIAS, 0, kv, "%s%u.self_attn.v_proj.bias", p, i);
        }
        if (o->arch == GANG_ARCH_QWEN3 || gemma) {
            rc |= mk_add(l, norm, 0, hd, "%s%u.self_attn.q_norm.weight", p, i);
            rc |= mk_add(l, norm, 0, hd, "%s%u.self_attn.k_norm.weight", p, i);
        }
        rc |= mk_add(l, norm, 0, h, "%s%u.post_attention_layernorm.weight", p, i);
        if (gemma) { /* sandwich norms */
            rc |= mk_add(l, norm, 0, h, "%s%u.pre_feedforward_layernorm.weight", p, i);
            rc |= mk_add(l, norm, 0, h, "%s%u.post_feedforward_layernorm.weight", p, i);
        }
        if (o->moe != GANG_MOE_NONE && i >= o->dense_layers) {
            rc |= mk_add_moe(l, o, i);
            continue;
        }
        rc |= mk_add(l, MK_LINEAR, o->ffn, h, "%s%u.mlp.gate_proj.weight", p, i);
        rc |= mk_add(l, MK_LINEAR, o->ffn, h, "%s%u.mlp.up_proj.weight", p, i);
        rc |= mk_add(l, MK_LINEAR, h, o->ffn, "%s%u.mlp.down_proj.weight", p, i);
    }
    if (rc != 0)
        return GANG_ENOMEM;
    qsort(l->v, l->n, sizeof(*l->v), mk_cmp_name);
    return 0;
}

static uint64_t mk_numel(const mk_tensor *t)
{
    return (t->rows ? t->rows : 1) * t->cols;
}

/* ---------------------------------------------------------------------------------
 * Writing
 * --------------------------------------------------------------------------------- */

/* A growing text buffer for the safetensors header. */
typedef struct mk_buf {
    char *p;
    size_t n, cap;
    int oom;
} mk_buf;

static void mk_printf(mk_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void mk_printf(mk_buf *b, const char *fmt, ...)
{
    va_list ap;
    int k;

    for (;;) {
        va_start(ap, fmt);
        k = vsnprintf(b->p ? b->p + b->n : NULL, b->p ? b->cap - b->n : 0, fmt, ap);
        va_end(ap);
        if (k < 0 || b->oom) {
            b->oom = 1;
            return;
        }
        if (b->p != NULL && (size_t)k < b->cap - b->n) {
            b->n += (size_t)k;
            return;
        }
        size_t cap = (b->cap ? 2 * b->cap : 4096) + (size_t)k;
        char *p = realloc(b->p, cap);
        if (p == NULL) {
            b->oom = 1;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
}

static const char *mk_dtype_tag(gang_dtype dt)
{
    return dt == GANG_DTYPE_F16 ? "F16" : dt == GANG_DTYPE_BF16 ? "BF16" : "F32";
}

/* Writes n bytes or fails with the message in err. */
static int mk_write(FILE *fp, const void *p, size_t n, const char *path, char *err, size_t errlen)
{
    if (n > 0 && fwrite(p, 1, n, fp) != n) {
        int rc = gang_err_from_errno(errno ? errno : EIO);
        gang_set_err(err, errlen, "%s: write failed: %s", path, strerror(errno ? errno : EIO));
        return rc;
    }
    return 0;
}

/* Closes fp and renames tmp to path; on any error removes tmp. */
static int mk_commit(FILE *fp, int rc, const char *tmp, const char *path, char *err, size_t errlen)
{
    if (fclose(fp) != 0 && rc == 0) {
        rc = gang_err_from_errno(errno);
        gang_set_err(err, errlen, "%s: close failed: %s", tmp, strerror(errno));
    }
    if (rc == 0 && rename(tmp, path) != 0) {
        rc = gang_err_from_errno(errno);
        gang_set_err(err, errlen, "%s: rename failed: %s", path, strerror(errno));
    }
    if (rc != 0)
        unlink(tmp);
    return rc;
}

static FILE *mk_open_tmp(const char *tmp, int *rc, char *err, size_t errlen)
{
    FILE *fp = fopen(tmp, "wb");

    if (fp == NULL) {
        *rc = gang_err_from_errno(errno);
        gang_set_err(err, errlen, "%s: cannot create: %s", tmp, strerror(errno));
    }
    return fp;
}

/* The file name of shard s (0-based) of n. */
static void mk_shard_name(const gang_mkmodel_opts *o, uint32_t s, char *buf, size_t cap)
{
    if (o->shards <= 1)
        snprintf(buf, cap, "%s", GANG__ST_SINGLE_NAME);
    else
        snprintf(buf, cap, "model-%05u-of-%05u.safetensors", s + 1, o->shards);
}

/*
 * Writes shard s: the header of its tensors (offsets already assigned), padded with
 * spaces so that 8 + header length is a multiple of 8, then their data in order.
 */
static int mk_write_shard(const gang_mkmodel_opts *o, const mk_list *l, uint32_t s, float *f32,
                          uint16_t *half, char *err, size_t errlen)
{
    char name[64], path[4096], tmp[4200];
    uint8_t len8[8];
    size_t esz = gang_dtype_size(o->dtype), i;
    mk_buf b = {0};
    FILE *fp;
    int rc = 0, first = 1;

    mk_shard_name(o, s, name, sizeof(name));
    snprintf(path, sizeof(path), "%s/%s", o->out_dir, name);
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    mk_printf(&b, "{\"__metadata__\":{\"format\":\"pt\"}");
    for (i = 0; i < l->n; i++) {
        const mk_tensor *t = &l->v[i];

        if (t->shard != s)
            continue;
        if (t->rows)
            mk_printf(&b, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[%llu,%llu]", t->name,
                      mk_dtype_tag(o->dtype), (unsigned long long)t->rows,
                      (unsigned long long)t->cols);
        else
            mk_printf(&b, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[%llu]", t->name,
                      mk_dtype_tag(o->dtype), (unsigned long long)t->cols);
        mk_printf(&b, ",\"data_offsets\":[%llu,%llu]}", (unsigned long long)t->begin,
                  (unsigned long long)t->end);
        first = 0;
    }
    mk_printf(&b, "}");
    while ((8 + b.n) % 8 != 0)
        mk_printf(&b, " ");
    if (b.oom || first) {
        free(b.p);
        return GANG_ENOMEM;
    }
    for (i = 0; i < 8; i++)
        len8[i] = (uint8_t)((uint64_t)b.n >> (8 * i));

    fp = mk_open_tmp(tmp, &rc, err, errlen);
    if (fp == NULL) {
        free(b.p);
        return rc;
    }
    rc = mk_write(fp, len8, 8, tmp, err, errlen);
    if (rc == 0)
        rc = mk_write(fp, b.p, b.n, tmp, err, errlen);
    for (i = 0; i < l->n && rc == 0; i++) {
        const mk_tensor *t = &l->v[i];
        size_t n = (size_t)mk_numel(t);

        if (t->shard != s)
            continue;
        mk_fill(t, o->seed, f32, n);
        if (esz == 4) {
            rc = mk_write(fp, f32, n * 4, tmp, err, errlen);
            continue;
        }
        if (o->dtype == GANG_DTYPE_F16)
            gang_f32_to_f16_array(f32, half, n);
        else
            gang_f32_to_bf16_array(f32, half, n);
        rc = mk_write(fp, half, n * 2, tmp, err, errlen);
    }
    free(b.p);
    return mk_commit(fp, rc, tmp, path, err, errlen);
}

/* model.safetensors.index.json of a sharded model. */
static int mk_write_index(const gang_mkmodel_opts *o, const mk_list *l, uint64_t total, char *err,
                          size_t errlen)
{
    char path[4096], tmp[4200], name[64];
    FILE *fp;
    size_t i;
    int rc = 0;

    snprintf(path, sizeof(path), "%s/%s", o->out_dir, GANG__ST_INDEX_NAME);
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    fp = mk_open_tmp(tmp, &rc, err, errlen);
    if (fp == NULL)
        return rc;
    fprintf(fp, "{\n  \"metadata\": {\n    \"total_size\": %llu\n  },\n  \"weight_map\": {\n",
            (unsigned long long)total);
    for (i = 0; i < l->n; i++) {
        mk_shard_name(o, l->v[i].shard, name, sizeof(name));
        fprintf(fp, "    \"%s\": \"%s\"%s\n", l->v[i].name, name, i + 1 < l->n ? "," : "");
    }
    fprintf(fp, "  }\n}\n");
    if (ferror(fp)) {
        rc = GANG_EIO;
        gang_set_err(err, errlen, "%s: write failed", tmp);
    }
    return mk_commit(fp, rc, tmp, path, err, errlen);
}

/* The head of config.json of a MoE model: its class, and the experts' fields. */
static void mk_write_moe(FILE *fp, const gang_mkmodel_opts *o)
{
    static const char *const cls[] = {"", "MixtralForCausalLM", "Qwen2MoeForCausalLM",
                                      "Qwen3MoeForCausalLM"};
    static const char *const type[] = {"", "mixtral", "qwen2_moe", "qwen3_moe"};

    fprintf(fp, "{\n  \"architectures\": [\"%s\"],\n  \"model_type\": \"%s\",\n", cls[o->moe],
            type[o->moe]);
    fprintf(fp, "  \"num_experts_per_tok\": %u,\n", o->top_k);
    if (o->moe == GANG_MOE_MIXTRAL) {
        fprintf(fp, "  \"num_local_experts\": %u,\n", o->experts);
        return;
    }
    fprintf(fp, "  \"num_experts\": %u,\n  \"moe_intermediate_size\": %u,\n", o->experts,
            o->moe_ffn);
    fprintf(fp, "  \"norm_topk_prob\": %s,\n  \"decoder_sparse_step\": 1,\n",
            o->norm_topk ? "true" : "false");
    if (o->moe == GANG_MOE_QWEN2)
        fprintf(fp, "  \"shared_expert_intermediate_size\": %u,\n", o->shared_ffn);
    fprintf(fp, "  \"mlp_only_layers\": [");
    for (uint32_t i = 0; i < o->dense_layers; i++)
        fprintf(fp, "%s%u", i ? ", " : "", i);
    fprintf(fp, "],\n");
}

/* config.json in the form Hugging Face writes for the architecture. */
static int mk_write_config(const gang_mkmodel_opts *o, char *err, size_t errlen)
{
    static const char *const cls[] = {"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM",
                                      "Qwen3ForCausalLM", "Gemma3ForCausalLM"};
    static const char *const type[] = {"llama", "mistral", "qwen2", "qwen3", "gemma3_text"};
    int qwen = o->arch == GANG_ARCH_QWEN2 || o->arch == GANG_ARCH_QWEN3;
    const char *dt = o->dtype == GANG_DTYPE_F16    ? "float16"
                     : o->dtype == GANG_DTYPE_BF16 ? "bfloat16"
                                                   : "float32";
    char path[4096], tmp[4200];
    uint32_t i;
    FILE *fp;
    int rc = 0;

    snprintf(path, sizeof(path), "%s/config.json", o->out_dir);
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    fp = mk_open_tmp(tmp, &rc, err, errlen);
    if (fp == NULL)
        return rc;
    if (o->moe != GANG_MOE_NONE)
        mk_write_moe(fp, o);
    else
        fprintf(fp, "{\n  \"architectures\": [\"%s\"],\n  \"model_type\": \"%s\",\n", cls[o->arch],
                type[o->arch]);
    fprintf(fp, "  \"%s\": \"%s\",\n  \"hidden_size\": %u,\n",
            o->arch == GANG_ARCH_GEMMA3 ? "hidden_activation" : "hidden_act",
            o->arch == GANG_ARCH_GEMMA3 ? "gelu_pytorch_tanh" : "silu", o->hidden);
    fprintf(fp, "  \"intermediate_size\": %u,\n  \"num_attention_heads\": %u,\n", o->ffn, o->heads);
    fprintf(fp, "  \"num_key_value_heads\": %u,\n  \"num_hidden_layers\": %u,\n", o->kv_heads,
            o->layers);
    fprintf(fp, "  \"vocab_size\": %u,\n  \"max_position_embeddings\": %u,\n", o->vocab,
            o->max_pos);
    fprintf(fp, "  \"rms_norm_eps\": 1e-05,\n  \"rope_theta\": %.9g,\n  \"rope_scaling\": %s,\n",
            o->rope_theta > 0.0f ? (double)o->rope_theta
            : qwen               ? 1e6
                                 : 1e4,
            o->rope_scaling != NULL ? o->rope_scaling : "null");
    if (o->head_dim > 0)
        fprintf(fp, "  \"head_dim\": %u,\n", o->head_dim);
    if (o->arch == GANG_ARCH_QWEN3)
        fprintf(fp, "  \"attention_bias\": false,\n");
    if (o->arch == GANG_ARCH_GEMMA3) /* a window that never binds; tests edit these */
        fprintf(fp,
                "  \"attention_bias\": false,\n  \"sliding_window\": %u,\n"
                "  \"sliding_window_pattern\": 6,\n  \"rope_local_base_freq\": 10000.0,\n"
                "  \"query_pre_attn_scalar\": %u,\n  \"final_logit_softcapping\": null,\n"
                "  \"attn_logit_softcapping\": null,\n",
                o->max_pos, o->head_dim > 0 ? o->head_dim : o->hidden / o->heads);
    else if (o->arch == GANG_ARCH_LLAMA)
        fprintf(fp, "  \"attention_bias\": false,\n  \"mlp_bias\": false,\n");
    else if (o->arch == GANG_ARCH_MISTRAL)
        fprintf(fp, "  \"sliding_window\": null,\n");
    else
        fprintf(fp, "  \"use_sliding_window\": false,\n  \"sliding_window\": %u,\n", o->max_pos);
    fprintf(fp, "  \"tie_word_embeddings\": %s,\n", o->tie_embeddings ? "true" : "false");
    /* No EOS unless asked: random greedy decoding could otherwise stop anywhere. */
    fprintf(fp, "  \"bos_token_id\": 1,\n  \"eos_token_id\": ");
    if (o->n_eos == 0)
        fprintf(fp, "null");
    else if (o->n_eos == 1)
        fprintf(fp, "%d", o->eos_ids[0]);
    for (i = 0; o->n_eos > 1 && i < o->n_eos; i++)
        fprintf(fp, "%s%d%s", i == 0 ? "[" : ", ", o->eos_ids[i], i + 1 == o->n_eos ? "]" : "");
    fprintf(fp, ",\n  \"torch_dtype\": \"%s\"\n}\n", dt);
    if (ferror(fp)) {
        rc = GANG_EIO;
        gang_set_err(err, errlen, "%s: write failed", tmp);
    }
    return mk_commit(fp, rc, tmp, path, err, errlen);
}

/* Creates dir and its missing parents (mkdir -p). */
static int mk_mkdirs(const char *dir, char *err, size_t errlen)
{
    char buf[4096];
    size_t i, n = strlen(dir);

    if (n == 0 || n >= sizeof(buf)) {
        gang_set_err(err, errlen, "mkmodel: output directory path empty or too long");
        return GANG_EUSAGE;
    }
    memcpy(buf, dir, n + 1);
    for (i = 1; i <= n; i++) {
        if (buf[i] != '/' && buf[i] != '\0')
            continue;
        buf[i] = '\0';
        if (mkdir(buf, 0755) != 0 && errno != EEXIST) {
            int rc = gang_err_from_errno(errno);
            gang_set_err(err, errlen, "%s: cannot create directory: %s", buf, strerror(errno));
            return rc;
        }
        buf[i] = dir[i];
    }
    return 0;
}

/* The EOS ids: at most GANG_MAX_EOS, each in the vocabulary, none twice. */
static int mk_eos_ok(const gang_mkmodel_opts *o)
{
    uint32_t i, j;

    if (o->n_eos > GANG_MAX_EOS)
        return 0;
    for (i = 0; i < o->n_eos; i++) {
        if (o->eos_ids[i] < 0 || (uint32_t)o->eos_ids[i] >= o->vocab)
            return 0;
        for (j = 0; j < i; j++)
            if (o->eos_ids[j] == o->eos_ids[i])
                return 0;
    }
    return 1;
}

/* A MoE family on its architecture, with experts and top_k the config reader takes. */
static int mk_moe_ok(const gang_mkmodel_opts *o)
{
    gang_model_arch want = o->moe == GANG_MOE_MIXTRAL ? GANG_ARCH_MISTRAL
                           : o->moe == GANG_MOE_QWEN2 ? GANG_ARCH_QWEN2
                                                      : GANG_ARCH_QWEN3;

    return (unsigned)o->moe <= GANG_MOE_QWEN3 && o->arch == want && o->experts >= 1 &&
           o->experts <= GANG_MOE_MAX_EXPERTS && o->top_k >= 1 && o->top_k <= o->experts &&
           o->top_k <= GANG_MOE_MAX_TOPK && o->dense_layers < o->layers && o->moe_ffn >= 1 &&
           (o->moe != GANG_MOE_MIXTRAL || o->dense_layers == 0);
}

/* The shape rules of gang_model_config_read, as usage errors. */
static int mk_check_opts(const gang_mkmodel_opts *o, char *err, size_t errlen)
{
    const char *why = NULL;

    if (o->arch != GANG_ARCH_LLAMA && o->arch != GANG_ARCH_MISTRAL && o->arch != GANG_ARCH_QWEN2 &&
        o->arch != GANG_ARCH_QWEN3 && o->arch != GANG_ARCH_GEMMA3)
        why = "unknown architecture";
    else if (o->dtype != GANG_DTYPE_F32 && o->dtype != GANG_DTYPE_F16 &&
             o->dtype != GANG_DTYPE_BF16)
        why = "dtype must be f32, f16 or bf16";
    else if (o->layers < 1 || o->layers > GANG_MODEL_MAX_LAYERS)
        why = "layers must be in [1, 1024]";
    else if (o->hidden < 1 || o->hidden > GANG_MODEL_MAX_HIDDEN)
        why = "hidden must be in [1, 65536]";
    else if (o->heads < 1 || o->heads > GANG_MODEL_MAX_HEADS ||
             (o->head_dim == 0 && o->hidden % o->heads != 0))
        why = "heads must be in [1, 1024] and divide hidden (unless head-dim is set)";
    else if (o->head_dim % 2 != 0 || o->head_dim > GANG_MODEL_MAX_HEAD_DIM)
        why = "head-dim must be 0 or even and at most 512";
    else if (o->rope_scaling != NULL &&
             (o->rope_scaling[0] != '{' || strlen(o->rope_scaling) > 1024 ||
              strchr(o->rope_scaling, '\n') != NULL))
        why = "rope-scaling must be one JSON object of at most 1024 bytes";
    else if (!(o->rope_theta >= 0.0f) || o->rope_theta > 1e12f)
        why = "rope-theta must be in [0, 1e12]";
    else if (o->kv_heads < 1 || o->kv_heads > o->heads || o->heads % o->kv_heads != 0)
        why = "kv-heads must divide heads";
    else if (o->ffn < 1 || o->ffn > MK_MAX_FFN)
        why = "ffn must be in [1, 1048576]";
    else if (o->vocab < 3 || o->vocab > GANG_MODEL_MAX_VOCAB)
        why = "vocab must be in [3, 4194304] (bos is 1)";
    else if (!mk_eos_ok(o))
        why = "at most 8 eos ids, each in [0, vocab)";
    else if (o->max_pos < 1 || o->max_pos > MK_MAX_POS)
        why = "max-pos must be in [1, 16777216]";
    else if (o->shards < 1 || o->shards > MK_MAX_SHARDS)
        why = "shards must be in [1, 99999]";
    else if (o->moe != GANG_MOE_NONE && !mk_moe_ok(o))
        why = "moe: mixtral needs arch mistral and no dense layers, qwen2 / qwen3 their arch; "
              "experts in [1, 1024], top-k in [1, min(experts, 16)], dense layers below layers";
    if (why == NULL)
        return 0;
    gang_set_err(err, errlen, "mkmodel: %s", why);
    return GANG_EUSAGE;
}

int gang_mkmodel(const gang_mkmodel_opts *o, char *err, size_t errlen)
{
    char path[4096];
    mk_list l = {0};
    float *f32 = NULL;
    uint16_t *half = NULL;
    uint64_t esz, max_n = 0, total = 0, off = 0;
    uint32_t s;
    size_t i;
    int rc;

    if (err != NULL && errlen > 0)
        err[0] = '\0';
    if (o == NULL || o->out_dir == NULL)
        return GANG_EINVAL;
    rc = mk_check_opts(o, err, errlen);
    if (rc != 0)
        return rc;
    rc = mk_build_list(o, &l);
    if (rc != 0)
        goto out_free;
    if (o->shards > l.n) {
        gang_set_err(err, errlen, "mkmodel: %u shards for %zu tensors", o->shards, l.n);
        rc = GANG_EUSAGE;
        goto out_free;
    }
    /* Tensors in name order, cut into shards of (nearly) equal tensor counts. */
    esz = gang_dtype_size(o->dtype);
    for (i = 0; i < l.n; i++) {
        mk_tensor *t = &l.v[i];
        uint32_t shard = (uint32_t)((uint64_t)i * o->shards / l.n);

        if (i > 0 && shard != l.v[i - 1].shard)
            off = 0;
        t->shard = shard;
        t->begin = off;
        t->end = off + mk_numel(t) * esz;
        off = t->end;
        total += t->end - t->begin;
        if (mk_numel(t) > max_n)
            max_n = mk_numel(t);
    }
    rc = mk_mkdirs(o->out_dir, err, errlen);
    if (rc != 0)
        goto out_free;
    /* One scratch tensor, reused for every tensor in turn. */
    f32 = malloc((size_t)max_n * sizeof(float));
    half = esz == 2 ? malloc((size_t)max_n * sizeof(uint16_t)) : NULL;
    if (f32 == NULL || (esz == 2 && half == NULL)) {
        rc = GANG_ENOMEM;
        goto out_free;
    }
    for (s = 0; s < o->shards && rc == 0; s++)
        rc = mk_write_shard(o, &l, s, f32, half, err, errlen);
    if (rc != 0)
        goto out_free;
    /* The other layout's entry file would shadow this one (or be shadowed): remove it. */
    snprintf(path, sizeof(path), "%s/%s", o->out_dir,
             o->shards > 1 ? GANG__ST_SINGLE_NAME : GANG__ST_INDEX_NAME);
    unlink(path);
    if (o->shards > 1)
        rc = mk_write_index(o, &l, total, err, errlen);
    if (rc == 0)
        rc = mk_write_config(o, err, errlen);
out_free:
    free(half);
    free(f32);
    free(l.v);
    return rc;
}
