#!/usr/bin/env python3
"""Soak: six clients send completions (greedy and seeded sampling, 1-60 tokens) without
pause to a TP=2 x PP=2 gang for 15 s while a random worker is killed (SIGKILL) or frozen
(SIGSTOP) every 0.3-1.5 s. Every answer must be 200 with exactly the tokens the healthy
gang gave for that request: nothing lost, nothing mixed between generations."""
import os
import random
import signal
import sys
import threading
import time

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness as H  # noqa: E402

def scenario(h):
    model = H.mkmodel(h.bin, os.path.join(h.tmp, "model"), layers=4, hidden=64, heads=4,
                      kv_heads=2, ffn=128, vocab=256, max_pos=256, seed=11)
    g = H.Gang(h, nnodes=2, nproc_per_node=2,
               extra=["--model", model, "--tp", "2", "--pp", "2", "--microbatches", "2",
                      "--max-batch", "4", "--kv-cache-mb", "16", "--request-timeout-ms", "60000",
                      "--max-restarts", "1000",
                      # A formation that never completes is aborted after 5 s, not the
                      # default 60 s: once in a dozen runs one stalled (see the closing
                      # note of 2026-11-30); the deadline is the designed bound for it.
                      "--start-timeout-ms", "5000"])
    g.start_local()
    g.wait_serving(timeout=60)
    rng = random.Random(1)
    reqs = [{"prompt": [rng.randrange(256) for _ in range(rng.randrange(1, 9))],
             "max_tokens": rng.randrange(1, 60), "temperature": rng.choice([0.0, 0.9]),
             "seed": i} for i in range(40)]
    ref = []
    for q in reqs:
        c, r = H.http_post(g.addr(0), g.http_port, "/v1/completions", q, timeout=60)
        H.check(c == 200, "ref %r %r" % (c, r))
        ref.append(r["choices"][0]["tokens"])
    stop = threading.Event()
    bad = []
    done = [0]
    def client(k):
        """Cycles through the requests from offset k until told to stop."""
        i = k
        while not stop.is_set():
            q = reqs[i % len(reqs)]
            c, r = H.http_post(g.addr(0), g.http_port, "/v1/completions", q, timeout=90)
            if c != 200 or r["choices"][0]["tokens"] != ref[i % len(reqs)]:
                bad.append((i, c, r))
            done[0] += 1
            i += 7
    ths = [threading.Thread(target=client, args=(k,)) for k in range(6)]
    for t in ths:
        t.start()
    t_end = time.time() + 15
    kills = 0
    while time.time() < t_end:
        time.sleep(rng.uniform(0.3, 1.5))
        node, lr = rng.randrange(2), rng.randrange(2)
        try:
            pid = g.worker_pid(node, lr)
            os.kill(pid, rng.choice([signal.SIGKILL, signal.SIGKILL, signal.SIGSTOP]))
            kills += 1
        except Exception as e:
            H.log("kill failed: %r" % e)
    stop.set()
    for t in ths:
        t.join(120)
    H.log("requests done %d, kills %d, bad %d" % (done[0], kills, len(bad)))
    H.check(not bad, "bad answers: %r" % bad[:3])
    H.check(kills >= 5 and done[0] >= 50, "too little happened: %d kills, %d requests"
            % (kills, done[0]))
    H.log("the gang is in generation %r" % g.coord()["generation"])
    H.check(g.stop()["local"] == 0, "local gang did not exit 0")


if __name__ == "__main__":
    H.run(scenario)
