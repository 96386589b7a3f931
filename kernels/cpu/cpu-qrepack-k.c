/*
 * CPU backend: the repacked layout of the 256-element block types (Q4_K, Q5_K, Q6_K,
 * IQ4_XS), the column blocks cpu-qrepack.c's header and groups hold for them
 * (cpu-qrepack-k-avx512.c is their kernel). As for the 32-element types a column block is
 * block b of 16 W rows, one int32 lane per row, but the 6-bit scales and minimums are
 * unpacked to bytes here once, so that the kernel widens them with one instruction:
 *
 *   Q4_K / Q5_K (2368 / 2880 bytes: 16 blocks' bytes plus 4 per row of unpacked scales)
 *     d     16 x f16 (32 bytes), then dmin 16 x f16 (32 bytes);
 *     sc    8 x 16 bytes: byte 16 i + r is the 6-bit scale of group i of row r;
 *     mn    8 x 16 bytes: the same for the minimums;
 *     qh    Q5_K only, 8 vectors: vector j holds bytes 4 j .. 4 j + 3 of row r's qh[32]
 *           at lane r (bit i of byte l: the fifth bit of element l of group i);
 *     codes 32 vectors: vector v holds bytes 4 v .. 4 v + 3 of row r's qs[128] at lane r
 *           (vector 8 k + j: the low nibbles elements 4 j .. 4 j + 3 of group 2 k, the
 *           high nibbles those of group 2 k + 1).
 *   Q6_K (3360 bytes = 16 x 210)
 *     d     16 x f16 (32 bytes);
 *     sc    16 x 16 int8: byte 16 i + r is the scale of sixteen i of row r;
 *     ql    32 vectors, vector v bytes 4 v .. 4 v + 3 of row r's ql[128] at lane r;
 *     qh    16 vectors, vector v bytes 4 v .. 4 v + 3 of row r's qh[64] at lane r.
 *   IQ4_XS (2208 bytes: 16 blocks' bytes plus 2 per row of unpacked scales)
 *     d     16 x f16 (32 bytes);
 *     sc    8 x 16 int8: byte 16 i + r is s - 32 of group i of row r (the 6-bit s of
 *           scales_l / scales_h, kernels/weight-blocks.c);
 *     codes 32 vectors: vector v bytes 4 v .. 4 v + 3 of row r's qs[128] at lane r
 *           (vectors 4 i .. 4 i + 3: group i, laid out as a Q4_0 block's).
 *
 * The unpacking is a bijection (8 scales and 8 minimums of 6 bits are the 96 bits of
 * scales[12]; IQ4_XS's 8 scales of 6 bits the 48 of scales_h and scales_l), so each row's
 * block is given back to the byte (gang__cpu_rpk_block).
 */
#include <string.h>

#include "../kernels-blocks.h"
#include "cpu.h"
#include "cpu-qrepack-k.h"

size_t gang__cpu_rpk_cb(gang_kernels_wtype t)
{
    switch (t) {
    case GANG_KW_Q4_K:
        return 2368;
    case GANG_KW_Q5_K:
        return 2880;
    case GANG_KW_Q6_K:
        return 3360;
    case GANG_KW_IQ4_XS:
        return 2208;
    default:
        return 0;
    }
}

/* len bytes of a row (len a multiple of 4) put as len / 4 vectors at lane r of dst. */
static void rpk_spread(const uint8_t *src, size_t len, size_t r, uint8_t *dst)
{
    for (size_t v = 0; v < len / 4; v++)
        memcpy(dst + 64 * v + 4 * r, src + 4 * v, 4);
}

/* The inverse of rpk_spread. */
static void rpk_gather(const uint8_t *src, size_t len, size_t r, uint8_t *dst)
{
    for (size_t v = 0; v < len / 4; v++)
        memcpy(dst + 4 * v, src + 64 * v + 4 * r, 4);
}

/* IQ4_XS: block p's d, scales and codes at lane r of column block c. */
static void rpk_iq4xs_put(const uint8_t *p, size_t r, uint8_t *c)
{
    memcpy(c + 2 * r, p, 2);
    for (int i = 0; i < 8; i++)
        c[RPKX_SC + 16 * i + r] = (uint8_t)(int8_t)gang__kw_iq4xs_scale(p, i);
    rpk_spread(p + 8, 128, r, c + RPKX_Q);
}

/* The inverse of rpk_iq4xs_put. */
static void rpk_iq4xs_block(const uint8_t *c, size_t r, uint8_t *out)
{
    unsigned h = 0;

    memcpy(out, c + 2 * r, 2);
    memset(out + 4, 0, 4);
    for (size_t i = 0; i < 8; i++) {
        unsigned sc = (unsigned)((int)(int8_t)c[RPKX_SC + 16 * i + r] + 32);
        out[4 + i / 2] |= (uint8_t)((sc & 0x0fu) << (4 * (i % 2)));
        h |= (sc >> 4) << (2 * i);
    }
    out[2] = (uint8_t)(h & 0xffu);
    out[3] = (uint8_t)(h >> 8);
    rpk_gather(c + RPKX_Q, 128, r, out + 8);
}

void gang__cpu_rpk_put(gang_kernels_wtype t, const uint8_t *p, size_t r, uint8_t *c)
{
    const uint8_t *s = p + 4;

    if (t == GANG_KW_IQ4_XS) {
        rpk_iq4xs_put(p, r, c);
        return;
    }
    if (t == GANG_KW_Q6_K) {
        memcpy(c + 2 * r, p + 208, 2);
        for (size_t i = 0; i < 16; i++)
            c[RPK6_SC + 16 * i + r] = p[192 + i];
        rpk_spread(p, 128, r, c + RPK6_QL);
        rpk_spread(p + 128, 64, r, c + RPK6_QH);
        return;
    }
    memcpy(c + 2 * r, p, 2);
    memcpy(c + 32 + 2 * r, p + 2, 2);
    for (size_t i = 0; i < 4; i++) { /* as weight-blocks.c's kw_k_scale_min */
        c[RPK_SC + 16 * i + r] = s[i] & 63;
        c[RPK_MN + 16 * i + r] = s[i + 4] & 63;
        c[RPK_SC + 16 * (i + 4) + r] = (uint8_t)((s[i + 8] & 0x0f) | ((s[i] >> 6) << 4));
        c[RPK_MN + 16 * (i + 4) + r] = (uint8_t)((s[i + 8] >> 4) | ((s[i + 4] >> 6) << 4));
    }
    if (t == GANG_KW_Q5_K) {
        rpk_spread(p + 16, 32, r, c + RPK_QH5);
        rpk_spread(p + 48, 128, r, c + RPK_Q5);
    } else {
        rpk_spread(p + 16, 128, r, c + RPK_Q4);
    }
}

void gang__cpu_rpk_block(gang_kernels_wtype t, const uint8_t *c, size_t r, uint8_t *out)
{
    uint8_t *s = out + 4;

    if (t == GANG_KW_IQ4_XS) {
        rpk_iq4xs_block(c, r, out);
        return;
    }
    if (t == GANG_KW_Q6_K) {
        memcpy(out + 208, c + 2 * r, 2);
        for (size_t i = 0; i < 16; i++)
            out[192 + i] = c[RPK6_SC + 16 * i + r];
        rpk_gather(c + RPK6_QL, 128, r, out);
        rpk_gather(c + RPK6_QH, 64, r, out + 128);
        return;
    }
    memcpy(out, c + 2 * r, 2);
    memcpy(out + 2, c + 32 + 2 * r, 2);
    for (size_t i = 0; i < 4; i++) {
        unsigned sc = c[RPK_SC + 16 * i + r], mn = c[RPK_MN + 16 * i + r];
        unsigned sc4 = c[RPK_SC + 16 * (i + 4) + r], mn4 = c[RPK_MN + 16 * (i + 4) + r];
        s[i] = (uint8_t)((sc & 63) | ((sc4 >> 4) << 6));
        s[i + 4] = (uint8_t)((mn & 63) | ((mn4 >> 4) << 6));
        s[i + 8] = (uint8_t)((sc4 & 0x0f) | ((mn4 & 0x0f) << 4));
    }
    if (t == GANG_KW_Q5_K) {
        rpk_gather(c + RPK_QH5, 32, r, out + 16);
        rpk_gather(c + RPK_Q5, 128, r, out + 48);
    } else {
        rpk_gather(c + RPK_Q4, 128, r, out + 16);
    }
}
