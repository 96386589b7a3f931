/*
 * The worker process: one per GPU (or CPU rank) on a node, spawned by the agent as
 *
 *   ganglion worker --agent-socket PATH --local-rank L --node-index N [--registered-flag V]
 *
 * It speaks the control protocol of wctl.h with its agent, loads its shard of the model
 * once (--model), and for every generation the agent starts joins the gang's
 * communicators (parallel/: a socket-backend world and, on a GPU, nccl TP / PP groups) and
 * runs the generation engine on them; global rank 0 also takes the completion requests
 * of the coordinator's agent.
 *
 * The first half of this header is the worker's entry point; the second half is internal
 * to launcher/worker.c, launcher/worker-engine.c and the worker's unit test.
 */
#ifndef GANGLION_LAUNCHER_WORKER_H
#define GANGLION_LAUNCHER_WORKER_H

#include <stddef.h>
#include <stdint.h>

#include "ganglion/comm.h"
#include "ganglion/common.h"
#include "ganglion/engine.h"
#include "ganglion/rendezvous.h"
#include "layout.h"

/*
 * Runs the worker until the agent says SHUTDOWN or the channel to the agent is lost.
 * argv[0] is the subcommand ("worker"); the rest are registered flags plus the worker-only
 * --agent-socket PATH and --local-rank L. Returns a process exit code: 0 after SHUTDOWN,
 * 75 (GANG_EXIT_TEMPFAIL) when the agent channel closes, fails or the agent process is
 * gone, 2 (GANG_EXIT_USAGE) for a usage error. Sets PR_SET_PDEATHSIG so that the worker
 * dies with the agent. Call it from a single-threaded process (it starts threads).
 */
int gang_worker_main(int argc, char **argv);

/* What the engine glue (worker-engine.c) needs for the worker's whole life. */
typedef struct gang__wres_config {
    gang_layout layout;     /* model, shape, device, --max-ctx (the model part is
                               read by the loader: gang_layout_read_model) */
    uint64_t gpu_memory_mb; /* device pool per worker; 0 = gpu_memory_percent */
    uint32_t gpu_memory_percent;
    uint32_t share_gpus; /* --share-gpus: local ranks over fewer GPUs */
    uint32_t max_batch;
    uint32_t microbatches;
    uint32_t max_step_tokens;
    uint64_t kv_cache_bytes;
    uint32_t prefix_caching; /* --enable-prefix-caching */
    uint32_t cuda_graphs;    /* --cuda-graphs */
    uint32_t gpu_pool_split; /* --gpu-pool-split */
    uint32_t cuda_pdl;       /* --cuda-pdl */
    char gpu_bus_id[32];     /* PCI bus id of the GPU placement chose (worker-gpu.c); "" =
                                the GPU of the local rank's index */
    /* P/D KV transfers (worker-kv.c) */
    uint32_t role;                    /* --role: GANG_ROLE_* (serve.h) */
    uint32_t kv_port;                 /* --kv-port: a prefill gang's rank r serves on + r; 0 none */
    char kv_bind[GANG_HOST_MAX];      /* --bind-address */
    char kv_advertise[GANG_HOST_MAX]; /* --advertise-address (the agent's pick), else
                                         127.0.0.1: where decode gangs reach this node */
    uint64_t kv_timeout_ms;           /* --kv-transfer-timeout-ms */
    uint64_t kv_store_bytes;          /* --kv-export-mb */
    uint64_t kv_hold_ms;              /* --kv-export-hold-ms */
    gang_token kv_token;              /* --token-file (present 0: unauthenticated, warned) */
} gang__wres_config;

/*
 * The engine set-up (engine.h, gang_engine_setup) of the flags in c: the context of its
 * layout, --kv-cache-mb (0: sized from free memory), --kv-cache-dtype, and the node's
 * --nproc-per-node ranks sharing the host's memory. What wres_load passes to
 * gang_engine_setup_init, and what `bench decode` must build alike (test-bench.c).
 */
void gang__wres_engine_setup(const gang__wres_config *c, gang_engine_setup *out);

/*
 * The CUDA device of global rank `rank` with nproc workers per node and count GPUs
 * visible: its local rank's GPU, or with share (--share-gpus) that local rank modulo
 * count. GANG_EUSAGE (never retried) when no GPU is visible, or fewer than nproc without
 * share.
 */
int gang__wres_gpu_of(uint32_t rank, uint32_t nproc, int count, int share, int *gpu);

/*
 * The --gpu-memory-percent of a worker on GPU gpu of count when nproc workers per node
 * share them (--share-gpus, nproc > count): percent split evenly among the local ranks on
 * that GPU (at least 1), so that workers opening at once do not each ask for the whole
 * share of the free memory (the second's allocation would fail); else percent.
 */
uint32_t gang__wres_pool_percent(uint32_t percent, uint32_t nproc, int count, int gpu);

/* What the worker process needs; filled by gang_worker_config_from_params (layout.c). */
typedef struct gang_worker_config {
    char agent_path[108]; /* --agent-socket (sun_path capacity) */
    uint32_t local_rank;  /* --local-rank */
    int node;             /* --node-index; -1 when the agent did not say */
    uint32_t nproc_per_node;
    uint64_t heartbeat_interval_ms;
    uint64_t heartbeat_timeout_ms;
    uint64_t start_timeout_ms;
    uint64_t step_timeout_ms;
    char advertise[GANG_HOST_MAX]; /* --advertise-address, else 127.0.0.1 */
    char job[GANG_PARAM_STR_MAX];  /* --job-name: names the data plane's shm segments */
    char device[16];               /* --device and --backend as given, for messages */
    char backend[16];
    gang_log_format log_format;
    gang_log_level log_level;
    char nvml_library[GANG_PARAM_STR_MAX]; /* --nvml-library ("" = the driver's) */
    uint64_t gpu_health_interval_ms;       /* 0 = no health watch */
    int gpu_bind;                          /* placement and NUMA binding on */
    gang__wres_config res;                 /* the engine glue's part */
} gang_worker_config;

/*
 * Derives the worker's config from the effective parameters p and its own flags
 * (--agent-socket, --local-rank). Returns 0, or GANG_EUSAGE with a message in err (a bad
 * --log-format / --log-level, an --agent-socket too long, a layout gang_layout_from_params
 * refuses).
 */
int gang_worker_config_from_params(const gang_params *p, const char *agent_path,
                                   uint32_t local_rank, gang_worker_config *out, char *err,
                                   size_t errlen);

/* =================================================================================
 * Internal: the bootstrap blob of a generation (launcher/worker.c).
 *
 * Rank 0 answers BLOB_REQUEST with the blob every worker receives in START. The blob
 * belongs to the parallel module (gang_bootstrap_* in ganglion/comm.h: built by
 * gang_bootstrap_create, checked by gang_bootstrap_parse, joined by gang_bootstrap_join);
 * the launcher carries it opaquely. With an NCCL unique id in it, the TP / PP groups are
 * split from an nccl world, else from the socket world. An empty blob is valid
 * (socket-only, for a gang of one, which needs no rendezvous). Every worker decides
 * from its own parameters whether it expects the nccl part (gang__worker_uses_nccl) and
 * refuses a blob that disagrees: the gang's ranks were started with different --device
 * or --backend, which no data plane can serve.
 * ================================================================================= */

/*
 * 1 when a worker with parameters p runs its TP / PP groups over nccl: it serves a model
 * (--model) on the GPU, with --backend nccl, or --backend auto and --device cuda. The
 * agent has refused every other combination with nccl (gang_agent_check_layout). The
 * rule behind gang_layout.uses_nccl (layout.c).
 */
int gang__worker_uses_nccl(const gang_params *p);

/* =================================================================================
 * Internal: the data plane (launcher/worker-engine.c).
 *
 * gang__wres holds what a worker keeps for its whole life: its shard of the model, the
 * kernels and the engine, loaded on a loader thread. One gang__wstep runs one generation
 * on its own thread, so that the worker's main thread keeps heartbeating to the agent
 * even when the data plane is blocked. Both report to the main thread by writing
 * gang__wevent records into a pipe the main thread owns; the main thread stops a
 * generation with gang__wstep_stop(), which aborts its communicators.
 * ================================================================================= */
/* What the data thread and the loader report. */
typedef enum gang__wevent_type {
    GANG__WEV_READY = 1,  /* the communicators of the generation are up */
    GANG__WEV_FAILED = 2, /* the data plane failed; the thread has returned */
    GANG__WEV_TOKEN = 3,  /* rank 0: one generated token of a request */
    GANG__WEV_DONE = 4,   /* rank 0: a request finished (code 0) or was refused (code < 0) */
    GANG__WEV_LOADED = 5, /* the loader finished: code 0, or the load error (fatal) */
    GANG__WEV_GPU = 6,    /* the GPU health watch saw a fatal condition (worker-gpu.c) */
    GANG__WEV_KV = 7      /* rank 0: the KV cache's use and the requests' counts changed */
} gang__wevent_type;

/* One report, written with a single write(2) (smaller than PIPE_BUF, so atomic). */
typedef struct gang__wevent {
    uint32_t type;                /* gang__wevent_type */
    int32_t code;                 /* FAILED, LOADED, DONE: GANG_E* (0 = fine) */
    uint64_t generation;          /* the generation the thread serves */
    int32_t rank;                 /* FAILED: global rank at fault (the own rank if unknown) */
    char reason[GANG_REASON_MAX]; /* FAILED, LOADED, DONE: one line for the agent and logs */
    uint64_t req_id;              /* TOKEN, DONE */
    int32_t token;                /* TOKEN */
    uint32_t index;               /* TOKEN; DONE: prompt tokens from the prefix cache */
    char finish[8];               /* DONE: "length" or "stop" */
    uint64_t kv_id;               /* DONE: P/D, the export of its prompt's blocks (0 none) */
    uint32_t kv_blocks;           /* DONE: blocks exported, or imported when kv_id is 0 */
    uint32_t kv_ms;               /* DONE: its import's milliseconds */
    uint32_t kv_mismatch;         /* DONE: its import's source layout did not fit */
    uint32_t kv_device;           /* DONE: its import moved device to device */
    gang_kv_layout kv_layout;     /* DONE with kv_id: the gang's layout and nodes' addresses */
    float logprob;                /* TOKEN, when asked */
    uint32_t n_top;               /* TOKEN: alternatives */
    int32_t top_ids[GANG_MAX_TOP_LOGPROBS];
    float top_lp[GANG_MAX_TOP_LOGPROBS];
    gang_engine_kv kv; /* READY with a model: the KV cache the gang agreed on; KV: its use */
    uint32_t has_kv;   /* READY: kv is filled */
} gang__wevent;

typedef struct gang__wres gang__wres;

/*
 * Starts loading rank `rank`'s shard of cfg's model (nothing to load without one) on a
 * loader thread that reports LOADED(code) on event_fd when done (cfg is copied). Returns
 * 0 and *out (release with gang__wres_close, which waits for the loader), or a system
 * error.
 */
int gang__wres_open(const gang__wres_config *cfg, uint32_t rank, int event_fd, gang__wres **out);
void gang__wres_close(gang__wres *r);
/*
 * The loader's verdict, read from its state under the lock (not from its LOADED event,
 * which a teardown's drain of the pipe can take): 0 while it loads or once it loaded,
 * else the load error (negative GANG_E*) and its message in err. Any thread; NULL: 0.
 */
int gang__wres_load_error(gang__wres *r, char *err, size_t cap);
/* 1 when the worker serves a model (--model was given). */
int gang__wres_has_model(const gang__wres *r);
/* The load of the shard's MoE layers as the data thread last published it (about once per
 * heartbeat interval while it serves): 1 and *out, or 0 when it has none (yet). Any
 * thread. */
int gang__wres_moe_sample(gang__wres *r, gang_moe_load_sample *out);

/* Everything one generation of the data plane needs; copied by gang__wstep_start(). */
typedef struct gang__wstep_config {
    uint64_t generation;
    uint32_t rank;       /* own global rank, < world */
    uint32_t world;      /* ranks in the gang, >= 1 */
    const uint8_t *blob; /* rank 0's bootstrap blob, checked (copied) */
    size_t blob_len;
    int nccl;                      /* 1: the TP / PP groups are split from an nccl world
                                      joined from the blob, 0: from the socket world */
    gang_bootstrap *root;          /* rank 0: its bootstrap, consumed in every case */
    char advertise[GANG_HOST_MAX]; /* address the other ranks use to reach this one */
    gang__wres *res;               /* the worker's resources, borrowed */
    int event_fd;                  /* write end of the caller's event pipe, borrowed */
    int64_t start_timeout_ms;      /* model wait + communicator formation */
    int64_t heartbeat_interval_ms; /* rank 0's idle tick */
    int64_t heartbeat_timeout_ms;  /* deadline of an idle tick without a model */
    int64_t step_timeout_ms;       /* deadline of one engine step */
} gang__wstep_config;

typedef struct gang__wstep gang__wstep;

/*
 * Starts the data thread for cfg's generation. On success *out owns the thread and the
 * communicators it will create; release it with gang__wstep_stop(). Returns 0,
 * GANG_EINVAL for an inconsistent cfg, or a system error. Main thread only.
 */
int gang__wstep_start(const gang__wstep_config *cfg, gang__wstep **out);

/*
 * Stops the data thread (a no-op if it has returned): aborts its communicators and a
 * formation in progress, joins it and frees everything, then s. Returns within
 * milliseconds. Events it wrote may still sit in the pipe; the caller drains them.
 */
void gang__wstep_stop(gang__wstep *s);

/* Rank 0: queues a request for the data thread (copied). 0, GANG_EINVAL or GANG_ENOMEM. */
int gang__wstep_submit(gang__wstep *s, const gang_gen_request *r);
/*
 * Rank 0: asks the data thread to drop request id (queued here or in the engine) before
 * its next step. 0 or GANG_ENOMEM. An id that is already finished is ignored.
 */
int gang__wstep_cancel(gang__wstep *s, uint64_t id);

/* =================================================================================
 * Internal: the worker's GPU (launcher/worker-gpu.c): placement, binding, health watch.
 * ================================================================================= */
struct gang_gpu_sample;
typedef struct gang__wgpu gang__wgpu;

/*
 * Opens NVML (c->nvml_library) and, with --gpu-bind, maps the node's local ranks onto
 * its GPUs (gang_gpu_place: TP groups on NVLink islands), binds the calling thread, and
 * so every thread it starts later, to the NUMA node of this local rank's GPU and records
 * the GPU's bus id in c->res.gpu_bus_id; then, with --gpu-health-interval-ms > 0, starts
 * the health watch of that GPU, which writes a GANG__WEV_GPU event to event_fd on every
 * new fatal condition. With fewer GPUs than local ranks (MIG, time-slicing) local rank L
 * watches GPU L modulo their count and is not placed. Without NVML or a GPU it logs why
 * and *out is NULL: the worker runs unplaced and unwatched. Main thread, before any other
 * thread starts. Returns 0, or GANG_ENOMEM.
 */
int gang__wgpu_open(gang_worker_config *c, uint32_t local_rank, int event_fd, gang__wgpu **out);
/* Stops the watch and closes NVML. NULL is fine. */
void gang__wgpu_close(gang__wgpu *g);
/* 1 and the reason when the GPU has a fatal condition (gang_gpu_watch_fault); ack as there. */
int gang__wgpu_fault(gang__wgpu *g, int ack, char *reason, size_t cap);
/* The latest sample into s: 0, or GANG_ENOENT when no watch runs. */
int gang__wgpu_sample(gang__wgpu *g, struct gang_gpu_sample *s);

#endif /* GANGLION_LAUNCHER_WORKER_H */
