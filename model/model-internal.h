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

/*
 * One line for the logs on how m stores its matrices (gguf-blocks.c): each storage type
 * with the number of matrices in it, prefixed "the GGUF file's own blocks:" when m was
 * loaded keeping them (m->blocks): "the GGUF file's own blocks: q8_0 x 1, q4_1 x 210".
 */
void gang__model_storage_desc(const gang_model *m, char *buf, size_t cap);

#endif /* GANGLION_MODEL_INTERNAL_H */
