"""Two rules of scripts/check-structure.py that read what the sources say rather than
their size: the layering of the modules (an include that goes the wrong way), and stale
names (a comment or a doc that names a gang_* symbol the code no longer has).

The layering is declared once, here, as the edges of docs/design.md's picture; a module
may include the public header of any module it reaches through them (the closure), and
nothing else outside itself. tests/, scripts/, examples/ and the build trees are not
modules: they may include anything."""
import os
import re

# The edges of the picture (docs/design.md section 2). cli/ (main() and its dispatch)
# sits on top of everything, then bench/.
EDGES = {
    "cli": {"bench", "launcher", "router"},
    "router": {"serve", "text", "engine"},
    "bench": {"launcher"},
    "launcher": {"serve", "engine", "rendezvous", "gpu"},
    "serve": {"text", "engine"},
    "engine": {"model", "parallel", "text"},
    "model": {"parallel", "kernels", "text"},
    "parallel": {"kernels"},
    "kernels": {"common"},
    "text": {"common"},
    "rendezvous": {"common"},
    "gpu": {"common"},
    "common": set(),
}

# The public header of each module (include/ganglion/, plus the generated config.h).
PUBLIC = {
    "common.h": "common", "params.def": "common", "config.h": "common",
    "text.h": "text", "kernels.h": "kernels", "comm.h": "parallel", "parallel.h": "parallel",
    "model.h": "model", "engine.h": "engine", "rendezvous.h": "rendezvous", "gpu.h": "gpu",
    "serve.h": "serve", "router.h": "router",
}

# Includes that go the wrong way today, each with the reason it is tolerated. The check
# also fails when one of these no longer occurs, so that the list only shrinks.
DEBTS = {}

SOURCE_EXT = (".c", ".h", ".cu")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def closure():
    """module -> the set of modules it may include (itself and every one it reaches)."""
    out = {}
    for m in EDGES:
        seen, todo = {m}, [m]
        while todo:
            for n in EDGES[todo.pop()]:
                if n not in seen:
                    seen.add(n)
                    todo.append(n)
        out[m] = seen
    return out


def module_of(rel):
    """The module a repository path belongs to, or None (tests, scripts, docs...)."""
    parts = rel.split("/")
    if parts[0] == "include" and len(parts) == 3 and parts[1] == "ganglion":
        return PUBLIC.get(parts[2], "?")
    return parts[0] if parts[0] in EDGES else None


def check_layers(files, texts):
    """files: every repository path (relative, '/'-separated); texts: path -> text of the
    C/CUDA sources. Returns the offenders as strings."""
    allowed = closure()
    offenders = []
    used_debts = set()
    present = set(files)
    for rel in sorted(texts):
        mod = module_of(rel)
        if mod is None:
            continue
        if mod == "?":
            offenders.append("%s: a public header that belongs to no module (scripts/"
                             "check_rules.py PUBLIC)" % rel)
            continue
        for inc in INCLUDE.findall(texts[rel]):
            target = resolve(rel, inc, present)
            if target is None:
                continue
            tmod = module_of(target)
            if tmod is None or tmod == "?" or tmod in allowed[mod]:
                continue
            if (rel, target) in DEBTS:
                used_debts.add((rel, target))
                continue
            offenders.append("%s: includes %s: %s may not include %s (layering, "
                             "docs/design.md section 2)" % (rel, target, mod, tmod))
    for debt in sorted(set(DEBTS) - used_debts):
        if debt[0] not in present:
            continue  # a tree without that file (the checks' own fixtures)
        offenders.append("%s: the layering exception for %s is no longer needed: remove it "
                         "from scripts/check_rules.py DEBTS" % debt)
    return offenders


def resolve(rel, inc, present):
    """The repository path an include names: ganglion/X (a public header), next to the
    including file, or the one file elsewhere whose path ends with it; None when it is not
    in the tree (a system or generated header)."""
    if inc.startswith("ganglion/"):
        return "include/" + inc if ("include/" + inc) in present or \
            inc[len("ganglion/"):] in PUBLIC else None
    here = os.path.normpath(os.path.join(os.path.dirname(rel), inc)).replace(os.sep, "/")
    if here in present:
        return here
    hits = [f for f in present if f.endswith("/" + inc) and not f.startswith("tests/")]
    return hits[0] if len(hits) == 1 else None


NAME = re.compile(r"\bgang_\w*")
STRING_OR_COMMENT = re.compile(r'"(?:\\.|[^"\\\n])*"|/\*.*?\*/|//[^\n]*', re.S)
CODE_TEXT_EXT = (".py", ".sh", ".cmake", ".txt", ".def", ".in", ".yaml", ".yml", ".json",
                 ".toml", ".cfg")


def comments_and_code(text):
    """(the comments of C text with their first lines, the rest with strings kept). One scan
    takes whichever comes first, a string or a comment, so that a "/*" inside a string is
    not taken for a comment."""
    comments, code, i = [], [], 0
    for m in STRING_OR_COMMENT.finditer(text):
        if m.group(0).startswith('"'):
            continue
        code.append(text[i:m.start()])
        comments.append((text.count("\n", 0, m.start()) + 1, m.group(0)))
        i = m.end()
    code.append(text[i:])
    return comments, "".join(code)


def check_names(texts_by_kind):
    """texts_by_kind: {"c": {path: text}, "doc": {path: text}, "code": {path: text}}.
    A gang_* word in a C comment or a doc must be a word of the code: C outside comments
    (strings kept: metric names), or a code file (Python, shell, CMake...). A word ending in
    '_' (gang_kernels_* , gang_comm_{a,b}) is a prefix: some code word must start with it."""
    known = set()
    checks = []  # (path, line, text)
    for rel, text in texts_by_kind["c"].items():
        comments, code = comments_and_code(text)
        known.update(NAME.findall(code))
        for line, c in comments:
            checks.append((rel, line, c))
    for rel, text in texts_by_kind["code"].items():
        known.update(NAME.findall(text))
    for rel, text in texts_by_kind["doc"].items():
        checks.append((rel, 1, text))
    prefixes = sorted(known)
    offenders = []
    for rel, line0, text in checks:
        for m in NAME.finditer(text):
            word = m.group(0)
            if word in ("gang_", "gang__") or word in known:
                continue
            if word.endswith("_") and any(k.startswith(word) for k in prefixes):
                continue
            line = line0 + text.count("\n", 0, m.start())
            offenders.append("%s:%d: names %s, which the code does not have (a stale name)"
                             % (rel, line, word))
    return offenders
