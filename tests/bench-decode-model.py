#!/usr/bin/env python3
"""`ganglion bench decode --model` on a tiny model made by `ganglion mkmodel` (a few seconds,
no transformers venv needed).

Checks, each run's JSON lines parsed:
  1. --no-peer, storages f32,bf16,int8, batches 1,3, layouts 1x1,2x1: exit 0; the model_info
     line (shape of the model, cpu_threads); the start-of-run read_bandwidth line and one
     just before every 1x1 point, whose roofline uses its read_GBps; the KV bytes in the
     cache type `serve` picks for the storage (bf16 for bf16 weights, f32 otherwise);
     per storage either one clean "refused" line (a storage this build cannot hold) or a
     point per batch and layout with decode_tok_s > 0 and, at 1x1, a roofline (bytes per
     token between the f32 weights without the embedding table and all of them, ratio
     = tokens/s over roofline_tok_s); the 2x1 points agree with 1x1 by the logits; no
     "error" anywhere; the peer line says skipped: --no-peer; three target lines.
  2. the peer path with tests/fake-hf-decode.py as the script (FAKE_HF_MODE=ok): the
     script gets our batches, prompt and tokens; its lines are printed again; the
     vs_transformers ratio is ganglion's tokens/s over the peer's best (thread count 1).
  3. a failing peer (exit 1, garbage line): a "failed: exit status" line, exit 0.
  4. a hanging peer: "failed: not done within --peer-timeout-s", within the deadline.
  5. a missing reference Python: "skipped: no reference Python".
  6. usage errors exit 2: a bad --dtypes, a layouts list not starting with 1x1,
     --model with --device fake.
Usage: bench-decode-model.py GANGLION_BINARY
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
FAKE = os.path.join(HERE, "fake-hf-decode.py")


def fail(msg):
    print("FAIL: " + msg, file=sys.stderr)
    sys.exit(1)


def run(binary, args, env=None, timeout=60):
    e = dict(os.environ)
    e.update(env or {})
    t0 = time.monotonic()
    p = subprocess.run([binary, "bench", "decode"] + args, capture_output=True, text=True,
                       timeout=timeout, env=e)
    lines = []
    for raw in p.stdout.splitlines():
        try:
            lines.append(json.loads(raw))
        except ValueError:
            fail("not a JSON line: %r" % raw)
    sys.stdout.write(p.stdout)
    sys.stderr.write(p.stderr)
    return p.returncode, lines, p.stderr, time.monotonic() - t0


def drop_log(why):
    """A failed peer's log is kept for its reader and named in the line: check, remove."""
    path = why.rsplit("log ", 1)[-1]
    if not path.startswith("/tmp/ganglion-hf-decode-log-") or not os.path.isfile(path):
        fail("the failed peer's log is not named or not kept: %r" % why)
    os.unlink(path)


def one(lines, **kv):
    got = [o for o in lines if all(o.get(k) == v for k, v in kv.items())]
    if len(got) != 1:
        fail("expected one line with %s, got %d" % (kv, len(got)))
    return got[0]


def check_points(lines, model_bytes):
    for o in lines:
        if "error" in o:
            fail("an error line: %s" % o)
    info = one(lines, measure="model_info")
    if info["layers"] != 2 or info["hidden"] != 64 or info["vocab"] != 128:
        fail("model_info does not describe the model: %s" % info)
    if not info.get("cpu_threads", 0) >= 1:
        fail("no cpu_threads in %s" % info)
    bws = [o for o in lines if o.get("measure") == "read_bandwidth"]
    start = [o for o in bws if "before_storage" not in o]
    if len(start) != 1 or not start[0].get("read_GBps", 0) > 0:
        fail("no start-of-run read bandwidth: %s" % bws)
    if lines.index(start[0]) > min(i for i, o in enumerate(lines) if "storage" in o):
        fail("the start-of-run bandwidth comes after a point")
    for s in ("f32", "bf16", "int8"):
        pts = [o for o in lines if o.get("storage") == s and "measure" not in o]
        refused = [o for o in pts if "refused" in o]
        if refused:
            if len(pts) != 1 or not refused[0]["refused"]:
                fail("storage %s: a refusal must be one line with a message: %s" % (s, pts))
            continue
        if s == "f32" and refused:
            fail("f32 refused")
        for b in (1, 3):
            base = one(pts, batch=b, tp=1, pp=1)
            tp2 = one(pts, batch=b, tp=2, pp=1)
            for o in (base, tp2):
                if not o.get("decode_tok_s", 0) > 0 or not o.get("prefill_tok_s", 0) > 0:
                    fail("no tokens/s: %s" % o)
            if tp2.get("logits_match_1x1") is not True:
                fail("2x1 does not agree with 1x1: %s" % tp2)
            # The bandwidth measured just before the 1x1 point is the one its roofline uses.
            bw = one(bws, before_storage=s, before_batch=b)
            if not bw.get("read_GBps", 0) > 0 or base["read_GBps"] != bw["read_GBps"]:
                fail("storage %s batch %d: roofline bandwidth %s, measured before it %s"
                     % (s, b, base.get("read_GBps"), bw))
            if lines.index(bw) > lines.index(base):
                fail("the bandwidth of storage %s batch %d comes after its point" % (s, b))
            # KV bytes: batch x mean context (8 + 4 / 2) x 2 layers x K,V x 2 kv heads x 16,
            # in serve's auto cache type (bf16 for bf16 weights, f32 otherwise).
            es = 2 if s == "bf16" else 4
            if base["kv_bytes_per_step"] != b * 10 * 2 * 2 * 2 * 16 * es:
                fail("storage %s batch %d: kv bytes %s" % (s, b, base["kv_bytes_per_step"]))
            stream = base["stream_bytes_per_step"]
            if s == "f32" and not (0.5 * model_bytes < stream < model_bytes):
                fail("f32 stream bytes %s not below the file's %d weights" % (stream, model_bytes))
            ratio = base["decode_tok_s"] / base["roofline_tok_s"]
            if abs(ratio - base["roofline_ratio"]) > 0.01 * ratio + 1e-3:
                fail("roofline_ratio is not tok/s over roofline: %s" % base)
    if one(lines, side="transformers")["peer"] != "skipped: --no-peer":
        fail("the peer was not skipped")
    names = sorted(o["name"] for o in lines if o.get("measure") == "target")
    if names != ["batch1_roofline_ratio", "batch1_vs_transformers", "batch32_vs_transformers"]:
        fail("target lines: %s" % names)


def main():
    binary = sys.argv[1]
    tmp = tempfile.mkdtemp(prefix="gang-bench-decode-model-")
    try:
        model = os.path.join(tmp, "m")
        subprocess.run([binary, "mkmodel", "--out", model, "--layers", "2", "--hidden", "64",
                        "--heads", "4", "--kv-heads", "2", "--ffn", "128", "--vocab", "128",
                        "--max-pos", "256"], check=True, capture_output=True)
        params = 2 * (64 * 64 * 2 + 2 * 32 * 64 + 3 * 128 * 64 + 128) + 64 + 2 * 128 * 64
        common = ["--model", model, "--batch", "1,3", "--prompt", "8", "--tokens", "4",
                  "--iters", "1", "--warmup", "0", "--bw-mib", "16", "--bw-passes", "3"]
        # 1. every storage, two layouts, no peer
        rc, lines, _, _ = run(binary, common + ["--dtypes", "f32,bf16,int8",
                                                "--layouts", "1x1,2x1", "--no-peer"])
        if rc != 0:
            fail("exit %d" % rc)
        check_points(lines, 4 * params)
        # 2. the peer path with the fake peer
        peer = ["--dtypes", "f32", "--peer-python", sys.executable, "--peer-script", FAKE]
        rc, lines, _, _ = run(binary, common + peer, env={"FAKE_HF_MODE": "ok"})
        if rc != 0:
            fail("fake peer run: exit %d" % rc)
        argv = one(lines, side="transformers", measure="peer_info")["argv"]
        for flag, val in (("--batch", "1,3"), ("--prompt", "8"), ("--tokens", "4"),
                          ("--dtypes", "f32"), ("--model", model)):
            if argv[argv.index(flag) + 1] != val:
                fail("the peer got %s %s" % (flag, argv[argv.index(flag) + 1]))
        for b in (1, 3):
            ours = one(lines, storage="f32", batch=b, tp=1)["decode_tok_s"]
            vs = one(lines, measure="vs_transformers", batch=b)
            best = 1000.0 / b
            if vs["transformers_decode_tok_s"] != round(best, 2) or vs["transformers_threads"] != 1:
                fail("the peer's best at batch %d is not thread count 1: %s" % (b, vs))
            if abs(vs["ratio"] - ours / best) > 1e-3 * max(1.0, ours / best):
                fail("ratio %s is not %s / %s" % (vs["ratio"], ours, best))
        # 3. a failing peer
        rc, lines, _, _ = run(binary, common + peer, env={"FAKE_HF_MODE": "fail"})
        got = [o for o in lines if o.get("side") == "transformers" and "peer" in o]
        if rc != 0 or len(got) != 1 or not got[0]["peer"].startswith("failed: exit status"):
            fail("failing peer: exit %d, %s" % (rc, got))
        drop_log(got[0]["peer"])
        if not any(o.get("error") == "RuntimeError: fake" for o in lines):
            fail("the failing peer's error line was not printed again")
        # 4. a hanging peer
        rc, lines, _, secs = run(binary, common + peer + ["--peer-timeout-s", "2"],
                                 env={"FAKE_HF_MODE": "hang"})
        got = [o for o in lines if o.get("side") == "transformers" and "peer" in o]
        if rc != 0 or len(got) != 1 or "not done within" not in got[0]["peer"] or secs > 30:
            fail("hanging peer: exit %d after %.1f s, %s" % (rc, secs, got))
        drop_log(got[0]["peer"])
        # 5. no reference Python
        rc, lines, _, _ = run(binary, common + ["--dtypes", "f32", "--peer-python",
                                                os.path.join(tmp, "no-python")])
        got = [o for o in lines if o.get("side") == "transformers" and "peer" in o]
        if rc != 0 or len(got) != 1 or not got[0]["peer"].startswith("skipped: no reference"):
            fail("missing python: exit %d, %s" % (rc, got))
        # 6. usage errors
        for bad in (["--dtypes", "f64"], ["--layouts", "2x1"], ["--device", "fake"]):
            rc, _, err, _ = run(binary, common + ["--no-peer"] + bad)
            if rc != 2 or not err.strip():
                fail("%s: exit %d, stderr %r" % (bad, rc, err))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("bench-decode-model: ok")


if __name__ == "__main__":
    main()
