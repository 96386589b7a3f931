/*
 * Pipeline benchmark (internal to launcher/): `ganglion bench pipeline`. Results are JSON
 * lines on stdout, one per (pp, microbatches) point and a summary line; progress and
 * errors go to the log (stderr).
 */
#ifndef GANGLION_LAUNCHER_BENCH_PIPELINE_H
#define GANGLION_LAUNCHER_BENCH_PIPELINE_H

/*
 * Runs the pipeline benchmark and returns the process exit code: 0 when every point was
 * measured (whether or not it met the target), 2 for a usage error, 75 when a stage failed
 * or missed its deadline, 70 for an internal error.
 *
 * argv[0..argc) are the arguments that followed `bench` (argv[0] is "pipeline"):
 *
 *   pipeline [--pp P] [--microbatches M] [--stage-ms T] [--bytes B] [--iters N]
 *            [--warmup W] [--timeout-s S]
 *       P stage threads in this process, connected by the socket communicator, run the
 *       GPipe forward schedule of parallel/pipeline.c on M microbatches of B bytes
 *       (default 64 KiB), each stage spending T/M ms (T default 40) of synthetic work per
 *       microbatch. W untimed batches (default 2), then N timed ones (default 10); the
 *       line reports the median, min and max batch time and ratio = measured efficiency /
 *       bubble bound M/(M+P-1). Without --pp the sweep covers P = 2, 3, 4; without
 *       --microbatches, M = 4, 8, 16. S (default 60) bounds each point.
 *
 * Not reentrant; starts and joins threads, so call it from the main thread.
 */
int gang_bench_pipeline_main(int argc, char **argv);

#endif
