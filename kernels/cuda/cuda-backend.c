/*
 * CUDA backend of the kernels module: the handle (device, stream, pool, cuBLASLt), its
 * memory entries and the dispatch of the operations to the kernel launchers.
 *
 * Lifetime: open selects the GPU, creates one non-blocking stream, allocates the whole
 * device pool with the handle's only cudaMalloc, and creates the cuBLASLt handle and its
 * workspace (from the pool). Everything after that allocates from the pool (cuda-mem.c;
 * split, gang_kernels_options.pool_split, each buffer is a cudaMalloc of its own), so the
 * steady state of a forward pass performs no device allocation. close waits for the stream
 * and releases everything in reverse order.
 *
 * Threads: like every kernels handle, one thread at a time. Each entry first makes the
 * handle's device current on the calling thread (cudaSetDevice is a cheap thread-local
 * switch), so a handle may move between threads as long as calls are serialised.
 *
 * Deferred errors: kernels cannot return a value, so the ones that validate their input
 * (rope's positions, embedding's ids, the step attention's blocks, the scatter's indices)
 * OR a bit into a device word; sync and download read it back, clear it and report
 * GANG_EINVAL. Embedding still writes nothing on a bad id (a second word, cleared by each
 * call, gates its copy kernels), but the caller learns of it at the next sync: reading
 * the word back at once was a host wait in every decode step (issue #24).
 *
 * upload_async copies the host bytes into pinned staging memory of the handle and
 * enqueues the copy from there, so the call returns at once and the caller's buffer is
 * free; the staging room is reclaimed at every host synchronisation of the handle (sync,
 * download, upload), after which the stream has consumed it.
 */
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "cuda-backend.h"
#include "cuda-internal.h"

#define RESERVE_BYTES ((size_t)512 << 20) /* left free for NCCL, cuBLAS and the context */

/*
 * Also clears the runtime's last-error slot: a failed runtime call leaves its (non-sticky)
 * error there, and the next kernel launch's check, which reads cudaGetLastError(), would
 * otherwise report it as that kernel's failure. A sticky error (a device fault) stays:
 * every later call returns it anyway.
 */
int gang__cuda_err(cudaError_t e, const char *what)
{
    if (e == cudaSuccess)
        return 0;
    (void)cudaGetLastError();
    gang_error("kernels/cuda: %s: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
    switch (e) {
    case cudaErrorMemoryAllocation:
        return GANG_ENOMEM;
    case cudaErrorInvalidValue:
        return GANG_EINVAL;
    default:
        return GANG_EIO;
    }
}

static int ctx_enter(gang__cuda_ctx *c)
{
    return gang__cuda_err(cudaSetDevice(c->device), "cudaSetDevice");
}

/*
 * Chooses the pool size: pool_mb when given (refused when larger than the free memory),
 * else pool_percent of the total, capped to what is free less a reserve for the CUDA
 * context, cuBLAS and NCCL, which allocate outside the pool.
 */
static int cuda_pool_size(const gang_kernels_options *o, size_t free_b, size_t total_b, size_t *out)
{
    if (o->pool_mb > 0) {
        if (o->pool_mb > (uint64_t)(SIZE_MAX >> 20) || (size_t)(o->pool_mb << 20) > free_b) {
            gang_error("kernels/cuda: --gpu-memory-mb %llu does not fit: %.0f MiB free of "
                       "%.0f MiB on the device",
                       (unsigned long long)o->pool_mb, (double)free_b / 1048576.0,
                       (double)total_b / 1048576.0);
            return GANG_ENOMEM;
        }
        *out = (size_t)(o->pool_mb << 20);
        return 0;
    }
    size_t want = (size_t)((double)total_b * (double)o->pool_percent / 100.0);
    size_t cap = free_b > RESERVE_BYTES ? free_b - RESERVE_BYTES : 0;
    if (want > cap) {
        gang_warn("kernels/cuda: --gpu-memory-percent %u asks %.0f MiB, only %.0f MiB are "
                  "free (less a %zu MiB reserve); the pool takes %.0f MiB",
                  (unsigned)o->pool_percent, (double)want / 1048576.0, (double)free_b / 1048576.0,
                  RESERVE_BYTES >> 20, (double)cap / 1048576.0);
        want = cap;
    }
    if (want < ((size_t)64 << 20)) {
        gang_error("kernels/cuda: the device pool would be %.0f MiB (under 64 MiB); free "
                   "device memory or raise --gpu-memory-percent",
                   (double)want / 1048576.0);
        return GANG_ENOMEM;
    }
    *out = want;
    return 0;
}

static void cuda_close(void *ctx);

/*
 * Programmatic dependent launch of the decode GEMVs (gang_kernels_options.pdl): on a
 * device of compute capability 9 or more (Hopper) only; elsewhere the option is ignored
 * with a log line.
 */
static int cuda_pdl_mode(gang__cuda_ctx *c, const gang_kernels_options *o)
{
    int major = 0, rc;

    if (!o->pdl)
        return 0;
    rc =
        gang__cuda_err(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, c->device),
                       "cudaDeviceGetAttribute");
    if (rc < 0)
        return rc;
    c->pdl = major >= 9;
    if (c->pdl)
        gang_info("kernels/cuda: the decode GEMVs launch as programmatic dependents (PDL)");
    else
        gang_warn("kernels/cuda: PDL asked for, but device %d has compute capability %d (< 9): "
                  "the GEMVs launch as usual",
                  c->device, major);
    return 0;
}

/* gang_kernels_retune: the choices cuda_open takes from o, taken again. */
static int cuda_retune(void *ctx, const gang_kernels_options *o)
{
    gang__cuda_ctx *c = ctx;

    c->half_gemv = o->half_gemv;
    c->fuse_residual = o->fuse_residual;
    c->pdl = 0;
    return cuda_pdl_mode(c, o);
}

static int cuda_open(const gang_kernels_options *o, void **out)
{
    gang__cuda_ctx *c;
    size_t free_b = 0, total_b = 0, pool_b = 0;
    int count = 0, rc;
    cudaError_t e;

    *out = NULL;
    if (o->pool_percent > 100 || (o->pool_mb == 0 && o->pool_percent == 0)) {
        gang_error("kernels: pool percent %u is outside 1..100", (unsigned)o->pool_percent);
        return GANG_EINVAL;
    }
    e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count == 0) {
        gang_error("kernels/cuda: no usable GPU: %s",
                   e != cudaSuccess ? cudaGetErrorString(e) : "no device present");
        cudaGetLastError(); /* clear the sticky state of the failed query */
        return GANG_EIO;
    }
    if (o->device_index < 0 || o->device_index >= count) {
        gang_error("kernels/cuda: device index %d, but %d GPU(s) are visible", o->device_index,
                   count);
        return GANG_EINVAL;
    }
    /* Before the handle's context and graphs exist, so that CUPTI sees all of them. */
    if (o->trace && (rc = gang__cuda_trace_enable()) < 0) {
        gang_error("kernels/cuda: kernel tracing asked for, but CUPTI is unavailable");
        return rc;
    }
    c = calloc(1, sizeof(*c));
    if (c == NULL)
        return GANG_ENOMEM;
    c->device = o->device_index;
    c->trace = o->trace != 0;
    c->half_gemv = o->half_gemv;
    c->fuse_residual = o->fuse_residual;
    if ((rc = ctx_enter(c)) < 0)
        goto out_free;
    if ((rc = gang__cuda_err(cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo")) < 0)
        goto out_free;
    if ((rc = cuda_pool_size(o, free_b, total_b, &pool_b)) < 0)
        goto out_free;
    rc = gang__cuda_err(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking),
                        "cudaStreamCreate");
    if (rc < 0)
        goto out_free;
    c->split = o->pool_split != 0;
    if (!c->split) {
        rc = gang__cuda_err(cudaMalloc(&c->pool_mem, pool_b), "cudaMalloc of the device pool");
        if (rc < 0)
            goto out_close;
    }
    /* split: the bookkeeping's addresses start at the alignment, never dereferenced */
    rc = gang__cuda_pool_init(&c->pool, c->split ? GANG_CUDA_POOL_ALIGN : (uintptr_t)c->pool_mem,
                              pool_b);
    if (rc < 0)
        goto out_close;
    if ((rc = gang__cuda_mem_alloc(c, 2 * sizeof(int), (void **)&c->dev_flag)) < 0)
        goto out_close;
    rc = gang__cuda_err(cudaMallocHost((void **)&c->host_flag, 2 * sizeof(int)), "cudaMallocHost");
    if (rc < 0)
        goto out_close;
    rc = gang__cuda_err(cudaMallocHost((void **)&c->stage, GANG_CUDA_STAGE), "cudaMallocHost");
    if (rc < 0)
        goto out_close;
    rc = gang__cuda_err(cudaMemsetAsync(c->dev_flag, 0, 2 * sizeof(int), c->stream), "cudaMemset");
    if (rc < 0)
        goto out_close;
    if ((rc = gang__cuda_gemm_init(c)) < 0)
        goto out_close;
    rc = gang__cuda_err(
        cudaDeviceGetAttribute(&c->sm_count, cudaDevAttrMultiProcessorCount, c->device),
        "cudaDeviceGetAttribute");
    if (rc < 0)
        goto out_close;
    if ((rc = cuda_pdl_mode(c, o)) < 0)
        goto out_close;
    /* Split-key attention is an optimisation: without room for its scratch, attention
     * simply runs in one pass. */
    if (gang__cuda_pool_largest_free(&c->pool) >= 8 * (size_t)GANG_CUDA_ATT_SCRATCH &&
        gang__cuda_mem_alloc(c, GANG_CUDA_ATT_SCRATCH, (void **)&c->att_scratch) == 0)
        c->att_scratch_floats = GANG_CUDA_ATT_SCRATCH / sizeof(float);
    rc = gang__cuda_err(cudaStreamSynchronize(c->stream), "cudaStreamSynchronize");
    if (rc < 0)
        goto out_close;
    gang_info("kernels/cuda: device %d, pool %.0f MiB (%.0f MiB free of %.0f MiB)%s", c->device,
              (double)pool_b / 1048576.0, (double)free_b / 1048576.0, (double)total_b / 1048576.0,
              c->split ? ", split: every buffer its own cudaMalloc (--gpu-pool-split)" : "");
    *out = c;
    return 0;

out_close:
    cuda_close(c);
    return rc;
out_free:
    free(c);
    return rc;
}

/* Releases whatever open managed to create (every field may be NULL). */
static void cuda_close(void *ctx)
{
    gang__cuda_ctx *c = ctx;

    if (c == NULL)
        return;
    cudaSetDevice(c->device);
    if (c->stream != NULL)
        cudaStreamSynchronize(c->stream);
    if (c->trace)
        gang__cuda_trace_release(c);
    gang__cuda_gemm_fini(c);
    if (c->host_flag != NULL)
        cudaFreeHost(c->host_flag);
    if (c->stage != NULL)
        cudaFreeHost(c->stage);
    for (size_t i = 0; i < c->nsplit; i++)
        cudaFree(c->split_bufs[i].dev);
    free(c->split_bufs);
    gang__cuda_pool_fini(&c->pool);
    if (c->pool_mem != NULL)
        cudaFree(c->pool_mem);
    if (c->stream != NULL)
        cudaStreamDestroy(c->stream);
    free(c);
}

static int cuda_alloc(void *ctx, size_t bytes, void **out)
{
    return gang__cuda_mem_alloc(ctx, bytes, out);
}

static int cuda_free(void *ctx, void *p)
{
    return gang__cuda_mem_free(ctx, p);
}

/*
 * Waits for the stream and collects the deferred error word (see the file comment). The
 * word is copied on the stream, so it reflects every kernel enqueued before this call.
 * It first makes the handle's device current on the calling thread (ctx_enter), which
 * gang_kernels_bind_thread (kernels/backend.c) relies on: keep that order.
 */
static int cuda_trace_begin(void *ctx)
{
    return gang__cuda_trace_begin(ctx);
}

static int cuda_trace_end(void *ctx)
{
    return gang__cuda_trace_end(ctx);
}

static int cuda_sync(void *ctx);

/* The handle's work finished first: its kernels' records are then complete. */
static int cuda_trace_collect(void *ctx, gang_kernels_trace *out)
{
    int rc = cuda_sync(ctx);

    return rc < 0 ? rc : gang__cuda_trace_collect(ctx, out);
}

static int cuda_sync(void *ctx)
{
    gang__cuda_ctx *c = ctx;
    int rc;

    if ((rc = ctx_enter(c)) < 0)
        return rc;
    rc = gang__cuda_err(
        cudaMemcpyAsync(c->host_flag, c->dev_flag, sizeof(int), cudaMemcpyDeviceToHost, c->stream),
        "reading the error word");
    if (rc < 0)
        return rc;
    rc = gang__cuda_err(cudaStreamSynchronize(c->stream), "cudaStreamSynchronize");
    if (rc < 0)
        return rc;
    c->stage_used = 0; /* the stream has read every staged upload */
    if (c->host_flag[0] != 0) {
        int bits = c->host_flag[0];

        cudaMemsetAsync(c->dev_flag, 0, sizeof(int), c->stream);
        if (bits & GANG_CUDA_FLAG_BAD_POSITION)
            gang_error(
                "kernels/cuda: a negative position (rope, split_qkv_rope or the step attention)");
        if (bits & GANG_CUDA_FLAG_BAD_ID)
            gang_debug("kernels/cuda: a token id is outside the vocabulary");
        if (bits & GANG_CUDA_FLAG_BAD_INDEX)
            gang_error("kernels/cuda: a scatter index outside its array");
        if (bits & GANG_CUDA_FLAG_BAD_BLOCK)
            gang_error("kernels/cuda: a block table entry outside the KV pool");
        return GANG_EINVAL;
    }
    return 0;
}

static int cuda_upload(void *ctx, void *dst, const void *src, size_t bytes)
{
    gang__cuda_ctx *c = ctx;
    int rc;

    if ((rc = ctx_enter(c)) < 0)
        return rc;
    rc = gang__cuda_err(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, c->stream),
                        "upload");
    if (rc < 0)
        return rc;
    rc = gang__cuda_err(cudaStreamSynchronize(c->stream), "upload (wait)");
    if (rc == 0)
        c->stage_used = 0;
    return rc;
}

/* Staged in pinned memory (file comment); more than the room left waits like upload. */
static int cuda_upload_async(void *ctx, void *dst, const void *src, size_t bytes)
{
    gang__cuda_ctx *c = ctx;
    size_t at = c->stage_used;
    int rc;

    if (bytes > GANG_CUDA_STAGE - at)
        return cuda_upload(ctx, dst, src, bytes);
    if ((rc = ctx_enter(c)) < 0)
        return rc;
    memcpy(c->stage + at, src, bytes);
    rc = gang__cuda_err(
        cudaMemcpyAsync(dst, c->stage + at, bytes, cudaMemcpyHostToDevice, c->stream),
        "upload_async");
    if (rc == 0)
        c->stage_used = at + (bytes + 63) / 64 * 64;
    return rc;
}

static int cuda_download(void *ctx, void *dst, const void *src, size_t bytes)
{
    gang__cuda_ctx *c = ctx;
    int rc;

    if ((rc = ctx_enter(c)) < 0)
        return rc;
    rc = gang__cuda_err(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, c->stream),
                        "download");
    if (rc < 0)
        return rc;
    return cuda_sync(c);
}

static int cuda_pool_stats(void *ctx, gang_kernels_pool_stats *out)
{
    gang__cuda_ctx *c = ctx;

    out->pool_bytes = c->pool.size;
    out->used_bytes = c->pool.used;
    out->largest_free = gang__cuda_pool_largest_free(&c->pool);
    return 0;
}

/* ---------------------------------------------------------------------------------
 * Operations: make the device current, launch on the handle's stream.
 * --------------------------------------------------------------------------------- */
static int cuda_rmsnorm(void *ctx, const float *x, const float *w, float eps, size_t rows,
                        size_t dim, float *out)
{
    gang__cuda_ctx *c = ctx;
    int rc = ctx_enter(c);

    return rc < 0 ? rc : gang__cuda_launch_rmsnorm(c->stream, x, w, eps, rows, dim, out);
}

static int cuda_rope(void *ctx, float *x, const int32_t *positions, size_t tokens, size_t heads,
                     size_t head_dim, const float *inv_freq, float scale)
{
    gang__cuda_ctx *c = ctx;
    int rc = ctx_enter(c);

    return rc < 0 ? rc
                  : gang__cuda_launch_rope(c->stream, x, positions, tokens, heads, head_dim,
                                           inv_freq, scale, c->dev_flag);
}

static int cuda_softmax(void *ctx, float *x, size_t rows, size_t cols)
{
    gang__cuda_ctx *c = ctx;
    int rc = ctx_enter(c);

    return rc < 0 ? rc : gang__cuda_launch_softmax(c->stream, x, rows, cols);
}

static int cuda_attention(void *ctx, const float *q, const void *kc, const void *vc,
                          const gang_kernels_kv_pages *pages, size_t tq, size_t tk, size_t n_heads,
                          size_t n_kv_heads, size_t head_dim, size_t pos0, size_t window,
                          float *out)
{
    gang__cuda_ctx *c = ctx;
    int rc = ctx_enter(c);

    return rc < 0 ? rc
                  : gang__cuda_launch_attention(
                        c->stream, q, kc, vc, pages != NULL ? pages->dtype : GANG_DTYPE_F32,
                        pages != NULL ? pages->table : NULL, pages != NULL ? pages->block_size : 1,
                        tq, tk, n_heads, n_kv_heads, head_dim, pos0, window, out, c->att_scratch,
                        c->att_scratch_floats, c->sm_count);
}

static int cuda_silu_mul(void *ctx, const float *gate, const float *up, size_t n, float *out)
{
    gang__cuda_ctx *c = ctx;
    int rc = ctx_enter(c);

    return rc < 0 ? rc : gang__cuda_launch_silu_mul(c->stream, gate, up, n, out);
}

static int cuda_gelu_mul(void *ctx, const float *gate, const float *up, size_t n, float *out)
{
    gang__cuda_ctx *c = ctx;
    int rc = ctx_enter(c);

    return rc < 0 ? rc : gang__cuda_launch_gelu_mul(c->stream, gate, up, n, out);
}

static int cuda_scale(void *ctx, float *x, float a, size_t n)
{
    gang__cuda_ctx *c = ctx;
    int rc = ctx_enter(c);

    return rc < 0 ? rc : gang__cuda_launch_scale(c->stream, x, a, n);
}

/*
 * A scratch buffer of the pool of at least need bytes in *buf (*have its size): grown when
 * a larger call comes (stream order makes the reuse safe); the old one is returned to the
 * pool unless a graph was captured, since a graph replays the old address.
 */
static int cuda_scratch(gang__cuda_ctx *c, void **buf, size_t *have, size_t need)
{
    int rc;

    if (need <= *have)
        return 0;
    if (*buf != NULL && c->graphs == 0)
        gang__cuda_mem_free(c, *buf);
    *buf = NULL;
    *have = 0;
    if ((rc = gang__cuda_mem_alloc(c, need, buf)) < 0)
        return rc;
    *have = need;
    return 0;
}

/*
 * y = x . W^T over a block weight (the file's blocks, cuda-qmatmul.cu): m up to
 * GANG_CUDA_QGEMV_ROWS through the GEMV that dequantizes in registers. A larger m
 * converts x to bf16 once, then takes W in bands of at most GANG_CUDA_QBAND_ELEMS
 * elements (whole rows): each band is dequantized to bf16 into a scratch of the pool
 * (kept for the next call) and multiplied through cuBLASLt; a weight of one band writes
 * y directly, else each band's [m, rows] product goes to a second scratch and is copied
 * into its columns of y. So the scratch stays under 64 MiB whatever the weight (a
 * Llama-3-8B LM head would be 1 GiB of bf16 at once).
 */
static int cuda_matmul_blocks(gang__cuda_ctx *c, size_t m, size_t n, size_t kdim, const float *x,
                              const gang_kernels_weight *w, float *y)
{
    size_t rows = GANG_CUDA_QBAND_ELEMS / kdim,
           row_bytes = gang_kernels_weight_row_bytes(w->type, kdim);
    int rc;

    if (m <= GANG_CUDA_QGEMV_ROWS)
        return gang__cuda_launch_gemv_q(c->stream, (int)w->type, GANG_CUDA_GLU_NONE, c->pdl, m, n,
                                        kdim, x, w->data, y);
    rows = rows == 0 ? 1 : (rows >= n ? n : rows);
    if ((rc = cuda_scratch(c, &c->mq_scratch, &c->mq_scratch_bytes, rows * kdim * 2)) < 0 ||
        (rc = cuda_scratch(c, &c->mm_scratch, &c->mm_scratch_bytes, m * kdim * 2)) < 0 ||
        (rows < n && (rc = cuda_scratch(c, &c->mq_out, &c->mq_out_bytes, m * rows * 4)) < 0))
        return rc;
    rc = gang__cuda_launch_convert(c->stream, GANG_DTYPE_F32, x, GANG_DTYPE_BF16, c->mm_scratch,
                                   m * kdim);
    for (size_t o0 = 0; o0 < n && rc == 0; o0 += rows) {
        size_t cnt = n - o0 < rows ? n - o0 : rows;

        rc =
            gang__cuda_launch_dequant_q_bf16(c->stream, (int)w->type, cnt, kdim,
                                             (const char *)w->data + o0 * row_bytes, c->mq_scratch);
        if (rc == 0)
            rc = gang__cuda_gemm_half_f32(c, GANG_DTYPE_BF16, m, cnt, kdim, c->mm_scratch,
                                          c->mq_scratch, 0.0f, cnt == n ? y : (float *)c->mq_out);
        if (rc == 0 && cnt < n)
            rc = gang__cuda_err(cudaMemcpy2DAsync(y + o0, n * sizeof(float), c->mq_out,
                                                  cnt * sizeof(float), cnt * sizeof(float), m,
                                                  cudaMemcpyDeviceToDevice, c->stream),
                                "block matmul band copy");
    }
    return rc;
}

/*
 * y = x . W^T over a typed weight. bf16 / f16: up to 8 rows of x (a decode step) by
 * ganglion's GEMV (cuda-matmul.cu, unless the handle was opened with half_gemv 0), which
 * rounds x to the weight's type as it stages it; more rows: x is converted to the
 * weight's type into a scratch buffer of the pool, then cuBLASLt multiplies half by half
 * into f32 with f32 accumulation. int8: one kernel that dequantizes each weight row as it
 * reads it (cuda-matmul.cu). Block types: cuda_matmul_blocks.
 */
static int cuda_matmul(void *ctx, size_t m, size_t n, size_t kdim, const float *x,
                       const gang_kernels_weight *w, float *y)
{
    gang__cuda_ctx *c = ctx;
    gang_dtype dt = w->type == GANG_KW_BF16 ? GANG_DTYPE_BF16 : GANG_DTYPE_F16;
    int rc;

    if ((rc = ctx_enter(c)) < 0)
        return rc;
    if (w->type == GANG_KW_I8)
        return gang__cuda_launch_matmul_i8(c->stream, GANG_CUDA_GLU_NONE, c->pdl, m, n, kdim, x,
                                           w->data, w->scales, 0, y);
    if (gang_kernels_wtype_block(w->type, NULL, NULL))
        rc = cuda_matmul_blocks(c, m, n, kdim, x, w, y);
    else if (w->type != GANG_KW_BF16 && w->type != GANG_KW_F16)
        rc = GANG_ENOSYS;
    else {
        /* A decode product by the GEMV; GANG_ENOSYS: more rows, or a shape it does not take. */
        rc = c->half_gemv
                 ? gang__cuda_launch_gemv_half(c->stream, GANG_CUDA_GLU_NONE, c->pdl,
                                               dt == GANG_DTYPE_BF16, m, n, kdim, x, w->data, y)
                 : GANG_ENOSYS;
        if (rc == GANG_ENOSYS &&
            (rc = cuda_scratch(c, &c->mm_scratch, &c->mm_scratch_bytes, m * kdim * 2)) == 0 &&
            (rc = gang__cuda_launch_convert(c->stream, GANG_DTYPE_F32, x, dt, c->mm_scratch,
                                            m * kdim)) == 0)
            rc = gang__cuda_gemm_half_f32(c, dt, m, n, kdim, c->mm_scratch, w->data, 0.0f, y);
    }
    if (rc == GANG_ENOSYS)
        gang_error("cuda: no matmul kernel for %s weights", gang_kernels_wtype_name(w->type));
    return rc;
}

/*
 * glu(gu) . W^T (gang_kernels_matmul_glu): where a decode GEMV takes the weight (m <= 8;
 * bf16 / f16 unless half_gemv is off, int8 with kdim a multiple of 16, block types) it
 * computes the gated unit as it stages x, one launch; otherwise the GLU kernel writes it
 * to scratch and cuda_matmul multiplies that.
 */
static int cuda_matmul_glu(void *ctx, int gelu, size_t m, size_t n, size_t kdim, const float *gu,
                           const gang_kernels_weight *w, float *scratch, float *y)
{
    gang__cuda_ctx *c = ctx;
    int glu = gelu ? GANG_CUDA_GLU_GELU : GANG_CUDA_GLU_SILU, rc;

    if ((rc = ctx_enter(c)) < 0)
        return rc;
    rc = GANG_ENOSYS;
    if (w->type == GANG_KW_I8)
        rc = gang__cuda_launch_matmul_i8(c->stream, glu, c->pdl, m, n, kdim, gu, w->data, w->scales,
                                         0, y);
    else if (gang_kernels_wtype_block(w->type, NULL, NULL) && m <= GANG_CUDA_QGEMV_ROWS)
        rc = gang__cuda_launch_gemv_q(c->stream, (int)w->type, glu, c->pdl, m, n, kdim, gu, w->data,
                                      y);
    else if ((w->type == GANG_KW_BF16 || w->type == GANG_KW_F16) && c->half_gemv)
        rc = gang__cuda_launch_gemv_half(c->stream, glu, c->pdl, w->type == GANG_KW_BF16, m, n,
                                         kdim, gu, w->data, y);
    if (rc != GANG_ENOSYS)
        return rc;
    rc = gang__cuda_launch_glu(c->stream, gelu, gu, m, kdim, scratch);
    return rc != 0 ? rc : cuda_matmul(ctx, m, n, kdim, scratch, w, y);
}

/*
 * gang_kernels_matmul_fused over half weights through cuBLASLt (more rows than the decode
 * GEMV takes, or --half-gemv 0): the input step writes x's rows in the weight's type into
 * mm_scratch (the norm and its rounding in one launch; the gated unit into scratch, then
 * the conversion; or the conversion), and the GEMM adds to y itself where f adds (beta 1:
 * the product plus y rounded once, as the add kernel rounds it). glu_out is not this
 * path's (the caller's GEMV).
 */
static int cuda_fused_lt(gang__cuda_ctx *c, size_t m, size_t n, size_t kdim, const float *x,
                         const gang_kernels_weight *w, const gang_kernels_fusion *f, float *scratch,
                         float *y)
{
    const gang_dtype dt = w->type == GANG_KW_BF16 ? GANG_DTYPE_BF16 : GANG_DTYPE_F16;
    const float *in = x;
    int rc = cuda_scratch(c, &c->mm_scratch, &c->mm_scratch_bytes, m * kdim * 2);

    if (rc == 0 && f->norm != NULL)
        rc =
            gang__cuda_launch_rmsnorm_to(c->stream, x, f->norm, f->eps, m, kdim, dt, c->mm_scratch);
    else if (rc == 0) {
        if (f->glu_in >= 0 &&
            (rc = gang__cuda_launch_glu(c->stream, f->glu_in, x, m, kdim, scratch)) == 0)
            in = scratch;
        if (rc == 0)
            rc = gang__cuda_launch_convert(c->stream, GANG_DTYPE_F32, in, dt, c->mm_scratch,
                                           m * kdim);
    }
    return rc != 0 ? rc
                   : gang__cuda_gemm_half_f32(c, dt, m, n, kdim, c->mm_scratch, w->data,
                                              f->accumulate ? 1.0f : 0.0f, y);
}

/* A fusion step of gang_kernels_fusion (-1, 0 SiLU, 1 GELU) as a GANG_CUDA_GLU_*. */
static int cuda_glu_of(int step)
{
    return step < 0 ? GANG_CUDA_GLU_NONE : step ? GANG_CUDA_GLU_GELU : GANG_CUDA_GLU_SILU;
}

/*
 * gang_kernels_matmul_fused: the whole of f in one decode GEMV where it applies (bf16 / f16
 * unless half_gemv is off, int8; m <= 8; a norm's rows whole in its tile). Half weights
 * past it: cuda_fused_lt (the norm or the conversion, then cuBLASLt adding). Otherwise the
 * norm into scratch (rmsnorm_kernel), then the GEMV on the normed rows (glu_out: GANG_ENOSYS
 * where that GEMV does not apply, block weights included: their GEMV takes the unit in the
 * down product instead), int8's row kernel (adding), or the product (cuda_matmul,
 * cuda_matmul_glu for glu_in) into y or, to be added, into fuse_tmp, then the add: the
 * numbers of the separate calls, 2-3 kernels where the GEMV alone did it.
 */
static int cuda_matmul_fused(void *ctx, size_t m, size_t n, size_t kdim, const float *x,
                             const gang_kernels_weight *w, const gang_kernels_fusion *f,
                             float *scratch, float *y)
{
    gang__cuda_ctx *c = ctx;
    const gang__cuda_gemv_fused a = {.m = m,
                                     .n = n,
                                     .kdim = kdim,
                                     .x = x,
                                     .w = w->data,
                                     .scales = w->scales,
                                     .norm = f->norm,
                                     .eps = f->eps,
                                     .glu_in = cuda_glu_of(f->glu_in),
                                     .glu_out = cuda_glu_of(f->glu_out),
                                     .acc = f->accumulate,
                                     .y = y};
    const float *in = x;
    float *out = y;
    const int gemv = w->type == GANG_KW_I8 ||
                     ((w->type == GANG_KW_BF16 || w->type == GANG_KW_F16) && c->half_gemv);
    int rc;

    if ((rc = ctx_enter(c)) < 0)
        return rc;
    if (!c->fuse_residual && (f->norm != NULL || f->accumulate))
        return GANG_ENOSYS; /* the separate calls, the caller's */
    /* a gated output only where the GEMV takes the weight (checked first: no norm wasted) */
    if (f->glu_out >= 0 && (!gemv || !gang__cuda_gemv_takes((int)w->type, m, kdim, w->data)))
        return GANG_ENOSYS;
    rc = gemv ? gang__cuda_launch_gemv_fused(c->stream, (int)w->type, c->pdl, &a) : GANG_ENOSYS;
    if (rc != GANG_ENOSYS || (f->glu_out >= 0 && f->norm == NULL))
        return rc;
    if ((w->type == GANG_KW_BF16 || w->type == GANG_KW_F16) && f->glu_out < 0 &&
        !(c->half_gemv && m <= GANG_CUDA_GEMV_ROWS))
        return cuda_fused_lt(c, m, n, kdim, x, w, f, scratch, y);
    if (f->norm != NULL) {
        rc = gang__cuda_launch_rmsnorm(c->stream, x, f->norm, f->eps, m, kdim, scratch);
        if (rc < 0)
            return rc;
        in = scratch;
    }
    if (gemv) { /* the GEMV on the normed rows (a norm it could not fit), or its refusal */
        gang__cuda_gemv_fused b = a;

        b.x = in, b.norm = NULL;
        rc = gang__cuda_launch_gemv_fused(c->stream, (int)w->type, c->pdl, &b);
        if (rc != GANG_ENOSYS || f->glu_out >= 0)
            return rc;
    }
    if (w->type == GANG_KW_I8) { /* its row kernel adds too */
        if (f->glu_in >= 0 &&
            (rc = gang__cuda_launch_glu(c->stream, f->glu_in, x, m, kdim, scratch)) < 0)
            return rc;
        return gang__cuda_launch_matmul_i8(c->stream, GANG_CUDA_GLU_NONE, c->pdl, m, n, kdim,
                                           f->glu_in >= 0 ? scratch : in, w->data, w->scales,
                                           f->accumulate, y);
    }
    if (f->accumulate) {
        if (m > SIZE_MAX / sizeof(float) / n)
            return GANG_ERANGE;
        rc = cuda_scratch(c, &c->fuse_tmp, &c->fuse_tmp_bytes, m * n * sizeof(float));
        if (rc < 0)
            return rc;
        out = c->fuse_tmp;
    }
    rc = f->glu_in >= 0 ? cuda_matmul_glu(ctx, f->glu_in, m, n, kdim, x, w, scratch, out)
                        : cuda_matmul(ctx, m, n, kdim, in, w, out);
    if (rc == 0 && f->accumulate)
        rc = gang__cuda_launch_add(c->stream, y, out, m * n);
    return rc;
}

/*
 * Two kernels on the stream: the first checks every id and sets word 1 on a bad one (and
 * the deferred error bit of word 0), the second copies rows only when word 1 is clear,
 * so out stays untouched on a bad id without the host seeing the ids. No host wait: the
 * caller gets GANG_EINVAL from the next sync or download (the file comment).
 */
static int cuda_embedding(void *ctx, const gang_kernels_weight *table, size_t vocab, size_t dim,
                          const int32_t *ids, size_t n_ids, float *out)
{
    gang__cuda_ctx *c = ctx;
    int rc;

    if ((rc = ctx_enter(c)) < 0)
        return rc;
    rc = gang__cuda_err(cudaMemsetAsync(c->dev_flag + 1, 0, sizeof(int), c->stream), "cudaMemset");
    if (rc < 0)
        return rc;
    if ((rc = gang__cuda_launch_check_ids(c->stream, ids, n_ids, vocab, c->dev_flag)) < 0)
        return rc;
    if (gang_kernels_wtype_block(table->type, NULL, NULL))
        rc = gang__cuda_launch_embedding_q(c->stream, (int)table->type, table->data, dim, ids,
                                           n_ids, c->dev_flag + 1, out);
    else if (table->type == GANG_KW_F32)
        rc = gang__cuda_launch_embedding(c->stream, table->data, dim, ids, n_ids, c->dev_flag + 1,
                                         out);
    else
        rc = gang__cuda_launch_embedding_w(c->stream, (int)table->type, table->data, table->scales,
                                           dim, ids, n_ids, c->dev_flag + 1, out);
    return rc;
}

static int cuda_add(void *ctx, float *x, const float *y, size_t n)
{
    gang__cuda_ctx *c = ctx;
    int rc = ctx_enter(c);

    return rc < 0 ? rc : gang__cuda_launch_add(c->stream, x, y, n);
}

static int cuda_add_rows(void *ctx, float *x, const float *bias, size_t rows, size_t cols)
{
    gang__cuda_ctx *c = ctx;
    int rc = ctx_enter(c);

    return rc < 0 ? rc : gang__cuda_launch_add_rows(c->stream, x, bias, rows, cols);
}

/* Device-to-device copies stay on the stream: no host wait, stream order kept. */
static int cuda_copy(void *ctx, void *dst, const void *src, size_t bytes)
{
    gang__cuda_ctx *c = ctx;
    int rc = ctx_enter(c);

    if (rc < 0)
        return rc;
    return gang__cuda_err(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, c->stream),
                          "device copy");
}

static int cuda_copy_2d(void *ctx, void *dst, size_t dpitch, const void *src, size_t spitch,
                        size_t width, size_t rows)
{
    gang__cuda_ctx *c = ctx;
    int rc = ctx_enter(c);

    if (rc < 0)
        return rc;
    return gang__cuda_err(cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, rows,
                                            cudaMemcpyDeviceToDevice, c->stream),
                          "device 2d copy");
}

/* The handle's stream, for a communicator that orders its work after the handle's. */
static void *cuda_stream(void *ctx)
{
    return ((gang__cuda_ctx *)ctx)->stream;
}

static int cuda_argmax(void *ctx, const float *x, size_t rows, size_t cols, int32_t *out)
{
    gang__cuda_ctx *c = ctx;
    int rc = ctx_enter(c);

    return rc < 0 ? rc : gang__cuda_launch_argmax(c->stream, x, rows, cols, out);
}

static int cuda_attention_step(void *ctx, const gang_kernels_step_kv *kv, const float *knew,
                               const float *vnew, const float *q, size_t tokens, size_t n_heads,
                               size_t n_kv_heads, size_t head_dim, size_t window, float *out)
{
    gang__cuda_ctx *c = ctx;
    int rc = ctx_enter(c);

    return rc < 0 ? rc
                  : gang__cuda_launch_attention_step(
                        c->stream, kv, knew, vnew, q, tokens, n_heads, n_kv_heads, head_dim, window,
                        out, c->dev_flag, c->att_scratch, c->att_scratch_floats, c->sm_count);
}

static int cuda_scatter_i32(void *ctx, int32_t *dst, size_t dst_n, const int32_t *pairs,
                            size_t n_pairs)
{
    gang__cuda_ctx *c = ctx;
    int rc = ctx_enter(c);

    return rc < 0
               ? rc
               : gang__cuda_launch_scatter_i32(c->stream, dst, dst_n, pairs, n_pairs, c->dev_flag);
}

static int cuda_sample(void *ctx, const float *logits, size_t rows, size_t cols,
                       const gang_kernels_sample_param *params, int32_t *out)
{
    gang__cuda_ctx *c = ctx;
    int rc = ctx_enter(c);

    return rc < 0 ? rc : gang__cuda_launch_sample(c->stream, logits, rows, cols, params, out);
}

static int cuda_split_cols3(void *ctx, const float *x, size_t rows, size_t w0, size_t w1, size_t w2,
                            float *o0, float *o1, float *o2)
{
    gang__cuda_ctx *c = ctx;
    int rc = ctx_enter(c);

    return rc < 0 ? rc : gang__cuda_launch_split_cols3(c->stream, x, rows, w0, w1, w2, o0, o1, o2);
}

static int cuda_glu(void *ctx, int gelu, const float *x, size_t rows, size_t cols, float *out)
{
    gang__cuda_ctx *c = ctx;
    int rc = ctx_enter(c);

    return rc < 0 ? rc : gang__cuda_launch_glu(c->stream, gelu, x, rows, cols, out);
}

static int cuda_split_qkv_rope(void *ctx, const gang_kernels_qkv_rope *a)
{
    gang__cuda_ctx *c = ctx;
    int rc = ctx_enter(c);

    return rc < 0 ? rc : gang__cuda_launch_split_qkv_rope(c->stream, a, c->dev_flag);
}

static int cuda_add_rmsnorm(void *ctx, float *x, const float *y, const float *w, float eps,
                            size_t rows, size_t dim, float *out)
{
    gang__cuda_ctx *c = ctx;
    int rc = ctx_enter(c);

    return rc < 0 ? rc : gang__cuda_launch_add_rmsnorm(c->stream, x, y, w, eps, rows, dim, out);
}

/*
 * Graphs: a thread-local capture of the handle's stream (other threads' CUDA calls, such as
 * another rank's synchronisation in a one-GPU benchmark, stay legal), instantiated once.
 */
static int cuda_graph_begin(void *ctx)
{
    gang__cuda_ctx *c = ctx;
    int rc = ctx_enter(c);

    if (rc < 0)
        return rc;
    c->graphs++; /* from now on a graph may hold the matmul scratch (cuda_matmul) */
    return gang__cuda_err(cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeThreadLocal),
                          "cudaStreamBeginCapture");
}

static int cuda_graph_end(void *ctx, void **out)
{
    gang__cuda_ctx *c = ctx;
    cudaGraph_t g = NULL;
    cudaGraphExec_t x = NULL;
    int rc = ctx_enter(c);

    if (rc < 0)
        return rc;
    rc = gang__cuda_err(cudaStreamEndCapture(c->stream, &g), "cudaStreamEndCapture");
    if (rc < 0 || g == NULL)
        return GANG_EIO;
    rc = gang__cuda_err(cudaGraphInstantiate(&x, g, 0), "cudaGraphInstantiate");
    cudaGraphDestroy(g);
    if (rc < 0)
        return rc;
    *out = x;
    return 0;
}

static int cuda_graph_launch(void *ctx, void *graph)
{
    gang__cuda_ctx *c = ctx;
    int rc = ctx_enter(c);

    return rc < 0 ? rc
                  : gang__cuda_err(cudaGraphLaunch((cudaGraphExec_t)graph, c->stream),
                                   "cudaGraphLaunch");
}

static void cuda_graph_free(void *ctx, void *graph)
{
    gang__cuda_ctx *c = ctx;

    if (ctx_enter(c) == 0)
        cudaGraphExecDestroy((cudaGraphExec_t)graph);
}

static int cuda_convert(void *ctx, gang_dtype from, const void *src, gang_dtype to, void *dst,
                        size_t n)
{
    gang__cuda_ctx *c = ctx;
    int rc = ctx_enter(c);

    return rc < 0 ? rc : gang__cuda_launch_convert(c->stream, from, src, to, dst, n);
}

const gang__kernels_backend gang__kernels_cuda_backend = {
    .name = "cuda",
    .caps = GANG_KERNELS_CAP_DEVICE_MEM | GANG_KERNELS_CAP_HALF_GEMM,
    .open = cuda_open,
    .close = cuda_close,
    .retune = cuda_retune,
    .alloc = cuda_alloc,
    .free = cuda_free,
    .upload = cuda_upload,
    .upload_async = cuda_upload_async,
    .download = cuda_download,
    .sync = cuda_sync,
    .stream = cuda_stream,
    .pool_stats = cuda_pool_stats,
    .gemm = gang__cuda_gemm,
    .convert = cuda_convert,
    .gemm_pair = gang__cuda_gemm_pair,
    .rmsnorm = cuda_rmsnorm,
    .rope = cuda_rope,
    .softmax = cuda_softmax,
    .attention = cuda_attention,
    .silu_mul = cuda_silu_mul,
    .gelu_mul = cuda_gelu_mul,
    .scale = cuda_scale,
    .matmul = cuda_matmul,
    .embedding = cuda_embedding,
    .add = cuda_add,
    .add_rows = cuda_add_rows,
    .copy = cuda_copy,
    .copy_2d = cuda_copy_2d,
    .argmax = cuda_argmax,
    .attention_step = cuda_attention_step,
    .scatter_i32 = cuda_scatter_i32,
    .sample = cuda_sample,
    .split_cols3 = cuda_split_cols3,
    .glu = cuda_glu,
    .split_qkv_rope = cuda_split_qkv_rope,
    .add_rmsnorm = cuda_add_rmsnorm,
    .matmul_glu = cuda_matmul_glu,
    .matmul_fused = cuda_matmul_fused,
    .graph_begin = cuda_graph_begin,
    .graph_end = cuda_graph_end,
    .graph_launch = cuda_graph_launch,
    .graph_free = cuda_graph_free,
    .trace_begin = cuda_trace_begin,
    .trace_end = cuda_trace_end,
    .trace_collect = cuda_trace_collect,
};
