#!/usr/bin/env python3
"""Every CUDA kernel of the backend runs in the emulator's tests (tests/cuda-emu/).

    kernel-coverage.py KERNELS_DIR RUNS_FILE

KERNELS_DIR: kernels/cuda (its .cu files define the kernels: `__global__ [static] void
NAME`); RUNS_FILE: what the emulator appended under GANG_EMU_STATS while the tests ran,
one "NAME[<T>] COUNT" line per kernel and process. Prints each kernel's launches; exits 1
naming the kernels that never ran (a kernel no test reaches is one the first device run
would be the first to execute), 2 on a usage error.
"""
import glob
import os
import re
import sys

GLOBAL = re.compile(r"__global__\s+(?:static\s+)?void\s+"
                    r"(?:__launch_bounds__\([^)]*\)\s+)?(\w+)\s*\(")


def main():
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    kernels = set()
    for path in sorted(glob.glob(os.path.join(sys.argv[1], "*.cu"))):
        with open(path) as f:
            kernels.update(GLOBAL.findall(f.read()))
    if not kernels:
        print("kernel-coverage: no __global__ kernel found in %s" % sys.argv[1], file=sys.stderr)
        return 2
    runs = {}
    with open(sys.argv[2]) as f:
        for line in f:
            name, count = line.split()
            name = name.split("<")[0]
            runs[name] = runs.get(name, 0) + int(count)
    missing = sorted(k for k in kernels if runs.get(k, 0) == 0)
    for k in sorted(kernels):
        print("kernel-coverage: %-28s %8d launches" % (k, runs.get(k, 0)))
    if missing:
        print("kernel-coverage: FAIL: never run by the emulator's tests: %s" % ", ".join(missing))
        return 1
    print("kernel-coverage: every one of the %d kernels ran" % len(kernels))
    return 0


if __name__ == "__main__":
    sys.exit(main())
