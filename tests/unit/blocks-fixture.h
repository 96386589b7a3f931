/*
 * Shared by the block-weight tests (unit-kernels-blocks, unit-cuda-qblocks,
 * unit-cuda-blocks): a seedable xorshift generator and the layout facts they fill random
 * GGUF blocks with. Each test keeps its own edge blocks.
 */
#ifndef GANGLION_TESTS_BLOCKS_FIXTURE_H
#define GANGLION_TESTS_BLOCKS_FIXTURE_H

#include <stddef.h>
#include <stdint.h>

#include "ganglion/kernels.h"

/* The ten block types, in the order the tests walk them. */
extern const gang_kernels_wtype bf_types[10];
#define BF_N_TYPES 10

/* The generator's state: a test sets it once to its own seed (never 0). */
void bf_seed(uint64_t seed);
/* The next 32 random bits (xorshift64, upper bits). */
uint32_t bf_rnd(void);
/* Uniform in [-a, a]. */
float bf_rndf(float a);
/* v as f16 at p (unaligned). */
void bf_put_f16(uint8_t *p, float v);
/* Byte offsets of a block's f16 fields (d, and m or dmin) in at; returns their count. */
size_t bf_f16_fields(gang_kernels_wtype t, size_t at[2]);

#endif
