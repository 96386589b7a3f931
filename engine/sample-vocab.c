/*
 * The tokens' table of the sampling rank (engine.h, gang_engine_load_vocab), read in the
 * background: loading a large tokenizer (Gemma 3's 262k tokens from a GGUF file) takes
 * seconds, tens of them on a busy host, and doing it on the loader thread delayed the
 * rank's READY and starved its agent of CPU. The thread runs at the lowest priority and
 * hands its table over at the join, which is the only synchronisation: the data thread
 * joins before the first grammar it compiles (gang__sampler_vocab_wait), free joins too.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "engine-internal.h"
#include "ganglion/common.h"

typedef struct gang__vocab_loader {
    pthread_t thread;
    char dir[4096];
    gang_jgram_vocab *gv; /* the result (the thread's until the join) */
} gang__vocab_loader;

static void *loader_main(void *arg)
{
    gang__vocab_loader *l = arg;
    char path[4200], err[256] = "";
    gang_tokenizer *tok = NULL;
    int rc;

    (void)setpriority(PRIO_PROCESS, 0, 19); /* this thread only, on Linux */
    if (gang_model_is_gguf(l->dir)) {
        rc = gang_gguf_tokenizer_load(l->dir, &tok, err, sizeof(err));
    } else {
        snprintf(path, sizeof(path), "%s/tokenizer.json", l->dir);
        rc = gang_tokenizer_load(path, &tok, err, sizeof(err));
    }
    if (rc == 0) {
        rc = gang_jgram_vocab_init(tok, &l->gv);
        gang_tokenizer_free(tok);
        if (rc != 0)
            snprintf(err, sizeof(err), "the tokens' table: %s", gang_strerror(rc));
    }
    if (rc != 0)
        gang_info("grammars are not enforced on this rank: %s", err);
    return NULL;
}

int gang_engine_load_vocab(gang_engine *e, const char *model_dir, char *err, size_t errlen)
{
    gang_set_err(err, errlen, "%s", "");
    if (e == NULL || model_dir == NULL)
        return GANG_EINVAL;
    if (!e->is_last || e->m->place.tp_rank != 0 || e->sampler.loader != NULL)
        return 0;
    gang__vocab_loader *l = calloc(1, sizeof(*l));
    if (l == NULL)
        return GANG_ENOMEM;
    gang_strlcpy(l->dir, model_dir, sizeof(l->dir));
    gang__sampler_vocab(&e->sampler, NULL, e->m->cfg.eos_ids, e->m->cfg.n_eos);
    int rc = pthread_create(&l->thread, NULL, loader_main, l);
    if (rc != 0) {
        free(l);
        gang_set_err(err, errlen, "cannot start the tokens' table thread: %s", strerror(rc));
        return gang_err_from_errno(rc);
    }
    e->sampler.loader = l;
    return 0;
}

void gang__sampler_vocab_wait(gang__sampler *s)
{
    gang__vocab_loader *l = s->loader;
    if (l == NULL)
        return;
    s->loader = NULL;
    (void)pthread_join(l->thread, NULL);
    if (l->gv != NULL) {
        gang_jgram_vocab_free(s->gv);
        s->gv = l->gv;
    }
    free(l);
}
