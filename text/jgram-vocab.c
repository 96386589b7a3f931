/*
 * The token mask of a grammar over a tokenizer's vocabulary (include/ganglion/text.h,
 * gang_jgram_vocab_*, gang_jgram_mask).
 *
 * The table holds every generatable token's bytes as the decoder makes them in the middle
 * of a text (a ByteLevel token's bytes, a byte-fallback token's one byte, a chain token's
 * text after Replace), sorted, with the length of the prefix each shares with the one
 * before. The mask walks that order keeping one machine state per byte of the current
 * token: a token starts from the state of its shared prefix, and when the previous
 * token was refused inside that prefix it is refused without a byte fed. The cost is
 * about the number of nodes of the vocabulary's trie that the grammar reaches.
 */
#include <stdlib.h>
#include <string.h>

#include "jgram-internal.h"
#include "tok-internal.h"

struct gang_jgram_vocab {
    uint32_t n_ids; /* the tokenizer's ids */
    uint32_t n;     /* entries of the sorted order */
    int32_t *id;    /* [n] token of each entry, sorted by bytes */
    uint32_t *off;  /* [n] its bytes in buf */
    uint8_t *len;   /* [n] */
    uint8_t *lcp;   /* [n] bytes shared with the entry before */
    uint32_t *pos;  /* [n_ids] the entry of an id, UINT32_MAX for none */
    char *buf;
    jg_state st[GANG_JGRAM_MAX_TOKEN_BYTES + 1]; /* the walk's states, by prefix length */
};

/* The token's bytes in the middle of a text; *len 0 for one never generated. */
static const char *jv_bytes(const gang_tokenizer *t, uint32_t id, char *one, uint32_t *len)
{
    *len = 0;
    if (t->text[id] == NULL || t->special[id])
        return NULL;
    if (t->dec_kind == TOK_DEC_CHAIN && t->dec_byte != NULL && t->dec_byte[id] >= 0) {
        one[0] = (char)t->dec_byte[id];
        *len = 1;
        return one;
    }
    if (t->dec_len[id] <= GANG_JGRAM_MAX_TOKEN_BYTES)
        *len = t->dec_len[id];
    return t->dec[id];
}

/* An entry while sorting: its bytes are read through p, so qsort needs no context. */
typedef struct jv_sortent {
    const char *p;
    uint32_t off;
    int32_t id;
    uint8_t len;
} jv_sortent;

static int jv_cmp(const void *a, const void *b)
{
    const jv_sortent *x = a, *y = b;
    uint32_t m = x->len < y->len ? x->len : y->len;
    int c = memcmp(x->p, y->p, m);
    if (c != 0)
        return c;
    return x->len < y->len ? -1 : (x->len > y->len ? 1 : (x->id < y->id ? -1 : 1));
}

/* Fills the entries (unsorted): 0 or GANG_ENOMEM. */
static int jv_fill(gang_jgram_vocab *v, const gang_tokenizer *t)
{
    uint64_t total = 0;
    uint32_t len;
    char one[1];
    for (uint32_t i = 0; i < t->n_ids; i++) {
        jv_bytes(t, i, one, &len);
        total += len;
    }
    v->buf = malloc(total + 1);
    v->id = malloc((size_t)t->n_ids * sizeof(*v->id));
    v->off = malloc((size_t)t->n_ids * sizeof(*v->off));
    v->len = malloc(t->n_ids);
    v->lcp = malloc(t->n_ids);
    v->pos = malloc((size_t)t->n_ids * sizeof(*v->pos));
    if (v->buf == NULL || v->id == NULL || v->off == NULL || v->len == NULL || v->lcp == NULL ||
        v->pos == NULL)
        return GANG_ENOMEM;
    total = 0;
    for (uint32_t i = 0; i < t->n_ids; i++) {
        const char *b = jv_bytes(t, i, one, &len);
        if (len == 0)
            continue;
        memcpy(v->buf + total, b, len);
        v->id[v->n] = (int32_t)i;
        v->off[v->n] = (uint32_t)total;
        v->len[v->n] = (uint8_t)len;
        v->n++;
        total += len;
    }
    return 0;
}

/* Puts the entries in byte order, computes their lcp and the map from ids to entries. */
static int jv_sort(gang_jgram_vocab *v)
{
    jv_sortent *e = malloc((size_t)v->n * sizeof(*e) + 1);
    if (e == NULL)
        return GANG_ENOMEM;
    for (uint32_t i = 0; i < v->n; i++)
        e[i] = (jv_sortent){
            .p = v->buf + v->off[i], .off = v->off[i], .id = v->id[i], .len = v->len[i]};
    qsort(e, v->n, sizeof(*e), jv_cmp);
    for (uint32_t i = 0; i < v->n_ids; i++)
        v->pos[i] = UINT32_MAX;
    for (uint32_t i = 0; i < v->n; i++) {
        v->id[i] = e[i].id;
        v->off[i] = e[i].off;
        v->len[i] = e[i].len;
        v->pos[e[i].id] = i;
        uint32_t k = 0;
        while (i > 0 && k < e[i].len && k < e[i - 1].len && e[i].p[k] == e[i - 1].p[k])
            k++;
        v->lcp[i] = (uint8_t)k;
    }
    free(e);
    return 0;
}

int gang_jgram_vocab_init(const gang_tokenizer *tok, gang_jgram_vocab **out)
{
    if (tok == NULL || out == NULL)
        return GANG_EINVAL;
    gang_jgram_vocab *v = calloc(1, sizeof(*v));
    if (v == NULL)
        return GANG_ENOMEM;
    v->n_ids = tok->n_ids;
    int rc = jv_fill(v, tok);
    if (rc == 0)
        rc = jv_sort(v);
    if (rc != 0) {
        gang_jgram_vocab_free(v);
        return rc;
    }
    *out = v;
    return 0;
}

void gang_jgram_vocab_free(gang_jgram_vocab *v)
{
    if (v == NULL)
        return;
    free(v->id);
    free(v->off);
    free(v->len);
    free(v->lcp);
    free(v->pos);
    free(v->buf);
    free(v);
}

uint32_t gang_jgram_vocab_n_ids(const gang_jgram_vocab *v)
{
    return v != NULL ? v->n_ids : 0;
}

/* Copies the live part of a state. */
static void jv_copy(jg_state *dst, const jg_state *src)
{
    dst->depth = src->depth;
    memcpy(dst->f, src->f, (size_t)src->depth * sizeof(src->f[0]));
}

/* Replays ids[0..n) from the start into v->st[0]. 0 or GANG_EINVAL. */
static int jv_replay(const gang_jgram *g, gang_jgram_vocab *v, const int32_t *ids, uint32_t n)
{
    gang__jg_start(g, &v->st[0]);
    for (uint32_t i = 0; i < n; i++) {
        if (ids[i] < 0 || (uint32_t)ids[i] >= v->n_ids || v->pos[ids[i]] == UINT32_MAX)
            return GANG_EINVAL;
        uint32_t k = v->pos[ids[i]];
        for (uint32_t j = 0; j < v->len[k]; j++)
            if (!gang__jg_feed(g, &v->st[0], (uint8_t)v->buf[v->off[k] + j]))
                return GANG_EINVAL;
    }
    return 0;
}

int gang_jgram_mask(const gang_jgram *g, gang_jgram_vocab *v, const int32_t *ids, uint32_t n,
                    uint8_t *allowed, uint32_t cap, int *can_end)
{
    uint32_t fail = 0, count = 0; /* fail: bytes of the previous entry that were taken */
    if (g == NULL || v == NULL || (ids == NULL && n > 0) || allowed == NULL || can_end == NULL)
        return GANG_EINVAL;
    int rc = jv_replay(g, v, ids, n);
    if (rc != 0)
        return rc;
    memset(allowed, 0, cap);
    *can_end = gang__jg_can_end(g, &v->st[0]);
    for (uint32_t k = 0; k < v->n; k++) {
        uint32_t d = v->lcp[k], len = v->len[k], i;
        if (d > fail) {
            continue; /* the shared prefix was refused: so is this token (fail stays) */
        }
        for (i = d; i < len; i++) {
            jv_copy(&v->st[i + 1], &v->st[i]);
            if (!gang__jg_feed(g, &v->st[i + 1], (uint8_t)v->buf[v->off[k] + i]))
                break;
        }
        fail = i;
        if (i == len && (uint32_t)v->id[k] < cap) {
            allowed[v->id[k]] = 1;
            count++;
        }
    }
    return (int)count;
}
