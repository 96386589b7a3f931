/*
 * The generation engine on the "cuda" kernels backend (CTest unit-engine-cuda): the small
 * random models of engine-fixture.c, moved to the GPU with gang_model_to_device, must
 * give the CPU backend's results:
 *
 *  - logits: the single-rank engine's logits of a 7-token prompt (prefilled in chunks of
 *    6 + 1, so the KV cache is read back) equal the CPU engine's within 1e-4 norm-wise
 *    relative (both sum in f32, in different orders: cuBLASLt vs OpenBLAS, the split-key
 *    attention vs the CPU's double softmax; observed differences are near 1e-6) and the
 *    naive double reference within the CPU test's own REL_TOL, for a Llama model with GQA
 *    and a Qwen2-like model with q/k/v biases (the bias-over-rows kernel);
 *  - tokens: the eight-request script of the CPU tests (continuous batching, chunked
 *    prefill, a stop token, greedy and seeded requests) gives exactly the reference's
 *    tokens for TP x PP in {1x1, 2x1, 1x2, 2x2} on ONE GPU: every rank is a thread with
 *    its own "cuda" handle on device 0 (pool 256 MiB), the communicators are the socket
 *    backend, so the TP all-reduces, the PP activation transfers and the logits
 *    all-gather all go through the host staging of gang_tp_stage_*.
 *
 * Without a GPU every case calls skip() after printing why (never a silent pass).
 */
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "engine-fixture.h"
#include "engine-internal.h"

#define GPU_CPU_TOL 1e-4

static int have_gpu;

#define NEED_GPU()                                                                                 \
    do {                                                                                           \
        if (!have_gpu) {                                                                           \
            print_message("[  SKIP    ] no GPU: gang_kernels_device_count() = %d; the engine "     \
                          "on \"cuda\" needs an NVIDIA GPU and driver\n",                          \
                          gang_kernels_device_count());                                            \
            skip();                                                                                \
        }                                                                                          \
    } while (0)

static int group_setup(void **state)
{
    (void)state;
    have_gpu = gang_kernels_device_count() > 0;
    if (!have_gpu)
        print_message("test-engine-cuda: no GPU visible; GPU cases will be skipped\n");
    return 0;
}

/* Steps e on k until plan sequence 0 samples; copies its logits into out [VOCAB]. */
static void logits_of(gang_engine *e, gang_kernels *k, float *out)
{
    const float *lg = NULL;
    int i;

    for (i = 0; i < 8 && lg == NULL; i++) {
        assert_int_equal(gang_engine_step(e, k, NULL, NULL, NULL, STEP_TIMEOUT_MS), 0);
        lg = gang__engine_logits(e, 0);
    }
    assert_non_null(lg);
    memcpy(out, lg, VOCAB * sizeof(float));
}

/* The logits of the 7-token prompt on a 1 x 1 engine of device (model moved there). */
static void engine_logits(const full_model *fm, const char *device, float *out)
{
    gang_engine_config cfg = engine_config(1);
    gang_kernels_options o;
    gang_kernels *k = NULL;
    gang_model *m = shard_new(fm, 1, 1, 0);
    gang_engine *e = NULL;
    gang_gen_request r;
    script_req sr;
    char err[256];
    uint32_t i;

    gang_kernels_options_init(&o);
    o.device = device;
    o.pool_mb = 256;
    assert_int_equal(gang_kernels_open_opts(&o, &k), 0);
    assert_int_equal(gang_model_to_device(m, k), 0);
    assert_true(gang_kernels_is_device(k) ? m->mem == k && m->layers[0].mem == k : m->mem == NULL);
    if (gang_engine_init_on(m, k, &cfg, &e, err, sizeof(err)) != 0)
        fail_msg("engine on %s: %s", device, err);
    memset(&sr, 0, sizeof(sr));
    sr.id = 1;
    sr.n_prompt = 7;
    sr.max_tokens = 1;
    sr.sp = greedy;
    for (i = 0; i < 7; i++)
        sr.prompt[i] = (int32_t)((i * 5 + 3) % VOCAB);
    r = req_of(&sr);
    assert_int_equal(gang_engine_submit(e, &r, err, sizeof(err)), 0);
    logits_of(e, k, out);
    gang_engine_free(e);
    gang_model_device_release(m);
    shard_free(m);
    gang_kernels_close(k);
}

static void test_cuda_logits_match_cpu(void **state)
{
    float cpu[VOCAB], gpu[VOCAB];
    double ref[VOCAB], e_cpu, e_ref;
    int32_t prompt[7];
    int with_bias;
    uint32_t i;

    (void)state;
    NEED_GPU();
    for (i = 0; i < 7; i++)
        prompt[i] = (int32_t)((i * 5 + 3) % VOCAB);
    for (with_bias = 0; with_bias < 2; with_bias++) {
        full_model *fm = full_model_new(7, with_bias);

        engine_logits(fm, "cpu", cpu);
        engine_logits(fm, "cuda", gpu);
        ref_logits(fm, prompt, 7, ref);
        e_cpu = rel_err_ff(gpu, cpu, VOCAB);
        e_ref = rel_err_fd(gpu, ref, VOCAB);
        print_message("bias=%d: cuda vs cpu %.3g, cuda vs reference %.3g\n", with_bias, e_cpu,
                      e_ref);
        if (!(e_cpu <= GPU_CPU_TOL) || !(e_ref <= REL_TOL))
            fail_msg("bias=%d: cuda logits differ: %g from the cpu engine, %g from the reference",
                     with_bias, e_cpu, e_ref);
        free(fm);
    }
}

/* Runs the script on a tp x pp gang of "cuda" ranks on device 0 and checks it. */
static void check_cuda_layout(const full_model *fm, script *sc, const script_out *exp, uint32_t tp,
                              uint32_t pp, uint32_t microbatches)
{
    static rank_ctx xs[MAX_RANKS];
    gang_engine_config cfg = engine_config(microbatches);
    char what[80];
    layout lo;
    uint32_t r;

    snprintf(what, sizeof(what), "cuda tp=%u pp=%u microbatches=%u", tp, pp, microbatches);
    layout_init_on(&lo, fm, tp, pp, &cfg, "cuda");
    run_gang_on(tp, pp, lo.engines, lo.kernels, sc, script_body, NULL, xs);
    for (r = 0; r < lo.n; r++)
        if (xs[r].body_rc != 0)
            fail_msg("%s: rank %u: %s", what, r, gang_err_name(xs[r].body_rc));
    check_script(sc, exp, what);
    layout_free(&lo);
}

static void test_cuda_layouts_match_reference(void **state)
{
    static const uint32_t lay[4][2] = {{1, 1}, {2, 1}, {1, 2}, {2, 2}};
    static script sc;
    static script_out exp[MAX_REQS];
    uint32_t i, mb;

    (void)state;
    NEED_GPU();
    for (int with_bias = 0; with_bias < 2; with_bias++) {
        full_model *fm = full_model_new(21, with_bias);

        make_script(fm, &sc);
        expected_outputs(fm, &sc, exp);
        for (i = 0; i < 4; i++)
            for (mb = 1; mb <= (lay[i][1] > 1 ? 2u : 1u); mb++)
                check_cuda_layout(fm, &sc, exp, lay[i][0], lay[i][1], mb);
        free(fm);
    }
}

/* A model not moved to the handle, or a step on another handle, is refused. */
static void test_cuda_memory_checks(void **state)
{
    gang_engine_config cfg = engine_config(1);
    gang_kernels_options o;
    gang_kernels *k = NULL, *k2 = NULL, *cpu = NULL;
    full_model *fm;
    gang_model *m;
    gang_engine *e = NULL;
    char err[256];

    (void)state;
    NEED_GPU();
    fm = full_model_new(3, 0);
    m = shard_new(fm, 1, 1, 0);
    gang_kernels_options_init(&o);
    o.device = "cuda";
    o.pool_mb = 128;
    assert_int_equal(gang_kernels_open_opts(&o, &k), 0);
    assert_int_equal(gang_kernels_open_opts(&o, &k2), 0);
    assert_int_equal(gang_kernels_open("cpu", &cpu), 0);
    assert_int_equal(gang_engine_init_on(m, k, &cfg, &e, err, sizeof(err)), GANG_EINVAL);
    assert_int_equal(gang_model_to_device(m, k), 0);
    assert_int_equal(gang_model_to_device(m, k2), GANG_EINVAL);
    assert_int_equal(gang_engine_init(m, &cfg, &e, err, sizeof(err)), GANG_EINVAL);
    assert_int_equal(gang_engine_init_on(m, k, &cfg, &e, err, sizeof(err)), 0);
    assert_int_equal(gang_engine_step(e, k2, NULL, NULL, NULL, STEP_TIMEOUT_MS), GANG_EINVAL);
    assert_int_equal(gang_engine_step(e, cpu, NULL, NULL, NULL, STEP_TIMEOUT_MS), GANG_EINVAL);
    assert_int_equal(gang_engine_step(e, k, NULL, NULL, NULL, STEP_TIMEOUT_MS), 0);
    gang_engine_free(e);
    gang_model_device_release(m);
    assert_null(m->embed);
    assert_null(m->layers[0].wq);
    shard_free(m);
    gang_kernels_close(cpu);
    gang_kernels_close(k2);
    gang_kernels_close(k);
    free(fm);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cuda_logits_match_cpu),
        cmocka_unit_test(test_cuda_layouts_match_reference),
        cmocka_unit_test(test_cuda_memory_checks),
    };

    return cmocka_run_group_tests(tests, group_setup, NULL);
}
