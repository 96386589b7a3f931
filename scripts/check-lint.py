#!/usr/bin/env python3
"""The linters of the repository's scripts (ctests shell-lint and python-lint).

  check-lint.py shell [--root DIR]    shellcheck on every shell script
  check-lint.py python [--root DIR]   flake8 on every Python file, with DIR/.flake8
  check-lint.py list KIND [--root DIR]  print the files KIND would check

Files: the walk of scripts/repo_walk.py (shared with check-structure.py and check-format.py:
build trees, .git and generated/ skipped), also skipping Python virtual environments. A
shell script is a *.sh or *.bash file or one whose first line is a sh/bash/dash shebang
(.ci/run); a Python file is a *.py file or one with a python shebang.

Both linters run with the repository's settings: shellcheck reads .shellcheckrc (each
disabled check has its reason there or on the line it concerns), flake8 reads .flake8.
Both are Debian packages that scripts/install-deps.sh installs. Exit status: 0 clean, 1
findings (printed, one per line), 2 usage error, 77 the linter is missing (ctest reports the
test as skipped, with the reason).
"""
import argparse
import os
import re
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from repo_walk import walk  # noqa: E402

SKIP = 77
SHELL_SHEBANG = re.compile(rb"^#!\s*(/usr)?/bin/(env\s+)?(ba|da)?sh\b")
PYTHON_SHEBANG = re.compile(rb"^#!.*\bpython[0-9.]*\b")


def first_line(path):
    try:
        with open(path, "rb") as f:
            return f.readline(200)
    except OSError:
        return b""


def in_venv(root, rel):
    """True when rel lies in a Python virtual environment (a folder with pyvenv.cfg)."""
    parts = rel.split("/")[:-1]
    for i in range(1, len(parts) + 1):
        if os.path.exists(os.path.join(root, *parts[:i], "pyvenv.cfg")):
            return True
    return False


def files(root, kind):
    """The files of kind ("shell" or "python") under root, relative, in walk order."""
    for rel, full in walk(root):
        if kind == "shell":
            hit = rel.endswith((".sh", ".bash")) or (
                "." not in os.path.basename(rel) and SHELL_SHEBANG.match(first_line(full)))
        else:
            hit = rel.endswith(".py") or (
                not rel.endswith((".sh", ".c", ".h", ".md"))
                and PYTHON_SHEBANG.match(first_line(full)))
        if hit and not in_venv(root, rel):
            yield rel


def run(root, kind):
    tool = "shellcheck" if kind == "shell" else "flake8"
    exe = shutil.which(tool)
    if exe is None:
        print(f"{kind}-lint skipped: {tool} is not installed (scripts/install-deps.sh "
              f"installs the Debian package {tool})")
        return SKIP
    todo = list(files(root, kind))
    if not todo:
        print(f"{kind}-lint: no files found under {root}")
        return 1
    if kind == "shell":
        # -x with the script's folder as source path: follow `. "$here/cache-paths.sh"`.
        cmd = [exe, "--format=gcc", "--external-sources", "--source-path=SCRIPTDIR"] + todo
    else:
        cmd = [exe, "--config", os.path.join(root, ".flake8")] + todo
    version = subprocess.run([exe, "--version"], capture_output=True, text=True).stdout
    version = version.split()[0] if kind == "python" else \
        next((v for v in version.splitlines() if v.startswith("version")), "?")
    r = subprocess.run(cmd, cwd=root, capture_output=True, text=True)
    out = (r.stdout + r.stderr).strip()
    if out:
        print(out)
    print(f"{kind}-lint: {tool} ({version}) on {len(todo)} files: "
          + ("clean" if r.returncode == 0 else f"findings (exit {r.returncode})"))
    return 0 if r.returncode == 0 else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("what", choices=["shell", "python", "list"])
    ap.add_argument("kind", nargs="?", choices=["shell", "python"])
    ap.add_argument("--root", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    a = ap.parse_args()
    root = os.path.abspath(a.root)
    if a.what == "list":
        if a.kind is None:
            ap.error("list needs a KIND")
        for rel in files(root, a.kind):
            print(rel)
        return 0
    if a.kind is not None:
        ap.error("KIND only goes with list")
    return run(root, a.what)


if __name__ == "__main__":
    sys.exit(main())
