/*
 * CPU backend: the AVX-512 VNNI kernel of the 256-element block types (Q4_K, Q5_K, Q6_K,
 * IQ4_XS) on the repacked layout (cpu-qrepack-k.c), the same scheme as the 32-element types' kernel
 * (cpu-qrepack-avx512.c): a column block is block b of 16 W rows, each group of 32 of it
 * 8 512-bit vpdpbusd (a broadcast 4-byte word of x against 16 rows' 4 unsigned codes), so
 * that lane r sums row r's exact int32 products of the group's two halves, s0 and s1. The
 * codes are unpacked in registers once per group for up to 8 rows of x:
 *   Q4_K  a code vector's low / high nibbles (group 2 k / 2 k + 1);
 *   Q5_K  the same, its fifth bit (bit i of the qh byte, group i) added under a byte mask;
 *   Q6_K  ql's nibble and qh's two bits put together as 0..63, the offset 32 of the
 *         format started in each lane as -32 sum(x of the half) (the halves' sums sx);
 *   IQ4_XS a group's four code vectors as a Q4_0 block's, the nibbles made the table's
 *         values + 128 by a byte shuffle, the offset 128 started as Q6_K's 32.
 * Per group and row of x, in f32 and op by op in the portable reference's order
 * (gang__cpu_qmatmul_rows_ref: no FMA, this file is built with -ffp-contract=off), the
 * scales widened from the bytes the repack unpacked:
 *   t = d_x (a0 s0 + a1 s1) + b ds     a = d sc, b = -(dmin mn) (Q6_K: a per sixteen, b 0;
 *                                       IQ4_XS: a = d (s - 32), b 0)
 * summed over the block's groups from 0 and then added to the output, as the reference
 * does, so that each output equals the portable kernel's to the bit whatever the chunk,
 * the group of 16 or the TP shard its row falls in. Q6_K and IQ4_XS leave out the
 * reference's 0 ds (it changes no sum: t's zero sign cannot reach an output that starts at +0),
 * except in a call where some ds is infinite (0 inf is a NaN there, as in the reference).
 */
#include "cpu.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) &&                      \
    defined(__AVX512VNNI__) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "cpu-qrepack-k.h"
#include "cpu-qunpack-avx2.h"

#define RPK_INLINE static inline __attribute__((always_inline))
#define RPK_MT 8       /* rows of x per pass over a group of 16 W rows */
#define RPK_AHEAD 2048 /* bytes of W asked for ahead of the group of 32 being read */

/* d (16 rows' f32) times the 16 unsigned (u) or signed bytes at p, lane by lane. */
RPK_INLINE __m512 rpk_scale(__m512 d, const uint8_t *p, int u)
{
    __m128i b = _mm_loadu_si128((const __m128i *)(const void *)p);
    __m512i v = u ? _mm512_cvtepu8_epi32(b) : _mm512_cvtepi8_epi32(b);
    return _mm512_mul_ps(d, _mm512_cvtepi32_ps(v));
}

/* Asks for bytes [a0, a1) of W after p, one cache line each. */
RPK_INLINE void rpk_ahead(const uint8_t *p, size_t a0, size_t a1)
{
    for (size_t a = a0; a < a1; a += 64)
        _mm_prefetch((const char *)p + RPK_AHEAD + a, _MM_HINT_T0);
}

/*
 * One group of 32 (column col of 32 in x's rows) of a column block against rows [r0, r0 +
 * mt) of x: the 8 code vectors w, the rows' scales a0 (elements 0-15) and a1 (16-31), pm =
 * dmin mn when with_m, each lane's offset off; blk[i] += t of row r0 + i.
 */
RPK_INLINE void rpk_rows(const int mt, const __m512i w[8], int off, __m512 a0, __m512 a1, __m512 pm,
                         int with_m, const gang__cpu_qx *qx, const int32_t *sx, size_t r0,
                         size_t col, size_t kdim, __m512 *blk)
{
    RP_UNROLL8
    for (int i = 0; i < mt; i++) {
        const size_t r = r0 + (size_t)i, gi = r * (kdim / 32) + col;
        int32_t xw[8];
        memcpy(xw, qx->q + r * kdim + 32 * col, sizeof(xw));
        __m512i s0 = _mm512_set1_epi32(-off * sx[2 * gi]);
        __m512i s1 = _mm512_set1_epi32(-off * sx[2 * gi + 1]);
        RP_UNROLL4
        for (int k = 0; k < 4; k++) {
            s0 = _mm512_dpbusd_epi32(s0, w[k], _mm512_set1_epi32(xw[k]));
            s1 = _mm512_dpbusd_epi32(s1, w[k + 4], _mm512_set1_epi32(xw[k + 4]));
        }
        /* d_x (a0 s0 + a1 s1) + b ds with b = -pm, rounded op by op as the reference does */
        __m512 h = _mm512_add_ps(_mm512_mul_ps(a0, _mm512_cvtepi32_ps(s0)),
                                 _mm512_mul_ps(a1, _mm512_cvtepi32_ps(s1)));
        __m512 v = _mm512_mul_ps(_mm512_set1_ps(qx->d[gi]), h);
        if (with_m)
            v = _mm512_sub_ps(v, _mm512_mul_ps(pm, _mm512_set1_ps(qx->ds[gi])));
        blk[i] = _mm512_add_ps(blk[i], v);
    }
}

/* The outputs of group g (16 rows, the last group's padding rows not stored). */
RPK_INLINE void rpk_store(const int mt, const gang__cpu_rp *rp, size_t g, size_t r0,
                          const __m512 *acc, float *y, size_t ldy)
{
    size_t o = g * GANG__RP_ROWS, left = rp->n - o;
    __mmask16 keep = left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1u);

    for (int i = 0; i < mt; i++)
        _mm512_mask_storeu_ps(y + (r0 + (size_t)i) * ldy + o, keep, acc[i]);
}

/* Q4_K / Q5_K (five): group gr's codes, nibble gr & 1 of vectors 8 (gr / 2) + j, Q5_K's
 * fifth bit (bit gr of its qh bytes) added under a byte mask. */
RPK_INLINE void rpk_codes45(int five, const uint8_t *c, int gr, __m512i w[8])
{
    const uint8_t *q = c + (five ? RPK_Q5 : RPK_Q4);
    const __m512i m4 = _mm512_set1_epi8(0x0f), b4 = _mm512_set1_epi8(0x10);

    RP_UNROLL8
    for (int j = 0; j < 8; j++) {
        __m512i v = _mm512_loadu_si512((const void *)(q + 64 * (8 * (gr / 2) + j)));
        w[j] = _mm512_and_si512((gr & 1) ? _mm512_srli_epi16(v, 4) : v, m4);
        if (five) {
            __m512i hb = _mm512_loadu_si512((const void *)(c + RPK_QH5 + 64 * j));
            __mmask64 k = _mm512_test_epi8_mask(hb, _mm512_set1_epi8((char)(1 << gr)));
            w[j] = _mm512_mask_add_epi8(w[j], k, w[j], b4);
        }
    }
}

/* Q6_K: group gr (half gr / 4, its group gq = gr % 4): ql's nibble | qh's two bits. */
RPK_INLINE void rpk_codes6(const uint8_t *c, int gr, __m512i w[8])
{
    const int half = gr / 4, gq = gr % 4;
    const uint8_t *ql = c + RPK6_QL + 64 * (16 * half + 8 * (gq & 1));
    const uint8_t *qh = c + RPK6_QH + 64 * 8 * half;
    const __m512i m4 = _mm512_set1_epi8(0x0f), m30 = _mm512_set1_epi8(0x30);

    RP_UNROLL8
    for (int j = 0; j < 8; j++) {
        __m512i l = _mm512_loadu_si512((const void *)(ql + 64 * j));
        __m512i h = _mm512_loadu_si512((const void *)(qh + 64 * j));
        l = _mm512_and_si512(gq >= 2 ? _mm512_srli_epi16(l, 4) : l, m4);
        h = gq == 0   ? _mm512_slli_epi16(h, 4)
            : gq == 1 ? _mm512_slli_epi16(h, 2)
            : gq == 2 ? h
                      : _mm512_srli_epi16(h, 2);
        w[j] = _mm512_ternarylogic_epi32(l, h, m30, 0xf8); /* l | (h & 0x30) */
    }
}

/* IQ4_XS: group gr's four code vectors (4 gr .. 4 gr + 3) as a Q4_0 block's, the nibbles
 * made the table's values + 128 (tbl) by a byte shuffle. */
RPK_INLINE void rpk_codes_iq4xs(const uint8_t *c, int gr, __m512i tbl, __m512i w[8])
{
    const __m512i m4 = _mm512_set1_epi8(0x0f);

    RP_UNROLL4
    for (int j = 0; j < 4; j++) {
        __m512i v = _mm512_loadu_si512((const void *)(c + RPKX_Q + 64 * (4 * gr + j)));
        w[j] = _mm512_shuffle_epi8(tbl, _mm512_and_si512(v, m4));
        w[j + 4] = _mm512_shuffle_epi8(tbl, _mm512_and_si512(_mm512_srli_epi16(v, 4), m4));
    }
}

/*
 * Group g of a weight of type t against rows [r0, r0 + mt) of x (zds: Q6_K's / IQ4_XS's 0
 * ds terms kept). Per column block b and group gr: the codes, the scales (a0 for elements
 * 0-15, a1 for 16-31; Q4_K / Q5_K also pm = dmin mn) and the codes' offset, then rpk_rows.
 */
RPK_INLINE void rpk_group(gang_kernels_wtype t, const int mt, int zds, const gang__cpu_rp *rp,
                          const gang__cpu_qx *qx, const int32_t *sx, size_t g, size_t r0, float *y,
                          size_t ldy)
{
    const int with_m = t == GANG_KW_Q4_K || t == GANG_KW_Q5_K;
    const int off = qavx_offset(t);
    const int sc_at = t == GANG_KW_Q6_K ? RPK6_SC : t == GANG_KW_IQ4_XS ? RPKX_SC : RPK_SC;
    const size_t nb = rp->nb, kdim = rp->kdim, cb = rp->cb;
    const uint8_t *c = rp->body + g * nb * cb;
    const __m512i tbl = _mm512_broadcast_i32x4(qavx_iq4_table(1)); /* IQ4_XS */
    __m512 acc[RPK_MT], blk[RPK_MT];

    for (int i = 0; i < mt; i++)
        acc[i] = _mm512_setzero_ps();
    for (size_t b = 0; b < nb; b++, c += cb) {
        __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)c));
        __m512 mw =
            with_m ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)(c + 32)))
                   : _mm512_setzero_ps();
        for (int i = 0; i < mt; i++)
            blk[i] = _mm512_setzero_ps();
        for (int gr = 0; gr < 8; gr++) {
            __m512i w[8];
            __m512 a0, a1, pm = _mm512_setzero_ps();
            rpk_ahead(c, cb * (size_t)gr / 8, cb * (size_t)(gr + 1) / 8);
            if (t == GANG_KW_Q6_K) {
                rpk_codes6(c, gr, w);
                a0 = rpk_scale(dw, c + sc_at + 16 * (2 * gr), 0);
                a1 = rpk_scale(dw, c + sc_at + 16 * (2 * gr + 1), 0);
            } else {
                if (t == GANG_KW_IQ4_XS)
                    rpk_codes_iq4xs(c, gr, tbl, w);
                else
                    rpk_codes45(t == GANG_KW_Q5_K, c, gr, w);
                a0 = a1 = rpk_scale(dw, c + sc_at + 16 * gr, with_m);
            }
            if (with_m)
                pm = rpk_scale(mw, c + RPK_MN + 16 * gr, 1);
            rpk_rows(mt, w, off, a0, a1, pm, with_m || zds, qx, sx, r0, 8 * b + (size_t)gr, kdim,
                     blk);
        }
        for (int i = 0; i < mt; i++)
            acc[i] = _mm512_add_ps(acc[i], blk[i]);
    }
    rpk_store(mt, rp, g, r0, acc, y, ldy);
}

/* Groups [g0, g1) against every row of x, type t. */
RPK_INLINE void rpk_groups(gang_kernels_wtype t, int zds, size_t m, const gang__cpu_qx *qx,
                           const int32_t *sx, const gang__cpu_rp *rp, size_t g0, size_t g1,
                           float *y, size_t ldy)
{
    for (size_t g = g0; g < g1; g++)
        for (size_t r0 = 0; r0 < m; r0 += RPK_MT) {
            switch (m - r0 < RPK_MT ? m - r0 : RPK_MT) {
            case 1:
                rpk_group(t, 1, zds, rp, qx, sx, g, r0, y, ldy);
                break;
            case 2:
                rpk_group(t, 2, zds, rp, qx, sx, g, r0, y, ldy);
                break;
            case 3:
                rpk_group(t, 3, zds, rp, qx, sx, g, r0, y, ldy);
                break;
            case 4:
                rpk_group(t, 4, zds, rp, qx, sx, g, r0, y, ldy);
                break;
            case 5:
                rpk_group(t, 5, zds, rp, qx, sx, g, r0, y, ldy);
                break;
            case 6:
                rpk_group(t, 6, zds, rp, qx, sx, g, r0, y, ldy);
                break;
            case 7:
                rpk_group(t, 7, zds, rp, qx, sx, g, r0, y, ldy);
                break;
            default:
                rpk_group(t, 8, zds, rp, qx, sx, g, r0, y, ldy);
                break;
            }
        }
}

/* 1 when some ds of x's rows is infinite (the reference's 0 ds is then a NaN). */
static int rpk_ds_inf(size_t m, size_t kdim, const gang__cpu_qx *qx)
{
    for (size_t i = 0; i < m * (kdim / 32); i++)
        if (isinf(qx->ds[i]))
            return 1;
    return 0;
}

void gang__cpu_rpk_rows_avx512(size_t m, const gang__cpu_qx *qx, const int32_t *sx,
                               const gang__cpu_rp *rp, size_t g0, size_t g1, float *y, size_t ldy)
{
    switch (rp->type) { /* one instance per type, so that its tests fold away */
    case GANG_KW_Q4_K:
        rpk_groups(GANG_KW_Q4_K, 0, m, qx, sx, rp, g0, g1, y, ldy);
        return;
    case GANG_KW_Q5_K:
        rpk_groups(GANG_KW_Q5_K, 0, m, qx, sx, rp, g0, g1, y, ldy);
        return;
    case GANG_KW_Q6_K:
        rpk_groups(GANG_KW_Q6_K, rpk_ds_inf(m, rp->kdim, qx), m, qx, sx, rp, g0, g1, y, ldy);
        return;
    case GANG_KW_IQ4_XS:
        rpk_groups(GANG_KW_IQ4_XS, rpk_ds_inf(m, rp->kdim, qx), m, qx, sx, rp, g0, g1, y, ldy);
        return;
    default:
        return;
    }
}

#else /* built without the AVX-512 VNNI flags: no repacked layout is ever made */

void gang__cpu_rpk_rows_avx512(size_t m, const gang__cpu_qx *qx, const int32_t *sx,
                               const gang__cpu_rp *rp, size_t g0, size_t g1, float *y, size_t ldy)
{
    (void)sx;
    (void)gang__cpu_rp_rows_ref(m, qx, rp, g0, g1, y, ldy);
}

#endif
