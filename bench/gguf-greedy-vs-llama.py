#!/usr/bin/env python3
"""Issue #27: greedy tokens of ganglion on a GGUF file's own blocks against llama.cpp's
llama-server on the same file: the first STEPS tokens of each prompt (token ids, so both
see the same input), and where they differ the top-2 logprobs of both at the first
difference (a near tie when the gap is small). One JSON line per prompt on stdout.

  gguf-greedy-vs-llama.py BIN FILE.gguf [--steps 32] [--llama-bin DIR]

Runs one llama-server and one `ganglion serve --local` (2 threads each, loopback ports),
both stopped at the end. llama-server runs without its weight repacking
(LLAMA_ARG_REPACK=false): with it, this build crashes at start on an AMX CPU."""
import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

PROMPTS = [[1, 504, 3458, 282, 4649, 314], [1, 11, 7222, 3128, 28, 216, 1056],
           [1, 1373, 314, 253, 2328, 1096, 30], [1, 504, 1345, 282, 253, 4082, 314],
           [1, 9519, 28, 957, 1392, 314]]
GEMMA_PROMPTS = [[2, 818, 5279, 529, 7001, 563], [2, 1509, 1340, 6057, 236761, 1030],
                 [2, 818, 1855, 529, 9405, 563], [2, 1509, 563, 496, 2950, 236761],
                 [2, 7001, 563, 3437, 573]]


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def post(url, body, timeout=300):
    req = urllib.request.Request(url, json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def wait_ok(url, proc, timeout=180):
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if proc.poll() is not None:
            raise RuntimeError("%s exited %d" % (url, proc.returncode))
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.3)
    raise RuntimeError("%s not ready after %d s" % (url, timeout))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("bin")
    ap.add_argument("gguf")
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--llama-bin", default="/var/cache/ganglion/llama.cpp-0.3.36/bin")
    a = ap.parse_args()
    prompts = GEMMA_PROMPTS if "gemma" in os.path.basename(a.gguf).lower() else PROMPTS
    work = tempfile.mkdtemp(prefix="greedy-vs-llama.")
    lp, gp, rp = free_port(), free_port(), free_port()
    procs = []
    try:
        llama = subprocess.Popen([os.path.join(a.llama_bin, "llama-server"), "-m", a.gguf,
                                  "--port", str(lp), "-t", "2", "-c", "512", "-np", "1"],
                                 stdout=open(os.path.join(work, "llama.log"), "w"),
                                 stderr=subprocess.STDOUT,
                                 env=dict(os.environ, LLAMA_ARG_REPACK="false"))
        procs.append(llama)
        gang = subprocess.Popen([a.bin, "serve", "--local", "--model", a.gguf, "--max-ctx", "512",
                                 "--kv-cache-mb", "64", "--http-port", str(gp),
                                 "--rdzv-port", str(rp), "--request-timeout-ms", "300000"],
                                stdout=open(os.path.join(work, "ganglion.log"), "w"),
                                stderr=subprocess.STDOUT, start_new_session=True)
        procs.append(gang)
        wait_ok("http://127.0.0.1:%d/health" % lp, llama)
        wait_ok("http://127.0.0.1:%d/readyz" % gp, gang)
        for i, p in enumerate(prompts):
            ll = post("http://127.0.0.1:%d/completion" % lp,
                      {"prompt": p, "n_predict": a.steps, "temperature": 0, "top_k": 1,
                       "n_probs": 2, "return_tokens": True, "cache_prompt": False})
            ours = post("http://127.0.0.1:%d/v1/completions" % gp,
                        {"prompt": p, "max_tokens": a.steps, "temperature": 0,
                         "logprobs": 2})["choices"][0]
            lt, gt = ll.get("tokens", []), ours["tokens"]
            n = min(len(lt), len(gt))
            first = next((k for k in range(n) if lt[k] != gt[k]), None)
            line = {"file": os.path.basename(a.gguf), "prompt": i, "steps": n,
                    "equal": first is None, "first_difference": first}
            if first is not None:
                top = sorted(ours["logprobs"]["top_logprobs"][first].items(), key=lambda kv: -kv[1])
                line["ganglion_top2"] = top[:2]
                probs = ll.get("completion_probabilities", [])
                if first < len(probs):
                    line["llama_top2"] = [(t.get("token"), t.get("logprob"))
                                          for t in probs[first].get("top_logprobs", [])[:2]]
            print(json.dumps(line), flush=True)
    finally:
        for pr in procs:
            try:
                if pr is procs[-1] and len(procs) == 2:
                    os.killpg(pr.pid, signal.SIGTERM)
                else:
                    pr.terminate()
                pr.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                pr.kill()
    print("# logs in %s" % work, file=sys.stderr)


if __name__ == "__main__":
    main()
