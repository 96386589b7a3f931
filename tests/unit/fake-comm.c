/*
 * The fake device's communicator (fake-comm.h). Each collective is two rendezvous of the
 * group's threads around one shared buffer: every rank adds (or places) its contribution,
 * the group meets, every rank copies the result out, the group meets again so that the
 * buffer is not reused before the slowest rank has read it. Each rendezvous waits with
 * the operation's deadline (GANG_ETIMEDOUT when a rank never comes).
 */
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm-backend.h"
#include "fake-comm.h"
#include "fake/fake-device.h"

struct fake_group {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint32_t n, arrived, contributed;
    uint64_t gen; /* rendezvous completed so far */
    unsigned char *buf;
    size_t cap;
    unsigned char **a2a_src;     /* [n]: each rank's send buffer (host storage) */
    const gang_comm_a2a **a2a_v; /* [n]: each rank's sizes and offsets */
    size_t p2p_bytes;            /* send/recv: the size the sender placed in buf */
    int refs;                    /* a pair's: its communicators not yet freed (else 0) */
};

typedef struct fake_impl {
    fake_group *g;
    gang_kernels *k;
    int ordered_next; /* gang_comm_order_after was called for the next operation */
    fake_comm_counts counts;
} fake_impl;

fake_group *fake_group_new(uint32_t n)
{
    fake_group *g = calloc(1, sizeof(*g));

    if (g == NULL)
        return NULL;
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, NULL);
    g->n = n;
    g->a2a_src = calloc(n, sizeof(*g->a2a_src));
    g->a2a_v = calloc(n, sizeof(*g->a2a_v));
    if (g->a2a_src == NULL || g->a2a_v == NULL) {
        fake_group_free(g);
        return NULL;
    }
    return g;
}

void fake_group_free(fake_group *g)
{
    if (g == NULL)
        return;
    pthread_mutex_destroy(&g->mu);
    pthread_cond_destroy(&g->cv);
    free(g->buf);
    free(g->a2a_src);
    free(g->a2a_v);
    free(g);
}

/* With g->mu held: meets the other ranks or times out after tmo milliseconds;
 * GANG_EABORTED once c is aborted (fake_abort wakes the waiters). */
static int group_meet(fake_group *g, const gang_comm *c, uint64_t tmo)
{
    uint64_t gen = g->gen;
    struct timespec ts;

    if (++g->arrived == g->n) {
        g->arrived = 0;
        g->gen++;
        pthread_cond_broadcast(&g->cv);
        return 0;
    }
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += (time_t)(tmo / 1000);
    ts.tv_nsec += (long)(tmo % 1000) * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    while (g->gen == gen) {
        if (atomic_load(&c->aborted))
            return GANG_EABORTED;
        if (pthread_cond_timedwait(&g->cv, &g->mu, &ts) == ETIMEDOUT && g->gen == gen)
            return GANG_ETIMEDOUT;
    }
    return 0;
}

/* With g->mu held: the shared buffer holds at least bytes. */
static int group_reserve(fake_group *g, size_t bytes)
{
    unsigned char *nb;

    if (bytes <= g->cap)
        return 0;
    if ((nb = realloc(g->buf, bytes)) == NULL)
        return GANG_ENOMEM;
    g->buf = nb;
    g->cap = bytes;
    return 0;
}

/* Counts one operation: its ordering, and for an all-reduce the waits since the GEMM. */
static void count_op(fake_impl *im, int is_reduce)
{
    gang__fake_stats st;
    uint64_t waits = 0;

    if (gang__fake_stats_get(im->k, &st) == 0)
        waits = st.host_waits - st.waits_at_gemm;
    if (is_reduce) {
        im->counts.all_reduces++;
        im->counts.waits_between += waits;
    } else {
        im->counts.all_gathers++;
    }
    if (im->ordered_next)
        im->counts.ordered++;
    else if (waits == 0)
        im->counts.unordered++;
    im->ordered_next = 0;
}

static int fake_all_reduce(gang_comm *c, void *buf, size_t count, gang_dtype dt, uint64_t tmo)
{
    fake_impl *im = c->impl;
    fake_group *g = im->g;
    size_t bytes = count * gang_dtype_size(dt);
    void *mine = gang__fake_resolve(buf, bytes, "fake all_reduce");
    int rc;

    count_op(im, 1);
    pthread_mutex_lock(&g->mu);
    if ((rc = group_reserve(g, bytes)) < 0)
        goto out_unlock;
    if (g->contributed++ == 0)
        memset(g->buf, 0, bytes);
    gang__comm_reduce_sum(g->buf, mine, count, dt);
    if ((rc = group_meet(g, c, tmo)) < 0)
        goto out_unlock;
    g->contributed = 0;
    memcpy(mine, g->buf, bytes);
    rc = group_meet(g, c, tmo);
out_unlock:
    pthread_mutex_unlock(&g->mu);
    return rc;
}

static int fake_all_gather(gang_comm *c, const void *send, void *recv, size_t count, gang_dtype dt,
                           uint64_t tmo)
{
    fake_impl *im = c->impl;
    fake_group *g = im->g;
    size_t bytes = count * gang_dtype_size(dt);
    const void *mine = gang__fake_resolve(send, bytes, "fake all_gather (send)");
    void *out = gang__fake_resolve(recv, bytes * g->n, "fake all_gather (recv)");
    int rc;

    count_op(im, 0);
    pthread_mutex_lock(&g->mu);
    if ((rc = group_reserve(g, bytes * g->n)) < 0)
        goto out_unlock;
    memcpy(g->buf + (size_t)c->rank * bytes, mine, bytes);
    if ((rc = group_meet(g, c, tmo)) < 0)
        goto out_unlock;
    memcpy(out, g->buf, bytes * g->n);
    rc = group_meet(g, c, tmo);
out_unlock:
    pthread_mutex_unlock(&g->mu);
    return rc;
}

/*
 * All-to-all(v) like nccl's grouped send/recv: every rank publishes its send buffer and
 * sizes, the group meets, every rank copies what each peer sends it (the sizes must agree
 * on both sides: GANG_EPROTO otherwise), the group meets again before the buffers go.
 */
static int fake_all_to_all_v(gang_comm *c, const gang_comm_a2a *a, uint64_t tmo)
{
    fake_impl *im = c->impl;
    fake_group *g = im->g;
    uint32_t me = c->rank;
    unsigned char *out;
    int rc = 0;

    g->a2a_src[me] =
        a->send_cap > 0 ? gang__fake_resolve(a->send, a->send_cap, "fake a2a (send)") : NULL;
    out = a->recv_cap > 0 ? gang__fake_resolve(a->recv, a->recv_cap, "fake a2a (recv)") : NULL;
    pthread_mutex_lock(&g->mu);
    g->a2a_v[me] = a;
    if ((rc = group_meet(g, c, tmo)) < 0)
        goto out_unlock;
    for (uint32_t p = 0; p < g->n && rc == 0; p++) {
        const gang_comm_a2a *pa = g->a2a_v[p];

        if (pa->send_bytes[me] != a->recv_bytes[p])
            rc = GANG_EPROTO;
        else if (a->recv_bytes[p] > 0)
            memcpy(out + a->recv_off[p], g->a2a_src[p] + pa->send_off[me], a->recv_bytes[p]);
    }
    if (group_meet(g, c, tmo) < 0 && rc == 0)
        rc = GANG_ETIMEDOUT;
out_unlock:
    pthread_mutex_unlock(&g->mu);
    return rc;
}

/* The engine's TP group needs only the two collectives; the rest is refused loudly. */
static int fake_broadcast(gang_comm *c, void *buf, size_t count, gang_dtype dt, uint32_t root,
                          uint64_t tmo)
{
    (void)c, (void)buf, (void)count, (void)dt, (void)root, (void)tmo;
    return GANG_ENOSYS;
}

static atomic_int pair_fail;     /* fake_pair_fail_sends */
static atomic_ullong pair_moved; /* bytes received over pairs */

/* Point-to-point, for the pairs of 2 ranks only (the device path of P/D transfers): the
 * sender places the rows in the shared buffer, the pair meets, the receiver copies them
 * out (a size mismatch is GANG_EPROTO), the pair meets again. Tags are ignored, as on
 * nccl. Both ends resolve their buffers as device memory: a host pointer aborts. */
static int fake_send(gang_comm *c, const void *buf, size_t bytes, uint32_t peer, uint32_t tag,
                     uint64_t tmo)
{
    fake_group *g = ((fake_impl *)c->impl)->g;
    const void *mine = gang__fake_resolve(buf, bytes, "fake send");
    int rc;

    (void)tag;
    if (g->n != 2 || peer == c->rank)
        return GANG_ENOSYS;
    if (atomic_load(&pair_fail))
        return GANG_EPEER; /* the injected failure: the receiver meets its deadline */
    pthread_mutex_lock(&g->mu);
    if ((rc = group_reserve(g, bytes)) < 0)
        goto out_unlock;
    memcpy(g->buf, mine, bytes);
    g->p2p_bytes = bytes;
    if ((rc = group_meet(g, c, tmo)) == 0)
        rc = group_meet(g, c, tmo);
out_unlock:
    pthread_mutex_unlock(&g->mu);
    return rc;
}

static int fake_recv(gang_comm *c, void *buf, size_t bytes, uint32_t peer, uint32_t tag,
                     uint64_t tmo)
{
    fake_group *g = ((fake_impl *)c->impl)->g;
    void *out = gang__fake_resolve(buf, bytes, "fake recv");
    int rc;

    (void)tag;
    if (g->n != 2 || peer == c->rank)
        return GANG_ENOSYS;
    pthread_mutex_lock(&g->mu);
    if ((rc = group_meet(g, c, tmo)) < 0)
        goto out_unlock;
    if (g->p2p_bytes != bytes) {
        rc = GANG_EPROTO;
    } else {
        memcpy(out, g->buf, bytes);
        atomic_fetch_add(&pair_moved, bytes);
    }
    if (group_meet(g, c, tmo) < 0 && rc == 0)
        rc = GANG_ETIMEDOUT;
out_unlock:
    pthread_mutex_unlock(&g->mu);
    return rc;
}

static int fake_split(gang_comm *c, uint32_t color, uint32_t key, uint64_t tmo, gang_comm *child)
{
    (void)c, (void)color, (void)key, (void)tmo, (void)child;
    return GANG_ENOSYS;
}

/* The stream must be the rank's own handle's: anything else is a caller bug. */
static int fake_order_after(gang_comm *c, void *stream)
{
    fake_impl *im = c->impl;

    if (stream != gang_kernels_device_stream(im->k))
        return GANG_EINVAL;
    im->ordered_next = 1;
    return 0;
}

/* Like nccl, the ordered communicator's operations complete on the device: count the
 * one wait per step that the engine makes for them. */
static int fake_settle(gang_comm *c, uint64_t tmo)
{
    (void)tmo;
    ((fake_impl *)c->impl)->counts.settles++;
    return 0;
}

static void fake_free(gang_comm *c)
{
    fake_group *g = ((fake_impl *)c->impl)->g;
    int last = 0;

    pthread_mutex_lock(&g->mu);
    last = g->refs > 0 && --g->refs == 0;
    pthread_mutex_unlock(&g->mu);
    if (last)
        fake_group_free(g); /* a pair's group goes with its last communicator */
    free(c->impl);
    c->impl = NULL;
}

/* Wakes the group's waiters, which see c's aborted flag (set by the front). */
static void fake_abort(gang_comm *c)
{
    fake_group *g = ((fake_impl *)c->impl)->g;

    pthread_mutex_lock(&g->mu);
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
}

static const gang__comm_ops fake_ops_ordered = {
    .name = "fake",
    .caps = GANG_COMM_CAP_DEVICE_MEM,
    .free = fake_free,
    .split = fake_split,
    .all_reduce = fake_all_reduce,
    .all_gather = fake_all_gather,
    .broadcast = fake_broadcast,
    .all_to_all_v = fake_all_to_all_v,
    .send = fake_send,
    .recv = fake_recv,
    .order_after = fake_order_after,
    .settle = fake_settle,
    .abort = fake_abort,
};

/* The same without device ordering: callers must synchronise on the host. */
static const gang__comm_ops fake_ops_plain = {
    .name = "fake",
    .caps = GANG_COMM_CAP_DEVICE_MEM,
    .free = fake_free,
    .split = fake_split,
    .all_reduce = fake_all_reduce,
    .all_gather = fake_all_gather,
    .broadcast = fake_broadcast,
    .all_to_all_v = fake_all_to_all_v,
    .send = fake_send,
    .recv = fake_recv,
    .abort = fake_abort,
};

gang_comm *fake_comm_new(fake_group *g, uint32_t rank, gang_kernels *k, int with_order)
{
    gang_comm *c = calloc(1, sizeof(*c));
    fake_impl *im = calloc(1, sizeof(*im));

    if (c == NULL || im == NULL) {
        free(c);
        free(im);
        return NULL;
    }
    im->g = g;
    im->k = k;
    c->ops = with_order ? &fake_ops_ordered : &fake_ops_plain;
    c->backend = GANG_COMM_NCCL;
    c->rank = rank;
    c->size = g->n;
    atomic_init(&c->aborted, 0);
    atomic_init(&c->async_error, 0);
    c->impl = im;
    return c;
}

fake_comm_counts fake_comm_counts_of(gang_comm *c)
{
    return ((fake_impl *)c->impl)->counts;
}

/* ---- pairs (the device path of P/D transfers, launcher/worker-kv-pair.c) ---- */

#define PAIR_SLOTS 16

static pthread_mutex_t pair_mu = PTHREAD_MUTEX_INITIALIZER;
static fake_group *pair_slot[PAIR_SLOTS];
static unsigned pair_joined[PAIR_SLOTS];
static uint64_t pair_seq;

int fake_pair_blob(void *ctx, uint8_t *blob, size_t cap, size_t *len)
{
    fake_group *g = fake_group_new(2);
    int rc = 0, n;

    (void)ctx;
    if (g == NULL)
        return GANG_ENOMEM;
    g->refs = 2;
    pthread_mutex_lock(&pair_mu);
    uint64_t seq = pair_seq++;
    unsigned at = (unsigned)(seq % PAIR_SLOTS);
    if (pair_slot[at] != NULL) {
        rc = GANG_EAGAIN; /* (more pairs forming at once than slots) */
    } else {
        pair_slot[at] = g;
        pair_joined[at] = 0;
    }
    pthread_mutex_unlock(&pair_mu);
    n = snprintf((char *)blob, cap, "fakepair:%u", at);
    if (rc == 0 && (n < 0 || (size_t)n >= cap))
        rc = GANG_ERANGE;
    if (rc != 0) {
        fake_group_free(g);
        return rc;
    }
    *len = (size_t)n;
    return 0;
}

int fake_pair_join(void *ctx, gang_kernels *k, const uint8_t *blob, size_t len, uint32_t rank,
                   uint64_t timeout_ms, gang_comm **out)
{
    char s[32];
    unsigned at;
    fake_group *g;

    (void)ctx, (void)timeout_ms;
    if (len >= sizeof(s) || rank > 1)
        return GANG_EINVAL;
    memcpy(s, blob, len);
    s[len] = '\0';
    if (sscanf(s, "fakepair:%u", &at) != 1 || at >= PAIR_SLOTS)
        return GANG_EINVAL;
    pthread_mutex_lock(&pair_mu);
    g = pair_slot[at];
    if (g != NULL && ++pair_joined[at] == 2)
        pair_slot[at] = NULL; /* both joined: the slot is free again */
    pthread_mutex_unlock(&pair_mu);
    if (g == NULL)
        return GANG_EINVAL;
    *out = fake_comm_new(g, rank, k, 0);
    return *out != NULL ? 0 : GANG_ENOMEM;
}

void fake_pair_fail_sends(int on)
{
    atomic_store(&pair_fail, on);
}

uint64_t fake_pair_moved(void)
{
    return atomic_load(&pair_moved);
}
