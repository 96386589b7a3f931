#!/usr/bin/env python3
"""ganglion against transformers on the same device and the same model files (issue #24).

    python3 bench/gpu-reference.py --bin BIN --dir WORK [--device cuda] [--shapes real]
                                   [--layouts 1x1,tp2,nccl] [--prompts 4] [--tokens 16]

For each model shape it writes a random model with `ganglion mkmodel` (bf16, seed 7):
  real:  llama1b  Llama-3.2-1B's shape (16 layers, hidden 2048, 32/8 heads, ffn 8192,
                  vocab 128256, rope_theta 5e5 with llama3 rope scaling), its LM head
                  untied: mkmodel's embeddings are N(0, 1), so a tied head gives logits of
                  several hundred and the chosen token a logprob of exactly 0 on both
                  sides (the first H200 run: max|z| ~ 560, every difference 0.0), while an
                  untied head, N(0, 1/hidden), gives O(1) logits whose logprobs compare
                  meaningfully; the tied head is qwen2's
         qwen2    Qwen2.5-0.5B's shape (24 layers, hidden 896, 14/2 heads, ffn 4864,
                  vocab 151936, tied, rope_theta 1e6, q/k/v biases): a family that both
                  the image's transformers 5.x and the reference venv's 4.46 read
  tiny:  the same two families at 2 layers and hidden 64 (the test here, on the CPU)
then runs transformers' forward (a greedy loop with past_key_values; generate() is not
used) on --device in bf16 as the reference, and `ganglion serve --local --device DEV` on the
same directory for each layout (1x1; tp2 = TP=2 on the one device over the socket backend;
nccl = 1x1 with the workers' data plane on NCCL, a world of one; tp2-nccl = TP=2 as two
workers on two GPUs over NCCL, not in the default list: NCCL refuses two ranks on one GPU;
1x1-pdl = 1x1 with --cuda-pdl, whose worker must say it took it, not in the default list;
1x1-split = 1x1 with --gpu-pool-split, every tensor its own cudaMalloc, the same),
asking /v1/completions for greedy tokens with the top-5 logprobs.

Agreement, per prompt, step by step while the two sequences are equal:
  * a different greedy token is a failure unless the reference's top-2 logit margin is
    below --tie (default 1e-2: a near tie, "near_tie_flips") or below the step's tolerance
    tol below ("within_tol_flips": transformers' bf16 logits alone are rounded to 2^-6 at
    magnitudes 2-4, so with O(1) logits margins of a few hundredths can flip on rounding
    that the tolerance allows); either is reported, and the sequence is not compared past
    it (the two continue from different prefixes);
  * |logprob(ganglion) - logprob(transformers)| of the chosen token must stay within
    tol = 2^-8 * max|z| * (1 + 2 * sqrt(L)) for that step's logits z and L layers. Why:
    transformers in bf16 hands out logits rounded to bf16 (relative 2^-9 each), which moves
    the chosen logit and the log-sum-exp by up to 2^-9 * max|z| each: 2^-8 * max|z|; and it
    rounds every activation to bf16 where ganglion keeps f32 and rounds only the GEMM
    inputs: each layer adds an independent relative error of about 2^-8 to the residual
    stream (two rounded sub-blocks), growing as sqrt(L), which reaches the logits at the
    same relative size (factor 2 for the tail). "max_diff_over_tol" is reported.
One JSON line per (model, layout) on stdout, "measure": "gpu_reference", and exit 0 when
every line has "ok": true; 1 otherwise; {"skipped": ...} and exit 0 with --device cuda on a
machine without a GPU (the device check counts that as a failure when nvidia-smi lists one).
--ref-device cpu with --device cuda compares ganglion on the CUDA emulator (tests/cuda-emu/:
the real CUDA backend and kernels, executed on the CPU) with transformers on the CPU.
"""
import argparse
import json
import math
import os
import subprocess
import sys
import time
import urllib.request

from local_serve import free_port_pair, wait_ready

SHAPES = {
    "real": [
        ("llama1b", ["--arch", "llama", "--layers", "16", "--hidden", "2048", "--heads", "32",
                     "--kv-heads", "8", "--ffn", "8192", "--vocab", "128256",
                     "--rope-theta", "500000", "--max-pos", "131072", "--rope-scaling",
                     '{"rope_type":"llama3","factor":32.0,"low_freq_factor":1.0,'
                     '"high_freq_factor":4.0,"original_max_position_embeddings":8192}'], 16),
        ("qwen2", ["--arch", "qwen2", "--layers", "24", "--hidden", "896", "--heads", "14",
                   "--kv-heads", "2", "--ffn", "4864", "--vocab", "151936", "--tie",
                   "--max-pos", "32768"], 24),
    ],
    "tiny": [
        ("llama-tiny", ["--arch", "llama", "--layers", "2", "--hidden", "64", "--heads", "4",
                        "--kv-heads", "2", "--ffn", "128", "--vocab", "256", "--rope-theta",
                        "500000", "--rope-scaling",
                        '{"rope_type":"llama3","factor":32.0,"low_freq_factor":1.0,'
                        '"high_freq_factor":4.0,"original_max_position_embeddings":64}'], 2),
        ("qwen2-tiny", ["--arch", "qwen2", "--layers", "2", "--hidden", "64", "--heads", "4",
                        "--kv-heads", "2", "--ffn", "128", "--vocab", "256", "--tie"], 2),
    ],
}


def prompts_for(n, length, vocab):
    """n prompts of length ids, the same on both sides: id = (i * 2654435761 + 17) % vocab,
    avoiding 0 and 1 (bos)."""
    return [[2 + ((s * length + i) * 2654435761 + 17) % (vocab - 2) for i in range(length)]
            for s in range(n)]


def reference(model_dir, prompts, tokens, device):
    """transformers in bf16 on device: per prompt, per step, (chosen id, its logprob, margin
    between the top two logits)."""
    import torch
    import transformers
    kw = {"dtype": torch.bfloat16} if int(transformers.__version__.split(".")[0]) >= 5 \
        else {"torch_dtype": torch.bfloat16}
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, **kw).to(device)
    model.eval()
    out = []
    with torch.no_grad():
        ids = torch.tensor(prompts, device=device)
        past, steps = None, []
        for _ in range(tokens):
            r = model(input_ids=ids, past_key_values=past, use_cache=True)
            past = r.past_key_values
            logits = r.logits[:, -1, :].float()
            lp = torch.log_softmax(logits, dim=-1)
            top2 = torch.topk(logits, 2, dim=-1)
            nxt = torch.argmax(logits, dim=-1)
            steps.append((nxt.tolist(), lp.gather(1, nxt[:, None])[:, 0].tolist(),
                          (top2.values[:, 0] - top2.values[:, 1]).tolist(),
                          logits.abs().max(dim=-1).values.tolist()))
            ids = nxt[:, None]
        for s in range(len(prompts)):
            out.append([(st[0][s], st[1][s], st[2][s], st[3][s]) for st in steps])
    del model
    if device == "cuda":
        torch.cuda.empty_cache()
    info = {"torch": torch.__version__, "transformers": transformers.__version__}
    return out, info


# The 1x1 layouts that add one flag: the flag, the result's key, and what a worker's CUDA
# backend logs when it takes the flag (kernels/cuda/cuda-backend.c).
FLAG_LAYOUTS = {
    "1x1-pdl": ("--cuda-pdl", "pdl_on",
                "the decode GEMVs launch as programmatic dependents (PDL)"),
    "1x1-split": ("--gpu-pool-split", "split_on",
                  "split: every buffer its own cudaMalloc (--gpu-pool-split)"),
}


def ganglion(args, model_dir, prompts, tokens, layout, log):
    """serve --local on model_dir with layout; per prompt the greedy (id, logprob) list."""
    port = free_port_pair()
    argv = [args.bin, "serve", "--local", "--model", model_dir, "--nnodes", "1",
            "--device", args.device, "--http-port", str(port), "--rdzv-port", str(port + 1),
            "--kv-cache-mb", "256", "--max-batch", str(len(prompts)), "--termination-log", ""]
    if layout == "tp2":
        argv += ["--nproc-per-node", "2", "--tp", "2", "--backend", "socket", "--share-gpus"]
    elif layout == "nccl":
        argv += ["--nproc-per-node", "1", "--backend", "nccl"]
    elif layout == "tp2-nccl":
        argv += ["--nproc-per-node", "2", "--tp", "2", "--backend", "nccl"]
    elif layout in FLAG_LAYOUTS:
        argv += ["--nproc-per-node", "1", FLAG_LAYOUTS[layout][0]]
    else:
        argv += ["--nproc-per-node", "1"]
    if args.device == "cuda":
        argv += ["--gpu-memory-mb", str(args.gpu_memory_mb)]
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    base = "http://127.0.0.1:%d" % port
    try:
        wait_ready(base, proc, args.ready_s)
        out = []
        for p in prompts:
            body = json.dumps({"prompt": p, "max_tokens": tokens, "temperature": 0,
                               "logprobs": 5}).encode()
            req = urllib.request.Request(base + "/v1/completions", body,
                                         {"Content-Type": "application/json"})
            ch = json.loads(urllib.request.urlopen(req, timeout=120).read())["choices"][0]
            out.append(list(zip(ch["tokens"], ch["logprobs"]["token_logprobs"])))  # ids
        return out
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def compare(ref, got, layers, tie):
    res = {"compared": 0, "mismatches": 0, "near_tie_flips": 0, "within_tol_flips": 0,
           "max_abs_logprob_diff": 0.0,
           "max_diff_over_tol": 0.0, "max_tol": 0.0, "short": 0}
    for r_seq, g_seq in zip(ref, got):
        if len(g_seq) < len(r_seq):
            res["short"] += 1
        for (rid, rlp, margin, zmax), (gid, glp) in zip(r_seq, g_seq):
            tol = 2 ** -8 * max(zmax, 1.0) * (1 + 2 * math.sqrt(layers))
            if rid != gid:
                if margin < tie:
                    res["near_tie_flips"] += 1
                elif margin < tol:
                    res["within_tol_flips"] += 1
                else:
                    res["mismatches"] += 1
                break
            res["compared"] += 1
            res["max_abs_logprob_diff"] = max(res["max_abs_logprob_diff"], abs(rlp - glp))
            res["max_diff_over_tol"] = max(res["max_diff_over_tol"], abs(rlp - glp) / tol)
            res["max_tol"] = max(res["max_tol"], tol)
    res["ok"] = (res["mismatches"] == 0 and res["short"] == 0 and res["compared"] > 0 and
                 res["max_diff_over_tol"] <= 1.0)
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--dir", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--ref-device", default=None,
                    help="transformers' device (default: --device); cpu against ganglion on "
                         "the CUDA emulator (tests/cuda-emu/)")
    ap.add_argument("--shapes", default="real", choices=sorted(SHAPES))
    ap.add_argument("--layouts", default="1x1,tp2,nccl")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--prompt-len", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--tie", type=float, default=1e-2)
    ap.add_argument("--gpu-memory-mb", type=int, default=16384)
    ap.add_argument("--ready-s", type=int, default=120)
    args = ap.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    ref_device = args.ref_device or args.device
    if ref_device == "cuda":
        smi = subprocess.run(["sh", "-c", "nvidia-smi -L 2>/dev/null"], capture_output=True,
                             text=True)
        if "GPU" not in smi.stdout:
            print(json.dumps({"measure": "gpu_reference",
                              "skipped": "no GPU (nvidia-smi lists none)"}))
            return 0
    all_ok = True
    for name, flags, layers in SHAPES[args.shapes]:
        model_dir = os.path.join(args.dir, name)
        t0 = time.time()
        subprocess.run([args.bin, "mkmodel", "--out", model_dir, "--dtype", "bf16", "--seed", "7"]
                       + flags, check=True, capture_output=True, timeout=300)
        vocab = int(flags[flags.index("--vocab") + 1])
        prompts = prompts_for(args.prompts, args.prompt_len, vocab)
        t1 = time.time()
        try:
            ref, info = reference(model_dir, prompts, args.tokens, ref_device)
        except Exception as e:  # a config transformers cannot read is a failure, named
            print(json.dumps({"measure": "gpu_reference", "model": name, "ok": False,
                              "error": "transformers: %s" % str(e)[:400]}))
            all_ok = False
            continue
        t2 = time.time()
        for layout in args.layouts.split(","):
            line = {"measure": "gpu_reference", "model": name, "layout": layout,
                    "device": args.device, "ref_device": ref_device, "layers": layers,
                    "prompts": args.prompts, "tokens": args.tokens, "tie": args.tie,
                    "mkmodel_s": round(t1 - t0, 1), "reference_s": round(t2 - t1, 1)}
            line.update(info)
            t3 = time.time()
            with open(os.path.join(args.dir, "%s-%s.log" % (name, layout)), "w") as log:
                try:
                    got = ganglion(args, model_dir, prompts, args.tokens, layout, log)
                    line.update(compare(ref, got, layers, args.tie))
                except Exception as e:
                    line.update({"ok": False, "error": "ganglion: %s" % str(e)[:400]})
            if layout in FLAG_LAYOUTS:  # the worker must have taken the flag
                _, key, text = FLAG_LAYOUTS[layout]
                with open(log.name) as f:
                    line[key] = text in f.read()
                line["ok"] = bool(line["ok"]) and line[key]
            line["ganglion_s"] = round(time.time() - t3, 1)
            all_ok &= bool(line["ok"])
            print(json.dumps(line), flush=True)
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
