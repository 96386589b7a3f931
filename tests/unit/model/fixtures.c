/*
 * Fixture helpers of the model I/O tests (see fixtures.h).
 */
#include <ftw.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "fixtures.h"
#include "ganglion/kernels.h"
#include "ganglion/model.h"

char *fx_tmpdir(void)
{
    char tmpl[] = "/tmp/gang-test-model-XXXXXX";
    char *dir = mkdtemp(tmpl);

    assert_non_null(dir);
    dir = strdup(dir);
    assert_non_null(dir);
    return dir;
}

static int fx_rm_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    return remove(path);
}

void fx_rmtree(char *dir)
{
    if (dir == NULL)
        return;
    nftw(dir, fx_rm_one, 16, FTW_DEPTH | FTW_PHYS);
    free(dir);
}

void fx_path(char *out, size_t cap, const char *dir, const char *name)
{
    assert_true(snprintf(out, cap, "%s/%s", dir, name) < (int)cap);
}

uint8_t *fx_read(const char *path, size_t *len)
{
    FILE *fp = fopen(path, "rb");
    uint8_t *buf;
    long n;

    if (fp == NULL)
        return NULL;
    fseek(fp, 0, SEEK_END);
    n = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    buf = malloc((size_t)n + 1);
    assert_non_null(buf);
    assert_int_equal(fread(buf, 1, (size_t)n, fp), (size_t)n);
    fclose(fp);
    buf[n] = 0;
    *len = (size_t)n;
    return buf;
}

void fx_write(const char *path, const void *data, size_t len)
{
    FILE *fp = fopen(path, "wb");

    assert_non_null(fp);
    assert_int_equal(fwrite(data, 1, len, fp), len);
    assert_int_equal(fclose(fp), 0);
}

int fx_same_file(const char *a, const char *b)
{
    size_t la, lb;
    uint8_t *x = fx_read(a, &la), *y = fx_read(b, &lb);
    int same = x != NULL && y != NULL && la == lb && memcmp(x, y, la) == 0;

    free(x);
    free(y);
    return same;
}

static uint64_t fx_le64(const uint8_t *p)
{
    uint64_t v = 0;
    int i;

    for (i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

cJSON *fx_header(const char *path, size_t *data_off, size_t *data_len)
{
    size_t len;
    uint8_t *buf = fx_read(path, &len);
    uint64_t hlen;
    cJSON *root;

    assert_non_null(buf);
    assert_true(len >= 8);
    hlen = fx_le64(buf);
    assert_true(hlen <= len - 8);
    root = cJSON_ParseWithLength((const char *)buf + 8, (size_t)hlen);
    assert_non_null(root);
    *data_off = 8 + (size_t)hlen;
    *data_len = len - *data_off;
    free(buf);
    return root;
}

float *fx_raw_tensor(const char *path, const char *name, size_t *n)
{
    size_t len, off, dlen, i, esz;
    uint8_t *buf = fx_read(path, &len);
    cJSON *root = fx_header(path, &off, &dlen), *e, *offs;
    const char *dt;
    const uint8_t *src;
    float *out;

    assert_non_null(buf);
    e = cJSON_GetObjectItemCaseSensitive(root, name);
    if (e == NULL) {
        cJSON_Delete(root);
        free(buf);
        return NULL;
    }
    dt = cJSON_GetObjectItemCaseSensitive(e, "dtype")->valuestring;
    offs = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
    esz = strcmp(dt, "F32") == 0 ? 4 : 2;
    src = buf + off + (size_t)cJSON_GetArrayItem(offs, 0)->valuedouble;
    *n = ((size_t)cJSON_GetArrayItem(offs, 1)->valuedouble -
          (size_t)cJSON_GetArrayItem(offs, 0)->valuedouble) /
         esz;
    out = malloc(*n * sizeof(float) + 1);
    assert_non_null(out);
    for (i = 0; i < *n; i++) {
        uint16_t h;

        if (esz == 4) {
            memcpy(&out[i], src + 4 * i, 4);
            continue;
        }
        h = (uint16_t)(src[2 * i] | (src[2 * i + 1] << 8));
        out[i] = strcmp(dt, "F16") == 0 ? gang_f16_to_f32(h) : gang_bf16_to_f32(h);
    }
    cJSON_Delete(root);
    free(buf);
    return out;
}

void fx_edit_header(const char *path, void (*edit)(cJSON *root))
{
    size_t len, off, dlen, hlen, i;
    uint8_t *buf = fx_read(path, &len), *out;
    cJSON *root = fx_header(path, &off, &dlen);
    char *text;

    edit(root);
    text = cJSON_PrintUnformatted(root);
    assert_non_null(text);
    hlen = strlen(text);
    out = malloc(8 + hlen + dlen);
    assert_non_null(out);
    for (i = 0; i < 8; i++)
        out[i] = (uint8_t)((uint64_t)hlen >> (8 * i));
    memcpy(out + 8, text, hlen);
    memcpy(out + 8 + hlen, buf + off, dlen);
    fx_write(path, out, 8 + hlen + dlen);
    free(out);
    free(text);
    cJSON_Delete(root);
    free(buf);
}

void fx_set_header_len(const char *path, uint64_t v)
{
    size_t len, i;
    uint8_t *buf = fx_read(path, &len);

    assert_non_null(buf);
    for (i = 0; i < 8; i++)
        buf[i] = (uint8_t)(v >> (8 * i));
    fx_write(path, buf, len);
    free(buf);
}

void fx_replace_header_text(const char *path, const char *text)
{
    size_t len, hlen, n = strlen(text);
    uint8_t *buf = fx_read(path, &len);

    assert_non_null(buf);
    hlen = (size_t)fx_le64(buf);
    assert_true(n <= hlen);
    memset(buf + 8, ' ', hlen);
    memcpy(buf + 8, text, n);
    fx_write(path, buf, len);
    free(buf);
}

void fx_index_map(const char *dir, const char *tensor, const char *file)
{
    char path[4096], *text;
    size_t len;
    uint8_t *buf;
    cJSON *root, *wm;

    fx_path(path, sizeof(path), dir, "model.safetensors.index.json");
    buf = fx_read(path, &len);
    assert_non_null(buf);
    root = cJSON_ParseWithLength((const char *)buf, len);
    assert_non_null(root);
    wm = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
    assert_non_null(cJSON_GetObjectItemCaseSensitive(wm, tensor));
    if (file == NULL)
        cJSON_DeleteItemFromObjectCaseSensitive(wm, tensor);
    else
        cJSON_ReplaceItemInObjectCaseSensitive(wm, tensor, cJSON_CreateString(file));
    text = cJSON_Print(root);
    fx_write(path, text, strlen(text));
    free(text);
    cJSON_Delete(root);
    free(buf);
}

/* ---------------------------------------------------------------------------------
 * Models
 * --------------------------------------------------------------------------------- */

gang_mkmodel_opts fx_small_opts(const char *dir, gang_model_arch arch)
{
    gang_mkmodel_opts o;

    memset(&o, 0, sizeof(o));
    o.out_dir = dir;
    o.arch = arch;
    o.layers = 3;
    o.hidden = 64;
    o.heads = 4;
    o.kv_heads = 2;
    o.ffn = 96;
    o.vocab = 250;
    o.max_pos = 128;
    o.seed = 7;
    o.dtype = GANG_DTYPE_F32;
    o.shards = 1;
    return o;
}

void fx_make_model(const gang_mkmodel_opts *o)
{
    char err[ERRLEN];
    int rc = gang_mkmodel(o, err, sizeof(err));

    if (rc != 0)
        fail_msg("mkmodel: %s (%d)", err, rc);
}

gang_topology fx_topo(const char *dir, uint32_t tp, uint32_t pp)
{
    gang_model_config mc;
    gang_topology t;
    char err[ERRLEN];

    assert_int_equal(gang_model_config_read(dir, &mc, err, sizeof(err)), 0);
    if (gang_model_topology(&mc, 1, tp * pp, tp, pp, &t, err, sizeof(err)) != 0)
        fail_msg("topology: %s", err);
    return t;
}

gang_model *fx_load_ok(const char *dir, const gang_topology *t, uint32_t rank)
{
    gang_model *m = NULL;
    char err[ERRLEN];
    int rc = gang_model_load(dir, t, rank, &m, err, sizeof(err));

    if (rc != 0)
        fail_msg("load rank %u: %s (%d)", rank, err, rc);
    assert_non_null(m);
    return m;
}
