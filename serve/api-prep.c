/*
 * Requests prepared off the loop thread (issue #28). Parsing a body, rendering chat
 * messages through the template and tokenizing a prompt take time proportional to the
 * request (an 8 MiB prompt once held the loop for 8 s, a regex with quadratic behaviour
 * 4 s for 30 k characters), and the loop also answers the probes, sends the heartbeats and
 * drives the gang. So POST /v1/completions, /v1/chat/completions and /tokenize are
 * prepared on libuv's thread pool: the body is copied, gang__api_prepare_call (or
 * gang__api_tokenize_answer) runs there, reading only what gang_api_init loaded, and the
 * loop then accepts the call or sends the answer.
 *
 * One request at a time, in arrival order: ids are still numbered in arrival order, one
 * hostile prompt holds at most one of the pool's threads (libuv's resolver, which the
 * member needs to reach its coordinator, keeps the others), and the waiting ones count
 * against --max-queue like accepted calls.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <uv.h>

#include "api-internal.h"

struct api_prep {
    uv_work_t work;
    gang_api *api;
    gang_http_exchange *x; /* NULL once answered (the API closing) */
    api_prep_kind kind;
    char *body; /* the request's body, copied (NUL-terminated) */
    size_t body_len;
    /* the result */
    api_call *c;  /* a generation's prepared call */
    char *answer; /* /tokenize's answer, JSON text (2 M ids print in a second) */
    int status;   /* of a refusal */
    const char *code;
    char err[512];
    api_prep *next;
};

static void prep_free(api_prep *p)
{
    gang__api_call_discard(p->c);
    cJSON_free(p->answer);
    free(p->body);
    free(p);
}

/* Thread pool: the preparation itself. */
static void prep_work(uv_work_t *w)
{
    api_prep *p = w->data;
    gang_http_request req = {.method = "POST",
                             .path = "",
                             .query = "",
                             .body = p->body,
                             .body_len = p->body_len,
                             .authorization = ""};
    p->status = 400;
    p->code = "invalid_request_error";
    if (p->kind == API_PREP_TOKENIZE) {
        cJSON *o = NULL;
        if (gang__api_tokenize_answer(p->api, &req, &o, p->err, sizeof(p->err)) == 0) {
            p->answer = cJSON_PrintUnformatted(o);
            p->status = 500;
            p->code = NULL;
            snprintf(p->err, sizeof(p->err), "out of memory");
        }
        cJSON_Delete(o);
    } else
        gang__api_prepare_call(p->api, &req, p->kind == API_PREP_CHAT ? API_CHAT : API_COMPLETION,
                               &p->c, &p->status, &p->code, p->err, sizeof(p->err));
}

static void prep_done(uv_work_t *w, int status);

/* Starts the next waiting request when none is on the pool. */
static void prep_next(gang_api *api)
{
    api_prep *p = api->prep_head;
    if (api->prep_running != NULL || p == NULL)
        return;
    api->prep_head = p->next;
    if (api->prep_head == NULL)
        api->prep_tail = NULL;
    api->prep_running = p;
    p->work.data = p;
    int rc = uv_queue_work(api->loop, &p->work, prep_work, prep_done);
    if (rc != 0) { /* never with a live loop; answered rather than lost */
        api->prep_running = NULL;
        api->n_prep--;
        gang__api_error(api, p->x, 503, "overloaded", "cannot prepare the request: %s",
                        uv_strerror(rc));
        prep_free(p);
        prep_next(api);
    }
}

/* Loop thread: the answer, or the call accepted. */
static void prep_done(uv_work_t *w, int status)
{
    api_prep *p = w->data;
    gang_api *api = p->api;
    (void)status;
    api->prep_running = NULL;
    api->n_prep--;
    if (p->x == NULL) { /* answered at gang_api_close */
        prep_free(p);
        gang__api_free(api);
        return;
    }
    if (p->kind == API_PREP_TOKENIZE && p->answer != NULL) {
        gang_http_reply(p->x, 200, "application/json", p->answer, strlen(p->answer));
    } else if (p->c != NULL && api->gave_up[0]) {
        gang__api_error(api, p->x, 503, "unavailable", "the gang gave up: %s", api->gave_up);
    } else if (p->c != NULL) {
        p->c->x = p->x;
        gang__api_call_accept(api, p->c);
        p->c = NULL;
    } else {
        gang__api_error(api, p->x, p->status, p->code, "%s", p->err);
    }
    prep_free(p);
    prep_next(api);
}

void gang__api_prep_submit(gang_api *api, gang_http_exchange *x, const gang_http_request *req,
                           api_prep_kind kind)
{
    api_prep *p = calloc(1, sizeof(*p));
    char *body = malloc(req->body_len + 1);
    if (p == NULL || body == NULL) {
        free(p);
        free(body);
        gang__api_error(api, x, 503, "overloaded", "out of memory");
        return;
    }
    memcpy(body, req->body, req->body_len);
    body[req->body_len] = '\0';
    p->api = api;
    p->x = x;
    p->kind = kind;
    p->body = body;
    p->body_len = req->body_len;
    if (api->prep_tail != NULL)
        api->prep_tail->next = p;
    else
        api->prep_head = p;
    api->prep_tail = p;
    api->n_prep++;
    prep_next(api);
}

int gang__api_prep_close(gang_api *api)
{
    while (api->prep_head != NULL) {
        api_prep *p = api->prep_head;
        api->prep_head = p->next;
        api->n_prep--;
        gang__api_error(api, p->x, 503, "unavailable", "the server is stopping");
        prep_free(p);
    }
    api->prep_tail = NULL;
    if (api->prep_running == NULL)
        return 1;
    gang__api_error(api, api->prep_running->x, 503, "unavailable", "the server is stopping");
    api->prep_running->x = NULL;
    return 0;
}
