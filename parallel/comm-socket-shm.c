/*
 * socket backend, shared-memory fast path: which pairs of ranks share a host, the
 * mapping of each such pair, its two rings, the doorbells and the control page's sleep
 * flags and CPU words. The progress engine (comm-socket-progress.c) drives them.
 *
 * Two ranks on one host share one mapping per pair: a control page, then one ring per
 * direction (SOCK_RING_CAP bytes each; ring 0 carries lower rank -> higher rank, ring 1
 * the other way). A ring is a single-producer single-consumer byte stream that carries
 * exactly the frames (header + payload) the TCP stream would carry, so matching, the
 * unexpected-message queue and the error rules (comm-socket.h) are unchanged.
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
 * gang__sock_progress), which spares the wake-up latency.
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
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "comm-socket.h"

/* ---------------------------------------------------------------------------------
 * Detection and mapping (at start-up).
 * --------------------------------------------------------------------------------- */

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
 * the comment at the top of this file). Runs on the fresh data connections before any
 * frame: (1) as the lower rank of a pair, create the object and send 1 byte (1 = made);
 * (2) as the higher rank, read that byte, try to open and map, unlink, answer 1 byte;
 * (3) as the lower rank, read the answer and unlink / unmap when it failed. Steps (1)
 * and (2) never wait on a later step of anyone, so the exchange cannot deadlock. A
 * failure to set up only leaves that pair on TCP; a broken connection is an error.
 */
int gang__sock_shm_setup(sock_net *net, uint32_t self, uint64_t deadline)
{
    char name[SOCK_SHM_NAME_MAX];
    uint8_t b;
    uint32_t r;
    int rc;

    for (r = self + 1; r < net->n; r++) {
        b = sock_shm_map(net, &net->peers[r], self, r, 1) == 0;
        rc = gang__sock_write_full(net->peers[r].fd, &b, 1, net->abort_fd, deadline);
        if (rc < 0)
            goto out_unlink;
    }
    for (r = 0; r < self; r++) {
        rc = gang__sock_read_full(net->peers[r].fd, &b, 1, net->abort_fd, deadline);
        if (rc < 0)
            goto out_unlink;
        if (b == 1) {
            b = sock_shm_map(net, &net->peers[r], self, r, 0) == 0;
            sock_shm_name(net, r, self, name);
            shm_unlink(name);
        } else {
            b = 0;
        }
        rc = gang__sock_write_full(net->peers[r].fd, &b, 1, net->abort_fd, deadline);
        if (rc < 0)
            goto out_unlink;
    }
    /* Every higher peer answers, even to a 0, so the stream stays in step. */
    for (r = self + 1; r < net->n; r++) {
        rc = gang__sock_read_full(net->peers[r].fd, &b, 1, net->abort_fd, deadline);
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

/* ---------------------------------------------------------------------------------
 * Shared-memory rings (protocol at the top of this file).
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
int gang__sock_shm_readable(const sock_peer *p)
{
    if (p->shm == NULL)
        return 0;
    return atomic_load_explicit(&p->rx_ring->head, memory_order_acquire) !=
           atomic_load_explicit(&p->rx_ring->tail, memory_order_relaxed);
}

/* Sends a one-byte doorbell; a full socket buffer already holds unread doorbells. */
void gang__sock_shm_ring_bell(sock_peer *p)
{
    uint8_t b = 1;

    if (send(p->fd, &b, 1, MSG_DONTWAIT | MSG_NOSIGNAL) < 0) {
        /* EAGAIN: the peer has doorbells to read; other errors show as EOF on a drain. */
    }
}

/* Reads every pending doorbell without blocking; EOF or an error marks the peer gone. */
void gang__sock_shm_drain(sock_peer *p)
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
ssize_t gang__sock_peer_recv(sock_peer *p, const sock_op *op, void *dst, size_t want)
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

/*
 * Writes op (header then payload) into the peer's ring without blocking, with at most
 * one copy of payload per call (what fits): when the ring is full, the caller reads what
 * has arrived before it copies more, so a send larger than the ring and the receive it
 * overlaps with advance together. A send with a src recv writes only what that recv has
 * already delivered (the pipelined all-reduce).
 */
void gang__sock_tx_shm(sock_peer *p, sock_op *op)
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

/* ---------------------------------------------------------------------------------
 * Control page: sleep flags and CPU words (read by the progress engine's gears).
 * --------------------------------------------------------------------------------- */

/* Sets or clears our sleep flag towards every shared-memory peer (see the top of this file). */
void gang__sock_shm_sleep_flags(sock_net *net, int on)
{
    uint32_t r;

    for (r = 0; r < net->n; r++) {
        if (net->peers[r].shm != NULL)
            atomic_store_explicit(net->peers[r].my_sleep, on, memory_order_relaxed);
    }
    atomic_thread_fence(memory_order_seq_cst);
}

/*
 * Publishes cpu (from sched_getcpu(), negative when unknown) to every shared-memory peer
 * and returns whether a peer that ops still wait on last waited on that same CPU: it is
 * then queued behind us, and spinning would only delay it.
 */
int gang__sock_shm_cpu_shared(sock_net *net, const sock_op *ops, size_t nops, int cpu)
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
