/*
 * Communicator front: validates arguments, checks the aborted flag and dispatches through
 * the backend's vtable (parallel/comm-backend.h). Backends may assume valid arguments.
 *
 * Argument rules decided here, for every backend:
 *  - c must be non-NULL and timeout_ms > 0 (every wait has a deadline, docs/design.md §4).
 *  - dtype must be known; peer and root must be < size; a rank may not send to itself.
 *  - count == 0 (collectives) is a no-op that returns 0 without communicating: every rank
 *    passes the same count, so every rank skips together. buf may then be NULL.
 *  - bytes == 0 (send/recv) is NOT skipped: an empty message is a legitimate token and is
 *    matched like any other.
 *  - An aborted communicator answers GANG_EABORTED before any argument reaches a backend.
 *  - Any error a backend returns is recorded as the communicator's async error.
 *
 * Ownership of gang_comm: the front allocates and frees the struct; ops->init / ops->split
 * fill impl (and, for split, the child's rank and size) and ops->free releases impl only.
 */
#include <stdlib.h>
#include <string.h>

#include "comm-backend.h"

const char *gang_comm_backend_name(gang_comm_backend b)
{
    switch (b) {
    case GANG_COMM_SOCKET:
        return "socket";
    case GANG_COMM_MPI:
        return "mpi";
    case GANG_COMM_NCCL:
        return "nccl";
    }
    return "unknown";
}

/*
 * dst[i] += src[i] for count elements. f16 and bf16 are widened to f32, added, and
 * rounded back once per call (so a ring of n ranks rounds n - 1 times, like NCCL). i32
 * wraps modulo 2^32 instead of invoking signed overflow.
 */
#define COMM_SUM_BLOCK 16

void gang__comm_reduce_sum(void *dst, const void *src, size_t count, gang_dtype dt)
{
    size_t i = 0, k;

    /* f32 and i32 are summed in fixed blocks with restrict pointers, which GCC and Clang
     * vectorise at -O2 (GCC 12's -O2 cost model does not vectorise a loop of unknown trip
     * count: the plain loop ran at one element per cycle). dst and src never overlap. */
    switch (dt) {
    case GANG_DTYPE_F32: {
        float *restrict d = dst;
        const float *restrict s = src;

        for (; i + COMM_SUM_BLOCK <= count; i += COMM_SUM_BLOCK) {
            for (k = 0; k < COMM_SUM_BLOCK; k++)
                d[i + k] += s[i + k];
        }
        for (; i < count; i++)
            d[i] += s[i];
        break;
    }
    case GANG_DTYPE_I32: {
        /* Summed as unsigned: wraps modulo 2^32 instead of overflowing. */
        uint32_t *restrict d = dst;
        const uint32_t *restrict s = src;

        for (; i + COMM_SUM_BLOCK <= count; i += COMM_SUM_BLOCK) {
            for (k = 0; k < COMM_SUM_BLOCK; k++)
                d[i + k] += s[i + k];
        }
        for (; i < count; i++)
            d[i] += s[i];
        break;
    }
    case GANG_DTYPE_F16: {
        uint16_t *d = dst;
        const uint16_t *s = src;

        for (i = 0; i < count; i++)
            d[i] = gang_f32_to_f16(gang_f16_to_f32(d[i]) + gang_f16_to_f32(s[i]));
        break;
    }
    case GANG_DTYPE_BF16: {
        uint16_t *d = dst;
        const uint16_t *s = src;

        for (i = 0; i < count; i++)
            d[i] = gang_f32_to_bf16(gang_bf16_to_f32(d[i]) + gang_bf16_to_f32(s[i]));
        break;
    }
    }
}

void gang__comm_set_error(gang_comm *c, int err)
{
    int expected = 0;

    if (c == NULL || err >= 0)
        return;
    atomic_compare_exchange_strong(&c->async_error, &expected, err);
}

/* Checks what every operation needs: a communicator, a deadline and no abort. */
static int comm_check_common(gang_comm *c, uint64_t timeout_ms)
{
    if (c == NULL || timeout_ms == 0)
        return GANG_EINVAL;
    if (atomic_load(&c->aborted))
        return GANG_EABORTED;
    return 0;
}

/* Checks dtype and that count elements (times mult) fit in a size_t. */
static int comm_check_count(size_t count, size_t mult, gang_dtype dt)
{
    size_t esz = gang_dtype_size(dt);

    if (esz == 0 || mult == 0)
        return GANG_EINVAL;
    if (count > SIZE_MAX / esz / mult)
        return GANG_EINVAL;
    return 0;
}

/* Records a backend's error and passes it through. */
static int comm_result(gang_comm *c, int rc)
{
    if (rc < 0)
        gang__comm_set_error(c, rc);
    return rc;
}

/*
 * Validates cfg, allocates the communicator and lets the backend fill it. The socket
 * listener is consumed on every outcome, also when the front refuses cfg before the
 * backend sees it (a socket-only type, so only a socket config may carry one).
 */
int gang_comm_init(const gang_comm_config *cfg, gang_comm **out)
{
    const gang__comm_ops *ops;
    gang_comm *c;
    int rc;

    if (out != NULL)
        *out = NULL;
    if (cfg == NULL || out == NULL) {
        rc = GANG_EINVAL;
        goto out_listener;
    }
    if (cfg->world_size == 0 || cfg->rank >= cfg->world_size || cfg->timeout_ms == 0) {
        rc = GANG_EINVAL;
        goto out_listener;
    }
    if (cfg->listener != NULL && (cfg->backend != GANG_COMM_SOCKET || cfg->rank != 0)) {
        rc = GANG_EINVAL;
        goto out_listener;
    }
    ops = gang__comm_ops_for(cfg->backend);
    if (ops == NULL) {
        rc = GANG_EINVAL;
        goto out_listener;
    }
    c = calloc(1, sizeof(*c));
    if (c == NULL) {
        rc = GANG_ENOMEM;
        goto out_listener;
    }
    c->ops = ops;
    c->backend = cfg->backend;
    c->rank = cfg->rank;
    c->size = cfg->world_size;
    atomic_init(&c->aborted, 0);
    atomic_init(&c->async_error, 0);
    /* From here the backend owns the listener, whatever it returns. */
    rc = ops->init(c, cfg);
    if (rc < 0) {
        free(c);
        return rc;
    }
    *out = c;
    return 0;

out_listener:
    if (cfg != NULL && cfg->listener != NULL && cfg->backend == GANG_COMM_SOCKET)
        gang_comm_listener_free(cfg->listener);
    return rc;
}

void gang_comm_free(gang_comm *c)
{
    if (c == NULL)
        return;
    c->ops->free(c);
    free(c);
}

uint32_t gang_comm_rank(const gang_comm *c)
{
    return c != NULL ? c->rank : 0;
}

uint32_t gang_comm_size(const gang_comm *c)
{
    return c != NULL ? c->size : 0;
}

gang_comm_backend gang_comm_backend_of(const gang_comm *c)
{
    return c != NULL ? c->backend : GANG_COMM_SOCKET;
}

uint32_t gang_comm_caps(const gang_comm *c)
{
    return c != NULL ? c->ops->caps : 0;
}

/*
 * The front allocates the child with the parent's backend; ops->split sets the child's
 * rank, size and impl. On failure the child is freed here and *out stays NULL.
 */
int gang_comm_split(gang_comm *c, uint32_t color, uint32_t key, uint64_t timeout_ms,
                    gang_comm **out)
{
    gang_comm *child;
    int rc;

    if (out == NULL)
        return GANG_EINVAL;
    *out = NULL;
    rc = comm_check_common(c, timeout_ms);
    if (rc < 0)
        return rc;
    child = calloc(1, sizeof(*child));
    if (child == NULL)
        return GANG_ENOMEM;
    child->ops = c->ops;
    child->backend = c->backend;
    atomic_init(&child->aborted, 0);
    atomic_init(&child->async_error, 0);
    rc = c->ops->split(c, color, key, timeout_ms, child);
    if (rc < 0) {
        free(child);
        return comm_result(c, rc);
    }
    *out = child;
    return 0;
}

int gang_comm_all_reduce(gang_comm *c, void *buf, size_t count, gang_dtype dt, uint64_t timeout_ms)
{
    int rc = comm_check_common(c, timeout_ms);

    if (rc < 0)
        return rc;
    rc = comm_check_count(count, 1, dt);
    if (rc < 0)
        return rc;
    if (count == 0)
        return 0;
    if (buf == NULL)
        return GANG_EINVAL;
    return comm_result(c, c->ops->all_reduce(c, buf, count, dt, timeout_ms));
}

int gang_comm_all_gather(gang_comm *c, const void *send, void *recv, size_t count, gang_dtype dt,
                         uint64_t timeout_ms)
{
    int rc = comm_check_common(c, timeout_ms);

    if (rc < 0)
        return rc;
    rc = comm_check_count(count, c->size, dt);
    if (rc < 0)
        return rc;
    if (count == 0)
        return 0;
    if (send == NULL || recv == NULL)
        return GANG_EINVAL;
    return comm_result(c, c->ops->all_gather(c, send, recv, count, dt, timeout_ms));
}

int gang_comm_broadcast(gang_comm *c, void *buf, size_t count, gang_dtype dt, uint32_t root,
                        uint64_t timeout_ms)
{
    int rc = comm_check_common(c, timeout_ms);

    if (rc < 0)
        return rc;
    rc = comm_check_count(count, 1, dt);
    if (rc < 0)
        return rc;
    if (root >= c->size)
        return GANG_EINVAL;
    if (count == 0)
        return 0;
    if (buf == NULL)
        return GANG_EINVAL;
    return comm_result(c, c->ops->broadcast(c, buf, count, dt, root, timeout_ms));
}

/* Checks a point-to-point call: a real peer other than this rank and a buffer if bytes > 0. */
static int comm_check_p2p(gang_comm *c, const void *buf, size_t bytes, uint32_t peer,
                          uint64_t timeout_ms)
{
    int rc = comm_check_common(c, timeout_ms);

    if (rc < 0)
        return rc;
    if (peer >= c->size || peer == c->rank)
        return GANG_EINVAL;
    if (bytes > 0 && buf == NULL)
        return GANG_EINVAL;
    return 0;
}

int gang_comm_send(gang_comm *c, const void *buf, size_t bytes, uint32_t peer, uint32_t tag,
                   uint64_t timeout_ms)
{
    int rc = comm_check_p2p(c, buf, bytes, peer, timeout_ms);

    if (rc < 0)
        return rc;
    return comm_result(c, c->ops->send(c, buf, bytes, peer, tag, timeout_ms));
}

int gang_comm_recv(gang_comm *c, void *buf, size_t bytes, uint32_t peer, uint32_t tag,
                   uint64_t timeout_ms)
{
    int rc = comm_check_p2p(c, buf, bytes, peer, timeout_ms);

    if (rc < 0)
        return rc;
    return comm_result(c, c->ops->recv(c, buf, bytes, peer, tag, timeout_ms));
}

/*
 * A backend without a native barrier gets one from an all-reduce of a single i32: no rank
 * can finish it before every rank has contributed.
 */
int gang_comm_barrier(gang_comm *c, uint64_t timeout_ms)
{
    int32_t one = 1;
    int rc = comm_check_common(c, timeout_ms);

    if (rc < 0)
        return rc;
    if (c->ops->barrier != NULL)
        return comm_result(c, c->ops->barrier(c, timeout_ms));
    return comm_result(c, c->ops->all_reduce(c, &one, 1, GANG_DTYPE_I32, timeout_ms));
}

/* off + bytes lies inside cap (without overflow), and a non-empty region has a buffer. */
static int a2a_region_ok(const void *buf, size_t cap, size_t off, size_t bytes)
{
    if (bytes == 0)
        return 1;
    return buf != NULL && off <= cap && bytes <= cap - off;
}

/*
 * Checks every region of a against its buffer and the receive regions against each other
 * (pairwise: the groups an all-to-all spans are tens of ranks, and a receive overlap would
 * be a silent corruption depending on arrival order).
 */
static int a2a_check(const gang_comm_a2a *a, uint32_t n, uint32_t me)
{
    if (a->send_bytes == NULL || a->send_off == NULL || a->recv_bytes == NULL ||
        a->recv_off == NULL)
        return GANG_EINVAL;
    for (uint32_t p = 0; p < n; p++) {
        if (!a2a_region_ok(a->send, a->send_cap, a->send_off[p], a->send_bytes[p]) ||
            !a2a_region_ok(a->recv, a->recv_cap, a->recv_off[p], a->recv_bytes[p]))
            return GANG_EINVAL;
    }
    if (a->send_bytes[me] != a->recv_bytes[me])
        return GANG_EINVAL; /* what this rank sends itself is what it receives from itself */
    for (uint32_t p = 0; p < n; p++) {
        for (uint32_t q = p + 1; q < n && a->recv_bytes[p] > 0; q++) {
            if (a->recv_bytes[q] > 0 && a->recv_off[p] < a->recv_off[q] + a->recv_bytes[q] &&
                a->recv_off[q] < a->recv_off[p] + a->recv_bytes[p])
                return GANG_EINVAL;
        }
    }
    return 0;
}

int gang_comm_all_to_all_v(gang_comm *c, const gang_comm_a2a *a, uint64_t timeout_ms)
{
    int rc = comm_check_common(c, timeout_ms);

    if (rc < 0)
        return rc;
    if (a == NULL)
        return GANG_EINVAL;
    rc = a2a_check(a, c->size, c->rank);
    if (rc < 0)
        return rc;
    if (c->ops->all_to_all_v == NULL)
        return GANG_ENOSYS;
    return comm_result(c, c->ops->all_to_all_v(c, a, timeout_ms));
}

/*
 * The front's entries that hand a backend a caller's device stream (order_after, pend_on;
 * fn is the backend's entry, NULL where it has none): a promise about device work, so it
 * is refused on an aborted communicator like the operation itself would be. GANG_ENOSYS
 * tells the caller to synchronise on the host instead (a backend without device streams).
 */
static int comm_stream_call(gang_comm *c, void *stream, int (*fn)(gang_comm *, void *))
{
    if (c == NULL || stream == NULL)
        return GANG_EINVAL;
    if (atomic_load(&c->aborted))
        return GANG_EABORTED;
    if (fn == NULL)
        return GANG_ENOSYS;
    return comm_result(c, fn(c, stream));
}

int gang_comm_order_after(gang_comm *c, void *stream)
{
    return comm_stream_call(c, stream, c != NULL ? c->ops->order_after : NULL);
}

int gang_comm_settle(gang_comm *c, uint64_t timeout_ms)
{
    if (c == NULL)
        return GANG_EINVAL;
    if (c->ops->settle == NULL)
        return 0;
    return comm_result(c, c->ops->settle(c, timeout_ms));
}

int gang_comm_graph_ok(const gang_comm *c)
{
    if (c == NULL || c->ops->graph_ok == NULL || atomic_load(&c->aborted))
        return 0;
    return c->ops->graph_ok(c);
}

int gang_comm_pend_on(gang_comm *c, void *stream)
{
    return comm_stream_call(c, stream, c != NULL ? c->ops->pend_on : NULL);
}

/*
 * Sets the flag first, so that an operation about to start sees it in the front, then
 * lets the backend wake operations already blocked.
 */
void gang_comm_abort(gang_comm *c)
{
    if (c == NULL)
        return;
    atomic_store(&c->aborted, 1);
    gang__comm_set_error(c, GANG_EABORTED);
    if (c->ops->abort != NULL)
        c->ops->abort(c);
}

int gang_comm_async_error(gang_comm *c)
{
    if (c == NULL)
        return GANG_EINVAL;
    return atomic_load(&c->async_error);
}
