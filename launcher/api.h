/*
 * The inference API of the coordinator's agent (internal to launcher/): POST
 * /v1/completions, GET /v1/models, the table of accepted requests, and what makes "nothing lost"
 * true.
 *
 * A request the API accepted is owned by this table until it is answered: with its
 * tokens (200), with an explicit error at its deadline (504), or with 400 when the gang
 * refuses it as invalid. Requests are handed to global rank 0 (local rank 0 of this
 * node) with SUBMIT for the generation that is starting or serving; when that
 * generation is aborted every request still owed loses its partial output and is
 * submitted again, from its prompt, after the next START. Seeded sampling depends only on
 * (seed, position), so a re-run produces the same tokens.
 *
 * Everything runs on the agent's libuv loop thread.
 */
#ifndef GANGLION_LAUNCHER_API_H
#define GANGLION_LAUNCHER_API_H

#include <stdint.h>

#include "ganglion/common.h"
#include "ganglion/model.h"
#include "http.h"
#include "metrics.h"
#include "supervisor.h"

typedef struct gang_api gang_api;

/* What the API needs; filled by gang_agent_config_from_params (layout.c). */
typedef struct gang_api_config {
    char model[GANG_PARAM_STR_MAX]; /* the model's name in responses ("" = none) */
    int has_model;                  /* 0: every completion is answered 503 */
    gang_model_config mc;           /* the served model's configuration (with a model) */
    uint32_t ctx;                   /* the context length requests must fit in */
    uint32_t max_queue;             /* requests owed at once; more get 503 */
    uint64_t request_timeout_ms;    /* deadline of one request, across restarts */
} gang_api_config;

/* Creates the API on uv_loop (cfg is copied). Returns 0 and *out, or GANG_ENOMEM. */
int gang_api_init(void *uv_loop, const gang_api_config *cfg, gang_sup *sup, gang_api **out);
/* Answers every request still owed with 503 and releases the API (on the loop thread). */
void gang_api_close(gang_api *api);

/* Handles POST /v1/completions (the caller routes the path). */
void gang_api_completions(gang_api *api, gang_http_exchange *x, const gang_http_request *req);
/*
 * Handles GET /v1/models (the caller routes the path and the method): 200 with OpenAI's
 * list of the one served model {"object":"list","data":[{"id":cfg.model,"object":"model",
 * "created":<unix seconds of gang_api_init>,"owned_by":"ganglion","max_model_len":ctx}]},
 * or 503 with a JSON error when the gang serves no model, as completions do.
 */
void gang_api_models(gang_api *api, gang_http_exchange *x);

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
void gang_api_on_token(gang_api *api, uint64_t gen, uint64_t id, uint32_t index, int32_t token);
void gang_api_on_done(gang_api *api, uint64_t gen, uint64_t id, int32_t code, const char *finish,
                      const char *reason);

/* Appends the API's metrics (requests, timings histograms, in flight, resubmissions). */
void gang_api_metrics(gang_api *api, gang_metrics_buf *b);

#endif
