/*
 * ganglion info --model PATH [--tp N --pp M --ep E]: what a model needs before any gang starts.
 * Reads the config (a Hugging Face directory or a .gguf file, as serve does), prints its
 * parameters, the weights and KV bytes per token it costs per rank for the TP x PP layout
 * asked (the weights as the engine holds them: f32; a MoE model's experts as --ep holds them,
 * with its experts and the parameters one token reads; an --ep that is a multiple of --tp
 * makes a stage of ep ranks, the world ep x pp), and the layouts the model allows on
 * up to 8 TP ranks x 8 pipeline stages (gang_topology_init is the one judge). Exit 0; 2
 * when the layout asked is refused (the reason printed); 3 when the model cannot be read.
 */
#include <stdio.h>
#include <string.h>

#include "cmds.h"
#include "ganglion/model.h"
#include "ganglion/parallel.h"

#define INFO_MAX_TP 8
#define INFO_MAX_PP 8

static const char *arch_name(gang_model_arch a)
{
    switch (a) {
    case GANG_ARCH_LLAMA:
        return "llama";
    case GANG_ARCH_MISTRAL:
        return "mistral";
    case GANG_ARCH_QWEN2:
        return "qwen2";
    case GANG_ARCH_QWEN3:
        return "qwen3";
    case GANG_ARCH_GEMMA3:
        return "gemma3";
    }
    return "?";
}

/* Parameters decoder layer li of rank tp_rank holds (f32 elements): a dense layer's MLP
 * columns, or a sparse layer's router, experts as ep holds them and shared expert. */
static uint64_t layer_params(const gang_model_config *mc, const gang_tp_shard *s, uint32_t tp,
                             uint32_t ep, uint32_t li)
{
    uint64_t h = mc->hidden, hd = mc->head_dim;
    uint64_t q = (uint64_t)s->head_count * hd, kv = (uint64_t)s->kv_head_count * hd;
    uint64_t n = q * h + 2 * kv * h + h * q + 2 * h;
    if (gang_model_layer_moe(mc, li)) {
        uint64_t per_expert = 3ull * mc->moe_ffn * h;
        n += (uint64_t)mc->n_experts * h +
             (ep > 1 ? mc->n_experts / ep * per_expert : mc->n_experts * per_expert / tp);
        if (mc->shared_ffn > 0) /* over the EP group when it is wider than TP */
            n += 3ull * mc->shared_ffn / (ep > tp ? ep : tp) * h + h;
    } else {
        n += 3 * (uint64_t)s->ffn_count * h;
    }
    if (mc->attn_bias)
        n += q + 2 * kv;
    if (mc->qk_norm)
        n += 2 * hd;
    if (mc->post_norms)
        n += 2 * h;
    return n;
}

/* The heaviest rank of t: weight bytes (f32) and KV bytes per token. */
static void rank_costs(const gang_model_config *mc, const gang_topology *t, uint32_t ep,
                       uint64_t *weights, uint64_t *kv_per_token)
{
    *weights = *kv_per_token = 0;
    for (uint32_t stage = 0; stage < t->pp; stage++) {
        uint32_t first = 0, count = 0;
        (void)gang_topology_stage_layers(t, stage, &first, &count);
        for (uint32_t r = 0; r < t->tp; r++) {
            gang_tp_shard s;
            if (gang_topology_tp_shard(t, r, &s) != 0)
                continue;
            uint64_t n = 0;
            for (uint32_t li = first; li < first + count; li++)
                n += layer_params(mc, &s, t->tp, ep, li);
            if (stage == 0)
                n += (uint64_t)mc->vocab * mc->hidden;
            if (stage + 1 == t->pp)
                n += (uint64_t)s.vocab_count * mc->hidden + mc->hidden;
            uint64_t kv = 2ull * count * s.kv_head_count * mc->head_dim * sizeof(float);
            if (n * sizeof(float) > *weights)
                *weights = n * sizeof(float);
            if (kv > *kv_per_token)
                *kv_per_token = kv;
        }
    }
}

static void print_config(const char *path, const gang_model_config *mc)
{
    static const char *const rope[] = {"default", "linear", "dynamic", "llama3", "yarn"};
    static const char *const fam[] = {"", "mixtral", "qwen2_moe", "qwen3_moe"};
    uint64_t total = 0, active = 0;
    gang_model_params(mc, &total, &active);
    printf("model: %s\n", path);
    printf("  architecture %s, %u layers, hidden %u, %u heads (%u kv) of %u, ffn %u, vocab %u\n",
           arch_name(mc->arch), mc->n_layers, mc->hidden, mc->n_heads, mc->n_kv_heads, mc->head_dim,
           mc->ffn, mc->vocab);
    printf("  context %u (max_position_embeddings %u), rope %s (theta %g)", mc->max_ctx_allowed,
           mc->max_pos,
           mc->rope_freq_factors         ? "scaled by the file's rope_freqs factors"
           : (unsigned)mc->rope.type < 5 ? rope[mc->rope.type]
                                         : "?",
           (double)mc->rope_theta);
    if (mc->sliding_window && mc->window_pattern)
        printf(", sliding window %u on local layers (every %u-th global; local theta %g)",
               mc->sliding_window, mc->window_pattern, (double)mc->rope_local_theta);
    else if (mc->sliding_window)
        printf(", sliding window %u from layer %u", mc->sliding_window, mc->window_first_layer);
    printf("\n  %.1f M parameters, %s head, checkpoint %s, %u EOS id(s)\n", (double)total / 1e6,
           mc->tie_embeddings ? "tied" : "separate", gang_dtype_name(mc->dtype), mc->n_eos);
    if (mc->n_experts > 0) {
        uint32_t sparse = 0;
        for (uint32_t i = 0; i < mc->n_layers; i++)
            sparse += gang_model_layer_moe(mc, i) ? 1 : 0;
        printf("  mixture of experts (%s): %u experts of width %u, top %u%s, %u of %u layers "
               "sparse",
               (unsigned)mc->moe < 4 ? fam[mc->moe] : "?", mc->n_experts, mc->moe_ffn, mc->top_k,
               mc->norm_topk ? " renormalised" : "", sparse, mc->n_layers);
        if (mc->shared_ffn > 0)
            printf(", a shared expert of width %u", mc->shared_ffn);
        printf("; %.1f M parameters active per token\n", (double)active / 1e6);
    }
}

/* The topology of tp x pp with --ep ep (a stage of ep ranks when ep > tp), on pp nodes. */
static int info_topology(const gang_model_config *mc, int64_t tp, int64_t pp, int64_t ep,
                         gang_topology *t, char *err, size_t errlen)
{
    gang_topology_config tc;
    memset(&tc, 0, sizeof(tc));
    gang_model_topology_config(mc, &tc);
    tc.nnodes = (int32_t)pp;
    tc.nproc_per_node = (int32_t)(ep > tp ? ep : tp);
    tc.tp = (int32_t)tp;
    tc.pp = (int32_t)pp;
    tc.ep = (int32_t)ep;
    return gang_topology_init(&tc, t, err, errlen);
}

int gang__info_model(const char *path, int64_t tp, int64_t pp, int64_t ep)
{
    gang_model_config mc;
    gang_topology t;
    char err[512];
    int rc = gang_model_config_read(path, &mc, err, sizeof(err));
    if (rc != 0) {
        fprintf(stderr, "ganglion info: %s\n", err);
        return GANG_EXIT_MODEL;
    }
    print_config(path, &mc);
    uint64_t w = 0, kv = 0;
    int refused = info_topology(&mc, tp, pp, ep, &t, err, sizeof(err)) != 0;
    if (!refused && gang_model_moe_layout(&mc, (uint32_t)tp, (uint32_t)ep, err, sizeof(err)) != 0)
        refused = 1;
    if (refused) {
        printf("layout tp %lld x pp %lld (ep %lld): refused: %s\n", (long long)tp, (long long)pp,
               (long long)ep, err);
    } else {
        rank_costs(&mc, &t, (uint32_t)ep, &w, &kv);
        printf("layout tp %lld x pp %lld x ep %lld (%u ranks): the heaviest rank holds %.1f MiB "
               "of f32 weights and %llu bytes of KV cache per token (%.1f MiB for %u "
               "positions)\n",
               (long long)tp, (long long)pp, (long long)ep, t.world_size, (double)w / (1 << 20),
               (unsigned long long)kv, (double)kv * mc.max_ctx_allowed / (1 << 20),
               mc.max_ctx_allowed);
        if (t.tp_replicas > 1)
            printf("  world %u = ep %lld x pp %lld: each stage is an EP group of %lld ranks "
                   "holding %u replicas of the TP group of %lld (attention and dense layers "
                   "replicated, experts and the shared expert split over the %lld)\n",
                   t.world_size, (long long)ep, (long long)pp, (long long)ep, t.tp_replicas,
                   (long long)tp, (long long)ep);
    }
    printf("layouts allowed (tp x pp, tp <= %d, pp <= %d):", INFO_MAX_TP, INFO_MAX_PP);
    for (uint32_t p = 1; p <= INFO_MAX_PP; p++)
        for (uint32_t q = 1; q <= INFO_MAX_TP; q++)
            if (gang_model_topology(&mc, p, q, q, p, &t, err, sizeof(err)) == 0)
                printf(" %ux%u", q, p);
    printf("\n");
    return refused ? GANG_EXIT_USAGE : GANG_EXIT_OK;
}
