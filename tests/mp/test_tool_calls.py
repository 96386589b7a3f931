#!/usr/bin/env python3
"""Tool calling (issue #28) with the official `openai` client on the real
SmolLM2-135M-Instruct at TP 1, its weights under a chat template that renders `tools`
(Hermes style: a system turn listing them, calls as <tool_call>{...}</tool_call>):

* a named tool_choice returns a `tool_calls` entry of that function whose arguments
  validate against its parameters schema (`jsonschema`), finish_reason "tool_calls",
  streamed and not (the stream's delta carries the same call);
* "required" returns a call of one of the tools, valid the same way;
* "auto" returns either text or calls that are valid the same way; "none" returns text;
* a history with an assistant's tool_calls and a `tool` result is rendered and answered;
* refusals in OpenAI's shape: a role outside OpenAI's, a named function that `tools`
  lacks, tools on /v1/completions, a parameters schema with an unsupported keyword.

SKIP (77) with the reason when the model or the reference Python cannot be had."""
import json
import os
import sys

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness as H  # noqa: E402

SERVED = "smollm2-tools"
H.TEST_DEADLINE_S = 200

TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n"
    "You are a helpful assistant with these functions: {{ tools | tojson }}\n"
    "To call one, answer <tool_call>{\"name\": NAME, \"arguments\": ARGUMENTS}</tool_call>"
    "<|im_end|>\n{%- endif %}"
    "{%- for message in messages %}<|im_start|>{{ message.role }}\n"
    "{%- if message.tool_calls %}{%- for tc in message.tool_calls %}"
    "<tool_call>{{ tc.function | tojson }}</tool_call>{%- endfor %}"
    "{%- else %}{{ message.content }}{%- endif %}<|im_end|>\n{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}")

WEATHER = {"type": "object", "properties": {
    "city": {"type": "string", "maxLength": 40},
    "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"], "additionalProperties": False}
ADD = {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
       "required": ["a", "b"]}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER,
                                      "description": "The weather of a city"}},
    {"type": "function", "function": {"name": "add", "parameters": ADD,
                                      "description": "Adds two numbers"}},
]
PARAMS = {"get_weather": WEATHER, "add": ADD}


def model_with_tools_template(h):
    """SmolLM2's files (linked) with TEMPLATE as its chat template."""
    src = H.fetch_reference("smollm2", 90)
    dst = os.path.join(h.tmp, "smollm2-tools")
    os.makedirs(dst)
    for f in os.listdir(src):
        if f != "tokenizer_config.json" and not f.startswith("."):
            os.symlink(os.path.join(src, f), os.path.join(dst, f))
    with open(os.path.join(src, "tokenizer_config.json")) as f:
        cfg = json.load(f)
    cfg["chat_template"] = TEMPLATE
    with open(os.path.join(dst, "tokenizer_config.json"), "w") as f:
        json.dump(cfg, f)
    return dst


def valid_calls(calls, names, what):
    import jsonschema
    H.check(calls, "%s: no tool_calls" % what)
    for call in calls:
        H.check(call.type == "function" and call.id, "%s: %r" % (what, call))
        H.check(call.function.name in names, "%s: calls %r" % (what, call.function.name))
        jsonschema.validate(json.loads(call.function.arguments), PARAMS[call.function.name])


def check_forced(c):
    msgs = [{"role": "user", "content": "What is the weather in Paris?"}]
    named = {"type": "function", "function": {"name": "get_weather"}}
    r = c.chat.completions.create(model=SERVED, messages=msgs, max_tokens=80, temperature=0,
                                  tools=TOOLS, tool_choice=named)
    ch = r.choices[0]
    H.check(ch.finish_reason == "tool_calls", "named: finish %r" % ch.finish_reason)
    valid_calls(ch.message.tool_calls, ["get_weather"], "named")
    H.log("named: %s(%s)" % (ch.message.tool_calls[0].function.name,
                             ch.message.tool_calls[0].function.arguments))
    calls, finish = [], None
    for chunk in c.chat.completions.create(model=SERVED, messages=msgs, max_tokens=80,
                                           temperature=0, tools=TOOLS, tool_choice=named,
                                           stream=True):
        for choice in chunk.choices:
            calls += choice.delta.tool_calls or []
            finish = choice.finish_reason or finish
    H.check(finish == "tool_calls", "streamed named: finish %r" % finish)
    valid_calls(calls, ["get_weather"], "streamed named")
    H.check(calls[0].function.arguments == ch.message.tool_calls[0].function.arguments,
            "streamed %r vs %r" % (calls[0].function.arguments,
                                   ch.message.tool_calls[0].function.arguments))
    r = c.chat.completions.create(
        model=SERVED, messages=[{"role": "user", "content": "What is 2 plus 3?"}],
        max_tokens=80, temperature=0, tools=TOOLS, tool_choice="required")
    valid_calls(r.choices[0].message.tool_calls, list(PARAMS), "required")
    H.check(r.choices[0].finish_reason == "tool_calls", "required: %r" % r.choices[0])
    H.log("required: %s(%s)" % (r.choices[0].message.tool_calls[0].function.name,
                                r.choices[0].message.tool_calls[0].function.arguments))


def check_auto_none(c):
    for q in ("What is the weather in Paris?", "Tell me a joke."):
        msgs = [{"role": "user", "content": q}]
        r = c.chat.completions.create(model=SERVED, messages=msgs, max_tokens=60,
                                      temperature=0, tools=TOOLS)
        ch = r.choices[0]
        if ch.message.tool_calls:
            valid_calls(ch.message.tool_calls, list(PARAMS), "auto")
            H.check(ch.finish_reason == "tool_calls", "auto: %r" % ch)
            H.log("auto %r: a call %r" % (q, ch.message.tool_calls[0].function))
        else:
            H.check(ch.message.content and ch.finish_reason in ("stop", "length"),
                    "auto: %r" % ch)
            H.log("auto %r: text %r" % (q, ch.message.content[:60]))
        r = c.chat.completions.create(model=SERVED, messages=msgs, max_tokens=20,
                                      temperature=0, tools=TOOLS, tool_choice="none")
        H.check(not r.choices[0].message.tool_calls and r.choices[0].message.content,
                "none: %r" % r.choices[0])
    history = [
        {"role": "user", "content": "What is the weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {
                "name": "get_weather",
                "arguments": "{\"city\": \"Paris\", \"unit\": \"celsius\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "{\"temperature\": 21}"},
    ]
    r = c.chat.completions.create(model=SERVED, messages=history, max_tokens=30, temperature=0,
                                  tools=TOOLS, tool_choice="none")
    H.check(r.choices[0].message.content, "after a tool result: %r" % r.choices[0])
    H.log("after the tool's result: %r" % r.choices[0].message.content)


def expect_400(fn, needle):
    import openai
    try:
        fn()
    except openai.BadRequestError as e:
        err = e.body if isinstance(e.body, dict) and "message" in e.body else e.body["error"]
        H.check(e.status_code == 400 and set(err) >= {"message", "type", "param", "code"},
                "shape %r" % e.body)
        H.check(needle in err["message"], "%r lacks %r" % (err["message"], needle))
        return
    raise H.TestFailure("accepted (wanted a 400 about %r)" % needle)


def check_refusals(c):
    hi = [{"role": "user", "content": "hi"}]
    expect_400(lambda: c.chat.completions.create(
        model=SERVED, messages=[{"role": "wizard", "content": "hi"}], max_tokens=4), "role")
    expect_400(lambda: c.chat.completions.create(
        model=SERVED, messages=hi, max_tokens=4, tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "nope"}}), "'nope'")
    expect_400(lambda: c.completions.create(
        model=SERVED, prompt="hi", max_tokens=4, extra_body={"tools": TOOLS}),
        "chat/completions")
    bad = [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"x": {"type": "string", "format": "email"}}}}}]
    expect_400(lambda: c.chat.completions.create(
        model=SERVED, messages=hi, max_tokens=4, tools=bad, tool_choice="required"), "'format'")


def scenario(h):
    import openai
    model = model_with_tools_template(h)
    g = H.Gang(h, nnodes=1, nproc_per_node=1,
               extra=["--model", model, "--max-ctx", "1024", "--max-batch", "4",
                      "--kv-cache-mb", "128", "--served-model-name", SERVED,
                      "--request-timeout-ms", "120000"])
    g.start_local()
    g.wait_serving(timeout=90)
    c = openai.OpenAI(base_url="http://%s:%d/v1" % (g.addr(0), g.http_port), api_key="none",
                      max_retries=0, timeout=120)
    check_forced(c)
    check_auto_none(c)
    check_refusals(c)
    H.check(g.stop()["local"] == 0, "the gang did not stop cleanly")


if __name__ == "__main__":
    H.reexec_with_reference_python("jsonschema", "openai")
    H.run(scenario)
