/* Small string and number helpers shared by every module. */
#include <errno.h>
#include <limits.h>
#include <malloc.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ganglion/common.h"

int gang_strlcpy(char *dst, const char *src, size_t cap)
{
    if (cap == 0)
        return GANG_ERANGE;
    size_t n = strlen(src);
    if (n >= cap) {
        memcpy(dst, src, cap - 1);
        dst[cap - 1] = '\0';
        return GANG_ERANGE;
    }
    memcpy(dst, src, n + 1);
    return 0;
}

/* Strict base-10 parse: the whole string must be a number within [lo, hi]. */
int gang_parse_i64(const char *s, int64_t lo, int64_t hi, int64_t *out)
{
    if (s == NULL || *s == '\0')
        return GANG_EINVAL;
    char *end = NULL;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (end == s || *end != '\0')
        return GANG_EINVAL;
    if (errno == ERANGE || v < lo || v > hi)
        return GANG_ERANGE;
    *out = (int64_t)v;
    return 0;
}

void gang_set_err(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;

    if (err == NULL || errlen == 0)
        return;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

int gang_hex_digit(int ch)
{
    if (ch >= '0' && ch <= '9')
        return ch - '0';
    if (ch >= 'a' && ch <= 'f')
        return ch - 'a' + 10;
    if (ch >= 'A' && ch <= 'F')
        return ch - 'A' + 10;
    return -1;
}

typedef struct gang__slice {
    void (*fn)(void *ctx, size_t lo, size_t hi);
    void *ctx;
    size_t lo, hi;
    pthread_t th;
} gang__slice;

static void *slice_main(void *arg)
{
    gang__slice *s = arg;

    s->fn(s->ctx, s->lo, s->hi);
    return NULL;
}

void gang_parallel_slices(size_t n, size_t align, size_t min_per_thread,
                          void (*fn)(void *ctx, size_t lo, size_t hi), void *ctx)
{
    gang__slice s[GANG_SLICES_MAX];
    int started[GANG_SLICES_MAX] = {0};
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    size_t nt = cpus < 1 ? 1 : cpus > GANG_SLICES_MAX ? GANG_SLICES_MAX : (size_t)cpus, per, i;

    if (n == 0)
        return;
    if (align == 0)
        align = 1;
    if (min_per_thread > 0 && n / min_per_thread < nt)
        nt = n / min_per_thread > 0 ? n / min_per_thread : 1;
    per = (n + nt - 1) / nt;
    per = (per + align - 1) / align * align;
    for (i = 0; i < nt; i++) {
        size_t lo = i * per < n ? i * per : n;

        s[i] = (gang__slice){.fn = fn, .ctx = ctx, .lo = lo, .hi = lo + per < n ? lo + per : n};
    }
    for (i = 1; i < nt; i++)
        if (s[i].lo < s[i].hi)
            started[i] = pthread_create(&s[i].th, NULL, slice_main, &s[i]) == 0;
    for (i = 0; i < nt; i++)
        if (!started[i] && s[i].lo < s[i].hi)
            fn(ctx, s[i].lo, s[i].hi); /* the first slice, and any whose thread failed */
    for (i = 1; i < nt; i++)
        if (started[i])
            pthread_join(s[i].th, NULL);
}

/* The callers between gang_heap_reuse_begin and _end, under its lock. */
static struct {
    pthread_mutex_t mu;
    int inside;
} gang__heap = {.mu = PTHREAD_MUTEX_INITIALIZER};

void gang_heap_single_arena(void)
{
    (void)mallopt(M_ARENA_MAX, 1);
}

void gang_heap_reuse_begin(void)
{
    pthread_mutex_lock(&gang__heap.mu);
    if (gang__heap.inside++ == 0) {
        (void)mallopt(M_MMAP_MAX, 0);
        (void)mallopt(M_TRIM_THRESHOLD, INT_MAX);
    }
    pthread_mutex_unlock(&gang__heap.mu);
}

void gang_heap_reuse_end(void)
{
    pthread_mutex_lock(&gang__heap.mu);
    if (gang__heap.inside > 0 && --gang__heap.inside == 0) {
        (void)mallopt(M_MMAP_MAX, 65536); /* glibc's default values (common.h) */
        (void)mallopt(M_TRIM_THRESHOLD, 128 * 1024);
        (void)malloc_trim(0);
    }
    pthread_mutex_unlock(&gang__heap.mu);
}
