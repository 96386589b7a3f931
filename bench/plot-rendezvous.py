#!/usr/bin/env python3
"""Plots `ganglion bench rendezvous` summaries (JSON lines on stdin or in files): READY
time (spawn -> serving), the formation alone and the re-formation after a killed worker
against the ranks, for ganglion and the mpirun peer, on log-log axes, and prints the
growth exponent of each (least-squares slope of log time on log ranks) over the ranks
given by --fit-from. Needs matplotlib.

  python3 bench/plot-rendezvous.py --out docs/rendezvous-scale.png results.jsonl
"""
import argparse
import json
import math
import sys


def slope(pts):
    xs = [math.log(r) for r, _ in pts]
    ys = [math.log(t) for _, t in pts]
    n = len(pts)
    mx, my = sum(xs) / n, sum(ys) / n
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("files", nargs="*")
    ap.add_argument("--out", required=True)
    ap.add_argument("--fit-from", type=int, default=64, help="fit ranks >= this")
    ap.add_argument("--nproc", type=int, default=8, help="series with this --nproc-per-node")
    a = ap.parse_args()
    lines = []
    for f in a.files or ["-"]:
        src = sys.stdin if f == "-" else open(f)
        lines += [json.loads(x) for x in src if x.strip()]
    rows = sorted((x for x in lines if x.get("summary") and x.get("nproc_per_node") == a.nproc),
                  key=lambda x: x["ranks"])
    series = {
        "ganglion READY (spawn -> serving)": "ganglion_s_p50",
        "ganglion formation (last join -> all READY)": "formation_s_p50",
        "ganglion re-formation after a killed worker": "reform_s_p50",
        "mpirun -np N mpi-barrier": "mpirun_s_p50",
    }
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label, key in series.items():
        pts = [(x["ranks"], x[key]) for x in rows if x.get(key)]
        if not pts:
            continue
        fit = [p for p in pts if p[0] >= a.fit_from]
        if len(fit) >= 2:
            k = slope(fit)
            print("%-46s exponent %.2f over %s ranks" % (label, k, [p[0] for p in fit]))
            label = "%s (exponent %.2f)" % (label, k)
        else:
            # One point (the peer measured only where it finishes in seconds): no slope.
            print("%-46s no exponent: measured at %s ranks only" % (label, [p[0] for p in pts]))
            label = "%s (%s ranks only)" % (label, ", ".join(str(p[0]) for p in pts))
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=label)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("ranks (%d per node, one host, 2 cores)" % a.nproc)
    ax.set_ylabel("seconds, p50")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title("bench rendezvous: time vs ranks")
    fig.tight_layout()
    fig.savefig(a.out, dpi=100)


if __name__ == "__main__":
    main()
