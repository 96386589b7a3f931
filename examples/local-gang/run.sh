#!/usr/bin/env bash
# Serve a tiny model from a local gang and call it with curl.
#
#   GANGLION=build/bin/ganglion examples/local-gang/run.sh
#
# 1. `ganglion mkmodel` writes a deterministic random Llama-shaped model (a few MB);
# 2. `ganglion serve --local` starts the whole gang on this host: NNODES agents on
#    127.0.0.1, 127.0.0.2, ... (the same ports on each address), NPROC worker ranks per
#    agent, TP x PP = NNODES x NPROC; agent 0 is the coordinator and serves the API;
# 3. it waits (with a deadline) until /readyz answers 200 on every agent;
# 4. `curl POST /v1/completions` sends a prompt (token ids) and prints the answer;
# 5. it stops the gang (SIGTERM; the agents stop their workers and exit 0).
#
# Environment (all optional):
#   GANGLION      the ganglion binary (default: `ganglion` on PATH)
#   HTTP_PORT     API / probe port of every agent (default 8000)
#   RDZV_PORT     rendezvous port of the coordinator (default 29400)
#   NNODES NPROC TP PP   gang shape (default 2 2 2 2: TP=2 inside a node, PP=2 across nodes)
#   READY_TIMEOUT seconds to wait for the gang (default 120)
#   WORKDIR       where the model and the log go (default: a new temp dir, removed at exit)
# To keep the gang running for your own requests, start it the same way without `&`:
#   ganglion serve --local --model DIR --nnodes 2 --nproc-per-node 2 --tp 2 --pp 2
set -euo pipefail
GANGLION=${GANGLION:-ganglion}
HTTP_PORT=${HTTP_PORT:-8000}
RDZV_PORT=${RDZV_PORT:-29400}
NNODES=${NNODES:-2} NPROC=${NPROC:-2} TP=${TP:-2} PP=${PP:-2}
READY_TIMEOUT=${READY_TIMEOUT:-120}
if [ -n "${WORKDIR:-}" ]; then mkdir -p "$WORKDIR"; OWN_WORKDIR=0; else
    WORKDIR=$(mktemp -d -t ganglion-example.XXXXXX); OWN_WORKDIR=1; fi
API=http://127.0.0.1:$HTTP_PORT

GANG=
cleanup() {
    if [ -n "$GANG" ] && kill -0 "$GANG" 2>/dev/null; then
        kill -TERM "$GANG" 2>/dev/null || true
        # The agents exit within about --abort-timeout-ms; SIGKILL after 10 s regardless.
        for _ in $(seq 100); do kill -0 "$GANG" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$GANG" 2>/dev/null || true
        wait "$GANG" 2>/dev/null || true
    fi
    if [ "$OWN_WORKDIR" = 1 ]; then rm -rf "$WORKDIR"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

echo "== ganglion mkmodel (2 layers per stage, hidden 128, 4 heads / 2 kv heads)"
"$GANGLION" mkmodel --out "$WORKDIR/model" --layers $((2 * PP)) --hidden 128 --heads 4 \
    --kv-heads 2 --ffn 256 --vocab 512 --seed 1 --dtype bf16

echo "== ganglion serve --local: $NNODES nodes x $NPROC ranks, TP=$TP x PP=$PP, API on $API"
"$GANGLION" serve --local --model "$WORKDIR/model" --nnodes "$NNODES" \
    --nproc-per-node "$NPROC" --tp "$TP" --pp "$PP" --microbatches 2 \
    --kv-cache-mb 16 --max-batch 4 --http-port "$HTTP_PORT" --rdzv-port "$RDZV_PORT" \
    >"$WORKDIR/gang.log" 2>&1 &
GANG=$!

deadline=$((SECONDS + READY_TIMEOUT))
until curl -sf --max-time 1 "$API/readyz" >/dev/null 2>&1; do
    if ! kill -0 "$GANG" 2>/dev/null; then
        echo "the gang exited; its log:"; tail -30 "$WORKDIR/gang.log"; exit 1; fi
    if [ $SECONDS -ge $deadline ]; then
        echo "not ready after ${READY_TIMEOUT}s; log:"; tail -30 "$WORKDIR/gang.log"; exit 1; fi
    sleep 0.2
done
echo "gang ready: $(curl -s --max-time 2 "$API/status" | head -c 200)..."

echo "== POST /v1/completions"
set -x
curl -sS --fail-with-body --max-time 60 "$API/v1/completions" \
    -H 'Content-Type: application/json' \
    -d '{"prompt": [1, 15, 42, 7], "max_tokens": 8, "temperature": 0.7, "top_p": 0.9, "seed": 1}'
{ set +x; } 2>/dev/null
echo
echo "== done; stopping the gang"
