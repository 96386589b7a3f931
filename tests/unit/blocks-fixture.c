/* The block-weight tests' shared helpers (blocks-fixture.h). */
#include "blocks-fixture.h"

#include <string.h>

#include "ganglion/common.h"

const gang_kernels_wtype bf_types[10] = {GANG_KW_Q8_0,   GANG_KW_Q4_0,  GANG_KW_Q4_1, GANG_KW_Q5_0,
                                         GANG_KW_Q5_1,   GANG_KW_Q4_K,  GANG_KW_Q5_K, GANG_KW_Q6_K,
                                         GANG_KW_IQ4_NL, GANG_KW_IQ4_XS};

static uint64_t bf_state = 0x2545f4914f6cdd1dull;

void bf_seed(uint64_t seed)
{
    bf_state = seed != 0 ? seed : 1;
}

uint32_t bf_rnd(void)
{
    bf_state ^= bf_state << 13;
    bf_state ^= bf_state >> 7;
    bf_state ^= bf_state << 17;
    return (uint32_t)(bf_state >> 16);
}

float bf_rndf(float a)
{
    return a * ((float)(bf_rnd() % 2000001u) / 1000000.0f - 1.0f);
}

void bf_put_f16(uint8_t *p, float v)
{
    uint16_t h = gang_f32_to_f16(v);
    memcpy(p, &h, 2);
}

size_t bf_f16_fields(gang_kernels_wtype t, size_t at[2])
{
    switch (t) {
    case GANG_KW_Q4_1:
    case GANG_KW_Q5_1:
    case GANG_KW_Q4_K:
    case GANG_KW_Q5_K:
        at[0] = 0, at[1] = 2;
        return 2;
    case GANG_KW_Q6_K:
        at[0] = 208;
        return 1;
    default:
        at[0] = 0;
        return 1;
    }
}
