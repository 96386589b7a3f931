#!/usr/bin/env python3
"""Issue #27: greedy tokens of ganglion on a GGUF file's own blocks against llama.cpp's
llama-server on the same file: the first STEPS tokens of each prompt (token ids, so both
see the same input), and where they differ the top-2 logprobs of both at the first
difference (a near tie when the gap is small). One JSON line per prompt on stdout.

  gguf-greedy-vs-llama.py BIN FILE.gguf [--steps 32] [--llama-bin DIR] [--reference]

Runs one llama-server and one `ganglion serve --local` (2 threads each, loopback ports),
both stopped at the end. llama-server runs without its weight repacking
(LLAMA_ARG_REPACK=false): with it, this build crashes at start on an AMX CPU.

--reference (run it with /opt/ganglion-ref-venv/bin/python3: numpy and the `gguf`
package): where the two engines part, the logits of that position from a float64 numpy
forward (tests/reference/reference.py's forward_logits) on the file's weights as the
`gguf` package dequantizes them (Llama: tests/reference/hf-from-gguf.py's reader, q/k rows
unpermuted; Gemma 3: reference.py's read_gguf_gemma3), log-softmaxed; each prompt's line
then carries, for the two contending tokens (A: ganglion's choice, B: llama.cpp's), the
reference's logprobs and each engine's, and the same position's answer of a third
server, ganglion on the same file dequantized (`--dtype f32`: f32 activations, no 8-bit
rounding). A last line "summary" gives the largest |engine - reference| of each."""
import argparse
import importlib.util
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


HERE = os.path.dirname(os.path.abspath(__file__))


def load_module(name, rel):
    spec = importlib.util.spec_from_file_location(name, os.path.join(HERE, rel))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class Reference:
    """The float64 forward of a GGUF file's dequantized weights."""

    def __init__(self, path):
        import numpy as np
        self.np = np
        self.ref = load_module("reference", "../tests/reference/reference.py")
        if "gemma" in os.path.basename(path).lower():
            self.cfg, self.w = self.ref.read_gguf_gemma3(path)
            return
        conv = load_module("hf_from_gguf", "../tests/reference/hf-from-gguf.py")
        import gguf
        r = gguf.GGUFReader(path)
        self.cfg = conv.read_config(r)
        self.w = {k: v.astype(np.float64) for k, v in conv.read_weights(r, self.cfg).items()}

    def logprobs(self, ids):
        return self.ref.log_softmax(self.ref.forward_logits(self.cfg, self.w, ids))


def compare_reference(ref, f32_url, prompt, gt, lt, ours, probs, first, line):
    """Adds to line the reference's and each engine's logprobs of tokens A = gt[first]
    (ganglion's) and B = lt[first] (llama.cpp's) at the first difference, and ganglion
    --dtype f32's answer at that position."""
    ids = list(prompt) + list(gt[:first])
    lp = ref.logprobs(ids)
    a, b = gt[first], lt[first]
    top = sorted(range(len(lp)), key=lambda i: -lp[i])[:2]
    line["reference_top2"] = [[int(i), float(lp[i])] for i in top]
    line["reference_AB"] = [float(lp[a]), float(lp[b])]
    g_top = ours["logprobs"]["top_logprobs"][first]
    b_text = probs[first].get("token") if first < len(probs) else None
    line["ganglion_AB"] = [ours["logprobs"]["token_logprobs"][first], g_top.get(b_text)]
    l_a = None
    if first < len(probs):
        l_a = next((t.get("logprob") for t in probs[first].get("top_logprobs", [])
                    if t.get("id") == a), None)
    line["llama_AB"] = [l_a, probs[first].get("logprob") if first < len(probs) else None]
    f = post(f32_url, {"prompt": ids, "max_tokens": 1, "temperature": 0,
                       "logprobs": 2})["choices"][0]
    fid = f["tokens"][0]
    line["f32_token"] = [fid, f["logprobs"]["token_logprobs"][0], float(lp[fid])]


def summarize(lines):
    """The largest |engine - reference| over the A / B logprobs of every difference."""
    out = {"summary": True}
    for key in ("ganglion_AB", "llama_AB"):
        d = [abs(x - r) for ln in lines if key in ln
             for x, r in zip(ln[key], ln["reference_AB"]) if x is not None]
        out[key.split("_")[0] + "_max_abs_diff"] = max(d) if d else None
        out[key.split("_")[0] + "_pairs"] = len(d)
    d = [abs(ln["f32_token"][1] - ln["f32_token"][2]) for ln in lines if "f32_token" in ln]
    out["f32_max_abs_diff"] = max(d) if d else None
    out["reference_prefers_ganglion"] = sum(
        1 for ln in lines if "reference_AB" in ln and ln["reference_AB"][0] > ln["reference_AB"][1])
    out["reference_prefers_llama"] = sum(
        1 for ln in lines if "reference_AB" in ln and ln["reference_AB"][0] < ln["reference_AB"][1])
    return out


def start_ganglion(a, work, name, extra):
    """A `ganglion serve --local` on a.gguf; (process, http port)."""
    gp, rp = free_port(), free_port()
    proc = subprocess.Popen([a.bin, "serve", "--local", "--model", a.gguf, "--max-ctx", "512",
                             "--kv-cache-mb", "64", "--http-port", str(gp),
                             "--rdzv-port", str(rp), "--request-timeout-ms", "300000"] + extra,
                            stdout=open(os.path.join(work, name + ".log"), "w"),
                            stderr=subprocess.STDOUT, start_new_session=True)
    return proc, gp


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("bin")
    ap.add_argument("gguf")
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--llama-bin", default="/var/cache/ganglion/llama.cpp-0.3.36/bin")
    ap.add_argument("--reference", action="store_true")
    a = ap.parse_args()
    ref = Reference(a.gguf) if a.reference else None
    prompts = GEMMA_PROMPTS if "gemma" in os.path.basename(a.gguf).lower() else PROMPTS
    work = tempfile.mkdtemp(prefix="greedy-vs-llama.")
    lp = free_port()
    procs, groups, lines = [], [], []
    try:
        llama = subprocess.Popen([os.path.join(a.llama_bin, "llama-server"), "-m", a.gguf,
                                  "--port", str(lp), "-t", "2", "-c", "512", "-np", "1"],
                                 stdout=open(os.path.join(work, "llama.log"), "w"),
                                 stderr=subprocess.STDOUT,
                                 env=dict(os.environ, LLAMA_ARG_REPACK="false"))
        procs.append(llama)
        gang, gp = start_ganglion(a, work, "ganglion", [])
        groups.append(gang)
        wait_ok("http://127.0.0.1:%d/health" % lp, llama)
        wait_ok("http://127.0.0.1:%d/readyz" % gp, gang)
        f32_url = None
        if ref is not None:
            f32, fp = start_ganglion(a, work, "ganglion-f32", ["--dtype", "f32"])
            groups.append(f32)
            wait_ok("http://127.0.0.1:%d/readyz" % fp, f32)
            f32_url = "http://127.0.0.1:%d/v1/completions" % fp
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
                if ref is not None:
                    compare_reference(ref, f32_url, p, gt, lt, ours, probs, first, line)
            lines.append(line)
            print(json.dumps(line), flush=True)
        if ref is not None:
            print(json.dumps(summarize(lines)), flush=True)
    finally:
        for pr in procs + groups:
            try:
                if pr in groups:
                    os.killpg(pr.pid, signal.SIGTERM)
                else:
                    pr.terminate()
                pr.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                pr.kill()
    print("# logs in %s" % work, file=sys.stderr)


if __name__ == "__main__":
    main()
