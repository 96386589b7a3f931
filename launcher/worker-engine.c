/*
 * The worker's data plane: the model shard it keeps for its whole life (gang__wres) and,
 * for every generation, a data thread (gang__wstep) that joins the gang's communicator
 * and runs the generation engine (engine/engine.c) on it.
 *
 * Life of a worker's resources. The model is loaded once, on a loader thread started at
 * worker start-up, so that the main thread keeps heartbeating while gigabytes are read.
 * Weights, KV slots and the engine survive every gang restart: an ABORT tears down only
 * the communicators, and the next generation's thread reuses the engine after
 * gang_engine_reset(). A worker started without --model serves no completions; its data
 * thread still forms the communicator and runs a barrier every heartbeat interval, so
 * that peer loss and hangs are detected exactly as with a model.
 *
 * One generation (the data thread):
 *   1. wait for the model (deadline: the start timeout);
 *   2. gang_bootstrap_join of the socket world from the blob rank 0 made for BLOB_REQUEST
 *      (a cancel eventfd lets gang__wstep_stop() interrupt a gang still forming), then
 *      split it into the TP group (color = its first rank, key = tp rank), the pipeline
 *      neighbours (color = the place in the stage, ep_rank, key = pp stage) and, when the
 *      EP group is wider than the TP group, the stage's EP group (color = pp stage, key =
 *      ep_rank; the MoE blocks' all-to-alls and all-reduce run over it). A GPU worker
 *      whose blob carries an NCCL unique id (gang__worker_uses_nccl) instead makes its
 *      kernels handle's GPU current on this thread, joins an nccl world of the same ranks
 *      from that id (same deadline and cancel fd) and splits THAT into the TP and PP
 *      groups, so the all-reduces, the activation transfers and the logits all-gather move
 *      device memory over NCCL (gang_tp_stage_* hands the pointers over as they are). The
 *      socket world stays: the plan broadcast, the token return and the barrier ticks are
 *      host data;
 *   3. report READY, then loop on engine steps. Rank 0 drains the requests the main
 *      thread queued, submits them, and steps while anything is pending; when idle it
 *      waits up to one heartbeat interval for a request and then steps with an empty plan,
 *      which is the tick that keeps every other rank's wait bounded. Other ranks just
 *      step: each step starts with rank 0's plan broadcast.
 * Tokens and completions go to the main thread as events through its pipe; the main
 * thread forwards them to the agent. On a failure the thread reports the first cause once
 * and returns without freeing its communicators, so that the peers see the failure
 * through their own deadlines or the coordinator's ABORT, not as an echo racing the real
 * cause. gang__wstep_stop() aborts the communicators (safe from another thread), joins
 * the thread and frees them.
 */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "ganglion/comm.h"
#include "ganglion/gpu.h"
#include "ganglion/kernels.h"
#include "ganglion/engine.h"
#include "wctl.h"
#include "worker.h"
#include "worker-kv.h"

/* Rank 0 reports its KV use to the agent at most this often while requests are live. */
#define WSTEP_KV_MS 250

/* =====================================================================================
 * Worker-lifetime resources
 * ===================================================================================== */

struct gang__wres {
    gang__wres_config cfg; /* the engine glue's config (layout.c), copied */
    uint32_t rank;         /* the global rank the shard is cut for */
    int event_fd;          /* the main thread's event pipe (borrowed) */
    pthread_t loader;
    int loader_started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int state;                 /* 0 loading, 1 loaded, < 0 the load error */
    char err[GANG_REASON_MAX]; /* why the load failed */
    gang_model *model;         /* NULL without --model */
    gang_engine *engine;       /* NULL without --model */
    gang_kernels *k;           /* NULL without --model */
    gang_topology topo;        /* valid with a model */
    uint32_t n_blocks;         /* KV blocks this rank's pool holds (before the gang agrees) */
    gang_moe_load_sample moe;  /* under mu: the MoE layers' load at the last publication */
    int has_moe;               /* under mu: moe is valid */
    uint64_t moe_pub_ms;       /* data thread: when it last published moe */
    gang__wkv *kv;             /* the P/D transport of its engine (worker-kv.c), or NULL */
};

_Static_assert(sizeof(gang__wevent) <= PIPE_BUF, "a worker event must be written atomically");

/* Writes ev to the main thread's pipe whole (smaller than PIPE_BUF, so atomic). */
static void event_write(int fd, const gang__wevent *ev)
{
    const char *p = (const char *)ev;
    size_t left = sizeof(*ev);
    while (left > 0) {
        ssize_t n = write(fd, p, left);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return; /* the main thread is gone: nobody to tell */
        p += n;
        left -= (size_t)n;
    }
}

/*
 * The CUDA ordinal of the GPU placement chose (c->gpu_bus_id, an NVML PCI bus id), found
 * by bus id because CUDA and NVML may number GPUs differently; fallback (the local rank)
 * when placement chose none, or CUDA lists that bus id not exactly once (MIG instances of
 * one GPU share its bus id).
 */
static int wres_cuda_index(const gang__wres_config *c, int fallback, int count)
{
    int found = -1, matches = 0;
    if (c->gpu_bus_id[0] == '\0')
        return fallback;
    for (int i = 0; i < count; i++) {
        gang_device_info d;
        if (gang_kernels_device_info(i, &d) == 0 &&
            gang_gpu_bus_id_equal(d.pci_bus_id, c->gpu_bus_id)) {
            found = i;
            matches++;
        }
    }
    if (matches == 1)
        return found;
    gang_warn("placement chose GPU %s, which CUDA lists %d times: using GPU %d", c->gpu_bus_id,
              matches, fallback);
    return fallback;
}

int gang__wres_gpu_of(uint32_t rank, uint32_t nproc, int count, int share, int *gpu)
{
    if (nproc == 0 || count <= 0 || ((uint32_t)count < nproc && !share))
        return GANG_EUSAGE;
    *gpu = (int)(rank % nproc % (uint32_t)count);
    return 0;
}

uint32_t gang__wres_pool_percent(uint32_t percent, uint32_t nproc, int count, int gpu)
{
    uint32_t n = (uint32_t)count, sharers;

    if (count <= 0 || gpu < 0 || (uint32_t)gpu >= n || nproc <= n)
        return percent;
    sharers = nproc / n + ((uint32_t)gpu < nproc % n ? 1u : 0u);
    return percent / sharers > 0 ? percent / sharers : 1u;
}

/*
 * Opens the worker's kernels handle. "cuda": the GPU of this worker's local rank, with
 * the pool of --gpu-memory-mb (or --gpu-memory-percent, split among the workers that share
 * the GPU: gang__wres_pool_percent); a node with fewer GPUs than
 * --nproc-per-node is a configuration error unless --share-gpus (gang__wres_gpu_of;
 * GANG_EUSAGE, never retried), found here, in the worker, because the agent must not
 * initialise CUDA before it forks.
 */
static int wres_open_kernels(gang__wres *r, const char *dev, char *err, size_t cap)
{
    const gang__wres_config *c = &r->cfg;
    uint32_t nproc = (uint32_t)c->layout.tc.nproc_per_node;
    gang_kernels_options ko;
    int rc, count, gpu;

    gang_kernels_options_init(&ko);
    ko.device = dev;
    if (strcmp(dev, "cuda") == 0) {
        count = gang_kernels_device_count();
        rc = gang__wres_gpu_of(r->rank, nproc, count, c->share_gpus, &gpu);
        if (rc != 0) {
            snprintf(err, cap,
                     "--device cuda: this node has %d GPU(s) but --nproc-per-node is %u "
                     "(one GPU per worker; --share-gpus lets workers share them)",
                     count, nproc);
            return rc;
        }
        ko.device_index = wres_cuda_index(c, gpu, count);
        ko.pool_mb = c->gpu_memory_mb;
        ko.pool_percent = gang__wres_pool_percent(c->gpu_memory_percent, nproc, count, gpu);
        if (ko.pool_mb == 0 && ko.pool_percent != c->gpu_memory_percent)
            gang_info("--share-gpus: GPU %d's workers share its --gpu-memory-percent %u: "
                      "this one's pool takes %u%%",
                      gpu, (unsigned)c->gpu_memory_percent, (unsigned)ko.pool_percent);
        ko.pdl = c->cuda_pdl ? 1 : 0;
        ko.pool_split = c->gpu_pool_split ? 1 : 0;
    }
    rc = gang_kernels_open_opts(&ko, &r->k);
    if (rc != 0)
        snprintf(err, cap, "kernels for device '%s': %s", dev, gang_strerror(rc));
    return rc;
}

void gang__wres_engine_setup(const gang__wres_config *c, gang_engine_setup *out)
{
    memset(out, 0, sizeof(*out));
    out->max_batch = c->max_batch;
    out->max_ctx = c->layout.ctx;
    out->microbatches = c->microbatches;
    out->max_step_tokens = c->max_step_tokens;
    out->kv_cache_bytes = c->kv_cache_bytes;
    out->kv_dtype_auto = c->layout.kv_auto;
    out->kv_dtype = c->layout.kv_dtype;
    out->prefix_caching = c->prefix_caching;
    out->cuda_graphs = c->cuda_graphs;
    out->model_dir = c->layout.model; /* the tokenizer, for grammars */
    out->ranks_per_host =
        c->layout.tc.nproc_per_node > 0 ? (uint32_t)c->layout.tc.nproc_per_node : 1;
}

/*
 * Loads the shard of r->rank: config.json and the layout (gang_layout_read_model: refused
 * with the topology's message when the model cannot be split this way), the weights, the
 * kernels and the engine with its KV slots. Returns 0 or an error with r->err set.
 */
static int wres_load(gang__wres *r)
{
    gang__wres_config *c = &r->cfg;
    const gang_model_config *mc = &c->layout.mc;
    const char *model = c->layout.model;
    char err[GANG_REASON_MAX] = "";
    int rc = gang_layout_read_model(&c->layout, &r->topo, err, sizeof(err));
    if (rc != 0)
        goto out_err;
    uint64_t t0 = gang_now_ms();
    const char *dev = c->layout.device;
    rc = wres_open_kernels(r, dev, err, sizeof(err));
    if (rc != 0)
        goto out_err;
    const int on_device = strcmp(dev, "cpu") != 0;
    gang_load_options lo = {.dtype = c->layout.dtype,
                            .quantize = c->layout.quantize,
                            .ep = c->layout.ep,
                            .no_mmap = c->layout.no_mmap,
                            /* a device's block kernels read the file's layout */
                            .keep_layout = on_device};
    /* A device worker's host copies of its layers are transient (read, packed, moved,
     * freed): each layer reuses the previous one's pages (gang_heap_reuse_begin). */
    if (on_device)
        gang_heap_reuse_begin();
    rc = gang_model_load_ex(model, &r->topo, r->rank, &lo, &r->model, err, sizeof(err));
    /* A GPU worker keeps no host copy of its weights: they move to the pool once. */
    if (rc == 0 && (rc = gang_model_to_device(r->model, r->k)) != 0)
        snprintf(err, sizeof(err), "moving the weights to device '%s': %s", dev, gang_strerror(rc));
    if (on_device)
        gang_heap_reuse_end(); /* the pages kept go back */
    if (rc != 0)
        goto out_err;
    gang_engine_setup es;
    gang_engine_config ec;
    gang__wres_engine_setup(c, &es);
    rc = gang_engine_setup_init(&es, r->model, r->k, &r->engine, &ec, err, sizeof(err));
    if (rc != 0)
        goto out_err;
    rc = gang__wkv_start(c, r->rank, r->engine, &r->kv);
    if (rc != 0)
        goto out_err;
    gang_engine_kv kv;
    gang_engine_kv_info(r->engine, &kv);
    r->n_blocks = kv.blocks;
    gang_info("model %s loaded in %llu ms: layers [%u, %u) of %u, %.1f MiB of weights (%s); "
              "KV cache (%s, %s): %u blocks of %u positions = %llu tokens, %u sequences of "
              "the whole %u-position context, up to %u in flight",
              model, (unsigned long long)(gang_now_ms() - t0), r->model->layer_first,
              r->model->layer_first + r->model->layer_count, mc->n_layers,
              (double)r->model->weight_bytes / (1 << 20),
              r->model->storage[0] ? r->model->storage : gang_kernels_wtype_name(r->model->wtype),
              gang_dtype_name(ec.kv_dtype),
              c->kv_cache_bytes != 0 ? "--kv-cache-mb" : "sized from free memory", kv.blocks,
              kv.block_size, (unsigned long long)kv.tokens, kv.full_seqs,
              gang_engine_max_ctx(r->engine), gang_engine_slots(r->engine));
    const gang_rank_place *pl = &r->model->place;
    const gang_topology *t = &r->model->topo;
    if (t->tp_replicas > 1)
        gang_info("layout: rank %u is stage %u, ep rank %u of %u (TP group %u of %u, tp rank "
                  "%u of %u): world %u = ep %u x pp %u, attention and dense layers TP over %u "
                  "rank(s) replicated %u times, experts over the stage's %u ranks",
                  pl->rank, pl->pp_stage, pl->ep_rank, t->stage_ranks, pl->tp_replica,
                  t->tp_replicas, pl->tp_rank, t->tp, t->world_size, t->stage_ranks, t->pp, t->tp,
                  t->tp_replicas, t->stage_ranks);
    else
        gang_info("layout: rank %u is stage %u, tp rank %u of %u: world %u = tp %u x pp %u",
                  pl->rank, pl->pp_stage, pl->tp_rank, t->tp, t->world_size, t->tp, t->pp);
    return 0;

out_err:
    snprintf(r->err, sizeof(r->err), "model '%s': %s", model, err[0] ? err : gang_strerror(rc));
    return rc;
}

static void *wres_thread(void *arg)
{
    gang__wres *r = arg;
    int rc = wres_load(r);
    gang__wevent ev;
    memset(&ev, 0, sizeof(ev));
    ev.type = GANG__WEV_LOADED;
    ev.code = rc;
    ev.rank = (int32_t)r->rank;
    gang_strlcpy(ev.reason, rc == 0 ? "" : r->err, sizeof(ev.reason));
    pthread_mutex_lock(&r->mu);
    r->state = rc == 0 ? 1 : (rc < 0 ? rc : GANG_EINTERNAL);
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    event_write(r->event_fd, &ev);
    return NULL;
}

int gang__wres_open(const gang__wres_config *cfg, uint32_t rank, int event_fd, gang__wres **out)
{
    *out = NULL;
    gang__wres *r = calloc(1, sizeof(*r));
    if (r == NULL)
        return GANG_ENOMEM;
    r->cfg = *cfg;
    r->rank = rank;
    r->event_fd = event_fd;
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    if (cfg->layout.model[0] == '\0') {
        r->state = 1;
        gang__wevent ev;
        memset(&ev, 0, sizeof(ev));
        ev.type = GANG__WEV_LOADED;
        ev.rank = (int32_t)rank;
        event_write(event_fd, &ev);
        *out = r;
        return 0;
    }
    if (strcmp(cfg->layout.device, "cpu") != 0)
        gang_heap_single_arena(); /* the loader's layers in the arena that keeps them */
    int rc = pthread_create(&r->loader, NULL, wres_thread, r);
    if (rc != 0) {
        pthread_mutex_destroy(&r->mu);
        pthread_cond_destroy(&r->cv);
        free(r);
        return gang_err_from_errno(rc);
    }
    r->loader_started = 1;
    *out = r;
    return 0;
}

void gang__wres_close(gang__wres *r)
{
    if (r == NULL)
        return;
    if (r->loader_started)
        pthread_join(r->loader, NULL); /* loading is not interruptible; exit waits for it */
    gang__wkv_abort(r->kv);            /* its pairs in flight end now, not at their deadline */
    gang_engine_free(r->engine);       /* joins its KV fetches, which use r->kv */
    gang__wkv_stop(r->kv);
    gang_model_device_release(r->model); /* device arrays go back to r->k's pool first */
    gang_model_free(r->model);
    gang_kernels_close(r->k);
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->cv);
    free(r);
}

int gang__wres_load_error(gang__wres *r, char *err, size_t cap)
{
    int rc = 0;
    if (r == NULL)
        return 0;
    pthread_mutex_lock(&r->mu);
    if (r->state < 0) {
        rc = r->state;
        gang_strlcpy(err, r->err, cap);
    }
    pthread_mutex_unlock(&r->mu);
    return rc;
}

int gang__wres_has_model(const gang__wres *r)
{
    return r != NULL && r->cfg.layout.model[0] != '\0';
}

/*
 * Waits until the resources are loaded, the deadline passes (GANG_ETIMEDOUT) or *stop is
 * set (GANG_EABORTED; checked every 50 ms). Returns 0 or the load error, with a message.
 */
static int wres_wait(gang__wres *r, uint64_t deadline, atomic_int *stop, char *err, size_t cap)
{
    int rc;
    pthread_mutex_lock(&r->mu);
    for (;;) {
        if (r->state != 0) {
            rc = r->state > 0 ? 0 : r->state;
            if (rc != 0)
                gang_strlcpy(err, r->err, cap);
            break;
        }
        if (atomic_load(stop)) {
            rc = GANG_EABORTED;
            break;
        }
        uint64_t now = gang_now_ms();
        if (now >= deadline) {
            snprintf(err, cap, "the model is still loading at the start deadline");
            rc = GANG_ETIMEDOUT;
            break;
        }
        uint64_t wait_ms = deadline - now < 50 ? deadline - now : 50;
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += (long)(wait_ms * 1000000);
        ts.tv_sec += ts.tv_nsec / 1000000000;
        ts.tv_nsec %= 1000000000;
        pthread_cond_timedwait(&r->cv, &r->mu, &ts);
    }
    pthread_mutex_unlock(&r->mu);
    return rc;
}

/* =====================================================================================
 * One generation
 * ===================================================================================== */

/* A request the main thread queued for the data thread (rank 0 only). */
typedef struct wreq {
    struct wreq *next;
    gang_gen_request r;
    int32_t prompt[]; /* r.prompt points here */
} wreq;

struct gang__wstep {
    gang__wstep_config cfg; /* own copy; blob copied below */
    uint8_t blob[GANG_BLOB_MAX];
    pthread_t th;
    int started;
    atomic_int stop;
    int cancel_fd;      /* eventfd: interrupts gang_bootstrap_join */
    pthread_mutex_t mu; /* guards the communicators (for abort) and the queue */
    pthread_cond_t cv;  /* a request was queued, or stop */
    gang_comm *world, *tp, *pp;
    gang_comm *ep;     /* the stage's EP group when wider than tp (tp_replicas > 1), or NULL */
    gang_comm *nworld; /* the nccl world tp and pp were split from, or NULL */
    wreq *head, *tail;
    uint32_t queued;
    gang_engine_kv kv_sent; /* rank 0: the last KV report (wstep_kv) */
    uint64_t kv_sent_ms;
    uint64_t *cancels; /* ids to drop before the next step, [n_cancels] */
    uint32_t n_cancels, cap_cancels;
    int reported; /* a FAILED event was written */
};

static int wstep_fail(gang__wstep *s, int code, int32_t rank, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int wstep_fail(gang__wstep *s, int code, int32_t rank, const char *fmt, ...)
{
    if (s->reported || atomic_load(&s->stop))
        return code;
    s->reported = 1;
    if (code == GANG_EPEER || code == GANG_ETIMEDOUT || code == GANG_ECONNRESET) {
        /* Usually an echo: another rank died or hung, and its own agent reports the true
         * cause within milliseconds (exit) or at the heartbeat timeout (silence). Give
         * that report a head start, so the coordinator records the real culprit; an
         * ABORT meanwhile stops this thread and the echo is never sent. */
        uint64_t grace = 2 * (uint64_t)s->cfg.heartbeat_interval_ms;
        grace = grace < 50 ? 50 : (grace > 1000 ? 1000 : grace);
        uint64_t until = gang_now_ms() + grace;
        while (gang_now_ms() < until && !atomic_load(&s->stop))
            usleep(5000);
        if (atomic_load(&s->stop))
            return code;
    }
    gang__wevent ev;
    memset(&ev, 0, sizeof(ev));
    ev.type = GANG__WEV_FAILED;
    ev.code = code;
    ev.generation = s->cfg.generation;
    ev.rank = rank;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ev.reason, sizeof(ev.reason), fmt, ap);
    va_end(ap);
    event_write(s->cfg.event_fd, &ev);
    return code;
}

static void wstep_event(gang__wstep *s, gang__wevent *ev)
{
    ev->generation = s->cfg.generation;
    event_write(s->cfg.event_fd, ev);
}

/* Refuses a request back to the agent: DONE with an error code and the reason. */
static void wstep_refuse(gang__wstep *s, uint64_t id, int code, const char *reason)
{
    gang__wevent ev;
    memset(&ev, 0, sizeof(ev));
    ev.type = GANG__WEV_DONE;
    ev.code = code;
    ev.req_id = id;
    gang_strlcpy(ev.reason, reason, sizeof(ev.reason));
    wstep_event(s, &ev);
}

/*
 * The nccl world of a GPU worker (same ranks as the socket world), from the unique id of
 * the blob, on the GPU of the worker's kernels handle, which is made current on this
 * thread first (NCCL takes the thread's current device at init). Bounded by the start
 * timeout and interruptible through the cancel fd, like the socket world. On success
 * *out is published in s->nworld (for gang__wstep_stop's abort) and returned.
 */
static int wstep_nccl_world(gang__wstep *s, gang__wres *res, gang_comm **out)
{
    const gang__wstep_config *c = &s->cfg;
    gang_bootstrap_join_config cc;
    gang_comm *nworld = NULL;
    int rc;

    *out = NULL;
    rc = gang_kernels_bind_thread(res->k);
    if (rc != 0)
        return wstep_fail(s, rc, (int32_t)c->rank,
                          "rank %u: cannot make its GPU current for "
                          "NCCL: %s",
                          c->rank, gang_strerror(rc));
    memset(&cc, 0, sizeof(cc));
    cc.rank = c->rank;
    cc.world_size = c->world;
    cc.blob = s->blob;
    cc.blob_len = c->blob_len;
    cc.timeout_ms = (uint64_t)c->start_timeout_ms;
    cc.cancel_fd = &s->cancel_fd;
    rc = gang_bootstrap_join(&cc, GANG_COMM_NCCL, &nworld);
    if (rc != 0)
        return wstep_fail(s, rc, (int32_t)c->rank,
                          "rank %u cannot join the NCCL world of %u "
                          "ranks: %s",
                          c->rank, c->world, gang_strerror(rc));
    pthread_mutex_lock(&s->mu);
    s->nworld = nworld;
    int stopped = atomic_load(&s->stop);
    pthread_mutex_unlock(&s->mu);
    if (stopped)
        return GANG_EABORTED;
    *out = nworld;
    return 0;
}

/*
 * Initialises the world communicator and, with a model, the TP and PP groups: split from
 * the socket world, or from an nccl world when the blob carried an NCCL unique id.
 */
static int wstep_comms(gang__wstep *s, gang__wres *res)
{
    const gang__wstep_config *c = &s->cfg;
    gang_bootstrap_join_config cc;
    memset(&cc, 0, sizeof(cc));
    cc.rank = c->rank;
    cc.world_size = c->world;
    cc.blob = s->blob;
    cc.blob_len = c->blob_len;
    cc.root = c->root;
    cc.advertise_host = c->advertise[0] ? c->advertise : "127.0.0.1";
    cc.timeout_ms = (uint64_t)c->start_timeout_ms;
    cc.cancel_fd = &s->cancel_fd;
    s->cfg.root = NULL; /* consumed by gang_bootstrap_join, whatever it returns */
    gang_comm *world = NULL, *tp = NULL, *pp = NULL, *ep = NULL;
    int rc = gang_bootstrap_join(&cc, GANG_COMM_SOCKET, &world);
    if (rc != 0)
        return wstep_fail(s, rc, (int32_t)c->rank,
                          "rank %u cannot join the data plane of %u "
                          "ranks: %s",
                          c->rank, c->world, gang_strerror(rc));
    pthread_mutex_lock(&s->mu);
    s->world = world;
    int stopped = atomic_load(&s->stop);
    pthread_mutex_unlock(&s->mu);
    if (stopped)
        return GANG_EABORTED;
    if (!gang__wres_has_model(res))
        return 0;

    gang_rank_place pl;
    rc = gang_topology_rank(&res->topo, c->rank, &pl);
    if (rc != 0 || res->topo.world_size != c->world)
        return wstep_fail(s, GANG_EMISMATCH, (int32_t)c->rank,
                          "START gives rank %u of %u; the "
                          "model was cut for a world of %u",
                          c->rank, c->world, res->topo.world_size);
    uint64_t t = (uint64_t)c->start_timeout_ms;
    gang_comm *parent = world;
    if (c->nccl) {
        rc = wstep_nccl_world(s, res, &parent);
        if (rc != 0)
            return rc;
    }
    /* Both worlds split in the same order on every rank: TP first (its group's first rank
     * names it: a stage may hold several), then PP (the same place in every stage), then,
     * with an EP group wider than the TP group, the stage (the MoE blocks' all-to-alls). */
    rc = gang_comm_split(parent, pl.tp_group_first_rank, pl.tp_rank, t, &tp);
    if (rc == 0)
        rc = gang_comm_split(parent, pl.ep_rank, pl.pp_stage, t, &pp);
    if (rc == 0 && res->topo.tp_replicas > 1)
        rc = gang_comm_split(parent, pl.pp_stage, pl.ep_rank, t, &ep);
    pthread_mutex_lock(&s->mu);
    s->tp = tp;
    s->pp = pp;
    s->ep = ep;
    stopped = atomic_load(&s->stop);
    pthread_mutex_unlock(&s->mu);
    if (rc != 0)
        return wstep_fail(s, rc, (int32_t)c->rank, "splitting the %s TP / PP groups: %s",
                          gang_comm_backend_name(gang_comm_backend_of(parent)), gang_strerror(rc));
    return stopped ? GANG_EABORTED : 0;
}

/* Moves the queued requests into the engine (rank 0); refusals go back as DONE. */
static void wstep_admit(gang__wstep *s, gang_engine *e)
{
    pthread_mutex_lock(&s->mu);
    wreq *q = s->head;
    s->head = s->tail = NULL;
    s->queued = 0;
    /* Cancellations first: a request cancelled before it was admitted is dropped here, one
     * already in the engine gives its slot back before the next plan is built. */
    for (uint32_t i = 0; i < s->n_cancels; i++) {
        uint64_t id = s->cancels[i];
        for (wreq **pp = &q; *pp != NULL;) {
            if ((*pp)->r.id == id) {
                wreq *dead = *pp;
                *pp = dead->next;
                free(dead);
            } else {
                pp = &(*pp)->next;
            }
        }
        if (e != NULL)
            (void)gang_engine_cancel(e, id); /* GANG_ENOENT: it finished meanwhile */
    }
    s->n_cancels = 0;
    pthread_mutex_unlock(&s->mu);
    while (q != NULL) {
        wreq *next = q->next;
        char err[GANG_REASON_MAX] = "";
        int rc = e != NULL ? gang_engine_submit(e, &q->r, err, sizeof(err)) : GANG_ENOSYS;
        if (rc != 0)
            wstep_refuse(s, q->r.id, rc,
                         e != NULL ? err : "this gang serves no model (serve --model DIR)");
        free(q);
        q = next;
    }
}

/* Rank 0, idle: waits up to ms for a request or stop. */
static void wstep_idle_wait(gang__wstep *s, uint64_t ms)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += (long)(ms * 1000000);
    ts.tv_sec += ts.tv_nsec / 1000000000;
    ts.tv_nsec %= 1000000000;
    pthread_mutex_lock(&s->mu);
    if (s->head == NULL && !atomic_load(&s->stop))
        pthread_cond_timedwait(&s->cv, &s->mu, &ts);
    pthread_mutex_unlock(&s->mu);
}

/*
 * The data thread's copy of the MoE layers' load for the main thread's heartbeat
 * (gang__wres_moe_sample), at most once per heartbeat interval: the counters live in the
 * layers, which only this thread touches.
 */
static void wres_moe_publish(gang__wres *r, uint64_t interval_ms)
{
    gang_moe_load_sample smp;
    uint64_t now = gang_now_ms();
    int has;

    if (r->model == NULL || now - r->moe_pub_ms < interval_ms)
        return;
    r->moe_pub_ms = now;
    has = gang_model_moe_load(r->model, &smp);
    if (!has)
        return;
    pthread_mutex_lock(&r->mu);
    r->moe = smp;
    r->has_moe = 1;
    pthread_mutex_unlock(&r->mu);
}

int gang__wres_moe_sample(gang__wres *r, gang_moe_load_sample *out)
{
    int has;

    if (r == NULL)
        return 0;
    pthread_mutex_lock(&r->mu);
    has = r->has_moe;
    if (has)
        *out = r->moe;
    pthread_mutex_unlock(&r->mu);
    return has;
}

/*
 * Rank 0, after a step: the KV cache's use and the requests' counts (/metrics), when they
 * changed, at most every WSTEP_KV_MS while requests are live and at once when none is.
 */
static void wstep_kv(gang__wstep *s, gang_engine *e)
{
    gang__wevent ev;
    memset(&ev, 0, sizeof(ev));
    if (gang_engine_kv_info(e, &ev.kv) != 0)
        return;
    const gang_engine_kv *o = &s->kv_sent;
    uint64_t now = gang_now_ms();
    int changed = ev.kv.free_blocks != o->free_blocks || ev.kv.cached_blocks != o->cached_blocks ||
                  ev.kv.running != o->running || ev.kv.waiting != o->waiting ||
                  ev.kv.preempted != o->preempted;
    int idle = ev.kv.running == 0 && ev.kv.waiting == 0;
    if (!changed || (!idle && now - s->kv_sent_ms < WSTEP_KV_MS))
        return;
    s->kv_sent = ev.kv;
    s->kv_sent_ms = now;
    ev.type = GANG__WEV_KV;
    ev.has_kv = 1;
    wstep_event(s, &ev);
}

/* The serving loop with a model: engine steps until a failure or stop. */
static int wstep_serve(gang__wstep *s, gang__wres *res)
{
    const gang__wstep_config *c = &s->cfg;
    gang_engine *e = res->engine;
    uint64_t interval = (uint64_t)c->heartbeat_interval_ms;
    /* Other ranks wait for rank 0's next plan: its idle wait plus a whole step. */
    uint64_t timeout = (uint64_t)c->step_timeout_ms + (c->rank == 0 ? 0 : 2 * interval);
    while (!atomic_load(&s->stop)) {
        if (c->rank == 0) {
            wstep_admit(s, e);
            if (gang_engine_pending(e) == 0) {
                wstep_idle_wait(s, interval);
                wstep_admit(s, e);
            }
        }
        int rc = gang_engine_step(e, res->k, s->world, s->tp, s->ep, s->pp, timeout);
        if (rc != 0)
            return wstep_fail(s, rc, (int32_t)c->rank, "rank %u: engine step failed: %s", c->rank,
                              gang_strerror(rc));
        wres_moe_publish(res, interval);
        if (c->rank != 0)
            continue;
        gang_gen_event ge;
        while (gang_engine_poll(e, &ge) == 1) {
            gang__wevent ev;
            memset(&ev, 0, sizeof(ev));
            ev.type = ge.kind == GANG_GEN_TOKEN ? GANG__WEV_TOKEN : GANG__WEV_DONE;
            ev.req_id = ge.id;
            ev.token = ge.token;
            ev.index = ge.index;
            ev.logprob = ge.logprob;
            ev.n_top = ge.n_top;
            memcpy(ev.top_ids, ge.top_ids, sizeof(ev.top_ids));
            memcpy(ev.top_lp, ge.top_logprobs, sizeof(ev.top_lp));
            gang_strlcpy(ev.finish, ge.finish, sizeof(ev.finish));
            ev.kv_id = ge.kv_id;
            ev.kv_blocks = ge.kv_blocks;
            ev.kv_ms = ge.kv_ms;
            ev.kv_mismatch = ge.kv_mismatch;
            ev.kv_device = ge.kv_device;
            ev.kv_layout = ge.kv_layout;
            wstep_event(s, &ev);
        }
        wstep_kv(s, e);
    }
    return GANG_EABORTED;
}

/* The loop without a model: a barrier every heartbeat interval keeps failure detection. */
static int wstep_tick(gang__wstep *s)
{
    const gang__wstep_config *c = &s->cfg;
    uint64_t interval = (uint64_t)c->heartbeat_interval_ms;
    uint64_t timeout = (uint64_t)c->heartbeat_timeout_ms + 2 * interval;
    while (!atomic_load(&s->stop)) {
        if (c->rank == 0)
            wstep_admit(s, NULL);
        wstep_idle_wait(s, interval);
        int rc = gang_comm_barrier(s->world, timeout);
        if (rc != 0)
            return wstep_fail(s, rc, (int32_t)c->rank, "rank %u: data-plane barrier failed: %s",
                              c->rank, gang_strerror(rc));
    }
    return GANG_EABORTED;
}

/*
 * Every rank sized its KV pool from its own memory: the gang uses the smallest, which
 * every rank learns from one all-gather of the block counts over the world (rank 0's
 * scheduler then hands out no block another rank lacks). After the engine's reset.
 */
static int wstep_agree_blocks(gang__wstep *s, gang__wres *res)
{
    const gang__wstep_config *c = &s->cfg;
    gang_engine_kv kv;
    int32_t mine, *all = calloc(c->world, sizeof(int32_t));
    uint32_t i, least;
    int rc;

    if (all == NULL)
        return wstep_fail(s, GANG_ENOMEM, (int32_t)c->rank, "rank %u: out of memory", c->rank);
    gang_engine_kv_info(res->engine, &kv);
    /* The pool this rank allocated, not a limit an earlier generation agreed on. */
    mine = (int32_t)res->n_blocks;
    rc = gang_comm_all_gather(s->world, &mine, all, 1, GANG_DTYPE_I32,
                              (uint64_t)c->start_timeout_ms);
    least = (uint32_t)mine;
    for (i = 0; rc == 0 && i < c->world; i++)
        least = (uint32_t)all[i] < least ? (uint32_t)all[i] : least;
    free(all);
    if (rc == 0)
        rc = gang_engine_limit_blocks(res->engine, least);
    if (rc != 0)
        return wstep_fail(s, rc, (int32_t)c->rank, "rank %u: agreeing on the KV blocks: %s",
                          c->rank, gang_strerror(rc));
    if (least < kv.blocks || (c->rank == 0 && least != kv.blocks))
        gang_info("KV cache: the gang uses %u blocks (the smallest rank's pool)", least);
    return 0;
}

static void *wstep_thread(void *arg)
{
    gang__wstep *s = arg;
    const gang__wstep_config *c = &s->cfg;
    gang__wres *res = c->res;
    char err[GANG_REASON_MAX] = "";
    uint64_t deadline = gang_now_ms() + (uint64_t)c->start_timeout_ms;
    int rc = wres_wait(res, deadline, &s->stop, err, sizeof(err));
    if (rc != 0) {
        wstep_fail(s, rc, (int32_t)c->rank, "rank %u: %s", c->rank, err);
        return NULL;
    }
    rc = wstep_comms(s, res);
    if (rc != 0)
        return NULL;
    if (res->engine != NULL) {
        gang_engine_reset(res->engine);
        if (wstep_agree_blocks(s, res) != 0)
            return NULL;
    }
    gang__wevent ev;
    memset(&ev, 0, sizeof(ev));
    ev.type = GANG__WEV_READY;
    if (res->engine != NULL && gang_engine_kv_info(res->engine, &ev.kv) == 0)
        ev.has_kv = 1;
    wstep_event(s, &ev);
    if (res->engine != NULL)
        wstep_serve(s, res);
    else
        wstep_tick(s);
    return NULL;
}

int gang__wstep_start(const gang__wstep_config *cfg, gang__wstep **out)
{
    *out = NULL;
    if (cfg->world == 0 || cfg->rank >= cfg->world || cfg->blob_len > GANG_BLOB_MAX ||
        (cfg->blob_len > 0 && cfg->blob == NULL) || cfg->res == NULL ||
        cfg->start_timeout_ms <= 0 || cfg->heartbeat_interval_ms <= 0) {
        gang_bootstrap_free(cfg->root);
        return GANG_EINVAL;
    }
    gang__wstep *s = calloc(1, sizeof(*s));
    if (s == NULL) {
        gang_bootstrap_free(cfg->root);
        return GANG_ENOMEM;
    }
    s->cfg = *cfg;
    if (cfg->blob_len > 0)
        memcpy(s->blob, cfg->blob, cfg->blob_len);
    s->cfg.blob = s->blob;
    atomic_init(&s->stop, 0);
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    s->cancel_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    int rc = s->cancel_fd < 0 ? gang_err_from_errno(errno) : 0;
    if (rc == 0) {
        rc = pthread_create(&s->th, NULL, wstep_thread, s);
        rc = rc != 0 ? gang_err_from_errno(rc) : 0;
    }
    if (rc != 0) {
        gang_bootstrap_free(s->cfg.root);
        s->cfg.root = NULL;
        gang__wstep_stop(s);
        return rc;
    }
    s->started = 1;
    *out = s;
    return 0;
}

int gang__wstep_submit(gang__wstep *s, const gang_gen_request *r)
{
    if (s == NULL || r == NULL)
        return GANG_EINVAL;
    wreq *q = malloc(sizeof(*q) + (size_t)r->n_prompt * sizeof(int32_t));
    if (q == NULL)
        return GANG_ENOMEM;
    q->next = NULL;
    q->r = *r;
    if (r->n_prompt > 0)
        memcpy(q->prompt, r->prompt, (size_t)r->n_prompt * sizeof(int32_t));
    q->r.prompt = q->prompt;
    pthread_mutex_lock(&s->mu);
    if (s->tail != NULL)
        s->tail->next = q;
    else
        s->head = q;
    s->tail = q;
    s->queued++;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return 0;
}

int gang__wstep_cancel(gang__wstep *s, uint64_t id)
{
    int rc = 0;
    pthread_mutex_lock(&s->mu);
    if (s->n_cancels == s->cap_cancels) {
        uint32_t cap = s->cap_cancels ? 2 * s->cap_cancels : 16;
        uint64_t *c = realloc(s->cancels, cap * sizeof(*c));
        if (c == NULL) {
            rc = GANG_ENOMEM;
            goto out_unlock;
        }
        s->cancels = c;
        s->cap_cancels = cap;
    }
    s->cancels[s->n_cancels++] = id;
    pthread_cond_signal(&s->cv);
out_unlock:
    pthread_mutex_unlock(&s->mu);
    return rc;
}

void gang__wstep_stop(gang__wstep *s)
{
    if (s == NULL)
        return;
    atomic_store(&s->stop, 1);
    if (s->cancel_fd >= 0) {
        uint64_t one = 1;
        ssize_t n = write(s->cancel_fd, &one, sizeof(one));
        (void)n;
    }
    pthread_mutex_lock(&s->mu);
    if (s->world != NULL)
        gang_comm_abort(s->world);
    if (s->tp != NULL)
        gang_comm_abort(s->tp);
    if (s->pp != NULL)
        gang_comm_abort(s->pp);
    if (s->ep != NULL)
        gang_comm_abort(s->ep);
    if (s->nworld != NULL)
        gang_comm_abort(s->nworld);
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    if (s->started)
        pthread_join(s->th, NULL);
    /* Children before their parents; the nccl ones were aborted above, so freeing them
     * aborts rather than flushes. */
    gang_comm_free(s->tp);
    gang_comm_free(s->pp);
    gang_comm_free(s->ep);
    gang_comm_free(s->nworld);
    gang_comm_free(s->world);
    while (s->head != NULL) {
        wreq *n = s->head->next;
        free(s->head);
        s->head = n;
    }
    gang_bootstrap_free(s->cfg.root);
    free(s->cancels);
    if (s->cancel_fd >= 0)
        close(s->cancel_fd);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s);
}
