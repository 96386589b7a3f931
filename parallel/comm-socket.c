/*
 * socket backend: CPU ranks over TCP, one connection per pair of ranks.
 *
 * Bootstrap (gang_comm_init with GANG_COMM_SOCKET):
 *
 *   rank 0                         rank r > 0
 *   listener from                  opens its own listener on advertise_host:0
 *   gang_comm_socket_listen()      connects to rank 0 (address from the blob)
 *                            <---  hello {magic, version, session, rank, world, its port+host}
 *   checks session, version,
 *   world, rank range, duplicate;
 *   refuses with a status and
 *   keeps serving the others
 *   once all world-1 are in:  --->  status 0 + address table of every rank
 *                                   connects to ranks 1..r-1, sends hello, reads status
 *                                   accepts ranks r+1..world-1, checks their hello
 *
 * The connection a rank opened to rank 0 becomes the pair's data connection, so rank 0 is
 * done once it has sent the table. Lower ranks never wait for higher ones while connecting
 * (a connect completes in the kernel backlog before accept), so the mesh cannot deadlock.
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
 *
 * Shared memory: see the block comment before sock_ring (below) for the fast path that
 * pairs of ranks on one host use for their data instead of the TCP byte stream.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "comm-backend.h"

#define SOCK_MAGIC 0x676e6763u /* "cgng": first word of every hello */
#define SOCK_VERSION 1u
#define SOCK_SESSION_LEN 16
#define SOCK_HOST_MAX 255
#define SOCK_HELLO_LEN 40 /* fixed part of a hello, before the host bytes */
#define SOCK_HDR_LEN 24
#define SOCK_KIND_P2P 0u
#define SOCK_KIND_COLL 1u
#define SOCK_HANDSHAKE_MS 2000 /* a connecting peer must say hello within this */
#define SOCK_MAX_MSG ((uint64_t)1 << 40)
#define SOCK_BLOB_MAX 512
#define SOCK_RING_CAP ((uint64_t)4 << 20) /* bytes of one direction's shared ring */
#define SOCK_RING_HDR 4096                /* control page before the two rings */
#define SOCK_SHM_LEN (SOCK_RING_HDR + 2 * SOCK_RING_CAP)
#define SOCK_SPIN_US 30      /* after progress, spin on the rings this long without yielding */
#define SOCK_YIELD_US 1000   /* then keep looking, yielding the CPU, until this long, then sleep */
#define SOCK_BOUNCE 4096     /* bounce buffer for summing misaligned ring bytes */
#define SOCK_SHM_NAME_MAX 96 /* "/ganglion-" + 32 hex digits + "-lo-hi" fits with room */

/* Refusal statuses of a hello; 0 is acceptance. */
enum {
    SOCK_OK = 0,
    SOCK_REFUSE_VERSION = 1,
    SOCK_REFUSE_SESSION = 2,
    SOCK_REFUSE_WORLD = 3,
    SOCK_REFUSE_RANK = 4,
    SOCK_REFUSE_DUPLICATE = 5
};

struct gang_comm_listener {
    int fd;                            /* listening socket, non-blocking */
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
} sock_op;

/*
 * Shared-memory fast path.
 *
 * Two ranks on one host share one mapping per pair: a control page, then one ring per
 * direction (SOCK_RING_CAP bytes each; ring 0 carries lower rank -> higher rank, ring 1
 * the other way). A ring is a single-producer single-consumer byte stream that carries
 * exactly the frames (header + payload) the TCP stream would carry, so matching, the
 * unexpected-message queue and the error rules above are unchanged.
 *
 * Each ring has two monotonic 64-bit counters on their own cache lines: head (bytes ever
 * written, stored only by the writer) and tail (bytes ever read, stored only by the
 * reader); head - tail is the fill. The writer copies bytes into [head, head + n) modulo
 * the capacity, then publishes them with a release store of head; the reader loads head
 * with acquire, so the bytes are visible before it copies them out, and hands the space
 * back with a release store of tail, which the writer loads with acquire before reusing
 * it. Neither side ever writes the other's counter, so no read-modify-write is needed.
 *
 * The pair's TCP connection stays: it carries the shared-memory handshake at start-up,
 * then only one-byte doorbells, and its EOF is how a dead peer is seen (GANG_EPEER).
 * Doorbells are rung only for a peer that may sleep, an eventcount in two flags (one per
 * side, own cache lines): a side about to sleep in poll() sets its flag, issues a
 * seq_cst fence and then looks at its rings once more before it sleeps; a side that moved
 * a counter (data written, or space freed) issues a seq_cst fence and then reads the
 * peer's flag, ringing when it is set. The two fences order "flag, then look" against
 * "counter, then flag", so either the sleeper sees the new counter or the mover sees the
 * flag and rings. The flag is cleared after progress. A doorbell that finds the socket
 * buffer full is dropped, since unread doorbells already wake the peer. Until it sleeps,
 * a side keeps looking at its rings (SOCK_YIELD_US after its last progress, see
 * sock_progress), which spares the wake-up latency.
 * poll() stays the only place that blocks (with the abort eventfd and the deadline).
 *
 * Detection: after the mesh is up, the lower rank of each pair creates a POSIX shared
 * memory object whose name holds the session id and both ranks, the higher rank tries
 * to open it, and each tells the other over TCP whether it succeeded. Only a rank that
 * shares the creator's /dev/shm can open it (the session id is random), so this is an
 * exact same-host test, stricter than comparing host names or boot ids (containers on
 * one host that do not share /dev/shm fall back to TCP). The object is unlinked as soon
 * as the higher rank has it mapped, or as soon as the lower rank learns it failed.
 */
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
} sock_peer;

/* The connections, shared by a communicator and every child split from it. */
typedef struct sock_net {
    atomic_int refs;
    atomic_int aborted;
    atomic_int error;                  /* first error; poisons the whole family */
    int abort_fd;                      /* eventfd, readable once aborted */
    uint32_t n;                        /* ranks of the root communicator */
    uint8_t session[SOCK_SESSION_LEN]; /* names the shared-memory objects */
    uint32_t shm_peers;                /* peers on the shared-memory path */
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
 * Small helpers: encoding, deadlines, socket options.
 * --------------------------------------------------------------------------------- */
static void put_u32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
    p[2] = (uint8_t)(v >> 16);
    p[3] = (uint8_t)(v >> 24);
}

static uint32_t get_u32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void put_u64(uint8_t *p, uint64_t v)
{
    put_u32(p, (uint32_t)v);
    put_u32(p + 4, (uint32_t)(v >> 32));
}

static uint64_t get_u64(const uint8_t *p)
{
    return (uint64_t)get_u32(p) | (uint64_t)get_u32(p + 4) << 32;
}

static uint64_t sock_deadline(uint64_t timeout_ms)
{
    uint64_t now = gang_now_ms();

    return timeout_ms > UINT64_MAX - now ? UINT64_MAX : now + timeout_ms;
}

static uint64_t min_u64(uint64_t a, uint64_t b)
{
    return a < b ? a : b;
}

/* Milliseconds poll() may wait before deadline (0 when it has passed). */
static int sock_poll_ms(uint64_t deadline)
{
    uint64_t now = gang_now_ms();

    if (now >= deadline)
        return 0;
    return deadline - now > INT_MAX ? INT_MAX : (int)(deadline - now);
}

static int sock_prepare_fd(int fd)
{
    int one = 1;
    int fl = fcntl(fd, F_GETFL);

    if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0)
        return gang_err_from_errno(errno);
    /* Collectives exchange many small frames; Nagle would add a delay to each. */
    if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) < 0)
        return gang_err_from_errno(errno);
    return 0;
}

/*
 * Waits until fd reports events, the deadline passes (GANG_ETIMEDOUT) or abort_fd becomes
 * readable (GANG_EABORTED). A hang-up counts as ready: the following I/O reports it.
 */
static int sock_wait(int fd, short events, int abort_fd, uint64_t deadline)
{
    struct pollfd p[2];
    int rc;

    for (;;) {
        p[0].fd = fd;
        p[0].events = events;
        p[0].revents = 0;
        p[1].fd = abort_fd;
        p[1].events = POLLIN;
        p[1].revents = 0;
        if (gang_now_ms() >= deadline)
            return GANG_ETIMEDOUT;
        rc = poll(p, abort_fd >= 0 ? 2 : 1, sock_poll_ms(deadline));
        if (rc < 0 && errno == EINTR)
            continue;
        if (rc < 0)
            return gang_err_from_errno(errno);
        if (p[1].revents)
            return GANG_EABORTED;
        if (p[0].revents)
            return 0;
    }
}

/* Reads exactly len bytes before the deadline; EOF or reset is GANG_EPEER. */
static int sock_read_full(int fd, void *buf, size_t len, int abort_fd, uint64_t deadline)
{
    uint8_t *p = buf;
    size_t got = 0;
    int rc;

    while (got < len) {
        ssize_t n = recv(fd, p + got, len - got, MSG_DONTWAIT);

        if (n > 0) {
            got += (size_t)n;
            continue;
        }
        if (n == 0)
            return GANG_EPEER;
        if (errno == EINTR)
            continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK)
            return GANG_EPEER;
        rc = sock_wait(fd, POLLIN, abort_fd, deadline);
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* Writes exactly len bytes before the deadline; a closed peer is GANG_EPEER. */
static int sock_write_full(int fd, const void *buf, size_t len, int abort_fd, uint64_t deadline)
{
    const uint8_t *p = buf;
    size_t done = 0;
    int rc;

    while (done < len) {
        ssize_t n = send(fd, p + done, len - done, MSG_DONTWAIT | MSG_NOSIGNAL);

        if (n >= 0) {
            done += (size_t)n;
            continue;
        }
        if (errno == EINTR)
            continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK)
            return GANG_EPEER;
        rc = sock_wait(fd, POLLOUT, abort_fd, deadline);
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* Opens a listening socket on host, port chosen by the kernel. */
static int sock_listen_on(const char *host, int *fd_out, uint16_t *port_out)
{
    struct addrinfo hints, *res = NULL, *ai;
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    int fd = -1, rc, one = 1;

    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE;
    if (getaddrinfo(host, "0", &hints, &res) != 0)
        return GANG_ERESOLVE;
    rc = GANG_EIO;
    for (ai = res; ai != NULL; ai = ai->ai_next) {
        fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (fd < 0)
            continue;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
        if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && listen(fd, SOMAXCONN) == 0)
            break;
        rc = gang_err_from_errno(errno);
        close(fd);
        fd = -1;
    }
    freeaddrinfo(res);
    if (fd < 0)
        return rc;
    if (getsockname(fd, (struct sockaddr *)&ss, &sl) < 0) {
        rc = gang_err_from_errno(errno);
        close(fd);
        return rc;
    }
    *port_out = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                               : ((struct sockaddr_in *)&ss)->sin_port);
    *fd_out = fd;
    return 0;
}

/*
 * Connects to host:port before the deadline. A refused connection is retried every 20 ms:
 * the listener of a peer is always open before its address is published, so a refusal
 * only means a slow kernel, never a peer that is not there yet.
 */
static int sock_connect(const char *host, uint16_t port, int abort_fd, uint64_t deadline,
                        int *fd_out)
{
    struct addrinfo hints, *res = NULL;
    char port_s[8];
    int fd, rc, err;
    socklen_t el;

    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    snprintf(port_s, sizeof(port_s), "%u", (unsigned)port);
    if (getaddrinfo(host, port_s, &hints, &res) != 0)
        return GANG_ERESOLVE;
    for (;;) {
        fd = socket(res->ai_family, res->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (fd < 0) {
            rc = gang_err_from_errno(errno);
            goto out_res;
        }
        if (connect(fd, res->ai_addr, res->ai_addrlen) == 0) {
            err = 0;
        } else if (errno == EINPROGRESS) {
            rc = sock_wait(fd, POLLOUT, abort_fd, deadline);
            if (rc < 0)
                goto out_fd;
            el = sizeof(err);
            if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el) < 0)
                err = errno;
        } else {
            err = errno;
        }
        if (err == 0)
            break;
        close(fd);
        if (err != ECONNREFUSED) {
            rc = GANG_EPEER;
            goto out_res;
        }
        if (gang_now_ms() + 20 >= deadline) {
            rc = GANG_ETIMEDOUT;
            goto out_res;
        }
        rc = sock_wait(abort_fd, POLLIN, -1, gang_now_ms() + 20);
        if (rc == 0) {
            rc = GANG_EABORTED;
            goto out_res;
        }
    }
    rc = sock_prepare_fd(fd);
    if (rc < 0)
        goto out_fd;
    freeaddrinfo(res);
    *fd_out = fd;
    return 0;

out_fd:
    close(fd);
out_res:
    freeaddrinfo(res);
    return rc;
}

/* Accepts one connection before the deadline. */
static int sock_accept(int lfd, int abort_fd, uint64_t deadline, int *fd_out)
{
    int fd, rc;

    for (;;) {
        fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd >= 0)
            break;
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR && errno != ECONNABORTED)
            return gang_err_from_errno(errno);
        rc = sock_wait(lfd, POLLIN, abort_fd, deadline);
        if (rc < 0)
            return rc;
    }
    rc = sock_prepare_fd(fd);
    if (rc < 0) {
        close(fd);
        return rc;
    }
    *fd_out = fd;
    return 0;
}

/* ---------------------------------------------------------------------------------
 * Listener and blob.
 * --------------------------------------------------------------------------------- */
static int sock_random(uint8_t *buf, size_t len)
{
    size_t got = 0;

    while (got < len) {
        ssize_t n = getrandom(buf + got, len - got, 0);

        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return gang_err_from_errno(errno);
        got += (size_t)n;
    }
    return 0;
}

/*
 * Creates rank 0's listener on advertise_host (port chosen by the kernel) and writes the
 * blob "host:port/SESSION" (IPv6 hosts in brackets; SESSION is 32 hex digits), NUL
 * terminated; *blob_len excludes the NUL. GANG_ERANGE when blob_cap is too small.
 */
int gang_comm_socket_listen(const char *advertise_host, gang_comm_listener **out, char *blob,
                            size_t blob_cap, size_t *blob_len)
{
    gang_comm_listener *l;
    char hex[2 * SOCK_SESSION_LEN + 1];
    int rc, n, v6;
    size_t i;

    if (out != NULL)
        *out = NULL;
    if (advertise_host == NULL || out == NULL || blob == NULL || blob_len == NULL ||
        advertise_host[0] == '\0' || strlen(advertise_host) > SOCK_HOST_MAX)
        return GANG_EINVAL;
    l = calloc(1, sizeof(*l));
    if (l == NULL)
        return GANG_ENOMEM;
    l->fd = -1;
    memcpy(l->host, advertise_host, strlen(advertise_host) + 1);
    rc = sock_random(l->session, sizeof(l->session));
    if (rc < 0)
        goto out_free;
    rc = sock_listen_on(advertise_host, &l->fd, &l->port);
    if (rc < 0)
        goto out_free;
    for (i = 0; i < SOCK_SESSION_LEN; i++)
        snprintf(hex + 2 * i, 3, "%02x", l->session[i]);
    v6 = strchr(advertise_host, ':') != NULL;
    n = snprintf(blob, blob_cap, v6 ? "[%s]:%u/%s" : "%s:%u/%s", advertise_host, (unsigned)l->port,
                 hex);
    if (n < 0 || (size_t)n >= blob_cap) {
        rc = GANG_ERANGE;
        goto out_free;
    }
    *blob_len = (size_t)n;
    *out = l;
    return 0;

out_free:
    gang_comm_listener_free(l);
    return rc;
}

void gang_comm_listener_free(gang_comm_listener *l)
{
    if (l == NULL)
        return;
    if (l->fd >= 0)
        close(l->fd);
    free(l);
}

/* Parses "host:port/SESSION"; GANG_EINVAL for anything malformed. */
static int sock_parse_blob(const uint8_t *blob, size_t len, char *host, uint16_t *port,
                           uint8_t *session)
{
    char buf[SOCK_BLOB_MAX + 1];
    char *slash, *colon, *h;
    int64_t p;
    size_t i, hl;

    if (blob == NULL || len == 0 || len > SOCK_BLOB_MAX || memchr(blob, '\0', len) != NULL)
        return GANG_EINVAL;
    memcpy(buf, blob, len);
    buf[len] = '\0';
    slash = strrchr(buf, '/');
    if (slash == NULL || strlen(slash + 1) != 2 * SOCK_SESSION_LEN)
        return GANG_EINVAL;
    for (i = 0; i < SOCK_SESSION_LEN; i++) {
        int hi = gang_hex_digit(slash[1 + 2 * i]), lo = gang_hex_digit(slash[2 + 2 * i]);

        if (hi < 0 || lo < 0)
            return GANG_EINVAL;
        session[i] = (uint8_t)(hi << 4 | lo);
    }
    *slash = '\0';
    colon = strrchr(buf, ':');
    if (colon == NULL || gang_parse_i64(colon + 1, 1, 65535, &p) < 0)
        return GANG_EINVAL;
    *colon = '\0';
    h = buf;
    hl = strlen(h);
    if (hl >= 2 && h[0] == '[' && h[hl - 1] == ']') {
        h[hl - 1] = '\0';
        h++;
        hl -= 2;
    }
    if (hl == 0 || hl > SOCK_HOST_MAX)
        return GANG_EINVAL;
    memcpy(host, h, hl + 1);
    *port = (uint16_t)p;
    return 0;
}

/* ---------------------------------------------------------------------------------
 * Bootstrap.
 * --------------------------------------------------------------------------------- */
typedef struct sock_addr {
    char host[SOCK_HOST_MAX + 1];
    uint16_t port;
} sock_addr;

/* Encodes a hello into out (SOCK_HELLO_LEN + strlen(host) bytes); returns its length. */
static size_t sock_hello_encode(uint8_t *out, const uint8_t *session, uint32_t rank, uint32_t world,
                                uint16_t port, const char *host)
{
    size_t hl = host != NULL ? strlen(host) : 0;

    put_u32(out, SOCK_MAGIC);
    put_u32(out + 4, SOCK_VERSION);
    memcpy(out + 8, session, SOCK_SESSION_LEN);
    put_u32(out + 24, rank);
    put_u32(out + 28, world);
    put_u32(out + 32, port);
    put_u32(out + 36, (uint32_t)hl);
    if (hl > 0)
        memcpy(out + SOCK_HELLO_LEN, host, hl);
    return SOCK_HELLO_LEN + hl;
}

/*
 * Reads a peer's hello within the handshake limit and judges it. Returns 0 with *status
 * (SOCK_OK or a refusal) and the peer's rank and address; a negative code when the
 * connection itself failed (the caller drops it either way when refused).
 */
static int sock_hello_read(int fd, int abort_fd, uint64_t deadline, const uint8_t *session,
                           uint32_t world, uint32_t *rank, sock_addr *addr, int *status)
{
    uint8_t h[SOCK_HELLO_LEN];
    uint32_t hl;
    int rc;

    deadline = min_u64(deadline, gang_now_ms() + SOCK_HANDSHAKE_MS);
    rc = sock_read_full(fd, h, sizeof(h), abort_fd, deadline);
    if (rc < 0)
        return rc;
    if (get_u32(h) != SOCK_MAGIC)
        return GANG_EPROTO;
    hl = get_u32(h + 36);
    if (hl > SOCK_HOST_MAX)
        return GANG_EPROTO;
    rc = sock_read_full(fd, addr->host, hl, abort_fd, deadline);
    if (rc < 0)
        return rc;
    addr->host[hl] = '\0';
    addr->port = (uint16_t)get_u32(h + 32);
    *rank = get_u32(h + 24);
    if (get_u32(h + 4) != SOCK_VERSION)
        *status = SOCK_REFUSE_VERSION;
    else if (memcmp(h + 8, session, SOCK_SESSION_LEN) != 0)
        *status = SOCK_REFUSE_SESSION;
    else if (get_u32(h + 28) != world)
        *status = SOCK_REFUSE_WORLD;
    else
        *status = SOCK_OK;
    return 0;
}

static int sock_status_to_err(uint32_t status)
{
    switch (status) {
    case SOCK_OK:
        return 0;
    case SOCK_REFUSE_SESSION: /* a blob of another gang or generation */
    case SOCK_REFUSE_VERSION:
    case SOCK_REFUSE_RANK:
        return GANG_EINVAL;
    case SOCK_REFUSE_WORLD:
        return GANG_EMISMATCH;
    case SOCK_REFUSE_DUPLICATE:
        return GANG_EDUPLICATE;
    }
    return GANG_EPROTO;
}

static const char *sock_refusal_name(int status)
{
    switch (status) {
    case SOCK_REFUSE_VERSION:
        return "protocol version";
    case SOCK_REFUSE_SESSION:
        return "session id";
    case SOCK_REFUSE_WORLD:
        return "world size";
    case SOCK_REFUSE_RANK:
        return "rank out of range";
    case SOCK_REFUSE_DUPLICATE:
        return "duplicate rank";
    }
    return "unknown";
}

/*
 * Accepts connections on lfd until every rank in [lo, n) other than self is connected,
 * refusing (and logging) bad hellos without giving up. Fills net->peers[].fd and, when
 * addrs is not NULL, the peers' listener addresses.
 */
static int sock_accept_ranks(sock_net *net, int lfd, uint32_t self, uint32_t lo,
                             const uint8_t *session, uint64_t deadline, sock_addr *addrs)
{
    uint32_t missing = 0, r;
    int rc;

    for (r = lo; r < net->n; r++)
        missing += r != self;
    while (missing > 0) {
        sock_addr a;
        uint8_t st[4];
        uint32_t peer = 0;
        int status = SOCK_OK, fd = -1;

        rc = sock_accept(lfd, net->abort_fd, deadline, &fd);
        if (rc < 0)
            return rc;
        rc = sock_hello_read(fd, net->abort_fd, deadline, session, net->n, &peer, &a, &status);
        if (rc == GANG_EABORTED) {
            close(fd);
            return rc;
        }
        if (rc < 0) {
            gang_warn("comm socket: rank %u dropped a connection during its hello: %s",
                      (unsigned)self, gang_strerror(rc));
            close(fd);
            continue;
        }
        if (status == SOCK_OK && (peer >= net->n || peer < lo || peer == self))
            status = SOCK_REFUSE_RANK;
        if (status == SOCK_OK && net->peers[peer].fd >= 0)
            status = SOCK_REFUSE_DUPLICATE;
        put_u32(st, (uint32_t)status);
        if (status != SOCK_OK) {
            gang_warn("comm socket: rank %u refused a peer claiming rank %u: wrong %s",
                      (unsigned)self, (unsigned)peer, sock_refusal_name(status));
            /* Best effort: the refused peer learns why; we keep serving the others. */
            (void)sock_write_full(fd, st, sizeof(st), net->abort_fd,
                                  min_u64(deadline, gang_now_ms() + 100));
            close(fd);
            continue;
        }
        net->peers[peer].fd = fd;
        if (addrs != NULL)
            addrs[peer] = a;
        missing--;
        /* Mesh connections are acknowledged at once; rank 0 answers with the table later. */
        if (addrs == NULL) {
            rc = sock_write_full(fd, st, sizeof(st), net->abort_fd, deadline);
            if (rc < 0)
                return rc;
        }
    }
    return 0;
}

/* Rank 0: gathers every rank's hello on the listener and sends back the address table. */
static int sock_boot_root(sock_net *net, gang_comm_listener *l, uint64_t deadline)
{
    sock_addr *addrs;
    uint8_t *table, *p;
    uint32_t r;
    int rc;

    addrs = calloc(net->n, sizeof(*addrs));
    table = malloc(4 + (size_t)net->n * (8 + SOCK_HOST_MAX));
    if (addrs == NULL || table == NULL) {
        rc = GANG_ENOMEM;
        goto out_free;
    }
    memcpy(net->session, l->session, SOCK_SESSION_LEN);
    memcpy(addrs[0].host, l->host, strlen(l->host) + 1);
    addrs[0].port = l->port;
    rc = sock_accept_ranks(net, l->fd, 0, 1, l->session, deadline, addrs);
    if (rc < 0)
        goto out_free;
    p = table;
    put_u32(p, SOCK_OK);
    p += 4;
    for (r = 0; r < net->n; r++) {
        size_t hl = strlen(addrs[r].host);

        put_u32(p, addrs[r].port);
        put_u32(p + 4, (uint32_t)hl);
        memcpy(p + 8, addrs[r].host, hl);
        p += 8 + hl;
    }
    for (r = 1; r < net->n; r++) {
        rc = sock_write_full(net->peers[r].fd, table, (size_t)(p - table), net->abort_fd, deadline);
        if (rc < 0)
            goto out_free;
    }
    rc = 0;

out_free:
    free(addrs);
    free(table);
    return rc;
}

/* Sends a hello on fd and reads the 4-byte verdict. */
static int sock_say_hello(sock_net *net, int fd, const uint8_t *session, uint32_t rank,
                          uint16_t port, const char *host, uint64_t deadline)
{
    uint8_t h[SOCK_HELLO_LEN + SOCK_HOST_MAX], st[4];
    size_t len = sock_hello_encode(h, session, rank, net->n, port, host);
    int rc;

    rc = sock_write_full(fd, h, len, net->abort_fd, deadline);
    if (rc < 0)
        return rc;
    rc = sock_read_full(fd, st, sizeof(st), net->abort_fd, deadline);
    if (rc < 0)
        return rc;
    return sock_status_to_err(get_u32(st));
}

/* Rank r > 0: joins through rank 0, then connects to lower ranks and accepts higher ones. */
static int sock_boot_rank(sock_net *net, uint32_t rank, const gang_comm_config *cfg,
                          uint64_t deadline)
{
    char host0[SOCK_HOST_MAX + 1];
    uint8_t session[SOCK_SESSION_LEN], b[8];
    sock_addr *addrs = NULL;
    uint16_t port0, port;
    uint32_t r;
    int lfd = -1, rc;

    rc = sock_parse_blob(cfg->blob, cfg->blob_len, host0, &port0, session);
    if (rc < 0)
        return rc;
    memcpy(net->session, session, SOCK_SESSION_LEN);
    if (cfg->advertise_host == NULL || cfg->advertise_host[0] == '\0' ||
        strlen(cfg->advertise_host) > SOCK_HOST_MAX)
        return GANG_EINVAL;
    addrs = calloc(net->n, sizeof(*addrs));
    if (addrs == NULL)
        return GANG_ENOMEM;
    rc = sock_listen_on(cfg->advertise_host, &lfd, &port);
    if (rc < 0)
        goto out;
    rc = sock_connect(host0, port0, net->abort_fd, deadline, &net->peers[0].fd);
    if (rc < 0)
        goto out;
    rc = sock_say_hello(net, net->peers[0].fd, session, rank, port, cfg->advertise_host, deadline);
    if (rc < 0)
        goto out;
    for (r = 0; r < net->n; r++) {
        uint32_t hl;

        rc = sock_read_full(net->peers[0].fd, b, sizeof(b), net->abort_fd, deadline);
        if (rc < 0)
            goto out;
        hl = get_u32(b + 4);
        if (hl > SOCK_HOST_MAX) {
            rc = GANG_EPROTO;
            goto out;
        }
        rc = sock_read_full(net->peers[0].fd, addrs[r].host, hl, net->abort_fd, deadline);
        if (rc < 0)
            goto out;
        addrs[r].host[hl] = '\0';
        addrs[r].port = (uint16_t)get_u32(b);
    }
    for (r = 1; r < rank; r++) {
        rc = sock_connect(addrs[r].host, addrs[r].port, net->abort_fd, deadline, &net->peers[r].fd);
        if (rc < 0)
            goto out;
        rc = sock_say_hello(net, net->peers[r].fd, session, rank, 0, NULL, deadline);
        if (rc < 0)
            goto out;
    }
    rc = sock_accept_ranks(net, lfd, rank, rank + 1, session, deadline, NULL);

out:
    if (lfd >= 0)
        close(lfd);
    free(addrs);
    return rc;
}

/* Writes the shared-memory object name of the pair (lo, hi) into name (SOCK_SHM_NAME_MAX). */
static void sock_shm_name(const sock_net *net, uint32_t lo, uint32_t hi, char *name)
{
    size_t i, k;

    k = (size_t)snprintf(name, SOCK_SHM_NAME_MAX, "/ganglion-");
    for (i = 0; i < SOCK_SESSION_LEN; i++)
        k += (size_t)snprintf(name + k, SOCK_SHM_NAME_MAX - k, "%02x", net->session[i]);
    snprintf(name + k, SOCK_SHM_NAME_MAX - k, "-%u-%u", (unsigned)lo, (unsigned)hi);
}

/*
 * Creates (create != 0) or opens the pair's shared object and maps it into peer's ring
 * pointers; self < peer decides which ring is ours to write. Returns 0 or a negative
 * code, leaving peer untouched on failure. The creator sizes it (zero-filled, so every
 * counter and flag starts at 0) and reserves its pages.
 */
static int sock_shm_map(sock_net *net, sock_peer *p, uint32_t self, uint32_t peer, int create)
{
    char name[SOCK_SHM_NAME_MAX];
    uint32_t lo = self < peer ? self : peer, hi = self < peer ? peer : self;
    uint8_t *base;
    int fd, rc = 0;

    sock_shm_name(net, lo, hi, name);
    fd = create ? shm_open(name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600)
                : shm_open(name, O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0)
        return gang_err_from_errno(errno);
    if (create && ftruncate(fd, (off_t)SOCK_SHM_LEN) < 0) {
        rc = gang_err_from_errno(errno);
        goto out_fd;
    }
    /*
     * Reserve the pages now: a tmpfs that is too small (a container's 64 MiB /dev/shm)
     * then refuses here and the pair stays on TCP, instead of a SIGBUS at first touch.
     */
    if (create) {
        rc = posix_fallocate(fd, 0, (off_t)SOCK_SHM_LEN);
        if (rc != 0) {
            rc = gang_err_from_errno(rc);
            goto out_fd;
        }
    }
    base = mmap(NULL, SOCK_SHM_LEN, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) {
        rc = gang_err_from_errno(errno);
        goto out_fd;
    }
    p->shm = base;
    /* Ring 0 carries lo -> hi, ring 1 hi -> lo; zero-filled counters are an empty ring. */
    p->tx_ring = (sock_ring *)(void *)(base + (self == lo ? 0 : 128));
    p->rx_ring = (sock_ring *)(void *)(base + (self == lo ? 128 : 0));
    p->tx_data = base + SOCK_RING_HDR + (self == lo ? 0 : SOCK_RING_CAP);
    p->rx_data = base + SOCK_RING_HDR + (self == lo ? SOCK_RING_CAP : 0);
    p->my_sleep = (atomic_int *)(void *)(base + (self == lo ? 256 : 320));
    p->peer_sleep = (atomic_int *)(void *)(base + (self == lo ? 320 : 256));
    p->my_cpu = (atomic_int *)(void *)(base + (self == lo ? 384 : 448));
    p->peer_cpu = (atomic_int *)(void *)(base + (self == lo ? 448 : 384));
    p->bell = 1;
out_fd:
    close(fd);
    if (rc < 0 && create)
        shm_unlink(name);
    return rc;
}

static void sock_shm_unmap(sock_peer *p)
{
    munmap(p->shm, SOCK_SHM_LEN);
    p->shm = NULL;
    p->tx_ring = p->rx_ring = NULL;
    p->tx_data = p->rx_data = NULL;
    p->my_sleep = p->peer_sleep = NULL;
    p->my_cpu = p->peer_cpu = NULL;
}

/*
 * Sets up the shared-memory fast path with every peer that can open our objects (see
 * the block comment before sock_ring). Runs on the fresh data connections before any
 * frame: (1) as the lower rank of a pair, create the object and send 1 byte (1 = made);
 * (2) as the higher rank, read that byte, try to open and map, unlink, answer 1 byte;
 * (3) as the lower rank, read the answer and unlink / unmap when it failed. Steps (1)
 * and (2) never wait on a later step of anyone, so the exchange cannot deadlock. A
 * failure to set up only leaves that pair on TCP; a broken connection is an error.
 */
static int sock_shm_setup(sock_net *net, uint32_t self, uint64_t deadline)
{
    char name[SOCK_SHM_NAME_MAX];
    uint8_t b;
    uint32_t r;
    int rc;

    for (r = self + 1; r < net->n; r++) {
        b = sock_shm_map(net, &net->peers[r], self, r, 1) == 0;
        rc = sock_write_full(net->peers[r].fd, &b, 1, net->abort_fd, deadline);
        if (rc < 0)
            goto out_unlink;
    }
    for (r = 0; r < self; r++) {
        rc = sock_read_full(net->peers[r].fd, &b, 1, net->abort_fd, deadline);
        if (rc < 0)
            goto out_unlink;
        if (b == 1) {
            b = sock_shm_map(net, &net->peers[r], self, r, 0) == 0;
            sock_shm_name(net, r, self, name);
            shm_unlink(name);
        } else {
            b = 0;
        }
        rc = sock_write_full(net->peers[r].fd, &b, 1, net->abort_fd, deadline);
        if (rc < 0)
            goto out_unlink;
    }
    /* Every higher peer answers, even to a 0, so the stream stays in step. */
    for (r = self + 1; r < net->n; r++) {
        rc = sock_read_full(net->peers[r].fd, &b, 1, net->abort_fd, deadline);
        if (rc < 0)
            goto out_unlink;
        if (b != 1 && net->peers[r].shm != NULL) {
            sock_shm_name(net, self, r, name);
            shm_unlink(name);
            sock_shm_unmap(&net->peers[r]);
        }
    }
    for (r = 0; r < net->n; r++)
        net->shm_peers += net->peers[r].shm != NULL;
    return 0;

out_unlink:
    /* Objects we created may still be named; the mappings go with the net. */
    for (r = self + 1; r < net->n; r++) {
        if (net->peers[r].shm != NULL) {
            sock_shm_name(net, self, r, name);
            shm_unlink(name);
        }
    }
    return rc;
}

static void sock_net_unref(sock_net *net)
{
    uint32_t r;

    if (net == NULL || atomic_fetch_sub(&net->refs, 1) != 1)
        return;
    for (r = 0; net->peers != NULL && r < net->n; r++) {
        sock_peer *p = &net->peers[r];

        while (p->uq_head != NULL) {
            sock_msg *m = p->uq_head;

            p->uq_head = m->next;
            free(m);
        }
        free(p->rx_msg);
        if (p->shm != NULL)
            munmap(p->shm, SOCK_SHM_LEN);
        if (p->fd >= 0)
            close(p->fd);
    }
    if (net->abort_fd >= 0)
        close(net->abort_fd);
    free(net->peers);
    free(net->pfds);
    free(net->pmap);
    free(net);
}

static void sock_comm_destroy(sock_comm *sc)
{
    if (sc == NULL)
        return;
    sock_net_unref(sc->net);
    free(sc->world_of);
    free(sc->send_seq);
    free(sc->recv_seq);
    free(sc->scratch);
    free(sc->ops);
    free(sc);
}

/* Allocates a communicator's state for n ranks over net (taking a reference). */
static sock_comm *sock_comm_new(sock_net *net, uint32_t n, uint64_t comm_id)
{
    sock_comm *sc = calloc(1, sizeof(*sc));

    if (sc == NULL)
        return NULL;
    sc->world_of = calloc(n, sizeof(*sc->world_of));
    sc->send_seq = calloc(n, sizeof(*sc->send_seq));
    sc->recv_seq = calloc(n, sizeof(*sc->recv_seq));
    if (sc->world_of == NULL || sc->send_seq == NULL || sc->recv_seq == NULL) {
        free(sc->world_of);
        free(sc->send_seq);
        free(sc->recv_seq);
        free(sc);
        return NULL;
    }
    atomic_fetch_add(&net->refs, 1);
    sc->net = net;
    sc->comm_id = comm_id;
    return sc;
}

/*
 * Builds the full mesh (see the protocol comment at the top of the file). Rank 0's
 * listener is consumed on every outcome.
 */
static int sock_init(gang_comm *c, const gang_comm_config *cfg)
{
    uint64_t deadline = sock_deadline(cfg->timeout_ms);
    sock_net *net;
    sock_comm *sc;
    uint32_t r;
    int rc;

    if (cfg->rank == 0 && cfg->listener == NULL && cfg->world_size > 1) {
        rc = GANG_EINVAL;
        goto out_listener;
    }
    net = calloc(1, sizeof(*net));
    if (net == NULL) {
        rc = GANG_ENOMEM;
        goto out_listener;
    }
    atomic_init(&net->refs, 1);
    atomic_init(&net->aborted, 0);
    atomic_init(&net->error, 0);
    net->n = cfg->world_size;
    net->abort_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    net->peers = calloc(net->n, sizeof(*net->peers));
    net->pfds = calloc((size_t)net->n + 1, sizeof(*net->pfds));
    net->pmap = calloc((size_t)net->n + 1, sizeof(*net->pmap));
    if (net->peers != NULL) {
        for (r = 0; r < net->n; r++)
            net->peers[r].fd = -1;
    }
    if (net->abort_fd < 0 || net->peers == NULL || net->pfds == NULL || net->pmap == NULL) {
        rc = net->abort_fd < 0 ? gang_err_from_errno(errno) : GANG_ENOMEM;
        goto out_net;
    }
    /* While booting, every wait watches the caller's cancel fd instead of the
     * communicator's own abort eventfd (nobody can abort a communicator that does not
     * exist yet); the own one is put back before anything can close it. */
    int own_abort_fd = net->abort_fd;
    if (cfg->cancel_fd != NULL)
        net->abort_fd = *cfg->cancel_fd;
    if (cfg->rank == 0)
        rc = net->n > 1 ? sock_boot_root(net, cfg->listener, deadline) : 0;
    else
        rc = sock_boot_rank(net, cfg->rank, cfg, deadline);
    if (rc == 0 && net->n > 1)
        rc = sock_shm_setup(net, cfg->rank, deadline);
    net->abort_fd = own_abort_fd;
    if (rc < 0)
        goto out_net;
    sc = sock_comm_new(net, net->n, 0);
    if (sc == NULL) {
        rc = GANG_ENOMEM;
        goto out_net;
    }
    for (r = 0; r < net->n; r++)
        sc->world_of[r] = r;
    sock_net_unref(net); /* sc holds the reference now */
    c->impl = sc;
    gang_comm_listener_free(cfg->listener);
    return 0;

out_net:
    sock_net_unref(net);
out_listener:
    gang_comm_listener_free(cfg->listener);
    return rc;
}

static void sock_free(gang_comm *c)
{
    sock_comm_destroy(c->impl);
    c->impl = NULL;
}

static void sock_abort(gang_comm *c)
{
    sock_comm *sc = c->impl;
    uint64_t one = 1;

    if (sc == NULL)
        return;
    atomic_store(&sc->net->aborted, 1);
    /* The eventfd stays readable, so every later poll() wakes at once as well. */
    if (write(sc->net->abort_fd, &one, sizeof(one)) < 0) {
        /* Only EAGAIN (counter saturated) is possible, and then it is readable already. */
    }
}

/* ---------------------------------------------------------------------------------
 * Shared-memory rings (protocol in the block comment before sock_ring).
 * --------------------------------------------------------------------------------- */

/*
 * Copies up to len bytes into the ring without blocking and publishes them; returns the
 * count (0: full). Everything that fits goes in one copy: measured on a 2-core VM, cutting
 * the copies into 32-256 KiB segments that the reader picks up while the writer is still
 * copying made all-reduce 1.3-1.7x slower at 1-16 MiB (cache lines bounce between the
 * two cores while both work on them; a finished copy is read from the shared cache).
 */
static size_t sock_ring_write(sock_ring *rg, uint8_t *data, const uint8_t *src, size_t len)
{
    uint64_t head = atomic_load_explicit(&rg->head, memory_order_relaxed);
    uint64_t tail = atomic_load_explicit(&rg->tail, memory_order_acquire);
    uint64_t space = SOCK_RING_CAP - (head - tail);
    size_t n = len < space ? len : (size_t)space, at = (size_t)(head % SOCK_RING_CAP), first;

    if (n == 0)
        return 0;
    first = n < SOCK_RING_CAP - at ? n : (size_t)(SOCK_RING_CAP - at);
    memcpy(data + at, src, first);
    memcpy(data, src + first, n - first);
    atomic_store_explicit(&rg->head, head + n, memory_order_release);
    return n;
}

/* Copies up to len bytes out of the ring without blocking; returns the count (0: empty). */
static size_t sock_ring_read(sock_ring *rg, const uint8_t *data, uint8_t *dst, size_t len)
{
    uint64_t tail = atomic_load_explicit(&rg->tail, memory_order_relaxed);
    uint64_t head = atomic_load_explicit(&rg->head, memory_order_acquire);
    uint64_t avail = head - tail;
    size_t n = len < avail ? len : (size_t)avail, at = (size_t)(tail % SOCK_RING_CAP), first;

    if (n == 0)
        return 0;
    first = n < SOCK_RING_CAP - at ? n : (size_t)(SOCK_RING_CAP - at);
    memcpy(dst, data + at, first);
    memcpy(dst + first, data, n - first);
    atomic_store_explicit(&rg->tail, tail + n, memory_order_release);
    return n;
}

/*
 * Sums up to len bytes (whole elements of dt; len is a multiple of the element size) from
 * the ring into dst without blocking, reading them in place instead of copying them out
 * first, then hands the space back; returns the bytes consumed (0: not one element has
 * arrived). dst must be aligned for dt. Ring bytes sit at any offset (a point-to-point
 * frame may have an odd length), so when the elements are misaligned they go through a
 * small bounce buffer instead.
 */
static size_t sock_ring_reduce(sock_ring *rg, const uint8_t *data, uint8_t *dst, size_t len,
                               gang_dtype dt)
{
    uint64_t tail = atomic_load_explicit(&rg->tail, memory_order_relaxed);
    uint64_t head = atomic_load_explicit(&rg->head, memory_order_acquire);
    uint64_t avail = head - tail;
    size_t esz = gang_dtype_size(dt), at = (size_t)(tail % SOCK_RING_CAP), n, first;
    _Alignas(64) uint8_t bounce[SOCK_BOUNCE];

    n = len < avail ? len : (size_t)avail;
    if (((uintptr_t)(data + at)) % esz != 0 && n > sizeof(bounce))
        n = sizeof(bounce);
    n -= n % esz;
    if (n == 0)
        return 0;
    first = n < SOCK_RING_CAP - at ? n : (size_t)(SOCK_RING_CAP - at);
    if (((uintptr_t)(data + at)) % esz == 0) {
        /* The capacity is a multiple of every element size: no element straddles the wrap. */
        gang__comm_reduce_sum(dst, data + at, first / esz, dt);
        gang__comm_reduce_sum(dst + first, data, (n - first) / esz, dt);
    } else {
        memcpy(bounce, data + at, first);
        memcpy(bounce + first, data, n - first);
        gang__comm_reduce_sum(dst, bounce, n / esz, dt);
    }
    atomic_store_explicit(&rg->tail, tail + n, memory_order_release);
    return n;
}

/* Whether peer's incoming ring holds unread bytes (0 for a TCP peer). */
static int sock_shm_readable(const sock_peer *p)
{
    if (p->shm == NULL)
        return 0;
    return atomic_load_explicit(&p->rx_ring->head, memory_order_acquire) !=
           atomic_load_explicit(&p->rx_ring->tail, memory_order_relaxed);
}

/* Sends a one-byte doorbell; a full socket buffer already holds unread doorbells. */
static void sock_shm_ring_bell(sock_peer *p)
{
    uint8_t b = 1;

    if (send(p->fd, &b, 1, MSG_DONTWAIT | MSG_NOSIGNAL) < 0) {
        /* EAGAIN: the peer has doorbells to read; other errors show as EOF on a drain. */
    }
}

/* Reads every pending doorbell without blocking; EOF or an error marks the peer gone. */
static void sock_shm_drain(sock_peer *p)
{
    uint8_t buf[256];

    for (;;) {
        ssize_t n = recv(p->fd, buf, sizeof(buf), MSG_DONTWAIT);

        if (n > 0 && (size_t)n == sizeof(buf))
            continue;
        if (n > 0)
            return;
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return;
        p->eof = 1;
        return;
    }
}

/*
 * Reads up to want bytes from peer without blocking: recv()'s contract for both paths.
 * When op is a reducing recv (only ever on a shared-memory peer), the bytes are summed
 * into dst straight from the ring instead.
 */
static ssize_t sock_peer_recv(sock_peer *p, const sock_op *op, void *dst, size_t want)
{
    size_t n;

    if (p->shm == NULL)
        return recv(p->fd, dst, want, MSG_DONTWAIT);
    if (op != NULL && op->reduce)
        n = sock_ring_reduce(p->rx_ring, p->rx_data, dst, want, op->dt);
    else
        n = sock_ring_read(p->rx_ring, p->rx_data, dst, want);
    if (n == 0) {
        errno = EAGAIN;
        return -1;
    }
    return (ssize_t)n;
}

/* ---------------------------------------------------------------------------------
 * The progress engine: moves a set of sends and recvs forward in one poll() loop.
 * --------------------------------------------------------------------------------- */
static void sock_op_send(sock_op *op, uint32_t peer, uint64_t comm_id, uint32_t kind, uint32_t tag,
                         const void *buf, size_t len)
{
    memset(op, 0, sizeof(*op));
    op->is_send = 1;
    op->peer = peer;
    op->comm_id = comm_id;
    op->kind = kind;
    op->tag = tag;
    op->buf = (uint8_t *)(uintptr_t)buf; /* only read: the op type serves both directions */
    op->len = len;
    put_u64(op->hdr, comm_id);
    put_u32(op->hdr + 8, kind);
    put_u32(op->hdr + 12, tag);
    put_u64(op->hdr + 16, len);
}

static void sock_op_recv(sock_op *op, uint32_t peer, uint64_t comm_id, uint32_t kind, uint32_t tag,
                         void *buf, size_t len)
{
    memset(op, 0, sizeof(*op));
    op->peer = peer;
    op->comm_id = comm_id;
    op->kind = kind;
    op->tag = tag;
    op->buf = buf;
    op->len = len;
}

/* Removes and returns the first queued message of (comm_id, kind, tag), or NULL. */
static sock_msg *sock_uq_take(sock_peer *p, uint64_t comm_id, uint32_t kind, uint32_t tag)
{
    sock_msg *m, *prev = NULL;

    for (m = p->uq_head; m != NULL; prev = m, m = m->next) {
        if (m->comm_id != comm_id || m->kind != kind || m->tag != tag)
            continue;
        if (prev != NULL)
            prev->next = m->next;
        else
            p->uq_head = m->next;
        if (p->uq_tail == m)
            p->uq_tail = prev;
        return m;
    }
    return NULL;
}

static int sock_peer_needed(const sock_op *ops, size_t nops, uint32_t peer)
{
    size_t i;

    for (i = 0; i < nops; i++) {
        if (!ops[i].complete && ops[i].peer == peer)
            return 1;
    }
    return 0;
}

/* Decodes a complete header: claims the waiting recv it matches or starts a stash. */
static int sock_rx_header(sock_peer *p, uint32_t peer, sock_op *ops, size_t nops)
{
    uint64_t comm_id = get_u64(p->rx_hdr), len = get_u64(p->rx_hdr + 16);
    uint32_t kind = get_u32(p->rx_hdr + 8), tag = get_u32(p->rx_hdr + 12);
    size_t i;

    if (len > SOCK_MAX_MSG)
        return GANG_EPROTO;
    p->rx_len = (size_t)len;
    p->rx_got = 0;
    p->rx_op = NULL;
    for (i = 0; i < nops; i++) {
        sock_op *op = &ops[i];

        if (op->is_send || op->complete || op->claimed || op->peer != peer ||
            op->comm_id != comm_id || op->kind != kind || op->tag != tag)
            continue;
        if (op->len != len)
            return GANG_EPROTO;
        op->claimed = 1;
        p->rx_op = op;
        p->rx_dst = op->buf;
        return 0;
    }
    p->rx_msg = malloc(sizeof(*p->rx_msg) + p->rx_len);
    if (p->rx_msg == NULL)
        return GANG_ENOMEM;
    p->rx_msg->next = NULL;
    p->rx_msg->comm_id = comm_id;
    p->rx_msg->kind = kind;
    p->rx_msg->tag = tag;
    p->rx_msg->len = p->rx_len;
    p->rx_dst = p->rx_msg->data;
    return 0;
}

/*
 * Reads what peer has sent, as far as it goes without blocking: headers are matched
 * against the waiting recvs of this call; other messages go to the peer's queue. It
 * returns after a stashed message completes so that the caller matches the queue before
 * any later message (keeping per-tag order), and after the last recv from this peer
 * completes so that the stream is left at a message boundary.
 */
static int sock_rx(sock_net *net, uint32_t peer, sock_op *ops, size_t nops)
{
    sock_peer *p = &net->peers[peer];
    size_t i;
    int rc;

    for (;;) {
        int in_hdr = p->rx_hdr_got < SOCK_HDR_LEN;
        size_t want = in_hdr ? SOCK_HDR_LEN - p->rx_hdr_got : p->rx_len - p->rx_got;

        if (want > 0) {
            uint8_t *dst = in_hdr ? p->rx_hdr + p->rx_hdr_got : p->rx_dst + p->rx_got;
            ssize_t n = sock_peer_recv(p, in_hdr ? NULL : p->rx_op, dst, want);

            if (n < 0 && errno == EINTR)
                continue;
            if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
                return 0;
            if (n <= 0) {
                /* The peer is gone; that is an error only if this call needs it. */
                p->eof = 1;
                return sock_peer_needed(ops, nops, peer) ? GANG_EPEER : 0;
            }
            if (in_hdr) {
                p->rx_hdr_got += (size_t)n;
                if (p->rx_hdr_got == SOCK_HDR_LEN) {
                    rc = sock_rx_header(p, peer, ops, nops);
                    if (rc < 0)
                        return rc;
                }
                continue;
            }
            p->rx_got += (size_t)n;
            if (p->rx_op != NULL)
                p->rx_op->done = p->rx_got; /* a send with this src may forward them */
            if (p->rx_got < p->rx_len)
                continue;
        }
        /* A whole message is in. */
        p->rx_hdr_got = 0;
        if (p->rx_op != NULL) {
            p->rx_op->done = p->rx_op->len;
            p->rx_op->complete = 1;
            p->rx_op = NULL;
            for (i = 0; i < nops; i++) {
                if (!ops[i].is_send && !ops[i].complete && ops[i].peer == peer)
                    break;
            }
            if (i == nops)
                return 0;
            continue;
        }
        if (p->uq_tail != NULL)
            p->uq_tail->next = p->rx_msg;
        else
            p->uq_head = p->rx_msg;
        p->uq_tail = p->rx_msg;
        p->rx_msg = NULL;
        return 0;
    }
}

/*
 * Writes op (header then payload) into the peer's ring without blocking, with at most
 * one copy of payload per call (what fits): when the ring is full, the caller reads what
 * has arrived before it copies more, so a send larger than the ring and the receive it
 * overlaps with advance together. A send with a src recv writes only what that recv has
 * already delivered (the pipelined all-reduce).
 */
static void sock_tx_shm(sock_peer *p, sock_op *op)
{
    while (!op->complete) {
        size_t n;
        int payload = op->hdr_done == SOCK_HDR_LEN;

        if (!payload) {
            n = sock_ring_write(p->tx_ring, p->tx_data, op->hdr + op->hdr_done,
                                SOCK_HDR_LEN - op->hdr_done);
            op->hdr_done += n;
        } else {
            size_t ready = op->src != NULL ? op->src->done : op->len;

            n = sock_ring_write(p->tx_ring, p->tx_data, op->buf + op->done, ready - op->done);
            op->done += n;
        }
        if (op->hdr_done == SOCK_HDR_LEN && op->done == op->len)
            op->complete = 1;
        else if (n == 0 || payload)
            return;
    }
}

/* Writes op (header then payload) as far as it goes without blocking. */
static int sock_tx(sock_net *net, sock_op *op)
{
    int fd = net->peers[op->peer].fd;

    if (net->peers[op->peer].shm != NULL) {
        sock_tx_shm(&net->peers[op->peer], op);
        return 0;
    }
    while (!op->complete) {
        struct iovec iov[2];
        struct msghdr mh;
        ssize_t n;

        memset(&mh, 0, sizeof(mh));
        iov[0].iov_base = op->hdr + op->hdr_done;
        iov[0].iov_len = SOCK_HDR_LEN - op->hdr_done;
        iov[1].iov_base = op->buf + op->done;
        iov[1].iov_len = op->len - op->done;
        mh.msg_iov = iov[0].iov_len > 0 ? iov : iov + 1;
        mh.msg_iovlen = iov[0].iov_len > 0 ? 2 : 1;
        n = sendmsg(fd, &mh, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                return 0;
            net->peers[op->peer].eof = 1;
            return GANG_EPEER;
        }
        if ((size_t)n < iov[0].iov_len) {
            op->hdr_done += (size_t)n;
            continue;
        }
        n -= (ssize_t)iov[0].iov_len;
        op->hdr_done = SOCK_HDR_LEN;
        op->done += (size_t)n;
        if (op->done == op->len)
            op->complete = 1;
    }
    return 0;
}

/* Records err on the shared connections: from now on every communicator of the family fails. */
static int sock_poison(sock_net *net, int err)
{
    int expected = 0;

    atomic_compare_exchange_strong(&net->error, &expected, err);
    return err;
}

static int sock_check_net(sock_net *net)
{
    int err = atomic_load(&net->error);

    if (atomic_load(&net->aborted))
        return GANG_EABORTED;
    return err;
}

/*
 * Moves peer r's rings forward without blocking when it is a shared-memory peer: drains
 * its doorbells when poll() saw some (and so notices EOF), reads what has arrived, writes
 * the first unfinished send to it, and rings when a counter moved and the peer may sleep.
 * Sets *moved then.
 */
static int sock_shm_step(sock_net *net, uint32_t r, sock_op *ops, size_t nops, int *moved)
{
    sock_peer *p = &net->peers[r];
    uint64_t tail, head;
    size_t k;
    int rc;

    if (p->shm == NULL)
        return 0;
    if (p->bell && !p->eof)
        sock_shm_drain(p);
    p->bell = 0;
    tail = atomic_load_explicit(&p->rx_ring->tail, memory_order_relaxed);
    head = atomic_load_explicit(&p->tx_ring->head, memory_order_relaxed);
    rc = sock_rx(net, r, ops, nops);
    if (rc < 0)
        return rc;
    for (k = 0; k < nops; k++) {
        if (ops[k].is_send && !ops[k].complete && ops[k].peer == r)
            break;
    }
    if (k < nops && !p->eof)
        sock_tx_shm(p, &ops[k]);
    if (tail != atomic_load_explicit(&p->rx_ring->tail, memory_order_relaxed) ||
        head != atomic_load_explicit(&p->tx_ring->head, memory_order_relaxed)) {
        *moved = 1;
        atomic_thread_fence(memory_order_seq_cst);
        if (!p->eof && atomic_load_explicit(p->peer_sleep, memory_order_relaxed))
            sock_shm_ring_bell(p);
    }
    return 0;
}

/* Sets or clears our sleep flag towards every shared-memory peer (see sock_ring). */
static void sock_shm_sleep_flags(sock_net *net, int on)
{
    uint32_t r;

    for (r = 0; r < net->n; r++) {
        if (net->peers[r].shm != NULL)
            atomic_store_explicit(net->peers[r].my_sleep, on, memory_order_relaxed);
    }
    atomic_thread_fence(memory_order_seq_cst);
}

/* Tells the core we are spinning (spares the sibling hardware thread and power). */
static void sock_cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/*
 * Publishes cpu (from sched_getcpu(), negative when unknown) to every shared-memory peer
 * and returns whether a peer that ops still wait on last waited on that same CPU: it is
 * then queued behind us, and spinning would only delay it.
 */
static int sock_shm_cpu_shared(sock_net *net, const sock_op *ops, size_t nops, int cpu)
{
    size_t i;
    uint32_t r;
    int shared = 0;

    for (r = 0; r < net->n; r++) {
        if (net->peers[r].shm != NULL)
            atomic_store_explicit(net->peers[r].my_cpu, cpu + 1, memory_order_relaxed);
    }
    for (i = 0; i < nops && cpu >= 0 && !shared; i++) {
        const sock_peer *p = &net->peers[ops[i].peer];

        shared = !ops[i].complete && p->shm != NULL &&
                 atomic_load_explicit(p->peer_cpu, memory_order_relaxed) == cpu + 1;
    }
    return shared;
}

/*
 * Runs ops (the sends and recvs of one step, or of a whole pipelined all-reduce) to
 * completion before deadline. Every connected peer is read while waiting, so that nothing
 * a peer sends can block it behind us; sends to one peer go out in array order, since they
 * share one byte stream.
 *
 * Waiting has four gears. (1) While a shared-memory peer moves, go round at once. (2)
 * While only shared-memory peers are awaited, keep looking at their rings without any
 * system call for SOCK_SPIN_US after the last progress: a ping-pong of small messages then
 * never pays a poll() wake-up (tens of microseconds on a VM, milliseconds when the cores
 * are busy with other work). (3) Then keep looking but call sched_yield() between looks
 * until SOCK_YIELD_US after the last progress, so that other work gets the core whenever
 * it wants it. A peer that last waited on our own CPU (the CPU words in the control page)
 * is queued behind us: then gear (3) starts at once, the peer runs now instead of after
 * our time slice (this is what decides the speed when ranks outnumber the idle cores).
 * The abort flag is checked on every round, and the deadline too, so both stay prompt.
 * (4) Then raise the sleep flags (see sock_ring) and sleep in poll() on the sockets, the
 * doorbells, the abort eventfd and the deadline. A waiting rank so burns at most
 * SOCK_YIELD_US of CPU, and yields it to anyone else after SOCK_SPIN_US. TCP peers are
 * only seen through poll(), so while one is awaited every round polls, with a zero
 * timeout, and gear (4) starts after SOCK_SPIN_US.
 */
static int sock_progress(sock_comm *sc, sock_op *ops, size_t nops, uint64_t deadline)
{
    sock_net *net = sc->net;
    struct pollfd *pfds = net->pfds;
    uint32_t *pmap = net->pmap, r;
    uint64_t now_us = gang_now_ns() / 1000, last_move = now_us, idle;
    size_t i, np;
    int rc, armed = 0;

    for (;;) {
        size_t pending = 0;
        int moved = 0, shm_wait = 0, tcp_wait = 0;

        rc = sock_check_net(net);
        if (rc < 0)
            goto out;
        for (r = 0; r < net->n; r++) {
            rc = sock_shm_step(net, r, ops, nops, &moved);
            if (rc < 0)
                goto out_poison;
        }
        for (i = 0; i < nops; i++) {
            sock_op *op = &ops[i];
            sock_msg *m;

            if (op->complete)
                continue;
            if (!op->is_send && !op->claimed) {
                m = sock_uq_take(&net->peers[op->peer], op->comm_id, op->kind, op->tag);
                if (m != NULL) {
                    rc = m->len == op->len ? 0 : GANG_EPROTO;
                    if (rc == 0 && op->reduce)
                        gang__comm_reduce_sum(op->buf, m->data, m->len / gang_dtype_size(op->dt), op->dt);
                    else if (rc == 0 && m->len > 0)
                        memcpy(op->buf, m->data, m->len);
                    free(m);
                    if (rc < 0)
                        goto out_poison;
                    op->done = op->len;
                    op->complete = 1;
                    continue;
                }
            }
            /* A gone shared-memory peer may have left its last bytes in the ring. */
            if (net->peers[op->peer].eof &&
                (op->is_send || !sock_shm_readable(&net->peers[op->peer]))) {
                rc = GANG_EPEER;
                goto out_poison;
            }
            if (net->peers[op->peer].shm != NULL)
                shm_wait = 1;
            else
                tcp_wait = 1;
            pending++;
        }
        if (pending == 0) {
            rc = 0;
            goto out;
        }
        /* One clock read a round: the deadline is in milliseconds of the same clock. */
        now_us = gang_now_ns() / 1000;
        if (now_us / 1000 >= deadline) {
            rc = GANG_ETIMEDOUT;
            goto out_poison;
        }
        if (moved) {
            last_move = now_us;
            if (armed)
                sock_shm_sleep_flags(net, 0);
            armed = 0;
        }
        idle = now_us - last_move;
        if (shm_wait && !tcp_wait && !armed && idle < SOCK_YIELD_US) {
            if (moved)
                continue; /* gear (1) */
            if (idle >= SOCK_SPIN_US || sock_shm_cpu_shared(net, ops, nops, sched_getcpu()))
                sched_yield(); /* gear (3) */
            else
                sock_cpu_relax(); /* gear (2) */
            continue;
        }
        if (!moved && !armed && net->shm_peers > 0 &&
            (!shm_wait || idle >= (tcp_wait ? SOCK_SPIN_US : SOCK_YIELD_US))) {
            /*
             * About to sleep: raise the flags, then look at the rings once more first. Also
             * when only TCP peers are awaited, so that a shared-memory peer that sends us
             * something unexpected wakes us to drain it, as its socket would.
             */
            sock_shm_sleep_flags(net, 1);
            armed = 1;
            moved = 1;
        }
        pfds[0].fd = net->abort_fd;
        pfds[0].events = POLLIN;
        pfds[0].revents = 0;
        np = 1;
        for (r = 0; r < net->n; r++) {
            sock_peer *p = &net->peers[r];

            if (p->fd < 0 || p->eof)
                continue;
            pfds[np].fd = p->fd;
            pfds[np].events = POLLIN; /* data, or a shared-memory peer's doorbell */
            pfds[np].revents = 0;
            for (i = 0; i < nops && p->shm == NULL; i++) {
                if (ops[i].is_send && !ops[i].complete && ops[i].peer == r)
                    pfds[np].events |= POLLOUT;
            }
            pmap[np++] = r;
        }
        rc = poll(pfds, (nfds_t)np, moved || (shm_wait && !armed) ? 0 : sock_poll_ms(deadline));
        if (rc < 0 && errno == EINTR)
            continue;
        if (rc < 0) {
            rc = gang_err_from_errno(errno);
            goto out_poison;
        }
        if (pfds[0].revents) {
            rc = GANG_EABORTED;
            goto out_poison;
        }
        for (i = 1; i < np; i++) {
            short ev = pfds[i].revents;

            r = pmap[i];
            if (ev != 0 && net->peers[r].shm != NULL)
                net->peers[r].bell = 1;
            if (ev == 0 || net->peers[r].shm != NULL)
                continue; /* shared-memory peers move at the top of the loop */
            if (ev & (POLLIN | POLLHUP | POLLERR)) {
                rc = sock_rx(net, r, ops, nops);
                if (rc < 0)
                    goto out_poison;
            }
            if ((ev & (POLLOUT | POLLERR | POLLHUP)) && !net->peers[r].eof) {
                size_t k;

                for (k = 0; k < nops; k++) {
                    if (ops[k].is_send && !ops[k].complete && ops[k].peer == r)
                        break;
                }
                if (k < nops) {
                    rc = sock_tx(net, &ops[k]);
                    if (rc < 0)
                        goto out_poison;
                }
            }
        }
    }

out_poison:
    sock_poison(net, rc);
out:
    if (armed)
        sock_shm_sleep_flags(net, 0);
    return rc;
}

/* ---------------------------------------------------------------------------------
 * Operations.
 * --------------------------------------------------------------------------------- */
static void sock_coll_send(sock_comm *sc, sock_op *op, uint32_t to, const void *buf, size_t len)
{
    sock_op_send(op, sc->world_of[to], sc->comm_id, SOCK_KIND_COLL, sc->send_seq[to]++, buf, len);
}

static void sock_coll_recv(sock_comm *sc, sock_op *op, uint32_t from, void *buf, size_t len)
{
    sock_op_recv(op, sc->world_of[from], sc->comm_id, SOCK_KIND_COLL, sc->recv_seq[from]++, buf,
                 len);
}

/* Element offset and length of chunk i when count elements are cut into n chunks. */
static void sock_chunk(size_t count, uint32_t n, uint32_t i, size_t *off, size_t *len)
{
    size_t base = count / n, extra = count % n;

    *off = (size_t)i * base + (i < extra ? i : extra);
    *len = base + (i < extra ? 1 : 0);
}

/*
 * Ring all-reduce (NCCL's ring, done by hand). The buffer is cut into n chunks; rank r
 * sends to r+1 and receives from r-1.
 *
 *   reduce-scatter, step s = 0..n-2: send chunk (r-s) to next, receive chunk (r-s-1)
 *     from prev and add it into place. After step s, the chunk received holds s+2
 *     contributions, so after n-1 steps rank r owns chunk (r+1) fully reduced.
 *   all-gather, step s = 0..n-2: send chunk (r+1-s) to next, receive chunk (r-s) from
 *     prev straight into place.
 *
 * Each rank moves 2(n-1)/n of the buffer each way, whatever n is (the bus-bandwidth
 * factor of nccl-tests). Each step writes and reads in one poll loop (full duplex), so
 * large chunks cannot deadlock on full socket buffers. Tiny counts leave some chunks
 * empty; their zero-length frames still keep the steps in lockstep, so one algorithm
 * serves every size. f16/bf16 are rounded once per step (n-1 roundings per element).
 *
 * When prev is a shared-memory peer, the reduce-scatter receives are reducing recvs: the
 * chunk is summed into place straight from the ring (as much as has arrived each time)
 * instead of being copied into a scratch chunk and summed afterwards. That saves a copy
 * of every received chunk; over shared memory a step then costs one copy in (the send)
 * and one pass over the ring (the sum). Over TCP the chunk still lands in the scratch
 * buffer first.
 *
 * When prev and next are both shared-memory peers, all 2(n-1) steps run as one pipeline
 * in a single progress call (sock_all_reduce_shm): every send but the first forwards the
 * chunk the previous step's recv fills, so it is posted with that recv as its src and
 * forwards what has been summed or received so far, instead of waiting for the whole
 * step (and the peer for it) to finish: one wait for the whole operation, not 2(n-1).
 * The steps' frames keep their order and sequence numbers, so the result and the
 * rounding are those of the ring above.
 * Overwriting is safe by causality: the all-gather recv of chunk (r-s) brings values
 * that include the bytes our reduce-scatter send of the same chunk carried, so those had
 * been read before; and no send reads a chunk a later recv of the call fills except
 * through its src.
 */
static int sock_all_reduce_shm(sock_comm *sc, uint32_t n, uint32_t r, uint8_t *b, size_t count,
                               gang_dtype dt, uint64_t deadline)
{
    size_t esz = gang_dtype_size(dt), off, len, roff, rlen, k = 0;
    uint32_t next = (r + 1) % n, prev = (r + n - 1) % n, s;
    sock_op *ops;

    if (sc->ops == NULL) {
        sc->ops = calloc(4 * (size_t)(n - 1), sizeof(*sc->ops));
        if (sc->ops == NULL)
            return GANG_ENOMEM;
    }
    ops = sc->ops;
    for (s = 0; s + 1 < n; s++, k += 2) {
        sock_chunk(count, n, (r + n - s) % n, &off, &len);
        sock_chunk(count, n, (r + 2 * n - s - 1) % n, &roff, &rlen);
        sock_coll_send(sc, &ops[k], next, b + off * esz, len * esz);
        sock_coll_recv(sc, &ops[k + 1], prev, b + roff * esz, rlen * esz);
        ops[k].src = k > 0 ? &ops[k - 1] : NULL;
        ops[k + 1].reduce = 1;
        ops[k + 1].dt = dt;
    }
    for (s = 0; s + 1 < n; s++, k += 2) {
        sock_chunk(count, n, (r + 1 + n - s) % n, &off, &len);
        sock_chunk(count, n, (r + n - s) % n, &roff, &rlen);
        sock_coll_send(sc, &ops[k], next, b + off * esz, len * esz);
        sock_coll_recv(sc, &ops[k + 1], prev, b + roff * esz, rlen * esz);
        ops[k].src = &ops[k - 1];
    }
    return sock_progress(sc, ops, k, deadline);
}

/* The ring all-reduce above: pipelined over shared memory, else step by step. */
static int sock_all_reduce(gang_comm *c, void *buf, size_t count, gang_dtype dt, uint64_t tmo)
{
    sock_comm *sc = c->impl;
    uint64_t deadline = sock_deadline(tmo);
    size_t esz = gang_dtype_size(dt), off, len, roff, rlen;
    uint32_t n = c->size, r = c->rank, next, prev, s;
    uint8_t *b = buf;
    sock_op ops[2];
    int rc, direct;

    if (n == 1)
        return 0;
    next = (r + 1) % n;
    prev = (r + n - 1) % n;
    direct = sc->net->peers[sc->world_of[prev]].shm != NULL;
    if (direct && sc->net->peers[sc->world_of[next]].shm != NULL)
        return sock_all_reduce_shm(sc, n, r, buf, count, dt, deadline);
    sock_chunk(count, n, 0, &off, &len); /* chunk 0 is the largest */
    if (!direct && sc->scratch_cap < len * esz) {
        uint8_t *p = realloc(sc->scratch, len * esz);

        if (p == NULL)
            return GANG_ENOMEM;
        sc->scratch = p;
        sc->scratch_cap = len * esz;
    }
    for (s = 0; s + 1 < n; s++) {
        sock_chunk(count, n, (r + n - s) % n, &off, &len);
        sock_chunk(count, n, (r + 2 * n - s - 1) % n, &roff, &rlen);
        sock_coll_send(sc, &ops[0], next, b + off * esz, len * esz);
        sock_coll_recv(sc, &ops[1], prev, direct ? b + roff * esz : sc->scratch, rlen * esz);
        ops[1].reduce = direct;
        ops[1].dt = dt;
        rc = sock_progress(sc, ops, 2, deadline);
        if (rc < 0)
            return rc;
        if (!direct)
            gang__comm_reduce_sum(b + roff * esz, sc->scratch, rlen, dt);
    }
    for (s = 0; s + 1 < n; s++) {
        sock_chunk(count, n, (r + 1 + n - s) % n, &off, &len);
        sock_chunk(count, n, (r + n - s) % n, &roff, &rlen);
        sock_coll_send(sc, &ops[0], next, b + off * esz, len * esz);
        sock_coll_recv(sc, &ops[1], prev, b + roff * esz, rlen * esz);
        rc = sock_progress(sc, ops, 2, deadline);
        if (rc < 0)
            return rc;
    }
    return 0;
}

/*
 * Ring all-gather: block r starts in place; at step s = 0..n-2 rank r forwards block
 * (r-s) to next and receives block (r-s-1) from prev, so every block travels n-1 hops.
 */
static int sock_all_gather(gang_comm *c, const void *send, void *recv, size_t count, gang_dtype dt,
                           uint64_t tmo)
{
    sock_comm *sc = c->impl;
    uint64_t deadline = sock_deadline(tmo);
    size_t bytes = count * gang_dtype_size(dt);
    uint32_t n = c->size, r = c->rank, s;
    uint8_t *out = recv;
    sock_op ops[2];
    int rc;

    memmove(out + (size_t)r * bytes, send, bytes);
    for (s = 0; s + 1 < n; s++) {
        uint32_t sb = (r + n - s) % n, rb = (r + 2 * n - s - 1) % n;

        sock_coll_send(sc, &ops[0], (r + 1) % n, out + (size_t)sb * bytes, bytes);
        sock_coll_recv(sc, &ops[1], (r + n - 1) % n, out + (size_t)rb * bytes, bytes);
        rc = sock_progress(sc, ops, 2, deadline);
        if (rc < 0)
            return rc;
    }
    return 0;
}

/*
 * Broadcast straight from the root: the root writes to every rank at once in one poll
 * loop. Simple and right for the small activations and weights headers it carries; a
 * pipelined ring or tree would spare the root's uplink for large buffers.
 */
static int sock_broadcast(gang_comm *c, void *buf, size_t count, gang_dtype dt, uint32_t root,
                          uint64_t tmo)
{
    sock_comm *sc = c->impl;
    uint64_t deadline = sock_deadline(tmo);
    size_t bytes = count * gang_dtype_size(dt), k = 0;
    uint32_t n = c->size, r;
    sock_op *ops;
    int rc;

    if (n == 1)
        return 0;
    if (c->rank != root) {
        sock_op op;

        sock_coll_recv(sc, &op, root, buf, bytes);
        return sock_progress(sc, &op, 1, deadline);
    }
    ops = calloc(n, sizeof(*ops));
    if (ops == NULL)
        return GANG_ENOMEM;
    for (r = 0; r < n; r++) {
        if (r != root)
            sock_coll_send(sc, &ops[k++], r, buf, bytes);
    }
    rc = sock_progress(sc, ops, k, deadline);
    free(ops);
    return rc;
}

static int sock_send(gang_comm *c, const void *buf, size_t bytes, uint32_t peer, uint32_t tag,
                     uint64_t tmo)
{
    sock_comm *sc = c->impl;
    sock_op op;

    sock_op_send(&op, sc->world_of[peer], sc->comm_id, SOCK_KIND_P2P, tag, buf, bytes);
    return sock_progress(sc, &op, 1, sock_deadline(tmo));
}

static int sock_recv(gang_comm *c, void *buf, size_t bytes, uint32_t peer, uint32_t tag,
                     uint64_t tmo)
{
    sock_comm *sc = c->impl;
    sock_op op;

    sock_op_recv(&op, sc->world_of[peer], sc->comm_id, SOCK_KIND_P2P, tag, buf, bytes);
    return sock_progress(sc, &op, 1, sock_deadline(tmo));
}

/* splitmix64: spreads (parent id, split number, color) into a child id. */
static uint64_t sock_mix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/*
 * Split: an all-gather of (color, key) tells every rank the members of its color; they
 * are ordered by key then parent rank. The child re-uses the parent's connections with a
 * rank map and a comm_id derived from the parent's id, the split number and the color, so
 * its frames never match the parent's or a sibling's.
 */
static int sock_split(gang_comm *c, uint32_t color, uint32_t key, uint64_t timeout_ms,
                      gang_comm *child)
{
    sock_comm *sc = c->impl, *cc;
    uint32_t n = c->size, mine[2] = {color, key}, *all, *members, m = 0, i, j, me = 0;
    uint64_t id;
    int rc;

    all = malloc((size_t)n * 2 * sizeof(*all));
    members = malloc((size_t)n * sizeof(*members));
    if (all == NULL || members == NULL) {
        rc = GANG_ENOMEM;
        goto out;
    }
    rc = sock_all_gather(c, mine, all, 2, GANG_DTYPE_I32, timeout_ms);
    if (rc < 0)
        goto out;
    id = sock_mix(sc->comm_id ^ sock_mix(((uint64_t)sc->split_seq << 32) | color));
    sc->split_seq++;
    for (i = 0; i < n; i++) {
        if (all[2 * i] != color)
            continue;
        /* Insertion by (key, parent rank); parent ranks arrive in increasing order. */
        for (j = m; j > 0 && all[2 * members[j - 1] + 1] > all[2 * i + 1]; j--)
            members[j] = members[j - 1];
        members[j] = i;
        m++;
    }
    cc = sock_comm_new(sc->net, m, id == 0 ? 1 : id);
    if (cc == NULL) {
        rc = GANG_ENOMEM;
        goto out;
    }
    for (j = 0; j < m; j++) {
        cc->world_of[j] = sc->world_of[members[j]];
        if (members[j] == c->rank)
            me = j;
    }
    child->rank = me;
    child->size = m;
    child->impl = cc;
    rc = 0;

out:
    free(all);
    free(members);
    return rc;
}

const gang__comm_ops gang__comm_socket_ops = {
    .name = "socket",
    .init = sock_init,
    .free = sock_free,
    .split = sock_split,
    .all_reduce = sock_all_reduce,
    .all_gather = sock_all_gather,
    .broadcast = sock_broadcast,
    .send = sock_send,
    .recv = sock_recv,
    .barrier = NULL, /* the front's one-int all-reduce is as good as a dedicated one */
    .abort = sock_abort,
};
