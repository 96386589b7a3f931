/*
 * Element types and half-precision conversions, shared by the kernels, the communicators
 * and the model readers (one enum, one set of converters). The conversions are bit-level
 * code rather than _Float16 / __bf16, so the result is the same with every compiler and
 * target and the rounding is explicit.
 */
#include <stdint.h>
#include <string.h>

#include "ganglion/common.h"

size_t gang_dtype_size(gang_dtype dt)
{
    switch (dt) {
    case GANG_DTYPE_F32:
    case GANG_DTYPE_I32:
        return 4;
    case GANG_DTYPE_F16:
    case GANG_DTYPE_BF16:
        return 2;
    }
    return 0;
}

const char *gang_dtype_name(gang_dtype dt)
{
    switch (dt) {
    case GANG_DTYPE_F32:
        return "f32";
    case GANG_DTYPE_F16:
        return "f16";
    case GANG_DTYPE_BF16:
        return "bf16";
    case GANG_DTYPE_I32:
        return "i32";
    }
    return "unknown";
}

static uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof(u));
    return u;
}

static float f32_from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

float gang_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;

    if (exp == 0) {
        if (mant == 0)
            return f32_from_bits(sign);
        /* Subnormal half: shift the mantissa up until its implicit bit appears, lowering
         * the exponent once per shift; every f16 subnormal is a normal f32. */
        exp = 127 - 15 + 1;
        while ((mant & 0x400u) == 0) {
            mant <<= 1;
            exp--;
        }
        mant &= 0x3ffu;
        return f32_from_bits(sign | (exp << 23) | (mant << 13));
    }
    if (exp == 31)
        return f32_from_bits(sign | 0x7f800000u | (mant << 13));
    return f32_from_bits(sign | ((exp + 127 - 15) << 23) | (mant << 13));
}

/*
 * f32 -> f16, round to nearest, ties to even. Three ranges:
 *  - |x| >= 65520 (half-way between the largest half, 65504, and 2^16) rounds to infinity;
 *  - normal halves: rebias the exponent, then add 0xfff plus the lowest kept bit so that a
 *    tie rounds towards an even mantissa; a mantissa carry moves into the exponent, which
 *    is the right result;
 *  - subnormal halves (|x| < 2^-14): shift the full mantissa right and round by hand.
 */
uint16_t gang_f32_to_f16(float f)
{
    uint32_t x = f32_bits(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);

    x &= 0x7fffffffu;
    if (x > 0x7f800000u) /* NaN: keep the top payload bits and force the quiet bit */
        return (uint16_t)(sign | 0x7e00u | ((x >> 13) & 0x3ffu));
    if (x >= 0x477ff000u)
        return (uint16_t)(sign | 0x7c00u);
    if (x >= 0x38800000u) {
        x -= (uint32_t)(127 - 15) << 23;
        x += 0xfffu + ((x >> 13) & 1u);
        return (uint16_t)(sign | (x >> 13));
    }
    /* 2^-25 is half the smallest subnormal; at or below it the tie goes to even zero. */
    if (x <= 0x33000000u)
        return sign;
    uint32_t exp = x >> 23;
    uint32_t mant = (x & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126 - exp; /* 14 .. 24 in this range */
    uint32_t r = mant >> shift;
    uint32_t rem = mant & ((1u << shift) - 1u);
    uint32_t halfway = 1u << (shift - 1);

    if (rem > halfway || (rem == halfway && (r & 1u)))
        r++;
    return (uint16_t)(sign | r);
}

float gang_bf16_to_f32(uint16_t h)
{
    return f32_from_bits((uint32_t)h << 16);
}

/* f32 -> bf16: bf16 is the top half of an f32, so rounding is adding 0x7fff plus the lowest
 * kept bit (ties to even) before truncating; an overflow of the mantissa correctly carries
 * into the exponent, up to infinity. NaN is handled first so the addition cannot turn it
 * into infinity. */
uint16_t gang_f32_to_bf16(float f)
{
    uint32_t x = f32_bits(f);

    if ((x & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((x >> 16) | 0x0040u);
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

int gang_f16_to_f32_array(const uint16_t *src, float *dst, size_t n)
{
    if (n > 0 && (src == NULL || dst == NULL))
        return GANG_EINVAL;
    for (size_t i = 0; i < n; i++)
        dst[i] = gang_f16_to_f32(src[i]);
    return 0;
}

int gang_f32_to_f16_array(const float *src, uint16_t *dst, size_t n)
{
    if (n > 0 && (src == NULL || dst == NULL))
        return GANG_EINVAL;
    for (size_t i = 0; i < n; i++)
        dst[i] = gang_f32_to_f16(src[i]);
    return 0;
}

int gang_bf16_to_f32_array(const uint16_t *src, float *dst, size_t n)
{
    if (n > 0 && (src == NULL || dst == NULL))
        return GANG_EINVAL;
    for (size_t i = 0; i < n; i++)
        dst[i] = gang_bf16_to_f32(src[i]);
    return 0;
}

int gang_f32_to_bf16_array(const float *src, uint16_t *dst, size_t n)
{
    if (n > 0 && (src == NULL || dst == NULL))
        return GANG_EINVAL;
    for (size_t i = 0; i < n; i++)
        dst[i] = gang_f32_to_bf16(src[i]);
    return 0;
}
