#!/usr/bin/env bash
# A GGUF model served on the CUDA backend, on the CUDA emulator (ctest gguf-cuda-emu):
# `ganglion generate --device cuda --dtype auto` keeps the file's blocks on the device
# (cuda-qmatmul.cu's GEMV for decode, dequantized bands through cuBLASLt for the prompt)
# and must give the tokens of --device cpu --dtype f32 on the same file: the blocks
# dequantized to f32, the product the CUDA kernels compute (x in f32 times the exact weight
# values). Not the CPU's own block path: it quantizes x to 8 bits per 32, as llama.cpp
# does, which moved a logprob by 0.09 on this prompt and flipped a near tie (margins 0.03 /
# 0.015) at the sixth token; against the f32 path the logprobs agree to 1e-6. Skips (77)
# without the file.
#
#   gguf-generate.sh GANGLION [FILE]
set -uo pipefail
bin=$1
file=${2:-${GANG_TEST_GGUF:-/var/cache/ganglion/smollm2-135m-instruct-q4_1.gguf}}
if [ ! -f "$file" ]; then
    echo "SKIP: $file is absent (scripts/fetch-reference.sh smollm2-gguf)"
    exit 77
fi
prompt=1,504,3303,314,260,2114,28
run() {
    "$bin" generate --model "$file" --prompt-ids $prompt --max-tokens 6 "$@" 2>&1 |
        grep -o '"tokens":\[[0-9,]*\]' | head -n 1
}
want=$(run --device cpu --dtype f32)
got=$(run --device cuda --dtype auto --gpu-memory-mb 1024)
echo "cpu (f32): $want"
echo "cuda:      $got"
if [ -z "$want" ] || [ "$want" != "$got" ]; then
    echo "FAIL: the CUDA backend's tokens differ from the CPU's f32 (or one run printed none)"
    exit 1
fi
echo PASS
