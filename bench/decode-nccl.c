/*
 * The nccl TP group of bench decode's nccl points (decode-nccl.h).
 */
#include "decode-nccl.h"

int gang__decode_nccl_tp(gang_kernels *k, const uint8_t *id, size_t id_len, uint32_t rank,
                         uint32_t size, uint64_t timeout_ms, int wait_each, gang_comm **world,
                         gang_comm **tp)
{
    gang_comm_config cfg = {.backend = GANG_COMM_NCCL,
                            .rank = rank,
                            .world_size = size,
                            .blob = id,
                            .blob_len = id_len,
                            .timeout_ms = timeout_ms,
                            .wait_each = wait_each};
    int rc;

    *world = NULL;
    *tp = NULL;
    if ((rc = gang_kernels_bind_thread(k)) != 0)
        return rc;
    if ((rc = gang_comm_init(&cfg, world)) != 0)
        return rc;
    rc = gang_comm_split(*world, 0, rank, timeout_ms, tp);
    if (rc != 0) {
        gang_comm_free(*world);
        *world = NULL;
    }
    return rc;
}
