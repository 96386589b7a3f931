/*
 * The one-rank nccl TP group of bench decode's nccl point (decode-nccl.h).
 */
#include "decode-nccl.h"

int gang__decode_nccl_tp(gang_kernels *k, uint64_t timeout_ms, int wait_each, gang_comm **world,
                         gang_comm **tp)
{
    uint8_t id[GANG_BOOTSTRAP_NCCL_HEX];
    gang_comm_config cfg = {.backend = GANG_COMM_NCCL,
                            .rank = 0,
                            .world_size = 1,
                            .blob = id,
                            .timeout_ms = timeout_ms,
                            .wait_each = wait_each};
    int rc;

    *world = NULL;
    *tp = NULL;
    if ((rc = gang_kernels_bind_thread(k)) != 0)
        return rc;
    if ((rc = gang_comm_nccl_unique_id(id, sizeof(id), &cfg.blob_len)) != 0)
        return rc;
    if ((rc = gang_comm_init(&cfg, world)) != 0)
        return rc;
    rc = gang_comm_split(*world, 0, 0, timeout_ms, tp);
    if (rc != 0) {
        gang_comm_free(*world);
        *world = NULL;
    }
    return rc;
}
