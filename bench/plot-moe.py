#!/usr/bin/env python3
"""Line chart of `ganglion bench moe`'s JSON lines: decode tokens/s against the EP degree,
one line per batch (dashed: the --replicated points, TP 1 with the attention replicated over
the EP group; EP 1 starts both), and the all-to-all's share of a decode step as labels.
Needs matplotlib (the reference Python of scripts/fetch-reference.sh has it).

Usage: plot-moe.py RESULTS.jsonl OUT.png [--title TEXT]
"""
import argparse
import json


def load(path):
    """{(batch, replicated): {ep: (decode tok/s, a2a share)}} from the "moe" lines."""
    pts = {}
    with open(path) as f:
        for raw in f:
            try:
                o = json.loads(raw)
            except ValueError:
                continue
            if o.get("bench") == "moe" and "decode_tokens_per_s" in o:
                point = (o["decode_tokens_per_s"], o["a2a_share_of_step"])
                rep = o.get("tp", o["ep"]) != o["ep"]
                pts.setdefault((o["batch"], rep), {})[o["ep"]] = point
                if o["ep"] == 1:
                    pts.setdefault((o["batch"], True), {})[1] = point
    return {k: v for k, v in pts.items() if len(v) > 1 or not k[1]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("results")
    ap.add_argument("out")
    ap.add_argument("--title", default="ganglion bench moe: decode tokens/s vs EP (CPU)")
    a = ap.parse_args()
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    pts = load(a.results)
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for batch, rep in sorted(pts):
        eps = sorted(pts[(batch, rep)])
        tps = [pts[(batch, rep)][e][0] for e in eps]
        ax.plot(eps, tps, marker="o", linestyle="--" if rep else "-",
                label="batch %d%s" % (batch, ", TP 1 (replicated)" if rep else ""))
        for e, t in zip(eps, tps):
            if e > 1:
                ax.annotate("a2a %.0f%%" % (100 * pts[(batch, rep)][e][1]), (e, t),
                            textcoords="offset points", xytext=(4, 4), fontsize=7)
    ax.set_xlabel("EP degree (ranks the experts are split over; TP = EP unless dashed)")
    ax.set_ylabel("decode tokens/s")
    ax.set_xticks(sorted({e for k in pts for e in pts[k]}))
    ax.set_title(a.title, fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(a.out, dpi=110)


if __name__ == "__main__":
    main()
