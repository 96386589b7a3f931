/*
 * Encode throughput of ganglion's tokenizer, for bench/tokenizer-throughput.py: loads
 * TOKENIZER.json and a corpus of documents (the file's bytes, documents separated by NUL
 * bytes), encodes every document once without timing (warm-up, and the ids it writes),
 * then ROUNDS more times, timing only the encode calls (one thread, CLOCK_MONOTONIC
 * around each call; the buffers are allocated before).
 *
 *   tok-bench TOKENIZER.json CORPUS.bin IDS.bin [ROUNDS]
 *
 * IDS.bin receives, per document in order, its id count and its ids, each a
 * little-endian int32 (special tokens not added), for the caller to compare with another
 * tokenizer's. stdout: one JSON line per round {"round", "encode_s", "bytes", "docs",
 * "tokens"}. Exit 1 on any error (the reason on stderr).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ganglion/text.h"

static char *read_all(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    char *b = NULL;
    long n = -1;
    if (fseek(f, 0, SEEK_END) == 0)
        n = ftell(f);
    if (n >= 0 && fseek(f, 0, SEEK_SET) == 0)
        b = malloc((size_t)n + 1);
    if (b && fread(b, 1, (size_t)n, f) != (size_t)n) {
        free(b);
        b = NULL;
    }
    fclose(f);
    if (b) {
        b[n] = 0;
        *len = (size_t)n;
    }
    return b;
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Writes one little-endian int32 (the machines this runs on are little-endian; the
 * reader checks the totals, so a big-endian host would fail loudly, not silently). */
static int put32(FILE *f, int32_t v)
{
    return fwrite(&v, sizeof(v), 1, f) == 1 ? 0 : -1;
}

int main(int argc, char **argv)
{
    if (argc < 4) {
        fprintf(stderr, "usage: %s TOKENIZER.json CORPUS.bin IDS.bin [ROUNDS]\n", argv[0]);
        return 2;
    }
    int rounds = argc > 4 ? atoi(argv[4]) : 1;
    char err[256] = "";
    gang_tokenizer *t;
    if (gang_tokenizer_load(argv[1], &t, err, sizeof(err)) != 0) {
        fprintf(stderr, "load %s: %s\n", argv[1], err);
        return 1;
    }
    size_t len = 0;
    char *src = read_all(argv[2], &len);
    if (!src) {
        fprintf(stderr, "%s: cannot read\n", argv[2]);
        return 1;
    }
    /* Documents: [start, end) spans between NUL bytes. */
    size_t ndocs = 0, cap_docs = 1024, longest = 0;
    size_t *start = malloc(cap_docs * sizeof(*start)), *dlen = malloc(cap_docs * sizeof(*dlen));
    for (size_t i = 0, s = 0; i <= len && start && dlen; i++) {
        if (i < len && src[i] != 0)
            continue;
        if (ndocs == cap_docs) {
            cap_docs *= 2;
            start = realloc(start, cap_docs * sizeof(*start));
            dlen = realloc(dlen, cap_docs * sizeof(*dlen));
            if (!start || !dlen)
                break;
        }
        start[ndocs] = s;
        dlen[ndocs++] = i - s;
        longest = i - s > longest ? i - s : longest;
        s = i + 1;
    }
    size_t cap = longest + 16;
    int32_t *ids = malloc(cap * sizeof(*ids));
    FILE *out = fopen(argv[3], "wb");
    if (!start || !dlen || !ids || !out) {
        fprintf(stderr, "out of memory or cannot write %s\n", argv[3]);
        return 1;
    }
    size_t tokens = 0, n;
    for (size_t d = 0; d < ndocs; d++) {
        if (gang_tokenizer_encode(t, src + start[d], dlen[d], false, ids, cap, &n) != 0) {
            fprintf(stderr, "encode failed on document %zu: %.60s\n", d, src + start[d]);
            return 1;
        }
        tokens += n;
        int bad = put32(out, (int32_t)n);
        for (size_t i = 0; i < n && !bad; i++)
            bad = put32(out, ids[i]);
        if (bad) {
            fprintf(stderr, "cannot write %s\n", argv[3]);
            return 1;
        }
    }
    if (fclose(out) != 0) {
        fprintf(stderr, "cannot write %s\n", argv[3]);
        return 1;
    }
    for (int r = 0; r < rounds; r++) {
        double sec = 0;
        size_t bytes = 0, toks = 0;
        for (size_t d = 0; d < ndocs; d++) {
            double t0 = now();
            int rc = gang_tokenizer_encode(t, src + start[d], dlen[d], false, ids, cap, &n);
            sec += now() - t0;
            if (rc != 0)
                return 1;
            bytes += dlen[d];
            toks += n;
        }
        printf("{\"round\": %d, \"encode_s\": %.6f, \"bytes\": %zu, \"docs\": %zu, "
               "\"tokens\": %zu}\n",
               r, sec, bytes, ndocs, toks);
    }
    free(ids);
    free(start);
    free(dlen);
    free(src);
    gang_tokenizer_free(t);
    return 0;
}
