/* Framed TCP connections for the rendezvous protocol; see conn.h. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conn.h"

int gang__uv_err(int uverr)
{
    if (uverr == UV_EOF)
        return GANG_ECLOSED;
    if (uverr == UV_ETIMEDOUT)
        return GANG_ETIMEDOUT;
    if (uverr == UV_ECONNREFUSED)
        return GANG_ECONNREFUSED;
    if (uverr == UV_ECONNRESET || uverr == UV_EPIPE)
        return GANG_ECONNRESET;
    if (uverr == UV_ENOMEM)
        return GANG_ENOMEM;
    if (uverr == UV_EADDRINUSE)
        return GANG_EEXIST;
    if (uverr == UV_EACCES)
        return GANG_EACCES;
    if (uverr == UV_EINVAL)
        return GANG_EINVAL;
    return GANG_EIO;
}

int gang__conn_init(uv_loop_t *loop, gang__conn *c, void *owner, gang__conn_msg_cb on_msg,
                    gang__conn_close_cb on_close)
{
    c->rd = gang_wire_reader_new();
    c->msg = malloc(sizeof(*c->msg));
    if (c->rd == NULL || c->msg == NULL)
        goto out_nomem;
    c->owner = owner;
    c->on_msg = on_msg;
    c->on_close = on_close;
    c->opened_ms = gang_now_ms();
    c->last_rx_ms = c->opened_ms;
    uv_tcp_init(loop, &c->tcp);
    c->tcp.data = c;
    snprintf(c->peer, sizeof(c->peer), "?");
    return 0;
out_nomem:
    gang_wire_reader_free(c->rd);
    free(c->msg);
    c->rd = NULL;
    c->msg = NULL;
    return GANG_ENOMEM;
}

/*
 * One read buffer per thread: libuv calls alloc and read back to back on the loop
 * thread, so the bytes are copied into the connection's reader before the buffer can be
 * reused. This keeps idle connections cheap (only the reader's buffer each).
 */
static _Thread_local char read_buf[64 * 1024];

static void conn_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    (void)h;
    (void)suggested;
    buf->base = read_buf;
    buf->len = sizeof(read_buf);
}

static void conn_on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
    gang__conn *c = s->data;
    if (nread < 0) {
        gang__conn_close(c, gang__uv_err((int)nread));
        return;
    }
    if (nread == 0 || c->closing)
        return;
    /* Feed in pieces: a frame is taken out as soon as it is complete, making room. */
    size_t off = 0;
    while (off < (size_t)nread && !c->closing) {
        size_t room = gang_wire_reader_space(c->rd);
        size_t n = (size_t)nread - off < room ? (size_t)nread - off : room;
        int rc =
            n ? gang_wire_reader_feed(c->rd, (const uint8_t *)buf->base + off, n) : GANG_EMSGSIZE;
        if (rc != 0) {
            gang__conn_close(c, rc);
            return;
        }
        off += n;
        while (!c->closing) {
            rc = gang_wire_reader_next(c->rd, c->msg);
            if (rc == 0)
                break;
            if (rc == GANG_EAUTH) {
                gang__conn_peer_warn(c->warn_limit,
                                     "rendezvous: closing %s: rejected frame %llu: its session "
                                     "tag is wrong (forged, modified, replayed, reordered or "
                                     "reflected)",
                                     c->peer, (unsigned long long)c->sess.recv_seq);
                gang__conn_close(c, rc);
                return;
            }
            if (rc < 0) {
                gang__conn_peer_warn(c->warn_limit, "rendezvous: closing %s: bad frame: %s",
                                     c->peer, gang_strerror(rc));
                gang__conn_close(c, rc);
                return;
            }
            c->last_rx_ms = gang_now_ms();
            c->on_msg(c, c->msg);
        }
    }
}

int gang__conn_start(gang__conn *c)
{
    struct sockaddr_storage ss;
    int len = sizeof(ss);
    if (uv_tcp_getpeername(&c->tcp, (struct sockaddr *)&ss, &len) == 0) {
        char ip[48] = "?";
        int port = 0;
        if (ss.ss_family == AF_INET) {
            struct sockaddr_in *a = (struct sockaddr_in *)&ss;
            uv_ip4_name(a, ip, sizeof(ip));
            port = ntohs(a->sin_port);
        } else if (ss.ss_family == AF_INET6) {
            struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;
            uv_ip6_name(a, ip, sizeof(ip));
            port = ntohs(a->sin6_port);
        }
        snprintf(c->peer, sizeof(c->peer), "%s:%d", ip, port);
    }
    uv_tcp_nodelay(&c->tcp, 1);
    int rc = uv_read_start((uv_stream_t *)&c->tcp, conn_alloc, conn_on_read);
    return rc ? gang__uv_err(rc) : 0;
}

typedef struct conn_write {
    uv_write_t req;
    int close_after; /* close the connection once this is written (REJECT) */
    uint8_t data[];
} conn_write;

static void conn_on_write(uv_write_t *req, int status)
{
    conn_write *w = (conn_write *)req;
    gang__conn *c = req->handle->data;
    int close_after = w->close_after;
    free(w);
    if (status < 0)
        gang__conn_close(c, gang__uv_err(status));
    else if (close_after)
        gang__conn_close(c, 0);
}

/* Encoding scratch, one per thread like read_buf: the frame is copied out right away. */
static _Thread_local uint8_t encode_buf[GANG_WIRE_MAX_FRAME];

static int conn_send(gang__conn *c, const gang_msg *m, int close_after)
{
    if (c->closing)
        return GANG_ECLOSED;
    size_t len = 0;
    int rc = gang_wire_encode(m, encode_buf, sizeof(encode_buf) - GANG_WIRE_TAG_SIZE, &len);
    if (rc != 0)
        return rc;
    if (c->sess.active) {
        rc = gang_auth_session_sign(&c->sess, encode_buf, len, encode_buf + len);
        if (rc != 0)
            return rc;
        len += GANG_WIRE_TAG_SIZE;
    }
    /* Sized to the frame: heartbeats are ~100 bytes, not a 64 KiB maximum. */
    conn_write *w = malloc(sizeof(*w) + len);
    if (w == NULL)
        return GANG_ENOMEM;
    memcpy(w->data, encode_buf, len);
    w->close_after = close_after;
    uv_buf_t buf = uv_buf_init((char *)w->data, (unsigned)len);
    rc = uv_write(&w->req, (uv_stream_t *)&c->tcp, &buf, 1, conn_on_write);
    if (rc != 0) {
        free(w);
        return gang__uv_err(rc);
    }
    return 0;
}

int gang__conn_send(gang__conn *c, const gang_msg *m)
{
    return conn_send(c, m, 0);
}

int gang__conn_send_api(gang__conn *c, const gang_msg *m)
{
    if (!c->closing && uv_stream_get_write_queue_size((uv_stream_t *)&c->tcp) > GANG_API_QUEUE_MAX)
        return GANG_EAGAIN;
    return conn_send(c, m, 0);
}

void gang__conn_reject(gang__conn *c, int32_t code, const char *reason)
{
    gang_msg *m = calloc(1, sizeof(*m));
    if (m == NULL) {
        gang__conn_close(c, GANG_ENOMEM);
        return;
    }
    m->type = GANG_MSG_REJECT;
    m->u.reject.code = code;
    gang_strlcpy(m->u.reject.reason, reason, sizeof(m->u.reject.reason));
    if (conn_send(c, m, 1) != 0)
        gang__conn_close(c, GANG_ECLOSED);
    else
        uv_read_stop((uv_stream_t *)&c->tcp);
    free(m);
}

static void conn_on_closed(uv_handle_t *h)
{
    gang__conn *c = h->data;
    gang_wire_reader_free(c->rd);
    free(c->msg);
    c->rd = NULL;
    c->msg = NULL;
    gang_auth_session_clear(&c->sess);
    c->on_close(c, c->close_err);
}

static int conn_tag_check(void *ctx, const uint8_t *frame, size_t len,
                          const uint8_t tag[GANG_WIRE_TAG_SIZE])
{
    return gang_auth_session_verify(ctx, frame, len, tag);
}

void gang__conn_start_session(gang__conn *c, const gang_token *t,
                              const uint8_t server_nonce[GANG_NONCE_SIZE],
                              const uint8_t client_nonce[GANG_NONCE_SIZE], int coordinator_side)
{
    gang_auth_session_start(&c->sess, t, server_nonce, client_nonce, coordinator_side);
    if (c->sess.active && c->rd != NULL)
        gang_wire_reader_set_tag_check(c->rd, conn_tag_check, &c->sess);
}

void gang__conn_close(gang__conn *c, int err)
{
    if (c->closing)
        return;
    c->closing = 1;
    c->close_err = err;
    uv_close((uv_handle_t *)&c->tcp, conn_on_closed);
}

void gang__conn_peer_warn(gang_log_limit *limit, const char *fmt, ...)
{
    char line[768];
    uint64_t held = 0;
    va_list ap;
    if (limit != NULL && !gang_log_limit_allow(limit, gang_now_ms(), &held))
        return;
    va_start(ap, fmt);
    vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    if (held > 0)
        gang_warn("%s (and %llu more such lines held back: at most %d per %d s)", line,
                  (unsigned long long)held, GANG_LOG_LIMIT_BURST, GANG_LOG_LIMIT_WINDOW_MS / 1000);
    else if (limit != NULL && limit->in_window == GANG_LOG_LIMIT_BURST)
        gang_warn("%s (further such lines held back for up to %d s, then counted)", line,
                  GANG_LOG_LIMIT_WINDOW_MS / 1000);
    else
        gang_warn("%s", line);
}
