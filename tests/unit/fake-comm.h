/*
 * A device-memory communicator for the fake kernels device (test-fake-device.c): what the
 * nccl backend is to "cuda", for tests without a GPU. The ranks of a group are threads of
 * the test; the collectives sum and gather through one shared host buffer, reading and
 * writing the ranks' buffers through the fake device's address map, so a host pointer
 * handed to an operation aborts the test (gang__fake_resolve).
 *
 * It also counts, per rank, what the issue of host synchronisation is about: for every
 * all-reduce, how many host waits the rank's kernels handle made since its last GEMM
 * (the row-parallel GEMM whose output is being reduced), and whether the operation was
 * ordered after the handle's work at all (gang_comm_order_after, or a host wait).
 */
#ifndef GANG_TEST_FAKE_COMM_H
#define GANG_TEST_FAKE_COMM_H

#include <stdint.h>

#include "ganglion/comm.h"
#include "ganglion/kernels.h"

typedef struct fake_group fake_group;

/* What one rank's communicator saw. */
typedef struct fake_comm_counts {
    uint64_t all_reduces;   /* all-reduces run */
    uint64_t all_gathers;   /* all-gathers run */
    uint64_t ordered;       /* operations preceded by gang_comm_order_after */
    uint64_t waits_between; /* host waits between the last GEMM and each all-reduce, summed */
    uint64_t unordered;     /* operations with neither ordering nor a host wait: a race */
    uint64_t settles;       /* gang_comm_settle calls (the ordered communicator only) */
} fake_comm_counts;

/* A group of n ranks; freed with fake_group_free once every member is freed. */
fake_group *fake_group_new(uint32_t n);
void fake_group_free(fake_group *g);

/*
 * Rank `rank` of g as a gang_comm (backend reported as nccl, GANG_COMM_CAP_DEVICE_MEM),
 * whose buffers are device memory of the fake handle k. with_order 0 leaves out the
 * device ordering entry, so callers fall back to a host synchronisation (the negative
 * control of the count). Freed with gang_comm_free. NULL on allocation failure.
 */
gang_comm *fake_comm_new(fake_group *g, uint32_t rank, gang_kernels *k, int with_order);

/* The counts of a communicator from fake_comm_new. */
fake_comm_counts fake_comm_counts_of(gang_comm *c);

/*
 * Pairs for the device path of P/D KV transfers (launcher/worker-kv-pair.c), in the shape
 * of its gang__wkv_pair: fake_pair_blob makes a group of 2 named by a blob
 * ("fakepair:SLOT"), fake_pair_join hands rank `rank` of it out as a device-memory
 * communicator of k with send and recv (tags ignored, as nccl; a host pointer aborts).
 * The group goes with its last communicator. fake_pair_fail_sends(1) makes every send
 * fail (GANG_EPEER) without moving anything, so the receiver meets its deadline.
 * fake_pair_moved: the bytes received over pairs so far.
 */
int fake_pair_blob(void *ctx, uint8_t *blob, size_t cap, size_t *len);
int fake_pair_join(void *ctx, gang_kernels *k, const uint8_t *blob, size_t len, uint32_t rank,
                   uint64_t timeout_ms, gang_comm **out);
void fake_pair_fail_sends(int on);
uint64_t fake_pair_moved(void);

#endif
