#!/usr/bin/env python3
"""The text API of a TP=1 x PP=2 gang of the real binary, on a tiny random model that
carries SmolLM2's real tokenizer and chat template (so it runs in seconds; greedy answers
of the real SmolLM2 are checked against transformers in test_smollm2_greedy.py and
test_openai_client.py):

* text completions: the text is the detokenized tokens; a text prompt gives the tokens
  its /tokenize ids give; arrays of prompts get one choice each;
* chat completions through the chat template, streamed and not: the streamed deltas join
  to the unstreamed text, the finish reasons agree, a usage chunk comes with
  stream_options.include_usage, and the stream ends with [DONE];
* stop strings (matched across token boundaries, cut before the match, streamed the
  same), stop ids, ignore_eos, logprobs and top_logprobs;
* --api-key-file: 401 without or with a wrong key, probes stay open;
* errors in OpenAI's shape: a prompt longer than the context names both numbers, an
  unknown model 404, n over 16 400;
* a 32k-id prompt is accepted (the agent hands it to rank 0 in pieces);
* a worker killed in the middle of a streamed answer: the stream completes with exactly
  the healthy gang's text, nothing repeated and nothing missing.
Skips (77) when the tokenizer and template cannot be fetched (scripts/fetch-reference.sh)."""
import http.client
import json
import os
import shutil
import signal
import subprocess
import sys
import time

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness as H  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CTX = 40000
KEY = "sk-test-0123456789"
GEN_REP = 1.3  # generation_config.json's repetition_penalty: every request's default
H.TEST_DEADLINE_S = 200  # a 32k-id prompt and a restart mid-stream, on two cores


def reference_dir():
    r = subprocess.run(["bash", os.path.join(ROOT, "scripts", "fetch-reference.sh"), "smollm2"],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=1800)
    if r.returncode != 0 or not r.stdout.strip():
        raise H.TestSkip("scripts/fetch-reference.sh smollm2 failed: %s"
                         % r.stderr.decode()[-400:])
    return r.stdout.decode().strip().splitlines()[-1]


class Client:
    def __init__(self, g, key=KEY):
        self.addr, self.port, self.key = g.addr(0), g.http_port, key

    def req(self, method, path, body=None, key=None, timeout=60):
        conn = http.client.HTTPConnection(self.addr, self.port, timeout=timeout)
        hdr = {"Content-Type": "application/json"}
        k = self.key if key is None else key
        if k:
            hdr["Authorization"] = "Bearer " + k
        try:
            conn.request(method, path, body=json.dumps(body) if body is not None else None,
                         headers=hdr)
            r = conn.getresponse()
            text = r.read().decode()
            try:
                return r.status, json.loads(text)
            except ValueError:
                return r.status, text
        finally:
            conn.close()

    def post(self, path, body, **kw):
        return self.req("POST", path, body, **kw)

    def ok(self, path, body):
        code, r = self.post(path, body)
        H.check(code == 200, "%s %r answered %r %r" % (path, body, code, r))
        return r

    def stream(self, path, body, on_event=None, timeout=120):
        """POSTs with stream=true; returns the list of parsed events (without [DONE]) and
        whether [DONE] came. on_event(i, ev) is called as they arrive."""
        body = dict(body, stream=True)
        conn = http.client.HTTPConnection(self.addr, self.port, timeout=timeout)
        conn.request("POST", path, body=json.dumps(body),
                     headers={"Content-Type": "application/json",
                              "Authorization": "Bearer " + self.key})
        r = conn.getresponse()
        if r.status != 200:  # (the body is read only then: it is the stream itself)
            raise H.TestFailure("stream answered %r %r" % (r.status, r.read()[:300]))
        H.check(r.getheader("Content-Type", "").startswith("text/event-stream"),
                "stream content type %r" % r.getheader("Content-Type"))
        events, done = [], False
        for raw in r:
            line = raw.decode().rstrip("\r\n")
            if not line:
                continue
            H.check(line.startswith("data: "), "not an SSE data line: %r" % line)
            data = line[6:]
            if data == "[DONE]":
                done = True
                continue
            ev = json.loads(data)
            H.check("error" not in ev, "error event %r" % ev)
            events.append(ev)
            if on_event:
                on_event(len(events) - 1, ev)
        conn.close()
        return events, done


def joined(events, chat):
    out = {}
    for ev in events:
        for ch in ev.get("choices", []):
            piece = (ch.get("delta", {}).get("content") or "") if chat else ch.get("text", "")
            out[ch["index"]] = out.get(ch["index"], "") + piece
    return out


def finishes(events):
    return {ch["index"]: ch["finish_reason"] for ev in events for ch in ev.get("choices", [])
            if ch.get("finish_reason")}


def check_text(c):
    prompt = "The quick brown fox jumps over the lazy dog. Numbers: 12345, émoji 😀."
    toks = c.ok("/tokenize", {"prompt": prompt})
    H.check(toks["count"] == len(toks["tokens"]) > 10 and toks["max_model_len"] == CTX,
            "tokenize %r" % toks)
    back = c.ok("/detokenize", {"tokens": toks["tokens"]})
    H.check(back["prompt"] == prompt, "detokenize gave %r" % back["prompt"])
    body = {"max_tokens": 24, "ignore_eos": True}
    a = c.ok("/v1/completions", dict(body, prompt=prompt))
    b = c.ok("/v1/completions", dict(body, prompt=toks["tokens"]))
    ca, cb = a["choices"][0], b["choices"][0]
    H.check(ca["tokens"] == cb["tokens"] and ca["text"] == cb["text"],
            "text and id prompts differ: %r vs %r" % (ca, cb))
    H.check(a["usage"]["prompt_tokens"] == toks["count"] and
            a["usage"]["completion_tokens"] == 24 == len(ca["tokens"]), "usage %r" % a["usage"])
    d = c.ok("/detokenize", {"tokens": ca["tokens"]})
    H.check(d["prompt"] == ca["text"], "text %r is not the decoded tokens %r" % (ca["text"], d))
    many = c.ok("/v1/completions", dict(body, prompt=[prompt, "Second prompt", toks["tokens"]]))
    H.check([ch["index"] for ch in many["choices"]] == [0, 1, 2] and
            many["choices"][0]["tokens"] == ca["tokens"] and
            many["choices"][2]["tokens"] == ca["tokens"], "array of prompts: %r" % many)
    H.log("text completion: %r" % ca["text"])
    return prompt, ca


def check_stream(c, prompt):
    msgs = [{"role": "system", "content": "You are terse."},
            {"role": "user", "content": [{"type": "text", "text": prompt}]}]
    body = {"messages": msgs, "max_tokens": 40, "ignore_eos": True}
    full = c.ok("/v1/chat/completions", body)
    H.check(full["object"] == "chat.completion" and
            full["choices"][0]["message"]["role"] == "assistant", "chat answer %r" % full)
    text = full["choices"][0]["message"]["content"]
    events, done = c.stream("/v1/chat/completions",
                            dict(body, stream_options={"include_usage": True}))
    H.check(done, "the chat stream did not end with [DONE]: %r" % events[-3:])
    H.check(joined(events, True) == {0: text}, "streamed %r != %r" % (joined(events, True), text))
    H.check(finishes(events) == {0: full["choices"][0]["finish_reason"]},
            "finish reasons %r vs %r" % (finishes(events), full["choices"][0]))
    H.check(events[0]["choices"][0]["delta"].get("role") == "assistant", "first chunk %r"
            % events[0])
    # The same counts; the streamed request ran second, so the prefix cache gave it the
    # prompt's full blocks (16-token blocks of its 44 tokens: 32), the first one none.
    counts = ("prompt_tokens", "completion_tokens", "total_tokens")
    usage = events[-1].get("usage") or {}
    H.check(events[-1]["choices"] == [] and all(usage.get(c) == full["usage"][c] for c in counts),
            "usage chunk %r vs %r" % (events[-1], full["usage"]))
    H.check(full["usage"]["prompt_tokens_details"]["cached_tokens"] == 0 and
            usage["prompt_tokens_details"]["cached_tokens"] ==
            full["usage"]["prompt_tokens"] // 16 * 16,
            "cached_tokens %r then %r" % (full["usage"], usage))
    H.check(all(ev["object"] == "chat.completion.chunk" for ev in events), "chunk objects")
    ctext = c.ok("/v1/completions", {"prompt": prompt, "max_tokens": 30, "ignore_eos": True})
    events, done = c.stream("/v1/completions",
                            {"prompt": prompt, "max_tokens": 30, "ignore_eos": True})
    H.check(done and joined(events, False) == {0: ctext["choices"][0]["text"]},
            "streamed completion %r vs %r" % (joined(events, False), ctext["choices"][0]))
    H.log("chat: %r (%d chunks)" % (text, len(events)))
    return ctext["choices"][0]["text"]


def metric(g, name):
    code, text = g.get(0, "/metrics")
    H.check(code == 200, "/metrics answered %r" % code)
    for ln in text.splitlines():
        if ln.startswith(name + " "):
            return float(ln.split()[1])
    raise H.TestFailure("no metric %s" % name)


def check_client_gone(c, g, prompt):
    """A client that leaves mid-stream: its request is cancelled in the gang."""
    cancels, gone = metric(g, "ganglion_request_cancels_total"), \
        metric(g, "ganglion_request_client_gone_total")
    conn = http.client.HTTPConnection(c.addr, c.port, timeout=60)
    conn.request("POST", "/v1/completions", body=json.dumps(
        {"prompt": prompt, "max_tokens": 3000, "ignore_eos": True, "stream": True}),
        headers={"Content-Type": "application/json", "Authorization": "Bearer " + c.key})
    r = conn.getresponse()
    for _ in range(4):
        r.fp.readline()
    conn.sock.shutdown(2)
    conn.close()
    H.wait_until(lambda: metric(g, "ganglion_request_client_gone_total") > gone, 20,
                 what="the server noticing the client left")
    H.check(metric(g, "ganglion_request_cancels_total") > cancels,
            "the request of a client that left was not cancelled in the gang")
    c.ok("/v1/completions", {"prompt": prompt, "max_tokens": 2})


def check_stops(c, prompt, text, g):
    # A stop string from the middle of the greedy text, likely spanning tokens.
    mid = len(text) // 2
    stop = text[mid:mid + 5]
    want = text[:text.index(stop)]
    body = {"prompt": prompt, "max_tokens": 30, "ignore_eos": True, "stop": [stop]}
    cancels = metric(g, "ganglion_request_cancels_total")
    r = c.ok("/v1/completions", body)
    H.check(metric(g, "ganglion_request_cancels_total") == cancels + 1,
            "a stop string did not cancel the rest of the request in the gang")
    H.check(r["choices"][0]["text"] == want and r["choices"][0]["finish_reason"] == "stop",
            "stop %r: %r (want %r)" % (stop, r["choices"][0], want))
    events, done = c.stream("/v1/completions", body)
    H.check(done and joined(events, False) == {0: want} and finishes(events) == {0: "stop"},
            "streamed stop: %r" % joined(events, False))
    full = c.ok("/v1/completions", {"prompt": prompt, "max_tokens": 30, "ignore_eos": True})
    ids = full["choices"][0]["tokens"]
    r = c.ok("/v1/completions", {"prompt": prompt, "max_tokens": 30, "ignore_eos": True,
                                 "stop": [ids[5]]})
    H.check(r["choices"][0]["tokens"] == ids[:ids.index(ids[5]) + 1] and
            r["choices"][0]["finish_reason"] == "stop", "stop id: %r" % r["choices"][0])
    H.log("stop %r -> %r" % (stop, want))


def check_logprobs(c, prompt):
    r = c.ok("/v1/completions", {"prompt": prompt, "max_tokens": 6, "ignore_eos": True,
                                 "logprobs": 3, "repetition_penalty": 1.0})
    lp = r["choices"][0]["logprobs"]
    H.check(len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == 6,
            "logprobs %r" % lp)
    for i in range(6):
        top = lp["top_logprobs"][i]
        H.check(1 <= len(top) <= 3 and lp["token_logprobs"][i] <= 0 and
                abs(max(top.values()) - lp["token_logprobs"][i]) < 1e-5,
                "greedy token %d is not the top alternative: %r" % (i, lp))
    plain = c.ok("/v1/completions", {"prompt": prompt, "max_tokens": 12, "ignore_eos": True,
                                     "repetition_penalty": 1.0})
    # generation_config.json's repetition_penalty is the default of a request without one.
    dflt = c.ok("/v1/completions", {"prompt": prompt, "max_tokens": 12, "ignore_eos": True})
    expl = c.ok("/v1/completions", {"prompt": prompt, "max_tokens": 12, "ignore_eos": True,
                                    "repetition_penalty": GEN_REP})
    H.check(dflt["choices"][0]["tokens"] == expl["choices"][0]["tokens"] !=
            plain["choices"][0]["tokens"], "generation_config.json's default is not applied")
    pen = {"prompt": prompt, "max_tokens": 12, "ignore_eos": True, "frequency_penalty": 2.0,
           "presence_penalty": 1.0, "repetition_penalty": 1.5}
    p1, p2 = c.ok("/v1/completions", pen), c.ok("/v1/completions", pen)
    H.check(p1["choices"][0]["tokens"] == p2["choices"][0]["tokens"] !=
            plain["choices"][0]["tokens"], "penalties changed nothing or are not deterministic")
    r = c.ok("/v1/chat/completions", {"messages": [{"role": "user", "content": prompt}],
                                      "max_tokens": 4, "ignore_eos": True, "logprobs": True,
                                      "repetition_penalty": 1.0,
                                      "top_logprobs": 2})
    content = r["choices"][0]["logprobs"]["content"]
    H.check(len(content) == 4 and all(len(e["top_logprobs"]) == 2 and e["logprob"] <= 0
                                      and isinstance(e["bytes"], list) for e in content),
            "chat logprobs %r" % content)


def check_errors(c, g):
    code, r = c.post("/v1/completions", {"prompt": "hi"}, key="")
    H.check(code == 401 and r["error"]["code"] == "invalid_api_key", "no key: %r %r" % (code, r))
    code, r = c.post("/v1/completions", {"prompt": "hi"}, key="sk-wrong")
    H.check(code == 401, "wrong key: %r" % code)
    code, _ = g.get(0, "/readyz")
    H.check(code == 200, "/readyz needs no key: %r" % code)
    cases = [
        ({"prompt": [1] * (CTX + 3)}, 400, ["%d" % (CTX + 3), "%d" % CTX]),
        ({"prompt": "hi", "model": "gpt-4"}, 404, ["gpt-4"]),
        ({"prompt": "hi", "n": 17}, 400, ["'n'"]),
        ({"prompt": "hi", "stop": [""]}, 400, ["stop"]),
        ({"prompt": "hi", "logprobs": 99}, 400, ["logprobs"]),
        ({"prompt": "hi", "presence_penalty": 3}, 400, ["presence_penalty"]),
    ]
    for body, want, words in cases:
        code, r = c.post("/v1/completions", body)
        H.check(code == want and all(w in r["error"]["message"] for w in words),
                "%r -> %r %r" % (str(body)[:60], code, r))
    code, r = c.post("/v1/chat/completions", {"messages": []})
    H.check(code == 400, "empty messages: %r" % code)


def check_long_prompt(c):
    ids = [(i * 7919) % 40000 + 100 for i in range(32768)]
    t0 = time.time()
    r = c.ok("/v1/completions", {"prompt": ids, "max_tokens": 2, "ignore_eos": True})
    H.check(r["usage"]["prompt_tokens"] == 32768 and len(r["choices"][0]["tokens"]) == 2,
            "32k prompt: %r" % r["usage"])
    H.log("a 32768-id prompt answered in %.1f s" % (time.time() - t0))


def check_restart(c, g, prompt):
    body = {"prompt": prompt, "max_tokens": 600, "ignore_eos": True}
    ref = c.ok("/v1/completions", body)["choices"][0]["text"]
    victim = g.worker_pid(1, 0)
    gen0 = g.coord()["generation"]
    killed = []

    def on_event(i, ev):
        if i == 20 and not killed:
            os.kill(victim, signal.SIGKILL)
            killed.append(time.time())

    events, done = c.stream("/v1/completions", body, on_event)
    H.check(killed, "the stream ended before the kill (%d events)" % len(events))
    got = joined(events, False)[0]
    H.check(done and got == ref, "after the kill the stream differs:\n%r\n%r" % (got, ref))
    gen1 = g.wait_serving(timeout=60, min_gen=gen0)
    code, text = g.get(0, "/metrics")
    mism = [ln for ln in text.splitlines()
            if ln.startswith("ganglion_request_rerun_mismatches_total ")]
    H.check(mism and float(mism[0].split()[1]) == 0, "re-run mismatches: %r" % mism)
    H.log("stream survived the kill (generation %d -> %d, %d chunks)" % (gen0, gen1, len(events)))


def check_generate(h, model):
    """ganglion generate --prompt / --chat print text."""
    for flag, what in (("--prompt", "Hello there"), ("--chat", "Hi!")):
        r = subprocess.run([h.bin, "generate", "--model", model, flag, what, "--max-tokens", "4",
                            "--max-ctx", "256", "--kv-cache-mb", "8"], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, timeout=60, env=h.clean_env())
        out = r.stdout.decode()
        H.check(r.returncode == 0 and out.strip() and not out.lstrip().startswith("{"),
                "generate %s: %d %r %r" % (flag, r.returncode, out, r.stderr.decode()[-500:]))
    r = subprocess.run([h.bin, "generate", "--model", model, "--prompt", "a", "--chat", "b"],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=30)
    H.check(r.returncode == 2 and b"one of" in r.stderr, "two prompts: %r" % r.stderr)


def scenario(h):
    ref = reference_dir()
    model = H.mkmodel(h.bin, os.path.join(h.tmp, "model"), layers=2, hidden=16, heads=1,
                      kv_heads=1, ffn=32, vocab=49152, max_pos=CTX, seed=11)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(ref, f), os.path.join(model, f))
    with open(os.path.join(model, "generation_config.json"), "w") as f:
        json.dump({"repetition_penalty": GEN_REP}, f)
    keyfile = os.path.join(h.tmp, "api-key")
    with open(keyfile, "w") as f:
        f.write(KEY + "\n")
    g = H.Gang(h, nnodes=2, nproc_per_node=1,
               extra=["--model", model, "--tp", "1", "--pp", "2", "--max-batch", "4",
                      "--kv-cache-mb", "160", "--max-ctx", str(CTX), "--max-step-tokens", "4096",
                      "--request-timeout-ms", "120000", "--step-timeout-ms", "20000",
                      "--api-key-file", keyfile])
    g.start_local()
    g.wait_serving(timeout=60)
    c = Client(g)
    prompt, _ = check_text(c)
    text = check_stream(c, prompt)
    check_stops(c, prompt, text, g)
    check_client_gone(c, g, prompt)
    check_logprobs(c, prompt)
    check_errors(c, g)
    check_long_prompt(c)
    check_restart(c, g, prompt)
    H.check(g.stop()["local"] == 0, "the gang did not stop cleanly")
    check_generate(h, model)


if __name__ == "__main__":
    H.run(scenario)
