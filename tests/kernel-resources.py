#!/usr/bin/env python3
"""Every kernel launch fits the resources of one sm_90 multiprocessor (issue #24).

    kernel-resources.py --ptxas PTXAS --src KERNELS_DIR FILE.ptx...
    kernel-resources.py --selftest

A launch whose block needs more registers than a multiprocessor has (registers per thread,
rounded up to the allocation unit, times the block's warps, over 65,536), more threads than
the kernel's __launch_bounds__ allow, or more than 1,024 threads, fails on the device with
"too many resources requested for launch" (or an invalid configuration) at its first call;
the CUDA emulator and the fake device run it all the same (registers are not theirs to
count). So this assembles the PTX nvcc makes of the kernels (the CMake object library
gang_kernels_ptx) for sm_90 with the toolkit's ptxas -v, reads each kernel instance's
registers, spills and static shared memory, reads every launch of KERNELS_DIR's .cu files
(`kernel<<<grid, block, shared, stream>>>` and the programmatic-dependent launches of
pdl_config / cudaLaunchKernelEx) with its block size evaluated from its file's #defines
(over those of the .h files), and fails (one FAIL line each) on:

  * a launch over the limits above, or with a block size or __launch_bounds__ this cannot
    evaluate;
  * static plus dynamic shared memory over the 48 KiB a block gets without opting in;
  * a kernel instance that spills registers to local memory (the decode step's kernels are
    designed without; a spill is a slow load on every pass of a loop);
  * fewer resident blocks per multiprocessor than a __launch_bounds__ minimum asks for;
  * a kernel of the PTX that no launch names, or a launch of a kernel the PTX lacks (this
    reader would have lost track of one).

Each launch's resources and resident blocks per multiprocessor are printed, for the device
run's profile to be read against. --selftest runs the check on small texts with a known
answer (three clean, eight faults).
"""
import argparse
import glob
import os
import re
import subprocess
import sys

# sm_90 (H100, H200): the CUDA programming guide's table of compute capability 9.0.
REGS_PER_SM = 65536
REGS_PER_BLOCK = 65536
REG_UNIT = 256  # registers are allocated per warp in units of 256
THREADS_PER_BLOCK = 1024
THREADS_PER_SM = 2048
BLOCKS_PER_SM = 32
SMEM_PER_SM = 228 * 1024
SMEM_RESERVED = 1024  # per block, by the system
SMEM_STATIC = 48 * 1024  # per block without cudaFuncSetAttribute's opt-in

ENTRY = re.compile(r"Compiling entry function '([^']+)'")
SPILL = re.compile(r"(\d+) bytes spill stores, (\d+) bytes spill loads")
USED = re.compile(r"Used (\d+) registers(?:.*?, (\d+) bytes smem)?")
LAUNCH = re.compile(r"([A-Za-z_]\w*)\s*(?:<[^<>;]*>)?\s*<<<")
PDL = re.compile(r"pdl_config\(")
PDL_KERNEL = re.compile(r"cudaLaunchKernelEx\(\s*&\w+\s*,\s*([A-Za-z_]\w*)")
BOUNDS = re.compile(r"__launch_bounds__\(")
DEFINE = re.compile(r"^[ \t]*#[ \t]*define[ \t]+([A-Za-z_]\w*)[ \t]+(.+?)[ \t]*$", re.M)
ARITH = re.compile(r"^[0-9\s+*/%()-]+$")


def strip_comments(text):
    """text without its /* */ and // comments (newlines kept, for line numbers)."""
    return re.sub(r"/\*.*?\*/|//[^\n]*",
                  lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)


def close_of(text, i):
    """Index just past the parenthesis closing the one opened at text[i]."""
    depth = 0
    for j in range(i, len(text)):
        depth += {"(": 1, ")": -1}.get(text[j], 0)
        if depth == 0:
            return j + 1
    raise ValueError("unbalanced parentheses")


def split_args(text):
    """text split at its commas outside parentheses."""
    parts, depth, cur = [], 0, ""
    for c in text:
        depth += {"(": 1, ")": -1}.get(c, 0)
        if c == "," and depth == 0:
            parts.append(cur.strip())
            cur = ""
        else:
            cur += c
    return parts + [cur.strip()]


def evaluate(expr, defines, depth=0):
    """The integer value of a block-size expression, or None when it is not constant: the
    #defines substituted, (unsigned) casts, dim3(n) and integer suffixes dropped."""
    if depth > 8:
        return None
    e = re.sub(r"\(\s*unsigned(?:\s+int)?\s*\)", "", expr)
    e = re.sub(r"\bdim3\s*\(([^(),]*)\)", r"(\1)", e)
    e = re.sub(r"\b(\d+)[uUlL]+\b", r"\1", e)
    names = set(re.findall(r"[A-Za-z_]\w*", e))
    for n in names:
        if n not in defines:
            return None
        v = evaluate(defines[n], defines, depth + 1)
        if v is None:
            return None
        e = re.sub(r"\b%s\b" % n, str(v), e)
    if not ARITH.match(e):
        return None
    try:
        return int(eval(e.replace("/", "//"), {"__builtins__": {}}, {}))  # digits, operators
    except (SyntaxError, ZeroDivisionError):
        return None


def read_sources(texts):
    """(launches, bounds) of the kernel sources {path: text}. launches: (kernel, block
    expression, its value, shared expression, its value, where), a value None when it is
    not a constant; bounds: kernel -> its __launch_bounds__ values. Each file's expressions
    are read with its own #defines over those of the headers (.h)."""
    launches, bounds, common = [], {}, {}
    clean = {p: strip_comments(t) for p, t in texts.items()}
    for p, t in clean.items():
        if p.endswith(".h"):
            for m in DEFINE.finditer(t):
                common.setdefault(m.group(1), m.group(2))
    for p, t in clean.items():
        if p.endswith(".h"):
            continue  # its definitions (pdl_config's own) are not launches
        defs = dict(common)
        defs.update((m.group(1), m.group(2)) for m in DEFINE.finditer(t))

        def where(i):
            return "%s:%d" % (os.path.basename(p), t.count("\n", 0, i) + 1)

        def launch(name, block_e, shared_e, at):
            launches.append((name, block_e, evaluate(block_e, defs), shared_e,
                             evaluate(shared_e, defs), where(at)))

        for m in LAUNCH.finditer(t):
            cfg = split_args(t[m.end():t.find(">>>", m.end())])
            launch(m.group(1), cfg[1] if len(cfg) > 1 else "", cfg[2] if len(cfg) > 2 else "0",
                   m.start())
        for m in PDL.finditer(t):
            args = split_args(t[m.end():close_of(t, m.end() - 1) - 1])
            k = PDL_KERNEL.search(t, m.end())
            if k is None or len(args) < 2:
                launch("?", "", "0", m.start())
            else:
                launch(k.group(1), args[1], "0", m.start())
        for m in BOUNDS.finditer(t):
            args = split_args(t[m.end():close_of(t, m.end() - 1) - 1])
            name = re.match(r"\s*([A-Za-z_]\w*)\s*\(", t[close_of(t, m.end() - 1):])
            if name:
                bounds[name.group(1)] = [evaluate(a, defs) for a in args]
    return launches, bounds


def read_ptxas(text):
    """kernel name -> [(mangled, registers, smem bytes, (spill stores, spill loads) bytes)]
    from ptxas -v."""
    out, cur, spill = {}, None, (0, 0)
    for line in text.splitlines():
        m = ENTRY.search(line)
        if m:
            cur, spill = m.group(1), (0, 0)
            continue
        m = SPILL.search(line)
        if m and cur:
            spill = (int(m.group(1)), int(m.group(2)))
            continue
        m = USED.search(line)
        if m and cur:
            n = re.match(r"_Z(\d+)", cur)
            name = cur[len(n.group(0)):len(n.group(0)) + int(n.group(1))] if n else cur
            out.setdefault(name, []).append((cur, int(m.group(1)), int(m.group(2) or 0), spill))
            cur = None
    return out


def block_registers(threads, regs):
    """Registers a block of threads takes: regs a thread, allocated REG_UNIT a warp."""
    return -(-threads // 32) * (-(-regs * 32 // REG_UNIT) * REG_UNIT)


def resident(threads, regs, smem):
    """Blocks of this shape one multiprocessor holds at once (0: none fits)."""
    need = block_registers(threads, regs)
    by_regs = REGS_PER_SM // need if need else BLOCKS_PER_SM
    return min(BLOCKS_PER_SM, THREADS_PER_SM // (-(-threads // 32) * 32), by_regs,
               SMEM_PER_SM // (smem + SMEM_RESERVED))


def check(kernels, launches, bounds):
    """The problems (strings) of the launches against the kernels' resources; prints one
    line per launch and kernel instance."""
    bad = []
    launched = set()
    for name, block_e, block, shared_e, shared, where in launches:
        launched.add(name)
        if name not in kernels:
            bad.append("%s: a launch of %s, which the PTX does not hold" % (where, name))
            continue
        if block is None or shared is None:
            bad.append("%s: %s's block size '%s' (shared '%s') is not a constant this reads"
                       % (where, name, block_e, shared_e))
            continue
        lb = bounds.get(name)
        if lb and None in lb:
            bad.append("%s: %s's __launch_bounds__ is not a constant this reads" % (where, name))
            continue
        max_t = lb[0] if lb else None
        min_b = lb[1] if lb and len(lb) > 1 else None
        for mangled, regs, smem, spill in kernels[name]:
            need = block_registers(block, regs)
            fit = resident(block, regs, smem + shared)
            print("%-22s %-58s block %4d, %3d registers (%5d a block), smem %5d, "
                  "%2d blocks/SM" % (where, mangled[:58], block, regs, need, smem + shared, fit))
            if block > THREADS_PER_BLOCK or block < 1:
                bad.append("%s: %s launched with %d threads a block (1..%d)"
                           % (where, mangled, block, THREADS_PER_BLOCK))
            if need > REGS_PER_BLOCK:
                bad.append("%s: %s needs %d registers a block (%d a thread x %d threads), "
                           "over %d: too many resources requested for launch"
                           % (where, mangled, need, regs, block, REGS_PER_BLOCK))
            if max_t is not None and block > max_t:
                bad.append("%s: %s launched with %d threads, over its __launch_bounds__ %d"
                           % (where, mangled, block, max_t))
            if smem + shared > SMEM_STATIC:
                bad.append("%s: %s uses %d bytes of shared memory a block, over %d"
                           % (where, mangled, smem + shared, SMEM_STATIC))
            if min_b is not None and fit < min_b:
                bad.append("%s: %s: %d blocks resident a multiprocessor, its __launch_bounds__ "
                           "asks for %d" % (where, mangled, fit, min_b))
    for name, insts in sorted(kernels.items()):
        for mangled, regs, smem, spill in insts:
            if any(spill):
                bad.append("%s spills registers: %d bytes stored, %d loaded"
                           % ((mangled,) + spill))
        if name not in launched:
            bad.append("%s: in the PTX, but no launch of it was found in the sources" % name)
    return bad


def run(ptxas_text, texts):
    launches, bounds = read_sources(texts)
    kernels = read_ptxas(ptxas_text)
    if not kernels or not launches:
        return ["no kernel in the ptxas output or no launch in the sources"]
    return check(kernels, launches, bounds)


SELF_SRC = """
#define WARPS 8
#define THREADS (32 * WARPS)
__global__ static void __launch_bounds__(THREADS, 2) a_kernel(float *x) {}
__global__ static void b_kernel(float *x) {}
void go(cudaStream_t s) {
    a_kernel<<<(unsigned)(n > 4 ? 4 : n), THREADS, 0, s>>>(x); // a comment: c_kernel<<<1, 1>>>
    b_kernel<float><<<grid, 32 * WARPS, 0, s>>>(x);
    cudaLaunchConfig_t cfg = pdl_config(dim3((unsigned)n), dim3(THREADS), s, &at);
    cudaLaunchKernelEx(&cfg, b_kernel<float>, x);
}
"""


def self_ptxas(regs_a=64, regs_b=40, smem_b=1024, spill_b=0):
    out = []
    for name, regs, smem, spill in (("_Z8a_kernelPf", regs_a, 0, 0),
                                    ("_Z8b_kernelIfEvPf", regs_b, smem_b, spill_b)):
        out.append("ptxas info    : Compiling entry function '%s' for 'sm_90'" % name)
        out.append("ptxas info    : Function properties for %s" % name)
        out.append("    0 bytes stack frame, %d bytes spill stores, %d bytes spill loads"
                   % (spill, spill))
        out.append("ptxas info    : Used %d registers, used 1 barriers, %d bytes smem"
                   % (regs, smem))
    return "\n".join(out)


def selftest():
    """Cases with a known answer: (what, ptxas text, sources (a text: self.cu's), substring
    of the failure or None)."""
    cases = [
        ("clean", self_ptxas(), SELF_SRC, None),
        ("registers over the block's", self_ptxas(regs_b=255), SELF_SRC.replace(
            "32 * WARPS, 0", "1024, 0"), "too many resources"),
        ("over __launch_bounds__", self_ptxas(), SELF_SRC.replace(
            "THREADS, 0, s>>>", "512, 0, s>>>"), "over its __launch_bounds__"),
        ("a spill", self_ptxas(spill_b=16), SELF_SRC, "spills registers: 16 bytes stored"),
        ("shared memory", self_ptxas(smem_b=48 * 1024), SELF_SRC.replace(
            "32 * WARPS, 0", "32 * WARPS, 256"), "bytes of shared memory"),
        ("a block size not constant", self_ptxas(), SELF_SRC.replace(
            "32 * WARPS, 0", "threads, 0"), "not a constant"),
        ("a kernel never launched", self_ptxas(), SELF_SRC.replace(
            "a_kernel<<<", "a_kernel(").replace("0, s>>>(x); //", "0, s)(x); //"),
         "no launch of it"),
        ("resident under the minimum", self_ptxas(regs_a=160), SELF_SRC,
         "asks for 2"),
        ("a header's #define", self_ptxas(), {
            "self.cu": SELF_SRC.replace("#define WARPS 8", ""), "self.h": "#define WARPS 8"},
         None),
        ("another file's #define", self_ptxas(), {
            "other.cu": "#define THREADS 2048 /* read first, not self.cu's */",
            "self.cu": SELF_SRC}, None),
        ("__launch_bounds__ not constant", self_ptxas(), SELF_SRC.replace(
            "__launch_bounds__(THREADS, 2)", "__launch_bounds__(THREADS, minb)"),
         "__launch_bounds__ is not a constant"),
    ]
    failed = 0
    for what, ptx, src, want in cases:
        bad = run(ptx, src if isinstance(src, dict) else {"self.cu": src})
        ok = (not bad) if want is None else any(want in b for b in bad)
        print("%s selftest %s: %s" % ("PASS" if ok else "FAIL", what, bad or "no problem"))
        failed += not ok
    return 1 if failed else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--selftest", action="store_true")
    ap.add_argument("--ptxas")
    ap.add_argument("--src")
    ap.add_argument("ptx", nargs="*")
    args = ap.parse_args()
    if args.selftest:
        return selftest()
    if not args.ptxas or not args.src or not args.ptx:
        ap.print_usage(sys.stderr)
        return 2
    texts = {}
    for path in sorted(glob.glob(os.path.join(args.src, "*.cu")) +
                       glob.glob(os.path.join(args.src, "*.h"))):
        with open(path, encoding="utf-8") as f:
            texts[path] = f.read()
    ptxas = []
    for path in args.ptx:
        got = subprocess.run([args.ptxas, "-arch=sm_90", "-v", "-o", os.devnull, path],
                             capture_output=True, text=True)
        if got.returncode != 0:
            print("FAIL: ptxas on %s: %s" % (path, got.stderr.strip()[-400:]))
            return 1
        ptxas.append(got.stderr + got.stdout)
    bad = run("\n".join(ptxas), texts)
    for line in bad:
        print("FAIL: " + line)
    if not bad:
        print("PASS: every launch fits an sm_90 multiprocessor, no kernel spills")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
