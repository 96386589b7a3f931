/*
 * CPU backend: element-wise and row-wise operations (RMSNorm, RoPE, softmax, SiLU.mul,
 * embedding lookup, residual add, argmax) and the host dtype conversions.
 *
 * These are memory-bound loops; they favour clarity and accuracy (double accumulators
 * where a sum runs over a whole row) over vectorisation tricks, except the gates (SiLU,
 * GELU-tanh), whose exp per element is a step's largest element-wise cost at batch 32:
 * AVX2 (cpu-ops-avx2.c) and the pool.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu.h"

int gang__cpu_rmsnorm(const float *x, const float *w, float eps, size_t rows, size_t dim,
                      float *out)
{
    for (size_t r = 0; r < rows; r++) {
        const float *xr = x + r * dim;
        float *orow = out + r * dim;
        double ss = 0.0;

        /* Summing squares in float loses about log2(dim) bits on wide rows; double keeps
         * the scale exact to f32 precision for any realistic hidden size. */
        for (size_t i = 0; i < dim; i++)
            ss += (double)xr[i] * (double)xr[i];
        double scale = 1.0 / sqrt(ss / (double)dim + (double)eps);
        /* Reading xr[i] and writing orow[i] in the same iteration keeps out == x safe. */
        for (size_t i = 0; i < dim; i++)
            orow[i] = (float)((double)xr[i] * scale) * w[i];
    }
    return 0;
}

#define CPU_ROPE_STACK_HALF 256

/*
 * RoPE, rotate_half convention, with the model's inverse frequencies inv_freq[head_dim/2]
 * and the attention factor scale (cos and sin both multiplied by it). The angle for pair
 * i of a token depends only on its position, so the cos/sin table of one token is
 * computed once (in double) and applied to every head.
 */
int gang__cpu_rope(float *x, const int32_t *positions, size_t tokens, size_t heads, size_t head_dim,
                   const float *inv_freq, float scale)
{
    size_t half = head_dim / 2;
    /* Stack scratch for every real head size (no allocation per token while serving). */
    double cs_stack[2 * CPU_ROPE_STACK_HALF];
    int on_stack = half <= CPU_ROPE_STACK_HALF;
    double *cs = on_stack ? cs_stack : malloc(2 * half * sizeof(*cs));

    if (cs == NULL)
        return GANG_ENOMEM;
    for (size_t t = 0; t < tokens; t++) {
        double pos = (double)positions[t];

        for (size_t i = 0; i < half; i++) {
            double angle = pos * (double)inv_freq[i];
            cs[2 * i] = cos(angle) * (double)scale;
            cs[2 * i + 1] = sin(angle) * (double)scale;
        }
        for (size_t h = 0; h < heads; h++) {
            float *v = x + (t * heads + h) * head_dim;

            for (size_t i = 0; i < half; i++) {
                double x0 = v[i], x1 = v[i + half];
                double c = cs[2 * i], s = cs[2 * i + 1];
                v[i] = (float)(x0 * c - x1 * s);
                v[i + half] = (float)(x1 * c + x0 * s);
            }
        }
    }
    if (!on_stack)
        free(cs);
    return 0;
}

int gang__cpu_softmax(float *x, size_t rows, size_t cols)
{
    for (size_t r = 0; r < rows; r++) {
        float *row = x + r * cols;
        float max = -INFINITY;
        double sum = 0.0;

        for (size_t i = 0; i < cols; i++)
            if (row[i] > max)
                max = row[i];
        /* A fully masked row has no meaningful distribution; zeros keep NaN from
         * spreading into whatever consumes it. */
        if (max == -INFINITY) {
            memset(row, 0, cols * sizeof(*row));
            continue;
        }
        /* Subtracting the maximum keeps every exponent <= 0, so nothing overflows. */
        for (size_t i = 0; i < cols; i++) {
            float e = expf(row[i] - max);
            row[i] = e;
            sum += e;
        }
        float inv = (float)(1.0 / sum);
        for (size_t i = 0; i < cols; i++)
            row[i] *= inv;
    }
    return 0;
}

/* Elements of one gate chunk (a multiple of 8, so chunks start on vector boundaries), and
 * the fewest elements worth sharing with the pool (a wake-up costs a few microseconds). */
#define OPS_GATE_CHUNK 8192
#define OPS_GATE_MIN_PARALLEL 32768

typedef struct gate_job {
    const float *gate, *up;
    float *out;
    size_t n;
    int simd, gelu;
} gate_job;

static void gate_chunk(void *arg, size_t c)
{
    const gate_job *j = arg;
    size_t i0 = c * OPS_GATE_CHUNK, n = j->n - i0 < OPS_GATE_CHUNK ? j->n - i0 : OPS_GATE_CHUNK;

    if (j->simd) {
        (j->gelu ? gang__cpu_gelu_mul_avx2 : gang__cpu_silu_mul_avx2)(j->gate + i0, j->up + i0, n,
                                                                      j->out + i0);
        return;
    }
    if (j->gelu) {
        (void)gang__cpu_gelu_mul_ref(j->gate + i0, j->up + i0, n, j->out + i0);
        return;
    }
    for (size_t i = i0; i < i0 + n; i++) {
        float g = j->gate[i];
        /* For very negative g, expf(-g) is +inf and g / inf is -0: the correct limit. */
        j->out[i] = g / (1.0f + expf(-g)) * j->up[i];
    }
}

/* gate(g) x up: AVX2 where usable (cpu-ops-avx2.c), chunks of OPS_GATE_CHUNK shared by the
 * pool from OPS_GATE_MIN_PARALLEL elements (a batch step's [tokens, ffn]). */
static int ops_gate(int gelu, const float *gate, const float *up, size_t n, float *out)
{
    gate_job j = {gate, up, out, n, 0, gelu};
    size_t chunks = (n + OPS_GATE_CHUNK - 1) / OPS_GATE_CHUNK;

    j.simd = gang__cpu_simd();
    if (n < OPS_GATE_MIN_PARALLEL) {
        for (size_t c = 0; c < chunks; c++)
            gate_chunk(&j, c);
        return 0;
    }
    gang__cpu_parallel(gate_chunk, &j, chunks);
    return 0;
}

int gang__cpu_silu_mul(const float *gate, const float *up, size_t n, float *out)
{
    return ops_gate(0, gate, up, n, out);
}

/* PyTorch's gelu(approximate="tanh") as it writes it, in f32: the portable reference. */
int gang__cpu_gelu_mul_ref(const float *gate, const float *up, size_t n, float *out)
{
    const float beta = 0.7978845608028654f, kappa = 0.044715f; /* sqrt(2 / pi) */

    for (size_t i = 0; i < n; i++) {
        float g = gate[i];
        out[i] = 0.5f * g * (1.0f + tanhf(beta * (g + kappa * g * g * g))) * up[i];
    }
    return 0;
}

int gang__cpu_gelu_mul(const float *gate, const float *up, size_t n, float *out)
{
    return ops_gate(1, gate, up, n, out);
}

int gang__cpu_scale(float *x, float a, size_t n)
{
    for (size_t i = 0; i < n; i++)
        x[i] *= a;
    return 0;
}

int gang__cpu_embedding(const float *table, size_t vocab, size_t dim, const int32_t *ids,
                        size_t n_ids, float *out)
{
    /* Check every id first so that a bad one leaves out untouched (no partial output). */
    for (size_t t = 0; t < n_ids; t++)
        if (ids[t] < 0 || (size_t)ids[t] >= vocab)
            return GANG_EINVAL;
    for (size_t t = 0; t < n_ids; t++)
        memcpy(out + t * dim, table + (size_t)ids[t] * dim, dim * sizeof(*out));
    return 0;
}

int gang__cpu_add(float *x, const float *y, size_t n)
{
    for (size_t i = 0; i < n; i++)
        x[i] += y[i];
    return 0;
}

int gang__cpu_add_rows(float *x, const float *bias, size_t rows, size_t cols)
{
    for (size_t r = 0; r < rows; r++) {
        float *row = x + r * cols;

        for (size_t c = 0; c < cols; c++)
            row[c] += bias[c];
    }
    return 0;
}

int gang__cpu_argmax(const float *x, size_t rows, size_t cols, int32_t *out)
{
    for (size_t r = 0; r < rows; r++) {
        const float *row = x + r * cols;
        size_t best = 0;
        int found = 0;

        /* A strict ">" keeps the lowest index on ties; NaN never compares greater. */
        for (size_t i = 0; i < cols; i++) {
            if (isnan(row[i]))
                continue;
            if (!found || row[i] > row[best]) {
                best = i;
                found = 1;
            }
        }
        out[r] = (int32_t)best;
    }
    return 0;
}
