/*
 * Prometheus text exposition builder; see ganglion/serve.h for the format and the sticky-error
 * convention. The buffer grows geometrically, so rendering a page of metrics costs a few
 * reallocations the first time and none afterwards when the caller resets and reuses it.
 */
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ganglion/common.h"
#include "ganglion/serve.h"

void gang_metrics_buf_init(gang_metrics_buf *b)
{
    b->data = NULL;
    b->len = 0;
    b->cap = 0;
    b->err = 0;
}

void gang_metrics_buf_free(gang_metrics_buf *b)
{
    free(b->data);
    gang_metrics_buf_init(b);
}

void gang_metrics_buf_reset(gang_metrics_buf *b)
{
    b->len = 0;
    b->err = 0;
    if (b->data != NULL)
        b->data[0] = '\0';
}

const char *gang_metrics_buf_text(const gang_metrics_buf *b)
{
    return b->data != NULL ? b->data : "";
}

/* Records the first error and returns the sticky one. */
static int buf_fail(gang_metrics_buf *b, int err)
{
    if (b->err == 0)
        b->err = err;
    return b->err;
}

/*
 * Makes room for extra more bytes plus the NUL. Doubles the capacity (at least 1 KiB) so
 * that appends are amortised O(1). Returns 0 or the sticky error.
 */
static int buf_reserve(gang_metrics_buf *b, size_t extra)
{
    size_t need, cap;
    char *p;

    if (b->err != 0)
        return b->err;
    if (extra > SIZE_MAX / 2 - b->len)
        return buf_fail(b, GANG_ENOMEM);
    need = b->len + extra + 1;
    if (need <= b->cap)
        return 0;
    cap = b->cap != 0 ? b->cap : 1024;
    while (cap < need)
        cap *= 2;
    p = realloc(b->data, cap);
    if (p == NULL)
        return buf_fail(b, GANG_ENOMEM);
    b->data = p;
    b->cap = cap;
    return 0;
}

static int buf_append(gang_metrics_buf *b, const char *s, size_t n)
{
    int rc = buf_reserve(b, n);

    if (rc != 0)
        return rc;
    memcpy(b->data + b->len, s, n);
    b->len += n;
    b->data[b->len] = '\0';
    return 0;
}

static int buf_puts(gang_metrics_buf *b, const char *s)
{
    return buf_append(b, s, strlen(s));
}

/*
 * Appends text escaped for the exposition format: backslash and newline always, the
 * double quote only inside label values (HELP text keeps quotes as they are).
 */
static int buf_escaped(gang_metrics_buf *b, const char *s, int quote)
{
    const char *run = s;

    for (; *s != '\0'; s++) {
        const char *esc = NULL;

        if (*s == '\\')
            esc = "\\\\";
        else if (*s == '\n')
            esc = "\\n";
        else if (*s == '"' && quote)
            esc = "\\\"";
        if (esc == NULL)
            continue;
        buf_append(b, run, (size_t)(s - run));
        buf_puts(b, esc);
        run = s + 1;
    }
    return buf_append(b, run, (size_t)(s - run));
}

/* Metric names: [a-zA-Z_:][a-zA-Z0-9_:]*; label names the same without ':'. */
static int valid_name(const char *s, int colon_ok)
{
    if (s == NULL || s[0] == '\0' || (s[0] >= '0' && s[0] <= '9'))
        return 0;
    for (; *s != '\0'; s++) {
        char c = *s;

        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || (c == ':' && colon_ok)))
            return 0;
    }
    return 1;
}

/*
 * Formats v into out (at least 32 bytes) in the shortest %.{15,16,17}g form that reads
 * back to exactly v, so that values such as 0.1 print as "0.1" yet nothing is lost; the
 * exposition format's spellings are used for infinities and NaN.
 */
static void format_double(double v, char *out, size_t cap)
{
    if (isnan(v)) {
        snprintf(out, cap, "NaN");
        return;
    }
    if (isinf(v)) {
        snprintf(out, cap, "%s", v > 0 ? "+Inf" : "-Inf");
        return;
    }
    for (int prec = 15; prec <= 17; prec++) {
        snprintf(out, cap, "%.*g", prec, v);
        if (strtod(out, NULL) == v)
            return;
    }
}

/* Appends name{l1="v1",...,extra="extra_value"} with a trailing space. */
static int sample_prefix(gang_metrics_buf *b, const char *name, const gang_metric_label *labels,
                         size_t nlabels, const char *extra, const char *extra_value)
{
    int first = 1;

    if (b->err != 0)
        return b->err;
    if (!valid_name(name, 1) || (nlabels > 0 && labels == NULL))
        return buf_fail(b, GANG_EINVAL);
    for (size_t i = 0; i < nlabels; i++) {
        if (!valid_name(labels[i].name, 0) || labels[i].value == NULL)
            return buf_fail(b, GANG_EINVAL);
    }
    buf_puts(b, name);
    if (nlabels > 0 || extra != NULL) {
        buf_puts(b, "{");
        for (size_t i = 0; i < nlabels; i++) {
            buf_puts(b, first ? "" : ",");
            buf_puts(b, labels[i].name);
            buf_puts(b, "=\"");
            buf_escaped(b, labels[i].value, 1);
            buf_puts(b, "\"");
            first = 0;
        }
        if (extra != NULL) {
            buf_puts(b, first ? "" : ",");
            buf_puts(b, extra);
            buf_puts(b, "=\"");
            buf_escaped(b, extra_value, 1);
            buf_puts(b, "\"");
        }
        buf_puts(b, "}");
    }
    return buf_puts(b, " ");
}

static const char *type_name(gang_metric_type t)
{
    switch (t) {
    case GANG_METRIC_GAUGE:
        return "gauge";
    case GANG_METRIC_COUNTER:
        return "counter";
    case GANG_METRIC_HISTOGRAM:
        return "histogram";
    }
    return NULL;
}

int gang_metrics_family(gang_metrics_buf *b, const char *name, gang_metric_type type,
                        const char *help)
{
    const char *tn = type_name(type);

    if (b->err != 0)
        return b->err;
    if (!valid_name(name, 1) || tn == NULL)
        return buf_fail(b, GANG_EINVAL);
    if (help != NULL) {
        buf_puts(b, "# HELP ");
        buf_puts(b, name);
        buf_puts(b, " ");
        buf_escaped(b, help, 0);
        buf_puts(b, "\n");
    }
    buf_puts(b, "# TYPE ");
    buf_puts(b, name);
    buf_puts(b, " ");
    buf_puts(b, tn);
    return buf_puts(b, "\n");
}

static int sample_text(gang_metrics_buf *b, const char *name, const gang_metric_label *labels,
                       size_t nlabels, const char *value)
{
    int rc = sample_prefix(b, name, labels, nlabels, NULL, NULL);

    if (rc != 0)
        return rc;
    buf_puts(b, value);
    return buf_puts(b, "\n");
}

int gang_metrics_sample_i64(gang_metrics_buf *b, const char *name, const gang_metric_label *labels,
                            size_t nlabels, int64_t value)
{
    char num[32];

    snprintf(num, sizeof(num), "%" PRId64, value);
    return sample_text(b, name, labels, nlabels, num);
}

int gang_metrics_sample_u64(gang_metrics_buf *b, const char *name, const gang_metric_label *labels,
                            size_t nlabels, uint64_t value)
{
    char num[32];

    snprintf(num, sizeof(num), "%" PRIu64, value);
    return sample_text(b, name, labels, nlabels, num);
}

int gang_metrics_counters(gang_metrics_buf *b, const gang_metric_counter *cs, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        gang_metrics_family(b, cs[i].name, GANG_METRIC_COUNTER, cs[i].help);
        gang_metrics_sample_u64(b, cs[i].name, NULL, 0, cs[i].v);
    }
    return b->err;
}

int gang_metrics_scalars(gang_metrics_buf *b, const gang_metric_scalar *ss, size_t n)
{
    for (size_t i = 0; i < n && b->err == 0; i++) {
        const gang_metric_scalar *s = &ss[i];
        if (s->type == GANG_METRIC_HISTOGRAM)
            return buf_fail(b, GANG_EINVAL);
        gang_metrics_family(b, s->name, s->type, s->help);
        if (s->is_double)
            gang_metrics_sample_double(b, s->name, s->labels, s->nlabels, s->d);
        else
            gang_metrics_sample_u64(b, s->name, s->labels, s->nlabels, s->v);
    }
    return b->err;
}

int gang_metrics_sample_double(gang_metrics_buf *b, const char *name,
                               const gang_metric_label *labels, size_t nlabels, double value)
{
    char num[40];

    format_double(value, num, sizeof(num));
    return sample_text(b, name, labels, nlabels, num);
}

int gang_histogram_init(gang_histogram *h, const double *bounds, size_t n)
{
    memset(h, 0, sizeof(*h));
    if (bounds == NULL || n == 0 || n > GANG_HISTOGRAM_MAX_BUCKETS)
        return GANG_EINVAL;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(bounds[i]) || (i > 0 && !(bounds[i] > bounds[i - 1])))
            return GANG_EINVAL;
    }
    memcpy(h->bounds, bounds, n * sizeof(bounds[0]));
    h->nbounds = n;
    return 0;
}

void gang_histogram_observe(gang_histogram *h, double v)
{
    size_t i = 0;

    if (isnan(v))
        return;
    /* A linear scan: at most 32 bounds, and small latencies land in the first ones. */
    while (i < h->nbounds && v > h->bounds[i])
        i++;
    h->counts[i]++;
    h->sum += v;
    h->count++;
}

/* Appends "<name><suffix>" into out; GANG_EINVAL when it does not fit. */
static int suffixed(char *out, size_t cap, const char *name, const char *suffix)
{
    int n = snprintf(out, cap, "%s%s", name, suffix);

    return (n < 0 || (size_t)n >= cap) ? GANG_EINVAL : 0;
}

int gang_histogram_render(gang_metrics_buf *b, const char *name, const gang_metric_label *labels,
                          size_t nlabels, const gang_histogram *h)
{
    char sample[256], le[40];
    uint64_t cumulative = 0;

    if (b->err != 0)
        return b->err;
    if (name == NULL || suffixed(sample, sizeof(sample), name, "_bucket") < 0)
        return buf_fail(b, GANG_EINVAL);
    for (size_t i = 0; i < nlabels; i++) {
        if (labels != NULL && labels[i].name != NULL && strcmp(labels[i].name, "le") == 0)
            return buf_fail(b, GANG_EINVAL);
    }
    for (size_t i = 0; i <= h->nbounds; i++) {
        char num[32];

        cumulative += h->counts[i];
        if (i < h->nbounds)
            format_double(h->bounds[i], le, sizeof(le));
        else
            snprintf(le, sizeof(le), "+Inf");
        sample_prefix(b, sample, labels, nlabels, "le", le);
        snprintf(num, sizeof(num), "%" PRIu64 "\n", cumulative);
        buf_puts(b, num);
    }
    suffixed(sample, sizeof(sample), name, "_sum");
    gang_metrics_sample_double(b, sample, labels, nlabels, h->sum);
    suffixed(sample, sizeof(sample), name, "_count");
    return gang_metrics_sample_u64(b, sample, labels, nlabels, h->count);
}
