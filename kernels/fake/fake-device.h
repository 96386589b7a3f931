/*
 * Private to kernels/ and the tests: the fake device's counters and its address map
 * (kernels/fake/fake-backend.c). No production code path calls these.
 *
 * The fake device behaves like the "cuda" backend where the host/device boundary is
 * concerned: tensor memory is device memory the host cannot read, and every host wait
 * the "cuda" backend makes (sync, download, upload) is counted, so
 * a test can assert how often a code path waits on the host and where.
 */
#ifndef GANGLION_KERNELS_FAKE_DEVICE_H
#define GANGLION_KERNELS_FAKE_DEVICE_H

#include <stddef.h>
#include <stdint.h>

#include "ganglion/kernels.h"

/* What one fake handle did so far. */
typedef struct gang__fake_stats {
    uint64_t host_waits;    /* sync, download and upload (each waits on "cuda") */
    uint64_t gemms;         /* GEMMs enqueued */
    uint64_t waits_at_gemm; /* host_waits when the last GEMM was enqueued */
    uint64_t ops;           /* every enqueued operation, copies included */
} gang__fake_stats;

/* The counters of k; GANG_EINVAL when k is not a "fake" handle. */
int gang__fake_stats_get(gang_kernels *k, gang__fake_stats *out);

/* 1 when p lies in the fake device's address range (tensor memory), else 0. */
int gang__fake_is_device(const void *p);

/*
 * The host-side storage of bytes of fake device memory at p, for fake communicators that
 * move device buffers. Aborts the process with a message naming what when p is not fake
 * device memory (a host pointer handed to a device operation) or the range overruns it.
 */
void *gang__fake_resolve(const void *p, size_t bytes, const char *what);

#endif
