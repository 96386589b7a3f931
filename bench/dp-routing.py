#!/usr/bin/env python3
"""Cache-aware routing against round-robin and least-loaded (issue #26): 2 data-parallel
replicas (scripts/serve-dp.sh --pin: each gang on its own core) behind `ganglion router`,
and a multi-turn chat workload sent concurrently: C conversations, each with its own
system prompt of about S tokens, T turns each (a turn's messages are the whole history:
system, then user / assistant pairs with the answers the replicas gave). Greedy answers
of A tokens.

Per policy (the replicas are restarted for each, so every policy starts cold): TTFT of
every turn (from sending the request to the first streamed token), p50 / p99 over all
turns and over the follow-up turns, the prefix hit rate (the replicas' cached prompt
tokens / prompt tokens, from each answer's usage.prompt_tokens_details.cached_tokens),
the ideal hit rate (each follow-up reusing its whole previous prompt, in full 16-token
blocks; a first turn reuses nothing), and the wall time of the workload. JSON lines on
stdout (and --json FILE), a Markdown table on stderr, a plot with --plot (matplotlib).

Usage: dp-routing.py --bin build/bin/ganglion --model DIR [--policies prefix,round-robin,
       least-loaded] [--conversations 16] [--turns 4] [--system-tokens 1000] ...
"""
import argparse
import http.client
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

WORDS = ("time year people way day man thing woman life child world school state family "
         "student group country problem hand part place case week company system program "
         "question work government number night point home water room mother area money "
         "story fact month lot right study book eye job word business issue side kind head "
         "house service friend father power hour game line end member law car city name "
         "team minute idea kid body information back parent face others level office door "
         "health person art war history party result change morning reason research girl "
         "guy moment air teacher force education").split()


def system_prompt(conv, ntok):
    """About ntok tokens of text of its own (SmolLM2: ~1.3 tokens per word here)."""
    rng = random.Random(1000 + conv)
    words = [rng.choice(WORDS) for _ in range(int(ntok / 1.3))]
    return "You are assistant number %d. Remember these notes: %s." % (conv, " ".join(words))


def http_json(port, method, path, body=None, timeout=5.0):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request(method, path, body=json.dumps(body) if body is not None else None,
                     headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        return r.status, r.read().decode()
    finally:
        conn.close()


def chat_turn(port, messages, max_tokens, timeout):
    """(ttft s, answer text, prompt tokens, cached tokens) of one streamed greedy turn."""
    body = {"messages": messages, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}, "ignore_eos": True}
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    t0 = time.monotonic()
    conn.request("POST", "/v1/chat/completions", body=json.dumps(body),
                 headers={"Content-Type": "application/json"})
    r = conn.getresponse()
    if r.status != 200:
        raise RuntimeError("turn answered %d: %r" % (r.status, r.read()[:300]))
    ttft, text, usage = None, "", {}
    for raw in r:
        line = raw.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        ev = json.loads(line[6:])
        if "error" in ev:
            raise RuntimeError("stream error %r" % ev)
        for ch in ev.get("choices", []):
            piece = (ch.get("delta") or {}).get("content") or ""
            if ttft is None and (piece or ch.get("tokens")):
                ttft = time.monotonic() - t0
            text += piece
        if ev.get("usage"):
            usage = ev["usage"]
    conn.close()
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    return ttft, text, usage.get("prompt_tokens", 0), cached


def run_conversation(port, conv, a, out):
    messages = [{"role": "system", "content": system_prompt(conv, a.system_tokens)}]
    prev_prompt = 0
    for turn in range(a.turns):
        messages.append({"role": "user", "content": "Question %d of conversation %d: what "
                         "do the notes say about item %d?" % (turn + 1, conv, 3 * turn + 1)})
        ttft, text, ptok, cached = chat_turn(port, messages, a.answer_tokens, a.timeout)
        ideal = (prev_prompt // 16) * 16 if turn > 0 else 0
        out.append({"conversation": conv, "turn": turn, "ttft_s": ttft, "prompt_tokens": ptok,
                    "cached_tokens": cached, "ideal_cached_tokens": ideal})
        messages.append({"role": "assistant", "content": text})
        prev_prompt = ptok


def pct(v, q):
    v = sorted(v)
    return v[min(len(v) - 1, int(round(q * (len(v) - 1))))] if v else float("nan")


def wait_ready(port, deadline_s):
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        try:
            code, body = http_json(port, "GET", "/status")
            if code == 200 and all(r["up"] for r in json.loads(body)["replicas"]):
                return
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(0.2)
    raise RuntimeError("the replicas did not come up within %d s" % deadline_s)


def run_policy(a, policy):
    logs = tempfile.mkdtemp(prefix="ganglion-dp-bench-%s-" % policy)
    here = os.path.dirname(os.path.abspath(__file__))
    cmd = ["bash", os.path.join(here, "..", "scripts", "serve-dp.sh"), "--dp", "2", "--pin",
           "--port", str(a.port), "--base-port", str(a.base_port), "--logs", logs,
           "--router-flags", "--policy %s --model %s" % (policy, a.model),
           a.bin, "--model", a.model, "--max-batch", "16", "--kv-cache-mb", str(a.kv_mb),
           "--max-ctx", "4096", "--request-timeout-ms", str(int(a.timeout * 1000))]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        wait_ready(a.port, 120)
        results, threads = [], []
        t0 = time.monotonic()
        for c in range(a.conversations):
            t = threading.Thread(target=run_conversation, args=(a.port, c, a, results))
            t.start()
            threads.append(t)
        for t in threads:
            t.join(a.timeout)
        wall = time.monotonic() - t0
        _, metrics = http_json(a.port, "GET", "/metrics")
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
    if len(results) != a.conversations * a.turns:
        raise RuntimeError("%s: %d of %d turns answered (logs in %s)" % (
            policy, len(results), a.conversations * a.turns, logs))
    decisions = {ln.split('"')[1]: float(ln.split()[-1]) for ln in metrics.splitlines()
                 if ln.startswith("ganglion_router_decisions_total{")}
    ttft = [r["ttft_s"] * 1000 for r in results]
    follow = [r["ttft_s"] * 1000 for r in results if r["turn"] > 0]
    cached = sum(r["cached_tokens"] for r in results)
    prompt = sum(r["prompt_tokens"] for r in results)
    ideal = sum(r["ideal_cached_tokens"] for r in results)
    return {"bench": "dp-routing", "policy": policy, "conversations": a.conversations,
            "turns": a.turns, "ttft_p50_ms": pct(ttft, 0.5), "ttft_p99_ms": pct(ttft, 0.99),
            "followup_ttft_p50_ms": pct(follow, 0.5), "followup_ttft_p99_ms": pct(follow, 0.99),
            "ttft_mean_ms": statistics.mean(ttft), "hit_rate": cached / prompt if prompt else 0,
            "ideal_hit_rate": ideal / prompt if prompt else 0,
            "hit_of_ideal": cached / ideal if ideal else 0, "prompt_tokens": prompt,
            "cached_tokens": cached, "wall_s": wall, "decisions": decisions,
            "ttft_ms": sorted(ttft)}


def plot(rows, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4))
    for r in rows:
        v = r["ttft_ms"]
        ax.plot([100.0 * (i + 1) / len(v) for i in range(len(v))], v, label=r["policy"])
    ax.set_xlabel("percentile of turns")
    ax.set_ylabel("TTFT (ms)")
    ax.set_yscale("log")
    ax.set_title("TTFT by routing policy: 2 replicas, %d conversations x %d turns"
                 % (rows[0]["conversations"], rows[0]["turns"]))
    ax.legend()
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--policies", default="prefix,round-robin,least-loaded")
    ap.add_argument("--conversations", type=int, default=16)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--system-tokens", type=int, default=1000)
    ap.add_argument("--answer-tokens", type=int, default=16)
    ap.add_argument("--kv-mb", type=int, default=2048)
    ap.add_argument("--port", type=int, default=18080)
    ap.add_argument("--base-port", type=int, default=18100)
    ap.add_argument("--timeout", type=float, default=1800.0)
    ap.add_argument("--json", default="")
    ap.add_argument("--plot", default="")
    a = ap.parse_args()
    a.model = os.path.abspath(a.model)
    rows = []
    for policy in a.policies.split(","):
        row = run_policy(a, policy)
        rows.append(row)
        print(json.dumps(row), flush=True)
        if a.json:
            with open(a.json, "a") as f:
                f.write(json.dumps(row) + "\n")
    sys.stderr.write("| policy | TTFT p50 ms | TTFT p99 ms | follow-up TTFT p50 ms | "
                     "follow-up TTFT p99 ms | hit rate | ideal | of ideal | wall s |\n"
                     "|---|---:|---:|---:|---:|---:|---:|---:|---:|\n")
    for r in rows:
        sys.stderr.write("| %s | %.0f | %.0f | %.0f | %.0f | %.3f | %.3f | %.2f | %.0f |\n" % (
            r["policy"], r["ttft_p50_ms"], r["ttft_p99_ms"], r["followup_ttft_p50_ms"],
            r["followup_ttft_p99_ms"], r["hit_rate"], r["ideal_hit_rate"], r["hit_of_ideal"],
            r["wall_s"]))
    if a.plot:
        plot(rows, a.plot)


if __name__ == "__main__":
    main()
