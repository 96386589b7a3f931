#!/usr/bin/env python3
"""The decode steps' kernel traces of a device check, for its summary (issue #24).

    python3 bench/gpu-trace-sum.py RESULTS.jsonl

Reads the decode lines that `ganglion bench decode --trace-kernels 1` wrote (bench/
gpu-check.sh's results.jsonl, "step" added) and prints, per traced point, two-space
indented lines: where the step's time went (its wall time on the host = the device's span
from its first kernel to its last + the host's share; the span = kernels running + the
device idle between them), then its largest ops (kernel and grid) with their kernels and
microseconds per step and their share of the busy time. A point whose trace failed prints
its error. Prints nothing when no point was traced; exit 1 only for an unreadable file.
"""
import json
import sys

TOP = 8


def describe(d):
    return "%s %s batch %s (%s)" % (d.get("shape", "?"), d.get("storage", "?"),
                                    d.get("batch", "?"), d.get("step", "?"))


def main():
    if len(sys.argv) != 2:
        print("usage: gpu-trace-sum.py RESULTS.jsonl", file=sys.stderr)
        return 2
    try:
        with open(sys.argv[1], encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError as e:
        print("gpu-trace-sum.py: %s" % e, file=sys.stderr)
        return 1
    for line in lines:
        try:
            d = json.loads(line)
        except ValueError:
            continue
        if "trace_error" in d:
            print("  trace %s: collect failed: %s" % (describe(d), d["trace_error"]))
            continue
        t = d.get("trace")
        if not isinstance(t, dict):
            continue
        host = t["step_us"] - t["device_us_per_step"]
        print("  trace %s: %s kernels/step (%s in its graph); step %.1f us = device %.1f "
              "(kernels %.1f + idle between them %.1f) + host %.1f; %s steps, %s lost"
              % (describe(d), t["kernels_per_step"], t["graph_kernels_per_step"],
                 t["step_us"], t["device_us_per_step"], t["busy_us_per_step"],
                 t["idle_in_step_us"], host, t["steps"], t["dropped"]))
        for op in t.get("ops", [])[:TOP]:
            print("    %-44s %7.2f/step %10.1f us/step %5.1f%%"
                  % (op["name"], op["per_step"], op["us_per_step"], 100.0 * op["share"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
