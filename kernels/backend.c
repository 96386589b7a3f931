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

struct gang_kernels {
    const gang__kernels_ops *ops; /* the backend's static vtable */
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
    .argmax = gang__cpu_argmax,
};

/*
 * GANG_HAVE_CUDA only says that the toolkit was found; the CUDA kernels (kernels/cuda/) are
 * not written yet. Until CMake builds them and defines GANG_HAVE_CUDA_KERNELS, "cuda" is a
 * stub whose every entry answers GANG_ENOSYS, so callers get a clear error instead of a
 * link failure or a silent fallback to the CPU.
 */
#if defined(GANG_HAVE_CUDA_KERNELS) && GANG_HAVE_CUDA_KERNELS
extern const gang__kernels_ops gang__kernels_cuda_ops;
#define KERNELS_CUDA_OPS (&gang__kernels_cuda_ops)
#else
static int stub_init(void)
{
    return GANG_ENOSYS;
}

static int stub_gemm(int trans_b, size_t m, size_t n, size_t kdim, float alpha, const float *a,
                     const float *b, float beta, float *c)
{
    (void)trans_b, (void)m, (void)n, (void)kdim, (void)alpha, (void)a, (void)b, (void)beta;
    (void)c;
    return GANG_ENOSYS;
}

static int stub_rmsnorm(const float *x, const float *w, float eps, size_t rows, size_t dim,
                        float *out)
{
    (void)x, (void)w, (void)eps, (void)rows, (void)dim, (void)out;
    return GANG_ENOSYS;
}

static int stub_rope(float *x, const int32_t *positions, size_t tokens, size_t heads,
                     size_t head_dim, float theta)
{
    (void)x, (void)positions, (void)tokens, (void)heads, (void)head_dim, (void)theta;
    return GANG_ENOSYS;
}

static int stub_softmax(float *x, size_t rows, size_t cols)
{
    (void)x, (void)rows, (void)cols;
    return GANG_ENOSYS;
}

static int stub_attention(const float *q, const float *kc, const float *vc, size_t tq,
                          size_t tk, size_t n_heads, size_t n_kv_heads, size_t head_dim,
                          size_t pos0, float *out)
{
    (void)q, (void)kc, (void)vc, (void)tq, (void)tk, (void)n_heads, (void)n_kv_heads;
    (void)head_dim, (void)pos0, (void)out;
    return GANG_ENOSYS;
}

static int stub_silu_mul(const float *gate, const float *up, size_t n, float *out)
{
    (void)gate, (void)up, (void)n, (void)out;
    return GANG_ENOSYS;
}

static int stub_embedding(const float *table, size_t vocab, size_t dim, const int32_t *ids,
                          size_t n_ids, float *out)
{
    (void)table, (void)vocab, (void)dim, (void)ids, (void)n_ids, (void)out;
    return GANG_ENOSYS;
}

static int stub_add(float *x, const float *y, size_t n)
{
    (void)x, (void)y, (void)n;
    return GANG_ENOSYS;
}

static int stub_argmax(const float *x, size_t rows, size_t cols, int32_t *out)
{
    (void)x, (void)rows, (void)cols, (void)out;
    return GANG_ENOSYS;
}

static const gang__kernels_ops cuda_stub_ops = {
    .name = "cuda",
    .init = stub_init,
    .gemm = stub_gemm,
    .rmsnorm = stub_rmsnorm,
    .rope = stub_rope,
    .softmax = stub_softmax,
    .attention = stub_attention,
    .silu_mul = stub_silu_mul,
    .embedding = stub_embedding,
    .add = stub_add,
    .argmax = stub_argmax,
};
#define KERNELS_CUDA_OPS (&cuda_stub_ops)
#endif

/* ---------------------------------------------------------------------------------
 * Handle.
 * --------------------------------------------------------------------------------- */
int gang_kernels_open(const char *device, gang_kernels **out)
{
    const gang__kernels_ops *ops;
    gang_kernels *k;
    int rc;

    if (out == NULL)
        return GANG_EINVAL;
    *out = NULL;
    if (device == NULL)
        return GANG_EINVAL;
    /* "auto" means the fastest backend that is really built; with the CUDA kernels still
     * unwritten that is the CPU. */
    if (strcmp(device, "cpu") == 0 || strcmp(device, "auto") == 0) {
        ops = &cpu_ops;
    } else if (strcmp(device, "cuda") == 0) {
        ops = KERNELS_CUDA_OPS;
    } else {
        gang_error("kernels: unknown device '%s' (expected cpu, cuda or auto)", device);
        return GANG_EINVAL;
    }

    if (ops->init != NULL) {
        rc = ops->init();
        if (rc < 0) {
            gang_error("kernels: device '%s' is unavailable: %s (%s)", device,
                       gang_strerror(rc), gang_err_name(rc));
            goto out_err;
        }
    }
    k = malloc(sizeof(*k));
    if (k == NULL) {
        rc = GANG_ENOMEM;
        goto out_err;
    }
    k->ops = ops;
    *out = k;
    return 0;

out_err:
    return rc;
}

void gang_kernels_close(gang_kernels *k)
{
    free(k);
}

const char *gang_kernels_name(const gang_kernels *k)
{
    return k == NULL ? "?" : k->ops->name;
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
    if (k->ops->add == NULL)
        return GANG_ENOSYS;
    return k->ops->add(x, y, n);
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
    if (k->ops->argmax == NULL)
        return GANG_ENOSYS;
    return k->ops->argmax(x, rows, cols, out);
}
