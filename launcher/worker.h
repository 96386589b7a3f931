/*
 * The worker process: one per GPU (or CPU rank) on a node, spawned by the agent as
 *
 *   ganglion worker --agent-socket PATH --local-rank L --node-index N [--registered-flag V]
 *
 * It speaks the control protocol of wctl.h with its agent and, for every generation the
 * agent starts, joins the data plane of the gang. The data plane is an honest
 * PLACEHOLDER until the real communicator backends (parallel/) exist: a TCP star around
 * global rank 0 that runs a periodic integer "all-reduce" and checks its result, so that
 * peer loss, hangs and aborts behave exactly as they will with a real communicator.
 *
 * The first half of this header is the worker's entry point; the second half is internal
 * to launcher/worker.c, launcher/worker-step.c and the worker's unit test.
 */
#ifndef GANGLION_LAUNCHER_WORKER_H
#define GANGLION_LAUNCHER_WORKER_H

#include <stddef.h>
#include <stdint.h>

#include "ganglion/common.h"
#include "ganglion/rendezvous.h"

/*
 * Runs the worker until the agent says SHUTDOWN or the channel to the agent is lost.
 * argv[0] is the subcommand ("worker"); the rest are registered flags plus the worker-only
 * --agent-socket PATH and --local-rank L. Returns a process exit code: 0 after SHUTDOWN,
 * 75 (GANG_EXIT_TEMPFAIL) when the agent channel closes, fails or the agent process is
 * gone, 2 (GANG_EXIT_USAGE) for a usage error. Sets PR_SET_PDEATHSIG so that the worker
 * dies with the agent. Call it from a single-threaded process (it starts threads).
 */
int gang_worker_main(int argc, char **argv);

/* =================================================================================
 * Internal: the placeholder data plane (launcher/worker-step.c).
 *
 * One gang__wstep runs one generation on its own thread, so that the worker's main thread
 * keeps heartbeating to the agent even when the data plane is blocked. The thread reports
 * to the main thread by writing gang__wevent records into a pipe the main thread owns;
 * the main thread stops it with gang__wstep_stop(), which wakes every wait of the thread
 * through an abort pipe.
 * ================================================================================= */

/* What the data thread reports. */
typedef enum gang__wevent_type {
    GANG__WEV_READY = 1, /* the star is formed: every rank of the generation is connected */
    GANG__WEV_FAILED = 2 /* the data plane failed; the thread has returned */
} gang__wevent_type;

/* One report, written with a single write(2) (smaller than PIPE_BUF, so atomic). */
typedef struct gang__wevent {
    uint32_t type;                /* gang__wevent_type */
    int32_t code;                 /* FAILED: GANG_E* */
    uint64_t generation;          /* the generation the thread serves */
    int32_t rank;                 /* FAILED: global rank at fault (the own rank if unknown) */
    char reason[GANG_REASON_MAX]; /* FAILED: one line for the agent and the logs */
} gang__wevent;

/* Everything one generation of the data plane needs; copied by gang__wstep_start(). */
typedef struct gang__wstep_config {
    uint64_t generation;
    uint32_t rank;                 /* own global rank, < world */
    uint32_t world;                /* ranks in the gang, >= 1 */
    char root_host[GANG_HOST_MAX]; /* ranks > 0: numeric address of rank 0's listener */
    uint16_t root_port;            /* ranks > 0: its port */
    int listen_fd;                 /* rank 0 of world > 1: listener from gang__wstep_listen,
                                      borrowed (the caller closes it after stop) */
    int event_fd;                  /* write end of the caller's event pipe, borrowed */
    int64_t start_timeout_ms;      /* deadline for the star to form (capped at 10 s) */
    int64_t heartbeat_timeout_ms;  /* silence after which a rank is declared failed */
    int64_t step_interval_ms;      /* period of the placeholder all-reduce */
} gang__wstep_config;

typedef struct gang__wstep gang__wstep;

/*
 * Starts the data thread for cfg's generation. On success *out owns the thread, its
 * abort pipe and every data socket it will open; release it with gang__wstep_stop().
 * Returns 0, GANG_EINVAL for an inconsistent cfg, or a system error (pipe, thread).
 * Main thread only.
 */
int gang__wstep_start(const gang__wstep_config *cfg, gang__wstep **out);

/*
 * Aborts the data thread (a no-op if it has already returned), joins it and closes every
 * data socket it opened, then frees s. Every wait of the thread watches the abort pipe,
 * so this returns within a few milliseconds. Events the thread wrote before it returned
 * may still sit in the event pipe; the caller drains them. NULL is allowed.
 */
void gang__wstep_stop(gang__wstep *s);

/*
 * Opens rank 0's TCP listener for a generation: binds advertise (a numeric address or a
 * name; "" and "0.0.0.0" mean 127.0.0.1) on an ephemeral port and writes the bootstrap
 * blob "host:port" (numeric host, "[v6]:port" for IPv6, no NUL) into blob[0..cap), its
 * length in *blob_len. On success *fd is a non-blocking, close-on-exec listening socket
 * that the caller owns. Returns 0, GANG_ERESOLVE, GANG_EMSGSIZE or a system error.
 */
int gang__wstep_listen(const char *advertise, int *fd, uint8_t *blob, size_t cap, size_t *blob_len);

/*
 * Data-plane frames of the placeholder star, 40 bytes, little-endian:
 *
 *   offset 0  u32 magic       GANG__WFRAME_MAGIC ("GNGD" as bytes)
 *   offset 4  u32 kind        gang__wframe_kind
 *   offset 8  u64 generation
 *   offset 16 u32 rank        sender's global rank
 *   offset 20 u32 world       HELLO / WELCOME: the world size the sender was started with
 *   offset 24 u64 step        STEP / SUM: step number
 *   offset 32 u64 value       STEP: the sender's contribution; SUM: the reduced value
 */
#define GANG__WFRAME_MAGIC 0x44474E47u
#define GANG__WFRAME_SIZE 40u

typedef enum gang__wframe_kind {
    GANG__WF_HELLO = 1,   /* peer -> rank 0, first frame on a data connection */
    GANG__WF_WELCOME = 2, /* rank 0 -> peer, once every rank has said HELLO */
    GANG__WF_STEP = 3,    /* peer -> rank 0, one contribution per step */
    GANG__WF_SUM = 4      /* rank 0 -> peer, the reduced value of a step */
} gang__wframe_kind;

typedef struct gang__wframe {
    uint32_t kind; /* gang__wframe_kind */
    uint64_t generation;
    uint32_t rank;
    uint32_t world;
    uint64_t step;
    uint64_t value;
} gang__wframe;

/* Encodes f into out (the magic is added). */
void gang__wframe_encode(const gang__wframe *f, uint8_t out[GANG__WFRAME_SIZE]);
/* Decodes in into f: 0, or GANG_EPROTO for a bad magic or an unknown kind. */
int gang__wframe_decode(const uint8_t in[GANG__WFRAME_SIZE], gang__wframe *f);

#endif /* GANGLION_LAUNCHER_WORKER_H */
