#!/usr/bin/env python3
"""Line chart of `ganglion bench moe`'s JSON lines: decode tokens/s against the EP degree,
one line per batch, and the all-to-all's share of a decode step as labels. Needs
matplotlib (the reference Python of scripts/fetch-reference.sh has it).

Usage: plot-moe.py RESULTS.jsonl OUT.png [--title TEXT]
"""
import argparse
import json


def load(path):
    """{batch: {ep: (decode tok/s, a2a share)}} from the "moe" lines."""
    pts = {}
    with open(path) as f:
        for raw in f:
            try:
                o = json.loads(raw)
            except ValueError:
                continue
            if o.get("bench") == "moe" and "decode_tokens_per_s" in o:
                pts.setdefault(o["batch"], {})[o["ep"]] = (o["decode_tokens_per_s"],
                                                           o["a2a_share_of_step"])
    return pts


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
    for batch in sorted(pts):
        eps = sorted(pts[batch])
        tps = [pts[batch][e][0] for e in eps]
        ax.plot(eps, tps, marker="o", label="batch %d" % batch)
        for e, t in zip(eps, tps):
            if e > 1:
                ax.annotate("a2a %.0f%%" % (100 * pts[batch][e][1]), (e, t),
                            textcoords="offset points", xytext=(4, 4), fontsize=7)
    ax.set_xlabel("EP degree (= TP ranks, experts split over them)")
    ax.set_ylabel("decode tokens/s")
    ax.set_xticks(sorted({e for b in pts for e in pts[b]}))
    ax.set_title(a.title, fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(a.out, dpi=110)


if __name__ == "__main__":
    main()
