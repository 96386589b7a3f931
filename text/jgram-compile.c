/*
 * JSON schema -> grammar nodes (include/ganglion/text.h, gang_jgram_compile).
 *
 * A schema is walked once, depth first, into a fixed array of nodes: one per object,
 * array, string, number or literal set, and a UNION node for a list of types or an
 * anyOf/oneOf. The matcher chooses a union's alternative by the first byte of the value,
 * so alternatives must start with different bytes; that is checked here, and a schema
 * that breaks it is refused rather than matched ambiguously. "Any JSON value" is one
 * shared node that refers to itself (through a generic object and array), built once.
 * Everything is bounded: schema bytes, nesting, nodes, members and the literal text, so
 * a hostile schema costs at most a fixed amount of time and memory.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "jgram-internal.h"

typedef struct jg_build {
    gang_jgram *g;
    uint16_t any; /* the "any value" node, JG_NONE-ish 0xFFFF until built */
    char *err;
    size_t errlen;
} jg_build;

static int jg_fail(jg_build *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int jg_fail(jg_build *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(b->err, b->errlen, fmt, ap);
    va_end(ap);
    return GANG_EINVAL;
}

static void jg_set_first(jg_node *n, uint8_t c)
{
    n->firsts[c >> 3] |= (uint8_t)(1u << (c & 7));
}

/* A new node of KIND in *out. */
static int jg_node_new(jg_build *b, uint8_t kind, uint16_t *out)
{
    gang_jgram *g = b->g;
    if (g->n_nodes >= GANG_JGRAM_MAX_NODES)
        return jg_fail(b, "the schema needs more than %s grammar nodes", "512");
    jg_node *n = &g->nodes[g->n_nodes];
    memset(n, 0, sizeof(*n));
    n->kind = kind;
    n->max = JG_NONE;
    if (kind == JG_OBJECT)
        jg_set_first(n, '{');
    else if (kind == JG_ARRAY)
        jg_set_first(n, '[');
    else if (kind == JG_STRING)
        jg_set_first(n, '"');
    else if (kind == JG_NUMBER || kind == JG_INTEGER) {
        jg_set_first(n, '-');
        for (uint8_t c = '0'; c <= '9'; c++)
            jg_set_first(n, c);
    }
    *out = (uint16_t)g->n_nodes++;
    return 0;
}

/* Appends s[0..len) to the grammar's text as a span (node: a property's value). */
static int jg_span_add(jg_build *b, const char *s, size_t len, uint16_t node)
{
    gang_jgram *g = b->g;
    if (g->n_spans >= JG_SPANS_MAX || len == 0 || len > JG_TEXT_MAX - g->n_text)
        return jg_fail(b, "the schema's names and values exceed the grammar's %s", "room");
    memcpy(g->text + g->n_text, s, len);
    g->spans[g->n_spans] = (jg_span){.off = g->n_text, .len = (uint32_t)len, .node = node};
    g->n_text += (uint32_t)len;
    g->n_spans++;
    return 0;
}

/* A literal node of the canonical texts of the values in list (an enum) or of v alone. */
static int jg_literals(jg_build *b, const cJSON *list, const cJSON *one, uint16_t *out)
{
    uint16_t id;
    int rc = jg_node_new(b, JG_LITS, &id);
    if (rc != 0)
        return rc;
    jg_node *n = &b->g->nodes[id];
    n->first = (uint16_t)b->g->n_spans;
    const cJSON *v = one != NULL ? one : (list != NULL ? list->child : NULL);
    for (; v != NULL && rc == 0; v = one != NULL ? NULL : v->next) {
        if (n->count >= GANG_JGRAM_MAX_MEMBERS)
            return jg_fail(b, "an enum has more than %s values", "64");
        char *txt = cJSON_PrintUnformatted(v);
        if (txt == NULL)
            return GANG_ENOMEM;
        if (strlen(txt) > 512)
            rc = jg_fail(b, "an enum value is longer than %s bytes", "512");
        else
            rc = jg_span_add(b, txt, strlen(txt), 0);
        if (rc == 0) {
            jg_set_first(n, (uint8_t)txt[0]);
            n->count++;
        }
        free(txt);
    }
    if (rc == 0 && n->count == 0)
        rc = jg_fail(b, "%s has no values", "enum");
    *out = id;
    return rc;
}

/* A fixed literal set: true/false or null. */
static int jg_words(jg_build *b, const char *json, uint16_t *out)
{
    cJSON *v = cJSON_Parse(json);
    if (v == NULL)
        return GANG_ENOMEM;
    int rc = jg_literals(b, v, NULL, out);
    cJSON_Delete(v);
    return rc;
}

/* A union of the alternatives alt[0..n): refused when two may start with the same byte. */
static int jg_union(jg_build *b, const uint16_t *alt, uint32_t n, uint16_t *out)
{
    gang_jgram *g = b->g;
    uint16_t id;
    if (n == 1) {
        *out = alt[0];
        return 0;
    }
    int rc = jg_node_new(b, JG_UNION, &id);
    if (rc != 0)
        return rc;
    if (n > GANG_JGRAM_MAX_NODES - g->n_alts)
        return jg_fail(b, "the schema has more than %s alternatives", "512");
    jg_node *u = &g->nodes[id];
    u->first = (uint16_t)g->n_alts;
    u->count = (uint16_t)n;
    for (uint32_t i = 0; i < n; i++) {
        const jg_node *a = &g->nodes[alt[i]];
        for (int k = 0; k < 32; k++) {
            if (u->firsts[k] & a->firsts[k])
                return jg_fail(b,
                               "%s alternatives that start with the same character are not "
                               "supported (e.g. two objects, or number and integer)",
                               "anyOf/oneOf/type");
            u->firsts[k] |= a->firsts[k];
        }
        g->alts[g->n_alts++] = alt[i];
    }
    *out = id;
    return 0;
}

/* The shared "any JSON value" node (built on first use). */
static int jg_any(jg_build *b, uint16_t *out)
{
    uint16_t alt[5], obj, arr;
    int rc;
    if (b->any != 0xFFFF) {
        *out = b->any;
        return 0;
    }
    if ((rc = jg_node_new(b, JG_OBJECT, &obj)) != 0 || (rc = jg_node_new(b, JG_ARRAY, &arr)) != 0 ||
        (rc = jg_node_new(b, JG_STRING, &alt[2])) != 0 ||
        (rc = jg_node_new(b, JG_NUMBER, &alt[3])) != 0 ||
        (rc = jg_words(b, "[true,false,null]", &alt[4])) != 0)
        return rc;
    alt[0] = obj;
    alt[1] = arr;
    rc = jg_union(b, alt, 5, &b->any);
    if (rc != 0)
        return rc;
    /* Bounded, so that a model that repeats itself still closes its value. */
    b->g->nodes[obj].child = b->any;
    b->g->nodes[obj].max = GANG_JGRAM_ANY_MEMBERS;
    b->g->nodes[arr].child = b->any;
    b->g->nodes[arr].max = GANG_JGRAM_ANY_MEMBERS;
    b->g->nodes[alt[2]].max = GANG_JGRAM_ANY_CHARS;
    *out = b->any;
    return 0;
}

/* A non-negative integer keyword into *v (absent: unchanged). */
static int jg_count(jg_build *b, const cJSON *s, const char *kw, uint32_t *v)
{
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(s, kw);
    if (x == NULL)
        return 0;
    if (!cJSON_IsNumber(x) || x->valuedouble < 0 || x->valuedouble > 1e6 ||
        x->valuedouble != (double)(uint32_t)x->valuedouble)
        return jg_fail(b, "'%s' must be an integer in [0, 1000000]", kw);
    *v = (uint32_t)x->valuedouble;
    return 0;
}

static int jg_schema(jg_build *b, const cJSON *s, unsigned depth, uint16_t *out);

/* An object with the properties of s (in order) and its required list. */
static int jg_object(jg_build *b, const cJSON *s, unsigned depth, uint16_t id)
{
    gang_jgram *g = b->g;
    const cJSON *props = cJSON_GetObjectItemCaseSensitive(s, "properties");
    const cJSON *req = cJSON_GetObjectItemCaseSensitive(s, "required");
    int rc = 0;
    if (props != NULL && !cJSON_IsObject(props))
        return jg_fail(b, "'%s' must be an object", "properties");
    if (props == NULL || props->child == NULL) {
        g->nodes[id].max = GANG_JGRAM_ANY_MEMBERS;
        return jg_any(b, &g->nodes[id].child);
    }
    uint32_t first = g->n_spans, count = 0;
    for (const cJSON *p = props->child; p != NULL; p = p->next)
        count++;
    if (count > GANG_JGRAM_MAX_MEMBERS)
        return jg_fail(b, "an object has more than %s properties", "64");
    /* The quoted keys first, contiguous, then their values' nodes. */
    for (const cJSON *p = props->child; p != NULL && rc == 0; p = p->next) {
        cJSON *k = cJSON_CreateString(p->string);
        char *txt = k != NULL ? cJSON_PrintUnformatted(k) : NULL;
        rc = txt == NULL ? GANG_ENOMEM : jg_span_add(b, txt, strlen(txt), 0);
        free(txt);
        cJSON_Delete(k);
    }
    uint32_t i = 0;
    for (const cJSON *p = props->child; p != NULL && rc == 0; p = p->next, i++) {
        uint16_t v;
        rc = jg_schema(b, p, depth + 1, &v);
        g->spans[first + i].node = v;
    }
    if (rc != 0)
        return rc;
    g->nodes[id].first = (uint16_t)first;
    g->nodes[id].count = (uint16_t)count;
    if (req != NULL && !cJSON_IsArray(req))
        return jg_fail(b, "'%s' must be an array of property names", "required");
    for (const cJSON *r = req != NULL ? req->child : NULL; r != NULL; r = r->next) {
        uint32_t j = 0;
        const cJSON *p = props->child;
        for (; p != NULL && (!cJSON_IsString(r) || strcmp(p->string, r->valuestring) != 0); j++)
            p = p->next;
        if (p == NULL)
            return jg_fail(b, "'required' names '%s', which is not in 'properties'",
                           cJSON_IsString(r) ? r->valuestring : "a non-string");
        g->nodes[id].req |= 1ull << j;
    }
    return 0;
}

/* The node of one JSON type name for schema s (its keywords apply). */
static int jg_typed(jg_build *b, const cJSON *s, const char *type, unsigned depth, uint16_t *out)
{
    gang_jgram *g = b->g;
    int rc;
    if (strcmp(type, "boolean") == 0)
        return jg_words(b, "[true,false]", out);
    if (strcmp(type, "null") == 0)
        return jg_words(b, "[null]", out);
    if (strcmp(type, "number") == 0)
        return jg_node_new(b, JG_NUMBER, out);
    if (strcmp(type, "integer") == 0)
        return jg_node_new(b, JG_INTEGER, out);
    if (strcmp(type, "string") == 0) {
        if ((rc = jg_node_new(b, JG_STRING, out)) != 0)
            return rc;
        if ((rc = jg_count(b, s, "minLength", &g->nodes[*out].min)) != 0)
            return rc;
        return jg_count(b, s, "maxLength", &g->nodes[*out].max);
    }
    if (strcmp(type, "array") == 0) {
        const cJSON *items = cJSON_GetObjectItemCaseSensitive(s, "items");
        uint16_t id, child;
        if ((rc = jg_node_new(b, JG_ARRAY, &id)) != 0)
            return rc;
        rc = items != NULL ? jg_schema(b, items, depth + 1, &child) : jg_any(b, &child);
        if (rc == 0)
            rc = jg_count(b, s, "minItems", &g->nodes[id].min);
        if (rc == 0)
            rc = jg_count(b, s, "maxItems", &g->nodes[id].max);
        if (rc == 0 && g->nodes[id].min > g->nodes[id].max)
            rc = jg_fail(b, "%s is above maxItems", "minItems");
        g->nodes[id].child = child;
        *out = id;
        return rc;
    }
    if (strcmp(type, "object") == 0) {
        if ((rc = jg_node_new(b, JG_OBJECT, out)) != 0 || (rc = jg_object(b, s, depth, *out)) != 0)
            return rc;
        /* minProperties / maxProperties bound the members (any object: within its bound). */
        jg_node *n = &g->nodes[*out];
        uint32_t lo = 0, hi = JG_NONE;
        if ((rc = jg_count(b, s, "minProperties", &lo)) != 0 ||
            (rc = jg_count(b, s, "maxProperties", &hi)) != 0)
            return rc;
        n->min = lo;
        n->max = hi < n->max ? hi : n->max;
        if (n->min > n->max || (n->count > 0 && n->min > n->count))
            return jg_fail(b, "%s cannot be met", "minProperties");
        return 0;
    }
    return jg_fail(b, "unknown type '%s'", type);
}

/* Refuses a keyword outside the supported set, naming it. */
static int jg_keywords(jg_build *b, const cJSON *s)
{
    static const char *const known[] = {
        "type",          "properties", "required",    "additionalProperties",
        "items",         "minItems",   "maxItems",    "enum",
        "const",         "minLength",  "maxLength",   "anyOf",
        "oneOf",         "title",      "description", "default",
        "examples",      "$schema",    "$comment",    "minProperties",
        "maxProperties", NULL};
    for (const cJSON *k = s->child; k != NULL; k = k->next) {
        unsigned i = 0;
        while (known[i] != NULL && strcmp(known[i], k->string) != 0)
            i++;
        if (known[i] == NULL)
            return jg_fail(b, "the JSON-schema keyword '%s' is not supported", k->string);
    }
    return 0;
}

/* The alternatives of anyOf/oneOf list L, or of the type names in list L. */
static int jg_alternatives(jg_build *b, const cJSON *s, const cJSON *l, int types, unsigned depth,
                           uint16_t *out)
{
    uint16_t alt[16];
    uint32_t n = 0;
    int rc = 0;
    if (!cJSON_IsArray(l) || l->child == NULL)
        return jg_fail(b, "'%s' must be a non-empty array", types ? "type" : "anyOf");
    for (const cJSON *x = l->child; x != NULL && rc == 0; x = x->next) {
        if (n == 16)
            return jg_fail(b, "more than %s alternatives", "16");
        if (types)
            rc = cJSON_IsString(x) ? jg_typed(b, s, x->valuestring, depth, &alt[n++])
                                   : jg_fail(b, "'%s' lists a non-string", "type");
        else
            rc = jg_schema(b, x, depth + 1, &alt[n++]);
    }
    return rc != 0 ? rc : jg_union(b, alt, n, out);
}

static int jg_schema(jg_build *b, const cJSON *s, unsigned depth, uint16_t *out)
{
    if (depth > GANG_JGRAM_MAX_DEPTH)
        return jg_fail(b, "the schema nests deeper than %s levels", "12");
    if (cJSON_IsTrue(s))
        return jg_any(b, out);
    if (!cJSON_IsObject(s))
        return jg_fail(b, "a schema must be an object or true, not %s",
                       cJSON_IsFalse(s) ? "false" : "another value");
    int rc = jg_keywords(b, s);
    if (rc != 0)
        return rc;
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(s, "type");
    const cJSON *en = cJSON_GetObjectItemCaseSensitive(s, "enum");
    const cJSON *co = cJSON_GetObjectItemCaseSensitive(s, "const");
    const cJSON *any = cJSON_GetObjectItemCaseSensitive(s, "anyOf");
    if (any == NULL)
        any = cJSON_GetObjectItemCaseSensitive(s, "oneOf");
    if (en != NULL && !cJSON_IsArray(en))
        return jg_fail(b, "'%s' must be an array", "enum");
    if (en != NULL || co != NULL)
        return jg_literals(b, co != NULL ? NULL : en, co, out);
    if (any != NULL) {
        if (type != NULL)
            return jg_fail(b, "'%s' beside 'type' is not supported", "anyOf/oneOf");
        return jg_alternatives(b, s, any, 0, depth, out);
    }
    if (cJSON_IsString(type))
        return jg_typed(b, s, type->valuestring, depth, out);
    if (cJSON_IsArray(type))
        return jg_alternatives(b, s, type, 1, depth, out);
    if (type != NULL)
        return jg_fail(b, "'%s' must be a string or an array of strings", "type");
    if (cJSON_GetObjectItemCaseSensitive(s, "properties") != NULL)
        return jg_typed(b, s, "object", depth, out);
    if (cJSON_GetObjectItemCaseSensitive(s, "items") != NULL)
        return jg_typed(b, s, "array", depth, out);
    return jg_any(b, out);
}

int gang_jgram_compile(const char *schema, size_t len, gang_jgram **out, char *err, size_t errlen)
{
    char dummy[8];
    jg_build b = {.any = 0xFFFF,
                  .err = err != NULL ? err : dummy,
                  .errlen = err != NULL ? errlen : sizeof(dummy)};
    int rc;
    if (out == NULL || (schema == NULL && len > 0))
        return GANG_EINVAL;
    *out = NULL;
    if (len > GANG_JGRAM_MAX_SCHEMA_BYTES)
        return jg_fail(&b, "the schema is longer than %s bytes", "16384");
    cJSON *root = cJSON_ParseWithLength(schema, len);
    if (root == NULL)
        return jg_fail(&b, "the schema is not %s", "valid JSON");
    b.g = calloc(1, sizeof(*b.g));
    if (b.g == NULL) {
        rc = GANG_ENOMEM;
        goto out_json;
    }
    rc = jg_schema(&b, root, 0, &b.g->root);
    if (rc == 0)
        rc = jg_node_new(&b, JG_STRING, &b.g->key);
    if (rc != 0)
        goto out_grammar;
    cJSON_Delete(root);
    *out = b.g;
    return 0;

out_grammar:
    free(b.g);
out_json:
    cJSON_Delete(root);
    return rc;
}

void gang_jgram_free(gang_jgram *g)
{
    free(g);
}
