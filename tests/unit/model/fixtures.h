/*
 * Fixtures of the model I/O tests: temporary directories, an independent reader of
 * safetensors files (so that the loader is checked against the bytes, not against
 * itself), and editors that corrupt a file's header or an index in controlled ways.
 * Every helper fails the running test (cmocka) when its own step fails.
 */
#ifndef GANGLION_TEST_MODEL_FIXTURES_H
#define GANGLION_TEST_MODEL_FIXTURES_H

#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "ganglion/model.h"

#define ERRLEN 512

/* A fresh directory under /tmp (malloc'd path); fx_rmtree removes it and frees the path. */
char *fx_tmpdir(void);
void fx_rmtree(char *dir);

/* dir/name into out (cap bytes). */
void fx_path(char *out, size_t cap, const char *dir, const char *name);

/* Whole file into a malloc'd buffer (*len bytes); NULL when it cannot be read. */
uint8_t *fx_read(const char *path, size_t *len);
/* Writes len bytes to path, replacing it. */
void fx_write(const char *path, const void *data, size_t len);
/* 1 when two files have the same bytes. */
int fx_same_file(const char *a, const char *b);

/*
 * Tensor `name` of the safetensors file `path`, parsed here with cJSON and converted to
 * f32 (F16/BF16 with the kernels' exact conversion). Returns a malloc'd array and its
 * element count in *n; NULL when the tensor is absent.
 */
float *fx_raw_tensor(const char *path, const char *name, size_t *n);

/* The parsed JSON header of a safetensors file and where its data section starts. */
cJSON *fx_header(const char *path, size_t *data_off, size_t *data_len);

/* Rewrites a file's header with edit(root) applied; the data section is kept as is. */
void fx_edit_header(const char *path, void (*edit)(cJSON *root));

/* Overwrites the 8-byte header length of a file. */
void fx_set_header_len(const char *path, uint64_t len);

/* Overwrites the header bytes with text, padded with spaces to the old length. */
void fx_replace_header_text(const char *path, const char *text);

/* Sets weight_map[tensor] = file in dir/model.safetensors.index.json (NULL: removes it). */
void fx_index_map(const char *dir, const char *tensor, const char *file);

/*
 * The small model most tests use: 3 layers (uneven over pp 2), 4 heads and 2 kv heads
 * (replicated at tp 4), ffn 96, a vocabulary of 250 that tp 4 does not divide, f32.
 */
gang_mkmodel_opts fx_small_opts(const char *dir, gang_model_arch arch);
/* gang_mkmodel, failing the test with its message on error. */
void fx_make_model(const gang_mkmodel_opts *o);
/* The validated single-node layout tp x pp of the model in dir. */
gang_topology fx_topo(const char *dir, uint32_t tp, uint32_t pp);
/* gang_model_load, failing the test with its message on error. */
gang_model *fx_load_ok(const char *dir, const gang_topology *t, uint32_t rank);

/* Tests in test-corrupt.c (refusals) and test-rss.c (peak resident memory). */
void test_load_corrupted(void **state);
void test_load_layout_refusals(void **state);
void test_load_peak_rss(void **state);

#endif
