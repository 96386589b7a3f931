/*
 * Typed weights (include/ganglion/kernels.h, "Typed weights"): the packed layout, its size
 * and the host-side packing of an f32 matrix into bf16, f16 or per-row int8 (the block
 * types' own tables and dequantization are in weight-blocks.c). No backend
 * is involved: loaders pack on the host, then upload the bytes like any other tensor.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* madvise, MADV_HUGEPAGE */
#endif
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "ganglion/kernels.h"

size_t gang_kernels_weight_bytes(gang_kernels_wtype t, size_t n, size_t kdim)
{
    size_t elems, bytes;

    if (__builtin_mul_overflow(n, kdim, &elems))
        return 0;
    switch (t) {
    case GANG_KW_F32:
        return __builtin_mul_overflow(elems, sizeof(float), &bytes) ? 0 : bytes;
    case GANG_KW_BF16:
    case GANG_KW_F16:
        return __builtin_mul_overflow(elems, sizeof(uint16_t), &bytes) ? 0 : bytes;
    case GANG_KW_I8:
        if (elems > SIZE_MAX - 64 || n > (SIZE_MAX - 64 - elems) / sizeof(float))
            return 0;
        return GANG_KW_SCALES_OFFSET(elems) + n * sizeof(float);
    default: /* a block type: whole rows of blocks */
        bytes = gang_kernels_weight_row_bytes(t, kdim);
        return bytes == 0 || __builtin_mul_overflow(bytes, n, &bytes) ? 0 : bytes;
    }
}

size_t gang_kernels_weight_row_bytes(gang_kernels_wtype t, size_t kdim)
{
    size_t e, b, r;

    if (gang_kernels_wtype_block(t, &e, &b))
        return kdim % e != 0 || __builtin_mul_overflow(kdim / e, b, &r) ? 0 : r;
    if ((unsigned)t > GANG_KW_I8)
        return 0;
    return __builtin_mul_overflow(kdim, gang_kernels_wtype_size(t), &r) ? 0 : r;
}

gang_kernels_weight gang_kernels_weight_view(gang_kernels_wtype t, const void *blob, size_t n,
                                             size_t kdim)
{
    gang_kernels_weight w = {.type = t, .data = blob, .scales = NULL};

    if (t == GANG_KW_I8 && blob != NULL)
        w.scales =
            (const float *)(const void *)((const char *)blob + GANG_KW_SCALES_OFFSET(n * kdim));
    return w;
}

const char *gang_kernels_wtype_name(gang_kernels_wtype t)
{
    switch (t) {
    case GANG_KW_F32:
        return "f32";
    case GANG_KW_BF16:
        return "bf16";
    case GANG_KW_F16:
        return "f16";
    case GANG_KW_I8:
        return "int8";
    case GANG_KW_Q8_0:
        return "q8_0";
    case GANG_KW_Q4_0:
        return "q4_0";
    case GANG_KW_Q4_1:
        return "q4_1";
    case GANG_KW_Q5_0:
        return "q5_0";
    case GANG_KW_Q5_1:
        return "q5_1";
    case GANG_KW_Q4_K:
        return "q4_k";
    case GANG_KW_Q5_K:
        return "q5_k";
    case GANG_KW_Q6_K:
        return "q6_k";
    case GANG_KW_IQ4_NL:
        return "iq4_nl";
    case GANG_KW_IQ4_XS:
        return "iq4_xs";
    }
    return "?";
}

/* One row of int8: the symmetric scale max|x| / 127 and q = round(x / scale). */
static int pack_i8_row(const float *src, size_t kdim, int8_t *q, float *scale)
{
    float amax = 0.0f;

    for (size_t i = 0; i < kdim; i++) {
        if (!isfinite(src[i]))
            return GANG_EINVAL;
        if (fabsf(src[i]) > amax)
            amax = fabsf(src[i]);
    }
    *scale = amax / 127.0f;
    for (size_t i = 0; i < kdim; i++) {
        float v = amax > 0.0f ? src[i] / *scale : 0.0f;
        long r = lrintf(v);

        q[i] = (int8_t)(r > 127 ? 127 : r < -127 ? -127 : r);
    }
    return 0;
}

/* A half conversion cut into slices (gang_kernels_weight_pack). */
typedef struct pack_half_job {
    const float *src;
    uint16_t *dst;
    int bf16;
} pack_half_job;

static void pack_half_slice(void *arg, size_t lo, size_t hi)
{
    const pack_half_job *j = arg;

    if (j->bf16)
        gang_f32_to_bf16_array(j->src + lo, j->dst + lo, hi - lo);
    else
        gang_f32_to_f16_array(j->src + lo, j->dst + lo, hi - lo);
}

int gang_kernels_weight_pack(gang_kernels_wtype t, const float *src, size_t n, size_t kdim,
                             void *dst)
{
    size_t elems = n * kdim;

    if (src == NULL || dst == NULL || n == 0 || kdim == 0 ||
        gang_kernels_weight_bytes(t, n, kdim) == 0)
        return GANG_EINVAL;
    switch (t) {
    case GANG_KW_F32:
        memcpy(dst, src, elems * sizeof(float));
        return 0;
    case GANG_KW_BF16:
    case GANG_KW_F16: { /* element by element: the split does not change a bit */
        pack_half_job j = {.src = src, .dst = dst, .bf16 = t == GANG_KW_BF16};

        gang_parallel_slices(elems, 1, (size_t)1 << 20, pack_half_slice, &j);
        return 0;
    }
    case GANG_KW_I8: {
        float *scales = (float *)(void *)((char *)dst + GANG_KW_SCALES_OFFSET(elems));

        for (size_t o = 0; o < n; o++) {
            int rc = pack_i8_row(src + o * kdim, kdim, (int8_t *)dst + o * kdim, &scales[o]);

            if (rc != 0)
                return rc;
        }
        return 0;
    }
    default: /* block types come from their file as they are */
        break;
    }
    return GANG_EINVAL;
}

#define GANG__HUGE_PAGE ((size_t)2 << 20)

void *gang_kernels_weight_host_alloc(size_t bytes)
{
    size_t whole = bytes / GANG__HUGE_PAGE * GANG__HUGE_PAGE, size = bytes;
    void *p = NULL;

    if (bytes == 0)
        return NULL;
    if (whole == 0) {
        size = (bytes + 63) / 64 * 64;
        return size < bytes ? NULL : aligned_alloc(64, size);
    }
    if (whole < bytes && whole <= SIZE_MAX - GANG__HUGE_PAGE &&
        GANG__HUGE_PAGE - (bytes - whole) <= bytes / 16)
        size = whole += GANG__HUGE_PAGE; /* pad the last piece: cheap next to the block */
    if (posix_memalign(&p, GANG__HUGE_PAGE, size) != 0)
        return NULL;
#ifdef MADV_HUGEPAGE
    (void)madvise(p, whole, MADV_HUGEPAGE); /* best effort: ordinary pages otherwise */
#endif
    return p;
}

/* One region of an arena: [base, base + len) mapped, pieces cut from base up to used. */
typedef struct arena_region {
    char *base;
    size_t len, used;
} arena_region;

struct gang_kernels_arena {
    arena_region *r; /* r[n - 1] is the one pieces are cut from */
    size_t n, cap;
};

gang_kernels_arena *gang_kernels_arena_new(void)
{
    return calloc(1, sizeof(gang_kernels_arena));
}

/*
 * Maps len bytes (a multiple of 2 MiB) at a 2 MiB boundary: len + 2 MiB mapped, the
 * misaligned head and the tail beyond len unmapped again, the rest advised MADV_HUGEPAGE
 * (best effort, as in gang_kernels_weight_host_alloc). NULL when the mapping fails.
 */
static char *arena_map(size_t len)
{
    size_t over = len + GANG__HUGE_PAGE, head;
    char *p = mmap(NULL, over, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

    if (p == MAP_FAILED)
        return NULL;
    head = (GANG__HUGE_PAGE - (uintptr_t)p % GANG__HUGE_PAGE) % GANG__HUGE_PAGE;
    if (head > 0)
        munmap(p, head);
    if (over - head > len)
        munmap(p + head + len, over - head - len);
#ifdef MADV_HUGEPAGE
    (void)madvise(p + head, len, MADV_HUGEPAGE);
#endif
    return p + head;
}

void *gang_kernels_arena_alloc(gang_kernels_arena *a, size_t bytes)
{
    arena_region *last = a != NULL && a->n > 0 ? &a->r[a->n - 1] : NULL;
    size_t need = (bytes + 63) / 64 * 64, len;
    char *p;

    if (a == NULL || bytes == 0 || need < bytes)
        return NULL;
    if (last != NULL && last->len - last->used >= need) {
        p = last->base + last->used;
        last->used += need;
        return p;
    }
    /* A new region: the rest of the last one stays unused (and, untouched, not resident). */
    if (need > SIZE_MAX - 2 * GANG__HUGE_PAGE)
        return NULL;
    len = (need + GANG__HUGE_PAGE - 1) / GANG__HUGE_PAGE * GANG__HUGE_PAGE;
    if (len < GANG_KERNELS_ARENA_REGION)
        len = GANG_KERNELS_ARENA_REGION;
    if (a->n == a->cap) {
        size_t cap = a->cap ? 2 * a->cap : 8;
        arena_region *r = realloc(a->r, cap * sizeof(*r));

        if (r == NULL)
            return NULL;
        a->r = r;
        a->cap = cap;
    }
    if ((p = arena_map(len)) == NULL)
        return NULL;
    a->r[a->n++] = (arena_region){.base = p, .len = len, .used = need};
    return p;
}

int gang_kernels_arena_owns(const gang_kernels_arena *a, const void *p)
{
    const char *q = p;

    for (size_t i = 0; a != NULL && q != NULL && i < a->n; i++)
        if (q >= a->r[i].base && (size_t)(q - a->r[i].base) < a->r[i].used)
            return 1;
    return 0;
}

void gang_kernels_arena_free(gang_kernels_arena *a)
{
    if (a == NULL)
        return;
    for (size_t i = 0; i < a->n; i++)
        munmap(a->r[i].base, a->r[i].len);
    free(a->r);
    free(a);
}
