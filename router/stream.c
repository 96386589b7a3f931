/*
 * A streamed call's relay, event by event, and its resumption on another replica after the
 * one serving it failed mid-stream (issue #26).
 *
 * The router relays a stream as whole SSE events ("data: ...\n\n"), never a part of one,
 * and keeps what the client has: the tokens of choice 0 ("tokens", which every chunk of
 * the API carries) and its text ("text", or the chat delta's "content"), and the first
 * chunk's "id". When the replica fails after the stream began, the call is sent again,
 * whole, to another replica (proxy.c), and this file turns that replica's stream into the
 * continuation of the first: every token and every byte of text the client already has
 * must come again, equal (the API's sampling is keyed by position, so a greedy or seeded
 * call regenerates the same tokens and, from them, the same text); they are dropped, and
 * the rest is relayed with the first id. Anything else -- another token, another byte --
 * means the two streams are not the same text (an unseeded sampled call), and the call
 * ends with an error event instead of a spliced answer. The text is compared as one
 * string, not chunk by chunk, so chunks that group tokens differently still join exactly.
 *
 * A stream that cannot be followed so (more than one choice, tool-call deltas, an event
 * that is not JSON) is relayed as before and is not resumable: a failure ends it with an
 * error event. A resumed chunk that must drop some of its tokens but carries logprobs
 * ends the call the same way (the logprobs are not split).
 *
 * Bounds: an event is at most --max-response-bytes; the tokens and text kept are those the
 * client received, bounded by the same.
 */
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "router-internal.h"

/* Appends len bytes to *buf (size *n, room *cap); 0 or GANG_ENOMEM. */
static int grow(char **buf, size_t *n, size_t *cap, const char *at, size_t len)
{
    if (*n + len + 1 > *cap) {
        size_t c = 2 * (*n + len + 1);
        char *b = realloc(*buf, c);
        if (b == NULL)
            return GANG_ENOMEM;
        *buf = b;
        *cap = c;
    }
    memcpy(*buf + *n, at, len);
    *n += len;
    (*buf)[*n] = '\0';
    return 0;
}

/* The client has token t too. 0 or GANG_ENOMEM. */
static int keep_token(router_stream *s, int32_t t)
{
    if (s->n_toks == s->cap_toks) {
        uint32_t c = s->cap_toks ? 2 * s->cap_toks : 64;
        int32_t *b = realloc(s->toks, c * sizeof(int32_t));
        if (b == NULL)
            return GANG_ENOMEM;
        s->toks = b;
        s->cap_toks = c;
    }
    s->toks[s->n_toks++] = t;
    return 0;
}

/* Choice 0 of chunk o, with its text item (text, or the delta's content; may be NULL);
 * NULL when the chunk has no choice. Marks s not followable for a chunk it cannot follow. */
static cJSON *chunk_choice(router_stream *s, cJSON *o, cJSON **text)
{
    cJSON *chs = cJSON_GetObjectItemCaseSensitive(o, "choices");
    *text = NULL;
    if (!cJSON_IsArray(chs) || cJSON_GetArraySize(chs) == 0)
        return NULL;
    cJSON *ch = chs->child, *idx = cJSON_GetObjectItemCaseSensitive(ch, "index");
    if (cJSON_GetArraySize(chs) > 1 ||
        (idx != NULL && !(cJSON_IsNumber(idx) && idx->valueint == 0)))
        s->untracked = 1;
    cJSON *delta = cJSON_GetObjectItemCaseSensitive(ch, "delta");
    if (cJSON_IsObject(delta)) {
        for (cJSON *it = delta->child; it != NULL; it = it->next)
            if (strcmp(it->string, "role") != 0 && strcmp(it->string, "content") != 0)
                s->untracked = 1; /* tool calls and the like: not followed */
        *text = cJSON_GetObjectItemCaseSensitive(delta, "content");
    } else {
        *text = cJSON_GetObjectItemCaseSensitive(ch, "text");
    }
    if (*text != NULL && !cJSON_IsString(*text))
        *text = NULL;
    return ch;
}

/* A first attempt's chunk o: the client gets it as it is; s keeps its tokens and text. */
static int stream_follow(router_stream *s, cJSON *o)
{
    cJSON *text, *ch = chunk_choice(s, o, &text);
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(o, "id");
    if (s->id[0] == '\0' && cJSON_IsString(id) && strlen(id->valuestring) < sizeof(s->id))
        strcpy(s->id, id->valuestring);
    const cJSON *toks = ch != NULL ? cJSON_GetObjectItemCaseSensitive(ch, "tokens") : NULL;
    for (const cJSON *t = cJSON_IsArray(toks) ? toks->child : NULL; t != NULL; t = t->next)
        if (keep_token(s, (int32_t)t->valuedouble) != 0)
            return GANG_ENOMEM;
    if (text != NULL && grow(&s->text, &s->text_len, &s->text_cap, text->valuestring,
                             strlen(text->valuestring)) != 0)
        return GANG_ENOMEM;
    s->a_toks = s->n_toks;
    s->a_text = s->text_len;
    return 0;
}

/*
 * A resumed attempt's chunk o: checks what the client already has against it and cuts it
 * down to the rest (*send: 0 when nothing is left to send). 0, GANG_EMISMATCH, or
 * GANG_ENOMEM.
 */
static int stream_splice(router_stream *s, cJSON *o, int *send)
{
    cJSON *text, *ch = chunk_choice(s, o, &text);
    cJSON *toks = ch != NULL ? cJSON_GetObjectItemCaseSensitive(ch, "tokens") : NULL;
    uint32_t dropped = 0, fresh = 0;
    *send = ch == NULL; /* (a chunk without a choice: usage) */
    if (s->untracked)
        return GANG_EMISMATCH;
    cJSON *keep = cJSON_CreateArray();
    for (const cJSON *t = cJSON_IsArray(toks) ? toks->child : NULL; t != NULL; t = t->next) {
        int32_t v = (int32_t)t->valuedouble;
        if (s->a_toks < s->n_toks) {
            if (s->toks[s->a_toks] != v)
                goto out_mismatch;
            dropped++;
        } else {
            if (keep_token(s, v) != 0)
                goto out_nomem;
            cJSON_AddItemToArray(keep, cJSON_CreateNumber(v));
            fresh++;
        }
        s->a_toks++;
    }
    size_t tl = text != NULL ? strlen(text->valuestring) : 0, skip = 0;
    if (s->a_text < s->text_len && tl > 0) {
        skip = s->text_len - s->a_text < tl ? s->text_len - s->a_text : tl;
        if (memcmp(s->text + s->a_text, text->valuestring, skip) != 0)
            goto out_mismatch;
    }
    s->a_text += tl;
    if (skip > 0) {
        char *rest = strdup(text->valuestring + skip);
        if (rest == NULL || cJSON_SetValuestring(text, rest) == NULL) {
            free(rest);
            goto out_nomem;
        }
        free(rest);
    }
    if (tl > skip && grow(&s->text, &s->text_len, &s->text_cap, text->valuestring, tl - skip) != 0)
        goto out_nomem;
    const cJSON *fin = ch != NULL ? cJSON_GetObjectItemCaseSensitive(ch, "finish_reason") : NULL;
    const cJSON *lp = ch != NULL ? cJSON_GetObjectItemCaseSensitive(ch, "logprobs") : NULL;
    if (dropped > 0 && fresh > 0 && lp != NULL && !cJSON_IsNull(lp))
        goto out_mismatch; /* (its logprobs are not split) */
    if (toks != NULL)
        cJSON_ReplaceItemInObjectCaseSensitive(ch, "tokens", keep);
    else
        cJSON_Delete(keep);
    *send |= fresh > 0 || tl > skip || cJSON_IsString(fin);
    if (s->id[0] != '\0' && cJSON_GetObjectItemCaseSensitive(o, "id") != NULL)
        cJSON_ReplaceItemInObjectCaseSensitive(o, "id", cJSON_CreateString(s->id));
    return 0;
out_mismatch:
    cJSON_Delete(keep);
    return GANG_EMISMATCH;
out_nomem:
    cJSON_Delete(keep);
    return GANG_ENOMEM;
}

/* One whole event (len bytes at ev, its blank line included): relayed, cut, or dropped. */
static int one_event(router_stream *s, const char *ev, size_t len, router_stream_out out, void *ctx)
{
    size_t n = len;
    while (n > 0 && (ev[n - 1] == '\n' || ev[n - 1] == '\r'))
        n--;
    cJSON *o = n > 6 && memcmp(ev, "data: ", 6) == 0 && ev[6] == '{'
                   ? cJSON_ParseWithLength(ev + 6, n - 6)
                   : NULL;
    int rc = 0, send = 1;
    if (o == NULL || cJSON_GetObjectItemCaseSensitive(o, "error") != NULL) {
        /* [DONE], an error event, or something not followed */
        s->untracked |= o == NULL && !(n == 12 && memcmp(ev, "data: [DONE]", 12) == 0);
        cJSON_Delete(o);
        return out(ctx, ev, len);
    }
    if (!s->resumed) {
        rc = stream_follow(s, o);
        cJSON_Delete(o);
        return rc != 0 ? rc : out(ctx, ev, len);
    }
    rc = stream_splice(s, o, &send);
    char *js = rc == 0 && send ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    if (rc != 0 || !send)
        return rc;
    if (js == NULL)
        return GANG_ENOMEM;
    size_t jl = strlen(js);
    char *msg = malloc(jl + 9);
    if (msg != NULL) {
        memcpy(msg, "data: ", 6);
        memcpy(msg + 6, js, jl);
        memcpy(msg + 6 + jl, "\n\n", 3);
        rc = out(ctx, msg, jl + 8);
    }
    cJSON_free(js);
    free(msg);
    return msg != NULL ? rc : GANG_ENOMEM;
}

int gang__router_stream_feed(router_stream *s, const char *at, size_t len, size_t max,
                             router_stream_out out, void *ctx)
{
    if (s->len + len > max)
        return GANG_ERANGE;
    int rc = grow(&s->buf, &s->len, &s->cap, at, len);
    size_t from = 0;
    for (size_t i = 1; rc == 0 && i < s->len; i++) {
        if (s->buf[i] != '\n' || s->buf[i - 1] != '\n')
            continue;
        rc = one_event(s, s->buf + from, i + 1 - from, out, ctx);
        from = i + 1;
    }
    if (from > 0 && from <= s->len) {
        memmove(s->buf, s->buf + from, s->len - from);
        s->len -= from;
    }
    return rc;
}

int gang__router_stream_resume(router_stream *s)
{
    if (s->untracked || s->resumes >= ROUTER_MAX_RESUMES)
        return 0;
    s->resumed = 1;
    s->resumes++;
    s->len = 0; /* (a part of an event the failed replica sent: dropped) */
    s->a_toks = 0;
    s->a_text = 0;
    return 1;
}

void gang__router_stream_free(router_stream *s)
{
    free(s->buf);
    free(s->toks);
    free(s->text);
    memset(s, 0, sizeof(*s));
}
