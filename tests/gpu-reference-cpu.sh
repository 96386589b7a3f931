#!/bin/sh
# bench/gpu-reference.py on the CPU with the reference venv (ctest gpu-reference-cpu), or,
# with DEVICE cuda, ganglion on the CUDA emulator against transformers on the CPU (ctest
# gpu-reference-emu of the emulator's build, tests/cuda-emu/: serve --device cuda, 1x1 and
# TP=2 as two workers sharing the emulated GPU, 1x1 with --cuda-pdl, 1x1 with
# --gpu-pool-split, then TP=2 over NCCL on two).
#   gpu-reference-cpu.sh SOURCE_DIR GANGLION WORKDIR [cpu|cuda]
src=$1 bin=$2 work=$3 device=${4:-cpu}
py=${GANGLION_REF_VENV:-/opt/ganglion-ref-venv}/bin/python3
if [ ! -x "$py" ]; then
    echo "SKIP: no reference venv at $py (scripts/fetch-reference.sh makes it)"
    exit 77
fi
rm -rf "$work"
if [ "$device" = cuda ]; then
    "$py" "$src/bench/gpu-reference.py" --bin "$bin" --dir "$work" --device cuda \
        --ref-device cpu --gpu-memory-mb 512 --shapes tiny --layouts 1x1,tp2,1x1-pdl,1x1-split || exit 1
    # TP=2 over NCCL: two worker processes, one emulated GPU each (the NCCL emulator
    # between processes)
    GANG_EMU_DEVICES=2 exec "$py" "$src/bench/gpu-reference.py" --bin "$bin" --dir "$work/nccl" \
        --device cuda --ref-device cpu --gpu-memory-mb 512 --shapes tiny --layouts tp2-nccl
fi
exec "$py" "$src/bench/gpu-reference.py" --bin "$bin" --dir "$work" --device cpu --shapes tiny \
    --layouts 1x1,tp2
