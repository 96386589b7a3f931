/*
 * `ganglion bench rendezvous`: how fast a gang forms. N agents are started directly
 * (--nproc-per-node ranks each, each agent on its own 127.0.0.x address) and first fork
 * -> coordinator's gang.state "serving" is timed, with the coordinator's own figure for
 * the formation alone (last member joined -> every rank READY), then one worker is
 * killed and the re-formation (kill -> serving a newer generation) is timed; the peer,
 * `mpirun -np N*P mpi-barrier`, runs in the same trial and the ratio is printed next to
 * it (method: bench.c).
 */
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench.h"
#include "ganglion/serve.h"
#include "local.h"
#include "proc.h"
#include "report.h"

/* ---------------------------------------------------------------------------------
 * bench rendezvous
 * --------------------------------------------------------------------------------- */

/* What one ganglion trial measured (seconds). */
typedef struct rdzv_result {
    double secs;      /* first fork -> coordinator serving */
    double spawn;     /* the part of it spent forking the agents */
    double formation; /* the coordinator's: last member joined -> every rank READY */
    double reform;    /* SIGKILL of a worker -> serving a newer generation; < 0: not run */
    int bad_exits;    /* agents that did not exit 0 after SIGTERM */
} rdzv_result;

/* 1 when the agent at 127.0.0.1:http answers /readyz with 200. */
static int rdzv_readyz(int http)
{
    char *body = NULL;
    int status = 0;
    int rc = gang_http_fetch("127.0.0.1", http, "GET", "/readyz", NULL, BENCH_HTTP_TIMEOUT_MS,
                             &status, &body);

    free(body);
    return rc == 0 && status == 200;
}

/*
 * Polls the coordinator until it serves a generation above min_gen; 0 with *at_ns (when
 * that was seen) or GANG_ETIMEDOUT. The poll is agent 0's /readyz, which turns 200 only
 * after the coordinator has declared the gang serving and is O(1) to answer; /status, whose
 * rank table is O(world size) to render and parse, is fetched only then, to check the
 * generation and read formation_seconds. Polling /status itself every BENCH_POLL_MS cost
 * the coordinator and the bench seconds of CPU at 1,024 ranks, on the cores the formation
 * needs (issue #14).
 */
static int rdzv_wait_serving(int http, int64_t min_gen, uint64_t deadline, double *formation,
                             uint64_t *at_ns)
{
    while (gang_now_ms() < deadline) {
        uint64_t seen = gang_now_ns();
        cJSON *st = rdzv_readyz(http) ? bench_get_status("127.0.0.1", http) : NULL;
        int serving = st != NULL && strcmp(bench_jstr(st, "gang", "state"), "serving") == 0 &&
                      (int64_t)bench_jnum(st, "gang", "generation", -1) > min_gen;
        if (serving && formation != NULL)
            *formation = bench_jnum(st, "gang", "formation_seconds", -1);
        cJSON_Delete(st);
        if (serving) {
            *at_ns = seen;
            return 0;
        }
        gang_sleep_ms(BENCH_POLL_MS);
    }
    return GANG_ETIMEDOUT;
}

/*
 * Kills local rank 0 of the last node with SIGKILL and times kill -> the coordinator
 * serving a newer generation. Returns 0 with *secs, or a negative code.
 */
static int rdzv_reform(const bench_opts *o, int http, uint64_t deadline, double *secs)
{
    char addr[GANG_LOCAL_ADDR_MAX];
    cJSON *st;
    int64_t gen, pid = -1;
    uint64_t t0, t1 = 0;
    int rc;

    st = bench_get_status("127.0.0.1", http);
    gen = (int64_t)bench_jnum(st, "gang", "generation", -1);
    cJSON_Delete(st);
    rc = gang__local_address((int)o->nodes - 1, addr, sizeof addr);
    if (rc < 0)
        return rc;
    st = bench_get_status(addr, http);
    cJSON *lr = st != NULL ? cJSON_GetObjectItem(st, "local_ranks") : NULL;
    cJSON *r0 = lr != NULL ? cJSON_GetArrayItem(lr, 0) : NULL;
    if (r0 != NULL)
        pid = (int64_t)bench_jnum(r0, "pid", NULL, -1);
    cJSON_Delete(st);
    if (gen < 0 || pid <= 0)
        return GANG_EPROTO;
    t0 = gang_now_ns();
    if (kill((pid_t)pid, SIGKILL) != 0)
        return GANG_EPEER;
    rc = rdzv_wait_serving(http, gen, deadline, NULL, &t1);
    if (rc == 0)
        *secs = (double)(t1 - t0) / 1e9;
    return rc;
}

/*
 * One ganglion trial: starts o->nodes agents of o->nproc_per_node ranks, times first
 * fork -> coordinator serving, then (unless --no-reform) a re-formation after a killed
 * worker, and stops them. Returns 0 with *res filled; GANG_ETIMEDOUT when the gang did
 * not form (or re-form).
 */
static int rdzv_trial_ganglion(bench_ctx *c, const bench_opts *o, rdzv_result *res)
{
    char nn[16], rp[16], hp[16], npn[16];
    char **args = NULL;
    pid_t *pids = NULL;
    int nargs = 0, rdzv = 0, http = 0, started = 0;
    uint64_t t0, t1 = 0, deadline;
    int rc;

    rc = bench_pick_ports(&rdzv, &http);
    if (rc < 0)
        return rc;
    snprintf(nn, sizeof nn, "%lld", (long long)o->nodes);
    snprintf(npn, sizeof npn, "%lld", (long long)o->nproc_per_node);
    snprintf(rp, sizeof rp, "%d", rdzv);
    snprintf(hp, sizeof hp, "%d", http);
    args = calloc((size_t)o->nextra + 16, sizeof *args);
    pids = calloc((size_t)o->nodes, sizeof *pids);
    if (args == NULL || pids == NULL) {
        rc = GANG_ENOMEM;
        goto out_free;
    }
    args[nargs++] = "--nnodes";
    args[nargs++] = nn;
    args[nargs++] = "--nproc-per-node";
    args[nargs++] = npn;
    args[nargs++] = "--rdzv-port";
    args[nargs++] = rp;
    args[nargs++] = "--http-port";
    args[nargs++] = hp;
    args[nargs++] = "--job-name";
    args[nargs++] = "bench-rendezvous";
    args[nargs++] = "--log-level";
    args[nargs++] = "warn";
    for (int i = 0; i < o->nextra; i++)
        args[nargs++] = o->extra[i];

    gang_local_spawn_cfg cfg = {.exe = "/proc/self/exe",
                                .argv0 = c->exe,
                                .args = args,
                                .nargs = nargs,
                                .rdzv_port = rdzv,
                                .out_fd = c->log_fd};
    t0 = gang_now_ns();
    for (int i = 0; i < o->nodes; i++) {
        cfg.node_index = i;
        rc = gang__local_spawn(&cfg, &pids[i]);
        if (rc < 0) {
            gang_error("bench: cannot start agent %d: %s", i, gang_strerror(rc));
            goto out_stop;
        }
        started++;
    }
    res->spawn = (double)(gang_now_ns() - t0) / 1e9;

    deadline = gang_now_ms() + (uint64_t)o->timeout_s * 1000u;
    rc = rdzv_wait_serving(http, -1, deadline, &res->formation, &t1);
    if (rc == 0)
        res->secs = (double)(t1 - t0) / 1e9;
    res->reform = -1;
    if (rc == 0 && !o->no_reform) {
        deadline = gang_now_ms() + (uint64_t)o->timeout_s * 1000u;
        rc = rdzv_reform(o, http, deadline, &res->reform);
    }

out_stop:
    res->bad_exits = bench_stop(pids, started, 0);
out_free:
    free(pids);
    free(args);
    return rc;
}

/*
 * One peer trial: `mpirun --allow-run-as-root --oversubscribe -np N DIR/mpi-barrier`.
 * Returns 0 with the wall seconds; 1 with a reason when the peer is not available (the
 * caller prints "skipped"); a negative code with a reason when it failed.
 */
static int rdzv_trial_mpirun(bench_ctx *c, const bench_opts *o, double *secs, char *why,
                             size_t whycap)
{
    char mpirun[PATH_MAX], barrier[PATH_MAX + 16], np[16];
    pid_t pid = 0;
    int status = 0;
    uint64_t t0;
    int rc;

    if (!gang_proc_find_in_path("mpirun", mpirun, sizeof mpirun)) {
        snprintf(why, whycap, "mpirun not found in PATH (install openmpi-bin)");
        return 1;
    }
    snprintf(barrier, sizeof barrier, "%s/mpi-barrier", c->dir);
    if (access(barrier, X_OK) != 0) {
        snprintf(why, whycap, "%s not built (needs MPI at configure time)", barrier);
        return 1;
    }
    snprintf(np, sizeof np, "%lld", (long long)(o->nodes * o->nproc_per_node));
    char *argv[] = {mpirun, "--allow-run-as-root", "--oversubscribe", "-np", np, barrier, NULL};

    t0 = gang_now_ns();
    rc = bench_spawn(argv, c->log_fd, &pid);
    if (rc < 0) {
        snprintf(why, whycap, "cannot start mpirun: %s", gang_strerror(rc));
        return rc;
    }
    if (gang_proc_reap_until(&pid, &status, 1,
                             gang_now_ms() + (uint64_t)o->peer_timeout_s * 1000u) > 0) {
        /* mpirun stops its ranks on SIGTERM; what is left after the grace is killed. */
        kill(pid, SIGTERM);
        if (gang_proc_reap_until(&pid, &status, 1, gang_now_ms() + BENCH_STOP_GRACE_MS) > 0) {
            gang_proc_kill_tree(pid, SIGKILL);
            gang_proc_reap_until(&pid, &status, 1, gang_now_ms() + BENCH_KILL_GRACE_MS);
        }
        snprintf(why, whycap, "mpirun did not finish within %lld s", (long long)o->peer_timeout_s);
        return GANG_ETIMEDOUT;
    }
    *secs = (double)(gang_now_ns() - t0) / 1e9;
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        snprintf(why, whycap, "mpirun failed (wait status 0x%x); see %s", (unsigned)status,
                 c->log_path);
        return GANG_EPEER;
    }
    return 0;
}

int gang__bench_rendezvous(bench_ctx *c, const bench_opts *o)
{
    double *g = calloc((size_t)o->trials + 1, sizeof *g);
    double *m = calloc((size_t)o->trials + 1, sizeof *m);
    double *f = calloc((size_t)o->trials + 1, sizeof *f);
    double *re = calloc((size_t)o->trials + 1, sizeof *re);
    int ng = 0, nm = 0, nf = 0, nre = 0, failed = 0;
    char skipped[PATH_MAX + 128] = "";

    if (g == NULL || m == NULL || f == NULL || re == NULL) {
        free(g);
        free(m);
        free(f);
        free(re);
        return GANG_EXIT_INTERNAL;
    }
    for (int t = -o->warmup; t < o->trials; t++) {
        cJSON *line = cJSON_CreateObject();
        double ms = 0;
        rdzv_result res = {0, 0, -1, -1, 0};
        char why[PATH_MAX + 128] = "";
        int rc = rdzv_trial_ganglion(c, o, &res);
        double gs = res.secs;

        cJSON_AddStringToObject(line, "bench", "rendezvous");
        cJSON_AddNumberToObject(line, "trial", t);
        if (t < 0)
            cJSON_AddBoolToObject(line, "warmup", 1);
        cJSON_AddNumberToObject(line, "nodes", o->nodes);
        cJSON_AddNumberToObject(line, "nproc_per_node", o->nproc_per_node);
        cJSON_AddNumberToObject(line, "ranks", o->nodes * o->nproc_per_node);
        if (rc < 0) {
            cJSON_AddStringToObject(line, "error", gang_strerror(rc));
            cJSON_AddStringToObject(line, "agent_log", c->log_path);
            failed = 1;
        } else {
            cJSON_AddNumberToObject(line, "ganglion_s", gang_report_round(gs, 4));
            cJSON_AddNumberToObject(line, "spawn_s", gang_report_round(res.spawn, 4));
            cJSON_AddNumberToObject(line, "formation_s", gang_report_round(res.formation, 4));
            if (res.reform >= 0)
                cJSON_AddNumberToObject(line, "reform_s", gang_report_round(res.reform, 4));
            if (t >= 0) {
                g[ng++] = gs;
                f[nf++] = res.formation;
                if (res.reform >= 0)
                    re[nre++] = res.reform;
            }
        }
        cJSON_AddNumberToObject(line, "agents_unclean_exit", res.bad_exits);
        if (!o->no_peer && skipped[0] == '\0') {
            int prc = rdzv_trial_mpirun(c, o, &ms, why, sizeof why);
            if (prc == 1) {
                gang_strlcpy(skipped, why, sizeof skipped);
            } else if (prc < 0) {
                cJSON_AddStringToObject(line, "mpirun_error", why);
            } else {
                cJSON_AddNumberToObject(line, "mpirun_s", gang_report_round(ms, 4));
                if (rc == 0)
                    cJSON_AddNumberToObject(line, "ratio", gang_report_round(ms / gs, 3));
                if (t >= 0)
                    m[nm++] = ms;
            }
        }
        gang_report_emit(line);
        gang_proc_reap_strays();
        if (skipped[0] != '\0' && t == -o->warmup) {
            cJSON *peer = cJSON_CreateObject();
            cJSON_AddStringToObject(peer, "peer", "mpirun");
            cJSON_AddStringToObject(peer, "skipped", skipped);
            gang_report_emit(peer);
        }
    }

    cJSON *sum = cJSON_CreateObject();
    cJSON_AddStringToObject(sum, "bench", "rendezvous");
    cJSON_AddBoolToObject(sum, "summary", 1);
    cJSON_AddNumberToObject(sum, "nodes", o->nodes);
    cJSON_AddNumberToObject(sum, "nproc_per_node", o->nproc_per_node);
    cJSON_AddNumberToObject(sum, "ranks", o->nodes * o->nproc_per_node);
    cJSON_AddNumberToObject(sum, "trials", o->trials);
    cJSON_AddNumberToObject(sum, "measured", ng);
    double g50 = gang_report_add_stats(sum, "ganglion_s", g, ng, 4);
    gang_report_add_stats(sum, "formation_s", f, nf, 4);
    gang_report_add_stats(sum, "reform_s", re, nre, 4);
    double m50 = gang_report_add_stats(sum, "mpirun_s", m, nm, 4);
    if (ng > 0 && nm > 0)
        cJSON_AddNumberToObject(sum, "ratio_p50", gang_report_round(m50 / g50, 3));
    else if (skipped[0] != '\0')
        cJSON_AddStringToObject(sum, "peer_skipped", skipped);
    cJSON_AddStringToObject(sum, "agent_log", c->log_path);
    gang_report_emit(sum);
    free(g);
    free(m);
    free(f);
    free(re);
    return failed ? BENCH_EXIT_FAILED : GANG_EXIT_OK;
}
