/*
 * The tokenizer's front: reading tokenizer.json (bounded), refusing what cannot be
 * honoured exactly, the vocabulary hash, lookups and freeing. The parts live in
 * tok-load.c (components), tok-bpe.c (the BPE model), tok-pretok.c (added tokens,
 * pre-tokenizers, encode) and tok-decode.c (incremental decoding).
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "tok-internal.h"

int gang__tok_fail(char *err, size_t errlen, const char *fmt, ...)
{
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return GANG_EMODEL;
}

/*
 * fmix64 of MurmurHash3: the avalanche after the seeded FNV-1a pass of the vocabulary
 * table, and the hash of a (left, right) id pair in the merge table.
 */
uint64_t gang__tok_mix64(uint64_t h)
{
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ull;
    h ^= h >> 33;
    return h;
}

uint64_t gang__tok_hash(const gang_tokenizer *t, const char *s, size_t len)
{
    uint64_t h = 0xcbf29ce484222325ull ^ t->seed;
    for (size_t i = 0; i < len; i++) {
        h ^= (unsigned char)s[i];
        h *= 0x100000001b3ull;
    }
    return gang__tok_mix64(h ^ len);
}

int32_t gang__tok_lookup(const gang_tokenizer *t, const char *s, size_t len)
{
    if (!t->hslot)
        return -1;
    for (uint64_t i = gang__tok_hash(t, s, len) & t->hmask;; i = (i + 1) & t->hmask) {
        uint32_t v = t->hslot[i];
        if (!v)
            return -1;
        uint32_t id = v - 1;
        if (t->text_len[id] == len && memcmp(t->text[id], s, len) == 0)
            return (int32_t)id;
    }
}

/* Rebuilds the text -> id hash over every id with a text (the first id wins a repeated
 * text: the vocabulary is inserted before the added tokens). 0 or GANG_ENOMEM. */
int gang__tok_build_hash(gang_tokenizer *t)
{
    uint32_t cap = 16;
    while (cap < 2 * t->n_ids)
        cap <<= 1;
    free(t->hslot);
    t->hslot = calloc(cap, sizeof(*t->hslot));
    if (!t->hslot)
        return GANG_ENOMEM;
    t->hmask = cap - 1;
    for (uint32_t id = 0; id < t->n_ids; id++) {
        if (!t->text[id] || gang__tok_lookup(t, t->text[id], t->text_len[id]) >= 0)
            continue;
        uint64_t i = gang__tok_hash(t, t->text[id], t->text_len[id]) & t->hmask;
        while (t->hslot[i])
            i = (i + 1) & t->hmask;
        t->hslot[i] = id + 1;
    }
    return 0;
}

/* Keys whose value must be null (they would change the ids) and top-level components
 * every supported tokenizer must name. */
static int tok_check_top(const cJSON *root, char *err, size_t errlen)
{
    static const char *const must_be_null[] = {"truncation", "padding"};
    for (size_t i = 0; i < sizeof(must_be_null) / sizeof(must_be_null[0]); i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, must_be_null[i]);
        if (v && !cJSON_IsNull(v))
            return gang__tok_fail(err, errlen, "tokenizer.json: %s is set (not supported)",
                                  must_be_null[i]);
    }
    return 0;
}

/* Loads a parsed tokenizer.json into T. 0 or GANG_E* with err filled. */
static int tok_load_root(gang_tokenizer *t, const cJSON *root, char *err, size_t errlen)
{
    if (!cJSON_IsObject(root))
        return gang__tok_fail(err, errlen, "tokenizer.json: not a JSON object");
    int rc = tok_check_top(root, err, errlen);
    if (rc)
        return rc;
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    const cJSON *added = cJSON_GetObjectItemCaseSensitive(root, "added_tokens");
    rc = gang__tok_load_norm(t, cJSON_GetObjectItemCaseSensitive(root, "normalizer"), err, errlen);
    if (!rc)
        rc = gang__tok_load_pretok(t, cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer"), err,
                                   errlen);
    if (!rc)
        rc = gang__tok_load_model(t, model, added, err, errlen);
    for (unsigned i = 0; !rc && t->nnorm && i < t->nadded; i++)
        if (!t->added[i].special && t->added[i].normalized)
            rc = gang__tok_fail(err, errlen,
                                "added_tokens: %.40s is normalized under a normalizer (not "
                                "supported)",
                                t->added[i].content);
    if (!rc)
        rc = gang__tok_load_post(t, cJSON_GetObjectItemCaseSensitive(root, "post_processor"), err,
                                 errlen);
    if (!rc)
        rc = gang__tok_load_decoder(t, cJSON_GetObjectItemCaseSensitive(root, "decoder"), err,
                                    errlen);
    return rc;
}

int gang_tokenizer_load_buffer(const char *json, size_t len, gang_tokenizer **out, char *err,
                               size_t errlen)
{
    if (!json || !out)
        return GANG_EINVAL;
    *out = NULL;
    if (len > GANG_TOK_MAX_FILE_BYTES)
        return gang__tok_fail(err, errlen, "tokenizer.json: %zu bytes, more than the %u allowed",
                              len, GANG_TOK_MAX_FILE_BYTES);
    cJSON *root = cJSON_ParseWithLength(json, len);
    if (!root)
        return gang__tok_fail(err, errlen, "tokenizer.json: not valid JSON");
    gang_tokenizer *t = calloc(1, sizeof(*t));
    int rc = GANG_ENOMEM;
    if (!t)
        goto out_json;
    t->unk_id = -1;
    if (getrandom(&t->seed, sizeof(t->seed), GRND_NONBLOCK) != (ssize_t)sizeof(t->seed))
        t->seed = (uint64_t)time(NULL) ^ (uint64_t)(uintptr_t)t;
    rc = tok_load_root(t, root, err, errlen);
    if (rc == GANG_ENOMEM)
        gang__tok_fail(err, errlen, "tokenizer.json: out of memory");
    if (rc) {
        gang_tokenizer_free(t);
        goto out_json;
    }
    *out = t;
out_json:
    cJSON_Delete(root);
    return rc;
}

int gang_tokenizer_load(const char *path, gang_tokenizer **out, char *err, size_t errlen)
{
    if (!path || !out)
        return GANG_EINVAL;
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) {
        int e = errno;
        gang__tok_fail(err, errlen, "%s: %s", path, strerror(e));
        return e == ENOENT ? GANG_ENOENT : GANG_EIO;
    }
    int rc = GANG_EIO;
    char *buf = NULL;
    if (fseek(f, 0, SEEK_END) != 0)
        goto out_file;
    long size = ftell(f);
    if (size < 0 || fseek(f, 0, SEEK_SET) != 0)
        goto out_file;
    if ((unsigned long)size > GANG_TOK_MAX_FILE_BYTES) {
        rc = gang__tok_fail(err, errlen, "%s: %ld bytes, more than the %u allowed", path, size,
                            GANG_TOK_MAX_FILE_BYTES);
        goto out_file;
    }
    buf = malloc((size_t)size + 1);
    if (!buf) {
        rc = GANG_ENOMEM;
        goto out_file;
    }
    if (fread(buf, 1, (size_t)size, f) != (size_t)size)
        goto out_buf;
    rc = gang_tokenizer_load_buffer(buf, (size_t)size, out, err, errlen);
out_buf:
    free(buf);
out_file:
    if (rc == GANG_EIO)
        gang__tok_fail(err, errlen, "%s: read error", path);
    fclose(f);
    return rc;
}

void gang_tokenizer_free(gang_tokenizer *t)
{
    if (!t)
        return;
    for (uint32_t i = 0; t->text && i < t->n_ids; i++) {
        if (t->dec && t->dec[i] != t->text[i])
            free(t->dec[i]);
        free(t->text[i]);
    }
    free(t->text);
    free(t->text_len);
    free(t->dec);
    free(t->dec_len);
    free(t->special);
    free(t->hslot);
    free(t->mkey);
    free(t->mrank);
    free(t->mnew);
    for (unsigned i = 0; i < t->npt; i++)
        pcre2_code_free(t->pt[i].re);
    free(t->pt);
    for (unsigned i = 0; i < t->nnorm; i++) {
        free(t->norm[i].text);
        pcre2_code_free(t->norm[i].re);
    }
    free(t->norm);
    free(t->dec_byte);
    free(t->added);
    free(t->prefix_ids);
    free(t->suffix_ids);
    free(t);
}

int32_t gang_tokenizer_n_ids(const gang_tokenizer *t)
{
    return t ? (int32_t)t->n_ids : 0;
}

size_t gang_tokenizer_max_token_bytes(const gang_tokenizer *t)
{
    size_t m = 1;
    for (uint32_t i = 0; t != NULL && i < t->n_ids; i++) {
        if (t->text[i] == NULL)
            continue;
        m = t->text_len[i] > m ? t->text_len[i] : m;
        m = t->dec_len[i] > m ? t->dec_len[i] : m;
    }
    return m;
}

int32_t gang_tokenizer_token_id(const gang_tokenizer *t, const char *content)
{
    if (!t || !content)
        return -1;
    for (unsigned i = 0; i < t->nadded; i++)
        if (strcmp(t->added[i].content, content) == 0)
            return t->added[i].id;
    return gang__tok_lookup(t, content, strlen(content));
}

const char *gang_tokenizer_token_text(const gang_tokenizer *t, int32_t id)
{
    if (!t || id < 0 || (uint32_t)id >= t->n_ids)
        return NULL;
    return t->text[id];
}

bool gang_tokenizer_is_special(const gang_tokenizer *t, int32_t id)
{
    return t && id >= 0 && (uint32_t)id < t->n_ids && t->special[id];
}
