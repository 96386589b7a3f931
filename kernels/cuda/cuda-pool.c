/*
 * Device memory pool of the CUDA backend: one region allocated at open, carved up here.
 *
 * Algorithm: the region is a sorted array of segments that tile it without gaps, each
 * free or used. Allocation rounds the request up to GANG_CUDA_POOL_ALIGN and takes the
 * first free segment that holds it (first fit), splitting off the rest as a new free
 * segment; free marks the segment free and merges it with free neighbours, so two free
 * segments are never adjacent. Every operation is O(segments), which is fine for the few
 * hundred long-lived tensors (weights, KV cache, activations) of one worker; the steady
 * state of a forward pass allocates nothing.
 *
 * Only offsets are handled: no CUDA call happens here, which is what lets the unit test
 * exercise the allocator on a machine without a GPU.
 */
#include <stdlib.h>
#include <string.h>

#include "cuda-internal.h"

static size_t pool_round(size_t bytes)
{
    return (bytes + GANG_CUDA_POOL_ALIGN - 1) / GANG_CUDA_POOL_ALIGN * GANG_CUDA_POOL_ALIGN;
}

int gang__cuda_pool_init(gang__cuda_pool *p, uintptr_t base, size_t size)
{
    memset(p, 0, sizeof(*p));
    size -= size % GANG_CUDA_POOL_ALIGN;
    if (size == 0)
        return GANG_EINVAL;
    p->segs = malloc(16 * sizeof(*p->segs));
    if (p->segs == NULL)
        return GANG_ENOMEM;
    p->cap = 16;
    p->nsegs = 1;
    p->segs[0] = (gang__cuda_seg){.off = 0, .size = size, .used = 0};
    p->base = base;
    p->size = size;
    return 0;
}

void gang__cuda_pool_fini(gang__cuda_pool *p)
{
    free(p->segs);
    memset(p, 0, sizeof(*p));
}

size_t gang__cuda_pool_largest_free(const gang__cuda_pool *p)
{
    size_t best = 0;

    for (size_t i = 0; i < p->nsegs; i++)
        if (!p->segs[i].used && p->segs[i].size > best)
            best = p->segs[i].size;
    return best;
}

/* Inserts a segment at index i (the array grows geometrically). */
static int pool_insert(gang__cuda_pool *p, size_t i, gang__cuda_seg s)
{
    if (p->nsegs == p->cap) {
        gang__cuda_seg *n = realloc(p->segs, 2 * p->cap * sizeof(*n));

        if (n == NULL)
            return GANG_ENOMEM;
        p->segs = n;
        p->cap *= 2;
    }
    memmove(&p->segs[i + 1], &p->segs[i], (p->nsegs - i) * sizeof(*p->segs));
    p->segs[i] = s;
    p->nsegs++;
    return 0;
}

static void pool_remove(gang__cuda_pool *p, size_t i)
{
    memmove(&p->segs[i], &p->segs[i + 1], (p->nsegs - i - 1) * sizeof(*p->segs));
    p->nsegs--;
}

/*
 * First fit. On GANG_ENOMEM the log line says how much was asked, the pool size, what is
 * in use and the largest free block, which is what an operator needs to choose a larger
 * --gpu-memory-mb (or to see fragmentation).
 */
int gang__cuda_pool_alloc(gang__cuda_pool *p, size_t bytes, uintptr_t *out)
{
    size_t need;

    if (bytes == 0 || bytes > SIZE_MAX - GANG_CUDA_POOL_ALIGN)
        return GANG_EINVAL;
    need = pool_round(bytes);
    for (size_t i = 0; i < p->nsegs; i++) {
        gang__cuda_seg *s = &p->segs[i];

        if (s->used || s->size < need)
            continue;
        if (s->size > need) {
            gang__cuda_seg rest = {.off = s->off + need, .size = s->size - need, .used = 0};
            int rc = pool_insert(p, i + 1, rest);

            if (rc < 0)
                return rc;
            s = &p->segs[i]; /* the array may have moved */
            s->size = need;
        }
        s->used = 1;
        p->used += need;
        *out = p->base + s->off;
        return 0;
    }
    gang_error("kernels/cuda: device pool cannot hold %zu bytes (%.1f MiB): pool %.1f MiB, "
               "in use %.1f MiB, largest free block %.1f MiB; raise --gpu-memory-mb or "
               "--gpu-memory-percent",
               bytes, (double)bytes / 1048576.0, (double)p->size / 1048576.0,
               (double)p->used / 1048576.0, (double)gang__cuda_pool_largest_free(p) / 1048576.0);
    return GANG_ENOMEM;
}

int gang__cuda_pool_free(gang__cuda_pool *p, uintptr_t addr)
{
    size_t lo = 0, hi = p->nsegs, off;

    if (addr < p->base || addr >= p->base + p->size)
        return GANG_EINVAL;
    off = addr - p->base;
    while (lo < hi) { /* binary search for the segment starting at off */
        size_t mid = lo + (hi - lo) / 2;

        if (p->segs[mid].off < off)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo >= p->nsegs || p->segs[lo].off != off || !p->segs[lo].used)
        return GANG_EINVAL;
    p->segs[lo].used = 0;
    p->used -= p->segs[lo].size;
    if (lo + 1 < p->nsegs && !p->segs[lo + 1].used) {
        p->segs[lo].size += p->segs[lo + 1].size;
        pool_remove(p, lo + 1);
    }
    if (lo > 0 && !p->segs[lo - 1].used) {
        p->segs[lo - 1].size += p->segs[lo].size;
        pool_remove(p, lo);
    }
    return 0;
}
