/*
 * What the CUDA emulator's runtime (emu-runtime.cpp) offers the NCCL emulator
 * (emu-nccl.cpp), C++ on both sides (tests/cuda-emu/, issue #24).
 *
 * A pending operation is work of another library on a stream that completes when other
 * threads have done their part (a collective completes when every rank has posted it).
 * Streams are otherwise synchronous here; behind a pending operation they run ahead of the
 * host as on a device: the stream's later work, and the later work of every stream that
 * waited for an event recorded on it after the operation (cudaStreamWaitEvent), is
 * deferred to that stream's own thread, carried out in order once the operation
 * completed; cudaStreamQuery answers cudaErrorNotReady meanwhile; a synchronising call
 * waits for it. A wait longer than GANG_EMU_WAIT_MS (default 120000) stops the process
 * naming it: on a device that stream would never go on.
 */
#ifndef GANGLION_EMU_SYNC_H
#define GANGLION_EMU_SYNC_H

#include <atomic>
#include <functional>
#include <memory>

#include <cuda_runtime_api.h>

struct gang_emu_pending {
    std::atomic<int> done{0};
    std::atomic<int> failed{0}; /* completed by an abort rather than by the data */
    /* Called (failed as above) once it completed, where the operation is not on a stream
     * of this process: a rank of another process whose part the NCCL emulator's broker
     * posted (emu-nccl-link.cpp) learns so that its own operation completed. */
    std::function<void(int failed)> on_finish;
};

/* A new pending operation p at the end of stream s (s's later work waits for it), and
 * post(p) called once what s waits for through events (the operation's inputs) and the
 * work deferred on s before it are done: at once, or later from s's own thread, as a GPU
 * runs ahead of the host. s's earlier pending operations do not hold it (they complete in
 * their own order, as the library orders them: a group's receive does not hold its send).
 * On a capturing stream the post is a node of the graph instead, made at each replay (the
 * graph's later nodes waiting for it): NULL is returned. */
std::shared_ptr<gang_emu_pending>
gang_emu_stream_post(cudaStream_t s, std::function<void(std::shared_ptr<gang_emu_pending>)> post);

/* Completes p (failed: by an abort), wakes whatever waits for it and calls its on_finish. */
void gang_emu_pending_finish(gang_emu_pending &p, int failed);

/* 1 when s is being captured into a graph (its work is recorded, not run). */
int gang_emu_stream_capturing(cudaStream_t s);

/* Runs op on s as the runtime's own operations run: now, after what s waits for, or into
 * the graph s is capturing. */
cudaError_t gang_emu_stream_run(cudaStream_t s, std::function<void()> op);

/* Sets the device's lag behind the host (GANG_EMU_LAG_US, emu-runtime.cpp; 0: streams run
 * their work as it is enqueued), for the operations enqueued from then on. */
void gang_emu_set_lag_us(long long us);

/* The calling thread's current device (of GANG_EMU_DEVICES, default 1, at most 8). */
int gang_emu_current_device();

/* 1 when the environment variable var holds the calling thread's current device number
 * (the fault switches that pick one device: GANG_EMU_CAPTURE_FAIL=D, ...). */
int gang_emu_env_names_device(const char *var);

/* The longest the emulator waits for another library's operation before it stops the
 * process: GANG_EMU_WAIT_MS, default 120000 (read once). */
long long gang_emu_wait_ms();

/* The emulated CUPTI's view of the kernels (emu-cupti.cpp): hook, when set, is called after
 * each kernel ran, with its name (the launch's text, a static string), its interval on
 * gang_emu_now_ns's clock, its grid and 1 when it ran as a node of a graph replay. NULL
 * unsets it. */
typedef void (*gang_emu_kernel_hook)(const char *name, unsigned long long start_ns,
                                     unsigned long long end_ns, dim3 grid, int graph);
void gang_emu_set_kernel_hook(gang_emu_kernel_hook hook);
/* CLOCK_MONOTONIC in ns. */
unsigned long long gang_emu_now_ns();

#endif /* GANGLION_EMU_SYNC_H */
