/*
 * Tensor-parallel layers, the shards (include/ganglion/parallel.h): cutting one rank's
 * shard of a decoder layer out of the full matrices on the host (gang_tp_layer_init),
 * packing its matrices into their weight storage in one huge-page block
 * (gang_tp_layer_pack), moving it into a kernels handle's tensor memory
 * (gang_tp_layer_to_device) and releasing it. The forward pass over a shard is
 * tp-layers.c's.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ganglion/parallel.h"

/* ---------------------------------------------------------------------------------
 * Shards of a layer
 * --------------------------------------------------------------------------------- */
/* The layer's arrays, in a fixed order, for the loops of free, pack and to_device: the
 * seven matrices and the two concatenated ones of a device (TP_LAYER_MATRICES of them,
 * rows x cols each), then the f32 vectors. bytes[] is each array's size in its storage. */
#define TP_LAYER_ARRAYS 19
#define TP_LAYER_MATRICES 9

static void tp_layer_arrays(gang_tp_layer *l, void **a[TP_LAYER_ARRAYS],
                            size_t bytes[TP_LAYER_ARRAYS], size_t rows[TP_LAYER_MATRICES],
                            size_t cols[TP_LAYER_MATRICES])
{
    size_t hidden = l->hidden, q = (size_t)l->shard.head_count * l->head_dim;
    size_t kv = (size_t)l->shard.kv_head_count * l->head_dim, f = l->shard.ffn_count;
    size_t r[TP_LAYER_MATRICES] = {q, kv, kv, hidden, f, f, hidden, q + 2 * kv, 2 * f};
    size_t c[TP_LAYER_MATRICES] = {hidden, hidden, hidden, q, hidden, hidden, f, hidden, hidden};
    size_t i;

    a[0] = &l->wq, a[1] = &l->wk, a[2] = &l->wv, a[3] = &l->wo;
    a[4] = &l->w_gate, a[5] = &l->w_up, a[6] = &l->w_down;
    a[7] = &l->wqkv, a[8] = &l->wgu;
    for (i = 0; i < TP_LAYER_MATRICES; i++) {
        gang_kernels_wtype t = l->mixed && i < 7 ? l->mtype[i] : l->wtype;
        bytes[i] = gang_kernels_weight_bytes(t, r[i], c[i]);
        if (rows != NULL)
            rows[i] = r[i], cols[i] = c[i];
    }
    a[9] = (void **)&l->attn_norm, bytes[9] = hidden;
    a[10] = (void **)&l->mlp_norm, bytes[10] = hidden;
    a[11] = (void **)&l->bq, bytes[11] = q;
    a[12] = (void **)&l->bk, bytes[12] = kv;
    a[13] = (void **)&l->bv, bytes[13] = kv;
    a[14] = (void **)&l->q_norm, bytes[14] = l->head_dim;
    a[15] = (void **)&l->k_norm, bytes[15] = l->head_dim;
    a[16] = (void **)&l->rope_freq, bytes[16] = l->head_dim / 2;
    a[17] = (void **)&l->post_attn_norm, bytes[17] = hidden;
    a[18] = (void **)&l->post_mlp_norm, bytes[18] = hidden;
    for (i = TP_LAYER_MATRICES; i < TP_LAYER_ARRAYS; i++)
        bytes[i] *= sizeof(float);
}

void gang_tp_layer_free(gang_tp_layer *l)
{
    void **a[TP_LAYER_ARRAYS];
    size_t n[TP_LAYER_ARRAYS], i;

    if (l == NULL)
        return;
    tp_layer_arrays(l, a, n, NULL, NULL);
    for (i = 0; i < TP_LAYER_ARRAYS; i++) {
        if (l->mem != NULL)
            gang_kernels_free(l->mem, *a[i]);
        else if (i >= TP_LAYER_MATRICES || l->wblock == NULL)
            free(*a[i]); /* the matrices of a packed layer live in wblock */
    }
    free(l->wblock);
    gang_tp_moe_free(l->moe);
    memset(l, 0, sizeof(*l));
}

size_t gang_tp_layer_weight_bytes(const gang_tp_layer *l)
{
    void **a[TP_LAYER_ARRAYS];
    size_t n[TP_LAYER_ARRAYS], sum = 0;
    gang_tp_layer view;

    if (l == NULL)
        return 0;
    /* The walk hands out writable slots; a copy's slots hold the same pointers. */
    view = *l;
    tp_layer_arrays(&view, a, n, NULL, NULL);
    for (size_t i = 0; i < TP_LAYER_MATRICES; i++)
        if (*a[i] != NULL)
            sum += n[i];
    return sum + gang_tp_moe_weight_bytes(l->moe);
}

/*
 * The packed matrices go into one block, each at a 64-byte boundary: one allocation of a
 * few MiB that gang_kernels_weight_host_alloc can back with huge pages, where seven
 * matrices of 0.2-1.8 MiB each (SmolLM2) would each be too small for one.
 */
int gang_tp_layer_pack(gang_tp_layer *l, gang_kernels_wtype t)
{
    void **a[TP_LAYER_ARRAYS];
    size_t n[TP_LAYER_ARRAYS], rows[TP_LAYER_MATRICES], cols[TP_LAYER_MATRICES];
    size_t off[TP_LAYER_MATRICES], total = 0, b, i;
    char *block = NULL;
    int rc = 0;

    if (l == NULL || l->mem != NULL || (unsigned)t > GANG_KW_I8 || l->mixed)
        return GANG_EINVAL;
    if (t == l->wtype)
        return 0;
    if (l->wtype != GANG_KW_F32)
        return GANG_EINVAL;
    tp_layer_arrays(l, a, n, rows, cols);
    for (i = 0; i < TP_LAYER_MATRICES; i++) {
        off[i] = total;
        if (*a[i] == NULL)
            continue;
        b = gang_kernels_weight_bytes(t, rows[i], cols[i]);
        if (b == 0 || b > SIZE_MAX - 63 || (b = (b + 63) / 64 * 64) > SIZE_MAX - total)
            return GANG_EINVAL;
        total += b;
    }
    if (total == 0)
        goto out_set; /* no matrix: only the type changes */
    block = gang_kernels_weight_host_alloc(total);
    if (block == NULL)
        return GANG_ENOMEM;
    /* All or nothing, like to_device: the f32 arrays go only once every one is packed. */
    for (i = 0; i < TP_LAYER_MATRICES && rc == 0; i++)
        if (*a[i] != NULL)
            rc = gang_kernels_weight_pack(t, *a[i], rows[i], cols[i], block + off[i]);
    if (rc != 0) {
        free(block);
        return rc;
    }
    for (i = 0; i < TP_LAYER_MATRICES; i++) {
        if (*a[i] == NULL)
            continue;
        free(*a[i]);
        *a[i] = block + off[i];
    }
    l->wblock = block;
out_set:
    l->wtype = t;
    return 0;
}

/*
 * Uploads the host matrices parts[0 .. np) (rows[] each, cols columns, packed as l->wtype)
 * as one concatenated packed matrix into *out (tensor memory of k): the elements band
 * after band, and for int8 the scales band after band at the concatenation's scales
 * offset, so that gang_kernels_weight_view of the whole is the concatenated weight.
 */
static int tp_upload_concat(const gang_tp_layer *l, gang_kernels *k, void *const *parts,
                            const size_t *rows, size_t np, size_t cols, void **out)
{
    size_t es = gang_kernels_wtype_size(l->wtype), total = 0, r = 0, i;
    char *d = NULL;
    int rc;

    for (i = 0; i < np; i++)
        total += rows[i];
    rc = gang_kernels_alloc(k, gang_kernels_weight_bytes(l->wtype, total, cols), (void **)&d);
    for (i = 0; i < np && rc == 0; r += rows[i], i++) {
        rc = gang_kernels_upload(k, d + r * cols * es, parts[i], rows[i] * cols * es);
        if (rc == 0 && l->wtype == GANG_KW_I8)
            rc = gang_kernels_upload(k, d + GANG_KW_SCALES_OFFSET(total * cols) + r * sizeof(float),
                                     (const char *)parts[i] + GANG_KW_SCALES_OFFSET(rows[i] * cols),
                                     rows[i] * sizeof(float));
    }
    if (rc != 0) {
        gang_kernels_free(k, d);
        return rc;
    }
    *out = d;
    return 0;
}

/*
 * The concatenated q/k/v and gate/up of a device layer (when all their parts exist) into
 * dev[7] and dev[8], the slots of wqkv and wgu; *fused says which parts they replace.
 */
static int tp_concat_to_device(gang_tp_layer *l, gang_kernels *k, void *dev[TP_LAYER_ARRAYS],
                               int fused[TP_LAYER_MATRICES])
{
    size_t q = (size_t)l->shard.head_count * l->head_dim;
    size_t kv = (size_t)l->shard.kv_head_count * l->head_dim, f = l->shard.ffn_count;
    void *qkv[3] = {l->wq, l->wk, l->wv}, *gu[2] = {l->w_gate, l->w_up};
    size_t qkv_rows[3] = {q, kv, kv}, gu_rows[2] = {f, f};
    int rc = 0;

    if (qkv[0] != NULL && qkv[1] != NULL && qkv[2] != NULL && kv > 0) {
        rc = tp_upload_concat(l, k, qkv, qkv_rows, 3, l->hidden, &dev[7]);
        fused[0] = fused[1] = fused[2] = rc == 0;
    }
    if (rc == 0 && gu[0] != NULL && gu[1] != NULL && f > 0) {
        rc = tp_upload_concat(l, k, gu, gu_rows, 2, l->hidden, &dev[8]);
        fused[4] = fused[5] = rc == 0;
    }
    return rc;
}

int gang_tp_layer_to_device(gang_tp_layer *l, gang_kernels *k)
{
    void **a[TP_LAYER_ARRAYS], *dev[TP_LAYER_ARRAYS] = {0};
    int fused[TP_LAYER_MATRICES] = {0};
    size_t n[TP_LAYER_ARRAYS], i;
    int rc = 0;

    if (l == NULL || k == NULL)
        return GANG_EINVAL;
    if (l->mem == k)
        return 0;
    if (l->mem != NULL)
        return GANG_EINVAL;
    if (!(gang_kernels_caps(k) & GANG_KERNELS_CAP_DEVICE_MEM))
        return 0;
    /* The MoE block's weights first (all or nothing on their own): if a later upload of
     * the layer fails they stay on k, which gang_tp_layer_free releases them to. */
    if (l->moe != NULL && (rc = gang_tp_moe_to_device(l->moe, k)) != 0)
        return rc;
    tp_layer_arrays(l, a, n, NULL, NULL);
    /* All or nothing: the host arrays are released only once every upload succeeded. A
     * mixed layer (a GGUF file's blocks, each matrix its own type) is not concatenated:
     * its matrices move as they are, for the device's block kernels. */
    if (!l->mixed)
        rc = tp_concat_to_device(l, k, dev, fused);
    for (i = 0; i < TP_LAYER_ARRAYS && rc == 0; i++) {
        if (*a[i] == NULL || dev[i] != NULL || (i < TP_LAYER_MATRICES && fused[i]))
            continue;
        rc = gang_kernels_alloc(k, n[i], &dev[i]);
        if (rc == 0)
            rc = gang_kernels_upload(k, dev[i], *a[i], n[i]);
    }
    if (rc != 0) {
        for (i = 0; i < TP_LAYER_ARRAYS; i++)
            gang_kernels_free(k, dev[i]);
        return rc;
    }
    for (i = 0; i < TP_LAYER_ARRAYS; i++) {
        if (i >= TP_LAYER_MATRICES || l->wblock == NULL)
            free(*a[i]);
        *a[i] = dev[i]; /* a concatenated part: NULL */
    }
    free(l->wblock); /* the packed matrices' host block, now uploaded */
    l->wblock = NULL;
    l->mem = k;
    return 0;
}

/* Allocates n floats and copies them from src when src is not NULL; NULL src gives NULL. */
static int tp_dup(const float *src, size_t n, float **out)
{
    *out = NULL;
    if (src == NULL)
        return 0;
    *out = malloc(n * sizeof(float));
    if (*out == NULL)
        return GANG_ENOMEM;
    memcpy(*out, src, n * sizeof(float));
    return 0;
}

/*
 * Cuts one shard out of the row-major matrix src [rows, cols] into a new array *out: the
 * rows [first, first + count) (a column-parallel weight, or a bias as a one-column matrix)
 * when by_cols is 0, the columns [first, first + count) (a row-parallel weight) otherwise.
 * An absent optional tensor (src NULL) gives *out NULL. Returns 0, GANG_ENOMEM or the
 * slicing error; *out is NULL on error.
 */
static int tp_cut(const float *src, size_t rows, size_t cols, size_t first, size_t count,
                  int by_cols, float **out)
{
    int rc;

    *out = NULL;
    if (src == NULL)
        return 0;
    *out = malloc((by_cols ? rows : count) * (by_cols ? count : cols) * sizeof(float));
    if (*out == NULL)
        return GANG_ENOMEM;
    rc = by_cols ? gang_tp_slice_cols(src, rows, cols, first, count, *out)
                 : gang_tp_slice_rows(src, rows, cols, first, count, *out);
    if (rc != 0) {
        free(*out);
        *out = NULL;
    }
    return rc;
}

int gang_tp_layer_init(gang_tp_layer *l, const gang_topology *t, uint32_t tp_rank,
                       const gang_layer_weights *w, float rope_theta, float norm_eps)
{
    gang_tp_shard s;
    size_t hidden, hd, q_dim, kv_dim, q_rows, kv_rows;
    int rc;

    if (l == NULL)
        return GANG_EINVAL;
    memset(l, 0, sizeof(*l));
    if (t == NULL || w == NULL || w->wq == NULL || w->wk == NULL || w->wv == NULL ||
        w->wo == NULL || w->w_gate == NULL || w->w_up == NULL || w->w_down == NULL)
        return GANG_EINVAL;
    if (!(rope_theta > 0.0f) || !isfinite(rope_theta) || !(norm_eps >= 0.0f) || !isfinite(norm_eps))
        return GANG_EINVAL;
    rc = gang_topology_tp_shard(t, tp_rank, &s);
    if (rc != 0)
        return rc;

    hidden = t->hidden;
    hd = t->head_dim;
    q_dim = (size_t)t->n_heads * hd;
    kv_dim = (size_t)t->n_kv_heads * hd;
    q_rows = (size_t)s.head_count * hd;
    kv_rows = (size_t)s.kv_head_count * hd;
    l->shard = s;
    l->tp = t->tp;
    l->hidden = t->hidden;
    l->head_dim = t->head_dim;
    l->rope_theta = rope_theta;
    l->norm_eps = norm_eps;

    rc = tp_dup(w->attn_norm, hidden, &l->attn_norm);
    if (rc != 0)
        goto out_free;
    rc = tp_dup(w->mlp_norm, hidden, &l->mlp_norm);
    if (rc != 0)
        goto out_free;
    rc = tp_dup(w->q_norm, hd, &l->q_norm);
    if (rc == 0)
        rc = tp_dup(w->k_norm, hd, &l->k_norm);
    if (rc == 0)
        rc = tp_dup(w->post_attn_norm, hidden, &l->post_attn_norm);
    if (rc == 0)
        rc = tp_dup(w->post_mlp_norm, hidden, &l->post_mlp_norm);
    if (rc != 0)
        goto out_free;
    /* Plain RoPE's table; a model's scaling replaces it (gang_rope_inv_freq in model.h). */
    l->rope_scale = 1.0f;
    l->rope_freq = malloc((hd / 2 > 0 ? hd / 2 : 1) * sizeof(float));
    if (l->rope_freq == NULL) {
        rc = GANG_ENOMEM;
        goto out_free;
    }
    for (size_t i = 0; i < hd / 2; i++)
        l->rope_freq[i] = (float)(1.0 / pow((double)rope_theta, (double)(2 * i) / (double)hd));

    /* Attention: Q/K/V keep the rows of the rank's heads, o_proj the matching columns.
     * MLP: gate/up keep the rows of the rank's ffn columns, down the same columns.
     * Biases (Qwen2): a bias is a one-column matrix, cut like the rows of its weight. */
    size_t q_first = (size_t)s.head_first * hd, kv_first = (size_t)s.kv_head_first * hd;
    const struct {
        const float *src;
        size_t rows, cols, first, count;
        int by_cols;
        float **dst;
    } cuts[] = {
        {w->wq, q_dim, hidden, q_first, q_rows, 0, (float **)&l->wq},
        {w->wk, kv_dim, hidden, kv_first, kv_rows, 0, (float **)&l->wk},
        {w->wv, kv_dim, hidden, kv_first, kv_rows, 0, (float **)&l->wv},
        {w->wo, hidden, q_dim, q_first, q_rows, 1, (float **)&l->wo},
        {w->w_gate, t->ffn, hidden, s.ffn_first, s.ffn_count, 0, (float **)&l->w_gate},
        {w->w_up, t->ffn, hidden, s.ffn_first, s.ffn_count, 0, (float **)&l->w_up},
        {w->w_down, hidden, t->ffn, s.ffn_first, s.ffn_count, 1, (float **)&l->w_down},
        {w->bq, q_dim, 1, q_first, q_rows, 0, &l->bq},
        {w->bk, kv_dim, 1, kv_first, kv_rows, 0, &l->bk},
        {w->bv, kv_dim, 1, kv_first, kv_rows, 0, &l->bv},
    };
    for (size_t i = 0; i < sizeof(cuts) / sizeof(cuts[0]); i++) {
        rc = tp_cut(cuts[i].src, cuts[i].rows, cuts[i].cols, cuts[i].first, cuts[i].count,
                    cuts[i].by_cols, cuts[i].dst);
        if (rc != 0)
            goto out_free;
    }
    return 0;

out_free:
    gang_tp_layer_free(l);
    return rc;
}
