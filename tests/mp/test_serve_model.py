#!/usr/bin/env python3
"""Serving a model from a TP=2 x PP=2 gang (2 nodes x 2 ranks) of the real binary:
completions are answered and deterministic; GET /v1/models lists the model under its
--served-model-name with the served context (405 for other methods; node 1, which
forwards to the coordinator, lists the same), the name completions report too; node 1
answers a completion with node 0's tokens; bad requests get 400 (413 for a body over
the server's limit) with a JSON error while the gang keeps serving; and nothing is lost:
with concurrent requests in flight, kill -9 of a worker makes the gang restart and every
request still completes, with exactly the tokens it gets from a healthy gang (greedy and
seeded sampling depend only on the prompt, the seed and the position)."""
import json
import os
import signal
import sys
import threading
import time

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness as H  # noqa: E402

VOCAB = 256
CTX = 512
SERVED = "tiny-llama"  # --served-model-name; the directory's base name would be "model"


def post(g, body, timeout=60.0):
    return H.http_post(g.addr(0), g.http_port, "/v1/completions", body, timeout)


def completion(g, body):
    code, r = post(g, body)
    H.check(code == 200, "completion %r answered %r %r" % (body, code, r))
    toks = r["choices"][0]["tokens"]
    H.check(len(toks) == body["max_tokens"] or r["choices"][0]["finish_reason"] == "stop",
            "completion has %d tokens for max_tokens %d" % (len(toks), body["max_tokens"]))
    H.check(all(isinstance(t, int) and 0 <= t < VOCAB for t in toks), "bad token ids %r" % toks)
    return toks, r


def bad_requests(g):
    cases = [
        ("not JSON", b"{\"prompt\": [1, 2", 400),
        ("prompt of strings", {"prompt": ["a", "b"], "max_tokens": 2}, 400),
        ("prompt not an array", {"prompt": 7, "max_tokens": 2}, 400),
        ("empty prompt", {"prompt": [], "max_tokens": 2}, 400),
        ("no prompt", {"max_tokens": 2}, 400),
        ("prompt longer than the context", {"prompt": [1] * (CTX + 5), "max_tokens": 1}, 400),
        ("max_tokens 0", {"prompt": [1, 2], "max_tokens": 0}, 400),
        ("max_tokens negative", {"prompt": [1, 2], "max_tokens": -3}, 400),
        ("max_tokens a string", {"prompt": [1, 2], "max_tokens": "4"}, 400),
        ("prompt + max_tokens beyond the context", {"prompt": [1] * 10, "max_tokens": CTX}, 400),
        ("unknown token id", {"prompt": [1, VOCAB], "max_tokens": 2}, 400),
        ("negative token id", {"prompt": [-1], "max_tokens": 2}, 400),
        ("temperature negative", {"prompt": [1], "max_tokens": 2, "temperature": -1}, 400),
        ("body over the size limit", b"{\"prompt\": [" + b"1," * 4500000 + b"1]}", 413),
    ]
    for what, body, want in cases:
        code, r = post(g, body, timeout=10)
        H.check(code == want, "%s: HTTP %r (expected %d): %r" % (what, code, want, r))
        H.check(isinstance(r, dict) and "error" in r and r["error"].get("message"),
                "%s: the answer is not a JSON error: %r" % (what, r))
        H.log("%s -> %d %s" % (what, code, r["error"]["message"]))
    code, r = H.http_get(g.addr(0), g.http_port, "/v1/completions")
    H.check(code == 405, "GET /v1/completions answered %r" % code)
    q = {"prompt": [1, 2, 3], "max_tokens": 5}
    c0, r0 = H.http_post(g.addr(0), g.http_port, "/v1/completions", q, timeout=30)
    code, r = H.http_post(g.addr(1), g.http_port, "/v1/completions", q, timeout=30)
    H.check(c0 == 200 and code == 200 and r["choices"][0]["tokens"] == r0["choices"][0]["tokens"],
            "node 1 (forwarding) answered %r %r, node 0 %r %r" % (code, r, c0, r0))


def models(g, started):
    code, text = g.get(0, "/v1/models")
    H.check(code == 200, "GET /v1/models answered %r %r" % (code, text))
    r = json.loads(text)
    H.check(r.get("object") == "list" and isinstance(r.get("data"), list) and len(r["data"]) == 1,
            "GET /v1/models is not a list of one model: %r" % r)
    m = r["data"][0]
    H.check(m.get("id") == SERVED and m.get("object") == "model" and m.get("owned_by") == "ganglion"
            and m.get("max_model_len") == CTX
            and m.get("max_model_len_reason", "").startswith("the model's declared context"),
            "GET /v1/models: %r" % m)
    H.check(isinstance(m.get("created"), int) and started - 1 <= m["created"] <= time.time(),
            "created %r is not the agent's start (after %d)" % (m.get("created"), started))
    code, r = H.http_post(g.addr(0), g.http_port, "/v1/models", {})
    H.check(code == 405 and isinstance(r, dict)
            and r.get("error", {}).get("code") == "method_not_allowed"
            and r["error"].get("message"), "POST /v1/models answered %r %r" % (code, r))
    code, text = g.get(1, "/v1/models")
    H.check(code == 200 and json.loads(text)["data"][0]["id"] == SERVED,
            "node 1 answered %r %r to /v1/models" % (code, text))
    H.log("models: %r" % m)


def scenario(h):
    model = H.mkmodel(h.bin, os.path.join(h.tmp, "model"), layers=4, hidden=64, heads=4,
                      kv_heads=2, ffn=128, vocab=VOCAB, max_pos=CTX, seed=7)
    g = H.Gang(h, nnodes=2, nproc_per_node=2,
               extra=["--model", model, "--tp", "2", "--pp", "2", "--microbatches", "2",
                      "--max-batch", "8", "--kv-cache-mb", "16", "--request-timeout-ms",
                      "60000", "--step-timeout-ms", "5000", "--served-model-name", SERVED])
    started = int(time.time())
    g.start_local()
    gen0 = g.wait_serving(timeout=60)

    # Deterministic answers: greedy twice, seeded sampling twice.
    greedy = {"prompt": [1, 5, 9, 13], "max_tokens": 12}
    a, r = completion(g, greedy)
    b, _ = completion(g, greedy)
    H.check(a == b, "greedy answers differ: %r vs %r" % (a, b))
    t = r["timings"]
    H.check(t["total_ms"] > 0 and t["generations"] == 1, "timings %r" % t)
    H.check(r["model"] == SERVED, "completions report the model as %r" % r["model"])
    models(g, started)
    sampled = {"prompt": [3, 4], "max_tokens": 10, "temperature": 0.8, "top_p": 0.9, "seed": 42}
    s1, _ = completion(g, sampled)
    s2, _ = completion(g, sampled)
    H.check(s1 == s2, "seeded sampling differs: %r vs %r" % (s1, s2))
    H.log("greedy %r, sampled %r" % (a, s1))

    bad_requests(g)
    c, _ = completion(g, greedy)
    H.check(c == a, "after the bad requests the answer changed: %r vs %r" % (c, a))

    # Reference answers of a healthy gang for the load below.
    reqs = [{"prompt": [(7 * i + k) % VOCAB for k in range(3 + i % 5)], "max_tokens": CTX - 32,
             "temperature": 0.0 if i % 2 == 0 else 0.7, "seed": 100 + i} for i in range(8)]
    ref = [completion(g, q)[0] for q in reqs]

    # Nothing lost: the same requests concurrently, and kill -9 of a worker mid-flight.
    results = [None] * len(reqs)

    def run(i):
        results[i] = post(g, reqs[i], timeout=90)

    victim = g.worker_pid(1, 1)  # looked up first: the kill must follow the load at once
    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(reqs))]
    for th in threads:
        th.start()

    def in_flight():
        code, text = g.get(0, "/metrics")
        if code != 200:
            return None
        for line in text.splitlines():
            if line.startswith("ganglion_requests_in_flight ") and float(line.split()[1]) > 0:
                return True
        return None

    H.wait_until(in_flight, 10, 0.002, "requests in flight")
    os.kill(victim, signal.SIGKILL)
    H.log("killed worker rank 3 (pid %d) with requests in flight" % victim)
    for th in threads:
        th.join(120)
    for i, res in enumerate(results):
        H.check(res is not None and res[0] == 200, "request %d lost: %r" % (i, res))
        toks = res[1]["choices"][0]["tokens"]
        H.check(toks == ref[i], "request %d after the restart: %r, healthy gang: %r"
                % (i, toks, ref[i]))
    gens = [res[1]["timings"]["generations"] for res in results]
    H.log("generations per request: %r" % gens)
    gen1 = g.wait_serving(timeout=30, min_gen=gen0)
    H.check(gen1 > gen0, "the gang did not restart")
    H.check(max(gens) >= 2, "no request was re-run after the restart: %r" % gens)
    code, text = g.get(0, "/metrics")
    H.check(code == 200 and "ganglion_request_seconds_bucket" in text
            and "ganglion_request_resubmits_total" in text, "request metrics missing")
    H.check(g.stop()["local"] == 0, "local gang did not exit 0")


if __name__ == "__main__":
    H.run(scenario)
