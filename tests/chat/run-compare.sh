#!/bin/sh
# ctest chat-template-compare: fetch (or find cached) real chat templates, then compare
# ganglion's rendering with transformers' apply_chat_template on them (compare.py) and
# with transformers' jinja2 environment on 1200 random templates (diff-jinja.py). Exit 77
# (SKIP) with the reason when the templates or the reference Python cannot be had.
#   run-compare.sh SOURCE_DIR CHAT_DRIVER
src="$1"
driver="$2"
log="$(mktemp)"
if ! dir="$(bash "$src/scripts/fetch-chat-templates.sh" 2>"$log" | tail -1)" || [ -z "$dir" ]; then
    echo "chat-template-compare skipped: scripts/fetch-chat-templates.sh failed:"
    tail -5 "$log"
    rm -f "$log"
    exit 77
fi
if ! [ -f "$src/scripts/fetch-reference.sh" ]; then
    echo "chat-template-compare skipped: scripts/fetch-reference.sh (the transformers reference) is missing"
    rm -f "$log"
    exit 77
fi
if ! py="$(bash "$src/scripts/fetch-reference.sh" python 2>"$log" | tail -1)" || [ -z "$py" ]; then
    echo "chat-template-compare skipped: scripts/fetch-reference.sh python failed:"
    tail -5 "$log"
    rm -f "$log"
    exit 77
fi
rm -f "$log"
tok="$(bash "$src/scripts/fetch-test-models.sh" 2>/dev/null | tail -1)/smollm2.json"
if ! [ -f "$tok" ]; then
    echo "chat-template-compare skipped: no tokenizer.json from scripts/fetch-test-models.sh"
    exit 77
fi
"$py" "$src/tests/chat/compare.py" "$driver" "$tok" "$dir"/*.jinja || exit 1
# random templates from a grammar, against jinja2 as transformers sets it up
for seed in 1 2 3; do
    "$py" "$src/tests/chat/diff-jinja.py" "$driver" "$seed" 400 || exit 1
done
