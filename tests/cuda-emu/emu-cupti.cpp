/*
 * The CUDA emulator's CUPTI (tests/cuda-emu/, issue #24): the part of the activity API
 * that kernels/cuda/cuda-trace.c calls, built as libcupti.so.13 beside the emulated cuBLAS
 * (found by the same search), so that kernel traces run end to end without a GPU.
 *
 * Enabling CONCURRENT_KERNEL (or KERNEL) sets the runtime's kernel hook (emu-sync.h):
 * every kernel that runs afterwards becomes a CUpti_ActivityKernel10 record (kind, start,
 * end, completed, grid, block, name, a graph id of 1 for a graph replay's nodes, a
 * correlation id), held until a buffer of EMU_BUFFER_RECORDS fills or a flush; then the
 * client's request callback gives a buffer, the records are packed into it back to back,
 * and the completion callback hands it back (from the flushing thread, or from the thread
 * that ran the kernel that filled it). cuptiActivityGetNextRecord walks that packing.
 * Timestamps are gang_emu_now_ns's, as the records'.
 *
 * Failures, for the tests: GANG_EMU_CUPTI_FAIL=enable makes cuptiActivityEnable answer
 * CUPTI_ERROR_NOT_INITIALIZED; GANG_EMU_CUPTI_DROP=N reports N dropped records at each
 * hand-back.
 */
#include <stdlib.h>
#include <string.h>

#include <mutex>
#include <vector>

#include <cupti.h>

#include "emu-sync.h"

#define EMU_BUFFER_RECORDS 4096

namespace
{
std::mutex lock; /* everything below */
CUpti_BuffersCallbackRequestFunc request_fn;
CUpti_BuffersCallbackCompleteFunc complete_fn;
std::vector<CUpti_ActivityKernel10> held;
uint32_t correlation;

const char *env_is(const char *var, const char *value)
{
    const char *v = getenv(var);

    return v != NULL && strcmp(v, value) == 0 ? v : NULL;
}

/* Packs recs into buffers from the client and hands each back (lock not held: the
 * client's completion callback takes its own lock, and may flush). */
void hand_back(std::vector<CUpti_ActivityKernel10> recs)
{
    CUpti_BuffersCallbackRequestFunc req;
    CUpti_BuffersCallbackCompleteFunc done;
    size_t i = 0;

    {
        std::lock_guard<std::mutex> g(lock);
        req = request_fn;
        done = complete_fn;
    }
    while (req != NULL && done != NULL && i < recs.size()) {
        uint8_t *buf = NULL;
        size_t size = 0, max_records = 0, valid = 0;

        req(&buf, &size, &max_records);
        if (buf == NULL || size < sizeof(CUpti_ActivityKernel10))
            abort(); /* the client gave no room: CUPTI would drop; the tests never do this */
        while (i < recs.size() && valid + sizeof(CUpti_ActivityKernel10) <= size &&
               (max_records == 0 || valid / sizeof(CUpti_ActivityKernel10) < max_records)) {
            memcpy(buf + valid, &recs[i++], sizeof(CUpti_ActivityKernel10));
            valid += sizeof(CUpti_ActivityKernel10);
        }
        done(NULL, 0, buf, size, valid);
    }
}

void on_kernel(const char *name, unsigned long long start, unsigned long long end, dim3 grid,
               int graph)
{
    CUpti_ActivityKernel10 k;
    std::vector<CUpti_ActivityKernel10> full;

    memset(&k, 0, sizeof(k));
    k.kind = CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL;
    k.start = start;
    k.end = end;
    k.completed = end;
    k.gridX = (int32_t)grid.x;
    k.gridY = (int32_t)grid.y;
    k.gridZ = (int32_t)grid.z;
    k.name = name;
    k.graphId = graph ? 1 : 0;
    {
        std::lock_guard<std::mutex> g(lock);
        k.correlationId = ++correlation;
        held.push_back(k);
        if (held.size() >= EMU_BUFFER_RECORDS)
            full.swap(held);
    }
    if (!full.empty())
        hand_back(std::move(full));
}
} // namespace

extern "C" {

CUptiResult CUPTIAPI cuptiActivityRegisterCallbacks(CUpti_BuffersCallbackRequestFunc request,
                                                    CUpti_BuffersCallbackCompleteFunc complete)
{
    if (request == NULL || complete == NULL)
        return CUPTI_ERROR_INVALID_PARAMETER;
    std::lock_guard<std::mutex> g(lock);
    request_fn = request;
    complete_fn = complete;
    return CUPTI_SUCCESS;
}

CUptiResult CUPTIAPI cuptiActivityEnable(CUpti_ActivityKind kind)
{
    if (env_is("GANG_EMU_CUPTI_FAIL", "enable"))
        return CUPTI_ERROR_NOT_INITIALIZED;
    if (kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL && kind != CUPTI_ACTIVITY_KIND_KERNEL)
        return CUPTI_ERROR_NOT_SUPPORTED;
    gang_emu_set_kernel_hook(on_kernel);
    return CUPTI_SUCCESS;
}

CUptiResult CUPTIAPI cuptiActivityFlushAll(uint32_t flag)
{
    std::vector<CUpti_ActivityKernel10> recs;

    (void)flag;
    {
        std::lock_guard<std::mutex> g(lock);
        recs.swap(held);
    }
    hand_back(std::move(recs));
    return CUPTI_SUCCESS;
}

CUptiResult CUPTIAPI cuptiActivityGetNextRecord(uint8_t *buffer, size_t valid,
                                                CUpti_Activity **record)
{
    uint8_t *next;

    if (buffer == NULL || record == NULL)
        return CUPTI_ERROR_INVALID_PARAMETER;
    next = *record == NULL ? buffer : (uint8_t *)*record + sizeof(CUpti_ActivityKernel10);
    if (next + sizeof(CUpti_ActivityKernel10) > buffer + valid)
        return CUPTI_ERROR_MAX_LIMIT_REACHED;
    *record = (CUpti_Activity *)next;
    return CUPTI_SUCCESS;
}

CUptiResult CUPTIAPI cuptiActivityGetNumDroppedRecords(CUcontext ctx, uint32_t stream,
                                                       size_t *dropped)
{
    const char *v = getenv("GANG_EMU_CUPTI_DROP");

    (void)ctx;
    (void)stream;
    if (dropped == NULL)
        return CUPTI_ERROR_INVALID_PARAMETER;
    *dropped = v != NULL ? (size_t)strtoull(v, NULL, 10) : 0;
    return CUPTI_SUCCESS;
}

CUptiResult CUPTIAPI cuptiGetTimestamp(uint64_t *timestamp)
{
    if (timestamp == NULL)
        return CUPTI_ERROR_INVALID_PARAMETER;
    *timestamp = gang_emu_now_ns();
    return CUPTI_SUCCESS;
}

CUptiResult CUPTIAPI cuptiGetResultString(CUptiResult result, const char **str)
{
    if (str == NULL)
        return CUPTI_ERROR_INVALID_PARAMETER;
    switch (result) {
    case CUPTI_SUCCESS:
        *str = "CUPTI_SUCCESS (emulated)";
        break;
    case CUPTI_ERROR_NOT_INITIALIZED:
        *str = "CUPTI_ERROR_NOT_INITIALIZED (emulated)";
        break;
    case CUPTI_ERROR_NOT_SUPPORTED:
        *str = "CUPTI_ERROR_NOT_SUPPORTED (emulated)";
        break;
    default:
        *str = "CUPTI error (emulated)";
        break;
    }
    return CUPTI_SUCCESS;
}

} /* extern "C" */
