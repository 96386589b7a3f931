#!/usr/bin/env python3
"""Structured outputs and logit_bias (issue #28) with the official `openai` client on the
real SmolLM2-135M-Instruct, at TP 1 (one rank) and at PP 2 (two nodes of one rank):

* five JSON schemas (nested objects, arrays of objects, enums, required and optional
  fields, strings, integers, numbers, booleans, null through anyOf) as
  response_format json_schema: every answer parses and validates against its schema with
  the `jsonschema` package, streamed and not, and the streamed greedy text equals the
  unstreamed one, on both layouts; at TP 1 also seeded samples at temperature 1 and
  /v1/completions;
* response_format json_object (TP 1): the answer parses as a JSON object;
* refusals in OpenAI's error shape (400, error.message/type/param/code): an unknown
  response_format type, a schema keyword that cannot be enforced (named in the message),
  a logit_bias key that is no token id;
* logit_bias -100 removes the token greedy decoding picks first (it appears nowhere in
  the answer), +100 forces one.

The client and jsonschema come from `scripts/fetch-reference.sh python` (the script
re-runs itself with that Python when they are not importable here); SKIP (77) with the
reason when the model or that Python cannot be had."""
import json
import os
import sys
import time

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness as H  # noqa: E402

SERVED = "smollm2-135m-instruct"
CTX = 1024
H.TEST_DEADLINE_S = 380  # two gangs of SmolLM2 on two shared cores (ctest: 420 s)

STR = {"type": "string", "maxLength": 40}
SCHEMAS = [
    ("person", "Invent a person and describe them as JSON with name, age and hobbies.",
     {"type": "object", "properties": {
         "name": STR, "age": {"type": "integer"},
         "hobbies": {"type": "array", "items": STR, "minItems": 1, "maxItems": 3}},
      "required": ["name", "age", "hobbies"], "additionalProperties": False}),
    ("city", "Describe Paris as JSON: the city (name, population) and its size.",
     {"type": "object", "properties": {
         "city": {"type": "object", "properties": {
             "name": STR, "population": {"type": "number"},
             "country": STR},
             "required": ["name", "population"]},
         "size": {"enum": ["small", "medium", "large"]}},
      "required": ["city", "size"]}),
    ("inventory", "List two fruits with their colour and price as JSON.",
     {"type": "object", "properties": {
         "items": {"type": "array", "minItems": 2, "maxItems": 2, "items": {
             "type": "object", "properties": {
                 "fruit": STR, "colour": {"enum": ["red", "green", "yellow", "orange"]},
                 "price": {"type": "number"}},
             "required": ["fruit", "colour", "price"], "additionalProperties": False}}},
      "required": ["items"]}),
    ("check", "Is the sky green? Answer as JSON with ok, a note and a count.",
     {"type": "object", "properties": {
         "ok": {"type": "boolean"},
         "note": {"anyOf": [STR, {"type": "null"}]},
         "count": {"type": "integer"}, "unit": {"const": "items"}},
      "required": ["ok", "note", "count", "unit"]}),
    ("verdict", "Rate the movie Titanic as JSON.",
     {"type": "object", "properties": {
         "verdict": {"type": "string", "enum": ["good", "bad", "mixed"]},
         "score": {"type": "number"},
         "tags": {"type": "array", "items": {"type": ["string", "null"], "maxLength": 20},
                  "maxItems": 3}},
      "required": ["verdict", "score", "tags"]}),
]


def fmt(name, schema):
    return {"type": "json_schema",
            "json_schema": {"name": name, "schema": schema, "strict": True}}


def check_schemas(c, layout):
    import jsonschema
    for name, question, schema in SCHEMAS:
        msgs = [{"role": "user", "content": question}]
        t0 = time.time()
        r = c.chat.completions.create(model=SERVED, messages=msgs, max_tokens=300,
                                      temperature=0, response_format=fmt(name, schema))
        text = r.choices[0].message.content
        H.check(r.choices[0].finish_reason == "stop", "%s %s: finish %r after %r"
                % (layout, name, r.choices[0].finish_reason, text))
        value = json.loads(text)
        jsonschema.validate(value, schema)
        pieces = []
        for ch in c.chat.completions.create(model=SERVED, messages=msgs, max_tokens=300,
                                            temperature=0, stream=True,
                                            response_format=fmt(name, schema)):
            for choice in ch.choices:
                pieces.append(choice.delta.content or "")
        H.check("".join(pieces) == text, "%s %s: streamed %r vs %r"
                % (layout, name, "".join(pieces), text))
        H.log("%s %s (%.1f s, %d tokens): %s" % (layout, name, time.time() - t0,
                                                 r.usage.completion_tokens, text))
    if layout != "tp1":
        return  # the rest does not depend on the layout
    # Seeded sampling at temperature 1 is constrained the same way.
    name, question, schema = SCHEMAS[0]
    for seed in (1, 2):
        msgs = [{"role": "user", "content": question}]
        r = c.chat.completions.create(model=SERVED, messages=msgs,
                                      max_tokens=300, temperature=1.0, seed=seed,
                                      response_format=fmt(name, schema))
        jsonschema.validate(json.loads(r.choices[0].message.content), schema)
    # /v1/completions takes the same field.
    name, question, schema = SCHEMAS[3]
    r = c.completions.create(model=SERVED, prompt="Answer as JSON. " + question, max_tokens=200,
                             temperature=0, extra_body={"response_format": fmt(name, schema)})
    jsonschema.validate(json.loads(r.choices[0].text), schema)


def check_json_object(c, layout):
    r = c.chat.completions.create(
        model=SERVED, messages=[{"role": "user", "content": "Describe Paris in JSON."}],
        max_tokens=600, temperature=0, response_format={"type": "json_object"})
    value = json.loads(r.choices[0].message.content)
    H.check(isinstance(value, dict), "%s json_object: %r" % (layout, value))
    H.log("%s json_object: %d keys, %d tokens" % (layout, len(value), r.usage.completion_tokens))


def expect_400(c, needle, **kw):
    import openai
    try:
        c.chat.completions.create(model=SERVED, messages=[{"role": "user", "content": "hi"}],
                                  max_tokens=4, **kw)
    except openai.BadRequestError as e:
        H.check(e.status_code == 400, "%r" % e)
        err = e.body if isinstance(e.body, dict) and "message" in e.body else e.body["error"]
        H.check(set(err) >= {"message", "type", "param", "code"}, "error shape %r" % e.body)
        H.check(err["type"] == "invalid_request_error" and needle in err["message"],
                "error %r lacks %r" % (err, needle))
        return
    raise H.TestFailure("accepted: %r" % kw)


def check_refusals(c):
    expect_400(c, "'sound'", response_format={"type": "sound"})
    expect_400(c, "'pattern'", response_format=fmt("p", {"type": "string", "pattern": "^a"}))
    expect_400(c, "'minimum'", response_format=fmt("p", {"type": "object", "properties": {
        "n": {"type": "integer", "minimum": 1}}}))
    expect_400(c, "logit_bias", logit_bias={"abc": 1})
    expect_400(c, "logit_bias", logit_bias={"5": 101})


def check_logit_bias(c):
    prompt = "The capital of France is"
    base = c.completions.create(model=SERVED, prompt=prompt, max_tokens=6, temperature=0)
    first = base.choices[0].tokens[0]
    banned = c.completions.create(model=SERVED, prompt=prompt, max_tokens=6, temperature=0,
                                  logit_bias={str(first): -100})
    H.check(first not in banned.choices[0].tokens, "token %d still generated: %r"
            % (first, banned.choices[0].tokens))
    forced = c.completions.create(model=SERVED, prompt=prompt, max_tokens=3, temperature=0,
                                  logit_bias={"28": 100})
    H.check(forced.choices[0].tokens == [28, 28, 28], "forced %r" % forced.choices[0].tokens)
    H.log("logit_bias: %d banned -> %r, 28 forced" % (first, banned.choices[0].tokens))


def serve(h, model, layout, nnodes, extra):
    import openai
    g = H.Gang(h, nnodes=nnodes, nproc_per_node=1,
               extra=["--model", model, "--max-ctx", str(CTX), "--max-batch", "4",
                      "--kv-cache-mb", "128", "--served-model-name", SERVED,
                      "--request-timeout-ms", "120000", "--step-timeout-ms", "20000"] + extra)
    g.start_local()
    g.wait_serving(timeout=90)
    c = openai.OpenAI(base_url="http://%s:%d/v1" % (g.addr(0), g.http_port), api_key="none",
                      max_retries=0, timeout=120)
    check_schemas(c, layout)
    if nnodes == 1:
        check_json_object(c, layout)
        check_refusals(c)
        check_logit_bias(c)
    H.check(g.stop()["local"] == 0, "the gang did not stop cleanly")


def scenario(h):
    model = H.fetch_reference("smollm2", 90)
    serve(h, model, "tp1", 1, [])
    serve(h, model, "pp2", 2, ["--tp", "1", "--pp", "2"])


if __name__ == "__main__":
    H.reexec_with_reference_python("jsonschema", "openai")
    H.run(scenario)
