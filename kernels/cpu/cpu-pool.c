/*
 * The CPU backend's thread pool for the typed-weight matmul (cpu-matmul.c): a few
 * persistent workers that split one job's chunks with the calling thread.
 *
 * Why its own pool: a decode step is ~200 matmuls of 50-500 microseconds each, too short
 * for a thread start and too many for a condition-variable wake-up each (tens of
 * microseconds on a loaded host). A worker that finished a job therefore spins for a
 * short while (GANG__POOL_SPIN_NS) on the job counter before it sleeps on the condition
 * variable, so the next matmul of the same step finds it awake; a sleeping worker wakes
 * at least every GANG__POOL_NAP_MS to re-check (every wait has a deadline).
 *
 * Size: one thread per CPU of the process's affinity mask (the caller is one of them),
 * at most GANG__POOL_MAX. OpenBLAS keeps its own threads for the f32 GEMMs that remain
 * (gang_kernels_gemm, a long prefill's attention, f32 matmuls on a CPU without AVX2); the
 * two run one after the other within a step, never at once.
 *
 * Chunks: each thread owns a contiguous range of the job's chunks (thread t of T the t-th
 * T-th) and takes them from its front; a thread whose range is empty steals from the back
 * of the others'. Each thread so streams one run of adjacent weight rows (the hardware
 * prefetchers follow one stream per thread, where a shared counter dealt the chunks out
 * interleaved), takes its chunks on a cache line no other thread writes until it steals,
 * and a thread that starts late or is slowed still has its range finished by the others.
 *
 * One job at a time: a second thread that calls while a job runs (ranks of a test run as
 * threads of one process) does its whole job alone instead of waiting.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <time.h>
#include <unistd.h>

#include <cblas.h>

#include "../kernels-bench.h"
#include "cpu.h"

#define GANG__POOL_MAX 16
#define GANG__POOL_SPIN_NS 300000L /* 0.3 ms */
#define GANG__POOL_NAP_MS 100
#define GANG__POOL_YIELD_NS 50000L /* the caller's spin before it yields */
/* Spins between two readings of the clock in the wait loops. A pause is a few tens of
 * nanoseconds on current x86 (Zen 3: ~65 cycles), clock_gettime through the vDSO about as
 * long: reading it every spin made __vdso_clock_gettime 5-8% of a batch-1 decode profile.
 * Every 32 spins the deadlines stay exact to ~2 microseconds. */
#define GANG__POOL_CLOCK_EVERY 32

static struct {
    pthread_once_t once;
    pthread_mutex_t mu; /* guards sleeping on cv */
    pthread_cond_t cv;
    unsigned n_workers; /* threads besides the caller */
    pid_t pid;          /* the process that started them (a forked child has none) */
    unsigned limit;     /* threads a job may use, caller included (tests lower it) */
    /* The job's fields, each written by the caller once per job and read by the workers;
     * the counters every thread updates each on its own cache line, so that a worker
     * spinning on job_seq and the threads taking chunks do not pull one line back and
     * forth between the cores (false sharing). */
    _Alignas(64) atomic_ulong job_seq; /* incremented when a job is published */
    gang__cpu_task fn; /* the current job, stable until every worker acknowledged it */
    void *arg;
    size_t chunks;
    unsigned parts; /* threads the chunks were divided among (workers + the caller) */
    _Alignas(64) atomic_size_t done; /* chunks finished (a thread adds its count once) */
    _Alignas(64) atomic_uint acks;   /* workers that finished with the current job */
    atomic_flag busy;                /* a caller is publishing or running a job */
} pool = {.once = PTHREAD_ONCE_INIT,
          .mu = PTHREAD_MUTEX_INITIALIZER,
          .cv = PTHREAD_COND_INITIALIZER,
          .busy = ATOMIC_FLAG_INIT};

static void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static long now_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000000L + ts.tv_nsec;
}

/* Thread t's chunks of the current job not yet taken, [lo, hi) as lo | hi << 32, each on
 * its own cache line (thread 0 is the caller, worker i thread i + 1). */
static struct {
    _Alignas(64) _Atomic uint64_t lohi;
} ranges[GANG__POOL_MAX];

/* Takes one chunk of range t into *c: its first when front, else its last; 0 when the
 * range is empty. */
static int range_take(unsigned t, int front, size_t *c)
{
    uint64_t r = atomic_load_explicit(&ranges[t].lohi, memory_order_relaxed), next;

    for (;;) {
        uint64_t lo = r & 0xffffffffu, hi = r >> 32;

        if (lo >= hi)
            return 0;
        next = front ? r + 1 : r - ((uint64_t)1 << 32);
        if (atomic_compare_exchange_weak_explicit(&ranges[t].lohi, &r, next, memory_order_relaxed,
                                                  memory_order_relaxed)) {
            *c = (size_t)(front ? lo : hi - 1);
            return 1;
        }
    }
}

/* Thread self's part of the current job: its own range from the front, then the others'
 * from their backs, then the count done at once (one write to the shared counter per
 * thread and job, not one per chunk). */
static void run_chunks(unsigned self)
{
    size_t c, n = 0;

    while (range_take(self, 1, &c)) {
        pool.fn(pool.arg, c);
        n++;
    }
    for (unsigned k = 1; k < pool.parts; k++) {
        unsigned v = (self + k) % pool.parts;

        while (range_take(v, 0, &c)) {
            pool.fn(pool.arg, c);
            n++;
        }
    }
    if (n > 0)
        atomic_fetch_add_explicit(&pool.done, n, memory_order_release);
}

/* Waits (spin, then naps of at most GANG__POOL_NAP_MS) for a job other than seen. */
static unsigned long wait_job(unsigned long seen)
{
    long t0 = now_ns();
    unsigned long s;
    unsigned spins = 0;

    for (;;) {
        s = atomic_load_explicit(&pool.job_seq, memory_order_acquire);
        if (s != seen)
            return s;
        if (++spins % GANG__POOL_CLOCK_EVERY != 0 || now_ns() - t0 < GANG__POOL_SPIN_NS) {
            cpu_relax();
            continue;
        }
        pthread_mutex_lock(&pool.mu);
        if (atomic_load(&pool.job_seq) == seen) {
            struct timespec dl;

            clock_gettime(CLOCK_REALTIME, &dl);
            dl.tv_nsec += GANG__POOL_NAP_MS * 1000000L;
            dl.tv_sec += dl.tv_nsec / 1000000000L;
            dl.tv_nsec %= 1000000000L;
            pthread_cond_timedwait(&pool.cv, &pool.mu, &dl);
        }
        pthread_mutex_unlock(&pool.mu);
        t0 = now_ns();
    }
}

/*
 * A worker: wait for a job, take chunks, acknowledge. The caller publishes the next job
 * only after every worker acknowledged this one, so the job's fields never change under
 * a worker that still reads them, and no worker skips a job.
 */
static void *worker_main(void *arg)
{
    unsigned long seen = 0;
    unsigned self = (unsigned)(uintptr_t)arg;

    for (;;) {
        seen = wait_job(seen);
        run_chunks(self);
        atomic_fetch_add_explicit(&pool.acks, 1, memory_order_release);
    }
    return NULL;
}

static void pool_start(void)
{
    cpu_set_t set;
    unsigned n = 1;
    pthread_attr_t at;

    if (sched_getaffinity(0, sizeof(set), &set) == 0)
        n = (unsigned)CPU_COUNT(&set);
    if (n > GANG__POOL_MAX)
        n = GANG__POOL_MAX;
    if (n < 1)
        n = 1;
    pthread_attr_init(&at);
    pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    for (unsigned i = 0; i + 1 < n; i++) {
        pthread_t th;

        if (pthread_create(&th, &at, worker_main, (void *)(uintptr_t)(pool.n_workers + 1)) != 0)
            break; /* fewer workers: jobs still complete on the caller */
        pool.n_workers++;
    }
    pthread_attr_destroy(&at);
    pool.pid = getpid();
    atomic_store(&pool.acks, pool.n_workers);
    pool.limit = pool.n_workers + 1;
}

unsigned gang__cpu_threads(void)
{
    pthread_once(&pool.once, pool_start);
    if (pool.pid != getpid())
        return 1; /* a child forked after the pool started: its workers stayed behind */
    return pool.limit < pool.n_workers + 1 ? pool.limit : pool.n_workers + 1;
}

void gang__cpu_set_threads(unsigned n)
{
    pthread_once(&pool.once, pool_start);
    pool.limit = n < 1 ? 1 : n;
}

/* Waits at most GANG__POOL_ACK_NS for every worker to acknowledge the previous job. */
#define GANG__POOL_ACK_NS 20000L
static int acks_complete(void)
{
    long t0 = now_ns();
    unsigned spins = 0;

    while (atomic_load_explicit(&pool.acks, memory_order_acquire) < pool.n_workers) {
        if (++spins % GANG__POOL_CLOCK_EVERY == 0 && now_ns() - t0 > GANG__POOL_ACK_NS)
            return 0;
        cpu_relax();
    }
    return 1;
}

void gang__cpu_parallel(gang__cpu_task fn, void *arg, size_t chunks)
{
    long t0;
    unsigned spins = 0;
    int yield = 0;

    if (chunks <= 1 || chunks > UINT32_MAX || gang__cpu_threads() <= 1 ||
        atomic_flag_test_and_set(&pool.busy)) {
        for (size_t c = 0; c < chunks; c++)
            fn(arg, c);
        return;
    }
    if (!acks_complete()) {
        /* A worker is descheduled: do this job alone rather than wait for it. */
        atomic_flag_clear(&pool.busy);
        for (size_t c = 0; c < chunks; c++)
            fn(arg, c);
        return;
    }
    pool.fn = fn;
    pool.arg = arg;
    pool.chunks = chunks;
    pool.parts = pool.n_workers + 1;
    for (unsigned t = 0; t < pool.parts; t++) {
        uint64_t lo = chunks * t / pool.parts, hi = chunks * (t + 1) / pool.parts;

        atomic_store_explicit(&ranges[t].lohi, lo | hi << 32, memory_order_relaxed);
    }
    atomic_store(&pool.done, 0);
    atomic_store(&pool.acks, 0);
    pthread_mutex_lock(&pool.mu);
    atomic_fetch_add_explicit(&pool.job_seq, 1, memory_order_release);
    pthread_cond_broadcast(&pool.cv);
    pthread_mutex_unlock(&pool.mu);
    run_chunks(0);
    /* The chunks still running belong to workers that took them: bounded work. A worker
     * preempted by another process holds its chunk for a time slice; after a short spin
     * the caller yields its CPU instead of burning it (on a loaded host the scheduler may
     * then run the worker here). */
    t0 = now_ns();
    while (atomic_load_explicit(&pool.done, memory_order_acquire) < chunks) {
        if (!yield && ++spins % GANG__POOL_CLOCK_EVERY == 0)
            yield = now_ns() - t0 >= GANG__POOL_YIELD_NS;
        if (yield)
            sched_yield();
        else
            cpu_relax();
    }
    atomic_flag_clear(&pool.busy);
}

size_t gang__cpu_split(const size_t *units, size_t count, unsigned threads, size_t per_thread,
                       size_t *upc, size_t *c0)
{
    size_t all = 0, per;

    for (size_t i = 0; i < count; i++)
        all += units[i];
    per = threads <= 1 ? all
                       : (all + (size_t)threads * per_thread - 1) / ((size_t)threads * per_thread);
    c0[0] = 0;
    for (size_t i = 0; i < count; i++) {
        upc[i] = per < units[i] ? per : units[i];
        c0[i + 1] = c0[i] + (units[i] + upc[i] - 1) / upc[i];
    }
    return c0[count];
}

void gang__cpu_run(gang__cpu_task fn, void *arg, size_t chunks, unsigned threads)
{
    if (threads > 1) {
        gang__cpu_parallel(fn, arg, chunks);
        return;
    }
    for (size_t c = 0; c < chunks; c++)
        fn(arg, c);
}

unsigned gang__kernels_cpu_threads(unsigned n)
{
    unsigned all;

    pthread_once(&pool.once, pool_start);
    all = pool.n_workers + 1;
    if (n > 0) {
        pool.limit = n;
        (void)gang__cpu_blas_set_threads((int)(n < all ? n : all)); /* best effort */
    }
    return all;
}
