/*
 * One rank's band of a weight out of a GGUF file, by its Hugging Face name (the loader,
 * model/load.c, asks for Hugging Face names whatever the source).
 *
 * llama.cpp's converter permutes the rows of q_proj and k_proj within each head so that
 * its RoPE, which rotates adjacent pairs (x[2i], x[2i+1]), computes what transformers'
 * rotate_half computes on the halves (x[i], x[i + d/2]): Hugging Face row a * d/2 + b
 * (a in {0, 1}, b < d/2) of a head is GGUF row 2b + a of that head. Bands of q and k
 * rows are whole heads (the Megatron split cuts by heads), so the band is read as it
 * lies in the file and each head is put back in place.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ganglion/model.h"
#include "gguf.h"

/* Hugging Face order of the rows of each head of a band of rows x cols (head_dim rows a
 * head). Returns 0 or GANG_ENOMEM. */
static int gguf_unpermute(float *w, uint64_t rows, uint64_t cols, uint32_t head_dim)
{
    uint64_t h, a, b, half = head_dim / 2, per = (uint64_t)head_dim * cols;
    float *tmp = malloc((size_t)per * sizeof(float));

    if (tmp == NULL)
        return GANG_ENOMEM;
    for (h = 0; h < rows / head_dim; h++) {
        float *head = w + h * per;
        memcpy(tmp, head, (size_t)per * sizeof(float));
        for (a = 0; a < 2; a++)
            for (b = 0; b < half; b++)
                memcpy(head + (a * half + b) * cols, tmp + (2 * b + a) * cols,
                       (size_t)cols * sizeof(float));
    }
    free(tmp);
    return 0;
}

/* Whether hf_name ends with suffix. */
static int ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

int gang__gguf_moe_name(const char *hf, char *out, size_t cap, int64_t *expert)
{
    static const char *const map[][2] = {
        {"mlp.gate.weight", "ffn_gate_inp.weight"},
        {"block_sparse_moe.gate.weight", "ffn_gate_inp.weight"},
        {"mlp.shared_expert.gate_proj.weight", "ffn_gate_shexp.weight"},
        {"mlp.shared_expert.up_proj.weight", "ffn_up_shexp.weight"},
        {"mlp.shared_expert.down_proj.weight", "ffn_down_shexp.weight"},
        {"mlp.shared_expert_gate.weight", "ffn_gate_inp_shexp.weight"}};
    static const char *const proj[][2] = {{"gate_proj", "ffn_gate_exps"}, {"w1", "ffn_gate_exps"},
                                          {"up_proj", "ffn_up_exps"},     {"w3", "ffn_up_exps"},
                                          {"down_proj", "ffn_down_exps"}, {"w2", "ffn_down_exps"}};
    unsigned layer, e;
    int used = 0, at = 0;
    char what[16];

    if (expert != NULL)
        *expert = -1;
    if (sscanf(hf, "model.layers.%u.%n", &layer, &used) != 1 || used == 0)
        return GANG_ENOENT;
    for (size_t i = 0; i < sizeof(map) / sizeof(map[0]); i++)
        if (strcmp(hf + used, map[i][0]) == 0)
            return snprintf(out, cap, "blk.%u.%s", layer, map[i][1]) < (int)cap ? 0 : GANG_ENOENT;
    if (sscanf(hf + used, "mlp.experts.%u.%15[a-z_0-9].weight%n", &e, what, &at) != 2 &&
        sscanf(hf + used, "block_sparse_moe.experts.%u.%15[a-z_0-9].weight%n", &e, what, &at) != 2)
        return GANG_ENOENT;
    if (at == 0 || hf[used + at] != '\0')
        return GANG_ENOENT;
    for (size_t i = 0; i < sizeof(proj) / sizeof(proj[0]); i++) {
        if (strcmp(what, proj[i][0]) != 0)
            continue;
        if (expert != NULL)
            *expert = e;
        return snprintf(out, cap, "blk.%u.%s.weight", layer, proj[i][1]) < (int)cap ? 0
                                                                                    : GANG_ENOENT;
    }
    return GANG_ENOENT;
}

/*
 * A MoE tensor whose GGUF form differs from the Hugging Face one: expert e's [rows, cols]
 * projection is rows [e rows, (e + 1) rows) of the 3-D ffn_*_exps [cols, rows, experts]
 * (ne order), and the shared expert's gate [1, cols] is the 1-D ffn_gate_inp_shexp [cols].
 * *t and *row_first are set for gang__gguf_read; 1 when hf_name is one of them, 0 when
 * it is not (the caller goes on as usual), or GANG_EMODEL for a shape that does not fit.
 */
static int gguf_moe_band(const gang__gguf *g, const char *hf_name, uint64_t rows, uint64_t cols,
                         const gang__gguf_tensor **t, uint64_t *row_first, char *err, size_t errlen)
{
    char name[160];
    int64_t e = -1;

    if (gang__gguf_moe_name(hf_name, name, sizeof(name), &e) != 0)
        return 0;
    *t = gang__gguf_find(g, name);
    if (e < 0 && !(rows == 1 && *t != NULL && (*t)->n_dims == 1))
        return 0; /* the router and the shared expert's matrices: as any matrix */
    if (*t == NULL) {
        gang_set_err(err, errlen, "%s: tensor %s (for %s) is missing", g->path, name, hf_name);
        return GANG_EMODEL;
    }
    if (e < 0) /* the shared expert's gate: [cols] read as one row */
        return (*t)->ne[0] == cols ? 1 : GANG_EMODEL;
    if ((*t)->n_dims != 3 || (*t)->ne[0] != cols || (*t)->ne[1] != rows ||
        (uint64_t)e >= (*t)->ne[2]) {
        gang_set_err(err, errlen,
                     "%s: tensor %s has ne [%llu, %llu, %llu], expert %lld of [%llu, %llu] "
                     "does not fit it",
                     g->path, name, (unsigned long long)(*t)->ne[0],
                     (unsigned long long)(*t)->ne[1], (unsigned long long)(*t)->ne[2], (long long)e,
                     (unsigned long long)cols, (unsigned long long)rows);
        return GANG_EMODEL;
    }
    *row_first += (uint64_t)e * rows;
    return 1;
}

int gang__gguf_band(const gang__gguf *g, const gang_model_config *cfg, const char *hf_name,
                    uint64_t rows, uint64_t cols, uint64_t row_first, uint64_t row_count,
                    uint64_t col_first, uint64_t col_count, float **out, char *err, size_t errlen,
                    size_t *bytes)
{
    const gang__gguf_tensor *t = NULL;
    uint64_t want_rows = rows == 0 ? 1 : rows;
    char name[160];
    int rc, permuted;

    *out = NULL;
    rc = gguf_moe_band(g, hf_name, rows == 0 ? 1 : rows, cols, &t, &row_first, err, errlen);
    if (rc < 0)
        return rc;
    if (rc == 1) { /* an expert's rows of its layer's 3-D tensor, or a 1-D gate */
        permuted = 0;
        goto out_read;
    }
    t = NULL;
    if (gang__gguf_hf_name((int)cfg->arch, hf_name, name, sizeof(name)) == 0)
        t = gang__gguf_find(g, name);
    if (t == NULL) {
        gang_set_err(err, errlen, "%s: tensor %s (for %s) is missing", g->path,
                     gang__gguf_hf_name((int)cfg->arch, hf_name, name, sizeof(name)) == 0 ? name
                                                                                          : "?",
                     hf_name);
        return GANG_EMODEL;
    }
    if (t->ne[0] != cols || t->rows != want_rows || t->n_dims != (rows == 0 ? 1u : 2u)) {
        char want_s[64];
        if (rows == 0)
            snprintf(want_s, sizeof(want_s), "[%llu]", (unsigned long long)cols);
        else
            snprintf(want_s, sizeof(want_s), "[%llu, %llu]", (unsigned long long)cols,
                     (unsigned long long)rows);
        gang_set_err(err, errlen,
                     "%s: tensor %s has ne [%llu, %llu, %llu, %llu], the metadata "
                     "implies %s",
                     g->path, name, (unsigned long long)t->ne[0], (unsigned long long)t->ne[1],
                     (unsigned long long)t->ne[2], (unsigned long long)t->ne[3], want_s);
        return GANG_EMODEL;
    }
    if (rows == 0)
        row_count = 1;
    permuted = cfg->arch == GANG_ARCH_LLAMA &&
               (ends_with(hf_name, "q_proj.weight") || ends_with(hf_name, "k_proj.weight"));
    if (permuted && (row_first % cfg->head_dim != 0 || row_count % cfg->head_dim != 0 ||
                     col_first != 0 || col_count != cols)) {
        gang_set_err(err, errlen, "%s: tensor %s: a band that is not whole heads", g->path, name);
        return GANG_EINTERNAL;
    }
out_read:
    gang_strlcpy(name, t->name, sizeof(name));
    if (rows == 0)
        row_count = 1;
    *out = malloc((size_t)(row_count * col_count) * sizeof(float));
    if (*out == NULL)
        return GANG_ENOMEM;
    rc = gang__gguf_read(g, t, row_first, row_count, col_first, col_count, *out);
    if (rc == 0 && permuted)
        rc = gguf_unpermute(*out, row_count, cols, cfg->head_dim);
    if (rc != 0) {
        if (rc == GANG_EIO)
            gang_set_err(err, errlen, "%s: tensor %s: read failed (the file changed or shrank?)",
                         g->path, name);
        free(*out);
        *out = NULL;
        return rc == GANG_EIO ? GANG_EMODEL : rc;
    }
    *bytes += (size_t)(row_count * col_count) * sizeof(float);
    return 0;
}
