/*
 * ganglion text module (text/): the tokenizer of a Hugging Face tokenizer.json and the
 * interpreter of chat templates. Text never reaches the workers: agents turn prompts and
 * chat messages into token ids here and token ids back into text.
 *
 * Layering: text/ sits on common/ only (and cJSON, PCRE2); serve/, engine/ and model/'s
 * GGUF adapters use it. No CUDA, MPI or libuv types.
 */
#ifndef GANGLION_TEXT_H
#define GANGLION_TEXT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ganglion/common.h"

/* ==================================== tokenizer ===================================== */

/*
 * A tokenizer read from a Hugging Face `tokenizer.json` (text/tokenizer.c, tok-*.c).
 * Supported exactly: the BPE model (merges as "a b" strings or [a, b] pairs,
 * ignore_merges, byte_fallback, unk_token with fuse_unk), the normalizers Prepend and
 * Replace (and Sequence), the pre-tokenizers ByteLevel, Split (regex or string pattern),
 * Digits and Sequence, the decoders ByteLevel and the SentencePiece chain Replace* /
 * ByteFallback / Fuse / Strip (leading only), the post-processors ByteLevel and
 * TemplateProcessing (single sequence), and added tokens with their
 * special/normalized/lstrip/rstrip flags. Anything else (WordPiece, Unigram, any other
 * normalizer, pre-tokenizer, decoder or post-processor, dropout, a subword prefix or
 * suffix, single_word added tokens) is refused at load with a message naming the
 * component. Encoding is thread-safe on one loaded tokenizer (it is read-only).
 */
#define GANG_TOK_MAX_FILE_BYTES (64u << 20) /* tokenizer.json size */
#define GANG_TOK_MAX_VOCAB (1u << 20)       /* vocabulary entries + added tokens */
#define GANG_TOK_MAX_MERGES (1u << 21)      /* BPE merges */
#define GANG_TOK_MAX_TOKEN_BYTES 4096u      /* one token's content */
#define GANG_TOK_MAX_ADDED 16384u           /* added tokens (Gemma 3 has 6,249 control tokens) */
#define GANG_TOK_MAX_TEXT_BYTES (64u << 20) /* one encode call's input */

typedef struct gang_tokenizer gang_tokenizer;

/* Reads and validates PATH (at most GANG_TOK_MAX_FILE_BYTES). 0 and *out on success;
 * GANG_EMODEL (unsupported or malformed content), GANG_EIO, GANG_ENOENT or GANG_ENOMEM
 * with a message in err otherwise. */
int gang_tokenizer_load(const char *path, gang_tokenizer **out, char *err, size_t errlen);
/* The same from a buffer of LEN bytes (need not be NUL-terminated). */
int gang_tokenizer_load_buffer(const char *json, size_t len, gang_tokenizer **out, char *err,
                               size_t errlen);
void gang_tokenizer_free(gang_tokenizer *tok);

/* Encodes LEN bytes of UTF-8 TEXT (GANG_EINVAL if it is not valid UTF-8). With
 * ADD_SPECIAL the post-processor's tokens (BOS) are added. *n is always set to the number
 * of ids the text needs; ids[0..cap) receives them; GANG_ERANGE when cap is too small. */
int gang_tokenizer_encode(const gang_tokenizer *tok, const char *text, size_t len, bool add_special,
                          int32_t *ids, size_t cap, size_t *n);

/* A byte range [off, off + len) of a text. */
typedef struct gang_tok_range {
    size_t off, len;
} gang_tok_range;

/* gang_tokenizer_encode, except that a special added token touching one of the NPLAIN
 * ranges PLAIN of TEXT is encoded as the text it is made of (as tokenizers'
 * split_special_tokens does), not as its id: for text a client wrote inside text that is
 * the caller's (message content inside a rendered chat template). Non-special added
 * tokens are matched as usual. Any thread; errors as gang_tokenizer_encode. */
int gang_tokenizer_encode_plain(const gang_tokenizer *tok, const char *text, size_t len,
                                bool add_special, const gang_tok_range *plain, size_t nplain,
                                int32_t *ids, size_t cap, size_t *n);

/* The leftmost special added token of s[0..len) (the longest one at that place): 0 with its
 * offset *at and length *n, GANG_ENOENT without one, GANG_EINVAL for bad arguments. */
int gang_tokenizer_find_special(const gang_tokenizer *tok, const char *s, size_t len, size_t *at,
                                size_t *n);

/* Number of ids (vocabulary and added tokens): every id is below it. */
int32_t gang_tokenizer_n_ids(const gang_tokenizer *tok);
/* The most bytes one token stands for (its content or its decoded bytes, whichever is
 * longer; at least 1): a text of B bytes needs at least B / this many ids, so a caller
 * can refuse a text too long for a context before tokenizing it. O(vocabulary). */
size_t gang_tokenizer_max_token_bytes(const gang_tokenizer *tok);
/* The id of the token whose content is CONTENT (a vocabulary or added token, e.g.
 * "<|im_end|>"), or -1. */
int32_t gang_tokenizer_token_id(const gang_tokenizer *tok, const char *content);
/* The content of token ID as it appears in tokenizer.json, or NULL. */
const char *gang_tokenizer_token_text(const gang_tokenizer *tok, int32_t id);
/* Whether ID is an added token marked special. */
bool gang_tokenizer_is_special(const gang_tokenizer *tok, int32_t id);

/* Incremental decoding: ids go in one at a time, text comes out as soon as it is final.
 * ByteLevel decoders: an incomplete multi-byte character is held back until it
 * completes; bytes that can never form a character come out as U+FFFD, one per maximal
 * invalid subpart (as Python's and Rust's lossy decoders do). SentencePiece chains
 * (Replace, ByteFallback, Fuse, Strip): a run of <0xXX> byte tokens is held until the
 * next other token and comes out as its text when it is valid UTF-8, else as one U+FFFD
 * per byte (as tokenizers does); a run longer than GANG_TOK_DEC_RUN bytes is let out at
 * that length (the one place where a decode in pieces can differ from tokenizers, and
 * only for invalid runs that long). Concatenated steps plus the flush equal the decode of
 * the whole sequence. */
#define GANG_TOK_DEC_RUN 64u
/* Room a step needs beyond 3 x the token's length. */
#define GANG_TOK_DECODE_SLACK (3u * GANG_TOK_DEC_RUN + 8u)

typedef struct gang_tok_decoder {
    const gang_tokenizer *tok;
    bool skip_special;     /* drop special added tokens (as tokenizers' default) */
    unsigned char pend[4]; /* ByteLevel: held-back prefix of one character */
    unsigned npend;
    unsigned char run[GANG_TOK_DEC_RUN]; /* chain: held run of byte-fallback bytes */
    unsigned nrun;
    unsigned nstripped; /* chain: leading Strip characters dropped so far */
    bool started;       /* chain: text other than them has come out */
} gang_tok_decoder;

void gang_tok_decoder_init(gang_tok_decoder *d, const gang_tokenizer *tok, bool skip_special);
/* Appends the text ID completes to out[0..cap); *n is the number of bytes written.
 * GANG_EINVAL for an id out of range, GANG_ERANGE when cap is below
 * GANG_TOK_DECODE_SLACK + 3 x the token's length (nothing consumed). */
int gang_tokenizer_decode_step(gang_tok_decoder *d, int32_t id, char *out, size_t cap, size_t *n);
/* Ends the stream: what is held back comes out (cap: GANG_TOK_DECODE_SLACK). */
int gang_tokenizer_decode_flush(gang_tok_decoder *d, char *out, size_t cap, size_t *n);

/* ---------------------------------------------------------------------------------
 * Chat templates (text/chat-*.c): a bounded interpreter for the subset of Jinja that
 * the `chat_template` of tokenizer_config.json uses, rendering as transformers'
 * apply_chat_template does (jinja2 sandbox, trim_blocks, lstrip_blocks, loopcontrols).
 * Anything outside the subset is refused with a message naming it. Rendering is bounded
 * in steps, output, memory and recursion. A parsed template is immutable: several
 * threads may render it at once.
 * --------------------------------------------------------------------------------- */
typedef struct gang_chat_template gang_chat_template;
#define GANG_CHAT_MAX_TEMPLATE_BYTES (1u << 20)
/* Parses a template source. GANG_EMODEL with a message naming line/column and the
 * construct for a syntax error or an unsupported construct; GANG_EINVAL for NULL;
 * GANG_ENOMEM. */
int gang_chat_template_parse(const char *src, size_t len, gang_chat_template **out, char *err,
                             size_t errlen);
/* Reads DIR/tokenizer_config.json: "chat_template" (a string, or a list of
 * {"name","template"} objects: the one named "default"), and the "bos_token"/"eos_token"
 * strings (plain strings or AddedToken objects with "content"). Bounded size. GANG_ENOENT
 * when the file or the key is missing (message says which), GANG_EMODEL for a bad
 * file/template. */
int gang_chat_template_load(const char *dir, gang_chat_template **out, char *err, size_t errlen);
typedef struct gang_chat_render_opts {
    int add_generation_prompt;
    const char *bos_token, *eos_token; /* NULL: the values read by _load, or "" */
    uint64_t max_steps;                /* 0: a default (GANG_CHAT_DEFAULT_STEPS) */
    size_t max_output;                 /* 0: a default (GANG_CHAT_DEFAULT_OUTPUT) */
    /* NULL, or a JSON object (extra_len bytes) whose members become template variables,
     * as apply_chat_template's keyword arguments do: {"tools": [...]} (JSON schemas),
     * {"date_string": ...}, {"enable_thinking": false}; they override the ones above. */
    const char *extra_json;
    size_t extra_len;
} gang_chat_render_opts;
#define GANG_CHAT_DEFAULT_STEPS 1000000u
#define GANG_CHAT_DEFAULT_OUTPUT (4u << 20)
/* Renders with `messages` = the JSON array in messages_json (objects with "role" and
 * "content"; content may be a string or an array of parts, passed through as JSON
 * values), plus add_generation_prompt, bos_token, eos_token, tools = documents = none,
 * and the globals templates use (raise_exception, strftime_now, namespace, range, dict).
 * O may be NULL (defaults). On success 0 and *out (malloc'd, NUL-terminated, *out_len
 * bytes; free with free()). GANG_EINVAL (message) for a raise_exception() from the
 * template (its message) or bad JSON; GANG_ERANGE for step/output/memory/recursion
 * limits; GANG_EMODEL for a runtime error (undefined operation, type error) with the
 * line. Memory is bounded by 16 x max_output + 16 MiB. */
int gang_chat_render(const gang_chat_template *t, const char *messages_json, size_t len,
                     const gang_chat_render_opts *o, char **out, size_t *out_len, char *err,
                     size_t errlen);
/* T takes the malloc'd bos_token / eos_token texts (NULL: none) that renders use when their
 * options name none, as _load sets them from tokenizer_config.json (for loaders of other
 * formats: a GGUF file's bos and eos ids). */
void gang_chat_template_set_tokens(gang_chat_template *t, char *bos, char *eos);
void gang_chat_template_free(gang_chat_template *t);

/* ---------------------------------------------------------------------------------
 * JSON-schema grammars (text/jgram-*.c): structured outputs by constrained decoding. A
 * schema compiles into a small pushdown machine over bytes that accepts exactly the
 * compact JSON texts (one optional space after ':' and ',') the schema allows, with
 * object properties in the schema's order (required ones never skipped). Supported:
 * type (one or a list), properties, required, additionalProperties (accepted; only the
 * listed properties are generated, which every value of it allows), items,
 * minItems/maxItems, minProperties/maxProperties, enum, const, minLength/maxLength,
 * anyOf/oneOf whose alternatives
 * start with different characters, and the annotations title, description, default,
 * examples, $schema, $comment. Any other keyword is refused with a message naming it.
 * Numbers are generated without exponent, at most 15 integer and 8 fraction digits. An
 * object without properties, an array without items and a schema without type are any
 * JSON value, nested up to the machine's depth; there (json_object) objects and arrays
 * hold at most GANG_JGRAM_ANY_MEMBERS members and strings GANG_JGRAM_ANY_CHARS
 * characters, so that a model that repeats itself still closes its value. Compile time and memory
 * are bounded by the limits below. A compiled grammar is immutable: threads may share it.
 * --------------------------------------------------------------------------------- */
#define GANG_JGRAM_MAX_SCHEMA_BYTES 16384u /* schema text */
#define GANG_JGRAM_MAX_DEPTH 12u           /* nesting of schemas in the schema */
#define GANG_JGRAM_MAX_NODES 512u          /* compiled nodes */
#define GANG_JGRAM_MAX_MEMBERS 64u         /* properties of one object, values of one enum */
#define GANG_JGRAM_MAX_FRAMES 32u          /* nesting of the generated value */
#define GANG_JGRAM_MAX_TOKEN_BYTES 64u     /* longer tokens are never generated */
#define GANG_JGRAM_ANY_MEMBERS 16u         /* of an object or array of "any JSON" */
#define GANG_JGRAM_ANY_CHARS 256u          /* of a string of "any JSON" */

typedef struct gang_jgram gang_jgram;

/* Compiles the JSON schema in schema[0..len). 0 and *out (free with gang_jgram_free);
 * GANG_EINVAL with a message naming the keyword or limit for a schema it refuses or that
 * is not JSON; GANG_ENOMEM. */
int gang_jgram_compile(const char *schema, size_t len, gang_jgram **out, char *err, size_t errlen);
void gang_jgram_free(gang_jgram *g);
/* Whether text[0..len) is a value of the grammar (2), a prefix of one (1), or neither (0). */
int gang_jgram_check(const gang_jgram *g, const char *text, size_t len);

/* The tokens' bytes of a tokenizer, sorted for the mask below (special tokens, holes and
 * tokens over GANG_JGRAM_MAX_TOKEN_BYTES left out), with its scratch: one thread at a
 * time per table. 0, GANG_EINVAL or GANG_ENOMEM. */
typedef struct gang_jgram_vocab gang_jgram_vocab;
int gang_jgram_vocab_init(const gang_tokenizer *tok, gang_jgram_vocab **out);
void gang_jgram_vocab_free(gang_jgram_vocab *v);
/* Number of ids of the table (the tokenizer's gang_tokenizer_n_ids). */
uint32_t gang_jgram_vocab_n_ids(const gang_jgram_vocab *v);

/*
 * The tokens that may come next after the generated ids[0..n) (replayed from the start,
 * so the state is a function of the output alone): allowed[id] = 1 for every id whose
 * bytes keep the output a prefix of a value of g, 0 for the others (ids up to cap; ids
 * of the table at or past cap are ignored). *can_end says the output is already a whole
 * value (the caller lets its end-of-sequence tokens through). Returns the number of ids
 * allowed, or GANG_EINVAL when ids[0..n) is not itself a prefix (an id out of range, or
 * a token the grammar refuses).
 */
int gang_jgram_mask(const gang_jgram *g, gang_jgram_vocab *v, const int32_t *ids, uint32_t n,
                    uint8_t *allowed, uint32_t cap, int *can_end);

#endif /* GANGLION_TEXT_H */
