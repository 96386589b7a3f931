/*
 * Rank 0's side of a completed step: the sampled tokens committed to their requests,
 * TOKEN and DONE events into the bounded ring (the scheduler reserved their room when it
 * planned the sampling sequences, so none is lost and nothing allocates), finished and
 * cancelled requests unlinked and freed with their blocks.
 */
#include <stdlib.h>
#include <string.h>

#include "engine-internal.h"

static void sched_event(gang_engine *e, const gang_gen_event *ev)
{
    /* The scheduler reserved the room when it planned the sampling sequence. */
    e->events[(e->ev_head + e->ev_count) % e->ev_cap] = *ev;
    e->ev_count++;
}

/* Unlinks q from the queue, frees its slot and the request. */
static void sched_finish(gang_engine *e, gang__request *q)
{
    gang__request **pp;

    for (pp = &e->queue_head; *pp != NULL; pp = &(*pp)->next) {
        if (*pp == q) {
            *pp = q->next;
            break;
        }
    }
    if (e->queue_tail == q) {
        e->queue_tail = e->queue_head;
        while (e->queue_tail != NULL && e->queue_tail->next != NULL)
            e->queue_tail = e->queue_tail->next;
    }
    gang__xfer_forget(e, q);
    if (q->running)
        gang__kv_release(e, q);
    e->n_pending--;
    free(q->prompt);
    free(q);
}

/* The logprobs the last stage reported for a sequence into its TOKEN event. */
static void sched_logprobs(const gang__result *r, gang_gen_event *ev)
{
    uint32_t n = r->n_top <= GANG_MAX_TOP_LOGPROBS ? r->n_top : GANG_MAX_TOP_LOGPROBS;

    ev->logprob = r->logprob;
    ev->n_top = n;
    memcpy(ev->top_ids, r->top_ids, n * sizeof(int32_t));
    memcpy(ev->top_logprobs, r->top_lp, n * sizeof(float));
}

int gang__sched_cancel(gang_engine *e, uint64_t id)
{
    for (gang__request *q = e->queue_head; q != NULL; q = q->next) {
        if (q->r.id == id) {
            sched_finish(e, q);
            return 0;
        }
    }
    return GANG_ENOENT;
}

void gang__sched_commit(gang_engine *e)
{
    gang_gen_event ev;
    gang__request *q;
    uint32_t i, j;
    int stop;

    for (i = 0; i < e->plan.n_seq; i++) {
        const gang__plan_seq *s = &e->plan.seqs[i];

        q = e->slot_req[s->slot];
        if (q == NULL)
            continue;
        q->n_fed += s->n;
        if (e->cfg.prefix_caching)
            gang__pc_register(e, q);
        if (!s->sample)
            continue;
        q->last = e->plan.out[i];
        q->prompt[q->r.n_prompt + q->n_gen] = q->last; /* n_gen < max_tokens here */
        memset(&ev, 0, sizeof(ev));
        ev.kind = GANG_GEN_TOKEN;
        ev.id = q->r.id;
        ev.token = q->last;
        ev.index = q->n_gen;
        if (q->r.sampling.logprobs)
            sched_logprobs(&e->plan.res[i], &ev);
        sched_event(e, &ev);
        q->n_gen++;
        stop = 0;
        for (j = 0; j < q->r.sampling.n_stop; j++)
            stop |= q->r.sampling.stop[j] == q->last;
        for (j = 0; !q->r.sampling.ignore_eos && j < e->m->cfg.n_eos && j < GANG_MAX_EOS; j++)
            stop |= e->m->cfg.eos_ids[j] == q->last;
        if (stop || q->n_gen >= q->r.max_tokens) {
            memset(&ev, 0, sizeof(ev));
            ev.kind = GANG_GEN_DONE;
            ev.id = q->r.id;
            ev.index = q->n_cached;
            memcpy(ev.finish, stop ? "stop" : "length", stop ? 5 : 7);
            if (!gang__xfer_on_done(e, q, &ev))
                sched_event(e, &ev);
            sched_finish(e, q);
        }
    }
}

void gang__sched_clear(gang_engine *e)
{
    gang__request *q, *next;

    for (q = e->queue_head; q != NULL; q = next) {
        next = q->next;
        free(q->prompt);
        free(q);
    }
    e->queue_head = e->queue_tail = NULL;
    e->n_pending = 0;
    if (e->slot_req != NULL)
        memset(e->slot_req, 0, (size_t)e->slots * sizeof(*e->slot_req));
    if (e->free_blocks != NULL)
        gang__kv_reset(e);
    e->ev_head = e->ev_count = 0;
}
