/*
 * The tensor-parallel layers' plumbing that is not a layer (include/ganglion/parallel.h):
 * slicing a row-major matrix into a shard, and the staging of device buffers through host
 * memory for communicators that only carry host buffers (socket, MPI). tp-layers.c chains
 * the kernels and these collectives into the layers' forward.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ganglion/common.h"
#include "ganglion/parallel.h"

/* ---------------------------------------------------------------------------------
 * Slicing
 * --------------------------------------------------------------------------------- */
/* A cut of rows [lo, hi) of dst [rows, count] out of src [rows, cols] from column first
 * (a band of rows: count == cols and first 0), for gang_parallel_slices. */
typedef struct tp_slice_job {
    const float *src;
    float *dst;
    size_t cols, first, count;
} tp_slice_job;

static void tp_slice_part(void *arg, size_t lo, size_t hi)
{
    const tp_slice_job *j = arg;

    for (size_t r = lo; r < hi; r++)
        memcpy(j->dst + r * j->count, j->src + r * j->cols + j->first, j->count * sizeof(float));
}

/* The copy over the machine's cores, at least 4 MiB of dst a thread: a model's matrices
 * (up to 235 MB each for the 8B shape in f32) go at memory speed, not one core's. */
static void tp_slice_run(const float *src, size_t rows, size_t cols, size_t first, size_t count,
                         float *dst)
{
    tp_slice_job j = {.src = src, .dst = dst, .cols = cols, .first = first, .count = count};
    size_t per = ((size_t)1 << 20) / count;

    gang_parallel_slices(rows, 1, per > 0 ? per : 1, tp_slice_part, &j);
}

int gang_tp_slice_rows(const float *src, size_t rows, size_t cols, size_t row_first,
                       size_t row_count, float *dst)
{
    if (src == NULL || dst == NULL || rows == 0 || cols == 0 || row_count == 0)
        return GANG_EINVAL;
    if (row_first > rows || row_count > rows - row_first)
        return GANG_EINVAL;
    /* A band of rows of a row-major matrix is one contiguous block. */
    tp_slice_run(src + row_first * cols, row_count, cols, 0, cols, dst);
    return 0;
}

int gang_tp_slice_cols(const float *src, size_t rows, size_t cols, size_t col_first,
                       size_t col_count, float *dst)
{
    if (src == NULL || dst == NULL || rows == 0 || cols == 0 || col_count == 0)
        return GANG_EINVAL;
    if (col_first > cols || col_count > cols - col_first)
        return GANG_EINVAL;
    tp_slice_run(src, rows, cols, col_first, col_count, dst);
    return 0;
}

/* ---------------------------------------------------------------------------------
 * Staging of device buffers over host communicators
 *
 * A socket or MPI communicator reads and writes host memory; a device handle's tensors
 * are device memory. Rather than teach every caller both cases, the four helpers decide
 * once: host handle or nccl communicator: pass the pointers through (nccl ordered after
 * the compute stream's work on the device, since it runs on its own stream); otherwise
 * download into the staging buffer, run the collective on the host, upload the result.
 * The owner sizes the staging buffer at init; a missing or short one is replaced by a
 * temporary allocation (callers without a staging buffer of their own).
 * --------------------------------------------------------------------------------- */

/*
 * 1 when the buffers of (k, c) can be handed to c as they are. A device communicator is
 * ordered after k's enqueued work on the device (gang_comm_order_after: events, no host
 * wait between a GEMM and its all-reduce); only a backend without device ordering gets a
 * host synchronisation of k instead.
 */
static int stage_direct(gang_kernels *k, gang_comm *c, int *rc)
{
    *rc = 0;
    if (!(gang_kernels_caps(k) & GANG_KERNELS_CAP_DEVICE_MEM))
        return 1;
    if (gang_comm_caps(c) & GANG_COMM_CAP_DEVICE_MEM) {
        *rc = gang_comm_order_after(c, gang_kernels_device_stream(k));
        if (*rc == GANG_ENOSYS)
            *rc = gang_kernels_sync(k);
        return 1;
    }
    return 0;
}

/* Host staging memory of at least bytes: st's, or a temporary one put in *tmp. */
static void *stage_host(gang_tp_stage *st, size_t bytes, void **tmp)
{
    *tmp = NULL;
    if (st != NULL && st->host != NULL && st->bytes >= bytes)
        return st->host;
    *tmp = malloc(bytes > 0 ? bytes : 1);
    return *tmp;
}

int gang_tp_stage_all_reduce(gang_kernels *k, gang_comm *c, gang_tp_stage *st, void *buf,
                             size_t count, gang_dtype dt, uint64_t timeout_ms)
{
    size_t bytes = count * gang_dtype_size(dt);
    void *h, *tmp;
    int rc;

    if (k == NULL || c == NULL || buf == NULL)
        return GANG_EINVAL;
    if (stage_direct(k, c, &rc))
        return rc != 0 ? rc : gang_comm_all_reduce(c, buf, count, dt, timeout_ms);
    if ((h = stage_host(st, bytes, &tmp)) == NULL)
        return GANG_ENOMEM;
    rc = gang_kernels_download(k, h, buf, bytes);
    if (rc == 0)
        rc = gang_comm_all_reduce(c, h, count, dt, timeout_ms);
    if (rc == 0)
        rc = gang_kernels_upload(k, buf, h, bytes);
    free(tmp);
    return rc;
}

int gang_tp_stage_all_gather(gang_kernels *k, gang_comm *c, gang_tp_stage *st, const void *send,
                             void *recv, size_t count, gang_dtype dt, uint64_t timeout_ms)
{
    size_t bytes = count * gang_dtype_size(dt), n;
    void *h, *tmp;
    int rc;

    if (k == NULL || c == NULL || send == NULL || recv == NULL)
        return GANG_EINVAL;
    if (stage_direct(k, c, &rc))
        return rc != 0 ? rc : gang_comm_all_gather(c, send, recv, count, dt, timeout_ms);
    n = gang_comm_size(c);
    if ((h = stage_host(st, (1 + n) * bytes, &tmp)) == NULL)
        return GANG_ENOMEM;
    rc = gang_kernels_download(k, h, send, bytes);
    if (rc == 0)
        rc = gang_comm_all_gather(c, h, (char *)h + bytes, count, dt, timeout_ms);
    if (rc == 0)
        rc = gang_kernels_upload(k, recv, (char *)h + bytes, n * bytes);
    free(tmp);
    return rc;
}

int gang_tp_stage_send(gang_kernels *k, gang_comm *c, gang_tp_stage *st, const void *buf,
                       size_t bytes, uint32_t peer, uint32_t tag, uint64_t timeout_ms)
{
    void *h, *tmp;
    int rc;

    if (k == NULL || c == NULL || buf == NULL)
        return GANG_EINVAL;
    if (stage_direct(k, c, &rc))
        return rc != 0 ? rc : gang_comm_send(c, buf, bytes, peer, tag, timeout_ms);
    if ((h = stage_host(st, bytes, &tmp)) == NULL)
        return GANG_ENOMEM;
    rc = gang_kernels_download(k, h, buf, bytes);
    if (rc == 0)
        rc = gang_comm_send(c, h, bytes, peer, tag, timeout_ms);
    free(tmp);
    return rc;
}

int gang_tp_stage_recv(gang_kernels *k, gang_comm *c, gang_tp_stage *st, void *buf, size_t bytes,
                       uint32_t peer, uint32_t tag, uint64_t timeout_ms)
{
    void *h, *tmp;
    int rc;

    if (k == NULL || c == NULL || buf == NULL)
        return GANG_EINVAL;
    if (stage_direct(k, c, &rc))
        return rc != 0 ? rc : gang_comm_recv(c, buf, bytes, peer, tag, timeout_ms);
    if ((h = stage_host(st, bytes, &tmp)) == NULL)
        return GANG_ENOMEM;
    rc = gang_comm_recv(c, h, bytes, peer, tag, timeout_ms);
    if (rc == 0)
        rc = gang_kernels_upload(k, buf, h, bytes);
    free(tmp);
    return rc;
}
