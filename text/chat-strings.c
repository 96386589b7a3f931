/*
 * Methods of chat-template values, as the jinja2 sandbox lets templates call Python's:
 * str.strip/lstrip/rstrip/split/startswith/endswith/upper/lower/title/capitalize/replace,
 * dict.items/keys/values/get. Case changes are ASCII-only: text with other characters is
 * refused rather than changed differently from Python.
 */
#include <stdlib.h>
#include <string.h>

#include "chat-internal.h"

static const char *const str_methods[] = {"strip",      "lstrip",     "rstrip",  "split",
                                          "startswith", "endswith",   "upper",   "lower",
                                          "title",      "capitalize", "replace", NULL};
static const char *const dict_methods[] = {"items", "keys", "values", "get", NULL};

static bool in_list(const char *const *l, const char *name, size_t n)
{
    for (; *l; l++)
        if (strlen(*l) == n && !memcmp(*l, name, n))
            return true;
    return false;
}

bool gang__chat_has_method(const cv *self, const char *name, size_t n)
{
    if (self->kind == CV_STR)
        return in_list(str_methods, name, n);
    if (self->kind == CV_DICT)
        return in_list(dict_methods, name, n);
    return false;
}

static size_t utf8_len_at(const char *s, size_t n)
{
    size_t k = 1;
    while (k < n && ((unsigned char)s[k] & 0xC0) == 0x80)
        k++;
    return k;
}

/* Whether the character at S (length W) is one of CHARS (NULL: Python whitespace). */
static bool strip_match(const char *s, size_t n, const cv *chars, size_t *w)
{
    if (!chars)
        return gang__is_space_at(s, n, w);
    *w = utf8_len_at(s, n);
    for (size_t i = 0; i < chars->u.s.n;) {
        size_t cw = utf8_len_at(chars->u.s.s + i, chars->u.s.n - i);
        if (cw == *w && !memcmp(chars->u.s.s + i, s, cw))
            return true;
        i += cw;
    }
    return false;
}

/* str.strip/lstrip/rstrip (WHICH: 0 both, 1 left, 2 right) with optional CHARS. */
int gang__chat_strip(const cv *s, const cv *chars, int which, cv *out)
{
    const char *p = s->u.s.s;
    size_t b = 0, e = s->u.s.n, w;
    if (chars && chars->kind != CV_STR)
        chars = NULL;
    if (which != 2)
        while (b < e && strip_match(p + b, e - b, chars, &w))
            b += w;
    while (which != 1 && e > b) { /* backwards, one character at a time */
        size_t j = e - 1;
        while (j > b && ((unsigned char)p[j] & 0xC0) == 0x80)
            j--;
        if (!strip_match(p + j, e - j, chars, &w) || w != e - j)
            break;
        e = j;
    }
    *out = gang__cv_str(p + b, e - b);
    return 0;
}

/* str.split(sep=None, maxsplit=-1). */
static int str_split(chat_ctx *c, const cv *s, const cv *sep, int64_t maxsplit, cv *out)
{
    const char *p = s->u.s.s;
    size_t n = s->u.s.n, cnt = 0, w;
    cv *items = NULL;
    if (sep && sep->kind == CV_STR && sep->u.s.n == 0)
        return gang__chat_fail(c, GANG_EMODEL, "split(): empty separator");
    for (int pass = 0; pass < 2; pass++) { /* count, then fill */
        size_t i = 0, k = 0;
        int64_t splits = 0;
        if (!sep || sep->kind != CV_STR) {
            for (;;) {
                while (i < n && gang__is_space_at(p + i, n - i, &w))
                    i += w;
                if (i >= n)
                    break;
                size_t b = i;
                if (maxsplit >= 0 && splits >= maxsplit) {
                    size_t e = n, keep = b;
                    for (size_t j = b; j < e;)
                        if (gang__is_space_at(p + j, e - j, &w))
                            j += w;
                        else
                            keep = j += utf8_len_at(p + j, e - j);
                    i = n;
                    if (pass)
                        items[k] = gang__cv_str(p + b, keep - b);
                    k++;
                    break;
                }
                while (i < n && !gang__is_space_at(p + i, n - i, &w))
                    i += utf8_len_at(p + i, n - i);
                if (pass)
                    items[k] = gang__cv_str(p + b, i - b);
                k++;
                splits++;
            }
        } else {
            const char *d = sep->u.s.s;
            size_t dn = sep->u.s.n, b = 0;
            for (i = 0; i + dn <= n;) {
                if ((maxsplit < 0 || splits < maxsplit) && !memcmp(p + i, d, dn)) {
                    if (pass)
                        items[k] = gang__cv_str(p + b, i - b);
                    k++;
                    splits++;
                    i += dn;
                    b = i;
                } else {
                    i++;
                }
            }
            if (pass)
                items[k] = gang__cv_str(p + b, n - b);
            k++;
        }
        if (!pass) {
            cnt = k;
            int rc = gang__cv_new_list(c, cnt, out, &items);
            if (rc)
                return rc;
        }
    }
    return gang__chat_step(c, n / 64);
}

/* ASCII case changes: 0 upper, 1 lower, 2 str.title, 3 capitalize, 4 jinja2's title filter
 * (a capital after start, whitespace or one of -([{<). */
int gang__chat_case(chat_ctx *c, const cv *s, int how, cv *out)
{
    char *o = gang__chat_alloc(&c->arena, s->u.s.n + 1);
    if (!o)
        return gang__chat_fail(c, GANG_ERANGE, "memory limit reached");
    bool prev_alpha = false, prev_sep = false;
    for (size_t i = 0; i < s->u.s.n; i++) {
        unsigned char ch = (unsigned char)s->u.s.s[i];
        if (ch >= 0x80)
            return gang__chat_fail(c, GANG_EMODEL,
                                   "changing the case of non-ASCII text is not supported");
        bool alpha = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z');
        bool up = how == 0 || (how == 2 && !prev_alpha) || (how == 3 && i == 0) ||
                  (how == 4 && (i == 0 || prev_sep));
        prev_sep = strchr("-([{<", (char)ch) != NULL || (ch >= 9 && ch <= 13) ||
                   (ch >= 0x1c && ch <= 0x20);
        if (alpha)
            ch = up ? (unsigned char)(ch & ~0x20) : (unsigned char)(ch | 0x20);
        o[i] = (char)ch;
        prev_alpha = alpha;
    }
    *out = gang__cv_str(o, s->u.s.n);
    return gang__chat_step(c, s->u.s.n / 256);
}

/* str.replace(old, new[, count]). */
int gang__chat_replace(chat_ctx *c, const cv *s, const cv *from, const cv *to, int64_t count,
                       cv *out)
{
    if (from->kind != CV_STR || to->kind != CV_STR)
        return gang__chat_fail(c, GANG_EMODEL, "replace() takes strings");
    chat_buf b = {.limit = c->out.limit};
    size_t i = 0, n = s->u.s.n, fn = from->u.s.n;
    int64_t done = 0;
    int rc = 0;
    if (fn == 0)
        return gang__chat_fail(c, GANG_EMODEL, "replace() of an empty string is not supported");
    while (!rc && i < n) {
        if ((count < 0 || done < count) && i + fn <= n && !memcmp(s->u.s.s + i, from->u.s.s, fn)) {
            rc = gang__buf_put(c, &b, to->u.s.s, to->u.s.n);
            i += fn;
            done++;
        } else {
            rc = gang__buf_put(c, &b, s->u.s.s + i, 1);
            i++;
        }
    }
    if (!rc)
        rc = gang__buf_to_cv(c, &b, out);
    free(b.p);
    return rc;
}

static bool affix(const cv *s, const cv *a, bool end)
{
    if (a->kind != CV_STR || a->u.s.n > s->u.s.n)
        return false;
    return !memcmp(s->u.s.s + (end ? s->u.s.n - a->u.s.n : 0), a->u.s.s, a->u.s.n);
}

static int str_method(chat_ctx *c, const cv *s, const char *name, size_t n, const cv *args,
                      size_t nargs, cv *out)
{
    int k = 0;
    while (strlen(str_methods[k]) != n || memcmp(str_methods[k], name, n))
        k++;
    size_t max = k <= 2 ? 1 : k == 3 ? 2 : k <= 5 ? 1 : k == 10 ? 3 : 0;
    if (nargs > max || ((k == 4 || k == 5 || k == 10) && nargs < (k == 10 ? 2u : 1u)))
        return gang__chat_fail(c, GANG_EMODEL, "wrong number of arguments to str.%s()",
                               str_methods[k]);
    switch (k) {
    case 0:
    case 1:
    case 2:
        return gang__chat_strip(s, nargs ? &args[0] : NULL, k, out);
    case 3:
        if (nargs == 2 && args[1].kind != CV_INT)
            return gang__chat_fail(c, GANG_EMODEL, "split(): maxsplit must be an integer");
        return str_split(c, s, nargs ? &args[0] : NULL, nargs == 2 ? args[1].u.i : -1, out);
    case 4:
    case 5: {
        bool r = false;
        if (args[0].kind == CV_LIST && args[0].u.list->tuple) {
            for (size_t i = 0; i < args[0].u.list->n && !r; i++)
                r = affix(s, &args[0].u.list->v[i], k == 5);
        } else if (args[0].kind == CV_STR) {
            r = affix(s, &args[0], k == 5);
        } else {
            return gang__chat_fail(c, GANG_EMODEL, "%s() takes a string or a tuple of strings",
                                   str_methods[k]);
        }
        *out = (cv){.kind = CV_BOOL};
        out->u.b = r;
        return 0;
    }
    case 10:
        if (nargs == 3 && args[2].kind != CV_INT)
            return gang__chat_fail(c, GANG_EMODEL, "replace(): count must be an integer");
        return gang__chat_replace(c, s, &args[0], &args[1], nargs == 3 ? args[2].u.i : -1, out);
    default:
        return gang__chat_case(c, s, k - 6, out);
    }
}

/* dict.items() as a list of [key, value] pairs, keys(), values(). */
int gang__chat_dict_view(chat_ctx *c, const cv_dict *d, int which, cv *out)
{
    cv *items;
    int rc = gang__cv_new_list(c, d->n, out, &items);
    for (size_t i = 0; !rc && i < d->n; i++) {
        if (which == 1) {
            items[i] = d->k[i];
        } else if (which == 2) {
            items[i] = d->v[i];
        } else {
            cv *pair;
            if (!(rc = gang__cv_new_list(c, 2, &items[i], &pair))) {
                items[i].u.list->tuple = true;
                pair[0] = d->k[i];
                pair[1] = d->v[i];
            }
        }
    }
    return rc;
}

int gang__chat_method(chat_ctx *c, const cv *self, const char *name, size_t n, const cv *args,
                      size_t nargs, cv *out)
{
    int rc = gang__chat_step(c, gang__cv_cost(self));
    if (rc)
        return rc;
    if (self->markup)
        return gang__chat_fail(c, GANG_EMODEL, "methods of a |safe string are not supported");
    if (self->kind == CV_STR)
        return str_method(c, self, name, n, args, nargs, out);
    int k = 0;
    while (strlen(dict_methods[k]) != n || memcmp(dict_methods[k], name, n))
        k++;
    if (k == 3) {
        if (nargs < 1 || nargs > 2)
            return gang__chat_fail(c, GANG_EMODEL, "dict.get() takes 1 or 2 arguments");
        for (size_t i = 0; i < self->u.dict->n; i++)
            if (gang__cv_equal(&self->u.dict->k[i], &args[0])) {
                *out = self->u.dict->v[i];
                return 0;
            }
        memset(out, 0, sizeof(*out));
        if (nargs == 2)
            *out = args[1];
        else
            out->kind = CV_NONE;
        return 0;
    }
    if (nargs)
        return gang__chat_fail(c, GANG_EMODEL, "dict.%s() takes no arguments", dict_methods[k]);
    if (!(rc = gang__chat_dict_view(c, self->u.dict, k, out)))
        out->u.list->view = true;
    return rc;
}
