/*
 * The CUDA emulator's own tests (tests/cuda-emu/, issue #24): that it runs CUDA C the way
 * the device does where the backend's kernels depend on it (thread and block coordinates,
 * __syncthreads, the three shuffles, graph capture and replay, launch limits), that it
 * stops, naming the kernel, where a device would hang or read garbage (a shuffle under a
 * divergent branch, a shuffle reading a lane that has exited, a kernel given a host
 * pointer, a 16-byte load the kernels' vec_load16 makes at an address that is not a multiple
 * of 16), that a missing
 * __syncthreads shows as stale reads in one of two neighbouring blocks, that a block's
 * shared memory starts poisoned, not with the block before's values, and that two runs of a
 * grid take its blocks in opposite orders; that with a lag the device runs behind the host
 * as a GPU does, and a pinned upload's source rewritten too early stops it; that fresh
 * device memory reads as 0xff bytes, not zeros; and the pending
 * operations the NCCL emulator builds on (emu-sync.h): a stream that waited for an event
 * recorded after one is not ready, and its next kernel runs only once another thread
 * completed it; a stream that waits for an event of a capture joins the capture. Compiled
 * only for the emulator (rewrite-launch.py, then the host compiler), never by nvcc.
 */
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

extern "C" { /* cmocka.h has no C++ guard of its own */
#include <cmocka.h>
}

#include "cuda-vec.h"
#include "emu-sync.h"

/* n bytes of device memory (the emulator aborts on a kernel given host memory). */
static void *dev_alloc(size_t n)
{
    void *p = NULL;

    assert_int_equal(cudaMalloc(&p, n), cudaSuccess);
    return p;
}

/* Sum of v over the block of 256 threads, through warp shuffles and shared memory. */
__device__ static float block_sum(float v)
{
    __shared__ float part[8];
    int t = threadIdx.y * blockDim.x + threadIdx.x;

    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    if (t % 32 == 0)
        part[t / 32] = v;
    __syncthreads();
    v = t < 8 ? part[t] : 0.0f;
    if (t < 32)
        for (int o = 16; o > 0; o >>= 1)
            v += __shfl_xor_sync(0xffffffffu, v, o);
    __syncthreads(); /* part is read before the next call writes it */
    return v;
}

/* out[block] = sum of x over the block's n elements; out_tid[global thread] = its flat id. */
__global__ static void sum_kernel(const float *x, size_t n, float *out, int *out_tid)
{
    int t = threadIdx.y * blockDim.x + threadIdx.x;
    size_t b = blockIdx.y * gridDim.x + blockIdx.x;
    float acc = 0.0f;

    for (size_t i = (size_t)t; i < n; i += 256)
        acc += x[b * n + i];
    acc = block_sum(acc);
    if (t == 0)
        out[b] = acc;
    out_tid[b * 256 + (size_t)t] = t;
}

/* The three shuffles over a width of 16: each lane's results for lane value l = lane. */
__global__ static void shfl_kernel(int *out)
{
    int lane = threadIdx.x;

    out[lane * 3 + 0] = __shfl_xor_sync(0xffffffffu, lane, 5, 16);
    out[lane * 3 + 1] = __shfl_sync(0xffffffffu, lane * 10, 3, 16);
    out[lane * 3 + 2] = __shfl_down_sync(0xffffffffu, lane, 4, 16);
}

/* A shuffle that half the warp never reaches: they wait at the barrier instead. */
__global__ static void divergent_kernel(float *out)
{
    float v = (float)threadIdx.x;

    if (threadIdx.x < 16)
        v = __shfl_xor_sync(0xffffffffu, v, 1);
    __syncthreads();
    out[threadIdx.x] = v;
}

/* Lanes 16..31 return; 0..15 then read them. */
__global__ static void exited_lane_kernel(float *out)
{
    float v = (float)threadIdx.x;

    if (threadIdx.x >= 16)
        return;
    out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, v, 16);
}

/* Each thread writes its slot and reads its neighbour's without a __syncthreads between:
 * a race. out[block * 64 + t] = what thread t read. */
__global__ static void racy_kernel(int *out)
{
    __shared__ int slot[64];
    int t = threadIdx.x;

    slot[t] = 1000 * (int)blockIdx.x + t + 1;
    out[blockIdx.x * 64 + t] = slot[(t + 1) % 64];
    __syncthreads();
    slot[t] = 0; /* the next block's threads start from a cleared array */
}

/* Block 0's threads each write their slot, block 1's only the even ones; after the barrier
 * out[block * 64 + t] = slot t: what block 1 never wrote is the emulator's poison (0xff
 * bytes), not block 0's values, which a static array would have kept. */
__global__ static void unwritten_kernel(int *out)
{
    __shared__ int slot[64];
    int t = threadIdx.x;

    if (blockIdx.x == 0 || t % 2 == 0)
        slot[t] = 1000 * (int)blockIdx.x + t + 1;
    __syncthreads();
    out[blockIdx.x * 64 + t] = slot[t];
}

/* Thread 0 of each block appends the block's index to log (at *n): the order the blocks
 * ran in, which the device does not fix. */
__global__ static void order_kernel(int *log, int *n)
{
    if (threadIdx.x == 0)
        log[(*n)++] = (int)blockIdx.x;
}

/* x[i] = i for i < n. */
__global__ static void fill_kernel(float *x, size_t n)
{
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;

    if (i < n)
        x[i] = (float)i;
}

__global__ static void scale_kernel(float *x, float a, size_t n)
{
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;

    if (i < n)
        x[i] *= a;
}

/* out[t] = the sum of the 8 bf16 elements of one 16-byte load at w + 8 t + skew. */
__global__ static void load16_kernel(const __nv_bfloat16 *w, int skew, float *out)
{
    float f[8], sum = 0.0f;

    vec_io<__nv_bfloat16>::load(w + 8 * threadIdx.x + skew, f);
    for (int i = 0; i < 8; i++)
        sum += f[i];
    out[threadIdx.x] = sum;
}

static void test_coordinates_and_reduction(void **state)
{
    const size_t n = 1000, blocks = 6;
    float *x, *out;
    int *tid;

    (void)state;
    assert_int_equal(cudaMalloc((void **)&x, blocks * n * sizeof(float)), cudaSuccess);
    assert_int_equal(cudaMalloc((void **)&out, blocks * sizeof(float)), cudaSuccess);
    assert_int_equal(cudaMalloc((void **)&tid, blocks * 256 * sizeof(int)), cudaSuccess);
    for (size_t i = 0; i < blocks * n; i++)
        x[i] = (float)(i % 7) + (float)(i / n);
    /* a 2-D grid of 2-D blocks: 3 x 2 blocks of 16 x 16 threads */
    sum_kernel<<<dim3(3, 2), dim3(16, 16)>>>(x, n, out, tid);
    assert_int_equal(cudaGetLastError(), cudaSuccess);
    for (size_t b = 0; b < blocks; b++) {
        double want = 0.0;

        for (size_t i = 0; i < n; i++)
            want += x[b * n + i];
        assert_float_equal(out[b], want, 1e-3 * want);
        for (int t = 0; t < 256; t++)
            assert_int_equal(tid[b * 256 + (size_t)t], t);
    }
    cudaFree(x);
    cudaFree(out);
    cudaFree(tid);
}

static void test_shuffles(void **state)
{
    int *out = (int *)dev_alloc(32 * 3 * sizeof(int));

    (void)state;
    shfl_kernel<<<1, 32>>>(out);
    assert_int_equal(cudaGetLastError(), cudaSuccess);
    for (int l = 0; l < 32; l++) {
        int base = l / 16 * 16;

        assert_int_equal(out[l * 3 + 0], base + ((l % 16) ^ 5));
        assert_int_equal(out[l * 3 + 1], (base + 3) * 10);
        assert_int_equal(out[l * 3 + 2],
                         l % 16 + 4 < 16 ? l + 4 : l); /* own value past the group */
    }
}

/* Runs fn in a child; the child must die of SIGABRT and say want on stderr. */
static void expect_abort(void (*fn)(void), const char *want)
{
    int fds[2], status;
    char buf[8192];
    size_t got = 0;
    ssize_t r;
    pid_t pid;

    assert_int_equal(pipe(fds), 0);
    pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        dup2(fds[1], 2);
        close(fds[0]);
        fn();
        _exit(0); /* not reached when the emulator stops it */
    }
    close(fds[1]);
    while (got + 1 < sizeof(buf) && (r = read(fds[0], buf + got, sizeof(buf) - 1 - got)) > 0)
        got += (size_t)r;
    buf[got] = '\0';
    close(fds[0]);
    assert_int_equal(waitpid(pid, &status, 0), pid);
    if (!WIFSIGNALED(status) || WTERMSIG(status) != SIGABRT || strstr(buf, want) == NULL) {
        print_message("child status %d, stderr:\n%s\n(wanted SIGABRT and \"%s\")\n", status, buf,
                      want);
        fail();
    }
}

static void run_divergent(void)
{
    float *out;

    if (cudaMalloc((void **)&out, 64 * sizeof(float)) != cudaSuccess)
        return;
    divergent_kernel<<<1, 64>>>(out);
}

static void run_exited_lane(void)
{
    float *out;

    if (cudaMalloc((void **)&out, 32 * sizeof(float)) != cudaSuccess)
        return;
    exited_lane_kernel<<<1, 32>>>(out);
}

static void run_host_pointer(void)
{
    float x[4] = {1, 2, 3, 4};

    scale_kernel<<<1, 4>>>(x, 2.0f, 4);
}

static void run_misaligned_load(void)
{
    __nv_bfloat16 *w;
    float *out;

    if (cudaMalloc((void **)&w, 40 * sizeof(*w)) != cudaSuccess ||
        cudaMalloc((void **)&out, 4 * sizeof(float)) != cudaSuccess)
        return;
    load16_kernel<<<1, 4>>>(w, 1, out); /* 2 bytes past a 16-byte boundary */
}

/* Aligned, the loads read the elements (the check passes what the device reads); one
 * element off, the emulator stops where the device would fault. */
static void test_misaligned_load_stops(void **state)
{
    __nv_bfloat16 *w = (__nv_bfloat16 *)dev_alloc(32 * sizeof(__nv_bfloat16));
    float *out = (float *)dev_alloc(4 * sizeof(float));

    (void)state;
    for (int i = 0; i < 32; i++)
        w[i] = __float2bfloat16_rn((float)i);
    load16_kernel<<<1, 4>>>(w, 0, out);
    assert_int_equal(cudaGetLastError(), cudaSuccess);
    for (int t = 0; t < 4; t++)
        assert_float_equal(out[t], 64.0f * t + 28.0f, 0.0f);
    cudaFree(w);
    cudaFree(out);
    expect_abort(run_misaligned_load, "kernel load16_kernel, block (0,0,0): vec_load16 at 0x");
}

static void test_divergent_shuffle_stops(void **state)
{
    (void)state;
    expect_abort(run_divergent, "kernel divergent_kernel, block (0,0,0): deadlock");
}

static void test_exited_lane_stops(void **state)
{
    (void)state;
    expect_abort(run_exited_lane, "a lane that exited before depositing");
}

static void test_host_pointer_stops(void **state)
{
    (void)state;
    expect_abort(run_host_pointer, "kernel scale_kernel, argument 0: ");
}

/* The two orders of neighbouring blocks show the missing barrier differently: in the
 * ascending one threads 0..62 read a slot not yet written, in the descending one thread 63
 * does (slot 0); the ordered reads of the one are the stale reads of the other. */
static void test_race_shows(void **state)
{
    int *out = (int *)dev_alloc(2 * 64 * sizeof(int)), stale[2] = {0, 0};

    (void)state;
    racy_kernel<<<2, 64>>>(out);
    assert_int_equal(cudaGetLastError(), cudaSuccess);
    for (int b = 0; b < 2; b++)
        for (int t = 0; t < 64; t++)
            stale[b] += out[b * 64 + t] != 1000 * b + (t + 1) % 64 + 1;
    print_message("racy_kernel: stale reads in block 0: %d, block 1: %d\n", stale[0], stale[1]);
    assert_true(stale[0] != stale[1]);
    assert_int_equal(stale[0] + stale[1], 64);
    cudaFree(out);
}

/* A block's __shared__ arrays start poisoned (0xff bytes) whatever the block before wrote,
 * and only once per block: block 0 reads back every slot its threads wrote, though every
 * thread after the first reaches the declaration after the first thread's write. */
static void test_shared_starts_poisoned(void **state)
{
    int *out = (int *)dev_alloc(2 * 64 * sizeof(int));

    (void)state;
    unwritten_kernel<<<2, 64>>>(out);
    assert_int_equal(cudaGetLastError(), cudaSuccess);
    for (int t = 0; t < 64; t++) {
        assert_int_equal(out[t], t + 1);
        assert_int_equal(out[64 + t], t % 2 == 0 ? 1000 + t + 1 : -1);
    }
    cudaFree(out);
}

/* Two runs of a grid take its blocks in opposite orders (a block that reads another's
 * writes sees them in one run and not in the other); each block runs once in each. */
static void test_block_order_alternates(void **state)
{
    int *log = (int *)dev_alloc(2 * 3 * sizeof(int)), *n = (int *)dev_alloc(sizeof(int));
    int in_order = 0;

    (void)state;
    *n = 0;
    order_kernel<<<3, 32>>>(log, n);
    order_kernel<<<3, 32>>>(log, n);
    assert_int_equal(cudaGetLastError(), cudaSuccess);
    assert_int_equal(*n, 6);
    for (int r = 0; r < 2; r++) {
        int seen = 0;

        for (int i = 0; i < 3; i++)
            seen |= 1 << log[3 * r + i];
        assert_int_equal(seen, 7);
    }
    for (int i = 0; i < 3; i++)
        in_order += log[i] == log[3 + i];
    print_message("blocks ran %d %d %d, then %d %d %d\n", log[0], log[1], log[2], log[3], log[4],
                  log[5]);
    assert_int_equal(in_order, 1); /* the middle block only */
    cudaFree(log);
    cudaFree(n);
}

static void run_pinned_rewrite(void)
{
    float *host, *dev;
    cudaStream_t s; /* a stream of the child's own: the default one's thread was the parent's */

    if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess ||
        cudaMallocHost((void **)&host, 64 * sizeof(float)) != cudaSuccess ||
        cudaMalloc((void **)&dev, 64 * sizeof(float)) != cudaSuccess)
        return;
    for (int i = 0; i < 64; i++)
        host[i] = (float)i;
    cudaMemcpyAsync(dev, host, 64 * sizeof(float), cudaMemcpyHostToDevice, s);
    host[5] = -1.0f; /* reused before the stream read it */
    cudaStreamSynchronize(s);
}

/* With a lag (GANG_EMU_LAG_US) the device runs behind the host: a kernel's writes show only
 * after a synchronisation, an upload from pageable memory takes the bytes of the call, a
 * download into pageable memory has them when the call returns, and the host rewriting
 * pinned memory an upload has not read yet stops the process, naming it. */
static void test_lag_runs_behind(void **state)
{
    float *x = (float *)dev_alloc(64 * sizeof(float)), *y = (float *)dev_alloc(64 * sizeof(float));
    float page[64], back[64];

    (void)state;
    memset(x, 0, 64 * sizeof(float));
    gang_emu_set_lag_us(20000);
    fill_kernel<<<1, 64>>>(x, 64);
    assert_int_equal(cudaGetLastError(), cudaSuccess);
    assert_int_equal(cudaStreamQuery(0), cudaErrorNotReady);
    assert_float_equal(x[63], 0.0f, 0.0f); /* not run yet */
    assert_int_equal(cudaStreamSynchronize(0), cudaSuccess);
    assert_float_equal(x[63], 63.0f, 0.0f);
    for (int i = 0; i < 64; i++)
        page[i] = 2.0f * i;
    assert_int_equal(cudaMemcpyAsync(y, page, sizeof(page), cudaMemcpyHostToDevice, 0),
                     cudaSuccess);
    page[7] = -1.0f; /* pageable: the call took the bytes */
    assert_int_equal(cudaMemcpyAsync(back, y, sizeof(back), cudaMemcpyDeviceToHost, 0),
                     cudaSuccess);
    assert_float_equal(back[7], 14.0f, 0.0f); /* pageable: done when the call returns */
    expect_abort(run_pinned_rewrite, "the host rewrote 256 bytes of pinned memory");
    gang_emu_set_lag_us(0);
    cudaFree(x);
    cudaFree(y);
}

/* Fresh device memory reads 0xff bytes (a NaN as float) until written, past the poison
 * file's 16 MiB chunks too; what is written stays. */
static void test_fresh_memory_poisoned(void **state)
{
    const size_t n = (size_t)40 << 20;
    unsigned char *d = (unsigned char *)dev_alloc(n);
    float f;

    (void)state;
    for (size_t at = 0; at < n; at += 4093)
        assert_int_equal(d[at], 0xff);
    memcpy(&f, d + n - 4, sizeof(f));
    assert_true(isnan(f));
    d[17u << 20] = 7;
    assert_int_equal(d[17u << 20], 7);
    assert_int_equal(d[(17u << 20) + 1], 0xff);
    cudaFree(d);
    d = (unsigned char *)dev_alloc(n); /* a new allocation is fresh again */
    assert_int_equal(d[17u << 20], 0xff);
    cudaFree(d);
}

static void run_overrun(void)
{
    float *x;

    if (cudaMalloc((void **)&x, 1000 * sizeof(float)) != cudaSuccess)
        return;
    fill_kernel<<<5, 256>>>(x, 1025); /* element 1024: past the 256-byte-aligned end */
    cudaStreamSynchronize(0);
}

static void run_slack_write(void)
{
    float *x;

    if (cudaMalloc((void **)&x, 1000 * sizeof(float)) != cudaSuccess)
        return;
    fill_kernel<<<4, 256>>>(x, 1010); /* ten elements into the alignment's slack */
    cudaStreamSynchronize(0);
    cudaFree(x);
}

static void run_host_underrun(void)
{
    volatile unsigned char *d;

    if (cudaMalloc((void **)&d, 4096) != cudaSuccess)
        return;
    (void)d[-3];
}

/* A device allocation lies between guard pages: an access past its end (beyond CUDA's
 * 256-byte alignment) or before its start stops the process, naming the kernel, its block
 * and the distance; a write into the alignment's slack is found at cudaFree. Inside the
 * allocation, every byte up to its end can be written. */
static void test_guard_pages_stop_overruns(void **state)
{
    float *x = (float *)dev_alloc(1000 * sizeof(float));

    (void)state;
    fill_kernel<<<4, 256>>>(x, 1000);
    assert_int_equal(cudaStreamSynchronize(0), cudaSuccess);
    assert_float_equal(x[999], 999.0f, 0.0f);
    assert_int_equal(cudaFree(x), cudaSuccess);
    expect_abort(run_overrun, "kernel fill_kernel, block (4,0,0), thread 0: an access 96 bytes "
                              "past the end of a device allocation of 4000 bytes");
    expect_abort(run_slack_write, "something wrote 40 bytes of the slack after its end (the "
                                  "first at end + 0) and 0 before its start");
    expect_abort(run_host_underrun, "outside a kernel (a copy, a memset or the host): an access "
                                    "3 bytes before the start of a device allocation of 4096");
}

static void test_launch_limits(void **state)
{
    float *x = (float *)dev_alloc(4 * sizeof(float));

    (void)state;
    for (int i = 0; i < 4; i++)
        x[i] = (float)(i + 1);
    scale_kernel<<<1, 2048>>>(x, 2.0f, 4);
    assert_int_equal(cudaGetLastError(), cudaErrorInvalidConfiguration);
    scale_kernel<<<dim3(1, 70000), 32>>>(x, 2.0f, 4);
    assert_int_equal(cudaGetLastError(), cudaErrorInvalidConfiguration);
    assert_float_equal(x[3], 4.0f, 0.0f);              /* neither ran */
    assert_int_equal(cudaGetLastError(), cudaSuccess); /* the error was taken */
}

/*
 * A captured graph replays its operations on the buffers' contents at replay time, not at
 * capture; a synchronisation inside the capture invalidates it; an allocation inside it
 * fails.
 */
static void test_graph_capture(void **state)
{
    const size_t n = 300;
    cudaStream_t s;
    cudaGraph_t g;
    cudaGraphExec_t exec;
    float *host, *dev, *back;
    void *p;

    (void)state;
    assert_int_equal(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    assert_int_equal(cudaMallocHost((void **)&host, n * sizeof(float)), cudaSuccess);
    assert_int_equal(cudaMallocHost((void **)&back, n * sizeof(float)), cudaSuccess);
    assert_int_equal(cudaMalloc((void **)&dev, n * sizeof(float)), cudaSuccess);
    for (size_t i = 0; i < n; i++)
        host[i] = 1.0f;
    assert_int_equal(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    assert_int_equal(cudaMemcpyAsync(dev, host, n * sizeof(float), cudaMemcpyHostToDevice, s),
                     cudaSuccess);
    scale_kernel<<<(unsigned)((n + 127) / 128), 128, 0, s>>>(dev, 3.0f, n);
    assert_int_equal(cudaMemcpyAsync(back, dev, n * sizeof(float), cudaMemcpyDeviceToHost, s),
                     cudaSuccess);
    assert_int_equal(cudaMalloc(&p, 64), cudaErrorStreamCaptureUnsupported);
    assert_int_equal(cudaStreamEndCapture(s, &g), cudaSuccess);
    assert_float_equal(back[0], 0.0f, 0.0f); /* recorded, not run */
    assert_int_equal(cudaGraphInstantiate(&exec, g, 0), cudaSuccess);
    for (size_t i = 0; i < n; i++)
        host[i] = (float)i; /* the replay reads this, not the 1.0 of capture time */
    assert_int_equal(cudaGraphLaunch(exec, s), cudaSuccess);
    assert_int_equal(cudaStreamSynchronize(s), cudaSuccess);
    for (size_t i = 0; i < n; i++)
        assert_float_equal(back[i], 3.0f * (float)i, 0.0f);
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(g);

    assert_int_equal(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    scale_kernel<<<1, 128, 0, s>>>(dev, 3.0f, n);
    assert_int_equal(cudaStreamSynchronize(s), cudaErrorStreamCaptureUnsupported);
    assert_int_equal(cudaStreamEndCapture(s, &g), cudaErrorStreamCaptureInvalidated);
    cudaGetLastError();

    /* a copy from pageable memory (synchronous for the host) is refused in a capture */
    float page[4] = {1, 2, 3, 4};

    assert_int_equal(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    assert_int_equal(cudaMemcpyAsync(dev, page, sizeof(page), cudaMemcpyHostToDevice, s),
                     cudaErrorStreamCaptureUnsupported);
    assert_int_equal(cudaStreamEndCapture(s, &g), cudaErrorStreamCaptureInvalidated);
    cudaGetLastError();
    cudaFree(dev);
    cudaFreeHost(host);
    cudaFreeHost(back);
    cudaStreamDestroy(s);
}

/* Completes a pending operation after 200 ms, from another thread (a peer rank). */
static void *finish_later(void *arg)
{
    usleep(200 * 1000);
    gang_emu_pending_finish(*(gang_emu_pending *)arg, 0);
    return NULL;
}

static void test_pending_and_join(void **state)
{
    cudaStream_t a, b, c;
    cudaEvent_t ev, ev2;
    cudaGraph_t g;
    cudaGraphExec_t exec;
    float *dev = (float *)dev_alloc(128 * sizeof(float)), back[128];
    pthread_t th;

    (void)state;
    assert_int_equal(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking), cudaSuccess);
    assert_int_equal(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking), cudaSuccess);
    assert_int_equal(cudaStreamCreateWithFlags(&c, cudaStreamNonBlocking), cudaSuccess);
    assert_int_equal(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), cudaSuccess);
    assert_int_equal(cudaEventCreateWithFlags(&ev2, cudaEventDisableTiming), cudaSuccess);
    assert_int_equal(cudaMemsetAsync(dev, 0, 128 * sizeof(float), b), cudaSuccess);
    std::shared_ptr<gang_emu_pending> p =
        gang_emu_stream_post(a, [](std::shared_ptr<gang_emu_pending>) {});
    assert_int_equal(cudaStreamQuery(a), cudaErrorNotReady);
    assert_int_equal(cudaEventRecord(ev, a), cudaSuccess); /* no wait */
    assert_int_equal(cudaStreamQuery(b), cudaSuccess);
    assert_int_equal(cudaStreamWaitEvent(b, ev, 0), cudaSuccess);
    assert_int_equal(cudaStreamQuery(b), cudaErrorNotReady);
    assert_int_equal(pthread_create(&th, NULL, finish_later, p.get()), 0);
    /* Behind the operation, b runs ahead of the host as a GPU does: its kernel, an event and
     * a copy are deferred to b's thread, and the host goes on at once. */
    fill_kernel<<<1, 128, 0, b>>>(dev, 128);
    assert_int_equal(cudaEventRecord(ev2, b), cudaSuccess);
    back[5] = -1.0f;
    assert_int_equal(cudaMemcpyAsync(back, dev, sizeof(back), cudaMemcpyDeviceToHost, b),
                     cudaSuccess);
    assert_true(p->done.load() == 0); /* it completes 200 ms from now */
    assert_int_equal(cudaStreamQuery(b), cudaErrorNotReady);
    /* c's operation takes the kernel's output as its input (through ev2): posted from c's
     * thread once the kernel ran, not before */
    assert_int_equal(cudaStreamWaitEvent(c, ev2, 0), cudaSuccess);
    float seen = -1.0f;
    std::shared_ptr<gang_emu_pending> q =
        gang_emu_stream_post(c, [&seen, dev](std::shared_ptr<gang_emu_pending> me) {
            seen = dev[5];
            gang_emu_pending_finish(*me, 0);
        });
    assert_float_equal(seen, -1.0f, 0.0f); /* not posted yet */
    assert_int_equal(cudaStreamSynchronize(c), cudaSuccess);
    assert_true(p->done.load() == 1 && q->done.load() == 1);
    assert_float_equal(seen, 5.0f, 0.0f);
    assert_int_equal(cudaStreamSynchronize(b), cudaSuccess);
    assert_float_equal(back[5], 5.0f, 0.0f);
    pthread_join(th, NULL);
    assert_int_equal(cudaStreamQuery(a), cudaSuccess);
    assert_int_equal(cudaStreamQuery(b), cudaSuccess);

    /* b waits for an event recorded on a capturing stream: it joins the capture until the
     * capture ends, so its kernel is replayed, not run. */
    assert_int_equal(cudaMemsetAsync(dev, 0, 128 * sizeof(float), b), cudaSuccess);
    assert_int_equal(cudaStreamBeginCapture(a, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    assert_int_equal(cudaEventRecord(ev, a), cudaSuccess);
    assert_int_equal(cudaStreamWaitEvent(b, ev, 0), cudaSuccess);
    assert_int_equal(gang_emu_stream_capturing(b), 1);
    fill_kernel<<<1, 128, 0, b>>>(dev, 128);
    assert_int_equal(cudaEventRecord(ev, b), cudaSuccess);
    assert_int_equal(cudaStreamWaitEvent(a, ev, 0), cudaSuccess);
    assert_int_equal(cudaStreamEndCapture(a, &g), cudaSuccess);
    assert_int_equal(gang_emu_stream_capturing(b), 0);
    assert_int_equal(cudaMemcpyAsync(back, dev, sizeof(back), cudaMemcpyDeviceToHost, b),
                     cudaSuccess);
    assert_float_equal(back[5], 0.0f, 0.0f); /* recorded, not run */
    assert_int_equal(cudaGraphInstantiate(&exec, g, 0), cudaSuccess);
    assert_int_equal(cudaGraphLaunch(exec, a), cudaSuccess);
    assert_int_equal(cudaMemcpyAsync(back, dev, sizeof(back), cudaMemcpyDeviceToHost, a),
                     cudaSuccess);
    assert_float_equal(back[5], 5.0f, 0.0f);
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(g);
    cudaEventDestroy(ev);
    cudaEventDestroy(ev2);
    cudaStreamDestroy(a);
    cudaStreamDestroy(b);
    cudaStreamDestroy(c);
    cudaFree(dev);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_coordinates_and_reduction),
        cmocka_unit_test(test_shuffles),
        cmocka_unit_test(test_divergent_shuffle_stops),
        cmocka_unit_test(test_exited_lane_stops),
        cmocka_unit_test(test_host_pointer_stops),
        cmocka_unit_test(test_misaligned_load_stops),
        cmocka_unit_test(test_race_shows),
        cmocka_unit_test(test_shared_starts_poisoned),
        cmocka_unit_test(test_block_order_alternates),
        cmocka_unit_test(test_lag_runs_behind),
        cmocka_unit_test(test_fresh_memory_poisoned),
        cmocka_unit_test(test_guard_pages_stop_overruns),
        cmocka_unit_test(test_launch_limits),
        cmocka_unit_test(test_graph_capture),
        cmocka_unit_test(test_pending_and_join),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
