/*
 * Corrupted model fixtures: each is a fresh mkmodel model with one byte-level or header
 * edit, and each must be refused by gang_model_load with GANG_EMODEL, no model, and a
 * one-line message naming the file and the problem. Also the layouts a model cannot
 * take (gang_topology_init) and a layout built for another model.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "fixtures.h"

#define SINGLE "model.safetensors"
#define INDEX "model.safetensors.index.json"
#define SHARD1 "model-00001-of-00003.safetensors"
#define SHARD2 "model-00002-of-00003.safetensors"

/* ---------------------------------------------------------------------------------
 * Header edits (applied to the parsed header, re-serialised with a new length)
 * --------------------------------------------------------------------------------- */

static cJSON *entry(cJSON *root, const char *name)
{
    cJSON *e = cJSON_GetObjectItemCaseSensitive(root, name);

    assert_non_null(e);
    return e;
}

static void set_member(cJSON *obj, const char *key, const char *json)
{
    cJSON *v = cJSON_Parse(json);

    assert_non_null(v);
    assert_true(cJSON_ReplaceItemInObjectCaseSensitive(obj, key, v));
}

static void edit_rename(cJSON *root)
{
    cJSON *e = cJSON_DetachItemFromObjectCaseSensitive(root, "model.layers.1.mlp.up_proj.weight");

    assert_non_null(e);
    cJSON_AddItemToObject(root, "model.layers.1.mlp.up_proj.weighX", e);
}

static void edit_norm_shape(cJSON *root)
{
    set_member(entry(root, "model.norm.weight"), "shape", "[32, 2]");
}

static void edit_q_shape(cJSON *root)
{
    set_member(entry(root, "model.layers.0.self_attn.q_proj.weight"), "shape", "[32, 128]");
}

static void edit_offsets_outside(cJSON *root)
{
    set_member(entry(root, "model.norm.weight"), "data_offsets", "[100000000, 100000256]");
}

static void edit_offsets_short(cJSON *root)
{
    cJSON *offs =
        cJSON_GetObjectItemCaseSensitive(entry(root, "model.norm.weight"), "data_offsets");
    cJSON *end = cJSON_GetArrayItem(offs, 1);

    cJSON_SetNumberValue(end, end->valuedouble - 4);
}

static void edit_overlap(cJSON *root)
{
    cJSON *offs =
        cJSON_GetObjectItemCaseSensitive(entry(root, "model.embed_tokens.weight"), "data_offsets");

    assert_true(cJSON_ReplaceItemInObjectCaseSensitive(entry(root, "lm_head.weight"),
                                                       "data_offsets", cJSON_Duplicate(offs, 1)));
}

static void edit_dtype_f64(cJSON *root)
{
    set_member(entry(root, "model.norm.weight"), "dtype", "\"F64\"");
}

static void edit_dtype_i8(cJSON *root)
{
    set_member(entry(root, "model.layers.0.mlp.up_proj.weight"), "dtype", "\"I8\"");
}

static void edit_entry_number(cJSON *root)
{
    set_member(root, "model.norm.weight", "5");
}

static void edit_negative_dim(cJSON *root)
{
    set_member(entry(root, "model.norm.weight"), "shape", "[-64]");
}

static void edit_huge_dims(cJSON *root)
{
    set_member(entry(root, "model.norm.weight"), "shape", "[4294967296, 4294967296, 4294967296]");
}

/* ---------------------------------------------------------------------------------
 * The fixtures
 * --------------------------------------------------------------------------------- */

typedef struct bad_model {
    const char *what;             /* for the failure message */
    uint32_t shards;              /* 1: model.safetensors; 3: index and shards */
    void (*edit)(cJSON *root);    /* header edit of the (first) file, or NULL */
    void (*raw)(const char *dir); /* byte-level edit, or NULL */
    const char *file;             /* the file the message must name */
    const char *expect;           /* and the problem */
} bad_model;

static void single_path(const char *dir, char *path, size_t cap)
{
    fx_path(path, cap, dir, SINGLE);
}

static void raw_len_limit(const char *dir)
{
    char p[4096];

    single_path(dir, p, sizeof(p));
    fx_set_header_len(p, 200u << 20);
}

static void raw_len_file(const char *dir)
{
    char p[4096];
    size_t len;
    uint8_t *b;

    single_path(dir, p, sizeof(p));
    b = fx_read(p, &len);
    free(b);
    fx_set_header_len(p, len);
}

static void raw_not_json(const char *dir)
{
    char p[4096];

    single_path(dir, p, sizeof(p));
    fx_replace_header_text(p, "this is not JSON at all");
}

static void raw_json_array(const char *dir)
{
    char p[4096];

    single_path(dir, p, sizeof(p));
    fx_replace_header_text(p, "[1, 2, 3]");
}

static void raw_trailing(const char *dir)
{
    char p[4096];

    single_path(dir, p, sizeof(p));
    fx_replace_header_text(p, "{\"__metadata__\": {}} trailing");
}

static void raw_duplicate(const char *dir)
{
    char p[4096];

    single_path(dir, p, sizeof(p));
    fx_replace_header_text(p, "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                              "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}");
}

static void raw_truncated(const char *dir)
{
    char p[4096];

    single_path(dir, p, sizeof(p));
    fx_write(p, "\x10\0\0\0\0", 5);
}

static void raw_no_weights(const char *dir)
{
    char p[4096];

    single_path(dir, p, sizeof(p));
    assert_int_equal(unlink(p), 0);
}

static void raw_index_missing_shard(const char *dir)
{
    fx_index_map(dir, "model.norm.weight", "model-00009-of-00009.safetensors");
}

static void raw_index_dotdot(const char *dir)
{
    fx_index_map(dir, "model.norm.weight", "../" SHARD1);
}

static void raw_index_absolute(const char *dir)
{
    fx_index_map(dir, "model.norm.weight", "/etc/passwd");
}

static void raw_index_wrong_shard(const char *dir)
{
    fx_index_map(dir, "model.norm.weight", SHARD1); /* it lives in the last shard */
}

static void raw_index_unmapped(const char *dir)
{
    fx_index_map(dir, "model.norm.weight", NULL);
}

static void raw_index_deleted_shard(const char *dir)
{
    char p[4096];

    fx_path(p, sizeof(p), dir, SHARD2);
    assert_int_equal(unlink(p), 0);
}

static void raw_index_not_json(const char *dir)
{
    char p[4096];

    fx_path(p, sizeof(p), dir, INDEX);
    fx_write(p, "{\"weight_map\": [", 16);
}

/* The first tensor of a file gets dtype I8. */
static void edit_first_i8(cJSON *root)
{
    cJSON *e;

    cJSON_ArrayForEach(e, root)
    {
        if (strcmp(e->string, "__metadata__") != 0) {
            set_member(e, "dtype", "\"I8\"");
            return;
        }
    }
    fail_msg("no tensor in the header");
}

static void raw_shard_bad_dtype(const char *dir)
{
    char p[4096];

    fx_path(p, sizeof(p), dir, SHARD2);
    fx_edit_header(p, edit_first_i8);
}

static const bad_model bad_models[] = {
    {"missing tensor", 1, edit_rename, NULL, SINGLE,
     "tensor model.layers.1.mlp.up_proj.weight is missing"},
    {"wrong 1-D shape", 1, edit_norm_shape, NULL, SINGLE,
     "model.norm.weight has shape [32, 2], config.json implies [64]"},
    {"wrong 2-D shape", 1, edit_q_shape, NULL, SINGLE,
     "q_proj.weight has shape [32, 128], config.json implies [64, 64]"},
    {"offsets outside", 1, edit_offsets_outside, NULL, SINGLE, "outside the data section"},
    {"offsets short", 1, edit_offsets_short, NULL, SINGLE, "dtype x shape needs 256"},
    {"overlap", 1, edit_overlap, NULL, SINGLE, "overlap in the data section"},
    {"dtype F64", 1, edit_dtype_f64, NULL, SINGLE, "unsupported dtype \"F64\""},
    {"dtype I8", 1, edit_dtype_i8, NULL, SINGLE, "unsupported dtype \"I8\""},
    {"entry not object", 1, edit_entry_number, NULL, SINGLE, "entry is not an object"},
    {"negative dim", 1, edit_negative_dim, NULL, SINGLE, "not a non-negative integer"},
    {"numel overflow", 1, edit_huge_dims, NULL, SINGLE, "element count overflows"},
    {"header len > limit", 1, NULL, raw_len_limit, SINGLE, "exceeds the limit of 104857600"},
    {"header len > file", 1, NULL, raw_len_file, SINGLE, "beyond the end of the file"},
    {"header not JSON", 1, NULL, raw_not_json, SINGLE, "is not a JSON object"},
    {"header array", 1, NULL, raw_json_array, SINGLE, "is not a JSON object"},
    {"trailing bytes", 1, NULL, raw_trailing, SINGLE, "bytes after the JSON header"},
    {"duplicate name", 1, NULL, raw_duplicate, SINGLE, "appears twice"},
    {"truncated", 1, NULL, raw_truncated, SINGLE, "no 8-byte header length"},
    {"no weights", 1, NULL, raw_no_weights, SINGLE, "neither"},
    {"missing shard", 3, NULL, raw_index_missing_shard, INDEX,
     "names shard model-00009-of-00009.safetensors, which is missing"},
    {"shard with ..", 3, NULL, raw_index_dotdot, INDEX, "not a plain file name"},
    {"absolute shard", 3, NULL, raw_index_absolute, INDEX, "not a plain file name"},
    {"wrong shard", 3, NULL, raw_index_wrong_shard, INDEX, "does not hold it"},
    {"unmapped tensor", 3, NULL, raw_index_unmapped, INDEX, "tensor model.norm.weight is missing"},
    {"deleted shard", 3, NULL, raw_index_deleted_shard, INDEX,
     "names shard " SHARD2 ", which is missing"},
    {"index not JSON", 3, NULL, raw_index_not_json, INDEX, "weight_map"},
    {"bad dtype in a shard", 3, NULL, raw_shard_bad_dtype, SHARD2, "unsupported dtype \"I8\""},
};

void test_load_corrupted(void **state)
{
    char *dir = fx_tmpdir(), p[4096], err[ERRLEN];
    gang_topology t;
    size_t i;
    (void)state;

    for (i = 0; i < sizeof(bad_models) / sizeof(bad_models[0]); i++) {
        const bad_model *b = &bad_models[i];
        gang_mkmodel_opts o = fx_small_opts(dir, GANG_ARCH_LLAMA);
        gang_model *m = (gang_model *)1;
        int rc;

        print_message("corrupted fixture: %s\n", b->what);
        o.shards = b->shards;
        fx_make_model(&o);
        t = fx_topo(dir, 2, 1);
        if (b->edit != NULL) {
            single_path(dir, p, sizeof(p));
            fx_edit_header(p, b->edit);
        }
        if (b->raw != NULL)
            b->raw(dir);
        rc = gang_model_load(dir, &t, 1, &m, err, sizeof(err));
        if (rc != GANG_EMODEL || m != NULL || strstr(err, b->file) == NULL ||
            strstr(err, b->expect) == NULL || strchr(err, '\n') != NULL)
            fail_msg("%s: expected GANG_EMODEL naming %s and '%s'; got %d '%s'", b->what, b->file,
                     b->expect, rc, err);
        /* Start the next case from an empty directory. */
        fx_rmtree(dir);
        dir = fx_tmpdir();
    }
    fx_rmtree(dir);
}

void test_load_layout_refusals(void **state)
{
    char *a = fx_tmpdir(), *b = fx_tmpdir(), err[ERRLEN];
    gang_mkmodel_opts o = fx_small_opts(a, GANG_ARCH_LLAMA);
    gang_model_config mc;
    gang_topology_config tc;
    gang_topology t;
    gang_model *m = NULL;
    (void)state;

    fx_make_model(&o);
    /* Heads that do not divide by tp: refused before any weight is read. */
    assert_int_equal(gang_model_config_read(a, &mc, err, sizeof(err)), 0);
    memset(&tc, 0, sizeof(tc));
    gang_model_topology_config(&mc, &tc);
    tc.nnodes = 1;
    tc.nproc_per_node = 3;
    tc.tp = 3;
    tc.pp = 1;
    assert_int_equal(gang_topology_init(&tc, &t, err, sizeof(err)), GANG_EUSAGE);
    assert_non_null(strstr(err, "tp (3) does not divide n_heads (4)"));
    /* More stages than layers. */
    tc.nproc_per_node = 4;
    tc.tp = 1;
    tc.pp = 4;
    assert_int_equal(gang_topology_init(&tc, &t, err, sizeof(err)), GANG_EUSAGE);
    assert_non_null(strstr(err, "n_layers"));

    /* A layout built for another model. */
    o.out_dir = b;
    o.hidden = 128;
    fx_make_model(&o);
    t = fx_topo(a, 2, 1);
    assert_int_equal(gang_model_load(b, &t, 0, &m, err, sizeof(err)), GANG_EMODEL);
    assert_null(m);
    assert_non_null(strstr(err, "config.json"));
    assert_non_null(strstr(err, "differ from the layout"));

    /* Arguments. */
    assert_int_equal(gang_model_load(a, &t, 2, &m, err, sizeof(err)), GANG_EINVAL);
    assert_int_equal(gang_model_load(NULL, &t, 0, &m, err, sizeof(err)), GANG_EINVAL);
    assert_int_equal(gang_model_load(a, NULL, 0, &m, err, sizeof(err)), GANG_EINVAL);
    assert_int_equal(gang_model_load(a, &t, 0, NULL, err, sizeof(err)), GANG_EINVAL);
    gang_model_free(NULL);
    fx_rmtree(a);
    fx_rmtree(b);
}
