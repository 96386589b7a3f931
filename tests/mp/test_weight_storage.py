#!/usr/bin/env python3
"""Weights in their own precision and weight-only int8 (issue #13) on a real model:
SmolLM2-135M-Instruct (f32 safetensors) served with the weights stored as f32, as bf16
(--dtype bf16) and as int8 (--quantize int8; TP shards of packed weights are checked by
unit-layers), greedy answers to two text prompts compared token by token with the f32 gang's.

What is required (the tolerance, docs/model.md "Weight storage"):
  * the gang loads and reports the storage and its bytes in the worker's log line;
  * bf16: the first BF16_PREFIX greedy tokens of each answer equal f32's, and over the
    tokens where both answers still agree the chosen token's logprob differs from f32's by
    at most BF16_MAX_DLOGP;
  * int8: the first I8_PREFIX tokens equal f32's and the logprob difference is at most
    I8_MAX_DLOGP.
Beyond the prefix a different token is allowed (rounding the weights moves near ties);
the agreement rate (positions equal before the first difference, over all generated) and
the largest logprob difference are printed for the record. About 40 s on an idle 2-core
machine; SKIP when the model cannot be had (scripts/fetch-reference.sh smollm2)."""
import os
import re
import sys

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness as H  # noqa: E402

PROMPTS = ["The capital of France is", "def fibonacci(n):"]
MAX_TOKENS = 16
BF16_PREFIX, BF16_MAX_DLOGP = 8, 0.15
I8_PREFIX, I8_MAX_DLOGP = 4, 0.5
FETCH_TIMEOUT_S = 90
H.TEST_DEADLINE_S = 200


def answers(h, model, name, tp, flags, storage):
    """Greedy tokens and their logprobs for each prompt from a fresh local gang, whose
    workers must report weights stored as `storage`."""
    g = H.Gang(h, nnodes=1, nproc_per_node=tp, job="ws-" + name,
               extra=["--model", model, "--tp", str(tp), "--max-ctx", "256", "--max-batch", "2",
                      "--kv-cache-mb", "32", "--request-timeout-ms", "60000",
                      "--step-timeout-ms", "20000", "--start-timeout-ms", "60000"] + flags)
    g.start_local()
    g.wait_serving(timeout=90)
    out = []
    for p in PROMPTS:
        code, r = H.http_post(g.addr(0), g.http_port, "/v1/completions",
                              {"prompt": p, "max_tokens": MAX_TOKENS, "temperature": 0,
                               "logprobs": 0}, timeout=90)
        H.check(code == 200, "%s: completion answered %r %r" % (name, code, r))
        ch = r["choices"][0]
        lp = ch["logprobs"]["token_logprobs"]
        H.check(len(lp) == len(ch["tokens"]), "%s: %d logprobs for %d tokens"
                % (name, len(lp), len(ch["tokens"])))
        out.append((ch["tokens"], lp))
    codes = g.stop()
    H.check(codes.get("local") == 0, "%s: the gang exited %r" % (name, codes))
    log = g.local.tail(1000)
    # "MiB of weights (bf16 x 211)": every matrix of the shard in that storage.
    H.check(re.search(r"MiB of weights \(%s x \d+\)" % storage, log) is not None,
            "%s: no worker reported %s weights:\n%s" % (name, storage, log[-3000:]))
    return out


def compare(name, ref, got, prefix, max_dlogp):
    for i, ((rt, rl), (gt, gl)) in enumerate(zip(ref, got)):
        n = min(len(rt), len(gt))
        same = next((j for j in range(n) if rt[j] != gt[j]), n)
        dlogp = max([abs(rl[j] - gl[j]) for j in range(same)] or [0.0])
        H.log("%s prompt %d: %d of %d tokens agree with f32 before the first difference "
              "(%.0f%%), max |dlogprob| %.4f" % (name, i, same, len(rt), 100.0 * same / len(rt),
                                                 dlogp))
        H.check(same >= min(prefix, len(rt)),
                "%s prompt %d: greedy tokens differ from f32's at step %d (< %d): %r vs %r"
                % (name, i, same, prefix, gt, rt))
        H.check(dlogp <= max_dlogp, "%s prompt %d: logprob differs from f32's by %.4f > %.2f"
                % (name, i, dlogp, max_dlogp))


def scenario(h):
    model = H.fetch_reference("smollm2", FETCH_TIMEOUT_S)
    ref = answers(h, model, "f32", 1, ["--dtype", "f32"], "f32")
    bf16 = answers(h, model, "bf16", 1, ["--dtype", "bf16"], "bf16")
    i8 = answers(h, model, "int8", 1, ["--quantize", "int8"], "int8")
    compare("bf16", ref, bf16, BF16_PREFIX, BF16_MAX_DLOGP)
    compare("int8", ref, i8, I8_PREFIX, I8_MAX_DLOGP)
    H.log("f32 answers %r" % [t for t, _ in ref])


if __name__ == "__main__":
    H.run(scenario)
