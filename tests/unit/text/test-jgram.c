/*
 * Unit tests of the JSON-schema grammars (text/jgram-*.c): the refusals (each message
 * names the keyword or the limit), what the machine accepts byte by byte for objects
 * with required and optional properties, arrays, enums, numbers, strings, unions and
 * "any JSON", and the token mask: on a tiny tokenizer exactly, and on SmolLM2's
 * tokenizer (when cached) by walks that check every allowed token against the machine
 * and end in text that Python's validator would accept (cJSON parses it here).
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

static gang_jgram *compile_ok(const char *schema)
{
    gang_jgram *g = NULL;
    char err[256] = "";
    int rc = gang_jgram_compile(schema, strlen(schema), &g, err, sizeof(err));
    if (rc != 0)
        fprintf(stderr, "compile: %s\n", err);
    assert_int_equal(rc, 0);
    return g;
}

static void refused(const char *schema, const char *needle)
{
    gang_jgram *g = NULL;
    char err[256] = "";
    int rc = gang_jgram_compile(schema, strlen(schema), &g, err, sizeof(err));
    if (rc != GANG_EINVAL)
        fail_msg("%.80s: %d, not refused", schema, rc);
    assert_null(g);
    if (strstr(err, needle) == NULL)
        fail_msg("refusal of %s says '%s', not '%s'", schema, err, needle);
}

static void test_refusals(void **state)
{
    (void)state;
    refused("{\"type\":\"string\",\"pattern\":\"^a\"}", "'pattern'");
    refused("{\"$ref\":\"#/$defs/x\"}", "'$ref'");
    refused("{\"type\":\"number\",\"minimum\":3}", "'minimum'");
    refused("{\"type\":\"sound\"}", "'sound'");
    refused("{\"type\":", "valid JSON");
    refused("false", "false");
    refused("{\"anyOf\":[{\"type\":\"object\"},{\"type\":\"object\",\"properties\":{}}]}",
            "same character");
    refused("{\"type\":[\"number\",\"integer\"]}", "same character");
    refused("{\"type\":\"object\",\"properties\":{\"a\":{}},\"required\":[\"b\"]}", "'b'");
    refused("{\"type\":\"array\",\"minItems\":3,\"maxItems\":2}", "minItems");
    /* Nesting past the bound, and a schema past the byte bound. */
    char deep[2048] = "";
    for (int i = 0; i < 20; i++)
        strcat(deep, "{\"type\":\"array\",\"items\":");
    strcat(deep, "{}");
    for (int i = 0; i < 20; i++)
        strcat(deep, "}");
    refused(deep, "deeper");
    size_t big = GANG_JGRAM_MAX_SCHEMA_BYTES + 10;
    char *s = malloc(big + 1);
    assert_non_null(s);
    memset(s, ' ', big);
    s[big] = 0;
    s[0] = '{';
    s[big - 1] = '}';
    refused(s, "longer");
    free(s);
    /* Too many nodes: an enum per property of many objects. */
    char many[16384] = "{\"type\":\"object\",\"properties\":{";
    for (int i = 0; i < 64; i++) {
        char one[256];
        snprintf(one, sizeof(one),
                 "%s\"p%d\":{\"type\":\"array\",\"items\":{\"type\":\"array\",\"items\":{\"type\":"
                 "\"array\",\"items\":{\"type\":\"array\",\"items\":{\"type\":\"array\","
                 "\"items\":{\"type\":[\"string\",\"null\"]}}}}}}",
                 i ? "," : "", i);
        strcat(many, one);
    }
    strcat(many, "}}");
    refused(many, "nodes");
}

#define PERSON                                                                                     \
    "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":5},"         \
    "\"age\":{\"type\":\"integer\"},\"tags\":{\"type\":\"array\",\"items\":{\"enum\":[\"a\","      \
    "\"b\"]},\"maxItems\":2},\"ok\":{\"type\":\"boolean\"}},\"required\":[\"name\",\"ok\"],"       \
    "\"additionalProperties\":false}"

static void test_objects(void **state)
{
    (void)state;
    gang_jgram *g = compile_ok(PERSON);
    const char *whole[] = {"{\"name\":\"bob\",\"age\":3,\"tags\":[\"a\",\"b\"],\"ok\":true}",
                           "{\"name\": \"bob\", \"ok\": false}", "{\"name\":\"\",\"ok\":true}",
                           "{\"name\":\"\\u00e9\\n\",\"tags\":[],\"ok\":true}",
                           "{\"name\":\"\xc3\xa9t\xc3\xa9\",\"age\":-12,\"ok\":false}"};
    for (size_t i = 0; i < sizeof(whole) / sizeof(whole[0]); i++)
        assert_int_equal(gang_jgram_check(g, whole[i], strlen(whole[i])), 2);
    const char *prefix[] = {"", "{", "{\"na", "{\"name\":\"x\",\"ok\":tru", "{\"name\":\"x\","};
    for (size_t i = 0; i < sizeof(prefix) / sizeof(prefix[0]); i++)
        assert_int_equal(gang_jgram_check(g, prefix[i], strlen(prefix[i])), 1);
    const char *bad[] = {"{\"name\":\"bob\"}",     /* ok is required */
                         "{\"age\":3}",            /* name first, required */
                         "{\"name\":\"toolong\"}", /* maxLength */
                         "{\"name\":\"x\",\"ok\":true,\"extra\":1}",
                         "{\"name\":\"x\",\"tags\":[\"a\",\"b\",\"a\"],\"ok\":true}",
                         "{\"name\":\"x\",\"age\":1.5,\"ok\":true}",
                         "{\"name\":\"x\",\"age\":01,\"ok\":true}",
                         "{\"ok\":true,\"name\":\"x\"}",  /* order */
                         "{\"name\":\"x\",\"ok\":true} ", /* nothing after the value */
                         "{\n\"name\":\"x\",\"ok\":true}",
                         "{\"name\":\"a\x01\",\"ok\":true}",
                         "{\"name\":\"\xff\",\"ok\":true}"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        if (gang_jgram_check(g, bad[i], strlen(bad[i])) != 0)
            fail_msg("accepted %s", bad[i]);
    gang_jgram_free(g);
}

static void test_values(void **state)
{
    (void)state;
    gang_jgram *g = compile_ok("{\"type\":\"number\"}");
    assert_int_equal(gang_jgram_check(g, "12", 2), 2);
    assert_int_equal(gang_jgram_check(g, "-0.25", 5), 2);
    assert_int_equal(gang_jgram_check(g, "12.", 3), 1);
    assert_int_equal(gang_jgram_check(g, "-", 1), 1);
    assert_int_equal(gang_jgram_check(g, "01", 2), 0);
    assert_int_equal(gang_jgram_check(g, "1234567890123456", 16), 0); /* 16 digits */
    gang_jgram_free(g);

    g = compile_ok("{\"enum\":[1,12,\"x\",null]}");
    assert_int_equal(gang_jgram_check(g, "1", 1), 2);
    assert_int_equal(gang_jgram_check(g, "12", 2), 2);
    assert_int_equal(gang_jgram_check(g, "123", 3), 0);
    assert_int_equal(gang_jgram_check(g, "\"x\"", 3), 2);
    assert_int_equal(gang_jgram_check(g, "nul", 3), 1);
    assert_int_equal(gang_jgram_check(g, "\"y\"", 3), 0);
    gang_jgram_free(g);

    g = compile_ok("{\"anyOf\":[{\"type\":\"string\",\"minLength\":2},{\"type\":\"null\"}]}");
    assert_int_equal(gang_jgram_check(g, "null", 4), 2);
    assert_int_equal(gang_jgram_check(g, "\"ab\"", 4), 2);
    assert_int_equal(gang_jgram_check(g, "\"a\"", 3), 0);
    assert_int_equal(gang_jgram_check(g, "1", 1), 0);
    gang_jgram_free(g);

    /* json_object: any object, nested any values. */
    g = compile_ok("{\"type\":\"object\"}");
    const char *obj = "{\"a\":[1,{\"b\":null},\"c\",[]],\"d\":{},\"e\":-1.5,\"f\":false}";
    assert_int_equal(gang_jgram_check(g, obj, strlen(obj)), 2);
    assert_int_equal(gang_jgram_check(g, "{}", 2), 2);
    assert_int_equal(gang_jgram_check(g, "[1]", 3), 0);
    assert_int_equal(gang_jgram_check(g, "{\"a\"}", 5), 0);
    /* Its objects, arrays and strings are bounded, so a repeating model still closes. */
    char big[512] = "{";
    for (unsigned i = 0; i <= GANG_JGRAM_ANY_MEMBERS; i++) {
        char one[16];
        snprintf(one, sizeof(one), "%s\"k%u\":[]", i ? "," : "", i);
        strcat(big, one);
        if (i + 1 == GANG_JGRAM_ANY_MEMBERS)
            assert_int_equal(gang_jgram_check(g, big, strlen(big)), 1);
    }
    assert_int_equal(gang_jgram_check(g, big, strlen(big)), 0);
    memset(big, 'x', sizeof(big));
    memcpy(big, "{\"a\":\"", 6);
    assert_int_equal(gang_jgram_check(g, big, 6 + GANG_JGRAM_ANY_CHARS), 1);
    assert_int_equal(gang_jgram_check(g, big, 7 + GANG_JGRAM_ANY_CHARS), 0);
    gang_jgram_free(g);

    /* minProperties / maxProperties: exactly one of the listed properties (the form of a
     * forced tool call). */
    g = compile_ok("{\"type\":\"object\",\"properties\":{\"f\":{\"type\":\"object\"},"
                   "\"g\":{\"type\":\"integer\"}},\"minProperties\":1,\"maxProperties\":1}");
    assert_int_equal(gang_jgram_check(g, "{\"f\":{}}", 8), 2);
    assert_int_equal(gang_jgram_check(g, "{\"g\":3}", 7), 2);
    assert_int_equal(gang_jgram_check(g, "{}", 2), 0);
    assert_int_equal(gang_jgram_check(g, "{\"f\":{},", 8), 0);
    gang_jgram_free(g);
    refused("{\"type\":\"object\",\"properties\":{\"a\":{}},\"minProperties\":2}", "minProperties");

    /* Nesting past the machine's frames is refused, not overflowed. */
    g = compile_ok("true");
    char deep[80];
    memset(deep, '[', sizeof(deep));
    assert_int_equal(gang_jgram_check(g, deep, sizeof(deep)), 0);
    assert_int_equal(gang_jgram_check(g, deep, 20), 1);
    gang_jgram_free(g);
}

/* A byte-level tokenizer: ids 0..255 the bytes (GPT-2's alphabet), 256 "ye", 257 "yes",
 * 258 "\"y", 259 "no", 260 "<|e|>" special. */
static gang_tokenizer *tiny(void)
{
    cJSON *root = cJSON_CreateObject(), *model = cJSON_CreateObject();
    cJSON *vocab = cJSON_CreateObject(), *merges = cJSON_CreateArray();
    for (unsigned b = 0; b < 256; b++) {
        unsigned cp =
            b <= 32 ? 256 + b : (b >= 127 && b <= 160 ? 289 + b - 127 : (b == 173 ? 323 : b));
        char c[4] = {0};
        if (cp < 0x80) {
            c[0] = (char)cp;
        } else {
            c[0] = (char)(0xC0 | (cp >> 6));
            c[1] = (char)(0x80 | (cp & 0x3F));
        }
        cJSON_AddNumberToObject(vocab, c, b);
    }
    const char *extra[] = {"ye", "yes", "\"y", "no"};
    const char *mg[] = {"y e", "ye s", "\" y", "n o"};
    for (int i = 0; i < 4; i++) {
        cJSON_AddNumberToObject(vocab, extra[i], 256 + i);
        cJSON_AddItemToArray(merges, cJSON_CreateString(mg[i]));
    }
    cJSON_AddStringToObject(model, "type", "BPE");
    cJSON_AddItemToObject(model, "vocab", vocab);
    cJSON_AddItemToObject(model, "merges", merges);
    cJSON_AddItemToObject(root, "model", model);
    cJSON_AddItemToObject(root, "added_tokens",
                          cJSON_Parse("[{\"id\":260,\"content\":\"<|e|>\",\"special\":true}]"));
    cJSON_AddItemToObject(root, "pre_tokenizer",
                          cJSON_Parse("{\"type\":\"ByteLevel\",\"add_prefix_space\":false}"));
    cJSON_AddItemToObject(root, "decoder", cJSON_Parse("{\"type\":\"ByteLevel\"}"));
    char *s = cJSON_PrintUnformatted(root), err[200] = "";
    gang_tokenizer *t = NULL;
    int rc = gang_tokenizer_load_buffer(s, strlen(s), &t, err, sizeof(err));
    if (rc != 0)
        fprintf(stderr, "tiny tokenizer: %s\n", err);
    free(s);
    cJSON_Delete(root);
    assert_int_equal(rc, 0);
    return t;
}

static void test_mask_tiny(void **state)
{
    (void)state;
    gang_tokenizer *t = tiny();
    gang_jgram_vocab *v = NULL;
    assert_int_equal(gang_jgram_vocab_init(t, &v), 0);
    assert_int_equal(gang_jgram_vocab_n_ids(v), 261);
    gang_jgram *g = compile_ok("{\"enum\":[\"yes\",\"no\"]}");
    uint8_t allowed[261];
    int end = -1;
    assert_int_equal(gang_jgram_mask(g, v, NULL, 0, allowed, 261, &end), 2);
    assert_true(allowed['"'] && allowed[258] && !end);
    int32_t ids[4] = {258}; /* "y */
    assert_int_equal(gang_jgram_mask(g, v, ids, 1, allowed, 261, &end), 1);
    assert_true(allowed['e']);
    ids[0] = '"';
    assert_int_equal(gang_jgram_mask(g, v, ids, 1, allowed, 261, &end), 5); /* y ye yes n no */
    assert_true(allowed['y'] && allowed[256] && allowed[257] && allowed['n'] && allowed[259]);
    assert_true(!allowed['"'] && !allowed[258] && !allowed['x']);
    ids[1] = 257;
    ids[2] = '"';
    assert_int_equal(gang_jgram_mask(g, v, ids, 3, allowed, 261, &end), 0);
    assert_int_equal(end, 1);
    /* A refused history, an id out of range, the special token: GANG_EINVAL. */
    ids[0] = 'x';
    assert_int_equal(gang_jgram_mask(g, v, ids, 1, allowed, 261, &end), GANG_EINVAL);
    ids[0] = 260;
    assert_int_equal(gang_jgram_mask(g, v, ids, 1, allowed, 261, &end), GANG_EINVAL);
    ids[0] = 9999;
    assert_int_equal(gang_jgram_mask(g, v, ids, 1, allowed, 261, &end), GANG_EINVAL);
    gang_jgram_free(g);
    gang_jgram_vocab_free(v);
    gang_tokenizer_free(t);
}

/* Appends token id's text to buf (a fresh decoder per token: byte-level tokens decode
 * alone except split characters, which the walk's schemas keep ASCII). */
static size_t append_token(const gang_tokenizer *t, int32_t id, char *buf, size_t n, size_t cap)
{
    gang_tok_decoder d;
    char piece[4096];
    size_t k = 0, m = 0;
    gang_tok_decoder_init(&d, t, false);
    assert_int_equal(gang_tokenizer_decode_step(&d, id, piece, sizeof(piece), &k), 0);
    assert_int_equal(gang_tokenizer_decode_flush(&d, piece + k, sizeof(piece) - k, &m), 0);
    assert_true(n + k + m < cap);
    memcpy(buf + n, piece, k + m);
    return n + k + m;
}

static const char *const walk_schemas[] = {
    PERSON,
    "{\"type\":\"object\"}",
    "{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"object\",\"properties\":{"
    "\"name\":{\"type\":\"string\",\"maxLength\":12},\"pop\":{\"type\":\"number\"}},"
    "\"required\":[\"name\",\"pop\"]},\"kind\":{\"enum\":[\"big\",\"small\",null]}},"
    "\"required\":[\"city\",\"kind\"]}",
    "{\"type\":\"array\",\"items\":{\"type\":\"integer\"},\"minItems\":1,\"maxItems\":4}",
};

/* Walks of SmolLM2's vocabulary: at each step every allowed token extends a prefix
 * (checked against the machine), a sample of the refused ones does not, and a pseudo-random
 * allowed token is taken; the walk ends at a whole value, which cJSON parses. */
static void test_mask_smollm2(void **state)
{
    (void)state;
    const char *path = "/var/cache/ganglion/smollm2-135m-instruct/tokenizer.json";
    gang_tokenizer *t = NULL;
    char err[256];
    if (gang_tokenizer_load(path, &t, err, sizeof(err)) != 0) {
        fprintf(stderr, "SKIP: SmolLM2's tokenizer is not cached (%s)\n", err);
        skip();
    }
    gang_jgram_vocab *v = NULL;
    assert_int_equal(gang_jgram_vocab_init(t, &v), 0);
    uint32_t n_ids = gang_jgram_vocab_n_ids(v);
    uint8_t *allowed = malloc(n_ids);
    assert_non_null(allowed);
    uint64_t rng = 88172645463325252ull;
    double worst_ms = 0;
    for (size_t si = 0; si < sizeof(walk_schemas) / sizeof(walk_schemas[0]); si++) {
        gang_jgram *g = compile_ok(walk_schemas[si]);
        for (int walk = 0; walk < 3; walk++) {
            int32_t ids[400];
            char text[8192];
            size_t tl = 0;
            uint32_t n = 0;
            int end = 0;
            for (; n < 400; n++) {
                struct timespec a, b;
                clock_gettime(CLOCK_MONOTONIC, &a);
                int cnt = gang_jgram_mask(g, v, ids, n, allowed, n_ids, &end);
                clock_gettime(CLOCK_MONOTONIC, &b);
                double ms =
                    (double)(b.tv_sec - a.tv_sec) * 1e3 + (double)(b.tv_nsec - a.tv_nsec) / 1e6;
                worst_ms = ms > worst_ms ? ms : worst_ms;
                assert_true(cnt >= 0);
                rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
                if (end && (cnt == 0 || rng % 4 == 0))
                    break;
                assert_true(cnt > 0);
                /* Check a strided sample of the verdicts against the machine. */
                for (uint32_t id = (uint32_t)(rng % 97); id < n_ids; id += 97) {
                    size_t l2 = append_token(t, (int32_t)id, text, tl, sizeof(text));
                    if (memmem(text + tl, l2 - tl, "\xEF\xBF\xBD", 3) != NULL)
                        continue; /* a piece of a character: its bytes are not its text */
                    int ok = gang_jgram_check(g, text, l2) > 0 && l2 > tl;
                    if (gang_tokenizer_is_special(t, (int32_t)id))
                        ok = 0;
                    if (ok != allowed[id] && !(ok && l2 - tl > GANG_JGRAM_MAX_TOKEN_BYTES))
                        fail_msg("token %u after '%.*s': mask %d, machine %d", id, (int)tl, text,
                                 allowed[id], ok);
                }
                /* A pseudo-random allowed token that is whole characters. */
                uint32_t pick = (uint32_t)(rng % (uint64_t)cnt), seen = 0, id = 0;
                size_t l2 = tl;
                for (uint32_t k = 0; k < 2 * n_ids; k++) {
                    id = k % n_ids;
                    if (!allowed[id] || seen++ < pick)
                        continue;
                    l2 = append_token(t, (int32_t)id, text, tl, sizeof(text));
                    if (memmem(text + tl, l2 - tl, "\xEF\xBF\xBD", 3) == NULL)
                        break;
                }
                ids[n] = (int32_t)id;
                tl = l2;
            }
            if (!end)
                continue; /* a long random walk: its prefixes were checked anyway */
            assert_int_equal(gang_jgram_check(g, text, tl), 2);
            cJSON *j = cJSON_ParseWithLength(text, tl);
            if (j == NULL)
                fail_msg("schema %zu: '%.*s' does not parse", si, (int)tl, text);
            cJSON_Delete(j);
        }
        gang_jgram_free(g);
    }
    fprintf(stderr, "jgram: slowest mask over %u ids: %.2f ms\n", n_ids, worst_ms);
    free(allowed);
    gang_jgram_vocab_free(v);
    gang_tokenizer_free(t);
}

int gang_test_jgram(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_refusals),     cmocka_unit_test(test_objects),
        cmocka_unit_test(test_values),       cmocka_unit_test(test_mask_tiny),
        cmocka_unit_test(test_mask_smollm2),
    };
    return cmocka_run_group_tests_name("jgram", tests, NULL, NULL);
}
