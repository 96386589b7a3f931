/*
 * Internal to `ganglion bench decode`: the options of a run, what one point measured, and
 * the entry points of the files it is split into, one per mechanism:
 *
 *   bench-decode.c   the flags, one point (rank threads, engine iterations, its JSON line)
 *                    and the random-model CPU path;
 *   decode-gpu.c     --device cuda / fake: the in-memory model and the copy bandwidth;
 *   decode-model.c   --model: a real model's storages x batches x layouts, the roofline
 *                    against the machine's read bandwidth, the ratio lines;
 *   decode-peer.c    --model: the transformers peer (bench/hf-decode.py) in the same run;
 *   read-bw.c        the machine's read bandwidth (multi-threaded streaming read).
 */
#ifndef GANGLION_BENCH_DECODE_H
#define GANGLION_BENCH_DECODE_H

#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "decode-agree.h"
#include "ganglion/engine.h"

#define BD_MAX_RANKS 4
#define BD_MAX_BATCHES 8
#define BD_MAX_LAYOUTS 4
#define BD_MAX_STORAGES 4
#define BD_PATH_MAX 1024
#define BD_MAX_VARIANTS 3
/* A token flip counts against a layout only where 1x1's top-2 log-probability gap is
 * above this: about 100 x the f32 disagreement expected between layouts (~1e-4 on the
 * 1B shape's logits), far below the gaps a wrong shard or a missed reduction produces.
 * The cuda path widens it for storages whose layouts round differently (decode-gpu.c). */
#define BD_GAP_TOL 1e-2

/*
 * cuda / fake: the kernels handle and the model of the one-rank points (1x1 and the nccl
 * point), kept from one such point to the next of the same storage so that a shape's
 * weights are drawn, packed and moved once per storage rather than once per point (the
 * 8B shape takes ~50 s of host work on the device machine, which the device check's
 * budget cannot pay per batch). Owned by gang__bd_main_cuda; NULL elsewhere.
 */
typedef struct bd_gpu_keep {
    gang_kernels *k;
    gang_model *m;
    double weight_bytes, stream_bytes;
} bd_gpu_keep;

/*
 * How a rank's model was built (gang__bd_gpu_model): the wall seconds of the whole build
 * and of its layers, and per layer after the first the process's minor page faults and
 * the bytes the layer stores on the device (on a GPU the faults are the host heap's: ~0
 * once it reuses the first layer's pages, gang_heap_reuse_begin; on the fake
 * device, whose memory is host pages, the stored bytes' pages too).
 * faults_per_later_layer is -1 with fewer than 2 layers.
 */
typedef struct bd_build_stats {
    double seconds, layers_s;
    double faults_per_later_layer, layer_bytes;
} bd_build_stats;

typedef struct bd_opts {
    uint32_t layers, hidden, heads, kv_heads, ffn, vocab;
    uint32_t prompt, tokens, iters, warmup, microbatches, timeout_s, cuda_graphs, nccl_wait_each;
    uint32_t half_gemv;     /* cuda: gang_kernels_options.half_gemv */
    uint32_t cuda_pdl;      /* cuda: gang_kernels_options.pdl */
    uint32_t fuse_residual; /* cuda: gang_kernels_options.fuse_residual */
    uint32_t trace_kernels; /* cuda: the one-rank points' decode steps traced (CUPTI) */
    uint32_t bw_mib, bw_passes, peer_iters, peer_timeout_s, peer_budget_s;
    uint32_t batches[BD_MAX_BATCHES];
    uint32_t n_batches;
    char dir[64];             /* the temporary model directory (cpu) */
    int cuda;                 /* --device cuda or fake: in-memory model, ranks on device 0 */
    const char *kdev;         /* the kernels device of that path: "cuda" or "fake" */
    size_t copy_bytes;        /* the bandwidth copy: --bw-mib (1 GiB) on cuda, <= 16 MiB on fake */
    uint32_t gpu_pool_mb;     /* cuda: the pool of every rank's handle */
    double copy_gbps;         /* cuda: measured device copy bandwidth, GB/s (read + write) */
    const char *shape;        /* cuda: "1b" or "8b" (--shape) */
    double gap_tol;           /* the agreement's tolerance for this storage; 0: BD_GAP_TOL */
    gang_kernels_wtype wtype; /* cuda: the storage of the points being run */
    bd_gpu_keep *keep;        /* cuda: the one-rank points' model (above); NULL: none */
    /* cuda / fake: --variants, the launch choices each changes (gang__bd_parse_variants) */
    uint32_t variants[BD_MAX_VARIANTS];
    uint32_t n_variants;
    const char *variant; /* the variant of the point being run; NULL: the flags as given */
    /* --model (decode-model.c) */
    char model[BD_PATH_MAX];       /* "": the random model */
    char dtypes[64];               /* storages, comma-separated: f32, bf16, f16, int8 */
    char layouts[64];              /* TPxPP layouts, comma-separated; the first is 1x1 */
    char peer_python[BD_PATH_MAX]; /* the reference interpreter */
    char peer_script[BD_PATH_MAX]; /* bench/hf-decode.py */
    int no_peer;                   /* --no-peer */
    int no_agree;                  /* 1: no extra logprobs iteration (a single layout) */
    gang_load_options load;        /* the storage of the points being run (NULL fields: f32) */
    const char *storage;           /* its name in the lines ("f32", "bf16", "int8"; cuda too) */
    double read_gbps;              /* the machine's read bandwidth, GB/s; 0: not measured */
    double kv_token_elems;         /* KV cache elements of one token over every layer */
} bd_opts;

/* What one point measured. */
typedef struct bd_result {
    double prefill_tps, decode_tps;
    double decode_ms;      /* median of the decode steps of one iteration */
    double roofline_ratio; /* decode_tps over the roofline (cuda, --model) */
    gang__decision *dec;   /* [batch x tokens] of the agreement iteration, owned */
    int refused;           /* --model: the loader refused the storage (GANG_ENOSYS) */
    double weight_bytes;   /* --model: m->weight_bytes summed over the ranks */
    double stream_bytes;   /* --model: weight bytes one decode step streams, over the ranks */
    size_t kv_elem_bytes;  /* --model: bytes of one KV cache element (the auto cache type) */
} bd_result;

/*
 * Measures one (tp, pp, batch) point and prints its line (bench-decode.c). base is the
 * 1x1 result of the same batch (NULL for the 1x1 point itself). With o->model the ranks
 * load that model with o->load; a storage the loader refuses (GANG_ENOSYS) prints a line
 * with "refused": its message and sets res->refused. Returns 0 or the point's error.
 */
int gang__bd_point(const bd_opts *o, const gang_model_config *mc, uint32_t tp, uint32_t pp,
                   uint32_t batch, int nccl, const bd_result *base, bd_result *res);

/*
 * The engine set-up of a point (bench-decode.c): serve's, as a worker builds it
 * (gang__wres_engine_setup) for --max-batch batch, a context of prompt + tokens,
 * --microbatches (at most batch), --max-step-tokens batch x prompt, the default
 * --kv-cache-mb 0 and --kv-cache-dtype auto, no prefix caching, and the point's ranks
 * sharing this host. test-bench.c checks that both give the same cache type and budget.
 */
void gang__bd_engine_setup(const bd_opts *o, uint32_t ranks, uint32_t batch,
                           gang_engine_setup *out);

/*
 * --variants (decode-gpu.c): a comma-separated list of pdl (--cuda-pdl 1), unfused
 * (--fuse-residual 0) and cublas (--half-gemv 0), each at most once and none the flags'
 * own setting already, into o->variants (indices of those names); "" is none. Returns 0,
 * or GANG_EUSAGE with the reason in err.
 */
int gang__bd_parse_variants(bd_opts *o, const char *list, char *err, size_t errlen);

/* Frees what keep holds (the model's device memory, then its handle); keep may be NULL. */
void gang__bd_gpu_keep_release(bd_gpu_keep *keep);

/*
 * The point's kernel trace (--trace-kernels, decode-gpu.c) into line: its "trace" object
 * when traced is 1, "trace_error" when it is a GANG_E* code (the collect failed), nothing
 * when 0 (not traced).
 */
void gang__bd_emit_trace(cJSON *line, int traced, const gang_kernels_trace *t);

/* The "model_build" object of a point whose rank 0 built its model (decode-gpu.c). */
void gang__bd_emit_build(cJSON *line, const bd_build_stats *st);

/*
 * --device cuda or fake (decode-gpu.c): rank `rank`'s shard of the in-memory random model
 * of o's shape for layout t, on the device of k, and how it was built (*st). Returns 0
 * and *out, or a GANG_E* code.
 */
int gang__bd_gpu_model(const bd_opts *o, const gang_topology *t, uint32_t rank, gang_kernels *k,
                       gang_model **out, bd_build_stats *st);

/*
 * --dtypes (decode-model.c): the comma-separated storages of list (f32, bf16, f16, int8)
 * into names[0 .. *n). Returns 0, or GANG_EUSAGE with the reason in err (an unknown
 * storage, more than BD_MAX_STORAGES, none).
 */
int gang__bd_parse_storages(const char *list, char (*names)[8], uint32_t *n, char *err,
                            size_t errlen);

/* --device cuda or fake (decode-gpu.c): the whole run; returns the exit code. */
int gang__bd_main_cuda(bd_opts *o);

/* --model (decode-model.c): the whole run; returns the exit code. */
int gang__bd_main_model(bd_opts *o);

/*
 * --model: the weight bytes one decode step of rank m streams (decode-model.c): its
 * m->weight_bytes less the embedding table, which a step only gathers rows from (see the
 * file comment of decode-model.c for how the table's share is found).
 */
double gang__bd_stream_bytes(const gang_model *m);

/*
 * The KV cache bytes the decode steps of a point read, per step, over the ranks: batch x
 * (prompt + tokens / 2: the steps' mean context) x o->kv_token_elems x the element's
 * bytes (decode-model.c's file comment).
 */
double gang__bd_kv_bytes_per_step(const bd_opts *o, uint32_t batch, size_t kv_elem_bytes);

/*
 * --model: adds the storage, the bytes a decode step reads (weights + KV cache), the
 * read bandwidth, roofline_tok_s and roofline_ratio of a point that ran to line, and sets
 * res->roofline_ratio (decode-model.c).
 */
void gang__bd_model_fields(cJSON *line, const bd_opts *o, uint32_t batch, bd_result *res);

/*
 * The machine's read bandwidth (read-bw.c): `threads` threads each sum their slice of one
 * buffer of `bytes` (first touched by that thread), `passes` timed passes after one
 * untimed, each pass timed from the start of the first thread to the end of the last.
 * gbps[0..2] = median, min, max of bytes / pass time, in GB/s (1e9). Returns 0,
 * GANG_EINVAL (a zero argument) or GANG_ENOMEM.
 */
int gang__read_bandwidth(size_t bytes, uint32_t threads, uint32_t passes, double gbps[3]);

/* One row of the transformers peer: decode tok/s of (dtype, batch), best thread count. */
typedef struct bd_peer_row {
    char dtype[8];
    uint32_t batch;
    uint32_t threads; /* the thread count of decode_tps */
    double decode_tps;
} bd_peer_row;

#define BD_MAX_PEER_ROWS 16

/* The transformers peer's results. */
typedef struct bd_peer {
    int ran;       /* 1: the script ran and rows hold what it measured */
    char why[320]; /* !ran: why it was skipped or failed */
    bd_peer_row rows[BD_MAX_PEER_ROWS];
    uint32_t n_rows;
} bd_peer;

/*
 * Runs bench/hf-decode.py with o->peer_python on o->model (decode-peer.c) for o's
 * batches, prompt and tokens, within o->peer_timeout_s, re-prints each of its JSON lines
 * and keeps, per (dtype, batch), the best decode tokens/s over thread counts. A missing
 * interpreter or script, a .gguf model, a timeout or a failed script leave p->ran 0 with
 * the reason (the caller prints "skipped" / "failed"). Returns 0, or a GANG_E* code for a
 * failure of this process (spawn, temporary files).
 */
int gang__bd_peer_run(const bd_opts *o, bd_peer *p);

#endif
