/*
 * Inline AVX2 + FMA helpers shared by the CPU backend's AVX2 files (cpu-matmul-avx2.c,
 * cpu-attention-avx2.c, cpu-ops-avx2.c), which CMake compiles with -mavx2 -mfma -mf16c; only they
 * include this file, and only when those flags are on (the #if below).
 *
 * gang__avx2_exp is e^x on 8 lanes: x = n ln2 + r with n = round(x / ln2) and |r| <= ln2 / 2
 * (ln2 split in two parts so that n ln2 is exact enough), e^r by its Taylor series to r^7
 * (truncation below 6e-9 relative on that interval), times 2^n built in the exponent
 * field. Inputs are clamped to [-87, 88], where 2^n stays a normal float (so e^x of a very
 * negative x is about 1.6e-38 rather than 0); a NaN passes through.
 */
#ifndef GANGLION_KERNELS_CPU_AVX2_H
#define GANGLION_KERNELS_CPU_AVX2_H

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

/* The sum of the 8 lanes of v. */
static inline float gang__avx2_hsum(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));

    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* e^x for 8 lanes (see the file comment). */
static inline __m256 gang__avx2_exp(__m256 x)
{
    const __m256 ln2_hi = _mm256_set1_ps(0.693359375f), ln2_lo = _mm256_set1_ps(-2.12194440e-4f);
    __m256 n, r, p;
    __m256i e;

    /* min / max return their second operand when one is NaN: x stays NaN. */
    x = _mm256_max_ps(_mm256_set1_ps(-87.0f), _mm256_min_ps(_mm256_set1_ps(88.0f), x));
    n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504f)),
                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    r = _mm256_fnmadd_ps(n, ln2_hi, x);
    r = _mm256_fnmadd_ps(n, ln2_lo, r);
    p = _mm256_set1_ps(1.0f / 5040.0f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 720.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

#endif /* __AVX2__ && __FMA__ */
#endif /* GANGLION_KERNELS_CPU_AVX2_H */
