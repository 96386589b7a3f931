/*
 * Chunked streaming responses of the HTTP server (contract in http.h): the head goes out
 * at begin, every write is one chunk, end sends the zero-length chunk and hands the
 * connection back to http.c's keep-alive or lingering close. The connection stays in
 * HANDLING while it streams, so bytes a client sends meanwhile are kept for its next
 * request, as for any other response.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ganglion/common.h"
#include "http-internal.h"

/* Whether x's connection can still take bytes; closes one whose client stopped reading. */
static int stream_open(gang_http_exchange *x)
{
    http_conn *c = x->conn;
    if (c->state != CONN_HANDLING)
        return 0;
    if (c->tcp.write_queue_size > GANG_HTTP_STREAM_MAX_QUEUED) {
        gang_warn("http: closing a stream whose client does not read (%zu bytes queued)",
                  c->tcp.write_queue_size);
        gang__http_conn_close(c);
        return 0;
    }
    return 1;
}

/* Queues one chunk: hex length, CRLF, the bytes, CRLF. */
static int stream_chunk(http_conn *c, const char *data, size_t len)
{
    http_write *w = malloc(sizeof(*w) + 24 + len);
    if (w == NULL) {
        gang__http_conn_close(c);
        return GANG_ECLOSED;
    }
    int n = snprintf(w->data, 24, "%zx\r\n", len);
    memcpy(w->data + n, data, len);
    memcpy(w->data + n + len, "\r\n", 2);
    w->kind = WRITE_INTERIM;
    gang__http_conn_write(c, w, (size_t)n + len + 2);
    return c->state == CONN_HANDLING ? 0 : GANG_ECLOSED;
}

int gang_http_stream_begin(gang_http_exchange *x, int status, const char *content_type)
{
    http_conn *c = x->conn;
    char hdr[768];
    if (x->streaming)
        return GANG_EINVAL;
    x->streaming = 1;
    if (!stream_open(x))
        return GANG_ECLOSED;
    int n = snprintf(hdr, sizeof(hdr),
                     "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nCache-Control: no-cache\r\n"
                     "Transfer-Encoding: chunked\r\n%sConnection: %s\r\n\r\n",
                     status, http_status_str((enum http_status)status),
                     content_type ? content_type : "text/event-stream", c->srv->cors_header,
                     x->keep_alive && !c->srv->closing ? "keep-alive" : "close");
    if (n < 0 || (size_t)n >= sizeof(hdr))
        return GANG_EINVAL;
    http_write *w = malloc(sizeof(*w) + (size_t)n);
    if (w == NULL) {
        gang__http_conn_close(c);
        return GANG_ECLOSED;
    }
    memcpy(w->data, hdr, (size_t)n);
    w->kind = WRITE_INTERIM;
    gang__http_conn_write(c, w, (size_t)n);
    return c->state == CONN_HANDLING ? 0 : GANG_ECLOSED;
}

int gang_http_stream_write(gang_http_exchange *x, const char *data, size_t len)
{
    if (!x->streaming)
        return GANG_EINVAL;
    if (!stream_open(x))
        return GANG_ECLOSED;
    if (len == 0 || x->head)
        return 0; /* a zero-length chunk would end the body */
    return stream_chunk(x->conn, data, len);
}

void gang_http_stream_end(gang_http_exchange *x)
{
    http_conn *c = x->conn;
    int keep_alive = x->keep_alive;
    free(x);
    c->x = NULL;
    if (c->state == CONN_HANDLING) {
        static const char last[] = "0\r\n\r\n";
        http_write *w = malloc(sizeof(*w) + sizeof(last) - 1);
        if (w == NULL) {
            gang__http_conn_close(c);
        } else {
            memcpy(w->data, last, sizeof(last) - 1);
            gang__http_conn_finish(c, w, sizeof(last) - 1, keep_alive);
        }
    }
    gang__http_conn_unref(c);
}
