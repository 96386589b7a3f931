/*
 * Internal to kernels/: the arithmetic of a kernel trace (gang_kernels_trace, kernels.h),
 * apart from the CUPTI glue that gathers the records (kernels/cuda/cuda-trace.c), so that
 * it is built and unit-tested in every configuration.
 */
#ifndef GANGLION_KERNELS_TRACE_H
#define GANGLION_KERNELS_TRACE_H

#include <stddef.h>
#include <stdint.h>

#include "ganglion/kernels.h"

/* One kernel as recorded: its interval (ns, the spans' clock), its name (an index into
 * the caller's table of names), its grid, and whether it ran as a node of a graph. */
typedef struct gang__trace_rec {
    uint64_t start, end;
    uint32_t name;
    uint32_t grid[3];
    uint32_t graph; /* 1: a graph node */
} gang__trace_rec;

/* One bracketed span [begin, end). */
typedef struct gang__trace_span {
    uint64_t begin, end;
} gang__trace_span;

/*
 * Sums the records that start inside a span into *out (zeroed first), as
 * gang_kernels_trace_collect documents: spans in ascending order, not overlapping; recs in
 * any order (sorted here by start, in place); names[recs[i].name] is each record's raw
 * name (CUPTI's mangled one, or a plain one), shortened by gang__trace_short_name.
 * dropped is copied to out. 0; GANG_EINVAL for NULL arrays with a non-zero count, a span
 * that ends before it begins or starts before the previous one ends, or a record whose
 * name index is outside the table (n_names) or that ends before it starts; GANG_ENOMEM.
 */
int gang__trace_summarize(gang__trace_rec *recs, size_t n, const gang__trace_span *spans,
                          size_t n_spans, const char *const *names, size_t n_names,
                          uint64_t dropped, gang_kernels_trace *out);

/*
 * A kernel's readable name into out[cap] (always terminated): from an Itanium-mangled
 * name of a free function ("_ZL11gemv_kernelI13__nv_bfloat16EvmmmjPKfiiPKT_S2_Pf") its
 * identifier and first template argument ("gemv_kernel<bfloat16>": a class name without
 * its "__nv_" / "__" prefix, a builtin type's name, an integer literal); from any other
 * name the part before its first '(' ("gemv_kernel<T>"). Never reads past the name's end.
 */
void gang__trace_short_name(const char *raw, char *out, size_t cap);

#endif /* GANGLION_KERNELS_TRACE_H */
