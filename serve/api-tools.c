/*
 * Tool calling of /v1/chat/completions (see api-internal.h): "tools", "tool_choice" and
 * "parallel_tool_calls" in, "tool_calls" out.
 *
 * tool_choice "required" and a named function are enforced with the grammar of
 * structured outputs: the answer must be {"<function name>": <arguments>}, one member,
 * the name one of the tools (or the named one) and the arguments a value of that
 * function's parameters schema, so it always parses into a call whose arguments validate.
 * "auto" constrains nothing: the tools are rendered by the chat template (templates take
 * a `tools` variable) and the answer is parsed for the call formats of the model
 * families: Hermes / Qwen `<tool_call>{"name", "arguments"}</tool_call>`, Llama 3.x's bare
 * `{"name", "parameters"}`, Mistral's `[TOOL_CALLS] [{"name", "arguments"}, ...]` (with
 * its marker skipped as a special token, a bare array); only calls that name a tool
 * count. "none" renders the tools and parses nothing.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api-internal.h"

#define API_MAX_TOOLS 64
#define API_TOOL_NAME_MAX 64

/* A function name as OpenAI allows it: 1 to 64 of [A-Za-z0-9_-]. */
static int name_ok(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > API_TOOL_NAME_MAX)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z') ||
              (s[i] >= '0' && s[i] <= '9') || s[i] == '_' || s[i] == '-'))
            return 0;
    return 1;
}

/* The function object of tool t ({"type": "function", "function": {...}}), or NULL. */
static const cJSON *tool_function(const cJSON *t)
{
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(t, "type");
    const cJSON *fn = cJSON_GetObjectItemCaseSensitive(t, "function");
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(fn, "name");
    if (!cJSON_IsObject(t) || !cJSON_IsString(type) || strcmp(type->valuestring, "function") ||
        !cJSON_IsObject(fn) || !cJSON_IsString(name) || !name_ok(name->valuestring))
        return NULL;
    return fn;
}

/* The named function of tool_choice {"type": "function", "function": {"name"}}, or NULL. */
static const char *choice_name(const cJSON *tc)
{
    const cJSON *fn = cJSON_GetObjectItemCaseSensitive(tc, "function");
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(fn, "name");
    return cJSON_IsObject(tc) && cJSON_IsString(name) ? name->valuestring : NULL;
}

/* The grammar of a forced call: {"<name>": <parameters>}, one member, among the tools
 * (only `only` when not NULL). 0, or -1 with a message. */
static int forced_grammar(gang_api *api, const cJSON *tools, const char *only, api_params *p,
                          char *err, size_t cap)
{
    cJSON *schema = cJSON_CreateObject(), *props = cJSON_AddObjectToObject(schema, "properties");
    const cJSON *t;
    int rc = -1;
    cJSON_AddStringToObject(schema, "type", "object");
    cJSON_ArrayForEach(t, tools)
    {
        const cJSON *fn = tool_function(t);
        const char *name = cJSON_GetObjectItemCaseSensitive(fn, "name")->valuestring;
        const cJSON *params = cJSON_GetObjectItemCaseSensitive(fn, "parameters");
        if ((only != NULL && strcmp(only, name) != 0) ||
            cJSON_GetObjectItemCaseSensitive(props, name) != NULL)
            continue;
        cJSON *ps = params != NULL && !cJSON_IsNull(params) ? cJSON_Duplicate(params, 1)
                                                            : cJSON_Parse("{\"type\":\"object\"}");
        cJSON_AddItemToObject(props, name, ps);
    }
    if (props->child == NULL) {
        snprintf(err, cap, "'tool_choice' names the function '%.64s', which 'tools' lacks",
                 only != NULL ? only : "");
        goto out;
    }
    cJSON_AddNumberToObject(schema, "minProperties", 1);
    cJSON_AddNumberToObject(schema, "maxProperties", 1);
    rc = gang__api_set_grammar(api, p, schema, "'tools' (a function's parameters)", err, cap);
out:
    cJSON_Delete(schema);
    return rc;
}

int gang__api_parse_tools(gang_api *api, const cJSON *o, api_kind kind, api_params *p, char *err,
                          size_t cap)
{
    const cJSON *tools = cJSON_GetObjectItemCaseSensitive(o, "tools");
    const cJSON *tc = cJSON_GetObjectItemCaseSensitive(o, "tool_choice");
    const cJSON *par = cJSON_GetObjectItemCaseSensitive(o, "parallel_tool_calls");
    int has = tools != NULL && !cJSON_IsNull(tools);
    if (!has && (tc == NULL || cJSON_IsNull(tc) ||
                 (cJSON_IsString(tc) && strcmp(tc->valuestring, "none") == 0)))
        return 0;
    if (!has) {
        snprintf(err, cap, "'tool_choice' needs 'tools'");
        return -1;
    }
    if (kind != API_CHAT) {
        snprintf(err, cap, "'tools' are for /v1/chat/completions");
        return -1;
    }
    int n = cJSON_GetArraySize(tools);
    if (!cJSON_IsArray(tools) || n < 1 || n > API_MAX_TOOLS) {
        snprintf(err, cap, "'tools' must be an array of 1 to %d tools", API_MAX_TOOLS);
        return -1;
    }
    for (int i = 0; i < n; i++)
        if (tool_function(cJSON_GetArrayItem(tools, i)) == NULL) {
            snprintf(err, cap,
                     "'tools'[%d] must be {\"type\": \"function\", \"function\": {\"name\": "
                     "1 to 64 of [A-Za-z0-9_-], \"parameters\": a JSON schema}}",
                     i);
            return -1;
        }
    if (par != NULL && !cJSON_IsNull(par) && !cJSON_IsBool(par)) {
        snprintf(err, cap, "'parallel_tool_calls' must be true or false");
        return -1;
    }
    p->parallel_tools = !cJSON_IsFalse(par);
    p->tools_json = cJSON_PrintUnformatted(tools);
    if (p->tools_json == NULL) {
        snprintf(err, cap, "out of memory");
        return -1;
    }
    const char *mode = cJSON_IsString(tc) ? tc->valuestring : NULL;
    const char *name = choice_name(tc);
    if (tc == NULL || cJSON_IsNull(tc) || (mode != NULL && strcmp(mode, "auto") == 0)) {
        p->tools_mode = API_TOOLS_AUTO;
        return 0;
    }
    if (mode != NULL && strcmp(mode, "none") == 0) {
        p->tools_mode = API_TOOLS_OFF; /* rendered for the model, never parsed */
        return 0;
    }
    if ((mode == NULL || strcmp(mode, "required") != 0) && name == NULL) {
        snprintf(err, cap,
                 "'tool_choice' must be 'none', 'auto', 'required' or {\"type\": "
                 "\"function\", \"function\": {\"name\": ...}}");
        return -1;
    }
    if (p->grammar != NULL) {
        snprintf(err, cap, "'response_format' and a forced 'tool_choice' cannot be combined");
        return -1;
    }
    p->tools_mode = API_TOOLS_FORCED;
    return forced_grammar(api, tools, name, p, err, cap);
}

/* Whether name is one of the call's tools. */
static int known_tool(const cJSON *tools, const char *name)
{
    const cJSON *t;
    cJSON_ArrayForEach(t, tools)
    {
        const cJSON *fn = tool_function(t);
        if (fn != NULL &&
            strcmp(cJSON_GetObjectItemCaseSensitive(fn, "name")->valuestring, name) == 0)
            return 1;
    }
    return 0;
}

/* Appends the call (name, arguments: an object or a string) to calls. */
static void add_call(cJSON *calls, const api_call *c, const api_seq *s, const char *name,
                     const cJSON *args)
{
    char id[64];
    cJSON *call = cJSON_CreateObject(), *fn;
    int i = cJSON_GetArraySize(calls);
    snprintf(id, sizeof(id), "call_%llu_%u_%d", (unsigned long long)c->id, s->index, i);
    cJSON_AddStringToObject(call, "id", id);
    cJSON_AddStringToObject(call, "type", "function");
    fn = cJSON_AddObjectToObject(call, "function");
    cJSON_AddStringToObject(fn, "name", name);
    if (cJSON_IsString(args)) {
        cJSON_AddStringToObject(fn, "arguments", args->valuestring);
    } else {
        char *a = args != NULL ? cJSON_PrintUnformatted(args) : NULL;
        cJSON_AddStringToObject(fn, "arguments", a != NULL ? a : "{}");
        cJSON_free(a);
    }
    cJSON_AddItemToArray(calls, call);
}

/* A {"name", "arguments" | "parameters"} object naming a tool, added to calls: 1, else 0. */
static int parse_named(cJSON *calls, const api_call *c, const api_seq *s, const cJSON *tools,
                       const cJSON *v)
{
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(v, "name");
    const cJSON *args = cJSON_GetObjectItemCaseSensitive(v, "arguments");
    if (args == NULL)
        args = cJSON_GetObjectItemCaseSensitive(v, "parameters");
    if (!cJSON_IsObject(v) || !cJSON_IsString(name) || !known_tool(tools, name->valuestring) ||
        (args != NULL && !cJSON_IsObject(args) && !cJSON_IsString(args)))
        return 0;
    add_call(calls, c, s, name->valuestring, args);
    return 1;
}

/* Auto: the calls in text, in the families' formats; *head: bytes of text before them. */
static void parse_auto(cJSON *calls, const api_call *c, const api_seq *s, const cJSON *tools,
                       const char *text, size_t *head)
{
    static const char open[] = "<tool_call>", close[] = "</tool_call>";
    const char *at = strstr(text, open);
    *head = strlen(text);
    if (at != NULL) {
        *head = (size_t)(at - text);
        while (at != NULL) {
            const char *body = at + strlen(open), *end = strstr(body, close);
            size_t len = end != NULL ? (size_t)(end - body) : strlen(body);
            cJSON *v = cJSON_ParseWithLength(body, len);
            parse_named(calls, c, s, tools, v);
            cJSON_Delete(v);
            at = end != NULL ? strstr(end, open) : NULL;
        }
        return;
    }
    const char *j = text + strspn(text, " \t\r\n");
    if (strncmp(j, "[TOOL_CALLS]", 12) == 0)
        j += 12 + strspn(j + 12, " \t\r\n");
    cJSON *v = cJSON_Parse(j);
    const cJSON *e;
    if (cJSON_IsArray(v)) {
        cJSON_ArrayForEach(e, v) parse_named(calls, c, s, tools, e);
    } else {
        parse_named(calls, c, s, tools, v);
    }
    cJSON_Delete(v);
    if (cJSON_GetArraySize(calls) > 0)
        *head = 0;
}

cJSON *gang__api_tool_calls(const api_call *c, const api_seq *s, size_t *head)
{
    const char *text = s->text != NULL ? s->text : "";
    if (c->p.tools_mode == API_TOOLS_OFF || c->p.tools_json == NULL)
        return NULL;
    cJSON *tools = cJSON_Parse(c->p.tools_json), *calls = cJSON_CreateArray();
    *head = 0;
    if (c->p.tools_mode == API_TOOLS_FORCED) {
        cJSON *v = cJSON_Parse(text); /* the grammar made it {"<name>": arguments} */
        if (cJSON_IsObject(v) && v->child != NULL && known_tool(tools, v->child->string))
            add_call(calls, c, s, v->child->string, v->child);
        cJSON_Delete(v);
    } else {
        parse_auto(calls, c, s, tools, text, head);
    }
    cJSON_Delete(tools);
    while (!c->p.parallel_tools && cJSON_GetArraySize(calls) > 1)
        cJSON_DeleteItemFromArray(calls, cJSON_GetArraySize(calls) - 1);
    if (cJSON_GetArraySize(calls) == 0) {
        cJSON_Delete(calls);
        return NULL;
    }
    return calls;
}
