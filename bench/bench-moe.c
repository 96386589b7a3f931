/*
 * `ganglion bench moe` (issue #25): decode tokens/s of a mixture-of-experts model per batch
 * and EP degree on the CPU, the all-to-all's share of a decode step, and the all-to-all
 * against Open MPI's MPI_Alltoallv at the sizes a decode step sends, in one run.
 *
 * The model is a Qwen3-30B-A3B-like shape scaled down to fit this machine (`ganglion mkmodel
 * --moe qwen3`: every layer sparse, 128 experts, top-8 renormalised, q/k norms, head_dim
 * apart from hidden / heads; the flags below change it), written to a temporary directory.
 * For every EP degree of --ep and batch of --batch, the point of `bench decode`
 * (gang__bd_point: rank threads over the socket backend, --warmup + --iters iterations of a
 * prefill step and --tokens - 1 decode steps) runs on --tp = --ep ranks with the experts
 * split over them (gang_load_options.ep), and with --replicated the same EP again right
 * after it with --tp 1 (a stage of ep ranks, the attention replicated on each, the experts
 * split over them); EP 1 is one rank, and each other point is checked against it (the
 * decode line's logits_match_1x1). After the decode line, a "moe" line:
 *   a2a_ms_per_step   the time a rank spends inside the two all-to-alls of a decode step
 *                     (summed over its MoE layers; gang_tp_moe_timing_get over the decode
 *                     steps' calls, which are the calls of exactly `batch` tokens)
 *   moe_ms_per_step   the same for the whole MoE blocks
 *   decode_step_ms    one decode step (the median iteration's decode phase / (tokens - 1))
 *   a2a_share_of_step a2a_ms_per_step / decode_step_ms
 *   a2a_bytes_per_rank what one rank sends in one dispatch of a decode step, on average
 *                     (batch x top_k rows of hidden floats spread over ep ranks)
 * Then, for each EP degree above 1, `bench alltoall --ranks EP` up to the largest dispatch
 * size measured (its lines carry ratio = ganglion busbw / MPI_Alltoallv busbw).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "bench.h"
#include "decode.h"
#include "report.h"
#include "ganglion/common.h"
#include "ganglion/model.h"

#define BM_MAX_EP 3

typedef struct bm_flags {
    int64_t layers, hidden, heads, kv_heads, head_dim, experts, top_k, moe_ffn, vocab;
    int64_t prompt, tokens, iters, warmup, timeout_s;
    char batch[64], ep[32];
    int no_peer, replicated;
} bm_flags;

#define BM_INT(f_, fld, d_, lo_, hi_, hp) GANG_OPT_INT(bm_flags, f_, fld, d_, lo_, hi_, hp)
static const gang_param_info bm_items[] = {
    BM_INT("layers", layers, "4", 1, 64, "decoder layers (every one sparse)"),
    BM_INT("hidden", hidden, "256", 16, 8192, "hidden size"),
    BM_INT("heads", heads, "8", 1, 128, "attention heads"),
    BM_INT("kv-heads", kv_heads, "4", 1, 128, "key/value heads"),
    BM_INT("head-dim", head_dim, "32", 2, 256, "per-head width"),
    BM_INT("experts", experts, "128", 1, GANG_MOE_MAX_EXPERTS, "experts per layer"),
    BM_INT("top-k", top_k, "8", 1, GANG_MOE_MAX_TOPK, "experts per token"),
    BM_INT("moe-ffn", moe_ffn, "96", 1, 65536, "each expert's width"),
    BM_INT("vocab", vocab, "1024", 16, 1 << 20, "vocabulary"),
    BM_INT("prompt", prompt, "16", 2, 4096, "prompt tokens per sequence"),
    BM_INT("tokens", tokens, "16", 2, 4096, "generated tokens per sequence"),
    BM_INT("iters", iters, "2", 1, 100, "timed iterations per point"),
    BM_INT("warmup", warmup, "1", 0, 100, "untimed iterations first"),
    BM_INT("timeout-s", timeout_s, "300", 1, 86400, "deadline of every engine step"),
    GANG_OPT_STR(bm_flags, "batch", batch, "1,8,32", "batch sizes, comma-separated"),
    GANG_OPT_STR(bm_flags, "ep", ep, "1,2,4", "EP degrees (= TP ranks), comma-separated, 1 first"),
    {.flag = "no-peer",
     .type = GANG_PARAM_BOOL,
     .def = "0",
     .hi = 1,
     .help = "skip the MPI_Alltoallv peer of the all-to-all lines",
     .offset = offsetof(bm_flags, no_peer)},
    {.flag = "replicated",
     .type = GANG_PARAM_BOOL,
     .def = "0",
     .hi = 1,
     .help = "also run each EP above 1 with --tp 1 (attention replicated over the EP group), "
             "right after its EP = TP point",
     .offset = offsetof(bm_flags, replicated)},
};
static const gang_opt_table bm_table = GANG_OPT_TABLE(bm_items);
static const gang_opt_cmd bm_cmd = {
    "bench moe", "[flags]",
    "Decode tokens/s of a scaled-down Qwen3-30B-A3B-like MoE model per --batch and --ep\n"
    "(experts split over the ranks, two all-to-alls per layer), the all-to-all's share of a\n"
    "decode step, then bench alltoall vs MPI_Alltoallv at the decode step's sizes.",
    &bm_table, 0};

/* A comma-separated list of up to cap positive integers; 0 or GANG_EUSAGE. */
static int bm_list(const char *s, uint32_t *v, uint32_t cap, uint32_t *n)
{
    char buf[64], *save = NULL;

    *n = 0;
    gang_strlcpy(buf, s, sizeof(buf));
    for (char *t = strtok_r(buf, ",", &save); t != NULL; t = strtok_r(NULL, ",", &save)) {
        char *end;
        unsigned long x = strtoul(t, &end, 10);

        if (*end != '\0' || x == 0 || x > 4096 || *n == cap)
            return GANG_EUSAGE;
        v[(*n)++] = (uint32_t)x;
    }
    return *n > 0 ? 0 : GANG_EUSAGE;
}

/* The random model of f's shape in dir; 0 or the generator's error (message printed). */
static int bm_model(const bm_flags *f, const char *dir, gang_model_config *mc)
{
    gang_mkmodel_opts mo;
    char err[512];
    int rc;

    memset(&mo, 0, sizeof(mo));
    mo.out_dir = dir;
    mo.arch = GANG_ARCH_QWEN3;
    mo.moe = GANG_MOE_QWEN3;
    mo.layers = (uint32_t)f->layers;
    mo.hidden = (uint32_t)f->hidden;
    mo.heads = (uint32_t)f->heads;
    mo.kv_heads = (uint32_t)f->kv_heads;
    mo.head_dim = (uint32_t)f->head_dim;
    mo.ffn = (uint32_t)f->moe_ffn;
    mo.moe_ffn = (uint32_t)f->moe_ffn;
    mo.experts = (uint32_t)f->experts;
    mo.top_k = (uint32_t)f->top_k;
    mo.norm_topk = 1;
    mo.vocab = (uint32_t)f->vocab;
    mo.max_pos = (uint32_t)(f->prompt + f->tokens + 16);
    mo.seed = 25;
    mo.dtype = GANG_DTYPE_F32;
    mo.shards = 1;
    rc = gang_mkmodel(&mo, err, sizeof(err));
    if (rc == 0)
        rc = gang_model_config_read(dir, mc, err, sizeof(err));
    if (rc != 0)
        fprintf(stderr, "ganglion bench moe: %s\n", err);
    return rc;
}

/* The "moe" line of one point that ran: the all-to-all's time and share of a step. */
static void bm_line(const bm_flags *f, uint32_t ep, uint32_t tp, uint32_t batch,
                    const bd_result *res, double *max_bytes)
{
    gang_moe_timing t;
    cJSON *line = gang_report_new("moe");
    double per_call_a2a, per_call_block, steps_calls, bytes;
    /* res->decode_ms is an iteration's whole decode phase: tokens - 1 steps. */
    double step_ms = res->decode_ms / (double)(f->tokens - 1);

    gang_tp_moe_timing_get(&t);
    if (line == NULL)
        return;
    /* Every rank runs every layer once per decode step: calls / (ep x layers) steps. */
    steps_calls = t.calls > 0 ? (double)t.calls : 1.0;
    per_call_a2a = (double)t.a2a_ns / steps_calls / 1e6;
    per_call_block = (double)t.block_ns / steps_calls / 1e6;
    bytes = (double)batch * (double)f->top_k * (double)f->hidden * sizeof(float) / ep;
    if (ep > 1 && bytes > *max_bytes)
        *max_bytes = bytes;
    cJSON_AddNumberToObject(line, "ep", ep);
    cJSON_AddNumberToObject(line, "tp", tp);
    cJSON_AddNumberToObject(line, "batch", batch);
    cJSON_AddNumberToObject(line, "experts", (double)f->experts);
    cJSON_AddNumberToObject(line, "top_k", (double)f->top_k);
    cJSON_AddNumberToObject(line, "decode_tokens_per_s", res->decode_tps);
    cJSON_AddNumberToObject(line, "decode_step_ms", step_ms);
    cJSON_AddNumberToObject(line, "moe_calls_timed", (double)t.calls);
    cJSON_AddNumberToObject(line, "a2a_ms_per_step", per_call_a2a * (double)f->layers);
    cJSON_AddNumberToObject(line, "moe_ms_per_step", per_call_block * (double)f->layers);
    cJSON_AddNumberToObject(line, "a2a_share_of_step",
                            step_ms > 0 ? per_call_a2a * (double)f->layers / step_ms : 0.0);
    cJSON_AddNumberToObject(line, "a2a_bytes_per_rank", ep > 1 ? bytes : 0.0);
    gang_report_emit(line);
}

/* The options of the decode points: bench decode's random-model path on dir. */
static void bm_decode_opts(const bm_flags *f, const gang_model_config *mc, const char *dir,
                           bd_opts *o)
{
    memset(o, 0, sizeof(*o));
    o->layers = mc->n_layers;
    o->hidden = mc->hidden;
    o->heads = mc->n_heads;
    o->kv_heads = mc->n_kv_heads;
    o->ffn = mc->ffn;
    o->vocab = mc->vocab;
    o->prompt = (uint32_t)f->prompt;
    o->tokens = (uint32_t)f->tokens;
    o->iters = (uint32_t)f->iters;
    o->warmup = (uint32_t)f->warmup;
    o->microbatches = 1;
    o->timeout_s = (uint32_t)f->timeout_s;
    gang_strlcpy(o->dir, dir, sizeof(o->dir));
}

/* bench alltoall on ep ranks up to max_bytes (at least its smallest size). */
static int bm_alltoall(uint32_t ep, double max_bytes, int no_peer)
{
    char ranks[16], maxb[32];
    char *argv[8];
    int n = 0;

    snprintf(ranks, sizeof(ranks), "%u", ep);
    snprintf(maxb, sizeof(maxb), "%.0f", max_bytes < 4096 ? 4096.0 : max_bytes);
    argv[n++] = "alltoall";
    argv[n++] = "--ranks";
    argv[n++] = ranks;
    argv[n++] = "--max-bytes";
    argv[n++] = maxb;
    if (no_peer)
        argv[n++] = "--no-peer";
    argv[n] = NULL;
    return gang_bench_alltoall_main(n, argv);
}

int gang_bench_moe_main(int argc, char **argv)
{
    bm_flags f;
    bd_opts o;
    gang_model_config mc;
    bd_result base[BD_MAX_BATCHES], res;
    uint32_t eps[BM_MAX_EP], batches[BD_MAX_BATCHES], n_ep = 0, n_b = 0, failed = 0;
    char dir[64] = "/tmp/ganglion-bench-moe-XXXXXX", path[128];
    double max_bytes = 0.0;
    int rc = gang_opts_cli(&bm_cmd, &f, argc, argv, NULL, NULL);

    if (rc != 0)
        return rc == GANG_OPTS_HELP ? GANG_EXIT_OK : GANG_EXIT_USAGE;
    if (bm_list(f.batch, batches, BD_MAX_BATCHES, &n_b) != 0 ||
        bm_list(f.ep, eps, BM_MAX_EP, &n_ep) != 0 || eps[0] != 1) {
        gang_opts_usage_error(&bm_cmd, "--batch and --ep are lists of positive integers (at most "
                                       "8 and 3 entries; --ep starts with 1, each <= 4)");
        return GANG_EXIT_USAGE;
    }
    for (uint32_t i = 0; i < n_ep; i++)
        if (eps[i] > BD_MAX_RANKS || f.experts % eps[i] != 0 || f.heads % eps[i] != 0) {
            gang_opts_usage_error(&bm_cmd, "--ep %u: at most %d, dividing --experts and --heads",
                                  eps[i], BD_MAX_RANKS);
            return GANG_EXIT_USAGE;
        }
    if (mkdtemp(dir) == NULL) {
        fprintf(stderr, "ganglion bench moe: cannot create a temporary directory\n");
        return GANG_EXIT_INTERNAL;
    }
    rc = bm_model(&f, dir, &mc);
    memset(base, 0, sizeof(base));
    for (uint32_t e = 0; rc == 0 && e < n_ep; e++) {
        for (uint32_t b = 0; b < n_b; b++) {
            /* EP = TP, then (--replicated) TP 1 on the same EP ranks, interleaved. */
            for (uint32_t v = 0; v < (f.replicated && eps[e] > 1 ? 2u : 1u); v++) {
                uint32_t tp = v == 0 ? eps[e] : 1;
                bm_decode_opts(&f, &mc, dir, &o);
                o.load.ep = eps[e];
                o.no_agree = 0;
                gang_tp_moe_timing_reset(batches[b]);
                int prc =
                    gang__bd_point(&o, &mc, tp, 1, batches[b], 0, e == 0 ? NULL : &base[b], &res);
                if (prc == 0)
                    bm_line(&f, eps[e], tp, batches[b], &res, &max_bytes);
                failed += prc != 0;
                if (e == 0 && prc == 0)
                    base[b] = res;
                else
                    free(res.dec);
            }
        }
    }
    gang_tp_moe_timing_reset(0);
    for (uint32_t e = 0; rc == 0 && e < n_ep; e++)
        if (eps[e] > 1 && bm_alltoall(eps[e], max_bytes, f.no_peer) != GANG_EXIT_OK)
            failed++;
    for (uint32_t b = 0; b < n_b; b++)
        free(base[b].dec);
    snprintf(path, sizeof(path), "%s/config.json", dir);
    unlink(path);
    snprintf(path, sizeof(path), "%s/model.safetensors", dir);
    unlink(path);
    rmdir(dir);
    if (rc != 0)
        return gang_exit_code_for(rc);
    return failed ? GANG_EXIT_INTERNAL : GANG_EXIT_OK;
}
