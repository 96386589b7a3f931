/*
 * CPU backend: y = x . W^T over a block weight (a GGUF file's own quantized blocks,
 * include/ganglion/kernels.h "Block types"), and the quantization of x it starts with.
 *
 * As the formats' integer dot products are defined, each row of x is quantized per 32
 * elements to int8 with one scale (max |x| / 127); a weight block is unpacked into
 * groups of 32 signed bytes with a scale per 16 and an offset per 32 (gang__kw_unpack),
 * and each group adds d (a0 s0 + a1 s1) + b d sum(qx) to the output, s0 and s1 being the
 * exact int32 products of its two halves. The portable loop below is the reference the
 * AVX2 kernel (cpu-qmatmul-avx2.c) and the AVX-512 VNNI one (cpu-qmatmul-avx512.c) are
 * tested against, chosen at run time by gang__cpu_simd()'s level: all compute the same
 * integers, only the f32 summation order differs.
 *
 * Work split as cpu-matmul.c's: chunks of whole rows of W on the pool, every chunk
 * against every row of x, so each block is read and unpacked once per call (per 16 rows
 * of x in the AVX2 kernel) whatever m is; x's int8 copy (a quarter of its f32 bytes)
 * stays in the cores' caches.
 */
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "cpu.h"
#include "kernels-blocks.h"

#define GANG__QMM_ROWS 8
#define GANG__QMM_MIN_MACS 200000 /* as cpu-matmul.c: below this, the caller alone */
#define GANG__QMM_CHUNKS_PER_THREAD 8

void gang__cpu_quantize_x(const float *x, size_t m, size_t kdim, const gang__cpu_qx *qx)
{
    size_t groups = kdim / 32;

    for (size_t r = 0; r < m; r++) {
        for (size_t g = 0; g < groups; g++) {
            const float *v = x + r * kdim + g * 32;
            int8_t *q = qx->q + r * kdim + g * 32;
            float amax = 0.0f, d, id;
            int sum = 0;

            for (int j = 0; j < 32; j++)
                amax = fabsf(v[j]) > amax ? fabsf(v[j]) : amax;
            if (!isfinite(amax)) { /* a NaN or an infinity: the outputs say so */
                memset(q, 0, 32);
                qx->d[r * groups + g] = NAN;
                qx->ds[r * groups + g] = NAN;
                continue;
            }
            d = amax / 127.0f;
            id = amax > 0.0f ? 127.0f / amax : 0.0f;
            for (int j = 0; j < 32; j++) {
                long k = lrintf(v[j] * id);
                q[j] = (int8_t)(k > 127 ? 127 : k < -127 ? -127 : k);
                sum += q[j];
            }
            qx->d[r * groups + g] = d;
            qx->ds[r * groups + g] = d * (float)sum;
        }
    }
}

void gang__cpu_qmatmul_rows_ref(size_t m, size_t kdim, const gang__cpu_qx *qx,
                                const gang_kernels_weight *w, size_t o0, size_t o1, float *y,
                                size_t ldy)
{
    size_t e = 0, bb = 0, groups = kdim / 32;
    int8_t q[256];
    float a[16], b[8];

    gang_kernels_wtype_block(w->type, &e, &bb);
    for (size_t o = o0; o < o1; o++) {
        const char *row = (const char *)w->data + o * (kdim / e) * bb;

        for (size_t r = 0; r < m; r++)
            y[r * ldy + o] = 0.0f;
        for (size_t blk = 0; blk < kdim / e; blk++) {
            gang__kw_unpack(w->type, row + blk * bb, q, a, b);
            for (size_t r = 0; r < m; r++) {
                size_t g0 = r * groups + blk * e / 32;
                const int8_t *xq = qx->q + r * kdim + blk * e;
                float acc = 0.0f;

                for (size_t g = 0; g < e / 32; g++) {
                    int32_t s0 = 0, s1 = 0;
                    for (size_t j = 0; j < 16; j++) {
                        s0 += (int32_t)q[32 * g + j] * xq[32 * g + j];
                        s1 += (int32_t)q[32 * g + 16 + j] * xq[32 * g + 16 + j];
                    }
                    acc += qx->d[g0 + g] * (a[2 * g] * (float)s0 + a[2 * g + 1] * (float)s1) +
                           b[g] * qx->ds[g0 + g];
                }
                y[r * ldy + o] += acc;
            }
        }
    }
}

/* One weight of a call. */
typedef struct qmm_part {
    const gang_kernels_weight *w;
    size_t n, per_chunk; /* per_chunk: rows, or groups of 16 rows when repacked */
    float *y;
    gang__cpu_rp rp;
    int rep; /* 1: w is repacked (rp) */
} qmm_part;

/* The weights of a call; weight i's chunks are [c0[i], c0[i + 1]) (gang__cpu_split). */
typedef struct qmm_job {
    size_t m, kdim;
    const gang__cpu_qx *qx;
    qmm_part parts[GANG_KERNELS_MATMUL_N_MAX];
    size_t c0[GANG_KERNELS_MATMUL_N_MAX + 1];
    int simd;
    const int32_t *sx; /* x's half-group sums (the repacked kernels') */
    atomic_int rc;
} qmm_job;

static void qmm_chunk(void *arg, size_t c)
{
    const qmm_job *j = arg;
    size_t i = gang__cpu_part_of(j->c0, c);
    const qmm_part *p = &j->parts[i];
    size_t o0 = (c - j->c0[i]) * p->per_chunk, o1;

    if (p->rep) {
        size_t g1 = o0 + p->per_chunk < p->rp.groups ? o0 + p->per_chunk : p->rp.groups;
        if (j->simd >= 2)
            gang__cpu_rp_rows_avx512(j->m, j->qx, j->sx, &p->rp, o0, g1, p->y, p->n);
        else if (gang__cpu_rp_rows_ref(j->m, j->qx, &p->rp, o0, g1, p->y, p->n) != 0)
            atomic_store(&((qmm_job *)arg)->rc, GANG_ENOMEM); /* any chunk's failure fails */
        return;
    }
    o1 = o0 + p->per_chunk < p->n ? o0 + p->per_chunk : p->n;
    if (j->simd >= 2)
        gang__cpu_qmatmul_rows_avx512(j->m, j->kdim, j->qx, p->w, o0, o1, p->y, p->n);
    else if (j->simd)
        gang__cpu_qmatmul_rows_avx2(j->m, j->kdim, j->qx, p->w, o0, o1, p->y, p->n);
    else
        gang__cpu_qmatmul_rows_ref(j->m, j->kdim, j->qx, p->w, o0, o1, p->y, p->n);
}

void gang__cpu_qx_sums(size_t m, size_t kdim, const gang__cpu_qx *qx, int32_t *sx)
{
    for (size_t h = 0; h < 2 * m * (kdim / 32); h++) {
        int32_t v = 0;
        for (size_t j = 0; j < 16; j++)
            v += qx->q[16 * h + j];
        sx[h] = v;
    }
}

/*
 * The block products of one x against n_parts weights (gang_kernels_matmul validated the
 * sizes: kdim is a whole number of each type's blocks, hence of 32): x is quantized once
 * (and for repacked weights its half-group sums taken once), then every weight's chunks
 * run as one job on the pool (gang__cpu_split: units of 16 rows, a group, for a repacked
 * weight, GANG__QMM_ROWS rows in the file's layout). Each output row is computed exactly
 * as a call with that weight alone would. x's int8 copy is one allocation per call, freed
 * before returning: GANG_ENOMEM when it cannot be had; GANG_EINVAL for a repacked weight
 * viewed with other sizes than it was made with.
 */
int gang__cpu_qmatmul_n(size_t m, size_t kdim, const float *x, size_t n_parts,
                        const gang_kernels_weight *w, const size_t *n, float *const *y)
{
    size_t groups = kdim / 32, chunks, units[GANG_KERNELS_MATMUL_N_MAX],
           upc[GANG_KERNELS_MATMUL_N_MAX];
    unsigned threads = gang__cpu_threads();
    double macs = 0.0;
    char *buf;
    gang__cpu_qx qx;
    qmm_job j = {.m = m, .kdim = kdim, .qx = &qx, .simd = gang__cpu_simd()};
    int any_rep = 0;

    if (n_parts == 0 || n_parts > GANG_KERNELS_MATMUL_N_MAX)
        return GANG_EINVAL;
    for (size_t i = 0; i < n_parts; i++) {
        qmm_part *p = &j.parts[i];
        int rep = gang__cpu_rp_get(&w[i], n[i], kdim, &p->rp);

        if (rep < 0)
            return rep;
        p->w = &w[i];
        p->n = n[i];
        p->y = y[i];
        p->rep = rep;
        any_rep |= rep;
        units[i] = rep ? p->rp.groups : (n[i] + GANG__QMM_ROWS - 1) / GANG__QMM_ROWS;
        macs += (double)m * (double)n[i] * (double)kdim;
    }
    if (macs < GANG__QMM_MIN_MACS)
        threads = 1; /* too small to share: the caller alone */
    buf = malloc(m * kdim + 4 * m * groups * sizeof(float) + 64);
    if (buf == NULL)
        return GANG_ENOMEM;
    qx.d = (float *)(void *)buf;
    qx.ds = qx.d + m * groups;
    qx.q = (int8_t *)(qx.ds + 3 * m * groups);
    j.sx = (const int32_t *)(const void *)(qx.ds + m * groups);
    if (j.simd >= 2)
        gang__cpu_quantize_x_avx512(x, m, kdim, &qx, (int32_t *)(void *)(qx.ds + m * groups));
    else {
        gang__cpu_quantize_x(x, m, kdim, &qx);
        if (any_rep)
            gang__cpu_qx_sums(m, kdim, &qx, (int32_t *)(void *)(qx.ds + m * groups));
    }
    chunks = gang__cpu_split(units, n_parts, threads, GANG__QMM_CHUNKS_PER_THREAD, upc, j.c0);
    for (size_t i = 0; i < n_parts; i++)
        j.parts[i].per_chunk = j.parts[i].rep ? upc[i] : upc[i] * GANG__QMM_ROWS;
    gang__cpu_run(qmm_chunk, &j, chunks, threads);
    free(buf);
    return atomic_load(&j.rc);
}

int gang__cpu_qmatmul(size_t m, size_t n, size_t kdim, const float *x, const gang_kernels_weight *w,
                      float *y)
{
    return gang__cpu_qmatmul_n(m, kdim, x, 1, w, &n, &y);
}
