/*
 * `ganglion router`: one front door for several data-parallel replicas (gangs). One
 * single-threaded libuv loop: the HTTP server (serve/'s), the forwarding (proxy.c), and a
 * timer that polls every replica's /metrics on libuv's thread pool (the blocking client
 * with its deadline, after resolving the replica's name again: a restarted Pod has a new
 * address).
 *
 * A replica is up while its last poll answered with ganglion_ready 1; it goes down at a
 * poll that says it is not ready, after --down-after-fails polls without an answer, or at
 * once when a call cannot connect to it. Its reported load is ganglion_requests_in_flight
 * (calls its API holds, queued or running); the policy compares max(that, the calls this
 * router has in flight there), so a burst between two polls is seen at once.
 */
#include <netdb.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cjson/cJSON.h>

#include "router-internal.h"

#define RO_STR(f_, fld, d_, hp) GANG_OPT_STR(router_opts, f_, fld, d_, hp)
#define RO_INT(f_, fld, d_, lo_, hi_, hp) GANG_OPT_INT(router_opts, f_, fld, d_, lo_, hi_, hp)
static const gang_param_info router_items[] = {
    RO_STR("replicas", replicas, "",
           "the replicas' HTTP endpoints, HOST:PORT,... (names re-resolved at every poll; "
           "required)"),
    RO_STR("replicas-dns", replicas_dns, "",
           "NAME:PORT,...: every IPv4 address of NAME is a replica (a headless Service), "
           "resolved again every --dns-interval-ms"),
    RO_INT("dns-interval-ms", dns_interval_ms, "2000", 10, 3600000,
           "how often --replicas-dns names are resolved again"),
    RO_STR("policy", policy, "prefix", "routing: prefix | round-robin | least-loaded"),
    RO_STR("model", model, "",
           "a model directory whose tokenizer.json keys prompts by token blocks (else raw "
           "text in 64-byte chunks)"),
    RO_STR("bind-address", bind_address, "0.0.0.0", "address of the HTTP front door"),
    RO_INT("http-port", http_port, "8000", 0, 65535, "port of the HTTP front door (0: any)"),
    RO_INT("lru-blocks", lru_blocks, "16384", 1, GANG_ROUTER_MAX_LRU,
           "prompt blocks remembered per replica (about its KV cache's blocks)"),
    RO_INT("load-slack", load_slack, "4", 0, 1 << 20,
           "a prefix's replica is skipped when its load exceeds the least loaded's by more"),
    RO_INT("poll-interval-ms", poll_interval_ms, "200", 10, 600000, "replica polling period"),
    RO_INT("poll-timeout-ms", poll_timeout_ms, "1000", 10, 600000, "deadline of one poll"),
    RO_INT("down-after-fails", down_after_fails, "2", 1, 1000,
           "polls without an answer before a replica is down"),
    RO_INT("connect-timeout-ms", connect_timeout_ms, "1000", 10, 600000,
           "deadline of a connection to a replica"),
    RO_INT("request-timeout-ms", request_timeout_ms, "600000", 100, 86400000,
           "a call's deadline, retries included (then 504)"),
    RO_INT("retry-backoff-ms", retry_backoff_ms, "100", 1, 60000,
           "wait before trying again when no replica is eligible"),
    RO_INT("prefill-timeout-ms", prefill_timeout_ms, "30000", 10, 86400000,
           "P/D: a call's prefill on a prefill replica past this is abandoned and its decode "
           "replica prefills it"),
    RO_INT("max-conns", max_conns, "1024", 1, 1 << 20, "client connections at once"),
    RO_INT("max-body-bytes", max_body_bytes, "16777216", 1024, 1 << 30, "a call's body"),
    RO_INT("max-response-bytes", max_response_bytes, "67108864", 1024, 1 << 30,
           "a replica's unstreamed answer"),
    RO_INT("idle-timeout-ms", idle_timeout_ms, "30000", 100, 86400000,
           "a client connection that sends no complete request is closed"),
};
static const gang_opt_table router_table = GANG_OPT_TABLE(router_items);
static const gang_opt_cmd router_cmd = {
    "router", "--replicas HOST:PORT,... [flags]",
    "One HTTP front door for data-parallel replicas (gangs): forwards /v1/completions and\n"
    "/v1/chat/completions (streamed or not) to the replica holding the longest prefix of the\n"
    "prompt in its cache, unless it is overloaded, else to the least loaded; retries on\n"
    "another replica a call whose replica failed before it answered. With replicas started\n"
    "--role prefill and --role decode, a call's prefill (max_tokens 1) goes to a prefill\n"
    "replica first, then the call to a decode replica. /healthz, /readyz, /metrics,\n"
    "/status. See docs/operations.md.",
    &router_table, 0};

/* ------------------------------------------------------------------ replicas */

/* Splits "h:p,h:p" into r->reps. 0 or GANG_EUSAGE (after printing why). */
static int parse_replicas(router *r)
{
    char *copy = strdup(r->o.replicas), *save = NULL;
    int rc = 0;
    if (copy == NULL)
        return GANG_ENOMEM;
    r->reps = calloc(GANG_ROUTER_MAX_REPLICAS, sizeof(*r->reps));
    if (r->reps == NULL) {
        free(copy);
        return GANG_ENOMEM;
    }
    for (char *t = strtok_r(copy, ",", &save); t != NULL; t = strtok_r(NULL, ",", &save)) {
        char *colon = strrchr(t, ':');
        long port = colon != NULL ? strtol(colon + 1, NULL, 10) : 0;
        if (r->nreps == GANG_ROUTER_MAX_REPLICAS || colon == NULL || colon == t ||
            (size_t)(colon - t) >= ROUTER_HOST_MAX || port < 1 || port > 65535) {
            rc = gang_opts_usage_error(&router_cmd,
                                       "--replicas: '%s' is not HOST:PORT (at most "
                                       "%u replicas)",
                                       t, GANG_ROUTER_MAX_REPLICAS);
            break;
        }
        router_replica *rep = &r->reps[r->nreps];
        rep->r = r;
        rep->index = r->nreps++;
        rep->active = 1;
        rep->dns = -1;
        rep->kv_free = UINT32_MAX; /* (until its first poll) */
        memcpy(rep->host, t, (size_t)(colon - t));
        rep->port = (int)port;
        snprintf(rep->name, sizeof rep->name, "%s:%d", rep->host, rep->port);
        rep->work.data = rep;
    }
    if (rc == 0)
        rc = gang__router_dns_parse(r, &router_cmd);
    if (rc == 0 && r->nreps == 0 && r->ndns == 0)
        rc = gang_opts_usage_error(&router_cmd, "--replicas HOST:PORT,... or --replicas-dns "
                                                "NAME:PORT,... is required");
    free(copy);
    return rc;
}

void gang__router_load_changed(router *r, uint32_t i)
{
    gang_router_load l = {.reported = r->reps[i].reported,
                          .inflight = r->reps[i].inflight,
                          .kv_free_blocks = r->reps[i].kv_free};
    gang_router_policy_set_load(r->policy, i, &l);
}

void gang__router_set_up(router *r, uint32_t i, int up, const char *why)
{
    router_replica *rep = &r->reps[i];
    if (rep->up == (up != 0))
        return;
    rep->up = up != 0;
    gang_router_policy_set_up(r->policy, i, up);
    if (up) {
        gang_info("router: replica %s (%s) is up", rep->name, rep->addr);
        return;
    }
    gang_warn("router: replica %s is down: %s", rep->name, why);
    gang__router_replica_down(r, i);
}

/* The value of the first sample of metric NAME in Prometheus text, or -1. */
static double metric_value(const char *text, const char *name)
{
    size_t n = strlen(name);
    for (const char *l = text; l != NULL && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL) {
        if (strncmp(l, name, n) != 0 || (l[n] != ' ' && l[n] != '{'))
            continue;
        const char *sp = strchr(l, ' ');
        const char *nl = strchr(l, '\n');
        if (l[n] == '{') {
            const char *close = strchr(l, '}');
            sp = close != NULL ? strchr(close, ' ') : NULL;
        }
        if (sp == NULL || (nl != NULL && sp > nl))
            return -1;
        return strtod(sp + 1, NULL);
    }
    return -1;
}

/* Pool thread: resolve the replica's name and read its /metrics, with the deadline. */
static void poll_work(uv_work_t *w)
{
    router_replica *rep = w->data;
    router_poll *p = &rep->poll;
    struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *ai = NULL;
    memset(p, 0, sizeof(*p));
    if (getaddrinfo(rep->host, NULL, &hints, &ai) != 0 || ai == NULL) {
        p->err = GANG_ERESOLVE;
        return;
    }
    inet_ntop(AF_INET, &((struct sockaddr_in *)ai->ai_addr)->sin_addr, p->addr, sizeof p->addr);
    freeaddrinfo(ai);
    int status = 0;
    char *body = NULL;
    p->err = gang_http_fetch(p->addr, rep->port, "GET", "/metrics", NULL,
                             (int)rep->r->o.poll_timeout_ms, &status, &body);
    if (p->err == 0 && status == 200) {
        p->ok = 1;
        p->ready = metric_value(body, "ganglion_ready") == 1.0;
        /* Untrusted numbers: anything negative, huge or NaN reads as 0. */
        double v = metric_value(body, "ganglion_requests_in_flight");
        p->in_flight = v > 0 && v < 1e9 ? (uint32_t)v : 0;
        v = metric_value(body, "ganglion_prompt_tokens_total");
        p->prompt_tokens = v > 0 && v < 1e18 ? (uint64_t)v : 0;
        v = metric_value(body, "ganglion_prefix_cache_hit_tokens_total");
        p->hit_tokens = v > 0 && v < 1e18 ? (uint64_t)v : 0;
        v = metric_value(body, "ganglion_kv_cache_blocks_free"); /* (the coordinator's) */
        p->kv_free = v >= 0 && v < 4e9 ? (uint32_t)v : UINT32_MAX;
        v = metric_value(body, "ganglion_role");
        p->role = v == GANG_ROLE_PREFILL || v == GANG_ROLE_DECODE ? (uint32_t)v : GANG_ROLE_BOTH;
    } else if (p->err == 0) {
        p->err = GANG_EPROTO;
    }
    free(body);
}

/* Loop thread: what the poll found decides the replica's health and load. */
static void poll_done(uv_work_t *w, int status)
{
    router_replica *rep = w->data;
    router *r = rep->r;
    const router_poll *p = &rep->poll;
    rep->polling = 0;
    if (status != 0 || r->stopping || !rep->active)
        return; /* (an address that left its DNS name while it was polled) */
    if (p->addr[0] != '\0')
        snprintf(rep->addr, sizeof rep->addr, "%s", p->addr);
    if (!p->ok) {
        if (++rep->fails >= (uint32_t)r->o.down_after_fails)
            gang__router_set_up(r, rep->index, 0, gang_strerror(p->err));
        return;
    }
    rep->fails = 0;
    rep->reported = p->in_flight;
    rep->kv_free = p->kv_free;
    rep->prompt_tokens = p->prompt_tokens;
    rep->hit_tokens = p->hit_tokens;
    if (rep->role != p->role)
        gang_info("router: replica %s has the role %s", rep->name, gang_role_name(p->role));
    rep->role = p->role;
    gang_router_policy_set_role(r->policy, rep->index, rep->role);
    gang__router_load_changed(r, rep->index);
    gang__router_set_up(r, rep->index, p->ready, "its gang is not serving");
}

static void on_poll_timer(uv_timer_t *t)
{
    router *r = t->data;
    for (uint32_t i = 0; i < r->nreps; i++) {
        router_replica *rep = &r->reps[i];
        if (rep->polling || !rep->active)
            continue;
        if (uv_queue_work(r->loop, &rep->work, poll_work, poll_done) == 0)
            rep->polling = 1;
    }
}

/* ------------------------------------------------------------------ probes, metrics */

static void metric_replica(gang_metrics_buf *b, router *r, const char *name, const char *help,
                           gang_metric_type type, double (*get)(const router_replica *))
{
    gang_metrics_family(b, name, type, help);
    for (uint32_t i = 0; i < r->nreps; i++) {
        gang_metric_label l = {.name = "replica", .value = r->reps[i].name};
        if (r->reps[i].active)
            gang_metrics_sample_double(b, name, &l, 1, get(&r->reps[i]));
    }
}

static double m_up(const router_replica *p)
{
    return p->up;
}
static double m_reported(const router_replica *p)
{
    return p->reported;
}
static double m_inflight(const router_replica *p)
{
    return p->inflight;
}
static double m_sent(const router_replica *p)
{
    return (double)p->sent;
}
static double m_moved(const router_replica *p)
{
    return (double)p->retried_away;
}
static double m_midstream(const router_replica *p)
{
    return (double)p->mid_stream_failures;
}
static double m_kv_free(const router_replica *p)
{
    return p->kv_free == UINT32_MAX ? -1.0 : (double)p->kv_free;
}
static double m_role(const router_replica *p)
{
    return p->role;
}
static double m_cached(const router_replica *p)
{
    return gang_router_policy_cached(p->r->policy, p->index);
}
static double m_route_hit(const router_replica *p)
{
    return p->prompt_blocks ? (double)p->matched_blocks / (double)p->prompt_blocks : 0.0;
}
static double m_engine_hit(const router_replica *p)
{
    return p->prompt_tokens ? (double)p->hit_tokens / (double)p->prompt_tokens : 0.0;
}

static void render_metrics(router *r, gang_metrics_buf *b)
{
    gang_metrics_family(b, "ganglion_router_decisions_total", GANG_METRIC_COUNTER,
                        "Replica choices, by reason (prefix, overloaded, least_loaded, "
                        "round_robin)");
    for (int k = 0; k < GANG_ROUTER_R_COUNT; k++) {
        gang_metric_label l = {.name = "reason", .value = gang_router_reason_name(k)};
        gang_metrics_sample_u64(b, "ganglion_router_decisions_total", &l, 1, r->decisions[k]);
    }
    const gang_metric_counter cs[] = {
        {"ganglion_router_requests_total", "Calls the router accepted", r->accepted},
        {"ganglion_router_answered_total", "Calls answered (each exactly once)", r->answered},
        {"ganglion_router_retries_total",
         "Calls moved to another replica before their client had any answer byte", r->retries},
        {"ganglion_router_no_replica_total", "Tries that found no eligible replica (waited)",
         r->no_replica},
        {"ganglion_router_stream_errors_total",
         "Streams ended with an error event (the deadline, or a replica failed after the "
         "first token and the stream could not be resumed with the same text)",
         r->stream_errors},
        {"ganglion_router_stream_resumes_total",
         "Streams continued on another replica after theirs failed mid-stream (the tokens the "
         "client had checked and not sent again)",
         r->stream_resumes},
        {"ganglion_router_pd_prefills_total",
         "P/D: calls whose prefill and first token were sent to a prefill replica", r->pd_prefills},
        {"ganglion_router_pd_prefill_failures_total",
         "P/D: of those, prefills that failed or passed --prefill-timeout-ms (the decode "
         "replica prefilled the call itself)",
         r->pd_prefill_failed},
        {"ganglion_router_pd_prefill_skipped_total",
         "P/D: calls sent straight to a decode replica (no prefill replica eligible, or a "
         "call P/D does not split: n > 1, a batch of prompts)",
         r->pd_prefill_skipped},
        {"ganglion_router_pd_kv_handovers_total",
         "P/D: decode phases sent with the prefill replica's kv_transfer (the decode gang "
         "fetches the prompt's KV blocks)",
         r->pd_kv_handovers},
    };
    gang_metrics_counters(b, cs, sizeof(cs) / sizeof(cs[0]));
    gang_metrics_family(b, "ganglion_router_requests_in_flight", GANG_METRIC_GAUGE,
                        "Calls accepted and not answered yet");
    gang_metrics_sample_u64(b, "ganglion_router_requests_in_flight", NULL, 0,
                            r->accepted - r->answered);
    metric_replica(b, r, "ganglion_router_replica_up", "1 while the replica serves",
                   GANG_METRIC_GAUGE, m_up);
    gang_metrics_family(b, "ganglion_router_prefill_seconds", GANG_METRIC_HISTOGRAM,
                        "P/D: a call's prefill phase on a prefill replica, sent to answered");
    gang_histogram_render(b, "ganglion_router_prefill_seconds", NULL, 0, &r->h_prefill);
    metric_replica(b, r, "ganglion_router_replica_role",
                   "The replica's ganglion_role, last poll: 0 both, 1 prefill, 2 decode",
                   GANG_METRIC_GAUGE, m_role);
    metric_replica(b, r, "ganglion_router_replica_load",
                   "Calls the replica holds (its ganglion_requests_in_flight, last poll)",
                   GANG_METRIC_GAUGE, m_reported);
    metric_replica(b, r, "ganglion_router_replica_kv_free_blocks",
                   "The replica's free KV blocks (its ganglion_kv_cache_blocks_free, last poll; "
                   "-1: not reported)",
                   GANG_METRIC_GAUGE, m_kv_free);
    metric_replica(b, r, "ganglion_router_replica_in_flight",
                   "Calls this router has in flight on the replica", GANG_METRIC_GAUGE, m_inflight);
    metric_replica(b, r, "ganglion_router_replica_requests_total", "Attempts sent to the replica",
                   GANG_METRIC_COUNTER, m_sent);
    metric_replica(b, r, "ganglion_router_replica_moved_total",
                   "Calls moved away from the replica after it failed", GANG_METRIC_COUNTER,
                   m_moved);
    metric_replica(b, r, "ganglion_router_replica_stream_failures_total",
                   "Streams the replica failed after their first token", GANG_METRIC_COUNTER,
                   m_midstream);
    metric_replica(b, r, "ganglion_router_replica_cached_blocks",
                   "Prompt blocks the router remembers sending to the replica", GANG_METRIC_GAUGE,
                   m_cached);
    metric_replica(b, r, "ganglion_router_replica_prefix_hit_ratio",
                   "Prompt blocks sent to the replica that it was believed to hold",
                   GANG_METRIC_GAUGE, m_route_hit);
    metric_replica(b, r, "ganglion_router_replica_engine_hit_ratio",
                   "The replica's own prefix-cache hit tokens over prompt tokens (last poll)",
                   GANG_METRIC_GAUGE, m_engine_hit);
}

static char *status_json(router *r)
{
    cJSON *o = cJSON_CreateObject();
    static const char *const kinds[] = {"prefix", "round-robin", "least-loaded"};
    gang_router_kind k = GANG_ROUTER_PREFIX;
    (void)gang_router_kind_parse(r->o.policy, &k);
    cJSON_AddStringToObject(o, "policy", kinds[k]);
    cJSON_AddNumberToObject(o, "in_flight", (double)(r->accepted - r->answered));
    cJSON_AddBoolToObject(o, "disaggregated", gang_router_policy_pd(r->policy));
    cJSON *a = cJSON_AddArrayToObject(o, "replicas");
    for (uint32_t i = 0; i < r->nreps; i++) {
        const router_replica *p = &r->reps[i];
        if (!p->active)
            continue;
        cJSON *e = cJSON_CreateObject();
        cJSON_AddStringToObject(e, "name", p->name);
        cJSON_AddStringToObject(e, "address", p->addr);
        cJSON_AddBoolToObject(e, "up", p->up);
        cJSON_AddStringToObject(e, "role", gang_role_name(p->role));
        cJSON_AddNumberToObject(e, "load", p->reported);
        cJSON_AddNumberToObject(e, "kv_free_blocks", m_kv_free(p));
        cJSON_AddNumberToObject(e, "in_flight", p->inflight);
        cJSON_AddNumberToObject(e, "requests", (double)p->sent);
        cJSON_AddNumberToObject(e, "cached_blocks", m_cached(p));
        cJSON_AddNumberToObject(e, "prefix_hit_ratio", m_route_hit(p));
        cJSON_AddItemToArray(a, e);
    }
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return s;
}

/* Replies with a NUL-terminated text (503 when it is NULL: out of memory). */
static void reply_text(gang_http_exchange *x, int status, const char *ctype, const char *text)
{
    if (text == NULL) {
        gang_http_reply(x, 503, NULL, "out of memory\n", strlen("out of memory\n"));
        return;
    }
    gang_http_reply(x, status, ctype, text, strlen(text));
}

static void on_request(void *ctx, gang_http_exchange *x, const gang_http_request *req)
{
    router *r = ctx;
    int get = strcmp(req->method, "GET") == 0, post = strcmp(req->method, "POST") == 0;
    if (get && strcmp(req->path, "/healthz") == 0) {
        reply_text(x, 200, NULL, "ok\n");
    } else if (get && strcmp(req->path, "/readyz") == 0) {
        int any = 0;
        for (uint32_t i = 0; i < r->nreps; i++)
            any |= r->reps[i].up;
        reply_text(x, any ? 200 : 503, NULL, any ? "ready\n" : "no replica serves\n");
    } else if (get && strcmp(req->path, "/metrics") == 0) {
        gang_metrics_buf b;
        gang_metrics_buf_init(&b);
        render_metrics(r, &b);
        gang_http_reply(x, b.err ? 503 : 200, "text/plain; version=0.0.4",
                        gang_metrics_buf_text(&b), strlen(gang_metrics_buf_text(&b)));
        gang_metrics_buf_free(&b);
    } else if (get && strcmp(req->path, "/status") == 0) {
        char *s = status_json(r);
        reply_text(x, 200, "application/json", s);
        cJSON_free(s);
    } else if (post && (strcmp(req->path, "/v1/completions") == 0 ||
                        strcmp(req->path, "/v1/chat/completions") == 0)) {
        gang__router_forward(r, x, req, 1);
    } else if ((get && strcmp(req->path, "/v1/models") == 0) ||
               (post &&
                (strcmp(req->path, "/tokenize") == 0 || strcmp(req->path, "/detokenize") == 0))) {
        gang__router_forward(r, x, req, 0);
    } else {
        reply_text(x, 404, "application/json",
                   "{\"error\":{\"message\":\"not found\",\"type\":\"invalid_request_error\","
                   "\"code\":404}}");
    }
}

/* ------------------------------------------------------------------ life */

static void on_signal(uv_signal_t *s, int signum)
{
    router *r = s->data;
    gang_info("router: signal %d, stopping", signum);
    r->stopping = 1;
    gang_http_server_close(r->http);
    gang__router_forward_close_all(r);
    uv_close((uv_handle_t *)&r->poll_timer, NULL);
    gang__router_dns_stop(r);
    uv_close((uv_handle_t *)&r->sigint, NULL);
    uv_close((uv_handle_t *)&r->sigterm, NULL);
}

/* Loads the tokenizer of --model when given. 0 or GANG_EUSAGE after printing why. */
static int load_tokenizer(router *r)
{
    char path[4200], err[256];
    if (r->o.model[0] == '\0')
        return 0;
    snprintf(path, sizeof path, "%s/tokenizer.json", r->o.model);
    if (gang_tokenizer_load(path, &r->tok, err, sizeof err) != 0)
        return gang_opts_usage_error(&router_cmd, "--model: %s: %s", path, err);
    return 0;
}

/* Parses the flags and builds everything but the loop's handles. 0 or an exit code. */
static int router_setup(router *r, int argc, char **argv)
{
    int rc = gang_opts_cli(&router_cmd, &r->o, argc, argv, NULL, NULL);
    if (rc == GANG_OPTS_HELP)
        return -1;
    if (rc != 0)
        return GANG_EXIT_USAGE;
    gang_router_kind kind;
    if (gang_router_kind_parse(r->o.policy, &kind) != 0) {
        gang_opts_usage_error(&router_cmd,
                              "--policy: '%s' is not prefix, round-robin or "
                              "least-loaded",
                              r->o.policy);
        return GANG_EXIT_USAGE;
    }
    if (parse_replicas(r) != 0 || load_tokenizer(r) != 0)
        return GANG_EXIT_USAGE;
    gang_router_policy_config pc = {.nreplicas = r->ndns > 0 ? GANG_ROUTER_MAX_REPLICAS : r->nreps,
                                    .lru_blocks = (uint32_t)r->o.lru_blocks,
                                    .load_slack = (uint32_t)r->o.load_slack,
                                    .kind = kind};
    if (gang_router_policy_init(&pc, &r->policy) != 0)
        return GANG_EXIT_INTERNAL;
    static const double secs[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                  0.5,   1,      2.5,   5,    10,    30,   60};
    gang_histogram_init(&r->h_prefill, secs, sizeof(secs) / sizeof(secs[0]));
    return 0;
}

static void router_teardown(router *r)
{
    gang_router_policy_free(r->policy);
    gang_tokenizer_free(r->tok);
    free(r->reps);
    free(r->dns);
}

int gang_router_main(int argc, char **argv)
{
    router r;
    uv_loop_t loop;
    memset(&r, 0, sizeof r);
    int rc = router_setup(&r, argc, argv);
    if (rc != 0) {
        router_teardown(&r);
        return rc < 0 ? GANG_EXIT_OK : rc;
    }
    uv_loop_init(&loop);
    r.loop = &loop;
    gang_http_config hc = {.bind_address = r.o.bind_address,
                           .port = (int)r.o.http_port,
                           .max_body = (size_t)r.o.max_body_bytes,
                           .max_conns = (int)r.o.max_conns,
                           .idle_timeout_ms = (uint64_t)r.o.idle_timeout_ms};
    rc = gang_http_server_start(&loop, &hc, on_request, &r, &r.http);
    if (rc != 0) {
        gang_error("router: cannot listen on %s:%lld: %s", r.o.bind_address,
                   (long long)r.o.http_port, gang_strerror(rc));
        rc = GANG_EXIT_USAGE;
        goto out_loop;
    }
    gang_info(
        "router: %u replica(s) and %u DNS name(s), policy %s, HTTP on %s:%d, prompts keyed by %s",
        r.nreps, r.ndns, r.o.policy, r.o.bind_address, gang_http_server_port(r.http),
        r.tok ? "token blocks" : "raw text chunks");
    uv_timer_init(&loop, &r.poll_timer);
    r.poll_timer.data = &r;
    uv_timer_start(&r.poll_timer, on_poll_timer, 0, (uint64_t)r.o.poll_interval_ms);
    gang__router_dns_start(&r);
    uv_signal_init(&loop, &r.sigint);
    uv_signal_init(&loop, &r.sigterm);
    r.sigint.data = r.sigterm.data = &r;
    uv_signal_start(&r.sigint, on_signal, SIGINT);
    uv_signal_start(&r.sigterm, on_signal, SIGTERM);
    uv_run(&loop, UV_RUN_DEFAULT);
    rc = GANG_EXIT_OK;
out_loop:
    uv_run(&loop, UV_RUN_DEFAULT);
    uv_loop_close(&loop);
    router_teardown(&r);
    return rc;
}
