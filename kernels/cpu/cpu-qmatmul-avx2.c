/*
 * CPU backend: the AVX2 kernel of the block-weight product (cpu-qmatmul.c has the
 * algorithm and the portable reference). Compiled with -mavx2 -mfma -mf16c like the
 * other *-avx2.c files and called only when gang__cpu_simd() says the CPU runs them.
 *
 * A block is unpacked with vector operations into one 32-byte vector of signed q per
 * group of 32 (nibbles by mask and shift, the fifth / top bits by a byte-wise compare
 * or shift), then each row of x meets each group in one integer product: maddubs
 * multiplies |q| (unsigned) by x's int8 with q's sign moved onto it (|q| <= 128 and
 * |x| <= 127: a pair's sum stays inside int16) and madd sums pairs to 8 int32 lanes,
 * lanes 0-3 the group's first 16 elements and 4-7 its last 16, which meet their two
 * scales (Q6_K's per-16 scales) in one FMA.
 */
#include "cpu.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#include <string.h>

#include "cpu-avx2.h"
#include "cpu-qunpack-avx2.h"
#include "kernels-blocks.h"

#define QAVX_INLINE static inline __attribute__((always_inline))
#define QAVX_MROWS 16   /* rows of x per pass over a block: their accumulators stay in L1 */
#define QAVX_AHEAD 1024 /* bytes of W asked for ahead of the block being read */
#define QAVX_DEC_M 2    /* up to this many rows of x: the decode tiles (qavx_dec4) */

/* The int32 products of a group's two halves in lanes 0-3 and 4-7: q . xq. */
QAVX_INLINE __m256 qavx_dot(__m256i q, __m256i xq)
{
    __m256i p16 = _mm256_maddubs_epi16(_mm256_sign_epi8(q, q), _mm256_sign_epi8(xq, q));
    return _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, _mm256_set1_epi16(1)));
}

/*
 * Decode (few rows of x): W rows o .. o + 3 against x row r, the four accumulators in
 * registers. One accumulator per row chained an FMA's latency per group (a row of
 * SmolLM2's k = 576 is 18 groups); four independent chains keep the FMA units busy and
 * share x's loads and scales.
 */
QAVX_INLINE void qavx_dec4(gang_kernels_wtype t, size_t kdim, const gang__cpu_qx *qx,
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
            const char *pf = (const char *)row0 + k * rowb + blk * bb + QAVX_AHEAD;
            for (size_t c = 0; c < bb; c += 64)
                _mm_prefetch(pf + c, _MM_HINT_T0);
            qavx_unpack(t, row0 + k * rowb + blk * bb, q[k], a[k], b[k], 0);
        }
        for (size_t g = 0; g < e / 32; g++) {
            __m256i xv = _mm256_loadu_si256((const __m256i *)(const void *)(xq + blk * e + 32 * g));
            float dx = xd[blk * e / 32 + g];
            for (int k = 0; k < 4; k++) {
                __m256 sc = t == GANG_KW_Q6_K ? _mm256_set_m128(_mm_set1_ps(dx * a[k][2 * g + 1]),
                                                                _mm_set1_ps(dx * a[k][2 * g]))
                                              : _mm256_set1_ps(dx * a[k][2 * g]);
                acc[k] = _mm256_fmadd_ps(qavx_dot(q[k][g], xv), sc, acc[k]);
                if (has_b)
                    off[k] += b[k][g] * xs[blk * e / 32 + g];
            }
        }
    }
    for (int k = 0; k < 4; k++)
        y[r * ldy + o + (size_t)k] = gang__avx2_hsum(acc[k]) + off[k];
}

/* Rows [o0, o1) of W against rows [r0, r1) of x (r1 - r0 <= QAVX_MROWS), type t. */
QAVX_INLINE void qavx_rows(gang_kernels_wtype t, size_t kdim, const gang__cpu_qx *qx,
                           const gang_kernels_weight *w, size_t o0, size_t o1, size_t r0, size_t r1,
                           float *y, size_t ldy)
{
    size_t e = 0, bb = 0, groups = kdim / 32;
    __m256i q[8];
    float a[16], b[8];

    gang_kernels_wtype_block(t, &e, &bb);
    for (size_t o = o0; o < o1; o++) {
        const uint8_t *row = (const uint8_t *)w->data + o * (kdim / e) * bb;
        __m256 acc[QAVX_MROWS];
        float off[QAVX_MROWS];

        for (size_t r = r0; r < r1; r++) {
            acc[r - r0] = _mm256_setzero_ps();
            off[r - r0] = 0.0f;
        }
        for (size_t blk = 0; blk < kdim / e; blk++) {
            /* The chunk's rows are one run of bytes: ask for it QAVX_AHEAD bytes ahead
             * (a block or two ahead left the loads waiting on memory: perf annotate put
             * 30% of the kernel on the first load of a block; decode ran at a third of
             * bf16's bytes per second). */
            const char *pf = (const char *)row + blk * bb + QAVX_AHEAD;
            for (size_t c = 0; c < bb; c += 64)
                _mm_prefetch(pf + c, _MM_HINT_T0);
            qavx_unpack(t, row + blk * bb, q, a, b, 0);
            for (size_t r = r0; r < r1; r++) {
                size_t g0 = r * groups + blk * e / 32;
                const int8_t *xq = qx->q + r * kdim + blk * e;
                __m256 s = acc[r - r0];
                float bo = off[r - r0];
                for (size_t g = 0; g < e / 32; g++) {
                    __m256i xv = _mm256_loadu_si256((const __m256i *)(const void *)(xq + 32 * g));
                    float dx = qx->d[g0 + g];
                    __m256 sc =
                        _mm256_set_m128(_mm_set1_ps(dx * a[2 * g + 1]), _mm_set1_ps(dx * a[2 * g]));
                    s = _mm256_fmadd_ps(qavx_dot(q[g], xv), sc, s);
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

void gang__cpu_qmatmul_rows_avx2(size_t m, size_t kdim, const gang__cpu_qx *qx,
                                 const gang_kernels_weight *w, size_t o0, size_t o1, float *y,
                                 size_t ldy)
{
    /* Decode (m <= QAVX_DEC_M): tiles of 4 W rows per x row, each block unpacked per x row;
     * the rows left over (o1 - o0 not a multiple of 4) and larger m: the block unpacked
     * once for up to QAVX_MROWS rows of x. */
    if (m <= QAVX_DEC_M) {
        size_t o = o0;
        for (; o + 4 <= o1; o += 4) {
            for (size_t r = 0; r < m; r++) {
                switch (w->type) {
#define QAVX_DEC(T)                                                                                \
    case T:                                                                                        \
        qavx_dec4(T, kdim, qx, w, o, r, y, ldy);                                                   \
        break;
                    QAVX_DEC(GANG_KW_Q8_0)
                    QAVX_DEC(GANG_KW_Q4_0)
                    QAVX_DEC(GANG_KW_Q4_1)
                    QAVX_DEC(GANG_KW_Q5_0)
                    QAVX_DEC(GANG_KW_Q5_1)
                    QAVX_DEC(GANG_KW_Q4_K)
                    QAVX_DEC(GANG_KW_Q5_K)
                    QAVX_DEC(GANG_KW_Q6_K)
                    QAVX_DEC(GANG_KW_IQ4_NL)
                    QAVX_DEC(GANG_KW_IQ4_XS)
#undef QAVX_DEC
                default:
                    break;
                }
            }
        }
        o0 = o;
        if (o0 == o1)
            return;
    }
    for (size_t r0 = 0; r0 < m; r0 += QAVX_MROWS) {
        size_t r1 = r0 + QAVX_MROWS < m ? r0 + QAVX_MROWS : m;
        /* One instance per type, so that the unpack's switch folds away. */
        switch (w->type) {
        case GANG_KW_Q8_0:
            qavx_rows(GANG_KW_Q8_0, kdim, qx, w, o0, o1, r0, r1, y, ldy);
            break;
        case GANG_KW_Q4_0:
            qavx_rows(GANG_KW_Q4_0, kdim, qx, w, o0, o1, r0, r1, y, ldy);
            break;
        case GANG_KW_Q4_1:
            qavx_rows(GANG_KW_Q4_1, kdim, qx, w, o0, o1, r0, r1, y, ldy);
            break;
        case GANG_KW_Q5_0:
            qavx_rows(GANG_KW_Q5_0, kdim, qx, w, o0, o1, r0, r1, y, ldy);
            break;
        case GANG_KW_Q5_1:
            qavx_rows(GANG_KW_Q5_1, kdim, qx, w, o0, o1, r0, r1, y, ldy);
            break;
        case GANG_KW_Q4_K:
            qavx_rows(GANG_KW_Q4_K, kdim, qx, w, o0, o1, r0, r1, y, ldy);
            break;
        case GANG_KW_Q5_K:
            qavx_rows(GANG_KW_Q5_K, kdim, qx, w, o0, o1, r0, r1, y, ldy);
            break;
        case GANG_KW_Q6_K:
            qavx_rows(GANG_KW_Q6_K, kdim, qx, w, o0, o1, r0, r1, y, ldy);
            break;
        case GANG_KW_IQ4_NL:
            qavx_rows(GANG_KW_IQ4_NL, kdim, qx, w, o0, o1, r0, r1, y, ldy);
            break;
        case GANG_KW_IQ4_XS:
            qavx_rows(GANG_KW_IQ4_XS, kdim, qx, w, o0, o1, r0, r1, y, ldy);
            break;
        default:
            gang__cpu_qmatmul_rows_ref(m, kdim, qx, w, o0, o1, y, ldy);
            return;
        }
    }
}

#else /* no AVX2 build: the portable kernel does everything */

void gang__cpu_qmatmul_rows_avx2(size_t m, size_t kdim, const gang__cpu_qx *qx,
                                 const gang_kernels_weight *w, size_t o0, size_t o1, float *y,
                                 size_t ldy)
{
    gang__cpu_qmatmul_rows_ref(m, kdim, qx, w, o0, o1, y, ldy);
}

#endif
