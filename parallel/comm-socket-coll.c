/*
 * socket backend, collectives: ring all-reduce (pipelined over shared memory), ring
 * all-gather, broadcast, all-to-all(v), point-to-point send/recv, and the backend's vtable. Each
 * operation only builds its transfers; comm-socket-progress.c runs them.
 */
#include <stdlib.h>
#include <string.h>

#include "comm-socket.h"

/* ---------------------------------------------------------------------------------
 * Operations.
 * --------------------------------------------------------------------------------- */
static void sock_coll_send(sock_comm *sc, sock_op *op, uint32_t to, const void *buf, size_t len)
{
    gang__sock_op_send(op, sc->world_of[to], sc->comm_id, SOCK_KIND_COLL, sc->send_seq[to]++, buf,
                       len);
}

static void sock_coll_recv(sock_comm *sc, sock_op *op, uint32_t from, void *buf, size_t len)
{
    gang__sock_op_recv(op, sc->world_of[from], sc->comm_id, SOCK_KIND_COLL, sc->recv_seq[from]++,
                       buf, len);
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
    return gang__sock_progress(sc, ops, k, deadline);
}

/* The ring all-reduce above: pipelined over shared memory, else step by step. */
static int sock_all_reduce(gang_comm *c, void *buf, size_t count, gang_dtype dt, uint64_t tmo)
{
    sock_comm *sc = c->impl;
    uint64_t deadline = gang_deadline_after(tmo);
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
        rc = gang__sock_progress(sc, ops, 2, deadline);
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
        rc = gang__sock_progress(sc, ops, 2, deadline);
        if (rc < 0)
            return rc;
    }
    return 0;
}

/*
 * Ring all-gather: block r starts in place; at step s = 0..n-2 rank r forwards block
 * (r-s) to next and receives block (r-s-1) from prev, so every block travels n-1 hops.
 */
int gang__sock_all_gather(gang_comm *c, const void *send, void *recv, size_t count, gang_dtype dt,
                          uint64_t tmo)
{
    sock_comm *sc = c->impl;
    uint64_t deadline = gang_deadline_after(tmo);
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
        rc = gang__sock_progress(sc, ops, 2, deadline);
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
    uint64_t deadline = gang_deadline_after(tmo);
    size_t bytes = count * gang_dtype_size(dt), k = 0;
    uint32_t n = c->size, r;
    sock_op *ops;
    int rc;

    if (n == 1)
        return 0;
    if (c->rank != root) {
        sock_op op;

        sock_coll_recv(sc, &op, root, buf, bytes);
        return gang__sock_progress(sc, &op, 1, deadline);
    }
    ops = calloc(n, sizeof(*ops));
    if (ops == NULL)
        return GANG_ENOMEM;
    for (r = 0; r < n; r++) {
        if (r != root)
            sock_coll_send(sc, &ops[k++], r, buf, bytes);
    }
    rc = gang__sock_progress(sc, ops, k, deadline);
    free(ops);
    return rc;
}

/*
 * All-to-all(v): this rank's own region is copied, and the 2(n-1) transfers to and from
 * every other rank run in one progress call (full duplex, so no ordering between peers
 * can deadlock on full socket buffers or rings); between shared-memory peers a transfer of
 * SOCK_CMA_MIN bytes or more is read in place by its receiver where the kernel allows
 * (comm-socket-cma.c). Each transfer is a collective frame with
 * the pair's sequence number, so a size that differs from recv_bytes is GANG_EPROTO. The
 * op array lives on the stack up to 32 ranks (no allocation in a decode step).
 */
#define SOCK_A2A_STACK 32
static int sock_all_to_all_v(gang_comm *c, const gang_comm_a2a *a, uint64_t tmo)
{
    sock_comm *sc = c->impl;
    uint64_t deadline = gang_deadline_after(tmo);
    uint32_t n = c->size, r = c->rank;
    sock_op stack_ops[2 * SOCK_A2A_STACK], *ops = stack_ops;
    size_t k = 0;
    int rc;

    if (a->send_bytes[r] > 0)
        memmove((uint8_t *)a->recv + a->recv_off[r], (const uint8_t *)a->send + a->send_off[r],
                a->send_bytes[r]);
    if (n == 1)
        return 0;
    if (n > SOCK_A2A_STACK) {
        ops = calloc(2 * (size_t)n, sizeof(*ops));
        if (ops == NULL)
            return GANG_ENOMEM;
    }
    /* Peers in rotating order, so that n ranks do not all start on rank 0. */
    for (uint32_t s = 1; s < n; s++) {
        uint32_t to = (r + s) % n, from = (r + n - s) % n;

        sock_coll_send(sc, &ops[k], to, (const uint8_t *)a->send + a->send_off[to],
                       a->send_bytes[to]);
        ops[k++].cma_ok = 1; /* every receiver waits in this call: it may read in place */
        sock_coll_recv(sc, &ops[k++], from, (uint8_t *)a->recv + a->recv_off[from],
                       a->recv_bytes[from]);
    }
    rc = gang__sock_progress(sc, ops, k, deadline);
    if (ops != stack_ops)
        free(ops);
    return rc;
}

static int sock_send(gang_comm *c, const void *buf, size_t bytes, uint32_t peer, uint32_t tag,
                     uint64_t tmo)
{
    sock_comm *sc = c->impl;
    sock_op op;

    gang__sock_op_send(&op, sc->world_of[peer], sc->comm_id, SOCK_KIND_P2P, tag, buf, bytes);
    return gang__sock_progress(sc, &op, 1, gang_deadline_after(tmo));
}

static int sock_recv(gang_comm *c, void *buf, size_t bytes, uint32_t peer, uint32_t tag,
                     uint64_t tmo)
{
    sock_comm *sc = c->impl;
    sock_op op;

    gang__sock_op_recv(&op, sc->world_of[peer], sc->comm_id, SOCK_KIND_P2P, tag, buf, bytes);
    return gang__sock_progress(sc, &op, 1, gang_deadline_after(tmo));
}

const gang__comm_ops gang__comm_socket_ops = {
    .name = "socket",
    .caps = GANG_COMM_CAP_HOST_MEM | GANG_COMM_CAP_TAGS,
    .init = gang__sock_init,
    .free = gang__sock_free,
    .split = gang__sock_split,
    .all_reduce = sock_all_reduce,
    .all_gather = gang__sock_all_gather,
    .broadcast = sock_broadcast,
    .send = sock_send,
    .recv = sock_recv,
    .barrier = NULL, /* the front's one-int all-reduce is as good as a dedicated one */
    .all_to_all_v = sock_all_to_all_v,
    .abort = gang__sock_abort,
};
