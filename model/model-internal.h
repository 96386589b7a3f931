/*
 * Internal to model/: what the shard loader (load.c) and the device move (device.c) share.
 */
#ifndef GANGLION_MODEL_INTERNAL_H
#define GANGLION_MODEL_INTERNAL_H

#include "ganglion/model.h"

/*
 * The rows of m's embedding table that a tied LM head reads (this TP rank's vocabulary
 * slice, from shard.vocab_first on, in m->wtype's storage), where m->embed is now: what
 * m->lm_head points at while lm_head_tied. NULL when m holds no table.
 */
void *gang__model_tied_head(const gang_model *m);

#endif /* GANGLION_MODEL_INTERNAL_H */
