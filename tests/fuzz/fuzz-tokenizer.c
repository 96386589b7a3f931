/*
 * libFuzzer target of the tokenizer (text/tokenizer.c, tok-*.c). An input that starts
 * with '{' is a tokenizer.json: it must load or be refused cleanly, and a loaded one must
 * encode and decode a fixed text. Any other input is text for a fixed byte-level
 * tokenizer (Digits, a Split regex, ByteLevel, added tokens): valid UTF-8 must encode,
 * and decoding its ids one at a time must give the text back byte for byte (byte-level
 * BPE is lossless); invalid UTF-8 must be refused.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ganglion/text.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char *const FIXED =
    "{\"model\":{\"type\":\"BPE\",\"byte_fallback\":false,\"vocab\":{VOCAB},"
    "\"merges\":[\"a b\",\"ab c\",\"\\u0120 a\",\"1 2\"]},"
    "\"added_tokens\":[{\"id\":300,\"content\":\"<|s|>\",\"special\":true},"
    "{\"id\":301,\"content\":\"<n>\",\"special\":false,\"normalized\":true}],"
    "\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":["
    "{\"type\":\"Split\",\"pattern\":{\"Regex\":\"\\\\p{N}{1,3}| "
    "?\\\\p{L}+|\\\\s+(?!\\\\S)|\\\\s+\"},"
    "\"behavior\":\"Isolated\"},{\"type\":\"Digits\",\"individual_digits\":false},"
    "{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":true}]},"
    "\"post_processor\":null,\"decoder\":{\"type\":\"ByteLevel\"}}";

/* GPT-2's byte alphabet as a JSON vocabulary of ids 0..255 plus the merged tokens. */
static gang_tokenizer *fixed_tokenizer(void)
{
    static char vocab[8192], json[16384];
    size_t k = 0;
    for (unsigned b = 0; b < 256; b++) {
        unsigned cp = b <= 32                  ? 256 + b
                      : (b >= 127 && b <= 160) ? 256 + 33 + (b - 127)
                      : b == 173               ? 256 + 67
                                               : b;
        k +=
            (size_t)snprintf(vocab + k, sizeof(vocab) - k, "%s\"\\u%04x\":%u", b ? "," : "", cp, b);
    }
    snprintf(vocab + k, sizeof(vocab) - k, ",\"ab\":256,\"abc\":257,\"\\u0120a\":258,\"12\":259");
    const char *at = strstr(FIXED, "VOCAB");
    snprintf(json, sizeof(json), "%.*s%s%s", (int)(at - FIXED), FIXED, vocab, at + 5);
    gang_tokenizer *t = NULL;
    char err[256];
    if (gang_tokenizer_load_buffer(json, strlen(json), &t, err, sizeof(err)) != 0) {
        fprintf(stderr, "fixed tokenizer: %s\n", err);
        abort();
    }
    return t;
}

/* Decodes ids one at a time into a fresh buffer of *len bytes. */
static char *decode(const gang_tokenizer *t, const int32_t *ids, size_t n, size_t *len)
{
    size_t cap = GANG_TOK_DECODE_SLACK + 1, k;
    for (size_t i = 0; i < n; i++) { /* a template may name an id without a token */
        const char *txt = gang_tokenizer_token_text(t, ids[i]);
        cap += 3 * (txt ? strlen(txt) : 0) + 3;
    }
    char *out = malloc(cap);
    gang_tok_decoder d;
    gang_tok_decoder_init(&d, t, false);
    *len = 0;
    for (size_t i = 0; i < n; i++) {
        if (gang_tokenizer_decode_step(&d, ids[i], out + *len, cap - *len, &k) != 0)
            abort();
        *len += k;
    }
    if (gang_tokenizer_decode_flush(&d, out + *len, cap - *len, &k) != 0)
        abort();
    *len += k;
    return out;
}

static void encode_roundtrip(const gang_tokenizer *t, const char *s, size_t len, bool exact)
{
    size_t n = 0, cap = len + 8, dlen;
    int32_t *ids = malloc(cap * sizeof(*ids));
    int rc = gang_tokenizer_encode(t, s, len, true, ids, cap, &n);
    if (rc == 0) {
        char *back = decode(t, ids, n, &dlen);
        if (exact && (dlen != len || memcmp(back, s, len) != 0))
            abort();
        free(back);
    } else if (rc != GANG_EINVAL && rc != GANG_ERANGE) {
        abort();
    }
    free(ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static gang_tokenizer *fixed;
    if (!fixed)
        fixed = fixed_tokenizer();
    if (size && data[0] == '{') {
        gang_tokenizer *t = NULL;
        char err[256];
        if (gang_tokenizer_load_buffer((const char *)data, size, &t, err, sizeof(err)) == 0) {
            const char *text = "Hello 123 <|s|> w\xc3\xb6rld \xf0\x9f\x98\x80  \n";
            encode_roundtrip(t, text, strlen(text), false);
            gang_tokenizer_free(t);
        }
        return 0;
    }
    encode_roundtrip(fixed, (const char *)data, size, true);
    return 0;
}
