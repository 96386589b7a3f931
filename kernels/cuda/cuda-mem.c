/*
 * The device memory of a CUDA backend handle: each buffer a piece of the handle's pool
 * (cuda-pool.c's bookkeeping over the one cudaMalloc of open) or, with the pool split
 * (gang_kernels_options.pool_split, --gpu-pool-split), a cudaMalloc of its own that the
 * same bookkeeping admits, over addresses it hands out but nobody dereferences. A debugging
 * mode: compute-sanitizer's memcheck and initcheck, and the CUDA emulator's guard pages,
 * see allocations' bounds, not the tensors inside one pool.
 */
#include <stdlib.h>

#include <cuda_runtime_api.h>

#include "cuda-internal.h"

/*
 * Device memory of the handle: a piece of the pool; split (gang_kernels_options.pool_split)
 * a cudaMalloc of its own, the pool's bookkeeping still deciding whether it fits, so that
 * the same requests fit or fail as in one pool while compute-sanitizer and the CUDA
 * emulator see each buffer's bounds (a piece of the pool lies among others: reading past
 * its end reads a neighbour, which neither can tell from a read of the buffer).
 */
int gang__cuda_mem_alloc(gang__cuda_ctx *c, size_t bytes, void **out)
{
    uintptr_t book;
    void *p = NULL;
    int rc = gang__cuda_pool_alloc(&c->pool, bytes, &book);

    if (rc < 0 || !c->split) {
        if (rc == 0)
            *out = (void *)book;
        return rc;
    }
    if (c->nsplit == c->split_cap) {
        size_t cap = c->split_cap ? 2 * c->split_cap : 64;
        gang__cuda_split_buf *n = realloc(c->split_bufs, cap * sizeof(*n));

        if (n == NULL) {
            rc = GANG_ENOMEM;
            goto out_book;
        }
        c->split_bufs = n;
        c->split_cap = cap;
    }
    if ((rc = gang__cuda_err(cudaMalloc(&p, bytes), "cudaMalloc of a split pool's buffer")) < 0)
        goto out_book;
    c->split_bufs[c->nsplit++] = (gang__cuda_split_buf){.dev = p, .book = book};
    *out = p;
    return 0;

out_book:
    gang__cuda_pool_free(&c->pool, book);
    return rc;
}

int gang__cuda_mem_free(gang__cuda_ctx *c, void *p)
{
    if (!c->split)
        return gang__cuda_pool_free(&c->pool, (uintptr_t)p);
    for (size_t i = 0; i < c->nsplit; i++) {
        if (c->split_bufs[i].dev != p)
            continue;
        int rc = gang__cuda_pool_free(&c->pool, c->split_bufs[i].book);

        c->split_bufs[i] = c->split_bufs[--c->nsplit];
        if (rc == 0)
            rc = gang__cuda_err(cudaFree(p), "cudaFree of a split pool's buffer");
        return rc;
    }
    return GANG_EINVAL;
}
