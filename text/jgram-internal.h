/*
 * Internals of the JSON-schema grammars (text/jgram-compile.c builds, text/jgram-match.c
 * runs): the compiled nodes and the matcher's stack of frames. See include/ganglion/text.h
 * for the contract.
 */
#ifndef GANGLION_JGRAM_INTERNAL_H
#define GANGLION_JGRAM_INTERNAL_H

#include <stdint.h>

#include "ganglion/text.h"

/* Node kinds. A UNION is never a frame: pushing one pushes the alternative whose first
 * bytes hold the byte that starts the value. */
enum {
    JG_DOC = 0, /* the bottom frame: one value, then nothing */
    JG_OBJECT,  /* with properties (count > 0) or any keys (count 0, values `child`) */
    JG_ARRAY,   /* items `child`, between min and max of them */
    JG_STRING,  /* between min and max characters */
    JG_NUMBER,
    JG_INTEGER,
    JG_LITS, /* one of `count` literal texts (enum, const, true/false/null) */
    JG_UNION /* one of `count` alternatives */
};

#define JG_NONE 0xFFFFFFFFu

typedef struct jg_node {
    uint8_t kind;
    uint16_t first, count; /* OBJECT: props[first..]; UNION: alts[first..]; LITS: lits[...] */
    uint16_t child;        /* ARRAY: the items' node; OBJECT with count 0: the values' */
    uint32_t min, max;     /* ARRAY: items; STRING: characters (max JG_NONE: no bound) */
    uint64_t req;          /* OBJECT: bit i = property i is required */
    uint8_t firsts[32];    /* bit b: a value of the node may start with byte b */
} jg_node;

typedef struct jg_span {
    uint32_t off, len; /* in the grammar's text */
    uint16_t node;     /* a property's value (unused for literals) */
} jg_span;

#define JG_TEXT_MAX (4u * GANG_JGRAM_MAX_SCHEMA_BYTES)
#define JG_SPANS_MAX (4u * GANG_JGRAM_MAX_NODES)

struct gang_jgram {
    jg_node nodes[GANG_JGRAM_MAX_NODES];
    uint32_t n_nodes;
    uint16_t root;
    uint16_t key;                /* a plain string node: the keys of objects without properties */
    jg_span spans[JG_SPANS_MAX]; /* properties' keys (quoted) and literals */
    uint32_t n_spans;
    uint16_t alts[GANG_JGRAM_MAX_NODES];
    uint32_t n_alts;
    char text[JG_TEXT_MAX];
    uint32_t n_text;
};

/* One frame of the matcher: a value being generated. */
typedef struct jg_frame {
    uint16_t node;
    uint8_t st;    /* the node kind's state; 0: nothing consumed yet */
    uint8_t flags; /* JG_F_* */
    uint16_t a;    /* offset in a key or literal; hex digits of a \u escape */
    int16_t last;  /* OBJECT: the last property generated, -1 none */
    uint32_t n;    /* ARRAY: items; STRING: characters; numbers: digits */
    uint64_t mask; /* candidates among keys or literals */
} jg_frame;

#define JG_F_SPACE 1u /* the optional space was taken */

typedef struct jg_state {
    uint32_t depth;
    jg_frame f[GANG_JGRAM_MAX_FRAMES];
} jg_state;

/* jgram-match.c: the machine. */
void gang__jg_start(const gang_jgram *g, jg_state *s);
/* Feeds one byte: 1 taken, 0 refused (s is then unspecified). */
int gang__jg_feed(const gang_jgram *g, jg_state *s, uint8_t b);
/* Whether what s has consumed is a whole value. */
int gang__jg_can_end(const gang_jgram *g, const jg_state *s);

#endif /* GANGLION_JGRAM_INTERNAL_H */
