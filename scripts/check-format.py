#!/usr/bin/env python3
"""clang-format for every C/CUDA source of the repository, with the repository's
.clang-format.

  check-format.py [--root DIR]          list the files that differ from their formatted
                                        form; exit 1 when there is one (ctest format-check)
  check-format.py --fix [--root DIR]    rewrite them in place (make format)

Sources: every .c, .h, .cu and .cpp (the CUDA emulator's) under the root, skipping .git,
build trees (build/, build-*/, any folder holding CMakeCache.txt) and generated/ folders;
the walk of scripts/repo_walk.py, shared with scripts/check-structure.py. The formatter is
Debian 12's clang-format (version 14, installed by scripts/install-deps.sh); another major
version may format some constructs differently, so the check names the version it used.
Exit status: 0 clean (or fixed), 1 files differ, 2 usage error, 77 clang-format is missing
(ctest reports the test as skipped, with the reason).
"""
import argparse
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from repo_walk import walk  # noqa: E402

SOURCE_EXT = (".c", ".h", ".cu", ".cpp")
SKIP = 77


def sources(root):
    """The .c, .h, .cu and .cpp files under root, relative, in the shared walk's order."""
    for rel, _ in walk(root):
        if rel.endswith(SOURCE_EXT):
            yield rel


def find_clang_format(explicit):
    for c in ([explicit] if explicit else []) + ["clang-format", "clang-format-14"]:
        path = shutil.which(c)
        if path:
            return path
    return None


def formatted(tool, root, rel):
    """The formatted text of one file, as bytes."""
    with open(os.path.join(root, rel), "rb") as f:
        # --assume-filename makes clang-format find the root's .clang-format and pick the
        # language from the extension (.cu is CUDA) while reading from stdin.
        r = subprocess.run([tool, "--style=file", "--assume-filename=" + os.path.join(root, rel)],
                           stdin=f, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60)
    if r.returncode != 0:
        raise RuntimeError("%s: clang-format failed: %s" % (rel, r.stderr.decode(errors="replace")))
    return r.stdout


def main(argv):
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default=os.path.dirname(here), help="repository root")
    ap.add_argument("--fix", action="store_true", help="rewrite the files that differ")
    ap.add_argument("--clang-format", default=os.environ.get("CLANG_FORMAT", ""),
                    help="the clang-format binary (default: clang-format on PATH)")
    a = ap.parse_args(argv)
    root = os.path.abspath(a.root)
    if not os.path.isfile(os.path.join(root, ".clang-format")):
        print("check-format: %s has no .clang-format" % root, file=sys.stderr)
        return 2
    tool = find_clang_format(a.clang_format)
    if tool is None:
        print("SKIP format-check: clang-format is not installed "
              "(scripts/install-deps.sh installs Debian's clang-format)")
        return SKIP
    version = subprocess.run([tool, "--version"], stdout=subprocess.PIPE,
                             text=True).stdout.strip()
    differ, checked = [], 0
    for rel in sources(root):
        checked += 1
        want = formatted(tool, root, rel)
        with open(os.path.join(root, rel), "rb") as f:
            have = f.read()
        if have == want:
            continue
        differ.append(rel)
        if a.fix:
            with open(os.path.join(root, rel), "wb") as f:
                f.write(want)
    for rel in differ:
        print(("formatted: " if a.fix else "differs from .clang-format: ") + rel)
    if a.fix:
        print("check-format: %d of %d files rewritten (%s)" % (len(differ), checked, version))
        return 0
    if differ:
        print("check-format: %d of %d files differ from .clang-format (%s); run `make format`"
              % (len(differ), checked, version))
        return 1
    print("check-format: %d files clean (%s)" % (checked, version))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
