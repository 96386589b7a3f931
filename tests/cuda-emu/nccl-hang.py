#!/usr/bin/env python3
"""A worker that hangs (SIGSTOP) in the middle of a request, its TP group over NCCL: the
CUDA emulator's ctest nccl-hang-emu (tests/cuda-emu/, docs/gpu.md "The CUDA emulator").

    nccl-hang.py --bin BIN      (with the emulator's GANGLION_CUDA_LIBRARY_DIR,
                                 GANGLION_NCCL_LIBRARY and GANG_EMU_DEVICES=2)

One node of two workers, --tp 2 over NCCL on two emulated GPUs, a tiny Llama from
`ganglion mkmodel`. A healthy gang answers a prompt greedily (the expected tokens). Then a
new gang gets the same request and, once the answer is under way, worker rank 0 is
stopped: the process whose unique id the TP group was made from, so its peer's NCCL
operations wait on a process that neither answers nor exits. The heartbeat must see the
hang, the gang abort, the hung worker be replaced while rank 1 aborts in place (the same
process serves on: its host thread, never held by a launch behind the all-reduce that
waits on the stopped rank, since the emulator's streams run ahead of the host behind a
pending operation as a GPU's do, reaches the step's settle, which polls with the deadline
and the abort flag; a state query of the stopped peer gives up after 200 ms), the next
generation's communicators form from a new unique id, the gang serve that generation
within the heartbeat timeout plus 10 s, and the request, resubmitted, end with the
healthy gang's tokens. The decode steps run as CUDA graphs with the all-reduces inside
(serve's default), in both generations: the settle that sees the hang waits for a replay.
Before the hang, a gang whose every capture on GPU 1 fails (GANG_EMU_CAPTURE_FAIL=1) must
serve the healthy tokens in its first generation, both ranks having dropped their captures.
Exit 0 pass, 1 fail.
"""
import os
import re
import signal
import subprocess
import sys
import threading
import time

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "mp"))
import harness as H  # noqa: E402

PROMPT = [5, 9, 77, 31, 2, 100, 45, 13]
TOKENS = 160


def flags(model):
    return ["--model", model, "--tp", "2", "--device", "cuda", "--backend", "nccl",
            "--gpu-memory-mb", "256", "--max-ctx", "256", "--kv-cache-mb", "16",
            "--request-timeout-ms", "90000", "--step-timeout-ms", "5000",
            "--nccl-library", os.environ.get("GANGLION_NCCL_LIBRARY", ""),
            "--cuda-library-dir", os.environ.get("GANGLION_CUDA_LIBRARY_DIR", "")]


def ask(g, out):
    code, r = H.http_post(g.addr(0), g.http_port, "/v1/completions",
                          {"prompt": PROMPT, "max_tokens": TOKENS, "temperature": 0,
                           "ignore_eos": True}, 90.0)
    out["code"], out["body"] = code, r
    out["tokens"] = r["choices"][0]["tokens"] if code == 200 else None


def capture_fails(h, model, want):
    """Every capture on GPU 1 (worker rank 1's) fails: the ranks agree to drop theirs and
    the gang serves the same tokens without graphs, in its first generation (before, rank
    1's step failed and the gang re-formed at every capture)."""
    os.environ["GANG_EMU_CAPTURE_FAIL"] = "1"  # inherited by the gang's processes
    try:
        g = H.Gang(h, nnodes=1, nproc_per_node=2, extra=flags(model))
        g.start_local()
    finally:
        del os.environ["GANG_EMU_CAPTURE_FAIL"]
    gen = g.wait_serving(timeout=60)
    got = {}
    ask(g, got)
    H.check(got["code"] == 200 and got["tokens"] == want,
            "GPU 1's captures failing: HTTP %r, tokens %s, the graphs' %s"
            % (got["code"], got.get("tokens"), want))
    H.check(g.coord()["generation"] == gen, "the gang re-formed after the failed capture")
    text = g.local.log_text()
    n = sum(1 for ln in text.splitlines()
            if "could not be captured as a graph on 1 of 2 ranks" in ln)
    H.check(n == 2, "%d ranks said they dropped the capture, expected 2" % n)
    H.check(re.search(r"of batch \d+ captured as a graph", text) is None,
            "a rank captured its step all the same")
    H.log("GPU 1's captures failing: both ranks ran without graphs, generation %d, the "
          "graphs' tokens" % gen)
    H.check(g.stop()["local"] == 0, "local gang did not exit 0")


def scenario(h):
    H.check(os.environ.get("GANG_EMU_DEVICES") == "2",
            "run with GANG_EMU_DEVICES=2 (two emulated GPUs: NCCL wants one per rank)")
    model = os.path.join(h.tmp, "llama")
    subprocess.run([h.bin, "mkmodel", "--out", model, "--layers", "2", "--hidden", "64",
                    "--heads", "4", "--kv-heads", "2", "--ffn", "128", "--vocab", "256",
                    "--seed", "11"], check=True, stdout=subprocess.DEVNULL)
    healthy = H.Gang(h, nnodes=1, nproc_per_node=2, extra=flags(model))
    healthy.start_local()
    healthy.wait_serving(timeout=60)
    want = {}
    t = time.monotonic()
    ask(healthy, want)
    took = time.monotonic() - t
    H.check(want["code"] == 200 and len(want["tokens"]) == TOKENS,
            "healthy gang: HTTP %r %r" % (want["code"], want["body"]))
    healthy.stop()
    H.log("healthy gang: %d tokens in %.2f s" % (TOKENS, took))
    capture_fails(h, model, want["tokens"])

    g = H.Gang(h, nnodes=1, nproc_per_node=2, extra=flags(model))
    g.start_local()
    gen0 = g.wait_serving(timeout=60)
    victim, peer = g.worker_pid(0, 0), g.worker_pid(0, 1)
    got = {}
    th = threading.Thread(target=ask, args=(g, got), daemon=True)
    th.start()
    time.sleep(min(0.3 * took, 2.0))  # the answer under way
    H.check(th.is_alive(), "the request ended before the hang (%.2f s for the whole "
            "answer): nothing was tested" % took)
    t_stop = time.monotonic()
    os.kill(victim, signal.SIGSTOP)
    H.log("SIGSTOP of worker rank 0 (pid %d) in generation %d" % (victim, gen0))
    try:
        gen = g.wait_serving(timeout=30, min_gen=gen0)
        t_ready = time.monotonic() - t_stop
        th.join(90)
    finally:
        try:
            os.kill(victim, signal.SIGCONT)  # if it is still there, let it die
        except ProcessLookupError:
            pass
    H.check(gen == gen0 + 1, "gang serves generation %d, expected %d" % (gen, gen0 + 1))
    H.check(not th.is_alive(), "the request did not end within 90 s of the hang")
    H.check(got.get("code") == 200,
            "after the hang: HTTP %r %r" % (got.get("code"), got.get("body")))
    H.check(got["tokens"] == want["tokens"], "tokens after the hang %s, healthy gang's %s"
            % (got["tokens"], want["tokens"]))
    new0 = g.worker_pid(0, 0)
    H.check(new0 != victim, "the hung worker %d was not replaced" % victim)
    H.check(g.worker_pid(0, 1) == peer, "rank 1 (pid %d) was replaced too, not aborted in "
            "place: its wait for the stopped peer did not end at the abort" % peer)
    lf = g.status(0).get("last_failure") or {}
    H.log("hang of rank 0: serving generation %d again after %.2f s (heartbeat timeout %d "
          "ms); last_failure %r; tokens equal" % (gen, t_ready, g.hb_timeout_ms, lf))
    H.check(t_ready < g.hb_timeout_ms / 1000.0 + 10.0,
            "the gang took %.2f s to serve again after the hang" % t_ready)
    # The decode steps ran as graphs holding their NCCL all-reduces, before the hang and
    # after it: the survivor (rank 1) dropped its graphs with the old communicators at the
    # reset and captured new ones, as did the replacement.
    text = g.local.log_text()
    for gn in (gen0, gen):
        n = sum(1 for ln in text.splitlines() if "gen=%d " % gn in ln and
                "captured as a graph, its TP collectives (NCCL) inside" in ln)
        H.check(n >= 2, "generation %d: %d ranks captured their decode step with its NCCL "
                "all-reduces as a graph, expected 2" % (gn, n))
    H.check(g.stop()["local"] == 0, "local gang did not exit 0")


if __name__ == "__main__":
    H.run(scenario, name="nccl-hang")
