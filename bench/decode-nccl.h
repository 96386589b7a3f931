/*
 * The nccl points of `ganglion bench decode --device cuda` (bench/decode-nccl.c). "nccl":
 * the 1x1 layout whose TP group is a one-rank nccl communicator, so that every layer's two
 * all-reduces go through NCCL on the one GPU (two ranks of one communicator on one GPU
 * are refused by NCCL); its decode time per step over plain 1x1 is the cost of the NCCL
 * data path per layer (issue #16: ordering, waits, NCCL's own launch), measured on one
 * GPU. "TPx1-nccl": TP ranks on GPUs 0 .. TP-1, their TP group over NCCL, as `serve
 * --backend nccl` runs a node: the decode step with its all-reduces in the step's graph.
 */
#ifndef GANGLION_BENCH_DECODE_NCCL_H
#define GANGLION_BENCH_DECODE_NCCL_H

#include <stdint.h>

#include "ganglion/comm.h"
#include "ganglion/kernels.h"

/*
 * Makes k's GPU current, joins rank `rank` of a `size`-rank nccl world from the unique id
 * blob (gang_comm_nccl_unique_id; every rank of the point the same) and splits it into
 * *tp, as a worker splits its TP group; wait_each: every collective awaited on the host
 * (gang_comm_config.wait_each, the "before" of issue #24). Every wait is bounded by
 * timeout_ms. Returns 0 with *world and *tp (free tp first), or the first error with both
 * NULL.
 */
int gang__decode_nccl_tp(gang_kernels *k, const uint8_t *id, size_t id_len, uint32_t rank,
                         uint32_t size, uint64_t timeout_ms, int wait_each, gang_comm **world,
                         gang_comm **tp);

#endif
