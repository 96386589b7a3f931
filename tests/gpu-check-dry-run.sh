#!/usr/bin/env bash
# bench/gpu-check.sh without a GPU (ctest gpu-check-dry-run), from this tree's build: its
# syntax, then a dry run (every step recorded with its timeout, nothing run) that must list
# the correctness and peer steps, keep OUTDIR to at most 8 files, and exit 0; --only's list of
# names is every step's, --only records just the steps it names, and refuses a name it lacks.
#   gpu-check-dry-run.sh SCRIPT BUILD WORKDIR
set -u
SCRIPT=$1 BUILD=$2 WORK=$3
rm -rf "$WORK"
mkdir -p "$WORK" || exit 1
fail() {
    echo "FAIL: $*"
    cat "$WORK/out.txt" 2>/dev/null
    exit 1
}
bash -n "$SCRIPT" || fail "bash -n"
GANG_GPU_BUILD=$BUILD GANG_GPU_WORK=$WORK/scratch bash "$SCRIPT" --dry-run "$WORK/out" \
    >"$WORK/out.txt" 2>&1 || fail "the dry run exited $?"
for want in test-cuda test-cuda-step test-cuda-blocks test-engine-cuda test-comm-nccl test-kv-pair-2gpu reference torch-gemm bench-gemm \
    bench-decode bench-decode-wait-each bench-decode-8b torch-decode gpu-health moe-cuda bench-decode-long \
    bench-decode-8b-variants test-cuda-trace profile profile-8b sanitize; do
    grep -q "^DRY  $want: would run with a [0-9]* s timeout" "$WORK/out.txt" ||
        fail "no dry-run line for the step $want"
    grep -q "\"step\":\"$want\",\"status\":\"dry-run\"" "$WORK/out/steps.jsonl" ||
        fail "steps.jsonl has no dry-run record of $want"
done
grep -q '"result":"dry-run"' "$WORK/out/summary.json" || fail "summary.json result"
n=$(find "$WORK/out" -type f | wc -l)
[ "$n" -le 8 ] || fail "OUTDIR holds $n files, more than the device tool's 8"
# --only's list of names is every step the script records.
all=$(sed -n 's/^ALL_STEPS=" \(.*\) "$/\1/p' "$SCRIPT" | tr ' ' '\n' | sort)
recorded=$(grep -o '"step":"[^"]*"' "$WORK/out/steps.jsonl" | cut -d'"' -f4 | sort)
if [ -z "$all" ] || [ "$all" != "$recorded" ]; then
    fail "ALL_STEPS ($(paste -sd' ' <<<"$all")) is not the steps recorded" \
        "($(paste -sd' ' <<<"$recorded"))"
fi
# --only: just those steps, the selection named in the summary; an unknown name refused.
GANG_GPU_BUILD=$BUILD GANG_GPU_WORK=$WORK/scratch bash "$SCRIPT" --dry-run \
    --only test-cuda,bench-gemm,profile "$WORK/only" >"$WORK/out.txt" 2>&1 ||
    fail "the --only dry run exited $?"
recorded=$(grep -o '"step":"[^"]*"' "$WORK/only/steps.jsonl" | cut -d'"' -f4 | sort | paste -sd,)
[ "$recorded" = bench-gemm,profile,test-cuda ] || fail "--only recorded: $recorded"
grep -q '"result":"dry-run","only":"test-cuda,bench-gemm,profile"' \
    "$WORK/only/summary.json" || fail "--only: summary.json does not name the selection"
GANG_GPU_BUILD=$BUILD GANG_GPU_WORK=$WORK/scratch bash "$SCRIPT" --dry-run --only test-cuda,nosuch \
    "$WORK/bad" >"$WORK/out.txt" 2>&1
rc=$?
if [ $rc != 2 ] || ! grep -q "no step named 'nosuch'" "$WORK/out.txt"; then
    fail "--only with an unknown step: exit $rc"
fi
echo "gpu-check dry run: ok ($(grep -c '"status":"dry-run"' "$WORK/out/steps.jsonl") steps, $n files)"
rm -rf "$WORK"
