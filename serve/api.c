/*
 * The table of accepted calls, their submission to rank 0, generations, token and done
 * reports, deadlines, metrics and routing. See ganglion/serve.h for the contract and
 * api-internal.h for how the files share the work.
 *
 * Sequence states:
 *   owed, not sent in the current generation (sent_gen != gen): submitted by the next
 *     sweep (every API_SWEEP_MS) or right after START. A prompt longer than one packet
 *     goes as SUBMIT plus PROMPT pieces; a piece the channel cannot take now is sent by
 *     the next sweep (parts counts what rank 0 has), the channel keeps their order;
 *   sent in generation gen: tokens arrive in order (index == n_gen; anything else is a
 *     stale or duplicated report and is ignored); an index below n_out is a re-run of a
 *     token the client has, checked, not sent again; DONE finishes it;
 *   past the call's deadline: the call is answered 504 (or its stream ends with an error
 *     event) and its sequences are cancelled in the gang.
 * An ABORT of the generation resets every owed sequence's sent_gen and n_gen, so it runs
 * again from its prompt: a generation's partial output is never mixed with the next one's.
 *
 * Timings (histograms and the non-streamed answer): queue = accepted -> submitted in the
 * generation that answered; prefill = submitted -> first token; time to first token =
 * accepted -> first token; inter-token = between consecutive tokens; decode tokens/s =
 * (tokens - 1) / (last token - first token).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <uv.h>

#include <sodium.h>

#include "api-internal.h"

void gang__api_json(gang_http_exchange *x, int status, cJSON *o)
{
    char *text = o ? cJSON_PrintUnformatted(o) : NULL;
    if (text == NULL) {
        const char *b = "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\","
                        "\"param\":null,\"code\":null}}";
        gang_http_reply(x, 500, "application/json", b, strlen(b));
    } else {
        gang_http_reply(x, status, "application/json", text, strlen(text));
        cJSON_free(text);
    }
    cJSON_Delete(o);
}

/*
 * The request field a 400's message names first ('field' or 'field.sub' / 'field'[i]:
 * the field), written into param (cap bytes); "" when it names none.
 */
static void error_param(const char *msg, char *param, size_t cap)
{
    size_t n = 0;
    param[0] = '\0';
    if (msg[0] != '\'')
        return;
    while (msg[1 + n] != '\0' && strchr("'.[", msg[1 + n]) == NULL && n + 1 < cap)
        n++;
    memcpy(param, msg + 1, n);
    param[n] = '\0';
}

cJSON *gang__api_error_object(int status, const char *code, const char *msg)
{
    char param[64];
    cJSON *o = cJSON_CreateObject();
    cJSON *e = cJSON_AddObjectToObject(o, "error");
    cJSON_AddStringToObject(e, "message", msg);
    cJSON_AddStringToObject(e, "type", status < 500 ? "invalid_request_error" : "server_error");
    error_param(msg, param, sizeof(param));
    if (status == 400 && param[0] != '\0')
        cJSON_AddStringToObject(e, "param", param);
    else
        cJSON_AddNullToObject(e, "param");
    if (code == NULL || strcmp(code, "invalid_request_error") == 0)
        cJSON_AddNullToObject(e, "code");
    else
        cJSON_AddStringToObject(e, "code", code);
    return o;
}

static void count_status(gang_api *api, int status)
{
    static const int codes[] = {200, 400, 401, 404, 503, 504};
    for (size_t i = 0; api != NULL && i < sizeof(codes) / sizeof(codes[0]); i++)
        if (codes[i] == status)
            api->answered[i]++;
}

void gang__api_error(gang_api *api, gang_http_exchange *x, int status, const char *type,
                     const char *fmt, ...)
{
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    count_status(api, status);
    gang__api_json(x, status, gang__api_error_object(status, type, msg));
}

/* ------------------------------------------------------------------ the table */

static api_seq *seq_find(gang_api *api, uint64_t id)
{
    for (api_seq *s = api->seqs; s; s = s->next)
        if (s->id == id)
            return s;
    return NULL;
}

static void seq_free(api_seq *s)
{
    if (s == NULL)
        return;
    free(s->prompt);
    free(s->echo);
    free(s->out);
    free(s->lp);
    free(s->text);
    free(s);
}

/* Unlinks c and its sequences from the API and frees them (c is answered). */
static void call_free(gang_api *api, api_call *c)
{
    for (api_call **pp = &api->calls; *pp; pp = &(*pp)->next) {
        if (*pp == c) {
            *pp = c->next;
            api->n_calls--;
            break;
        }
    }
    for (uint32_t i = 0; i < c->n_seqs; i++) {
        for (api_seq **pp = &api->seqs; *pp; pp = &(*pp)->next) {
            if (*pp == c->seqs[i]) {
                *pp = c->seqs[i]->next;
                break;
            }
        }
        seq_free(c->seqs[i]);
    }
    free(c->seqs);
    free(c->p.grammar);
    cJSON_free(c->p.tools_json);
    free(c);
}

void gang__api_cancel_in_gang(gang_api *api, api_seq *s)
{
    if (api->gen == 0 || s->sent_gen != api->gen || s->gang_done)
        return;
    gang_req_msg *m = &api->pkt;
    memset(m, 0, sizeof(*m));
    m->kind = GANG_REQ_CANCEL;
    m->generation = api->gen;
    m->id = s->id;
    (void)api->submit(api->submit_ctx, m); /* lost only with rank 0's channel */
    api->cancels++;
}

/* Ends c with an error (every sequence cancelled in the gang) and frees it. */
static void call_fail_free(gang_api *api, api_call *c, int status, const char *type,
                           const char *msg)
{
    for (uint32_t i = 0; i < c->n_seqs; i++)
        gang__api_cancel_in_gang(api, c->seqs[i]);
    count_status(api, status);
    if (api->cfg.forward_node != 0 && status >= 500)
        api->lost++;
    gang__api_call_fail(api, c, status, type, msg);
    call_free(api, c);
}

/*
 * The client of c went away (a stream write failed): its sequences are cancelled in the
 * gang, the exchange is ended and c freed. Returns 1 when that happened.
 */
static int call_drop_if_gone(gang_api *api, api_call *c)
{
    if (!c->closed)
        return 0;
    for (uint32_t i = 0; i < c->n_seqs; i++)
        gang__api_cancel_in_gang(api, c->seqs[i]);
    if (c->streaming)
        gang_http_stream_end(c->x);
    else
        gang_http_reply(c->x, 499, NULL, NULL, 0); /* dropped: the connection is gone */
    api->client_gone++;
    call_free(api, c);
    return 1;
}

/* A sequence finished (by the gang or a stop string): answer the call when all are. */
static void seq_done(gang_api *api, api_seq *s)
{
    api_call *c = s->call;
    if (++c->n_done < c->n_seqs)
        return;
    count_status(api, 200);
    for (uint32_t i = 0; i < c->n_seqs; i++) {
        api_seq *q = c->seqs[i];
        double queue_s = (double)(q->sent_ms - c->accepted_ms) / 1000.0;
        gang_histogram_observe(&api->h_queue, queue_s);
        if (q->n_out > 0) {
            gang_histogram_observe(&api->h_prefill, (double)(q->first_ms - q->sent_ms) / 1000.0);
            gang_histogram_observe(&api->h_ttft, (double)(q->first_ms - c->accepted_ms) / 1000.0);
        }
        if (q->n_out > 1 && q->last_ms > q->first_ms) {
            double dt = (double)(q->last_ms - q->first_ms) / 1000.0;
            gang_histogram_observe(&api->h_tps, (double)(q->n_out - 1) / dt);
            gang_histogram_observe(&api->h_itl, dt / (double)(q->n_out - 1));
        }
    }
    gang_histogram_observe(&api->h_total, (double)(gang_now_ms() - c->accepted_ms) / 1000.0);
    gang__api_call_answer(api, c);
    call_free(api, c);
}

/* ------------------------------------------------------------------ submission */

/*
 * Sends s to rank 0 for the current generation, or what is left of it: SUBMIT with the
 * request and the first ids, then PROMPT pieces. Stops at the first packet the channel
 * does not take; the next sweep goes on from there.
 */
static void seq_submit(gang_api *api, api_seq *s)
{
    if (api->gen == 0 || s->done || (s->sent_gen == api->gen && s->parts == s->n_wire))
        return;
    if (s->sent_gen != api->gen) {
        s->sent_gen = api->gen;
        s->parts = 0;
        s->n_gen = 0;
        s->sent_ms = gang_now_ms();
        if (s->submissions > 0)
            api->resubmits++;
        s->submissions++;
    }
    while (s->parts < s->n_wire) {
        gang_req_msg *m = &api->pkt;
        memset(m, 0, sizeof(*m));
        uint32_t n = s->n_wire - s->parts;
        if (n > GANG_REQ_MAX_IDS)
            n = GANG_REQ_MAX_IDS;
        m->kind = s->parts == 0 ? GANG_REQ_SUBMIT : GANG_REQ_PROMPT;
        m->generation = api->gen;
        m->id = s->id;
        m->n_prompt = s->n_wire; /* the grammar's words travel after the prompt */
        m->index = s->parts;
        m->n_ids = n;
        memcpy(m->ids, s->prompt + s->parts, (size_t)n * sizeof(int32_t));
        if (s->parts == 0) {
            m->max_tokens = s->max_tokens;
            m->sampling = s->call->p.sampling;
            /* Choice j of n draws with its own seed, a function of the call's: seeded
             * choices differ from each other and are reproducible. */
            m->sampling.seed += (uint64_t)s->choice * 0x9e3779b97f4a7c15ull;
            /* P/D: a decode gang fetches the named export; a prefill gang exports. */
            m->kv = s->call->p.kv;
            m->kv.do_export = api->cfg.role == GANG_ROLE_PREFILL && api->cfg.kv_port != 0;
        }
        if (api->submit(api->submit_ctx, m) != 0)
            return; /* channel full or rank 0 down: the sweep goes on */
        s->parts += n;
    }
}

/*
 * c passed its deadline with generated tokens: rather than a 504 that drops them, every
 * unfinished sequence is cancelled in the gang and ends with what it has
 * (finish_reason "length"), and the call is answered as usual.
 */
static void call_end_at_deadline(gang_api *api, api_call *c)
{
    uint32_t left = c->n_seqs - c->n_done;
    for (uint32_t i = 0; i < c->n_seqs && left > 0; i++) {
        api_seq *s = c->seqs[i];
        if (s->done)
            continue;
        left--;
        gang__api_cancel_in_gang(api, s);
        gang__api_seq_finish(api, s, "length");
        if (left == 0) { /* the last: seq_done answers and frees c */
            if (!call_drop_if_gone(api, c))
                seq_done(api, s);
            return;
        }
        seq_done(api, s);
    }
}

static void on_sweep(uv_timer_t *t)
{
    gang_api *api = t->data;
    uint64_t now = gang_now_ms();
    api_call *c = api->calls;
    while (c != NULL) {
        api_call *next = c->next;
        if (now >= c->deadline_ms) {
            uint32_t got = 0, want = 0, subs = 0;
            for (uint32_t i = 0; i < c->n_seqs; i++) {
                got += c->seqs[i]->n_out;
                want += c->seqs[i]->max_tokens;
                subs = c->seqs[i]->submissions > subs ? c->seqs[i]->submissions : subs;
            }
            char msg[384];
            int n = snprintf(msg, sizeof(msg),
                             "request %llu: deadline of %llu ms passed with %u of %u tokens "
                             "(submitted to %u generation(s) of the gang)",
                             (unsigned long long)c->id,
                             (unsigned long long)api->cfg.request_timeout_ms, got, want, subs);
            if (api->cfg.forward_node != 0 && api->gen == 0 && n > 0 && (size_t)n < sizeof(msg))
                snprintf(msg + n, sizeof(msg) - (size_t)n,
                         "; node %u forwards to the coordinator (node 0), which is not serving",
                         api->cfg.forward_node);
            if (got > 0)
                call_end_at_deadline(api, c);
            else
                call_fail_free(api, c, 504, "timeout", msg);
        } else {
            for (uint32_t i = 0; i < c->n_seqs; i++)
                seq_submit(api, c->seqs[i]);
        }
        c = next;
    }
}

/* ------------------------------------------------------------------ life */

/* Loads the tokenizer and the chat template of the model directory, when it has them. */
static void load_text(gang_api *api)
{
    char path[GANG_PARAM_STR_MAX + 32], err[256];
    snprintf(api->tok_why, sizeof(api->tok_why), "this gang serves no model");
    snprintf(api->tpl_why, sizeof(api->tpl_why), "this gang serves no model");
    if (!api->cfg.has_model || api->cfg.model_dir[0] == '\0')
        return;
    snprintf(path, sizeof(path), "%s/tokenizer.json", api->cfg.model_dir);
    int gguf = gang_model_is_gguf(api->cfg.model_dir); /* one file: its metadata has both */
    int rc = gguf ? gang_gguf_tokenizer_load(api->cfg.model_dir, &api->tok, err, sizeof(err))
                  : gang_tokenizer_load(path, &api->tok, err, sizeof(err));
    if (rc != 0) {
        snprintf(api->tok_why, sizeof(api->tok_why), "the model has no usable tokenizer.json: %s",
                 err);
        gang_warn("api: text prompts are off: %s", api->tok_why);
    } else {
        api->text_max = 4 * (size_t)api->cfg.ctx * gang_tokenizer_max_token_bytes(api->tok) + 4096;
    }
    rc = gguf ? gang_gguf_chat_template_load(api->cfg.model_dir, &api->tpl, err, sizeof(err))
              : gang_chat_template_load(api->cfg.model_dir, &api->tpl, err, sizeof(err));
    if (rc != 0) {
        snprintf(api->tpl_why, sizeof(api->tpl_why), "the model has no usable chat template: %s",
                 err);
        gang_warn("api: chat is off: %s", api->tpl_why);
    }
}

int gang_api_init(void *uv_loop, const gang_api_config *cfg, gang_api_submit_fn submit,
                  void *submit_ctx, gang_api **out)
{
    static const double relay[] = {0.00005, 0.0001, 0.00025, 0.0005, 0.001,
                                   0.0025,  0.005,  0.01,    0.025,  0.1};
    static const double secs[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                  0.5,   1,      2.5,   5,    10,    30,   60,  120};
    static const double tps[] = {1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000};
    const size_t ns = sizeof(secs) / sizeof(secs[0]);
    *out = NULL;
    gang_api *api = calloc(1, sizeof(*api));
    uv_timer_t *sweep = calloc(1, sizeof(*sweep));
    if (api == NULL || sweep == NULL) {
        free(api);
        free(sweep);
        return GANG_ENOMEM;
    }
    api->loop = uv_loop;
    api->cfg = *cfg;
    api->submit = submit;
    api->submit_ctx = submit_ctx;
    api->created_s = (int64_t)time(NULL);
    api->next_id = 1;
    gang_histogram_init(&api->h_queue, secs, ns);
    gang_histogram_init(&api->h_prefill, secs, ns);
    gang_histogram_init(&api->h_total, secs, ns);
    gang_histogram_init(&api->h_ttft, secs, ns);
    gang_histogram_init(&api->h_itl, secs, ns);
    gang_histogram_init(&api->h_tps, tps, sizeof(tps) / sizeof(tps[0]));
    gang_histogram_init(&api->h_relay, relay, sizeof(relay) / sizeof(relay[0]));
    gang_histogram_init(&api->h_kv, secs, ns);
    load_text(api);
    api->sweep = sweep;
    uv_timer_init(api->loop, sweep);
    sweep->data = api;
    uv_timer_start(sweep, on_sweep, API_SWEEP_MS, API_SWEEP_MS);
    *out = api;
    return 0;
}

static void api_closed(uv_handle_t *h)
{
    free(h);
}

void gang__api_free(gang_api *api)
{
    gang_tokenizer_free(api->tok);
    gang_chat_template_free(api->tpl);
    free(api);
}

void gang_api_close(gang_api *api)
{
    if (api == NULL)
        return;
    while (api->calls != NULL)
        call_fail_free(api, api->calls, 503, "unavailable", "the server is stopping");
    uv_timer_stop(api->sweep);
    uv_close((uv_handle_t *)api->sweep, api_closed);
    /* Freed now, or by the request being prepared on the thread pool when it is done. */
    if (gang__api_prep_close(api))
        gang__api_free(api);
}

/* ------------------------------------------------------------------ accepting */

void gang__api_call_accept(gang_api *api, api_call *c)
{
    c->accepted_ms = gang_now_ms();
    c->deadline_ms = c->accepted_ms + api->cfg.request_timeout_ms;
    c->created = (int64_t)time(NULL);
    c->next = api->calls;
    api->calls = c;
    api->n_calls++;
    for (uint32_t i = 0; i < c->n_seqs; i++) {
        api_seq *s = c->seqs[i];
        s->id = api->next_id++;
        s->next = api->seqs;
        api->seqs = s;
        if (api->tok != NULL)
            gang_tok_decoder_init(&s->dec, api->tok, c->p.skip_special != 0);
    }
    c->id = c->seqs[0]->id;
    if (api->cfg.forward_node != 0)
        api->forwarded++;
    for (uint32_t i = 0; i < c->n_seqs; i++)
        seq_submit(api, c->seqs[i]);
}

void gang__api_call_discard(api_call *c)
{
    if (c == NULL)
        return;
    for (uint32_t i = 0; i < c->n_seqs; i++)
        seq_free(c->seqs[i]);
    free(c->seqs);
    free(c->p.grammar);
    cJSON_free(c->p.tools_json);
    free(c);
}

int gang__api_prepare_call(gang_api *api, const gang_http_request *req, api_kind kind,
                           api_call **out, int *status, const char **code, char *err, size_t cap)
{
    char why[128];
    *out = NULL;
    *status = 400;
    *code = "invalid_request_error";
    cJSON *o = gang__api_parse_body(req, why, sizeof(why));
    api_call *c = calloc(1, sizeof(*c));
    if (c == NULL) {
        snprintf(err, cap, "out of memory");
        *status = 503;
        *code = "overloaded";
        goto out_fail;
    }
    c->kind = kind;
    if (o == NULL || !cJSON_IsObject(o)) {
        snprintf(err, cap, "%s", o == NULL ? why : "the body must be a JSON object");
        goto out_fail;
    }
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(o, "model");
    if (model != NULL && !cJSON_IsNull(model) &&
        (!cJSON_IsString(model) || strcmp(model->valuestring, api->cfg.model) != 0)) {
        snprintf(err, cap, "The model `%.200s` does not exist (this server serves `%s`)",
                 cJSON_IsString(model) ? model->valuestring : "?", api->cfg.model);
        *status = 404;
        *code = "model_not_found";
        goto out_fail;
    }
    if (gang__api_parse_params(api, o, kind, &c->p, err, cap) != 0 ||
        gang__api_parse_prompts(api, o, c, err, cap) != 0)
        goto out_fail;
    cJSON_Delete(o);
    *out = c;
    return 0;
out_fail:
    cJSON_Delete(o);
    gang__api_call_discard(c);
    return -1;
}

/* POST /v1/completions and /v1/chat/completions: refused here when the gang cannot take
 * it, else prepared off the loop (api-prep.c). */
static void api_generate(gang_api *api, gang_http_exchange *x, const gang_http_request *req,
                         api_kind kind)
{
    if (!api->cfg.has_model) {
        gang__api_error(api, x, 503, "unavailable",
                        "this gang serves no model (start it with serve --model DIR)");
        return;
    }
    if (api->gave_up[0]) {
        gang__api_error(api, x, 503, "unavailable", "the gang gave up: %s", api->gave_up);
        return;
    }
    if (api->n_calls + api->n_prep >= api->cfg.max_queue) {
        gang__api_error(api, x, 503, "overloaded", "%u requests are already waiting (--max-queue)",
                        api->n_calls + api->n_prep);
        return;
    }
    gang__api_prep_submit(api, x, req, kind == API_CHAT ? API_PREP_CHAT : API_PREP_COMPLETION);
}

/* GET /v1/models (path NULL): the list of the one served model; GET /v1/models/{id}: that
 * model, or 404 model_not_found for another id. */
static void api_models(gang_api *api, gang_http_exchange *x, const char *id)
{
    if (!api->cfg.has_model) {
        gang__api_error(api, x, 503, "unavailable",
                        "this gang serves no model (start it with serve --model DIR)");
        return;
    }
    if (id != NULL && strcmp(id, api->cfg.model) != 0) {
        gang__api_error(api, x, 404, "model_not_found",
                        "The model `%.200s` does not exist (this server serves `%s`)", id,
                        api->cfg.model);
        return;
    }
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "id", api->cfg.model);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", (double)api->created_s);
    cJSON_AddStringToObject(m, "owned_by", "ganglion");
    cJSON_AddNumberToObject(m, "max_model_len", api->cfg.ctx);
    if (api->cfg.ctx_why[0] != '\0')
        cJSON_AddStringToObject(m, "max_model_len_reason", api->cfg.ctx_why);
    if (id != NULL) {
        gang__api_json(x, 200, m);
        return;
    }
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "object", "list");
    cJSON_AddItemToArray(cJSON_AddArrayToObject(o, "data"), m);
    gang__api_json(x, 200, o);
}

typedef struct api_route {
    const char *path;
    const char *method;
    int kind; /* 0 completions, 1 chat, 2 models, 3 tokenize, 4 detokenize, 5 one model */
} api_route;

static const api_route routes[] = {
    {"/v1/completions", "POST", 0}, {"/v1/chat/completions", "POST", 1}, {"/v1/models", "GET", 2},
    {"/tokenize", "POST", 3},       {"/detokenize", "POST", 4},
};
static const api_route model_route = {"/v1/models/{id}", "GET", 5};

/* Whether the Authorization header carries the configured key ("Bearer KEY"). */
static int authorized(const gang_api *api, const gang_http_request *req)
{
    const char *a = req->authorization ? req->authorization : "";
    size_t klen = strlen(api->cfg.api_key);
    if (klen == 0)
        return 1;
    if (strncasecmp(a, "Bearer ", 7) != 0)
        return 0;
    a += 7;
    while (*a == ' ')
        a++;
    size_t alen = strlen(a);
    while (alen > 0 && (a[alen - 1] == ' ' || a[alen - 1] == '\t'))
        alen--;
    return alen == klen && sodium_memcmp(a, api->cfg.api_key, klen) == 0;
}

/*
 * Answers a request for no API route, or returns 0 to leave it to the agent (its GET
 * probes and the 404 of other GETs): a /v1 path is 404 not_found; one of OpenAI's paths
 * without /v1 (a client whose base URL lacks it, as llama-server's aliases allow) is 404
 * naming the /v1 path; another method than GET/HEAD is 405 method_not_allowed, all in
 * OpenAI's error shape.
 */
static int unrouted(gang_api *api, gang_http_exchange *x, const gang_http_request *req)
{
    char v1[96];
    if (strncmp(req->path, "/v1/", 4) == 0) {
        gang__api_error(api, x, 404, "not_found", "no such endpoint: %.200s", req->path);
        return 1;
    }
    snprintf(v1, sizeof(v1), "/v1%.80s", req->path);
    for (size_t i = 0; i < sizeof(routes) / sizeof(routes[0]); i++)
        if (strcmp(v1, routes[i].path) == 0) {
            gang__api_error(api, x, 404, "not_found",
                            "no such endpoint: %.80s (OpenAI's API is under /v1: %s)", req->path,
                            v1);
            return 1;
        }
    if (strcmp(req->method, "GET") != 0 && strcmp(req->method, "HEAD") != 0) {
        gang__api_error(api, x, 405, "method_not_allowed", "method not allowed: %.16s %.200s",
                        req->method, req->path);
        return 1;
    }
    return 0;
}

int gang_api_handle(gang_api *api, gang_http_exchange *x, const gang_http_request *req)
{
    const api_route *r = NULL;
    for (size_t i = 0; i < sizeof(routes) / sizeof(routes[0]); i++)
        if (strcmp(req->path, routes[i].path) == 0)
            r = &routes[i];
    if (strncmp(req->path, "/v1/models/", 11) == 0 && req->path[11] != '\0')
        r = &model_route;
    if (r == NULL)
        return unrouted(api, x, req);
    int is_get = strcmp(r->method, "GET") == 0;
    if (strcmp(req->method, r->method) != 0 && !(is_get && strcmp(req->method, "HEAD") == 0)) {
        gang__api_error(api, x, 405, "method_not_allowed", "method not allowed: %s %s", r->method,
                        r->path);
        return 1;
    }
    if (api == NULL) {
        gang__api_error(NULL, x, 404, "not_found", "this node's API did not start");
        return 1;
    }
    if (!authorized(api, req)) {
        gang__api_error(api, x, 401, "invalid_api_key",
                        "a valid API key is required: send 'Authorization: Bearer <key>'");
        return 1;
    }
    switch (r->kind) {
    case 0:
        api_generate(api, x, req, API_COMPLETION);
        break;
    case 1:
        api_generate(api, x, req, API_CHAT);
        break;
    case 2:
        api_models(api, x, NULL);
        break;
    case 5:
        api_models(api, x, req->path + 11);
        break;
    case 3:
        gang__api_prep_submit(api, x, req, API_PREP_TOKENIZE);
        break;
    default:
        gang__api_detokenize(api, x, req);
        break;
    }
    return 1;
}

/* ------------------------------------------------------------------ generations */

void gang_api_on_start(gang_api *api, uint64_t gen)
{
    api->gen = gen;
    for (api_call *c = api->calls; c; c = c->next)
        for (uint32_t i = 0; i < c->n_seqs; i++)
            seq_submit(api, c->seqs[i]);
}

void gang_api_on_abort(gang_api *api, uint64_t gen)
{
    (void)gen;
    api->gen = 0;
    for (api_seq *s = api->seqs; s; s = s->next) {
        s->sent_gen = 0;
        s->n_gen = 0;
        s->parts = 0;
    }
}

void gang_api_on_give_up(gang_api *api, const char *reason)
{
    char msg[GANG_REQ_REASON_MAX + 64];
    api->gen = 0;
    gang_strlcpy(api->gave_up, reason[0] ? reason : "restart budget spent", sizeof(api->gave_up));
    while (api->calls != NULL) {
        snprintf(msg, sizeof(msg), "request %llu: the gang gave up: %s",
                 (unsigned long long)api->calls->id, api->gave_up);
        call_fail_free(api, api->calls, 503, "unavailable", msg);
    }
}

void gang_api_on_token(gang_api *api, const gang_req_msg *m)
{
    api_seq *s = seq_find(api, m->id);
    if (s == NULL || s->done || s->sent_gen != m->generation || m->generation != api->gen ||
        m->index != s->n_gen || s->n_gen >= s->max_tokens)
        return;
    s->n_gen++;
    if (m->index < s->n_out) { /* a re-run after a restart: the client has this token */
        if (s->out[m->index] != m->token) {
            s->mismatches++;
            api->mismatches++;
            gang_warn("api: request %llu: re-run token %u is %d, was %d", (unsigned long long)s->id,
                      m->index, m->token, s->out[m->index]);
        }
        return;
    }
    api_lp lp;
    memset(&lp, 0, sizeof(lp));
    lp.logprob = m->logprob;
    lp.n_top = m->n_top > GANG_MAX_TOP_LOGPROBS ? GANG_MAX_TOP_LOGPROBS : m->n_top;
    memcpy(lp.top_ids, m->top_ids, lp.n_top * sizeof(int32_t));
    memcpy(lp.top_lp, m->top_lp, lp.n_top * sizeof(float));
    uint64_t now = gang_now_ms();
    if (s->n_out == 0)
        s->first_ms = now;
    s->last_ms = now;
    gang__api_seq_token(api, s, m->token, &lp);
    if (call_drop_if_gone(api, s->call))
        return;
    if (s->done) { /* a stop string matched */
        api->stop_strings++;
        gang__api_cancel_in_gang(api, s);
        seq_done(api, s);
    }
}

/* P/D: what the DONE of s says about its KV transfer, into s and the counters. */
static void api_kv_done(gang_api *api, api_seq *s, const gang_req_msg *done)
{
    s->kv_id = done->kv_id;
    s->kv_blocks = done->kv_blocks;
    s->kv_layout = done->kv_layout;
    if (done->kv_id != 0) {
        api->kv_exports++;
        api->kv_exported_blocks += done->kv_blocks;
    } else if (s->call->p.kv.id != 0 && done->kv_blocks > 0) {
        api->kv_imports++;
        api->kv_imported_blocks += done->kv_blocks;
        api->kv_imports_device += done->kv_device != 0;
        gang_histogram_observe(&api->h_kv, (double)done->kv_ms / 1000.0);
    } else if (s->call->p.kv.id != 0) {
        api->kv_import_fallbacks++;
        api->kv_import_mismatches += done->kv_mismatch != 0;
    }
}

void gang_api_on_done(gang_api *api, const gang_req_msg *done)
{
    uint64_t gen = done->generation, id = done->id;
    int32_t code = done->code;
    uint32_t cached = done->index;
    const char *finish = done->finish, *reason = done->reason;
    api_seq *s = seq_find(api, id);
    char msg[GANG_REQ_REASON_MAX + 64];
    if (s == NULL || s->done || s->sent_gen != gen || gen != api->gen)
        return;
    s->gang_done = 1;
    if (code == 0)
        api_kv_done(api, s, done);
    if (code == 0) { /* the prefix cache's hit rate: cached over prompt tokens */
        s->n_cached = cached < s->n_prompt ? cached : s->n_prompt;
        s->cached_known = 1;
        api->prompt_tokens += s->n_prompt;
        api->prefix_hit_tokens += s->n_cached;
    }
    if (code < 0) {
        int bad = code == GANG_EINVAL;
        if (bad)
            snprintf(msg, sizeof(msg), "%s", reason);
        else
            snprintf(msg, sizeof(msg), "request %llu: %s (%s)", (unsigned long long)id, reason,
                     gang_err_name(code));
        call_fail_free(api, s->call, bad ? 400 : 503, bad ? "invalid_request_error" : "unavailable",
                       msg);
        return;
    }
    gang__api_seq_finish(api, s, finish[0] ? finish : "length");
    if (!call_drop_if_gone(api, s->call))
        seq_done(api, s);
}

void gang_api_on_nack(gang_api *api, uint64_t gen, uint64_t id, uint32_t index)
{
    api_seq *s = seq_find(api, id);
    if (s == NULL || s->done || s->sent_gen != gen || gen != api->gen || s->n_gen > 0)
        return;
    api->nacks++;
    /* The coordinator kept the pieces before index and refuses every later piece of this
     * request until the one at index comes again (agent.c), so rank 0 sees them in order:
     * the sweep sends from index on. */
    if (index < s->parts)
        s->parts = index;
}

void gang_api_observe_relay(gang_api *api, double seconds)
{
    gang_histogram_observe(&api->h_relay, seconds < 0 ? 0 : seconds);
}

/* ------------------------------------------------------------------ metrics */

/* A member's forwarding: calls forwarded, resubmitted, lost, and the relay's latency. */
static void forward_metrics(gang_api *api, gang_metrics_buf *b)
{
    const gang_metric_counter cs[] = {
        {"ganglion_forwarded_requests_total",
         "Calls this member accepted and forwarded to the coordinator", api->forwarded},
        {"ganglion_forwarded_resubmits_total",
         "Forwarded prompts submitted again after a gang restart or a new coordinator",
         api->resubmits},
        {"ganglion_forwarded_refused_total",
         "Forwarded packets the coordinator did not take at once (sent again)", api->nacks},
        {"ganglion_forwarded_requests_lost_total",
         "Forwarded calls answered 503 or 504 (deadline passed, gang gave up)", api->lost},
    };
    (void)gang_metrics_counters(b, cs, sizeof(cs) / sizeof(cs[0]));
    gang_metrics_family(b, "ganglion_forward_relay_seconds", GANG_METRIC_HISTOGRAM,
                        "A forwarded token from rank 0's report on the coordinator to this "
                        "member's client (wall clocks of both nodes)");
    gang_histogram_render(b, "ganglion_forward_relay_seconds", NULL, 0, &api->h_relay);
}

static const char *const role_names[] = {"both", "prefill", "decode"};

int gang_role_parse(const char *name, uint32_t *out)
{
    for (uint32_t i = 0; i < 3; i++) {
        if (strcmp(name, role_names[i]) == 0) {
            *out = i;
            return 0;
        }
    }
    return GANG_EINVAL;
}

const char *gang_role_name(uint32_t role)
{
    return role < 3 ? role_names[role] : role_names[0];
}

void gang_api_metrics(gang_api *api, gang_metrics_buf *b)
{
    static const char *const codes[] = {"200", "400", "401", "404", "503", "504"};
    gang_metrics_family(b, "ganglion_requests_total", GANG_METRIC_COUNTER,
                        "API requests answered, by HTTP status");
    for (size_t i = 0; i < sizeof(codes) / sizeof(codes[0]); i++) {
        gang_metric_label l = {.name = "code", .value = codes[i]};
        gang_metrics_sample_u64(b, "ganglion_requests_total", &l, 1, api->answered[i]);
    }
    struct {
        const char *name, *help;
        int gauge;
        uint64_t v;
    } cs[] = {
        {"ganglion_requests_in_flight", "Generation requests accepted and not answered yet", 1,
         api->n_calls},
        {"ganglion_role",
         "What the gang does behind a router (--role): 0 both, 1 prefill, 2 decode", 1,
         api->cfg.role},
        {"ganglion_requests_in_flight_max",
         "Requests admitted at once (--max-queue); more are answered 503", 1, api->cfg.max_queue},
        {"ganglion_request_resubmits_total",
         "Prompts run again from their start after a gang restart", 0, api->resubmits},
        {"ganglion_request_cancels_total",
         "Prompts cancelled in the gang (deadline, stop string, client gone)", 0, api->cancels},
        {"ganglion_request_rerun_mismatches_total",
         "Tokens of a re-run that differed from those the client had (should stay 0)", 0,
         api->mismatches},
        {"ganglion_request_stop_strings_total", "Prompts ended by one of their stop strings", 0,
         api->stop_strings},
        {"ganglion_request_client_gone_total",
         "Streamed calls whose client went away before the end (cancelled in the gang)", 0,
         api->client_gone},
        {"ganglion_prompt_tokens_total", "Prompt tokens of the sequences the gang completed", 0,
         api->prompt_tokens},
        {"ganglion_prefix_cache_hit_tokens_total",
         "Of those, tokens found in the prefix cache (hit rate: this over the prompt tokens)", 0,
         api->prefix_hit_tokens},
        {"ganglion_kv_exports_total",
         "P/D, a prefill gang: prompts whose KV blocks were exported for a decode gang", 0,
         api->kv_exports},
        {"ganglion_kv_exported_blocks_total", "P/D: KV blocks of those exports (16 positions)", 0,
         api->kv_exported_blocks},
        {"ganglion_kv_imports_total",
         "P/D, a decode gang: prompts that started from KV blocks fetched from a prefill gang", 0,
         api->kv_imports},
        {"ganglion_kv_imported_blocks_total", "P/D: KV blocks fetched for those prompts", 0,
         api->kv_imported_blocks},
        {"ganglion_kv_imports_device_total",
         "P/D: of those prompts, the ones whose blocks moved GPU to GPU over an NCCL pair (the "
         "rest over TCP)",
         0, api->kv_imports_device},
        {"ganglion_kv_import_fallbacks_total",
         "P/D: prompts that named a transfer but prefilled instead (the fetch failed)", 0,
         api->kv_import_fallbacks},
        {"ganglion_kv_import_layout_mismatches_total",
         "P/D: of those, prompts whose prefill gang's layout cannot feed this gang (another "
         "model's layer count or another TP): never fetched",
         0, api->kv_import_mismatches},
    };
    for (size_t i = 0; i < sizeof(cs) / sizeof(cs[0]); i++) {
        gang_metrics_family(b, cs[i].name, cs[i].gauge ? GANG_METRIC_GAUGE : GANG_METRIC_COUNTER,
                            cs[i].help);
        gang_metrics_sample_u64(b, cs[i].name, NULL, 0, cs[i].v);
    }
    struct {
        const char *name, *help;
        const gang_histogram *h;
    } hs[] = {
        {"ganglion_request_queue_seconds", "Accepted to submitted in the answering generation",
         &api->h_queue},
        {"ganglion_request_prefill_seconds", "Submitted to first token", &api->h_prefill},
        {"ganglion_request_ttft_seconds", "Accepted to first token", &api->h_ttft},
        {"ganglion_request_inter_token_seconds", "Mean time between tokens of a prompt",
         &api->h_itl},
        {"ganglion_request_decode_tokens_per_second", "Decode rate after the first token",
         &api->h_tps},
        {"ganglion_request_seconds", "Accepted to answered", &api->h_total},
        {"ganglion_kv_transfer_seconds",
         "P/D, a decode gang: a prompt's KV fetch, every rank, from the plan to rank 0's verdict",
         &api->h_kv},
    };
    for (size_t i = 0; i < sizeof(hs) / sizeof(hs[0]); i++) {
        gang_metrics_family(b, hs[i].name, GANG_METRIC_HISTOGRAM, hs[i].help);
        gang_histogram_render(b, hs[i].name, NULL, 0, hs[i].h);
    }
    if (api->cfg.forward_node != 0)
        forward_metrics(api, b);
}
