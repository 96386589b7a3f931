/*
 * GGUF files (model/gguf*.c): hand-built files from a tiny writer below.
 *
 *  - every refusal of the header parser (bad magic, version, truncation at each part,
 *    absurd counts, string and array lengths past the end, nested arrays, duplicate
 *    names, overlapping, out-of-bounds and misaligned data, bad alignment, unknown and
 *    unsupported types), each with the message it must give;
 *  - dequantization of every type against values computed here, with the loops of the
 *    format's description (not the reader's own structure);
 *  - a whole tiny llama model: config from metadata, tied head, q/k rows back in the
 *    Hugging Face order, TP 2 shards, a tensor shape that disagrees with the metadata,
 *    the tokenizer and chat template from metadata.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "fixtures.h"
#include "ganglion/model.h"
#include "ganglion/rendezvous.h"
#include "gguf.h"

/* ---- a tiny GGUF writer ---- */

typedef struct gw {
    uint8_t *b;
    size_t n, cap;
} gw;

static void w_bytes(gw *w, const void *p, size_t n)
{
    if (w->n + n > w->cap) {
        w->cap = (w->n + n) * 2 + 64;
        w->b = realloc(w->b, w->cap);
        assert_non_null(w->b);
    }
    memcpy(w->b + w->n, p, n);
    w->n += n;
}
static void w_u32(gw *w, uint32_t v)
{
    w_bytes(w, &v, 4);
}
static void w_u64(gw *w, uint64_t v)
{
    w_bytes(w, &v, 8);
}
static void w_str(gw *w, const char *s)
{
    w_u64(w, strlen(s));
    w_bytes(w, s, strlen(s));
}
static void kv_u32(gw *w, const char *k, uint32_t v)
{
    w_str(w, k);
    w_u32(w, GANG__GGUF_U32);
    w_u32(w, v);
}
static void kv_f32(gw *w, const char *k, float v)
{
    w_str(w, k);
    w_u32(w, GANG__GGUF_F32);
    w_bytes(w, &v, 4);
}
static void kv_str(gw *w, const char *k, const char *v)
{
    w_str(w, k);
    w_u32(w, GANG__GGUF_STRING);
    w_str(w, v);
}
static void kv_strs(gw *w, const char *k, const char *const *v, size_t n)
{
    w_str(w, k);
    w_u32(w, GANG__GGUF_ARRAY);
    w_u32(w, GANG__GGUF_STRING);
    w_u64(w, n);
    for (size_t i = 0; i < n; i++)
        w_str(w, v[i]);
}
static void kv_i32s(gw *w, const char *k, const int32_t *v, size_t n)
{
    w_str(w, k);
    w_u32(w, GANG__GGUF_ARRAY);
    w_u32(w, GANG__GGUF_I32);
    w_u64(w, n);
    w_bytes(w, v, n * 4);
}

static void kv_f32s(gw *w, const char *k, const float *v, size_t n)
{
    w_str(w, k);
    w_u32(w, GANG__GGUF_ARRAY);
    w_u32(w, GANG__GGUF_F32);
    w_u64(w, n);
    w_bytes(w, v, n * 4);
}

#define AUTO UINT64_MAX
typedef struct tdesc {
    const char *name;
    uint32_t type, nd;
    uint64_t ne[5];
    const void *data; /* bytes of the tensor (NULL: zeros) */
    size_t len;       /* its byte size */
    uint64_t offset;  /* AUTO: next aligned place */
} tdesc;

/* A whole file: version, metadata (n_kv entries in meta), tensors, alignment 32. */
static uint8_t *build(uint32_t version, const gw *meta, uint64_t n_kv, const tdesc *t, size_t nt,
                      size_t *len)
{
    gw w = {0};
    uint64_t off = 0, offs[32];
    size_t i;

    w_bytes(&w, "GGUF", 4);
    w_u32(&w, version);
    w_u64(&w, nt);
    w_u64(&w, n_kv);
    if (meta->n)
        w_bytes(&w, meta->b, meta->n);
    for (i = 0; i < nt; i++) {
        offs[i] = t[i].offset == AUTO ? off : t[i].offset;
        if (t[i].offset == AUTO)
            off = (off + t[i].len + 31) / 32 * 32;
        w_str(&w, t[i].name);
        w_u32(&w, t[i].nd);
        for (uint32_t d = 0; d < t[i].nd; d++)
            w_u64(&w, t[i].ne[d]);
        w_u32(&w, t[i].type);
        w_u64(&w, offs[i]);
    }
    while (w.n % 32)
        w_bytes(&w, "", 1);
    size_t start = w.n;
    for (i = 0; i < nt; i++) {
        while (w.n < start + offs[i])
            w_bytes(&w, "", 1);
        if (w.n > start + offs[i])
            continue; /* overlapping on purpose: the bytes are there already */
        if (t[i].data)
            w_bytes(&w, t[i].data, t[i].len);
        else
            for (size_t k = 0; k < t[i].len; k++)
                w_bytes(&w, "", 1);
    }
    *len = w.n;
    return w.b;
}

/* Parses buf[0..len) as a whole file: the return code, and the message in err. */
static int parse(const uint8_t *buf, size_t len, char *err)
{
    gang__gguf g;
    int rc;

    memset(&g, 0, sizeof(g));
    g.fd = -1;
    err[0] = '\0';
    rc = gang__gguf_parse(buf, len, len, "t.gguf", &g, err, ERRLEN);
    gang__gguf_close(&g);
    return rc;
}

static void expect_refused(const uint8_t *buf, size_t len, const char *what)
{
    char err[ERRLEN];
    int rc = parse(buf, len, err);

    if (rc != GANG_EMODEL || strstr(err, what) == NULL)
        fail_msg("expected a refusal with \"%s\", got %d: %s", what, rc, err);
}

/* One F32 tensor [32] with its metadata "general.architecture". */
static uint8_t *one_tensor(uint32_t type, uint64_t ne0, uint64_t offset, size_t *len)
{
    gw m = {0};
    tdesc t = {"w", type, 1, {ne0, 1, 1, 1}, NULL, 128, offset};
    uint8_t *b;

    kv_str(&m, "general.architecture", "llama");
    b = build(3, &m, 1, &t, 1, len);
    free(m.b);
    return b;
}

static void test_refusals_header(void **state)
{
    (void)state;
    size_t len;
    uint8_t *b = one_tensor(GANG__GGML_F32, 32, AUTO, &len);
    char err[ERRLEN];

    assert_int_equal(parse(b, len, err), 0);
    b[0] = 'X';
    expect_refused(b, len, "bad magic");
    b[0] = 'G';
    b[4] = 1;
    expect_refused(b, len, "version 1");
    b[4] = 3;
    /* Truncated: in the counts, in the metadata, in the tensor infos, in the data. */
    expect_refused(b, 12, "truncated");
    expect_refused(b, 40, "truncated");
    expect_refused(b, 70, "truncated");
    expect_refused(b, len - 1, "outside the file");
    /* Absurd counts. */
    uint64_t huge = 1ull << 40;
    memcpy(b + 8, &huge, 8);
    expect_refused(b, len, "absurd counts");
    memcpy(b + 8, &(uint64_t){1}, 8);
    memcpy(b + 16, &huge, 8);
    expect_refused(b, len, "absurd counts");
    memcpy(b + 16, &(uint64_t){1}, 8);
    /* A key length past the end of the file, and one beyond the cap. */
    memcpy(b + 24, &(uint64_t){len}, 8);
    expect_refused(b, len, "truncated");
    memcpy(b + 24, &huge, 8);
    expect_refused(b, len, "exceeds the limit");
    free(b);
}

static void test_refusals_metadata(void **state)
{
    (void)state;
    size_t len;
    gw m = {0};
    uint8_t *b;

    /* Nested array. */
    w_str(&m, "x");
    w_u32(&m, GANG__GGUF_ARRAY);
    w_u32(&m, GANG__GGUF_ARRAY);
    w_u64(&m, 1);
    b = build(3, &m, 1, NULL, 0, &len);
    expect_refused(b, len, "nested arrays");
    free(b);
    /* An array count the file cannot hold. */
    m.n = 0;
    w_str(&m, "x");
    w_u32(&m, GANG__GGUF_ARRAY);
    w_u32(&m, GANG__GGUF_U32);
    w_u64(&m, 1u << 20);
    b = build(3, &m, 1, NULL, 0, &len);
    expect_refused(b, len, "too long");
    free(b);
    /* A string array whose element length runs past the end. */
    m.n = 0;
    w_str(&m, "x");
    w_u32(&m, GANG__GGUF_ARRAY);
    w_u32(&m, GANG__GGUF_STRING);
    w_u64(&m, 1);
    w_u64(&m, 1000);
    b = build(3, &m, 1, NULL, 0, &len);
    expect_refused(b, len, "truncated");
    free(b);
    /* A header beyond GANG__GGUF_MAX_HEADER in a large file: refused, not read. */
    m.n = 0;
    w_str(&m, "x");
    w_u32(&m, GANG__GGUF_ARRAY);
    w_u32(&m, GANG__GGUF_U64);
    w_u64(&m, 1u << 24); /* 128 MiB of u64 */
    b = build(3, &m, 1, NULL, 0, &len);
    {
        gang__gguf g = {.fd = -1};
        char err[ERRLEN];
        assert_int_equal(gang__gguf_parse(b, len, 1ull << 30, "big.gguf", &g, err, sizeof(err)),
                         GANG_EMODEL);
        assert_non_null(strstr(err, "header larger than 64 MiB"));
        /* The same within the limit only asks for more bytes. */
        memcpy(b + 41, &(uint64_t){1u << 20}, 8); /* the array count */
        int rc = gang__gguf_parse(b, len, 1ull << 30, "big.gguf", &g, err, sizeof(err));
        if (rc != GANG_EAGAIN)
            fail_msg("expected GANG_EAGAIN, got %d: %s", rc, err);
    }
    free(b);
    /* An unknown value type. */
    m.n = 0;
    w_str(&m, "x");
    w_u32(&m, 77);
    b = build(3, &m, 1, NULL, 0, &len);
    expect_refused(b, len, "unknown value type 77");
    free(b);
    /* general.alignment not a power of two. */
    m.n = 0;
    kv_u32(&m, "general.alignment", 24);
    b = build(3, &m, 1, NULL, 0, &len);
    expect_refused(b, len, "general.alignment");
    free(b);
    free(m.b);
}

static void test_refusals_tensors(void **state)
{
    (void)state;
    size_t len;
    uint8_t *b;
    gw m = {0};
    uint8_t zeros[256] = {0};

    b = one_tensor(99, 32, AUTO, &len);
    expect_refused(b, len, "unknown type 99");
    free(b);
    b = one_tensor(10, 256, AUTO, &len); /* Q2_K: known to ggml, not read here */
    expect_refused(b, len, "type Q2_K is not supported");
    free(b);
    b = one_tensor(GANG__GGML_Q8_0, 48, AUTO, &len);
    expect_refused(b, len, "not whole Q8_0 blocks");
    free(b);
    b = one_tensor(GANG__GGML_F32, 32, 8, &len);
    expect_refused(b, len, "not a multiple of 32");
    free(b);
    b = one_tensor(GANG__GGML_F32, 32, AUTO, &len);
    memcpy(b + 94, &(uint64_t){1u << 20}, 8); /* the offset field of the one tensor info */
    expect_refused(b, len, "outside the file");
    memcpy(b + 94, &(uint64_t){UINT64_MAX - 31}, 8); /* offset + bytes would wrap */
    expect_refused(b, len, "outside the file");
    free(b);
    b = one_tensor(GANG__GGML_F32, 0, AUTO, &len);
    expect_refused(b, len, "dimension 0 is 0");
    free(b);
    /* Five dimensions. */
    tdesc t5 = {"w", GANG__GGML_F32, 5, {1, 1, 1, 1}, zeros, 4, AUTO};
    b = build(3, &m, 0, &t5, 1, &len);
    expect_refused(b, len, "5 dimensions");
    free(b);
    /* Duplicate names; overlapping data. */
    tdesc two[2] = {{"w", GANG__GGML_F32, 1, {32, 1, 1, 1}, zeros, 128, AUTO},
                    {"w", GANG__GGML_F32, 1, {32, 1, 1, 1}, zeros, 128, AUTO}};
    b = build(3, &m, 0, two, 2, &len);
    expect_refused(b, len, "appears twice");
    free(b);
    two[1].name = "v";
    two[1].offset = 64; /* inside w's 256 bytes */
    two[0].ne[0] = 64;
    two[0].len = 256;
    b = build(3, &m, 0, two, 2, &len);
    expect_refused(b, len, "overlap");
    free(b);
    two[1].offset = AUTO;
    b = build(3, &m, 0, two, 2, &len);
    char err[ERRLEN];
    assert_int_equal(parse(b, len, err), 0);
    free(b);
}

/* ---- dequantization ---- */

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint8_t rbyte(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint8_t)(rng >> 24);
}
static void put_f16(uint8_t *p, float v)
{
    uint16_t h = gang_f32_to_f16(v);
    memcpy(p, &h, 2);
}

/* Random blocks of a type with its scales set to sane values at the given offsets. */
static void fill(uint8_t *blk, size_t n, const size_t *f16_at, size_t n_f16, const float *vals)
{
    for (size_t i = 0; i < n; i++)
        blk[i] = rbyte();
    for (size_t i = 0; i < n_f16; i++)
        put_f16(blk + f16_at[i], vals[i]);
}

static void check(uint32_t type, const uint8_t *blk, const float *want, size_t n)
{
    float got[256];
    gang__gguf_dequant(type, blk, got, n);
    for (size_t i = 0; i < n; i++)
        if (got[i] != want[i])
            fail_msg("%s element %zu: got %g, want %g", gang__gguf_type_name(type), i, got[i],
                     want[i]);
}

static void test_dequant_32(void **state)
{
    (void)state;
    uint8_t b[64];
    float want[32], d = 0.5f, m = -1.25f;

    for (int rep = 0; rep < 8; rep++) {
        fill(b, 34, (size_t[]){0}, 1, &d);
        for (int j = 0; j < 32; j++)
            want[j] = d * (float)(int8_t)b[2 + j];
        check(GANG__GGML_Q8_0, b, want, 32);

        fill(b, 18, (size_t[]){0}, 1, &d);
        for (int j = 0; j < 32; j++) {
            int q = j < 16 ? (b[2 + j] & 15) : (b[2 + j - 16] >> 4);
            want[j] = (float)(q - 8) * d;
        }
        check(GANG__GGML_Q4_0, b, want, 32);

        fill(b, 20, (size_t[]){0, 2}, 2, (float[]){d, m});
        for (int j = 0; j < 32; j++) {
            int q = j < 16 ? (b[4 + j] & 15) : (b[4 + j - 16] >> 4);
            want[j] = (float)q * d + m;
        }
        check(GANG__GGML_Q4_1, b, want, 32);

        fill(b, 22, (size_t[]){0}, 1, &d);
        for (int j = 0; j < 32; j++) {
            int q = j < 16 ? (b[6 + j] & 15) : (b[6 + j - 16] >> 4);
            q += ((b[2 + j / 8] >> (j % 8)) & 1) * 16; /* bit j of the little-endian qh */
            want[j] = (float)(q - 16) * d;
        }
        check(GANG__GGML_Q5_0, b, want, 32);

        fill(b, 24, (size_t[]){0, 2}, 2, (float[]){d, m});
        for (int j = 0; j < 32; j++) {
            int q = j < 16 ? (b[8 + j] & 15) : (b[8 + j - 16] >> 4);
            q += ((b[4 + j / 8] >> (j % 8)) & 1) * 16;
            want[j] = (float)q * d + m;
        }
        check(GANG__GGML_Q5_1, b, want, 32);
    }
    /* F16, BF16 and F32 are exact. */
    uint16_t h[4] = {0x3c00, 0xc000, 0x3555, 0x0001};
    float wf[4] = {1.0f, -2.0f, gang_f16_to_f32(0x3555), gang_f16_to_f32(0x0001)};
    check(GANG__GGML_F16, (const uint8_t *)h, wf, 4);
    uint16_t bf[2] = {0x3f80, 0xc0a0};
    check(GANG__GGML_BF16, (const uint8_t *)bf, (float[]){1.0f, -5.0f}, 2);
    float f[2] = {3.25f, -0.0f};
    check(GANG__GGML_F32, (const uint8_t *)f, f, 2);
}

/* 6-bit scale / min j of the 12 packed bytes (the format description's formula). */
static void scale_min(int j, const uint8_t *q, uint8_t *d, uint8_t *m)
{
    if (j < 4) {
        *d = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *d = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        *m = (uint8_t)((q[j + 4] >> 4) | ((q[j - 0] >> 6) << 4));
    }
}

/* The kernels' own dequantization of block weights (kernels/weight-blocks.c, which the
 * CPU products are tested against in unit-kernels-blocks) equals this reader's, which
 * unit-model-gguf-ref holds to the gguf package: equal values on random blocks. */
static void test_dequant_kernels(void **state)
{
    (void)state;
    static const struct {
        uint32_t ggml;
        gang_kernels_wtype kw;
        size_t f16_at[2], n_f16;
    } pairs[] = {
        {GANG__GGML_Q8_0, GANG_KW_Q8_0, {0}, 1},     {GANG__GGML_Q4_0, GANG_KW_Q4_0, {0}, 1},
        {GANG__GGML_Q4_1, GANG_KW_Q4_1, {0, 2}, 2},  {GANG__GGML_Q5_0, GANG_KW_Q5_0, {0}, 1},
        {GANG__GGML_Q5_1, GANG_KW_Q5_1, {0, 2}, 2},  {GANG__GGML_Q4_K, GANG_KW_Q4_K, {0, 2}, 2},
        {GANG__GGML_Q5_K, GANG_KW_Q5_K, {0, 2}, 2},  {GANG__GGML_Q6_K, GANG_KW_Q6_K, {208}, 1},
        {GANG__GGML_IQ4_NL, GANG_KW_IQ4_NL, {0}, 1}, {GANG__GGML_IQ4_XS, GANG_KW_IQ4_XS, {0}, 1}};
    uint8_t b[3 * 256];
    float want[3 * 256], got[3 * 256], vals[2] = {0.375f, -0.0625f};

    for (size_t i = 0; i < sizeof(pairs) / sizeof(pairs[0]); i++) {
        uint32_t e, bytes;
        assert_int_equal(gang__gguf_type_block(pairs[i].ggml, &e, &bytes), 0);
        for (int rep = 0; rep < 3; rep++)
            fill(b + (size_t)rep * bytes, bytes, pairs[i].f16_at, pairs[i].n_f16, vals);
        gang__gguf_dequant(pairs[i].ggml, b, want, 3 * (uint64_t)e);
        assert_int_equal(gang_kernels_block_dequant(pairs[i].kw, b, 3 * (size_t)e, got), 0);
        for (size_t j = 0; j < 3 * (size_t)e; j++) /* == : -0 and +0 are one value */
            if (!(got[j] == want[j]))
                fail_msg("%s element %zu: kernels %g, reader %g",
                         gang_kernels_wtype_name(pairs[i].kw), j, got[j], want[j]);
    }
}

/*
 * IQ4_NL and IQ4_XS, written here from the formats' description: a 4-bit code indexes a
 * fixed table of 16 values; IQ4_NL is d | 16 bytes of codes (element j < 16 the low nibble
 * of byte j, j + 16 its high one); IQ4_XS is d | u16 scales_h | scales_l[4] | 128 bytes of
 * codes, sub-block i of 32 scaled by d (s - 32) with s's low four bits nibble i of
 * scales_l (low nibble first) and its top two bits 2i, 2i + 1 of scales_h.
 */
static void dequant_iq4(uint8_t *b, float *want, float d)
{
    static const int tbl[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                1,    13,   25,  38,  53,  69,  89,  113};

    fill(b, 18, (size_t[]){0}, 1, &d);
    for (int j = 0; j < 16; j++) {
        want[j] = d * (float)tbl[b[2 + j] & 15];
        want[j + 16] = d * (float)tbl[b[2 + j] >> 4];
    }
    check(GANG__GGML_IQ4_NL, b, want, 32);
    fill(b, 136, (size_t[]){0}, 1, &d);
    unsigned sh = (unsigned)b[2] | (unsigned)b[3] << 8;
    for (int ib = 0; ib < 8; ib++) {
        int ls = ((b[4 + ib / 2] >> 4 * (ib % 2)) & 15) | (int)((sh >> 2 * ib) & 3) << 4;
        float dl = d * (float)(ls - 32);
        for (int j = 0; j < 16; j++) {
            want[32 * ib + j] = dl * (float)tbl[b[8 + 16 * ib + j] & 15];
            want[32 * ib + j + 16] = dl * (float)tbl[b[8 + 16 * ib + j] >> 4];
        }
    }
    check(GANG__GGML_IQ4_XS, b, want, 256);
}

static void test_dequant_k(void **state)
{
    (void)state;
    uint8_t b[256];
    float want[256], d = 0.125f, dmin = 0.0625f;

    for (int rep = 0; rep < 8; rep++) {
        /* Q4_K and Q5_K: 64 elements (two sub-blocks) per 32 bytes of qs. */
        for (int five = 0; five < 2; five++) {
            fill(b, five ? 176 : 144, (size_t[]){0, 2}, 2, (float[]){d, dmin});
            const uint8_t *sc = b + 4, *qh = b + 16, *q = b + (five ? 48 : 16);
            float *y = want;
            int is = 0;
            uint8_t u1 = 1, u2 = 2, s, mn;
            for (int j = 0; j < 256; j += 64) {
                scale_min(is, sc, &s, &mn);
                float d1 = d * s, m1 = dmin * mn;
                scale_min(is + 1, sc, &s, &mn);
                float d2 = d * s, m2 = dmin * mn;
                for (int l = 0; l < 32; l++)
                    *y++ = d1 * (float)((q[l] & 0xF) + (five && (qh[l] & u1) ? 16 : 0)) - m1;
                for (int l = 0; l < 32; l++)
                    *y++ = d2 * (float)((q[l] >> 4) + (five && (qh[l] & u2) ? 16 : 0)) - m2;
                q += 32;
                is += 2;
                u1 = (uint8_t)(u1 << 2);
                u2 = (uint8_t)(u2 << 2);
            }
            check(five ? GANG__GGML_Q5_K : GANG__GGML_Q4_K, b, want, 256);
        }
        /* Q6_K: per 128 elements, 64 ql bytes, 32 qh bytes, 8 scales. */
        fill(b, 210, (size_t[]){208}, 1, &d);
        const uint8_t *ql = b, *qh = b + 128;
        const int8_t *sc = (const int8_t *)(b + 192);
        float *y = want;
        for (int n = 0; n < 256; n += 128) {
            for (int l = 0; l < 32; l++) {
                int is = l / 16;
                int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
                int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
                int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                y[l] = d * sc[is] * q1;
                y[l + 32] = d * sc[is + 2] * q2;
                y[l + 64] = d * sc[is + 4] * q3;
                y[l + 96] = d * sc[is + 6] * q4;
            }
            y += 128;
            ql += 64;
            qh += 32;
            sc += 8;
        }
        check(GANG__GGML_Q6_K, b, want, 256);
        dequant_iq4(b, want, d);
    }
}

/* ---- a whole tiny llama model ---- */

#define H 32   /* hidden */
#define HD 16  /* head_dim: 2 heads, 1 kv head */
#define FFN 32 /* ffn */
#define V 4    /* vocab */

static float q_val(int r, int c)
{
    return (float)(r * 100 + c);
}
static int k_q(int r, int c)
{
    return (r * 7 + c) % 50 - 25;
}
static float o_val(int r, int c)
{
    return (float)((r + 2 * c) % 16 - 8);
}

/* Tokenizer metadata of the next write_model: model, pre-tokenizer, add_bos_token. */
static const char *tok_model = "gpt2", *tok_pre = "smollm";
static int tok_add_bos;
/* SentencePiece ("llama") files: whether scores are written, add_space_prefix (-1: absent). */
static int tok_scores = 1, tok_space_prefix = -1;
/* A rope_freqs.weight tensor of HD / 2 factors when set (Llama 3.1 files). */
static const float *rope_freqs;
/* SentencePiece: token 1 replaced by this one when set (a piece too long to merge). */
static const char *tok_spm_piece1;
/* Architecture of the next write_model: "llama", or "qwen2" (its keys, q/k/v biases). */
static const char *arch = "llama";

/* ARCH.name, for the architecture's keys. */
static const char *akey(const char *name)
{
    static char buf[8][96];
    static int next;
    char *b = buf[next++ % 8];
    snprintf(b, sizeof(buf[0]), "%s.%s", arch, name);
    return b;
}
static float bias_val(int r)
{
    return (float)r * 0.25f - 2.0f;
}

/* Writes the model to path (gate_rows: rows of ffn_gate, FFN when well-formed). */
static void write_model(const char *path, uint64_t gate_rows)
{
    static const char *const gpt2_toks[] = {"a", "b", "ab", "<|end|>"};
    /* SentencePiece: "\u2581a" is the only merge; <s> a control token. */
    static const char *const spm_toks[] = {"\u2581", "a", "\u2581a", "<s>"};
    static const float spm_scores[] = {-1.0f, -2.0f, -0.5f, 0.0f};
    static const char *const merges[] = {"a b"};
    int spm = strcmp(tok_model, "llama") == 0;
    const char *spm_long[] = {spm_toks[0], tok_spm_piece1, spm_toks[2], spm_toks[3]};
    const char *const *toks = spm ? (tok_spm_piece1 != NULL ? spm_long : spm_toks) : gpt2_toks;
    static const int32_t types[] = {1, 1, 1, 3};
    static float embd[V * H], ones[H], q[H * H], bias[H];
    static uint8_t k[HD * 34], o[H * H * 2], v[HD * H * 2], zq[FFN * H * 2];
    gw m = {0};
    size_t len, i;
    int r, c;

    for (r = 0; r < V; r++)
        for (c = 0; c < H; c++)
            embd[r * H + c] = (float)(r * H + c) / 64.0f;
    for (i = 0; i < H; i++) {
        ones[i] = 1.0f;
        bias[i] = bias_val((int)i);
    }
    for (r = 0; r < H; r++)
        for (c = 0; c < H; c++) {
            uint16_t bf = gang_f32_to_bf16(o_val(r, c));
            q[r * H + c] = q_val(r, c);
            memcpy(o + 2 * (r * H + c), &bf, 2);
        }
    for (r = 0; r < HD; r++) { /* one Q8_0 block a row, d = 1 */
        put_f16(k + r * 34, 1.0f);
        for (c = 0; c < H; c++)
            k[r * 34 + 2 + c] = (uint8_t)(int8_t)k_q(r, c);
        for (c = 0; c < H; c++) {
            uint16_t h = gang_f32_to_f16((float)((r + c) % 16 - 8));
            memcpy(v + 2 * (r * H + c), &h, 2);
        }
    }
    kv_str(&m, "general.architecture", arch);
    kv_u32(&m, akey("block_count"), 1);
    kv_u32(&m, akey("embedding_length"), H);
    kv_u32(&m, akey("feed_forward_length"), FFN);
    kv_u32(&m, akey("attention.head_count"), H / HD);
    kv_u32(&m, akey("attention.head_count_kv"), 1);
    kv_u32(&m, akey("context_length"), 64);
    kv_f32(&m, akey("attention.layer_norm_rms_epsilon"), 1e-5f);
    kv_f32(&m, akey("rope.freq_base"), 10000.0f);
    kv_str(&m, "tokenizer.ggml.model", tok_model);
    kv_str(&m, "tokenizer.ggml.pre", tok_pre);
    w_str(&m, "tokenizer.ggml.add_bos_token");
    w_u32(&m, GANG__GGUF_BOOL);
    w_bytes(&m, &(uint8_t){(uint8_t)tok_add_bos}, 1);
    kv_strs(&m, "tokenizer.ggml.tokens", toks, V);
    kv_i32s(&m, "tokenizer.ggml.token_type", types, V);
    if (!spm)
        kv_strs(&m, "tokenizer.ggml.merges", merges, 1);
    if (spm && tok_scores)
        kv_f32s(&m, "tokenizer.ggml.scores", spm_scores, V);
    if (spm && tok_space_prefix >= 0) {
        w_str(&m, "tokenizer.ggml.add_space_prefix");
        w_u32(&m, GANG__GGUF_BOOL);
        w_bytes(&m, &(uint8_t){(uint8_t)tok_space_prefix}, 1);
    }
    kv_u32(&m, "tokenizer.ggml.bos_token_id", 3);
    kv_u32(&m, "tokenizer.ggml.eos_token_id", 3);
    kv_str(&m, "tokenizer.chat_template",
           "{% for m in messages %}{{ m['content'] }}{{ eos_token }}{% endfor %}");
    tdesc t[] = {
        {"token_embd.weight", GANG__GGML_F32, 2, {H, V}, embd, sizeof(embd), AUTO},
        {"blk.0.attn_norm.weight", GANG__GGML_F32, 1, {H}, ones, sizeof(ones), AUTO},
        {"blk.0.attn_q.weight", GANG__GGML_F32, 2, {H, H}, q, sizeof(q), AUTO},
        {"blk.0.attn_k.weight", GANG__GGML_Q8_0, 2, {H, HD}, k, sizeof(k), AUTO},
        {"blk.0.attn_v.weight", GANG__GGML_F16, 2, {H, HD}, v, sizeof(v), AUTO},
        {"blk.0.attn_output.weight", GANG__GGML_BF16, 2, {H, H}, o, sizeof(o), AUTO},
        {"blk.0.ffn_norm.weight", GANG__GGML_F32, 1, {H}, ones, sizeof(ones), AUTO},
        {"blk.0.ffn_gate.weight", GANG__GGML_Q4_0, 2, {H, gate_rows}, zq, gate_rows * 18, AUTO},
        {"blk.0.ffn_up.weight", GANG__GGML_Q4_1, 2, {H, FFN}, zq, FFN * 20, AUTO},
        {"blk.0.ffn_down.weight", GANG__GGML_Q5_0, 2, {FFN, H}, zq, H * 22, AUTO},
        {"output_norm.weight", GANG__GGML_F32, 1, {H}, ones, sizeof(ones), AUTO},
        {"blk.0.attn_q.bias", GANG__GGML_F32, 1, {H}, bias, sizeof(bias), AUTO},
        {"blk.0.attn_k.bias", GANG__GGML_F32, 1, {HD}, bias, HD * 4, AUTO},
        {"blk.0.attn_v.bias", GANG__GGML_F32, 1, {HD}, bias, HD * 4, AUTO},
    };
    size_t nt = sizeof(t) / sizeof(t[0]) - (strcmp(arch, "qwen2") == 0 ? 0 : 3);
    tdesc all[sizeof(t) / sizeof(t[0]) + 5];
    memcpy(all, t, nt * sizeof(t[0]));
    if (rope_freqs != NULL)
        all[nt++] = (tdesc){"rope_freqs.weight", GANG__GGML_F32,         1,   {HD / 2},
                            rope_freqs,          HD / 2 * sizeof(float), AUTO};
    /* qwen3 and gemma3: per-head q/k norms; gemma3: the norms after each block. */
    static float hd_norm[HD], post[H];
    for (i = 0; i < HD; i++)
        hd_norm[i] = 0.5f + (float)i / 8.0f;
    for (i = 0; i < H; i++)
        post[i] = 2.0f - (float)i / 32.0f;
    if (strcmp(arch, "qwen3") == 0 || strcmp(arch, "gemma3") == 0) {
        all[nt++] = (tdesc){
            "blk.0.attn_q_norm.weight", GANG__GGML_F32, 1, {HD}, hd_norm, sizeof(hd_norm), AUTO};
        all[nt++] = (tdesc){
            "blk.0.attn_k_norm.weight", GANG__GGML_F32, 1, {HD}, hd_norm, sizeof(hd_norm), AUTO};
    }
    if (strcmp(arch, "gemma3") == 0) {
        all[nt++] = (tdesc){
            "blk.0.post_attention_norm.weight", GANG__GGML_F32, 1, {H}, post, sizeof(post), AUTO};
        all[nt++] =
            (tdesc){"blk.0.post_ffw_norm.weight", GANG__GGML_F32, 1, {H}, post, sizeof(post), AUTO};
    }
    /* 18 entries; a SentencePiece file has scores instead of merges, maybe the prefix flag. */
    uint8_t *b =
        build(3, &m, (uint64_t)(18 - spm + (spm && tok_scores) + (spm && tok_space_prefix >= 0)),
              all, nt, &len);
    fx_write(path, b, len);
    free(b);
    free(m.b);
}

/* GGUF row of Hugging Face row r of a permuted projection (heads of HD rows). */
static int gguf_row(int r)
{
    int h = r / HD, i = r % HD, a = i / (HD / 2), b = i % (HD / 2);
    return h * HD + 2 * b + a;
}

static void test_model(void **state)
{
    (void)state;
    char *dir = fx_tmpdir(), path[512], err[ERRLEN];
    gang_model_config mc;
    gang_model *m;
    int r, c;

    fx_path(path, sizeof(path), dir, "m.gguf");
    write_model(path, FFN);
    assert_int_equal(gang_model_config_read(path, &mc, err, sizeof(err)), 0);
    assert_int_equal(mc.n_layers, 1);
    assert_int_equal(mc.hidden, H);
    assert_int_equal(mc.n_heads, 2);
    assert_int_equal(mc.n_kv_heads, 1);
    assert_int_equal(mc.vocab, V);
    assert_int_equal(mc.tie_embeddings, 1);
    assert_int_equal(mc.n_eos, 1);
    assert_int_equal(mc.eos_ids[0], 3);
    assert_int_equal(mc.bos_token_id, 3);

    gang_topology t1 = fx_topo(path, 1, 1);
    m = fx_load_ok(path, &t1, 0);
    for (r = 0; r < H; r++)
        for (c = 0; c < H; c++) {
            assert_true(((float *)m->layers[0].wq)[r * H + c] == q_val(gguf_row(r), c));
            assert_true(((float *)m->layers[0].wo)[r * H + c] == o_val(r, c));
        }
    for (r = 0; r < HD; r++)
        for (c = 0; c < H; c++)
            assert_true(((float *)m->layers[0].wk)[r * H + c] == (float)k_q(gguf_row(r), c));
    assert_memory_equal(m->lm_head, m->embed, sizeof(float) * V * H);
    gang_model_free(m);

    gang_topology t2 = fx_topo(path, 2, 1);
    m = fx_load_ok(path, &t2, 1);
    for (r = 0; r < HD; r++)
        for (c = 0; c < H; c++) {
            assert_true(((float *)m->layers[0].wq)[r * H + c] == q_val(gguf_row(HD + r), c));
            assert_true(((float *)m->layers[0].wk)[r * H + c] == (float)k_q(gguf_row(r), c));
        }
    for (r = 0; r < H; r++)
        for (c = 0; c < HD; c++)
            assert_true(((float *)m->layers[0].wo)[r * HD + c] == o_val(r, HD + c));
    gang_model_free(m);

    /* --dtype auto (issue #27): the Q8_0 k_proj stays the file's blocks, its rows in the
     * Hugging Face order (whole rows moved), on TP 1 and on TP 2's rank 1; the BF16 /
     * F32 matrices are f32, and the embedding f32; the load line names the storage. The
     * rows are read through the CPU kernels' embedding lookup, which also reads the
     * interleaved copy the loader makes where the CPU runs AVX-512 VNNI. */
    gang_load_options auto_opt = {.dtype = "auto", .quantize = "none"};
    gang_kernels *kc = NULL;
    assert_int_equal(gang_kernels_open("cpu", &kc), 0);
    for (int tp = 1; tp <= 2; tp++) {
        gang_topology tt = fx_topo(path, (uint32_t)tp, 1);
        float row[H];
        assert_int_equal(
            gang_model_load_ex(path, &tt, (uint32_t)tp - 1, &auto_opt, &m, err, sizeof(err)), 0);
        assert_int_equal(m->blocks, 1);
        assert_int_equal(m->layers[0].mixed, 1);
        assert_int_equal(m->layers[0].mtype[1], GANG_KW_Q8_0);
        assert_int_equal(m->layers[0].mtype[0], GANG_KW_F32);
        assert_int_equal(m->layers[0].mtype[3], GANG_KW_F32);
        assert_int_equal(m->wtype, GANG_KW_F32);
        gang_kernels_weight wk = gang_kernels_weight_view(GANG_KW_Q8_0, m->layers[0].wk, HD, H);
        for (r = 0; r < HD; r++) {
            int32_t id = (int32_t)r;
            assert_int_equal(gang_kernels_embedding_w(kc, &wk, HD, H, &id, 1, row), 0);
            for (c = 0; c < H; c++)
                assert_true(row[c] == (float)k_q(gguf_row(r), c));
        }
        assert_non_null(strstr(m->storage, "the GGUF file's own blocks:"));
        assert_non_null(strstr(m->storage, "q8_0 x 1"));
        gang_model_free(m);
    }
    gang_kernels_close(kc);

    /* Llama 3.1's llama3 scaling as llama.cpp writes it: each inverse frequency divided by
     * its factor from rope_freqs.weight; a factor of 0 is refused. */
    float factors[HD / 2];
    for (r = 0; r < HD / 2; r++)
        factors[r] = 1.0f + (float)r;
    rope_freqs = factors;
    write_model(path, FFN);
    assert_int_equal(gang_model_config_read(path, &mc, err, sizeof(err)), 0);
    assert_int_equal(mc.rope_freq_factors, 1);
    m = fx_load_ok(path, &t1, 0);
    for (r = 0; r < HD / 2; r++) {
        float plain = (float)(1.0 / pow(10000.0, 2.0 * r / HD)) / factors[r];
        assert_true(fabsf(m->layers[0].rope_freq[r] - plain) <= 1e-6f * plain);
    }
    gang_model_free(m);
    factors[3] = 0.0f;
    write_model(path, FFN);
    m = NULL;
    assert_int_equal(gang_model_load(path, &t1, 0, &m, err, sizeof(err)), GANG_EMODEL);
    assert_non_null(strstr(err, "rope_freqs.weight[3] = 0 is not a positive factor"));
    rope_freqs = NULL;

    /* A tensor whose shape disagrees with the metadata. */
    write_model(path, FFN / 2);
    m = NULL;
    assert_int_equal(gang_model_load(path, &t1, 0, &m, err, sizeof(err)), GANG_EMODEL);
    assert_null(m);
    assert_non_null(strstr(err, "blk.0.ffn_gate.weight has ne [32, 16, 1, 1]"));
    fx_rmtree(dir);
}

/* The digest of a one-file model: stable, and it changes with the metadata. */
static void test_digest(void **state)
{
    (void)state;
    char *dir = fx_tmpdir(), path[512];
    uint8_t a[GANG_DIGEST_SIZE], b[GANG_DIGEST_SIZE], c[GANG_DIGEST_SIZE];

    fx_path(path, sizeof(path), dir, "m.gguf");
    write_model(path, FFN);
    assert_int_equal(gang_model_digest(path, a), 0);
    assert_int_equal(gang_model_digest(path, b), 0);
    assert_memory_equal(a, b, sizeof(a));
    tok_pre = "SMOLLM"; /* same size, other metadata */
    write_model(path, FFN);
    tok_pre = "smollm";
    assert_int_equal(gang_model_digest(path, c), 0);
    assert_memory_not_equal(a, c, sizeof(a));
    fx_path(path, sizeof(path), dir, "none.gguf");
    assert_int_equal(gang_model_digest(path, c), GANG_ENOENT);
    fx_rmtree(dir);
}

/* A qwen2 file: its own keys, q/k/v biases, and q/k rows as they lie (llama.cpp permutes
 * only llama's). */
static void test_qwen2(void **state)
{
    (void)state;
    char *dir = fx_tmpdir(), path[512], err[ERRLEN];
    gang_model_config mc;
    gang_model *m;
    int r, c;

    arch = "qwen2";
    fx_path(path, sizeof(path), dir, "m.gguf");
    write_model(path, FFN);
    if (gang_model_config_read(path, &mc, err, sizeof(err)) != 0)
        fail_msg("config: %s", err);
    assert_int_equal(mc.arch, GANG_ARCH_QWEN2);
    assert_int_equal(mc.attn_bias, 1);
    assert_int_equal(mc.hidden, H);
    gang_topology t2 = fx_topo(path, 2, 1);
    m = fx_load_ok(path, &t2, 1);
    for (r = 0; r < HD; r++) {
        for (c = 0; c < H; c++)
            assert_true(((float *)m->layers[0].wq)[r * H + c] == q_val(HD + r, c));
        assert_true(m->layers[0].bq[r] == bias_val(HD + r));
        assert_true(m->layers[0].bk[r] == bias_val(r));
    }
    gang_model_free(m);

    /* qwen3: q/k norms, no biases, rows unpermuted. */
    arch = "qwen3";
    write_model(path, FFN);
    if (gang_model_config_read(path, &mc, err, sizeof(err)) != 0)
        fail_msg("config: %s", err);
    assert_int_equal(mc.arch, GANG_ARCH_QWEN3);
    assert_int_equal(mc.qk_norm, 1);
    assert_int_equal(mc.attn_bias, 0);
    gang_topology t1 = fx_topo(path, 1, 1);
    m = fx_load_ok(path, &t1, 0);
    for (r = 0; r < HD; r++) {
        assert_true(m->layers[0].q_norm[r] == 0.5f + (float)r / 8.0f);
        for (c = 0; c < H; c++)
            assert_true(((float *)m->layers[0].wq)[r * H + c] == q_val(r, c));
    }
    assert_null(m->layers[0].bq);
    gang_model_free(m);

    /* gemma3: the norms as the file holds them (1 + w already), the sandwich norms from
     * post_attention_norm / post_ffw_norm, ffn_norm the MLP's input norm, GeGLU, the
     * embedding scale, every 6th layer global (no window here: the key is absent). */
    arch = "gemma3";
    write_model(path, FFN);
    if (gang_model_config_read(path, &mc, err, sizeof(err)) != 0)
        fail_msg("config: %s", err);
    assert_int_equal(mc.arch, GANG_ARCH_GEMMA3);
    assert_int_equal(mc.post_norms, 1);
    assert_int_equal(mc.act, GANG_ACT_GELU_TANH);
    assert_true(fabsf(mc.embed_scale - sqrtf((float)H)) < 1e-6f);
    assert_int_equal(mc.window_pattern, 6);
    assert_int_equal(mc.sliding_window, 0);
    m = fx_load_ok(path, &t1, 0);
    for (r = 0; r < H; r++) {
        assert_true(m->layers[0].post_attn_norm[r] == 2.0f - (float)r / 32.0f);
        assert_true(m->layers[0].post_mlp_norm[r] == 2.0f - (float)r / 32.0f);
        assert_true(m->layers[0].mlp_norm[r] == 1.0f); /* ffn_norm */
    }
    for (r = 0; r < HD; r++)
        assert_true(m->layers[0].k_norm[r] == 0.5f + (float)r / 8.0f);
    assert_int_equal(m->layers[0].act, GANG_ACT_GELU_TANH);
    gang_model_free(m);

    /* Another architecture is refused by name. */
    arch = "gemma2";
    write_model(path, FFN);
    assert_int_equal(gang_model_config_read(path, &mc, err, sizeof(err)), GANG_EMODEL);
    assert_non_null(strstr(err, "general.architecture \"gemma2\" is not supported"));
    arch = "llama";
    fx_rmtree(dir);
}

static void test_text(void **state)
{
    (void)state;
    char *dir = fx_tmpdir(), path[512], err[ERRLEN], *out = NULL;
    gang_tokenizer *tok = NULL;
    gang_chat_template *tpl = NULL;
    int32_t ids[8];
    size_t n, len;

    fx_path(path, sizeof(path), dir, "m.gguf");
    write_model(path, FFN);
    if (gang_gguf_tokenizer_load(path, &tok, err, sizeof(err)) != 0)
        fail_msg("tokenizer: %s", err);
    assert_int_equal(gang_tokenizer_encode(tok, "ab<|end|>", 9, false, ids, 8, &n), 0);
    assert_int_equal(n, 2);
    assert_int_equal(ids[0], 2); /* the merge "a b" */
    assert_int_equal(ids[1], 3); /* the control token, special */
    assert_true(gang_tokenizer_is_special(tok, 3));
    gang_tokenizer_free(tok);
    if (gang_gguf_chat_template_load(path, &tpl, err, sizeof(err)) != 0)
        fail_msg("template: %s", err);
    const char *msgs = "[{\"role\":\"user\",\"content\":\"hi\"}]";
    assert_int_equal(gang_chat_render(tpl, msgs, strlen(msgs), NULL, &out, &len, err, sizeof(err)),
                     0);
    assert_string_equal(out, "hi<|end|>");
    free(out);
    gang_chat_template_free(tpl);

    /* llama-bpe with add_bos_token: BOS first, the merge still applies. */
    tok_pre = "llama-bpe";
    tok_add_bos = 1;
    write_model(path, FFN);
    if (gang_gguf_tokenizer_load(path, &tok, err, sizeof(err)) != 0)
        fail_msg("tokenizer: %s", err);
    assert_int_equal(gang_tokenizer_encode(tok, "ab", 2, true, ids, 8, &n), 0);
    assert_int_equal(n, 2);
    assert_int_equal(ids[0], 3);
    assert_int_equal(ids[1], 2);
    gang_tokenizer_free(tok);
    /* Refused, naming what. */
    tok_pre = "falcon";
    write_model(path, FFN);
    assert_int_equal(gang_gguf_tokenizer_load(path, &tok, err, sizeof(err)), GANG_EMODEL);
    assert_non_null(strstr(err, "tokenizer.ggml.pre \"falcon\" is not supported"));
    tok_pre = "smollm";
    tok_model = "bert";
    write_model(path, FFN);
    assert_int_equal(gang_gguf_tokenizer_load(path, &tok, err, sizeof(err)), GANG_EMODEL);
    assert_non_null(strstr(err, "tokenizer.ggml.model \"bert\" is not supported"));
    tok_model = "gpt2";
    tok_add_bos = 0;
    fx_rmtree(dir);
}

/* Encodes text with tok (no special tokens) and compares with want[0 .. n). */
static void expect_ids(gang_tokenizer *tok, const char *text, bool special, const int32_t *want,
                       size_t n)
{
    int32_t ids[16];
    size_t got;

    assert_int_equal(gang_tokenizer_encode(tok, text, strlen(text), special, ids, 16, &got), 0);
    assert_int_equal(got, n);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(ids[i], want[i]);
}

/*
 * A SentencePiece vocabulary (tokenizer.ggml.model "llama"): merges made from the scores,
 * the "\u2581" prefix (add_space_prefix, true when absent), control tokens special, BOS
 * from add_bos_token, the decoder's leading space stripped; no scores is refused.
 */
static void test_text_spm(void **state)
{
    (void)state;
    char *dir = fx_tmpdir(), path[512], err[ERRLEN], text[512];
    gang_tokenizer *tok = NULL;
    gang_tok_decoder dec;
    size_t len = 0, n;

    fx_path(path, sizeof(path), dir, "spm.gguf");
    tok_model = "llama";
    tok_add_bos = 1;
    write_model(path, FFN);
    if (gang_gguf_tokenizer_load(path, &tok, err, sizeof(err)) != 0)
        fail_msg("tokenizer: %s", err);
    expect_ids(tok, "a a", false, (const int32_t[]){2, 2}, 2);   /* "\u2581a" x 2 */
    expect_ids(tok, "a a", true, (const int32_t[]){3, 2, 2}, 3); /* BOS first */
    /* <s> matched whole; the prefix goes before each piece around it, as tokenizers does. */
    expect_ids(tok, "a<s>a", false, (const int32_t[]){2, 3, 2}, 3);
    assert_true(gang_tokenizer_is_special(tok, 3));
    gang_tok_decoder_init(&dec, tok, true);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(gang_tokenizer_decode_step(&dec, 2, text + len, sizeof(text) - len, &n),
                         0);
        len += n;
    }
    assert_int_equal(gang_tokenizer_decode_flush(&dec, text + len, sizeof(text) - len, &n), 0);
    text[len + n] = '\0';
    assert_string_equal(text, "a a"); /* " a a" less the prefix's space */
    gang_tokenizer_free(tok);

    tok_space_prefix = 0; /* Gemma: no prefix */
    tok_add_bos = 0;
    write_model(path, FFN);
    if (gang_gguf_tokenizer_load(path, &tok, err, sizeof(err)) != 0)
        fail_msg("tokenizer: %s", err);
    expect_ids(tok, "a a", true, (const int32_t[]){1, 2}, 2);
    gang_tokenizer_free(tok);

    tok_scores = 0;
    write_model(path, FFN);
    assert_int_equal(gang_gguf_tokenizer_load(path, &tok, err, sizeof(err)), GANG_EMODEL);
    assert_non_null(strstr(err, "tokenizer.ggml.scores"));
    tok_scores = 1;
    /* A piece longer than 256 bytes: refused (it would make the merge search quadratic). */
    char longp[300];
    memset(longp, 'x', sizeof(longp) - 1);
    longp[sizeof(longp) - 1] = '\0';
    tok_spm_piece1 = longp;
    write_model(path, FFN);
    assert_int_equal(gang_gguf_tokenizer_load(path, &tok, err, sizeof(err)), GANG_EMODEL);
    assert_non_null(strstr(err, "token 1 is 299 bytes, more than the 256 allowed"));
    tok_spm_piece1 = NULL;
    tok_space_prefix = -1;
    tok_model = "gpt2";
    fx_rmtree(dir);
}

/*
 * test-gguf --ref FILE (tests/unit/model/gguf-ref.py): every tensor "q.TYPE" of FILE,
 * dequantized here, must equal "want.TYPE", the gguf package's dequantization of it.
 */
static int ref_check(const char *path)
{
    char err[ERRLEN], want_name[64];
    gang__gguf g;
    size_t i, checked = 0;
    int bad = 0;

    if (gang__gguf_open(path, &g, err, sizeof(err)) != 0) {
        fprintf(stderr, "gguf-ref: %s\n", err);
        return 1;
    }
    for (i = 0; i < g.n_tensors && !bad; i++) {
        const gang__gguf_tensor *q = &g.tensors[i], *w;
        if (strncmp(q->name, "q.", 2) != 0)
            continue;
        snprintf(want_name, sizeof(want_name), "want.%s", q->name + 2);
        w = gang__gguf_find(&g, want_name);
        if (w == NULL || w->rows != q->rows || w->ne[0] != q->ne[0]) {
            fprintf(stderr, "gguf-ref: %s: no matching %s\n", q->name, want_name);
            bad = 1;
            break;
        }
        size_t n = (size_t)(q->rows * q->ne[0]);
        float *a = malloc(n * sizeof(float)), *b = malloc(n * sizeof(float));
        bad = a == NULL || b == NULL || gang__gguf_read(&g, q, 0, q->rows, 0, q->ne[0], a) != 0 ||
              gang__gguf_read(&g, w, 0, w->rows, 0, w->ne[0], b) != 0;
        for (size_t k = 0; k < n && !bad; k++)
            if (!(a[k] == b[k] || (isnan(a[k]) && isnan(b[k])))) {
                fprintf(stderr, "gguf-ref: %s element %zu: ganglion %.9g, gguf package %.9g\n",
                        q->name + 2, k, a[k], b[k]);
                bad = 1;
            }
        if (!bad)
            printf("gguf-ref: %-5s %zu elements equal the gguf package's\n", q->name + 2, n);
        checked++;
        free(a);
        free(b);
    }
    gang__gguf_close(&g);
    if (checked == 0)
        fprintf(stderr, "gguf-ref: no q.* tensors in %s\n", path);
    return bad || checked == 0;
}

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], "--ref") == 0)
        return ref_check(argv[2]);

    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_refusals_header),
        cmocka_unit_test(test_refusals_metadata),
        cmocka_unit_test(test_refusals_tensors),
        cmocka_unit_test(test_dequant_32),
        cmocka_unit_test(test_dequant_k),
        cmocka_unit_test(test_dequant_kernels),
        cmocka_unit_test(test_model),
        cmocka_unit_test(test_digest),
        cmocka_unit_test(test_qwen2),
        cmocka_unit_test(test_text),
        cmocka_unit_test(test_text_spm),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
