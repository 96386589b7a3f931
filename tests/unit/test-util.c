/* Helpers shared by the data-plane test binaries; see test-util.h. */
#include <string.h>

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
