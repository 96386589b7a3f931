#!/usr/bin/env python3
"""A rank killed inside the all-to-all of expert parallelism (issue #25): the gang aborts
like for any other failure, re-forms in the next generation, and the request in flight
finishes with the healthy gang's tokens.

A tiny Mixtral-structured model (`ganglion mkmodel --moe mixtral`: 8 experts, top-2) is
served on 2 nodes x 2 ranks, --tp 2 --pp 2 --ep 2 (the experts of each stage split over its
TP group, the tokens exchanged by all-to-all), then again with --tp 1 --pp 2 --ep 2 (the
EP group wider than TP: each stage's two ranks replicate the attention and split the
experts). For each layout, first a healthy gang answers the prompt
greedily (the expected tokens), and every rank's /metrics shows the routed pairs by expert
and by EP rank (equal totals; a stage's two ranks together route each position once, top-2).
Then a gang with the test-only fault
GANGLION_FAULT_MOE_A2A=MARKER:1:5 (parallel/moe.c: the first process to reach its 5th
dispatch as EP rank 1 -- decode, layer 0 -- creates MARKER and SIGKILLs itself between the
counts' all-to-all and the rows', once) gets the same request: its peer fails inside the
all-to-all with a peer error, the coordinator records the failed rank, the gang serves
generation + 1, the API resubmits the request, and the answer's tokens equal the healthy
gang's. The marker proves the fault fired inside the exchange.

With GANG_MP_MOE_NCCL=1 (the ctest moe-kill-nccl-emu of the CUDA emulator's build,
tests/cuda-emu/): the same on --device cuda over NCCL, one node of 2 ranks (--tp 2, then
--tp 1; --ep 2, no PP), each rank a process on its own emulated GPU (GANG_EMU_DEVICES=2),
the second time killing EP rank 0, whose process made the NCCL unique id:
the killed rank's peer fails inside NCCL's all-to-all, the communicators of the next
generation form from a new unique id, and the tokens are the healthy NCCL gang's. The load
metrics are the CPU run's check (they do not depend on the backend).
"""
import os
import subprocess
import sys

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness as H  # noqa: E402

NNODES, NPROC = 2, 2
FLAGS = ["--pp", "2", "--ep", "2", "--request-timeout-ms", "60000", "--step-timeout-ms", "5000"]
TPS = [2, 1]  # --tp: EP = TP, then EP wider than TP (the same 2 x 2 ranks)
NCCL = os.environ.get("GANG_MP_MOE_NCCL") == "1"
if NCCL:
    NNODES = 1
    FLAGS = ["--ep", "2", "--request-timeout-ms", "60000", "--step-timeout-ms", "5000",
             "--device", "cuda", "--backend", "nccl", "--gpu-memory-mb", "512",
             "--nccl-library", os.environ.get("GANGLION_NCCL_LIBRARY", ""),
             "--cuda-library-dir", os.environ.get("GANGLION_CUDA_LIBRARY_DIR", "")]
PROMPT = [2 + (i * 53 + 3) % 250 for i in range(24)]
TOKENS = 10


def ask(g):
    code, r = H.http_post(g.addr(0), g.http_port, "/v1/completions",
                          {"prompt": PROMPT, "max_tokens": TOKENS, "temperature": 0}, 60.0)
    H.check(code == 200, "HTTP %r %r" % (code, r))
    return r["choices"][0]["tokens"]


def moe_samples(text, name):
    """{(rank, index): value} of metric family name (labels rank and expert / ep_rank)."""
    out = {}
    for ln in text.splitlines():
        if ln.startswith(name + "{"):
            labels = dict(kv.split("=") for kv in ln[len(name) + 1:ln.index("}")].split(","))
            idx = labels.get("expert", labels.get("ep_rank", "-1")).strip('"')
            out[(int(labels["rank"].strip('"')), int(idx))] = float(ln.split()[-1])
    return out


def check_load_metrics(g):
    """Every rank reports its routed pairs in /metrics (issue #25): by expert and by EP rank,
    the two totals equal, and the prompt's and answer's tokens all routed by some rank."""
    def loaded():
        exp, ranks = {}, {}
        for node in range(NNODES):
            code, text = g.get(node, "/metrics")
            if code != 200:
                return None
            exp.update(moe_samples(text, "ganglion_moe_expert_tokens_total"))
            ranks.update(moe_samples(text, "ganglion_moe_ep_rank_tokens_total"))
            if "ganglion_moe_load_max_over_mean{" not in text:
                return None
        got = {r for r, _ in exp}
        if got != set(range(NNODES * NPROC)):
            return None
        # Published about once per heartbeat interval: wait for the whole request's.
        return (exp, ranks) if sum(v for (rk, _), v in exp.items() if rk in (0, 1)) == want \
            else None

    want = 2 * (len(PROMPT) + TOKENS - 1)  # top-2, one layer per stage
    try:
        exp, ranks = H.wait_until(loaded, 10, 0.05, "the MoE load metrics of every rank")
    except Exception:
        code, text = g.get(0, "/metrics")
        H.log("\n".join(ln for ln in text.splitlines() if "moe" in ln))
        raise
    for r in range(NNODES * NPROC):
        by_e = sum(v for (rk, _), v in exp.items() if rk == r)
        by_r = sum(v for (rk, _), v in ranks.items() if rk == r)
        H.check(by_e == by_r, "rank %d: %d pairs by expert, %d by EP rank" % (r, by_e, by_r))
    # Each stage's two EP ranks together route every position once (its one layer), top-2.
    stage0 = sum(v for (rk, _), v in exp.items() if rk in (0, 1))
    H.log("MoE load metrics: stage 0 routed %d pairs over %d experts" % (stage0, 8))


def scenario(h):
    model = os.path.join(h.tmp, "mixtral")
    subprocess.run([h.bin, "mkmodel", "--out", model, "--arch", "mistral", "--moe", "mixtral",
                    "--layers", "2", "--hidden", "64", "--heads", "4", "--kv-heads", "2",
                    "--ffn", "64", "--experts", "8", "--top-k", "2", "--vocab", "256",
                    "--seed", "31"], check=True, stdout=subprocess.DEVNULL)
    for tp in TPS:
        kill_inside(h, model, tp)


def kill_inside(h, model, tp):
    """The healthy answer, then the kill inside the all-to-all, with --tp tp."""
    flags = ["--model", model, "--tp", str(tp)] + FLAGS
    H.log("--tp %d %s" % (tp, " ".join(FLAGS[:2] if NCCL else FLAGS[:4])))
    healthy = H.Gang(h, nnodes=NNODES, nproc_per_node=NPROC, extra=flags)
    healthy.start_local()
    healthy.wait_serving(timeout=60)
    want = ask(healthy)
    H.check(len(want) == TOKENS, "healthy gang answered %d tokens" % len(want))
    if not NCCL:
        check_load_metrics(healthy)
    healthy.stop()
    H.log("healthy gang: %s" % want)

    # Over NCCL the second layout kills EP rank 0 instead: the process whose unique id the
    # generation's communicators were made from (the peer's side of NCCL goes with it).
    victim = 0 if NCCL and tp == 1 else 1
    marker = os.path.join(h.tmp, "fault-fired-tp%d" % tp)
    g = H.Gang(h, nnodes=NNODES, nproc_per_node=NPROC, extra=flags)
    g.local = h.spawn("local", [h.bin, "serve", "--local"] + g.flags, (0,),
                      env={"GANGLION_FAULT_MOE_A2A": "%s:%d:5" % (marker, victim)})
    gen0 = g.wait_serving(timeout=60)
    got = ask(g)
    H.check(os.path.exists(marker), "the fault did not fire (no %s)" % marker)
    H.check(got == want, "tokens after the kill %s, healthy gang's %s" % (got, want))
    gen = g.wait_serving(timeout=30, min_gen=gen0)
    H.check(gen == gen0 + 1, "gang serves generation %d, expected %d" % (gen, gen0 + 1))
    lf = g.status(0).get("last_failure") or {}
    H.check(lf.get("rank") in ((victim,) if NCCL else (1, 3)),
            "last_failure %r does not name EP rank %d of a stage" % (lf, victim))
    code, text = g.get(0, "/metrics")
    resub = [ln for ln in text.splitlines() if ln.startswith("ganglion_request_resubmits_total")]
    H.check(code == 200 and resub and float(resub[0].split()[-1]) >= 1,
            "the request was not resubmitted: %r" % resub)
    H.log("rank %s killed inside the all-to-all (%s); generation %d -> %d; tokens equal"
          % (lf.get("rank"), lf.get("reason"), gen0, gen))
    H.check(g.stop()["local"] == 0, "local gang did not exit 0")


if __name__ == "__main__":
    H.run(scenario)
