/*
 * Evaluation of chat-template expressions: names and scopes, attributes and subscripts
 * (jinja2's order: for a.b the attribute, then the item; for a[b] the item, then the
 * attribute), slices with Python's rules, calls, filters, tests and the operators.
 * Every node evaluated costs a step; an undefined value may be printed (as "") and
 * tested, but an attribute, item, call or arithmetic on it is an error, as with jinja2's
 * default Undefined.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "chat-internal.h"

#define CHAT_MAX_ARGS 16

int gang__chat_lookup(chat_ctx *c, const char *name, size_t n, cv *out)
{
    static const char *const funcs[] = {"range", "namespace", "raise_exception", "strftime_now",
                                        "dict"};
    for (chat_frame *f = c->frame; f; f = f->parent)
        for (size_t i = f->n; i > 0; i--)
            if (f->vars[i - 1].n == n && !memcmp(f->vars[i - 1].name, name, n)) {
                *out = f->vars[i - 1].v;
                return 0;
            }
    memset(out, 0, sizeof(*out));
    for (size_t k = 0; k < sizeof(funcs) / sizeof(funcs[0]); k++)
        if (strlen(funcs[k]) == n && !memcmp(funcs[k], name, n)) {
            out->kind = CV_FUNC;
            out->u.s.s = funcs[k];
            out->u.s.n = n;
            return 0;
        }
    out->kind = CV_UNDEF; /* its name, for messages */
    out->u.s.s = name;
    out->u.s.n = n;
    return 0;
}

/* Binds NAME to V in frame F (replacing an earlier binding there). */
int gang__chat_frame_set(chat_ctx *c, chat_frame *f, const char *name, size_t n, const cv *v)
{
    for (size_t i = 0; i < f->n; i++)
        if (f->vars[i].n == n && !memcmp(f->vars[i].name, name, n)) {
            f->vars[i].v = *v;
            return 0;
        }
    if (f->n == f->cap) {
        size_t cap = f->cap ? f->cap * 2 : 8;
        chat_var *nv = gang__chat_alloc(&c->arena, cap * sizeof(*nv));
        if (!nv)
            return gang__chat_fail(c, GANG_ERANGE, "memory limit reached");
        if (f->n)
            memcpy(nv, f->vars, f->n * sizeof(*nv));
        f->vars = nv;
        f->cap = cap;
    }
    f->vars[f->n++] = (chat_var){.name = name, .n = n, .v = *v};
    return 0;
}

static int undefined_error(chat_ctx *c, const cv *v)
{
    if (v->u.s.s)
        return gang__chat_fail(c, GANG_EMODEL, "'%.*s' is undefined", (int)v->u.s.n, v->u.s.s);
    return gang__chat_fail(c, GANG_EMODEL, "use of an undefined value");
}

/* An undefined value named NAME (for messages about it later). */
static cv undef_named(const char *name, size_t n)
{
    cv v = {.kind = CV_UNDEF};
    v.u.s.s = name;
    v.u.s.n = n;
    return v;
}

static int loop_attr(chat_ctx *c, const chat_loop *l, const char *name, size_t n, cv *out)
{
    static const char *const names[] = {"index", "index0", "revindex", "revindex0", "first",
                                        "last",  "length", "previtem", "nextitem"};
    int k = -1;
    for (int i = 0; i < 9; i++)
        if (strlen(names[i]) == n && !memcmp(names[i], name, n))
            k = i;
    int64_t i = (int64_t)l->i, len = (int64_t)l->n;
    switch (k) {
    case 0:
    case 1:
    case 2:
    case 3:
    case 6:
        *out = gang__cv_int(k == 0   ? i + 1
                            : k == 1 ? i
                            : k == 2 ? len - i
                            : k == 3 ? len - i - 1
                                     : len);
        return 0;
    case 4:
    case 5:
        *out = (cv){.kind = CV_BOOL};
        out->u.b = k == 4 ? i == 0 : i == len - 1;
        return 0;
    case 7:
    case 8:
        if ((k == 7 && i == 0) || (k == 8 && i + 1 >= len))
            *out = undef_named(name, n);
        else
            *out = l->items[k == 7 ? i - 1 : i + 1];
        return 0;
    default:
        return gang__chat_fail(c, GANG_EMODEL, "loop.%.*s is not supported", (int)n, name);
    }
}

int gang__chat_getattr(chat_ctx *c, const cv *obj, const char *name, size_t n, cv *out)
{
    if (obj->kind == CV_UNDEF)
        return undefined_error(c, obj);
    if (obj->kind == CV_LOOP)
        return loop_attr(c, obj->u.loop, name, n, out);
    if (obj->kind == CV_NS) {
        if (gang__cv_dict_get(obj->u.dict, name, n, out))
            *out = undef_named(name, n);
        return 0;
    }
    if (gang__chat_has_method(obj, name, n)) {
        cv *self = gang__chat_alloc(&c->arena, sizeof(*self));
        if (!self)
            return gang__chat_fail(c, GANG_ERANGE, "memory limit reached");
        *self = *obj;
        memset(out, 0, sizeof(*out));
        out->kind = CV_METHOD;
        out->u.s.s = name;
        out->u.s.n = n;
        out->u.s.self = self;
        return 0;
    }
    if (obj->kind == CV_DICT && !gang__cv_dict_get(obj->u.dict, name, n, out))
        return 0;
    *out = undef_named(name, n);
    return 0;
}

/* OBJ[KEY] (jinja2: the item, else an attribute named KEY, else undefined). */
static int getitem(chat_ctx *c, const cv *obj, const cv *key, cv *out)
{
    if (obj->kind == CV_UNDEF)
        return undefined_error(c, obj);
    if (obj->kind == CV_RANGE && key->kind == CV_INT) { /* range(n)[i] */
        int64_t len = gang__cv_length(obj), i = key->u.i < 0 ? key->u.i + len : key->u.i;
        if (i >= 0 && i < len) {
            *out = gang__cv_int(obj->u.range->start + i * obj->u.range->step);
            return 0;
        }
    }
    if (gang__cv_is_lazy(obj)) { /* a generator or view has no items: jinja2 gives undefined */
        *out = undef_named(NULL, 0);
        return 0;
    }
    if (obj->kind == CV_DICT) {
        for (size_t i = 0; i < obj->u.dict->n; i++)
            if (gang__cv_equal(&obj->u.dict->k[i], key)) {
                *out = obj->u.dict->v[i];
                return 0;
            }
    } else if ((obj->kind == CV_LIST || obj->kind == CV_STR) &&
               (key->kind == CV_INT || key->kind == CV_BOOL)) {
        int64_t i = key->kind == CV_INT ? key->u.i : key->u.b, len = gang__cv_length(obj);
        if (i < 0)
            i += len;
        if (i >= 0 && i < len) {
            if (obj->kind == CV_LIST) {
                *out = obj->u.list->v[i];
                return 0;
            }
            const char *s = obj->u.s.s; /* the i-th code point, found by walking */
            size_t at = 0, e;
            for (int64_t k = 0; k < i; k++)
                do
                    at++;
                while (at < obj->u.s.n && ((unsigned char)s[at] & 0xC0) == 0x80);
            for (e = at + 1; e < obj->u.s.n && ((unsigned char)s[e] & 0xC0) == 0x80; e++)
                ;
            *out = gang__cv_str(s + at, e - at);
            return gang__chat_step(c, gang__cv_cost(obj));
        }
    }
    if (key->kind == CV_STR && obj->kind != CV_DICT)
        return gang__chat_getattr(c, obj, key->u.s.s, key->u.s.n, out);
    if (key->kind == CV_STR && gang__chat_has_method(obj, key->u.s.s, key->u.s.n))
        return gang__chat_getattr(c, obj, key->u.s.s, key->u.s.n, out);
    *out = undef_named(NULL, 0);
    return 0;
}

/* Python's slice.indices(): the first index, step and count of OBJ[lo:hi:st]. */
static int slice_bounds(chat_ctx *c, int64_t len, const cv *lo, const cv *hi, const cv *st,
                        int64_t *first, int64_t *step, int64_t *count)
{
    const cv *parts[3] = {lo, hi, st};
    for (int k = 0; k < 3; k++)
        if (parts[k]->kind != CV_NONE && parts[k]->kind != CV_INT)
            return gang__chat_fail(c, GANG_EMODEL, "slice bounds must be integers or none");
    int64_t s = st->kind == CV_INT ? st->u.i : 1;
    if (s == 0)
        return gang__chat_fail(c, GANG_EMODEL, "slice step cannot be zero");
    int64_t b, e;
    int64_t dflt_b = s > 0 ? 0 : len - 1, dflt_e = s > 0 ? len : -1;
    b = lo->kind == CV_INT ? lo->u.i : dflt_b;
    e = hi->kind == CV_INT ? hi->u.i : dflt_e;
    if (lo->kind == CV_INT) {
        if (b < 0)
            b = b + len < 0 ? (s > 0 ? 0 : -1) : b + len;
        else if (b >= len)
            b = s > 0 ? len : len - 1;
    }
    if (hi->kind == CV_INT) {
        if (e < 0)
            e = e + len < 0 ? (s > 0 ? 0 : -1) : e + len;
        else if (e >= len)
            e = s > 0 ? len : len - 1;
    }
    int64_t n = 0;
    if (s > 0 && b < e)
        n = (e - b - 1) / s + 1;
    else if (s < 0 && e < b)
        n = (b - e - 1) / -s + 1;
    *first = b;
    *step = s;
    *count = n;
    return 0;
}

static int eval_slice(chat_ctx *c, const gang__chat_node *n, cv *out)
{
    cv obj, parts[3] = {{.kind = CV_NONE}, {.kind = CV_NONE}, {.kind = CV_NONE}};
    const gang__chat_node *pn[3] = {n->b, n->c, n->d};
    int rc = gang__chat_eval(c, n->a, &obj);
    for (int k = 0; !rc && k < 3; k++)
        if (pn[k])
            rc = gang__chat_eval(c, pn[k], &parts[k]);
    if (rc)
        return rc;
    if (obj.kind == CV_UNDEF)
        return undefined_error(c, &obj);
    if ((obj.kind != CV_LIST && obj.kind != CV_STR) || gang__cv_is_gen(&obj) || obj.markup)
        return gang__chat_fail(c, GANG_EMODEL, "cannot slice a %s%s", obj.markup ? "|safe " : "",
                               gang__cv_type_name(&obj));
    cv_list items;
    int64_t first = 0, step = 1, count = 0;
    if ((rc = gang__cv_items(c, &obj, &items)) ||
        (rc = slice_bounds(c, (int64_t)items.n, &parts[0], &parts[1], &parts[2], &first, &step,
                           &count)) ||
        (rc = gang__chat_step(c, (uint64_t)count)))
        return rc;
    if (obj.kind == CV_LIST) {
        cv_list *l = gang__chat_alloc(&c->arena, sizeof(*l));
        cv *v = gang__chat_alloc(&c->arena, ((size_t)count + 1) * sizeof(cv));
        if (!l || !v)
            return gang__chat_fail(c, GANG_ERANGE, "memory limit reached");
        for (int64_t i = 0; i < count; i++)
            v[i] = items.v[first + i * step];
        *l = (cv_list){.n = (size_t)count, .v = v, .tuple = obj.u.list->tuple};
        *out = (cv){.kind = CV_LIST};
        out->u.list = l;
        return 0;
    }
    chat_buf b = {.limit = c->out.limit};
    for (int64_t i = 0; !rc && i < count; i++)
        rc = gang__buf_put(c, &b, items.v[first + i * step].u.s.s, items.v[first + i * step].u.s.n);
    if (!rc)
        rc = gang__buf_to_cv(c, &b, out);
    free(b.p);
    return rc;
}

/* Evaluates the arguments of a call, filter or test node (items), positional into ARGS
 * after SKIP leading slots, keywords into the three KW arrays. */
static int eval_args(chat_ctx *c, const gang__chat_node *n, cv *args, size_t skip, size_t *nargs,
                     const char **kwn, size_t *kwl, cv *kwv, size_t *nkw)
{
    *nargs = skip;
    *nkw = 0;
    if (n->nitems + skip > CHAT_MAX_ARGS)
        return gang__chat_fail(c, GANG_EMODEL, "more than %d arguments", CHAT_MAX_ARGS);
    for (size_t i = 0; i < n->nitems; i++) {
        const gang__chat_node *a = n->items[i];
        int rc;
        if (a->kind == N_KWARG) {
            kwn[*nkw] = a->s;
            kwl[*nkw] = a->n;
            rc = gang__chat_eval(c, a->a, &kwv[(*nkw)++]);
        } else {
            rc = gang__chat_eval(c, a, &args[(*nargs)++]);
        }
        if (rc)
            return rc;
    }
    return 0;
}

static int eval_call(chat_ctx *c, const gang__chat_node *n, cv *out)
{
    cv fn, args[CHAT_MAX_ARGS], kwv[CHAT_MAX_ARGS];
    const char *kwn[CHAT_MAX_ARGS];
    size_t kwl[CHAT_MAX_ARGS], nargs, nkw;
    int rc = gang__chat_eval(c, n->a, &fn);
    if (!rc)
        rc = eval_args(c, n, args, 0, &nargs, kwn, kwl, kwv, &nkw);
    if (rc)
        return rc;
    c->line = n->line;
    return gang__chat_call(c, &fn, args, nargs, kwn, kwl, kwv, nkw, out);
}

static int eval_filter_or_test(chat_ctx *c, const gang__chat_node *n, cv *out)
{
    cv args[CHAT_MAX_ARGS], kwv[CHAT_MAX_ARGS];
    const char *kwn[CHAT_MAX_ARGS];
    size_t kwl[CHAT_MAX_ARGS], nargs, nkw;
    int rc = gang__chat_eval(c, n->a, &args[0]);
    if (!rc)
        rc = eval_args(c, n, args, 1, &nargs, kwn, kwl, kwv, &nkw);
    if (rc)
        return rc;
    c->line = n->line;
    if (n->kind == N_FILTER)
        return gang__chat_filter(c, n->s, n->n, args, nargs, kwn, kwl, kwv, nkw, out);
    if (nkw)
        return gang__chat_fail(c, GANG_EMODEL, "tests take no keyword arguments");
    bool r;
    if ((rc = gang__chat_test(c, n->s, n->n, args, nargs, &r)))
        return rc;
    *out = (cv){.kind = CV_BOOL};
    out->u.b = n->op ? !r : r;
    return 0;
}

static int eval_display(chat_ctx *c, const gang__chat_node *n, cv *out)
{
    int rc = 0;
    if (n->kind == N_DICT) {
        cv_dict *d = gang__chat_alloc(&c->arena, sizeof(*d));
        if (!d)
            return gang__chat_fail(c, GANG_ERANGE, "memory limit reached");
        for (size_t i = 0; !rc && i + 1 < n->nitems; i += 2) {
            cv k, v;
            if (!(rc = gang__chat_eval(c, n->items[i], &k)) &&
                !(rc = gang__chat_eval(c, n->items[i + 1], &v)))
                rc = k.kind == CV_LIST || k.kind == CV_DICT || k.kind == CV_UNDEF
                         ? gang__chat_fail(c, GANG_EMODEL, "unhashable dict key: %s",
                                           gang__cv_type_name(&k))
                         : gang__cv_dict_set(c, d, &k, &v);
        }
        *out = (cv){.kind = CV_DICT};
        out->u.dict = d;
        return rc;
    }
    cv_list *l = gang__chat_alloc(&c->arena, sizeof(*l));
    cv *v = gang__chat_alloc(&c->arena, (n->nitems + 1) * sizeof(cv));
    if (!l || !v)
        return gang__chat_fail(c, GANG_ERANGE, "memory limit reached");
    for (size_t i = 0; !rc && i < n->nitems; i++)
        rc = gang__chat_eval(c, n->items[i], &v[i]);
    *l = (cv_list){.n = n->nitems, .v = v, .tuple = n->kind == N_TUPLE};
    *out = (cv){.kind = CV_LIST};
    out->u.list = l;
    return rc;
}

int gang__chat_eval(chat_ctx *c, const gang__chat_node *n, cv *out)
{
    cv a, b;
    int rc = gang__chat_step(c, 1);
    if (rc)
        return rc;
    c->line = n->line;
    memset(out, 0, sizeof(*out));
    switch (n->kind) {
    case N_CONST:
        *out = n->v;
        return 0;
    case N_NAME:
        return gang__chat_lookup(c, n->s, n->n, out);
    case N_ATTR:
        if ((rc = gang__chat_eval(c, n->a, &a)))
            return rc;
        c->line = n->line;
        return gang__chat_getattr(c, &a, n->s, n->n, out);
    case N_ITEM:
        if ((rc = gang__chat_eval(c, n->a, &a)) || (rc = gang__chat_eval(c, n->b, &b)))
            return rc;
        c->line = n->line;
        return getitem(c, &a, &b, out);
    case N_SLICE:
        return eval_slice(c, n, out);
    case N_CALL:
        return eval_call(c, n, out);
    case N_FILTER:
    case N_TEST:
        return eval_filter_or_test(c, n, out);
    case N_UNARY:
    case N_BINARY:
        if ((rc = gang__chat_eval(c, n->a, &a)) ||
            (n->kind == N_BINARY && (rc = gang__chat_eval(c, n->b, &b))))
            return rc;
        c->line = n->line;
        return gang__chat_binary(c, n->op, &a, n->kind == N_BINARY ? &b : NULL, out);
    case N_AND:
    case N_OR:
        if ((rc = gang__chat_eval(c, n->a, out)))
            return rc;
        if (gang__cv_truthy(out) == (n->kind == N_OR))
            return 0;
        return gang__chat_eval(c, n->b, out);
    case N_NOT:
        if ((rc = gang__chat_eval(c, n->a, &a)))
            return rc;
        *out = (cv){.kind = CV_BOOL};
        out->u.b = !gang__cv_truthy(&a);
        return 0;
    case N_COND:
        if ((rc = gang__chat_eval(c, n->a, &a)))
            return rc;
        if (gang__cv_truthy(&a))
            return gang__chat_eval(c, n->b, out);
        if (n->c)
            return gang__chat_eval(c, n->c, out);
        out->kind = CV_UNDEF;
        return 0;
    case N_LIST:
    case N_TUPLE:
    case N_DICT:
        return eval_display(c, n, out);
    default:
        return gang__chat_fail(c, GANG_EINTERNAL, "node %d is not an expression", (int)n->kind);
    }
}

/* Assigns V to TARGET (a name, a namespace attribute or a tuple of names) in the current
 * frame. */
int gang__chat_assign(chat_ctx *c, const gang__chat_node *t, const cv *v)
{
    if (t->kind == N_NAME)
        return gang__chat_frame_set(c, c->frame, t->s, t->n, v);
    if (t->kind == N_ATTR) {
        cv ns;
        gang__chat_lookup(c, t->a->s, t->a->n, &ns);
        if (ns.kind != CV_NS)
            return gang__chat_fail(c, GANG_EMODEL, "cannot assign an attribute of a %s ('%.*s')",
                                   gang__cv_type_name(&ns), (int)t->a->n, t->a->s);
        cv k = gang__cv_str(t->s, t->n);
        return gang__cv_dict_set(c, ns.u.dict, &k, v);
    }
    cv_list items;
    int rc = gang__cv_items(c, v, &items);
    if (rc)
        return rc;
    if (v->kind == CV_UNDEF || v->kind == CV_DICT || items.n != t->nitems)
        return gang__chat_fail(c, GANG_EMODEL, "cannot unpack a %s into %zu names",
                               gang__cv_type_name(v), t->nitems);
    for (size_t i = 0; !rc && i < t->nitems; i++)
        rc = gang__chat_frame_set(c, c->frame, t->items[i]->s, t->items[i]->n, &items.v[i]);
    return rc;
}

/* Renders BODY into a string of its own (block sets and macros). */
int gang__chat_capture(chat_ctx *c, const gang__chat_node *body, cv *out)
{
    chat_buf saved = c->out;
    c->out = (chat_buf){.limit = saved.limit};
    int rc = gang__chat_exec(c, body);
    if (rc == CHAT_BREAK || rc == CHAT_CONTINUE)
        rc = gang__chat_fail(c, GANG_EINTERNAL, "loop control escaped its loop");
    if (!rc)
        rc = gang__buf_to_cv(c, &c->out, out);
    free(c->out.p);
    c->out = saved;
    return rc;
}

int gang__chat_call_macro(chat_ctx *c, const gang__chat_node *m, const cv *args, size_t nargs,
                          const char **kwn, const size_t *kwl, const cv *kwv, size_t nkw, cv *out)
{
    if (c->calls >= CHAT_MAX_CALL_DEPTH)
        return gang__chat_fail(c, GANG_ERANGE, "macro calls nested deeper than %d",
                               CHAT_MAX_CALL_DEPTH);
    if (nargs > m->nitems)
        return gang__chat_fail(c, GANG_EMODEL, "macro '%.*s' takes %zu arguments, got %zu",
                               (int)m->n, m->s, m->nitems, nargs);
    chat_frame frame = {.parent = c->globals}, *saved = c->frame;
    int rc = 0;
    for (size_t i = 0; !rc && i < m->nitems; i++) {
        const gang__chat_node *p = m->items[i];
        cv v = undef_named(p->s, p->n);
        bool set = i < nargs;
        if (set)
            v = args[i];
        for (size_t k = 0; k < nkw; k++)
            if (kwl[k] == p->n && !memcmp(kwn[k], p->s, p->n)) {
                if (set)
                    return gang__chat_fail(c, GANG_EMODEL, "argument '%.*s' given twice", (int)p->n,
                                           p->s);
                v = kwv[k];
                set = true;
            }
        c->frame = &frame;
        if (!set && p->kind == N_KWARG)
            rc = gang__chat_eval(c, p->a, &v);
        if (!rc)
            rc = gang__chat_frame_set(c, &frame, p->s, p->n, &v);
        c->frame = saved;
    }
    for (size_t k = 0; !rc && k < nkw; k++) {
        bool known = false;
        for (size_t i = 0; i < m->nitems; i++)
            known |= kwl[k] == m->items[i]->n && !memcmp(kwn[k], m->items[i]->s, kwl[k]);
        if (!known)
            rc = gang__chat_fail(c, GANG_EMODEL, "macro '%.*s' has no parameter '%.*s'", (int)m->n,
                                 m->s, (int)kwl[k], kwn[k]);
    }
    if (rc)
        return rc;
    c->frame = &frame;
    c->calls++;
    rc = gang__chat_capture(c, m->c, out);
    c->calls--;
    c->frame = saved;
    return rc;
}
