/*
 * POST /tokenize and POST /detokenize (vLLM's shapes): the served model's tokenizer and
 * chat template, for clients that count tokens or build prompts themselves.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api-internal.h"

int gang__api_tokenize_answer(gang_api *api, const gang_http_request *req, cJSON **answer,
                              char *err, size_t errcap)
{
    char *text = NULL;
    int32_t *ids = NULL;
    size_t n = 0, nplain = 0;
    gang_tok_range *plain = NULL;
    int rc = -1;
    *answer = NULL;
    cJSON *o = gang__api_parse_body(req, err, errcap);
    if (api->tok == NULL) {
        snprintf(err, errcap, "%s", api->tok_why);
        goto out_bad;
    }
    if (o == NULL || !cJSON_IsObject(o)) {
        snprintf(err, errcap, "the body must be a JSON object");
        goto out_bad;
    }
    const cJSON *prompt = cJSON_GetObjectItemCaseSensitive(o, "prompt");
    const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(o, "messages");
    const cJSON *add = cJSON_GetObjectItemCaseSensitive(o, "add_special_tokens");
    const cJSON *gen = cJSON_GetObjectItemCaseSensitive(o, "add_generation_prompt");
    if ((add != NULL && !cJSON_IsBool(add)) || (gen != NULL && !cJSON_IsBool(gen))) {
        snprintf(err, errcap, "'add_special_tokens' and 'add_generation_prompt' are booleans");
        goto out_bad;
    }
    bool add_special;
    if (cJSON_IsString(prompt) && msgs == NULL) {
        text = strdup(prompt->valuestring);
        add_special = add == NULL || cJSON_IsTrue(add);
    } else if (prompt == NULL && msgs != NULL) {
        if (gang__api_render_chat(api, msgs, gen == NULL || cJSON_IsTrue(gen), NULL, &text, &plain,
                                  &nplain, err, errcap) != 0)
            goto out_bad;
        add_special = cJSON_IsTrue(add);
    } else {
        snprintf(err, errcap, "give either 'prompt' (a string) or 'messages'");
        goto out_bad;
    }
    size_t len = text ? strlen(text) : 0;
    if (!gang__api_text_fits(api, len, "the text", err, errcap))
        goto out_bad;
    size_t cap = len + 16; /* no tokenizer makes more ids than bytes, plus BOS/EOS */
    ids = text ? malloc(cap * sizeof(int32_t)) : NULL;
    if (ids == NULL) {
        snprintf(err, errcap, "out of memory");
        goto out_bad;
    }
    rc = gang_tokenizer_encode_plain(api->tok, text, len, add_special, plain, nplain, ids, cap, &n);
    if (rc != 0) {
        snprintf(err, errcap, "the text cannot be tokenized: %s",
                 rc == GANG_EINVAL ? "it is not valid UTF-8" : gang_strerror(rc));
        goto out_bad;
    }
    cJSON *r = cJSON_CreateObject();
    cJSON_AddNumberToObject(r, "count", (double)n);
    cJSON_AddNumberToObject(r, "max_model_len", api->cfg.ctx);
    cJSON *a = cJSON_AddArrayToObject(r, "tokens");
    for (size_t i = 0; i < n; i++)
        cJSON_AddItemToArray(a, cJSON_CreateNumber(ids[i]));
    *answer = r;
    rc = 0;
    goto out;
out_bad:
    rc = -1;
out:
    cJSON_Delete(o);
    free(text);
    free(plain);
    free(ids);
    return rc;
}

void gang__api_detokenize(gang_api *api, gang_http_exchange *x, const gang_http_request *req)
{
    char err[512];
    int32_t *ids = NULL;
    uint32_t n = 0;
    char *text = NULL;
    cJSON *o = gang__api_parse_body(req, err, sizeof(err));
    if (api->tok == NULL) {
        snprintf(err, sizeof(err), "%s", api->tok_why);
        goto out_bad;
    }
    const cJSON *toks = cJSON_IsObject(o) ? cJSON_GetObjectItemCaseSensitive(o, "tokens") : NULL;
    if (!cJSON_IsArray(toks)) {
        snprintf(err, sizeof(err), "the body must be {\"tokens\": [ids]}");
        goto out_bad;
    }
    if (gang__api_get_id_array(toks, "'tokens'", (uint32_t)gang_tokenizer_n_ids(api->tok),
                               GANG_TOK_MAX_TEXT_BYTES / 4, &ids, &n, err, sizeof(err)) != 0)
        goto out_bad;
    /* Each step writes at most SLACK + 3 x the token's bytes. */
    size_t cap = (size_t)n * (3 * GANG_TOK_MAX_TOKEN_BYTES) + GANG_TOK_DECODE_SLACK, len = 0;
    size_t step_cap = 3 * GANG_TOK_MAX_TOKEN_BYTES + GANG_TOK_DECODE_SLACK;
    text = malloc(cap < (64u << 20) ? cap : (64u << 20));
    if (text == NULL) {
        snprintf(err, sizeof(err), "out of memory");
        goto out_bad;
    }
    if (cap > (64u << 20))
        cap = 64u << 20;
    gang_tok_decoder d;
    gang_tok_decoder_init(&d, api->tok, true);
    for (uint32_t i = 0; i < n; i++) {
        size_t k = 0;
        if (cap - len < step_cap) {
            snprintf(err, sizeof(err), "the text of these tokens is longer than 64 MiB");
            goto out_bad;
        }
        if (gang_tokenizer_decode_step(&d, ids[i], text + len, cap - len, &k) != 0) {
            snprintf(err, sizeof(err), "'tokens'[%u] cannot be decoded", i);
            goto out_bad;
        }
        len += k;
    }
    size_t k = 0;
    if (gang_tokenizer_decode_flush(&d, text + len, cap - len - 1, &k) == 0)
        len += k;
    text[len] = '\0';
    cJSON *r = cJSON_CreateObject();
    cJSON_AddStringToObject(r, "prompt", text);
    gang__api_json(x, 200, r);
    goto out;
out_bad:
    gang__api_error(api, x, 400, "invalid_request_error", "%s", err);
out:
    cJSON_Delete(o);
    free(ids);
    free(text);
}
