#!/usr/bin/env python3
"""Tokenization runs off the agent's loop thread (issue #28): with a context long enough
that an 8 MiB text prompt is not refused by its size alone (--max-ctx 32768: SmolLM2's
tokenizer allows 4 x 32768 x 81 bytes), the prompt is tokenized, which takes seconds on
one core, and only then refused for its token count. Meanwhile /healthz answers every
time within 1 s (kubelet's default probe timeout), a small request on another connection
is answered, and the gang keeps its generation (the heartbeats never waited), for
/v1/completions, /v1/chat/completions and /tokenize. Skips (77) when the tokenizer
cannot be fetched (scripts/fetch-reference.sh)."""
import json
import os
import shutil
import sys
import threading
import time

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness as H  # noqa: E402

H.TEST_DEADLINE_S = 200
CTX = 32768


def scenario(h):
    ref = H.fetch_reference("smollm2", 90)
    model = H.mkmodel(h.bin, os.path.join(h.tmp, "model"), layers=1, hidden=16, heads=1,
                      kv_heads=1, ffn=32, vocab=49152, max_pos=CTX, seed=5)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(ref, f), os.path.join(model, f))
    g = H.Gang(h, nnodes=1, nproc_per_node=1,
               extra=["--model", model, "--max-batch", "4", "--kv-cache-mb", "16",
                      "--max-ctx", str(CTX)])
    g.start_local()
    g.wait_serving(timeout=60)
    gen = g.coord()["generation"]
    text = "lorem ipsum dolor sit amet " * ((8 << 20) // 27 - 200)
    bodies = [("/tokenize", {"prompt": text}),
              ("/v1/completions", {"prompt": text, "max_tokens": 1}),
              # (a chat template's output is bounded at 4 MiB: 3 MiB of content)
              ("/v1/chat/completions", {"messages": [{"role": "user", "content": text[:3 << 20]}],
                                        "max_tokens": 1})]
    for path, body in bodies:
        probes, stop = [], threading.Event()

        def probe():
            while not stop.is_set():
                t0 = time.monotonic()
                code, _ = H.http_get(g.addr(0), g.http_port, "/healthz", timeout=2.0)
                probes.append((code, time.monotonic() - t0))
                time.sleep(0.02)

        th = threading.Thread(target=probe)
        th.start()
        try:
            t0 = time.monotonic()
            box = {}
            big = threading.Thread(target=lambda: box.setdefault("r", H.http_post(
                g.addr(0), g.http_port, path, body, timeout=120)))
            big.start()
            time.sleep(0.5)  # the big body is being tokenized now
            code, small = H.http_post(g.addr(0), g.http_port, "/detokenize", {"tokens": [42]},
                                      timeout=5)
            H.check(code == 200, "%s: a small request meanwhile: %r %r" % (path, code, small))
            big.join(120)
            took = time.monotonic() - t0
        finally:
            stop.set()
            th.join(10)
        code, r = box.get("r", (None, None))
        if path == "/tokenize":
            H.check(code == 200 and r["count"] > CTX, "%s: %r %r" % (path, code, str(r)[:300]))
        else:
            H.check(code == 400 and "context holds" in json.dumps(r),
                    "%s: %r %r" % (path, code, str(r)[:300]))
        slow = [p for p in probes if p[0] != 200 or p[1] >= 1.0]
        H.check(probes and not slow, "%s: probes failed or slow while tokenizing: %r of %d"
                % (path, slow[:5], len(probes)))
        H.log("%s: the prompt tokenized and answered %d in %.1f s; %d probes meanwhile, "
              "slowest %.0f ms" % (path, code, took, len(probes),
                                   1000 * max(dt for _, dt in probes)))
    H.check(g.coord()["generation"] == gen, "the gang restarted")
    H.check(g.stop()["local"] == 0, "the gang did not stop cleanly")


if __name__ == "__main__":
    H.run(scenario)
