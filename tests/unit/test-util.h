/*
 * Helpers shared by the data-plane test binaries (test-layers, test-pipeline,
 * test-pipeline-mpi, test-engine, test-engine-cuda): a deterministic random source for
 * weights and inputs, and the communicators of one rank of a gang run as threads over the
 * socket backend.
 */
#ifndef GANGLION_TEST_UTIL_H
#define GANGLION_TEST_UTIL_H

#include <pthread.h>
#include <stdatomic.h>
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

/*
 * A gang of rank threads over the socket backend, as the data-plane tests run it. The test
 * embeds a tu_gang in its run description; each rank thread brackets its body with
 * tu_gang_rank_enter / tu_gang_rank_leave; the main thread calls tu_gang_start, runs its
 * controller (if any) while the bodies run, then tu_gang_finish.
 */
typedef struct tu_gang {
    uint32_t n, tp; /* ranks, and TP ranks per pipeline stage */
    char blob[256]; /* rank 0's socket-backend blob */
    size_t blob_len;
    pthread_barrier_t ready; /* every rank initialised (or failed), plus main */
    atomic_int release;      /* with a controller: ranks keep their comms until it is set */
    int controlled;
} tu_gang;

/*
 * Rank side, first: forms this rank's world, TP and PP communicators (tu_gang_comms, 10 s
 * deadline; rank 0 passes its listener), publishes them into comms[] for a controller,
 * and waits until every rank and the main thread are there. Returns the formation's rc.
 */
int tu_gang_rank_enter(tu_gang *g, uint32_t rank, gang_comm_listener *listener,
                       gang_comm *_Atomic comms[3]);
/* Rank side, last: waits for the controller to release the gang, frees the comms. */
void tu_gang_rank_leave(tu_gang *g, gang_comm *_Atomic comms[3]);

/*
 * Main side: sets g up for n ranks (tp per stage), opens rank 0's listener into
 * *listener0, starts thread r on fn(ctxs + r * stride) and returns once every rank has
 * entered. The caller has filled the rank contexts before.
 */
void tu_gang_start(tu_gang *g, uint32_t n, uint32_t tp, int controlled,
                   gang_comm_listener **listener0, void *(*fn)(void *), void *ctxs, size_t stride,
                   pthread_t *th);
/* Main side: releases the ranks (after the controller), joins them, frees g's barrier. */
void tu_gang_finish(tu_gang *g, pthread_t *th);

#endif
