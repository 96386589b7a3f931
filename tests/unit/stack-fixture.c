/* The shared random stack of the pipeline tests; see stack-fixture.h. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "test-util.h"
#include "ganglion/kernels.h"
#include "stack-fixture.h"

#define STACK_OP_TIMEOUT_MS 20000

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

/* The next draw of this file's deterministic sequence (test-util.c). */
static float rnd(void)
{
    return tu_rnd(&rng_state);
}

static void fill(float *a, size_t n, float scale, float offset)
{
    size_t i;

    for (i = 0; i < n; i++)
        a[i] = rnd() * scale + offset;
}

int stack_topology(uint32_t tp, uint32_t pp, uint32_t n_layers, gang_topology *t)
{
    gang_topology_config cfg = {
        .nnodes = (int32_t)pp,
        .nproc_per_node = (int32_t)tp,
        .tp = (int32_t)tp,
        .pp = (int32_t)pp,
        .allow_cross_node_tp = 0,
        .n_layers = (int32_t)n_layers,
        .n_heads = N_HEADS,
        .n_kv_heads = N_KV_HEADS,
        .ffn = FFN,
        .hidden = HIDDEN,
        .vocab = 16,
    };

    return gang_topology_init(&cfg, t, NULL, 0);
}

/*
 * The reference: every sequence through every layer in turn on one rank, with the plain
 * single-rank layer (tp = 1, comm NULL) and one cache reused by every prefill.
 */
static void model_reference(stack_model *m)
{
    gang_topology t;
    gang_tp_layer l;
    gang_kernels *k = NULL;
    float ck[TOKENS * KV_DIM], cv[TOKENS * KV_DIM];
    gang_tp_kv_cache cache = {.k = ck, .v = cv, .cap = TOKENS};
    uint32_t i, s;

    assert_int_equal(stack_topology(1, 1, m->n_layers, &t), 0);
    assert_int_equal(gang_kernels_open("cpu", &k), 0);
    memcpy(m->ref, m->x, sizeof(m->ref));
    for (i = 0; i < m->n_layers; i++) {
        assert_int_equal(gang_tp_layer_init(&l, &t, 0, &m->w[i], ROPE_THETA, NORM_EPS), 0);
        for (s = 0; s < BATCH; s++)
            assert_int_equal(gang_tp_layer_forward(&l, k, NULL, m->ref + s * TOKENS * HIDDEN,
                                                   TOKENS, 0, &cache, STACK_OP_TIMEOUT_MS),
                             0);
        gang_tp_layer_free(&l);
    }
    gang_kernels_close(k);
}

stack_model *stack_model_new(uint32_t n_layers)
{
    stack_model *m = calloc(1, sizeof(*m));
    float s_h = 1.0f / sqrtf((float)HIDDEN), s_f = 1.0f / sqrtf((float)FFN);
    uint32_t i;

    assert_non_null(m);
    assert_true(n_layers <= MAX_LAYERS);
    m->n_layers = n_layers;
    for (i = 0; i < n_layers; i++) {
        stack_layer_mem *p = &m->mem[i];

        fill(p->attn_norm, HIDDEN, 0.2f, 1.0f);
        fill(p->mlp_norm, HIDDEN, 0.2f, 1.0f);
        /* Large q/k weights give peaked softmaxes, so a wrong head mapping cannot hide. */
        fill(p->wq, HIDDEN * HIDDEN, 3.0f * s_h, 0.0f);
        fill(p->wk, KV_DIM * HIDDEN, 3.0f * s_h, 0.0f);
        fill(p->wv, KV_DIM * HIDDEN, s_h, 0.0f);
        fill(p->wo, HIDDEN * HIDDEN, s_h, 0.0f);
        fill(p->w_gate, FFN * HIDDEN, 2.0f * s_h, 0.0f);
        fill(p->w_up, FFN * HIDDEN, s_h, 0.0f);
        fill(p->w_down, HIDDEN * FFN, s_f, 0.0f);
        m->w[i] = (gang_layer_weights){.attn_norm = p->attn_norm,
                                       .wq = p->wq,
                                       .wk = p->wk,
                                       .wv = p->wv,
                                       .wo = p->wo,
                                       .mlp_norm = p->mlp_norm,
                                       .w_gate = p->w_gate,
                                       .w_up = p->w_up,
                                       .w_down = p->w_down};
    }
    fill(m->x, ACT, 1.0f, 0.0f);
    model_reference(m);
    return m;
}

/* Norm-wise relative error: max |got - ref| over max |ref|. */
double stack_rel_err(const float *got, const float *ref, size_t n)
{
    double num = 0.0, den = 0.0;
    size_t i;

    for (i = 0; i < n; i++) {
        num = fmax(num, fabs((double)got[i] - (double)ref[i]));
        den = fmax(den, fabs((double)ref[i]));
    }
    return den > 0.0 ? num / den : num;
}
