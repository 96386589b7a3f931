#!/usr/bin/env python3
"""A ganglion client in plain Python (standard library only: urllib and json).

Waits until the gang is ready, sends completion requests to the coordinator's
POST /v1/completions, and prints the generated token ids with the timings. Start a gang
first, e.g. (see examples/local-gang/run.sh):

    ganglion mkmodel --out /tmp/tiny --layers 4 --hidden 128 --heads 4 --kv-heads 2 \
        --ffn 256 --vocab 512
    ganglion serve --local --model /tmp/tiny --nnodes 2 --nproc-per-node 2 --tp 2 --pp 2 &
    python3 examples/python-client/client.py --url http://127.0.0.1:8000 --prompt 1,15,42

Prompts are token ids (ganglion has no tokenizer). The request body:
  {"prompt": [ids], "max_tokens": n, "temperature": t, "top_k": k, "top_p": p,
   "seed": s, "stop": [ids]}
Errors come back as JSON {"error": ...} with 400 (bad request), 413 (body over 1 MiB),
503 (queue full, or the gang gave up) or 504 (not done by --request-timeout-ms); this
client prints them and exits 1.
"""
import argparse
import json
import sys
import time
import urllib.error
import urllib.request


def get(url, timeout=2.0):
    """(HTTP status, body text) of a GET; status 0 when the server cannot be reached."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except (urllib.error.URLError, OSError):
        return 0, ""


def wait_ready(base, timeout_s):
    """Polls GET /readyz until 200 (the whole gang serves) or the deadline."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if get(base + "/readyz", timeout=1.0)[0] == 200:
            return True
        time.sleep(0.2)
    return False


def complete(base, body, timeout_s):
    """POST /v1/completions; returns (HTTP status, decoded JSON answer)."""
    req = urllib.request.Request(base + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)


def main():
    ap = argparse.ArgumentParser(description="send completions to a ganglion gang")
    ap.add_argument("--url", default="http://127.0.0.1:8000", help="coordinator (agent 0)")
    ap.add_argument("--prompt", action="append", default=None,
                    help="comma-separated token ids; repeat for several requests")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    ap.add_argument("--top-p", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--wait", type=float, default=60.0, help="seconds to wait for /readyz")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds per request")
    a = ap.parse_args()
    base = a.url.rstrip("/")

    if not wait_ready(base, a.wait):
        print("the gang at %s is not ready after %.0f s (GET /readyz)" % (base, a.wait))
        return 1
    status = json.loads(get(base + "/status")[1])
    print("gang ready: generation %s, %d node(s) x %d rank(s)"
          % (status["generation"], status["nnodes"], status["nproc_per_node"]))

    failed = 0
    for prompt in a.prompt or ["1,15,42,7"]:
        body = {"prompt": [int(t) for t in prompt.split(",")], "max_tokens": a.max_tokens,
                "temperature": a.temperature, "top_p": a.top_p, "seed": a.seed}
        code, answer = complete(base, body, a.timeout)
        if code != 200:
            print("prompt %s: HTTP %d: %s" % (prompt, code, answer.get("error", answer)))
            failed += 1
            continue
        choice, t = answer["choices"][0], answer["timings"]
        print("prompt %s -> %s (%s), prefill %.1f ms, %.0f tokens/s"
              % (prompt, " ".join(map(str, choice["tokens"])), choice["finish_reason"],
                 t["prefill_ms"], t["decode_tokens_per_s"]))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
