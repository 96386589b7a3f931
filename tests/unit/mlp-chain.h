/*
 * Shared by unit-cuda and unit-cuda-blocks (their programmatic-dependent-launch cases): one
 * handle's run of a decode layer's MLP chain over weights of any storage.
 */
#ifndef GANGLION_TESTS_MLP_CHAIN_H
#define GANGLION_TESTS_MLP_CHAIN_H

#include <stddef.h>

#include "ganglion/kernels.h"

/*
 * On k, `rounds` times without a host wait: x += d, h = rmsnorm(x) (add_rmsnorm), gu =
 * h . W1^T, d = silu-glu(gu) . W2^T, each GEMV reading what the kernel just before it
 * wrote (in rounds 1, 4, ... the gated unit by gang_kernels_matmul_to_glu where k has it,
 * then a plain product; in rounds 2, 5, ... x += d, then the norm in the gate|up product
 * and the down product adding to x, gang_kernels_matmul_fused, and d = 0); x starts as x0 [m, hid]
 * and d as zeros. w1 [2 ffn, hid] and w2 [hid, ffn] are host weights of type t
 * (gang_kernels_weight_bytes of them), nw the norm's [hid]. Returns x and d downloaded (malloc'ed;
 * d_out may be NULL). A failing call fails the test.
 */
void mlp_chain(gang_kernels *k, gang_kernels_wtype t, size_t m, size_t hid, size_t ffn,
               const void *w1, const void *w2, const float *nw, const float *x0, int rounds,
               float **x_out, float **d_out);

#endif
