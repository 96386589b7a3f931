/*
 * The components of tokenizer.json: the BPE model with its vocabulary, merges and added
 * tokens, the pre-tokenizers, the post-processor and the decoder. Every field that would
 * change the ids and that we do not implement is refused with a message naming it.
 */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tok-internal.h"

#define TOK_MAX_PRETOK 16u
#define TOK_MAX_REGEX_BYTES 4096u
#define TOK_MAX_TEMPLATE 16u

static const cJSON *tok_get(const cJSON *o, const char *key)
{
    return cJSON_GetObjectItemCaseSensitive(o, key);
}

static const char *tok_type(const cJSON *o)
{
    const cJSON *ty = tok_get(o, "type");
    return cJSON_IsString(ty) ? ty->valuestring : "(without a type)";
}

/* A boolean field: absent or null gives DEF; anything else but a boolean is an error. */
static int tok_bool(const cJSON *o, const char *key, bool def, bool *out)
{
    const cJSON *v = tok_get(o, key);
    if (!v || cJSON_IsNull(v)) {
        *out = def;
        return 0;
    }
    if (!cJSON_IsBool(v))
        return -1;
    *out = cJSON_IsTrue(v);
    return 0;
}

/* Stores a copy of s[0..len) as the text of ID. */
static int tok_set_text(gang_tokenizer *t, uint32_t id, const char *s, size_t len)
{
    t->text[id] = malloc(len + 1);
    if (!t->text[id])
        return GANG_ENOMEM;
    memcpy(t->text[id], s, len);
    t->text[id][len] = 0;
    t->text_len[id] = (uint32_t)len;
    return 0;
}

/* Finds the number of ids (1 + the largest id of the vocabulary and the added tokens) and
 * allocates the per-id arrays. */
static int tok_alloc_ids(gang_tokenizer *t, const cJSON *vocab, const cJSON *added, char *err,
                         size_t errlen)
{
    double max = -1;
    size_t count = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, vocab)
    {
        if (!cJSON_IsNumber(e) || e->valuedouble < 0 || e->valuedouble >= GANG_TOK_MAX_VOCAB ||
            e->valuedouble != (double)(uint32_t)e->valuedouble)
            return gang__tok_fail(err, errlen, "model.vocab: bad id for token %.40s",
                                  e->string ? e->string : "?");
        if (++count > GANG_TOK_MAX_VOCAB)
            return gang__tok_fail(err, errlen, "model.vocab: more than %u tokens",
                                  GANG_TOK_MAX_VOCAB);
        max = e->valuedouble > max ? e->valuedouble : max;
    }
    cJSON_ArrayForEach(e, added)
    {
        const cJSON *id = tok_get(e, "id");
        if (!cJSON_IsNumber(id) || id->valuedouble < 0 || id->valuedouble >= GANG_TOK_MAX_VOCAB ||
            id->valuedouble != (double)(uint32_t)id->valuedouble)
            return gang__tok_fail(err, errlen, "added_tokens: bad or missing id");
        max = id->valuedouble > max ? id->valuedouble : max;
    }
    if (max < 0)
        return gang__tok_fail(err, errlen, "model.vocab: empty vocabulary");
    t->n_ids = (uint32_t)max + 1;
    t->text = calloc(t->n_ids, sizeof(*t->text));
    t->text_len = calloc(t->n_ids, sizeof(*t->text_len));
    t->special = calloc(t->n_ids, sizeof(*t->special));
    if (!t->text || !t->text_len || !t->special)
        return GANG_ENOMEM;
    return 0;
}

static int tok_load_vocab(gang_tokenizer *t, const cJSON *vocab, char *err, size_t errlen)
{
    const cJSON *e;
    cJSON_ArrayForEach(e, vocab)
    {
        uint32_t id = (uint32_t)e->valuedouble;
        size_t len = strlen(e->string);
        if (len > GANG_TOK_MAX_TOKEN_BYTES)
            return gang__tok_fail(err, errlen, "model.vocab: token %u longer than %u bytes", id,
                                  GANG_TOK_MAX_TOKEN_BYTES);
        if (t->text[id])
            return gang__tok_fail(err, errlen, "model.vocab: id %u given twice", id);
        if (!gang__tok_utf8_valid(e->string, len))
            return gang__tok_fail(err, errlen, "model.vocab: token %u is not UTF-8", id);
        int rc = tok_set_text(t, id, e->string, len);
        if (rc)
            return rc;
    }
    return 0;
}

/* Reads one added token; its text replaces a hole or must equal the vocabulary's. */
static int tok_load_added_one(gang_tokenizer *t, const cJSON *e, gang__tok_added *a, char *err,
                              size_t errlen)
{
    const cJSON *content = tok_get(e, "content");
    uint32_t id = (uint32_t)tok_get(e, "id")->valuedouble;
    if (!cJSON_IsString(content) || !content->valuestring[0])
        return gang__tok_fail(err, errlen, "added_tokens: id %u has no content", id);
    size_t len = strlen(content->valuestring);
    if (len > GANG_TOK_MAX_TOKEN_BYTES || !gang__tok_utf8_valid(content->valuestring, len))
        return gang__tok_fail(err, errlen, "added_tokens: id %u: content too long or not UTF-8",
                              id);
    bool single_word = false;
    if (tok_bool(e, "special", false, &a->special) || tok_bool(e, "lstrip", false, &a->lstrip) ||
        tok_bool(e, "rstrip", false, &a->rstrip) ||
        tok_bool(e, "normalized", !a->special, &a->normalized) ||
        tok_bool(e, "single_word", false, &single_word))
        return gang__tok_fail(err, errlen, "added_tokens: id %u: a flag is not a boolean", id);
    if (single_word)
        return gang__tok_fail(err, errlen, "added_tokens: id %u: single_word is not supported", id);
    if (t->text[id] && (t->text_len[id] != len || memcmp(t->text[id], content->valuestring, len)))
        return gang__tok_fail(err, errlen,
                              "added_tokens: id %u: content differs from the vocabulary's", id);
    if (!t->text[id] && tok_set_text(t, id, content->valuestring, len))
        return GANG_ENOMEM;
    a->id = (int32_t)id;
    a->content = t->text[id];
    a->len = (uint32_t)len;
    t->special[id] = a->special;
    return 0;
}

static int tok_added_cmp(const void *x, const void *y)
{
    const gang__tok_added *a = x, *b = y;
    if (a->len != b->len)
        return a->len > b->len ? -1 : 1;
    return a->id < b->id ? -1 : a->id > b->id;
}

static int tok_load_added(gang_tokenizer *t, const cJSON *added, char *err, size_t errlen)
{
    int n = cJSON_GetArraySize(added);
    if (n < 0 || (unsigned)n > GANG_TOK_MAX_ADDED)
        return gang__tok_fail(err, errlen, "added_tokens: more than %u", GANG_TOK_MAX_ADDED);
    if (n == 0)
        return 0;
    t->added = calloc((size_t)n, sizeof(*t->added));
    if (!t->added)
        return GANG_ENOMEM;
    const cJSON *e;
    cJSON_ArrayForEach(e, added)
    {
        int rc = tok_load_added_one(t, e, &t->added[t->nadded], err, errlen);
        if (rc)
            return rc;
        t->nadded++;
    }
    qsort(t->added, t->nadded, sizeof(*t->added), tok_added_cmp);
    for (unsigned i = 0; i < t->nadded; i++) {
        const gang__tok_added *a = &t->added[i];
        unsigned char b = (unsigned char)a->content[0];
        t->added_first[(a->special || !a->normalized) ? 0 : 1][b >> 3] |= (uint8_t)(1u << (b & 7));
    }
    return 0;
}

/* One merge, "a b" or ["a", "b"]: both sides and their concatenation must be tokens. */
static int tok_load_merge(gang_tokenizer *t, const cJSON *m, uint32_t rank, char *buf, char *err,
                          size_t errlen)
{
    const char *a, *b;
    size_t la, lb;
    if (cJSON_IsString(m)) {
        const char *sp = strchr(m->valuestring, ' ');
        if (!sp || strchr(sp + 1, ' '))
            return gang__tok_fail(err, errlen, "model.merges[%u]: not two tokens", rank);
        a = m->valuestring;
        la = (size_t)(sp - a);
        b = sp + 1;
        lb = strlen(b);
    } else if (cJSON_GetArraySize(m) == 2 && cJSON_IsString(cJSON_GetArrayItem(m, 0)) &&
               cJSON_IsString(cJSON_GetArrayItem(m, 1))) {
        a = cJSON_GetArrayItem(m, 0)->valuestring;
        b = cJSON_GetArrayItem(m, 1)->valuestring;
        la = strlen(a);
        lb = strlen(b);
    } else {
        return gang__tok_fail(err, errlen, "model.merges[%u]: not a pair of strings", rank);
    }
    if (la + lb > GANG_TOK_MAX_TOKEN_BYTES)
        return gang__tok_fail(err, errlen, "model.merges[%u]: too long", rank);
    memcpy(buf, a, la);
    memcpy(buf + la, b, lb);
    int32_t ia = gang__tok_lookup(t, a, la), ib = gang__tok_lookup(t, b, lb);
    int32_t im = gang__tok_lookup(t, buf, la + lb);
    if (ia < 0 || ib < 0 || im < 0)
        return gang__tok_fail(err, errlen, "model.merges[%u]: a token is not in the vocabulary",
                              rank);
    return gang__tok_merge_put(t, ia, ib, rank, im);
}

static int tok_load_merges(gang_tokenizer *t, const cJSON *merges, char *err, size_t errlen)
{
    int n = cJSON_GetArraySize(merges);
    if (!cJSON_IsArray(merges) || (unsigned)n > GANG_TOK_MAX_MERGES)
        return gang__tok_fail(err, errlen, "model.merges: not an array of at most %u",
                              GANG_TOK_MAX_MERGES);
    uint32_t cap = 16;
    while (cap < 2u * (uint32_t)n)
        cap <<= 1;
    t->mkey = calloc(cap, sizeof(*t->mkey));
    t->mrank = calloc(cap, sizeof(*t->mrank));
    t->mnew = calloc(cap, sizeof(*t->mnew));
    if (!t->mkey || !t->mrank || !t->mnew)
        return GANG_ENOMEM;
    t->mmask = cap - 1;
    char buf[2 * GANG_TOK_MAX_TOKEN_BYTES];
    uint32_t rank = 0;
    const cJSON *m;
    cJSON_ArrayForEach(m, merges)
    {
        int rc = tok_load_merge(t, m, rank++, buf, err, errlen);
        if (rc)
            return rc;
    }
    return 0;
}

/* Options of the BPE model that change the ids and that we do not implement. */
static int tok_check_bpe(gang_tokenizer *t, const cJSON *model, char *err, size_t errlen)
{
    const cJSON *v = tok_get(model, "dropout");
    if (v && !cJSON_IsNull(v) && !(cJSON_IsNumber(v) && v->valuedouble == 0))
        return gang__tok_fail(err, errlen, "model.dropout is not supported");
    static const char *const affixes[] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (int i = 0; i < 2; i++) {
        v = tok_get(model, affixes[i]);
        if (v && !cJSON_IsNull(v) && !(cJSON_IsString(v) && !v->valuestring[0]))
            return gang__tok_fail(err, errlen, "model.%s is not supported", affixes[i]);
    }
    if (tok_bool(model, "ignore_merges", false, &t->ignore_merges) ||
        tok_bool(model, "byte_fallback", false, &t->byte_fallback) ||
        tok_bool(model, "fuse_unk", false, &t->fuse_unk))
        return gang__tok_fail(err, errlen, "model: a flag is not a boolean");
    return 0;
}

/* The unknown token and the byte-fallback tokens, once the hash exists. */
static int tok_load_specials(gang_tokenizer *t, const cJSON *model, char *err, size_t errlen)
{
    const cJSON *unk = tok_get(model, "unk_token");
    if (cJSON_IsString(unk)) {
        t->unk_id = gang__tok_lookup(t, unk->valuestring, strlen(unk->valuestring));
        if (t->unk_id < 0)
            return gang__tok_fail(err, errlen, "model.unk_token is not in the vocabulary");
    } else if (unk && !cJSON_IsNull(unk)) {
        return gang__tok_fail(err, errlen, "model.unk_token is not a string");
    }
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof(name), "<0x%02X>", b);
        t->byte_ids[b] = gang__tok_lookup(t, name, strlen(name));
    }
    return 0;
}

int gang__tok_load_model(gang_tokenizer *t, const cJSON *model, const cJSON *added, char *err,
                         size_t errlen)
{
    if (!cJSON_IsObject(model))
        return gang__tok_fail(err, errlen, "tokenizer.json: no model");
    const cJSON *ty = tok_get(model, "type");
    if (!cJSON_IsString(ty) || strcmp(ty->valuestring, "BPE") != 0)
        return gang__tok_fail(err, errlen, "model %s is not supported (only BPE)", tok_type(model));
    if (added && !cJSON_IsNull(added) && !cJSON_IsArray(added))
        return gang__tok_fail(err, errlen, "added_tokens: not an array");
    const cJSON *vocab = tok_get(model, "vocab");
    if (!cJSON_IsObject(vocab))
        return gang__tok_fail(err, errlen, "model.vocab: not an object");
    int rc = tok_check_bpe(t, model, err, errlen);
    if (!rc)
        rc = tok_alloc_ids(t, vocab, cJSON_IsArray(added) ? added : NULL, err, errlen);
    if (!rc)
        rc = tok_load_vocab(t, vocab, err, errlen);
    if (!rc && cJSON_IsArray(added))
        rc = tok_load_added(t, added, err, errlen);
    if (!rc)
        rc = gang__tok_build_hash(t);
    if (!rc)
        rc = tok_load_merges(t, tok_get(model, "merges"), err, errlen);
    if (!rc)
        rc = tok_load_specials(t, model, err, errlen);
    return rc;
}

/* Appends one pre-tokenizer (not a Sequence) to t->pt. */
static int tok_pretok_one(gang_tokenizer *t, const cJSON *o, char *err, size_t errlen)
{
    static const char *const behaviors[] = {"Isolated", "Removed", "MergedWithPrevious",
                                            "MergedWithNext", "Contiguous"};
    if (t->npt >= TOK_MAX_PRETOK)
        return gang__tok_fail(err, errlen, "pre_tokenizer: more than %u", TOK_MAX_PRETOK);
    gang__tok_pretok *p = &t->pt[t->npt];
    memset(p, 0, sizeof(*p));
    const char *ty = tok_type(o);
    if (strcmp(ty, "ByteLevel") == 0) {
        bool use_regex;
        p->kind = TOK_PT_BYTELEVEL;
        if (tok_bool(o, "add_prefix_space", false, &p->add_prefix_space) ||
            tok_bool(o, "use_regex", true, &use_regex))
            return gang__tok_fail(err, errlen, "pre_tokenizer ByteLevel: bad flag");
        if (use_regex &&
            !(p->re = gang__tok_regex(TOK_GPT2_REGEX, strlen(TOK_GPT2_REGEX), false, err, errlen)))
            return GANG_EMODEL;
        t->byte_level = true;
    } else if (strcmp(ty, "Digits") == 0) {
        bool individual;
        if (tok_bool(o, "individual_digits", false, &individual))
            return gang__tok_fail(err, errlen, "pre_tokenizer Digits: bad flag");
        p->behavior = individual ? TOK_SPLIT_ISOLATED : TOK_SPLIT_CONTIGUOUS;
        if (!(p->re = gang__tok_regex("\\p{N}", 5, false, err, errlen)))
            return GANG_EMODEL;
    } else if (strcmp(ty, "Split") == 0) {
        const cJSON *pat = tok_get(o, "pattern"), *beh = tok_get(o, "behavior");
        const cJSON *re = tok_get(pat, "Regex"), *lit = tok_get(pat, "String");
        bool invert;
        if (tok_bool(o, "invert", false, &invert) || invert)
            return gang__tok_fail(err, errlen, "pre_tokenizer Split: invert is not supported");
        p->behavior = -1;
        for (int i = 0; i < 5 && cJSON_IsString(beh); i++)
            if (strcmp(beh->valuestring, behaviors[i]) == 0)
                p->behavior = i;
        const cJSON *src = cJSON_IsString(re) ? re : lit;
        if (p->behavior < 0 || !cJSON_IsString(src) ||
            strlen(src->valuestring) > TOK_MAX_REGEX_BYTES)
            return gang__tok_fail(err, errlen, "pre_tokenizer Split: bad pattern or behavior");
        if (!(p->re = gang__tok_regex(src->valuestring, strlen(src->valuestring), src == lit, err,
                                      errlen)))
            return GANG_EMODEL;
    } else {
        return gang__tok_fail(err, errlen, "pre_tokenizer %s is not supported", ty);
    }
    t->npt++;
    return 0;
}

/* Flattens nested Sequences into t->pt. DEPTH bounds the nesting. */
static int tok_pretok_walk(gang_tokenizer *t, const cJSON *o, int depth, char *err, size_t errlen)
{
    if (strcmp(tok_type(o), "Sequence") != 0)
        return tok_pretok_one(t, o, err, errlen);
    const cJSON *list = tok_get(o, "pretokenizers"), *e;
    if (!cJSON_IsArray(list) || depth > 4)
        return gang__tok_fail(err, errlen, "pre_tokenizer Sequence: bad list");
    cJSON_ArrayForEach(e, list)
    {
        int rc = tok_pretok_walk(t, e, depth + 1, err, errlen);
        if (rc)
            return rc;
    }
    return 0;
}

int gang__tok_load_pretok(gang_tokenizer *t, const cJSON *pt, char *err, size_t errlen)
{
    if (!pt || cJSON_IsNull(pt))
        return 0;
    t->pt = calloc(TOK_MAX_PRETOK, sizeof(*t->pt));
    if (!t->pt)
        return GANG_ENOMEM;
    int rc = tok_pretok_walk(t, pt, 0, err, errlen);
    if (rc)
        return rc;
    for (unsigned i = 0; i + 1 < t->npt; i++)
        if (t->pt[i].kind == TOK_PT_BYTELEVEL)
            return gang__tok_fail(err, errlen,
                                  "pre_tokenizer: ByteLevel before another pre-tokenizer is "
                                  "not supported");
    return 0;
}

/* Appends the ids of special token NAME of a TemplateProcessing to *ids. */
static int tok_template_ids(const gang_tokenizer *t, const cJSON *specials, const char *name,
                            int32_t **ids, unsigned *n, char *err, size_t errlen)
{
    const cJSON *tokids = tok_get(tok_get(specials, name), "ids"), *e;
    if (!cJSON_IsArray(tokids))
        return gang__tok_fail(err, errlen, "post_processor: special token %.40s undefined", name);
    cJSON_ArrayForEach(e, tokids)
    {
        if (*n >= TOK_MAX_TEMPLATE || !cJSON_IsNumber(e) || e->valuedouble < 0 ||
            e->valuedouble >= t->n_ids)
            return gang__tok_fail(err, errlen, "post_processor: bad ids for %.40s", name);
        if (!*ids && !(*ids = calloc(TOK_MAX_TEMPLATE, sizeof(**ids))))
            return GANG_ENOMEM;
        (*ids)[(*n)++] = (int32_t)e->valuedouble;
    }
    return 0;
}

static int tok_template(gang_tokenizer *t, const cJSON *pp, char *err, size_t errlen)
{
    const cJSON *single = tok_get(pp, "single"), *specials = tok_get(pp, "special_tokens"), *e;
    bool seen_seq = false;
    if (!cJSON_IsArray(single))
        return gang__tok_fail(err, errlen, "post_processor TemplateProcessing: no single");
    cJSON_ArrayForEach(e, single)
    {
        const cJSON *sp = tok_get(e, "SpecialToken"), *seq = tok_get(e, "Sequence");
        if (seq) {
            const cJSON *id = tok_get(seq, "id");
            if (seen_seq || !cJSON_IsString(id) || strcmp(id->valuestring, "A") != 0)
                return gang__tok_fail(err, errlen,
                                      "post_processor TemplateProcessing: single must hold "
                                      "sequence A once");
            seen_seq = true;
            continue;
        }
        const cJSON *name = tok_get(sp, "id");
        if (!cJSON_IsString(name))
            return gang__tok_fail(err, errlen, "post_processor TemplateProcessing: bad piece");
        int rc = seen_seq ? tok_template_ids(t, specials, name->valuestring, &t->suffix_ids,
                                             &t->nsuffix, err, errlen)
                          : tok_template_ids(t, specials, name->valuestring, &t->prefix_ids,
                                             &t->nprefix, err, errlen);
        if (rc)
            return rc;
    }
    if (!seen_seq)
        return gang__tok_fail(err, errlen, "post_processor TemplateProcessing: no sequence A");
    return 0;
}

int gang__tok_load_post(gang_tokenizer *t, const cJSON *pp, char *err, size_t errlen)
{
    if (!pp || cJSON_IsNull(pp))
        return 0;
    const char *ty = tok_type(pp);
    if (strcmp(ty, "ByteLevel") == 0) /* offsets only */
        return 0;
    if (strcmp(ty, "TemplateProcessing") == 0) {
        if (t->nprefix || t->nsuffix)
            return gang__tok_fail(err, errlen, "post_processor: two TemplateProcessing");
        return tok_template(t, pp, err, errlen);
    }
    if (strcmp(ty, "Sequence") == 0) {
        const cJSON *list = tok_get(pp, "processors"), *e;
        if (!cJSON_IsArray(list) || cJSON_GetArraySize(list) > 4)
            return gang__tok_fail(err, errlen, "post_processor Sequence: bad list");
        cJSON_ArrayForEach(e, list)
        {
            if (strcmp(tok_type(e), "Sequence") == 0)
                return gang__tok_fail(err, errlen, "post_processor: nested Sequence");
            int rc = gang__tok_load_post(t, e, err, errlen);
            if (rc)
                return rc;
        }
        return 0;
    }
    return gang__tok_fail(err, errlen, "post_processor %s is not supported", ty);
}

/* ByteLevel decoding of one token's text src[0..len): every character through the byte
 * alphabet, or the text itself when one character is outside it (as tokenizers does).
 * The result replaces t->dec[id] (which may be src: it is freed unless it is t->text[id]). */
static int tok_decode_bytelevel_of(gang_tokenizer *t, uint32_t id, const char *src, size_t len)
{
    size_t k = 0;
    char *out = malloc(len + 1);
    if (!out)
        return GANG_ENOMEM;
    for (size_t i = 0; i < len;) {
        uint32_t cp;
        i += gang__tok_utf8_next(src + i, len - i, &cp);
        int b = gang__tok_bl_decode(cp);
        if (b < 0) {
            free(out);
            return 0; /* t->dec[id] stays the text */
        }
        out[k++] = (char)b;
    }
    out[k] = '\0';
    if (t->dec[id] != t->text[id])
        free(t->dec[id]);
    t->dec[id] = out;
    t->dec_len[id] = (uint32_t)k;
    return 0;
}

static int tok_decode_bytelevel(gang_tokenizer *t, uint32_t id)
{
    t->dec[id] = t->text[id];
    t->dec_len[id] = t->text_len[id];
    return tok_decode_bytelevel_of(t, id, t->text[id], t->text_len[id]);
}

/* Replaces every FROM (flen bytes) in s[0..*len) by TO in a new buffer, freeing s. */
static char *tok_str_replace(char *s, uint32_t *len, const char *from, size_t flen, const char *to,
                             size_t tlen)
{
    size_t count = 0;
    for (const char *p = s; (p = memmem(p, *len - (size_t)(p - s), from, flen)); p += flen)
        count++;
    if (!count)
        return s;
    size_t nlen = *len + count * tlen - count * flen, k = 0;
    char *out = malloc(nlen + 1);
    if (!out) {
        free(s);
        return NULL;
    }
    for (size_t i = 0; i < *len;) {
        if (i + flen <= *len && memcmp(s + i, from, flen) == 0) {
            memcpy(out + k, to, tlen);
            k += tlen;
            i += flen;
        } else {
            out[k++] = s[i++];
        }
    }
    out[k] = 0;
    free(s);
    *len = (uint32_t)nlen;
    return out;
}

/* Applies Replace(from -> to) to every token's decoded text. */
static int tok_chain_replace(gang_tokenizer *t, const char *from, const char *to)
{
    for (uint32_t id = 0; id < t->n_ids; id++) {
        if (!t->dec[id])
            continue;
        t->dec[id] =
            tok_str_replace(t->dec[id], &t->dec_len[id], from, strlen(from), to, strlen(to));
        if (!t->dec[id])
            return GANG_ENOMEM;
    }
    return 0;
}

/* What the decoders seen so far in a Sequence have set up. */
typedef struct tok_chain_state {
    bool fallback; /* ByteFallback seen */
    bool fused;    /* Fuse seen: later decoders see the whole text as one token */
    bool stripped; /* Strip or Metaspace's leading-space rule set */
} tok_chain_state;

/*
 * One decoder of a Sequence, in the order tokenizers applies them (decode_chain over the
 * tokens' strings). Per-token rules are applied to every token's text here, at load:
 * Replace (a string pattern), ByteLevel (characters to bytes, from then on the stream goes
 * through the UTF-8 machine), Metaspace (its replacement character to a space). ByteFallback
 * makes "<0xXX>" tokens bytes held in runs (tok-decode.c); Fuse concatenates, which a
 * stream does anyway, but it turns a later Strip into a rule for the start of the text. A
 * Strip before Fuse would strip every token and Metaspace's leading-space rule after
 * another leading rule would compete: those, and WordPiece, BPEDecoder and CTC, are
 * refused with their name. Applied per token, a ByteLevel after Fuse treats a token with a
 * character outside the byte alphabet as its text alone, where tokenizers would so treat
 * the whole text (vocabularies that have such a decoder are byte-level throughout).
 */
static int tok_chain_one(gang_tokenizer *t, const cJSON *o, tok_chain_state *st, char *err,
                         size_t errlen)
{
    const char *ty = tok_type(o);
    if (strcmp(ty, "Replace") == 0) {
        const cJSON *from = tok_get(tok_get(o, "pattern"), "String"), *to = tok_get(o, "content");
        if (!cJSON_IsString(from) || !from->valuestring[0] || !cJSON_IsString(to) ||
            strlen(from->valuestring) > 64 || strlen(to->valuestring) > 64)
            return gang__tok_fail(err, errlen,
                                  "decoder Replace: only a string pattern is "
                                  "supported");
        return tok_chain_replace(t, from->valuestring, to->valuestring);
    }
    if (strcmp(ty, "ByteFallback") == 0) {
        st->fallback = true;
        return 0;
    }
    if (strcmp(ty, "Fuse") == 0) {
        st->fused = true;
        return 0;
    }
    if (strcmp(ty, "ByteLevel") == 0) {
        for (uint32_t id = 0; id < t->n_ids; id++) {
            if (t->dec[id] && tok_decode_bytelevel_of(t, id, t->dec[id], t->dec_len[id]))
                return GANG_ENOMEM;
        }
        t->dec_utf8 = true;
        return 0;
    }
    if (strcmp(ty, "Metaspace") == 0) {
        const cJSON *rep = tok_get(o, "replacement"), *scheme = tok_get(o, "prepend_scheme"),
                    *add = tok_get(o, "add_prefix_space");
        const char *r = cJSON_IsString(rep) ? rep->valuestring : "\xe2\x96\x81";
        bool lead = cJSON_IsString(scheme) ? strcmp(scheme->valuestring, "never") != 0
                                           : !cJSON_IsFalse(add);
        if (!r[0] || strlen(r) > 4 || (lead && st->stripped))
            return gang__tok_fail(err, errlen,
                                  "decoder Metaspace: unsupported replacement or "
                                  "a second leading rule");
        int rc = tok_chain_replace(t, r, " ");
        if (rc || !lead)
            return rc;
        snprintf(t->strip_char, sizeof(t->strip_char), " ");
        t->strip_start = 1;
        st->stripped = true;
        return 0;
    }
    if (strcmp(ty, "Strip") == 0 && st->fused && !st->stripped) {
        const cJSON *c = tok_get(o, "content"), *sa = tok_get(o, "start"), *sp = tok_get(o, "stop");
        uint32_t cp;
        if (!cJSON_IsString(c) || !c->valuestring[0] ||
            gang__tok_utf8_next(c->valuestring, strlen(c->valuestring), &cp) !=
                strlen(c->valuestring) ||
            !cJSON_IsNumber(sa) || sa->valuedouble < 0 || sa->valuedouble > 16 ||
            !cJSON_IsNumber(sp) || sp->valuedouble != 0)
            return gang__tok_fail(err, errlen,
                                  "decoder Strip: only one character, at the start, is "
                                  "supported");
        snprintf(t->strip_char, sizeof(t->strip_char), "%s", c->valuestring);
        t->strip_start = (unsigned)sa->valuedouble;
        st->stripped = true;
        return 0;
    }
    return gang__tok_fail(err, errlen, "decoder %s is not supported%s", ty,
                          strcmp(ty, "Strip") == 0 ? " before Fuse (per token) or twice" : "");
}

/* A decoder chain (a Sequence, or a lone decoder other than ByteLevel): per-token texts
 * after the per-token rules, then the bytes of the <0xXX> tokens for ByteFallback. */
static int tok_load_chain(gang_tokenizer *t, const cJSON *dec, char *err, size_t errlen)
{
    t->dec_kind = TOK_DEC_CHAIN;
    for (uint32_t id = 0; id < t->n_ids; id++) {
        if (!t->text[id])
            continue;
        t->dec[id] = malloc(t->text_len[id] + 1);
        if (!t->dec[id])
            return GANG_ENOMEM;
        memcpy(t->dec[id], t->text[id], t->text_len[id] + 1);
        t->dec_len[id] = t->text_len[id];
    }
    tok_chain_state st = {false, false, false};
    const cJSON *list = tok_get(dec, "decoders"), *e;
    if (strcmp(tok_type(dec), "Sequence") != 0) {
        /* A lone decoder is a chain of one: ByteFallback alone still needs its byte table. */
        int rc = tok_chain_one(t, dec, &st, err, errlen);
        if (rc)
            return rc;
    } else {
        if (!cJSON_IsArray(list) || cJSON_GetArraySize(list) > 8)
            return gang__tok_fail(err, errlen, "decoder Sequence: bad list");
        cJSON_ArrayForEach(e, list)
        {
            if (strcmp(tok_type(e), "Sequence") == 0)
                return gang__tok_fail(err, errlen, "decoder Sequence: nested Sequence");
            int rc = tok_chain_one(t, e, &st, err, errlen);
            if (rc)
                return rc;
        }
    }
    if (!st.fallback)
        return 0;
    t->dec_byte = malloc(t->n_ids * sizeof(*t->dec_byte));
    if (!t->dec_byte)
        return GANG_ENOMEM;
    for (uint32_t id = 0; id < t->n_ids; id++) {
        const char *s = t->dec[id];
        unsigned v;
        char tail;
        t->dec_byte[id] = -1;
        if (s && t->dec_len[id] == 6 && strncmp(s, "<0x", 3) == 0 && s[5] == '>' &&
            isxdigit((unsigned char)s[3]) && isxdigit((unsigned char)s[4]) &&
            sscanf(s + 3, "%2x%c", &v, &tail) == 2)
            t->dec_byte[id] = (int16_t)v;
    }
    return 0;
}

int gang__tok_load_decoder(gang_tokenizer *t, const cJSON *dec, char *err, size_t errlen)
{
    if (!dec || cJSON_IsNull(dec))
        return gang__tok_fail(err, errlen,
                              "decoder: none (tokens joined by spaces) is not "
                              "supported");
    t->dec = calloc(t->n_ids, sizeof(*t->dec));
    t->dec_len = calloc(t->n_ids, sizeof(*t->dec_len));
    if (!t->dec || !t->dec_len)
        return GANG_ENOMEM;
    const char *ty = tok_type(dec);
    if (strcmp(ty, "ByteLevel") != 0)
        return tok_load_chain(t, dec, err, errlen);
    t->dec_kind = TOK_DEC_BYTELEVEL;
    for (uint32_t id = 0; id < t->n_ids; id++)
        if (t->text[id] && tok_decode_bytelevel(t, id))
            return GANG_ENOMEM;
    return 0;
}
