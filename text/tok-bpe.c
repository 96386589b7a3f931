/*
 * The BPE model: the merge table and the merging of one pre-token word. A word's symbols
 * form a linked list; candidate merges sit in a binary min-heap ordered by (rank,
 * position), so a word of n symbols costs O(n log n) whatever its content. A popped
 * candidate whose pair no longer exists is skipped, which yields the same result as
 * repeatedly merging the lowest-ranked leftmost pair.
 */
#include <stdlib.h>
#include <string.h>

#include "tok-internal.h"

static uint64_t tok_pair_key(int32_t a, int32_t b)
{
    return (((uint64_t)(uint32_t)a << 32) | (uint32_t)b) + 1;
}

int gang__tok_merge_put(gang_tokenizer *t, int32_t a, int32_t b, uint32_t rank, int32_t merged)
{
    uint64_t key = tok_pair_key(a, b);
    uint64_t i = gang__tok_mix64(key ^ t->seed) & t->mmask;
    while (t->mkey[i] && t->mkey[i] != key)
        i = (i + 1) & t->mmask;
    /* A repeated pair takes the later rank, as tokenizers' map does. */
    t->mkey[i] = key;
    t->mrank[i] = rank;
    t->mnew[i] = merged;
    return 0;
}

/* The merge of (a, b): its slot, or -1. */
static int64_t tok_merge_get(const gang_tokenizer *t, int32_t a, int32_t b)
{
    uint64_t key = tok_pair_key(a, b);
    for (uint64_t i = gang__tok_mix64(key ^ t->seed) & t->mmask;; i = (i + 1) & t->mmask) {
        if (!t->mkey[i])
            return -1;
        if (t->mkey[i] == key)
            return (int64_t)i;
    }
}

void gang__tok_out_push(gang__tok_out *o, int32_t id)
{
    if (o->n < o->cap)
        o->ids[o->n] = id;
    o->n++;
}

typedef struct tok_sym {
    int32_t id;
    int32_t prev, next; /* -1 at the ends */
    uint32_t len;       /* 0: merged into its left neighbour */
} tok_sym;

typedef struct tok_cand {
    uint32_t rank;
    uint32_t pos;
    int32_t merged;
} tok_cand;

static bool tok_cand_less(const tok_cand *x, const tok_cand *y)
{
    return x->rank != y->rank ? x->rank < y->rank : x->pos < y->pos;
}

static void tok_heap_push(tok_cand *h, size_t *n, tok_cand c)
{
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!tok_cand_less(&c, &h[p]))
            break;
        h[i] = h[p];
        i = p;
    }
    h[i] = c;
}

static tok_cand tok_heap_pop(tok_cand *h, size_t *n)
{
    tok_cand top = h[0], last = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n)
            break;
        if (c + 1 < *n && tok_cand_less(&h[c + 1], &h[c]))
            c++;
        if (!tok_cand_less(&h[c], &last))
            break;
        h[i] = h[c];
        i = c;
    }
    if (*n)
        h[i] = last;
    return top;
}

/* Pushes the candidate merge of symbol POS with its right neighbour, if there is one. */
static void tok_cand_add(const gang_tokenizer *t, const tok_sym *s, int32_t pos, tok_cand *h,
                         size_t *nh)
{
    if (pos < 0 || s[pos].next < 0)
        return;
    int64_t slot = tok_merge_get(t, s[pos].id, s[s[pos].next].id);
    if (slot >= 0)
        tok_heap_push(h, nh, (tok_cand){t->mrank[slot], (uint32_t)pos, t->mnew[slot]});
}

/* Splits w into initial symbols: each character that is a token, else its <0xXX> tokens
 * (byte_fallback), else the unknown token (fused when fuse_unk), else nothing. The order
 * of tokenizers is kept: a pending unknown is flushed only by a known character. */
static size_t tok_initial(const gang_tokenizer *t, const char *w, size_t len, tok_sym *s)
{
    size_t n = 0;
    int32_t unk_len = -1;
    for (size_t i = 0; i < len;) {
        uint32_t cp;
        unsigned cl = gang__tok_utf8_next(w + i, len - i, &cp);
        int32_t id = gang__tok_lookup(t, w + i, cl);
        if (id >= 0) {
            if (unk_len >= 0)
                s[n++] = (tok_sym){t->unk_id, 0, 0, (uint32_t)unk_len};
            unk_len = -1;
            s[n++] = (tok_sym){id, 0, 0, cl};
        } else {
            bool all = t->byte_fallback;
            for (unsigned k = 0; all && k < cl; k++)
                all = t->byte_ids[(unsigned char)w[i + k]] >= 0;
            if (all) {
                for (unsigned k = 0; k < cl; k++)
                    s[n++] = (tok_sym){t->byte_ids[(unsigned char)w[i + k]], 0, 0, 1};
            } else if (t->unk_id >= 0) {
                if (unk_len >= 0 && !t->fuse_unk) {
                    s[n++] = (tok_sym){t->unk_id, 0, 0, (uint32_t)unk_len};
                    unk_len = 0;
                }
                unk_len = (unk_len < 0 ? 0 : unk_len) + (int32_t)cl;
            }
        }
        i += cl;
    }
    if (unk_len >= 0)
        s[n++] = (tok_sym){t->unk_id, 0, 0, (uint32_t)unk_len};
    return n;
}

int gang__tok_bpe_word(const gang_tokenizer *t, const char *w, size_t len, gang__tok_out *o)
{
    if (len == 0)
        return 0;
    if (t->ignore_merges) {
        int32_t id = gang__tok_lookup(t, w, len);
        if (id >= 0) {
            gang__tok_out_push(o, id);
            return 0;
        }
    }
    /* At most one symbol per byte (byte fallback), and one candidate per merge or
     * symbol: each merge pushes at most two. */
    tok_sym *s = malloc(len * sizeof(*s));
    tok_cand *h = malloc(3 * len * sizeof(*h));
    if (!s || !h) {
        free(s);
        free(h);
        return GANG_ENOMEM;
    }
    size_t n = tok_initial(t, w, len, s), nh = 0;
    for (size_t i = 0; i < n; i++) {
        s[i].prev = (int32_t)i - 1;
        s[i].next = i + 1 < n ? (int32_t)i + 1 : -1;
    }
    for (size_t i = 0; i + 1 < n; i++)
        tok_cand_add(t, s, (int32_t)i, h, &nh);
    while (nh) {
        tok_cand c = tok_heap_pop(h, &nh);
        tok_sym *l = &s[c.pos];
        if (l->len == 0 || l->next < 0)
            continue;
        tok_sym *r = &s[l->next];
        int64_t slot = tok_merge_get(t, l->id, r->id);
        if (slot < 0 || t->mnew[slot] != c.merged)
            continue;
        l->id = c.merged;
        l->len += r->len;
        r->len = 0;
        l->next = r->next;
        if (l->next >= 0)
            s[l->next].prev = (int32_t)c.pos;
        tok_cand_add(t, s, l->prev, h, &nh);
        tok_cand_add(t, s, (int32_t)c.pos, h, &nh);
    }
    for (int32_t i = n ? 0 : -1; i >= 0; i = s[i].next)
        gang__tok_out_push(o, s[i].id);
    free(s);
    free(h);
    return 0;
}
