/*
 * The CPU attention's work item (gang__cpu_attn_item, cpu.h), written once and compiled
 * twice: cpu-attention.c includes it with scalar primitives (the portable kernel) and
 * cpu-attention-avx2.c with AVX2 + FMA + F16C ones. No include guard on purpose. Before
 * including it a file defines ATTN_ITEM_FN (the function's name) and these static inline
 * primitives, all over f32:
 *
 *   void attn_widen_into(const void *src, gang_dtype dt, size_t n, float *dst)
 *       the n elements at src (F32, BF16 or F16) as f32 into dst
 *   void attn_scores(const float *q, const float *const *kr, size_t nt, size_t hd,
 *                    float scale, float *s)   s[t] = (q . kr[t][0 .. hd)) x scale, t < nt
 *   void attn_pv(float *acc, const float *p, const float *const *vr, size_t nt, size_t hd)
 *                                     acc[d] += sum over t < nt of p[t] vr[t][d]
 *   void attn_scal(float *y, float a, size_t n)                    y[i] *= a
 *   float attn_exp_sum(float *s, size_t n, float m)                s[i] = exp(s[i] - m),
 *                                                                  returns their sum
 *
 * Algorithm (one query row, `heads` heads sharing one kv head): the keys are taken a tile
 * at a time (it->tile keys, a function of head_dim only). A tile's key rows are found
 * block run by block run (a paged cache costs one table lookup per block, not per key),
 * read in place from an f32 cache or widened into one f32 buffer from a half one, and
 * scored against every head; then the softmax runs online: the
 * running maximum m and denominator l of each head are updated with the tile's, the
 * accumulated output is rescaled by exp(m_old - m_new) when the maximum grew, and the
 * tile's weights exp(s - m) times its value rows (found the same way) are added to it.
 * At the end each head's accumulator is divided by its l. The scratch is bounded (no
 * array of n_keys scores), so a context of any length needs nothing from the heap, and
 * the item's result depends only on its query and its keys: a decode step gives the rows
 * a prefill of the same tokens gives, and batching does not change a sequence's numbers.
 */

/*
 * Rows j0 .. j0 + nt - 1 of a cache (this item's columns) as f32 rows: rows[t] is key
 * j0 + t's row, in the cache itself for an f32 cache (read in place: copying it was 4% of
 * a batch-1 decode profile, SmolLM2 Q4_1, 2026-12-04), else widened into dst [nt, head_dim].
 */
static inline void attn_item_rows(const gang__cpu_attn_item *it, const void *base, size_t j0,
                                  size_t nt, float *dst, const float **rows)
{
    const gang_kernels_kv_pages *pg = it->pg;
    size_t es = it->dt == GANG_DTYPE_F32 ? 4 : 2, hd = it->head_dim;

    for (size_t t = 0; t < nt;) {
        size_t j = j0 + t, row = gang__cpu_kv_row(pg, j), run = nt - t;

        /* Rows stay consecutive to the end of j's block. */
        if (pg != NULL && pg->block_size - j % pg->block_size < run)
            run = pg->block_size - j % pg->block_size;
        for (size_t r = 0; r < run; r++, t++) {
            const void *src = (const char *)base + ((row + r) * it->row_w + it->off) * es;

            if (it->dt == GANG_DTYPE_F32) {
                rows[t] = src;
                continue;
            }
            attn_widen_into(src, it->dt, hd, dst + t * hd);
            rows[t] = dst + t * hd;
        }
    }
}

void ATTN_ITEM_FN(const gang__cpu_attn_item *it)
{
    float s[GANG__ATTN_HEADS][GANG__ATTN_TILE], m[GANG__ATTN_HEADS], l[GANG__ATTN_HEADS];
    const float *kr[GANG__ATTN_TILE], *vr[GANG__ATTN_TILE];
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

        attn_item_rows(it, it->kc, j0, nt, kt, kr);
        for (size_t h = 0; h < nh; h++) {
            float mt = m[h], alpha;

            attn_scores(it->q + h * hd, kr, nt, hd, it->scale, s[h]);
            for (size_t t = 0; t < nt; t++)
                mt = s[h][t] > mt ? s[h][t] : mt;
            /* The first tile: m was -inf and acc, l are 0 (alpha 0 keeps them so). */
            alpha = m[h] == -INFINITY ? 0.0f : expf(m[h] - mt);
            l[h] = l[h] * alpha + attn_exp_sum(s[h], nt, mt);
            if (alpha != 1.0f)
                attn_scal(acc + h * hd, alpha, hd);
            m[h] = mt;
        }
        attn_item_rows(it, it->vc, j0, nt, vt, vr);
        for (size_t h = 0; h < nh; h++)
            attn_pv(acc + h * hd, s[h], vr, nt, hd);
    }
    /* Every query row of the item was read by the scores above: out may be q. */
    for (size_t h = 0; h < nh; h++) {
        float inv = 1.0f / l[h];

        for (size_t d = 0; d < hd; d++)
            it->out[h * hd + d] = acc[h * hd + d] * inv;
    }
}
