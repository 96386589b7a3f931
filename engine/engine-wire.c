/*
 * The plan's wire form: what rank 0 broadcasts to every rank each step, described once
 * with the common codec (gang_codec) for both directions, and the validation every rank
 * applies on receipt (a plan is input from another process: a rank refuses one that does
 * not fit its own bounds instead of indexing past them).
 *
 * Layout, little-endian (broadcast over the world communicator as int32 words in two
 * parts: the header, then the body, whose size the header gives, rounded up to words and
 * padded with zeros):
 *   header (GANG__PLAN_HDR_WORDS u32): magic, n_seq, n_tokens, n_table, body_bytes
 *   body:  n_seq entries (plan_seq_fields: u32 slot, pos0, n, sample, n_prompt, then the
 *          request's sampling as gang_sampling_codec writes it, then u16 g_len and the
 *          grammar's g_len bytes (0 but on the first sampling entry of a request with a
 *          grammar after its admission): GANG__PLAN_SEQ_MIN_BYTES to
 *          GANG__PLAN_SEQ_MAX_BYTES),
 *          then the n_tokens token ids, sequence after sequence,
 *          then the n_table block ids: each sequence's block table for positions
 *          0 .. pos0 + n - 1 (ceil((pos0 + n) / block_size) entries), sequence after
 *          sequence. Every rank keeps the tables (host and tensor memory) from the plans
 *          it receives.
 *          then the step's flags (u8: bit 0 the P/D poll, bit 1 no graphs) and its
 *          P/D transfer (gang__plan_kv_fields): u8 kind, and
 *          unless it is none u8 job, u64 id, u32 n, n block ids, u16 port, u8 length +
 *          host, the source gang's layout (gang_kv_layout_codec).
 * The header has a fixed size, so every rank can validate the body's size against its
 * own bounds before receiving it.
 */
#include <math.h>
#include <string.h>

#include "engine-internal.h"

void gang__plan_hdr_fields(gang_codec *c, gang__plan_hdr *h)
{
    gang_codec_u32(c, &h->magic);
    gang_codec_u32(c, &h->n_seq);
    gang_codec_u32(c, &h->n_tokens);
    gang_codec_u32(c, &h->n_table);
    gang_codec_u32(c, &h->body_bytes);
}

/*
 * An entry's grammar: a u16 length and the text. Decoding points g_wire into the received
 * plan instead of copying (the plan buffer outlives the decode; the sampling rank
 * compiles it at once), so it reads the cursor's bytes directly, bounds first.
 */
static void plan_grammar_fields(gang_codec *c, gang__plan_seq *s)
{
    gang_codec_uint(c, &s->g_len, 2, GANG_GRAMMAR_MAX_BYTES);
    if (!gang_codec_ok(c) || s->g_len == 0)
        return;
    if (!c->decoding) {
        gang_codec_bytes(c, s->g_text, s->g_len);
        return;
    }
    if (s->g_len > c->cap - c->off) {
        gang_codec_fail(c, GANG_EPROTO);
        return;
    }
    s->g_wire = (const char *)c->rbuf + c->off;
    c->off += s->g_len;
}

/* One entry of the body; the flags' bounds are the codec's, the rest the validator's. */
static void plan_seq_fields(gang_codec *c, gang__plan_seq *s)
{
    gang_codec_u32(c, &s->slot);
    gang_codec_u32(c, &s->pos0);
    gang_codec_u32(c, &s->n);
    gang_codec_uint(c, &s->sample, 4, 1);
    gang_codec_u32(c, &s->n_prompt);
    gang_sampling_codec(c, &s->sp);
    plan_grammar_fields(c, s);
}

/*
 * The block tables of the body: tables holds sequence i's table at tables[i * max_bps];
 * its length follows from the entry, so a decoder checks the entries before the tables
 * are walked (and a table longer than max_bps is refused either way).
 */
static void plan_tables_fields(gang_codec *c, const gang_engine *e, const gang__plan_seq *seqs,
                               uint32_t n_seq, int32_t *tables)
{
    for (uint32_t i = 0; i < n_seq && gang_codec_ok(c); i++) {
        const gang__plan_seq *s = &seqs[i];
        uint64_t end = (uint64_t)s->pos0 + s->n;
        uint64_t nb = (end + e->block_size - 1) / e->block_size;

        if (nb > e->max_bps) {
            gang_codec_fail(c, c->decoding ? GANG_EPROTO : GANG_EINVAL);
            return;
        }
        gang_codec_i32_array(c, tables + (size_t)i * e->max_bps, (size_t)nb);
    }
}

/* The step's flags, one byte: bit 0 kv_poll, bit 1 no_graphs. */
static void plan_flags_fields(gang_codec *c, gang__plan *p)
{
    uint32_t f = (p->kv_poll ? 1u : 0u) | (p->no_graphs ? 2u : 0u);

    gang_codec_uint(c, &f, 1, 3);
    if (c->decoding && gang_codec_ok(c)) {
        p->kv_poll = f & 1u;
        p->no_graphs = f >> 1;
    }
}

void gang__plan_kv_fields(gang_codec *c, const gang_engine *e, gang__plan *p)
{
    plan_flags_fields(c, p);
    gang_codec_uint(c, &p->kv_kind, 1, GANG__KV_COMMIT);
    if (!gang_codec_ok(c) || p->kv_kind == GANG__KV_NONE)
        return;
    gang_codec_uint(c, &p->kv_job, 1, GANG__KV_JOBS - 1);
    gang_codec_u64(c, &p->kv.id);
    gang_codec_i32_list(c, &p->kv_n, 4, p->kv_blocks, e->max_bps);
    gang_codec_uint(c, &p->kv.port, 2, 65535);
    gang_codec_str(c, p->kv.host, sizeof(p->kv.host), 1);
    gang_kv_layout_codec(c, &p->kv.src);
}

int gang__plan_write(const gang_engine *e, const gang__plan *p, int32_t *tables, int32_t *buf,
                     uint32_t *body_words)
{
    gang__plan_hdr h = {.magic = GANG__PLAN_MAGIC, .n_seq = p->n_seq, .n_tokens = p->n_tokens};
    const size_t hdr_bytes = GANG__PLAN_HDR_WORDS * sizeof(int32_t);
    size_t cap = (GANG__PLAN_HDR_WORDS + e->plan_max_words) * sizeof(int32_t), len = 0;
    gang_codec c;
    int rc;

    if (p->n_seq > e->slots || p->n_tokens > e->max_tokens)
        return GANG_EINVAL;
    for (uint32_t i = 0; i < p->n_seq; i++)
        h.n_table += gang__blocks_for(e, p->seqs[i].pos0 + p->seqs[i].n);
    /* The body first, after the header's room, to learn its size; then the header. The
     * encoder only reads through p and tables. */
    gang_codec_encoder(&c, (uint8_t *)buf + hdr_bytes, cap - hdr_bytes);
    for (uint32_t i = 0; i < p->n_seq; i++)
        plan_seq_fields(&c, &p->seqs[i]);
    gang_codec_i32_array(&c, p->tokens, p->n_tokens);
    plan_tables_fields(&c, e, p->seqs, p->n_seq, tables);
    gang__plan kp = {.kv_kind = p->kv_kind,
                     .kv_job = p->kv_job,
                     .kv_poll = p->kv_poll,
                     .no_graphs = p->no_graphs,
                     .kv_n = p->kv_n,
                     .kv_blocks = p->kv_blocks,
                     .kv = p->kv}; /* (the codec's walk writes: it encodes from a copy) */
    gang__plan_kv_fields(&c, e, &kp);
    rc = gang_codec_finish(&c, &len);
    if (rc != 0)
        return rc == GANG_EMSGSIZE ? GANG_EINTERNAL : rc; /* plan_max_words is too small */
    h.body_bytes = (uint32_t)len;
    memset((uint8_t *)buf + hdr_bytes + len, 0, (4 - len % 4) % 4);
    gang_codec_encoder(&c, buf, hdr_bytes);
    gang__plan_hdr_fields(&c, &h);
    rc = gang_codec_finish(&c, NULL);
    if (rc != 0)
        return rc;
    *body_words = (h.body_bytes + 3) / 4;
    return 0;
}

uint32_t gang__plan_encode(gang_engine *e)
{
    const gang__plan *p = &e->plan;
    uint32_t body = 0;

    /* Whether the step may be a graph is rank 0's to say, so every rank says the same. */
    e->plan.no_graphs = e->graphs_off;
    /* Rank 0's tables are by slot; the wire has them by sequence. */
    for (uint32_t i = 0; i < p->n_seq; i++)
        memcpy(e->wire_tables + (size_t)i * e->max_bps,
               e->tables + (size_t)p->seqs[i].slot * e->max_bps, e->max_bps * sizeof(int32_t));
    /* Rank 0's scheduler keeps its plans within the bounds the encoder checks. */
    if (gang__plan_write(e, p, e->wire_tables, e->plan_buf, &body) != 0)
        return 0;
    return body;
}

int gang__plan_check_header(const gang_engine *e, const int32_t *hdr, uint32_t *body_words)
{
    gang__plan_hdr h;
    gang_codec c;

    gang_codec_decoder(&c, hdr, GANG__PLAN_HDR_WORDS * sizeof(int32_t));
    gang__plan_hdr_fields(&c, &h);
    if (gang_codec_finish(&c, NULL) != 0)
        return GANG_EPROTO;
    if (h.magic != GANG__PLAN_MAGIC || h.n_seq > e->slots || h.n_tokens > e->max_tokens)
        return GANG_EPROTO;
    if ((uint64_t)h.n_table > (uint64_t)h.n_seq * e->max_bps)
        return GANG_EPROTO;
    /* The entries' sizes vary with their stop lists; tokens and tables are words. */
    uint64_t fixed = 4 * ((uint64_t)h.n_tokens + h.n_table);
    if (h.n_tokens < h.n_seq ||
        h.body_bytes < fixed + (uint64_t)h.n_seq * GANG__PLAN_SEQ_MIN_BYTES + 1u ||
        h.body_bytes > fixed + (uint64_t)h.n_seq * GANG__PLAN_SEQ_MAX_BYTES +
                           GANG__PLAN_KV_MAX_BYTES(e->max_bps))
        return GANG_EPROTO;
    *body_words = (h.body_bytes + 3) / 4;
    return 0;
}

/*
 * Checks one decoded entry (sequence i, its tokens from offset off of n_tokens) against
 * this rank's bounds: everything that sizes a buffer or indexes one. 0 or GANG_EPROTO.
 */
static int plan_entry_ok(gang_engine *e, const gang__plan_seq *s, uint32_t off, uint32_t n_tokens)
{
    if (s->slot >= e->slots || e->slot_seen[s->slot] || s->n == 0)
        return GANG_EPROTO;
    if (s->n > n_tokens - off || s->pos0 > e->max_ctx || s->n > e->max_ctx - s->pos0)
        return GANG_EPROTO;
    if (!(s->sp.temperature >= 0.0f) || !isfinite(s->sp.temperature) ||
        !(s->sp.top_p > 0.0f && s->sp.top_p <= 1.0f) || !gang__penalties_ok(&s->sp))
        return GANG_EPROTO;
    /* A grammar comes with the sampling entry of a request that has one, as it is. */
    if (s->g_len != 0 && (!s->sample || s->g_len != s->sp.grammar_bytes))
        return GANG_EPROTO;
    /* The penalties read the slot's history below the sampled position. */
    if (s->n_prompt > e->max_ctx || (!s->sp.logprobs && s->sp.top_logprobs != 0) ||
        (s->sample && (s->n_prompt == 0 || s->n_prompt > s->pos0 + s->n)))
        return GANG_EPROTO;
    return 0;
}

/*
 * The tables of a decoded plan (in e->wire_tables, by sequence): every block in the pool,
 * and a block this step writes (one holding positions pos0 .. pos0 + n - 1 of its
 * sequence) in no other sequence of the step, not even to be read (a cached prefix block
 * shared by several sequences is only read). block_seen: 1 + the sequence writing a
 * block. 0 or GANG_EPROTO.
 */
static int plan_tables_ok(gang_engine *e, const gang__plan_seq *seqs, uint32_t n_seq)
{
    memset(e->block_seen, 0, (size_t)e->n_blocks * sizeof(*e->block_seen));
    for (uint32_t i = 0; i < n_seq; i++) {
        const int32_t *w = e->wire_tables + (size_t)i * e->max_bps;
        uint32_t nb = gang__blocks_for(e, seqs[i].pos0 + seqs[i].n);

        for (uint32_t j = 0; j < nb; j++) {
            if (w[j] < 0 || (uint32_t)w[j] >= e->n_blocks)
                return GANG_EPROTO;
            if (j >= seqs[i].pos0 / e->block_size) {
                if (e->block_seen[w[j]] != 0)
                    return GANG_EPROTO;
                e->block_seen[w[j]] = i + 1;
            }
        }
    }
    for (uint32_t i = 0; i < n_seq; i++) {
        const int32_t *w = e->wire_tables + (size_t)i * e->max_bps;
        uint32_t nb = gang__blocks_for(e, seqs[i].pos0 + seqs[i].n);

        for (uint32_t j = 0; j < nb; j++)
            if (e->block_seen[w[j]] != 0 && e->block_seen[w[j]] != i + 1)
                return GANG_EPROTO;
    }
    return 0;
}

int gang__plan_decode(gang_engine *e)
{
    gang__plan *p = &e->plan;
    gang__plan_hdr h;
    gang_codec c;
    uint32_t i, off = 0, tab = 0;
    size_t len;

    uint32_t words;

    if (gang__plan_check_header(e, e->plan_buf, &words) != 0)
        return GANG_EPROTO;
    gang_codec_decoder(&c, e->plan_buf, GANG__PLAN_HDR_WORDS * sizeof(int32_t));
    gang__plan_hdr_fields(&c, &h);
    /* The body is exactly body_bytes: the padding to a word is not part of it. */
    len = GANG__PLAN_HDR_WORDS * sizeof(int32_t) + h.body_bytes;
    gang_codec_decoder(&c, e->plan_buf, len);
    gang__plan_hdr_fields(&c, &h);
    memset(e->slot_seen, 0, e->slots);
    for (i = 0; i < h.n_seq; i++) {
        gang__plan_seq *s = &p->seqs[i];

        plan_seq_fields(&c, s);
        if (!gang_codec_ok(&c) || plan_entry_ok(e, s, off, h.n_tokens) != 0)
            return GANG_EPROTO;
        e->slot_seen[s->slot] = 1;
        /* The sampling rank keeps the grammar by slot for the request's later draws. */
        if (s->g_len != 0 && e->is_last && e->m->place.tp_rank == 0 &&
            gang__sampler_grammar(&e->sampler, e->slots, s->slot, s->g_wire, s->g_len) != 0)
            return GANG_ENOMEM;
        s->tok_off = off;
        p->seq_tokens[i] = s->n;
        p->seq_pos0[i] = s->pos0;
        p->out[i] = -1;
        off += s->n;
        tab += gang__blocks_for(e, s->pos0 + s->n);
    }
    /* The entries' tokens and tables must be what the header announced. */
    if (off != h.n_tokens || tab != h.n_table)
        return GANG_EPROTO;
    gang_codec_i32_array(&c, p->tokens, h.n_tokens);
    plan_tables_fields(&c, e, p->seqs, h.n_seq, e->wire_tables);
    gang__plan_kv_fields(&c, e, p);
    if (gang_codec_finish(&c, NULL) != 0)
        return GANG_EPROTO;
    /* A transfer names blocks of the pool, none twice, none this step writes. */
    for (i = 0; i < p->kv_n && p->kv_kind != GANG__KV_NONE; i++) {
        if (p->kv_blocks[i] < 0 || (uint32_t)p->kv_blocks[i] >= e->n_blocks)
            return GANG_EPROTO;
    }
    for (i = 0; i < h.n_tokens; i++) {
        if (p->tokens[i] < 0 || (uint32_t)p->tokens[i] >= e->vocab)
            return GANG_EPROTO;
    }
    if (plan_tables_ok(e, p->seqs, h.n_seq) != 0)
        return GANG_EPROTO;
    /* (On rank 0, the entries its scheduler wrote there.) */
    p->n_seq = h.n_seq;
    for (i = 0; i < p->n_seq; i++)
        memcpy(e->tables + (size_t)p->seqs[i].slot * e->max_bps,
               e->wire_tables + (size_t)i * e->max_bps,
               gang__blocks_for(e, p->seqs[i].pos0 + p->seqs[i].n) * sizeof(int32_t));
    p->n_tokens = h.n_tokens;
    return 0;
}
