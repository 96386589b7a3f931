/*
 * Dequantization of GGUF tensor blocks to f32. Block layouts (ggml's, little-endian;
 * "d", "m", "dmin" are f16 scales):
 *
 *   Q8_0  32 elems, 34 bytes: d | i8 q[32]                        x = d q
 *   Q4_0  32 elems, 18 bytes: d | u8 qs[16]                       x = d (nibble - 8)
 *   Q4_1  32 elems, 20 bytes: d | m | u8 qs[16]                   x = d nibble + m
 *   Q5_0  32 elems, 22 bytes: d | u32 qh | u8 qs[16]              x = d (5-bit - 16)
 *   Q5_1  32 elems, 24 bytes: d | m | u32 qh | u8 qs[16]          x = d 5-bit + m
 *     element j < 16 is the low nibble of qs[j], element j + 16 its high nibble; the
 *     fifth bit of element k is bit k of qh.
 *   Q4_K 256 elems, 144 bytes: d | dmin | scales[12] | qs[128]
 *   Q5_K 256 elems, 176 bytes: d | dmin | scales[12] | qh[32] | qs[128]
 *     eight sub-blocks of 32 with 6-bit scale s_i and min m_i packed in scales[12];
 *     x = d s_i q - dmin m_i. Sub-blocks 2k and 2k + 1 are the low and high nibbles of
 *     qs[32k .. 32k + 32); Q5_K's fifth bit of sub-block i, element l is bit i of qh[l].
 *   Q6_K 256 elems, 210 bytes: ql[128] | qh[64] | i8 scales[16] | d
 *     16 sub-blocks of 16, x = d scale q with q = 6-bit - 32: two halves of 128, each
 *     with 64 ql bytes (low nibbles: elements 0..63, high: 64..127) and 32 qh bytes
 *     (2 bits per element, four groups of 32).
 *   IQ4_NL, IQ4_XS: the kernels' block dequantization (kernels/weight-blocks.c describes
 *     them), the one definition of their table.
 */
#include <string.h>

#include "ganglion/common.h"
#include "ganglion/kernels.h"
#include "gguf.h"

static float f16_at(const uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
    return gang_f16_to_f32(h);
}

const char *gang__gguf_type_name(uint32_t type)
{
    static const char *const names[] = {
        "F32",   "F16",        "Q4_0",       "Q4_1",       "Q4_2",     "Q4_3",     "Q5_0",
        "Q5_1",  "Q8_0",       "Q8_1",       "Q2_K",       "Q3_K",     "Q4_K",     "Q5_K",
        "Q6_K",  "Q8_K",       "IQ2_XXS",    "IQ2_XS",     "IQ3_XXS",  "IQ1_S",    "IQ4_NL",
        "IQ3_S", "IQ2_S",      "IQ4_XS",     "I8",         "I16",      "I32",      "I64",
        "F64",   "IQ1_M",      "BF16",       "Q4_0_4_4",   "Q4_0_4_8", "Q4_0_8_8", "TQ1_0",
        "TQ2_0", "IQ4_NL_4_4", "IQ4_NL_4_8", "IQ4_NL_8_8", "MXFP4"};
    return type < sizeof(names) / sizeof(names[0]) ? names[type] : NULL;
}

int gang__gguf_type_block(uint32_t type, uint32_t *elems, uint32_t *bytes)
{
    gang_kernels_wtype kw;
    size_t e, b;

    switch (type) {
    case GANG__GGML_F32:
        e = 1, b = 4;
        break;
    case GANG__GGML_F16:
    case GANG__GGML_BF16:
        e = 1, b = 2;
        break;
    default: /* a block type: the kernels' table of them (kernels/weight-blocks.c) */
        if (!gang__gguf_kernel_type(type, &kw) || !gang_kernels_wtype_block(kw, &e, &b))
            return GANG_EMODEL;
        break;
    }
    *elems = (uint32_t)e;
    *bytes = (uint32_t)b;
    return 0;
}

int gang__gguf_kernel_type(uint32_t ggml, gang_kernels_wtype *out)
{
    switch (ggml) {
    case GANG__GGML_Q8_0:
        *out = GANG_KW_Q8_0;
        return 1;
    case GANG__GGML_Q4_0:
        *out = GANG_KW_Q4_0;
        return 1;
    case GANG__GGML_Q4_1:
        *out = GANG_KW_Q4_1;
        return 1;
    case GANG__GGML_Q5_0:
        *out = GANG_KW_Q5_0;
        return 1;
    case GANG__GGML_Q5_1:
        *out = GANG_KW_Q5_1;
        return 1;
    case GANG__GGML_Q4_K:
        *out = GANG_KW_Q4_K;
        return 1;
    case GANG__GGML_Q5_K:
        *out = GANG_KW_Q5_K;
        return 1;
    case GANG__GGML_Q6_K:
        *out = GANG_KW_Q6_K;
        return 1;
    case GANG__GGML_IQ4_NL:
        *out = GANG_KW_IQ4_NL;
        return 1;
    case GANG__GGML_IQ4_XS:
        *out = GANG_KW_IQ4_XS;
        return 1;
    default:
        return 0;
    }
}

/* Q4_0, Q4_1, Q5_0, Q5_1: one block of 32 (has_min: a min follows d; has_hi: qh). */
static void dq_small(const uint8_t *p, float *y, int has_min, int has_hi)
{
    float d = f16_at(p), m = has_min ? f16_at(p + 2) : 0.0f;
    const uint8_t *qs = p + 2 + (has_min ? 2 : 0) + (has_hi ? 4 : 0);
    uint32_t qh = 0;
    int off = has_min ? 0 : (has_hi ? 16 : 8), j;

    if (has_hi)
        memcpy(&qh, p + 2 + (has_min ? 2 : 0), 4);
    for (j = 0; j < 16; j++) {
        int lo = qs[j] & 0x0f, hi = qs[j] >> 4;
        if (has_hi) {
            lo |= (int)((qh >> j) & 1u) << 4;
            hi |= (int)((qh >> (j + 16)) & 1u) << 4;
        }
        y[j] = (float)(lo - off) * d + m;
        y[j + 16] = (float)(hi - off) * d + m;
    }
}

/* The 6-bit scale and min of sub-block i of a Q4_K / Q5_K block. */
static void k_scale_min(const uint8_t *s, int i, int *sc, int *mn)
{
    if (i < 4) {
        *sc = s[i] & 63;
        *mn = s[i + 4] & 63;
    } else {
        *sc = (s[i + 4] & 0x0f) | ((s[i - 4] >> 6) << 4);
        *mn = (s[i + 4] >> 4) | ((s[i] >> 6) << 4);
    }
}

/* Q4_K (qh NULL) and Q5_K: one block of 256. */
static void dq_k45(const uint8_t *p, float *y, int five)
{
    float d = f16_at(p), dmin = f16_at(p + 2);
    const uint8_t *sc = p + 4, *qh = p + 16, *qs = p + (five ? 48 : 16);
    int i, l;

    for (i = 0; i < 8; i++) {
        int s, mn, shift = (i & 1) * 4;
        const uint8_t *q = qs + (i / 2) * 32;
        k_scale_min(sc, i, &s, &mn);
        for (l = 0; l < 32; l++) {
            int v = (q[l] >> shift) & 0x0f;
            if (five)
                v |= ((qh[l] >> i) & 1) << 4;
            y[i * 32 + l] = d * (float)s * (float)v - dmin * (float)mn;
        }
    }
}

/* Q6_K: one block of 256. */
static void dq_q6k(const uint8_t *p, float *y)
{
    const uint8_t *ql = p, *qh = p + 128;
    const int8_t *sc = (const int8_t *)(p + 192);
    float d = f16_at(p + 208);
    int half, g, l;

    for (half = 0; half < 2; half++) {
        for (g = 0; g < 4; g++) { /* elements 32g .. 32g + 32 of this half */
            for (l = 0; l < 32; l++) {
                int lo = (ql[(g & 1) * 32 + l] >> ((g >> 1) * 4)) & 0x0f;
                int hi = (qh[l] >> (2 * g)) & 3;
                int e = g * 32 + l;
                y[e] = d * (float)sc[e / 16] * (float)((lo | (hi << 4)) - 32);
            }
        }
        ql += 64;
        qh += 32;
        sc += 8;
        y += 128;
    }
}

void gang__gguf_dequant(uint32_t type, const uint8_t *src, float *dst, uint64_t n)
{
    uint64_t i;
    uint16_t h;

    switch (type) {
    case GANG__GGML_F32:
        memcpy(dst, src, (size_t)n * 4);
        return;
    case GANG__GGML_F16:
    case GANG__GGML_BF16:
        for (i = 0; i < n; i++) {
            memcpy(&h, src + 2 * i, 2);
            dst[i] = type == GANG__GGML_F16 ? gang_f16_to_f32(h) : gang_bf16_to_f32(h);
        }
        return;
    case GANG__GGML_IQ4_NL:
    case GANG__GGML_IQ4_XS: { /* n is whole blocks: gang__gguf_parse checked it */
        gang_kernels_wtype kw = GANG_KW_F32;

        if (gang__gguf_kernel_type(type, &kw))
            (void)gang_kernels_block_dequant(kw, src, (size_t)n, dst);
        return;
    }
    default:
        break;
    }
    for (i = 0; i < n;) {
        switch (type) {
        case GANG__GGML_Q8_0: {
            float d = f16_at(src);
            for (int j = 0; j < 32; j++)
                dst[i + (uint64_t)j] = d * (float)(int8_t)src[2 + j];
            src += 34;
            i += 32;
            break;
        }
        case GANG__GGML_Q4_0:
            dq_small(src, dst + i, 0, 0), src += 18, i += 32;
            break;
        case GANG__GGML_Q4_1:
            dq_small(src, dst + i, 1, 0), src += 20, i += 32;
            break;
        case GANG__GGML_Q5_0:
            dq_small(src, dst + i, 0, 1), src += 22, i += 32;
            break;
        case GANG__GGML_Q5_1:
            dq_small(src, dst + i, 1, 1), src += 24, i += 32;
            break;
        case GANG__GGML_Q4_K:
            dq_k45(src, dst + i, 0), src += 144, i += 256;
            break;
        case GANG__GGML_Q5_K:
            dq_k45(src, dst + i, 1), src += 176, i += 256;
            break;
        case GANG__GGML_Q6_K:
            dq_q6k(src, dst + i), src += 210, i += 256;
            break;
        default:
            return; /* unsupported types never pass gang__gguf_parse */
        }
    }
}
