/*
 * Request bodies of the generation endpoints (see api-internal.h): the fields every call
 * shares, the prompts of /v1/completions and the messages of /v1/chat/completions. Every
 * bound is checked here, before anything is queued; a bad field is a 400 whose message
 * names it.
 */
#include <arpa/inet.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sodium.h>

#include "api-internal.h"

/* Whether body[i] starts a \u0000 escape (an odd run of backslashes before the u). */
static int nul_escape_at(const char *body, size_t len, size_t i)
{
    size_t k = 0;
    if (i + 6 > len || body[i] != '\\' || body[i + 1] != 'u' || strncmp(body + i + 2, "0000", 4))
        return 0;
    while (k < i && body[i - 1 - k] == '\\')
        k++;
    return k % 2 == 0;
}

cJSON *gang__api_parse_body(const gang_http_request *req, char *err, size_t cap)
{
    const char *end = NULL;
    err[0] = '\0';
    if (memchr(req->body, '\0', req->body_len) != NULL) {
        snprintf(err, cap, "the body holds a NUL byte");
        return NULL;
    }
    cJSON *o = cJSON_ParseWithLengthOpts(req->body, req->body_len, &end, 0);
    if (o == NULL) {
        snprintf(err, cap, "the body is not JSON");
        return NULL;
    }
    /* Only whitespace may follow the value: trailing bytes are refused, not ignored. */
    end += strspn(end, " \t\r\n");
    if (end != req->body + req->body_len) {
        snprintf(err, cap, "the body has %zu bytes after its JSON value",
                 (size_t)(req->body + req->body_len - end));
        cJSON_Delete(o);
        return NULL;
    }
    /* A NUL in a string would cut it silently where C strings end: refused. */
    for (size_t i = 0; i + 6 <= req->body_len; i++) {
        if (nul_escape_at(req->body, req->body_len, i)) {
            snprintf(err, cap,
                     "the body holds a NUL character (\\u0000), which text here cannot "
                     "carry");
            cJSON_Delete(o);
            return NULL;
        }
    }
    return o;
}

int gang__api_get_int(const cJSON *o, const char *name, double lo, double hi, double *v, char *err,
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

/* An optional number in [lo, hi]: 0 absent, 1 read, -1 (message). */
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

/* An optional boolean: 0 absent, 1 read into *v, -1 (message). */
static int get_bool(const cJSON *o, const char *name, int *v, char *err, size_t cap)
{
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(o, name);
    if (f == NULL || cJSON_IsNull(f))
        return 0;
    if (!cJSON_IsBool(f)) {
        snprintf(err, cap, "'%s' must be true or false", name);
        return -1;
    }
    *v = cJSON_IsTrue(f);
    return 1;
}

static int is_id(const cJSON *e, uint32_t vocab)
{
    return cJSON_IsNumber(e) && e->valuedouble == floor(e->valuedouble) && e->valuedouble >= 0 &&
           e->valuedouble < (double)vocab;
}

int gang__api_get_id_array(const cJSON *a, const char *what, uint32_t vocab, uint32_t cap,
                           int32_t **ids, uint32_t *n, char *err, size_t errcap)
{
    *ids = NULL;
    *n = 0;
    int size = cJSON_GetArraySize(a);
    if (size <= 0) {
        snprintf(err, errcap, "%s is empty", what);
        return -1;
    }
    if ((uint32_t)size > cap) {
        snprintf(err, errcap, "%s has %d tokens; the context holds %u", what, size, cap);
        return -1;
    }
    int32_t *v = malloc((size_t)size * sizeof(int32_t));
    if (v == NULL) {
        snprintf(err, errcap, "out of memory");
        return -1;
    }
    const cJSON *e;
    uint32_t i = 0;
    cJSON_ArrayForEach(e, a)
    {
        if (!is_id(e, vocab)) {
            snprintf(err, errcap, "%s[%u] is not a token id in [0, %u)", what, i, vocab);
            free(v);
            return -1;
        }
        v[i++] = (int32_t)e->valuedouble;
    }
    *ids = v;
    *n = i;
    return 0;
}

/* "stop" (a string, or an array of strings and / or ids) and "stop_token_ids". */
static int parse_stop(gang_api *api, const cJSON *o, api_params *p, char *err, size_t cap)
{
    const char *names[] = {"stop", "stop_token_ids"};
    for (int k = 0; k < 2; k++) {
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(o, names[k]);
        if (f == NULL || cJSON_IsNull(f))
            continue;
        if (!cJSON_IsArray(f) && !(k == 0 && cJSON_IsString(f))) {
            snprintf(err, cap, "'%s' must be %s", names[k],
                     k == 0 ? "a string or an array of strings (or token ids)"
                            : "an array of token ids");
            return -1;
        }
        const cJSON *e = cJSON_IsString(f) ? f : f->child;
        for (; e != NULL; e = cJSON_IsString(f) ? NULL : e->next) {
            if (k == 0 && cJSON_IsString(e)) {
                size_t len = strlen(e->valuestring);
                if (len == 0 || len > API_MAX_STOP_BYTES || p->n_stop_str >= API_MAX_STOP_STRINGS) {
                    snprintf(err, cap, "'stop' takes at most %d strings of 1 to %d bytes",
                             API_MAX_STOP_STRINGS, API_MAX_STOP_BYTES);
                    return -1;
                }
                if (api->tok == NULL) {
                    snprintf(err, cap, "stop strings need the model's tokenizer: %s", api->tok_why);
                    return -1;
                }
                memcpy(p->stop_str[p->n_stop_str], e->valuestring, len + 1);
                p->stop_len[p->n_stop_str++] = len;
            } else if (is_id(e, api->cfg.mc.vocab) && p->sampling.n_stop < GANG_MAX_STOP_TOKENS) {
                p->sampling.stop[p->sampling.n_stop++] = (int32_t)e->valuedouble;
            } else {
                snprintf(err, cap, "'%s' holds something that is not %s (at most %d ids below %u)",
                         names[k], k == 0 ? "a string or a token id" : "a token id",
                         GANG_MAX_STOP_TOKENS, api->cfg.mc.vocab);
                return -1;
            }
        }
    }
    return 0;
}

/* logprobs: completions take an integer (alternatives), chat a boolean + top_logprobs. */
static int parse_logprobs(const cJSON *o, api_kind kind, api_params *p, char *err, size_t cap)
{
    double v;
    int g, b = 0;
    if (kind == API_COMPLETION) {
        if ((g = gang__api_get_int(o, "logprobs", 0, GANG_MAX_TOP_LOGPROBS, &v, err, cap)) < 0)
            return -1;
        if (g > 0) {
            p->sampling.logprobs = 1;
            p->sampling.top_logprobs = (uint32_t)v;
        }
        return 0;
    }
    if ((g = get_bool(o, "logprobs", &b, err, cap)) < 0)
        return -1;
    p->sampling.logprobs = (uint32_t)b;
    if ((g = gang__api_get_int(o, "top_logprobs", 0, GANG_MAX_TOP_LOGPROBS, &v, err, cap)) < 0)
        return -1;
    if (g > 0 && !p->sampling.logprobs) {
        snprintf(err, cap, "'top_logprobs' needs 'logprobs': true");
        return -1;
    }
    if (g > 0)
        p->sampling.top_logprobs = (uint32_t)v;
    return 0;
}

/* Sampling fields, with the model's generation_config.json for the ones a call omits. */
static int parse_sampling(gang_api *api, const cJSON *o, gang_sampling *s, char *err, size_t cap)
{
    const gang_gen_defaults *d = &api->cfg.mc.gen;
    double v;
    int g;
    s->temperature = d->has_temperature ? d->temperature : 0.0f;
    s->top_p = d->has_top_p ? d->top_p : 1.0f;
    s->top_k = d->has_top_k ? d->top_k : 0;
    s->repetition_penalty = d->has_repetition_penalty ? d->repetition_penalty : 0.0f;
    if ((g = get_num(o, "temperature", 0, 100, &v, err, cap)) < 0)
        return -1;
    if (g > 0)
        s->temperature = (float)v;
    if ((g = gang__api_get_int(o, "top_k", -1, api->cfg.mc.vocab, &v, err, cap)) < 0)
        return -1;
    if (g > 0)
        s->top_k = v < 0 ? 0 : (uint32_t)v;
    if ((g = get_num(o, "top_p", 1e-6, 1, &v, err, cap)) < 0)
        return -1;
    if (g > 0)
        s->top_p = (float)v;
    if ((g = get_num(o, "presence_penalty", -2, 2, &v, err, cap)) < 0)
        return -1;
    s->presence_penalty = g > 0 ? (float)v : 0.0f;
    if ((g = get_num(o, "frequency_penalty", -2, 2, &v, err, cap)) < 0)
        return -1;
    s->frequency_penalty = g > 0 ? (float)v : 0.0f;
    if ((g = get_num(o, "repetition_penalty", 0.01, 10, &v, err, cap)) < 0)
        return -1;
    if (g > 0)
        s->repetition_penalty = (float)v;
    if ((g = gang__api_get_int(o, "seed", 0, 9007199254740991.0, &v, err, cap)) < 0)
        return -1;
    /* Without a seed, a random one: fixed for the call, so a re-run draws the same tokens. */
    s->seed = g > 0 ? (uint64_t)v : (randombytes_random() | (uint64_t)randombytes_random() << 21);
    return 0;
}

/* Fields OpenAI defines that this server refuses rather than ignores. */
static int refuse_unsupported(const cJSON *o, char *err, size_t cap)
{
    double v;
    int g;
    if ((g = gang__api_get_int(o, "best_of", 1, 1, &v, err, cap)) < 0) {
        snprintf(err, cap, "'best_of' must be 1 ('n' gives several choices)");
        return -1;
    }
    const cJSON *suffix = cJSON_GetObjectItemCaseSensitive(o, "suffix");
    if (suffix != NULL && !cJSON_IsNull(suffix)) {
        snprintf(err, cap, "'suffix' is not supported");
        return -1;
    }
    return 0;
}

/*
 * kv_transfer's optional layout of the prefill gang: "layers", "pp", "tp" (all or none),
 * and with several nodes "ranks_per_node" and "hosts" (each node's IPv4 address, at most
 * GANG_KV_NODES_MAX, as many as its ranks need). Bounded and consistent
 * (gang_kv_layout_valid); whether it fits this gang's model is rank 0's to say. 0, or -1
 * with the reason in err.
 */
static int parse_kv_layout(const cJSON *kv, gang_kv_layout *l, char *err, size_t cap)
{
    double layers = 0, pp = 0, tp = 0, rpn = 0;
    const cJSON *hosts = cJSON_GetObjectItemCaseSensitive(kv, "hosts");
    int got = get_num(kv, "layers", 1, 65535, &layers, err, cap);
    memset(l, 0, sizeof(*l));
    if (got < 0 || get_num(kv, "pp", 1, GANG_KV_RANKS_MAX, &pp, err, cap) < 0 ||
        get_num(kv, "tp", 1, GANG_KV_RANKS_MAX, &tp, err, cap) < 0 ||
        get_num(kv, "ranks_per_node", 1, GANG_KV_RANKS_MAX, &rpn, err, cap) < 0)
        return -1;
    if (got == 0 && pp == 0 && tp == 0 && rpn == 0 && hosts == NULL)
        return 0; /* no layout: the prefill gang's is the decode gang's */
    l->layers = (uint32_t)layers;
    l->pp = (uint32_t)pp;
    l->tp = (uint32_t)tp;
    l->ranks_per_node = (uint32_t)rpn;
    if (hosts != NULL && !cJSON_IsNull(hosts)) {
        if (!cJSON_IsArray(hosts) || cJSON_GetArraySize(hosts) > (int)GANG_KV_NODES_MAX)
            goto out_bad;
        const cJSON *h;
        cJSON_ArrayForEach(h, hosts)
        {
            struct in_addr a;
            if (!cJSON_IsString(h) || inet_pton(AF_INET, h->valuestring, &a) != 1)
                goto out_bad;
            l->node_addr[l->n_nodes++] = a.s_addr;
        }
    }
    if (l->layers != layers || l->pp != pp || l->tp != tp || l->ranks_per_node != rpn ||
        l->layers == 0 || !gang_kv_layout_valid(l) || (l->n_nodes == 0) != (rpn == 0))
        goto out_bad;
    return 0;
out_bad:
    snprintf(err, cap,
             "kv_transfer: \"layers\", \"pp\", \"tp\": whole numbers with 1 <= pp <= layers "
             "and pp x tp <= %u; \"hosts\": at most %u IPv4 addresses, one per node of "
             "\"ranks_per_node\" ranks (set by a router)",
             GANG_KV_RANKS_MAX, GANG_KV_NODES_MAX);
    return -1;
}

/*
 * "kv_transfer" (P/D, set by a router, issue #26): {"id": 16 hex digits, "host": an IPv4
 * address, "port": the prefill gang's --kv-port, "blocks": its full prompt blocks, and
 * the prefill gang's layout (parse_kv_layout)}. The decode gang fetches those blocks
 * before prefilling the rest (a fetch that fails only costs the prefill). 0, or -1 with
 * the reason in err.
 */
static int parse_kv_transfer(const cJSON *o, api_params *p, char *err, size_t cap)
{
    const cJSON *kv = cJSON_GetObjectItemCaseSensitive(o, "kv_transfer");
    if (kv == NULL || cJSON_IsNull(kv))
        return 0;
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(kv, "id");
    const cJSON *host = cJSON_GetObjectItemCaseSensitive(kv, "host");
    double port = 0, blocks = 0;
    char *end = NULL;
    if (!cJSON_IsObject(kv) || !cJSON_IsString(id) || strlen(id->valuestring) != 16 ||
        !cJSON_IsString(host) || strlen(host->valuestring) >= GANG_KV_HOST_MAX ||
        get_num(kv, "port", 1, 65535, &port, err, cap) <= 0 ||
        get_num(kv, "blocks", 1, 1 << 24, &blocks, err, cap) <= 0) {
        snprintf(err, cap,
                 "kv_transfer: an object {\"id\": 16 hex digits, \"host\", "
                 "\"port\", \"blocks\"} (set by a router)");
        return -1;
    }
    p->kv.id = strtoull(id->valuestring, &end, 16);
    if (end == NULL || *end != '\0' || p->kv.id == 0) {
        snprintf(err, cap, "kv_transfer.id: 16 hex digits, not 0");
        return -1;
    }
    p->kv.port = (uint32_t)port;
    p->kv.blocks = (uint32_t)blocks;
    gang_strlcpy(p->kv.host, host->valuestring, sizeof(p->kv.host));
    return parse_kv_layout(kv, &p->kv.src, err, cap);
}

int gang__api_parse_params(gang_api *api, const cJSON *o, api_kind kind, api_params *p, char *err,
                           size_t cap)
{
    double v;
    int g, b;
    memset(p, 0, sizeof(*p));
    p->skip_special = 1;
    if (refuse_unsupported(o, err, cap) != 0)
        return -1;
    const char *mt = "max_tokens";
    if (kind == API_CHAT && cJSON_GetObjectItemCaseSensitive(o, "max_completion_tokens") != NULL)
        mt = "max_completion_tokens";
    if ((g = gang__api_get_int(o, mt, 1, api->cfg.ctx, &v, err, cap)) < 0)
        return -1;
    p->max_tokens = g > 0 ? (uint32_t)v : API_DEFAULT_MAX_TOKENS;
    if ((g = gang__api_get_int(o, "n", 1, API_MAX_CHOICES, &v, err, cap)) < 0)
        return -1;
    p->n_choices = g > 0 ? (uint32_t)v : 1;
    if (parse_sampling(api, o, &p->sampling, err, cap) != 0 || parse_stop(api, o, p, err, cap) ||
        parse_logprobs(o, kind, p, err, cap) != 0 ||
        gang__api_parse_constraints(api, o, p, err, cap) != 0 ||
        gang__api_parse_tools(api, o, kind, p, err, cap) != 0)
        return -1;
    if (parse_kv_transfer(o, p, err, cap) != 0)
        return -1;
    if ((g = get_bool(o, "stream", &b, err, cap)) < 0)
        return -1;
    p->stream = g > 0 && b;
    const cJSON *so = cJSON_GetObjectItemCaseSensitive(o, "stream_options");
    if (so != NULL && !cJSON_IsNull(so)) {
        if (!cJSON_IsObject(so) || get_bool(so, "include_usage", &b, err, cap) < 0) {
            snprintf(err, cap, "'stream_options' must be {\"include_usage\": true|false}");
            return -1;
        }
        p->include_usage = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(so, "include_usage"));
    }
    if ((g = get_bool(o, "ignore_eos", &b, err, cap)) < 0)
        return -1;
    p->sampling.ignore_eos = g > 0 && b;
    if ((g = get_bool(o, "skip_special_tokens", &b, err, cap)) < 0)
        return -1;
    if (g > 0)
        p->skip_special = b;
    if ((g = get_bool(o, "echo", &b, err, cap)) < 0)
        return -1;
    p->echo = g > 0 && b;
    if (p->echo && (kind != API_COMPLETION || p->sampling.logprobs)) {
        snprintf(err, cap,
                 "'echo' is for /v1/completions without logprobs (the prompt's "
                 "logprobs are not computed)");
        return -1;
    }
    return 0;
}

/* Appends choice `choice` of a prompt, with its ids (taken), to c; checks it against the
 * context. */
static int add_one(gang_api *api, api_call *c, int32_t *ids, uint32_t n, uint32_t choice, char *err,
                   size_t cap)
{
    uint32_t ctx = api->cfg.ctx;
    api_seq *s = NULL;
    if (n == 0 || n >= ctx) {
        snprintf(err, cap,
                 n == 0 ? "the prompt is empty"
                        : "the prompt has %u tokens; the context "
                          "holds %u (prompt + at least one token)",
                 n, ctx);
        goto out_fail;
    }
    uint32_t max = c->p.max_tokens != 0 ? c->p.max_tokens : ctx - n;
    if (max > ctx - n) {
        snprintf(err, cap, "prompt (%u tokens) + max_tokens (%u) exceed the context of %u", n, max,
                 ctx);
        goto out_fail;
    }
    uint32_t wire = n;
    if (c->p.grammar != NULL) { /* its words travel after the prompt (gang_gen_request) */
        uint32_t gw = GANG_GRAMMAR_WORDS(c->p.sampling.grammar_bytes);
        int32_t *w = realloc(ids, ((size_t)n + gw) * sizeof(int32_t));
        if (w == NULL) {
            snprintf(err, cap, "out of memory");
            goto out_fail;
        }
        ids = w;
        gang_req_grammar_pack(c->p.grammar, c->p.sampling.grammar_bytes, ids + n);
        wire = n + gw;
    }
    api_seq **seqs = realloc(c->seqs, (c->n_seqs + 1) * sizeof(*seqs));
    s = calloc(1, sizeof(*s));
    if (seqs == NULL || s == NULL) {
        if (seqs != NULL)
            c->seqs = seqs;
        snprintf(err, cap, "out of memory");
        goto out_fail;
    }
    c->seqs = seqs;
    s->call = c;
    s->index = c->n_seqs;
    s->prompt = ids;
    s->n_prompt = n;
    s->n_wire = wire;
    s->choice = choice;
    s->max_tokens = max;
    s->out = malloc((size_t)max * sizeof(int32_t));
    s->lp = c->p.sampling.logprobs ? malloc((size_t)max * sizeof(api_lp)) : NULL;
    c->seqs[c->n_seqs++] = s;
    if (s->out == NULL || (c->p.sampling.logprobs && s->lp == NULL)) {
        snprintf(err, cap, "out of memory");
        return -1; /* s belongs to c now */
    }
    return 0;
out_fail:
    free(ids);
    free(s);
    return -1;
}

/* Appends the call's n choices of one prompt (ids taken), each its own sequence. */
static int add_seq(gang_api *api, api_call *c, int32_t *ids, uint32_t n, char *err, size_t cap)
{
    uint32_t k = c->p.n_choices > 0 ? c->p.n_choices : 1;
    if (c->n_seqs + k > API_MAX_SEQS) {
        snprintf(err, cap, "prompts x n exceed %d choices", API_MAX_SEQS);
        free(ids);
        return -1;
    }
    for (uint32_t j = 0; j + 1 < k; j++) {
        int32_t *copy = malloc((size_t)n * sizeof(int32_t) + 1);
        if (copy == NULL) {
            snprintf(err, cap, "out of memory");
            free(ids);
            return -1;
        }
        memcpy(copy, ids, (size_t)n * sizeof(int32_t));
        if (add_one(api, c, copy, n, j, err, cap) != 0) {
            free(ids);
            return -1;
        }
    }
    return add_one(api, c, ids, n, k - 1, err, cap);
}

int gang__api_text_fits(const gang_api *api, size_t len, const char *what, char *err, size_t cap)
{
    if (len <= api->text_max)
        return 1;
    snprintf(err, cap,
             "%s has %zu bytes: more than the context of %u tokens can hold (at most %zu bytes "
             "here, checked before tokenizing)",
             what, len, api->cfg.ctx, api->text_max);
    return 0;
}

/* Encodes text into a malloc'd id array (at most the context); 0, or -1 (message). */
static int encode_text(gang_api *api, const char *text, size_t len, bool add_special,
                       const gang_tok_range *plain, size_t nplain, int32_t **ids, uint32_t *n,
                       char *err, size_t cap)
{
    size_t got = 0;
    *ids = NULL;
    if (api->tok == NULL) {
        snprintf(err, cap, "text prompts need the model's tokenizer: %s", api->tok_why);
        return -1;
    }
    if (!gang__api_text_fits(api, len, "the prompt", err, cap))
        return -1;
    int32_t *v = malloc((size_t)api->cfg.ctx * sizeof(int32_t));
    if (v == NULL) {
        snprintf(err, cap, "out of memory");
        return -1;
    }
    int rc = gang_tokenizer_encode_plain(api->tok, text, len, add_special, plain, nplain, v,
                                         api->cfg.ctx, &got);
    if (rc != 0) {
        free(v);
        if (rc == GANG_ERANGE)
            snprintf(err, cap, "the prompt has %zu tokens; the context holds %u", got,
                     api->cfg.ctx);
        else
            snprintf(err, cap, "the prompt cannot be tokenized: %s",
                     rc == GANG_EINVAL ? "it is not valid UTF-8" : gang_strerror(rc));
        return -1;
    }
    *ids = v;
    *n = (uint32_t)got;
    return 0;
}

/* The text of ids[0..n) (special tokens kept), malloc'd, or NULL without a tokenizer. */
static char *decode_ids(const gang_api *api, const int32_t *ids, uint32_t n)
{
    gang_tok_decoder d;
    size_t cap = 64, len = 0, k = 0;
    char *out = api->tok != NULL ? malloc(cap) : NULL, piece[3 * 4096 + GANG_TOK_DECODE_SLACK];
    if (out == NULL)
        return NULL;
    gang_tok_decoder_init(&d, api->tok, false);
    for (uint32_t i = 0; i <= n; i++) {
        int rc = i < n ? gang_tokenizer_decode_step(&d, ids[i], piece, sizeof(piece), &k)
                       : gang_tokenizer_decode_flush(&d, piece, sizeof(piece), &k);
        if (rc != 0)
            k = 0;
        if (len + k + 1 > cap) {
            while (len + k + 1 > cap)
                cap *= 2;
            char *t = realloc(out, cap);
            if (t == NULL) {
                free(out);
                return NULL;
            }
            out = t;
        }
        memcpy(out + len, piece, k);
        len += k;
    }
    out[len] = '\0';
    return out;
}

/* One element of "prompt": a string or an array of ids. */
static int prompt_one(gang_api *api, const cJSON *e, api_call *c, char *err, size_t cap)
{
    int32_t *ids = NULL;
    uint32_t n = 0;
    if (cJSON_IsString(e)) {
        if (encode_text(api, e->valuestring, strlen(e->valuestring), true, NULL, 0, &ids, &n, err,
                        cap))
            return -1;
    } else if (cJSON_IsArray(e)) {
        if (gang__api_get_id_array(e, "'prompt'", api->cfg.mc.vocab, api->cfg.ctx, &ids, &n, err,
                                   cap) != 0)
            return -1;
    } else {
        snprintf(err, cap,
                 "'prompt' must be a string, an array of token ids, or an array of "
                 "strings or of token id arrays");
        return -1;
    }
    char *echo = !c->p.echo          ? NULL
                 : cJSON_IsString(e) ? strdup(e->valuestring)
                                     : decode_ids(api, ids, n);
    uint32_t first = c->n_seqs;
    int rc = add_seq(api, c, ids, n, err, cap);
    for (uint32_t i = first; rc == 0 && echo != NULL && i < c->n_seqs; i++) {
        c->seqs[i]->echo = strdup(echo);
        if (c->seqs[i]->echo == NULL) {
            snprintf(err, cap, "out of memory");
            rc = -1;
        }
    }
    free(echo);
    return rc;
}

static int chat_prompt(gang_api *api, const cJSON *o, api_call *c, char *err, size_t cap)
{
    const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(o, "messages");
    int add_gen = 1;
    char *text = NULL;
    int32_t *ids = NULL;
    uint32_t n = 0;
    if (get_bool(o, "add_generation_prompt", &add_gen, err, cap) < 0)
        return -1;
    gang_tok_range *plain = NULL;
    size_t nplain = 0;
    if (gang__api_render_chat(api, msgs, add_gen, c->p.tools_json, &text, &plain, &nplain, err,
                              cap) != 0)
        return -1;
    int rc = encode_text(api, text, strlen(text), false, plain, nplain, &ids, &n, err, cap);
    free(text);
    free(plain);
    return rc != 0 ? -1 : add_seq(api, c, ids, n, err, cap);
}

int gang__api_parse_prompts(gang_api *api, const cJSON *o, api_call *c, char *err, size_t cap)
{
    if (c->kind == API_CHAT)
        return chat_prompt(api, o, c, err, cap);
    const cJSON *pr = cJSON_GetObjectItemCaseSensitive(o, "prompt");
    if (pr == NULL || cJSON_IsNull(pr)) {
        snprintf(err, cap, "'prompt' (a string or an array of token ids) is required");
        return -1;
    }
    if (!cJSON_IsArray(pr) || cJSON_GetArraySize(pr) == 0 || cJSON_IsNumber(pr->child))
        return prompt_one(api, pr, c, err, cap);
    if (cJSON_GetArraySize(pr) > API_MAX_PROMPTS) {
        snprintf(err, cap, "'prompt' holds more than %d prompts", API_MAX_PROMPTS);
        return -1;
    }
    const cJSON *e;
    cJSON_ArrayForEach(e, pr)
    {
        if (prompt_one(api, e, c, err, cap) != 0)
            return -1;
    }
    return 0;
}

/* The text of a message's content: a string, null, or text parts joined by newlines. */
static int content_text(const cJSON *content, uint32_t i, char **out, char *err, size_t cap)
{
    *out = NULL;
    if (content == NULL || cJSON_IsNull(content)) {
        *out = strdup("");
    } else if (cJSON_IsString(content)) {
        *out = strdup(content->valuestring);
    } else if (cJSON_IsArray(content)) {
        size_t len = 0, at = 0;
        const cJSON *part;
        cJSON_ArrayForEach(part, content)
        {
            const cJSON *type = cJSON_GetObjectItemCaseSensitive(part, "type");
            const cJSON *text = cJSON_GetObjectItemCaseSensitive(part, "text");
            if (!cJSON_IsString(type) || strcmp(type->valuestring, "text") != 0 ||
                !cJSON_IsString(text)) {
                snprintf(err, cap,
                         "'messages'[%u].content: only {\"type\": \"text\", \"text\": "
                         "...} parts are supported",
                         i);
                return -1;
            }
            len += strlen(text->valuestring) + 1;
        }
        *out = malloc(len + 1);
        if (*out != NULL) {
            cJSON_ArrayForEach(part, content)
            {
                const char *t = cJSON_GetObjectItemCaseSensitive(part, "text")->valuestring;
                if (at > 0)
                    (*out)[at++] = '\n';
                memcpy(*out + at, t, strlen(t));
                at += strlen(t);
            }
            (*out)[at] = '\0';
        }
    } else {
        snprintf(err, cap, "'messages'[%u].content must be a string or an array of text parts", i);
        return -1;
    }
    if (*out == NULL) {
        snprintf(err, cap, "out of memory");
        return -1;
    }
    return 0;
}

/* Whether role is one OpenAI defines (another is refused, not rendered verbatim). */
static int role_known(const char *role)
{
    static const char *const roles[] = {"system", "developer", "user", "assistant", "tool"};
    for (size_t i = 0; i < sizeof(roles) / sizeof(roles[0]); i++)
        if (strcmp(role, roles[i]) == 0)
            return 1;
    return 0;
}

/* An assistant's tool_calls as templates read them: {"type", "id", "function": {"name",
 * "arguments"}} with arguments parsed when they are a JSON object (transformers' habit). */
static cJSON *history_calls(const cJSON *calls)
{
    cJSON *out = cJSON_Duplicate(calls, 1);
    cJSON *call;
    cJSON_ArrayForEach(call, out)
    {
        cJSON *fn = cJSON_GetObjectItemCaseSensitive(call, "function");
        cJSON *args = cJSON_GetObjectItemCaseSensitive(fn, "arguments");
        cJSON *parsed = cJSON_IsString(args) ? cJSON_Parse(args->valuestring) : NULL;
        if (cJSON_IsObject(parsed))
            cJSON_ReplaceItemInObject(fn, "arguments", parsed);
        else
            cJSON_Delete(parsed);
    }
    return out;
}

/* The messages as the template sees them: {role, content string[, name, tool_calls,
 * tool_call_id]} each. */
static cJSON *normalize_messages(const cJSON *msgs, char *err, size_t cap)
{
    cJSON *arr = cJSON_CreateArray();
    const cJSON *m;
    uint32_t i = 0;
    cJSON_ArrayForEach(m, msgs)
    {
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(m, "name");
        const cJSON *calls = cJSON_GetObjectItemCaseSensitive(m, "tool_calls");
        const cJSON *call_id = cJSON_GetObjectItemCaseSensitive(m, "tool_call_id");
        char *text = NULL;
        if (!cJSON_IsObject(m) || !cJSON_IsString(role) || !role_known(role->valuestring)) {
            snprintf(err, cap,
                     "'messages'[%u] must be an object with a 'role' of system, developer, "
                     "user, assistant or tool",
                     i);
            goto out_fail;
        }
        if (calls != NULL && !cJSON_IsNull(calls) && !cJSON_IsArray(calls)) {
            snprintf(err, cap, "'messages'[%u].tool_calls must be an array", i);
            goto out_fail;
        }
        if (content_text(cJSON_GetObjectItemCaseSensitive(m, "content"), i, &text, err, cap))
            goto out_fail;
        cJSON *n = cJSON_CreateObject();
        cJSON_AddItemToArray(arr, n);
        cJSON_AddStringToObject(n, "role", role->valuestring);
        cJSON_AddStringToObject(n, "content", text);
        free(text);
        if (cJSON_IsString(name))
            cJSON_AddStringToObject(n, "name", name->valuestring);
        if (cJSON_IsArray(calls))
            cJSON_AddItemToObject(n, "tool_calls", history_calls(calls));
        if (cJSON_IsString(call_id))
            cJSON_AddStringToObject(n, "tool_call_id", call_id->valuestring);
        i++;
    }
    return arr;
out_fail:
    cJSON_Delete(arr);
    return NULL;
}

int gang__api_render_chat(gang_api *api, const cJSON *messages, int add_generation_prompt,
                          const char *tools_json, char **text, gang_tok_range **plain,
                          size_t *nplain, char *err, size_t cap)
{
    char why[512];
    size_t len = 0;
    api_shield sh;
    *text = NULL;
    *plain = NULL;
    *nplain = 0;
    if (api->tpl == NULL || api->tok == NULL) {
        snprintf(err, cap, "chat needs the model's chat template and tokenizer: %s",
                 api->tpl == NULL ? api->tpl_why : api->tok_why);
        return -1;
    }
    if (!cJSON_IsArray(messages) || cJSON_GetArraySize(messages) == 0 ||
        cJSON_GetArraySize(messages) > API_MAX_MESSAGES) {
        snprintf(err, cap, "'messages' must be an array of 1 to %d messages", API_MAX_MESSAGES);
        return -1;
    }
    /* The contents' bytes bound the text before anything is copied or rendered. */
    size_t bytes = 0;
    const cJSON *m, *part;
    cJSON_ArrayForEach(m, messages)
    {
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(m, "content");
        const cJSON *parts = cJSON_IsArray(content) ? content : NULL;
        if (cJSON_IsString(content))
            bytes += strlen(content->valuestring);
        cJSON_ArrayForEach(part, parts)
        {
            const cJSON *t = cJSON_GetObjectItemCaseSensitive(part, "text");
            bytes += cJSON_IsString(t) ? strlen(t->valuestring) : 0;
        }
    }
    if (!gang__api_text_fits(api, bytes, "'messages'", err, cap))
        return -1;
    cJSON *norm = normalize_messages(messages, err, cap);
    if (norm == NULL)
        return -1;
    /* The client's strings keep their special-token text as text (api-chat.c). */
    char *json = cJSON_PrintUnformatted(norm);
    int src = json == NULL ? GANG_ENOMEM : gang__api_shield_begin(api, &sh, json, tools_json);
    cJSON_free(json);
    json = NULL;
    if (src == 0 && (src = gang__api_shield_tree(api, &sh, norm)) == 0)
        json = cJSON_PrintUnformatted(norm);
    cJSON_Delete(norm);
    if (json == NULL) {
        snprintf(err, cap, "%s",
                 src == GANG_ERANGE ? "'messages' hold too much special-token text"
                                    : "out of memory");
        return -1;
    }
    if (!gang__api_text_fits(api, strlen(json), "'messages'", err, cap)) {
        cJSON_free(json);
        return -1;
    }
    gang_chat_render_opts ro = {.add_generation_prompt = add_generation_prompt};
    char *extra = NULL;
    char *tools_shielded = NULL;
    if (tools_json != NULL && (tools_shielded = gang__api_shield_text(api, &sh, tools_json)))
        tools_json = tools_shielded;
    if (tools_json != NULL) { /* the template's `tools` */
        size_t tl = strlen(tools_json);
        extra = malloc(tl + 16);
        if (extra == NULL) {
            cJSON_free(json);
            cJSON_free(tools_shielded);
            snprintf(err, cap, "out of memory");
            return -1;
        }
        snprintf(extra, tl + 16, "{\"tools\":%s}", tools_json);
        ro.extra_json = extra;
        ro.extra_len = strlen(extra);
    }
    int rc = gang_chat_render(api->tpl, json, strlen(json), &ro, text, &len, why, sizeof(why));
    cJSON_free(json);
    cJSON_free(tools_shielded);
    free(extra);
    if (rc != 0) {
        snprintf(err, cap, "the chat template refused the messages: %s", why);
        return -1;
    }
    if (gang__api_shield_end(api, &sh, text, plain, nplain, err, cap) != 0) {
        free(*text);
        *text = NULL;
        return -1;
    }
    return 0;
}
