/*
 * socket backend, progress engine: builds framed transfers, moves a set of them forward
 * over TCP and the shared-memory rings in one wait loop (matching incoming headers,
 * queueing unexpected messages), and wakes it on abort. Framing and error rules:
 * comm-socket.h.
 */
#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "comm-socket.h"

/* ---------------------------------------------------------------------------------
 * The progress engine: moves a set of sends and recvs forward in one poll() loop.
 * --------------------------------------------------------------------------------- */
void gang__sock_op_send(sock_op *op, uint32_t peer, uint64_t comm_id, uint32_t kind, uint32_t tag,
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

void gang__sock_op_recv(sock_op *op, uint32_t peer, uint64_t comm_id, uint32_t kind, uint32_t tag,
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

/*
 * An ACK from peer: completes the oldest of this call's CMA sends to it that awaits one
 * (the peer reads descriptors in the order we wrote them). GANG_EPROTO when none does.
 */
static int sock_rx_ack(uint32_t peer, sock_op *ops, size_t nops)
{
    for (size_t i = 0; i < nops; i++) {
        if (ops[i].is_send && ops[i].await_ack && !ops[i].complete && ops[i].peer == peer) {
            ops[i].done = ops[i].len;
            ops[i].complete = 1;
            return 0;
        }
    }
    return GANG_EPROTO;
}

/*
 * Points the reader of a CMA frame at its 16-byte descriptor; the payload's bytes are read
 * from the peer's memory into the recv's buffer or the stash once it is in (sock_rx).
 */
static void sock_rx_cma_start(sock_peer *p)
{
    p->rx_cma = 1;
    p->rx_final = p->rx_dst;
    p->rx_cma_len = p->rx_len;
    p->rx_dst = p->rx_desc;
    p->rx_len = SOCK_CMA_DESC;
}

/*
 * Decodes a complete header: claims the waiting recv it matches or starts a stash (0), or
 * consumes an ACK (1). A CMA frame from a peer whose memory we may not read, or for a
 * reducing recv, is GANG_EPROTO: only all-to-all sends use it, after our probe said yes.
 */
static int sock_rx_header(sock_peer *p, uint32_t peer, sock_op *ops, size_t nops)
{
    uint64_t comm_id = get_u64(p->rx_hdr), len = get_u64(p->rx_hdr + 16);
    uint32_t kind = get_u32(p->rx_hdr + 8), tag = get_u32(p->rx_hdr + 12);
    int cma = (kind & SOCK_KIND_CMA) != 0;
    size_t i;

    if (kind == SOCK_KIND_ACK)
        return len == 0 && p->shm != NULL ? sock_rx_ack(peer, ops, nops) == 0 ? 1 : GANG_EPROTO
                                          : GANG_EPROTO;
    kind &= ~SOCK_KIND_CMA;
    if (len > SOCK_MAX_MSG || (cma && !p->cma_rx))
        return GANG_EPROTO;
    p->rx_len = (size_t)len;
    p->rx_got = 0;
    p->rx_op = NULL;
    for (i = 0; i < nops; i++) {
        sock_op *op = &ops[i];

        if (op->is_send || op->complete || op->claimed || op->peer != peer ||
            op->comm_id != comm_id || op->kind != kind || op->tag != tag)
            continue;
        if (op->len != len || (cma && op->reduce))
            return GANG_EPROTO;
        op->claimed = 1;
        p->rx_op = op;
        p->rx_dst = op->buf;
        if (cma)
            sock_rx_cma_start(p);
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
    if (cma)
        sock_rx_cma_start(p);
    return 0;
}

/* A CMA frame's descriptor is in: reads the bytes it names and owes the peer an ACK. */
static int sock_rx_cma_finish(sock_peer *p)
{
    uint64_t addr = get_u64(p->rx_desc), len = get_u64(p->rx_desc + 8);
    int rc;

    p->rx_cma = 0;
    if (len != p->rx_cma_len)
        return GANG_EPROTO;
    rc = gang__sock_cma_read(p, p->rx_final, addr, (size_t)len);
    if (rc < 0)
        return rc;
    p->acks_owed++;
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
            ssize_t n = gang__sock_peer_recv(p, in_hdr || p->rx_cma ? NULL : p->rx_op, dst, want);

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
                    if (rc == 1)
                        p->rx_hdr_got = 0; /* an ACK: no payload */
                }
                continue;
            }
            p->rx_got += (size_t)n;
            if (p->rx_op != NULL && !p->rx_cma)
                p->rx_op->done = p->rx_got; /* a send with this src may forward them */
            if (p->rx_got < p->rx_len)
                continue;
        }
        /* A whole message is in. */
        if (p->rx_cma) {
            rc = sock_rx_cma_finish(p);
            if (rc < 0)
                return rc;
        }
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

/* Writes op (header then payload) as far as it goes without blocking. */
static int sock_tx(sock_net *net, sock_op *op)
{
    int fd = net->peers[op->peer].fd;

    if (net->peers[op->peer].shm != NULL) {
        gang__sock_tx_shm(&net->peers[op->peer], op);
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

/* Index of the first unfinished send to peer r in ops at index k or later, or nops. */
static size_t sock_send_from(const sock_op *ops, size_t nops, uint32_t r, size_t k)
{
    for (; k < nops; k++) {
        if (ops[k].is_send && !ops[k].complete && ops[k].peer == r)
            break;
    }
    return k;
}

/* Index of the first unfinished send to peer r in ops, or nops when there is none. */
static size_t sock_first_send(const sock_op *ops, size_t nops, uint32_t r)
{
    return sock_send_from(ops, nops, r, 0);
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
        gang__sock_shm_drain(p);
    p->bell = 0;
    tail = atomic_load_explicit(&p->rx_ring->tail, memory_order_relaxed);
    head = atomic_load_explicit(&p->tx_ring->head, memory_order_relaxed);
    rc = sock_rx(net, r, ops, nops);
    if (rc < 0)
        return rc;
    k = sock_first_send(ops, nops, r);
    while (k < nops && ops[k].await_ack) /* its frame is out: the next one may go */
        k = sock_send_from(ops, nops, r, k + 1);
    /* ACKs go between our frames, never inside one. */
    if (p->acks_owed > 0 && !p->eof && (k == nops || ops[k].hdr_done == 0))
        gang__sock_shm_acks(p);
    if (k < nops && !p->eof)
        gang__sock_tx_shm(p, &ops[k]);
    if (tail != atomic_load_explicit(&p->rx_ring->tail, memory_order_relaxed) ||
        head != atomic_load_explicit(&p->tx_ring->head, memory_order_relaxed)) {
        *moved = 1;
        atomic_thread_fence(memory_order_seq_cst);
        if (!p->eof && atomic_load_explicit(p->peer_sleep, memory_order_relaxed))
            gang__sock_shm_ring_bell(p);
    }
    return 0;
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

/* What one round of the progress loop found. */
typedef struct sock_round {
    size_t pending; /* ops not complete yet */
    int moved;      /* a shared-memory peer's counters moved (or the sleep flags went up) */
    int shm_wait;   /* a pending op waits on a shared-memory peer */
    int tcp_wait;   /* a pending op waits on a TCP peer */
} sock_round;

/* The waiting gears' state across the rounds of one progress call. */
typedef struct sock_pace {
    uint64_t last_move; /* microseconds (gang_now_ns() / 1000) of the last progress */
    int armed;          /* our sleep flags are raised */
} sock_pace;

/*
 * Completes a recv from its peer's unexpected-message queue when the message is there.
 * Returns 1 then, 0 when it is not queued, GANG_EPROTO when its size does not match.
 */
static int sock_take_queued(sock_net *net, sock_op *op)
{
    sock_msg *m = sock_uq_take(&net->peers[op->peer], op->comm_id, op->kind, op->tag);
    int rc;

    if (m == NULL)
        return 0;
    rc = m->len == op->len ? 0 : GANG_EPROTO;
    if (rc == 0 && op->reduce)
        gang__comm_reduce_sum(op->buf, m->data, m->len / gang_dtype_size(op->dt), op->dt);
    else if (rc == 0 && m->len > 0)
        memcpy(op->buf, m->data, m->len);
    free(m);
    if (rc < 0)
        return rc;
    op->done = op->len;
    op->complete = 1;
    return 1;
}

/*
 * One look at ops after the peers moved: completes the recvs whose message is queued,
 * fails an op whose peer is gone (GANG_EPEER), and counts into w what is still pending and
 * on which kind of peer. Returns 0 or a negative code (the caller poisons the net).
 */
static int sock_scan_ops(sock_net *net, sock_op *ops, size_t nops, sock_round *w)
{
    size_t i;
    int rc;

    for (i = 0; i < nops; i++) {
        sock_op *op = &ops[i];

        if (op->complete)
            continue;
        if (!op->is_send && !op->claimed) {
            rc = sock_take_queued(net, op);
            if (rc < 0)
                return rc;
            if (rc > 0)
                continue;
        }
        /* A gone shared-memory peer may have left its last bytes in the ring. */
        if (net->peers[op->peer].eof &&
            (op->is_send || !gang__sock_shm_readable(&net->peers[op->peer])))
            return GANG_EPEER;
        if (net->peers[op->peer].shm != NULL)
            w->shm_wait = 1;
        else
            w->tcp_wait = 1;
        w->pending++;
    }
    /* An ACK we owe holds its peer's all-to-all: the call ends only once it is out. */
    for (i = 0; i < net->nconn; i++) {
        sock_peer *p = &net->peers[net->conn[i]];

        if (p->acks_owed > 0 && !p->eof) {
            w->shm_wait = 1;
            w->pending++;
        }
    }
    return 0;
}

/*
 * Gears (1) to (4) of gang__sock_progress after a round that left ops pending: checks the
 * deadline (GANG_ETIMEDOUT), notes progress (lowering the sleep flags), then either spins
 * or yields and returns 1 (go round again without poll()), or returns 0 (poll), first
 * raising the sleep flags when about to sleep (which sets w->moved for one last look).
 */
static int sock_pace_round(sock_net *net, const sock_op *ops, size_t nops, uint64_t deadline,
                           sock_pace *pace, sock_round *w)
{
    /* One clock read a round: the deadline is in milliseconds of the same clock. */
    uint64_t now_us = gang_now_ns() / 1000, idle;

    if (now_us / 1000 >= deadline)
        return GANG_ETIMEDOUT;
    if (w->moved) {
        pace->last_move = now_us;
        if (pace->armed)
            gang__sock_shm_sleep_flags(net, 0);
        pace->armed = 0;
    }
    idle = now_us - pace->last_move;
    if (w->shm_wait && !w->tcp_wait && !pace->armed && idle < SOCK_YIELD_US) {
        if (w->moved)
            return 1; /* gear (1) */
        if (idle >= SOCK_SPIN_US || gang__sock_shm_cpu_shared(net, ops, nops, sched_getcpu()))
            sched_yield(); /* gear (3) */
        else
            sock_cpu_relax(); /* gear (2) */
        return 1;
    }
    if (!w->moved && !pace->armed && net->shm_peers > 0 &&
        (!w->shm_wait || idle >= (w->tcp_wait ? SOCK_SPIN_US : SOCK_YIELD_US))) {
        /*
         * About to sleep: raise the flags, then look at the rings once more first. Also
         * when only TCP peers are awaited, so that a shared-memory peer that sends us
         * something unexpected wakes us to drain it, as its socket would.
         */
        gang__sock_shm_sleep_flags(net, 1);
        pace->armed = 1;
        w->moved = 1;
    }
    return 0;
}

/*
 * Fills net->pfds with the abort eventfd, then every live peer's socket (POLLIN: data or
 * a shared-memory peer's doorbell; POLLOUT too for a TCP peer that ops send to), and
 * net->pmap with the peer of each entry. Returns the entries used.
 */
static size_t sock_poll_set(sock_net *net, const sock_op *ops, size_t nops)
{
    struct pollfd *pfds = net->pfds;
    size_t np;
    uint32_t r, i;

    pfds[0].fd = net->abort_fd;
    pfds[0].events = POLLIN;
    pfds[0].revents = 0;
    np = 1;
    for (i = 0; i < net->nconn; i++) {
        sock_peer *p = &net->peers[net->conn[i]];

        r = net->conn[i];
        if (p->fd < 0 || p->eof)
            continue;
        pfds[np].fd = p->fd;
        pfds[np].events = POLLIN; /* data, or a shared-memory peer's doorbell */
        pfds[np].revents = 0;
        if (p->shm == NULL && sock_first_send(ops, nops, r) < nops)
            pfds[np].events |= POLLOUT;
        net->pmap[np++] = r;
    }
    return np;
}

/*
 * Acts on what poll() reported for the np entries of net->pfds: the abort eventfd is
 * GANG_EABORTED; a shared-memory peer's socket only marks its doorbells for the next
 * round; a TCP peer is read, then its first unfinished send written. Returns 0 or a
 * negative code (the caller poisons the net).
 */
static int sock_poll_dispatch(sock_net *net, sock_op *ops, size_t nops, size_t np)
{
    size_t i, k;
    uint32_t r;
    int rc;

    if (net->pfds[0].revents)
        return GANG_EABORTED;
    for (i = 1; i < np; i++) {
        short ev = net->pfds[i].revents;

        r = net->pmap[i];
        if (ev != 0 && net->peers[r].shm != NULL)
            net->peers[r].bell = 1;
        if (ev == 0 || net->peers[r].shm != NULL)
            continue; /* shared-memory peers move at the top of the loop */
        if (ev & (POLLIN | POLLHUP | POLLERR)) {
            rc = sock_rx(net, r, ops, nops);
            if (rc < 0)
                return rc;
        }
        if ((ev & (POLLOUT | POLLERR | POLLHUP)) && !net->peers[r].eof) {
            k = sock_first_send(ops, nops, r);
            if (k < nops) {
                rc = sock_tx(net, &ops[k]);
                if (rc < 0)
                    return rc;
            }
        }
    }
    return 0;
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
 * (4) Then raise the sleep flags (see comm-socket-shm.c) and sleep in poll() on the sockets, the
 * doorbells, the abort eventfd and the deadline. A waiting rank so burns at most
 * SOCK_YIELD_US of CPU, and yields it to anyone else after SOCK_SPIN_US. TCP peers are
 * only seen through poll(), so while one is awaited every round polls, with a zero
 * timeout, and gear (4) starts after SOCK_SPIN_US.
 */
int gang__sock_progress(sock_comm *sc, sock_op *ops, size_t nops, uint64_t deadline)
{
    sock_net *net = sc->net;
    sock_pace pace = {.last_move = gang_now_ns() / 1000, .armed = 0};
    size_t np;
    uint32_t r;
    int rc;

    /* A sparse world connects only the pairs that talk (include/ganglion/comm.h). */
    for (r = 0; r < nops; r++) {
        if (net->peers[ops[r].peer].fd < 0) {
            gang_error("comm socket: no connection to rank %u: this world connects only "
                       "rank 0, rank +-1 and the TP / PP groups of width %u",
                       (unsigned)ops[r].peer, (unsigned)net->tp);
            return GANG_EINVAL;
        }
    }
    for (;;) {
        sock_round w = {.pending = 0, .moved = 0, .shm_wait = 0, .tcp_wait = 0};

        rc = sock_check_net(net);
        if (rc < 0)
            goto out;
        for (r = 0; r < net->nconn; r++) {
            rc = sock_shm_step(net, net->conn[r], ops, nops, &w.moved);
            if (rc < 0)
                goto out_poison;
        }
        rc = sock_scan_ops(net, ops, nops, &w);
        if (rc < 0)
            goto out_poison;
        if (w.pending == 0)
            goto out; /* rc is 0 */
        rc = sock_pace_round(net, ops, nops, deadline, &pace, &w);
        if (rc < 0)
            goto out_poison;
        if (rc > 0)
            continue;
        np = sock_poll_set(net, ops, nops);
        rc = poll(net->pfds, (nfds_t)np,
                  w.moved || (w.shm_wait && !pace.armed) ? 0 : sock_poll_ms(deadline));
        if (rc < 0 && errno == EINTR)
            continue;
        if (rc < 0) {
            rc = gang_err_from_errno(errno);
            goto out_poison;
        }
        rc = sock_poll_dispatch(net, ops, nops, np);
        if (rc < 0)
            goto out_poison;
    }

out_poison:
    sock_poison(net, rc);
out:
    if (pace.armed)
        gang__sock_shm_sleep_flags(net, 0);
    return rc;
}

/* ---------------------------------------------------------------------------------
 * Abort.
 * --------------------------------------------------------------------------------- */
void gang__sock_abort(gang_comm *c)
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
