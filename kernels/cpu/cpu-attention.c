/*
 * CPU backend: causal grouped-query attention over a key/value cache.
 *
 * For each query token i (absolute position p = pos0 + i) and head h, with g the kv head
 * h / (n_heads / n_kv_heads):
 *
 *   s_j   = (q[i,h] . k[j,g]) / sqrt(head_dim)            for j = 0 .. p
 *   w_j   = exp(s_j - max_j s_j) / sum_j exp(s_j - max_j s_j)
 *   out   = sum_j w_j v[j,g]
 *
 * Keys after p are never touched, which is what makes the operation causal and lets a
 * cache be larger than its filled part. Dot products, the softmax denominator and the
 * weighted sum run in double: this path is the reference the GPU kernels and the
 * tensor-parallel tests compare against, so accuracy matters more than speed here.
 *
 * Long prefills take a blocked path instead (attention_blocked): per head and block of
 * ATTN_BLOCK_Q queries, the scores are one OpenBLAS sgemm against the keys the block
 * needs, the causal softmax runs in float over each row, and the output is a second
 * sgemm against the values. Same result to float rounding, and an order of magnitude
 * faster for prompts of thousands of tokens (a 32k-token prompt is quadratic work). It
 * is taken only when a call has at least ATTN_BLOCK_MIN_Q queries and
 * ATTN_BLOCK_MIN_KEYS keys, so decode steps and the short prompts the tests compare
 * keep the double-precision reference. The thresholds (8 queries, 256 keys) were 64 and
 * 2,048 until a 1,000-token SmolLM2 prompt was measured: 57.6 s to its first token, 54%
 * of it in the double path; 16.6 s with the blocked path from 256 keys, and the
 * 11-token remainder of a prompt whose first 992 tokens come from the prefix cache went
 * from 0.85 s to 0.41 s with the blocked path from 8 queries.
 *
 * A paged cache (gang_kernels_kv_pages) changes only where row j is read: the double path
 * looks each row up through the block table, and the blocked path first gathers the rows
 * its block needs into a contiguous copy, so both compute exactly what they compute on a
 * contiguous cache holding the same rows. A half-precision pool (bf16 / f16) is widened
 * to f32 as it is read (a row at a time, or in the gathered copy).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu.h"

#define ATTN_BLOCK_Q 64
#define ATTN_BLOCK_MIN_Q 8
#define ATTN_BLOCK_MIN_KEYS 256

/* The cache row of position j: j itself, or its row in its block of a paged cache. */
static inline size_t attn_row(const gang_kernels_kv_pages *pg, size_t j)
{
    return pg == NULL ? j
                      : (size_t)pg->table[j / pg->block_size] * pg->block_size + j % pg->block_size;
}

/* Widens n elements at src (of the pool's dtype) into f32 dst. */
static void attn_widen(const void *src, gang_dtype dt, size_t n, float *dst)
{
    if (dt == GANG_DTYPE_BF16)
        (void)gang_bf16_to_f32_array(src, dst, n);
    else if (dt == GANG_DTYPE_F16)
        (void)gang_f16_to_f32_array(src, dst, n);
    else
        memcpy(dst, src, n * sizeof(float));
}

/* Copies rows 0 .. n-1 of a paged cache (row width w elements) contiguously into f32 dst. */
static void attn_gather(const void *src, const gang_kernels_kv_pages *pg, size_t n, size_t w,
                        float *dst)
{
    size_t es = gang_dtype_size(pg->dtype);

    for (size_t j = 0; j < n; j += pg->block_size) {
        size_t run = n - j < pg->block_size ? n - j : pg->block_size;
        attn_widen((const char *)src + attn_row(pg, j) * w * es, pg->dtype, run * w, dst + j * w);
    }
}

/*
 * The n floats of row j at column off (row width w elements): a pointer into an f32
 * cache, or tmp holding them widened from a half-precision pool.
 */
static const float *attn_vec(const void *base, const gang_kernels_kv_pages *pg, size_t j,
                             size_t off, size_t w, size_t n, float *tmp)
{
    size_t idx = attn_row(pg, j) * w + off;

    if (pg == NULL || pg->dtype == GANG_DTYPE_F32)
        return (const float *)base + idx;
    attn_widen((const uint16_t *)base + idx, pg->dtype, n, tmp);
    return tmp;
}

/* The blocked path (see the file comment); the arguments are those of the front. */
static int attention_blocked(const float *q, const void *kc, const void *vc,
                             const gang_kernels_kv_pages *pg, size_t tq, size_t n_heads,
                             size_t n_kv_heads, size_t head_dim, size_t pos0, size_t window,
                             float *out)
{
    size_t group = n_heads / n_kv_heads, n_max = pos0 + tq, w = n_kv_heads * head_dim;
    float scale = (float)(1.0 / sqrt((double)head_dim));
    float *s = malloc((size_t)ATTN_BLOCK_Q * n_max * sizeof(float)), *flat = NULL;
    const float *kf = kc, *vf = vc;
    gang__cpu_sgemm_fn sgemm;
    int rc = gang__cpu_blas_load(&sgemm);

    if (rc < 0) {
        free(s);
        return rc;
    }
    if (s == NULL)
        return GANG_ENOMEM;
    if (pg != NULL) {
        /* The sgemms want the keys and values contiguous: one gathered copy of each. */
        flat = malloc(2 * n_max * w * sizeof(float));
        if (flat == NULL) {
            free(s);
            return GANG_ENOMEM;
        }
        attn_gather(kc, pg, n_max, w, flat);
        attn_gather(vc, pg, n_max, w, flat + n_max * w);
        kf = flat;
        vf = flat + n_max * w;
    }
    int qs = (int)(n_heads * head_dim), ks = (int)(n_kv_heads * head_dim), d = (int)head_dim;
    for (size_t h = 0; h < n_heads; h++) {
        const float *kh = kf + (h / group) * head_dim, *vh = vf + (h / group) * head_dim;
        for (size_t i0 = 0; i0 < tq; i0 += ATTN_BLOCK_Q) {
            size_t b = tq - i0 < ATTN_BLOCK_Q ? tq - i0 : ATTN_BLOCK_Q;
            size_t nk = pos0 + i0 + b; /* keys the block's last query sees */
            sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)b, (int)nk, d, scale,
                  q + (i0 * n_heads + h) * head_dim, qs, kh, ks, 0.0f, s, (int)nk);
            for (size_t r = 0; r < b; r++) {
                float *row = s + r * nk, max = -INFINITY, sum = 0.0f;
                size_t valid = pos0 + i0 + r + 1;
                size_t first = window != 0 && valid > window ? valid - window : 0;
                for (size_t j = first; j < valid; j++)
                    max = row[j] > max ? row[j] : max;
                for (size_t j = first; j < valid; j++) {
                    row[j] = expf(row[j] - max);
                    sum += row[j];
                }
                float inv = 1.0f / sum;
                for (size_t j = 0; j < first; j++)
                    row[j] = 0.0f;
                for (size_t j = first; j < valid; j++)
                    row[j] *= inv;
                for (size_t j = valid; j < nk; j++)
                    row[j] = 0.0f;
            }
            /* The block's queries were read by the first product: out may be q. */
            sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)b, d, (int)nk, 1.0f, s, (int)nk,
                  vh, ks, 0.0f, out + (i0 * n_heads + h) * head_dim, qs);
        }
    }
    free(flat);
    free(s);
    return 0;
}

#define CPU_ATTN_STACK_KEYS 8192 /* 64 KiB of doubles */
#define CPU_ATTN_STACK_DIM 512

int gang__cpu_attention(const float *q, const void *kc, const void *vc,
                        const gang_kernels_kv_pages *pg, size_t tq, size_t tk, size_t n_heads,
                        size_t n_kv_heads, size_t head_dim, size_t pos0, size_t window, float *out)
{
    size_t group = n_heads / n_kv_heads;
    double scale = 1.0 / sqrt((double)head_dim);
    int rc = 0;
    if (tq >= ATTN_BLOCK_MIN_Q && pos0 + tq >= ATTN_BLOCK_MIN_KEYS)
        return attention_blocked(q, kc, vc, pg, tq, n_heads, n_kv_heads, head_dim, pos0, window,
                                 out);
    /* Scratch on the stack for the sizes a decode loop uses (contexts up to
     * CPU_ATTN_STACK_KEYS, heads up to CPU_ATTN_STACK_DIM), so that serving allocates
     * nothing per token; larger calls fall back to the heap. */
    double scores_stack[CPU_ATTN_STACK_KEYS], acc_stack[CPU_ATTN_STACK_DIM];
    float row_stack[CPU_ATTN_STACK_DIM];
    double *scores = tk <= CPU_ATTN_STACK_KEYS ? scores_stack : malloc(tk * sizeof(*scores));
    double *acc = head_dim <= CPU_ATTN_STACK_DIM ? acc_stack : malloc(head_dim * sizeof(*acc));
    float *row = head_dim <= CPU_ATTN_STACK_DIM ? row_stack : malloc(head_dim * sizeof(*row));
    size_t row_w = n_kv_heads * head_dim;

    if (scores == NULL || acc == NULL || row == NULL) {
        rc = GANG_ENOMEM;
        goto out_free;
    }

    for (size_t i = 0; i < tq; i++) {
        size_t n_keys = pos0 + i + 1; /* the front checked pos0 + tq <= tk */
        size_t first = window != 0 && n_keys > window ? n_keys - window : 0;

        for (size_t h = 0; h < n_heads; h++) {
            const float *qv = q + (i * n_heads + h) * head_dim;
            size_t g = h / group;
            double max = -INFINITY, sum = 0.0;

            for (size_t j = first; j < n_keys; j++) {
                const float *kv = attn_vec(kc, pg, j, g * head_dim, row_w, head_dim, row);
                double dot = 0.0;
                for (size_t d = 0; d < head_dim; d++)
                    dot += (double)qv[d] * (double)kv[d];
                scores[j] = dot * scale;
                if (scores[j] > max)
                    max = scores[j];
            }
            for (size_t d = 0; d < head_dim; d++)
                acc[d] = 0.0;
            for (size_t j = first; j < n_keys; j++) {
                const float *vv = attn_vec(vc, pg, j, g * head_dim, row_w, head_dim, row);
                double w = exp(scores[j] - max);
                sum += w;
                for (size_t d = 0; d < head_dim; d++)
                    acc[d] += w * (double)vv[d];
            }
            /* The query row has been read completely above, so writing here is safe even
             * when out is q. */
            float *ov = out + (i * n_heads + h) * head_dim;
            for (size_t d = 0; d < head_dim; d++)
                ov[d] = (float)(acc[d] / sum);
        }
    }

out_free:
    if (row != row_stack)
        free(row);
    if (acc != acc_stack)
        free(acc);
    if (scores != scores_stack)
        free(scores);
    return rc;
}
