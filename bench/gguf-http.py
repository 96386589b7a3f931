#!/usr/bin/env python3
"""Issue #27, "Measure": the HTTP API on a GGUF file, ganglion (`serve --local`, the
file's own blocks) against llama.cpp's llama-server (`-np 32`) on the same file, 1 and 32
concurrent streaming clients: output tokens/s and TTFT p50 of each, and their ratio.

  gguf-http.py BIN FILE.gguf [--concurrency 1,32] [--repeats 3] [--answer 64]
               [--prompt 32] [--per-client 2] [--threads 2] [--llama-bin DIR] [--json OUT]

Under `taskset -c N` with --threads 1 both engines get one core (ganglion sizes its
kernel pool by the affinity mask; llama-server -t 1), the clients share it.

Both servers are started once and stay up; the runs interleave them (repeat r: ganglion C1,
llama C1, ganglion C32, llama C32, the engine order swapped on odd repeats) and the table
gives the median of each figure over the repeats. Requests (seeded): prompts of --prompt
token ids drawn from [100, 10000), answers of exactly --answer tokens (ignore_eos, greedy),
sent to POST /v1/completions with "stream": true; at concurrency C, C client threads each
send their next request when their previous one is done, max(4, --per-client x C) requests
in all (--per-client 2). TTFT = the first chunk carrying text or tokens - the request's
send; output tokens/s = the tokens of the run over its wall time (first send to last
answer). Every answer must have its --answer tokens (usage, or one streamed chunk a token
for llama-server). llama-server runs without its weight repacking (LLAMA_ARG_REPACK=false:
this build crashes at start with it on an AMX CPU), -t --threads, -c 32 x 512 (512 positions
a slot); ganglion with --max-batch the largest concurrency, --max-ctx 512. The 1-minute load
average is sampled before and after every run and reported: the machine may be shared.
Python standard library only."""
import argparse
import http.client
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def load1():
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


def pct(xs, q):
    s = sorted(xs)
    k = (len(s) - 1) * q / 100.0
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def median(xs):
    return pct(xs, 50)


def wait_ok(port, path, proc, timeout=180):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError("server on port %d exited %d" % (port, proc.returncode))
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            c.request("GET", path)
            if c.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError("server on port %d not ready after %d s" % (port, timeout))


def stream_one(port, prompt, n, timeout=600):
    """One streamed completion: (ttft_s, e2e_s, tokens)."""
    body = {"prompt": prompt, "max_tokens": n, "ignore_eos": True, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}}
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    t0 = time.perf_counter()
    # Connection: close, so that a stream without "data: [DONE]" ends with the connection.
    c.request("POST", "/v1/completions", body=json.dumps(body),
              headers={"Content-Type": "application/json", "Connection": "close"})
    r = c.getresponse()
    if r.status != 200:
        raise RuntimeError("HTTP %d: %s" % (r.status, r.read()[:300]))
    ttft, chunks, usage = None, 0, None
    while True:
        line = r.readline()
        if not line:
            break
        line = line.strip()
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            break
        ev = json.loads(data)
        if ev.get("usage"):
            usage = ev["usage"]
        for ch in ev.get("choices") or []:
            k = len(ch.get("tokens") or []) or (1 if ch.get("text") else 0)
            if k and ttft is None:
                ttft = time.perf_counter() - t0
            chunks += k
    e2e = time.perf_counter() - t0
    c.close()
    got = usage["completion_tokens"] if usage else chunks
    if got != n or ttft is None:
        raise RuntimeError("asked %d tokens, got %d (usage %r)" % (n, got, usage))
    return ttft, e2e, got


def run(port, reqs, conc):
    """The requests through conc client threads: a dict of figures."""
    nxt, lock, recs, errs = [0], threading.Lock(), [], []

    def client():
        while True:
            with lock:
                if nxt[0] >= len(reqs) or errs:
                    return
                req = reqs[nxt[0]]
                nxt[0] += 1
            try:
                rec = stream_one(port, req[0], req[1])
            except Exception as e:  # noqa: BLE001 (the run fails below)
                with lock:
                    errs.append(e)
                return
            with lock:
                recs.append(rec)

    l0 = load1()
    t0 = time.perf_counter()
    th = [threading.Thread(target=client, daemon=True) for _ in range(conc)]
    for t in th:
        t.start()
    for t in th:
        t.join()
    wall = time.perf_counter() - t0
    if errs:
        raise RuntimeError(str(errs[0]))
    return {"out_tok_per_s": sum(r[2] for r in recs) / wall, "ttft_p50_ms":
            median([r[0] for r in recs]) * 1e3, "e2e_p50_ms": median([r[1] for r in recs]) * 1e3,
            "wall_s": wall, "load_before": l0, "load_after": load1()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("bin")
    ap.add_argument("gguf")
    ap.add_argument("--concurrency", default="1,32")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--answer", type=int, default=64)
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=27)
    ap.add_argument("--per-client", type=int, default=2)
    ap.add_argument("--llama-bin", default="/var/cache/ganglion/llama.cpp-0.3.36/bin")
    ap.add_argument("--json")
    a = ap.parse_args()
    concs = [int(c) for c in a.concurrency.split(",")]
    work = tempfile.mkdtemp(prefix="gguf-http.")
    procs = []
    try:
        lp, gp, rp = free_port(), free_port(), free_port()
        np_ = max(concs)
        procs.append(subprocess.Popen(
            [os.path.join(a.llama_bin, "llama-server"), "-m", a.gguf, "--port", str(lp), "-t",
             str(a.threads), "-np", str(np_), "-c", str(512 * np_)],
            stdout=open(os.path.join(work, "llama.log"), "w"), stderr=subprocess.STDOUT,
            env=dict(os.environ, LLAMA_ARG_REPACK="false"), start_new_session=True))
        procs.append(subprocess.Popen(
            [a.bin, "serve", "--local", "--model", a.gguf, "--max-ctx", "512", "--max-batch",
             str(np_), "--kv-cache-mb", "512", "--http-port", str(gp), "--rdzv-port", str(rp),
             "--request-timeout-ms", "600000"],
            stdout=open(os.path.join(work, "ganglion.log"), "w"), stderr=subprocess.STDOUT,
            start_new_session=True))
        wait_ok(lp, "/health", procs[0])
        wait_ok(gp, "/readyz", procs[1])
        rng = random.Random(a.seed)
        ports = {"ganglion": gp, "llama-server": lp}
        for name, port in ports.items():  # warm-up: one request each
            stream_one(port, [rng.randrange(100, 10000) for _ in range(a.prompt)], 8)
        res = {}
        for r in range(a.repeats):
            for c in concs:
                reqs = [([rng.randrange(100, 10000) for _ in range(a.prompt)], a.answer)
                        for _ in range(max(4, a.per_client * c))]
                order = ["ganglion", "llama-server"][::(-1 if r % 2 else 1)]
                for name in order:
                    f = run(ports[name], reqs, c)
                    res.setdefault((name, c), []).append(f)
                    print(json.dumps(dict(f, engine=name, concurrency=c, repeat=r)), flush=True)
        print("| clients | llama-server tok/s | ganglion tok/s | ratio | llama-server TTFT p50 "
              "ms | ganglion TTFT p50 ms | ratio (llama / ganglion) | load (1 min) |")
        print("|---:|---:|---:|---:|---:|---:|---:|---|")
        for c in concs:
            g, ll = res[("ganglion", c)], res[("llama-server", c)]
            gt = median([x["out_tok_per_s"] for x in g])
            lt = median([x["out_tok_per_s"] for x in ll])
            gf, lf = median([x["ttft_p50_ms"] for x in g]), median([x["ttft_p50_ms"] for x in ll])
            loads = [x[k] for x in g + ll for k in ("load_before", "load_after")]
            print("| %d | %.1f | %.1f | %.2fx | %.0f | %.0f | %.2fx | %.1f-%.1f |"
                  % (c, lt, gt, gt / lt, lf, gf, lf / gf, min(loads), max(loads)))
        if a.json:
            with open(a.json, "w") as f:
                json.dump({"%s/%d" % k: v for k, v in res.items()}, f, indent=1)
    finally:
        for p in procs:
            try:
                os.killpg(p.pid, signal.SIGTERM)
                p.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                os.killpg(p.pid, signal.SIGKILL)
        print("# logs in %s" % work, file=sys.stderr)


if __name__ == "__main__":
    main()
