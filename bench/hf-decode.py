#!/usr/bin/env python3
"""The transformers peer of `ganglion bench decode --model`: greedy decode tokens/s.

Run with the reference Python (scripts/fetch-reference.sh: transformers 4.46 on Debian's
torch 1.13), usually by the C benchmark itself, which parses the lines this prints. It
loads the same Hugging Face model directory and measures the same points as the engine:

  * the same prompts: batch x prompt token ids, id i = (i x 2654435761 + 17) mod vocab,
    sequence s takes ids [s x prompt, (s + 1) x prompt); every prompt has the same length,
    so a static batch needs no padding and no attention mask;
  * one iteration = one forward over the batch's prompts (prefill, timed alone), then
    tokens - 1 forwards of one token per sequence with past_key_values (decode), greedy
    (argmax of the last logits), EOS ignored: generate() breaks on this torch, so the loop
    is written out;
  * --warmup untimed iterations, then --iters timed ones; the line has the medians;
  * torch 1.13's CPU bf16 can take many minutes per iteration at batch 8 and 32, so an
    iteration stops decoding once it has run --budget-s seconds (after one decode step at
    least); when one does (or the
    warm-up alone took that long), that iteration is the point's measurement, decode time
    per step done scaled to tokens - 1 steps, and the line says "over_budget": true.

Thread counts: every batch in --batch at every count in --threads for batch 1 (the best is
what the C benchmark compares against), and at the counts in --batch-threads for larger
batches (default: the largest of --threads), torch.set_num_threads before each point.
Storage: every dtype in --dtypes (f32, bf16, f16) through from_pretrained(torch_dtype=...).
torch 1.13's CPU bf16 runs, slowly for some operators; an operator it lacks becomes an
"error" line for that point, not a crash.

Output: one JSON object per line on stdout, "bench": "decode", "side": "transformers":
first {"measure": "peer_info", torch, transformers, ...}, then one per point with dtype,
batch, threads, prefill_tok_s, decode_tok_s, decode_ms_p50 (or "error"). Exit 0 when every
point ran, 1 when one failed, 2 for a usage error or a model that does not load.
"""
import argparse
import json
import statistics
import sys
import time


def emit(obj):
    obj = dict({"bench": "decode", "side": "transformers"}, **obj)
    print(json.dumps(obj, separators=(",", ":")), flush=True)


def int_list(s):
    try:
        v = [int(x) for x in s.split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError("a comma-separated list of integers")
    if not v or min(v) < 1:
        raise argparse.ArgumentTypeError("a comma-separated list of integers >= 1")
    return v


def prompts(batch, plen, vocab):
    ids = [(i * 2654435761 + 17) % vocab for i in range(batch * plen)]
    return [ids[s * plen:(s + 1) * plen] for s in range(batch)]


def iteration(torch, model, ids, tokens, budget):
    """One prefill + up to tokens - 1 decode steps, fewer once the iteration has run for
    budget seconds; returns (prefill_s, decode_s, decode steps done)."""
    from transformers import DynamicCache
    past = DynamicCache()
    out = []
    with torch.no_grad():
        t0 = time.perf_counter()
        o = model(input_ids=ids, past_key_values=past, use_cache=True)
        nxt = torch.argmax(o.logits[:, -1, :].float(), dim=-1)
        t1 = time.perf_counter()
        out.append(nxt.tolist())
        past = o.past_key_values
        for _ in range(tokens - 1):
            if len(out) > 1 and time.perf_counter() - t0 > budget:  # >= 1 step done
                break
            o = model(input_ids=nxt[:, None], past_key_values=past, use_cache=True)
            past = o.past_key_values
            nxt = torch.argmax(o.logits[:, -1, :].float(), dim=-1)
            out.append(nxt.tolist())
        t2 = time.perf_counter()
    return t1 - t0, t2 - t1, len(out) - 1


def point(torch, model, a, dtype, batch, threads, vocab):
    torch.set_num_threads(threads)
    ids = torch.tensor(prompts(batch, a.prompt, vocab), dtype=torch.long)
    pre, dec, over = [], [], False
    try:
        for it in range(a.warmup + a.iters):
            p, d, steps = iteration(torch, model, ids, a.tokens, a.budget_s)
            if steps < a.tokens - 1 or (it < a.warmup and p + d > a.budget_s):
                # Over the budget: this iteration is the measurement, per decode step done.
                pre, dec, over = [p], [d / max(steps, 1) * (a.tokens - 1)], True
                break
            if it >= a.warmup:
                pre.append(p)
                dec.append(d)
    except Exception as e:  # an operator this torch lacks for the dtype, out of memory
        emit({"dtype": dtype, "batch": batch, "threads": threads,
              "error": "%s: %s" % (type(e).__name__, str(e).splitlines()[0][:200])})
        return False
    p, d = statistics.median(pre), statistics.median(dec)
    emit({"dtype": dtype, "batch": batch, "threads": threads, "prompt": a.prompt,
          "tokens": a.tokens, "iters": len(dec), "over_budget": over,
          "prefill_ms_p50": round(p * 1e3, 3), "decode_ms_p50": round(d * 1e3, 3),
          "prefill_tok_s": round(batch * a.prompt / p, 1),
          "decode_tok_s": round(batch * (a.tokens - 1) / d, 2) if a.tokens > 1 else 0.0})
    return True


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, help="Hugging Face model directory")
    ap.add_argument("--dtypes", default="f32,bf16", help="f32, bf16, f16, comma-separated")
    ap.add_argument("--batch", type=int_list, default=[1, 8, 32])
    ap.add_argument("--threads", type=int_list, default=[1, 2],
                    help="torch thread counts of batch 1")
    ap.add_argument("--batch-threads", type=int_list, default=None,
                    help="thread counts of larger batches (default: the largest --threads)")
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--budget-s", type=float, default=300.0,
                    help="seconds one iteration may take (see the module docstring)")
    a = ap.parse_args()
    if a.prompt < 1 or a.tokens < 2 or a.iters < 1 or a.warmup < 0:
        ap.error("--prompt >= 1, --tokens >= 2, --iters >= 1, --warmup >= 0")
    names = {"f32": "float32", "bf16": "bfloat16", "f16": "float16"}
    dtypes = [d for d in a.dtypes.split(",") if d]
    for d in dtypes:
        if d not in names:
            ap.error("--dtypes: %s is not one of f32, bf16, f16" % d)
    big_threads = a.batch_threads or [max(a.threads)]

    import torch
    import transformers
    from transformers import AutoConfig, AutoModelForCausalLM
    emit({"measure": "peer_info", "torch": torch.__version__,
          "transformers": transformers.__version__, "model": a.model,
          "threads": a.threads, "batch_threads": big_threads})
    try:
        vocab = AutoConfig.from_pretrained(a.model).vocab_size
    except Exception as e:
        emit({"error": "cannot read the config of %s: %s" % (a.model, e)})
        return 2
    ok = True
    for d in dtypes:
        try:
            model = AutoModelForCausalLM.from_pretrained(a.model,
                                                         torch_dtype=getattr(torch, names[d]))
            model.eval()
        except Exception as e:
            emit({"dtype": d, "error": "load: %s: %s" % (type(e).__name__, e)})
            ok = False
            continue
        for b in a.batch:
            for t in (a.threads if b == 1 else big_threads):
                ok = point(torch, model, a, d, b, t, vocab) and ok
        del model
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
