/*
 * Internals of the chat-template interpreter (text/chat-*.c): arenas, values, the
 * syntax tree, the lexer's tokens and the render context. Not a public header.
 *
 * Memory: the syntax tree lives in the template's arena (freed with the template); every
 * value made while rendering lives in the render's arena, which has a byte budget, so a
 * template cannot exhaust memory. Values are immutable except namespaces.
 */
#ifndef GANGLION_CHAT_INTERNAL_H
#define GANGLION_CHAT_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ganglion/text.h"

#define CHAT_MAX_DEPTH 96      /* nesting of the syntax tree (statements + expressions) */
#define CHAT_MAX_CALL_DEPTH 16 /* nested macro calls */
#define CHAT_MAX_JSON_DEPTH 64 /* nesting of the messages JSON */
#define CHAT_MAX_CONFIG_BYTES (32u << 20)

/* ---- arena ------------------------------------------------------------------------ */
typedef struct gang__chat_arena {
    struct gang__chat_chunk *head;
    size_t used, limit; /* bytes handed out and the budget (0: none) */
} gang__chat_arena;

/* Returns zeroed memory of N bytes (8-aligned) or NULL when out of memory or budget. */
void *gang__chat_alloc(gang__chat_arena *a, size_t n);
void gang__chat_arena_free(gang__chat_arena *a);

/* ---- values ----------------------------------------------------------------------- */
typedef enum {
    CV_UNDEF = 0,
    CV_NONE,
    CV_BOOL,
    CV_INT,
    CV_FLOAT,
    CV_STR,
    CV_LIST,
    CV_DICT,
    CV_NS,
    CV_RANGE,
    CV_LOOP,
    CV_FUNC,   /* a global function: i = its id */
    CV_METHOD, /* a bound method: s = its name, self = the object */
    CV_MACRO,
} cv_kind;

typedef struct cv cv;
typedef struct cv_list {
    size_t n;
    cv *v;
    bool tuple; /* a Python tuple: printed (a, b), accepted by startswith */
    bool gen;   /* jinja2's lazy result of select/map/reverse: only iterated */
    bool view;  /* dict.items()/keys()/values(): sized and iterable, never printed */
} cv_list;
typedef struct cv_dict {
    size_t n, cap;
    cv *k, *v;
} cv_dict;
typedef struct cv_range {
    int64_t start, stop, step;
} cv_range;

struct cv {
    cv_kind kind;
    bool markup; /* a string made by |safe (markupsafe.Markup): + escapes the other side */
    union {
        bool b;
        int64_t i;
        double f;
        struct {
            const char *s; /* not NUL-terminated */
            size_t n;
            const cv *self; /* CV_METHOD only */
        } s;
        cv_list *list;
        cv_dict *dict; /* CV_DICT and CV_NS */
        cv_range *range;
        struct chat_loop *loop;
        const struct gang__chat_node *macro;
    } u;
};

/* ---- syntax tree ------------------------------------------------------------------ */
typedef enum {
    /* statements */
    N_BLOCK = 1, /* items: statements */
    N_TEXT,      /* s, n */
    N_OUTPUT,    /* a */
    N_IF,        /* a cond, b then, c else (an N_IF for elif, or an N_BLOCK) */
    N_FOR,       /* a target, b iterable, c body, d else, e filter */
    N_SET,       /* a target (N_NAME, N_ATTR of a name, N_TUPLE), b value */
    N_SETBLOCK,  /* a target name, c body */
    N_MACRO,     /* s name, items params (N_NAME, or N_KWARG with a default), c body */
    N_BREAK,
    N_CONTINUE,
    /* expressions */
    N_CONST,  /* v */
    N_NAME,   /* s */
    N_ATTR,   /* a . s */
    N_ITEM,   /* a [ b ] */
    N_SLICE,  /* a [ b : c : d ] (b, c, d may be NULL) */
    N_CALL,   /* a ( items ), kwargs are N_KWARG */
    N_KWARG,  /* s = a */
    N_FILTER, /* a | s ( items ) */
    N_TEST,   /* a is [not] s ( items ), op = 1 when negated */
    N_UNARY,  /* op a */
    N_BINARY, /* a op b */
    N_AND,
    N_OR,
    N_NOT,
    N_COND,  /* b if a else c */
    N_LIST,  /* items */
    N_TUPLE, /* items */
    N_DICT,  /* items: pairs of key, value */
} node_kind;

/* Binary and unary operators. */
enum {
    OP_ADD = 1,
    OP_SUB,
    OP_MUL,
    OP_DIV,
    OP_FLOORDIV,
    OP_MOD,
    OP_POW,
    OP_CONCAT,
    OP_EQ,
    OP_NE,
    OP_LT,
    OP_LE,
    OP_GT,
    OP_GE,
    OP_IN,
    OP_NOTIN,
    OP_NEG,
    OP_POS,
};

typedef struct gang__chat_node {
    node_kind kind;
    int op;
    uint32_t line;
    struct gang__chat_node *a, *b, *c, *d, *e;
    struct gang__chat_node **items;
    size_t nitems;
    const char *s;
    size_t n;
    cv v;
} gang__chat_node;

struct gang_chat_template {
    gang__chat_arena arena;
    gang__chat_node *root;
    char *bos, *eos; /* from tokenizer_config.json, or NULL */
};

/* ---- lexer -------------------------------------------------------------------------- */
typedef enum {
    T_EOF = 0,
    T_TEXT,
    T_VAR_BEGIN,
    T_VAR_END,
    T_BLOCK_BEGIN,
    T_BLOCK_END,
    T_NAME,
    T_STRING, /* s, n: the unescaped value */
    T_INT,
    T_FLOAT,
    T_OP, /* s, n: the operator's characters */
} tok_kind;

typedef struct chat_tok {
    tok_kind kind;
    uint32_t line, col;
    const char *s;
    size_t n;
    int64_t i;
    double f;
} chat_tok;

/* Splits SRC (newlines already normalized) into tokens in the arena, applying Jinja's
 * whitespace control (-, trim_blocks, lstrip_blocks, the dropped final newline). 0, or
 * GANG_EMODEL / GANG_ENOMEM with a message naming the line and column. */
int gang__chat_lex(gang__chat_arena *a, const char *src, size_t len, chat_tok **toks, size_t *ntoks,
                   char *err, size_t errlen);

/* Parses the tokens into a tree of statements (an N_BLOCK). */
int gang__chat_parse_tokens(gang__chat_arena *a, const chat_tok *toks, size_t ntoks,
                            gang__chat_node **root, char *err, size_t errlen);

/* ---- rendering ------------------------------------------------------------------------ */
typedef struct chat_var {
    const char *name;
    size_t n;
    cv v;
} chat_var;

typedef struct chat_frame {
    struct chat_frame *parent;
    chat_var *vars;
    size_t n, cap;
} chat_frame;

typedef struct chat_loop {
    const cv *items; /* NULL for a range */
    const cv_range *range;
    size_t n, i;
} chat_loop;

typedef struct chat_buf {
    char *p;
    size_t n, cap, limit;
} chat_buf;

typedef struct chat_ctx {
    gang__chat_arena arena;
    chat_buf out;
    chat_frame *frame, *globals;
    uint64_t steps, max_steps;
    unsigned calls;
    uint32_t line; /* of the node being evaluated, for messages */
    char *err;
    size_t errlen;
} chat_ctx;

/* Internal control codes of statements (positive: never returned by the public API). */
#define CHAT_BREAK 1
#define CHAT_CONTINUE 2

/* Records a message "line N: ..." and returns RC. */
int gang__chat_fail(chat_ctx *c, int rc, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Charges N steps; GANG_ERANGE once the budget is spent. */
int gang__chat_step(chat_ctx *c, uint64_t n);

/* Value helpers (chat-value.c). */
cv gang__cv_str(const char *s, size_t n);
cv gang__cv_int(int64_t i);
bool gang__cv_truthy(const cv *v);
/* Whether V is a lazy generator (the result of select, map, reverse), or (ANY_VIEW) also
 * a dict view (items, keys, values): values that Python prints as object addresses or
 * view types. */
bool gang__cv_is_gen(const cv *v);
bool gang__cv_is_lazy(const cv *v);
const char *gang__cv_type_name(const cv *v);
bool gang__cv_equal(const cv *a, const cv *b);
/* The same, charging the comparison to the step budget (GANG_ERANGE when it runs out:
 * comparing large nested values cannot take unbounded time). */
int gang__cv_equal_c(chat_ctx *c, const cv *a, const cv *b, bool *eq);
/* Python's str(V) appended to B. */
int gang__cv_str_into(chat_ctx *c, chat_buf *b, const cv *v);
/* Python's str(V) as a new string value. */
int gang__cv_to_str(chat_ctx *c, const cv *v, cv *out);
/* json.dumps(V, indent=INDENT (<0: none), sort_keys=FLAGS & CHAT_JSON_SORT,
 * ensure_ascii=FLAGS & CHAT_JSON_ASCII). */
#define CHAT_JSON_SORT 1
#define CHAT_JSON_ASCII 2
int gang__cv_to_json(chat_ctx *c, chat_buf *b, const cv *v, int indent, int flags, int depth);
int gang__cv_from_cjson(chat_ctx *c, const void *json, cv *out, int depth);
/* Number of items of a sequence, string (code points), mapping or range; -1 if none. */
int64_t gang__cv_length(const cv *v);
/* The items of an iterable as an array (strings: one string per code point; dicts: the
 * keys). GANG_EMODEL when V is not iterable. */
int gang__cv_items(chat_ctx *c, const cv *v, cv_list *out);
int gang__cv_dict_get(const cv_dict *d, const char *k, size_t n, cv *out);
int gang__cv_dict_set(chat_ctx *c, cv_dict *d, const cv *k, const cv *v);
/* A new list of n items (uninitialised, *items points at them) in *out, from the arena;
 * charges n steps. GANG_ERANGE past the memory or step budget. */
int gang__cv_new_list(chat_ctx *c, size_t n, cv *out, cv **items);
int gang__buf_put(chat_ctx *c, chat_buf *b, const char *s, size_t n);
/* Copies B's bytes into the arena as a string value. */
int gang__buf_to_cv(chat_ctx *c, chat_buf *b, cv *out);
bool gang__is_space_at(const char *s, size_t n, size_t *len);
int gang__cv_compare(chat_ctx *c, const cv *a, const cv *b, int *cmp);
/* Steps an operation that scans V costs: 1 per 256 bytes of text or per item. */
uint64_t gang__cv_cost(const cv *v);

/* Evaluation (chat-eval.c) and built-ins (chat-builtins.c, chat-strings.c). */
int gang__chat_eval(chat_ctx *c, const gang__chat_node *n, cv *out);
int gang__chat_exec(chat_ctx *c, const gang__chat_node *n);
int gang__chat_lookup(chat_ctx *c, const char *name, size_t n, cv *out);
int gang__chat_getattr(chat_ctx *c, const cv *obj, const char *name, size_t n, cv *out);
int gang__chat_call(chat_ctx *c, const cv *fn, const cv *args, size_t nargs, const char **kwn,
                    const size_t *kwl, const cv *kwv, size_t nkw, cv *out);
int gang__chat_filter(chat_ctx *c, const char *name, size_t n, const cv *args, size_t nargs,
                      const char **kwn, const size_t *kwl, const cv *kwv, size_t nkw, cv *out);
int gang__chat_test(chat_ctx *c, const char *name, size_t n, const cv *args, size_t nargs,
                    bool *out);
int gang__chat_method(chat_ctx *c, const cv *self, const char *name, size_t n, const cv *args,
                      size_t nargs, cv *out);
bool gang__chat_has_method(const cv *self, const char *name, size_t n);
/* String helpers shared by methods and filters (chat-strings.c): strip (WHICH 0 both,
 * 1 left, 2 right; CHARS NULL for whitespace), ASCII case (0 upper, 1 lower, 2 str.title,
 * 3 capitalize, 4 jinja2's title filter), replace (COUNT < 0: all), and a dict's items (0), keys
 * (1), values (2). */
int gang__chat_strip(const cv *s, const cv *chars, int which, cv *out);
int gang__chat_case(chat_ctx *c, const cv *s, int how, cv *out);
int gang__chat_replace(chat_ctx *c, const cv *s, const cv *from, const cv *to, int64_t count,
                       cv *out);
int gang__chat_dict_view(chat_ctx *c, const cv_dict *d, int which, cv *out);
/* Whether a filter or test of that name exists (checked when parsing, as jinja2 does). */
bool gang__chat_filter_known(const char *name, size_t n);
bool gang__chat_test_known(const char *name, size_t n);
/* Binds NAME to V in frame F (replacing an earlier binding there). */
int gang__chat_frame_set(chat_ctx *c, chat_frame *f, const char *name, size_t n, const cv *v);
/* Assigns V to TARGET (a name, a namespace attribute or a tuple of names). */
int gang__chat_assign(chat_ctx *c, const gang__chat_node *target, const cv *v);
/* Renders BODY into a string value of its own. */
int gang__chat_capture(chat_ctx *c, const gang__chat_node *body, cv *out);
/* A binary (B non-NULL) or unary operator (chat-arith.c). */
int gang__chat_binary(chat_ctx *c, int op, const cv *a, const cv *b, cv *out);
int gang__chat_call_macro(chat_ctx *c, const gang__chat_node *m, const cv *args, size_t nargs,
                          const char **kwn, const size_t *kwl, const cv *kwv, size_t nkw, cv *out);

#endif /* GANGLION_CHAT_INTERNAL_H */
