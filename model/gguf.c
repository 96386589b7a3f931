/*
 * GGUF reader: a bounded, validating header parser and banded, dequantizing reads of
 * exactly the rows asked for. The format and the rules are described in gguf.h.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ganglion/common.h"
#include "gguf.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the GGUF reader assumes a little-endian host"
#endif

#define GGUF_DEFAULT_ALIGN 32u
#define GGUF_FIRST_READ (1u << 20)
#define GGUF_READ_CHUNK (4u << 20) /* raw bytes read at a time by gang__gguf_read */

/* A parsing cursor over the header bytes buf[0..len) of a file of fsize bytes. */
typedef struct cur {
    const uint8_t *buf;
    size_t len;
    uint64_t fsize;
    uint64_t pos;
    const char *name;
    char *err;
    size_t errlen;
} cur;

/* Whether n more bytes are there: 0; GANG_EAGAIN (in the file, past the buffer); or
 * GANG_EMODEL ("truncated", naming what) past the end of the file. */
static int cur_need(cur *c, uint64_t n, const char *what)
{
    if (n <= c->len && c->pos <= c->len - n)
        return 0;
    if (n <= c->fsize && c->pos <= c->fsize - n)
        return c->fsize > GANG__GGUF_MAX_HEADER && c->pos + n > GANG__GGUF_MAX_HEADER
                   ? (gang_set_err(c->err, c->errlen, "%s: header larger than %u MiB at %s",
                                   c->name, GANG__GGUF_MAX_HEADER >> 20, what),
                      GANG_EMODEL)
                   : GANG_EAGAIN;
    gang_set_err(c->err, c->errlen, "%s: truncated: %s at byte %llu runs past the end of the file",
                 c->name, what, (unsigned long long)c->pos);
    return GANG_EMODEL;
}

static int cur_u32(cur *c, uint32_t *v, const char *what)
{
    int rc = cur_need(c, 4, what);
    if (rc == 0) {
        memcpy(v, c->buf + c->pos, 4);
        c->pos += 4;
    }
    return rc;
}

static int cur_u64(cur *c, uint64_t *v, const char *what)
{
    int rc = cur_need(c, 8, what);
    if (rc == 0) {
        memcpy(v, c->buf + c->pos, 8);
        c->pos += 8;
    }
    return rc;
}

/* A string: its length (at most max) and the offset of its bytes; skips them. */
static int cur_str(cur *c, uint64_t max, uint64_t *off, uint64_t *n, const char *what)
{
    int rc = cur_u64(c, n, what);
    if (rc != 0)
        return rc;
    if (*n > max) {
        gang_set_err(c->err, c->errlen,
                     "%s: %s of %llu bytes at byte %llu exceeds the limit of %llu", c->name, what,
                     (unsigned long long)*n, (unsigned long long)(c->pos - 8),
                     (unsigned long long)max);
        return GANG_EMODEL;
    }
    rc = cur_need(c, *n, what);
    if (rc == 0) {
        *off = c->pos;
        c->pos += *n;
    }
    return rc;
}

/* Bytes of a fixed-size value type, 0 for strings and arrays, -1 for unknown types. */
static int kv_type_size(uint32_t t)
{
    static const int sizes[] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    return t < sizeof(sizes) / sizeof(sizes[0]) ? sizes[t] : -1;
}

/* Decodes the scalar at buf + off of type t into kv->num. */
static void kv_scalar(const uint8_t *p, uint32_t t, gang__gguf_kv *kv)
{
    uint8_t u8 = p[0];
    uint16_t u16 = 0;
    uint32_t u32 = 0;
    float f32;

    memcpy(&u16, p, 2 <= kv_type_size(t) ? 2 : 1);
    memcpy(&u32, p, 4 <= kv_type_size(t) ? 4 : 1);
    switch (t) {
    case GANG__GGUF_U8:
        kv->num.u = u8;
        break;
    case GANG__GGUF_I8:
        kv->num.i = (int8_t)u8;
        break;
    case GANG__GGUF_BOOL:
        kv->num.u = u8 != 0;
        break;
    case GANG__GGUF_U16:
        kv->num.u = u16;
        break;
    case GANG__GGUF_I16:
        kv->num.i = (int16_t)u16;
        break;
    case GANG__GGUF_U32:
        kv->num.u = u32;
        break;
    case GANG__GGUF_I32:
        kv->num.i = (int32_t)u32;
        break;
    case GANG__GGUF_F32:
        memcpy(&f32, p, 4);
        kv->num.f = f32;
        break;
    case GANG__GGUF_F64:
        memcpy(&kv->num.f, p, 8);
        break;
    default:
        memcpy(&kv->num.u, p, 8);
        break; /* U64, I64 */
    }
}

/* One metadata value of type t (after its type word) into kv; string arrays count their
 * elements into *n_str (their offsets are recorded in a second pass). */
static int kv_value(cur *c, gang__gguf_kv *kv, uint64_t *n_str)
{
    int sz = kv_type_size(kv->type), rc;
    uint64_t n, i, off;

    if (sz < 0) {
        gang_set_err(c->err, c->errlen, "%s: metadata %.*s: unknown value type %u", c->name,
                     (int)kv->key_len, kv->key, kv->type);
        return GANG_EMODEL;
    }
    if (kv->type == GANG__GGUF_STRING)
        return cur_str(c, GANG__GGUF_MAX_STRING, &kv->off, &kv->n, "a metadata string");
    if (kv->type != GANG__GGUF_ARRAY) {
        rc = cur_need(c, (uint64_t)sz, "a metadata value");
        if (rc == 0) {
            kv_scalar(c->buf + c->pos, kv->type, kv);
            c->pos += (uint64_t)sz;
        }
        return rc;
    }
    if ((rc = cur_u32(c, &kv->arr_type, "an array type")) != 0 ||
        (rc = cur_u64(c, &kv->n, "an array count")) != 0)
        return rc;
    sz = kv_type_size(kv->arr_type);
    if (sz <= 0 && kv->arr_type != GANG__GGUF_STRING) {
        gang_set_err(c->err, c->errlen, "%s: metadata %.*s: %s arrays are not supported", c->name,
                     (int)kv->key_len, kv->key,
                     kv->arr_type == GANG__GGUF_ARRAY ? "nested" : "unknown-type");
        return GANG_EMODEL;
    }
    n = kv->n;
    /* Every element takes at least 8 bytes (strings) or sz: the count is bounded by the
     * rest of the file before anything is allocated or walked. */
    if (n > GANG__GGUF_MAX_ARRAY || n > (c->fsize - c->pos) / (uint64_t)(sz > 0 ? sz : 8)) {
        gang_set_err(
            c->err, c->errlen,
            "%s: metadata %.*s: array of %llu elements is too long for the file (truncated?)",
            c->name, (int)kv->key_len, kv->key, (unsigned long long)n);
        return GANG_EMODEL;
    }
    kv->off = c->pos;
    if (sz > 0) {
        rc = cur_need(c, n * (uint64_t)sz, "an array");
        if (rc == 0)
            c->pos += n * (uint64_t)sz;
        return rc;
    }
    for (i = 0; i < n; i++) {
        uint64_t len;
        rc = cur_str(c, GANG__GGUF_MAX_STRING, &off, &len, "an array string");
        if (rc != 0)
            return rc;
    }
    *n_str += n;
    return 0;
}

/* Records the element offsets of every string array (second pass, counts known). */
static void kv_index_strings(gang__gguf *g)
{
    uint64_t at = 0, i, j, pos, len;

    for (i = 0; i < g->n_kv; i++) {
        gang__gguf_kv *kv = &g->kv[i];
        if (kv->type != GANG__GGUF_ARRAY || kv->arr_type != GANG__GGUF_STRING)
            continue;
        pos = kv->off;
        kv->off = at; /* now: index of its first element in str_offs */
        for (j = 0; j < kv->n; j++) {
            memcpy(&len, g->hdr + pos, 8);
            g->str_offs[at++] = pos;
            pos += 8 + len;
        }
    }
}

/* The metadata section: n_kv entries. */
static int parse_kvs(cur *c, gang__gguf *g)
{
    uint64_t n_str = 0, i, koff, klen;
    int rc;

    for (i = 0; i < g->n_kv; i++) {
        gang__gguf_kv *kv = &g->kv[i];
        rc = cur_str(c, GANG__GGUF_MAX_KEY, &koff, &klen, "a metadata key");
        if (rc == 0)
            rc = cur_u32(c, &kv->type, "a metadata type");
        if (rc != 0)
            return rc;
        kv->key = (const char *)c->buf + koff; /* rebased onto g->hdr by the caller */
        kv->key_len = (uint32_t)klen;
        rc = kv_value(c, kv, &n_str);
        if (rc != 0)
            return rc;
    }
    if (n_str > 0) {
        g->str_offs = malloc((size_t)n_str * sizeof(uint64_t));
        if (g->str_offs == NULL)
            return GANG_ENOMEM;
    }
    return 0;
}

/* The alignment of general.alignment (a u32 power of two), or the default. */
static int parse_alignment(cur *c, gang__gguf *g)
{
    const gang__gguf_kv *kv = gang__gguf_find_kv(g, "general.alignment");

    g->alignment = GGUF_DEFAULT_ALIGN;
    if (kv == NULL)
        return 0;
    if (kv->type != GANG__GGUF_U32 || kv->num.u == 0 || (kv->num.u & (kv->num.u - 1)) != 0 ||
        kv->num.u > GANG__GGUF_MAX_ALIGN) {
        gang_set_err(c->err, c->errlen, "%s: general.alignment must be a u32 power of two up to %u",
                     c->name, GANG__GGUF_MAX_ALIGN);
        return GANG_EMODEL;
    }
    g->alignment = kv->num.u;
    return 0;
}

/* Checks a tensor's type and shape and computes its sizes. */
static int tensor_sizes(cur *c, gang__gguf_tensor *t)
{
    uint32_t be, bb, d;
    uint64_t rows = 1;
    const char *tn = gang__gguf_type_name(t->type);

    if (gang__gguf_type_block(t->type, &be, &bb) != 0) {
        if (tn != NULL)
            gang_set_err(c->err, c->errlen, "%s: tensor %s: type %s is not supported", c->name,
                         t->name, tn);
        else
            gang_set_err(c->err, c->errlen, "%s: tensor %s: unknown type %u", c->name, t->name,
                         t->type);
        return GANG_EMODEL;
    }
    for (d = 0; d < GANG__GGUF_MAX_DIMS; d++) {
        if (t->ne[d] == 0 || t->ne[d] > (1ull << 40)) {
            gang_set_err(c->err, c->errlen, "%s: tensor %s: dimension %u is %llu", c->name, t->name,
                         d, (unsigned long long)t->ne[d]);
            return GANG_EMODEL;
        }
        if (d > 0) {
            if (rows > UINT64_MAX / t->ne[d])
                goto out_big;
            rows *= t->ne[d];
        }
    }
    if (t->ne[0] % be != 0) {
        gang_set_err(c->err, c->errlen,
                     "%s: tensor %s: row of %llu elements is not whole %s blocks", c->name, t->name,
                     (unsigned long long)t->ne[0], tn);
        return GANG_EMODEL;
    }
    t->rows = rows;
    t->row_bytes = t->ne[0] / be * bb;
    if (rows > c->fsize / t->row_bytes)
        goto out_big;
    t->bytes = rows * t->row_bytes;
    return 0;
out_big:
    gang_set_err(c->err, c->errlen, "%s: tensor %s: larger than the file", c->name, t->name);
    return GANG_EMODEL;
}

/* The tensor infos: n_tensors entries. */
static int parse_tensors(cur *c, gang__gguf *g)
{
    uint64_t i, off, n;
    uint32_t d;
    int rc;

    for (i = 0; i < g->n_tensors; i++) {
        gang__gguf_tensor *t = &g->tensors[i];
        if ((rc = cur_str(c, GANG__GGUF_MAX_KEY, &off, &n, "a tensor name")) != 0)
            return rc;
        t->name = malloc((size_t)n + 1);
        if (t->name == NULL)
            return GANG_ENOMEM;
        memcpy(t->name, c->buf + off, (size_t)n);
        t->name[n] = '\0';
        if (strlen(t->name) != n) {
            gang_set_err(c->err, c->errlen, "%s: a tensor name holds a NUL byte", c->name);
            return GANG_EMODEL;
        }
        if ((rc = cur_u32(c, &t->n_dims, "a tensor's dimension count")) != 0)
            return rc;
        if (t->n_dims == 0 || t->n_dims > GANG__GGUF_MAX_DIMS) {
            gang_set_err(c->err, c->errlen, "%s: tensor %s: %u dimensions (1 to %u are read)",
                         c->name, t->name, t->n_dims, GANG__GGUF_MAX_DIMS);
            return GANG_EMODEL;
        }
        for (d = 0; d < GANG__GGUF_MAX_DIMS; d++) {
            t->ne[d] = 1;
            if (d < t->n_dims && (rc = cur_u64(c, &t->ne[d], "a tensor dimension")) != 0)
                return rc;
        }
        if ((rc = cur_u32(c, &t->type, "a tensor type")) != 0 ||
            (rc = cur_u64(c, &t->offset, "a tensor offset")) != 0)
            return rc;
        if ((rc = tensor_sizes(c, t)) != 0)
            return rc;
    }
    return 0;
}

static int cmp_name(const void *a, const void *b)
{
    return strcmp(((const gang__gguf_tensor *)a)->name, ((const gang__gguf_tensor *)b)->name);
}

/* bsearch's comparator: the key is the name itself (a const char *). */
static int cmp_name_key(const void *key, const void *elem)
{
    return strcmp(key, ((const gang__gguf_tensor *)elem)->name);
}

static int cmp_offset(const void *a, const void *b)
{
    const gang__gguf_tensor *x = *(const gang__gguf_tensor *const *)a;
    const gang__gguf_tensor *y = *(const gang__gguf_tensor *const *)b;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

/* Data placement: aligned offsets inside the file, no overlap, unique names. */
static int check_layout(cur *c, gang__gguf *g)
{
    const gang__gguf_tensor **by_off;
    uint64_t data_len;
    size_t i;
    int rc = 0;

    g->data_start = (c->pos + g->alignment - 1) / g->alignment * g->alignment;
    if (g->n_tensors > 0 && g->data_start > g->file_size) {
        gang_set_err(c->err, c->errlen, "%s: truncated: no data section", c->name);
        return GANG_EMODEL;
    }
    data_len = g->file_size > g->data_start ? g->file_size - g->data_start : 0;
    qsort(g->tensors, g->n_tensors, sizeof(*g->tensors), cmp_name);
    by_off = malloc((g->n_tensors ? g->n_tensors : 1) * sizeof(*by_off));
    if (by_off == NULL)
        return GANG_ENOMEM;
    for (i = 0; i < g->n_tensors; i++) {
        const gang__gguf_tensor *t = &g->tensors[i];
        by_off[i] = t;
        if (i > 0 && strcmp(t->name, g->tensors[i - 1].name) == 0) {
            gang_set_err(c->err, c->errlen, "%s: tensor %s appears twice", c->name, t->name);
            rc = GANG_EMODEL;
            goto out_free;
        }
        if (t->offset % g->alignment != 0) {
            gang_set_err(c->err, c->errlen, "%s: tensor %s: offset %llu is not a multiple of %llu",
                         c->name, t->name, (unsigned long long)t->offset,
                         (unsigned long long)g->alignment);
            rc = GANG_EMODEL;
            goto out_free;
        }
        if (t->offset > data_len || t->bytes > data_len - t->offset) {
            gang_set_err(c->err, c->errlen,
                         "%s: tensor %s: data [%llu, +%llu) lies outside the file's %llu data "
                         "bytes",
                         c->name, t->name, (unsigned long long)t->offset,
                         (unsigned long long)t->bytes, (unsigned long long)data_len);
            rc = GANG_EMODEL;
            goto out_free;
        }
    }
    qsort(by_off, g->n_tensors, sizeof(*by_off), cmp_offset);
    for (i = 1; i < g->n_tensors; i++) {
        if (by_off[i - 1]->offset + by_off[i - 1]->bytes > by_off[i]->offset) {
            gang_set_err(c->err, c->errlen, "%s: tensors %s and %s overlap", c->name,
                         by_off[i - 1]->name, by_off[i]->name);
            rc = GANG_EMODEL;
            goto out_free;
        }
    }
out_free:
    free(by_off);
    return rc;
}

/* Magic, version and counts. */
static int parse_preamble(cur *c, gang__gguf *g)
{
    uint32_t magic;
    int rc;

    if ((rc = cur_u32(c, &magic, "the magic")) != 0)
        return rc;
    if (memcmp(&magic, "GGUF", 4) != 0) {
        gang_set_err(c->err, c->errlen, "%s: not a GGUF file (bad magic)", c->name);
        return GANG_EMODEL;
    }
    if ((rc = cur_u32(c, &g->version, "the version")) != 0)
        return rc;
    if (g->version != 2 && g->version != 3) {
        gang_set_err(c->err, c->errlen, "%s: GGUF version %u is not supported (2 and 3 are)",
                     c->name, g->version);
        return GANG_EMODEL;
    }
    if ((rc = cur_u64(c, &g->n_tensors, "the tensor count")) != 0 ||
        (rc = cur_u64(c, &g->n_kv, "the metadata count")) != 0)
        return rc;
    /* A tensor info takes at least 8 + 4 + 8 + 4 + 8 bytes, a metadata entry 8 + 4 + 1. */
    if (g->n_tensors > GANG__GGUF_MAX_TENSORS || g->n_tensors > c->fsize / 32 ||
        g->n_kv > GANG__GGUF_MAX_KV || g->n_kv > c->fsize / 13) {
        gang_set_err(c->err, c->errlen, "%s: absurd counts: %llu tensors, %llu metadata entries",
                     c->name, (unsigned long long)g->n_tensors, (unsigned long long)g->n_kv);
        return GANG_EMODEL;
    }
    g->kv = calloc(g->n_kv ? g->n_kv : 1, sizeof(*g->kv));
    g->tensors = calloc(g->n_tensors ? g->n_tensors : 1, sizeof(*g->tensors));
    return g->kv == NULL || g->tensors == NULL ? GANG_ENOMEM : 0;
}

/* Frees what a parse allocated, keeping fd and path. */
static void gguf_free_parsed(gang__gguf *g)
{
    size_t i;

    for (i = 0; g->tensors != NULL && i < g->n_tensors; i++)
        free(g->tensors[i].name);
    free(g->tensors);
    free(g->kv);
    free(g->str_offs);
    free(g->hdr);
    g->tensors = NULL;
    g->kv = NULL;
    g->str_offs = NULL;
    g->hdr = NULL;
    g->n_tensors = g->n_kv = 0;
}

int gang__gguf_parse(const uint8_t *buf, size_t len, uint64_t file_size, const char *name,
                     gang__gguf *g, char *err, size_t errlen)
{
    cur c = {buf, len, file_size, 0, name, err, errlen};
    size_t i;
    int rc;

    g->file_size = file_size;
    rc = parse_preamble(&c, g);
    if (rc == 0)
        rc = parse_kvs(&c, g);
    if (rc == 0)
        rc = parse_tensors(&c, g);
    if (rc != 0)
        goto out_fail;
    g->hdr_len = (size_t)c.pos;
    g->hdr = malloc(g->hdr_len ? g->hdr_len : 1);
    if (g->hdr == NULL) {
        rc = GANG_ENOMEM;
        goto out_fail;
    }
    memcpy(g->hdr, buf, g->hdr_len);
    for (i = 0; i < g->n_kv; i++)
        g->kv[i].key = (const char *)g->hdr + ((const uint8_t *)g->kv[i].key - buf);
    kv_index_strings(g);
    rc = parse_alignment(&c, g);
    if (rc == 0)
        rc = check_layout(&c, g);
    if (rc == 0)
        return 0;
out_fail:
    gguf_free_parsed(g);
    return rc;
}

/* pread until n bytes; 0 or GANG_EIO (gguf.h). */
int gang__gguf_pread(int fd, void *buf, size_t n, uint64_t off)
{
    uint8_t *p = buf;

    while (n > 0) {
        ssize_t got = pread(fd, p, n, (off_t)off);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0)
            return GANG_EIO;
        p += got;
        n -= (size_t)got;
        off += (uint64_t)got;
    }
    return 0;
}

/* Reads the header of the open file g->fd, growing the buffer while the parser asks. */
static int gguf_read_header(gang__gguf *g, char *err, size_t errlen)
{
    uint64_t want = GGUF_FIRST_READ;
    uint8_t *buf = NULL;
    int rc;

    for (;;) {
        size_t len = (size_t)(want < g->file_size ? want : g->file_size);
        uint8_t *nb = realloc(buf, len ? len : 1);
        if (nb == NULL) {
            rc = GANG_ENOMEM;
            break;
        }
        buf = nb;
        if (gang__gguf_pread(g->fd, buf, len, 0) != 0) {
            gang_set_err(err, errlen, "%s: read failed", g->path);
            rc = GANG_EMODEL;
            break;
        }
        rc = gang__gguf_parse(buf, len, g->file_size, g->path, g, err, errlen);
        if (rc != GANG_EAGAIN)
            break;
        want *= 4; /* the parser bounds the header at GANG__GGUF_MAX_HEADER */
    }
    free(buf);
    return rc;
}

int gang__gguf_open(const char *path, gang__gguf *g, char *err, size_t errlen)
{
    struct stat st;
    int rc;

    memset(g, 0, sizeof(*g));
    g->fd = -1;
    g->path = strdup(path);
    if (g->path == NULL)
        return GANG_ENOMEM;
    g->fd = open(path, O_RDONLY | O_CLOEXEC);
    if (g->fd < 0) {
        gang_set_err(err, errlen, "%s: cannot open: %s", path, strerror(errno));
        rc = GANG_EMODEL;
        goto out_fail;
    }
    if (fstat(g->fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        gang_set_err(err, errlen, "%s: not a regular file", path);
        rc = GANG_EMODEL;
        goto out_fail;
    }
    g->file_size = (uint64_t)st.st_size;
    rc = gguf_read_header(g, err, errlen);
    if (rc == 0)
        return 0;
out_fail:
    gang__gguf_close(g);
    return rc;
}

void gang__gguf_close(gang__gguf *g)
{
    if (g == NULL)
        return;
    gguf_free_parsed(g);
    if (g->path != NULL && g->fd >= 0) /* path: opened by gang__gguf_open (a zeroed struct
                                          holds fd 0, which is not ours) */
        close(g->fd);
    free(g->path);
    memset(g, 0, sizeof(*g));
    g->fd = -1;
}

const gang__gguf_kv *gang__gguf_find_kv(const gang__gguf *g, const char *key)
{
    size_t i, n = strlen(key);

    for (i = 0; i < g->n_kv; i++)
        if (g->kv[i].key_len == n && memcmp(g->kv[i].key, key, n) == 0)
            return &g->kv[i];
    return NULL;
}

const gang__gguf_tensor *gang__gguf_find(const gang__gguf *g, const char *name)
{
    if (g->n_tensors == 0)
        return NULL;
    return bsearch(name, g->tensors, g->n_tensors, sizeof(*g->tensors), cmp_name_key);
}

gang__gguf_str gang__gguf_arr_str(const gang__gguf *g, const gang__gguf_kv *kv, uint64_t i)
{
    gang__gguf_str s = {"", 0};
    uint64_t pos;

    if (kv->type == GANG__GGUF_STRING && i == 0) {
        s.p = (const char *)g->hdr + kv->off;
        s.n = kv->n;
    } else if (kv->type == GANG__GGUF_ARRAY && kv->arr_type == GANG__GGUF_STRING && i < kv->n) {
        pos = g->str_offs[kv->off + i];
        memcpy(&s.n, g->hdr + pos, 8);
        s.p = (const char *)g->hdr + pos + 8;
    }
    return s;
}

int64_t gang__gguf_arr_int(const gang__gguf *g, const gang__gguf_kv *kv, uint64_t i)
{
    gang__gguf_kv one;
    int sz;

    if (kv->type != GANG__GGUF_ARRAY || i >= kv->n)
        return 0;
    sz = kv_type_size(kv->arr_type);
    if (sz <= 0 || kv->arr_type == GANG__GGUF_F32 || kv->arr_type == GANG__GGUF_F64)
        return 0;
    memset(&one, 0, sizeof(one));
    kv_scalar(g->hdr + kv->off + i * (uint64_t)sz, kv->arr_type, &one);
    return one.num.i;
}

double gang__gguf_arr_float(const gang__gguf *g, const gang__gguf_kv *kv, uint64_t i)
{
    gang__gguf_kv one;

    if (kv->type != GANG__GGUF_ARRAY || i >= kv->n ||
        (kv->arr_type != GANG__GGUF_F32 && kv->arr_type != GANG__GGUF_F64))
        return 0.0;
    memset(&one, 0, sizeof(one));
    kv_scalar(g->hdr + kv->off + i * (uint64_t)kv_type_size(kv->arr_type), kv->arr_type, &one);
    return one.num.f;
}

int gang__gguf_read(const gang__gguf *g, const gang__gguf_tensor *t, uint64_t row_first,
                    uint64_t row_count, uint64_t col_first, uint64_t col_count, float *dst)
{
    uint64_t cols = t->ne[0], per, r, i;
    uint8_t *raw;
    float *row;
    int rc = 0;

    if (row_first > t->rows || row_count > t->rows - row_first || col_first > cols ||
        col_count > cols - col_first)
        return GANG_EINVAL;
    per = GGUF_READ_CHUNK / t->row_bytes;
    if (per == 0)
        per = 1;
    if (per > row_count)
        per = row_count ? row_count : 1;
    raw = malloc((size_t)(per * t->row_bytes));
    row = malloc((size_t)cols * sizeof(float));
    if (raw == NULL || row == NULL) {
        rc = GANG_ENOMEM;
        goto out_free;
    }
    for (r = 0; r < row_count && rc == 0; r += per) {
        uint64_t n = row_count - r < per ? row_count - r : per;
        rc = gang__gguf_pread(g->fd, raw, (size_t)(n * t->row_bytes),
                              g->data_start + t->offset + (row_first + r) * t->row_bytes);
        for (i = 0; i < n && rc == 0; i++) {
            float *out = dst + (r + i) * col_count;
            if (col_first == 0 && col_count == cols) {
                gang__gguf_dequant(t->type, raw + i * t->row_bytes, out, cols);
                continue;
            }
            gang__gguf_dequant(t->type, raw + i * t->row_bytes, row, cols);
            memcpy(out, row + col_first, (size_t)col_count * sizeof(float));
        }
    }
out_free:
    free(raw);
    free(row);
    return rc;
}
