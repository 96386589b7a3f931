/*
 * Communicator benchmarks (internal to launcher/): `ganglion bench allreduce`. Results
 * are JSON lines on stdout, one per message size and a summary line; progress and errors
 * go to the log (stderr).
 */
#ifndef GANGLION_LAUNCHER_BENCH_COMM_H
#define GANGLION_LAUNCHER_BENCH_COMM_H

/*
 * Runs the all-reduce benchmark and returns the process exit code: 0 when every size was
 * measured (a failed or missing peer only adds a line), 2 for a usage error, 75 when the
 * ganglion ranks failed or missed their deadline, 70 for an internal error.
 *
 * argv[0..argc) are the arguments that followed `bench` (argv[0] is "allreduce"):
 *
 *   allreduce [--ranks N] [--backend socket|mpi] [--max-bytes B] [--timeout-s S]
 *             [--no-peer]
 *       Times gang_comm_all_reduce (f32, sum, in place) on N ranks for 4 KiB, 16 KiB, ...
 *       up to B bytes (default 64 MiB): warm-up iterations, then timed iterations, fewer
 *       for large sizes. socket: this process forks the N ranks; mpi: `mpirun -np N
 *       ganglion bench allreduce-rank ...`. In the same run the peer, `mpirun -np N
 *       mpi-allreduce` (Open MPI's MPI_Allreduce on the same sizes and iteration counts,
 *       the binary next to ganglion), and the ratio of bus bandwidths is printed.
 *
 *   allreduce-rank --backend mpi --sizes L --iters L --warmup L
 *       Hidden: one rank under mpirun; prints {"rank","bytes","time_us"} lines.
 *
 * Not reentrant; forks and reaps children, so call it from the main thread.
 */
int gang_bench_allreduce_main(int argc, char **argv);

#endif
