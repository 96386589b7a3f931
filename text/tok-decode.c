/*
 * Incremental decoding. ByteLevel: each id's bytes (precomputed at load, tok-load.c)
 * pass through a UTF-8 state machine that emits whole characters, holds back the prefix
 * of an incomplete one, and turns every maximal invalid subpart into one U+FFFD, the
 * replacement practice of Python's and Rust's lossy decoders. A decoder chain (a Sequence):
 * texts after the per-token rules come out as they are (through the same UTF-8 machine
 * when the chain has a ByteLevel), runs of byte-fallback tokens are held until they end
 * (valid UTF-8, or one U+FFFD per byte, as tokenizers' ByteFallback), and the leading Strip
 * (or Metaspace's leading space) drops its characters from the start of the stream. Concatenated
 * steps and the final flush therefore equal the decode of all the ids at once.
 */
#include <string.h>

#include "tok-internal.h"

void gang_tok_decoder_init(gang_tok_decoder *d, const gang_tokenizer *tok, bool skip_special)
{
    memset(d, 0, sizeof(*d));
    d->tok = tok;
    d->skip_special = skip_special;
}

/* How many bytes follow lead byte B (0 for ASCII, -1 for a byte that cannot lead). */
static int tok_need(unsigned char b)
{
    if (b < 0x80)
        return 0;
    if (b >= 0xC2 && b <= 0xDF)
        return 1;
    if (b >= 0xE0 && b <= 0xEF)
        return 2;
    if (b >= 0xF0 && b <= 0xF4)
        return 3;
    return -1;
}

/* Whether B may be the continuation byte number POS (1-based) after lead byte LEAD. */
static bool tok_cont_ok(unsigned char lead, unsigned pos, unsigned char b)
{
    unsigned char lo = 0x80, hi = 0xBF;
    if (pos == 1) {
        if (lead == 0xE0)
            lo = 0xA0;
        else if (lead == 0xED)
            hi = 0x9F;
        else if (lead == 0xF0)
            lo = 0x90;
        else if (lead == 0xF4)
            hi = 0x8F;
    }
    return b >= lo && b <= hi;
}

static void tok_emit(char *out, size_t *k, const void *src, size_t n)
{
    memcpy(out + *k, src, n);
    *k += n;
}

static const char tok_fffd[3] = {(char)0xEF, (char)0xBF, (char)0xBD};

/* Feeds bytes b[0..n) through the state machine into out (room checked by the caller). */
static void tok_feed(gang_tok_decoder *d, const unsigned char *b, size_t n, char *out, size_t *k)
{
    for (size_t i = 0; i < n; i++) {
        unsigned char c = b[i];
        if (d->npend) {
            if (tok_cont_ok(d->pend[0], d->npend, c)) {
                d->pend[d->npend++] = c;
                if ((int)d->npend == tok_need(d->pend[0]) + 1) {
                    tok_emit(out, k, d->pend, d->npend);
                    d->npend = 0;
                }
                continue;
            }
            tok_emit(out, k, tok_fffd, 3); /* the held prefix is a maximal invalid part */
            d->npend = 0;
        }
        int need = tok_need(c);
        if (need == 0)
            out[(*k)++] = (char)c;
        else if (need < 0)
            tok_emit(out, k, tok_fffd, 3);
        else
            d->pend[d->npend++] = c;
    }
}

/* Chain: appends text to out with the leading Strip applied. */
static void tok_chain_emit(gang_tok_decoder *d, const char *s, size_t len, char *out, size_t *k)
{
    const gang_tokenizer *t = d->tok;
    size_t sl = strlen(t->strip_char);
    while (!d->started && sl && d->nstripped < t->strip_start && len >= sl &&
           memcmp(s, t->strip_char, sl) == 0) {
        s += sl;
        len -= sl;
        d->nstripped++;
    }
    if (len)
        d->started = true;
    if (t->dec_utf8) /* a ByteLevel in the chain made bytes, maybe part of a character */
        tok_feed(d, (const unsigned char *)s, len, out, k);
    else
        tok_emit(out, k, s, len);
}

/* Chain: lets the held run of byte-fallback bytes out: its text when it is valid UTF-8,
 * else one U+FFFD per byte. */
static void tok_chain_run(gang_tok_decoder *d, char *out, size_t *k)
{
    if (!d->nrun)
        return;
    if (gang__tok_utf8_valid((const char *)d->run, d->nrun)) {
        tok_chain_emit(d, (const char *)d->run, d->nrun, out, k);
    } else {
        for (unsigned i = 0; i < d->nrun; i++)
            tok_chain_emit(d, tok_fffd, 3, out, k);
    }
    d->nrun = 0;
}

int gang_tokenizer_decode_step(gang_tok_decoder *d, int32_t id, char *out, size_t cap, size_t *n)
{
    if (n)
        *n = 0;
    if (!d || !d->tok || !n || (!out && cap))
        return GANG_EINVAL;
    const gang_tokenizer *t = d->tok;
    if (id < 0 || (uint32_t)id >= t->n_ids)
        return GANG_EINVAL;
    if (!t->text[id] || (d->skip_special && t->special[id]))
        return 0;
    size_t len = t->dec_len[id];
    if (cap < 3 * len + GANG_TOK_DECODE_SLACK)
        return GANG_ERANGE;
    size_t k = 0;
    if (t->dec_kind == TOK_DEC_BYTELEVEL) {
        tok_feed(d, (const unsigned char *)t->dec[id], len, out, &k);
    } else if (t->dec_byte && t->dec_byte[id] >= 0) {
        if (d->nrun == GANG_TOK_DEC_RUN)
            tok_chain_run(d, out, &k);
        d->run[d->nrun++] = (unsigned char)t->dec_byte[id];
    } else {
        tok_chain_run(d, out, &k);
        tok_chain_emit(d, t->dec[id], len, out, &k);
    }
    *n = k;
    return 0;
}

int gang_tokenizer_decode_flush(gang_tok_decoder *d, char *out, size_t cap, size_t *n)
{
    if (n)
        *n = 0;
    if (!d || !d->tok || !n || (!out && cap))
        return GANG_EINVAL;
    if (cap < GANG_TOK_DECODE_SLACK)
        return GANG_ERANGE;
    size_t k = 0;
    if (d->tok->dec_kind == TOK_DEC_CHAIN)
        tok_chain_run(d, out, &k);
    if (d->npend) {
        tok_emit(out, &k, tok_fffd, 3);
        d->npend = 0;
    }
    *n = k;
    return 0;
}
