/*
 * Minimal HTTP/1.1 server on a libuv loop (internal to launcher/), parsing with the
 * maintained http_parser library. Serves probes, metrics, status and the API.
 *
 * Bounds: request line + headers <= 16 KiB, body <= max_body (413 beyond), at most
 * max_conns connections (extra ones are closed at accept), and a connection that does not
 * complete a request within idle_timeout_ms is closed (slowloris). Keep-alive supported.
 * Malformed requests get 400 and the connection is closed; others keep being served.
 */
#ifndef GANGLION_LAUNCHER_HTTP_H
#define GANGLION_LAUNCHER_HTTP_H

#include <stddef.h>
#include <stdint.h>

typedef struct gang_http_server gang_http_server;
typedef struct gang_http_exchange gang_http_exchange;

typedef struct gang_http_request {
    const char *method; /* "GET", "POST", ... */
    const char *path;   /* path without the query string, NUL-terminated */
    const char *query;  /* query string without '?', or "" */
    const char *body;   /* NUL-terminated copy of the body ("" if none) */
    size_t body_len;
    const char *authorization; /* the Authorization header's value, "" if none or too long */
} gang_http_request;

/*
 * Called on the loop thread for each complete request. The handler must call
 * gang_http_reply() exactly once for x, now or later from the loop thread (for
 * asynchronous answers). req is valid only during the call. If the client disconnects
 * first, a later reply is accepted and dropped; x stays valid until it is replied to.
 */
typedef void (*gang_http_handler)(void *ctx, gang_http_exchange *x, const gang_http_request *req);

typedef struct gang_http_config {
    const char *bind_address; /* "0.0.0.0", "127.0.0.2", "::" */
    int port;                 /* 0 = ephemeral (see gang_http_server_port) */
    size_t max_body;          /* bytes */
    int max_conns;
    uint64_t idle_timeout_ms;
} gang_http_config;

/*
 * Starts listening on uv_loop (a uv_loop_t *). Returns 0 and the server in *out, or a
 * GANG_E* code (address in use -> GANG_EEXIST, bad address -> GANG_EINVAL). The loop must be run by
 * the caller.
 */
int gang_http_server_start(void *uv_loop, const gang_http_config *cfg, gang_http_handler h,
                           void *ctx, gang_http_server **out);
/* The bound port (useful with port 0). */
int gang_http_server_port(const gang_http_server *s);
/*
 * Stops accepting, closes every connection; memory is released once the loop has run
 * the close callbacks. Pending exchanges may still be replied to (the reply is dropped).
 */
void gang_http_server_close(gang_http_server *s);
/*
 * Sends the response for x and releases x. body is copied; content_type NULL means
 * "text/plain; charset=utf-8". Must run on the loop thread.
 */
void gang_http_reply(gang_http_exchange *x, int status, const char *content_type, const char *body,
                     size_t body_len);

/*
 * Streaming responses (Server-Sent Events): gang_http_stream_begin sends the status line
 * and headers with Transfer-Encoding: chunked (and content_type, e.g. "text/event-stream";
 * Cache-Control: no-cache); each gang_http_stream_write sends one chunk (data copied);
 * gang_http_stream_end sends the last chunk, releases x and lets a keep-alive connection
 * serve its next request. After begin, gang_http_reply on x only ends the stream.
 * begin and write return 0, or GANG_ECLOSED when the client is gone (its connection
 * closed, or it stopped reading and more than GANG_HTTP_STREAM_MAX_QUEUED bytes wait:
 * the connection is then closed); the caller must still end x. Loop thread only.
 */
#define GANG_HTTP_STREAM_MAX_QUEUED (8u << 20)
int gang_http_stream_begin(gang_http_exchange *x, int status, const char *content_type);
int gang_http_stream_write(gang_http_exchange *x, const char *data, size_t len);
void gang_http_stream_end(gang_http_exchange *x);

#endif
