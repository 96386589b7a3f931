/*
 * The host/device boundary without a GPU (CTest unit-fake-device): the "fake" kernels
 * device (kernels/fake/) keeps its tensors in memory the host cannot read and aborts when
 * a host pointer reaches one of its operations, and fake-comm.c is a device-memory
 * communicator on it, as nccl is on "cuda". With them:
 *
 *  - the fake device itself: a device pointer dereferenced on the host faults, a host
 *    pointer in a device operation aborts, upload and download round-trip (both checked
 *    in child processes, so the test sees the crash the device promises);
 *  - the attention batch entry on a backend without one (the front's per-sequence loop);
 *  - the engine, TP layers and pipeline on "fake" ranks over the socket backend (every
 *    TP all-reduce, PP transfer and the logits all-gather staged through host memory):
 *    the eight-request script of the CPU tests gives the reference's tokens on 1x1, 2x1,
 *    1x2 and 2x2;
 *  - the engine with its TP group on the fake device communicator (the serving path of
 *    `serve --device cuda --backend nccl`): the same tokens, and the count of host
 *    synchronisations between each row-parallel GEMM and its all-reduce is zero, every
 *    collective being ordered on the device (gang_comm_order_after); the same run with a
 *    communicator that has no device ordering counts exactly one host synchronisation per
 *    all-reduce, which is what the counter would see if the ordering regressed; the
 *    collectives' completion is awaited once per step (gang_comm_settle);
 *  - the decode step of issue #24: its counters at batch 1, 8, 32 (<= 1 host sync,
 *    launches independent of the batch, no allocation, O(batch) bytes), the device sampler
 *    against the engine's, the step attention against row stores + paged attention.
 */
#include <math.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "engine-fixture.h"
#include "engine-internal.h"
#include "fake-comm.h"
#include "fake/fake-device.h"

/* Runs fn in a child process; returns the signal that ended it, 0 for a normal exit. */
static int child_signal(void (*fn)(gang_kernels *k, void *p), gang_kernels *k, void *p)
{
    int status = 0;
    pid_t pid;

    fflush(NULL);
    pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        /* cmocka catches these to report a crashing test; the child must die of them. */
        signal(SIGSEGV, SIG_DFL);
        signal(SIGABRT, SIG_DFL);
        fn(k, p);
        _exit(0);
    }
    assert_int_equal(waitpid(pid, &status, 0), pid);
    return WIFSIGNALED(status) ? WTERMSIG(status) : 0;
}

static void read_on_host(gang_kernels *k, void *p)
{
    (void)k;
    printf("read %f\n", (double)*(volatile float *)p);
}

static void host_pointer_in_op(gang_kernels *k, void *p)
{
    float host[4] = {1, 2, 3, 4};

    gang_kernels_add(k, host, p, 4); /* x is a host array: the device must refuse it */
}

static void test_fake_memory_boundary(void **state)
{
    float in[64], out[64];
    gang__fake_stats st0, st1;
    gang_kernels *k = NULL;
    void *d = NULL;

    (void)state;
    for (int i = 0; i < 64; i++)
        in[i] = (float)i * 0.5f;
    assert_int_equal(gang_kernels_open("fake", &k), 0);
    assert_true(gang_kernels_caps(k) & GANG_KERNELS_CAP_DEVICE_MEM);
    assert_non_null(gang_kernels_device_stream(k));
    assert_int_equal(gang_kernels_alloc(k, sizeof(in), &d), 0);
    assert_true(gang__fake_is_device(d));
    assert_false(gang__fake_is_device(in));
    assert_int_equal(gang__fake_stats_get(k, &st0), 0);
    assert_int_equal(gang_kernels_upload(k, d, in, sizeof(in)), 0);
    assert_int_equal(gang_kernels_add(k, d, d, 64), 0); /* doubling, on the device */
    assert_int_equal(gang_kernels_download(k, out, d, sizeof(out)), 0);
    for (int i = 0; i < 64; i++)
        assert_true(out[i] == 2.0f * in[i]);
    assert_int_equal(gang__fake_stats_get(k, &st1), 0);
    assert_int_equal(st1.host_waits - st0.host_waits, 2); /* the upload and the download */
    assert_int_equal(child_signal(read_on_host, k, d), SIGSEGV);
    assert_int_equal(child_signal(host_pointer_in_op, k, d), SIGABRT);
    gang_kernels_free(k, d);
    gang_kernels_close(k);
}

/* ---------------------------------------------------------------------------------
 * The engine on fake ranks over the socket backend (host staging everywhere).
 * --------------------------------------------------------------------------------- */
/* A device tensor holding n floats of src. */
static float *dev_copy(gang_kernels *k, const float *src, size_t n)
{
    void *d = NULL;

    assert_int_equal(gang_kernels_alloc(k, n * sizeof(float), &d), 0);
    assert_int_equal(gang_kernels_upload(k, d, src, n * sizeof(float)), 0);
    return d;
}

/*
 * gang_kernels_attention_batch on a backend without a batch entry (the fake device, as
 * CUDA): the front runs the per-sequence calls, so two sequences on device memory give
 * exactly their own calls' results, and a bad descriptor is refused before either runs.
 */
static void test_fake_attention_batch_fallback(void **state)
{
    const size_t nh = 4, nkv = 2, hd = 8, tq[2] = {1, 4}, pos0[2] = {9, 3};
    gang_kernels_attn_seq seq[2];
    float host[2][256], want[2][4 * 32], got[2][4 * 32];
    void *dq[2], *dk[2], *dv[2], *dout[2];
    gang_kernels *k = NULL;

    (void)state;
    assert_int_equal(gang_kernels_open("fake", &k), 0);
    for (size_t i = 0; i < 2; i++) {
        size_t tk = pos0[i] + tq[i], qn = tq[i] * nh * hd, kn = tk * nkv * hd;

        for (size_t e = 0; e < 256; e++)
            host[i][e] = (float)((e * 37 + i * 11) % 19) / 9.0f - 1.0f;
        dq[i] = dev_copy(k, host[i], qn);
        dk[i] = dev_copy(k, host[i] + 40, kn);
        dv[i] = dev_copy(k, host[i] + 7, kn);
        assert_int_equal(gang_kernels_alloc(k, qn * sizeof(float), &dout[i]), 0);
        seq[i] = (gang_kernels_attn_seq){.q = dq[i],
                                         .out = dout[i],
                                         .kc = dk[i],
                                         .vc = dv[i],
                                         .tq = tq[i],
                                         .tk = tk,
                                         .pos0 = pos0[i]};
        assert_int_equal(gang_kernels_attention(k, dq[i], dk[i], dv[i], tq[i], tk, nh, nkv, hd,
                                                pos0[i], dout[i]),
                         0);
        assert_int_equal(gang_kernels_download(k, want[i], dout[i], qn * sizeof(float)), 0);
        assert_int_equal(gang_kernels_upload(k, dout[i], host[i], qn * sizeof(float)), 0);
    }
    seq[1].tq = 9; /* past its cache: the first sequence must not run either */
    assert_int_equal(gang_kernels_attention_batch(k, seq, 2, nh, nkv, hd, 0), GANG_EINVAL);
    assert_int_equal(gang_kernels_download(k, got[0], dout[0], nh * hd * sizeof(float)), 0);
    assert_memory_equal(got[0], host[0], nh * hd * sizeof(float));
    seq[1].tq = tq[1];
    assert_int_equal(gang_kernels_attention_batch(k, seq, 2, nh, nkv, hd, 0), 0);
    for (size_t i = 0; i < 2; i++) {
        assert_int_equal(gang_kernels_download(k, got[i], dout[i], tq[i] * nh * hd * sizeof(float)),
                         0);
        assert_memory_equal(got[i], want[i], tq[i] * nh * hd * sizeof(float));
        gang_kernels_free(k, dq[i]), gang_kernels_free(k, dk[i]);
        gang_kernels_free(k, dv[i]), gang_kernels_free(k, dout[i]);
    }
    gang_kernels_close(k);
}

static void test_fake_engine_layouts(void **state)
{
    static const uint32_t lay[4][2] = {{1, 1}, {2, 1}, {1, 2}, {2, 2}};
    static rank_ctx xs[MAX_RANKS];
    static script sc;
    static script_out exp[MAX_REQS];
    gang_engine_config cfg = engine_config(1);
    full_model *fm = full_model_new(21, 1);
    char what[64];
    layout lo;

    (void)state;
    make_script(fm, &sc);
    expected_outputs(fm, &sc, exp);
    for (int i = 0; i < 4; i++) {
        snprintf(what, sizeof(what), "fake tp=%u pp=%u (socket)", lay[i][0], lay[i][1]);
        layout_init_on(&lo, fm, lay[i][0], lay[i][1], &cfg, "fake");
        run_gang_on(lay[i][0], lay[i][1], lo.engines, lo.kernels, &sc, script_body, NULL, xs);
        for (uint32_t r = 0; r < lo.n; r++)
            if (xs[r].body_rc != 0)
                fail_msg("%s: rank %u: %s", what, r, gang_err_name(xs[r].body_rc));
        check_script(&sc, exp, what);
        layout_free(&lo);
    }
    free(fm);
}

/* ---------------------------------------------------------------------------------
 * The engine with its TP group on the fake device communicator.
 * --------------------------------------------------------------------------------- */
static gang_comm *fake_tp[MAX_RANKS]; /* each rank's TP communicator of the current run */

/* script_body with the rank's fake TP communicator instead of the socket one. */
static int fake_tp_body(rank_ctx *x, gang_comm *world, gang_comm *tp, gang_comm *pp)
{
    (void)tp;
    return script_body(x, world, fake_tp[x->rank], pp);
}

/* Runs the script on tp x pp fake ranks whose TP groups are fake communicators; returns
 * the counts summed over the ranks and checks the tokens. */
static fake_comm_counts run_fake_tp(const full_model *fm, script *sc, const script_out *exp,
                                    uint32_t tp, uint32_t pp, int with_order)
{
    static rank_ctx xs[MAX_RANKS];
    gang_engine_config cfg = engine_config(pp > 1 ? 2 : 1);
    fake_group *groups[MAX_RANKS] = {0};
    fake_comm_counts sum = {0};
    char what[96];
    layout lo;

    snprintf(what, sizeof(what), "fake tp=%u pp=%u (fake tp comm, ordering %s)", tp, pp,
             with_order ? "on the device" : "by host sync");
    layout_init_on(&lo, fm, tp, pp, &cfg, "fake");
    for (uint32_t s = 0; s < pp; s++)
        assert_non_null(groups[s] = fake_group_new(tp));
    for (uint32_t r = 0; r < lo.n; r++)
        assert_non_null(fake_tp[r] =
                            fake_comm_new(groups[r / tp], r % tp, lo.kernels[r], with_order));
    run_gang_on(tp, pp, lo.engines, lo.kernels, sc, fake_tp_body, NULL, xs);
    for (uint32_t r = 0; r < lo.n; r++) {
        fake_comm_counts c = fake_comm_counts_of(fake_tp[r]);
        uint32_t layers = lo.models[r]->layer_count;

        if (xs[r].body_rc != 0)
            fail_msg("%s: rank %u: %s", what, r, gang_err_name(xs[r].body_rc));
        print_message("%s rank %u: %llu all-reduces (%u layers), %llu all-gathers, %llu "
                      "ordered on the device, %llu host waits between a GEMM and its "
                      "all-reduce, %llu unordered\n",
                      what, r, (unsigned long long)c.all_reduces, layers,
                      (unsigned long long)c.all_gathers, (unsigned long long)c.ordered,
                      (unsigned long long)c.waits_between, (unsigned long long)c.unordered);
        /* Two row-parallel linears per layer (o_proj, down), each one all-reduce. */
        assert_true(c.all_reduces > 0);
        assert_int_equal(c.all_reduces % (2 * layers), 0);
        sum.all_reduces += c.all_reduces;
        sum.all_gathers += c.all_gathers;
        sum.ordered += c.ordered;
        sum.waits_between += c.waits_between;
        sum.unordered += c.unordered;
        sum.settles += c.settles;
        gang_comm_free(fake_tp[r]);
        fake_tp[r] = NULL;
    }
    check_script(sc, exp, what);
    for (uint32_t s = 0; s < pp; s++)
        fake_group_free(groups[s]);
    layout_free(&lo);
    return sum;
}

static void test_fake_tp_no_host_sync(void **state)
{
    static const uint32_t lay[2][2] = {{2, 1}, {2, 2}};
    static script sc;
    static script_out exp[MAX_REQS];
    full_model *fm = full_model_new(21, 0);

    (void)state;
    make_script(fm, &sc);
    expected_outputs(fm, &sc, exp);
    for (int i = 0; i < 2; i++) {
        fake_comm_counts on = run_fake_tp(fm, &sc, exp, lay[i][0], lay[i][1], 1);
        fake_comm_counts off = run_fake_tp(fm, &sc, exp, lay[i][0], lay[i][1], 0);

        /* Device ordering: no host wait between a GEMM and its all-reduce, none unordered. */
        assert_int_equal(on.waits_between, 0);
        assert_int_equal(on.unordered, 0);
        assert_int_equal(on.ordered, on.all_reduces + on.all_gathers);
        assert_true(on.all_gathers > 0); /* the logits, last stage */
        /* Their completion awaited once per step (gang_comm_settle), not per collective:
         * at most one per step and microbatch (a pipeline's last stage settles before it
         * sends its ids on) and one per step, against 2 x layers all-reduces a step. */
        assert_true(on.settles > 0);
        assert_true(on.settles * 4 <= on.all_reduces);
        assert_int_equal(off.settles, 0);
        /* The control: without it, exactly one host synchronisation per all-reduce. */
        assert_int_equal(off.all_reduces, on.all_reduces);
        assert_int_equal(off.waits_between, off.all_reduces);
        assert_int_equal(off.ordered, 0);
        assert_int_equal(off.unordered, 0);
    }
    free(fm);
}

/* ---------------------------------------------------------------------------------
 * The decode step's counters (issue #24): what `bench decode --device fake` prints.
 * --------------------------------------------------------------------------------- */
#define CNT_PROMPT 4
#define CNT_GEN 12
#define CNT_STEPS 8 /* decode steps measured, after the prefill and the first decode */

/* A decode step's kernels counters, averaged over CNT_STEPS steps. */
typedef struct step_cnt {
    double syncs, launches, allocs, h2d, d2h;
} step_cnt;

/*
 * Runs `batch` requests (even ones greedy, odd ones seeded with top-p) on a 1x1 fake
 * engine, with logprobs when lp, and measures the steady decode steps. Each request's
 * tokens go to toks[i * CNT_GEN ..].
 */
static step_cnt decode_counters(const full_model *fm, uint32_t batch, int lp, int graphs,
                                int32_t *toks)
{
    gang_engine_config cfg = {.max_batch = batch,
                              .max_ctx = 40,
                              .kv_cache_bytes = 64u << 20,
                              .microbatches = 1,
                              .max_step_tokens = batch * CNT_PROMPT,
                              .cuda_graphs = (uint32_t)graphs};
    gang_kernels_counters c0, c1;
    int32_t prompt[CNT_PROMPT];
    gang_gen_request r;
    gang_gen_event ev;
    step_cnt out;
    char err[256];
    layout lo;

    layout_init_on(&lo, fm, 1, 1, &cfg, "fake");
    for (uint32_t i = 0; i < batch; i++) {
        memset(&r, 0, sizeof(r));
        for (uint32_t j = 0; j < CNT_PROMPT; j++)
            prompt[j] = (int32_t)((i * 5 + j * 3 + 1) % VOCAB);
        r.id = i + 1;
        r.prompt = prompt;
        r.n_prompt = CNT_PROMPT;
        r.max_tokens = CNT_GEN;
        r.sampling =
            i % 2 ? (gang_sampling){.temperature = 0.8f, .top_p = 0.9f, .seed = 7 + i} : greedy;
        r.sampling.ignore_eos = 1;
        r.sampling.logprobs = (uint32_t)lp;
        r.sampling.top_logprobs = lp ? 3 : 0;
        assert_int_equal(gang_engine_submit(lo.engines[0], &r, err, sizeof(err)), 0);
    }
    for (uint32_t s = 0; s < 2 + CNT_STEPS; s++) {
        if (s == 2)
            assert_int_equal(gang_kernels_counters_get(lo.kernels[0], &c0), 0);
        assert_int_equal(
            gang_engine_step(lo.engines[0], lo.kernels[0], NULL, NULL, NULL, NULL, STEP_TIMEOUT_MS),
            0);
        while (gang_engine_poll(lo.engines[0], &ev) == 1)
            if (ev.kind == GANG_GEN_TOKEN && ev.index < CNT_GEN)
                toks[(ev.id - 1) * CNT_GEN + ev.index] = ev.token;
    }
    assert_int_equal(gang_kernels_counters_get(lo.kernels[0], &c1), 0);
    out = (step_cnt){(double)(c1.host_syncs - c0.host_syncs) / CNT_STEPS,
                     (double)(c1.launches - c0.launches) / CNT_STEPS,
                     (double)(c1.allocs - c0.allocs) / CNT_STEPS,
                     (double)(c1.h2d_bytes - c0.h2d_bytes) / CNT_STEPS,
                     (double)(c1.d2h_bytes - c0.d2h_bytes) / CNT_STEPS};
    print_message("fake decode step, batch %u%s: %.2f host syncs, %.2f launches, %.2f allocs, "
                  "%.1f B up, %.1f B down\n",
                  batch, lp ? " (logprobs)" : "", out.syncs, out.launches, out.allocs, out.h2d,
                  out.d2h);
    layout_free(&lo);
    return out;
}

/*
 * The design of the decode step, held on the fake device: at most one host sync per
 * step, launches that do not depend on the batch, no allocation, O(batch) bytes each way
 * (never a row of logits unless logprobs were asked for), and the tokens of the device
 * sampler equal to the host sampler's (the logprobs run samples on the host).
 */
static void test_fake_decode_counters(void **state)
{
    static const uint32_t batches[3] = {1, 8, 32};
    static int32_t dev[32 * CNT_GEN], host[32 * CNT_GEN];
    full_model *fm = full_model_new(33, 0);
    step_cnt c[3], lp;

    (void)state;
    for (int i = 0; i < 3; i++) {
        uint32_t b = batches[i];

        c[i] = decode_counters(fm, b, 0, 0, dev);
        assert_true(c[i].syncs <= 1.0);
        assert_true(c[i].allocs == 0.0);
        assert_true(c[i].launches == c[0].launches);
        /* ids, positions, table offset and entry, sampling parameters: 52 B a sequence */
        assert_true(c[i].h2d <= 64.0 * b);
        assert_true(c[i].d2h <= 4.0 * b); /* the sampled ids */
        assert_true(c[i].d2h < (double)VOCAB * sizeof(float) * b);
    }
    /* Logprobs: the rows come down (O(vocab x batch) is allowed then), still one wait. */
    lp = decode_counters(fm, 8, 1, 0, host);
    assert_true(lp.syncs <= 1.0);
    assert_true(lp.allocs == 0.0);
    assert_true(lp.d2h >= (double)VOCAB * sizeof(float) * 8);
    decode_counters(fm, 8, 0, 0, dev);
    assert_memory_equal(dev, host, 8 * CNT_GEN * sizeof(int32_t));
    /* --cuda-graphs on a device without graphs (the fake): the same step, run directly. */
    assert_true(decode_counters(fm, 8, 0, 1, host).launches == c[0].launches);
    assert_memory_equal(dev, host, 8 * CNT_GEN * sizeof(int32_t));
    free(fm);
}

/*
 * gang_kernels_sample on the fake device (the CPU's walk) against the engine's sampler on
 * random rows: greedy, top-k, top-p, NaN and tied logits, the same token every time.
 */
static void test_fake_sample_equals_engine(void **state)
{
    enum { ROWS = 64, COLS = 301 };
    static float x[ROWS * COLS];
    gang_kernels_sample_param p[ROWS];
    int32_t got[ROWS];
    void *dx = NULL, *dp = NULL, *dout = NULL;
    gang__sampler smp;
    gang_kernels *k = NULL;
    uint64_t z = 12345;

    (void)state;
    assert_int_equal(gang__sampler_init(&smp, COLS), 0);
    for (size_t i = 0; i < ROWS * COLS; i++) {
        z = z * 6364136223846793005ull + 1442695040888963407ull;
        x[i] = (float)((z >> 40) % 2000) / 250.0f - 4.0f; /* coarse: many ties */
        if ((z >> 20) % 97 == 0)
            x[i] = NAN;
    }
    for (uint32_t r = 0; r < ROWS; r++)
        p[r] = (gang_kernels_sample_param){.temperature = r % 4 == 0 ? 0.0f : 0.3f + 0.1f * (r % 9),
                                           .top_k = r % 3 == 0 ? 0 : r % 17,
                                           .top_p = r % 5 == 0 ? 1.0f : 0.5f + 0.05f * (r % 7),
                                           .seed = 1000 + r,
                                           .position = 3 * r + 1};
    assert_int_equal(gang_kernels_open("fake", &k), 0);
    assert_int_equal(gang_kernels_graph_begin(k), GANG_ENOSYS); /* the fake has no graphs */
    assert_int_equal(gang_kernels_alloc(k, sizeof(x), &dx), 0);
    assert_int_equal(gang_kernels_alloc(k, sizeof(p), &dp), 0);
    assert_int_equal(gang_kernels_alloc(k, sizeof(got), &dout), 0);
    assert_int_equal(gang_kernels_upload(k, dx, x, sizeof(x)), 0);
    assert_int_equal(gang_kernels_upload_async(k, dp, p, sizeof(p)), 0);
    assert_int_equal(gang_kernels_sample(k, dx, ROWS, COLS, dp, dout), 0);
    assert_int_equal(gang_kernels_download(k, got, dout, sizeof(got)), 0);
    for (uint32_t r = 0; r < ROWS; r++) {
        gang_sampling sp = {.temperature = p[r].temperature,
                            .top_k = p[r].top_k,
                            .top_p = p[r].top_p,
                            .seed = p[r].seed};
        int32_t want = gang__sample(&smp, x + (size_t)r * COLS, &sp, p[r].position);

        if (got[r] != want)
            fail_msg("row %u: the device sampler drew %d, the engine's %d", r, got[r], want);
        assert_true(gang_kernels_uniform(p[r].seed, p[r].position) ==
                    gang__sample_uniform(p[r].seed, p[r].position));
    }
    gang_kernels_free(k, dx), gang_kernels_free(k, dp), gang_kernels_free(k, dout);
    gang_kernels_close(k);
    gang__sampler_free(&smp);
}

/*
 * gang_kernels_attention_step on the fake device (the CPU's kernels) against what it
 * stands for: each token's K/V rows stored (rounded to the bf16 pool) and
 * gang_kernels_attention_paged per sequence, bit for bit; three sequences, one of them a
 * prefill chunk. A block id outside the pool is refused before anything is written.
 */
static void test_fake_attention_step(void **state)
{
    /* A decode at 5 (table row 0: blocks 7, 3), a prefill chunk at 2..4 (row 4: blocks
     * 1, 5), a decode at 9 (row 8: blocks 2, 9, 11). */
    enum { TOK = 5, NH = 4, NKV = 2, HD = 8, BS = 4, NB = 12, MAXB = 4, W = NKV * HD };
    const int32_t pos[TOK] = {5, 2, 3, 4, 9}, rows[TOK] = {0, 4, 4, 4, 8};
    int32_t tables[3 * MAXB] = {7, 3, 0, 0, 1, 5, 0, 0, 2, 9, 11, 0}, meta[2 * TOK];
    float q[TOK * NH * HD], kn[TOK * W], vn[TOK * W], want[TOK * NH * HD], got[TOK * NH * HD];
    uint16_t pool_k[NB * BS * W], pool_v[NB * BS * W], back[NB * BS * W];
    void *dq, *dk, *dv, *dkc, *dvc, *dkc2, *dvc2, *dtab, *dmeta, *dout;
    gang_kernels_step_kv kv;
    gang_kernels *k = NULL;

    (void)state;
    for (size_t i = 0; i < sizeof(q) / 4; i++)
        q[i] = (float)((i * 29) % 17) / 8.0f - 1.0f;
    for (size_t i = 0; i < sizeof(kn) / 4; i++)
        kn[i] = (float)((i * 13) % 11) / 5.0f - 1.0f, vn[i] = (float)((i * 7) % 19) / 9.0f - 1.0f;
    for (size_t i = 0; i < NB * BS * W; i++)
        pool_k[i] = gang_f32_to_bf16((float)((i * 31) % 23) / 11.0f - 1.0f),
        pool_v[i] = gang_f32_to_bf16((float)((i * 17) % 13) / 6.0f - 1.0f);
    memcpy(meta, pos, sizeof(pos));
    memcpy(meta + TOK, rows, sizeof(rows));
    assert_int_equal(gang_kernels_open("fake", &k), 0);
    dq = dev_copy(k, q, sizeof(q) / 4);
    dk = dev_copy(k, kn, sizeof(kn) / 4), dv = dev_copy(k, vn, sizeof(vn) / 4);
    dkc = dev_copy(k, (const float *)(const void *)pool_k, sizeof(pool_k) / 4);
    dvc = dev_copy(k, (const float *)(const void *)pool_v, sizeof(pool_v) / 4);
    dkc2 = dev_copy(k, (const float *)(const void *)pool_k, sizeof(pool_k) / 4);
    dvc2 = dev_copy(k, (const float *)(const void *)pool_v, sizeof(pool_v) / 4);
    dtab = dev_copy(k, (const float *)(const void *)tables, sizeof(tables) / 4);
    dmeta = dev_copy(k, (const float *)(const void *)meta, sizeof(meta) / 4);
    assert_int_equal(gang_kernels_alloc(k, sizeof(want), &dout), 0);
    kv = (gang_kernels_step_kv){
        dkc, dvc, dtab, dmeta, (int32_t *)dmeta + TOK, BS, NB, GANG_DTYPE_BF16, 0};
    assert_int_equal(gang_kernels_attention_step(k, &kv, dk, dv, dq, TOK, NH, NKV, HD, 0, dout), 0);
    assert_int_equal(gang_kernels_download(k, got, dout, sizeof(got)), 0);
    /* The reference: rows stored one by one, then one paged call per run of tokens. */
    for (int t = 0; t < TOK; t++) {
        int32_t p = meta[t], blk = tables[meta[TOK + t] + p / BS];
        size_t row = ((size_t)blk * BS + (size_t)(p % BS)) * W * 2;

        assert_int_equal(gang_kernels_convert(k, GANG_DTYPE_F32, (float *)dk + t * W,
                                              GANG_DTYPE_BF16, (char *)dkc2 + row, W),
                         0);
        assert_int_equal(gang_kernels_convert(k, GANG_DTYPE_F32, (float *)dv + t * W,
                                              GANG_DTYPE_BF16, (char *)dvc2 + row, W),
                         0);
    }
    for (int t0 = 0, t; t0 < TOK; t0 = t) {
        gang_kernels_kv_pages pg = {(int32_t *)dtab + meta[TOK + t0], BS, NB, GANG_DTYPE_BF16};

        for (t = t0 + 1; t < TOK && meta[TOK + t] == meta[TOK + t0] && meta[t] == meta[t - 1] + 1;
             t++)
            ;
        assert_int_equal(
            gang_kernels_attention_paged(k, (float *)dq + t0 * NH * HD, dkc2, dvc2, &pg,
                                         (size_t)(t - t0), (size_t)meta[t - 1] + 1, NH, NKV, HD,
                                         (size_t)meta[t0], 0, (float *)dout + t0 * NH * HD),
            0);
    }
    assert_int_equal(gang_kernels_download(k, want, dout, sizeof(want)), 0);
    assert_memory_equal(got, want, sizeof(got));
    /* A block id past the pool: refused, nothing stored. */
    tables[1] = NB; /* the block of position 5 of the first sequence */
    assert_int_equal(gang_kernels_upload(k, dtab, tables, sizeof(tables)), 0);
    assert_int_equal(gang_kernels_upload(k, dkc, pool_k, sizeof(pool_k)), 0);
    assert_int_equal(gang_kernels_attention_step(k, &kv, dk, dv, dq, TOK, NH, NKV, HD, 0, dout),
                     GANG_EINVAL);
    assert_int_equal(gang_kernels_download(k, back, dkc, sizeof(back)), 0);
    assert_memory_equal(back, pool_k, sizeof(pool_k));
    gang_kernels_free(k, dq), gang_kernels_free(k, dk), gang_kernels_free(k, dv);
    gang_kernels_free(k, dkc), gang_kernels_free(k, dvc), gang_kernels_free(k, dkc2);
    gang_kernels_free(k, dvc2), gang_kernels_free(k, dtab), gang_kernels_free(k, dmeta);
    gang_kernels_free(k, dout);
    gang_kernels_close(k);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fake_memory_boundary),
        cmocka_unit_test(test_fake_attention_batch_fallback),
        cmocka_unit_test(test_fake_engine_layouts),
        cmocka_unit_test(test_fake_tp_no_host_sync),
        cmocka_unit_test(test_fake_decode_counters),
        cmocka_unit_test(test_fake_sample_equals_engine),
        cmocka_unit_test(test_fake_attention_step),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
