/*
 * Helpers shared by the data-plane test binaries (test-layers, test-pipeline,
 * test-pipeline-mpi, test-engine, test-engine-cuda): a deterministic random source for
 * weights and inputs, and the communicators of one rank of a gang run as threads over the
 * socket backend.
 */
#ifndef GANGLION_TEST_UTIL_H
#define GANGLION_TEST_UTIL_H

#include <stddef.h>
#include <stdint.h>

#include "ganglion/comm.h"

/*
 * Uniform in [-1, 1) from xorshift64* on *state: the same sequence on every run and
 * platform, so a failing test fails the same way twice. *state must not be 0.
 */
float tu_rnd(uint64_t *state);

/*
 * One rank's communicators of a gang of n ranks run as threads: the world over the socket
 * backend from rank 0's blob (rank 0 passes its listener, which is consumed), then the TP
 * group (color = pp stage, key = tp rank) and the PP group (color = tp rank, key = pp
 * stage) for tp ranks per stage. Every call has timeout_ms. Returns 0 or the first
 * error; on error the communicators made so far are still in *world / *tpc / *ppc (NULL
 * otherwise) for the caller to free.
 */
int tu_gang_comms(uint32_t rank, uint32_t n, uint32_t tp, const char *blob, size_t blob_len,
                  gang_comm_listener *listener, uint64_t timeout_ms, gang_comm **world,
                  gang_comm **tpc, gang_comm **ppc);

#endif
