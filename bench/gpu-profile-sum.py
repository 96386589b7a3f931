#!/usr/bin/env python3
"""Sums an ncu --csv run (bench/gpu-check.sh's profile) per kernel.

    python3 bench/gpu-profile-sum.py PROFILE.csv

ncu --csv --metrics gpu__time_duration.sum prints one row per profiled launch (among the
program's own output and ncu's ==PROF== lines). This prints one JSON line per kernel name
(template arguments cut), the 15 with the most time first: launches, total and mean
microseconds; then a "kernel_profile_total" line. Exit 1 when no row was found.
"""
import csv
import io
import json
import sys

UNIT_US = {"nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3, "second": 1e6}


def rows(text):
    """The CSV rows after ncu's header line (the line that starts with "ID")."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith('"ID"'):
            body = [line] + [x for x in lines[i + 1:] if x.startswith('"')]
            return list(csv.DictReader(io.StringIO("\n".join(body))))
    return []


def main():
    with open(sys.argv[1], errors="replace") as f:
        found = rows(f.read())
    per = {}
    for r in found:
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        try:
            us = float(r["Metric Value"].replace(",", "")) * UNIT_US.get(r["Metric Unit"], 1.0)
        except (KeyError, ValueError):
            continue
        name = r.get("Kernel Name", "?").split("(")[0].split("<")[0].strip()
        name = name[5:] if name.startswith("void ") else name
        n, t = per.get(name, (0, 0.0))
        per[name] = (n + 1, t + us)
    if not per:
        print(json.dumps({"measure": "kernel_profile_total", "error": "no ncu rows"}))
        return 1
    total = sum(t for _, t in per.values())
    for name, (n, t) in sorted(per.items(), key=lambda kv: -kv[1][1])[:15]:
        print(json.dumps({"measure": "kernel_profile", "kernel": name, "launches": n,
                          "total_us": round(t, 1), "mean_us": round(t / n, 2),
                          "share": round(t / total, 3)}))
    print(json.dumps({"measure": "kernel_profile_total", "kernels": len(per),
                      "launches": sum(n for n, _ in per.values()), "total_us": round(total, 1)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
