#!/usr/bin/env python3
"""Differential test of ganglion's chat-template interpreter against jinja2 as transformers
sets it up (transformers.utils.chat_template_utils._compile_jinja_template: the sandbox,
trim_blocks, lstrip_blocks, loopcontrols, its tojson), on random templates.

    diff-jinja.py CHAT_DRIVER SEED COUNT

Templates are drawn from a small grammar of what chat templates use (literals, variables,
operators, filters, tests, methods, slices, conditionals, if/for/set, whitespace control)
and rendered by both. ganglion may refuse what jinja2 renders (it is a subset), but it must
never render something different, nor render what jinja2 refuses. Exit 1 when it does.
"""
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import warnings

warnings.simplefilter('ignore')
from transformers.utils.chat_template_utils import _compile_jinja_template  # noqa: E402

DRIVER = sys.argv[1]
R = random.Random(int(sys.argv[2]))
STRS = ["'a'", "'Hello World'", "' pad '", "'é😀'", "''", "'x,y,,z'", "'<b>\"q\"&'", "'\\n'",
        "'ABC'", "'it\\'s'", "'1.5'", "'42'", "' 7 '"]
NAMES = ["messages", "messages[0]", "messages[-1].content", "messages[0]['role']", "m",
         "m.content", "m.role", "ns.x", "loop.index", "i", "undefined_var",
         "add_generation_prompt", "bos_token", "tools",
         "(1, 'a')", "range(4)", "dict(k=1)", "loop.previtem", "loop.nextitem",
         "loop.revindex", "loop.length", "mac('q')", "blk", "messages|length"]


def lit(d):
    k = R.randrange(9)
    if k == 0:
        return str(R.choice([0, 1, -3, 7, 100, 2**40]))
    if k == 1:
        return R.choice(["0.5", "1.0", "2.25", "1e3", "-0.1", "3.0e-7"])
    if k == 2:
        return R.choice(STRS)
    if k == 3:
        return R.choice(["true", "false", "none", "True", "None"])
    if k == 4 and d < 3:
        return "[" + ", ".join(expr(d + 1) for _ in range(R.randrange(4))) + "]"
    if k == 5 and d < 3:
        items = (f"{R.choice(STRS[:3])}: {expr(d + 1)}" for _ in range(R.randrange(3)))
        return "{" + ", ".join(items) + "}"
    if k == 6:
        return R.choice(NAMES)
    if k == 7 and d < 3:
        return "(" + expr(d + 1) + ")"
    return R.choice(STRS)


FILTERS = ["trim", "length", "upper", "lower", "title", "capitalize", "tojson", "first", "last",
           "join", "join(', ')", "default('d')", "string", "int", "float", "list", "reverse",
           "replace('a', 'b')", "select", "reject", "map('upper')", "map(attribute='role')",
           "selectattr('role', 'equalto', 'user')", "items", "abs", "count", "safe",
           "tojson(indent=2)", "tojson(sort_keys=true)", "d"]
TESTS = ["defined", "undefined", "none", "string", "number", "integer", "float", "mapping",
         "iterable", "sequence", "odd", "even", "divisibleby(3)", "eq(1)", "in([1, 'a'])",
         "lower", "upper", "true", "false", "boolean", "sameas(none)"]
METHODS = ["strip()", "lstrip()", "rstrip()", "split()", "split(',')", "split(',', 1)",
           "startswith('H')", "endswith(('a', 'd'))", "upper()", "lower()", "title()",
           "replace('l', 'L')", "items()", "keys()", "values()", "get('role')", "get('x', 1)",
           "capitalize()"]
OPS = ["+", "-", "*", "/", "//", "%", "~", "==", "!=", "<", ">=", "in", "not in", "and", "or",
       "**"]
SLICES = ['0', '-1', '1:', ':2', '::-1', '1:3', '::2', 'a']


def expr(d=0):
    k = R.randrange(10)
    if d > 3 or k < 3:
        return lit(d)
    if k == 3:
        return f"{expr(d + 1)} {R.choice(OPS)} {expr(d + 1)}"
    if k == 4:
        return f"{lit(d + 1)}|{R.choice(FILTERS)}"
    if k == 5:
        return f"{lit(d + 1)} is {R.choice(['', 'not '])}{R.choice(TESTS)}"
    if k == 6:
        return f"{lit(d + 1)}.{R.choice(METHODS)}"
    if k == 7:
        return f"{lit(d + 1)}[{R.choice(SLICES)}]".replace("[a]", "['role']")
    if k == 8:
        return f"{expr(d + 1)} if {expr(d + 1)} else {expr(d + 1)}"
    return f"not {expr(d + 1)}"


WS = ["", "-"]


def stmt(d=0):
    k = R.randrange(11)
    a, b = R.choice(WS), R.choice(WS)
    nl = R.choice(["", "\n", "\n  ", " "])
    if d > 2 or k < 3:
        return f"{nl}{{{{{a} {expr()} {b}}}}}" + R.choice(["", "x", "\n"])
    if k == 3:
        return (f"{nl}{{%{a} if {expr()} {b}%}}{body(d + 1)}{{%{R.choice(WS)} else %}}"
                f"{body(d + 1)}{{% endif %}}")
    if k == 4:
        seq = R.choice(['range(3)', 'messages', '[1, 2]', expr()])
        return f"{nl}{{%{a} for i in {seq} {b}%}}{body(d + 1)}{{% endfor %}}"
    if k == 5:
        return (f"{nl}{{%{a} for m in messages {b}%}}{body(d + 1)}"
                "{%- if loop.last %}L{% endif %}{% endfor %}")
    if k == 6:
        return f"{nl}{{% set ns.x = {expr()} %}}"
    if k == 7:
        return (f"{nl}{{% macro mac(a, b={lit(2)}) %}}{body(d + 1)}"
                "[{{ a ~ b }}]{% endmacro %}")
    if k == 8:
        return f"{nl}{{% set blk %}}{body(d + 1)}{{% endset %}}"
    if k == 9:
        return (f"{nl}{{% for i in [3, 1, 2] %}}{{{{ i }}}}{{% if {expr()} %}}"
                f"{{% {R.choice(['break', 'continue'])} %}}{{% endif %}}-{{% endfor %}}")
    return f"{nl}{{# c #}}{nl}text "


def body(d):
    return "".join(stmt(d) for _ in range(R.randrange(1, 3)))


msgs = [{"role": "system", "content": "Sys"}, {"role": "user", "content": "Hello é 😀"},
        {"role": "assistant", "content": "  ok  "}]
n = int(sys.argv[3])
stats = {"both_ok_same": 0, "both_err": 0, "ref_ok_we_err": 0, "ref_err_we_ok": 0, "DIFF": 0,
         "HANG": 0}
cases = json.dumps([{"messages": msgs, "add_generation_prompt": True, "bos_token": "<s>",
                     "eos_token": "</s>"}])
work = tempfile.mkdtemp()
open(work + '/cases.json', 'w').write(cases)
for t in range(n):
    tpl = "{% set ns = namespace(x=0) %}" + body(0)
    try:
        ref = ("OK", _compile_jinja_template(tpl).render(
            messages=msgs, tools=None, documents=None, add_generation_prompt=True,
            bos_token="<s>", eos_token="</s>"))
    except Exception as e:
        ref = ("ERR", repr(e))
    open(work + '/t.jinja', 'w').write(tpl)
    try:
        out = subprocess.run([DRIVER, work + '/t.jinja', work + '/cases.json'], capture_output=True,
                             timeout=20).stdout.decode().strip()
    except subprocess.TimeoutExpired:
        stats["HANG"] += 1
        print("HANG", repr(tpl))
        continue
    st, _, rest = out.partition(' ')
    mine = bytes.fromhex(rest).decode() if st == 'OK' else rest
    if ref[0] == 'OK' and st == 'OK':
        if ref[1] == mine:
            stats["both_ok_same"] += 1
        else:
            stats["DIFF"] += 1
            print("DIFF", repr(tpl), "\n  ref ", repr(ref[1][:300]), "\n  mine", repr(mine[:300]))
    elif ref[0] == 'ERR' and st == 'ERR':
        stats["both_err"] += 1
    elif ref[0] == 'OK':
        stats["ref_ok_we_err"] += 1
        if os.environ.get('V'):
            print("WEERR", repr(tpl)[:200], "|", mine[:150])
    else:
        stats["ref_err_we_ok"] += 1
        print("REFERR", repr(tpl)[:300], "\n  ref ", ref[1][:200], "\n  mine", repr(mine[:200]))
shutil.rmtree(work)
print(f'diff-jinja seed {sys.argv[2]}: {stats}')
sys.exit(1 if stats['DIFF'] or stats['ref_err_we_ok'] or stats['HANG'] else 0)
