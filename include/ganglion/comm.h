/*
 * ganglion communicator: one front, several backends (socket, mpi, nccl), chosen at run
 * time. The front validates arguments and dispatches through a vtable; a backend that is
 * not built is registered as a stub whose entries return GANG_ENOSYS.
 *
 * Semantics (all backends):
 *  - Every rank of a communicator calls the collectives in the same order with the same
 *    counts and dtypes (as with NCCL/MPI); violating that is a caller bug.
 *  - Every operation takes a deadline (timeout_ms, > 0) and returns GANG_ETIMEDOUT when it
 *    passes; GANG_EPEER when a peer is known to be gone (EOF, reset); GANG_EABORTED when
 *    gang_comm_abort() was called, from any thread, promptly (< 100 ms) even while the
 *    operation is blocked. After any of these errors the communicator is unusable except
 *    for gang_comm_free(); the gang re-forms with a new communicator.
 *  - Buffers are host memory for the socket and mpi backends, device memory for nccl
 *    (ask gang_comm_caps(), not the backend, which kind a communicator takes).
 *  - One thread drives a communicator; only gang_comm_abort() and
 *    gang_comm_async_error() may be called from another thread.
 */
#ifndef GANGLION_COMM_H
#define GANGLION_COMM_H

#include <stddef.h>
#include <stdint.h>

#include "ganglion/common.h"

typedef struct gang_comm gang_comm;

typedef enum gang_comm_backend {
    GANG_COMM_SOCKET = 0,
    GANG_COMM_MPI = 1,
    GANG_COMM_NCCL = 2
} gang_comm_backend;

const char *gang_comm_backend_name(gang_comm_backend b);
/* 1 when backend b is built into this binary (its stub returns GANG_ENOSYS otherwise). */
int gang_comm_backend_built(gang_comm_backend b);

/*
 * Bootstrap of the socket backend (the blob of the control plane): rank 0 creates a
 * listener with gang_comm_socket_listen(), which writes a printable, NUL-free blob
 * describing it ("host:port" plus a random 16-byte session id in hex, so that a stale
 * connection from another generation is refused). Every rank then calls
 * gang_comm_init() with backend = GANG_COMM_SOCKET and that blob.
 */
typedef struct gang_comm_listener gang_comm_listener;
int gang_comm_socket_listen(const char *advertise_host, gang_comm_listener **out, char *blob,
                            size_t blob_cap, size_t *blob_len);
void gang_comm_listener_free(gang_comm_listener *l);

/*
 * What rank 0 puts in the socket blob besides its address (every rank reads it there):
 *  - job and generation name the world's shared-memory segments
 *    ("/ganglion-JOB-gGEN-PPID-PID-SESSION8-LO-HI": JOB with every character outside
 *    [A-Za-z0-9_.] made '_', cut at 24; PID the creating rank, PPID its parent, the
 *    agent), so that gang_comm_shm_sweep can tell whose a leftover segment is;
 *  - sparse = 1 connects only the pairs that talk, each rank to rank 0 (plans, tokens,
 *    the star of the bootstrap), to rank +-1 (the world's ring collectives: split,
 *    barrier), and with tp > 0 every pair of its TP group (consecutive blocks of tp
 *    ranks) and of its PP ring (rank +-tp, modulo the world): O(n + n x tp) connections
 *    instead of n(n-1)/2. A world operation between two ranks that are not connected
 *    fails with GANG_EINVAL (and an error log naming the pair) without touching the
 *    connections. sparse = 0 (gang_comm_socket_listen) connects every pair.
 * Shared-memory rings (same-host pairs) carry 4 MiB each way for a TP or PP pair, 64 KiB
 * for a control pair (rank 0's star and the world ring).
 */
typedef struct gang_comm_socket_opts {
    const char *job;     /* NULL or "" = "anon" */
    uint64_t generation; /* of the control plane; 0 when there is none */
    int sparse;
    uint32_t tp; /* sparse only; 0: the world has no TP / PP groups */
} gang_comm_socket_opts;

/* gang_comm_socket_listen with the options above (opts NULL = the defaults). */
int gang_comm_socket_listen_opts(const char *advertise_host, const gang_comm_socket_opts *opts,
                                 gang_comm_listener **out, char *blob, size_t blob_cap,
                                 size_t *blob_len);

/*
 * Removes from dir (normally "/dev/shm") the socket worlds' segments that no formation
 * will ever use again: one whose creating rank or whose creator's parent has exited, and
 * one created by a child of agent_pid for job in a generation older than generation (an
 * agent passes its own pid and the generation it starts; UINT64_MAX at exit, after its
 * workers are gone). A segment still named belongs to a formation in flight: the
 * formation unlinks it as soon as both ranks hold it. Names that are not of this form are
 * left alone. Returns 0 (adding the count removed to *removed when not NULL), or a
 * negative code when dir cannot be read.
 */
int gang_comm_shm_sweep(const char *dir, const char *job, uint64_t generation, int agent_pid,
                        uint32_t *removed);

/*
 * Bootstrap of the nccl backend: rank 0 calls gang_comm_nccl_unique_id() (ncclGetUniqueId)
 * and hands the blob it writes to every rank through the control plane; every rank then
 * calls gang_comm_init() with backend = GANG_COMM_NCCL and that blob. The blob is the
 * 128-byte NCCL unique id in lowercase hex: 256 printable, NUL-free bytes (cap must be at
 * least 256, else GANG_ERANGE); *len receives 256. GANG_ENOSYS when NCCL is not built,
 * GANG_EIO when libnccl cannot be loaded (it is opened at run time) or cannot create the
 * id (no usable network interface).
 *
 * nccl communicators (see parallel/comm-nccl.c):
 *  - use the CUDA device that is current on the calling thread at gang_comm_init(); every
 *    buffer is device memory of that GPU (e.g. from gang_kernels_alloc on a "cuda"
 *    handle of the same device);
 *  - run on their own stream. An operation ordered with gang_comm_order_after (events on
 *    the device) returns once it is enqueued, without a host wait: its completion and its
 *    asynchronous errors are awaited, with a deadline, by gang_comm_settle (once per
 *    decode step) or by the next operation that is not ordered; any other operation
 *    returns when it completed (the caller synchronised its stream first,
 *    gang_kernels_sync);
 *  - do not carry tags: sends and receives between two ranks must be issued in the same
 *    order on both sides; the tag is ignored;
 *  - gang_comm_abort() from another thread sets a flag; the thread inside an operation
 *    sees it within a millisecond and calls ncclCommAbort, returning GANG_EABORTED.
 */
int gang_comm_nccl_unique_id(uint8_t *blob, size_t cap, size_t *len);
/*
 * Loads libnccl now (common/dynlib.c's search, once per process) and writes the file the
 * loader mapped into path[cap]. 0; GANG_EIO when it cannot be loaded (logged, every place
 * tried named); GANG_ENOSYS when the nccl backend is not built. For `ganglion info
 * --libraries` and the device check's preflight.
 */
int gang_comm_nccl_library(char *path, size_t cap);

/*
 * Data-plane bootstrap (parallel/bootstrap.c): the blob a gang's rank 0 hands to every
 * rank through the control plane, which carries it opaquely. Its format:
 *
 *   SOCKET                      the socket backend's blob (gang_comm_socket_listen:
 *                               printable, no NUL, no newline); a socket world only
 *   SOCKET "\n" "nccl:" HEX     the same, then a newline, the prefix "nccl:" and the NCCL
 *                               unique id as gang_comm_nccl_unique_id writes it (exactly
 *                               256 lowercase hex digits, nothing after them); an nccl
 *                               world of the same ranks can be joined as well
 *
 * An empty blob is valid: a gang of one needs no rendezvous. Rank 0 makes the blob with
 * gang_bootstrap_create(); every rank may check it with gang_bootstrap_parse() and joins
 * with gang_bootstrap_join().
 */
#define GANG_BOOTSTRAP_NCCL_HEX 256 /* hex digits of the NCCL unique id (128 bytes) */

/* Rank 0's side of a bootstrap: the socket listener, until the socket join takes it. */
typedef struct gang_bootstrap gang_bootstrap;

/* The parts of a blob; the pointers point into the parsed blob. */
typedef struct gang_bootstrap_parts {
    const uint8_t *socket; /* the socket backend's blob (socket_len 0: an empty blob) */
    size_t socket_len;
    const uint8_t *nccl; /* the NCCL unique id (hex), or NULL without the nccl part */
    size_t nccl_len;     /* GANG_BOOTSTRAP_NCCL_HEX with the nccl part, else 0 */
} gang_bootstrap_parts;

/*
 * Validates blob[len] against the format above and fills *out. Returns 0, or GANG_EPROTO
 * with a one-line reason in err[errlen] (a non-printable byte in the socket part, an empty
 * socket part before an nccl line, a second line that is not "nccl:", an id of the wrong
 * length or with a character that is not lowercase hex, anything after it). Pure.
 */
int gang_bootstrap_parse(const uint8_t *blob, size_t len, gang_bootstrap_parts *out, char *err,
                         size_t errlen);

/*
 * Writes the blob of (socket[socket_len], nccl[nccl_len]) into out[cap] (nccl NULL: the
 * socket-only form) and its length into *len. GANG_ERANGE when it does not fit,
 * GANG_EINVAL when the result would not parse (checked with gang_bootstrap_parse).
 */
int gang_bootstrap_format(const uint8_t *socket, size_t socket_len, const uint8_t *nccl,
                          size_t nccl_len, uint8_t *out, size_t cap, size_t *len);

/*
 * Rank 0 of a gang of more than one: opens the socket listener on advertise_host and,
 * when with_nccl, creates an NCCL unique id (its bootstrap root then lives in this
 * process), and writes the blob into blob[cap] and *len. Returns 0 and *out (pass it to
 * gang_bootstrap_join as root, or free it), or GANG_EINVAL, GANG_ERANGE, the listener's
 * error, or gang_comm_nccl_unique_id's (GANG_ENOSYS, GANG_EIO), with a one-line reason
 * in err[errlen] that names the failed step.
 */
int gang_bootstrap_create(const char *advertise_host, int with_nccl, gang_bootstrap **out,
                          uint8_t *blob, size_t cap, size_t *len, char *err, size_t errlen);
/* The same, with the socket world's options (gang_comm_socket_opts; NULL = defaults). */
int gang_bootstrap_create_opts(const char *advertise_host, const gang_comm_socket_opts *sock,
                               int with_nccl, gang_bootstrap **out, uint8_t *blob, size_t cap,
                               size_t *len, char *err, size_t errlen);
void gang_bootstrap_free(gang_bootstrap *b);

typedef struct gang_bootstrap_join_config {
    uint32_t rank; /* this rank, in [0, world_size) */
    uint32_t world_size;
    const uint8_t *blob; /* rank 0's blob, as gang_bootstrap_create wrote it */
    size_t blob_len;
    gang_bootstrap *root;       /* rank 0's, for the socket join; consumed in any case */
    const char *advertise_host; /* socket: address other ranks use to reach this one */
    uint64_t timeout_ms;        /* deadline of the whole initialisation */
    const int *cancel_fd;       /* optional, as in gang_comm_config */
} gang_bootstrap_join_config;

/*
 * Joins the world communicator of backend `world` (a collective call) from the blob:
 * GANG_COMM_SOCKET from its socket part, GANG_COMM_NCCL from its NCCL unique id (on the
 * CUDA device current on the calling thread). Returns 0 and *out, GANG_EPROTO for a
 * malformed blob or one without the part `world` needs, GANG_EINVAL for another backend,
 * or gang_comm_init's error. cfg->root is freed on every outcome.
 */
int gang_bootstrap_join(const gang_bootstrap_join_config *cfg, gang_comm_backend world,
                        gang_comm **out);

typedef struct gang_comm_config {
    gang_comm_backend backend;
    uint32_t rank; /* this rank, in [0, world_size) */
    uint32_t world_size;
    const uint8_t *blob; /* socket: rank 0's blob; nccl: the unique id */
    size_t blob_len;
    gang_comm_listener *listener; /* socket, rank 0 only: from gang_comm_socket_listen */
    const char *advertise_host;   /* socket: address other ranks use to reach this one */
    uint64_t timeout_ms;          /* deadline of the whole initialisation */
    const int *cancel_fd;         /* optional: init returns GANG_EABORTED promptly once
                                     this fd is readable (socket backend; a thread that
                                     must stop a gang still forming writes to it) */
    int wait_each;                /* nccl: await every ordered operation on the host, as
                                     before issue #24 (no gang_comm_settle batching); the
                                     "before" figure of bench decode --nccl-wait-each.
                                     Split children inherit it */
} gang_comm_config;

/*
 * Creates the communicator for all world_size ranks (a collective call). Returns 0 and
 * *out, GANG_ETIMEDOUT, GANG_EPEER, GANG_EINVAL (bad config or blob), GANG_ENOSYS (backend
 * not built) or GANG_EABORTED. For rank 0 the listener is consumed (freed) on any outcome.
 */
int gang_comm_init(const gang_comm_config *cfg, gang_comm **out);
void gang_comm_free(gang_comm *c);

uint32_t gang_comm_rank(const gang_comm *c);
uint32_t gang_comm_size(const gang_comm *c);
gang_comm_backend gang_comm_backend_of(const gang_comm *c);

/*
 * Capabilities of a communicator's backend, so that callers ask what it can do instead of
 * which backend it is. Each backend declares them in its vtable (parallel/comm-backend.h).
 *  - GANG_COMM_CAP_HOST_MEM: buffers are host memory (socket, mpi).
 *  - GANG_COMM_CAP_DEVICE_MEM: buffers are device memory of the communicator's GPU (nccl);
 *    the caller orders each operation after the work that produced its input, with
 *    gang_comm_order_after or, where that answers GANG_ENOSYS, a host synchronisation.
 *  - GANG_COMM_CAP_TAGS: send/recv match on (peer, tag); without it the tag is ignored and
 *    the messages between two ranks match in issue order.
 * gang_comm_caps(NULL) is 0.
 */
#define GANG_COMM_CAP_HOST_MEM (1u << 0)
#define GANG_COMM_CAP_DEVICE_MEM (1u << 1)
#define GANG_COMM_CAP_TAGS (1u << 2)

uint32_t gang_comm_caps(const gang_comm *c);

/*
 * Splits c into sub-communicators (a collective call over all ranks of c): ranks with the
 * same color form one communicator, ordered by key then by parent rank. TP groups use
 * color = pp stage, PP neighbours color = tp rank. Returns 0 and *out.
 */
int gang_comm_split(gang_comm *c, uint32_t color, uint32_t key, uint64_t timeout_ms,
                    gang_comm **out);

/* In-place sum over all ranks: buf holds count elements of dt on every rank. */
int gang_comm_all_reduce(gang_comm *c, void *buf, size_t count, gang_dtype dt, uint64_t timeout_ms);
/* recv (count * size elements) = concatenation of every rank's send (count elements). */
int gang_comm_all_gather(gang_comm *c, const void *send, void *recv, size_t count, gang_dtype dt,
                         uint64_t timeout_ms);
/* buf of root is copied to every rank. */
int gang_comm_broadcast(gang_comm *c, void *buf, size_t count, gang_dtype dt, uint32_t root,
                        uint64_t timeout_ms);
/*
 * Point-to-point, tagged (the pipeline tags by microbatch): a send matches the recv with
 * the same (peer, tag); messages between two ranks with different tags may be received in
 * any order. A size mismatch is GANG_EPROTO.
 */
int gang_comm_send(gang_comm *c, const void *buf, size_t bytes, uint32_t peer, uint32_t tag,
                   uint64_t timeout_ms);
int gang_comm_recv(gang_comm *c, void *buf, size_t bytes, uint32_t peer, uint32_t tag,
                   uint64_t timeout_ms);
int gang_comm_barrier(gang_comm *c, uint64_t timeout_ms);

/*
 * The buffers of an all-to-all with per-peer sizes (the dispatch and combine of expert
 * parallelism): this rank sends send_bytes[p] bytes from send + send_off[p] to every rank p
 * (itself included) and receives recv_bytes[p] bytes from rank p into recv + recv_off[p].
 * The four arrays have size() entries; every region lies inside its buffer's cap, receive
 * regions do not overlap each other, and recv_bytes[p] on this rank equals send_bytes[me]
 * on rank p (exchange the counts first, with this same operation on fixed 8-byte
 * entries). Host memory for host backends, device memory for nccl.
 */
typedef struct gang_comm_a2a {
    const void *send;
    size_t send_cap;
    const size_t *send_bytes, *send_off;
    void *recv;
    size_t recv_cap;
    const size_t *recv_bytes, *recv_off;
} gang_comm_a2a;

/*
 * All-to-all(v) as described above, with a deadline like every operation. Zero-byte
 * entries move nothing. Returns 0; GANG_EINVAL for a region outside its buffer, a NULL
 * buffer under a non-empty region or overlapping receive regions; GANG_EPROTO when a peer
 * sent another size than recv_bytes says; GANG_ERANGE past a backend's limit (MPI: int
 * counts); GANG_ENOSYS for a backend without it; else the backend's error (GANG_ETIMEDOUT,
 * GANG_EABORTED, a lost peer), which like any other failure leaves the communicator
 * unusable for the gang's next generation to replace.
 */
int gang_comm_all_to_all_v(gang_comm *c, const gang_comm_a2a *a, uint64_t timeout_ms);

/*
 * Device ordering for communicators of device memory: the next operation on c starts, on
 * the device, after every piece of work already enqueued in stream (an opaque queue from
 * gang_kernels_device_stream), and work enqueued in stream after that operation returned
 * starts after it. No host wait: this is how a row-parallel GEMM and its all-reduce stay
 * in order without a gang_kernels_sync between them. Call it right before the operation
 * it is for. Returns 0, GANG_EINVAL (NULL), GANG_EABORTED, GANG_ENOSYS when the backend
 * has no device ordering (host backends: the caller synchronises on the host instead), or
 * the backend's error (GANG_EIO for a failed event record).
 */
int gang_comm_order_after(gang_comm *c, void *stream);

/*
 * Waits, until timeout_ms, for the device work of c's operations that returned at
 * enqueue (those ordered with gang_comm_order_after, on a backend that does not wait for
 * them: nccl), and reports their asynchronous errors: one host wait for all of a step's
 * collectives instead of one each. On an error or the deadline the communicator is
 * aborted, as an operation that met it would be. Returns 0 at once when nothing is
 * pending (and for every host backend); GANG_EINVAL for NULL; GANG_ETIMEDOUT,
 * GANG_EABORTED, GANG_EPEER or GANG_EIO as an operation.
 */
int gang_comm_settle(gang_comm *c, uint64_t timeout_ms);

/*
 * Device graphs (a decode step captured once and replayed, issue #24).
 * gang_comm_graph_ok: 1 when c's ordered operations may be captured into a graph being
 * recorded on the caller's stream (nccl, whose ordered operations return at enqueue: not
 * wait_each); 0 for host backends, a wait_each or failed communicator, NULL. Whether an
 * operation is captured must be the same on every rank of c (NCCL's rule): callers decide
 * it from what all ranks share.
 * gang_comm_pend_on: c's operations were enqueued on stream by a graph launched there, so
 * its next gang_comm_settle also waits, with its deadline, for the work stream holds now
 * (a settle would otherwise see c's own stream idle). Returns 0, GANG_EINVAL (NULL),
 * GANG_EABORTED, GANG_ENOSYS for a backend without device graphs, GANG_EIO.
 */
int gang_comm_graph_ok(const gang_comm *c);
int gang_comm_pend_on(gang_comm *c, void *stream);

/*
 * Makes every blocked and future operation on c return GANG_EABORTED promptly. Safe from
 * any thread and from a signal-free context while another thread is inside an operation;
 * idempotent. The communicator must still be freed by its owning thread.
 */
void gang_comm_abort(gang_comm *c);
/* 0, or the first error the communicator recorded (e.g. a peer lost in the background). */
int gang_comm_async_error(gang_comm *c);

#endif /* GANGLION_COMM_H */
