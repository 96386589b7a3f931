#!/usr/bin/env python3
"""`ganglion bench decode --device fake|cuda`: the decode step's counters (issue #24).

Runs batches 1, 8 and 32 (on "cuda", 1, 4 and 8 with a shorter prompt: there it is the
CUDA emulator of tests/cuda-emu/, which runs every CUDA thread of a prefill's kernels as a
fiber) on the 1x1 layout of a tiny model (bf16 and int8 storages) and
checks each point's JSON line: the model drawn once per storage (batch 1's point draws it,
"model_kept" false; the others reuse it, true), host_syncs_per_step <= 1, allocs_per_step 0,
launches_per_step the same at every batch size (of one storage), h2d and d2h bytes per
step O(batch): at most 64 and 4 bytes per sequence, never a row of logits (vocab x 4
bytes) per sequence. The agreement iteration (logprobs) is not timed, so it is not in
the figures.
On "cuda" the counters are the real backend's (its CUDA graphs, its one sync per step),
and a second run with --cuda-graphs 0 must count, point for point, what the fake device
counts (the issue's "they must match the fake device's"; with graphs a replayed step
counts one graph launch instead of its kernels). A third run adds the nccl point (a
one-rank nccl TP group, on the NCCL emulator) and, with GANG_EMU_DEVICES >= 2, the
2x1-nccl point (TP 2 on two emulated GPUs over NCCL, the all-reduces in the step's graph):
each must count what 1x1 counts (the busiest rank's counters). A fourth, with --cuda-pdl 1,
must count what the first counted. --fuse-residual 0 (no graphs) must count 2 x layers + 1
more launches than the fused step, and so must --variants unfused beside its own run's 1x1
point (variants()). Then --trace-kernels 1 (the emulated CUPTI): the
one-rank points' traces held together (traced()). On "fake", the model's host build
reuses its heap from layer to layer (build_reuses_heap()).
Usage: bench-decode-counters.py GANGLION_BINARY [fake|cuda]
"""
import json
import os
import subprocess
import sys

VOCAB = 128
LAYERS = 2
FIELDS = ("host_syncs_per_step", "launches_per_step", "allocs_per_step",
          "h2d_bytes_per_step", "d2h_bytes_per_step")


def fail(msg):
    print("FAIL: " + msg, file=sys.stderr)
    sys.exit(1)


def run_points(binary, device, batches, prompt, extra=(), log=None):
    """The decode points of one bench run (bf16 and int8 unless extra names --dtypes, 1x1
    unless it names --layouts) as parsed JSON lines (its stderr appended to the list log,
    when given)."""
    cmd = [binary, "bench", "decode", "--device", device, "--layers", str(LAYERS),
           "--hidden", "64", "--heads", "4", "--kv-heads", "2", "--ffn", "128",
           "--vocab", str(VOCAB), "--prompt", prompt, "--tokens", "6", "--iters", "2",
           "--warmup", "1", "--batch", batches, "--gpu-memory-mb", "256",
           "--bw-mib", "16"] + list(extra)
    if "--dtypes" not in extra:
        cmd += ["--dtypes", "bf16,int8"]
    if "--layouts" not in extra:
        cmd += ["--layouts", "1x1"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if out.returncode != 0:
        fail("exit %d: %s" % (out.returncode, out.stderr[-2000:]))
    if log is not None:
        log.append(out.stderr)
    points = []
    for line in out.stdout.splitlines():
        d = json.loads(line)
        if "error" in d:
            fail("a point failed: " + line)
        if "skipped" in d:
            fail("the benchmark skipped: " + line)
        if "batch" in d and "tp" in d:
            points.append(d)
    return points


def same_as_fake(binary):
    """cuda without graphs counts what the fake device counts, point by point: the front
    counts backend calls, and the fake has no graphs (docs/gpu.md, "Counters")."""
    fake = run_points(binary, "fake", "1,4", "4")
    cuda = run_points(binary, "cuda", "1,4", "4", ["--cuda-graphs", "0"])
    if len(fake) != 4 or len(cuda) != 4:
        fail("expected 4 points on each device, got fake %d, cuda %d" % (len(fake), len(cuda)))
    for f, c in zip(fake, cuda):
        a, b = [f[k] for k in FIELDS], [c[k] for k in FIELDS]
        print("%s batch %d: fake %s, cuda --cuda-graphs 0 %s" % (f["storage"], f["batch"], a, b))
        if (f["storage"], f["batch"]) != (c["storage"], c["batch"]) or a != b:
            fail("%s batch %d: the CUDA backend's counters differ from the fake device's"
                 % (f["storage"], f["batch"]))
    return cuda


def unfused_counts(binary, fused):
    """--fuse-residual 0 (gang_kernels_matmul_fused's norms and adds refused: the step as it
    was before they went into the products), without graphs: 2 x layers + 1 more launches a
    step than with them (an add+norm twice a layer, the first layer's norm and the last
    add's, where the products did it), every other counter the same, the points saying
    fuse_residual false. bf16 only: the separate calls are the same for int8, and every
    fake-device run takes them."""
    pts = run_points(binary, "cuda", "1,4", "4",
                     ["--cuda-graphs", "0", "--fuse-residual", "0", "--dtypes", "bf16"])
    want = {(d["storage"], d["batch"]): d for d in fused}
    if len(pts) != 2:
        fail("--fuse-residual 0: expected 2 points, got %d" % len(pts))
    for d in pts:
        f = want.get((d["storage"], d["batch"]))
        print("%s batch %d: --fuse-residual 0 %s launches/step, fused %s"
              % (d["storage"], d["batch"], d["launches_per_step"],
                 None if f is None else f["launches_per_step"]))
        if f is None or d.get("fuse_residual") is not False or f.get("fuse_residual") is not True:
            fail("%s batch %d: --fuse-residual 0: no fused point to compare, or the points "
                 "do not say which they are" % (d["storage"], d["batch"]))
        if abs(d["launches_per_step"] - f["launches_per_step"] - (2 * LAYERS + 1)) > 1e-9 or \
                [d[k] for k in FIELDS if k != "launches_per_step"] != \
                [f[k] for k in FIELDS if k != "launches_per_step"]:
            fail("%s batch %d: --fuse-residual 0 counts %s, fused %s (want %d more launches)"
                 % (d["storage"], d["batch"], [d[k] for k in FIELDS],
                    [f[k] for k in FIELDS], 2 * LAYERS + 1))


def nccl_same_as_socket(binary):
    """cuda's nccl point (1x1 whose TP group is a one-rank nccl communicator, on the NCCL
    emulator; its all-reduces captured into the step's graph) counts what 1x1 counts: the
    communicator adds no host sync and no launch to a step (as on the H200). So does
    2x1-nccl (TP 2 on two GPUs over NCCL) where two emulated GPUs are: a TP rank's step is
    the 1x1 step's, its collectives inside the graph."""
    two = int(os.environ.get("GANG_EMU_DEVICES", "1")) >= 2
    layouts = "1x1,nccl,2x1-nccl" if two else "1x1,nccl"
    pts = run_points(binary, "cuda", "1,4", "4", ["--layouts", layouts])
    by = {(d["storage"], d["batch"], d.get("backend"), d["tp"]): [d[k] for k in FIELDS]
          for d in pts}
    for st in ("bf16", "int8"):
        for b in (1, 4):
            a = by.get((st, b, "socket", 1))
            for name, key in (("nccl", (st, b, "nccl", 1)), ("2x1-nccl", (st, b, "nccl", 2))):
                if name == "2x1-nccl" and not two:
                    continue
                print("%s batch %d: 1x1 %s, %s %s" % (st, b, a, name, by.get(key)))
                if a is None or by.get(key) is None or a != by[key]:
                    fail("%s batch %d: the %s point's counters differ from 1x1's (or a point "
                         "is missing)" % (st, b, name))
    if not two:
        print("2x1-nccl not run: GANG_EMU_DEVICES < 2")


def pdl_same_counts(binary, plain):
    """--cuda-pdl 1 (the decode GEMVs as programmatic dependent launches): the backend
    takes the option on the emulated H200 (compute capability 9.0, its log line says so),
    the points say pdl true, and a step counts what it counts without (a PDL launch is a
    launch; the emulator runs a stream's kernels in order, so the tokens are the same)."""
    log = []
    pts = run_points(binary, "cuda", "1,4", "4", ["--cuda-pdl", "1"], log)
    if "launch as programmatic dependents (PDL)" not in log[0]:
        fail("--cuda-pdl 1: the backend did not say it launches the GEMVs with PDL")
    want = {(d["storage"], d["batch"]): [d[k] for k in FIELDS] for d in plain}
    if len(pts) != 4:
        fail("--cuda-pdl 1: expected 4 points, got %d" % len(pts))
    for d in pts:
        got = [d[k] for k in FIELDS]
        print("%s batch %d: --cuda-pdl 1 %s" % (d["storage"], d["batch"], got))
        if d.get("pdl") is not True or got != want.get((d["storage"], d["batch"])):
            fail("%s batch %d: --cuda-pdl 1 counts %s (pdl %r), without %s"
                 % (d["storage"], d["batch"], got, d.get("pdl"),
                    want.get((d["storage"], d["batch"]))))


def variants(binary, fused):
    """--variants cublas,pdl,unfused (bf16, without graphs): after the points of the flags,
    the 1x1 point of each batch again per variant, on the kept handle and model (model_kept true;
    gang_kernels_retune sets the point's choices): unfused counts 2 x layers + 1 more
    launches than its batch's 1x1 point and its other counters the same, pdl and cublas
    count what it counts (a cuBLASLt product is one backend call too); every variant gives
    1x1's tokens; the 1x1 points, all run first, say the flags' choices. Batch 4's cublas
    point comes after batch 1's unfused one, so a handle left unfused would count more."""
    log = []
    pts = run_points(binary, "cuda", "1,4", "4",
                     ["--cuda-graphs", "0", "--variants", "cublas,pdl,unfused", "--dtypes",
                      "bf16"], log)
    if "launch as programmatic dependents (PDL)" not in log[0]:
        fail("--variants pdl: the backend did not say it launches the GEMVs with PDL")
    want = {(d["storage"], d["batch"]): d for d in fused}
    base = {(d["storage"], d["batch"]): d for d in pts if "variant" not in d}
    order = [(d["storage"], d["batch"], d.get("variant")) for d in pts]
    if order != [("bf16", 1, None), ("bf16", 4, None)] + \
            [("bf16", b, v) for b in (1, 4) for v in ("cublas", "pdl", "unfused")] or \
            len(base) != 2:
        fail("--variants: the points ran in the order %s" % order)
    for d in pts:
        key = (d["storage"], d["batch"])
        b, v = base[key], d.get("variant")
        got, ref = [d[k] for k in FIELDS], [b[k] for k in FIELDS]
        print("%s batch %d %s: %s (pdl %s, fused %s, half gemv %s)"
              % (key[0], key[1], v or "1x1", got, d.get("pdl"), d.get("fuse_residual"),
                 d.get("half_gemv")))
        if v is None:
            if got[1] != want[key]["launches_per_step"] or d["pdl"] or not d["fuse_residual"] \
                    or not d["half_gemv"]:
                fail("%s batch %d: the 1x1 point is not the flags' choices" % key)
            continue
        marks = {k: d.get(k) for k in ("model_kept", "tokens_match_1x1", "logits_match_1x1")}
        if list(marks.values()) != [True, True, True]:
            fail("%s batch %d %s: a new model, or other tokens than 1x1's: %s"
                 % (key[0], key[1], v, marks))
        extra = 2 * LAYERS + 1 if v == "unfused" else 0
        if got[1] != ref[1] + extra or got[:1] + got[2:] != ref[:1] + ref[2:]:
            fail("%s batch %d %s: counts %s, 1x1 %s (want %d more launches)"
                 % (key[0], key[1], v, got, ref, extra))
        if (v == "unfused") == d["fuse_residual"] or (v == "pdl") != d["pdl"] or \
                (v == "cublas") == d["half_gemv"]:
            fail("%s batch %d %s: the line says other choices" % (key[0], key[1], v))


def build_reuses_heap(binary):
    """The model's host build reuses its heap (bench/decode-gpu.c, gang__bd_gpu_model): three
    layers of the 1B shape (cut matrices of up to 64 MiB in f32, which glibc would map
    apart and unmap at free), and per layer after the first the process faults in no more
    than 1.5 x the bytes the layer stores: the fake device's memory is host pages, so the
    upload itself faults 1 x; a build that took fresh pages for its f32 cut (2 x) and its
    packed block would fault 3 x."""
    out = subprocess.run([binary, "bench", "decode", "--device", "fake", "--layers", "3",
                          "--vocab", "2048", "--dtypes", "bf16", "--layouts", "1x1", "--batch",
                          "1", "--tokens", "2", "--iters", "1", "--warmup", "0"],
                         capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        fail("the heap run: exit %d: %s" % (out.returncode, out.stderr[-1000:]))
    b = [json.loads(x) for x in out.stdout.splitlines() if '"model_build"' in x]
    if len(b) != 1:
        fail("the heap run: %d lines with model_build, want 1" % len(b))
    mb = b[0]["model_build"]
    ratio = mb["faults_per_later_layer"] * 4096.0 / mb["layer_bytes"]
    print("model build: %s (pages faulted per layer / the layer's stored bytes: %.2f)"
          % (mb, ratio))
    if not 0 < ratio <= 1.5:
        fail("the layers' host build faults in %.2f x the bytes a layer stores (want <= 1.5)"
             % ratio)


def check_trace(d, graphs):
    """One traced point's "trace" object: every timed decode step traced, the kernels all in
    the ops, busy <= device <= the step's wall time, the step's kernels in its graph (or
    none there without graphs), the GEMV and the step attention among them, no norm or add
    kernel but the final norm, nothing lost."""
    t = d.get("trace")
    name = "%s batch %d%s" % (d["storage"], d["batch"], "" if graphs else " --cuda-graphs 0")
    if t is None:
        fail("%s: --trace-kernels 1 but no trace: %s" % (name, d.get("trace_error")))
    ops = t["ops"]
    print("%s: %s kernels per step (%s in a graph), busy %s of %s us, ops %s"
          % (name, t["kernels_per_step"], t["graph_kernels_per_step"], t["busy_us_per_step"],
             t["step_us"], [(o["name"], o["per_step"]) for o in ops]))
    if t["steps"] != 2 * 5 or t["dropped"] != 0:
        fail("%s: %s steps traced (want 10: 2 iterations x 5 decode steps), %s dropped"
             % (name, t["steps"], t["dropped"]))
    if abs(sum(o["per_step"] for o in ops) - t["kernels_per_step"]) > 0.05:
        fail("%s: the ops do not add up to the kernels" % name)
    if not 0 < t["busy_us_per_step"] <= t["device_us_per_step"] + 0.02 <= t["step_us"] + 0.04:
        fail("%s: busy / device / step times out of order" % name)
    in_graph = t["graph_kernels_per_step"]
    if (graphs and not 0 < in_graph <= t["kernels_per_step"]) or (not graphs and in_graph != 0):
        fail("%s: %s kernels per step in a graph" % (name, in_graph))
    for want in ("gemv_kernel", "attention_step_kernel"):
        if not any(o["name"].startswith(want) for o in ops):
            fail("%s: no %s among the traced kernels" % (name, want))
    # The residual stream between the products (gang_kernels_matmul_fused): each layer's
    # input norms in its q|k|v and gate|up GEMVs, its o and down GEMVs adding to it; what
    # is left is the final norm before the LM head, one a step.
    per = {}
    for o in ops:
        base = o["name"].split(" ")[0].split("<")[0]
        per[base] = per.get(base, 0) + o["per_step"]
    if per.get("add_rmsnorm_kernel", 0) or per.get("add_kernel", 0) or \
            abs(per.get("rmsnorm_kernel", 0) - 1) > 0.05:
        fail("%s: norms and adds between the products: %s" % (name, per))
    return t["kernels_per_step"]


def traced(binary, plain):
    """--trace-kernels 1 (CUPTI; the emulator's here): the one-rank points carry a trace of
    their decode steps whose kernels per step do not depend on the batch nor on graphs, and
    the counters are those of the untraced run; a TP 2 point (two ranks in one process) is
    not traced; the fake device refuses the flag."""
    want = {(d["storage"], d["batch"]): [d[k] for k in FIELDS] for d in plain}
    per_step = {}
    for d in run_points(binary, "cuda", "1,4", "4", ["--trace-kernels", "1"]):
        if [d[k] for k in FIELDS] != want.get((d["storage"], d["batch"])):
            fail("%s batch %d: tracing changed the counters" % (d["storage"], d["batch"]))
        per_step.setdefault(d["storage"], set()).add(check_trace(d, True))
    if sorted(per_step) != ["bf16", "int8"] or any(len(v) != 1 for v in per_step.values()):
        fail("kernels per step depend on the batch (or points are missing): %s" % per_step)
    pts = run_points(binary, "cuda", "1", "4",
                     ["--trace-kernels", "1", "--cuda-graphs", "0", "--layouts", "1x1,2x1"])
    for d in pts:
        if d["tp"] == 2 and ("trace" in d or "trace_error" in d):
            fail("a TP 2 point was traced: its two ranks share the process's record")
        if d["tp"] == 1 and {check_trace(d, False)} != per_step[d["storage"]]:
            fail("%s: other kernels per step without graphs" % d["storage"])
    if len(pts) != 4:
        fail("expected 4 points (2 storages x 2 layouts), got %d" % len(pts))
    out = subprocess.run([binary, "bench", "decode", "--device", "fake", "--trace-kernels", "1"],
                         capture_output=True, text=True, timeout=60)
    if out.returncode != 2 or "--trace-kernels needs --device cuda" not in out.stderr:
        fail("--device fake --trace-kernels 1: exit %d, %s" % (out.returncode, out.stderr[-300:]))


def main():
    if len(sys.argv) not in (2, 3) or (len(sys.argv) == 3 and sys.argv[2] not in ("fake", "cuda")):
        fail("usage: bench-decode-counters.py GANGLION_BINARY [fake|cuda]")
    device = sys.argv[2] if len(sys.argv) == 3 else "fake"
    batches, prompt = ("1,8,32", "8") if device == "fake" else ("1,4,8", "4")
    points = run_points(sys.argv[1], device, batches, prompt)
    if len(points) != 6:
        fail("expected 6 points (2 storages x 3 batches), got %d" % len(points))
    launches = {}
    for d in points:
        b, st = d["batch"], d["storage"]
        missing = [f for f in FIELDS if f not in d]
        if missing:
            fail("%s batch %d: no %s" % (st, b, ", ".join(missing)))
        print("%s batch %2d: %s" % (st, b, " ".join("%s=%s" % (f, d[f]) for f in FIELDS)))
        if d["host_syncs_per_step"] > 1:
            fail("%s batch %d: %s host syncs per step" % (st, b, d["host_syncs_per_step"]))
        if d["allocs_per_step"] != 0:
            fail("%s batch %d: %s allocations per step" % (st, b, d["allocs_per_step"]))
        if d["h2d_bytes_per_step"] > 64 * b or d["d2h_bytes_per_step"] > 4 * b:
            fail("%s batch %d: bytes per step not O(batch)" % (st, b))
        if d["d2h_bytes_per_step"] >= 4 * VOCAB * b:
            fail("%s batch %d: logits rows came down" % (st, b))
        launches.setdefault(st, set()).add(d["launches_per_step"])
        if d.get("model_kept") is not (b != 1):
            fail("%s batch %d: model_kept %s (want %s)" % (st, b, d.get("model_kept"), b != 1))
    for st, seen in launches.items():
        if len(seen) != 1:
            fail("%s: launches per step depend on the batch: %s" % (st, sorted(seen)))
    if device == "fake":
        build_reuses_heap(sys.argv[1])
    if device == "cuda":
        fused = same_as_fake(sys.argv[1])
        unfused_counts(sys.argv[1], fused)
        nccl_same_as_socket(sys.argv[1])
        pdl_same_counts(sys.argv[1], points)
        variants(sys.argv[1], fused)
        traced(sys.argv[1], points)
    print("PASS")


if __name__ == "__main__":
    main()
