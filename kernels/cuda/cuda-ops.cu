/*
 * CUDA kernels of the row-wise and element-wise operations: RMSNorm, RoPE, softmax,
 * SiLU-mul, embedding, residual add, argmax, dtype conversion and the benchmark's random
 * fill. Each launcher enqueues on the handle's stream and returns the launch error.
 *
 * Numerics follow the CPU backend's contracts: RMSNorm's mean of squares and softmax's
 * denominator are accumulated in double (one block per row, so the cost is negligible
 * next to the memory traffic); RoPE computes its angles in double; argmax ignores NaN and
 * breaks ties towards the lowest index, so the result does not depend on the reduction
 * order. Element-wise kernels use grid-stride loops with 64-bit indices.
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>

#include "cuda-internal.h"
#include "cuda-pdl.h"
#include "cuda-vec.h"

#define OPS_THREADS 256
#define OPS_MAX_BLOCKS 4096

/* Blocks for a grid-stride loop over n elements. */
static unsigned grid_for(size_t n)
{
    size_t b = (n + OPS_THREADS - 1) / OPS_THREADS;
    return (unsigned)(b > OPS_MAX_BLOCKS ? OPS_MAX_BLOCKS : (b == 0 ? 1 : b));
}

static int launch_result(const char *what)
{
    return gang__cuda_err(cudaGetLastError(), what);
}

/* Sum of v over the block (OPS_THREADS threads); every thread gets the result. */
__device__ static double block_sum(double v, double *shared)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    if ((threadIdx.x & 31) == 0)
        shared[threadIdx.x >> 5] = v;
    __syncthreads();
    if (threadIdx.x < 32) {
        double w = threadIdx.x < OPS_THREADS / 32 ? shared[threadIdx.x] : 0.0;
        for (int o = 16; o > 0; o >>= 1)
            w += __shfl_xor_sync(0xffffffffu, w, o);
        if (threadIdx.x == 0)
            shared[0] = w;
    }
    __syncthreads();
    v = shared[0];
    __syncthreads(); /* shared may be reused by the caller's next reduction */
    return v;
}

__device__ static float block_max(float v, float *shared)
{
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    if ((threadIdx.x & 31) == 0)
        shared[threadIdx.x >> 5] = v;
    __syncthreads();
    if (threadIdx.x < 32) {
        float w = threadIdx.x < OPS_THREADS / 32 ? shared[threadIdx.x] : -INFINITY;
        for (int o = 16; o > 0; o >>= 1)
            w = fmaxf(w, __shfl_xor_sync(0xffffffffu, w, o));
        if (threadIdx.x == 0)
            shared[0] = w;
    }
    __syncthreads();
    v = shared[0];
    __syncthreads();
    return v;
}

/* Element i of p in storage dt (f32, bf16, f16) as f32, and back (round to nearest even):
 * the conversions' and the norms' output. */
__device__ static float load_as_f32(const void *p, int dt, size_t i)
{
    if (dt == GANG_DTYPE_F16)
        return __half2float(((const __half *)p)[i]);
    if (dt == GANG_DTYPE_BF16)
        return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
    return ((const float *)p)[i];
}

__device__ static void store_from_f32(void *p, int dt, size_t i, float v)
{
    if (dt == GANG_DTYPE_F16)
        ((__half *)p)[i] = __float2half_rn(v);
    else if (dt == GANG_DTYPE_BF16)
        ((__nv_bfloat16 *)p)[i] = __float2bfloat16_rn(v);
    else
        ((float *)p)[i] = v;
}

/* ---------------------------------------------------------------------------------
 * RMSNorm: one block per row. out may alias x: each element is read before it is written
 * by the same thread, after the whole row was reduced.
 *
 * A thread takes its elements i = t, t + OPS_THREADS, ... NORM_U at a time (strided_rounds,
 * cuda-vec.h): their loads first, then the sums and stores in the same order. One at a time, a load
 * could not pass the store before it (x and out may alias), so a batch-1 row of 4096 was 16 round
 * trips to L2 in a row per pass, in the one block a decode step's norm is (read from the PTX,
 * 2026-12-05); now 2. The sums keep their order: the same numbers.
 * --------------------------------------------------------------------------------- */
#define NORM_U 8

/* Row r's RMSNorm into orow (storage odt: f32, or bf16 / f16 rounded as
 * gang__cuda_launch_convert rounds), the row's mean of squares ss (summed by each thread
 * over its elements) reduced here: rmsnorm_kernel and add_rmsnorm_kernel share it, so the
 * numbers of the fused kernel are rmsnorm's. */
__device__ static void rmsnorm_finish(const float *xr, const float *w, float eps, size_t dim,
                                      double ss, double *red, int odt, void *orow)
{
    ss = block_sum(ss, red);
    float scale = rms_scale(ss, dim, eps);
    float xv[NORM_U], wv[NORM_U];

    strided_rounds<NORM_U, OPS_THREADS>(
        dim, [&](int u, size_t i) { xv[u] = xr[i], wv[u] = w[i]; },
        [&](int u, size_t i) { store_from_f32(orow, odt, i, xv[u] * scale * wv[u]); });
}

__global__ static void rmsnorm_kernel(const float *x, const float *w, float eps, size_t dim,
                                      int odt, void *out)
{
    __shared__ double red[OPS_THREADS / 32];
    const float *xr = x + blockIdx.x * dim;
    double ss = 0.0;

    pdl_trigger(); /* a GEMV launched after this one may start its weight loads (cuda-pdl.h) */
    float xv[NORM_U];

    strided_rounds<NORM_U, OPS_THREADS>(
        dim, [&](int u, size_t i) { xv[u] = xr[i]; },
        [&](int u, size_t) { ss += (double)xv[u] * (double)xv[u]; });
    rmsnorm_finish(xr, w, eps, dim, ss, red, odt,
                   (char *)out + blockIdx.x * dim * (odt == GANG_DTYPE_F32 ? 4 : 2));
}

/* The residual add and the next RMSNorm (gang_kernels_add_rmsnorm): one block per row, each
 * thread adding the elements it then squares and normalises (its own, so no barrier
 * between the add and the reads; y may be x). */
__global__ static void add_rmsnorm_kernel(float *x, const float *y, const float *w, float eps,
                                          size_t dim, float *out)
{
    __shared__ double red[OPS_THREADS / 32];
    float *xr = x + blockIdx.x * dim;
    const float *yr = y + blockIdx.x * dim;
    double ss = 0.0;

    pdl_trigger(); /* a GEMV launched after this one may start its weight loads (cuda-pdl.h) */
    float xv[NORM_U], yv[NORM_U];

    strided_rounds<NORM_U, OPS_THREADS>(
        dim, [&](int u, size_t i) { xv[u] = xr[i], yv[u] = yr[i]; },
        [&](int u, size_t i) {
            float v = xv[u] + yv[u];

            xr[i] = v;
            ss += (double)v * (double)v;
        });
    rmsnorm_finish(xr, w, eps, dim, ss, red, GANG_DTYPE_F32, out + blockIdx.x * dim);
}

extern "C" int gang__cuda_launch_add_rmsnorm(cudaStream_t s, float *x, const float *y,
                                             const float *w, float eps, size_t rows, size_t dim,
                                             float *out)
{
    if (rows > 0x7fffffffu)
        return GANG_ERANGE;
    add_rmsnorm_kernel<<<(unsigned)rows, OPS_THREADS, 0, s>>>(x, y, w, eps, dim, out);
    return launch_result("add_rmsnorm launch");
}

extern "C" int gang__cuda_launch_rmsnorm(cudaStream_t s, const float *x, const float *w, float eps,
                                         size_t rows, size_t dim, float *out)
{
    return gang__cuda_launch_rmsnorm_to(s, x, w, eps, rows, dim, GANG_DTYPE_F32, out);
}

extern "C" int gang__cuda_launch_rmsnorm_to(cudaStream_t s, const float *x, const float *w,
                                            float eps, size_t rows, size_t dim, gang_dtype odt,
                                            void *out)
{
    if (rows > 0x7fffffffu)
        return GANG_ERANGE;
    rmsnorm_kernel<<<(unsigned)rows, OPS_THREADS, 0, s>>>(x, w, eps, dim, (int)odt, out);
    return launch_result("rmsnorm launch");
}

/* ---------------------------------------------------------------------------------
 * RoPE (rotate_half pairs i, i + h/2), one thread per pair. A negative position leaves
 * its token untouched and sets GANG_CUDA_FLAG_BAD_POSITION in the handle's error word,
 * reported by the next sync (the front cannot read device positions).
 * --------------------------------------------------------------------------------- */
/* Pair i of the head at v (plus the head's bias when there is one: add_rows first) rotated
 * by pos into out (out may be v): rope_kernel's and split_qkv_rope's one formula. A
 * negative pos writes the pair unrotated and raises the handle's flag. */
__device__ static void rope_pair(const float *v, const float *bias, size_t i, size_t half,
                                 int32_t pos, const float *inv_freq, double scale, float *out,
                                 int *flag)
{
    float a = bias != NULL ? v[i] + bias[i] : v[i];
    float b = bias != NULL ? v[i + half] + bias[i + half] : v[i + half];

    if (pos < 0) {
        atomicOr(flag, GANG_CUDA_FLAG_BAD_POSITION);
        out[i] = a;
        out[i + half] = b;
        return;
    }
    double sn, cs;
    sincos((double)pos * (double)inv_freq[i], &sn, &cs);
    sn *= scale;
    cs *= scale;
    out[i] = (float)((double)a * cs - (double)b * sn);
    out[i + half] = (float)((double)b * cs + (double)a * sn);
}

__global__ static void rope_kernel(float *x, const int32_t *positions, size_t tokens, size_t heads,
                                   size_t head_dim, const float *inv_freq, double scale, int *flag)
{
    size_t half = head_dim / 2, total = tokens * heads * half;

    for (size_t idx = blockIdx.x * (size_t)blockDim.x + threadIdx.x; idx < total;
         idx += (size_t)gridDim.x * blockDim.x) {
        size_t i = idx % half, th = idx / half, t = th / heads;
        float *v = x + th * head_dim;

        rope_pair(v, NULL, i, half, positions[t], inv_freq, scale, v, flag);
    }
}

extern "C" int gang__cuda_launch_rope(cudaStream_t s, float *x, const int32_t *positions,
                                      size_t tokens, size_t heads, size_t head_dim,
                                      const float *inv_freq, float scale, int *flag)
{
    rope_kernel<<<grid_for(tokens * heads * (head_dim / 2)), OPS_THREADS, 0, s>>>(
        x, positions, tokens, heads, head_dim, inv_freq, (double)scale, flag);
    return launch_result("rope launch");
}

/*
 * gang_kernels_split_qkv_rope: one grid-stride pass over the rows' rotation pairs of the q
 * and k heads (read from the concatenated row, biased, rotated into q or k) and then over
 * their v elements (copied, biased). Each output element is written once, from x only.
 */
__global__ static void split_qkv_rope_kernel(gang_kernels_qkv_rope a, int *flag)
{
    size_t hd = a.head_dim, half = hd / 2, heads = a.n_heads + a.n_kv_heads;
    size_t q_cols = a.n_heads * hd, kv_cols = a.n_kv_heads * hd, w = q_cols + 2 * kv_cols;
    size_t pairs = a.rows * heads * half, total = pairs + a.rows * kv_cols;

    for (size_t idx = blockIdx.x * (size_t)blockDim.x + threadIdx.x; idx < total;
         idx += (size_t)gridDim.x * blockDim.x) {
        if (idx < pairs) {
            size_t i = idx % half, h = idx / half % heads, t = idx / half / heads;
            int is_q = h < a.n_heads;
            size_t col = h * hd; /* of the concatenated row: q heads, then k heads */
            size_t oc = is_q ? col : col - q_cols;
            const float *bias = is_q ? a.bq : a.bk;
            float *out = (is_q ? a.q + t * q_cols : a.k + t * kv_cols) + oc;

            rope_pair(a.x + t * w + col, bias != NULL ? bias + oc : NULL, i, half, a.positions[t],
                      a.inv_freq, (double)a.scale, out, flag);
        } else {
            size_t j = idx - pairs, c = j % kv_cols, t = j / kv_cols;
            float v = a.x[t * w + q_cols + kv_cols + c];

            a.v[t * kv_cols + c] = a.bv != NULL ? v + a.bv[c] : v;
        }
    }
}

extern "C" int gang__cuda_launch_split_qkv_rope(cudaStream_t s, const gang_kernels_qkv_rope *a,
                                                int *flag)
{
    size_t n =
        a->rows * ((a->n_heads + a->n_kv_heads) * (a->head_dim / 2) + a->n_kv_heads * a->head_dim);

    split_qkv_rope_kernel<<<grid_for(n), OPS_THREADS, 0, s>>>(*a, flag);
    return launch_result("split_qkv_rope launch");
}

/* ---------------------------------------------------------------------------------
 * Softmax in place, one block per row: max, then the sum of exp in double, then scale.
 * A row of only -INFINITY becomes zeros (the max is -INFINITY).
 * --------------------------------------------------------------------------------- */
__global__ static void softmax_kernel(float *x, size_t cols)
{
    __shared__ double red[OPS_THREADS / 32];
    __shared__ float redf[OPS_THREADS / 32];
    float *row = x + blockIdx.x * cols;
    float mx = -INFINITY;
    double sum = 0.0;

    for (size_t i = threadIdx.x; i < cols; i += OPS_THREADS)
        mx = fmaxf(mx, row[i]);
    mx = block_max(mx, redf);
    if (mx == -INFINITY) {
        for (size_t i = threadIdx.x; i < cols; i += OPS_THREADS)
            row[i] = 0.0f;
        return;
    }
    for (size_t i = threadIdx.x; i < cols; i += OPS_THREADS)
        sum += exp((double)row[i] - (double)mx);
    sum = block_sum(sum, red);
    for (size_t i = threadIdx.x; i < cols; i += OPS_THREADS)
        row[i] = (float)(exp((double)row[i] - (double)mx) / sum);
}

extern "C" int gang__cuda_launch_softmax(cudaStream_t s, float *x, size_t rows, size_t cols)
{
    if (rows > 0x7fffffffu)
        return GANG_ERANGE;
    softmax_kernel<<<(unsigned)rows, OPS_THREADS, 0, s>>>(x, cols);
    return launch_result("softmax launch");
}

/* ---------------------------------------------------------------------------------
 * Element-wise: SiLU-mul, add.
 * --------------------------------------------------------------------------------- */
__global__ static void silu_mul_kernel(const float *gate, const float *up, size_t n, float *out)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float g = gate[i];
        out[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

extern "C" int gang__cuda_launch_silu_mul(cudaStream_t s, const float *gate, const float *up,
                                          size_t n, float *out)
{
    silu_mul_kernel<<<grid_for(n), OPS_THREADS, 0, s>>>(gate, up, n, out);
    return launch_result("silu_mul launch");
}

/* PyTorch's gelu(approximate="tanh") of the gate times up. */
__global__ static void gelu_mul_kernel(const float *gate, const float *up, size_t n, float *out)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float g = gate[i];
        out[i] =
            0.5f * g * (1.0f + tanhf(0.7978845608028654f * (g + 0.044715f * g * g * g))) * up[i];
    }
}

extern "C" int gang__cuda_launch_gelu_mul(cudaStream_t s, const float *gate, const float *up,
                                          size_t n, float *out)
{
    gelu_mul_kernel<<<grid_for(n), OPS_THREADS, 0, s>>>(gate, up, n, out);
    return launch_result("gelu_mul launch");
}

__global__ static void scale_kernel(float *x, float a, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        x[i] *= a;
}

extern "C" int gang__cuda_launch_scale(cudaStream_t s, float *x, float a, size_t n)
{
    scale_kernel<<<grid_for(n), OPS_THREADS, 0, s>>>(x, a, n);
    return launch_result("scale launch");
}

__global__ static void add_kernel(float *x, const float *y, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        x[i] += y[i];
}

extern "C" int gang__cuda_launch_add(cudaStream_t s, float *x, const float *y, size_t n)
{
    add_kernel<<<grid_for(n), OPS_THREADS, 0, s>>>(x, y, n);
    return launch_result("add launch");
}

/* Bias over rows: one grid-stride pass over rows x cols, the column from the index. */
__global__ static void add_rows_kernel(float *x, const float *bias, size_t rows, size_t cols)
{
    size_t n = rows * cols;

    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        x[i] += bias[i % cols];
}

extern "C" int gang__cuda_launch_add_rows(cudaStream_t s, float *x, const float *bias, size_t rows,
                                          size_t cols)
{
    add_rows_kernel<<<grid_for(rows * cols), OPS_THREADS, 0, s>>>(x, bias, rows, cols);
    return launch_result("add_rows launch");
}

/* ---------------------------------------------------------------------------------
 * Embedding: a checking pass, then a copy that does nothing when the check failed.
 * --------------------------------------------------------------------------------- */
__global__ static void check_ids_kernel(const int32_t *ids, size_t n_ids, size_t vocab, int *words)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n_ids;
         i += (size_t)gridDim.x * blockDim.x)
        if (ids[i] < 0 || (size_t)ids[i] >= vocab) {
            words[1] = 1;
            atomicOr(&words[0], GANG_CUDA_FLAG_BAD_ID);
        }
}

extern "C" int gang__cuda_launch_check_ids(cudaStream_t s, const int32_t *ids, size_t n_ids,
                                           size_t vocab, int *words)
{
    check_ids_kernel<<<grid_for(n_ids), OPS_THREADS, 0, s>>>(ids, n_ids, vocab, words);
    return launch_result("embedding check launch");
}

__global__ static void embedding_kernel(const float *table, size_t dim, const int32_t *ids,
                                        size_t n_ids, const int *flag, float *out)
{
    size_t total = n_ids * dim;

    if (*flag != 0)
        return;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t t = i / dim, d = i % dim;
        out[i] = table[(size_t)ids[t] * dim + d];
    }
}

extern "C" int gang__cuda_launch_embedding(cudaStream_t s, const float *table, size_t dim,
                                           const int32_t *ids, size_t n_ids, const int *flag,
                                           float *out)
{
    embedding_kernel<<<grid_for(n_ids * dim), OPS_THREADS, 0, s>>>(table, dim, ids, n_ids, flag,
                                                                   out);
    return launch_result("embedding launch");
}

/* ---------------------------------------------------------------------------------
 * Argmax, one block per row. A candidate (v, i) beats (bv, bi) when bi < 0 (no candidate
 * yet), v > bv, or v == bv and i < bi; NaN is never a candidate. That order is total, so
 * any reduction tree gives the lowest index of the maximum.
 * --------------------------------------------------------------------------------- */
__device__ static void argmax_take(float v, long long i, float *bv, long long *bi)
{
    if (isnan(v))
        return;
    if (*bi < 0 || v > *bv || (v == *bv && i < *bi)) {
        *bv = v;
        *bi = i;
    }
}

__global__ static void argmax_kernel(const float *x, size_t cols, int32_t *out)
{
    __shared__ float sv[OPS_THREADS / 32];
    __shared__ long long si[OPS_THREADS / 32];
    const float *row = x + blockIdx.x * cols;
    float bv = 0.0f;
    long long bi = -1;

    for (size_t i = threadIdx.x; i < cols; i += OPS_THREADS)
        argmax_take(row[i], (long long)i, &bv, &bi);
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        long long oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (oi >= 0)
            argmax_take(ov, oi, &bv, &bi);
    }
    if ((threadIdx.x & 31) == 0) {
        sv[threadIdx.x >> 5] = bv;
        si[threadIdx.x >> 5] = bi;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        bv = 0.0f;
        bi = -1;
        for (int w = 0; w < OPS_THREADS / 32; w++)
            if (si[w] >= 0)
                argmax_take(sv[w], si[w], &bv, &bi);
        out[blockIdx.x] = bi < 0 ? 0 : (int32_t)bi;
    }
}

extern "C" int gang__cuda_launch_argmax(cudaStream_t s, const float *x, size_t rows, size_t cols,
                                        int32_t *out)
{
    if (rows > 0x7fffffffu)
        return GANG_ERANGE;
    argmax_kernel<<<(unsigned)rows, OPS_THREADS, 0, s>>>(x, cols, out);
    return launch_result("argmax launch");
}

/* ---------------------------------------------------------------------------------
 * Conversion between storage types (through f32, round to nearest even) and the
 * benchmark's random fill.
 * --------------------------------------------------------------------------------- */
__global__ static void convert_kernel(int from, const void *src, int to, void *dst, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        store_from_f32(dst, to, i, load_as_f32(src, from, i));
}

extern "C" int gang__cuda_launch_convert(cudaStream_t s, gang_dtype from, const void *src,
                                         gang_dtype to, void *dst, size_t n)
{
    if (from == to) {
        size_t es = gang_dtype_size(from);
        if (src == dst)
            return 0;
        return gang__cuda_err(cudaMemcpyAsync(dst, src, n * es, cudaMemcpyDeviceToDevice, s),
                              "convert copy");
    }
    convert_kernel<<<grid_for(n), OPS_THREADS, 0, s>>>((int)from, src, (int)to, dst, n);
    return launch_result("convert launch");
}
