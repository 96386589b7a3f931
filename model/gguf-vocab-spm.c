/*
 * A GGUF file's SentencePiece vocabulary (tokenizer.ggml.model "llama": Llama 2, Mistral
 * v0.1, Gemma and their fine-tunes) as a Hugging Face tokenizer.json BPE model, the way
 * transformers' GGUF loader converts one (GGUFLlamaConverter over its tokens and scores):
 *
 *   vocab      token -> id (tokenizer.ggml.tokens, the id is the position)
 *   merges     for every token t and every split of t at a character boundary into two
 *              tokens l + r, the merge (l, r); ordered by t's score (descending), then by
 *              t's id, then by l's and r's scores (descending), then by the split point:
 *              BPE then merges first the pair whose result SentencePiece scores highest
 *   model      byte_fallback (<0xNN> pieces), fuse_unk, unk_token tokenizer.ggml.unknown_token_id
 *   normalizer Prepend("▁") when tokenizer.ggml.add_space_prefix (true when absent), then
 *              Replace(" ", "▁")
 *   decoder    Replace("▁", " "), ByteFallback, Fuse, and Strip(1 leading space) with the
 *              prefix
 *
 * The control tokens (token_type 3) become special added tokens and the BOS
 * post-processor follows tokenizer.ggml.add_bos_token (model/gguf-vocab.c does both).
 * Bounded: pieces of at most SPM_MAX_PIECE bytes, at most GANG_TOK_MAX_MERGES merges
 * (refused beyond), scores a float array as long as the tokens.
 */
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "ganglion/model.h"
#include "gguf.h"

/* An open-addressing table of the tokens' texts -> ids (the texts stay in the header). */
typedef struct spm_map {
    const gang__gguf *g;
    const gang__gguf_kv *toks;
    uint32_t *slot; /* id + 1, 0: empty */
    uint64_t mask;
} spm_map;

#define SPM_FNV_BASIS 1469598103934665603ull
#define SPM_FNV_PRIME 1099511628211ull
/* Pieces longer than this (bytes) are refused: real vocabularies stay far below (Gemma 3's
 * longest is 48), and it bounds the merge search at 256^2 / 2 byte steps a token. */
#define SPM_MAX_PIECE 256u

/* FNV-1a of s[0..n) continued from h (SPM_FNV_BASIS to start). */
static uint64_t spm_hash_more(uint64_t h, const char *s, uint64_t n)
{
    for (uint64_t i = 0; i < n; i++)
        h = (h ^ (uint8_t)s[i]) * SPM_FNV_PRIME;
    return h;
}

static uint64_t spm_hash(const char *s, uint64_t n)
{
    return spm_hash_more(SPM_FNV_BASIS, s, n);
}

/* The id of text s[0..n) whose hash is h, or -1. */
static int64_t spm_find_h(const spm_map *m, uint64_t h, const char *s, uint64_t n)
{
    for (uint64_t i = h & m->mask;; i = (i + 1) & m->mask) {
        uint32_t v = m->slot[i];
        gang__gguf_str t;
        if (v == 0)
            return -1;
        t = gang__gguf_arr_str(m->g, m->toks, v - 1);
        if (t.n == n && memcmp(t.p, s, n) == 0)
            return (int64_t)v - 1;
    }
}

/* The id of text s[0..n), or -1. */
static int64_t spm_find(const spm_map *m, const char *s, uint64_t n)
{
    return spm_find_h(m, spm_hash(s, n), s, n);
}

/* Builds the map; a repeated text keeps its last id (as a Python dict would). */
static int spm_map_init(spm_map *m, const gang__gguf *g, const gang__gguf_kv *toks)
{
    uint64_t cap = 2;

    while (cap < 2 * toks->n)
        cap <<= 1;
    m->g = g;
    m->toks = toks;
    m->mask = cap - 1;
    m->slot = calloc(cap, sizeof(*m->slot));
    if (m->slot == NULL)
        return GANG_ENOMEM;
    for (uint64_t id = 0; id < toks->n; id++) {
        gang__gguf_str t = gang__gguf_arr_str(g, toks, id);
        uint64_t i = spm_hash(t.p, t.n) & m->mask;
        for (;; i = (i + 1) & m->mask) {
            gang__gguf_str o;
            if (m->slot[i] == 0)
                break;
            o = gang__gguf_arr_str(g, toks, m->slot[i] - 1);
            if (o.n == t.n && memcmp(o.p, t.p, t.n) == 0)
                break;
        }
        m->slot[i] = (uint32_t)id + 1;
    }
    return 0;
}

typedef struct spm_merge {
    float score, score_l, score_r; /* of the merged token, of the left and right parts */
    uint32_t id, left, right, split;
} spm_merge;

/* The order of the merges (see the top of the file). */
static int spm_cmp(const void *pa, const void *pb)
{
    const spm_merge *a = pa, *b = pb;

    if (a->score != b->score)
        return a->score > b->score ? -1 : 1;
    if (a->id != b->id)
        return a->id < b->id ? -1 : 1;
    if (a->score_l != b->score_l)
        return a->score_l > b->score_l ? -1 : 1;
    if (a->score_r != b->score_r)
        return a->score_r > b->score_r ? -1 : 1;
    return a->split < b->split ? -1 : a->split > b->split;
}

/* Every merge of the vocabulary into *out (*n of them, malloc'd). */
static int spm_merges(const spm_map *m, const gang__gguf_kv *scores, spm_merge **out, size_t *n,
                      const char *path, char *err, size_t errlen)
{
    size_t cap = 1024, len = 0;
    spm_merge *v = malloc(cap * sizeof(*v));

    if (v == NULL)
        return GANG_ENOMEM;
    for (uint64_t id = 0; id < m->toks->n; id++) {
        gang__gguf_str t = gang__gguf_arr_str(m->g, m->toks, id);
        uint64_t h = SPM_FNV_BASIS; /* of t.p[0..k) */
        if (t.n > SPM_MAX_PIECE) {
            free(v);
            gang_set_err(err, errlen, "%s: token %llu is %llu bytes, more than the %u allowed",
                         path, (unsigned long long)id, (unsigned long long)t.n, SPM_MAX_PIECE);
            return GANG_EMODEL;
        }
        for (uint64_t k = 1; k < t.n; k++) {
            int64_t l, r;
            h = spm_hash_more(h, t.p + k - 1, 1);
            if (((uint8_t)t.p[k] & 0xC0) == 0x80) /* inside a UTF-8 character */
                continue;
            l = spm_find_h(m, h, t.p, k);
            r = l < 0 ? -1 : spm_find(m, t.p + k, t.n - k);
            if (r < 0)
                continue;
            if (len == cap) {
                spm_merge *nv;
                if (cap >= GANG_TOK_MAX_MERGES) {
                    free(v);
                    gang_set_err(err, errlen, "%s: the vocabulary makes more than %u merges", path,
                                 GANG_TOK_MAX_MERGES);
                    return GANG_EMODEL;
                }
                nv = realloc(v, 2 * cap * sizeof(*v));
                if (nv == NULL) {
                    free(v);
                    return GANG_ENOMEM;
                }
                v = nv, cap *= 2;
            }
            v[len].score = (float)gang__gguf_arr_float(m->g, scores, id);
            v[len].score_l = (float)gang__gguf_arr_float(m->g, scores, (uint64_t)l);
            v[len].score_r = (float)gang__gguf_arr_float(m->g, scores, (uint64_t)r);
            v[len].id = (uint32_t)id;
            v[len].left = (uint32_t)l;
            v[len].right = (uint32_t)r;
            v[len].split = (uint32_t)k;
            len++;
        }
    }
    if (len > GANG_TOK_MAX_MERGES) {
        free(v);
        gang_set_err(err, errlen, "%s: the vocabulary makes more than %u merges", path,
                     GANG_TOK_MAX_MERGES);
        return GANG_EMODEL;
    }
    qsort(v, len, sizeof(*v), spm_cmp);
    *out = v;
    *n = len;
    return 0;
}

/* The model object: vocab, merges (["l", "r"] pairs: a piece may hold a space), flags. */
static cJSON *spm_model(const spm_map *m, const spm_merge *mg, size_t n, int64_t unk)
{
    cJSON *o = cJSON_CreateObject(), *vocab = cJSON_CreateObject(), *ml = cJSON_CreateArray();
    int ok = o != NULL && vocab != NULL && ml != NULL;

    for (uint64_t id = 0; ok && id < m->toks->n; id++) {
        char *t = gang__gguf_str_dup(gang__gguf_arr_str(m->g, m->toks, id));
        cJSON *num = cJSON_CreateNumber((double)id);
        ok = t != NULL && num != NULL && cJSON_AddItemToObject(vocab, t, num);
        if (!ok)
            cJSON_Delete(num);
        free(t);
    }
    for (size_t i = 0; ok && i < n; i++) {
        char *l = gang__gguf_str_dup(gang__gguf_arr_str(m->g, m->toks, mg[i].left));
        char *r = gang__gguf_str_dup(gang__gguf_arr_str(m->g, m->toks, mg[i].right));
        cJSON *pair = l != NULL && r != NULL ? cJSON_CreateArray() : NULL;
        ok = pair != NULL && cJSON_AddItemToArray(pair, cJSON_CreateString(l)) &&
             cJSON_AddItemToArray(pair, cJSON_CreateString(r)) && cJSON_GetArraySize(pair) == 2 &&
             cJSON_AddItemToArray(ml, pair);
        if (!ok)
            cJSON_Delete(pair);
        free(l), free(r);
    }
    if (ok && unk >= 0) {
        char *u = gang__gguf_str_dup(gang__gguf_arr_str(m->g, m->toks, (uint64_t)unk));
        ok = u != NULL && gang__gguf_json_add(o, "unk_token", cJSON_CreateString(u)) == 0;
        free(u);
    }
    if (ok)
        ok = gang__gguf_json_add(o, "type", cJSON_CreateString("BPE")) == 0 &&
             gang__gguf_json_add(o, "fuse_unk", cJSON_CreateTrue()) == 0 &&
             gang__gguf_json_add(o, "byte_fallback", cJSON_CreateTrue()) == 0 &&
             gang__gguf_json_add(o, "ignore_merges", cJSON_CreateFalse()) == 0;
    if (ok) {
        ok = gang__gguf_json_add(o, "vocab", vocab) == 0;
        vocab = NULL;
    }
    if (ok) {
        ok = gang__gguf_json_add(o, "merges", ml) == 0;
        ml = NULL;
    }
    cJSON_Delete(vocab);
    cJSON_Delete(ml);
    if (!ok) {
        cJSON_Delete(o);
        return NULL;
    }
    return o;
}

/* The legacy Llama normalizer and decoder, with or without the "▁" prefix. */
static int spm_text_steps(cJSON *root, int prefix)
{
    static const char *const norm[2] = {
        "{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"Replace\",\"pattern\":{\"String\":"
        "\" \"},\"content\":\"\\u2581\"}]}",
        "{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"Prepend\",\"prepend\":\"\\u2581\"},"
        "{\"type\":\"Replace\",\"pattern\":{\"String\":\" \"},\"content\":\"\\u2581\"}]}"};
    static const char *const dec[2] = {
        "{\"type\":\"Sequence\",\"decoders\":[{\"type\":\"Replace\",\"pattern\":{\"String\":"
        "\"\\u2581\"},\"content\":\" \"},{\"type\":\"ByteFallback\"},{\"type\":\"Fuse\"}]}",
        "{\"type\":\"Sequence\",\"decoders\":[{\"type\":\"Replace\",\"pattern\":{\"String\":"
        "\"\\u2581\"},\"content\":\" \"},{\"type\":\"ByteFallback\"},{\"type\":\"Fuse\"},"
        "{\"type\":\"Strip\",\"content\":\" \",\"start\":1,\"stop\":0}]}"};
    int rc = gang__gguf_json_add(root, "normalizer", cJSON_Parse(norm[prefix]));

    if (rc == 0)
        rc = gang__gguf_json_add(root, "decoder", cJSON_Parse(dec[prefix]));
    if (rc == 0)
        rc = gang__gguf_json_add(root, "pre_tokenizer", cJSON_CreateNull());
    return rc;
}

int gang__gguf_spm(const gang__gguf *g, const gang__gguf_kv *toks, cJSON *root, char *err,
                   size_t errlen)
{
    const gang__gguf_kv *scores = gang__gguf_find_kv(g, "tokenizer.ggml.scores");
    const gang__gguf_kv *unk = gang__gguf_find_kv(g, "tokenizer.ggml.unknown_token_id");
    const gang__gguf_kv *prefix = gang__gguf_find_kv(g, "tokenizer.ggml.add_space_prefix");
    spm_merge *mg = NULL;
    spm_map m = {0};
    cJSON *model;
    size_t n = 0;
    int rc;

    if (scores == NULL || scores->type != GANG__GGUF_ARRAY || scores->arr_type != GANG__GGUF_F32 ||
        scores->n != toks->n) {
        gang_set_err(err, errlen,
                     "%s: tokenizer.ggml.scores is not a float array as long as the tokens "
                     "(a SentencePiece vocabulary needs them)",
                     g->path);
        return GANG_EMODEL;
    }
    rc = spm_map_init(&m, g, toks);
    if (rc == 0)
        rc = spm_merges(&m, scores, &mg, &n, g->path, err, errlen);
    if (rc != 0)
        goto out;
    model = spm_model(&m, mg, n,
                      unk != NULL && unk->type == GANG__GGUF_U32 && unk->num.u < toks->n
                          ? (int64_t)unk->num.u
                          : -1);
    rc = gang__gguf_json_add(root, "model", model);
    if (rc == 0)
        rc = spm_text_steps(
            root, !(prefix != NULL && prefix->type == GANG__GGUF_BOOL && prefix->num.u == 0));
out:
    if (rc == GANG_ENOMEM)
        gang_set_err(err, errlen, "%s: out of memory (or a NUL byte in a token)", g->path);
    free(mg);
    free(m.slot);
    return rc;
}
