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

#include "cpu/cpu.h"
#include "cuda/cuda-backend.h"

/* Exactly one of ops (host backends) and dev (device backends, with ctx) is set. */
struct gang_kernels {
    const gang__kernels_ops *ops;      /* the host backend's static vtable, or NULL */
    const gang__kernels_dev_ops *dev;  /* the device backend's static vtable, or NULL */
    void *ctx;                         /* the device backend's per-handle state */
};

/* ---------------------------------------------------------------------------------
 * Registration.
 * --------------------------------------------------------------------------------- */
static const gang__kernels_ops cpu_ops = {
    .name = "cpu",
    .init = NULL,
    .gemm = gang__cpu_gemm,
    .rmsnorm = gang__cpu_rmsnorm,
    .rope = gang__cpu_rope,
    .softmax = gang__cpu_softmax,
    .attention = gang__cpu_attention,
    .silu_mul = gang__cpu_silu_mul,
    .embedding = gang__cpu_embedding,
    .add = gang__cpu_add,
    .add_rows = gang__cpu_add_rows,
    .argmax = gang__cpu_argmax,
};

/*
 * Device backends carry per-handle state and use the wider table of cuda/cuda-backend.h.
 * With the CUDA kernels built (CMake defines GANG_HAVE_CUDA_KERNELS, cmake/cuda.cmake),
 * "cuda" is the real backend; otherwise it has no table and opening it answers
 * GANG_ENOSYS with a log line, so callers get a clear error instead of a link failure or a
 * silent fallback to the CPU. The device queries answer "no GPU" in that case.
 */
#if defined(GANG_HAVE_CUDA_KERNELS) && GANG_HAVE_CUDA_KERNELS
#define KERNELS_CUDA_DEV_OPS (&gang__kernels_cuda_dev_ops)

int gang_kernels_device_count(void)
{
    return gang__cuda_device_count();
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
#define KERNELS_CUDA_DEV_OPS ((const gang__kernels_dev_ops *)NULL)

int gang_kernels_device_count(void)
{
    return 0;
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
}

int gang_kernels_open(const char *device, gang_kernels **out)
{
    gang_kernels_options o;

    gang_kernels_options_init(&o);
    o.device = device;
    return gang_kernels_open_opts(&o, out);
}

/*
 * "auto" stays "cpu" even when the CUDA kernels are built: tensors of a device backend
 * are device pointers, and callers written for host pointers (the TP layers, the engine)
 * would hand it host memory. Callers that use gang_kernels_alloc/upload ask for "cuda"
 * explicitly (or check gang_kernels_device_count() first).
 */
int gang_kernels_open_opts(const gang_kernels_options *o, gang_kernels **out)
{
    const gang__kernels_ops *ops = NULL;
    const gang__kernels_dev_ops *dev = NULL;
    const char *device;
    void *ctx = NULL;
    gang_kernels *k;
    int rc;

    if (out == NULL)
        return GANG_EINVAL;
    *out = NULL;
    if (o == NULL || o->device == NULL)
        return GANG_EINVAL;
    device = o->device;
    if (strcmp(device, "cpu") == 0 || strcmp(device, "auto") == 0) {
        ops = &cpu_ops;
    } else if (strcmp(device, "cuda") == 0) {
        dev = KERNELS_CUDA_DEV_OPS;
        if (dev == NULL) {
            gang_error("kernels: device 'cuda' is unavailable: %s (%s)",
                       gang_strerror(GANG_ENOSYS), gang_err_name(GANG_ENOSYS));
            return GANG_ENOSYS;
        }
        if (o->pool_percent > 100 || (o->pool_mb == 0 && o->pool_percent == 0)) {
            gang_error("kernels: pool percent %u is outside 1..100", (unsigned)o->pool_percent);
            return GANG_EINVAL;
        }
    } else {
        gang_error("kernels: unknown device '%s' (expected cpu, cuda or auto)", device);
        return GANG_EINVAL;
    }

    if (ops != NULL && ops->init != NULL) {
        rc = ops->init();
        if (rc < 0) {
            gang_error("kernels: device '%s' is unavailable: %s (%s)", device,
                       gang_strerror(rc), gang_err_name(rc));
            goto out_err;
        }
    }
    if (dev != NULL) {
        rc = dev->open(o, &ctx);
        if (rc < 0) {
            gang_error("kernels: device '%s' is unavailable: %s (%s)", device,
                       gang_strerror(rc), gang_err_name(rc));
            goto out_err;
        }
    }
    k = malloc(sizeof(*k));
    if (k == NULL) {
        rc = GANG_ENOMEM;
        goto out_close;
    }
    k->ops = ops;
    k->dev = dev;
    k->ctx = ctx;
    *out = k;
    return 0;

out_close:
    if (dev != NULL)
        dev->close(ctx);
out_err:
    return rc;
}

void gang_kernels_close(gang_kernels *k)
{
    if (k != NULL && k->dev != NULL)
        k->dev->close(k->ctx);
    free(k);
}

const char *gang_kernels_name(const gang_kernels *k)
{
    if (k == NULL)
        return "?";
    return k->dev != NULL ? k->dev->name : k->ops->name;
}

int gang_kernels_is_device(const gang_kernels *k)
{
    return k != NULL && k->dev != NULL;
}

/* ---------------------------------------------------------------------------------
 * Tensor memory. The cpu backend uses the heap and memcpy, so code written against this
 * API runs unchanged on either backend.
 * --------------------------------------------------------------------------------- */
int gang_kernels_alloc(gang_kernels *k, size_t bytes, void **out)
{
    void *p;

    if (out != NULL)
        *out = NULL;
    if (k == NULL || out == NULL || bytes == 0)
        return GANG_EINVAL;
    if (k->dev != NULL)
        return k->dev->alloc(k->ctx, bytes, out);
    if (bytes > SIZE_MAX - 255)
        return GANG_ERANGE;
    p = aligned_alloc(256, (bytes + 255) / 256 * 256);
    if (p == NULL)
        return GANG_ENOMEM;
    *out = p;
    return 0;
}

void gang_kernels_free(gang_kernels *k, void *p)
{
    if (k == NULL || p == NULL)
        return;
    if (k->dev == NULL) {
        free(p);
        return;
    }
    if (k->dev->free(k->ctx, p) < 0)
        gang_error("kernels: gang_kernels_free of %p, which is not a live allocation of this "
                   "handle (ignored)", p);
}

int gang_kernels_upload(gang_kernels *k, void *dst, const void *src, size_t bytes)
{
    if (k == NULL || ((dst == NULL || src == NULL) && bytes > 0))
        return GANG_EINVAL;
    if (bytes == 0)
        return 0;
    if (k->dev != NULL)
        return k->dev->upload(k->ctx, dst, src, bytes);
    memmove(dst, src, bytes);
    return 0;
}

int gang_kernels_download(gang_kernels *k, void *dst, const void *src, size_t bytes)
{
    if (k == NULL || ((dst == NULL || src == NULL) && bytes > 0))
        return GANG_EINVAL;
    if (k->dev != NULL)
        return bytes == 0 ? k->dev->sync(k->ctx) : k->dev->download(k->ctx, dst, src, bytes);
    if (bytes > 0)
        memmove(dst, src, bytes);
    return 0;
}

int gang_kernels_copy(gang_kernels *k, void *dst, const void *src, size_t bytes)
{
    if (k == NULL || ((dst == NULL || src == NULL) && bytes > 0))
        return GANG_EINVAL;
    if (bytes == 0 || dst == src)
        return 0;
    if (k->dev != NULL)
        return k->dev->copy != NULL ? k->dev->copy(k->ctx, dst, src, bytes) : GANG_ENOSYS;
    memmove(dst, src, bytes);
    return 0;
}

int gang_kernels_copy_2d(gang_kernels *k, void *dst, size_t dpitch, const void *src,
                         size_t spitch, size_t width, size_t rows)
{
    if (k == NULL || dst == NULL || src == NULL || width == 0 || rows == 0 || dpitch < width ||
        spitch < width)
        return GANG_EINVAL;
    if (rows - 1 > (SIZE_MAX - width) / (dpitch > spitch ? dpitch : spitch))
        return GANG_ERANGE;
    if (k->dev != NULL)
        return k->dev->copy_2d != NULL
                   ? k->dev->copy_2d(k->ctx, dst, dpitch, src, spitch, width, rows)
                   : GANG_ENOSYS;
    for (size_t r = 0; r < rows; r++)
        memmove((char *)dst + r * dpitch, (const char *)src + r * spitch, width);
    return 0;
}

int gang_kernels_sync(gang_kernels *k)
{
    if (k == NULL)
        return GANG_EINVAL;
    return k->dev != NULL ? k->dev->sync(k->ctx) : 0;
}

/*
 * The device backends' sync makes the handle's device current on the calling thread
 * before it waits (cuda: cudaSetDevice, see cuda_sync), which is all binding needs; a
 * vtable entry of its own would only repeat that.
 */
int gang_kernels_bind_thread(gang_kernels *k)
{
    if (k == NULL)
        return GANG_EINVAL;
    return k->dev != NULL ? k->dev->sync(k->ctx) : 0;
}

int gang_kernels_pool_stats_get(const gang_kernels *k, gang_kernels_pool_stats *out)
{
    if (k == NULL || out == NULL)
        return GANG_EINVAL;
    memset(out, 0, sizeof(*out));
    return k->dev != NULL ? k->dev->pool_stats(k->ctx, out) : 0;
}

/* ---------------------------------------------------------------------------------
 * Validation helpers and dispatch.
 * --------------------------------------------------------------------------------- */

/* *out = a * b elements; GANG_ERANGE when the f32 buffer could not even be addressed. */
static int elems(size_t a, size_t b, size_t *out)
{
    if (__builtin_mul_overflow(a, b, out) || *out > SIZE_MAX / sizeof(float))
        return GANG_ERANGE;
    return 0;
}

static int elems3(size_t a, size_t b, size_t c, size_t *out)
{
    size_t ab;
    int rc = elems(a, b, &ab);
    return rc < 0 ? rc : elems(ab, c, out);
}

int gang_kernels_gemm(gang_kernels *k, int trans_b, size_t m, size_t n, size_t kdim,
                      float alpha, const float *a, const float *b, float beta, float *c)
{
    size_t tmp;
    int rc;

    if (k == NULL || a == NULL || b == NULL || c == NULL || m == 0 || n == 0 || kdim == 0)
        return GANG_EINVAL;
    /* CBLAS (and cuBLAS) index with int: larger matrices must be split by the caller. */
    if (m > INT_MAX || n > INT_MAX || kdim > INT_MAX)
        return GANG_ERANGE;
    if ((rc = elems(m, n, &tmp)) < 0 || (rc = elems(m, kdim, &tmp)) < 0 ||
        (rc = elems(n, kdim, &tmp)) < 0)
        return rc;
    if (k->dev != NULL)
        return k->dev->gemm(k->ctx, GANG_DTYPE_F32, trans_b != 0, m, n, kdim, alpha, a, b,
                            beta, c);
    if (k->ops->gemm == NULL)
        return GANG_ENOSYS;
    return k->ops->gemm(trans_b != 0, m, n, kdim, alpha, a, b, beta, c);
}

int gang_kernels_rmsnorm(gang_kernels *k, const float *x, const float *w, float eps,
                         size_t rows, size_t dim, float *out)
{
    size_t tmp;
    int rc;

    if (k == NULL || x == NULL || w == NULL || out == NULL || rows == 0 || dim == 0)
        return GANG_EINVAL;
    if (!isfinite(eps) || eps < 0.0f)
        return GANG_EINVAL;
    if ((rc = elems(rows, dim, &tmp)) < 0)
        return rc;
    if (k->dev != NULL)
        return k->dev->rmsnorm(k->ctx, x, w, eps, rows, dim, out);
    if (k->ops->rmsnorm == NULL)
        return GANG_ENOSYS;
    return k->ops->rmsnorm(x, w, eps, rows, dim, out);
}

int gang_kernels_rope(gang_kernels *k, float *x, const int32_t *positions, size_t tokens,
                      size_t heads, size_t head_dim, float theta)
{
    size_t tmp;
    int rc;

    if (k == NULL || x == NULL || positions == NULL || tokens == 0 || heads == 0 ||
        head_dim == 0 || head_dim % 2 != 0)
        return GANG_EINVAL;
    if (!isfinite(theta) || theta <= 0.0f)
        return GANG_EINVAL;
    if ((rc = elems3(tokens, heads, head_dim, &tmp)) < 0)
        return rc;
    /* Device positions cannot be read here: the device backend checks them on the device
     * and reports a negative one at the next sync. */
    if (k->dev != NULL)
        return k->dev->rope(k->ctx, x, positions, tokens, heads, head_dim, theta);
    for (size_t t = 0; t < tokens; t++)
        if (positions[t] < 0)
            return GANG_EINVAL;
    if (k->ops->rope == NULL)
        return GANG_ENOSYS;
    return k->ops->rope(x, positions, tokens, heads, head_dim, theta);
}

int gang_kernels_softmax(gang_kernels *k, float *x, size_t rows, size_t cols)
{
    size_t tmp;
    int rc;

    if (k == NULL || x == NULL || rows == 0 || cols == 0)
        return GANG_EINVAL;
    if ((rc = elems(rows, cols, &tmp)) < 0)
        return rc;
    if (k->dev != NULL)
        return k->dev->softmax(k->ctx, x, rows, cols);
    if (k->ops->softmax == NULL)
        return GANG_ENOSYS;
    return k->ops->softmax(x, rows, cols);
}

int gang_kernels_attention(gang_kernels *k, const float *q, const float *kc, const float *vc,
                           size_t tq, size_t tk, size_t n_heads, size_t n_kv_heads,
                           size_t head_dim, size_t pos0, float *out)
{
    size_t tmp;
    int rc;

    if (k == NULL || q == NULL || kc == NULL || vc == NULL || out == NULL)
        return GANG_EINVAL;
    if (tq == 0 || tk == 0 || n_heads == 0 || n_kv_heads == 0 || head_dim == 0)
        return GANG_EINVAL;
    if (n_heads % n_kv_heads != 0)
        return GANG_EINVAL;
    /* The last query sits at position pos0 + tq - 1 and needs that key in the cache. */
    if (pos0 > tk || tq > tk - pos0)
        return GANG_EINVAL;
    if ((rc = elems3(tq, n_heads, head_dim, &tmp)) < 0 ||
        (rc = elems3(tk, n_kv_heads, head_dim, &tmp)) < 0)
        return rc;
    if (k->dev != NULL)
        return k->dev->attention(k->ctx, q, kc, vc, tq, tk, n_heads, n_kv_heads, head_dim,
                                 pos0, out);
    if (k->ops->attention == NULL)
        return GANG_ENOSYS;
    return k->ops->attention(q, kc, vc, tq, tk, n_heads, n_kv_heads, head_dim, pos0, out);
}

int gang_kernels_silu_mul(gang_kernels *k, const float *gate, const float *up, size_t n,
                          float *out)
{
    if (k == NULL || gate == NULL || up == NULL || out == NULL || n == 0)
        return GANG_EINVAL;
    if (n > SIZE_MAX / sizeof(float))
        return GANG_ERANGE;
    if (k->dev != NULL)
        return k->dev->silu_mul(k->ctx, gate, up, n, out);
    if (k->ops->silu_mul == NULL)
        return GANG_ENOSYS;
    return k->ops->silu_mul(gate, up, n, out);
}

int gang_kernels_embedding(gang_kernels *k, const float *table, size_t vocab, size_t dim,
                           const int32_t *ids, size_t n_ids, float *out)
{
    size_t tmp;
    int rc;

    if (k == NULL || table == NULL || ids == NULL || out == NULL || vocab == 0 || dim == 0 ||
        n_ids == 0)
        return GANG_EINVAL;
    if ((rc = elems(vocab, dim, &tmp)) < 0 || (rc = elems(n_ids, dim, &tmp)) < 0)
        return rc;
    /* Device ids are checked on the device, before anything is written (same promise). */
    if (k->dev != NULL)
        return k->dev->embedding(k->ctx, table, vocab, dim, ids, n_ids, out);
    /* Checked here as well as in the backend: the promise "nothing written on a bad id"
     * must not depend on how a backend orders its copies. */
    for (size_t t = 0; t < n_ids; t++) {
        if (ids[t] < 0 || (size_t)ids[t] >= vocab) {
            gang_debug("kernels: token id %d at index %zu is outside the vocabulary (%zu)",
                       (int)ids[t], t, vocab);
            return GANG_EINVAL;
        }
    }
    if (k->ops->embedding == NULL)
        return GANG_ENOSYS;
    return k->ops->embedding(table, vocab, dim, ids, n_ids, out);
}

int gang_kernels_add(gang_kernels *k, float *x, const float *y, size_t n)
{
    if (k == NULL || x == NULL || y == NULL || n == 0)
        return GANG_EINVAL;
    if (n > SIZE_MAX / sizeof(float))
        return GANG_ERANGE;
    if (k->dev != NULL)
        return k->dev->add(k->ctx, x, y, n);
    if (k->ops->add == NULL)
        return GANG_ENOSYS;
    return k->ops->add(x, y, n);
}

int gang_kernels_add_rows(gang_kernels *k, float *x, const float *bias, size_t rows,
                          size_t cols)
{
    size_t tmp;
    int rc;

    if (k == NULL || x == NULL || bias == NULL || rows == 0 || cols == 0)
        return GANG_EINVAL;
    if ((rc = elems(rows, cols, &tmp)) < 0)
        return rc;
    if (k->dev != NULL)
        return k->dev->add_rows != NULL ? k->dev->add_rows(k->ctx, x, bias, rows, cols)
                                        : GANG_ENOSYS;
    if (k->ops->add_rows == NULL)
        return GANG_ENOSYS;
    return k->ops->add_rows(x, bias, rows, cols);
}

int gang_kernels_argmax(gang_kernels *k, const float *x, size_t rows, size_t cols,
                        int32_t *out)
{
    size_t tmp;
    int rc;

    if (k == NULL || x == NULL || out == NULL || rows == 0 || cols == 0)
        return GANG_EINVAL;
    if (cols > INT32_MAX)
        return GANG_ERANGE;
    if ((rc = elems(rows, cols, &tmp)) < 0)
        return rc;
    if (k->dev != NULL)
        return k->dev->argmax(k->ctx, x, rows, cols, out);
    if (k->ops->argmax == NULL)
        return GANG_ENOSYS;
    return k->ops->argmax(x, rows, cols, out);
}

/* ---------------------------------------------------------------------------------
 * Half-precision storage, conversion and the GEMM benchmark.
 * --------------------------------------------------------------------------------- */
/* Bytes of an element type the kernels store (f32, f16, bf16); 0 for the others. */
static size_t kdtype_size(gang_dtype dt)
{
    return dt == GANG_DTYPE_I32 ? 0 : gang_dtype_size(dt);
}

int gang_kernels_gemm_ex(gang_kernels *k, gang_dtype dt, int trans_b, size_t m,
                         size_t n, size_t kdim, float alpha, const void *a, const void *b,
                         float beta, void *c)
{
    size_t tmp;
    int rc;

    if (kdtype_size(dt) == 0)
        return GANG_EINVAL;
    if (dt == GANG_DTYPE_F32)
        return gang_kernels_gemm(k, trans_b, m, n, kdim, alpha, a, b, beta, c);
    if (k == NULL || a == NULL || b == NULL || c == NULL || m == 0 || n == 0 || kdim == 0)
        return GANG_EINVAL;
    if (m > INT_MAX || n > INT_MAX || kdim > INT_MAX)
        return GANG_ERANGE;
    if ((rc = elems(m, n, &tmp)) < 0 || (rc = elems(m, kdim, &tmp)) < 0 ||
        (rc = elems(n, kdim, &tmp)) < 0)
        return rc;
    if (k->dev == NULL)
        return GANG_ENOSYS;
    return k->dev->gemm(k->ctx, dt, trans_b != 0, m, n, kdim, alpha, a, b, beta, c);
}

/* Host conversion for the cpu backend, through f32 with the module's rounding. */
static float host_load(const void *p, gang_dtype dt, size_t i)
{
    if (dt == GANG_DTYPE_F16)
        return gang_f16_to_f32(((const uint16_t *)p)[i]);
    if (dt == GANG_DTYPE_BF16)
        return gang_bf16_to_f32(((const uint16_t *)p)[i]);
    return ((const float *)p)[i];
}

static void host_store(void *p, gang_dtype dt, size_t i, float v)
{
    if (dt == GANG_DTYPE_F16)
        ((uint16_t *)p)[i] = gang_f32_to_f16(v);
    else if (dt == GANG_DTYPE_BF16)
        ((uint16_t *)p)[i] = gang_f32_to_bf16(v);
    else
        ((float *)p)[i] = v;
}

int gang_kernels_convert(gang_kernels *k, gang_dtype from, const void *src,
                         gang_dtype to, void *dst, size_t n)
{
    if (k == NULL || src == NULL || dst == NULL || n == 0)
        return GANG_EINVAL;
    if (kdtype_size(from) == 0 || kdtype_size(to) == 0)
        return GANG_EINVAL;
    if (n > SIZE_MAX / 4)
        return GANG_ERANGE;
    if (k->dev != NULL)
        return k->dev->convert(k->ctx, from, src, to, dst, n);
    if (from == to) {
        memmove(dst, src, n * kdtype_size(from));
        return 0;
    }
    for (size_t i = 0; i < n; i++)
        host_store(dst, to, i, host_load(src, from, i));
    return 0;
}

int gang_kernels_gemm_bench(gang_kernels *k, gang_dtype dt, int trans_b, size_t m,
                            size_t n, size_t kdim, int warmup, int iters, double *ours_ms,
                            double *ref_ms, double *max_rel_diff)
{
    size_t tmp;
    int rc;

    if (k == NULL || ours_ms == NULL || ref_ms == NULL || max_rel_diff == NULL || m == 0 ||
        n == 0 || kdim == 0 || warmup < 0 || iters < 1 || kdtype_size(dt) == 0)
        return GANG_EINVAL;
    if (m > INT_MAX || n > INT_MAX || kdim > INT_MAX)
        return GANG_ERANGE;
    if ((rc = elems(m, n, &tmp)) < 0 || (rc = elems(m, kdim, &tmp)) < 0 ||
        (rc = elems(n, kdim, &tmp)) < 0)
        return rc;
    if (k->dev == NULL || k->dev->gemm_bench == NULL)
        return GANG_ENOSYS;
    return k->dev->gemm_bench(k->ctx, dt, trans_b != 0, m, n, kdim, warmup, iters, ours_ms,
                              ref_ms, max_rel_diff);
}
