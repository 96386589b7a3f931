/*
 * ganglion mkmodel: writes a deterministic random model (gang_mkmodel) and prints a
 * one-line JSON summary. Its flags are local to the subcommand (they describe a model,
 * not the gang), so they are parsed here rather than through the parameter registry.
 */
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "cmds.h"
#include "ganglion/common.h"
#include "ganglion/model.h"

static void mkmodel_usage(FILE *out)
{
    fprintf(out, "usage: ganglion mkmodel --out DIR [--arch llama|mistral|qwen2] [--layers 2]\n"
                 "                        [--hidden 64] [--heads 4] [--kv-heads 2] [--ffn 128]\n"
                 "                        [--vocab 256] [--max-pos 512] [--seed 1]\n"
                 "                        [--dtype f32|f16|bf16] [--tie] [--shards 1]\n"
                 "Writes DIR/config.json and DIR/model.safetensors (or --shards N files and\n"
                 "model.safetensors.index.json) of a random Llama-family model; the same options\n"
                 "give byte-identical files.\n");
}

/* One integer flag: its name, bounds and where it goes. */
typedef struct mk_int_flag {
    const char *name;
    int64_t lo, hi;
    uint32_t *dst;
} mk_int_flag;

/* Parameter count of the model config mc, as the file holds it. */
static uint64_t mkmodel_params(const gang_model_config *mc)
{
    uint64_t h = mc->hidden, q = (uint64_t)mc->n_heads * mc->head_dim;
    uint64_t kv = (uint64_t)mc->n_kv_heads * mc->head_dim;
    uint64_t layer = 2 * h + 2 * q * h + 2 * kv * h + 3 * (uint64_t)mc->ffn * h;

    if (mc->attn_bias)
        layer += q + 2 * kv;
    return (uint64_t)mc->vocab * h * (mc->tie_embeddings ? 1 : 2) + h + mc->n_layers * layer;
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

static int mkmodel_bad(const char *fmt, const char *a, const char *b)
{
    fprintf(stderr, "ganglion mkmodel: ");
    fprintf(stderr, fmt, a, b);
    fprintf(stderr, "\n");
    mkmodel_usage(stderr);
    return GANG_EXIT_USAGE;
}

/*
 * Applies one "--name value" pair to o. Returns 0 or a usage exit code (message printed).
 */
static int mkmodel_apply(gang_mkmodel_opts *o, const mk_int_flag *ints, size_t n_ints,
                         const char *name, const char *value)
{
    int64_t v;
    size_t i;

    if (strcmp(name, "out") == 0) {
        if (value[0] == '\0')
            return mkmodel_bad("--%s: empty directory%s", name, "");
        o->out_dir = value;
        return 0;
    }
    if (strcmp(name, "arch") == 0) {
        if (strcmp(value, "llama") == 0)
            o->arch = GANG_ARCH_LLAMA;
        else if (strcmp(value, "mistral") == 0)
            o->arch = GANG_ARCH_MISTRAL;
        else if (strcmp(value, "qwen2") == 0)
            o->arch = GANG_ARCH_QWEN2;
        else
            return mkmodel_bad("--%s: '%s' is not llama, mistral or qwen2", name, value);
        return 0;
    }
    if (strcmp(name, "dtype") == 0) {
        if (strcmp(value, "f32") == 0)
            o->dtype = GANG_DTYPE_F32;
        else if (strcmp(value, "f16") == 0)
            o->dtype = GANG_DTYPE_F16;
        else if (strcmp(value, "bf16") == 0)
            o->dtype = GANG_DTYPE_BF16;
        else
            return mkmodel_bad("--%s: '%s' is not f32, f16 or bf16", name, value);
        return 0;
    }
    if (strcmp(name, "tie") == 0) {
        if (strcmp(value, "true") == 0 || strcmp(value, "1") == 0)
            o->tie_embeddings = 1;
        else if (strcmp(value, "false") == 0 || strcmp(value, "0") == 0)
            o->tie_embeddings = 0;
        else
            return mkmodel_bad("--%s: '%s' is not true or false", name, value);
        return 0;
    }
    if (strcmp(name, "seed") == 0) {
        if (gang_parse_i64(value, 0, INT64_MAX, &v) != 0)
            return mkmodel_bad("--%s: '%s' is not a non-negative integer", name, value);
        o->seed = (uint64_t)v;
        return 0;
    }
    for (i = 0; i < n_ints; i++) {
        if (strcmp(name, ints[i].name) != 0)
            continue;
        if (gang_parse_i64(value, ints[i].lo, ints[i].hi, &v) != 0)
            return mkmodel_bad("--%s: '%s' is not an integer in range", name, value);
        *ints[i].dst = (uint32_t)v;
        return 0;
    }
    return mkmodel_bad("unknown flag --%s%s", name, "");
}

int gang_cmd_mkmodel(int argc, char **argv)
{
    gang_mkmodel_opts o;
    gang_model_config mc;
    char err[512], name[32];
    int i, rc;

    memset(&o, 0, sizeof(o));
    o.arch = GANG_ARCH_LLAMA;
    o.layers = 2;
    o.hidden = 64;
    o.heads = 4;
    o.kv_heads = 2;
    o.ffn = 128;
    o.vocab = 256;
    o.max_pos = 512;
    o.seed = 1;
    o.dtype = GANG_DTYPE_F32;
    o.shards = 1;
    const mk_int_flag ints[] = {
        {"layers", 1, GANG_MODEL_MAX_LAYERS, &o.layers},
        {"hidden", 1, GANG_MODEL_MAX_HIDDEN, &o.hidden},
        {"heads", 1, GANG_MODEL_MAX_HEADS, &o.heads},
        {"kv-heads", 1, GANG_MODEL_MAX_HEADS, &o.kv_heads},
        {"ffn", 1, 1 << 20, &o.ffn},
        {"vocab", 3, GANG_MODEL_MAX_VOCAB, &o.vocab},
        {"max-pos", 1, 1 << 24, &o.max_pos},
        {"shards", 1, 99999, &o.shards},
    };

    /* argv[0] is "mkmodel". */
    for (i = 1; i < argc; i++) {
        const char *arg = argv[i], *eq, *value;

        if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
            mkmodel_usage(stdout);
            return GANG_EXIT_OK;
        }
        if (strncmp(arg, "--", 2) != 0)
            return mkmodel_bad("unexpected argument '%s'%s", arg, "");
        arg += 2;
        if (strcmp(arg, "tie") == 0) {
            o.tie_embeddings = 1;
            continue;
        }
        eq = strchr(arg, '=');
        if (eq != NULL) {
            if ((size_t)(eq - arg) >= sizeof(name))
                return mkmodel_bad("unknown flag --%s%s", arg, "");
            memcpy(name, arg, (size_t)(eq - arg));
            name[eq - arg] = '\0';
            value = eq + 1;
        } else {
            if (i + 1 >= argc)
                return mkmodel_bad("--%s needs a value%s", arg, "");
            gang_strlcpy(name, arg, sizeof(name));
            value = argv[++i];
        }
        rc = mkmodel_apply(&o, ints, sizeof(ints) / sizeof(ints[0]), name, value);
        if (rc != 0)
            return rc;
    }
    if (o.out_dir == NULL)
        return mkmodel_bad("--out DIR is required%s%s", "", "");

    rc = gang_mkmodel(&o, err, sizeof(err));
    if (rc == GANG_EUSAGE) {
        fprintf(stderr, "ganglion %s\n", err);
        mkmodel_usage(stderr);
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
    printf("{\"dir\":\"");
    for (const char *p = o.out_dir; *p; p++) {
        if (*p == '"' || *p == '\\')
            printf("\\%c", *p);
        else if ((unsigned char)*p < 0x20)
            printf("\\u%04x", (unsigned)(unsigned char)*p);
        else
            putchar(*p);
    }
    printf("\",\"arch\":\"%s\",\"dtype\":\"%s\",\"shards\":%u,\"params\":%llu,\"bytes\":%llu}\n",
           o.arch == GANG_ARCH_QWEN2     ? "qwen2"
           : o.arch == GANG_ARCH_MISTRAL ? "mistral"
                                         : "llama",
           o.dtype == GANG_DTYPE_F16    ? "f16"
           : o.dtype == GANG_DTYPE_BF16 ? "bf16"
                                        : "f32",
           o.shards, (unsigned long long)mkmodel_params(&mc),
           (unsigned long long)mkmodel_bytes(&o));
    return GANG_EXIT_OK;
}
