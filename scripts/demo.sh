#!/usr/bin/env bash
# The main job on one machine: make a tiny random Llama-shaped model with `ganglion
# mkmodel`, serve it from a local TP=2 x PP=2 gang on the CPU (2 nodes x 2 ranks on
# 127.0.0.1 / 127.0.0.2), send a few completions and print them with tokens/s, kill -9 a
# worker while a request is in flight and show that the request still completes (with the
# same tokens a healthy gang gives), then stop cleanly.
set -euo pipefail
BIN=${1:-build/bin/ganglion}
HTTP=${DEMO_HTTP_PORT:-18000}
RDZV=${DEMO_RDZV_PORT:-18400}
WORK=$(mktemp -d -t ganglion-demo.XXXXXX)
LOG="$WORK/gang.log"
MODEL="$WORK/model"

echo "== ganglion mkmodel: a random Llama-family model (4 layers, hidden 256, 8 heads / 4 kv heads)"
"$BIN" mkmodel --out "$MODEL" --layers 4 --hidden 256 --heads 8 --kv-heads 4 --ffn 512 \
    --vocab 1024 --max-pos 512 --seed 1 --dtype bf16
ls -l "$MODEL"

"$BIN" serve --local --nnodes 2 --nproc-per-node 2 --tp 2 --pp 2 --microbatches 2 \
    --model "$MODEL" --kv-cache-mb 64 --max-batch 8 \
    --http-port "$HTTP" --rdzv-port "$RDZV" \
    --heartbeat-interval-ms 100 --heartbeat-timeout-ms 1000 >"$LOG" 2>&1 &
GANG=$!
cleanup() { kill -TERM "$GANG" 2>/dev/null || true; wait "$GANG" 2>/dev/null || true; }
trap cleanup EXIT

status() { curl -s --max-time 2 "http://$1:$HTTP/status"; }
field() { python3 -c "import json,sys; d=json.load(sys.stdin); print(eval('d'+sys.argv[1]))" "$1"; }
complete() { curl -s --max-time 120 -H 'Content-Type: application/json' -d "$1" "http://127.0.0.1:$HTTP/v1/completions"; }
show() {
    python3 -c '
import json, sys
r = json.load(sys.stdin)
if "error" in r:
    print("  error:", r["error"]); sys.exit(1)
c, t = r["choices"][0], r["timings"]
toks = c["tokens"]
more = " ... (%d more)" % (len(toks) - 32) if len(toks) > 32 else ""
print("  tokens (%d, %s): %s%s" % (len(toks), c["finish_reason"], " ".join(map(str, toks[:32])), more))
print("  prefill %.1f ms, decode %.1f tokens/s, total %.1f ms, generations of the gang: %d"
      % (t["prefill_ms"], t["decode_tokens_per_s"], t["total_ms"], t["generations"]))'
}

echo
echo "== starting a local gang: TP=2 x PP=2 (agents on 127.0.0.1 and 127.0.0.2)"
t0=$(date +%s%N)
for _ in $(seq 1 600); do
    if curl -sf --max-time 1 "http://127.0.0.1:$HTTP/readyz" >/dev/null 2>&1 &&
       curl -sf --max-time 1 "http://127.0.0.2:$HTTP/readyz" >/dev/null 2>&1; then break; fi
    if ! kill -0 "$GANG" 2>/dev/null; then echo "the gang exited; log:"; tail -40 "$LOG"; exit 1; fi
    sleep 0.1
done
curl -sf --max-time 1 "http://127.0.0.1:$HTTP/readyz" >/dev/null || { echo "gang did not form; log:"; tail -40 "$LOG"; exit 1; }
echo "gang READY after $(( ($(date +%s%N) - t0) / 1000000 )) ms (process start-up and model loading included)"

echo
echo "== three completions (POST /v1/completions)"
for body in '{"prompt":[1,2,3,4],"max_tokens":16}' \
            '{"prompt":[10,20,30],"max_tokens":16,"temperature":0.8,"top_p":0.9,"seed":7}' \
            '{"prompt":[5,6,7,8,9,10,11,12],"max_tokens":32}'; do
    echo "  request: $body"
    complete "$body" | show
done

echo
echo "== a bad request gets a JSON error and changes nothing"
curl -s --max-time 5 -H 'Content-Type: application/json' -d '{"prompt":[1,99999],"max_tokens":4}' \
    -w '  HTTP %{http_code}\n' "http://127.0.0.1:$HTTP/v1/completions"; echo

LONG='{"prompt":[42,43,44],"max_tokens":300}'
gen=$(status 127.0.0.1 | field "['gang']['generation']")
victim=$(status 127.0.0.2 | field "['local_ranks'][1]['pid']")
echo
echo "== kill -9 worker rank 3 (pid $victim, node 1) while a 300-token request is in flight"
complete "$LONG" >"$WORK/long.json" &
CURL=$!
for _ in $(seq 1 500); do
    if curl -s --max-time 1 "http://127.0.0.1:$HTTP/metrics" | grep -q '^ganglion_requests_in_flight [1-9]'; then break; fi
    sleep 0.01
done
tk=$(python3 -c 'import time; print(int(time.time()*1000))')
kill -9 "$victim"
wait "$CURL"
for _ in $(seq 1 300); do
    s=$(status 127.0.0.1 || true)
    if [ -n "$s" ] && [ "$(echo "$s" | field "['gang']['state']")" = serving ] &&
       [ "$(echo "$s" | field "['gang']['generation']")" -gt "$gen" ]; then break; fi
    sleep 0.02
done
s=$(status 127.0.0.1)
tr=$(echo "$s" | field "['gang']['serving_since_wall_ms']")
echo "gang READY again in generation $(echo "$s" | field "['gang']['generation']") after $(( tr - tk )) ms"
echo "reason recorded: $(echo "$s" | field "['gang']['last_failure']['reason']")"
echo "the request that was in flight:"
show <"$WORK/long.json"
echo "the same request on the healthy gang, for comparison:"
complete "$LONG" >"$WORK/again.json"
show <"$WORK/again.json"
python3 - "$WORK/long.json" "$WORK/again.json" <<'EOF'
import json, sys
a, b = (json.load(open(p))["choices"][0]["tokens"] for p in sys.argv[1:3])
print("  identical tokens: %s" % (a == b))
sys.exit(0 if a == b else 1)
EOF

echo
echo "== stopping the gang (SIGTERM)"
cleanup
trap - EXIT
echo "done; logs and model in $WORK"
