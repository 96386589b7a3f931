#!/bin/sh
# bench/gpu-reference.py on the CPU with the reference venv (ctest gpu-reference-cpu).
#   gpu-reference-cpu.sh SOURCE_DIR GANGLION WORKDIR
src=$1 bin=$2 work=$3
py=${GANGLION_REF_VENV:-/opt/ganglion-ref-venv}/bin/python3
if [ ! -x "$py" ]; then
    echo "SKIP: no reference venv at $py (scripts/fetch-reference.sh makes it)"
    exit 77
fi
rm -rf "$work"
exec "$py" "$src/bench/gpu-reference.py" --bin "$bin" --dir "$work" --device cpu --shapes tiny \
    --layouts 1x1,tp2
