/*
 * The wire form of requests (engine.h, "Request messages"): the sampling parameters and
 * the request messages, each described once with the common codec (gang_codec) for both
 * directions. The agent<->worker channel, a member's forwarded API frames and the plan
 * all write a request's sampling through gang_sampling_codec, so a field added to
 * gang_sampling is added to every one of them here.
 */
#include <string.h>

#include "ganglion/engine.h"

void gang_sampling_codec(gang_codec *c, gang_sampling *sp)
{
    gang_codec_u32(c, &sp->top_k);
    gang_codec_f32(c, &sp->temperature);
    gang_codec_f32(c, &sp->top_p);
    gang_codec_u64(c, &sp->seed);
    gang_codec_f32(c, &sp->presence_penalty);
    gang_codec_f32(c, &sp->frequency_penalty);
    gang_codec_f32(c, &sp->repetition_penalty);
    gang_codec_uint(c, &sp->ignore_eos, 1, 1);
    gang_codec_uint(c, &sp->logprobs, 1, 1);
    gang_codec_uint(c, &sp->top_logprobs, 1, GANG_MAX_TOP_LOGPROBS);
    gang_codec_i32_list(c, &sp->n_stop, 1, sp->stop, GANG_MAX_STOP_TOKENS);
    gang_codec_i32_list(c, &sp->n_bias, 1, sp->bias_ids, GANG_MAX_LOGIT_BIAS);
    if (gang_codec_ok(c))
        gang_codec_f32_array(c, sp->bias, sp->n_bias);
    gang_codec_uint(c, &sp->grammar_bytes, 2, GANG_GRAMMAR_MAX_BYTES);
}

void gang_req_grammar_pack(const char *text, uint32_t len, int32_t *out)
{
    uint32_t words = GANG_GRAMMAR_WORDS(len);
    if (words == 0)
        return;
    out[words - 1] = 0;
    memcpy(out, text, len);
}

int gang_req_kind_valid(uint32_t kind)
{
    return kind >= GANG_REQ_SUBMIT && kind <= GANG_REQ_PROMPT;
}

/* A SUBMIT's or PROMPT's prompt ids: a u32 count, then the ids. */
static void req_ids(gang_codec *c, gang_req_msg *m)
{
    gang_codec_i32_list(c, &m->n_ids, 4, m->ids, GANG_REQ_MAX_IDS);
}

/* TOKEN: the token and its logprobs (n_top alternatives, ids then values). */
static void req_token(gang_codec *c, gang_req_msg *m)
{
    gang_codec_u32(c, &m->index);
    gang_codec_i32(c, &m->token);
    gang_codec_f32(c, &m->logprob);
    gang_codec_i32_list(c, &m->n_top, 1, m->top_ids, GANG_MAX_TOP_LOGPROBS);
    if (gang_codec_ok(c))
        gang_codec_f32_array(c, m->top_lp, m->n_top);
}

int gang_kv_layout_valid(const gang_kv_layout *l)
{
    if (l == NULL)
        return 0;
    if (l->layers == 0)
        return 1;
    if (l->layers > 65535 || l->pp == 0 || l->pp > l->layers || l->tp == 0 ||
        l->tp > GANG_KV_RANKS_MAX || l->pp > GANG_KV_RANKS_MAX / l->tp ||
        l->n_nodes > GANG_KV_NODES_MAX)
        return 0;
    return l->n_nodes == 0 || (l->ranks_per_node != 0 && l->ranks_per_node <= GANG_KV_RANKS_MAX &&
                               l->n_nodes * l->ranks_per_node == l->pp * l->tp);
}

void gang_kv_layout_codec(gang_codec *c, gang_kv_layout *l)
{
    if (!c->decoding && !gang_kv_layout_valid(l)) {
        gang_codec_fail(c, GANG_EINVAL);
        return;
    }
    if (c->decoding)
        memset(l, 0, sizeof(*l));
    gang_codec_uint(c, &l->layers, 4, 65535);
    if (!gang_codec_ok(c) || l->layers == 0)
        return;
    gang_codec_uint(c, &l->pp, 2, GANG_KV_RANKS_MAX);
    gang_codec_uint(c, &l->tp, 2, GANG_KV_RANKS_MAX);
    gang_codec_uint(c, &l->n_nodes, 1, GANG_KV_NODES_MAX);
    gang_codec_uint(c, &l->ranks_per_node, 2, GANG_KV_RANKS_MAX);
    for (uint32_t i = 0; gang_codec_ok(c) && i < l->n_nodes; i++)
        gang_codec_u32(c, &l->node_addr[i]);
    if (gang_codec_ok(c) && !gang_kv_layout_valid(l))
        gang_codec_fail(c, GANG_EPROTO);
}

/* A SUBMIT's P/D transfer (gang_kv_xfer); a block count is bounded by a context. */
static void req_kv(gang_codec *c, gang_kv_xfer *kv)
{
    gang_codec_u64(c, &kv->id);
    gang_codec_uint(c, &kv->blocks, 4, 1u << 24);
    gang_codec_uint(c, &kv->port, 2, 65535);
    gang_codec_str(c, kv->host, sizeof(kv->host), 1);
    gang_codec_uint(c, &kv->do_export, 1, 1);
    gang_kv_layout_codec(c, &kv->src);
}

void gang_req_codec(gang_codec *c, uint32_t kind, gang_req_msg *m)
{
    if (!gang_req_kind_valid(kind)) {
        gang_codec_fail(c, c->decoding ? GANG_EPROTO : GANG_EINVAL);
        return;
    }
    m->kind = kind;
    gang_codec_u64(c, &m->id);
    switch (kind) {
    case GANG_REQ_SUBMIT:
        gang_codec_u32(c, &m->n_prompt);
        gang_codec_u32(c, &m->max_tokens);
        gang_sampling_codec(c, &m->sampling);
        req_ids(c, m);
        req_kv(c, &m->kv);
        /* A SUBMIT carries the start of its prompt: no more ids than the whole prompt. */
        if (gang_codec_ok(c) && m->n_prompt != 0 && m->n_ids > m->n_prompt)
            gang_codec_fail(c, c->decoding ? GANG_EPROTO : GANG_EINVAL);
        break;
    case GANG_REQ_PROMPT:
        gang_codec_u32(c, &m->n_prompt);
        gang_codec_u32(c, &m->index);
        req_ids(c, m);
        break;
    case GANG_REQ_TOKEN:
        req_token(c, m);
        break;
    case GANG_REQ_DONE:
        gang_codec_i32(c, &m->code);
        gang_codec_u32(c, &m->index);
        gang_codec_str(c, m->finish, sizeof(m->finish), 1);
        gang_codec_str(c, m->reason, sizeof(m->reason), 2);
        gang_codec_u64(c, &m->kv_id);
        gang_codec_u32(c, &m->kv_blocks);
        gang_codec_u32(c, &m->kv_ms);
        gang_codec_uint(c, &m->kv_mismatch, 1, 1);
        gang_codec_uint(c, &m->kv_device, 1, 1);
        gang_kv_layout_codec(c, &m->kv_layout);
        break;
    default: /* CANCEL: the id is all */
        break;
    }
}
