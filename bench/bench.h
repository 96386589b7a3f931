/*
 * Control-plane benchmarks (internal to launcher/): `ganglion bench rendezvous` and
 * `ganglion bench failover`. Results are JSON lines on stdout, one per trial and a summary
 * line with medians; progress and errors go to the log (stderr). The agents the
 * benchmarks start log to a file whose path every line names ("agent_log").
 */
#ifndef GANGLION_LAUNCHER_BENCH_H
#define GANGLION_LAUNCHER_BENCH_H

/*
 * Runs one control-plane benchmark and returns the process exit code: 0 when every trial
 * measured, 2 for a usage error, 75 when a gang did not form or re-form within its
 * deadline (the trial's JSON line then carries "error").
 *
 * argv[0..argc) are the arguments that followed `bench` (a leading "bench" is skipped):
 *
 *   rendezvous --nodes N [--trials T] [--warmup W] [--timeout-s S] [--no-peer]
 *              [--peer-timeout-s S] [--agent-log FILE] [-- EXTRA SERVE FLAGS]
 *       Starts N agents directly (one rank each, each on its own 127.0.0.x address) and
 *       times first fork -> coordinator's gang.state "serving". Then times the peer,
 *       `mpirun -np N mpi-barrier` (the mpi-barrier binary next to ganglion), and prints
 *       the ratio mpirun_s / ganglion_s. Warm-up trials run both too. On a 2-core
 *       machine mpirun -np 256 takes minutes: use --warmup 0 --trials 1 there.
 *
 *   failover [--trials T] [--nnodes P] [--nproc-per-node Q] [--heartbeat-interval-ms I]
 *            [--heartbeat-timeout-ms H] [--kinds crash,hang] [--timeout-s S]
 *            [--agent-log FILE] [-- EXTRA SERVE FLAGS]
 *       Starts `serve --local`, then per trial SIGKILLs (crash) or SIGSTOPs (hang) a
 *       worker of a non-coordinator node and measures the detection latency at the last
 *       agent that learns of it and the time until the gang serves a newer generation.
 *
 * Not reentrant; forks and reaps children, so call it from the main thread.
 */
int gang_bench_main(int argc, char **argv);

/* Looks for an executable `name` in $PATH; fills out and returns 1 when found (shared by
 * the benchmarks that start mpirun). */
int gang__bench_find_in_path(const char *name, char *out, size_t cap);

#endif
