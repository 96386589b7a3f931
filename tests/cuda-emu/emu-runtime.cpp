/*
 * The CUDA emulator's runtime (tests/cuda-emu/, issue #24): the kernels of kernels/cuda
 * executed on the CPU, and the part of the CUDA runtime API the backend calls, so that the
 * GPU tests (test-cuda, test-cuda-step, test-cuda-blocks, test-engine-cuda) and a decode
 * step with its CUDA graphs run on a machine without a GPU, on the same device code nvcc
 * compiles for the H200.
 *
 * Execution. A launch runs its grid's blocks one after another, under one process-wide
 * lock (a kernel's __shared__ arrays are function statics here, so two kernels never run
 * at once): in ascending order in one kernel run and descending in the next (block_order),
 * each block's shared arrays poisoned as it starts (gang_emu_shared_fresh). The threads of
 * a block are fibers (on x86-64 a stack switch of our own that
 * saves the callee-saved registers, a few ns; elsewhere ucontext, whose swapcontext
 * is a system call), started in thread order; a fiber
 * runs until it finishes or reaches a synchronisation point: __syncthreads (it waits until
 * every live thread of the block is there, exited threads counting as arrived, as on the
 * device) or a warp shuffle (it deposits its value and waits until every live lane of its
 * warp has deposited that round's). A block whose live threads all wait and none can be
 * released is a deadlock on the device: the emulator prints the kernel, the block and
 * where each thread waits, and aborts. So does a shuffle that reads a lane which has exited
 * before depositing. A shuffle round waits for every live lane of the warp, whatever its
 * mask: the backend's kernels shuffle with full masks, and a partial-mask shuffle would be
 * reported as a deadlock here (a limit of the emulator, not of the device).
 *
 * Streams are synchronous: an operation enqueued on a stream has completed when the call
 * returns, unless the stream is being captured into a graph; then kernels, copies and
 * memsets are recorded (with their arguments, read again when the graph replays, as on
 * the device) and cudaGraphLaunch replays them in order. A synchronising
 * call on a capturing stream fails the capture as the runtime does
 * (cudaErrorStreamCaptureUnsupported; EndCapture then answers
 * cudaErrorStreamCaptureInvalidated); cudaMalloc / cudaMallocHost / cudaEventSynchronize
 * are refused as the capture's mode says (Global: in any thread; ThreadLocal, the
 * backend's: in the thread that began it).
 *
 * Pending operations (emu-sync.h: the NCCL emulator's collectives) are the exception: they
 * complete when their peers have posted theirs. A stream's later work (its own, or that
 * of a stream that waited for an event recorded after one) then runs ahead of the host as
 * on a device: it is deferred, in order, to the stream's own thread, which carries each
 * operation out once what it waits for completed; the host goes on (to its settle, which
 * polls), and a synchronising call waits for the deferred work too; cudaStreamQuery
 * answers cudaErrorNotReady until then. A stream that waits for an event recorded on a
 * capturing stream joins that capture, as on the device (the NCCL stream of a
 * communicator inside a captured decode step). A pending operation posted on a capturing
 * stream is a node of the graph (an NCCL collective, captured as NCCL's are), posted
 * afresh at each replay, the graph's later nodes waiting for it. GANG_EMU_CAPTURE_FAIL=D
 * makes every capture ended on device D fail (as one that met an uncapturable call).
 *
 * Device memory is host memory (a pointer is valid on both sides; a kernel argument that
 * points into no allocation stops the launch), each allocation between guard pages (an
 * access past either end stops the process, naming the kernel; guard_fault);
 * GANG_EMU_MEMORY_MB (default 2048) is each device's
 * size; GANG_EMU_DEVICES (default 1, at most 8) devices, each thread with its own current
 * one (they share the memory, so a kernel may read another device's, unlike the device).
 * The device reports itself as "ganglion CUDA emulator", compute capability 9.0, 132
 * multiprocessors (the H200's count, so the backend's launch plans are the H200's).
 */
#include "emu-kernel.h" /* first: its qualifiers come before the CUDA headers' */

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include <cuda_runtime_api.h>

#include "emu-sync.h"

uint3 gang_emu_thread_idx, gang_emu_block_idx;
dim3 gang_emu_block_dim, gang_emu_grid_dim;

namespace
{

/* ------------------------------------------------------------------------------------
 * Fibers of one block.
 * ------------------------------------------------------------------------------------ */
enum fiber_state { F_RUN, F_BARRIER, F_WARP, F_DONE };

#if defined(__x86_64__)
/* Saves rbp, rbx and r12-r15 on the current stack, stores the stack pointer in *from and
 * resumes the stack to (which was saved the same way, or built by fiber_stack_init). The
 * SSE / x87 control words are not switched: no kernel changes the rounding mode, and
 * loading them costs more than the rest of the switch. */
extern "C" void gang_emu_ctx_switch(void **from, void *to);
asm(".text\n"
    ".globl gang_emu_ctx_switch\n"
    ".type gang_emu_ctx_switch,@function\n"
    "gang_emu_ctx_switch:\n"
    "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
    "  movq %rsp, (%rdi)\n  movq %rsi, %rsp\n"
    "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n"
    "  ret\n"
    ".size gang_emu_ctx_switch, .-gang_emu_ctx_switch\n");

struct emu_ctx {
    void *sp;
};

/* A stack on which the first switch "returns" into entry with the ABI's alignment. */
void fiber_stack_init(emu_ctx *c, char *stack, size_t bytes, void (*entry)(void))
{
    uintptr_t top = ((uintptr_t)stack + bytes) & ~(uintptr_t)15;
    uint64_t *sp = (uint64_t *)(top - 16);

    sp[0] = (uint64_t)(uintptr_t)entry; /* popped by ret: entry starts at rsp = 8 mod 16 */
    sp -= 6;                            /* rbp rbx r12-r15 */
    memset(sp, 0, 6 * sizeof(*sp));
    c->sp = sp;
}

void ctx_switch(emu_ctx *from, emu_ctx *to)
{
    gang_emu_ctx_switch(&from->sp, to->sp);
}
#else
struct emu_ctx {
    ucontext_t uc;
};

void fiber_stack_init(emu_ctx *c, char *stack, size_t bytes, void (*entry)(void))
{
    getcontext(&c->uc);
    c->uc.uc_stack.ss_sp = stack;
    c->uc.uc_stack.ss_size = bytes;
    c->uc.uc_link = NULL;
    makecontext(&c->uc, entry, 0);
}

void ctx_switch(emu_ctx *from, emu_ctx *to)
{
    swapcontext(&from->uc, &to->uc);
}
#endif

struct fiber {
    emu_ctx ctx;
    fiber_state state;
    unsigned long warp_gen; /* shuffle rounds deposited */
    unsigned long bar_gen;  /* barriers passed */
    const char *where;      /* what it waits at */
};

constexpr size_t STACK_BYTES = 128 << 10;
/* Multiprocessors reported: the H200's, so that the backend takes the launch plans it
 * takes there (split-key attention when a step's (query, head) pairs are fewer). */
constexpr int EMU_SMS = 132;
constexpr int MAX_THREADS = 1024;

struct block_run {
    fiber th[MAX_THREADS];
    int n;
    int cur;
    emu_ctx sched;
    const std::function<void()> *body;
    const char *name;
    char *stacks; /* MAX_THREADS x STACK_BYTES, mapped once, touched only where used */
    uint64_t slots[MAX_THREADS / 32][2][32];
    /* Scheduling, all O(1) per synchronisation point: the runnable threads (a ring: each
     * thread is in it at most once), the live threads, those waiting at the barrier, and
     * per warp its live lanes and how many have deposited the round being exchanged. */
    int queue[MAX_THREADS];
    int q_head, q_len;
    int live, at_barrier;
    int warp_live[MAX_THREADS / 32], warp_arrived[MAX_THREADS / 32];
    int reverse;               /* this block starts and releases its threads from the last one */
    unsigned long long serial; /* blocks run so far, this one included (shared poisoning) */
};

block_run B;
std::mutex kernel_lock; /* one kernel at a time: __shared__ arrays are statics */
int order_flip = -1;    /* GANG_EMU_ORDER_FLIP, read at the first launch */
int shared_poison = -1; /* GANG_EMU_SHARED_POISON (default 1), read at the first launch */
/* GANG_EMU_BLOCK_ORDER=ascending (1): every run's blocks in ascending order; by default (0)
 * every other kernel run takes them from the last one back, so that a block reading what
 * another block of the same grid writes (no order between them on the device) sees it
 * written in one run and not in the next. */
int block_order = 0;
unsigned long long runs_done; /* kernel runs so far (launches and graph replays) */
/* Each __shared__ array's address and the block (B.serial) that last poisoned it. */
std::unordered_map<const void *, unsigned long long> shared_fresh;

/* Kernels run, by name, appended to GANG_EMU_STATS at exit when it is set: which of the
 * backend's kernels the tests reach (tests/cuda-emu/kernel-coverage.py). */
std::vector<std::pair<const char *, unsigned long>> kernel_runs;

void write_stats(void)
{
    const char *path = getenv("GANG_EMU_STATS");
    std::string out;
    char line[256];
    int fd;

    if (path == NULL || path[0] == '\0')
        return;
    for (auto &k : kernel_runs) {
        snprintf(line, sizeof(line), "%s %lu\n", k.first, k.second);
        out += line;
    }
    /* One append: tests run two at a time, and their lines must not interleave. */
    fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0)
        return;
    if (write(fd, out.data(), out.size()) != (ssize_t)out.size())
        perror("cuda-emu: GANG_EMU_STATS");
    close(fd);
}

/* Called with kernel_lock held. */
void count_run(const char *name)
{
    if (kernel_runs.empty())
        atexit(write_stats);
    for (auto &k : kernel_runs)
        if (k.first == name || strcmp(k.first, name) == 0) {
            k.second++;
            return;
        }
    kernel_runs.emplace_back(name, 1ul);
}

void set_thread_coords(int t)
{
    gang_emu_thread_idx.x = (unsigned)t % gang_emu_block_dim.x;
    gang_emu_thread_idx.y = (unsigned)t / gang_emu_block_dim.x % gang_emu_block_dim.y;
    gang_emu_thread_idx.z = (unsigned)t / (gang_emu_block_dim.x * gang_emu_block_dim.y);
}

[[noreturn]] void emu_die(const char *why)
{
    fprintf(stderr, "cuda-emu: kernel %s, block (%u,%u,%u): %s\n", B.name, gang_emu_block_idx.x,
            gang_emu_block_idx.y, gang_emu_block_idx.z, why);
    for (int t = 0; t < B.n; t++)
        if (B.th[t].state != F_DONE)
            fprintf(stderr, "  thread %d: waits at %s (barriers passed %lu, shuffles %lu)\n", t,
                    B.th[t].where, B.th[t].bar_gen, B.th[t].warp_gen);
    abort();
}

void make_runnable(int t)
{
    B.th[t].state = F_RUN;
    B.queue[(B.q_head + B.q_len) % MAX_THREADS] = t;
    B.q_len++;
}

/* The barrier opens when every live thread waits at it (exited threads count as
 * arrived, as on the device). */
void barrier_check(void)
{
    if (B.at_barrier == 0 || B.at_barrier != B.live)
        return;
    for (int i = 0; i < B.n; i++) {
        int t = B.reverse ? B.n - 1 - i : i;

        if (B.th[t].state == F_BARRIER) {
            B.th[t].bar_gen++;
            make_runnable(t);
        }
    }
    B.at_barrier = 0;
}

/* A shuffle round of warp w completes when every live lane has deposited its value. */
void warp_check(int w)
{
    int end = w * 32 + 32 < B.n ? w * 32 + 32 : B.n;

    if (B.warp_arrived[w] == 0 || B.warp_arrived[w] != B.warp_live[w])
        return;
    for (int i = w * 32; i < end; i++) {
        int l = B.reverse ? end - 1 - (i - w * 32) : i;

        if (B.th[l].state == F_WARP)
            make_runnable(l);
    }
    B.warp_arrived[w] = 0;
}

/* A thread's whole life: the kernel, then back to the scheduler for good. */
void fiber_main()
{
    int t = B.cur;

    (*B.body)();
    B.th[t].state = F_DONE;
    B.live--;
    B.warp_live[t / 32]--;
    warp_check(t / 32);
    barrier_check();
    ctx_switch(&B.th[t].ctx, &B.sched);
    abort(); /* a finished fiber is never resumed */
}

void yield_to_scheduler()
{
    ctx_switch(&B.th[B.cur].ctx, &B.sched);
    set_thread_coords(B.cur);
}

/* Runs the block's threads from the queue until all have finished; a queue that runs dry
 * before is a deadlock. The order threads run in between two synchronisation points is
 * ascending in one block and descending in the next: a read of another thread's write
 * that lacks its __syncthreads then sees the old value in one of the two, whichever side
 * the writer is on (a race the device may or may not show, the emulator shows in a grid
 * of two blocks or more; GANG_EMU_ORDER_FLIP=1 swaps the two orders, for a grid of one). */
void run_block(void)
{
    B.q_head = B.q_len = 0;
    B.live = B.n;
    B.at_barrier = 0;
    for (int w = 0; w * 32 < B.n; w++) {
        B.warp_live[w] = B.n - w * 32 < 32 ? B.n - w * 32 : 32;
        B.warp_arrived[w] = 0;
    }
    for (int t = 0; t < B.n; t++) {
        fiber *f = &B.th[t];

        fiber_stack_init(&f->ctx, B.stacks + (size_t)t * STACK_BYTES, STACK_BYTES, fiber_main);
        f->warp_gen = f->bar_gen = 0;
        f->where = "start";
    }
    for (int i = 0; i < B.n; i++)
        make_runnable(B.reverse ? B.n - 1 - i : i);
    while (B.q_len > 0) {
        int t = B.queue[B.q_head];

        B.q_head = (B.q_head + 1) % MAX_THREADS;
        B.q_len--;
        B.cur = t;
        set_thread_coords(t);
        ctx_switch(&B.sched, &B.th[t].ctx);
    }
    if (B.live > 0)
        emu_die("deadlock: no thread can go on (a __syncthreads or a shuffle that some live "
                "threads never reach)");
}

/* ------------------------------------------------------------------------------------
 * Streams, events, graphs.
 * ------------------------------------------------------------------------------------ */
/* A node of a captured graph: the runtime's own work (a kernel, copy or memset), or
 * another library's pending operation (post, an NCCL collective captured as NCCL's are),
 * posted afresh at every replay. */
struct emu_node {
    std::function<void()> op;
    std::function<void(std::shared_ptr<gang_emu_pending>)> post;
};

struct emu_graph {
    std::vector<emu_node> ops;
};

typedef std::vector<std::shared_ptr<gang_emu_pending>> emu_waits;

/* Work of a stream deferred behind a pending operation: op, once before completed. */
struct deferred_op {
    emu_waits before;
    std::function<void()> op;
};

struct emu_stream {
    int capturing = 0;
    enum cudaStreamCaptureMode mode = cudaStreamCaptureModeGlobal; /* of its own capture */
    cudaError_t capture_err = cudaSuccess;
    emu_graph *graph = nullptr;
    int joined = 0;  /* capturing as a stream that joined another's capture (graph is not its) */
    emu_waits waits; /* pending operations its next work waits for: its own and those of the
                        events it waited for (deps: the latter only) */
    emu_waits deps;
    /* Under pend_lock: the deferred work, in order, and its thread (started at the first). */
    std::deque<deferred_op> deferred;
    std::thread drainer;
    bool stop = false;
    int device = 0; /* the creating thread's current device */
};

struct emu_event {
    /* when recorded, from a monotonic clock; shared with a record deferred to its stream's
     * thread, which may complete after the event was destroyed (as the runtime allows) */
    std::shared_ptr<double> ms = std::make_shared<double>(0.0);
    emu_waits waits;    /* what was pending on its stream when recorded */
    emu_graph *capture; /* recorded into this capture, else NULL */
};

emu_stream &default_stream = *new emu_stream(); /* never destroyed: its thread lives on */
thread_local cudaError_t last_error = cudaSuccess;
/* Captures running, as the mode they began in makes an unsafe call (cudaMalloc,
 * cudaEventSynchronize) illegal: any thread's while one of cudaStreamCaptureModeGlobal
 * runs, the beginning thread's for ThreadLocal, none for Relaxed. */
std::atomic<int> global_captures{0};
thread_local int local_captures;

int unsafe_call_refused()
{
    return global_captures.load() > 0 || local_captures > 0;
}

void capture_count(enum cudaStreamCaptureMode mode, int d)
{
    if (mode == cudaStreamCaptureModeGlobal)
        global_captures += d;
    else if (mode == cudaStreamCaptureModeThreadLocal)
        local_captures += d;
}
thread_local int current_device;
std::mutex streams_lock;
std::set<emu_stream *> live_streams; /* for the streams that joined a capture */

/* Pending operations: completed by other threads, waited for here (and by the streams'
 * threads). Never destroyed: a stream's thread may still wait on them when the process
 * exits, and a condition variable destroyed with a waiter blocks the exit. */
std::mutex &pend_lock = *new std::mutex();
std::condition_variable &pend_cv = *new std::condition_variable();

/* Drops the completed operations of w; 1 when none is left. */
int waits_prune(emu_waits &w)
{
    w.erase(
        std::remove_if(w.begin(), w.end(),
                       [](const std::shared_ptr<gang_emu_pending> &p) { return p->done.load(); }),
        w.end());
    return w.empty();
}

/* Appends the operations of from that w does not hold yet (a stream waiting for the same
 * event again, or for events that carry each other's waits, adds each once). */
void waits_add(emu_waits &w, const emu_waits &from)
{
    for (auto &p : from)
        if (std::find(w.begin(), w.end(), p) == w.end())
            w.push_back(p);
}

/* Waits on pend_cv (g holds pend_lock) until done() holds, at most GANG_EMU_WAIT_MS;
 * past that the process stops naming what waited: on a device it would never go on. */
template <typename Done>
void wait_or_die(std::unique_lock<std::mutex> &g, Done done, const char *what)
{
    if (pend_cv.wait_for(g, std::chrono::milliseconds(gang_emu_wait_ms()), done))
        return;
    fprintf(stderr,
            "cuda-emu: %s waited %lld ms for an operation of another library (an NCCL "
            "collective whose peers never posted theirs): on a device this stream would "
            "never go on\n",
            what, gang_emu_wait_ms());
    abort();
}

/* Waits until every operation of w completed (emu-sync.h: a bounded wait). */
void waits_wait(emu_waits &w, const char *what)
{
    if (waits_prune(w))
        return;
    std::unique_lock<std::mutex> g(pend_lock);
    wait_or_die(
        g, [&]() { return waits_prune(w); }, what);
}

/* The stream's thread: carries its deferred work out in order, each once what it waits for
 * completed, until the stream is destroyed. */
void drain(emu_stream *st)
{
    std::unique_lock<std::mutex> g(pend_lock);

    for (;;) {
        pend_cv.wait(g, [&]() { return st->stop || !st->deferred.empty(); });
        if (st->deferred.empty())
            return;
        wait_or_die(
            g, [&]() { return waits_prune(st->deferred.front().before); },
            "a stream's deferred work");
        std::function<void()> op = std::move(st->deferred.front().op);
        g.unlock();
        op();
        g.lock();
        st->deferred.pop_front();
        pend_cv.notify_all();
    }
}

/* Defers op behind before on st; under pend_lock. */
void defer(emu_stream *st, emu_waits before, std::function<void()> op)
{
    st->deferred.push_back(deferred_op{std::move(before), std::move(op)});
    if (!st->drainer.joinable())
        st->drainer = std::thread(drain, st);
    pend_cv.notify_all();
}

/* Waits until st has no deferred work left and its pending operations completed. */
void stream_wait(emu_stream *st, const char *what)
{
    std::unique_lock<std::mutex> g(pend_lock);

    wait_or_die(
        g, [&]() { return st->deferred.empty() && waits_prune(st->waits); }, what);
}

/* Waits until the default stream and the streams created on the calling thread's device
 * have no deferred work left (a stream is not destroyed meanwhile: streams_lock). */
void all_streams_wait(const char *what)
{
    std::lock_guard<std::mutex> g(streams_lock);

    stream_wait(&default_stream, what);
    for (emu_stream *st : live_streams)
        if (!st->capturing && st->device == current_device)
            stream_wait(st, what);
}

emu_stream *stream_of(cudaStream_t s)
{
    if (s == NULL || s == cudaStreamLegacy || s == cudaStreamPerThread)
        return &default_stream;
    return reinterpret_cast<emu_stream *>(s);
}

double now_ms()
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* GANG_EMU_LAG_US (default 0): when set, every operation of a stream is deferred to the
 * stream's thread and carried out no sooner than that many microseconds after it was
 * enqueued: the device runs behind the host, as it does on a GPU, so that the host
 * rewriting a pinned buffer an upload has not read yet, reading a download before its
 * synchronisation, or handing a buffer to the next step before the device is done with
 * it, gives the wrong numbers here too (streams are otherwise synchronous). */
std::atomic<long long> lag_setting{-1}; /* -1: GANG_EMU_LAG_US not read yet */

long long lag_us()
{
    long long v = lag_setting.load();

    if (v < 0) {
        const char *e = getenv("GANG_EMU_LAG_US");

        v = e != NULL && atoll(e) > 0 ? atoll(e) : 0;
        lag_setting.store(v);
    }
    return v;
}

/* Runs op now, or defers it (to the stream's thread) behind the pending operations s
 * waits for and the work already deferred (always, with lag_us), or records it into the
 * graph being captured on s. */
cudaError_t enqueue(cudaStream_t s, std::function<void()> op)
{
    emu_stream *st = stream_of(s);

    if (st->capturing) {
        st->graph->ops.push_back(emu_node{std::move(op), nullptr});
        return cudaSuccess;
    }
    {
        std::unique_lock<std::mutex> g(pend_lock);
        const long long lag = lag_us();

        if (lag > 0) {
            const auto due = std::chrono::steady_clock::now() + std::chrono::microseconds(lag);

            op = [due, op = std::move(op)]() {
                std::this_thread::sleep_until(due);
                op();
            };
        }
        const bool waiting = !waits_prune(st->waits); /* pruned whatever the lag */

        if (lag > 0 || !st->deferred.empty() || waiting) {
            defer(st, st->waits, std::move(op));
            st->deps.clear(); /* the deferred work waits for them; what follows, for it */
            return cudaSuccess;
        }
    }
    st->deps.clear();
    op();
    return cudaSuccess;
}

/*
 * Another library's operation at the end of s (gang_emu_stream_post): recorded into the
 * graph s is capturing (NULL returned: nothing is pending until a replay posts it), or a
 * new pending operation whose post runs once its inputs are there. What it waits for
 * through events is its input, and the work deferred before it; its own stream's earlier
 * pending operations complete in their own order (a send after a send still matches in
 * order, a group's receive does not hold its send). in_replay: a graph's node, whose
 * inputs came through the graph's order rather than events (the streams it forked to
 * were folded into the launching one): it waits for everything s has pending.
 */
std::shared_ptr<gang_emu_pending>
stream_post(cudaStream_t s, std::function<void(std::shared_ptr<gang_emu_pending>)> post,
            bool in_replay)
{
    emu_stream *st = stream_of(s);

    if (st->capturing) {
        st->graph->ops.push_back(emu_node{nullptr, std::move(post)});
        return nullptr;
    }
    auto p = std::make_shared<gang_emu_pending>();
    std::unique_lock<std::mutex> g(pend_lock);
    emu_waits &before = in_replay ? st->waits : st->deps;

    if (!st->deferred.empty() || !waits_prune(before)) {
        defer(st, before, [post, p]() { post(p); });
        st->deps.clear();
        st->waits.push_back(p);
        return p;
    }
    st->deps.clear();
    st->waits.push_back(p);
    g.unlock();
    post(p);
    return p;
}

/* A call that is illegal on a capturing stream: it invalidates the capture, as the
 * runtime does, and answers cudaErrorStreamCaptureUnsupported. */
cudaError_t refuse_in_capture(emu_stream *st)
{
    st->capture_err = cudaErrorStreamCaptureUnsupported;
    return last_error = cudaErrorStreamCaptureUnsupported;
}

/* A call that must wait for s (or for the device): illegal while s is captured. */
cudaError_t sync_point(cudaStream_t s)
{
    emu_stream *st = stream_of(s);

    if (st->capturing)
        return refuse_in_capture(st);
    stream_wait(st, "a synchronisation");
    st->deps.clear();
    return cudaSuccess;
}

int device_count()
{
    static int n = 0;

    if (n == 0) {
        const char *e = getenv("GANG_EMU_DEVICES");
        int v = e != NULL ? atoi(e) : 1;

        n = v < 1 ? 1 : (v > 8 ? 8 : v);
    }
    return n;
}

size_t device_bytes()
{
    const char *e = getenv("GANG_EMU_MEMORY_MB");
    unsigned long long mb = e != NULL ? strtoull(e, NULL, 10) : 0;

    return (size_t)(mb > 0 ? mb : 2048) << 20;
}

std::mutex mem_lock;
size_t mem_used;
/* One cudaMalloc / cudaMallocHost. Device memory lies between two guard pages, its end
 * where CUDA's 256-byte alignment lets it be closest to the second: [guard][head slack]
 * [the bytes asked][tail slack < 256][guard] (guard_layout); pinned memory is its pages. */
struct allocation {
    void *p;
    size_t bytes;     /* asked */
    size_t span;      /* bytes rounded to 256: what counts as inside it */
    void *map;        /* the mapping, guard pages included */
    size_t map_bytes; /* its length */
    size_t acct;      /* counted against the device's memory (emu_alloc's rounded) */
    int pinned;
    unsigned char fill; /* what its slack holds until written: 0xff poisoned, else 0 */
};
std::vector<allocation> allocations;
constexpr size_t PAGE = 4096;
constexpr size_t DEVICE_ALIGN = 256; /* cudaMalloc's guarantee, which kernels rely on */

/* Where p lies: 0 in no allocation (pageable host memory), 1 pinned host memory
 * (cudaMallocHost), 2 device memory (cudaMalloc). */
int memory_kind(const void *p)
{
    std::lock_guard<std::mutex> g(mem_lock);
    uintptr_t a = (uintptr_t)p;

    for (auto &x : allocations)
        if (a >= (uintptr_t)x.p && a - (uintptr_t)x.p < x.span)
            return x.pinned ? 1 : 2;
    return 0;
}

/* 1 when p lies inside an allocation (device or pinned). */
int inside_allocation(const void *p)
{
    return memory_kind(p) != 0;
}

/* Fresh device memory's contents: 0xff bytes (a NaN as float, -1 as an integer) unless
 * GANG_EMU_POISON_MALLOC=0 (then zeros). The device gives whatever its pages held; zeros
 * (which anonymous pages would give) would hide a kernel that reads what nothing wrote, or
 * multiplies a value it means to mask by 0, where the device may hold a NaN. */
int poison_malloc()
{
    static const int v = []() {
        const char *e = getenv("GANG_EMU_POISON_MALLOC");
        return e == NULL || strcmp(e, "0") != 0;
    }();
    return v;
}

constexpr size_t POISON_CHUNK = (size_t)16 << 20;

/* A memory file of POISON_CHUNK bytes of 0xff, made once (-1 if it cannot be). */
int poison_fd()
{
    static const int fd = []() {
        int f = (int)syscall(SYS_memfd_create, "gang-emu-poison", 0);
        if (f < 0 || ftruncate(f, (off_t)POISON_CHUNK) != 0)
            return -1;
        void *m = mmap(NULL, POISON_CHUNK, PROT_READ | PROT_WRITE, MAP_SHARED, f, 0);
        if (m == MAP_FAILED)
            return -1;
        memset(m, 0xff, POISON_CHUNK);
        munmap(m, POISON_CHUNK);
        return f;
    }();
    return fd;
}

/* rounded bytes of address space whose pages read 0xff until written: private (copy on
 * write) mappings of the poison file, one per POISON_CHUNK, so that only the pages written
 * cost memory, as anonymous pages would. MAP_FAILED when it cannot. */
void *map_poisoned(size_t rounded)
{
    const int fd = poison_fd();
    void *m = mmap(NULL, rounded, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);

    if (fd < 0 || m == MAP_FAILED)
        return MAP_FAILED;
    for (size_t off = 0; off < rounded; off += POISON_CHUNK) {
        const size_t len = rounded - off < POISON_CHUNK ? rounded - off : POISON_CHUNK;

        if (mmap((char *)m + off, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_FIXED, fd, 0) ==
            MAP_FAILED) {
            munmap(m, rounded);
            return MAP_FAILED;
        }
    }
    return m;
}

/* ------------------------------------------------------------------------------------
 * Guard pages: an access past either end of a device allocation (beyond the tail slack
 * that CUDA's alignment leaves) meets a page that cannot be touched; the fault handler
 * names the allocation, the distance and the kernel, block and thread that made it, and
 * aborts, as compute-sanitizer's memcheck would report it on the device (where the access
 * might instead land silently in a neighbour). Writes into the slacks are found at
 * cudaFree. A fault anywhere else goes to the handler installed before (ASan's, or the
 * default).
 * ------------------------------------------------------------------------------------ */
thread_local const char *running_kernel; /* the kernel whose blocks this thread runs */
struct sigaction previous_segv;

/* Writes "label: N bytes past the end of / before the start of ..." for a fault at a in a
 * guard page of x, and aborts. Only async-signal-safe calls (snprintf of integers and
 * strings, write). */
[[noreturn]] void guard_report(const allocation &x, uintptr_t a)
{
    const uintptr_t p = (uintptr_t)x.p;
    char where[160], line[512];
    int n;

    if (running_kernel != NULL)
        snprintf(where, sizeof(where), "kernel %s, block (%u,%u,%u), thread %d", running_kernel,
                 gang_emu_block_idx.x, gang_emu_block_idx.y, gang_emu_block_idx.z, B.cur);
    else
        snprintf(where, sizeof(where), "outside a kernel (a copy, a memset or the host)");
    if (a >= p)
        n = snprintf(line, sizeof(line),
                     "cuda-emu: %s: an access %zu bytes past the end of a device allocation of "
                     "%zu bytes at %p\n",
                     where, (size_t)(a - p - x.bytes), x.bytes, x.p);
    else
        n = snprintf(line, sizeof(line),
                     "cuda-emu: %s: an access %zu bytes before the start of a device allocation "
                     "of %zu bytes at %p\n",
                     where, (size_t)(p - a), x.bytes, x.p);
    if (n > 0 && write(2, line, (size_t)n < sizeof(line) ? (size_t)n : sizeof(line) - 1) < 0)
        n = 0;
    abort();
}

/* The SIGSEGV handler: a guard page's fault is reported (guard_report); any other goes
 * back to the handler before this one, which the faulting access meets again on return.
 * The allocation list is read without its lock: the process ends here either way. */
void guard_fault(int sig, siginfo_t *si, void *uc)
{
    const uintptr_t a = (uintptr_t)si->si_addr;

    (void)sig, (void)uc;
    for (const allocation &x : allocations) {
        const uintptr_t lo = (uintptr_t)x.map, hi = lo + x.map_bytes - PAGE;

        if (!x.pinned && ((a >= lo && a < lo + PAGE) || (a >= hi && a < hi + PAGE)))
            guard_report(x, a);
    }
    sigaction(SIGSEGV, &previous_segv, NULL);
}

/* Makes guard_fault the SIGSEGV handler unless it is: called at every device allocation
 * and kernel launch, since a test harness may put its own back between two tests (cmocka
 * does), which would take over a guard page's fault and go on with the next test. */
void guard_install()
{
    static std::mutex lock;
    std::lock_guard<std::mutex> g(lock);
    struct sigaction cur, sa;

    if (sigaction(SIGSEGV, NULL, &cur) == 0 && (cur.sa_flags & SA_SIGINFO) != 0 &&
        cur.sa_sigaction == guard_fault)
        return;
    memset(&sa, 0, sizeof(sa));
    sa.sa_sigaction = guard_fault;
    sa.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, &previous_segv);
}

/* Device memory of bytes (guard_layout above), its pages reading as poison_malloc says;
 * x filled in but for acct (emu_alloc's). 0, or -1 when it cannot be mapped. */
int guard_map(size_t bytes, allocation *x)
{
    const size_t span =
        bytes == 0 ? DEVICE_ALIGN : (bytes + DEVICE_ALIGN - 1) & ~(DEVICE_ALIGN - 1);
    const size_t data = (span + PAGE - 1) & ~(PAGE - 1), total = data + 2 * PAGE;
    char *m = (char *)(poison_malloc() ? map_poisoned(total)
                                       : mmap(NULL, total, PROT_READ | PROT_WRITE,
                                              MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0));

    if ((void *)m == MAP_FAILED)
        return -1;
    if (mprotect(m, PAGE, PROT_NONE) != 0 || mprotect(m + PAGE + data, PAGE, PROT_NONE) != 0) {
        munmap(m, total);
        return -1;
    }
    guard_install();
    *x = {m + PAGE + data - span,
          bytes,
          span,
          m,
          total,
          0,
          0,
          (unsigned char)(poison_malloc() ? 0xff : 0)};
    return 0;
}

/* Aborts, naming them, when bytes of x's slacks (before it on its first page, after it up
 * to the guard) no longer hold what they were mapped with: something wrote past an end. */
void guard_check_slack(const allocation &x)
{
    const unsigned char *lo = (const unsigned char *)x.map + PAGE, *p = (const unsigned char *)x.p;
    const unsigned char *end = p + x.bytes, *hi = (const unsigned char *)x.map + x.map_bytes - PAGE;
    size_t before = 0, after = 0, first_after = 0;

    for (const unsigned char *q = lo; q < p; q++)
        before += *q != x.fill;
    for (const unsigned char *q = end; q < hi; q++)
        if (*q != x.fill && after++ == 0)
            first_after = (size_t)(q - end);
    if (before == 0 && after == 0)
        return;
    fprintf(stderr,
            "cuda-emu: cudaFree of a device allocation of %zu bytes at %p: something wrote %zu "
            "bytes of the slack after its end (the first at end + %zu) and %zu before its "
            "start\n",
            x.bytes, x.p, after, first_after, before);
    abort();
}

cudaError_t emu_alloc(void **p, size_t bytes, int pinned)
{
    std::lock_guard<std::mutex> g(mem_lock);
    size_t rounded = bytes == 0 ? PAGE : (bytes + PAGE - 1) & ~(PAGE - 1);
    allocation x;

    if (unsafe_call_refused())
        return last_error = cudaErrorStreamCaptureUnsupported;
    if (!pinned && mem_used + rounded > device_bytes())
        return last_error = cudaErrorMemoryAllocation;
    if (pinned) {
        void *m = mmap(NULL, rounded, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (m == MAP_FAILED)
            return last_error = cudaErrorMemoryAllocation;
        x = {m, rounded, rounded, m, rounded, 0, 1, 0};
    } else if (guard_map(bytes, &x) != 0) {
        return last_error = cudaErrorMemoryAllocation;
    } else {
        x.acct = rounded; /* what the capacity check above counted */
    }
    allocations.push_back(x);
    mem_used += x.acct;
    *p = x.p;
    return cudaSuccess;
}

cudaError_t emu_free(void *p, int pinned)
{
    if (lag_us() > 0 && p != NULL) /* as cudaFree does: the device's work finishes first */
        all_streams_wait("cudaFree");
    std::lock_guard<std::mutex> g(mem_lock);

    if (p == NULL)
        return cudaSuccess;
    for (size_t i = 0; i < allocations.size(); i++)
        if (allocations[i].p == p && allocations[i].pinned == pinned) {
            const allocation x = allocations[i];

            if (!pinned)
                guard_check_slack(x);
            allocations.erase(allocations.begin() + (long)i);
            munmap(x.map, x.map_bytes);
            mem_used -= x.acct;
            return cudaSuccess;
        }
    return last_error = cudaErrorInvalidValue;
}

} // namespace

/* ------------------------------------------------------------------------------------
 * Kernel side (emu-kernel.h).
 * ------------------------------------------------------------------------------------ */
/* A __shared__ array's first reach in a block (rewrite-launch.py puts the call after each
 * declaration): its bytes are set to 0xff (a NaN as float or double, -1 as an integer) the
 * first time a thread of the block reaches it, and left alone by the block's others. On the
 * device a block's shared memory holds whatever it held before; here the arrays are
 * statics, which keep the previous block's values, often the very ones this block would
 * have written (every block of a GEMV stages the same x): a read of an element the block
 * never wrote would pass unseen. GANG_EMU_SHARED_POISON=0 keeps the old values. */
void gang_emu_shared_fresh(void *p, size_t bytes)
{
    if (shared_poison == 0)
        return;
    unsigned long long &at = shared_fresh[p];

    if (at != B.serial) {
        at = B.serial;
        memset(p, 0xff, bytes);
    }
}

void gang_emu_check_pointer(const char *kernel, int arg, const void *p)
{
    if (p == NULL || inside_allocation(p))
        return;
    fprintf(stderr,
            "cuda-emu: kernel %s, argument %d: %p is not device memory (no cudaMalloc or "
            "cudaMallocHost holds it): a host pointer, which faults on the device\n",
            kernel, arg, p);
    abort();
}

void gang_emu_check_aligned(const void *p, unsigned n, const char *what)
{
    char why[160];

    if (((uintptr_t)p & (n - 1)) == 0)
        return;
    snprintf(why, sizeof(why),
             "%s at %p, not %u-byte aligned: a misaligned-address fault on the device", what, p, n);
    emu_die(why);
}

cudaError_t gang_emu_enqueue(cudaStream_t stream, std::function<void()> op)
{
    return enqueue(stream, std::move(op));
}

void gang_emu_syncthreads(void)
{
    B.th[B.cur].state = F_BARRIER;
    B.th[B.cur].where = "__syncthreads";
    B.at_barrier++;
    barrier_check();
    yield_to_scheduler();
}

uint64_t gang_emu_shfl(unsigned mask, uint64_t v, int mode, int arg, int width)
{
    fiber *me = &B.th[B.cur];
    int t = B.cur, lane = t % 32, warp = t / 32, src;
    unsigned long round = me->warp_gen;

    if (width <= 0 || width > 32 || (width & (width - 1)) != 0)
        emu_die("shuffle width not a power of two up to 32");
    if (((mask >> lane) & 1u) == 0)
        emu_die("a lane shuffles outside its own mask");
    B.slots[warp][round & 1][lane] = v;
    me->warp_gen++;
    me->state = F_WARP;
    me->where = "a warp shuffle";
    B.warp_arrived[warp]++;
    warp_check(warp);
    yield_to_scheduler();
    int base = lane / width * width;
    if (mode == 0)
        src = lane ^ arg;
    else if (mode == 1)
        src = base + (arg % width);
    else
        src = lane + arg;
    if (src < base || src >= base + width)
        src = lane; /* out of the group: the lane's own value, as on the device */
    if (((mask >> src) & 1u) == 0)
        emu_die("a shuffle reads a lane outside the mask");
    if (warp * 32 + src >= B.n || B.th[warp * 32 + src].warp_gen <= round)
        emu_die("a shuffle reads a lane that exited before depositing its value");
    return B.slots[warp][round & 1][src];
}

static std::atomic<gang_emu_kernel_hook> kernel_hook{nullptr};
static thread_local int in_graph_replay; /* the op running is a graph's node */

void gang_emu_set_kernel_hook(gang_emu_kernel_hook hook)
{
    kernel_hook.store(hook);
}

unsigned long long gang_emu_now_ns()
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (unsigned long long)ts.tv_sec * 1000000000ull + (unsigned long long)ts.tv_nsec;
}

void gang_emu_launch(const gang_emu_cfg &cfg, const char *name, std::function<void()> body)
{
    unsigned long long threads = (unsigned long long)cfg.block.x * cfg.block.y * cfg.block.z;
    dim3 grid = cfg.grid, block = cfg.block;

    if (threads == 0 || threads > MAX_THREADS || cfg.grid.x == 0 || cfg.grid.y == 0 ||
        cfg.grid.z == 0 || cfg.grid.x > 0x7fffffffu || cfg.grid.y > 65535 || cfg.grid.z > 65535) {
        fprintf(stderr, "cuda-emu: kernel %s launched with grid (%u,%u,%u) block (%u,%u,%u)\n",
                name, grid.x, grid.y, grid.z, block.x, block.y, block.z);
        last_error = cudaErrorInvalidConfiguration;
        return;
    }
    if (cfg.shared > 48 * 1024) {
        fprintf(stderr, "cuda-emu: kernel %s asks %zu bytes of dynamic shared memory\n", name,
                cfg.shared);
        last_error = cudaErrorInvalidValue;
        return;
    }
    enqueue(cfg.stream, [=]() {
        std::lock_guard<std::mutex> g(kernel_lock);

        if (B.stacks == NULL) {
            void *m = mmap(NULL, (size_t)MAX_THREADS * STACK_BYTES, PROT_READ | PROT_WRITE,
                           MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
            if (m == MAP_FAILED) {
                perror("cuda-emu: fiber stacks");
                abort();
            }
            B.stacks = (char *)m;
        }
        if (order_flip < 0) {
            const char *e = getenv("GANG_EMU_ORDER_FLIP");
            order_flip = e != NULL && strcmp(e, "1") == 0;
            e = getenv("GANG_EMU_SHARED_POISON");
            shared_poison = e == NULL || strcmp(e, "0") != 0;
            e = getenv("GANG_EMU_BLOCK_ORDER");
            block_order = e != NULL && strcmp(e, "ascending") == 0;
        }
        count_run(name);
        guard_install();
        running_kernel = name; /* for guard_report */
        unsigned long long t0 = gang_emu_now_ns();
        B.body = &body;
        B.name = name;
        B.n = (int)threads;
        gang_emu_grid_dim = grid;
        gang_emu_block_dim = block;
        /* every other run from the last block back (block_order) */
        const int down = block_order == 0 && (runs_done++ & 1);
        for (unsigned zi = 0; zi < grid.z; zi++)
            for (unsigned yi = 0; yi < grid.y; yi++)
                for (unsigned xi = 0; xi < grid.x; xi++) {
                    const unsigned x = down ? grid.x - 1 - xi : xi;
                    const unsigned y = down ? grid.y - 1 - yi : yi;
                    const unsigned z = down ? grid.z - 1 - zi : zi;

                    gang_emu_block_idx.x = x;
                    gang_emu_block_idx.y = y;
                    gang_emu_block_idx.z = z;
                    B.reverse = (int)((x + y + z) & 1) ^ order_flip;
                    B.serial++;
                    run_block();
                }
        running_kernel = NULL;
        gang_emu_kernel_hook hook = kernel_hook.load();
        if (hook != nullptr)
            hook(name, t0, gang_emu_now_ns(), grid, in_graph_replay);
    });
}

/* ------------------------------------------------------------------------------------
 * The runtime API the backend calls (cuda_runtime_api.h's declarations).
 * ------------------------------------------------------------------------------------ */
extern "C" {

cudaError_t cudaGetLastError(void)
{
    cudaError_t e = last_error;

    last_error = cudaSuccess;
    return e;
}

/* The errors the emulator returns: name and text (the runtime's own texts, marked). */
static const struct {
    cudaError_t code;
    const char *name, *text;
} emu_errors[] = {
    {cudaSuccess, "cudaSuccess", "no error (emulated)"},
    {cudaErrorInvalidValue, "cudaErrorInvalidValue", "invalid argument (emulated)"},
    {cudaErrorMemoryAllocation, "cudaErrorMemoryAllocation", "out of memory (emulated)"},
    {cudaErrorInvalidConfiguration, "cudaErrorInvalidConfiguration",
     "invalid configuration argument (emulated)"},
    {cudaErrorInvalidDevice, "cudaErrorInvalidDevice", "invalid device ordinal (emulated)"},
    {cudaErrorIllegalState, "cudaErrorIllegalState", "illegal state (emulated)"},
    {cudaErrorStreamCaptureUnsupported, "cudaErrorStreamCaptureUnsupported",
     "operation not permitted when stream is capturing (emulated)"},
    {cudaErrorStreamCaptureInvalidated, "cudaErrorStreamCaptureInvalidated",
     "operation failed due to a previous error during capture (emulated)"},
};

const char *cudaGetErrorString(cudaError_t e)
{
    for (auto &x : emu_errors)
        if (x.code == e)
            return x.text;
    return "unknown error (emulated)";
}

const char *cudaGetErrorName(cudaError_t e)
{
    for (auto &x : emu_errors)
        if (x.code == e)
            return x.name;
    return "cudaErrorUnknown";
}

cudaError_t cudaGetDeviceCount(int *count)
{
    *count = device_count();
    return cudaSuccess;
}

cudaError_t cudaSetDevice(int device)
{
    if (device < 0 || device >= device_count())
        return last_error = cudaErrorInvalidDevice;
    current_device = device;
    return cudaSuccess;
}

cudaError_t cudaGetDevice(int *device)
{
    *device = current_device;
    return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int device)
{
    if (device < 0 || device >= device_count())
        return last_error = cudaErrorInvalidDevice;
    memset(prop, 0, sizeof(*prop));
    snprintf(prop->name, sizeof(prop->name), "ganglion CUDA emulator");
    prop->totalGlobalMem = device_bytes();
    prop->sharedMemPerBlock = 48 * 1024;
    prop->warpSize = 32;
    prop->maxThreadsPerBlock = MAX_THREADS;
    prop->major = 9;
    prop->minor = 0;
    prop->multiProcessorCount = EMU_SMS;
    prop->pciBusID = device;
    return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int device)
{
    if (device < 0 || device >= device_count())
        return last_error = cudaErrorInvalidDevice;
    /* the ones the backend asks: an H200's 132 SMs, compute capability 9.0 */
    if (attr == cudaDevAttrMultiProcessorCount)
        *value = EMU_SMS;
    else if (attr == cudaDevAttrComputeCapabilityMajor)
        *value = 9;
    else
        return last_error = cudaErrorInvalidValue;
    return cudaSuccess;
}

cudaError_t cudaDeviceCanAccessPeer(int *can, int device, int peer)
{
    (void)device;
    (void)peer;
    *can = 0;
    return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t *free_b, size_t *total_b)
{
    std::lock_guard<std::mutex> g(mem_lock);

    *total_b = device_bytes();
    *free_b = *total_b - mem_used;
    return cudaSuccess;
}

cudaError_t cudaMalloc(void **p, size_t bytes)
{
    return emu_alloc(p, bytes, 0);
}

cudaError_t cudaFree(void *p)
{
    return emu_free(p, 0);
}

cudaError_t cudaMallocHost(void **p, size_t bytes)
{
    return emu_alloc(p, bytes, 1);
}

cudaError_t cudaFreeHost(void *p)
{
    return emu_free(p, 1);
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned int flags)
{
    emu_stream *st = new emu_stream();

    (void)flags;
    st->device = current_device;
    {
        std::lock_guard<std::mutex> g(streams_lock);
        live_streams.insert(st);
    }
    *s = reinterpret_cast<cudaStream_t>(st);
    return cudaSuccess;
}

cudaError_t cudaStreamQuery(cudaStream_t s)
{
    emu_stream *st = stream_of(s);

    if (st->capturing)
        return refuse_in_capture(st);
    std::lock_guard<std::mutex> g(pend_lock);
    return st->deferred.empty() && waits_prune(st->waits) ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int flags)
{
    emu_stream *st = stream_of(s);
    emu_event *ev = reinterpret_cast<emu_event *>(e);

    (void)flags;
    if (ev->capture != NULL && !st->capturing) {
        /* The event belongs to a capture: s joins it until that capture ends. */
        st->capturing = 1;
        st->joined = 1;
        st->capture_err = cudaSuccess;
        st->graph = ev->capture;
        return cudaSuccess;
    }
    if (!st->capturing) {
        /* what completed is dropped first: a stream that only waits (an NCCL stream of a
         * one-rank group, GANG_EMU_LAG_US's event marks) would otherwise gather every
         * event's waits, and its events pass them back */
        std::lock_guard<std::mutex> g(pend_lock);
        waits_prune(ev->waits);
        waits_prune(st->waits);
        waits_prune(st->deps);
        waits_add(st->waits, ev->waits);
        waits_add(st->deps, ev->waits);
    }
    return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t s)
{
    emu_stream *st = stream_of(s);

    if (st != &default_stream) {
        if (st->capturing && !st->joined) {
            capture_count(st->mode, -1);
            delete st->graph;
        }
        if (st->drainer.joinable()) { /* its deferred work first, as the device finishes it */
            stream_wait(st, "cudaStreamDestroy");
            {
                std::lock_guard<std::mutex> g(pend_lock);
                st->stop = true;
            }
            pend_cv.notify_all();
            st->drainer.join();
        }
        {
            std::lock_guard<std::mutex> g(streams_lock);
            live_streams.erase(st);
        }
        delete st;
    }
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t s)
{
    return sync_point(s);
}

/* FNV-1a of n bytes: what a pinned upload's source held when it was enqueued. */
static uint64_t bytes_hash(const void *p, size_t n)
{
    const unsigned char *b = (const unsigned char *)p;
    uint64_t h = 14695981039346656037ull;

    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

/* A copy while the device lags (GANG_EMU_LAG_US), as the device makes it: from pageable
 * host memory the bytes are taken at the call, into pageable memory the call returns once
 * the copy is done (the runtime's staging), and from pinned memory the copy reads it when
 * the stream gets there, which stops the process, naming the copy, when the host has
 * rewritten those bytes meanwhile: an upload from a staging buffer the host reused before
 * the device read it, wrong numbers on a GPU (checked up to 64 MiB). */
static cudaError_t lagged_copy(void *dst, const void *src, size_t count, cudaStream_t s)
{
    const int from = memory_kind(src), to = memory_kind(dst);

    if (from == 0) {
        auto bytes =
            std::make_shared<std::vector<char>>((const char *)src, (const char *)src + count);
        return enqueue(s, [=]() { memmove(dst, bytes->data(), count); });
    }
    if (to == 0) {
        enqueue(s, [=]() { memmove(dst, src, count); });
        stream_wait(stream_of(s), "a copy into pageable memory");
        return cudaSuccess;
    }
    if (from == 1 && count <= ((size_t)64 << 20)) {
        const uint64_t h = bytes_hash(src, count);

        return enqueue(s, [=]() {
            if (bytes_hash(src, count) != h) {
                fprintf(stderr,
                        "cuda-emu: the host rewrote %zu bytes of pinned memory at %p after "
                        "cudaMemcpyAsync was called on them and before the stream copied "
                        "them (GANG_EMU_LAG_US=%lld): on a device the copy takes the new bytes "
                        "or the old ones, as the timing falls\n",
                        count, src, lag_us());
                abort();
            }
            memmove(dst, src, count);
        });
    }
    return enqueue(s, [=]() { memmove(dst, src, count); });
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind,
                            cudaStream_t s)
{
    (void)kind;
    /* A copy from or into pageable memory is synchronous for the host, which a graph cannot
     * hold: refused inside a capture (cudaErrorStreamCaptureUnsupported, what the runtime
     * answers a synchronous call there), the capture invalidated, the stricter reading. */
    if (stream_of(s)->capturing && (memory_kind(src) == 0 || memory_kind(dst) == 0))
        return refuse_in_capture(stream_of(s));
    if (lag_us() > 0 && !stream_of(s)->capturing)
        return lagged_copy(dst, src, count, s);
    return enqueue(s, [=]() { memmove(dst, src, count); });
}

cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch,
                              size_t width, size_t height, enum cudaMemcpyKind kind, cudaStream_t s)
{
    (void)kind;
    if (width > dpitch || width > spitch)
        return last_error = cudaErrorInvalidValue;
    return enqueue(s, [=]() {
        for (size_t r = 0; r < height; r++)
            memmove((char *)dst + r * dpitch, (const char *)src + r * spitch, width);
    });
}

cudaError_t cudaMemsetAsync(void *dst, int value, size_t count, cudaStream_t s)
{
    return enqueue(s, [=]() { memset(dst, value, count); });
}

cudaError_t cudaEventCreate(cudaEvent_t *e)
{
    *e = reinterpret_cast<cudaEvent_t>(new emu_event());
    return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned int flags)
{
    (void)flags;
    return cudaEventCreate(e);
}

cudaError_t cudaEventDestroy(cudaEvent_t e)
{
    delete reinterpret_cast<emu_event *>(e);
    return cudaSuccess;
}

/* Not a wait: the event takes what its stream has pending (or its capture) with it. In a
 * capture it only marks the point another stream may join from (a fork or join of the
 * graph, as the runtime makes it: no node, so a graph outlives the events it was captured
 * with). */
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s)
{
    emu_event *ev = reinterpret_cast<emu_event *>(e);
    emu_stream *st = stream_of(s);

    if (st->capturing) {
        ev->capture = st->graph;
        return cudaSuccess;
    }
    std::lock_guard<std::mutex> g(pend_lock);
    waits_prune(st->waits);
    ev->capture = NULL;
    ev->waits = st->waits;
    if (!st->deferred.empty()) { /* it completes when the stream's thread reaches it */
        auto mark = std::make_shared<gang_emu_pending>();

        ev->waits.push_back(mark);
        defer(st, emu_waits(), [cell = ev->ms, mark]() {
            *cell = now_ms();
            gang_emu_pending_finish(*mark, 0);
        });
        return cudaSuccess;
    }
    *ev->ms = now_ms();
    return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t e)
{
    emu_event *ev = reinterpret_cast<emu_event *>(e);

    if (unsafe_call_refused())
        return last_error = cudaErrorStreamCaptureUnsupported;
    waits_wait(ev->waits, "cudaEventSynchronize");
    return cudaSuccess;
}

/* cudaSuccess once what the event took with it completed (not a wait). */
cudaError_t cudaEventQuery(cudaEvent_t e)
{
    emu_event *ev = reinterpret_cast<emu_event *>(e);
    std::lock_guard<std::mutex> g(pend_lock);

    return waits_prune(ev->waits) ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end)
{
    *ms = (float)(*reinterpret_cast<emu_event *>(end)->ms -
                  *reinterpret_cast<emu_event *>(start)->ms);
    return cudaSuccess;
}

cudaError_t cudaStreamBeginCapture(cudaStream_t s, enum cudaStreamCaptureMode mode)
{
    emu_stream *st = stream_of(s);

    if (st == &default_stream || st->capturing)
        return last_error = cudaErrorIllegalState;
    st->capturing = 1;
    st->mode = mode;
    st->capture_err = cudaSuccess;
    st->graph = new emu_graph();
    capture_count(mode, 1);
    return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *graph)
{
    emu_stream *st = stream_of(s);
    cudaError_t e;

    if (!st->capturing)
        return last_error = cudaErrorIllegalState;
    st->capturing = 0;
    capture_count(st->mode, -1);
    e = st->capture_err;
    {
        /* The streams that joined this capture leave it (their errors are its errors). */
        std::lock_guard<std::mutex> g(streams_lock);
        for (emu_stream *o : live_streams)
            if (o->joined && o->graph == st->graph) {
                if (o->capture_err != cudaSuccess)
                    e = o->capture_err;
                o->capturing = 0;
                o->joined = 0;
                o->graph = NULL;
            }
    }
    /* GANG_EMU_CAPTURE_FAIL=D: every capture ended on device D fails, as one that met a
     * call the runtime cannot capture would (tests: one rank's capture fails, its peers'
     * do not). */
    if (e == cudaSuccess && gang_emu_env_names_device("GANG_EMU_CAPTURE_FAIL"))
        e = cudaErrorStreamCaptureUnsupported;
    if (e != cudaSuccess) {
        delete st->graph;
        st->graph = NULL;
        *graph = NULL;
        return last_error = cudaErrorStreamCaptureInvalidated;
    }
    *graph = reinterpret_cast<cudaGraph_t>(st->graph);
    st->graph = NULL;
    return cudaSuccess;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t *exec, cudaGraph_t graph, unsigned long long flags)
{
    (void)flags;
    if (graph == NULL)
        return last_error = cudaErrorInvalidValue;
    *exec = reinterpret_cast<cudaGraphExec_t>(new emu_graph(*reinterpret_cast<emu_graph *>(graph)));
    return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t graph)
{
    delete reinterpret_cast<emu_graph *>(graph);
    return cudaSuccess;
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec)
{
    delete reinterpret_cast<emu_graph *>(exec);
    return cudaSuccess;
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t s)
{
    emu_graph *g = reinterpret_cast<emu_graph *>(exec);

    if (g == NULL)
        return last_error = cudaErrorInvalidValue;
    /* Node by node: a collective posts its pending operation, after which the graph's later
     * nodes wait for it (deferred to the stream's thread, as a device runs ahead); the rest
     * runs at once when nothing is pending. Each node is copied into the stream's work, so
     * a graph destroyed while its replay is deferred (a gang aborted) is not read again. */
    for (auto &n : g->ops) {
        if (n.post) {
            stream_post(s, n.post, true);
        } else {
            std::function<void()> op = n.op;

            enqueue(s, [op]() {
                in_graph_replay = 1;
                op();
                in_graph_replay = 0;
            });
        }
    }
    return cudaSuccess;
}

} /* extern "C" */

/* ------------------------------------------------------------------------------------
 * For the NCCL emulator (emu-sync.h).
 * ------------------------------------------------------------------------------------ */
std::shared_ptr<gang_emu_pending>
gang_emu_stream_post(cudaStream_t s, std::function<void(std::shared_ptr<gang_emu_pending>)> post)
{
    return stream_post(s, std::move(post), false);
}

void gang_emu_pending_finish(gang_emu_pending &p, int failed)
{
    {
        std::lock_guard<std::mutex> g(pend_lock);
        p.failed.store(failed);
        p.done.store(1);
    }
    pend_cv.notify_all();
    if (p.on_finish)
        p.on_finish(failed);
}

int gang_emu_stream_capturing(cudaStream_t s)
{
    return stream_of(s)->capturing;
}

cudaError_t gang_emu_stream_run(cudaStream_t s, std::function<void()> op)
{
    return enqueue(s, std::move(op));
}

void gang_emu_set_lag_us(long long us)
{
    lag_setting.store(us < 0 ? 0 : us);
}

int gang_emu_current_device()
{
    return current_device;
}

int gang_emu_env_names_device(const char *var)
{
    const char *v = getenv(var);
    char *end;
    long d;

    if (v == NULL || *v == '\0')
        return 0;
    d = strtol(v, &end, 10);
    return *end == '\0' && d == current_device;
}

long long gang_emu_wait_ms()
{
    static const long long ms = []() {
        const char *e = getenv("GANG_EMU_WAIT_MS");

        return e != NULL && atoll(e) > 0 ? atoll(e) : 120000LL;
    }();

    return ms;
}
