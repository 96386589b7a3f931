/*
 * What the tokens of a sequence become (see api-internal.h): text decoded incrementally
 * (a character split across tokens is held back until complete), stop strings matched
 * across token boundaries (the text ends before the match, and generation is cancelled
 * in the gang), and the answers: one JSON object, or Server-Sent Events in OpenAI's chunk
 * format while the tokens arrive (text that could still become the start of a stop
 * string is held back until it cannot), ending with an optional usage chunk and
 * "data: [DONE]".
 */
#include <arpa/inet.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api-internal.h"

#define TOKEN_TEXT_CAP (3u * GANG_TOK_MAX_TOKEN_BYTES + GANG_TOK_DECODE_SLACK)

/* ------------------------------------------------------------------ text */

static int text_append(api_seq *s, const char *b, size_t n)
{
    if (s->text_len + n + 1 > s->text_cap) {
        size_t cap = s->text_cap ? s->text_cap : 256;
        while (cap < s->text_len + n + 1)
            cap *= 2;
        char *t = realloc(s->text, cap);
        if (t == NULL)
            return GANG_ENOMEM;
        s->text = t;
        s->text_cap = cap;
    }
    memcpy(s->text + s->text_len, b, n);
    s->text_len += n;
    s->text[s->text_len] = '\0';
    return 0;
}

/* Cuts the text at the first stop string found in it; 1 when one matched. */
static int stop_check(api_seq *s)
{
    const api_params *p = &s->call->p;
    size_t best = SIZE_MAX;
    for (uint32_t k = 0; k < p->n_stop_str; k++) {
        size_t len = p->stop_len[k];
        size_t from = s->stop_scan >= len ? s->stop_scan - len + 1 : 0;
        if (s->text_len < len)
            continue;
        for (size_t i = from; i + len <= s->text_len && i < best; i++) {
            if (memcmp(s->text + i, p->stop_str[k], len) == 0) {
                best = i;
                break;
            }
        }
    }
    s->stop_scan = s->text_len;
    if (best == SIZE_MAX)
        return 0;
    s->text_len = best;
    s->text[best] = '\0';
    s->stop_scan = best;
    return 1;
}

/* Bytes at the end of the text that could begin a stop string: not streamed yet. */
static size_t stop_holdback(const api_seq *s)
{
    const api_params *p = &s->call->p;
    size_t hold = 0;
    for (uint32_t k = 0; k < p->n_stop_str; k++) {
        for (size_t n = p->stop_len[k] - 1; n > hold; n--) {
            if (n <= s->text_len && memcmp(s->text + s->text_len - n, p->stop_str[k], n) == 0) {
                hold = n;
                break;
            }
        }
    }
    return hold;
}

/* The text of one token on its own (for logprobs), or "token_id:N" without a tokenizer. */
static void token_string(const gang_api *api, int32_t id, char *buf, size_t cap)
{
    gang_tok_decoder d;
    size_t n = 0, m = 0;
    buf[0] = '\0';
    if (api->tok == NULL) {
        snprintf(buf, cap, "token_id:%d", id);
        return;
    }
    gang_tok_decoder_init(&d, api->tok, false);
    if (gang_tokenizer_decode_step(&d, id, buf, cap - 1, &n) != 0)
        n = 0;
    if (gang_tokenizer_decode_flush(&d, buf + n, cap - 1 - n, &m) != 0)
        m = 0;
    buf[n + m] = '\0';
}

/* ------------------------------------------------------------------ logprobs */

static double lp_num(float v)
{
    return isfinite(v) ? v : -9999.0; /* JSON has no -Infinity */
}

static cJSON *bytes_array(const char *t)
{
    cJSON *a = cJSON_CreateArray();
    for (const unsigned char *p = (const unsigned char *)t; *p; p++)
        cJSON_AddItemToArray(a, cJSON_CreateNumber(*p));
    return a;
}

/* Chat's logprobs entry of token i: {token, logprob, bytes, top_logprobs[]}. */
static cJSON *chat_lp_entry(const gang_api *api, const api_seq *s, uint32_t i, char *buf)
{
    cJSON *e = cJSON_CreateObject();
    token_string(api, s->out[i], buf, TOKEN_TEXT_CAP);
    cJSON_AddStringToObject(e, "token", buf);
    cJSON_AddNumberToObject(e, "logprob", lp_num(s->lp[i].logprob));
    cJSON_AddItemToObject(e, "bytes", bytes_array(buf));
    cJSON *top = cJSON_AddArrayToObject(e, "top_logprobs");
    for (uint32_t k = 0; k < s->lp[i].n_top; k++) {
        cJSON *t = cJSON_CreateObject();
        token_string(api, s->lp[i].top_ids[k], buf, TOKEN_TEXT_CAP);
        cJSON_AddStringToObject(t, "token", buf);
        cJSON_AddNumberToObject(t, "logprob", lp_num(s->lp[i].top_lp[k]));
        cJSON_AddItemToObject(t, "bytes", bytes_array(buf));
        cJSON_AddItemToArray(top, t);
    }
    return e;
}

/*
 * The logprobs of tokens [from, to) of s in the call's format: chat {"content": [...]},
 * completions {"tokens", "token_logprobs", "top_logprobs", "text_offset"}; cJSON null
 * when the call did not ask for them.
 */
static cJSON *logprobs_json(const gang_api *api, const api_seq *s, uint32_t from, uint32_t to)
{
    if (!s->call->p.sampling.logprobs || s->lp == NULL)
        return cJSON_CreateNull();
    char *buf = malloc(TOKEN_TEXT_CAP);
    cJSON *o = cJSON_CreateObject();
    if (buf == NULL)
        return o;
    if (s->call->kind == API_CHAT) {
        cJSON *content = cJSON_AddArrayToObject(o, "content");
        for (uint32_t i = from; i < to; i++)
            cJSON_AddItemToArray(content, chat_lp_entry(api, s, i, buf));
        free(buf);
        return o;
    }
    cJSON *toks = cJSON_AddArrayToObject(o, "tokens");
    cJSON *lps = cJSON_AddArrayToObject(o, "token_logprobs");
    cJSON *tops = cJSON_AddArrayToObject(o, "top_logprobs");
    cJSON *offs = cJSON_AddArrayToObject(o, "text_offset");
    for (uint32_t i = from; i < to; i++) {
        token_string(api, s->out[i], buf, TOKEN_TEXT_CAP);
        cJSON_AddItemToArray(toks, cJSON_CreateString(buf));
        cJSON_AddItemToArray(lps, cJSON_CreateNumber(lp_num(s->lp[i].logprob)));
        cJSON *top = cJSON_CreateObject();
        for (uint32_t k = 0; k < s->lp[i].n_top; k++) {
            token_string(api, s->lp[i].top_ids[k], buf, TOKEN_TEXT_CAP);
            if (cJSON_GetObjectItemCaseSensitive(top, buf) == NULL)
                cJSON_AddNumberToObject(top, buf, lp_num(s->lp[i].top_lp[k]));
        }
        cJSON_AddItemToArray(tops, top);
        cJSON_AddItemToArray(offs, cJSON_CreateNumber(s->lp[i].text_off));
    }
    free(buf);
    return o;
}

/* ------------------------------------------------------------------ streaming */

/* A chunk object with the call's id, object, created and model, and choices[]. */
static cJSON *chunk_new(const gang_api *api, const api_call *c, cJSON **choices)
{
    char id[48];
    cJSON *o = cJSON_CreateObject();
    snprintf(id, sizeof(id), "%s-%llu", c->kind == API_CHAT ? "chatcmpl" : "cmpl",
             (unsigned long long)c->id);
    cJSON_AddStringToObject(o, "id", id);
    cJSON_AddStringToObject(o, "object",
                            c->kind == API_CHAT ? "chat.completion.chunk" : "text_completion");
    cJSON_AddNumberToObject(o, "created", (double)c->created);
    cJSON_AddStringToObject(o, "model", api->cfg.model);
    *choices = cJSON_AddArrayToObject(o, "choices");
    return o;
}

/* Sends "data: <o>\n\n" (o consumed); marks the call closed when the client is gone. */
static void sse_send(api_call *c, cJSON *o)
{
    char *text = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    if (c->closed)
        goto out;
    if (text == NULL) {
        c->closed = 1;
        return;
    }
    if (!c->streaming) {
        c->streaming = 1;
        if (gang_http_stream_begin(c->x, 200, "text/event-stream") != 0) {
            c->closed = 1;
            goto out;
        }
    }
    size_t len = strlen(text);
    char *ev = malloc(len + 8);
    if (ev == NULL) {
        c->closed = 1;
        goto out;
    }
    memcpy(ev, "data: ", 6);
    memcpy(ev + 6, text, len);
    memcpy(ev + 6 + len, "\n\n", 2);
    if (gang_http_stream_write(c->x, ev, len + 8) != 0)
        c->closed = 1;
    free(ev);
out:
    cJSON_free(text);
}

/* The message of a chat answer whose text holds tool calls: content (what came before
 * them, or null) and tool_calls; with_index: as stream deltas number them. */
static void tool_message(cJSON *m, const api_seq *s, cJSON *calls, size_t head, int with_index)
{
    char *pre = head > 0 ? strndup(s->text, head) : NULL;
    if (pre != NULL)
        cJSON_AddStringToObject(m, "content", pre);
    else
        cJSON_AddNullToObject(m, "content");
    free(pre);
    cJSON *call;
    int i = 0;
    cJSON_ArrayForEach(call, calls)
    {
        if (with_index)
            cJSON_AddNumberToObject(call, "index", i++);
    }
    cJSON_AddItemToObject(m, "tool_calls", calls);
}

/*
 * A chat stream with tools holds its text back and, at the end, sends either the text
 * (returns 0: the caller streams it) or one delta with the tool calls and finish_reason
 * "tool_calls" (returns 1).
 */
static int stream_tool_calls(gang_api *api, api_seq *s)
{
    api_call *c = s->call;
    size_t head = 0;
    cJSON *calls = gang__api_tool_calls(c, s, &head);
    if (calls == NULL)
        return 0;
    cJSON *choices, *o = chunk_new(api, c, &choices);
    cJSON *ch = cJSON_CreateObject();
    cJSON_AddItemToArray(choices, ch);
    cJSON_AddNumberToObject(ch, "index", s->index);
    cJSON *delta = cJSON_AddObjectToObject(ch, "delta");
    cJSON_AddStringToObject(delta, "role", "assistant");
    tool_message(delta, s, calls, head, 1);
    cJSON *toks = cJSON_AddArrayToObject(ch, "tokens");
    for (uint32_t i = 0; i < s->n_out; i++)
        cJSON_AddItemToArray(toks, cJSON_CreateNumber(s->out[i]));
    cJSON_AddItemToObject(ch, "logprobs", logprobs_json(api, s, 0, s->n_out));
    cJSON_AddStringToObject(ch, "finish_reason", "tool_calls");
    if (c->p.include_usage)
        cJSON_AddNullToObject(o, "usage");
    s->role_sent = 1;
    s->sent_len = s->text_len;
    s->n_lp_sent = s->n_out;
    sse_send(c, o);
    return 1;
}

/*
 * Streams what s has that the client has not: the text that can no longer change (a
 * possible stop-string start is held back unless final) with the tokens it came from; with
 * final, the finish reason too. A chat with tools sends it all at the end
 * (stream_tool_calls).
 */
static void stream_progress(gang_api *api, api_seq *s, int final)
{
    api_call *c = s->call;
    if (c->kind == API_CHAT && c->p.tools_mode != API_TOOLS_OFF &&
        (!final || c->closed || stream_tool_calls(api, s)))
        return;
    size_t safe = final ? s->text_len : s->text_len - stop_holdback(s);
    int has_text = safe > s->sent_len;
    if (c->closed || (!final && !has_text && !(api->tok == NULL && s->n_out > s->n_lp_sent)))
        return;
    cJSON *choices, *o = chunk_new(api, c, &choices);
    cJSON *ch = cJSON_CreateObject();
    cJSON_AddItemToArray(choices, ch);
    cJSON_AddNumberToObject(ch, "index", s->index);
    char *piece = strndup(s->text ? s->text + s->sent_len : "", safe - s->sent_len);
    if (c->kind == API_CHAT) {
        cJSON *delta = cJSON_AddObjectToObject(ch, "delta");
        if (s->sent_len == 0 && s->n_lp_sent == 0 && !s->role_sent)
            cJSON_AddStringToObject(delta, "role", "assistant");
        s->role_sent = 1;
        if (has_text || !final)
            cJSON_AddStringToObject(delta, "content", piece ? piece : "");
    } else if (s->echo != NULL && !s->echo_sent) { /* the echo leads the first chunk */
        size_t el = strlen(s->echo), pl = piece != NULL ? strlen(piece) : 0;
        char *both = malloc(el + pl + 1);
        if (both != NULL) {
            memcpy(both, s->echo, el);
            memcpy(both + el, piece != NULL ? piece : "", pl + 1);
        }
        cJSON_AddStringToObject(ch, "text", both != NULL ? both : "");
        free(both);
        s->echo_sent = 1;
    } else {
        cJSON_AddStringToObject(ch, "text", piece ? piece : "");
    }
    free(piece);
    cJSON *toks = cJSON_AddArrayToObject(ch, "tokens");
    for (uint32_t i = s->n_lp_sent; i < s->n_out; i++)
        cJSON_AddItemToArray(toks, cJSON_CreateNumber(s->out[i]));
    cJSON_AddItemToObject(ch, "logprobs", logprobs_json(api, s, s->n_lp_sent, s->n_out));
    if (final)
        cJSON_AddStringToObject(ch, "finish_reason", s->finish);
    else
        cJSON_AddNullToObject(ch, "finish_reason");
    if (c->p.include_usage)
        cJSON_AddNullToObject(o, "usage");
    s->sent_len = safe;
    s->n_lp_sent = s->n_out;
    sse_send(c, o);
}

/* ------------------------------------------------------------------ tokens */

void gang__api_seq_token(gang_api *api, api_seq *s, int32_t token, const api_lp *lp)
{
    char buf[TOKEN_TEXT_CAP];
    size_t n = 0;
    if (s->lp != NULL) {
        s->lp[s->n_out] = *lp;
        s->lp[s->n_out].text_off = (uint32_t)s->text_len;
    }
    s->out[s->n_out++] = token;
    if (api->tok != NULL && gang_tokenizer_decode_step(&s->dec, token, buf, sizeof(buf), &n) == 0 &&
        (n == 0 || text_append(s, buf, n) == 0) && s->call->p.n_stop_str > 0 && stop_check(s)) {
        s->done = 1;
        gang_strlcpy(s->finish, "stop", sizeof(s->finish));
    }
    if (s->call->p.stream)
        stream_progress(api, s, s->done);
}

void gang__api_seq_finish(gang_api *api, api_seq *s, const char *finish)
{
    char buf[GANG_TOK_DECODE_SLACK];
    size_t n = 0;
    gang_strlcpy(s->finish, finish, sizeof(s->finish));
    if (api->tok != NULL && gang_tokenizer_decode_flush(&s->dec, buf, sizeof(buf), &n) == 0 &&
        n > 0 && text_append(s, buf, n) == 0 && s->call->p.n_stop_str > 0 && stop_check(s))
        gang_strlcpy(s->finish, "stop", sizeof(s->finish));
    s->done = 1;
    if (s->call->p.stream)
        stream_progress(api, s, 1);
}

/* ------------------------------------------------------------------ answers */

/*
 * OpenAI's usage object. prompt_tokens_details.cached_tokens (the prompt tokens the
 * prefix cache gave, summed over the choices) is there when the gang reported it for
 * every choice: a choice ended here by a stop string can be answered before its DONE.
 */
static void add_usage(cJSON *o, const api_call *c)
{
    uint32_t pt = 0, ct = 0, cached = 0;
    int known = 1;
    for (uint32_t i = 0; i < c->n_seqs; i++) {
        pt += c->seqs[i]->choice == 0 ? c->seqs[i]->n_prompt : 0; /* once per prompt */
        ct += c->seqs[i]->n_out;
        cached += c->seqs[i]->n_cached;
        known &= c->seqs[i]->cached_known;
    }
    cJSON *u = cJSON_AddObjectToObject(o, "usage");
    cJSON_AddNumberToObject(u, "prompt_tokens", pt);
    cJSON_AddNumberToObject(u, "completion_tokens", ct);
    cJSON_AddNumberToObject(u, "total_tokens", pt + ct);
    if (known)
        cJSON_AddNumberToObject(cJSON_AddObjectToObject(u, "prompt_tokens_details"),
                                "cached_tokens", cached);
}

/* P/D, a prefill gang's answer: the export of the first sequence's KV blocks, which a
 * router hands to the decode gang as the call's "kv_transfer" (with this gang's
 * address): its id, port and blocks, and the gang's layout (layers, pp, tp; with several
 * nodes "ranks_per_node" and "hosts", each node's address) when rank 0 named it. */
static void add_kv_transfer(const gang_api *api, cJSON *o, const api_call *c)
{
    const api_seq *s = c->seqs[0];
    const gang_kv_layout *l = &s->kv_layout;
    char id[17], host[INET_ADDRSTRLEN];
    if (s->kv_id == 0)
        return;
    snprintf(id, sizeof id, "%016llx", (unsigned long long)s->kv_id);
    cJSON *kv = cJSON_AddObjectToObject(o, "kv_transfer");
    cJSON_AddStringToObject(kv, "id", id);
    cJSON_AddNumberToObject(kv, "port", api->cfg.kv_port);
    cJSON_AddNumberToObject(kv, "blocks", s->kv_blocks);
    if (l->layers == 0 || !gang_kv_layout_valid(l))
        return;
    cJSON_AddNumberToObject(kv, "layers", l->layers);
    cJSON_AddNumberToObject(kv, "pp", l->pp);
    cJSON_AddNumberToObject(kv, "tp", l->tp);
    if (l->n_nodes == 0)
        return;
    cJSON_AddNumberToObject(kv, "ranks_per_node", l->ranks_per_node);
    cJSON *hosts = cJSON_AddArrayToObject(kv, "hosts");
    for (uint32_t i = 0; i < l->n_nodes; i++) {
        struct in_addr a = {.s_addr = l->node_addr[i]};
        if (inet_ntop(AF_INET, &a, host, sizeof host) != NULL)
            cJSON_AddItemToArray(hosts, cJSON_CreateString(host));
    }
}

/* Timings of the first sequence (ganglion's extension of the completions answer). */
static void add_timings(cJSON *o, const api_call *c)
{
    const api_seq *s = c->seqs[0];
    uint64_t now = gang_now_ms();
    double prefill = s->n_out > 0 ? (double)(s->first_ms - s->sent_ms) : 0;
    double decode_s = s->n_out > 1 ? (double)(s->last_ms - s->first_ms) / 1000.0 : 0;
    cJSON *t = cJSON_AddObjectToObject(o, "timings");
    cJSON_AddNumberToObject(t, "queue_ms", (double)(s->sent_ms - c->accepted_ms));
    cJSON_AddNumberToObject(t, "prefill_ms", prefill);
    cJSON_AddNumberToObject(t, "decode_tokens_per_s",
                            decode_s > 0 ? (double)(s->n_out - 1) / decode_s : 0);
    cJSON_AddNumberToObject(t, "total_ms", (double)(now - c->accepted_ms));
    cJSON_AddNumberToObject(t, "generations", s->submissions);
}

/* One choice of the non-streamed answer. */
static cJSON *choice_json(const gang_api *api, const api_seq *s)
{
    cJSON *ch = cJSON_CreateObject();
    cJSON_AddNumberToObject(ch, "index", s->index);
    const char *text = s->text ? s->text : "";
    size_t head = 0;
    cJSON *calls = s->call->kind == API_CHAT ? gang__api_tool_calls(s->call, s, &head) : NULL;
    if (s->call->kind == API_CHAT) {
        cJSON *m = cJSON_AddObjectToObject(ch, "message");
        cJSON_AddStringToObject(m, "role", "assistant");
        if (calls != NULL)
            tool_message(m, s, calls, head, 0);
        else
            cJSON_AddStringToObject(m, "content", text);
    } else if (api->tok != NULL && s->echo != NULL) {
        size_t el = strlen(s->echo), tl = strlen(text);
        char *both = malloc(el + tl + 1);
        if (both != NULL) {
            memcpy(both, s->echo, el);
            memcpy(both + el, text, tl + 1);
        }
        cJSON_AddStringToObject(ch, "text", both != NULL ? both : text);
        free(both);
    } else if (api->tok != NULL) {
        cJSON_AddStringToObject(ch, "text", text);
    } else {
        cJSON_AddNullToObject(ch, "text");
    }
    cJSON *toks = cJSON_AddArrayToObject(ch, "tokens");
    for (uint32_t i = 0; i < s->n_out; i++)
        cJSON_AddItemToArray(toks, cJSON_CreateNumber(s->out[i]));
    cJSON_AddItemToObject(ch, "logprobs", logprobs_json(api, s, 0, s->n_out));
    cJSON_AddStringToObject(ch, "finish_reason", calls != NULL ? "tool_calls" : s->finish);
    return ch;
}

void gang__api_call_answer(gang_api *api, api_call *c)
{
    if (c->p.stream) {
        if (c->p.include_usage && !c->closed) {
            cJSON *choices, *o = chunk_new(api, c, &choices);
            add_usage(o, c);
            sse_send(c, o);
        }
        if (!c->closed)
            (void)gang_http_stream_write(c->x, "data: [DONE]\n\n", 14);
        if (c->streaming)
            gang_http_stream_end(c->x);
        else
            gang_http_reply(c->x, 200, "text/event-stream", "data: [DONE]\n\n", 14);
        return;
    }
    cJSON *choices, *o = chunk_new(api, c, &choices);
    cJSON_ReplaceItemInObject(
        o, "object",
        cJSON_CreateString(c->kind == API_CHAT ? "chat.completion" : "text_completion"));
    for (uint32_t i = 0; i < c->n_seqs; i++)
        cJSON_AddItemToArray(choices, choice_json(api, c->seqs[i]));
    add_usage(o, c);
    add_timings(o, c);
    add_kv_transfer(api, o, c);
    gang__api_json(c->x, 200, o);
}

void gang__api_call_fail(gang_api *api, api_call *c, int status, const char *type, const char *msg)
{
    (void)api;
    cJSON *o = gang__api_error_object(status, type, msg);
    if (!c->streaming) {
        gang__api_json(c->x, status, o);
        return;
    }
    sse_send(c, o);
    if (!c->closed)
        (void)gang_http_stream_write(c->x, "data: [DONE]\n\n", 14);
    gang_http_stream_end(c->x);
}
