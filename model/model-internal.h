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
 * The mixture-of-experts fields of config.json root (model/config-moe.c) into cfg, whose
 * dense fields config.c has read (n_layers, ffn): the family from "architectures" or
 * "model_type", experts, top_k, the routing rule, the sparse layers. A dense family leaves
 * n_experts 0. GANG_EMODEL with a message naming path and the field.
 */
struct cJSON;
int gang__config_moe(const struct cJSON *root, const char *path, gang_model_config *cfg, char *err,
                     size_t errlen);

/*
 * Reads the band rows [row_first, +row_count) x columns [col_first, +col_count) of tensor
 * name, of shape [rows, cols] (rows 0: a vector of cols), into a new malloc'd f32 array:
 * load.c's reader, handed to the expert loader.
 */
typedef int (*gang__band_fn)(void *ctx, const char *name, uint64_t rows, uint64_t cols,
                             uint64_t row_first, uint64_t row_count, uint64_t col_first,
                             uint64_t col_count, float **out);

/*
 * The MoE block of decoder layer li (a sparse layer of m->cfg) for this rank into l->moe:
 * the router, this rank's experts (or their columns), the shared expert's columns and its
 * gate, held as ep says (gang_model_moe_layout), read through band (model/load-moe.c).
 * 0; the band reader's errors; GANG_EMODEL for a layout the config cannot take; GANG_ENOMEM.
 */
int gang__load_moe(const gang_model *m, uint32_t li, uint32_t ep, gang__band_fn band, void *ctx,
                   gang_tp_layer *l, char *err, size_t errlen);

/*
 * One line for the logs on how m stores its matrices (gguf-blocks.c): each storage type
 * with the number of matrices in it, prefixed "the GGUF file's own blocks:" when m was
 * loaded keeping them (m->blocks): "the GGUF file's own blocks: q8_0 x 1, q4_1 x 210".
 */
void gang__model_storage_desc(const gang_model *m, char *buf, size_t cap);

/* Whether p points into m's mapping of its GGUF file (m->wmap): an array not to free. */
int gang__model_in_map(const gang_model *m, const void *p);

#endif /* GANGLION_MODEL_INTERNAL_H */
