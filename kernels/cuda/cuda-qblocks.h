/*
 * The CUDA kernels' view of a GGUF block (include/ganglion/kernels.h, "Block types"): one
 * group of 32 consecutive elements of a block dequantized to f32 in registers, the way
 * kernels/cuda/cuda-qmatmul.cu reads weights. Written once for both sides: nvcc compiles
 * the functions for the device (__host__ __device__) and a C compiler compiles the same
 * text for the host, so that tests/unit/test-cuda-qblocks.c holds them to the formats'
 * reference (gang_kernels_block_dequant, kernels/weight-blocks.c) on a machine without a
 * GPU. Plain C99 that is also C++: no CUDA header, no library call but memcpy.
 *
 * Group g of a block (g < E / 32) is its elements [32 g, 32 g + 32). Every value is the
 * reference's expression a q + b evaluated in the same order (a = d s, b = -dmin m), so
 * on the host the results are equal bit for bit; nvcc may contract a q + b into one fused
 * multiply-add on the device, which differs by at most half an ulp of a q + b.
 */
#ifndef GANGLION_CUDA_QBLOCKS_H
#define GANGLION_CUDA_QBLOCKS_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#if defined(__CUDACC__)
#define GANG_QB_FN __host__ __device__ static inline
#else
#define GANG_QB_FN static inline
#endif
#if defined(__CUDA_ARCH__) /* the device pass: the host compiler does not know the pragma */
#define GANG_QB_UNROLL _Pragma("unroll")
#else
#define GANG_QB_UNROLL
#endif

/* Block types as plain ints, equal to gang_kernels_wtype (the kernels are templates over
 * them, and this file must not depend on the public header's enum in device code). */
#define GANG_QB_Q8_0 4
#define GANG_QB_Q4_0 5
#define GANG_QB_Q4_1 6
#define GANG_QB_Q5_0 7
#define GANG_QB_Q5_1 8
#define GANG_QB_Q4_K 9
#define GANG_QB_Q5_K 10
#define GANG_QB_Q6_K 11
#define GANG_QB_IQ4_NL 12
#define GANG_QB_IQ4_XS 13

/* Elements and bytes of one block of type t (0 for another t). */
GANG_QB_FN int gang_qb_elems(int t)
{
    return (t >= GANG_QB_Q4_K && t <= GANG_QB_Q6_K) || t == GANG_QB_IQ4_XS
               ? 256
               : ((t >= GANG_QB_Q8_0 && t <= GANG_QB_Q5_1) || t == GANG_QB_IQ4_NL ? 32 : 0);
}

GANG_QB_FN int gang_qb_bytes(int t)
{
    switch (t) {
    case GANG_QB_Q8_0:
        return 34;
    case GANG_QB_Q4_0:
        return 18;
    case GANG_QB_Q4_1:
        return 20;
    case GANG_QB_Q5_0:
        return 22;
    case GANG_QB_Q5_1:
        return 24;
    case GANG_QB_Q4_K:
        return 144;
    case GANG_QB_Q5_K:
        return 176;
    case GANG_QB_Q6_K:
        return 210;
    case GANG_QB_IQ4_NL:
        return 18;
    case GANG_QB_IQ4_XS:
        return 136;
    default:
        return 0;
    }
}

/* The IEEE half at p (little-endian, any alignment) as f32, exactly: normal, subnormal,
 * zero, infinity and NaN alike (the same values as gang_f16_to_f32). */
GANG_QB_FN float gang_qb_half(const uint8_t *p)
{
    uint32_t h = (uint32_t)p[0] | (uint32_t)p[1] << 8;
    uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu, bits;
    float v;

    if (exp == 0) {
        /* zero or subnormal: mant x 2^-24, exact in f32 */
        v = (float)mant * 5.9604644775390625e-8f;
        return sign != 0 ? -v : v;
    }
    if (exp == 31)
        bits = sign | 0x7f800000u | (mant << 13);
    else
        bits = sign | ((exp + 112u) << 23) | (mant << 13);
    memcpy(&v, &bits, sizeof(v));
    return v;
}

/* The 6-bit scale and min of group i of a Q4_K / Q5_K block's scales[12] (the packing of
 * kernels/weight-blocks.c). */
GANG_QB_FN void gang_qb_k_scale_min(const uint8_t *s, int i, int *sc, int *mn)
{
    if (i < 4) {
        *sc = s[i] & 63;
        *mn = s[i + 4] & 63;
    } else {
        *sc = (s[i + 4] & 0x0f) | ((s[i - 4] >> 6) << 4);
        *mn = (s[i + 4] >> 4) | ((s[i] >> 6) << 4);
    }
}

/* The 32-element types: their one group. */
GANG_QB_FN void gang_qb_group_small(int t, const uint8_t *p, float w[32])
{
    int has_min = t == GANG_QB_Q4_1 || t == GANG_QB_Q5_1;
    int has_hi = t == GANG_QB_Q5_0 || t == GANG_QB_Q5_1;
    int off = has_min ? 0 : (has_hi ? 16 : 8);
    const uint8_t *qs = p + 2 + (has_min ? 2 : 0) + (has_hi ? 4 : 0);
    float d = gang_qb_half(p), m = has_min ? gang_qb_half(p + 2) : 0.0f;
    uint32_t qh = 0;

    if (has_hi) {
        const uint8_t *h = p + 2 + (has_min ? 2 : 0);
        qh = (uint32_t)h[0] | (uint32_t)h[1] << 8 | (uint32_t)h[2] << 16 | (uint32_t)h[3] << 24;
    }
    GANG_QB_UNROLL
    for (int j = 0; j < 16; j++) {
        int lo = (qs[j] & 0x0f) | (int)((qh >> j) & 1u) << 4;
        int hi = (qs[j] >> 4) | (int)((qh >> (j + 16)) & 1u) << 4;
        w[j] = d * (float)(lo - off) + m;
        w[j + 16] = d * (float)(hi - off) + m;
    }
}

/* The IQ4 types' group of 32 codes at qs (element j < 16 the low nibble of byte j, j + 16
 * its high nibble) as a T[code] + 0 (T: kernels/weight-blocks.c's table). */
GANG_QB_FN void gang_qb_group_iq4(const uint8_t *qs, float a, float w[32])
{
    const signed char tbl[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                 1,    13,   25,  38,  53,  69,  89,  113};

    GANG_QB_UNROLL
    for (int j = 0; j < 16; j++) {
        w[j] = a * (float)tbl[qs[j] & 0x0f] + 0.0f;
        w[j + 16] = a * (float)tbl[qs[j] >> 4] + 0.0f;
    }
}

/* Elements [32 g, 32 g + 32) of the block of type t at p into w[32]. */
GANG_QB_FN void gang_qb_group(int t, const uint8_t *p, int g, float w[32])
{
    if (t == GANG_QB_IQ4_NL) {
        gang_qb_group_iq4(p + 2, gang_qb_half(p), w);
    } else if (t == GANG_QB_IQ4_XS) {
        unsigned h = (unsigned)p[2] | (unsigned)p[3] << 8;
        int s = ((p[4 + g / 2] >> (4 * (g % 2))) & 0x0f) | (int)((h >> (2 * g)) & 3u) << 4;

        gang_qb_group_iq4(p + 8 + 16 * g, gang_qb_half(p) * (float)(s - 32), w);
    } else if (t == GANG_QB_Q8_0) {
        float d = gang_qb_half(p);
        GANG_QB_UNROLL
        for (int l = 0; l < 32; l++)
            w[l] = d * (float)(int8_t)p[2 + l] + 0.0f;
    } else if (t == GANG_QB_Q4_K || t == GANG_QB_Q5_K) {
        float d = gang_qb_half(p), dmin = gang_qb_half(p + 2);
        const uint8_t *qh = p + 16, *src = p + (t == GANG_QB_Q5_K ? 48 : 16) + (g / 2) * 32;
        int s, mn, shift = (g & 1) * 4;
        float a, b;

        gang_qb_k_scale_min(p + 4, g, &s, &mn);
        a = d * (float)s;
        b = -dmin * (float)mn;
        GANG_QB_UNROLL
        for (int l = 0; l < 32; l++) {
            int v = (src[l] >> shift) & 0x0f;
            if (t == GANG_QB_Q5_K)
                v |= ((qh[l] >> g) & 1) << 4;
            w[l] = a * (float)v + b;
        }
    } else if (t == GANG_QB_Q6_K) {
        int half = g / 4, gg = g % 4;
        const uint8_t *ql = p + 64 * half + (gg & 1) * 32, *qh = p + 128 + 32 * half;
        float d = gang_qb_half(p + 208);
        float a0 = d * (float)(int8_t)p[192 + 2 * g], a1 = d * (float)(int8_t)p[193 + 2 * g];
        int shift = (gg >> 1) * 4;

        GANG_QB_UNROLL
        for (int l = 0; l < 32; l++) {
            int lo = (ql[l] >> shift) & 0x0f, hi = (qh[l] >> (2 * gg)) & 3;
            w[l] = (l < 16 ? a0 : a1) * (float)((lo | (hi << 4)) - 32) + 0.0f;
        }
    } else {
        gang_qb_group_small(t, p, w);
    }
}

/* Element e0's group (e0 a multiple of 32) of a row of blocks of type t. */
GANG_QB_FN void gang_qb_group_at(int t, const uint8_t *row, size_t e0, float w[32])
{
    const size_t e = (size_t)gang_qb_elems(t);

    gang_qb_group(t, row + e0 / e * (size_t)gang_qb_bytes(t), (int)(e0 % e / 32), w);
}

/* Bytes of one row of kdim elements of type t. */
GANG_QB_FN size_t gang_qb_row_bytes(int t, size_t kdim)
{
    return kdim / (size_t)gang_qb_elems(t) * (size_t)gang_qb_bytes(t);
}

/*
 * The GEMV's staged x (cuda-qmatmul.cu): element e of a tile row lives at GANG_QB_PAD(e),
 * one float of padding per 32, so that 32 lanes reading element l of 32 consecutive groups
 * hit 32 different shared-memory banks.
 */
#define GANG_QB_PAD(e) ((e) + (e) / 32)
#define GANG_QB_ROWS 8 /* the most rows of x the GEMV takes */

/*
 * One lane's share of the GEMV over one tile: the groups lane, lane + 32, ... of the tile
 * [k0, k0 + kt) of a weight row (kt a multiple of 32), each dequantized into registers and
 * multiplied with the m (<= GANG_QB_ROWS) staged rows of x (row r at xs + r * stride, in
 * GANG_QB_PAD layout), added to acc[r]. The loops run to the constant GANG_QB_ROWS so that
 * acc stays in registers on the device.
 */
GANG_QB_FN void gang_qb_gemv_lane(int t, const uint8_t *row, size_t k0, size_t kt, const float *xs,
                                  size_t stride, size_t m, int lane, float acc[GANG_QB_ROWS])
{
    for (size_t gi = (size_t)lane; gi < kt / 32; gi += 32) {
        float wv[32];

        gang_qb_group_at(t, row, k0 + gi * 32, wv);
        for (int r = 0; r < GANG_QB_ROWS; r++) {
            const float *xr = xs + (size_t)r * stride + GANG_QB_PAD(gi * 32);
            float s = 0.0f;

            if ((size_t)r >= m)
                break;
            GANG_QB_UNROLL
            for (int l = 0; l < 32; l++)
                s += xr[l] * wv[l];
            acc[r] += s;
        }
    }
}

/* Group g of the whole weight [n, kdim] (g < n kdim / 32, row-major): its row and first
 * element, and its 32 values (the bf16 dequantization's and the embedding's thread body). */
GANG_QB_FN void gang_qb_group_of(int t, const uint8_t *w, size_t kdim, size_t g, size_t *r,
                                 size_t *e0, float wv[32])
{
    *r = g / (kdim / 32);
    *e0 = g % (kdim / 32) * 32;
    gang_qb_group_at(t, w + *r * gang_qb_row_bytes(t, kdim), *e0, wv);
}

#endif /* GANGLION_CUDA_QBLOCKS_H */
