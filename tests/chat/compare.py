#!/usr/bin/env python3
"""Compares ganglion's chat-template interpreter with transformers' apply_chat_template.

    compare.py CHAT_DRIVER TOKENIZER_JSON TEMPLATE.jinja...

For every template and every conversation below (with and without a system message,
multi-turn, unicode and emoji, text that looks like Jinja, add_generation_prompt True and
False) the output of tests/chat/chat-driver must equal, byte for byte, the string
transformers renders (PreTrainedTokenizerFast(...).apply_chat_template(..., tokenize=False)
with the template as chat_template). A case where transformers itself raises (a template
that refuses a conversation) must be refused by ganglion too, in the same way:
raise_exception() as GANG_EINVAL with its message, a type or undefined error as
GANG_EMODEL. Prints one line per
template and exits 1 on the first mismatch report set, 0 when everything matches.
"""
import json
import os
import subprocess
import sys
import tempfile

import jinja2
from transformers import PreTrainedTokenizerFast

BOS = "<|begin_of_text|>"
EOS = "<|eot_id|>"

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Current weather for a city",
    "parameters": {"type": "object", "required": ["city"], "properties": {
        "city": {"type": "string", "description": "the city, e.g. \"Paris\""},
        "days": {"type": "integer", "enum": [1, 2, 3]}}}}}]

CONVERSATIONS = [
    ("user only", [{"role": "user", "content": "Hello!"}]),
    ("system + user", [{"role": "system", "content": "You are terse."},
                       {"role": "user", "content": "What is 2+2?"}]),
    ("multi-turn", [{"role": "user", "content": "Hi"},
                    {"role": "assistant", "content": "Hello! How can I help?"},
                    {"role": "user", "content": "Tell me a joke."}]),
    ("system multi-turn", [{"role": "system", "content": "  Be kind.\n"},
                           {"role": "user", "content": "  padded  "},
                           {"role": "assistant", "content": "ok\n\n"},
                           {"role": "user", "content": "again"}]),
    ("unicode", [{"role": "user", "content": "Grüße, 世界! 😀🚀 — ünïcödé\u00a0nbsp"}]),
    ("jinja-looking", [{"role": "user",
                        "content": "{{ x }} {% if y %}z{% endif %} {# c #} '\"\\n"}]),
    ("newlines", [{"role": "system", "content": "line1\nline2\r\n\tTab"},
                  {"role": "user", "content": "\n\nleading newlines"},
                  {"role": "assistant", "content": "answer"},
                  {"role": "user", "content": "trailing\n"}]),
    ("empty content", [{"role": "user", "content": ""}]),
    ("ends with assistant", [{"role": "user", "content": "Q"},
                             {"role": "assistant", "content": "A"}]),
    ("content parts", [{"role": "user", "content": [{"type": "text", "text": "Describe it"},
                                                    {"type": "image"}]}]),
    ("think", [{"role": "user", "content": "Solve it"},
               {"role": "assistant", "content": "<think>hmm</think>The answer is 4."},
               {"role": "user", "content": "Thanks"}]),
    ("tools", [{"role": "system", "content": "Use tools."},
               {"role": "user", "content": "Weather in Zürich?"}], {"tools": TOOLS}),
    ("tool call", [{"role": "user", "content": "Weather in Zürich?"},
                   {"role": "assistant", "content": "", "tool_calls": [
                       {"type": "function", "id": "call_1", "function": {
                           "name": "get_weather", "arguments": {"city": "Zürich", "days": 2}}}]},
                   {"role": "tool", "content": "{\"temp\": 3.5}", "tool_call_id": "call_1"}],
     {"tools": TOOLS}),
    ("date and variables", [{"role": "user", "content": "Hi"}],
     {"date_string": "01 Dec 2026", "enable_thinking": False}),
]


def reference(tok, template, messages, add_gen, extra):
    try:
        return "OK", tok.apply_chat_template(messages, chat_template=template, tokenize=False,
                                             add_generation_prompt=add_gen, **extra)
    except jinja2.exceptions.TemplateError as e:  # the template refused the conversation
        if type(e) is jinja2.exceptions.TemplateError:  # raise_exception()
            return "ERR", ("GANG_EINVAL", str(e))
        return "ERR", ("GANG_EMODEL", str(e))  # undefined operations, syntax
    except (TypeError, ValueError, AttributeError) as e:  # type errors while rendering
        return "ERR", ("GANG_EMODEL", str(e))


def main():
    driver, tokjson, templates = sys.argv[1], sys.argv[2], sys.argv[3:]
    tok = PreTrainedTokenizerFast(tokenizer_file=tokjson, bos_token=BOS, eos_token=EOS)
    failures = 0
    total = 0
    refused = 0
    for path in templates:
        with open(path, encoding="utf-8") as f:
            template = f.read()
        cases, want = [], []
        for name, msgs, *extra in CONVERSATIONS:
            extra = extra[0] if extra else {}
            for add_gen in (True, False):
                cases.append({"messages": msgs, "add_generation_prompt": add_gen,
                              "bos_token": BOS, "eos_token": EOS, "extra": extra})
                want.append((name, add_gen) + reference(tok, template, msgs, add_gen, extra))
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            json.dump(cases, f, ensure_ascii=False)
            cases_path = f.name
        try:
            got = subprocess.run([driver, path, cases_path], capture_output=True, check=True,
                                 timeout=120).stdout.decode().splitlines()
        finally:
            os.unlink(cases_path)
        bad = 0
        for (name, add_gen, kind, text), line in zip(want, got):
            total += 1
            status, _, rest = line.partition(" ")
            if kind == "OK" and status == "OK" and bytes.fromhex(rest).decode() == text:
                continue
            if kind == "ERR" and status == "ERR" and rest.startswith(text[0] + " ") and (
                    text[0] != "GANG_EINVAL" or text[1] in rest):
                refused += 1  # the same refusal: raise_exception's message, or a type error
                continue
            bad += 1
            mine = bytes.fromhex(rest).decode() if status == "OK" else line
            print(f"MISMATCH {os.path.basename(path)} [{name}, add_generation_prompt={add_gen}]")
            print(f"  transformers ({kind}): {text!r}")
            print(f"  ganglion     ({status}): {mine!r}")
        if len(got) != len(want):
            bad += 1
            print(f"MISMATCH {os.path.basename(path)}: {len(got)} results for {len(want)} cases")
        failures += bad
        print(f"{os.path.basename(path)}: {len(want) - bad}/{len(want)} identical")
    print(f"chat-template-compare: {total - failures}/{total} cases identical "
          f"({refused} of them refused by both)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
