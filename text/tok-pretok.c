/*
 * Encoding: added tokens are split out of the text first (leftmost-longest, with their
 * lstrip/rstrip flags), then every remaining segment runs through the pre-tokenizers
 * (Split, Digits, ByteLevel: regex splits with tokenizers' delimiter behaviours), each
 * piece is mapped to the byte-level alphabet when a ByteLevel pre-tokenizer is present,
 * and the BPE model turns it into ids. Also the UTF-8 helpers and the alphabet.
 */
#include <stdlib.h>
#include <string.h>

#include "tok-internal.h"

#define TOK_MATCH_LIMIT 10000000u

unsigned gang__tok_bl_encode(unsigned char b, char *out)
{
    uint32_t cp = b;
    if (b <= 32)
        cp = 256u + b;
    else if (b >= 127 && b <= 160)
        cp = 256u + 33u + (b - 127u);
    else if (b == 173)
        cp = 256u + 67u;
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    out[0] = (char)(0xC0 | (cp >> 6));
    out[1] = (char)(0x80 | (cp & 0x3F));
    return 2;
}

int gang__tok_bl_decode(uint32_t cp)
{
    if ((cp >= 33 && cp <= 126) || (cp >= 161 && cp <= 172) || (cp >= 174 && cp <= 255))
        return (int)cp;
    if (cp < 256 || cp >= 256 + 68)
        return -1;
    uint32_t k = cp - 256;
    return k < 33 ? (int)k : k < 67 ? (int)(127 + k - 33) : 173;
}

unsigned gang__tok_utf8_next(const char *s, size_t len, uint32_t *cp)
{
    const unsigned char *u = (const unsigned char *)s;
    unsigned n = u[0] < 0x80 ? 1 : u[0] < 0xE0 ? 2 : u[0] < 0xF0 ? 3 : 4;
    if (n > len)
        n = 1;
    uint32_t c = n == 1 ? u[0] : n == 2 ? u[0] & 0x1Fu : n == 3 ? u[0] & 0x0Fu : u[0] & 0x07u;
    for (unsigned i = 1; i < n; i++)
        c = (c << 6) | (u[i] & 0x3Fu);
    *cp = c;
    return n;
}

bool gang__tok_utf8_valid(const char *s, size_t len)
{
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < len;) {
        unsigned char b = u[i];
        unsigned n;
        unsigned char lo = 0x80, hi = 0xBF;
        if (b < 0x80) {
            i++;
            continue;
        } else if (b >= 0xC2 && b <= 0xDF) {
            n = 1;
        } else if (b >= 0xE0 && b <= 0xEF) {
            n = 2;
            lo = b == 0xE0 ? 0xA0 : 0x80;
            hi = b == 0xED ? 0x9F : 0xBF;
        } else if (b >= 0xF0 && b <= 0xF4) {
            n = 3;
            lo = b == 0xF0 ? 0x90 : 0x80;
            hi = b == 0xF4 ? 0x8F : 0xBF;
        } else {
            return false;
        }
        if (len - i <= n || u[i + 1] < lo || u[i + 1] > hi)
            return false;
        for (unsigned k = 2; k <= n; k++)
            if ((u[i + k] & 0xC0) != 0x80)
                return false;
        i += n + 1;
    }
    return true;
}

pcre2_code *gang__tok_regex(const char *pattern, size_t len, bool literal, char *err, size_t errlen)
{
    int ec;
    PCRE2_SIZE eo;
    uint32_t opts = PCRE2_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP);
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pattern, len, opts, &ec, &eo, NULL);
    if (!re) {
        PCRE2_UCHAR msg[120];
        pcre2_get_error_message(ec, msg, sizeof(msg));
        gang__tok_fail(err, errlen, "pre_tokenizer regex: %s at offset %zu", (char *)msg,
                       (size_t)eo);
        return NULL;
    }
    pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); /* a speed-up; the interpreter otherwise */
    return re;
}

/* Rust's char::is_whitespace (the Unicode White_Space property). */
static bool tok_is_ws(uint32_t c)
{
    return (c >= 9 && c <= 13) || c == 32 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
           c == 0x205F || c == 0x3000;
}

/* Scratch of one encode call. */
typedef struct tok_enc {
    const gang_tokenizer *t;
    char *arena;
    size_t alen, acap;
    gang__tok_span *sp, *nsp; /* pieces, and the next pre-tokenizer's pieces */
    size_t nsp_n, sp_n, sp_cap, nsp_cap;
    char *word; /* a piece in the byte-level alphabet */
    size_t wcap;
    pcre2_match_data *md;
    pcre2_match_context *mc;
    gang__tok_out out;
    const gang_tok_range *plain; /* ranges of the text where special tokens are text */
    size_t nplain;
} tok_enc;

static int tok_grow(void **p, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap)
        return 0;
    size_t c = *cap ? *cap : 64;
    while (c < need)
        c *= 2;
    void *q = realloc(*p, c * elem);
    if (!q)
        return GANG_ENOMEM;
    *p = q;
    *cap = c;
    return 0;
}

static int tok_push_span(tok_enc *e, uint32_t off, uint32_t len)
{
    if (len == 0)
        return 0;
    if (tok_grow((void **)&e->nsp, &e->nsp_cap, e->nsp_n + 1, sizeof(*e->nsp)))
        return GANG_ENOMEM;
    e->nsp[e->nsp_n++] = (gang__tok_span){off, len};
    return 0;
}

/* Splits piece s (at arena offset OFF) by RE with BEHAVIOR into e->nsp. The matches and
 * the gaps between them alternate; a behaviour decides what becomes a piece. */
static int tok_split(tok_enc *e, const pcre2_code *re, int behavior, uint32_t off, uint32_t len)
{
    uint32_t pos = 0, gap = 0;        /* next search start; start of the pending gap */
    int64_t pend_s = -1, pend_e = -1; /* a match held for Contiguous / MergedWith* */
    int rc = 0;
    while (pos <= len && !rc) {
        int m = pcre2_match(re, (PCRE2_SPTR)(e->arena + off), len, pos, PCRE2_NO_UTF_CHECK, e->md,
                            e->mc);
        if (m == PCRE2_ERROR_NOMATCH)
            break;
        if (m < 0)
            return GANG_ERANGE; /* match limit: a pathological regex */
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(e->md);
        uint32_t ms = (uint32_t)ov[0], me = (uint32_t)ov[1];
        if (me == ms) { /* an empty match: step over one character */
            uint32_t cp;
            pos = ms + (ms < len ? gang__tok_utf8_next(e->arena + off + ms, len - ms, &cp) : 1);
            continue;
        }
        pos = me;
        bool has_gap = ms > gap;
        switch (behavior) {
        case TOK_SPLIT_ISOLATED:
            rc = tok_push_span(e, off + gap, ms - gap);
            if (!rc)
                rc = tok_push_span(e, off + ms, me - ms);
            break;
        case TOK_SPLIT_REMOVED:
            rc = tok_push_span(e, off + gap, ms - gap);
            break;
        case TOK_SPLIT_MERGED_PREV: /* the match ends the gap before it */
            rc = tok_push_span(e, off + gap, me - gap);
            break;
        case TOK_SPLIT_MERGED_NEXT: /* the match starts the piece after it */
            if (has_gap)
                rc = tok_push_span(e, off + (pend_s >= 0 ? (uint32_t)pend_s : gap),
                                   ms - (pend_s >= 0 ? (uint32_t)pend_s : gap));
            else if (pend_s >= 0)
                rc = tok_push_span(e, off + (uint32_t)pend_s, (uint32_t)(pend_e - pend_s));
            pend_s = ms;
            pend_e = me;
            break;
        default: /* Contiguous: adjacent matches form one piece */
            if (has_gap || pend_s < 0) {
                if (pend_s >= 0)
                    rc = tok_push_span(e, off + (uint32_t)pend_s, (uint32_t)(pend_e - pend_s));
                if (!rc)
                    rc = tok_push_span(e, off + gap, ms - gap);
                pend_s = ms;
            }
            pend_e = me;
            break;
        }
        gap = me;
    }
    if (rc)
        return rc;
    if (pend_s >= 0 && behavior == TOK_SPLIT_MERGED_NEXT)
        return tok_push_span(e, off + (uint32_t)pend_s, len - (uint32_t)pend_s);
    if (pend_s >= 0)
        rc = tok_push_span(e, off + (uint32_t)pend_s, (uint32_t)(pend_e - pend_s));
    return rc ? rc : tok_push_span(e, off + gap, len - gap);
}

/* Appends " " + piece to the arena (ByteLevel's add_prefix_space); *off gets its offset. */
static int tok_prefix_space(tok_enc *e, uint32_t off, uint32_t len, uint32_t *noff)
{
    if (tok_grow((void **)&e->arena, &e->acap, e->alen + len + 1, 1))
        return GANG_ENOMEM;
    e->arena[e->alen] = ' ';
    memcpy(e->arena + e->alen + 1, e->arena + off, len);
    *noff = (uint32_t)e->alen;
    e->alen += len + 1;
    return 0;
}

/* Runs every pre-tokenizer over the pieces in e->sp. */
static int tok_pretokenize(tok_enc *e)
{
    const gang_tokenizer *t = e->t;
    for (unsigned k = 0; k < t->npt; k++) {
        const gang__tok_pretok *p = &t->pt[k];
        e->nsp_n = 0;
        for (size_t i = 0; i < e->sp_n; i++) {
            uint32_t off = e->sp[i].off, len = e->sp[i].len;
            int rc = 0;
            if (p->kind == TOK_PT_BYTELEVEL && p->add_prefix_space && e->arena[off] != ' ') {
                rc = tok_prefix_space(e, off, len, &off);
                len++;
            }
            if (!rc)
                rc =
                    p->re ? tok_split(e, p->re, p->behavior, off, len) : tok_push_span(e, off, len);
            if (rc)
                return rc;
        }
        gang__tok_span *sw = e->sp;
        size_t cw = e->sp_cap;
        e->sp = e->nsp;
        e->sp_cap = e->nsp_cap;
        e->sp_n = e->nsp_n;
        e->nsp = sw;
        e->nsp_cap = cw;
    }
    return 0;
}

/* Encodes one segment of text without added tokens: pre-tokenizers, alphabet, BPE. */
static int tok_encode_segment(tok_enc *e, const char *s, size_t len)
{
    if (len == 0)
        return 0;
    e->alen = 0;
    if (tok_grow((void **)&e->arena, &e->acap, len, 1))
        return GANG_ENOMEM;
    memcpy(e->arena, s, len);
    e->alen = len;
    e->sp_n = 0;
    e->nsp_n = 0;
    int rc = tok_push_span(e, 0, (uint32_t)len);
    if (rc)
        return rc;
    e->sp_n = e->nsp_n; /* the first piece went to nsp: swap it in */
    gang__tok_span *sw = e->sp;
    size_t cw = e->sp_cap;
    e->sp = e->nsp;
    e->sp_cap = e->nsp_cap;
    e->nsp = sw;
    e->nsp_cap = cw;
    if ((rc = tok_pretokenize(e)))
        return rc;
    for (size_t i = 0; i < e->sp_n && !rc; i++) {
        const char *w = e->arena + e->sp[i].off;
        size_t wl = e->sp[i].len;
        if (e->t->byte_level) {
            if (tok_grow((void **)&e->word, &e->wcap, 2 * wl, 1))
                return GANG_ENOMEM;
            size_t k = 0;
            for (size_t j = 0; j < wl; j++)
                k += gang__tok_bl_encode((unsigned char)w[j], e->word + k);
            w = e->word;
            wl = k;
        }
        rc = gang__tok_bpe_word(e->t, w, wl, &e->out);
    }
    return rc;
}

/* The longest added token of PASS (0: special or not normalized; 1: the others) that
 * starts at s[0..len), or NULL. */
static const gang__tok_added *tok_added_at(const gang_tokenizer *t, int pass, const char *s,
                                           size_t len)
{
    unsigned char b = (unsigned char)s[0];
    if (!(t->added_first[pass][b >> 3] & (1u << (b & 7))))
        return NULL;
    for (unsigned i = 0; i < t->nadded; i++) { /* longest first */
        const gang__tok_added *a = &t->added[i];
        bool in_pass = a->special || !a->normalized;
        if (in_pass == (pass == 0) && a->len <= len && s[0] == a->content[0] &&
            memcmp(s, a->content, a->len) == 0)
            return a;
    }
    return NULL;
}

static int tok_encode_added(tok_enc *e, int pass, const char *s, size_t len);

/* Whether the special token at s[off, off + n) of pass 0 (the caller's text) touches one of
 * the caller's plain ranges: there it is text, not the token. */
static bool tok_in_plain(const tok_enc *e, size_t off, size_t n)
{
    for (size_t i = 0; i < e->nplain; i++)
        if (off < e->plain[i].off + e->plain[i].len && e->plain[i].off < off + n)
            return true;
    return false;
}

/* A segment between added tokens of PASS goes on to the next pass; after pass 0 it is
 * normalized first (the tokens of pass 1 are matched on normalized text). */
static int tok_encode_gap(tok_enc *e, int pass, const char *s, size_t len)
{
    if (pass != 0 || !e->t->nnorm)
        return tok_encode_added(e, pass + 1, s, len);
    char *norm;
    size_t nlen;
    int rc = gang__tok_normalize(e->t, s, len, &norm, &nlen);
    if (rc)
        return rc;
    rc = tok_encode_added(e, 1, norm, nlen);
    free(norm);
    return rc;
}

/* Splits s[0..len) on the added tokens of PASS, leftmost-longest, applying lstrip and
 * rstrip; segments between them go to pass 1, then to the model. */
static int tok_encode_added(tok_enc *e, int pass, const char *s, size_t len)
{
    if (pass == 2)
        return tok_encode_segment(e, s, len);
    size_t done = 0; /* end of the last match */
    for (size_t pos = 0; pos < len;) {
        const gang__tok_added *a = tok_added_at(e->t, pass, s + pos, len - pos);
        if (a && pass == 0 && a->special && tok_in_plain(e, pos, a->len))
            a = NULL;
        if (!a) {
            pos++;
            continue;
        }
        size_t start = pos, stop = pos + a->len;
        if (a->lstrip) {
            while (start > done) {
                size_t p = start - 1;
                uint32_t cp;
                while (p > done && ((unsigned char)s[p] & 0xC0) == 0x80)
                    p--;
                gang__tok_utf8_next(s + p, len - p, &cp);
                if (!tok_is_ws(cp))
                    break;
                start = p;
            }
        }
        while (a->rstrip && stop < len) {
            uint32_t cp;
            unsigned cl = gang__tok_utf8_next(s + stop, len - stop, &cp);
            if (!tok_is_ws(cp))
                break;
            stop += cl;
        }
        int rc = tok_encode_gap(e, pass, s + done, start - done);
        if (rc)
            return rc;
        gang__tok_out_push(&e->out, a->id);
        pos = a->len + pos; /* the search resumes after the token itself */
        done = stop;
        if (pos < done)
            pos = done;
    }
    return tok_encode_gap(e, pass, s + done, len - done);
}

int gang_tokenizer_encode(const gang_tokenizer *t, const char *text, size_t len, bool add_special,
                          int32_t *ids, size_t cap, size_t *n)
{
    return gang_tokenizer_encode_plain(t, text, len, add_special, NULL, 0, ids, cap, n);
}

int gang_tokenizer_encode_plain(const gang_tokenizer *t, const char *text, size_t len,
                                bool add_special, const gang_tok_range *plain, size_t nplain,
                                int32_t *ids, size_t cap, size_t *n)
{
    if (n)
        *n = 0;
    if (!t || (!text && len) || (!ids && cap) || !n || len > GANG_TOK_MAX_TEXT_BYTES ||
        (!plain && nplain))
        return GANG_EINVAL;
    if (!gang__tok_utf8_valid(text, len))
        return GANG_EINVAL;
    tok_enc e = {.t = t, .out = {ids, cap, 0}, .plain = plain, .nplain = nplain};
    int rc = GANG_ENOMEM;
    e.md = pcre2_match_data_create(4, NULL);
    e.mc = pcre2_match_context_create(NULL);
    if (!e.md || !e.mc)
        goto out;
    pcre2_set_match_limit(e.mc, TOK_MATCH_LIMIT);
    for (unsigned i = 0; add_special && i < t->nprefix; i++)
        gang__tok_out_push(&e.out, t->prefix_ids[i]);
    rc = tok_encode_added(&e, 0, text, len);
    for (unsigned i = 0; !rc && add_special && i < t->nsuffix; i++)
        gang__tok_out_push(&e.out, t->suffix_ids[i]);
    if (!rc)
        rc = e.out.n > cap ? GANG_ERANGE : 0;
    *n = e.out.n;
out:
    pcre2_match_data_free(e.md);
    pcre2_match_context_free(e.mc);
    free(e.arena);
    free(e.sp);
    free(e.nsp);
    free(e.word);
    return rc;
}

int gang_tokenizer_find_special(const gang_tokenizer *t, const char *s, size_t len, size_t *at,
                                size_t *n)
{
    if (!t || (!s && len) || !at || !n)
        return GANG_EINVAL;
    for (size_t pos = 0; pos < len; pos++) {
        const gang__tok_added *a = tok_added_at(t, 0, s + pos, len - pos);
        if (a && a->special) {
            *at = pos;
            *n = a->len;
            return 0;
        }
    }
    return GANG_ENOENT;
}
