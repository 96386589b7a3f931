/*
 * Internals of the HTTP server shared by http.c (connections, parsing, responses) and
 * http-stream.c (chunked streaming responses). Internal to serve/http*.c.
 */
#ifndef GANGLION_SERVE_HTTP_INTERNAL_H
#define GANGLION_SERVE_HTTP_INTERNAL_H

#include <http_parser.h>
#include <uv.h>

#include "ganglion/serve.h"

#define HTTP_MAX_HEAD (16 * 1024)      /* request line + headers, in bytes */
#define HTTP_READ_BUF (64 * 1024)      /* one read() worth */
#define HTTP_LINGER_MS 2000            /* cap on draining after the final response */
#define HTTP_KEEP_BODY_CAP (64 * 1024) /* larger body buffers are not kept across requests */
#define HTTP_BACKLOG 511
#define HTTP_FIELD_MAX 16 /* header names we look at are shorter */
#define HTTP_VALUE_MAX 32
#define HTTP_AUTH_MAX 512 /* Authorization values kept; longer ones read as absent */

typedef enum conn_state {
    CONN_READING = 0,
    CONN_HANDLING,
    CONN_WRITING,
    CONN_LINGERING,
    CONN_CLOSED
} conn_state;

typedef struct http_conn http_conn;

struct gang_http_server {
    uv_loop_t *loop;
    uv_tcp_t listener;
    gang_http_handler handler;
    void *ctx;
    size_t max_body;
    int max_conns;
    int probe_reserve;                         /* more connections, for probe_paths only */
    const char *const *probe_paths;            /* NULL-terminated, or NULL */
    uint64_t idle_timeout_ms;                  /* 0 = no deadline */
    char cors_header[GANG_HTTP_CORS_MAX + 40]; /* "Access-Control-Allow-Origin: X\r\n", or "" */
    int port;
    int nconns;                   /* open connections, counted against max_conns */
    int refs;                     /* listener + every connection not yet freed */
    int closing;                  /* gang_http_server_close() was called */
    uint64_t last_reject_warn_ms; /* rate limit of the "too many connections" warning */
    uint64_t rejected;            /* connections closed at accept since the last warning */
    uint64_t shed; /* connections still reading a request closed for new ones, in all */
    uint64_t last_shed_warn_ms;   /* rate limit of the shedding warning */
    http_conn *conns;             /* open connections (doubly linked) */
    int read_buf_busy;            /* read_buf is lent to a read in progress */
    char read_buf[HTTP_READ_BUF]; /* shared: reads are sequential on the loop thread */
};

struct http_conn {
    uv_tcp_t tcp;
    uv_timer_t timer; /* idle / write / linger deadline */
    uv_shutdown_t shutdown;
    gang_http_server *srv;
    http_conn *prev, *next; /* in srv->conns while not CLOSED */
    int refs;               /* handles not yet closed + exchange outstanding */
    conn_state state;
    int reading;   /* uv_read_start() is in effect */
    int shut_done; /* LINGERING: the final response is out */
    http_parser parser;
    gang_http_exchange *x; /* the exchange being handled, if any */
    int reserved;          /* holds one of the probes' reserved slots */

    /* The request being parsed. */
    char *url;
    size_t url_len, url_cap;
    char *body;
    size_t body_len, body_cap;
    size_t head_bytes; /* request line + header bytes seen (approximately) */
    int err_status;    /* 413/431 decided inside a parser callback */
    int keep_alive;
    int last_was_value;          /* header callbacks: a new field starts after a value */
    char field[HTTP_FIELD_MAX];  /* current header name, lower-case, if short */
    size_t field_len;            /* may exceed HTTP_FIELD_MAX: then it matches nothing */
    char expect[HTTP_VALUE_MAX]; /* value of Expect:, if short */
    size_t expect_len;
    char auth[HTTP_AUTH_MAX + 1]; /* value of Authorization:, NUL-terminated when kept */
    size_t auth_len;              /* may exceed HTTP_AUTH_MAX: then it reads as absent */

    /* Bytes received after a complete request, parsed once its response is written. */
    char *pending;
    size_t pending_len;
};

struct gang_http_exchange {
    http_conn *conn; /* holds a reference until the reply */
    int keep_alive;
    int head;      /* HEAD request: headers only */
    int streaming; /* gang_http_stream_begin sent the head: chunks follow */
};

typedef enum write_kind {
    WRITE_INTERIM = 0, /* 100 Continue: the request goes on */
    WRITE_RESPONSE,    /* keep-alive response: resume reading when done */
    WRITE_FINAL        /* last response: lingering close follows */
} write_kind;

typedef struct http_write {
    uv_write_t req;
    http_conn *conn;
    write_kind kind;
    char data[]; /* header + body */
} http_write;

/* Closes the connection (idempotent); memory goes in the close callbacks. */
void gang__http_conn_close(http_conn *c);
/* Drops a reference; the last one frees the connection. */
void gang__http_conn_unref(http_conn *c);
/* Queues len bytes of w->data; on failure the connection is closed. */
void gang__http_conn_write(http_conn *c, http_write *w, size_t len);
/*
 * Queues the last bytes of a response (w->data, len) and moves the connection on: to
 * WRITING with keep_alive (reading resumes once they are out), else to LINGERING
 * (write-side shutdown, drain, close).
 */
void gang__http_conn_finish(http_conn *c, http_write *w, size_t len, int keep_alive);

#endif
