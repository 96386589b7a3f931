/*
 * CPU backend: the attention work item (cpu-attention-item.h) with AVX2 + FMA + F16C
 * primitives. CMake compiles this file with -mavx2 -mfma -mf16c on x86-64, like
 * cpu-matmul-avx2.c, and cpu-attention.c calls it only when gang__cpu_avx2_usable() says
 * the CPU has them; built without the flags it defines a stub that is never called.
 *
 * The primitives work on 8 lanes with a scalar tail or on a padded copy of the tail (exp,
 * so that every score goes through the same exp, cpu-avx2.h's): scores four keys at a time
 * (four accumulators summed across lanes by two hadd steps), the weighted sum of the value
 * rows 32 columns at a time held in registers over the whole tile.
 */
#include "cpu.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "cpu-avx2.h"

#define attn_hsum gang__avx2_hsum

/* The dot product of q and one key row (8 lanes, two accumulators, a scalar tail). */
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

/* Four keys at a time: four accumulators, summed across lanes together by two hadd steps. */
static inline void attn_scores(const float *q, const float *const *kr, size_t nt, size_t hd,
                               float scale, float *s)
{
    size_t t = 0;

    for (; t + 4 <= nt; t += 4) {
        const float *k0 = kr[t], *k1 = kr[t + 1], *k2 = kr[t + 2], *k3 = kr[t + 3];
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, h;
        __m128 r;
        size_t d = 0;

        for (; d + 8 <= hd; d += 8) {
            __m256 qv = _mm256_loadu_ps(q + d);

            a0 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + d), a0);
            a1 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k1 + d), a1);
            a2 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k2 + d), a2);
            a3 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k3 + d), a3);
        }
        h = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
        r = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
        for (; d < hd; d++)
            r = _mm_add_ps(r,
                           _mm_mul_ps(_mm_set1_ps(q[d]), _mm_setr_ps(k0[d], k1[d], k2[d], k3[d])));
        _mm_storeu_ps(s + t, _mm_mul_ps(r, _mm_set1_ps(scale)));
    }
    for (; t < nt; t++)
        s[t] = attn_dot(q, kr[t], hd) * scale;
}

/* 32 columns at a time held in registers over the whole tile, then 8, then a scalar tail. */
static inline void attn_pv(float *acc, const float *p, const float *const *vr, size_t nt, size_t hd)
{
    size_t d = 0;

    for (; d + 32 <= hd; d += 32) {
        __m256 c0 = _mm256_loadu_ps(acc + d), c1 = _mm256_loadu_ps(acc + d + 8);
        __m256 c2 = _mm256_loadu_ps(acc + d + 16), c3 = _mm256_loadu_ps(acc + d + 24);

        for (size_t t = 0; t < nt; t++) {
            const float *v = vr[t] + d;
            __m256 pv = _mm256_broadcast_ss(p + t);

            c0 = _mm256_fmadd_ps(pv, _mm256_loadu_ps(v), c0);
            c1 = _mm256_fmadd_ps(pv, _mm256_loadu_ps(v + 8), c1);
            c2 = _mm256_fmadd_ps(pv, _mm256_loadu_ps(v + 16), c2);
            c3 = _mm256_fmadd_ps(pv, _mm256_loadu_ps(v + 24), c3);
        }
        _mm256_storeu_ps(acc + d, c0);
        _mm256_storeu_ps(acc + d + 8, c1);
        _mm256_storeu_ps(acc + d + 16, c2);
        _mm256_storeu_ps(acc + d + 24, c3);
    }
    for (; d + 8 <= hd; d += 8) {
        __m256 c = _mm256_loadu_ps(acc + d);

        for (size_t t = 0; t < nt; t++)
            c = _mm256_fmadd_ps(_mm256_broadcast_ss(p + t), _mm256_loadu_ps(vr[t] + d), c);
        _mm256_storeu_ps(acc + d, c);
    }
    for (; d < hd; d++)
        for (size_t t = 0; t < nt; t++)
            acc[d] += p[t] * vr[t][d];
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

static inline float attn_exp_sum(float *s, size_t n, float m)
{
    __m256 mv = _mm256_set1_ps(m), sum = _mm256_setzero_ps();
    float tail[8] = {0}, acc;
    size_t i = 0;

    for (; i + 8 <= n; i += 8) {
        __m256 v = gang__avx2_exp(_mm256_sub_ps(_mm256_loadu_ps(s + i), mv));

        _mm256_storeu_ps(s + i, v);
        sum = _mm256_add_ps(sum, v);
    }
    acc = attn_hsum(sum);
    if (i < n) {
        for (size_t t = 0; t < n - i; t++)
            tail[t] = s[i + t];
        _mm256_storeu_ps(tail, gang__avx2_exp(_mm256_sub_ps(_mm256_loadu_ps(tail), mv)));
        for (size_t t = 0; t < n - i; t++) {
            s[i + t] = tail[t];
            acc += tail[t];
        }
    }
    return acc;
}

static inline void attn_widen_into(const void *src, gang_dtype dt, size_t n, float *dst)
{
    const uint16_t *h = src;
    size_t i = 0;

    if (dt == GANG_DTYPE_F32) {
        memcpy(dst, src, n * sizeof(float));
        return;
    }
    if (dt == GANG_DTYPE_BF16) {
        for (; i + 8 <= n; i += 8) {
            __m128i v = _mm_loadu_si128((const __m128i *)(h + i));

            _mm256_storeu_ps(dst + i,
                             _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(v), 16)));
        }
    } else {
        for (; i + 8 <= n; i += 8)
            _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + i))));
    }
    for (; i < n; i++)
        dst[i] = dt == GANG_DTYPE_BF16 ? gang_bf16_to_f32(h[i]) : gang_f16_to_f32(h[i]);
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
