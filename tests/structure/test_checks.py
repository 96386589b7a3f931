#!/usr/bin/env python3
"""Self-test of the repository checks (scripts/check-structure.py, scripts/check-format.py):
each runs on a tiny fixture tree in a temporary folder that holds one offender of every
kind, and must fail naming exactly those; the same tree without them must pass. A check
that cannot fail checks nothing.

  test_checks.py structure     the structure checker
  test_checks.py format        the format checker (exit 77 when clang-format is missing)

Exit status: 0 passed, 1 failed, 77 skipped (reason printed).
"""
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPTS = os.path.join(os.path.dirname(os.path.dirname(HERE)), "scripts")
sys.path.insert(0, SCRIPTS)
import check_rules  # noqa: E402
OUTSIDE = "." + "./shared/"  # written in two pieces so this file is not an offender itself
FAILURES = []


def expect(cond, what):
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        FAILURES.append(what)


def write(root, rel, text):
    path = os.path.join(root, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


def c_function(name, body_lines):
    """A function whose definition spans body_lines + 4 lines (name, braces, return)."""
    body = "".join("    x += %d; /* { not a brace } */\n" % i for i in range(body_lines))
    return "static int %s(int x)\n{\n%s    return x;\n}\n" % (name, body)


def run(args, timeout=120):
    r = subprocess.run([sys.executable] + args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, timeout=timeout)
    return r.returncode, r.stdout


def structure_tree(root, offenders):
    # Clean content of every kind the checker looks at.
    write(root, "common/small.c", "#include <stdio.h>\n" + c_function("short_one", 100) +
          "static const char *s = \"}\";\nstruct point {\n    int x;\n};\n")
    write(root, "kernels/k.cu", "__global__ void k(float *x)\n{\n    x[0] = 1.0f;\n}\n")
    write(root, "tests/unit/test-big.c", c_function("long_test_is_fine", 200) +
          "/* filler */\n" * 1200)
    write(root, "docs/design.md", "# design\nSee [the protocol](protocol.md).\n")
    write(root, "build/generated.c", "/* generated */\n" * 2000)  # build trees are skipped
    write(root, "bench/bench.c", c_function("bench_main", 10))
    # Layering: includes that go down the picture, and names the code has.
    write(root, "include/ganglion/model.h", "/* see gang_model_fn and gang_model_* */\n"
          "int gang_model_fn(void);\n")
    write(root, "include/ganglion/engine.h", '#include "ganglion/model.h"\n')
    write(root, "engine/run.c", '#include "ganglion/engine.h"\n#include "ganglion/model.h"\n'
          '#include "run.h"\nstatic const char *m = "gang_metric_total";\n')
    write(root, "engine/run.h", "/* gang_metric_total counts runs */\n")
    write(root, "launcher/agent.c", '#include "ganglion/engine.h"\n#include "x/unknown.h"\n')
    write(root, "docs/model.md", "Call `gang_model_fn`; the `gang_model_*` family; "
          "prefixes `gang_` and `gang__`.\n")
    for debt in sorted(check_rules.DEBTS)[:1]:
        # A tolerated wrong-way include that still occurs is not an offender.
        write(root, debt[0], '#include "%s"\n' % os.path.relpath(debt[1], os.path.dirname(
            debt[0])))
        write(root, debt[1], "/* tolerated */\n")
    if not offenders:
        return
    write(root, "text/tok.c", '#include "ganglion/model.h"\n')
    write(root, "model/load.c", '#include "../launcher/agent.h"\n')
    write(root, "launcher/agent.h", "/* the agent */\n")
    write(root, "include/ganglion/stray.h", "/* whose? */\n")
    write(root, "engine/plan.c", "/* calls gang_gone_fn() */\nint x;\n")
    write(root, "docs/engine.md", "intro\n\nThe `gang_vanished_*` family.\n")
    for debt in sorted(check_rules.DEBTS)[:1]:
        write(root, debt[0], "/* no longer includes it */\n")
    write(root, "common/huge.c", "/* line */\n" * 1001)
    write(root, "parallel/long.c", "#define M(a) \\\n    ((a) + 1)\n" + c_function("too_long", 117))
    write(root, "launcher/bench-old.c", c_function("old_bench", 5))
    write(root, "README.md", "The map is in `%s%s`.\n" % (OUTSIDE, "DESIGN" + ".md"))


def test_structure():
    tool = os.path.join(SCRIPTS, "check-structure.py")
    with tempfile.TemporaryDirectory(prefix="ganglion-structure-") as root:
        structure_tree(root, offenders=False)
        rc, out = run([tool, "--root", root])
        expect(rc == 0, "a clean tree passes (rc %d)\n%s" % (rc, out))
        structure_tree(root, offenders=True)
        rc, out = run([tool, "--root", root])
        print(out)
        expect(rc == 1, "a tree with offenders fails (rc %d)" % rc)
        expect("common/huge.c: 1001 lines" in out, "a 1,001-line source file is listed")
        expect("parallel/long.c:3: function too_long is 121 lines" in out,
               "a 121-line function is listed, at the line of its name")
        expect("launcher/bench-old.c" in out, "a bench* file under launcher/ is listed")
        expect("README.md:1: refers to" in out, "a reference outside the repository is listed")
        expect("text/tok.c: includes include/ganglion/model.h: text may not include model" in out,
               "an include of a public header up the picture is listed")
        expect("model/load.c: includes launcher/agent.h: model may not include launcher" in out,
               "a relative include of another module's private header up the picture is listed")
        expect("include/ganglion/stray.h: a public header that belongs to no module" in out,
               "a public header of no module is listed")
        expect("engine/plan.c:1: names gang_gone_fn" in out, "a stale name in a comment is listed")
        expect("docs/engine.md:3: names gang_vanished_" in out,
               "a stale prefix in a document is listed, at its line")
        if check_rules.DEBTS:
            expect("is no longer needed" in out, "a layering exception no longer used is listed")
        for clean in ("short_one", "long_test_is_fine", "tests/unit/test-big.c", "build/",
                      "kernels/k.cu", "bench/bench.c", "common/small.c", "docs/design.md:",
                      "engine/run.c", "engine/run.h", "launcher/agent.c", "docs/model.md"):
            expect(clean not in out, "%s is not listed" % clean)
        for clean in ("include/ganglion/model.h", "include/ganglion/engine.h"):
            expect(not any(line.startswith(clean) for line in out.splitlines()),
                   "%s is not listed" % clean)
        rc, out = run([tool, "--root", root, "--max-file-lines", "5000",
                       "--max-function-lines", "500"])
        expect(rc == 1 and "huge.c" not in out and "too_long" not in out,
               "the limits are parameters")


BAD_C = "int  f(int x){return x+1;}\n"
GOOD_C = "int f(int x)\n{\n    return x + 1;\n}\n"


def test_format():
    tool = os.path.join(SCRIPTS, "check-format.py")
    if not (shutil.which("clang-format") or shutil.which("clang-format-14")):
        print("SKIP format-check-selftest: clang-format is not installed")
        sys.exit(77)
    repo = os.path.dirname(SCRIPTS)
    with tempfile.TemporaryDirectory(prefix="ganglion-format-") as root:
        shutil.copy(os.path.join(repo, ".clang-format"), root)
        write(root, "common/good.c", GOOD_C)
        write(root, "kernels/bad.cu", BAD_C)
        write(root, "include/bad.h", "#ifndef X\n#define X\nint  g( void );\n#endif\n")
        write(root, "build/skipped.c", BAD_C)
        rc, out = run([tool, "--root", root])
        print(out)
        expect(rc == 1, "a tree with misformatted files fails (rc %d)" % rc)
        expect("kernels/bad.cu" in out and "include/bad.h" in out, "both bad files are listed")
        expect("good.c" not in out and "skipped.c" not in out, "clean and build files are not")
        rc, out = run([tool, "--root", root, "--fix"])
        expect(rc == 0 and "2 of 3 files rewritten" in out, "--fix rewrites the two\n" + out)
        with open(os.path.join(root, "kernels/bad.cu")) as f:
            expect(f.read() == GOOD_C, "the rewritten file is formatted")
        with open(os.path.join(root, "build/skipped.c")) as f:
            expect(f.read() == BAD_C, "build trees are not touched")
        rc, out = run([tool, "--root", root])
        expect(rc == 0, "after --fix the tree passes\n" + out)


def main():
    which = sys.argv[1] if len(sys.argv) > 1 else ""
    if which == "structure":
        test_structure()
    elif which == "format":
        test_format()
    else:
        print("usage: test_checks.py structure|format", file=sys.stderr)
        return 2
    if FAILURES:
        print("%d check(s) failed" % len(FAILURES))
        return 1
    print("all passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
