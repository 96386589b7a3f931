#!/usr/bin/env bash
# Runs llama.cpp's server test suite (tools/server/tests, from the llama-cpp-python sdist
# that bench/build-llama-cpp.sh unpacks and caches) against llama-server and against
# ganglion, on the same local GGUF (SmolLM2-135M-Instruct Q4_1), offline (issue #28).
#
#   bash bench/llama-suite.sh [BUILD_DIR] [pytest file args...]
#
# (default: the files and tests below that speak the OpenAI API or the neighbours ganglion
# documents; both servers run their copy of the suite at once, without the tests marked
# slow, as the suite's own tests.sh runs by default: they fetch bigger models; set
# LLAMA_SUITE_MARK="" to run them too.) LLAMA_SUITE_OUT keeps the logs and XML.
#
# bench/llama_suite_plugin.py makes the suite serve the one local file (no Hugging Face
# download) and start `ganglion serve --local` for the ganglion run; the tests listed in
# bench/llama-suite-xfail.txt assert llama.cpp-only behaviour and are expected failures
# there, with the reason on their line. bench/llama_suite_report.py prints the counts and
# fails when a test that passed on llama-server failed on ganglion without being listed.
# llama-server runs with LLAMA_ARG_REPACK=false: its AMX repacked matmul crashes at the
# warm-up on this machine's CPU (SIGSEGV in ggml_backend_amx_mul_mat).
# The suite's requirements go into $CACHE/llama-suite-venv once (PyPI).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=scripts/cache-paths.sh
. "$ROOT/scripts/cache-paths.sh"
BUILD=${1:-build}
shift || true
FILES=("$@")
if [ ${#FILES[@]} -eq 0 ]; then
    # The tests that speak the OpenAI API or its neighbours (/health, /v1/models, /tokenize,
    # the API key, CORS, streaming, tools): whole files where most of them do, single tests
    # where the rest of the file is llama.cpp's native /completion. docs/api.md says why
    # the other files are not run. About 13 minutes for both servers at once on two cores
    # (load average 4-5).
    FILES=(unit/test_basic.py unit/test_tokenize.py unit/test_chat_completion.py
        unit/test_security.py unit/test_stream.py unit/test_tool_call.py
        unit/test_completion.py::test_completion_with_openai_library
        unit/test_completion.py::test_completion_stream_with_openai_library
        unit/test_ctx_shift.py::test_ctx_shift_disabled_stream)
fi
BIN=$ROOT/$BUILD/bin/ganglion
[ -x "$BIN" ] || { echo "llama-suite: no $BIN (make build first)" >&2; exit 2; }
LLAMA_BIN=$(bash "$ROOT/bench/build-llama-cpp.sh")
SUITE=$(dirname "$LLAMA_BIN")/server-tests
[ -d "$SUITE/unit" ] || { echo "llama-suite: no test suite in $SUITE" >&2; exit 2; }
GGUF=$(bash "$ROOT/scripts/fetch-reference.sh" smollm2-gguf)
VENV=$CACHE/llama-suite-venv
if [ ! -x "$VENV/bin/pytest" ]; then
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q "pytest~=8.3.3" "requests~=2.32.3" "wget~=3.2" \
        "filelock~=3.16" "openai~=2.14.0" "prometheus-client~=0.20.0" aiohttp numpy
fi
work=$(mktemp -d /tmp/ganglion-llama-suite.XXXXXX)
trap 'rm -rf "$work"' EXIT
out=${LLAMA_SUITE_OUT:-$work}
port=${LLAMA_SUITE_PORT:-18700}
mark=${LLAMA_SUITE_MARK-not slow}
# Both targets at once, each on its own port and copy of the suite.
pids=()
for target in llama-server ganglion; do
    cp -r "$SUITE" "$work/$target"
    (cd "$work/$target" && env PYTHONPATH="$ROOT/bench" SUITE_TARGET="$target" SUITE_GGUF="$GGUF" \
        SUITE_GANGLION_BIN="$BIN" SUITE_XFAIL="$ROOT/bench/llama-suite-xfail.txt" \
        LLAMA_SERVER_BIN_PATH="$LLAMA_BIN/llama-server" LLAMA_ARG_REPACK=false PORT="$port" \
        "$VENV/bin/python" -m pytest -p llama_suite_plugin -v -p no:cacheprovider \
        ${mark:+-m "$mark"} --junitxml="$out/$target.xml" "${FILES[@]}" >"$out/$target.log" 2>&1) &
    pids+=($!)
    port=$((port + 100))
done
for p in "${pids[@]}"; do
    wait "$p" || true
done
python3 "$ROOT/bench/llama_suite_report.py" "$out/llama-server.xml" "$out/ganglion.xml" \
    "$ROOT/bench/llama-suite-xfail.txt"
