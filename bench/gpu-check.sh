#!/usr/bin/env bash
# The device check in one command (issue #24, docs/gpu.md "Running the device check"):
# GPU tests, correctness against transformers on the same GPU, and the GPU benchmarks
# against the image's PyTorch in the same run, from binaries built elsewhere. Meant for the
# rare minutes on a GPU lent by the device tool (an H200 or an H100, the same image):
# nothing is built or installed there.
#
#   bash bench/gpu-check.sh [--bundle DIR] [--dry-run] [--only NAMES] OUTDIR
#
#   --bundle DIR   the binaries and scripts of a bundle (scripts/gpu-bundle.sh DIR, carried
#                  by the device tool); without it those of GANG_GPU_BUILD (default: build)
#                  and of this tree
#   --dry-run      record every step with its timeout without running any (the ctest
#                  rehearsal runs it); the preflight still runs
#   --only NAMES   run only these steps (comma-separated names, extras included), for a
#                  second try at what failed without spending the budget
#                  on what passed: the others are not recorded, and the summary names the
#                  selection ("only") beside its result, which covers those steps alone
#
# The whole check ends within GANG_GPU_BUDGET_S (default 330 s: with the machine's start it
# stays inside 6 minutes, leaving a 10-minute call room for a second try): each step's
# timeout is cut to what is left, and a step past the budget is recorded "not-run", which
# fails the check (nothing passes by having checked nothing). The launch choices measured
# against the default are points of the decode steps themselves, on the model those steps
# drew (`bench decode --variants`: the 8B model took most of a minute to draw there): the
# decode products by cuBLASLt in bench-decode, the GEMVs as PDL launches and the norms and
# residual adds as kernels of their own in bench-decode-8b-variants, one 8B draw for both.
# The steps at the end are not gates, what issue #24's figures do not need (their status is
# reported apart, in summary.json's "extras"): those 8B variants, the kernel traces of the
# decode step (test-cuda-trace, profile), the GPU health gauges (gpu-health), the
# long-context decode (bench-decode-long), the 8B step's trace (profile-8b) and the step's
# kernels under compute-sanitizer (sanitize), each only when enough of the budget is left.
#
# It starts with the preflight (bench/gpu-preflight.sh, ~5 s): a missing driver, device,
# carried library, NCCL or cuBLASLt stops the check at once with those lines as the reason.
# Every step then prints "PASS name: reason" or "FAIL name: reason".
#
# OUTDIR gets at most 8 files (the device tool's limits):
#   environment.txt  date, host, commit, driver, the bundle's MANIFEST, `ganglion info`
#   preflight.txt    the preflight's lines
#   steps.jsonl      one line per step: name, rc, status, seconds, reason, command
#   results.jsonl    every JSON line every step printed, with "step" added
#   logs.txt         the last 80 lines of each step's output
#   summary.json     each step's status, the figures, the overall result
#   summary.txt      the short summary printed at the end
# Step logs, the written models and the servers' logs stay in a scratch directory
# (GANG_GPU_WORK, default a fresh one under /tmp), named in environment.txt.
# Exit status: 0 when every step passed, 1 otherwise (2: usage).
set -u

BUNDLE="" DRY=${GANG_GPU_DRY_RUN:-0} ONLY=""
while [ $# -gt 1 ]; do
    case $1 in
    --bundle) BUNDLE=$2; shift 2 ;;
    --dry-run) DRY=1; shift ;;
    --only) ONLY=$2; shift 2 ;;
    *) break ;;
    esac
done
if [ $# -ne 1 ] || [[ $1 == --* ]]; then
    echo "usage: $0 [--bundle DIR] [--dry-run] [--only NAMES] OUTDIR" >&2
    exit 2
fi
# Every step's name, for --only's check (a misspelt name would select nothing).
ALL_STEPS=" test-cuda test-cuda-step test-cuda-blocks test-engine-cuda test-comm-nccl test-kv-pair-2gpu reference moe-cuda torch-gemm bench-gemm bench-decode bench-decode-wait-each bench-decode-8b torch-decode bench-decode-8b-variants test-cuda-trace profile gpu-health bench-decode-long profile-8b sanitize "
if [ -n "$ONLY" ]; then
    for n in ${ONLY//,/ }; do
        if [[ $ALL_STEPS != *" $n "* ]]; then
            echo "$0: --only: no step named '$n' (steps:$ALL_STEPS)" >&2
            exit 2
        fi
    done
fi
# selected NAME: 0 when NAME runs (no --only, or named in it).
selected() {
    [ -z "$ONLY" ] || [[ ",$ONLY," == *",$1,"* ]]
}
OUT=$1
mkdir -p "$OUT" || exit 2
OUT=$(cd "$OUT" && pwd)
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/.." && pwd)
if [ -n "$BUNDLE" ]; then
    BUNDLE=$(cd "$BUNDLE" && pwd) || exit 2
    BIN=$BUNDLE/bin/ganglion TESTS=$BUNDLE/bin SCRIPTS=$BUNDLE/bench
else
    BUILD=${GANG_GPU_BUILD:-$ROOT/build}
    BIN=$BUILD/bin/ganglion TESTS=$BUILD SCRIPTS=$HERE
fi
BUDGET=${GANG_GPU_BUDGET_S:-330}
# For the rehearsal on the CUDA emulator only (ctest gpu-check-emu): arguments appended to
# every `bench decode` step (a tiny shape), and the long-context step's prompt. Unset on a
# device: the steps' own shapes.
read -r -a BD_ARGS <<<"${GANG_GPU_BENCH_ARGS:-}"
LONG_PROMPT=${GANG_GPU_LONG_PROMPT:-4064}
WORK=${GANG_GPU_WORK:-$(mktemp -d /tmp/gang-gpu-check.XXXXXX)}
mkdir -p "$WORK/logs"
START=$(date +%s)
rm -f "$OUT"/{steps.jsonl,results.jsonl,logs.txt,summary.json,summary.txt,preflight.txt}
: >"$OUT/steps.jsonl"
: >"$OUT/results.jsonl"
: >"$OUT/logs.txt"
declare -a NAMES=() STATUSES=() EXTRA_NAMES=() EXTRA_STATUSES=()
COUNTED=1 # 0 while an extra (not a gate) runs: its status goes to EXTRA_*
GPUS=$(timeout 10 nvidia-smi -L 2>/dev/null | grep -c '^GPU')
# The skip reasons a one-GPU machine may give (the tests' own words), and the one that
# holds on any machine with a GPU (a case that checks the refusal when there is none).
NO_GPU_SKIPS='a GPU is present'
ONE_GPU_SKIPS="needs 2 GPU|needs >= 2|>= 2\$|1 GPU visible|1 GPU\(s\) here|1 visible|$NO_GPU_SKIPS"

json_escape() {
    local s=${1//\\/\\\\}
    s=${s//\"/\\\"}
    s=${s//$'\n'/ }
    s=${s//$'\t'/ }
    printf '%s' "$s"
}

# record NAME STATUS RC SECONDS REASON CMD: one steps.jsonl line and the PASS/FAIL line.
record() {
    printf '{"step":"%s","status":"%s","rc":%d,"seconds":%s,"reason":"%s","cmd":"%s"}\n' \
        "$1" "$2" "$3" "$4" "$(json_escape "$5")" "$(json_escape "$6")" >>"$OUT/steps.jsonl"
    if [ "$COUNTED" = 1 ]; then
        NAMES+=("$1")
        STATUSES+=("$2")
    else
        EXTRA_NAMES+=("$1")
        EXTRA_STATUSES+=("$2")
    fi
    case $2 in
    pass) echo "PASS $1: $5 (${4} s)" ;;
    dry-run) echo "DRY  $1: $5" ;;
    *) echo "FAIL $1: $5 (${4} s)" ;;
    esac
}

# step NAME TIMEOUT_S CMD...: runs CMD under a timeout with its output in the scratch
# log; the JSON lines it printed go to results.jsonl with "step" added and its tail to
# logs.txt. Status: pass (rc 0 and no "skipped" line), fail, timeout, not-run (budget
# spent), dry-run. A GPU step that skips is a failure here: the check runs where a GPU is.
step() {
    local name=$1 tmo=$2 log t0 rc status reason secs left
    shift 2
    selected "$name" || return 0
    log=$WORK/logs/$name.log
    left=$((BUDGET - ($(date +%s) - START)))
    [ "$tmo" -gt "$left" ] && tmo=$left
    if [ "$DRY" = 1 ]; then
        record "$name" dry-run 0 0 "would run with a ${tmo} s timeout" "$*"
        return 0
    fi
    if [ "$tmo" -lt 5 ]; then
        record "$name" not-run -1 0 "the ${BUDGET} s budget is spent" "$*"
        return 0
    fi
    t0=$(date +%s.%N)
    timeout --kill-after=10 "$tmo" "$@" >"$log" 2>&1
    rc=$?
    secs=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}')
    grep '^{' "$log" | sed "s/^{/{\"step\":\"$name\",/" >>"$OUT/results.jsonl"
    {
        echo "===== $name (rc $rc, $secs s): $*"
        tail -n 80 "$log"
    } >>"$OUT/logs.txt"
    case $rc in
    0) status=pass reason="exit 0" ;;
    124 | 137) status=timeout reason="killed by the ${tmo} s timeout" ;;
    *) status=fail reason="exit $rc: $(grep -E 'FAIL|ERROR|error|Error' "$log" | head -1 | cut -c1-200)" ;;
    esac
    if [ $status = pass ] && grep -q '"skipped"\|SKIPPED \] [0-9]\|\[  SKIPPED \]' "$log"; then
        # A case may skip only for needing a second GPU on a one-GPU machine (NCCL refuses
        # two ranks of a communicator on one GPU) or for needing no GPU; any other skip,
        # or any skip on a machine of 2+ GPUs, fails the step.
        local skips other
        skips=$(grep -E '^\[  SKIP    \]|^SKIP:' "$log")
        other=$(grep -vE "$ONE_GPU_SKIPS" <<<"$skips")
        if grep -q '"skipped"' "$log" || [ -z "$skips" ] || [ -n "$other" ] ||
            { [ "$GPUS" -ne 1 ] && grep -qvE "$NO_GPU_SKIPS" <<<"$skips"; }; then
            status=fail reason="it skipped on a machine that has a GPU: $(if [ -n "$other" ]; then head -1 <<<"$other"; else grep -m1 -o 'skipped[^}]*\|SKIPPED.*' "$log"; fi | cut -c1-160)"
        else
            reason="exit 0; $(grep -c . <<<"$skips") case(s) skipped for wanting 2+ GPUs (or none): $(head -1 <<<"$skips" | cut -c1-120)"
        fi
    fi
    if [ $status = pass ] && grep -q '"logits_match_1x1":false' "$log"; then
        status=fail reason="a layout disagrees with 1x1 beyond a near tie (logits_match_1x1 false)"
    fi
    if [ $status = pass ] && grep -q '"ok": *false\|"tokens_match_cpu": *false' "$log"; then
        status=fail reason="a result line says ok false: $(grep -m1 '"ok": *false\|"tokens_match_cpu": *false' "$log" | cut -c1-200)"
    fi
    record "$name" "$status" "$rc" "$secs" "$reason" "$*"
}

# extra NAME MIN_LEFT TIMEOUT_S CMD...: a measurement that is not a gate: run as a step
# only with at least MIN_LEFT s of the budget left (else recorded not-run), its status
# reported apart and not counted in the result.
extra() {
    local name=$1 min=$2
    shift 2
    selected "$name" || return 0
    COUNTED=0
    if [ "$DRY" = 1 ] || [ $((BUDGET - ($(date +%s) - START))) -ge "$min" ]; then
        step "$name" "$@"
    else
        record "$name" not-run -1 0 "fewer than $min s of the budget left (not a gate)" "${*:2}"
    fi
    COUNTED=1
}

# --- environment and preflight ------------------------------------------------------------
{
    echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "host: $(hostname 2>/dev/null || cat /etc/hostname)"
    echo "commit: $(git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo unknown)"
    echo "binaries: $BIN (bundle: ${BUNDLE:-none})"
    echo "scratch: $WORK"
    echo "budget: $BUDGET s"
    [ -n "$ONLY" ] && echo "only: $ONLY"
    echo "driver: $(timeout 5 nvidia-smi --query-gpu=driver_version,name,memory.total --format=csv,noheader 2>&1 | head -1)"
    [ -n "$BUNDLE" ] && sed 's/^/bundle: /' "$BUNDLE/MANIFEST" 2>/dev/null | head -8
} >"$OUT/environment.txt" 2>&1
if [ -n "$BUNDLE" ]; then
    timeout 20 bash "$SCRIPTS/gpu-preflight.sh" "$BUNDLE" >"$OUT/preflight.txt" 2>&1
else
    echo "preflight: not run (no --bundle: the binaries of $BIN)" >"$OUT/preflight.txt"
fi
cat "$OUT/preflight.txt"
# What makes every GPU step fail for one reason stops the check here, with that reason.
FATAL=$(grep -E '^preflight: FAIL (driver|device|libraries of|library)' "$OUT/preflight.txt")
if [ -n "$FATAL" ] && [ "$DRY" != 1 ]; then
    record preflight fail 1 0 "$(echo "$FATAL" | sed 's/^preflight: FAIL //' | paste -sd ';')" \
        "bash $SCRIPTS/gpu-preflight.sh"
    printf '{"elapsed_s":%d,"result":"fail","reason":"%s","steps":{"preflight":"fail"}}\n' \
        "$(($(date +%s) - START))" "$(json_escape "$FATAL")" >"$OUT/summary.json"
    { echo "gpu-check: FAIL at the preflight:"; echo "$FATAL"; } | tee "$OUT/summary.txt"
    exit 1
fi
# (Without --bundle the preflight did not run: nothing is recorded for it.)
if [ "$DRY" != 1 ] && [ -n "$BUNDLE" ]; then
    record preflight pass 0 0 "driver, device and libraries present" \
        "bash $SCRIPTS/gpu-preflight.sh"
fi
timeout 10 "$BIN" info >>"$OUT/environment.txt" 2>&1

# --- correctness --------------------------------------------------------------------------
step test-cuda 60 "$TESTS/test-cuda"
step test-cuda-step 45 "$TESTS/test-cuda-step"
step test-cuda-blocks 45 "$TESTS/test-cuda-blocks" # GGUF block weights (issue #27)
step test-engine-cuda 60 "$TESTS/test-engine-cuda"
step test-comm-nccl 45 "$TESTS/test-comm-nccl"
# P/D KV transfers GPU to GPU over a 2-rank NCCL pair (issue #26): NEEDS 2 GPUs (NCCL
# refuses two ranks of one communicator on one GPU); with one, its nccl case says SKIP
# and only the fake-device cases run. (In a build tree the binary is under tests/.)
KVPAIR=$TESTS/test-kv-pair
[ -x "$KVPAIR" ] || KVPAIR=$TESTS/tests/test-kv-pair
step test-kv-pair-2gpu 45 "$KVPAIR"
# ganglion on CUDA (1x1, TP=2 on the one GPU over sockets, 1x1 over NCCL; with 2 GPUs or
# more also TP=2 over NCCL as two worker processes) against transformers on the same GPU,
# on Llama-3.2-1B- and Qwen2.5-0.5B-shaped bf16 models written by mkmodel.
# Its 150 s: the first run's took more than 120 s (mkmodel on one core then; two models,
# each loaded by three gangs), the step least certain of the gates' times.
LAYOUTS=1x1,tp2,nccl
[ "$GPUS" -ge 2 ] && LAYOUTS=$LAYOUTS,tp2-nccl
step reference 150 python3 "$SCRIPTS/gpu-reference.py" --bin "$BIN" --dir "$WORK/reference" \
    --prompts 4 --tokens 12 --layouts "$LAYOUTS"

# Mixture-of-experts models (issue #25) on CUDA at EP x TP 1x1 and 2x2 against the CPU.
step moe-cuda 45 bash "$SCRIPTS/gpu-moe-check.sh" "$BIN" "$WORK/moe"

# --- performance, each against the image's PyTorch in the same run -----------------------
step torch-gemm 30 python3 "$SCRIPTS/torch-peer.py" gemm
step bench-gemm 30 "$BIN" bench gemm --shapes 8192x8192x8192 --iters 10 --warmup 3
# With 2 GPUs or more also TP=2 over NCCL, one GPU per rank (its all-reduces inside the
# decode step's graph): per step the same host syncs and launches as 1x1.
# Its variant point (bench decode --variants): the 1x1 point again with the bf16 decode
# products by cuBLASLt (x converted first) instead of ganglion's GEMV (at batch 1, where
# they differ: more rows always take cuBLASLt).
DECODE_LAYOUTS=1x1,2x1,nccl
[ "$GPUS" -ge 2 ] && DECODE_LAYOUTS=$DECODE_LAYOUTS,2x1-nccl
step bench-decode 75 "$BIN" bench decode --device cuda --dtypes bf16 --layouts "$DECODE_LAYOUTS" \
    --batch 1,64 --tokens 32 --iters 2 --warmup 1 --variants cublas "${BD_ARGS[@]}"
# The NCCL data path's cost per step before issue #24's change (a host wait per collective)
# against bench-decode's nccl point (no wait per collective, one settle per step). No
# graphs in this run (a host wait cannot be captured): its 1x1 point is the same-run
# baseline, and its launches per step are the fake device's (which has no graphs).
step bench-decode-wait-each 45 "$BIN" bench decode --device cuda --dtypes bf16 \
    --layouts 1x1,nccl --batch 1,64 --tokens 32 --iters 2 --warmup 1 --nccl-wait-each 1 \
    --cuda-graphs 0 "${BD_ARGS[@]}"
step bench-decode-8b 90 "$BIN" bench decode --device cuda --shape 8b --dtypes bf16 \
    --layouts 1x1 --batch 1,64 --tokens 32 --iters 2 --warmup 1 "${BD_ARGS[@]}"
step torch-decode 75 python3 "$SCRIPTS/torch-peer.py" decode --shapes 1b,8b --batch 1,64 \
    --tokens 32 --iters 2

# --- not gates: what issue #24's figures do not need, each only with enough budget left ---
# The 8B shape at batch 1, where the roofline target is, and on the same model (one draw)
# its variant points: the decode GEMVs as programmatic dependent launches (pdl: their
# first weight loads start while the kernel before them ends), and the step as it was
# before its norms and residual adds went into the products (unfused: an add+norm kernel
# twice a layer, gang_kernels_matmul_fused's norm and add refused), each against this
# run's 1x1 point. Options not yet run on a device: an extra, so that one of them failing
# leaves the gates' figures and result alone.
extra bench-decode-8b-variants 70 65 "$BIN" bench decode --device cuda --shape 8b \
    --dtypes bf16 --layouts 1x1 --batch 1 --tokens 32 --iters 2 --warmup 1 \
    --variants pdl,unfused "${BD_ARGS[@]}"
# Where a decode step's device time goes, kernel by kernel, inside its graph as it replays
# (--trace-kernels: CUPTI's kernel records in the bench's own process, from the image's
# libcupti; ncu could not read counters on the gVisor machines): test-cuda-trace first (the
# trace on this device), then the 1B shape at batch 1 and 64 (its per-layer cost above the
# weights' streaming was the 8B's in the first run, on a model drawn in seconds), then the
# 8B shape at batch 1, the roofline target's point (last: its model takes most of a
# minute). bench/gpu-trace-sum.py prints them in the summary.
extra test-cuda-trace 20 15 "$TESTS/test-cuda-trace"
extra profile 45 40 "$BIN" bench decode --device cuda --dtypes bf16 --layouts 1x1 \
    --batch 1,64 --tokens 16 --iters 1 --warmup 1 --trace-kernels 1 "${BD_ARGS[@]}"

# GPU health on /metrics (DCGM gauges read, no false fault) while a tiny model serves
# (issue #15).
extra gpu-health 35 30 python3 "$SCRIPTS/gpu-health-check.py" --bin "$BIN" \
    --dir "$WORK/gpu-health" --seconds 10

# A long context (not a gate): the 1B shape after 4064-token prompts, batch 1 and 8, where
# the step attention splits its keys across blocks and the KV cache is a good part of what
# a step reads (batch 8: 0.5 GB beside 2.5 GB of weights); the roofline counts both.
extra bench-decode-long 70 45 "$BIN" bench decode --device cuda --dtypes bf16 --layouts 1x1 \
    --batch 1,8 --prompt "$LONG_PROMPT" --tokens 32 --iters 2 --warmup 1 --gpu-memory-mb 32768 \
    "${BD_ARGS[@]}"
extra profile-8b 80 75 "$BIN" bench decode --device cuda --shape 8b --dtypes bf16 \
    --layouts 1x1 --batch 1 --tokens 16 --iters 1 --warmup 1 --trace-kernels 1 "${BD_ARGS[@]}"
# The decode step's kernels (test-cuda-step) under compute-sanitizer's memcheck, racecheck
# and initcheck: what the CUDA emulator cannot see, shared-memory races beyond its two
# thread orders and reads of device memory nothing wrote (bench/gpu-sanitize.sh).
extra sanitize 100 95 bash "$SCRIPTS/gpu-sanitize.sh" "$TESTS"


# --- summary ------------------------------------------------------------------------------
# figure MEASURE-REGEX FIELD: the first value of FIELD on a results line matching the regex.
figure() {
    grep -E "$1" "$OUT/results.jsonl" | grep -o "\"$2\": *[0-9.e+-]*" | head -1 |
        sed 's/.*: *//'
}
# json_pairs NAMES_ARRAY STATUSES_ARRAY: "name":"status" of each step, comma-separated.
json_pairs() {
    local -n names=$1 statuses=$2
    local i
    for i in "${!names[@]}"; do
        [ "$i" -gt 0 ] && printf ','
        printf '"%s":"%s"' "${names[$i]}" "${statuses[$i]}"
    done
}
overall=pass
for s in "${STATUSES[@]}"; do
    case $s in pass | dry-run) ;; *) overall=fail ;; esac
done
[ "$DRY" = 1 ] && [ $overall = pass ] && overall=dry-run
# --only of extras alone: no gate ran (the preflight, recorded with --bundle, is not one)
gates=0
for n in "${NAMES[@]}"; do
    [ "$n" = preflight ] || gates=$((gates + 1))
done
[ $gates -eq 0 ] && [ $overall = pass ] && overall=fail
ONLY_JSON=""
[ -n "$ONLY" ] && ONLY_JSON=",\"only\":\"$ONLY\""
G_OURS=$(figure '"step":"bench-gemm".*"n":8192' ours_tflops)
G_TORCH=$(figure '"measure": *"torch_gemm"' tflops)
{
    printf '{"elapsed_s":%d,"budget_s":%d,"result":"%s"%s,"steps":{' "$(($(date +%s) - START))" \
        "$BUDGET" "$overall" "$ONLY_JSON"
    json_pairs NAMES STATUSES
    printf '},"extras":{'
    json_pairs EXTRA_NAMES EXTRA_STATUSES
    printf '},"gemm_8192_bf16_tflops":{"ganglion":%s,"torch":%s}}\n' "${G_OURS:-null}" \
        "${G_TORCH:-null}"
} >"$OUT/summary.json"
{
    echo "gpu-check $(date -u +%Y-%m-%d) ($(($(date +%s) - START)) s of a $BUDGET s budget): $overall${ONLY:+ (only: $ONLY)}"
    for i in "${!NAMES[@]}"; do
        printf '  %-18s %s\n' "${NAMES[$i]}" "${STATUSES[$i]}"
    done
    for i in "${!EXTRA_NAMES[@]}"; do
        printf '  %-18s %s (not a gate)\n' "${EXTRA_NAMES[$i]}" "${EXTRA_STATUSES[$i]}"
    done
    echo "  gemm 8192^3 bf16 TFLOP/s: ganglion ${G_OURS:-n/a}, torch ${G_TORCH:-n/a}"
    grep '"measure": *"gpu_reference"' "$OUT/results.jsonl" | while IFS= read -r l; do
        [[ $l =~ \"model\":\ \"([^\"]*)\".*\"layout\":\ \"([^\"]*)\" ]] || continue
        printf '  reference %-8s %-4s compared %s, mismatches %s, near-tie flips %s, within-tol flips %s, max |dlogprob| %s (<= tol: %s)\n' \
            "${BASH_REMATCH[1]}" "${BASH_REMATCH[2]}" \
            "$(grep -o '"compared": [0-9]*' <<<"$l" | cut -d' ' -f2)" \
            "$(grep -o '"mismatches": [0-9]*' <<<"$l" | cut -d' ' -f2)" \
            "$(grep -o '"near_tie_flips": [0-9]*' <<<"$l" | cut -d' ' -f2)" \
            "$(grep -o '"within_tol_flips": [0-9]*' <<<"$l" | cut -d' ' -f2)" \
            "$(grep -o '"max_abs_logprob_diff": [0-9.e-]*' <<<"$l" | cut -d' ' -f2)" \
            "$(grep -o '"ok": [a-z]*' <<<"$l" | cut -d' ' -f2)"
    done
    grep -E '"step":"(bench-decode(-8b|-8b-variants|-wait-each|-long)?|profile(-8b)?)".*"decode_tok_s"' "$OUT/results.jsonl" | while IFS= read -r l; do
        [[ $l =~ \"shape\":\"([^\"]*)\".*\"tp\":([0-9]+).*\"batch\":([0-9]+).*\"decode_tok_s\":([0-9.]+).*\"roofline_ratio\":([0-9.]+) ]] || continue
        printf '  decode %-2s tp %s batch %-3s ganglion %10s tok/s  roofline ratio %s' \
            "${BASH_REMATCH[1]}" "${BASH_REMATCH[2]}" "${BASH_REMATCH[3]}" "${BASH_REMATCH[4]}" \
            "${BASH_REMATCH[5]}"
        if [[ $l =~ \"decode_step_overhead_ms_vs_1x1\":(-?)([0-9.e+-]+) ]]; then
            printf '  %s%s ms/step vs 1x1' "${BASH_REMATCH[1]:-+}" "${BASH_REMATCH[2]}"
        fi
        [[ $l =~ \"half_gemv\":false ]] && printf ' (cuBLASLt for the decode products)'
        [[ $l =~ \"pdl\":true ]] && printf ' (GEMVs as PDL launches)'
        [[ $l =~ \"fuse_residual\":false ]] && printf ' (norms and adds as kernels of their own)'
        [[ $l =~ \"step\":\"bench-decode-wait-each\" ]] && printf ' (no graphs)'
        [[ $l =~ \"trace\":\{ ]] && printf ' (kernels traced)'
        [[ $l =~ \"model_build\":\{\"seconds\":([0-9.]+),\"layers_s\":([0-9.]+) ]] &&
            printf ' (model built in %s s, layers %s s)' "${BASH_REMATCH[1]}" "${BASH_REMATCH[2]}"
        [[ $l =~ \"step\":\"bench-decode-long\".*\"prompt\":([0-9]+).*\"kv_bytes_per_step\":([0-9.e+]+) ]] &&
            printf ' (%s-token prompts, KV %s B/step)' "${BASH_REMATCH[1]}" "${BASH_REMATCH[2]}"
        [[ $l =~ \"backend\":\"nccl\" ]] && {
            if [[ $l =~ \"nccl_wait_each\":true ]]; then printf ' (nccl, a wait per collective)'
            else printf ' (nccl, one settle per step)'; fi
        }
        # per decode step on the device (the fake device's design figures: <= 1 sync)
        if [[ $l =~ \"host_syncs_per_step\":([0-9.]+),\"launches_per_step\":([0-9.]+) ]]; then
            printf '  syncs/step %s launches/step %s' "${BASH_REMATCH[1]}" "${BASH_REMATCH[2]}"
        fi
        printf '\n'
    done
    python3 "$SCRIPTS/gpu-trace-sum.py" "$OUT/results.jsonl" 2>&1
    grep '"measure":"sanitizer"' "$OUT/results.jsonl" | while IFS= read -r l; do
        [[ $l =~ \"tool\":\"([a-z]+)\".*\"errors\":([0-9a-z]+).*\"seconds\":([0-9.]+).*\"reason\":\"([^\"]*)\" ]] ||
            continue
        printf '  sanitizer %-9s test-cuda-step: %s error(s) in %s s (%s)\n' "${BASH_REMATCH[1]}" \
            "${BASH_REMATCH[2]}" "${BASH_REMATCH[3]}" "${BASH_REMATCH[4]}"
    done
    grep '"measure": *"torch_decode"' "$OUT/results.jsonl" | while IFS= read -r l; do
        [[ $l =~ \"shape\":\ \"([^\"]*)\".*\"batch\":\ ([0-9]+).*\"decode_tok_s\":\ ([0-9.]+) ]] || continue
        printf '  decode %-2s      batch %-3s torch    %10s tok/s\n' "${BASH_REMATCH[1]}" \
            "${BASH_REMATCH[2]}" "${BASH_REMATCH[3]}"
    done
    if [[ $(grep '"step":"bench-decode-8b".*"measure":"summary"' "$OUT/results.jsonl") =~ \"batch1_roofline_ratio\":(-?[0-9.]+).*\"meets_target\":([a-z]+) ]]; then
        echo "  target: 8B bf16 batch-1 decode >= 0.7 of the HBM roofline: ratio ${BASH_REMATCH[1]}," \
            "met: ${BASH_REMATCH[2]} (reported, not enforced)"
    fi
    echo "  result: $overall (details: steps.jsonl, results.jsonl, logs.txt; scratch $WORK)"
} | tee "$OUT/summary.txt"
[ "$overall" = pass ] || [ "$overall" = dry-run ]
