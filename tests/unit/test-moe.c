/*
 * parallel/moe.c (issue #25): the routing rule against a double-precision reference
 * written here (softmax, top-k with the lower id first among equals, renormalisation), the
 * dispatch plan's invariants, and the two all-to-alls of expert parallelism on a real
 * socket communicator of 1, 2, 3 and 4 threads: every rank routes random tokens over 8 or
 * 12 experts, each expert multiplies its rows by (expert id + 1) and adds its id, and the
 * combined output must equal what one rank computes alone from the same routing.
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

#define MOE_TIMEOUT_MS 20000
#define MOE_MAX_RANKS 4

static uint32_t lcg(uint32_t *s)
{
    *s = *s * 1664525u + 1013904223u;
    return *s >> 8;
}

/* The reference: softmax in double, the k largest (lower id first among equals). */
static void ref_route(const float *z, uint32_t n, uint32_t k, int norm, int32_t *id, double *w)
{
    double mx = -INFINITY, sum = 0, top = 0;
    int used[64] = {0};

    for (uint32_t e = 0; e < n; e++)
        mx = z[e] > mx ? z[e] : mx;
    for (uint32_t e = 0; e < n; e++)
        sum += exp((double)z[e] - mx);
    for (uint32_t j = 0; j < k; j++) {
        int best = -1;

        for (uint32_t e = 0; e < n; e++)
            if (!used[e] && (best < 0 || z[e] > z[best]))
                best = (int)e;
        used[best] = 1;
        id[j] = best;
        w[j] = exp((double)z[best] - mx) / sum;
        top += w[j];
    }
    if (norm)
        for (uint32_t j = 0; j < k; j++)
            w[j] /= top;
}

static void test_moe_route(void **state)
{
    const uint32_t shapes[][3] = {{8, 2, 1}, {8, 2, 0}, {64, 8, 1}, {60, 4, 0}, {4, 4, 1}};
    uint32_t seed = 7;

    (void)state;
    for (size_t si = 0; si < sizeof(shapes) / sizeof(shapes[0]); si++) {
        uint32_t n = shapes[si][0], k = shapes[si][1];
        gang_moe_route_cfg cfg = {.n_experts = n, .top_k = k, .norm_topk = (int)shapes[si][2]};
        size_t tokens = 37;
        float *z = malloc(tokens * n * sizeof(float)), *w = malloc(tokens * k * sizeof(float));
        int32_t *id = malloc(tokens * k * sizeof(int32_t)), rid[16];
        double rw[16];

        assert_non_null(z);
        assert_non_null(w);
        assert_non_null(id);
        for (size_t i = 0; i < tokens * n; i++)
            z[i] = (float)((int)(lcg(&seed) % 2001) - 1000) / 100.0f;
        /* ties: token 0 has every logit equal, token 1 two equal maxima, token 2 extremes */
        for (uint32_t e = 0; e < n; e++) {
            z[e] = 0.5f;
            z[n + e] = e == 1 || e == n - 1 ? 3.0f : -1.0f;
            z[2 * n + e] = e % 2 ? 80.0f : -80.0f;
        }
        assert_int_equal(gang_moe_route(&cfg, z, tokens, id, w), 0);
        for (size_t t = 0; t < tokens; t++) {
            ref_route(z + t * n, n, k, cfg.norm_topk, rid, rw);
            for (uint32_t j = 0; j < k; j++) {
                assert_int_equal(id[t * k + j], rid[j]);
                assert_true(fabs(w[t * k + j] - rw[j]) <= 1e-6 * (1 + rw[j]));
            }
        }
        assert_int_equal(id[0], 0); /* all equal: ids in order */
        assert_int_equal(id[k], 1); /* two equal maxima: the lower first */
        z[5] = NAN;
        assert_int_equal(gang_moe_route(&cfg, z, tokens, id, w), GANG_EINVAL);
        free(z);
        free(w);
        free(id);
    }
    gang_moe_route_cfg bad = {.n_experts = 4, .top_k = 5};
    float zz[4] = {0};
    int32_t ii[5];
    float ww[5];
    assert_int_equal(gang_moe_route(&bad, zz, 1, ii, ww), GANG_EINVAL);
}

static void test_moe_plan(void **state)
{
    gang_moe_plan p;
    int32_t expert[] = {5, 1, 7, 1, 0, 6, 2, 5, 3, 3}; /* 5 tokens, top 2, 8 experts */
    size_t seen[10] = {0};

    (void)state;
    assert_int_equal(gang_moe_plan_init(&p, 8, 2, 3, 0, 5), GANG_EINVAL); /* 3 does not divide 8 */
    assert_int_equal(gang_moe_plan_init(&p, 8, 2, 4, 4, 5), GANG_EINVAL); /* rank >= ep */
    assert_int_equal(gang_moe_plan_init(&p, 8, 2, 4, 1, 5), 0);
    assert_int_equal(gang_moe_plan_build(&p, expert, 6), GANG_ERANGE);
    assert_int_equal(gang_moe_plan_build(&p, expert, 5), 0);
    assert_int_equal(p.slots, 10);
    /* experts 0-1 on rank 0, 2-3 on 1, 4-5 on 2, 6-7 on 3 */
    assert_int_equal(p.send_rows[0], 3);
    assert_int_equal(p.send_rows[1], 3);
    assert_int_equal(p.send_rows[2], 2);
    assert_int_equal(p.send_rows[3], 2);
    assert_int_equal(p.send_expert[1], 2);
    assert_int_equal(p.send_expert[4], 0);
    for (size_t i = 0; i < p.slots; i++) {
        seen[p.order[i]]++;
        if (i > 0) /* by expert, then by slot */
            assert_true(
                expert[p.order[i - 1]] < expert[p.order[i]] ||
                (expert[p.order[i - 1]] == expert[p.order[i]] && p.order[i - 1] < p.order[i]));
    }
    for (size_t s = 0; s < 10; s++)
        assert_int_equal(seen[s], 1);
    expert[3] = 8;
    assert_int_equal(gang_moe_plan_build(&p, expert, 5), GANG_EINVAL);
    gang_moe_plan_free(&p);
}

/* ---------------------------------------------------------------------------------
 * Expert parallelism over a socket communicator of threads.
 * --------------------------------------------------------------------------------- */
typedef struct ep_run {
    uint32_t n, n_experts, top_k;
    char blob[256];
    size_t blob_len;
    gang_comm_listener *listener;
    int rc[MOE_MAX_RANKS];
    char why[MOE_MAX_RANKS][160];
} ep_run;

typedef struct ep_rank {
    ep_run *run;
    uint32_t rank;
} ep_rank;

#define EP_WIDTH 6
#define EP_TOKENS 9

/* The token rows and router logits of rank r (the same on every run). */
static void ep_inputs(uint32_t r, uint32_t n_experts, float *x, float *z)
{
    uint32_t s = 1000 + r;

    for (size_t i = 0; i < EP_TOKENS * EP_WIDTH; i++)
        x[i] = (float)(lcg(&s) % 1000) / 250.0f - 2.0f;
    for (size_t i = 0; i < (size_t)EP_TOKENS * n_experts; i++)
        z[i] = (float)(lcg(&s) % 1000) / 100.0f;
    if (r == 1) /* rank 1 routes every token to expert 0 and 1's ranks: uneven loads */
        for (size_t t = 0; t < EP_TOKENS; t++)
            z[t * n_experts] = z[t * n_experts + 1] = 50.0f;
}

/* The expert: y = x * (e + 1) + e, elementwise. */
static void ep_expert(uint32_t e, float *row)
{
    for (size_t d = 0; d < EP_WIDTH; d++)
        row[d] = row[d] * (float)(e + 1) + (float)e;
}

static int ep_fail(ep_run *run, uint32_t r, int rc, const char *what)
{
    snprintf(run->why[r], sizeof(run->why[r]), "%s: %s", what, gang_strerror(rc));
    return rc != 0 ? rc : -1;
}

static int ep_body(ep_run *run, uint32_t r, gang_comm *c)
{
    uint32_t n = run->n, ne = run->n_experts, k = run->top_k, per = ne / n;
    gang_moe_route_cfg cfg = {.n_experts = ne, .top_k = k, .norm_topk = 1};
    float x[EP_TOKENS * EP_WIDTH], z[EP_TOKENS * 16], w[EP_TOKENS * 4];
    float y[EP_TOKENS * EP_WIDTH] = {0}, want[EP_TOKENS * EP_WIDTH] = {0};
    int32_t id[EP_TOKENS * 4];
    size_t cap = (size_t)EP_TOKENS * k * n;
    gang_moe_exchange xc = {.width = EP_WIDTH, .recv_cap_rows = cap};
    gang_moe_plan p;
    int rc;

    ep_inputs(r, ne, x, z);
    rc = gang_moe_route(&cfg, z, EP_TOKENS, id, w);
    if (rc != 0)
        return ep_fail(run, r, rc, "route");
    rc = gang_moe_plan_init(&p, ne, k, n, r, EP_TOKENS);
    if (rc != 0)
        return ep_fail(run, r, rc, "plan_init");
    xc.send = calloc(cap * EP_WIDTH, sizeof(float));
    xc.recv = calloc(cap * EP_WIDTH, sizeof(float));
    xc.cnt_out = calloc(ne, sizeof(size_t));
    xc.cnt_in = calloc(ne, sizeof(size_t));
    xc.a2a = calloc(4 * (size_t)n, sizeof(size_t));
    if (xc.send == NULL || xc.recv == NULL || xc.cnt_out == NULL || xc.cnt_in == NULL ||
        xc.a2a == NULL) {
        rc = ep_fail(run, r, GANG_ENOMEM, "alloc");
        goto out;
    }
    rc = gang_moe_plan_build(&p, id, EP_TOKENS);
    if (rc == 0)
        rc = gang_moe_dispatch(c, &p, x, &xc, MOE_TIMEOUT_MS);
    if (rc != 0) {
        rc = ep_fail(run, r, rc, "dispatch");
        goto out;
    }
    /* Each local expert runs over its rows: runs of cnt_in, source rank-major. */
    {
        size_t row = 0;

        for (uint32_t src = 0; src < n; src++)
            for (uint32_t i = 0; i < per; i++)
                for (size_t j = 0; j < xc.cnt_in[src * per + i]; j++)
                    ep_expert(r * per + i, xc.recv + (row++) * EP_WIDTH);
        if (row != xc.recv_rows) {
            rc = ep_fail(run, r, -1, "the counts do not cover the rows received");
            goto out;
        }
    }
    rc = gang_moe_combine(c, &p, w, &xc, y, MOE_TIMEOUT_MS);
    if (rc != 0) {
        rc = ep_fail(run, r, rc, "combine");
        goto out;
    }
    /* What this rank computes alone from the same routing. */
    for (size_t t = 0; t < EP_TOKENS; t++) {
        for (uint32_t j = 0; j < k; j++) {
            float row[EP_WIDTH];

            memcpy(row, x + t * EP_WIDTH, sizeof(row));
            ep_expert((uint32_t)id[t * k + j], row);
            for (size_t d = 0; d < EP_WIDTH; d++)
                want[t * EP_WIDTH + d] += w[t * k + j] * row[d];
        }
    }
    for (size_t i = 0; i < EP_TOKENS * EP_WIDTH; i++)
        if (fabsf(y[i] - want[i]) > 1e-5f * (1.0f + fabsf(want[i]))) {
            snprintf(run->why[r], sizeof(run->why[r]), "y[%zu] = %g, want %g", i, (double)y[i],
                     (double)want[i]);
            rc = -1;
            goto out;
        }
out:
    gang_moe_plan_free(&p);
    free(xc.send);
    free(xc.recv);
    free(xc.cnt_out);
    free(xc.cnt_in);
    free(xc.a2a);
    return rc;
}

static void *ep_thread(void *arg)
{
    ep_rank *er = arg;
    ep_run *run = er->run;
    gang_comm_config cfg = {.backend = GANG_COMM_SOCKET,
                            .rank = er->rank,
                            .world_size = run->n,
                            .blob = (const uint8_t *)run->blob,
                            .blob_len = run->blob_len,
                            .listener = er->rank == 0 ? run->listener : NULL,
                            .advertise_host = "127.0.0.1",
                            .timeout_ms = MOE_TIMEOUT_MS};
    gang_comm *c = NULL;
    int rc = gang_comm_init(&cfg, &c);

    run->rc[er->rank] = rc != 0 ? ep_fail(run, er->rank, rc, "init") : ep_body(run, er->rank, c);
    gang_comm_free(c);
    return NULL;
}

static void test_moe_expert_parallel(void **state)
{
    const uint32_t cases[][3] = {{1, 8, 2}, {2, 8, 2}, {4, 8, 2}, {3, 12, 4}, {4, 16, 4}};

    (void)state;
    for (size_t ci = 0; ci < sizeof(cases) / sizeof(cases[0]); ci++) {
        static ep_run run;
        ep_rank ranks[MOE_MAX_RANKS];
        pthread_t th[MOE_MAX_RANKS];

        memset(&run, 0, sizeof(run));
        run.n = cases[ci][0];
        run.n_experts = cases[ci][1];
        run.top_k = cases[ci][2];
        assert_int_equal(gang_comm_socket_listen("127.0.0.1", &run.listener, run.blob,
                                                 sizeof(run.blob), &run.blob_len),
                         0);
        for (uint32_t r = 0; r < run.n; r++) {
            ranks[r] = (ep_rank){&run, r};
            assert_int_equal(pthread_create(&th[r], NULL, ep_thread, &ranks[r]), 0);
        }
        for (uint32_t r = 0; r < run.n; r++)
            pthread_join(th[r], NULL);
        for (uint32_t r = 0; r < run.n; r++) {
            if (run.rc[r] != 0)
                fail_msg("ep %u, %u experts, top %u, rank %u: %s", (unsigned)run.n,
                         (unsigned)run.n_experts, (unsigned)run.top_k, (unsigned)r, run.why[r]);
        }
    }
}

int gang_test_moe(void);
int gang_test_moe(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_moe_route),
        cmocka_unit_test(test_moe_plan),
        cmocka_unit_test(test_moe_expert_parallel),
    };
    return cmocka_run_group_tests_name("parallel/moe", tests, NULL, NULL);
}
