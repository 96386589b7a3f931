/*
 * Forwarding one call of the router's front door to a replica, and what happens when the
 * replica fails.
 *
 * A call is owned here from the front door's handler until its client has one answer.
 * Each attempt opens a fresh connection to the chosen replica's HTTP port (Connection:
 * close), sends the client's method, path, body and Authorization header unchanged, and
 * reads the answer with http_parser. What the client gets:
 *
 *   * a non-streamed answer is buffered whole (at most --max-response-bytes) and sent once
 *     it is complete; a replica that fails before that (connection refused or reset, EOF
 *     mid-answer, a 503 "not serving / queue full", or the replica declared down by the
 *     poller) costs nothing but time: the call goes to another replica;
 *   * a streamed answer is relayed event by event from its first event, which is the
 *     replica's first token (the API starts its stream at the first token). Until then
 *     the call may still move to another replica; after it, a replica failure (or the
 *     replica declared down) sends the call again to another replica, whose stream is
 *     checked against what the client has and continues it without a duplicate
 *     (router/stream.c: greedy and seeded calls resume with exactly the text of a healthy
 *     run; ganglion_router_stream_resumes_total). A stream that cannot be resumed so
 *     (another text, more than one choice, ROUTER_MAX_RESUMES failures) ends with an SSE
 *     error event and no [DONE] (ganglion_router_stream_errors_total): the router never
 *     splices two different texts.
 *
 * Closing a connection to a replica that is alive makes its API cancel the request, so a
 * call moved elsewhere does not keep computing there. Nothing is answered twice: an
 * attempt is detached (its callbacks see f == NULL) before the next one starts. Every
 * call has a deadline (--request-timeout-ms): past it the client gets 504, or its stream
 * ends with an error event; while no replica is eligible the call waits
 * --retry-backoff-ms between tries, so a gang that restarts takes its calls back.
 *
 * Disaggregated prefill/decode (issue #26): while a prefill replica (ganglion_role 1) and a
 * decode one are up, a call of one prompt and one choice goes first to a prefill replica
 * as the same body with max_tokens 1, unstreamed (its gang computes the prompt's KV and
 * the first token), then, whatever that answered, to a decode replica as the client sent
 * it: the client sees the decode replica's one answer or stream. The prefill phase is
 * never retried: a failure, a replica going down or --prefill-timeout-ms only moves the
 * call to its decode phase early, where the decode gang prefills the prompt itself (the
 * fallback; greedy and seeded answers are the same either way).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <cjson/cJSON.h>
#include <http_parser.h>

#include "router-internal.h"

typedef struct upstream {
    uv_tcp_t tcp;
    uv_connect_t conn;
    uv_write_t wr;
    router_fwd *f; /* NULL once the attempt is detached: its callbacks do nothing */
    http_parser parser;
    char *head; /* the request line and headers sent */
    int status;
    int field_is_ctype, complete, connected;
    char ctype[128];
    char *body;
    size_t len, cap;
} upstream;

struct router_fwd {
    router *r;
    router_fwd *prev, *next;
    gang_http_exchange *x;
    char method[8];
    char *path, *body, *auth;
    size_t body_len;
    uint64_t *hashes;
    uint32_t nh;
    int want_stream, started, done;
    int phase;   /* 1: the prefill phase of a P/D call (body pbody); 0: the answer */
    char *pbody; /* the prefill phase's body (max_tokens 1, unstreamed), or NULL */
    size_t pbody_len;
    uint64_t phase_t0;  /* when the prefill phase started (ms) */
    uint64_t phase_end; /* its deadline: --prefill-timeout-ms after phase_t0 */
    uint64_t exclude, deadline_ms;
    int32_t replica;  /* of the current attempt, -1 between attempts */
    router_stream st; /* a streamed call: what its client has (stream.c) */
    upstream *up;
    uv_timer_t timer; /* the connect deadline, the backoff between tries, the call's deadline */
};

static void attempt(router_fwd *f);
static void attempt_failed(router_fwd *f, const char *why, int mark_down);

/* ------------------------------------------------------------------ prompt hashes */

/* The chat messages as one string, role and content of each, for hashing. */
static char *chat_text(const cJSON *msgs, size_t *len)
{
    size_t cap = 4096, n = 0;
    char *s = malloc(cap);
    const cJSON *m;
    cJSON_ArrayForEach(m, msgs)
    {
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(m, "content");
        const char *parts[2] = {cJSON_IsString(role) ? role->valuestring : "",
                                cJSON_IsString(content) ? content->valuestring : ""};
        for (int k = 0; k < 2 && s != NULL; k++) {
            size_t l = strlen(parts[k]);
            if (n + l + 2 > cap) {
                cap = 2 * (n + l + 2);
                char *t = realloc(s, cap);
                if (t == NULL)
                    free(s);
                s = t;
            }
            if (s != NULL) {
                memcpy(s + n, parts[k], l);
                n += l;
                s[n++] = k == 0 ? '\x1f' : '\x1e';
            }
        }
    }
    *len = n;
    return s;
}

/* Hashes text with the tokenizer when the router has one, else as raw 64-byte chunks. */
static uint32_t hash_text(router *r, const char *text, size_t len, uint64_t *out)
{
    if (r->tok == NULL)
        return gang_router_hash_text(text, len, out, GANG_ROUTER_MAX_BLOCKS);
    size_t cap = (size_t)GANG_ROUTER_MAX_BLOCKS * GANG_ROUTER_BLOCK, n = 0;
    int32_t *ids = malloc(cap * sizeof(int32_t));
    uint32_t k = 0;
    if (ids == NULL)
        return 0;
    int rc = gang_tokenizer_encode(r->tok, text, len, false, ids, cap, &n);
    if (rc == 0 || rc == GANG_ERANGE) /* a longer prompt: its first blocks are enough */
        k = gang_router_hash_ids(ids, n < cap ? n : cap, out, GANG_ROUTER_MAX_BLOCKS);
    free(ids);
    return k;
}

/* The block hashes of a completion's or chat's prompt (0 when the body has none the
 * router understands; the replica validates the body anyway). */
static uint32_t prompt_hashes(router *r, const cJSON *req, uint64_t *out)
{
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(req, "prompt");
    const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(req, "messages");
    if (cJSON_IsArray(p) && cJSON_GetArraySize(p) > 0 && !cJSON_IsNumber(p->child))
        p = p->child; /* a batch: its first prompt decides */
    if (cJSON_IsString(p))
        return hash_text(r, p->valuestring, strlen(p->valuestring), out);
    if (cJSON_IsArray(p)) {
        size_t n = (size_t)cJSON_GetArraySize(p), k = 0;
        int32_t *ids = malloc((n + 1) * sizeof(int32_t));
        uint32_t nh = 0;
        const cJSON *e;
        if (ids == NULL)
            return 0;
        cJSON_ArrayForEach(e, p)
        {
            double v = cJSON_IsNumber(e) ? e->valuedouble : -1.0;
            ids[k++] = v >= 0.0 && v < 2147483647.0 ? (int32_t)v : -1; /* the replica refuses it */
        }
        nh = gang_router_hash_ids(ids, k, out, GANG_ROUTER_MAX_BLOCKS);
        free(ids);
        return nh;
    }
    if (cJSON_IsArray(msgs)) {
        size_t len = 0;
        char *t = chat_text(msgs, &len);
        uint32_t nh = t != NULL ? hash_text(r, t, len, out) : 0;
        free(t);
        return nh;
    }
    return 0;
}

/* ------------------------------------------------------------------ the call's life */

static void fwd_free_cb(uv_handle_t *h)
{
    router_fwd *f = h->data;
    free(f->path);
    free(f->body);
    free(f->auth);
    free(f->hashes);
    cJSON_free(f->pbody);
    gang__router_stream_free(&f->st);
    free(f);
}

static void up_free_cb(uv_handle_t *h)
{
    upstream *up = h->data;
    free(up->head);
    free(up->body);
    free(up);
}

/* Detaches and closes the current attempt's connection, if any. */
static void detach(router_fwd *f)
{
    if (f->up != NULL) {
        f->up->f = NULL;
        uv_close((uv_handle_t *)&f->up->tcp, up_free_cb);
        f->up = NULL;
    }
    if (f->replica >= 0) {
        router_replica *rep = &f->r->reps[f->replica];
        rep->inflight--;
        gang__router_load_changed(f->r, rep->index);
        f->replica = -1;
    }
}

/* The call has its answer: drop everything it holds. */
static void finish(router_fwd *f)
{
    router *r = f->r;
    detach(f);
    f->done = 1;
    r->answered++;
    if (f->prev != NULL)
        f->prev->next = f->next;
    else
        r->fwds = f->next;
    if (f->next != NULL)
        f->next->prev = f->prev;
    uv_timer_stop(&f->timer);
    uv_close((uv_handle_t *)&f->timer, fwd_free_cb);
}

/* Answers the client with an OpenAI-shaped error, or ends its stream with one. */
static void fail_call(router_fwd *f, int status, const char *msg)
{
    char body[512];
    int n =
        snprintf(body, sizeof body, "{\"error\":{\"message\":\"%s\",\"type\":\"%s\",\"code\":%d}}",
                 msg, status == 504 ? "timeout" : "server_error", status);
    if (f->started) {
        char ev[600];
        int m = snprintf(ev, sizeof ev, "data: %s\n\n", body);
        (void)gang_http_stream_write(f->x, ev, (size_t)m);
        gang_http_stream_end(f->x);
        f->r->stream_errors++;
    } else {
        gang_http_reply(f->x, status, "application/json", body, (size_t)n);
    }
    finish(f);
}

static void arm(router_fwd *f, uint64_t ms);

/* The one timer of a call: its deadline, a connect deadline, or the end of a backoff. */
static void prefill_over(router_fwd *f, int ok, const char *why);

static void on_timer(uv_timer_t *t)
{
    router_fwd *f = t->data;
    uint64_t now = gang_now_ms();
    if (now >= f->deadline_ms)
        fail_call(f, 504, "no replica answered within the request deadline");
    else if (f->phase == 1 && now >= f->phase_end)
        prefill_over(f, 0, "the prefill passed --prefill-timeout-ms");
    else if (f->up != NULL && !f->up->connected)
        attempt_failed(f, "connect deadline", 1);
    else if (f->up == NULL)
        attempt(f);
    else
        arm(f, f->deadline_ms - now); /* woke a little early: wait for the deadline */
}

static void arm(router_fwd *f, uint64_t ms)
{
    uint64_t now = gang_now_ms(), end = f->deadline_ms;
    if (f->phase == 1 && f->phase_end < end)
        end = f->phase_end;
    uint64_t left = end > now ? end - now : 0;
    uv_timer_start(&f->timer, on_timer, ms < left ? ms : left, 0);
}

/* ------------------------------------------------------------------ the answer */

static upstream *up_of(http_parser *p)
{
    upstream *up = p->data;
    return up->f != NULL ? up : NULL;
}

static int on_hdr_field(http_parser *p, const char *at, size_t len)
{
    upstream *up = up_of(p);
    if (up != NULL)
        up->field_is_ctype = len == 12 && strncasecmp(at, "Content-Type", 12) == 0;
    return 0;
}

static int on_hdr_value(http_parser *p, const char *at, size_t len)
{
    upstream *up = up_of(p);
    if (up != NULL && up->field_is_ctype && len < sizeof(up->ctype)) {
        memcpy(up->ctype, at, len);
        up->ctype[len] = '\0';
    }
    return 0;
}

static int on_headers_complete(http_parser *p)
{
    upstream *up = up_of(p);
    if (up != NULL)
        up->status = p->status_code;
    return 0;
}

/* router_stream_out: one event to the client, its stream begun at the first. */
static int relay_out(void *ctx, const char *bytes, size_t len)
{
    router_fwd *f = ctx;
    if (!f->started) {
        f->started = 1;
        if (gang_http_stream_begin(f->x, 200, f->up->ctype[0] ? f->up->ctype : NULL) != 0)
            return GANG_EPEER;
    }
    return gang_http_stream_write(f->x, bytes, len) != 0 ? GANG_EPEER : 0;
}

static int on_body(http_parser *p, const char *at, size_t len)
{
    upstream *up = up_of(p);
    if (up == NULL)
        return 0;
    router_fwd *f = up->f;
    if (f->want_stream && f->phase == 0 && up->status == 200) {
        int rc = gang__router_stream_feed(&f->st, at, len, (size_t)f->r->o.max_response_bytes,
                                          relay_out, f);
        if (rc == GANG_EPEER)
            goto out_gone;
        if (rc == GANG_EMISMATCH)
            fail_call(f, 502,
                      "the replica failed mid-stream and another one's continuation "
                      "is not the same text; not spliced");
        else if (rc != 0 && !f->started)
            return 1; /* a parser error: the attempt fails */
        else if (rc != 0)
            fail_call(f, 502, "a malformed or oversized stream event");
        return 0;
    }
    if (up->len + len > (size_t)f->r->o.max_response_bytes)
        return 1; /* a parser error: the attempt fails */
    if (up->len + len + 1 > up->cap) {
        size_t cap = 2 * (up->len + len + 1);
        char *b = realloc(up->body, cap);
        if (b == NULL)
            return 1;
        up->body = b;
        up->cap = cap;
    }
    memcpy(up->body + up->len, at, len);
    up->len += len;
    return 0;
out_gone:
    /* The client left: closing the replica's connection cancels the request there. */
    gang_http_stream_end(f->x);
    finish(f);
    return 0;
}

static int on_complete(http_parser *p)
{
    upstream *up = up_of(p);
    if (up != NULL)
        up->complete = 1;
    return 0;
}

static const http_parser_settings settings = {
    .on_header_field = on_hdr_field,
    .on_header_value = on_hdr_value,
    .on_headers_complete = on_headers_complete,
    .on_body = on_body,
    .on_message_complete = on_complete,
};

/*
 * The hand-over of a prefill answer's "kv_transfer" kv with host: its known fields only
 * (id, port, blocks, and the prefill gang's layout: layers, pp, tp, ranks_per_node,
 * hosts), a "hosts" list only as long as GANG_KV_NODES_MAX; the decode gang's API checks
 * their values. NULL without memory.
 */
static cJSON *kv_handover(const cJSON *kv, const char *host)
{
    static const char *const keep[] = {"id", "port", "blocks",        "layers",
                                       "pp", "tp",   "ranks_per_node"};
    cJSON *k = cJSON_CreateObject();
    for (size_t i = 0; k != NULL && i < sizeof(keep) / sizeof(keep[0]); i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(kv, keep[i]);
        if (v != NULL)
            cJSON_AddItemToObject(k, keep[i], cJSON_Duplicate(v, 1));
    }
    const cJSON *hosts = cJSON_GetObjectItemCaseSensitive(kv, "hosts");
    if (k != NULL && cJSON_IsArray(hosts) && cJSON_GetArraySize(hosts) <= (int)GANG_KV_NODES_MAX)
        cJSON_AddItemToObject(k, "hosts", cJSON_Duplicate(hosts, 1));
    if (k != NULL)
        cJSON_AddStringToObject(k, "host", host);
    return k;
}

/*
 * P/D: the prefill replica's answer names the export of the prompt's KV blocks
 * ("kv_transfer": id, port, blocks, and the prefill gang's layout: layers, pp, tp, and
 * for a gang of several nodes each node's address); the call's body for its decode phase
 * gets it (kv_handover), with the prefill replica's address, so that the decode gang
 * fetches the blocks instead of prefilling them. An answer without one (exports off, or
 * none made) changes nothing.
 */
static void hand_over_kv(router_fwd *f, const upstream *up)
{
    router *r = f->r;
    cJSON *a = up->body != NULL ? cJSON_ParseWithLength(up->body, up->len) : NULL;
    const cJSON *kv = cJSON_GetObjectItemCaseSensitive(a, "kv_transfer");
    cJSON *b = cJSON_IsObject(kv) ? cJSON_ParseWithLength(f->body, f->body_len) : NULL;
    const router_replica *rep = f->replica >= 0 ? &r->reps[f->replica] : NULL;
    char *s = NULL;
    if (cJSON_IsObject(b) && rep != NULL && rep->addr[0] != '\0') {
        cJSON *k = kv_handover(kv, rep->addr);
        cJSON_DeleteItemFromObjectCaseSensitive(b, "kv_transfer");
        if (k != NULL)
            cJSON_AddItemToObject(b, "kv_transfer", k);
        s = k != NULL ? cJSON_PrintUnformatted(b) : NULL;
    }
    if (s != NULL) {
        char *nb = strdup(s);
        if (nb != NULL) {
            free(f->body);
            f->body = nb;
            f->body_len = strlen(nb);
            r->pd_kv_handovers++;
        }
        cJSON_free(s);
    }
    cJSON_Delete(b);
    cJSON_Delete(a);
}

/* The answer is whole: relay it, or move on when the replica said it is not serving. */
static void answer_complete(router_fwd *f, upstream *up)
{
    if (f->phase == 1) {
        /* A refusal of the call itself (400, 401, 404...) is the decode replica's to answer
         * the client: it is not a failure of the prefill pool. */
        int refused =
            up->status >= 400 && up->status < 500 && up->status != 408 && up->status != 429;
        if (up->status == 200)
            hand_over_kv(f, up);
        prefill_over(f, up->status == 200 || refused, "the prefill replica did not answer 200");
        return;
    }
    if (f->started && up->status != 200) {
        attempt_failed(f, "the replica of a resumed stream did not answer 200", 0);
        return;
    }
    if (f->started) {
        gang_http_stream_end(f->x);
        finish(f);
        return;
    }
    if (up->status == 503) {
        attempt_failed(f, "the replica answered 503", 0);
        return;
    }
    gang_http_reply(f->x, up->status, up->ctype[0] ? up->ctype : "application/json",
                    up->body ? up->body : "", up->len);
    finish(f);
}

static void on_alloc(uv_handle_t *h, size_t hint, uv_buf_t *buf)
{
    (void)h;
    (void)hint;
    static char slab[65536]; /* the loop thread's; consumed before the next read */
    *buf = uv_buf_init(slab, sizeof slab);
}

static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
    upstream *up = s->data;
    router_fwd *f = up->f;
    if (f == NULL || nread == 0)
        return;
    if (nread < 0) {
        http_parser_execute(&up->parser, &settings, NULL, 0);
        if (up->f != NULL && up->complete)
            answer_complete(f, up);
        else if (up->f != NULL)
            attempt_failed(f, "the replica closed the connection before answering", 0);
        return;
    }
    size_t done = http_parser_execute(&up->parser, &settings, buf->base, (size_t)nread);
    if (up->f == NULL)
        return; /* finished inside a callback (the client left) */
    if (done != (size_t)nread || HTTP_PARSER_ERRNO(&up->parser) != HPE_OK) {
        attempt_failed(f, "a malformed or oversized answer", 0);
        return;
    }
    if (up->complete)
        answer_complete(f, up);
}

static void on_write(uv_write_t *w, int status)
{
    upstream *up = w->data;
    if (status < 0 && up->f != NULL)
        attempt_failed(up->f, "sending the request failed", 0);
}

static void on_connect(uv_connect_t *c, int status)
{
    upstream *up = c->data;
    router_fwd *f = up->f;
    if (f == NULL)
        return;
    if (status < 0) {
        attempt_failed(f, "connection refused", 1);
        return;
    }
    up->connected = 1;
    arm(f, UINT64_MAX); /* now only the call's deadline */
    uv_buf_t bufs[2] = {uv_buf_init(up->head, (unsigned)strlen(up->head)),
                        f->phase == 1 ? uv_buf_init(f->pbody, (unsigned)f->pbody_len)
                                      : uv_buf_init(f->body, (unsigned)f->body_len)};
    up->wr.data = up;
    if (uv_write(&up->wr, (uv_stream_t *)&up->tcp, bufs, 2, on_write) != 0 ||
        uv_read_start((uv_stream_t *)&up->tcp, on_alloc, on_read) != 0)
        attempt_failed(f, "sending the request failed", 0);
}

/* ------------------------------------------------------------------ attempts */

/* Opens the connection of an attempt on replica rep. 0, or a GANG_E* code. */
static int connect_replica(router_fwd *f, router_replica *rep)
{
    struct sockaddr_in sa;
    if (rep->addr[0] == '\0' || uv_ip4_addr(rep->addr, rep->port, &sa) != 0)
        return GANG_ERESOLVE;
    upstream *up = calloc(1, sizeof(*up));
    if (up == NULL)
        return GANG_ENOMEM;
    size_t cap = strlen(f->path) + strlen(f->auth) + 256;
    up->head = malloc(cap);
    if (up->head == NULL) {
        free(up);
        return GANG_ENOMEM;
    }
    snprintf(up->head, cap,
             "%s %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
             "Content-Length: %zu\r\nConnection: close\r\n%s%s%s\r\n",
             f->method, f->path, rep->name, f->phase == 1 ? f->pbody_len : f->body_len,
             f->auth[0] ? "Authorization: " : "", f->auth, f->auth[0] ? "\r\n" : "");
    http_parser_init(&up->parser, HTTP_RESPONSE);
    up->parser.data = up;
    up->tcp.data = up;
    up->conn.data = up;
    up->f = f;
    uv_tcp_init(f->r->loop, &up->tcp);
    f->up = up;
    if (uv_tcp_connect(&up->conn, &up->tcp, (const struct sockaddr *)&sa, on_connect) != 0)
        return GANG_ECONNREFUSED; /* detach() closes it */
    return 0;
}

/* One try: pick a replica and connect, or wait for one to become eligible. */
static void attempt(router_fwd *f)
{
    router *r = f->r;
    gang_router_pick pk;
    if (f->phase == 1 && gang_router_policy_pick_phase(r->policy, f->hashes, f->nh, f->exclude,
                                                       GANG_ROUTER_PHASE_PREFILL, &pk) != 0) {
        prefill_over(f, 0, NULL); /* no prefill replica now: the decode replica prefills */
        return;
    }
    if (f->phase == 0 && gang_router_policy_pick_phase(r->policy, f->hashes, f->nh, f->exclude,
                                                       GANG_ROUTER_PHASE_DECODE, &pk) != 0) {
        /* Every replica is down or failed this call: start over after the backoff, so a
         * gang that comes back takes the call. */
        f->exclude = 0;
        r->no_replica++;
        arm(f, (uint64_t)r->o.retry_backoff_ms);
        return;
    }
    router_replica *rep = &r->reps[pk.replica];
    r->pd_prefills += f->phase == 1;
    gang_router_policy_record(r->policy, pk.replica, f->hashes, f->nh);
    r->decisions[pk.reason]++;
    rep->sent++;
    rep->prompt_blocks += f->nh;
    rep->matched_blocks += pk.matched;
    rep->inflight++;
    f->replica = (int32_t)pk.replica;
    gang__router_load_changed(r, pk.replica);
    if (connect_replica(f, rep) != 0) {
        attempt_failed(f, "no address for the replica", 1);
        return;
    }
    arm(f, (uint64_t)r->o.connect_timeout_ms);
}

/*
 * The replica (i) of a started stream failed: the call goes again to another replica (through
 * the prefill pool when P/D split it), whose stream continues the client's, or it ends with
 * an error event when it cannot be resumed.
 */
static void resume_elsewhere(router_fwd *f, int32_t i, const char *why)
{
    router *r = f->r;
    if (gang_now_ms() >= f->deadline_ms || !gang__router_stream_resume(&f->st)) {
        fail_call(f, 502, "the replica failed after the stream started; not resumable");
        return;
    }
    r->stream_resumes++;
    if (i >= 0)
        f->exclude |= 1ull << i;
    gang_info("router: stream %s resumes on another replica after %u tokens (%s failed: %s)",
              f->path, f->st.n_toks, i >= 0 ? r->reps[i].name : "?", why);
    if (f->pbody != NULL) {
        f->phase = 1;
        f->phase_t0 = gang_now_ms();
        f->phase_end = f->phase_t0 + (uint64_t)r->o.prefill_timeout_ms;
    }
    uv_timer_stop(&f->timer);
    attempt(f);
}

/* The current attempt failed; the call moves on (a started stream resumes elsewhere). */
static void attempt_failed(router_fwd *f, const char *why, int mark_down)
{
    router *r = f->r;
    int32_t i = f->replica;
    if (f->phase == 1) {
        if (i >= 0 && mark_down)
            gang__router_set_up(r, (uint32_t)i, 0, why);
        if (f->phase == 1) /* (set_up may have moved it already) */
            prefill_over(f, 0, why);
        return;
    }
    detach(f);
    if (i >= 0) {
        r->reps[i].retried_away += !f->started;
        r->reps[i].mid_stream_failures += f->started;
        if (mark_down)
            gang__router_set_up(r, (uint32_t)i, 0, why);
    }
    if (f->started) {
        resume_elsewhere(f, i, why);
        return;
    }
    if (i >= 0) {
        f->exclude |= 1ull << i;
        r->retries++;
        gang_info("router: call %s moves from replica %s: %s", f->path, r->reps[i].name, why);
    }
    uv_timer_stop(&f->timer);
    attempt(f);
}

/*
 * The prefill phase of f is over (ok: its replica answered 200; why: the failure, for the
 * log, NULL when no prefill replica was eligible): the call goes to its decode phase.
 */
static void prefill_over(router_fwd *f, int ok, const char *why)
{
    router *r = f->r;
    int32_t i = f->replica;
    if (f->phase != 1)
        return;
    detach(f);
    f->phase = 0;
    if (f->st.resumes == 0)
        f->exclude = 0; /* (a resumed stream keeps off the replicas it failed on) */
    if (why == NULL && !ok) {
        r->pd_prefill_skipped++;
    } else {
        gang_histogram_observe(&r->h_prefill, (double)(gang_now_ms() - f->phase_t0) / 1000.0);
        if (!ok) {
            r->pd_prefill_failed++;
            gang_info("router: the prefill of %s on %s failed (%s); its decode replica "
                      "prefills it",
                      f->path, i >= 0 ? r->reps[i].name : "?", why);
        }
    }
    uv_timer_stop(&f->timer);
    attempt(f);
}

/*
 * The body of a P/D call's prefill phase: the client's with max_tokens (and
 * max_completion_tokens) 1, unstreamed, without min_tokens; NULL when the call is not one
 * P/D splits (n > 1, best_of, a batch of prompts) or out of memory.
 */
static char *prefill_body(const cJSON *req, size_t *len)
{
    const cJSON *n = cJSON_GetObjectItemCaseSensitive(req, "n");
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(req, "prompt");
    if ((n != NULL && !(cJSON_IsNumber(n) && n->valuedouble == 1.0)) ||
        cJSON_GetObjectItemCaseSensitive(req, "best_of") != NULL ||
        (cJSON_IsArray(p) && cJSON_GetArraySize(p) > 0 && !cJSON_IsNumber(p->child)))
        return NULL;
    cJSON *j = cJSON_Duplicate(req, 1);
    if (j == NULL)
        return NULL;
    static const char *const drop[] = {"max_tokens", "max_completion_tokens", "min_tokens",
                                       "stream", "stream_options"};
    for (size_t k = 0; k < sizeof(drop) / sizeof(drop[0]); k++)
        cJSON_DeleteItemFromObjectCaseSensitive(j, drop[k]);
    char *s = NULL;
    if (cJSON_AddNumberToObject(j, "max_tokens", 1) != NULL)
        s = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    *len = s != NULL ? strlen(s) : 0;
    return s;
}

/* ------------------------------------------------------------------ entry points */

void gang__router_forward(router *r, gang_http_exchange *x, const gang_http_request *req,
                          int hashed)
{
    router_fwd *f = calloc(1, sizeof(*f));
    if (f == NULL) {
        gang_http_reply(x, 503, NULL, "out of memory\n", strlen("out of memory\n"));
        return;
    }
    f->r = r;
    f->x = x;
    f->replica = -1;
    snprintf(f->method, sizeof f->method, "%s", req->method);
    f->path = strdup(req->path);
    f->body = malloc(req->body_len + 1);
    f->auth = strdup(req->authorization);
    f->hashes = malloc(GANG_ROUTER_MAX_BLOCKS * sizeof(uint64_t));
    uv_timer_init(r->loop, &f->timer);
    f->timer.data = f;
    f->next = r->fwds;
    if (r->fwds != NULL)
        r->fwds->prev = f;
    r->fwds = f;
    r->accepted++;
    if (f->path == NULL || f->body == NULL || f->auth == NULL || f->hashes == NULL) {
        fail_call(f, 503, "out of memory");
        return;
    }
    memcpy(f->body, req->body, req->body_len);
    f->body_len = req->body_len;
    f->deadline_ms = gang_deadline_after((uint64_t)r->o.request_timeout_ms);
    cJSON *j = hashed ? cJSON_ParseWithLength(req->body, req->body_len) : NULL;
    if (j != NULL) {
        f->want_stream = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "stream"));
        f->nh = prompt_hashes(r, j, f->hashes);
        if (gang_router_policy_pd(r->policy)) {
            f->pbody = prefill_body(j, &f->pbody_len);
            f->phase = f->pbody != NULL;
            r->pd_prefill_skipped += !f->phase;
        }
        cJSON_Delete(j);
    }
    f->phase_t0 = gang_now_ms();
    f->phase_end = f->phase_t0 + (uint64_t)r->o.prefill_timeout_ms;
    attempt(f);
}

void gang__router_replica_down(router *r, uint32_t i)
{
    router_fwd *f = r->fwds;
    while (f != NULL) {
        router_fwd *next = f->next;
        if (f->replica == (int32_t)i)
            attempt_failed(f, "the replica is down", 0);
        f = next;
    }
}

void gang__router_forward_close_all(router *r)
{
    while (r->fwds != NULL)
        fail_call(r->fwds, 503, "the router is stopping");
}
