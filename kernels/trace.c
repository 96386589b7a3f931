/*
 * The arithmetic of a kernel trace (kernels-trace.h): a readable name from a mangled one,
 * and the sums over bracketed spans. The records come from CUPTI (kernels/cuda/
 * cuda-trace.c) on a device, from the emulator's CUPTI in the tests, or from a test.
 */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ganglion/common.h"

#include "kernels-trace.h"

#define TRACE_MAX_ID 1024 /* longest identifier read from a mangled name */

/* The name of a builtin type's one-letter code (Itanium ABI), or NULL. */
static const char *trace_builtin(char c)
{
    switch (c) {
    case 'a':
        return "int8";
    case 'h':
        return "uint8";
    case 'c':
        return "char";
    case 's':
        return "int16";
    case 't':
        return "uint16";
    case 'i':
        return "int";
    case 'j':
        return "unsigned";
    case 'l':
        return "long";
    case 'm':
        return "ulong";
    case 'f':
        return "float";
    case 'd':
        return "double";
    case 'b':
        return "bool";
    default:
        return NULL;
    }
}

/* A <source-name> ("<length><chars>") at *p: its length (> 0) with *id at its first char
 * and *p past it; 0 when *p holds none or the name ends first. */
static size_t trace_source_name(const char **p, const char **id)
{
    const char *q = *p;
    size_t len = 0;

    if (!isdigit((unsigned char)*q))
        return 0;
    while (isdigit((unsigned char)*q)) {
        len = len * 10 + (size_t)(*q - '0');
        if (len > TRACE_MAX_ID)
            return 0;
        q++;
    }
    if (len == 0 || memchr(q, '\0', len) != NULL)
        return 0;
    *id = q;
    *p = q + len;
    return len;
}

/* The first template argument at p (just past the 'I') into arg[cap]; "" when it is not
 * one of the forms the file comment names. */
static void trace_template_arg(const char *p, char *arg, size_t cap)
{
    const char *id, *b;
    size_t len;

    arg[0] = '\0';
    if ((len = trace_source_name(&p, &id)) > 0) {
        if (len > 5 && strncmp(id, "__nv_", 5) == 0)
            id += 5, len -= 5;
        else if (len > 2 && strncmp(id, "__", 2) == 0)
            id += 2, len -= 2;
        snprintf(arg, cap, "%.*s", (int)len, id);
    } else if (*p == 'L' && p[1] != '\0' && trace_builtin(p[1]) != NULL) {
        /* an integer literal: L <type> [n] <digits> E */
        p += 2;
        b = p;
        if (*p == 'n')
            p++;
        while (isdigit((unsigned char)*p))
            p++;
        if (*p == 'E' && p > b)
            snprintf(arg, cap, "%s%.*s", *b == 'n' ? "-" : "", (int)(p - b - (*b == 'n')),
                     b + (*b == 'n'));
    } else if ((b = trace_builtin(*p)) != NULL) {
        snprintf(arg, cap, "%s", b);
    }
}

void gang__trace_short_name(const char *raw, char *out, size_t cap)
{
    const char *p, *id;
    size_t len;
    char arg[64];

    if (out == NULL || cap == 0)
        return;
    if (raw == NULL) {
        snprintf(out, cap, "?");
        return;
    }
    if (strncmp(raw, "_Z", 2) == 0) {
        p = raw + 2;
        if (*p == 'L') /* internal linkage: a static kernel */
            p++;
        if ((len = trace_source_name(&p, &id)) > 0) {
            if (*p == 'I')
                trace_template_arg(p + 1, arg, sizeof(arg));
            else
                arg[0] = '\0';
            if (arg[0] != '\0')
                snprintf(out, cap, "%.*s<%s>", (int)len, id, arg);
            else
                snprintf(out, cap, "%.*s", (int)len, id);
            return;
        }
    }
    len = strcspn(raw, "(");
    while (len > 0 && isspace((unsigned char)raw[len - 1]))
        len--;
    if (len > TRACE_MAX_ID)
        len = TRACE_MAX_ID;
    snprintf(out, cap, "%.*s", (int)len, raw);
}

/* One op while summing: a (name, grid) key and its totals. */
typedef struct trace_op {
    uint32_t name;
    uint32_t grid[3];
    uint64_t count, ns;
} trace_op;

static int trace_rec_by_start(const void *a, const void *b)
{
    const gang__trace_rec *x = a, *y = b;

    if (x->start != y->start)
        return x->start < y->start ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end;
}

static int trace_op_by_ns(const void *a, const void *b)
{
    const trace_op *x = a, *y = b;

    if (x->ns != y->ns)
        return x->ns > y->ns ? -1 : 1;
    if (x->name != y->name)
        return x->name < y->name ? -1 : 1;
    return memcmp(x->grid, y->grid, sizeof(x->grid));
}

/* Adds r to its op in *ops (grown as needed); *last is the index of the previous hit. */
static int trace_op_add(trace_op **ops, size_t *n, size_t *cap, size_t *last,
                        const gang__trace_rec *r)
{
    size_t i;

    for (i = 0; i < *n; i++) {
        size_t j = (*last + i) % *n;
        trace_op *o = &(*ops)[j];

        if (o->name == r->name && memcmp(o->grid, r->grid, sizeof(o->grid)) == 0) {
            o->count++;
            o->ns += r->end - r->start;
            *last = j;
            return 0;
        }
    }
    if (*n == *cap) {
        size_t nc = *cap > 0 ? 2 * *cap : 32;
        trace_op *g = realloc(*ops, nc * sizeof(*g));

        if (g == NULL)
            return GANG_ENOMEM;
        *ops = g;
        *cap = nc;
    }
    (*ops)[*n] = (trace_op){.name = r->name, .count = 1, .ns = r->end - r->start};
    memcpy((*ops)[*n].grid, r->grid, sizeof(r->grid));
    *last = (*n)++;
    return 0;
}

/* Copies the sorted ops into out->ops, the ones past the last slot summed as "(other)". */
static void trace_fill_ops(const trace_op *ops, size_t n, const char *const *names,
                           gang_kernels_trace *out)
{
    char shortn[GANG_KERNELS_TRACE_NAME];

    for (size_t i = 0; i < n; i++) {
        gang_kernels_trace_op *d;

        if (i < GANG_KERNELS_TRACE_OPS - 1 || n == GANG_KERNELS_TRACE_OPS) {
            d = &out->ops[out->n_ops++];
            gang__trace_short_name(names[ops[i].name], shortn, sizeof(shortn));
            snprintf(d->name, sizeof(d->name), "%.40s %ux%ux%u", shortn, ops[i].grid[0],
                     ops[i].grid[1], ops[i].grid[2]);
        } else {
            d = &out->ops[GANG_KERNELS_TRACE_OPS - 1];
            if (out->n_ops < GANG_KERNELS_TRACE_OPS) {
                out->n_ops = GANG_KERNELS_TRACE_OPS;
                snprintf(d->name, sizeof(d->name), "(other)");
            }
        }
        d->count += ops[i].count;
        d->total_ns += ops[i].ns;
    }
}

int gang__trace_summarize(gang__trace_rec *recs, size_t n, const gang__trace_span *spans,
                          size_t n_spans, const char *const *names, size_t n_names,
                          uint64_t dropped, gang_kernels_trace *out)
{
    trace_op *ops = NULL;
    size_t n_ops = 0, cap_ops = 0, last = 0, i = 0;
    int rc = 0;

    if (out != NULL)
        memset(out, 0, sizeof(*out));
    if (out == NULL || (recs == NULL && n > 0) || (spans == NULL && n_spans > 0) ||
        (names == NULL && n > 0))
        return GANG_EINVAL;
    for (size_t s = 0; s < n_spans; s++)
        if (spans[s].end < spans[s].begin || (s > 0 && spans[s].begin < spans[s - 1].end))
            return GANG_EINVAL;
    for (size_t r = 0; r < n; r++)
        if (recs[r].name >= n_names || recs[r].end < recs[r].start)
            return GANG_EINVAL;
    out->dropped = dropped;
    if (n > 1)
        qsort(recs, n, sizeof(*recs), trace_rec_by_start);
    for (size_t s = 0; s < n_spans; s++) {
        uint64_t first = 0, last_end = 0, busy = 0, run_b = 0, run_e = 0;
        int any = 0;

        while (i < n && recs[i].start < spans[s].begin)
            i++;
        for (; i < n && recs[i].start < spans[s].end; i++) {
            const gang__trace_rec *r = &recs[i];

            if (!any) {
                first = run_b = r->start;
                run_e = r->end;
                any = 1;
            } else if (r->start > run_e) { /* a gap: the run so far is busy time */
                busy += run_e - run_b;
                run_b = r->start;
                run_e = r->end;
            } else if (r->end > run_e) {
                run_e = r->end;
            }
            if (r->end > last_end)
                last_end = r->end;
            out->kernels++;
            out->graph_kernels += r->graph != 0;
            if ((rc = trace_op_add(&ops, &n_ops, &cap_ops, &last, r)) < 0)
                goto out_free;
        }
        if (any) {
            busy += run_e - run_b;
            out->device_ns += last_end - first;
            out->busy_ns += busy;
        }
        out->wall_ns += spans[s].end - spans[s].begin;
        out->spans++;
    }
    if (n_ops > 1)
        qsort(ops, n_ops, sizeof(*ops), trace_op_by_ns);
    trace_fill_ops(ops, n_ops, names, out);
out_free:
    free(ops);
    return rc;
}
