/*
 * The CPU attention's work item (gang__cpu_attn_item, cpu.h), written once and compiled
 * twice: cpu-attention.c includes it with scalar primitives (the portable kernel) and
 * cpu-attention-avx2.c with AVX2 + FMA + F16C ones. No include guard on purpose. Before
 * including it a file defines ATTN_ITEM_FN (the function's name) and these static inline
 * primitives, all over f32:
 *
 *   float attn_dot(const float *a, const float *b, size_t n)       sum of a[i] b[i]
 *   void attn_axpy(float *y, float a, const float *x, size_t n)    y[i] += a x[i]
 *   void attn_scal(float *y, float a, size_t n)                    y[i] *= a
 *   float attn_exp_sum(float *s, size_t n, float m)                s[i] = exp(s[i] - m),
 *                                                                  returns their sum
 *   const float *attn_widen(const void *src, gang_dtype dt, size_t n, float *tmp)
 *       the n elements at src as f32: src itself for F32, else widened into tmp
 *
 * Algorithm (one query row, `heads` heads sharing one kv head): the keys are taken
 * GANG__ATTN_TILE at a time; a tile's scores for every head are dot products with the
 * key rows (each row widened once for all the heads), then the softmax runs online: the
 * running maximum m and denominator l of each head are updated with the tile's, the
 * accumulated output is rescaled by exp(m_old - m_new) when the maximum grew, and the
 * tile's weights exp(s - m) times the value rows are added to it. At the end each head's
 * accumulator is divided by its l. The scratch is bounded (no array of n_keys scores), so
 * a context of any length needs nothing from the heap, and the item's result depends only
 * on its query and its keys: a decode step gives the rows a prefill of the same tokens
 * gives, and batching does not change a sequence's numbers.
 */

/* The cache row of position j, this item's columns. */
static inline const void *attn_item_row(const gang__cpu_attn_item *it, const void *base, size_t j)
{
    const gang_kernels_kv_pages *pg = it->pg;
    size_t row = pg == NULL
                     ? j
                     : (size_t)pg->table[j / pg->block_size] * pg->block_size + j % pg->block_size;
    size_t es = it->dt == GANG_DTYPE_F32 ? 4 : 2;

    return (const char *)base + (row * it->row_w + it->off) * es;
}

void ATTN_ITEM_FN(const gang__cpu_attn_item *it)
{
    float s[GANG__ATTN_HEADS][GANG__ATTN_TILE], m[GANG__ATTN_HEADS], l[GANG__ATTN_HEADS];
    size_t hd = it->head_dim, nh = it->heads;
    float *acc = it->acc, *krow = it->tmp, *vrow = it->tmp + hd;

    for (size_t h = 0; h < nh; h++) {
        m[h] = -INFINITY;
        l[h] = 0.0f;
        for (size_t d = 0; d < hd; d++)
            acc[h * hd + d] = 0.0f;
    }
    for (size_t j0 = it->first; j0 < it->n_keys; j0 += GANG__ATTN_TILE) {
        size_t nt = it->n_keys - j0 < GANG__ATTN_TILE ? it->n_keys - j0 : GANG__ATTN_TILE;

        for (size_t t = 0; t < nt; t++) {
            const float *kv = attn_widen(attn_item_row(it, it->kc, j0 + t), it->dt, hd, krow);

            for (size_t h = 0; h < nh; h++)
                s[h][t] = attn_dot(it->q + h * hd, kv, hd) * it->scale;
        }
        for (size_t h = 0; h < nh; h++) {
            float mt = m[h], alpha;

            for (size_t t = 0; t < nt; t++)
                mt = s[h][t] > mt ? s[h][t] : mt;
            /* The first tile: m was -inf and acc, l are 0 (alpha 0 keeps them so). */
            alpha = m[h] == -INFINITY ? 0.0f : expf(m[h] - mt);
            l[h] = l[h] * alpha + attn_exp_sum(s[h], nt, mt);
            if (alpha != 1.0f)
                attn_scal(acc + h * hd, alpha, hd);
            m[h] = mt;
        }
        for (size_t t = 0; t < nt; t++) {
            const float *vv = attn_widen(attn_item_row(it, it->vc, j0 + t), it->dt, hd, vrow);

            for (size_t h = 0; h < nh; h++)
                attn_axpy(acc + h * hd, s[h][t], vv, hd);
        }
    }
    /* Every query row of the item was read by the dot products above: out may be q. */
    for (size_t h = 0; h < nh; h++) {
        float inv = 1.0f / l[h];

        for (size_t d = 0; d < hd; d++)
            it->out[h * hd + d] = acc[h * hd + d] * inv;
    }
}
