/*
 * CPU backend: the AVX2 + FMA + F16C kernels of the typed-weight matmul (cpu-matmul.c).
 * CMake compiles this one file with -mavx2 -mfma -mf16c on x86-64; the rest of the
 * binary stays baseline x86-64, and cpu-matmul.c calls in here only when
 * gang__cpu_avx2_usable() says the CPU has the three extensions. Built for another
 * architecture (or without the flags) the file defines the same symbols as stubs that
 * report "not usable".
 *
 * Algorithm. Within a chunk of W rows, W is walked in blocks of GANG__AVX_WBLOCK rows
 * (a few KiB: they stay in L1 while every block of x rows passes over them); for each
 * block of MR = 4 x rows the kernel computes 4 x 2 outputs at a time with eight 8-lane
 * f32 accumulators: per 8 elements of k it converts two W vectors (bf16: a 16-bit
 * shift; f16: vcvtph2ps; int8: sign extension and vcvtdq2ps) and issues eight FMAs, so
 * the loads never outnumber the FMAs. Leftover x rows (m % 4, and the m = 1 of a decode
 * step) use a 1 x 4 tile: four W rows stream together against one x row held in L1. A k
 * that is not a multiple of 8 ends with a scalar tail; the eight lanes are summed at
 * the end and an int8 row's scale multiplies the finished sum.
 */
#include "cpu.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>

#define GANG__AVX_WBLOCK 8
#define AVX_INLINE static inline __attribute__((always_inline))

int gang__cpu_avx2_usable(void)
{
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
           __builtin_cpu_supports("f16c");
}

/* Eight elements of a W row from element i, as f32. */
AVX_INLINE __m256 ld8(gang_kernels_wtype t, const void *row, size_t i)
{
    switch (t) {
    case GANG_KW_BF16: {
        __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)row + i));
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
    case GANG_KW_F16:
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)row + i)));
    case GANG_KW_I8:
        return _mm256_cvtepi32_ps(
            _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)((const int8_t *)row + i))));
    case GANG_KW_F32:
        break;
    }
    return _mm256_loadu_ps((const float *)row + i);
}

AVX_INLINE float ld1(gang_kernels_wtype t, const void *row, size_t i)
{
    switch (t) {
    case GANG_KW_BF16:
        return gang_bf16_to_f32(((const uint16_t *)row)[i]);
    case GANG_KW_F16:
        return gang_f16_to_f32(((const uint16_t *)row)[i]);
    case GANG_KW_I8:
        return (float)((const int8_t *)row)[i];
    case GANG_KW_F32:
        break;
    }
    return ((const float *)row)[i];
}

AVX_INLINE float hsum(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));

    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/*
 * One MR x NR tile: y[a, b] = sum_i x[a, i] W[b, i] (times scales[b] for int8) for a < MR
 * rows of x (stride kdim) and b < NR rows of W starting at w0 (stride wstride bytes).
 * MR and NR are constants at every call, so the accumulators live in registers.
 */
AVX_INLINE void tile(gang_kernels_wtype t, const int MR, const int NR, size_t kdim, const float *x,
                     const char *w0, size_t wstride, const float *scales, float *y, size_t ldy)
{
    __m256 acc[4][4];
    size_t i = 0;

    for (int a = 0; a < MR; a++)
        for (int b = 0; b < NR; b++)
            acc[a][b] = _mm256_setzero_ps();
    for (; i + 8 <= kdim; i += 8) {
        __m256 wv[4];

        for (int b = 0; b < NR; b++)
            wv[b] = ld8(t, w0 + (size_t)b * wstride, i);
        for (int a = 0; a < MR; a++) {
            __m256 xv = _mm256_loadu_ps(x + (size_t)a * kdim + i);

            for (int b = 0; b < NR; b++)
                acc[a][b] = _mm256_fmadd_ps(xv, wv[b], acc[a][b]);
        }
    }
    for (int a = 0; a < MR; a++) {
        for (int b = 0; b < NR; b++) {
            float s = hsum(acc[a][b]);

            for (size_t j = i; j < kdim; j++)
                s += x[(size_t)a * kdim + j] * ld1(t, w0 + (size_t)b * wstride, j);
            y[(size_t)a * ldy + (size_t)b] = scales != NULL ? s * scales[b] : s;
        }
    }
}

/* Rows [o0, o1) of W (at most GANG__AVX_WBLOCK) against every row of x. */
AVX_INLINE void wblock(gang_kernels_wtype t, size_t m, size_t kdim, const float *x,
                       const gang_kernels_weight *w, size_t o0, size_t o1, float *y, size_t ldy)
{
    size_t es = t == GANG_KW_I8 ? 1 : t == GANG_KW_F32 ? 4 : 2, ws = kdim * es;
    const char *base = w->data;
    size_t r = 0, o;

#define AVX_SC(o) (w->scales != NULL ? w->scales + (o) : NULL)
    for (; r + 4 <= m; r += 4) {
        const float *xr = x + r * kdim;

        for (o = o0; o + 2 <= o1; o += 2)
            tile(t, 4, 2, kdim, xr, base + o * ws, ws, AVX_SC(o), y + r * ldy + o, ldy);
        if (o < o1)
            tile(t, 4, 1, kdim, xr, base + o * ws, ws, AVX_SC(o), y + r * ldy + o, ldy);
    }
    for (; r < m; r++) {
        const float *xr = x + r * kdim;

        for (o = o0; o + 4 <= o1; o += 4)
            tile(t, 1, 4, kdim, xr, base + o * ws, ws, AVX_SC(o), y + r * ldy + o, ldy);
        for (; o < o1; o++)
            tile(t, 1, 1, kdim, xr, base + o * ws, ws, AVX_SC(o), y + r * ldy + o, ldy);
    }
#undef AVX_SC
}

/* One instance per storage type, so that the element loads are resolved at compile time. */
#define AVX_ROWS(T, NAME)                                                                          \
    static void NAME(size_t m, size_t kdim, const float *x, const gang_kernels_weight *w,          \
                     size_t o0, size_t o1, float *y, size_t ldy)                                   \
    {                                                                                              \
        for (size_t o = o0; o < o1; o += GANG__AVX_WBLOCK)                                         \
            wblock(T, m, kdim, x, w, o, o + GANG__AVX_WBLOCK < o1 ? o + GANG__AVX_WBLOCK : o1, y,  \
                   ldy);                                                                           \
    }
AVX_ROWS(GANG_KW_BF16, rows_bf16)
AVX_ROWS(GANG_KW_F16, rows_f16)
AVX_ROWS(GANG_KW_I8, rows_i8)
AVX_ROWS(GANG_KW_F32, rows_f32)
#undef AVX_ROWS

void gang__cpu_matmul_rows_avx2(size_t m, size_t kdim, const float *x, const gang_kernels_weight *w,
                                size_t o0, size_t o1, float *y, size_t ldy)
{
    switch (w->type) {
    case GANG_KW_BF16:
        rows_bf16(m, kdim, x, w, o0, o1, y, ldy);
        return;
    case GANG_KW_F16:
        rows_f16(m, kdim, x, w, o0, o1, y, ldy);
        return;
    case GANG_KW_I8:
        rows_i8(m, kdim, x, w, o0, o1, y, ldy);
        return;
    case GANG_KW_F32:
        rows_f32(m, kdim, x, w, o0, o1, y, ldy);
        return;
    }
}

#else /* no AVX2 build: the portable kernel does everything */

int gang__cpu_avx2_usable(void)
{
    return 0;
}

void gang__cpu_matmul_rows_avx2(size_t m, size_t kdim, const float *x, const gang_kernels_weight *w,
                                size_t o0, size_t o1, float *y, size_t ldy)
{
    gang__cpu_matmul_rows_ref(m, kdim, x, w, o0, o1, y, ldy);
}

#endif
