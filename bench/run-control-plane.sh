#!/usr/bin/env bash
# Control-plane benchmarks of issue #2, as recorded in docs/benchmarks.md:
# rendezvous time for 8, 64 and 256 nodes against `mpirun -np N` of a trivial MPI program
# (MPI_Init, MPI_Barrier, MPI_Finalize) in the same run, and failover detection and
# re-formation medians for crashes (SIGKILL) and hangs (SIGSTOP) of a worker.
# Run it on an otherwise idle machine: 256 agents + 256 workers load 2 cores heavily.
set -euo pipefail
BIN=${1:-build/bin/ganglion}
OUT=${2:-bench-results}
mkdir -p "$OUT"
"$BIN" bench rendezvous --nodes 8 --trials 5 | tee "$OUT/rendezvous-8.jsonl" | tail -1
"$BIN" bench rendezvous --nodes 64 --trials 5 | tee "$OUT/rendezvous-64.jsonl" | tail -1
# mpirun -np 256 takes minutes here: one trial of the peer, no warm-up.
"$BIN" bench rendezvous --nodes 256 --trials 1 --warmup 0 | tee "$OUT/rendezvous-256.jsonl" | tail -1
"$BIN" bench failover --trials 10 | tee "$OUT/failover.jsonl" | tail -1
