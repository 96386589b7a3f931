/*
 * Kernel traces (issue #24): the sums over spans and the kernel names (kernels/trace.c),
 * and the front's refusals (kernels/backend.c). The CUPTI glue itself is tested by
 * test-cuda on the emulator's CUPTI and on a device.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "ganglion/common.h"
#include "ganglion/kernels.h"
#include "kernels-trace.h"

static void expect_short(const char *raw, const char *want)
{
    char out[GANG_KERNELS_TRACE_NAME];

    gang__trace_short_name(raw, out, sizeof(out));
    if (strcmp(out, want) != 0)
        fail_msg("short name of '%s': '%s', expected '%s'", raw ? raw : "(null)", out, want);
}

static void test_short_names(void **state)
{
    char tiny[5];

    (void)state;
    expect_short("_ZL11gemv_kernelI13__nv_bfloat16EvmmmjPKfiiPKT_S2_Pf", "gemv_kernel<bfloat16>");
    expect_short("_ZL11gemv_kernelI6__halfEvmm", "gemv_kernel<half>");
    expect_short("_Z11gemv_kernelIaEvmmmjPKf", "gemv_kernel<int8>");
    expect_short("_ZL14rmsnorm_kernelPKfS0_fmmPf", "rmsnorm_kernel");
    expect_short("_Z3fooILi8EEvv", "foo<8>");
    expect_short("_Z3fooILin3EEvv", "foo<-3>");
    expect_short("_Z3fooIPfEvv", "foo");              /* a pointer argument: not one of the forms */
    expect_short("gemv_kernel<T>", "gemv_kernel<T>"); /* the emulator's names */
    expect_short("add_kernel (float *)", "add_kernel");
    expect_short("_Z99ab", "_Z99ab"); /* the length runs past the end: taken as it is */
    expect_short("_Z", "_Z");
    expect_short("", "");
    expect_short(NULL, "?");
    gang__trace_short_name("_ZL14rmsnorm_kernelPKf", tiny, sizeof(tiny));
    assert_string_equal(tiny, "rmsn");
}

/* Two spans; kernels before, between and overlapping; four ops. */
static void test_summarize(void **state)
{
    static const char *const names[] = {"_ZL11gemv_kernelI13__nv_bfloat16Evm", "add_kernel",
                                        "_ZL4stepv"};
    gang__trace_rec recs[] = {
        {.start = 399, .end = 450, .name = 2, .grid = {1, 1, 1}}, /* starts in B, ends after */
        {.start = 50, .end = 60, .name = 0, .grid = {8, 1, 1}},   /* before A: not counted */
        {.start = 150, .end = 160, .name = 0, .grid = {8, 1, 1}, .graph = 1},
        {.start = 310, .end = 390, .name = 1, .grid = {4, 2, 1}},
        {.start = 205, .end = 210, .name = 1, .grid = {4, 2, 1}}, /* between: not counted */
        {.start = 110, .end = 120, .name = 0, .grid = {8, 1, 1}, .graph = 1},
        {.start = 118, .end = 130, .name = 1, .grid = {8, 1, 1}}, /* overlaps the one before */
    };
    const gang__trace_span spans[] = {{100, 200}, {300, 400}};
    gang_kernels_trace t;

    (void)state;
    assert_int_equal(gang__trace_summarize(recs, 7, spans, 2, names, 3, 9, &t), 0);
    assert_int_equal(t.spans, 2);
    assert_int_equal(t.kernels, 5);
    assert_int_equal(t.graph_kernels, 2);
    assert_int_equal(t.wall_ns, 200);
    assert_int_equal(t.device_ns, (160 - 110) + (450 - 310));
    assert_int_equal(t.busy_ns, (130 - 110) + (160 - 150) + (390 - 310) + (450 - 399));
    assert_int_equal(t.dropped, 9);
    assert_int_equal(t.n_ops, 4);
    assert_string_equal(t.ops[0].name, "add_kernel 4x2x1");
    assert_int_equal(t.ops[0].count, 1);
    assert_int_equal(t.ops[0].total_ns, 80);
    assert_string_equal(t.ops[1].name, "step 1x1x1");
    assert_int_equal(t.ops[1].total_ns, 51);
    assert_string_equal(t.ops[2].name, "gemv_kernel<bfloat16> 8x1x1");
    assert_int_equal(t.ops[2].count, 2);
    assert_int_equal(t.ops[2].total_ns, 20);
    assert_string_equal(t.ops[3].name, "add_kernel 8x1x1");
    assert_int_equal(t.ops[3].total_ns, 12);

    /* No spans: nothing counted, the drops still reported. */
    assert_int_equal(gang__trace_summarize(recs, 7, NULL, 0, names, 3, 1, &t), 0);
    assert_int_equal(t.kernels, 0);
    assert_int_equal(t.n_ops, 0);
    assert_int_equal(t.dropped, 1);
    /* A span with no kernel: its wall time only. */
    const gang__trace_span empty[] = {{1000, 1100}};
    assert_int_equal(gang__trace_summarize(recs, 7, empty, 1, names, 3, 0, &t), 0);
    assert_int_equal(t.spans, 1);
    assert_int_equal(t.wall_ns, 100);
    assert_int_equal(t.device_ns, 0);
    assert_int_equal(t.busy_ns, 0);
}

/* Past GANG_KERNELS_TRACE_OPS ops, the smallest are summed into "(other)". */
static void test_summarize_other(void **state)
{
    enum { N = GANG_KERNELS_TRACE_OPS + 6 };
    gang__trace_rec recs[N];
    const gang__trace_span span = {0, 1000000};
    const char *const names[] = {"k"};
    gang_kernels_trace t;
    uint64_t other = 0;

    (void)state;
    for (unsigned i = 0; i < N; i++) {
        /* op i lasts 100 + i ns: the largest first once sorted */
        recs[i] = (gang__trace_rec){
            .start = 1000 * i, .end = 1000 * i + 100 + i, .name = 0, .grid = {i + 1, 1, 1}};
        if (N - 1 - i >= GANG_KERNELS_TRACE_OPS - 1)
            other += 100 + i;
    }
    assert_int_equal(gang__trace_summarize(recs, N, &span, 1, names, 1, 0, &t), 0);
    assert_int_equal(t.n_ops, GANG_KERNELS_TRACE_OPS);
    assert_string_equal(t.ops[0].name, "k 30x1x1");
    assert_int_equal(t.ops[0].total_ns, 100 + N - 1);
    assert_string_equal(t.ops[GANG_KERNELS_TRACE_OPS - 1].name, "(other)");
    assert_int_equal(t.ops[GANG_KERNELS_TRACE_OPS - 1].count, N - (GANG_KERNELS_TRACE_OPS - 1));
    assert_int_equal(t.ops[GANG_KERNELS_TRACE_OPS - 1].total_ns, other);
    assert_int_equal(t.kernels, N);
}

static void test_summarize_errors(void **state)
{
    const char *const names[] = {"k"};
    gang__trace_rec r = {.start = 10, .end = 20, .name = 0};
    const gang__trace_span overlap[] = {{0, 50}, {40, 60}};
    const gang__trace_span reversed[] = {{50, 40}};
    const gang__trace_span ok[] = {{0, 50}};
    gang_kernels_trace t;

    (void)state;
    assert_int_equal(gang__trace_summarize(&r, 1, ok, 1, names, 1, 0, NULL), GANG_EINVAL);
    assert_int_equal(gang__trace_summarize(NULL, 1, ok, 1, names, 1, 0, &t), GANG_EINVAL);
    assert_int_equal(gang__trace_summarize(&r, 1, NULL, 1, names, 1, 0, &t), GANG_EINVAL);
    assert_int_equal(gang__trace_summarize(&r, 1, ok, 1, NULL, 1, 0, &t), GANG_EINVAL);
    assert_int_equal(gang__trace_summarize(&r, 1, overlap, 2, names, 1, 0, &t), GANG_EINVAL);
    assert_int_equal(gang__trace_summarize(&r, 1, reversed, 1, names, 1, 0, &t), GANG_EINVAL);
    r.name = 1; /* outside the table */
    assert_int_equal(gang__trace_summarize(&r, 1, ok, 1, names, 1, 0, &t), GANG_EINVAL);
    r.name = 0;
    r.end = 5; /* ends before it starts */
    assert_int_equal(gang__trace_summarize(&r, 1, ok, 1, names, 1, 0, &t), GANG_EINVAL);
    r.end = 20;
    assert_int_equal(gang__trace_summarize(&r, 1, ok, 1, names, 1, 0, &t), 0);
    assert_int_equal(t.kernels, 1);
}

/* Only a backend that can trace takes options.trace; an untraced handle refuses spans. */
static void test_front_refusals(void **state)
{
    static const char *const devices[] = {"cpu", "fake"};
    gang_kernels_options o;
    gang_kernels_trace t;
    gang_kernels *k;

    (void)state;
    for (size_t i = 0; i < sizeof(devices) / sizeof(devices[0]); i++) {
        gang_kernels_options_init(&o);
        assert_int_equal(o.trace, 0);
        o.device = devices[i];
        o.trace = 1;
        k = (gang_kernels *)(uintptr_t)1; /* must be reset to NULL */
        assert_int_equal(gang_kernels_open_opts(&o, &k), GANG_ENOSYS);
        assert_null(k);
        o.trace = 0;
        assert_int_equal(gang_kernels_open_opts(&o, &k), 0);
        assert_int_equal(gang_kernels_trace_begin(k), GANG_EINVAL);
        assert_int_equal(gang_kernels_trace_end(k), GANG_EINVAL);
        memset(&t, 0xff, sizeof(t));
        assert_int_equal(gang_kernels_trace_collect(k, &t), GANG_EINVAL);
        assert_int_equal(t.kernels, 0); /* zeroed even when refused */
        assert_int_equal(gang_kernels_trace_collect(k, NULL), GANG_EINVAL);
        gang_kernels_close(k);
    }
    assert_int_equal(gang_kernels_trace_begin(NULL), GANG_EINVAL);
    assert_int_equal(gang_kernels_trace_end(NULL), GANG_EINVAL);
    assert_int_equal(gang_kernels_trace_collect(NULL, &t), GANG_EINVAL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_short_names),     cmocka_unit_test(test_summarize),
        cmocka_unit_test(test_summarize_other), cmocka_unit_test(test_summarize_errors),
        cmocka_unit_test(test_front_refusals),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
