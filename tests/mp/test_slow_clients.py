#!/usr/bin/env python3
"""1,000 slow clients against one agent (issue #28: about 260 used to take down the API and
the probes: the HTTP server held a fixed 256 connections, first come first kept).

A tiny random model at TP 1. While 1,000 connections each send the start of a request and
then nothing (slowloris), opened faster than the idle timeout closes them, a normal client
streams a completion to its end and /healthz is asked every 50 ms: every probe is
answered 200 (within kubelet's default 1 s), the stream completes with all its tokens, the
agent logs that it shed slow connections, and the gang does not restart."""
import http.client
import json
import os
import socket
import sys
import threading
import time

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness as H  # noqa: E402

SLOW = 1000
H.TEST_DEADLINE_S = 120


def slowloris(g, stop, opened):
    """Opens SLOW connections, each with an unfinished request head; keeps them open."""
    socks = []
    try:
        for i in range(SLOW):
            if stop.is_set():
                break
            try:
                sk = socket.create_connection((g.addr(0), g.http_port), timeout=5)
                sk.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Le")
                socks.append(sk)
                opened[0] += 1
            except OSError:
                pass
            time.sleep(0.003)
        stop.wait(30)
    finally:
        for sk in socks:
            sk.close()


def scenario(h):
    model = H.mkmodel(h.bin, os.path.join(h.tmp, "model"), layers=2, hidden=16, heads=1,
                      kv_heads=1, ffn=32, vocab=256, max_pos=512, seed=3)
    g = H.Gang(h, nnodes=1, nproc_per_node=1,
               extra=["--model", model, "--max-batch", "4", "--kv-cache-mb", "32",
                      "--max-ctx", "512"])
    g.start_local()
    gen = g.wait_serving(timeout=60)
    stop, opened, probes = threading.Event(), [0], []
    flood = threading.Thread(target=slowloris, args=(g, stop, opened))
    flood.start()
    H.wait_until(lambda: opened[0] >= 300, 30, what="300 slow connections")

    def probe():
        while not stop.is_set():
            t0 = time.monotonic()
            code, _ = H.http_get(g.addr(0), g.http_port, "/healthz", timeout=2.0)
            probes.append((code, time.monotonic() - t0))
            time.sleep(0.05)

    pt = threading.Thread(target=probe)
    pt.start()
    try:
        conn = http.client.HTTPConnection(g.addr(0), g.http_port, timeout=60)
        conn.request("POST", "/v1/completions", body=json.dumps(
            {"prompt": [1, 2, 3], "max_tokens": 200, "ignore_eos": True, "stream": True}),
            headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        H.check(r.status == 200, "stream answered %d" % r.status)
        tokens = 0
        for line in r.read().decode().split("\n"):
            if line.startswith("data: {"):
                tokens += len(json.loads(line[6:])["choices"][0].get("tokens", []))
        conn.close()
        H.check(tokens == 200, "the stream carried %d of 200 tokens" % tokens)
        H.wait_until(lambda: opened[0] >= SLOW, 30, what="%d slow connections" % SLOW)
        time.sleep(0.5)  # probes with all of them open
    finally:
        stop.set()
        pt.join(10)
        flood.join(40)
    bad = [p for p in probes if p[0] != 200 or p[1] >= 1.0]
    H.check(probes and not bad, "%d of %d probes failed or were slow: %r"
            % (len(bad), len(probes), bad[:10]))
    H.check("closing the oldest ones still sending a request" in g.local.log_text(),
            "no shedding was logged")
    H.check(g.coord()["generation"] == gen, "the gang restarted")
    H.log("%d slow connections, %d probes all answered (slowest %.0f ms), a 200-token stream"
          % (opened[0], len(probes), 1000 * max(dt for _, dt in probes)))
    H.check(g.stop()["local"] == 0, "the gang did not stop cleanly")


if __name__ == "__main__":
    H.run(scenario)
