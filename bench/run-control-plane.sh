#!/usr/bin/env bash
# Control-plane benchmarks of issue #2, as recorded in docs/benchmarks.md:
# rendezvous time for 8, 64 and 256 nodes against `mpirun -np N` of a trivial MPI program,
# and failover detection / re-formation medians for crashes and hangs.
set -euo pipefail
BIN=${1:-build/bin/ganglion}
OUT=${2:-bench-results}
mkdir -p "$OUT"
for n in 8 64 256; do
    trials=5; [ "$n" -ge 256 ] && trials=3
    "$BIN" bench rendezvous --nodes "$n" --trials "$trials" | tee "$OUT/rendezvous-$n.jsonl" | tail -1
done
"$BIN" bench failover --trials 10 | tee "$OUT/failover.jsonl" | grep summary
