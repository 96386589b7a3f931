/*
 * The OpenAI-compatible inference API of every agent (internal to launcher/):
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
#ifndef GANGLION_LAUNCHER_API_H
#define GANGLION_LAUNCHER_API_H

#include <stdint.h>

#include "ganglion/common.h"
#include "ganglion/engine.h"
#include "http.h"
#include "metrics.h"
#include "wctl.h"

typedef struct gang_api gang_api;

#define GANG_API_KEY_MAX 256 /* bytes of an API key (--api-key-file) */

/* What the API needs; filled by gang_agent_config_from_params (layout.c). */
typedef struct gang_api_config {
    char model[GANG_PARAM_STR_MAX];     /* the model's name in responses ("" = none) */
    int has_model;                      /* 0: every completion is answered 503 */
    gang_model_config mc;               /* the served model's configuration (with a model) */
    uint32_t ctx;                       /* the context length requests must fit in */
    uint32_t max_queue;                 /* requests owed at once; more get 503 */
    uint64_t request_timeout_ms;        /* deadline of one request, across restarts */
    char model_dir[GANG_PARAM_STR_MAX]; /* tokenizer.json, tokenizer_config.json ("" = none) */
    char api_key[GANG_API_KEY_MAX + 1]; /* Bearer token the API requires ("" = open) */
    uint32_t forward_node; /* 0: the coordinator's API; else this member's node index: its
                              requests are forwarded to the coordinator (api-fwd.h) */
} gang_api_config;

/*
 * Hands an engine packet (SUBMIT, PROMPT or CANCEL; the API reuses *pkt afterwards) on
 * its way to global rank 0: the supervisor's channel on the coordinator, an API frame to
 * the coordinator on a member. 0, or an error when it was not taken (the API's sweep
 * sends what is owed again).
 */
typedef int (*gang_api_submit_fn)(void *ctx, gang_wctl *pkt);

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
 * returns 1; returns 0 for any other path. api NULL (an agent without an API: it failed to
 * start) answers 404. A wrong method gets 405, a missing or wrong
 * API key 401 (when one is configured), every error in OpenAI's shape
 * {"error":{"message","type","code"}}.
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
/* Rank 0 reported a token / the end of a request (supervisor callbacks). */
void gang_api_on_token(gang_api *api, const gang_wctl *tok);
void gang_api_on_done(gang_api *api, uint64_t gen, uint64_t id, int32_t code, uint32_t cached,
                      const char *finish, const char *reason);
/*
 * A member's forwarded packet for request id was not taken by the coordinator (NACK, the
 * piece at prompt offset index): it and what follows are sent again by the next sweep.
 */
void gang_api_on_nack(gang_api *api, uint64_t gen, uint64_t id, uint32_t index);
/* A member: one forwarded token took this long from rank 0's report to this client. */
void gang_api_observe_relay(gang_api *api, double seconds);

/* Appends the API's metrics (requests, timings histograms, in flight, resubmissions). */
void gang_api_metrics(gang_api *api, gang_metrics_buf *b);

#endif
