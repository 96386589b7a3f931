#!/usr/bin/env bash
# Builds the CPU peer, llama.cpp, once and caches it (issues #27, #28): llama-bench,
# llama-batched-bench, llama-server and llama-quantize from the llama.cpp source that the
# PyPI sdist of llama-cpp-python vendors (the same sdist scripts/fetch-chat-templates.sh
# downloads; nothing else of PyPI or GitHub is reachable from this machine).
#
#   bash bench/build-llama-cpp.sh        # prints the directory holding the four programs
#
# Cache: $CACHE/llama.cpp-<version>/bin (scripts/cache-paths.sh). A finished build is
# reused: the script then only prints the directory. Build: CMake, Release, CPU only
# (no CUDA, no curl), GGML_NATIVE for this machine's SIMD (the peer runs here, where it is
# compared), static libraries so the programs need nothing from the build tree. About
# 5-10 minutes on two cores, once. LLAMA_CPP_PYTHON_VERSION picks another sdist.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=scripts/cache-paths.sh
. "$ROOT/scripts/cache-paths.sh"
VERSION=${LLAMA_CPP_PYTHON_VERSION:-0.3.36}
DEST=$CACHE/llama.cpp-$VERSION
PROGS=(llama-bench llama-batched-bench llama-server llama-quantize)

have_all() {
    for p in "${PROGS[@]}"; do
        [ -x "$DEST/bin/$p" ] || return 1
    done
}
if have_all; then
    echo "$DEST/bin"
    exit 0
fi

say() { echo "build-llama-cpp: $*" >&2; }
sdist=$CACHE/pkgs/llama_cpp_python-$VERSION.tar.gz
if [ ! -f "$sdist" ]; then
    mkdir -p "$CACHE/pkgs"
    say "downloading the llama-cpp-python==$VERSION sdist (about 60 MB, once)"
    python3 -m pip download --no-deps --no-binary :all: -d "$CACHE/pkgs" \
        "llama-cpp-python==$VERSION" >&2 || { say "pip download failed"; exit 1; }
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
tar -xzf "$sdist" -C "$work"
src=$(find "$work" -maxdepth 4 -type d -path '*/vendor/llama.cpp' | head -1)
[ -n "$src" ] || { say "no vendor/llama.cpp in $sdist"; exit 1; }
say "building ${PROGS[*]} from $src (once; several minutes)"
cmake -S "$src" -B "$work/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
    -DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF -DGGML_CUDA=OFF -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TOOLS=ON >&2
cmake --build "$work/build" -j "$(nproc)" --target "${PROGS[@]}" >&2
mkdir -p "$DEST.tmp/bin"
for p in "${PROGS[@]}"; do
    cp "$work/build/bin/$p" "$DEST.tmp/bin/"
done
# The server's tests (tools/server/tests) and the grammars travel with the build: the
# OpenAI-conformance adapter (issue #28) runs them against ganglion.
cp -r "$src/tools/server/tests" "$DEST.tmp/server-tests" 2>/dev/null || true
echo "llama-cpp-python $VERSION, built $(date -u +%Y-%m-%dT%H:%M:%SZ)" >"$DEST.tmp/VERSION"
rm -rf "$DEST"
mv "$DEST.tmp" "$DEST"
have_all || { say "the build did not produce every program"; exit 1; }
echo "$DEST/bin"
