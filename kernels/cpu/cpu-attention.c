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
 */
#include <math.h>
#include <stdlib.h>

#include "cpu.h"

#define CPU_ATTN_STACK_KEYS 8192 /* 64 KiB of doubles */
#define CPU_ATTN_STACK_DIM 512

int gang__cpu_attention(const float *q, const float *kc, const float *vc, size_t tq, size_t tk,
                        size_t n_heads, size_t n_kv_heads, size_t head_dim, size_t pos0, float *out)
{
    size_t group = n_heads / n_kv_heads;
    double scale = 1.0 / sqrt((double)head_dim);
    int rc = 0;
    /* Scratch on the stack for the sizes a decode loop uses (contexts up to
     * CPU_ATTN_STACK_KEYS, heads up to CPU_ATTN_STACK_DIM), so that serving allocates
     * nothing per token; larger calls fall back to the heap. */
    double scores_stack[CPU_ATTN_STACK_KEYS], acc_stack[CPU_ATTN_STACK_DIM];
    double *scores = tk <= CPU_ATTN_STACK_KEYS ? scores_stack : malloc(tk * sizeof(*scores));
    double *acc = head_dim <= CPU_ATTN_STACK_DIM ? acc_stack : malloc(head_dim * sizeof(*acc));

    if (scores == NULL || acc == NULL) {
        rc = GANG_ENOMEM;
        goto out_free;
    }

    for (size_t i = 0; i < tq; i++) {
        size_t n_keys = pos0 + i + 1; /* the front checked pos0 + tq <= tk */

        for (size_t h = 0; h < n_heads; h++) {
            const float *qv = q + (i * n_heads + h) * head_dim;
            size_t g = h / group;
            double max = -INFINITY, sum = 0.0;

            for (size_t j = 0; j < n_keys; j++) {
                const float *kv = kc + (j * n_kv_heads + g) * head_dim;
                double dot = 0.0;
                for (size_t d = 0; d < head_dim; d++)
                    dot += (double)qv[d] * (double)kv[d];
                scores[j] = dot * scale;
                if (scores[j] > max)
                    max = scores[j];
            }
            for (size_t d = 0; d < head_dim; d++)
                acc[d] = 0.0;
            for (size_t j = 0; j < n_keys; j++) {
                const float *vv = vc + (j * n_kv_heads + g) * head_dim;
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
    if (acc != acc_stack)
        free(acc);
    if (scores != scores_stack)
        free(scores);
    return rc;
}
