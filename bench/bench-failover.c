/*
 * `ganglion bench failover`: how fast a failure is noticed and how fast the gang serves
 * again. It starts `serve --local`, then per trial SIGKILLs (crash) or SIGSTOPs (hang) a
 * worker of a non-coordinator node and measures the detection latency at the last agent
 * that learns of it and the time until the gang serves a newer generation (method:
 * bench.c).
 */
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench.h"
#include "local.h"
#include "proc.h"
#include "report.h"

/* ---------------------------------------------------------------------------------
 * bench failover
 * --------------------------------------------------------------------------------- */

/* A running local gang as the failover benchmark sees it. */
typedef struct failover_gang {
    pid_t pid; /* the `serve --local` parent (its own process group) */
    int nnodes;
    int http_port;
    char (*addr)[GANG_LOCAL_ADDR_MAX]; /* each agent's address */
} failover_gang;

/* Coordinator's view: gang state and generation; 0 when /status could not be read. */
static int coord_view(const failover_gang *fg, char *state, size_t cap, int64_t *gen,
                      int64_t *serving_since)
{
    cJSON *st = bench_get_status(fg->addr[0], fg->http_port);

    if (st == NULL)
        return 0;
    gang_strlcpy(state, bench_jstr(st, "gang", "state"), cap);
    *gen = (int64_t)bench_jnum(st, "gang", "generation", -1);
    if (serving_since)
        *serving_since = (int64_t)bench_jnum(st, "gang", "serving_since_wall_ms", 0);
    cJSON_Delete(st);
    return 1;
}

/*
 * Waits until the coordinator serves a generation above min_gen and every agent reports
 * ready in that generation. Returns 0 and the generation, or GANG_ETIMEDOUT.
 */
static int wait_settled(const failover_gang *fg, int64_t min_gen, uint64_t deadline_ms,
                        int64_t *gen_out)
{
    while (gang_now_ms() < deadline_ms) {
        char state[32] = "";
        int64_t gen = -1;
        int all = 1;

        if (coord_view(fg, state, sizeof state, &gen, NULL) && strcmp(state, "serving") == 0 &&
            gen > min_gen) {
            for (int a = 0; a < fg->nnodes && all; a++) {
                cJSON *st = bench_get_status(fg->addr[a], fg->http_port);
                all = st != NULL && cJSON_IsTrue(cJSON_GetObjectItem(st, "ready")) &&
                      (int64_t)bench_jnum(st, "generation", NULL, -1) == gen;
                cJSON_Delete(st);
            }
            if (all) {
                *gen_out = gen;
                return 0;
            }
        }
        gang_sleep_ms(BENCH_POLL_MS * 4);
    }
    return GANG_ETIMEDOUT;
}

/* The pid of local rank `lr` on agent `node`, or -1. */
static pid_t worker_pid(const failover_gang *fg, int node, int lr)
{
    cJSON *st = bench_get_status(fg->addr[node], fg->http_port);
    const cJSON *ranks = st ? cJSON_GetObjectItemCaseSensitive(st, "local_ranks") : NULL;
    const cJSON *r = cJSON_IsArray(ranks) ? cJSON_GetArrayItem(ranks, lr) : NULL;
    pid_t pid = r ? (pid_t)bench_jnum(r, "pid", NULL, -1) : -1;

    cJSON_Delete(st);
    return pid;
}

/* Results of one failover trial. */
typedef struct failover_result {
    double detect_ms;       /* last agent to learn of the failure */
    double first_detect_ms; /* first agent */
    double reform_ms;       /* kill -> coordinator serving a newer generation */
    double reform_after_detect_ms;
    int64_t generation; /* the new generation */
} failover_result;

/*
 * One trial: signals a worker of a non-coordinator node (SIGKILL for a crash, SIGSTOP for
 * a hang) and watches every agent's last_abort_wall_ms and the coordinator's generation.
 * Detection uses the agents' own wall clocks; re-formation uses the coordinator's
 * serving_since_wall_ms when it reports one, else the poll that first saw "serving".
 */
static int failover_trial(const failover_gang *fg, const bench_opts *o, int trial, int hang,
                          int64_t gen0, failover_result *res, cJSON *line)
{
    int node = fg->nnodes > 1 ? 1 + trial % (fg->nnodes - 1) : 0;
    int lr = trial % o->nproc_per_node;
    pid_t pid = worker_pid(fg, node, lr);
    int64_t *seen = calloc((size_t)fg->nnodes, sizeof *seen);
    int nseen = 0, rc = GANG_ETIMEDOUT;
    uint64_t kill_wall, kill_ns, deadline;
    cJSON *per_node;

    cJSON_AddNumberToObject(line, "node", node);
    cJSON_AddNumberToObject(line, "local_rank", lr);
    if (seen == NULL)
        return GANG_ENOMEM;
    if (pid <= 0) {
        cJSON_AddStringToObject(line, "error", "no worker pid in the agent's /status");
        free(seen);
        return GANG_ENOENT;
    }
    kill_wall = gang_wall_ms();
    kill_ns = gang_now_ns();
    kill(pid, hang ? SIGSTOP : SIGKILL);
    deadline = gang_now_ms() + (uint64_t)o->timeout_s * 1000u;

    while (gang_now_ms() < deadline) {
        for (int a = 0; a < fg->nnodes && nseen < fg->nnodes; a++) {
            if (seen[a] != 0)
                continue;
            cJSON *st = bench_get_status(fg->addr[a], fg->http_port);
            int64_t t = st ? (int64_t)bench_jnum(st, "last_abort_wall_ms", NULL, 0) : 0;
            cJSON_Delete(st);
            if (t >= (int64_t)kill_wall) {
                seen[a] = t;
                nseen++;
            }
        }
        if (nseen == fg->nnodes) {
            char state[32] = "";
            int64_t gen = -1, since = 0;
            if (coord_view(fg, state, sizeof state, &gen, &since) &&
                strcmp(state, "serving") == 0 && gen > gen0) {
                double polled = (double)(gang_now_ns() - kill_ns) / 1e6;
                res->reform_ms =
                    since >= (int64_t)kill_wall ? (double)(since - (int64_t)kill_wall) : polled;
                res->generation = gen;
                rc = 0;
                break;
            }
        }
        gang_sleep_ms(BENCH_POLL_MS);
    }
    /* A hung worker should have been killed by its agent; if it was not, let it go on. */
    if (hang)
        kill(pid, SIGCONT);

    per_node = cJSON_AddArrayToObject(line, "detect_ms_by_node");
    res->detect_ms = 0;
    res->first_detect_ms = 1e18;
    for (int a = 0; a < fg->nnodes; a++) {
        double d = seen[a] ? (double)(seen[a] - (int64_t)kill_wall) : -1;
        cJSON_AddItemToArray(per_node, cJSON_CreateNumber(d));
        if (seen[a] && d > res->detect_ms)
            res->detect_ms = d;
        if (seen[a] && d < res->first_detect_ms)
            res->first_detect_ms = d;
    }
    res->reform_after_detect_ms = res->reform_ms - res->detect_ms;
    if (rc < 0)
        cJSON_AddStringToObject(line, "error",
                                nseen < fg->nnodes ? "not every agent saw the abort"
                                                   : "gang did not re-form in time");
    free(seen);
    return rc;
}

/* Starts `serve --local` for the failover benchmark. */
static int failover_start(bench_ctx *c, const bench_opts *o, failover_gang *fg)
{
    char nn[16], np[16], rp[16], hp[16], hi[16], ht[16], at[16], mr[16];
    char **argv;
    int n = 0, rdzv = 0, rc;

    rc = bench_pick_ports(&rdzv, &fg->http_port);
    if (rc < 0)
        return rc;
    fg->nnodes = o->nnodes;
    fg->addr = calloc((size_t)o->nnodes, sizeof *fg->addr);
    argv = calloc((size_t)o->nextra + 40, sizeof *argv);
    if (fg->addr == NULL || argv == NULL) {
        free(argv);
        return GANG_ENOMEM;
    }
    for (int a = 0; a < o->nnodes; a++)
        gang__local_address(a, fg->addr[a], sizeof fg->addr[a]);
    snprintf(nn, sizeof nn, "%lld", (long long)o->nnodes);
    snprintf(np, sizeof np, "%lld", (long long)o->nproc_per_node);
    snprintf(rp, sizeof rp, "%d", rdzv);
    snprintf(hp, sizeof hp, "%d", fg->http_port);
    snprintf(hi, sizeof hi, "%lld", (long long)o->hb_interval_ms);
    snprintf(ht, sizeof ht, "%lld", (long long)o->hb_timeout_ms);
    snprintf(at, sizeof at, "%lld", (long long)o->abort_timeout_ms);
    /* Every trial is a gang restart; the budget must outlast them all. */
    snprintf(mr, sizeof mr, "%lld", (long long)(4 * (o->trials + o->warmup) + 10));

    /* Flag/value pairs read best one pair per line. */
    /* clang-format off */
    char *fixed[] = {
        c->exe, "serve", "--local",
        "--nnodes", nn,
        "--nproc-per-node", np,
        "--rdzv-port", rp,
        "--http-port", hp,
        "--heartbeat-interval-ms", hi,
        "--heartbeat-timeout-ms", ht,
        "--abort-timeout-ms", at,
        "--max-restarts", mr,
        "--restart-backoff-ms", "20",
        "--restart-backoff-max-ms", "200",
        "--job-name", "bench-failover",
        "--log-level", "warn",
    };
    /* clang-format on */
    for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++)
        argv[n++] = fixed[i];
    for (int i = 0; i < o->nextra; i++)
        argv[n++] = o->extra[i];
    argv[n] = NULL;
    rc = bench_spawn(argv, c->log_fd, &fg->pid);
    free(argv);
    return rc;
}

/*
 * Emits the failover summary line: the settings, the medians of every measured figure
 * (v: crash detect, crash reform, hang detect, hang reform; after: reform after detection,
 * crash and hang; nv: timed trials of each kind) and the targets judged on them.
 */
static void failover_summary(const bench_ctx *c, const bench_opts *o, double *v[4],
                             double *after[2], const int nv[2], int unclean)
{
    cJSON *sum = cJSON_CreateObject();
    cJSON *set = cJSON_CreateObject();
    double bound = o->hb_timeout_ms + o->hb_interval_ms;

    cJSON_AddStringToObject(sum, "bench", "failover");
    cJSON_AddBoolToObject(sum, "summary", 1);
    cJSON_AddNumberToObject(set, "nnodes", o->nnodes);
    cJSON_AddNumberToObject(set, "nproc_per_node", o->nproc_per_node);
    cJSON_AddNumberToObject(set, "heartbeat_interval_ms", o->hb_interval_ms);
    cJSON_AddNumberToObject(set, "heartbeat_timeout_ms", o->hb_timeout_ms);
    cJSON_AddNumberToObject(set, "abort_timeout_ms", o->abort_timeout_ms);
    cJSON_AddItemToObject(sum, "settings", set);
    cJSON_AddNumberToObject(sum, "crash_trials", nv[0]);
    cJSON_AddNumberToObject(sum, "hang_trials", nv[1]);
    double crash_detect = gang_report_add_stats(sum, "crash_detect_ms", v[0], nv[0], 1);
    gang_report_add_stats(sum, "crash_reform_ms", v[1], nv[0], 1);
    gang_report_add_stats(sum, "crash_reform_after_detect_ms", after[0], nv[0], 1);
    double hang_detect = gang_report_add_stats(sum, "hang_detect_ms", v[2], nv[1], 1);
    gang_report_add_stats(sum, "hang_reform_ms", v[3], nv[1], 1);
    gang_report_add_stats(sum, "hang_reform_after_detect_ms", after[1], nv[1], 1);
    /* The targets, judged on the medians. */
    if (nv[0] > 0)
        cJSON_AddBoolToObject(sum, "crash_detect_under_100ms", crash_detect < 100);
    if (nv[1] > 0) {
        cJSON_AddNumberToObject(sum, "hang_detect_bound_ms", bound);
        cJSON_AddBoolToObject(sum, "hang_detect_within_bound", hang_detect <= bound);
    }
    cJSON_AddBoolToObject(sum, "gang_stopped_cleanly", unclean == 0);
    cJSON_AddStringToObject(sum, "agent_log", c->log_path);
    gang_report_emit(sum);
}

int gang__bench_failover(bench_ctx *c, const bench_opts *o)
{
    failover_gang fg = {0};
    int ntotal = (o->crash + o->hang) * (o->trials + o->warmup);
    double *v[4]; /* crash detect, crash reform, hang detect, hang reform */
    double *after[2];
    int nv[2] = {0, 0};
    int failed = 0, rc, unclean = 0;
    int64_t gen = 0;

    for (int k = 0; k < 4; k++)
        v[k] = calloc((size_t)o->trials + 1, sizeof(double));
    for (int k = 0; k < 2; k++)
        after[k] = calloc((size_t)o->trials + 1, sizeof(double));
    if (!v[0] || !v[1] || !v[2] || !v[3] || !after[0] || !after[1]) {
        gang_error("bench: out of memory");
        failed = 1;
        goto out_free;
    }
    rc = failover_start(c, o, &fg);
    if (rc < 0) {
        gang_error("bench: cannot start the local gang: %s", gang_strerror(rc));
        failed = 1;
        goto out_free;
    }
    rc = wait_settled(&fg, -1, gang_now_ms() + (uint64_t)o->timeout_s * 1000u, &gen);
    if (rc < 0) {
        cJSON *line = cJSON_CreateObject();
        cJSON_AddStringToObject(line, "bench", "failover");
        cJSON_AddStringToObject(line, "error", "the gang did not form");
        cJSON_AddStringToObject(line, "agent_log", c->log_path);
        gang_report_emit(line);
        failed = 1;
        goto out_stop;
    }

    /* Crash and hang trials alternate, so both see the same machine conditions. */
    for (int t = 0; t < ntotal; t++) {
        int hang = o->crash && o->hang ? t % 2 : o->hang;
        int index = o->crash && o->hang ? t / 2 : t;
        int timed = index >= o->warmup;
        failover_result res = {0};
        cJSON *line = cJSON_CreateObject();

        cJSON_AddStringToObject(line, "bench", "failover");
        cJSON_AddStringToObject(line, "kind", hang ? "hang" : "crash");
        cJSON_AddNumberToObject(line, "trial", index - o->warmup);
        if (!timed)
            cJSON_AddBoolToObject(line, "warmup", 1);
        rc = failover_trial(&fg, o, t, hang, gen, &res, line);
        if (rc == 0) {
            cJSON_AddNumberToObject(line, "detect_ms", res.detect_ms);
            cJSON_AddNumberToObject(line, "first_detect_ms", res.first_detect_ms);
            cJSON_AddNumberToObject(line, "reform_ms", gang_report_round(res.reform_ms, 1));
            cJSON_AddNumberToObject(line, "reform_after_detect_ms",
                                    gang_report_round(res.reform_after_detect_ms, 1));
            cJSON_AddNumberToObject(line, "generation", (double)res.generation);
            rc = wait_settled(&fg, res.generation - 1,
                              gang_now_ms() + (uint64_t)o->timeout_s * 1000u, &gen);
            if (rc < 0)
                cJSON_AddStringToObject(line, "error", "agents did not all become ready");
        } else if (!cJSON_GetObjectItem(line, "error")) {
            cJSON_AddStringToObject(line, "error", gang_strerror(rc));
        }
        gang_report_emit(line);
        if (rc < 0) {
            failed = 1;
            break;
        }
        if (timed) {
            v[hang * 2][nv[hang]] = res.detect_ms;
            v[hang * 2 + 1][nv[hang]] = res.reform_ms;
            after[hang][nv[hang]] = res.reform_after_detect_ms;
            nv[hang]++;
        }
    }

out_stop:
    unclean = bench_stop(&fg.pid, 1, 1);
    failover_summary(c, o, v, after, nv, unclean);
out_free:
    for (int k = 0; k < 4; k++)
        free(v[k]);
    for (int k = 0; k < 2; k++)
        free(after[k]);
    free(fg.addr);
    return failed ? BENCH_EXIT_FAILED : GANG_EXIT_OK;
}
