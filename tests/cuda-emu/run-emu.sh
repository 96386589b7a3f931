#!/usr/bin/env bash
# The GPU tests on the CUDA emulator (tests/cuda-emu/, docs/gpu.md "The CUDA emulator"):
# configures BUILD_DIR from SOURCE_DIR with GANGLION_CUDA_EMU=ON, builds what the tests
# need (target cuda-emu-tests), runs the tests labelled cuda-emu there, then checks that
# every kernel of kernels/cuda ran in them (kernel-coverage.py, on what the emulator
# counted under GANG_EMU_STATS).
#
#   run-emu.sh SOURCE_DIR BUILD_DIR [WERROR=ON|OFF]
#
# Run by `make cuda-emu` (BUILD_DIR build-emu) and by the ctest cuda-emu of the main build
# (BUILD_DIR inside it), so `make test` runs it. The build's output goes to
# BUILD_DIR/emu-build.log, printed (its tail) when the build fails.
set -euo pipefail
if [ $# -lt 2 ] || [ $# -gt 3 ]; then
    echo "usage: run-emu.sh SOURCE_DIR BUILD_DIR [WERROR=ON|OFF]" >&2
    exit 2
fi
src=$(cd "$1" && pwd)
werror=${3:-ON}
mkdir -p "$2"
build=$(cd "$2" && pwd) # absolute: the tests run in folders of their own
log=$build/emu-build.log
t0=$SECONDS
if ! { cmake -S "$src" -B "$build" -DGANGLION_CUDA_EMU=ON -DGANGLION_FUZZ=OFF \
        -DGANGLION_WERROR="$werror" -DCMAKE_BUILD_TYPE=RelWithDebInfo &&
        cmake --build "$build" -j "${JOBS:-2}" --target cuda-emu-tests; } >"$log" 2>&1; then
    tail -n 60 "$log"
    echo "run-emu.sh: the emulator build failed (whole log: $log)" >&2
    exit 1
fi
echo "run-emu.sh: built in $((SECONDS - t0)) s"
runs=$build/emu-kernel-runs.txt
rm -f "$runs"
cd "$build"
# Two at a time (the emulator runs a process's kernels one at a time): the tests whose
# deadlines or heartbeats are measured are RUN_SERIAL (cmake/cuda.cmake), so they run alone.
GANG_EMU_STATS=$runs ctest --output-on-failure -L '^cuda-emu$' -j "${JOBS:-2}"
python3 "$src/tests/cuda-emu/kernel-coverage.py" "$src/kernels/cuda" "$runs"
