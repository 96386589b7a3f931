#!/usr/bin/env python3
"""Mixture-of-experts models against their references, token for token and logprob for
logprob, on every layout EP x TP x PP the tests name (issue #25).

Reference: transformers 4.46.3 (Debian's torch), from `scripts/fetch-reference.sh
python`, for Mixtral and Qwen2-MoE: tests/reference/hf-moe-models.py builds, in this run,
tiny random models with transformers' own config classes (Mixtral 8 experts top-2; Qwen2-MoE
64 experts top-8 with a shared expert, norm_topk_prob false and a dense first layer;
Qwen2-MoE 8 experts top-2, norm_topk_prob true, every second layer sparse), saves them
(safetensors, float32) and decodes 6 tokens greedily. Qwen3-MoE is not in 4.46.3: its
reference is the independent numpy one (tests/reference/reference.py) on `ganglion mkmodel
--moe qwen3` models (64 experts top-8 with a dense first layer and head_dim 32; 8 experts
top-2 renormalised). The real binary serves each directory on every layout and answers the
same prompt with "logprobs": 20: the tokens must equal the reference's and every one of the
20 raw logprobs of every step must be within 1e-4 of the reference's log-softmax.

Layouts (ep, tp, pp): 1x1x1; 2x2x1 and 4x4x1 (experts split over the TP group, the tokens
exchanged by all-to-all, attention TP over the same ranks); 2x2x2 (the same on two pipeline
stages); 1x2x1 (every expert cut by columns over TP); 2x1x1, 4x1x1 and 2x1x2 (the EP group
wider than TP: a stage of ep ranks, attention replicated on each, the experts over the
stage; the world is ep x pp). `--ep 3 --tp 2` (not whole TP groups) is refused with a
message saying what is supported. Reports SKIP, with the reason, when the reference Python
cannot be had.
"""
import os
import subprocess
import sys

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness as H  # noqa: E402
import test_smollm2_greedy as S  # noqa: E402  (fetch(): the reference Python or SKIP)
import test_rope_models as R  # noqa: E402  (compare(), log_softmax(), STEPS, TOP)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HF_MODELS = os.path.join(ROOT, "tests", "reference", "hf-moe-models.py")
NUMPY_REF = os.path.join(ROOT, "tests", "reference", "reference.py")
LAYOUTS = [(1, 1, 1), (2, 2, 1), (4, 4, 1), (2, 2, 2), (1, 2, 1),
           (2, 1, 1), (4, 1, 1), (2, 1, 2)]  # (ep, tp, pp)
H.TEST_DEADLINE_S = 230

# Qwen3-MoE models of `ganglion mkmodel` (numpy reference): (name, flags, prompt).
NUMPY_MODELS = [
    ("qwen3moe-64x8-dense-first",
     ["--arch", "qwen3", "--moe", "qwen3", "--layers", "3", "--hidden", "64", "--heads", "4",
      "--kv-heads", "2", "--head-dim", "32", "--ffn", "96", "--moe-ffn", "32", "--experts",
      "64", "--top-k", "8", "--norm-topk", "--dense-layers", "1", "--vocab", "256", "--seed",
      "25"], [2 + (i * 89 + 7) % 254 for i in range(40)]),
    ("qwen3moe-8x2", ["--arch", "qwen3", "--moe", "qwen3", "--layers", "2", "--hidden", "48",
                      "--heads", "4", "--kv-heads", "2", "--ffn", "64", "--experts", "8",
                      "--top-k", "2", "--vocab", "256", "--seed", "26"],
     [2 + (i * 61 + 11) % 254 for i in range(30)]),
]


def hf_reference(py, workdir):
    """The JSON lines of hf-moe-models.py (one per model)."""
    import json
    r = subprocess.run([py, HF_MODELS, "--workdir", workdir, "--steps", str(R.STEPS)],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=150,
                       env=dict(os.environ, TQDM_DISABLE="1"))
    H.check(r.returncode == 0, "hf-moe-models.py failed (%d): %s"
            % (r.returncode, r.stderr.decode(errors="replace")[-2000:]))
    return [json.loads(ln) for ln in r.stdout.decode().strip().splitlines()]


def numpy_reference(h, py):
    """Each model of NUMPY_MODELS made by mkmodel and decoded greedily by reference.py."""
    import json
    out = []
    for name, flags, prompt in NUMPY_MODELS:
        d = os.path.join(h.tmp, "models", name)
        subprocess.run([h.bin, "mkmodel", "--out", d] + flags, check=True,
                       stdout=subprocess.DEVNULL)
        ids, rows = [], []
        for _ in range(R.STEPS):
            r = subprocess.run([py, NUMPY_REF, "logits", d, "--ids",
                                ",".join(map(str, prompt + ids))],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60)
            H.check(r.returncode == 0, "reference.py failed (%d): %s"
                    % (r.returncode, r.stderr.decode(errors="replace")[-2000:]))
            lp = R.log_softmax(json.loads(r.stdout)["logits"])
            rows.append(lp)
            ids.append(max(range(len(lp)), key=lambda i: (lp[i], -i)))
        out.append({"name": name + " (numpy reference)", "dir": d, "prompt": prompt,
                    "ids": ids, "logprobs": rows})
    return out


def serve_answer(h, model_dir, prompt, ep, tp, pp, extra=()):
    """The completion of a gang of pp nodes x max(ep, tp) ranks (a stage) serving model_dir
    with --ep ep."""
    g = H.Gang(h, nnodes=pp, nproc_per_node=max(ep, tp),
               extra=["--model", model_dir, "--tp", str(tp), "--pp", str(pp), "--ep", str(ep),
                      "--request-timeout-ms", "60000", "--step-timeout-ms", "10000"]
               + list(extra))
    g.start_local()
    try:
        g.wait_serving(timeout=60)
        code, r = H.http_post(g.addr(0), g.http_port, "/v1/completions",
                              {"prompt": prompt, "max_tokens": R.STEPS, "temperature": 0,
                               "logprobs": R.TOP}, 60.0)
        H.check(code == 200, "ep %d tp %d pp %d: HTTP %r %r" % (ep, tp, pp, code, r))
        return r["choices"][0]
    finally:
        g.stop()


def refused(h, model_dir):
    """--ep 3 with --tp 2 (an EP group that is not whole TP groups) is refused up front, the
    message naming what is supported."""
    r = subprocess.run([h.bin, "serve", "--check-config", "--nnodes", "1", "--nproc-per-node",
                        "3", "--node-index", "0", "--coordinator", "127.0.0.1:1", "--model",
                        model_dir, "--ep", "3", "--tp", "2"],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=30,
                       env=h.clean_env())
    err = r.stdout.decode(errors="replace")
    H.check(r.returncode == 2 and "--ep 3 with --tp 2" in err and "multiple of --tp" in err,
            "--ep 3 --tp 2: exit %d, %r" % (r.returncode, err[-400:]))


def info_check(h, model_dir):
    """`ganglion info --model` names the experts and the active parameters, and the heaviest
    rank's weights shrink with the EP x TP group; --ep 4 --tp 1 says the world is ep x pp;
    --ep 2 --tp 4 (narrower than TP) is refused (exit 2)."""
    def info(tp, ep):
        r = subprocess.run([h.bin, "info", "--model", model_dir, "--tp", str(tp), "--ep",
                            str(ep)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           timeout=30)
        return r.returncode, r.stdout.decode(errors="replace")

    def mib(out):
        ln = [x for x in out.splitlines() if x.startswith("layout tp")][0]
        return float(ln.split("holds ")[1].split(" MiB")[0])

    code, one = info(1, 1)
    H.check(code == 0 and "mixture of experts (qwen2_moe): 64 experts of width 32, top 8" in one
            and "parameters active per token" in one, "info --model: %r" % one[-600:])
    code, four = info(4, 4)
    H.check(code == 0 and mib(four) < mib(one) / 2,
            "ep 4: %s MiB per rank, ep 1: %s" % (mib(four), mib(one)))
    code, wide = info(1, 4)
    H.check(code == 0 and "(4 ranks)" in wide and "world 4 = ep 4 x pp 1" in wide
            and mib(wide) < mib(one), "info --ep 4 --tp 1: %d %r" % (code, wide[-600:]))
    code, out = info(4, 2)
    H.check(code == 2 and "refused" in out and "narrower" in out,
            "info --ep 2 --tp 4: %d %r" % (code, out[-300:]))


def scenario(h):
    py = S.fetch("python")
    refs = hf_reference(py, os.path.join(h.tmp, "models"))
    H.check(len(refs) == 3, "hf-moe-models.py made %d models" % len(refs))
    refused(h, refs[0]["dir"])
    info_check(h, refs[1]["dir"])
    refs += numpy_reference(h, py)
    for ref in refs:
        for ep, tp, pp in LAYOUTS:
            choice = serve_answer(h, ref["dir"], ref["prompt"], ep, tp, pp)
            worst = R.compare(ref["name"], tp, pp, ref, choice)
            H.log("%s ep %d tp %d pp %d: %d tokens equal, max logprob difference %.2e"
                  % (ref["name"], ep, tp, pp, R.STEPS, worst))


if __name__ == "__main__":
    H.run(scenario)
