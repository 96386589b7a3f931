#!/usr/bin/env python3
"""Tiny random models with the config structure of real checkpoints that use RoPE scaling
or a separate head_dim, made and run by transformers (the reference).

  hf-rope-models.py --workdir DIR [--steps N] [--only NAME,...]

For each model of MODELS it builds the config with transformers' own config class
(LlamaConfig with rope_scaling llama3 as Llama 3.2 ships it, MistralConfig with a head_dim
apart from hidden / heads as Mistral Nemo, Qwen2Config with YaRN as Qwen2.5's long-context
recipe, LlamaConfig with linear scaling and a head_dim, with dynamic NTK, a no-op
{"rope_type": "default"} block), draws its weights from a seeded generator at scales that keep the
logits decisive (linear N(0, 1/in), embeddings N(0, 1), or N(0, 0.01) when tied, norms 1 + 0.1 N(0,
1)), saves it in float32 with save_pretrained(safe_serialization=True) under DIR/NAME, and decodes
greedily with a float32 forward loop over past_key_values (tests/reference/hf-greedy.py's greedy())
from a prompt longer than the original context. It prints one JSON line per model: {"name",
"dir", "prompt", "ids", "logprobs": per step the log-softmax row of the logits}.
Everything is computed in this run; nothing is stored in the repository. Needs the Python
that `scripts/fetch-reference.sh python` prints (transformers 4.46.3, Debian's torch).
"""
import argparse
import json
import math
import os

SEED = 1234

# name -> (config class, keyword arguments, prompt length). Tiny sizes; the original
# contexts (64) are below the prompts where the scaling matters.
COMMON = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5,
              bos_token_id=1, eos_token_id=None, torch_dtype="float32")
MODELS = {
    # Llama 3.2: llama3 frequency rescale (factor 32, low 1, high 4), tied embeddings.
    "llama32-llama3": ("LlamaConfig", dict(
        COMMON, max_position_embeddings=256, rope_theta=500000.0, tie_word_embeddings=True,
        rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 64}), 150),
    # Mistral Nemo / Small 3: head_dim 32 while hidden / heads is 16.
    "nemo-head-dim": ("MistralConfig", dict(
        COMMON, max_position_embeddings=256, rope_theta=1000000.0, head_dim=32,
        sliding_window=None), 120),
    # Qwen2.5 with YaRN (factor 4 over a 64-token original context: 256 served).
    "qwen2-yarn": ("Qwen2Config", dict(
        COMMON, max_position_embeddings=64, rope_theta=1000000.0, tie_word_embeddings=True,
        use_sliding_window=False,
        rope_scaling={"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}),
        150),
    # A linear-scaling fine-tune (factor 4 over 64), with a separate head_dim of 24.
    "llama-linear-head-dim": ("LlamaConfig", dict(
        COMMON, max_position_embeddings=64, head_dim=24,
        rope_scaling={"type": "linear", "factor": 4.0}), 150),
    # Dynamic NTK (factor 4 over 64): the base grows with the sequence's length.
    "llama-dynamic": ("LlamaConfig", dict(
        COMMON, max_position_embeddings=64, rope_scaling={"type": "dynamic", "factor": 4.0}),
        150),
    # Mistral 7B v0.1: a sliding window (32 keys, the current one included) on every layer.
    "mistral-window": ("MistralConfig", dict(
        COMMON, max_position_embeddings=256, rope_theta=10000.0, sliding_window=32), 120),
    # Qwen2 with use_sliding_window from layer max_window_layers = 0 on (40 keys).
    "qwen2-window": ("Qwen2Config", dict(
        COMMON, max_position_embeddings=256, rope_theta=10000.0, use_sliding_window=True,
        sliding_window=40, max_window_layers=0), 120),
    # One kv head (MQA) and an odd vocabulary: on TP 2 the kv head is replicated on both
    # ranks and the LM head's rows split 126 / 125.
    "llama-mqa-odd-vocab": ("LlamaConfig", dict(
        COMMON, vocab_size=251, num_key_value_heads=1, max_position_embeddings=256), 100),
    # A no-op block is accepted and changes nothing.
    "llama-noop": ("LlamaConfig", dict(
        COMMON, max_position_embeddings=256, rope_scaling={"rope_type": "default"}), 100),
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
                # Tied: a small table, so that a token's own row does not win every step.
                scale = 0.1 if cfg.tie_word_embeddings else 1.0
                p.copy_(scale * torch.randn(p.shape, generator=gen))
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
