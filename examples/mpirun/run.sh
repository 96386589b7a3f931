#!/usr/bin/env bash
# Launch a ganglion gang with Open MPI's mpirun: one agent per MPI rank (one rank per
# node), each spawning --nproc-per-node workers. The identity (node index, --nnodes)
# comes from mpirun; the coordinator address is passed in COORDINATOR. See docs/mpi.md.
#
#   GANGLION=build/bin/ganglion examples/mpirun/run.sh
#
# This demo runs both "nodes" on this machine (ONE_HOST=1: agents on 127.0.0.1 and
# 127.0.0.2), serves a tiny model made by `ganglion mkmodel` with TP=2 x PP=2, sends one
# completion with curl and stops the job. On a cluster the launch line is, e.g.:
#
#   mpirun -np 2 --map-by ppr:1:node --host node-a,node-b \
#       -x GANGLION -x COORDINATOR=node-a:29400 \
#       examples/mpirun/agent.sh --model /models/llama --nproc-per-node 8 --tp 8 --pp 2 \
#       --token-file /etc/ganglion/token
#
# The workers' data plane is ganglion's own (socket backend on CPUs, NCCL with
# --device cuda): `serve` refuses --backend mpi, which is for the benchmarks and tests.
# Open MPI has no fault tolerance: when an agent exits, mpirun ends the whole job; a
# worker that dies is still restarted by its agent (the gang re-forms in place).
#
# Environment (all optional): GANGLION (binary, default `ganglion` on PATH), MPIRUN
# (default mpirun), HTTP_PORT (8000), RDZV_PORT (29400), READY_TIMEOUT (120 s), WORKDIR.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
GANGLION=${GANGLION:-ganglion}
MPIRUN=${MPIRUN:-mpirun}
HTTP_PORT=${HTTP_PORT:-8000}
RDZV_PORT=${RDZV_PORT:-29400}
READY_TIMEOUT=${READY_TIMEOUT:-120}
if [ -n "${WORKDIR:-}" ]; then mkdir -p "$WORKDIR"; OWN_WORKDIR=0; else
    WORKDIR=$(mktemp -d -t ganglion-mpirun.XXXXXX); OWN_WORKDIR=1; fi
API=http://127.0.0.1:$HTTP_PORT
# The binary by absolute path, so that the ranks find it whatever their directory.
GANGLION=$(command -v "$GANGLION") || { echo "ganglion binary not found: set GANGLION"; exit 1; }

JOB=
cleanup() {
    if [ -n "$JOB" ] && kill -0 "$JOB" 2>/dev/null; then
        # mpirun forwards SIGTERM to the ranks; each agent stops its workers and exits 0.
        kill -TERM "$JOB" 2>/dev/null || true
        for _ in $(seq 100); do kill -0 "$JOB" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$JOB" 2>/dev/null || true
        wait "$JOB" 2>/dev/null || true
    fi
    if [ "$OWN_WORKDIR" = 1 ]; then rm -rf "$WORKDIR"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

"$GANGLION" mkmodel --out "$WORKDIR/model" --layers 4 --hidden 128 --heads 4 --kv-heads 2 \
    --ffn 256 --vocab 512 --seed 1 --dtype bf16 >/dev/null

root=()
if [ "$(id -u)" = 0 ]; then root=(--allow-run-as-root); fi  # containers often run as root
echo "== mpirun -np 2: one agent per rank, TP=2 x PP=2, API on $API"
GANGLION=$GANGLION COORDINATOR=127.0.0.1:$RDZV_PORT ONE_HOST=1 \
    "$MPIRUN" "${root[@]}" --oversubscribe -np 2 \
    -x GANGLION -x COORDINATOR -x ONE_HOST \
    "$here/agent.sh" --model "$WORKDIR/model" --nproc-per-node 2 --tp 2 --pp 2 \
    --kv-cache-mb 16 --max-batch 4 --http-port "$HTTP_PORT" --rdzv-port "$RDZV_PORT" \
    >"$WORKDIR/mpirun.log" 2>&1 &
JOB=$!

deadline=$((SECONDS + READY_TIMEOUT))
until curl -sf --max-time 1 "$API/readyz" >/dev/null 2>&1; do
    if ! kill -0 "$JOB" 2>/dev/null; then
        echo "mpirun exited; its log:"; tail -30 "$WORKDIR/mpirun.log"; exit 1; fi
    if [ $SECONDS -ge $deadline ]; then
        echo "not ready after ${READY_TIMEOUT}s; log:"; tail -30 "$WORKDIR/mpirun.log"; exit 1; fi
    sleep 0.2
done
echo "gang ready; identity of node 1: $(curl -s --max-time 2 "http://127.0.0.2:$HTTP_PORT/status" |
    python3 -c 'import json,sys; s=json.load(sys.stdin); print("node", s["node_index"], "of", s["nnodes"], "from", s["identity_source"])')"

echo "== POST /v1/completions"
curl -sS --fail-with-body --max-time 60 "$API/v1/completions" -H 'Content-Type: application/json' \
    -d '{"prompt": [1, 15, 42, 7], "max_tokens": 8}'
echo
echo "== done; stopping the job"
