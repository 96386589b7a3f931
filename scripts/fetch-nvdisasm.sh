#!/usr/bin/env bash
# Fetches NVIDIA's SASS disassembler (nvdisasm) once and caches it: the sass-loads test
# (tests/sass-loads.py, issue #24) reads the decode GEMV's machine code with it. The CUDA
# toolkit here has nvcc and ptxas but neither nvdisasm nor cuobjdump; PyPI's
# nvidia-cuda-nvdisasm wheel (pinned below, ~5 MB) has the binary, which reads the sm_90
# code CUDA 13.0's ptxas makes.
#
# Idempotent and quick when cached: prints the path of the nvdisasm binary on its last line
# of stdout. The wheel and the unpacked binary live in $GANGLION_CACHE (else
# /var/cache/ganglion as root, else ~/.cache/ganglion; scripts/cache-paths.sh). Called by
# scripts/install-deps.sh and by the sass-loads test. Exit 1 with the reason on stderr
# when it cannot be had (the test then reports SKIP).
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
VERSION="13.5.37"
. "$here/cache-paths.sh"
DIR="$CACHE/nvdisasm-$VERSION"
BIN="$DIR/nvidia/cu13/bin/nvdisasm"
say() { echo "fetch-nvdisasm: $*" >&2; }

if [ -x "$BIN" ] && "$BIN" --version >/dev/null 2>&1; then
    echo "$BIN"
    exit 0
fi
command -v python3 >/dev/null 2>&1 || { say "no python3 on PATH"; exit 1; }
mkdir -p "$CACHE/pkgs"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
whl="$(find "$CACHE/pkgs" -maxdepth 1 -name "nvidia_cuda_nvdisasm-$VERSION-*.whl" | head -1)"
if [ -z "$whl" ]; then
    say "downloading nvidia-cuda-nvdisasm==$VERSION (about 5 MB, once)"
    # Debian's python3 has no pip of its own outside a venv (python3-venv brings it)
    python3 -m venv "$tmp/venv" >&2 || { say "python3 -m venv failed"; exit 1; }
    "$tmp/venv/bin/pip" download -q --disable-pip-version-check --no-deps \
        --only-binary=:all: -d "$CACHE/pkgs" "nvidia-cuda-nvdisasm==$VERSION" >&2 ||
        { say "pip download nvidia-cuda-nvdisasm==$VERSION failed"; exit 1; }
    whl="$(find "$CACHE/pkgs" -maxdepth 1 -name "nvidia_cuda_nvdisasm-$VERSION-*.whl" | head -1)"
    [ -n "$whl" ] || { say "pip download left no wheel in $CACHE/pkgs"; exit 1; }
fi
python3 -m zipfile -e "$whl" "$tmp/unpacked" ||
    { say "cannot unpack $whl"; exit 1; }
[ -f "$tmp/unpacked/nvidia/cu13/bin/nvdisasm" ] ||
    { say "$whl has no nvidia/cu13/bin/nvdisasm"; exit 1; }
chmod +x "$tmp/unpacked/nvidia/cu13/bin/nvdisasm"
"$tmp/unpacked/nvidia/cu13/bin/nvdisasm" --version >/dev/null 2>&1 ||
    { say "the unpacked nvdisasm does not run here"; exit 1; }
rm -rf "$DIR"
mv "$tmp/unpacked" "$DIR"
echo "$BIN"
