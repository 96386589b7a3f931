/*
 * The mixture-of-experts block of one decoder layer for one rank (issue #25): the router
 * (replicated), this rank's experts whole (ep = tp, or ep = k x tp: then by the rank's
 * place in its stage, the EP group) or every expert's band of columns (ep 1), and the
 * shared expert's columns (over the TP group, or over the EP group when wider) with its gate, read
 * band by band through load.c's reader so that a rank never holds another rank's experts. The
 * tensor names are each family's Hugging Face names.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ganglion/model.h"
#include "model-internal.h"

/* One expert projection's band into its slot of the contiguous array dst. */
static int lm_copy(gang__band_fn band, void *ctx, const char *name, uint64_t rows, uint64_t cols,
                   uint64_t r0, uint64_t rn, uint64_t c0, uint64_t cn, float *dst)
{
    float *tmp = NULL;
    int rc = band(ctx, name, rows, cols, r0, rn, c0, cn, &tmp);

    if (rc == 0)
        memcpy(dst, tmp, (size_t)(rn * cn) * sizeof(float));
    free(tmp);
    return rc;
}

/* The three projections of expert e into local slot i of mo. */
static int lm_expert(const gang_model *m, uint32_t li, uint32_t e, uint32_t i, gang__band_fn band,
                     void *ctx, gang_tp_moe *mo)
{
    static const char *const part[2][3] = {{"gate_proj", "up_proj", "down_proj"},
                                           {"w1", "w3", "w2"}};
    int mix = m->cfg.moe == GANG_MOE_MIXTRAL;
    const char *pre = mix ? "block_sparse_moe.experts" : "mlp.experts";
    uint64_t h = mo->hidden, f = mo->moe_ffn, c0 = mo->ffn_first, cn = mo->ffn_count;
    size_t slot = (size_t)i * cn * h;
    char name[160];
    int rc;

#define LM_NAME(j)                                                                                 \
    (snprintf(name, sizeof(name), "model.layers.%u.%s.%u.%s.weight", li, pre, e, part[mix][j]),    \
     name)
    rc = lm_copy(band, ctx, LM_NAME(0), f, h, c0, cn, 0, h, mo->w_gate + slot);
    if (rc == 0)
        rc = lm_copy(band, ctx, LM_NAME(1), f, h, c0, cn, 0, h, mo->w_up + slot);
    if (rc == 0)
        rc = lm_copy(band, ctx, LM_NAME(2), h, f, 0, h, c0, cn, mo->w_down + slot);
#undef LM_NAME
    return rc;
}

/* Qwen2-MoE's shared expert: its columns on this TP rank, and its sigmoid gate. */
static int lm_shared(uint32_t li, gang__band_fn band, void *ctx, gang_tp_moe *mo)
{
    uint64_t h = mo->hidden, f = mo->sh_ffn, c0 = mo->sh_first, cn = mo->sh_count;
    char name[160];
    int rc;

#define LM_SH(s) (snprintf(name, sizeof(name), "model.layers.%u.mlp.%s", li, s), name)
    rc = lm_copy(band, ctx, LM_SH("shared_expert.gate_proj.weight"), f, h, c0, cn, 0, h,
                 mo->sh_gate);
    if (rc == 0)
        rc = lm_copy(band, ctx, LM_SH("shared_expert.up_proj.weight"), f, h, c0, cn, 0, h,
                     mo->sh_up);
    if (rc == 0)
        rc = lm_copy(band, ctx, LM_SH("shared_expert.down_proj.weight"), h, f, 0, h, c0, cn,
                     mo->sh_down);
    if (rc == 0)
        rc =
            lm_copy(band, ctx, LM_SH("shared_expert_gate.weight"), 1, h, 0, 1, 0, h, mo->sh_gate_w);
#undef LM_SH
    return rc;
}

int gang__load_moe(const gang_model *m, uint32_t li, uint32_t ep, gang__band_fn band, void *ctx,
                   gang_tp_layer *l, char *err, size_t errlen)
{
    const gang_model_config *c = &m->cfg;
    gang_tp_moe *mo = NULL;
    char name[160];
    int rc;

    if (ep == 0)
        ep = 1;
    rc = gang_model_moe_layout(c, m->topo.tp, ep, err, errlen);
    if (rc != 0)
        return GANG_EMODEL;
    /* Wider than TP, the block's group is the stage's EP group (the topology must have
     * been cut for it): its experts and shared columns by the rank's place in the stage. */
    if (ep > m->topo.tp && ep != m->topo.stage_ranks) {
        gang_set_err(err, errlen, "--ep %u: the layout was cut for stages of %u ranks", ep,
                     m->topo.stage_ranks);
        return GANG_EMODEL;
    }
    rc = gang_tp_moe_init(&mo, c->n_experts, c->top_k, c->norm_topk, c->hidden, c->moe_ffn,
                          c->shared_ffn, ep > m->topo.tp ? ep : m->topo.tp,
                          ep > m->topo.tp ? m->place.ep_rank : m->shard.tp_rank, ep);
    if (rc != 0)
        return rc == GANG_EINVAL ? GANG_EMODEL : rc;
    snprintf(name, sizeof(name), "model.layers.%u.%s", li,
             c->moe == GANG_MOE_MIXTRAL ? "block_sparse_moe.gate.weight" : "mlp.gate.weight");
    rc = lm_copy(band, ctx, name, c->n_experts, c->hidden, 0, c->n_experts, 0, c->hidden,
                 mo->router);
    for (uint32_t i = 0; rc == 0 && i < mo->expert_count; i++)
        rc = lm_expert(m, li, mo->expert_first + i, i, band, ctx, mo);
    if (rc == 0 && mo->sh_ffn > 0)
        rc = lm_shared(li, band, ctx, mo);
    if (rc != 0) {
        gang_tp_moe_free(mo);
        return rc;
    }
    l->moe = mo;
    return 0;
}

int gang_model_moe_load(const struct gang_model *m, gang_moe_load_sample *out)
{
    double sum = 0.0;

    memset(out, 0, sizeof(*out));
    for (uint32_t i = 0; m != NULL && m->layers != NULL && i < m->layer_count; i++) {
        const gang_tp_moe *mo = m->layers[i].moe;

        if (mo == NULL)
            continue;
        out->n_experts = mo->n_experts;
        out->ep = mo->ep;
        out->ep_rank = mo->ep_rank;
        out->layers++;
        out->steps += mo->load.steps;
        out->slots += mo->load.slots;
        sum += mo->load.max_over_mean_sum;
        out->last_max_over_mean = mo->load.last_max_over_mean;
        for (uint32_t e = 0; e < mo->n_experts && e < GANG_MOE_LOAD_EXPERTS; e++)
            out->expert_slots[e] += mo->load.expert_slots[e];
        for (uint32_t r = 0; r < mo->ep && r < GANG_MOE_LOAD_RANKS; r++)
            out->rank_slots[r] += mo->load.rank_slots[r];
    }
    out->mean_max_over_mean = out->steps > 0 ? sum / (double)out->steps : 0.0;
    return out->layers > 0;
}
