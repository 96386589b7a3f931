#!/usr/bin/env python3
"""Serving load benchmark: ganglion's OpenAI-compatible text API driven by N concurrent
streaming clients, against transformers with static batches on the same model, in the
same run, on the same machine, one side at a time.

  serve-load.py [--bin build/bin/ganglion] [--model DIR | --url http://HOST:PORT]
                [--tp 1] [--pp 1] [--requests 8] [--concurrency 1,4,8] [--repeats 2]
                [--prompt-len 32,128] [--answer-len 8,32]
                [--threads 2] [--json OUT.json] [--plot OUT.png] [--quick] [--no-peer]

Run it with the reference Python (`scripts/fetch-reference.sh python`: transformers 4.46.3,
torch 1.13, tokenizers, matplotlib from Debian); --model defaults to the SmolLM2-135M-Instruct
directory `scripts/fetch-reference.sh smollm2` prints.

The request mix (seed --seed): prompts of --prompt-len MIN,MAX tokens cut at seeded
offsets from real English text (/usr/share/common-licenses) and sent as text; answers of
--answer-len MIN,MAX tokens, forced with ignore_eos and max_tokens; greedy. The same
requests, in the same order, go to both sides.

* ganglion: a local gang (`ganglion serve --local`, TP x PP ranks, --max-batch the
  largest concurrency, OPENBLAS_NUM_THREADS = --threads / ranks) started once, or the
  server at --url. For a concurrency C, C client threads each take the next request of
  the mix and POST /v1/completions with "stream": true and
  "stream_options": {"include_usage": true}, reading the Server-Sent Events as they come.
  TTFT = first chunk carrying a token - request sent; ITL = the gaps between chunks (a
  chunk of k tokens counts as k gaps of 1/k of its gap); every answer must have exactly
  its max_tokens tokens (usage).
* peer: transformers (AutoModelForCausalLM, float32, eval) in this process,
  torch.set_num_threads(--threads). Requests go in static batches of C, in order: prompts
  left-padded, attention mask, position ids from the mask, one forward over the prompts,
  then one forward per token with past_key_values until the batch's longest answer is
  done (greedy). A request's TTFT = its batch's first token - the batch's start (the
  batch starts when the previous one is done, as a ganglion client sends its next request
  when its previous one is done); ITL = the step times of the steps it needs.

Per concurrency and side: requests/s and output tokens/s over the wall time from the first
request sent to the last answer, TTFT and ITL p50/p99 (ms, over all requests / gaps of the
run), end-to-end latency p50. The sides never run at once; repeats interleave them
(ganglion C1, peer C1, ganglion C4, peer C4, ..., then again) and the table gives the
median of each figure across repeats. Also reported, for information: the fraction of
requests whose greedy tokens agree between the two sides (batching and padding change
float rounding, so near ties may differ; this is not a check).

--quick: 4 requests, concurrency 4, one repeat, short prompts and answers (under a
minute); the smoke test tests/mp/test_serve_load.py runs it. Exit 0, or 1 with the reason
(server failed, wrong answer length, no tokens, prompt token counts that disagree)."""
import argparse
import http.client
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class BenchError(Exception):
    pass


# ------------------------------------------------------------------ the request mix

def source_text():
    """Real English text every Debian machine has (deduplicated licence texts)."""
    d, seen, parts = "/usr/share/common-licenses", set(), []
    for n in sorted(os.listdir(d)) if os.path.isdir(d) else []:
        p = os.path.realpath(os.path.join(d, n))
        if p not in seen and os.path.isfile(p):
            seen.add(p)
            with open(p, encoding="utf-8", errors="replace") as f:
                parts.append(f.read())
    if not parts:
        raise BenchError("no text in /usr/share/common-licenses to build prompts from")
    return "\n\n".join(parts)


def request_mix(tok, n, seed, plen, alen):
    """n requests {"prompt": text, "max_tokens": k}: prompts of plen[0]..plen[1] tokens of
    real text cut at seeded offsets (decoded to text), answers of alen[0]..alen[1]."""
    ids = tok.encode(source_text(), add_special_tokens=False).ids
    rng = random.Random(seed)
    reqs = []
    for i in range(n):
        L = rng.randint(plen[0], plen[1])
        off = rng.randrange(0, len(ids) - L)
        reqs.append({"i": i, "prompt": tok.decode(ids[off:off + L]),
                     "max_tokens": rng.randint(alen[0], alen[1])})
    return reqs


def pct(xs, q):
    """The q-th percentile of xs (linear interpolation), None when empty."""
    if not xs:
        return None
    s = sorted(xs)
    k = (len(s) - 1) * q / 100.0
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def summary(wall_s, recs):
    """The figures of one run: recs have ttft_s, itl_s (a list), e2e_s, n_out."""
    out_toks = sum(r["n_out"] for r in recs)
    itl = [g for r in recs for g in r["itl_s"]]
    ttft = [r["ttft_s"] for r in recs]
    return {"requests": len(recs), "wall_s": wall_s, "req_per_s": len(recs) / wall_s,
            "out_tok_per_s": out_toks / wall_s, "out_tokens": out_toks,
            "ttft_p50_ms": pct(ttft, 50) * 1e3, "ttft_p99_ms": pct(ttft, 99) * 1e3,
            "itl_p50_ms": pct(itl, 50) * 1e3 if itl else 0.0,
            "itl_p99_ms": pct(itl, 99) * 1e3 if itl else 0.0,
            "e2e_p50_ms": pct([r["e2e_s"] for r in recs], 50) * 1e3}


# ------------------------------------------------------------------ ganglion

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(url, path, timeout=2.0):
    u = urllib.parse.urlsplit(url)
    c = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)
    try:
        c.request("GET", path)
        r = c.getresponse()
        return r.status, r.read()
    finally:
        c.close()


class Server:
    """A local gang of the real binary on the model, started and stopped here."""

    def __init__(self, a, tmp):
        self.log_path = os.path.join(tmp, "gang.log")
        ranks = a.tp * a.pp
        port = free_port()
        self.url = "http://127.0.0.1:%d" % port
        argv = [a.bin, "serve", "--local", "--nnodes", "1", "--nproc-per-node", str(ranks),
                "--tp", str(a.tp), "--pp", str(a.pp), "--model", a.model,
                "--http-port", str(port), "--rdzv-port", str(free_port()),
                "--max-batch", str(max(a.concurrency)), "--max-ctx", str(a.max_ctx),
                "--kv-cache-mb", str(a.kv_cache_mb), "--request-timeout-ms", "600000"]
        if a.pp > 1:
            argv += ["--microbatches", str(a.pp)]
        env = dict(os.environ, OPENBLAS_NUM_THREADS=str(max(1, a.threads // ranks)))
        self.log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT, env=env,
                                     start_new_session=True)
        deadline = time.monotonic() + a.start_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise BenchError("ganglion serve exited %d:\n%s"
                                 % (self.proc.returncode, self.tail()))
            try:
                if http_get(self.url, "/readyz")[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.2)
        raise BenchError("the gang was not ready after %d s:\n%s" % (a.start_timeout, self.tail()))

    def tail(self, n=30):
        self.log.flush()
        with open(self.log_path, errors="replace") as f:
            return "".join(f.readlines()[-n:])

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        self.log.close()


def stream_one(url, model, req, timeout):
    """One streamed completion; returns its record (times relative to its send)."""
    u = urllib.parse.urlsplit(url)
    body = {"prompt": req["prompt"], "max_tokens": req["max_tokens"], "ignore_eos": True,
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    if model:
        body["model"] = model
    c = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)
    try:
        t0 = time.perf_counter()
        c.request("POST", "/v1/completions", body=json.dumps(body),
                  headers={"Content-Type": "application/json"})
        r = c.getresponse()
        if r.status != 200:
            raise BenchError("request %d answered %d: %s" % (req["i"], r.status, r.read()[:300]))
        tokens, usage, done, last = [], None, False, t0
        itl, ttft = [], None
        while True:
            line = r.readline()
            if not line:
                break
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            now = time.perf_counter()
            if data == b"[DONE]":
                done = True
                break
            ev = json.loads(data)
            if "error" in ev:
                raise BenchError("request %d: %s" % (req["i"], ev["error"]))
            if ev.get("usage"):
                usage = ev["usage"]
            for ch in ev.get("choices") or []:
                k = len(ch.get("tokens") or [])
                if k == 0:
                    continue
                tokens += ch["tokens"]
                if ttft is None:  # the first chunk: no gap before it
                    ttft = now - t0
                else:
                    itl += [(now - last) / k] * k
                last = now
        e2e = time.perf_counter() - t0
    finally:
        c.close()
    if not done or usage is None or ttft is None:
        raise BenchError("request %d: stream ended without %s" % (
            req["i"], "[DONE]" if not done else "usage" if usage is None else "tokens"))
    if usage["completion_tokens"] != req["max_tokens"] or len(tokens) != req["max_tokens"]:
        raise BenchError("request %d: %d tokens (usage %d), %d asked with ignore_eos" % (
            req["i"], len(tokens), usage["completion_tokens"], req["max_tokens"]))
    return {"i": req["i"], "ttft_s": ttft, "itl_s": itl, "e2e_s": e2e, "n_out": len(tokens),
            "n_prompt": usage["prompt_tokens"], "tokens": tokens}


def run_ganglion(url, model, reqs, conc, timeout):
    """The mix through conc client threads; (summary, records by request index)."""
    nxt, lock, recs, errs = [0], threading.Lock(), {}, []

    def client():
        while True:
            with lock:
                if nxt[0] >= len(reqs) or errs:
                    return
                req = reqs[nxt[0]]
                nxt[0] += 1
            try:
                rec = stream_one(url, model, req, timeout)
            except Exception as e:  # noqa: BLE001 (reported below, the run fails)
                with lock:
                    errs.append(e)
                return
            with lock:
                recs[req["i"]] = rec

    t0 = time.perf_counter()
    th = [threading.Thread(target=client, daemon=True) for _ in range(conc)]
    for t in th:
        t.start()
    for t in th:
        while t.is_alive():  # joined in slices, so that a signal is handled at once
            t.join(0.5)
    wall = time.perf_counter() - t0
    if errs:
        raise BenchError("ganglion: %s" % errs[0])
    return summary(wall, list(recs.values())), recs


# ------------------------------------------------------------------ the peer

class Peer:
    """transformers with static batches (see the module docstring)."""

    def __init__(self, model_dir, threads):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
        torch.set_num_threads(threads)
        self.torch = torch
        self.tok = AutoTokenizer.from_pretrained(model_dir)
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32)
        self.model.eval()
        pad = self.tok.pad_token_id
        self.pad = pad if pad is not None else (self.tok.eos_token_id or 0)

    def batch(self, reqs):
        """One static batch; its records (times relative to the batch's start)."""
        torch = self.torch
        from transformers import DynamicCache
        t0 = time.perf_counter()
        prompts = [self.tok(r["prompt"], add_special_tokens=True)["input_ids"] for r in reqs]
        width = max(len(p) for p in prompts)
        ids = torch.tensor([[self.pad] * (width - len(p)) + p for p in prompts], dtype=torch.long)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts],
                            dtype=torch.long)
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        steps = max(r["max_tokens"] for r in reqs)
        past, out, stamps = DynamicCache(), [], []
        with torch.no_grad():
            for s in range(steps):
                o = self.model(input_ids=ids, attention_mask=mask, position_ids=pos,
                               past_key_values=past, use_cache=True)
                past = o.past_key_values
                nxt = torch.argmax(o.logits[:, -1, :].float(), dim=-1)
                out.append(nxt.tolist())
                stamps.append(time.perf_counter() - t0)
                ids = nxt[:, None]
                mask = torch.cat([mask, torch.ones((len(reqs), 1), dtype=torch.long)], dim=1)
                pos = pos[:, -1:] + 1
        recs = {}
        for b, r in enumerate(reqs):
            k = r["max_tokens"]
            recs[r["i"]] = {"i": r["i"], "ttft_s": stamps[0],
                            "itl_s": [stamps[j] - stamps[j - 1] for j in range(1, k)],
                            "e2e_s": stamps[k - 1], "n_out": k, "n_prompt": len(prompts[b]),
                            "tokens": [out[j][b] for j in range(k)]}
        return recs

    def run(self, reqs, conc):
        t0 = time.perf_counter()
        recs = {}
        for j in range(0, len(reqs), conc):
            recs.update(self.batch(reqs[j:j + conc]))
        return summary(time.perf_counter() - t0, list(recs.values())), recs


# ------------------------------------------------------------------ report

FIELDS = ["req_per_s", "out_tok_per_s", "ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms",
          "itl_p99_ms", "e2e_p50_ms"]


def median(xs):
    s = sorted(xs)
    return s[len(s) // 2] if len(s) % 2 else (s[len(s) // 2 - 1] + s[len(s) // 2]) / 2


def table(res, concs, sides):
    lines = ["| concurrency | side | requests/s | output tok/s | TTFT p50 ms | TTFT p99 ms "
             "| ITL p50 ms | ITL p99 ms | E2E p50 ms |",
             "|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    for c in concs:
        for side in sides:
            m = res[side][str(c)]["median"]
            lines.append("| %d | %s | %.2f | %.1f | %.0f | %.0f | %.1f | %.1f | %.0f |" % (
                c, side, m["req_per_s"], m["out_tok_per_s"], m["ttft_p50_ms"],
                m["ttft_p99_ms"], m["itl_p50_ms"], m["itl_p99_ms"], m["e2e_p50_ms"]))
        if len(sides) == 2:
            g, p = res["ganglion"][str(c)]["median"], res["peer"][str(c)]["median"]
            lines.append("| %d | ganglion / peer | %.2fx | %.2fx | %.2fx | %.2fx | %.2fx | %.2fx "
                         "| %.2fx |" % (c, g["req_per_s"] / p["req_per_s"],
                                        g["out_tok_per_s"] / p["out_tok_per_s"],
                                        *[g[f] / p[f] if p[f] else 0 for f in FIELDS[2:]]))
    return "\n".join(lines)


def plot(res, concs, sides, path, title):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(1, 3, figsize=(13, 4))
    colors = {"ganglion": "tab:blue", "peer": "tab:orange"}
    label = {"ganglion": "ganglion", "peer": "transformers, static batches"}
    for side in sides:
        m = [res[side][str(c)]["median"] for c in concs]
        ax[0].plot(concs, [x["out_tok_per_s"] for x in m], "o-", color=colors[side],
                   label=label[side])
        for k, (f, st) in enumerate([("ttft", "o-"), ("itl", "o-")]):
            ax[k + 1].plot(concs, [x[f + "_p50_ms"] for x in m], st, color=colors[side],
                           label=label[side] + " p50")
            ax[k + 1].plot(concs, [x[f + "_p99_ms"] for x in m], "s--", color=colors[side],
                           label=label[side] + " p99", alpha=0.6)
    for a_, t, y in zip(ax, ["output tokens/s", "time to first token", "inter-token latency"],
                        ["tokens/s", "ms", "ms"]):
        a_.set_title(t)
        a_.set_xlabel("concurrent clients (batch size of the peer)")
        a_.set_ylabel(y)
        a_.set_xticks(concs)
        a_.grid(alpha=0.3)
        a_.legend(fontsize=7)
    ax[1].set_yscale("log")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=90)


# ------------------------------------------------------------------ main

def fetch(what):
    r = subprocess.run(["bash", os.path.join(ROOT, "scripts", "fetch-reference.sh"), what],
                       capture_output=True, text=True)
    if r.returncode != 0 or not r.stdout.strip():
        raise BenchError("scripts/fetch-reference.sh %s failed: %s"
                         % (what, r.stderr.strip()[-300:]))
    return r.stdout.strip().splitlines()[-1]


def pair(s):
    a, b = (int(x) for x in s.split(","))
    if not 1 <= a <= b:
        raise argparse.ArgumentTypeError("MIN,MAX with 1 <= MIN <= MAX")
    return a, b


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "bin", "ganglion"))
    ap.add_argument("--model", help="Hugging Face directory (default: fetch-reference.sh smollm2)")
    ap.add_argument("--url", help="attach to this ganglion server instead of starting one")
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--pp", type=int, default=1)
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--concurrency", default="1,4,8")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--prompt-len", type=pair, default=(32, 128))
    ap.add_argument("--answer-len", type=pair, default=(8, 32))
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                    help="cores for each side: torch threads, and OpenBLAS threads of ganglion")
    ap.add_argument("--max-ctx", type=int, default=1024)
    ap.add_argument("--kv-cache-mb", type=int, default=512)
    ap.add_argument("--start-timeout", type=int, default=180)
    ap.add_argument("--request-timeout", type=int, default=600)
    ap.add_argument("--json")
    ap.add_argument("--plot")
    ap.add_argument("--quick", action="store_true",
                    help="4 requests, concurrency 4, one repeat, short prompts and answers")
    ap.add_argument("--no-peer", action="store_true")
    a = ap.parse_args()
    if a.quick:
        a.requests, a.concurrency, a.repeats = 4, "4", 1
        a.prompt_len, a.answer_len = (16, 64), (4, 8)
    a.concurrency = [int(x) for x in a.concurrency.split(",")]
    return a


def main():
    a = parse_args()
    t_start = time.time()
    if a.model is None:
        a.model = fetch("smollm2")
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(os.path.join(a.model, "tokenizer.json"))
    reqs = request_mix(tok, a.requests, a.seed, a.prompt_len, a.answer_len)
    if a.max_ctx < a.prompt_len[1] + a.answer_len[1] + 8:
        raise BenchError("--max-ctx %d is below the longest prompt + answer" % a.max_ctx)
    sides = ["ganglion"] + ([] if a.no_peer else ["peer"])
    res = {s: {str(c): {"runs": []} for c in a.concurrency} for s in sides}
    agree = []
    tmp = tempfile.mkdtemp(prefix="serve-load-")
    server = None
    try:
        if a.url:
            url = a.url.rstrip("/")
        else:
            server = Server(a, tmp)
            url = server.url
        st, body = http_get(url, "/v1/models", timeout=10)
        model_name = json.loads(body)["data"][0]["id"] if st == 200 else None
        peer = None if a.no_peer else Peer(a.model, a.threads)
        # Warm-up, untimed: one short request each side.
        warm = [{"i": -1, "prompt": reqs[0]["prompt"], "max_tokens": 2}]
        stream_one(url, model_name, warm[0], a.request_timeout)
        if peer:
            peer.batch(warm)
        print("# %d requests, prompts %d-%d tokens, answers %d-%d, concurrency %s, %d repeats, "
              "%d threads per side" % (a.requests, *a.prompt_len, *a.answer_len,
                                       a.concurrency, a.repeats, a.threads), flush=True)
        for rep in range(a.repeats):
            for c in a.concurrency:
                g, grecs = run_ganglion(url, model_name, reqs, c, a.request_timeout)
                res["ganglion"][str(c)]["runs"].append(g)
                line = "repeat %d c=%d ganglion %.1f tok/s TTFT p50 %.0f ms ITL p50 %.1f ms" % (
                    rep + 1, c, g["out_tok_per_s"], g["ttft_p50_ms"], g["itl_p50_ms"])
                if peer:
                    p, precs = peer.run(reqs, c)
                    res["peer"][str(c)]["runs"].append(p)
                    for r in reqs:
                        if grecs[r["i"]]["n_prompt"] != precs[r["i"]]["n_prompt"]:
                            raise BenchError("request %d: ganglion counts %d prompt tokens, "
                                             "transformers %d" % (r["i"], grecs[r["i"]]["n_prompt"],
                                                                  precs[r["i"]]["n_prompt"]))
                        agree.append(grecs[r["i"]]["tokens"] == precs[r["i"]]["tokens"])
                    line += " | peer %.1f tok/s TTFT p50 %.0f ms ITL p50 %.1f ms" % (
                        p["out_tok_per_s"], p["ttft_p50_ms"], p["itl_p50_ms"])
                print(line, flush=True)
    except BaseException:
        if server:
            print("serve-load: the gang's log is kept in %s" % server.log_path, file=sys.stderr)
        raise
    else:
        shutil.rmtree(tmp, ignore_errors=True)
    finally:
        if server:
            server.stop()
    for s in sides:
        for c in a.concurrency:
            runs = res[s][str(c)]["runs"]
            res[s][str(c)]["median"] = {f: median([r[f] for r in runs]) for f in FIELDS}
    print()
    print(table(res, a.concurrency, sides))
    n_prompt = [len(tok.encode(r["prompt"]).ids) for r in reqs]
    info = {"requests": a.requests, "concurrency": a.concurrency, "repeats": a.repeats,
            "prompt_len": a.prompt_len, "answer_len": a.answer_len, "seed": a.seed,
            "threads": a.threads, "tp": a.tp, "pp": a.pp, "model": a.model,
            "url": a.url, "prompt_tokens_total": sum(n_prompt),
            "answer_tokens_total": sum(r["max_tokens"] for r in reqs),
            "greedy_tokens_agree": (sum(agree) / len(agree)) if agree else None,
            "wall_s": time.time() - t_start, "command": " ".join(sys.argv)}
    if agree:
        print("\ngreedy tokens identical on both sides for %.0f%% of the requests (information)"
              % (100 * info["greedy_tokens_agree"]))
    print("total %.0f s" % info["wall_s"])
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"info": info, "results": res}, f, indent=1)
    if a.plot:
        plot(res, a.concurrency, sides, a.plot,
             "%s, TP %d x PP %d, %d threads per side; %d requests, prompts %d-%d, answers %d-%d "
             "tokens; medians of %d repeats"
             % (os.path.basename(a.model.rstrip("/")), a.tp, a.pp, a.threads, a.requests,
                *a.prompt_len, *a.answer_len, a.repeats))
    return 0


def on_signal(sig, _frame):
    raise BenchError("stopped by signal %d" % sig)  # the server is stopped on the way out


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        sys.exit(main())
    except BenchError as e:
        print("serve-load: %s" % e, file=sys.stderr)
        sys.exit(1)
