#!/usr/bin/env python3
"""A programmatic dependent's kernels touch nothing an earlier kernel writes before they
wait (issue #24; kernels/cuda/cuda-pdl.h).

    ptx-pdl.py FILE.ptx...
    ptx-pdl.py --selftest

Launched as a programmatic dependent (--cuda-pdl), a decode GEMV may start while the
kernel before it still runs: until its griddepcontrol.wait (pdl_wait) it may read only
what no kernel writes (its weights, through the read-only path: ld.global.nc, and L2
prefetches), and write nothing in global memory. The CUDA emulator runs a stream's kernels
one after another and cannot show a read of x or a write of y moved above the wait; the
device would show it as wrong numbers now and then. So this reads the PTX nvcc makes
(the CMake object library gang_kernels_ptx) and, in every kernel that waits, follows every
path of its control flow from the entry: an access other than those, on a path that has
not passed a wait, fails (the kernel, the instruction, its line). A path that reaches the
end without waiting does not fail by itself, but its stores do, which is what a grid with
nothing to multiply (kdim 0) skipping the loop that holds the wait would do.

The analysis is path-insensitive (a branch may go either way on any pass): a wait that
only one iteration of a loop makes (if (k0 == 0) pdl_wait()) does not count for the
next, so the kernels wait where every path passes.

--selftest runs the check on small PTX texts with a known answer (one clean, four faults).
"""
import re
import sys

# Kernels that must be found waiting (mangled-name prefix -> instances expected).
EXPECTED = {"_Z11gemv_kernel": 3, "_Z13gemv_q_kernel": 10}
WAIT = re.compile(r"^\s*griddepcontrol\.wait\b")
LABEL = re.compile(r"^\s*(\$?[\w$]+):\s*$")
BRANCH = re.compile(r"^\s*(@!?%p\w+\s+)?bra(?:\.uni)?\s+(\$?[\w$]+)\s*;")
END = re.compile(r"^\s*(@!?%p\w+\s+)?(ret|exit)\b")
# What may run before the wait: read-only global loads and prefetches; any other global (or
# generic, which may be global) access may not.
ALLOWED = re.compile(r"^\s*(@!?%p\w+\s+)?(ld\.global\.nc\b|prefetch\.)")
GLOBAL_ACCESS = re.compile(
    r"^\s*(@!?%p\w+\s+)?(ld|st|atom|red|cp\.async|ldu)(\.global\b|\.(?!shared|local|param|const)"
    r"[a-z0-9]+\s|\s)")


def entries(text):
    """(mangled name, [(line number, text)]) of every .entry of a PTX file."""
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        m = re.match(r"^(?:\.visible\s+)?\.entry\s+(\S+)\(", lines[i])
        if m is None:
            i += 1
            continue
        name, body = m.group(1), []
        while i < len(lines) and lines[i].strip() != "{":
            i += 1
        i += 1
        depth = 1
        while i < len(lines) and depth > 0:
            s = lines[i]
            depth += s.count("{") - s.count("}")
            if depth > 0:
                body.append((i + 1, s))
            i += 1
        yield name, body


def blocks(body):
    """The kernel's basic blocks: a list of (label or None, [(line, text)], successors)."""
    out, cur, label = [], [], None

    def close(succ_next):
        out.append([label, cur, succ_next])

    for ln, s in body:
        m = LABEL.match(s)
        if m:
            if cur or label is not None:
                close(["<next>"])
            cur, label = [], m.group(1)
            continue
        code = s.split("//")[0].strip()
        if not code:
            continue
        cur.append((ln, code))
        b = BRANCH.match(code)
        e = END.match(code)
        if b:
            succ = [b.group(2)] + (["<next>"] if b.group(1) else [])
            close(succ)
            cur, label = [], None
        elif e:
            close(["<next>"] if e.group(1) else [])
            cur, label = [], None
    if cur or label is not None:
        close([])
    # resolve successors to indices
    index = {b[0]: i for i, b in enumerate(out) if b[0] is not None}
    for i, b in enumerate(out):
        succ = []
        for s in b[2]:
            if s == "<next>":
                if i + 1 < len(out):
                    succ.append(i + 1)
            elif s in index:
                succ.append(index[s])
            else:
                raise ValueError("branch to unknown label %s" % s)
        b[2] = succ
    return out


def check(name, body):
    """Faults of one kernel: [(line, instruction)] of the accesses a path reaches unwaited."""
    bl = blocks(body)
    if not bl:
        return []
    # must-analysis: waited[i] = the block is entered only by paths that have waited
    waited_in = [True] * len(bl)
    waited_in[0] = False
    preds = [[] for _ in bl]
    for i, b in enumerate(bl):
        for s in b[2]:
            preds[s].append(i)

    def out_state(i, state):
        for _, code in bl[i][1]:
            if WAIT.match(code):
                state = True
        return state

    changed = True
    while changed:
        changed = False
        for i in range(1, len(bl)):
            new = all(out_state(p, waited_in[p]) for p in preds[i]) if preds[i] else False
            if new != waited_in[i]:
                waited_in[i] = new
                changed = True
    faults = []
    for i, b in enumerate(bl):
        state = waited_in[i]
        for ln, code in b[1]:
            if WAIT.match(code):
                state = True
            elif not state and GLOBAL_ACCESS.match(code) and not ALLOWED.match(code):
                faults.append((ln, code))
    return faults


def run(paths):
    seen = {k: 0 for k in EXPECTED}
    bad = 0
    for path in paths:
        with open(path, encoding="utf-8") as f:
            text = f.read()
        for name, body in entries(text):
            if not any(WAIT.match(s) for _, s in body):
                continue
            for k in seen:
                if name.startswith(k):
                    seen[k] += 1
            faults = check(name, body)
            print("%-64s %s" % (name, "ok" if not faults else "%d fault(s)" % len(faults)))
            for ln, code in faults[:8]:
                print("  %s:%d: before any wait on some path: %s" % (path, ln, code))
            bad += len(faults)
    for k, n in seen.items():
        if n < EXPECTED[k]:
            print("%s: %d waiting instance(s) found, %d expected" % (k, n, EXPECTED[k]))
            bad += 1
    return bad


CLEAN = """
.visible .entry _Z4goodPfPKf(
.param .u64 p0
)
{
ld.param.u64 %rd1, [p0];
ld.global.nc.v4.u32 {%r1,%r2,%r3,%r4}, [%rd2];
prefetch.global.L2 [%rd2];
ld.shared.f32 %f1, [%r5+128];
$L__BB0_1:
setp.eq.s64 %p1, %rd3, 0;
@%p1 bra $L__BB0_2;
ld.global.nc.v4.u32 {%r1,%r2,%r3,%r4}, [%rd2];
$L__BB0_2:
griddepcontrol.wait;
ld.global.f32 %f2, [%rd4];
@%p2 bra $L__BB0_1;
st.global.f32 [%rd5], %f2;
ret;
}
"""
# (text, line of the fault it must report, what it is)
FAULTS = [
    (CLEAN.replace("ld.shared.f32 %f1, [%r5+128];", "ld.global.f32 %f1, [%rd6];"),
     "ld.global.f32 %f1, [%rd6];", "a plain global load before the wait"),
    (CLEAN.replace("prefetch.global.L2 [%rd2];", "st.global.f32 [%rd6], %f1;"),
     "st.global.f32 [%rd6], %f1;", "a store before the wait"),
    (CLEAN.replace("@%p1 bra $L__BB0_2;", "@%p1 bra $L__BB0_3;").replace(
        "ret;", "$L__BB0_3:\natom.global.add.f32 %f3, [%rd5], %f2;\nret;"),
     "atom.global.add.f32 %f3, [%rd5], %f2;", "a path that skips the wait to an atomic"),
    (CLEAN.replace("griddepcontrol.wait;", "@%p3 bra $L__BB0_4;\ngriddepcontrol.wait;\n"
                   "$L__BB0_4:"),
     "ld.global.f32 %f2, [%rd4];", "a wait under a branch"),
]


def selftest():
    import contextlib
    import io
    import os
    import tempfile

    global EXPECTED
    EXPECTED = {"_Z4good": 1}
    fails = 0
    cases = [(CLEAN, None, "clean")] + FAULTS
    with tempfile.TemporaryDirectory() as d:
        for i, (text, want, what) in enumerate(cases):
            path = os.path.join(d, "case%d.ptx" % i)
            with open(path, "w") as f:
                f.write(text)
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                bad = run([path])
            got = out.getvalue()
            ok = bad == 0 if want is None else bad > 0 and want in got
            print("%-45s %s" % (what, "ok" if ok else "WRONG:\n" + got))
            fails += not ok
    return 1 if fails else 0


def main():
    if sys.argv[1:] == ["--selftest"]:
        return selftest()
    if len(sys.argv) < 2:
        print("usage: ptx-pdl.py FILE.ptx... | --selftest", file=sys.stderr)
        return 2
    bad = run(sys.argv[1:])
    print("ptx-pdl: %s" % ("every waiting kernel touches only read-only data before it waits"
                           if bad == 0 else "%d fault(s)" % bad))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
