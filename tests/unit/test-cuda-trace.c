/*
 * Kernel traces on "cuda" (gang_kernels_trace_*, kernels/cuda/cuda-trace.c; issue #24):
 * kernels counted inside spans and only there, graph nodes marked, one tracing handle at a
 * time, the span rules; with CUPTI made to fail, open refuses options.trace and nothing
 * else. Runs on a device (the real CUPTI) and on the emulator (its CUPTI, which can be made
 * to fail: GANG_EMU_CUPTI_FAIL=enable runs only the failure case; GANG_EMU_CUPTI_DROP=N
 * makes it report lost records). Without a GPU the cases skip, saying why. A binary of its
 * own: CUPTI is enabled once per process.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "ganglion/common.h"
#include "ganglion/kernels.h"

#define N 4096

static gang_kernels *open_traced(int trace, int *rc)
{
    gang_kernels_options o;
    gang_kernels *k = NULL;

    gang_kernels_options_init(&o);
    o.device = "cuda";
    o.pool_mb = 256;
    o.trace = trace;
    *rc = gang_kernels_open_opts(&o, &k);
    return k;
}

/* A traced handle, or a visible skip without a GPU. */
static gang_kernels *need_traced(void)
{
    gang_kernels *k;
    int rc;

    if (gang_kernels_device_count() == 0) {
        print_message("[  SKIP    ] no GPU: gang_kernels_device_count() = 0; kernel traces need "
                      "an NVIDIA GPU and CUPTI (or the emulator)\n");
        skip();
    }
    k = open_traced(1, &rc);
    if (rc != 0)
        fail_msg("open with trace: %s (is libcupti.so.13 findable?)", gang_err_name(rc));
    return k;
}

/* The op of t whose name starts with prefix (its kernel name), or NULL. */
static const gang_kernels_trace_op *op_named(const gang_kernels_trace *t, const char *prefix)
{
    for (uint32_t i = 0; i < t->n_ops; i++)
        if (strncmp(t->ops[i].name, prefix, strlen(prefix)) == 0)
            return &t->ops[i];
    return NULL;
}

static void alloc_pair(gang_kernels *k, float **x, float **y)
{
    static float host[N];

    for (int i = 0; i < N; i++)
        host[i] = (float)(i % 7) * 0.25f;
    assert_int_equal(gang_kernels_alloc(k, N * sizeof(float), (void **)x), 0);
    assert_int_equal(gang_kernels_alloc(k, N * sizeof(float), (void **)y), 0);
    assert_int_equal(gang_kernels_upload(k, *x, host, sizeof(host)), 0);
    assert_int_equal(gang_kernels_upload(k, *y, host, sizeof(host)), 0);
}

/* The lost records the emulator was told to report at each hand-back (0 on a device). */
static int drops_expected(void)
{
    const char *v = getenv("GANG_EMU_CUPTI_DROP");

    return v != NULL && atoi(v) > 0;
}

static void test_trace_spans(void **state)
{
    gang_kernels *k = need_traced();
    gang_kernels_trace t;
    const gang_kernels_trace_op *op;
    float *x, *y, *w;

    (void)state;
    alloc_pair(k, &x, &y);
    assert_int_equal(gang_kernels_alloc(k, N * sizeof(float), (void **)&w), 0);
    assert_int_equal(gang_kernels_copy(k, w, y, N * sizeof(float)), 0);
    assert_int_equal(gang_kernels_add(k, x, y, N), 0); /* before every span: not counted */
    assert_int_equal(gang_kernels_sync(k), 0);
    assert_int_equal(gang_kernels_trace_begin(k), 0);
    for (int i = 0; i < 3; i++)
        assert_int_equal(gang_kernels_add(k, x, y, N), 0);
    assert_int_equal(gang_kernels_rmsnorm(k, x, w, 1e-6f, 4, N / 4, y), 0);
    assert_int_equal(gang_kernels_sync(k), 0);
    assert_int_equal(gang_kernels_trace_end(k), 0);
    assert_int_equal(gang_kernels_scale(k, x, 0.5f, N), 0); /* between the spans */
    assert_int_equal(gang_kernels_sync(k), 0);
    assert_int_equal(gang_kernels_trace_begin(k), 0);
    assert_int_equal(gang_kernels_scale(k, y, 2.0f, N), 0);
    assert_int_equal(gang_kernels_sync(k), 0);
    assert_int_equal(gang_kernels_trace_end(k), 0);

    assert_int_equal(gang_kernels_trace_collect(k, &t), 0);
    assert_int_equal(t.spans, 2);
    assert_int_equal(t.kernels, 5);
    assert_int_equal(t.graph_kernels, 0);
    assert_non_null(op = op_named(&t, "add_kernel"));
    assert_int_equal(op->count, 3);
    assert_non_null(op = op_named(&t, "rmsnorm_kernel"));
    assert_int_equal(op->count, 1);
    assert_non_null(strstr(op->name, " 4x1x1")); /* a block per row */
    assert_non_null(op = op_named(&t, "scale_kernel"));
    assert_int_equal(op->count, 1);
    assert_true(t.busy_ns > 0);
    assert_true(t.busy_ns <= t.device_ns);
    assert_true(t.device_ns <= t.wall_ns);
    if (drops_expected())
        assert_true(t.dropped > 0);
    else
        assert_int_equal(t.dropped, 0);
    print_message("trace: %llu kernels, busy %llu ns of %llu on the device, %llu wall\n",
                  (unsigned long long)t.kernels, (unsigned long long)t.busy_ns,
                  (unsigned long long)t.device_ns, (unsigned long long)t.wall_ns);

    /* Collected: the spans are gone. */
    assert_int_equal(gang_kernels_trace_collect(k, &t), 0);
    assert_int_equal(t.spans, 0);
    assert_int_equal(t.kernels, 0);
    gang_kernels_close(k);
}

static void test_trace_graph(void **state)
{
    gang_kernels *k = need_traced();
    gang_kernels_graph *g = NULL;
    gang_kernels_trace t;
    float *x, *y;
    int rc;

    (void)state;
    alloc_pair(k, &x, &y);
    rc = gang_kernels_graph_begin(k);
    if (rc == GANG_ENOSYS) {
        gang_kernels_close(k);
        print_message("[  SKIP    ] this backend has no graphs\n");
        skip();
    }
    assert_int_equal(rc, 0);
    assert_int_equal(gang_kernels_add(k, x, y, N), 0);
    assert_int_equal(gang_kernels_scale(k, x, 0.5f, N), 0);
    assert_int_equal(gang_kernels_graph_end(k, &g), 0);
    assert_int_equal(gang_kernels_trace_begin(k), 0);
    assert_int_equal(gang_kernels_graph_launch(k, g), 0);
    assert_int_equal(gang_kernels_add(k, x, y, N), 0); /* not a node */
    assert_int_equal(gang_kernels_sync(k), 0);
    assert_int_equal(gang_kernels_trace_end(k), 0);
    assert_int_equal(gang_kernels_trace_collect(k, &t), 0);
    assert_int_equal(t.kernels, 3);
    assert_int_equal(t.graph_kernels, 2);
    gang_kernels_graph_free(k, g);
    gang_kernels_close(k);
}

/* One handle traces at a time; begin / end alternate; collect waits for no open span. */
static void test_trace_rules(void **state)
{
    gang_kernels *a = need_traced(), *b;
    gang_kernels_trace t;
    int rc;

    (void)state;
    b = open_traced(1, &rc);
    assert_int_equal(rc, 0);
    assert_int_equal(gang_kernels_trace_end(a), GANG_EINVAL); /* none open */
    assert_int_equal(gang_kernels_trace_begin(a), 0);
    assert_int_equal(gang_kernels_trace_begin(a), GANG_EINVAL); /* one open */
    assert_int_equal(gang_kernels_trace_collect(a, &t), GANG_EINVAL);
    assert_int_equal(gang_kernels_trace_begin(b), GANG_EAGAIN); /* a has spans */
    assert_int_equal(gang_kernels_trace_end(a), 0);
    assert_int_equal(gang_kernels_trace_begin(b), GANG_EAGAIN); /* not collected yet */
    assert_int_equal(gang_kernels_trace_collect(b, &t), GANG_EAGAIN);
    assert_int_equal(gang_kernels_trace_collect(a, &t), 0);
    assert_int_equal(t.spans, 1);
    assert_int_equal(gang_kernels_trace_begin(b), 0); /* now b may */
    assert_int_equal(gang_kernels_trace_end(b), 0);
    gang_kernels_close(b); /* its spans go with it */
    assert_int_equal(gang_kernels_trace_begin(a), 0);
    assert_int_equal(gang_kernels_trace_end(a), 0);
    assert_int_equal(gang_kernels_trace_collect(a, &t), 0);
    assert_int_equal(t.spans, 1);
    gang_kernels_close(a);
}

/* GANG_EMU_CUPTI_FAIL=enable: open refuses options.trace with an error, and only it. */
static void test_trace_unavailable(void **state)
{
    gang_kernels *k;
    int rc;

    (void)state;
    k = open_traced(1, &rc);
    assert_null(k);
    assert_int_equal(rc, GANG_EIO);
    k = open_traced(1, &rc); /* once per process: the same answer again */
    assert_int_equal(rc, GANG_EIO);
    k = open_traced(0, &rc);
    assert_int_equal(rc, 0);
    assert_int_equal(gang_kernels_trace_begin(k), GANG_EINVAL);
    gang_kernels_close(k);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_trace_spans),
        cmocka_unit_test(test_trace_graph),
        cmocka_unit_test(test_trace_rules),
    };
    const struct CMUnitTest failing[] = {
        cmocka_unit_test(test_trace_unavailable),
    };
    const char *fail = getenv("GANG_EMU_CUPTI_FAIL");

    if (fail != NULL && strcmp(fail, "enable") == 0)
        return cmocka_run_group_tests(failing, NULL, NULL);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
