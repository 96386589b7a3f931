/*
 * Block weights inside kernels/ (weight-blocks.c): one block of any block type seen as
 * the CPU products use it. Only kernels/ includes this file.
 */
#ifndef GANGLION_KERNELS_BLOCKS_H
#define GANGLION_KERNELS_BLOCKS_H

#include <stdint.h>

#include "ganglion/kernels.h"

/*
 * Unpacks one block of the block type t at block into E (its elements: 32 or 256) signed
 * values q[E], per 16 elements a scale a[E / 16] and per 32 an offset b[E / 32], such that
 * element j = a[j / 16] q[j] + b[j / 32] (the format's dequantization, value for value).
 * |q| <= 32 except Q8_0 (the file's int8, -128 .. 127) and the IQ4 types (-127 .. 113).
 * t must be a block type.
 */
void gang__kw_unpack(gang_kernels_wtype t, const void *block, int8_t *q, float *a, float *b);

/* The IQ4 types' value of each 4-bit code (the one copy: the SIMD kernels load their
 * shuffle tables from it). */
extern const int8_t gang__kw_iq4_values[16];

/* The 6-bit scale s of group i (< 8) of the IQ4_XS block at p, as s - 32: its low four
 * bits nibble i of scales_l (p + 4, low nibble first), its top two bits 2i, 2i + 1 of
 * scales_h (p + 2, little-endian). */
static inline int gang__kw_iq4xs_scale(const uint8_t *p, int i)
{
    unsigned h = (unsigned)p[2] | (unsigned)p[3] << 8;
    int lo = (p[4 + i / 2] >> (4 * (i % 2))) & 0x0f, hi = (int)((h >> (2 * i)) & 3u);

    return (lo | hi << 4) - 32;
}

/* The IQ4_XS block at p's scales as gang__kw_unpack gives them, d its f16 d widened: a[2 i]
 * = a[2 i + 1] = d (s_i - 32) for its eight groups, b[i] = 0. */
static inline void gang__kw_iq4xs_scales(const uint8_t *p, float d, float *a, float *b)
{
    for (int i = 0; i < 8; i++) {
        a[2 * i] = a[2 * i + 1] = d * (float)gang__kw_iq4xs_scale(p, i);
        b[i] = 0.0f;
    }
}

#endif
