/*
 * Unit tests of the tokenizer (text/tokenizer.c, tok-*.c) on small tokenizer.json files
 * built here: refusals of what it cannot honour (each message names the component), the
 * byte-level BPE path, added tokens with their flags, the TemplateProcessing BOS, bounds
 * of encode, and the incremental UTF-8 decoder. The comparison with the Python
 * `tokenizers` package on real tokenizers is tests/tokenizer/compare.py.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>
#include <cjson/cJSON.h>

#include "ganglion/text.h"
#include "text-tests.h"

/* GPT-2's byte alphabet, written independently of the code under test. */
static void bl_char(unsigned b, char *out)
{
    unsigned cp = b;
    if (b <= 32)
        cp = 256 + b;
    else if (b >= 127 && b <= 160)
        cp = 256 + 33 + (b - 127);
    else if (b == 173)
        cp = 256 + 67;
    if (cp < 0x80) {
        out[0] = (char)cp;
        out[1] = 0;
    } else {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        out[2] = 0;
    }
}

/* A byte-level BPE tokenizer: ids 0..255 the bytes, 256 "he", 257 "ll", 258 "hell",
 * 259 "hello", 260 "Ġw" (space + w); added tokens 261 "<|s|>" (special), 262 "<t>"
 * (not special, lstrip, rstrip). PRE replaces the pre-tokenizer when not NULL. */
static cJSON *tiny_json(const char *pre)
{
    cJSON *root = cJSON_CreateObject(), *model = cJSON_CreateObject();
    cJSON *vocab = cJSON_CreateObject(), *merges = cJSON_CreateArray();
    for (unsigned b = 0; b < 256; b++) {
        char c[4];
        bl_char(b, c);
        cJSON_AddNumberToObject(vocab, c, b);
    }
    const char *extra[] = {"he", "ll", "hell", "hello", "\xc4\xa0w"};
    const char *mg[] = {"h e", "l l", "he ll", "hell o", "\xc4\xa0 w"};
    for (int i = 0; i < 5; i++) {
        cJSON_AddNumberToObject(vocab, extra[i], 256 + i);
        cJSON_AddItemToArray(merges, cJSON_CreateString(mg[i]));
    }
    cJSON_AddStringToObject(model, "type", "BPE");
    cJSON_AddItemToObject(model, "vocab", vocab);
    cJSON_AddItemToObject(model, "merges", merges);
    cJSON_AddItemToObject(root, "model", model);
    cJSON_AddItemToObject(
        root, "added_tokens",
        cJSON_Parse("[{\"id\":261,\"content\":\"<|s|>\",\"special\":true,\"normalized\":false},"
                    "{\"id\":262,\"content\":\"<t>\",\"special\":false,\"normalized\":true,"
                    "\"lstrip\":true,\"rstrip\":true}]"));
    cJSON_AddItemToObject(root, "normalizer", cJSON_CreateNull());
    cJSON_AddItemToObject(root, "pre_tokenizer",
                          cJSON_Parse(pre ? pre
                                          : "{\"type\":\"ByteLevel\",\"add_prefix_space\":false,"
                                            "\"use_regex\":true}"));
    cJSON_AddItemToObject(
        root, "post_processor",
        cJSON_Parse("{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":{\"id\":"
                    "\"<|s|>\"}},{\"Sequence\":{\"id\":\"A\"}}],\"special_tokens\":{\"<|s|>\":"
                    "{\"id\":\"<|s|>\",\"ids\":[261],\"tokens\":[\"<|s|>\"]}}}"));
    cJSON_AddItemToObject(root, "decoder", cJSON_Parse("{\"type\":\"ByteLevel\"}"));
    return root;
}

static int load_json(cJSON *root, gang_tokenizer **t, char *err, size_t errlen)
{
    char *s = cJSON_PrintUnformatted(root);
    int rc = gang_tokenizer_load_buffer(s, strlen(s), t, err, errlen);
    free(s);
    cJSON_Delete(root);
    return rc;
}

/* The tiny tokenizer with pre-tokenizer PRE (NULL: ByteLevel with the GPT-2 regex). */
static gang_tokenizer *tiny_pre(const char *pre)
{
    gang_tokenizer *t = NULL;
    char err[200] = "";
    int rc = load_json(tiny_json(pre), &t, err, sizeof(err));
    if (rc)
        fprintf(stderr, "tiny: %s\n", err);
    assert_int_equal(rc, 0);
    return t;
}

static gang_tokenizer *tiny(void)
{
    return tiny_pre(NULL);
}

/* Loads the tiny tokenizer with KEY replaced by the JSON VALUE (in the model object when
 * IN_MODEL) and expects a refusal whose message contains NEEDLE. */
static void expect_refusal(const char *key, const char *value, int in_model, const char *needle)
{
    cJSON *root = tiny_json(NULL);
    cJSON *obj = in_model ? cJSON_GetObjectItem(root, "model") : root;
    cJSON_DeleteItemFromObject(obj, key);
    cJSON_AddItemToObject(obj, key, cJSON_Parse(value));
    gang_tokenizer *t = NULL;
    char err[200] = "";
    int rc = load_json(root, &t, err, sizeof(err));
    if (!strstr(err, needle))
        fprintf(stderr, "%s=%s: message '%s' lacks '%s'\n", key, value, err, needle);
    assert_int_equal(rc, GANG_EMODEL);
    assert_null(t);
    assert_non_null(strstr(err, needle));
}

static void test_refusals(void **state)
{
    (void)state;
    expect_refusal("type", "\"WordPiece\"", 1, "WordPiece");
    expect_refusal("type", "\"Unigram\"", 1, "Unigram");
    expect_refusal("dropout", "0.1", 1, "dropout");
    expect_refusal("continuing_subword_prefix", "\"##\"", 1, "continuing_subword_prefix");
    expect_refusal("merges", "[\"h zz\"]", 1, "merges[0]");
    expect_refusal("merges", "[\"h e l\"]", 1, "merges[0]");
    expect_refusal("unk_token", "\"<nope>\"", 1, "unk_token");
    expect_refusal("normalizer", "{\"type\":\"NFKC\"}", 0, "normalizer NFKC");
    expect_refusal("pre_tokenizer", "{\"type\":\"Whitespace\"}", 0, "pre_tokenizer Whitespace");
    expect_refusal("pre_tokenizer", "{\"type\":\"Metaspace\"}", 0, "pre_tokenizer Metaspace");
    expect_refusal("pre_tokenizer",
                   "{\"type\":\"Split\",\"pattern\":{\"Regex\":\"(\"},\"behavior\":\"Isolated\"}",
                   0, "regex");
    expect_refusal("pre_tokenizer",
                   "{\"type\":\"Split\",\"pattern\":{\"Regex\":\"a\"},\"behavior\":\"Odd\"}", 0,
                   "behavior");
    expect_refusal("pre_tokenizer",
                   "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"ByteLevel\"},"
                   "{\"type\":\"Digits\"}]}",
                   0, "ByteLevel before");
    expect_refusal("decoder", "{\"type\":\"WordPiece\"}", 0, "decoder WordPiece");
    expect_refusal("decoder", "null", 0, "decoder");
    expect_refusal("post_processor", "{\"type\":\"BertProcessing\"}", 0, "BertProcessing");
    expect_refusal("truncation", "{\"max_length\":5}", 0, "truncation");
    expect_refusal("normalizer",
                   "{\"type\":\"Sequence\",\"normalizers\":[{\"type\":"
                   "\"Prepend\",\"prepend\":\"_\"},{\"type\":\"NFC\"}]}",
                   0, "normalizer NFC");
    /* <t> is a normalized added token: under a normalizer it would be matched normalized */
    expect_refusal("normalizer", "{\"type\":\"Prepend\",\"prepend\":\"_\"}", 0, "<t>");
    expect_refusal("decoder",
                   "{\"type\":\"Sequence\",\"decoders\":[{\"type\":\"Strip\","
                   "\"content\":\" \",\"start\":1,\"stop\":0}]}",
                   0, "decoder Strip");
    expect_refusal("decoder",
                   "{\"type\":\"Sequence\",\"decoders\":[{\"type\":\"Fuse\"},"
                   "{\"type\":\"Strip\",\"content\":\" \",\"start\":0,\"stop\":1}]}",
                   0, "decoder Strip");
    expect_refusal("decoder",
                   "{\"type\":\"Replace\",\"pattern\":{\"Regex\":\"a\"},"
                   "\"content\":\"b\"}",
                   0, "decoder Replace");
    expect_refusal("decoder", "{\"type\":\"CTC\"}", 0, "decoder CTC");
    expect_refusal("decoder",
                   "{\"type\":\"Sequence\",\"decoders\":[{\"type\":\"Sequence\","
                   "\"decoders\":[]}]}",
                   0, "nested Sequence");
    expect_refusal("added_tokens",
                   "[{\"id\":300,\"content\":\"<x>\",\"single_word\":true,\"special\":true}]", 0,
                   "single_word");
    expect_refusal("added_tokens", "[{\"id\":3,\"content\":\"zz\",\"special\":true}]", 0,
                   "differs");

    gang_tokenizer *t = (gang_tokenizer *)1;
    char err[200] = "";
    assert_int_equal(gang_tokenizer_load_buffer("{\"model\":", 9, &t, err, sizeof(err)),
                     GANG_EMODEL);
    assert_null(t);
    assert_non_null(strstr(err, "JSON"));
    assert_int_equal(
        gang_tokenizer_load_buffer("{}", GANG_TOK_MAX_FILE_BYTES + 1u, &t, err, sizeof(err)),
        GANG_EMODEL);
    assert_non_null(strstr(err, "allowed"));
    assert_int_equal(gang_tokenizer_load_buffer("[1]", 3, &t, err, sizeof(err)), GANG_EMODEL);
    assert_int_equal(gang_tokenizer_load("/nonexistent/tokenizer.json", &t, err, sizeof(err)),
                     GANG_ENOENT);
}

static void encode_is(const gang_tokenizer *t, const char *text, bool special, const int32_t *want,
                      size_t nwant)
{
    int32_t ids[64];
    size_t n = 0;
    assert_int_equal(gang_tokenizer_encode(t, text, strlen(text), special, ids, 64, &n), 0);
    if (n != nwant || memcmp(ids, want, n * sizeof(*ids)) != 0) {
        fprintf(stderr, "encode '%s':", text);
        for (size_t i = 0; i < n; i++)
            fprintf(stderr, " %d", ids[i]);
        fprintf(stderr, "\n");
    }
    assert_int_equal(n, nwant);
    assert_memory_equal(ids, want, n * sizeof(*ids));
}

static void test_encode(void **state)
{
    (void)state;
    gang_tokenizer *t = tiny();
    encode_is(t, "hello", false, (int32_t[]){259}, 1);
    encode_is(t, "hello", true, (int32_t[]){261, 259}, 2);
    encode_is(t, "hello w", false, (int32_t[]){259, 260}, 2);
    /* the regex splits " hello" before the model: Ġ + hello never merge */
    encode_is(t, "he hello", false, (int32_t[]){256, 32, 259}, 3);
    encode_is(t, "", true, (int32_t[]){261}, 1);
    /* added tokens: the special one exactly, <t> eats the spaces around it */
    encode_is(t, "he<|s|>he", false, (int32_t[]){256, 261, 256}, 3);
    encode_is(t, "he  <t>  he", false, (int32_t[]){256, 262, 256}, 3);
    encode_is(t, "<|s|<|s|>>", false, (int32_t[]){'<', '|', 's', '|', 261, '>'}, 6);
    assert_int_equal(gang_tokenizer_n_ids(t), 263);
    assert_int_equal(gang_tokenizer_token_id(t, "<|s|>"), 261);
    assert_int_equal(gang_tokenizer_token_id(t, "hello"), 259);
    assert_int_equal(gang_tokenizer_token_id(t, "nope"), -1);
    assert_true(gang_tokenizer_is_special(t, 261));
    assert_false(gang_tokenizer_is_special(t, 262));
    assert_string_equal(gang_tokenizer_token_text(t, 262), "<t>");

    int32_t ids[2];
    size_t n = 99;
    assert_int_equal(gang_tokenizer_encode(t, "he he he", 8, false, ids, 2, &n), GANG_ERANGE);
    assert_int_equal(n, 5);
    assert_int_equal(gang_tokenizer_encode(t, "\xff", 1, false, ids, 2, &n), GANG_EINVAL);
    assert_int_equal(gang_tokenizer_encode(t, "\xe2\x82", 2, false, ids, 2, &n), GANG_EINVAL);
    assert_int_equal(gang_tokenizer_encode(t, "\xed\xa0\x80", 3, false, ids, 2, &n), GANG_EINVAL);
    gang_tokenizer_free(t);
}

/* Special tokens inside the caller's plain ranges are their text (a chat client's content),
 * outside them the token; non-special added tokens are matched everywhere. */
static void test_encode_plain(void **state)
{
    (void)state;
    gang_tokenizer *t = tiny();
    const char *text = "he<|s|>he<|s|>";
    int32_t ids[64];
    size_t n = 0, at = 0, len = 0;
    gang_tok_range first = {2, 5}, touching = {6, 2};
    const int32_t want[] = {256, '<', '|', 's', '|', '>', 256, 261};
    assert_int_equal(
        gang_tokenizer_encode_plain(t, text, strlen(text), false, &first, 1, ids, 64, &n), 0);
    assert_int_equal(n, 8);
    assert_memory_equal(ids, want, sizeof(want));
    /* a range that only touches the token's last byte makes it text all the same */
    assert_int_equal(
        gang_tokenizer_encode_plain(t, text, strlen(text), false, &touching, 1, ids, 64, &n), 0);
    assert_memory_equal(ids, want, sizeof(want));
    /* without ranges: both are the special id */
    assert_int_equal(
        gang_tokenizer_encode_plain(t, text, strlen(text), false, NULL, 0, ids, 64, &n), 0);
    assert_int_equal(n, 4);
    assert_int_equal(ids[1], 261);
    gang_tok_range all = {0, 5};
    assert_int_equal(gang_tokenizer_encode_plain(t, "a<t>b", 5, false, &all, 1, ids, 64, &n), 0);
    assert_int_equal(n, 3);
    assert_int_equal(ids[1], 262);
    assert_int_equal(gang_tokenizer_encode_plain(t, "a", 1, false, NULL, 1, ids, 64, &n),
                     GANG_EINVAL);

    assert_int_equal(gang_tokenizer_find_special(t, "x<|s|>", 6, &at, &len), 0);
    assert_int_equal(at, 1);
    assert_int_equal(len, 5);
    assert_int_equal(gang_tokenizer_find_special(t, "<t> <|s|", 8, &at, &len), GANG_ENOENT);
    gang_tokenizer_free(t);
}

/* Split behaviours and Digits on the same vocabulary (ids of single bytes are the
 * bytes' ids: '1' is 49 and so on). */
static void test_pretokenizers(void **state)
{
    (void)state;
    gang_tokenizer *t;
    const char *digits = "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Digits\","
                         "\"individual_digits\":true},{\"type\":\"ByteLevel\",\"use_regex\":"
                         "false}]}";
    t = tiny_pre(digits);
    encode_is(t, "he12", false, (int32_t[]){256, '1', '2'}, 3);
    gang_tokenizer_free(t);
    /* Removed: the matched "l" disappears; hello no longer merges */
    const char *removed = "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\","
                          "\"pattern\":{\"String\":\"ll\"},\"behavior\":\"Removed\"},"
                          "{\"type\":\"ByteLevel\",\"use_regex\":false}]}";
    t = tiny_pre(removed);
    encode_is(t, "hello", false, (int32_t[]){256, 'o'}, 2);
    gang_tokenizer_free(t);
    const char *merged = "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\","
                         "\"pattern\":{\"String\":\"o\"},\"behavior\":\"MergedWithPrevious\"},"
                         "{\"type\":\"ByteLevel\",\"use_regex\":false,\"add_prefix_space\":"
                         "true}]}";
    t = tiny_pre(merged);
    /* pieces "hello", "o": each gets a prefix space: Ġhello -> Ġ h.. ; Ġo */
    encode_is(t, "helloo", false, (int32_t[]){32, 259, 32, 'o'}, 4);
    gang_tokenizer_free(t);
    /* every Split behaviour on "hellooxhe lw", split on /l|o/, each piece prefixed by a
     * space (the expected ids are those of the Python tokenizers package) */
    static const struct {
        const char *behavior;
        int32_t ids[20];
        size_t n;
    } cases[] = {
        {"MergedWithNext",
         {32, 256, 32, 108, 32, 108, 32, 111, 32, 111, 120, 256, 32, 32, 108, 119},
         16},
        {"Contiguous", {32, 256, 32, 257, 111, 111, 32, 120, 256, 32, 32, 108, 260}, 13},
        {"MergedWithPrevious",
         {32, 256, 108, 32, 108, 32, 111, 32, 111, 32, 120, 256, 32, 108, 260},
         15},
        {"Isolated",
         {32, 256, 32, 108, 32, 108, 32, 111, 32, 111, 32, 120, 256, 32, 32, 108, 260},
         17},
        {"Removed", {32, 256, 32, 120, 256, 32, 260}, 7},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char pre[400];
        snprintf(pre, sizeof(pre),
                 "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":"
                 "{\"Regex\":\"l|o\"},\"behavior\":\"%s\"},{\"type\":\"ByteLevel\",\"use_regex\":"
                 "false,\"add_prefix_space\":true}]}",
                 cases[i].behavior);
        t = tiny_pre(pre);
        encode_is(t, "hellooxhe lw", false, cases[i].ids, cases[i].n);
        gang_tokenizer_free(t);
    }
}

/* The BPE model's unknown and byte-fallback paths on a character-level vocabulary (no
 * pre-tokenizer); expected ids from the Python tokenizers package, including its order
 * of a pending unknown and byte tokens. */
static void test_unk_byte_fallback(void **state)
{
    (void)state;
    static const struct {
        const char *opts;
        int32_t ids[3][10];
        size_t n[3];
    } cases[] = {
        {",\"unk_token\":\"<unk>\"", {{3, 0, 0, 3}, {7, 3, 0, 0, 1}, {0, 0, 0, 0, 9}}, {4, 5, 5}},
        {",\"unk_token\":\"<unk>\",\"fuse_unk\":true",
         {{3, 0, 3}, {7, 3, 0, 1}, {0, 9}},
         {3, 4, 2}},
        {",\"unk_token\":\"<unk>\",\"byte_fallback\":true",
         {{3, 0, 0, 3}, {7, 3, 6, 10, 11, 6, 10, 11, 1}, {0, 6, 10, 11, 0, 0, 9}},
         {4, 9, 7}},
        {",\"unk_token\":\"<unk>\",\"byte_fallback\":true,\"fuse_unk\":true",
         {{3, 0, 3}, {7, 3, 6, 10, 11, 6, 10, 11, 1}, {6, 10, 11, 0, 9}},
         {3, 9, 5}},
        {",\"unk_token\":null", {{3, 3}, {7, 3, 1}, {9}}, {2, 3, 1}},
    };
    const char *texts[3] = {"abzzab",
                            "\xc3\xa9xab\xe2\x82\xac\xe2\x82\xac"
                            "a",
                            "zz\xe2\x82\xacz\xc3\xa9"};
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char json[1024];
        snprintf(json, sizeof(json),
                 "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"<unk>\":0,"
                 "\"a\":1,\"b\":2,\"ab\":3,\"<0xC3>\":4,\"<0xA9>\":5,\"<0xE2>\":6,\"\xc3\xa9x\":7,"
                 "\"x\":8,\"\xc3\xa9\":9,\"<0x82>\":10,\"<0xAC>\":11},\"merges\":[\"a b\","
                 "\"\xc3\xa9 x\"]%s},\"pre_tokenizer\":null,\"decoder\":{\"type\":"
                 "\"ByteLevel\"}}",
                 cases[i].opts);
        gang_tokenizer *t = NULL;
        char err[200] = "";
        int rc = gang_tokenizer_load_buffer(json, strlen(json), &t, err, sizeof(err));
        if (rc)
            fprintf(stderr, "case %zu: %s\n", i, err);
        assert_int_equal(rc, 0);
        for (int k = 0; k < 3; k++)
            encode_is(t, texts[k], false, cases[i].ids[k], cases[i].n[k]);
        gang_tokenizer_free(t);
    }
}

/* A SentencePiece-style tokenizer: Prepend + Replace normalizer, no pre-tokenizer,
 * byte_fallback, <s> BOS, the Replace / ByteFallback / Fuse / Strip decoder. Ids 0-2
 * <unk> <s> </s>, 3-5 the bytes 0xC3 0xA9 0xFF, 6 "\u2581", 7 "a", 8 "b", 9 "\u2581a",
 * 10 "\u2581ab", 11 "ab". Expected ids are those of the tokenizers package. */
static const char *decode_all(const gang_tokenizer *t, const int32_t *ids, size_t n, bool skip,
                              size_t *first_out);

static const char SPM_JSON[] =
    "{\"model\":{\"type\":\"BPE\",\"unk_token\":\"<unk>\",\"byte_fallback\":true,"
    "\"fuse_unk\":true,\"vocab\":{\"<unk>\":0,\"<s>\":1,\"</s>\":2,\"<0xC3>\":3,\"<0xA9>\":4,"
    "\"<0xFF>\":5,\"\xe2\x96\x81\":6,\"a\":7,\"b\":8,\"\xe2\x96\x81"
    "a\":9,"
    "\"\xe2\x96\x81"
    "ab\":10,\"ab\":11},\"merges\":[\"\xe2\x96\x81 a\",\"\xe2\x96\x81"
    "a b\","
    "\"a b\"]},\"added_tokens\":[{\"id\":0,\"content\":\"<unk>\",\"special\":true},{\"id\":1,"
    "\"content\":\"<s>\",\"special\":true},{\"id\":2,\"content\":\"</s>\",\"special\":true}],"
    "\"normalizer\":{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"Prepend\",\"prepend\":"
    "\"\xe2\x96\x81\"},{\"type\":\"Replace\",\"pattern\":{\"String\":\" \"},\"content\":"
    "\"\xe2\x96\x81\"}]},\"pre_tokenizer\":null,\"post_processor\":{\"type\":"
    "\"TemplateProcessing\",\"single\":[{\"SpecialToken\":{\"id\":\"<s>\"}},{\"Sequence\":"
    "{\"id\":\"A\"}}],\"special_tokens\":{\"<s>\":{\"ids\":[1]}}},\"decoder\":{\"type\":"
    "\"Sequence\",\"decoders\":[{\"type\":\"Replace\",\"pattern\":{\"String\":\"\xe2\x96\x81\"},"
    "\"content\":\" \"},{\"type\":\"ByteFallback\"},{\"type\":\"Fuse\"},{\"type\":\"Strip\","
    "\"content\":\" \",\"start\":1,\"stop\":0}]}}";

static void test_sentencepiece(void **state)
{
    (void)state;
    gang_tokenizer *t = NULL;
    char err[200] = "";
    int rc = gang_tokenizer_load_buffer(SPM_JSON, strlen(SPM_JSON), &t, err, sizeof(err));
    if (rc)
        fprintf(stderr, "spm: %s\n", err);
    assert_int_equal(rc, 0);
    encode_is(t, "ab ab", true, (int32_t[]){1, 10, 10}, 3);
    encode_is(t, "ab<s>ab", false, (int32_t[]){10, 1, 10}, 3);
    encode_is(t, "\xc3\xa9z b", false, (int32_t[]){6, 3, 4, 0, 6, 8}, 6);
    /* decode: the leading space goes, a byte run is held until it ends, an invalid run
     * becomes one U+FFFD per byte */
    assert_string_equal(decode_all(t, (int32_t[]){1, 10, 10}, 3, true, NULL), "ab ab");
    assert_string_equal(decode_all(t, (int32_t[]){1, 10, 10}, 3, false, NULL), "<s> ab ab");
    size_t first = 99;
    assert_string_equal(decode_all(t, (int32_t[]){3, 4, 7}, 3, false, &first), "\xc3\xa9"
                                                                               "a");
    assert_int_equal(first, 0);
    assert_string_equal(decode_all(t, (int32_t[]){3, 7, 5, 3, 4}, 5, false, NULL),
                        "\xef\xbf\xbd"
                        "a\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd");
    assert_string_equal(decode_all(t, (int32_t[]){6, 6, 7}, 3, false, NULL), " a");
    gang_tokenizer_free(t);

    /* A lone ByteFallback decoder (no Sequence) turns <0xXX> tokens into their bytes too. */
    static const char seq_dec[] =
        "\"decoder\":{\"type\":\"Sequence\",\"decoders\":[{\"type\":\"Replace\"";
    const char *cut = strstr(SPM_JSON, seq_dec);
    assert_non_null(cut);
    char lone[sizeof(SPM_JSON) + 64];
    snprintf(lone, sizeof(lone), "%.*s\"decoder\":{\"type\":\"ByteFallback\"}}",
             (int)(cut - SPM_JSON), SPM_JSON);
    t = NULL;
    rc = gang_tokenizer_load_buffer(lone, strlen(lone), &t, err, sizeof(err));
    if (rc)
        fprintf(stderr, "spm lone ByteFallback: %s\n", err);
    assert_int_equal(rc, 0);
    assert_string_equal(decode_all(t, (int32_t[]){3, 4, 7}, 3, false, NULL), "\xc3\xa9"
                                                                             "a");
    gang_tokenizer_free(t);

    /* Metaspace as the decoder (Llama / Mistral tokenizers from newer transformers): the
     * replacement becomes a space and the first token loses its leading one. */
    snprintf(lone, sizeof(lone),
             "%.*s\"decoder\":{\"type\":\"Metaspace\",\"replacement\":\"\xe2\x96\x81\","
             "\"prepend_scheme\":\"always\",\"split\":true}}",
             (int)(cut - SPM_JSON), SPM_JSON);
    t = NULL;
    rc = gang_tokenizer_load_buffer(lone, strlen(lone), &t, err, sizeof(err));
    if (rc)
        fprintf(stderr, "spm Metaspace: %s\n", err);
    assert_int_equal(rc, 0);
    assert_string_equal(decode_all(t, (int32_t[]){1, 10, 10}, 3, true, NULL), "ab ab");
    assert_string_equal(decode_all(t, (int32_t[]){6, 6, 7}, 3, false, NULL), " a");
    gang_tokenizer_free(t);
}

/* Feeds ids one at a time and returns the concatenated text (static buffer). */
static const char *decode_all(const gang_tokenizer *t, const int32_t *ids, size_t n, bool skip,
                              size_t *first_out)
{
    static char buf[4096];
    gang_tok_decoder d;
    gang_tok_decoder_init(&d, t, skip);
    size_t len = 0, k;
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(gang_tokenizer_decode_step(&d, ids[i], buf + len, sizeof(buf) - len, &k),
                         0);
        if (i == 0 && first_out)
            *first_out = k;
        len += k;
    }
    assert_int_equal(gang_tokenizer_decode_flush(&d, buf + len, sizeof(buf) - len, &k), 0);
    len += k;
    buf[len] = 0;
    return buf;
}

static void test_decoder(void **state)
{
    (void)state;
    gang_tokenizer *t = tiny();
    /* an emoji encodes to its four byte tokens; nothing comes out until the last */
    int32_t ids[16];
    size_t n;
    const char *text = "a\xf0\x9f\x98\x80"
                       "b";
    assert_int_equal(gang_tokenizer_encode(t, text, strlen(text), false, ids, 16, &n), 0);
    assert_int_equal(n, 6);
    gang_tok_decoder d;
    gang_tok_decoder_init(&d, t, false);
    char out[1024];
    size_t k, total = 0;
    size_t lens[6];
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(gang_tokenizer_decode_step(&d, ids[i], out + total, 1024 - total, &k), 0);
        lens[i] = k;
        total += k;
    }
    assert_int_equal(lens[0], 1);
    assert_int_equal(lens[1] + lens[2] + lens[3], 0);
    assert_int_equal(lens[4], 4);
    assert_int_equal(lens[5], 1);
    assert_memory_equal(out, text, total);
    /* specials: kept or skipped */
    assert_string_equal(decode_all(t, (int32_t[]){261, 259, 262}, 3, false, NULL), "<|s|>hello<t>");
    assert_string_equal(decode_all(t, (int32_t[]){261, 259, 262}, 3, true, NULL), "hello<t>");
    /* invalid sequences: a lead byte cut by ASCII, a stray continuation, a truncated tail */
    assert_string_equal(decode_all(t, (int32_t[]){0xF0, 'a'}, 2, false, NULL), "\xef\xbf\xbd"
                                                                               "a");
    assert_string_equal(decode_all(t, (int32_t[]){0x80, 0xC0, 'x'}, 3, false, NULL),
                        "\xef\xbf\xbd\xef\xbf\xbd"
                        "x");
    assert_string_equal(decode_all(t, (int32_t[]){'x', 0xE2, 0x82}, 3, false, NULL),
                        "x\xef\xbf\xbd");
    assert_string_equal(decode_all(t, (int32_t[]){0xED, 0xA0, 0x80}, 3, false, NULL),
                        "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd");
    assert_int_equal(gang_tokenizer_decode_step(&d, 263, out, 1024, &k), GANG_EINVAL);
    assert_int_equal(gang_tokenizer_decode_step(&d, -1, out, 1024, &k), GANG_EINVAL);
    assert_int_equal(gang_tokenizer_decode_step(&d, 259, out, 2, &k), GANG_ERANGE);

    /*
     * The decoder transformers writes when it converts a GGUF of a byte-level model
     * (issue #27): Sequence[ByteFallback, Fuse, Replace("\u2581" -> " "), ByteLevel]. It
     * must decode like the plain ByteLevel decoder, multi-byte characters split over
     * tokens included.
     */
    cJSON *root = tiny_json(NULL);
    cJSON_DeleteItemFromObject(root, "decoder");
    cJSON_AddItemToObject(
        root, "decoder",
        cJSON_Parse("{\"type\":\"Sequence\",\"decoders\":[{\"type\":\"ByteFallback\"},"
                    "{\"type\":\"Fuse\"},{\"type\":\"Replace\",\"pattern\":{\"String\":"
                    "\"\xe2\x96\x81\"},\"content\":\" \"},{\"type\":\"ByteLevel\","
                    "\"add_prefix_space\":true,\"trim_offsets\":true,\"use_regex\":true}]}"));
    gang_tokenizer *g = NULL;
    char err[200] = "";
    int rc = load_json(root, &g, err, sizeof(err));
    if (rc)
        fprintf(stderr, "gguf-converted decoder: %s\n", err);
    assert_int_equal(rc, 0);
    const char *texts[] = {"hello he",
                           "a\xf0\x9f\x98\x80"
                           "b \xc3\xa9t\xc3\xa9",
                           "  <t> \xe4\xb8\xad"};
    for (size_t i = 0; i < sizeof(texts) / sizeof(texts[0]); i++) {
        int32_t tid[64];
        size_t tn;
        char want[256];

        assert_int_equal(gang_tokenizer_encode(t, texts[i], strlen(texts[i]), false, tid, 64, &tn),
                         0);
        snprintf(want, sizeof(want), "%s", decode_all(t, tid, tn, false, NULL));
        assert_string_equal(decode_all(g, tid, tn, false, NULL), want);
    }
    assert_string_equal(decode_all(g, (int32_t[]){0xF0, 'a'}, 2, false, NULL), "\xef\xbf\xbd"
                                                                               "a");
    gang_tokenizer_free(g);
    gang_tokenizer_free(t);
}

/* Long words and long whitespace runs stay fast: 4 MiB each, well under a second each on
 * the O(n log n) merge loop (a quadratic one would take minutes). */
static void test_long_inputs(void **state)
{
    (void)state;
    gang_tokenizer *t = tiny();
    size_t len = 4u << 20;
    char *s = malloc(len);
    int32_t *ids = malloc(len * sizeof(*ids));
    assert_non_null(s);
    assert_non_null(ids);
    const char fills[] = {'l', ' ', 'h', '\n'};
    for (int f = 0; f < 4; f++) {
        for (size_t i = 0; i < len; i++)
            s[i] = f == 2 ? "hel"[i % 3] : fills[f];
        size_t n;
        clock_t c0 = clock();
        assert_int_equal(gang_tokenizer_encode(t, s, len, false, ids, len, &n), 0);
        double sec = (double)(clock() - c0) / CLOCKS_PER_SEC;
        assert_true(n > 0 && n <= len);
        assert_true(sec < 20.0);
    }
    free(s);
    free(ids);
    gang_tokenizer_free(t);
}

int gang_test_tokenizer(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_refusals),          cmocka_unit_test(test_encode),
        cmocka_unit_test(test_encode_plain),      cmocka_unit_test(test_pretokenizers),
        cmocka_unit_test(test_unk_byte_fallback), cmocka_unit_test(test_decoder),
        cmocka_unit_test(test_sentencepiece),     cmocka_unit_test(test_long_inputs),
    };
    return cmocka_run_group_tests_name("tokenizer", tests, NULL, NULL);
}
