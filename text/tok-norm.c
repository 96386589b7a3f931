/*
 * Normalizers of tokenizer.json: Prepend (a prefix before a non-empty segment) and Replace
 * (every non-overlapping match of a string or regex, left to right, by a content), alone
 * or in a Sequence: what SentencePiece-style BPE tokenizers (Llama 2, Mistral, TinyLlama)
 * use. Every other normalizer (NFC, NFKC, Lowercase, Strip, ...) is refused by name.
 */
#include <stdlib.h>
#include <string.h>

#include "tok-internal.h"

#define TOK_MAX_NORM 8u
#define TOK_MAX_NORM_TEXT 256u

static int tok_norm_one(gang_tokenizer *t, const cJSON *o, char *err, size_t errlen)
{
    const cJSON *ty = cJSON_GetObjectItemCaseSensitive(o, "type");
    const char *name = cJSON_IsString(ty) ? ty->valuestring : "(without a type)";
    if (t->nnorm >= TOK_MAX_NORM)
        return gang__tok_fail(err, errlen, "normalizer: more than %u", TOK_MAX_NORM);
    gang__tok_norm *n = &t->norm[t->nnorm];
    const cJSON *text;
    if (strcmp(name, "Prepend") == 0) {
        n->kind = TOK_NORM_PREPEND;
        text = cJSON_GetObjectItemCaseSensitive(o, "prepend");
    } else if (strcmp(name, "Replace") == 0) {
        const cJSON *pat = cJSON_GetObjectItemCaseSensitive(o, "pattern");
        const cJSON *re = cJSON_GetObjectItemCaseSensitive(pat, "Regex");
        const cJSON *lit = cJSON_GetObjectItemCaseSensitive(pat, "String");
        const cJSON *src = cJSON_IsString(re) ? re : lit;
        n->kind = TOK_NORM_REPLACE;
        text = cJSON_GetObjectItemCaseSensitive(o, "content");
        if (!cJSON_IsString(src) || !src->valuestring[0] ||
            strlen(src->valuestring) > TOK_MAX_NORM_TEXT)
            return gang__tok_fail(err, errlen, "normalizer Replace: bad pattern");
        n->re =
            gang__tok_regex(src->valuestring, strlen(src->valuestring), src == lit, err, errlen);
        if (!n->re)
            return GANG_EMODEL;
    } else {
        return gang__tok_fail(err, errlen, "normalizer %s is not supported", name);
    }
    t->nnorm++; /* from here on freed with the tokenizer */
    if (!cJSON_IsString(text) || strlen(text->valuestring) > TOK_MAX_NORM_TEXT)
        return gang__tok_fail(err, errlen, "normalizer %s: bad text", name);
    n->len = (uint32_t)strlen(text->valuestring);
    n->text = strdup(text->valuestring);
    return n->text ? 0 : GANG_ENOMEM;
}

int gang__tok_load_norm(gang_tokenizer *t, const cJSON *norm, char *err, size_t errlen)
{
    if (!norm || cJSON_IsNull(norm))
        return 0;
    t->norm = calloc(TOK_MAX_NORM, sizeof(*t->norm));
    if (!t->norm)
        return GANG_ENOMEM;
    const cJSON *ty = cJSON_GetObjectItemCaseSensitive(norm, "type");
    if (!cJSON_IsString(ty) || strcmp(ty->valuestring, "Sequence") != 0)
        return tok_norm_one(t, norm, err, errlen);
    const cJSON *list = cJSON_GetObjectItemCaseSensitive(norm, "normalizers"), *e;
    if (!cJSON_IsArray(list))
        return gang__tok_fail(err, errlen, "normalizer Sequence: bad list");
    cJSON_ArrayForEach(e, list)
    {
        const cJSON *ety = cJSON_GetObjectItemCaseSensitive(e, "type");
        if (cJSON_IsString(ety) && strcmp(ety->valuestring, "Sequence") == 0)
            return gang__tok_fail(err, errlen, "normalizer: nested Sequence");
        int rc = tok_norm_one(t, e, err, errlen);
        if (rc)
            return rc;
    }
    return 0;
}

/* Replaces every match of n->re in s[0..len) into a new buffer. */
static int tok_replace(const gang__tok_norm *n, const char *s, size_t len, char **out, size_t *olen)
{
    pcre2_match_data *md = pcre2_match_data_create(1, NULL);
    size_t cap = len + 16, k = 0, pos = 0, done = 0;
    char *b = malloc(cap);
    int rc = GANG_ENOMEM;
    if (!md || !b)
        goto out;
    for (;;) {
        int m = pos <= len
                    ? pcre2_match(n->re, (PCRE2_SPTR)s, len, pos, PCRE2_NO_UTF_CHECK, md, NULL)
                    : PCRE2_ERROR_NOMATCH;
        size_t ms = len, me = len;
        if (m >= 0) {
            PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
            ms = ov[0];
            me = ov[1];
        } else if (m != PCRE2_ERROR_NOMATCH) {
            rc = GANG_ERANGE;
            goto out;
        }
        size_t need = k + (ms - done) + (m >= 0 ? n->len : 0) + 1;
        if (need > 4 * (size_t)GANG_TOK_MAX_TEXT_BYTES) {
            rc = GANG_ERANGE;
            goto out;
        }
        if (need > cap) {
            while (cap < need)
                cap *= 2;
            char *nb = realloc(b, cap);
            if (!nb)
                goto out;
            b = nb;
        }
        memcpy(b + k, s + done, ms - done);
        k += ms - done;
        if (m < 0)
            break;
        memcpy(b + k, n->text, n->len);
        k += n->len;
        done = me;
        if (me == ms) { /* an empty match: copy one character and move on */
            uint32_t cp;
            size_t cl = ms < len ? gang__tok_utf8_next(s + ms, len - ms, &cp) : 1;
            pos = ms + cl;
        } else {
            pos = me;
        }
    }
    *out = b;
    *olen = k;
    b = NULL;
    rc = 0;
out:
    free(b);
    pcre2_match_data_free(md);
    return rc;
}

int gang__tok_normalize(const gang_tokenizer *t, const char *s, size_t len, char **out,
                        size_t *olen)
{
    char *cur = malloc(len + 1);
    if (!cur)
        return GANG_ENOMEM;
    memcpy(cur, s, len);
    size_t clen = len;
    for (unsigned i = 0; i < t->nnorm; i++) {
        const gang__tok_norm *n = &t->norm[i];
        char *next = NULL;
        size_t nlen = 0;
        if (n->kind == TOK_NORM_PREPEND) {
            if (clen == 0)
                continue;
            if (clen + n->len > 4 * (size_t)GANG_TOK_MAX_TEXT_BYTES) {
                free(cur);
                return GANG_ERANGE;
            }
            next = malloc(clen + n->len + 1);
            if (next) {
                memcpy(next, n->text, n->len);
                memcpy(next + n->len, cur, clen);
                nlen = clen + n->len;
            }
        } else {
            int rc = tok_replace(n, cur, clen, &next, &nlen);
            if (rc) {
                free(cur);
                return rc;
            }
        }
        free(cur);
        if (!next)
            return GANG_ENOMEM;
        cur = next;
        clen = nlen;
    }
    *out = cur;
    *olen = clen;
    return 0;
}
