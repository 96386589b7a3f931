#!/usr/bin/env python3
"""The device image's PyTorch as the GPU peer, in the same run as ganglion (issue #24).

    python3 bench/torch-peer.py gemm   [--n 8192] [--iters 10] [--warmup 3]
    python3 bench/torch-peer.py decode [--shapes 1b,8b] [--batch 1,64] [--prompt 32]
                                       [--tokens 32] [--iters 3]

gemm: an n x n x n bf16 matrix product (torch.matmul, cuBLAS underneath) on random data,
median of --iters timed products after --warmup, as TFLOP/s: the number ganglion's
`bench gemm` at 8192^3 is set against.

decode: transformers' own greedy decode on the GPU for the shapes `ganglion bench decode
--device cuda` uses (1b: Llama-3.2-1B's layers with vocab 32000, 16 layers, hidden 2048,
32/8 heads, ffn 8192; 8b: Llama-3-8B's, 32 layers, hidden 4096, 32/8 heads, ffn 14336,
vocab 128256), random bf16 weights made on the device from the config (no files: 16 GB
would not be worth writing for a speed figure), batch x --prompt prompt ids, then
--tokens - 1 steps of one token per sequence with the cache (the loop written out, as
bench/hf-decode.py does on the CPU); decode tokens/s = batch x steps / time, median over
--iters. One JSON line per point on stdout ("side": "torch"); {"skipped": ...} without
a GPU.
"""
import argparse
import json
import statistics
import sys
import time

SHAPES = {
    "1b": dict(num_hidden_layers=16, hidden_size=2048, num_attention_heads=32,
               num_key_value_heads=8, intermediate_size=8192, vocab_size=32000),
    "8b": dict(num_hidden_layers=32, hidden_size=4096, num_attention_heads=32,
               num_key_value_heads=8, intermediate_size=14336, vocab_size=128256),
}


def gemm(args, torch):
    n = args.n
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(args.warmup):
        torch.matmul(a, b)
    times = []
    for _ in range(args.iters):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        torch.matmul(a, b)
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) / 1e3)
    med = statistics.median(times)
    print(json.dumps({"measure": "torch_gemm", "side": "torch", "m": n, "n": n, "k": n,
                      "dtype": "bf16", "median_ms": round(med * 1e3, 3),
                      "tflops": round(2 * n ** 3 / med / 1e12, 1), "torch": torch.__version__}))


def decode(args, torch):
    import transformers
    for shape in args.shapes.split(","):
        cfg = transformers.LlamaConfig(max_position_embeddings=4096, rope_theta=500000.0,
                                       tie_word_embeddings=False, **SHAPES[shape])
        t0 = time.time()
        kw = {"dtype": torch.bfloat16} if int(transformers.__version__.split(".")[0]) >= 5 \
            else {"torch_dtype": torch.bfloat16}
        with torch.device("cuda"):
            model = transformers.AutoModelForCausalLM.from_config(cfg, **kw)
        model.eval()
        build_s = time.time() - t0
        for batch in [int(b) for b in args.batch.split(",")]:
            ids = (torch.arange(batch * args.prompt, device="cuda").reshape(batch, args.prompt)
                   * 2654435761 + 17) % cfg.vocab_size
            runs = []
            with torch.no_grad():
                for it in range(args.iters + 1):
                    torch.cuda.synchronize()
                    r = model(input_ids=ids, use_cache=True)
                    past, nxt = r.past_key_values, r.logits[:, -1, :].argmax(-1, keepdim=True)
                    torch.cuda.synchronize()
                    t1 = time.time()
                    for _ in range(args.tokens - 1):
                        r = model(input_ids=nxt, past_key_values=past, use_cache=True)
                        past, nxt = r.past_key_values, r.logits[:, -1, :].argmax(-1, keepdim=True)
                    torch.cuda.synchronize()
                    if it > 0:  # the first is the warm-up
                        runs.append(time.time() - t1)
            med = statistics.median(runs)
            print(json.dumps({"measure": "torch_decode", "side": "torch", "shape": shape,
                              "dtype": "bf16", "batch": batch, "prompt": args.prompt,
                              "tokens": args.tokens,
                              "decode_tok_s": round(batch * (args.tokens - 1) / med, 1),
                              "build_s": round(build_s, 1), "torch": torch.__version__,
                              "transformers": transformers.__version__}), flush=True)
        del model
        torch.cuda.empty_cache()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=["gemm", "decode"])
    ap.add_argument("--n", type=int, default=8192)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--shapes", default="1b,8b")
    ap.add_argument("--batch", default="1,64")
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=32)
    args = ap.parse_args()
    try:
        import torch
    except ImportError as e:
        print(json.dumps({"measure": "torch_" + args.what, "error": "no torch: %s" % e}))
        return 1
    if not torch.cuda.is_available():
        print(json.dumps({"measure": "torch_" + args.what, "skipped": "no GPU (torch sees none)"}))
        return 0
    if args.what == "gemm":
        gemm(args, torch)
    else:
        decode(args, torch)
    return 0


if __name__ == "__main__":
    sys.exit(main())
