/*
 * The grammar machine and the token mask (include/ganglion/text.h, gang_jgram_*).
 *
 * The machine is a stack of frames, one per value being generated, fed one byte at a
 * time. A frame either takes the byte, takes it and is finished (popped: a closing
 * quote, brace or bracket, the last byte of the only literal left), asks for a child
 * value to be pushed (the byte then goes to the child), or refuses it. A refused byte
 * ends a frame that may end there (a number, a literal that is a prefix of a longer one)
 * and goes to its parent; otherwise the byte is not allowed. So the machine is
 * deterministic: unions are resolved by the value's first byte (jgram-compile.c checks
 * that they can be).
 *
 * The mask walks the vocabulary sorted by bytes, so tokens that share a prefix share the
 * states of that prefix, and a prefix refused once refuses every token that starts with
 * it without feeding them (the walk of a trie, without building one).
 */
#include <stdlib.h>
#include <string.h>

#include "jgram-internal.h"
#include "tok-internal.h"

enum { JG_TAKE = 0, JG_DONE, JG_PUSH, JG_REFUSE };

static int jg_has_first(const jg_node *n, uint8_t b)
{
    return (n->firsts[b >> 3] >> (b & 7)) & 1u;
}

/* Pushes node (a union: its alternative that starts with b). 0, or GANG_EINVAL. */
static int jg_push(const gang_jgram *g, jg_state *s, uint16_t node, uint8_t b)
{
    const jg_node *n = &g->nodes[node];
    while (n->kind == JG_UNION) {
        uint16_t i = 0;
        while (i < n->count && !jg_has_first(&g->nodes[g->alts[n->first + i]], b))
            i++;
        if (i == n->count)
            return GANG_EINVAL;
        node = g->alts[n->first + i];
        n = &g->nodes[node];
    }
    if (s->depth >= GANG_JGRAM_MAX_FRAMES)
        return GANG_EINVAL;
    jg_frame *f = &s->f[s->depth++];
    memset(f, 0, sizeof(*f));
    f->node = node;
    f->last = -1;
    if (n->kind == JG_LITS)
        f->mask = n->count >= 64 ? ~0ull : (1ull << n->count) - 1;
    return 0;
}

/* Literals: keeps the candidates whose byte at f->a is b. */
static int jg_lits(const gang_jgram *g, const jg_node *n, jg_frame *f, uint8_t b)
{
    uint64_t m = 0;
    int ended = 0, longer = 0;
    for (uint16_t i = 0; i < n->count; i++) {
        const jg_span *sp = &g->spans[n->first + i];
        if (!((f->mask >> i) & 1u) || sp->len <= f->a || (uint8_t)g->text[sp->off + f->a] != b)
            continue;
        m |= 1ull << i;
        if (sp->len == f->a + 1u)
            ended = 1;
        else
            longer = 1;
    }
    if (m == 0)
        return JG_REFUSE;
    f->mask = m;
    f->a++;
    return ended && !longer ? JG_DONE : JG_TAKE;
}

/* Whether a literal frame may end here (some candidate is complete). */
static int jg_lits_end(const gang_jgram *g, const jg_node *n, const jg_frame *f)
{
    for (uint16_t i = 0; i < n->count; i++)
        if (((f->mask >> i) & 1u) && g->spans[n->first + i].len == f->a)
            return 1;
    return 0;
}

/* Strings: st 0 start, 1 body, 2 after '\', 3 in \uXXXX; flags: UTF-8 bytes still due. */
static int jg_string(const jg_node *n, jg_frame *f, uint8_t b)
{
    if (f->st == 0)
        return b == '"' ? (f->st = 1, JG_TAKE) : JG_REFUSE;
    if (f->st == 2) {
        if (b == 'u')
            return f->st = 3, f->a = 0, JG_TAKE;
        return strchr("\"\\/bfnrt", b) != NULL && b != 0 ? (f->st = 1, JG_TAKE) : JG_REFUSE;
    }
    if (f->st == 3) {
        int hex = (b >= '0' && b <= '9') || (b >= 'a' && b <= 'f') || (b >= 'A' && b <= 'F');
        if (!hex)
            return JG_REFUSE;
        if (++f->a == 4)
            f->st = 1;
        return JG_TAKE;
    }
    if (f->flags > 0)
        return b >= 0x80 && b <= 0xBF ? (f->flags--, JG_TAKE) : JG_REFUSE;
    if (b == '"')
        return f->n >= n->min ? JG_DONE : JG_REFUSE;
    if (f->n >= n->max || b < 0x20)
        return JG_REFUSE;
    f->n++;
    if (b == '\\')
        return f->st = 2, JG_TAKE;
    if (b < 0x80)
        return JG_TAKE;
    if (b >= 0xC2 && b <= 0xDF)
        f->flags = 1;
    else if (b >= 0xE0 && b <= 0xEF)
        f->flags = 2;
    else if (b >= 0xF0 && b <= 0xF4)
        f->flags = 3;
    else
        return JG_REFUSE;
    return JG_TAKE;
}

/* Numbers: st 1 after '-', 2 integer digits, 3 a lone 0, 4 after '.', 5 fraction digits. */
static int jg_number(const jg_node *n, jg_frame *f, uint8_t b)
{
    int digit = b >= '0' && b <= '9', frac = n->kind == JG_NUMBER;
    switch (f->st) {
    case 0:
        if (b == '-')
            return f->st = 1, JG_TAKE;
        /* fall through */
    case 1:
        if (!digit)
            return JG_REFUSE;
        f->st = b == '0' ? 3 : 2;
        f->n = 1;
        return JG_TAKE;
    case 2:
        if (digit && f->n < 15)
            return f->n++, JG_TAKE;
        /* fall through */
    case 3:
        return b == '.' && frac ? (f->st = 4, JG_TAKE) : JG_REFUSE;
    case 4:
        return digit ? (f->st = 5, f->n = 1, JG_TAKE) : JG_REFUSE;
    default:
        return digit && f->n < 8 ? (f->n++, JG_TAKE) : JG_REFUSE;
    }
}

/* Object with properties: the keys it may generate next (in order, none required
 * skipped). */
static uint64_t jg_next_keys(const jg_node *n, int last)
{
    uint64_t m = 0;
    for (int j = last + 1; j < n->count; j++) {
        m |= 1ull << j;
        if ((n->req >> j) & 1u)
            break;
    }
    return m;
}

static int jg_close_ok(const jg_node *n, int last)
{
    return last + 1 >= 64 || (n->req >> (last + 1)) == 0;
}

/*
 * Objects: st 0 start, 1 after '{', 2 in a listed key, 3 before ':', 4 after ':', 5 after
 * a value, 6 after ',', 7 a value running, 8 a generic key running. *push: the child.
 */
static int jg_object(const gang_jgram *g, const jg_node *n, jg_frame *f, uint8_t b, uint16_t *push)
{
    switch (f->st) {
    case 0:
        return b == '{' ? (f->st = 1, JG_TAKE) : JG_REFUSE;
    case 1:
    case 6:
        if (b == ' ' && f->st == 6 && !(f->flags & JG_F_SPACE))
            return f->flags |= JG_F_SPACE, JG_TAKE;
        if (b == '}' && f->st == 1)
            return n->min == 0 && (n->count == 0 || jg_close_ok(n, f->last)) ? JG_DONE : JG_REFUSE;
        if (b != '"')
            return JG_REFUSE;
        if (n->count == 0)
            return f->st = 8, *push = g->key, JG_PUSH;
        f->mask = jg_next_keys(n, f->last);
        f->a = 0;
        f->st = 2; /* and the quote is the key's first byte: */
        /* fall through */
    case 2: {
        uint64_t m = 0;
        for (uint16_t i = 0; i < n->count; i++) {
            const jg_span *k = &g->spans[n->first + i];
            if (((f->mask >> i) & 1u) && k->len > f->a && (uint8_t)g->text[k->off + f->a] == b)
                m |= 1ull << i;
        }
        if (m == 0)
            return JG_REFUSE;
        f->mask = m;
        f->a++;
        for (uint16_t i = 0; i < n->count; i++)
            if (((m >> i) & 1u) && g->spans[n->first + i].len == f->a)
                f->last = (int16_t)i, f->st = 3; /* keys are quoted: at most one ends */
        return JG_TAKE;
    }
    case 3:
        return b == ':' ? (f->st = 4, f->flags = 0, JG_TAKE) : JG_REFUSE;
    case 4:
        if (b == ' ' && !(f->flags & JG_F_SPACE))
            return f->flags |= JG_F_SPACE, JG_TAKE;
        *push = n->count == 0 ? n->child : g->spans[n->first + f->last].node;
        f->st = 7;
        return JG_PUSH;
    case 5:
        if (b == '}')
            return f->n >= n->min && (n->count == 0 || jg_close_ok(n, f->last)) ? JG_DONE
                                                                                : JG_REFUSE;
        if (b == ',' && f->n < n->max && (n->count == 0 || jg_next_keys(n, f->last) != 0))
            return f->st = 6, f->flags = 0, JG_TAKE;
        return JG_REFUSE;
    default:
        return JG_REFUSE;
    }
}

/* Arrays: st 0 start, 1 after '[', 5 after an item, 6 after ',', 7 an item running. */
static int jg_array(const jg_node *n, jg_frame *f, uint8_t b, uint16_t *push)
{
    switch (f->st) {
    case 0:
        return b == '[' ? (f->st = 1, JG_TAKE) : JG_REFUSE;
    case 1:
        if (b == ']')
            return f->n >= n->min ? JG_DONE : JG_REFUSE;
        if (n->max == 0)
            return JG_REFUSE;
        return f->st = 7, *push = n->child, JG_PUSH;
    case 5:
        if (b == ']')
            return f->n >= n->min ? JG_DONE : JG_REFUSE;
        if (b == ',' && f->n < n->max)
            return f->st = 6, f->flags = 0, JG_TAKE;
        return JG_REFUSE;
    case 6:
        if (b == ' ' && !(f->flags & JG_F_SPACE))
            return f->flags |= JG_F_SPACE, JG_TAKE;
        return f->st = 7, *push = n->child, JG_PUSH;
    default:
        return JG_REFUSE;
    }
}

/* One byte to frame f: JG_TAKE, JG_DONE, JG_PUSH (*push) or JG_REFUSE. */
static int jg_step(const gang_jgram *g, jg_state *s, jg_frame *f, uint8_t b, uint16_t *push)
{
    const jg_node *n = &g->nodes[f->node];
    if (s->depth == 1) /* the document */
        return f->st == 0 ? (f->st = 1, *push = g->root, JG_PUSH) : JG_REFUSE;
    switch (n->kind) {
    case JG_OBJECT:
        return jg_object(g, n, f, b, push);
    case JG_ARRAY:
        return jg_array(n, f, b, push);
    case JG_STRING:
        return jg_string(n, f, b);
    case JG_NUMBER:
    case JG_INTEGER:
        return jg_number(n, f, b);
    case JG_LITS:
        return jg_lits(g, n, f, b);
    default:
        return JG_REFUSE;
    }
}

/* Whether frame f may end where it is (numbers, literals; the others end by popping). */
static int jg_frame_end(const gang_jgram *g, const jg_frame *f)
{
    const jg_node *n = &g->nodes[f->node];
    if (n->kind == JG_NUMBER || n->kind == JG_INTEGER)
        return f->st == 2 || f->st == 3 || f->st == 5;
    if (n->kind == JG_LITS)
        return jg_lits_end(g, n, f);
    return 0;
}

/* Pops the top frame; its parent moves past the child value. */
static void jg_pop(jg_state *s)
{
    jg_frame *p = &s->f[--s->depth - 1];
    if (p->st == 7) {
        p->st = 5;
        p->n++;
    } else if (p->st == 8) {
        p->st = 3;
    }
}

void gang__jg_start(const gang_jgram *g, jg_state *s)
{
    (void)g;
    memset(&s->f[0], 0, sizeof(s->f[0]));
    s->f[0].node = g->root;
    s->depth = 1;
}

int gang__jg_feed(const gang_jgram *g, jg_state *s, uint8_t b)
{
    for (;;) {
        if (s->depth == 0)
            return 0;
        jg_frame *f = &s->f[s->depth - 1];
        uint16_t push = 0;
        int r = jg_step(g, s, f, b, &push);
        if (r == JG_TAKE)
            return 1;
        if (r == JG_DONE) {
            jg_pop(s);
            return 1;
        }
        if (r == JG_PUSH) {
            if (jg_push(g, s, push, b) != 0)
                return 0;
            continue;
        }
        if (s->depth == 1 || !jg_frame_end(g, f))
            return 0;
        jg_pop(s);
    }
}

int gang__jg_can_end(const gang_jgram *g, const jg_state *s)
{
    uint32_t d = s->depth;
    for (; d > 1; d--)
        if (!jg_frame_end(g, &s->f[d - 1]))
            return 0;
    /* every frame above the document may end: a lone number or literal at most */
    return s->depth == 1 ? s->f[0].st == 1 : s->depth == 2;
}

int gang_jgram_check(const gang_jgram *g, const char *text, size_t len)
{
    jg_state s;
    gang__jg_start(g, &s);
    for (size_t i = 0; i < len; i++)
        if (!gang__jg_feed(g, &s, (uint8_t)text[i]))
            return 0;
    return gang__jg_can_end(g, &s) ? 2 : 1;
}
