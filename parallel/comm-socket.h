/*
 * socket backend, internal header: the state and the protocol constants that its five
 * files share, and the functions one of them calls in another (gang__sock_*). Nothing
 * here is visible outside parallel/.
 *
 *   comm-socket-blob.c      rank 0's listener and blob, which pairs connect
 *   comm-socket-boot.c      TCP connect/accept of those pairs, communicator
 *                           init / split / free
 *   comm-socket-shm.c       the shared-memory fast path: detection, mapping, the rings
 *   comm-socket-cma.c       the all-to-all's single copy between shared-memory peers
 *   comm-socket-progress.c  the progress engine (framing, matching, waiting) and abort
 *   comm-socket-coll.c      all-reduce, all-gather, broadcast, send/recv, the vtable
 *
 * Data plane: every message on a connection is framed as
 *   {comm_id u64, kind u32, tag u32, bytes u64} + payload (little-endian header).
 * comm_id tells apart the communicators that share the connections (a split child re-uses
 * its parent's connections); kind separates point-to-point messages (tag = user tag) from
 * collective ones (tag = per-pair sequence number, identical on both sides because every
 * rank issues the collectives in the same order). A receiver whose header matches a recv
 * it is waiting for reads the payload straight into the caller's buffer; anything else is
 * read into the peer's unexpected-message queue and matched later, so tagged messages may
 * arrive in any order, and a rank blocked in a send keeps draining what others send it
 * (which removes the classic "everyone sends first" deadlock for large messages).
 * Payloads are raw host-order data: every rank of a gang must share one endianness.
 *
 * Waiting: every wait is one poll() over the connections, the deadline and the eventfd
 * that gang_comm_abort() writes, so an abort wakes a blocked operation at once. Sockets
 * are non-blocking and every transfer handles partial reads and writes.
 *
 * Errors: EOF or reset from a peer the operation needs is GANG_EPEER, the deadline is
 * GANG_ETIMEDOUT, the abort is GANG_EABORTED, a size mismatch is GANG_EPROTO. Any of them
 * poisons the connections (a stream may be mid-message), so every communicator that shares
 * them (parent and split children) answers the same error from then on; likewise an abort
 * of one of them aborts the whole family. EOF from a peer the current operation does not
 * involve is only noted, so a rank that finished and left does not fail the others.
 *
 * Threads: parent and children share connections and queues without locks, so the
 * operations of a communicator family must be driven by one thread and never interleaved
 * concurrently (the pipeline and TP layers call them in sequence).
 */
#ifndef GANG_PARALLEL_COMM_SOCKET_H
#define GANG_PARALLEL_COMM_SOCKET_H

#include <limits.h>
#include <poll.h>
#include <stdint.h>
#include <sys/types.h>

#include "comm-backend.h"

#define SOCK_MAGIC 0x676e6763u /* "cgng": first word of every hello */
#define SOCK_VERSION 1u
#define SOCK_SESSION_LEN 16
#define SOCK_HOST_MAX 255
#define SOCK_HELLO_LEN 40 /* fixed part of a hello, before the host bytes */
#define SOCK_HDR_LEN 24
#define SOCK_KIND_P2P 0u
#define SOCK_KIND_COLL 1u
#define SOCK_KIND_ACK 2u          /* shm only: the receiver read a CMA frame's bytes */
#define SOCK_KIND_CMA 0x80000000u /* shm only, or-ed into a kind: the payload is a descriptor */
#define SOCK_CMA_DESC 16          /* {address u64, bytes u64} */
#define SOCK_CMA_MIN ((size_t)16 << 10) /* all-to-all transfers from this size read in place */
#define SOCK_HANDSHAKE_MS 2000          /* a connecting peer must say hello within this */
#define SOCK_MAX_MSG ((uint64_t)1 << 40)
#define SOCK_BLOB_MAX 512
#define SOCK_RING_CAP ((uint64_t)4 << 20)       /* one direction's ring of a bulk pair (TP, PP) */
#define SOCK_RING_CAP_CTRL ((uint64_t)64 << 10) /* ... of a control pair (plans, tokens) */
#define SOCK_RING_HDR 4096                      /* control page before the two rings */
#define SOCK_TAG_MAX 48       /* the blob's shm tag: "<job>-g<generation>", sanitized */
#define SOCK_SPIN_US 30       /* after progress, spin on the rings this long without yielding */
#define SOCK_YIELD_US 1000    /* then keep looking, yielding the CPU, until this long, then sleep */
#define SOCK_BOUNCE 4096      /* bounce buffer for summing misaligned ring bytes */
#define SOCK_SHM_NAME_MAX 160 /* "/ganglion-TAG-PPID-PID-SESSION8-LO-HI" fits with room */

/* Which pairs of a world are connected (gang__sock_pair). */
enum { SOCK_PAIR_NONE = 0, SOCK_PAIR_CTRL = 1, SOCK_PAIR_BULK = 2 };

/* Refusal statuses of a hello; 0 is acceptance. */
enum {
    SOCK_OK = 0,
    SOCK_REFUSE_VERSION = 1,
    SOCK_REFUSE_SESSION = 2,
    SOCK_REFUSE_WORLD = 3,
    SOCK_REFUSE_RANK = 4,
    SOCK_REFUSE_DUPLICATE = 5
};

/* Rank 0's listener (comm-socket-blob.c). */
struct gang_comm_listener {
    int fd;                     /* listening socket, non-blocking */
    char tag[SOCK_TAG_MAX + 1]; /* shared-memory tag "<job>-g<generation>" */
    int sparse;                 /* connect only the pairs that talk */
    uint32_t tp;
    uint8_t session[SOCK_SESSION_LEN]; /* random id every hello must carry */
    char host[SOCK_HOST_MAX + 1];      /* advertised host */
    uint16_t port;
};

/* A message read before anyone asked for it. */
typedef struct sock_msg {
    struct sock_msg *next;
    uint64_t comm_id;
    uint32_t kind, tag;
    size_t len;
    uint8_t data[];
} sock_msg;

/* One transfer of a progress call. */
typedef struct sock_op {
    int is_send;
    uint32_t peer; /* index into net->peers (a root rank) */
    uint64_t comm_id;
    uint32_t kind, tag;
    uint8_t *buf;
    size_t len;
    size_t done;               /* payload bytes moved */
    size_t hdr_done;           /* send: header bytes written */
    uint8_t hdr[SOCK_HDR_LEN]; /* send: the encoded header */
    int complete;
    int claimed;   /* recv: the peer's reader is filling it */
    int reduce;    /* recv: sum the payload into buf instead of storing it (shm peers) */
    gang_dtype dt; /* recv: element type of a reducing recv */
    const struct sock_op *src; /* send to a shm peer, or NULL: the recv of this call that
                                  fills buf; only payload bytes below its done may go */
    int cma_ok;    /* send: its receiver waits in the same call, so it may read buf in place */
    int cma;       /* send: goes as a descriptor (decided when its frame starts) */
    int await_ack; /* send: descriptor written, complete at the receiver's ACK */
    uint8_t desc[SOCK_CMA_DESC];
    size_t desc_done;
} sock_op;

/* Control words of one ring direction (protocol at the top of comm-socket-shm.c). */
typedef struct sock_ring {
    _Alignas(64) atomic_uint_least64_t head;
    _Alignas(64) atomic_uint_least64_t tail;
} sock_ring;

/*
 * The control page holds ring 0 at 0, ring 1 at 128, the two sleep flags at 256, 320 and
 * the two CPU words at 384, 448 (lower rank first).
 */
_Static_assert(sizeof(sock_ring) == 128, "sock_ring must span exactly two cache lines");

typedef struct sock_peer {
    int fd;                       /* -1 for this rank itself */
    void *shm;                    /* shared mapping of the pair, or NULL for TCP data */
    size_t shm_len;               /* its length: the control page and two rings */
    uint64_t ring_cap;            /* bytes of one direction's ring */
    sock_ring *tx_ring, *rx_ring; /* control words of both directions, in shm */
    atomic_int *my_sleep;         /* in shm: set while we may sleep; the peer rings then */
    atomic_int *peer_sleep;       /* in shm: the peer's flag, read after we move a counter */
    atomic_int *my_cpu;           /* in shm: 1 + the CPU we last waited on (0: not yet) */
    atomic_int *peer_cpu;         /* in shm: the peer's, to see that it shares our CPU */
    int bell;                     /* poll() saw the fd readable: drain it before the rings */
    uint8_t *tx_data, *rx_data;   /* ring bytes, in shm */
    int eof;                      /* the peer closed; noted, an error only if needed */
    sock_msg *uq_head, *uq_tail;  /* unexpected messages, in arrival order */
    uint8_t rx_hdr[SOCK_HDR_LEN]; /* reader state, kept across calls */
    size_t rx_hdr_got;
    uint8_t *rx_dst; /* where the current payload goes */
    size_t rx_len, rx_got;
    sock_op *rx_op;   /* the recv being filled, or NULL when stashing */
    sock_msg *rx_msg; /* the stash being filled */
    int rx_cma;       /* the current frame's payload is a descriptor, read into rx_desc */
    uint8_t rx_desc[SOCK_CMA_DESC];
    uint8_t *rx_final; /* ... and its bytes go here (rx_cma_len of them) */
    size_t rx_cma_len;
    int cma_rx;                /* we read this peer's memory (probed at start-up) */
    int cma_pid;               /* its pid, for process_vm_readv */
    atomic_int *cma_peer_flag; /* in shm: up once the peer reads our memory */
    uint32_t acks_owed;        /* CMA frames read whose ACK is not on the ring yet */
} sock_peer;

/* The connections, shared by a communicator and every child split from it. */
typedef struct sock_net {
    atomic_int refs;
    atomic_int aborted;
    atomic_int error;                  /* first error; poisons the whole family */
    int abort_fd;                      /* eventfd, readable once aborted */
    uint32_t n;                        /* ranks of the root communicator */
    uint8_t session[SOCK_SESSION_LEN]; /* names the shared-memory objects */
    uint8_t cma_cookie[16];            /* what peers read in our memory to probe CMA */
    char tag[SOCK_TAG_MAX + 1];        /* ... with this job-and-generation tag */
    int sparse;                        /* only the pairs that talk are connected */
    uint32_t tp;                       /* sparse: TP width of the groups (0: none) */
    uint32_t *conn;                    /* the connected peers, ascending */
    uint32_t nconn;
    uint32_t shm_peers; /* peers on the shared-memory path */
    sock_peer *peers;
    struct pollfd *pfds; /* n + 1 entries: the progress loop's poll set */
    uint32_t *pmap;      /* n + 1 entries: pfds index -> peer */
} sock_net;

typedef struct sock_comm {
    sock_net *net;
    uint64_t comm_id;              /* 0 for the root; derived for split children */
    uint32_t *world_of;            /* this communicator's rank -> root rank */
    uint32_t *send_seq, *recv_seq; /* collective sequence numbers per peer */
    uint32_t split_seq;            /* splits done so far, to derive child ids */
    uint8_t *scratch;              /* all-reduce receive chunk (TCP ring) */
    size_t scratch_cap;
    sock_op *ops; /* the pipelined all-reduce's 4(n-1) transfers */
} sock_comm;

/* ---------------------------------------------------------------------------------
 * Small helpers: encoding, deadlines.
 * --------------------------------------------------------------------------------- */
static inline void put_u32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
    p[2] = (uint8_t)(v >> 16);
    p[3] = (uint8_t)(v >> 24);
}

static inline uint32_t get_u32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static inline void put_u64(uint8_t *p, uint64_t v)
{
    put_u32(p, (uint32_t)v);
    put_u32(p + 4, (uint32_t)(v >> 32));
}

static inline uint64_t get_u64(const uint8_t *p)
{
    return (uint64_t)get_u32(p) | (uint64_t)get_u32(p + 4) << 32;
}

static inline uint64_t min_u64(uint64_t a, uint64_t b)
{
    return a < b ? a : b;
}

/* Milliseconds poll() may wait before deadline (0 when it has passed). */
static inline int sock_poll_ms(uint64_t deadline)
{
    uint64_t now = gang_now_ms();

    if (now >= deadline)
        return 0;
    return deadline - now > INT_MAX ? INT_MAX : (int)(deadline - now);
}

/* ---------------------------------------------------------------------------------
 * Across the files (gang__sock_*).
 * --------------------------------------------------------------------------------- */

/* comm-socket-boot.c: blocking transfers of the bootstrap (deadline and abort_fd honoured);
 * EOF or reset is GANG_EPEER. */
int gang__sock_read_full(int fd, void *buf, size_t len, int abort_fd, uint64_t deadline);
int gang__sock_write_full(int fd, const void *buf, size_t len, int abort_fd, uint64_t deadline);
/* comm-socket-boot.c: the vtable's lifecycle entries. */
int gang__sock_init(gang_comm *c, const gang_comm_config *cfg);
void gang__sock_free(gang_comm *c);
int gang__sock_split(gang_comm *c, uint32_t color, uint32_t key, uint64_t timeout_ms,
                     gang_comm *child);

/* comm-socket-boot.c: a listening socket on host, port chosen by the kernel. */
int gang__sock_listen_on(const char *host, int *fd_out, uint16_t *port_out);
/* comm-socket-blob.c: parses rank 0's blob into its address, session and net's options. */
int gang__sock_parse_blob(const uint8_t *blob, size_t len, char *host, uint16_t *port,
                          uint8_t *session, sock_net *net);
/* comm-socket-blob.c: the peers of rank r > 0 below or above it (see the definition). */
uint32_t gang__sock_peers_of(const sock_net *net, uint32_t r, int lower, uint32_t *out);
/* comm-socket-blob.c: the shared-memory tag "<job>-g<generation>" (SOCK_TAG_MAX + 1 bytes). */
void gang__sock_make_tag(const char *job, uint64_t generation, char *tag);
/* comm-socket-blob.c: the kind of the pair (a, b) in net (SOCK_PAIR_*). */
int gang__sock_pair(const sock_net *net, uint32_t a, uint32_t b);

/* comm-socket-shm.c: detection and mapping at start-up (after the mesh is up). */
int gang__sock_shm_setup(sock_net *net, uint32_t self, uint64_t deadline);
/* comm-socket-shm.c: one peer's data path without blocking (TCP or ring) and its doorbells. */
ssize_t gang__sock_peer_recv(sock_peer *p, const sock_op *op, void *dst, size_t want);
void gang__sock_tx_shm(sock_peer *p, sock_op *op);
int gang__sock_shm_readable(const sock_peer *p);
void gang__sock_shm_ring_bell(sock_peer *p);
void gang__sock_shm_drain(sock_peer *p);
/* comm-socket-shm.c: the control page's sleep flags and CPU words of every shm peer. */
void gang__sock_shm_sleep_flags(sock_net *net, int on);
int gang__sock_shm_cpu_shared(sock_net *net, const sock_op *ops, size_t nops, int cpu);

/* comm-socket-cma.c: the single-copy path (see the top of that file). */
int gang__sock_cma_init(sock_net *net);
void gang__sock_cma_publish(sock_net *net, sock_peer *p, uint32_t self, uint32_t peer);
void gang__sock_cma_probe(sock_peer *p, uint32_t self, uint32_t peer);
int gang__sock_cma_tx_ok(const sock_peer *p);
int gang__sock_cma_read(const sock_peer *p, void *dst, uint64_t addr, size_t len);
/* comm-socket-shm.c: the ACKs owed to a shm peer, onto its ring while they fit. */
void gang__sock_shm_acks(sock_peer *p);

/* comm-socket-progress.c: building transfers, running them, aborting. */
void gang__sock_op_send(sock_op *op, uint32_t peer, uint64_t comm_id, uint32_t kind, uint32_t tag,
                        const void *buf, size_t len);
void gang__sock_op_recv(sock_op *op, uint32_t peer, uint64_t comm_id, uint32_t kind, uint32_t tag,
                        void *buf, size_t len);
int gang__sock_progress(sock_comm *sc, sock_op *ops, size_t nops, uint64_t deadline);
void gang__sock_abort(gang_comm *c);

/* comm-socket-coll.c: the ring all-gather (split uses it to learn the colors). */
int gang__sock_all_gather(gang_comm *c, const void *send, void *recv, size_t count, gang_dtype dt,
                          uint64_t tmo);

#endif
