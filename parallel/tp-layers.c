/*
 * Tensor-parallel layers: the Megatron split of a Llama decoder layer (column-parallel
 * Q/K/V and gate/up, row-parallel o_proj and down, one all-reduce per block) in f32 on
 * host memory. The split itself is described in include/ganglion/parallel.h; this file
 * only cuts the shards and chains kernels and all-reduces.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ganglion/parallel.h"

/* ---------------------------------------------------------------------------------
 * Slicing
 * --------------------------------------------------------------------------------- */
int gang_tp_slice_rows(const float *src, size_t rows, size_t cols, size_t row_first,
                       size_t row_count, float *dst)
{
    if (src == NULL || dst == NULL || rows == 0 || cols == 0 || row_count == 0)
        return GANG_EINVAL;
    if (row_first > rows || row_count > rows - row_first)
        return GANG_EINVAL;
    /* A band of rows of a row-major matrix is one contiguous block. */
    memcpy(dst, src + row_first * cols, row_count * cols * sizeof(float));
    return 0;
}

int gang_tp_slice_cols(const float *src, size_t rows, size_t cols, size_t col_first,
                       size_t col_count, float *dst)
{
    size_t r;

    if (src == NULL || dst == NULL || rows == 0 || cols == 0 || col_count == 0)
        return GANG_EINVAL;
    if (col_first > cols || col_count > cols - col_first)
        return GANG_EINVAL;
    for (r = 0; r < rows; r++)
        memcpy(dst + r * col_count, src + r * cols + col_first, col_count * sizeof(float));
    return 0;
}

/* ---------------------------------------------------------------------------------
 * Linear layers
 * --------------------------------------------------------------------------------- */
int gang_tp_linear_column(gang_kernels *k, const float *x, size_t tokens, size_t in,
                          const float *w_shard, size_t out_shard, float *y)
{
    /* Hugging Face weights are [out, in], so the product uses W transposed. */
    return gang_kernels_gemm(k, 1, tokens, out_shard, in, 1.0f, x, w_shard, 0.0f, y);
}

int gang_tp_linear_row(gang_kernels *k, gang_comm *comm, const float *x_shard, size_t tokens,
                       size_t in_shard, const float *w_shard, size_t out, float *y,
                       uint64_t timeout_ms)
{
    int rc;

    rc = gang_kernels_gemm(k, 1, tokens, out, in_shard, 1.0f, x_shard, w_shard, 0.0f, y);
    if (rc != 0)
        return rc;
    /*
     * Each rank now holds the contribution of its input features only; the sum over the
     * TP group is the full product. A single rank has nothing to add.
     */
    if (comm == NULL)
        return 0;
    return gang_comm_all_reduce(comm, y, tokens * out, GANG_DTYPE_F32, timeout_ms);
}

/* ---------------------------------------------------------------------------------
 * Shards of a layer
 * --------------------------------------------------------------------------------- */
void gang_tp_layer_free(gang_tp_layer *l)
{
    if (l == NULL)
        return;
    free(l->attn_norm);
    free(l->wq);
    free(l->wk);
    free(l->wv);
    free(l->wo);
    free(l->mlp_norm);
    free(l->w_gate);
    free(l->w_up);
    free(l->w_down);
    free(l->bq);
    free(l->bk);
    free(l->bv);
    memset(l, 0, sizeof(*l));
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

/* Allocates rows x cols floats for a shard. */
static int tp_alloc(size_t rows, size_t cols, float **out)
{
    *out = malloc(rows * cols * sizeof(float));
    return *out == NULL ? GANG_ENOMEM : 0;
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

    /* Attention: Q/K/V keep the rows of the rank's heads, o_proj the matching columns. */
    rc = tp_alloc(q_rows, hidden, &l->wq);
    if (rc != 0)
        goto out_free;
    rc = gang_tp_slice_rows(w->wq, q_dim, hidden, (size_t)s.head_first * hd, q_rows, l->wq);
    if (rc != 0)
        goto out_free;
    rc = tp_alloc(kv_rows, hidden, &l->wk);
    if (rc != 0)
        goto out_free;
    rc = gang_tp_slice_rows(w->wk, kv_dim, hidden, (size_t)s.kv_head_first * hd, kv_rows, l->wk);
    if (rc != 0)
        goto out_free;
    rc = tp_alloc(kv_rows, hidden, &l->wv);
    if (rc != 0)
        goto out_free;
    rc = gang_tp_slice_rows(w->wv, kv_dim, hidden, (size_t)s.kv_head_first * hd, kv_rows, l->wv);
    if (rc != 0)
        goto out_free;
    rc = tp_alloc(hidden, q_rows, &l->wo);
    if (rc != 0)
        goto out_free;
    rc = gang_tp_slice_cols(w->wo, hidden, q_dim, (size_t)s.head_first * hd, q_rows, l->wo);
    if (rc != 0)
        goto out_free;

    /* MLP: gate/up keep the rows of the rank's ffn columns, down the same columns. */
    rc = tp_alloc(s.ffn_count, hidden, &l->w_gate);
    if (rc != 0)
        goto out_free;
    rc = gang_tp_slice_rows(w->w_gate, t->ffn, hidden, s.ffn_first, s.ffn_count, l->w_gate);
    if (rc != 0)
        goto out_free;
    rc = tp_alloc(s.ffn_count, hidden, &l->w_up);
    if (rc != 0)
        goto out_free;
    rc = gang_tp_slice_rows(w->w_up, t->ffn, hidden, s.ffn_first, s.ffn_count, l->w_up);
    if (rc != 0)
        goto out_free;
    rc = tp_alloc(hidden, s.ffn_count, &l->w_down);
    if (rc != 0)
        goto out_free;
    rc = gang_tp_slice_cols(w->w_down, hidden, t->ffn, s.ffn_first, s.ffn_count, l->w_down);
    if (rc != 0)
        goto out_free;
    return 0;

out_free:
    gang_tp_layer_free(l);
    return rc;
}

/* ---------------------------------------------------------------------------------
 * Blocks
 * --------------------------------------------------------------------------------- */

/*
 * A communicator must match the layer: NULL only when the layer was cut for one rank,
 * otherwise of size tp with this rank at the shard's tp rank. A mismatch would reduce
 * the wrong partial sums together, so it is refused rather than computed.
 */
static int tp_check_comm(const gang_tp_layer *l, gang_comm *comm)
{
    if (comm == NULL)
        return l->tp == 1 ? 0 : GANG_EINVAL;
    if (gang_comm_size(comm) != l->tp || gang_comm_rank(comm) != l->shard.tp_rank)
        return GANG_EINVAL;
    return 0;
}

int gang_tp_mlp_forward(const gang_tp_layer *l, gang_kernels *k, gang_comm *comm, const float *x,
                        size_t tokens, float *out, uint64_t timeout_ms)
{
    size_t n_local;
    float *gate = NULL, *up;
    int rc;

    if (l == NULL || k == NULL || x == NULL || out == NULL || tokens == 0 || l->wq == NULL)
        return GANG_EINVAL;
    rc = tp_check_comm(l, comm);
    if (rc != 0)
        return rc;
    n_local = tokens * l->shard.ffn_count;
    gate = malloc(2 * n_local * sizeof(float));
    if (gate == NULL)
        return GANG_ENOMEM;
    up = gate + n_local;

    rc = gang_tp_linear_column(k, x, tokens, l->hidden, l->w_gate, l->shard.ffn_count, gate);
    if (rc != 0)
        goto out_free;
    rc = gang_tp_linear_column(k, x, tokens, l->hidden, l->w_up, l->shard.ffn_count, up);
    if (rc != 0)
        goto out_free;
    /* SiLU(gate) * up is elementwise, so it runs on the local ffn columns alone. */
    rc = gang_kernels_silu_mul(k, gate, up, n_local, gate);
    if (rc != 0)
        goto out_free;
    rc = gang_tp_linear_row(k, comm, gate, tokens, l->shard.ffn_count, l->w_down, l->hidden, out,
                            timeout_ms);

out_free:
    free(gate);
    return rc;
}

int gang_tp_attention_forward(const gang_tp_layer *l, gang_kernels *k, gang_comm *comm,
                              const float *x, size_t tokens, size_t pos0, gang_tp_kv_cache *cache,
                              float *out, uint64_t timeout_ms)
{
    size_t hd, q_cols, kv_cols, i;
    float *q = NULL, *k_new, *v_new;
    int32_t *positions = NULL;
    int rc;

    if (l == NULL || k == NULL || x == NULL || out == NULL || cache == NULL || cache->k == NULL ||
        cache->v == NULL || tokens == 0 || l->wq == NULL)
        return GANG_EINVAL;
    if (pos0 > cache->cap || tokens > cache->cap - pos0 || pos0 + tokens > (size_t)INT32_MAX)
        return GANG_EINVAL;
    rc = tp_check_comm(l, comm);
    if (rc != 0)
        return rc;
    hd = l->head_dim;
    q_cols = (size_t)l->shard.head_count * hd;
    kv_cols = (size_t)l->shard.kv_head_count * hd;

    q = malloc(tokens * q_cols * sizeof(float));
    positions = malloc(tokens * sizeof(int32_t));
    if (q == NULL || positions == NULL) {
        rc = GANG_ENOMEM;
        goto out_free;
    }
    for (i = 0; i < tokens; i++)
        positions[i] = (int32_t)(pos0 + i);

    /*
     * A cache row [kv_head_count, head_dim] has exactly the width of the K and V
     * projections of this rank, so the projections write straight into the cache rows
     * of the new positions and RoPE rotates the keys there.
     */
    k_new = cache->k + pos0 * kv_cols;
    v_new = cache->v + pos0 * kv_cols;
    rc = gang_tp_linear_column(k, x, tokens, l->hidden, l->wq, q_cols, q);
    if (rc != 0)
        goto out_free;
    rc = gang_tp_linear_column(k, x, tokens, l->hidden, l->wk, kv_cols, k_new);
    if (rc != 0)
        goto out_free;
    rc = gang_tp_linear_column(k, x, tokens, l->hidden, l->wv, kv_cols, v_new);
    if (rc != 0)
        goto out_free;
    rc = gang_kernels_rope(k, q, positions, tokens, l->shard.head_count, hd, l->rope_theta);
    if (rc != 0)
        goto out_free;
    rc = gang_kernels_rope(k, k_new, positions, tokens, l->shard.kv_head_count, hd, l->rope_theta);
    if (rc != 0)
        goto out_free;
    /*
     * The local query heads read only the local kv heads: with heads split, local head
     * j of this rank maps to local kv head j / (head_count / kv_head_count) exactly as
     * globally; with kv heads replicated the rank holds one kv head that all its query
     * heads share. So the kernel sees a self-contained smaller GQA problem. The output
     * overwrites q in place (allowed by the kernel's contract).
     */
    rc = gang_kernels_attention(k, q, cache->k, cache->v, tokens, pos0 + tokens,
                                l->shard.head_count, l->shard.kv_head_count, hd, pos0, q);
    if (rc != 0)
        goto out_free;
    rc = gang_tp_linear_row(k, comm, q, tokens, q_cols, l->wo, l->hidden, out, timeout_ms);

out_free:
    free(positions);
    free(q);
    return rc;
}

int gang_tp_layer_forward(const gang_tp_layer *l, gang_kernels *k, gang_comm *comm, float *x,
                          size_t tokens, size_t pos0, gang_tp_kv_cache *cache, uint64_t timeout_ms)
{
    size_t n;
    float *normed = NULL, *delta;
    int rc;

    if (l == NULL || x == NULL || tokens == 0 || l->attn_norm == NULL || l->mlp_norm == NULL)
        return GANG_EINVAL;
    n = tokens * l->hidden;
    normed = malloc(2 * n * sizeof(float));
    if (normed == NULL)
        return GANG_ENOMEM;
    delta = normed + n;

    /*
     * The norms and residual adds are replicated: every rank holds the full residual
     * stream after each all-reduce, so they need no communication.
     */
    rc = gang_kernels_rmsnorm(k, x, l->attn_norm, l->norm_eps, tokens, l->hidden, normed);
    if (rc != 0)
        goto out_free;
    rc = gang_tp_attention_forward(l, k, comm, normed, tokens, pos0, cache, delta, timeout_ms);
    if (rc != 0)
        goto out_free;
    rc = gang_kernels_add(k, x, delta, n);
    if (rc != 0)
        goto out_free;
    rc = gang_kernels_rmsnorm(k, x, l->mlp_norm, l->norm_eps, tokens, l->hidden, normed);
    if (rc != 0)
        goto out_free;
    rc = gang_tp_mlp_forward(l, k, comm, normed, tokens, delta, timeout_ms);
    if (rc != 0)
        goto out_free;
    rc = gang_kernels_add(k, x, delta, n);

out_free:
    free(normed);
    return rc;
}
