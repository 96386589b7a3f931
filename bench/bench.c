/*
 * `ganglion bench`: the benchmark table, and what the control-plane benchmarks
 * (rendezvous, failover) share: their option tables, run context and /status polling.
 *
 * The control-plane benchmarks drive real agents of this binary and watch them only from
 * the outside, through each agent's GET /status, so they measure what an operator would
 * see. The measured instants come from the agents themselves where the contract provides
 * them (last_abort_wall_ms, serving_since_wall_ms) and from polling otherwise; polling
 * runs every BENCH_POLL_MS, which bounds the error it adds.
 *
 * Method (nccl-tests style): warm-up trials that are printed but not counted, then timed
 * trials, one JSON line each, then a summary line with median, min and max; the peer of
 * the rendezvous benchmark (Open MPI's mpirun of a barrier program) runs in the same
 * trial and the ratio is printed next to it.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench.h"
#include "ganglion/serve.h"
#include "proc.h"

/* ---------------------------------------------------------------------------------
 * The benchmark table.
 * --------------------------------------------------------------------------------- */

typedef struct bench_entry {
    const char *name;
    int (*main)(int argc, char **argv);
    const char *help; /* NULL: hidden */
} bench_entry;

static const bench_entry benches[] = {
    {"rendezvous", gang_bench_rendezvous_main, "time to form a gang of N agents vs mpirun"},
    {"failover", gang_bench_failover_main, "failure detection and gang re-formation"},
    {"allreduce", gang_bench_allreduce_main, "all-reduce bus bandwidth vs Open MPI"},
    {"allreduce-rank", gang_bench_allreduce_rank_main, NULL},
    {"alltoall", gang_bench_alltoall_main, "all-to-all(v) bus bandwidth vs Open MPI"},
    {"pipeline", gang_bench_pipeline_main, "GPipe schedule vs its bubble bound"},
    {"decode", gang_bench_decode_main, "prefill / decode tokens/s per TP x PP layout"},
    {"moe", gang_bench_moe_main, "MoE decode tokens/s per batch and EP, all-to-all share"},
    {"gemm", gang_bench_gemm_main, "our GEMM path vs direct cuBLAS (GPU)"},
    {"matmul", gang_bench_matmul_main, "CPU bf16/f16/int8 matmul vs OpenBLAS sgemm on f32"},
};
#define NBENCHES (sizeof(benches) / sizeof(benches[0]))

void gang_bench_print_list(FILE *out)
{
    for (size_t i = 0; i < NBENCHES; i++) {
        if (benches[i].help != NULL)
            fprintf(out, "  %-12s %s\n", benches[i].name, benches[i].help);
    }
}

int gang_bench_main(int argc, char **argv)
{
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        FILE *out = argc < 2 ? stderr : stdout;
        fprintf(out, "usage: ganglion bench NAME [flags] (ganglion bench NAME --help)\n"
                     "JSON lines on stdout, progress on stderr. Benchmarks:\n");
        gang_bench_print_list(out);
        return argc < 2 ? GANG_EXIT_USAGE : GANG_EXIT_OK;
    }
    for (size_t i = 0; i < NBENCHES; i++) {
        if (strcmp(argv[1], benches[i].name) == 0)
            return benches[i].main(argc - 1, argv + 1);
    }
    fprintf(stderr, "ganglion bench: unknown benchmark '%s' (see ganglion bench --help)\n",
            argv[1]);
    return GANG_EXIT_USAGE;
}

/* ---------------------------------------------------------------------------------
 * rendezvous and failover: option tables.
 * --------------------------------------------------------------------------------- */

#define BO_INT(f_, fld, d, l, h, hp) GANG_OPT_INT(bench_opts, f_, fld, #d, l, h, hp)
#define BO_STR(f_, fld, d, hp) GANG_OPT_STR(bench_opts, f_, fld, d, hp)

static const gang_param_info rdzv_items[] = {
    BO_INT("nodes", nodes, 8, 1, 4096, "agents to start"),
    BO_INT("nproc-per-node", nproc_per_node, 1, 1, 64, "workers (ranks) per agent"),
    BO_INT("trials", trials, 5, 1, 100000, "timed trials"),
    BO_INT("warmup", warmup, 1, 0, 1000, "untimed trials first"),
    BO_INT("timeout-s", timeout_s, 120, 1, 86400, "deadline of one gang formation"),
    {.flag = "no-peer",
     .type = GANG_PARAM_BOOL,
     .def = "0",
     .hi = 1,
     .help = "skip the peer (mpirun -np N mpi-barrier)",
     .offset = offsetof(bench_opts, no_peer)},
    BO_INT("peer-timeout-s", peer_timeout_s, 900, 1, 86400, "deadline of one mpirun run"),
    {.flag = "no-reform",
     .type = GANG_PARAM_BOOL,
     .def = "0",
     .hi = 1,
     .help = "skip the re-formation after a killed worker",
     .offset = offsetof(bench_opts, no_reform)},
    BO_STR("agent-log", agent_log, "", "the agents' output (default: a file in $TMPDIR)"),
};
static const gang_opt_table rdzv_table = GANG_OPT_TABLE(rdzv_items);

static const gang_param_info failover_items[] = {
    BO_INT("trials", trials, 10, 1, 100000, "timed trials per kind"),
    BO_INT("warmup", warmup, 1, 0, 1000, "untimed trials per kind first"),
    BO_INT("nnodes", nnodes, 4, 2, 4096, "agents of the local gang"),
    BO_INT("nproc-per-node", nproc_per_node, 2, 1, 64, "workers per agent"),
    BO_INT("heartbeat-interval-ms", hb_interval_ms, 100, 10, 600000, "the gang's heartbeat"),
    BO_INT("heartbeat-timeout-ms", hb_timeout_ms, 1000, 20, 3600000, "silence that is a failure"),
    BO_INT("abort-timeout-ms", abort_timeout_ms, 500, 10, 600000, "the gang's abort deadline"),
    BO_STR("kinds", kinds, "crash,hang", "failures to inject: crash, hang or crash,hang"),
    BO_INT("timeout-s", timeout_s, 60, 1, 86400, "deadline of one trial"),
    BO_STR("agent-log", agent_log, "", "the agents' output (default: a file in $TMPDIR)"),
};
static const gang_opt_table failover_table = GANG_OPT_TABLE(failover_items);

static const gang_opt_cmd rdzv_cmd = {
    "bench rendezvous", "[flags] [-- SERVE FLAGS]",
    "Starts N agents of P ranks directly (each on its own 127.0.0.x address) and times\n"
    "first fork -> the coordinator's gang.state \"serving\", the formation alone (last\n"
    "member joined -> every rank READY) and a re-formation after a killed worker; then the\n"
    "peer, mpirun -np N*P mpi-barrier, and the ratio. On a 2-core machine mpirun -np 256\n"
    "takes minutes: use --warmup 0 --trials 1 there. Serve flags after \"--\" go to every\n"
    "agent.",
    &rdzv_table, 1};

static const gang_opt_cmd failover_cmd = {
    "bench failover", "[flags] [-- SERVE FLAGS]",
    "Starts serve --local, then per trial SIGKILLs (crash) or SIGSTOPs (hang) a worker of a\n"
    "non-coordinator node and measures the detection latency at the last agent that learns\n"
    "of it and the time until the gang serves a newer generation. Serve flags after \"--\"\n"
    "go to the gang.",
    &failover_table, 1};

/*
 * Parses a control-plane benchmark's command line: its table before "--", serve flags
 * (checked against the registry) after it. Returns 0, GANG_OPTS_HELP or GANG_EUSAGE.
 */
static int bench_parse(const gang_opt_cmd *cmd, int argc, char **argv, bench_opts *o)
{
    int n = argc;
    char err[512];

    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--") == 0) {
            n = i;
            o->extra = argv + i + 1;
            o->nextra = argc - i - 1;
            break;
        }
    }
    int rc = gang_opts_cli(cmd, o, n, argv, NULL, NULL);
    if (rc != 0)
        return rc;
    if (o->nextra > 0) {
        gang_params scratch;
        gang_params_defaults(&scratch);
        if (gang_params_parse_args(&scratch, o->nextra, o->extra, NULL, NULL, err, sizeof(err)) !=
            0)
            return gang_opts_usage_error(cmd, "after --: %s", err);
    }
    o->crash = strstr(o->kinds, "crash") != NULL;
    o->hang = strstr(o->kinds, "hang") != NULL;
    if (cmd == &failover_cmd && !o->crash && !o->hang)
        return gang_opts_usage_error(cmd, "--kinds takes crash, hang or crash,hang");
    return 0;
}

/* Opens the agent log (given, or a fresh file in $TMPDIR) and finds this binary. */
static int bench_ctx_init(bench_ctx *c, const bench_opts *o)
{
    ssize_t len = readlink("/proc/self/exe", c->exe, sizeof c->exe - 1);
    const char *tmp = getenv("TMPDIR");
    char *slash;

    if (len <= 0) {
        gang_error("bench: cannot read /proc/self/exe: %s", strerror(errno));
        return GANG_ENOENT;
    }
    c->exe[len] = '\0';
    gang_strlcpy(c->dir, c->exe, sizeof c->dir);
    slash = strrchr(c->dir, '/');
    if (slash != NULL)
        *slash = '\0';
    if (o->agent_log[0])
        gang_strlcpy(c->log_path, o->agent_log, sizeof c->log_path);
    else
        snprintf(c->log_path, sizeof c->log_path, "%s/ganglion-bench-%s-%d.log",
                 tmp && *tmp ? tmp : "/tmp", o->kind, (int)getpid());
    c->log_fd = open(c->log_path, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0644);
    if (c->log_fd < 0) {
        gang_error("bench: cannot open %s: %s", c->log_path, strerror(errno));
        return gang_err_from_errno(errno);
    }
    return 0;
}

/* Parses, opens the context and runs one control-plane benchmark. */
static int bench_control_main(const gang_opt_cmd *cmd, int argc, char **argv,
                              int (*run)(bench_ctx *, const bench_opts *))
{
    bench_opts o;
    bench_ctx c = {.log_fd = -1};

    memset(&o, 0, sizeof o);
    o.kind = argv[0];
    int rc = bench_parse(cmd, argc, argv, &o);
    if (rc != 0)
        return rc == GANG_OPTS_HELP ? GANG_EXIT_OK : GANG_EXIT_USAGE;
    if (bench_ctx_init(&c, &o) < 0)
        return GANG_EXIT_INTERNAL;
    /* A broken pipe on stdout (| head) must not kill the run before its children are
     * stopped; writes then just fail. */
    signal(SIGPIPE, SIG_IGN);
    if (run == gang__bench_rendezvous)
        gang_info("bench rendezvous: %lld node(s) x %lld rank(s), %lld trial(s) after %lld "
                  "warm-up; agent log %s",
                  (long long)o.nodes, (long long)o.nproc_per_node, (long long)o.trials,
                  (long long)o.warmup, c.log_path);
    else
        gang_info("bench failover: %lld x %lld, %lld trial(s) per kind after %lld warm-up; "
                  "agent log %s",
                  (long long)o.nnodes, (long long)o.nproc_per_node, (long long)o.trials,
                  (long long)o.warmup, c.log_path);
    rc = run(&c, &o);
    close(c.log_fd);
    return rc;
}

int gang_bench_rendezvous_main(int argc, char **argv)
{
    return bench_control_main(&rdzv_cmd, argc, argv, gang__bench_rendezvous);
}

int gang_bench_failover_main(int argc, char **argv)
{
    return bench_control_main(&failover_cmd, argc, argv, gang__bench_failover);
}

/* ---------------------------------------------------------------------------------
 * Helpers of the control-plane benchmarks.
 * --------------------------------------------------------------------------------- */

cJSON *bench_get_status(const char *host, int port)
{
    char *body = NULL;
    int status = 0;
    cJSON *j;

    if (gang_http_fetch(host, port, "GET", "/status", NULL, BENCH_HTTP_TIMEOUT_MS, &status,
                        &body) != 0)
        return NULL;
    j = status == 200 ? cJSON_Parse(body) : NULL;
    free(body);
    return j;
}

double bench_jnum(const cJSON *o, const char *k1, const char *k2, double def)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k1);

    if (v != NULL && k2 != NULL)
        v = cJSON_GetObjectItemCaseSensitive(v, k2);
    return cJSON_IsNumber(v) ? v->valuedouble : def;
}

const char *bench_jstr(const cJSON *o, const char *k1, const char *k2)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k1);

    if (v != NULL && k2 != NULL)
        v = cJSON_GetObjectItemCaseSensitive(v, k2);
    return cJSON_IsString(v) ? v->valuestring : "";
}

int bench_pick_ports(int *rdzv, int *http)
{
    int ports[2];
    int rc = gang_proc_pick_ports(2, ports);

    if (rc == 0) {
        *rdzv = ports[0];
        *http = ports[1];
    }
    return rc;
}

int bench_spawn(char *const *argv, int out_fd, pid_t *out)
{
    gang_spawn s = {.path = NULL,
                    .out_fd = out_fd,
                    .err_fd = out_fd,
                    .close_fd = -1,
                    .new_group = 1,
                    .death_signal = SIGTERM,
                    .mpi_env = 1};
    return gang_proc_spawn(argv, &s, out);
}

int bench_stop(pid_t *pids, int n, int group)
{
    return gang_proc_stop(pids, n, group, BENCH_STOP_GRACE_MS, BENCH_KILL_GRACE_MS);
}
