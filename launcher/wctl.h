/*
 * Agent <-> worker control channel (internal to launcher/).
 *
 * The agent creates one AF_UNIX SOCK_SEQPACKET listening socket per node and spawns each
 * worker as `ganglion worker --agent-socket PATH --local-rank L ...`. SEQPACKET keeps
 * message boundaries, so every message is exactly one gang_wctl struct per packet; a
 * packet of another size is a protocol error and closes the channel. Both ends run on
 * the same host and binary, so the struct travels in host byte order.
 *
 * Conversation (G = generation):
 *   worker -> HELLO(local_rank, pid)             once, right after connect
 *   worker -> HEARTBEAT(state)                   every heartbeat interval, always
 *   worker -> GPU(sample in blob)                after each heartbeat, when the worker
 *                                                watches a GPU (gang_gpu_sample bytes)
 *   agent  -> BLOB_REQUEST(G)                    to local rank 0 of node 0 only
 *   worker -> BLOB(G, blob)                      rank 0 listens and describes itself
 *   agent  -> START(G, rank, world, blob)        every worker joins the data plane
 *   worker -> READY(G)                           data plane up for G
 *   worker -> ERROR(G, code, reason)             data plane failed (peer lost, timeout),
 *                                                or its GPU did (code GANG_EGPU)
 *   agent  -> ABORT(G)                           tear down the data plane, stay alive
 *   worker -> ABORTED(G)                         torn down; weights stay loaded
 *   agent  -> SHUTDOWN                           exit 0
 * Requests (node 0 only: the coordinator's agent and global rank 0):
 *   agent  -> SUBMIT(G, req_id, n_prompt, the first prompt ids in blob as int32, max_tokens,
 *             sampling, penalties, stops, ignore_eos, logprobs)
 *   agent  -> PROMPT(G, req_id, index = offset, ids in blob)   the rest of a prompt longer
 *                                                than one blob, in order, until n_prompt
 *                                                ids are there; then the worker queues it
 *   worker -> TOKEN(G, req_id, index, token, logprob, top)  one per generated token, in order
 *   worker -> DONE(G, req_id, code, finish)      code 0: finished ("length" or "stop");
 *                                                code < 0: refused, reason says why
 *   agent  -> CANCEL(G, req_id)                  the agent answered it already (deadline):
 *                                                stop generating it, free its KV slot
 * Requests live in one generation: an ABORT drops them in the worker, and the agent
 * submits what it still owes again, from the prompt, in the next generation.
 * A message whose generation is older than the worker's current one is ignored.
 * If the channel closes, the worker exits (its agent is gone).
 */
#ifndef GANGLION_LAUNCHER_WCTL_H
#define GANGLION_LAUNCHER_WCTL_H

#include <stdint.h>

#include "ganglion/engine.h"
#include "ganglion/rendezvous.h"

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
    GANG_WCTL_SUBMIT = 11,
    GANG_WCTL_TOKEN = 12,
    GANG_WCTL_DONE = 13,
    GANG_WCTL_CANCEL = 14,
    GANG_WCTL_PROMPT = 15,
    GANG_WCTL_GPU = 16
} gang_wctl_type;

/* Prompt ids one SUBMIT or PROMPT packet carries (the blob holds them as int32). */
#define GANG_WCTL_MAX_PROMPT (GANG_BLOB_MAX / 4)

typedef struct gang_wctl {
    uint32_t type;       /* gang_wctl_type */
    uint32_t local_rank; /* sender / addressee local rank */
    uint64_t generation; /* fences every message */
    int32_t pid;         /* HELLO: worker pid */
    int32_t code;        /* ERROR: GANG_E* */
    uint32_t state;      /* HEARTBEAT: gang_rank_state */
    uint32_t rank;       /* START: global rank */
    uint32_t world_size; /* START: ranks in the gang */
    uint32_t blob_len;   /* BLOB, START */
    uint8_t blob[GANG_BLOB_MAX];
    char reason[GANG_REASON_MAX];           /* ERROR, DONE with code < 0 */
    uint64_t req_id;                        /* SUBMIT, TOKEN, DONE */
    uint32_t max_tokens;                    /* SUBMIT */
    uint32_t top_k;                         /* SUBMIT */
    float temperature;                      /* SUBMIT */
    float top_p;                            /* SUBMIT */
    uint64_t seed;                          /* SUBMIT */
    uint32_t n_stop;                        /* SUBMIT */
    int32_t stop[16];                       /* SUBMIT: stop token ids */
    int32_t token;                          /* TOKEN */
    uint32_t index;                         /* TOKEN: 0-based among the generated tokens;
                                               DONE: prompt tokens from the prefix cache */
    char finish[8];                         /* DONE: "length" or "stop" */
    uint32_t n_prompt;                      /* SUBMIT, PROMPT: ids of the whole prompt */
    uint32_t ignore_eos;                    /* SUBMIT */
    uint32_t logprobs;                      /* SUBMIT: report logprobs */
    uint32_t top_logprobs;                  /* SUBMIT: alternatives per token */
    float presence_penalty;                 /* SUBMIT */
    float frequency_penalty;                /* SUBMIT */
    float repetition_penalty;               /* SUBMIT */
    float logprob;                          /* TOKEN */
    uint32_t n_top;                         /* TOKEN */
    int32_t top_ids[GANG_MAX_TOP_LOGPROBS]; /* TOKEN */
    float top_lp[GANG_MAX_TOP_LOGPROBS];    /* TOKEN */
} gang_wctl;

#endif
