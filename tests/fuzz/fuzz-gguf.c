/*
 * libFuzzer target of the GGUF header parser (model/gguf.c) and the dequantizers
 * (model/gguf-quant.c). The input is a whole file: it must parse or be refused with
 * GANG_EMODEL (never crash, never read outside the input, never allocate without bound);
 * a parsed one has every metadata string and integer read back, and the first rows of
 * every tensor dequantized straight from the input (the parser vouches that they lie
 * inside it). A prefix of the input, seen as the start of a longer file, must parse, ask
 * for more (GANG_EAGAIN) or be refused.
 */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ganglion/common.h"
#include "gguf.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* common/util.c's, without the rest of gang_common. */
void gang_set_err(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;

    if (err == NULL || errlen == 0)
        return;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

/* Reads back what a parsed file holds. */
static void walk(const gang__gguf *g, const uint8_t *data)
{
    static float row[1u << 16];
    volatile uint64_t sink = 0;
    size_t i;
    uint64_t j, r;

    for (i = 0; i < g->n_kv; i++) {
        const gang__gguf_kv *kv = &g->kv[i];
        for (j = 0; j < kv->n && j < 64; j++) {
            gang__gguf_str s = gang__gguf_arr_str(g, kv, j);
            sink += s.n ? (uint8_t)s.p[s.n - 1] : 0;
            sink += (uint64_t)gang__gguf_arr_int(g, kv, j);
        }
    }
    for (i = 0; i < g->n_tensors; i++) {
        const gang__gguf_tensor *t = &g->tensors[i];
        if (t->ne[0] > sizeof(row) / sizeof(row[0]))
            continue;
        for (r = 0; r < t->rows && r < 4; r++)
            gang__gguf_dequant(t->type, data + g->data_start + t->offset + r * t->row_bytes, row,
                               t->ne[0]);
        sink += (uint64_t)(row[0] != row[0]);
    }
    (void)sink;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char err[256];
    gang__gguf g;
    int rc;

    memset(&g, 0, sizeof(g));
    g.fd = -1;
    rc = gang__gguf_parse(data, size, size, "fuzz.gguf", &g, err, sizeof(err));
    if (rc == 0)
        walk(&g, data);
    else if (rc != GANG_EMODEL && rc != GANG_ENOMEM)
        abort(); /* a whole file is never "read more" */
    gang__gguf_close(&g);

    memset(&g, 0, sizeof(g));
    g.fd = -1;
    rc = gang__gguf_parse(data, size / 2, (uint64_t)size + 4096, "fuzz.gguf", &g, err, sizeof(err));
    if (rc != 0 && rc != GANG_EAGAIN && rc != GANG_EMODEL && rc != GANG_ENOMEM)
        abort();
    gang__gguf_close(&g);
    return 0;
}
