#!/usr/bin/env bash
# The decode step's kernels under NVIDIA's compute-sanitizer, on the device (issue #24; the
# device check's extra step `sanitize`, not a gate): test-cuda-step (the fused decode GEMV,
# the step attention with its KV append, the sampler, the table scatter, the conversions)
# run once under each tool:
#   memcheck   out-of-bounds and misaligned accesses to global, local and shared memory,
#              and the device's exceptions, at the granularity of cudaMalloc: so it runs
#              with the backend's pool split (GANGLION_GPU_POOL_SPLIT=1, every tensor its
#              own cudaMalloc), else an access past a tensor inside the one pool is not seen;
#   racecheck  shared-memory hazards between a block's threads, which the CUDA emulator
#              shows only in part (its threads run in two orders, and only at barriers);
#   initcheck  reads of device memory that nothing wrote, the pool split too (a tensor
#              reusing pool memory that an earlier one wrote would count as written).
# One JSON line per tool: "measure": "sanitizer", the tool, whether the pool was split, the
# errors compute-sanitizer counted, the test's exit status, seconds, "ok" (no error and the
# test passed); the first
# error lines of each go to stderr (the check's logs.txt keeps the step's tail). Exit 0 when
# every tool is ok, 1 otherwise (a tool that cannot run, compute-sanitizer not found
# included), 2 on usage.
#   gpu-sanitize.sh TESTS_DIR [TOOLS]     TOOLS: comma-separated (default all three)
set -u
if [ $# -lt 1 ] || [ $# -gt 2 ]; then
    echo "usage: gpu-sanitize.sh TESTS_DIR [memcheck,racecheck,initcheck]" >&2
    exit 2
fi
BIN=$1/test-cuda-step
TOOLS=${2:-memcheck,racecheck,initcheck}
# Each tool's timeout (s): the test takes about a second bare; racecheck instruments every
# shared-memory access.
declare -A TMO=([memcheck]=25 [racecheck]=45 [initcheck]=25 [synccheck]=25)
# The tool: GANG_COMPUTE_SANITIZER when set (the test's stand-in), else on PATH, else in the
# toolkit's usual places.
if [ -n "${GANG_COMPUTE_SANITIZER+set}" ]; then
    CS=$GANG_COMPUTE_SANITIZER
    [ -x "$CS" ] || CS=""
else
    CS=$(command -v compute-sanitizer)
    for c in /usr/local/cuda/bin/compute-sanitizer \
        /usr/local/cuda/compute-sanitizer/compute-sanitizer /usr/local/cuda-*/bin/compute-sanitizer \
        /opt/nvidia/*/compute-sanitizer/compute-sanitizer; do
        [ -n "$CS" ] && break
        [ -x "$c" ] && CS=$c
    done
fi
# The tools that see allocations' bounds run with the pool split.
declare -A SPLIT=([memcheck]=1 [racecheck]=0 [initcheck]=1 [synccheck]=0)
emit() { # tool errors rc seconds ok reason
    local split=false
    [ "${SPLIT[$1]:-0}" = 1 ] && split=true
    printf '{"measure":"sanitizer","tool":"%s","binary":"test-cuda-step","pool_split":%s,"errors":%s,"rc":%s,"seconds":%s,"ok":%s,"reason":"%s"}\n' \
        "$1" "$split" "$2" "$3" "$4" "$5" "$6"
}
status=0
for tool in ${TOOLS//,/ }; do
    if [ -z "${TMO[$tool]:-}" ]; then
        echo "gpu-sanitize.sh: unknown tool '$tool'" >&2
        exit 2
    fi
    if [ -z "$CS" ]; then
        emit "$tool" null -1 0 false "compute-sanitizer not found (PATH, /usr/local/cuda*, /opt/nvidia)"
        status=1
        continue
    fi
    if [ ! -x "$BIN" ]; then
        emit "$tool" null -1 0 false "no $BIN"
        status=1
        continue
    fi
    log=$(mktemp)
    t0=$(date +%s.%N)
    GANGLION_GPU_POOL_SPLIT=${SPLIT[$tool]} timeout --kill-after=5 "${TMO[$tool]}" "$CS" \
        --tool "$tool" --error-exitcode 3 --report-api-errors no "$BIN" >"$log" 2>&1
    rc=$?
    secs=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}')
    # memcheck and initcheck end with "ERROR SUMMARY: N errors", racecheck with
    # "RACECHECK SUMMARY: H hazards displayed (N errors, W warnings)"
    errors=$(grep -o 'ERROR SUMMARY: [0-9]*' "$log" | tail -1 | grep -o '[0-9]*$')
    [ -z "$errors" ] && errors=$(grep -o 'RACECHECK SUMMARY: .*([0-9]* error' "$log" | tail -1 |
        grep -o '([0-9]*' | tr -d '(')
    if [ -z "$errors" ]; then
        reason="no ERROR SUMMARY (exit $rc$([ $rc = 124 ] && echo ": killed by the ${TMO[$tool]} s timeout"))"
        emit "$tool" null "$rc" "$secs" false "$reason"
        status=1
    elif [ "$errors" != 0 ] || [ $rc != 0 ]; then
        emit "$tool" "$errors" "$rc" "$secs" false "$errors error(s), exit $rc"
        status=1
    else
        emit "$tool" 0 0 "$secs" true "no error"
    fi
    {
        echo "--- $tool (exit $rc, $secs s): first findings"
        grep -E '^========= ' "$log" | head -n 24
        grep -E '^\[  (FAILED|PASSED)' "$log" | head -n 4
    } >&2
    rm -f "$log"
done
exit $status
