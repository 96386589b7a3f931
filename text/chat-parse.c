/*
 * The chat-template parser: tokens (chat-lex.c) to a tree of statements and expressions,
 * by recursive descent with jinja2's grammar and precedence (lowest first):
 *
 *   a if c else b  <  or  <  and  <  not  <  comparisons, in, not in  <  + -  <  ~
 *   <  * / // %  <  **  <  unary - +  <  primary with postfixes (.x, [i], [a:b:c], (args))
 *   and then filters (| f(args)) and tests (is [not] t(args)), which bind tightest.
 *
 * Statements: if/elif/else, for (with else, a filter and tuple targets), set (expression,
 * namespace attribute, tuple, block), macro, break/continue, generation (transformers'
 * extension: its body renders as is). Any other tag, and anything the grammar does not
 * cover, is refused with its line and column. Nesting is bounded (CHAT_MAX_DEPTH), so a
 * hostile template cannot overflow the stack here or in the evaluator.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "chat-internal.h"

typedef struct parser {
    gang__chat_arena *a;
    const chat_tok *t;
    size_t n, i;
    int depth, loops, macros;
    char *err;
    size_t errlen;
} parser;

static int parse_expr(parser *p, gang__chat_node **out);
static int parse_or(parser *p, gang__chat_node **out);
static int parse_unary(parser *p, gang__chat_node **out);
static int parse_body(parser *p, const char *const *ends, gang__chat_node **out, size_t *which);

static int p_fail(parser *p, const chat_tok *at, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Records "line L, column C: message" for token AT and returns GANG_EMODEL. */
static int p_fail(parser *p, const chat_tok *at, const char *fmt, ...)
{
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    if (p->err && p->errlen)
        snprintf(p->err, p->errlen, "chat template line %u, column %u: %s", at->line, at->col, msg);
    return GANG_EMODEL;
}

static const chat_tok *cur(const parser *p)
{
    return &p->t[p->i];
}

static bool is_name(const chat_tok *t, const char *name)
{
    return t->kind == T_NAME && t->n == strlen(name) && !memcmp(t->s, name, t->n);
}

static bool is_op(const chat_tok *t, const char *op)
{
    return t->kind == T_OP && t->n == strlen(op) && !memcmp(t->s, op, t->n);
}

static const char *tok_desc(const chat_tok *t, char *buf, size_t n)
{
    switch (t->kind) {
    case T_EOF:
        return "the end of the template";
    case T_TEXT:
        return "text";
    case T_VAR_BEGIN:
        return "'{{'";
    case T_VAR_END:
        return "'}}'";
    case T_BLOCK_BEGIN:
        return "'{%'";
    case T_BLOCK_END:
        return "'%}'";
    case T_STRING:
        return "a string";
    case T_INT:
    case T_FLOAT:
        return "a number";
    default:
        snprintf(buf, n, "'%.*s'", (int)(t->n > 40 ? 40 : t->n), t->s);
        return buf;
    }
}

static int expect_op(parser *p, const char *op)
{
    char b[64];
    if (!is_op(cur(p), op))
        return p_fail(p, cur(p), "expected '%s', found %s", op, tok_desc(cur(p), b, sizeof(b)));
    p->i++;
    return 0;
}

static int expect_kind(parser *p, tok_kind k, const char *what)
{
    char b[64];
    if (cur(p)->kind != k)
        return p_fail(p, cur(p), "expected %s, found %s", what, tok_desc(cur(p), b, sizeof(b)));
    p->i++;
    return 0;
}

static gang__chat_node *mk(parser *p, node_kind k, const chat_tok *at)
{
    gang__chat_node *n = gang__chat_alloc(p->a, sizeof(*n));
    if (n) {
        n->kind = k;
        n->line = at->line;
    }
    return n;
}

/* Appends ITEM to N's item list (doubling an arena array). */
static int push_item(parser *p, gang__chat_node *n, gang__chat_node *item)
{
    if ((n->nitems & (n->nitems - 1)) == 0) { /* 0, 1, 2, 4, ...: grow */
        size_t cap = n->nitems ? n->nitems * 2 : 1;
        gang__chat_node **v = gang__chat_alloc(p->a, cap * sizeof(*v));
        if (!v)
            return GANG_ENOMEM;
        if (n->nitems)
            memcpy(v, n->items, n->nitems * sizeof(*v));
        n->items = v;
    }
    n->items[n->nitems++] = item;
    return 0;
}

static int enter(parser *p)
{
    if (++p->depth > CHAT_MAX_DEPTH)
        return p_fail(p, cur(p), "nesting deeper than %d", CHAT_MAX_DEPTH);
    return 0;
}

/* Call arguments after '(' through ')': positional expressions, then name=expr. */
static int parse_args(parser *p, gang__chat_node *call)
{
    int rc;
    while (!is_op(cur(p), ")")) {
        if (call->nitems && (rc = expect_op(p, ",")))
            return rc;
        if (is_op(cur(p), ")"))
            break;
        if (is_op(cur(p), "*") || is_op(cur(p), "**"))
            return p_fail(p, cur(p), "*args and **kwargs in calls are not supported");
        gang__chat_node *arg;
        if (cur(p)->kind == T_NAME && is_op(&p->t[p->i + 1], "=")) {
            arg = mk(p, N_KWARG, cur(p));
            if (!arg)
                return GANG_ENOMEM;
            arg->s = cur(p)->s;
            arg->n = cur(p)->n;
            p->i += 2;
            if ((rc = parse_expr(p, &arg->a)))
                return rc;
        } else {
            if (call->nitems && call->items[call->nitems - 1]->kind == N_KWARG)
                return p_fail(p, cur(p), "positional argument after a keyword argument");
            if ((rc = parse_expr(p, &arg)))
                return rc;
        }
        if ((rc = push_item(p, call, arg)))
            return rc;
    }
    p->i++;
    return 0;
}

/* A list, tuple or dict display; the opening bracket is the current token. */
static int parse_display(parser *p, gang__chat_node **out)
{
    const chat_tok *open = cur(p);
    bool dict = is_op(open, "{"), paren = is_op(open, "(");
    const char *close = dict ? "}" : paren ? ")" : "]";
    gang__chat_node *n = mk(p, dict ? N_DICT : paren ? N_TUPLE : N_LIST, open);
    bool comma = false;
    int rc;
    if (!n)
        return GANG_ENOMEM;
    p->i++;
    while (!is_op(cur(p), close)) {
        if (n->nitems) {
            if ((rc = expect_op(p, ",")))
                return rc;
            comma = true;
            if (is_op(cur(p), close))
                break;
        }
        gang__chat_node *e;
        if ((rc = parse_expr(p, &e)) || (rc = push_item(p, n, e)))
            return rc;
        if (dict) {
            if ((rc = expect_op(p, ":")) || (rc = parse_expr(p, &e)) || (rc = push_item(p, n, e)))
                return rc;
        }
    }
    p->i++;
    if (paren && n->nitems == 1 && !comma)
        n = n->items[0]; /* (x) is x, not a tuple */
    *out = n;
    return 0;
}

/* A literal, a name or a display. */
static int parse_primary(parser *p, gang__chat_node **out)
{
    const chat_tok *t = cur(p);
    char b[64];
    gang__chat_node *n;
    if (t->kind == T_OP && (is_op(t, "(") || is_op(t, "[") || is_op(t, "{")))
        return parse_display(p, out);
    if (t->kind != T_NAME && t->kind != T_STRING && t->kind != T_INT && t->kind != T_FLOAT)
        return p_fail(p, t, "expected an expression, found %s", tok_desc(t, b, sizeof(b)));
    if (!(n = mk(p, N_CONST, t)))
        return GANG_ENOMEM;
    p->i++;
    if (t->kind == T_INT) {
        n->v.kind = CV_INT;
        n->v.u.i = t->i;
    } else if (t->kind == T_FLOAT) {
        n->v.kind = CV_FLOAT;
        n->v.u.f = t->f;
    } else if (t->kind == T_STRING) {
        size_t len = t->n;
        for (size_t k = p->i; p->t[k].kind == T_STRING; k++)
            len += p->t[k].n;
        char *s = gang__chat_alloc(p->a, len + 1);
        if (!s)
            return GANG_ENOMEM;
        memcpy(s, t->s, t->n);
        for (len = t->n; cur(p)->kind == T_STRING; p->i++) { /* "a" "b" is "ab" */
            memcpy(s + len, cur(p)->s, cur(p)->n);
            len += cur(p)->n;
        }
        n->v = gang__cv_str(s, len);
    } else if (is_name(t, "true") || is_name(t, "True") || is_name(t, "false") ||
               is_name(t, "False")) {
        n->v.kind = CV_BOOL;
        n->v.u.b = t->s[0] == 't' || t->s[0] == 'T';
    } else if (is_name(t, "none") || is_name(t, "None")) {
        n->v.kind = CV_NONE;
    } else {
        n->kind = N_NAME;
        n->s = t->s;
        n->n = t->n;
    }
    *out = n;
    return 0;
}

/* Postfixes: .name, .0, [index], [a:b:c], (args). */
static int parse_postfix(parser *p, gang__chat_node **node)
{
    int rc;
    for (;;) {
        const chat_tok *t = cur(p);
        gang__chat_node *n;
        if (is_op(t, ".")) {
            const chat_tok *a = &p->t[p->i + 1];
            if (a->kind != T_NAME && a->kind != T_INT)
                return p_fail(p, a, "expected an attribute name after '.'");
            if (!(n = mk(p, a->kind == T_NAME ? N_ATTR : N_ITEM, t)))
                return GANG_ENOMEM;
            n->a = *node;
            if (a->kind == T_NAME) {
                n->s = a->s;
                n->n = a->n;
            } else {
                if (!(n->b = mk(p, N_CONST, a)))
                    return GANG_ENOMEM;
                n->b->v = gang__cv_int(a->i);
            }
            p->i += 2;
        } else if (is_op(t, "[")) {
            if (!(n = mk(p, N_ITEM, t)))
                return GANG_ENOMEM;
            n->a = *node;
            p->i++;
            gang__chat_node **slot[3] = {&n->b, &n->c, &n->d};
            int part = 0;
            for (;;) {
                if (!is_op(cur(p), ":") && !is_op(cur(p), "]") && (rc = parse_expr(p, slot[part])))
                    return rc;
                if (!is_op(cur(p), ":"))
                    break;
                if (++part > 2)
                    return p_fail(p, cur(p), "too many ':' in a slice");
                n->kind = N_SLICE;
                p->i++;
            }
            if ((rc = expect_op(p, "]")))
                return rc;
            if (n->kind == N_ITEM && !n->b)
                return p_fail(p, t, "empty subscript");
        } else if (is_op(t, "(")) {
            if (!(n = mk(p, N_CALL, t)))
                return GANG_ENOMEM;
            n->a = *node;
            p->i++;
            if ((rc = parse_args(p, n)))
                return rc;
        } else {
            return 0;
        }
        *node = n;
    }
}

/* | filter(args) and is [not] test(args), applied left to right. */
static int parse_filters(parser *p, gang__chat_node **node)
{
    int rc;
    for (;;) {
        const chat_tok *t = cur(p);
        bool filter = is_op(t, "|");
        if (!filter && !is_name(t, "is"))
            return 0;
        gang__chat_node *n = mk(p, filter ? N_FILTER : N_TEST, t);
        if (!n)
            return GANG_ENOMEM;
        p->i++;
        if (!filter && is_name(cur(p), "not")) {
            n->op = 1;
            p->i++;
        }
        if (cur(p)->kind != T_NAME)
            return p_fail(p, cur(p), "expected a %s name", filter ? "filter" : "test");
        n->a = *node;
        n->s = cur(p)->s;
        n->n = cur(p)->n;
        if (filter ? !gang__chat_filter_known(n->s, n->n) : !gang__chat_test_known(n->s, n->n))
            return p_fail(p, cur(p), "the %s '%.*s' is not supported", filter ? "filter" : "test",
                          (int)(n->n > 40 ? 40 : n->n), n->s);
        p->i++;
        if (is_op(cur(p), ".")) {
            return p_fail(p, cur(p), "dotted %s names are not supported",
                          filter ? "filter" : "test");
        }
        const chat_tok *x = cur(p);
        if (is_op(x, "(")) {
            p->i++;
            if ((rc = parse_args(p, n)))
                return rc;
        } else if (!filter && (x->kind == T_STRING || x->kind == T_INT || x->kind == T_FLOAT ||
                               is_op(x, "[") || is_op(x, "{") ||
                               (x->kind == T_NAME && !is_name(x, "else") && !is_name(x, "or") &&
                                !is_name(x, "and")))) {
            gang__chat_node *arg;
            if ((rc = parse_primary(p, &arg)) || (rc = parse_postfix(p, &arg)) ||
                (rc = push_item(p, n, arg)))
                return rc;
        }
        *node = n;
    }
}

/* Unary minus and plus over a primary with its postfixes; filters and tests apply to the
 * whole (jinja2: -3|abs is abs(-3)) unless WITH_FILTER is false (the operand of - or +). */
static int parse_unary_f(parser *p, bool with_filter, gang__chat_node **out)
{
    int rc;
    const chat_tok *t = cur(p);
    if ((rc = enter(p)))
        return rc;
    if (is_op(t, "-") || is_op(t, "+")) {
        gang__chat_node *n = mk(p, N_UNARY, t);
        if (!n)
            return GANG_ENOMEM;
        n->op = is_op(t, "-") ? OP_NEG : OP_POS;
        p->i++;
        if ((rc = parse_unary_f(p, false, &n->a)))
            return rc;
        *out = n;
    } else if ((rc = parse_primary(p, out))) {
        return rc;
    }
    if ((rc = parse_postfix(p, out)) || (with_filter && (rc = parse_filters(p, out))))
        return rc;
    p->depth--;
    return 0;
}

static int parse_unary(parser *p, gang__chat_node **out)
{
    return parse_unary_f(p, true, out);
}

/* One level of left-associative binary operators (LEVEL 0: **, 1: * / // %, 2: ~,
 * 3: + -), over the next level down. */
static int parse_binary(parser *p, int level, gang__chat_node **out)
{
    static const char *const ops[4][4] = {{"**"}, {"*", "/", "//", "%"}, {"~"}, {"+", "-"}};
    static const int codes[4][4] = {
        {OP_POW}, {OP_MUL, OP_DIV, OP_FLOORDIV, OP_MOD}, {OP_CONCAT}, {OP_ADD, OP_SUB}};
    int rc = level == 0 ? parse_unary(p, out) : parse_binary(p, level - 1, out);
    while (!rc) {
        int op = 0;
        for (int k = 0; k < 4 && ops[level][k]; k++)
            if (is_op(cur(p), ops[level][k]))
                op = codes[level][k];
        if (!op)
            break;
        gang__chat_node *n = mk(p, N_BINARY, cur(p));
        if (!n)
            return GANG_ENOMEM;
        p->i++;
        n->op = op;
        n->a = *out;
        rc = level == 0 ? parse_unary(p, &n->b) : parse_binary(p, level - 1, &n->b);
        *out = n;
    }
    return rc;
}

/* Comparisons: jinja2 chains them (a < b < c); this subset refuses the chain. */
static int parse_compare(parser *p, gang__chat_node **out)
{
    static const char *const ops[] = {"==", "!=", "<", "<=", ">", ">="};
    static const int codes[] = {OP_EQ, OP_NE, OP_LT, OP_LE, OP_GT, OP_GE};
    int rc = parse_binary(p, 3, out);
    if (rc)
        return rc;
    const chat_tok *t = cur(p);
    int op = 0;
    for (int k = 0; k < 6; k++)
        if (is_op(t, ops[k]))
            op = codes[k];
    if (is_name(t, "in"))
        op = OP_IN;
    if (is_name(t, "not") && is_name(&p->t[p->i + 1], "in"))
        op = OP_NOTIN;
    if (!op)
        return 0;
    gang__chat_node *n = mk(p, N_BINARY, t);
    if (!n)
        return GANG_ENOMEM;
    p->i += op == OP_NOTIN ? 2 : 1;
    n->op = op;
    n->a = *out;
    if ((rc = parse_binary(p, 3, &n->b)))
        return rc;
    *out = n;
    t = cur(p);
    if (t->kind == T_OP && (is_op(t, "==") || is_op(t, "!=") || is_op(t, "<") || is_op(t, "<=") ||
                            is_op(t, ">") || is_op(t, ">=")))
        return p_fail(p, t, "chained comparisons are not supported");
    return 0;
}

static int parse_not(parser *p, gang__chat_node **out)
{
    int rc;
    if (!is_name(cur(p), "not"))
        return parse_compare(p, out);
    gang__chat_node *n = mk(p, N_NOT, cur(p));
    if (!n)
        return GANG_ENOMEM;
    p->i++;
    if ((rc = enter(p)) || (rc = parse_not(p, &n->a)))
        return rc;
    p->depth--;
    *out = n;
    return 0;
}

/* and / or: LEVEL 0 is and (over not), 1 is or (over and). */
static int parse_logic(parser *p, int level, gang__chat_node **out)
{
    const char *word = level ? "or" : "and";
    int rc = level ? parse_logic(p, 0, out) : parse_not(p, out);
    while (!rc && is_name(cur(p), word)) {
        gang__chat_node *n = mk(p, level ? N_OR : N_AND, cur(p));
        if (!n)
            return GANG_ENOMEM;
        p->i++;
        n->a = *out;
        rc = level ? parse_logic(p, 0, &n->b) : parse_not(p, &n->b);
        *out = n;
    }
    return rc;
}

static int parse_or(parser *p, gang__chat_node **out)
{
    return parse_logic(p, 1, out);
}

/* A full expression: or-expressions with  x if c [else y]. */
static int parse_expr(parser *p, gang__chat_node **out)
{
    int rc;
    if ((rc = enter(p)) || (rc = parse_or(p, out)))
        return rc;
    while (is_name(cur(p), "if")) {
        gang__chat_node *n = mk(p, N_COND, cur(p));
        if (!n)
            return GANG_ENOMEM;
        p->i++;
        n->b = *out;
        if ((rc = parse_or(p, &n->a)))
            return rc;
        if (is_name(cur(p), "else")) {
            p->i++;
            if ((rc = parse_expr(p, &n->c)))
                return rc;
        }
        *out = n;
    }
    p->depth--;
    return 0;
}

/* An assignment or loop target: a name, name.attr (SET only) or names separated by
 * commas (a tuple). */
static int parse_target(parser *p, bool attr, gang__chat_node **out)
{
    gang__chat_node *tuple = NULL;
    int rc;
    for (;;) {
        const chat_tok *t = cur(p);
        if (t->kind != T_NAME)
            return p_fail(p, t, "expected a variable name");
        gang__chat_node *n = mk(p, N_NAME, t);
        if (!n)
            return GANG_ENOMEM;
        n->s = t->s;
        n->n = t->n;
        p->i++;
        if (attr && is_op(cur(p), ".") && p->t[p->i + 1].kind == T_NAME) {
            gang__chat_node *a = mk(p, N_ATTR, cur(p));
            if (!a)
                return GANG_ENOMEM;
            a->a = n;
            a->s = p->t[p->i + 1].s;
            a->n = p->t[p->i + 1].n;
            p->i += 2;
            n = a;
        }
        if (!tuple && !is_op(cur(p), ",")) {
            *out = n;
            return 0;
        }
        if (!tuple && !(tuple = mk(p, N_TUPLE, t)))
            return GANG_ENOMEM;
        if ((rc = push_item(p, tuple, n)))
            return rc;
        if (!is_op(cur(p), ",")) {
            *out = tuple;
            return 0;
        }
        p->i++;
    }
}

/* An expression, or several separated by commas (a tuple), as jinja2 allows after
 * `set x =` and `for x in`. */
static int parse_tuple_expr(parser *p, bool cond, gang__chat_node **out)
{
    int rc = cond ? parse_expr(p, out) : parse_or(p, out);
    if (rc || !is_op(cur(p), ","))
        return rc;
    gang__chat_node *t = mk(p, N_TUPLE, cur(p));
    if (!t || push_item(p, t, *out))
        return GANG_ENOMEM;
    while (is_op(cur(p), ",")) {
        p->i++;
        gang__chat_node *e;
        if (cur(p)->kind == T_BLOCK_END || is_name(cur(p), "if"))
            break;
        if ((rc = cond ? parse_expr(p, &e) : parse_or(p, &e)) || (rc = push_item(p, t, e)))
            return rc;
    }
    *out = t;
    return 0;
}

/* {% if %} after its name: the condition, the body, then elif / else / endif. */
static int parse_if(parser *p, const chat_tok *at, gang__chat_node **out)
{
    static const char *const ends[] = {"endif", "elif", "else", NULL};
    static const char *const endif[] = {"endif", NULL};
    gang__chat_node *n = mk(p, N_IF, at);
    size_t which;
    int rc;
    if (!n)
        return GANG_ENOMEM;
    /* jinja2 reads the condition without `x if c else y` (parse_tuple(with_condexpr=False)) */
    if ((rc = parse_tuple_expr(p, false, &n->a)) || (rc = expect_kind(p, T_BLOCK_END, "'%}'")) ||
        (rc = parse_body(p, ends, &n->b, &which)))
        return rc;
    const chat_tok *t = cur(p);
    p->i++;
    if (which == 1) {
        rc = parse_if(p, t, &n->c);
    } else if (which == 2) {
        if ((rc = expect_kind(p, T_BLOCK_END, "'%}'")) ||
            (rc = parse_body(p, endif, &n->c, &which)))
            return rc;
        p->i++;
        rc = expect_kind(p, T_BLOCK_END, "'%}'");
    } else {
        rc = expect_kind(p, T_BLOCK_END, "'%}'");
    }
    *out = n;
    return rc;
}

/* {% for target in iterable [if filter] %} body [{% else %} body] {% endfor %}. */
static int parse_for(parser *p, const chat_tok *at, gang__chat_node **out)
{
    static const char *const ends[] = {"endfor", "else", NULL};
    static const char *const endfor[] = {"endfor", NULL};
    gang__chat_node *n = mk(p, N_FOR, at);
    size_t which;
    int rc;
    if (!n)
        return GANG_ENOMEM;
    if ((rc = parse_target(p, false, &n->a)))
        return rc;
    if (!is_name(cur(p), "in"))
        return p_fail(p, cur(p), "expected 'in' in a for loop");
    p->i++;
    if ((rc = parse_tuple_expr(p, false, &n->b)))
        return rc;
    if (is_name(cur(p), "if")) {
        p->i++;
        if ((rc = parse_expr(p, &n->e)))
            return rc;
    }
    if (is_name(cur(p), "recursive"))
        return p_fail(p, cur(p), "recursive loops are not supported");
    if ((rc = expect_kind(p, T_BLOCK_END, "'%}'")))
        return rc;
    p->loops++;
    rc = parse_body(p, ends, &n->c, &which);
    p->loops--;
    if (rc)
        return rc;
    p->i++;
    if ((rc = expect_kind(p, T_BLOCK_END, "'%}'")))
        return rc;
    if (which == 1) {
        if ((rc = parse_body(p, endfor, &n->d, &which)))
            return rc;
        p->i++;
        rc = expect_kind(p, T_BLOCK_END, "'%}'");
    }
    *out = n;
    return rc;
}

/* {% set target = value %} or {% set name %}body{% endset %}. */
static int parse_set(parser *p, const chat_tok *at, gang__chat_node **out)
{
    static const char *const endset[] = {"endset", NULL};
    gang__chat_node *n = mk(p, N_SET, at);
    size_t which;
    int rc;
    if (!n)
        return GANG_ENOMEM;
    if ((rc = parse_target(p, true, &n->a)))
        return rc;
    if (cur(p)->kind == T_BLOCK_END && n->a->kind == N_NAME) {
        n->kind = N_SETBLOCK;
        p->i++;
        if ((rc = parse_body(p, endset, &n->c, &which)))
            return rc;
        p->i++;
    } else {
        if (is_op(cur(p), "|"))
            return p_fail(p, cur(p), "filtered block sets are not supported");
        if ((rc = expect_op(p, "=")) || (rc = parse_tuple_expr(p, true, &n->b)))
            return rc;
    }
    *out = n;
    return expect_kind(p, T_BLOCK_END, "'%}'");
}

/* {% macro name(a, b=default) %}body{% endmacro %}. */
static int parse_macro(parser *p, const chat_tok *at, gang__chat_node **out)
{
    static const char *const endmacro[] = {"endmacro", NULL};
    gang__chat_node *n = mk(p, N_MACRO, at);
    size_t which;
    int rc;
    if (!n)
        return GANG_ENOMEM;
    if (cur(p)->kind != T_NAME)
        return p_fail(p, cur(p), "expected a macro name");
    n->s = cur(p)->s;
    n->n = cur(p)->n;
    p->i++;
    if ((rc = expect_op(p, "(")))
        return rc;
    while (!is_op(cur(p), ")")) {
        if (n->nitems && (rc = expect_op(p, ",")))
            return rc;
        const chat_tok *t = cur(p);
        if (t->kind != T_NAME)
            return p_fail(p, t, "expected a parameter name");
        gang__chat_node *param = mk(p, N_NAME, t);
        if (!param)
            return GANG_ENOMEM;
        param->s = t->s;
        param->n = t->n;
        p->i++;
        if (is_op(cur(p), "=")) {
            param->kind = N_KWARG;
            p->i++;
            if ((rc = parse_expr(p, &param->a)))
                return rc;
        } else if (n->nitems && n->items[n->nitems - 1]->kind == N_KWARG) {
            return p_fail(p, t, "a parameter without a default after one with a default");
        }
        if ((rc = push_item(p, n, param)))
            return rc;
    }
    p->i++;
    if ((rc = expect_kind(p, T_BLOCK_END, "'%}'")))
        return rc;
    int loops = p->loops;
    p->loops = 0;
    p->macros++;
    rc = parse_body(p, endmacro, &n->c, &which);
    p->macros--;
    p->loops = loops;
    if (rc)
        return rc;
    p->i++;
    *out = n;
    return expect_kind(p, T_BLOCK_END, "'%}'");
}

/* A {% tag %} after '{%': the statement it opens. */
static int parse_tag(parser *p, gang__chat_node **out)
{
    static const char *const endgen[] = {"endgeneration", NULL};
    const chat_tok *t = cur(p);
    char b[64];
    size_t which;
    int rc;
    if (t->kind != T_NAME)
        return p_fail(p, t, "expected a tag name, found %s", tok_desc(t, b, sizeof(b)));
    p->i++;
    if (is_name(t, "if"))
        return parse_if(p, t, out);
    if (is_name(t, "for"))
        return parse_for(p, t, out);
    if (is_name(t, "set"))
        return parse_set(p, t, out);
    if (is_name(t, "macro"))
        return parse_macro(p, t, out);
    if (is_name(t, "break") || is_name(t, "continue")) {
        if (!p->loops)
            return p_fail(p, t, "'%.*s' outside a loop", (int)t->n, t->s);
        if (!(*out = mk(p, is_name(t, "break") ? N_BREAK : N_CONTINUE, t)))
            return GANG_ENOMEM;
        return expect_kind(p, T_BLOCK_END, "'%}'");
    }
    if (is_name(t, "generation")) {
        if ((rc = expect_kind(p, T_BLOCK_END, "'%}'")) || (rc = parse_body(p, endgen, out, &which)))
            return rc;
        p->i++;
        return expect_kind(p, T_BLOCK_END, "'%}'");
    }
    if (t->n > 3 && !memcmp(t->s, "end", 3))
        return p_fail(p, t, "unexpected '%.*s'", (int)t->n, t->s);
    if (is_name(t, "elif") || is_name(t, "else"))
        return p_fail(p, t, "unexpected '%.*s'", (int)t->n, t->s);
    return p_fail(p, t, "the tag '%.*s' is not supported", (int)(t->n > 40 ? 40 : t->n), t->s);
}

/* Statements until a {% tag %} named in ENDS (a NULL-terminated list; NULL: until the end
 * of the template). Stops on that tag's name token and sets *which to its index. */
static int parse_body(parser *p, const char *const *ends, gang__chat_node **out, size_t *which)
{
    gang__chat_node *body = mk(p, N_BLOCK, cur(p));
    const chat_tok *open = cur(p);
    int rc;
    if (!body)
        return GANG_ENOMEM;
    if ((rc = enter(p)))
        return rc;
    for (;;) {
        const chat_tok *t = cur(p);
        gang__chat_node *s = NULL;
        if (t->kind == T_EOF) {
            if (ends)
                return p_fail(p, open, "missing {%% %s %%} before the end of the template",
                              ends[0]);
            break;
        }
        if (t->kind == T_TEXT) {
            if (!(s = mk(p, N_TEXT, t)))
                return GANG_ENOMEM;
            s->s = t->s;
            s->n = t->n;
            p->i++;
        } else if (t->kind == T_VAR_BEGIN) {
            p->i++;
            if (!(s = mk(p, N_OUTPUT, t)))
                return GANG_ENOMEM;
            if ((rc = parse_tuple_expr(p, true, &s->a)) || (rc = expect_kind(p, T_VAR_END, "'}}'")))
                return rc;
        } else if (t->kind == T_BLOCK_BEGIN) {
            p->i++;
            for (size_t k = 0; ends && ends[k]; k++)
                if (is_name(cur(p), ends[k])) {
                    *which = k;
                    *out = body;
                    p->depth--;
                    return 0;
                }
            if ((rc = parse_tag(p, &s)))
                return rc;
        } else {
            char b[64];
            return p_fail(p, t, "unexpected %s", tok_desc(t, b, sizeof(b)));
        }
        if ((rc = push_item(p, body, s)))
            return rc;
    }
    p->depth--;
    *out = body;
    return 0;
}

int gang__chat_parse_tokens(gang__chat_arena *a, const chat_tok *toks, size_t ntoks,
                            gang__chat_node **root, char *err, size_t errlen)
{
    parser p = {.a = a, .t = toks, .n = ntoks, .err = err, .errlen = errlen};
    size_t which = 0;
    int rc = parse_body(&p, NULL, root, &which);
    if (rc == GANG_ENOMEM && err && errlen)
        snprintf(err, errlen, "chat template: out of memory");
    return rc;
}
