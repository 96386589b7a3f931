#!/usr/bin/env python3
"""Bar chart of `ganglion bench decode --model`'s JSON lines: decode tokens/s per batch, one
bar per ganglion storage (the 1x1 points) and per transformers dtype (its best thread
count), log scale, with each storage's roofline (at the bandwidth measured before its point)
as a tick over its bar. Needs matplotlib
(the reference Python of scripts/fetch-reference.sh has it).

Usage: plot-decode.py RESULTS.jsonl OUT.png [--title TEXT]
"""
import argparse
import json
import sys


def load(path):
    ours, peer, roof, refused, info = {}, {}, {}, [], {}
    with open(path) as f:
        for raw in f:
            try:
                o = json.loads(raw)
            except ValueError:
                continue
            if o.get("bench") != "decode":
                continue
            if o.get("measure") == "read_bandwidth" and "read_GBps" in o:
                info.setdefault("bw", []).append(o["read_GBps"])
            if o.get("measure") in ("model_info", "read_bandwidth"):
                info.update(o)
            elif o.get("side") == "transformers" and "decode_tok_s" in o:
                k = (o["dtype"], o["batch"])
                peer[k] = max(peer.get(k, 0.0), o["decode_tok_s"])
            elif "storage" in o and "measure" not in o and o.get("tp") == 1 and o.get("pp") == 1:
                if "refused" in o:
                    refused.append(o["storage"])
                elif "decode_tok_s" in o:
                    ours[(o["storage"], o["batch"])] = o["decode_tok_s"]
                    if "roofline_tok_s" in o:
                        roof[(o["storage"], o["batch"])] = o["roofline_tok_s"]
    return ours, peer, roof, refused, info


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("results")
    ap.add_argument("out")
    ap.add_argument("--title", default=None)
    a = ap.parse_args()
    ours, peer, roof, refused, info = load(a.results)
    if not ours:
        print("plot-decode: no ganglion points in %s" % a.results, file=sys.stderr)
        return 1
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    batches = sorted({b for _, b in list(ours) + list(peer)})
    series = [("ganglion " + s, s, ours) for s in ("f32", "bf16", "f16", "int8")
              if any(k[0] == s for k in ours)]
    series += [("transformers " + d, d, peer) for d in ("f32", "bf16", "f16")
               if any(k[0] == d for k in peer)]
    width = 0.8 / len(series)
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for i, (label, key, table) in enumerate(series):
        xs = [j + (i - (len(series) - 1) / 2) * width for j in range(len(batches))]
        ys = [table.get((key, b), 0.0) for b in batches]
        bars = ax.bar(xs, ys, width, label=label,
                      hatch="//" if label.startswith("transformers") else None)
        for x, y in zip(xs, ys):
            if y > 0:
                ax.annotate("%.3g" % y, (x, y), ha="center", va="bottom", fontsize=7)
        if table is ours:
            for x, b in zip(xs, batches):
                if (key, b) in roof:
                    ax.plot([x - width / 2, x + width / 2], [roof[(key, b)]] * 2, color="black",
                            linewidth=1.5)
        del bars
    ax.set_yscale("log")
    ax.set_xticks(range(len(batches)))
    ax.set_xticklabels(["batch %d" % b for b in batches])
    ax.set_ylabel("decode tokens/s (log)")
    bw = info.get("bw") or [0.0]
    note = ("black ticks: ganglion's roofline at the read bandwidth measured before each point"
            " (%.1f-%.1f GB/s)" % (min(bw), max(bw)))
    if refused:
        note += "; refused by this build: " + ", ".join(refused)
    ax.set_title(a.title or "decode on %s, CPU, %s threads" % (
        info.get("model", "?").rstrip("/").split("/")[-1], info.get("cpu_threads", "?")),
                 fontsize=10)
    ax.text(0.01, 0.98, note, transform=ax.transAxes, va="top", fontsize=7)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(0.0, 0.94))
    fig.tight_layout()
    fig.savefig(a.out, dpi=110)
    return 0


if __name__ == "__main__":
    sys.exit(main())
