#!/usr/bin/env python3
"""A request that reaches its deadline ends with the tokens it has (200, finish_reason
"length": issue #28, no 504 that drops generated text) and is cancelled in the gang, so it
stops holding a KV slot: with one slot (--max-batch 1), a long request (1000 tokens, far
more than fit in the deadline) is cut at the deadline and the short request sent right after
it is answered 200 within the same deadline — which it could not be if the long one kept
its slot until its last token. /metrics counts the cancellation. (A request without any
token by its deadline is still 504: test_request_deadline.py.)"""
import os
import sys
import time

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness as H  # noqa: E402

DEADLINE_MS = 300


def scenario(h):
    model = H.mkmodel(h.bin, os.path.join(h.tmp, "model"), layers=4, hidden=256, heads=8,
                      kv_heads=4, ffn=512, vocab=512, max_pos=1100, seed=9)
    g = H.Gang(h, nnodes=1, nproc_per_node=2,
               extra=["--model", model, "--tp", "2", "--pp", "1", "--max-batch", "1",
                      "--kv-cache-mb", "64", "--request-timeout-ms", str(DEADLINE_MS)])
    g.start_local()
    g.wait_serving(timeout=60)
    t0 = time.time()
    code, body = H.http_post(g.addr(0), g.http_port, "/v1/completions",
                             {"prompt": [1, 2, 3], "max_tokens": 1000}, timeout=30)
    took = time.time() - t0
    H.check(code == 200 and body["choices"][0]["finish_reason"] == "length"
            and 0 < len(body["choices"][0]["tokens"]) < 1000 and took < 3.0,
            "the long request: %r %r after %.2f s" % (code, str(body)[:300], took))
    H.log("long request: cut at its deadline after %.2f s with %d tokens"
          % (took, len(body["choices"][0]["tokens"])))
    t0 = time.time()
    code, body = H.http_post(g.addr(0), g.http_port, "/v1/completions",
                             {"prompt": [4, 5, 6], "max_tokens": 4}, timeout=30)
    took = time.time() - t0
    H.check(code == 200, "the short request after the cancelled one: %r %r after %.2f s"
            % (code, body, took))
    H.log("short request: 200 after %.3f s (its slot was freed)" % took)
    code, text = g.get(0, "/metrics")
    H.check(code == 200 and "ganglion_request_cancels_total 1" in text,
            "the cancellation is not counted: %s" %
            [ln for ln in text.splitlines() if "cancels" in ln])
    H.check(g.stop()["local"] == 0, "local gang did not exit 0")


if __name__ == "__main__":
    H.run(scenario)
