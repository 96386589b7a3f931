/*
 * Prometheus text builder: exact expected text for families of each type, number
 * formatting, escaping, cumulative histogram buckets and the sticky error convention.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "ganglion/common.h"
#include "serve-tests.h"
#include "ganglion/serve.h"

static void test_empty_buffer(void **state)
{
    gang_metrics_buf b;

    (void)state;
    gang_metrics_buf_init(&b);
    assert_string_equal(gang_metrics_buf_text(&b), "");
    assert_int_equal(b.len, 0);
    gang_metrics_buf_reset(&b);
    assert_string_equal(gang_metrics_buf_text(&b), "");
    gang_metrics_buf_free(&b);
    gang_metrics_buf_free(&b); /* idempotent */
}

static void test_gauge_and_counter(void **state)
{
    gang_metric_label node[] = {{"node", "0"}, {"state", "serving"}};
    gang_metrics_buf b;

    (void)state;
    gang_metrics_buf_init(&b);
    assert_int_equal(gang_metrics_family(&b, "ganglion_up", GANG_METRIC_GAUGE, "1 while up."), 0);
    assert_int_equal(gang_metrics_sample_i64(&b, "ganglion_up", NULL, 0, 1), 0);
    assert_int_equal(
        gang_metrics_family(&b, "ganglion_restarts_total", GANG_METRIC_COUNTER, "Gang restarts."),
        0);
    assert_int_equal(gang_metrics_sample_u64(&b, "ganglion_restarts_total", node, 2, UINT64_MAX),
                     0);
    assert_int_equal(gang_metrics_family(&b, "ganglion:ratio", GANG_METRIC_GAUGE, NULL), 0);
    assert_int_equal(gang_metrics_sample_i64(&b, "ganglion:ratio", node, 1, INT64_MIN), 0);
    assert_string_equal(gang_metrics_buf_text(&b),
                        "# HELP ganglion_up 1 while up.\n"
                        "# TYPE ganglion_up gauge\n"
                        "ganglion_up 1\n"
                        "# HELP ganglion_restarts_total Gang restarts.\n"
                        "# TYPE ganglion_restarts_total counter\n"
                        "ganglion_restarts_total{node=\"0\",state=\"serving\"} "
                        "18446744073709551615\n"
                        "# TYPE ganglion:ratio gauge\n"
                        "ganglion:ratio{node=\"0\"} -9223372036854775808\n");
    assert_int_equal(b.len, strlen(gang_metrics_buf_text(&b)));
    assert_int_equal(b.err, 0);

    /* Reset keeps the allocation and starts over. */
    gang_metrics_buf_reset(&b);
    assert_string_equal(gang_metrics_buf_text(&b), "");
    assert_non_null(b.data);
    gang_metrics_buf_free(&b);
}

static void test_doubles(void **state)
{
    static const struct {
        double v;
        const char *text;
    } cases[] = {
        {0.0, "0"},
        {3.0, "3"},
        {-2.5, "-2.5"},
        {0.1, "0.1"},
        {1e-5, "1e-05"},
        {1.0 / 3.0, "0.3333333333333333"},
        {0.1 + 0.2, "0.30000000000000004"},
        {123456789012345678.0, "1.2345678901234568e+17"},
        {9007199254740993.0, "9007199254740992"},
    };
    gang_metrics_buf b;
    char want[4096] = "";

    (void)state;
    gang_metrics_buf_init(&b);
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        assert_int_equal(gang_metrics_sample_double(&b, "x", NULL, 0, cases[i].v), 0);
        strcat(want, "x ");
        strcat(want, cases[i].text);
        strcat(want, "\n");
    }
    gang_metrics_sample_double(&b, "x", NULL, 0, INFINITY);
    gang_metrics_sample_double(&b, "x", NULL, 0, -INFINITY);
    gang_metrics_sample_double(&b, "x", NULL, 0, NAN);
    strcat(want, "x +Inf\nx -Inf\nx NaN\n");
    assert_string_equal(gang_metrics_buf_text(&b), want);
    gang_metrics_buf_free(&b);
}

static void test_escaping(void **state)
{
    gang_metric_label l[] = {{"path", "C:\\dir\"x\"\nnext"}, {"empty", ""}};
    gang_metrics_buf b;

    (void)state;
    gang_metrics_buf_init(&b);
    gang_metrics_family(&b, "m", GANG_METRIC_GAUGE, "A \"quoted\" back\\slash\nand newline.");
    gang_metrics_sample_double(&b, "m", l, 2, 0.5);
    assert_int_equal(b.err, 0);
    assert_string_equal(gang_metrics_buf_text(&b),
                        "# HELP m A \"quoted\" back\\\\slash\\nand newline.\n"
                        "# TYPE m gauge\n"
                        "m{path=\"C:\\\\dir\\\"x\\\"\\nnext\",empty=\"\"} 0.5\n");
    gang_metrics_buf_free(&b);
}

static void test_histogram(void **state)
{
    static const double bounds[] = {0.25, 1, 4};
    gang_metric_label l[] = {{"route", "/v1/completions"}};
    gang_histogram h;
    gang_metrics_buf b;

    (void)state;
    assert_int_equal(gang_histogram_init(&h, bounds, 3), 0);
    gang_histogram_observe(&h, 0.125);
    gang_histogram_observe(&h, 1.0); /* on a bound: counts in that bucket (le) */
    gang_histogram_observe(&h, 2.0);
    gang_histogram_observe(&h, 8.0);
    gang_histogram_observe(&h, NAN); /* ignored */
    gang_histogram_observe(&h, 0.25);
    assert_int_equal(h.count, 5);

    gang_metrics_buf_init(&b);
    gang_metrics_family(&b, "req_seconds", GANG_METRIC_HISTOGRAM, "Request latency.");
    assert_int_equal(gang_histogram_render(&b, "req_seconds", l, 1, &h), 0);
    assert_int_equal(gang_histogram_render(&b, "req_seconds", NULL, 0, &h), 0);
    assert_string_equal(gang_metrics_buf_text(&b),
                        "# HELP req_seconds Request latency.\n"
                        "# TYPE req_seconds histogram\n"
                        "req_seconds_bucket{route=\"/v1/completions\",le=\"0.25\"} 2\n"
                        "req_seconds_bucket{route=\"/v1/completions\",le=\"1\"} 3\n"
                        "req_seconds_bucket{route=\"/v1/completions\",le=\"4\"} 4\n"
                        "req_seconds_bucket{route=\"/v1/completions\",le=\"+Inf\"} 5\n"
                        "req_seconds_sum{route=\"/v1/completions\"} 11.375\n"
                        "req_seconds_count{route=\"/v1/completions\"} 5\n"
                        "req_seconds_bucket{le=\"0.25\"} 2\n"
                        "req_seconds_bucket{le=\"1\"} 3\n"
                        "req_seconds_bucket{le=\"4\"} 4\n"
                        "req_seconds_bucket{le=\"+Inf\"} 5\n"
                        "req_seconds_sum 11.375\n"
                        "req_seconds_count 5\n");
    gang_metrics_buf_free(&b);
}

static void test_histogram_empty_and_invalid(void **state)
{
    static const double not_increasing[] = {1, 1};
    static const double with_nan[] = {1, NAN};
    static const double with_inf[] = {1, INFINITY};
    double many[GANG_HISTOGRAM_MAX_BUCKETS + 1];
    gang_histogram h;
    gang_metrics_buf b;

    (void)state;
    for (size_t i = 0; i < GANG_HISTOGRAM_MAX_BUCKETS + 1; i++)
        many[i] = (double)i;
    assert_int_equal(gang_histogram_init(&h, many, GANG_HISTOGRAM_MAX_BUCKETS), 0);
    assert_int_equal(gang_histogram_init(&h, many, GANG_HISTOGRAM_MAX_BUCKETS + 1), GANG_EINVAL);
    assert_int_equal(gang_histogram_init(&h, not_increasing, 2), GANG_EINVAL);
    assert_int_equal(gang_histogram_init(&h, with_nan, 2), GANG_EINVAL);
    assert_int_equal(gang_histogram_init(&h, with_inf, 2), GANG_EINVAL);
    assert_int_equal(gang_histogram_init(&h, NULL, 0), GANG_EINVAL);

    /* A failed init leaves a usable histogram with only the +Inf bucket. */
    gang_histogram_observe(&h, -3);
    gang_metrics_buf_init(&b);
    assert_int_equal(gang_histogram_render(&b, "h", NULL, 0, &h), 0);
    assert_string_equal(gang_metrics_buf_text(&b),
                        "h_bucket{le=\"+Inf\"} 1\nh_sum -3\nh_count 1\n");

    /* "le" belongs to the histogram. */
    {
        gang_metric_label le[] = {{"le", "1"}};

        assert_int_equal(gang_histogram_render(&b, "h", le, 1, &h), GANG_EINVAL);
    }
    gang_metrics_buf_free(&b);
}

/* A list of unlabeled counters: a family and one sample each, in order; a bad name stops
 * the list there with the buffer's sticky error. */
static void test_counters(void **state)
{
    const gang_metric_counter cs[] = {{"a_total", "As.", 3}, {"b_total", NULL, UINT64_MAX}};
    const gang_metric_counter bad[] = {{"c_total", "Cs.", 1}, {"d-total", "Ds.", 2}};
    gang_metrics_buf b;

    (void)state;
    gang_metrics_buf_init(&b);
    assert_int_equal(gang_metrics_counters(&b, cs, 2), 0);
    assert_string_equal(gang_metrics_buf_text(&b), "# HELP a_total As.\n"
                                                   "# TYPE a_total counter\n"
                                                   "a_total 3\n"
                                                   "# TYPE b_total counter\n"
                                                   "b_total 18446744073709551615\n");
    gang_metrics_buf_reset(&b);
    assert_int_equal(gang_metrics_counters(&b, bad, 2), GANG_EINVAL);
    assert_string_equal(gang_metrics_buf_text(&b), "# HELP c_total Cs.\n"
                                                   "# TYPE c_total counter\n"
                                                   "c_total 1\n");
    gang_metrics_buf_free(&b);
}

/* A table of scalars: each family's header and sample in order, labels and doubles kept;
 * a histogram entry or a bad name stops the table with GANG_EINVAL after what came before. */
static void test_scalars(void **state)
{
    const gang_metric_label nl = {"node", "2"};
    const gang_metric_scalar ss[] = {
        {"g", "Gs.", GANG_METRIC_GAUGE, &nl, 1, .v = 7},
        {"c_total", NULL, GANG_METRIC_COUNTER, .v = UINT64_MAX},
        {"d_seconds", "Ds.", GANG_METRIC_GAUGE, .is_double = 1, .d = 0.25},
    };
    const gang_metric_scalar hist[] = {
        {"ok", "Oks.", GANG_METRIC_GAUGE, .v = 1},
        {"h", "Hs.", GANG_METRIC_HISTOGRAM, .v = 1},
        {"after", "Never.", GANG_METRIC_GAUGE, .v = 1},
    };
    const gang_metric_scalar badname[] = {{"a-b", "Bad.", GANG_METRIC_GAUGE, .v = 1}};
    gang_metrics_buf b;

    (void)state;
    gang_metrics_buf_init(&b);
    assert_int_equal(gang_metrics_scalars(&b, ss, 3), 0);
    assert_string_equal(gang_metrics_buf_text(&b), "# HELP g Gs.\n"
                                                   "# TYPE g gauge\n"
                                                   "g{node=\"2\"} 7\n"
                                                   "# TYPE c_total counter\n"
                                                   "c_total 18446744073709551615\n"
                                                   "# HELP d_seconds Ds.\n"
                                                   "# TYPE d_seconds gauge\n"
                                                   "d_seconds 0.25\n");
    gang_metrics_buf_reset(&b);
    assert_int_equal(gang_metrics_scalars(&b, hist, 3), GANG_EINVAL);
    assert_string_equal(gang_metrics_buf_text(&b), "# HELP ok Oks.\n"
                                                   "# TYPE ok gauge\n"
                                                   "ok 1\n");
    gang_metrics_buf_reset(&b);
    assert_int_equal(gang_metrics_scalars(&b, badname, 1), GANG_EINVAL);
    assert_string_equal(gang_metrics_buf_text(&b), "");
    gang_metrics_buf_free(&b);
}

static void test_sticky_errors(void **state)
{
    gang_metric_label bad[] = {{"a-b", "v"}};
    gang_metric_label nullv[] = {{"a", NULL}};
    gang_metrics_buf b;

    (void)state;
    gang_metrics_buf_init(&b);
    gang_metrics_sample_i64(&b, "ok", NULL, 0, 1);
    assert_int_equal(gang_metrics_sample_i64(&b, "ok", bad, 1, 2), GANG_EINVAL);
    /* Nothing more is appended once an error is recorded. */
    assert_int_equal(gang_metrics_sample_i64(&b, "ok", NULL, 0, 3), GANG_EINVAL);
    assert_int_equal(gang_metrics_family(&b, "ok", GANG_METRIC_GAUGE, "x"), GANG_EINVAL);
    assert_string_equal(gang_metrics_buf_text(&b), "ok 1\n");

    static const char *const bad_names[] = {"", "1abc", "a-b", "a b", "é"};
    for (size_t i = 0; i < sizeof(bad_names) / sizeof(bad_names[0]); i++) {
        gang_metrics_buf_reset(&b);
        assert_int_equal(gang_metrics_sample_i64(&b, bad_names[i], NULL, 0, 1), GANG_EINVAL);
        gang_metrics_buf_reset(&b);
        assert_int_equal(gang_metrics_family(&b, bad_names[i], GANG_METRIC_COUNTER, NULL),
                         GANG_EINVAL);
    }
    gang_metrics_buf_reset(&b);
    assert_int_equal(gang_metrics_sample_i64(&b, "m", nullv, 1, 1), GANG_EINVAL);
    gang_metrics_buf_reset(&b);
    assert_int_equal(gang_metrics_sample_i64(&b, "m", NULL, 1, 1), GANG_EINVAL);
    gang_metrics_buf_reset(&b);
    assert_int_equal(gang_metrics_family(&b, "m", (gang_metric_type)7, NULL), GANG_EINVAL);
    /* Label names may not contain ':'; metric names may. */
    gang_metrics_buf_reset(&b);
    {
        gang_metric_label colon[] = {{"a:b", "v"}};

        assert_int_equal(gang_metrics_sample_i64(&b, "a:b", colon, 1, 1), GANG_EINVAL);
    }
    gang_metrics_buf_free(&b);
}

static void test_growth(void **state)
{
    gang_metric_label l[] = {{"i", "padding-padding-padding-padding"}};
    gang_metrics_buf b;
    char last[128];

    (void)state;
    gang_metrics_buf_init(&b);
    for (int i = 0; i < 20000; i++)
        gang_metrics_sample_i64(&b, "many_samples_in_one_buffer", l, 1, i);
    assert_int_equal(b.err, 0);
    assert_int_equal(b.len, strlen(b.data));
    snprintf(last, sizeof(last), "many_samples_in_one_buffer{i=\"%s\"} 19999\n", l[0].value);
    assert_string_equal(b.data + b.len - strlen(last), last);
    assert_true(b.cap > b.len);
    gang_metrics_buf_free(&b);
}

int gang_test_metrics(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_empty_buffer),  cmocka_unit_test(test_gauge_and_counter),
        cmocka_unit_test(test_doubles),       cmocka_unit_test(test_escaping),
        cmocka_unit_test(test_histogram),     cmocka_unit_test(test_histogram_empty_and_invalid),
        cmocka_unit_test(test_sticky_errors), cmocka_unit_test(test_growth),
        cmocka_unit_test(test_counters),      cmocka_unit_test(test_scalars),
    };

    return cmocka_run_group_tests_name("metrics", tests, NULL, NULL);
}
