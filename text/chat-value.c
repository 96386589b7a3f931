/*
 * Values of the chat-template interpreter: the arena they live in, Python's str() and
 * repr() of them (what jinja2 prints), json.dumps as transformers' tojson calls it
 * (ensure_ascii=False), equality and ordering with Python's rules, and the conversion of
 * the request's JSON messages.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "chat-internal.h"

struct gang__chat_chunk {
    struct gang__chat_chunk *next;
    size_t size, used;
    max_align_t data[];
};

void *gang__chat_alloc(gang__chat_arena *a, size_t n)
{
    n = (n + 15) & ~(size_t)15;
    if (n == 0 || (a->limit && (n > a->limit || a->used > a->limit - n)))
        return NULL;
    struct gang__chat_chunk *c = a->head;
    if (!c || c->size - c->used < n) {
        size_t size = n > (64u << 10) ? n : (64u << 10);
        c = malloc(sizeof(*c) + size);
        if (!c)
            return NULL;
        c->size = size;
        c->used = 0;
        c->next = a->head;
        a->head = c;
    }
    void *p = (char *)c->data + c->used;
    c->used += n;
    a->used += n;
    memset(p, 0, n);
    return p;
}

void gang__chat_arena_free(gang__chat_arena *a)
{
    while (a->head) {
        struct gang__chat_chunk *c = a->head;
        a->head = c->next;
        free(c);
    }
    a->used = 0;
}

int gang__chat_fail(chat_ctx *c, int rc, const char *fmt, ...)
{
    char msg[384];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    if (c->err && c->errlen)
        snprintf(c->err, c->errlen, "chat template line %u: %s", c->line, msg);
    return rc;
}

int gang__chat_step(chat_ctx *c, uint64_t n)
{
    c->steps += n;
    if (c->steps > c->max_steps)
        return gang__chat_fail(c, GANG_ERANGE, "step limit (%llu) reached",
                               (unsigned long long)c->max_steps);
    return 0;
}

cv gang__cv_str(const char *s, size_t n)
{
    cv v = {.kind = CV_STR};
    v.u.s.s = s;
    v.u.s.n = n;
    return v;
}

cv gang__cv_int(int64_t i)
{
    cv v = {.kind = CV_INT};
    v.u.i = i;
    return v;
}

bool gang__cv_truthy(const cv *v)
{
    switch (v->kind) {
    case CV_UNDEF:
    case CV_NONE:
        return false;
    case CV_BOOL:
        return v->u.b;
    case CV_INT:
        return v->u.i != 0;
    case CV_FLOAT:
        return v->u.f != 0.0;
    case CV_STR:
        return v->u.s.n > 0;
    case CV_LIST:
        return v->u.list->gen || v->u.list->n > 0; /* a generator is always true */
    case CV_DICT:
        return v->u.dict->n > 0;
    case CV_RANGE:
        return gang__cv_length(v) > 0;
    default:
        return true;
    }
}

bool gang__cv_is_gen(const cv *v)
{
    return v->kind == CV_LIST && v->u.list->gen;
}

bool gang__cv_is_lazy(const cv *v)
{
    return v->kind == CV_LIST && (v->u.list->gen || v->u.list->view);
}

const char *gang__cv_type_name(const cv *v)
{
    if (gang__cv_is_gen(v))
        return "generator";
    static const char *const names[] = {"undefined", "none",     "bool",   "int",       "float",
                                        "string",    "list",     "dict",   "namespace", "range",
                                        "loop",      "function", "method", "macro"};
    return names[v->kind];
}

/* Python's whitespace (str.isspace) at S: its UTF-8 length in *len. */
bool gang__is_space_at(const char *s, size_t n, size_t *len)
{
    const unsigned char *u = (const unsigned char *)s;
    unsigned cp;
    if (u[0] < 0x80) {
        *len = 1;
        return (u[0] >= 9 && u[0] <= 13) || (u[0] >= 0x1c && u[0] <= 0x20);
    }
    if ((u[0] & 0xE0) == 0xC0 && n >= 2) {
        *len = 2;
        cp = ((u[0] & 0x1Fu) << 6) | (u[1] & 0x3Fu);
    } else if ((u[0] & 0xF0) == 0xE0 && n >= 3) {
        *len = 3;
        cp = ((u[0] & 0x0Fu) << 12) | ((u[1] & 0x3Fu) << 6) | (u[2] & 0x3Fu);
    } else {
        *len = 1;
        return false;
    }
    return cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) ||
           cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

int gang__buf_put(chat_ctx *c, chat_buf *b, const char *s, size_t n)
{
    if (b->limit && (n > b->limit || b->n > b->limit - n))
        return gang__chat_fail(c, GANG_ERANGE, "output limit (%zu bytes) reached", b->limit);
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1)
            cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p)
            return gang__chat_fail(c, GANG_ENOMEM, "out of memory");
        b->p = p;
        b->cap = cap;
    }
    if (n)
        memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
    return gang__chat_step(c, n / 256);
}

int gang__buf_to_cv(chat_ctx *c, chat_buf *b, cv *out)
{
    char *s = gang__chat_alloc(&c->arena, b->n + 1);
    if (!s)
        return gang__chat_fail(c, GANG_ERANGE, "memory limit reached");
    if (b->n)
        memcpy(s, b->p, b->n);
    *out = gang__cv_str(s, b->n);
    return 0;
}

/* Python's repr(float): the shortest digits that read back the same, in fixed notation
 * for exponents -5 < e < 16, else scientific ("1e+16", "1.5e-07"). */
static void float_repr(double f, char *out, size_t cap)
{
    if (isnan(f)) {
        snprintf(out, cap, "nan");
        return;
    }
    if (isinf(f)) {
        snprintf(out, cap, f < 0 ? "-inf" : "inf");
        return;
    }
    char e[40];
    int prec = 1;
    for (; prec <= 17; prec++) {
        snprintf(e, sizeof(e), "%.*e", prec - 1, f);
        if (strtod(e, NULL) == f)
            break;
    }
    /* e: [-]d[.ddd]e[+-]XX */
    bool neg = e[0] == '-';
    char digits[20];
    size_t nd = 0;
    const char *p = e + neg;
    for (; *p && *p != 'e'; p++)
        if (*p != '.')
            digits[nd++] = *p;
    int exp = atoi(p + 1);
    while (nd > 1 && digits[nd - 1] == '0')
        nd--;
    size_t k = 0;
    if (neg)
        out[k++] = '-';
    if (exp >= -5 && exp < 16) {
        if (exp < 0) {
            out[k++] = '0';
            out[k++] = '.';
            for (int z = -1; z > exp; z--)
                out[k++] = '0';
            memcpy(out + k, digits, nd);
            k += nd;
        } else {
            for (int i = 0; i <= exp; i++)
                out[k++] = (size_t)i < nd ? digits[i] : '0';
            out[k++] = '.';
            if ((size_t)exp + 1 < nd) {
                memcpy(out + k, digits + exp + 1, nd - (size_t)exp - 1);
                k += nd - (size_t)exp - 1;
            } else {
                out[k++] = '0';
            }
        }
        out[k] = 0;
    } else {
        out[k++] = digits[0];
        if (nd > 1) {
            out[k++] = '.';
            memcpy(out + k, digits + 1, nd - 1);
            k += nd - 1;
        }
        snprintf(out + k, cap - k, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
    }
}

/* Python's repr(str): single quotes unless the text has ' and no ". */
static int str_repr(chat_ctx *c, chat_buf *b, const char *s, size_t n)
{
    bool sq = memchr(s, '\'', n) != NULL, dq = memchr(s, '"', n) != NULL;
    char q = sq && !dq ? '"' : '\'';
    int rc = gang__buf_put(c, b, &q, 1);
    for (size_t i = 0; !rc && i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        char esc[8];
        if (ch == (unsigned char)q || ch == '\\') {
            esc[0] = '\\';
            esc[1] = (char)ch;
            rc = gang__buf_put(c, b, esc, 2);
        } else if (ch == '\n' || ch == '\r' || ch == '\t') {
            esc[0] = '\\';
            esc[1] = ch == '\n' ? 'n' : ch == '\r' ? 'r' : 't';
            rc = gang__buf_put(c, b, esc, 2);
        } else if (ch < 0x20 || ch == 0x7f) {
            snprintf(esc, sizeof(esc), "\\x%02x", ch);
            rc = gang__buf_put(c, b, esc, 4);
        } else if (ch >= 0x80) {
            return gang__chat_fail(c, GANG_EMODEL,
                                   "printing a list or dict holding non-ASCII text is not "
                                   "supported (use tojson)");
        } else {
            rc = gang__buf_put(c, b, (const char *)&ch, 1);
        }
    }
    return rc ? rc : gang__buf_put(c, b, &q, 1);
}

/* Python's repr(V) (inside lists and dicts). */
static int cv_repr(chat_ctx *c, chat_buf *b, const cv *v, int depth)
{
    int rc = 0;
    if (depth > CHAT_MAX_JSON_DEPTH)
        return gang__chat_fail(c, GANG_ERANGE, "value nested too deeply to print");
    if (v->kind == CV_STR && v->markup)
        return gang__chat_fail(c, GANG_EMODEL, "printing a |safe string inside a container");
    if (gang__cv_is_lazy(v))
        return gang__chat_fail(c, GANG_EMODEL,
                               "printing a generator or dict view (select/map/"
                               "reverse/items/keys/values without |list)");
    if (v->kind == CV_STR)
        return str_repr(c, b, v->u.s.s, v->u.s.n);
    if (v->kind == CV_LIST) {
        bool tuple = v->u.list->tuple;
        rc = gang__buf_put(c, b, tuple ? "(" : "[", 1);
        for (size_t i = 0; !rc && i < v->u.list->n; i++) {
            if (i)
                rc = gang__buf_put(c, b, ", ", 2);
            if (!rc)
                rc = cv_repr(c, b, &v->u.list->v[i], depth + 1);
        }
        if (!rc && tuple && v->u.list->n == 1)
            rc = gang__buf_put(c, b, ",", 1);
        return rc ? rc : gang__buf_put(c, b, tuple ? ")" : "]", 1);
    }
    if (v->kind == CV_DICT) {
        rc = gang__buf_put(c, b, "{", 1);
        for (size_t i = 0; !rc && i < v->u.dict->n; i++) {
            if (i)
                rc = gang__buf_put(c, b, ", ", 2);
            if (!rc)
                rc = cv_repr(c, b, &v->u.dict->k[i], depth + 1);
            if (!rc)
                rc = gang__buf_put(c, b, ": ", 2);
            if (!rc)
                rc = cv_repr(c, b, &v->u.dict->v[i], depth + 1);
        }
        return rc ? rc : gang__buf_put(c, b, "}", 1);
    }
    if (v->kind == CV_UNDEF || v->kind >= CV_NS)
        return gang__chat_fail(c, GANG_EMODEL, "printing a %s inside a container is not supported",
                               gang__cv_type_name(v));
    return gang__cv_str_into(c, b, v);
}

int gang__cv_str_into(chat_ctx *c, chat_buf *b, const cv *v)
{
    char num[64];
    switch (v->kind) {
    case CV_UNDEF:
        return 0;
    case CV_NONE:
        return gang__buf_put(c, b, "None", 4);
    case CV_BOOL:
        return v->u.b ? gang__buf_put(c, b, "True", 4) : gang__buf_put(c, b, "False", 5);
    case CV_INT:
        snprintf(num, sizeof(num), "%lld", (long long)v->u.i);
        return gang__buf_put(c, b, num, strlen(num));
    case CV_FLOAT:
        float_repr(v->u.f, num, sizeof(num));
        return gang__buf_put(c, b, num, strlen(num));
    case CV_STR:
        return gang__buf_put(c, b, v->u.s.s, v->u.s.n);
    case CV_LIST:
    case CV_DICT:
        return cv_repr(c, b, v, 0);
    default:
        return gang__chat_fail(c, GANG_EMODEL, "printing a %s is not supported",
                               gang__cv_type_name(v));
    }
}

int gang__cv_to_str(chat_ctx *c, const cv *v, cv *out)
{
    if (v->kind == CV_STR) {
        *out = *v;
        return 0;
    }
    chat_buf b = {.limit = c->out.limit};
    int rc = gang__cv_str_into(c, &b, v);
    if (!rc)
        rc = gang__buf_to_cv(c, &b, out);
    free(b.p);
    return rc;
}

/* The code point of the UTF-8 character at S (its length in *len), or -1 if invalid. */
static long utf8_decode(const unsigned char *s, size_t n, size_t *len)
{
    unsigned char b = s[0];
    size_t k = b >= 0xF0 && b <= 0xF4 ? 4 : b >= 0xE0 ? 3 : b >= 0xC2 && b < 0xE0 ? 2 : 0;
    long cp = k == 4 ? b & 0x07 : k == 3 ? b & 0x0F : b & 0x1F;
    if (!k || k > n)
        return -1;
    for (size_t i = 1; i < k; i++) {
        if ((s[i] & 0xC0) != 0x80)
            return -1;
        cp = (cp << 6) | (s[i] & 0x3F);
    }
    if ((k == 3 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) ||
        (k == 4 && (cp < 0x10000 || cp > 0x10FFFF)))
        return -1;
    *len = k;
    return cp;
}

/* A non-ASCII character as \uXXXX (a surrogate pair above U+FFFF), as
 * json.dumps(ensure_ascii=True) writes it. */
static int json_ascii_char(chat_ctx *c, chat_buf *b, const char *s, size_t n, size_t *len)
{
    long cp = utf8_decode((const unsigned char *)s, n, len);
    char esc[16];
    if (cp < 0)
        return gang__chat_fail(c, GANG_EMODEL, "tojson: text is not valid UTF-8");
    if (cp >= 0x10000)
        snprintf(esc, sizeof(esc), "\\u%04lx\\u%04lx", 0xD800 + ((cp - 0x10000) >> 10),
                 0xDC00 + ((cp - 0x10000) & 0x3FF));
    else
        snprintf(esc, sizeof(esc), "\\u%04lx", cp);
    return gang__buf_put(c, b, esc, strlen(esc));
}

/* A JSON string as json.dumps writes it (non-ASCII as is, or escaped with ASCII). */
static int json_str(chat_ctx *c, chat_buf *b, const char *s, size_t n, bool ascii)
{
    int rc = gang__buf_put(c, b, "\"", 1);
    size_t run = 0;
    for (size_t i = 0; !rc && i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (ascii && ch >= 0x80) {
            size_t len = 0;
            rc = gang__buf_put(c, b, s + run, i - run);
            if (!rc)
                rc = json_ascii_char(c, b, s + i, n - i, &len);
            i += len - 1;
            run = i + 1;
            continue;
        }
        if (ch >= 0x20 && ch != '"' && ch != '\\')
            continue;
        char esc[8] = {'\\', 0, 0};
        rc = gang__buf_put(c, b, s + run, i - run);
        run = i + 1;
        switch (ch) {
        case '"':
        case '\\':
            esc[1] = (char)ch;
            break;
        case '\n':
            esc[1] = 'n';
            break;
        case '\r':
            esc[1] = 'r';
            break;
        case '\t':
            esc[1] = 't';
            break;
        case '\b':
            esc[1] = 'b';
            break;
        case '\f':
            esc[1] = 'f';
            break;
        default:
            snprintf(esc, sizeof(esc), "\\u%04x", ch);
        }
        if (!rc)
            rc = gang__buf_put(c, b, esc, strlen(esc));
    }
    if (!rc)
        rc = gang__buf_put(c, b, s + run, n - run);
    return rc ? rc : gang__buf_put(c, b, "\"", 1);
}

static int json_newline(chat_ctx *c, chat_buf *b, int indent, int depth)
{
    int rc = gang__buf_put(c, b, "\n", 1);
    for (int i = 0; !rc && i < indent * depth; i++)
        rc = gang__buf_put(c, b, " ", 1);
    return rc;
}

/* qsort order of string keys: code point order (UTF-8 byte order), as sort_keys. */
static int key_cmp(const void *x, const void *y)
{
    const cv *a = *(const cv *const *)x, *b = *(const cv *const *)y;
    size_t m = a->u.s.n < b->u.s.n ? a->u.s.n : b->u.s.n;
    int r = memcmp(a->u.s.s, b->u.s.s, m);
    return r ? r : (a->u.s.n > b->u.s.n) - (a->u.s.n < b->u.s.n);
}

/* Index order of a dict's keys: sorted (string keys only) or as inserted. */
static int json_order(chat_ctx *c, const cv_dict *d, bool sort, size_t **order)
{
    size_t *o = gang__chat_alloc(&c->arena, (d->n + 1) * sizeof(*o));
    const cv **keys = gang__chat_alloc(&c->arena, (d->n + 1) * sizeof(*keys));
    if (!o || !keys)
        return gang__chat_fail(c, GANG_ERANGE, "memory limit reached");
    for (size_t i = 0; i < d->n; i++) {
        if (d->k[i].kind != CV_STR)
            return gang__chat_fail(c, GANG_EMODEL, "tojson of a dict with %s keys",
                                   gang__cv_type_name(&d->k[i]));
        keys[i] = &d->k[i];
    }
    if (sort && d->n > 1) /* keys are distinct, so an unstable sort is fine */
        qsort(keys, d->n, sizeof(*keys), key_cmp);
    for (size_t i = 0; i < d->n; i++)
        o[i] = (size_t)(keys[i] - d->k);
    *order = o;
    return gang__chat_step(c, d->n);
}

int gang__cv_to_json(chat_ctx *c, chat_buf *b, const cv *v, int indent, int flags, int depth)
{
    int rc = 0;
    if (depth > CHAT_MAX_JSON_DEPTH)
        return gang__chat_fail(c, GANG_ERANGE, "tojson: value nested too deeply");
    if (gang__cv_is_lazy(v))
        return gang__chat_fail(c, GANG_EMODEL,
                               "tojson of a generator or dict view (without "
                               "|list)");
    switch (v->kind) {
    case CV_NONE:
        return gang__buf_put(c, b, "null", 4);
    case CV_BOOL:
        return v->u.b ? gang__buf_put(c, b, "true", 4) : gang__buf_put(c, b, "false", 5);
    case CV_INT:
        return gang__cv_str_into(c, b, v);
    case CV_FLOAT:
        if (isnan(v->u.f) || isinf(v->u.f))
            return gang__buf_put(c, b,
                                 isnan(v->u.f) ? "NaN"
                                 : v->u.f > 0  ? "Infinity"
                                               : "-Infinity",
                                 isnan(v->u.f) ? 3
                                 : v->u.f > 0  ? 8
                                               : 9);
        return gang__cv_str_into(c, b, v);
    case CV_STR:
        return json_str(c, b, v->u.s.s, v->u.s.n, flags & CHAT_JSON_ASCII);
    case CV_LIST:
    case CV_DICT:
    case CV_NS:
        break;
    default:
        return gang__chat_fail(c, GANG_EMODEL, "tojson of a %s is not supported",
                               gang__cv_type_name(v));
    }
    if (v->kind == CV_NS)
        return gang__chat_fail(c, GANG_EMODEL, "tojson of a namespace is not supported");
    bool list = v->kind == CV_LIST;
    size_t n = list ? v->u.list->n : v->u.dict->n, *order = NULL;
    if (!list && (rc = json_order(c, v->u.dict, flags & CHAT_JSON_SORT, &order)))
        return rc;
    rc = gang__buf_put(c, b, list ? "[" : "{", 1);
    for (size_t i = 0; !rc && i < n; i++) {
        if (i)
            rc = gang__buf_put(c, b, indent >= 0 ? "," : ", ", indent >= 0 ? 1 : 2);
        if (!rc && indent >= 0)
            rc = json_newline(c, b, indent, depth + 1);
        if (!rc && !list)
            rc = json_str(c, b, v->u.dict->k[order[i]].u.s.s, v->u.dict->k[order[i]].u.s.n,
                          flags & CHAT_JSON_ASCII);
        if (!rc && !list)
            rc = gang__buf_put(c, b, ": ", 2);
        if (!rc)
            rc = gang__cv_to_json(c, b, list ? &v->u.list->v[i] : &v->u.dict->v[order[i]], indent,
                                  flags, depth + 1);
    }
    if (!rc && indent >= 0 && n)
        rc = json_newline(c, b, indent, depth);
    return rc ? rc : gang__buf_put(c, b, list ? "]" : "}", 1);
}

int gang__cv_from_cjson(chat_ctx *c, const void *json, cv *out, int depth)
{
    const cJSON *j = json;
    memset(out, 0, sizeof(*out));
    if (depth > CHAT_MAX_JSON_DEPTH)
        return gang__chat_fail(c, GANG_EINVAL, "messages JSON nested deeper than %d",
                               CHAT_MAX_JSON_DEPTH);
    if (cJSON_IsNull(j)) {
        out->kind = CV_NONE;
    } else if (cJSON_IsBool(j)) {
        *out = (cv){.kind = CV_BOOL};
        out->u.b = cJSON_IsTrue(j);
    } else if (cJSON_IsNumber(j)) {
        double d = j->valuedouble;
        if (d == floor(d) && fabs(d) < 9007199254740992.0) {
            *out = gang__cv_int((int64_t)d); /* cJSON keeps no int/float distinction */
        } else {
            *out = (cv){.kind = CV_FLOAT};
            out->u.f = d;
        }
    } else if (cJSON_IsString(j)) {
        *out = gang__cv_str(j->valuestring, strlen(j->valuestring));
    } else if (cJSON_IsArray(j) || cJSON_IsObject(j)) {
        size_t n = (size_t)cJSON_GetArraySize(j), i = 0;
        bool arr = cJSON_IsArray(j);
        cv *vals = gang__chat_alloc(&c->arena, (n + 1) * sizeof(cv));
        cv *keys = arr ? NULL : gang__chat_alloc(&c->arena, (n + 1) * sizeof(cv));
        void *box = gang__chat_alloc(&c->arena, arr ? sizeof(cv_list) : sizeof(cv_dict));
        if (!vals || !box || (!arr && !keys))
            return gang__chat_fail(c, GANG_ERANGE, "memory limit reached");
        for (const cJSON *e = j->child; e; e = e->next, i++) {
            int rc = gang__cv_from_cjson(c, e, &vals[i], depth + 1);
            if (rc)
                return rc;
            if (!arr)
                keys[i] = gang__cv_str(e->string, strlen(e->string));
        }
        *out = (cv){.kind = arr ? CV_LIST : CV_DICT};
        if (arr) {
            out->u.list = box;
            out->u.list->n = n;
            out->u.list->v = vals;
        } else {
            out->u.dict = box;
            *out->u.dict = (cv_dict){.n = n, .cap = n + 1, .k = keys, .v = vals};
        }
    } else {
        return gang__chat_fail(c, GANG_EINVAL, "unexpected JSON value in messages");
    }
    return 0;
}

int gang__cv_new_list(chat_ctx *c, size_t n, cv *out, cv **items)
{
    cv_list *l = gang__chat_alloc(&c->arena, sizeof(*l));
    *items = gang__chat_alloc(&c->arena, (n + 1) * sizeof(cv));
    if (!l || !*items)
        return gang__chat_fail(c, GANG_ERANGE, "memory limit reached");
    l->n = n;
    l->v = *items;
    *out = (cv){.kind = CV_LIST};
    out->u.list = l;
    return gang__chat_step(c, n);
}
