/*
 * The router process's shared state (router/router.c: options, replicas, polling, probes
 * and metrics; router/proxy.c: forwarding one call). Everything here lives on the one
 * libuv loop thread, except a replica's poll result, which a thread-pool job fills and the
 * loop reads only in the job's completion callback.
 */
#ifndef GANGLION_ROUTER_INTERNAL_H
#define GANGLION_ROUTER_INTERNAL_H

#include <stdint.h>
#include <uv.h>

#include "ganglion/router.h"
#include "ganglion/serve.h"
#include "ganglion/text.h"

#define ROUTER_HOST_MAX 256

/* The command line of `ganglion router` (its option table is in router.c). */
typedef struct router_opts {
    char replicas[8192];
    char replicas_dns[4096];
    char bind_address[64];
    char policy[16];
    char model[4096];
    int64_t http_port, lru_blocks, load_slack, poll_interval_ms, poll_timeout_ms;
    int64_t connect_timeout_ms, request_timeout_ms, retry_backoff_ms, down_after_fails;
    int64_t max_conns, max_body_bytes, idle_timeout_ms, max_response_bytes, dns_interval_ms;
    int64_t prefill_timeout_ms;
} router_opts;

/* What one poll of a replica found (written by the pool thread, read after it). */
typedef struct router_poll {
    int ok;                 /* /metrics answered 200 */
    int ready;              /* ganglion_ready was 1 */
    uint32_t in_flight;     /* ganglion_requests_in_flight */
    uint64_t prompt_tokens; /* ganglion_prompt_tokens_total */
    uint64_t hit_tokens;    /* ganglion_prefix_cache_hit_tokens_total */
    uint32_t role;          /* ganglion_role (GANG_ROLE_BOTH when absent) */
    uint32_t kv_free;       /* ganglion_kv_cache_blocks_free (UINT32_MAX when absent) */
    char addr[64];          /* the address the name resolved to */
    int err;                /* why it failed: a GANG_E* code */
} router_poll;

typedef struct router router;

typedef struct router_replica {
    router *r;
    uint32_t index;
    char name[ROUTER_HOST_MAX + 8]; /* "host:port" as given, the metrics' label */
    char host[ROUTER_HOST_MAX];
    int port;
    char addr[64]; /* the last resolved IPv4 literal, "" before the first resolution */
    int up;
    int active;     /* a slot in use: always for --replicas, while its address resolves for
                       --replicas-dns */
    int32_t dns;    /* the --replicas-dns entry that found it, -1 for --replicas */
    uint32_t fails; /* consecutive failed polls */
    uint32_t inflight;
    uint32_t reported; /* requests the replica said it holds, last poll */
    uint32_t role;     /* its ganglion_role, last poll (GANG_ROLE_*) */
    uint32_t kv_free;  /* its free KV blocks, last poll (UINT32_MAX: not reported) */
    int polling;
    uv_work_t work;
    router_poll poll;
    uint64_t prompt_tokens, hit_tokens; /* the replica's own counters, last poll */
    uint64_t sent, retried_away, prompt_blocks, matched_blocks, mid_stream_failures;
} router_replica;

typedef struct router_fwd router_fwd;

/* One --replicas-dns entry: a name whose every IPv4 address is a replica (a headless
 * Service), resolved again every --dns-interval-ms on the thread pool. */
#define ROUTER_DNS_MAX_ADDRS GANG_ROUTER_MAX_REPLICAS
#define ROUTER_DNS_MAX_NAMES 16
typedef struct router_dns {
    router *r;
    uint32_t index;
    char host[ROUTER_HOST_MAX];
    int port;
    uv_work_t work;
    int busy;
    int err;         /* of the last resolution: 0 or GANG_ERESOLVE */
    uint32_t naddrs; /* its addresses, last resolution */
    char addrs[ROUTER_DNS_MAX_ADDRS][64];
} router_dns;

struct router {
    router_opts o;
    uv_loop_t *loop;
    gang_http_server *http;
    gang_router_policy *policy;
    gang_tokenizer *tok; /* NULL: prompts are hashed as raw text */
    router_replica *reps;
    uint32_t nreps; /* slots used (active or not); the policy has GANG_ROUTER_MAX_REPLICAS
                       when --replicas-dns is given, else exactly nreps */
    router_dns *dns;
    uint32_t ndns;
    uv_timer_t poll_timer, dns_timer;
    uv_signal_t sigint, sigterm;
    int stopping;
    router_fwd *fwds; /* the calls being forwarded (a list, for the down sweep) */
    uint64_t decisions[GANG_ROUTER_R_COUNT];
    uint64_t accepted, retries, no_replica, stream_errors, answered;
    uint64_t stream_resumes; /* streams continued on another replica after a failure */
    /* Disaggregated prefill/decode (proxy.c): calls whose prefill went to a prefill
     * replica, of those the ones whose prefill failed or passed --prefill-timeout-ms (the
     * decode replica prefilled them itself), and P/D calls sent straight to a decode
     * replica because no prefill replica was eligible; the prefill phase's durations. */
    uint64_t pd_prefills, pd_prefill_failed, pd_prefill_skipped;
    uint64_t pd_kv_handovers; /* decode phases sent with the prefill's kv_transfer */
    gang_histogram h_prefill;
};

/* A streamed call's relay (router/stream.c): what the client has of choice 0, and the
 * state of the current attempt's events. */
#define ROUTER_MAX_RESUMES 3u /* replicas a stream may continue on after the first */
typedef struct router_stream {
    char *buf; /* the current attempt's bytes not yet a whole event */
    size_t len, cap;
    int32_t *toks; /* the tokens the client has */
    uint32_t n_toks, cap_toks;
    char *text; /* the text the client has */
    size_t text_len, text_cap;
    uint32_t a_toks; /* this attempt: tokens and text bytes seen (a resumed one: checked) */
    size_t a_text;
    int resumed;   /* the current attempt continues the stream of a failed one */
    int untracked; /* a chunk this file cannot follow was relayed: not resumable */
    uint32_t resumes;
    char id[128]; /* the first chunk's id, which a resumed stream keeps */
} router_stream;

/* Sends len bytes to the client: 0, or nonzero when it is gone. */
typedef int (*router_stream_out)(void *ctx, const char *bytes, size_t len);
/* Feeds len bytes of the current attempt's stream: every whole event is relayed through
 * out (a resumed attempt's cut down to what the client does not have yet, or dropped). 0,
 * out's error, GANG_EMISMATCH (a resumed attempt is not the same text), GANG_ERANGE (an
 * event over max bytes) or GANG_ENOMEM. */
int gang__router_stream_feed(router_stream *s, const char *at, size_t len, size_t max,
                             router_stream_out out, void *ctx);
/* The replica of a started stream failed: 1 when the call may go on elsewhere (the next
 * attempt's stream is then checked and spliced), 0 when it cannot be followed or was
 * resumed ROUTER_MAX_RESUMES times already. */
int gang__router_stream_resume(router_stream *s);
void gang__router_stream_free(router_stream *s);

/* Starts forwarding the call (method, path, body) of x (router/proxy.c): picks a replica
 * for its prompt, and answers x exactly once whatever happens. Loop thread. */
void gang__router_forward(router *r, gang_http_exchange *x, const gang_http_request *req,
                          int hashed);
/* Replica i went down: the calls sent there are sent elsewhere (their connection to it is
 * closed first; a started stream resumes, stream.c). Loop thread. */
void gang__router_replica_down(router *r, uint32_t i);
/* Marks replica i up or down (why: for the log); going down moves its unsent calls. */
void gang__router_set_up(router *r, uint32_t i, int up, const char *why);
/* Hands replica i's load (its report, the calls in flight there) to the policy. */
void gang__router_load_changed(router *r, uint32_t i);
/* Parses --replicas-dns into r->dns (0, or GANG_EUSAGE after printing why; cmd: for the
 * message). router/discover.c. */
int gang__router_dns_parse(router *r, const gang_opt_cmd *cmd);
/* Starts resolving every --replicas-dns entry now and every --dns-interval-ms. */
void gang__router_dns_start(router *r);
void gang__router_dns_stop(router *r);
/* Closes every call still being forwarded (answered 503) at shutdown. */
void gang__router_forward_close_all(router *r);

#endif
