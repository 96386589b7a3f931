#!/usr/bin/env bash
# bench/gpu-sanitize.sh without a GPU (ctest gpu-sanitize-fake): compute-sanitizer replaced
# by a stand-in (GANG_COMPUTE_SANITIZER) that prints what the real tool ends with, so that
# the script's reading of it is checked here: a clean run of each tool is ok (exit 0; the
# stand-in counts an error when memcheck or initcheck run without the pool split), a
# memcheck error or racecheck hazard count fails it (exit 1) with the count, a test that
# failed under the tool fails it, output without a summary fails it, and a missing tool
# fails every tool with that reason. The real tool runs only on the device.
#   gpu-sanitize-fake.sh SCRIPT WORKDIR
set -u
SCRIPT=$1 WORK=$2
rm -rf "$WORK"
mkdir -p "$WORK/tests" || exit 1
fail() {
    echo "FAIL: $*"
    cat "$WORK/out.txt" 2>/dev/null
    exit 1
}
printf '#!/bin/sh\nexit 0\n' >"$WORK/tests/test-cuda-step"
chmod +x "$WORK/tests/test-cuda-step"
# The stand-in: FAKE_CS_MODE says what each tool reports.
cat >"$WORK/cs" <<'CS'
#!/usr/bin/env bash
tool=$2
echo "========= COMPUTE-SANITIZER"
echo "[  PASSED  ] 11 test(s)."
split=${GANGLION_GPU_POOL_SPLIT:-unset}
case $FAKE_CS_MODE:$tool:$split in
clean:memcheck:1 | clean:initcheck:1 | clean:racecheck:0) ;;
clean:*)
    echo "========= the pool split is $split for $tool"
    echo "========= ERROR SUMMARY: 1 errors"
    exit 3 ;;
esac
case $FAKE_CS_MODE:$tool in
clean:racecheck) echo "========= RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)" ;;
clean:*) echo "========= ERROR SUMMARY: 0 errors" ;;
dirty:memcheck)
    echo "========= Invalid __global__ read of size 16 bytes"
    echo "=========     at gemv_kernel<__nv_bfloat16>+0x1a0"
    echo "========= ERROR SUMMARY: 2 errors"
    exit 3 ;;
dirty:racecheck)
    echo "========= Error: Race reported between Write access at gemv_stage_norm"
    echo "========= RACECHECK SUMMARY: 3 hazards displayed (1 errors, 2 warnings)"
    exit 3 ;;
dirty:*) echo "========= ERROR SUMMARY: 0 errors" ;;
testfail:*) echo "[  FAILED  ] test_matmul_fused"; echo "========= ERROR SUMMARY: 0 errors"; exit 1 ;;
silent:*) exit 0 ;;
esac
CS
chmod +x "$WORK/cs"
run() { # MODE: runs the script with the stand-in, its exit status in $rc
    GANG_COMPUTE_SANITIZER=$WORK/cs FAKE_CS_MODE=$1 bash "$SCRIPT" "$WORK/tests" \
        >"$WORK/out.txt" 2>"$WORK/err.txt"
    rc=$?
}
line() { grep "\"tool\":\"$1\"" "$WORK/out.txt"; }

run clean
[ $rc = 0 ] || fail "clean: exit $rc"
for t in memcheck racecheck initcheck; do
    line $t | grep -q '"errors":0,"rc":0,.*"ok":true' || fail "clean: $t not ok"
done
line memcheck | grep -q '"pool_split":true' || fail "clean: memcheck's pool not split"
line racecheck | grep -q '"pool_split":false' || fail "clean: racecheck's pool split"
run dirty
[ $rc = 1 ] || fail "dirty: exit $rc"
line memcheck | grep -q '"errors":2,"rc":3,.*"ok":false' || fail "dirty: memcheck's 2 errors"
line racecheck | grep -q '"errors":1,"rc":3,.*"ok":false' || fail "dirty: racecheck's 1 error"
line initcheck | grep -q '"ok":true' || fail "dirty: initcheck was clean"
grep -q 'Invalid __global__ read of size 16' "$WORK/err.txt" || fail "dirty: findings not shown"
run testfail
[ $rc = 1 ] || fail "testfail: exit $rc"
line memcheck | grep -q '"errors":0,"rc":1,.*"ok":false' || fail "testfail: not a failure"
run silent
[ $rc = 1 ] || fail "silent: exit $rc"
line memcheck | grep -q '"errors":null,.*"ok":false,"reason":"no ERROR SUMMARY' ||
    fail "silent: no summary read as a pass"
GANG_COMPUTE_SANITIZER=$WORK/nosuch bash "$SCRIPT" "$WORK/tests" memcheck >"$WORK/out.txt" 2>&1
rc=$?
[ $rc = 1 ] || fail "missing tool: exit $rc"
grep -q '"ok":false,"reason":"compute-sanitizer not found' "$WORK/out.txt" ||
    fail "missing tool: no reason"
bash "$SCRIPT" "$WORK/tests" nosuchtool >"$WORK/out.txt" 2>&1
[ $? = 2 ] || fail "an unknown tool is not a usage error"
echo "gpu-sanitize.sh: its reading of compute-sanitizer's summaries holds (5 cases)"
rm -rf "$WORK"
