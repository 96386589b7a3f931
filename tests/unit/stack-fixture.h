/*
 * A small random stack of Llama layers, its input batch and its single-rank reference,
 * shared by the pipeline tests (threads over sockets, and processes under mpirun), so that
 * both check against the same model built the same way.
 */
#ifndef GANG_TEST_STACK_FIXTURE_H
#define GANG_TEST_STACK_FIXTURE_H

#include <stddef.h>
#include <stdint.h>

#include "ganglion/parallel.h"

/* Model shape: small enough for milliseconds, large enough for 4-way TP with GQA. */
#define MAX_LAYERS 7
#define HIDDEN 32
#define N_HEADS 4
#define N_KV_HEADS 2
#define HEAD_DIM (HIDDEN / N_HEADS)
#define KV_DIM (N_KV_HEADS * HEAD_DIM)
#define FFN 64
#define BATCH 8
#define TOKENS 3
#define ACT (BATCH * TOKENS * HIDDEN)
#define ROPE_THETA 10000.0f
#define NORM_EPS 1e-5f
#define REL_TOL 1e-4

typedef struct stack_layer_mem {
    float attn_norm[HIDDEN], mlp_norm[HIDDEN];
    float wq[HIDDEN * HIDDEN], wk[KV_DIM * HIDDEN], wv[KV_DIM * HIDDEN], wo[HIDDEN * HIDDEN];
    float w_gate[FFN * HIDDEN], w_up[FFN * HIDDEN], w_down[HIDDEN * FFN];
} stack_layer_mem;

typedef struct stack_model {
    uint32_t n_layers;
    stack_layer_mem mem[MAX_LAYERS];
    gang_layer_weights w[MAX_LAYERS];
    float x[ACT];   /* the input hidden states of the batch */
    float ref[ACT]; /* the reference output */
} stack_model;

/*
 * Draws a stack of n_layers (<= MAX_LAYERS) and its input from a fixed seed, so every
 * process that calls it first gets the same model, and computes the reference output.
 * Fails the current cmocka test on error; release with free().
 */
stack_model *stack_model_new(uint32_t n_layers);
/* The topology of tp x pp ranks (pp nodes of tp ranks) for this shape. */
int stack_topology(uint32_t tp, uint32_t pp, uint32_t n_layers, gang_topology *t);
/* Norm-wise relative error: max |got - ref| over max |ref|. */
double stack_rel_err(const float *got, const float *ref, size_t n);

#endif
