/*
 * The MoE block of a layer on a TP group (parallel/tp-moe.c, tp-moe-dev.c; issue #25):
 * rank threads over a socket communicator each build their share of one block (experts cut
 * by columns with ep 1, split whole with ep = tp, a shared expert cut by columns) from the
 * same full weights, run gang_tp_moe_forward on the same tokens, and every rank's output
 * must equal a double-precision reference of the whole block (softmax, top-k with the lower
 * id first, renormalised; SwiGLU experts; sigmoid-gated shared expert) within 1e-4. Run on
 * the "cpu" kernels and on the fake device (the weights moved by gang_tp_moe_to_device).
 * Also: the shapes gang_tp_moe_init refuses, and the load counters.
 */
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "ganglion/comm.h"
#include "ganglion/parallel.h"
#include "fake-comm.h"

#define TM_TIMEOUT_MS 20000
#define TM_RANKS 4
#define TM_H 16 /* hidden */
#define TM_E 8  /* experts */
#define TM_K 2  /* top-k */
#define TM_F 8  /* each expert's width */
#define TM_SH 8 /* the shared expert's width */
#define TM_T 7  /* tokens */

/* The full weights, the same function on every rank: kind 0 router, 1-3 expert gate / up /
 * down, 4-6 shared gate / up / down, 7 the shared expert's gate. */
static float tm_w(int kind, uint32_t e, uint32_t r, uint32_t c)
{
    return 0.4f * sinf((float)kind * 7.1f + (float)e * 3.1f + (float)r * 0.37f + (float)c * 0.11f);
}

static float tm_x(uint32_t t, uint32_t d)
{
    return cosf((float)t * 1.3f + (float)d * 0.7f);
}

/* The reference output of token t in double. */
static void tm_ref(uint32_t t, double *out)
{
    double z[TM_E], p[TM_E], sum = 0.0, mx = -1e300, top = 0.0, g = 0.0;
    int id[TM_K];

    memset(out, 0, TM_H * sizeof(double));
    for (uint32_t e = 0; e < TM_E; e++) {
        z[e] = 0.0;
        for (uint32_t d = 0; d < TM_H; d++)
            z[e] += (double)tm_x(t, d) * tm_w(0, 0, e, d);
        mx = z[e] > mx ? z[e] : mx;
    }
    for (uint32_t e = 0; e < TM_E; e++)
        sum += (p[e] = exp(z[e] - mx));
    for (int j = 0; j < TM_K; j++) {
        id[j] = -1;
        for (uint32_t e = 0; e < TM_E; e++) {
            int taken = 0;
            for (int i = 0; i < j; i++)
                taken |= id[i] == (int)e;
            if (!taken && (id[j] < 0 || z[e] > z[id[j]]))
                id[j] = (int)e;
        }
        top += p[id[j]] / sum;
    }
    for (int j = 0; j < TM_K + 1; j++) { /* the top-k experts, then the shared one */
        int sh = j == TM_K;
        uint32_t e = sh ? 0 : (uint32_t)id[j], f = sh ? TM_SH : TM_F, kg = sh ? 4 : 1;
        double wgt = sh ? 0.0 : p[e] / sum / top, a[TM_SH > TM_F ? TM_SH : TM_F];

        if (sh) {
            for (uint32_t d = 0; d < TM_H; d++)
                g += (double)tm_x(t, d) * tm_w(7, 0, 0, d);
            wgt = 1.0 / (1.0 + exp(-g));
        }
        for (uint32_t r = 0; r < f; r++) {
            double gg = 0.0, uu = 0.0;
            for (uint32_t d = 0; d < TM_H; d++) {
                gg += (double)tm_x(t, d) * tm_w((int)kg, e, r, d);
                uu += (double)tm_x(t, d) * tm_w((int)kg + 1, e, r, d);
            }
            a[r] = gg / (1.0 + exp(-gg)) * uu;
        }
        for (uint32_t d = 0; d < TM_H; d++) {
            double o = 0.0;
            for (uint32_t r = 0; r < f; r++)
                o += a[r] * tm_w((int)kg + 2, e, d, r);
            out[d] += wgt * o;
        }
    }
}

/* Rank r's share of the block, filled from the full weights. */
static int tm_block(uint32_t tp, uint32_t r, uint32_t ep, gang_tp_moe **out)
{
    gang_tp_moe *m;
    int rc = gang_tp_moe_init(&m, TM_E, TM_K, 1, TM_H, TM_F, TM_SH, tp, r, ep);

    if (rc != 0)
        return rc;
    for (uint32_t e = 0; e < TM_E; e++)
        for (uint32_t d = 0; d < TM_H; d++)
            m->router[e * TM_H + d] = tm_w(0, 0, e, d);
    for (uint32_t i = 0; i < m->expert_count; i++) {
        uint32_t e = m->expert_first + i;
        size_t base = (size_t)i * m->ffn_count * TM_H;

        for (uint32_t c = 0; c < m->ffn_count; c++)
            for (uint32_t d = 0; d < TM_H; d++) {
                m->w_gate[base + c * TM_H + d] = tm_w(1, e, m->ffn_first + c, d);
                m->w_up[base + c * TM_H + d] = tm_w(2, e, m->ffn_first + c, d);
                m->w_down[base + d * m->ffn_count + c] = tm_w(3, e, d, m->ffn_first + c);
            }
    }
    for (uint32_t c = 0; c < m->sh_count; c++)
        for (uint32_t d = 0; d < TM_H; d++) {
            m->sh_gate[c * TM_H + d] = tm_w(4, 0, m->sh_first + c, d);
            m->sh_up[c * TM_H + d] = tm_w(5, 0, m->sh_first + c, d);
            m->sh_down[d * m->sh_count + c] = tm_w(6, 0, d, m->sh_first + c);
        }
    for (uint32_t d = 0; d < TM_H; d++)
        m->sh_gate_w[d] = tm_w(7, 0, 0, d);
    *out = m;
    return 0;
}

typedef struct tm_run {
    uint32_t tp, ep;
    const char *device;
    char blob[256];
    size_t blob_len;
    gang_comm_listener *listener;
    fake_group *fg; /* set: the ranks talk over the fake device-memory communicator */
    char why[TM_RANKS][200];
} tm_run;

typedef struct tm_rank {
    tm_run *run;
    uint32_t rank;
} tm_rank;

/* One rank: its block, the forward on the device or the host, the check. */
static void tm_body(tm_run *run, uint32_t r, gang_comm *c)
{
    gang_kernels *k = NULL;
    gang_tp_moe *m = NULL;
    float x[TM_T * TM_H], y[TM_T * TM_H];
    void *dx = NULL, *dy = NULL;
    gang_comm *fc = NULL;
    int rc = gang_kernels_open(run->device, &k);

    if (rc == 0 && run->fg != NULL && (c = fc = fake_comm_new(run->fg, r, k, 0)) == NULL)
        rc = GANG_ENOMEM;
    for (uint32_t t = 0; t < TM_T; t++)
        for (uint32_t d = 0; d < TM_H; d++)
            x[t * TM_H + d] = tm_x(t, d);
    if (rc == 0)
        rc = tm_block(run->tp, r, run->ep, &m);
    if (rc == 0)
        rc = gang_tp_moe_to_device(m, k);
    if (rc == 0)
        rc = gang_kernels_alloc(k, sizeof(x), &dx);
    if (rc == 0)
        rc = gang_kernels_alloc(k, sizeof(y), &dy);
    if (rc == 0)
        rc = gang_kernels_upload(k, dx, x, sizeof(x));
    for (int it = 0; rc == 0 && it < 2; it++) /* twice: the scratch is kept */
        rc = gang_tp_moe_forward(m, k, run->tp > 1 ? c : NULL, dx, TM_T, dy, TM_TIMEOUT_MS);
    if (rc == 0)
        rc = gang_kernels_download(k, y, dy, sizeof(y));
    if (rc != 0) {
        snprintf(run->why[r], sizeof(run->why[r]), "rank %u: %s", r, gang_strerror(rc));
        goto out;
    }
    for (uint32_t t = 0; t < TM_T; t++) {
        double want[TM_H];

        tm_ref(t, want);
        for (uint32_t d = 0; d < TM_H; d++)
            if (fabs(y[t * TM_H + d] - want[d]) > 1e-4 * (1.0 + fabs(want[d]))) {
                snprintf(run->why[r], sizeof(run->why[r]), "rank %u: y[%u][%u] = %g, want %g", r, t,
                         d, (double)y[t * TM_H + d], want[d]);
                goto out;
            }
    }
    /* Every (token, choice) of the rank's run counted, twice (two calls). */
    if (m->load.steps != 2 || m->load.slots % TM_K != 0 ||
        (run->ep == 1 && m->load.slots != 2u * TM_T * TM_K))
        snprintf(run->why[r], sizeof(run->why[r]), "rank %u: load steps %llu slots %llu", r,
                 (unsigned long long)m->load.steps, (unsigned long long)m->load.slots);
out:
    if (k != NULL) {
        gang_kernels_free(k, dx);
        gang_kernels_free(k, dy);
    }
    gang_tp_moe_free(m);
    gang_comm_free(fc);
    gang_kernels_close(k);
}

static void *tm_thread(void *arg)
{
    tm_rank *tr = arg;
    tm_run *run = tr->run;
    gang_comm_config cfg = {.backend = GANG_COMM_SOCKET,
                            .rank = tr->rank,
                            .world_size = run->tp,
                            .blob = (const uint8_t *)run->blob,
                            .blob_len = run->blob_len,
                            .listener = tr->rank == 0 ? run->listener : NULL,
                            .advertise_host = "127.0.0.1",
                            .timeout_ms = TM_TIMEOUT_MS};
    gang_comm *c = NULL;
    int rc;

    if (run->fg != NULL) { /* tm_body makes the rank's fake communicator on its handle */
        tm_body(run, tr->rank, NULL);
        return NULL;
    }
    rc = gang_comm_init(&cfg, &c);

    if (rc != 0)
        snprintf(run->why[tr->rank], sizeof(run->why[tr->rank]), "init: %s", gang_strerror(rc));
    else
        tm_body(run, tr->rank, c);
    gang_comm_free(c);
    return NULL;
}

static void test_tp_moe_layouts(void **state)
{
    const uint32_t cases[][2] = {{1, 1}, {2, 1}, {2, 2}, {4, 1}, {4, 4}}; /* tp, ep */
    const char *devices[] = {"cpu", "fake"};

    (void)state;
    for (size_t di = 0; di < 2; di++)
        for (size_t ci = 0; ci < sizeof(cases) / sizeof(cases[0]); ci++) {
            static tm_run run;
            tm_rank ranks[TM_RANKS];
            pthread_t th[TM_RANKS];

            memset(&run, 0, sizeof(run));
            run.tp = cases[ci][0];
            run.ep = cases[ci][1];
            run.device = devices[di];
            assert_int_equal(gang_comm_socket_listen("127.0.0.1", &run.listener, run.blob,
                                                     sizeof(run.blob), &run.blob_len),
                             0);
            for (uint32_t r = 0; r < run.tp; r++) {
                ranks[r] = (tm_rank){&run, r};
                assert_int_equal(pthread_create(&th[r], NULL, tm_thread, &ranks[r]), 0);
            }
            for (uint32_t r = 0; r < run.tp; r++)
                pthread_join(th[r], NULL);
            for (uint32_t r = 0; r < run.tp; r++)
                if (run.why[r][0] != '\0')
                    fail_msg("%s tp %u ep %u: %s", run.device, run.tp, run.ep, run.why[r]);
        }
}

/*
 * The device path over a device-memory communicator (the nccl path's shape, issue #25):
 * the fake device with the fake communicator, whose all-to-all reads and writes device
 * memory only (a host buffer handed to it aborts the test), EP = TP 2 and 4, and ep 1.
 */
static void test_tp_moe_device_comm(void **state)
{
    const uint32_t cases[][2] = {{2, 2}, {4, 4}, {2, 1}}; /* tp, ep */

    (void)state;
    for (size_t ci = 0; ci < sizeof(cases) / sizeof(cases[0]); ci++) {
        static tm_run run;
        tm_rank ranks[TM_RANKS];
        pthread_t th[TM_RANKS];

        memset(&run, 0, sizeof(run));
        run.tp = cases[ci][0];
        run.ep = cases[ci][1];
        run.device = "fake";
        run.fg = fake_group_new(run.tp);
        assert_non_null(run.fg);
        for (uint32_t r = 0; r < run.tp; r++) {
            ranks[r] = (tm_rank){&run, r};
            assert_int_equal(pthread_create(&th[r], NULL, tm_thread, &ranks[r]), 0);
        }
        for (uint32_t r = 0; r < run.tp; r++)
            pthread_join(th[r], NULL);
        fake_group_free(run.fg);
        for (uint32_t r = 0; r < run.tp; r++)
            if (run.why[r][0] != '\0')
                fail_msg("fake comm tp %u ep %u: %s", run.tp, run.ep, run.why[r]);
    }
}

static void test_tp_moe_refused(void **state)
{
    gang_tp_moe *m = NULL;

    (void)state;
    /* ep neither 1 nor tp; experts not divisible by ep; width not divisible by tp (ep 1);
     * shared width not divisible by tp; top-k above the experts. */
    assert_int_equal(gang_tp_moe_init(&m, 8, 2, 1, 16, 8, 0, 4, 0, 2), GANG_EINVAL);
    assert_int_equal(gang_tp_moe_init(&m, 6, 2, 1, 16, 8, 0, 4, 0, 4), GANG_EINVAL);
    assert_int_equal(gang_tp_moe_init(&m, 8, 2, 1, 16, 6, 0, 4, 0, 1), GANG_EINVAL);
    assert_int_equal(gang_tp_moe_init(&m, 8, 2, 1, 16, 8, 6, 4, 0, 4), GANG_EINVAL);
    assert_int_equal(gang_tp_moe_init(&m, 8, 9, 1, 16, 8, 0, 1, 0, 1), GANG_EINVAL);
    assert_null(m);
    /* ep = tp takes a width tp does not divide: the experts are not cut. */
    assert_int_equal(gang_tp_moe_init(&m, 8, 2, 1, 16, 6, 0, 4, 3, 4), 0);
    assert_int_equal(m->expert_first, 6);
    assert_int_equal(m->expert_count, 2);
    assert_int_equal(m->ffn_count, 6);
    gang_tp_moe_free(m);
}

int gang_test_tp_moe(void);
int gang_test_tp_moe(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tp_moe_refused),
        cmocka_unit_test(test_tp_moe_layouts),
        cmocka_unit_test(test_tp_moe_device_comm),
    };
    return cmocka_run_group_tests_name("parallel/tp-moe", tests, NULL, NULL);
}
