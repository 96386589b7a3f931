/*
 * The fields of a generation call that constrain what may be generated (see
 * api-internal.h): "response_format" (structured outputs: a JSON schema, or any JSON
 * object, compiled here into the grammar the sampling rank enforces) and "logit_bias".
 * A grammar is compiled once here to refuse what it cannot enforce with a 400 naming
 * the keyword; the text that travels is the schema itself (compact), which the
 * sampling rank compiles again the same way.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api-internal.h"

int gang__api_set_grammar(gang_api *api, api_params *p, const cJSON *schema, const char *what,
                          char *err, size_t cap)
{
    char why[256];
    gang_jgram *g = NULL;
    if (api->tok == NULL) {
        snprintf(err, cap, "%s needs the model's tokenizer: %s", what, api->tok_why);
        return -1;
    }
    char *text = cJSON_PrintUnformatted(schema);
    if (text == NULL) {
        snprintf(err, cap, "out of memory");
        return -1;
    }
    size_t len = strlen(text);
    int rc = gang_jgram_compile(text, len, &g, why, sizeof(why));
    gang_jgram_free(g);
    if (rc != 0 || len > GANG_GRAMMAR_MAX_BYTES) {
        snprintf(err, cap, "%s: %s", what, rc == 0 ? "the schema is longer than 16384 bytes" : why);
        cJSON_free(text);
        return -1;
    }
    free(p->grammar);
    p->grammar = strdup(text);
    cJSON_free(text);
    if (p->grammar == NULL) {
        snprintf(err, cap, "out of memory");
        return -1;
    }
    p->sampling.grammar_bytes = (uint32_t)len;
    return 0;
}

/* response_format: {"type": "text" | "json_object" | "json_schema", "json_schema": {...}}. */
static int parse_format(gang_api *api, const cJSON *o, api_params *p, char *err, size_t cap)
{
    const cJSON *rf = cJSON_GetObjectItemCaseSensitive(o, "response_format");
    if (rf == NULL || cJSON_IsNull(rf))
        return 0;
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(rf, "type");
    if (!cJSON_IsObject(rf) || !cJSON_IsString(type)) {
        snprintf(err, cap, "'response_format' must be an object with a 'type'");
        return -1;
    }
    if (strcmp(type->valuestring, "text") == 0)
        return 0;
    if (strcmp(type->valuestring, "json_object") == 0) {
        cJSON *any = cJSON_Parse("{\"type\":\"object\"}");
        int rc =
            any != NULL ? gang__api_set_grammar(api, p, any, "'response_format'", err, cap) : -1;
        cJSON_Delete(any);
        return rc;
    }
    if (strcmp(type->valuestring, "json_schema") != 0) {
        snprintf(err, cap,
                 "'response_format.type' must be 'text', 'json_object' or 'json_schema', not "
                 "'%.64s'",
                 type->valuestring);
        return -1;
    }
    const cJSON *js = cJSON_GetObjectItemCaseSensitive(rf, "json_schema");
    const cJSON *schema = cJSON_GetObjectItemCaseSensitive(js, "schema");
    const cJSON *strict = cJSON_GetObjectItemCaseSensitive(js, "strict");
    if (!cJSON_IsObject(js) || !cJSON_IsObject(schema)) {
        snprintf(err, cap,
                 "'response_format.json_schema' must be an object with a 'schema' "
                 "object");
        return -1;
    }
    if (strict != NULL && !cJSON_IsNull(strict) && !cJSON_IsBool(strict)) {
        snprintf(err, cap, "'response_format.json_schema.strict' must be true or false");
        return -1;
    }
    /* strict or not, the schema is enforced: what cannot be enforced is refused. */
    return gang__api_set_grammar(api, p, schema, "'response_format.json_schema.schema'", err, cap);
}

/* logit_bias: {"<token id>": bias in [-100, 100], ...}, at most GANG_MAX_LOGIT_BIAS. */
static int parse_bias(gang_api *api, const cJSON *o, api_params *p, char *err, size_t cap)
{
    const cJSON *lb = cJSON_GetObjectItemCaseSensitive(o, "logit_bias");
    gang_sampling *s = &p->sampling;
    if (lb == NULL || cJSON_IsNull(lb))
        return 0;
    if (!cJSON_IsObject(lb)) {
        snprintf(err, cap, "'logit_bias' must be an object of token ids to biases");
        return -1;
    }
    const cJSON *e;
    cJSON_ArrayForEach(e, lb)
    {
        char *end = NULL;
        unsigned long id = strtoul(e->string, &end, 10);
        if (e->string[0] < '0' || e->string[0] > '9' || end == NULL || *end != '\0' ||
            id >= api->cfg.mc.vocab) {
            snprintf(err, cap, "'logit_bias' key '%.32s' is not a token id below %u", e->string,
                     api->cfg.mc.vocab);
            return -1;
        }
        if (!cJSON_IsNumber(e) || !isfinite(e->valuedouble) || e->valuedouble < -100 ||
            e->valuedouble > 100) {
            snprintf(err, cap, "'logit_bias' of token %lu must be a number in [-100, 100]", id);
            return -1;
        }
        if (s->n_bias >= GANG_MAX_LOGIT_BIAS) {
            snprintf(err, cap, "'logit_bias' holds more than %d tokens", GANG_MAX_LOGIT_BIAS);
            return -1;
        }
        s->bias_ids[s->n_bias] = (int32_t)id;
        s->bias[s->n_bias++] = (float)e->valuedouble;
    }
    return 0;
}

int gang__api_parse_constraints(gang_api *api, const cJSON *o, api_params *p, char *err, size_t cap)
{
    if (parse_bias(api, o, p, err, cap) != 0)
        return -1;
    return parse_format(api, o, p, err, cap);
}
