#!/usr/bin/env python3
"""RoPE scaling and a separate head_dim against transformers, token for token and logprob
for logprob, on every layout: TP 1 / PP 1, TP 2 / PP 1, TP 1 / PP 2 and TP 2 / PP 2.

Reference: transformers 4.46.3 (Debian's torch), from `scripts/fetch-reference.sh
python`. tests/reference/hf-rope-models.py builds, in this run, tiny random models with
transformers' own config classes in the structure of real checkpoints -- Llama 3.2
(rope_scaling llama3, factor 32 over an original context of 64, tied embeddings), Mistral
Nemo (head_dim 32 while hidden / heads is 16), Qwen2.5 with YaRN (factor 4 over 64), a
linear-scaling fine-tune with a head_dim of 24, dynamic NTK (factor 4 over 64), Mistral
v0.1 with a sliding window of 32 and Qwen2 with use_sliding_window (40 keys), one kv
head (replicated on TP 2) with a vocabulary of 251 (split unevenly), and a
no-op {"rope_type": "default"} block -- saves them (safetensors, float32) and decodes 6 tokens
greedily from prompts of 100 to 150 ids, past the original context where the scaling matters. The
real binary serves each directory on every layout and answers the same prompt with "logprobs": 20:
the tokens must equal transformers' and every one of the 20 raw logprobs of every step
must equal transformers' log-softmax within 1e-4 (logprobs are the logits less their
log-sum-exp, so this is the logits' agreement up to that shift). Qwen3 and Gemma 3 are not
in 4.46.3: their reference here is the independent numpy reference
(tests/reference/reference.py, also behind reference-logits), on `ganglion mkmodel` models
(NUMPY_MODELS: Qwen3 with head_dim 32 over hidden 48 and YaRN; Gemma 3 with local and
global layers, a 24-key window that binds on a 90-id prompt, per-kind RoPE bases, linear
scaling on the global layers, query_pre_attn_scalar apart from head_dim), the same checks
on every layout. Reports SKIP, with the reason, when
the reference Python cannot be had. About 15 s on 2 idle cores.
"""
import json
import math
import os
import subprocess
import sys

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness as H  # noqa: E402
import test_smollm2_greedy as S  # noqa: E402  (fetch(): the reference Python or SKIP)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HF_MODELS = os.path.join(ROOT, "tests", "reference", "hf-rope-models.py")
NUMPY_REF = os.path.join(ROOT, "tests", "reference", "reference.py")
STEPS = 6
TOP = 20
LP_TOL = 1e-4
LAYOUTS = [(1, 1), (2, 1), (1, 2), (2, 2)]  # (tp, pp); every model has 4 heads, 1 or 2 kv heads
H.TEST_DEADLINE_S = 200


def reference(py, workdir):
    """The JSON lines of hf-rope-models.py (one per model)."""
    r = subprocess.run([py, HF_MODELS, "--workdir", workdir, "--steps", str(STEPS)],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=150,
                       env=dict(os.environ, TQDM_DISABLE="1"))
    H.check(r.returncode == 0, "hf-rope-models.py failed (%d): %s"
            % (r.returncode, r.stderr.decode(errors="replace")[-2000:]))
    return [json.loads(ln) for ln in r.stdout.decode().strip().splitlines()]


def serve_answer(h, model_dir, prompt, tp, pp):
    """The completion of a gang of pp nodes x tp ranks serving model_dir."""
    g = H.Gang(h, nnodes=pp, nproc_per_node=tp,
               extra=["--model", model_dir, "--tp", str(tp), "--pp", str(pp),
                      "--request-timeout-ms", "60000", "--step-timeout-ms", "10000"])
    g.start_local()
    try:
        g.wait_serving(timeout=60)
        code, r = H.http_post(g.addr(0), g.http_port, "/v1/completions",
                              {"prompt": prompt, "max_tokens": STEPS, "temperature": 0,
                               "logprobs": TOP}, 60.0)
        H.check(code == 200, "tp %d pp %d: HTTP %r %r" % (tp, pp, code, r))
        return r["choices"][0]
    finally:
        g.stop()


def compare(name, tp, pp, ref, choice):
    """Tokens equal; each step's top logprobs within LP_TOL of the reference row."""
    where = "%s tp %d pp %d" % (name, tp, pp)
    H.check(choice["tokens"] == ref["ids"], "%s: tokens %s, transformers %s"
            % (where, choice["tokens"], ref["ids"]))
    tops = choice["logprobs"]["top_logprobs"]
    H.check(len(tops) == STEPS, "%s: %d logprob steps" % (where, len(tops)))
    worst = 0.0
    for step, (top, row) in enumerate(zip(tops, ref["logprobs"])):
        H.check(len(top) == TOP, "%s step %d: %d alternatives" % (where, step, len(top)))
        for key, lp in top.items():
            tid = int(key.split(":")[1])  # "token_id:N" (the directory has no tokenizer)
            err = abs(lp - row[tid])
            worst = max(worst, err)
            H.check(err <= LP_TOL, "%s step %d token %d: logprob %.7f, transformers %.7f"
                    % (where, step, tid, lp, row[tid]))
    return worst


def log_softmax(row):
    m = max(row)
    lse = m + math.log(sum(math.exp(v - m) for v in row))
    return [v - lse for v in row]


# Models whose reference is the numpy one: (name, mkmodel flags, config.json edits, prompt).
NUMPY_MODELS = [
    # Qwen3: q/k norms, head_dim 32 over hidden 48, YaRN factor 4 over 64.
    ("qwen3-yarn", ["--arch", "qwen3", "--layers", "2", "--hidden", "48", "--heads", "4",
                    "--kv-heads", "2", "--head-dim", "32", "--ffn", "96", "--vocab", "256",
                    "--max-pos", "64", "--seed", "12", "--rope-scaling",
                    '{"rope_type": "yarn", "factor": 4.0}'], {},
     [2 + (i * 89 + 7) % 254 for i in range(140)]),
    # Gemma 3: 4 layers, every 2nd global, a 24-key window on the local ones, local RoPE
    # base 10000 and global 1e6 with linear scaling (factor 2), query_pre_attn_scalar 24
    # against a head_dim of 32, sandwich norms, GeGLU, scaled embeddings.
    ("gemma3-local-global", ["--arch", "gemma3", "--layers", "4", "--hidden", "48", "--heads",
                             "4", "--kv-heads", "2", "--head-dim", "32", "--ffn", "96",
                             "--vocab", "256", "--max-pos", "128", "--seed", "16", "--tie",
                             "--rope-scaling", '{"rope_type": "linear", "factor": 2.0}'],
     {"sliding_window": 24, "sliding_window_pattern": 2, "query_pre_attn_scalar": 24,
      "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0},
     [2 + (i * 61 + 11) % 254 for i in range(90)]),
]


def numpy_reference(h, py):
    """Each model of NUMPY_MODELS made by `ganglion mkmodel` (config.json edited), decoded
    greedily by the independent numpy reference (tests/reference/reference.py, run by py:
    the reference Python has numpy)."""
    out = []
    for name, flags, edit, prompt in NUMPY_MODELS:
        d = os.path.join(h.tmp, "models", name)
        subprocess.run([h.bin, "mkmodel", "--out", d] + flags, check=True,
                       stdout=subprocess.DEVNULL)
        if edit:
            with open(os.path.join(d, "config.json")) as f:
                cfg = json.load(f)
            cfg.update(edit)
            with open(os.path.join(d, "config.json"), "w") as f:
                json.dump(cfg, f)
        ids, rows = [], []
        for _ in range(STEPS):
            r = subprocess.run([py, NUMPY_REF, "logits", d, "--ids",
                                ",".join(map(str, prompt + ids))],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60)
            H.check(r.returncode == 0, "reference.py failed (%d): %s"
                    % (r.returncode, r.stderr.decode(errors="replace")[-2000:]))
            lp = log_softmax(json.loads(r.stdout)["logits"])
            rows.append(lp)
            ids.append(max(range(len(lp)), key=lambda i: (lp[i], -i)))
        out.append({"name": name + " (numpy reference)", "dir": d, "prompt": prompt,
                    "ids": ids, "logprobs": rows})
    return out


def scenario(h):
    py = S.fetch("python")
    refs = reference(py, os.path.join(h.tmp, "models"))
    H.check(len(refs) >= 6, "hf-rope-models.py made %d models" % len(refs))
    refs += numpy_reference(h, py)
    for ref in refs:
        for tp, pp in LAYOUTS:
            choice = serve_answer(h, ref["dir"], ref["prompt"], tp, pp)
            worst = compare(ref["name"], tp, pp, ref, choice)
            H.log("%s tp %d pp %d: %d tokens equal, max logprob difference %.2e"
                  % (ref["name"], tp, pp, STEPS, worst))


if __name__ == "__main__":
    H.run(scenario)
