/*
 * The machine's read bandwidth, for the roofline of `ganglion bench decode --model`: what
 * a decode step could reach if it did nothing but stream its weights from memory once.
 *
 * Method: one buffer of `bytes` (1 GiB by default: far beyond any last-level cache, so
 * every pass comes from DRAM), split into one contiguous slice per thread; each thread
 * first writes its own slice (first touch: the pages live on its NUMA node, as a rank's
 * weights do after its loader thread wrote them), then, per pass, sums its slice as 64-bit
 * integers in eight independent lanes (no dependency chain, so the loads, not the adds,
 * bound the loop; the compiler may vectorise it). A pass is timed from the release of the
 * threads to the last one's arrival at the barrier; one untimed pass, then `passes` timed.
 * The sums are added to an atomic sink so the reads cannot be optimised away.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "decode.h"
#include "report.h"
#include "ganglion/common.h"

#define RB_MAX_THREADS 256

typedef struct rb_shared {
    uint64_t *buf; /* each thread writes its slice first (first touch), then sums it */
    size_t words;  /* of the whole buffer */
    uint32_t threads, passes;
    pthread_barrier_t start, done;
    pthread_mutex_t gate;  /* held by the main thread until every thread exists */
    int cancel;            /* gate: a thread could not be created; the others just leave */
    _Atomic uint64_t sink; /* the sums, kept so the reads are not optimised away */
} rb_shared;

typedef struct rb_thread {
    rb_shared *s;
    uint32_t index;
    pthread_t th;
} rb_thread;

/* Sums words [first, first + n) of buf in eight lanes. */
static uint64_t rb_sum(const uint64_t *p, size_t n)
{
    uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0, a4 = 0, a5 = 0, a6 = 0, a7 = 0;
    size_t i;

    for (i = 0; i + 8 <= n; i += 8) {
        a0 += p[i];
        a1 += p[i + 1];
        a2 += p[i + 2];
        a3 += p[i + 3];
        a4 += p[i + 4];
        a5 += p[i + 5];
        a6 += p[i + 6];
        a7 += p[i + 7];
    }
    for (; i < n; i++)
        a0 += p[i];
    return a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7;
}

/* One thread: first touch of its slice, then one untimed and `passes` timed sums. */
static void *rb_main(void *arg)
{
    rb_thread *t = arg;
    rb_shared *s = t->s;
    size_t per = s->words / s->threads, first = per * t->index;
    size_t n = t->index + 1 == s->threads ? s->words - first : per;
    uint64_t *mine = s->buf + first;
    uint64_t acc = 0;
    int cancel;

    pthread_mutex_lock(&s->gate);
    cancel = s->cancel;
    pthread_mutex_unlock(&s->gate);
    if (cancel)
        return NULL;
    for (size_t i = 0; i < n; i++)
        mine[i] = (uint64_t)(first + i) * 0x9e3779b97f4a7c15ull;
    for (uint32_t p = 0; p < s->passes + 1; p++) {
        pthread_barrier_wait(&s->start);
        acc += rb_sum(mine, n);
        pthread_barrier_wait(&s->done);
    }
    atomic_fetch_add_explicit(&s->sink, acc, memory_order_relaxed);
    return NULL;
}

int gang__read_bandwidth(size_t bytes, uint32_t threads, uint32_t passes, double gbps[3])
{
    rb_shared s;
    rb_thread *th = NULL;
    double *rate = NULL;
    uint32_t started = 0, p;
    int rc = 0;

    if (bytes < 64 || threads == 0 || threads > RB_MAX_THREADS || passes == 0 || gbps == NULL)
        return GANG_EINVAL;
    memset(&s, 0, sizeof(s));
    s.words = bytes / sizeof(uint64_t);
    s.threads = threads;
    s.passes = passes;
    s.buf = aligned_alloc(64, (s.words * sizeof(uint64_t) + 63) / 64 * 64);
    th = calloc(threads, sizeof(*th));
    rate = calloc(passes, sizeof(*rate));
    if (s.buf == NULL || th == NULL || rate == NULL) {
        rc = GANG_ENOMEM;
        goto out_free;
    }
    /* The main thread joins both barriers too: it releases and times every pass. The
     * barriers count every thread, so none may wait on them until all exist: the gate. */
    pthread_barrier_init(&s.start, NULL, threads + 1);
    pthread_barrier_init(&s.done, NULL, threads + 1);
    pthread_mutex_init(&s.gate, NULL);
    pthread_mutex_lock(&s.gate);
    for (started = 0; started < threads; started++) {
        th[started] = (rb_thread){.s = &s, .index = started};
        if (pthread_create(&th[started].th, NULL, rb_main, &th[started]) != 0)
            break;
    }
    s.cancel = started < threads;
    pthread_mutex_unlock(&s.gate);
    if (s.cancel) {
        for (p = 0; p < started; p++)
            pthread_join(th[p].th, NULL);
        rc = GANG_ENOMEM;
        goto out_destroy;
    }
    for (p = 0; p < passes + 1; p++) {
        uint64_t t0;

        pthread_barrier_wait(&s.start);
        t0 = gang_now_ns();
        pthread_barrier_wait(&s.done);
        if (p > 0)
            rate[p - 1] =
                (double)(s.words * sizeof(uint64_t)) / ((double)(gang_now_ns() - t0) / 1e9) / 1e9;
    }
    for (p = 0; p < threads; p++)
        pthread_join(th[p].th, NULL);
    gbps[0] = gang_report_median(rate, (int)passes); /* sorts rate */
    gbps[1] = rate[0];
    gbps[2] = rate[passes - 1];

out_destroy:
    pthread_mutex_destroy(&s.gate);
    pthread_barrier_destroy(&s.start);
    pthread_barrier_destroy(&s.done);

out_free:
    free(s.buf);
    free(th);
    free(rate);
    return rc;
}
