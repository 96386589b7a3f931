#!/usr/bin/env python3
"""Writes a hand-made GGUF file of a mixture-of-experts Hugging Face directory (issue #25),
in the layout llama.cpp's converter gives each architecture, from its description: Mixtral
as `llama` with expert_count (q/k rows permuted within each head for llama.cpp's RoPE),
Qwen2-MoE as `qwen2moe` (a shared expert: ffn_*_shexp, ffn_gate_inp_shexp), Qwen3-MoE as
`qwen3moe` (q/k norms, attention.key_length); per layer the router ffn_gate_inp and the
experts stacked in the 3-D ffn_{gate,up,down}_exps; F32, no tokenizer (vocab_size given).

  moe-to-gguf.py DIR OUT.gguf

Needs the reference Python (the `gguf`, `safetensors` and numpy packages).
"""
import json
import os
import sys

import numpy as np


def permute(w, heads):
    """llama.cpp's q/k row order: Hugging Face row a*d/2 + b of a head is row 2b + a."""
    d = w.shape[0] // heads
    return (w.reshape(heads, 2, d // 2, w.shape[1]).swapaxes(1, 2).reshape(w.shape))


def main(src, out):
    import gguf
    from safetensors.numpy import load_file
    cfg = json.load(open(os.path.join(src, "config.json")))
    w = load_file(os.path.join(src, "model.safetensors"))
    kind = cfg["model_type"]
    arch = {"mixtral": "llama", "qwen2_moe": "qwen2moe", "qwen3_moe": "qwen3moe"}[kind]
    mix = kind == "mixtral"
    heads, kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg.get("head_dim") or cfg["hidden_size"] // heads
    g = gguf.GGUFWriter(out, arch)
    g.add_block_count(cfg["num_hidden_layers"])
    g.add_context_length(cfg["max_position_embeddings"])
    g.add_embedding_length(cfg["hidden_size"])
    g.add_feed_forward_length(cfg["intermediate_size"])
    g.add_head_count(heads)
    g.add_head_count_kv(kv)
    g.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    g.add_rope_freq_base(cfg["rope_theta"])
    g.add_vocab_size(cfg["vocab_size"])
    if cfg.get("head_dim"):
        g.add_key_length(hd)
        g.add_value_length(hd)
    n_exp = cfg["num_local_experts"] if mix else cfg["num_experts"]
    g.add_expert_count(n_exp)
    g.add_expert_used_count(cfg["num_experts_per_tok"])
    if not mix:
        g.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
    if kind == "qwen2_moe" and cfg.get("shared_expert_intermediate_size"):
        g.add_expert_shared_feed_forward_length(cfg["shared_expert_intermediate_size"])
    if not mix:
        g.add_bool(arch + ".expert_weights_norm", bool(cfg.get("norm_topk_prob", False)))

    def put(name, arr):
        g.add_tensor(name, np.ascontiguousarray(arr, dtype=np.float32))

    put("token_embd.weight", w["model.embed_tokens.weight"])
    put("output_norm.weight", w["model.norm.weight"])
    if "lm_head.weight" in w:
        put("output.weight", w["lm_head.weight"])
    names = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
             "self_attn.o_proj": "attn_output", "self_attn.v_proj": "attn_v",
             "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm"}
    for i in range(cfg["num_hidden_layers"]):
        p, b = "model.layers.%d." % i, "blk.%d." % i
        for hf, gg in names.items():
            if p + hf + ".weight" in w:
                put(b + gg + ".weight", w[p + hf + ".weight"])
        q, k = w[p + "self_attn.q_proj.weight"], w[p + "self_attn.k_proj.weight"]
        if mix:
            q, k = permute(q, heads), permute(k, kv)
        put(b + "attn_q.weight", q)
        put(b + "attn_k.weight", k)
        for t in "qkv":
            if p + "self_attn.%s_proj.bias" % t in w:
                put(b + "attn_%s.bias" % t, w[p + "self_attn.%s_proj.bias" % t])
        pre = p + ("block_sparse_moe." if mix else "mlp.")
        if pre + "gate.weight" not in w:  # a dense layer
            for t in ("gate", "up", "down"):
                put(b + "ffn_%s.weight" % t, w[p + "mlp.%s_proj.weight" % t])
            continue
        put(b + "ffn_gate_inp.weight", w[pre + "gate.weight"])
        parts = (("w1", "gate"), ("w3", "up"), ("w2", "down")) if mix else \
            (("gate_proj", "gate"), ("up_proj", "up"), ("down_proj", "down"))
        for hf, gg in parts:
            put(b + "ffn_%s_exps.weight" % gg,
                np.stack([w["%sexperts.%d.%s.weight" % (pre, e, hf)] for e in range(n_exp)]))
        sh = pre + "shared_expert."
        if sh + "gate_proj.weight" in w and w[sh + "gate_proj.weight"].size > 0:
            for t in ("gate", "up", "down"):
                put(b + "ffn_%s_shexp.weight" % t, w[sh + "%s_proj.weight" % t])
            put(b + "ffn_gate_inp_shexp.weight", w[pre + "shared_expert_gate.weight"][0])
    g.write_header_to_file()
    g.write_kv_data_to_file()
    g.write_tensors_to_file()
    g.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
