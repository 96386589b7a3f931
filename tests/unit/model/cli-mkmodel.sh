#!/bin/sh
# `ganglion mkmodel` end to end: the JSON summary, byte-identical reruns, the files of a
# sharded model, and usage errors that exit 2 (docs/design.md section 3). $1 is the binary.
set -u
bin=$1
dir=$(mktemp -d /tmp/gang-cli-mkmodel-XXXXXX)
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

out=$("$bin" mkmodel --out "$dir/a") || fail "mkmodel exited $?"
echo "$out"
case $out in
*'"params":106816,'*) ;;
*) fail "unexpected summary: $out" ;;
esac
"$bin" mkmodel --out="$dir/b" >/dev/null || fail "--out= form"
cmp "$dir/a/model.safetensors" "$dir/b/model.safetensors" || fail "reruns differ"
cmp "$dir/a/config.json" "$dir/b/config.json" || fail "configs differ"

"$bin" mkmodel --out "$dir/c" --arch qwen2 --dtype bf16 --tie --shards 3 --layers 3 \
    --hidden 32 --heads 4 --kv-heads 1 --ffn 64 --vocab 100 --max-pos 64 --seed 9 >/dev/null ||
    fail "qwen2 sharded"
for f in model-00001-of-00003.safetensors model-00003-of-00003.safetensors \
    model.safetensors.index.json config.json; do
    [ -f "$dir/c/$f" ] || fail "missing $f"
done
[ ! -e "$dir/c/model.safetensors" ] || fail "a sharded model has model.safetensors"
grep -q '"tie_word_embeddings": true' "$dir/c/config.json" || fail "--tie not written"
find "$dir/c" -maxdepth 1 -name '*tmp*' | grep -q . && fail "temporary files left"

expect_usage() {
    "$bin" mkmodel "$@" >/dev/null 2>"$dir/err"
    rc=$?
    [ "$rc" -eq 2 ] || fail "mkmodel $* exited $rc, expected 2"
    [ -s "$dir/err" ] || fail "mkmodel $* printed no message"
}
expect_usage
expect_usage --out "$dir/d" --bogus 1
expect_usage --out "$dir/d" --heads 3
expect_usage --out "$dir/d" --layers 0
expect_usage --out "$dir/d" --arch gpt2
expect_usage --out "$dir/d" --dtype f64
expect_usage --out "$dir/d" --layers
expect_usage --out "$dir/d" stray
[ ! -e "$dir/d/config.json" ] || fail "a refused run wrote a model"
echo "cli-mkmodel: ok"
