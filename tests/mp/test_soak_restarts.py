#!/usr/bin/env python3
"""Soak: six clients send completions (greedy and seeded sampling, 1-60 tokens) without
pause to a TP=2 x PP=2 gang for 15 s, spread over both agents (node 0, the coordinator,
serves them; node 1 forwards its own to it, issue #14), while a random worker is killed
(SIGKILL) or frozen (SIGSTOP) every 0.3-1.5 s and, twice, the coordinator's agent itself
is killed (SIGKILL: its workers go with it; local mode starts it again). Every request
not held by the killed agent must be answered 200 with exactly the tokens the healthy gang
gave for it: nothing lost, nothing mixed between generations. Only node 0's own requests
that were in flight (or arrived while it was down) at a coordinator kill may fail, and
only with the connection (no answer)."""
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
    bad, lost0 = [], []
    done = [0, 0]
    coord_kills = []  # (wall time of the kill, wall time the restarted agent answered)

    def overlaps_kill(t0, t1):
        """Whether [t0, t1] meets the time node 0 was down for a coordinator kill."""
        return any(t0 <= (up if up is not None else t1) and t1 >= k for k, up in coord_kills)

    def client(k):
        """Cycles through the requests from offset k on node k % 2 until told to stop."""
        i, node = k, k % 2
        while not stop.is_set():
            q = reqs[i % len(reqs)]
            t0 = time.time()
            c, r = H.http_post(g.addr(node), g.http_port, "/v1/completions", q, timeout=90)
            t1 = time.time()
            if c == 200 and isinstance(r, dict) and r["choices"][0]["tokens"] == ref[i % len(reqs)]:
                done[node] += 1
            elif node == 0 and c is None and overlaps_kill(t0, t1 + 0.5):
                # Held by the killed agent (lost with it, by design), or refused while it
                # was down: only requests in flight at a kill count as lost.
                if any(t0 < k <= t1 for k, _ in coord_kills):
                    lost0.append((i, r))
                time.sleep(0.05)
            else:
                bad.append((node, i, c, r))
            i += 7
    ths = [threading.Thread(target=client, args=(k,)) for k in range(6)]
    for t in ths:
        t.start()
    t_start = time.time()
    t_end = t_start + 15
    kills = 0
    coord_at = [t_start + 4, t_start + 10]
    while time.time() < t_end:
        time.sleep(rng.uniform(0.3, 1.5))
        try:
            if coord_at and time.time() >= coord_at[0]:
                coord_at.pop(0)
                pid = g.agent_pid(0)
                coord_kills.append([time.time(), None])
                os.kill(pid, signal.SIGKILL)
                H.log("killed the coordinator agent (pid %d)" % pid)
                H.wait_until(lambda: g.status(0), 20, 0.02, "node 0 to come back")
                coord_kills[-1][1] = time.time()
                continue
            node, lr = rng.randrange(2), rng.randrange(2)
            pid = g.worker_pid(node, lr)
            os.kill(pid, rng.choice([signal.SIGKILL, signal.SIGKILL, signal.SIGSTOP]))
            kills += 1
        except Exception as e:
            H.log("kill failed: %r" % e)
    stop.set()
    for t in ths:
        t.join(120)
    H.log("requests answered %d on node 0 and %d forwarded by node 1; worker kills %d, "
          "coordinator kills %d; in flight on node 0 at a kill (lost with it) %d; bad %d"
          % (done[0], done[1], kills, len(coord_kills), len(lost0), len(bad)))
    H.check(not bad, "bad answers (node, request, code, answer): %r" % bad[:3])
    H.check(kills >= 5 and len(coord_kills) == 2 and done[0] >= 20 and done[1] >= 20,
            "too little happened: %d worker kills, %d coordinator kills, %r requests"
            % (kills, len(coord_kills), done))
    H.log("the gang is in generation %r" % g.coord()["generation"])
    H.check(g.stop()["local"] == 0, "local gang did not exit 0")


if __name__ == "__main__":
    H.run(scenario)
