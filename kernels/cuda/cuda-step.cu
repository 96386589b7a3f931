/*
 * CUDA kernels of the decode step (include/ganglion/kernels.h, issue #24): the batched
 * paged attention with the KV append fused, the in-place scatter of block-table entries
 * and the sampler that returns ids.
 *
 * Attention (one launch for the whole step): a block per (token, kv head). It stores its
 * token's key and value rows of that head at the token's position, then its warps share
 * the keys 0 .. p of the sequence (every warp a strided subset, each with its own online
 * softmax) for all the query heads of the group at once, so a K/V row is loaded once per
 * group: 16-byte loads (8 bf16 / f16 or 4 f32 elements a lane). A key written by this
 * launch (a position of the same sequence at or after its first token of the step) is
 * read from the step's new rows, rounded to the pool's type as the store rounds it,
 * because the block that stores it may not have run yet: so no ordering between blocks
 * is needed and the numbers are those of storing first and attending after (up to the
 * order of the f32 sums). The warps' states are merged in shared memory at the end.
 * Before the walk, the block asks for the pool rows of (up to 256 of) its keys in L2 at
 * once, so that each warp's serial walk, a row load per key, waits on L2 and not on HBM:
 * at short contexts a batch-1 step is 8 blocks (8B Llama) whose walks are pure latency.
 * When the step has few tokens and the context is long (a batch-1 decode: a block per kv
 * head, 8 for an 8B Llama, each walking every key), the keys are also split across
 * blocks (grid z) and a second kernel merges their states, as the per-sequence attention
 * does (cuda-attention.cu): the split is planned from the context bound the caller gives
 * (gang_kernels_step_kv.max_keys), not from the positions, so a graph replays it.
 *
 * Sampling: a block per row. Candidates are ordered by one 64-bit key (the logit's bits
 * made descending-orderable, then the id), so "the first n candidates" and "the shortest
 * prefix of mass m" are radix selections over that key, eight 8-bit digits, each digit a
 * histogram of counts or of probability mass (doubles) over the row: no sort and no
 * scratch memory. The sums are parallel, so a draw within rounding of a boundary may
 * pick the neighbour of the CPU's choice (the header says so).
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>

#include "cuda-internal.h"
#include "cuda-pdl.h"
#include "cuda-vec.h"

static int step_launch_result(const char *what)
{
    return gang__cuda_err(cudaGetLastError(), what);
}

/* ---------------------------------------------------------------------------------
 * Scatter of table entries.
 * --------------------------------------------------------------------------------- */
__global__ static void scatter_i32_kernel(int32_t *dst, size_t dst_n, const int32_t *pairs,
                                          size_t n_pairs, int *flag)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n_pairs;
         i += (size_t)gridDim.x * blockDim.x) {
        int32_t at = pairs[2 * i];

        if (at < 0 || (size_t)at >= dst_n)
            atomicOr(flag, GANG_CUDA_FLAG_BAD_INDEX);
        else
            dst[at] = pairs[2 * i + 1];
    }
}

extern "C" int gang__cuda_launch_scatter_i32(cudaStream_t s, int32_t *dst, size_t dst_n,
                                             const int32_t *pairs, size_t n_pairs, int *flag)
{
    size_t blocks = (n_pairs + 255) / 256;

    scatter_i32_kernel<<<(unsigned)(blocks > 1024 ? 1024 : blocks), 256, 0, s>>>(dst, dst_n, pairs,
                                                                                 n_pairs, flag);
    return step_launch_result("scatter launch");
}

/* ---------------------------------------------------------------------------------
 * The fused projections' helpers: one element-wise kernel each.
 * --------------------------------------------------------------------------------- */
__global__ static void split3_kernel(const float *x, size_t rows, size_t w0, size_t w1, size_t w2,
                                     float *o0, float *o1, float *o2)
{
    size_t w = w0 + w1 + w2;

    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < rows * w;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t r = i / w, c = i % w;

        if (c < w0)
            o0[r * w0 + c] = x[i];
        else if (c < w0 + w1)
            o1[r * w1 + c - w0] = x[i];
        else
            o2[r * w2 + c - w0 - w1] = x[i];
    }
}

extern "C" int gang__cuda_launch_split_cols3(cudaStream_t s, const float *x, size_t rows, size_t w0,
                                             size_t w1, size_t w2, float *o0, float *o1, float *o2)
{
    size_t blocks = (rows * (w0 + w1 + w2) + 255) / 256;

    split3_kernel<<<(unsigned)(blocks > 4096 ? 4096 : blocks), 256, 0, s>>>(x, rows, w0, w1, w2, o0,
                                                                            o1, o2);
    return step_launch_result("split launch");
}

/* gang_kernels_silu_mul / gelu_mul's formulas (cuda-ops.cu), on [gate | up] rows. */
__global__ static void glu_kernel(int gelu, const float *x, size_t rows, size_t cols, float *out)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < rows * cols;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t r = i / cols, c = i % cols;
        float g = x[r * 2 * cols + c], u = x[r * 2 * cols + cols + c];

        out[i] = gang_cuda_glu(gelu, g, u);
    }
}

extern "C" int gang__cuda_launch_glu(cudaStream_t s, int gelu, const float *x, size_t rows,
                                     size_t cols, float *out)
{
    size_t blocks = (rows * cols + 255) / 256;

    glu_kernel<<<(unsigned)(blocks > 4096 ? 4096 : blocks), 256, 0, s>>>(gelu, x, rows, cols, out);
    return step_launch_result("glu launch");
}

/* ---------------------------------------------------------------------------------
 * Attention with the KV append fused.
 * --------------------------------------------------------------------------------- */
#define STEP_WARPS 4
#define STEP_MAXG 8       /* query heads handled per pass over the keys */
#define STEP_MAXHD 256    /* head_dim bound of this kernel */
#define STEP_E 8          /* elements a lane holds of one row */
#define STEP_PREFETCH 256 /* keys of a block whose pool rows go toward L2 first */
#define STEP_U 2          /* keys a warp loads before it uses the first of them */

/* What every block of one launch shares. */
typedef struct step_args {
    const void *kc, *vc;
    void *kw, *vw; /* the same pools, written */
    const int32_t *tables, *positions, *table_rows;
    const float *knew, *vnew, *q;
    float *out;
    size_t block_size, n_blocks, n_heads, n_kv_heads, head_dim, window;
    float scale;
    int *flag;
    /* Split keys (splits > 1): block z takes keys [z chunk, (z + 1) chunk) (the last one
     * all keys from there on) and writes its states to part, as attention_split_kernel
     * does, for gang__cuda_launch_attention_merge. */
    size_t chunk;
    unsigned splits;
    float *part;
} step_args;

/*
 * Lanes per key stream for rows of hd elements read V a lane (step_lanes): the power of two
 * that covers hd / V, at most 32. A warp walks 32 / L keys at once, one per group of L
 * lanes (a bf16 row of 128 is 16 lanes' worth: one key a warp left half of it idle).
 */
__device__ static inline unsigned step_lanes(size_t hd, int V)
{
    unsigned L = 1;

    while (L < 32 && (size_t)L * V < hd)
        L <<= 1;
    return L;
}

/*
 * The key and value rows (lane sl's elements, of a group of L lanes) of the STEP_U keys
 * js[u] of kv head h, into kr[u] and vr[u]; ok[u] says whether key u is one to attend to
 * (js[u] <= j1, and its block in range: one out of range is flagged, its rows left zero).
 * A key j >= first is this launch's own (rounded as the store rounds it), else it is read
 * from the pool. In three passes, so that a lane has its STEP_U table reads in flight at
 * once, then its 2 STEP_U row loads: read key by key (a function per row, the value row
 * read only once the key row was), each row waited for its table read and each table read
 * for the previous row, 8 round trips to L2 in a row per round of keys (read from the
 * SASS, 2026-12-05).
 */
template <typename T>
__device__ static void step_rows(const step_args *a, const int32_t *js, int32_t j1, int32_t first,
                                 size_t t_first, int32_t trow, size_t h, unsigned sl, unsigned L,
                                 float (*kr)[STEP_E], float (*vr)[STEP_E], int *ok)
{
    constexpr int V = vec_io<T>::VEC, C = STEP_E / V; /* 16-byte chunks of a lane's run */
    const size_t hd = a->head_dim, w = a->n_kv_heads * hd;
    int32_t blk[STEP_U];
    uint4 kraw[STEP_U][C], vraw[STEP_U][C];

#pragma unroll
    for (int u = 0; u < STEP_U; u++)
        blk[u] = js[u] <= j1 && js[u] < first
                     ? a->tables[(size_t)trow + (size_t)js[u] / a->block_size]
                     : -1;
#pragma unroll
    for (int u = 0; u < STEP_U; u++) {
        const int pool = blk[u] >= 0 && (size_t)blk[u] < a->n_blocks;
        const size_t row =
            pool ? (size_t)blk[u] * a->block_size + (size_t)js[u] % a->block_size : 0;
        const T *kp = (const T *)a->kc + row * w + h * hd,
                *vp = (const T *)a->vc + row * w + h * hd;

#pragma unroll
        for (int c = 0; c < C; c++) {
            const int e0 = (int)(sl + L * c) * V;

            kraw[u][c] = vraw[u][c] = make_uint4(0, 0, 0, 0);
            if (pool && e0 < (int)hd) {
                kraw[u][c] = vec_load16(kp + e0);
                vraw[u][c] = vec_load16(vp + e0);
            }
        }
    }
#pragma unroll
    for (int u = 0; u < STEP_U; u++) {
        const int32_t j = js[u];

        for (int e = 0; e < STEP_E; e++)
            kr[u][e] = vr[u][e] = 0.0f;
        ok[u] = 0;
        if (j > j1)
            continue;
        if (j >= first) {
            const size_t at = (t_first + (size_t)(j - first)) * w + h * hd;

            for (int c = 0; c < C; c++) {
                const int e0 = (int)(sl + L * c) * V;
                if (e0 < (int)hd)
                    for (int i = 0; i < V; i++) {
                        kr[u][c * V + i] = vec_io<T>::round(a->knew[at + e0 + i]);
                        vr[u][c * V + i] = vec_io<T>::round(a->vnew[at + e0 + i]);
                    }
            }
            ok[u] = 1;
            continue;
        }
        if (blk[u] < 0 || (size_t)blk[u] >= a->n_blocks) {
            atomicOr(a->flag, GANG_CUDA_FLAG_BAD_BLOCK);
            continue;
        }
        for (int c = 0; c < C; c++)
            if ((int)(sl + L * c) * V < (int)hd) {
                vec_io<T>::from16(kraw[u][c], kr[u] + c * V);
                vec_io<T>::from16(vraw[u][c], vr[u] + c * V);
            }
        ok[u] = 1;
    }
}

/* Stores token t's key and value rows of kv head h at its position p (rounded to T). */
template <typename T>
__device__ static void step_append(const step_args *a, size_t t, size_t h, int32_t p, int32_t trow)
{
    size_t hd = a->head_dim, w = a->n_kv_heads * hd;
    int32_t blk = a->tables[(size_t)trow + (size_t)p / a->block_size];

    if (blk >= 0 && (size_t)blk < a->n_blocks) {
        size_t row = (size_t)blk * a->block_size + (size_t)p % a->block_size;
        for (size_t e = threadIdx.x; e < hd; e += blockDim.x) {
            ((T *)a->kw)[row * w + h * hd + e] = vec_io<T>::store(a->knew[t * w + h * hd + e]);
            ((T *)a->vw)[row * w + h * hd + e] = vec_io<T>::store(a->vnew[t * w + h * hd + e]);
        }
    } else if (threadIdx.x == 0) {
        atomicOr(a->flag, GANG_CUDA_FLAG_BAD_BLOCK);
    }
}

/*
 * The pool rows of keys j0 .. j1 (at most STEP_PREFETCH of them) of kv head h, K and V,
 * asked for in L2 by the block's threads at once (prefetch: nothing waits, nothing is held),
 * so that the warps' walk over the keys, one row load after another, waits on L2 rather
 * than on HBM. A row's lines: bytes / 128 + 1 addresses, the last one its last byte (a
 * row need not start on a line). A key out of the table's range is left to step_rows.
 */
template <typename T>
__device__ static void step_prefetch(const step_args *a, int32_t j0, int32_t j1, int32_t trow,
                                     size_t h)
{
    const size_t hd = a->head_dim, w = a->n_kv_heads * hd, bytes = hd * sizeof(T);
    const unsigned lines = (unsigned)(bytes / 128 + 1);
    const int32_t n = j1 - j0 + 1 < STEP_PREFETCH ? j1 - j0 + 1 : STEP_PREFETCH;

    for (unsigned i = threadIdx.x; n > 0 && i < (unsigned)n * 2 * lines; i += blockDim.x) {
        const int32_t j = j0 + (int32_t)(i / (2 * lines));
        const unsigned r = i % (2 * lines), l = r % lines;
        const int32_t blk = a->tables[(size_t)trow + (size_t)j / a->block_size];

        if (blk < 0 || (size_t)blk >= a->n_blocks)
            continue;
        const size_t row = (size_t)blk * a->block_size + (size_t)j % a->block_size;
        const char *base =
            (const char *)(r < lines ? a->kc : a->vc) + (row * w + h * hd) * sizeof(T);
        prefetch_l2(base + ((size_t)l * 128 < bytes ? (size_t)l * 128 : bytes - 1));
    }
}

/* The keys [*j0, *j1] the block of split sp attends to for a query at position p: the
 * window's, cut to the split's chunk (the last split to p); *j0 > *j1 when empty. */
__device__ static void step_keys(const step_args *a, int32_t p, unsigned sp, int32_t *j0,
                                 int32_t *j1)
{
    *j0 = a->window > 0 && (size_t)p + 1 > a->window ? p + 1 - (int32_t)a->window : 0;
    *j1 = p;
    if (a->splits > 1) {
        size_t c0 = (size_t)sp * a->chunk;

        if (c0 > (size_t)*j0)
            *j0 = c0 > (size_t)p + 1 ? p + 1 : (int32_t)c0; /* past p: empty */
        if (sp + 1 < a->splits && c0 + a->chunk <= (size_t)p)
            *j1 = (int32_t)(c0 + a->chunk - 1);
    }
}

/*
 * One key's step of a key stream's online softmax (a group of L lanes, sl its lane) for the
 * group's ng query heads: the key row kr (the lane's STEP_E elements) scored against each
 * head's staged q (qs, in vec_swz_lanes' layout: element i of lane sl's run at c L V + i L
 * + sl), then, when valid, each head's m, s and acc rescaled and the value row vr added
 * with its weight. Every lane of the warp calls it (its shuffles take the whole warp); a
 * group without a key this round passes valid 0.
 */
template <int V>
__device__ static inline void step_key_update(const float (*qs)[STEP_MAXHD], size_t ng, size_t hd,
                                              unsigned sl, unsigned L, float scale, int valid,
                                              const float *kr, const float *vr, float *m, float *s,
                                              float (*acc)[STEP_E])
{
    for (size_t k = 0; k < ng; k++) {
        float d = 0.0f;
        for (int c = 0; c * V < STEP_E; c++) {
            int e0 = (int)(sl + L * c) * V;
            if (e0 < (int)hd)
                for (int i = 0; i < V; i++)
                    d += kr[c * V + i] * qs[k][c * L * V + i * L + sl];
        }
        for (unsigned o = L / 2; o > 0; o >>= 1)
            d += __shfl_xor_sync(0xffffffffu, d, o);
        if (!valid)
            continue;
        d *= scale;
        float nm = fmaxf(m[k], d);
        float corr = m[k] == -INFINITY ? 0.0f : __expf(m[k] - nm);
        float pe = __expf(d - nm);
        s[k] = s[k] * corr + pe;
        for (int e = 0; e < STEP_E; e++)
            acc[k][e] = acc[k][e] * corr + pe * vr[e];
        m[k] = nm;
    }
}

/* The key streams of a warp (groups of L lanes) merged into every lane: each head's m, s and
 * acc combined with the group's partner's, L, 2 L, ... lanes away (shuffles of the whole
 * warp), as the warps' states are merged afterwards. */
__device__ static inline void step_merge_streams(size_t ng, unsigned L, float *m, float *s,
                                                 float (*acc)[STEP_E])
{
    for (unsigned o = L; o < 32; o <<= 1)
        for (size_t k = 0; k < ng; k++) {
            float mo = __shfl_xor_sync(0xffffffffu, m[k], o);
            float so = __shfl_xor_sync(0xffffffffu, s[k], o);
            float mx = fmaxf(m[k], mo);
            float f = m[k] == -INFINITY ? 0.0f : __expf(m[k] - mx);
            float fo = mo == -INFINITY ? 0.0f : __expf(mo - mx);

            for (int e = 0; e < STEP_E; e++) {
                float ao = __shfl_xor_sync(0xffffffffu, acc[k][e], o);
                acc[k][e] = acc[k][e] * f + ao * fo;
            }
            s[k] = s[k] * f + so * fo;
            m[k] = mx;
        }
}

template <typename T> __global__ static void attention_step_kernel(step_args a)
{
    __shared__ float qs[STEP_MAXG][STEP_MAXHD];
    __shared__ float wm[STEP_WARPS][STEP_MAXG], wsum[STEP_WARPS][STEP_MAXG];
    __shared__ float wacc[STEP_WARPS][STEP_MAXG][STEP_MAXHD];
    __shared__ int32_t first_s;
    __shared__ size_t t_first_s;
    const int V = vec_io<T>::VEC, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    size_t t = blockIdx.x, h = blockIdx.y, hd = a.head_dim, g = a.n_heads / a.n_kv_heads;
    const unsigned sp = blockIdx.z, L = step_lanes(hd, V), P = 32 / L, sl = lane % L;
    int32_t p = a.positions[t], trow = a.table_rows[t];

    pdl_trigger(); /* a GEMV launched after this one may start its weight loads (cuda-pdl.h) */
    if (p < 0 || trow < 0) {
        if (threadIdx.x == 0 && sp == 0)
            atomicOr(a.flag, GANG_CUDA_FLAG_BAD_POSITION);
        return;
    }
    if (sp == 0) /* the append: this token's rows of head h, at its position */
        step_append<T>(&a, t, h, p, trow);
    /* The sequence's first token of this launch: its keys from there on are fresh. */
    if (threadIdx.x == 0) {
        size_t f = t;
        while (f > 0 && a.table_rows[f - 1] == trow && a.positions[f - 1] == a.positions[f] - 1)
            f--;
        t_first_s = f;
        first_s = a.positions[f];
    }
    int32_t j0, j1;
    step_keys(&a, p, sp, &j0, &j1);
    step_prefetch<T>(&a, j0, j1, trow, h);
    for (size_t hc = 0; hc < g; hc += STEP_MAXG) {
        size_t ng = g - hc < STEP_MAXG ? g - hc : STEP_MAXG;
        float m[STEP_MAXG], s[STEP_MAXG], acc[STEP_MAXG][STEP_E], kr[STEP_U][STEP_E],
            vr[STEP_U][STEP_E];

        __syncthreads();
        for (size_t i = threadIdx.x; i < ng * hd; i += blockDim.x)
            qs[i / hd][vec_swz_lanes<V>((unsigned)(i % hd), L)] =
                a.q[(t * a.n_heads + h * g + hc + i / hd) * hd + i % hd];
        __syncthreads();
        for (size_t k = 0; k < STEP_MAXG; k++) {
            m[k] = -INFINITY;
            s[k] = 0.0f;
            for (int e = 0; e < STEP_E; e++)
                acc[k][e] = 0.0f;
        }
        /* Key stream warp P + lane / L (of STEP_WARPS P) takes the keys j0 + its number,
         * + STEP_WARPS P, ...: STEP_U of them at a time, their rows all loaded before the
         * first is used, so their loads are in flight together. */
        for (int32_t jw = j0 + warp * (int32_t)P; jw <= j1;
             jw += (int32_t)(STEP_WARPS * P * STEP_U)) {
            int ok[STEP_U];
            int32_t js[STEP_U];

#pragma unroll
            for (int u = 0; u < STEP_U; u++)
                js[u] = jw + u * (int32_t)(STEP_WARPS * P) + (int32_t)(lane / L);
            step_rows<T>(&a, js, j1, first_s, t_first_s, trow, h, sl, L, kr, vr, ok);
#pragma unroll
            for (int u = 0; u < STEP_U; u++)
                step_key_update<V>(qs, ng, hd, sl, L, a.scale, ok[u], kr[u], vr[u], m, s, acc);
        }
        step_merge_streams(ng, L, m, s, acc);
        /* Each warp's state into shared memory, then merged per (head, element). */
        for (size_t k = 0; k < ng; k++) {
            if (lane == 0) {
                wm[warp][k] = m[k];
                wsum[warp][k] = s[k];
            }
            for (int c = 0; c * V < STEP_E && lane < (int)L; c++) {
                int e0 = (int)(sl + L * c) * V;
                if (e0 < (int)hd)
                    for (int i = 0; i < V; i++)
                        wacc[warp][k][e0 + i] = acc[k][c * V + i];
            }
        }
        __syncthreads();
        for (size_t i = threadIdx.x; i < ng * hd; i += blockDim.x) {
            size_t k = i / hd, e = i % hd, pair = t * a.n_heads + h * g + hc + k;
            float mx = -INFINITY, num = 0.0f, den = 0.0f;

            for (int v = 0; v < STEP_WARPS; v++)
                mx = fmaxf(mx, wm[v][k]);
            for (int v = 0; v < STEP_WARPS; v++) {
                float f = wm[v][k] == -INFINITY ? 0.0f : __expf(wm[v][k] - mx);
                num += f * wacc[v][k][e];
                den += f * wsum[v][k];
            }
            if (a.splits > 1) { /* this chunk's unnormalised state (m = -inf: empty) */
                float *st = a.part + (pair * a.splits + sp) * (hd + 2);

                if (e == 0)
                    st[0] = mx, st[1] = den;
                st[2 + e] = num;
            } else {
                a.out[pair * hd + e] = den > 0.0f ? num / den : 0.0f;
            }
        }
    }
}

extern "C" int gang__cuda_launch_attention_step(cudaStream_t s, const gang_kernels_step_kv *kv,
                                                const float *knew, const float *vnew,
                                                const float *q, size_t tokens, size_t n_heads,
                                                size_t n_kv_heads, size_t head_dim, size_t window,
                                                float *out, int *flag, float *scratch,
                                                size_t scratch_floats, int n_sm)
{
    step_args a = {kv->kc,
                   kv->vc,
                   kv->kc,
                   kv->vc,
                   kv->tables,
                   kv->positions,
                   kv->table_rows,
                   knew,
                   vnew,
                   q,
                   out,
                   kv->block_size,
                   kv->n_blocks,
                   n_heads,
                   n_kv_heads,
                   head_dim,
                   window,
                   (float)(1.0 / sqrt((double)head_dim)),
                   flag,
                   0,
                   1,
                   scratch};
    /* Planned from the sizes and the context bound only, never from the positions: a
     * captured step replays it. */
    if (scratch != NULL)
        a.splits = gang__cuda_attention_splits(tokens * n_kv_heads, tokens * n_heads, kv->max_keys,
                                               head_dim, scratch_floats, n_sm);
    a.chunk = (kv->max_keys + a.splits - 1) / a.splits;
    dim3 grid((unsigned)tokens, (unsigned)n_kv_heads, a.splits);

    /* 16-byte loads need whole vectors per row; the lane holds STEP_E elements. */
    if (head_dim > STEP_MAXHD || head_dim % 8 != 0 || n_kv_heads > 65535 ||
        (kv->dtype == GANG_DTYPE_F32 ? head_dim > 32 * 2 * 4 : head_dim > 32 * 8))
        return GANG_ENOSYS;
    if (kv->dtype == GANG_DTYPE_BF16)
        attention_step_kernel<__nv_bfloat16><<<grid, 32 * STEP_WARPS, 0, s>>>(a);
    else if (kv->dtype == GANG_DTYPE_F16)
        attention_step_kernel<__half><<<grid, 32 * STEP_WARPS, 0, s>>>(a);
    else
        attention_step_kernel<float><<<grid, 32 * STEP_WARPS, 0, s>>>(a);
    int rc = step_launch_result("step attention launch");
    if (rc < 0 || a.splits == 1)
        return rc;
    return gang__cuda_launch_attention_merge(s, scratch, tokens * n_heads, a.splits, head_dim, out);
}

/* ---------------------------------------------------------------------------------
 * Sampling.
 * --------------------------------------------------------------------------------- */
#define SAMPLE_THREADS 512
#define SAMPLE_U 8 /* elements of the row a thread loads before it uses the first */

/*
 * f(i, x[i]) for the row's elements i = threadIdx.x, + SAMPLE_THREADS, ... in that order,
 * SAMPLE_U loads in flight (strided_rounds): one at a time they were a round trip each, and
 * a row of a batch-1 step is one block (an 8B Llama's 128256 logits: 250 trips in a row per
 * pass; read from the PTX, 2026-12-05).
 */
template <typename F> __device__ static inline void sample_each(const float *x, size_t cols, F f)
{
    float l[SAMPLE_U];

    strided_rounds<SAMPLE_U, SAMPLE_THREADS>(
        cols, [&](int u, size_t i) { l[u] = x[i]; }, [&](int u, size_t i) { f(i, l[u]); });
}

__device__ static uint64_t step_mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* gang_kernels_uniform, on the device. */
__device__ static double step_uniform(uint64_t seed, uint64_t position)
{
    uint64_t z = step_mix64(seed + 0x9e3779b97f4a7c15ull);

    z = step_mix64(z ^ (position * 0xd1b54a32d192ed03ull + 0x632be59bd9b4e019ull));
    return (double)(z >> 11) * (1.0 / 9007199254740992.0);
}

/* The candidate key of (logit, id): ascending key = logit descending, then id ascending.
 * -0 is +0 (they compare equal on the CPU, where the id breaks the tie). */
__device__ static uint64_t sample_key(float l, uint32_t id)
{
    uint32_t u = l == 0.0f ? 0u : __float_as_uint(l);
    uint32_t asc = (u & 0x80000000u) ? ~u : (u | 0x80000000u);

    return ((uint64_t)(~asc) << 32) | id;
}

__device__ static uint64_t block_min_u64(uint64_t v, uint64_t *shared)
{
    for (int o = 16; o > 0; o >>= 1) {
        uint64_t w = __shfl_xor_sync(0xffffffffu, v, o);
        v = w < v ? w : v;
    }
    if ((threadIdx.x & 31) == 0)
        shared[threadIdx.x >> 5] = v;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int i = 1; i < SAMPLE_THREADS / 32; i++)
            v = shared[i] < v ? shared[i] : v;
        shared[0] = v;
    }
    __syncthreads();
    v = shared[0];
    __syncthreads();
    return v;
}

/* What one row's selections share: the row, its best logit and the temperature. */
typedef struct sample_row {
    const float *x;
    size_t cols;
    float l0;
    double inv_t;
} sample_row;

/* The probability mass of a candidate of logit l (unnormalised), 0 for NaN. */
__device__ static double sample_mass(const sample_row *r, float l)
{
    return isnan(l) ? 0.0 : exp(((double)l - (double)r->l0) * r->inv_t);
}

/*
 * The radix selection: the smallest key K <= lim such that the candidates with keys <= K
 * count n (by_mass 0), or have a mass above target (by_mass 1, strict) or reaching it
 * (by_mass 2). Every thread gets K; lim when the row's mass never gets there.
 */
__device__ static uint64_t sample_select(const sample_row *r, uint64_t lim, int by_mass,
                                         double target, uint32_t n)
{
    __shared__ double hm[256];
    __shared__ uint32_t hc[256];
    __shared__ uint64_t pick;
    __shared__ double left_m;
    __shared__ uint32_t left_c;
    uint64_t prefix = 0;

    if (threadIdx.x == 0) {
        left_m = target;
        left_c = n;
    }
    for (int shift = 56; shift >= 0; shift -= 8) {
        uint64_t hi_mask = shift == 56 ? 0 : ~0ull << (shift + 8);

        for (int b = threadIdx.x; b < 256; b += SAMPLE_THREADS)
            hm[b] = 0.0, hc[b] = 0;
        __syncthreads();
        sample_each(r->x, r->cols, [&](size_t i, float l) {
            uint64_t key;

            if (isnan(l))
                return;
            key = sample_key(l, (uint32_t)i);
            if (key > lim || (key & hi_mask) != prefix)
                return;
            if (by_mass)
                atomicAdd(&hm[(key >> shift) & 255], sample_mass(r, l));
            else
                atomicAdd(&hc[(key >> shift) & 255], 1u);
        });
        __syncthreads();
        if (threadIdx.x == 0) {
            int b, last = -1;

            for (b = 0; b < 256; b++) {
                if (by_mass ? hm[b] > 0.0 : hc[b] > 0)
                    last = b;
                if (by_mass == 0 && left_c <= hc[b])
                    break;
                if (by_mass == 1 && left_m < hm[b])
                    break;
                if (by_mass == 2 && left_m <= hm[b])
                    break;
                left_c -= by_mass == 0 ? hc[b] : 0;
                left_m -= by_mass ? hm[b] : 0.0;
            }
            if (b == 256)
                b = last < 0 ? 255 : last; /* rounding: the last candidate there is */
            pick = prefix | ((uint64_t)b << shift);
        }
        __syncthreads();
        prefix = pick;
        __syncthreads();
    }
    return prefix < lim ? prefix : lim;
}

/* The mass of the candidates with keys <= lim. */
__device__ static double sample_mass_upto(const sample_row *r, uint64_t lim, double *shared)
{
    double v = 0.0;

    sample_each(r->x, r->cols, [&](size_t i, float l) {
        if (!isnan(l) && sample_key(l, (uint32_t)i) <= lim)
            v += sample_mass(r, l);
    });
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    if ((threadIdx.x & 31) == 0)
        shared[threadIdx.x >> 5] = v;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int i = 1; i < SAMPLE_THREADS / 32; i++)
            v += shared[i];
        shared[0] = v;
    }
    __syncthreads();
    v = shared[0];
    __syncthreads();
    return v;
}

__global__ static void sample_kernel(const float *x, size_t cols,
                                     const gang_kernels_sample_param *params, int32_t *out)
{
    __shared__ uint64_t sk[SAMPLE_THREADS / 32];
    __shared__ double sd[SAMPLE_THREADS / 32];
    __shared__ uint32_t n_valid;
    const gang_kernels_sample_param p = params[blockIdx.x];
    sample_row r = {x + blockIdx.x * cols, cols, 0.0f, 0.0};
    uint64_t best = ~0ull, lim;
    uint32_t mine = 0, n;
    double sum;

    if (threadIdx.x == 0)
        n_valid = 0;
    __syncthreads();
    sample_each(r.x, cols, [&](size_t i, float l) {
        if (isnan(l))
            return;
        uint64_t k = sample_key(l, (uint32_t)i);
        best = k < best ? k : best;
        mine++;
    });
    atomicAdd(&n_valid, mine);
    best = block_min_u64(best, sk);
    /* Greedy, an all-NaN row, or an infinite best logit (it takes all the mass). */
    if (best == ~0ull || !(p.temperature > 0.0f) || p.top_k == 1 || isinf(r.x[(uint32_t)best])) {
        if (threadIdx.x == 0)
            out[blockIdx.x] = best == ~0ull ? 0 : (int32_t)(uint32_t)best;
        return;
    }
    r.l0 = r.x[(uint32_t)best];
    r.inv_t = 1.0 / (double)p.temperature;
    n = p.top_k > 0 && p.top_k < n_valid ? p.top_k : n_valid;
    lim = sample_select(&r, ~0ull, 0, 0.0, n);
    sum = sample_mass_upto(&r, lim, sd);
    if (p.top_p > 0.0f && p.top_p < 1.0f) {
        lim = sample_select(&r, lim, 2, (double)p.top_p * sum, 0);
        sum = sample_mass_upto(&r, lim, sd);
    }
    lim = sample_select(&r, lim, 1, step_uniform(p.seed, p.position) * sum, 0);
    if (threadIdx.x == 0)
        out[blockIdx.x] = (int32_t)(uint32_t)lim;
}

extern "C" int gang__cuda_launch_sample(cudaStream_t s, const float *logits, size_t rows,
                                        size_t cols, const gang_kernels_sample_param *params,
                                        int32_t *out)
{
    if (rows > 0x7fffffffu)
        return GANG_ERANGE;
    sample_kernel<<<(unsigned)rows, SAMPLE_THREADS, 0, s>>>(logits, cols, params, out);
    return step_launch_result("sample launch");
}
