/*
 * Kernels front: the decode step's operations (issue #24), validated as kernels/backend.c
 * validates the rest (its file comment), then dispatched to the handle's backend, one
 * launch counted each.
 */
#include <limits.h>
#include <math.h>
#include <stdint.h>

#include "ganglion/kernels.h"

#include "kernels-backend.h"

int gang_kernels_attention_step(gang_kernels *k, const gang_kernels_step_kv *kv, const float *knew,
                                const float *vnew, const float *q, size_t tokens, size_t n_heads,
                                size_t n_kv_heads, size_t head_dim, size_t window, float *out)
{
    size_t n;

    if (k == NULL || kv == NULL || knew == NULL || vnew == NULL || q == NULL || out == NULL ||
        kv->kc == NULL || kv->vc == NULL || kv->tables == NULL || kv->positions == NULL ||
        kv->table_rows == NULL || tokens == 0 || n_heads == 0 || n_kv_heads == 0 || head_dim == 0 ||
        kv->block_size == 0 || kv->n_blocks == 0)
        return GANG_EINVAL;
    if (n_heads % n_kv_heads != 0 || (kv->dtype != GANG_DTYPE_F32 && kv->dtype != GANG_DTYPE_BF16 &&
                                      kv->dtype != GANG_DTYPE_F16))
        return GANG_EINVAL;
    if (gang__kernels_elems3(tokens, n_heads, head_dim, &n) < 0 ||
        gang__kernels_elems3(kv->n_blocks, kv->block_size, n_kv_heads * head_dim, &n) < 0 ||
        tokens > INT32_MAX)
        return GANG_ERANGE;
    if (k->be->attention_step == NULL)
        return GANG_ENOSYS;
    k->cnt.launches++;
    return k->be->attention_step(k->ctx, kv, knew, vnew, q, tokens, n_heads, n_kv_heads, head_dim,
                                 window, out);
}

int gang_kernels_scatter_i32(gang_kernels *k, int32_t *dst, size_t dst_n, const int32_t *pairs,
                             size_t n_pairs)
{
    if (k == NULL || dst == NULL || pairs == NULL || dst_n == 0 || n_pairs == 0)
        return GANG_EINVAL;
    if (dst_n > INT32_MAX || n_pairs > INT32_MAX)
        return GANG_ERANGE;
    if (k->be->scatter_i32 == NULL)
        return GANG_ENOSYS;
    k->cnt.launches++;
    return k->be->scatter_i32(k->ctx, dst, dst_n, pairs, n_pairs);
}

int gang_kernels_sample(gang_kernels *k, const float *logits, size_t rows, size_t cols,
                        const gang_kernels_sample_param *params, int32_t *out)
{
    size_t n;

    if (k == NULL || logits == NULL || params == NULL || out == NULL || rows == 0 || cols == 0)
        return GANG_EINVAL;
    if (cols > INT32_MAX || gang__kernels_elems(rows, cols, &n) < 0)
        return GANG_ERANGE;
    if (k->be->sample == NULL)
        return GANG_ENOSYS;
    k->cnt.launches++;
    return k->be->sample(k->ctx, logits, rows, cols, params, out);
}

int gang_kernels_split_cols3(gang_kernels *k, const float *x, size_t rows, size_t w0, size_t w1,
                             size_t w2, float *o0, float *o1, float *o2)
{
    size_t n;

    if (k == NULL || x == NULL || o0 == NULL || o1 == NULL || o2 == NULL || rows == 0 || w0 == 0 ||
        w1 == 0 || w2 == 0)
        return GANG_EINVAL;
    if (w0 > SIZE_MAX - w1 - w2 || gang__kernels_elems(rows, w0 + w1 + w2, &n) < 0)
        return GANG_ERANGE;
    if (k->be->split_cols3 == NULL)
        return GANG_ENOSYS;
    k->cnt.launches++;
    return k->be->split_cols3(k->ctx, x, rows, w0, w1, w2, o0, o1, o2);
}

int gang_kernels_split_qkv_rope(gang_kernels *k, const gang_kernels_qkv_rope *a)
{
    size_t heads, tmp;
    int rc;

    if (k == NULL || a == NULL || a->x == NULL || a->positions == NULL || a->inv_freq == NULL ||
        a->q == NULL || a->k == NULL || a->v == NULL || a->rows == 0 || a->n_heads == 0 ||
        a->n_kv_heads == 0 || a->head_dim == 0 || a->head_dim % 2 != 0)
        return GANG_EINVAL;
    if (!isfinite(a->scale) || a->scale <= 0.0f)
        return GANG_EINVAL;
    if (a->n_kv_heads > (SIZE_MAX - a->n_heads) / 2)
        return GANG_ERANGE;
    heads = a->n_heads + 2 * a->n_kv_heads;
    if ((rc = gang__kernels_elems3(a->rows, heads, a->head_dim, &tmp)) < 0)
        return rc;
    /* The positions are the backend's to check, as rope's. */
    if (k->be->split_qkv_rope == NULL)
        return GANG_ENOSYS;
    k->cnt.launches++;
    return k->be->split_qkv_rope(k->ctx, a);
}

int gang_kernels_add_rmsnorm(gang_kernels *k, float *x, const float *y, const float *w, float eps,
                             size_t rows, size_t dim, float *out)
{
    int rc;

    if (k == NULL || y == NULL)
        return GANG_EINVAL;
    if ((rc = gang__kernels_norm_check(x, w, out, eps, rows, dim)) < 0)
        return rc;
    if (k->be->add_rmsnorm == NULL)
        return GANG_ENOSYS;
    k->cnt.launches++;
    return k->be->add_rmsnorm(k->ctx, x, y, w, eps, rows, dim, out);
}

int gang_kernels_glu(gang_kernels *k, int gelu, const float *x, size_t rows, size_t cols,
                     float *out)
{
    size_t n;

    if (k == NULL || x == NULL || out == NULL || rows == 0 || cols == 0)
        return GANG_EINVAL;
    if (cols > SIZE_MAX / 2 || gang__kernels_elems(rows, 2 * cols, &n) < 0)
        return GANG_ERANGE;
    if (k->be->glu == NULL)
        return GANG_ENOSYS;
    k->cnt.launches++;
    return k->be->glu(k->ctx, gelu != 0, x, rows, cols, out);
}
