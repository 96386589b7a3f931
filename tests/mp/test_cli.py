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
    code, _, err = run(h, ["bench", "allreduce", "--ranks", "1"])
    H.check(code == 2 and "--ranks" in err, "allreduce --ranks 1: %d %r" % (code, err))
    code, _, err = run(h, ["bench", "allreduce", "--backend", "tcp"])
    H.check(code == 2 and "socket|mpi" in err, "allreduce --backend tcp: %d %r" % (code, err))
    H.log("help and usage errors of %d commands" % len(COMMANDS))


if __name__ == "__main__":
    H.run(scenario)
