#!/usr/bin/env python3
"""Disaggregated prefill/decode against one colocated gang (issue #26), on one machine.

colocated:     one gang (one rank) on cores 0 and 1 (taskset), chunked prefill between the
               decodes, behind `ganglion router`;
disaggregated: a prefill gang (--role prefill --kv-port) on core 0 and a decode gang
               (--role decode) on core 1, behind the router, which sends each call's
               prefill to the first and the call with the prompt's KV blocks to the second.

The workload: C streaming clients at once, each with one completion of a prompt of random
token ids (lengths spread evenly over --min-prompt .. --max-prompt), greedy, ignore_eos,
A tokens. Per mode: TTFT p50/p99 (send to first token), ITL p50/p90/p99/max (gaps between
consecutive token events of a stream, every stream), output tokens/s (all tokens over the
wall time), the texts. With --faults, the disaggregated mode runs again and, once the
decode gang holds 2 calls or more, kills -9 the decode gang's worker, then a second
later the prefill gang's worker (local mode restarts them): every call must be answered
with exactly the healthy run's tokens (0 lost, 0 wrong); the longest ITL is the recovery.

JSON lines on stdout (and --json FILE), a table on stderr, --plot FILE: the ITL percentile
curves of both modes (matplotlib).

Usage: pd-bench.py --bin build/bin/ganglion --model DIR [--clients 32] [--answer-tokens 32]
       [--min-prompt 100] [--max-prompt 2000] [--faults] [--json F] [--plot F]
"""
import argparse
import http.client
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time


def pct(v, q):
    v = sorted(v)
    return v[min(len(v) - 1, int(round(q * (len(v) - 1))))] if v else float("nan")


def http_json(port, method, path, body=None, timeout=5.0):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request(method, path, body=json.dumps(body) if body is not None else None,
                     headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        return r.status, r.read().decode()
    finally:
        conn.close()


def stream_call(port, prompt, answer, timeout, out):
    """One streamed greedy completion: its token times and tokens into out."""
    body = {"prompt": prompt, "max_tokens": answer, "temperature": 0, "stream": True,
            "ignore_eos": True}
    t0 = time.monotonic()
    times, toks, err = [], [], None
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
        conn.request("POST", "/v1/completions", body=json.dumps(body),
                     headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        if r.status != 200:
            raise RuntimeError("answered %d: %r" % (r.status, r.read()[:200]))
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            ev = json.loads(line[6:])
            if "error" in ev:
                raise RuntimeError("stream error %r" % ev)
            for ch in ev.get("choices", []):
                if ch.get("tokens"):
                    times.append(time.monotonic() - t0)
                    toks += ch["tokens"]
        conn.close()
    except Exception as e:  # noqa: BLE001 (reported as a lost call)
        err = repr(e)
    out.update({"times": times, "tokens": toks, "error": err, "n_prompt": len(prompt)})


def wait_router(port, want_pd, deadline_s):
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        try:
            code, body = http_json(port, "GET", "/status")
            st = json.loads(body) if code == 200 else {}
            if st.get("replicas") and all(r["up"] for r in st["replicas"]) and \
                    st.get("disaggregated") == want_pd:
                return
        except (OSError, ValueError):
            pass
        time.sleep(0.2)
    raise RuntimeError("the replicas did not come up within %d s" % deadline_s)


def worker_pid(http_port):
    _, body = http_json(http_port, "GET", "/status")
    return int(json.loads(body)["local_ranks"][0]["pid"])


class Setup:
    """The gangs and the router of one mode, started on entry, stopped on exit."""

    def __init__(self, a, mode):
        self.a, self.mode, self.procs = a, mode, []
        self.logs = tempfile.mkdtemp(prefix="ganglion-pd-bench-%s-" % mode)
        self.token = os.path.join(self.logs, "token")
        with open(self.token, "w") as f:
            f.write("pd-bench-token-%d\n" % random.getrandbits(64))

    def spawn(self, name, cpus, argv):
        log = open(os.path.join(self.logs, name + ".log"), "w")
        p = subprocess.Popen(["taskset", "-c", cpus] + argv, stdout=log, stderr=log,
                             start_new_session=True)
        self.procs.append(p)

    def gang(self, name, cpus, base, extra):
        a = self.a
        self.spawn(name, cpus, [a.bin, "serve", "--local", "--model", a.model,
                                "--rdzv-port", str(base), "--http-port", str(base + 1),
                                "--job-name", name, "--max-batch", str(a.clients),
                                "--kv-cache-mb", str(a.kv_mb), "--max-ctx", "4096",
                                "--request-timeout-ms", "600000", "--token-file", self.token,
                                "--bind-address", "127.0.0.1"] + extra)
        return base + 1

    def __enter__(self):
        a = self.a
        if self.mode == "colocated":
            self.ports = [self.gang("colo", "0,1", a.base_port, [])]
        else:
            # --prefill-pp N: the prefill gang is N nodes of one rank each (local mode: node
            # i on 127.0.0.(i + 1)), one pipeline stage per node, all on core 0.
            pp = ["--pp", str(a.prefill_pp), "--nnodes", str(a.prefill_pp)] \
                if a.prefill_pp > 1 else []
            self.ports = [self.gang("prefill", "0", a.base_port,
                                    ["--role", "prefill", "--kv-port", str(a.base_port + 40)] +
                                    pp),
                          self.gang("decode", "1", a.base_port + 10, ["--role", "decode"])]
        reps = ",".join("127.0.0.1:%d" % p for p in self.ports)
        self.spawn("router", "0,1", [a.bin, "router", "--replicas", reps, "--http-port",
                                     str(a.port), "--bind-address", "127.0.0.1",
                                     "--poll-interval-ms", "100", "--request-timeout-ms",
                                     "600000", "--load-slack", "1000",
                                     "--prefill-timeout-ms", str(a.prefill_timeout_ms)])
        wait_router(a.port, self.mode != "colocated", 180)
        return self

    def __exit__(self, *exc):
        for p in self.procs:
            p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(5)


def run_load(a, prompts, faults=None):
    outs = [dict() for _ in prompts]
    threads = [threading.Thread(target=stream_call, args=(a.port, p, a.answer_tokens, 600, o))
               for p, o in zip(prompts, outs)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    if faults is not None:
        faults(outs, t0)
    for t in threads:
        t.join(900)
    return outs, time.monotonic() - t0


def gang_kv(port):
    """The decode gang's KV import counters and its transfer-time percentiles (the
    histogram's bucket bounds: an upper bound of each percentile)."""
    _, body = http_json(port, "GET", "/metrics")
    vals, buckets = {}, []
    for ln in body.splitlines():
        if ln.startswith("ganglion_kv_") and not ln.startswith("ganglion_kv_transfer"):
            vals[ln.split()[0]] = float(ln.split()[-1])
        if ln.startswith("ganglion_kv_transfer_seconds_bucket"):
            le = ln.split('le="')[1].split('"')[0]
            buckets.append((float("inf") if le == "+Inf" else float(le), float(ln.split()[-1])))
    n = buckets[-1][1] if buckets else 0
    for q in (0.5, 0.99):
        vals["transfer_p%d_s_at_most" % int(q * 100)] = next(
            (b for b, c in buckets if n and c >= q * n), float("nan"))
    return vals


def summarize(mode, outs, wall, a, metrics=""):
    ttft = [o["times"][0] * 1000 for o in outs if o.get("times")]
    itl = [(o["times"][i + 1] - o["times"][i]) * 1000 for o in outs
           for i in range(len(o.get("times", [])) - 1)]
    ntok = sum(len(o.get("tokens", [])) for o in outs)
    moved = {ln.split()[0]: float(ln.split()[-1]) for ln in metrics.splitlines()
             if ln.startswith("ganglion_router_pd_")}
    return {"bench": "pd", "mode": mode, "clients": a.clients, "answer_tokens": a.answer_tokens,
            "prompt_tokens": sum(o["n_prompt"] for o in outs),
            "lost": sum(1 for o in outs if o.get("error") or
                        len(o.get("tokens", [])) != a.answer_tokens),
            "ttft_p50_ms": pct(ttft, 0.5), "ttft_p99_ms": pct(ttft, 0.99),
            "itl_p50_ms": pct(itl, 0.5), "itl_p90_ms": pct(itl, 0.9),
            "itl_p99_ms": pct(itl, 0.99), "itl_max_ms": max(itl) if itl else float("nan"),
            "output_tok_s": ntok / wall, "wall_s": wall, "router": moved,
            "itl_ms": sorted(itl)}


def fault_plan(a, setup, record):
    """Kills -9 the decode gang's worker once streams decode, then the prefill gang's."""
    def run(outs, t0):
        while time.monotonic() - t0 < 300:
            _, body = http_json(setup.ports[1], "GET", "/metrics")
            if any(ln.startswith("ganglion_requests_in_flight ") and float(ln.split()[-1]) >= 2
                   for ln in body.splitlines()):
                break
            time.sleep(0.1)
        time.sleep(1.0)
        for name, port in (("decode", setup.ports[1]), ("prefill", setup.ports[0])):
            pid = worker_pid(port)
            os.kill(pid, signal.SIGKILL)
            record.append({"killed": name, "pid": pid, "at_s": time.monotonic() - t0})
            time.sleep(1.0)
    return run


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--answer-tokens", type=int, default=32)
    ap.add_argument("--min-prompt", type=int, default=100)
    ap.add_argument("--max-prompt", type=int, default=2000)
    ap.add_argument("--kv-mb", type=int, default=3072)
    ap.add_argument("--port", type=int, default=8710)
    ap.add_argument("--base-port", type=int, default=29700)
    ap.add_argument("--modes", default="colocated,disaggregated")
    ap.add_argument("--faults", action="store_true")
    ap.add_argument("--prefill-timeout-ms", type=int, default=600000,
                    help="the router's: above the prefill pool's queueing at this load")
    ap.add_argument("--prefill-pp", type=int, default=1,
                    help="disaggregated: the prefill gang's PP, one node per stage (the "
                    "decode gang stays PP 1: the KV moves between different layer splits)")
    ap.add_argument("--json")
    ap.add_argument("--plot")
    a = ap.parse_args()
    # SIGTERM (timeout) leaves through the Setups' exits, which stop the gangs they started.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    rng = random.Random(7)
    step = (a.max_prompt - a.min_prompt) / max(1, a.clients - 1)
    prompts = [[rng.randrange(200, 20000) for _ in range(int(a.min_prompt + i * step))]
               for i in range(a.clients)]
    rng.shuffle(prompts)
    rows, texts = [], {}
    for mode in a.modes.split(","):
        with Setup(a, mode) as s:
            outs, wall = run_load(a, prompts)
            _, metrics = http_json(a.port, "GET", "/metrics")
            kv = gang_kv(s.ports[-1]) if mode == "disaggregated" else {}
        rows.append(summarize(mode, outs, wall, a, metrics))
        rows[-1]["decode_kv"] = kv
        print(json.dumps(rows[-1]), flush=True)
        texts[mode] = [o.get("tokens") for o in outs]
    if a.faults:
        kills = []
        with Setup(a, "disaggregated") as s:
            outs, wall = run_load(a, prompts, fault_plan(a, s, kills))
            _, metrics = http_json(a.port, "GET", "/metrics")
        row = summarize("disaggregated+kill", outs, wall, a, metrics)
        ref = texts.get("disaggregated") or texts.get("colocated")
        row["wrong"] = sum(1 for o, t in zip(outs, ref) if o.get("tokens") and o["tokens"] != t)
        row["kills"] = kills
        rows.append(row)
        print(json.dumps(row), flush=True)
    if "colocated" in texts and "disaggregated" in texts:
        same = sum(1 for x, y in zip(texts["colocated"], texts["disaggregated"]) if x == y)
        for r in rows:
            r["same_tokens_as_colocated"] = same
    lines = [json.dumps(r) for r in rows]
    if a.json:
        with open(a.json, "w") as f:
            f.write("\n".join(lines) + "\n")
    sys.stderr.write("| mode | TTFT p50 / p99 ms | ITL p50 / p99 / max ms | tok/s | lost |\n")
    for r in rows:
        sys.stderr.write("| %s | %.0f / %.0f | %.0f / %.0f / %.0f | %.1f | %d |\n" % (
            r["mode"], r["ttft_p50_ms"], r["ttft_p99_ms"], r["itl_p50_ms"], r["itl_p99_ms"],
            r["itl_max_ms"], r["output_tok_s"], r["lost"]))
    if a.plot:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(6, 4))
        qs = [i / 100 for i in range(1, 100)] + [0.995, 0.999]
        for r in rows:
            ax.plot([100 * q for q in qs], [pct(r["itl_ms"], q) for q in qs], label=r["mode"])
        ax.set_xlabel("percentile")
        ax.set_ylabel("inter-token latency (ms)")
        ax.set_yscale("log")
        ax.set_title("ITL, %d streaming clients, prompts %d-%d tokens" % (
            a.clients, a.min_prompt, a.max_prompt))
        ax.legend()
        fig.tight_layout()
        fig.savefig(a.plot)


if __name__ == "__main__":
    main()
