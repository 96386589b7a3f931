/*
 * Kernels front and backend registration.
 *
 * The front owns argument validation: every public function checks its pointers and sizes
 * against the contract in include/ganglion/kernels.h and only then calls the backend's
 * vtable entry, so each backend implements the arithmetic once and every backend refuses
 * bad input in exactly the same way. This file is also the only place that decides, with
 * the GANG_HAVE_* results of config.h, which backends are real and which are stubs.
 */
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ganglion/config.h"
#include "ganglion/kernels.h"

#include "kernels-backend.h"
#include "kernels-bench.h"
#include "cuda/cuda-backend.h"

/* ---------------------------------------------------------------------------------
 * Registration.
 *
 * With the CUDA kernels built (CMake defines GANG_HAVE_CUDA_KERNELS, cmake/cuda.cmake),
 * "cuda" is the real backend; otherwise its stub's open answers GANG_ENOSYS with a log
 * line, so callers get a clear error instead of a link failure or a silent fallback to
 * the CPU. The device queries answer "no GPU" in that case.
 * --------------------------------------------------------------------------------- */
#if defined(GANG_HAVE_CUDA_KERNELS) && GANG_HAVE_CUDA_KERNELS
#define KERNELS_CUDA_BACKEND (&gang__kernels_cuda_backend)

int gang_kernels_device_count(void)
{
    return gang__cuda_device_count();
}

int gang_kernels_cuda_library(char *path, size_t cap)
{
    return gang__blas_library(path, cap);
}

int gang_kernels_device_info(int index, gang_device_info *out)
{
    if (out == NULL)
        return GANG_EINVAL;
    return gang__cuda_device_info(index, out);
}

int gang_kernels_device_can_access_peer(int a, int b)
{
    return gang__cuda_device_can_access_peer(a, b);
}
#else
static int cuda_stub_open(const gang_kernels_options *o, void **ctx)
{
    (void)o;
    *ctx = NULL;
    return GANG_ENOSYS;
}

/* Every other entry is NULL: the front answers GANG_ENOSYS (no handle is ever made). */
static const gang__kernels_backend kernels_cuda_stub = {
    .name = "cuda",
    .caps = GANG_KERNELS_CAP_DEVICE_MEM | GANG_KERNELS_CAP_HALF_GEMM,
    .open = cuda_stub_open,
};
#define KERNELS_CUDA_BACKEND (&kernels_cuda_stub)

int gang_kernels_device_count(void)
{
    return 0;
}

int gang_kernels_cuda_library(char *path, size_t cap)
{
    if (cap > 0)
        path[0] = '\0';
    return GANG_ENOSYS;
}

int gang_kernels_device_info(int index, gang_device_info *out)
{
    (void)index;
    return out == NULL ? GANG_EINVAL : GANG_ENOSYS;
}

int gang_kernels_device_can_access_peer(int a, int b)
{
    (void)a, (void)b;
    return GANG_ENOSYS;
}
#endif

/* The backend a device name selects, or NULL for an unknown name. */
static const gang__kernels_backend *kernels_backend_for(const char *device)
{
    /* "auto" stays "cpu" even when the CUDA kernels are built: tensors of a device backend
     * are device pointers, and callers written for host pointers would hand it host
     * memory. Callers that use gang_kernels_alloc/upload ask for "cuda" explicitly (or
     * check gang_kernels_device_count() first). */
    if (strcmp(device, "cpu") == 0 || strcmp(device, "auto") == 0)
        return &gang__kernels_cpu_backend;
    if (strcmp(device, "cuda") == 0)
        return KERNELS_CUDA_BACKEND;
    if (strcmp(device, "fake") == 0)
        return &gang__kernels_fake_backend;
    return NULL;
}

/* ---------------------------------------------------------------------------------
 * Handle.
 * --------------------------------------------------------------------------------- */
void gang_kernels_options_init(gang_kernels_options *o)
{
    if (o == NULL)
        return;
    memset(o, 0, sizeof(*o));
    o->device = "auto";
    o->device_index = 0;
    o->pool_mb = 0;
    o->pool_percent = 90;
    o->half_gemv = 1;
    o->pdl = 0;
    o->trace = 0;
    o->fuse_residual = 1;
    o->pool_split = 0;
    gang_param_env_bool("gpu-pool-split", &o->pool_split);
}

int gang_kernels_open(const char *device, gang_kernels **out)
{
    gang_kernels_options o;

    gang_kernels_options_init(&o);
    o.device = device;
    return gang_kernels_open_opts(&o, out);
}

/* Opens the handle of the backend o->device names; every backend goes the same way. */
int gang_kernels_open_opts(const gang_kernels_options *o, gang_kernels **out)
{
    const gang__kernels_backend *be;
    void *ctx = NULL;
    gang_kernels *k;
    int rc;

    if (out == NULL)
        return GANG_EINVAL;
    *out = NULL;
    if (o == NULL || o->device == NULL)
        return GANG_EINVAL;
    be = kernels_backend_for(o->device);
    if (be == NULL) {
        gang_error("kernels: unknown device '%s' (expected cpu, cuda, auto or fake)", o->device);
        return GANG_EINVAL;
    }
    if (o->trace && be->trace_begin == NULL) {
        gang_error("kernels: device '%s' cannot trace its kernels (only cuda can)", be->name);
        return GANG_ENOSYS;
    }
    if (be->open != NULL) {
        rc = be->open(o, &ctx);
        if (rc < 0) {
            gang_error("kernels: device '%s' is unavailable: %s (%s)", o->device, gang_strerror(rc),
                       gang_err_name(rc));
            return rc;
        }
    }
    k = malloc(sizeof(*k));
    if (k == NULL) {
        rc = GANG_ENOMEM;
        goto out_close;
    }
    memset(k, 0, sizeof(*k));
    k->be = be;
    k->ctx = ctx;
    k->traced = o->trace != 0;
    *out = k;
    return 0;

out_close:
    if (be->close != NULL)
        be->close(ctx);
    return rc;
}

int gang_kernels_retune(gang_kernels *k, const gang_kernels_options *o)
{
    if (k == NULL || o == NULL)
        return GANG_EINVAL;
    if (k->capturing) {
        gang_error("kernels: new launch choices while capturing a graph (refused)");
        return GANG_EINVAL;
    }
    return k->be->retune != NULL ? k->be->retune(k->ctx, o) : 0;
}

void gang_kernels_close(gang_kernels *k)
{
    if (k != NULL && k->be->close != NULL)
        k->be->close(k->ctx);
    free(k);
}

const char *gang_kernels_name(const gang_kernels *k)
{
    return k != NULL ? k->be->name : "?";
}

uint32_t gang_kernels_caps(const gang_kernels *k)
{
    return k != NULL ? k->be->caps : 0;
}

/* ---------------------------------------------------------------------------------
 * Tensor memory. The cpu backend uses the heap and memmove, so code written against this
 * API runs unchanged on either backend.
 * --------------------------------------------------------------------------------- */
int gang_kernels_alloc(gang_kernels *k, size_t bytes, void **out)
{
    int rc;

    if (out != NULL)
        *out = NULL;
    if (k == NULL || out == NULL || bytes == 0)
        return GANG_EINVAL;
    if (k->be->alloc == NULL)
        return GANG_ENOSYS;
    rc = k->be->alloc(k->ctx, bytes, out);
    k->cnt.allocs += rc == 0;
    return rc;
}

void gang_kernels_free(gang_kernels *k, void *p)
{
    if (k == NULL || p == NULL || k->be->free == NULL)
        return;
    if (k->be->free(k->ctx, p) < 0)
        gang_error("kernels: gang_kernels_free of %p, which is not a live allocation of this "
                   "handle (ignored)",
                   p);
}

/* While capturing a graph, host waits and host reads are refused (gang_kernels_graph_begin). */
static int kernels_capture_refuses(gang_kernels *k, const char *what)
{
    if (!k->capturing)
        return 0;
    gang_error("kernels: %s while capturing a graph (refused)", what);
    k->capture_broken = 1;
    return 1;
}

int gang_kernels_upload(gang_kernels *k, void *dst, const void *src, size_t bytes)
{
    if (k == NULL || ((dst == NULL || src == NULL) && bytes > 0) ||
        kernels_capture_refuses(k, "upload"))
        return GANG_EINVAL;
    if (bytes == 0)
        return 0;
    if (k->be->upload == NULL)
        return GANG_ENOSYS;
    k->cnt.host_syncs++;
    k->cnt.h2d_bytes += bytes;
    return k->be->upload(k->ctx, dst, src, bytes);
}

/* An empty download still waits for the handle's work (the contract of the header). */
int gang_kernels_download(gang_kernels *k, void *dst, const void *src, size_t bytes)
{
    if (k == NULL || ((dst == NULL || src == NULL) && bytes > 0) ||
        kernels_capture_refuses(k, "download"))
        return GANG_EINVAL;
    if (bytes == 0)
        return gang_kernels_sync(k);
    if (k->be->download == NULL)
        return GANG_ENOSYS;
    k->cnt.host_syncs++;
    k->cnt.d2h_bytes += bytes;
    return k->be->download(k->ctx, dst, src, bytes);
}

/* A backend without an asynchronous upload waits: counted as the sync it is. */
int gang_kernels_upload_async(gang_kernels *k, void *dst, const void *src, size_t bytes)
{
    if (k == NULL || ((dst == NULL || src == NULL) && bytes > 0) ||
        kernels_capture_refuses(k, "upload_async"))
        return GANG_EINVAL;
    if (bytes == 0)
        return 0;
    if (k->be->upload_async == NULL)
        return gang_kernels_upload(k, dst, src, bytes);
    k->cnt.launches++;
    k->cnt.h2d_bytes += bytes;
    return k->be->upload_async(k->ctx, dst, src, bytes);
}

int gang_kernels_copy(gang_kernels *k, void *dst, const void *src, size_t bytes)
{
    if (k == NULL || ((dst == NULL || src == NULL) && bytes > 0))
        return GANG_EINVAL;
    if (bytes == 0 || dst == src)
        return 0;
    if (k->be->copy == NULL)
        return GANG_ENOSYS;
    k->cnt.launches++;
    return k->be->copy(k->ctx, dst, src, bytes);
}

int gang_kernels_copy_2d(gang_kernels *k, void *dst, size_t dpitch, const void *src, size_t spitch,
                         size_t width, size_t rows)
{
    if (k == NULL || dst == NULL || src == NULL || width == 0 || rows == 0 || dpitch < width ||
        spitch < width)
        return GANG_EINVAL;
    if (rows - 1 > (SIZE_MAX - width) / (dpitch > spitch ? dpitch : spitch))
        return GANG_ERANGE;
    if (k->be->copy_2d == NULL)
        return GANG_ENOSYS;
    k->cnt.launches++;
    return k->be->copy_2d(k->ctx, dst, dpitch, src, spitch, width, rows);
}

int gang_kernels_sync(gang_kernels *k)
{
    if (k == NULL || kernels_capture_refuses(k, "sync"))
        return GANG_EINVAL;
    if (k->be->sync == NULL)
        return GANG_ENOSYS;
    k->cnt.host_syncs++;
    return k->be->sync(k->ctx);
}

void *gang_kernels_device_stream(gang_kernels *k)
{
    if (k == NULL || k->be->stream == NULL)
        return NULL;
    return k->be->stream(k->ctx);
}

int gang_kernels_graph_begin(gang_kernels *k)
{
    int rc;

    if (k == NULL || k->capturing)
        return GANG_EINVAL;
    if (k->be->graph_begin == NULL)
        return GANG_ENOSYS;
    rc = k->be->graph_begin(k->ctx);
    if (rc == 0) {
        k->capturing = 1;
        k->capture_broken = 0;
    }
    return rc;
}

/* ---------------------------------------------------------------------------------
 * Kernel traces: the front keeps begin / end alternating; the backend marks and sums.
 * --------------------------------------------------------------------------------- */
int gang_kernels_trace_begin(gang_kernels *k)
{
    int rc;

    if (k == NULL || !k->traced || k->span_open)
        return GANG_EINVAL;
    rc = k->be->trace_begin(k->ctx);
    k->span_open = rc == 0;
    return rc;
}

int gang_kernels_trace_end(gang_kernels *k)
{
    if (k == NULL || !k->traced || !k->span_open)
        return GANG_EINVAL;
    k->span_open = 0;
    return k->be->trace_end(k->ctx);
}

int gang_kernels_trace_collect(gang_kernels *k, gang_kernels_trace *out)
{
    if (out != NULL)
        memset(out, 0, sizeof(*out));
    if (k == NULL || out == NULL || !k->traced || k->span_open ||
        kernels_capture_refuses(k, "trace collect"))
        return GANG_EINVAL;
    return k->be->trace_collect(k->ctx, out);
}

/* The backend always ends its capture; a refused host wait inside it voids the graph. */
int gang_kernels_graph_end(gang_kernels *k, gang_kernels_graph **out)
{
    void *g = NULL;
    int rc;

    if (out != NULL)
        *out = NULL;
    if (k == NULL || out == NULL || !k->capturing)
        return GANG_EINVAL;
    k->capturing = 0;
    rc = k->be->graph_end(k->ctx, &g);
    if (rc == 0 && k->capture_broken) {
        k->be->graph_free(k->ctx, g);
        return GANG_EIO;
    }
    if (rc == 0)
        *out = g;
    return rc;
}

int gang_kernels_graph_launch(gang_kernels *k, gang_kernels_graph *g)
{
    if (k == NULL || g == NULL || k->capturing || k->be->graph_launch == NULL)
        return GANG_EINVAL;
    k->cnt.launches++;
    return k->be->graph_launch(k->ctx, g);
}

void gang_kernels_graph_free(gang_kernels *k, gang_kernels_graph *g)
{
    if (k != NULL && g != NULL && k->be->graph_free != NULL)
        k->be->graph_free(k->ctx, g);
}

int gang_kernels_counters_get(const gang_kernels *k, gang_kernels_counters *out)
{
    if (k == NULL || out == NULL)
        return GANG_EINVAL;
    *out = k->cnt;
    return 0;
}

void *gang__kernels_ctx_of(gang_kernels *k, const gang__kernels_backend *be)
{
    return k != NULL && k->be == be ? k->ctx : NULL;
}

/*
 * A backend's sync makes the handle's device current on the calling thread before it
 * waits (cuda: cudaSetDevice, see cuda_sync), which is all binding needs; a vtable entry
 * of its own would only repeat that.
 */
int gang_kernels_bind_thread(gang_kernels *k)
{
    return gang_kernels_sync(k);
}

int gang_kernels_pool_stats_get(const gang_kernels *k, gang_kernels_pool_stats *out)
{
    if (k == NULL || out == NULL)
        return GANG_EINVAL;
    memset(out, 0, sizeof(*out));
    if (k->be->pool_stats == NULL)
        return GANG_ENOSYS;
    return k->be->pool_stats(k->ctx, out);
}

/* ---------------------------------------------------------------------------------
 * Validation helpers and dispatch.
 * --------------------------------------------------------------------------------- */

/* *out = a * b elements; GANG_ERANGE when the f32 buffer could not even be addressed. */
int gang__kernels_elems(size_t a, size_t b, size_t *out)
{
    if (__builtin_mul_overflow(a, b, out) || *out > SIZE_MAX / sizeof(float))
        return GANG_ERANGE;
    return 0;
}

int gang__kernels_elems3(size_t a, size_t b, size_t c, size_t *out)
{
    size_t ab;
    int rc = gang__kernels_elems(a, b, &ab);
    return rc < 0 ? rc : gang__kernels_elems(ab, c, out);
}

/* The sizes of an [m, kdim] x [n, kdim] product: each within int (CBLAS and cuBLAS index
 * with int: larger matrices must be split by the caller) and every operand's element
 * count addressable. 0 or GANG_ERANGE. */
static int mm_dims(size_t m, size_t n, size_t kdim)
{
    size_t tmp;
    int rc;

    if (m > INT_MAX || n > INT_MAX || kdim > INT_MAX)
        return GANG_ERANGE;
    if ((rc = gang__kernels_elems(m, n, &tmp)) < 0 ||
        (rc = gang__kernels_elems(m, kdim, &tmp)) < 0 ||
        (rc = gang__kernels_elems(n, kdim, &tmp)) < 0)
        return rc;
    return 0;
}

int gang_kernels_gemm(gang_kernels *k, int trans_b, size_t m, size_t n, size_t kdim, float alpha,
                      const float *a, const float *b, float beta, float *c)
{
    int rc;

    if (k == NULL || a == NULL || b == NULL || c == NULL || m == 0 || n == 0 || kdim == 0)
        return GANG_EINVAL;
    if ((rc = mm_dims(m, n, kdim)) < 0)
        return rc;
    if (k->be->gemm == NULL)
        return GANG_ENOSYS;
    k->cnt.launches++;
    return k->be->gemm(k->ctx, GANG_DTYPE_F32, trans_b != 0, m, n, kdim, alpha, a, b, beta, c);
}

/* The arguments of an RMSNorm (gang_kernels_rmsnorm's contract): 0, GANG_EINVAL or
 * GANG_ERANGE. */
int gang__kernels_norm_check(const float *x, const float *w, const float *out, float eps,
                             size_t rows, size_t dim)
{
    size_t tmp;

    if (x == NULL || w == NULL || out == NULL || rows == 0 || dim == 0)
        return GANG_EINVAL;
    if (!isfinite(eps) || eps < 0.0f)
        return GANG_EINVAL;
    return gang__kernels_elems(rows, dim, &tmp);
}

int gang_kernels_rmsnorm(gang_kernels *k, const float *x, const float *w, float eps, size_t rows,
                         size_t dim, float *out)
{
    int rc;

    if (k == NULL)
        return GANG_EINVAL;
    if ((rc = gang__kernels_norm_check(x, w, out, eps, rows, dim)) < 0)
        return rc;
    if (k->be->rmsnorm == NULL)
        return GANG_ENOSYS;
    k->cnt.launches++;
    return k->be->rmsnorm(k->ctx, x, w, eps, rows, dim, out);
}

int gang_kernels_rope(gang_kernels *k, float *x, const int32_t *positions, size_t tokens,
                      size_t heads, size_t head_dim, const float *inv_freq, float scale)
{
    size_t tmp;
    int rc;

    if (k == NULL || x == NULL || positions == NULL || inv_freq == NULL || tokens == 0 ||
        heads == 0 || head_dim == 0 || head_dim % 2 != 0)
        return GANG_EINVAL;
    if (!isfinite(scale) || scale <= 0.0f)
        return GANG_EINVAL;
    if ((rc = gang__kernels_elems3(tokens, heads, head_dim, &tmp)) < 0)
        return rc;
    /* The positions are the backend's to check (a device backend reads them on the device
     * and reports a negative one at the next sync). */
    if (k->be->rope == NULL)
        return GANG_ENOSYS;
    k->cnt.launches++;
    return k->be->rope(k->ctx, x, positions, tokens, heads, head_dim, inv_freq, scale);
}

int gang_kernels_softmax(gang_kernels *k, float *x, size_t rows, size_t cols)
{
    size_t tmp;
    int rc;

    if (k == NULL || x == NULL || rows == 0 || cols == 0)
        return GANG_EINVAL;
    if ((rc = gang__kernels_elems(rows, cols, &tmp)) < 0)
        return rc;
    if (k->be->softmax == NULL)
        return GANG_ENOSYS;
    k->cnt.launches++;
    return k->be->softmax(k->ctx, x, rows, cols);
}

int gang_kernels_attention(gang_kernels *k, const float *q, const float *kc, const float *vc,
                           size_t tq, size_t tk, size_t n_heads, size_t n_kv_heads, size_t head_dim,
                           size_t pos0, float *out)
{
    return gang_kernels_attention_window(k, q, kc, vc, tq, tk, n_heads, n_kv_heads, head_dim, pos0,
                                         0, out);
}

int gang_kernels_attention_window(gang_kernels *k, const float *q, const float *kc, const float *vc,
                                  size_t tq, size_t tk, size_t n_heads, size_t n_kv_heads,
                                  size_t head_dim, size_t pos0, size_t window, float *out)
{
    return gang_kernels_attention_paged(k, q, kc, vc, NULL, tq, tk, n_heads, n_kv_heads, head_dim,
                                        pos0, window, out);
}

/* The checks of one attention call's arguments (gang_kernels_attention_paged's contract). */
static int attention_check(const float *q, const void *kc, const void *vc,
                           const gang_kernels_kv_pages *pages, size_t tq, size_t tk, size_t n_heads,
                           size_t n_kv_heads, size_t head_dim, size_t pos0, const float *out)
{
    size_t tmp;
    int rc;

    if (q == NULL || kc == NULL || vc == NULL || out == NULL)
        return GANG_EINVAL;
    if (tq == 0 || tk == 0 || n_heads == 0 || n_kv_heads == 0 || head_dim == 0)
        return GANG_EINVAL;
    if (n_heads % n_kv_heads != 0)
        return GANG_EINVAL;
    /* The last query sits at position pos0 + tq - 1 and needs that key in the cache. */
    if (pos0 > tk || tq > tk - pos0)
        return GANG_EINVAL;
    if ((rc = gang__kernels_elems3(tq, n_heads, head_dim, &tmp)) < 0 ||
        (rc = gang__kernels_elems3(tk, n_kv_heads, head_dim, &tmp)) < 0)
        return rc;
    if (pages != NULL) {
        if (pages->table == NULL || pages->block_size == 0 || pages->n_blocks == 0 ||
            pages->block_size > (size_t)INT32_MAX)
            return GANG_EINVAL;
        if (pages->dtype != GANG_DTYPE_F32 && pages->dtype != GANG_DTYPE_BF16 &&
            pages->dtype != GANG_DTYPE_F16)
            return GANG_EINVAL;
        if ((rc = gang__kernels_elems(pages->n_blocks, pages->block_size, &tmp)) < 0 ||
            (rc = gang__kernels_elems3(tmp, n_kv_heads, head_dim, &tmp)) < 0)
            return rc;
    }
    return 0;
}

int gang_kernels_attention_paged(gang_kernels *k, const float *q, const void *kc, const void *vc,
                                 const gang_kernels_kv_pages *pages, size_t tq, size_t tk,
                                 size_t n_heads, size_t n_kv_heads, size_t head_dim, size_t pos0,
                                 size_t window, float *out)
{
    int rc;

    if (k == NULL)
        return GANG_EINVAL;
    rc = attention_check(q, kc, vc, pages, tq, tk, n_heads, n_kv_heads, head_dim, pos0, out);
    if (rc < 0)
        return rc;
    if (k->be->attention == NULL)
        return GANG_ENOSYS;
    k->cnt.launches++;
    return k->be->attention(k->ctx, q, kc, vc, pages, tq, tk, n_heads, n_kv_heads, head_dim, pos0,
                            window, out);
}

int gang_kernels_attention_batch(gang_kernels *k, const gang_kernels_attn_seq *seqs, size_t n_seq,
                                 size_t n_heads, size_t n_kv_heads, size_t head_dim, size_t window)
{
    int rc;

    if (k == NULL || seqs == NULL || n_seq == 0)
        return GANG_EINVAL;
    for (size_t i = 0; i < n_seq; i++) {
        const gang_kernels_attn_seq *s = &seqs[i];

        rc = attention_check(s->q, s->kc, s->vc, s->pages, s->tq, s->tk, n_heads, n_kv_heads,
                             head_dim, s->pos0, s->out);
        if (rc < 0)
            return rc;
    }
    k->cnt.launches += k->be->attention_batch != NULL ? 1 : n_seq;
    if (k->be->attention_batch != NULL)
        return k->be->attention_batch(k->ctx, seqs, n_seq, n_heads, n_kv_heads, head_dim, window);
    if (k->be->attention == NULL)
        return GANG_ENOSYS;
    for (size_t i = 0; i < n_seq; i++) {
        const gang_kernels_attn_seq *s = &seqs[i];

        rc = k->be->attention(k->ctx, s->q, s->kc, s->vc, s->pages, s->tq, s->tk, n_heads,
                              n_kv_heads, head_dim, s->pos0, window, s->out);
        if (rc < 0)
            return rc;
    }
    return 0;
}

int gang_kernels_silu_mul(gang_kernels *k, const float *gate, const float *up, size_t n, float *out)
{
    if (k == NULL || gate == NULL || up == NULL || out == NULL || n == 0)
        return GANG_EINVAL;
    if (n > SIZE_MAX / sizeof(float))
        return GANG_ERANGE;
    if (k->be->silu_mul == NULL)
        return GANG_ENOSYS;
    k->cnt.launches++;
    return k->be->silu_mul(k->ctx, gate, up, n, out);
}

int gang_kernels_gelu_mul(gang_kernels *k, const float *gate, const float *up, size_t n, float *out)
{
    if (k == NULL || gate == NULL || up == NULL || out == NULL || n == 0)
        return GANG_EINVAL;
    if (n > SIZE_MAX / sizeof(float))
        return GANG_ERANGE;
    if (k->be->gelu_mul == NULL)
        return GANG_ENOSYS;
    k->cnt.launches++;
    return k->be->gelu_mul(k->ctx, gate, up, n, out);
}

int gang_kernels_scale(gang_kernels *k, float *x, float a, size_t n)
{
    if (k == NULL || x == NULL || n == 0 || !isfinite(a))
        return GANG_EINVAL;
    if (n > SIZE_MAX / sizeof(float))
        return GANG_ERANGE;
    if (k->be->scale == NULL)
        return GANG_ENOSYS;
    k->cnt.launches++;
    return k->be->scale(k->ctx, x, a, n);
}

int gang_kernels_embedding(gang_kernels *k, const float *table, size_t vocab, size_t dim,
                           const int32_t *ids, size_t n_ids, float *out)
{
    gang_kernels_weight w = {.type = GANG_KW_F32, .data = table, .scales = NULL};

    return gang_kernels_embedding_w(k, &w, vocab, dim, ids, n_ids, out);
}

/* A weight view the backends can trust: a known type, data, scales exactly for I8, and
 * rows of kdim a whole number of blocks for a block type. */
static int weight_ok(const gang_kernels_weight *w, size_t kdim)
{
    if (w == NULL || w->data == NULL || (unsigned)w->type > GANG_KW_LAST)
        return 0;
    if (kdim == 0 || gang_kernels_weight_row_bytes(w->type, kdim) == 0)
        return 0;
    return (w->type == GANG_KW_I8) == (w->scales != NULL);
}

int gang_kernels_embedding_w(gang_kernels *k, const gang_kernels_weight *table, size_t vocab,
                             size_t dim, const int32_t *ids, size_t n_ids, float *out)
{
    size_t tmp;
    int rc;

    if (k == NULL || !weight_ok(table, dim) || ids == NULL || out == NULL || vocab == 0 ||
        dim == 0 || n_ids == 0)
        return GANG_EINVAL;
    if ((rc = gang__kernels_elems(vocab, dim, &tmp)) < 0 ||
        (rc = gang__kernels_elems(n_ids, dim, &tmp)) < 0)
        return rc;
    /* The ids are the backend's to check, every one before anything is written. */
    if (k->be->embedding == NULL)
        return GANG_ENOSYS;
    k->cnt.launches++;
    return k->be->embedding(k->ctx, table, vocab, dim, ids, n_ids, out);
}

int gang_kernels_matmul(gang_kernels *k, size_t m, size_t n, size_t kdim, const float *x,
                        const gang_kernels_weight *w, float *y)
{
    int rc;

    if (k == NULL || x == NULL || y == NULL || !weight_ok(w, kdim) || m == 0 || n == 0 || kdim == 0)
        return GANG_EINVAL;
    if ((rc = mm_dims(m, n, kdim)) < 0)
        return rc;
    /* f32 weights are a plain GEMM, unless the backend's matmul takes them itself. */
    k->cnt.launches++;
    if (w->type == GANG_KW_F32 && k->be->gemm != NULL && !k->be->matmul_f32)
        return k->be->gemm(k->ctx, GANG_DTYPE_F32, 1, m, n, kdim, 1.0f, x, w->data, 0.0f, y);
    if (k->be->matmul == NULL)
        return GANG_ENOSYS;
    return k->be->matmul(k->ctx, m, n, kdim, x, w, y);
}

int gang_kernels_matmul_n(gang_kernels *k, size_t m, size_t kdim, const float *x, size_t count,
                          const gang_kernels_weight *w, const size_t *n, float *const *y)
{
    int rc;

    if (k == NULL || x == NULL || w == NULL || n == NULL || y == NULL || count == 0 ||
        count > GANG_KERNELS_MATMUL_N_MAX || m == 0 || kdim == 0)
        return GANG_EINVAL;
    for (size_t i = 0; i < count; i++) {
        if (y[i] == NULL || !weight_ok(&w[i], kdim) || n[i] == 0)
            return GANG_EINVAL;
        if ((rc = mm_dims(m, n[i], kdim)) < 0)
            return rc;
    }
    if (k->be->matmul_n == NULL) {
        for (size_t i = 0; i < count; i++)
            if ((rc = gang_kernels_matmul(k, m, n[i], kdim, x, &w[i], y[i])) != 0)
                return rc;
        return 0;
    }
    k->cnt.launches++;
    return k->be->matmul_n(k->ctx, m, kdim, x, count, w, n, y);
}

int gang_kernels_matmul_glu(gang_kernels *k, int gelu, size_t m, size_t n, size_t kdim,
                            const float *gu, const gang_kernels_weight *w, float *scratch, float *y)
{
    size_t tmp;
    int rc;

    if (k == NULL || gu == NULL || scratch == NULL || y == NULL || !weight_ok(w, kdim) || m == 0 ||
        n == 0 || kdim == 0)
        return GANG_EINVAL;
    if ((rc = mm_dims(m, n, kdim)) < 0)
        return rc;
    if (kdim > SIZE_MAX / 2 || (rc = gang__kernels_elems(m, 2 * kdim, &tmp)) < 0)
        return GANG_ERANGE;
    if (k->be->matmul_glu == NULL || (w->type == GANG_KW_F32 && !k->be->matmul_f32)) {
        rc = gang_kernels_glu(k, gelu, gu, m, kdim, scratch);
        return rc != 0 ? rc : gang_kernels_matmul(k, m, n, kdim, scratch, w, y);
    }
    k->cnt.launches++;
    return k->be->matmul_glu(k->ctx, gelu != 0, m, n, kdim, gu, w, scratch, y);
}

/* A fusion step's value: -1 (none), 0 or 1. */
static int fusion_step_ok(int v)
{
    return v >= -1 && v <= 1;
}

int gang_kernels_matmul_fused(gang_kernels *k, size_t m, size_t n, size_t kdim, const float *x,
                              const gang_kernels_weight *w, const gang_kernels_fusion *f,
                              float *scratch, float *y)
{
    size_t tmp;
    int rc;

    if (k == NULL || x == NULL || y == NULL || f == NULL || !weight_ok(w, kdim) || m == 0 ||
        n == 0 || kdim == 0)
        return GANG_EINVAL;
    if (!fusion_step_ok(f->glu_in) || !fusion_step_ok(f->glu_out) ||
        (f->accumulate != 0 && f->accumulate != 1) || (f->norm != NULL && f->glu_in >= 0) ||
        (f->glu_out >= 0 && f->accumulate) ||
        ((f->norm != NULL || f->glu_in >= 0) && scratch == NULL))
        return GANG_EINVAL;
    if (f->norm != NULL &&
        (rc = gang__kernels_norm_check(x, f->norm, scratch, f->eps, m, kdim)) < 0)
        return rc;
    if (n > SIZE_MAX / 2 || kdim > SIZE_MAX / 2)
        return GANG_ERANGE;
    if ((rc = mm_dims(m, f->glu_out >= 0 ? 2 * n : n, kdim)) < 0)
        return rc;
    if (f->glu_in >= 0 && gang__kernels_elems(m, 2 * kdim, &tmp) < 0)
        return GANG_ERANGE;
    if (k->be->matmul_fused == NULL || (w->type == GANG_KW_F32 && !k->be->matmul_f32))
        return GANG_ENOSYS;
    rc = k->be->matmul_fused(k->ctx, m, n, kdim, x, w, f, scratch, y);
    if (rc == 0)
        k->cnt.launches++;
    return rc;
}

int gang_kernels_matmul_to_glu(gang_kernels *k, int gelu, size_t m, size_t ffn, size_t kdim,
                               const float *x, const gang_kernels_weight *w, float *y)
{
    const gang_kernels_fusion f = {.glu_in = -1, .glu_out = gelu != 0, .accumulate = 0};

    return gang_kernels_matmul_fused(k, m, ffn, kdim, x, w, &f, NULL, y);
}

int gang_kernels_add(gang_kernels *k, float *x, const float *y, size_t n)
{
    if (k == NULL || x == NULL || y == NULL || n == 0)
        return GANG_EINVAL;
    if (n > SIZE_MAX / sizeof(float))
        return GANG_ERANGE;
    if (k->be->add == NULL)
        return GANG_ENOSYS;
    k->cnt.launches++;
    return k->be->add(k->ctx, x, y, n);
}

int gang_kernels_add_rows(gang_kernels *k, float *x, const float *bias, size_t rows, size_t cols)
{
    size_t tmp;
    int rc;

    if (k == NULL || x == NULL || bias == NULL || rows == 0 || cols == 0)
        return GANG_EINVAL;
    if ((rc = gang__kernels_elems(rows, cols, &tmp)) < 0)
        return rc;
    if (k->be->add_rows == NULL)
        return GANG_ENOSYS;
    k->cnt.launches++;
    return k->be->add_rows(k->ctx, x, bias, rows, cols);
}

int gang_kernels_argmax(gang_kernels *k, const float *x, size_t rows, size_t cols, int32_t *out)
{
    size_t tmp;
    int rc;

    if (k == NULL || x == NULL || out == NULL || rows == 0 || cols == 0)
        return GANG_EINVAL;
    if (cols > INT32_MAX)
        return GANG_ERANGE;
    if ((rc = gang__kernels_elems(rows, cols, &tmp)) < 0)
        return rc;
    if (k->be->argmax == NULL)
        return GANG_ENOSYS;
    k->cnt.launches++;
    return k->be->argmax(k->ctx, x, rows, cols, out);
}

/* ---------------------------------------------------------------------------------
 * Half-precision storage, conversion and the GEMM benchmark's primitive.
 * --------------------------------------------------------------------------------- */
/* Bytes of an element type the kernels store (f32, f16, bf16); 0 for the others. */
static size_t kdtype_size(gang_dtype dt)
{
    return dt == GANG_DTYPE_I32 ? 0 : gang_dtype_size(dt);
}

int gang_kernels_gemm_ex(gang_kernels *k, gang_dtype dt, int trans_b, size_t m, size_t n,
                         size_t kdim, float alpha, const void *a, const void *b, float beta,
                         void *c)
{
    int rc;

    if (kdtype_size(dt) == 0)
        return GANG_EINVAL;
    if (dt == GANG_DTYPE_F32)
        return gang_kernels_gemm(k, trans_b, m, n, kdim, alpha, a, b, beta, c);
    if (k == NULL || a == NULL || b == NULL || c == NULL || m == 0 || n == 0 || kdim == 0)
        return GANG_EINVAL;
    if ((rc = mm_dims(m, n, kdim)) < 0)
        return rc;
    if (k->be->gemm == NULL)
        return GANG_ENOSYS;
    k->cnt.launches++;
    return k->be->gemm(k->ctx, dt, trans_b != 0, m, n, kdim, alpha, a, b, beta, c);
}

int gang_kernels_convert(gang_kernels *k, gang_dtype from, const void *src, gang_dtype to,
                         void *dst, size_t n)
{
    if (k == NULL || src == NULL || dst == NULL || n == 0)
        return GANG_EINVAL;
    if (kdtype_size(from) == 0 || kdtype_size(to) == 0)
        return GANG_EINVAL;
    if (n > SIZE_MAX / 4)
        return GANG_ERANGE;
    if (k->be->convert == NULL)
        return GANG_ENOSYS;
    k->cnt.launches++;
    return k->be->convert(k->ctx, from, src, to, dst, n);
}

/*
 * The measuring primitive of bench/bench-gemm.c (kernels-bench.h): the same checks as
 * gang_kernels_gemm_ex, then one timed round of the backend's GEMM and its peer.
 */
int gang__kernels_gemm_pair(gang_kernels *k, gang_dtype dt, int trans_b, size_t m, size_t n,
                            size_t kdim, const void *a, const void *b, void *c_ours, void *c_ref,
                            float *ours_ms, float *ref_ms)
{
    int rc;

    if (k == NULL || a == NULL || b == NULL || c_ours == NULL || c_ref == NULL || ours_ms == NULL ||
        ref_ms == NULL || m == 0 || n == 0 || kdim == 0 || kdtype_size(dt) == 0)
        return GANG_EINVAL;
    if ((rc = mm_dims(m, n, kdim)) < 0)
        return rc;
    if (k->be->gemm_pair == NULL)
        return GANG_ENOSYS;
    return k->be->gemm_pair(k->ctx, dt, trans_b != 0, m, n, kdim, a, b, c_ours, c_ref, ours_ms,
                            ref_ms);
}
