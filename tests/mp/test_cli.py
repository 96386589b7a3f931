#!/usr/bin/env python3
"""Every command's command line comes from one option table: `--help` exits 0 and lists
the flags the command parses, an unknown or out-of-range flag exits 2 with a message that
names the command. Covers the command table of main.c and the benchmark table."""
import os
import subprocess
import sys

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness as H  # noqa: E402

# command argv, a flag its --help must list
COMMANDS = [
    (["bench", "rendezvous"], "--peer-timeout-s"),
    (["bench", "failover"], "--heartbeat-timeout-ms"),
    (["bench", "allreduce"], "--max-bytes"),
    (["bench", "pipeline"], "--microbatches"),
    (["bench", "decode"], "--gpu-memory-mb"),
    (["bench", "gemm"], "--shapes"),
    (["generate"], "--prompt-ids"),
    (["mkmodel"], "--kv-heads"),
    (["info"], "--labels"),
    (["serve"], "--heartbeat-interval-ms"),
]


def run(h, args):
    p = subprocess.run([h.bin] + args, capture_output=True, text=True, timeout=30)
    return p.returncode, p.stdout, p.stderr


def scenario(h):
    code, out, _ = run(h, ["--help"])
    H.check(code == 0, "ganglion --help exited %d" % code)
    for name in ("serve", "generate", "mkmodel", "bench", "info"):
        H.check(("ganglion %s" % name) in out, "ganglion --help does not list %s" % name)
    code, out, _ = run(h, ["bench", "--help"])
    H.check(code == 0 and "rendezvous" in out and "gemm" in out, "bench --help: %r" % out)
    code, _, err = run(h, ["nosuch"])
    H.check(code == 2 and "unknown command" in err, "unknown command: %d %r" % (code, err))
    for args, flag in COMMANDS:
        what = " ".join(args)
        code, out, _ = run(h, args + ["--help"])
        H.check(code == 0, "%s --help exited %d" % (what, code))
        H.check(flag in out, "%s --help does not list %s:\n%s" % (what, flag, out))
        code, _, err = run(h, args + ["--no-such-flag"])
        H.check(code == 2, "%s --no-such-flag exited %d" % (what, code))
        H.check("--no-such-flag" in err, "%s: the message does not name the flag: %r"
                % (what, err))
    # generate builds its request as JSON from validated values: a flag value cannot
    # change the request's shape, and a bad list or number is refused before any gang.
    for args in (["--temperature", '1,"x":2'], ["--top-k", "2.5"], ["--seed", "x"],
                 ["--top-p", "nan"]):
        code, _, err = run(h, ["generate", "--model", h.tmp, "--prompt-ids", "1,2"] + args)
        H.check(code == 2 and "ganglion generate" in err,
                "generate %s: %d %r" % (" ".join(args), code, err))
    code, _, err = run(h, ["generate", "--model", h.tmp, "--prompt-ids", "1,,2"])
    H.check(code == 2 and "--prompt-ids" in err, "generate --prompt-ids 1,,2: %d %r" % (code, err))
    # --api-key-file: serve --check-config reads it as the agent will, never printing it.
    cc = ["serve", "--check-config", "--node-index", "0", "--coordinator", "127.0.0.1:29400"]
    keys = {"missing": None, "empty": "  \n", "spaces": "a key", "long": "k" * 257,
            "good": "  sk-good-key\n"}
    for name, content in keys.items():
        path = os.path.join(h.tmp, "key-" + name)
        if content is not None:
            with open(path, "w") as f:
                f.write(content)
        code, out, err = run(h, cc + ["--api-key-file", path])
        want = 0 if name == "good" else 2
        H.check(code == want and "sk-good-key" not in out + err and
                ("API key: read" in out if want == 0 else "--api-key-file" in err),
                "--api-key-file (%s): %d %r %r" % (name, code, out[-200:], err))
    # info --model: the f32 weights of one rank holding everything are the safetensors
    # file's payload (an f32, untied model); a refused layout exits 2, no model 3.
    im = H.mkmodel(h.bin, os.path.join(h.tmp, "info-model"), layers=2, hidden=64, heads=4,
                   kv_heads=2, ffn=128, vocab=256)
    code, out, err = run(h, ["info", "--model", im, "--tp", "1", "--pp", "1"])
    m = [ln for ln in out.splitlines() if ln.startswith("layout tp 1 x pp 1")]
    size = os.path.getsize(os.path.join(im, "model.safetensors"))
    mib = float(m[0].split("holds ")[1].split(" MiB")[0]) if m else -1
    H.check(code == 0 and abs(mib * 2**20 - size) < 0.01 * size + 0.06 * 2**20,
            "info --model: %d %r (file %d bytes)" % (code, out, size))
    H.check("2x1" in out and "4x1" in out and "3x1" not in out and "1x2" in out,
            "info --model layouts: %r" % out)
    code, out, _ = run(h, ["info", "--model", im, "--tp", "3"])
    H.check(code == 2 and "refused" in out, "info --model --tp 3: %d %r" % (code, out))
    code, _, err = run(h, ["info", "--model", os.path.join(h.tmp, "nope")])
    H.check(code == 3 and "nope" in err, "info --model of nothing: %d %r" % (code, err))
    code, _, err = run(h, ["bench", "allreduce", "--ranks", "1"])
    H.check(code == 2 and "--ranks" in err, "allreduce --ranks 1: %d %r" % (code, err))
    code, _, err = run(h, ["bench", "allreduce", "--backend", "tcp"])
    H.check(code == 2 and "socket|mpi" in err, "allreduce --backend tcp: %d %r" % (code, err))
    # mkmodel: every flag of its table in --help with today's default; bad values exit 2
    # and write nothing.
    code, out, _ = run(h, ["mkmodel", "--help"])
    for flag, default in (("--out", ""), ("--arch", "llama"), ("--layers", "2"),
                          ("--hidden", "64"), ("--heads", "4"), ("--kv-heads", "2"),
                          ("--ffn", "128"), ("--vocab", "256"), ("--max-pos", "512"),
                          ("--seed", "1"), ("--dtype", "f32"), ("--tie", "0"),
                          ("--shards", "1")):
        line = [ln for ln in out.splitlines() if ln.split()[:1] == [flag]]
        H.check(len(line) == 1 and ("[default '%s']" % default) in line[0],
                "mkmodel --help: %s with default %r: %r" % (flag, default, line))
    model = os.path.join(h.tmp, "cli-model")
    for args, needle in ((["--arch", "gpt2"], "llama|mistral|qwen2"),
                         (["--dtype", "f64"], "f32|f16|bf16"),
                         (["--layers", "0"], "--layers"),
                         (["--tie=maybe"], "--tie"),
                         (["--heads", "3"], "heads"),
                         (["stray"], "stray")):
        code, _, err = run(h, ["mkmodel", "--out", model] + args)
        H.check(code == 2 and needle in err and "ganglion mkmodel" in err,
                "mkmodel %s: %d %r" % (" ".join(args), code, err))
    code, _, err = run(h, ["mkmodel"])
    H.check(code == 2 and "--out" in err, "mkmodel without --out: %d %r" % (code, err))
    H.check(not os.path.exists(model), "a refused mkmodel wrote %s" % model)
    code, out, err = run(h, ["mkmodel", "--out=" + model, "--arch=qwen2", "--dtype", "bf16",
                             "--tie", "--shards", "2"])
    H.check(code == 0 and '"arch":"qwen2","dtype":"bf16","shards":2' in out,
            "mkmodel qwen2: %d %r %r" % (code, out, err))
    # info: exits 0 with or without a GPU; --labels keeps stdout to labels only.
    code, out, err = run(h, ["info", "--labels"])
    H.check(code == 0 and all("=" in ln for ln in out.splitlines()) and
            "nvidia.com/gpu.present=" in out, "info --labels: %d %r %r" % (code, out, err))
    code, _, err = run(h, ["info", "extra"])
    H.check(code == 2 and "extra" in err, "info extra: %d %r" % (code, err))
    H.log("help and usage errors of %d commands" % len(COMMANDS))


if __name__ == "__main__":
    H.run(scenario)
