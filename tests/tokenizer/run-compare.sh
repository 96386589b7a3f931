#!/bin/sh
# ctest tokenizer-compare: fetch (or find cached) the real tokenizers, then compare
# ganglion's tokenizer with the Python `tokenizers` package on them. Exit 77 (SKIP) with
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
exec "$TOK_VENV/bin/python" "$src/tests/tokenizer/compare.py" "$driver" \
    "$dir/smollm2.json" "$dir/smollm2-l3.json" "$dir/mistral-v1.json"
