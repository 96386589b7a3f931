/*
 * The CPU attention's work item (gang__cpu_attn_item, cpu.h), written once and compiled
 * twice: cpu-attention.c includes it with scalar primitives (the portable kernel) and
 * cpu-attention-avx2.c with AVX2 + FMA + F16C ones. No include guard on purpose. Before
 * including it a file defines ATTN_ITEM_FN (the function's name) and these static inline
 * primitives, all over f32:
 *
 *   void attn_widen_into(const void *src, gang_dtype dt, size_t n, float *dst)
 *       the n elements at src (F32, BF16 or F16) as f32 into dst
 *   void attn_scores(const float *q, const float *kt, size_t nt, size_t hd, float scale,
 *                    float *s)        s[t] = (q . kt[t * hd ..]) x scale for t < nt
 *   void attn_pv(float *acc, const float *p, const float *vt, size_t nt, size_t hd)
 *                                     acc[d] += sum over t < nt of p[t] vt[t * hd + d]
 *   void attn_scal(float *y, float a, size_t n)                    y[i] *= a
 *   float attn_exp_sum(float *s, size_t n, float m)                s[i] = exp(s[i] - m),
 *                                                                  returns their sum
 *
 * Algorithm (one query row, `heads` heads sharing one kv head): the keys are taken a tile
 * at a time (it->tile keys, a function of head_dim only). A tile's key rows are widened
 * into one f32 buffer, block run by block run (a paged cache costs one table lookup per
 * block, not per key), and scored against every head; then the softmax runs online: the
 * running maximum m and denominator l of each head are updated with the tile's, the
 * accumulated output is rescaled by exp(m_old - m_new) when the maximum grew, and the
 * tile's weights exp(s - m) times its value rows (widened the same way) are added to it.
 * At the end each head's accumulator is divided by its l. The scratch is bounded (no
 * array of n_keys scores), so a context of any length needs nothing from the heap, and
 * the item's result depends only on its query and its keys: a decode step gives the rows
 * a prefill of the same tokens gives, and batching does not change a sequence's numbers.
 */

/* Rows j0 .. j0 + nt - 1 of a cache (this item's columns) as f32 into dst [nt, head_dim]. */
static inline void attn_item_tile(const gang__cpu_attn_item *it, const void *base, size_t j0,
                                  size_t nt, float *dst)
{
    const gang_kernels_kv_pages *pg = it->pg;
    size_t es = it->dt == GANG_DTYPE_F32 ? 4 : 2, hd = it->head_dim;

    for (size_t t = 0; t < nt;) {
        size_t j = j0 + t, row = gang__cpu_kv_row(pg, j), run = nt - t;

        /* Rows stay consecutive to the end of j's block. */
        if (pg != NULL && pg->block_size - j % pg->block_size < run)
            run = pg->block_size - j % pg->block_size;
        for (size_t r = 0; r < run; r++, t++)
            attn_widen_into((const char *)base + ((row + r) * it->row_w + it->off) * es, it->dt, hd,
                            dst + t * hd);
    }
}

void ATTN_ITEM_FN(const gang__cpu_attn_item *it)
{
    float s[GANG__ATTN_HEADS][GANG__ATTN_TILE], m[GANG__ATTN_HEADS], l[GANG__ATTN_HEADS];
    size_t hd = it->head_dim, nh = it->heads;
    float *acc = it->acc, *kt = it->kt, *vt = it->vt;

    for (size_t h = 0; h < nh; h++) {
        m[h] = -INFINITY;
        l[h] = 0.0f;
        for (size_t d = 0; d < hd; d++)
            acc[h * hd + d] = 0.0f;
    }
    for (size_t j0 = it->first; j0 < it->n_keys; j0 += it->tile) {
        size_t nt = it->n_keys - j0 < it->tile ? it->n_keys - j0 : it->tile;

        attn_item_tile(it, it->kc, j0, nt, kt);
        for (size_t h = 0; h < nh; h++) {
            float mt = m[h], alpha;

            attn_scores(it->q + h * hd, kt, nt, hd, it->scale, s[h]);
            for (size_t t = 0; t < nt; t++)
                mt = s[h][t] > mt ? s[h][t] : mt;
            /* The first tile: m was -inf and acc, l are 0 (alpha 0 keeps them so). */
            alpha = m[h] == -INFINITY ? 0.0f : expf(m[h] - mt);
            l[h] = l[h] * alpha + attn_exp_sum(s[h], nt, mt);
            if (alpha != 1.0f)
                attn_scal(acc + h * hd, alpha, hd);
            m[h] = mt;
        }
        attn_item_tile(it, it->vc, j0, nt, vt);
        for (size_t h = 0; h < nh; h++)
            attn_pv(acc + h * hd, s[h], vt, nt, hd);
    }
    /* Every query row of the item was read by the scores above: out may be q. */
    for (size_t h = 0; h < nh; h++) {
        float inv = 1.0f / l[h];

        for (size_t d = 0; d < hd; d++)
            it->out[h * hd + d] = acc[h * hd + d] * inv;
    }
}
