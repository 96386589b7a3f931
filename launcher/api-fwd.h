/*
 * Forwarded API requests (internal to launcher/): the bytes of the rendezvous API frames
 * (GANG_MSG_API) between a member's agent, which accepted a request on its own HTTP port,
 * and the coordinator's agent, whose rank 0 runs it.
 *
 * A member's API (api.c, the same code as the coordinator's) hands its engine packets to
 * a submit function; on a member that function encodes them with gang_fwd_encode and
 * sends them to the coordinator:
 *   member -> coordinator   SUBMIT(G, id, request, first prompt ids), PROMPT(G, id,
 *                           offset, ids), CANCEL(G, id)
 *   coordinator -> member   TOKEN(G, id, index, token, logprob, top, stamp), DONE(G, id,
 *                           code, cached, finish, reason), NACK(G, id, index): the piece at
 *                           index was not taken (rank 0's channel full, or generation G
 *                           not started on node 0 yet); the member sends it again
 * The coordinator's agent gives a forwarded request the engine id gang_fwd_id(node, id)
 * (the node in the top 16 bits), so that its tokens find their way back without a table;
 * its own API's ids stay below 2^48.
 *
 * Layout of a payload, little-endian: u8 kind (a gang_req_kind, or GANG_FWD_NACK), then
 * the request message as gang_req_codec writes it (engine.h: u64 id and the kind's
 * fields, the sampling through gang_sampling_codec), with two additions:
 *   TOKEN   ... then u64 stamp_us (the coordinator's wall clock when rank 0 reported it)
 *   NACK    u64 id, u32 index
 * A payload must be consumed exactly. The bytes are those of the first forwarding
 * (protocol v2): SUBMIT u32 n_prompt, u32 max_tokens, u32 top_k, f32 temperature, f32
 * top_p, u64 seed, f32 presence, frequency and repetition penalties, u8 ignore_eos, u8
 * logprobs, u8 top_logprobs, u8 n_stop, n_stop x i32, u32 n_ids, n_ids x i32.
 */
#ifndef GANGLION_LAUNCHER_API_FWD_H
#define GANGLION_LAUNCHER_API_FWD_H

#include <stddef.h>
#include <stdint.h>

#include "ganglion/engine.h"
#include "ganglion/rendezvous.h"
#include "ganglion/serve.h"
#include "supervisor.h"

#define GANG_FWD_NACK 100u /* kind of a refusal-for-now (not a gang_req_kind) */
_Static_assert(1u + GANG_REQ_WIRE_MAX + 8u <= GANG_API_FRAME_MAX,
               "a forwarded request message (kind, message, stamp) fits one API frame");
#define GANG_FWD_ID_BITS 48u
#define GANG_FWD_ID_MASK ((UINT64_C(1) << GANG_FWD_ID_BITS) - 1)

/* The engine id of request id forwarded by node (node >= 1, id <= GANG_FWD_ID_MASK). */
static inline uint64_t gang_fwd_id(uint32_t node, uint64_t id)
{
    return ((uint64_t)node << GANG_FWD_ID_BITS) | (id & GANG_FWD_ID_MASK);
}
/* The node that forwarded engine request id; 0 for the coordinator's own requests. */
static inline uint32_t gang_fwd_node(uint64_t id)
{
    return (uint32_t)(id >> GANG_FWD_ID_BITS);
}

/*
 * Encodes the fields of m (kind SUBMIT, PROMPT, CANCEL, TOKEN, DONE or GANG_FWD_NACK) that
 * its kind carries into buf[0..cap). 0 and *len; GANG_EINVAL for another kind or a field
 * out of bounds; GANG_EMSGSIZE when cap is too small (GANG_API_FRAME_MAX always fits).
 * stamp_us is written into TOKEN.
 */
int gang_fwd_encode(const gang_req_msg *m, uint64_t stamp_us, uint8_t *buf, size_t cap,
                    size_t *len);

/*
 * Decodes a payload that came from the coordinator (from_coordinator = 1: TOKEN, DONE,
 * NACK) or from a member (0: SUBMIT, PROMPT, CANCEL) into m (zeroed first; generation
 * left 0 for the caller) and *stamp_us (TOKEN, else 0). 0, or GANG_EPROTO for a kind not
 * allowed in that direction, a truncated payload, trailing bytes or a field out of bounds
 * (n_ids, n_stop, n_top, a flag over 1, a string too long or with a NUL, an id above
 * GANG_FWD_ID_MASK). Never reads outside buf[0..len).
 */
int gang_fwd_decode(const uint8_t *buf, size_t len, int from_coordinator, gang_req_msg *m,
                    uint64_t *stamp_us);

/* ------------------------------------------------------------------ the relay */

#define GANG_FWD_HOLES_MAX 1024 /* refused requests remembered per generation */

/*
 * The coordinator's side: packets of members' forwarded requests go to global rank 0
 * (local rank 0 of node 0) through the supervisor, rank 0's tokens and ends of them go back
 * to the member that sent them. Stateless but for the "holes": a request whose packet
 * rank 0's channel did not take is refused from that piece on (NACK) until the member
 * sends that piece again, so rank 0 always gets a prompt's pieces in order. Everything
 * runs on the agent's loop thread.
 */
typedef struct gang_fwd_relay {
    gang_sup *sup;
    gang_coord *coord;
    uint64_t gen; /* generation this node's workers were told to start; 0 = none */
    struct {
        uint64_t id; /* engine id */
        uint32_t index;
    } holes[GANG_FWD_HOLES_MAX];
    uint32_t n_holes;
    uint64_t packets;        /* packets of forwarded requests handed to rank 0 */
    uint64_t submits;        /* of them, SUBMITs */
    uint64_t cancels;        /* CANCELs of forwarded requests handed to rank 0 */
    uint64_t frames_refused; /* malformed frames dropped */
    uint64_t nacks;          /* packets refused for now */
    uint64_t send_failures;  /* tokens or ends that could not be queued to their member */
    gang_req_msg pkt;
    uint8_t buf[GANG_API_FRAME_MAX];
} gang_fwd_relay;

/* A new generation started (gen) or the current one ended (0): the holes are forgotten. */
void gang_fwd_relay_set_gen(gang_fwd_relay *r, uint64_t gen);
/*
 * An API frame from the member of node (>= 1), sent in generation gen: decoded, checked
 * and handed to rank 0 under the engine id gang_fwd_id(node, id). A malformed frame is
 * counted and dropped (logged); a packet of an older generation is dropped; one of a
 * generation not started here yet, or one rank 0's channel does not take, is answered
 * NACK.
 */
void gang_fwd_relay_in(gang_fwd_relay *r, uint32_t node, uint64_t gen, const uint8_t *data,
                       uint32_t len);
/*
 * Rank 0 reported a token (tok) / the end (done_*) of engine request id: when it is a
 * forwarded one, sends it to its member (tokens stamped with the wall clock) and returns
 * 1; returns 0 for the coordinator's own requests.
 */
int gang_fwd_relay_token(gang_fwd_relay *r, const gang_req_msg *tok);
int gang_fwd_relay_done(gang_fwd_relay *r, const gang_req_msg *done);
/* The wall clock in microseconds (forwarded tokens' stamps). */
uint64_t gang__fwd_wall_us(void);
/* Appends the relay's counters (coordinator). */
void gang_fwd_relay_metrics(const gang_fwd_relay *r, gang_metrics_buf *b);

#endif
