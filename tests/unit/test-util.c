/* Helpers shared by the data-plane test binaries; see test-util.h. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>

#include "test-util.h"

float tu_rnd(uint64_t *state)
{
    uint64_t s = *state;
    double u;

    s ^= s >> 12;
    s ^= s << 25;
    s ^= s >> 27;
    *state = s;
    u = (double)((s * 2685821657736338717ull) >> 11) / 9007199254740992.0;
    return (float)(2.0 * u - 1.0);
}

int tu_gang_comms(uint32_t rank, uint32_t n, uint32_t tp, const char *blob, size_t blob_len,
                  gang_comm_listener *listener, uint64_t timeout_ms, gang_comm **world,
                  gang_comm **tpc, gang_comm **ppc)
{
    gang_comm_config cfg;
    uint32_t stage = rank / tp, tp_rank = rank % tp;
    int rc;

    *world = *tpc = *ppc = NULL;
    memset(&cfg, 0, sizeof(cfg));
    cfg.backend = GANG_COMM_SOCKET;
    cfg.rank = rank;
    cfg.world_size = n;
    cfg.blob = (const uint8_t *)blob;
    cfg.blob_len = blob_len;
    cfg.listener = listener;
    cfg.advertise_host = "127.0.0.1";
    cfg.timeout_ms = timeout_ms;
    rc = gang_comm_init(&cfg, world);
    if (rc != 0)
        return rc;
    rc = gang_comm_split(*world, stage, tp_rank, timeout_ms, tpc);
    if (rc != 0)
        return rc;
    return gang_comm_split(*world, tp_rank, stage, timeout_ms, ppc);
}

int tu_gang_rank_enter(tu_gang *g, uint32_t rank, gang_comm_listener *listener,
                       gang_comm *_Atomic comms[3])
{
    gang_comm *c[3] = {NULL, NULL, NULL};
    int rc = tu_gang_comms(rank, g->n, g->tp, g->blob, g->blob_len, listener, 10000, &c[0], &c[1],
                           &c[2]);
    for (int i = 0; i < 3; i++)
        atomic_store(&comms[i], c[i]);
    pthread_barrier_wait(&g->ready);
    return rc;
}

void tu_gang_rank_leave(tu_gang *g, gang_comm *_Atomic comms[3])
{
    /* The controller may still be aborting our communicators: wait until it is done. */
    while (g->controlled && !atomic_load(&g->release))
        gang_sleep_ms(2);
    for (int i = 2; i >= 0; i--)
        gang_comm_free(atomic_exchange(&comms[i], NULL));
}

void tu_gang_start(tu_gang *g, uint32_t n, uint32_t tp, int controlled,
                   gang_comm_listener **listener0, void *(*fn)(void *), void *ctxs, size_t stride,
                   pthread_t *th)
{
    g->n = n;
    g->tp = tp;
    g->controlled = controlled;
    atomic_store(&g->release, 0);
    assert_int_equal(
        gang_comm_socket_listen("127.0.0.1", listener0, g->blob, sizeof(g->blob), &g->blob_len), 0);
    assert_int_equal(pthread_barrier_init(&g->ready, NULL, n + 1), 0);
    for (uint32_t r = 0; r < n; r++)
        assert_int_equal(pthread_create(&th[r], NULL, fn, (char *)ctxs + r * stride), 0);
    pthread_barrier_wait(&g->ready);
}

void tu_gang_finish(tu_gang *g, pthread_t *th)
{
    atomic_store(&g->release, 1);
    for (uint32_t r = 0; r < g->n; r++)
        pthread_join(th[r], NULL);
    pthread_barrier_destroy(&g->ready);
}
