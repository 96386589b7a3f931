/*
 * CPU backend: the row-interleaved ("repacked") layout of the block types that the AVX-512
 * VNNI kernels of cpu-qrepack-avx512.c and cpu-qrepack-k-avx512.c stream, built once at
 * load by gang_kernels_block_repack (include/ganglion/kernels.h). Below, the 32-element
 * types (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL: laid out as Q4_0, its codes the table's
 * indices); the 256-element types (Q4_K, Q5_K, Q6_K, IQ4_XS) share the header, the groups
 * and the column blocks' order, their column blocks' inside is cpu-qrepack-k.c's.
 *
 * A repacked weight is one allocation: a 64-byte header (magic, type, n, kdim), then the
 * body. The body is ceil(n / 16) groups of 16 W rows (the last one padded with zero rows),
 * each group kdim / 32 column blocks one after the other, and a column block holds block
 * b of the group's 16 rows, laid out for vpdpbusd with one int32 lane per row:
 *   d     16 x f16, the rows' scales, as one vector (32 bytes);
 *   m     16 x f16, the rows' minimums (Q4_1, Q5_1 only; 32 bytes);
 *   h     8 x 64-bit masks (Q5_0, Q5_1 only; 64 bytes): bit 4 r + i of mask s is the fifth
 *         bit of element 4 s + i of row r;
 *   codes Q4 / Q5: 4 vectors of 64 bytes, vector j holding bytes 4 j .. 4 j + 3 of each row's
 *         16 nibble bytes at lane r (low nibbles: elements 4 j + i, high: 16 + 4 j + i);
 *         Q8_0: 8 vectors, vector s holding elements 4 s .. 4 s + 3 of each row as
 *         unsigned bytes (the int8 plus 128).
 * So a column block is exactly 16 blocks' bytes (Q4_0 288 = 16 x 18, ... Q8_0 544 = 16 x 34)
 * and a group's blocks are contiguous: the kernel streams each group once, its scales one
 * vector per block, and never reduces across lanes. The repack is lossless:
 * gang__cpu_rp_block gives back a row's original block bytes (the portable levels and the
 * embedding lookup read a repacked weight through it).
 */
#include <stdlib.h>
#include <string.h>

#include "cpu.h"

#define RP_MAGIC 0x31504b5250474e47ull /* "GNGRPKP1" */

typedef struct rp_header {
    uint64_t magic;
    uint64_t type;
    uint64_t n;
    uint64_t kdim;
    uint64_t self_check; /* magic ^ n ^ kdim ^ type: a second word a stale buffer would fail */
    uint64_t pad[3];
} rp_header;

_Static_assert(sizeof(rp_header) == GANG__RP_HEADER, "the header is one cache line");

int gang__cpu_rp_type(gang_kernels_wtype t)
{
    return t == GANG_KW_Q8_0 || t == GANG_KW_Q4_0 || t == GANG_KW_Q4_1 || t == GANG_KW_Q5_0 ||
           t == GANG_KW_Q5_1 || t == GANG_KW_IQ4_NL || gang__cpu_rpk_cb(t) != 0;
}

/* The bytes of a column block of type t: 16 blocks', plus the K types' unpacked scales. */
static size_t rp_cb(gang_kernels_wtype t)
{
    size_t bb = 0;

    if (gang__cpu_rpk_cb(t) != 0)
        return gang__cpu_rpk_cb(t);
    gang_kernels_wtype_block(t, NULL, &bb);
    return GANG__RP_ROWS * bb;
}

/* The elements of a block of type t (32 or 256). */
static size_t rp_elems(gang_kernels_wtype t)
{
    size_t e = 0;

    gang_kernels_wtype_block(t, &e, NULL);
    return e;
}

/* Byte offsets of a column block's parts for type t. */
static void rp_parts(gang_kernels_wtype t, size_t *m_at, size_t *h_at, size_t *q_at)
{
    int with_m = t == GANG_KW_Q4_1 || t == GANG_KW_Q5_1;
    int five = t == GANG_KW_Q5_0 || t == GANG_KW_Q5_1;

    *m_at = 32;
    *h_at = 32 + 32 * (size_t)with_m;
    *q_at = *h_at + 64 * (size_t)five;
}

int gang__cpu_rp_peek(const gang_kernels_weight *w, gang__cpu_rp *out)
{
    rp_header h;

    if (!gang__cpu_rp_type(w->type) || w->data == NULL)
        return 0;
    memcpy(&h, w->data, sizeof(h));
    if (h.magic != RP_MAGIC || h.self_check != (RP_MAGIC ^ h.n ^ h.kdim ^ h.type) ||
        h.type != (uint64_t)w->type || h.kdim == 0 || h.kdim % rp_elems(w->type) != 0)
        return 0;
    return gang__cpu_rp_get(w, (size_t)h.n, (size_t)h.kdim, out);
}

int gang__cpu_rp_embedding(const gang__cpu_rp *rp, size_t dim, const int32_t *ids, size_t n_ids,
                           float *out)
{
    size_t e = rp_elems(rp->type);
    uint8_t blk[256];

    if (dim != rp->kdim)
        return GANG_EINVAL;
    for (size_t t = 0; t < n_ids; t++) {
        if (ids[t] < 0 || (size_t)ids[t] >= rp->n)
            return GANG_EINVAL;
        for (size_t b = 0; b < rp->nb; b++) {
            gang__cpu_rp_block(rp, (size_t)ids[t], b, blk);
            int rc = gang_kernels_block_dequant(rp->type, blk, e, out + t * dim + e * b);
            if (rc != 0)
                return rc;
        }
    }
    return 0;
}

int gang__cpu_rp_get(const gang_kernels_weight *w, size_t n, size_t kdim, gang__cpu_rp *out)
{
    rp_header h;

    if (!gang__cpu_rp_type(w->type))
        return 0;
    memcpy(&h, w->data, sizeof(h));
    if (h.magic != RP_MAGIC || h.self_check != (RP_MAGIC ^ h.n ^ h.kdim ^ h.type))
        return 0;
    if (h.type != (uint64_t)w->type || h.n != n || h.kdim != kdim)
        return GANG_EINVAL; /* a repacked weight viewed with other sizes */
    out->type = w->type;
    out->n = n;
    out->kdim = kdim;
    out->groups = (n + GANG__RP_ROWS - 1) / GANG__RP_ROWS;
    out->nb = kdim / rp_elems(w->type);
    out->cb = rp_cb(w->type);
    out->body = (const uint8_t *)w->data + GANG__RP_HEADER;
    return 1;
}

/* Puts block p (one row's, original layout) at lane r of column block c. */
static void rp_put(gang_kernels_wtype t, const uint8_t *p, size_t r, uint8_t *c)
{
    size_t m_at, h_at, q_at;
    int with_m = t == GANG_KW_Q4_1 || t == GANG_KW_Q5_1;
    int five = t == GANG_KW_Q5_0 || t == GANG_KW_Q5_1;
    const uint8_t *qs = p + 2 + 2 * with_m + 4 * five;
    uint64_t mask;
    uint32_t qh = 0;

    if (gang__cpu_rpk_cb(t) != 0) {
        gang__cpu_rpk_put(t, p, r, c);
        return;
    }
    rp_parts(t, &m_at, &h_at, &q_at);
    memcpy(c + 2 * r, p, 2);
    if (with_m)
        memcpy(c + m_at + 2 * r, p + 2, 2);
    if (t == GANG_KW_Q8_0) {
        for (size_t s = 0; s < 8; s++)
            for (size_t i = 0; i < 4; i++)
                c[q_at + 64 * s + 4 * r + i] = (uint8_t)(p[2 + 4 * s + i] ^ 0x80u);
        return;
    }
    for (size_t j = 0; j < 4; j++)
        memcpy(c + q_at + 64 * j + 4 * r, qs + 4 * j, 4);
    if (!five)
        return;
    memcpy(&qh, p + 2 + 2 * with_m, 4);
    for (size_t s = 0; s < 8; s++) {
        memcpy(&mask, c + h_at + 8 * s, 8);
        mask |= (uint64_t)((qh >> (4 * s)) & 0xfu) << (4 * r);
        memcpy(c + h_at + 8 * s, &mask, 8);
    }
}

void gang__cpu_rp_block(const gang__cpu_rp *rp, size_t row, size_t blk, uint8_t *out)
{
    gang_kernels_wtype t = rp->type;
    const uint8_t *c = rp->body + ((row / GANG__RP_ROWS) * rp->nb + blk) * rp->cb;
    size_t r = row % GANG__RP_ROWS, m_at, h_at, q_at;
    int with_m = t == GANG_KW_Q4_1 || t == GANG_KW_Q5_1;
    int five = t == GANG_KW_Q5_0 || t == GANG_KW_Q5_1;
    uint8_t *qs = out + 2 + 2 * with_m + 4 * five;
    uint32_t qh = 0;
    uint64_t mask;

    if (gang__cpu_rpk_cb(t) != 0) {
        gang__cpu_rpk_block(t, c, r, out);
        return;
    }
    rp_parts(t, &m_at, &h_at, &q_at);
    memcpy(out, c + 2 * r, 2);
    if (with_m)
        memcpy(out + 2, c + m_at + 2 * r, 2);
    if (t == GANG_KW_Q8_0) {
        for (size_t s = 0; s < 8; s++)
            for (size_t i = 0; i < 4; i++)
                out[2 + 4 * s + i] = (uint8_t)(c[q_at + 64 * s + 4 * r + i] ^ 0x80u);
        return;
    }
    for (size_t j = 0; j < 4; j++)
        memcpy(qs + 4 * j, c + q_at + 64 * j + 4 * r, 4);
    if (!five)
        return;
    for (size_t s = 0; s < 8; s++) {
        memcpy(&mask, c + h_at + 8 * s, 8);
        qh |= (uint32_t)((mask >> (4 * r)) & 0xfu) << (4 * s);
    }
    memcpy(out + 2 + 2 * with_m, &qh, 4);
}

void *gang__cpu_rp_build(gang_kernels_wtype t, const void *src, size_t n, size_t kdim,
                         gang_kernels_arena *arena)
{
    size_t bb = 0, e = 0, nb, groups = (n + GANG__RP_ROWS - 1) / GANG__RP_ROWS, cb, body;
    rp_header h = {.magic = RP_MAGIC, .type = (uint64_t)t, .n = n, .kdim = kdim};
    uint8_t *dst;

    if (!gang__cpu_rp_type(t) || !gang_kernels_wtype_block(t, &e, &bb) || src == NULL || n == 0 ||
        kdim == 0 || kdim % e != 0)
        return NULL;
    nb = kdim / e;
    cb = rp_cb(t);
    if (groups > (SIZE_MAX - GANG__RP_HEADER) / cb / nb)
        return NULL;
    body = groups * nb * cb;
    dst = arena != NULL ? gang_kernels_arena_alloc(arena, GANG__RP_HEADER + body)
                        : gang_kernels_weight_host_alloc(GANG__RP_HEADER + body);
    if (dst == NULL)
        return NULL;
    h.self_check = RP_MAGIC ^ h.n ^ h.kdim ^ h.type;
    memcpy(dst, &h, sizeof(h));
    memset(dst + GANG__RP_HEADER, 0, body); /* the padding rows: zero scales and codes */
    for (size_t g = 0; g < groups; g++)
        for (size_t b = 0; b < nb; b++) {
            uint8_t *c = dst + GANG__RP_HEADER + (g * nb + b) * cb;
            for (size_t r = 0; r < GANG__RP_ROWS && g * GANG__RP_ROWS + r < n; r++)
                rp_put(t, (const uint8_t *)src + ((g * GANG__RP_ROWS + r) * nb + b) * bb, r, c);
        }
    return dst;
}

/*
 * Groups [g0, g1) of a repacked weight against every row of x at the portable level: each
 * row's original blocks rebuilt (gang__cpu_rp_block), then the reference kernel, so the
 * results are the reference's to the bit. Slow (a copy per row); the repack is made only
 * where the AVX-512 kernel runs, so this serves a level forced down (tests) after it.
 */
int gang__cpu_rp_rows_ref(size_t m, const gang__cpu_qx *qx, const gang__cpu_rp *rp, size_t g0,
                          size_t g1, float *y, size_t ldy)
{
    size_t bb = 0;
    uint8_t *row;

    gang_kernels_wtype_block(rp->type, NULL, &bb);
    row = malloc(rp->nb * bb);
    if (row == NULL)
        return GANG_ENOMEM;
    for (size_t o = g0 * GANG__RP_ROWS; o < g1 * GANG__RP_ROWS && o < rp->n; o++) {
        gang_kernels_weight v = {.type = rp->type, .data = row, .scales = NULL};
        for (size_t b = 0; b < rp->nb; b++)
            gang__cpu_rp_block(rp, o, b, row + b * bb);
        gang__cpu_qmatmul_rows_ref(m, rp->kdim, qx, &v, 0, 1, y + o, ldy);
    }
    free(row);
    return 0;
}

void *gang_kernels_block_repack(gang_kernels_wtype t, const void *src, size_t n, size_t kdim,
                                gang_kernels_arena *arena)
{
    if (gang__cpu_simd() < 2 || !gang__cpu_rp_usable())
        return NULL;
    return gang__cpu_rp_build(t, src, n, kdim, arena);
}
