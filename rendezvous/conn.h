/*
 * Framed TCP connection on libuv, shared by the coordinator and the member (internal to
 * rendezvous/). Bytes are fed to a gang_wire_reader; each complete message is handed to
 * on_msg; any decode error closes the connection. Once the owner starts c->sess (after a
 * token handshake), every frame sent is tagged and every frame received must carry a valid
 * tag, else the connection closes with GANG_EAUTH. Sends encode into a heap buffer that
 * libuv owns until the write completes, so callers never keep buffers alive.
 */
#ifndef GANG_RDZV_CONN_H
#define GANG_RDZV_CONN_H

#include <uv.h>

#include "ganglion/rendezvous.h"

typedef struct gang__conn gang__conn;
typedef void (*gang__conn_msg_cb)(gang__conn *c, const gang_msg *m);
/* Called exactly once, from libuv's close callback: the owner frees c here. */
typedef void (*gang__conn_close_cb)(gang__conn *c, int err);

struct gang__conn {
    uv_tcp_t tcp; /* must stay first: handles are cast back to the conn */
    gang_wire_reader *rd;
    gang_msg *msg;     /* decode scratch (messages are up to ~9 KiB) */
    gang_session sess; /* per-connection MACs; inactive until the handshake */
    void *owner;       /* coordinator or member */
    gang__conn_msg_cb on_msg;
    gang__conn_close_cb on_close;
    int closing;         /* gang__conn_close() was called */
    int close_err;       /* why it closed (0 = asked to) */
    uint64_t last_rx_ms; /* monotonic time of the last complete message */
    uint64_t opened_ms;
    char peer[64];              /* "ip:port" for logs */
    gang_log_limit *warn_limit; /* the owner's limit on lines a peer causes, or NULL */
};

/* A warning a remote peer can cause (a refused or broken connection), written through
 * limit (NULL: always written); the last line of a window's burst says that more are held
 * back, and the first line after a held-back run how many were. Loop thread. */
void gang__conn_peer_warn(gang_log_limit *limit, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Initialises c's TCP handle on loop; c must be zeroed. GANG_ENOMEM on failure. */
int gang__conn_init(uv_loop_t *loop, gang__conn *c, void *owner, gang__conn_msg_cb on_msg,
                    gang__conn_close_cb on_close);
/* Starts reading (after accept or connect) and records the peer address. */
int gang__conn_start(gang__conn *c);
/* Encodes and queues m. GANG_ECLOSED when closing, else the encode/libuv error. */
int gang__conn_send(gang__conn *c, const gang_msg *m);
/*
 * Starts the session MACs after a successful handshake (see gang_auth_session_start):
 * call it right after WELCOME was sent (coordinator) or verified (member). Every later
 * frame sent is tagged and every frame received must carry a valid tag. Without a token
 * it does nothing: the connection stays untagged.
 */
void gang__conn_start_session(gang__conn *c, const gang_token *t,
                              const uint8_t server_nonce[GANG_NONCE_SIZE],
                              const uint8_t client_nonce[GANG_NONCE_SIZE], int coordinator_side);
/*
 * Encodes and queues an API frame unless the connection already has GANG_API_QUEUE_MAX
 * bytes waiting to be written (GANG_EAGAIN): a peer that stops reading cannot make the
 * sender buffer without bound. Otherwise as gang__conn_send.
 */
int gang__conn_send_api(gang__conn *c, const gang_msg *m);
/* Closes once (idempotent); on_close(c, err) follows from the loop. */
void gang__conn_close(gang__conn *c, int err);
/* Sends REJECT(code, reason) and closes after it has been written. */
void gang__conn_reject(gang__conn *c, int32_t code, const char *reason);
/* Converts a libuv error into a GANG_E* code. */
int gang__uv_err(int uverr);

#endif
