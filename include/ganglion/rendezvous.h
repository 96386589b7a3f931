/*
 * ganglion rendezvous module: identity discovery, the wire protocol v2 codec,
 * authentication, and the coordinator / member state machines that run on a libuv loop.
 * docs/protocol.md is the normative description of the wire format.
 *
 * No libuv types appear here: functions that need the caller's loop take it as
 * `void *uv_loop` (a uv_loop_t *), and every handle is opaque.
 */
#ifndef GANGLION_RENDEZVOUS_H
#define GANGLION_RENDEZVOUS_H

#include <stddef.h>
#include <stdint.h>

#include "ganglion/common.h"

/* =================================================================================
 * Wire protocol v2
 *
 * A frame is a 20-byte header followed by payload_len bytes of payload, all integers
 * little-endian; on a connection with a session (a token was configured and the handshake
 * succeeded) every frame after WELCOME is followed by a GANG_WIRE_TAG_SIZE-byte tag
 * (gang_auth_session_sign), which payload_len does not count:
 *
 *   offset 0  u32 magic        0x474E4147 ("GANG" as bytes 'G','A','N','G')
 *   offset 4  u16 version      2
 *   offset 6  u16 type         gang_msg_type
 *   offset 8  u64 generation   the sender's generation (0 = none yet)
 *   offset 16 u32 payload_len  <= GANG_WIRE_MAX_PAYLOAD
 *
 * Payload fields are encoded in the order of the structs below: integers as fixed-width
 * little-endian, byte arrays raw with their fixed size, strings as u16 length + bytes
 * (no NUL, length < the field's capacity), blobs as u32 length + bytes. A payload must be
 * consumed exactly: trailing bytes are a protocol error.
 * ================================================================================= */
#define GANG_WIRE_MAGIC 0x474E4147u
#define GANG_WIRE_VERSION 2u
#define GANG_WIRE_HEADER_SIZE 20u
#define GANG_WIRE_MAX_PAYLOAD (64u * 1024u)
/* Session tag after each frame once authenticated: HMAC-SHA256 truncated to 128 bits. */
#define GANG_WIRE_TAG_SIZE 16u
/* The most bytes one frame occupies on the wire, its tag included (65572). */
#define GANG_WIRE_MAX_FRAME (GANG_WIRE_HEADER_SIZE + GANG_WIRE_MAX_PAYLOAD + GANG_WIRE_TAG_SIZE)

#define GANG_NONCE_SIZE 32
#define GANG_MAC_SIZE 32
#define GANG_DIGEST_SIZE 32
#define GANG_JOB_MAX 64     /* capacity including NUL */
#define GANG_HOST_MAX 256   /* capacity including NUL */
#define GANG_REASON_MAX 256 /* capacity including NUL */
#define GANG_BLOB_MAX 8192  /* bootstrap blob bytes */
#define GANG_MAX_LOCAL_RANKS 64

/*
 * The heartbeat age (ms) that means "never heard": no worker process, no report from its
 * node, no connection to the coordinator. Every heartbeat age is a u32 (it travels as one
 * in gang_msg_heartbeat) and holds either this or a real age, which gang_heartbeat_age
 * clamps below it (about 49.7 days). /status shows it as -1, /metrics as -1 seconds.
 */
#define GANG_HEARTBEAT_NEVER UINT32_MAX

/* A real heartbeat age of ms milliseconds as a u32, clamped to GANG_HEARTBEAT_NEVER - 1. */
static inline uint32_t gang_heartbeat_age(uint64_t ms)
{
    return ms >= GANG_HEARTBEAT_NEVER ? GANG_HEARTBEAT_NEVER - 1 : (uint32_t)ms;
}
/* Bytes of one API frame's opaque payload: a prompt piece (GANG_BLOB_MAX) plus fields. */
#define GANG_API_FRAME_MAX 9216
/*
 * Bytes of API frames a connection may have queued for writing; gang_coord_send_api and
 * gang_member_send_api answer GANG_EAGAIN above it (the heartbeats always go).
 */
#define GANG_API_QUEUE_MAX (16u << 20)

typedef enum gang_msg_type {
    GANG_MSG_CHALLENGE = 1,    /* coord -> member, first frame on a connection */
    GANG_MSG_JOIN = 2,         /* member -> coord, answers the challenge */
    GANG_MSG_WELCOME = 3,      /* coord -> member, proves the coordinator knows the token */
    GANG_MSG_REJECT = 4,       /* either way, then the sender closes */
    GANG_MSG_BLOB_REQUEST = 5, /* coord -> node 0: have rank 0 produce the bootstrap blob */
    GANG_MSG_BLOB = 6,         /* node 0 -> coord: the blob for generation G */
    GANG_MSG_START = 7,        /* coord -> all: generation G starts with this blob */
    GANG_MSG_READY = 8,        /* member -> coord: all local ranks serve generation G */
    GANG_MSG_HEARTBEAT = 9,    /* both ways */
    GANG_MSG_ABORT = 10,       /* member -> coord: a local failure; coord -> all: abort G */
    GANG_MSG_REJOIN = 11,      /* member -> coord: aborted in place, ready for a new G */
    GANG_MSG_GIVE_UP = 12,     /* coord -> all: the restart budget is spent */
    GANG_MSG_API = 13,         /* both ways: a forwarded API request's traffic (opaque) */
    GANG_MSG_TYPE_MAX_ = 13
} gang_msg_type;

/* State of one rank as members report it in heartbeats. */
typedef enum gang_rank_state {
    GANG_RANK_DOWN = 0,     /* no worker process */
    GANG_RANK_IDLE = 1,     /* worker up, not in a generation */
    GANG_RANK_STARTING = 2, /* initialising comms for a generation */
    GANG_RANK_READY = 3,    /* serving the current generation */
    GANG_RANK_ABORTING = 4, /* tearing down comms after an abort */
    GANG_RANK_FAILED = 5    /* reported an error / hung */
} gang_rank_state;

/* State of the gang as the coordinator reports it. */
typedef enum gang_state {
    GANG_STATE_WAITING = 0,  /* waiting for members to (re)join */
    GANG_STATE_BACKOFF = 1,  /* all present, waiting out the restart backoff */
    GANG_STATE_STARTING = 2, /* START sent, waiting for READY from every node */
    GANG_STATE_SERVING = 3,  /* every rank is READY in the current generation */
    GANG_STATE_ABORTING = 4, /* ABORT sent, waiting for members to REJOIN */
    GANG_STATE_FAILED = 5    /* restart budget spent; stays down */
} gang_state;

const char *gang_rank_state_name(int s);
const char *gang_state_name(int s);

typedef struct gang_msg_challenge {
    uint8_t nonce[GANG_NONCE_SIZE]; /* fresh random server nonce */
    uint8_t auth_required;          /* 1 when the coordinator has a token */
} gang_msg_challenge;

typedef struct gang_msg_join {
    char job[GANG_JOB_MAX]; /* job name; must match the coordinator's */
    uint32_t node_index;    /* this member's node index */
    uint32_t nnodes;        /* world shape the member was started with */
    uint32_t nproc_per_node;
    uint32_t tp;
    uint32_t pp;
    uint8_t model_digest[GANG_DIGEST_SIZE]; /* digest of the model the member loaded */
    uint64_t generation_seen;               /* highest generation this member has served */
    char host[GANG_HOST_MAX];               /* address peers use to reach this node's workers */
    uint8_t client_nonce[GANG_NONCE_SIZE];
    uint8_t mac[GANG_MAC_SIZE]; /* HMAC of gang_auth_sign_join; zero w/o token */
} gang_msg_join;

typedef struct gang_msg_welcome {
    uint8_t mac[GANG_MAC_SIZE];     /* HMAC proving the coordinator holds the token */
    uint32_t heartbeat_interval_ms; /* the coordinator's heartbeat settings */
    uint32_t heartbeat_timeout_ms;
    uint64_t generation; /* coordinator's current generation */
} gang_msg_welcome;

typedef struct gang_msg_reject {
    int32_t code; /* GANG_E* */
    char reason[GANG_REASON_MAX];
} gang_msg_reject;

typedef struct gang_msg_blob { /* BLOB and START (and BLOB_REQUEST with len 0) */
    uint32_t world_size;       /* ranks in the gang */
    uint32_t len;
    uint8_t data[GANG_BLOB_MAX];
} gang_msg_blob;

typedef struct gang_msg_ready {
    uint32_t node_index;
} gang_msg_ready;

typedef struct gang_msg_heartbeat {
    uint32_t node_index;                      /* sender's node (coordinator: UINT32_MAX) */
    uint32_t state;                           /* gang_state from the coordinator, 0 from members */
    uint32_t nranks;                          /* entries below (members: local ranks) */
    uint8_t rank_state[GANG_MAX_LOCAL_RANKS]; /* gang_rank_state */
    uint32_t rank_age_ms[GANG_MAX_LOCAL_RANKS]; /* ms since each worker's last heartbeat;
                                                   GANG_HEARTBEAT_NEVER: no process */
} gang_msg_heartbeat;

typedef struct gang_msg_abort {
    int32_t rank; /* global rank that failed, -1 = unknown/node */
    int32_t code; /* GANG_E* */
    char reason[GANG_REASON_MAX];
} gang_msg_abort;

typedef struct gang_msg_rejoin {
    uint32_t node_index;
} gang_msg_rejoin;

typedef struct gang_msg_give_up {
    char reason[GANG_REASON_MAX];
} gang_msg_give_up;

/*
 * API: the traffic of an inference request a member's agent accepted and forwards to the
 * coordinator's (submit, prompt pieces, cancel one way; tokens, ends, refusals the other).
 * The rendezvous only carries and bounds it: the launcher encodes and validates the bytes.
 */
typedef struct gang_msg_api {
    uint32_t len;
    uint8_t data[GANG_API_FRAME_MAX];
} gang_msg_api;

/* One decoded message: the header fields plus the payload of its type. */
typedef struct gang_msg {
    uint16_t type; /* gang_msg_type */
    uint64_t generation;
    union {
        gang_msg_challenge challenge;
        gang_msg_join join;
        gang_msg_welcome welcome;
        gang_msg_reject reject;
        gang_msg_blob blob; /* BLOB_REQUEST, BLOB, START */
        gang_msg_ready ready;
        gang_msg_heartbeat heartbeat;
        gang_msg_abort abort;
        gang_msg_rejoin rejoin;
        gang_msg_give_up give_up;
        gang_msg_api api;
    } u;
} gang_msg;

/*
 * Encodes m as one frame into buf[0..cap). On success returns 0 and the frame length in
 * *out_len. GANG_EINVAL for an unknown type or a field out of bounds (a string too long
 * for its capacity, a blob len > GANG_BLOB_MAX, nranks > GANG_MAX_LOCAL_RANKS);
 * GANG_EMSGSIZE when cap is too small.
 */
int gang_wire_encode(const gang_msg *m, uint8_t *buf, size_t cap, size_t *out_len);

typedef struct gang_wire_header {
    uint32_t magic;
    uint16_t version;
    uint16_t type;
    uint64_t generation;
    uint32_t payload_len;
} gang_wire_header;

/*
 * Parses and validates a header from buf[0..len). Returns 0, GANG_EAGAIN when len <
 * GANG_WIRE_HEADER_SIZE, GANG_EPROTO for a bad magic or unknown type, GANG_EVERSION for
 * another version, GANG_EMSGSIZE when payload_len > GANG_WIRE_MAX_PAYLOAD.
 */
int gang_wire_decode_header(const uint8_t *buf, size_t len, gang_wire_header *h);

/*
 * Decodes one whole frame from buf[0..len) into m. Returns 0 and the bytes used in
 * *consumed; GANG_EAGAIN if the frame is not complete yet; a header error as above;
 * GANG_EPROTO for a payload that is truncated, has trailing bytes, or holds an invalid
 * field (string too long or with a NUL byte, blob len out of bounds, nranks too big).
 * Never reads outside buf[0..len).
 */
int gang_wire_decode(const uint8_t *buf, size_t len, gang_msg *m, size_t *consumed);

/*
 * Streaming frame reader for a byte stream: feed it what arrives, take messages out.
 * Owns a buffer of GANG_WIRE_MAX_FRAME bytes. Not thread-safe.
 */
typedef struct gang_wire_reader gang_wire_reader;
gang_wire_reader *gang_wire_reader_new(void);
void gang_wire_reader_free(gang_wire_reader *r);
/*
 * Checks the tag that follows frame[0..len) (header and payload); returns 0 to accept or
 * a negative GANG_E* (GANG_EAUTH) to reject. Connections pass gang_auth_session_verify.
 */
typedef int (*gang_wire_tag_check_fn)(void *ctx, const uint8_t *frame, size_t len,
                                      const uint8_t tag[GANG_WIRE_TAG_SIZE]);
/*
 * From the next frame on, every frame must be followed by a GANG_WIRE_TAG_SIZE-byte tag:
 * _next() validates the header as soon as its 20 bytes are in, waits for payload and tag,
 * calls fn(ctx, ...) before the payload is decoded, and fails with fn's error (sticky) on
 * a rejected tag. fn NULL: frames are untagged again. ctx must outlive the reader.
 */
void gang_wire_reader_set_tag_check(gang_wire_reader *r, gang_wire_tag_check_fn fn, void *ctx);
/*
 * Appends data (all or nothing); GANG_EMSGSIZE if it does not fit (drain with _next
 * first), or the stream's saved error once _next() has failed.
 */
int gang_wire_reader_feed(gang_wire_reader *r, const uint8_t *data, size_t len);
/* Room left for feed(). */
size_t gang_wire_reader_space(const gang_wire_reader *r);
/*
 * Takes the next complete message: returns 1 with *m filled, 0 when more bytes are
 * needed, or a negative error (the stream is then unusable: close the connection). A
 * bad header is reported as soon as its 20 bytes are in, before any payload arrives.
 */
int gang_wire_reader_next(gang_wire_reader *r, gang_msg *m);
/* Bytes buffered but not yet taken. */
size_t gang_wire_reader_pending(const gang_wire_reader *r);

/* =================================================================================
 * Authentication: HMAC-SHA256 (libsodium) keyed by SHA-256 of the shared token.
 *
 *   coordinator -> CHALLENGE(server_nonce)
 *   member      -> JOIN(..., client_nonce, mac_m = HMAC(k, "ganglion-join-v1" |
 *                       server_nonce | client_nonce | job | 0x00 | u32le node_index |
 *                       u32le nnodes | u32le nproc_per_node | u32le tp | u32le pp |
 *                       model_digest | u64le generation_seen | host | 0x00))
 *   coordinator -> WELCOME(mac_c = HMAC(k, "ganglion-welcome-v1" | client_nonce |
 *                       server_nonce))  or REJECT(GANG_EAUTH)
 * Both sides prove the token; the fresh nonces stop replay. After WELCOME, every frame
 * in both directions carries a session tag (gang_session below, docs/protocol.md §5.3).
 * ================================================================================= */
typedef struct gang_token {
    int present;     /* 0 = no token configured */
    uint8_t key[32]; /* SHA-256 of the token file's contents */
} gang_token;

/* Initialises libsodium; call once before anything else here. Safe to call again. */
int gang_auth_init(void);
/*
 * Loads a token file: trailing whitespace/newlines are stripped; the token must be 16
 * to 4096 bytes. path "" gives a token with present = 0. Errors: GANG_ENOENT /
 * GANG_EACCES (file), GANG_EINVAL (too short, too long, empty) with a message in err.
 */
int gang_auth_load_token(const char *path, gang_token *t, char *err, size_t errlen);
/* Fills out with n cryptographically random bytes. */
void gang_auth_random(uint8_t *out, size_t n);
/* Computes the member's JOIN mac into j->mac (over j's fields and server_nonce). */
void gang_auth_sign_join(const gang_token *t, const uint8_t server_nonce[GANG_NONCE_SIZE],
                         gang_msg_join *j);
/* Verifies j->mac in constant time: 0 or GANG_EAUTH. */
int gang_auth_verify_join(const gang_token *t, const uint8_t server_nonce[GANG_NONCE_SIZE],
                          const gang_msg_join *j);
/* The coordinator's proof for WELCOME. */
void gang_auth_sign_welcome(const gang_token *t, const uint8_t client_nonce[GANG_NONCE_SIZE],
                            const uint8_t server_nonce[GANG_NONCE_SIZE],
                            uint8_t mac[GANG_MAC_SIZE]);
int gang_auth_verify_welcome(const gang_token *t, const uint8_t client_nonce[GANG_NONCE_SIZE],
                             const uint8_t server_nonce[GANG_NONCE_SIZE],
                             const uint8_t mac[GANG_MAC_SIZE]);
/*
 * Session MACs after the handshake (docs/protocol.md §5.3), only with a token:
 *   session_key = HMAC(k, "ganglion-session-v1" | server_nonce | client_nonce)
 *   tag = HMAC(session_key, dir | u64le seq | frame bytes)[0..16)
 * dir is the direction byte below; seq counts the frames of that direction from 0.
 */
#define GANG_SESSION_DIR_TO_MEMBER 1 /* coordinator -> member */
#define GANG_SESSION_DIR_TO_COORD 2  /* member -> coordinator */
typedef struct gang_session {
    int active;                  /* 0: frames travel untagged (no token) */
    uint8_t key[32];             /* per-connection session key */
    uint8_t send_dir, recv_dir;  /* GANG_SESSION_DIR_* */
    uint64_t send_seq, recv_seq; /* next sequence number of each direction */
} gang_session;
/*
 * Derives the session from the token and the handshake's nonces; coordinator_side picks
 * the directions. Without a token (t->present = 0) s is left inactive.
 */
void gang_auth_session_start(gang_session *s, const gang_token *t,
                             const uint8_t server_nonce[GANG_NONCE_SIZE],
                             const uint8_t client_nonce[GANG_NONCE_SIZE], int coordinator_side);
/* Wipes the key and deactivates s. */
void gang_auth_session_clear(gang_session *s);
/* Tags the next outgoing frame (frame[0..len)), advancing send_seq. 0 or GANG_EINVAL. */
int gang_auth_session_sign(gang_session *s, const uint8_t *frame, size_t len,
                           uint8_t tag[GANG_WIRE_TAG_SIZE]);
/*
 * Verifies the tag of the next incoming frame in constant time, advancing recv_seq on
 * success. GANG_EAUTH for a forged, modified, replayed, reordered or reflected frame;
 * GANG_EINVAL when s is inactive.
 */
int gang_auth_session_verify(gang_session *s, const uint8_t *frame, size_t len,
                             const uint8_t tag[GANG_WIRE_TAG_SIZE]);

/*
 * Digest of a model directory: SHA-256 over config.json's bytes and the names and sizes
 * of its *.safetensors / *.json files in sorted order. An empty path digests to the
 * SHA-256 of the empty string. GANG_ENOENT when the directory or its config.json does
 * not exist, GANG_EMODEL when config.json is over 64 MiB. docs/protocol.md §5.5 gives the
 * exact construction. A path that is a regular file (a GGUF model) digests to SHA-256 of
 * "file", its first 4 MiB and its u64le size.
 */
int gang_model_digest(const char *dir, uint8_t out[GANG_DIGEST_SIZE]);

/* =================================================================================
 * Identity and discovery (docs/design.md §3). Sources, first match wins:
 *   1. flags: --node-index >= 0 (and --coordinator, else discovered below);
 *   2. Open MPI: OMPI_COMM_WORLD_RANK / OMPI_COMM_WORLD_SIZE (one agent per node);
 *      needs --coordinator;
 *   3. LeaderWorkerSet: LWS_WORKER_INDEX, LWS_GROUP_SIZE, LWS_LEADER_ADDRESS;
 *   4. StatefulSet: hostname NAME-ORDINAL + --service (GANGLION_SERVICE) + namespace
 *      (--namespace, else POD_NAMESPACE, else "default") + --cluster-domain:
 *      coordinator = NAME-0.SERVICE.NAMESPACE.svc.DOMAIN:rdzv_port.
 * ================================================================================= */
typedef enum gang_identity_source {
    GANG_ID_FLAGS = 0,
    GANG_ID_MPI,
    GANG_ID_LWS,
    GANG_ID_STATEFULSET
} gang_identity_source;

typedef struct gang_identity {
    gang_identity_source source;
    int32_t node_index; /* 0-based */
    int32_t nnodes;     /* from the source, or the --nnodes flag */
    char coordinator_host[GANG_HOST_MAX];
    uint16_t coordinator_port;
    int is_coordinator; /* node_index == 0 */
} gang_identity;

const char *gang_identity_source_name(gang_identity_source s);

/*
 * Derives this process's identity from the parameters p and the environment envp (a
 * NULL-terminated "K=V" array; pure: reads nothing else). hostname is the machine's
 * host name (the caller passes gethostname()'s answer; p->hostname overrides it).
 * Returns 0, or GANG_EUSAGE with a clear message in err (no source matched, an index
 * outside [0, nnodes), a group size that disagrees with --nnodes, a bad HOST:PORT).
 */
int gang_identity_discover(const gang_params *p, char *const *envp, const char *hostname,
                           gang_identity *id, char *err, size_t errlen);

/* Splits "host:port" or "[v6]:port" (port required, 1..65535). */
int gang_parse_host_port(const char *s, char *host, size_t hostcap, uint16_t *port);

/* =================================================================================
 * Coordinator (inside agent 0) and member (every agent), on the caller's libuv loop.
 * Both are single-threaded: every function below runs on the loop thread.
 * ================================================================================= */
typedef struct gang_coord gang_coord;

typedef struct gang_coord_config {
    const char *bind_address; /* listen address */
    int port;                 /* 0 = ephemeral */
    const char *job;
    uint32_t nnodes, nproc_per_node, tp, pp;
    uint8_t model_digest[GANG_DIGEST_SIZE];
    gang_token token; /* present = 0: accept unauthenticated (warned) */
    uint64_t heartbeat_interval_ms, heartbeat_timeout_ms;
    uint64_t handshake_timeout_ms, start_timeout_ms;
    uint32_t max_restarts; /* within restart_window_ms */
    uint64_t restart_window_ms, restart_backoff_ms, restart_backoff_max_ms;
    uint32_t max_connections;
    /*
     * API frames from node `node` (a member's forwarded requests), generation gen as the
     * member sent it; NULL: they are logged and dropped. api_ctx is handed back.
     */
    void (*on_api)(void *api_ctx, uint32_t node, uint64_t gen, const uint8_t *data, uint32_t len);
    void *api_ctx;
} gang_coord_config;

/*
 * Binds and starts serving on uv_loop. Returns 0 with *out, or a GANG_E* code (the port
 * is taken, bad address). The coordinator lives until gang_coord_close(); its memory is
 * released by the loop once every handle has closed.
 */
int gang_coord_start(void *uv_loop, const gang_coord_config *cfg, gang_coord **out);
void gang_coord_close(gang_coord *c);
int gang_coord_port(const gang_coord *c);

typedef struct gang_coord_rank {
    uint8_t state;             /* gang_rank_state as last reported */
    uint32_t heartbeat_age_ms; /* worker heartbeat age reported by its agent, plus the
                                  age of that report; GANG_HEARTBEAT_NEVER: no process
                                  or no report from its node */
} gang_coord_rank;

typedef struct gang_coord_status {
    gang_state state;
    uint64_t generation;
    uint32_t members;             /* authenticated member connections */
    uint32_t members_max;         /* the gang's nodes: a slot each, nothing more admitted */
    uint32_t connections;         /* rendezvous connections held (joined or not) */
    uint32_t connections_max;     /* --max-connections */
    uint64_t connections_refused; /* closed at once for being over --max-connections */
    uint64_t restarts_total;
    uint32_t budget_left;      /* restarts left in the current window */
    double rendezvous_seconds; /* last time from "all waiting" to SERVING */
    double formation_seconds;  /* last time from the last JOIN (BLOB_REQUEST) to SERVING */
    uint64_t serving_since_wall_ms;
    int32_t last_failure_rank;
    int32_t last_failure_code;
    uint64_t last_failure_wall_ms; /* 0 = none */
    char last_failure[GANG_REASON_MAX];
    uint32_t world_size;
    uint64_t frames_rejected;     /* connections closed for a bad session tag */
    const gang_coord_rank *ranks; /* world_size entries, valid until the next loop turn */
} gang_coord_status;

void gang_coord_get_status(gang_coord *c, gang_coord_status *st);

/*
 * Sends an API frame (len <= GANG_API_FRAME_MAX bytes) for generation gen to the member
 * of node `node`. 0; GANG_ECLOSED when that node has no joined connection; GANG_EAGAIN
 * when its connection already has GANG_API_QUEUE_MAX bytes waiting to be written;
 * GANG_EINVAL for a bad node or length.
 */
int gang_coord_send_api(gang_coord *c, uint32_t node, uint64_t gen, const uint8_t *data,
                        uint32_t len);

typedef struct gang_member gang_member;

/* Callbacks from the member to its agent; all run on the loop thread. */
typedef struct gang_member_callbacks {
    void *ctx;
    /* Node 0 only: produce the bootstrap blob for gen, then gang_member_send_blob(). */
    void (*on_blob_request)(void *ctx, uint64_t gen);
    /* Start generation gen: bring the local ranks up, then gang_member_send_ready(). */
    void (*on_start)(void *ctx, uint64_t gen, uint32_t world_size, const uint8_t *blob,
                     uint32_t len);
    /*
     * Abort the current generation in place (keep workers alive), then call
     * gang_member_set_available(m, 1). Also called with code GANG_ECLOSED when the
     * coordinator is lost.
     */
    void (*on_abort)(void *ctx, uint64_t gen, int32_t rank, int32_t code, const char *reason);
    /* The restart budget is spent: the gang stays down (a GIVE_UP, or a JOIN refused with
     * GANG_EBUDGET, as a member dropped before the GIVE_UP is; called once). */
    void (*on_give_up)(void *ctx, const char *reason);
    /* The coordinator refused this member for good (config mismatch, bad token). */
    void (*on_rejected)(void *ctx, int32_t code, const char *reason);
    /* Fill node_index, nranks and the per-rank state/age of the next heartbeat. */
    void (*fill_heartbeat)(void *ctx, gang_msg_heartbeat *hb);
    /* An API frame from the coordinator (tokens of forwarded requests); may be NULL. */
    void (*on_api)(void *ctx, uint64_t gen, const uint8_t *data, uint32_t len);
} gang_member_callbacks;

typedef struct gang_member_config {
    const char *coordinator_host; /* re-resolved on every connect */
    uint16_t coordinator_port;
    gang_msg_join join; /* identity fields; nonce, mac, generation filled here */
    gang_token token;
    uint64_t heartbeat_interval_ms, heartbeat_timeout_ms, connect_timeout_ms;
    uint64_t backoff_initial_ms, backoff_max_ms;
} gang_member_config;

int gang_member_start(void *uv_loop, const gang_member_config *cfg, const gang_member_callbacks *cb,
                      gang_member **out);
void gang_member_close(gang_member *m);
/* Declares whether the local ranks are idle and able to join a new generation. */
void gang_member_set_available(gang_member *m, int available);
int gang_member_send_blob(gang_member *m, uint64_t gen, const uint8_t *blob, uint32_t len);
int gang_member_send_ready(gang_member *m, uint64_t gen);
/* Reports a local failure (worker died, hung, data-plane error) to the coordinator. */
int gang_member_report_failure(gang_member *m, uint64_t gen, int32_t rank, int32_t code,
                               const char *reason);
/*
 * Sends an API frame (a forwarded request's traffic, len <= GANG_API_FRAME_MAX) for
 * generation gen. 0; GANG_ECLOSED while not joined; GANG_EAGAIN when the connection
 * already has GANG_API_QUEUE_MAX bytes waiting; GANG_EINVAL for a bad length.
 */
int gang_member_send_api(gang_member *m, uint64_t gen, const uint8_t *data, uint32_t len);

typedef struct gang_member_status {
    int connected;                         /* welcomed by the coordinator */
    gang_state gang_state;                 /* as last heard from the coordinator */
    uint64_t generation;                   /* generation of the last START */
    uint32_t coordinator_heartbeat_age_ms; /* GANG_HEARTBEAT_NEVER while not connected */
    uint64_t reconnects;
    uint64_t last_abort_wall_ms;
    uint64_t connected_since_ms; /* monotonic, 0 = never */
    uint64_t resolves;           /* resolver lookups of the coordinator's name (none when it
                                    is a numeric address) */
} gang_member_status;

void gang_member_get_status(const gang_member *m, gang_member_status *st);

#endif /* GANGLION_RENDEZVOUS_H */
