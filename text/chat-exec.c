/*
 * Execution of chat-template statements (output, if, for, set, macro definitions, loop
 * control) and the arithmetic of the operators, with Python's rules: int results are
 * 64-bit and an overflow is an error (Python's would grow), / always gives a float, //
 * and % round toward negative infinity, + joins strings and lists, * repeats them.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "chat-internal.h"

static int type_error(chat_ctx *c, const char *op, const cv *a, const cv *b)
{
    if (a->kind == CV_UNDEF || (b && b->kind == CV_UNDEF)) {
        const cv *u = a->kind == CV_UNDEF ? a : b;
        if (u->u.s.s)
            return gang__chat_fail(c, GANG_EMODEL, "'%.*s' is undefined", (int)u->u.s.n, u->u.s.s);
        return gang__chat_fail(c, GANG_EMODEL, "use of an undefined value with '%s'", op);
    }
    if (!b)
        return gang__chat_fail(c, GANG_EMODEL, "unsupported operand type for unary %s: %s", op,
                               gang__cv_type_name(a));
    return gang__chat_fail(c, GANG_EMODEL, "unsupported operand types for %s: %s and %s", op,
                           gang__cv_type_name(a), gang__cv_type_name(b));
}

static bool num(const cv *v)
{
    return v->kind == CV_INT || v->kind == CV_FLOAT || v->kind == CV_BOOL;
}

static int64_t ival(const cv *v)
{
    return v->kind == CV_INT ? v->u.i : v->kind == CV_BOOL ? (int64_t)v->u.b : 0;
}

static double fval(const cv *v)
{
    return v->kind == CV_FLOAT ? v->u.f : (double)ival(v);
}

/* S repeated (or two strings joined) into a new string; bounded by the output limit. */
static int str_repeat(chat_ctx *c, const cv *a, const cv *b, int64_t times, cv *out)
{
    size_t n1 = a->u.s.n, n2 = b ? b->u.s.n : 0;
    if (times < 0 || n1 == 0) /* '' * 2**40 must not loop 2**40 times */
        times = 0;
    if (times && n1 && (uint64_t)times > (uint64_t)c->out.limit / n1)
        return gang__chat_fail(c, GANG_ERANGE, "string longer than the output limit");
    size_t n = n1 * (size_t)times + n2;
    if (n > c->out.limit)
        return gang__chat_fail(c, GANG_ERANGE, "string longer than the output limit");
    char *s = gang__chat_alloc(&c->arena, n + 1);
    if (!s)
        return gang__chat_fail(c, GANG_ERANGE, "memory limit reached");
    for (int64_t i = 0; i < times; i++)
        memcpy(s + (size_t)i * n1, a->u.s.s, n1);
    if (n2)
        memcpy(s + n1 * (size_t)times, b->u.s.s, n2);
    *out = gang__cv_str(s, n);
    return gang__chat_step(c, n / 256);
}

/* A list repeated TIMES times, or A then B. */
static int list_join(chat_ctx *c, const cv_list *a, const cv_list *b, int64_t times, cv *out)
{
    if (times < 0 || a->n == 0) /* [] * 2**40 must not loop 2**40 times */
        times = 0;
    if (a->n && (uint64_t)times > (uint64_t)(c->out.limit / 16) / a->n)
        return gang__chat_fail(c, GANG_ERANGE, "list too long");
    size_t n = a->n * (size_t)times + (b ? b->n : 0);
    cv_list *l = gang__chat_alloc(&c->arena, sizeof(*l));
    cv *v = gang__chat_alloc(&c->arena, (n + 1) * sizeof(cv));
    if (!l || !v)
        return gang__chat_fail(c, GANG_ERANGE, "memory limit reached");
    for (int64_t i = 0; i < times; i++)
        if (a->n)
            memcpy(v + (size_t)i * a->n, a->v, a->n * sizeof(cv));
    if (b && b->n)
        memcpy(v + a->n * (size_t)times, b->v, b->n * sizeof(cv));
    *l = (cv_list){.n = n, .v = v};
    *out = (cv){.kind = CV_LIST};
    out->u.list = l;
    return gang__chat_step(c, n);
}

/* Markup + str (either order), as markupsafe does: the plain side is HTML-escaped and the
 * result is Markup. */
static int markup_add(chat_ctx *c, const cv *a, const cv *b, cv *out)
{
    chat_buf buf = {.limit = c->out.limit};
    const cv *side[2] = {a, b};
    int rc = 0;
    for (int k = 0; k < 2 && !rc; k++) {
        const cv *v = side[k];
        size_t run = 0;
        for (size_t i = 0; i < v->u.s.n && !rc && !v->markup; i++) {
            const char *e = NULL;
            switch (v->u.s.s[i]) {
            case '&':
                e = "&amp;";
                break;
            case '<':
                e = "&lt;";
                break;
            case '>':
                e = "&gt;";
                break;
            case '"':
                e = "&#34;";
                break;
            case '\'':
                e = "&#39;";
                break;
            default:
                continue;
            }
            rc = gang__buf_put(c, &buf, v->u.s.s + run, i - run);
            if (!rc)
                rc = gang__buf_put(c, &buf, e, strlen(e));
            run = i + 1;
        }
        if (!rc)
            rc = gang__buf_put(c, &buf, v->u.s.s + run, v->u.s.n - run);
    }
    if (!rc)
        rc = gang__buf_to_cv(c, &buf, out);
    free(buf.p);
    out->markup = true;
    return rc;
}

/* +, -, *, /, //, %, ** on numbers (A and B numeric). */
static int arith(chat_ctx *c, int op, const cv *a, const cv *b, cv *out)
{
    static const char *const names[] = {"", "+", "-", "*", "/", "//", "%", "**"};
    bool fl = a->kind == CV_FLOAT || b->kind == CV_FLOAT || op == OP_DIV;
    int64_t x = ival(a), y = ival(b), r = 0;
    if (!fl && op == OP_POW && y < 0)
        fl = true;
    if (fl) {
        double p = fval(a), q = fval(b), f;
        if ((op == OP_DIV || op == OP_FLOORDIV || op == OP_MOD) && q == 0.0)
            return gang__chat_fail(c, GANG_EMODEL, "division by zero");
        f = op == OP_ADD        ? p + q
            : op == OP_SUB      ? p - q
            : op == OP_MUL      ? p * q
            : op == OP_DIV      ? p / q
            : op == OP_FLOORDIV ? floor(p / q)
            : op == OP_MOD      ? p - floor(p / q) * q
                                : pow(p, q);
        *out = (cv){.kind = CV_FLOAT};
        out->u.f = f;
        return 0;
    }
    bool ovf = false;
    switch (op) {
    case OP_ADD:
        ovf = __builtin_add_overflow(x, y, &r);
        break;
    case OP_SUB:
        ovf = __builtin_sub_overflow(x, y, &r);
        break;
    case OP_MUL:
        ovf = __builtin_mul_overflow(x, y, &r);
        break;
    case OP_FLOORDIV:
    case OP_MOD:
        if (y == 0)
            return gang__chat_fail(c, GANG_EMODEL, "division by zero");
        if (x == INT64_MIN && y == -1)
            return gang__chat_fail(c, GANG_ERANGE, "integer overflow in '%s'", names[op]);
        r = op == OP_FLOORDIV ? x / y - ((x % y != 0) && ((x < 0) != (y < 0)))
                              : x % y + (((x % y != 0) && ((x < 0) != (y < 0))) ? y : 0);
        break;
    default: /* OP_POW, by squaring: 1 ** 2**62 must not loop 2**62 times */
        r = 1;
        for (int64_t base = x, e = y; e > 0 && !ovf; e >>= 1) {
            if (e & 1)
                ovf = __builtin_mul_overflow(r, base, &r);
            if (e > 1 && !ovf)
                ovf = __builtin_mul_overflow(base, base, &base);
        }
        break;
    }
    if (ovf)
        return gang__chat_fail(c, GANG_ERANGE, "integer overflow in '%s'", names[op]);
    *out = gang__cv_int(r);
    return 0;
}

/* `a in b` with Python's rules; undefined B holds nothing. */
static int contains(chat_ctx *c, const cv *a, const cv *b, bool *r)
{
    *r = false;
    if (b->kind == CV_STR) {
        if (a->kind != CV_STR)
            return type_error(c, "in", a, b);
        if (!a->u.s.n) {
            *r = true;
            return 0;
        }
        for (size_t i = 0; i + a->u.s.n <= b->u.s.n && !*r; i++)
            *r = !memcmp(b->u.s.s + i, a->u.s.s, a->u.s.n);
        return gang__chat_step(c, b->u.s.n / 256);
    }
    if (b->kind == CV_DICT && (a->kind == CV_LIST || a->kind == CV_DICT || a->kind == CV_NS))
        return gang__chat_fail(c, GANG_EMODEL, "unhashable type: %s", gang__cv_type_name(a));
    if (b->kind == CV_LIST || b->kind == CV_DICT || b->kind == CV_UNDEF || b->kind == CV_RANGE) {
        cv_list items;
        int rc = gang__cv_items(c, b, &items);
        for (size_t i = 0; !rc && i < items.n && !*r; i++)
            rc = gang__cv_equal_c(c, a, &items.v[i], r);
        return rc ? rc : gang__chat_step(c, items.n);
    }
    return type_error(c, "in", a, b);
}

int gang__chat_binary(chat_ctx *c, int op, const cv *a, const cv *b, cv *out)
{
    static const char *const names[] = {"",   "+",  "-", "*",  "/", "//", "%",  "**",    "~",
                                        "==", "!=", "<", "<=", ">", ">=", "in", "not in"};
    int cmp, rc;
    bool r;
    if (!b) {
        if (!num(a))
            return type_error(c, op == OP_NEG ? "-" : "+", a, NULL);
        if (a->kind == CV_FLOAT) {
            *out = (cv){.kind = CV_FLOAT};
            out->u.f = op == OP_NEG ? -a->u.f : a->u.f;
        } else if (op == OP_NEG && ival(a) == INT64_MIN) {
            return gang__chat_fail(c, GANG_ERANGE, "integer overflow in '-'");
        } else {
            *out = gang__cv_int(op == OP_NEG ? -ival(a) : ival(a));
        }
        return 0;
    }
    if ((rc = gang__chat_step(c, gang__cv_cost(a) + gang__cv_cost(b))))
        return rc;
    switch (op) {
    case OP_CONCAT: {
        cv sa, sb;
        if ((rc = gang__cv_to_str(c, a, &sa)) || (rc = gang__cv_to_str(c, b, &sb)))
            return rc;
        return str_repeat(c, &sa, &sb, 1, out);
    }
    case OP_EQ:
    case OP_NE:
        if ((rc = gang__cv_equal_c(c, a, b, &r)))
            return rc;
        *out = (cv){.kind = CV_BOOL};
        out->u.b = r == (op == OP_EQ);
        return 0;
    case OP_LT:
    case OP_LE:
    case OP_GT:
    case OP_GE:
        if ((rc = gang__cv_compare(c, a, b, &cmp)))
            return rc;
        *out = (cv){.kind = CV_BOOL};
        out->u.b = op == OP_LT   ? cmp < 0
                   : op == OP_LE ? cmp <= 0
                   : op == OP_GT ? cmp > 0
                                 : cmp >= 0;
        return 0;
    case OP_IN:
    case OP_NOTIN:
        if ((rc = contains(c, a, b, &r)))
            return rc;
        *out = (cv){.kind = CV_BOOL};
        out->u.b = op == OP_IN ? r : !r;
        return 0;
    default:
        break;
    }
    if (num(a) && num(b))
        return arith(c, op, a, b, out);
    if (op == OP_ADD && a->kind == CV_STR && b->kind == CV_STR && (a->markup || b->markup))
        return markup_add(c, a, b, out);
    if (op == OP_ADD && a->kind == CV_STR && b->kind == CV_STR)
        return str_repeat(c, a, b, 1, out);
    if (gang__cv_is_lazy(a) || gang__cv_is_lazy(b) || a->markup || b->markup)
        return type_error(c, names[op], a, b);
    if (op == OP_ADD && a->kind == CV_LIST && b->kind == CV_LIST)
        return list_join(c, a->u.list, b->u.list, 1, out);
    if (op == OP_MUL && (a->kind == CV_STR || a->kind == CV_LIST) &&
        (b->kind == CV_INT || b->kind == CV_BOOL)) {
        return a->kind == CV_STR ? str_repeat(c, a, NULL, ival(b), out)
                                 : list_join(c, a->u.list, NULL, ival(b), out);
    }
    if (op == OP_MUL && (b->kind == CV_STR || b->kind == CV_LIST) &&
        (a->kind == CV_INT || a->kind == CV_BOOL))
        return gang__chat_binary(c, op, b, a, out);
    if (op == OP_MOD && a->kind == CV_STR)
        return gang__chat_fail(c, GANG_EMODEL, "string formatting with %% is not supported");
    return type_error(c, names[op], a, b);
}

/* {% for %}: binds the target and `loop` in a frame of the loop's own, so that names set
 * inside do not leak out (as in jinja2). */
static int exec_for(chat_ctx *c, const gang__chat_node *n)
{
    cv it;
    cv_list items;
    int rc = gang__chat_eval(c, n->b, &it);
    if (rc)
        return rc;
    if ((rc = gang__cv_items(c, &it, &items)))
        return rc;
    chat_frame frame = {.parent = c->frame}, *saved = c->frame;
    c->frame = &frame;
    if (n->e) { /* the loop filter: keep the items it accepts */
        cv *kept = gang__chat_alloc(&c->arena, (items.n + 1) * sizeof(cv));
        size_t k = 0;
        if (!kept) {
            rc = gang__chat_fail(c, GANG_ERANGE, "memory limit reached");
            goto out;
        }
        for (size_t i = 0; i < items.n; i++) {
            cv ok;
            if ((rc = gang__chat_assign(c, n->a, &items.v[i])) ||
                (rc = gang__chat_eval(c, n->e, &ok)))
                goto out;
            if (gang__cv_truthy(&ok))
                kept[k++] = items.v[i];
        }
        items = (cv_list){.n = k, .v = kept};
    }
    chat_loop *loop = gang__chat_alloc(&c->arena, sizeof(*loop));
    if (!loop) {
        rc = gang__chat_fail(c, GANG_ERANGE, "memory limit reached");
        goto out;
    }
    loop->items = items.v;
    loop->n = items.n;
    cv lv = {.kind = CV_LOOP};
    lv.u.loop = loop;
    for (size_t i = 0; i < items.n; i++) {
        loop->i = i;
        if ((rc = gang__chat_step(c, 1)) || (rc = gang__chat_assign(c, n->a, &items.v[i])) ||
            (rc = gang__chat_frame_set(c, &frame, "loop", 4, &lv)))
            goto out;
        rc = gang__chat_exec(c, n->c);
        if (rc == CHAT_BREAK) {
            rc = 0;
            break;
        }
        if (rc == CHAT_CONTINUE)
            rc = 0;
        if (rc)
            goto out;
    }
    if (!items.n && n->d)
        rc = gang__chat_exec(c, n->d);
out:
    c->frame = saved;
    return rc;
}

int gang__chat_exec(chat_ctx *c, const gang__chat_node *n)
{
    cv v;
    int rc = gang__chat_step(c, 1);
    if (rc)
        return rc;
    c->line = n->line;
    switch (n->kind) {
    case N_BLOCK:
        for (size_t i = 0; i < n->nitems; i++)
            if ((rc = gang__chat_exec(c, n->items[i])))
                return rc;
        return 0;
    case N_TEXT:
        return gang__buf_put(c, &c->out, n->s, n->n);
    case N_OUTPUT:
        if ((rc = gang__chat_eval(c, n->a, &v)))
            return rc;
        return gang__cv_str_into(c, &c->out, &v);
    case N_IF:
        if ((rc = gang__chat_eval(c, n->a, &v)))
            return rc;
        if (gang__cv_truthy(&v))
            return gang__chat_exec(c, n->b);
        return n->c ? gang__chat_exec(c, n->c) : 0;
    case N_FOR:
        return exec_for(c, n);
    case N_SET:
        if ((rc = gang__chat_eval(c, n->b, &v)))
            return rc;
        c->line = n->line;
        return gang__chat_assign(c, n->a, &v);
    case N_SETBLOCK:
        if ((rc = gang__chat_capture(c, n->c, &v)))
            return rc;
        return gang__chat_assign(c, n->a, &v);
    case N_MACRO:
        v = (cv){.kind = CV_MACRO};
        v.u.macro = n;
        return gang__chat_frame_set(c, c->frame, n->s, n->n, &v);
    case N_BREAK:
        return CHAT_BREAK;
    case N_CONTINUE:
        return CHAT_CONTINUE;
    default:
        return gang__chat_fail(c, GANG_EINTERNAL, "node %d is not a statement", (int)n->kind);
    }
}
