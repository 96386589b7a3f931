/*
 * The decode step's operations on the CPU (include/ganglion/kernels.h, issue #24): the
 * batched attention with the KV append fused, the in-place scatter of block-table
 * entries, and the sampler that returns ids. The "fake" device computes with these on
 * its shadow memory, so they are also what proves the device path's numbers here: the
 * attention regroups the step's tokens into the per-sequence calls of the CPU batch
 * attention (bit for bit the path that writes rows and calls attention per sequence),
 * and the sampler walks the candidates exactly as the engine's sampler does
 * (engine/sample.c; unit-fake-device holds the two equal on random rows).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu.h"

/* ---------------------------------------------------------------------------------
 * Attention with the KV append fused.
 * --------------------------------------------------------------------------------- */

/* Stores one f32 row of n elements into a pool row of dtype dt (rounded as convert does). */
static void step_store_row(void *dst, gang_dtype dt, const float *src, size_t n)
{
    if (dt == GANG_DTYPE_F32) {
        memcpy(dst, src, n * sizeof(float));
        return;
    }
    for (size_t i = 0; i < n; i++)
        ((uint16_t *)dst)[i] =
            dt == GANG_DTYPE_F16 ? gang_f32_to_f16(src[i]) : gang_f32_to_bf16(src[i]);
}

/* The pool row of token t: its block from its table (checked against the pool). */
static int step_row(const gang_kernels_step_kv *kv, size_t t, size_t *row)
{
    int32_t pos = kv->positions[t], blk;

    if (pos < 0 || kv->table_rows[t] < 0)
        return GANG_EINVAL;
    blk = kv->tables[(size_t)kv->table_rows[t] + (size_t)pos / kv->block_size];
    if (blk < 0 || (size_t)blk >= kv->n_blocks)
        return GANG_EINVAL;
    *row = (size_t)blk * kv->block_size + (size_t)pos % kv->block_size;
    return 0;
}

int gang__cpu_attention_step(const gang_kernels_step_kv *kv, const float *knew, const float *vnew,
                             const float *q, size_t tokens, size_t n_heads, size_t n_kv_heads,
                             size_t head_dim, size_t window, float *out)
{
    size_t w = n_kv_heads * head_dim, qw = n_heads * head_dim, es = gang_dtype_size(kv->dtype);
    size_t t, t0, n_seq = 0, row;
    gang_kernels_attn_seq *seqs;
    gang_kernels_kv_pages *pages;
    int rc = 0;

    /* Every row is checked before the first one is written. */
    for (t = 0; t < tokens; t++)
        if (step_row(kv, t, &row) < 0)
            return GANG_EINVAL;
    seqs = malloc(tokens * sizeof(*seqs));
    pages = malloc(tokens * sizeof(*pages));
    if (seqs == NULL || pages == NULL) {
        rc = GANG_ENOMEM;
        goto out_free;
    }
    for (t = 0; t < tokens; t++) {
        step_row(kv, t, &row);
        step_store_row((char *)kv->kc + row * w * es, kv->dtype, knew + t * w, w);
        step_store_row((char *)kv->vc + row * w * es, kv->dtype, vnew + t * w, w);
    }
    /* A sequence's tokens of the step are consecutive: one call per run of them. */
    for (t0 = 0; t0 < tokens; t0 = t) {
        for (t = t0 + 1; t < tokens && kv->table_rows[t] == kv->table_rows[t0] &&
                         kv->positions[t] == kv->positions[t - 1] + 1;
             t++)
            ;
        pages[n_seq] = (gang_kernels_kv_pages){.table = kv->tables + kv->table_rows[t0],
                                               .block_size = kv->block_size,
                                               .n_blocks = kv->n_blocks,
                                               .dtype = kv->dtype};
        seqs[n_seq] = (gang_kernels_attn_seq){.q = q + t0 * qw,
                                              .out = out + t0 * qw,
                                              .kc = kv->kc,
                                              .vc = kv->vc,
                                              .pages = &pages[n_seq],
                                              .tq = t - t0,
                                              .tk = (size_t)kv->positions[t - 1] + 1,
                                              .pos0 = (size_t)kv->positions[t0]};
        n_seq++;
    }
    rc = gang__cpu_attention_batch(seqs, n_seq, n_heads, n_kv_heads, head_dim, window);
out_free:
    free(seqs);
    free(pages);
    return rc;
}

int gang__cpu_scatter_i32(int32_t *dst, size_t dst_n, const int32_t *pairs, size_t n_pairs)
{
    for (size_t i = 0; i < n_pairs; i++)
        if (pairs[2 * i] < 0 || (size_t)pairs[2 * i] >= dst_n)
            return GANG_EINVAL;
    for (size_t i = 0; i < n_pairs; i++)
        dst[pairs[2 * i]] = pairs[2 * i + 1];
    return 0;
}

/* The fused projections' helpers: a copy per part and row; the gate of each row through
 * the same element-wise kernels as the unfused path. */
int gang__cpu_split_cols3(const float *x, size_t rows, size_t w0, size_t w1, size_t w2, float *o0,
                          float *o1, float *o2)
{
    size_t w = w0 + w1 + w2;

    for (size_t r = 0; r < rows; r++) {
        memcpy(o0 + r * w0, x + r * w, w0 * sizeof(float));
        memcpy(o1 + r * w1, x + r * w + w0, w1 * sizeof(float));
        memcpy(o2 + r * w2, x + r * w + w0 + w1, w2 * sizeof(float));
    }
    return 0;
}

int gang__cpu_glu(int gelu, const float *x, size_t rows, size_t cols, float *out)
{
    int rc = 0;

    for (size_t r = 0; r < rows && rc == 0; r++) {
        const float *g = x + r * 2 * cols;

        rc = gelu ? gang__cpu_gelu_mul(g, g + cols, cols, out + r * cols)
                  : gang__cpu_silu_mul(g, g + cols, cols, out + r * cols);
    }
    return rc;
}

/* The decode step's fusions: the unfused kernels in turn, so the numbers are theirs. */
int gang__cpu_split_qkv_rope(const gang_kernels_qkv_rope *a)
{
    size_t q_cols = a->n_heads * a->head_dim, kv_cols = a->n_kv_heads * a->head_dim;
    int rc = gang__cpu_split_cols3(a->x, a->rows, q_cols, kv_cols, kv_cols, a->q, a->k, a->v);

    if (rc == 0 && a->bq != NULL)
        rc = gang__cpu_add_rows(a->q, a->bq, a->rows, q_cols);
    if (rc == 0 && a->bk != NULL)
        rc = gang__cpu_add_rows(a->k, a->bk, a->rows, kv_cols);
    if (rc == 0 && a->bv != NULL)
        rc = gang__cpu_add_rows(a->v, a->bv, a->rows, kv_cols);
    if (rc == 0)
        rc = gang__cpu_rope(a->q, a->positions, a->rows, a->n_heads, a->head_dim, a->inv_freq,
                            a->scale);
    if (rc == 0)
        rc = gang__cpu_rope(a->k, a->positions, a->rows, a->n_kv_heads, a->head_dim, a->inv_freq,
                            a->scale);
    return rc;
}

int gang__cpu_add_rmsnorm(float *x, const float *y, const float *w, float eps, size_t rows,
                          size_t dim, float *out)
{
    int rc = gang__cpu_add(x, y, rows * dim);

    return rc != 0 ? rc : gang__cpu_rmsnorm(x, w, eps, rows, dim, out);
}

/* ---------------------------------------------------------------------------------
 * Sampling (the rule of gang_kernels_sample; engine/sample.c's walk).
 * --------------------------------------------------------------------------------- */

/* The splitmix64 finaliser: a bijective mix of 64 bits. */
static uint64_t step_mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

double gang_kernels_uniform(uint64_t seed, uint64_t position)
{
    uint64_t z = step_mix64(seed + 0x9e3779b97f4a7c15ull);

    z = step_mix64(z ^ (position * 0xd1b54a32d192ed03ull + 0x632be59bd9b4e019ull));
    return (double)(z >> 11) * (1.0 / 9007199254740992.0);
}

typedef struct step_cand {
    float logit;
    int32_t id;
} step_cand;

/* Logit descending, then id ascending: a total order. */
static int step_cand_cmp(const void *a, const void *b)
{
    const step_cand *x = a, *y = b;

    if (x->logit > y->logit)
        return -1;
    if (x->logit < y->logit)
        return 1;
    return x->id < y->id ? -1 : (x->id > y->id ? 1 : 0);
}

/* One row: cand and prob have room for cols entries. */
static int32_t step_sample_row(const float *x, size_t cols, const gang_kernels_sample_param *p,
                               step_cand *cand, double *prob)
{
    size_t i, n = 0, keep;
    double sum = 0.0, cum, target, inv_t;
    int32_t best;

    if (!(p->temperature > 0.0f) || p->top_k == 1) {
        gang__cpu_argmax(x, 1, cols, &best);
        return best;
    }
    for (i = 0; i < cols; i++)
        if (!isnan(x[i]))
            cand[n++] = (step_cand){x[i], (int32_t)i};
    if (n == 0)
        return 0;
    qsort(cand, n, sizeof(*cand), step_cand_cmp);
    if (p->top_k > 0 && p->top_k < n)
        n = p->top_k;
    if (isinf(cand[0].logit))
        return cand[0].id;
    inv_t = 1.0 / (double)p->temperature;
    for (i = 0; i < n; i++) {
        prob[i] = exp(((double)cand[i].logit - (double)cand[0].logit) * inv_t);
        sum += prob[i];
    }
    keep = n;
    if (p->top_p > 0.0f && p->top_p < 1.0f) {
        cum = 0.0;
        for (i = 0; i < n; i++) {
            cum += prob[i];
            if (cum >= (double)p->top_p * sum) {
                keep = i + 1;
                break;
            }
        }
        sum = 0.0;
        for (i = 0; i < keep; i++)
            sum += prob[i];
    }
    target = gang_kernels_uniform(p->seed, p->position) * sum;
    cum = 0.0;
    for (i = 0; i < keep; i++) {
        cum += prob[i];
        if (target < cum)
            return cand[i].id;
    }
    return cand[keep - 1].id;
}

int gang__cpu_sample(const float *logits, size_t rows, size_t cols,
                     const gang_kernels_sample_param *params, int32_t *out)
{
    step_cand *cand = malloc(cols * sizeof(*cand));
    double *prob = malloc(cols * sizeof(*prob));
    int rc = 0;

    if (cand == NULL || prob == NULL) {
        rc = GANG_ENOMEM;
        goto out_free;
    }
    for (size_t r = 0; r < rows; r++)
        out[r] = step_sample_row(logits + r * cols, cols, &params[r], cand, prob);
out_free:
    free(cand);
    free(prob);
    return rc;
}
