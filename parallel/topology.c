/*
 * Topology: validates a TP x PP layout against the gang shape and the model shape, and
 * answers which rank holds which layers, heads and columns. The numbering and the
 * Megatron split are described in include/ganglion/parallel.h.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "ganglion/parallel.h"

/*
 * Checks that every field is in range on its own; the relations between fields are
 * checked by topo_check_layout. Returns 0 or GANG_EUSAGE with a message.
 */
static int topo_check_fields(const gang_topology_config *cfg, char *err, size_t errlen)
{
    const struct {
        const char *name;
        int32_t value;
    } fields[] = {
        {"nnodes", cfg->nnodes},
        {"nproc_per_node", cfg->nproc_per_node},
        {"tp", cfg->tp},
        {"pp", cfg->pp},
        {"n_layers", cfg->n_layers},
        {"n_heads", cfg->n_heads},
        {"n_kv_heads", cfg->n_kv_heads},
        {"ffn", cfg->ffn},
        {"hidden", cfg->hidden},
        {"vocab", cfg->vocab},
    };
    size_t i;

    for (i = 0; i < sizeof(fields) / sizeof(fields[0]); i++) {
        if (fields[i].value <= 0) {
            gang_set_err(err, errlen, "topology: %s must be positive, got %d", fields[i].name,
                         (int)fields[i].value);
            return GANG_EUSAGE;
        }
    }
    if (cfg->ep < 0) {
        gang_set_err(err, errlen, "topology: ep must not be negative, got %d", (int)cfg->ep);
        return GANG_EUSAGE;
    }
    if (cfg->ep > cfg->tp && cfg->ep % cfg->tp != 0) {
        gang_set_err(err, errlen,
                     "topology: ep (%d) is neither at most tp (%d) nor a multiple of it: the "
                     "stage's EP group must hold whole TP groups",
                     (int)cfg->ep, (int)cfg->tp);
        return GANG_EUSAGE;
    }
    if (cfg->allow_cross_node_tp != 0 && cfg->allow_cross_node_tp != 1) {
        gang_set_err(err, errlen, "topology: allow_cross_node_tp must be 0 or 1, got %d",
                     (int)cfg->allow_cross_node_tp);
        return GANG_EUSAGE;
    }
    return 0;
}

/* Ranks per pipeline stage: tp, or ep when the EP group is wider than the TP group. */
static int32_t topo_stage_ranks(const gang_topology_config *cfg)
{
    return cfg->ep > cfg->tp ? cfg->ep : cfg->tp;
}

/*
 * Checks the gang shape: world size, stage_ranks x pp and TP groups within a node. Fields
 * are already known to be positive. Returns 0 or GANG_EUSAGE with a message.
 */
static int topo_check_gang(const gang_topology_config *cfg, char *err, size_t errlen)
{
    int64_t world = (int64_t)cfg->nnodes * cfg->nproc_per_node;
    int64_t tp_pp = (int64_t)topo_stage_ranks(cfg) * cfg->pp;

    if (world > GANG_TOPOLOGY_MAX_WORLD) {
        gang_set_err(err, errlen,
                     "topology: world size nnodes (%d) x nproc_per_node (%d) = %lld exceeds "
                     "the limit of %d ranks",
                     (int)cfg->nnodes, (int)cfg->nproc_per_node, (long long)world,
                     GANG_TOPOLOGY_MAX_WORLD);
        return GANG_EUSAGE;
    }
    if (tp_pp != world && cfg->ep > cfg->tp) {
        gang_set_err(err, errlen,
                     "topology: ep (%d) x pp (%d) = %lld (a stage is the EP group, tp %d "
                     "replicated) does not equal the world size nnodes (%d) x nproc_per_node "
                     "(%d) = %lld",
                     (int)cfg->ep, (int)cfg->pp, (long long)tp_pp, (int)cfg->tp, (int)cfg->nnodes,
                     (int)cfg->nproc_per_node, (long long)world);
        return GANG_EUSAGE;
    }
    if (tp_pp != world) {
        gang_set_err(err, errlen,
                     "topology: tp (%d) x pp (%d) = %lld does not equal the world size "
                     "nnodes (%d) x nproc_per_node (%d) = %lld",
                     (int)cfg->tp, (int)cfg->pp, (long long)tp_pp, (int)cfg->nnodes,
                     (int)cfg->nproc_per_node, (long long)world);
        return GANG_EUSAGE;
    }
    if (!cfg->allow_cross_node_tp &&
        (cfg->tp > cfg->nproc_per_node || cfg->nproc_per_node % cfg->tp != 0)) {
        gang_set_err(err, errlen,
                     "topology: a TP group of tp (%d) ranks would span nodes: tp must divide "
                     "nproc_per_node (%d) unless cross-node TP is allowed",
                     (int)cfg->tp, (int)cfg->nproc_per_node);
        return GANG_EUSAGE;
    }
    return 0;
}

/*
 * Checks that the model shape splits over tp and pp as parallel.h describes. Returns 0
 * or GANG_EUSAGE with a message.
 */
static int topo_check_model(const gang_topology_config *cfg, char *err, size_t errlen)
{
    if (cfg->pp > cfg->n_layers) {
        gang_set_err(err, errlen,
                     "topology: pp (%d) exceeds n_layers (%d): every pipeline stage needs at "
                     "least one layer",
                     (int)cfg->pp, (int)cfg->n_layers);
        return GANG_EUSAGE;
    }
    if (cfg->n_heads % cfg->n_kv_heads != 0) {
        gang_set_err(err, errlen, "topology: n_heads (%d) is not divisible by n_kv_heads (%d)",
                     (int)cfg->n_heads, (int)cfg->n_kv_heads);
        return GANG_EUSAGE;
    }
    if (cfg->n_heads % cfg->tp != 0) {
        gang_set_err(err, errlen, "topology: tp (%d) does not divide n_heads (%d)", (int)cfg->tp,
                     (int)cfg->n_heads);
        return GANG_EUSAGE;
    }
    if (cfg->n_kv_heads % cfg->tp != 0 && cfg->tp % cfg->n_kv_heads != 0) {
        gang_set_err(err, errlen,
                     "topology: tp (%d) neither divides n_kv_heads (%d) nor is a multiple of "
                     "it, so the kv heads can be neither split nor replicated evenly",
                     (int)cfg->tp, (int)cfg->n_kv_heads);
        return GANG_EUSAGE;
    }
    if (cfg->ffn % cfg->tp != 0) {
        gang_set_err(err, errlen, "topology: tp (%d) does not divide ffn (%d)", (int)cfg->tp,
                     (int)cfg->ffn);
        return GANG_EUSAGE;
    }
    if (cfg->head_dim < 0 || cfg->head_dim == 1 || cfg->head_dim % 2 != 0) {
        gang_set_err(err, errlen, "topology: head_dim (%d) is not 0 or an even width",
                     (int)cfg->head_dim);
        return GANG_EUSAGE;
    }
    if (cfg->head_dim == 0 && cfg->hidden % cfg->n_heads != 0) {
        gang_set_err(err, errlen,
                     "topology: hidden (%d) is not divisible by n_heads (%d), so there is no "
                     "whole head_dim",
                     (int)cfg->hidden, (int)cfg->n_heads);
        return GANG_EUSAGE;
    }
    if (cfg->vocab < cfg->tp) {
        gang_set_err(err, errlen,
                     "topology: vocab (%d) is smaller than tp (%d): some rank would hold no "
                     "LM-head column",
                     (int)cfg->vocab, (int)cfg->tp);
        return GANG_EUSAGE;
    }
    return 0;
}

int gang_topology_init(const gang_topology_config *cfg, gang_topology *t, char *err, size_t errlen)
{
    gang_topology out;
    int rc;

    if (err != NULL && errlen > 0)
        err[0] = '\0';
    if (cfg == NULL || t == NULL) {
        gang_set_err(err, errlen, "topology: NULL config or result");
        return GANG_EINVAL;
    }
    rc = topo_check_fields(cfg, err, errlen);
    if (rc != 0)
        goto out_refuse;
    rc = topo_check_gang(cfg, err, errlen);
    if (rc != 0)
        goto out_refuse;
    rc = topo_check_model(cfg, err, errlen);
    if (rc != 0)
        goto out_refuse;

    memset(&out, 0, sizeof(out));
    out.nnodes = (uint32_t)cfg->nnodes;
    out.nproc_per_node = (uint32_t)cfg->nproc_per_node;
    out.world_size = out.nnodes * out.nproc_per_node;
    out.tp = (uint32_t)cfg->tp;
    out.stage_ranks = (uint32_t)topo_stage_ranks(cfg);
    out.tp_replicas = out.stage_ranks / out.tp;
    out.pp = (uint32_t)cfg->pp;
    out.tp_cross_node = out.nproc_per_node % out.tp != 0 ? 1u : 0u;
    out.n_layers = (uint32_t)cfg->n_layers;
    out.n_heads = (uint32_t)cfg->n_heads;
    out.n_kv_heads = (uint32_t)cfg->n_kv_heads;
    out.ffn = (uint32_t)cfg->ffn;
    out.hidden = (uint32_t)cfg->hidden;
    out.vocab = (uint32_t)cfg->vocab;
    out.head_dim = cfg->head_dim > 0 ? (uint32_t)cfg->head_dim : out.hidden / out.n_heads;
    out.heads_per_rank = out.n_heads / out.tp;
    if (out.tp > out.n_kv_heads) {
        /* Fewer kv heads than ranks: each kv head lives on tp / n_kv_heads ranks. */
        out.kv_heads_per_rank = 1;
        out.kv_replicas = out.tp / out.n_kv_heads;
    } else {
        out.kv_heads_per_rank = out.n_kv_heads / out.tp;
        out.kv_replicas = 1;
    }
    out.ffn_per_rank = out.ffn / out.tp;
    *t = out;
    return 0;

out_refuse:
    return rc;
}

int gang_topology_rank(const gang_topology *t, uint32_t rank, gang_rank_place *out)
{
    gang_rank_place p;

    if (t == NULL || out == NULL || rank >= t->world_size)
        return GANG_EINVAL;
    p.rank = rank;
    p.node = rank / t->nproc_per_node;
    p.local_rank = rank % t->nproc_per_node;
    p.pp_stage = rank / t->stage_ranks;
    p.ep_rank = rank % t->stage_ranks;
    p.tp_replica = p.ep_rank / t->tp;
    p.tp_rank = p.ep_rank % t->tp;
    p.tp_group_first_rank = rank - p.tp_rank;
    p.stage_first_rank = rank - p.ep_rank;
    /* The world size is capped at GANG_TOPOLOGY_MAX_WORLD, so these casts cannot wrap. */
    p.pp_prev_rank = p.pp_stage == 0 ? -1 : (int32_t)(rank - t->stage_ranks);
    p.pp_next_rank = p.pp_stage + 1 == t->pp ? -1 : (int32_t)(rank + t->stage_ranks);
    *out = p;
    return 0;
}

int gang_topology_rank_at(const gang_topology *t, uint32_t pp_stage, uint32_t tp_rank,
                          uint32_t *rank)
{
    if (t == NULL || rank == NULL || pp_stage >= t->pp || tp_rank >= t->tp)
        return GANG_EINVAL;
    *rank = pp_stage * t->stage_ranks + tp_rank;
    return 0;
}

/*
 * Even split of n items over parts with the remainder going to the first parts: part i
 * gets n / parts items, plus one when i < n % parts. Used for the layers over the
 * pipeline stages and for the vocabulary over the TP ranks.
 */
static void topo_split(uint32_t n, uint32_t parts, uint32_t i, uint32_t *first, uint32_t *count)
{
    uint32_t base = n / parts;
    uint32_t extra = n % parts;

    *count = base + (i < extra ? 1u : 0u);
    *first = i * base + (i < extra ? i : extra);
}

int gang_topology_stage_layers(const gang_topology *t, uint32_t stage, uint32_t *first,
                               uint32_t *count)
{
    if (t == NULL || first == NULL || count == NULL || stage >= t->pp)
        return GANG_EINVAL;
    topo_split(t->n_layers, t->pp, stage, first, count);
    return 0;
}

int gang_topology_tp_shard(const gang_topology *t, uint32_t tp_rank, gang_tp_shard *out)
{
    gang_tp_shard s;

    if (t == NULL || out == NULL || tp_rank >= t->tp)
        return GANG_EINVAL;
    s.tp_rank = tp_rank;
    s.head_count = t->heads_per_rank;
    s.head_first = tp_rank * t->heads_per_rank;
    s.kv_head_count = t->kv_heads_per_rank;
    s.kv_replicas = t->kv_replicas;
    /*
     * Split case: kv_replicas is 1 and rank r holds kv heads [r x per_rank, ...).
     * Replicated case: per_rank is 1 and rank r holds kv head r / kv_replicas.
     */
    s.kv_head_first = (tp_rank / t->kv_replicas) * t->kv_heads_per_rank;
    s.ffn_count = t->ffn_per_rank;
    s.ffn_first = tp_rank * t->ffn_per_rank;
    topo_split(t->vocab, t->tp, tp_rank, &s.vocab_first, &s.vocab_count);
    *out = s;
    return 0;
}
