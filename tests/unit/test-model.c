/*
 * Tests of the model I/O (model/config.c, safetensors.c, load.c, mkmodel.c): config.json
 * accepted and refused field by field; mkmodel byte-identical for the same options;
 * every (tp, pp) of {1, 2, 4} x {1, 2} loads exactly the slices of the full tensors
 * (against the raw file bytes and against gang_tp_layer_init); F16/BF16 models load the
 * exact conversion of the stored bits; a sharded model loads like the single file; each
 * corrupted fixture is refused with GANG_EMODEL and a message naming file and problem;
 * and, in forked children, the peak resident memory of one rank's load tracks its shard.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "fixtures.h"
#include "ganglion/model.h"

static void assert_floats_equal(const float *a, const float *b, size_t n)
{
    assert_non_null(a);
    assert_non_null(b);
    assert_memory_equal(a, b, n * sizeof(float));
}

/* ---------------------------------------------------------------------------------
 * config.json
 * --------------------------------------------------------------------------------- */

static void write_config(const char *dir, const char *text)
{
    char path[4096];

    fx_path(path, sizeof(path), dir, "config.json");
    fx_write(path, text, strlen(text));
}

static void test_config_good(void **state)
{
    char *dir = fx_tmpdir(), err[ERRLEN];
    gang_model_config c;
    (void)state;

    write_config(dir, "{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 128,"
                      "\"intermediate_size\": 344, \"num_attention_heads\": 8,"
                      "\"num_hidden_layers\": 4, \"vocab_size\": 1000, \"head_dim\": 16,"
                      "\"max_position_embeddings\": 2048, \"rms_norm_eps\": 1e-5,"
                      "\"bos_token_id\": 1, \"eos_token_id\": [7, 2], \"rope_scaling\": null,"
                      "\"torch_dtype\": \"bfloat16\", \"num_key_value_heads\": null}");
    assert_int_equal(gang_model_config_read(dir, &c, err, sizeof(err)), 0);
    assert_int_equal(c.arch, GANG_ARCH_LLAMA);
    assert_int_equal(c.hidden, 128);
    assert_int_equal(c.ffn, 344);
    assert_int_equal(c.n_heads, 8);
    assert_int_equal(c.n_kv_heads, 8); /* default: no GQA */
    assert_int_equal(c.head_dim, 16);
    assert_int_equal(c.n_layers, 4);
    assert_int_equal(c.vocab, 1000);
    assert_int_equal(c.max_pos, 2048);
    assert_true(c.rope_theta == 10000.0f);
    assert_true(fabsf(c.rms_eps - 1e-5f) < 1e-12f);
    assert_int_equal(c.tie_embeddings, 0);
    assert_int_equal(c.attn_bias, 0);
    assert_int_equal(c.bos_token_id, 1);
    assert_int_equal(c.eos_token_id, 7);
    assert_int_equal(c.dtype, GANG_DTYPE_BF16);

    /* Gemma 3 by model_type, its defaults: every 6th layer global, q/k and sandwich norms,
     * (1 + w), GeGLU, sqrt(hidden) embedding scale, tied head, qpas 256 over head_dim 64. */
    write_config(dir, "{\"model_type\": \"gemma3_text\", \"hidden_size\": 64,"
                      "\"intermediate_size\": 128, \"num_attention_heads\": 2,"
                      "\"num_key_value_heads\": 1, \"head_dim\": 64, \"num_hidden_layers\": 7,"
                      "\"vocab_size\": 300, \"max_position_embeddings\": 1024,"
                      "\"sliding_window\": 32, \"hidden_activation\": \"gelu_pytorch_tanh\","
                      "\"final_logit_softcapping\": null}");
    assert_int_equal(gang_model_config_read(dir, &c, err, sizeof(err)), 0);
    assert_int_equal(c.arch, GANG_ARCH_GEMMA3);
    assert_int_equal(c.sliding_window, 32);
    assert_int_equal(c.window_pattern, 6);
    for (uint32_t l = 0; l < 7; l++)
        assert_int_equal(gang_model_layer_window(&c, l), l == 5 ? 0 : 32);
    assert_true(c.rope_local_theta == 10000.0f);
    assert_true(fabsf(c.q_scale - 0.5f) < 1e-7f); /* sqrt(64 / 256) */
    assert_true(fabsf(c.embed_scale - 8.0f) < 1e-6f);
    assert_int_equal(c.qk_norm, 1);
    assert_int_equal(c.post_norms, 1);
    assert_int_equal(c.norm_plus_one, 1);
    assert_int_equal(c.act, GANG_ACT_GELU_TANH);
    assert_int_equal(c.tie_embeddings, 1);
    /* layer_types instead: period 2; query_pre_attn_scalar = head_dim: no q scale. */
    write_config(dir, "{\"architectures\": [\"Gemma3ForCausalLM\"], \"hidden_size\": 64,"
                      "\"intermediate_size\": 128, \"num_attention_heads\": 2, \"head_dim\": 64,"
                      "\"num_hidden_layers\": 4, \"vocab_size\": 300,"
                      "\"max_position_embeddings\": 1024, \"sliding_window\": 16,"
                      "\"query_pre_attn_scalar\": 64, \"layer_types\": [\"sliding_attention\","
                      "\"full_attention\", \"sliding_attention\", \"full_attention\"]}");
    assert_int_equal(gang_model_config_read(dir, &c, err, sizeof(err)), 0);
    assert_int_equal(c.window_pattern, 2);
    assert_int_equal(gang_model_layer_window(&c, 0), 16);
    assert_int_equal(gang_model_layer_window(&c, 3), 0);
    assert_true(c.q_scale == 0.0f);
    /* No sliding_window: Gemma 3's default 4096, which binds within 8192 positions. */
    write_config(dir, "{\"architectures\": [\"Gemma3ForCausalLM\"], \"hidden_size\": 64,"
                      "\"intermediate_size\": 128, \"num_attention_heads\": 2, \"head_dim\": 64,"
                      "\"num_hidden_layers\": 2, \"vocab_size\": 300,"
                      "\"max_position_embeddings\": 8192}");
    assert_int_equal(gang_model_config_read(dir, &c, err, sizeof(err)), 0);
    assert_int_equal(c.sliding_window, 4096);
    /* Llama has none of it. */
    write_config(dir, "{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 64,"
                      "\"intermediate_size\": 128, \"num_attention_heads\": 2,"
                      "\"num_hidden_layers\": 2, \"vocab_size\": 300,"
                      "\"max_position_embeddings\": 1024}");
    assert_int_equal(gang_model_config_read(dir, &c, err, sizeof(err)), 0);
    assert_int_equal(c.post_norms + c.norm_plus_one + (int)c.act + (int)c.window_pattern, 0);
    assert_true(c.embed_scale == 0.0f && c.q_scale == 0.0f);

    /* Mistral by model_type alone; a window as long as the context never binds. */
    write_config(dir, "{\"model_type\": \"mistral\", \"hidden_size\": 64,"
                      "\"intermediate_size\": 128, \"num_attention_heads\": 4,"
                      "\"num_key_value_heads\": 1, \"num_hidden_layers\": 2,"
                      "\"vocab_size\": 300, \"max_position_embeddings\": 4096,"
                      "\"sliding_window\": 4096, \"rope_theta\": 1e6}");
    assert_int_equal(gang_model_config_read(dir, &c, err, sizeof(err)), 0);
    assert_int_equal(c.arch, GANG_ARCH_MISTRAL);
    assert_int_equal(c.n_kv_heads, 1);
    assert_true(c.rope_theta == 1e6f);
    assert_int_equal(c.bos_token_id, -1);
    assert_int_equal(c.eos_token_id, -1);
    assert_int_equal(c.dtype, GANG_DTYPE_F32);
    assert_int_equal(c.sliding_window, 0); /* never binds: dropped */

    /* Mistral v0.1: a window shorter than the context binds on every layer. */
    write_config(dir, "{\"model_type\": \"mistral\", \"hidden_size\": 64,"
                      "\"intermediate_size\": 128, \"num_attention_heads\": 4,"
                      "\"num_key_value_heads\": 1, \"num_hidden_layers\": 2,"
                      "\"vocab_size\": 300, \"max_position_embeddings\": 32768,"
                      "\"sliding_window\": 4096}");
    assert_int_equal(gang_model_config_read(dir, &c, err, sizeof(err)), 0);
    assert_int_equal(c.sliding_window, 4096);
    assert_int_equal(c.window_first_layer, 0);

    /* Qwen2 with use_sliding_window: the layers from max_window_layers on. */
    write_config(dir, "{\"architectures\": [\"Qwen2ForCausalLM\"], \"hidden_size\": 64,"
                      "\"intermediate_size\": 128, \"num_attention_heads\": 4,"
                      "\"num_key_value_heads\": 2, \"num_hidden_layers\": 4,"
                      "\"vocab_size\": 300, \"max_position_embeddings\": 4096,"
                      "\"use_sliding_window\": true, \"sliding_window\": 64,"
                      "\"max_window_layers\": 3}");
    assert_int_equal(gang_model_config_read(dir, &c, err, sizeof(err)), 0);
    assert_int_equal(c.sliding_window, 64);
    assert_int_equal(c.window_first_layer, 3);

    /* Qwen2: biases always, tied head, an unused window. */
    write_config(dir, "{\"architectures\": [\"Qwen2ForCausalLM\"], \"hidden_size\": 64,"
                      "\"intermediate_size\": 128, \"num_attention_heads\": 4,"
                      "\"num_key_value_heads\": 2, \"num_hidden_layers\": 2,"
                      "\"vocab_size\": 300, \"max_position_embeddings\": 4096,"
                      "\"use_sliding_window\": false, \"sliding_window\": 16,"
                      "\"tie_word_embeddings\": true, \"eos_token_id\": 299}");
    assert_int_equal(gang_model_config_read(dir, &c, err, sizeof(err)), 0);
    assert_int_equal(c.arch, GANG_ARCH_QWEN2);
    assert_int_equal(c.attn_bias, 1);
    assert_int_equal(c.tie_embeddings, 1);
    assert_int_equal(c.eos_token_id, 299);
    assert_int_equal(c.sliding_window, 0);
    assert_int_equal(gang_model_config_read(NULL, &c, err, sizeof(err)), GANG_EINVAL);
    fx_rmtree(dir);
}

/* A Llama config of head_dim 16, max_position_embeddings 256, with rope_scaling = rs. */
static void rope_config(const char *dir, const char *rs, gang_model_config *c)
{
    char text[1024], err[ERRLEN];

    snprintf(text, sizeof(text),
             "{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 64,"
             "\"intermediate_size\": 128, \"num_attention_heads\": 4, \"rope_theta\": 500000,"
             "\"num_hidden_layers\": 2, \"vocab_size\": 100, \"head_dim\": 16,"
             "\"max_position_embeddings\": 256, \"rope_scaling\": %s}",
             rs);
    write_config(dir, text);
    if (gang_model_config_read(dir, c, err, sizeof(err)) != 0)
        fail_msg("rope_scaling %s refused: %s", rs, err);
}

/*
 * rope_scaling: no-op blocks give plain RoPE's table; linear divides every frequency;
 * llama3 keeps the high frequencies and divides the low ones by factor; YaRN keeps the
 * fastest pair, interpolates the slowest and carries 0.1 ln(factor) + 1; dynamic NTK
 * starts from the plain table; the served context (max_ctx_allowed) grows with linear,
 * dynamic and YaRN, not with llama3.
 */
static void test_config_rope(void **state)
{
    char *dir = fx_tmpdir();
    gang_model_config c;
    float plain[8], inv[8], scale;
    size_t i;
    (void)state;

    rope_config(dir, "null", &c);
    assert_int_equal(c.rope.type, GANG_ROPE_DEFAULT);
    assert_int_equal(c.max_ctx_allowed, 256);
    assert_int_equal(gang_rope_inv_freq(&c, plain, &scale), 0);
    for (i = 0; i < 8; i++)
        assert_float_equal(plain[i], 1.0 / pow(500000.0, (double)(2 * i) / 16.0), 1e-7);
    assert_true(scale == 1.0f);
    const char *noops[] = {"{\"rope_type\": \"default\"}",
                           "{\"type\": \"linear\", \"factor\": 1.0}",
                           "{\"rope_type\": \"dynamic\", \"factor\": 1.0}"};
    for (size_t n = 0; n < 3; n++) {
        rope_config(dir, noops[n], &c);
        assert_int_equal(c.max_ctx_allowed, 256);
        assert_int_equal(gang_rope_inv_freq(&c, inv, &scale), 0);
        assert_memory_equal(inv, plain, sizeof(inv));
        assert_true(scale == 1.0f);
    }
    rope_config(dir, "{\"type\": \"linear\", \"factor\": 4.0}", &c);
    assert_int_equal(c.rope.type, GANG_ROPE_LINEAR);
    assert_int_equal(c.max_ctx_allowed, 1024);
    assert_int_equal(gang_rope_inv_freq(&c, inv, &scale), 0);
    for (i = 0; i < 8; i++)
        assert_float_equal(inv[i], plain[i] / 4.0, 1e-7 * plain[i]);
    rope_config(dir, "{\"rope_type\": \"dynamic\", \"factor\": 2.0}", &c);
    assert_int_equal(c.rope.type, GANG_ROPE_DYNAMIC);
    assert_int_equal(c.max_ctx_allowed, 512);
    assert_int_equal(gang_rope_inv_freq(&c, inv, &scale), 0);
    assert_memory_equal(inv, plain, sizeof(inv)); /* within the original context */
    rope_config(dir,
                "{\"rope_type\": \"llama3\", \"factor\": 32.0, \"low_freq_factor\": 1.0,"
                "\"high_freq_factor\": 4.0, \"original_max_position_embeddings\": 64}",
                &c);
    assert_int_equal(c.rope.type, GANG_ROPE_LLAMA3);
    assert_int_equal(c.rope.orig_max_pos, 64);
    assert_int_equal(c.max_ctx_allowed, 256);
    assert_int_equal(gang_rope_inv_freq(&c, inv, &scale), 0);
    assert_true(inv[0] == plain[0]);                              /* wavelength 2 pi */
    assert_float_equal(inv[7], plain[7] / 32.0, 1e-6 * plain[7]); /* longest wavelength */
    for (i = 1; i < 8; i++)
        assert_true(inv[i] <= plain[i] && inv[i] >= plain[i] / 32.0f * 0.999f);
    rope_config(dir,
                "{\"type\": \"yarn\", \"factor\": 4.0, \"original_max_position_embeddings\": 256}",
                &c);
    assert_int_equal(c.rope.type, GANG_ROPE_YARN);
    assert_int_equal(c.max_ctx_allowed, 1024);
    assert_int_equal(gang_rope_inv_freq(&c, inv, &scale), 0);
    assert_float_equal(scale, 0.1 * log(4.0) + 1.0, 1e-6);
    assert_true(inv[0] == plain[0]);
    assert_float_equal(inv[7], plain[7] / 4.0, 1e-6 * plain[7]);
    rope_config(dir, "{\"type\": \"yarn\", \"factor\": 2.0, \"attention_factor\": 1.5}", &c);
    assert_int_equal(gang_rope_inv_freq(&c, inv, &scale), 0);
    assert_true(scale == 1.5f);
    assert_int_equal(c.max_ctx_allowed, 512);
    fx_rmtree(dir);
}

/*
 * A head_dim apart from hidden / n_heads (Mistral Nemo: 5120 / 32 heads of 128), also where
 * hidden does not divide by the heads; Qwen3: q/k norms, no biases, an unused window.
 */
static void test_config_head_dim_qwen3(void **state)
{
    char *dir = fx_tmpdir(), err[ERRLEN];
    gang_model_config c;
    (void)state;

    write_config(dir, "{\"architectures\": [\"MistralForCausalLM\"], \"hidden_size\": 60,"
                      "\"intermediate_size\": 128, \"num_attention_heads\": 8,"
                      "\"num_key_value_heads\": 2, \"num_hidden_layers\": 2, \"head_dim\": 32,"
                      "\"vocab_size\": 300, \"max_position_embeddings\": 4096}");
    assert_int_equal(gang_model_config_read(dir, &c, err, sizeof(err)), 0);
    assert_int_equal(c.head_dim, 32);
    assert_int_equal(c.qk_norm, 0);
    write_config(dir, "{\"architectures\": [\"Qwen3ForCausalLM\"], \"hidden_size\": 64,"
                      "\"intermediate_size\": 128, \"num_attention_heads\": 4,"
                      "\"num_key_value_heads\": 2, \"num_hidden_layers\": 2, \"head_dim\": 32,"
                      "\"attention_bias\": false, \"use_sliding_window\": false,"
                      "\"sliding_window\": null, \"max_window_layers\": 28,"
                      "\"vocab_size\": 300, \"max_position_embeddings\": 4096}");
    assert_int_equal(gang_model_config_read(dir, &c, err, sizeof(err)), 0);
    assert_int_equal(c.arch, GANG_ARCH_QWEN3);
    assert_int_equal(c.qk_norm, 1);
    assert_int_equal(c.attn_bias, 0);
    assert_int_equal(c.head_dim, 32);
    fx_rmtree(dir);
}

/* A Llama config.json of vocabulary 100 whose eos_token_id is the raw JSON eos. */
static void write_eos_config(const char *dir, const char *eos)
{
    char text[1024];

    snprintf(text, sizeof(text),
             "{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 64,"
             "\"intermediate_size\": 128, \"num_attention_heads\": 4,"
             "\"num_hidden_layers\": 2, \"vocab_size\": 100,"
             "\"max_position_embeddings\": 256%s%s}",
             eos != NULL ? ", \"eos_token_id\": " : "", eos != NULL ? eos : "");
    write_config(dir, text);
}

/* DIR/generation_config.json = text, or removed when text is NULL. */
static void write_gen_config(const char *dir, const char *text)
{
    char path[4096];

    fx_path(path, sizeof(path), dir, "generation_config.json");
    if (text == NULL)
        unlink(path);
    else
        fx_write(path, text, strlen(text));
}

/* Reads dir and fails unless its EOS ids are want [n] in that order (eos_token_id the first). */
static void expect_eos(const char *dir, const int32_t *want, uint32_t n)
{
    gang_model_config c;
    char err[ERRLEN];
    uint32_t i;

    if (gang_model_config_read(dir, &c, err, sizeof(err)) != 0)
        fail_msg("config refused: %s", err);
    assert_int_equal(c.n_eos, n);
    for (i = 0; i < n; i++)
        assert_int_equal(c.eos_ids[i], want[i]);
    assert_int_equal(c.eos_token_id, n > 0 ? want[0] : -1);
}

/* Fails unless reading dir is GANG_EMODEL with a message naming file and words. */
static void expect_refused_with(const char *dir, const char *file, const char *words)
{
    gang_model_config c;
    char err[ERRLEN];
    int rc = gang_model_config_read(dir, &c, err, sizeof(err));

    if (rc != GANG_EMODEL || strstr(err, file) == NULL || strstr(err, words) == NULL)
        fail_msg("expected GANG_EMODEL naming %s and '%s'; got %d '%s'", file, words, rc, err);
}

/*
 * EOS ids: an int, a list, generation_config.json's alone, both (config.json's first,
 * duplicates dropped); ids outside the vocabulary and more than GANG_MAX_EOS are refused.
 * Sampling defaults of generation_config.json: read when present, validated, do_sample
 * false is greedy; no file sets nothing.
 */
static void test_config_eos_and_generation(void **state)
{
    static const int32_t one[] = {5}, list[] = {7, 2, 9}, gen[] = {3, 4}, both[] = {7, 2, 3};
    char *dir = fx_tmpdir(), err[ERRLEN];
    gang_model_config c;
    (void)state;

    write_eos_config(dir, NULL);
    expect_eos(dir, NULL, 0);
    assert_int_equal(gang_model_config_read(dir, &c, err, sizeof(err)), 0);
    assert_int_equal(c.gen.has_temperature + c.gen.has_top_p + c.gen.has_top_k +
                         c.gen.has_repetition_penalty,
                     0);
    write_eos_config(dir, "5");
    expect_eos(dir, one, 1);
    write_eos_config(dir, "[7, 2, 9, 2]");
    expect_eos(dir, list, 3);
    write_eos_config(dir, NULL);
    write_gen_config(dir, "{\"eos_token_id\": [3, 4, 3], \"bos_token_id\": 1}");
    expect_eos(dir, gen, 2);
    write_eos_config(dir, "[7, 2]");
    write_gen_config(dir, "{\"eos_token_id\": [2, 3, 7]}");
    expect_eos(dir, both, 3);
    write_gen_config(dir, "{\"eos_token_id\": 2}");
    expect_eos(dir, list, 2);

    /* Out of the vocabulary, in either file; too many; not a list of integers. */
    write_eos_config(dir, "[7, 100]");
    write_gen_config(dir, NULL);
    expect_refused_with(dir, "/config.json", "eos_token_id");
    write_eos_config(dir, "[]");
    expect_refused_with(dir, "/config.json", "eos_token_id");
    write_eos_config(dir, "[1, 2, 3, 4, 5, 6, 7, 8, 9]");
    expect_refused_with(dir, "/config.json", "more than 8");
    write_eos_config(dir, "[1, 2, 3, 4, 5]");
    write_gen_config(dir, "{\"eos_token_id\": [5, 6, 7, 8]}");
    expect_eos(dir, (const int32_t[]){1, 2, 3, 4, 5, 6, 7, 8}, 8);
    write_gen_config(dir, "{\"eos_token_id\": [5, 6, 7, 8, 9]}");
    expect_refused_with(dir, "generation_config.json", "more than 8");
    write_gen_config(dir, "{\"eos_token_id\": -1}");
    expect_refused_with(dir, "generation_config.json", "eos_token_id");
    write_gen_config(dir, "{\"eos_token_id\": [\"2\"]}");
    expect_refused_with(dir, "generation_config.json", "eos_token_id");
    write_gen_config(dir, "[1]");
    expect_refused_with(dir, "generation_config.json", "JSON object");

    /* Sampling defaults. */
    write_eos_config(dir, "2");
    write_gen_config(dir, "{\"temperature\": 0.6, \"top_p\": 0.9, \"top_k\": 40,"
                          "\"repetition_penalty\": 1.1, \"do_sample\": true}");
    assert_int_equal(gang_model_config_read(dir, &c, err, sizeof(err)), 0);
    assert_true(c.gen.has_temperature && c.gen.temperature == 0.6f);
    assert_true(c.gen.has_top_p && c.gen.top_p == 0.9f);
    assert_true(c.gen.has_top_k && c.gen.top_k == 40);
    assert_true(c.gen.has_repetition_penalty && c.gen.repetition_penalty == 1.1f);
    write_gen_config(dir, "{\"temperature\": 0.6, \"do_sample\": false, \"top_p\": null}");
    assert_int_equal(gang_model_config_read(dir, &c, err, sizeof(err)), 0);
    assert_true(c.gen.has_temperature && c.gen.temperature == 0.0f);
    assert_int_equal(c.gen.has_top_p, 0);
    assert_int_equal(c.gen.has_top_k, 0);
    write_gen_config(dir, "{\"temperature\": -0.5}");
    expect_refused_with(dir, "generation_config.json", "temperature");
    write_gen_config(dir, "{\"top_p\": 0}");
    expect_refused_with(dir, "generation_config.json", "top_p");
    write_gen_config(dir, "{\"top_p\": 1.5}");
    expect_refused_with(dir, "generation_config.json", "top_p");
    write_gen_config(dir, "{\"repetition_penalty\": 0}");
    expect_refused_with(dir, "generation_config.json", "repetition_penalty");
    write_gen_config(dir, "{\"top_k\": 2.5}");
    expect_refused_with(dir, "generation_config.json", "top_k");
    write_gen_config(dir, "{\"do_sample\": \"no\"}");
    expect_refused_with(dir, "generation_config.json", "do_sample");
    write_gen_config(dir, "{\"temperature\": \"hot\"}");
    expect_refused_with(dir, "generation_config.json", "temperature");
    fx_rmtree(dir);
}

/* One refusal: up to three fields set (raw JSON value) or removed (NULL), and the words
 * the message must contain. */
typedef struct bad_cfg {
    const char *key1, *val1, *key2, *val2;
    const char *expect;
    const char *key3, *val3;
} bad_cfg;

static const bad_cfg bad_cfgs[] = {
    {"architectures", "[\"GPT2LMHeadModel\"]", NULL, NULL, "unsupported architecture", NULL, NULL},
    {"architectures", "null", "model_type", "\"gpt2\"", "unsupported model_type", NULL, NULL},
    {"architectures", NULL, "model_type", NULL, "architectures", NULL, NULL},
    {"hidden_size", NULL, NULL, NULL, "\"hidden_size\" is missing", NULL, NULL},
    {"num_attention_heads", "2.5", NULL, NULL, "\"num_attention_heads\" is not an integer", NULL,
     NULL},
    {"num_attention_heads", "\"4\"", NULL, NULL, "\"num_attention_heads\" is not an integer", NULL,
     NULL},
    {"hidden_size", "70000", NULL, NULL, "\"hidden_size\" = 70000 is outside", NULL, NULL},
    {"num_hidden_layers", "0", NULL, NULL, "\"num_hidden_layers\" = 0 is outside", NULL, NULL},
    {"vocab_size", "5000000", NULL, NULL, "\"vocab_size\" = 5000000 is outside", NULL, NULL},
    {"num_attention_heads", "3", NULL, NULL, "not divisible by num_attention_heads", NULL, NULL},
    {"num_key_value_heads", "3", NULL, NULL, "not divisible by num_key_value_heads", NULL, NULL},
    {"rope_scaling", "{\"type\": \"longrope\", \"factor\": 2.0}", NULL, NULL, "\"longrope\"", NULL,
     NULL},
    {"rope_scaling", "{\"rope_type\": \"su\"}", NULL, NULL, "\"su\" is not implemented", NULL,
     NULL},
    {"rope_scaling", "\"linear\"", NULL, NULL, "rope_scaling is not an object", NULL, NULL},
    {"rope_scaling", "{\"rope_type\": \"linear\"}", NULL, NULL, "\"factor\" is missing", NULL,
     NULL},
    {"rope_scaling", "{\"rope_type\": \"linear\", \"factor\": 0.5}", NULL, NULL,
     "\"factor\" is below 1", NULL, NULL},
    {"rope_scaling", "{\"rope_type\": \"linear\", \"factor\": 5000}", NULL, NULL,
     "rope_scaling: field \"factor\"", NULL, NULL},
    {"rope_scaling", "{\"rope_type\": \"dynamic\", \"factor\": 2.0}", "head_dim", "2",
     "dynamic NTK needs a head_dim above 2", NULL, NULL},
    {"rope_scaling",
     "{\"rope_type\": \"llama3\", \"factor\": 8, \"high_freq_factor\": 4, "
     "\"original_max_position_embeddings\": 64}",
     NULL, NULL, "\"low_freq_factor\" is missing", NULL, NULL},
    {"rope_scaling",
     "{\"rope_type\": \"llama3\", \"factor\": 8, \"low_freq_factor\": 1, "
     "\"high_freq_factor\": 4}",
     NULL, NULL, "\"original_max_position_embeddings\" is missing", NULL, NULL},
    {"rope_scaling",
     "{\"rope_type\": \"llama3\", \"factor\": 8, \"low_freq_factor\": 4, "
     "\"high_freq_factor\": 1, \"original_max_position_embeddings\": 64}",
     NULL, NULL, "high_freq_factor must be larger", NULL, NULL},
    {"rope_scaling", "{\"type\": \"yarn\", \"factor\": 4, \"beta_fast\": -1}", NULL, NULL,
     "\"beta_fast\"", NULL, NULL},
    {"rope_scaling", "{\"type\": \"yarn\", \"factor\": 4, \"attention_factor\": 99}", NULL, NULL,
     "\"attention_factor\"", NULL, NULL},
    {"head_dim", "33", NULL, NULL, "head_dim 33 is odd", NULL, NULL},
    {"head_dim", "1024", NULL, NULL, "\"head_dim\" = 1024 is outside", NULL, NULL},
    {"head_dim", "0", NULL, NULL, "\"head_dim\" = 0 is outside", NULL, NULL},
    {"head_dim", "16.5", NULL, NULL, "\"head_dim\" is not an integer", NULL, NULL},
    {"architectures", "[\"Qwen3ForCausalLM\"]", "attention_bias", "true", "attention_bias", NULL,
     NULL},
    {"architectures", "[\"MistralForCausalLM\"]", "sliding_window", "0", "sliding_window", NULL,
     NULL},
    {"architectures", "[\"MistralForCausalLM\"]", "sliding_window", "\"4096\"", "sliding_window",
     NULL, NULL},
    {"architectures", "[\"Qwen2ForCausalLM\"]", "use_sliding_window", "true", "max_window_layers",
     "max_window_layers", "-1"},
    {"hidden_act", "\"gelu\"", NULL, NULL, "hidden_act", NULL, NULL},
    {"partial_rotary_factor", "0.5", NULL, NULL, "partial_rotary_factor", NULL, NULL},
    {"attention_bias", "true", NULL, NULL, "attention_bias", NULL, NULL},
    {"mlp_bias", "true", NULL, NULL, "mlp_bias", NULL, NULL},
    {"rms_norm_eps", "-1", NULL, NULL, "rms_norm_eps", NULL, NULL},
    {"rope_theta", "\"big\"", NULL, NULL, "rope_theta", NULL, NULL},
    {"torch_dtype", "\"float64\"", NULL, NULL, "torch_dtype", NULL, NULL},
    {"eos_token_id", "999", NULL, NULL, "eos_token_id", NULL, NULL},
    {"tie_word_embeddings", "\"yes\"", NULL, NULL, "tie_word_embeddings", NULL, NULL},
    /* Gemma 3: what it must not have, and its own fields. */
    {"architectures", "[\"Gemma3ForCausalLM\"]", "final_logit_softcapping", "30.0",
     "\"final_logit_softcapping\" is set", NULL, NULL},
    {"architectures", "[\"Gemma3ForCausalLM\"]", "attn_logit_softcapping", "50",
     "\"attn_logit_softcapping\" is set", NULL, NULL},
    {"architectures", "[\"Gemma3ForCausalLM\"]", "use_bidirectional_attention", "true",
     "use_bidirectional_attention", NULL, NULL},
    {"architectures", "[\"Gemma3ForCausalLM\"]", "query_pre_attn_scalar", "0",
     "query_pre_attn_scalar", NULL, NULL},
    {"architectures", "[\"Gemma3ForCausalLM\"]", "rope_local_base_freq", "-1",
     "rope_local_base_freq", NULL, NULL},
    {"architectures", "[\"Gemma3ForCausalLM\"]", "hidden_activation", "\"gelu\"",
     "\"hidden_activation\" is not \"gelu_pytorch_tanh\"", NULL, NULL},
    {"architectures", "[\"Gemma3ForCausalLM\"]", "hidden_act", NULL,
     "\"layer_types\" is not a list of 2", "layer_types", "[\"full_attention\"]"},
    {"architectures", "[\"Gemma3ForCausalLM\"]", "hidden_act", NULL, "layer_types[1]",
     "layer_types", "[\"sliding_attention\", \"chunked_attention\"]"},
    {"architectures", "[\"Gemma3ForCausalLM\"]", "hidden_act", NULL, "does not repeat",
     "layer_types", "[\"full_attention\", \"sliding_attention\"]"},
};

static void cfg_set(cJSON *root, const char *key, const char *val)
{
    cJSON_DeleteItemFromObjectCaseSensitive(root, key);
    if (val != NULL)
        cJSON_AddItemToObject(root, key, cJSON_Parse(val));
}

static void expect_cfg_refused(const char *dir, const char *expect)
{
    gang_model_config c;
    char err[ERRLEN];
    int rc = gang_model_config_read(dir, &c, err, sizeof(err));

    if (rc != GANG_EMODEL || strstr(err, expect) == NULL || strstr(err, "config.json") == NULL)
        fail_msg("expected GANG_EMODEL naming config.json and '%s'; got %d '%s'", expect, rc, err);
}

static void test_config_bad(void **state)
{
    char *dir = fx_tmpdir(), path[4096], *text, *big;
    size_t len, i;
    uint8_t *base;
    (void)state;

    fx_make_model(&(gang_mkmodel_opts){.out_dir = dir,
                                       .arch = GANG_ARCH_LLAMA,
                                       .layers = 2,
                                       .hidden = 64,
                                       .heads = 4,
                                       .kv_heads = 2,
                                       .ffn = 128,
                                       .vocab = 256,
                                       .max_pos = 512,
                                       .seed = 1,
                                       .shards = 1});
    fx_path(path, sizeof(path), dir, "config.json");
    base = fx_read(path, &len);
    assert_non_null(base);
    for (i = 0; i < sizeof(bad_cfgs) / sizeof(bad_cfgs[0]); i++) {
        cJSON *root = cJSON_Parse((const char *)base);

        assert_non_null(root);
        cfg_set(root, bad_cfgs[i].key1, bad_cfgs[i].val1);
        if (bad_cfgs[i].key2 != NULL)
            cfg_set(root, bad_cfgs[i].key2, bad_cfgs[i].val2);
        if (bad_cfgs[i].key3 != NULL)
            cfg_set(root, bad_cfgs[i].key3, bad_cfgs[i].val3);
        text = cJSON_Print(root);
        write_config(dir, text);
        expect_cfg_refused(dir, bad_cfgs[i].expect);
        free(text);
        cJSON_Delete(root);
    }
    write_config(dir, "{\"hidden_size\": ");
    expect_cfg_refused(dir, "not a JSON object");
    write_config(dir, "[1, 2]");
    expect_cfg_refused(dir, "not a JSON object");
    big = malloc(GANG_MODEL_MAX_CONFIG_BYTES + 2);
    assert_non_null(big);
    memset(big, ' ', GANG_MODEL_MAX_CONFIG_BYTES + 1);
    big[GANG_MODEL_MAX_CONFIG_BYTES + 1] = '\0';
    write_config(dir, big);
    expect_cfg_refused(dir, "larger than the limit");
    free(big);
    unlink(path);
    expect_cfg_refused(dir, "cannot open");
    free(base);
    fx_rmtree(dir);
}

/* ---------------------------------------------------------------------------------
 * mkmodel
 * --------------------------------------------------------------------------------- */

static void assert_same_files(const char *a, const char *b, const char *name, int same)
{
    char pa[4096], pb[4096];

    fx_path(pa, sizeof(pa), a, name);
    fx_path(pb, sizeof(pb), b, name);
    if (fx_same_file(pa, pb) != same)
        fail_msg("%s: expected the two copies to be %s", name, same ? "identical" : "different");
}

static void test_mkmodel_deterministic(void **state)
{
    static const gang_dtype dts[] = {GANG_DTYPE_F32, GANG_DTYPE_F16, GANG_DTYPE_BF16};
    char *a = fx_tmpdir(), *b = fx_tmpdir(), path[4096], err[ERRLEN];
    gang_mkmodel_opts o;
    size_t i, off, dlen;
    cJSON *hdr, *e;
    const char *prev = "";
    (void)state;

    for (i = 0; i < 3; i++) {
        o = fx_small_opts(a, GANG_ARCH_QWEN2);
        o.dtype = dts[i];
        fx_make_model(&o);
        o.out_dir = b;
        fx_make_model(&o);
        assert_same_files(a, b, "config.json", 1);
        assert_same_files(a, b, "model.safetensors", 1);
        o.shards = 3;
        fx_make_model(&o);
        o.out_dir = a;
        fx_make_model(&o);
        assert_same_files(a, b, "model-00002-of-00003.safetensors", 1);
        assert_same_files(a, b, "model.safetensors.index.json", 1);
    }
    /* Another seed changes the weights, not the config. */
    o = fx_small_opts(a, GANG_ARCH_LLAMA);
    fx_make_model(&o);
    o.out_dir = b;
    o.seed = 8;
    fx_make_model(&o);
    assert_same_files(a, b, "config.json", 1);
    assert_same_files(a, b, "model.safetensors", 0);

    /* Header: names sorted, data section 8-byte aligned, contiguous. */
    fx_path(path, sizeof(path), a, "model.safetensors");
    hdr = fx_header(path, &off, &dlen);
    assert_int_equal(off % 8, 0);
    cJSON_ArrayForEach(e, hdr)
    {
        if (strcmp(e->string, "__metadata__") == 0)
            continue;
        assert_true(strcmp(prev, e->string) < 0);
        prev = e->string;
    }
    cJSON_Delete(hdr);

    /* Scales: q_proj ~ N(0, 1/hidden), norms near 1. */
    {
        size_t n, k;
        float *q = fx_raw_tensor(path, "model.layers.0.self_attn.q_proj.weight", &n);
        float *g = fx_raw_tensor(path, "model.norm.weight", &n);
        double ss = 0, mean = 0;

        assert_non_null(q);
        assert_non_null(g);
        for (k = 0; k < 64 * 64; k++)
            ss += (double)q[k] * q[k];
        assert_true(fabs(sqrt(ss / 4096) * 8.0 - 1.0) < 0.1);
        for (k = 0; k < 64; k++)
            mean += g[k] / 64.0;
        assert_true(fabs(mean - 1.0) < 0.05);
        free(q);
        free(g);
    }

    /* Shapes the reader would refuse are usage errors. */
    o = fx_small_opts(b, GANG_ARCH_LLAMA);
    o.heads = 3;
    assert_int_equal(gang_mkmodel(&o, err, sizeof(err)), GANG_EUSAGE);
    assert_non_null(strstr(err, "heads"));
    o = fx_small_opts(b, GANG_ARCH_LLAMA);
    o.kv_heads = 3;
    assert_int_equal(gang_mkmodel(&o, err, sizeof(err)), GANG_EUSAGE);
    o = fx_small_opts(b, GANG_ARCH_LLAMA);
    o.shards = 1000;
    assert_int_equal(gang_mkmodel(&o, err, sizeof(err)), GANG_EUSAGE);
    assert_non_null(strstr(err, "shards"));
    o.shards = 1;
    o.dtype = GANG_DTYPE_I32;
    assert_int_equal(gang_mkmodel(&o, err, sizeof(err)), GANG_EUSAGE);
    fx_rmtree(a);
    fx_rmtree(b);
}

/* ---------------------------------------------------------------------------------
 * Loading shards
 * --------------------------------------------------------------------------------- */

/* The whole model (tp 1, pp 1) equals the file's tensors, converted to f32. */
static void check_full_against_file(const char *dir, const gang_model *m)
{
    char path[4096], name[128];
    size_t n;
    float *raw;
    uint32_t i;

    fx_path(path, sizeof(path), dir, "model.safetensors");
    raw = fx_raw_tensor(path, "model.embed_tokens.weight", &n);
    assert_int_equal(n, (size_t)m->cfg.vocab * m->cfg.hidden);
    assert_floats_equal(m->embed, raw, n);
    free(raw);
    raw = fx_raw_tensor(path,
                        m->cfg.tie_embeddings ? "model.embed_tokens.weight" : "lm_head.weight", &n);
    assert_floats_equal(m->lm_head, raw, n);
    free(raw);
    raw = fx_raw_tensor(path, "model.norm.weight", &n);
    assert_floats_equal(m->final_norm, raw, n);
    free(raw);
    for (i = 0; i < m->cfg.n_layers; i++) {
        const gang_tp_layer *l = &m->layers[i];
        struct {
            const char *suffix;
            const float *got;
        } t[] = {
            {"input_layernorm.weight", l->attn_norm},
            {"self_attn.q_proj.weight", l->wq},
            {"self_attn.k_proj.weight", l->wk},
            {"self_attn.v_proj.weight", l->wv},
            {"self_attn.o_proj.weight", l->wo},
            {"post_attention_layernorm.weight", l->mlp_norm},
            {"mlp.gate_proj.weight", l->w_gate},
            {"mlp.up_proj.weight", l->w_up},
            {"mlp.down_proj.weight", l->w_down},
            {"self_attn.q_proj.bias", l->bq},
            {"self_attn.k_proj.bias", l->bk},
            {"self_attn.v_proj.bias", l->bv},
            {"self_attn.q_norm.weight", l->q_norm},
            {"self_attn.k_norm.weight", l->k_norm},
        };
        size_t k;

        for (k = 0; k < sizeof(t) / sizeof(t[0]); k++) {
            snprintf(name, sizeof(name), "model.layers.%u.%s", i, t[k].suffix);
            raw = fx_raw_tensor(path, name, &n);
            if (raw == NULL) {
                assert_null(t[k].got); /* biases or q/k norms of a model without them */
                continue;
            }
            assert_floats_equal(t[k].got, raw, n);
            free(raw);
        }
    }
}

/* Rows [first, +count) of src [rows, cols], or columns when by_cols, compared with got. */
static void check_band(const float *src, size_t rows, size_t cols, int by_cols, size_t first,
                       size_t count, const float *got)
{
    size_t n = by_cols ? rows * count : count * cols;
    float *want = malloc(n * sizeof(float));

    assert_non_null(want);
    if (by_cols)
        assert_int_equal(gang_tp_slice_cols(src, rows, cols, first, count, want), 0);
    else
        assert_int_equal(gang_tp_slice_rows(src, rows, cols, first, count, want), 0);
    assert_floats_equal(got, want, n);
    free(want);
}

/* One rank's shard equals the slices of the full model that the topology gives it. */
static void check_shard(const gang_model *full, const gang_topology *t, uint32_t rank,
                        const gang_model *m)
{
    const gang_model_config *c = &full->cfg;
    size_t h = c->hidden, hd = c->head_dim, q = (size_t)c->n_heads * hd,
           kv = (size_t)c->n_kv_heads * hd;
    gang_tp_shard s;
    gang_rank_place pl;
    uint32_t first, count, i;
    size_t bytes = 0;

    assert_int_equal(gang_topology_rank(t, rank, &pl), 0);
    assert_int_equal(gang_topology_tp_shard(t, pl.tp_rank, &s), 0);
    assert_int_equal(gang_topology_stage_layers(t, pl.pp_stage, &first, &count), 0);
    assert_memory_equal(&m->shard, &s, sizeof(s));
    assert_memory_equal(&m->place, &pl, sizeof(pl));
    assert_int_equal(m->layer_first, first);
    assert_int_equal(m->layer_count, count);
    for (i = 0; i < count; i++) {
        const gang_tp_layer *f = &full->layers[first + i], *l = &m->layers[i];
        size_t qf = s.head_first * hd, qn = s.head_count * hd;
        size_t kf = s.kv_head_first * hd, kn = s.kv_head_count * hd;
        gang_layer_weights w = {.attn_norm = f->attn_norm,
                                .wq = f->wq,
                                .wk = f->wk,
                                .wv = f->wv,
                                .wo = f->wo,
                                .mlp_norm = f->mlp_norm,
                                .w_gate = f->w_gate,
                                .w_up = f->w_up,
                                .w_down = f->w_down,
                                .bq = f->bq,
                                .bk = f->bk,
                                .bv = f->bv,
                                .q_norm = f->q_norm,
                                .k_norm = f->k_norm};
        gang_tp_layer ref;
        float freq[GANG_MODEL_MAX_HEAD_DIM / 2], scale;

        assert_memory_equal(&l->shard, &s, sizeof(s));
        assert_int_equal(l->tp, t->tp);
        assert_int_equal(l->hidden, h);
        assert_int_equal(l->head_dim, hd);
        assert_true(l->rope_theta == c->rope_theta && l->norm_eps == c->rms_eps);
        assert_floats_equal(l->attn_norm, f->attn_norm, h);
        assert_floats_equal(l->mlp_norm, f->mlp_norm, h);
        check_band(f->wq, q, h, 0, qf, qn, l->wq);
        check_band(f->wk, kv, h, 0, kf, kn, l->wk);
        check_band(f->wv, kv, h, 0, kf, kn, l->wv);
        check_band(f->wo, h, q, 1, qf, qn, l->wo);
        check_band(f->w_gate, c->ffn, h, 0, s.ffn_first, s.ffn_count, l->w_gate);
        check_band(f->w_up, c->ffn, h, 0, s.ffn_first, s.ffn_count, l->w_up);
        check_band(f->w_down, h, c->ffn, 1, s.ffn_first, s.ffn_count, l->w_down);
        bytes += 2 * h + qn * h * 2 + kn * h * 2 + 3 * (size_t)s.ffn_count * h;
        if (c->attn_bias) {
            check_band(f->bq, 1, q, 1, qf, qn, l->bq);
            check_band(f->bk, 1, kv, 1, kf, kn, l->bk);
            check_band(f->bv, 1, kv, 1, kf, kn, l->bv);
            bytes += qn + 2 * kn;
        } else {
            assert_null(l->bq);
            assert_null(l->bk);
            assert_null(l->bv);
        }
        if (c->qk_norm) { /* Qwen3: the per-head norms on every rank */
            assert_floats_equal(l->q_norm, f->q_norm, hd);
            assert_floats_equal(l->k_norm, f->k_norm, hd);
            bytes += 2 * hd;
        } else {
            assert_null(l->q_norm);
            assert_null(l->k_norm);
        }
        /* The model's RoPE table (rope_scaling applied), on every rank. */
        assert_int_equal(gang_rope_inv_freq(c, freq, &scale), 0);
        assert_floats_equal(l->rope_freq, freq, hd / 2);
        assert_true(l->rope_scale == scale);
        /* The very cut gang_tp_layer_init makes from the full matrices. */
        assert_int_equal(gang_tp_layer_init(&ref, t, pl.tp_rank, &w, c->rope_theta, c->rms_eps), 0);
        assert_floats_equal(l->wq, ref.wq, qn * h);
        assert_floats_equal(l->wk, ref.wk, kn * h);
        assert_floats_equal(l->wv, ref.wv, kn * h);
        assert_floats_equal(l->wo, ref.wo, h * qn);
        assert_floats_equal(l->w_gate, ref.w_gate, s.ffn_count * h);
        assert_floats_equal(l->w_up, ref.w_up, s.ffn_count * h);
        assert_floats_equal(l->w_down, ref.w_down, h * s.ffn_count);
        if (c->attn_bias) {
            assert_floats_equal(l->bq, ref.bq, qn);
            assert_floats_equal(l->bk, ref.bk, kn);
            assert_floats_equal(l->bv, ref.bv, kn);
        }
        gang_tp_layer_free(&ref);
    }
    if (pl.pp_stage == 0) {
        assert_floats_equal(m->embed, full->embed, (size_t)c->vocab * h);
        bytes += (size_t)c->vocab * h;
    } else {
        assert_null(m->embed);
    }
    if (pl.pp_stage == t->pp - 1) {
        assert_floats_equal(m->final_norm, full->final_norm, h);
        check_band(full->lm_head, c->vocab, h, 0, s.vocab_first, s.vocab_count, m->lm_head);
        bytes += h;
        /* Tied with the table on this rank (pp 1): the head is the table's rows, held once. */
        if (c->tie_embeddings && pl.pp_stage == 0) {
            gang_kernels_weight v = gang_model_head(m);

            assert_int_equal(m->lm_head_tied, 1);
            assert_ptr_equal(m->lm_head, (const float *)m->embed + (size_t)s.vocab_first * h);
            assert_ptr_equal(v.data, m->lm_head);
            assert_null(v.scales);
        } else {
            assert_int_equal(m->lm_head_tied, 0);
            bytes += (size_t)s.vocab_count * h;
        }
    } else {
        assert_null(m->final_norm);
        assert_null(m->lm_head);
    }
    assert_int_equal(m->weight_bytes, bytes * sizeof(float));
}

/* Every rank of every (tp, pp) of {1, 2, 4} x {1, 2} against the full model. */
static void check_all_layouts(const char *dir)
{
    static const uint32_t tps[] = {1, 2, 4}, pps[] = {1, 2};
    gang_topology t1 = fx_topo(dir, 1, 1);
    gang_model *full = fx_load_ok(dir, &t1, 0);
    size_t a, b;
    uint32_t r;

    for (a = 0; a < 3; a++) {
        for (b = 0; b < 2; b++) {
            gang_topology t = fx_topo(dir, tps[a], pps[b]);

            for (r = 0; r < t.world_size; r++) {
                gang_model *m = fx_load_ok(dir, &t, r);

                check_shard(full, &t, r, m);
                gang_model_free(m);
            }
        }
    }
    gang_model_free(full);
}

static void test_load_layouts(void **state)
{
    static const gang_model_arch archs[] = {GANG_ARCH_LLAMA, GANG_ARCH_QWEN2, GANG_ARCH_MISTRAL,
                                            GANG_ARCH_QWEN3};
    char *dir = fx_tmpdir();
    size_t i;
    (void)state;

    for (i = 0; i < 4; i++) {
        gang_mkmodel_opts o = fx_small_opts(dir, archs[i]);
        gang_topology t1;
        gang_model *full;

        o.tie_embeddings = i == 1; /* Qwen2 small models tie the head */
        if (archs[i] == GANG_ARCH_QWEN3) {
            /* q width 4 x 24 = 96 over hidden 64, and a scaled RoPE table. */
            o.head_dim = 24;
            o.rope_scaling = "{\"rope_type\": \"yarn\", \"factor\": 4.0}";
        }
        fx_make_model(&o);
        t1 = fx_topo(dir, 1, 1);
        full = fx_load_ok(dir, &t1, 0);
        assert_int_equal(full->cfg.arch, archs[i]);
        assert_int_equal(full->cfg.attn_bias, archs[i] == GANG_ARCH_QWEN2);
        assert_int_equal(full->cfg.qk_norm, archs[i] == GANG_ARCH_QWEN3);
        check_full_against_file(dir, full);
        gang_model_free(full);
        check_all_layouts(dir);
    }
    fx_rmtree(dir);
}

/* F16 and BF16 files load as the exact conversion of their bits, close to the f32 model. */
static void test_load_half(void **state)
{
    static const gang_dtype dts[] = {GANG_DTYPE_F16, GANG_DTYPE_BF16};
    char *dir = fx_tmpdir(), *d32 = fx_tmpdir();
    gang_mkmodel_opts o = fx_small_opts(d32, GANG_ARCH_QWEN2);
    gang_topology t1;
    gang_model *ref, *m;
    size_t i, k, n;
    (void)state;

    fx_make_model(&o);
    t1 = fx_topo(d32, 1, 1);
    ref = fx_load_ok(d32, &t1, 0);
    for (i = 0; i < 2; i++) {
        double tol = dts[i] == GANG_DTYPE_F16 ? 1.0 / 1024 : 1.0 / 128;

        o.out_dir = dir;
        o.dtype = dts[i];
        fx_make_model(&o);
        m = fx_load_ok(dir, &t1, 0);
        assert_int_equal(m->cfg.dtype, dts[i]);
        check_full_against_file(dir, m);
        n = (size_t)m->cfg.vocab * m->cfg.hidden;
        for (k = 0; k < n; k++)
            assert_true(fabs(((float *)m->embed)[k] - ((float *)ref->embed)[k]) <=
                        tol * fabs(((float *)ref->embed)[k]) + 1e-6);
        n = (size_t)m->cfg.ffn * m->cfg.hidden;
        for (k = 0; k < n; k++)
            assert_true(
                fabs(((float *)m->layers[2].w_down)[k] - ((float *)ref->layers[2].w_down)[k]) <=
                tol * fabs(((float *)ref->layers[2].w_down)[k]) + 1e-7);
        gang_model_free(m);
        check_all_layouts(dir);
    }
    gang_model_free(ref);
    fx_rmtree(dir);
    fx_rmtree(d32);
}

/*
 * gang_model_pack: a loaded f32 model packed to bf16 holds exactly what the loader's bf16
 * storage holds (the same bytes and byte count); packing is idempotent, refuses another
 * packed type, a non-storage, NULL and a device model; a non-finite weight leaves the
 * embedding table, LM head and wtype as they were; a tied head on a TP rank is the packed
 * table's rows (int8: data and scales).
 */
static void test_model_pack(void **state)
{
    char *dir = fx_tmpdir(), err[256];
    gang_mkmodel_opts o = fx_small_opts(dir, GANG_ARCH_LLAMA);
    gang_load_options bf = {.dtype = "bf16"};
    gang_topology t1;
    gang_model *m, *want;
    size_t f32_bytes, tbytes, hbytes;
    void *embed;
    (void)state;

    fx_make_model(&o);
    t1 = fx_topo(dir, 1, 1);
    m = fx_load_ok(dir, &t1, 0);
    assert_int_equal(gang_model_load_ex(dir, &t1, 0, &bf, &want, err, sizeof(err)), 0);
    f32_bytes = m->weight_bytes;
    assert_int_equal(gang_model_pack(m, GANG_KW_F32), 0); /* nothing to do */
    assert_int_equal(m->weight_bytes, f32_bytes);
    assert_int_equal(gang_model_pack(m, GANG_KW_BF16), 0);
    assert_int_equal(m->wtype, GANG_KW_BF16);
    assert_int_equal(m->layers[1].wtype, GANG_KW_BF16);
    assert_int_equal(m->weight_bytes, want->weight_bytes);
    assert_true(m->weight_bytes < f32_bytes);
    tbytes = gang_kernels_weight_bytes(GANG_KW_BF16, m->cfg.vocab, m->cfg.hidden);
    hbytes = gang_kernels_weight_bytes(GANG_KW_BF16, m->shard.vocab_count, m->cfg.hidden);
    assert_memory_equal(m->embed, want->embed, tbytes);
    assert_memory_equal(m->lm_head, want->lm_head, hbytes);
    assert_memory_equal(m->layers[1].w_down, want->layers[1].w_down,
                        gang_kernels_weight_bytes(GANG_KW_BF16, m->cfg.hidden, m->cfg.ffn));
    assert_int_equal(gang_model_pack(m, GANG_KW_BF16), 0); /* already */
    assert_int_equal(m->weight_bytes, want->weight_bytes);
    assert_int_equal(gang_model_pack(m, GANG_KW_I8), GANG_EINVAL); /* bf16 -> int8 */
    assert_int_equal(gang_model_pack(m, (gang_kernels_wtype)9), GANG_EINVAL);
    assert_int_equal(gang_model_pack(NULL, GANG_KW_BF16), GANG_EINVAL);
    gang_model_free(m);
    gang_model_free(want);

    /* A non-finite weight in the LM head: int8 cannot hold it; the ends stay f32. */
    m = fx_load_ok(dir, &t1, 0);
    ((float *)m->lm_head)[3] = NAN;
    embed = m->embed;
    f32_bytes = m->weight_bytes;
    assert_int_equal(gang_model_pack(m, GANG_KW_I8), GANG_EINVAL);
    assert_int_equal(m->wtype, GANG_KW_F32);
    assert_ptr_equal(m->embed, embed);
    assert_true(isnan(((float *)m->lm_head)[3]));
    assert_true(m->weight_bytes < f32_bytes); /* the layers did pack, and are counted so */
    assert_int_equal(m->layers[0].wtype, GANG_KW_I8);
    /* A model on a device (m->mem) is refused before anything changes. */
    m->mem = (gang_kernels *)(uintptr_t)1;
    assert_int_equal(gang_model_pack(m, GANG_KW_BF16), GANG_EINVAL);
    m->mem = NULL;
    gang_model_free(m);

    /* Tied, TP rank 1 of 2: the int8 head is the packed table's rows from vocab_first on,
     * data and scales, exactly what packing those rows alone gives; held once. */
    o.tie_embeddings = 1;
    fx_make_model(&o);
    {
        gang_topology t2 = fx_topo(dir, 2, 1);
        gang_load_options q8 = {.quantize = "int8"};
        size_t h = o.hidden, rows, first;
        float *copy;
        void *blob;
        gang_kernels_weight v, w;

        m = fx_load_ok(dir, &t2, 1);
        rows = m->shard.vocab_count, first = m->shard.vocab_first;
        assert_true(first > 0 && m->lm_head_tied);
        copy = malloc(rows * h * sizeof(float));
        blob = malloc(gang_kernels_weight_bytes(GANG_KW_I8, rows, h));
        assert_non_null(copy);
        assert_non_null(blob);
        memcpy(copy, m->lm_head, rows * h * sizeof(float));
        assert_int_equal(gang_kernels_weight_pack(GANG_KW_I8, copy, rows, h, blob), 0);
        assert_int_equal(gang_model_pack(m, GANG_KW_I8), 0);
        v = gang_model_head(m);
        w = gang_kernels_weight_view(GANG_KW_I8, blob, rows, h);
        assert_int_equal(v.type, GANG_KW_I8);
        assert_ptr_equal(v.data, m->lm_head);
        assert_memory_equal(v.data, w.data, rows * h);
        assert_memory_equal(v.scales, w.scales, rows * sizeof(float));
        assert_int_equal(gang_model_load_ex(dir, &t2, 1, &q8, &want, err, sizeof(err)), 0);
        assert_int_equal(m->weight_bytes, want->weight_bytes);
        gang_model_free(want);
        gang_model_free(m);
        free(copy);
        free(blob);
    }
    fx_rmtree(dir);
}

static void assert_models_equal(const gang_model *a, const gang_model *b)
{
    const gang_model_config *c = &a->cfg;
    size_t h = c->hidden, qn = (size_t)a->shard.head_count * c->head_dim;
    size_t kn = (size_t)a->shard.kv_head_count * c->head_dim, fn = a->shard.ffn_count;
    uint32_t i;

    assert_int_equal(a->layer_count, b->layer_count);
    assert_int_equal(a->weight_bytes, b->weight_bytes);
    for (i = 0; i < a->layer_count; i++) {
        const gang_tp_layer *x = &a->layers[i], *y = &b->layers[i];

        assert_floats_equal(x->attn_norm, y->attn_norm, h);
        assert_floats_equal(x->wq, y->wq, qn * h);
        assert_floats_equal(x->wk, y->wk, kn * h);
        assert_floats_equal(x->wv, y->wv, kn * h);
        assert_floats_equal(x->wo, y->wo, h * qn);
        assert_floats_equal(x->bq, y->bq, qn);
        assert_floats_equal(x->bk, y->bk, kn);
        assert_floats_equal(x->bv, y->bv, kn);
        assert_floats_equal(x->mlp_norm, y->mlp_norm, h);
        assert_floats_equal(x->w_gate, y->w_gate, fn * h);
        assert_floats_equal(x->w_up, y->w_up, fn * h);
        assert_floats_equal(x->w_down, y->w_down, h * fn);
    }
    if (a->embed != NULL || b->embed != NULL)
        assert_floats_equal(a->embed, b->embed, (size_t)c->vocab * h);
    if (a->lm_head != NULL || b->lm_head != NULL) {
        assert_floats_equal(a->final_norm, b->final_norm, h);
        assert_floats_equal(a->lm_head, b->lm_head, (size_t)a->shard.vocab_count * h);
    }
}

static void test_load_sharded(void **state)
{
    char *one = fx_tmpdir(), *many = fx_tmpdir();
    gang_mkmodel_opts o = fx_small_opts(one, GANG_ARCH_QWEN2);
    gang_topology t;
    uint32_t r;
    (void)state;

    o.dtype = GANG_DTYPE_BF16;
    fx_make_model(&o);
    o.out_dir = many;
    o.shards = 5;
    fx_make_model(&o);
    t = fx_topo(one, 2, 2);
    for (r = 0; r < t.world_size; r++) {
        gang_model *a = fx_load_ok(one, &t, r), *b = fx_load_ok(many, &t, r);

        assert_models_equal(a, b);
        gang_model_free(a);
        gang_model_free(b);
    }
    fx_rmtree(one);
    fx_rmtree(many);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_config_good),
        cmocka_unit_test(test_config_bad),
        cmocka_unit_test(test_config_rope),
        cmocka_unit_test(test_config_head_dim_qwen3),
        cmocka_unit_test(test_config_eos_and_generation),
        cmocka_unit_test(test_mkmodel_deterministic),
        cmocka_unit_test(test_load_layouts),
        cmocka_unit_test(test_load_half),
        cmocka_unit_test(test_load_sharded),
        cmocka_unit_test(test_model_pack),
        cmocka_unit_test(test_load_corrupted),
        cmocka_unit_test(test_load_layout_refusals),
        cmocka_unit_test(test_load_peak_rss),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
