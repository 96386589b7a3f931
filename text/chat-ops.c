/*
 * Operations on chat-template values with Python's rules: length (code points for
 * strings), iteration, equality (1 == 1.0 == True), ordering, and dict lookup/update.
 */
#include <string.h>

#include "chat-internal.h"

/* Number of code points in UTF-8 text (continuation bytes do not count). */
static int64_t utf8_count(const char *s, size_t n)
{
    int64_t k = 0;
    for (size_t i = 0; i < n; i++)
        k += ((unsigned char)s[i] & 0xC0) != 0x80;
    return k;
}

static int64_t range_len(const cv_range *r)
{
    if (r->step > 0 && r->start < r->stop)
        return (r->stop - r->start - 1) / r->step + 1;
    if (r->step < 0 && r->start > r->stop)
        return (r->start - r->stop - 1) / -r->step + 1;
    return 0;
}

int64_t gang__cv_length(const cv *v)
{
    switch (v->kind) {
    case CV_STR:
        return utf8_count(v->u.s.s, v->u.s.n);
    case CV_LIST:
        return v->u.list->gen ? -1 : (int64_t)v->u.list->n;
    case CV_DICT:
    case CV_NS:
        return (int64_t)v->u.dict->n;
    case CV_RANGE:
        return range_len(v->u.range);
    case CV_UNDEF:
        return 0;
    default:
        return -1;
    }
}

int gang__cv_items(chat_ctx *c, const cv *v, cv_list *out)
{
    int64_t n = gang__cv_length(v);
    if (v->kind == CV_LIST) {
        *out = *v->u.list;
        return 0;
    }
    if (v->kind == CV_DICT) {
        out->n = v->u.dict->n;
        out->v = v->u.dict->k;
        return 0;
    }
    if (v->kind == CV_UNDEF) {
        out->n = 0;
        out->v = NULL;
        return 0;
    }
    if (v->kind != CV_STR && v->kind != CV_RANGE)
        return gang__chat_fail(c, GANG_EMODEL, "a %s is not iterable", gang__cv_type_name(v));
    int rc = gang__chat_step(c, (uint64_t)n);
    if (rc)
        return rc;
    cv *items = gang__chat_alloc(&c->arena, ((size_t)n + 1) * sizeof(cv));
    if (!items)
        return gang__chat_fail(c, GANG_ERANGE, "memory limit reached");
    if (v->kind == CV_RANGE) {
        for (int64_t i = 0; i < n; i++)
            items[i] = gang__cv_int(v->u.range->start + i * v->u.range->step);
    } else {
        const char *s = v->u.s.s;
        size_t i = 0;
        for (int64_t k = 0; k < n; k++) {
            size_t j = i + 1;
            while (j < v->u.s.n && ((unsigned char)s[j] & 0xC0) == 0x80)
                j++;
            items[k] = gang__cv_str(s + i, j - i);
            i = j;
        }
    }
    out->n = (size_t)n;
    out->v = items;
    return 0;
}

static bool is_num(const cv *v)
{
    return v->kind == CV_INT || v->kind == CV_FLOAT || v->kind == CV_BOOL;
}

static double num_of(const cv *v)
{
    return v->kind == CV_FLOAT ? v->u.f : v->kind == CV_INT ? (double)v->u.i : (double)v->u.b;
}

/* Python's ==, counting in *WORK the elements and 256-byte runs compared; gives up
 * (false) once *WORK passes LIMIT, which the caller turns into the step limit. */
static bool equal_rec(const cv *a, const cv *b, uint64_t *work, uint64_t limit)
{
    if (++*work > limit)
        return false;
    if (is_num(a) && is_num(b)) {
        if (a->kind != CV_FLOAT && b->kind != CV_FLOAT)
            return (a->kind == CV_INT ? a->u.i : a->u.b) == (b->kind == CV_INT ? b->u.i : b->u.b);
        return num_of(a) == num_of(b);
    }
    if (a->kind != b->kind)
        return false;
    if (gang__cv_is_gen(a) || gang__cv_is_gen(b))
        return a->u.list == b->u.list; /* generators compare by identity */
    switch (a->kind) {
    case CV_UNDEF:
    case CV_NONE:
        return true;
    case CV_STR:
        *work += a->u.s.n / 256;
        return a->u.s.n == b->u.s.n && !memcmp(a->u.s.s, b->u.s.s, a->u.s.n);
    case CV_LIST:
        if (a->u.list->n != b->u.list->n)
            return false;
        for (size_t i = 0; i < a->u.list->n; i++)
            if (!equal_rec(&a->u.list->v[i], &b->u.list->v[i], work, limit))
                return false;
        return true;
    case CV_DICT:
        if (a->u.dict->n != b->u.dict->n)
            return false;
        for (size_t i = 0; i < a->u.dict->n; i++) {
            const cv_dict *x = a->u.dict, *y = b->u.dict;
            bool found = false;
            for (size_t k = 0; k < y->n && *work <= limit; k++) {
                size_t j = (i + k) % y->n; /* the same position first: the usual case */
                if (equal_rec(&x->k[i], &y->k[j], work, limit)) {
                    found = equal_rec(&x->v[i], &y->v[j], work, limit);
                    break;
                }
            }
            if (!found)
                return false;
        }
        return true;
    default:
        return a->u.dict == b->u.dict; /* identity for namespaces, loops, functions */
    }
}

bool gang__cv_equal(const cv *a, const cv *b)
{
    uint64_t work = 0;
    return equal_rec(a, b, &work, UINT64_MAX);
}

int gang__cv_equal_c(chat_ctx *c, const cv *a, const cv *b, bool *eq)
{
    uint64_t work = 0, left = c->max_steps > c->steps ? c->max_steps - c->steps : 0;
    *eq = equal_rec(a, b, &work, left);
    return gang__chat_step(c, work);
}

int gang__cv_compare(chat_ctx *c, const cv *a, const cv *b, int *cmp)
{
    if (is_num(a) && is_num(b)) {
        if (a->kind == CV_INT && b->kind == CV_INT)
            *cmp = (a->u.i > b->u.i) - (a->u.i < b->u.i);
        else
            *cmp = (num_of(a) > num_of(b)) - (num_of(a) < num_of(b));
        return 0;
    }
    if (a->kind == CV_STR && b->kind == CV_STR) {
        size_t m = a->u.s.n < b->u.s.n ? a->u.s.n : b->u.s.n;
        int r = memcmp(a->u.s.s, b->u.s.s, m); /* UTF-8 byte order is code point order */
        *cmp = r ? (r > 0 ? 1 : -1) : (a->u.s.n > b->u.s.n) - (a->u.s.n < b->u.s.n);
        return 0;
    }
    return gang__chat_fail(c, GANG_EMODEL, "cannot order a %s and a %s", gang__cv_type_name(a),
                           gang__cv_type_name(b));
}

uint64_t gang__cv_cost(const cv *v)
{
    if (v->kind == CV_STR)
        return v->u.s.n / 256;
    if (v->kind == CV_LIST)
        return v->u.list->n;
    if (v->kind == CV_DICT || v->kind == CV_NS)
        return v->u.dict->n;
    return 0;
}

int gang__cv_dict_get(const cv_dict *d, const char *k, size_t n, cv *out)
{
    for (size_t i = 0; i < d->n; i++)
        if (d->k[i].kind == CV_STR && d->k[i].u.s.n == n && !memcmp(d->k[i].u.s.s, k, n)) {
            *out = d->v[i];
            return 0;
        }
    return GANG_ENOENT;
}

int gang__cv_dict_set(chat_ctx *c, cv_dict *d, const cv *k, const cv *v)
{
    for (size_t i = 0; i < d->n; i++)
        if (gang__cv_equal(&d->k[i], k)) {
            d->v[i] = *v;
            return 0;
        }
    if (d->n == d->cap) {
        size_t cap = d->cap ? d->cap * 2 : 4;
        cv *nk = gang__chat_alloc(&c->arena, cap * sizeof(cv));
        cv *nv = gang__chat_alloc(&c->arena, cap * sizeof(cv));
        if (!nk || !nv)
            return gang__chat_fail(c, GANG_ERANGE, "memory limit reached");
        if (d->n) {
            memcpy(nk, d->k, d->n * sizeof(cv));
            memcpy(nv, d->v, d->n * sizeof(cv));
        }
        d->k = nk;
        d->v = nv;
        d->cap = cap;
    }
    d->k[d->n] = *k;
    d->v[d->n] = *v;
    d->n++;
    return 0;
}
