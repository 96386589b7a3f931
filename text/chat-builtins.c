/*
 * Built-ins of the chat-template interpreter: the global functions transformers and
 * jinja2 give templates (range with the sandbox's 100000-item cap, namespace, dict,
 * raise_exception, strftime_now), calls, jinja2's tests, and its filters with
 * transformers' tojson (json.dumps with ensure_ascii=False). Names outside these lists are
 * refused when the template is parsed.
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "chat-internal.h"

#define CHAT_MAX_RANGE 100000 /* jinja2.sandbox.MAX_RANGE */

static const char *const tests[] = {"defined",     "undefined", "none",        "string",   "number",
                                    "integer",     "float",     "boolean",     "true",     "false",
                                    "mapping",     "iterable",  "sequence",    "callable", "eq",
                                    "equalto",     "==",        "ne",          "!=",       "lt",
                                    "lessthan",    "<",         "le",          "<=",       "gt",
                                    "greaterthan", ">",         "ge",          ">=",       "in",
                                    "odd",         "even",      "divisibleby", "sameas",   "lower",
                                    "upper",       NULL};

static int find(const char *const *l, const char *name, size_t n)
{
    for (int i = 0; l[i]; i++)
        if (strlen(l[i]) == n && !memcmp(l[i], name, n))
            return i;
    return -1;
}

bool gang__chat_test_known(const char *name, size_t n)
{
    return find(tests, name, n) >= 0;
}

static int range_fn(chat_ctx *c, const cv *args, size_t nargs, cv *out)
{
    int64_t v[3] = {0, 0, 1};
    if (nargs < 1 || nargs > 3)
        return gang__chat_fail(c, GANG_EMODEL, "range() takes 1 to 3 arguments");
    for (size_t i = 0; i < nargs; i++) {
        if (args[i].kind != CV_INT)
            return gang__chat_fail(c, GANG_EMODEL, "range() takes integers");
        v[nargs == 1 ? 1 : i] = args[i].u.i;
    }
    if (v[2] == 0)
        return gang__chat_fail(c, GANG_EMODEL, "range() step must not be zero");
    cv_range *r = gang__chat_alloc(&c->arena, sizeof(*r));
    if (!r)
        return gang__chat_fail(c, GANG_ERANGE, "memory limit reached");
    *r = (cv_range){.start = v[0], .stop = v[1], .step = v[2]};
    *out = (cv){.kind = CV_RANGE};
    out->u.range = r;
    if (gang__cv_length(out) > CHAT_MAX_RANGE)
        return gang__chat_fail(c, GANG_ERANGE, "range() longer than %d items", CHAT_MAX_RANGE);
    return 0;
}

static int global_fn(chat_ctx *c, const cv *fn, const cv *args, size_t nargs, const char **kwn,
                     const size_t *kwl, const cv *kwv, size_t nkw, cv *out)
{
    const char *name = fn->u.s.s;
    if (!strcmp(name, "range")) {
        if (nkw)
            return gang__chat_fail(c, GANG_EMODEL, "range() takes no keyword arguments");
        return range_fn(c, args, nargs, out);
    }
    if (!strcmp(name, "namespace") || !strcmp(name, "dict")) {
        if (nargs)
            return gang__chat_fail(c, GANG_EMODEL,
                                   "%s() with positional arguments is not supported", name);
        cv_dict *d = gang__chat_alloc(&c->arena, sizeof(*d));
        if (!d)
            return gang__chat_fail(c, GANG_ERANGE, "memory limit reached");
        for (size_t i = 0; i < nkw; i++) {
            cv k = gang__cv_str(kwn[i], kwl[i]);
            int rc = gang__cv_dict_set(c, d, &k, &kwv[i]);
            if (rc)
                return rc;
        }
        *out = (cv){.kind = name[0] == 'n' ? CV_NS : CV_DICT};
        out->u.dict = d;
        return 0;
    }
    if (nkw || nargs != 1 || args[0].kind != CV_STR)
        return gang__chat_fail(c, GANG_EMODEL, "%s() takes one string", name);
    if (!strcmp(name, "raise_exception"))
        return gang__chat_fail(c, GANG_EINVAL, "raise_exception: %.*s", (int)args[0].u.s.n,
                               args[0].u.s.s);
    /* strftime_now */
    char fmt[128], buf[256];
    if (args[0].u.s.n >= sizeof(fmt))
        return gang__chat_fail(c, GANG_EMODEL, "strftime_now(): format too long");
    memcpy(fmt, args[0].u.s.s, args[0].u.s.n);
    fmt[args[0].u.s.n] = 0;
    time_t now = time(NULL);
    struct tm tm;
    localtime_r(&now, &tm);
    /* strftime_now(format) takes its format from the template: not a literal by design
     * (strftime reads no arguments through it, so a format cannot reach past tm). */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral"
    size_t n = strftime(buf, sizeof(buf), fmt, &tm);
#pragma GCC diagnostic pop
    char *s = gang__chat_alloc(&c->arena, n + 1);
    if (!s)
        return gang__chat_fail(c, GANG_ERANGE, "memory limit reached");
    memcpy(s, buf, n);
    *out = gang__cv_str(s, n);
    return 0;
}

int gang__chat_call(chat_ctx *c, const cv *fn, const cv *args, size_t nargs, const char **kwn,
                    const size_t *kwl, const cv *kwv, size_t nkw, cv *out)
{
    switch (fn->kind) {
    case CV_FUNC:
        return global_fn(c, fn, args, nargs, kwn, kwl, kwv, nkw, out);
    case CV_MACRO:
        return gang__chat_call_macro(c, fn->u.macro, args, nargs, kwn, kwl, kwv, nkw, out);
    case CV_METHOD:
        if (nkw)
            return gang__chat_fail(c, GANG_EMODEL, "keyword arguments to .%.*s() are not supported",
                                   (int)fn->u.s.n, fn->u.s.s);
        return gang__chat_method(c, fn->u.s.self, fn->u.s.s, fn->u.s.n, args, nargs, out);
    case CV_UNDEF:
        if (fn->u.s.s)
            return gang__chat_fail(c, GANG_EMODEL,
                                   "'%.*s' is undefined (or a method that is not supported)",
                                   (int)fn->u.s.n, fn->u.s.s);
        return gang__chat_fail(c, GANG_EMODEL, "call of an undefined value");
    default:
        return gang__chat_fail(c, GANG_EMODEL, "a %s is not callable", gang__cv_type_name(fn));
    }
}

/* A comparison test (eq, lt, ...: K is its index in `tests`) of A against B. */
static int compare_test(chat_ctx *c, int k, const cv *a, const cv *b, bool *out)
{
    int cmp = 0, rc;
    if (k <= 18) {
        bool eq;
        if ((rc = gang__cv_equal_c(c, a, b, &eq)))
            return rc;
        *out = eq == (k <= 16);
        return 0;
    }
    if ((rc = gang__cv_compare(c, a, b, &cmp)))
        return rc;
    *out = k <= 21 ? cmp < 0 : k <= 23 ? cmp <= 0 : k <= 26 ? cmp > 0 : cmp >= 0;
    return 0;
}

int gang__chat_test(chat_ctx *c, const char *name, size_t n, const cv *args, size_t nargs,
                    bool *out)
{
    int k = find(tests, name, n);
    const cv *v = &args[0];
    cv_kind t = v->kind;
    bool two = (k >= 14 && k <= 29) || k == 32 || k == 33;
    if (k < 0)
        return gang__chat_fail(c, GANG_EMODEL, "no test named '%.*s'", (int)n, name);
    if (gang__chat_step(c, gang__cv_cost(v) + (nargs > 1 ? gang__cv_cost(&args[1]) : 0)))
        return GANG_ERANGE;
    if (nargs != (two ? 2u : 1u))
        return gang__chat_fail(c, GANG_EMODEL, "test '%s' takes %d argument%s", tests[k],
                               two ? 1 : 0, two ? "" : "s");
    switch (k) {
    case 0:
    case 1:
        *out = (t != CV_UNDEF) == (k == 0);
        return 0;
    case 2:
        *out = t == CV_NONE;
        return 0;
    case 3:
        *out = t == CV_STR;
        return 0;
    case 4:
        *out = t == CV_INT || t == CV_FLOAT || t == CV_BOOL;
        return 0;
    case 5:
    case 6:
        *out = t == (k == 5 ? CV_INT : CV_FLOAT);
        return 0;
    case 7:
    case 8:
    case 9:
        *out = t == CV_BOOL && (k == 7 || v->u.b == (k == 8));
        return 0;
    case 10:
        *out = t == CV_DICT;
        return 0;
    case 11:
    case 12:
        *out = t == CV_STR || t == CV_LIST || t == CV_DICT || t == CV_RANGE || t == CV_UNDEF;
        if (k == 12 && gang__cv_is_gen(v))
            *out = false;
        return 0;
    case 13:
        /* jinja2's Undefined has __call__ (which raises): callable() is true */
        *out = t == CV_FUNC || t == CV_METHOD || t == CV_MACRO || t == CV_UNDEF;
        return 0;
    case 29: {
        cv r = {.kind = CV_NONE};
        int rc = gang__chat_binary(c, OP_IN, v, &args[1], &r);
        *out = !rc && r.u.b;
        return rc;
    }
    case 30:
    case 31:
    case 32:
        if (t != CV_INT || (k == 32 && (args[1].kind != CV_INT || args[1].u.i == 0)))
            return gang__chat_fail(c, GANG_EMODEL, "test '%s' takes integers", tests[k]);
        *out = k == 32 ? v->u.i % args[1].u.i == 0 : (v->u.i % 2 != 0) == (k == 30);
        return 0;
    case 33:
        *out = t == args[1].kind && (t == CV_NONE || t == CV_BOOL) && gang__cv_equal(v, &args[1]);
        return 0;
    case 34:
    case 35: { /* str(value).islower() / isupper() */
        bool cased = false, wrong = false;
        cv sv;
        int rc = gang__cv_to_str(c, v, &sv);
        if (rc)
            return rc;
        v = &sv;
        for (size_t i = 0; i < v->u.s.n; i++) {
            unsigned char ch = (unsigned char)v->u.s.s[i];
            if (ch >= 0x80)
                return gang__chat_fail(c, GANG_EMODEL,
                                       "case tests of non-ASCII text are not supported");
            bool lo = ch >= 'a' && ch <= 'z', up = ch >= 'A' && ch <= 'Z';
            cased |= lo || up;
            wrong |= k == 34 ? up : lo;
        }
        *out = cased && !wrong;
        return 0;
    }
    default:
        return compare_test(c, k, v, &args[1], out);
    }
}
