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
 *
 * GELU (tanh form): 0.5 g (1 + tanh z) is g / (1 + e^(-2z)), z = sqrt(2/pi) (g + 0.044715 g^3):
 * the same vector code as SiLU with 2z in place of g. The sigmoid form also avoids the
 * cancellation of 1 + tanh z for negative z that the tanh form has in f32.
 */
#include "cpu.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#include <math.h>

#include "cpu-avx2.h"

/* g / (1 + e^-t) x up on 8 lanes: SiLU with t = g, GELU (tanh) with t = 2z. */
static inline __m256 ops_sig_mul(__m256 g, __m256 t, __m256 up)
{
    __m256 e = gang__avx2_exp(_mm256_sub_ps(_mm256_setzero_ps(), t));

    return _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0f), e)), up);
}

/* The argument t of ops_sig_mul for gate g: g (SiLU) or 2 sqrt(2/pi) (g + 0.044715 g^3). */
static inline __m256 ops_gate_t(int gelu, __m256 g)
{
    if (!gelu)
        return g;
    const __m256 a = _mm256_set1_ps(2.0f * 0.7978845608028654f),
                 b = _mm256_set1_ps(2.0f * 0.7978845608028654f * 0.044715f);
    return _mm256_mul_ps(g, _mm256_fmadd_ps(b, _mm256_mul_ps(g, g), a));
}

/* Either gate over n elements, every element through the same vector code (a tail shorter
 * than 8 on a padded copy). out may be up. */
static void ops_gate_mul(int gelu, const float *gate, const float *up, size_t n, float *out)
{
    size_t i = 0;

    for (; i + 8 <= n; i += 8) {
        __m256 g = _mm256_loadu_ps(gate + i);
        _mm256_storeu_ps(out + i, ops_sig_mul(g, ops_gate_t(gelu, g), _mm256_loadu_ps(up + i)));
    }
    if (i < n) {
        float g[8] = {0}, u[8] = {0}, o[8];

        for (size_t t = 0; t < n - i; t++)
            g[t] = gate[i + t], u[t] = up[i + t];
        ops_gate_mul(gelu, g, u, 8, o);
        for (size_t t = 0; t < n - i; t++)
            out[i + t] = o[t];
    }
}

void gang__cpu_silu_mul_avx2(const float *gate, const float *up, size_t n, float *out)
{
    ops_gate_mul(0, gate, up, n, out);
}

void gang__cpu_gelu_mul_avx2(const float *gate, const float *up, size_t n, float *out)
{
    ops_gate_mul(1, gate, up, n, out);
}

#else

void gang__cpu_silu_mul_avx2(const float *gate, const float *up, size_t n, float *out)
{
    for (size_t i = 0; i < n; i++)
        out[i] = gate[i] / (1.0f + expf(-gate[i])) * up[i];
}

void gang__cpu_gelu_mul_avx2(const float *gate, const float *up, size_t n, float *out)
{
    (void)gang__cpu_gelu_mul_ref(gate, up, n, out);
}

#endif
