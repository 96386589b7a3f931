/*
 * Loading one rank's shard of a model: config.json, then the tensors of its pipeline
 * stage cut for its TP rank straight out of the safetensors files.
 *
 * The cut is exactly the one gang_tp_layer_init makes from full matrices (parallel.h,
 * "the Megatron split"): q_proj rows of the rank's query heads, k_proj / v_proj rows of
 * its kv heads (replicated when tp > n_kv_heads), o_proj columns of its query heads,
 * gate_proj / up_proj rows and down_proj columns of its ffn slice, and the q/k/v biases
 * like the rows of their projections. Here the band is read directly from the file, so
 * a rank never holds a full matrix: a row band is one contiguous byte range, a column
 * band one short range per row (gang__st_read), and nothing else of the file is read.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "ganglion/model.h"
#include "gguf.h"
#include "model-internal.h"
#include "safetensors.h"

/* The weights come from one of two sources: safetensors files (set) or a GGUF file (gg,
 * when is_gguf), whose tensors ld_band finds under their GGUF names. */
typedef struct loader {
    gang__st_set set;
    gang__gguf gg;
    int is_gguf;
    int blocks;                  /* GGUF with --dtype auto: its quantized tensors stay blocks */
    int keep_layout;             /* gang_load_options.keep_layout: no CPU repacking */
    int repacked;                /* a weight was repacked for the CPU (gang_model.repacked) */
    const gang_model_config *hf; /* the config (GGUF: which heads to un-permute) */
    const gang_topology *t;
    char *err;
    size_t errlen;
    size_t bytes;              /* f32 bytes copied out so far */
    float *rope_factors;       /* GGUF rope_freqs.weight, read and checked once, or NULL */
    uint32_t ep;               /* how a MoE layer's experts are held (gang_load_options.ep) */
    gang_kernels_arena *arena; /* the model's (m->warena): the layers' repacked matrices */
} loader;

/* The file a missing tensor is reported against: the single file or the index. */
static const char *ld_where(const loader *L)
{
    return L->set.n_entries > 0 ? GANG__ST_INDEX_NAME : GANG__ST_SINGLE_NAME;
}

/* "[a, b, c]" into buf. */
static void ld_shape_str(const uint64_t *shape, uint32_t ndim, char *buf, size_t cap)
{
    size_t used = 0;
    uint32_t i;

    used += (size_t)snprintf(buf, cap, "[");
    for (i = 0; i < ndim && used < cap; i++)
        used += (size_t)snprintf(buf + used, cap - used, "%s%llu", i ? ", " : "",
                                 (unsigned long long)shape[i]);
    if (used < cap)
        snprintf(buf + used, cap - used, "]");
}

/*
 * Reads the band rows [row_first, +row_count) x columns [col_first, +col_count) of the
 * tensor `name`, which must have the shape [rows, cols] (rows == 0: the 1-D shape
 * [cols], read as one row), into a new malloc'd f32 array *out. Returns 0, GANG_EMODEL
 * (missing tensor, wrong shape; message names the file and the tensor) or GANG_ENOMEM.
 */
static int ld_band(loader *L, const char *name, uint64_t rows, uint64_t cols, uint64_t row_first,
                   uint64_t row_count, uint64_t col_first, uint64_t col_count, float **out)
{
    const gang__st_file *f;
    const gang__st_tensor *t;
    uint64_t want[2];
    uint32_t want_ndim = rows == 0 ? 1 : 2;
    char got_s[128], want_s[64];
    int rc;

    *out = NULL;
    if (L->is_gguf)
        return gang__gguf_band(&L->gg, L->hf, name, rows, cols, row_first, row_count, col_first,
                               col_count, out, L->err, L->errlen, &L->bytes);
    if (gang__st_set_find(&L->set, name, &f, &t) != 0) {
        gang_set_err(L->err, L->errlen, "%s: tensor %s is missing", ld_where(L), name);
        return GANG_EMODEL;
    }
    want[0] = rows == 0 ? cols : rows;
    want[1] = cols;
    if (t->ndim != want_ndim || t->shape[0] != want[0] || (want_ndim == 2 && t->shape[1] != cols)) {
        ld_shape_str(t->shape, t->ndim, got_s, sizeof(got_s));
        ld_shape_str(want, want_ndim, want_s, sizeof(want_s));
        gang_set_err(L->err, L->errlen, "%s: tensor %s has shape %s, config.json implies %s",
                     f->base, name, got_s, want_s);
        return GANG_EMODEL;
    }
    if (rows == 0)
        row_count = 1;
    *out = malloc((size_t)(row_count * col_count) * sizeof(float));
    if (*out == NULL)
        return GANG_ENOMEM;
    rc = gang__st_read(f, t, row_first, row_count, col_first, col_count, *out);
    if (rc != 0) {
        gang_set_err(L->err, L->errlen, "%s: tensor %s: %s", f->base, name,
                     rc == GANG_EIO ? "read failed (the file changed or shrank?)"
                                    : "band outside the tensor");
        free(*out);
        *out = NULL;
        return rc == GANG_EIO ? GANG_EMODEL : GANG_EINTERNAL;
    }
    L->bytes += (size_t)(row_count * col_count) * sizeof(float);
    return 0;
}

/* A whole 1-D tensor of n elements. */
static int ld_vector(loader *L, const char *name, uint64_t n, float **out)
{
    return ld_band(L, name, 0, n, 0, 1, 0, n, out);
}

/* Rows [first, +count) of a [rows, cols] matrix (a column-parallel shard). */
static int ld_rows(loader *L, const char *name, uint64_t rows, uint64_t cols, uint64_t first,
                   uint64_t count, float **out)
{
    return ld_band(L, name, rows, cols, first, count, 0, cols, out);
}

/*
 * An RMSNorm weight vector. Gemma's checkpoints store w for a norm that multiplies by
 * (1 + w): 1 is added here for a Hugging Face file (llama.cpp's converter added it to a
 * GGUF file already).
 */
static int ld_norm(loader *L, const gang_model *m, const char *name, uint64_t n, float **out)
{
    int rc = ld_vector(L, name, n, out);

    if (rc == 0 && m->cfg.norm_plus_one && !L->is_gguf)
        for (uint64_t i = 0; i < n; i++)
            (*out)[i] += 1.0f;
    return rc;
}

/*
 * A GGUF file's rope_freqs.weight into L->rope_factors, once per load: head_dim / 2
 * factors, each finite and > 0 (llama.cpp divides theta by them). Not counted as weights.
 */
static int ld_rope_factors(loader *L, const gang_model *m)
{
    uint64_t half = m->cfg.head_dim / 2;
    int rc = ld_vector(L, "rope_freqs.weight", half, &L->rope_factors);

    if (rc != 0)
        return rc;
    L->bytes -= half * sizeof(float); /* a table, not a weight this rank keeps */
    for (uint64_t i = 0; i < half; i++) {
        if (!(L->rope_factors[i] > 0.0f) || !isfinite(L->rope_factors[i])) {
            gang_set_err(L->err, L->errlen,
                         "%s: tensor rope_freqs.weight[%llu] = %g is not a positive factor",
                         L->gg.path, (unsigned long long)i, (double)L->rope_factors[i]);
            return GANG_EMODEL;
        }
    }
    return 0;
}

/*
 * The model's RoPE table (rope_scaling applied, or a GGUF file's factors) and attention
 * factor into layer l; a Gemma 3 local layer gets plain RoPE of base rope_local_theta.
 */
static int ld_rope(loader *L, const gang_model *m, gang_tp_layer *l)
{
    int rc;

    l->rope_freq = malloc((m->cfg.head_dim / 2 + 1) * sizeof(float));
    if (l->rope_freq == NULL)
        return GANG_ENOMEM;
    if (l->window != 0 && m->cfg.rope_local_theta > 0.0f) {
        gang_model_config local = m->cfg;

        memset(&local.rope, 0, sizeof(local.rope));
        local.rope_theta = m->cfg.rope_local_theta;
        l->rope_theta = local.rope_theta;
        return gang_rope_inv_freq(&local, l->rope_freq, &l->rope_scale);
    }
    if (L->rope_factors != NULL) {
        rc = gang_rope_inv_freq(&m->cfg, l->rope_freq, &l->rope_scale);
        for (uint32_t i = 0; rc == 0 && i < m->cfg.head_dim / 2; i++)
            l->rope_freq[i] /= L->rope_factors[i];
        return rc;
    }
    if (m->cfg.rope.type == GANG_ROPE_DYNAMIC) {
        l->rope_dyn_factor = m->cfg.rope.factor;
        l->rope_dyn_orig = m->cfg.max_pos;
    }
    return gang_rope_inv_freq(&m->cfg, l->rope_freq, &l->rope_scale);
}

/* ld_band as the expert loader calls it (model/load-moe.c). */
static int ld_band_cb(void *ctx, const char *name, uint64_t rows, uint64_t cols, uint64_t row_first,
                      uint64_t row_count, uint64_t col_first, uint64_t col_count, float **out)
{
    return ld_band(ctx, name, rows, cols, row_first, row_count, col_first, col_count, out);
}

/*
 * *w (a block weight [n, kdim] of type t, the file's layout) replaced by the CPU kernels'
 * interleaved copy where they have one (gang_kernels_block_repack), unless the model is
 * for a device (L->keep_layout: its kernels read the file's blocks). The copy goes into
 * arena when one is given (a layer's matrices: m->warena, so that they sit on huge pages
 * in the order a step reads them), else into an allocation of its own. The file's blocks
 * are released here: an array of their own freed; a band that points into L's mapping has
 * its pages dropped (MADV_DONTNEED; ld_map_trim unmaps the file once nothing points into
 * it).
 */
static void ld_repack(loader *L, void **w, gang_kernels_wtype t, uint64_t n, uint64_t kdim,
                      gang_kernels_arena *arena)
{
    void *rp = L->keep_layout ? NULL : gang_kernels_block_repack(t, *w, n, kdim, arena);
    const uint8_t *b = L->gg.map, *p = *w;

    if (rp == NULL)
        return;
    L->repacked = 1;
    if (b != NULL && p >= b && (uint64_t)(p - b) < L->gg.file_size)
        gang__gguf_map_advise(b, (uint64_t)(p - b), gang_kernels_weight_bytes(t, n, kdim),
                              MADV_DONTNEED);
    else
        free(*w);
    *w = rp;
}

/*
 * Matrix j (gang_tp_layer.mtype's order) of layer l, rows [first, +count) of a [rows,
 * cols] tensor or with by_cols its columns: the file's blocks when L->blocks and the band
 * allows (gang__gguf_band_blocks), else f32, with a warning when the TP cut was why.
 */
static int ld_matrix(loader *L, gang_tp_layer *l, int j, const char *name, uint64_t rows,
                     uint64_t cols, int by_cols, uint64_t first, uint64_t count, void **out)
{
    uint64_t rf = by_cols ? 0 : first, rn = by_cols ? rows : count;
    uint64_t cf = by_cols ? first : 0, cn = by_cols ? count : cols;
    char why[256];

    if (L->blocks) {
        int rc = gang__gguf_band_blocks(&L->gg, L->hf, name, rows, cols, rf, rn, cf, cn, out,
                                        &l->mtype[j], why, sizeof(why), &L->bytes);
        if (rc != 0) {
            gang_set_err(L->err, L->errlen, "%s: %s", L->gg.path, why[0] ? why : "out of memory");
            return rc;
        }
        l->mixed = 1;
        if (*out != NULL) {
            ld_repack(L, out, l->mtype[j], rn, cn, L->arena);
            return 0;
        }
        l->mtype[j] = GANG_KW_F32;
        if (why[0] != '\0')
            gang_warn("%s: %s: this tensor is dequantized to f32", L->gg.path, why);
    }
    return ld_band(L, name, rows, cols, rf, rn, cf, cn, (float **)out);
}

int gang__model_in_map(const gang_model *m, const void *p)
{
    const char *b = m->wmap, *q = p;

    return b != NULL && q != NULL && q >= b && (size_t)(q - b) < m->wmap_len;
}

/* Forgets l's matrices that point into m's mapping or lie in its arena (m->warena), before
 * gang_tp_layer_free; returns how many pointed into the mapping. */
static int ld_unhook(const gang_model *m, gang_tp_layer *l)
{
    void **const mats[7] = {&l->wq, &l->wk, &l->wv, &l->wo, &l->w_gate, &l->w_up, &l->w_down};
    int n = 0;

    for (int j = 0; j < 7; j++)
        if (gang__model_in_map(m, *mats[j])) {
            *mats[j] = NULL;
            n++;
        } else if (gang_kernels_arena_owns(m->warena, *mats[j])) {
            *mats[j] = NULL;
        }
    return n;
}

/* Loads this rank's shard of decoder layer li into *l (zeroed and owning nothing on error). */
static int ld_layer(loader *L, const gang_model *m, uint32_t li, gang_tp_layer *l)
{
    const gang_tp_shard *s = &m->shard;
    uint64_t hidden = m->cfg.hidden, hd = m->cfg.head_dim, ffn = m->cfg.ffn;
    uint64_t q_dim = (uint64_t)m->cfg.n_heads * hd, kv_dim = (uint64_t)m->cfg.n_kv_heads * hd;
    uint64_t q_first = (uint64_t)s->head_first * hd, q_rows = (uint64_t)s->head_count * hd;
    uint64_t kv_first = (uint64_t)s->kv_head_first * hd, kv_rows = (uint64_t)s->kv_head_count * hd;
    char name[128];
    int rc;

    memset(l, 0, sizeof(*l));
    l->shard = *s;
    l->window = gang_model_layer_window(&m->cfg, li);
    l->act = m->cfg.act;
    l->tp = m->topo.tp;
    l->hidden = m->cfg.hidden;
    l->head_dim = m->cfg.head_dim;
    l->rope_theta = m->cfg.rope_theta;
    l->norm_eps = m->cfg.rms_eps;

#define LD_NAME(suffix) (snprintf(name, sizeof(name), "model.layers.%u.%s", li, suffix), name)
    rc = ld_norm(L, m, LD_NAME("input_layernorm.weight"), hidden, &l->attn_norm);
    if (rc == 0)
        rc = ld_matrix(L, l, 0, LD_NAME("self_attn.q_proj.weight"), q_dim, hidden, 0, q_first,
                       q_rows, &l->wq);
    if (rc == 0)
        rc = ld_matrix(L, l, 1, LD_NAME("self_attn.k_proj.weight"), kv_dim, hidden, 0, kv_first,
                       kv_rows, &l->wk);
    if (rc == 0)
        rc = ld_matrix(L, l, 2, LD_NAME("self_attn.v_proj.weight"), kv_dim, hidden, 0, kv_first,
                       kv_rows, &l->wv);
    if (rc == 0)
        rc = ld_matrix(L, l, 3, LD_NAME("self_attn.o_proj.weight"), hidden, q_dim, 1, q_first,
                       q_rows, &l->wo);
    if (rc == 0 && m->cfg.attn_bias) {
        /* A bias is one row per output feature: it is cut like the rows of its weight. */
        rc = ld_band(L, LD_NAME("self_attn.q_proj.bias"), 0, q_dim, 0, 1, q_first, q_rows, &l->bq);
        if (rc == 0)
            rc = ld_band(L, LD_NAME("self_attn.k_proj.bias"), 0, kv_dim, 0, 1, kv_first, kv_rows,
                         &l->bk);
        if (rc == 0)
            rc = ld_band(L, LD_NAME("self_attn.v_proj.bias"), 0, kv_dim, 0, 1, kv_first, kv_rows,
                         &l->bv);
    }
    if (rc == 0 && m->cfg.qk_norm) {
        /* Qwen3, Gemma 3: per-head norms, the same on every TP rank. */
        rc = ld_norm(L, m, LD_NAME("self_attn.q_norm.weight"), hd, &l->q_norm);
        if (rc == 0)
            rc = ld_norm(L, m, LD_NAME("self_attn.k_norm.weight"), hd, &l->k_norm);
        /* Gemma's query_pre_attn_scalar: q scaled through its norm (RoPE is linear). */
        for (uint64_t i = 0; rc == 0 && m->cfg.q_scale > 0.0f && i < hd; i++)
            l->q_norm[i] *= m->cfg.q_scale;
    }
    if (rc == 0)
        rc = ld_rope(L, m, l);
    if (rc == 0 && m->cfg.post_norms) {
        /* Gemma: post_attention_layernorm is the attention output's own norm, the MLP's
         * input norm is pre_feedforward_layernorm. */
        rc = ld_norm(L, m, LD_NAME("post_attention_layernorm.weight"), hidden, &l->post_attn_norm);
        if (rc == 0)
            rc = ld_norm(L, m, LD_NAME("post_feedforward_layernorm.weight"), hidden,
                         &l->post_mlp_norm);
        if (rc == 0)
            rc = ld_norm(L, m, LD_NAME("pre_feedforward_layernorm.weight"), hidden, &l->mlp_norm);
    } else if (rc == 0) {
        rc = ld_norm(L, m, LD_NAME("post_attention_layernorm.weight"), hidden, &l->mlp_norm);
    }
    if (rc == 0 && gang_model_layer_moe(&m->cfg, li)) { /* experts instead of the MLP */
        rc = gang__load_moe(m, li, L->ep, ld_band_cb, L, l, L->err, L->errlen);
        goto out_done;
    }
    if (rc == 0)
        rc = ld_matrix(L, l, 4, LD_NAME("mlp.gate_proj.weight"), ffn, hidden, 0, s->ffn_first,
                       s->ffn_count, &l->w_gate);
    if (rc == 0)
        rc = ld_matrix(L, l, 5, LD_NAME("mlp.up_proj.weight"), ffn, hidden, 0, s->ffn_first,
                       s->ffn_count, &l->w_up);
    if (rc == 0)
        rc = ld_matrix(L, l, 6, LD_NAME("mlp.down_proj.weight"), hidden, ffn, 1, s->ffn_first,
                       s->ffn_count, &l->w_down);
#undef LD_NAME
out_done:
    if (rc != 0) {
        ld_unhook(m, l);
        gang_tp_layer_free(l);
    }
    return rc;
}

/* The layout must have been built from this very config (same shape fields). */
static int ld_check_layout(const gang_model_config *c, const gang_topology *t, const char *dir,
                           char *err, size_t errlen)
{
    if (t->n_layers == c->n_layers && t->n_heads == c->n_heads && t->n_kv_heads == c->n_kv_heads &&
        t->ffn == c->ffn && t->hidden == c->hidden && t->vocab == c->vocab &&
        t->head_dim == c->head_dim)
        return 0;
    gang_set_err(err, errlen,
                 "%s%s: layers %u, heads %u, kv heads %u, ffn %u, hidden %u, vocab "
                 "%u differ from the layout's %u, %u, %u, %u, %u, %u",
                 dir, gang__gguf_is_path(dir) ? "" : "/config.json", c->n_layers, c->n_heads,
                 c->n_kv_heads, c->ffn, c->hidden, c->vocab, t->n_layers, t->n_heads, t->n_kv_heads,
                 t->ffn, t->hidden, t->vocab);
    return GANG_EMODEL;
}

/* Rows [first, +count) of the embedding table or LM head as the file's blocks when
 * L->blocks allows (*out stays NULL otherwise: the caller reads f32), *type their type. */
static int ld_end_blocks(loader *L, const char *name, uint64_t vocab, uint64_t first,
                         uint64_t count, void **out, gang_kernels_wtype *type)
{
    char why[256];
    int rc;

    *out = NULL;
    if (!L->blocks)
        return 0;
    rc = gang__gguf_band_blocks(&L->gg, L->hf, name, vocab, L->hf->hidden, first, count, 0,
                                L->hf->hidden, out, type, why, sizeof(why), &L->bytes);
    if (rc != 0)
        gang_set_err(L->err, L->errlen, "%s: %s", L->gg.path, why[0] ? why : "out of memory");
    return rc;
}

/* Stage 0's embedding and the last stage's final norm and LM-head rows. */
static int ld_ends(loader *L, gang_model *m)
{
    uint64_t hidden = m->cfg.hidden, vocab = m->cfg.vocab;
    const char *head = m->cfg.tie_embeddings ? "model.embed_tokens.weight" : "lm_head.weight";
    int rc = 0;

    float *arr = NULL;

    if (m->place.pp_stage == 0) {
        rc = ld_end_blocks(L, "model.embed_tokens.weight", vocab, 0, vocab, &m->embed, &m->wtype);
        if (rc == 0 && m->embed == NULL)
            rc = ld_rows(L, "model.embed_tokens.weight", vocab, hidden, 0, vocab, &arr);
        if (arr != NULL)
            m->embed = arr;
    }
    if (rc == 0 && m->place.pp_stage == m->topo.pp - 1) {
        rc = ld_norm(L, m, "model.norm.weight", hidden, &m->final_norm);
        arr = NULL;
        if (rc == 0 && m->cfg.tie_embeddings && m->embed != NULL) {
            /* Tied and this rank holds the table (pp 1): its head is the table's rows,
             * not a second copy of them (SmolLM2's table is a fifth of its weights). */
            m->lm_head_tied = 1;
            /* Repacked only when the head is the whole table (its matmul then sees the
             * table's own sizes); the embedding lookup reads the repacked rows too. */
            if (m->blocks && m->shard.vocab_first == 0 && m->shard.vocab_count == vocab)
                ld_repack(L, &m->embed, m->wtype, vocab, hidden, NULL);
            m->lm_head = gang__model_tied_head(m);
            return 0;
        }
        if (rc == 0)
            rc = ld_end_blocks(L, head, vocab, m->shard.vocab_first, m->shard.vocab_count,
                               &m->lm_head, &m->head_type);
        if (rc == 0 && m->lm_head != NULL)
            ld_repack(L, &m->lm_head, m->head_type, m->shard.vocab_count, hidden, NULL);
        if (rc == 0 && m->lm_head == NULL)
            rc = ld_rows(L, head, vocab, hidden, m->shard.vocab_first, m->shard.vocab_count, &arr);
        if (arr != NULL)
            m->lm_head = arr;
    }
    return rc;
}

int gang_model_load(const char *dir, const gang_topology *t, uint32_t rank, gang_model **out,
                    char *err, size_t errlen)
{
    return gang_model_load_ex(dir, t, rank, NULL, out, err, errlen);
}

/*
 * The weight storage of options o (NULL: f32) for a model of config c (NULL: the flags
 * are only checked): --quantize int8 wins over --dtype; "auto" is the checkpoint's torch_dtype for
 * safetensors (F32, BF16 or F16: nothing is rounded) and f32 for a GGUF file (its quantized tensors
 * are dequantized).
 */
static int ld_storage(const gang_load_options *o, const gang_model_config *c, int is_gguf,
                      gang_kernels_wtype *out, char *err, size_t errlen)
{
    const char *dt = o == NULL ? "f32" : o->dtype != NULL ? o->dtype : "auto";
    const char *q = o != NULL && o->quantize != NULL ? o->quantize : "none";

    if (strcmp(q, "int8") == 0) {
        *out = GANG_KW_I8;
    } else if (strcmp(q, "none") != 0) {
        gang_set_err(err, errlen, "--quantize %s: not one of none, int8", q);
        return GANG_EINVAL;
    }
    if (strcmp(dt, "f32") == 0)
        *out = GANG_KW_F32;
    else if (strcmp(dt, "bf16") == 0)
        *out = GANG_KW_BF16;
    else if (strcmp(dt, "f16") == 0)
        *out = GANG_KW_F16;
    else if (strcmp(dt, "auto") == 0)
        *out = is_gguf || c == NULL          ? GANG_KW_F32
               : c->dtype == GANG_DTYPE_BF16 ? GANG_KW_BF16
               : c->dtype == GANG_DTYPE_F16  ? GANG_KW_F16
                                             : GANG_KW_F32;
    else {
        gang_set_err(err, errlen, "--dtype %s: not one of auto, f32, bf16, f16", dt);
        return GANG_EINVAL;
    }
    if (strcmp(q, "int8") == 0)
        *out = GANG_KW_I8;
    return 0;
}

/* A decoder layer's seven matrices into the storage t, with the byte count kept. */
static int ld_pack_layer(loader *L, gang_kernels_wtype t, gang_tp_layer *l)
{
    size_t f32 = gang_tp_layer_weight_bytes(l);
    int rc;

    if (t == GANG_KW_F32)
        return 0;
    rc = gang_tp_layer_pack(l, t);
    if (rc != 0) {
        gang_set_err(L->err, L->errlen, "a layer's weights cannot be stored as %s%s",
                     gang_kernels_wtype_name(t), rc == GANG_EINVAL ? " (not finite)" : "");
        return rc == GANG_EINVAL ? GANG_EMODEL : rc;
    }
    L->bytes += gang_tp_layer_weight_bytes(l);
    L->bytes -= f32;
    return 0;
}

/*
 * Maps L's GGUF file for m (m->wmap owns it from here, so that every error path's
 * gang_model_free unmaps it) and lets the band reads point into it. A file that cannot be
 * mapped is read as with --no-mmap, with a warning that says why.
 */
static void ld_map(loader *L, gang_model *m)
{
    char why[256];

    if (gang__gguf_map(&L->gg, &m->wmap, why, sizeof(why)) != 0) {
        gang_warn("%s; its blocks are read instead (as --no-mmap does)", why);
        return;
    }
    m->wmap_len = (size_t)L->gg.file_size;
    L->gg.map = (uint8_t *)m->wmap;
}

/* The mapping goes when nothing of the shard points into it (every matrix a copy). */
static void ld_map_trim(gang_model *m)
{
    int used =
        gang__model_in_map(m, m->embed) || (!m->lm_head_tied && gang__model_in_map(m, m->lm_head));

    for (uint32_t i = 0; !used && m->layers != NULL && i < m->layer_count; i++) {
        gang_tp_layer l = m->layers[i]; /* a copy: only counted */
        used = ld_unhook(m, &l) > 0;
    }
    if (m->wmap != NULL && !used) {
        munmap(m->wmap, m->wmap_len);
        m->wmap = NULL;
        m->wmap_len = 0;
    }
}

void gang_model_release_mapped(const gang_model *m, const void *p, size_t n)
{
    if (m == NULL || !gang__model_in_map(m, p) ||
        n > m->wmap_len - (size_t)((const char *)p - (const char *)m->wmap))
        return;
    gang__gguf_map_advise(m->wmap, (uint64_t)((const char *)p - (const char *)m->wmap), n,
                          MADV_DONTNEED);
}

int gang_model_load_ex(const char *dir, const gang_topology *t, uint32_t rank,
                       const gang_load_options *o, gang_model **out, char *err, size_t errlen)
{
    gang_model *m;
    gang_kernels_wtype wt;
    loader L;
    uint32_t i;
    int rc;

    if (err != NULL && errlen > 0)
        err[0] = '\0';
    if (out != NULL)
        *out = NULL;
    if (dir == NULL || t == NULL || out == NULL || rank >= t->world_size)
        return GANG_EINVAL;
    rc = ld_storage(o, NULL, 0, &wt, err, errlen); /* the flags, before any file is read */
    if (rc != 0)
        return rc;
    m = calloc(1, sizeof(*m));
    if (m == NULL)
        return GANG_ENOMEM;
    memset(&L, 0, sizeof(L));
    L.t = t;
    L.ep = o != NULL && o->ep > 1 ? o->ep : 1;
    L.err = err;
    L.errlen = errlen;

    rc = gang_model_config_read(dir, &m->cfg, err, errlen);
    if (rc != 0)
        goto out_free;
    rc = ld_check_layout(&m->cfg, t, dir, err, errlen);
    if (rc != 0)
        goto out_free;
    rc = gang_model_place(m, t, rank);
    if (rc != 0)
        goto out_free;

    L.is_gguf = gang__gguf_is_path(dir);
    L.hf = &m->cfg;
    if ((rc = ld_storage(o, &m->cfg, L.is_gguf, &wt, err, errlen)) != 0)
        goto out_free;
    /* --dtype auto on a GGUF file: its quantized tensors stay the file's blocks. */
    L.blocks = L.is_gguf && o != NULL && (o->dtype == NULL || strcmp(o->dtype, "auto") == 0) &&
               (o->quantize == NULL || strcmp(o->quantize, "none") == 0);
    m->blocks = L.blocks;
    L.keep_layout = o != NULL && o->keep_layout;
    /* Owned by the model from here (gang_model_free releases it on every path); without
     * one (memory out) each repacked matrix is an allocation of its own. */
    if (L.blocks && !L.keep_layout)
        L.arena = m->warena = gang_kernels_arena_new();
    rc = L.is_gguf ? gang__gguf_open(dir, &L.gg, err, errlen)
                   : gang__st_set_open(dir, &L.set, err, errlen);
    if (rc != 0)
        goto out_free;
    if (L.blocks && !o->no_mmap)
        ld_map(&L, m);
    if (L.is_gguf && m->cfg.rope_freq_factors && m->layer_count > 0) {
        rc = ld_rope_factors(&L, m);
        if (rc != 0)
            goto out_close;
    }
    for (i = 0; i < m->layer_count; i++) {
        rc = ld_layer(&L, m, m->layer_first + i, &m->layers[i]);
        if (rc == 0)
            rc = ld_pack_layer(&L, wt, &m->layers[i]);
        if (rc != 0)
            goto out_close;
    }
    rc = ld_ends(&L, m);
    if (rc != 0)
        goto out_close;
    /* The layers are packed already; this packs the embedding table and the LM head (a
     * GGUF file's blocks are stored as they are). */
    m->weight_bytes = L.bytes;
    m->repacked = L.repacked;
    rc = m->blocks ? 0 : gang_model_pack(m, wt);
    if (rc != 0) {
        gang_set_err(err, errlen, "the embedding table or LM head cannot be stored as %s%s",
                     gang_kernels_wtype_name(wt), rc == GANG_EINVAL ? " (not finite)" : "");
        rc = rc == GANG_EINVAL ? GANG_EMODEL : rc;
        goto out_close;
    }
    ld_map_trim(m);
    gang__model_storage_desc(m, m->storage, sizeof(m->storage));
    free(L.rope_factors);
    gang__st_set_close(&L.set);
    gang__gguf_close(&L.gg);
    *out = m;
    return 0;

out_close:
    free(L.rope_factors);
    gang__st_set_close(&L.set);
    gang__gguf_close(&L.gg);
out_free:
    gang_model_free(m);
    return rc;
}

/* A packed copy of the host f32 matrix src [rows, cols] in *out (NULL when src is). */
static int ld_pack_copy(gang_kernels_wtype t, const void *src, size_t rows, size_t cols, void **out)
{
    int rc;

    *out = NULL;
    if (src == NULL)
        return 0;
    /* Streamed whole by every LM-head matmul: huge pages where the host gives them. */
    *out = gang_kernels_weight_host_alloc(gang_kernels_weight_bytes(t, rows, cols));
    if (*out == NULL)
        return GANG_ENOMEM;
    rc = gang_kernels_weight_pack(t, src, rows, cols, *out);
    if (rc != 0) {
        free(*out);
        *out = NULL;
    }
    return rc;
}

int gang_model_pack(gang_model *m, gang_kernels_wtype t)
{
    void *embed = NULL, *head = NULL;
    size_t hidden, before, vocab;
    uint32_t i;
    int rc;

    if (m == NULL || (unsigned)t > GANG_KW_I8)
        return GANG_EINVAL;
    if (t == m->wtype)
        return 0;
    if (m->wtype != GANG_KW_F32 || m->mem != NULL)
        return GANG_EINVAL;
    for (i = 0; m->layers != NULL && i < m->layer_count; i++) {
        if (m->layers[i].wtype == t)
            continue;
        before = gang_tp_layer_weight_bytes(&m->layers[i]);
        if ((rc = gang_tp_layer_pack(&m->layers[i], t)) != 0)
            return rc;
        m->weight_bytes = m->weight_bytes + gang_tp_layer_weight_bytes(&m->layers[i]) - before;
    }
    /* The same sizes as gang_model_to_device's. */
    hidden = m->cfg.hidden != 0 ? m->cfg.hidden : m->topo.hidden;
    vocab = m->topo.vocab;
    rc = ld_pack_copy(t, m->embed, vocab, hidden, &embed);
    if (rc == 0 && !m->lm_head_tied)
        rc = ld_pack_copy(t, m->lm_head, m->shard.vocab_count, hidden, &head);
    if (rc != 0) {
        free(embed);
        return rc;
    }
    if (embed != NULL) {
        m->weight_bytes = m->weight_bytes + gang_kernels_weight_bytes(t, vocab, hidden) -
                          vocab * hidden * sizeof(float);
        free(m->embed);
        m->embed = embed;
    }
    if (head != NULL) {
        m->weight_bytes = m->weight_bytes +
                          gang_kernels_weight_bytes(t, m->shard.vocab_count, hidden) -
                          (size_t)m->shard.vocab_count * hidden * sizeof(float);
        free(m->lm_head);
        m->lm_head = head;
    }
    m->wtype = t;
    if (m->lm_head_tied) /* the same rows, now in the packed table */
        m->lm_head = gang__model_tied_head(m);
    return 0;
}

/* The hidden size of m's rows (the config's, or the topology's for an in-memory model). */
static size_t ld_hidden(const gang_model *m)
{
    return m->cfg.hidden != 0 ? m->cfg.hidden : m->topo.hidden;
}

void *gang__model_tied_head(const gang_model *m)
{
    size_t row = gang_kernels_weight_row_bytes(m->wtype, ld_hidden(m));

    if (m->embed == NULL)
        return NULL;
    return (char *)m->embed + (size_t)m->shard.vocab_first * row;
}

gang_kernels_weight gang_model_head(const gang_model *m)
{
    gang_kernels_weight v = {GANG_KW_F32, NULL, NULL};
    size_t hidden, first;

    if (m == NULL)
        return v;
    hidden = ld_hidden(m);
    if (!m->lm_head_tied)
        return m->lm_head == NULL
                   ? v
                   : gang_kernels_weight_view(m->blocks ? m->head_type : m->wtype, m->lm_head,
                                              m->shard.vocab_count, hidden);
    if (m->embed == NULL) /* tied: the head is where the table is */
        return v;
    v = gang_kernels_weight_view(m->wtype, m->embed, m->topo.vocab, hidden);
    first = m->shard.vocab_first;
    v.data = gang__model_tied_head(m);
    if (v.scales != NULL)
        v.scales += first;
    return v;
}

int gang_model_place(gang_model *m, const gang_topology *t, uint32_t rank)
{
    int rc;

    if (m == NULL || t == NULL)
        return GANG_EINVAL;
    m->topo = *t;
    rc = gang_topology_rank(t, rank, &m->place);
    if (rc == 0)
        rc = gang_topology_tp_shard(t, m->place.tp_rank, &m->shard);
    if (rc == 0)
        rc = gang_topology_stage_layers(t, m->place.pp_stage, &m->layer_first, &m->layer_count);
    if (rc != 0)
        return rc;
    m->layers = calloc(m->layer_count, sizeof(*m->layers));
    return m->layers == NULL ? GANG_ENOMEM : 0;
}

void gang_model_free(gang_model *m)
{
    uint32_t i;

    if (m == NULL)
        return;
    gang_model_device_release(m); /* device arrays back to their pool (no-op on the host) */
    if (m->layers != NULL) {
        for (i = 0; i < m->layer_count; i++) {
            ld_unhook(m, &m->layers[i]);
            gang_tp_layer_free(&m->layers[i]);
        }
        free(m->layers);
    }
    if (!gang__model_in_map(m, m->embed))
        free(m->embed);
    free(m->final_norm);
    if (!m->lm_head_tied && !gang__model_in_map(m, m->lm_head))
        free(m->lm_head);
    if (m->wmap != NULL)
        munmap(m->wmap, m->wmap_len);   /* after every array that pointed into it went */
    gang_kernels_arena_free(m->warena); /* the same, for the layers' repacked matrices */
    free(m);
}
