/*
 * The chat-template lexer: template text and the tokens inside {{ }}, {% %} and {# #},
 * with the whitespace control transformers' environment has (jinja2 with trim_blocks and
 * lstrip_blocks):
 *
 *   {%- / {{- / {#-   strip every whitespace character before the tag;
 *   -%} / -}} / -#}   strip every whitespace character after it;
 *   trim_blocks       the first newline after %} or #} is dropped;
 *   lstrip_blocks     spaces before {% or {# at the start of a line are dropped ({%+ keeps
 *                     them); "start of a line" is after a newline in the text, or at the
 *                     start of the template, or right after a tag whose end consumed a
 *                     newline.
 *
 * The caller has already normalized newlines and dropped one final newline, as jinja2
 * does with keep_trailing_newline=False.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat-internal.h"

typedef struct lexer {
    gang__chat_arena *a;
    const char *src;
    size_t len, pos;
    uint32_t line;
    size_t line_start;
    chat_tok *toks;
    size_t n, cap;
    char *err;
    size_t errlen;
} lexer;

static int lex_fail(lexer *l, size_t at, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Records "line L, column C: message" for the position AT and returns GANG_EMODEL. */
static int lex_fail(lexer *l, size_t at, const char *fmt, ...)
{
    uint32_t line = 1;
    size_t ls = 0;
    for (size_t i = 0; i < at && i < l->len; i++)
        if (l->src[i] == '\n') {
            line++;
            ls = i + 1;
        }
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    if (l->err && l->errlen)
        snprintf(l->err, l->errlen, "chat template line %u, column %zu: %s", line, at - ls + 1,
                 msg);
    return GANG_EMODEL;
}

/* Moves the position to TO, keeping the line count. */
static void lex_advance(lexer *l, size_t to)
{
    for (; l->pos < to; l->pos++)
        if (l->src[l->pos] == '\n') {
            l->line++;
            l->line_start = l->pos + 1;
        }
}

static chat_tok *lex_push(lexer *l, tok_kind kind, size_t at)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 256;
        chat_tok *t = realloc(l->toks, cap * sizeof(*t));
        if (!t)
            return NULL;
        l->toks = t;
        l->cap = cap;
    }
    chat_tok *t = &l->toks[l->n++];
    memset(t, 0, sizeof(*t));
    t->kind = kind;
    t->line = l->line;
    t->col = (uint32_t)(at - l->line_start + 1);
    return t;
}

/* Python's str.rstrip(): the length of S[0..n) without its trailing whitespace. */
static size_t rstrip_len(const char *s, size_t n)
{
    size_t keep = 0, i = 0, w;
    while (i < n) {
        if (gang__is_space_at(s + i, n - i, &w)) {
            i += w;
        } else {
            i++;
            keep = i;
        }
    }
    return keep;
}

/* Whether S[0..n) is one or more whitespace characters only. */
static bool all_space(const char *s, size_t n)
{
    size_t i = 0, w;
    while (i < n) {
        if (!gang__is_space_at(s + i, n - i, &w))
            return false;
        i += w;
    }
    return n > 0;
}

/* Decodes the escapes of a string literal as Python's unicode-escape codec does (jinja2
 * decodes literals that way); unknown escapes stay as written. */
static int lex_unescape(lexer *l, const char *s, size_t n, size_t at, chat_tok *t)
{
    char *o = gang__chat_alloc(l->a, n + 1);
    size_t k = 0;
    if (!o)
        return GANG_ENOMEM;
    for (size_t i = 0; i < n; i++) {
        if (s[i] != '\\' || i + 1 >= n) {
            o[k++] = s[i];
            continue;
        }
        char e = s[++i];
        const char *simple = "n\nt\tr\r\\\\''\"\"a\ab\bf\fv\v";
        const char *m = NULL;
        for (const char *p = simple; *p; p += 2)
            if (*p == e)
                m = p;
        if (m) {
            o[k++] = m[1];
        } else if (e == '\n') {
            /* a backslash-newline continues the line */
        } else if (e == 'x' || e == 'u' || e == 'U') {
            int nd = e == 'x' ? 2 : e == 'u' ? 4 : 8;
            unsigned long cp = 0;
            if (i + (size_t)nd >= n)
                return lex_fail(l, at, "truncated \\%c escape in a string", e);
            for (int d = 1; d <= nd; d++) {
                char h = s[i + (size_t)d];
                int v = h >= '0' && h <= '9'   ? h - '0'
                        : h >= 'a' && h <= 'f' ? h - 'a' + 10
                        : h >= 'A' && h <= 'F' ? h - 'A' + 10
                                               : -1;
                if (v < 0)
                    return lex_fail(l, at, "bad \\%c escape in a string", e);
                cp = cp * 16 + (unsigned long)v;
            }
            i += (size_t)nd;
            if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
                return lex_fail(l, at, "escape \\%c names no character", e);
            if (cp < 0x80) {
                o[k++] = (char)cp;
            } else if (cp < 0x800) {
                o[k++] = (char)(0xC0 | (cp >> 6));
                o[k++] = (char)(0x80 | (cp & 0x3F));
            } else if (cp < 0x10000) {
                o[k++] = (char)(0xE0 | (cp >> 12));
                o[k++] = (char)(0x80 | ((cp >> 6) & 0x3F));
                o[k++] = (char)(0x80 | (cp & 0x3F));
            } else {
                o[k++] = (char)(0xF0 | (cp >> 18));
                o[k++] = (char)(0x80 | ((cp >> 12) & 0x3F));
                o[k++] = (char)(0x80 | ((cp >> 6) & 0x3F));
                o[k++] = (char)(0x80 | (cp & 0x3F));
            }
        } else if (e >= '0' && e <= '7') {
            return lex_fail(l, at, "octal escapes in strings are not supported");
        } else if (e == 'N') {
            return lex_fail(l, at, "\\N{...} escapes in strings are not supported");
        } else {
            o[k++] = '\\';
            o[k++] = e;
        }
    }
    t->s = o;
    t->n = k;
    return 0;
}

/* Lexes a number at the position: an integer, or a float with a fraction or exponent. */
static int lex_number(lexer *l)
{
    const char *s = l->src;
    size_t p = l->pos, start = p;
    bool is_float = false;
    while (p < l->len && s[p] >= '0' && s[p] <= '9')
        p++;
    if (p < l->len && (s[p] == '_' || s[p] == 'x' || s[p] == 'o' || s[p] == 'b'))
        return lex_fail(l, p, "number literals with '_' or a base prefix are not supported");
    if (p + 1 < l->len && s[p] == '.' && s[p + 1] >= '0' && s[p + 1] <= '9') {
        is_float = true;
        p++;
        while (p < l->len && s[p] >= '0' && s[p] <= '9')
            p++;
    }
    if (p < l->len && (s[p] == 'e' || s[p] == 'E')) {
        size_t q = p + 1;
        if (q < l->len && (s[q] == '+' || s[q] == '-'))
            q++;
        if (q < l->len && s[q] >= '0' && s[q] <= '9') {
            is_float = true;
            p = q;
            while (p < l->len && s[p] >= '0' && s[p] <= '9')
                p++;
        }
    }
    char buf[64];
    if (p - start >= sizeof(buf))
        return lex_fail(l, start, "number literal too long");
    memcpy(buf, s + start, p - start);
    buf[p - start] = 0;
    chat_tok *t = lex_push(l, is_float ? T_FLOAT : T_INT, start);
    if (!t)
        return GANG_ENOMEM;
    if (is_float) {
        t->f = strtod(buf, NULL);
    } else {
        char *end;
        errno = 0;
        unsigned long long v = strtoull(buf, &end, 10);
        if (v > INT64_MAX || errno == ERANGE)
            return lex_fail(l, start, "integer literal out of range");
        t->i = (int64_t)v;
    }
    lex_advance(l, p);
    return 0;
}

static const char *const lex_ops[] = {"//", "**", "==", "!=", ">=", "<=", "+", "-", "/",
                                      "*",  "%",  "~",  "[",  "]",  "(",  ")", "{", "}",
                                      "=",  ".",  ":",  "|",  ",",  ";",  ">", "<"};

/* Lexes one token inside a tag whose end is END ("%}" or "}}"); sets *done at the end,
 * which (as in jinja2) only counts outside brackets: *depth is the bracket nesting. */
static int lex_tag_token(lexer *l, const char *end, bool *done, int *depth)
{
    const char *s = l->src;
    size_t p = l->pos;
    while (p < l->len && (s[p] == ' ' || s[p] == '\t' || s[p] == '\n' || s[p] == '\r' ||
                          s[p] == '\f' || s[p] == '\v'))
        p++;
    lex_advance(l, p);
    if (p >= l->len)
        return lex_fail(l, p, "the template ends inside a tag (missing '%s')", end);
    if (*depth == 0 && ((s[p] == '-' && p + 2 < l->len && !memcmp(s + p + 1, end, 2)) ||
                        (p + 1 < l->len && !memcmp(s + p, end, 2)))) {
        *done = true;
        return 0;
    }
    char ch = s[p];
    if ((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || ch == '_') {
        size_t q = p;
        while (q < l->len && ((s[q] >= 'a' && s[q] <= 'z') || (s[q] >= 'A' && s[q] <= 'Z') ||
                              (s[q] >= '0' && s[q] <= '9') || s[q] == '_'))
            q++;
        chat_tok *t = lex_push(l, T_NAME, p);
        if (!t)
            return GANG_ENOMEM;
        t->s = s + p;
        t->n = q - p;
        lex_advance(l, q);
        return 0;
    }
    if (ch >= '0' && ch <= '9')
        return lex_number(l);
    if (ch == '\'' || ch == '"') {
        size_t q = p + 1;
        while (q < l->len && s[q] != ch)
            q += s[q] == '\\' ? 2 : 1;
        if (q >= l->len)
            return lex_fail(l, p, "unterminated string literal");
        chat_tok *t = lex_push(l, T_STRING, p);
        if (!t)
            return GANG_ENOMEM;
        int rc = lex_unescape(l, s + p + 1, q - p - 1, p, t);
        if (rc)
            return rc;
        lex_advance(l, q + 1);
        return 0;
    }
    for (size_t k = 0; k < sizeof(lex_ops) / sizeof(lex_ops[0]); k++) {
        size_t on = strlen(lex_ops[k]);
        if (p + on <= l->len && !memcmp(s + p, lex_ops[k], on)) {
            chat_tok *t = lex_push(l, T_OP, p);
            if (!t)
                return GANG_ENOMEM;
            t->s = lex_ops[k];
            t->n = on;
            if (on == 1 && strchr("([{", lex_ops[k][0]))
                ++*depth;
            else if (on == 1 && strchr(")]}", lex_ops[k][0]) && *depth > 0)
                --*depth;
            lex_advance(l, p + on);
            return 0;
        }
    }
    return lex_fail(l, p, "unexpected character '%c' in a tag", ch);
}

/* Lexes a {{ }} or {% %} tag from its opening (at the position) through its end, and
 * returns through *newline whether the end consumed a newline (for lstrip_blocks). */
static int lex_tag(lexer *l, bool block, bool *newline)
{
    const char *end = block ? "%}" : "}}";
    size_t open = l->pos;
    if (!lex_push(l, block ? T_BLOCK_BEGIN : T_VAR_BEGIN, open))
        return GANG_ENOMEM;
    size_t p = open + 2;
    if (p < l->len && (l->src[p] == '-' || (block && l->src[p] == '+')))
        p++;
    lex_advance(l, p);
    size_t first = l->n;
    int depth = 0;
    for (bool done = false; !done;) {
        int rc = lex_tag_token(l, end, &done, &depth);
        if (rc)
            return rc;
    }
    if (block && l->n > first && l->toks[first].kind == T_NAME && l->toks[first].n == 3 &&
        !memcmp(l->toks[first].s, "raw", 3))
        return lex_fail(l, open, "{%% raw %%} blocks are not supported");
    bool strip = l->src[l->pos] == '-';
    if (!lex_push(l, block ? T_BLOCK_END : T_VAR_END, l->pos))
        return GANG_ENOMEM;
    size_t q = l->pos + (strip ? 3 : 2);
    if (strip) {
        size_t w;
        while (q < l->len && gang__is_space_at(l->src + q, l->len - q, &w))
            q += w;
    } else if (block && q < l->len && l->src[q] == '\n') {
        q++;
    }
    *newline = l->src[q - 1] == '\n';
    lex_advance(l, q);
    return 0;
}

/* Skips a {# #} comment (at the position), with its whitespace control. */
static int lex_comment(lexer *l, bool *newline)
{
    const char *s = l->src;
    size_t open = l->pos, q = open + 2;
    while (q + 1 < l->len && !(s[q] == '#' && s[q + 1] == '}'))
        q++;
    if (q + 1 >= l->len)
        return lex_fail(l, open, "unterminated comment");
    bool strip = q > open + 2 && s[q - 1] == '-';
    q += 2;
    if (strip) {
        size_t w;
        while (q < l->len && gang__is_space_at(s + q, l->len - q, &w))
            q += w;
    } else if (q < l->len && s[q] == '\n') {
        q++;
    }
    *newline = s[q - 1] == '\n';
    lex_advance(l, q);
    return 0;
}

/* Emits the text before a tag, stripped as the tag's opening asks. */
static int lex_text(lexer *l, size_t end, char kind, char sign, bool line_starting)
{
    const char *t = l->src + l->pos;
    size_t n = end - l->pos;
    if (sign == '-') {
        n = rstrip_len(t, n);
    } else if (sign != '+' && (kind == '%' || kind == '#')) {
        size_t lp = 0;
        for (size_t i = n; i > 0; i--)
            if (t[i - 1] == '\n') {
                lp = i;
                break;
            }
        if ((lp > 0 || line_starting) && all_space(t + lp, n - lp))
            n = lp;
    }
    if (n > 0) {
        chat_tok *tk = lex_push(l, T_TEXT, l->pos);
        if (!tk)
            return GANG_ENOMEM;
        tk->s = t;
        tk->n = n;
    }
    lex_advance(l, end);
    return 0;
}

int gang__chat_lex(gang__chat_arena *a, const char *src, size_t len, chat_tok **toks, size_t *ntoks,
                   char *err, size_t errlen)
{
    lexer l = {.a = a, .src = src, .len = len, .line = 1, .err = err, .errlen = errlen};
    bool line_starting = true;
    int rc = 0;
    while (l.pos < len) {
        const char *tag = NULL;
        for (size_t p = l.pos; p + 1 < len; p++) {
            if (src[p] == '{' && (src[p + 1] == '{' || src[p + 1] == '%' || src[p + 1] == '#')) {
                tag = src + p;
                break;
            }
        }
        size_t end = tag ? (size_t)(tag - src) : len;
        char sign = tag && end + 2 < len ? src[end + 2] : 0;
        if ((rc = lex_text(&l, end, tag ? tag[1] : 0, sign, line_starting)))
            goto out;
        if (!tag)
            break;
        if (tag[1] == '#')
            rc = lex_comment(&l, &line_starting);
        else
            rc = lex_tag(&l, tag[1] == '%', &line_starting);
        if (rc)
            goto out;
    }
    if (!lex_push(&l, T_EOF, len)) {
        rc = GANG_ENOMEM;
        goto out;
    }
    *toks = l.toks;
    *ntoks = l.n;
    return 0;
out:
    if (rc == GANG_ENOMEM && err && errlen)
        snprintf(err, errlen, "chat template: out of memory");
    free(l.toks);
    return rc;
}
