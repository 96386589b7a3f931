/*
 * Agent <-> worker channel (internal to launcher/).
 *
 * The agent creates one AF_UNIX SOCK_SEQPACKET listening socket per node and spawns each
 * worker as `ganglion worker --agent-socket PATH --local-rank L ...`. SEQPACKET keeps
 * message boundaries, so every packet is one message of its own size (at most
 * GANG_WCTL_PACKET_MAX): a small control message (gang_wctl) or a request message
 * (gang_req_msg, engine.h), both written with the common codec by gang_wctl_encode /
 * gang_wctl_encode_req and read by gang_wctl_decode. A packet that does not decode is a
 * protocol error and closes the channel.
 *
 * Layout, little-endian: u8 type, u64 generation, then per type
 *   HELLO         u32 local_rank, i32 pid
 *   HEARTBEAT     u32 state                                     (13 bytes in all)
 *   BLOB, READY, GPU, MOE   u32 length + bytes (at most GANG_BLOB_MAX)
 *   START         u32 rank, u32 world_size, u32 length + blob
 *   ERROR         i32 code, u32 rank, u16 length + reason (< GANG_REASON_MAX)
 *   BLOB_REQUEST, ABORT, ABORTED, SHUTDOWN   nothing
 *   SUBMIT, PROMPT, CANCEL, TOKEN, DONE      the request message (gang_req_codec)
 *
 * Conversation (G = generation):
 *   worker -> HELLO(local_rank, pid)             once, right after connect
 *   worker -> HEARTBEAT(state)                   every heartbeat interval, always
 *   worker -> GPU(sample)                        after each heartbeat, when the worker
 *                                                watches a GPU (gang_gpu_sample bytes)
 *   worker -> MOE(sample)                        after each heartbeat, when its shard has
 *                                                MoE layers (gang_moe_load_sample bytes)
 *   agent  -> BLOB_REQUEST(G)                    to local rank 0 of node 0 only
 *   worker -> BLOB(G, blob)                      rank 0 listens and describes itself
 *   agent  -> START(G, rank, world, blob)        every worker joins the data plane
 *   worker -> READY(G, kv)                       data plane up for G (gang_engine_kv
 *                                                bytes when it runs an engine)
 *   worker -> ERROR(G, code, rank, reason)       data plane failed (peer lost, timeout),
 *                                                or its GPU did (code GANG_EGPU)
 *   agent  -> ABORT(G)                           tear down the data plane, stay alive
 *   worker -> ABORTED(G)                         torn down; weights stay loaded
 *   agent  -> SHUTDOWN                           exit 0
 * Requests (node 0 only: the coordinator's agent and global rank 0), engine.h's messages:
 *   agent  -> SUBMIT(G, id, n_prompt, max_tokens, sampling, the first prompt ids)
 *   agent  -> PROMPT(G, id, index = offset, ids) the rest of a prompt longer than one
 *                                                message, in order, until n_prompt ids
 *                                                are there; then the worker queues it
 *   worker -> TOKEN(G, id, index, token, logprob, top)  one per generated token, in order
 *   worker -> DONE(G, id, code, cached, finish)  code 0: finished ("length" or "stop");
 *                                                code < 0: refused, reason says why
 *   agent  -> CANCEL(G, id)                      the agent answered it already (deadline):
 *                                                stop generating it, free its KV slot
 * Requests live in one generation: an ABORT drops them in the worker, and the agent
 * submits what it still owes again, from the prompt, in the next generation.
 * A message whose generation is older than the worker's current one is ignored.
 * If the channel closes, the worker exits (its agent is gone).
 */
#ifndef GANGLION_LAUNCHER_WCTL_H
#define GANGLION_LAUNCHER_WCTL_H

#include <stddef.h>
#include <stdint.h>

#include "ganglion/engine.h"
#include "ganglion/rendezvous.h"

/* Control types; the request kinds (GANG_REQ_SUBMIT .. GANG_REQ_PROMPT, 11..15) travel on
 * the same channel with their own numbers. */
typedef enum gang_wctl_type {
    GANG_WCTL_HELLO = 1,
    GANG_WCTL_HEARTBEAT = 2,
    GANG_WCTL_BLOB_REQUEST = 3,
    GANG_WCTL_BLOB = 4,
    GANG_WCTL_START = 5,
    GANG_WCTL_READY = 6,
    GANG_WCTL_ERROR = 7,
    GANG_WCTL_ABORT = 8,
    GANG_WCTL_ABORTED = 9,
    GANG_WCTL_SHUTDOWN = 10,
    GANG_WCTL_GPU = 16,
    GANG_WCTL_MOE = 17,
    GANG_WCTL_KV = 18 /* rank 0's KV cache use and request counts: a gang_engine_kv blob */
} gang_wctl_type;

/* The largest packet: a START with a full blob, or a SUBMIT with GANG_REQ_MAX_IDS ids. */
#define GANG_WCTL_PACKET_MAX (9u + GANG_REQ_WIRE_MAX)
_Static_assert(GANG_WCTL_PACKET_MAX >= 9u + 12u + GANG_BLOB_MAX, "a START fits one packet");

/* A control message: the fields its type uses (see the layout above); the rest are 0. */
typedef struct gang_wctl {
    uint32_t type;                /* gang_wctl_type */
    uint64_t generation;          /* fences every message */
    uint32_t local_rank;          /* HELLO */
    int32_t pid;                  /* HELLO */
    uint32_t state;               /* HEARTBEAT: gang_rank_state */
    uint32_t rank;                /* START: global rank; ERROR: the rank at fault */
    uint32_t world_size;          /* START: ranks in the gang */
    int32_t code;                 /* ERROR: GANG_E* */
    char reason[GANG_REASON_MAX]; /* ERROR */
    uint32_t blob_len;            /* BLOB, START, READY, GPU, MOE */
    uint8_t blob[GANG_BLOB_MAX];
} gang_wctl;

/*
 * Encodes control message m / request message r (its kind and generation) as one packet
 * into buf[0..cap). 0 and *len; GANG_EINVAL for a type that is not one of its kind or a
 * field out of bounds; GANG_EMSGSIZE when cap is too small (GANG_WCTL_PACKET_MAX always
 * fits).
 */
int gang_wctl_encode(const gang_wctl *m, uint8_t *buf, size_t cap, size_t *len);
int gang_wctl_encode_req(const gang_req_msg *r, uint8_t *buf, size_t cap, size_t *len);
/*
 * Decodes one packet buf[0..len): a control message into *m (zeroed first) or a request
 * message into *r (zeroed first; its generation from the packet), and returns its type
 * (> 0). GANG_EPROTO for an unknown type, a truncated packet, trailing bytes or a field
 * out of bounds (*m and *r are then zero). Never reads outside buf[0..len).
 */
int gang_wctl_decode(const uint8_t *buf, size_t len, gang_wctl *m, gang_req_msg *r);

#endif
