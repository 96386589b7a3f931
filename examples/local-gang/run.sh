#!/usr/bin/env bash
# Serve a model from a local gang and call its OpenAI-compatible API with curl.
#
#   GANGLION=build/bin/ganglion examples/local-gang/run.sh
#
# 1. the model: $MODEL if set, else SmolLM2-135M-Instruct fetched (once, cached) by
#    scripts/fetch-reference.sh smollm2; any Hugging Face directory with config.json,
#    *.safetensors, tokenizer.json and tokenizer_config.json (the chat template) works;
# 2. an API key in a file: clients must send "Authorization: Bearer KEY";
# 3. `ganglion serve --local --api-key-file FILE` starts the whole gang on this host:
#    NNODES agents on 127.0.0.1, 127.0.0.2, ... (the same ports on each address), NPROC
#    worker ranks per agent, TP x PP = NNODES x NPROC; agent 0 is the coordinator and
#    serves the API;
# 4. it waits (with a deadline) until /readyz answers 200 (the probes need no key);
# 5. curl: the model list, a request without the key (401), a text completion
#    (POST /v1/completions), a chat (POST /v1/chat/completions) and a streamed chat
#    ("stream": true: Server-Sent Events, `data: {chunk}` lines, then `data: [DONE]`);
# 6. it stops the gang (SIGTERM; the agents stop their workers and exit 0).
#
# Environment (all optional):
#   GANGLION      the ganglion binary (default: `ganglion` on PATH)
#   MODEL         the model directory (default: SmolLM2-135M-Instruct, fetched)
#   HTTP_PORT     API / probe port of every agent (default 8000)
#   RDZV_PORT     rendezvous port of the coordinator (default 29400)
#   NNODES NPROC TP PP   gang shape (default 2 1 1 2: 2 pipeline stages on 2 agents;
#                 SmolLM2's 3 KV heads allow TP 1 or 3)
#   MAX_TOKENS    tokens per answer (default 24)
#   READY_TIMEOUT seconds to wait for the gang (default 120)
#   WORKDIR       where the key and the log go (default: a new temp dir, removed at exit)
# Exit status: 0 done; 1 a step failed; 77 no model could be had (the reason is printed).
# To keep the gang running for your own requests, start it the same way without `&`:
#   ganglion serve --local --model DIR --nnodes 2 --pp 2 --api-key-file KEYFILE
# shellcheck disable=SC2016 # call() prints each command single-quoted as written, then evals it
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
GANGLION=${GANGLION:-ganglion}
HTTP_PORT=${HTTP_PORT:-8000}
RDZV_PORT=${RDZV_PORT:-29400}
NNODES=${NNODES:-2} NPROC=${NPROC:-1} TP=${TP:-1} PP=${PP:-2}
MAX_TOKENS=${MAX_TOKENS:-24}
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

if [ -z "${MODEL:-}" ]; then
    echo "== the model: SmolLM2-135M-Instruct (scripts/fetch-reference.sh smollm2, cached)"
    if ! MODEL=$(bash "$here/../../scripts/fetch-reference.sh" smollm2 | tail -1) ||
        [ ! -f "$MODEL/config.json" ]; then
        echo "SKIP: no model: scripts/fetch-reference.sh smollm2 failed (reason above); set MODEL=DIR"
        exit 77
    fi
fi
echo "== model $MODEL"

# The API key: any printable ASCII without spaces; 32 random bytes in hex here.
KEYFILE=$WORKDIR/api-key
(umask 077 && od -An -tx1 -N32 /dev/urandom | tr -d ' \n' >"$KEYFILE")
# shellcheck disable=SC2034 # read by the commands that call() evals
API_KEY=$(cat "$KEYFILE")

echo "== ganglion serve --local: $NNODES nodes x $NPROC ranks, TP=$TP x PP=$PP, API on $API"
"$GANGLION" serve --local --model "$MODEL" --nnodes "$NNODES" \
    --nproc-per-node "$NPROC" --tp "$TP" --pp "$PP" --api-key-file "$KEYFILE" \
    --max-batch 4 --http-port "$HTTP_PORT" --rdzv-port "$RDZV_PORT" \
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
echo "gang ready (GET /readyz needs no key)"

# Prints the command (with $API_KEY, not the key), runs it, ends the output with a newline.
call() {
    echo "\$ $1"
    eval "$1"
    echo
}

echo; echo "== the API without the key: 401"
call 'curl -sS --max-time 10 -w " HTTP %{http_code}\n" "$API/v1/models"'

echo "== GET /v1/models"
call 'curl -sS --fail-with-body --max-time 10 "$API/v1/models" -H "Authorization: Bearer $API_KEY"'

echo "== POST /v1/completions: a text prompt"
call 'curl -sS --fail-with-body --max-time 120 "$API/v1/completions" \
    -H "Authorization: Bearer $API_KEY" -H "Content-Type: application/json" \
    -d "{\"prompt\": \"The capital of France is\", \"max_tokens\": $MAX_TOKENS, \"temperature\": 0}"'

echo "== POST /v1/chat/completions: messages through the model's chat template"
call 'curl -sS --fail-with-body --max-time 120 "$API/v1/chat/completions" \
    -H "Authorization: Bearer $API_KEY" -H "Content-Type: application/json" \
    -d "{\"messages\": [{\"role\": \"system\", \"content\": \"You are a concise assistant.\"},
                       {\"role\": \"user\", \"content\": \"What is the capital of France?\"}],
         \"max_tokens\": $MAX_TOKENS, \"temperature\": 0}"'

echo "== the same chat, streamed (-N: print each event as it arrives)"
call 'curl -sS -N --fail-with-body --max-time 120 "$API/v1/chat/completions" \
    -H "Authorization: Bearer $API_KEY" -H "Content-Type: application/json" \
    -d "{\"messages\": [{\"role\": \"system\", \"content\": \"You are a concise assistant.\"},
                       {\"role\": \"user\", \"content\": \"What is the capital of France?\"}],
         \"max_tokens\": $MAX_TOKENS, \"temperature\": 0, \"stream\": true,
         \"stream_options\": {\"include_usage\": true}}"'

echo "== done; stopping the gang"
