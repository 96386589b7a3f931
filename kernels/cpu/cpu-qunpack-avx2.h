/*
 * CPU backend: the vector unpacking of one GGUF block (include/ganglion/kernels.h "Block
 * types") shared by the block-product kernels built for AVX2 (cpu-qmatmul-avx2.c) and
 * AVX-512 VNNI (cpu-qmatmul-avx512.c); only files compiled with -mavx2 -mfma -mf16c (or
 * more) include it.
 *
 * A block becomes one 32-byte vector of quants per group of 32 elements, a scale per 16
 * (a) and an offset per 32 (b): the group adds d_x (a0 s0 + a1 s1) + b ds_x, s0 and s1
 * the integer products of its two halves with x's int8 (gang__cpu_qx). With u = 0 the
 * quants are signed (q - offset: Q8_0 as stored, Q4_0 - 8, Q5_0 - 16, Q6_K - 32), as
 * maddubs with the sign moved onto x wants them; with u = 1 (vpdpbusd's unsigned x
 * signed product) they keep their unsigned codes c = q + o (Q8_0's byte + 128 by flipping
 * its top bit; an IQ4 type's table value + 128), o = 2^qavx_offset_log2(t), and the
 * caller subtracts o sum x in integers:
 * sum q x = sum c x - o sum x, exactly. (Moving o into the f32 term b instead cancels
 * catastrophically: a Q8_0 quant of -1 is the difference of 127 x and 128 x.)
 */
#ifndef GANGLION_KERNELS_CPU_QUNPACK_AVX2_H
#define GANGLION_KERNELS_CPU_QUNPACK_AVX2_H

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "../kernels-blocks.h"
#include "cpu.h"

/* An f16 scale by F16C (the library's converter is a call: 4% of the kernel's time). */
static inline __attribute__((always_inline)) float qavx_f16(const uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

/* The low and high nibbles of 16 bytes as 32 bytes: elements j and j + 16. */
static inline __attribute__((always_inline)) __m256i qavx_nibbles16(const uint8_t *qs)
{
    __m128i v = _mm_loadu_si128((const __m128i *)(const void *)qs), m = _mm_set1_epi8(0x0f);
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), m), _mm_and_si128(v, m));
}

/* Bit j of qh as 0x10 in byte j (j < 32). */
static inline __attribute__((always_inline)) __m256i qavx_bits32(uint32_t qh)
{
    const __m256i shuf = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2,
                                          2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)qh), shuf);
    v = _mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit);
    return _mm256_and_si256(v, _mm256_set1_epi8(0x10));
}

/* The IQ4 types' table (kernels-blocks.h's gang__kw_iq4_values) as 16 bytes: the signed
 * values (u = 0) or the values + 128 (u = 1, vpdpbusd's unsigned codes). */
static inline __attribute__((always_inline)) __m128i qavx_iq4_table(int u)
{
    __m128i s = _mm_loadu_si128((const __m128i *)(const void *)gang__kw_iq4_values);
    return u ? _mm_xor_si128(s, _mm_set1_epi8((char)0x80)) : s;
}

/* The IQ4 types' codes looked up in their table (qavx_iq4_table(u)) in each 128-bit lane. */
static inline __attribute__((always_inline)) __m256i qavx_iq4_lookup(__m256i codes, int u)
{
    return _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(qavx_iq4_table(u)), codes);
}

/* log2 of the offset o of type t's unsigned codes (u = 1), -1 when it has none. */
static inline __attribute__((always_inline)) int qavx_offset_log2(gang_kernels_wtype t)
{
    switch (t) {
    case GANG_KW_Q8_0:
    case GANG_KW_IQ4_NL:
    case GANG_KW_IQ4_XS:
        return 7;
    case GANG_KW_Q4_0:
        return 3;
    case GANG_KW_Q5_0:
        return 4;
    case GANG_KW_Q6_K:
        return 5;
    default:
        return -1;
    }
}

/* The offset o of type t's unsigned codes, 0 when it has none (the repacked kernels'). */
static inline __attribute__((always_inline)) int qavx_offset(gang_kernels_wtype t)
{
    return qavx_offset_log2(t) < 0 ? 0 : 1 << qavx_offset_log2(t);
}

/* One block into q[groups], a[2 groups] (per 16) and b[groups] (per 32); u as above (a
 * constant where it is inlined: the branches on it fold away). */
static inline __attribute__((always_inline)) void
qavx_unpack(gang_kernels_wtype t, const uint8_t *p, __m256i *q, float *a, float *b, int u)
{
    const __m256i m4 = _mm256_set1_epi8(0x0f);

    switch (t) {
    case GANG_KW_Q8_0:
        a[0] = a[1] = qavx_f16(p);
        b[0] = 0.0f;
        q[0] = _mm256_loadu_si256((const __m256i *)(const void *)(p + 2));
        if (u)
            q[0] = _mm256_xor_si256(q[0], _mm256_set1_epi8((char)0x80));
        return;
    case GANG_KW_Q4_0:
        a[0] = a[1] = qavx_f16(p);
        b[0] = 0.0f;
        q[0] = qavx_nibbles16(p + 2);
        if (!u)
            q[0] = _mm256_sub_epi8(q[0], _mm256_set1_epi8(8));
        return;
    case GANG_KW_Q4_1:
        a[0] = a[1] = qavx_f16(p);
        b[0] = qavx_f16(p + 2);
        q[0] = qavx_nibbles16(p + 4);
        return;
    case GANG_KW_IQ4_NL:
        a[0] = a[1] = qavx_f16(p);
        b[0] = 0.0f;
        q[0] = qavx_iq4_lookup(qavx_nibbles16(p + 2), u);
        return;
    case GANG_KW_IQ4_XS:
        gang__kw_iq4xs_scales(p, qavx_f16(p), a, b);
        for (int i = 0; i < 8; i++)
            q[i] = qavx_iq4_lookup(qavx_nibbles16(p + 8 + 16 * i), u);
        return;
    case GANG_KW_Q5_0:
    case GANG_KW_Q5_1: {
        int one = t == GANG_KW_Q5_1;
        uint32_t qh;
        memcpy(&qh, p + 2 + 2 * one, 4);
        a[0] = a[1] = qavx_f16(p);
        b[0] = one ? qavx_f16(p + 2) : 0.0f;
        q[0] = _mm256_or_si256(qavx_nibbles16(p + 6 + 2 * one), qavx_bits32(qh));
        if (!one && !u)
            q[0] = _mm256_sub_epi8(q[0], _mm256_set1_epi8(16));
        return;
    }
    case GANG_KW_Q4_K:
    case GANG_KW_Q5_K: {
        int five = t == GANG_KW_Q5_K;
        const uint8_t *qs = p + (five ? 48 : 16);
        __m256i hb = _mm256_loadu_si256((const __m256i *)(const void *)(p + 16));
        float d = qavx_f16(p), dmin = qavx_f16(p + 2);
        for (int k = 0; k < 4; k++) {
            __m256i v = _mm256_loadu_si256((const __m256i *)(const void *)(qs + 32 * k));
            q[2 * k] = _mm256_and_si256(v, m4);
            q[2 * k + 1] = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
        }
        for (int i = 0; i < 8; i++) {
            const uint8_t *s = p + 4;
            int sc, mn;
            if (i < 4) {
                sc = s[i] & 63;
                mn = s[i + 4] & 63;
            } else {
                sc = (s[i + 4] & 0x0f) | ((s[i - 4] >> 6) << 4);
                mn = (s[i + 4] >> 4) | ((s[i] >> 6) << 4);
            }
            a[2 * i] = a[2 * i + 1] = d * (float)sc;
            b[i] = -dmin * (float)mn;
            if (five) {
                __m256i bit = _mm256_set1_epi8((char)(1 << i));
                __m256i h = _mm256_cmpeq_epi8(_mm256_and_si256(hb, bit), bit);
                q[i] = _mm256_or_si256(q[i], _mm256_and_si256(h, _mm256_set1_epi8(0x10)));
            }
        }
        return;
    }
    case GANG_KW_Q6_K: {
        const int8_t *sc = (const int8_t *)(const void *)(p + 192);
        float d = qavx_f16(p + 208);
        for (int half = 0; half < 2; half++) {
            const uint8_t *ql = p + 64 * half;
            __m256i l0 = _mm256_loadu_si256((const __m256i *)(const void *)ql);
            __m256i l1 = _mm256_loadu_si256((const __m256i *)(const void *)(ql + 32));
            __m256i h = _mm256_loadu_si256((const __m256i *)(const void *)(p + 128 + 32 * half));
            __m256i lo[4] = {_mm256_and_si256(l0, m4), _mm256_and_si256(l1, m4),
                             _mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                             _mm256_and_si256(_mm256_srli_epi16(l1, 4), m4)};
            for (int g = 0; g < 4; g++) {
                __m256i hi = _mm256_and_si256(_mm256_srli_epi16(h, 2 * g), _mm256_set1_epi8(3));
                q[4 * half + g] = _mm256_or_si256(lo[g], _mm256_slli_epi16(hi, 4));
                if (!u)
                    q[4 * half + g] = _mm256_sub_epi8(q[4 * half + g], _mm256_set1_epi8(32));
            }
        }
        for (int i = 0; i < 16; i++)
            a[i] = d * (float)sc[i];
        for (int i = 0; i < 8; i++)
            b[i] = 0.0f;
        return;
    }
    default:
        return;
    }
}

#endif /* __AVX2__ && __FMA__ && __F16C__ */
#endif /* GANGLION_KERNELS_CPU_QUNPACK_AVX2_H */
