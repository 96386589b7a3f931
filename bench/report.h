/*
 * The benchmarks' results (bench/report.c): statistics over samples (median, percentiles,
 * rounding) and the JSON-line emitter every benchmark prints through, one object per line
 * on stdout, flushed, so that `| head` and log scrapers see whole lines.
 */
#ifndef GANGLION_BENCH_REPORT_H
#define GANGLION_BENCH_REPORT_H

#include <cjson/cJSON.h>

/* Sorts v[0..n) ascending. */
void gang_report_sort(double *v, int n);
/* Median of v[0..n) (sorts v in place): the mean of the middle two for even n; NAN for
 * n <= 0. */
double gang_report_median(double *v, int n);
/*
 * The p-th percentile (0 <= p <= 100) of v[0..n) (sorts v), interpolating linearly
 * between closest ranks, so that p = 50 is the median, 0 the minimum and 100 the maximum.
 * NAN for n <= 0.
 */
double gang_report_percentile(double *v, int n, double p);
/* x rounded to `digits` decimals (half away from zero), so the lines stay readable. */
double gang_report_round(double x, int digits);
/*
 * Adds NAME_p50, NAME_min and NAME_max of v[0..n) rounded to digits (sorts v); returns
 * the median. Adds nothing and returns NAN when n <= 0.
 */
double gang_report_add_stats(cJSON *o, const char *name, double *v, int n, int digits);
/* A new result object whose first key is "bench": bench (NULL when out of memory). */
cJSON *gang_report_new(const char *bench);
/* Adds a number rounded to digits. */
void gang_report_add_num(cJSON *o, const char *key, double v, int digits);
/* Prints o as one JSON line on stdout, flushes, and frees it (NULL is ignored). */
void gang_report_emit(cJSON *o);

#endif
