/*
 * ganglion serve module (serve/): the HTTP/1.1 server on a libuv loop (probes, metrics,
 * status, the API; chunked streaming), a small blocking HTTP client, the Prometheus text
 * renderers, and the OpenAI-compatible inference API. The API hands what global rank 0
 * must see to a submit hook as the engine's request messages (ganglion/engine.h); the
 * launcher plugs in its transport (the supervisor's worker channel, or the front door's
 * forwarding to the coordinator).
 *
 * Layering: serve/ sits on text/ (tokenizer, chat templates) and engine/'s request types;
 * launcher/ and bench/ sit on top of it. No libuv type appears here: a loop is a void *.
 */
#ifndef GANGLION_SERVE_H
#define GANGLION_SERVE_H

#include <stddef.h>
#include <stdint.h>

#include "ganglion/common.h"
#include "ganglion/engine.h"

/* ============================== HTTP server ====================================== */

/*
 * Minimal HTTP/1.1 server on a libuv loop (serve/http*.c), parsing with the
 * maintained http_parser library. Serves probes, metrics, status and the API.
 *
 * Bounds: request line + headers <= 16 KiB, body <= max_body (413 beyond), at most
 * max_conns connections: at the cap a new connection replaces the oldest one still
 * sending its request (or idle between keep-alive requests), so slow clients are shed
 * before they starve the probes; when every connection is being answered a new one takes
 * one of probe_reserve more slots, for probe paths only, and past those it is closed at
 * accept. A connection that does not complete a request within
 * idle_timeout_ms is closed (slowloris). Keep-alive supported.
 * Malformed requests get 400 and the connection is closed; others keep being served.
 */

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
    /* CORS: NULL or "" = off; else the Access-Control-Allow-Origin value ("*" or an origin,
     * at most GANG_HTTP_CORS_MAX bytes of header-safe characters) that every response
     * carries, and OPTIONS requests are answered here as preflights (204 with the allowed
     * methods and headers, before any handler or API key: a preflight carries none). */
    const char *cors_origin;
    /* Connections beyond max_conns kept for the probes: when every connection is being
     * answered (none left to shed), up to probe_reserve more are accepted, and a request on
     * one of them is served only when its path is one of probe_paths (NULL-terminated),
     * else answered 503 and closed. 0 / NULL: none. */
    int probe_reserve;
    const char *const *probe_paths;
} gang_http_config;
#define GANG_HTTP_CORS_MAX 200

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

/* ============================== Prometheus metrics =============================== */

/*
 * Prometheus text exposition builder (serve/metrics*.c): the agent renders /metrics
 * by appending metric families to a growable buffer on its loop thread.
 *
 * Format (text exposition 0.0.4): for each family "# HELP name text" and
 * "# TYPE name gauge|counter|histogram", then one line per sample:
 * name{label="value",...} number. Label values escape backslash, double quote and newline;
 * HELP text escapes backslash and newline. Numbers: integers exactly, doubles in the
 * shortest form that reads back to the same double (at most %.17g), and +Inf, -Inf, NaN.
 *
 * Errors are sticky: the first failure (GANG_ENOMEM, or GANG_EINVAL for an invalid metric
 * or label name) is kept in buf->err, later appends do nothing and return it, so a caller
 * can emit everything and check once. Nothing here is thread-safe.
 */

typedef struct gang_metrics_buf {
    char *data; /* NUL-terminated text; NULL until the first append (see _text()) */
    size_t len; /* bytes of text, without the NUL */
    size_t cap; /* bytes allocated */
    int err;    /* first error, sticky; 0 while everything succeeded */
} gang_metrics_buf;

typedef enum gang_metric_type {
    GANG_METRIC_GAUGE = 0,
    GANG_METRIC_COUNTER,
    GANG_METRIC_HISTOGRAM
} gang_metric_type;

typedef struct gang_metric_label {
    const char *name;  /* [a-zA-Z_][a-zA-Z0-9_]*; "le" is reserved for histograms */
    const char *value; /* any UTF-8; escaped on output */
} gang_metric_label;

/* Sets b up empty; allocates nothing. */
void gang_metrics_buf_init(gang_metrics_buf *b);
/* Releases b's memory and leaves it as after init. */
void gang_metrics_buf_free(gang_metrics_buf *b);
/* Empties b (and clears its error) but keeps the allocation for the next rendering. */
void gang_metrics_buf_reset(gang_metrics_buf *b);
/* The text so far: never NULL ("" before the first append). Valid until the next append. */
const char *gang_metrics_buf_text(const gang_metrics_buf *b);

/*
 * Appends a family header: "# HELP name help" (skipped when help is NULL) and
 * "# TYPE name type". name must match [a-zA-Z_:][a-zA-Z0-9_:]*. Returns 0 or b->err.
 */
int gang_metrics_family(gang_metrics_buf *b, const char *name, gang_metric_type type,
                        const char *help);

/*
 * Appends one sample line "name{labels} value". labels may be NULL when nlabels is 0.
 * The sample name is separate from the family name because a family's samples may carry
 * suffixes (name_total, name_bucket, ...). Returns 0 or b->err.
 */
int gang_metrics_sample_i64(gang_metrics_buf *b, const char *name, const gang_metric_label *labels,
                            size_t nlabels, int64_t value);
int gang_metrics_sample_u64(gang_metrics_buf *b, const char *name, const gang_metric_label *labels,
                            size_t nlabels, uint64_t value);
int gang_metrics_sample_double(gang_metrics_buf *b, const char *name,
                               const gang_metric_label *labels, size_t nlabels, double value);

/* One unlabeled counter: its family name, help text and value. */
typedef struct gang_metric_counter {
    const char *name, *help;
    uint64_t v;
} gang_metric_counter;

/* Each of the n counters as a counter family with its one unlabeled sample. Returns 0 or
 * b->err. */
int gang_metrics_counters(gang_metrics_buf *b, const gang_metric_counter *cs, size_t n);

/*
 * One gauge or counter family with a single sample: its name and help text written once,
 * its type, the sample's labels (nlabels 0: none) and its value, an integer (v) or, with
 * is_double, d. What a table of a component's scalar metrics is made of.
 */
typedef struct gang_metric_scalar {
    const char *name, *help;
    gang_metric_type type; /* GANG_METRIC_GAUGE or GANG_METRIC_COUNTER */
    const gang_metric_label *labels;
    size_t nlabels;
    int is_double; /* 1: the value is d, printed as a double; 0: v, printed exactly */
    uint64_t v;
    double d;
} gang_metric_scalar;

/* Each of the n scalars as its family header and its one sample, in order. Returns 0 or
 * b->err (GANG_EINVAL for a histogram type: it has no single sample). */
int gang_metrics_scalars(gang_metrics_buf *b, const gang_metric_scalar *ss, size_t n);

/*
 * Fixed-bucket histogram, Prometheus semantics: bucket i counts observations v <= bounds[i]
 * (cumulatively on output), plus an implicit +Inf bucket; sum and count of everything.
 * Plain value type: embed it, no allocation, copy it to snapshot it.
 */
#define GANG_HISTOGRAM_MAX_BUCKETS 32

typedef struct gang_histogram {
    size_t nbounds;                                  /* finite upper bounds in use */
    double bounds[GANG_HISTOGRAM_MAX_BUCKETS];       /* strictly increasing, finite */
    uint64_t counts[GANG_HISTOGRAM_MAX_BUCKETS + 1]; /* per bucket, not cumulative; the
                                                        last one used is +Inf */
    double sum;                                      /* of every observation */
    uint64_t count;                                  /* observations */
} gang_histogram;

/*
 * Sets h up with n upper bounds (1 <= n <= GANG_HISTOGRAM_MAX_BUCKETS, finite, strictly
 * increasing; +Inf is implicit). Returns 0 or GANG_EINVAL (h is then left empty, with no
 * finite bounds, and still safe to observe and render).
 */
int gang_histogram_init(gang_histogram *h, const double *bounds, size_t n);
/* Records one observation. NaN is ignored: it would poison the sum forever. */
void gang_histogram_observe(gang_histogram *h, double v);
/*
 * Appends the samples of h under the family name: name_bucket{labels...,le="b"} with
 * cumulative counts for every bound and le="+Inf", then name_sum and name_count (with the
 * same labels). Emit the family header with gang_metrics_family(..., GANG_METRIC_HISTOGRAM)
 * first; several label sets may follow one header. Returns 0 or b->err.
 */
int gang_histogram_render(gang_metrics_buf *b, const char *name, const gang_metric_label *labels,
                          size_t nlabels, const gang_histogram *h);

/* ============================== HTTP client ====================================== */

/*
 * A tiny blocking HTTP client for the commands that talk to a gang they started (bench
 * watches /status, generate posts a completion): one request, one deadline.
 */

#define GANG_HTTP_CLIENT_MAX_BODY (4u << 20)

/*
 * Sends METHOD path to http://host:port (host an IPv4 literal) with body (JSON, or NULL
 * for none) and reads the answer; connect, send and receive must all finish within
 * timeout_ms. Reading stops at Content-Length or EOF. On success returns 0 with the status
 * code in *status and the body, NUL-terminated and owned by the caller (free()), in *out.
 * Errors: GANG_EINVAL (bad host), GANG_ETIMEDOUT, GANG_EPROTO (not HTTP), GANG_EMSGSIZE
 * (body over GANG_HTTP_CLIENT_MAX_BODY), GANG_ENOMEM, or a socket error such as
 * GANG_ECONNREFUSED.
 */
int gang_http_fetch(const char *host, int port, const char *method, const char *path,
                    const char *body, int timeout_ms, int *status, char **out);

/* ============================== OpenAI-compatible API ============================ */

/*
 * The OpenAI-compatible inference API of every agent (serve/api*.c):
 * POST /v1/completions, POST /v1/chat/completions (both also streamed as Server-Sent
 * Events), GET /v1/models, POST /tokenize, POST /detokenize; the table of accepted calls,
 * and what makes "nothing lost" true.
 *
 * A call the API accepted is owned by this table until it is answered: with its text and
 * tokens (200, or a stream that ends with [DONE]), with an explicit error at its deadline
 * (504), or with 400 when the gang refuses it as invalid. Each prompt of a call is one
 * request of the engine, handed to global rank 0 (local rank 0 of this node) with SUBMIT
 * (and PROMPT pieces for prompts longer than one packet) for the generation that is
 * starting or serving. When that generation is aborted, every request still owed is
 * submitted again, from its prompt, after the next START; the tokens the client already
 * has are kept and the re-run's first tokens are checked against them, not sent again
 * (seeded sampling depends only on (seed, position), so a re-run produces the same
 * tokens): a stream continues exactly where it was.
 *
 * On the coordinator the packets for rank 0 go through the supervisor; on a member the same
 * API forwards them to the coordinator (api-fwd.h): a lost coordinator is an ABORT like
 * any other, so a member keeps its calls and submits them again after the next START.
 *
 * Everything runs on the agent's libuv loop thread.
 */

typedef struct gang_api gang_api;

#define GANG_API_KEY_MAX 256 /* bytes of an API key (--api-key-file) */

/* What a gang does behind a router in disaggregated prefill/decode (--role, issue #26);
 * the value of ganglion_role in /metrics, which the router reads. */
#define GANG_ROLE_BOTH 0u    /* prefill and decode (one gang alone, or a DP replica) */
#define GANG_ROLE_PREFILL 1u /* the router sends it prompts for their prefill, max_tokens 1 */
#define GANG_ROLE_DECODE 2u  /* the router sends it the calls to continue after a prefill */

/* The role named NAME ("both", "prefill", "decode") into *out; GANG_EINVAL otherwise. */
int gang_role_parse(const char *name, uint32_t *out);
/* The printable name of role (an unknown one is "both"). */
const char *gang_role_name(uint32_t role);

/* What the API needs; filled by gang_agent_config_from_params (layout.c). */
typedef struct gang_api_config {
    char model[GANG_PARAM_STR_MAX];     /* the model's name in responses ("" = none) */
    int has_model;                      /* 0: every completion is answered 503 */
    gang_model_config mc;               /* the served model's configuration (with a model) */
    uint32_t ctx;                       /* the context length requests must fit in */
    char ctx_why[256];                  /* why ctx is what it is (/v1/models) */
    uint64_t kv_block_bytes;            /* one KV block of the whole model (0: unknown) */
    uint32_t max_queue;                 /* requests owed at once; more get 503 */
    uint64_t request_timeout_ms;        /* deadline of one request, across restarts */
    char model_dir[GANG_PARAM_STR_MAX]; /* tokenizer.json, tokenizer_config.json ("" = none) */
    char api_key[GANG_API_KEY_MAX + 1]; /* Bearer token the API requires ("" = open) */
    uint32_t forward_node; /* 0: the coordinator's API; else this member's node index: its
                              requests are forwarded to the coordinator (api-fwd.h) */
    uint32_t role;         /* --role: GANG_ROLE_BOTH, _PREFILL or _DECODE (ganglion_role) */
    uint32_t kv_port;      /* --kv-port: a prefill gang exports its prompts' KV blocks (and
                              answers "kv_transfer") when it is not 0 */
} gang_api_config;

/*
 * Hands a request message (engine.h: SUBMIT, PROMPT or CANCEL, with its generation; the
 * API reuses *msg afterwards) on its way to global rank 0: the launcher plugs in the
 * supervisor's channel on the coordinator, an API frame to the coordinator on a member.
 * 0, or an error when it was not taken (the API's sweep sends what is owed again).
 */
typedef int (*gang_api_submit_fn)(void *ctx, const gang_req_msg *msg);

/*
 * Creates the API on uv_loop (cfg is copied); submit(submit_ctx, pkt) carries its packets.
 * Returns 0 and *out, or GANG_ENOMEM.
 */
int gang_api_init(void *uv_loop, const gang_api_config *cfg, gang_api_submit_fn submit,
                  void *submit_ctx, gang_api **out);
/* Answers every request still owed with 503 and releases the API (on the loop thread). */
void gang_api_close(gang_api *api);

/*
 * Serves the request if its path belongs to the API (/v1/..., /tokenize, /detokenize) and
 * returns 1; also answers (1) one of OpenAI's paths without its /v1 (404 naming the /v1
 * path) and any method but GET/HEAD on another path (405); returns 0 for the other GETs.
 * api NULL (an agent without an API: it failed to start) answers 404. A wrong method gets
 * 405, a missing or wrong API key 401 (when one is configured), every error in OpenAI's
 * shape {"error":{"message","type","param","code"}}.
 */
int gang_api_handle(gang_api *api, gang_http_exchange *x, const gang_http_request *req);

/* The gang starts generation gen: submit everything owed to it. */
void gang_api_on_start(gang_api *api, uint64_t gen);
/* Generation gen is aborted: partial outputs are dropped; requests wait for the next START. */
void gang_api_on_abort(gang_api *api, uint64_t gen);
/*
 * The gang gave up for good (restart budget spent): every request still owed, and every
 * request that arrives from now on, is answered 503 at once with the reason.
 */
void gang_api_on_give_up(gang_api *api, const char *reason);
/* Rank 0 reported a token (a TOKEN message) / the end of a request (a DONE message: its
 * generation, cached tokens in index, and the P/D transfer's kv_* fields). */
void gang_api_on_token(gang_api *api, const gang_req_msg *tok);
void gang_api_on_done(gang_api *api, const gang_req_msg *done);
/*
 * A member's forwarded packet for request id was not taken by the coordinator (NACK, the
 * piece at prompt offset index): it and what follows are sent again by the next sweep.
 */
void gang_api_on_nack(gang_api *api, uint64_t gen, uint64_t id, uint32_t index);
/* A member: one forwarded token took this long from rank 0's report to this client. */
void gang_api_observe_relay(gang_api *api, double seconds);

/* Appends the API's metrics (requests, timings histograms, in flight, resubmissions). */
void gang_api_metrics(gang_api *api, gang_metrics_buf *b);

#endif /* GANGLION_SERVE_H */
