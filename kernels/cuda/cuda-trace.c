/*
 * Kernel traces through CUPTI's activity API (gang_kernels_trace_*, kernels.h; issue #24).
 *
 * libcupti is opened at run time, found as cuBLAS is (common/dynlib.c): --cuda-library-dir
 * (GANGLION_CUDA_LIBRARY_DIR), the Python environment's nvidia.cu13 package (the pip wheel
 * nvidia-cuda-cupti, which PyTorch images carry), the loader's search, the toolkit's
 * directory. The soname's major is the CUDA runtime's the code was built with, whose
 * record layout (cupti_activity.h) it reads; only the kernel record's leading fields and
 * its graph ids are read, which later minor versions keep.
 *
 * Enabling (the first handle opened with options.trace, once per process): the activity
 * kind CONCURRENT_KERNEL (kernels may overlap; their nodes inside a graph are recorded
 * too), with two callbacks: CUPTI asks for a buffer (1 MiB, ours) and hands it back full
 * or at a flush, from its own thread or from the flushing one. The hand-back keeps, of
 * each kernel record, its interval, grid, graph id and name (interned: CUPTI's name
 * pointers are shared by a kernel's records, compared first by address), and only when
 * the kernel started at or after the first uncollected span's begin: records from before
 * (warm-ups, loading) are dropped as they arrive, so memory holds what spans need, up to
 * TRACE_MAX_RECS. Tracing stays enabled for the process's life (disabling and enabling
 * again is where CUPTI versions have differed); its cost is a timestamp pair per kernel.
 *
 * Spans are CUPTI timestamps (cuptiGetTimestamp, the records' clock). Collect flushes
 * (forced: partly filled buffers too) without holding the lock the hand-back takes, then
 * sums (kernels/trace.c) and empties the spans and the records. One handle traces at a
 * time (owner).
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cupti.h>

#include "../kernels-trace.h"
#include "cuda-internal.h"

#ifndef GANG_CUDA_LIBDIR
#define GANG_CUDA_LIBDIR "/usr/local/cuda/lib64"
#endif

#define TRACE_BUF_BYTES (1u << 20)
#define TRACE_MAX_RECS (1u << 20)
#define TRACE_MAX_SPANS 65536
#define TRACE_MAX_NAMES 1024

/* The CUPTI entry points used, from the library loaded. */
static struct {
    CUptiResult (*register_callbacks)(CUpti_BuffersCallbackRequestFunc,
                                      CUpti_BuffersCallbackCompleteFunc);
    CUptiResult (*enable)(CUpti_ActivityKind);
    CUptiResult (*flush_all)(uint32_t);
    CUptiResult (*next_record)(uint8_t *, size_t, CUpti_Activity **);
    CUptiResult (*dropped)(CUcontext, uint32_t, size_t *);
    CUptiResult (*timestamp)(uint64_t *);
    CUptiResult (*result_string)(CUptiResult, const char **);
} cupti;

static pthread_once_t trace_once = PTHREAD_ONCE_INIT;
static int trace_enable_rc = GANG_EIO;

/* What the callbacks and the spans share (lock). */
static struct {
    pthread_mutex_t lock;
    gang__trace_rec *recs;
    size_t n_recs, cap_recs;
    gang__trace_span *spans;
    size_t n_spans;
    uint64_t keep_from; /* records starting earlier are not kept; UINT64_MAX: no span */
    uint64_t dropped;   /* past TRACE_MAX_RECS, or lost by CUPTI */
    const void *name_ptr[TRACE_MAX_NAMES];
    char *names[TRACE_MAX_NAMES];
    size_t n_names;
    const void *owner; /* the handle with uncollected spans, or NULL */
} T = {.lock = PTHREAD_MUTEX_INITIALIZER, .keep_from = UINT64_MAX};

/* Logs a CUPTI failure; GANG_EIO. */
static int trace_err(CUptiResult r, const char *what)
{
    const char *s = NULL;

    if (cupti.result_string == NULL || cupti.result_string(r, &s) != CUPTI_SUCCESS || s == NULL)
        s = "unknown CUPTI error";
    gang_error("kernels/cuda: CUPTI %s failed: %s (%d)", what, s, (int)r);
    return GANG_EIO;
}

static void CUPTIAPI trace_buffer_requested(uint8_t **buffer, size_t *size, size_t *max_records)
{
    *buffer = aligned_alloc(8, TRACE_BUF_BYTES);
    *size = *buffer != NULL ? TRACE_BUF_BYTES : 0;
    *max_records = 0;
}

/* The index of name in the table (added when new), or TRACE_MAX_NAMES when it is full. */
static uint32_t trace_intern(const char *name)
{
    size_t i;

    if (name == NULL)
        name = "?";
    for (i = 0; i < T.n_names; i++) /* the address first: one strcmp for most records */
        if (T.name_ptr[i] == (const void *)name && strcmp(T.names[i], name) == 0)
            return (uint32_t)i;
    for (i = 0; i < T.n_names; i++)
        if (strcmp(T.names[i], name) == 0)
            return (uint32_t)i;
    if (T.n_names == TRACE_MAX_NAMES || (T.names[T.n_names] = strdup(name)) == NULL)
        return TRACE_MAX_NAMES;
    T.name_ptr[T.n_names] = name;
    return (uint32_t)T.n_names++;
}

/* Keeps k when it may fall in a span (T.lock held). */
static void trace_keep(const CUpti_ActivityKernel10 *k)
{
    gang__trace_rec *r;
    uint32_t name;

    if (k->start < T.keep_from || k->end < k->start)
        return;
    if (T.n_recs == T.cap_recs) {
        size_t nc = T.cap_recs > 0 ? 2 * T.cap_recs : 4096;
        gang__trace_rec *g;

        if (nc > TRACE_MAX_RECS || (g = realloc(T.recs, nc * sizeof(*g))) == NULL) {
            T.dropped++;
            return;
        }
        T.recs = g;
        T.cap_recs = nc;
    }
    if ((name = trace_intern(k->name)) == TRACE_MAX_NAMES) {
        T.dropped++;
        return;
    }
    r = &T.recs[T.n_recs++];
    r->start = k->start;
    r->end = k->end;
    r->name = name;
    r->grid[0] = (uint32_t)k->gridX;
    r->grid[1] = (uint32_t)k->gridY;
    r->grid[2] = (uint32_t)k->gridZ;
    r->graph = k->graphId != 0;
}

static void CUPTIAPI trace_buffer_completed(CUcontext ctx, uint32_t stream, uint8_t *buffer,
                                            size_t size, size_t valid)
{
    CUpti_Activity *rec = NULL;
    size_t lost = 0;

    (void)size;
    pthread_mutex_lock(&T.lock);
    while (valid > 0 && cupti.next_record(buffer, valid, &rec) == CUPTI_SUCCESS)
        if (rec->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL ||
            rec->kind == CUPTI_ACTIVITY_KIND_KERNEL)
            trace_keep((const CUpti_ActivityKernel10 *)rec);
    if (cupti.dropped(ctx, stream, &lost) == CUPTI_SUCCESS)
        T.dropped += lost;
    pthread_mutex_unlock(&T.lock);
    free(buffer);
}

static const char *const trace_py_packages[] = {"nvidia.cu13", "nvidia.cuda_cupti", NULL};

/* Loads CUPTI and enables the kernel records (once per process: trace_enable_rc). */
static void trace_enable_once(void)
{
    char soname[32], loaded[1024];
    gang_dynlib lib = {.what = "CUPTI",
                       .soname = soname,
                       .flag = "cuda-library-dir",
                       .py_packages = trace_py_packages,
                       .build_dir = GANG_CUDA_LIBDIR,
                       .probe_symbol = "cuptiActivityEnable"};
    void *h = NULL;
    CUptiResult r;

    snprintf(soname, sizeof(soname), "libcupti.so.%d", CUDART_VERSION / 1000);
    if ((trace_enable_rc = gang_dynlib_open(&lib, &h, loaded, sizeof(loaded))) < 0)
        return;
#define TRACE_SYM(field, sym)                                                                      \
    if ((*(void **)&cupti.field = dlsym(h, sym)) == NULL) {                                        \
        gang_error("kernels/cuda: %s lacks %s", loaded, sym);                                      \
        trace_enable_rc = GANG_EIO;                                                                \
        return;                                                                                    \
    }
    TRACE_SYM(register_callbacks, "cuptiActivityRegisterCallbacks")
    TRACE_SYM(enable, "cuptiActivityEnable")
    TRACE_SYM(flush_all, "cuptiActivityFlushAll")
    TRACE_SYM(next_record, "cuptiActivityGetNextRecord")
    TRACE_SYM(dropped, "cuptiActivityGetNumDroppedRecords")
    TRACE_SYM(timestamp, "cuptiGetTimestamp")
    TRACE_SYM(result_string, "cuptiGetResultString")
#undef TRACE_SYM
    r = cupti.register_callbacks(trace_buffer_requested, trace_buffer_completed);
    if (r != CUPTI_SUCCESS) {
        trace_enable_rc = trace_err(r, "cuptiActivityRegisterCallbacks");
        return;
    }
    r = cupti.enable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
    if (r != CUPTI_SUCCESS) {
        trace_enable_rc = trace_err(r, "cuptiActivityEnable(CONCURRENT_KERNEL)");
        return;
    }
    gang_info("kernels/cuda: tracing kernels with %s", loaded);
    trace_enable_rc = 0;
}

int gang__cuda_trace_enable(void)
{
    pthread_once(&trace_once, trace_enable_once);
    return trace_enable_rc;
}

/* The current CUPTI timestamp into *ts; 0 or GANG_EIO. */
static int trace_now(uint64_t *ts)
{
    CUptiResult r = cupti.timestamp(ts);

    return r == CUPTI_SUCCESS ? 0 : trace_err(r, "cuptiGetTimestamp");
}

int gang__cuda_trace_begin(const void *owner)
{
    uint64_t ts;
    int rc;

    if (trace_enable_rc < 0)
        return GANG_EINVAL;
    if ((rc = trace_now(&ts)) < 0)
        return rc;
    pthread_mutex_lock(&T.lock);
    if (T.owner != NULL && T.owner != owner) {
        rc = GANG_EAGAIN;
    } else if (T.n_spans == TRACE_MAX_SPANS) {
        gang_error("kernels/cuda: %d trace spans without a collect", TRACE_MAX_SPANS);
        rc = GANG_ERANGE;
    } else {
        if (T.spans == NULL && (T.spans = malloc(TRACE_MAX_SPANS * sizeof(*T.spans))) == NULL) {
            rc = GANG_ENOMEM;
        } else {
            T.owner = owner;
            if (T.n_spans == 0)
                T.keep_from = ts;
            T.spans[T.n_spans] = (gang__trace_span){.begin = ts, .end = ts};
        }
    }
    pthread_mutex_unlock(&T.lock);
    return rc;
}

int gang__cuda_trace_end(const void *owner)
{
    uint64_t ts;
    int rc;

    if ((rc = trace_now(&ts)) < 0)
        return rc;
    pthread_mutex_lock(&T.lock);
    if (T.owner != owner || T.spans == NULL)
        rc = GANG_EINVAL;
    else
        T.spans[T.n_spans++].end = ts;
    pthread_mutex_unlock(&T.lock);
    return rc;
}

/* Empties the spans and the records when owner has them (T.lock held). */
static void trace_reset_locked(const void *owner)
{
    if (T.owner != owner)
        return;
    T.n_recs = 0;
    T.n_spans = 0;
    T.dropped = 0;
    T.keep_from = UINT64_MAX;
    T.owner = NULL;
}

int gang__cuda_trace_collect(const void *owner, gang_kernels_trace *out)
{
    CUptiResult r;
    int rc;

    pthread_mutex_lock(&T.lock);
    rc = T.owner == NULL || T.owner == owner ? 0 : GANG_EAGAIN;
    pthread_mutex_unlock(&T.lock);
    if (rc < 0 || trace_enable_rc < 0)
        return rc < 0 ? rc : GANG_EINVAL;
    /* Not under T.lock: the flush may hand buffers back on this thread. */
    r = cupti.flush_all(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    if (r != CUPTI_SUCCESS)
        rc = trace_err(r, "cuptiActivityFlushAll");
    pthread_mutex_lock(&T.lock);
    if (rc == 0 && T.owner == owner)
        rc = gang__trace_summarize(T.recs, T.n_recs, T.spans, T.n_spans,
                                   (const char *const *)T.names, T.n_names, T.dropped, out);
    trace_reset_locked(owner);
    pthread_mutex_unlock(&T.lock);
    return rc;
}

void gang__cuda_trace_release(const void *owner)
{
    pthread_mutex_lock(&T.lock);
    trace_reset_locked(owner);
    pthread_mutex_unlock(&T.lock);
}
