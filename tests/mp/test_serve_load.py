#!/usr/bin/env python3
"""The serving load benchmark runs end to end on the real model: `bench/serve-load.py
--quick` starts a local gang on SmolLM2-135M-Instruct, sends 4 streamed text completions
from 4 concurrent clients (each answer forced to its length with ignore_eos), runs the
same requests through transformers in a static batch, and writes its JSON. Checked here:
both sides measured every request, the figures are positive and consistent (TTFT below the
end-to-end latency, output tokens = the answers asked for), and the benchmark itself
checked every answer's length and prompt token count. (The figures are measured on a quiet
machine and written to docs/benchmarks.md; this only keeps the benchmark working.)

SKIP (77), with the reason, when scripts/fetch-reference.sh cannot give the model or the
reference Python (run scripts/install-deps.sh once)."""
import json
import os
import sys

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness as H  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
H.TEST_DEADLINE_S = 100
BENCH_TIMEOUT_S = 80


def fetch(what):
    """fetch-reference.sh WHAT, or SKIP (harness.fetch_reference)."""
    return H.fetch_reference(what, 60)


def scenario(h):
    py = fetch("python")
    model = fetch("smollm2")
    out = os.path.join(h.tmp, "load.json")
    p = h.spawn("serve-load", [py, os.path.join(ROOT, "bench", "serve-load.py"), "--bin", h.bin,
                               "--model", model, "--quick", "--json", out],
                env={"TQDM_DISABLE": "1", "TOKENIZERS_PARALLELISM": "false"})
    code = p.wait(BENCH_TIMEOUT_S)
    H.check(code is not None, "serve-load.py --quick did not finish in %d s" % BENCH_TIMEOUT_S)
    H.check(code == 0, "serve-load.py --quick exited %d" % code)
    with open(out) as f:
        d = json.load(f)
    info, res = d["info"], d["results"]
    H.check(set(res) == {"ganglion", "peer"}, "sides measured: %r" % list(res))
    for side in ("ganglion", "peer"):
        runs = res[side]["4"]["runs"]
        H.check(len(runs) == 1, "%s: %d runs" % (side, len(runs)))
        r = runs[0]
        H.check(r["requests"] == 4 and r["out_tokens"] == info["answer_tokens_total"],
                "%s measured %r, %d answer tokens asked" % (side, r, info["answer_tokens_total"]))
        H.check(0 < r["ttft_p50_ms"] <= r["ttft_p99_ms"] and r["ttft_p50_ms"] < r["e2e_p50_ms"],
                "%s: TTFT %r" % (side, r))
        H.check(0 < r["itl_p50_ms"] <= r["itl_p99_ms"] and r["out_tok_per_s"] > 0,
                "%s: ITL / throughput %r" % (side, r))
        H.log("%s: %.1f output tok/s, TTFT p50 %.0f ms, ITL p50 %.1f ms"
              % (side, r["out_tok_per_s"], r["ttft_p50_ms"], r["itl_p50_ms"]))
    H.log("greedy tokens agree on %.0f%% of the requests; %.0f s in all"
          % (100 * info["greedy_tokens_agree"], info["wall_s"]))


if __name__ == "__main__":
    H.run(scenario)
