#!/usr/bin/env python3
"""Model errors are never retried and say why. (1) A config the layout cannot take (heads
not divisible by tp) and a missing config.json are refused before anything starts:
`serve --check-config` exits 2 / 3 with the reason. (2) Weights that cannot be loaded
(model.safetensors truncated) are found by the workers: each exits 3, its agent stops
with exit code 3 instead of restarting it, the reason reaches the termination log, and
the local gang exits 3."""
import os
import subprocess
import sys

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness as H  # noqa: E402


def check_config(h, model, tp, want, text):
    argv = [h.bin, "serve", "--check-config", "--nnodes", "1", "--nproc-per-node", str(tp),
            "--node-index", "0", "--coordinator", "127.0.0.1:1", "--tp", str(tp),
            "--model", model]
    r = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=30,
                       env=h.clean_env())
    out = r.stdout.decode()
    H.check(r.returncode == want, "check-config %s tp %d exited %d (expected %d): %s"
            % (model, tp, r.returncode, want, out))
    H.check(text in out, "check-config did not say %r: %s" % (text, out))
    H.log("check-config tp %d -> %d: %s" % (tp, want, out.strip().splitlines()[-1]))


def scenario(h):
    model = H.mkmodel(h.bin, os.path.join(h.tmp, "model"), layers=2, hidden=64, heads=4,
                      kv_heads=2, ffn=128, vocab=256, seed=5)
    check_config(h, model, 2, 0, "# model:")
    check_config(h, model, 3, 2, "does not divide")
    check_config(h, os.path.join(h.tmp, "nowhere"), 1, 3, "config.json")

    # Truncate the weights: the header still parses, the data section is short.
    st = os.path.join(model, "model.safetensors")
    size = os.path.getsize(st)
    with open(st, "r+b") as f:
        f.truncate(size // 2)
    open(h.termination_log, "w").close()  # kubelet creates it; the agent only writes it
    g = H.Gang(h, nnodes=2, nproc_per_node=1, extra=["--model", model, "--tp", "1", "--pp", "2"])
    local = g.start_local(expect=(3,))
    code = local.wait(30)
    H.check(code == 3, "the local gang exited %r, expected 3 (model error)" % code)
    with open(h.termination_log) as f:
        reason = f.read()
    H.check("model" in reason and "not retried" in reason and "safetensors" in reason,
            "termination log does not give the model error: %r" % reason)
    H.log("termination log: %s" % reason.strip())
    text = local.log_text()
    H.check("safetensors" in text, "no log line names the weights file")


if __name__ == "__main__":
    H.run(scenario)
