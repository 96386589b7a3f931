#!/usr/bin/env python3
"""Tiny random mixture-of-experts models with the config structure of real checkpoints,
made and run by transformers (the reference; issue #25).

  hf-moe-models.py --workdir DIR [--steps N] [--only NAME,...]

For each model of MODELS it builds the config with transformers' own config class
(MixtralConfig: 8 experts top-2, renormalised; Qwen2MoeConfig: 64 experts top-8 with a
shared expert and its sigmoid gate, norm_topk_prob false, a dense first layer by
mlp_only_layers; Qwen2MoeConfig: 8 experts top-2, norm_topk_prob true, every second layer
sparse by decoder_sparse_step), draws its weights from a seeded generator (linear N(0, 1/in),
embeddings N(0, 1), norms 1 + 0.1 N(0, 1)), saves it in float32 under DIR/NAME, and decodes
greedily with a float32 forward loop over past_key_values. It prints one JSON line per model:
{"name", "dir", "prompt", "ids", "logprobs": per step the log-softmax row of the logits}.
Everything is computed in this run; nothing is stored in the repository. Needs the Python
that `scripts/fetch-reference.sh python` prints (transformers 4.46.3, Debian's torch).
"""
import argparse
import json
import math
import os

SEED = 2525

COMMON = dict(vocab_size=256, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
              rms_norm_eps=1e-5, max_position_embeddings=256, bos_token_id=1,
              eos_token_id=None, torch_dtype="float32", tie_word_embeddings=False)
MODELS = {
    # Mixtral 8x7B's structure: every layer sparse, top-2 of 8, renormalised.
    "mixtral-8x2": ("MixtralConfig", dict(
        COMMON, intermediate_size=96, num_hidden_layers=2, num_local_experts=8,
        num_experts_per_tok=2, rope_theta=1000000.0, sliding_window=None), 40),
    # Qwen1.5-MoE / Qwen2-57B-A14B's structure: 64 experts top-8, a shared expert with a
    # sigmoid gate, norm_topk_prob false, the first layer dense (mlp_only_layers).
    "qwen2moe-64x8-shared": ("Qwen2MoeConfig", dict(
        COMMON, intermediate_size=128, moe_intermediate_size=32,
        shared_expert_intermediate_size=96, num_hidden_layers=3, num_experts=64,
        num_experts_per_tok=8, norm_topk_prob=False, decoder_sparse_step=1,
        mlp_only_layers=[0], use_sliding_window=False, rope_theta=1000000.0), 40),
    # norm_topk_prob true, every second layer sparse (decoder_sparse_step 2), no shared expert.
    "qwen2moe-8x2-step2": ("Qwen2MoeConfig", dict(
        COMMON, intermediate_size=128, moe_intermediate_size=64,
        shared_expert_intermediate_size=0, num_hidden_layers=4, num_experts=8,
        num_experts_per_tok=2, norm_topk_prob=True, decoder_sparse_step=2, mlp_only_layers=[],
        use_sliding_window=False, rope_theta=1000000.0), 40),
}


def prompt_of(n):
    """A fixed prompt of n ids in [2, 251), no repeats in short windows."""
    return [2 + (i * 97 + 13) % 249 for i in range(n)]


def build(name, workdir):
    """Makes, re-initialises and saves model `name`; returns (model, directory, prompt)."""
    import torch
    import transformers
    cls, kw, n = MODELS[name]
    cfg = getattr(transformers, cls)(**kw)
    torch.manual_seed(SEED)
    model = transformers.AutoModelForCausalLM.from_config(cfg, torch_dtype=torch.float32)
    gen = torch.Generator().manual_seed(SEED + len(name))
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if p.dim() == 1:
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
            elif "embed_tokens" in pname:
                p.copy_(torch.randn(p.shape, generator=gen))
            else:
                p.copy_(torch.randn(p.shape, generator=gen) / math.sqrt(p.shape[1]))
    model.eval()
    d = os.path.join(workdir, name)
    model.save_pretrained(d, safe_serialization=True)
    return model, d, prompt_of(n)


def greedy_logprobs(model, prompt, steps):
    """Greedy ids and the log-softmax row of every step (forward loop with a cache)."""
    import torch
    from transformers import DynamicCache
    ids, rows, past = [], [], DynamicCache()
    inp = torch.tensor([prompt], dtype=torch.long)
    for _ in range(steps):
        with torch.no_grad():
            out = model(input_ids=inp, past_key_values=past, use_cache=True)
        past = out.past_key_values
        logits = out.logits[0, -1].double()
        rows.append(torch.log_softmax(logits, dim=-1).tolist())
        nxt = int(torch.argmax(logits))
        ids.append(nxt)
        inp = torch.tensor([[nxt]], dtype=torch.long)
    return ids, rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--only", default="")
    a = ap.parse_args()
    import torch
    torch.set_num_threads(2)
    names = [n for n in MODELS if not a.only or n in a.only.split(",")]
    for name in names:
        model, d, prompt = build(name, a.workdir)
        ids, rows = greedy_logprobs(model, prompt, a.steps)
        print(json.dumps({"name": name, "dir": d, "prompt": prompt, "ids": ids,
                          "logprobs": rows}), flush=True)


if __name__ == "__main__":
    main()
