#!/usr/bin/env bash
# The main job on one machine, until the data plane exists: a local gang of 2 nodes x 2
# ranks forms, /status is shown, one worker is killed with SIGKILL, and the script prints
# how fast the gang noticed and re-formed in the next generation.
set -euo pipefail
BIN=${1:-build/bin/ganglion}
HTTP=${DEMO_HTTP_PORT:-18000}
RDZV=${DEMO_RDZV_PORT:-18400}
LOG=$(mktemp -t ganglion-demo.XXXXXX.log)

"$BIN" serve --local --nnodes 2 --nproc-per-node 2 --tp 2 --pp 2 \
    --http-port "$HTTP" --rdzv-port "$RDZV" \
    --heartbeat-interval-ms 100 --heartbeat-timeout-ms 1000 >"$LOG" 2>&1 &
GANG=$!
cleanup() { kill -TERM "$GANG" 2>/dev/null || true; wait "$GANG" 2>/dev/null || true; }
trap cleanup EXIT

status() { curl -s --max-time 2 "http://$1:$HTTP/status"; }
field() { python3 -c "import json,sys; d=json.load(sys.stdin); print(eval('d'+sys.argv[1]))" "$1"; }

echo "== starting a local gang: 2 nodes x 2 ranks (agents on 127.0.0.1 and 127.0.0.2)"
t0=$(date +%s%N)
for _ in $(seq 1 300); do
    if curl -sf --max-time 1 "http://127.0.0.1:$HTTP/readyz" >/dev/null 2>&1 &&
       curl -sf --max-time 1 "http://127.0.0.2:$HTTP/readyz" >/dev/null 2>&1; then break; fi
    sleep 0.1
done
curl -sf --max-time 1 "http://127.0.0.1:$HTTP/readyz" >/dev/null || { echo "gang did not form; log:"; tail -40 "$LOG"; exit 1; }
echo "gang READY after $(( ($(date +%s%N) - t0) / 1000000 )) ms (including process start-up)"
echo
echo "== GET http://127.0.0.1:$HTTP/status (coordinator)"
status 127.0.0.1 | python3 -m json.tool
gen=$(status 127.0.0.1 | field "['gang']['generation']")
victim=$(status 127.0.0.2 | field "['local_ranks'][1]['pid']")
echo
echo "== kill -9 worker rank 3 (pid $victim, node 1) in generation $gen"
tk=$(python3 -c 'import time; print(int(time.time()*1000))')
kill -9 "$victim"
for _ in $(seq 1 300); do
    s=$(status 127.0.0.1 || true)
    if [ -n "$s" ] && [ "$(echo "$s" | field "['gang']['state']")" = serving ] &&
       [ "$(echo "$s" | field "['gang']['generation']")" -gt "$gen" ]; then break; fi
    sleep 0.02
done
a0=$(status 127.0.0.1 | field "['last_abort_wall_ms']")
a1=$(status 127.0.0.2 | field "['last_abort_wall_ms']")
last=$(( a0 > a1 ? a0 : a1 ))
s=$(status 127.0.0.1)
tr=$(echo "$s" | field "['gang']['serving_since_wall_ms']")
echo "failure noticed by every agent after $(( last - tk )) ms (last survivor to learn of it)"
echo "gang READY again in generation $(echo "$s" | field "['gang']['generation']") after $(( tr - tk )) ms (includes the respawned worker's start-up)"
echo "reason: $(echo "$s" | field "['gang']['last_failure']['reason']")"
echo
echo "== stopping the gang (SIGTERM)"
cleanup
trap - EXIT
echo "done; agent logs: $LOG"
