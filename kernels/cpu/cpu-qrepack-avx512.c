/*
 * CPU backend: the AVX-512 VNNI kernel of the block product on the repacked layout
 * (cpu-qrepack.c describes it). Compiled with the AVX-512 flags of cpu-qmatmul-avx512.c
 * and called only when gang__cpu_simd() says the CPU runs them (level 2).
 *
 * One column block (block b of 16 W rows) is 8 steps of one 512-bit vpdpbusd each: the
 * step's 16 x 4 unsigned codes against x's 4 int8 of the step broadcast to every lane, so
 * that lane r sums row r's exact int32 product of the block (|lane| <= 32 x 255 x 127):
 * no horizontal reduction, the rows' scales one vector, the weights read once in file
 * order. The offsets of the signed types (Q4_0 8, Q5_0 16, Q8_0 128) start each lane at
 * -o sum(x of the half block), each half of a block in its own lanes (steps 0-3 are
 * elements 0-15, steps 4-7 elements 16-31). IQ4_NL's nibbles index its table: a byte
 * shuffle makes them the table's values + 128, offset 128 as Q8_0's. Then per block and
 * row of x, in f32 and op by op in the portable reference's order
 * (gang__cpu_qmatmul_rows_ref: no FMA, this file is built with -ffp-contract=off):
 *   y += d_x (d_w s0 + d_w s1) + m_w ds_x      (m_w = 0 for the types without a minimum)
 * so each output equals the reference's to the bit, whatever the chunk, the group or the
 * TP shard a row falls in. (The file-layout AVX2 / AVX-512 kernels sum in 8 lanes: another
 * order, within 1e-5 of it.)
 *
 * The rows of x go MT at a time (MT <= 8) with the block's codes unpacked once in registers
 * for all of them: decode (m <= 8) is one pass over W, batched m re-reads each group (a few
 * KiB to a few tens of KiB) from L1 / L2 per 8 rows of x.
 */
#include "cpu.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) &&                      \
    defined(__AVX512VNNI__) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#include <string.h>

#include "cpu-qunpack-avx2.h"

#define RP_INLINE static inline __attribute__((always_inline))
#define RP_MT 8       /* rows of x per pass over a group */
#define RP_AHEAD 2048 /* bytes of W asked for ahead of the column block being read */

/* The 8 steps' code vectors of column block c of type t (tbl: IQ4_NL's table + 128 in
 * every 128-bit lane). */
RP_INLINE void rp_codes(gang_kernels_wtype t, const uint8_t *c, __m512i tbl, __m512i w[8])
{
    const int with_m = t == GANG_KW_Q4_1 || t == GANG_KW_Q5_1;
    const int five = t == GANG_KW_Q5_0 || t == GANG_KW_Q5_1;
    const uint8_t *q = c + 32 + 32 * with_m + 64 * five;

    if (t == GANG_KW_Q8_0) {
        RP_UNROLL8
        for (int s = 0; s < 8; s++)
            w[s] = _mm512_loadu_si512((const void *)(q + 64 * s));
        return;
    }
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    RP_UNROLL4
    for (int j = 0; j < 4; j++) {
        __m512i v = _mm512_loadu_si512((const void *)(q + 64 * j));
        w[j] = _mm512_and_si512(v, m4);
        w[j + 4] = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
    }
    if (t == GANG_KW_IQ4_NL) {
        RP_UNROLL8
        for (int s = 0; s < 8; s++)
            w[s] = _mm512_shuffle_epi8(tbl, w[s]);
    }
    if (five) {
        const uint8_t *h = c + 32 + 32 * with_m;
        const __m512i bit = _mm512_set1_epi8(0x10);
        RP_UNROLL8
        for (int s = 0; s < 8; s++) {
            uint64_t k;
            memcpy(&k, h + 8 * s, 8);
            w[s] = _mm512_or_si512(w[s], _mm512_maskz_mov_epi8(k, bit));
        }
    }
}

/*
 * Group g of the repacked weight against rows [r0, r0 + MT) of x: 16 outputs per row, the
 * last group's padding rows not stored.
 */
RP_INLINE void rp_group(gang_kernels_wtype t, const int mt, const gang__cpu_rp *rp,
                        const gang__cpu_qx *qx, const int32_t *sx, size_t g, size_t r0, float *y,
                        size_t ldy)
{
    const int with_m = t == GANG_KW_Q4_1 || t == GANG_KW_Q5_1;
    const size_t nb = rp->nb, kdim = rp->kdim, cb = rp->cb;
    const uint8_t *c = rp->body + g * nb * cb;
    const __m512i tbl = _mm512_broadcast_i32x4(qavx_iq4_table(1)); /* IQ4_NL */
    __m512 acc[RP_MT];

    for (int i = 0; i < mt; i++)
        acc[i] = _mm512_setzero_ps();
    for (size_t b = 0; b < nb; b++, c += cb) {
        __m512i w[8];
        for (size_t a = 0; a < cb; a += 64)
            _mm_prefetch((const char *)c + RP_AHEAD + a, _MM_HINT_T0);
        __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)c));
        __m512 mw =
            with_m ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)(c + 32)))
                   : _mm512_setzero_ps(); /* 0 x ds: the reference's b = 0 term */
        rp_codes(t, c, tbl, w);
        RP_UNROLL8
        for (int i = 0; i < mt; i++) {
            const size_t r = r0 + (size_t)i, gi = r * nb + b;
            int32_t xw[8];
            memcpy(xw, qx->q + r * kdim + 32 * b, sizeof(xw));
            __m512i s0 = _mm512_set1_epi32(-qavx_offset(t) * sx[2 * gi]);
            __m512i s1 = _mm512_set1_epi32(-qavx_offset(t) * sx[2 * gi + 1]);
            RP_UNROLL4
            for (int k = 0; k < 4; k++) {
                s0 = _mm512_dpbusd_epi32(s0, w[k], _mm512_set1_epi32(xw[k]));
                s1 = _mm512_dpbusd_epi32(s1, w[k + 4], _mm512_set1_epi32(xw[k + 4]));
            }
            /* d_x (d_w s0 + d_w s1) + m_w ds, rounded op by op as the reference does */
            __m512 h = _mm512_add_ps(_mm512_mul_ps(dw, _mm512_cvtepi32_ps(s0)),
                                     _mm512_mul_ps(dw, _mm512_cvtepi32_ps(s1)));
            __m512 v = _mm512_mul_ps(_mm512_set1_ps(qx->d[gi]), h);
            v = _mm512_add_ps(v, _mm512_mul_ps(mw, _mm512_set1_ps(qx->ds[gi])));
            acc[i] = _mm512_add_ps(acc[i], v);
        }
    }
    size_t o = g * GANG__RP_ROWS, left = rp->n - o;
    __mmask16 keep = left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1u);
    for (int i = 0; i < mt; i++)
        _mm512_mask_storeu_ps(y + (r0 + (size_t)i) * ldy + o, keep, acc[i]);
}

/* Groups [g0, g1) against every row of x, type t. */
RP_INLINE void rp_groups(gang_kernels_wtype t, size_t m, const gang__cpu_qx *qx, const int32_t *sx,
                         const gang__cpu_rp *rp, size_t g0, size_t g1, float *y, size_t ldy)
{
    for (size_t g = g0; g < g1; g++)
        for (size_t r0 = 0; r0 < m; r0 += RP_MT) {
            switch (m - r0 < RP_MT ? m - r0 : RP_MT) {
            case 1:
                rp_group(t, 1, rp, qx, sx, g, r0, y, ldy);
                break;
            case 2:
                rp_group(t, 2, rp, qx, sx, g, r0, y, ldy);
                break;
            case 3:
                rp_group(t, 3, rp, qx, sx, g, r0, y, ldy);
                break;
            case 4:
                rp_group(t, 4, rp, qx, sx, g, r0, y, ldy);
                break;
            case 5:
                rp_group(t, 5, rp, qx, sx, g, r0, y, ldy);
                break;
            case 6:
                rp_group(t, 6, rp, qx, sx, g, r0, y, ldy);
                break;
            case 7:
                rp_group(t, 7, rp, qx, sx, g, r0, y, ldy);
                break;
            default:
                rp_group(t, 8, rp, qx, sx, g, r0, y, ldy);
                break;
            }
        }
}

void gang__cpu_rp_rows_avx512(size_t m, const gang__cpu_qx *qx, const int32_t *sx,
                              const gang__cpu_rp *rp, size_t g0, size_t g1, float *y, size_t ldy)
{
    switch (rp->type) { /* one instance per type, so that its tests fold away */
    case GANG_KW_Q8_0:
        rp_groups(GANG_KW_Q8_0, m, qx, sx, rp, g0, g1, y, ldy);
        return;
    case GANG_KW_Q4_0:
        rp_groups(GANG_KW_Q4_0, m, qx, sx, rp, g0, g1, y, ldy);
        return;
    case GANG_KW_Q4_1:
        rp_groups(GANG_KW_Q4_1, m, qx, sx, rp, g0, g1, y, ldy);
        return;
    case GANG_KW_Q5_0:
        rp_groups(GANG_KW_Q5_0, m, qx, sx, rp, g0, g1, y, ldy);
        return;
    case GANG_KW_Q5_1:
        rp_groups(GANG_KW_Q5_1, m, qx, sx, rp, g0, g1, y, ldy);
        return;
    case GANG_KW_IQ4_NL:
        rp_groups(GANG_KW_IQ4_NL, m, qx, sx, rp, g0, g1, y, ldy);
        return;
    case GANG_KW_Q4_K:
    case GANG_KW_Q5_K:
    case GANG_KW_Q6_K:
    case GANG_KW_IQ4_XS:
        gang__cpu_rpk_rows_avx512(m, qx, sx, rp, g0, g1, y, ldy); /* cpu-qrepack-k-avx512.c */
        return;
    default:
        return; /* gang__cpu_rp_get accepts no other type */
    }
}

int gang__cpu_rp_usable(void)
{
    return 1;
}

#else /* built without the AVX-512 VNNI flags: no repacked layout is ever made */

void gang__cpu_rp_rows_avx512(size_t m, const gang__cpu_qx *qx, const int32_t *sx,
                              const gang__cpu_rp *rp, size_t g0, size_t g1, float *y, size_t ldy)
{
    (void)sx;
    (void)gang__cpu_rp_rows_ref(m, qx, rp, g0, g1, y, ldy);
}

int gang__cpu_rp_usable(void)
{
    return 0;
}

#endif
