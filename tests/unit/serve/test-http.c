/*
 * HTTP server: the server runs on a libuv loop in its own thread, on 127.0.0.1 with an
 * ephemeral port; the tests talk to it with plain blocking sockets that have receive
 * deadlines, so a server bug shows up as a failed assertion, never as a hung test.
 * Each test gets a fresh server (cmocka prestate = its configuration) and stops it
 * through a uv_async at the end; the loop must then close with no handle left.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <uv.h>

#include "ganglion/common.h"
#include "ganglion/serve.h"
#include "serve-tests.h"

#define RECV_DEADLINE_MS 5000

/* ------------------------------------------------------------------ server thread */

typedef struct fixture {
    gang_http_config cfg;
    uv_loop_t loop;
    uv_async_t stop;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int started; /* under mu: the thread has set start_rc and port */
    int start_rc;
    int port;
    gang_http_server *srv;
    int loop_close_rc; /* uv_loop_close() at the end: 0 = nothing leaked */
    int stop_sent;     /* test thread only: the stop async was sent */
    int stream_gone;   /* under mu: /stream-forever saw its client gone (GANG_ECLOSED) */
} fixture;

static void on_delayed_closed(uv_handle_t *h);

/* A streamed answer written from a timer: n chunks (forever: until the client is gone). */
typedef struct stream_writer {
    uv_timer_t timer;
    gang_http_exchange *x;
    fixture *f;
    int sent, n, forever;
} stream_writer;

static void on_stream_tick(uv_timer_t *t)
{
    stream_writer *w = t->data;
    char chunk[32];
    int len = snprintf(chunk, sizeof(chunk), "data: %d\n\n", w->sent++);
    int rc = gang_http_stream_write(w->x, chunk, (size_t)len);

    if (rc == GANG_ECLOSED && w->forever) {
        pthread_mutex_lock(&w->f->mu);
        w->f->stream_gone = 1;
        pthread_mutex_unlock(&w->f->mu);
    }
    if (rc != 0 || (!w->forever && w->sent == w->n)) {
        gang_http_stream_end(w->x);
        uv_timer_stop(t);
        uv_close((uv_handle_t *)t, on_delayed_closed);
    }
}

/* A reply sent later from a timer, as the coordinator does for completions. */
typedef struct delayed_reply {
    uv_timer_t timer;
    gang_http_exchange *x;
} delayed_reply;

static void on_delayed_closed(uv_handle_t *h)
{
    free(h->data);
}

static void on_delayed_reply(uv_timer_t *t)
{
    delayed_reply *d = t->data;

    gang_http_reply(d->x, 200, NULL, "late", 4);
    uv_close((uv_handle_t *)&d->timer, on_delayed_closed);
}

/*
 * Routes: GET /hello -> "hello"; /echo -> "METHOD PATH?QUERY BODY"; /async and
 * /async-slow -> "late" after 50 / 300 ms; /json -> a JSON body; anything else 404.
 */
static void handler(void *ctx, gang_http_exchange *x, const gang_http_request *req)
{
    fixture *f = ctx;

    if (strcmp(req->path, "/hello") == 0) {
        gang_http_reply(x, 200, NULL, "hello", 5);
    } else if (strcmp(req->path, "/echo") == 0) {
        char *out = malloc(req->body_len + 256);
        int n = sprintf(out, "%s %s?%s ", req->method, req->path, req->query);

        /* No cmocka assertion on this thread: a broken invariant answers 500 instead. */
        memcpy(out + n, req->body, req->body_len);
        if (strlen(req->body) != req->body_len) /* the body must be a NUL-terminated copy */
            gang_http_reply(x, 500, NULL, "body not terminated", 19);
        else
            gang_http_reply(x, 200, NULL, out, (size_t)n + req->body_len);
        free(out);
    } else if (strcmp(req->path, "/async") == 0 || strcmp(req->path, "/async-slow") == 0) {
        delayed_reply *d = calloc(1, sizeof(*d));

        d->x = x;
        d->timer.data = d;
        uv_timer_init(&f->loop, &d->timer);
        uv_timer_start(&d->timer, on_delayed_reply, strcmp(req->path, "/async") == 0 ? 50 : 300, 0);
    } else if (strcmp(req->path, "/stream") == 0 || strcmp(req->path, "/stream-forever") == 0) {
        stream_writer *w = calloc(1, sizeof(*w));

        w->x = x;
        w->f = f;
        w->n = 3;
        w->forever = strcmp(req->path, "/stream-forever") == 0;
        w->timer.data = w;
        uv_timer_init(&f->loop, &w->timer);
        if (gang_http_stream_begin(x, 200, "text/event-stream") != 0 ||
            gang_http_stream_begin(x, 200, NULL) != GANG_EINVAL) /* only once */
            gang_http_stream_write(x, "begin failed", 12);
        uv_timer_start(&w->timer, on_stream_tick, 10, 10);
    } else if (strcmp(req->path, "/auth") == 0) {
        gang_http_reply(x, 200, NULL, req->authorization, strlen(req->authorization));
    } else if (strcmp(req->path, "/json") == 0) {
        gang_http_reply(x, 201, "application/json", "{\"ok\":true}", 11);
    } else if (strcmp(req->path, "/nocontent") == 0) {
        gang_http_reply(x, 204, NULL, "ignored", 7);
    } else {
        gang_http_reply(x, 404, NULL, "not found\n", 10);
    }
}

static void on_stop(uv_async_t *a)
{
    fixture *f = a->data;

    gang_http_server_close(f->srv);
    uv_close((uv_handle_t *)&f->stop, NULL);
}

static void *loop_thread(void *arg)
{
    fixture *f = arg;
    int rc;

    uv_loop_init(&f->loop);
    f->stop.data = f;
    uv_async_init(&f->loop, &f->stop, on_stop);
    rc = gang_http_server_start(&f->loop, &f->cfg, handler, f, &f->srv);
    pthread_mutex_lock(&f->mu);
    f->start_rc = rc;
    f->port = rc == 0 ? gang_http_server_port(f->srv) : -1;
    f->started = 1;
    pthread_cond_signal(&f->cv);
    pthread_mutex_unlock(&f->mu);
    if (rc != 0)
        uv_close((uv_handle_t *)&f->stop, NULL);
    uv_run(&f->loop, UV_RUN_DEFAULT);
    f->loop_close_rc = uv_loop_close(&f->loop);
    return NULL;
}

static const gang_http_config default_cfg = {
    .bind_address = "127.0.0.1",
    .port = 0,
    .max_body = 1024,
    .max_conns = 16,
    .idle_timeout_ms = 300,
};

static int setup(void **state)
{
    const gang_http_config *cfg = *state != NULL ? *state : &default_cfg;
    fixture *f = calloc(1, sizeof(*f));

    f->cfg = *cfg;
    pthread_mutex_init(&f->mu, NULL);
    pthread_cond_init(&f->cv, NULL);
    if (pthread_create(&f->thread, NULL, loop_thread, f) != 0)
        return -1;
    pthread_mutex_lock(&f->mu);
    while (!f->started)
        pthread_cond_wait(&f->cv, &f->mu);
    pthread_mutex_unlock(&f->mu);
    *state = f;
    return f->start_rc;
}

/* Asks the loop thread to close the server; the loop then ends once every handle is gone. */
static void fixture_stop(fixture *f)
{
    if (!f->stop_sent)
        uv_async_send(&f->stop);
    f->stop_sent = 1;
}

static int teardown(void **state)
{
    fixture *f = *state;
    int rc;

    fixture_stop(f);
    pthread_join(f->thread, NULL);
    rc = f->loop_close_rc;
    pthread_mutex_destroy(&f->mu);
    pthread_cond_destroy(&f->cv);
    free(f);
    if (rc != 0)
        fprintf(stderr, "uv_loop_close: %s (a handle was left open)\n", uv_strerror(rc));
    return rc;
}

/* ------------------------------------------------------------------ client side */

static uint64_t now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static void set_rcvtimeo(int fd, int ms)
{
    struct timeval tv = {.tv_sec = ms / 1000, .tv_usec = (ms % 1000) * 1000};

    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
}

static int client_connect(const fixture *f)
{
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)f->port)};
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

    assert_true(fd >= 0);
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    set_rcvtimeo(fd, RECV_DEADLINE_MS);
    if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0)
        fail_msg("connect: %s", strerror(errno));
    return fd;
}

static void send_str(int fd, const char *s)
{
    size_t len = strlen(s), off = 0;

    while (off < len) {
        ssize_t n = send(fd, s + off, len - off, MSG_NOSIGNAL);

        if (n <= 0)
            fail_msg("send: %s", n < 0 ? strerror(errno) : "closed");
        off += (size_t)n;
    }
}

typedef struct response {
    int status;
    char head[4096]; /* status line + headers, NUL-terminated */
    char body[4096];
    size_t body_len;
    long content_length; /* -1 when absent */
    int closed;          /* Connection: close */
} response;

/*
 * Reads one response (headers, then Content-Length bytes unless head_only). Returns 0, or
 * -1 if the connection ended or the deadline passed first. Reads byte by byte so that
 * a following pipelined response stays in the socket.
 */
static int read_response_ex(int fd, response *r, int head_only)
{
    size_t hl = 0;
    const char *cl;

    memset(r, 0, sizeof(*r));
    r->content_length = -1;
    while (hl < 4 || memcmp(r->head + hl - 4, "\r\n\r\n", 4) != 0) {
        if (hl + 1 >= sizeof(r->head) || recv(fd, r->head + hl, 1, 0) != 1)
            return -1;
        hl++;
    }
    r->head[hl] = '\0';
    if (sscanf(r->head, "HTTP/1.1 %d ", &r->status) != 1)
        return -1;
    cl = strcasestr(r->head, "\r\nContent-Length: ");
    if (cl != NULL)
        r->content_length = strtol(cl + 18, NULL, 10);
    r->closed = strcasestr(r->head, "\r\nConnection: close\r\n") != NULL;
    if (head_only || r->content_length <= 0)
        return 0;
    if ((size_t)r->content_length >= sizeof(r->body))
        return -1;
    while (r->body_len < (size_t)r->content_length) {
        ssize_t n = recv(fd, r->body + r->body_len, (size_t)r->content_length - r->body_len, 0);

        if (n <= 0)
            return -1;
        r->body_len += (size_t)n;
    }
    return 0;
}

static int read_response(int fd, response *r)
{
    return read_response_ex(fd, r, 0);
}

/* Waits until the server closes fd: 1 on EOF/reset, 0 if the deadline passed first. */
static int wait_closed(int fd, int ms)
{
    char junk[256];

    set_rcvtimeo(fd, ms);
    for (;;) {
        ssize_t n = recv(fd, junk, sizeof(junk), 0);

        if (n == 0 || (n < 0 && errno == ECONNRESET))
            return 1;
        if (n < 0)
            return 0;
    }
}

static void expect_get(const fixture *f, const char *path, int status, const char *body)
{
    int fd = client_connect(f);
    response r;
    char req[256];

    snprintf(req, sizeof(req), "GET %s HTTP/1.1\r\nHost: t\r\n\r\n", path);
    send_str(fd, req);
    assert_int_equal(read_response(fd, &r), 0);
    assert_int_equal(r.status, status);
    assert_int_equal(r.body_len, strlen(body));
    assert_memory_equal(r.body, body, r.body_len);
    close(fd);
}

/* ------------------------------------------------------------------ tests */

static void test_get(void **state)
{
    fixture *f = *state;
    int fd = client_connect(f);
    response r;

    send_str(fd, "GET /hello HTTP/1.1\r\nHost: t\r\n\r\n");
    assert_int_equal(read_response(fd, &r), 0);
    assert_int_equal(r.status, 200);
    assert_non_null(strstr(r.head, "HTTP/1.1 200 OK\r\n"));
    assert_non_null(strstr(r.head, "\r\nContent-Type: text/plain; charset=utf-8\r\n"));
    assert_int_equal(r.content_length, 5);
    assert_false(r.closed);
    assert_string_equal(r.body, "hello");
    close(fd);

    expect_get(f, "/nope", 404, "not found\n");
    expect_get(f, "/json", 201, "{\"ok\":true}");
}

static void test_post_body(void **state)
{
    fixture *f = *state;
    int fd = client_connect(f);
    response r;

    send_str(fd, "POST /echo?a=1&b=2 HTTP/1.1\r\nHost: t\r\nContent-Length: 11\r\n\r\nhello world");
    assert_int_equal(read_response(fd, &r), 0);
    assert_int_equal(r.status, 200);
    assert_string_equal(r.body, "POST /echo?a=1&b=2 hello world");

    /* A chunked body is reassembled; the query string is optional. */
    send_str(fd, "POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
                 "3\r\nabc\r\n4\r\ndefg\r\n0\r\n\r\n");
    assert_int_equal(read_response(fd, &r), 0);
    assert_string_equal(r.body, "POST /echo? abcdefg");

    /* An absolute-form URL still yields path and query. */
    send_str(fd, "PUT http://example/echo?z HTTP/1.1\r\nHost: t\r\nContent-Length: 0\r\n\r\n");
    assert_int_equal(read_response(fd, &r), 0);
    assert_string_equal(r.body, "PUT /echo?z ");
    close(fd);
}

static void test_expect_continue(void **state)
{
    fixture *f = *state;
    int fd = client_connect(f);
    response r;

    send_str(fd, "POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 3\r\n"
                 "Expect: 100-continue\r\n\r\n");
    assert_int_equal(read_response_ex(fd, &r, 1), 0);
    assert_int_equal(r.status, 100);
    send_str(fd, "xyz");
    assert_int_equal(read_response(fd, &r), 0);
    assert_int_equal(r.status, 200);
    assert_string_equal(r.body, "POST /echo? xyz");
    close(fd);
}

static void test_keep_alive_and_pipelining(void **state)
{
    fixture *f = *state;
    int fd = client_connect(f);
    response r;

    send_str(fd, "GET /hello HTTP/1.1\r\nHost: t\r\n\r\n");
    assert_int_equal(read_response(fd, &r), 0);
    assert_string_equal(r.body, "hello");
    send_str(fd, "GET /echo?second HTTP/1.1\r\nHost: t\r\n\r\n");
    assert_int_equal(read_response(fd, &r), 0);
    assert_string_equal(r.body, "GET /echo?second ");

    /* Three pipelined requests, one of them asynchronous: answers come back in order. */
    send_str(fd, "GET /async HTTP/1.1\r\nHost: t\r\n\r\n"
                 "POST /echo HTTP/1.1\r\nContent-Length: 2\r\n\r\nhi"
                 "HEAD /hello HTTP/1.1\r\n\r\n");
    assert_int_equal(read_response(fd, &r), 0);
    assert_string_equal(r.body, "late");
    assert_int_equal(read_response(fd, &r), 0);
    assert_string_equal(r.body, "POST /echo? hi");
    /* HEAD: the length of the body, without the body. */
    assert_int_equal(read_response_ex(fd, &r, 1), 0);
    assert_int_equal(r.status, 200);
    assert_int_equal(r.content_length, 5);
    /* 204 carries neither body nor length; the connection stays usable after both. */
    send_str(fd, "GET /nocontent HTTP/1.1\r\n\r\nGET /hello HTTP/1.1\r\n\r\n");
    assert_int_equal(read_response_ex(fd, &r, 1), 0);
    assert_int_equal(r.status, 204);
    assert_int_equal(r.content_length, -1);
    assert_int_equal(read_response(fd, &r), 0);
    assert_string_equal(r.body, "hello");
    close(fd);
}

static void test_connection_close(void **state)
{
    fixture *f = *state;
    int fd = client_connect(f);
    response r;

    send_str(fd, "GET /hello HTTP/1.1\r\nConnection: close\r\n\r\n");
    assert_int_equal(read_response(fd, &r), 0);
    assert_true(r.closed);
    assert_true(wait_closed(fd, 2000));
    close(fd);

    /* HTTP/1.0 without keep-alive closes too; a client that half-closes still gets it. */
    fd = client_connect(f);
    send_str(fd, "GET /hello HTTP/1.0\r\n\r\n");
    shutdown(fd, SHUT_WR);
    assert_int_equal(read_response(fd, &r), 0);
    assert_string_equal(r.body, "hello");
    assert_true(r.closed);
    assert_true(wait_closed(fd, 2000));
    close(fd);
}

static void test_garbage_400(void **state)
{
    fixture *f = *state;
    int fd = client_connect(f);
    response r;

    send_str(fd, "\x01\x02 this is not http\r\n\r\n");
    assert_int_equal(read_response(fd, &r), 0);
    assert_int_equal(r.status, 400);
    assert_true(r.closed);
    assert_true(wait_closed(fd, 2000));
    close(fd);

    /* A bad request after a good one on the same connection: answered, then closed. */
    fd = client_connect(f);
    send_str(fd, "GET /hello HTTP/1.1\r\n\r\nGET /x HTTP/9.9 junk\r\n\r\n");
    assert_int_equal(read_response(fd, &r), 0);
    assert_int_equal(r.status, 200);
    assert_int_equal(read_response(fd, &r), 0);
    assert_int_equal(r.status, 400);
    assert_true(wait_closed(fd, 2000));
    close(fd);

    expect_get(f, "/hello", 200, "hello");
}

static void test_body_too_large_413(void **state)
{
    fixture *f = *state;
    char big[2048];
    int fd = client_connect(f);
    response r;

    /* Declared too large: refused before the body is read. */
    memset(big, 'a', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    send_str(fd, "POST /echo HTTP/1.1\r\nContent-Length: 2047\r\n\r\n");
    send_str(fd, big);
    assert_int_equal(read_response(fd, &r), 0);
    assert_int_equal(r.status, 413);
    assert_true(r.closed);
    assert_true(wait_closed(fd, 3000));
    close(fd);

    /* Chunked, so only counted while it arrives. */
    fd = client_connect(f);
    send_str(fd, "POST /echo HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n");
    for (int i = 0; i < 3; i++) {
        send_str(fd, "200\r\n"); /* 512 bytes per chunk */
        send_str(fd, big + sizeof(big) - 1 - 512);
        send_str(fd, "\r\n");
    }
    assert_int_equal(read_response(fd, &r), 0);
    assert_int_equal(r.status, 413);
    close(fd);

    /* Exactly max_body is fine. */
    fd = client_connect(f);
    send_str(fd, "POST /echo HTTP/1.1\r\nContent-Length: 1024\r\n\r\n");
    send_str(fd, big + sizeof(big) - 1 - 1024);
    assert_int_equal(read_response(fd, &r), 0);
    assert_int_equal(r.status, 200);
    close(fd);
}

static void test_headers_too_large_431(void **state)
{
    fixture *f = *state;
    int fd = client_connect(f);
    char line[64];
    response r;

    send_str(fd, "GET /hello HTTP/1.1\r\n");
    for (int i = 0; i < 1000; i++) {
        snprintf(line, sizeof(line), "X-Header-%04d: some value\r\n", i);
        send_str(fd, line);
    }
    send_str(fd, "\r\n");
    assert_int_equal(read_response(fd, &r), 0);
    assert_int_equal(r.status, 431);
    assert_true(wait_closed(fd, 3000));
    close(fd);

    /* A huge URL counts too. */
    fd = client_connect(f);
    {
        static char url[20000];

        memset(url, 'u', sizeof(url) - 1);
        send_str(fd, "GET /");
        send_str(fd, url);
        send_str(fd, " HTTP/1.1\r\n\r\n");
    }
    assert_int_equal(read_response(fd, &r), 0);
    assert_int_equal(r.status, 431);
    close(fd);

    expect_get(f, "/hello", 200, "hello");
}

static void test_slowloris_idle_timeout(void **state)
{
    fixture *f = *state;
    int slow = client_connect(f);
    uint64_t t0 = now_ms(), dt;

    /* Half a request, then a byte now and then: the deadline is not pushed back. */
    send_str(slow, "GET /hello HTTP/1.1\r\nHost: t\r\n");
    expect_get(f, "/hello", 200, "hello"); /* others are served meanwhile */
    usleep(150 * 1000);
    send(slow, "X", 1, MSG_NOSIGNAL);
    assert_true(wait_closed(slow, 3000));
    dt = now_ms() - t0;
    if (dt < 250 || dt > 2500)
        fail_msg("slow client closed after %llu ms, idle timeout is 300", (unsigned long long)dt);
    close(slow);

    /* A keep-alive connection left idle after a response is closed as well. */
    slow = client_connect(f);
    send_str(slow, "GET /hello HTTP/1.1\r\n\r\n");
    {
        response r;

        assert_int_equal(read_response(slow, &r), 0);
    }
    assert_true(wait_closed(slow, 3000));
    close(slow);
}

/* Not const: cmocka passes a test's initial state as void *. */
static gang_http_config flood_cfg = {
    .bind_address = "127.0.0.1",
    .port = 0,
    .max_body = 1024,
    .max_conns = 8,
    .idle_timeout_ms = 300,
};

static void test_connection_flood(void **state)
{
    enum { FLOOD = 200 };
    fixture *f = *state;
    int fds[FLOOD], closed = 0, served = 0;
    uint64_t deadline;

    for (int i = 0; i < FLOOD; i++)
        fds[i] = client_connect(f);
    /* Everything beyond max_conns is closed at once (the older idle ones, for newer ones). */
    for (int i = 0; i < FLOOD; i++)
        closed += wait_closed(fds[i], 50);
    if (closed < FLOOD - flood_cfg.max_conns)
        fail_msg("only %d of %d extra connections were closed", closed,
                 FLOOD - flood_cfg.max_conns);

    /* Once the idle ones time out, a fresh client is served. */
    deadline = now_ms() + 5000;
    while (!served && now_ms() < deadline) {
        int fd = client_connect(f);
        response r;

        send(fd, "GET /hello HTTP/1.1\r\n\r\n", 23, MSG_NOSIGNAL);
        served = read_response(fd, &r) == 0 && r.status == 200;
        close(fd);
        if (!served)
            usleep(50 * 1000);
    }
    assert_true(served);
    for (int i = 0; i < FLOOD; i++)
        close(fds[i]);

    /* And after the flood closes its side, there is room again right away. */
    for (int i = 0; i < FLOOD; i++)
        fds[i] = client_connect(f);
    for (int i = 0; i < FLOOD; i++)
        close(fds[i]);
    served = 0;
    deadline = now_ms() + 5000;
    while (!served && now_ms() < deadline) {
        int fd = client_connect(f);
        response r;

        send(fd, "GET /hello HTTP/1.1\r\n\r\n", 23, MSG_NOSIGNAL);
        served = read_response(fd, &r) == 0 && r.status == 200;
        close(fd);
        if (!served)
            usleep(20 * 1000);
    }
    assert_true(served);
}

static gang_http_config shed_cfg = {
    .bind_address = "127.0.0.1",
    .port = 0,
    .max_body = 1024,
    .max_conns = 4,
    .idle_timeout_ms = 10000,
};

/*
 * At the cap, new clients replace the oldest connections still sending a request (slow
 * clients are shed at once, long before their idle timeout), never one being answered.
 */
static void test_shed_slow_clients(void **state)
{
    fixture *f = *state;
    int busy = client_connect(f), slow[3];
    response r;

    send_str(busy, "GET /async-slow HTTP/1.1\r\n\r\n"); /* answered after 300 ms */
    usleep(20 * 1000);
    for (int i = 0; i < 3; i++) {
        slow[i] = client_connect(f);
        send_str(slow[i], "GET /hello HTTP/1.1\r\nHost: x"); /* and nothing more */
        usleep(20 * 1000);
    }
    uint64_t t0 = now_ms();
    for (int i = 0; i < 6; i++) { /* each new one sheds the oldest slow one (or its peer) */
        int fd = client_connect(f);
        send_str(fd, "GET /hello HTTP/1.1\r\n\r\n");
        assert_int_equal(read_response(fd, &r), 0);
        assert_int_equal(r.status, 200);
        close(fd);
    }
    assert_true(now_ms() - t0 < 2000); /* not after the 10 s idle timeout */
    assert_true(wait_closed(slow[0], 1000));
    assert_int_equal(read_response(busy, &r), 0); /* never shed */
    assert_int_equal(r.status, 200);
    assert_string_equal(r.body, "late");
    close(busy);
    for (int i = 0; i < 3; i++)
        close(slow[i]);
}

static const char *const reserve_paths[] = {"/hello", NULL};
static gang_http_config reserve_cfg = {
    .bind_address = "127.0.0.1",
    .port = 0,
    .max_body = 1024,
    .max_conns = 2,
    .idle_timeout_ms = 10000,
    .probe_reserve = 1,
    .probe_paths = reserve_paths,
};

/*
 * When every connection is being answered (none to shed), one more is kept for the probe
 * paths: a probe is served there, another path gets 503 on it, and past the reserve a new
 * connection is closed at accept.
 */
static void test_probe_reserve(void **state)
{
    fixture *f = *state;
    int busy[2];
    response r;

    for (int i = 0; i < 2; i++) {
        busy[i] = client_connect(f);
        send_str(busy[i], "GET /async-slow HTTP/1.1\r\n\r\n"); /* answered after 300 ms */
    }
    usleep(50 * 1000);
    int fd = client_connect(f);
    send_str(fd, "GET /echo HTTP/1.1\r\n\r\n"); /* not a probe: refused on the reserve */
    assert_int_equal(read_response(fd, &r), 0);
    assert_int_equal(r.status, 503);
    assert_non_null(strstr(r.body, "probes"));
    close(fd);
    for (int i = 0; i < 3; i++) { /* the probe path, on the reserved slot, every time */
        fd = client_connect(f);
        send_str(fd, "GET /hello HTTP/1.1\r\nConnection: close\r\n\r\n");
        assert_int_equal(read_response(fd, &r), 0);
        assert_int_equal(r.status, 200);
        assert_string_equal(r.body, "hello");
        close(fd);
        usleep(10 * 1000); /* its slot freed */
    }
    for (int i = 0; i < 2; i++) { /* the busy ones were never shed */
        assert_int_equal(read_response(busy[i], &r), 0);
        assert_string_equal(r.body, "late");
        close(busy[i]);
    }
}

static void test_async_reply(void **state)
{
    fixture *f = *state;
    int fd = client_connect(f);
    uint64_t t0 = now_ms();
    response r;

    send_str(fd, "GET /async HTTP/1.1\r\n\r\n");
    assert_int_equal(read_response(fd, &r), 0);
    assert_int_equal(r.status, 200);
    assert_string_equal(r.body, "late");
    assert_true(now_ms() - t0 >= 45);
    close(fd);
}

static void test_reply_after_disconnect(void **state)
{
    fixture *f = *state;
    int gone = client_connect(f), waiting;
    response r;

    /* The client leaves before its answer: the late reply is dropped, nothing breaks. */
    send_str(gone, "GET /async-slow HTTP/1.1\r\n\r\n");
    usleep(20 * 1000);
    close(gone);
    usleep(400 * 1000);
    expect_get(f, "/hello", 200, "hello");

    /* The server closes while a reply is pending: the client sees EOF, the reply that
     * comes later (from the timer, after the teardown's close) is dropped. */
    waiting = client_connect(f);
    send_str(waiting, "GET /async-slow HTTP/1.1\r\n\r\n");
    usleep(50 * 1000);
    fixture_stop(f);
    assert_true(wait_closed(waiting, 3000));
    assert_int_equal(read_response(waiting, &r), -1);
    close(waiting);
}

/* Reads a chunked body (after the head) into out: 0, or -1 on a malformed or cut body. */
static int read_chunked(int fd, char *out, size_t cap, size_t *len)
{
    *len = 0;
    for (;;) {
        char line[32];
        size_t ll = 0;
        while (ll < 2 || memcmp(line + ll - 2, "\r\n", 2) != 0) {
            if (ll + 1 >= sizeof(line) || recv(fd, line + ll, 1, 0) != 1)
                return -1;
            ll++;
        }
        line[ll] = '\0';
        size_t n = strtoul(line, NULL, 16);
        if (n == 0)
            return recv(fd, line, 2, MSG_WAITALL) == 2 && memcmp(line, "\r\n", 2) == 0 ? 0 : -1;
        if (*len + n + 2 > cap || recv(fd, out + *len, n + 2, MSG_WAITALL) != (ssize_t)(n + 2) ||
            memcmp(out + *len + n, "\r\n", 2) != 0)
            return -1;
        *len += n;
    }
}

/* A streamed answer: chunked, in order, then the connection serves the next request. */
static void test_stream_chunks(void **state)
{
    fixture *f = *state;
    int fd = client_connect(f);
    response r;
    char body[512];
    size_t len = 0;

    send_str(fd, "GET /stream HTTP/1.1\r\nHost: t\r\n\r\n");
    assert_int_equal(read_response_ex(fd, &r, 1), 0);
    assert_int_equal(r.status, 200);
    assert_non_null(strcasestr(r.head, "\r\nTransfer-Encoding: chunked\r\n"));
    assert_non_null(strcasestr(r.head, "\r\nContent-Type: text/event-stream\r\n"));
    assert_int_equal(r.content_length, -1);
    assert_int_equal(read_chunked(fd, body, sizeof(body) - 1, &len), 0);
    body[len] = '\0';
    assert_string_equal(body, "data: 0\n\ndata: 1\n\ndata: 2\n\n");
    send_str(fd, "GET /hello HTTP/1.1\r\n\r\n"); /* keep-alive after a stream */
    assert_int_equal(read_response(fd, &r), 0);
    assert_string_equal(r.body, "hello");
    close(fd);
}

/* A client that leaves mid-stream: the next write says GANG_ECLOSED, nothing leaks. */
static void test_stream_client_gone(void **state)
{
    fixture *f = *state;
    int fd = client_connect(f), gone = 0;
    response r;

    send_str(fd, "GET /stream-forever HTTP/1.1\r\n\r\n");
    assert_int_equal(read_response_ex(fd, &r, 1), 0);
    assert_int_equal(r.status, 200);
    close(fd);
    for (uint64_t t0 = now_ms(); !gone && now_ms() - t0 < 3000; usleep(10 * 1000)) {
        pthread_mutex_lock(&f->mu);
        gone = f->stream_gone;
        pthread_mutex_unlock(&f->mu);
    }
    assert_true(gone);
    expect_get(f, "/hello", 200, "hello");
}

/* The Authorization header reaches the handler; a value over the cap reads as absent. */
static void test_authorization_header(void **state)
{
    fixture *f = *state;
    int fd = client_connect(f);
    response r;
    char req[1024];

    send_str(fd, "GET /auth HTTP/1.1\r\nauthorization: Bearer sk-1\r\n\r\n");
    assert_int_equal(read_response(fd, &r), 0);
    assert_string_equal(r.body, "Bearer sk-1");
    send_str(fd, "GET /auth HTTP/1.1\r\n\r\n"); /* not carried over from the last one */
    assert_int_equal(read_response(fd, &r), 0);
    assert_int_equal(r.body_len, 0);
    snprintf(req, sizeof(req), "GET /auth HTTP/1.1\r\nAuthorization: Bearer %0600d\r\n\r\n", 7);
    send_str(fd, req);
    assert_int_equal(read_response(fd, &r), 0);
    assert_int_equal(r.body_len, 0);
    close(fd);
}

static void test_start_errors(void **state)
{
    fixture *f = *state;
    static int not_null;
    gang_http_server *s = (gang_http_server *)(void *)&not_null;
    gang_http_config cfg = default_cfg;
    uv_loop_t loop;

    (void)f;
    uv_loop_init(&loop);
    cfg.port = f->port; /* taken by the fixture's server */
    assert_int_equal(gang_http_server_start(&loop, &cfg, handler, NULL, &s),
                     gang_err_from_errno(EADDRINUSE));
    assert_null(s);
    cfg.port = 0;
    cfg.bind_address = "not-an-address";
    assert_int_equal(gang_http_server_start(&loop, &cfg, handler, NULL, &s), GANG_EINVAL);
    cfg.bind_address = "127.0.0.1";
    cfg.max_conns = 0;
    assert_int_equal(gang_http_server_start(&loop, &cfg, handler, NULL, &s), GANG_EINVAL);
    cfg.max_conns = 1;
    assert_int_equal(gang_http_server_start(&loop, &cfg, NULL, NULL, &s), GANG_EINVAL);
    /* Failures leave nothing on the loop. */
    assert_int_equal(uv_run(&loop, UV_RUN_NOWAIT), 0);
    assert_int_equal(uv_loop_close(&loop), 0);
}

int gang_test_http(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_get, setup, teardown),
        cmocka_unit_test_setup_teardown(test_post_body, setup, teardown),
        cmocka_unit_test_setup_teardown(test_expect_continue, setup, teardown),
        cmocka_unit_test_setup_teardown(test_keep_alive_and_pipelining, setup, teardown),
        cmocka_unit_test_setup_teardown(test_connection_close, setup, teardown),
        cmocka_unit_test_setup_teardown(test_garbage_400, setup, teardown),
        cmocka_unit_test_setup_teardown(test_body_too_large_413, setup, teardown),
        cmocka_unit_test_setup_teardown(test_headers_too_large_431, setup, teardown),
        cmocka_unit_test_setup_teardown(test_slowloris_idle_timeout, setup, teardown),
        cmocka_unit_test_prestate_setup_teardown(test_connection_flood, setup, teardown,
                                                 &flood_cfg),
        cmocka_unit_test_prestate_setup_teardown(test_shed_slow_clients, setup, teardown,
                                                 &shed_cfg),
        cmocka_unit_test_prestate_setup_teardown(test_probe_reserve, setup, teardown, &reserve_cfg),
        cmocka_unit_test_setup_teardown(test_async_reply, setup, teardown),
        cmocka_unit_test_setup_teardown(test_reply_after_disconnect, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stream_chunks, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stream_client_gone, setup, teardown),
        cmocka_unit_test_setup_teardown(test_authorization_header, setup, teardown),
        cmocka_unit_test_setup_teardown(test_start_errors, setup, teardown),
    };

    /* Writing to a socket the peer has closed must be an error, not a fatal signal. */
    signal(SIGPIPE, SIG_IGN);
    return cmocka_run_group_tests_name("http", tests, NULL, NULL);
}
