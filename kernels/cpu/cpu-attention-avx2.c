/*
 * CPU backend: the attention work item (cpu-attention-item.h) with AVX2 + FMA + F16C
 * primitives. CMake compiles this file with -mavx2 -mfma -mf16c on x86-64, like
 * cpu-matmul-avx2.c, and cpu-attention.c calls it only when gang__cpu_avx2_usable() says
 * the CPU has them; built without the flags it defines a stub that is never called.
 *
 * The primitives work on 8 lanes with a scalar tail (dot products, axpy, widening) or on
 * a padded copy of the tail (exp, so that every score goes through the same exp). The
 * exp is a vector one: x = n ln2 + r with n = round(x / ln2) and |r| <= ln2 / 2 (ln2 split
 * in two parts so that n ln2 is exact enough), e^r by its Taylor series to r^7 (truncation
 * below 6e-9 relative on that interval), times 2^n built in the exponent field. Inputs are
 * clamped to [-87, 88], where 2^n stays a normal float; a NaN passes through.
 */
#include "cpu.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#include <math.h>

static inline float attn_hsum(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));

    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline float attn_dot(const float *a, const float *b, size_t n)
{
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    size_t i = 0;
    float acc;

    for (; i + 16 <= n; i += 16) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
    }
    if (i + 8 <= n) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
        i += 8;
    }
    acc = attn_hsum(_mm256_add_ps(s0, s1));
    for (; i < n; i++)
        acc += a[i] * b[i];
    return acc;
}

static inline void attn_axpy(float *y, float a, const float *x, size_t n)
{
    __m256 av = _mm256_set1_ps(a);
    size_t i = 0;

    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i,
                         _mm256_fmadd_ps(av, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++)
        y[i] += a * x[i];
}

static inline void attn_scal(float *y, float a, size_t n)
{
    __m256 av = _mm256_set1_ps(a);
    size_t i = 0;

    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_mul_ps(av, _mm256_loadu_ps(y + i)));
    for (; i < n; i++)
        y[i] *= a;
}

/* e^x for 8 lanes (see the file comment). */
static inline __m256 attn_vexp(__m256 x)
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

static inline float attn_exp_sum(float *s, size_t n, float m)
{
    __m256 mv = _mm256_set1_ps(m), sum = _mm256_setzero_ps();
    float tail[8] = {0}, acc;
    size_t i = 0;

    for (; i + 8 <= n; i += 8) {
        __m256 v = attn_vexp(_mm256_sub_ps(_mm256_loadu_ps(s + i), mv));

        _mm256_storeu_ps(s + i, v);
        sum = _mm256_add_ps(sum, v);
    }
    acc = attn_hsum(sum);
    if (i < n) {
        for (size_t t = 0; t < n - i; t++)
            tail[t] = s[i + t];
        _mm256_storeu_ps(tail, attn_vexp(_mm256_sub_ps(_mm256_loadu_ps(tail), mv)));
        for (size_t t = 0; t < n - i; t++) {
            s[i + t] = tail[t];
            acc += tail[t];
        }
    }
    return acc;
}

static inline const float *attn_widen(const void *src, gang_dtype dt, size_t n, float *tmp)
{
    const uint16_t *h = src;
    size_t i = 0;

    if (dt == GANG_DTYPE_F32)
        return src;
    for (; i + 8 <= n; i += 8) {
        __m128i v = _mm_loadu_si128((const __m128i *)(h + i));

        _mm256_storeu_ps(tmp + i,
                         dt == GANG_DTYPE_BF16
                             ? _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(v), 16))
                             : _mm256_cvtph_ps(v));
    }
    for (; i < n; i++)
        tmp[i] = dt == GANG_DTYPE_BF16 ? gang_bf16_to_f32(h[i]) : gang_f16_to_f32(h[i]);
    return tmp;
}

#define ATTN_ITEM_FN gang__cpu_attn_item_avx2
#include "cpu-attention-item.h"
#undef ATTN_ITEM_FN

#else /* built without AVX2: gang__cpu_avx2_usable() is 0, so this is never called */

void gang__cpu_attn_item_avx2(const gang__cpu_attn_item *it)
{
    gang__cpu_attn_item_ref(it);
}

#endif
