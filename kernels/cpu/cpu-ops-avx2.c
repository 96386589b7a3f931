/*
 * CPU backend: element-wise operations with AVX2 + FMA (cpu-ops.c calls these when
 * gang__cpu_avx2_usable() says so). CMake compiles this file with -mavx2 -mfma -mf16c on
 * x86-64; built without them it defines the portable loops under the same names, never
 * called.
 *
 * SiLU: out = g / (1 + e^-g) x up, every element through the same vector code (a tail
 * shorter than 8 on a padded copy), so an element's value does not depend on where it
 * sits in the array; with cpu-avx2.h's vector exp (a clamped argument:
 * for g below -88, e^-g is about 1.6e38 instead of inf, so the result is a tiny multiple
 * of g instead of -0; both are 0 to f32 printing, and the ratio of consecutive layers'
 * activations is what the model sees).
 */
#include "cpu.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#include <math.h>

#include "cpu-avx2.h"

void gang__cpu_silu_mul_avx2(const float *gate, const float *up, size_t n, float *out)
{
    const __m256 one = _mm256_set1_ps(1.0f), zero = _mm256_setzero_ps();
    size_t i = 0;

    for (; i + 8 <= n; i += 8) {
        __m256 g = _mm256_loadu_ps(gate + i);
        __m256 e = gang__avx2_exp(_mm256_sub_ps(zero, g));

        _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(one, e)),
                                                _mm256_loadu_ps(up + i)));
    }
    if (i < n) { /* the tail through the same vector code, on a padded copy */
        float g[8] = {0}, u[8] = {0}, o[8];

        for (size_t t = 0; t < n - i; t++)
            g[t] = gate[i + t], u[t] = up[i + t];
        gang__cpu_silu_mul_avx2(g, u, 8, o);
        for (size_t t = 0; t < n - i; t++)
            out[i + t] = o[t];
    }
}

#else

void gang__cpu_silu_mul_avx2(const float *gate, const float *up, size_t n, float *out)
{
    for (size_t i = 0; i < n; i++)
        out[i] = gate[i] / (1.0f + expf(-gate[i])) * up[i];
}

#endif
