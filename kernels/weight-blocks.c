/*
 * Block weights (include/ganglion/kernels.h, "Block types"): the GGUF quantization blocks
 * a weight keeps as they lie in its file, their sizes and their dequantization, written
 * from the format's description. Little-endian; d, m and dmin are IEEE halves:
 *
 *   Q8_0  32 elements, 34 bytes: d | int8 q[32]                    w = d q
 *   Q4_0  32 elements, 18 bytes: d | u8 qs[16]                     w = d (nibble - 8)
 *   Q4_1  32 elements, 20 bytes: d | m | u8 qs[16]                 w = d nibble + m
 *   Q5_0  32 elements, 22 bytes: d | u32 qh | u8 qs[16]            w = d (5 bits - 16)
 *   Q5_1  32 elements, 24 bytes: d | m | u32 qh | u8 qs[16]        w = d (5 bits) + m
 *     element j < 16 is the low nibble of qs[j], element j + 16 its high nibble; the
 *     fifth bit of element j is bit j of qh.
 *   Q4_K 256 elements, 144 bytes: d | dmin | scales[12] | qs[128]
 *   Q5_K 256 elements, 176 bytes: d | dmin | scales[12] | qh[32] | qs[128]
 *     eight groups of 32, group i with a 6-bit scale s_i and min m_i packed in
 *     scales[12] (kw_k_scale_min); w = d s_i q - dmin m_i. Groups 2k and 2k + 1 are the
 *     low and high nibbles of qs[32k .. 32k + 32); Q5_K's fifth bit of element l of
 *     group i is bit i of qh[l].
 *   Q6_K 256 elements, 210 bytes: ql[128] | qh[64] | int8 scales[16] | d
 *     16 groups of 16 with one scale each, w = d scale (6 bits - 32); two halves of 128,
 *     each with 64 ql bytes and 32 qh bytes: element 32g + l (g < 4, l < 32) of a half
 *     has its low four bits in ql[32 (g & 1) + l] (the high nibble when g >= 2) and its
 *     top two bits at bit 2g of qh[l].
 *   IQ4_NL 32 elements, 18 bytes: d | u8 qs[16]                    w = d T[nibble]
 *   IQ4_XS 256 elements, 136 bytes: d | u16 scales_h | u8 scales_l[4] | qs[128]
 *     eight groups of 32, group i with the 6-bit scale s_i = nibble i of scales_l (low
 *     nibble first) | bits 2i, 2i + 1 of scales_h as its top two, w = d (s_i - 32)
 *     T[nibble], the nibbles of group i in qs[16 i .. 16 i + 16) as in Q4_0.
 *     T is the fixed non-linear table of the IQ4 types (gang__kw_iq4_values).
 *
 * The CPU products (kernels/cpu/cpu-qmatmul*.c) see every type the same way: a block is
 * groups of 32 signed 8-bit values q with two scales a (one per 16 elements) and one
 * offset b per group, w = a q + b (gang__kw_unpack).
 */
#include <string.h>

#include "ganglion/kernels.h"
#include "kernels-blocks.h"

static const struct {
    size_t elems, bytes;
} kw_blocks[GANG_KW_LAST + 1] = {
    [GANG_KW_Q8_0] = {32, 34},     [GANG_KW_Q4_0] = {32, 18},   [GANG_KW_Q4_1] = {32, 20},
    [GANG_KW_Q5_0] = {32, 22},     [GANG_KW_Q5_1] = {32, 24},   [GANG_KW_Q4_K] = {256, 144},
    [GANG_KW_Q5_K] = {256, 176},   [GANG_KW_Q6_K] = {256, 210}, [GANG_KW_IQ4_NL] = {32, 18},
    [GANG_KW_IQ4_XS] = {256, 136},
};

/* The IQ4 types' sixteen values, one per 4-bit code (the format's definition). */
const int8_t gang__kw_iq4_values[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                        1,    13,   25,  38,  53,  69,  89,  113};

int gang_kernels_wtype_block(gang_kernels_wtype t, size_t *elems, size_t *bytes)
{
    if ((unsigned)t > GANG_KW_LAST || kw_blocks[t].elems == 0)
        return 0;
    if (elems != NULL)
        *elems = kw_blocks[t].elems;
    if (bytes != NULL)
        *bytes = kw_blocks[t].bytes;
    return 1;
}

static float kw_f16(const uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
    return gang_f16_to_f32(h);
}

/* The 6-bit scale and min of group i of a Q4_K / Q5_K block's scales[12]: groups 0-3
 * take the low six bits of bytes i and i + 4; groups 4-7 the nibbles of byte i + 4 with
 * the top two bits of bytes i - 4 (scale) and i (min). */
static void kw_k_scale_min(const uint8_t *s, int i, int *sc, int *mn)
{
    if (i < 4) {
        *sc = s[i] & 63;
        *mn = s[i + 4] & 63;
    } else {
        *sc = (s[i + 4] & 0x0f) | ((s[i - 4] >> 6) << 4);
        *mn = (s[i + 4] >> 4) | ((s[i] >> 6) << 4);
    }
}

/* The 32-element blocks: q, a and b of their one group. */
static void kw_unpack_small(gang_kernels_wtype t, const uint8_t *p, int8_t *q, float *a, float *b)
{
    int has_min = t == GANG_KW_Q4_1 || t == GANG_KW_Q5_1;
    int has_hi = t == GANG_KW_Q5_0 || t == GANG_KW_Q5_1;
    int off = has_min ? 0 : (has_hi ? 16 : 8);
    const uint8_t *qs = p + 2 + (has_min ? 2 : 0) + (has_hi ? 4 : 0);
    uint32_t qh = 0;

    a[0] = a[1] = kw_f16(p);
    b[0] = has_min ? kw_f16(p + 2) : 0.0f;
    if (has_hi)
        memcpy(&qh, p + 2 + (has_min ? 2 : 0), 4);
    for (int j = 0; j < 16; j++) {
        int lo = qs[j] & 0x0f, hi = qs[j] >> 4;
        lo |= (int)((qh >> j) & 1u) << 4;
        hi |= (int)((qh >> (j + 16)) & 1u) << 4;
        q[j] = (int8_t)(lo - off);
        q[j + 16] = (int8_t)(hi - off);
    }
}

/* n groups of 32 IQ4 codes at qs (16 bytes a group: element j < 16 the low nibble of
 * byte j, j + 16 its high nibble) into q as the table's values. */
static void kw_iq4_codes(const uint8_t *qs, int n, int8_t *q)
{
    for (int g = 0; g < n; g++)
        for (int j = 0; j < 16; j++) {
            q[32 * g + j] = gang__kw_iq4_values[qs[16 * g + j] & 0x0f];
            q[32 * g + j + 16] = gang__kw_iq4_values[qs[16 * g + j] >> 4];
        }
}

void gang__kw_unpack(gang_kernels_wtype t, const void *block, int8_t *q, float *a, float *b)
{
    const uint8_t *p = block;

    switch (t) {
    case GANG_KW_Q8_0:
        a[0] = a[1] = kw_f16(p);
        b[0] = 0.0f;
        memcpy(q, p + 2, 32);
        return;
    case GANG_KW_Q4_K:
    case GANG_KW_Q5_K: {
        float d = kw_f16(p), dmin = kw_f16(p + 2);
        const uint8_t *qh = p + 16, *qs = p + (t == GANG_KW_Q5_K ? 48 : 16);
        for (int i = 0; i < 8; i++) {
            int s, mn, shift = (i & 1) * 4;
            const uint8_t *src = qs + (i / 2) * 32;
            kw_k_scale_min(p + 4, i, &s, &mn);
            a[2 * i] = a[2 * i + 1] = d * (float)s;
            b[i] = -dmin * (float)mn;
            for (int l = 0; l < 32; l++) {
                int v = (src[l] >> shift) & 0x0f;
                if (t == GANG_KW_Q5_K)
                    v |= ((qh[l] >> i) & 1) << 4;
                q[i * 32 + l] = (int8_t)v;
            }
        }
        return;
    }
    case GANG_KW_Q6_K: {
        const uint8_t *ql = p, *qh = p + 128;
        const int8_t *sc = (const int8_t *)(p + 192);
        float d = kw_f16(p + 208);
        for (int half = 0; half < 2; half++) {
            for (int g = 0; g < 4; g++) {
                for (int l = 0; l < 32; l++) {
                    int lo = (ql[64 * half + (g & 1) * 32 + l] >> ((g >> 1) * 4)) & 0x0f;
                    int hi = (qh[32 * half + l] >> (2 * g)) & 3;
                    q[128 * half + 32 * g + l] = (int8_t)((lo | (hi << 4)) - 32);
                }
            }
        }
        for (int i = 0; i < 16; i++)
            a[i] = d * (float)sc[i];
        for (int i = 0; i < 8; i++)
            b[i] = 0.0f;
        return;
    }
    case GANG_KW_IQ4_NL:
        a[0] = a[1] = kw_f16(p);
        b[0] = 0.0f;
        kw_iq4_codes(p + 2, 1, q);
        return;
    case GANG_KW_IQ4_XS:
        gang__kw_iq4xs_scales(p, kw_f16(p), a, b);
        kw_iq4_codes(p + 8, 8, q);
        return;
    default:
        kw_unpack_small(t, p, q, a, b);
        return;
    }
}

int gang_kernels_block_dequant(gang_kernels_wtype t, const void *src, size_t n, float *dst)
{
    size_t e, bytes;
    int8_t q[256];
    float a[16], b[8];

    if (src == NULL || dst == NULL || !gang_kernels_wtype_block(t, &e, &bytes) || n % e != 0)
        return GANG_EINVAL;
    for (size_t i = 0; i < n; i += e) {
        gang__kw_unpack(t, (const char *)src + i / e * bytes, q, a, b);
        for (size_t j = 0; j < e; j++)
            dst[i + j] = a[j / 16] * (float)q[j] + b[j / 32];
    }
    return 0;
}
