/*
 * The worker process's state, private to the launcher: launcher/worker.c (the agent
 * channel, generations, the data plane's lifetime) and launcher/worker-requests.c (rank
 * 0's intake of the agent's requests) share it. One per worker process, owned by its
 * main thread; nothing here is touched by the loader or the data thread.
 */
#ifndef GANGLION_LAUNCHER_WORKER_STATE_H
#define GANGLION_LAUNCHER_WORKER_STATE_H

#include <stdint.h>
#include <sys/types.h>

#include "wctl.h"
#include "worker.h"

#define WORKER_NO_RANK UINT32_MAX /* ERROR / HEARTBEAT rank before START gives one */

typedef struct gang__worker gang__worker;

struct gang__worker {
    gang_worker_config conf; /* derived once from the parameters (layout.c) */
    uint32_t local_rank;
    int node;                    /* node index, -1 when the agent did not say */
    pid_t ppid;                  /* the agent; a different parent means it is gone */
    int agent_fd;                /* SOCK_SEQPACKET to the agent, non-blocking */
    int ev_rd;                   /* events of the data thread (read end, non-blocking) */
    int ev_wr;                   /* handed to each data thread */
    uint64_t gen;                /* highest generation named by the agent */
    uint32_t state;              /* gang_rank_state reported in heartbeats */
    uint32_t rank;               /* global rank in gen, WORKER_NO_RANK when none */
    gang_bootstrap *boot;        /* rank 0's data-plane bootstrap (listener), NULL when none */
    uint64_t listen_gen;         /* the generation it was opened for */
    gang__wres *res;             /* model shard and engine, for the worker's whole life */
    gang__wgpu *gpu;             /* its GPU's placement and health watch, NULL when none */
    gang__wstep *step;           /* running data plane, NULL when none */
    uint64_t step_gen;           /* its generation */
    uint64_t next_hb_ms;         /* when the next heartbeat is due */
    struct gang__wpiece *pieces; /* prompts in assembly (rank 0, worker-requests.c) */
    uint32_t n_pieces;
    uint32_t piece_ids; /* ids those hold room for */
    int quit;           /* leave the loop with exit_code */
    int exit_code;
};

/*
 * Accepts the generation of an incoming message. Returns 0 when it is current or newer
 * (a newer one supersedes a data plane still running for an older generation, which is
 * torn down), or GANG_ESTALE after logging that it is ignored (worker.c).
 */
int gang__worker_fence(gang__worker *w, uint64_t gen, const char *what);
/* Sends a request message (TOKEN, DONE) to the agent; a channel error ends the worker
 * with exit code 75 (worker.c). */
void gang__worker_reply_req(gang__worker *w, const gang_req_msg *r);

/*
 * Acts on a request message of the agent (SUBMIT, PROMPT, CANCEL) that reached rank 0 of
 * node 0: queues it for the data thread of its generation, or drops it where none runs, or
 * refuses it with DONE and the reason (worker-requests.c).
 */
void gang__worker_on_req(gang__worker *w, const gang_req_msg *r);
/* Drops every prompt being assembled (their generation ended, or the worker stops). */
void gang__worker_drop_pieces(gang__worker *w);

#endif /* GANGLION_LAUNCHER_WORKER_STATE_H */
