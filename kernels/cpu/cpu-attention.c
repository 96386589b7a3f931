/*
 * CPU backend: causal grouped-query attention over a key/value cache.
 *
 * For each query token i (absolute position p = pos0 + i) and head h, with g the kv head
 * h / (n_heads / n_kv_heads):
 *
 *   s_j   = (q[i,h] . k[j,g]) / sqrt(head_dim)            for j = 0 .. p
 *   w_j   = exp(s_j - max_j s_j) / sum_j exp(s_j - max_j s_j)
 *   out   = sum_j w_j v[j,g]
 *
 * Keys after p are never touched, which is what makes the operation causal and lets a
 * cache be larger than its filled part.
 *
 * Decode and short prefills: work items. One item is one query row and up to
 * GANG__ATTN_HEADS heads of one kv group (cpu-attention-item.h: f32, keys a tile at a
 * time with an online softmax, each key and value row widened once for the whole group).
 * gang__cpu_attention_batch collects the items of every sequence of a step and shares
 * them among the pool's threads (cpu-pool.c); a single call is a batch of one. The item
 * kernel is AVX2 + FMA + F16C where the CPU has them (cpu-attention-avx2.c) and portable C
 * otherwise: the same algorithm, the summation order within a dot product differs. Until
 * 2026-12 this path was a per-head loop in double on one thread: a third of a batch-1
 * SmolLM2 decode step (bf16 cache rows widened once per head) and 18% of a batch-32 one
 * with the other core idle.
 *
 * Long prefills take a blocked path instead (attention_blocked): per head and block of
 * ATTN_BLOCK_Q queries, the scores are one OpenBLAS sgemm against the keys the block
 * needs, the causal softmax runs in float over each row, and the output is a second
 * sgemm against the values. Same result to float rounding, and an order of magnitude
 * faster for prompts of thousands of tokens (a 32k-token prompt is quadratic work). It
 * is taken only when a call has at least ATTN_BLOCK_MIN_Q queries and
 * ATTN_BLOCK_MIN_KEYS keys. The thresholds (8 queries, 256 keys) were 64 and
 * 2,048 until a 1,000-token SmolLM2 prompt was measured: 57.6 s to its first token, 54%
 * of it in the per-head path; 16.6 s with the blocked path from 256 keys, and the
 * 11-token remainder of a prompt whose first 992 tokens come from the prefix cache went
 * from 0.85 s to 0.41 s with the blocked path from 8 queries.
 *
 * A paged cache (gang_kernels_kv_pages) changes only where row j is read: the items look
 * each row up through the block table, and the blocked path first gathers the rows its
 * block needs into a contiguous copy, so both compute exactly what they compute on a
 * contiguous cache holding the same rows. A half-precision pool (bf16 / f16) is widened
 * to f32 as it is read (a row at a time, or in the gathered copy).
 */
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "cpu.h"

#define ATTN_BLOCK_Q 64
#define ATTN_BLOCK_MIN_Q 8
#define ATTN_BLOCK_MIN_KEYS 256

/* Widens n elements at src (of the pool's dtype) into f32 dst (also the portable item
 * kernel's primitive of that name). */
static inline void attn_widen_into(const void *src, gang_dtype dt, size_t n, float *dst)
{
    if (dt == GANG_DTYPE_BF16)
        (void)gang_bf16_to_f32_array(src, dst, n);
    else if (dt == GANG_DTYPE_F16)
        (void)gang_f16_to_f32_array(src, dst, n);
    else
        memcpy(dst, src, n * sizeof(float));
}

/* Copies rows 0 .. n-1 of a paged cache (row width w elements) contiguously into f32 dst. */
static void attn_gather(const void *src, const gang_kernels_kv_pages *pg, size_t n, size_t w,
                        float *dst)
{
    size_t es = gang_dtype_size(pg->dtype);

    for (size_t j = 0; j < n; j += pg->block_size) {
        size_t run = n - j < pg->block_size ? n - j : pg->block_size;
        attn_widen_into((const char *)src + gang__cpu_kv_row(pg, j) * w * es, pg->dtype, run * w,
                        dst + j * w);
    }
}

/* The blocked path (see the file comment); the arguments are those of the front. */
static int attention_blocked(const float *q, const void *kc, const void *vc,
                             const gang_kernels_kv_pages *pg, size_t tq, size_t n_heads,
                             size_t n_kv_heads, size_t head_dim, size_t pos0, size_t window,
                             float *out)
{
    size_t group = n_heads / n_kv_heads, n_max = pos0 + tq, w = n_kv_heads * head_dim;
    float scale = (float)(1.0 / sqrt((double)head_dim));
    float *s = malloc((size_t)ATTN_BLOCK_Q * n_max * sizeof(float)), *flat = NULL;
    const float *kf = kc, *vf = vc;
    gang__cpu_sgemm_fn sgemm;
    int rc = gang__cpu_blas_load(&sgemm);

    if (rc < 0) {
        free(s);
        return rc;
    }
    if (s == NULL)
        return GANG_ENOMEM;
    if (pg != NULL) {
        /* The sgemms want the keys and values contiguous: one gathered copy of each. */
        flat = malloc(2 * n_max * w * sizeof(float));
        if (flat == NULL) {
            free(s);
            return GANG_ENOMEM;
        }
        attn_gather(kc, pg, n_max, w, flat);
        attn_gather(vc, pg, n_max, w, flat + n_max * w);
        kf = flat;
        vf = flat + n_max * w;
    }
    int qs = (int)(n_heads * head_dim), ks = (int)(n_kv_heads * head_dim), d = (int)head_dim;
    for (size_t h = 0; h < n_heads; h++) {
        const float *kh = kf + (h / group) * head_dim, *vh = vf + (h / group) * head_dim;
        for (size_t i0 = 0; i0 < tq; i0 += ATTN_BLOCK_Q) {
            size_t b = tq - i0 < ATTN_BLOCK_Q ? tq - i0 : ATTN_BLOCK_Q;
            size_t nk = pos0 + i0 + b; /* keys the block's last query sees */
            sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)b, (int)nk, d, scale,
                  q + (i0 * n_heads + h) * head_dim, qs, kh, ks, 0.0f, s, (int)nk);
            for (size_t r = 0; r < b; r++) {
                float *row = s + r * nk, max = -INFINITY, sum = 0.0f;
                size_t valid = pos0 + i0 + r + 1;
                size_t first = window != 0 && valid > window ? valid - window : 0;
                for (size_t j = first; j < valid; j++)
                    max = row[j] > max ? row[j] : max;
                for (size_t j = first; j < valid; j++) {
                    row[j] = expf(row[j] - max);
                    sum += row[j];
                }
                float inv = 1.0f / sum;
                for (size_t j = 0; j < first; j++)
                    row[j] = 0.0f;
                for (size_t j = first; j < valid; j++)
                    row[j] *= inv;
                for (size_t j = valid; j < nk; j++)
                    row[j] = 0.0f;
            }
            /* The block's queries were read by the first product: out may be q. */
            sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)b, d, (int)nk, 1.0f, s, (int)nk,
                  vh, ks, 0.0f, out + (i0 * n_heads + h) * head_dim, qs);
        }
    }
    free(flat);
    free(s);
    return 0;
}

/* ---------------------------------------------------------------------------------
 * Work items: the portable instance of cpu-attention-item.h, and the driver.
 * --------------------------------------------------------------------------------- */
static inline void attn_scores(const float *q, const float *const *kr, size_t nt, size_t hd,
                               float scale, float *s)
{
    for (size_t t = 0; t < nt; t++) {
        float acc = 0.0f;

        for (size_t d = 0; d < hd; d++)
            acc += q[d] * kr[t][d];
        s[t] = acc * scale;
    }
}

static inline void attn_pv(float *acc, const float *p, const float *const *vr, size_t nt, size_t hd)
{
    for (size_t t = 0; t < nt; t++)
        for (size_t d = 0; d < hd; d++)
            acc[d] += p[t] * vr[t][d];
}

static inline void attn_scal(float *y, float a, size_t n)
{
    for (size_t i = 0; i < n; i++)
        y[i] *= a;
}

static inline float attn_exp_sum(float *s, size_t n, float m)
{
    float sum = 0.0f;

    for (size_t i = 0; i < n; i++) {
        s[i] = expf(s[i] - m);
        sum += s[i];
    }
    return sum;
}

#define ATTN_ITEM_FN gang__cpu_attn_item_ref
#include "cpu-attention-item.h"
#undef ATTN_ITEM_FN

/* Head dimensions up to this keep an item's scratch on the stack. */
#define ATTN_STACK_DIM 512
/* A call with fewer multiply-adds than this runs on its caller (a pool wake-up costs more). */
#define ATTN_MIN_MACS 32768
#define ATTN_CHUNKS_PER_THREAD 8
#define ATTN_STACK_SEQS 64

typedef struct attn_job {
    const gang_kernels_attn_seq *seqs;
    const size_t *start; /* [n_seq + 1] first item of each sequence (blocked ones: none) */
    size_t n_seq, n_heads, n_kv_heads, head_dim, window, subs, per_chunk, items, tile;
    float scale;
    int simd;
    atomic_int rc;
} attn_job;

/* Item `it` of the job: its sequence (binary search over start), query row, kv head and
 * its sub-group of at most GANG__ATTN_HEADS heads. */
static void attn_run_item(attn_job *j, size_t idx, float *acc, float *tiles)
{
    size_t lo = 0, hi = j->n_seq, group = j->n_heads / j->n_kv_heads;

    while (hi - lo > 1) { /* the last s with start[s] <= idx */
        size_t mid = (lo + hi) / 2;

        if (j->start[mid] <= idx)
            lo = mid;
        else
            hi = mid;
    }
    const gang_kernels_attn_seq *sq = &j->seqs[lo];
    size_t r = idx - j->start[lo], sub = r % j->subs, g = r / j->subs % j->n_kv_heads;
    size_t i = r / j->subs / j->n_kv_heads, h0 = g * group + sub * GANG__ATTN_HEADS;
    size_t n_keys = sq->pos0 + i + 1;
    gang__cpu_attn_item item = {
        .q = sq->q + (i * j->n_heads + h0) * j->head_dim,
        .out = sq->out + (i * j->n_heads + h0) * j->head_dim,
        .kc = sq->kc,
        .vc = sq->vc,
        .pg = sq->pages,
        .dt = sq->pages != NULL ? sq->pages->dtype : GANG_DTYPE_F32,
        .row_w = j->n_kv_heads * j->head_dim,
        .off = g * j->head_dim,
        .first = j->window != 0 && n_keys > j->window ? n_keys - j->window : 0,
        .n_keys = n_keys,
        .heads = group - sub * GANG__ATTN_HEADS < GANG__ATTN_HEADS ? group - sub * GANG__ATTN_HEADS
                                                                   : GANG__ATTN_HEADS,
        .head_dim = j->head_dim,
        .scale = j->scale,
        .tile = j->tile,
        .acc = acc,
        .kt = tiles,
        .vt = tiles + j->tile * j->head_dim,
    };
    if (j->simd)
        gang__cpu_attn_item_avx2(&item);
    else
        gang__cpu_attn_item_ref(&item);
}

/* One chunk of items, with its scratch on the stack (the heap past ATTN_STACK_DIM). */
static void attn_chunk(void *arg, size_t c)
{
    attn_job *j = arg;
    size_t i0 = c * j->per_chunk, i1 = i0 + j->per_chunk < j->items ? i0 + j->per_chunk : j->items;
    size_t hd = j->head_dim, need = (GANG__ATTN_HEADS + 2 * j->tile) * hd;
    float stack[GANG__ATTN_HEADS * ATTN_STACK_DIM + 2 * GANG__ATTN_TILE_FLOATS], *buf = stack;

    if (hd > ATTN_STACK_DIM) {
        buf = malloc(need * sizeof(float));
        if (buf == NULL) {
            atomic_store(&j->rc, GANG_ENOMEM);
            return;
        }
    }
    for (size_t i = i0; i < i1; i++)
        attn_run_item(j, i, buf, buf + GANG__ATTN_HEADS * hd);
    if (buf != stack)
        free(buf);
}

/* The blocked path's choice for one sequence (see the file comment). */
static int attn_blocked(const gang_kernels_attn_seq *s)
{
    return s->tq >= ATTN_BLOCK_MIN_Q && s->pos0 + s->tq >= ATTN_BLOCK_MIN_KEYS;
}

int gang__cpu_attention_batch(const gang_kernels_attn_seq *seqs, size_t n_seq, size_t n_heads,
                              size_t n_kv_heads, size_t head_dim, size_t window)
{
    size_t start_stack[ATTN_STACK_SEQS + 1], *start = start_stack, group = n_heads / n_kv_heads;
    attn_job j = {
        .seqs = seqs,
        .n_seq = n_seq,
        .n_heads = n_heads,
        .n_kv_heads = n_kv_heads,
        .head_dim = head_dim,
        .window = window,
        .subs = (group + GANG__ATTN_HEADS - 1) / GANG__ATTN_HEADS,
        .tile = head_dim >= GANG__ATTN_TILE_FLOATS / GANG__ATTN_TILE
                    ? (head_dim < GANG__ATTN_TILE_FLOATS ? GANG__ATTN_TILE_FLOATS / head_dim : 1)
                    : GANG__ATTN_TILE,
        .scale = (float)(1.0 / sqrt((double)head_dim))};
    double macs = 0.0;
    size_t chunks;
    unsigned threads;
    int rc = 0;

    j.simd = gang__cpu_simd();
    atomic_init(&j.rc, 0);
    if (n_seq > ATTN_STACK_SEQS && (start = malloc((n_seq + 1) * sizeof(*start))) == NULL)
        return GANG_ENOMEM;
    /* Long prefills first, each on the blocked path (OpenBLAS's own threads). */
    for (size_t i = 0; i < n_seq; i++) {
        const gang_kernels_attn_seq *s = &seqs[i];

        start[i] = j.items;
        if (attn_blocked(s)) {
            rc = attention_blocked(s->q, s->kc, s->vc, s->pages, s->tq, n_heads, n_kv_heads,
                                   head_dim, s->pos0, window, s->out);
            if (rc != 0)
                goto out;
            continue;
        }
        j.items += s->tq * n_kv_heads * j.subs;
        macs += 2.0 * (double)s->tq * (double)n_heads * (double)head_dim *
                (double)(s->pos0 + (s->tq + 1) / 2);
    }
    start[n_seq] = j.items;
    j.start = start;
    if (j.items == 0)
        goto out;
    threads = gang__cpu_threads();
    chunks = macs < ATTN_MIN_MACS ? 1 : (size_t)threads * ATTN_CHUNKS_PER_THREAD;
    if (chunks > j.items)
        chunks = j.items;
    j.per_chunk = (j.items + chunks - 1) / chunks;
    chunks = (j.items + j.per_chunk - 1) / j.per_chunk;
    gang__cpu_parallel(attn_chunk, &j, chunks);
    rc = atomic_load(&j.rc);
out:
    if (start != start_stack)
        free(start);
    return rc;
}

int gang__cpu_attention(const float *q, const void *kc, const void *vc,
                        const gang_kernels_kv_pages *pg, size_t tq, size_t tk, size_t n_heads,
                        size_t n_kv_heads, size_t head_dim, size_t pos0, size_t window, float *out)
{
    gang_kernels_attn_seq s = {
        .q = q, .out = out, .kc = kc, .vc = vc, .pages = pg, .tq = tq, .tk = tk, .pos0 = pos0};

    return gang__cpu_attention_batch(&s, 1, n_heads, n_kv_heads, head_dim, window);
}
