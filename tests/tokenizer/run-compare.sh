#!/bin/sh
# ctest tokenizer-compare: fetch (or find cached) the real tokenizers, then compare
# ganglion's tokenizer with the Python `tokenizers` package on them (and Gemma 3's GGUF
# vocabulary with transformers' GGUF converter, when that file and Python can be had). Exit 77 (SKIP) with
# the reason when the test data or the reference package cannot be had.
#   run-compare.sh SOURCE_DIR TOK_DRIVER
src="$1"
driver="$2"
log="$(mktemp)"
if ! dir="$(bash "$src/scripts/fetch-test-models.sh" 2>"$log" | tail -1)" || [ -z "$dir" ]; then
    echo "tokenizer-compare skipped: scripts/fetch-test-models.sh failed:"
    tail -5 "$log"
    rm -f "$log"
    exit 77
fi
rm -f "$log"
. "$src/scripts/cache-paths.sh"
# Gemma 3's SentencePiece vocabulary read from its GGUF file, against transformers' GGUF
# converter on the same file (tests/tokenizer/gguf-spm-ref.py, made once and cached).
extra=""
if gguf="$(bash "$src/scripts/fetch-reference.sh" gemma3-gguf 2>/dev/null | tail -1)" &&
    py="$(bash "$src/scripts/fetch-reference.sh" python 2>/dev/null | tail -1)" &&
    [ -n "$gguf" ] && [ -n "$py" ]; then
    ref="$dir/gemma3-gguf-ref.json"
    want="$(sha256sum "$src/tests/tokenizer/gguf-spm-ref.py" | cut -c1-16)"
    if [ ! -s "$ref" ] || [ "$(cat "$ref.stamp" 2>/dev/null)" != "$want" ]; then
        TQDM_DISABLE=1 "$py" "$src/tests/tokenizer/gguf-spm-ref.py" "$gguf" "$ref.tmp" &&
            mv "$ref.tmp" "$ref" && echo "$want" >"$ref.stamp"
    fi
    [ -s "$ref" ] && [ "$(cat "$ref.stamp" 2>/dev/null)" = "$want" ] && extra="$gguf=$ref"
fi
[ -n "$extra" ] || echo "tokenizer-compare: the Gemma 3 GGUF comparison is left out: scripts/fetch-reference.sh gemma3-gguf or python failed"
# SmolLM2's tokenizer as transformers converts it from the GGUF file (its decoder Sequence
# is the issue #27 regression), made once with the reference Python and cached.
fromgguf=""
if sgguf="$(bash "$src/scripts/fetch-reference.sh" smollm2-gguf 2>/dev/null | tail -1)" &&
    py="$(bash "$src/scripts/fetch-reference.sh" python 2>/dev/null | tail -1)" &&
    [ -n "$sgguf" ] && [ -n "$py" ]; then
    fromgguf="$dir/smollm2-from-gguf.json"
    if [ ! -s "$fromgguf" ]; then
        TQDM_DISABLE=1 "$py" "$src/tests/tokenizer/gguf-hf-json.py" "$sgguf" "$fromgguf.tmp" \
            >/dev/null 2>&1 && mv "$fromgguf.tmp" "$fromgguf"
    fi
    [ -s "$fromgguf" ] || fromgguf=""
fi
[ -n "$fromgguf" ] || echo "tokenizer-compare: SmolLM2's GGUF-converted tokenizer.json is left out: scripts/fetch-reference.sh smollm2-gguf or python failed"
exec "$TOK_VENV/bin/python" "$src/tests/tokenizer/compare.py" "$driver" \
    "$dir/smollm2.json" "$dir/smollm2-l3.json" "$dir/mistral-v1.json" ${fromgguf:+"$fromgguf"} \
    ${extra:+"$extra"}
