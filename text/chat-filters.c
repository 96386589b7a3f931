/*
 * jinja2's filters as chat templates use them, and transformers' tojson (json.dumps with
 * ensure_ascii=False and an optional indent / sort_keys; other options are refused). A
 * filter gets its value in args[0] and its own arguments after it.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "chat-internal.h"

static const char *const filters[] = {
    "trim",   "length", "count",      "tojson",     "first",   "last", "join",
    "upper",  "lower",  "title",      "capitalize", "default", "d",    "string",
    "int",    "float",  "list",       "items",      "reverse", "safe", "replace",
    "select", "reject", "selectattr", "rejectattr", "map",     "abs",  NULL};

static int find_filter(const char *name, size_t n)
{
    for (int i = 0; filters[i]; i++)
        if (strlen(filters[i]) == n && !memcmp(filters[i], name, n))
            return i;
    return -1;
}

bool gang__chat_filter_known(const char *name, size_t n)
{
    return find_filter(name, n) >= 0;
}

static const cv *kwarg(const char **kwn, const size_t *kwl, const cv *kwv, size_t nkw,
                       const char *name)
{
    for (size_t i = 0; i < nkw; i++)
        if (kwl[i] == strlen(name) && !memcmp(kwn[i], name, kwl[i]))
            return &kwv[i];
    return NULL;
}

/* tojson(indent=None, sort_keys=False, ensure_ascii=False). */
static int f_tojson(chat_ctx *c, const cv *v, const cv *args, size_t nargs, const char **kwn,
                    const size_t *kwl, const cv *kwv, size_t nkw, cv *out)
{
    int indent = -1, flags = 0;
    (void)args;
    if (nargs)
        return gang__chat_fail(c, GANG_EMODEL, "tojson: positional arguments are not supported");
    for (size_t i = 0; i < nkw; i++) {
        const cv *a = &kwv[i];
        if (kwl[i] == 6 && !memcmp(kwn[i], "indent", 6) &&
            (a->kind == CV_INT || a->kind == CV_NONE)) {
            if (a->kind == CV_INT && (a->u.i < 0 || a->u.i > 64))
                return gang__chat_fail(c, GANG_EMODEL, "tojson: indent out of range");
            indent = a->kind == CV_INT ? (int)a->u.i : -1;
        } else if (kwl[i] == 9 && !memcmp(kwn[i], "sort_keys", 9) && a->kind == CV_BOOL) {
            flags = a->u.b ? flags | CHAT_JSON_SORT : flags & ~CHAT_JSON_SORT;
        } else if (kwl[i] == 12 && !memcmp(kwn[i], "ensure_ascii", 12) && a->kind == CV_BOOL) {
            flags = a->u.b ? flags | CHAT_JSON_ASCII : flags & ~CHAT_JSON_ASCII;
        } else {
            return gang__chat_fail(c, GANG_EMODEL, "tojson: argument '%.*s' is not supported",
                                   (int)kwl[i], kwn[i]);
        }
    }
    chat_buf b = {.limit = c->out.limit};
    int rc = gang__cv_to_json(c, &b, v, indent, flags, 0);
    if (!rc)
        rc = gang__buf_to_cv(c, &b, out);
    free(b.p);
    return rc;
}

/* join(d='', attribute=None). */
static int f_join(chat_ctx *c, const cv *v, const cv *args, size_t nargs, const cv *attr, cv *out)
{
    cv_list items;
    cv sep = gang__cv_str("", 0);
    int rc = gang__cv_items(c, v, &items);
    if (nargs > 1 || (nargs && args[0].kind != CV_STR))
        return gang__chat_fail(c, GANG_EMODEL, "join takes one string");
    if (nargs)
        sep = args[0];
    chat_buf b = {.limit = c->out.limit};
    for (size_t i = 0; !rc && i < items.n; i++) {
        cv it = items.v[i];
        if (i)
            rc = gang__buf_put(c, &b, sep.u.s.s, sep.u.s.n);
        if (!rc && attr && attr->kind == CV_STR)
            rc = gang__chat_getattr(c, &items.v[i], attr->u.s.s, attr->u.s.n, &it);
        if (!rc)
            rc = gang__cv_str_into(c, &b, &it);
    }
    if (!rc)
        rc = gang__buf_to_cv(c, &b, out);
    free(b.p);
    return rc;
}

/* select / reject (ATTR NULL) and selectattr / rejectattr: items whose test (args[0], or
 * truthiness without one) gives KEEP. */
static int f_select(chat_ctx *c, const cv *v, const cv *args, size_t nargs, bool attr, bool keep,
                    cv *out)
{
    cv_list items;
    cv *kept, targs[17];
    size_t k = 0, skip = attr ? 1 : 0;
    int rc = gang__cv_truthy(v) ? gang__cv_items(c, v, &items) : 0; /* jinja2: `if value:` */
    if (!gang__cv_truthy(v))
        items = (cv_list){0};
    if (rc || (rc = gang__cv_new_list(c, items.n, out, &kept)))
        return rc;
    if (attr && (nargs < 1 || args[0].kind != CV_STR))
        return gang__chat_fail(c, GANG_EMODEL, "selectattr/rejectattr take an attribute name");
    if (nargs > skip && args[skip].kind != CV_STR)
        return gang__chat_fail(c, GANG_EMODEL, "the test name must be a string");
    if (nargs > 16)
        return gang__chat_fail(c, GANG_EMODEL, "too many arguments");
    for (size_t i = 0; i < items.n; i++) {
        cv it = items.v[i];
        bool r;
        if (attr && (rc = gang__chat_getattr(c, &items.v[i], args[0].u.s.s, args[0].u.s.n, &it)))
            return rc;
        if (nargs > skip) {
            targs[0] = it;
            for (size_t a = skip + 1; a < nargs; a++)
                targs[a - skip] = args[a];
            if ((rc = gang__chat_test(c, args[skip].u.s.s, args[skip].u.s.n, targs, nargs - skip,
                                      &r)))
                return rc;
        } else {
            r = gang__cv_truthy(&it);
        }
        if (r == keep)
            kept[k++] = items.v[i];
    }
    out->u.list->n = k;
    out->u.list->gen = true;
    return 0;
}

/* map(attribute=name[, default=x]) or map('filter', args...). */
static int f_map(chat_ctx *c, const cv *v, const cv *args, size_t nargs, const char **kwn,
                 const size_t *kwl, const cv *kwv, size_t nkw, cv *out)
{
    cv_list items;
    cv *res, fargs[17];
    const cv *attr = kwarg(kwn, kwl, kwv, nkw, "attribute");
    const cv *dflt = kwarg(kwn, kwl, kwv, nkw, "default");
    int rc = gang__cv_truthy(v) ? gang__cv_items(c, v, &items) : 0; /* jinja2: `if value:` */
    if (!gang__cv_truthy(v))
        items = (cv_list){0};
    if (rc || (rc = gang__cv_new_list(c, items.n, out, &res)))
        return rc;
    if ((attr && (attr->kind != CV_STR || nargs)) || (!attr && (nargs < 1 || nkw)) ||
        (!attr && args[0].kind != CV_STR) || nargs > 16 || (dflt && nkw > 2) ||
        (!dflt && attr && nkw > 1))
        return gang__chat_fail(c, GANG_EMODEL,
                               "map takes attribute=name [default=x] or a filter name");
    for (size_t i = 0; !rc && i < items.n; i++) {
        if (attr) {
            rc = gang__chat_getattr(c, &items.v[i], attr->u.s.s, attr->u.s.n, &res[i]);
            if (!rc && dflt && res[i].kind == CV_UNDEF)
                res[i] = *dflt;
            continue;
        }
        fargs[0] = items.v[i];
        for (size_t a = 1; a < nargs; a++)
            fargs[a] = args[a];
        rc = gang__chat_filter(c, args[0].u.s.s, args[0].u.s.n, fargs, nargs, NULL, NULL, NULL, 0,
                               &res[i]);
    }
    out->u.list->gen = true;
    return rc;
}

/* int(default=0) and float(default=0.0): Python's conversion, else the default. */
static int f_number(chat_ctx *c, const cv *v, bool to_int, const cv *dflt, cv *out)
{
    double f = 0;
    bool ok = true;
    if (v->kind == CV_INT || v->kind == CV_BOOL) {
        f = v->kind == CV_INT ? (double)v->u.i : v->u.b;
        if (to_int) {
            *out = gang__cv_int(v->kind == CV_INT ? v->u.i : v->u.b);
            return 0;
        }
    } else if (v->kind == CV_FLOAT) {
        f = v->u.f;
    } else if (v->kind == CV_STR && v->u.s.n && v->u.s.n < 64) {
        char buf[64], *end;
        memcpy(buf, v->u.s.s, v->u.s.n);
        buf[v->u.s.n] = 0;
        f = strtod(buf, &end);
        while (*end == ' ' || *end == '\t' || *end == '\n')
            end++;
        ok = *end == 0 && end != buf;
        /* forms where strtod and Python disagree: hex floats (C only), 1_000 (Python only) */
        if (strchr(buf, '_') || (ok && strpbrk(buf, "xXpP")))
            return gang__chat_fail(c, GANG_EMODEL, "int/float of '%s' is not supported", buf);
    } else {
        ok = false;
    }
    if (ok && to_int && (isnan(f) || fabs(f) >= 9.2e18))
        ok = false;
    if (!ok) {
        if (dflt) {
            *out = *dflt;
        } else if (to_int) {
            *out = gang__cv_int(0);
        } else {
            *out = (cv){.kind = CV_FLOAT};
            out->u.f = 0.0;
        }
        return 0;
    }
    if (to_int) {
        *out = gang__cv_int((int64_t)f);
    } else {
        *out = (cv){.kind = CV_FLOAT};
        out->u.f = f;
    }
    return 0;
}

/* first, last, reverse and list of a sequence (K: 4, 5, 18, 16). */
static int f_sequence(chat_ctx *c, int k, const cv *v, cv *out)
{
    cv_list items;
    cv *res;
    int rc = gang__cv_items(c, v, &items);
    if (rc)
        return rc;
    if (k == 5 && gang__cv_is_gen(v))
        return gang__chat_fail(c, GANG_EMODEL, "last of a generator (select/map without |list)");
    if (k == 4 || k == 5) {
        memset(out, 0, sizeof(*out));
        if (items.n)
            *out = items.v[k == 4 ? 0 : items.n - 1];
        return 0;
    }
    if (k == 18 && v->kind == CV_STR) {
        char *s = gang__chat_alloc(&c->arena, v->u.s.n + 1);
        size_t o = v->u.s.n;
        if (!s)
            return gang__chat_fail(c, GANG_ERANGE, "memory limit reached");
        for (size_t i = 0; i < items.n; i++) {
            o -= items.v[i].u.s.n;
            memcpy(s + o, items.v[i].u.s.s, items.v[i].u.s.n);
        }
        *out = gang__cv_str(s, v->u.s.n);
        return 0;
    }
    if ((rc = gang__cv_new_list(c, items.n, out, &res)))
        return rc;
    for (size_t i = 0; i < items.n; i++)
        res[i] = items.v[k == 18 ? items.n - 1 - i : i];
    /* jinja2: reverse gives an iterator (reversed()), but a list for a generator */
    out->u.list->gen = k == 18 && !gang__cv_is_gen(v);
    return 0;
}

/* The filters on text: trim, upper, lower, title, capitalize, string, replace. */
static int f_text(chat_ctx *c, int k, const cv *args, size_t nargs, cv *out)
{
    cv s;
    int rc = gang__cv_to_str(c, &args[0], &s);
    if (rc)
        return rc;
    switch (k) {
    case 0:
        if (nargs > 2 || (nargs == 2 && args[1].kind != CV_STR && args[1].kind != CV_NONE))
            return gang__chat_fail(c, GANG_EMODEL, "trim takes one string");
        return gang__chat_strip(&s, nargs == 2 ? &args[1] : NULL, 0, out);
    case 13:
        *out = s;
        return 0;
    case 20:
        if (nargs < 3 || nargs > 4 || (nargs == 4 && args[3].kind != CV_INT))
            return gang__chat_fail(c, GANG_EMODEL, "replace takes (old, new[, count])");
        return gang__chat_replace(c, &s, &args[1], &args[2], nargs == 4 ? args[3].u.i : -1, out);
    default:
        if (nargs > 1)
            return gang__chat_fail(c, GANG_EMODEL, "filter '%s' takes no arguments", filters[k]);
        return gang__chat_case(c, &s, k == 7 ? 0 : k == 8 ? 1 : k == 9 ? 4 : 3, out);
    }
}

int gang__chat_filter(chat_ctx *c, const char *name, size_t n, const cv *args, size_t nargs,
                      const char **kwn, const size_t *kwl, const cv *kwv, size_t nkw, cv *out)
{
    int k = find_filter(name, n);
    const cv *v = &args[0];
    if (k < 0)
        return gang__chat_fail(c, GANG_EMODEL, "no filter named '%.*s'", (int)n, name);
    int rc = gang__chat_step(c, gang__cv_cost(v));
    if (rc)
        return rc;
    if (v->kind == CV_STR && v->markup && k != 1 && k != 2 && k != 3 && k != 11 && k != 12 &&
        k != 13 && k != 19)
        return gang__chat_fail(c, GANG_EMODEL, "filter '%s' of a |safe string is not supported",
                               filters[k]);
    if (nkw && k != 3 && k != 6 && k != 11 && k != 12 && k != 14 && k != 15 && k != 25)
        return gang__chat_fail(c, GANG_EMODEL, "filter '%s' takes no keyword arguments",
                               filters[k]);
    switch (k) {
    case 1:
    case 2:
        if (gang__cv_length(v) < 0)
            return gang__chat_fail(c, GANG_EMODEL, "a %s has no length", gang__cv_type_name(v));
        *out = gang__cv_int(gang__cv_length(v));
        return 0;
    case 3:
        return f_tojson(c, v, args + 1, nargs - 1, kwn, kwl, kwv, nkw, out);
    case 4:
    case 5:
    case 16:
    case 18:
        return f_sequence(c, k, v, out);
    case 6:
        return f_join(c, v, args + 1, nargs - 1, kwarg(kwn, kwl, kwv, nkw, "attribute"), out);
    case 11:
    case 12: {
        const cv *b = kwarg(kwn, kwl, kwv, nkw, "boolean");
        bool boolean = (b && gang__cv_truthy(b)) || (nargs > 2 && gang__cv_truthy(&args[2]));
        const cv *d = nargs > 1 ? &args[1] : kwarg(kwn, kwl, kwv, nkw, "default_value");
        if (v->kind == CV_UNDEF || (boolean && !gang__cv_truthy(v)))
            *out = d ? *d : gang__cv_str("", 0);
        else
            *out = *v;
        return 0;
    }
    case 14:
    case 15:
        if (v->kind == CV_UNDEF) /* jinja2: int(Undefined) raises */
            return gang__chat_fail(c, GANG_EMODEL, "%s of an undefined value", filters[k]);
        return f_number(c, v, k == 14, nargs > 1 ? &args[1] : kwarg(kwn, kwl, kwv, nkw, "default"),
                        out);
    case 17: /* jinja2's items: a generator of pairs */
        if (v->kind == CV_UNDEF)
            rc = f_sequence(c, 16, v, out);
        else if (v->kind != CV_DICT)
            return gang__chat_fail(c, GANG_EMODEL, "items of a %s", gang__cv_type_name(v));
        else
            rc = gang__chat_dict_view(c, v->u.dict, 0, out);
        if (!rc)
            out->u.list->gen = true;
        return rc;
    case 19: /* safe: markupsafe.Markup(str(value)) */
        if ((rc = gang__cv_to_str(c, v, out)))
            return rc;
        out->markup = true;
        return 0;
    case 21:
    case 22:
    case 23:
    case 24:
        return f_select(c, v, args + 1, nargs - 1, k >= 23, k == 21 || k == 23, out);
    case 25:
        return f_map(c, v, args + 1, nargs - 1, kwn, kwl, kwv, nkw, out);
    case 26:
        if (v->kind == CV_INT && v->u.i != INT64_MIN) {
            *out = gang__cv_int(v->u.i < 0 ? -v->u.i : v->u.i);
        } else if (v->kind == CV_FLOAT) {
            *out = (cv){.kind = CV_FLOAT};
            out->u.f = fabs(v->u.f);
        } else {
            return gang__chat_fail(c, GANG_EMODEL, "abs of a %s", gang__cv_type_name(v));
        }
        return 0;
    default:
        return f_text(c, k, args, nargs, out);
    }
}
