#!/usr/bin/env bash
# Issue #27: ganglion on a GGUF file's own blocks against llama.cpp on the same file, in
# the same run: batch-1 decode (llama-bench -p 0 -n N, with and without its weight
# repacking, vs `ganglion bench decode --dtypes auto --batch 1`), batch 8 and 32
# (llama-batched-bench without repacking, vs ganglion's), and each process's peak RSS
# (/usr/bin/time). One line of JSON per point on stdout, the tools' own output in the work
# dir.
#
#   bash bench/gguf-vs-llama.sh BIN FILE.gguf [FILE.gguf ...]
#
# Environment: LLAMA_BIN (default /var/cache/ganglion/llama.cpp-0.3.36/bin, from
# bench/build-llama-cpp.sh), THREADS (2), TOKENS (32 generated), PROMPT (32), REPS (3:
# llama-bench's -r and bench decode's --iters; medians are reported), BATCHES (ganglion's,
# 1,8,32). Keep runs short:
# the machine is shared.
set -euo pipefail

BIN=${1:?usage: gguf-vs-llama.sh BIN FILE.gguf...}
shift
LLAMA_BIN=${LLAMA_BIN:-/var/cache/ganglion/llama.cpp-0.3.36/bin}
THREADS=${THREADS:-2}
TOKENS=${TOKENS:-32}
PROMPT=${PROMPT:-32}
REPS=${REPS:-3}
BATCHES=${BATCHES:-1,8,32}
WORK=$(mktemp -d -t gguf-vs-llama.XXXXXX)
echo "# tools' output in $WORK" >&2

rss_kib() { # the max RSS line /usr/bin/time -f %M wrote last into $1
    tail -1 "$1"
}

for f in "$@"; do
    name=$(basename "$f" .gguf)
    # llama.cpp, batch 1: tokens/s of text generation (tg), median of REPS, twice: with its
    # weight repacking (the default; on a CPU with AMX it runs the AMX int8 tiles) and
    # without (AVX-512 / AVX2 dot products on the file's blocks, as ganglion does).
    for repack in 1 0; do
        eng=llama.cpp; [ "$repack" = 0 ] && eng=llama.cpp-norepack
        /usr/bin/time -f '%M' -o "$WORK/$name.llama-bench.$repack.rss" \
            "$LLAMA_BIN/llama-bench" -m "$f" -p 0 -n "$TOKENS" -t "$THREADS" -r "$REPS" \
            --repack "$repack" -o json \
            >"$WORK/$name.llama-bench.$repack.json" 2>"$WORK/$name.llama-bench.$repack.err"
        tg=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))[0]["avg_ts"])' \
            "$WORK/$name.llama-bench.$repack.json")
        echo "{\"file\":\"$name\",\"engine\":\"$eng\",\"batch\":1,\"decode_tok_s\":$tg,\"peak_rss_kib\":$(rss_kib "$WORK/$name.llama-bench.$repack.rss")}"
    done
    # llama.cpp at batch > 1: llama-batched-bench's S_TG (PROMPT tokens per sequence, TOKENS
    # generated). Only without repacking: with it, this build (llama-cpp-python 0.3.36's
    # sources) crashes at start on this CPU (AMX), as llama-server does (2026-12-03).
    npl=$(echo "$BATCHES" | tr ',' '\n' | awk '$1 > 1' | paste -sd, -)
    if [ -n "$npl" ]; then
        LLAMA_ARG_REPACK=false "$LLAMA_BIN/llama-batched-bench" -m "$f" -c 8192 -b 2048 \
            -ub 512 -npp "$PROMPT" -ntg "$TOKENS" -npl "$npl" -t "$THREADS" \
            --output-format jsonl >"$WORK/$name.batched.jsonl" 2>"$WORK/$name.batched.err"
        python3 - "$WORK/$name.batched.jsonl" "$name" <<'EOF2'
import json, sys
for line in open(sys.argv[1]):
    if line.startswith("{"):
        d = json.loads(line)
        print(json.dumps({"file": sys.argv[2], "engine": "llama.cpp-norepack",
                          "batch": d["pl"], "decode_tok_s": d["speed_tg"]}))
EOF2
    fi
    # ganglion: the file's own blocks (--dtypes auto), batch 1, 8, 32.
    /usr/bin/time -f '%M' -o "$WORK/$name.ganglion.rss" \
        "$BIN" bench decode --model "$f" --dtypes auto --batch "$BATCHES" --prompt "$PROMPT" \
        --tokens "$TOKENS" --iters "$REPS" --no-peer --bw-mib 64 --bw-passes 1 \
        >"$WORK/$name.ganglion.jsonl" 2>"$WORK/$name.ganglion.err"
    python3 - "$WORK/$name.ganglion.jsonl" "$name" "$(rss_kib "$WORK/$name.ganglion.rss")" <<'EOF'
import json, sys
for line in open(sys.argv[1]):
    if not line.startswith("{"):
        continue
    d = json.loads(line)
    if d.get("storage") == "auto" and "decode_tok_s" in d:
        print(json.dumps({"file": sys.argv[2], "engine": "ganglion", "batch": d["batch"],
                          "decode_tok_s": d["decode_tok_s"], "weight_bytes": d["weight_bytes"],
                          "peak_rss_kib": int(sys.argv[3])}))
EOF
done
