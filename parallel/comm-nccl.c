/*
 * NCCL backend of the communicator: device buffers, one CUDA stream per communicator, and
 * no call that can block without a deadline (docs/design.md §4).
 *
 * Blocking modes. The world communicator (gang_comm_init) is created non-blocking
 * (config.blocking = 0): its init returns ncclInProgress instead of blocking, so a peer
 * that never arrives is bounded by the init deadline and the cancel fd. A split child (the
 * TP and PP groups, which carry every per-token operation) is created blocking
 * (config.blocking = 1): with a non-blocking communicator NCCL runs each operation's group
 * launch on a thread it starts for that call (pthread_create per collective in 2.28's
 * ncclGroupEnd), which at two all-reduces per layer per token costs more than the
 * collectives themselves. The split itself still follows the non-blocking parent (NCCL
 * launches the child's init as a job of the parent), so it is awaited with the deadline.
 * A blocking operation's host part could still block on a peer when NCCL connects peers
 * lazily at the first operation; nccl_load() therefore asks NCCL to connect them at init
 * (NCCL_RUNTIME_CONNECT=0 unless the environment chose), where the deadline holds. What is
 * left of an operation on a blocking communicator runs on the GPU, and is awaited here.
 *
 * Wait protocol. The driving thread waits in nccl_wait(), which polls until the operation
 * is done, an error appears, the deadline passes or the communicator is aborted:
 *
 *   loop:  st = nccl_lib.ncclCommGetAsyncError(comm)
 *          st is an error                   -> ncclCommAbort, GANG_EPEER / GANG_EIO
 *          st == ncclSuccess and the work is
 *          done (cudaStreamQuery == success,
 *          or nothing on the stream: init)   -> return 0
 *          gang_comm_abort() was called     -> ncclCommAbort, GANG_EABORTED
 *          the deadline passed              -> ncclCommAbort, GANG_ETIMEDOUT
 *          spin for NCCL_SPIN_NS, then sleep from 10 us, doubling, never longer
 *          than NCCL_SLEEP_MAX_NS nor past the deadline
 *
 * Abort during init. gang_comm_init() has not returned a handle yet, so the caller's
 * cancel fd (gang_comm_config.cancel_fd, as for the socket backend) is polled instead:
 * once it is readable the init is aborted and returns GANG_EABORTED.
 *
 * Abort from another thread. gang_comm_abort() only sets the front's flag (this backend's
 * abort entry does nothing else): NCCL does not promise that ncclCommAbort is safe while
 * another thread is inside a call on the same communicator, so the thread that drives the
 * communicator, polling in nccl_wait(), sees the flag within one poll step (<= 1 ms) and
 * calls ncclCommAbort itself. A communicator that is aborted while no operation runs is
 * aborted (not finalized) by gang_comm_free().
 *
 * Device. The communicator uses the calling thread's current CUDA device at init (a
 * worker opens its kernels handle, which selects its GPU, first); every later call makes
 * that device current again.
 *
 * Point-to-point. NCCL has no tags: a send matches the receive that the peer issues in
 * the same position of its sequence of receives from this rank. The tag is therefore not
 * carried, and callers must issue sends and receives between two ranks in the same order
 * on both sides (the pipeline schedule does: per neighbour, tags increase in step).
 * An empty message (bytes == 0) still synchronises: it is sent as a one-byte token.
 *
 * Ordering with compute. Operations run on the communicator's own stream. The caller
 * orders an operation after its compute stream with gang_comm_order_after (nccl_order:
 * an event recorded on the compute stream, waited for by this stream on the device), so
 * a GEMM and its all-reduce follow each other on the GPU with no host wait between them;
 * after the operation an event on this stream is waited for by the compute stream, so
 * later kernels see the result in device order too. Such an ordered operation on a
 * blocking communicator (the TP and PP groups) is not awaited on the host (issue #24):
 * it returns once enqueued, after a non-blocking look at NCCL's asynchronous error and
 * the abort flag, and is marked pending. gang_comm_settle (nccl_settle), which the engine
 * calls once per step before the step's one download, runs nccl_wait over everything
 * pending with the step's deadline, so errors, aborts and hung peers are still caught and
 * bounded, by one host wait per step instead of one per collective. An operation that is
 * not ordered (no caller stream: tests, the staging of a host world) still waits, and so
 * settles what was pending before it (docs/gpu.md).
 *
 * Graphs. Because an ordered operation returns at enqueue, a caller may capture it into a
 * CUDA graph being recorded on its stream (gang_comm_graph_ok): the events above fork
 * this stream into the capture and join it back, and NCCL captures its kernels, as it
 * supports since 2.9. A replay runs those kernels on the caller's stream, not here, so
 * after cudaGraphLaunch the caller calls gang_comm_pend_on: an event recorded on its
 * stream becomes part of what the next settle (or waiting operation) awaits, with the
 * same deadline, error and abort checks; an abort makes NCCL's kernels in the graph
 * return, so the stream drains.
 */
#include <dlfcn.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include "comm-backend.h"

#define NCCL_SPIN_NS 100000ull       /* busy-poll this long before sleeping */
#define NCCL_SLEEP_MIN_NS 10000ull   /* first sleep after the spin */
#define NCCL_SLEEP_MAX_NS 1000000ull /* longest sleep between polls */
#define NCCL_FINALIZE_MS 10000u      /* bound of the flush in gang_comm_free */

typedef struct nccl_impl {
    ncclComm_t comm;      /* NULL once aborted or destroyed */
    cudaStream_t stream;  /* every operation of this communicator runs here */
    int device;           /* CUDA ordinal, current at init */
    void *scratch;        /* 256 device bytes: barrier word and empty-message token */
    int failed;           /* an error was seen: free aborts instead of finalizing */
    int cancel_fd;        /* during init only: cfg->cancel_fd, or -1 */
    cudaEvent_t ev_in;    /* recorded on the caller's stream by nccl_order */
    cudaEvent_t ev_out;   /* recorded on this stream after the ordered operation */
    cudaStream_t after;   /* the caller's stream until the next operation, else NULL */
    int blocking;         /* a split child: created with config.blocking = 1 */
    int pending;          /* ordered operations were enqueued and not yet awaited */
    cudaEvent_t ev_graph; /* recorded on the stream a graph of our operations was launched on */
    int graph_pending;    /* ev_graph is part of what is pending (gang_comm_pend_on) */
    int wait_each;        /* gang_comm_config.wait_each: no pending, a wait per operation */
} nccl_impl;

/* ---------------------------------------------------------------------------------
 * libnccl is loaded at run time, not linked: every process of the binary (the agent, the
 * CPU workers, `ganglion info`) starts without it, and a node without NCCL can still run
 * everything but this backend. The soname comes from the nccl.h the code was compiled
 * against; the directory of the library found at build time (GANG_NCCL_LIBDIR) is the
 * fallback when the loader's search does not find it. Calls go through nccl_lib, whose
 * members carry the library's function names.
 * --------------------------------------------------------------------------------- */
#define NCCL_STR_(x) #x
#define NCCL_STR(x) NCCL_STR_(x)
#ifndef GANG_NCCL_LIBDIR
#define GANG_NCCL_LIBDIR ""
#endif

static struct {
    __typeof__(&ncclGetUniqueId) ncclGetUniqueId;
    __typeof__(&ncclGetErrorString) ncclGetErrorString;
    __typeof__(&ncclGetLastError) ncclGetLastError;
    __typeof__(&ncclCommInitRankConfig) ncclCommInitRankConfig;
    __typeof__(&ncclCommGetAsyncError) ncclCommGetAsyncError;
    __typeof__(&ncclCommAbort) ncclCommAbort;
    __typeof__(&ncclCommFinalize) ncclCommFinalize;
    __typeof__(&ncclCommDestroy) ncclCommDestroy;
    __typeof__(&ncclCommSplit) ncclCommSplit;
    __typeof__(&ncclCommUserRank) ncclCommUserRank;
    __typeof__(&ncclCommCount) ncclCommCount;
    __typeof__(&ncclAllReduce) ncclAllReduce;
    __typeof__(&ncclAllGather) ncclAllGather;
    __typeof__(&ncclBroadcast) ncclBroadcast;
    __typeof__(&ncclSend) ncclSend;
    __typeof__(&ncclRecv) ncclRecv;
    __typeof__(&ncclGroupStart) ncclGroupStart;
    __typeof__(&ncclGroupEnd) ncclGroupEnd;
} nccl_lib;

#define NCCL_ENTRY(fn)                                                                             \
    {                                                                                              \
        NCCL_STR(fn), (void **)&nccl_lib.fn                                                        \
    }
static const struct {
    const char *name;
    void **slot;
} nccl_entries[] = {
    NCCL_ENTRY(ncclGetUniqueId),
    NCCL_ENTRY(ncclGetErrorString),
    NCCL_ENTRY(ncclGetLastError),
    NCCL_ENTRY(ncclCommInitRankConfig),
    NCCL_ENTRY(ncclCommGetAsyncError),
    NCCL_ENTRY(ncclCommAbort),
    NCCL_ENTRY(ncclCommFinalize),
    NCCL_ENTRY(ncclCommDestroy),
    NCCL_ENTRY(ncclCommSplit),
    NCCL_ENTRY(ncclCommUserRank),
    NCCL_ENTRY(ncclCommCount),
    NCCL_ENTRY(ncclAllReduce),
    NCCL_ENTRY(ncclAllGather),
    NCCL_ENTRY(ncclBroadcast),
    NCCL_ENTRY(ncclSend),
    NCCL_ENTRY(ncclRecv),
    NCCL_ENTRY(ncclGroupStart),
    NCCL_ENTRY(ncclGroupEnd),
};

static pthread_once_t nccl_once = PTHREAD_ONCE_INIT;
static int nccl_load_rc;
static char nccl_loaded[1024]; /* the file mapped, once loaded */

/* Loads libnccl (common/dynlib.c's search: --nccl-library, the Python environment's
 * nvidia.nccl package, the loader's path, the build's directory) and every entry point
 * once; the library is never unloaded. */
static void nccl_load_once(void)
{
    static const char *const py_packages[] = {"nvidia.nccl", NULL};
    const char *soname = "libnccl.so." NCCL_STR(NCCL_MAJOR);
    const gang_dynlib spec = {.what = "comm/nccl",
                              .soname = soname,
                              .flag = "nccl-library",
                              .py_packages = py_packages,
                              .build_dir = GANG_NCCL_LIBDIR,
                              .probe_symbol = "ncclGetVersion"};
    char *loaded = nccl_loaded;
    size_t loaded_cap = sizeof(nccl_loaded);
    void *lib = NULL;

    nccl_load_rc = GANG_EIO;
    /* Connections at init, under the deadline, not inside a blocking operation (see the
     * file comment); NCCL reads the variable once, at its first communicator. An operator's
     * own choice is kept (overwrite = 0). */
    setenv("NCCL_RUNTIME_CONNECT", "0", 0);
    if (gang_dynlib_open(&spec, &lib, loaded, loaded_cap) != 0)
        return;
    for (size_t i = 0; i < sizeof(nccl_entries) / sizeof(nccl_entries[0]); i++) {
        *nccl_entries[i].slot = dlsym(lib, nccl_entries[i].name);
        if (*nccl_entries[i].slot == NULL) {
            gang_error("comm/nccl: %s has no %s: %s", loaded, nccl_entries[i].name, dlerror());
            return;
        }
    }
    nccl_load_rc = 0;
}

/* 0 once libnccl is usable, GANG_EIO (logged) when it cannot be loaded. */
static int nccl_load(void)
{
    pthread_once(&nccl_once, nccl_load_once);
    return nccl_load_rc;
}

int gang_comm_nccl_library(char *path, size_t cap)
{
    int rc = nccl_load();

    gang_strlcpy(path, rc == 0 ? nccl_loaded : "", cap);
    return rc;
}

/* ---------------------------------------------------------------------------------
 * The unique id travels as the bootstrap blob, hex-encoded so that it is printable and
 * NUL-free like the socket backend's blob.
 * --------------------------------------------------------------------------------- */
#define NCCL_BLOB_LEN (2 * NCCL_UNIQUE_ID_BYTES)

int gang_comm_nccl_unique_id(uint8_t *blob, size_t cap, size_t *len)
{
    static const char hex[] = "0123456789abcdef";
    ncclUniqueId id;
    ncclResult_t r;

    if (blob == NULL || len == NULL)
        return GANG_EINVAL;
    if (cap < NCCL_BLOB_LEN)
        return GANG_ERANGE;
    if (nccl_load() < 0)
        return GANG_EIO;
    r = nccl_lib.ncclGetUniqueId(&id);
    if (r != ncclSuccess) {
        gang_error("comm/nccl: ncclGetUniqueId: %s", nccl_lib.ncclGetErrorString(r));
        return r == ncclSystemError ? GANG_EIO : GANG_EINTERNAL;
    }
    for (size_t i = 0; i < NCCL_UNIQUE_ID_BYTES; i++) {
        uint8_t b = (uint8_t)id.internal[i];

        blob[2 * i] = (uint8_t)hex[b >> 4];
        blob[2 * i + 1] = (uint8_t)hex[b & 15];
    }
    *len = NCCL_BLOB_LEN;
    return 0;
}

static int blob_to_id(const uint8_t *blob, size_t len, ncclUniqueId *id)
{
    if (blob == NULL || len != NCCL_BLOB_LEN)
        return GANG_EINVAL;
    for (size_t i = 0; i < NCCL_UNIQUE_ID_BYTES; i++) {
        int hi = gang_hex_digit(blob[2 * i]), lo = gang_hex_digit(blob[2 * i + 1]);

        if (hi < 0 || lo < 0)
            return GANG_EINVAL;
        id->internal[i] = (char)(hi << 4 | lo);
    }
    return 0;
}

/* ---------------------------------------------------------------------------------
 * Errors and the wait loop.
 * --------------------------------------------------------------------------------- */
static int nccl_err(ncclResult_t r)
{
    switch (r) {
    case ncclSuccess:
    case ncclInProgress:
        return 0;
    case ncclInvalidArgument:
    case ncclInvalidUsage:
        return GANG_EINVAL;
    case ncclRemoteError:
    case ncclSystemError:
        return GANG_EPEER; /* a peer vanished or the network failed under us */
    default:
        return GANG_EIO;
    }
}

static int nccl_log(nccl_impl *im, ncclResult_t r, const char *what)
{
    int rc = nccl_err(r);

    if (rc < 0) {
        gang_error("comm/nccl: %s: %s (%s)", what, nccl_lib.ncclGetErrorString(r),
                   im != NULL && im->comm != NULL ? nccl_lib.ncclGetLastError(im->comm) : "");
        if (im != NULL)
            im->failed = 1;
    }
    return rc;
}

/* Also clears the runtime's last error, so a later launch check is not blamed for it. */
static int cuda_log(cudaError_t e, const char *what)
{
    if (e == cudaSuccess)
        return 0;
    (void)cudaGetLastError();
    gang_error("comm/nccl: %s: %s", what, cudaGetErrorString(e));
    return e == cudaErrorMemoryAllocation ? GANG_ENOMEM : GANG_EIO;
}

static void nccl_abort_now(nccl_impl *im)
{
    if (im->comm != NULL) {
        nccl_lib.ncclCommAbort(im->comm);
        im->comm = NULL;
    }
    im->failed = 1;
}

/*
 * One pause of the wait loop: nothing during the first NCCL_SPIN_NS (a collective of a
 * decode step takes tens of microseconds), then sleeps that start at NCCL_SLEEP_MIN_NS
 * and double up to NCCL_SLEEP_MAX_NS, each cut to what is left before the deadline, so
 * neither the cap nor the deadline is overshot by more than the scheduler's own latency.
 */
static void nccl_pause(uint64_t start_ns, uint64_t deadline_ms, uint64_t *sleep_ns)
{
    uint64_t now = gang_now_ns(), left, d;
    struct timespec ts;

    if (now - start_ns < NCCL_SPIN_NS)
        return;
    if (deadline_ms > UINT64_MAX / 1000000ull)
        left = UINT64_MAX; /* a saturated deadline (gang_deadline_after) */
    else
        left = deadline_ms * 1000000ull > now ? deadline_ms * 1000000ull - now : 0;
    d = *sleep_ns < left ? *sleep_ns : left;
    if (d == 0)
        return;
    ts.tv_sec = (time_t)(d / 1000000000ull);
    ts.tv_nsec = (long)(d % 1000000000ull);
    nanosleep(&ts, NULL);
    *sleep_ns = *sleep_ns * 2 < NCCL_SLEEP_MAX_NS ? *sleep_ns * 2 : NCCL_SLEEP_MAX_NS;
}

/* Init only: the caller's cancel fd (gang_comm_config.cancel_fd) became readable. */
static int nccl_cancelled(const nccl_impl *im)
{
    struct pollfd p = {.fd = im->cancel_fd, .events = POLLIN};

    return im->cancel_fd >= 0 && poll(&p, 1, 0) > 0;
}

/*
 * Waits for the communicator's pending work (see the file comment for the loop). With
 * on_stream == 0 only the communicator state is awaited (init, split); otherwise also the
 * stream. On every error path the communicator is aborted, so it is never left with work
 * in flight that could write into buffers the caller reuses.
 */
static int nccl_wait(gang_comm *c, nccl_impl *im, ncclComm_t comm, int on_stream,
                     uint64_t deadline_ms, const char *what)
{
    uint64_t start = gang_now_ns(), sleep_ns = NCCL_SLEEP_MIN_NS;
    ncclResult_t st;
    cudaError_t e;
    int rc;

    for (;;) {
        if (nccl_lib.ncclCommGetAsyncError(comm, &st) != ncclSuccess)
            st = ncclInternalError;
        if (st != ncclSuccess && st != ncclInProgress) {
            rc = nccl_log(im, st, what);
            goto out_abort;
        }
        if (st == ncclSuccess) {
            if (!on_stream)
                return 0;
            e = cudaStreamQuery(im->stream);
            if (e == cudaSuccess && im->graph_pending && comm == im->comm)
                e = cudaEventQuery(im->ev_graph);
            if (e == cudaSuccess)
                return 0;
            if (e != cudaErrorNotReady) {
                rc = cuda_log(e, what);
                goto out_abort;
            }
        }
        if (atomic_load(&c->aborted) || nccl_cancelled(im)) {
            rc = GANG_EABORTED;
            goto out_abort;
        }
        if (gang_now_ms() >= deadline_ms) {
            gang_error("comm/nccl: %s: deadline passed, aborting the communicator", what);
            rc = GANG_ETIMEDOUT;
            goto out_abort;
        }
        nccl_pause(start, deadline_ms, &sleep_ns);
    }

out_abort:
    if (comm != im->comm) /* a split child still forming */
        nccl_lib.ncclCommAbort(comm);
    nccl_abort_now(im);
    return rc;
}

/* Common prologue: the communicator is alive and its device is current. */
static int nccl_enter(nccl_impl *im)
{
    if (im->comm == NULL || im->failed)
        return GANG_EABORTED;
    return cuda_log(cudaSetDevice(im->device), "cudaSetDevice");
}

static ncclDataType_t nccl_dtype(gang_dtype dt)
{
    switch (dt) {
    case GANG_DTYPE_F16:
        return ncclFloat16;
    case GANG_DTYPE_BF16:
        return ncclBfloat16;
    case GANG_DTYPE_I32:
        return ncclInt32;
    case GANG_DTYPE_F32:
        break;
    }
    return ncclFloat32;
}

/* ---------------------------------------------------------------------------------
 * Life cycle.
 * --------------------------------------------------------------------------------- */

/* Stream and scratch of a new communicator on the current device. */
static int nccl_impl_new(nccl_impl **out)
{
    nccl_impl *im = calloc(1, sizeof(*im));
    int rc;

    *out = NULL;
    if (im == NULL)
        return GANG_ENOMEM;
    im->cancel_fd = -1;
    if ((rc = cuda_log(cudaGetDevice(&im->device), "no CUDA device")) < 0)
        goto out_free;
    rc =
        cuda_log(cudaStreamCreateWithFlags(&im->stream, cudaStreamNonBlocking), "cudaStreamCreate");
    if (rc < 0)
        goto out_free;
    if ((rc = cuda_log(cudaMalloc(&im->scratch, 256), "cudaMalloc of the scratch")) < 0)
        goto out_stream;
    rc = cuda_log(cudaEventCreateWithFlags(&im->ev_in, cudaEventDisableTiming), "cudaEventCreate");
    if (rc < 0)
        goto out_scratch;
    rc = cuda_log(cudaEventCreateWithFlags(&im->ev_out, cudaEventDisableTiming), "cudaEventCreate");
    if (rc < 0)
        goto out_ev_in;
    rc = cuda_log(cudaEventCreateWithFlags(&im->ev_graph, cudaEventDisableTiming),
                  "cudaEventCreate");
    if (rc < 0)
        goto out_ev_out;
    *out = im;
    return 0;

out_ev_out:
    cudaEventDestroy(im->ev_out);
out_ev_in:
    cudaEventDestroy(im->ev_in);
out_scratch:
    cudaFree(im->scratch);
out_stream:
    cudaStreamDestroy(im->stream);
out_free:
    cudaGetLastError();
    free(im);
    return rc;
}

static void nccl_impl_release(nccl_impl *im)
{
    cudaSetDevice(im->device);
    if (im->ev_in != NULL)
        cudaEventDestroy(im->ev_in);
    if (im->ev_out != NULL)
        cudaEventDestroy(im->ev_out);
    if (im->ev_graph != NULL)
        cudaEventDestroy(im->ev_graph);
    if (im->scratch != NULL)
        cudaFree(im->scratch);
    if (im->stream != NULL)
        cudaStreamDestroy(im->stream);
    free(im);
}

static int nccl_init(gang_comm *c, const gang_comm_config *cfg)
{
    ncclConfig_t conf = NCCL_CONFIG_INITIALIZER;
    ncclUniqueId id;
    nccl_impl *im;
    uint64_t deadline = gang_now_ms() + cfg->timeout_ms;
    int n = 0, rc;

    if (blob_to_id(cfg->blob, cfg->blob_len, &id) < 0) {
        gang_error("comm/nccl: the bootstrap blob is not a unique id from "
                   "gang_comm_nccl_unique_id (%zu bytes)",
                   cfg->blob_len);
        return GANG_EINVAL;
    }
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
        cudaGetLastError();
        gang_error("comm/nccl: no usable GPU");
        return GANG_EIO;
    }
    if (nccl_load() < 0)
        return GANG_EIO;
    if ((rc = nccl_impl_new(&im)) < 0)
        return rc;
    c->impl = im;
    im->cancel_fd = cfg->cancel_fd != NULL ? *cfg->cancel_fd : -1;
    im->wait_each = cfg->wait_each;
    conf.blocking = 0;
    rc = nccl_log(
        im,
        nccl_lib.ncclCommInitRankConfig(&im->comm, (int)cfg->world_size, id, (int)cfg->rank, &conf),
        "ncclCommInitRankConfig");
    if (rc < 0) {
        if (im->comm != NULL)
            nccl_abort_now(im);
        goto out_free;
    }
    rc = nccl_wait(c, im, im->comm, 0, deadline, "ncclCommInitRankConfig");
    im->cancel_fd = -1; /* from here gang_comm_abort() is the way to stop it */
    if (rc < 0)
        goto out_free;
    return 0;

out_free:
    nccl_impl_release(im);
    c->impl = NULL;
    return rc;
}

/*
 * A healthy non-blocking communicator is finalized (its pending work flushed, bounded by
 * NCCL_FINALIZE_MS) and destroyed; one that failed or was aborted is aborted, which never
 * waits for peers. A blocking one (a split child) is always aborted: its finalize would
 * block the thread without a deadline, and it has no pending work to flush, since every
 * operation was awaited before it returned.
 */
static void nccl_free(gang_comm *c)
{
    nccl_impl *im = c->impl;

    if (im == NULL)
        return;
    cudaSetDevice(im->device);
    if (im->comm != NULL && !im->blocking && !im->failed && !atomic_load(&c->aborted)) {
        uint64_t deadline = gang_now_ms() + NCCL_FINALIZE_MS;

        if (nccl_log(im, nccl_lib.ncclCommFinalize(im->comm), "ncclCommFinalize") == 0 &&
            nccl_wait(c, im, im->comm, 0, deadline, "ncclCommFinalize") == 0) {
            nccl_lib.ncclCommDestroy(im->comm);
            im->comm = NULL;
        }
    }
    nccl_abort_now(im);
    nccl_impl_release(im);
    c->impl = NULL;
}

/*
 * ncclCommSplit of every rank of c. The child is blocking (its operations start no
 * thread, see the file comment); the split is a job of the non-blocking parent and is
 * awaited with the deadline. The child gets its own stream; its rank and size come from
 * NCCL itself.
 */
static int nccl_split(gang_comm *c, uint32_t color, uint32_t key, uint64_t tmo, gang_comm *child)
{
    nccl_impl *im = c->impl, *ch;
    ncclConfig_t conf = NCCL_CONFIG_INITIALIZER;
    ncclComm_t nc = NULL;
    uint64_t deadline = gang_now_ms() + tmo;
    int rank = 0, size = 0, rc;

    if (color > INT32_MAX || key > INT32_MAX)
        return GANG_EINVAL;
    if ((rc = nccl_enter(im)) < 0)
        return rc;
    if ((rc = nccl_impl_new(&ch)) < 0)
        return rc;
    conf.blocking = 1;
    rc = nccl_log(im, nccl_lib.ncclCommSplit(im->comm, (int)color, (int)key, &nc, &conf),
                  "ncclCommSplit");
    if (rc < 0) {
        nccl_abort_now(im);
        goto out_child;
    }
    /* The parent's state covers the split's collective part, the child's its init. */
    if ((rc = nccl_wait(c, im, im->comm, 0, deadline, "ncclCommSplit")) < 0)
        goto out_nc;
    if (nc == NULL) {
        rc = GANG_EINTERNAL;
        goto out_child;
    }
    if ((rc = nccl_wait(c, im, nc, 0, deadline, "ncclCommSplit (child)")) < 0)
        goto out_child; /* nccl_wait aborted nc */
    ch->comm = nc;
    ch->blocking = 1;
    ch->wait_each = im->wait_each;
    if ((rc = nccl_log(ch, nccl_lib.ncclCommUserRank(nc, &rank), "ncclCommUserRank")) < 0 ||
        (rc = nccl_log(ch, nccl_lib.ncclCommCount(nc, &size), "ncclCommCount")) < 0) {
        nccl_abort_now(ch);
        goto out_child;
    }
    child->rank = (uint32_t)rank;
    child->size = (uint32_t)size;
    child->impl = ch;
    return 0;

out_nc:
    if (nc != NULL)
        nccl_lib.ncclCommAbort(nc);
out_child:
    nccl_impl_release(ch);
    return rc;
}

/* ---------------------------------------------------------------------------------
 * Operations: enqueue on the communicator's stream, then wait with the deadline.
 * --------------------------------------------------------------------------------- */

/*
 * gang_comm_order_after: records ev_in on the caller's stream now, so the next operation
 * waits for exactly the work enqueued there so far; the stream is remembered to wait, in
 * turn, for that operation (nccl_finish).
 */
static int nccl_order(gang_comm *c, void *stream)
{
    nccl_impl *im = c->impl;
    int rc = nccl_enter(im);

    if (rc < 0)
        return rc;
    rc = cuda_log(cudaEventRecord(im->ev_in, (cudaStream_t)stream), "cudaEventRecord (order)");
    if (rc < 0)
        return rc;
    im->after = (cudaStream_t)stream;
    return 0;
}

/*
 * An ordered operation left pending: no host wait, but an error NCCL already reports, or
 * an abort, fails it now (and aborts, as nccl_wait would).
 */
static int nccl_pend(gang_comm *c, nccl_impl *im, const char *what)
{
    ncclResult_t st;
    int rc;

    if (nccl_lib.ncclCommGetAsyncError(im->comm, &st) != ncclSuccess)
        st = ncclInternalError;
    if (st != ncclSuccess && st != ncclInProgress) {
        rc = nccl_log(im, st, what);
        nccl_abort_now(im);
        return rc;
    }
    if (atomic_load(&c->aborted)) {
        nccl_abort_now(im);
        return GANG_EABORTED;
    }
    im->pending = 1;
    return 0;
}

/* Before an enqueue: this stream waits, on the device, for the caller's ordered work. */
static int nccl_start(nccl_impl *im)
{
    int rc = nccl_enter(im);

    if (rc < 0 || im->after == NULL)
        return rc;
    return cuda_log(cudaStreamWaitEvent(im->stream, im->ev_in, 0), "cudaStreamWaitEvent (in)");
}

/*
 * Finishes an enqueue: a refused call aborts; for an accepted one the caller's ordered
 * stream (if any) waits for it on the device. An ordered operation on a blocking
 * communicator is left pending (gang_comm_settle awaits it) after a look at the error
 * state that does not wait; any other is awaited here with the deadline.
 */
static int nccl_finish(gang_comm *c, nccl_impl *im, ncclResult_t r, uint64_t tmo, const char *what)
{
    uint64_t deadline = gang_deadline_after(tmo);
    cudaStream_t after = im->after;
    int rc = nccl_log(im, r, what);

    im->after = NULL;
    if (rc < 0) {
        nccl_abort_now(im);
        return rc;
    }
    if (after != NULL) {
        rc = cuda_log(cudaEventRecord(im->ev_out, im->stream), "cudaEventRecord (out)");
        if (rc == 0)
            rc = cuda_log(cudaStreamWaitEvent(after, im->ev_out, 0), "cudaStreamWaitEvent (out)");
        if (rc < 0) {
            nccl_abort_now(im);
            return rc;
        }
    }
    if (after != NULL && im->blocking && !im->wait_each)
        return nccl_pend(c, im, what);
    rc = nccl_wait(c, im, im->comm, 1, deadline, what);
    if (rc == 0)
        im->pending = im->graph_pending = 0; /* it waited for whatever was pending before */
    return rc;
}

/* gang_comm_settle: everything pending, awaited once with the step's deadline. */
static int nccl_settle(gang_comm *c, uint64_t tmo)
{
    nccl_impl *im = c->impl;
    int rc;

    if (!im->pending)
        return 0;
    if ((rc = nccl_enter(im)) < 0)
        return rc;
    rc = nccl_wait(c, im, im->comm, 1, gang_deadline_after(tmo), "settle");
    if (rc == 0)
        im->pending = im->graph_pending = 0;
    return rc;
}

/*
 * gang_comm_graph_ok: an ordered operation returns at enqueue (a blocking communicator, not
 * wait_each), so nothing waits on a stream being captured; a failed one captures nothing.
 */
static int nccl_graph_ok(const gang_comm *c)
{
    const nccl_impl *im = c->impl;

    return im->comm != NULL && !im->failed && im->blocking && !im->wait_each;
}

/*
 * gang_comm_pend_on: a graph holding this communicator's operations was launched on stream;
 * the next settle (or waiting operation) also waits for ev_graph, recorded there now.
 */
static int nccl_pend_on(gang_comm *c, void *stream)
{
    nccl_impl *im = c->impl;
    int rc = nccl_enter(im);

    if (rc < 0)
        return rc;
    rc = cuda_log(cudaEventRecord(im->ev_graph, (cudaStream_t)stream), "cudaEventRecord (graph)");
    if (rc < 0) {
        nccl_abort_now(im);
        return rc;
    }
    rc = nccl_pend(c, im, "graph launch");
    if (rc == 0)
        im->graph_pending = 1;
    return rc;
}

static int nccl_all_reduce(gang_comm *c, void *buf, size_t count, gang_dtype dt, uint64_t tmo)
{
    nccl_impl *im = c->impl;
    int rc = nccl_start(im);

    if (rc < 0)
        return rc;
    return nccl_finish(
        c, im,
        nccl_lib.ncclAllReduce(buf, buf, count, nccl_dtype(dt), ncclSum, im->comm, im->stream), tmo,
        "ncclAllReduce");
}

static int nccl_all_gather(gang_comm *c, const void *send, void *recv, size_t count, gang_dtype dt,
                           uint64_t tmo)
{
    nccl_impl *im = c->impl;
    int rc = nccl_start(im);

    if (rc < 0)
        return rc;
    return nccl_finish(
        c, im, nccl_lib.ncclAllGather(send, recv, count, nccl_dtype(dt), im->comm, im->stream), tmo,
        "ncclAllGather");
}

static int nccl_broadcast(gang_comm *c, void *buf, size_t count, gang_dtype dt, uint32_t root,
                          uint64_t tmo)
{
    nccl_impl *im = c->impl;
    int rc = nccl_start(im);

    if (rc < 0)
        return rc;
    return nccl_finish(
        c, im,
        nccl_lib.ncclBroadcast(buf, buf, count, nccl_dtype(dt), (int)root, im->comm, im->stream),
        tmo, "ncclBroadcast");
}

/*
 * All-to-all(v) as one NCCL group of a send and a receive per peer with bytes to move (this
 * rank included: NCCL moves a self send/recv pair on the device), on the communicator's
 * stream, ordered and awaited like every operation (nccl_start / nccl_finish). A failure
 * inside the group aborts the communicator.
 */
static int nccl_all_to_all_v(gang_comm *c, const gang_comm_a2a *a, uint64_t tmo)
{
    nccl_impl *im = c->impl;
    ncclResult_t r = ncclSuccess;
    int rc = nccl_start(im);

    if (rc < 0)
        return rc;
    r = nccl_lib.ncclGroupStart();
    for (uint32_t p = 0; p < c->size && nccl_err(r) == 0; p++) {
        if (a->send_bytes[p] > 0)
            r = nccl_lib.ncclSend((const char *)a->send + a->send_off[p], a->send_bytes[p],
                                  ncclInt8, (int)p, im->comm, im->stream);
        if (nccl_err(r) == 0 && a->recv_bytes[p] > 0)
            r = nccl_lib.ncclRecv((char *)a->recv + a->recv_off[p], a->recv_bytes[p], ncclInt8,
                                  (int)p, im->comm, im->stream);
    }
    if (nccl_err(r) == 0)
        r = nccl_lib.ncclGroupEnd();
    else
        (void)nccl_lib.ncclGroupEnd(); /* close the group the failed call left open */
    return nccl_finish(c, im, r, tmo, "all_to_all_v");
}

static int nccl_send(gang_comm *c, const void *buf, size_t bytes, uint32_t peer, uint32_t tag,
                     uint64_t tmo)
{
    nccl_impl *im = c->impl;
    int rc = nccl_start(im);

    (void)tag; /* not carried: see the file comment */
    if (rc < 0)
        return rc;
    if (bytes == 0) {
        buf = im->scratch;
        bytes = 1;
    }
    return nccl_finish(c, im,
                       nccl_lib.ncclSend(buf, bytes, ncclInt8, (int)peer, im->comm, im->stream),
                       tmo, "ncclSend");
}

static int nccl_recv(gang_comm *c, void *buf, size_t bytes, uint32_t peer, uint32_t tag,
                     uint64_t tmo)
{
    nccl_impl *im = c->impl;
    int rc = nccl_start(im);

    (void)tag;
    if (rc < 0)
        return rc;
    if (bytes == 0) {
        buf = (char *)im->scratch + 128;
        bytes = 1;
    }
    return nccl_finish(c, im,
                       nccl_lib.ncclRecv(buf, bytes, ncclInt8, (int)peer, im->comm, im->stream),
                       tmo, "ncclRecv");
}

/* An all-reduce of one device word: no rank finishes before every rank has joined. */
static int nccl_barrier(gang_comm *c, uint64_t tmo)
{
    nccl_impl *im = c->impl;
    int rc = nccl_start(im);

    if (rc < 0)
        return rc;
    return nccl_finish(c, im,
                       nccl_lib.ncclAllReduce(im->scratch, im->scratch, 1, ncclInt32, ncclSum,
                                              im->comm, im->stream),
                       tmo, "barrier");
}

/* Called by gang_comm_abort() after it set the flag, possibly from another thread: the
 * driving thread's nccl_wait() performs the ncclCommAbort (see the file comment). */
static void nccl_abort(gang_comm *c)
{
    (void)c;
}

const gang__comm_ops gang__comm_nccl_ops = {
    .name = "nccl",
    .caps = GANG_COMM_CAP_DEVICE_MEM,
    .init = nccl_init,
    .free = nccl_free,
    .split = nccl_split,
    .all_reduce = nccl_all_reduce,
    .all_gather = nccl_all_gather,
    .broadcast = nccl_broadcast,
    .send = nccl_send,
    .recv = nccl_recv,
    .barrier = nccl_barrier,
    .all_to_all_v = nccl_all_to_all_v,
    .order_after = nccl_order,
    .settle = nccl_settle,
    .graph_ok = nccl_graph_ok,
    .pend_on = nccl_pend_on,
    .abort = nccl_abort,
};
