/*
 * CPU backend: the AVX-512 VNNI kernel of the block-weight product (cpu-qmatmul.c has the
 * algorithm and the portable reference, cpu-qmatmul-avx2.c the AVX2 kernel this one
 * follows). Compiled with -mavx512f -mavx512bw -mavx512vl -mavx512vnni on top of the AVX2
 * flags and called only when gang__cpu_simd() says the CPU runs them (level 2).
 *
 * The integer product of a group of 32 is one vpdpbusd on 256-bit vectors (AVX-512VL:
 * no 512-bit frequency penalty, and a group is 32 bytes): unsigned quants times x's
 * signed int8, four products summed into each of 8 int32 lanes, lanes 0-3 the group's
 * first 16 elements and 4-7 its last 16 -- where AVX2 needs two sign moves, maddubs and
 * madd. The types whose quants are unsigned (Q4_1, Q5_1, Q4_K, Q5_K) go in as they are.
 * The signed ones (Q8_0, Q4_0, Q5_0, Q6_K: codes c minus an offset o, cpu-qunpack-avx2.h)
 * in the decode tiles: c meets x and the lanes start from -o sum x (one vpdpbusd of x
 * with ones and a shift per group of x, shared by the tile's four W rows); in the
 * batched rows: |q| meets x with q's sign (|q| <= 128 fits the unsigned operand; one
 * sign move per pair, |q| computed once per block for all rows of x). Every product is
 * exact int32 (|lane| <= 4 x 255 x 127 + 128 x 4 x 127), so this kernel computes the same
 * integers as the others; only the f32 summation order differs.
 */
#include "cpu.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) &&                      \
    defined(__AVX512VNNI__) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#include <string.h>

#include "cpu-avx2.h"
#include "cpu-qunpack-avx2.h"
#include "kernels-blocks.h"

#define QV_INLINE static inline __attribute__((always_inline))
#define QV_MROWS 16   /* rows of x per pass over a block (as the AVX2 kernel) */
#define QV_AHEAD 1024 /* bytes of W asked for ahead of the block being read */
#define QV_DEC_M 2    /* up to this many rows of x: the decode tiles (qv_dec4) */

int gang__cpu_avx512_usable(void)
{
    __builtin_cpu_init();
    return gang__cpu_avx2_usable() && __builtin_cpu_supports("avx512f") &&
           __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
           __builtin_cpu_supports("avx512vnni");
}

/* The int32 products of a group's two halves in lanes 0-3 and 4-7, q signed or unsigned
 * as qv_unpack gave it for the rows (qa = |q| for the signed types). */
QV_INLINE __m256i qv_dot(gang_kernels_wtype t, __m256i q, __m256i qa, __m256i xq)
{
    if (qavx_offset_log2(t) >= 0)
        return _mm256_dpbusd_epi32(_mm256_setzero_si256(), qa, _mm256_sign_epi8(xq, q));
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), q, xq);
}

/* -o sum x per lane of a group of x (lanes as qv_dot's), o the offset of t's codes. */
QV_INLINE __m256i qv_xoff(gang_kernels_wtype t, __m256i xq)
{
    __m256i s = _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_set1_epi8(1), xq);
    return _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(s, qavx_offset_log2(t)));
}

/* A group's scale times x's: one value, or Q6_K's two halves. */
QV_INLINE __m256 qv_scale(gang_kernels_wtype t, const float *a, size_t g, float dx)
{
    if (t == GANG_KW_Q6_K)
        return _mm256_set_m128(_mm_set1_ps(dx * a[2 * g + 1]), _mm_set1_ps(dx * a[2 * g]));
    return _mm256_set1_ps(dx * a[2 * g]);
}

/* The same for two groups of x (64 bytes), or zeros when t's codes have no offset. */
QV_INLINE __m512i qv_xoff2(gang_kernels_wtype t, __m512i xv)
{
    if (qavx_offset_log2(t) < 0)
        return _mm512_setzero_si512();
    __m512i sx = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8(1), xv);
    return _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(sx, qavx_offset_log2(t)));
}

/* One block unpacked for the rows' qv_dot: q (signed for the types with an offset) and
 * their |q|. */
QV_INLINE void qv_unpack(gang_kernels_wtype t, const uint8_t *p, __m256i *q, __m256i *qa, float *a,
                         float *b)
{
    size_t e = 0, bb = 0;

    gang_kernels_wtype_block(t, &e, &bb);
    qavx_unpack(t, p, q, a, b, 0);
    for (size_t g = 0; qavx_offset_log2(t) >= 0 && g < e / 32; g++)
        qa[g] = _mm256_abs_epi8(q[g]);
}

/*
 * Decode (few rows of x): W rows o .. o + 3 against x row r, four independent
 * accumulators in registers sharing x's loads and scales (as qavx_dec4).
 */
QV_INLINE void qv_dec4(gang_kernels_wtype t, size_t kdim, const gang__cpu_qx *qx,
                       const gang_kernels_weight *w, size_t o, size_t r, float *y, size_t ldy)
{
    size_t e = 0, bb = 0, groups = kdim / 32;
    const int has_b =
        t == GANG_KW_Q4_1 || t == GANG_KW_Q5_1 || t == GANG_KW_Q4_K || t == GANG_KW_Q5_K;
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                     _mm256_setzero_ps()};
    float off[4] = {0.0f, 0.0f, 0.0f, 0.0f};

    gang_kernels_wtype_block(t, &e, &bb);
    const size_t rowb = (kdim / e) * bb;
    const uint8_t *row0 = (const uint8_t *)w->data + o * rowb;
    const int8_t *xq = qx->q + r * kdim;
    const float *xd = qx->d + r * groups, *xs = qx->ds + r * groups;
    for (size_t blk = 0; blk < kdim / e; blk++) {
        __m256i q[4][8];
        float a[4][16], b[4][8];
        for (int k = 0; k < 4; k++) {
            const char *pf = (const char *)row0 + k * rowb + blk * bb + QV_AHEAD;
            for (size_t c = 0; c < bb; c += 64)
                _mm_prefetch(pf + c, _MM_HINT_T0);
            qavx_unpack(t, row0 + k * rowb + blk * bb, q[k], a[k], b[k], 1);
        }
        for (size_t g = 0; g < e / 32; g++) {
            __m256i xv = _mm256_loadu_si256((const __m256i *)(const void *)(xq + blk * e + 32 * g));
            __m256i x0 = qavx_offset_log2(t) >= 0 ? qv_xoff(t, xv) : _mm256_setzero_si256();
            float dx = xd[blk * e / 32 + g];
            for (int k = 0; k < 4; k++) {
                __m256 s = _mm256_cvtepi32_ps(_mm256_dpbusd_epi32(x0, q[k][g], xv));
                acc[k] = _mm256_fmadd_ps(s, qv_scale(t, a[k], g, dx), acc[k]);
                if (has_b)
                    off[k] += b[k][g] * xs[blk * e / 32 + g];
            }
        }
    }
    for (int k = 0; k < 4; k++)
        y[r * ldy + o + (size_t)k] = gang__avx2_hsum(acc[k]) + off[k];
}

/*
 * Two consecutive blocks of a 32-element type (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL) as one
 * 512-bit vector of unsigned codes (block p's 32 then block p + bb's; the fifth bits of
 * Q5_0 / Q5_1 by one masked move of AVX-512BW; IQ4_NL's table values + 128 by a byte
 * shuffle), and their f16 fields as [d0, m0, d1, m1] (m = 0 for the types without one).
 */
QV_INLINE __m512i qv_pair(gang_kernels_wtype t, const uint8_t *p, size_t bb, __m128 *dm)
{
    const int with_m = t == GANG_KW_Q4_1 || t == GANG_KW_Q5_1;
    uint32_t f0 = 0, f1 = 0;

    memcpy(&f0, p, with_m ? 4 : 2);
    memcpy(&f1, p + bb, with_m ? 4 : 2);
    *dm = _mm_cvtph_ps(_mm_set_epi32(0, 0, (int)f1, (int)f0));
    if (t == GANG_KW_Q8_0) {
        __m512i q = _mm512_inserti64x4(
            _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(const void *)(p + 2))),
            _mm256_loadu_si256((const __m256i *)(const void *)(p + bb + 2)), 1);
        return _mm512_xor_si512(q, _mm512_set1_epi8((char)0x80));
    }
    const int five = t == GANG_KW_Q5_0 || t == GANG_KW_Q5_1;
    const size_t at = 2 + 2 * (size_t)with_m + 4 * (size_t)five; /* the nibbles */
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    __m256i v = _mm256_inserti128_si256(
        _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(const void *)(p + at))),
        _mm_loadu_si128((const __m128i *)(const void *)(p + bb + at)), 1);
    __m512i lo = _mm512_castsi256_si512(_mm256_and_si256(v, m4));
    __m512i hi = _mm512_castsi256_si512(_mm256_and_si256(_mm256_srli_epi16(v, 4), m4));
    /* [lo0 hi0 lo1 hi1] in 64-bit units: elements 0-15, 16-31 of each block in turn */
    __m512i q = _mm512_permutex2var_epi64(lo, _mm512_setr_epi64(0, 1, 8, 9, 2, 3, 10, 11), hi);
    if (five) { /* the fifth bits: element j's is bit j of the 32 bits before the nibbles */
        uint32_t h0, h1;
        memcpy(&h0, p + at - 4, 4);
        memcpy(&h1, p + bb + at - 4, 4);
        q = _mm512_or_si512(
            q, _mm512_maskz_mov_epi8(((__mmask64)h1 << 32) | h0, _mm512_set1_epi8(0x10)));
    }
    if (t == GANG_KW_IQ4_NL) /* the table in each 128-bit lane, the codes its indices */
        q = _mm512_shuffle_epi8(_mm512_broadcast_i32x4(qavx_iq4_table(1)), q);
    return q;
}

/*
 * The decode tile of qv_dec4 for the 32-element types over pairs of blocks (an even number of
 * blocks per row): one vpdpbusd of 64 bytes per pair and W row, the two blocks' scales
 * times x's ([d0 dx0, m0 ds0, d1 dx1, m1 ds1]: one f16 conversion, one product), then the
 * two groups' FMAs and offsets one after the other in the AVX2 kernel's order, so that
 * the results are the AVX2 kernel's to the bit (summing the pair in 16 lanes moved a
 * SmolLM2 Q4_1 run's logprobs by up to 0.1 nats at the first token: the int8 rounding
 * of the activations turns last-bit differences into visible ones).
 */
QV_INLINE void qv_dec4p(gang_kernels_wtype t, size_t kdim, const gang__cpu_qx *qx,
                        const gang_kernels_weight *w, size_t o, size_t r, float *y, size_t ldy)
{
    size_t e = 0, bb = 0, groups = kdim / 32;
    const int has_b = t == GANG_KW_Q4_1 || t == GANG_KW_Q5_1;
    __m256 acc[4];
    float off[4] = {0.0f, 0.0f, 0.0f, 0.0f};

    gang_kernels_wtype_block(t, &e, &bb);
    const size_t rowb = groups * bb;
    const uint8_t *row0 = (const uint8_t *)w->data + o * rowb;
    const int8_t *xq = qx->q + r * kdim;
    const float *xd = qx->d + r * groups, *xs = qx->ds + r * groups;
    for (int k = 0; k < 4; k++)
        acc[k] = _mm256_setzero_ps();
    for (size_t g = 0; g < groups; g += 2) {
        __m512i xv = _mm512_loadu_si512((const void *)(xq + 32 * g)), x0 = qv_xoff2(t, xv);
        __m128 dxs =
            _mm_unpacklo_ps(_mm_castpd_ps(_mm_load_sd((const double *)(const void *)(xd + g))),
                            _mm_castpd_ps(_mm_load_sd((const double *)(const void *)(xs + g))));
        for (int k = 0; k < 4; k++) {
            const uint8_t *p = row0 + k * rowb + g * bb;
            __m128 dm;
            _mm_prefetch((const char *)p + QV_AHEAD, _MM_HINT_T0);
            __m512i qz = qv_pair(t, p, bb, &dm);
            __m128 sc = _mm_mul_ps(dm, dxs);
            __m512 s = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(x0, qz, xv));
            __m256 s1 = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(s), 1));
            /* group by group, in the AVX2 kernel's order: the same f32 results */
            acc[k] = _mm256_fmadd_ps(_mm512_castps512_ps256(s), _mm256_broadcastss_ps(sc), acc[k]);
            acc[k] = _mm256_fmadd_ps(s1, _mm256_broadcastss_ps(_mm_movehl_ps(sc, sc)), acc[k]);
            if (has_b) {
                off[k] += _mm_cvtss_f32(_mm_shuffle_ps(sc, sc, 1));
                off[k] += _mm_cvtss_f32(_mm_shuffle_ps(sc, sc, 3));
            }
        }
    }
    for (int k = 0; k < 4; k++)
        y[r * ldy + o + (size_t)k] = gang__avx2_hsum(acc[k]) + off[k];
}

/* Rows [o0, o1) of W against rows [r0, r1) of x (r1 - r0 <= QV_MROWS), type t. */
QV_INLINE void qv_rows(gang_kernels_wtype t, size_t kdim, const gang__cpu_qx *qx,
                       const gang_kernels_weight *w, size_t o0, size_t o1, size_t r0, size_t r1,
                       float *y, size_t ldy)
{
    size_t e = 0, bb = 0, groups = kdim / 32;
    const int has_b =
        t == GANG_KW_Q4_1 || t == GANG_KW_Q5_1 || t == GANG_KW_Q4_K || t == GANG_KW_Q5_K;
    __m256i q[8], qa[8];
    float a[16], b[8];

    gang_kernels_wtype_block(t, &e, &bb);
    for (size_t o = o0; o < o1; o++) {
        const uint8_t *row = (const uint8_t *)w->data + o * (kdim / e) * bb;
        __m256 acc[QV_MROWS];
        float off[QV_MROWS];

        for (size_t r = r0; r < r1; r++) {
            acc[r - r0] = _mm256_setzero_ps();
            off[r - r0] = 0.0f;
        }
        for (size_t blk = 0; blk < kdim / e; blk++) {
            const char *pf = (const char *)row + blk * bb + QV_AHEAD;
            for (size_t c = 0; c < bb; c += 64)
                _mm_prefetch(pf + c, _MM_HINT_T0);
            qv_unpack(t, row + blk * bb, q, qa, a, b);
            for (size_t r = r0; r < r1; r++) {
                size_t g0 = r * groups + blk * e / 32;
                const int8_t *xq = qx->q + r * kdim + blk * e;
                __m256 s = acc[r - r0];
                float bo = off[r - r0];
                for (size_t g = 0; g < e / 32; g++) {
                    __m256i xv = _mm256_loadu_si256((const __m256i *)(const void *)(xq + 32 * g));
                    __m256 p = _mm256_cvtepi32_ps(qv_dot(t, q[g], qa[g], xv));
                    s = _mm256_fmadd_ps(p, qv_scale(t, a, g, qx->d[g0 + g]), s);
                    if (has_b)
                        bo += b[g] * qx->ds[g0 + g];
                }
                acc[r - r0] = s;
                off[r - r0] = bo;
            }
        }
        for (size_t r = r0; r < r1; r++)
            y[r * ldy + o] = gang__avx2_hsum(acc[r - r0]) + off[r - r0];
    }
}

/* 1 when type t's rows of kdim elements go in block pairs (qv_dec4p). */
QV_INLINE int qv_pairs(gang_kernels_wtype t, size_t kdim)
{
    size_t e = 0, bb = 0;

    gang_kernels_wtype_block(t, &e, &bb);
    return e == 32 && (kdim / 32) % 2 == 0;
}

/* The decode tiles over [o0, o1) for every row of x, type t; returns the first W row
 * they left (o1 - o0 not a multiple of 4). */
QV_INLINE size_t qv_dec_rows(gang_kernels_wtype t, size_t m, size_t kdim, const gang__cpu_qx *qx,
                             const gang_kernels_weight *w, size_t o0, size_t o1, float *y,
                             size_t ldy)
{
    size_t o = o0;
    const int pairs = qv_pairs(t, kdim);

    for (; o + 4 <= o1; o += 4)
        for (size_t r = 0; r < m; r++) {
            if (pairs)
                qv_dec4p(t, kdim, qx, w, o, r, y, ldy);
            else
                qv_dec4(t, kdim, qx, w, o, r, y, ldy);
        }
    return o;
}

void gang__cpu_qmatmul_rows_avx512(size_t m, size_t kdim, const gang__cpu_qx *qx,
                                   const gang_kernels_weight *w, size_t o0, size_t o1, float *y,
                                   size_t ldy)
{
    /* One instance per type, so that the unpack's switch folds away. The pair tiles, twice
     * as fast as the rows below even at m = 32 (the four W rows' pairs stay in L1 from one
     * row of x to the next), take every m; the others the decode sizes only. */
#define QV_CASE(T)                                                                                 \
    case T:                                                                                        \
        if (m <= QV_DEC_M || qv_pairs(T, kdim))                                                    \
            o0 = qv_dec_rows(T, m, kdim, qx, w, o0, o1, y, ldy);                                   \
        for (size_t r0 = 0; r0 < m && o0 < o1; r0 += QV_MROWS)                                     \
            qv_rows(T, kdim, qx, w, o0, o1, r0, r0 + QV_MROWS < m ? r0 + QV_MROWS : m, y, ldy);    \
        return;
    switch (w->type) {
        QV_CASE(GANG_KW_Q8_0)
        QV_CASE(GANG_KW_Q4_0)
        QV_CASE(GANG_KW_Q4_1)
        QV_CASE(GANG_KW_Q5_0)
        QV_CASE(GANG_KW_Q5_1)
        QV_CASE(GANG_KW_Q4_K)
        QV_CASE(GANG_KW_Q5_K)
        QV_CASE(GANG_KW_Q6_K)
        QV_CASE(GANG_KW_IQ4_NL)
        QV_CASE(GANG_KW_IQ4_XS)
    default:
        gang__cpu_qmatmul_rows_ref(m, kdim, qx, w, o0, o1, y, ldy);
        return;
    }
#undef QV_CASE
}

/*
 * x's int8 copy as gang__cpu_quantize_x makes it, and the half-group sums the repacked
 * kernels take (sx, two per group), one group of 32 in two 512-bit vectors. Bit for bit
 * the portable function's: max |x| is exact in any order, d and 1 / d the same f32
 * divisions, the products x / d rounded to the nearest even integer as lrintf does under
 * the default rounding mode (vcvtps2dq), then clamped to +-127. A group with a NaN or an
 * infinity goes to the portable code (its NaN ordering is the reference's).
 */
void gang__cpu_quantize_x_avx512(const float *x, size_t m, size_t kdim, const gang__cpu_qx *qx,
                                 int32_t *sx)
{
    const size_t groups = kdim / 32;
    const __m512i lo = _mm512_set1_epi32(-127), hi = _mm512_set1_epi32(127);
    const __m512 inf = _mm512_set1_ps(__builtin_inff());

    for (size_t i = 0; i < m * groups; i++) {
        const float *v = x + 32 * i;
        __m512 v0 = _mm512_loadu_ps(v), v1 = _mm512_loadu_ps(v + 16);
        __m512 a0 = _mm512_abs_ps(v0), a1 = _mm512_abs_ps(v1);
        /* ordered compares: a NaN or an infinity fails them */
        __mmask16 ok0 = _mm512_cmp_ps_mask(a0, inf, _CMP_LT_OQ);
        __mmask16 ok1 = _mm512_cmp_ps_mask(a1, inf, _CMP_LT_OQ);
        gang__cpu_qx one = {.q = qx->q + 32 * i, .d = qx->d + i, .ds = qx->ds + i};
        float amax, d, id;

        if ((ok0 & ok1) != 0xffff) {
            gang__cpu_quantize_x(v, 1, 32, &one);
            gang__cpu_qx_sums(1, 32, &one, sx + 2 * i);
            continue;
        }
        amax = _mm512_reduce_max_ps(_mm512_max_ps(a0, a1));
        d = amax / 127.0f;
        id = amax > 0.0f ? 127.0f / amax : 0.0f;
        __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, _mm512_set1_ps(id)));
        __m512i q1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, _mm512_set1_ps(id)));
        q0 = _mm512_min_epi32(_mm512_max_epi32(q0, lo), hi);
        q1 = _mm512_min_epi32(_mm512_max_epi32(q1, lo), hi);
        _mm_storeu_si128((__m128i *)(void *)one.q, _mm512_cvtepi32_epi8(q0));
        _mm_storeu_si128((__m128i *)(void *)(one.q + 16), _mm512_cvtepi32_epi8(q1));
        sx[2 * i] = _mm512_reduce_add_epi32(q0);
        sx[2 * i + 1] = _mm512_reduce_add_epi32(q1);
        qx->d[i] = d;
        qx->ds[i] = d * (float)(sx[2 * i] + sx[2 * i + 1]);
    }
}

#else /* built without the AVX-512 VNNI flags: never usable, the AVX2 kernel stands in */

int gang__cpu_avx512_usable(void)
{
    return 0;
}

void gang__cpu_qmatmul_rows_avx512(size_t m, size_t kdim, const gang__cpu_qx *qx,
                                   const gang_kernels_weight *w, size_t o0, size_t o1, float *y,
                                   size_t ldy)
{
    gang__cpu_qmatmul_rows_avx2(m, kdim, qx, w, o0, o1, y, ldy);
}

void gang__cpu_quantize_x_avx512(const float *x, size_t m, size_t kdim, const gang__cpu_qx *qx,
                                 int32_t *sx)
{
    gang__cpu_quantize_x(x, m, kdim, qx);
    gang__cpu_qx_sums(m, kdim, qx, sx);
}

#endif
