#!/usr/bin/env bash
# The mixture-of-experts step of the device check (issue #25; bench/gpu-check.sh): a tiny
# Qwen3-MoE model (`ganglion mkmodel --moe qwen3`, 16 experts, top-4) and a Qwen2-MoE one
# (a shared expert, a dense first layer) decoded greedily with `ganglion generate` on
# --device cuda must give the tokens of --device cpu 1x1:
#   socket  EP x TP 1x1 and 2x2 (two ranks on the one GPU, the all-to-alls staged on host)
#   nccl    EP 2 = TP 2 and EP 2 x TP 1 (attention replicated), the all-to-alls over NCCL on
#           device buffers: one GPU per rank, since NCCL refuses two ranks of a communicator
#           on one GPU; with fewer than 2 GPUs these cases print "run":false with the reason
#           (not a skip of the step: the socket cases still decide it), qwen3 only (budget);
#           on the CUDA emulator they run with GANG_EMU_DEVICES=2, each rank a process.
# Prints one JSON line per case and exits 0 when every case run agrees, 1 otherwise.
#
#   bash bench/gpu-moe-check.sh BIN WORKDIR
set -u
BIN=$1
WORK=$2
mkdir -p "$WORK"
PROMPT=5,9,77,31,2,100,45,13,200,7
# The GPUs: nvidia-smi's, or on the CUDA emulator (tests/cuda-emu/) its device count.
GPUS=${GANG_EMU_DEVICES:-$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')}
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
    cases="socket:1:1 socket:2:2"
    [ $fam = qwen3 ] && cases="$cases nccl:2:2 nccl:2:1"
    for c in $cases; do
        IFS=: read -r be ep tp <<<"$c"
        if [ "$be" = nccl ] && [ "$GPUS" -lt 2 ]; then
            printf '{"measure":"moe_cuda","family":"%s","backend":"nccl","ep":%d,"tp":%d,"run":false,"why":"%d GPU: NCCL needs one GPU per rank"}\n' \
                "$fam" "$ep" "$tp" "$GPUS"
            continue
        fi
        share=()
        [ "$be" = socket ] && share=(--share-gpus) # two ranks on one GPU over sockets
        got=$("$BIN" generate --model "$dir" --device cuda --backend "$be" --tp "$tp" --ep "$ep" \
            --nproc-per-node "$ep" "${share[@]}" --prompt-ids $PROMPT --max-tokens 12 \
            2>"$WORK/$fam-$be-$ep-$tp.err" | grep -o '"tokens":\[[0-9,]*\]')
        ok=false
        [ -n "$want" ] && [ "$got" = "$want" ] && ok=true
        [ $ok = true ] || rc=1
        printf '{"measure":"moe_cuda","family":"%s","backend":"%s","ep":%d,"tp":%d,"match_cpu":%s,"cpu":"%s","cuda":"%s"}\n' \
            "$fam" "$be" "$ep" "$tp" $ok "${want#\"tokens\":}" "${got#\"tokens\":}"
        [ $ok = true ] || tail -5 "$WORK/$fam-$be-$ep-$tp.err"
    done
done
exit $rc
