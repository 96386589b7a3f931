/*
 * Prometheus text exposition builder (internal to launcher/): the agent renders /metrics
 * by appending metric families to a growable buffer on its loop thread.
 *
 * Format (text exposition 0.0.4): for each family "# HELP name text" and
 * "# TYPE name gauge|counter|histogram", then one line per sample:
 * name{label="value",...} number. Label values escape backslash, double quote and newline;
 * HELP text escapes backslash and newline. Numbers: integers exactly, doubles in the
 * shortest form that reads back to the same double (at most %.17g), and +Inf, -Inf, NaN.
 *
 * Errors are sticky: the first failure (GANG_ENOMEM, or GANG_EINVAL for an invalid metric
 * or label name) is kept in buf->err, later appends do nothing and return it, so a caller
 * can emit everything and check once. Nothing here is thread-safe.
 */
#ifndef GANGLION_LAUNCHER_METRICS_H
#define GANGLION_LAUNCHER_METRICS_H

#include <stddef.h>
#include <stdint.h>

typedef struct gang_metrics_buf {
    char *data; /* NUL-terminated text; NULL until the first append (see _text()) */
    size_t len; /* bytes of text, without the NUL */
    size_t cap; /* bytes allocated */
    int err;    /* first error, sticky; 0 while everything succeeded */
} gang_metrics_buf;

typedef enum gang_metric_type {
    GANG_METRIC_GAUGE = 0,
    GANG_METRIC_COUNTER,
    GANG_METRIC_HISTOGRAM
} gang_metric_type;

typedef struct gang_metric_label {
    const char *name;  /* [a-zA-Z_][a-zA-Z0-9_]*; "le" is reserved for histograms */
    const char *value; /* any UTF-8; escaped on output */
} gang_metric_label;

/* Sets b up empty; allocates nothing. */
void gang_metrics_buf_init(gang_metrics_buf *b);
/* Releases b's memory and leaves it as after init. */
void gang_metrics_buf_free(gang_metrics_buf *b);
/* Empties b (and clears its error) but keeps the allocation for the next rendering. */
void gang_metrics_buf_reset(gang_metrics_buf *b);
/* The text so far: never NULL ("" before the first append). Valid until the next append. */
const char *gang_metrics_buf_text(const gang_metrics_buf *b);

/*
 * Appends a family header: "# HELP name help" (skipped when help is NULL) and
 * "# TYPE name type". name must match [a-zA-Z_:][a-zA-Z0-9_:]*. Returns 0 or b->err.
 */
int gang_metrics_family(gang_metrics_buf *b, const char *name, gang_metric_type type,
                        const char *help);

/*
 * Appends one sample line "name{labels} value". labels may be NULL when nlabels is 0.
 * The sample name is separate from the family name because a family's samples may carry
 * suffixes (name_total, name_bucket, ...). Returns 0 or b->err.
 */
int gang_metrics_sample_i64(gang_metrics_buf *b, const char *name, const gang_metric_label *labels,
                            size_t nlabels, int64_t value);
int gang_metrics_sample_u64(gang_metrics_buf *b, const char *name, const gang_metric_label *labels,
                            size_t nlabels, uint64_t value);
int gang_metrics_sample_double(gang_metrics_buf *b, const char *name,
                               const gang_metric_label *labels, size_t nlabels, double value);

/* One unlabeled counter: its family name, help text and value. */
typedef struct gang_metric_counter {
    const char *name, *help;
    uint64_t v;
} gang_metric_counter;

/* Each of the n counters as a counter family with its one unlabeled sample. Returns 0 or
 * b->err. */
int gang_metrics_counters(gang_metrics_buf *b, const gang_metric_counter *cs, size_t n);

/*
 * One gauge or counter family with a single sample: its name and help text written once,
 * its type, the sample's labels (nlabels 0: none) and its value, an integer (v) or, with
 * is_double, d. What a table of a component's scalar metrics is made of.
 */
typedef struct gang_metric_scalar {
    const char *name, *help;
    gang_metric_type type; /* GANG_METRIC_GAUGE or GANG_METRIC_COUNTER */
    const gang_metric_label *labels;
    size_t nlabels;
    int is_double; /* 1: the value is d, printed as a double; 0: v, printed exactly */
    uint64_t v;
    double d;
} gang_metric_scalar;

/* Each of the n scalars as its family header and its one sample, in order. Returns 0 or
 * b->err (GANG_EINVAL for a histogram type: it has no single sample). */
int gang_metrics_scalars(gang_metrics_buf *b, const gang_metric_scalar *ss, size_t n);

/*
 * Fixed-bucket histogram, Prometheus semantics: bucket i counts observations v <= bounds[i]
 * (cumulatively on output), plus an implicit +Inf bucket; sum and count of everything.
 * Plain value type: embed it, no allocation, copy it to snapshot it.
 */
#define GANG_HISTOGRAM_MAX_BUCKETS 32

typedef struct gang_histogram {
    size_t nbounds;                                  /* finite upper bounds in use */
    double bounds[GANG_HISTOGRAM_MAX_BUCKETS];       /* strictly increasing, finite */
    uint64_t counts[GANG_HISTOGRAM_MAX_BUCKETS + 1]; /* per bucket, not cumulative; the
                                                        last one used is +Inf */
    double sum;                                      /* of every observation */
    uint64_t count;                                  /* observations */
} gang_histogram;

/*
 * Sets h up with n upper bounds (1 <= n <= GANG_HISTOGRAM_MAX_BUCKETS, finite, strictly
 * increasing; +Inf is implicit). Returns 0 or GANG_EINVAL (h is then left empty, with no
 * finite bounds, and still safe to observe and render).
 */
int gang_histogram_init(gang_histogram *h, const double *bounds, size_t n);
/* Records one observation. NaN is ignored: it would poison the sum forever. */
void gang_histogram_observe(gang_histogram *h, double v);
/*
 * Appends the samples of h under the family name: name_bucket{labels...,le="b"} with
 * cumulative counts for every bound and le="+Inf", then name_sum and name_count (with the
 * same labels). Emit the family header with gang_metrics_family(..., GANG_METRIC_HISTOGRAM)
 * first; several label sets may follow one header. Returns 0 or b->err.
 */
int gang_histogram_render(gang_metrics_buf *b, const char *name, const gang_metric_label *labels,
                          size_t nlabels, const gang_histogram *h);

#endif
