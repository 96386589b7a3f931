/*
 * Safetensors reader: header validation, banded reads of exactly the bytes asked for, and
 * the index of a sharded checkpoint. The format and the rules are
 * described in safetensors.h.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "ganglion/kernels.h"
#include "ganglion/model.h"
#include "safetensors.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the safetensors reader assumes a little-endian host (F32 data is copied as is)"
#endif

/* Largest integer a JSON number (a double in cJSON) carries exactly. */
#define ST_MAX_JSON_INT 9007199254740992.0

/* One entry of an index: tensor name -> position of its file in the set. */
struct gang__st_entry {
    char *name;
    size_t file;
};

/* pread until n bytes or an error; returns 0 or -1 (errno set; 0 for a short file). */
static int st_pread_full(int fd, void *buf, size_t n, uint64_t off)
{
    uint8_t *p = buf;

    while (n > 0) {
        ssize_t got = pread(fd, p, n, (off_t)off);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0) {
            if (got == 0)
                errno = 0;
            return -1;
        }
        p += got;
        n -= (size_t)got;
        off += (uint64_t)got;
    }
    return 0;
}

int gang__read_small_file(const char *path, size_t max, char **out, size_t *len, char *err,
                          size_t errlen)
{
    struct stat st;
    char *buf = NULL;
    int fd, rc = 0;

    *out = NULL;
    *len = 0;
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        gang_set_err(err, errlen, "%s: cannot open: %s", path, strerror(errno));
        return GANG_EMODEL;
    }
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        gang_set_err(err, errlen, "%s: not a regular file", path);
        rc = GANG_EMODEL;
        goto out_close;
    }
    if ((uint64_t)st.st_size > max) {
        gang_set_err(err, errlen, "%s: file of %lld bytes is larger than the limit of %zu", path,
                     (long long)st.st_size, max);
        rc = GANG_EMODEL;
        goto out_close;
    }
    buf = malloc((size_t)st.st_size + 1);
    if (buf == NULL) {
        rc = GANG_ENOMEM;
        goto out_close;
    }
    if (st_pread_full(fd, buf, (size_t)st.st_size, 0) != 0) {
        gang_set_err(err, errlen, "%s: read failed: %s", path,
                     errno ? strerror(errno) : "file shrank");
        free(buf);
        rc = GANG_EMODEL;
        goto out_close;
    }
    buf[st.st_size] = '\0';
    *out = buf;
    *len = (size_t)st.st_size;
out_close:
    close(fd);
    return rc;
}

/* ---------------------------------------------------------------------------------
 * Header validation
 * --------------------------------------------------------------------------------- */

/* A JSON number that is a non-negative integer cJSON holds exactly. */
static int st_json_u64(const cJSON *v, uint64_t *out)
{
    double d;

    if (!cJSON_IsNumber(v))
        return -1;
    d = v->valuedouble;
    if (!(d >= 0.0) || d > ST_MAX_JSON_INT || d != (double)(uint64_t)d)
        return -1;
    *out = (uint64_t)d;
    return 0;
}

static int st_parse_dtype(const char *s, gang_dtype *dt)
{
    if (strcmp(s, "F32") == 0)
        *dt = GANG_DTYPE_F32;
    else if (strcmp(s, "F16") == 0)
        *dt = GANG_DTYPE_F16;
    else if (strcmp(s, "BF16") == 0)
        *dt = GANG_DTYPE_BF16;
    else
        return -1;
    return 0;
}

/*
 * Validates one tensor entry of the header against a data section of data_size bytes
 * and fills *t (whose name the caller has set). Returns 0 or GANG_EMODEL with a message.
 */
static int st_parse_entry(const gang__st_file *f, const cJSON *item, uint64_t data_size,
                          gang__st_tensor *t, char *err, size_t errlen)
{
    const cJSON *dtype, *shape, *offs, *dim;
    uint64_t bytes, v;
    uint32_t n = 0;

    if (!cJSON_IsObject(item)) {
        gang_set_err(err, errlen, "%s: tensor %.200s: header entry is not an object", f->base,
                     t->name);
        return GANG_EMODEL;
    }
    dtype = cJSON_GetObjectItemCaseSensitive(item, "dtype");
    shape = cJSON_GetObjectItemCaseSensitive(item, "shape");
    offs = cJSON_GetObjectItemCaseSensitive(item, "data_offsets");
    if (!cJSON_IsString(dtype) || !cJSON_IsArray(shape) || !cJSON_IsArray(offs)) {
        gang_set_err(err, errlen,
                     "%s: tensor %.200s: header entry lacks a string \"dtype\", an array "
                     "\"shape\" or an array \"data_offsets\"",
                     f->base, t->name);
        return GANG_EMODEL;
    }
    if (st_parse_dtype(dtype->valuestring, &t->dtype) != 0) {
        gang_set_err(err, errlen,
                     "%s: tensor %.200s: unsupported dtype \"%.16s\" (F32, F16 and BF16 are "
                     "read)",
                     f->base, t->name, dtype->valuestring);
        return GANG_EMODEL;
    }
    if (cJSON_GetArraySize(shape) > GANG__ST_MAX_DIMS) {
        gang_set_err(err, errlen, "%s: tensor %.200s: shape has more than %d dimensions", f->base,
                     t->name, GANG__ST_MAX_DIMS);
        return GANG_EMODEL;
    }
    t->numel = 1;
    cJSON_ArrayForEach(dim, shape)
    {
        if (st_json_u64(dim, &v) != 0) {
            gang_set_err(err, errlen,
                         "%s: tensor %.200s: shape holds a value that is not a non-negative "
                         "integer",
                         f->base, t->name);
            return GANG_EMODEL;
        }
        if (__builtin_mul_overflow(t->numel, v, &t->numel)) {
            gang_set_err(err, errlen, "%s: tensor %.200s: element count overflows", f->base,
                         t->name);
            return GANG_EMODEL;
        }
        t->shape[n++] = v;
    }
    t->ndim = n;
    if (cJSON_GetArraySize(offs) != 2 || st_json_u64(cJSON_GetArrayItem(offs, 0), &t->begin) != 0 ||
        st_json_u64(cJSON_GetArrayItem(offs, 1), &t->end) != 0) {
        gang_set_err(err, errlen,
                     "%s: tensor %.200s: data_offsets is not a pair of non-negative integers",
                     f->base, t->name);
        return GANG_EMODEL;
    }
    if (t->begin > t->end || t->end > data_size) {
        gang_set_err(err, errlen,
                     "%s: tensor %.200s: data_offsets [%llu, %llu] outside the data section "
                     "of %llu bytes",
                     f->base, t->name, (unsigned long long)t->begin, (unsigned long long)t->end,
                     (unsigned long long)data_size);
        return GANG_EMODEL;
    }
    if (__builtin_mul_overflow(t->numel, (uint64_t)gang_dtype_size(t->dtype), &bytes) ||
        t->end - t->begin != bytes) {
        gang_set_err(err, errlen,
                     "%s: tensor %.200s: data_offsets [%llu, %llu] hold %llu bytes, but "
                     "dtype x shape needs %llu",
                     f->base, t->name, (unsigned long long)t->begin, (unsigned long long)t->end,
                     (unsigned long long)(t->end - t->begin), (unsigned long long)bytes);
        return GANG_EMODEL;
    }
    return 0;
}

static int st_cmp_name(const void *a, const void *b)
{
    return strcmp(((const gang__st_tensor *)a)->name, ((const gang__st_tensor *)b)->name);
}

/* bsearch's comparator: the key is the name itself (a const char *). */
static int st_cmp_name_key(const void *key, const void *elem)
{
    return strcmp(key, ((const gang__st_tensor *)elem)->name);
}

static int st_cmp_begin(const void *a, const void *b)
{
    const gang__st_tensor *x = *(const gang__st_tensor *const *)a;
    const gang__st_tensor *y = *(const gang__st_tensor *const *)b;

    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    return x->end < y->end ? -1 : (x->end > y->end);
}

/*
 * Sorts the tensors by name, refuses duplicate names, and refuses two non-empty byte
 * ranges that overlap (a writer bug, or a crafted file aliasing one tensor's bytes).
 */
static int st_check_tensor_set(gang__st_file *f, char *err, size_t errlen)
{
    gang__st_tensor **by_begin;
    size_t i, n = 0;
    int rc = 0;

    qsort(f->tensors, f->n_tensors, sizeof(*f->tensors), st_cmp_name);
    for (i = 1; i < f->n_tensors; i++) {
        if (strcmp(f->tensors[i - 1].name, f->tensors[i].name) == 0) {
            gang_set_err(err, errlen, "%s: tensor %.200s appears twice in the header", f->base,
                         f->tensors[i].name);
            return GANG_EMODEL;
        }
    }
    if (f->n_tensors < 2)
        return 0;
    by_begin = malloc(f->n_tensors * sizeof(*by_begin));
    if (by_begin == NULL)
        return GANG_ENOMEM;
    for (i = 0; i < f->n_tensors; i++)
        if (f->tensors[i].end > f->tensors[i].begin)
            by_begin[n++] = &f->tensors[i];
    qsort(by_begin, n, sizeof(*by_begin), st_cmp_begin);
    for (i = 1; i < n; i++) {
        if (by_begin[i]->begin < by_begin[i - 1]->end) {
            gang_set_err(err, errlen, "%s: tensors %.200s and %.200s overlap in the data section",
                         f->base, by_begin[i - 1]->name, by_begin[i]->name);
            rc = GANG_EMODEL;
            break;
        }
    }
    free(by_begin);
    return rc;
}

/* Parses and validates the JSON header hdr[0 .. hlen) into f->tensors. */
static int st_parse_header(gang__st_file *f, const char *hdr, size_t hlen, char *err, size_t errlen)
{
    const char *end = NULL;
    const cJSON *item;
    cJSON *root;
    uint64_t data_size = f->size - f->data_off;
    size_t count = 0;
    int rc = 0;

    root = cJSON_ParseWithLengthOpts(hdr, hlen, &end, 0);
    if (root == NULL || !cJSON_IsObject(root)) {
        gang_set_err(err, errlen, "%s: header of %zu bytes is not a JSON object", f->base, hlen);
        rc = GANG_EMODEL;
        goto out_free;
    }
    /* Writers pad the header with spaces up to an alignment; anything else is damage. */
    for (; end != NULL && end < hdr + hlen; end++) {
        if (*end != ' ' && *end != '\t' && *end != '\n' && *end != '\r') {
            gang_set_err(err, errlen, "%s: bytes after the JSON header at offset %zu", f->base,
                         (size_t)(end - hdr) + 8);
            rc = GANG_EMODEL;
            goto out_free;
        }
    }
    count = (size_t)cJSON_GetArraySize(root);
    f->tensors = calloc(count ? count : 1, sizeof(*f->tensors));
    if (f->tensors == NULL) {
        rc = GANG_ENOMEM;
        goto out_free;
    }
    cJSON_ArrayForEach(item, root)
    {
        gang__st_tensor *t = &f->tensors[f->n_tensors];

        if (strcmp(item->string, "__metadata__") == 0) {
            if (!cJSON_IsObject(item)) {
                gang_set_err(err, errlen, "%s: __metadata__ is not an object", f->base);
                rc = GANG_EMODEL;
                goto out_free;
            }
            continue;
        }
        t->name = strdup(item->string);
        if (t->name == NULL) {
            rc = GANG_ENOMEM;
            goto out_free;
        }
        f->n_tensors++;
        rc = st_parse_entry(f, item, data_size, t, err, errlen);
        if (rc != 0)
            goto out_free;
    }
    rc = st_check_tensor_set(f, err, errlen);
out_free:
    cJSON_Delete(root);
    return rc;
}

int gang__st_open(const char *path, gang__st_file *f, char *err, size_t errlen)
{
    struct stat st;
    uint8_t lenbuf[8];
    uint64_t hlen = 0;
    char *hdr = NULL;
    int i, rc;

    memset(f, 0, sizeof(*f));
    f->fd = -1;
    f->path = strdup(path);
    if (f->path == NULL)
        return GANG_ENOMEM;
    f->base = strrchr(f->path, '/') ? strrchr(f->path, '/') + 1 : f->path;
    f->fd = open(path, O_RDONLY | O_CLOEXEC);
    if (f->fd < 0) {
        gang_set_err(err, errlen, "%s: cannot open: %s", path, strerror(errno));
        rc = GANG_EMODEL;
        goto out_close;
    }
    if (fstat(f->fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        gang_set_err(err, errlen, "%s: not a regular file", path);
        rc = GANG_EMODEL;
        goto out_close;
    }
    f->size = (uint64_t)st.st_size;
    if (f->size < 8 || st_pread_full(f->fd, lenbuf, 8, 0) != 0) {
        gang_set_err(err, errlen, "%s: file of %llu bytes has no 8-byte header length", f->base,
                     (unsigned long long)f->size);
        rc = GANG_EMODEL;
        goto out_close;
    }
    for (i = 7; i >= 0; i--)
        hlen = (hlen << 8) | lenbuf[i];
    if (hlen > GANG_MODEL_MAX_HEADER_BYTES) {
        gang_set_err(err, errlen, "%s: header length %llu exceeds the limit of %u bytes", f->base,
                     (unsigned long long)hlen, GANG_MODEL_MAX_HEADER_BYTES);
        rc = GANG_EMODEL;
        goto out_close;
    }
    if (hlen > f->size - 8) {
        gang_set_err(err, errlen,
                     "%s: header length %llu is beyond the end of the file (%llu bytes)", f->base,
                     (unsigned long long)hlen, (unsigned long long)f->size);
        rc = GANG_EMODEL;
        goto out_close;
    }
    f->data_off = 8 + hlen;
    hdr = malloc((size_t)hlen + 1);
    if (hdr == NULL) {
        rc = GANG_ENOMEM;
        goto out_close;
    }
    if (st_pread_full(f->fd, hdr, (size_t)hlen, 8) != 0) {
        gang_set_err(err, errlen, "%s: cannot read the header: %s", f->base,
                     errno ? strerror(errno) : "file shrank");
        rc = GANG_EMODEL;
        goto out_close;
    }
    hdr[hlen] = '\0';
    rc = st_parse_header(f, hdr, (size_t)hlen, err, errlen);
    if (rc != 0)
        goto out_close;
    free(hdr);
    return 0;

out_close:
    free(hdr);
    gang__st_close(f);
    return rc;
}

void gang__st_close(gang__st_file *f)
{
    size_t i;

    if (f == NULL)
        return;
    if (f->fd >= 0)
        close(f->fd);
    for (i = 0; i < f->n_tensors; i++)
        free(f->tensors[i].name);
    free(f->tensors);
    free(f->path);
    memset(f, 0, sizeof(*f));
    f->fd = -1;
}

const gang__st_tensor *gang__st_find(const gang__st_file *f, const char *name)
{
    if (f->n_tensors == 0)
        return NULL;
    return bsearch(name, f->tensors, f->n_tensors, sizeof(*f->tensors), st_cmp_name_key);
}

/* ---------------------------------------------------------------------------------
 * Banded reads
 *
 * Reads go through pread rather than a mapping. A mapping was tried first, releasing the
 * pages behind the reader with MADV_DONTNEED, and measured: on a recent kernel a fault
 * maps a whole large page-cache folio (up to 2 MiB on ext4) plus fault-around pages, so
 * bits of neighbouring tensors stayed resident and a tp 4 shard peaked 7 MiB above its
 * weights. pread copies exactly the bytes asked for out of the page cache: the resident
 * cost of a read is its destination plus a 32 KiB bounce buffer on the stack, on any
 * kernel and filesystem.
 * --------------------------------------------------------------------------------- */

#define ST_BOUNCE 16384 /* half-precision elements converted per pread */

/* n elements of dtype dt at file offset off into dst as f32. Returns 0 or GANG_EIO. */
static int st_read_span(const gang__st_file *f, gang_dtype dt, uint64_t off, uint64_t n, float *dst)
{
    uint16_t buf[ST_BOUNCE];

    if (dt == GANG_DTYPE_F32)
        return st_pread_full(f->fd, dst, (size_t)n * sizeof(float), off) == 0 ? 0 : GANG_EIO;
    while (n > 0) {
        size_t k = n < ST_BOUNCE ? (size_t)n : ST_BOUNCE;

        if (st_pread_full(f->fd, buf, k * sizeof(uint16_t), off) != 0)
            return GANG_EIO;
        if (dt == GANG_DTYPE_F16)
            gang_f16_to_f32_array(buf, dst, k);
        else
            gang_bf16_to_f32_array(buf, dst, k);
        off += k * sizeof(uint16_t);
        dst += k;
        n -= k;
    }
    return 0;
}

int gang__st_read(const gang__st_file *f, const gang__st_tensor *t, uint64_t row_first,
                  uint64_t row_count, uint64_t col_first, uint64_t col_count, float *dst)
{
    uint64_t rows, cols, r, esz, off;
    int rc = 0;

    rows = t->ndim >= 2 ? t->shape[0] : 1;
    cols = rows == 0 ? 0 : t->numel / rows;
    if (dst == NULL || row_first > rows || row_count > rows - row_first || col_first > cols ||
        col_count > cols - col_first)
        return GANG_EINVAL;
    if (row_count == 0 || col_count == 0)
        return 0;
    esz = gang_dtype_size(t->dtype);
    off = f->data_off + t->begin;
    /* A band of whole rows is one contiguous range; a band of columns is one per row. */
    if (col_count == cols)
        return st_read_span(f, t->dtype, off + row_first * cols * esz, row_count * cols, dst);
    for (r = 0; r < row_count && rc == 0; r++)
        rc = st_read_span(f, t->dtype, off + ((row_first + r) * cols + col_first) * esz, col_count,
                          dst + r * col_count);
    return rc;
}

/* ---------------------------------------------------------------------------------
 * Sets: one file or an index of shards
 * --------------------------------------------------------------------------------- */

static int st_cmp_entry(const void *a, const void *b)
{
    return strcmp(((const struct gang__st_entry *)a)->name,
                  ((const struct gang__st_entry *)b)->name);
}

/* bsearch's comparator: the key is the name itself (a const char *). */
static int st_cmp_entry_key(const void *key, const void *elem)
{
    return strcmp(key, ((const struct gang__st_entry *)elem)->name);
}

void gang__st_set_close(gang__st_set *s)
{
    size_t i;

    if (s == NULL)
        return;
    for (i = 0; i < s->n_files; i++)
        gang__st_close(&s->files[i]);
    free(s->files);
    for (i = 0; i < s->n_entries; i++)
        free(s->entries[i].name);
    free(s->entries);
    memset(s, 0, sizeof(*s));
}

/* A shard name must stay inside the model directory: a plain file name. */
static int st_shard_name_ok(const char *name)
{
    return name[0] != '\0' && strchr(name, '/') == NULL && strchr(name, '\\') == NULL &&
           strstr(name, "..") == NULL;
}

/* Opens the shards named by the index at ipath (dir is their directory). */
static int st_set_open_index(const char *dir, const char *ipath, gang__st_set *s, char *err,
                             size_t errlen)
{
    const cJSON *wm, *item;
    cJSON *root = NULL;
    char **names = NULL, *text = NULL, path[4096];
    size_t len, n_names = 0, i, count;
    int rc;

    rc = gang__read_small_file(ipath, GANG_MODEL_MAX_HEADER_BYTES, &text, &len, err, errlen);
    if (rc != 0)
        return rc;
    root = cJSON_ParseWithLength(text, len);
    wm = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
    if (root == NULL || !cJSON_IsObject(root) || !cJSON_IsObject(wm)) {
        gang_set_err(err, errlen, "%s: not a JSON object with an object \"weight_map\"",
                     GANG__ST_INDEX_NAME);
        rc = GANG_EMODEL;
        goto out_free;
    }
    count = (size_t)cJSON_GetArraySize(wm);
    s->entries = calloc(count ? count : 1, sizeof(*s->entries));
    names = calloc(count ? count : 1, sizeof(*names));
    if (s->entries == NULL || names == NULL) {
        rc = GANG_ENOMEM;
        goto out_free;
    }
    cJSON_ArrayForEach(item, wm)
    {
        if (!cJSON_IsString(item) || !st_shard_name_ok(item->valuestring)) {
            gang_set_err(err, errlen,
                         "%s: tensor %.200s maps to \"%.200s\", which is not a plain file "
                         "name in the model directory",
                         GANG__ST_INDEX_NAME, item->string,
                         cJSON_IsString(item) ? item->valuestring : "(not a string)");
            rc = GANG_EMODEL;
            goto out_free;
        }
        for (i = 0; i < n_names && strcmp(names[i], item->valuestring) != 0; i++)
            ;
        if (i == n_names)
            names[n_names++] = item->valuestring;
        s->entries[s->n_entries].file = i;
        s->entries[s->n_entries].name = strdup(item->string);
        if (s->entries[s->n_entries].name == NULL) {
            rc = GANG_ENOMEM;
            goto out_free;
        }
        s->n_entries++;
    }
    if (n_names == 0) {
        gang_set_err(err, errlen, "%s: \"weight_map\" is empty", GANG__ST_INDEX_NAME);
        rc = GANG_EMODEL;
        goto out_free;
    }
    s->files = calloc(n_names, sizeof(*s->files));
    if (s->files == NULL) {
        rc = GANG_ENOMEM;
        goto out_free;
    }
    for (i = 0; i < n_names; i++) {
        snprintf(path, sizeof(path), "%s/%s", dir, names[i]);
        rc = gang__st_open(path, &s->files[i], err, errlen);
        if (rc != 0) {
            if (rc == GANG_EMODEL && access(path, F_OK) != 0)
                gang_set_err(err, errlen, "%s: names shard %.200s, which is missing",
                             GANG__ST_INDEX_NAME, names[i]);
            goto out_free;
        }
        s->n_files++;
    }
    qsort(s->entries, s->n_entries, sizeof(*s->entries), st_cmp_entry);
    for (i = 0; i < s->n_entries; i++) {
        const gang__st_file *f = &s->files[s->entries[i].file];

        if (i > 0 && strcmp(s->entries[i - 1].name, s->entries[i].name) == 0) {
            gang_set_err(err, errlen, "%s: tensor %.200s appears twice in \"weight_map\"",
                         GANG__ST_INDEX_NAME, s->entries[i].name);
            rc = GANG_EMODEL;
            goto out_free;
        }
        if (gang__st_find(f, s->entries[i].name) == NULL) {
            gang_set_err(err, errlen, "%s: maps tensor %.200s to %s, which does not hold it",
                         GANG__ST_INDEX_NAME, s->entries[i].name, f->base);
            rc = GANG_EMODEL;
            goto out_free;
        }
    }
out_free:
    free(names);
    cJSON_Delete(root);
    free(text);
    return rc;
}

int gang__st_set_open(const char *dir, gang__st_set *s, char *err, size_t errlen)
{
    char path[4096];
    struct stat st;
    int rc;

    memset(s, 0, sizeof(*s));
    if (snprintf(path, sizeof(path), "%s/%s", dir, GANG__ST_SINGLE_NAME) >= (int)sizeof(path)) {
        gang_set_err(err, errlen, "%s: model directory path too long", dir);
        return GANG_EMODEL;
    }
    if (stat(path, &st) == 0) {
        s->files = calloc(1, sizeof(*s->files));
        if (s->files == NULL)
            return GANG_ENOMEM;
        rc = gang__st_open(path, &s->files[0], err, errlen);
        if (rc == 0)
            s->n_files = 1;
    } else {
        snprintf(path, sizeof(path), "%s/%s", dir, GANG__ST_INDEX_NAME);
        if (stat(path, &st) != 0) {
            gang_set_err(err, errlen, "%s: neither %s nor %s found", dir, GANG__ST_SINGLE_NAME,
                         GANG__ST_INDEX_NAME);
            return GANG_EMODEL;
        }
        rc = st_set_open_index(dir, path, s, err, errlen);
    }
    if (rc != 0)
        gang__st_set_close(s);
    return rc;
}

int gang__st_set_find(const gang__st_set *s, const char *name, const gang__st_file **file,
                      const gang__st_tensor **t)
{
    const struct gang__st_entry *e;

    *file = NULL;
    *t = NULL;
    if (s->n_entries == 0) {
        if (s->n_files == 0)
            return GANG_ENOENT;
        *file = &s->files[0];
    } else {
        e = bsearch(name, s->entries, s->n_entries, sizeof(*s->entries), st_cmp_entry_key);
        if (e == NULL)
            return GANG_ENOENT;
        *file = &s->files[e->file];
    }
    *t = gang__st_find(*file, name);
    return *t == NULL ? GANG_ENOENT : 0;
}
