#!/usr/bin/env python3
"""Bar charts of bench/gguf-http.py's per-run JSON lines gathered over several files (each
line with a "file" field added): output tokens/s and TTFT p50 per file at each client
count, one bar per engine, medians over the repeats. Needs matplotlib (the reference
Python of scripts/fetch-reference.sh has it).

Usage: plot-gguf-http.py RUNS.jsonl OUT.png [--title TEXT]
"""
import argparse
import json
import statistics


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("runs")
    ap.add_argument("out")
    ap.add_argument("--title", default="GGUF files over HTTP: ganglion serve vs llama-server, "
                    "same run, medians of 3 repeats")
    a = ap.parse_args()
    rows = [json.loads(x) for x in open(a.runs) if x.startswith("{")]
    files = sorted({r["file"] for r in rows})
    conc = sorted({r["concurrency"] for r in rows})
    engines = ["ganglion", "llama-server"]
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(13, 5))
    width = 0.8 / (len(conc) * len(engines))
    for ax, key, ylabel in ((axes[0], "out_tok_per_s", "output tokens/s"),
                            (axes[1], "ttft_p50_ms", "TTFT p50, ms (lower is better)")):
        for ci, c in enumerate(conc):
            for ei, e in enumerate(engines):
                xs, ys = [], []
                for fi, f in enumerate(files):
                    v = [r[key] for r in rows
                         if r["file"] == f and r["engine"] == e and r["concurrency"] == c]
                    if v:
                        xs.append(fi + (ci * len(engines) + ei) * width - 0.4 + width / 2)
                        ys.append(statistics.median(v))
                ax.bar(xs, ys, width, label="%s, %d client%s" % (e, c, "s" if c > 1 else ""),
                       color=("C0", "C1")[ei], alpha=(1.0, 0.55)[ci])
        ax.set_xticks(range(len(files)))
        ax.set_xticklabels([f.replace("smollm2-", "SmolLM2 ").replace("gemma-3-270m-q4_k_m",
                                                                      "Gemma 3 Q4_K_M")
                            for f in files], rotation=15)
        ax.set_ylabel(ylabel)
        ax.set_yscale("log")
        ax.grid(axis="y", alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(a.title)
    fig.tight_layout()
    fig.savefig(a.out, dpi=110)


if __name__ == "__main__":
    main()
