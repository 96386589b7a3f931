/*
 * Statistics and JSON lines shared by every benchmark (report.h).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "report.h"

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

void gang_report_sort(double *v, int n)
{
    if (n > 1)
        qsort(v, (size_t)n, sizeof *v, cmp_double);
}

double gang_report_percentile(double *v, int n, double p)
{
    if (n <= 0)
        return NAN;
    gang_report_sort(v, n);
    p = p < 0 ? 0 : p > 100 ? 100 : p;
    double rank = p / 100.0 * (n - 1);
    int lo = (int)floor(rank);
    int hi = lo + 1 < n ? lo + 1 : lo;
    double frac = rank - lo;
    /* Exact middle of an even count: the plain mean, as the median has always been. */
    if (frac == 0.5)
        return (v[lo] + v[hi]) / 2.0;
    return v[lo] + (v[hi] - v[lo]) * frac;
}

double gang_report_median(double *v, int n)
{
    return gang_report_percentile(v, n, 50.0);
}

double gang_report_round(double x, int digits)
{
    double f = pow(10.0, digits);
    return round(x * f) / f;
}

double gang_report_add_stats(cJSON *o, const char *name, double *v, int n, int digits)
{
    char key[96];

    if (n <= 0)
        return NAN;
    double p50 = gang_report_median(v, n); /* sorts v, so min and max are the ends */
    snprintf(key, sizeof key, "%s_p50", name);
    cJSON_AddNumberToObject(o, key, gang_report_round(p50, digits));
    snprintf(key, sizeof key, "%s_min", name);
    cJSON_AddNumberToObject(o, key, gang_report_round(v[0], digits));
    snprintf(key, sizeof key, "%s_max", name);
    cJSON_AddNumberToObject(o, key, gang_report_round(v[n - 1], digits));
    return p50;
}

cJSON *gang_report_new(const char *bench)
{
    cJSON *o = cJSON_CreateObject();
    if (o != NULL)
        cJSON_AddStringToObject(o, "bench", bench);
    return o;
}

void gang_report_add_num(cJSON *o, const char *key, double v, int digits)
{
    cJSON_AddNumberToObject(o, key, gang_report_round(v, digits));
}

void gang_report_emit(cJSON *o)
{
    char *s = o != NULL ? cJSON_PrintUnformatted(o) : NULL;

    if (s != NULL) {
        fputs(s, stdout);
        fputc('\n', stdout);
        cJSON_free(s);
    }
    fflush(stdout);
    cJSON_Delete(o);
}
