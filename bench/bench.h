/*
 * The benchmarks (bench/): `ganglion bench NAME [flags]`. Results are JSON lines on
 * stdout (bench/report.h), progress and errors go to the log (stderr). Every benchmark
 * parses its flags through its own option table (gang_opt_cmd), so `ganglion bench NAME
 * --help` lists exactly what it accepts.
 *
 *   rendezvous   time to form a gang of N agents, against mpirun -np N mpi-barrier
 *   failover     detection and re-formation after a crashed or hung worker
 *   allreduce    gang_comm_all_reduce bus bandwidth, against Open MPI (bench-comm.c)
 *   pipeline     the GPipe schedule against its bubble bound (bench-pipeline.c)
 *   decode       prefill / decode tokens/s per TP x PP layout (bench-decode.c), or on a
 *                real model against its roofline and transformers (--model, decode.h)
 *   gemm         our GEMM path against direct cuBLAS (bench-gemm.c)
 *   matmul       the CPU typed-weight matmul against OpenBLAS sgemm (bench-matmul.c)
 *
 * Every entry point takes argv with argv[0] = its own name ("bench" for gang_bench_main,
 * "allreduce" for gang_bench_allreduce_main, ...) and returns a process exit code: 0 when
 * everything was measured, 2 for a usage error, 75 when a run failed or missed its
 * deadline, 70 for an internal error. They fork or start threads and are not reentrant:
 * call them from the main thread.
 */
#ifndef GANGLION_BENCH_BENCH_H
#define GANGLION_BENCH_BENCH_H

#include <limits.h>
#include <stdint.h>
#include <stdio.h>

#include <cjson/cJSON.h>

#include "ganglion/common.h"

/* `ganglion bench NAME ...`: dispatches on argv[1] through the benchmark table. */
int gang_bench_main(int argc, char **argv);
/* Prints the benchmark table (name and one line each). */
void gang_bench_print_list(FILE *out);

/* The benchmarks' entry points (argv[0] = the benchmark's name). */
int gang_bench_rendezvous_main(int argc, char **argv);
int gang_bench_failover_main(int argc, char **argv);
int gang_bench_allreduce_main(int argc, char **argv);
int gang_bench_allreduce_rank_main(int argc, char **argv);
int gang_bench_alltoall_main(int argc, char **argv);
int gang_bench_pipeline_main(int argc, char **argv);
int gang_bench_decode_main(int argc, char **argv);
/* `ganglion bench moe` (bench-moe.c, issue #25). */
int gang_bench_moe_main(int argc, char **argv);
int gang_bench_gemm_main(int argc, char **argv);
int gang_bench_matmul_main(int argc, char **argv);

/* ---------------------------------------------------------------------------------
 * Shared by the control-plane benchmarks (bench.c, bench-rendezvous.c, bench-failover.c).
 * --------------------------------------------------------------------------------- */

#define BENCH_POLL_MS 5
#define BENCH_HTTP_TIMEOUT_MS 1000
#define BENCH_STOP_GRACE_MS 10000
#define BENCH_KILL_GRACE_MS 5000
#define BENCH_EXIT_FAILED GANG_EXIT_TEMPFAIL

/* Options of rendezvous and failover (each table fills the fields it documents). */
typedef struct bench_opts {
    const char *kind;       /* "rendezvous" or "failover" */
    int64_t nodes;          /* rendezvous: agents */
    int64_t trials;         /* timed trials (failover: per kind) */
    int64_t warmup;         /* untimed trials first */
    int64_t timeout_s;      /* deadline of one gang formation / one trial */
    int64_t peer_timeout_s; /* rendezvous: deadline of one mpirun run */
    int no_peer;            /* rendezvous: skip mpirun */
    int no_reform;          /* rendezvous: skip the re-formation after a killed worker */
    int64_t nnodes;         /* failover: gang shape and timings */
    int64_t nproc_per_node; /* failover, rendezvous: ranks per agent */
    int64_t hb_interval_ms;
    int64_t hb_timeout_ms;
    int64_t abort_timeout_ms;
    char kinds[32]; /* failover: "crash,hang" */
    int crash;      /* failover kinds to run, from kinds */
    int hang;
    char agent_log[PATH_MAX]; /* where agents' stdout/stderr go; "" for a temporary file */
    char **extra;             /* serve flags after "--" */
    int nextra;
} bench_opts;

/* Paths and files shared by a run. */
typedef struct bench_ctx {
    char exe[PATH_MAX];      /* this binary's real path */
    char dir[PATH_MAX];      /* its directory, where mpi-barrier lives */
    char log_path[PATH_MAX]; /* agent log */
    int log_fd;
} bench_ctx;

/* The measurements, given parsed options and an open context. */
int gang__bench_rendezvous(bench_ctx *c, const bench_opts *o);
int gang__bench_failover(bench_ctx *c, const bench_opts *o);

/* GETs /status of the agent at host:port and parses it; NULL on any failure. */
cJSON *bench_get_status(const char *host, int port);
/* Number / string at o[k1][k2] (k2 may be NULL); def / "" when absent. */
double bench_jnum(const cJSON *o, const char *k1, const char *k2, double def);
const char *bench_jstr(const cJSON *o, const char *k1, const char *k2);
/* A rendezvous port and the HTTP port above it, both free now. */
int bench_pick_ports(int *rdzv, int *http);
/*
 * Starts argv in a process group of its own, stdout and stderr on out_fd, SIGTERM when
 * this process dies, without GANGLION_LOCAL. Returns 0 and the pid, or a GANG_E* code.
 */
int bench_spawn(char *const *argv, int out_fd, pid_t *out);
/* gang_proc_stop with the benchmarks' grace periods. */
int bench_stop(pid_t *pids, int n, int group);

#endif
