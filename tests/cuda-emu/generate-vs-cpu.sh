#!/usr/bin/env bash
# A model served on the CUDA backend, on the CUDA emulator, against the CPU backend on the
# same model: `ganglion generate` greedy tokens must be equal (ctests gguf-cuda-emu and
# gemma3-cuda-emu).
#
#   generate-vs-cpu.sh GANGLION gguf [FILE]
#       a GGUF file (default: the SmolLM2 Q4_1 file; skips, 77, without it) with
#       --dtype auto: the file's blocks stay blocks on the device (cuda-qmatmul.cu's GEMV
#       for decode, dequantized bands through cuBLASLt for the prompt). The CPU side runs
#       --dtype f32: the blocks dequantized to f32, the product the CUDA kernels compute (x
#       in f32 times the exact weight values). Not the CPU's own block path: it quantizes x
#       to 8 bits per 32, as llama.cpp does, which moved a logprob by 0.09 on this prompt
#       and flipped a near tie (margins 0.03 / 0.015) at the sixth token; against the f32
#       path the logprobs agree to 1e-6.
#   generate-vs-cpu.sh GANGLION gemma3 WORKDIR
#       a tiny Gemma 3 model in f32 written by `ganglion mkmodel` (GeGLU, sliding-window
#       layers, q/k norms): the kernels only this family uses (gelu_mul) on the device.
set -uo pipefail
if [ $# -lt 2 ]; then
    echo "usage: generate-vs-cpu.sh GANGLION gguf [FILE] | gemma3 WORKDIR" >&2
    exit 2
fi
bin=$1
case $2 in
gguf)
    model=${3:-${GANG_TEST_GGUF:-/var/cache/ganglion/smollm2-135m-instruct-q4_1.gguf}}
    if [ ! -f "$model" ]; then
        echo "SKIP: $model is absent (scripts/fetch-reference.sh smollm2-gguf)"
        exit 77
    fi
    prompt=1,504,3303,314,260,2114,28
    cpu_flags=(--dtype f32)
    cuda_flags=(--dtype auto)
    ;;
gemma3)
    model=${3:?WORKDIR}/gemma3-tiny
    rm -rf "$model"
    "$bin" mkmodel --out "$model" --arch gemma3 --layers 3 --hidden 64 --heads 4 \
        --kv-heads 2 --head-dim 16 --ffn 128 --vocab 256 --dtype f32 --seed 3 >/dev/null ||
        exit 1
    prompt=5,9,77,31,2,100,45,13,200,7
    cpu_flags=()
    cuda_flags=()
    ;;
*)
    echo "generate-vs-cpu.sh: unknown model kind '$2' (gguf, gemma3)" >&2
    exit 2
    ;;
esac
run() {
    "$bin" generate --model "$model" --prompt-ids $prompt --max-tokens 8 "$@" 2>&1 |
        grep -o '"tokens":\[[0-9,]*\]' | head -n 1
}
want=$(run --device cpu "${cpu_flags[@]}")
got=$(run --device cuda --gpu-memory-mb 1024 "${cuda_flags[@]}")
echo "cpu:  $want"
echo "cuda: $got"
if [ -z "$want" ] || [ "$want" != "$got" ]; then
    echo "FAIL: the CUDA backend's tokens differ from the CPU's (or one run printed none)"
    exit 1
fi
echo PASS
