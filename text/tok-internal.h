/*
 * Internals of the tokenizer (text/tokenizer.c, tok-load.c, tok-bpe.c, tok-pretok.c,
 * tok-decode.c): the loaded tokenizer.json, shared between the files of the module and
 * nobody else. See include/ganglion/text.h for the contract.
 */
#ifndef GANGLION_TOK_INTERNAL_H
#define GANGLION_TOK_INTERNAL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "ganglion/text.h"

/* Pre-tokenizer kinds, in the order of tokenizer.json's Sequence. */
enum { TOK_PT_SPLIT = 0, TOK_PT_BYTELEVEL = 1 };

/* Split behaviours (tokenizers' SplitDelimiterBehavior). */
enum {
    TOK_SPLIT_ISOLATED = 0,
    TOK_SPLIT_REMOVED,
    TOK_SPLIT_MERGED_PREV,
    TOK_SPLIT_MERGED_NEXT,
    TOK_SPLIT_CONTIGUOUS
};

typedef struct gang__tok_pretok {
    int kind;
    int behavior;          /* TOK_SPLIT_*: Split, Digits and ByteLevel's regex */
    bool add_prefix_space; /* ByteLevel: a space before every piece that lacks one */
    pcre2_code *re;        /* NULL: no regex (ByteLevel with use_regex false) */
} gang__tok_pretok;

/* Normalizers (tok-norm.c), applied in order to each segment between added tokens. */
enum { TOK_NORM_PREPEND = 0, TOK_NORM_REPLACE = 1 };

typedef struct gang__tok_norm {
    int kind;
    char *text; /* Prepend: the prefix; Replace: the replacement */
    uint32_t len;
    pcre2_code *re; /* Replace: the pattern (a literal for String) */
} gang__tok_norm;

/* Decoders: ByteLevel, or the SentencePiece chain Replace* ByteFallback? Fuse? Strip? */
enum { TOK_DEC_BYTELEVEL = 0, TOK_DEC_CHAIN = 1 };

typedef struct gang__tok_added {
    int32_t id;
    const char *content; /* points into tok->text[id] */
    uint32_t len;
    bool special, normalized, lstrip, rstrip;
} gang__tok_added;

/* A growable list of byte ranges into one arena (the pieces of a pre-tokenized text). */
typedef struct gang__tok_span {
    uint32_t off, len;
} gang__tok_span;

struct gang_tokenizer {
    uint32_t n_ids;
    char **text;        /* [n_ids] surface content as in tokenizer.json, NUL-ended; NULL: hole */
    uint32_t *text_len; /* [n_ids] */
    char **dec;         /* [n_ids] bytes the decoder makes of the token */
    uint32_t *dec_len;  /* [n_ids] */
    bool *special;      /* [n_ids] added token marked special */
    uint32_t *hslot;    /* open addressing: id + 1, 0 empty; keyed by text */
    uint32_t hmask;     /* capacity - 1 */
    uint64_t seed;      /* hash seed, random per load */
    uint64_t *mkey;     /* merges: (left << 32 | right) + 1, 0 empty */
    uint32_t *mrank;
    int32_t *mnew;
    uint32_t mmask;
    bool byte_level; /* a ByteLevel pre-tokenizer maps bytes before the model */
    bool ignore_merges, byte_fallback, fuse_unk;
    int32_t unk_id;        /* -1: none */
    int32_t byte_ids[256]; /* <0xXX> tokens for byte_fallback, -1 where absent */
    gang__tok_pretok *pt;
    unsigned npt;
    gang__tok_norm *norm;
    unsigned nnorm;
    int dec_kind;           /* TOK_DEC_* */
    int16_t *dec_byte;      /* [n_ids] chain with ByteFallback: the byte of "<0xXX>", or -1 */
    bool dec_utf8;          /* chain with ByteLevel: its bytes go through the UTF-8 machine */
    char strip_char[5];     /* chain's Strip: the character dropped at the start ("" none) */
    unsigned strip_start;   /* how many of them at most */
    gang__tok_added *added; /* sorted by content length, longest first */
    unsigned nadded;
    uint8_t added_first[2][32];       /* per pass, bit b: some added token starts with byte b */
    int32_t *prefix_ids, *suffix_ids; /* TemplateProcessing around the sequence */
    unsigned nprefix, nsuffix;
};

/* Formats a load error into err (snprintf semantics) and returns GANG_EMODEL. */
int gang__tok_fail(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Seeded hash of LEN bytes. */
uint64_t gang__tok_hash(const gang_tokenizer *t, const char *s, size_t len);
/* A 64-bit avalanche (MurmurHash3 fmix64), shared by the vocabulary and merge tables. */
uint64_t gang__tok_mix64(uint64_t h);
/* The id whose surface text is s[0..len), or -1. */
int32_t gang__tok_lookup(const gang_tokenizer *t, const char *s, size_t len);

/* (Re)builds the text -> id hash; the first id wins a repeated text. 0 or GANG_ENOMEM. */
int gang__tok_build_hash(gang_tokenizer *t);

/* tok-load.c: the parts of tokenizer.json. Each returns 0 or GANG_E* with err filled. */
int gang__tok_load_model(gang_tokenizer *t, const cJSON *model, const cJSON *added, char *err,
                         size_t errlen);
int gang__tok_load_pretok(gang_tokenizer *t, const cJSON *pt, char *err, size_t errlen);
int gang__tok_load_post(gang_tokenizer *t, const cJSON *pp, char *err, size_t errlen);
int gang__tok_load_decoder(gang_tokenizer *t, const cJSON *dec, char *err, size_t errlen);

/* tok-norm.c: loads the normalizer (null, Prepend, Replace or a Sequence of them). */
int gang__tok_load_norm(gang_tokenizer *t, const cJSON *norm, char *err, size_t errlen);
/* Normalizes s[0..len) into a new buffer *out of *olen bytes (caller frees). 0, GANG_ENOMEM,
 * or GANG_ERANGE when the result would exceed GANG_TOK_MAX_TEXT_BYTES. */
int gang__tok_normalize(const gang_tokenizer *t, const char *s, size_t len, char **out,
                        size_t *olen);

/* tok-bpe.c: inserts merge (a, b) -> merged with RANK; GANG_EEXIST when the pair repeats. */
int gang__tok_merge_put(gang_tokenizer *t, int32_t a, int32_t b, uint32_t rank, int32_t merged);
/* Encodes one pre-token word w[0..len) (in the model's alphabet) with the BPE model,
 * appending ids through the emitter. O(n log n) in the word's length. */
typedef struct gang__tok_out {
    int32_t *ids;
    size_t cap, n;
} gang__tok_out;
int gang__tok_bpe_word(const gang_tokenizer *t, const char *w, size_t len, gang__tok_out *o);
void gang__tok_out_push(gang__tok_out *o, int32_t id);

/* tok-pretok.c: the byte-level alphabet (GPT-2's bytes_to_unicode). */
/* Writes the UTF-8 of byte b's stand-in character to out (1 or 2 bytes); returns the count. */
unsigned gang__tok_bl_encode(unsigned char b, char *out);
/* The byte a stand-in code point denotes, or -1. */
int gang__tok_bl_decode(uint32_t cp);
/* Decodes one UTF-8 character at s[0..len) (valid input assumed); *cp gets it. */
unsigned gang__tok_utf8_next(const char *s, size_t len, uint32_t *cp);
/* Whether text[0..len) is valid UTF-8. */
bool gang__tok_utf8_valid(const char *s, size_t len);
/* Compiles a Split/ByteLevel regex (UTF, UCP); NULL with err filled on failure. */
pcre2_code *gang__tok_regex(const char *pattern, size_t len, bool literal, char *err,
                            size_t errlen);

#define TOK_GPT2_REGEX                                                                             \
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"

#endif /* GANGLION_TOK_INTERNAL_H */
