/*
 * Internals of the inference API shared by its files (internal to serve/api*.c):
 *
 *   api.c        the table of accepted calls, submission to rank 0 (in pieces for long
 *                prompts), generations (START / ABORT / give-up), token and done reports,
 *                deadlines, metrics, GET /v1/models, the API key;
 *   api-parse.c  request bodies: sampling fields, stop ids and strings, prompts (text, ids
 *                or arrays of either), chat messages through the chat template;
 *   api-format.c what constrains the output: response_format (a grammar), logit_bias;
 *   api-tools.c  tools and tool_choice in, tool_calls out;
 *   api-out.c    what a token becomes: text (incremental, UTF-8 safe), stop strings, the
 *                streamed Server-Sent Events and the final JSON answers, logprobs;
 *   api-text.c   POST /tokenize and POST /detokenize, loading the tokenizer and template;
 *   api-chat.c   special-token text of a client's chat strings kept as text;
 *   api-prep.c   requests parsed and tokenized off the loop, one at a time.
 *
 * A call (one HTTP request) holds one sequence per prompt; each sequence is one request
 * in the engine, with its own id. Everything runs on the agent's loop thread except the
 * preparation of a request (api-prep.c: body, fields, chat template, tokenizer), which runs
 * on libuv's thread pool and only reads what gang_api_init loaded.
 */
#ifndef GANGLION_SERVE_API_INTERNAL_H
#define GANGLION_SERVE_API_INTERNAL_H

#include <stdarg.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "ganglion/serve.h"
#include "ganglion/text.h"

typedef struct gang_chat_template gang_chat_template; /* model.h (chat templates) */

#define API_SWEEP_MS 50
#define API_MAX_PROMPTS 64       /* prompts in one completion call */
#define API_MAX_CHOICES 16       /* "n": choices per prompt */
#define API_MAX_SEQS 128         /* sequences (prompts x n) of one call */
#define API_MAX_STOP_STRINGS 8   /* "stop" strings of one call */
#define API_MAX_STOP_BYTES 256   /* bytes of one stop string */
#define API_MAX_MESSAGES 4096    /* chat messages of one call */
#define API_DEFAULT_MAX_TOKENS 0 /* 0: the rest of the context */

typedef enum api_kind { API_COMPLETION = 0, API_CHAT = 1 } api_kind;

/* The fields of a call that every one of its sequences shares. */
typedef struct api_params {
    uint32_t max_tokens;    /* 0 = the rest of the context, per prompt */
    uint32_t n_choices;     /* "n": choices per prompt, 1..API_MAX_CHOICES */
    gang_sampling sampling; /* everything the engine needs: draw, penalties, stop ids,
                               ignore_eos, logprobs and top_logprobs */
    char stop_str[API_MAX_STOP_STRINGS][API_MAX_STOP_BYTES + 1];
    size_t stop_len[API_MAX_STOP_STRINGS];
    uint32_t n_stop_str;
    int stream;         /* answer as Server-Sent Events */
    int include_usage;  /* stream_options.include_usage */
    int skip_special;   /* drop special tokens from the text (default 1) */
    int echo;           /* completions: the prompt's text comes before the completion */
    char *grammar;      /* the schema the output must follow (sampling.grammar_bytes), or
                           NULL; owned by the call */
    char *tools_json;   /* chat: the request's "tools" (compact JSON), or NULL; owned */
    int tools_mode;     /* api_tools_mode: what tool_choice asked */
    int parallel_tools; /* parallel_tool_calls (default true) */
    gang_kv_xfer kv;    /* P/D: "kv_transfer", the prefill gang's export to fetch (router) */
} api_params;

/* tool_choice: none (or no tools), auto (parsed from the text), required or a named
 * function (enforced by a grammar). */
typedef enum api_tools_mode { API_TOOLS_OFF = 0, API_TOOLS_AUTO, API_TOOLS_FORCED } api_tools_mode;

/* The logprobs of one generated token. */
typedef struct api_lp {
    float logprob;
    uint32_t text_off; /* offset of the token's text in the sequence's output text */
    uint32_t n_top;
    int32_t top_ids[GANG_MAX_TOP_LOGPROBS];
    float top_lp[GANG_MAX_TOP_LOGPROBS];
} api_lp;

typedef struct api_call api_call;
typedef struct api_prep api_prep; /* api-prep.c */

/* One prompt of a call: one request in the engine. */
typedef struct api_seq {
    struct api_seq *next; /* the API's list of live sequences */
    api_call *call;
    uint32_t index;  /* choice index in the answer: prompt x n + choice */
    uint32_t choice; /* which of its prompt's n choices: its draws' seed is offset by it */
    uint64_t id;     /* engine request id, unique */
    int32_t *prompt; /* the prompt's ids, then the grammar's words (gang_gen_request) */
    uint32_t n_prompt;
    uint32_t n_wire; /* entries of prompt that travel: n_prompt + the grammar's words */
    uint32_t max_tokens;
    int32_t *out; /* [max_tokens] accepted tokens: they survive a gang restart */
    uint32_t n_out;
    api_lp *lp;          /* [max_tokens] with logprobs, else NULL */
    uint32_t n_gen;      /* tokens reported by the current generation's run */
    uint32_t n_lp_sent;  /* tokens (ids, logprobs) a stream chunk carried */
    int role_sent;       /* chat stream: the first chunk (with the role) is out */
    char *echo;          /* "echo": the prompt's text (malloc'd), or NULL */
    int echo_sent;       /* a completion stream: the echo went out */
    uint32_t mismatches; /* re-run tokens that differed from the accepted ones */
    gang_tok_decoder dec;
    char *text; /* decoded output (with a tokenizer), NUL-terminated */
    size_t text_len, text_cap;
    size_t sent_len;   /* bytes of text streamed */
    size_t stop_scan;  /* no stop string starts before this offset of text */
    uint64_t sent_gen; /* generation it was submitted in, 0 = owed */
    uint32_t parts;    /* prompt ids delivered to rank 0 in sent_gen (pieces) */
    uint32_t submissions;
    uint32_t n_cached;        /* prompt tokens the prefix cache gave (the gang's DONE) */
    uint64_t kv_id;           /* P/D: the export of its prompt's blocks (the gang's DONE), 0 none */
    uint32_t kv_blocks;       /* exported blocks (kv_id != 0) or imported ones */
    gang_kv_layout kv_layout; /* the exporting gang's layout (kv_id != 0) */
    int cached_known;         /* n_cached holds the gang's report */
    uint64_t sent_ms, first_ms, last_ms;
    int done;      /* finished here (the gang's DONE, or a stop string) */
    int gang_done; /* the gang reported DONE: nothing to cancel there */
    char finish[8];
} api_seq;

struct api_call {
    api_call *next;
    gang_http_exchange *x;
    api_kind kind;
    api_params p;
    uint64_t id; /* "cmpl-<id>" / "chatcmpl-<id>" */
    int64_t created;
    uint32_t n_seqs, n_done;
    api_seq **seqs;
    uint64_t accepted_ms, deadline_ms;
    int streaming; /* the SSE head is out */
    int closed;    /* the client is gone: answer nothing more */
};

struct gang_api {
    void *loop; /* uv_loop_t */
    gang_api_config cfg;
    gang_api_submit_fn submit; /* to rank 0: supervisor, or forwarded (ganglion/serve.h) */
    void *submit_ctx;
    gang_tokenizer *tok;     /* DIR/tokenizer.json, or NULL */
    char tok_why[256];       /* why tok is NULL */
    size_t text_max;         /* bytes of text that could still fit the context (4 x its
                                positions x the longest token's bytes): more is refused
                                before tokenizing (gang__api_text_fits) */
    gang_chat_template *tpl; /* DIR/tokenizer_config.json's chat_template, or NULL */
    char tpl_why[256];
    uint64_t shield_seq;             /* draws of api_shield markers (any thread: atomic) */
    api_prep *prep_head, *prep_tail; /* requests waiting for the thread pool, in order */
    api_prep *prep_running;          /* the one on the thread pool, or NULL */
    uint32_t n_prep;                 /* both: they count against --max-queue */
    int64_t created_s;
    uint64_t gen;
    char gave_up[GANG_REQ_REASON_MAX];
    uint64_t next_id;
    api_call *calls;
    uint32_t n_calls;
    api_seq *seqs;
    void *sweep; /* uv_timer_t */
    gang_req_msg pkt;
    uint64_t answered[6]; /* 200, 400, 401, 404, 503, 504 */
    uint64_t resubmits, cancels, mismatches, stop_strings, client_gone;
    uint64_t prompt_tokens, prefix_hit_tokens; /* of the sequences the gang completed */
    gang_histogram h_queue, h_prefill, h_tps, h_total, h_ttft, h_itl;
    uint64_t forwarded, lost, nacks; /* a member's forwarded calls, those lost (503/504) */
    gang_histogram h_relay;          /* a member: rank 0's token report -> this client */
    /* P/D (issue #26): exports (prefill gang), imports and fallbacks (decode gang). */
    uint64_t kv_exports, kv_exported_blocks, kv_imports, kv_imported_blocks, kv_import_fallbacks;
    uint64_t kv_import_mismatches; /* of the fallbacks: the source's layout did not fit */
    uint64_t kv_imports_device;    /* of the imports: rows moved device to device (a pair) */
    gang_histogram h_kv;           /* seconds of each import */
};

/* ---- api.c ---- */
/*
 * An error in OpenAI's shape: {"error": {"message", "type", "param", "code"}}: type
 * "invalid_request_error" below 500, "server_error" from 500; param the field a 400's
 * message names first (messages start with 'field'), else null; code the given string
 * ("invalid_api_key", "model_not_found", "not_found", "method_not_allowed", "unavailable",
 * "overloaded", "timeout"), null for NULL or "invalid_request_error".
 */
cJSON *gang__api_error_object(int status, const char *code, const char *msg);
/* An error in OpenAI's shape, counted by status (api.c). */
void gang__api_error(gang_api *api, gang_http_exchange *x, int status, const char *code,
                     const char *fmt, ...) __attribute__((format(printf, 5, 6)));
/* Answers with o (consumed) as JSON. */
void gang__api_json(gang_http_exchange *x, int status, cJSON *o);
/* Tells rank 0 to stop generating s (when it runs in the current generation and the gang
 * has not finished it). */
void gang__api_cancel_in_gang(gang_api *api, api_seq *s);
/* Parses and prepares a completion or chat request (body, fields, prompts rendered and
 * tokenized) into *out (0), or -1 with the answer's status, code and message. Any thread:
 * reads only the configuration, tokenizer and template, which do not change after
 * gang_api_init. */
int gang__api_prepare_call(gang_api *api, const gang_http_request *req, api_kind kind,
                           api_call **out, int *status, const char **code, char *err, size_t cap);
/* Queues a prepared call (its x set) and submits its sequences. Takes c. Loop thread. */
void gang__api_call_accept(gang_api *api, api_call *c);
/* Frees a call that was never accepted (NULL: nothing). */
void gang__api_call_discard(api_call *c);
/* Frees api with its tokenizer and template (gang_api_close, or the last preparation). */
void gang__api_free(gang_api *api);

/* ---- api-prep.c ---- */
typedef enum api_prep_kind {
    API_PREP_COMPLETION = 0,
    API_PREP_CHAT = 1,
    API_PREP_TOKENIZE = 2
} api_prep_kind;
/* Prepares req (body copied) on libuv's thread pool, one request at a time in arrival
 * order, and answers x (tokenize) or accepts the call (generations) on the loop once it is
 * done. Loop thread. */
void gang__api_prep_submit(gang_api *api, gang_http_exchange *x, const gang_http_request *req,
                           api_prep_kind kind);
/* At gang_api_close: answers every request still being prepared 503. Returns 1 when api
 * may be freed now, 0 when the one on the thread pool will free it (gang__api_free). */
int gang__api_prep_close(gang_api *api);

/* ---- api-parse.c ---- */
/* Whether len bytes of text may fit the context; if not, err says so (for a 400). A
 * text over api->text_max cannot, and is refused before the tokenizer spends time on it
 * on the loop thread. */
int gang__api_text_fits(const gang_api *api, size_t len, const char *what, char *err, size_t cap);
/* The request's body as a JSON value, or NULL with the reason in err: not JSON, bytes
 * after the value (other than whitespace), or a NUL (a raw byte or a \u0000 escape: C
 * strings would cut the text there silently). */
cJSON *gang__api_parse_body(const gang_http_request *req, char *err, size_t cap);
/*
 * Reads the fields every call shares (max_tokens, sampling and penalties with the model's
 * generation_config defaults, stop ids and strings, logprobs, stream, ignore_eos) into p.
 * 0, or -1 with a message for a 400.
 */
int gang__api_parse_params(gang_api *api, const cJSON *o, api_kind kind, api_params *p, char *err,
                           size_t cap);
/*
 * Builds the sequences of a call from "prompt" (completions: a string, an array of ids,
 * or an array of strings or of id arrays) or "messages" (chat: rendered by the chat
 * template, then encoded). Checks each against the context and sets its max_tokens.
 * 0, or -1 with a message (for a 400).
 */
int gang__api_parse_prompts(gang_api *api, const cJSON *o, api_call *c, char *err, size_t cap);
/* Reads an optional integer / number field in [lo, hi]: 0 absent, 1 read, -1 (message). */
int gang__api_get_int(const cJSON *o, const char *name, double lo, double hi, double *v, char *err,
                      size_t cap);
/* Reads an array of token ids below vocab into a malloc'd *ids; 0, or -1 (message). */
int gang__api_get_id_array(const cJSON *a, const char *what, uint32_t vocab, uint32_t cap,
                           int32_t **ids, uint32_t *n, char *err, size_t errcap);
/* Renders chat messages (validated: known roles, content parts joined, tool calls and
 * results kept) with the template into a malloc'd string; tools_json (or NULL) is the
 * template's `tools`. *plain (malloc'd, *nplain of them; NULL when none) are the ranges
 * of the text where the client's strings held special-token text, to be encoded as text
 * (api-chat.c). 0, or -1 with a message. */
int gang__api_render_chat(gang_api *api, const cJSON *messages, int add_generation_prompt,
                          const char *tools_json, char **text, gang_tok_range **plain,
                          size_t *nplain, char *err, size_t cap);

/* ---- api-chat.c ---- */
/* One rendering's markers for the special-token text of the client's strings. */
typedef struct api_shield {
    char prefix[24]; /* U+E000, 8 hex digits, ':' */
    size_t marks;    /* markers put in */
} api_shield;
/* Draws the marker prefix, absent from json and json2 (the client's strings; either may be
 * NULL). 0, or GANG_EEXIST (no absent prefix found). Loop thread. */
int gang__api_shield_begin(gang_api *api, api_shield *sh, const char *json, const char *json2);
/* Replaces special-token text in every string value of the tree root (the normalized
 * messages) by markers. 0, GANG_ENOMEM, or GANG_ERANGE (too many). */
int gang__api_shield_tree(gang_api *api, api_shield *sh, cJSON *root);
/* The JSON text json with its strings shielded as above, malloc'd (cJSON's allocator),
 * or NULL (unparseable, out of memory). */
char *gang__api_shield_text(gang_api *api, api_shield *sh, const char *json);
/* Puts each marker of the rendered *text (replaced, malloc'd) back as its token's text and
 * returns those ranges in *plain (malloc'd; NULL and 0 when none). 0, or -1 with a
 * message (a template that cut a marker, out of memory). */
int gang__api_shield_end(gang_api *api, const api_shield *sh, char **text, gang_tok_range **plain,
                         size_t *nplain, char *err, size_t cap);

/* ---- api-format.c ---- */
/* "logit_bias" and "response_format" into p (its grammar, sampling.grammar_bytes).
 * 0, or -1 with a message for a 400. */
int gang__api_parse_constraints(gang_api *api, const cJSON *o, api_params *p, char *err,
                                size_t cap);
/* Compiles schema (to refuse what cannot be enforced, naming WHAT in the message) and
 * makes its compact text p's grammar. 0, or -1 with a message for a 400. */
int gang__api_set_grammar(gang_api *api, api_params *p, const cJSON *schema, const char *what,
                          char *err, size_t cap);

/* ---- api-tools.c ---- */
/* "tools", "tool_choice", "parallel_tool_calls" into p (a forced choice: its grammar).
 * After gang__api_parse_constraints. 0, or -1 with a message for a 400. */
int gang__api_parse_tools(gang_api *api, const cJSON *o, api_kind kind, api_params *p, char *err,
                          size_t cap);
/* The tool calls in s's text as OpenAI's "tool_calls" array (new, the caller's), or NULL
 * when the call asked for none or the text holds none; *head: the bytes of text before
 * the first call (content the model wrote before calling). */
cJSON *gang__api_tool_calls(const api_call *c, const api_seq *s, size_t *head);

/* ---- api-text.c ---- */
/* POST /tokenize: {"prompt"} or {"messages"} -> {"count","max_model_len","tokens"}. */
/* POST /tokenize's answer to req in *answer (0), or -1 with a message (a 400). Any thread
 * (reads only what the API loaded at start). */
int gang__api_tokenize_answer(gang_api *api, const gang_http_request *req, cJSON **answer,
                              char *err, size_t errcap);
/* POST /detokenize: {"tokens"} -> {"prompt"}. */
void gang__api_detokenize(gang_api *api, gang_http_exchange *x, const gang_http_request *req);

/* ---- api-out.c ---- */
/* A token the gang reported for s (in order, new): text, stop strings, stream chunks. */
void gang__api_seq_token(gang_api *api, api_seq *s, int32_t token, const api_lp *lp);
/* The gang finished s (finish "length" / "stop"): the last text goes out. */
void gang__api_seq_finish(gang_api *api, api_seq *s, const char *finish);
/* Every sequence of c is done: the answer (JSON, or the stream's end). */
void gang__api_call_answer(gang_api *api, api_call *c);
/* Ends c with an error: a JSON error, or an error event closing its stream. */
void gang__api_call_fail(gang_api *api, api_call *c, int status, const char *type, const char *msg);

#endif
