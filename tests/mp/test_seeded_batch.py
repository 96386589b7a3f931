#!/usr/bin/env python3
"""Seeded sampling does not depend on batching on the CPU backend (issue #28; docs/api.md,
"Seeded sampling and batching"; a resubmission after a gang restart relies on it): on the
real SmolLM2-135M-Instruct (its bf16 weights, then its Q4_1 GGUF), four seeded chat
requests (temperature 0.8, 24 tokens, EOS ignored) are run alone, then inside a batch of 9
and a batch of 61 concurrent requests (the others different prompts of different lengths,
so that the batches' shapes, prefill chunks and KV layouts all differ), and each must give
exactly the tokens it gave alone. Skips (77) when the model cannot be fetched
(scripts/fetch-reference.sh)."""
import json
import os
import sys
import threading

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness as H  # noqa: E402

H.TEST_DEADLINE_S = 400
TOKENS = 24
# The HF directory (bf16 weights) and the Q4_1 GGUF (int8 weights): different matmuls.
MODELS = ("smollm2", "smollm2-gguf")
TARGETS = [
    ("Tell me a story about a dragon.", 7),
    ("Write a poem about the sea.", 12345),
    ("What should I cook tonight?", 99),
    ("Describe a city on Mars in three sentences.", 2 ** 40 + 3),
]
FILLER_WORDS = ("apples rivers music winter trains clouds letters gardens mountains bread "
                "lanterns bicycles").split()


def body(prompt, seed):
    return {"messages": [{"role": "user", "content": prompt}], "max_tokens": TOKENS,
            "temperature": 0.8, "seed": seed, "ignore_eos": True}


def filler(i):
    words = " ".join(FILLER_WORDS[(i + k) % len(FILLER_WORDS)] for k in range(1 + i % 9))
    return body("Say something about %s (%d)." % (words, i), 1000 + i)


def run_batch(g, bodies):
    """Posts every body at once (one thread each); the answers' token lists, in order."""
    out = [None] * len(bodies)
    gate = threading.Barrier(len(bodies))

    def one(i):
        gate.wait(30)
        code, text = H.http_post(g.addr(0), g.http_port, "/v1/chat/completions", bodies[i],
                                 timeout=300)
        out[i] = (code, text)

    ths = [threading.Thread(target=one, args=(i,)) for i in range(len(bodies))]
    for t in ths:
        t.start()
    for t in ths:
        t.join(330)
    toks = []
    for i, r in enumerate(out):
        H.check(r is not None and r[0] == 200, "request %d of %d: %r" % (i, len(bodies), r))
        ans = json.loads(r[1]) if isinstance(r[1], str) else r[1]
        toks.append(ans["choices"][0]["tokens"])
    return toks


def scenario(h):
    for what in MODELS:
        one_model(h, what, H.fetch_reference(what, 90))


def one_model(h, what, model):
    g = H.Gang(h, nnodes=1, nproc_per_node=1,
               extra=["--model", model, "--max-ctx", "256", "--max-batch", "64",
                      "--kv-cache-mb", "512", "--request-timeout-ms", "300000"])
    g.start_local()
    g.wait_serving(timeout=120)
    H.log("%s: %s" % (what, model))
    alone = [run_batch(g, [body(p, s)])[0] for p, s in TARGETS]
    for t in alone:
        H.check(len(t) == TOKENS, "alone: %d tokens, wanted %d" % (len(t), TOKENS))
    H.log("alone: %d requests, first tokens %r" % (len(alone), [t[:4] for t in alone]))
    for size in (9, 61):
        bodies = [filler(i) for i in range(size - len(TARGETS))]
        # The targets spread over the batch (first, middle, last), not in one corner.
        for k, (p, s) in enumerate(TARGETS):
            bodies.insert((k * len(bodies)) // (len(TARGETS) - 1) if k else 0, body(p, s))
        where = [next(i for i, b in enumerate(bodies) if b == body(p, s)) for p, s in TARGETS]
        got = run_batch(g, bodies)
        for k, i in enumerate(where):
            diff = next((j for j, (a, b) in enumerate(zip(alone[k], got[i])) if a != b), None)
            H.check(got[i] == alone[k], "target %d in a batch of %d differs from alone at "
                    "token %r:\nalone %r\nbatch %r" % (k, size, diff, alone[k], got[i]))
        H.log("%s, batch of %d: the %d seeded targets gave their tokens exactly"
              % (what, size, len(TARGETS)))
    H.check(g.stop()["local"] == 0, "the gang did not stop cleanly")


if __name__ == "__main__":
    H.run(scenario)
