/*
 * What the NCCL emulator's two files share (tests/cuda-emu/, issue #24): emu-nccl.cpp
 * (the communicators, their groups and operations, the NCCL API) and emu-nccl-link.cpp
 * (ranks in other processes: the broker that serves them in the process that made the
 * unique id, and their side of it). C++ on both sides.
 */
#ifndef GANGLION_EMU_NCCL_H
#define GANGLION_EMU_NCCL_H

#include <stddef.h>

#include <memory>
#include <string>

#include <nccl.h>

#include "emu-sync.h"

namespace emu_nccl
{
struct emu_group;
struct remote_comm;
enum op_kind { OP_ALLREDUCE = 1, OP_ALLGATHER, OP_BROADCAST, OP_SPLIT, OP_SEND, OP_RECV };
} // namespace emu_nccl

struct ncclComm {
    std::shared_ptr<emu_nccl::emu_group> g;
    int rank = -1, nranks = 0, device = 0;
    std::string host; /* with device, the GPU: ranks of one host on one device are refused */
    int blocking = 1;
    int formed = 0;    /* the group is complete (init or split done) */
    int splitting = 0; /* splits of this parent not yet done */
    int aborted = 0;
    unsigned long long next_coll = 0; /* collectives it has posted */
    /* A rank of a group whose unique id another process made: every call goes to that
     * process's broker (emu-nccl-link.cpp); g is then null. */
    emu_nccl::remote_comm *remote = nullptr;
};

namespace emu_nccl
{

size_t type_size(ncclDataType_t t);
[[noreturn]] void die(const char *what);
std::string host_name(); /* GANG_EMU_HOST, else GANGLION_HOSTNAME, else the host's name */

/* --- emu-nccl.cpp: a group's state in this process ----------------------------------- */

/* Rank `rank` of the group of `key` (a unique id's text) joins, on (host, device); the
 * group forms when every rank joined. Blocking: waits for that (at most
 * GANG_EMU_WAIT_MS). */
ncclResult_t init_rank(ncclComm **comm, int nranks, const std::string &key, int rank, int blocking,
                       int device, const std::string &host);

/* Posts c's part of its next collective (kind OP_ALLREDUCE, OP_ALLGATHER, OP_BROADCAST)
 * or a send / receive (OP_SEND, OP_RECV: root is the peer), completed through pend. A
 * communicator that cannot take it returns its error and finishes pend failed. */
ncclResult_t post_op(ncclComm *c, int kind, const void *send, void *recv, size_t count,
                     ncclDataType_t t, int root, std::shared_ptr<gang_emu_pending> pend);

/* The arguments of an operation of c (root: a broadcast's root, or a send's or a
 * receive's peer; c's rank and size known). */
ncclResult_t check_op(const ncclComm *c, int kind, ncclDataType_t t, int root);

/* c's asynchronous state (ncclCommGetAsyncError's answer), and once formed its rank and
 * size (else both -1). */
void state(ncclComm *c, ncclResult_t *st, int *rank, int *nranks);

/* --- emu-nccl-link.cpp: ranks in other processes ------------------------------------- */

/* The unique id's text for a new group, whose ranks of other processes reach this one;
 * starts the broker's listener (once per process). Empty when it cannot listen. */
std::string broker_key();

/* 1 when key's group was made by another process (its ranks here are remote). */
int key_is_remote(const std::string &key);

/* Rank `rank` of a group another process made, as init_rank. */
ncclResult_t remote_init(ncclComm **comm, int nranks, const std::string &key, int rank,
                         int blocking);

/* The NCCL calls on a remote communicator (their public counterparts' contracts). */
ncclResult_t remote_op(ncclComm *c, int kind, const void *send, void *recv, size_t count,
                       ncclDataType_t t, int root, cudaStream_t stream);
ncclResult_t remote_split(ncclComm *c, int color, int key, ncclComm **child, int blocking);
ncclResult_t remote_state(ncclComm *c, ncclResult_t *st, int *rank, int *nranks);
ncclResult_t remote_end(ncclComm *c, int abort); /* abort, or destroy (c kept, ended) */
void group_start();
void group_end();

} // namespace emu_nccl

#endif /* GANGLION_EMU_NCCL_H */
