/*
 * The tokenizer and the chat template of a GGUF file, from its metadata.
 *
 * The tokenizer is rebuilt as the equivalent Hugging Face tokenizer.json (a cJSON tree,
 * printed and loaded with gang_tokenizer_load_buffer), so that encoding and decoding are
 * the ones tokenizer.json models get:
 *
 *   tokenizer.ggml.model "gpt2"   byte-level BPE: "vocab" from tokenizer.ggml.tokens (the
 *                                 id is the position), "merges" from tokenizer.ggml.merges
 *   tokenizer.ggml.token_type     3 (control): a special added token
 *   tokenizer.ggml.pre            the pre-tokenizer:
 *       "smollm"                  Digits (individual) then ByteLevel with the GPT-2 regex
 *       "gpt-2", "default"        ByteLevel with the GPT-2 regex
 *       "llama-bpe", "llama3"     Split on the Llama 3 regex, then ByteLevel without regex
 *       "qwen2"                   the same with Qwen2's regex (single digits)
 *   tokenizer.ggml.add_bos_token  true: a TemplateProcessing post-processor adds BOS
 *
 *   tokenizer.ggml.model "llama"  SentencePiece (Llama 2, Mistral v0.1, Gemma): a BPE model
 *                                 with byte fallback whose merges come from the scores, and
 *                                 the legacy Llama normalizer and decoder (gguf-vocab-spm.c)
 *
 * Other models ("bert", "t5", ...) and other pre-tokenizers are refused naming them. The chat
 * template is tokenizer.chat_template, with bos_token and eos_token the texts of the tokens
 * tokenizer.ggml.bos_token_id / eos_token_id.
 */
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "ganglion/model.h"
#include "gguf.h"

/* Qwen2's: Llama 3's with single digits. */
#define QWEN2_REGEX                                                                                \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "                          \
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define LLAMA3_REGEX                                                                               \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "                     \
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"

char *gang__gguf_str_dup(gang__gguf_str s)
{
    char *p;

    if (memchr(s.p, '\0', (size_t)s.n) != NULL)
        return NULL;
    p = malloc((size_t)s.n + 1);
    if (p != NULL) {
        memcpy(p, s.p, (size_t)s.n);
        p[s.n] = '\0';
    }
    return p;
}

/* The string metadata key, or an empty string when absent or not a string. */
static gang__gguf_str meta_str(const gang__gguf *g, const char *key)
{
    const gang__gguf_kv *kv = gang__gguf_find_kv(g, key);
    gang__gguf_str none = {"", 0};
    return kv != NULL && kv->type == GANG__GGUF_STRING ? gang__gguf_arr_str(g, kv, 0) : none;
}

static int str_is(gang__gguf_str s, const char *want)
{
    return s.n == strlen(want) && memcmp(s.p, want, s.n) == 0;
}

/* A string array key with at least one element, or NULL. */
static const gang__gguf_kv *meta_strs(const gang__gguf *g, const char *key)
{
    const gang__gguf_kv *kv = gang__gguf_find_kv(g, key);
    return kv != NULL && kv->type == GANG__GGUF_ARRAY && kv->arr_type == GANG__GGUF_STRING &&
                   kv->n > 0
               ? kv
               : NULL;
}

int gang__gguf_json_add(cJSON *obj, const char *name, cJSON *item)
{
    if (item == NULL)
        return GANG_ENOMEM;
    if (!cJSON_AddItemToObject(obj, name, item)) {
        cJSON_Delete(item);
        return GANG_ENOMEM;
    }
    return 0;
}

/* {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": r} */
static cJSON *byte_level(int use_regex)
{
    cJSON *o = cJSON_CreateObject();
    if (o == NULL || gang__gguf_json_add(o, "type", cJSON_CreateString("ByteLevel")) ||
        gang__gguf_json_add(o, "add_prefix_space", cJSON_CreateFalse()) ||
        gang__gguf_json_add(o, "trim_offsets", cJSON_CreateTrue()) ||
        gang__gguf_json_add(o, "use_regex", cJSON_CreateBool(use_regex))) {
        cJSON_Delete(o);
        return NULL;
    }
    return o;
}

/* The pre-tokenizer named by tokenizer.ggml.pre, or NULL (*known 0: an unknown name). */
static cJSON *pre_tokenizer(gang__gguf_str pre, int *known)
{
    cJSON *seq = cJSON_CreateObject(), *list = cJSON_CreateArray(), *first = NULL, *bl;
    int smollm = str_is(pre, "smollm"), l3 = str_is(pre, "llama-bpe") || str_is(pre, "llama3");
    const char *regex = l3 ? LLAMA3_REGEX : str_is(pre, "qwen2") ? QWEN2_REGEX : NULL;

    *known = smollm || regex || str_is(pre, "gpt-2") || str_is(pre, "default") || pre.n == 0;
    if (!*known || seq == NULL || list == NULL)
        goto out_fail;
    if (smollm) {
        first = cJSON_CreateObject();
        if (first == NULL || gang__gguf_json_add(first, "type", cJSON_CreateString("Digits")) ||
            gang__gguf_json_add(first, "individual_digits", cJSON_CreateTrue()))
            goto out_fail;
    } else if (regex != NULL) {
        cJSON *pat = cJSON_CreateObject();
        first = cJSON_CreateObject();
        if (pat == NULL || first == NULL ||
            gang__gguf_json_add(pat, "Regex", cJSON_CreateString(regex))) {
            cJSON_Delete(pat);
            goto out_fail;
        }
        if (gang__gguf_json_add(first, "type", cJSON_CreateString("Split")) ||
            gang__gguf_json_add(first, "pattern", pat) ||
            gang__gguf_json_add(first, "behavior", cJSON_CreateString("Isolated")) ||
            gang__gguf_json_add(first, "invert", cJSON_CreateFalse()))
            goto out_fail;
    }
    if (first != NULL && !cJSON_AddItemToArray(list, first))
        goto out_fail;
    first = NULL;
    bl = byte_level(regex == NULL);
    if (bl == NULL || !cJSON_AddItemToArray(list, bl)) {
        cJSON_Delete(bl);
        goto out_fail;
    }
    if (gang__gguf_json_add(seq, "type", cJSON_CreateString("Sequence")) != 0)
        goto out_fail;
    if (gang__gguf_json_add(seq, "pretokenizers", list) == 0)
        return seq;
    list = NULL; /* add deleted it */
out_fail:
    cJSON_Delete(first);
    cJSON_Delete(list);
    cJSON_Delete(seq);
    return NULL;
}

/* The BPE model: vocab (token -> id) and merges. */
static int bpe_model(const gang__gguf *g, const gang__gguf_kv *toks, cJSON *root, char *err,
                     size_t errlen)
{
    const gang__gguf_kv *merges = meta_strs(g, "tokenizer.ggml.merges");
    cJSON *m = cJSON_CreateObject(), *vocab = cJSON_CreateObject(), *ml = cJSON_CreateArray();
    uint64_t i;
    int rc = GANG_ENOMEM;

    if (m == NULL || vocab == NULL || ml == NULL)
        goto out_fail;
    for (i = 0; i < toks->n; i++) {
        char *t = gang__gguf_str_dup(gang__gguf_arr_str(g, toks, i));
        cJSON *id = cJSON_CreateNumber((double)i);
        if (t == NULL || id == NULL || !cJSON_AddItemToObject(vocab, t, id)) {
            cJSON_Delete(id);
            free(t);
            goto out_fail;
        }
        free(t);
    }
    for (i = 0; merges != NULL && i < merges->n; i++) {
        char *t = gang__gguf_str_dup(gang__gguf_arr_str(g, merges, i));
        cJSON *s = t != NULL ? cJSON_CreateString(t) : NULL;
        free(t);
        if (s == NULL || !cJSON_AddItemToArray(ml, s)) {
            cJSON_Delete(s);
            goto out_fail;
        }
    }
    if (gang__gguf_json_add(m, "type", cJSON_CreateString("BPE")) ||
        gang__gguf_json_add(m, "fuse_unk", cJSON_CreateFalse()) ||
        gang__gguf_json_add(m, "byte_fallback", cJSON_CreateFalse()) ||
        gang__gguf_json_add(m, "ignore_merges", cJSON_CreateFalse()))
        goto out_fail;
    rc = gang__gguf_json_add(m, "vocab", vocab);
    vocab = NULL;
    if (rc == 0)
        rc = gang__gguf_json_add(m, "merges", ml);
    ml = NULL;
    if (rc == 0)
        return gang__gguf_json_add(root, "model", m);
out_fail:
    if (rc == GANG_ENOMEM)
        gang_set_err(err, errlen, "%s: out of memory (or a NUL byte in a token)", g->path);
    cJSON_Delete(vocab);
    cJSON_Delete(ml);
    cJSON_Delete(m);
    return rc;
}

/* Control tokens (token_type 3) as special added tokens. */
static int added_tokens(const gang__gguf *g, const gang__gguf_kv *toks, cJSON *root)
{
    const gang__gguf_kv *types = gang__gguf_find_kv(g, "tokenizer.ggml.token_type");
    cJSON *list = cJSON_CreateArray();
    uint64_t i;

    if (list == NULL || gang__gguf_json_add(root, "added_tokens", list) != 0)
        return GANG_ENOMEM;
    if (types == NULL || types->type != GANG__GGUF_ARRAY || types->n != toks->n)
        return 0;
    for (i = 0; i < toks->n; i++) {
        cJSON *a;
        char *t;
        if (gang__gguf_arr_int(g, types, i) != 3)
            continue;
        t = gang__gguf_str_dup(gang__gguf_arr_str(g, toks, i));
        a = cJSON_CreateObject();
        if (t == NULL || a == NULL || gang__gguf_json_add(a, "id", cJSON_CreateNumber((double)i)) ||
            gang__gguf_json_add(a, "content", cJSON_CreateString(t)) ||
            gang__gguf_json_add(a, "special", cJSON_CreateTrue()) ||
            gang__gguf_json_add(a, "normalized", cJSON_CreateFalse()) ||
            !cJSON_AddItemToArray(list, a)) {
            free(t);
            cJSON_Delete(a);
            return GANG_ENOMEM;
        }
        free(t);
    }
    return 0;
}

/* A TemplateProcessing post-processor that puts token t (id) before the sequence. */
static cJSON *bos_template(const char *t, uint64_t id)
{
    cJSON *name = cJSON_CreateString(t), *o = NULL;
    char *q = name != NULL ? cJSON_PrintUnformatted(name) : NULL; /* t quoted, escaped */
    size_t cap = q != NULL ? 4 * strlen(q) + 256 : 0;
    char *buf = q != NULL ? malloc(cap) : NULL;

    if (buf != NULL) {
        snprintf(buf, cap,
                 "{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":{\"id\":%s}},"
                 "{\"Sequence\":{\"id\":\"A\"}}],\"special_tokens\":{%s:{\"id\":%s,\"ids\":"
                 "[%llu],\"tokens\":[%s]}}}",
                 q, q, q, (unsigned long long)id, q);
        o = cJSON_Parse(buf);
    }
    free(buf);
    free(q);
    cJSON_Delete(name);
    return o;
}

/* Post-processor (TemplateProcessing with BOS when add_bos_token, else ByteLevel, or none
 * for a SentencePiece vocabulary) and the ByteLevel decoder (SentencePiece: its own, from
 * gang__gguf_spm). */
static int post_and_decoder(const gang__gguf *g, const gang__gguf_kv *toks, cJSON *root, int spm)
{
    const gang__gguf_kv *bos = gang__gguf_find_kv(g, "tokenizer.ggml.bos_token_id");
    const gang__gguf_kv *abos = gang__gguf_find_kv(g, "tokenizer.ggml.add_bos_token");
    cJSON *post = NULL;
    int rc = spm ? 0 : gang__gguf_json_add(root, "decoder", byte_level(1));

    if (rc != 0)
        return rc;
    if (abos != NULL && abos->type == GANG__GGUF_BOOL && abos->num.u && bos != NULL &&
        bos->type == GANG__GGUF_U32 && bos->num.u < toks->n) {
        char *t = gang__gguf_str_dup(gang__gguf_arr_str(g, toks, bos->num.u));
        if (t != NULL)
            post = bos_template(t, bos->num.u);
        free(t);
    } else {
        post = spm ? cJSON_CreateNull() : byte_level(1);
    }
    return gang__gguf_json_add(root, "post_processor", post);
}

/* The equivalent tokenizer.json of an open GGUF file as a printed, malloc'd string. */
static int tokenizer_json(const gang__gguf *g, char **out, char *err, size_t errlen)
{
    const gang__gguf_kv *toks = meta_strs(g, "tokenizer.ggml.tokens");
    gang__gguf_str model = meta_str(g, "tokenizer.ggml.model"), pre;
    cJSON *root, *pt = NULL;
    int known, rc, spm = str_is(model, "llama");

    pre = meta_str(g, "tokenizer.ggml.pre");
    if (toks == NULL || !(str_is(model, "gpt2") || spm)) {
        gang_set_err(err, errlen,
                     "%s: tokenizer.ggml.model \"%.*s\" is not supported (only "
                     "\"gpt2\", byte-level BPE, and \"llama\", SentencePiece, with its tokens)",
                     g->path, (int)(model.n > 32 ? 32 : model.n), model.p);
        return GANG_EMODEL;
    }
    if (!spm) {
        pt = pre_tokenizer(pre, &known);
        if (pt == NULL) {
            gang_set_err(err, errlen,
                         known ? "%s: out of memory"
                               : "%s: tokenizer.ggml.pre \"%.*s\" "
                                 "is not supported (smollm, gpt-2, default, llama-bpe, qwen2 are)",
                         g->path, (int)(pre.n > 32 ? 32 : pre.n), pre.p);
            return known ? GANG_ENOMEM : GANG_EMODEL;
        }
    }
    root = cJSON_CreateObject();
    rc = root == NULL ? GANG_ENOMEM : spm ? 0 : gang__gguf_json_add(root, "pre_tokenizer", pt);
    if (root == NULL)
        cJSON_Delete(pt);
    if (rc == 0)
        rc = added_tokens(g, toks, root);
    if (rc == 0)
        rc = post_and_decoder(g, toks, root, spm);
    if (rc == 0)
        rc = spm ? gang__gguf_spm(g, toks, root, err, errlen)
                 : bpe_model(g, toks, root, err, errlen);
    if (rc == 0) {
        *out = cJSON_PrintUnformatted(root);
        rc = *out == NULL ? GANG_ENOMEM : 0;
    }
    cJSON_Delete(root);
    return rc;
}

int gang_gguf_tokenizer_load(const char *path, gang_tokenizer **out, char *err, size_t errlen)
{
    gang__gguf g;
    char *json = NULL;
    int rc;

    if (path == NULL || out == NULL)
        return GANG_EINVAL;
    *out = NULL;
    rc = gang__gguf_open(path, &g, err, errlen);
    if (rc != 0)
        return rc;
    rc = tokenizer_json(&g, &json, err, errlen);
    if (rc == 0)
        rc = gang_tokenizer_load_buffer(json, strlen(json), out, err, errlen);
    free(json);
    gang__gguf_close(&g);
    return rc;
}

/* The text of token id key (bos_token_id, eos_token_id), or NULL. */
static char *token_text(const gang__gguf *g, const char *key)
{
    const gang__gguf_kv *kv = gang__gguf_find_kv(g, key),
                        *toks = meta_strs(g, "tokenizer.ggml.tokens");

    if (kv == NULL || toks == NULL || kv->type != GANG__GGUF_U32 || kv->num.u >= toks->n)
        return NULL;
    return gang__gguf_str_dup(gang__gguf_arr_str(g, toks, kv->num.u));
}

int gang_gguf_chat_template_load(const char *path, gang_chat_template **out, char *err,
                                 size_t errlen)
{
    const gang__gguf_kv *kv;
    gang__gguf g;
    gang__gguf_str src;
    int rc;

    if (path == NULL || out == NULL)
        return GANG_EINVAL;
    *out = NULL;
    rc = gang__gguf_open(path, &g, err, errlen);
    if (rc != 0)
        return rc;
    kv = gang__gguf_find_kv(&g, "tokenizer.chat_template");
    if (kv == NULL || kv->type != GANG__GGUF_STRING) {
        gang_set_err(err, errlen, "%s: no tokenizer.chat_template string", path);
        rc = GANG_ENOENT;
        goto out_close;
    }
    src = gang__gguf_arr_str(&g, kv, 0);
    if (src.n > GANG_CHAT_MAX_TEMPLATE_BYTES) {
        gang_set_err(err, errlen, "%s: tokenizer.chat_template is larger than %u bytes", path,
                     GANG_CHAT_MAX_TEMPLATE_BYTES);
        rc = GANG_EMODEL;
        goto out_close;
    }
    rc = gang_chat_template_parse(src.p, (size_t)src.n, out, err, errlen);
    if (rc == 0) {
        gang_chat_template_set_tokens(*out, token_text(&g, "tokenizer.ggml.bos_token_id"),
                                      token_text(&g, "tokenizer.ggml.eos_token_id"));
    }
out_close:
    gang__gguf_close(&g);
    return rc;
}
