#!/usr/bin/env bash
# GPU verification in one command (docs/design.md §6): build with CUDA, run the GPU tests, GPU
# discovery and the GPU benchmarks, and leave every result under OUTDIR. Meant for the rare
# minutes on an H200: it never stops at a failing step (each step's exit code, duration and
# log are recorded), bounds every step with a timeout, and stays inside one 10-minute call
# (GANG_GPU_BUDGET_S, default 540 s).
#
#   bash bench/gpu-check.sh OUTDIR
#
# Environment:
#   GANG_GPU_BUILD=DIR       build directory (default: build-gpu in the repository); an
#                            existing configured one is reused (incremental build)
#   GANG_GPU_SKIP_BUILD=1    use the binaries already in GANG_GPU_BUILD as they are
#   JOBS=N                   parallel build jobs (default: nproc, at most 16)
#   GANG_GPU_SKIP_SERVE=1    leave out the serve-nccl step (world-1 serve over nccl)
#   GANG_GPU_BUDGET_S=S      wall-clock budget of the whole check (default 540 s): each
#                            step's timeout is cut to what is left; steps past it are
#                            recorded as "not-run"
#   GANG_GPU_DRY_RUN=1       print and record every step ("dry-run") without running it: the
#                            step list, the budget and the summary, checked without a GPU
#                            (ctest gpu-check-dry-run)
#
# Outputs in OUTDIR:
#   steps.jsonl      one JSON line per step: name, rc, seconds, log, status
#   summary.json     every step's status, and the overall result
#   <step>.log       stdout+stderr of each step
#   bench-gemm.jsonl, bench-decode.jsonl, bench-decode-8b.jsonl, bench-decode-storage.jsonl,
#   info.txt, info-labels.txt
# Exit status: 0 when every step passed (skips without a GPU count as passed), 1 otherwise:
# it says whether every correctness step passed. The bench decode steps (issues #6, #13)
# fail the check when a TP=2 point disagrees with 1x1 of the same storage by the logits
# ("fail-logits-mismatch": a greedy token differs where 1x1's top-2 gap is above the
# storage's stated tolerance, bench/decode-agree.h); a flip at a near-tie is reported, not
# failed. Performance targets are reported, not enforced: the roofline ratios, and the
# issue's target, batch-1 decode of the 8B-shaped bf16 model >= 0.7 of the HBM roofline,
# printed as PASS or FAIL and recorded under "targets" in summary.json without changing the
# exit status.
#
# It starts by printing the driver version, the CUDA runtime the build uses (the toolkit's:
# the runtime is linked statically) and whether the driver supports it, and stops with one
# line (exit 1) when it does not: every GPU step would only fail for that reason.
set -u

if [ $# -ne 1 ]; then
    echo "usage: $0 OUTDIR" >&2
    exit 2
fi
OUT=$1
mkdir -p "$OUT" || exit 2
OUT=$(cd "$OUT" && pwd)
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${GANG_GPU_BUILD:-$ROOT/build-gpu}
JOBS=${JOBS:-$(nproc 2>/dev/null || echo 2)}
BUDGET=${GANG_GPU_BUDGET_S:-540}
DRY=${GANG_GPU_DRY_RUN:-0}
[ "$JOBS" -gt 16 ] && JOBS=16
START=$(date +%s)
: >"$OUT/steps.jsonl"
declare -a NAMES=() STATUSES=()

json_escape() {
    local s=${1//\\/\\\\}
    s=${s//\"/\\\"}
    s=${s//$'\n'/ }
    printf '%s' "$s"
}

# step NAME TIMEOUT_S CMD...: runs CMD with a timeout, logs to OUTDIR/NAME.log, records.
# The status is "pass" (rc 0), "skip" (rc 77, or the log says the GPU part was skipped),
# "timeout" (rc 124/137) or "fail".
step() {
    local name=$1 tmo=$2
    shift 2
    local log="$OUT/$name.log" t0 t1 rc status left
    # The whole check stays inside its budget: a step gets at most what is left of it.
    left=$((BUDGET - ($(date +%s) - START)))
    if [ "$left" -lt 5 ]; then
        printf '{"step":"%s","rc":-1,"status":"not-run","seconds":0,"log":"","cmd":"%s"}\n' \
            "$name" "$(json_escape "$*")" >>"$OUT/steps.jsonl"
        NAMES+=("$name")
        STATUSES+=(not-run)
        echo "== $name: not run, the ${BUDGET} s budget is spent" >&2
        return 0
    fi
    [ "$tmo" -gt "$left" ] && tmo=$left
    if [ "$DRY" = 1 ]; then
        printf '{"step":"%s","rc":0,"status":"dry-run","seconds":0,"timeout":%d,"log":"","cmd":"%s"}\n' \
            "$name" "$tmo" "$(json_escape "$*")" >>"$OUT/steps.jsonl"
        NAMES+=("$name")
        STATUSES+=(dry-run)
        echo "== $name (timeout ${tmo} s, dry run): $*" >&2
        return 0
    fi
    t0=$(date +%s.%N)
    echo "== $name: $*" >&2
    timeout --kill-after=10 "$tmo" "$@" >"$log" 2>&1
    rc=$?
    t1=$(date +%s.%N)
    case $rc in
    0) status=pass ;;
    77) status=skip ;;
    124 | 137) status=timeout ;;
    *) status=fail ;;
    esac
    if [ $status = pass ] && grep -q '"skipped"\|SKIPPED \] [0-9]' "$log" 2>/dev/null; then
        status=pass-with-skips
    fi
    printf '{"step":"%s","rc":%d,"status":"%s","seconds":%.1f,"log":"%s","cmd":"%s"}\n' \
        "$name" "$rc" "$status" "$(awk -v a="$t0" -v b="$t1" 'BEGIN{print b-a}')" \
        "$(json_escape "$log")" \
        "$(json_escape "$*")" >>"$OUT/steps.jsonl"
    NAMES+=("$name")
    STATUSES+=("$status")
    echo "   -> $status (rc $rc, $(awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.1f", b-a}') s)" >&2
    return 0
}

# check_logits NAME: a bench decode step whose JSON lines (OUTDIR/NAME.jsonl) hold a layout
# that disagrees with 1x1 by the logits is a failure (fail-logits-mismatch).
check_logits() {
    if grep -q '"logits_match_1x1":false' "$OUT/$1.jsonl" 2>/dev/null; then
        STATUSES[-1]=fail-logits-mismatch
        sed -i '$ s/"status":"[a-z-]*"/"status":"fail-logits-mismatch"/' "$OUT/steps.jsonl"
        echo "   -> a layout disagrees with 1x1 beyond a near-tie: counted as a failure" >&2
    fi
}

# --- environment ------------------------------------------------------------------------
{
    echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "host: $(hostname)"
    echo "commit: $(git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo unknown)"
    echo "nvcc: $("$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)" --version 2>/dev/null | tail -1)"
    echo "cmake: $(cmake --version 2>/dev/null | head -1)"
    echo "jobs: $JOBS"
} >"$OUT/environment.txt" 2>&1
# --- driver and runtime -----------------------------------------------------------------
# The runtime: the CUDA version CMake recorded for an existing build, else the nvcc that a
# new configure will find. The driver: nvidia-smi's driver version and the newest CUDA it
# supports. A driver supports a runtime of a lower major version, and of the same major
# one through CUDA's minor version compatibility (the kernels are SASS for sm_90, not PTX
# to be compiled by the driver).
cuda_runtime_version() {
    local f="" c
    for c in "$BUILD"/CMakeFiles/*/CMakeCUDACompiler.cmake; do
        [ -f "$c" ] && { f=$c; break; }
    done
    if [ -n "$f" ]; then
        sed -n 's/^set(CMAKE_CUDA_COMPILER_VERSION "\([0-9]*\.[0-9]*\).*/\1/p' "$f" | head -1
    else
        "$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)" --version 2>/dev/null |
            sed -n 's/.*release \([0-9]*\.[0-9]*\).*/\1/p' | head -1
    fi
}
RUNTIME=$(cuda_runtime_version)
DRIVER=none
DRIVER_CUDA=none
if command -v nvidia-smi >/dev/null 2>&1; then
    DRIVER=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -1)
    DRIVER_CUDA=$(nvidia-smi 2>/dev/null | sed -n 's/.*CUDA Version: *\([0-9]*\.[0-9]*\).*/\1/p' |
        head -1)
fi
SUPPORTED=unknown
if [ -n "$RUNTIME" ] && [ -n "$DRIVER_CUDA" ] && [ "$DRIVER_CUDA" != none ]; then
    if [ "${DRIVER_CUDA%%.*}" -ge "${RUNTIME%%.*}" ]; then
        SUPPORTED=yes
    else
        SUPPORTED=no
    fi
fi
echo "driver ${DRIVER:-unknown} (CUDA ${DRIVER_CUDA:-unknown}), CUDA runtime ${RUNTIME:-unknown}" \
    "(built with), driver supports it: $SUPPORTED" | tee -a "$OUT/environment.txt" >&2
if [ "$SUPPORTED" = no ]; then
    echo "gpu-check: the driver ${DRIVER} supports CUDA up to ${DRIVER_CUDA}, older than the" \
        "CUDA ${RUNTIME} runtime of this build: install a newer driver or build with an older" \
        "toolkit" | tee "$OUT/summary.txt" >&2
    printf '{"elapsed_s":%d,"steps":{},"result":"fail","reason":"driver %s (CUDA %s) does not support the CUDA %s runtime"}\n' \
        "$(($(date +%s) - START))" "$DRIVER" "$DRIVER_CUDA" "$RUNTIME" >"$OUT/summary.json"
    exit 1
fi

# A GPU test that skipped "no GPU" while nvidia-smi lists one is a failure (driver or
# runtime mismatch), not a skip: rewrite the last recorded status.
gpu_skip_is_failure() {
    local last=$((${#STATUSES[@]} - 1))
    if [ "$GPUS" -gt 0 ] && grep -q 'no GPU\|needs 1 GPU' "$OUT/$1.log" 2>/dev/null; then
        STATUSES[last]="fail-gpu-not-used"
        sed -i '$ s/"status":"[a-z-]*"/"status":"fail-gpu-not-used"/' "$OUT/steps.jsonl"
        echo "   -> but nvidia-smi lists $GPUS GPU(s): counted as a failure" >&2
    fi
}

GPUS=0
if command -v nvidia-smi >/dev/null 2>&1; then
    step nvidia-smi 30 nvidia-smi
    nvidia-smi topo -m >"$OUT/nvidia-smi-topo.txt" 2>&1 || true
    GPUS=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
fi
echo "gpus (nvidia-smi -L): $GPUS" >>"$OUT/environment.txt"

# --- build ------------------------------------------------------------------------------
if [ "${GANG_GPU_SKIP_BUILD:-0}" != 1 ]; then
    if [ ! -f "$BUILD/CMakeCache.txt" ]; then
        step configure 120 cmake -S "$ROOT" -B "$BUILD" -DGANGLION_CUDA=ON \
            -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90
    fi
    step build 300 cmake --build "$BUILD" -j "$JOBS" --target ganglion test-cuda test-comm-nccl \
        test-engine-cuda
fi
BIN=$BUILD/bin/ganglion

# --- tests, discovery, benchmarks -------------------------------------------------------
step test-cuda 120 "$BUILD/test-cuda"
gpu_skip_is_failure test-cuda
step test-engine-cuda 120 "$BUILD/test-engine-cuda"
gpu_skip_is_failure test-engine-cuda
step test-comm-nccl 120 "$BUILD/test-comm-nccl"
gpu_skip_is_failure test-comm-nccl
step info 30 "$BIN" info
cp "$OUT/info.log" "$OUT/info.txt" 2>/dev/null
step info-labels 30 "$BIN" info --labels
cp "$OUT/info-labels.log" "$OUT/info-labels.txt" 2>/dev/null
# The engine on the GPU (issue #6): a 1B-parameter random Llama, f32 storage, batch 1 and
# 64, 1x1, TP=2 on one GPU over the socket backend and 1x1 with a one-rank nccl TP group
# (issue #16: the NCCL path's cost per decode step), against the HBM roofline. Before bench
# gemm so that a short budget goes to it first.
step bench-decode 150 "$BIN" bench decode --device cuda --dtypes f32
grep '^{' "$OUT/bench-decode.log" >"$OUT/bench-decode.jsonl" 2>/dev/null
gpu_skip_is_failure bench-decode
check_logits bench-decode
# The issue #13 target: Llama-3-8B's shape (random, built layer by layer straight into bf16
# storage on the device), batch 1, 1x1: decode tokens/s against the HBM roofline of the
# bf16 bytes, target ratio 0.7 (reported, not enforced). About 16 GB of weights: a build of
# ~20-40 s on 16 cores, then 3 x 16 tokens.
step bench-decode-8b 150 "$BIN" bench decode --device cuda --shape 8b --dtypes bf16 --batch 1 \
    --layouts 1x1 --tokens 16 --iters 2 --warmup 1
grep '^{' "$OUT/bench-decode-8b.log" >"$OUT/bench-decode-8b.jsonl" 2>/dev/null
gpu_skip_is_failure bench-decode-8b
# Weight storage on the GPU (issue #13): the 1B shape stored as bf16 (cuBLASLt) and int8
# (the dequantizing kernel), batch 1 and 64, 1x1 and TP=2; each TP=2 point must agree with
# the 1x1 point of its own storage by the logits.
step bench-decode-storage 150 "$BIN" bench decode --device cuda --dtypes bf16,int8 \
    --layouts 1x1,2x1 --batch 1,64 --tokens 16 --iters 2 --warmup 1
grep '^{' "$OUT/bench-decode-storage.log" >"$OUT/bench-decode-storage.jsonl" 2>/dev/null
gpu_skip_is_failure bench-decode-storage
check_logits bench-decode-storage
step bench-gemm 150 "$BIN" bench gemm
grep '^{' "$OUT/bench-gemm.log" >"$OUT/bench-gemm.jsonl" 2>/dev/null
# The workers' NCCL data path (issue #6) end to end at world = 1: `serve --local --device
# cuda --backend nccl` on a tiny model (socket world for plans and tokens, TP / PP groups
# split from an nccl world), one greedy completion over HTTP, whose tokens must equal
# `ganglion generate` on the CPU. About 10 s; last, so a short budget skips it first.
cat >"$OUT/serve-nccl.sh" <<'SERVE_EOF'
# serve-nccl.sh BIN DEVICE BACKEND DIR: serve a tiny model with one worker, compare one
# greedy completion with `generate` on the CPU. Exit 0 when equal, 1 otherwise.
set -u
BIN=$1 DEV=$2 BACKEND=$3 DIR=$4
mkdir -p "$DIR"
if [ "$DEV" = cuda ] && ! nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
    echo '{"skipped":"no GPU (nvidia-smi lists none)"}'
    exit 0
fi
"$BIN" mkmodel --out "$DIR/model" --layers 4 --hidden 64 --heads 4 --kv-heads 2 --ffn 128 \
    --vocab 256 --seed 7 >"$DIR/mkmodel.log" 2>&1 || { echo "mkmodel failed"; exit 1; }
WANT=$("$BIN" generate --model "$DIR/model" --tp 1 --pp 1 --prompt-ids 1,5,9,13 \
    --max-tokens 12 2>"$DIR/generate.log" | head -1)
echo "generate (cpu): $WANT"
PORT=$((20000 + RANDOM % 20000))
"$BIN" serve --local --model "$DIR/model" --nnodes 1 --nproc-per-node 1 --device "$DEV" \
    --backend "$BACKEND" --http-port "$PORT" --rdzv-port $((PORT + 1)) --gpu-memory-mb 2048 \
    --kv-cache-mb 16 --max-batch 4 >"$DIR/serve.log" 2>&1 &
PID=$!
python3 - "$PORT" "$WANT" "$PID" <<'PY_EOF'
import json, os, sys, time, urllib.request
port, want, pid = int(sys.argv[1]), sys.argv[2].split(), int(sys.argv[3])
base = "http://127.0.0.1:%d" % port
def alive():
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False
deadline = time.time() + 60
while True:
    if not alive():
        sys.exit("serve exited before it was ready (see serve.log)")
    try:
        if urllib.request.urlopen(base + "/readyz", timeout=2).status == 200:
            break
    except Exception:
        pass
    if time.time() > deadline:
        sys.exit("not ready within 60 s (see serve.log)")
    time.sleep(0.2)
body = json.dumps({"prompt": [1, 5, 9, 13], "max_tokens": 12}).encode()
req = urllib.request.Request(base + "/v1/completions", body, {"Content-Type": "application/json"})
r = json.loads(urllib.request.urlopen(req, timeout=60).read())
got = [str(t) for t in r["choices"][0]["tokens"]]
print(json.dumps({"measure": "serve_nccl", "tokens": got, "expected": want,
                  "tokens_match_cpu": got == want, "timings": r.get("timings")}))
sys.exit(0 if got == want else 1)
PY_EOF
RC=$?
kill -TERM "$PID" 2>/dev/null
wait "$PID"
echo "serve exit code $? (after SIGTERM)"
grep -E "nccl|NCCL|ERROR" "$DIR/serve.log" | tail -20
exit $RC
SERVE_EOF
if [ "${GANG_GPU_SKIP_SERVE:-0}" != 1 ]; then
    step serve-nccl 90 bash "$OUT/serve-nccl.sh" "$BIN" cuda nccl "$OUT/serve-nccl"
    if grep -q '"tokens_match_cpu":false' "$OUT/serve-nccl.log" 2>/dev/null; then
        STATUSES[-1]=fail-tokens-mismatch
        sed -i '$ s/"status":"[a-z-]*"/"status":"fail-tokens-mismatch"/' "$OUT/steps.jsonl"
        echo "   -> serve over nccl answered other tokens than generate on the CPU" >&2
    fi
fi

# GPU health watch (issue #15): NVML readable through `ganglion info`, the per-GPU metrics
# (DCGM names) on /metrics, and no false fault (no GPU fault counted, no restart) over
# GANG_GPU_HEALTH_S (default 30) seconds of completions on a tiny served model. ~40 s.
if [ "${GANG_GPU_SKIP_HEALTH:-0}" != 1 ]; then
    step gpu-health 75 python3 "$ROOT/bench/gpu-health-check.py" --bin "$BIN" \
        --dir "$OUT/gpu-health" --seconds "${GANG_GPU_HEALTH_S:-30}"
    gpu_skip_is_failure gpu-health
fi

# --- summary ----------------------------------------------------------------------------
# The 8B-shaped bf16 batch-1 roofline target (reported, not enforced): PASS, FAIL, or n/a
# when the step did not produce its summary line.
T8_RATIO=null
T8_RESULT=n/a
if [[ $(grep '"measure":"summary"' "$OUT/bench-decode-8b.jsonl" 2>/dev/null) =~ \"batch1_roofline_ratio\":(-?[0-9.e+-]+).*\"meets_target\":([a-z]+) ]]; then
    T8_RATIO=${BASH_REMATCH[1]}
    if [ "${BASH_REMATCH[2]}" = true ]; then T8_RESULT=PASS; else T8_RESULT=FAIL; fi
    [ "$T8_RATIO" = "-1" ] && T8_RESULT=n/a
fi
overall=pass
{
    printf '{"elapsed_s":%d,"steps":{' "$(($(date +%s) - START))"
    for i in "${!NAMES[@]}"; do
        [ "$i" -gt 0 ] && printf ','
        printf '"%s":"%s"' "${NAMES[$i]}" "${STATUSES[$i]}"
        case ${STATUSES[$i]} in pass | pass-with-skips | skip | dry-run) ;; *) overall=fail ;; esac
    done
    printf '},"targets":{"decode_8b_bf16_batch1_roofline":{"ratio":%s,"target":0.7,"result":"%s","enforced":false}}' \
        "$T8_RATIO" "$T8_RESULT"
    printf ',"result":"%s"}\n' "$overall"
} >"$OUT/summary.json"

# print_decode FILE TITLE: the tokens/s, roofline ratio and agreement of each point.
print_decode() {
    [ -s "$1" ] || return 0
    echo "  $2:"
    local line st
    while IFS= read -r line; do
        st=
        [[ $line =~ \"storage\":\"([a-z0-9]+)\" ]] && st=${BASH_REMATCH[1]}
        if [[ $line =~ \"skipped\":\"([^\"]*) ]]; then
            echo "    skipped: ${BASH_REMATCH[1]}"
        elif [[ $line =~ copy_bandwidth ]] && [[ $line =~ \"copy_GBps\":([0-9.]+) ]]; then
            echo "    device copy bandwidth ${BASH_REMATCH[1]} GB/s (read + write)"
        elif [[ $line =~ \"backend\":\"([a-z]+)\".*\"tp\":([0-9]+).*\"batch\":([0-9]+).*\"decode_tok_s\":([0-9.]+).*\"roofline_ratio\":([0-9.]+) ]]; then
            printf '    %-5s %-6s tp %s batch %3s  decode %10s tok/s  roofline ratio %s\n' \
                "$st" "${BASH_REMATCH[1]}" "${BASH_REMATCH[2]}" "${BASH_REMATCH[3]}" \
                "${BASH_REMATCH[4]}" "${BASH_REMATCH[5]}"
            if [[ $line =~ \"decode_step_overhead_ms_vs_1x1\":(-?[0-9.e+-]+) ]]; then
                printf '      decode step overhead over 1x1: %s ms\n' "${BASH_REMATCH[1]}"
            fi
            if [[ $line =~ \"top1_agreement\":([0-9.e+-]+).*\"max_abs_logprob_diff\":([0-9.e+-]+).*\"divergences\":([0-9]+).*\"gap_tol\":([0-9.e+-]+).*\"logits_match_1x1\":([a-z]+) ]]; then
                printf '      vs 1x1: top-1 agreement %s, max |log-prob diff| %s, %s flip(s), logits match (gap tol %s): %s\n' \
                    "${BASH_REMATCH[1]}" "${BASH_REMATCH[2]}" "${BASH_REMATCH[3]}" \
                    "${BASH_REMATCH[4]}" "${BASH_REMATCH[5]}"
            fi
        elif [[ $line =~ \"batch1_roofline_ratio\":(-?[0-9.]+).*\"meets_target\":([a-z]+) ]]; then
            echo "    $st batch-1 roofline ratio ${BASH_REMATCH[1]} (target 0.7: ${BASH_REMATCH[2]})"
        elif [[ $line =~ \"error\":\"([^\"]*) ]]; then
            echo "    $st error: ${BASH_REMATCH[1]}"
        fi
    done <"$1"
}

echo
echo "gpu-check summary ($(($(date +%s) - START)) s, results in $OUT):"
for i in "${!NAMES[@]}"; do
    printf '  %-20s %s\n' "${NAMES[$i]}" "${STATUSES[$i]}"
done
if [ -s "$OUT/bench-gemm.jsonl" ]; then
    echo "  gemm, TFLOP/s (ours vs cublasGemmEx):"
    while IFS= read -r line; do
        if [[ $line =~ \"skipped\":\"([^\"]*) ]]; then
            echo "    skipped: ${BASH_REMATCH[1]}"
        elif [[ $line =~ \"shape\":\"([^\"]*)\".*\"m\":([0-9]+),\"n\":([0-9]+),\"k\":([0-9]+).*\"ours_tflops\":([0-9.]+),\"cublas_tflops\":([0-9.]+),\"ratio\":([0-9.]+) ]]; then
            printf '    %-16s %6s x %6s x %6s  ours %8s  cublas %8s  ratio %s\n' \
                "${BASH_REMATCH[1]}" "${BASH_REMATCH[2]}" "${BASH_REMATCH[3]}" \
                "${BASH_REMATCH[4]}" "${BASH_REMATCH[5]}" "${BASH_REMATCH[6]}" "${BASH_REMATCH[7]}"
        fi
    done <"$OUT/bench-gemm.jsonl"
fi
print_decode "$OUT/bench-decode.jsonl" "decode, 1B shape, f32 (socket staging or nccl), tokens/s and HBM roofline ratio"
print_decode "$OUT/bench-decode-8b.jsonl" "decode, 8B shape, bf16, 1x1"
print_decode "$OUT/bench-decode-storage.jsonl" "decode, 1B shape, bf16 and int8 storage"
echo "  target: 8B-shaped bf16 batch-1 decode >= 0.7 of the HBM roofline: $T8_RESULT" \
    "(ratio $T8_RATIO; reported, not enforced)"
echo "  result: $overall"
[ "$overall" = pass ]
