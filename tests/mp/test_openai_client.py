#!/usr/bin/env python3
"""The official `openai` Python client against `ganglion serve` on the real
SmolLM2-135M-Instruct (one node, one rank, an API key):

* models.list() names the served model;
* a text completion and the same prompt as ids give the same tokens and text;
* a chat completion's greedy answer equals transformers' greedy answer token for token
  (tests/reference/hf-greedy.py on the same chat template, computed in this run), and it
  stops at the model's end-of-sequence token <|im_end|> (finish_reason "stop"); its raw
  logprobs (top 5 of every step) agree with transformers' log-softmax within 1e-4;
* streamed chat and streamed completions join to the unstreamed text, with a usage chunk;
* a wrong key raises AuthenticationError (401), a prompt beyond the context
  BadRequestError (400) whose message names both numbers.

The client and the reference come from `scripts/fetch-reference.sh python` (the script
re-runs itself with that Python when the `openai` package is not importable here);
SKIP (77) with the reason when the model or that Python cannot be had."""
import json
import os
import subprocess
import sys
import time

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness as H  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HF_GREEDY = os.path.join(ROOT, "tests", "reference", "hf-greedy.py")
KEY = "sk-ganglion-test"
SERVED = "smollm2-135m-instruct"
QUESTION = "What is the capital of France?"
CTX = 512
H.TEST_DEADLINE_S = 200  # the reference (torch) and the server share two cores


def fetch(what):
    """fetch-reference.sh WHAT, or SKIP (harness.fetch_reference)."""
    return H.fetch_reference(what, 90)


def reference(py, model):
    """transformers' greedy answer to QUESTION (ids up to and including EOS)."""
    r = subprocess.run([py, HF_GREEDY, "--model", model, "--chat", QUESTION,
                        "--max-tokens", "24", "--top5"],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       timeout=150, env=dict(os.environ, TQDM_DISABLE="1",
                                             TOKENIZERS_PARALLELISM="false"))
    H.check(r.returncode == 0, "hf-greedy.py failed: %s" % r.stderr.decode()[-1500:])
    return json.loads(r.stdout.decode().strip().splitlines()[-1])


def scenario(h):
    import openai
    model = fetch("smollm2")
    py = fetch("python")
    keyfile = os.path.join(h.tmp, "key")
    with open(keyfile, "w") as f:
        f.write(KEY)
    g = H.Gang(h, nnodes=1, nproc_per_node=1,
               extra=["--model", model, "--max-ctx", str(CTX), "--max-batch", "4",
                      "--kv-cache-mb", "256", "--served-model-name", SERVED,
                      "--api-key-file", keyfile, "--request-timeout-ms", "120000"])
    g.start_local()
    want = reference(py, model)  # while the gang loads
    g.wait_serving(timeout=90)
    base = "http://%s:%d/v1" % (g.addr(0), g.http_port)
    c = openai.OpenAI(base_url=base, api_key=KEY, max_retries=0, timeout=120)

    ids = [m.id for m in c.models.list().data]
    H.check(ids == [SERVED], "models.list(): %r" % ids)

    prompt = "The capital of France is"
    a = c.completions.create(model=SERVED, prompt=prompt, max_tokens=8, temperature=0)
    toks = json.loads(subprocess.run(
        ["curl", "-s", "-H", "Authorization: Bearer " + KEY, "-d",
         json.dumps({"prompt": prompt}), "http://%s:%d/tokenize" % (g.addr(0), g.http_port)],
        stdout=subprocess.PIPE, timeout=30).stdout)["tokens"]
    b = c.completions.create(model=SERVED, prompt=toks, max_tokens=8, temperature=0)
    H.check(a.choices[0].text == b.choices[0].text and a.choices[0].text.strip(),
            "text %r vs ids %r" % (a.choices[0].text, b.choices[0].text))
    H.log("completion: %r -> %r" % (prompt, a.choices[0].text))

    msgs = [{"role": "user", "content": QUESTION}]
    t0 = time.time()
    chat = c.chat.completions.create(model=SERVED, messages=msgs, max_tokens=24, temperature=0)
    got = chat.choices[0].tokens  # ganglion's extension: the generated ids
    H.check(got == want["ids"], "greedy chat ids differ from transformers':\n%r\n%r"
            % (got, want["ids"]))
    H.check(chat.choices[0].finish_reason == "stop", "finish %r" % chat.choices[0].finish_reason)
    # The raw logprobs of every step agree with transformers' log-softmax (top 5).
    lp = c.chat.completions.create(model=SERVED, messages=msgs, max_tokens=24, temperature=0,
                                   logprobs=True, top_logprobs=5).choices[0].logprobs.content
    H.check(len(lp) == len(want["top5"]), "%d logprob steps, %d reference steps"
            % (len(lp), len(want["top5"])))
    worst = 0.0
    for step, (ours, ref) in enumerate(zip(lp, want["top5"])):
        H.check(abs(ours.logprob - ref[0][2]) < 1e-4, "step %d: chosen logprob %r vs %r"
                % (step, ours.logprob, ref[0][2]))
        for k, (t, r5) in enumerate(zip(ours.top_logprobs, ref)):
            worst = max(worst, abs(t.logprob - r5[2]))
            H.check(abs(t.logprob - r5[2]) < 1e-4, "step %d, alternative %d: %r vs %r"
                    % (step, k, t.logprob, r5[2]))
    H.log("logprobs: %d steps x top 5, largest difference %.2e" % (len(lp), worst))
    text = chat.choices[0].message.content
    H.check("<|im_end|>" not in text and text.strip() and text in want["text"],
            "chat text %r (transformers: %r)" % (text, want["text"]))
    H.log("chat (%.1f s): %r" % (time.time() - t0, text))

    pieces, usage = [], None
    for ch in c.chat.completions.create(model=SERVED, messages=msgs, max_tokens=24,
                                        temperature=0, stream=True,
                                        stream_options={"include_usage": True}):
        if ch.usage is not None:
            usage = ch.usage
        for choice in ch.choices:
            pieces.append(choice.delta.content or "")
    H.check("".join(pieces) == text, "streamed chat %r vs %r" % ("".join(pieces), text))
    H.check(usage is not None and usage.completion_tokens == len(got),
            "stream usage %r" % usage)
    pieces = [ch.choices[0].text for ch in c.completions.create(
        model=SERVED, prompt=prompt, max_tokens=8, temperature=0, stream=True)]
    H.check("".join(pieces) == a.choices[0].text, "streamed completion %r" % pieces)

    bad = openai.OpenAI(base_url=base, api_key="sk-wrong", max_retries=0)
    try:
        bad.models.list()
        raise H.TestFailure("a wrong key was accepted")
    except openai.AuthenticationError as e:
        H.check(e.status_code == 401, "wrong key: %r" % e)
    try:
        c.completions.create(model=SERVED, prompt=[1] * (CTX + 7), max_tokens=1)
        raise H.TestFailure("a prompt beyond the context was accepted")
    except openai.BadRequestError as e:
        H.check(e.status_code == 400 and str(CTX + 7) in str(e) and str(CTX) in str(e),
                "long prompt: %r" % e)
    H.check(g.stop()["local"] == 0, "the gang did not stop cleanly")


if __name__ == "__main__":
    H.reexec_with_reference_python("openai")
    H.run(scenario)
