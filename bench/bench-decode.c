/*
 * Decode benchmark: `ganglion bench decode`, prefill and decode tokens/s of the generation
 * engine on the CPU for TP x PP in {1x1, 2x1, 1x2, 2x2}, batch 1 and 8, the ranks as
 * threads of this process over the socket communicator.
 *
 * --device cuda (issue #6): the same points on one GPU for a random model of the
 * Llama-3.2-1B shape (16 layers, hidden 2048, 32 heads, 8 kv heads, ffn 8192, vocab
 * 32000: 1.04 G parameters) built in memory, batch 1 and 64, layouts 1x1 and TP=2 (two
 * ranks, each with its own "cuda" handle on device 0, over the socket backend: the
 * all-reduces are staged through the host, which exercises the sharded kernels on the
 * device; tokens_match_1x1 checks them), for every weight storage of --dtypes (issue #13:
 * f32, bf16, f16, int8; default all but f16), the points of each storage compared with
 * that storage's 1x1. --shape 8b: Llama-3-8B's shape (32 layers, hidden 4096, 32 heads, 8
 * kv heads, ffn 14336, vocab 128256: 8.03 G parameters), bf16, 1x1 (decode-gpu.c builds
 * it layer by layer, so host memory stays at a few layers). Before the points it
 * measures the device-to-device copy bandwidth (gang_kernels_copy of --bw-mib, 1 GiB; read +
 * write bytes over the time, median of 10) and reports, per line, the HBM roofline
 *   roofline_tok_s = batch x bandwidth / bytes read per decode step
 * (the weights: the bytes the ranks store, m->weight_bytes in the point's storage, less
 * the embedding table, of which a step gathers one row per sequence; and the KV cache,
 * kv_bytes_per_step = batch x (prompt + tokens / 2) x layers x 2 x kv_heads x head_dim x
 * the cache element's bytes, < 1% at batch 1 at the default 32-token prompt, most of a
 * step at batch 8 and a 4K context) and roofline_ratio = decode_tok_s / roofline_tok_s.
 * The target is a batch-1 ratio of at least 0.7 for the 8B shape in bf16 (a
 * "summary" line per storage says whether the 1x1 batch-1 point meets it). Without a GPU:
 * one "skipped" line, exit 0.
 *
 * With NCCL built, --device cuda adds an nccl point: 1x1 with its TP group on a one-rank
 * nccl communicator (bench/decode-nccl.h), so every layer's two all-reduces go through
 * NCCL on the GPU; decode_step_overhead_ms_vs_1x1 on it is the NCCL data path's cost per
 * decode step, on the TP=2 point the cost of the second rank and its host staging. With
 * two GPUs or more, --layouts 2x1-nccl (TPx1-nccl) runs TP ranks on as many GPUs with
 * their TP group over NCCL, as `serve --backend nccl` does: the all-reduces inside the
 * decode step's graph.
 *
 * --model PATH (issue #13, bench/decode-model.c): the same points on a real model (a
 * Hugging Face directory or a .gguf file) for every weight storage of --dtypes, with the
 * roofline against the machine's read bandwidth measured in the same run, then the
 * transformers peer (bench/hf-decode.py, decode-peer.c) and the ratio and target lines.
 * The --device cuda and fake paths live in bench/decode-gpu.c; bench/decode.h is the map.
 *
 * --device fake: the --device cuda path (in-memory model moved to the device, engine on
 * device memory, a 16 MiB copy instead of 1 GiB) on the fake test device of
 * kernels/fake/, whose memory the host cannot read: a CPU test (bench-decode-fake) that
 * the benchmark keeps to the host/device boundary. Its figures measure nothing.
 *
 * Model: a random model of the given shape written once by gang_mkmodel into a
 * temporary directory and loaded per rank with gang_model_load (so the loader's shards are
 * what runs). Point (tp, pp, batch): rank 0 submits `batch` greedy requests of --prompt
 * tokens and --tokens new tokens each, with max_step_tokens = batch x prompt, so that
 *
 *   step 1            prefills every prompt (and samples each request's first token),
 *   steps 2 .. N      decode one token of every request each,
 *
 * and after N = --tokens steps every request is done. Every rank runs exactly N steps per
 * iteration (the plan tells the others what to do; the count keeps them in lockstep).
 * Rank 0 times the first step (prefill: batch x prompt tokens) and the rest (decode:
 * batch x (N - 1) tokens). --warmup untimed iterations, then --iters timed ones; the line
 * reports the medians, and ratios against the 1x1 point of the same batch measured in the
 * same run (nccl-tests style: compare against the peer in the same run).
 *
 * Agreement with 1x1, judged by the logits (bench/decode-agree.h): after the timed
 * iterations every point runs one more, untimed, whose requests ask for raw logprobs
 * (GANG_AGREE_TOP candidates per decision); each layout's decisions are compared with
 * 1x1's from the same context: top1_agreement (the share of equal tokens),
 * max_abs_logprob_diff, and logits_match_1x1, false only when a token differs where
 * 1x1's top-2 gap was above gap_tol (BD_GAP_TOL): two layouts sum in different orders, so
 * a near-tie may flip, and a flip is a failure only where no rounding explains it.
 * tokens_match_1x1 (every token equal) is still reported.
 *
 * On a small CPU the TP and PP layouts cost more than 1x1 (the "ranks" share cores, and
 * every layer adds two all-reduces over loopback sockets); the numbers measure the
 * engine's and the communicator's overhead, not GPU scaling.
 *
 * Every wait has a deadline: every engine step takes --timeout-s; a rank that fails
 * aborts every communicator of the point, so the others return promptly.
 */
#include <ftw.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "bench.h"
#include "decode-agree.h"
#include "decode-nccl.h"
#include "decode.h"
#include "report.h"
#include "ganglion/comm.h"
#include "ganglion/common.h"
#include "ganglion/engine.h"

#define BD_MAX_ITERS 1000
#define BD_HOST "127.0.0.1"
#define BD_INIT_TIMEOUT_MS 20000

/* One point: shared by its rank threads. */
typedef struct bd_run {
    const bd_opts *o;
    uint32_t tp, pp, batch;
    uint32_t stage; /* ranks per stage: tp, or the EP group's o->load.ep when wider */
    int nccl;       /* the TP group over nccl: 1x1 with a one-rank group, or TPx1 */
    uint8_t nccl_id[GANG_BOOTSTRAP_NCCL_HEX]; /* nccl: the point's unique id */
    size_t nccl_id_len;
    char blob[256];
    size_t blob_len;
    gang_comm_listener *listener;
    gang_topology topo;
    double *prefill_ms, *decode_ms; /* [iters], written by rank 0 */
    gang__decision *dec;            /* [batch x tokens] of the agreement iteration, rank 0 */
    pthread_mutex_t lock;
    gang_comm *comms[BD_MAX_RANKS][4]; /* lock: live communicators, for abort */
    int aborted;                       /* lock */
    int rc;                            /* lock: first error */
    char why[256];                     /* lock */
    char load_err[256];                /* lock: --model: the loader's message (refusals) */
    double weight_bytes, stream_bytes; /* lock: --model, cuda: summed over the ranks */
    int model_kept;                    /* cuda: the previous one-rank point's model reused */
    int built;                         /* lock, cuda: rank 0 built its model (build) */
    bd_build_stats build;              /* lock, cuda: how rank 0 built it */
    size_t kv_elem_bytes;              /* lock: bytes of one element of the KV cache */
    /* Each rank's kernels counters over the decode steps (all but the first step) of the
     * timed iterations, and how many steps that was; written by the rank's own thread. */
    gang_kernels_counters steps_cnt[BD_MAX_RANKS];
    uint64_t n_steps[BD_MAX_RANKS];
    /* --trace-kernels, a one-rank point: the kernels of those decode steps (rank 0's). */
    int traced; /* 1: trace holds them; 0: not traced; < 0: collect failed */
    gang_kernels_trace trace;
} bd_run;

typedef struct bd_rank {
    bd_run *run;
    uint32_t rank;
    pthread_t th;
} bd_rank;

/* Where `ganglion bench decode --model` finds its peer script (CMake sets the source
 * tree's bench/ folder; --peer-script overrides it). */
#ifndef GANG_BENCH_DIR
#define GANG_BENCH_DIR "bench"
#endif

/*
 * The flags: name, field, CPU default, CUDA default (--device cuda: the Llama-3.2-1B
 * shape, vocab 32000 rather than 128256, see the file comment), --model default (the
 * shape flags are then unused: the model's config gives it), --shape 8b default (cuda:
 * Llama-3-8B's shape), bounds, help.
 */
#define BD_INT_FLAGS(X)                                                                            \
    X("layers", layers, 4, 16, 4, 32, 1, 256, "decoder layers")                                    \
    X("hidden", hidden, 256, 2048, 256, 4096, 8, 16384, "hidden size")                             \
    X("heads", heads, 8, 32, 8, 32, 1, 256, "attention heads")                                     \
    X("kv-heads", kv_heads, 4, 8, 4, 8, 1, 256, "key/value heads")                                 \
    X("ffn", ffn, 512, 8192, 512, 14336, 2, 65536, "MLP size")                                     \
    X("vocab", vocab, 2048, 32000, 2048, 128256, 2, 1 << 20, "vocabulary")                         \
    X("prompt", prompt, 32, 32, 32, 32, 1, 8192, "prompt tokens per request")                      \
    X("tokens", tokens, 16, 64, 32, 32, 2, 8192, "new tokens per request")                         \
    X("microbatches", microbatches, 1, 1, 1, 1, 1, 256, "pipeline microbatches")                   \
    X("cuda-graphs", cuda_graphs, 1, 1, 1, 1, 0, 1,                                                \
      "cuda: decode steps as CUDA graphs (serve's --cuda-graphs)")                                 \
    X("half-gemv", half_gemv, 1, 1, 1, 1, 0, 1,                                                    \
      "cuda: bf16 / f16 decode products by ganglion's GEMV (1) or cuBLASLt (0)")                   \
    X("cuda-pdl", cuda_pdl, 0, 0, 0, 0, 0, 1,                                                      \
      "cuda: the decode GEMVs as programmatic dependent launches (Hopper's PDL)")                  \
    X("fuse-residual", fuse_residual, 1, 1, 1, 1, 0, 1,                                            \
      "cuda: norms and residual adds in the decode products (1) or kernels of their own (0)")      \
    X("trace-kernels", trace_kernels, 0, 0, 0, 0, 0, 1,                                            \
      "cuda: the one-rank points' decode steps traced kernel by kernel (CUPTI)")                   \
    X("nccl-wait-each", nccl_wait_each, 0, 0, 0, 0, 0, 1,                                          \
      "cuda: the nccl point awaits each collective on the host, without graphs (before #24)")      \
    X("iters", iters, 3, 3, 3, 3, 1, BD_MAX_ITERS, "timed iterations per point")                   \
    X("warmup", warmup, 1, 1, 1, 1, 0, BD_MAX_ITERS, "untimed iterations first")                   \
    X("timeout-s", timeout_s, 120, 120, 300, 300, 1, 86400, "deadline of every engine step")       \
    X("gpu-memory-mb", gpu_pool_mb, 16384, 16384, 16384, 24576, 256, 1 << 22,                      \
      "cuda: each rank's pool")                                                                    \
    X("bw-mib", bw_mib, 1024, 1024, 1024, 1024, 1, 1 << 20,                                        \
      "MiB of the bandwidth measurement (--model: read; cuda: device copy; fake: <= 16)")          \
    X("bw-passes", bw_passes, 7, 7, 7, 7, 1, 1000, "--model: timed passes over that buffer")       \
    X("peer-iters", peer_iters, 1, 1, 1, 1, 1, BD_MAX_ITERS,                                       \
      "--model: timed iterations of each transformers point")                                      \
    X("peer-timeout-s", peer_timeout_s, 3600, 3600, 3600, 3600, 1, 86400,                          \
      "--model: deadline of the whole transformers peer")                                          \
    X("peer-budget-s", peer_budget_s, 300, 300, 300, 300, 1, 86400,                                \
      "--model: seconds one transformers iteration may take (hf-decode.py --budget-s)")

/* The command line; INT fields as the option tables hold them. */
typedef struct bd_flags {
#define BD_FIELD(f_, fld, dc, dg, dm, d8, l, h, hp) int64_t fld;
    BD_INT_FLAGS(BD_FIELD)
#undef BD_FIELD
    char batch[128];
    char device[8];
    char model[BD_PATH_MAX];
    char dtypes[64];
    char layouts[64];
    char shape[8];
    char variants[64];
    char peer_python[BD_PATH_MAX];
    char peer_script[BD_PATH_MAX];
    int no_peer;
} bd_flags;

#define BD_ITEM(f_, fld, d, l, h, hp) GANG_OPT_INT(bd_flags, f_, fld, #d, l, h, hp),
#define BD_CPU(f_, fld, dc, dg, dm, d8, l, h, hp) BD_ITEM(f_, fld, dc, l, h, hp)
#define BD_GPU(f_, fld, dc, dg, dm, d8, l, h, hp) BD_ITEM(f_, fld, dg, l, h, hp)
#define BD_MODEL(f_, fld, dc, dg, dm, d8, l, h, hp) BD_ITEM(f_, fld, dm, l, h, hp)
#define BD_GPU8(f_, fld, dc, dg, dm, d8, l, h, hp) BD_ITEM(f_, fld, d8, l, h, hp)
#define BD_STR(f_, fld, d, hp) GANG_OPT_STR(bd_flags, f_, fld, d, hp),
/* The storage, layout and shape flags, in every table, with that table's defaults. */
#define BD_MODEL_FLAGS(dtypes_, layouts_)                                                          \
    BD_STR("model", model, "",                                                                     \
           "a real model (Hugging Face directory or .gguf) instead of the random one")             \
    BD_STR("dtypes", dtypes, dtypes_,                                                              \
           "--model, cuda, fake: weight storages (auto: --dtype auto, a GGUF file's own blocks; "  \
           "f32, bf16, f16; int8 = --quantize int8)")                                              \
    BD_STR("layouts", layouts, layouts_,                                                           \
           "--model: TPxPP layouts, comma-separated, 1x1 first; cuda / fake: also nccl (1x1 "      \
           "with a one-rank nccl TP group) and TPx1-nccl (TP ranks on as many GPUs over nccl)")    \
    BD_STR("shape", shape, "1b",                                                                   \
           "cuda / fake: 1b (the defaults above) or 8b (Llama-3-8B: 32 layers, hidden 4096, 32 "   \
           "heads, 8 kv heads, ffn 14336, vocab 128256; --dtypes bf16, --layouts 1x1, "            \
           "--tokens 32, --gpu-memory-mb 24576)")                                                  \
    BD_STR("variants", variants, "",                                                               \
           "cuda / fake: the 1x1 point of every batch again with one launch choice changed, on "   \
           "the same model: pdl (--cuda-pdl 1), unfused (--fuse-residual 0), cublas "              \
           "(--half-gemv 0), comma-separated")                                                     \
    BD_STR("peer-python", peer_python, "/opt/ganglion-ref-venv/bin/python",                        \
           "--model: the reference Python (scripts/fetch-reference.sh)")                           \
    BD_STR("peer-script", peer_script, GANG_BENCH_DIR "/hf-decode.py",                             \
           "--model: the transformers peer script")                                                \
    GANG_OPT_BOOL(bd_flags, "no-peer", no_peer, "0", "--model: skip the transformers peer"),
static const gang_param_info bd_cpu_items[] = {
    BD_INT_FLAGS(BD_CPU) BD_STR("batch", batch, "1,8", "batch sizes, comma-separated")
        BD_STR("device", device, "cpu",
               "cpu, cuda (the Llama-3.2-1B shape, see above) or fake (the cuda path on the "
               "fake test device)") BD_MODEL_FLAGS("f32,bf16,int8", "1x1")};
static const gang_param_info bd_gpu_items[] = {
    BD_INT_FLAGS(BD_GPU) BD_STR("batch", batch, "1,64", "batch sizes, comma-separated")
        BD_STR("device", device, "cpu", "cpu, cuda or fake")
            BD_MODEL_FLAGS("f32,bf16,int8", "1x1,2x1,nccl")};
static const gang_param_info bd_gpu8_items[] = {
    BD_INT_FLAGS(BD_GPU8) BD_STR("batch", batch, "1,64", "batch sizes, comma-separated")
        BD_STR("device", device, "cpu", "cpu, cuda or fake") BD_MODEL_FLAGS("bf16", "1x1")};
static const gang_param_info bd_model_items[] = {
    BD_INT_FLAGS(BD_MODEL) BD_STR("batch", batch, "1,8,32", "batch sizes, comma-separated")
        BD_STR("device", device, "cpu", "cpu") BD_MODEL_FLAGS("f32,bf16,int8", "1x1")};
static const gang_opt_table bd_cpu_table = GANG_OPT_TABLE(bd_cpu_items);
static const gang_opt_table bd_gpu_table = GANG_OPT_TABLE(bd_gpu_items);
static const gang_opt_table bd_gpu8_table = GANG_OPT_TABLE(bd_gpu8_items);
static const gang_opt_table bd_model_table = GANG_OPT_TABLE(bd_model_items);
static const gang_opt_cmd bd_cmd = {
    "bench decode", "[flags]",
    "Prefill / decode tokens/s of the engine for TP x PP in {1x1, 2x1, 1x2, 2x2} (cpu) or\n"
    "1x1 and TP=2 on one GPU (cuda), ranks as threads over the socket communicator.\n"
    "--device cuda: defaults become the Llama-3.2-1B shape (16 layers, hidden 2048, 32\n"
    "heads, 8 kv heads, ffn 8192, vocab 32000), --batch 1,64, --tokens 64, every storage of\n"
    "--dtypes (f32,bf16,int8) x --layouts (1x1,2x1,nccl); --shape 8b: Llama-3-8B's shape.\n"
    "--model DIR: that model (cpu) for every storage of --dtypes and batch (default\n"
    "1,8,32, --tokens 32), the roofline against the machine's read bandwidth, and the\n"
    "transformers peer (bench/hf-decode.py) in the same run, with ratio lines.",
    &bd_cpu_table, 0};

/*
 * Parses argv into o: a first pass reads --device, --shape and --model, which choose the
 * defaults, a second applies every flag over them. Returns 0, GANG_OPTS_HELP or
 * GANG_EUSAGE (printed).
 */
static int bd_parse(int argc, char **argv, bd_opts *o)
{
    bd_flags f;
    char err[256];
    int64_t b[BD_MAX_BATCHES];
    int rc = gang_opts_cli(&bd_cmd, &f, argc, argv, NULL, NULL);

    if (rc != 0)
        return rc;
    rc = gang_opts_choice("device", f.device, "cpu|cuda|fake", err, sizeof(err));
    if (rc < 0)
        return gang_opts_usage_error(&bd_cmd, "%s", err);
    o->cuda = rc != 0;
    o->kdev = rc == 2 ? "fake" : "cuda";
    if (o->cuda && f.model[0] != '\0')
        return gang_opts_usage_error(&bd_cmd, "--model runs on the CPU: not with --device %s",
                                     f.device);
    int shape = gang_opts_choice("shape", f.shape, "1b|8b", err, sizeof(err));
    if (shape < 0)
        return gang_opts_usage_error(&bd_cmd, "%s", err);
    if (shape == 1 && !o->cuda)
        return gang_opts_usage_error(&bd_cmd, "--shape 8b is for --device cuda or fake");
    o->shape = shape == 1 ? "8b" : "1b";
    if (f.trace_kernels && !(o->cuda && strcmp(o->kdev, "cuda") == 0))
        return gang_opts_usage_error(&bd_cmd, "--trace-kernels needs --device cuda");
    if (f.variants[0] != '\0' && !o->cuda)
        return gang_opts_usage_error(&bd_cmd, "--variants is for --device cuda or fake");
    if (o->cuda || f.model[0] != '\0') {
        gang_opt_cmd again = bd_cmd;
        again.table = !o->cuda ? &bd_model_table : shape == 1 ? &bd_gpu8_table : &bd_gpu_table;
        if (gang_opts_cli(&again, &f, argc, argv, NULL, NULL) != 0)
            return GANG_EUSAGE;
    }
    int nb = gang_parse_i64_list(f.batch, 1, 256, b, BD_MAX_BATCHES);
    if (nb <= 0)
        return gang_opts_usage_error(&bd_cmd,
                                     "--batch: '%s' is not a list of 1 to %d sizes "
                                     "in [1, 256]",
                                     f.batch, BD_MAX_BATCHES);
    for (int i = 0; i < nb; i++)
        o->batches[i] = (uint32_t)b[i];
    o->n_batches = (uint32_t)nb;
    memcpy(o->model, f.model, sizeof(o->model));
    memcpy(o->dtypes, f.dtypes, sizeof(o->dtypes));
    memcpy(o->layouts, f.layouts, sizeof(o->layouts));
    memcpy(o->peer_python, f.peer_python, sizeof(o->peer_python));
    memcpy(o->peer_script, f.peer_script, sizeof(o->peer_script));
    o->no_peer = f.no_peer;
#define BD_COPY(f_, fld, dc, dg, dm, d8, l, h, hp) o->fld = (uint32_t)f.fld;
    BD_INT_FLAGS(BD_COPY)
#undef BD_COPY
    o->copy_bytes = (size_t)(strcmp(o->kdev, "fake") == 0 && o->bw_mib > 16 ? 16 : o->bw_mib) << 20;
    if (gang__bd_parse_variants(o, f.variants, err, sizeof(err)) != 0)
        return gang_opts_usage_error(&bd_cmd, "%s", err);
    return 0;
}

/* The median of n values (sorts them). */
static double bd_median(double *v, uint32_t n)
{
    return gang_report_median(v, (int)n);
}

/* Records the point's first failure and aborts every live communicator. */
static void bd_fail(bd_run *r, int rc, const char *what, uint32_t rank)
{
    uint32_t i, j;

    pthread_mutex_lock(&r->lock);
    if (r->rc == 0) {
        r->rc = rc;
        snprintf(r->why, sizeof(r->why), "rank %u: %s: %s", rank, what, gang_err_name(rc));
    }
    r->aborted = 1;
    for (i = 0; i < BD_MAX_RANKS; i++)
        for (j = 0; j < 4; j++)
            if (r->comms[i][j] != NULL)
                gang_comm_abort(r->comms[i][j]);
    pthread_mutex_unlock(&r->lock);
}

/*
 * World, then TP (color its first rank, key tp rank), PP (color the place in the stage,
 * key stage) and, with an EP group wider than TP, the stage's EP group (color stage, key
 * place in it) splits: the worker's (launcher/worker-engine.c).
 */
static int bd_comms(bd_rank *x, gang_comm **c, const char **what)
{
    bd_run *r = x->run;
    gang_comm_config cfg = {.backend = GANG_COMM_SOCKET,
                            .rank = x->rank,
                            .world_size = r->stage * r->pp,
                            .blob = (const uint8_t *)r->blob,
                            .blob_len = r->blob_len,
                            .listener = x->rank == 0 ? r->listener : NULL,
                            .advertise_host = BD_HOST,
                            .timeout_ms = BD_INIT_TIMEOUT_MS};
    uint32_t stage = x->rank / r->stage, ep_rank = x->rank % r->stage, i;
    uint32_t tp_rank = ep_rank % r->tp;
    int rc, aborted;

    *what = "comm init";
    rc = gang_comm_init(&cfg, &c[0]);
    if (rc == 0) {
        *what = "tp split";
        rc = gang_comm_split(c[0], x->rank / r->tp, tp_rank, BD_INIT_TIMEOUT_MS, &c[1]);
    }
    if (rc == 0) {
        *what = "pp split";
        rc = gang_comm_split(c[0], ep_rank, stage, BD_INIT_TIMEOUT_MS, &c[2]);
    }
    if (rc == 0 && r->stage > r->tp) {
        *what = "ep split";
        rc = gang_comm_split(c[0], stage, ep_rank, BD_INIT_TIMEOUT_MS, &c[3]);
    }
    pthread_mutex_lock(&r->lock);
    for (i = 0; i < 4; i++)
        r->comms[x->rank][i] = c[i];
    aborted = r->aborted;
    pthread_mutex_unlock(&r->lock);
    return rc != 0 ? rc : (aborted ? GANG_EABORTED : 0);
}

/* 1 when the point's decode steps are traced: --trace-kernels on a one-rank point. */
static int bd_traces(const bd_run *r)
{
    return r->o->trace_kernels && r->stage * r->pp == 1;
}

/*
 * One iteration on rank x: rank 0 submits the batch, every rank runs `tokens` steps.
 * Warm-up iterations (iter < warmup) are not recorded; timed ones (then --iters of them)
 * have rank 0 time the prefill step and the decode steps; the last one (iter = warmup +
 * iters, untimed) asks for logprobs and records every decision for the agreement with
 * 1x1. Returns 0 or the first error.
 */
static int bd_iteration(bd_rank *x, gang_engine *e, gang_kernels *k, gang_comm **c, int32_t *prompt,
                        int iter, const char **what)
{
    bd_run *r = x->run;
    const bd_opts *o = r->o;
    gang_comm *tp = r->tp > 1 || r->nccl ? c[1] : NULL, *pp = r->pp > 1 ? c[2] : NULL;
    uint64_t t0 = 0, t1 = 0, tmo = (uint64_t)o->timeout_s * 1000u;
    int agree = !o->no_agree && iter == (int)(o->warmup + o->iters);
    int timed = iter >= (int)o->warmup && !agree;
    int trace = timed && bd_traces(r);
    gang_kernels_counters c0, c1;
    gang_gen_request req;
    gang_gen_event ev;
    char err[256];
    uint32_t i, s;
    int rc;

    if (x->rank == 0) {
        for (i = 0; i < r->batch; i++) {
            memset(&req, 0, sizeof(req));
            req.id = (uint64_t)iter * r->batch + i + 1;
            req.prompt = prompt + (size_t)i * o->prompt;
            req.n_prompt = o->prompt;
            req.max_tokens = o->tokens;
            req.sampling.top_p = 1.0f;
            req.sampling.ignore_eos = 1; /* a real model's EOS must not end a request early */
            req.sampling.logprobs = (uint32_t)agree;
            req.sampling.top_logprobs = agree ? GANG_AGREE_TOP : 0;
            *what = "submit";
            rc = gang_engine_submit(e, &req, err, sizeof(err));
            if (rc != 0) {
                fprintf(stderr, "ganglion bench decode: %s\n", err);
                return rc;
            }
        }
    }
    for (s = 0; s < o->tokens; s++) {
        if (s == 0)
            t0 = gang_now_ns();
        *what = "trace begin";
        if (trace && s > 0 && (rc = gang_kernels_trace_begin(k)) != 0)
            return rc;
        *what = "engine step";
        rc = gang_engine_step(e, k, c[0], tp, c[3], pp, tmo);
        if (rc != 0)
            return rc;
        *what = "trace end";
        if (trace && s > 0 && (rc = gang_kernels_trace_end(k)) != 0)
            return rc;
        if (s == 0) {
            t1 = gang_now_ns();
            gang_kernels_counters_get(k, &c0);
        }
        while (x->rank == 0 && gang_engine_poll(e, &ev) == 1) {
            uint64_t seq = (ev.id - 1) % r->batch;

            if (agree && ev.kind == GANG_GEN_TOKEN && ev.index < o->tokens) {
                gang__decision *d = &r->dec[seq * o->tokens + ev.index];

                d->token = ev.token;
                d->n_top = ev.n_top < GANG_AGREE_TOP ? ev.n_top : GANG_AGREE_TOP;
                memcpy(d->ids, ev.top_ids, d->n_top * sizeof(int32_t));
                memcpy(d->lps, ev.top_logprobs, d->n_top * sizeof(float));
            }
        }
    }
    if (timed && o->tokens > 1) {
        gang_kernels_counters *a = &r->steps_cnt[x->rank];

        gang_kernels_counters_get(k, &c1);
        a->host_syncs += c1.host_syncs - c0.host_syncs;
        a->launches += c1.launches - c0.launches;
        a->allocs += c1.allocs - c0.allocs;
        a->h2d_bytes += c1.h2d_bytes - c0.h2d_bytes;
        a->d2h_bytes += c1.d2h_bytes - c0.d2h_bytes;
        r->n_steps[x->rank] += o->tokens - 1;
    }
    if (x->rank == 0) {
        if (gang_engine_pending(e) != 0) {
            *what = "requests left after the last step";
            return GANG_EINTERNAL;
        }
        if (iter >= (int)o->warmup && !agree) {
            r->prefill_ms[iter - o->warmup] = (double)(t1 - t0) / 1e6;
            r->decode_ms[iter - o->warmup] = (double)(gang_now_ns() - t1) / 1e6;
        }
    }
    return 0;
}

/* Thread of one rank: comms, shard, engine, warm-up and timed iterations. */
/* An nccl point: c[1] becomes the TP group over nccl (split from *nworld). */
static int bd_use_nccl(bd_rank *x, gang_kernels *k, gang_comm **c, gang_comm **nworld)
{
    bd_run *r = x->run;
    gang_comm *tp = NULL;
    int rc = gang__decode_nccl_tp(k, r->nccl_id, r->nccl_id_len, x->rank, r->tp, BD_INIT_TIMEOUT_MS,
                                  (int)r->o->nccl_wait_each, nworld, &tp);

    if (rc != 0)
        return rc;
    pthread_mutex_lock(&r->lock);
    gang_comm_free(c[1]);
    c[1] = r->comms[x->rank][1] = tp;
    pthread_mutex_unlock(&r->lock);
    return 0;
}

void gang__bd_engine_setup(const bd_opts *o, uint32_t ranks, uint32_t batch, gang_engine_setup *out)
{
    memset(out, 0, sizeof(*out));
    out->max_batch = batch;
    out->max_ctx = o->prompt + o->tokens;
    out->microbatches = o->microbatches < batch ? o->microbatches : batch;
    out->max_step_tokens = batch * o->prompt;
    out->kv_cache_bytes = 0; /* serve's default: sized from free memory */
    out->kv_dtype_auto = 1;  /* serve's default: --kv-cache-dtype auto */
    out->kv_dtype = GANG_DTYPE_F32;
    out->prefix_caching = 0; /* distinct prompts: nothing to share */
    out->cuda_graphs = o->cuda_graphs;
    out->ranks_per_host = ranks;
}

/*
 * The rank's kernels handle: with keeps (a one-rank point of the cuda path) the handle and
 * model the storage's previous one-rank point kept (bd_gpu_keep), taken out of the keep
 * (*m set, r->model_kept) and given this point's launch choices (a --variants point's, or
 * the flags' again after one); otherwise a new handle (*m stays NULL). Returns 0 or an
 * error (*k and *m set all the same: the caller releases them).
 */
static int bd_rank_kernels(bd_rank *x, int keeps, gang_kernels **k, gang_model **m)
{
    bd_run *r = x->run;
    const bd_opts *o = r->o;
    gang_kernels_options ko;

    if (!o->cuda)
        return gang_kernels_open("cpu", k);
    gang_kernels_options_init(&ko);
    ko.device = o->kdev;
    ko.device_index = r->nccl ? (int)x->rank : 0; /* NCCL: one GPU per rank */
    ko.pool_mb = o->gpu_pool_mb;
    ko.half_gemv = (int)o->half_gemv;
    ko.pdl = (int)o->cuda_pdl;
    ko.fuse_residual = (int)o->fuse_residual;
    ko.trace = (int)o->trace_kernels; /* CUPTI enabled before any graph; spans: bd_traces */
    if (keeps && o->keep->m != NULL) {
        *k = o->keep->k, *m = o->keep->m;
        o->keep->k = NULL, o->keep->m = NULL;
        r->model_kept = 1; /* the only rank of the point: no lock needed */
        return gang_kernels_retune(*k, &ko);
    }
    return gang_kernels_open_opts(&ko, k);
}

/*
 * The rank's model: on the cuda path the one the keep handed over (*m already set) or a
 * new draw on k (gang__bd_gpu_model, rank 0's build recorded), otherwise the model the
 * flags name loaded on the CPU; its stored and streamed bytes added to the point's.
 * Returns 0 or the error (a load's message printed, or kept for a refusal's line).
 */
static int bd_rank_model(bd_rank *x, gang_kernels *k, gang_model **mp)
{
    bd_run *r = x->run;
    const bd_opts *o = r->o;
    char err[512];
    int rc = 0;

    if (o->cuda) {
        const int draw = *mp == NULL;
        bd_build_stats st;

        if (draw)
            rc = gang__bd_gpu_model(o, &r->topo, x->rank, k, mp, &st);
        pthread_mutex_lock(&r->lock);
        if (rc == 0 && draw && x->rank == 0)
            r->built = 1, r->build = st;
        if (rc == 0) {
            r->weight_bytes += (double)(*mp)->weight_bytes;
            r->stream_bytes += gang__bd_stream_bytes(*mp);
        }
        pthread_mutex_unlock(&r->lock);
    } else {
        rc = gang_model_load_ex(o->model[0] ? o->model : o->dir, &r->topo, x->rank,
                                o->model[0] || o->load.ep > 1 ? &o->load : NULL, mp, err,
                                sizeof(err));
        pthread_mutex_lock(&r->lock);
        if (rc != 0 && r->load_err[0] == '\0')
            gang_strlcpy(r->load_err, err, sizeof(r->load_err));
        if (rc == 0 && o->model[0]) {
            r->weight_bytes += (double)(*mp)->weight_bytes;
            r->stream_bytes += gang__bd_stream_bytes(*mp);
        }
        pthread_mutex_unlock(&r->lock);
        if (rc != 0 && rc != GANG_ENOSYS)
            fprintf(stderr, "ganglion bench decode: %s\n", err);
    }
    return rc;
}

static void *bd_rank_main(void *arg)
{
    bd_rank *x = arg;
    bd_run *r = x->run;
    const bd_opts *o = r->o;
    gang_engine_setup es;
    gang_engine_config cfg;
    gang_comm *c[4] = {NULL, NULL, NULL, NULL}, *nworld = NULL;
    gang_model *m = NULL;
    gang_engine *e = NULL;
    gang_kernels *k = NULL;
    int32_t *prompt = NULL;
    const char *what = "init";
    char err[512];
    uint32_t i, it;
    int rc, keeps = 0;

    rc = bd_comms(x, c, &what);
    if (rc != 0)
        goto out_fail;
    what = "kernels";
    keeps = o->cuda && o->keep != NULL && r->stage * r->pp == 1;
    rc = bd_rank_kernels(x, keeps, &k, &m);
    if (rc != 0)
        goto out_fail;
    what = "nccl tp group";
    if (r->nccl && (rc = bd_use_nccl(x, k, c, &nworld)) != 0)
        goto out_fail;
    what = "model";
    rc = bd_rank_model(x, k, &m);
    if (rc != 0)
        goto out_fail;
    what = "engine init";
    /* The engine `serve` sets up for these weights (its defaults: the cache type of the
     * weights, the KV budget from free memory). */
    gang__bd_engine_setup(o, r->stage * r->pp, r->batch, &es);
    /* A host wait per collective cannot sit inside a captured graph: the nccl point with
     * --nccl-wait-each runs its kernels one by one, as every step did before issue #24. */
    if (r->nccl && o->nccl_wait_each)
        es.cuda_graphs = 0;
    rc = gang_engine_setup_init(&es, m, k, &e, &cfg, err, sizeof(err));
    pthread_mutex_lock(&r->lock);
    r->kv_elem_bytes = gang_dtype_size(cfg.kv_dtype);
    pthread_mutex_unlock(&r->lock);
    if (rc != 0) {
        fprintf(stderr, "ganglion bench decode: %s\n", err);
        goto out_fail;
    }
    prompt = malloc((size_t)r->batch * o->prompt * sizeof(int32_t));
    if (prompt == NULL) {
        rc = GANG_ENOMEM;
        goto out_fail;
    }
    /* Different prompts per sequence, the same ones on every layout. */
    for (i = 0; i < r->batch * o->prompt; i++)
        prompt[i] = (int32_t)(((uint64_t)i * 2654435761u + 17) % o->vocab);
    for (it = 0; it < o->warmup + o->iters + (o->no_agree ? 0 : 1); it++) { /* + agreement */
        rc = bd_iteration(x, e, k, c, prompt, (int)it, &what);
        if (rc != 0)
            goto out_fail;
    }
    if (bd_traces(r)) { /* a failed collect is reported in the line, not a failed point */
        rc = gang_kernels_trace_collect(k, &r->trace);
        r->traced = rc == 0 ? 1 : rc;
    }
    /* Keep the sockets until every rank is done with them. */
    what = "closing barrier";
    rc = gang_comm_barrier(c[0], (uint64_t)o->timeout_s * 1000u);
    if (rc == 0) {
        if (keeps) { /* kept for the next one-rank point (after the engine is freed) */
            gang_engine_free(e);
            e = NULL;
            o->keep->k = k, o->keep->m = m;
            k = NULL, m = NULL;
        }
        goto out_free;
    }

out_fail:
    bd_fail(r, rc, what, x->rank);
out_free:
    pthread_mutex_lock(&r->lock);
    for (i = 0; i < 4; i++)
        r->comms[x->rank][i] = NULL;
    pthread_mutex_unlock(&r->lock);
    for (i = 4; i-- > 0;)
        gang_comm_free(c[i]);
    gang_comm_free(nworld);
    free(prompt);
    /* Device memory returns to k's pool, so k closes last. */
    gang_engine_free(e);
    gang_model_device_release(m);
    gang_model_free(m);
    gang_kernels_close(k);
    return NULL;
}

/* nftw callback: removes one entry of the temporary model directory (children first). */
static int bd_remove_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    return remove(path);
}

/*
 * The kernels counters of a decode step (issue #24): for each, the largest per-step mean
 * over the point's ranks (the busiest rank sets the step's pace), two decimals.
 */
static void bd_emit_counters(cJSON *line, const bd_run *r)
{
    double v[5] = {0, 0, 0, 0, 0};
    static const char *const names[5] = {"host_syncs_per_step", "launches_per_step",
                                         "allocs_per_step", "h2d_bytes_per_step",
                                         "d2h_bytes_per_step"};

    for (uint32_t i = 0; i < r->stage * r->pp && i < BD_MAX_RANKS; i++) {
        const gang_kernels_counters *c = &r->steps_cnt[i];
        double n = r->n_steps[i] > 0 ? (double)r->n_steps[i] : 1.0;
        double x[5] = {(double)c->host_syncs, (double)c->launches, (double)c->allocs,
                       (double)c->h2d_bytes, (double)c->d2h_bytes};

        for (int j = 0; j < 5; j++)
            if (x[j] / n > v[j])
                v[j] = x[j] / n;
    }
    for (int j = 0; j < 5; j++)
        cJSON_AddNumberToObject(line, names[j], gang_report_round(v[j], 2));
}

/*
 * Prints the line of one point: its shape and, when it ran (rc == 0), the median times,
 * tokens/s, the roofline (cuda) and the ratios against the 1x1 point base; otherwise
 * the error. Fills res's rates.
 */
static void bd_emit_point(const bd_opts *o, bd_run *r, int rc, const bd_result *base,
                          bd_result *res)
{
    cJSON *line = gang_report_new("decode");
    uint32_t batch = r->batch;

    if (line == NULL)
        return;
    cJSON_AddStringToObject(line, "backend", r->nccl ? "nccl" : "socket");
    if (r->nccl)
        cJSON_AddBoolToObject(line, "nccl_wait_each", r->o->nccl_wait_each != 0);
    cJSON_AddStringToObject(line, "device", o->cuda ? o->kdev : "cpu");
    if (o->model[0])
        cJSON_AddStringToObject(line, "model", o->model);
    if (o->model[0] || o->cuda)
        cJSON_AddStringToObject(line, "storage", o->storage);
    if (o->cuda)
        cJSON_AddStringToObject(line, "shape", o->shape);
    if (o->variant != NULL)
        cJSON_AddStringToObject(line, "variant", o->variant);
    cJSON_AddNumberToObject(line, "tp", r->tp);
    if (r->stage > r->tp)
        cJSON_AddNumberToObject(line, "ep", r->stage);
    cJSON_AddNumberToObject(line, "pp", r->pp);
    cJSON_AddNumberToObject(line, "batch", batch);
    cJSON_AddNumberToObject(line, "microbatches",
                            o->microbatches < batch ? o->microbatches : batch);
    cJSON_AddNumberToObject(line, "layers", o->layers);
    cJSON_AddNumberToObject(line, "hidden", o->hidden);
    cJSON_AddNumberToObject(line, "prompt", o->prompt);
    cJSON_AddNumberToObject(line, "tokens", o->tokens);
    cJSON_AddNumberToObject(line, "iters", o->iters);
    if (rc == GANG_ENOSYS && o->model[0] && r->load_err[0]) {
        /* A storage this build (or this model) cannot hold: a finding, not a failure. */
        fprintf(stderr, "ganglion bench decode: %s: refused: %s\n", o->storage, r->load_err);
        cJSON_AddStringToObject(line, "refused", r->load_err);
        res->refused = 1;
        gang_report_emit(line);
        return;
    }
    if (rc != 0) {
        cJSON_AddStringToObject(line, "error", r->why[0] ? r->why : gang_err_name(rc));
        if (r->load_err[0])
            cJSON_AddStringToObject(line, "load_error", r->load_err);
        gang_report_emit(line);
        return;
    }
    double pre = gang_report_add_stats(line, "prefill_ms", r->prefill_ms, (int)o->iters, 3);
    double dec = bd_median(r->decode_ms, o->iters);
    res->decode_ms = dec;
    res->prefill_tps = (double)batch * o->prompt / (pre / 1e3);
    res->decode_tps = o->tokens > 1 ? (double)batch * (o->tokens - 1) / (dec / 1e3) : 0.0;
    cJSON_AddNumberToObject(line, "decode_ms_p50", gang_report_round(dec, 3));
    cJSON_AddNumberToObject(line, "prefill_tok_s", gang_report_round(res->prefill_tps, 1));
    cJSON_AddNumberToObject(line, "decode_tok_s", gang_report_round(res->decode_tps, 1));
    if (o->cuda) {
        bd_emit_counters(line, r);
        cJSON_AddBoolToObject(line, "model_kept", r->model_kept); /* bd_gpu_keep */
        if (r->built)
            gang__bd_emit_build(line, &r->build);
        cJSON_AddBoolToObject(line, "half_gemv", o->half_gemv != 0);
        cJSON_AddBoolToObject(line, "pdl", o->cuda_pdl != 0);
        cJSON_AddBoolToObject(line, "fuse_residual", o->fuse_residual != 0);
        gang__bd_emit_trace(line, r->traced, &r->trace);
    }
    if (o->cuda && o->copy_gbps > 0.0 && r->stream_bytes > 0.0) {
        double kv = gang__bd_kv_bytes_per_step(o, batch, r->kv_elem_bytes);
        double roof = (double)batch * o->copy_gbps * 1e9 / (r->stream_bytes + kv);

        cJSON_AddNumberToObject(line, "weight_bytes", r->weight_bytes);
        cJSON_AddNumberToObject(line, "weight_bytes_per_step", r->stream_bytes);
        cJSON_AddNumberToObject(line, "kv_bytes_per_step", gang_report_round(kv, 0));
        cJSON_AddNumberToObject(line, "copy_GBps", gang_report_round(o->copy_gbps, 1));
        cJSON_AddNumberToObject(line, "roofline_tok_s", gang_report_round(roof, 1));
        cJSON_AddNumberToObject(line, "roofline_ratio",
                                gang_report_round(res->decode_tps / roof, 3));
        res->roofline_ratio = res->decode_tps / roof;
    }
    if (o->model[0]) {
        res->weight_bytes = r->weight_bytes;
        res->stream_bytes = r->stream_bytes;
        res->kv_elem_bytes = r->kv_elem_bytes;
        gang__bd_model_fields(line, o, batch, res);
    }
    if (base != NULL && !o->no_agree) {
        cJSON_AddNumberToObject(line, "prefill_ratio_vs_1x1",
                                gang_report_round(res->prefill_tps / base->prefill_tps, 3));
        cJSON_AddNumberToObject(line, "decode_ratio_vs_1x1",
                                base->decode_tps > 0.0
                                    ? gang_report_round(res->decode_tps / base->decode_tps, 3)
                                    : 0.0);
        if (o->tokens > 1)
            cJSON_AddNumberToObject(
                line, "decode_step_overhead_ms_vs_1x1",
                gang_report_round((dec - base->decode_ms) / (double)(o->tokens - 1), 4));
        gang__decode_agree_emit(line, base->dec, res->dec, batch, o->tokens,
                                o->gap_tol > 0.0 ? o->gap_tol : BD_GAP_TOL);
    }
    gang_report_emit(line);
}

/*
 * Measures one (tp, pp, batch) point and prints its line. base is the 1x1 result of the
 * same batch (NULL for the 1x1 point itself). Returns 0 or the error of the point.
 */
int gang__bd_point(const bd_opts *o, const gang_model_config *mc, uint32_t tp, uint32_t pp,
                   uint32_t batch, int nccl, const bd_result *base, bd_result *res)
{
    bd_run r;
    bd_rank ranks[BD_MAX_RANKS];
    char err[256];
    gang_topology_config tc;
    uint32_t i, stage = o->load.ep > tp ? o->load.ep : tp, n = stage * pp, started = 0;
    int rc;

    memset(&r, 0, sizeof(r));
    memset(res, 0, sizeof(*res));
    r.o = o;
    r.tp = tp;
    r.pp = pp;
    r.stage = stage;
    r.batch = batch;
    r.nccl = nccl;
    pthread_mutex_init(&r.lock, NULL);
    /* A stage is the TP group, or the EP group of o->load.ep ranks when it is wider. */
    memset(&tc, 0, sizeof(tc));
    gang_model_topology_config(mc, &tc);
    tc.nnodes = (int32_t)pp;
    tc.nproc_per_node = (int32_t)stage;
    tc.tp = (int32_t)tp;
    tc.pp = (int32_t)pp;
    tc.ep = (int32_t)o->load.ep;
    rc = n > BD_MAX_RANKS ? GANG_EINVAL : gang_topology_init(&tc, &r.topo, err, sizeof(err));
    if (rc == GANG_EINVAL)
        snprintf(err, sizeof(err), "%u ranks: at most %d", n, BD_MAX_RANKS);
    if (rc != 0) {
        snprintf(r.why, sizeof(r.why), "topology: %s", err);
        goto out_line;
    }
    r.prefill_ms = calloc(o->iters, sizeof(double));
    r.decode_ms = calloc(o->iters, sizeof(double));
    res->dec = calloc((size_t)batch * o->tokens, sizeof(gang__decision));
    r.dec = res->dec;
    if (r.prefill_ms == NULL || r.decode_ms == NULL || res->dec == NULL) {
        rc = GANG_ENOMEM;
        goto out_line;
    }
    if (nccl &&
        (rc = gang_comm_nccl_unique_id(r.nccl_id, sizeof(r.nccl_id), &r.nccl_id_len)) != 0) {
        snprintf(r.why, sizeof(r.why), "nccl unique id: %s", gang_err_name(rc));
        goto out_line;
    }
    rc = gang_comm_socket_listen(BD_HOST, &r.listener, r.blob, sizeof(r.blob) - 1, &r.blob_len);
    if (rc != 0) {
        snprintf(r.why, sizeof(r.why), "listen: %s", gang_err_name(rc));
        goto out_line;
    }
    for (i = 0; i < n; i++) {
        ranks[i] = (bd_rank){.run = &r, .rank = i};
        if (pthread_create(&ranks[i].th, NULL, bd_rank_main, &ranks[i]) != 0) {
            if (i == 0)
                gang_comm_listener_free(r.listener);
            bd_fail(&r, GANG_ENOMEM, "pthread_create", i);
            break;
        }
        started++;
    }
    /* Every rank's operations carry deadlines, so the joins are bounded. */
    for (i = 0; i < started; i++)
        pthread_join(ranks[i].th, NULL);
    rc = r.rc;

out_line:
    bd_emit_point(o, &r, rc, base, res);
    free(r.prefill_ms);
    free(r.decode_ms);
    pthread_mutex_destroy(&r.lock);
    if (rc != 0) {
        free(res->dec);
        res->dec = NULL;
    }
    return rc;
}

int gang_bench_decode_main(int argc, char **argv)
{
    static const uint32_t lay[4][2] = {{1, 1}, {2, 1}, {1, 2}, {2, 2}};
    bd_opts o;
    gang_mkmodel_opts mo;
    gang_model_config mc;
    bd_result base, res;
    char err[512];
    uint32_t b, l;
    int rc = 0, prc, failed = 0;

    memset(&o, 0, sizeof(o));
    rc = bd_parse(argc, argv, &o);
    if (rc != 0)
        return rc == GANG_OPTS_HELP ? GANG_EXIT_OK : GANG_EXIT_USAGE;
    if (o.cuda)
        return gang__bd_main_cuda(&o);
    if (o.model[0])
        return gang__bd_main_model(&o);
    snprintf(o.dir, sizeof(o.dir), "/tmp/ganglion-bench-decode-XXXXXX");
    if (mkdtemp(o.dir) == NULL) {
        fprintf(stderr, "ganglion bench decode: cannot create a temporary directory\n");
        return GANG_EXIT_INTERNAL;
    }
    memset(&mo, 0, sizeof(mo));
    mo = (gang_mkmodel_opts){.out_dir = o.dir,
                             .arch = GANG_ARCH_LLAMA,
                             .layers = o.layers,
                             .hidden = o.hidden,
                             .heads = o.heads,
                             .kv_heads = o.kv_heads,
                             .ffn = o.ffn,
                             .vocab = o.vocab,
                             .max_pos = o.prompt + o.tokens,
                             .seed = 1,
                             .dtype = GANG_DTYPE_F32,
                             .shards = 1};
    rc = gang_mkmodel(&mo, err, sizeof(err));
    if (rc == 0)
        rc = gang_model_config_read(o.dir, &mc, err, sizeof(err));
    if (rc != 0) {
        fprintf(stderr, "ganglion bench decode: %s\n", err);
        rc = GANG_EUSAGE;
        goto out_rm;
    }
    for (b = 0; b < o.n_batches; b++) {
        memset(&base, 0, sizeof(base));
        for (l = 0; l < 4; l++) {
            prc = gang__bd_point(&o, &mc, lay[l][0], lay[l][1], o.batches[b], 0,
                                 l == 0 ? NULL : &base, l == 0 ? &base : &res);
            if (prc != 0) {
                failed++;
                rc = prc;
                if (l == 0)
                    break; /* no base to compare the other layouts against */
            } else if (l > 0) {
                free(res.dec);
            }
        }
        free(base.dec);
    }

out_rm:
    if (nftw(o.dir, bd_remove_one, 16, FTW_DEPTH | FTW_PHYS) != 0)
        fprintf(stderr, "ganglion bench decode: could not remove %s\n", o.dir);
    if (rc == GANG_EUSAGE)
        return GANG_EXIT_USAGE;
    return failed > 0 ? GANG_EXIT_TEMPFAIL : GANG_EXIT_OK;
}
