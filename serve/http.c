/*
 * Minimal HTTP/1.1 server on libuv with http_parser (contract in http.h).
 *
 * Life of a connection (one request at a time; pipelined bytes wait their turn):
 *
 *    accept
 *      |
 *      v       request complete              reply, keep-alive
 *   READING ----------------------> HANDLING -------------------> WRITING
 *    ^  |                               |                           |
 *    |  | bad request, 413, 431         | reply, close              |
 *    |  +-------------------------------+---> LINGERING             |
 *    |                                           |                  |
 *    +-------------- response written -----------|------------------+
 *                                                v
 *                                             CLOSED  (also from any state on a deadline,
 *                                                      EOF, socket error or server close)
 *
 * READING   the read side is on; the idle timer runs from accept (or from the end of the
 *           previous response) and is NOT pushed back by arriving bytes, so a client that
 *           drips a request byte by byte (slowloris) is still cut off at the deadline.
 * HANDLING  the parser is paused after on_message_complete, reading is stopped and the
 *           bytes after the request are kept for later. No timer: the handler's own
 *           deadlines apply (a completion may take long).
 * WRITING   a keep-alive response is in flight; the idle timer bounds a client that
 *           does not read it. When it is written, the kept bytes are parsed, then
 *           reading resumes.
 * LINGERING the final response is queued, followed by a write-side shutdown; incoming
 *           bytes are read and dropped until EOF or a short timer. Closing right away
 *           with unread request bytes in the kernel would make it send RST, and the
 *           client could lose the 4xx response it has not read yet.
 * CLOSED    uv_close() was called on both handles; memory goes in the close callbacks.
 *
 * Ownership: a connection is freed when its reference count drops to zero. Its two
 * handles hold one reference each until their close callbacks, and an exchange handed to
 * the handler holds one until it is replied to; so a reply that comes after the client
 * left (or after gang_http_server_close()) finds valid memory, sees CLOSED and is dropped.
 * The server is freed likewise when its listener and every connection are gone.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "ganglion/common.h"
#include "http-internal.h"

#define conn_close gang__http_conn_close
#define conn_write gang__http_conn_write
#define conn_unref gang__http_conn_unref
static void conn_parse(http_conn *c, const char *data, size_t len);

/* ------------------------------------------------------------------ lifetime */

static void server_unref(gang_http_server *s)
{
    if (--s->refs == 0)
        free(s);
}

void gang__http_conn_unref(http_conn *c)
{
    gang_http_server *s;

    if (--c->refs > 0)
        return;
    s = c->srv;
    free(c->url);
    free(c->body);
    free(c->pending);
    free(c);
    server_unref(s);
}

static void on_conn_handle_closed(uv_handle_t *h)
{
    conn_unref(h->data);
}

/*
 * Closes the connection: unlinks it, frees its slot for max_conns and closes both
 * handles. Idempotent. Queued writes and the shutdown request are cancelled by libuv and
 * their callbacks run (with UV_ECANCELED) before the close callbacks, so they may still
 * look at c. Memory is released in the close callbacks.
 */
void gang__http_conn_close(http_conn *c)
{
    gang_http_server *s = c->srv;

    if (c->state == CONN_CLOSED)
        return;
    c->state = CONN_CLOSED;
    if (c->prev != NULL)
        c->prev->next = c->next;
    else
        s->conns = c->next;
    if (c->next != NULL)
        c->next->prev = c->prev;
    c->prev = c->next = NULL;
    s->nconns--;
    uv_close((uv_handle_t *)&c->tcp, on_conn_handle_closed);
    uv_close((uv_handle_t *)&c->timer, on_conn_handle_closed);
}

static void on_timer(uv_timer_t *t)
{
    http_conn *c = t->data;

    /* HANDLING stops the timer, so any deadline that fires ends the connection. */
    gang_debug("http: closing a connection at its deadline (state %d)", (int)c->state);
    conn_close(c);
}

static void conn_arm_timer(http_conn *c, uint64_t ms)
{
    if (ms == 0)
        uv_timer_stop(&c->timer);
    else
        uv_timer_start(&c->timer, on_timer, ms, 0);
}

/* ------------------------------------------------------------------ reading */

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    http_conn *c = h->data;
    gang_http_server *s = c->srv;

    (void)suggested;
    if (!s->read_buf_busy) {
        s->read_buf_busy = 1;
        *buf = uv_buf_init(s->read_buf, sizeof(s->read_buf));
        return;
    }
    /* Not expected (reads do not nest), but stay correct if libuv ever interleaves them. */
    buf->base = malloc(HTTP_READ_BUF);
    buf->len = buf->base != NULL ? HTTP_READ_BUF : 0;
}

static void on_read(uv_stream_t *stream, ssize_t nread, const uv_buf_t *buf);

static void conn_read_start(http_conn *c)
{
    if (c->reading || c->state == CONN_CLOSED)
        return;
    if (uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read) < 0) {
        conn_close(c);
        return;
    }
    c->reading = 1;
}

static void conn_read_stop(http_conn *c)
{
    if (!c->reading)
        return;
    uv_read_stop((uv_stream_t *)&c->tcp);
    c->reading = 0;
}

/*
 * Keeps bytes that arrived after a complete request (pipelining) until its response is
 * written. They came from one read, so they are bounded by HTTP_READ_BUF.
 */
static int conn_keep_pending(http_conn *c, const char *data, size_t len)
{
    char *p;

    if (len == 0)
        return 0;
    if (c->pending_len + len > 4 * HTTP_READ_BUF)
        return GANG_EMSGSIZE;
    p = realloc(c->pending, c->pending_len + len);
    if (p == NULL)
        return GANG_ENOMEM;
    memcpy(p + c->pending_len, data, len);
    c->pending = p;
    c->pending_len += len;
    return 0;
}

static void on_read(uv_stream_t *stream, ssize_t nread, const uv_buf_t *buf)
{
    http_conn *c = stream->data;
    gang_http_server *s = c->srv;

    if (nread < 0) {
        /*
         * EOF or a socket error. No request can be pending (reading stops while one is
         * handled), so the connection is done, except for a client that half-closed after
         * its request while our final response is still being written: on_shutdown closes.
         */
        if (nread == UV_EOF && c->state == CONN_LINGERING && !c->shut_done)
            conn_read_stop(c);
        else
            conn_close(c);
    } else if (nread > 0) {
        switch (c->state) {
        case CONN_READING:
            conn_parse(c, buf->base, (size_t)nread);
            break;
        case CONN_HANDLING:
        case CONN_WRITING:
            if (conn_keep_pending(c, buf->base, (size_t)nread) < 0)
                conn_close(c);
            break;
        case CONN_LINGERING:
        case CONN_CLOSED:
            break; /* drained and dropped */
        }
    }
    if (buf->base == s->read_buf)
        s->read_buf_busy = 0;
    else
        free(buf->base);
}

/* ------------------------------------------------------------------ writing */

static void on_shutdown(uv_shutdown_t *req, int status)
{
    http_conn *c = req->data;
    uint64_t linger = HTTP_LINGER_MS;

    if (c->state == CONN_CLOSED)
        return;
    if (status < 0 || !c->reading) {
        /* Failed, or the client already sent EOF: nothing is left to drain. */
        conn_close(c);
        return;
    }
    c->shut_done = 1;
    /* The response is out; drain what the client still sends for a short while. */
    if (c->srv->idle_timeout_ms != 0 && c->srv->idle_timeout_ms < linger)
        linger = c->srv->idle_timeout_ms;
    conn_arm_timer(c, linger);
}

static void conn_resume(http_conn *c);

static void on_write(uv_write_t *req, int status)
{
    http_write *w = (http_write *)req;
    http_conn *c = w->conn;
    write_kind kind = w->kind;

    free(w);
    if (c->state == CONN_CLOSED)
        return;
    if (status < 0) {
        gang_debug("http: write failed: %s", uv_strerror(status));
        conn_close(c);
        return;
    }
    if (kind == WRITE_RESPONSE && c->state == CONN_WRITING)
        conn_resume(c);
}

/*
 * Queues len bytes (already formatted in w->data) on c. On failure the connection is
 * closed; the caller must not assume anything about c's state afterwards.
 */
void gang__http_conn_write(http_conn *c, http_write *w, size_t len)
{
    uv_buf_t b = uv_buf_init(w->data, (unsigned int)len);

    w->conn = c;
    if (uv_write(&w->req, (uv_stream_t *)&c->tcp, &b, 1, on_write) < 0) {
        free(w);
        conn_close(c);
    }
}

static const char *reason_phrase(int status)
{
    const char *r = http_status_str((enum http_status)status);

    return (r == NULL || r[0] == '<') ? "Unknown" : r;
}

/*
 * Formats and queues a response with Content-Length and an explicit Connection header.
 * With keep_alive the connection goes to WRITING and resumes reading once the bytes are
 * out; otherwise it goes to LINGERING: write, shut the write side down, drain, close.
 * head suppresses the body bytes (HEAD); 1xx, 204 and 304 carry no body and no length.
 */
static void conn_send_response(http_conn *c, int status, const char *content_type, const char *body,
                               size_t body_len, int keep_alive, int head)
{
    int no_body = status < 200 || status == 204 || status == 304;
    const char *cors = c->srv->cors_header;
    char hdr[768];
    http_write *w;
    int n;

    if (c->srv->closing)
        keep_alive = 0;
    if (content_type == NULL)
        content_type = "text/plain; charset=utf-8";
    if (no_body)
        n = snprintf(hdr, sizeof(hdr), "HTTP/1.1 %d %s\r\n%sConnection: %s\r\n\r\n", status,
                     reason_phrase(status), cors, keep_alive ? "keep-alive" : "close");
    else
        n = snprintf(hdr, sizeof(hdr),
                     "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n"
                     "%sConnection: %s\r\n\r\n",
                     status, reason_phrase(status), content_type, body_len, cors,
                     keep_alive ? "keep-alive" : "close");
    if (n < 0 || (size_t)n >= sizeof(hdr)) {
        /* Only an absurd content type gets here; answer something well-formed instead. */
        n = snprintf(hdr, sizeof(hdr),
                     "HTTP/1.1 500 Internal Server Error\r\nContent-Length: 0\r\n"
                     "Connection: close\r\n\r\n");
        keep_alive = 0;
        no_body = 1;
    }
    if (no_body || head)
        body_len = 0;
    w = malloc(sizeof(*w) + (size_t)n + body_len);
    if (w == NULL) {
        conn_close(c);
        return;
    }
    memcpy(w->data, hdr, (size_t)n);
    if (body_len > 0)
        memcpy(w->data + n, body, body_len);
    gang__http_conn_finish(c, w, (size_t)n + body_len, keep_alive);
}

void gang__http_conn_finish(http_conn *c, http_write *w, size_t len, int keep_alive)
{
    if (c->srv->closing)
        keep_alive = 0;
    w->kind = keep_alive ? WRITE_RESPONSE : WRITE_FINAL;
    if (keep_alive) {
        c->state = CONN_WRITING;
        conn_arm_timer(c, c->srv->idle_timeout_ms);
    } else {
        c->state = CONN_LINGERING;
        /* Bound the time the client takes to read the response; on_shutdown re-arms. */
        conn_arm_timer(c,
                       c->srv->idle_timeout_ms != 0 ? c->srv->idle_timeout_ms : HTTP_LINGER_MS * 5);
    }
    conn_write(c, w, len);
    if (keep_alive || c->state == CONN_CLOSED)
        return;
    c->shutdown.data = c;
    if (uv_shutdown(&c->shutdown, (uv_stream_t *)&c->tcp, on_shutdown) < 0) {
        conn_close(c);
        return;
    }
    conn_read_start(c);
}

/*
 * Answers a CORS preflight (OPTIONS with CORS on): 204, the origin, the methods and
 * headers the API takes, and how long a browser may cache the answer. The connection is
 * kept as the request asked.
 */
static void conn_preflight(http_conn *c)
{
    char hdr[512];
    int n = snprintf(hdr, sizeof(hdr),
                     "HTTP/1.1 204 No Content\r\n%s"
                     "Access-Control-Allow-Methods: GET, POST, OPTIONS\r\n"
                     "Access-Control-Allow-Headers: Authorization, Content-Type\r\n"
                     "Access-Control-Max-Age: 600\r\nConnection: %s\r\n\r\n",
                     c->srv->cors_header, c->keep_alive ? "keep-alive" : "close");
    http_write *w = n > 0 && (size_t)n < sizeof(hdr) ? malloc(sizeof(*w) + (size_t)n) : NULL;
    if (w == NULL) {
        conn_close(c);
        return;
    }
    memcpy(w->data, hdr, (size_t)n);
    gang__http_conn_finish(c, w, (size_t)n, c->keep_alive);
}

/* Whether path[0..len) is one of the server's probe paths. */
static int probe_path(const gang_http_server *s, const char *path, size_t len)
{
    for (const char *const *p = s->probe_paths; p != NULL && *p != NULL; p++)
        if (strlen(*p) == len && memcmp(*p, path, len) == 0)
            return 1;
    return 0;
}

/* Answers a request that failed to parse or exceeded a limit, then closes. */
static void conn_fail(http_conn *c, int status)
{
    /* OpenAI's error shape, as the API's (serve/api.c, gang__api_error_object). */
    const char *msg =
        status == 413   ? "{\"error\":{\"message\":\"request body too large\","
                          "\"type\":\"invalid_request_error\",\"param\":null,"
                          "\"code\":\"request_too_large\"}}"
        : status == 431 ? "{\"error\":{\"message\":\"request header fields too large\","
                          "\"type\":\"invalid_request_error\",\"param\":null,"
                          "\"code\":\"headers_too_large\"}}"
        : status == 500 ? "{\"error\":{\"message\":\"internal error\",\"type\":"
                          "\"server_error\",\"param\":null,\"code\":null}}"
        : status == 503 ? "{\"error\":{\"message\":\"every connection is busy: this one "
                          "is kept for the probes\",\"type\":\"server_error\",\"param\":null,"
                          "\"code\":\"overloaded\"}}"
                        : "{\"error\":{\"message\":\"bad request\","
                          "\"type\":\"invalid_request_error\",\"param\":null,\"code\":null}}";

    conn_send_response(c, status, "application/json", msg, strlen(msg), 0, 0);
}

static void conn_send_continue(http_conn *c)
{
    static const char cont[] = "HTTP/1.1 100 Continue\r\n\r\n";
    http_write *w = malloc(sizeof(*w) + sizeof(cont) - 1);

    if (w == NULL)
        return; /* the client sends the body after its own timeout anyway */
    memcpy(w->data, cont, sizeof(cont) - 1);
    w->kind = WRITE_INTERIM;
    conn_write(c, w, sizeof(cont) - 1);
}

/* ------------------------------------------------------------------ parser callbacks */

/* Grows *buf to hold need bytes (plus a NUL the request view adds later). */
static int grow(char **buf, size_t *cap, size_t need)
{
    size_t ncap = *cap != 0 ? *cap : 256;
    char *p;

    if (need + 1 <= *cap)
        return 0;
    while (ncap < need + 1)
        ncap *= 2;
    p = realloc(*buf, ncap);
    if (p == NULL)
        return GANG_ENOMEM;
    *buf = p;
    *cap = ncap;
    return 0;
}

/* Counts head bytes; flags 431 when the request line and headers pass HTTP_MAX_HEAD. */
static int head_account(http_conn *c, size_t len)
{
    c->head_bytes += len;
    if (c->head_bytes > HTTP_MAX_HEAD) {
        c->err_status = 431;
        return -1;
    }
    return 0;
}

static int on_message_begin(http_parser *p)
{
    http_conn *c = p->data;

    c->url_len = 0;
    c->body_len = 0;
    if (c->body_cap > HTTP_KEEP_BODY_CAP) {
        free(c->body);
        c->body = NULL;
        c->body_cap = 0;
    }
    c->head_bytes = 0;
    c->err_status = 0;
    c->last_was_value = 1;
    c->field_len = 0;
    c->expect_len = 0;
    c->auth_len = 0;
    return 0;
}

static int on_url(http_parser *p, const char *at, size_t len)
{
    http_conn *c = p->data;

    if (head_account(c, len) < 0)
        return -1;
    if (grow(&c->url, &c->url_cap, c->url_len + len) < 0) {
        c->err_status = 500;
        return -1;
    }
    memcpy(c->url + c->url_len, at, len);
    c->url_len += len;
    return 0;
}

static int on_header_field(http_parser *p, const char *at, size_t len)
{
    http_conn *c = p->data;

    /* ": " and CRLF are not passed to callbacks; count them once per header line. */
    if (head_account(c, len + (c->last_was_value ? 4 : 0)) < 0)
        return -1;
    if (c->last_was_value) {
        c->field_len = 0;
        c->last_was_value = 0;
    }
    for (size_t i = 0; i < len; i++, c->field_len++) {
        if (c->field_len < HTTP_FIELD_MAX)
            c->field[c->field_len] = (char)(at[i] >= 'A' && at[i] <= 'Z' ? at[i] + 32 : at[i]);
    }
    return 0;
}

static int on_header_value(http_parser *p, const char *at, size_t len)
{
    http_conn *c = p->data;

    if (head_account(c, len) < 0)
        return -1;
    c->last_was_value = 1;
    if (c->field_len == 13 && memcmp(c->field, "authorization", 13) == 0) {
        for (size_t i = 0; i < len; i++, c->auth_len++) {
            if (c->auth_len < HTTP_AUTH_MAX)
                c->auth[c->auth_len] = at[i];
        }
    }
    if (c->field_len == 6 && memcmp(c->field, "expect", 6) == 0) {
        for (size_t i = 0; i < len; i++, c->expect_len++) {
            if (c->expect_len < HTTP_VALUE_MAX)
                c->expect[c->expect_len] = at[i];
        }
    }
    return 0;
}

/*
 * Rejects a declared body over max_body before any of it is read, and answers
 * "Expect: 100-continue" so that clients such as curl send the body without waiting.
 */
static int on_headers_complete(http_parser *p)
{
    http_conn *c = p->data;
    int has_body = (p->flags & F_CHUNKED) || ((p->flags & F_CONTENTLENGTH) && p->content_length);

    if ((p->flags & F_CONTENTLENGTH) && p->content_length > c->srv->max_body) {
        c->err_status = 413;
        return -1;
    }
    if ((p->flags & F_CONTENTLENGTH) && p->content_length > 0 &&
        grow(&c->body, &c->body_cap, (size_t)p->content_length) < 0) {
        c->err_status = 500;
        return -1;
    }
    if (has_body && p->http_major == 1 && p->http_minor >= 1 &&
        c->expect_len == strlen("100-continue") &&
        strncasecmp(c->expect, "100-continue", c->expect_len) == 0)
        conn_send_continue(c);
    return 0;
}

static int on_body(http_parser *p, const char *at, size_t len)
{
    http_conn *c = p->data;

    /* Chunked bodies declare no length up front, so the cap is enforced here too. */
    if (len > c->srv->max_body - c->body_len) {
        c->err_status = 413;
        return -1;
    }
    if (grow(&c->body, &c->body_cap, c->body_len + len) < 0) {
        c->err_status = 500;
        return -1;
    }
    memcpy(c->body + c->body_len, at, len);
    c->body_len += len;
    return 0;
}

static int on_message_complete(http_parser *p)
{
    http_conn *c = p->data;

    /* After an Upgrade / CONNECT the client expects another protocol: answer and close. */
    c->keep_alive = http_should_keep_alive(p) && !p->upgrade;
    /* Stop here: http_parser_execute() returns right after this request's last byte. */
    http_parser_pause(p, 1);
    return 0;
}

static const http_parser_settings parser_settings = {
    .on_message_begin = on_message_begin,
    .on_url = on_url,
    .on_header_field = on_header_field,
    .on_header_value = on_header_value,
    .on_headers_complete = on_headers_complete,
    .on_body = on_body,
    .on_message_complete = on_message_complete,
};

/* ------------------------------------------------------------------ requests */

/*
 * Hands the complete request to the handler. The URL is split in place (the parser
 * reports offsets; NULs replace the '?' and '#' separators), and the body gets a NUL.
 */
static void conn_dispatch(http_conn *c)
{
    gang_http_server *s = c->srv;
    struct http_parser_url u;
    gang_http_request req;
    gang_http_exchange *x;

    c->state = CONN_HANDLING;
    conn_read_stop(c);
    uv_timer_stop(&c->timer);

    http_parser_url_init(&u);
    if (c->url_len == 0 ||
        http_parser_parse_url(c->url, c->url_len, c->parser.method == HTTP_CONNECT, &u) != 0) {
        conn_fail(c, 400);
        return;
    }
    if (c->parser.method == HTTP_OPTIONS && s->cors_header[0] != '\0') {
        conn_preflight(c);
        return;
    }
    int has_path = (u.field_set & (1u << UF_PATH)) != 0;
    if (c->reserved && !probe_path(s, c->url + (has_path ? u.field_data[UF_PATH].off : 0),
                                   has_path ? u.field_data[UF_PATH].len : 0)) {
        conn_fail(c, 503); /* a probe's slot: the API waits for a regular one */
        return;
    }
    req.method = http_method_str((enum http_method)c->parser.method);
    req.path = "/";
    req.query = "";
    if (u.field_set & (1u << UF_PATH)) {
        c->url[u.field_data[UF_PATH].off + u.field_data[UF_PATH].len] = '\0';
        req.path = c->url + u.field_data[UF_PATH].off;
    }
    if (u.field_set & (1u << UF_QUERY)) {
        c->url[u.field_data[UF_QUERY].off + u.field_data[UF_QUERY].len] = '\0';
        req.query = c->url + u.field_data[UF_QUERY].off;
    }
    if (c->body != NULL) {
        c->body[c->body_len] = '\0'; /* grow() always leaves room for it */
        req.body = c->body;
    } else {
        req.body = "";
    }
    req.body_len = c->body_len;
    if (c->auth_len <= HTTP_AUTH_MAX) {
        c->auth[c->auth_len] = '\0';
        req.authorization = c->auth;
    } else {
        req.authorization = "";
    }

    x = calloc(1, sizeof(*x));
    if (x == NULL) {
        conn_fail(c, 500);
        return;
    }
    x->conn = c;
    x->keep_alive = c->keep_alive;
    x->head = c->parser.method == HTTP_HEAD;
    c->x = x;
    c->refs++; /* the exchange's */
    s->handler(s->ctx, x, &req);
}

/*
 * Feeds bytes to the parser in READING state. A complete request pauses the parser:
 * the rest of the bytes are kept and the request is dispatched. A parse error or a limit
 * gets its status and the connection ends.
 */
static void conn_parse(http_conn *c, const char *data, size_t len)
{
    size_t n = http_parser_execute(&c->parser, &parser_settings, data, len);
    enum http_errno e = HTTP_PARSER_ERRNO(&c->parser);

    if (e == HPE_PAUSED) {
        http_parser_pause(&c->parser, 0);
        if (conn_keep_pending(c, data + n, len - n) < 0) {
            conn_close(c);
            return;
        }
        conn_dispatch(c);
        return;
    }
    if (e != HPE_OK) {
        int status = c->err_status != 0 ? c->err_status : e == HPE_HEADER_OVERFLOW ? 431 : 400;

        gang_debug("http: rejecting a request with %d (%s)", status, http_errno_name(e));
        conn_fail(c, status);
    }
}

/* Back to READING after a keep-alive response: parse what was kept, then read more. */
static void conn_resume(http_conn *c)
{
    char *buf = c->pending;
    size_t len = c->pending_len;

    c->state = CONN_READING;
    conn_arm_timer(c, c->srv->idle_timeout_ms);
    if (len > 0) {
        c->pending = NULL;
        c->pending_len = 0;
        conn_parse(c, buf, len);
        free(buf);
    }
    if (c->state == CONN_READING)
        conn_read_start(c);
}

/* See http.h. Runs on the loop thread; x is freed here. */
void gang_http_reply(gang_http_exchange *x, int status, const char *content_type, const char *body,
                     size_t body_len)
{
    http_conn *c = x->conn;
    int keep_alive = x->keep_alive, head = x->head;

    if (x->streaming) { /* the head is out: an answer now can only end the stream */
        gang_http_stream_end(x);
        return;
    }
    free(x);
    c->x = NULL;
    if (c->state == CONN_HANDLING) {
        /* 1xx is interim, never the answer to a request; nonsense becomes a 500. */
        if (status < 200 || status > 599)
            status = 500;
        if (body == NULL)
            body_len = 0;
        conn_send_response(c, status, content_type, body, body_len, keep_alive, head);
    }
    /* Otherwise the client left or the server closed: the reply is dropped. */
    conn_unref(c);
}

/* ------------------------------------------------------------------ server */

static void on_reject_closed(uv_handle_t *h)
{
    free(h);
}

/*
 * Closes a connection accepted beyond max_conns. Accepting (rather than leaving it in the
 * backlog) keeps libuv from spinning on the readable listener and tells the client at once.
 */
static void server_reject(gang_http_server *s)
{
    uv_tcp_t *t = malloc(sizeof(*t));
    uint64_t now = uv_now(s->loop);

    if (t == NULL)
        return;
    uv_tcp_init(s->loop, t);
    if (uv_accept((uv_stream_t *)&s->listener, (uv_stream_t *)t) == 0)
        s->rejected++;
    uv_close((uv_handle_t *)t, on_reject_closed);
    if (now - s->last_reject_warn_ms >= 5000 || s->last_reject_warn_ms == 0) {
        gang_warn("http: at the limit of %d connections; closed %llu new one(s) since the "
                  "last warning",
                  s->max_conns, (unsigned long long)s->rejected);
        s->last_reject_warn_ms = now != 0 ? now : 1;
        s->rejected = 0;
    }
}

/*
 * The connection a new one replaces at the cap: the longest-standing one still reading a
 * request (a slow client, or a keep-alive one idle between requests), or NULL when every
 * connection is being answered. The list is newest first.
 */
static http_conn *server_victim(gang_http_server *s)
{
    http_conn *v = NULL;
    for (http_conn *c = s->conns; c != NULL; c = c->next)
        if (c->state == CONN_READING)
            v = c;
    return v;
}

/*
 * At the cap, a new connection sheds the oldest one that has not finished sending its
 * request, so that clients which open connections and send slowly (or nothing) cannot
 * starve the probes and other clients: only connections being answered hold their place.
 * When every connection is being answered the new one is refused.
 */
static void on_connection(uv_stream_t *listener, int status)
{
    gang_http_server *s = listener->data;
    http_conn *c;

    if (status < 0) {
        gang_warn("http: accept failed: %s", uv_strerror(status));
        return;
    }
    int reserved = 0;
    if (s->nconns >= s->max_conns) {
        http_conn *v = server_victim(s);
        if (v == NULL && s->nconns < s->max_conns + s->probe_reserve) {
            reserved = 1; /* every connection is being answered: a probe's slot */
            goto accept;
        }
        if (v == NULL) {
            server_reject(s);
            return;
        }
        reserved = v->reserved; /* the new one takes the shed one's slot */
        conn_close(v);
        s->shed++;
        uint64_t now = uv_now(s->loop);
        if (now - s->last_shed_warn_ms >= 5000 || s->last_shed_warn_ms == 0) {
            gang_warn("http: at the limit of %d connections: closing the oldest ones still "
                      "sending a request (%llu so far)",
                      s->max_conns, (unsigned long long)s->shed);
            s->last_shed_warn_ms = now != 0 ? now : 1;
        }
    }
accept:
    c = calloc(1, sizeof(*c));
    if (c == NULL) {
        server_reject(s);
        return;
    }
    c->srv = s;
    c->reserved = reserved;
    s->refs++;
    uv_tcp_init(s->loop, &c->tcp);
    uv_timer_init(s->loop, &c->timer);
    c->tcp.data = c;
    c->timer.data = c;
    c->refs = 2;
    c->state = CONN_READING;
    http_parser_init(&c->parser, HTTP_REQUEST);
    c->parser.data = c;
    c->next = s->conns;
    if (s->conns != NULL)
        s->conns->prev = c;
    s->conns = c;
    s->nconns++;
    if (uv_accept(listener, (uv_stream_t *)&c->tcp) < 0) {
        conn_close(c);
        return;
    }
    uv_tcp_nodelay(&c->tcp, 1);
    conn_arm_timer(c, s->idle_timeout_ms);
    conn_read_start(c);
}

static void on_listener_closed(uv_handle_t *h)
{
    server_unref(h->data);
}

/*
 * Creates the listening socket with plain socket calls, so that the usual failures
 * (address in use, bad address) leave no libuv handle behind and nothing to wait for.
 * Returns the fd and the bound port, or GANG_EINVAL / the GANG_E* code of the errno.
 */
static int listen_socket(const char *address, int port, int *bound_port)
{
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss), alen;
    int one = 1, fd, rc;

    memset(&ss, 0, sizeof(ss));
    if (uv_ip4_addr(address, port, (struct sockaddr_in *)&ss) != 0 &&
        uv_ip6_addr(address, port, (struct sockaddr_in6 *)&ss) != 0)
        return GANG_EINVAL;
    fd = socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return gang_err_from_errno(errno);
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    alen = ss.ss_family == AF_INET6 ? sizeof(struct sockaddr_in6) : sizeof(struct sockaddr_in);
    if (bind(fd, (struct sockaddr *)&ss, alen) < 0 || listen(fd, HTTP_BACKLOG) < 0 ||
        getsockname(fd, (struct sockaddr *)&ss, &sl) < 0) {
        rc = gang_err_from_errno(errno);
        close(fd);
        return rc;
    }
    *bound_port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                                 : ((struct sockaddr_in *)&ss)->sin_port);
    return fd;
}

/* Whether a CORS origin is absent or fits a header: printable, no separators of lines. */
static int cors_ok(const char *o)
{
    if (o == NULL)
        return 1;
    if (strlen(o) > GANG_HTTP_CORS_MAX)
        return 0;
    for (; *o; o++)
        if ((unsigned char)*o < 0x21 || (unsigned char)*o > 0x7e)
            return 0;
    return 1;
}

/*
 * See http.h. Errors: GANG_EINVAL (bad config or address), the errno of socket, bind or
 * listen through gang_err_from_errno() (address in use: GANG_EEXIST; permission:
 * GANG_EACCES), GANG_ENOMEM. On the unlikely failure of libuv after the socket exists, the
 * handle is closed and its memory goes when the loop runs next.
 */
int gang_http_server_start(void *uv_loop, const gang_http_config *cfg, gang_http_handler h,
                           void *ctx, gang_http_server **out)
{
    gang_http_server *s;
    int fd, port = 0, rc;

    *out = NULL;
    if (uv_loop == NULL || cfg == NULL || h == NULL || cfg->bind_address == NULL || cfg->port < 0 ||
        cfg->port > 65535 || cfg->max_conns < 1 || !cors_ok(cfg->cors_origin))
        return GANG_EINVAL;
    fd = listen_socket(cfg->bind_address, cfg->port, &port);
    if (fd < 0)
        return fd;
    s = calloc(1, sizeof(*s));
    if (s == NULL) {
        close(fd);
        return GANG_ENOMEM;
    }
    s->loop = uv_loop;
    s->handler = h;
    s->ctx = ctx;
    s->max_body = cfg->max_body;
    s->max_conns = cfg->max_conns;
    s->probe_reserve = cfg->probe_reserve > 0 ? cfg->probe_reserve : 0;
    s->probe_paths = cfg->probe_paths;
    s->idle_timeout_ms = cfg->idle_timeout_ms;
    if (cfg->cors_origin != NULL && cfg->cors_origin[0] != '\0')
        snprintf(s->cors_header, sizeof(s->cors_header), "Access-Control-Allow-Origin: %s\r\n",
                 cfg->cors_origin);
    s->port = port;
    s->refs = 1;
    uv_tcp_init(s->loop, &s->listener);
    s->listener.data = s;
    rc = uv_tcp_open(&s->listener, fd);
    if (rc < 0) {
        close(fd);
        goto out_close;
    }
    rc = uv_listen((uv_stream_t *)&s->listener, HTTP_BACKLOG, on_connection);
    if (rc < 0)
        goto out_close;
    *out = s;
    return 0;

out_close:
    uv_close((uv_handle_t *)&s->listener, on_listener_closed);
    return gang_err_from_errno(-rc); /* libuv codes are negative errnos on Unix */
}

int gang_http_server_port(const gang_http_server *s)
{
    return s->port;
}

/* See http.h. Idempotent; connections in HANDLING keep their memory until replied to. */
void gang_http_server_close(gang_http_server *s)
{
    if (s == NULL || s->closing)
        return;
    s->closing = 1;
    uv_close((uv_handle_t *)&s->listener, on_listener_closed);
    while (s->conns != NULL)
        conn_close(s->conns);
}
