#!/usr/bin/env python3
"""Hand-made GGUF files of the three mixture-of-experts architectures (issue #25) serve
the same tokens and logprobs as the safetensors directories they were written from.

`ganglion mkmodel --moe` makes a Mixtral (8 experts top-2), a Qwen2-MoE (16 experts top-4,
a shared expert, a dense first layer) and a Qwen3-MoE (16 experts top-4 renormalised,
head_dim 32); tests/reference/moe-to-gguf.py writes each as llama.cpp lays it out (`llama`
with expert_count and llama.cpp's q/k row order, `qwen2moe`, `qwen3moe`; the router
ffn_gate_inp, the experts stacked in 3-D ffn_{gate,up,down}_exps, ffn_*_shexp and the 1-D
ffn_gate_inp_shexp). The directory is served on the CPU and the file on the CPU and on the
fake device (the MoE block's device path, parallel/tp-moe-dev.c: the CPU kernels on memory
the host cannot read), on EP x TP x PP 1x1x1 and 2x2x1 (and 2x1x1 on the fake device: the
EP group wider than TP) with "logprobs": 20; the tokens must
be equal and every logprob within 1e-5 (the same f32 weights, so only the summation order
may differ). The directories themselves are checked
against transformers / numpy by mp-test_moe_models and reference-logits. SKIP when the
reference Python (the gguf package) cannot be had.
"""
import os
import subprocess
import sys

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness as H  # noqa: E402
import test_smollm2_greedy as S  # noqa: E402  (fetch(): the reference Python or SKIP)
import test_moe_models as M  # noqa: E402  (serve_answer())

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TO_GGUF = os.path.join(ROOT, "tests", "reference", "moe-to-gguf.py")
TOL = 1e-5
PROMPT = [2 + (i * 71 + 5) % 250 for i in range(20)]
COMMON = ["--layers", "2", "--hidden", "64", "--heads", "4", "--kv-heads", "2", "--vocab",
          "256"]
MODELS = [
    ("mixtral", ["--arch", "mistral", "--moe", "mixtral", "--ffn", "48", "--experts", "8",
                 "--top-k", "2", "--seed", "41"]),
    ("qwen2moe", ["--arch", "qwen2", "--moe", "qwen2", "--ffn", "96", "--moe-ffn", "16",
                  "--shared-ffn", "64", "--experts", "16", "--top-k", "4", "--dense-layers",
                  "1", "--seed", "42", "--layers", "3"]),
    ("qwen3moe", ["--arch", "qwen3", "--moe", "qwen3", "--head-dim", "32", "--ffn", "96",
                  "--moe-ffn", "32", "--experts", "16", "--top-k", "4", "--norm-topk", "--seed",
                  "43"]),
]


def scenario(h):
    py = S.fetch("python")
    for name, flags in MODELS:
        d = os.path.join(h.tmp, name)
        subprocess.run([h.bin, "mkmodel", "--out", d] + COMMON + flags, check=True,
                       stdout=subprocess.DEVNULL)
        g = d + ".gguf"
        r = subprocess.run([py, TO_GGUF, d, g], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, timeout=120)
        H.check(r.returncode == 0, "moe-to-gguf.py %s: %s" % (name, r.stdout.decode()[-800:]))
        for ep, tp, dev in ((1, 1, "cpu"), (2, 2, "cpu"), (1, 1, "fake"), (2, 2, "fake"),
                            (2, 1, "fake")):
            ref = M.serve_answer(h, d, PROMPT, ep, tp, 1)
            got = M.serve_answer(h, g, PROMPT, ep, tp, 1, ["--device", dev])
            H.check(got["tokens"] == ref["tokens"], "%s ep %d %s: GGUF tokens %s, directory's %s"
                    % (name, ep, dev, got["tokens"], ref["tokens"]))
            worst = 0.0
            for a, b in zip(got["logprobs"]["top_logprobs"], ref["logprobs"]["top_logprobs"]):
                H.check(set(a) == set(b), "%s ep %d: top ids differ" % (name, ep))
                for k in a:
                    worst = max(worst, abs(a[k] - b[k]))
            H.check(worst <= TOL, "%s ep %d: logprobs differ by %.2e" % (name, ep, worst))
            H.log("%s ep %d tp %d device %s: GGUF equals the directory on the CPU (%d tokens, "
                  "logprobs within %.1e)" % (name, ep, tp, dev, len(got["tokens"]), worst))


if __name__ == "__main__":
    H.run(scenario)
