#!/usr/bin/env python3
"""Structure check of the ganglion repository (docs/design.md section 5, "Structure rules").

Fails, listing every offender, when
  * a non-test, non-generated C/CUDA source file (.c .h .cu .cpp) is longer than 1,000 lines
    (split it by mechanism);
  * a function outside tests/ is longer than 120 lines, counted from the line of its name
    to its closing brace (split it into steps);
  * a file under launcher/ is named bench* (benchmarks live in bench/, their own module);
  * any text file refers to the old design file outside the repository (the parent
    folder's shared/ directory, or the upper-case design file name): docs/design.md is the
    map, and a clone must contain everything it points at;
  * an include goes against the layering of the modules (scripts/check_rules.py EDGES,
    the picture of docs/design.md section 2);
  * a comment or a Markdown document names a gang_* symbol that the code does not have
    (a stale name; scripts/check_rules.py).

Usage: check-structure.py [--root DIR] [--max-file-lines N] [--max-function-lines N]
Exit status: 0 clean, 1 offenders (listed on stdout), 2 usage error.

The tree is walked on disk (not through git), so it also checks files not yet committed;
it skips .git, build trees (build/, build-*/, any folder holding CMakeCache.txt) and
generated/ folders.
"""
import argparse
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from repo_walk import walk  # noqa: E402
import check_rules  # noqa: E402

SOURCE_EXT = (".c", ".h", ".cu", ".cpp")
# Built from pieces so that this file and its test do not match themselves.
OUTSIDE_REFS = ("." + "./shared", "DESIGN" + ".md")
TEXT_LIMIT = 4 * 1024 * 1024  # larger files are data, not references

# Words that may precede a '(' ... ')' '{' at file scope without being a function.
NOT_FUNCTIONS = {"if", "for", "while", "switch", "return", "sizeof", "defined", "__attribute__",
                 "_Alignas", "alignas", "__declspec", "_Static_assert", "static_assert"}


def is_test(rel):
    return rel.startswith("tests/") or "/tests/" in rel


def strip_code(text):
    """Returns text with comments, string and character literals and preprocessor lines
    blanked out (newlines kept, so line numbers stay true)."""
    out = []
    i, n = 0, len(text)
    at_line_start = True
    while i < n:
        c = text[i]
        if at_line_start and c in " \t":
            out.append(c)
            i += 1
            continue
        if at_line_start and c == "#":
            # A preprocessor directive, with its backslash continuations.
            while i < n and text[i] != "\n":
                if text[i] == "\\" and i + 1 < n and text[i + 1] == "\n":
                    out.append("\n")
                    i += 2
                    continue
                i += 1
            continue
        at_line_start = False
        if c == "\n":
            out.append(c)
            at_line_start = True
            i += 1
        elif text.startswith("//", i):
            while i < n and text[i] != "\n":
                i += 1
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append("\n" * text.count("\n", i, j))
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
            out.append(c + "\n" * text.count("\n", i, j) + c)
            i = j
        else:
            out.append(c)
            i += 1
    return "".join(out)


IDENT_BEFORE_PAREN = re.compile(r"([A-Za-z_]\w*)\s*$")


def functions(text):
    """Yields (name, first line, last line) of every function definition in C/CUDA text."""
    code = strip_code(text)
    depth = 0
    header_start = 0  # offset where the current file-scope declaration began
    line_at = [0]  # line_at[k] = offset of line k+1
    for k, ch in enumerate(code):
        if ch == "\n":
            line_at.append(k + 1)

    def line_of(off):
        lo, hi = 0, len(line_at) - 1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if line_at[mid] <= off:
                lo = mid
            else:
                hi = mid - 1
        return lo + 1

    open_fn = None  # (name, first line) while inside a function body
    for k, ch in enumerate(code):
        if ch == "{":
            if depth == 0:
                header = code[header_start:k]
                name = function_name(header)
                if name is not None:
                    first = line_of(header_start + name[1])
                    open_fn = (name[0], first)
            depth += 1
        elif ch == "}":
            depth = max(depth - 1, 0)
            if depth == 0:
                if open_fn is not None:
                    yield open_fn[0], open_fn[1], line_of(k)
                    open_fn = None
                header_start = k + 1
        elif ch == ";" and depth == 0:
            header_start = k + 1


def function_name(header):
    """The function's name and its offset in header when header (the text at file scope
    before a '{') is a function definition's signature; else None."""
    h = header.rstrip()
    if not h.endswith(")") or "=" in h.replace("==", ""):
        return None
    # Find the '(' that matches the last ')' of the parameter list, skipping trailing
    # attributes such as __attribute__((noreturn)).
    end = len(h)
    while True:
        depth = 0
        for j in range(end - 1, -1, -1):
            if h[j] == ")":
                depth += 1
            elif h[j] == "(":
                depth -= 1
                if depth == 0:
                    break
        else:
            return None
        m = IDENT_BEFORE_PAREN.search(h[:j])
        if m is None:
            return None
        if m.group(1) in ("__attribute__", "__declspec", "__launch_bounds__"):
            end = m.start()
            h = h[:end].rstrip()
            if not h.endswith(")"):
                return None
            end = len(h)
            continue
        if m.group(1) in NOT_FUNCTIONS:
            return None
        words = re.findall(r"[A-Za-z_]\w*", h[:m.start()])
        if any(w in ("struct", "union", "enum") for w in words[-1:]):
            return None
        return m.group(1), m.start(1)


def count_lines(text):
    return text.count("\n") + (0 if text.endswith("\n") or not text else 1)


def check(root, max_file_lines, max_function_lines):
    offenders = []
    files = []
    texts = {"c": {}, "doc": {}, "code": {}}
    for rel, full in walk(root):
        files.append(rel)
        name = os.path.basename(rel)
        if rel.startswith("launcher/") and name.startswith("bench"):
            offenders.append("%s: a benchmark file under launcher/ (benchmarks live in bench/)"
                             % rel)
        try:
            if os.path.getsize(full) > TEXT_LIMIT:
                continue
            with open(full, "rb") as f:
                data = f.read()
        except OSError as e:
            offenders.append("%s: cannot read (%s)" % (rel, e))
            continue
        if b"\0" in data:
            continue  # binary
        text = data.decode("utf-8", errors="replace")
        if name.endswith(SOURCE_EXT):
            texts["c"][rel] = text
        elif name.endswith(".md"):
            texts["doc"][rel] = text
        elif name.endswith(check_rules.CODE_TEXT_EXT):
            texts["code"][rel] = text
        for ref in OUTSIDE_REFS:
            for lineno, line in enumerate(text.splitlines(), 1):
                if ref in line:
                    offenders.append("%s:%d: refers to %s outside the repository (use "
                                     "docs/design.md)" % (rel, lineno, ref))
        if not name.endswith(SOURCE_EXT) or is_test(rel):
            continue
        n = count_lines(text)
        if n > max_file_lines:
            offenders.append("%s: %d lines (limit %d; split it by mechanism)"
                             % (rel, n, max_file_lines))
        for fn, first, last in functions(text):
            length = last - first + 1
            if length > max_function_lines:
                offenders.append("%s:%d: function %s is %d lines (limit %d)"
                                 % (rel, first, fn, length, max_function_lines))
    offenders += check_rules.check_layers(files, texts["c"])
    offenders += check_rules.check_names(texts)
    return offenders


def main(argv):
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default=os.path.dirname(here), help="repository root")
    ap.add_argument("--max-file-lines", type=int, default=1000)
    ap.add_argument("--max-function-lines", type=int, default=120)
    a = ap.parse_args(argv)
    if not os.path.isdir(a.root):
        print("check-structure: %s is not a directory" % a.root, file=sys.stderr)
        return 2
    offenders = check(a.root, a.max_file_lines, a.max_function_lines)
    for o in offenders:
        print(o)
    if offenders:
        print("check-structure: %d offender(s) in %s" % (len(offenders), a.root))
        return 1
    print("check-structure: clean (%s)" % a.root)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
