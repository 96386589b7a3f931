#!/usr/bin/env bash
# Makes the device bundle (issue #24): everything the GPU check runs, built here with
# CUDA 13 for sm_90, plus every shared library those binaries need that the device image
# lacks (bench/device-image.txt), so that the bare device machine needs nothing but its
# driver and its own image. The device tool carries it as one ignored path of the tree.
#
#   scripts/gpu-bundle.sh OUT_DIR [BUILD_DIR]
#
# BUILD_DIR (default: build, as `make build` leaves it) must be a CUDA build (nvcc was
# found: test-cuda exists); with GANG_BUNDLE_CONFIGURE=1 a missing BUILD_DIR is configured
# and built first (Release, sm_90). Layout of OUT_DIR:
#   bin/      ganglion, test-cuda, test-cuda-step, test-cuda-blocks, test-cuda-trace,
#             test-engine-cuda, test-comm-nccl, test-kv-pair (debug info stripped;
#             RPATH $ORIGIN/../lib, so lib/ is searched first, for their libraries' own
#             dependencies too)
#   lib/      the libraries the image lacks (libuv, libsodium, cJSON, http-parser, PCRE2,
#             cmocka; RUNPATH $ORIGIN) and a reference BLAS (netlib libblas.so.3, libc
#             only) for the CPU reference paths the GPU tests compare against: OpenBLAS
#             is 36 MB and the device image has none that exports cblas_sgemm
#   bench/    the check's scripts (gpu-check.sh, gpu-preflight.sh, gpu-health-check.py,
#             gpu-moe-check.sh, gpu-trace-sum.py, gpu-sanitize.sh,
#             gpu-reference.py, torch-peer.py, local_serve.py, device-image.txt): the
#             bundle runs alone
#   MANIFEST  commit, date, toolkit, every file with its size, the newest GLIBC needed
# Fails (exit 1, one line) when a binary is missing, a library cannot be found here, a
# carried file needs a newer glibc than the image's floor, or the bundle exceeds
# GANG_BUNDLE_MAX_MB (default 40).
set -euo pipefail

if [ $# -lt 1 ] || [ $# -gt 2 ]; then
    echo "usage: $0 OUT_DIR [BUILD_DIR]" >&2
    exit 2
fi
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=$1
BUILD=${2:-$ROOT/build}
IMAGE=$ROOT/bench/device-image.txt
MAX_MB=${GANG_BUNDLE_MAX_MB:-40}
# shellcheck source=scripts/cache-paths.sh
. "$ROOT/scripts/cache-paths.sh"

die() {
    echo "gpu-bundle: $*" >&2
    exit 1
}

command -v patchelf >/dev/null || die "patchelf is missing (scripts/install-deps.sh installs it)"
if [ ! -x "$BUILD/test-cuda" ] && [ "${GANG_BUNDLE_CONFIGURE:-0}" = 1 ]; then
    cmake -S "$ROOT" -B "$BUILD" -DGANGLION_CUDA=ON -DCMAKE_BUILD_TYPE=Release \
        -DCMAKE_CUDA_ARCHITECTURES=90 >/dev/null
    cmake --build "$BUILD" -j "$(nproc)" --target ganglion test-cuda test-cuda-step \
        test-cuda-blocks test-cuda-trace test-engine-cuda test-comm-nccl test-kv-pair
fi
BINS=("$BUILD/bin/ganglion" "$BUILD/test-cuda" "$BUILD/test-cuda-step" "$BUILD/test-cuda-blocks"
    "$BUILD/test-cuda-trace" "$BUILD/test-engine-cuda" "$BUILD/test-comm-nccl" "$BUILD/tests/test-kv-pair")
for b in "${BINS[@]}"; do
    [ -x "$b" ] || die "$b is missing: $BUILD must be a CUDA build with NCCL (nvcc and nccl.h" \
        "found at configure; GANG_BUNDLE_CONFIGURE=1 builds one)"
done
# The kernels must be machine code for the H200 (sm_90), as the build's nvcc flags say.
grep -qs 'code=\[compute_90,sm_90\]\|code=sm_90' "$BUILD/CMakeFiles/gang_kernels.dir/flags.make" ||
    die "$BUILD is not built for sm_90 (CMAKE_CUDA_ARCHITECTURES=90)"

# The libraries the image has, by soname.
declare -A HAVE=()
while read -r kind name; do
    [ "$kind" = lib ] && HAVE[$name]=1
done < <(grep -v '^#' "$IMAGE")
GLIBC_FLOOR=$(awk '$1 == "glibc" {print $2}' "$IMAGE")

rm -rf "$OUT"
mkdir -p "$OUT/bin" "$OUT/lib" "$OUT/bench"
for b in "${BINS[@]}"; do
    cp "$b" "$OUT/bin/"
done

# The reference BLAS: Debian's netlib libblas3 (CBLAS included, libc only), its .deb cached.
deb=$(find "$CACHE/pkgs" -maxdepth 1 -name 'libblas3_*.deb' 2>/dev/null | head -1)
if [ -z "$deb" ]; then
    mkdir -p "$CACHE/pkgs"
    (cd "$CACHE/pkgs" && apt-get download libblas3 >/dev/null 2>&1) ||
        die "cannot download the libblas3 package (apt-get download libblas3)"
    deb=$(find "$CACHE/pkgs" -maxdepth 1 -name 'libblas3_*.deb' | head -1)
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
dpkg-deb -x "$deb" "$tmp"
cp -L "$tmp"/usr/lib/x86_64-linux-gnu/blas/libblas.so.3 "$OUT/lib/libblas.so.3"

# Every library a carried file needs, transitively, that the image does not provide.
queue=("${BINS[@]}")
while [ ${#queue[@]} -gt 0 ]; do
    f=${queue[0]}
    queue=("${queue[@]:1}")
    while read -r soname path; do
        [ -n "${HAVE[$soname]:-}" ] && continue
        [ -e "$OUT/lib/$soname" ] && continue
        [ "$path" = "not" ] && die "$f needs $soname, which is not found on this machine"
        cp -L "$path" "$OUT/lib/$soname"
        queue+=("$path")
    done < <(ldd "$f" | awk '/=>/ {print $1, $3}')
done

strip --strip-debug "$OUT"/bin/* "$OUT"/lib/*
# shellcheck disable=SC2016 # $ORIGIN is the loader's, not the shell's
for b in "$OUT"/bin/*; do
    patchelf --force-rpath --set-rpath '$ORIGIN/../lib' "$b"
done
# shellcheck disable=SC2016 # likewise
for l in "$OUT"/lib/*; do
    patchelf --set-rpath '$ORIGIN' "$l"
done

for s in gpu-check.sh gpu-preflight.sh gpu-health-check.py gpu-reference.py torch-peer.py \
    local_serve.py device-image.txt gpu-moe-check.sh gpu-trace-sum.py gpu-sanitize.sh; do
    cp "$ROOT/bench/$s" "$OUT/bench/"
done

# glibc: no carried file may need a newer symbol version than the image's floor.
newest=$(for f in "$OUT"/bin/* "$OUT"/lib/*; do
    objdump -T "$f" | grep -o 'GLIBC_[0-9.]*' | sed 's/GLIBC_//'
done | sort -uV | tail -1)
if [ "$(printf '%s\n%s\n' "$newest" "$GLIBC_FLOOR" | sort -V | tail -1)" != "$GLIBC_FLOOR" ]; then
    die "a carried file needs GLIBC_$newest, newer than the image's floor $GLIBC_FLOOR"
fi

{
    echo "ganglion device bundle"
    echo "commit: $(git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo unknown)"
    echo "made: $(date -u +%Y-%m-%dT%H:%M:%SZ) from $BUILD"
    echo "cuda: $(sed -n 's/^CMAKE_CUDA_COMPILER_VERSION:.*=//p; s/^set(CMAKE_CUDA_COMPILER_VERSION "\(.*\)")/\1/p' \
        "$BUILD"/CMakeFiles/*/CMakeCUDACompiler.cmake 2>/dev/null | head -1) sm_90"
    echo "newest GLIBC needed: $newest (image floor $GLIBC_FLOOR)"
    echo "files:"
    (cd "$OUT" && find bin lib bench -type f -printf '  %p %s\n' | sort)
} >"$OUT/MANIFEST"

kb=$(du -sk "$OUT" | cut -f1)
[ "$kb" -le $((MAX_MB * 1024)) ] || die "the bundle is $((kb / 1024)) MiB, over $MAX_MB MiB"
echo "gpu-bundle: $OUT: $((kb / 1024)) MiB ($kb KiB), $(find "$OUT" -type f | wc -l) files," \
    "newest GLIBC $newest"
