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
 * Detection: after the connections are up, the lower rank of each connected pair creates
 * a POSIX shared memory object whose name holds the job-and-generation tag, its parent's
 * pid and its own, the session id and both ranks; the higher rank tries to open it, and
 * each tells the other over TCP whether it succeeded. Only a rank that shares the
 * creator's /dev/shm can open it (the session id is random), so this is an exact
 * same-host test, stricter than comparing host names or boot ids (containers on one host
 * that do not share /dev/shm fall back to TCP). The object is unlinked as soon as the
 * higher rank has it mapped, and by the lower rank once it has the answer. A rank killed
 * in between leaves it named: gang_comm_shm_sweep (run by every agent) removes it because
 * its creator or the creator's parent is dead, or its generation is over.
 */
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "comm-socket.h"

/* ---------------------------------------------------------------------------------
 * Detection and mapping (at start-up).
 * --------------------------------------------------------------------------------- */

/*
 * Writes the shared-memory object name of the pair (lo, hi) created by process pid, child
 * of ppid, into name (SOCK_SHM_NAME_MAX): "/ganglion-TAG-PPID-PID-SESSION8-LO-HI" (the
 * tag is "<job>-g<generation>", include/ganglion/comm.h).
 */
static void sock_shm_name(const sock_net *net, uint32_t ppid, uint32_t pid, uint32_t lo,
                          uint32_t hi, char *name)
{
    snprintf(name, SOCK_SHM_NAME_MAX, "/ganglion-%s-%u-%u-%02x%02x%02x%02x-%u-%u",
             net->tag[0] != '\0' ? net->tag : "anon-g0", (unsigned)ppid, (unsigned)pid,
             net->session[0], net->session[1], net->session[2], net->session[3], (unsigned)lo,
             (unsigned)hi);
}

/*
 * Creates (create != 0: name from our own pids) or opens (name from the creator's pids)
 * the pair's shared object and maps it into peer's ring pointers; self < peer decides
 * which ring is ours to write. Returns 0 or a negative code, leaving peer untouched on
 * failure. The creator sizes it (zero-filled, so every counter and flag starts at 0) and
 * reserves its pages. The rings carry SOCK_RING_CAP each way for a bulk pair (TP, PP),
 * SOCK_RING_CAP_CTRL for a control pair.
 */
static int sock_shm_map(sock_net *net, sock_peer *p, uint32_t self, uint32_t peer, uint32_t ppid,
                        uint32_t pid, int create)
{
    char name[SOCK_SHM_NAME_MAX];
    uint32_t lo = self < peer ? self : peer, hi = self < peer ? peer : self;
    uint64_t cap =
        gang__sock_pair(net, lo, hi) == SOCK_PAIR_BULK ? SOCK_RING_CAP : SOCK_RING_CAP_CTRL;
    size_t len = SOCK_RING_HDR + 2 * cap;
    uint8_t *base;
    int fd, rc = 0;

    sock_shm_name(net, ppid, pid, lo, hi, name);
    fd = create ? shm_open(name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600)
                : shm_open(name, O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0)
        return gang_err_from_errno(errno);
    if (create && ftruncate(fd, (off_t)len) < 0) {
        rc = gang_err_from_errno(errno);
        goto out_fd;
    }
    /*
     * Reserve the pages now: a tmpfs that is too small (a container's 64 MiB /dev/shm)
     * then refuses here and the pair stays on TCP, instead of a SIGBUS at first touch.
     */
    if (create) {
        rc = posix_fallocate(fd, 0, (off_t)len);
        if (rc != 0) {
            rc = gang_err_from_errno(rc);
            goto out_fd;
        }
    }
    /*
     * MAP_POPULATE: the page-table entries of the whole mapping now, in both processes,
     * instead of one minor fault (and, for the creator's fresh tmpfs page, one page clear)
     * per 4 KiB the first time the ring's writer reaches it. Those faults landed inside the
     * collectives: a 4 MiB ring walked by 32 KiB messages faulted on every call of its
     * first pass, which made a 64 KiB all-to-all ~20x slower than a 256 KiB one. Control
     * pairs (64 KiB rings, the many pairs of a sparse world) keep the lazy faults: few, and
     * a thousand-rank world forms without populating them all.
     */
    base = mmap(NULL, len, PROT_READ | PROT_WRITE,
                MAP_SHARED | (cap == SOCK_RING_CAP ? MAP_POPULATE : 0), fd, 0);
    if (base == MAP_FAILED) {
        rc = gang_err_from_errno(errno);
        goto out_fd;
    }
    p->shm = base;
    p->shm_len = len;
    p->ring_cap = cap;
    /* Ring 0 carries lo -> hi, ring 1 hi -> lo; zero-filled counters are an empty ring. */
    p->tx_ring = (sock_ring *)(void *)(base + (self == lo ? 0 : 128));
    p->rx_ring = (sock_ring *)(void *)(base + (self == lo ? 128 : 0));
    p->tx_data = base + SOCK_RING_HDR + (self == lo ? 0 : cap);
    p->rx_data = base + SOCK_RING_HDR + (self == lo ? cap : 0);
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
    munmap(p->shm, p->shm_len);
    p->shm = NULL;
    p->shm_len = 0;
    p->tx_ring = p->rx_ring = NULL;
    p->tx_data = p->rx_data = NULL;
    p->my_sleep = p->peer_sleep = NULL;
    p->my_cpu = p->peer_cpu = NULL;
    p->cma_peer_flag = NULL;
    p->cma_rx = 0;
}

/* Unlinks the objects we created for higher peers that may still be named. */
static void sock_shm_unlink_own(sock_net *net, uint32_t self)
{
    char name[SOCK_SHM_NAME_MAX];
    uint32_t i, r;

    for (i = 0; i < net->nconn; i++) {
        r = net->conn[i];
        if (r > self && net->peers[r].shm != NULL) {
            sock_shm_name(net, (uint32_t)getppid(), (uint32_t)getpid(), self, r, name);
            shm_unlink(name);
        }
    }
}

/*
 * Sets up the shared-memory fast path with every connected peer that can open our
 * objects (see the comment at the top of this file). Runs on the fresh data connections
 * before any frame: (1) as the lower rank of a pair, create the object and send 9 bytes
 * (1 = made, then our parent's pid and ours, which name it); (2) as the higher rank, read
 * them, try to open and map, unlink, answer 1 byte; (3) as the lower rank, read the
 * answer and unlink the object (it is mapped on both sides or unused), unmapping it when
 * it failed. Steps (1) and (2) never wait on a later step of anyone, so the exchange
 * cannot deadlock. A failure to set up only leaves that pair on TCP; a broken connection
 * is an error, and then every object we made is unlinked before returning. An object of
 * a rank killed in between is left to gang_comm_shm_sweep (its pid is dead).
 */
int gang__sock_shm_setup(sock_net *net, uint32_t self, uint64_t deadline)
{
    char name[SOCK_SHM_NAME_MAX];
    uint32_t ppid = (uint32_t)getppid(), pid = (uint32_t)getpid(), i, r;
    uint8_t b[9];
    int rc;

    rc = gang__sock_cma_init(net);
    if (rc < 0)
        return rc;
    for (i = 0; i < net->nconn; i++) {
        r = net->conn[i];
        if (r < self)
            continue;
        b[0] = sock_shm_map(net, &net->peers[r], self, r, ppid, pid, 1) == 0;
        if (b[0] == 1)
            gang__sock_cma_publish(net, &net->peers[r], self, r);
        put_u32(b + 1, ppid);
        put_u32(b + 5, pid);
        rc = gang__sock_write_full(net->peers[r].fd, b, sizeof(b), net->abort_fd, deadline);
        if (rc < 0)
            goto out_unlink;
    }
    for (i = 0; i < net->nconn && net->conn[i] < self; i++) {
        r = net->conn[i];
        rc = gang__sock_read_full(net->peers[r].fd, b, sizeof(b), net->abort_fd, deadline);
        if (rc < 0)
            goto out_unlink;
        if (b[0] == 1) {
            uint32_t cpp = get_u32(b + 1), cp = get_u32(b + 5);

            b[0] = sock_shm_map(net, &net->peers[r], self, r, cpp, cp, 0) == 0;
            sock_shm_name(net, cpp, cp, r, self, name);
            shm_unlink(name);
            if (b[0] == 1) { /* the lower rank's slot was written before its 9 bytes */
                gang__sock_cma_publish(net, &net->peers[r], self, r);
                gang__sock_cma_probe(&net->peers[r], self, r);
            }
        } else {
            b[0] = 0;
        }
        rc = gang__sock_write_full(net->peers[r].fd, b, 1, net->abort_fd, deadline);
        if (rc < 0)
            goto out_unlink;
    }
    /* Every higher peer answers, even to a 0, so the stream stays in step. */
    for (i = 0; i < net->nconn; i++) {
        r = net->conn[i];
        if (r < self)
            continue;
        rc = gang__sock_read_full(net->peers[r].fd, b, 1, net->abort_fd, deadline);
        if (rc < 0)
            goto out_unlink;
        if (net->peers[r].shm != NULL) {
            /* Mapped on both sides (the peer unlinked it already) or failed there. */
            sock_shm_name(net, ppid, pid, self, r, name);
            shm_unlink(name);
            if (b[0] != 1)
                sock_shm_unmap(&net->peers[r]);
            else /* the higher rank wrote its slot before answering */
                gang__sock_cma_probe(&net->peers[r], self, r);
        }
    }
    for (i = 0; i < net->nconn; i++)
        net->shm_peers += net->peers[net->conn[i]].shm != NULL;
    return 0;

out_unlink:
    /* Objects we created may still be named; the mappings go with the net. */
    sock_shm_unlink_own(net, self);
    return rc;
}

/* ---------------------------------------------------------------------------------
 * Sweeping what killed formations left behind.
 * --------------------------------------------------------------------------------- */

/* Whether process pid is gone (a process we may not signal is alive). */
static int sock_pid_dead(uint32_t pid)
{
    return pid == 0 || pid > INT32_MAX || (kill((pid_t)pid, 0) < 0 && errno == ESRCH);
}

/*
 * Splits a directory entry "ganglion-JOB-gGEN-PPID-PID-SESSION8-LO-HI" into its job,
 * generation and pids; 0 when it has that form.
 */
static int sock_shm_parse(const char *ent, char *job, size_t jcap, uint64_t *gen, uint32_t *ppid,
                          uint32_t *pid)
{
    static const char prefix[] = "ganglion-";
    char buf[SOCK_SHM_NAME_MAX], *f[7], *save = NULL, *t;
    int64_t v;
    int k = 0;

    if (strncmp(ent, prefix, sizeof(prefix) - 1) != 0 ||
        strlen(ent) >= sizeof(buf) + sizeof(prefix) - 1)
        return -1;
    gang_strlcpy(buf, ent + sizeof(prefix) - 1, sizeof(buf));
    for (t = strtok_r(buf, "-", &save); t != NULL; t = strtok_r(NULL, "-", &save)) {
        if (k == 7)
            return -1;
        f[k++] = t;
    }
    if (k != 7 || f[1][0] != 'g' || strlen(f[4]) != 8 || strlen(f[0]) >= jcap)
        return -1;
    if (gang_parse_i64(f[1] + 1, 0, INT64_MAX, &v) < 0)
        return -1;
    *gen = (uint64_t)v;
    if (gang_parse_i64(f[2], 1, INT32_MAX, &v) < 0)
        return -1;
    *ppid = (uint32_t)v;
    if (gang_parse_i64(f[3], 1, INT32_MAX, &v) < 0)
        return -1;
    *pid = (uint32_t)v;
    memcpy(job, f[0], strlen(f[0]) + 1);
    return 0;
}

/* Removes the segments no formation will use again (contract in include/ganglion/comm.h). */
int gang_comm_shm_sweep(const char *dir, const char *job, uint64_t generation, int agent_pid,
                        uint32_t *removed)
{
    char mine[SOCK_TAG_MAX + 1], ent_job[SOCK_TAG_MAX + 1], *dash;
    struct dirent *de;
    uint32_t ppid, pid, n = 0;
    uint64_t gen;
    DIR *d;
    int dfd;

    if (dir == NULL)
        return GANG_EINVAL;
    /* Our own job's name as it appears in a tag (the generation cut off). */
    gang__sock_make_tag(job, 0, mine);
    dash = strrchr(mine, '-');
    if (dash != NULL)
        *dash = '\0';
    d = opendir(dir);
    if (d == NULL)
        return gang_err_from_errno(errno);
    dfd = dirfd(d);
    while ((de = readdir(d)) != NULL) {
        int stale;

        if (sock_shm_parse(de->d_name, ent_job, sizeof(ent_job), &gen, &ppid, &pid) != 0)
            continue;
        stale = sock_pid_dead(pid) || sock_pid_dead(ppid) ||
                (agent_pid > 0 && ppid == (uint32_t)agent_pid && strcmp(ent_job, mine) == 0 &&
                 gen < generation);
        if (stale && unlinkat(dfd, de->d_name, 0) == 0)
            n++;
    }
    closedir(d);
    if (removed != NULL)
        *removed += n;
    return 0;
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
static size_t sock_ring_write(sock_ring *rg, uint8_t *data, uint64_t cap, const uint8_t *src,
                              size_t len)
{
    uint64_t head = atomic_load_explicit(&rg->head, memory_order_relaxed);
    uint64_t tail = atomic_load_explicit(&rg->tail, memory_order_acquire);
    uint64_t space = cap - (head - tail);
    size_t n = len < space ? len : (size_t)space, at = (size_t)(head % cap), first;

    if (n == 0)
        return 0;
    first = n < cap - at ? n : (size_t)(cap - at);
    memcpy(data + at, src, first);
    memcpy(data, src + first, n - first);
    atomic_store_explicit(&rg->head, head + n, memory_order_release);
    return n;
}

/*
 * Writes the ACK frames owed to p (gang__sock_cma_read's readers) while a whole header fits;
 * the caller calls it only between two of our frames to p, never inside one.
 */
void gang__sock_shm_acks(sock_peer *p)
{
    uint8_t hdr[SOCK_HDR_LEN];

    memset(hdr, 0, sizeof(hdr));
    put_u32(hdr + 8, SOCK_KIND_ACK);
    while (p->acks_owed > 0) {
        uint64_t head = atomic_load_explicit(&p->tx_ring->head, memory_order_relaxed);
        uint64_t tail = atomic_load_explicit(&p->tx_ring->tail, memory_order_acquire);

        if (p->ring_cap - (head - tail) < SOCK_HDR_LEN)
            return;
        sock_ring_write(p->tx_ring, p->tx_data, p->ring_cap, hdr, SOCK_HDR_LEN);
        p->acks_owed--;
    }
}

/* Copies up to len bytes out of the ring without blocking; returns the count (0: empty). */
static size_t sock_ring_read(sock_ring *rg, const uint8_t *data, uint64_t cap, uint8_t *dst,
                             size_t len)
{
    uint64_t tail = atomic_load_explicit(&rg->tail, memory_order_relaxed);
    uint64_t head = atomic_load_explicit(&rg->head, memory_order_acquire);
    uint64_t avail = head - tail;
    size_t n = len < avail ? len : (size_t)avail, at = (size_t)(tail % cap), first;

    if (n == 0)
        return 0;
    first = n < cap - at ? n : (size_t)(cap - at);
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
static size_t sock_ring_reduce(sock_ring *rg, const uint8_t *data, uint64_t cap, uint8_t *dst,
                               size_t len, gang_dtype dt)
{
    uint64_t tail = atomic_load_explicit(&rg->tail, memory_order_relaxed);
    uint64_t head = atomic_load_explicit(&rg->head, memory_order_acquire);
    uint64_t avail = head - tail;
    size_t esz = gang_dtype_size(dt), at = (size_t)(tail % cap), n, first;
    _Alignas(64) uint8_t bounce[SOCK_BOUNCE];

    n = len < avail ? len : (size_t)avail;
    if (((uintptr_t)(data + at)) % esz != 0 && n > sizeof(bounce))
        n = sizeof(bounce);
    n -= n % esz;
    if (n == 0)
        return 0;
    first = n < cap - at ? n : (size_t)(cap - at);
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
        n = sock_ring_reduce(p->rx_ring, p->rx_data, p->ring_cap, dst, want, op->dt);
    else
        n = sock_ring_read(p->rx_ring, p->rx_data, p->ring_cap, dst, want);
    if (n == 0) {
        errno = EAGAIN;
        return -1;
    }
    return (ssize_t)n;
}

/* gang__sock_tx_shm of a CMA send: header, then the descriptor, then it awaits the ACK. */
static void sock_tx_desc(sock_peer *p, sock_op *op)
{
    while (!op->await_ack) {
        size_t n;

        if (op->hdr_done < SOCK_HDR_LEN) {
            n = sock_ring_write(p->tx_ring, p->tx_data, p->ring_cap, op->hdr + op->hdr_done,
                                SOCK_HDR_LEN - op->hdr_done);
            op->hdr_done += n;
        } else {
            n = sock_ring_write(p->tx_ring, p->tx_data, p->ring_cap, op->desc + op->desc_done,
                                SOCK_CMA_DESC - op->desc_done);
            op->desc_done += n;
            op->await_ack = op->desc_done == SOCK_CMA_DESC;
        }
        if (n == 0)
            return;
    }
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
    if (op->hdr_done == 0 && op->cma_ok && op->len >= SOCK_CMA_MIN && gang__sock_cma_tx_ok(p)) {
        /* A descriptor instead of the bytes: the receiver reads them and answers ACK. */
        op->cma = 1;
        put_u32(op->hdr + 8, op->kind | SOCK_KIND_CMA);
        put_u64(op->desc, (uint64_t)(uintptr_t)op->buf);
        put_u64(op->desc + 8, op->len);
    }
    if (op->cma) {
        sock_tx_desc(p, op);
        return;
    }
    while (!op->complete) {
        size_t n;
        int payload = op->hdr_done == SOCK_HDR_LEN;

        if (!payload) {
            n = sock_ring_write(p->tx_ring, p->tx_data, p->ring_cap, op->hdr + op->hdr_done,
                                SOCK_HDR_LEN - op->hdr_done);
            op->hdr_done += n;
        } else {
            size_t ready = op->src != NULL ? op->src->done : op->len;

            n = sock_ring_write(p->tx_ring, p->tx_data, p->ring_cap, op->buf + op->done,
                                ready - op->done);
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

    for (r = 0; r < net->nconn; r++) {
        sock_peer *p = &net->peers[net->conn[r]];

        if (p->shm != NULL)
            atomic_store_explicit(p->my_sleep, on, memory_order_relaxed);
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

    for (r = 0; r < net->nconn; r++) {
        sock_peer *p = &net->peers[net->conn[r]];

        if (p->shm != NULL)
            atomic_store_explicit(p->my_cpu, cpu + 1, memory_order_relaxed);
    }
    for (i = 0; i < nops && cpu >= 0 && !shared; i++) {
        const sock_peer *p = &net->peers[ops[i].peer];

        shared = !ops[i].complete && p->shm != NULL &&
                 atomic_load_explicit(p->peer_cpu, memory_order_relaxed) == cpu + 1;
    }
    return shared;
}
