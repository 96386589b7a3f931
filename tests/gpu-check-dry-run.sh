#!/usr/bin/env bash
# bench/gpu-check.sh without a GPU (ctest gpu-check-dry-run): its syntax, then a dry run
# (GANG_GPU_DRY_RUN=1: every step printed and recorded with its timeout, nothing run) that
# must list the issue #13 decode steps with their flags, write summary.json with the 8B
# roofline target as n/a, and exit 0.
#   gpu-check-dry-run.sh SCRIPT WORKDIR
set -u
SCRIPT=$1 WORK=$2
rm -rf "$WORK"
mkdir -p "$WORK" || exit 1
fail() {
    echo "FAIL: $*"
    cat "$WORK/err.txt" 2>/dev/null
    exit 1
}
bash -n "$SCRIPT" || fail "bash -n"
GANG_GPU_DRY_RUN=1 GANG_GPU_BUILD="$WORK/build" bash "$SCRIPT" "$WORK/out" >"$WORK/out.txt" \
    2>"$WORK/err.txt" || fail "the dry run exited $?"
for want in 'bench-decode (timeout [0-9]* s, dry run): .*--device cuda --dtypes f32$' \
    'bench-decode-8b (timeout [0-9]* s, dry run): .*--shape 8b --dtypes bf16 --batch 1 ' \
    'bench-decode-storage (timeout [0-9]* s, dry run): .*--dtypes bf16,int8 --layouts 1x1,2x1'; do
    grep -q -- "$want" "$WORK/err.txt" || fail "no step line matching: $want"
done
grep -q '"bench-decode-8b":"dry-run"' "$WORK/out/summary.json" || fail "summary.json steps"
grep -q '"decode_8b_bf16_batch1_roofline":{"ratio":null,"target":0.7,"result":"n/a","enforced":false}' \
    "$WORK/out/summary.json" || fail "summary.json targets"
grep -q 'target: 8B-shaped bf16 batch-1 decode >= 0.7 of the HBM roofline: n/a' "$WORK/out.txt" ||
    fail "the target line"
echo "gpu-check dry run: ok ($(grep -c '"status":"dry-run"' "$WORK/out/steps.jsonl") steps)"
rm -rf "$WORK"
