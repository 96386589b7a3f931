#!/usr/bin/env python3
"""A request the gang cannot finish ends with an explicit error, never silence. A TP=2 x
PP=2 gang whose worker is frozen with SIGSTOP while requests are in flight, with a request
deadline shorter than the failure detection: every accepted request is answered 504 with
a JSON error naming the deadline, within the deadline plus the sweep period. Then, with no
restart budget (--max-restarts 0), the gang gives up, and every later request gets 503 at
once with the reason."""
import os
import signal
import sys
import threading
import time

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness as H  # noqa: E402

DEADLINE_MS = 500  # shorter than the heartbeat timeout: no abort before it


def scenario(h):
    model = H.mkmodel(h.bin, os.path.join(h.tmp, "model"), layers=2, hidden=64, heads=4,
                      kv_heads=2, ffn=128, vocab=256, max_pos=512, seed=3)
    g = H.Gang(h, nnodes=2, nproc_per_node=2,
               extra=["--model", model, "--tp", "2", "--pp", "2", "--max-restarts", "0",
                      "--give-up-linger-ms", "8000",
                      "--request-timeout-ms", str(DEADLINE_MS)])
    g.start_local(expect=(0, 75))
    g.wait_serving(timeout=60)
    code, r = H.http_post(g.addr(0), g.http_port, "/v1/completions",
                          {"prompt": [1, 2, 3], "max_tokens": 4})
    H.check(code == 200, "the healthy gang answered %r %r" % (code, r))

    victim = g.worker_pid(1, 1)
    os.kill(victim, signal.SIGSTOP)
    H.log("stopped worker rank 3 (pid %d)" % victim)
    results = [None] * 4
    started = [0.0] * 4

    def run(i):
        started[i] = time.time()
        results[i] = (H.http_post(g.addr(0), g.http_port, "/v1/completions",
                                  {"prompt": [5, i], "max_tokens": 400}, timeout=30),
                      time.time() - started[i])

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(30)
    for i, res in enumerate(results):
        H.check(res is not None, "request %d got no answer" % i)
        (code, body), took = res
        H.check(code == 504, "request %d: HTTP %r %r (expected 504)" % (i, code, body))
        H.check(isinstance(body, dict) and "deadline" in body["error"]["message"],
                "request %d: not an explicit deadline error: %r" % (i, body))
        H.check(DEADLINE_MS / 1000 - 0.05 <= took <= DEADLINE_MS / 1000 + 1.0,
                "request %d answered after %.2f s, deadline %.1f s"
                % (i, took, DEADLINE_MS / 1000))
        H.log("request %d: 504 after %.2f s: %s" % (i, took, body["error"]["message"]))

    # The gang gives up (no restart budget): owed and new requests get 503 at once.
    H.wait_until(lambda: (g.coord() or {}).get("state") == "failed", 10, 0.05,
                 "the gang to give up")
    t0 = time.time()
    code, body = H.http_post(g.addr(0), g.http_port, "/v1/completions",
                             {"prompt": [9], "max_tokens": 2}, timeout=30)
    took = time.time() - t0
    H.check(code == 503 and isinstance(body, dict) and "gave up" in body["error"]["message"],
            "a request to a gang that gave up: %r %r" % (code, body))
    H.check(took < 0.5, "the answer to a gang that gave up took %.2f s" % took)
    H.log("after give-up: %d after %.2f s: %s" % (code, took, body["error"]["message"]))
    code, text = g.get(0, "/metrics")
    H.check(code == 200 and 'ganglion_requests_total{code="504"}' in text,
            "504s are not counted in /metrics")
    try:
        os.kill(victim, signal.SIGCONT)
    except OSError:
        pass
    H.check(g.stop()["local"] in (0, 75), "local gang exit code")


if __name__ == "__main__":
    H.run(scenario)
