#!/usr/bin/env python3
"""Rewrites a .cu file's kernel launches for the CUDA emulator (tests/cuda-emu/, issue #24).

    rewrite-launch.py IN.cu OUT.cpp

`NAME<<<CFG>>>(ARGS);` (NAME possibly a template instance, e.g. gemv_kernel<T>) becomes

    gang_emu_launch_args(gang_emu_cfg(CFG), "NAME", std::make_tuple(ARGS),
                         [](auto... a) { NAME(a...); });

the arguments evaluated and copied once at the launch (an array decays to its pointer), as
the device copies a kernel's parameters, each pointer among them checked to be device (or
pinned) memory, and the kernel called with those copies by each thread. A `__shared__`
declaration (one or more arrays or scalars, no initializer) is followed, on the same line
(the line numbers stay), by `gang_emu_shared_fresh(&NAME, sizeof NAME);` for each name it
declares: the emulator sets
their bytes to 0xff once per block, so that a read of what the block never wrote shows (a
static keeps the previous block's values). Everything else is kept byte for byte (a #line
directive keeps compiler messages pointing at IN.cu). A file with a `<<<` or a `__shared__`
this cannot parse is an error, never passed through.
"""
import os
import re
import sys

NAME = re.compile(r"([A-Za-z_][A-Za-z_0-9]*(?:<[^<>;]*>)?)\s*$")


def close_of(text, i, op, cl):
    """Index just past the bracket that closes the one opened at text[i] (== op)."""
    depth = 0
    while i < len(text):
        c = text[i]
        if c == op:
            depth += 1
        elif c == cl:
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    raise ValueError("unbalanced")


def rewrite(src, path):
    out = []
    pos = 0
    count = 0
    while True:
        at = src.find("<<<", pos)
        if at < 0:
            break
        before = src[max(0, at - 200):at]
        m = NAME.search(before)
        if m is None:
            sys.exit(f"{path}: a <<< without a kernel name before it at offset {at}")
        start = at - len(before) + m.start()
        name = m.group(1)
        end_cfg = src.find(">>>", at)
        if end_cfg < 0:
            sys.exit(f"{path}: <<< without >>> at offset {at}")
        cfg = src[at + 3:end_cfg]
        j = end_cfg + 3
        while src[j].isspace():
            j += 1
        if src[j] != "(":
            sys.exit(f"{path}: a launch without arguments at offset {at}")
        k = close_of(src, j, "(", ")")
        args = src[j + 1:k - 1]
        out.append(src[pos:start])
        out.append(f'gang_emu_launch_args(gang_emu_cfg({cfg}), "{name}", '
                   f'std::make_tuple({args}), [](auto... a) {{ {name}(a...); }})')
        pos = k
        count += 1
    out.append(src[pos:])
    return "".join(out), count


SHARED = re.compile(r"__shared__\s+([^;{}=]*);")
DECLARATOR = re.compile(r"^\s*([A-Za-z_][A-Za-z_0-9]*)\s*(\[[^\]]+\]\s*)*$")


def split_top(text):
    """text split at its commas outside brackets."""
    parts, depth, cur = [], 0, ""
    for c in text:
        if c in "[<":
            depth += 1
        elif c in "]>":
            depth -= 1
        if c == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += c
    return parts + [cur]


def in_comment(prefix):
    """1 when a line that begins with prefix is a comment's text there."""
    prefix = prefix.strip()
    return prefix.startswith(("*", "/*")) or "//" in prefix


def fresh_shared(src, path):
    """src with each __shared__ declaration followed by its gang_emu_shared_fresh calls."""
    out, pos, count, seen = [], 0, 0, 0
    for m in SHARED.finditer(src):
        if in_comment(src[src.rfind("\n", 0, m.start()) + 1:m.start()]):
            continue  # a comment's words
        seen += 1
        if "extern" in src[max(0, m.start() - 8):m.start()]:
            sys.exit(f"{path}: extern __shared__ (dynamic shared memory) at offset "
                     f"{m.start()}: the emulator does not poison it")
        parts = split_top(m.group(1))
        # the first part holds the type: the declarator is its last word and what follows
        first = re.match(r"^(.*?)([A-Za-z_][A-Za-z_0-9]*\s*(\[[^\]]+\]\s*)*)$",
                         parts[0].strip(), re.S)
        if first is None or not first.group(1).strip():
            sys.exit(f"{path}: a __shared__ declaration this cannot read at offset {m.start()}")
        names = []
        for d in [first.group(2)] + parts[1:]:
            dm = DECLARATOR.match(d)
            if dm is None:
                sys.exit(f"{path}: a __shared__ declarator this cannot read: '{d.strip()}'")
            names.append(dm.group(1))
        out.append(src[pos:m.end()])
        out.append("".join(f" gang_emu_shared_fresh(&{n}, sizeof {n});" for n in names))
        pos = m.end()
        count += len(names)
    out.append(src[pos:])
    code = [ln for ln in src.split("\n")
            if "__shared__" in ln and not in_comment(ln.split("__shared__")[0])]
    if sum(ln.count("__shared__") for ln in code) != seen:
        sys.exit(f"{path}: a __shared__ this cannot read (declarations found: {seen}, "
                 f"lines naming it: {len(code)})")
    return "".join(out), count


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    src = open(sys.argv[1]).read()
    text, n = rewrite(src, sys.argv[1])
    text, n_shared = fresh_shared(text, sys.argv[1])
    os.makedirs(os.path.dirname(os.path.abspath(sys.argv[2])), exist_ok=True)
    with open(sys.argv[2], "w") as f:
        f.write(f'#line 1 "{sys.argv[1]}"\n')
        f.write(text)
    print(f"{sys.argv[1]}: {n} launches rewritten, {n_shared} shared arrays poisoned per block",
          file=sys.stderr)


if __name__ == "__main__":
    main()
