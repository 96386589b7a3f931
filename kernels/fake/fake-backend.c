/*
 * The "fake" kernels backend: a device the host cannot reach into, for testing without a
 * GPU that the engine, the TP layers, the pipeline and the benchmarks keep to the memory
 * model of a device backend (include/ganglion/kernels.h).
 *
 * Address map. The process reserves one range of virtual addresses with no access
 * (PROT_NONE): these are the fake device's addresses, handed out by alloc. A second
 * range of the same size, readable and writable, holds the bytes (the "shadow"); device
 * address base + i is stored at shadow + i. So:
 *  - a device pointer dereferenced on the host faults (SIGSEGV), as on a GPU;
 *  - a host pointer handed to a device operation is caught by the translation into the
 *    shadow, which aborts with a message naming the operation (on a GPU that is an
 *    illegal address or silent garbage).
 * Both ranges are reserved with MAP_NORESERVE: only the pages actually written cost
 * memory. Allocation is first fit over a block list kept in address order under one
 * mutex (the range is shared by every fake handle of the process, as a GPU's address
 * space is shared by its streams).
 *
 * Arithmetic. Every operation translates its tensor pointers and calls the "cpu"
 * backend's entry on the shadow, so the results are the CPU backend's, bit for bit. A new
 * entry of the vtable needs its wrapper here too; without one the fake answers GANG_ENOSYS
 * and the fake-device tests say which operation is missing.
 *
 * Host waits. The "cuda" backend makes the host wait in sync, download and upload; the
 * fake counts the same calls, so a test can count the host synchronisations of a code
 * path (fake-device.h). upload_async does not wait (cuda stages the bytes in pinned
 * memory), and the embedding's id check is a deferred error on cuda (the next sync), so
 * neither is counted. The front (kernels/backend.c) counts launches, allocations and
 * bytes for every backend (gang_kernels_counters_get).
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "../kernels-backend.h"
#include "fake-device.h"

#define FAKE_SPAN ((size_t)8 << 30) /* addresses reserved for the whole process */
#define FAKE_ALIGN ((size_t)256)

typedef struct fake_block {
    size_t off, size;  /* from the base, multiples of FAKE_ALIGN */
    const void *owner; /* the handle's ctx, NULL when free */
} fake_block;

static struct {
    pthread_mutex_t mu;
    char *dev;    /* PROT_NONE: the device addresses */
    char *shadow; /* readable: their contents */
    /* bytes handed out so far from the start of the range: grows under mu, read without
     * it by the pointer checks of any thread (rank threads share one fake device) */
    atomic_size_t top;
    fake_block *blocks;
    size_t n, cap;
    int rc; /* of the one-time mapping */
} fake_mem = {.mu = PTHREAD_MUTEX_INITIALIZER};

static pthread_once_t fake_once = PTHREAD_ONCE_INIT;

/* Reserves both ranges once per process; fake_mem.rc says whether it worked. */
static void fake_map_once(void)
{
    void *d = mmap(NULL, FAKE_SPAN, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    void *s = mmap(NULL, FAKE_SPAN, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);

    if (d == MAP_FAILED || s == MAP_FAILED) {
        gang_error("kernels/fake: cannot reserve %zu GiB of address space", FAKE_SPAN >> 30);
        if (d != MAP_FAILED)
            munmap(d, FAKE_SPAN);
        if (s != MAP_FAILED)
            munmap(s, FAKE_SPAN);
        fake_mem.rc = GANG_ENOMEM;
        return;
    }
    fake_mem.dev = d;
    fake_mem.shadow = s;
}

int gang__fake_is_device(const void *p)
{
    const char *c = p;

    return fake_mem.dev != NULL && c >= fake_mem.dev &&
           c < fake_mem.dev + atomic_load_explicit(&fake_mem.top, memory_order_acquire);
}

void *gang__fake_resolve(const void *p, size_t bytes, const char *what)
{
    const char *c = p;

    if (!gang__fake_is_device(p) ||
        bytes > (size_t)(fake_mem.dev + atomic_load_explicit(&fake_mem.top, memory_order_acquire) -
                         c)) {
        fprintf(stderr,
                "kernels/fake: %s was given %p (%zu bytes), which is not fake device memory: "
                "a host pointer in a device operation\n",
                what, p, bytes);
        abort();
    }
    return fake_mem.shadow + (c - fake_mem.dev);
}

#define DEV(p, bytes) gang__fake_resolve((p), (bytes), __func__)

/* ---------------------------------------------------------------------------------
 * Handles and memory.
 * --------------------------------------------------------------------------------- */
typedef struct fake_ctx {
    gang__fake_stats st;
} fake_ctx;

static int fake_open(const gang_kernels_options *o, void **out)
{
    fake_ctx *c;

    (void)o;
    pthread_once(&fake_once, fake_map_once);
    if (fake_mem.rc < 0)
        return fake_mem.rc;
    if ((c = calloc(1, sizeof(*c))) == NULL)
        return GANG_ENOMEM;
    *out = c;
    return 0;
}

/* The handle's blocks are released with it, as closing a "cuda" handle frees its pool. */
static void fake_close(void *ctx)
{
    pthread_mutex_lock(&fake_mem.mu);
    for (size_t i = 0; i < fake_mem.n; i++)
        if (fake_mem.blocks[i].owner == ctx)
            fake_mem.blocks[i].owner = NULL;
    pthread_mutex_unlock(&fake_mem.mu);
    free(ctx);
}

/* Inserts a block at index i (the list stays in address order). */
static int fake_insert(size_t i, fake_block b)
{
    if (fake_mem.n == fake_mem.cap) {
        size_t cap = fake_mem.cap ? 2 * fake_mem.cap : 256;
        fake_block *nb = realloc(fake_mem.blocks, cap * sizeof(*nb));

        if (nb == NULL)
            return GANG_ENOMEM;
        fake_mem.blocks = nb;
        fake_mem.cap = cap;
    }
    memmove(&fake_mem.blocks[i + 1], &fake_mem.blocks[i], (fake_mem.n - i) * sizeof(fake_block));
    fake_mem.blocks[i] = b;
    fake_mem.n++;
    return 0;
}

/* First fit among the free blocks (split when larger), else from the top of the range. */
static int fake_alloc(void *ctx, size_t bytes, void **out)
{
    size_t size = (bytes + FAKE_ALIGN - 1) / FAKE_ALIGN * FAKE_ALIGN;
    int rc = 0;

    if (bytes > FAKE_SPAN)
        return GANG_ENOMEM;
    pthread_mutex_lock(&fake_mem.mu);
    for (size_t i = 0; i < fake_mem.n; i++) {
        fake_block *b = &fake_mem.blocks[i];

        if (b->owner != NULL || b->size < size)
            continue;
        if (b->size > size)
            rc = fake_insert(i + 1, (fake_block){b->off + size, b->size - size, NULL});
        if (rc == 0) {
            b = &fake_mem.blocks[i]; /* the insert may have moved the list */
            b->size = size;
            b->owner = ctx;
            *out = fake_mem.dev + b->off;
        }
        goto out_unlock;
    }
    size_t top = atomic_load_explicit(&fake_mem.top, memory_order_relaxed);

    if (size > FAKE_SPAN - top) {
        rc = GANG_ENOMEM;
        goto out_unlock;
    }
    rc = fake_insert(fake_mem.n, (fake_block){top, size, ctx});
    if (rc == 0) {
        *out = fake_mem.dev + top;
        atomic_store_explicit(&fake_mem.top, top + size, memory_order_release);
    }
out_unlock:
    pthread_mutex_unlock(&fake_mem.mu);
    return rc;
}

/* GANG_EINVAL unless p starts a block this handle holds. Free neighbours are not merged:
 * tests allocate little, and the next first fit splits what it reuses. */
static int fake_free(void *ctx, void *p)
{
    int rc = GANG_EINVAL;

    pthread_mutex_lock(&fake_mem.mu);
    for (size_t i = 0; i < fake_mem.n; i++) {
        fake_block *b = &fake_mem.blocks[i];

        if (fake_mem.dev + b->off == (char *)p && b->owner == ctx) {
            b->owner = NULL;
            rc = 0;
            break;
        }
    }
    pthread_mutex_unlock(&fake_mem.mu);
    return rc;
}

/* A host buffer must not be fake device memory: the "cuda" copies would reject it too. */
static void fake_host_side(const void *p, const char *what)
{
    if (gang__fake_is_device(p)) {
        fprintf(stderr, "kernels/fake: %s was given device address %p as its host buffer\n", what,
                p);
        abort();
    }
}

static int fake_upload(void *ctx, void *dst, const void *src, size_t bytes)
{
    fake_ctx *c = ctx;

    fake_host_side(src, "upload");
    memcpy(DEV(dst, bytes), src, bytes);
    c->st.host_waits++; /* "cuda" waits for the copy before the host buffer is reused */
    return 0;
}

/* Enqueued without a wait on "cuda": the fake copies at once, which is stream order. */
static int fake_upload_async(void *ctx, void *dst, const void *src, size_t bytes)
{
    fake_host_side(src, "upload_async");
    memcpy(DEV(dst, bytes), src, bytes);
    ((fake_ctx *)ctx)->st.ops++;
    return 0;
}

static int fake_download(void *ctx, void *dst, const void *src, size_t bytes)
{
    fake_ctx *c = ctx;

    fake_host_side(dst, "download");
    memcpy(dst, DEV(src, bytes), bytes);
    c->st.host_waits++;
    return 0;
}

static int fake_copy(void *ctx, void *dst, const void *src, size_t bytes)
{
    ((fake_ctx *)ctx)->st.ops++;
    memmove(DEV(dst, bytes), DEV(src, bytes), bytes);
    return 0;
}

static int fake_copy_2d(void *ctx, void *dst, size_t dpitch, const void *src, size_t spitch,
                        size_t width, size_t rows)
{
    char *d = DEV(dst, dpitch * (rows - 1) + width);
    const char *s = DEV(src, spitch * (rows - 1) + width);

    ((fake_ctx *)ctx)->st.ops++;
    for (size_t r = 0; r < rows; r++)
        memmove(d + r * dpitch, s + r * spitch, width);
    return 0;
}

static int fake_sync(void *ctx)
{
    ((fake_ctx *)ctx)->st.host_waits++;
    return 0;
}

static void *fake_stream(void *ctx)
{
    return ctx;
}

int gang__fake_stats_get(gang_kernels *k, gang__fake_stats *out)
{
    fake_ctx *c = gang__kernels_ctx_of(k, &gang__kernels_fake_backend);

    if (c == NULL || out == NULL)
        return GANG_EINVAL;
    *out = c->st;
    return 0;
}

/* ---------------------------------------------------------------------------------
 * Operations: translate, count, compute with the CPU backend.
 * --------------------------------------------------------------------------------- */
#define CPU (&gang__kernels_cpu_backend)
#define F32(n) ((n) * sizeof(float))

static void fake_op(void *ctx)
{
    ((fake_ctx *)ctx)->st.ops++;
}

static int fake_gemm(void *ctx, gang_dtype dt, int trans_b, size_t m, size_t n, size_t kdim,
                     float alpha, const void *a, const void *b, float beta, void *cm)
{
    fake_ctx *c = ctx;
    size_t es = gang_dtype_size(dt);

    fake_op(ctx);
    c->st.gemms++;
    c->st.waits_at_gemm = c->st.host_waits;
    return CPU->gemm(NULL, dt, trans_b, m, n, kdim, alpha, DEV(a, m * kdim * es),
                     DEV(b, n * kdim * es), beta, DEV(cm, m * n * es));
}

static int fake_convert(void *ctx, gang_dtype from, const void *src, gang_dtype to, void *dst,
                        size_t n)
{
    fake_op(ctx);
    return CPU->convert(NULL, from, DEV(src, n * gang_dtype_size(from)), to,
                        DEV(dst, n * gang_dtype_size(to)), n);
}

static int fake_rmsnorm(void *ctx, const float *x, const float *w, float eps, size_t rows,
                        size_t dim, float *out)
{
    fake_op(ctx);
    return CPU->rmsnorm(NULL, DEV(x, F32(rows * dim)), DEV(w, F32(dim)), eps, rows, dim,
                        DEV(out, F32(rows * dim)));
}

static int fake_rope(void *ctx, float *x, const int32_t *positions, size_t tokens, size_t heads,
                     size_t head_dim, const float *inv_freq, float scale)
{
    fake_op(ctx);
    return CPU->rope(NULL, DEV(x, F32(tokens * heads * head_dim)),
                     DEV(positions, tokens * sizeof(int32_t)), tokens, heads, head_dim,
                     DEV(inv_freq, F32(head_dim / 2)), scale);
}

static int fake_softmax(void *ctx, float *x, size_t rows, size_t cols)
{
    fake_op(ctx);
    return CPU->softmax(NULL, DEV(x, F32(rows * cols)), rows, cols);
}

static int fake_attention(void *ctx, const float *q, const void *kc, const void *vc,
                          const gang_kernels_kv_pages *pages, size_t tq, size_t tk, size_t n_heads,
                          size_t n_kv_heads, size_t head_dim, size_t pos0, size_t window,
                          float *out)
{
    size_t qb = F32(tq * n_heads * head_dim), kb = F32(tk * n_kv_heads * head_dim);
    gang_kernels_kv_pages pg;

    fake_op(ctx);
    if (pages != NULL) {
        /* The pool holds n_blocks blocks; the table, its ceil(tk / block_size) entries. */
        pg = *pages;
        kb = pages->n_blocks * pages->block_size * n_kv_heads * head_dim *
             gang_dtype_size(pages->dtype);
        pg.table = DEV(pages->table, (tk + pg.block_size - 1) / pg.block_size * sizeof(int32_t));
        pages = &pg;
    }
    return CPU->attention(NULL, DEV(q, qb), DEV(kc, kb), DEV(vc, kb), pages, tq, tk, n_heads,
                          n_kv_heads, head_dim, pos0, window, DEV(out, qb));
}

static int fake_silu_mul(void *ctx, const float *gate, const float *up, size_t n, float *out)
{
    fake_op(ctx);
    return CPU->silu_mul(NULL, DEV(gate, F32(n)), DEV(up, F32(n)), n, DEV(out, F32(n)));
}

static int fake_gelu_mul(void *ctx, const float *gate, const float *up, size_t n, float *out)
{
    fake_op(ctx);
    return CPU->gelu_mul(NULL, DEV(gate, F32(n)), DEV(up, F32(n)), n, DEV(out, F32(n)));
}

static int fake_scale(void *ctx, float *x, float a, size_t n)
{
    fake_op(ctx);
    return CPU->scale(NULL, DEV(x, F32(n)), a, n);
}

/* A weight view with its pointers translated into the shadow (n rows of kdim). */
static gang_kernels_weight fake_weight(const gang_kernels_weight *w, size_t n, size_t kdim)
{
    gang_kernels_weight h = {
        .type = w->type, .data = DEV(w->data, n * gang_kernels_weight_row_bytes(w->type, kdim))};

    if (w->scales != NULL)
        h.scales = DEV(w->scales, F32(n));
    return h;
}

static int fake_matmul(void *ctx, size_t m, size_t n, size_t kdim, const float *x,
                       const gang_kernels_weight *w, float *y)
{
    fake_ctx *c = ctx;
    gang_kernels_weight h = fake_weight(w, n, kdim);

    fake_op(ctx);
    c->st.gemms++;
    c->st.waits_at_gemm = c->st.host_waits;
    return CPU->matmul(NULL, m, n, kdim, DEV(x, F32(m * kdim)), &h, DEV(y, F32(m * n)));
}

/* The glu into scratch, then the product: the CPU's two kernels as one device call. */
static int fake_matmul_glu(void *ctx, int gelu, size_t m, size_t n, size_t kdim, const float *gu,
                           const gang_kernels_weight *w, float *scratch, float *y)
{
    fake_ctx *c = ctx;
    gang_kernels_weight h = fake_weight(w, n, kdim);
    float *sx = DEV(scratch, F32(m * kdim));
    int rc;

    fake_op(ctx);
    c->st.gemms++;
    c->st.waits_at_gemm = c->st.host_waits;
    rc = CPU->glu(NULL, gelu, DEV(gu, F32(m * 2 * kdim)), m, kdim, sx);
    return rc != 0 ? rc : CPU->matmul(NULL, m, n, kdim, sx, &h, DEV(y, F32(m * n)));
}

static int fake_embedding(void *ctx, const gang_kernels_weight *table, size_t vocab, size_t dim,
                          const int32_t *ids, size_t n_ids, float *out)
{
    gang_kernels_weight h = fake_weight(table, vocab, dim);

    fake_op(ctx);
    return CPU->embedding(NULL, &h, vocab, dim, DEV(ids, n_ids * sizeof(int32_t)), n_ids,
                          DEV(out, F32(n_ids * dim)));
}

static int fake_add(void *ctx, float *x, const float *y, size_t n)
{
    fake_op(ctx);
    return CPU->add(NULL, DEV(x, F32(n)), DEV(y, F32(n)), n);
}

static int fake_add_rows(void *ctx, float *x, const float *bias, size_t rows, size_t cols)
{
    fake_op(ctx);
    return CPU->add_rows(NULL, DEV(x, F32(rows * cols)), DEV(bias, F32(cols)), rows, cols);
}

static int fake_argmax(void *ctx, const float *x, size_t rows, size_t cols, int32_t *out)
{
    fake_op(ctx);
    return CPU->argmax(NULL, DEV(x, F32(rows * cols)), rows, cols,
                       DEV(out, rows * sizeof(int32_t)));
}

/*
 * The step's pools, tables and token arrays translated into the shadow. The tables'
 * extent is what the tokens reach: their rows and positions are read (on the shadow)
 * first, as the device kernel reads them.
 */
static int fake_attention_step(void *ctx, const gang_kernels_step_kv *kv, const float *knew,
                               const float *vnew, const float *q, size_t tokens, size_t n_heads,
                               size_t n_kv_heads, size_t head_dim, size_t window, float *out)
{
    size_t w = n_kv_heads * head_dim, qb = F32(tokens * n_heads * head_dim), n_tab = 0;
    size_t pool = kv->n_blocks * kv->block_size * w * gang_dtype_size(kv->dtype);
    gang_kernels_step_kv h = *kv;

    fake_op(ctx);
    h.positions = DEV(kv->positions, tokens * sizeof(int32_t));
    h.table_rows = DEV(kv->table_rows, tokens * sizeof(int32_t));
    for (size_t t = 0; t < tokens; t++) {
        if (h.positions[t] < 0 || h.table_rows[t] < 0)
            return GANG_EINVAL;
        if ((size_t)h.table_rows[t] + (size_t)h.positions[t] / kv->block_size + 1 > n_tab)
            n_tab = (size_t)h.table_rows[t] + (size_t)h.positions[t] / kv->block_size + 1;
    }
    h.tables = DEV(kv->tables, n_tab * sizeof(int32_t));
    h.kc = DEV(kv->kc, pool);
    h.vc = DEV(kv->vc, pool);
    return CPU->attention_step(NULL, &h, DEV(knew, F32(tokens * w)), DEV(vnew, F32(tokens * w)),
                               DEV(q, qb), tokens, n_heads, n_kv_heads, head_dim, window,
                               DEV(out, qb));
}

static int fake_scatter_i32(void *ctx, int32_t *dst, size_t dst_n, const int32_t *pairs,
                            size_t n_pairs)
{
    fake_op(ctx);
    return CPU->scatter_i32(NULL, DEV(dst, dst_n * sizeof(int32_t)), dst_n,
                            DEV(pairs, 2 * n_pairs * sizeof(int32_t)), n_pairs);
}

static int fake_sample(void *ctx, const float *logits, size_t rows, size_t cols,
                       const gang_kernels_sample_param *params, int32_t *out)
{
    fake_op(ctx);
    return CPU->sample(NULL, DEV(logits, F32(rows * cols)), rows, cols,
                       DEV(params, rows * sizeof(*params)), DEV(out, rows * sizeof(int32_t)));
}

static int fake_split_cols3(void *ctx, const float *x, size_t rows, size_t w0, size_t w1, size_t w2,
                            float *o0, float *o1, float *o2)
{
    fake_op(ctx);
    return CPU->split_cols3(NULL, DEV(x, F32(rows * (w0 + w1 + w2))), rows, w0, w1, w2,
                            DEV(o0, F32(rows * w0)), DEV(o1, F32(rows * w1)),
                            DEV(o2, F32(rows * w2)));
}

static int fake_glu(void *ctx, int gelu, const float *x, size_t rows, size_t cols, float *out)
{
    fake_op(ctx);
    return CPU->glu(NULL, gelu, DEV(x, F32(rows * 2 * cols)), rows, cols,
                    DEV(out, F32(rows * cols)));
}

static int fake_split_qkv_rope(void *ctx, const gang_kernels_qkv_rope *a)
{
    size_t q_cols = a->n_heads * a->head_dim, kv_cols = a->n_kv_heads * a->head_dim;
    gang_kernels_qkv_rope h = *a;

    fake_op(ctx);
    h.x = DEV(a->x, F32(a->rows * (q_cols + 2 * kv_cols)));
    h.bq = a->bq != NULL ? DEV(a->bq, F32(q_cols)) : NULL;
    h.bk = a->bk != NULL ? DEV(a->bk, F32(kv_cols)) : NULL;
    h.bv = a->bv != NULL ? DEV(a->bv, F32(kv_cols)) : NULL;
    h.positions = DEV(a->positions, a->rows * sizeof(int32_t));
    h.inv_freq = DEV(a->inv_freq, F32(a->head_dim / 2));
    h.q = DEV(a->q, F32(a->rows * q_cols));
    h.k = DEV(a->k, F32(a->rows * kv_cols));
    h.v = DEV(a->v, F32(a->rows * kv_cols));
    return CPU->split_qkv_rope(NULL, &h);
}

static int fake_add_rmsnorm(void *ctx, float *x, const float *y, const float *w, float eps,
                            size_t rows, size_t dim, float *out)
{
    fake_op(ctx);
    return CPU->add_rmsnorm(NULL, DEV(x, F32(rows * dim)), DEV(y, F32(rows * dim)),
                            DEV(w, F32(dim)), eps, rows, dim, DEV(out, F32(rows * dim)));
}

/* The rows the CUDA decode GEMV takes (cuda-matmul.cu's MM_ROWS): the fake fuses a gated
 * unit into a product's output where that GEMV does, so that both count the same calls. */
#define FAKE_GEMV_ROWS 8

/* gang_kernels_matmul_fused as its separate CPU calls (the norm or the input's gated unit
 * into scratch, the product, its gated unit or the add from a host buffer): the CPU's
 * numbers, one device call. glu_out only where the CUDA GEMV fuses it (its rows, its
 * storages), else GANG_ENOSYS before anything ran, as there. */
static int fake_matmul_fused(void *ctx, size_t m, size_t n, size_t kdim, const float *x,
                             const gang_kernels_weight *w, const gang_kernels_fusion *f,
                             float *scratch, float *y)
{
    fake_ctx *c = ctx;
    const size_t rows = f->glu_out >= 0 ? 2 * n : n, xk = f->glu_in >= 0 ? 2 * kdim : kdim;
    gang_kernels_weight h;
    const float *in;
    float *hy, *tmp = NULL, *out;
    int rc = 0;

    if (f->glu_out >= 0 &&
        (m > FAKE_GEMV_ROWS ||
         (w->type != GANG_KW_BF16 && w->type != GANG_KW_F16 && w->type != GANG_KW_I8)))
        return GANG_ENOSYS;
    fake_op(ctx);
    c->st.gemms++;
    c->st.waits_at_gemm = c->st.host_waits;
    h = fake_weight(w, rows, kdim);
    in = DEV(x, F32(m * xk));
    hy = DEV(y, F32(m * n));
    if (f->norm != NULL || f->glu_in >= 0) {
        float *hs = DEV(scratch, F32(m * kdim));

        rc = f->norm != NULL ? CPU->rmsnorm(NULL, in, DEV(f->norm, F32(kdim)), f->eps, m, kdim, hs)
                             : CPU->glu(NULL, f->glu_in, in, m, kdim, hs);
        in = hs;
    }
    out = hy;
    if (rc == 0 && (f->accumulate || f->glu_out >= 0)) {
        if ((tmp = malloc(F32(m * rows))) == NULL)
            return GANG_ENOMEM;
        out = tmp;
    }
    if (rc == 0)
        rc = CPU->matmul(NULL, m, rows, kdim, in, &h, out);
    if (rc == 0 && f->accumulate)
        rc = CPU->add(NULL, hy, tmp, m * n);
    if (rc == 0 && f->glu_out >= 0)
        rc = CPU->glu(NULL, f->glu_out, tmp, m, n, hy);
    free(tmp);
    return rc;
}

/* Device memory and the CPU's f32 arithmetic: no half-precision GEMM, no pool, no peer. */
const gang__kernels_backend gang__kernels_fake_backend = {
    .name = "fake",
    .caps = GANG_KERNELS_CAP_DEVICE_MEM,
    .open = fake_open,
    .close = fake_close,
    .alloc = fake_alloc,
    .free = fake_free,
    .upload = fake_upload,
    .upload_async = fake_upload_async,
    .download = fake_download,
    .copy = fake_copy,
    .copy_2d = fake_copy_2d,
    .sync = fake_sync,
    .stream = fake_stream,
    .gemm = fake_gemm,
    .convert = fake_convert,
    .rmsnorm = fake_rmsnorm,
    .rope = fake_rope,
    .softmax = fake_softmax,
    .attention = fake_attention,
    .silu_mul = fake_silu_mul,
    .gelu_mul = fake_gelu_mul,
    .scale = fake_scale,
    .matmul = fake_matmul,
    .embedding = fake_embedding,
    .add = fake_add,
    .add_rows = fake_add_rows,
    .argmax = fake_argmax,
    .attention_step = fake_attention_step,
    .scatter_i32 = fake_scatter_i32,
    .sample = fake_sample,
    .split_cols3 = fake_split_cols3,
    .glu = fake_glu,
    .split_qkv_rope = fake_split_qkv_rope,
    .add_rmsnorm = fake_add_rmsnorm,
    .matmul_glu = fake_matmul_glu,
    .matmul_fused = fake_matmul_fused,
};
