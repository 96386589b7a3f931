#!/usr/bin/env bash
# The workers on the fake device (kernels/fake/): `ganglion generate` runs a local gang of
# worker processes; with --device fake each worker moves its shard to device memory the
# host cannot read and runs the engine there (TP / PP staged through host memory over the
# socket backend). The greedy tokens must equal --device cpu's, on 1x1 and TP 2 x PP 2.
#
#   fake-generate.sh GANGLION WORKDIR
set -u
BIN=$1 DIR=$2
rm -rf "$DIR" && mkdir -p "$DIR" || exit 1
"$BIN" mkmodel --out "$DIR/model" --layers 3 --hidden 64 --heads 4 --kv-heads 2 --ffn 128 \
    --vocab 256 --seed 7 >"$DIR/mkmodel.log" 2>&1 || { echo "mkmodel failed"; exit 1; }
status=0
for layout in "1 1" "2 2"; do
    set -- $layout
    for dev in cpu fake; do
        timeout 120 "$BIN" generate --model "$DIR/model" --tp "$1" --pp "$2" --device "$dev" \
            --prompt-ids 1,5,9,13 --max-tokens 12 >"$DIR/out-$dev-$1x$2.txt" \
            2>"$DIR/gen-$dev-$1x$2.log" || { echo "generate --device $dev $1x$2 failed:"; \
            tail -5 "$DIR/gen-$dev-$1x$2.log"; exit 1; }
    done
    cpu=$(head -1 "$DIR/out-cpu-$1x$2.txt") fake=$(head -1 "$DIR/out-fake-$1x$2.txt")
    echo "tp $1 x pp $2: cpu [$cpu] fake [$fake]"
    if [ -z "$cpu" ] || [ "$cpu" != "$fake" ]; then
        echo "tp $1 x pp $2: the fake device's tokens differ from the cpu's"
        status=1
    fi
done
exit $status
