#!/usr/bin/env python3
"""`ganglion bench rendezvous` and `ganglion bench failover` run end to end on a small
gang and print well-formed JSON lines: one per trial and a summary with medians. (The
figures themselves are measured on a quiet machine and written to docs/benchmarks.md;
this only keeps the benchmark drivers working.)"""
import json
import os
import sys

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness as H  # noqa: E402


def run_bench(h, name, args, timeout):
    p = h.spawn("bench-" + name, [h.bin, "bench", name] + args +
                ["--agent-log", os.path.join(h.tmp, "agents-%s.log" % name)])
    code = p.wait(timeout)
    H.check(code is not None, "bench %s did not finish within %d s" % (name, timeout))
    H.check(code == 0, "bench %s exited %d" % (name, code))
    lines = []
    for text in p.log_text().splitlines():
        if text.startswith("{"):
            lines.append(json.loads(text))
    H.check(lines and lines[-1].get("summary") is True, "bench %s printed no summary" % name)
    for line in lines:
        H.check("error" not in line, "bench %s: %r" % (name, line))
    return lines


def scenario(h):
    lines = run_bench(h, "rendezvous", ["--nodes", "4", "--trials", "2", "--no-peer"], 60)
    s = lines[-1]
    H.check(s["measured"] == 2 and s["ganglion_s_p50"] > 0, "rendezvous summary: %r" % s)
    H.check(all(t.get("agents_unclean_exit") == 0 for t in lines[:-1]),
            "agents did not stop cleanly: %r" % lines)
    H.log("rendezvous of 4 nodes: %.4f s (median of 2)" % s["ganglion_s_p50"])

    lines = run_bench(h, "failover", ["--nnodes", "2", "--nproc-per-node", "1", "--trials", "2",
                                      "--warmup", "0"], 90)
    s = lines[-1]
    H.check(s["crash_trials"] == 2 and s["hang_trials"] == 2, "failover summary: %r" % s)
    H.check(s["gang_stopped_cleanly"] is True, "the benchmark's gang did not stop cleanly")
    for t in lines[:-1]:
        H.check(t["detect_ms"] >= 0 and t["reform_ms"] >= t["detect_ms"], "trial: %r" % t)
    H.log("failover: crash detect %s ms, hang detect %s ms (medians)"
          % (s["crash_detect_ms_p50"], s["hang_detect_ms_p50"]))


if __name__ == "__main__":
    H.run(scenario)
