#!/usr/bin/env python3
"""A stand-in for bench/hf-decode.py in the test bench-decode-model (no transformers).

Takes the real script's flags and prints lines of its format, so the C side's handling of
the peer can be checked without the reference venv: its points are parsed, re-printed,
the best thread count kept, the ratios computed. FAKE_HF_MODE chooses the behaviour:
  ok     one line per (dtype, batch, thread count): decode_tok_s = 1000 / (batch x threads
         x dtype index + 1) (so batch 1's best is thread count 1, dtype f32), exit 0;
  fail   one garbage line and a bf16 error line on stdout, a message on stderr, exit 1;
  hang   sleeps far past any --peer-timeout-s the test gives.
"""
import argparse
import json
import os
import sys
import time


def main():
    ap = argparse.ArgumentParser()
    for f in ("--model", "--dtypes", "--batch", "--threads", "--prompt", "--tokens",
              "--iters", "--warmup", "--budget-s"):
        ap.add_argument(f, required=True)
    a = ap.parse_args()
    mode = os.environ.get("FAKE_HF_MODE", "ok")
    if mode == "hang":
        time.sleep(120)
        return 0

    def emit(o):
        print(json.dumps(dict({"bench": "decode", "side": "transformers"}, **o)), flush=True)

    emit({"measure": "peer_info", "torch": "fake", "argv": sys.argv[1:]})
    if mode == "fail":
        print("not json at all", flush=True)
        emit({"dtype": "bf16", "batch": 1, "threads": 1, "error": "RuntimeError: fake"})
        print("fake peer: failing on purpose", file=sys.stderr)
        return 1
    for di, d in enumerate(a.dtypes.split(",")):
        for b in (int(x) for x in a.batch.split(",")):
            for t in (int(x) for x in a.threads.split(",")):
                emit({"dtype": d, "batch": b, "threads": t,
                      "decode_tok_s": round(1000.0 / (b * t * (di + 1)), 3)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
