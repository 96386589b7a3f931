/*
 * POST /v1/completions, GET /v1/models and the table of accepted requests. See api.h for the
 * contract.
 *
 * Request states:
 *   owed, not sent in the current generation (sent_gen != gen): submitted by the next
 *     sweep (every API_SWEEP_MS) or right after START; a SUBMIT that does not fit in the
 *     control channel now is simply tried again by the next sweep;
 *   sent in generation gen: tokens arrive in order (index == tokens so far; anything else
 *     is a stale or duplicated report and is ignored), DONE answers the client;
 *   past its deadline: answered 504 with an explicit error, whatever the gang does.
 * An ABORT of the generation resets every owed request's output and its sent_gen, so it
 * is run again from its prompt: a generation's partial output is never mixed with the
 * next one's.
 *
 * Timings in the response (and the histograms): queue = accepted -> submitted in the
 * generation that answered; prefill = submitted -> first token (includes waiting for a KV
 * slot inside the engine); decode tokens/s = (tokens - 1) / (last token - first token).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <uv.h>

#include <cjson/cJSON.h>

#include "api.h"
#include "wctl.h"

#define API_SWEEP_MS 50

typedef struct api_req {
    struct api_req *next;
    uint64_t id;
    gang_http_exchange *x;
    int32_t prompt[GANG_WCTL_MAX_PROMPT];
    uint32_t n_prompt;
    uint32_t max_tokens;
    int32_t stop[GANG_MAX_STOP_TOKENS];
    uint32_t n_stop;
    gang_sampling sampling;
    int32_t *out; /* [max_tokens] */
    uint32_t n_out;
    uint64_t sent_gen;    /* generation it was submitted in, 0 = owed */
    uint32_t submissions; /* generations it was submitted to */
    uint64_t accepted_ms, sent_ms, first_ms, last_ms, deadline_ms;
} api_req;

struct gang_api {
    uv_loop_t *loop;
    gang_api_config cfg; /* model, context, queue bound, deadline (layout.c) */
    gang_sup *sup;
    int64_t created_s;             /* unix seconds of gang_api_init (GET /v1/models) */
    uint64_t gen;                  /* generation started and not aborted, 0 = none */
    char gave_up[GANG_REASON_MAX]; /* non-empty once the gang gave up for good */
    uint64_t next_id;
    api_req *reqs;
    uint32_t n_reqs;
    uv_timer_t sweep;
    gang_wctl pkt;        /* SUBMIT scratch */
    uint64_t answered[4]; /* 200, 400, 503, 504 */
    uint64_t resubmits;
    uint64_t cancels; /* requests cancelled in the gang at their deadline */
    gang_histogram h_queue, h_prefill, h_tps, h_total;
};

static void reply_json(gang_http_exchange *x, int status, cJSON *o)
{
    char *text = o ? cJSON_PrintUnformatted(o) : NULL;
    if (text == NULL) {
        gang_http_reply(x, 500, "application/json", "{\"error\":\"out of memory\"}", 25);
    } else {
        gang_http_reply(x, status, "application/json", text, strlen(text));
        cJSON_free(text);
    }
    cJSON_Delete(o);
}

/* An error answer in the OpenAI style: {"error":{"message":..,"type":..,"code":status}}. */
static void reply_error_text(gang_http_exchange *x, int status, const char *type, const char *msg)
{
    cJSON *o = cJSON_CreateObject();
    cJSON *e = cJSON_AddObjectToObject(o, "error");
    cJSON_AddStringToObject(e, "message", msg);
    cJSON_AddStringToObject(e, "type", type);
    cJSON_AddNumberToObject(e, "code", status);
    reply_json(x, status, o);
}

/* reply_error_text with a printf message, counted in the completions' answers by status. */
static void reply_error(gang_api *api, gang_http_exchange *x, int status, const char *type,
                        const char *fmt, ...) __attribute__((format(printf, 5, 6)));
static void reply_error(gang_api *api, gang_http_exchange *x, int status, const char *type,
                        const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    if (status == 400)
        api->answered[1]++;
    else if (status == 503)
        api->answered[2]++;
    else if (status == 504)
        api->answered[3]++;
    reply_error_text(x, status, type, msg);
}

static void req_unlink_free(gang_api *api, api_req *r)
{
    for (api_req **pp = &api->reqs; *pp; pp = &(*pp)->next) {
        if (*pp == r) {
            *pp = r->next;
            api->n_reqs--;
            break;
        }
    }
    free(r->out);
    free(r);
}

static api_req *req_find(gang_api *api, uint64_t id)
{
    for (api_req *r = api->reqs; r; r = r->next)
        if (r->id == id)
            return r;
    return NULL;
}

/* Sends r to rank 0 for the current generation; leaves it owed when that fails. */
static void req_submit(gang_api *api, api_req *r)
{
    if (api->gen == 0 || r->sent_gen == api->gen)
        return;
    gang_wctl *m = &api->pkt;
    memset(m, 0, sizeof(*m));
    m->type = GANG_WCTL_SUBMIT;
    m->generation = api->gen;
    m->req_id = r->id;
    m->blob_len = r->n_prompt * 4;
    memcpy(m->blob, r->prompt, m->blob_len);
    m->max_tokens = r->max_tokens;
    m->temperature = r->sampling.temperature;
    m->top_k = r->sampling.top_k;
    m->top_p = r->sampling.top_p;
    m->seed = r->sampling.seed;
    m->n_stop = r->n_stop;
    memcpy(m->stop, r->stop, sizeof(m->stop));
    if (gang_sup_submit(api->sup, m) != 0)
        return; /* channel full or rank 0 down: the sweep tries again */
    if (r->submissions > 0)
        api->resubmits++;
    r->submissions++;
    r->sent_gen = api->gen;
    r->sent_ms = gang_now_ms();
    r->n_out = 0;
}

static void on_sweep(uv_timer_t *t)
{
    gang_api *api = t->data;
    uint64_t now = gang_now_ms();
    api_req *r = api->reqs;
    while (r != NULL) {
        api_req *next = r->next;
        if (now >= r->deadline_ms) {
            if (api->gen != 0 && r->sent_gen == api->gen) {
                /* Stop the gang working for nobody: its KV slot goes to the others. */
                gang_wctl *m = &api->pkt;
                memset(m, 0, sizeof(*m));
                m->type = GANG_WCTL_CANCEL;
                m->generation = api->gen;
                m->req_id = r->id;
                (void)gang_sup_submit(api->sup, m); /* lost only with rank 0's channel */
                api->cancels++;
            }
            reply_error(api, r->x, 504, "timeout",
                        "request %llu: deadline of %llu ms passed with %u of %u tokens "
                        "(submitted to %u generation(s) of the gang)",
                        (unsigned long long)r->id, (unsigned long long)api->cfg.request_timeout_ms,
                        r->n_out, r->max_tokens, r->submissions);
            req_unlink_free(api, r);
        } else {
            req_submit(api, r);
        }
        r = next;
    }
}

int gang_api_init(void *uv_loop, const gang_api_config *cfg, gang_sup *sup, gang_api **out)
{
    static const double secs[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                  0.5,   1,      2.5,   5,    10,    30,   60,  120};
    static const double tps[] = {1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000};
    *out = NULL;
    gang_api *api = calloc(1, sizeof(*api));
    if (api == NULL)
        return GANG_ENOMEM;
    api->loop = uv_loop;
    api->cfg = *cfg;
    api->sup = sup;
    api->created_s = (int64_t)time(NULL);
    api->next_id = 1;
    gang_histogram_init(&api->h_queue, secs, sizeof(secs) / sizeof(secs[0]));
    gang_histogram_init(&api->h_prefill, secs, sizeof(secs) / sizeof(secs[0]));
    gang_histogram_init(&api->h_total, secs, sizeof(secs) / sizeof(secs[0]));
    gang_histogram_init(&api->h_tps, tps, sizeof(tps) / sizeof(tps[0]));
    uv_timer_init(api->loop, &api->sweep);
    api->sweep.data = api;
    uv_timer_start(&api->sweep, on_sweep, API_SWEEP_MS, API_SWEEP_MS);
    *out = api;
    return 0;
}

static void api_closed(uv_handle_t *h)
{
    free(h->data);
}

void gang_api_close(gang_api *api)
{
    if (api == NULL)
        return;
    while (api->reqs != NULL) {
        reply_error(api, api->reqs->x, 503, "unavailable", "the server is stopping");
        req_unlink_free(api, api->reqs);
    }
    uv_timer_stop(&api->sweep);
    uv_close((uv_handle_t *)&api->sweep, api_closed);
}

/* Reads an optional integer field in [lo, hi]; 0 when absent, -1 (message) when bad. */
static int get_int(const cJSON *o, const char *name, double lo, double hi, double *v, char *err,
                   size_t cap)
{
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(o, name);
    if (f == NULL || cJSON_IsNull(f))
        return 0;
    if (!cJSON_IsNumber(f) || f->valuedouble != floor(f->valuedouble) || f->valuedouble < lo ||
        f->valuedouble > hi) {
        snprintf(err, cap, "'%s' must be an integer in [%.0f, %.0f]", name, lo, hi);
        return -1;
    }
    *v = f->valuedouble;
    return 1;
}

/* Reads an optional number field in [lo, hi]; 0 when absent, -1 (message) when bad. */
static int get_num(const cJSON *o, const char *name, double lo, double hi, double *v, char *err,
                   size_t cap)
{
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(o, name);
    if (f == NULL || cJSON_IsNull(f))
        return 0;
    if (!cJSON_IsNumber(f) || !isfinite(f->valuedouble) || f->valuedouble < lo ||
        f->valuedouble > hi) {
        snprintf(err, cap, "'%s' must be a number in [%g, %g]", name, lo, hi);
        return -1;
    }
    *v = f->valuedouble;
    return 1;
}

/* Reads an array of token ids into ids[cap]; 0 and *n, or -1 with a message. */
static int get_ids(const cJSON *o, const char *name, uint32_t vocab, int32_t *ids, uint32_t cap,
                   uint32_t *n, char *err, size_t errcap)
{
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(o, name);
    *n = 0;
    if (a == NULL || cJSON_IsNull(a))
        return 0;
    if (!cJSON_IsArray(a)) {
        snprintf(err, errcap, "'%s' must be an array of token ids", name);
        return -1;
    }
    const cJSON *e;
    cJSON_ArrayForEach(e, a)
    {
        if (*n >= cap) {
            snprintf(err, errcap, "'%s' has more than %u token ids", name, cap);
            return -1;
        }
        if (!cJSON_IsNumber(e) || e->valuedouble != floor(e->valuedouble) || e->valuedouble < 0 ||
            e->valuedouble >= (double)vocab) {
            snprintf(err, errcap, "'%s'[%u] is not a token id in [0, %u)", name, *n, vocab);
            return -1;
        }
        ids[(*n)++] = (int32_t)e->valuedouble;
    }
    return 0;
}

/*
 * Validates a completion request into r. Returns 0, or -1 with a message for a 400: not
 * a JSON object, prompt missing / not an array of ids / empty / longer than the context,
 * max_tokens not a positive integer or too large for the context, bad sampling fields.
 */
static int parse_request(gang_api *api, const gang_http_request *req, api_req *r, char *err,
                         size_t cap)
{
    cJSON *o = cJSON_ParseWithLength(req->body, req->body_len);
    int rc = -1;
    double v;
    if (o == NULL || !cJSON_IsObject(o)) {
        snprintf(err, cap, "the body must be a JSON object");
        goto out;
    }
    if (cJSON_GetObjectItemCaseSensitive(o, "prompt") == NULL) {
        snprintf(err, cap, "'prompt' (an array of token ids) is required");
        goto out;
    }
    if (get_ids(o, "prompt", api->cfg.mc.vocab, r->prompt, GANG_WCTL_MAX_PROMPT, &r->n_prompt, err,
                cap) != 0)
        goto out;
    if (r->n_prompt == 0) {
        snprintf(err, cap, "'prompt' is empty");
        goto out;
    }
    if (r->n_prompt >= api->cfg.ctx) {
        snprintf(err, cap, "the prompt has %u tokens; the context holds %u", r->n_prompt,
                 api->cfg.ctx);
        goto out;
    }
    r->max_tokens = 16;
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(o, "max_tokens");
    if (mt != NULL && !cJSON_IsNull(mt) &&
        (!cJSON_IsNumber(mt) || mt->valuedouble != floor(mt->valuedouble))) {
        snprintf(err, cap, "'max_tokens' must be an integer");
        goto out;
    }
    int g = mt != NULL && !cJSON_IsNull(mt);
    if (g) {
        v = mt->valuedouble;
        if (v <= 0) {
            snprintf(err, cap, "'max_tokens' must be at least 1");
            goto out;
        }
        if (v > api->cfg.ctx - r->n_prompt) {
            snprintf(err, cap, "prompt (%u) + max_tokens (%.0f) exceed the context of %u",
                     r->n_prompt, v, api->cfg.ctx);
            goto out;
        }
        r->max_tokens = (uint32_t)v;
    } else if (r->max_tokens > api->cfg.ctx - r->n_prompt) {
        r->max_tokens = api->cfg.ctx - r->n_prompt;
    }
    r->sampling.top_p = 1.0f;
    if ((g = get_num(o, "temperature", 0, 100, &v, err, cap)) < 0)
        goto out;
    if (g > 0)
        r->sampling.temperature = (float)v;
    if ((g = get_int(o, "top_k", 0, api->cfg.mc.vocab, &v, err, cap)) < 0)
        goto out;
    if (g > 0)
        r->sampling.top_k = (uint32_t)v;
    if ((g = get_num(o, "top_p", 1e-6, 1, &v, err, cap)) < 0)
        goto out;
    if (g > 0)
        r->sampling.top_p = (float)v;
    if ((g = get_int(o, "seed", 0, 9007199254740991.0, &v, err, cap)) < 0)
        goto out;
    if (g > 0)
        r->sampling.seed = (uint64_t)v;
    if (get_ids(o, "stop", api->cfg.mc.vocab, r->stop, GANG_MAX_STOP_TOKENS, &r->n_stop, err,
                cap) != 0)
        goto out;
    rc = 0;
out:
    cJSON_Delete(o);
    return rc;
}

void gang_api_completions(gang_api *api, gang_http_exchange *x, const gang_http_request *req)
{
    char err[256];
    if (!api->cfg.has_model) {
        reply_error(api, x, 503, "unavailable",
                    "this gang serves no model (start it with serve --model DIR)");
        return;
    }
    if (api->gave_up[0]) {
        reply_error(api, x, 503, "unavailable", "the gang gave up: %s", api->gave_up);
        return;
    }
    if (api->n_reqs >= api->cfg.max_queue) {
        reply_error(api, x, 503, "overloaded", "%u requests are already waiting (--max-queue)",
                    api->n_reqs);
        return;
    }
    api_req *r = calloc(1, sizeof(*r));
    if (r == NULL) {
        reply_error(api, x, 503, "overloaded", "out of memory");
        return;
    }
    if (parse_request(api, req, r, err, sizeof(err)) != 0) {
        free(r);
        reply_error(api, x, 400, "invalid_request_error", "%s", err);
        return;
    }
    r->out = calloc(r->max_tokens, sizeof(int32_t));
    if (r->out == NULL) {
        free(r);
        reply_error(api, x, 503, "overloaded", "out of memory");
        return;
    }
    r->id = api->next_id++;
    r->x = x;
    r->accepted_ms = gang_now_ms();
    r->deadline_ms = r->accepted_ms + api->cfg.request_timeout_ms;
    r->next = api->reqs;
    api->reqs = r;
    api->n_reqs++;
    req_submit(api, r);
}

void gang_api_models(gang_api *api, gang_http_exchange *x)
{
    if (!api->cfg.has_model) { /* not a completion: not counted in ganglion_requests_total */
        reply_error_text(x, 503, "unavailable",
                         "this gang serves no model (start it with serve --model DIR)");
        return;
    }
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "object", "list");
    cJSON *data = cJSON_AddArrayToObject(o, "data");
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "id", api->cfg.model);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", (double)api->created_s);
    cJSON_AddStringToObject(m, "owned_by", "ganglion");
    cJSON_AddNumberToObject(m, "max_model_len", api->cfg.ctx);
    cJSON_AddItemToArray(data, m);
    reply_json(x, 200, o);
}

void gang_api_on_start(gang_api *api, uint64_t gen)
{
    api->gen = gen;
    for (api_req *r = api->reqs; r; r = r->next)
        req_submit(api, r);
}

void gang_api_on_abort(gang_api *api, uint64_t gen)
{
    (void)gen;
    api->gen = 0;
    for (api_req *r = api->reqs; r; r = r->next) {
        r->sent_gen = 0;
        r->n_out = 0;
    }
}

void gang_api_on_give_up(gang_api *api, const char *reason)
{
    api->gen = 0;
    gang_strlcpy(api->gave_up, reason[0] ? reason : "restart budget spent", sizeof(api->gave_up));
    while (api->reqs != NULL) {
        reply_error(api, api->reqs->x, 503, "unavailable", "request %llu: the gang gave up: %s",
                    (unsigned long long)api->reqs->id, api->gave_up);
        req_unlink_free(api, api->reqs);
    }
}

void gang_api_on_token(gang_api *api, uint64_t gen, uint64_t id, uint32_t index, int32_t token)
{
    api_req *r = req_find(api, id);
    if (r == NULL || r->sent_gen != gen || gen != api->gen || index != r->n_out ||
        r->n_out >= r->max_tokens)
        return;
    uint64_t now = gang_now_ms();
    if (r->n_out == 0)
        r->first_ms = now;
    r->last_ms = now;
    r->out[r->n_out++] = token;
}

/* The 200 answer: tokens, finish reason, usage and timings. */
static void reply_done(gang_api *api, api_req *r, const char *finish)
{
    uint64_t now = gang_now_ms();
    double queue_s = (double)(r->sent_ms - r->accepted_ms) / 1000.0;
    double prefill_s = r->n_out > 0 ? (double)(r->first_ms - r->sent_ms) / 1000.0 : 0;
    double decode_s = r->n_out > 1 ? (double)(r->last_ms - r->first_ms) / 1000.0 : 0;
    double tps = decode_s > 0 ? (double)(r->n_out - 1) / decode_s : 0;
    double total_s = (double)(now - r->accepted_ms) / 1000.0;
    gang_histogram_observe(&api->h_queue, queue_s);
    gang_histogram_observe(&api->h_prefill, prefill_s);
    gang_histogram_observe(&api->h_total, total_s);
    if (tps > 0)
        gang_histogram_observe(&api->h_tps, tps);
    api->answered[0]++;

    char idbuf[40];
    snprintf(idbuf, sizeof(idbuf), "cmpl-%llu", (unsigned long long)r->id);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", idbuf);
    cJSON_AddStringToObject(o, "object", "text_completion");
    cJSON_AddStringToObject(o, "model", api->cfg.model);
    cJSON *choices = cJSON_AddArrayToObject(o, "choices");
    cJSON *c = cJSON_CreateObject();
    cJSON_AddNumberToObject(c, "index", 0);
    cJSON *toks = cJSON_AddArrayToObject(c, "tokens");
    for (uint32_t i = 0; i < r->n_out; i++)
        cJSON_AddItemToArray(toks, cJSON_CreateNumber(r->out[i]));
    cJSON_AddStringToObject(c, "finish_reason", finish);
    cJSON_AddItemToArray(choices, c);
    cJSON *u = cJSON_AddObjectToObject(o, "usage");
    cJSON_AddNumberToObject(u, "prompt_tokens", r->n_prompt);
    cJSON_AddNumberToObject(u, "completion_tokens", r->n_out);
    cJSON_AddNumberToObject(u, "total_tokens", r->n_prompt + r->n_out);
    cJSON *t = cJSON_AddObjectToObject(o, "timings");
    cJSON_AddNumberToObject(t, "queue_ms", queue_s * 1000);
    cJSON_AddNumberToObject(t, "prefill_ms", prefill_s * 1000);
    cJSON_AddNumberToObject(t, "decode_tokens_per_s", tps);
    cJSON_AddNumberToObject(t, "total_ms", total_s * 1000);
    cJSON_AddNumberToObject(t, "generations", r->submissions);
    reply_json(r->x, 200, o);
}

void gang_api_on_done(gang_api *api, uint64_t gen, uint64_t id, int32_t code, const char *finish,
                      const char *reason)
{
    api_req *r = req_find(api, id);
    if (r == NULL || r->sent_gen != gen || gen != api->gen)
        return;
    if (code == GANG_EINVAL) {
        reply_error(api, r->x, 400, "invalid_request_error", "%s", reason);
    } else if (code < 0) {
        reply_error(api, r->x, 503, "unavailable", "request %llu: %s (%s)", (unsigned long long)id,
                    reason, gang_err_name(code));
    } else {
        reply_done(api, r, finish[0] ? finish : "length");
    }
    req_unlink_free(api, r);
}

void gang_api_metrics(gang_api *api, gang_metrics_buf *b)
{
    static const char *const codes[] = {"200", "400", "503", "504"};
    gang_metrics_family(b, "ganglion_requests_total", GANG_METRIC_COUNTER,
                        "Completion requests answered, by HTTP status");
    for (size_t i = 0; i < 4; i++) {
        gang_metric_label l = {.name = "code", .value = codes[i]};
        gang_metrics_sample_u64(b, "ganglion_requests_total", &l, 1, api->answered[i]);
    }
    gang_metrics_family(b, "ganglion_requests_in_flight", GANG_METRIC_GAUGE,
                        "Completion requests accepted and not answered yet");
    gang_metrics_sample_u64(b, "ganglion_requests_in_flight", NULL, 0, api->n_reqs);
    gang_metrics_family(b, "ganglion_request_resubmits_total", GANG_METRIC_COUNTER,
                        "Requests run again from their prompt after a gang restart");
    gang_metrics_sample_u64(b, "ganglion_request_resubmits_total", NULL, 0, api->resubmits);
    gang_metrics_family(b, "ganglion_request_cancels_total", GANG_METRIC_COUNTER,
                        "Requests cancelled in the gang when their deadline passed");
    gang_metrics_sample_u64(b, "ganglion_request_cancels_total", NULL, 0, api->cancels);
    struct {
        const char *name, *help;
        const gang_histogram *h;
    } hs[] = {
        {"ganglion_request_queue_seconds", "Accepted to submitted in the answering generation",
         &api->h_queue},
        {"ganglion_request_prefill_seconds", "Submitted to first token", &api->h_prefill},
        {"ganglion_request_decode_tokens_per_second", "Decode rate after the first token",
         &api->h_tps},
        {"ganglion_request_seconds", "Accepted to answered", &api->h_total},
    };
    for (size_t i = 0; i < sizeof(hs) / sizeof(hs[0]); i++) {
        gang_metrics_family(b, hs[i].name, GANG_METRIC_HISTOGRAM, hs[i].help);
        gang_histogram_render(b, hs[i].name, NULL, 0, hs[i].h);
    }
}
