#!/usr/bin/env bash
# The mixture-of-experts step of the device check (issue #25; bench/gpu-check.sh): a tiny
# Qwen3-MoE model (`ganglion mkmodel --moe qwen3`, 16 experts, top-4) and a Qwen2-MoE one
# (a shared expert, a dense first layer) decoded greedily with `ganglion generate` on
# --device cuda --backend socket at EP x TP 1x1 and 2x2 (two ranks on the one GPU, the
# experts split, the all-to-alls over sockets: --ep > 1 over nccl is refused) must give the tokens of --device cpu 1x1. Prints one JSON line
# per case and exits 0 when all agree, 1 otherwise.
#
#   bash bench/gpu-moe-check.sh BIN WORKDIR
set -u
BIN=$1
WORK=$2
mkdir -p "$WORK"
PROMPT=5,9,77,31,2,100,45,13,200,7
common=(--layers 3 --hidden 128 --heads 4 --kv-heads 2 --vocab 512 --seed 25)
rc=0
for fam in qwen3 qwen2; do
    dir=$WORK/$fam-moe
    extra=(--arch qwen3 --moe qwen3 --head-dim 32 --ffn 128 --moe-ffn 64 --experts 16 --top-k 4
        --norm-topk)
    [ $fam = qwen2 ] && extra=(--arch qwen2 --moe qwen2 --ffn 128 --moe-ffn 32 --shared-ffn 64
        --experts 16 --top-k 4 --dense-layers 1)
    "$BIN" mkmodel --out "$dir" "${common[@]}" "${extra[@]}" >/dev/null || exit 1
    want=$("$BIN" generate --model "$dir" --device cpu --prompt-ids $PROMPT --max-tokens 12 \
        2>/dev/null | grep -o '"tokens":\[[0-9,]*\]')
    for ep in 1 2; do
        got=$("$BIN" generate --model "$dir" --device cuda --backend socket --tp $ep --ep $ep \
            --nproc-per-node $ep --prompt-ids $PROMPT --max-tokens 12 2>"$WORK/$fam-$ep.err" |
            grep -o '"tokens":\[[0-9,]*\]')
        ok=false
        [ -n "$want" ] && [ "$got" = "$want" ] && ok=true
        [ $ok = true ] || rc=1
        printf '{"measure":"moe_cuda","family":"%s","ep":%d,"tp":%d,"match_cpu":%s,"cpu":"%s","cuda":"%s"}\n' \
            "$fam" $ep $ep $ok "${want#\"tokens\":}" "${got#\"tokens\":}"
        [ $ok = true ] || tail -5 "$WORK/$fam-$ep.err"
    done
done
exit $rc
