/*
 * Rank 0's intake of the agent's requests (worker-state.h): SUBMIT queues a request for
 * the data thread of its generation, at once when one packet holds the whole prompt, else
 * once its PROMPT pieces have arrived in order; CANCEL drops one. A request of another
 * generation, or one that reaches no rank-0 data plane, is dropped (the agent submits what
 * it still owes again after the next START); one that cannot be taken is refused with
 * DONE and the reason.
 */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "worker-state.h"

/* A prompt longer than one packet, being assembled from its PROMPT pieces. */
struct gang__wpiece {
    struct gang__wpiece *next;
    gang_req_msg head; /* the SUBMIT: request fields */
    uint32_t got;      /* ids received */
    int32_t ids[];     /* [head.n_prompt] */
};
typedef struct gang__wpiece gang__wpiece;

#define WORKER_MAX_PIECES 64            /* prompts in assembly at once */
#define WORKER_MAX_PIECE_IDS (1u << 22) /* their ids together (16 MiB) */

/* Refuses request id of generation gen back to the agent: DONE with code and the reason. */
static void worker_refuse(gang__worker *w, uint64_t gen, uint64_t id, int code, const char *fmt,
                          ...) __attribute__((format(printf, 5, 6)));
static void worker_refuse(gang__worker *w, uint64_t gen, uint64_t id, int code, const char *fmt,
                          ...)
{
    gang_req_msg d;
    va_list ap;
    memset(&d, 0, sizeof(d));
    d.kind = GANG_REQ_DONE;
    d.generation = gen;
    d.id = id;
    d.code = code;
    va_start(ap, fmt);
    vsnprintf(d.reason, sizeof(d.reason), fmt, ap);
    va_end(ap);
    gang__worker_reply_req(w, &d);
}

/* Queues a complete request (header m, prompt ids) for the data thread. */
static void worker_queue(gang__worker *w, const gang_req_msg *m, const int32_t *prompt,
                         uint32_t n_prompt)
{
    gang_gen_request r = {.id = m->id,
                          .prompt = prompt,
                          .n_prompt = n_prompt,
                          .max_tokens = m->max_tokens,
                          .sampling = m->sampling,
                          .kv = m->kv};
    int rc = gang__wstep_submit(w->step, &r);
    if (rc != 0)
        worker_refuse(w, m->generation, m->id, rc, "cannot queue the request: %s",
                      gang_strerror(rc));
}

void gang__worker_drop_pieces(gang__worker *w)
{
    while (w->pieces != NULL) {
        gang__wpiece *p = w->pieces;
        w->pieces = p->next;
        free(p);
    }
    w->n_pieces = 0;
    w->piece_ids = 0;
}

/* Whether rank 0 of generation gen can take a request now (logs a dropped one). */
static int worker_takes(gang__worker *w, const gang_req_msg *m, const char *what)
{
    if (gang__worker_fence(w, m->generation, what) != 0)
        return 0;
    if (w->step == NULL || w->step_gen != m->generation || w->rank != 0) {
        gang_debug("%s of request %llu dropped: no rank-0 data plane in generation %llu", what,
                   (unsigned long long)m->id, (unsigned long long)m->generation);
        return 0;
    }
    return 1;
}

/*
 * SUBMIT(G, request): rank 0 of generation G queues it for its data thread, at once when
 * the packet holds the whole prompt, else after its PROMPT pieces. A request for another
 * generation, or arriving where no data thread runs, is dropped: the agent submits
 * everything it still owes again after the next START. A prompt longer than the context,
 * or more prompts in assembly than WORKER_MAX_PIECES, is refused (DONE with an error).
 */
static void on_submit(gang__worker *w, const gang_req_msg *m)
{
    if (!worker_takes(w, m, "SUBMIT"))
        return;
    uint32_t here = m->n_ids, total = m->n_prompt ? m->n_prompt : here;
    if (total == here) {
        worker_queue(w, m, m->ids, here);
        return;
    }
    if (total < here || total > WORKER_MAX_PIECE_IDS - w->piece_ids ||
        w->n_pieces >= WORKER_MAX_PIECES) {
        worker_refuse(w, m->generation, m->id, GANG_EINVAL,
                      "a prompt of %u ids does not fit (%u prompts of %u ids in assembly)", total,
                      w->n_pieces, w->piece_ids);
        return;
    }
    gang__wpiece *p = malloc(sizeof(*p) + (size_t)total * sizeof(int32_t));
    if (p == NULL) {
        worker_refuse(w, m->generation, m->id, GANG_ENOMEM, "no memory for the prompt");
        return;
    }
    p->head = *m;
    p->got = here;
    memcpy(p->ids, m->ids, (size_t)here * sizeof(int32_t));
    p->next = w->pieces;
    w->pieces = p;
    w->n_pieces++;
    w->piece_ids += total;
}

/* PROMPT(G, request, offset, ids): the next piece of a prompt; the last one queues it. */
static void on_prompt_piece(gang__worker *w, const gang_req_msg *m)
{
    if (!worker_takes(w, m, "PROMPT"))
        return;
    gang__wpiece **pp = &w->pieces;
    while (*pp != NULL && ((*pp)->head.id != m->id || (*pp)->head.generation != m->generation))
        pp = &(*pp)->next;
    gang__wpiece *p = *pp;
    uint32_t n = m->n_ids;
    if (p == NULL || m->index != p->got || n > p->head.n_prompt - p->got) {
        if (p != NULL) {
            *pp = p->next;
            w->n_pieces--;
            w->piece_ids -= p->head.n_prompt;
            free(p);
        }
        worker_refuse(w, m->generation, m->id, GANG_EPROTO,
                      "prompt piece at %u of request %llu out of order", m->index,
                      (unsigned long long)m->id);
        return;
    }
    memcpy(p->ids + p->got, m->ids, (size_t)n * sizeof(int32_t));
    p->got += n;
    if (p->got < p->head.n_prompt)
        return;
    *pp = p->next;
    w->n_pieces--;
    w->piece_ids -= p->head.n_prompt;
    worker_queue(w, &p->head, p->ids, p->got);
    free(p);
}

/* CANCEL(G, id): rank 0 of generation G drops the request. */
static void on_cancel(gang__worker *w, const gang_req_msg *r)
{
    if (gang__worker_fence(w, r->generation, "CANCEL") == 0 && w->step != NULL &&
        w->step_gen == r->generation && w->rank == 0 && gang__wstep_cancel(w->step, r->id) != 0)
        gang_warn("cannot queue the cancellation of request %llu", (unsigned long long)r->id);
}

void gang__worker_on_req(gang__worker *w, const gang_req_msg *r)
{
    switch (r->kind) {
    case GANG_REQ_SUBMIT:
        on_submit(w, r);
        break;
    case GANG_REQ_PROMPT:
        on_prompt_piece(w, r);
        break;
    case GANG_REQ_CANCEL:
        on_cancel(w, r);
        break;
    default:
        gang_warn("ignoring agent request message of kind %u", r->kind);
        break;
    }
}
