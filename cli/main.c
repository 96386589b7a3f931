/*
 * ganglion: one binary for every role. `serve` runs an agent (or a local gang with
 * --local), `worker` is how an agent runs its ranks, `bench` measures, `info` reports GPUs.
 * Parameters come from the registry (flags > GANGLION_* environment > defaults).
 */
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "agent.h"
#include "bench.h"
#include "ganglion/comm.h"
#include "ganglion/config.h"
#include "ganglion/model.h"
#include "ganglion/rendezvous.h"
#include "ganglion/router.h"
#include "local.h"
#include "cmds.h"
#include "worker.h"

extern char **environ;

/* One subcommand: every handler takes argv with argv[0] = the subcommand's name. */
typedef struct command {
    const char *name;
    int (*main)(int argc, char **argv);
    const char *synopsis; /* after "ganglion NAME" */
    const char *help;     /* one line; NULL: hidden (internal) */
} command;

static int cmd_serve(int argc, char **argv);

static const command commands[] = {
    {"serve", cmd_serve, "[--local] [--check-config] [flags]",
     "run this node's agent (node 0 also coordinates); --local: a whole gang of --nnodes "
     "agents on this host; --check-config: validate, print, exit"},
    {"generate", gang_cmd_generate,
     "--model DIR (--prompt T | --chat Q | --prompt-ids 1,2) [flags]",
     "one prompt through a local gang, tokens printed"},
    {"mkmodel", gang_cmd_mkmodel, "--out DIR [flags]",
     "write a deterministic random model (HF layout)"},
    {"router", gang_router_main, "--replicas HOST:PORT,... [flags]",
     "one front door for data-parallel replicas: cache-aware routing, retries"},
    {"bench", gang_bench_main, "NAME [flags]", "benchmarks (JSON lines); ganglion bench --help"},
    {"info", gang_cmd_info, "[--labels]", "GPU discovery"},
    {"worker", gang_worker_main, NULL, NULL},
};
#define NCOMMANDS (sizeof(commands) / sizeof(commands[0]))

static void usage(FILE *out)
{
    fprintf(out,
            "ganglion %s: multi-GPU distributed inference launcher and gang coordinator\n\n"
            "usage:\n",
            GANG_VERSION);
    for (size_t i = 0; i < NCOMMANDS; i++) {
        if (commands[i].help != NULL)
            fprintf(out, "  ganglion %s %s\n      %s\n", commands[i].name, commands[i].synopsis,
                    commands[i].help);
    }
    fprintf(out, "  ganglion --help | --version\n"
                 "Every command takes --help.\n\n"
                 "serve flags (every flag has an environment twin GANGLION_<FLAG>):\n");
    gang_params_print_help(out);
    fprintf(out, "\nexit codes: 0 clean stop, 2 usage/config error, 3 model error, "
                 "75 transient (retry), 70 internal\n");
}

/* Applies environment then flags, and configures logging; returns 0 or an exit code. */
static int load_params(gang_params *p, int argc, char **argv, char **rest, int *nrest)
{
    char err[512];
    if (gang_params_load(p, environ, argc, argv, rest, nrest, err, sizeof(err)) != 0) {
        fprintf(stderr, "ganglion: %s\n", err);
        return GANG_EXIT_USAGE;
    }
    gang_log_format fmt;
    gang_log_level lvl;
    if (gang_log_parse_format(p->log_format, &fmt) != 0 ||
        gang_log_parse_level(p->log_level, &lvl) != 0) {
        fprintf(stderr, "ganglion: --log-format must be text|json and --log-level "
                        "debug|info|warn|error\n");
        return GANG_EXIT_USAGE;
    }
    gang_log_configure(fmt, lvl);
    return 0;
}

static int check_choice(const char *flag, const char *v, const char *const *ok)
{
    for (; *ok; ok++) {
        if (strcmp(v, *ok) == 0)
            return 0;
    }
    fprintf(stderr, "ganglion: --%s: '%s' is not one of the accepted values\n", flag, v);
    return GANG_EXIT_USAGE;
}

/* ganglion serve: argv[0] is "serve"; the flags are the registry's. */
static int cmd_serve(int argc, char **argv)
{
    gang_params p;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            usage(stdout);
            return GANG_EXIT_OK;
        }
    }
    int rc = load_params(&p, argc - 1, argv + 1, NULL, NULL);
    if (rc != 0)
        return rc;
    static const char *const backends[] = {"auto", "nccl", "socket", "mpi", NULL};
    static const char *const devices[] = {"auto", "cpu", "cuda", "fake", NULL};
    if (check_choice("backend", p.backend, backends) || check_choice("device", p.device, devices))
        return GANG_EXIT_USAGE;
    if (p.check_config) {
        char err[512];
        gang_identity id;
        if (p.local) {
            /* Each local agent gets its identity from local mode; check node 0's. */
            p.node_index = 0;
            gang_strlcpy(p.bind_address, "127.0.0.1", sizeof(p.bind_address));
        }
        if (gang_agent_prepare(&p, environ, &id, err, sizeof(err)) != 0) {
            fprintf(stderr, "ganglion: invalid configuration: %s\n", err);
            return GANG_EXIT_USAGE;
        }
        gang_model_config mc;
        uint32_t ctx = 0;
        char ctx_why[256];
        rc = gang_agent_check_layout(&p, &mc, &ctx, ctx_why, sizeof(ctx_why), err, sizeof(err));
        if (rc != 0) {
            fprintf(stderr, "ganglion: invalid configuration: %s\n", err);
            return gang_exit_code_for(rc);
        }
        if (p.token_file[0]) {
            gang_token tok;
            if (gang_auth_init() != 0 ||
                gang_auth_load_token(p.token_file, &tok, err, sizeof(err)) != 0) {
                fprintf(stderr, "ganglion: invalid configuration: token: %s\n", err);
                return GANG_EXIT_USAGE;
            }
            printf("# token: %s read\n", p.token_file);
        } else {
            printf("# token: none (the rendezvous port will not authenticate peers)\n");
        }
        char key[GANG_API_KEY_MAX + 1];
        if (gang__api_key_read(p.api_key_file, key, err, sizeof(err)) != 0) {
            fprintf(stderr, "ganglion: invalid configuration: %s\n", err);
            return GANG_EXIT_USAGE;
        }
        printf("# API key: %s\n",
               key[0] ? "read (clients must send it as a Bearer token)" : "none (the API is open)");
        if (p.model[0])
            printf("# model: %s: %u layers, hidden %u, %u heads (%u kv), ffn %u, vocab %u; "
                   "context %u (%s)\n",
                   p.model, mc.n_layers, mc.hidden, mc.n_heads, mc.n_kv_heads, mc.ffn, mc.vocab,
                   ctx, ctx_why);
        printf("# identity: node %d of %d from %s; coordinator %s:%u\n", id.node_index, id.nnodes,
               gang_identity_source_name(id.source), id.coordinator_host, id.coordinator_port);
        /* What the workers' data plane will be (the rule of gang__worker_uses_nccl). */
        if (!p.model[0])
            printf("# data plane: socket world only (no model: no TP / PP groups)\n");
        else if (gang__worker_uses_nccl(&p))
            printf("# data plane: socket world (plans, tokens); TP / PP over nccl on the GPU\n");
        else
            printf("# data plane: socket world and TP / PP over the socket backend%s\n",
                   strcmp(p.device, "cuda") == 0 ? " (GPU buffers staged through host memory)"
                                                 : "");
        gang_params_print_values(&p, stdout);
        return GANG_EXIT_OK;
    }
    if (p.local)
        return gang_local_main(&p);
    return gang_agent_main(&p, environ);
}

int main(int argc, char **argv)
{
    /* A peer that goes away mid-write must be an error value, not a killed process. */
    signal(SIGPIPE, SIG_IGN);
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 ||
        strcmp(argv[1], "help") == 0) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? GANG_EXIT_USAGE : GANG_EXIT_OK;
    }
    if (strcmp(argv[1], "--version") == 0) {
        /* What is built, so that "mpi=yes" is never read as "workers run over MPI". */
        printf("ganglion %s (backends built: socket=yes mpi=%s nccl=%s; kernels: cpu%s)\n",
               GANG_VERSION, gang_comm_backend_built(GANG_COMM_MPI) ? "yes" : "no",
               gang_comm_backend_built(GANG_COMM_NCCL) ? "yes" : "no",
               GANG_HAVE_CUDA ? " cuda" : "");
        return GANG_EXIT_OK;
    }
    for (size_t i = 0; i < NCOMMANDS; i++) {
        if (strcmp(argv[1], commands[i].name) == 0)
            return commands[i].main(argc - 1, argv + 1);
    }
    fprintf(stderr, "ganglion: unknown command '%s' (see ganglion --help)\n", argv[1]);
    return GANG_EXIT_USAGE;
}
