/*
 * unit-fake-blocks: a GGUF file's blocks on the device path (issue #27), without a GPU. The
 * real SmolLM2-135M-Instruct Q4_1 file (GANG_TEST_GGUF, else the reference cache's; skip()
 * saying why when it is absent) loaded with --dtype auto and keep_layout (what a device
 * worker asks for), moved to the "fake" device by gang_model_to_device (mapped matrices
 * uploaded from the mapping, the mapping released), and run by the engine there; its
 * logits against the CPU backend's on the same file.
 *
 * Tolerance. The CPU reference is loaded the same way (keep_layout: the file's layout; the
 * CPU's repacked layout runs other kernels, whose own bounds unit-kernels-blocks checks),
 * so both sides compute every block product with the same CPU kernels on the same bytes
 * (the fake device runs them on its memory), x quantized per 32 elements to int8. What
 * may differ is the f32 summation order of the other operations between the host and the
 * device code paths (the decode step's attention, the fused projections' splits): about
 * 1e-6 relative per operation, which can move an element of x across an int8 rounding
 * boundary now and then (a change of max |x| of its block / 127 times |w| in one product).
 * The logits are held to 1e-3 x max(1, max |logit|) per element, room for a few such
 * flips (measured: 0, equal bit for bit; printed), and the greedy token must be the same.
 * The CPU's own repacked run is printed beside it, for information.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cmocka.h>

#include "engine-fixture.h"
#include "engine-internal.h"
#include "ganglion/model.h"

#define FB_DEFAULT "/var/cache/ganglion/smollm2-135m-instruct-q4_1.gguf"
#define FB_PROMPT 12
#define FB_TOL 1e-3

static const char *fb_file_or_skip(void)
{
    const char *p = getenv("GANG_TEST_GGUF");
    struct stat st;

    if (p == NULL || p[0] == '\0')
        p = FB_DEFAULT;
    if (stat(p, &st) != 0) {
        print_message("[  SKIP    ] %s is absent (scripts/fetch-reference.sh smollm2-gguf; or "
                      "set GANG_TEST_GGUF)\n",
                      p);
        return NULL;
    }
    return p;
}

static gang_model *fb_load(const char *path, int keep_layout)
{
    gang_model_config mc;
    gang_topology t;
    gang_load_options o = {.dtype = "auto", .quantize = "none", .keep_layout = keep_layout};
    gang_model *m = NULL;
    char err[512];

    assert_int_equal(gang_model_config_read(path, &mc, err, sizeof(err)), 0);
    if (gang_model_topology(&mc, 1, 1, 1, 1, &t, err, sizeof(err)) != 0)
        fail_msg("topology: %s", err);
    if (gang_model_load_ex(path, &t, 0, &o, &m, err, sizeof(err)) != 0)
        fail_msg("load %s: %s", path, err);
    assert_true(m->blocks);
    return m;
}

/* The logits [vocab] of the prompt's last token on a 1 x 1 engine of m on k. */
static float *fb_logits(gang_model *m, gang_kernels *k, size_t vocab)
{
    gang_engine_config cfg = {.max_batch = 1,
                              .max_ctx = 64,
                              .kv_cache_bytes = 64u << 20,
                              .microbatches = 1,
                              .max_step_tokens = 16};
    gang_engine *e = NULL;
    gang_gen_request r;
    script_req sr;
    const float *lg = NULL;
    float *out = malloc(vocab * sizeof(float));
    char err[256];

    assert_non_null(out);
    if (gang_engine_init_on(m, k, &cfg, &e, err, sizeof(err)) != 0)
        fail_msg("engine on %s: %s", gang_kernels_name(k), err);
    memset(&sr, 0, sizeof(sr));
    sr.id = 1;
    sr.n_prompt = FB_PROMPT;
    sr.max_tokens = 1;
    sr.sp = greedy;
    for (uint32_t i = 0; i < FB_PROMPT; i++)
        sr.prompt[i] = (int32_t)(100 + i * 997 % 20000);
    r = req_of(&sr);
    assert_int_equal(gang_engine_submit(e, &r, err, sizeof(err)), 0);
    for (int i = 0; i < 8 && lg == NULL; i++) {
        assert_int_equal(gang_engine_step(e, k, NULL, NULL, NULL, NULL, STEP_TIMEOUT_MS), 0);
        lg = gang__engine_logits(e, 0);
    }
    assert_non_null(lg);
    memcpy(out, lg, vocab * sizeof(float));
    gang_engine_free(e);
    return out;
}

static size_t fb_argmax(const float *v, size_t n)
{
    size_t best = 0;

    for (size_t i = 1; i < n; i++)
        if (v[i] > v[best])
            best = i;
    return best;
}

static void test_fake_blocks_logits(void **state)
{
    const char *path = fb_file_or_skip();
    gang_kernels *cpu = NULL, *fake = NULL;
    gang_model *mc, *mf;
    float *lc, *lf;
    size_t vocab, top;
    double worst = 0.0, scale = 1.0, lim;

    (void)state;
    if (path == NULL)
        skip();
    mc = fb_load(path, 1);
    mf = fb_load(path, 1);
    vocab = mc->cfg.vocab;
    assert_int_equal(gang_kernels_open("cpu", &cpu), 0);
    assert_int_equal(gang_kernels_open("fake", &fake), 0);
    assert_int_equal(gang_model_to_device(mf, fake), 0);
    assert_false(mf->repacked);
    assert_true(mf->mem == fake && mf->layers[0].mem == fake);
    assert_null(mf->wmap); /* every mapped matrix went up; the mapping is released */
    lc = fb_logits(mc, cpu, vocab);
    lf = fb_logits(mf, fake, vocab);
    {
        gang_model *mr = fb_load(path, 0);
        float *lr = fb_logits(mr, cpu, vocab);

        /* Where this CPU repacked them, the CPU's layout cannot go to a device. */
        if (mr->repacked)
            assert_int_equal(gang_model_to_device(mr, fake), GANG_EINVAL);
        double d = 0.0;

        for (size_t i = 0; i < vocab; i++)
            d = fmax(d, fabs((double)lr[i] - (double)lc[i]));
        print_message("cpu, own (repacked where it repacks) layout vs the file's: max |diff| "
                      "%.3g, argmax %zu vs %zu\n",
                      d, fb_argmax(lr, vocab), fb_argmax(lc, vocab));
        free(lr);
        gang_model_free(mr);
    }
    for (size_t i = 0; i < vocab; i++)
        scale = fmax(scale, fabs((double)lc[i]));
    lim = FB_TOL * scale;
    for (size_t i = 0; i < vocab; i++) {
        double d = fabs((double)lf[i] - (double)lc[i]);
        if (!(d <= lim))
            fail_msg("logit %zu: fake %.6g, cpu %.6g (|diff| %.3g > %.3g)", i, (double)lf[i],
                     (double)lc[i], d, lim);
        worst = fmax(worst, d);
    }
    top = fb_argmax(lc, vocab);
    print_message("fake vs cpu, %zu logits (max |logit| %.3g): max |diff| %.3g (bound %.3g); "
                  "argmax cpu %zu fake %zu\n",
                  vocab, scale, worst, lim, top, fb_argmax(lf, vocab));
    if (fb_argmax(lf, vocab) != top)
        fail_msg("greedy token: fake %zu, cpu %zu", fb_argmax(lf, vocab), top);
    free(lc), free(lf);
    gang_model_free(mf); /* releases its device arrays first */
    gang_model_free(mc);
    gang_kernels_close(fake);
    gang_kernels_close(cpu);
}

/* A model loaded for a device keeps the file's layout: its block matrices are the file's
 * bytes (gang_kernels_block_dequant reads them; the CPU's repacked copy would not be). */
static void test_keep_layout_is_file_bytes(void **state)
{
    const char *path = fb_file_or_skip();
    gang_model *m;
    const gang_tp_layer *l;
    float *a, *b;
    size_t hidden;

    (void)state;
    if (path == NULL)
        skip();
    m = fb_load(path, 1);
    l = &m->layers[0];
    hidden = l->hidden;
    assert_true(l->mixed && gang_kernels_wtype_block(l->mtype[0], NULL, NULL));
    a = malloc(hidden * sizeof(float));
    b = malloc(hidden * sizeof(float));
    assert_true(a != NULL && b != NULL);
    /* Row 0 of q_proj dequantized is a finite, not all-zero row of the model. */
    assert_int_equal(gang_kernels_block_dequant(l->mtype[0], l->wq, hidden, a), 0);
    double s = 0.0;
    for (size_t i = 0; i < hidden; i++) {
        assert_true(isfinite(a[i]));
        s += fabs((double)a[i]);
    }
    assert_true(s > 0.0);
    /* The embedding table's row 1 equals the f32 load's row 1 (the file's definition). */
    assert_int_equal(gang_kernels_block_dequant(m->wtype,
                                                (const char *)m->embed +
                                                    gang_kernels_weight_row_bytes(m->wtype, hidden),
                                                hidden, b),
                     0);
    {
        gang_model_config mc;
        gang_topology t;
        gang_load_options o = {.dtype = "f32"};
        gang_model *mf = NULL;
        char err[512];

        assert_int_equal(gang_model_config_read(path, &mc, err, sizeof(err)), 0);
        assert_int_equal(gang_model_topology(&mc, 1, 1, 1, 1, &t, err, sizeof(err)), 0);
        assert_int_equal(gang_model_load_ex(path, &t, 0, &o, &mf, err, sizeof(err)), 0);
        assert_memory_equal(b, (const float *)mf->embed + hidden, hidden * sizeof(float));
        gang_model_free(mf);
    }
    free(a), free(b);
    gang_model_free(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_keep_layout_is_file_bytes),
        cmocka_unit_test(test_fake_blocks_logits),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
