/*
 * Test driver of the tokenizer for tests/tokenizer/compare.py: encodes every string of a
 * JSON corpus with and without special tokens and decodes the ids incrementally (one id
 * at a time, with and without the special tokens), writing one JSON array of results.
 * An element that is an array of ids is only decoded. Decoded texts are written in hex.
 *
 *   tok-driver TOKENIZER.json CORPUS.json OUT.json [BENCH_ROUNDS]
 *
 * With BENCH_ROUNDS it also encodes the whole corpus that many times and prints one JSON
 * line: the median seconds of a round and the bytes encoded per round.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "ganglion/model.h"

static char *read_all(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    if (b && fread(b, 1, (size_t)n, f) != (size_t)n) {
        free(b);
        b = NULL;
    }
    fclose(f);
    if (b)
        b[n] = 0;
    *len = (size_t)n;
    return b;
}

/* Encodes s into a JSON array of ids (NULL on error). */
static cJSON *encode_json(const gang_tokenizer *t, const char *s, size_t len, bool special,
                          int32_t **ids, size_t *n)
{
    size_t cap = len + 16;
    *ids = malloc(cap * sizeof(**ids));
    if (!*ids || gang_tokenizer_encode(t, s, len, special, *ids, cap, n) != 0)
        return NULL;
    cJSON *a = cJSON_CreateArray();
    for (size_t i = 0; i < *n; i++)
        cJSON_AddItemToArray(a, cJSON_CreateNumber((*ids)[i]));
    return a;
}

/* Decodes ids one at a time into a JSON string. */
static cJSON *decode_json(const gang_tokenizer *t, const int32_t *ids, size_t n, bool skip)
{
    gang_tok_decoder d;
    gang_tok_decoder_init(&d, t, skip);
    size_t cap = 64, len = 0;
    char *buf = malloc(cap);
    for (size_t i = 0; i <= n && buf; i++) {
        const char *txt = i < n ? gang_tokenizer_token_text(t, ids[i]) : "";
        size_t need = len + 3 * (txt ? strlen(txt) : 0) + GANG_TOK_DECODE_SLACK + 1;
        if (need > cap) {
            while (cap < need)
                cap *= 2;
            buf = realloc(buf, cap);
            if (!buf)
                return NULL;
        }
        size_t k;
        int rc = i < n ? gang_tokenizer_decode_step(&d, ids[i], buf + len, cap - len, &k)
                       : gang_tokenizer_decode_flush(&d, buf + len, cap - len, &k);
        if (rc)
            return NULL;
        len += k;
    }
    if (!buf)
        return NULL;
    /* as hex: the text may hold NUL bytes, which a C string would cut */
    char *hex = malloc(2 * len + 1);
    for (size_t i = 0; hex && i < len; i++)
        snprintf(hex + 2 * i, 3, "%02x", (unsigned char)buf[i]);
    if (hex)
        hex[2 * len] = 0;
    cJSON *s = hex ? cJSON_CreateString(hex) : NULL;
    free(hex);
    free(buf);
    return s;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int bench(const gang_tokenizer *t, const cJSON *corpus, int rounds)
{
    double *sec = calloc((size_t)rounds, sizeof(*sec));
    size_t bytes = 0, cap = 1 << 20;
    int32_t *ids = malloc(cap * sizeof(*ids));
    for (int r = 0; r < rounds; r++) {
        double t0 = now();
        const cJSON *e;
        bytes = 0;
        cJSON_ArrayForEach(e, corpus)
        {
            if (!cJSON_IsString(e))
                continue;
            size_t n, len = strlen(e->valuestring);
            if (gang_tokenizer_encode(t, e->valuestring, len, false, ids, cap, &n))
                return 1;
            bytes += len;
        }
        sec[r] = now() - t0;
    }
    qsort(sec, (size_t)rounds, sizeof(*sec), cmp_double);
    printf("{\"impl\": \"ganglion\", \"rounds\": %d, \"median_s\": %.6f, \"bytes\": %zu}\n", rounds,
           sec[rounds / 2], bytes);
    free(sec);
    free(ids);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 4) {
        fprintf(stderr, "usage: %s TOKENIZER.json CORPUS.json OUT.json [BENCH_ROUNDS]\n", argv[0]);
        return 2;
    }
    char err[256] = "";
    gang_tokenizer *t;
    size_t plen = strlen(argv[1]);
    int rc = plen > 5 && strcmp(argv[1] + plen - 5, ".gguf") == 0
                 ? gang_gguf_tokenizer_load(argv[1], &t, err, sizeof(err))
                 : gang_tokenizer_load(argv[1], &t, err, sizeof(err));
    if (rc) {
        fprintf(stderr, "load %s: %s\n", argv[1], err);
        return 1;
    }
    size_t len;
    char *src = read_all(argv[2], &len);
    cJSON *corpus = src ? cJSON_Parse(src) : NULL;
    if (!cJSON_IsArray(corpus)) {
        fprintf(stderr, "%s: not a JSON array\n", argv[2]);
        return 1;
    }
    cJSON *res = cJSON_CreateArray();
    const cJSON *e;
    cJSON_ArrayForEach(e, corpus)
    {
        cJSON *o = cJSON_CreateObject();
        if (cJSON_IsArray(e)) { /* ids to decode */
            size_t n = 0;
            int32_t *given = malloc(((size_t)cJSON_GetArraySize(e) + 1) * sizeof(*given));
            const cJSON *v;
            cJSON_ArrayForEach(v, e) given[n++] = (int32_t)v->valuedouble;
            cJSON_AddItemToObject(o, "text", decode_json(t, given, n, false));
            cJSON_AddItemToObject(o, "text_skip", decode_json(t, given, n, true));
            cJSON_AddItemToArray(res, o);
            free(given);
            continue;
        }
        int32_t *ids, *ids_sp;
        size_t n, n_sp, sl = strlen(e->valuestring);
        cJSON *a = encode_json(t, e->valuestring, sl, false, &ids, &n);
        cJSON *b = encode_json(t, e->valuestring, sl, true, &ids_sp, &n_sp);
        if (!a || !b) {
            fprintf(stderr, "encode failed on: %.60s\n", e->valuestring);
            return 1;
        }
        cJSON_AddItemToObject(o, "ids", a);
        cJSON_AddItemToObject(o, "ids_special", b);
        cJSON_AddItemToObject(o, "text", decode_json(t, ids, n, false));
        cJSON_AddItemToObject(o, "text_skip", decode_json(t, ids, n, true));
        cJSON_AddItemToArray(res, o);
        free(ids);
        free(ids_sp);
    }
    char *out = cJSON_PrintUnformatted(res);
    FILE *f = fopen(argv[3], "w");
    if (!f || fputs(out, f) < 0 || fclose(f) != 0) {
        fprintf(stderr, "%s: cannot write\n", argv[3]);
        return 1;
    }
    rc = argc > 4 ? bench(t, corpus, atoi(argv[4])) : 0;
    free(out);
    free(src);
    cJSON_Delete(res);
    cJSON_Delete(corpus);
    gang_tokenizer_free(t);
    return rc;
}
