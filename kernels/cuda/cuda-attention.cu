/*
 * CUDA causal grouped-query attention (prefill and decode share one kernel).
 *
 * Algorithm: one block per (query token i, head h), ATT_WARPS warps. The query row is
 * held in registers, pre-scaled by 1/sqrt(head_dim), spread over the 32 lanes of every
 * warp (lane l owns dimensions l, l + 32, ..., up to ATT_PER_LANE of them, hence
 * head_dim <= 32 * ATT_PER_LANE). Warp w walks the keys j = w, w + W, ... <= pos0 + i
 * (causal), ATT_UNROLL keys per step, computes each score with a warp reduction (every
 * lane ends with the sum) and keeps an online softmax (running max m, running denominator
 * l, and its lanes' slice of the weighted value sum, rescaled by exp(m_old - m_new)
 * whenever the max grows). The
 * warps' partial states are then merged through shared memory with the same rescaling:
 *   M = max_w m_w,  L = sum_w l_w e^(m_w - M),  out = sum_w acc_w e^(m_w - M) / L.
 * Reads of K and V rows are coalesced (consecutive lanes, consecutive dimensions).
 *
 * Precision: f32 throughout (scores, exponentials, accumulators), against the CPU
 * reference's double; tests/unit/test-cuda.c documents the tolerance.
 *
 * Decode launches only n_heads blocks, fewer than the H200's 132 SMs: then the keys are
 * also split across blocks, whose partial states a second kernel merges (see
 * attention_split_kernel).
 *
 * Paged caches (gang_kernels_kv_pages): key j is read at row table[j / block_size] x
 * block_size + j % block_size instead of row j (attn_row); table NULL is the contiguous
 * cache. A half-precision pool (bf16 / f16) is widened to f32 as each element is read
 * (the kernels are templates over the element type, attn_ld). Blocks are at least a warp's stride
 * apart in no particular order, so a row's read stays coalesced across the lanes (they share the
 * row).
 *
 * Aliasing: out may be q: a block reads its query row into registers before any write,
 * and blocks touch disjoint rows.
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>

#include "cuda-internal.h"
#include "cuda-pdl.h"

#define ATT_WARPS 8
#define ATT_PER_LANE 8         /* head_dim <= 256 */
#define ATT_UNROLL 4           /* keys per warp and step */
#define ATT_SPLIT_MIN_KEYS 128 /* fewest keys worth a block of their own */
#define ATT_MAX_SPLITS 64

/* One cache element as f32. */
__device__ static inline float attn_ld(const float *p)
{
    return *p;
}
__device__ static inline float attn_ld(const __nv_bfloat16 *p)
{
    return __bfloat162float(*p);
}
__device__ static inline float attn_ld(const __half *p)
{
    return __half2float(*p);
}

/* The cache row of key j: j, or its row in its block when the cache is paged. */
__device__ static inline size_t attn_row(const int32_t *table, unsigned block_size, size_t j)
{
    return table == NULL ? j : (size_t)table[j / block_size] * block_size + j % block_size;
}

/*
 * The part every kernel shares: the block walks keys [j0, j1) (the caller clips j1 to the
 * causal bound) for query row qrow and kv head g, and leaves its merged state:
 *   *m_out = M (or -inf when the range is empty), *l_out = L, num[d] = sum_w acc_w[d] e^..
 * in shared memory, visible to every thread after the final barrier. Every thread of the
 * block must call it (it synchronises).
 */
template <typename T>
__device__ static void
block_attend(const float *qrow, const T *kc, const T *vc, const int32_t *table, unsigned block_size,
             size_t kv_stride, unsigned g, unsigned head_dim, float scale, size_t j0, size_t j1,
             float *s_m, float *s_l, float (*s_acc)[32 * ATT_PER_LANE])
{
    const unsigned lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    float qv[ATT_PER_LANE], acc[ATT_PER_LANE];
    float m = -INFINITY, l = 0.0f;

#pragma unroll
    for (int r = 0; r < ATT_PER_LANE; r++) {
        unsigned d = lane + 32u * r;
        qv[r] = d < head_dim ? qrow[d] * scale : 0.0f;
        acc[r] = 0.0f;
    }

    /* ATT_UNROLL keys per step, so that their loads are in flight together (a decode step
     * is bound by the latency of these reads, not by arithmetic). Whether key u of a step
     * exists is the same for every lane, so the shuffles never diverge. */
    for (size_t j = j0 + warp; j < j1; j += ATT_WARPS * ATT_UNROLL) {
        float dots[ATT_UNROLL], p[ATT_UNROLL];
        float m_new = m;

#pragma unroll
        for (int u = 0; u < ATT_UNROLL; u++) {
            size_t jj = j + (size_t)u * ATT_WARPS;
            float dot = 0.0f;

            /* The row only for a key that exists: past j1 a paged table has no entry
             * (reading table[jj / block_size] there would run past the sequence's row). */
            if (jj < j1) {
                const T *krow =
                    kc + attn_row(table, block_size, jj) * kv_stride + (size_t)g * head_dim;
#pragma unroll
                for (int r = 0; r < ATT_PER_LANE; r++) {
                    unsigned d = lane + 32u * r;
                    if (d < head_dim)
                        dot += qv[r] * attn_ld(krow + d);
                }
            }
            dots[u] = dot;
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
#pragma unroll
            for (int u = 0; u < ATT_UNROLL; u++)
                dots[u] += __shfl_xor_sync(0xffffffffu, dots[u], o);
        }
#pragma unroll
        for (int u = 0; u < ATT_UNROLL; u++) {
            if (j + (size_t)u * ATT_WARPS >= j1)
                dots[u] = -INFINITY; /* no such key: weight 0 */
            m_new = fmaxf(m_new, dots[u]);
        }
        /* Key u = 0 always exists, so m_new is finite; m = -inf on the first step makes
         * corr 0, which clears the (zero) state. */
        float corr = expf(m - m_new);
        l *= corr;
#pragma unroll
        for (int u = 0; u < ATT_UNROLL; u++) {
            p[u] = expf(dots[u] - m_new);
            l += p[u];
        }
#pragma unroll
        for (int r = 0; r < ATT_PER_LANE; r++)
            acc[r] *= corr;
#pragma unroll
        for (int u = 0; u < ATT_UNROLL; u++) {
            size_t jj = j + (size_t)u * ATT_WARPS;
            if (jj >= j1)
                continue;
            const T *vrow = vc + attn_row(table, block_size, jj) * kv_stride + (size_t)g * head_dim;
#pragma unroll
            for (int r = 0; r < ATT_PER_LANE; r++) {
                unsigned d = lane + 32u * r;
                if (d < head_dim)
                    acc[r] += p[u] * attn_ld(vrow + d);
            }
        }
        m = m_new;
    }

    if (lane == 0) {
        s_m[warp] = m;
        s_l[warp] = l;
    }
#pragma unroll
    for (int r = 0; r < ATT_PER_LANE; r++)
        s_acc[warp][lane + 32u * r] = acc[r];
    __syncthreads();
}

/* Merges the warps' states left by block_attend: the block maximum and denominator, and
 * (for dimension d) the rescaled numerator. Warps that saw no key (m = -inf) add 0. */
__device__ static void block_merge(const float *s_m, const float *s_l, float *mx_out,
                                   float *den_out)
{
    float mx = -INFINITY, den = 0.0f;

    for (int w = 0; w < ATT_WARPS; w++)
        mx = fmaxf(mx, s_m[w]);
    for (int w = 0; w < ATT_WARPS; w++)
        if (s_m[w] != -INFINITY)
            den += s_l[w] * expf(s_m[w] - mx);
    *mx_out = mx;
    *den_out = den;
}

__device__ static float block_num(const float *s_m, const float (*s_acc)[32 * ATT_PER_LANE],
                                  float mx, unsigned d)
{
    float num = 0.0f;

    for (int w = 0; w < ATT_WARPS; w++)
        if (s_m[w] != -INFINITY)
            num += s_acc[w][d] * expf(s_m[w] - mx);
    return num;
}

/* Single pass: one block per (query i, head h) over all its keys, writing out directly. */
template <typename T>
__global__ static void attention_kernel(const float *q, const T *kc, const T *vc,
                                        const int32_t *table, unsigned block_size, unsigned n_heads,
                                        unsigned n_kv_heads, unsigned head_dim, size_t pos0,
                                        size_t window, float scale, float *out)
{
    __shared__ float s_m[ATT_WARPS], s_l[ATT_WARPS];
    __shared__ float s_acc[ATT_WARPS][32 * ATT_PER_LANE];
    const unsigned h = blockIdx.x % n_heads;
    const size_t i = blockIdx.x / n_heads;
    const unsigned g = h / (n_heads / n_kv_heads);
    const size_t n_keys = pos0 + i + 1, first = window && n_keys > window ? n_keys - window : 0;
    float mx, den;

    /* block_attend reads the query row into registers and synchronises before returning,
     * so the writes below may overwrite it (out = q). */
    block_attend(q + (i * n_heads + h) * head_dim, kc, vc, table, block_size,
                 (size_t)n_kv_heads * head_dim, g, head_dim, scale, first, n_keys, s_m, s_l, s_acc);
    block_merge(s_m, s_l, &mx, &den);
    float *orow = out + (i * n_heads + h) * head_dim;
    for (unsigned d = threadIdx.x; d < head_dim; d += blockDim.x)
        orow[d] = block_num(s_m, s_acc, mx, d) / den;
}

/*
 * Split keys (flash-decoding): when there are fewer (query, head) pairs than SMs, as in
 * decode, the keys are cut into `splits` chunks and block (pair, s) handles chunk s,
 * writing its unnormalised state to the scratch: part[(pair * splits + s)] holds m, l and
 * head_dim numerators. attention_merge_kernel then combines the chunks of each pair with
 * the same rescaling as the warps. A chunk past a query's causal bound is empty (m = -inf)
 * (or before its sliding window) and adds nothing; the chunk holding the first key of the
 * window is never empty.
 */
template <typename T>
__global__ static void
attention_split_kernel(const float *q, const T *kc, const T *vc, const int32_t *table,
                       unsigned block_size, unsigned n_heads, unsigned n_kv_heads,
                       unsigned head_dim, size_t pos0, size_t window, float scale, size_t chunk,
                       unsigned splits, float *part)
{
    __shared__ float s_m[ATT_WARPS], s_l[ATT_WARPS];
    __shared__ float s_acc[ATT_WARPS][32 * ATT_PER_LANE];
    const unsigned pair = blockIdx.x, h = pair % n_heads, sp = blockIdx.y;
    const size_t i = pair / n_heads, n_keys = pos0 + i + 1;
    const unsigned g = h / (n_heads / n_kv_heads);
    const size_t first = window && n_keys > window ? n_keys - window : 0;
    size_t j0 = (size_t)sp * chunk, j1 = j0 + chunk;
    float mx, den;

    if (j0 < first)
        j0 = first; /* before the sliding window */
    if (j1 > n_keys)
        j1 = n_keys;
    if (j0 > j1)
        j0 = j1; /* empty: the state stays m = -inf */
    block_attend(q + (i * n_heads + h) * head_dim, kc, vc, table, block_size,
                 (size_t)n_kv_heads * head_dim, g, head_dim, scale, j0, j1, s_m, s_l, s_acc);
    block_merge(s_m, s_l, &mx, &den);
    float *st = part + ((size_t)pair * splits + sp) * (head_dim + 2);
    if (threadIdx.x == 0) {
        st[0] = mx;
        st[1] = den;
    }
    for (unsigned d = threadIdx.x; d < head_dim; d += blockDim.x)
        st[2 + d] = mx == -INFINITY ? 0.0f : block_num(s_m, s_acc, mx, d);
}

__global__ static void attention_merge_kernel(const float *part, unsigned splits, unsigned head_dim,
                                              float *out)
{
    const float *st = part + (size_t)blockIdx.x * splits * (head_dim + 2);
    float *orow = out + (size_t)blockIdx.x * head_dim;
    float mx = -INFINITY, den = 0.0f;

    pdl_trigger(); /* a GEMV launched after this one may start its weight loads (cuda-pdl.h) */
    for (unsigned s = 0; s < splits; s++)
        mx = fmaxf(mx, st[(size_t)s * (head_dim + 2)]);
    for (unsigned s = 0; s < splits; s++) {
        float m = st[(size_t)s * (head_dim + 2)];
        if (m != -INFINITY)
            den += st[(size_t)s * (head_dim + 2) + 1] * expf(m - mx);
    }
    for (unsigned d = threadIdx.x; d < head_dim; d += blockDim.x) {
        float num = 0.0f;
        for (unsigned s = 0; s < splits; s++) {
            float m = st[(size_t)s * (head_dim + 2)];
            if (m != -INFINITY)
                num += st[(size_t)s * (head_dim + 2) + 2 + d] * expf(m - mx);
        }
        orow[d] = num / den;
    }
}

extern "C" int gang__cuda_launch_attention_merge(cudaStream_t s, const float *part, size_t pairs,
                                                 unsigned splits, size_t head_dim, float *out)
{
    if (pairs > 0x7fffffffu)
        return GANG_ERANGE;
    attention_merge_kernel<<<(unsigned)pairs, 128, 0, s>>>(part, splits, (unsigned)head_dim, out);
    return gang__cuda_err(cudaGetLastError(), "attention merge launch");
}

extern "C" unsigned gang__cuda_attention_splits(size_t blocks, size_t pairs, size_t max_keys,
                                                size_t head_dim, size_t scratch_floats, int n_sm)
{
    size_t want;

    if (scratch_floats == 0 || n_sm <= 0 || blocks == 0 || pairs == 0 || blocks >= (size_t)n_sm)
        return 1;
    want = ((size_t)2 * n_sm + blocks - 1) / blocks; /* about two waves */
    if (want > max_keys / ATT_SPLIT_MIN_KEYS)
        want = max_keys / ATT_SPLIT_MIN_KEYS;
    if (want > scratch_floats / (pairs * (head_dim + 2)))
        want = scratch_floats / (pairs * (head_dim + 2));
    if (want > ATT_MAX_SPLITS)
        want = ATT_MAX_SPLITS;
    return want < 2 ? 1u : (unsigned)want;
}

/*
 * Chooses the plan: split the keys when the (query, head) pairs would leave most SMs idle
 * and there are enough keys to share (gang__cuda_attention_splits), within the scratch the
 * handle reserved; otherwise one pass. T is the cache's element type.
 */
template <typename T>
static int launch_attention(cudaStream_t s, const float *q, const T *kc, const T *vc,
                            const int32_t *table, size_t block_size, size_t tq, size_t n_heads,
                            size_t n_kv_heads, size_t head_dim, size_t pos0, size_t window,
                            float *out, float *scratch, size_t scratch_floats, int n_sm)
{
    size_t pairs = tq * n_heads, max_keys = pos0 + tq;
    float scale = (float)(1.0 / sqrt((double)head_dim));
    unsigned splits = 1;

    if (head_dim > 32 * ATT_PER_LANE) {
        gang_error("kernels/cuda: attention supports head_dim <= %d (got %zu)", 32 * ATT_PER_LANE,
                   head_dim);
        return GANG_ERANGE;
    }
    if (pairs > 0x7fffffffu || n_heads > 0xffffffffu || n_kv_heads > 0xffffffffu ||
        block_size > 0xffffffffu)
        return GANG_ERANGE;
    if (scratch != NULL)
        splits =
            gang__cuda_attention_splits(pairs, pairs, max_keys, head_dim, scratch_floats, n_sm);
    if (splits == 1) {
        attention_kernel<T><<<(unsigned)pairs, ATT_WARPS * 32, 0, s>>>(
            q, kc, vc, table, (unsigned)block_size, (unsigned)n_heads, (unsigned)n_kv_heads,
            (unsigned)head_dim, pos0, window, scale, out);
        return gang__cuda_err(cudaGetLastError(), "attention launch");
    }
    size_t chunk = (max_keys + splits - 1) / splits;
    dim3 grid((unsigned)pairs, splits);
    attention_split_kernel<T><<<grid, ATT_WARPS * 32, 0, s>>>(
        q, kc, vc, table, (unsigned)block_size, (unsigned)n_heads, (unsigned)n_kv_heads,
        (unsigned)head_dim, pos0, window, scale, chunk, splits, scratch);
    int rc = gang__cuda_err(cudaGetLastError(), "attention (split) launch");
    if (rc < 0)
        return rc;
    return gang__cuda_launch_attention_merge(s, scratch, pairs, splits, head_dim, out);
}

extern "C" int gang__cuda_launch_attention(cudaStream_t s, const float *q, const void *kc,
                                           const void *vc, gang_dtype dtype, const int32_t *table,
                                           size_t block_size, size_t tq, size_t tk, size_t n_heads,
                                           size_t n_kv_heads, size_t head_dim, size_t pos0,
                                           size_t window, float *out, float *scratch,
                                           size_t scratch_floats, int n_sm)
{
    (void)tk; /* the front checked pos0 + tq <= tk; rows past pos0 + i are never read */
    switch (dtype) {
    case GANG_DTYPE_F32:
        return launch_attention(s, q, (const float *)kc, (const float *)vc, table, block_size, tq,
                                n_heads, n_kv_heads, head_dim, pos0, window, out, scratch,
                                scratch_floats, n_sm);
    case GANG_DTYPE_BF16:
        return launch_attention(s, q, (const __nv_bfloat16 *)kc, (const __nv_bfloat16 *)vc, table,
                                block_size, tq, n_heads, n_kv_heads, head_dim, pos0, window, out,
                                scratch, scratch_floats, n_sm);
    case GANG_DTYPE_F16:
        return launch_attention(s, q, (const __half *)kc, (const __half *)vc, table, block_size, tq,
                                n_heads, n_kv_heads, head_dim, pos0, window, out, scratch,
                                scratch_floats, n_sm);
    default:
        return GANG_EINVAL;
    }
}
