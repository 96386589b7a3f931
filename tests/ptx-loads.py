#!/usr/bin/env python3
"""The decode step's streaming kernels load 16 bytes at a time (issue #24).

    ptx-loads.py FILE.ptx...

The decode GEMV (gemv_kernel, every element type) streams the weights and the step
attention (attention_step_kernel, every KV type) the KV rows with one 16-byte load per lane
and chunk (vec_load16, kernels/cuda/cuda-vec.h). A C++ detail can turn each into sixteen
byte loads with nothing else changed (registers, spills, results): 08e3041 did, for a day,
and ptxas -v did not show it. This reads the PTX nvcc makes of those kernels (the CMake
object library gang_kernels_ptx) and fails when an instance of either has a byte load
(ld.global[.nc].u8 / .s8) or fewer vector loads than its design's minimum: the GEMV 8 (4
issued early, 4 in its streaming loop, gemv_stream), the attention 4 (the K and V rows of
STEP_U = 2 keys). Each instance's counts are printed; an instance missing from the PTX fails too.

And the GEMV's reads of the staged x: a lane multiplies the 8 (16 for int8) consecutive
elements its weight load covers, so stored in order the warp's shared loads hit 4 banks of
32 (an 8- or 16-way conflict). vec_swz stores each run transposed, so a lane's elements
are 32 words apart: every constant offset of a GEMV instance's ld.shared.f32 must be a
multiple of 128 bytes (in-order staging gives +4 .. +28).
"""
import os
import re
import sys

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kernel_report  # noqa: E402

# kernel name (its mangled identifier) -> (instances expected, minimum vector loads)
KERNELS = {"11gemv_kernel": (3, 8), "21attention_step_kernel": (3, 4)}
BYTE_LOAD = re.compile(r"\bld\.global(?:\.nc)?\.[us]8\b")
SHARED_OFFSET = re.compile(r"\bld\.shared\.f32\s+%f\d+,\s*\[%r\w*\d+\+(-?\d+)\]")
VECTOR_LOAD = re.compile(r"\bld\.global(?:\.nc)?(?:\.L2::\w+)?\.v[24]\.")


def entries(text):
    """(mangled name, body) of every .entry of a PTX file."""
    for m in re.finditer(r"\.entry (\S+)\(", text):
        end = text.find("\n}\n", m.end())
        yield m.group(1), text[m.end():end if end >= 0 else len(text)]


def main():
    if len(sys.argv) < 2:
        print("usage: ptx-loads.py FILE.ptx...", file=sys.stderr)
        return 2
    seen = {k: 0 for k in KERNELS}
    bad = []
    for path in sys.argv[1:]:
        with open(path, encoding="utf-8") as f:
            text = f.read()
        for name, body in entries(text):
            key = next((k for k in KERNELS if name.startswith("_Z" + k)), None)
            if key is None:
                continue
            seen[key] += 1
            b, v = len(BYTE_LOAD.findall(body)), len(VECTOR_LOAD.findall(body))
            print("%-60s byte loads %3d, 16-byte loads %3d" % (name, b, v))
            if b > 0 or v < KERNELS[key][1]:
                bad.append("%s: %d byte loads, %d vector loads (want 0 and >= %d)"
                           % (name, b, v, KERNELS[key][1]))
            offsets = [int(o) for o in SHARED_OFFSET.findall(body)]
            odd = sorted({o for o in offsets if o % 128 != 0})
            if key == "11gemv_kernel" and (not offsets or odd):
                bad.append("%s: x read from shared memory at offsets %s (of %d): not 32 words "
                           "apart, so the warp's loads conflict in the banks"
                           % (name, odd[:8], len(offsets)))
    return kernel_report.finish(
        seen, {k: v[0] for k, v in KERNELS.items()}, "PTX", bad,
        "the GEMV and the step attention load 16 bytes at a time, the GEMV's x without bank "
        "conflicts")


if __name__ == "__main__":
    sys.exit(main())
