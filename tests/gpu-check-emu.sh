#!/usr/bin/env bash
# The device check's benchmark steps on the CUDA emulator (ctest gpu-check-emu):
# bench/gpu-check.sh itself, from the emulator's build, --only its `bench decode` steps
# (and test-cuda-trace, before the traced ones), each with its own flags (the layouts,
# --nccl-wait-each with graphs off, the 8B shape's path, the variant points --variants
# cublas and pdl,unfused, a prompt long enough to split the step attention) on a
# tiny shape (GANG_GPU_BENCH_ARGS), so that a step whose flags the engine or the emulator
# refuses (the emulator, as a device, refuses a host wait inside a capture) fails here
# before it costs device time.
# Every step must pass, and the summary must print each step's decode points with the
# host syncs and launches per step, the wait-each point's and the split ones' marks.
#   gpu-check-emu.sh SCRIPT BUILD WORKDIR
set -u
SCRIPT=$1 BUILD=$2 WORK=$3
STEPS=bench-decode,bench-decode-wait-each,bench-decode-8b,bench-decode-8b-variants
STEPS=$STEPS,bench-decode-long,test-cuda-trace,profile,profile-8b
rm -rf "$WORK"
mkdir -p "$WORK" || exit 1
fail() {
    echo "FAIL: $*"
    cat "$WORK/out.txt" 2>/dev/null
    tail -n 40 "$WORK/out/logs.txt" 2>/dev/null
    exit 1
}
GANG_GPU_BUILD=$BUILD GANG_GPU_WORK=$WORK/scratch GANG_GPU_BUDGET_S=1200 \
    GANG_GPU_BENCH_ARGS="--layers 1 --hidden 64 --heads 4 --kv-heads 2 --ffn 128 --vocab 256 \
--tokens 4 --iters 1 --warmup 0 --gpu-memory-mb 512 --bw-mib 16" GANG_GPU_LONG_PROMPT=260 \
    bash "$SCRIPT" --only "$STEPS" "$WORK/out" >"$WORK/out.txt" 2>&1 || fail "gpu-check exited $?"
for s in ${STEPS//,/ }; do
    grep -q "\"step\":\"$s\",\"status\":\"pass\"" "$WORK/out/steps.jsonl" || fail "$s did not pass"
done
grep -q "\"result\":\"pass\",\"only\":\"$STEPS\"" "$WORK/out/summary.json" ||
    fail "summary.json: not a pass of the selection"
sum=$WORK/out/summary.txt
# bench-decode: 1x1 / 2x1 / nccl and the cublas variant at batch 1 and 64; wait-each: 1x1
# and nccl, 2 batches; 8b: 1x1 at 2 batches; 8b-variants: 1x1 and the pdl and unfused
# variants at batch 1; long: 2; profile: 2; profile-8b: 1. Each line with its counters.
n=$(grep -c '^  decode .*syncs/step [0-9.]* launches/step [0-9.]*' "$sum")
[ "$n" = 22 ] || fail "$n decode lines with counters in summary.txt, expected 22"
grep -q '(nccl, a wait per collective).*syncs/step' "$sum" || fail "no wait-each nccl point"
grep -q '^  decode 8b tp 1 batch 1 .*(model built in [0-9.]* s, layers [0-9.]* s)' "$sum" ||
    fail "no model build time on the 8B step's first point"
grep -q '(GEMVs as PDL launches)' "$sum" || fail "no PDL point"
grep -q '(norms and adds as kernels of their own)' "$sum" || fail "no unfused point"
grep -q '(cuBLASLt for the decode products)' "$sum" || fail "no cuBLASLt point"
grep -q '(260-token prompts, KV [0-9.e+]* B/step)' "$sum" || fail "no long-context point"
grep -q 'target: 8B bf16 batch-1 decode >= 0.7 of the HBM roofline: ratio' "$sum" ||
    fail "no 8B target line"
# The kernel traces (on the emulated CUPTI): the three traced points marked, each with its
# breakdown and its ops, the GEMV among them.
nt=$(grep -c '(kernels traced)' "$sum")
[ "$nt" = 3 ] || fail "$nt traced decode lines, expected 3"
for p in '1b bf16 batch 1 (profile)' '1b bf16 batch 64 (profile)' '8b bf16 batch 1 (profile-8b)'; do
    grep -q "^  trace $p: [0-9.]* kernels/step ([0-9.]* in its graph); step [0-9.]* us = device" \
        "$sum" || fail "no trace line for $p"
done
grep -q '^    gemv_kernel<T> [0-9]*x1x1 *[0-9.]*/step' "$sum" || fail "no GEMV op in the traces"
echo "gpu-check on the emulator: its $(echo "${STEPS//,/ }" | wc -w) bench decode steps passed," \
    "$n decode points in the summary"
rm -rf "$WORK"
