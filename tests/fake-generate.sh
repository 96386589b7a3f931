#!/usr/bin/env bash
# The workers on the fake device (kernels/fake/): `ganglion generate` runs a local gang of
# worker processes; with --device fake each worker moves its shard to device memory the
# host cannot read and runs the engine there (TP / PP staged through host memory over the
# socket backend). The greedy tokens must equal --device cpu's: a Llama model on 1x1 and
# TP 2 x PP 2, a Gemma 3 model (GeGLU, scaled embeddings) on TP 2, and the Llama model
# with its weights stored as bf16 (TP 2 x PP 2) and as int8 (1x1), issue #13. Gemma's LM head
# is tied to its embedding table: on TP 2 each rank's head is rows of the table it holds
# (moved to the device with it; int8: the table's scales from the rank's first row).
#
#   fake-generate.sh GANGLION WORKDIR
set -u
BIN=$1 DIR=$2
rm -rf "$DIR" && mkdir -p "$DIR" || exit 1
for arch in llama gemma3; do
    "$BIN" mkmodel --out "$DIR/$arch" --arch "$arch" --layers 3 --hidden 64 --heads 4 \
        --kv-heads 2 --ffn 128 --vocab 256 --seed 7 >"$DIR/mkmodel-$arch.log" 2>&1 ||
        { echo "mkmodel --arch $arch failed"; exit 1; }
done
status=0
for run in "llama 1 1" "llama 2 2" "gemma3 2 1" "llama 2 2 --dtype bf16" \
    "llama 1 1 --quantize int8" "gemma3 2 1 --quantize int8"; do
    read -r -a words <<<"$run"
    set -- "${words[@]}"
    name="$1-$2x$3${5:+-$5}"
    model=$1 tp=$2 pp=$3
    shift 3
    for dev in cpu fake; do
        timeout 120 "$BIN" generate --model "$DIR/$model" --tp "$tp" --pp "$pp" --device "$dev" \
            "$@" --prompt-ids 1,5,9,13 --max-tokens 12 >"$DIR/out-$dev-$name.txt" \
            2>"$DIR/gen-$dev-$name.log" ||
            { echo "generate --device $dev $name failed:"; tail -5 "$DIR/gen-$dev-$name.log"; exit 1; }
    done
    cpu=$(head -1 "$DIR/out-cpu-$name.txt") fake=$(head -1 "$DIR/out-fake-$name.txt")
    echo "$name: cpu [$cpu] fake [$fake]"
    if [ -z "$cpu" ] || [ "$cpu" != "$fake" ]; then
        echo "$name: the fake device's tokens differ from the cpu's"
        status=1
    fi
done
exit $status
