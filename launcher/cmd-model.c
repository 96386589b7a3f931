/*
 * ganglion mkmodel: writes a deterministic random model (gang_mkmodel) and prints a
 * one-line JSON summary. Its flags are local to the subcommand (they describe a model,
 * not the gang): an option table of its own, parsed by gang_opts_cli like every command.
 */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cmds.h"
#include "ganglion/common.h"
#include "ganglion/model.h"

#define MK_ARCHS "llama|mistral|qwen2|qwen3|gemma3" /* index order of gang_model_arch */
#define MK_DTYPES "f32|f16|bf16"                    /* index order of gang_dtype */
#define MK_MOES "none|mixtral|qwen2|qwen3"          /* index order of gang_moe_family */

/* The command line, as the option table fills it; mk_parse turns it into the library's
 * gang_mkmodel_opts. */
typedef struct mk_cli {
    char out[4096]; /* the library refuses a path of 4096 bytes or more anyway */
    char arch[16], dtype[8], rope_scaling[1100], rope_theta[32], moe[16];
    int64_t layers, hidden, heads, kv_heads, ffn, vocab, max_pos, seed, shards, eos, head_dim;
    int64_t experts, top_k, moe_ffn, shared_ffn, dense_layers;
    int tie, norm_topk;
} mk_cli;

#define MK_STR(f_, fld, d_, hp) GANG_OPT_STR(mk_cli, f_, fld, d_, hp)
#define MK_INT(f_, fld, d_, lo_, hi_, hp) GANG_OPT_INT(mk_cli, f_, fld, d_, lo_, hi_, hp)
static const gang_param_info mk_items[] = {
    MK_STR("out", out, "", "output directory, created if absent (required)"),
    MK_STR("arch", arch, "llama", "architecture: " MK_ARCHS),
    MK_INT("layers", layers, "2", 1, GANG_MODEL_MAX_LAYERS, "transformer layers"),
    MK_INT("hidden", hidden, "64", 1, GANG_MODEL_MAX_HIDDEN, "hidden size"),
    MK_INT("heads", heads, "4", 1, GANG_MODEL_MAX_HEADS, "attention heads (divide --hidden)"),
    MK_INT("kv-heads", kv_heads, "2", 1, GANG_MODEL_MAX_HEADS, "key/value heads (divide --heads)"),
    MK_INT("head-dim", head_dim, "0", 0, GANG_MODEL_MAX_HEAD_DIM,
           "per-head width (0: hidden / heads; else even)"),
    MK_STR("rope-scaling", rope_scaling, "",
           "config.json's rope_scaling, a JSON object (empty: null)"),
    MK_STR("rope-theta", rope_theta, "", "RoPE base (empty: 1e6 for qwen2/3, else 1e4)"),
    MK_INT("ffn", ffn, "128", 1, 1 << 20, "MLP intermediate size"),
    MK_INT("vocab", vocab, "256", 3, GANG_MODEL_MAX_VOCAB, "vocabulary size (bos 1)"),
    MK_INT("eos", eos, "-1", -1, GANG_MODEL_MAX_VOCAB - 1, "eos_token_id (-1: none)"),
    MK_INT("max-pos", max_pos, "512", 1, 1 << 24, "maximum position (context length)"),
    MK_INT("seed", seed, "1", 0, INT64_MAX, "weight seed: same options, same bytes"),
    MK_STR("dtype", dtype, "f32", "weight type: " MK_DTYPES),
    {.flag = "tie",
     .type = GANG_PARAM_BOOL,
     .def = "0",
     .hi = 1,
     .help = "tie the output head to the embeddings",
     .offset = offsetof(mk_cli, tie)},
    MK_INT("shards", shards, "1", 1, 99999,
           "weight files (> 1: model-0000i-of-0000n + index.json)"),
    MK_STR("moe", moe, "none",
           "mixture of experts: " MK_MOES " (mixtral needs --arch mistral, qwen2 / qwen3 "
           "their --arch)"),
    MK_INT("experts", experts, "8", 1, GANG_MOE_MAX_EXPERTS, "with --moe: experts per layer"),
    MK_INT("top-k", top_k, "2", 1, GANG_MOE_MAX_TOPK, "with --moe: experts per token"),
    MK_INT("moe-ffn", moe_ffn, "0", 0, 1 << 20,
           "with --moe: each expert's width (0: --ffn; mixtral: always --ffn)"),
    MK_INT("shared-ffn", shared_ffn, "0", 0, 1 << 20,
           "with --moe qwen2: the shared expert's width (0: none)"),
    MK_INT("dense-layers", dense_layers, "0", 0, GANG_MODEL_MAX_LAYERS,
           "with --moe qwen2 / qwen3: the first N layers dense (mlp_only_layers)"),
    {.flag = "norm-topk",
     .type = GANG_PARAM_BOOL,
     .def = "0",
     .hi = 1,
     .help = "with --moe qwen2 / qwen3: norm_topk_prob true (mixtral always renormalises)",
     .offset = offsetof(mk_cli, norm_topk)},
};
static const gang_opt_table mk_table = GANG_OPT_TABLE(mk_items);
static const gang_opt_cmd mk_cmd = {
    "mkmodel", "--out DIR [flags]",
    "Writes DIR/config.json and DIR/model.safetensors (or --shards N files and\n"
    "model.safetensors.index.json) of a random Llama-family model; the same options\n"
    "give byte-identical files.",
    &mk_table, 0};

/*
 * Parses the command line into the library's options o (o->out_dir points into cli).
 * Returns 0, GANG_OPTS_HELP, or GANG_EUSAGE after printing why.
 */
static int mk_parse(int argc, char **argv, mk_cli *cli, gang_mkmodel_opts *o)
{
    char err[256];
    int arch, dtype, moe;
    int rc = gang_opts_cli(&mk_cmd, cli, argc, argv, NULL, NULL);

    if (rc != 0)
        return rc;
    if (cli->out[0] == '\0')
        return gang_opts_usage_error(&mk_cmd, "--out DIR is required");
    arch = gang_opts_choice("arch", cli->arch, MK_ARCHS, err, sizeof(err));
    if (arch < 0)
        return gang_opts_usage_error(&mk_cmd, "%s", err);
    dtype = gang_opts_choice("dtype", cli->dtype, MK_DTYPES, err, sizeof(err));
    if (dtype < 0)
        return gang_opts_usage_error(&mk_cmd, "%s", err);
    memset(o, 0, sizeof(*o));
    o->out_dir = cli->out;
    o->arch = (gang_model_arch)arch;
    o->dtype = (gang_dtype)dtype;
    /* The table's bounds keep every value inside uint32_t. */
    o->layers = (uint32_t)cli->layers;
    o->hidden = (uint32_t)cli->hidden;
    o->heads = (uint32_t)cli->heads;
    o->kv_heads = (uint32_t)cli->kv_heads;
    o->ffn = (uint32_t)cli->ffn;
    o->vocab = (uint32_t)cli->vocab;
    o->max_pos = (uint32_t)cli->max_pos;
    o->seed = (uint64_t)cli->seed;
    o->tie_embeddings = cli->tie;
    o->shards = (uint32_t)cli->shards;
    o->head_dim = (uint32_t)cli->head_dim;
    o->rope_scaling = cli->rope_scaling[0] != '\0' ? cli->rope_scaling : NULL;
    if (cli->rope_theta[0] != '\0') {
        char *end;
        o->rope_theta = strtof(cli->rope_theta, &end);
        if (*end != '\0' || !(o->rope_theta > 0.0f))
            return gang_opts_usage_error(&mk_cmd, "--rope-theta must be a positive number");
    }
    moe = gang_opts_choice("moe", cli->moe, MK_MOES, err, sizeof(err));
    if (moe < 0)
        return gang_opts_usage_error(&mk_cmd, "%s", err);
    o->moe = (gang_moe_family)moe;
    o->experts = (uint32_t)cli->experts;
    o->top_k = (uint32_t)cli->top_k;
    o->moe_ffn = cli->moe_ffn > 0 ? (uint32_t)cli->moe_ffn : o->ffn;
    o->shared_ffn = (uint32_t)cli->shared_ffn;
    o->dense_layers = (uint32_t)cli->dense_layers;
    o->norm_topk = cli->norm_topk;
    if (cli->eos >= 0) {
        o->eos_ids[0] = (int32_t)cli->eos;
        o->n_eos = 1;
    }
    return 0;
}

/* Parameter count of the model config mc, as the file holds it. */
static uint64_t mkmodel_params(const gang_model_config *mc)
{
    uint64_t total = 0;

    gang_model_params(mc, &total, NULL);
    return total;
}

/* Total size of the weight files of o in bytes. */
static uint64_t mkmodel_bytes(const gang_mkmodel_opts *o)
{
    char path[4200];
    struct stat st;
    uint64_t total = 0;
    uint32_t s;

    for (s = 0; s < o->shards; s++) {
        if (o->shards == 1)
            snprintf(path, sizeof(path), "%s/model.safetensors", o->out_dir);
        else
            snprintf(path, sizeof(path), "%s/model-%05u-of-%05u.safetensors", o->out_dir, s + 1,
                     o->shards);
        if (stat(path, &st) == 0)
            total += (uint64_t)st.st_size;
    }
    return total;
}

/* Prints the one-line JSON summary of the model o wrote, whose config reads back as mc. */
static void mk_print_summary(const gang_mkmodel_opts *o, const gang_model_config *mc)
{
    printf("{\"dir\":\"");
    for (const char *p = o->out_dir; *p; p++) {
        if (*p == '"' || *p == '\\')
            printf("\\%c", *p);
        else if ((unsigned char)*p < 0x20)
            printf("\\u%04x", (unsigned)(unsigned char)*p);
        else
            putchar(*p);
    }
    printf("\",\"arch\":\"%s\",\"dtype\":\"%s\",\"shards\":%u,\"params\":%llu,\"bytes\":%llu}\n",
           o->arch == GANG_ARCH_GEMMA3    ? "gemma3"
           : o->arch == GANG_ARCH_QWEN3   ? "qwen3"
           : o->arch == GANG_ARCH_QWEN2   ? "qwen2"
           : o->arch == GANG_ARCH_MISTRAL ? "mistral"
                                          : "llama",
           o->dtype == GANG_DTYPE_F16    ? "f16"
           : o->dtype == GANG_DTYPE_BF16 ? "bf16"
                                         : "f32",
           o->shards, (unsigned long long)mkmodel_params(mc), (unsigned long long)mkmodel_bytes(o));
}

int gang_cmd_mkmodel(int argc, char **argv)
{
    mk_cli cli;
    gang_mkmodel_opts o;
    gang_model_config mc;
    char err[512];
    int rc;

    rc = mk_parse(argc, argv, &cli, &o);
    if (rc != 0)
        return rc == GANG_OPTS_HELP ? GANG_EXIT_OK : GANG_EXIT_USAGE;
    rc = gang_mkmodel(&o, err, sizeof(err));
    if (rc == GANG_EUSAGE) {
        /* The library's messages start with "mkmodel: "; the command name comes first. */
        gang_opts_usage_error(&mk_cmd, "%s", strncmp(err, "mkmodel: ", 9) == 0 ? err + 9 : err);
        return GANG_EXIT_USAGE;
    }
    if (rc != 0) {
        fprintf(stderr, "ganglion mkmodel: %s (%s)\n", err[0] ? err : gang_strerror(rc),
                gang_err_name(rc));
        return gang_exit_code_for(rc);
    }
    /* Reading the config back checks what was written and gives the parameter count. */
    rc = gang_model_config_read(o.out_dir, &mc, err, sizeof(err));
    if (rc != 0) {
        fprintf(stderr, "ganglion mkmodel: the written model does not read back: %s\n", err);
        return GANG_EXIT_INTERNAL;
    }
    mk_print_summary(&o, &mc);
    return GANG_EXIT_OK;
}
