#!/usr/bin/env python3
"""Bar chart of bench/gguf-vs-llama.sh's JSON lines: decode tokens/s per GGUF file and
batch, one bar per engine (ganglion on the file's own blocks; llama.cpp with its weight
repacking, AMX on this CPU, and without it, `llama.cpp-norepack`), log scale. A point
present several times (rounds of the script appended to one file) is drawn at its median.
Needs matplotlib (the reference Python of scripts/fetch-reference.sh has it).

Usage: plot-gguf.py RESULTS.jsonl OUT.png [--title TEXT]
"""
import argparse
import json
import statistics


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("results")
    ap.add_argument("out")
    ap.add_argument("--title", default="GGUF files: decode tokens/s, ganglion (own blocks) "
                    "vs llama.cpp, same run")
    a = ap.parse_args()
    rows = []
    with open(a.results) as f:
        for raw in f:
            try:
                rows.append(json.loads(raw))
            except ValueError:
                continue
    files = sorted({r["file"] for r in rows})
    batches = sorted({r["batch"] for r in rows})
    engines = [e for e in ("ganglion", "llama.cpp", "llama.cpp-norepack")
               if any(r["engine"] == e for r in rows)]
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(11, 5.5))
    width = 0.8 / (len(batches) * len(engines))
    labels = []
    for fi, f in enumerate(files):
        labels.append(f.replace("smollm2-135m-instruct-", "SmolLM2 ")
                      .replace("smollm2-", "SmolLM2 "))
        for bi, b in enumerate(batches):
            for ei, e in enumerate(engines):
                v = [r["decode_tok_s"] for r in rows
                     if r["file"] == f and r["batch"] == b and r["engine"] == e]
                if not v:
                    continue
                v = [statistics.median(v)]  # several runs of one point: their median
                x = fi + (bi * len(engines) + ei - (len(batches) * len(engines) - 1) / 2) * width
                ax.bar(x, v[0], width, color=("C%d" % (len(engines) * bi + ei)))
                ax.text(x, v[0], "%.0f" % v[0], ha="center", va="bottom", fontsize=7)
    present = {(r["batch"], r["engine"]) for r in rows}
    pairs = [(bi, ei) for bi in range(len(batches)) for ei in range(len(engines))
             if (batches[bi], engines[ei]) in present]
    handles = [plt.Rectangle((0, 0), 1, 1, color="C%d" % (len(engines) * bi + ei))
               for bi, ei in pairs]
    names = ["%s batch %d" % (engines[ei], batches[bi]) for bi, ei in pairs]
    ax.legend(handles, names, fontsize=8, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.1))
    ax.set_xticks(range(len(files)))
    ax.set_xticklabels(labels, fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel("decode tokens/s")
    ax.set_title(a.title, fontsize=10)
    fig.tight_layout()
    fig.savefig(a.out, dpi=110)


if __name__ == "__main__":
    main()
