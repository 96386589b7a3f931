#!/usr/bin/env bash
# The device bundle's rehearsal here (ctest gpu-bundle-rehearsal, issue #24): that what
# scripts/gpu-bundle.sh makes from this build runs on a machine that has only what the
# device image has (bench/device-image.txt), with the evidence of the loader itself.
#   gpu-bundle-rehearsal.sh SOURCE_DIR BUILD_DIR WORKDIR
#
# 1. The bundle is made from BUILD_DIR and stays under 40 MiB.
# 2. In an environment stripped of everything (env -i, PATH=/usr/bin:/bin: no
#    /usr/local/cuda on any path), every carried binary resolves each library either inside
#    the bundle or among the image's sonames: ldd, and LD_DEBUG=libs of a real run (the
#    file each library was initialised from).
# 3. NCCL and cuBLASLt are found through a Python environment the way the image has them
#    (PYTHONPATH with nvidia/nccl/lib and nvidia/cu13/lib, links to this machine's files),
#    ahead of the loader's and the build's copies: `ganglion info --libraries` names them.
# 4. The preflight, run from the bundle in that environment, answers within 5 s, one line
#    per check: the libraries PASS, the missing driver and device FAIL (no GPU here).
# 5. The device check from the bundle: --dry-run records every step and exits 0 with at
#    most 8 files; a real run stops at the preflight at once, exit 1, naming the driver.
# Exits 77 (skipped, with the reason) when BUILD_DIR has no CUDA build.
set -u
SRC=$1 BUILD=$2 WORK=$3
rm -rf "$WORK" && mkdir -p "$WORK" || exit 1
B=$WORK/bundle
fail() {
    echo "FAIL: $*"
    exit 1
}
if [ ! -x "$BUILD/test-cuda" ] || [ ! -x "$BUILD/test-comm-nccl" ]; then
    echo "SKIP: $BUILD has no CUDA build with NCCL (nvcc or nccl.h not found at configure):" \
        "there is no bundle to rehearse"
    exit 77
fi
CLEAN=(env -i PATH=/usr/bin:/bin HOME="$WORK" LANG=C)

# 1. Make it.
bash "$SRC/scripts/gpu-bundle.sh" "$B" "$BUILD" >"$WORK/bundle.log" 2>&1 ||
    fail "gpu-bundle.sh: $(tail -3 "$WORK/bundle.log")"
kb=$(du -sk "$B" | cut -f1)
[ "$kb" -le $((40 * 1024)) ] || fail "the bundle is $kb KiB, over 40 MiB"
for f in bin/ganglion bin/test-cuda bin/test-cuda-step bin/test-cuda-blocks bin/test-cuda-trace bin/test-engine-cuda bin/test-comm-nccl lib/libblas.so.3 \
    bench/gpu-check.sh bench/gpu-preflight.sh bench/gpu-trace-sum.py bench/device-image.txt MANIFEST; do
    [ -e "$B/$f" ] || fail "the bundle lacks $f"
done

# 2. The loader's evidence, in the stripped environment.
declare -A HAVE=()
while read -r kind name; do
    [ "$kind" = lib ] && HAVE[$name]=1
done < <(grep -v '^#' "$SRC/bench/device-image.txt")
Breal=$(realpath "$B")
for f in "$B"/bin/* "$B"/lib/*; do
    while read -r soname _ path _; do
        [ "$path" = not ] && fail "$(basename "$f"): $soname not found (ldd)"
        path=$(realpath -m "$path")
        case $path in
        "$Breal"/lib/*) ;;
        /usr/local/cuda*) fail "$(basename "$f"): $soname resolved under $path" ;;
        *) [ -n "${HAVE[$soname]:-}" ] ||
            fail "$(basename "$f"): $soname resolved to $path, neither in the bundle nor the image" ;;
        esac
    done < <("${CLEAN[@]}" ldd "$f" 2>&1 | awk '/=>/ {print $1, $2, $3, $4}')
done
"${CLEAN[@]}" LD_DEBUG=libs "$B/bin/ganglion" --version >/dev/null 2>"$WORK/ld-debug.txt" ||
    fail "the carried ganglion --version failed: $(tail -3 "$WORK/ld-debug.txt")"
inits=0
while read -r path; do
    inits=$((inits + 1))
    soname=$(basename "$path")
    path=$(realpath -m "$path")
    case $path in
    "$Breal"/lib/*) ;;
    *) [ -n "${HAVE[$soname]:-}" ] ||
        fail "ganglion initialised $soname from $path, neither the bundle nor the image" ;;
    esac
done < <(sed -n 's/.*calling init: \(.*\)$/\1/p' "$WORK/ld-debug.txt")
[ "$inits" -ge 3 ] || fail "LD_DEBUG showed $inits initialised libraries: no evidence"
grep -q "calling init: $B/bin/../lib/libuv.so.1\|calling init: $Breal/lib/libuv.so.1" \
    "$WORK/ld-debug.txt" || fail "libuv was not initialised from the bundle"

# 3. NCCL and cuBLASLt through a Python environment laid out like the image's wheels.
nccl=$("$BUILD/bin/ganglion" info --libraries 2>/dev/null | sed -n 's/^library NCCL: //p')
lt=$("$BUILD/bin/ganglion" info --libraries 2>/dev/null | sed -n 's/^library cuBLASLt: //p')
{ [ -f "$nccl" ] && [ -f "$lt" ]; } || fail "this machine's NCCL/cuBLASLt not found ($nccl, $lt)"
site=$WORK/site
mkdir -p "$site/nvidia/nccl/lib" "$site/nvidia/cu13/lib"
ln -s "$nccl" "$site/nvidia/nccl/lib/libnccl.so.2"
ln -s "$lt" "$site/nvidia/cu13/lib/$(basename "$lt")"
ln -s "$(dirname "$lt")/libcublas.so.13" "$site/nvidia/cu13/lib/libcublas.so.13"
libs=$("${CLEAN[@]}" PYTHONPATH="$site" "$B/bin/ganglion" info --libraries 2>"$WORK/libs.log") ||
    fail "info --libraries from the bundle: $libs $(tail -3 "$WORK/libs.log")"
grep -qx "library NCCL: $site/nvidia/nccl/lib/libnccl.so.2" <<<"$libs" ||
    fail "NCCL was not taken from the Python environment: $libs"
grep -qx "library cuBLASLt: $site/nvidia/cu13/lib/$(basename "$lt")" <<<"$libs" ||
    fail "cuBLASLt was not taken from the Python environment: $libs"
grep -q "found through the Python environment's package" "$WORK/libs.log" ||
    fail "the log does not say where the library came from"

# 4. The preflight.
t0=$(date +%s%N)
"${CLEAN[@]}" bash "$B/bench/gpu-preflight.sh" "$B" >"$WORK/preflight.txt" 2>&1
rc=$?
ms=$((($(date +%s%N) - t0) / 1000000))
[ $rc -eq 1 ] || fail "the preflight exited $rc without a GPU (want 1): $(cat "$WORK/preflight.txt")"
[ $ms -le 5000 ] || fail "the preflight took $ms ms (budget 5 s)"
for want in '^preflight: FAIL driver: ' '^preflight: FAIL device: ' \
    '^preflight: PASS libraries of ganglion: ' '^preflight: PASS libraries of test-cuda: ' \
    '^preflight: PASS libraries of test-engine-cuda: ' '^preflight: PASS libraries of test-comm-nccl: ' \
    '^preflight: PASS libraries of test-cuda-step: ' \
    '^preflight: PASS libraries of test-cuda-blocks: ' \
    '^preflight: PASS libraries of test-cuda-trace: ' \
    '^preflight: PASS command timeout: '; do
    grep -q "$want" "$WORK/preflight.txt" || fail "no preflight line '$want': $(cat "$WORK/preflight.txt")"
done
if grep -v '^preflight: \(PASS\|FAIL\) [^:]*: .\|^preflight: \(PASS\|FAIL (\)' "$WORK/preflight.txt"; then
    fail "preflight lines that are not 'PASS|FAIL what: detail'"
fi

# 5. The device check from the bundle.
"${CLEAN[@]}" GANG_GPU_WORK="$WORK/scratch" bash "$B/bench/gpu-check.sh" --bundle "$B" --dry-run \
    "$WORK/dry" >"$WORK/dry.txt" 2>&1 || fail "the dry run exited $?: $(tail -5 "$WORK/dry.txt")"
n=$(grep -c '"status":"dry-run"' "$WORK/dry/steps.jsonl")
[ "$n" -ge 12 ] || fail "the dry run recorded $n steps"
files=$(find "$WORK/dry" -type f | wc -l)
[ "$files" -le 8 ] || fail "the dry run left $files files in OUTDIR (at most 8)"
t0=$(date +%s)
"${CLEAN[@]}" GANG_GPU_WORK="$WORK/scratch2" bash "$B/bench/gpu-check.sh" --bundle "$B" \
    "$WORK/real" >"$WORK/real.txt" 2>&1
rc=$?
[ $rc -eq 1 ] || fail "the device check without a GPU exited $rc (want 1)"
[ $(($(date +%s) - t0)) -le 15 ] || fail "the check took over 15 s to give up without a GPU"
grep -q '"result":"fail","reason":".*driver' "$WORK/real/summary.json" ||
    fail "summary.json does not name the driver: $(cat "$WORK/real/summary.json")"
grep -q '^gpu-check: FAIL at the preflight' "$WORK/real.txt" || fail "no one-line cause printed"

echo "gpu-bundle rehearsal: passed ($((kb / 1024)) MiB bundle, $inits libraries initialised" \
    "from the bundle or the image, preflight $ms ms, dry run $n steps in $files files)"
rm -rf "$WORK"
