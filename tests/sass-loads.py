#!/usr/bin/env python3
"""The decode step's streaming kernels keep their loads in flight, read from their machine
code (issue #24).

    sass-loads.py --ptxas PTXAS --fetch FETCH_NVDISASM FILE.ptx...

The decode GEMV (gemv_kernel in kernels/cuda/cuda-matmul.cu, every element type) streams
weights at HBM rate only with several 16-byte loads of each lane in flight: an H200 SM
needs ~25 KB in flight, and a warp's load is 512 bytes. Its loop of load-then-use,
unrolled 4 times, compiled to one load in flight (each load's products came before the
next load was issued), which neither the PTX nor ptxas -v shows: only the SASS does (read
2026-12-05). gemv_stream now keeps GEMV_PRE loads in flight by hand. The one-block
kernels of a batch-1 step (rmsnorm, add_rmsnorm, the sampler) load 8 elements a thread
before using the first (strided_rounds, cuda-vec.h); rmsnorm's sum of squares compiled
to 2 or 3 in flight (8 predicates, where an SM has 7) until whole rounds went unbounded.

This assembles the PTX of the CMake object library gang_kernels_ptx for sm_90 with the
toolkit's ptxas, disassembles it with nvdisasm (not in the toolkit here: FETCH_NVDISASM,
scripts/fetch-nvdisasm.sh, prints its path) and, in every instance of the kernels of
KERNELS, finds the streaming loops (innermost loops with the kernel's kind of global load
and no barrier). For each such load it counts the other such loads issued before the
first instruction that reads the loaded registers, following the loop around its back
edge: that is how many loads are in flight behind it. The GEMV needs at least 3
(GEMV_PRE - 1) behind every weight load; the others at least 7 (NORM_U / SAMPLE_U - 1)
behind the first load of some round in every streaming loop (a loop also holds the
bounded last round). Each instance's counts are printed. Exit 77 (SKIP) when nvdisasm
cannot be had.
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kernel_report  # noqa: E402

LOAD16 = re.compile(r"\bLDG\.E\.128\.CONSTANT\b")  # the GEMV's weights (__ldg); x's are plain
LOAD32 = re.compile(r"\bLDG\.E(?:\.CONSTANT)?$")      # one float
# mangled prefix -> (instances, load, loads behind, rule): "every" load of each streaming
# loop, or "some" load of each (its whole rounds; the bounded last round is beside them)
KERNELS = {"_Z11gemv_kernel": (3, LOAD16, 3, "every"),
           "_Z14rmsnorm_kernel": (1, LOAD32, 7, "some"),
           "_Z18add_rmsnorm_kernel": (1, LOAD32, 7, "some"),
           "_Z13sample_kernel": (1, LOAD32, 7, "some"),
           "_Z21attention_step_kernel": (3, LOAD16, 3, "some")}
SKIP = 77
LABEL = re.compile(r"^(\.L_x_\d+):")
BRANCH = re.compile(r"\bBRA\b.*`\((\.L_x_\d+)\)")
INSN = re.compile(r"/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)\s*(.*?)\s*;")
REG = re.compile(r"\bR(\d+)(?:\.(64|128))?\b")


def functions(sass):
    """(mangled name, lines) of every function of nvdisasm's output."""
    name, body = None, []
    for line in sass.splitlines():
        m = re.match(r"^\.text\.(\S+):", line)
        if m:
            if name:
                yield name, body
            name, body = m.group(1), []
        elif name:
            body.append(line)
    if name:
        yield name, body


def regs(text):
    """The registers an operand text names (R4.64: R4 and R5)."""
    out = set()
    for m in REG.finditer(text):
        width = {"64": 2, "128": 4}.get(m.group(2) or "", 1)
        out.update(range(int(m.group(1)), int(m.group(1)) + width))
    return out


def parse(lines):
    """The instructions (index of line, opcode, destination registers, source registers)
    and the labels (name -> index of the next instruction)."""
    insns, labels = [], {}
    for line in lines:
        m = LABEL.match(line.strip())
        if m:
            labels[m.group(1)] = len(insns)
            continue
        m = INSN.search(line)
        if not m:
            continue
        op, ops = m.group(1), m.group(2)
        parts = ops.split(",", 1)
        if op.startswith(("ST", "BRA", "BAR", "EXIT", "RED", "ATOM")):
            dst, src = set(), regs(ops)
        else:
            dst = regs(parts[0])
            if op.startswith("LDG.E.128"):
                dst = {min(dst) + i for i in range(4)} if dst else dst
            src = regs(parts[1]) if len(parts) > 1 else set()
        insns.append((op, dst, src, line))
    return insns, labels


def loops(insns, labels):
    """(first, last) instruction indices of every loop: a branch back to an earlier label."""
    out = []
    for i, (op, _d, _s, line) in enumerate(insns):
        m = BRANCH.search(line)
        if op.startswith("BRA") and m and labels.get(m.group(1), i + 1) <= i:
            out.append((labels[m.group(1)], i))
    return out


def behind(insns, first, last, at, load):
    """The loads (opcode pattern load) issued after the one at `at` before its registers
    are first read, walking the loop [first, last] around its back edge (None: never read
    in the loop)."""
    want, n = insns[at][1], 0
    order = list(range(at + 1, last + 1)) + list(range(first, at))
    for i in order:
        op, _dst, src, _line = insns[i]
        if src & want:
            return n
        if load.search(op):
            n += 1
    return None


def check(name, lines, rule):
    """(counts of loads behind each streaming load, per loop; problems) of one instance."""
    _n, load, need, how = rule
    insns, labels = parse(lines)
    found = loops(insns, labels)
    groups = {}  # the smallest loop around each load (one without a barrier) -> its loads
    for at, (op, *_r) in enumerate(insns):
        around = [(f, l_) for f, l_ in found if f <= at <= l_ and load.search(op)]
        if not around:
            continue
        first, last = min(around, key=lambda fl: fl[1] - fl[0])
        if not any(o.startswith("BAR") for o, *_x in insns[first:last + 1]):
            groups.setdefault((first, last), []).append(at)
    per_loop, bad = [], []
    for (first, last), ats in sorted(groups.items()):
        per_loop.append([behind(insns, first, last, at, load) for at in ats])
    if not per_loop:
        bad.append("%s: no streaming loop with its loads found" % name)
    for counts in per_loop:
        c = [-1 if x is None else x for x in counts]
        if (min(c) if how == "every" else max(c)) < need:
            bad.append("%s: a loop's loads have %s loads behind them before their use (want "
                       ">= %d, %s load): the thread waits on each load"
                       % (name, counts, need, how))
    return per_loop, bad


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ptxas", required=True)
    ap.add_argument("--fetch", required=True, help="scripts/fetch-nvdisasm.sh")
    ap.add_argument("ptx", nargs="+")
    args = ap.parse_args()
    got = subprocess.run(["bash", args.fetch], capture_output=True, text=True)
    nvdisasm = got.stdout.strip().splitlines()[-1] if got.stdout.strip() else ""
    if got.returncode != 0 or not os.access(nvdisasm, os.X_OK):
        print("SKIP: no nvdisasm to read the SASS with: %s" % got.stderr.strip()[-400:])
        return SKIP
    seen, bad = {k: 0 for k in KERNELS}, []
    with tempfile.TemporaryDirectory() as tmp:
        for path in args.ptx:
            with open(path, encoding="utf-8") as f:
                text = f.read()
            if not any(k in text for k in KERNELS):
                continue
            cubin = os.path.join(tmp, os.path.basename(path) + ".cubin")
            subprocess.run([args.ptxas, "-arch=sm_90", "-o", cubin, path], check=True)
            sass = subprocess.run([nvdisasm, "-c", cubin], check=True, capture_output=True,
                                  text=True).stdout
            for name, lines in functions(sass):
                key = next((k for k in KERNELS if name.startswith(k)), None)
                if key is None:
                    continue
                seen[key] += 1
                per_loop, problems = check(name, lines, KERNELS[key])
                print("%-56s loads behind each, per loop: %s" % (name[:56], per_loop))
                bad += problems
    return kernel_report.finish(
        seen, {k: v[0] for k, v in KERNELS.items()}, "SASS", bad,
        "the decode GEMV keeps >= 3 more 16-byte loads in flight behind each one; the step "
        "attention its 4 row loads a round; the norms and the sampler 8 loads a round")


if __name__ == "__main__":
    sys.exit(main())
