/*
 * Tests of the launcher's configs (launcher/layout.c) and of flag forwarding
 * (gang_params_forward_args): the forwarded set is the registry's GANG_PARAM_FWD column,
 * local mode and the supervisor build their children's flags with the same function, the
 * flags read back to the same parameters, and the layout's rules (context cap, split
 * checks) are the ones every process applies.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "agent.h"
#include "launcher-tests.h"
#include "layout.h"
#include "local.h"
#include "worker.h"

/* The only flags a process keeps to itself; a new NOFWD flag must be added here on purpose. */
static const char *const not_forwarded[] = {"local", "dp", "check-config", NULL};

static int in_list(const char *flag, const char *const *list)
{
    for (; list && *list; list++) {
        if (strcmp(flag, *list) == 0)
            return 1;
    }
    return 0;
}

/* Index of "--flag=" in args, or -1. */
static int find_arg(const gang_args *a, const char *flag)
{
    size_t len = strlen(flag);
    for (int i = 0; i < a->argc; i++) {
        if (strncmp(a->argv[i], "--", 2) == 0 && strncmp(a->argv[i] + 2, flag, len) == 0 &&
            a->argv[i][2 + len] == '=')
            return i;
    }
    return -1;
}

/* Every registry entry is forwarded exactly when its attribute says so. */
static void test_forwarded_set_is_the_attribute(void **state)
{
    (void)state;
    gang_params p;
    gang_args a;
    size_t n = 0;
    const gang_param_info *reg = gang_params_registry(&n);
    gang_params_defaults(&p);
    assert_int_equal(gang_params_forward_args(&p, NULL, &a), 0);
    int fwd = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned attr = gang_param_attr(&reg[i]);
        assert_true(attr == GANG_PARAM_FWD || attr == GANG_PARAM_NOFWD);
        if ((attr == GANG_PARAM_NOFWD) != in_list(reg[i].flag, not_forwarded))
            fail_msg("--%s: attribute %u disagrees with the test's list of local flags",
                     reg[i].flag, attr);
        int at = find_arg(&a, reg[i].flag);
        if ((attr == GANG_PARAM_FWD) != (at >= 0))
            fail_msg("--%s: attribute %u but %s in the forwarded flags", reg[i].flag, attr,
                     at >= 0 ? "present" : "absent");
        fwd += attr == GANG_PARAM_FWD;
    }
    assert_int_equal(a.argc, fwd);
    assert_null(a.argv[a.argc]);
    /* An entry of another option table is never forwarded. */
    gang_param_info other = reg[0];
    assert_int_equal(gang_param_attr(&other), GANG_PARAM_NOFWD);
    gang_args_free(&a);
    assert_null(a.argv);
}

/* Sets every forwarded entry of p to a value other than its default. */
static void set_non_defaults(gang_params *p)
{
    size_t n = 0;
    const gang_param_info *reg = gang_params_registry(&n);
    for (size_t i = 0; i < n; i++) {
        char *base = (char *)p + reg[i].offset;
        switch (reg[i].type) {
        case GANG_PARAM_INT: {
            int64_t *v = (int64_t *)(void *)base;
            *v = *v == reg[i].hi ? reg[i].lo : reg[i].hi - (int64_t)(i % 3);
            break;
        }
        case GANG_PARAM_BOOL:
            *(int *)(void *)base = !*(int *)(void *)base;
            break;
        case GANG_PARAM_STR:
            /* Spaces, '=', a leading "--": values travel as one "--flag=value" argument. */
            snprintf(base, GANG_PARAM_STR_MAX, "--x=%zu a b=c", i);
            break;
        case GANG_PARAM_DOUBLE:
            break;
        }
    }
}

/* params -> forwarded flags -> parse -> the same values for every forwarded entry. */
static void test_forward_round_trip(void **state)
{
    (void)state;
    gang_params src, dst, def;
    gang_args a;
    char err[256];
    size_t n = 0;
    const gang_param_info *reg = gang_params_registry(&n);
    gang_params_defaults(&src);
    gang_params_defaults(&def);
    set_non_defaults(&src);
    assert_int_equal(gang_params_forward_args(&src, NULL, &a), 0);
    gang_params_defaults(&dst);
    assert_int_equal(gang_params_parse_args(&dst, a.argc, a.argv, NULL, NULL, err, sizeof(err)), 0);
    for (size_t i = 0; i < n; i++) {
        size_t size = reg[i].type == GANG_PARAM_STR    ? GANG_PARAM_STR_MAX
                      : reg[i].type == GANG_PARAM_BOOL ? sizeof(int)
                                                       : sizeof(int64_t);
        const gang_params *want = gang_param_attr(&reg[i]) == GANG_PARAM_FWD ? &src : &def;
        if (memcmp((const char *)&dst + reg[i].offset, (const char *)want + reg[i].offset, size) !=
            0)
            fail_msg("--%s did not survive the round trip", reg[i].flag);
    }
    gang_args_free(&a);

    /* A copy is independent of its source. */
    gang_args b;
    assert_int_equal(gang_params_forward_args(&def, NULL, &a), 0);
    assert_int_equal(gang_args_copy(&a, &b), 0);
    assert_int_equal(a.argc, b.argc);
    for (int i = 0; i < a.argc; i++)
        assert_string_equal(a.argv[i], b.argv[i]);
    gang_args_free(&a);
    assert_null(b.argv[b.argc]);
    gang_args_free(&b);
}

/*
 * Local mode's shared agent flags and the supervisor's worker flags come from the same
 * function: local's are the forwarded flags minus the per-agent ones, in the same order.
 */
static void test_local_and_supervisor_share_forwarding(void **state)
{
    (void)state;
    gang_params p;
    gang_args all, local;
    gang_params_defaults(&p);
    set_non_defaults(&p);
    assert_int_equal(gang_params_forward_args(&p, NULL, &all), 0);
    assert_int_equal(gang__local_agent_args(&p, &local), 0);
    int j = 0;
    for (int i = 0; i < all.argc; i++) {
        const char *f = all.argv[i] + 2;
        size_t len = strcspn(f, "=");
        int per_agent = 0;
        for (const char *const *q = gang__local_per_agent_flags; *q; q++)
            per_agent |= strlen(*q) == len && strncmp(*q, f, len) == 0;
        if (per_agent)
            continue;
        assert_true(j < local.argc);
        assert_string_equal(all.argv[i], local.argv[j]);
        j++;
    }
    assert_int_equal(j, local.argc);
    assert_int_equal(find_arg(&local, "local"), -1);
    assert_int_equal(find_arg(&local, "node-index"), -1);
    gang_args_free(&all);
    gang_args_free(&local);

    /* The agent's supervisor config carries exactly the forwarded flags of the prepared
     * parameters (a gang of one: the identity needs no discovery). */
    char *envp[] = {NULL};
    char err[512];
    gang_agent_config cfg;
    gang_params_defaults(&p);
    p.node_index = 0;
    gang_strlcpy(p.bind_address, "127.0.0.1", sizeof(p.bind_address));
    gang_strlcpy(p.termination_log, "", sizeof(p.termination_log));
    int rc = gang_agent_config_from_params(&p, envp, &cfg, err, sizeof(err));
    if (rc != 0)
        fail_msg("agent config: %s", err);
    gang_identity id;
    assert_int_equal(gang_agent_prepare(&p, envp, &id, err, sizeof(err)), 0);
    assert_int_equal(gang_params_forward_args(&p, NULL, &all), 0);
    assert_int_equal(cfg.sup.worker_args.argc, all.argc);
    for (int i = 0; i < all.argc; i++)
        assert_string_equal(cfg.sup.worker_args.argv[i], all.argv[i]);
    assert_int_equal(cfg.sup.nproc_per_node, 1);
    assert_int_equal(cfg.sup.abort_timeout_ms, (uint64_t)p.abort_timeout_ms);
    assert_int_equal(cfg.api.max_queue, (uint32_t)p.max_queue);
    assert_int_equal(cfg.api.has_model, 0);
    assert_int_equal(cfg.restart_window_ms, (uint64_t)p.restart_window_s * 1000);
    assert_string_equal(cfg.advertise_address, "127.0.0.1");
    gang_args_free(&all);
    gang_agent_config_free(&cfg);
}

/* The API's model name: --served-model-name, else the base name of --model. */
static void test_served_model_name(void **state)
{
    (void)state;
    static const struct {
        const char *model, *served, *want;
    } cases[] = {
        {"/models/Llama-3.2-1B", "", "Llama-3.2-1B"},
        {"/models/llama//", "", "llama"},
        {"tiny", "", "tiny"},
        {"/", "", "/"},
        {"", "", ""},
        {"/models/llama", "my-llama", "my-llama"},
        {"", "no-model", "no-model"},
    };
    gang_params p;
    char out[GANG_PARAM_STR_MAX];
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        gang_params_defaults(&p);
        gang_strlcpy(p.model, cases[i].model, sizeof(p.model));
        gang_strlcpy(p.served_model_name, cases[i].served, sizeof(p.served_model_name));
        gang__served_model_name(&p, out, sizeof(out));
        assert_string_equal(out, cases[i].want);
    }
    gang_params_defaults(&p);
    gang_strlcpy(p.model, "/m/abcdef", sizeof(p.model));
    gang__served_model_name(&p, out, 4);
    assert_string_equal(out, "abc");

    /* The agent's API config carries it (a gang of one without a model). */
    char *envp[] = {NULL};
    char err[512];
    gang_agent_config cfg;
    gang_params_defaults(&p);
    p.node_index = 0;
    gang_strlcpy(p.bind_address, "127.0.0.1", sizeof(p.bind_address));
    gang_strlcpy(p.termination_log, "", sizeof(p.termination_log));
    gang_strlcpy(p.served_model_name, "served", sizeof(p.served_model_name));
    if (gang_agent_config_from_params(&p, envp, &cfg, err, sizeof(err)) != 0)
        fail_msg("agent config: %s", err);
    assert_string_equal(cfg.api.model, "served");
    gang_agent_config_free(&cfg);
}

/* A worker's config is derived from what the supervisor forwards. */
static void test_worker_config(void **state)
{
    (void)state;
    gang_params p;
    gang_worker_config wc;
    char err[256];
    gang_params_defaults(&p);
    p.node_index = 2;
    p.nproc_per_node = 4;
    p.nnodes = 3;
    p.kv_cache_mb = 3;
    gang_strlcpy(p.device, "auto", sizeof(p.device));
    assert_int_equal(gang_worker_config_from_params(&p, "/tmp/a.sock", 1, &wc, err, sizeof(err)),
                     0);
    assert_string_equal(wc.agent_path, "/tmp/a.sock");
    assert_int_equal(wc.local_rank, 1);
    assert_int_equal(wc.node, 2);
    assert_int_equal(wc.nproc_per_node, 4);
    assert_string_equal(wc.advertise, "127.0.0.1");
    assert_string_equal(wc.res.layout.device, "cpu");
    assert_int_equal(wc.res.layout.tc.nnodes, 3);
    assert_int_equal(wc.res.kv_cache_bytes, 3u << 20);
    assert_int_equal(wc.res.layout.uses_nccl, 0);
    assert_string_equal(wc.nvml_library, "");
    assert_int_equal(wc.gpu_health_interval_ms, 1000);
    assert_int_equal(wc.gpu_bind, 1);
    p.gpu_bind = 0;
    p.gpu_health_interval_ms = 250;
    gang_strlcpy(p.nvml_library, "/opt/libfake.so", sizeof(p.nvml_library));
    assert_int_equal(gang_worker_config_from_params(&p, "/tmp/a.sock", 1, &wc, err, sizeof(err)),
                     0);
    assert_string_equal(wc.nvml_library, "/opt/libfake.so");
    assert_int_equal(wc.gpu_health_interval_ms, 250);
    assert_int_equal(wc.gpu_bind, 0);
    gang_strlcpy(p.log_level, "loud", sizeof(p.log_level));
    assert_int_equal(gang_worker_config_from_params(&p, "/tmp/a.sock", 1, &wc, err, sizeof(err)),
                     GANG_EUSAGE);
    gang_strlcpy(p.log_level, "info", sizeof(p.log_level));
    assert_int_equal(gang_worker_config_from_params(&p, "", 1, &wc, err, sizeof(err)), GANG_EUSAGE);
}

/* Writes a small Llama config.json with max_position_embeddings max_pos into dir. */
static void write_model_config(const char *dir, unsigned max_pos)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fprintf(f,
            "{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 64,"
            "\"intermediate_size\": 128, \"num_attention_heads\": 4,"
            "\"num_hidden_layers\": 4, \"vocab_size\": 256,"
            "\"max_position_embeddings\": %u, \"rms_norm_eps\": 1e-5}",
            max_pos);
    fclose(f);
}

/* The layout's rules: the backend, the split's arithmetic, and the context cap. */
/* The KV cache type a worker with layout l runs for weights stored as wt: its engine
 * set-up (gang__wres_engine_setup) through the shared rule (gang_engine_setup_config). */
static gang_dtype layout_kv_dtype(const gang_layout *l, gang_kernels_wtype wt)
{
    gang__wres_config c;
    gang_engine_setup s;
    gang_engine_config ec;

    memset(&c, 0, sizeof(c));
    c.layout = *l;
    gang__wres_engine_setup(&c, &s);
    gang_engine_setup_config(&s, wt, 1u << 20, &ec);
    return ec.kv_dtype;
}

static void test_layout_rules(void **state)
{
    (void)state;
    gang_params p;
    gang_layout l;
    char err[512], dir[] = "/tmp/gang-test-layout-XXXXXX";
    assert_non_null(mkdtemp(dir));
    gang_params_defaults(&p);
    gang_strlcpy(p.backend, "mpi", sizeof(p.backend));
    assert_int_equal(gang_layout_from_params(&p, &l, err, sizeof(err)), GANG_EUSAGE);
    gang_strlcpy(p.backend, "auto", sizeof(p.backend));
    p.tp = 2;
    assert_int_equal(gang_layout_from_params(&p, &l, err, sizeof(err)), GANG_EUSAGE);
    assert_non_null(strstr(err, "--tp 2 x --pp 1"));
    p.nproc_per_node = 2;
    assert_int_equal(gang_layout_from_params(&p, &l, err, sizeof(err)), 0);
    assert_int_equal(l.kv_dtype, GANG_DTYPE_F32); /* auto: f32 while the weights are */
    const struct {
        const char *name;
        gang_dtype dt;
    } kvd[] = {{"f32", GANG_DTYPE_F32}, {"bf16", GANG_DTYPE_BF16}, {"f16", GANG_DTYPE_F16}};
    for (size_t i = 0; i < sizeof(kvd) / sizeof(kvd[0]); i++) {
        gang_strlcpy(p.kv_cache_dtype, kvd[i].name, sizeof(p.kv_cache_dtype));
        assert_int_equal(gang_layout_from_params(&p, &l, err, sizeof(err)), 0);
        assert_int_equal(l.kv_dtype, kvd[i].dt);
    }
    gang_strlcpy(p.kv_cache_dtype, "fp8", sizeof(p.kv_cache_dtype));
    assert_int_equal(gang_layout_from_params(&p, &l, err, sizeof(err)), GANG_EUSAGE);
    assert_non_null(strstr(err, "--kv-cache-dtype fp8"));
    gang_strlcpy(p.kv_cache_dtype, "auto", sizeof(p.kv_cache_dtype));
    /* auto follows the weights' storage once it is known: half weights, half cache. */
    assert_int_equal(gang_layout_from_params(&p, &l, err, sizeof(err)), 0);
    assert_int_equal(layout_kv_dtype(&l, GANG_KW_F32), GANG_DTYPE_F32);
    assert_int_equal(layout_kv_dtype(&l, GANG_KW_BF16), GANG_DTYPE_BF16);
    assert_int_equal(layout_kv_dtype(&l, GANG_KW_F16), GANG_DTYPE_F16);
    assert_int_equal(layout_kv_dtype(&l, GANG_KW_I8), GANG_DTYPE_F32);
    gang_strlcpy(p.kv_cache_dtype, "f32", sizeof(p.kv_cache_dtype));
    assert_int_equal(gang_layout_from_params(&p, &l, err, sizeof(err)), 0);
    assert_int_equal(layout_kv_dtype(&l, GANG_KW_BF16), GANG_DTYPE_F32); /* as asked */
    gang_strlcpy(p.kv_cache_dtype, "auto", sizeof(p.kv_cache_dtype));
    /* --dtype and --quantize: the listed values, the rest refused with the flag named. */
    assert_string_equal(l.dtype, "auto");
    assert_string_equal(l.quantize, "none");
    gang_strlcpy(p.dtype, "bf16", sizeof(p.dtype));
    gang_strlcpy(p.quantize, "int8", sizeof(p.quantize));
    assert_int_equal(gang_layout_from_params(&p, &l, err, sizeof(err)), 0);
    assert_string_equal(l.dtype, "bf16");
    assert_string_equal(l.quantize, "int8");
    gang_strlcpy(p.dtype, "fp8", sizeof(p.dtype));
    assert_int_equal(gang_layout_from_params(&p, &l, err, sizeof(err)), GANG_EUSAGE);
    assert_non_null(strstr(err, "--dtype fp8"));
    gang_strlcpy(p.dtype, "auto", sizeof(p.dtype));
    gang_strlcpy(p.quantize, "int4", sizeof(p.quantize));
    assert_int_equal(gang_layout_from_params(&p, &l, err, sizeof(err)), GANG_EUSAGE);
    assert_non_null(strstr(err, "--quantize int4"));
    gang_strlcpy(p.quantize, "none", sizeof(p.quantize));

    gang_strlcpy(p.model, dir, sizeof(p.model));
    write_model_config(dir, 8192);
    /* Issue #27 (b): the model's declared context when one full sequence fits. One
     * position takes 4 layers x K,V x 2 kv heads (of 4, tp 2) x 16 x 4 bytes = 1 KiB, so
     * 8192 positions take 8 MiB. */
    assert_int_equal(gang_layout_check(&p, &l, err, sizeof(err)), 0);
    assert_int_equal(l.ctx, 8192); /* free memory holds 8 MiB */
    assert_non_null(strstr(l.ctx_why, "declared context"));
    assert_int_equal(l.tc.n_layers, 4);
    assert_int_equal(l.tc.tp, 2);
    p.kv_cache_mb = 8;
    assert_int_equal(gang_layout_check(&p, &l, err, sizeof(err)), 0);
    assert_int_equal(l.ctx, 8192); /* exactly one sequence */
    p.kv_cache_mb = 3;
    assert_int_equal(gang_layout_check(&p, &l, err, sizeof(err)), 0);
    assert_int_equal(l.ctx, 3072); /* the longest that fits, in whole blocks */
    assert_non_null(strstr(l.ctx_why, "lowered from the model's 8192"));
    assert_non_null(strstr(l.ctx_why, "--kv-cache-mb"));
    gang_strlcpy(p.kv_cache_dtype, "bf16", sizeof(p.kv_cache_dtype));
    assert_int_equal(gang_layout_check(&p, &l, err, sizeof(err)), 0);
    assert_int_equal(l.ctx, 6144); /* 2-byte elements: twice the positions */
    gang_strlcpy(p.kv_cache_dtype, "auto", sizeof(p.kv_cache_dtype));
    p.kv_cache_mb = 0;
    gang_strlcpy(p.device, "cuda", sizeof(p.device));
    assert_int_equal(gang_layout_check(&p, &l, err, sizeof(err)), 0);
    assert_int_equal(l.ctx, GANG_LAYOUT_CTX_CAP); /* the device's budget is unknown here */
    assert_non_null(strstr(l.ctx_why, "known only after load"));
    gang_strlcpy(p.device, "auto", sizeof(p.device));
    p.max_ctx = 6000;
    assert_int_equal(gang_layout_check(&p, &l, err, sizeof(err)), 0);
    assert_int_equal(l.ctx, 6000); /* asked for */
    assert_non_null(strstr(l.ctx_why, "--max-ctx 6000"));
    p.max_ctx = 9000;
    assert_int_equal(gang_layout_check(&p, &l, err, sizeof(err)), GANG_EUSAGE);
    p.max_ctx = 0;
    write_model_config(dir, 2048);
    gang_model_config mc;
    uint32_t ctx = 0;
    char why[256];
    assert_int_equal(gang_agent_check_layout(&p, &mc, &ctx, why, sizeof(why), err, sizeof(err)), 0);
    assert_int_equal(ctx, 2048); /* the model's own, below the cap */
    assert_int_equal(mc.max_pos, 2048);
    p.tp = 8;
    p.nproc_per_node = 8;
    assert_int_equal(gang_layout_check(&p, &l, err, sizeof(err)), GANG_EUSAGE); /* 4 heads */

    char path[600];
    snprintf(path, sizeof(path), "%s/config.json", dir);
    unlink(path);
    p.tp = 1;
    p.nproc_per_node = 1;
    assert_int_equal(gang_layout_check(&p, &l, err, sizeof(err)), GANG_EMODEL);
    rmdir(dir);
}

/* Writes a small Qwen2-MoE config.json (8 experts top 2, a shared expert of width 36)
 * into dir, or a dense Llama one when moe is 0. */
static void write_moe_config(const char *dir, int moe)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    if (moe)
        fprintf(f, "{\"architectures\": [\"Qwen2MoeForCausalLM\"], \"hidden_size\": 64,"
                   "\"intermediate_size\": 128, \"num_attention_heads\": 4,"
                   "\"num_key_value_heads\": 2, \"num_hidden_layers\": 2, \"vocab_size\": 256,"
                   "\"max_position_embeddings\": 512, \"rms_norm_eps\": 1e-5,"
                   "\"num_experts\": 8, \"num_experts_per_tok\": 2,"
                   "\"moe_intermediate_size\": 32, \"shared_expert_intermediate_size\": 36,"
                   "\"norm_topk_prob\": false, \"decoder_sparse_step\": 1,"
                   "\"mlp_only_layers\": []}");
    else
        fprintf(f, "{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 64,"
                   "\"intermediate_size\": 128, \"num_attention_heads\": 4,"
                   "\"num_hidden_layers\": 4, \"vocab_size\": 256,"
                   "\"max_position_embeddings\": 512, \"rms_norm_eps\": 1e-5}");
    fclose(f);
}

/* One --ep / --tp / --pp shape of a gang of pp nodes x nproc ranks: the layout's answer
 * (its topology in *t when accepted, the message in err). */
static int layout_ep(const char *dir, int64_t ep, int64_t tp, int64_t pp, int64_t nproc,
                     gang_topology *t, char *err, size_t errlen)
{
    gang_params p;
    gang_layout l;
    gang_params_defaults(&p);
    gang_strlcpy(p.model, dir, sizeof(p.model));
    p.ep = ep;
    p.tp = tp;
    p.pp = pp;
    p.nnodes = pp;
    p.nproc_per_node = nproc;
    int rc = gang_layout_from_params(&p, &l, err, errlen);
    return rc != 0 ? rc : gang_layout_read_model(&l, t, err, errlen);
}

/* --ep wider than --tp (issue #25): the world is ep x pp with tp replicated ep / tp times
 * in a stage; what stays unsupported is refused with a message that says why. */
static void test_layout_ep(void **state)
{
    (void)state;
    char err[512], dir[] = "/tmp/gang-test-layout-ep-XXXXXX";
    gang_topology t;
    assert_non_null(mkdtemp(dir));
    write_moe_config(dir, 1);
    const struct {
        int64_t ep, tp, pp, nproc;
        uint32_t world, replicas;
    } ok[] = {{1, 1, 1, 1, 1, 1}, {2, 2, 1, 2, 2, 1}, {1, 2, 1, 2, 2, 1}, {2, 1, 1, 2, 2, 2},
              {4, 1, 1, 4, 4, 4}, {2, 1, 2, 2, 4, 2}, {4, 2, 1, 4, 4, 2}};
    for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
        int rc = layout_ep(dir, ok[i].ep, ok[i].tp, ok[i].pp, ok[i].nproc, &t, err, sizeof(err));
        if (rc != 0)
            print_error("ep %lld tp %lld pp %lld: %s\n", (long long)ok[i].ep, (long long)ok[i].tp,
                        (long long)ok[i].pp, err);
        assert_int_equal(rc, 0);
        assert_int_equal(t.world_size, ok[i].world);
        assert_int_equal(t.tp_replicas, ok[i].replicas);
    }
    const struct {
        int64_t ep, tp, pp, nproc;
        const char *why;
    } bad[] = {
        {2, 1, 1, 1, "--ep 2 x --pp 1 = 2 ranks"},       /* the world is ep x pp */
        {3, 2, 1, 3, "--ep 3 with --tp 2"},              /* not whole TP groups */
        {2, 4, 1, 4, "narrower than the TP group"},      /* 1 < ep < tp */
        {8, 1, 1, 8, "shared expert's width 36"},        /* 36 % 8: shared columns over EP */
        {16, 1, 1, 16, "does not divide the model's 8"}, /* experts over EP */
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        int rc =
            layout_ep(dir, bad[i].ep, bad[i].tp, bad[i].pp, bad[i].nproc, &t, err, sizeof(err));
        if (rc != GANG_EUSAGE || strstr(err, bad[i].why) == NULL)
            print_error("ep %lld tp %lld: rc %d '%s', expected '%s'\n", (long long)bad[i].ep,
                        (long long)bad[i].tp, rc, err, bad[i].why);
        assert_int_equal(rc, GANG_EUSAGE);
        assert_non_null(strstr(err, bad[i].why));
    }
    write_moe_config(dir, 0); /* a dense model takes only --ep 1 */
    assert_int_equal(layout_ep(dir, 2, 1, 1, 2, &t, err, sizeof(err)), GANG_EUSAGE);
    assert_non_null(strstr(err, "has no experts"));
    char path[600];
    snprintf(path, sizeof(path), "%s/config.json", dir);
    unlink(path);
    rmdir(dir);
}

int gang_test_config(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_forwarded_set_is_the_attribute),
        cmocka_unit_test(test_forward_round_trip),
        cmocka_unit_test(test_local_and_supervisor_share_forwarding),
        cmocka_unit_test(test_served_model_name),
        cmocka_unit_test(test_worker_config),
        cmocka_unit_test(test_layout_rules),
        cmocka_unit_test(test_layout_ep),
    };
    return cmocka_run_group_tests_name("config", tests, NULL, NULL);
}
