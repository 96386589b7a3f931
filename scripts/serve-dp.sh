#!/usr/bin/env bash
# Data-parallel replicas on one machine (issue #26): N independent gangs, each a
# `ganglion serve --local` with its own rendezvous and HTTP ports (it forms, restarts and
# fails on its own), behind one `ganglion router`. The local counterpart of N
# StatefulSets and a router Deployment (docs/operations.md, "Data-parallel replicas");
# `ganglion serve --local --dp N` does the same without the shell, but cannot pin.
#
# usage: scripts/serve-dp.sh [--dp N] [--port P] [--base-port B] [--pin]
#                            [--router-flags "FLAGS"] [--logs DIR] BIN [serve flags...]
#   --dp N          replicas (default 2)
#   --port P        the router's HTTP port on 127.0.0.1 (default 8000)
#   --base-port B   gang i uses rendezvous port B+2i and HTTP port B+2i+1 (default 29500)
#   --pin           run gang i on CPU core i (taskset), so replicas do not share a core
#   --router-flags  extra flags of `ganglion router` (e.g. "--policy round-robin")
#   --logs DIR      one log per gang and the router's (default: a new temporary folder)
# Every other argument after BIN is a serve flag, given to every gang (--model, --tp...).
# SIGINT / SIGTERM stop the router and every gang, each within its own grace period
# (local mode's: SIGTERM, then SIGKILL after 5 s).
set -euo pipefail

dp=2 port=8000 base=29500 pin=0 router_flags="" logs=""
while [ $# -gt 0 ]; do
    case "$1" in
    --dp) dp="$2"; shift 2 ;;
    --port) port="$2"; shift 2 ;;
    --base-port) base="$2"; shift 2 ;;
    --pin) pin=1; shift ;;
    --router-flags) router_flags="$2"; shift 2 ;;
    --logs) logs="$2"; shift 2 ;;
    -h | --help) sed -n '2,18p' "$0"; exit 0 ;;
    *) break ;;
    esac
done
if [ $# -lt 1 ] || ! [ -x "$1" ]; then
    echo "serve-dp: the ganglion binary is required (see --help)" >&2
    exit 2
fi
if ! [ "$dp" -ge 1 ] 2>/dev/null || [ "$dp" -gt 64 ]; then
    echo "serve-dp: --dp must be 1..64" >&2
    exit 2
fi
bin="$1"
shift
logs="${logs:-$(mktemp -d -t ganglion-dp-XXXXXX)}"
mkdir -p "$logs"
ncpu=$(nproc)
pids=()
replicas=""

stop() {
    trap - INT TERM
    for pid in "${pids[@]}"; do
        kill -TERM "$pid" 2>/dev/null || true
    done
    # Local mode needs at most 10 s (SIGTERM, then SIGKILL of its agents): wait that long.
    for _ in $(seq 1 120); do
        alive=0
        for pid in "${pids[@]}"; do
            if kill -0 "$pid" 2>/dev/null; then alive=1; fi
        done
        [ "$alive" = 0 ] && break
        sleep 0.1
    done
    for pid in "${pids[@]}"; do
        kill -KILL "$pid" 2>/dev/null || true
    done
}
trap 'stop; exit 0' INT TERM

for i in $(seq 0 $((dp - 1))); do
    rdzv=$((base + 2 * i))
    http=$((base + 2 * i + 1))
    cmd=("$bin" serve --local --rdzv-port "$rdzv" --http-port "$http" --job-name "dp-$i" "$@")
    if [ "$pin" = 1 ]; then
        cmd=(taskset -c $((i % ncpu)) "${cmd[@]}")
    fi
    "${cmd[@]}" >"$logs/gang-$i.log" 2>&1 &
    pids+=("$!")
    replicas="${replicas:+$replicas,}127.0.0.1:$http"
    echo "serve-dp: gang $i (pid $!): rendezvous $rdzv, HTTP $http, log $logs/gang-$i.log"
done
# shellcheck disable=SC2086 # router_flags is a list of flags
"$bin" router --replicas "$replicas" --bind-address 127.0.0.1 --http-port "$port" \
    $router_flags >"$logs/router.log" 2>&1 &
pids+=("$!")
echo "serve-dp: router (pid $!) on http://127.0.0.1:$port, log $logs/router.log"
# Stays until a signal, or until the router exits (then everything stops).
wait "${pids[-1]}" || true
stop
