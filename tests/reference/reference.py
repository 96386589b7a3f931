#!/usr/bin/env python3
"""Independent numpy reference of the Llama / Mistral / Qwen2 / Qwen3 / Gemma 3 forward pass.

Reads a Hugging Face model directory (config.json, model.safetensors or the shards named
by model.safetensors.index.json) with its own safetensors parser -- nothing of ganglion's
code -- and computes the logits of the last position of a token sequence in float64,
following transformers' LlamaForCausalLM / Qwen2ForCausalLM: RMSNorm, rotate_half RoPE,
grouped-query attention with a causal mask, SwiGLU MLP, q/k/v biases when the checkpoint
has them, and the LM head (the embedding table when the embeddings are tied); a head_dim
apart from hidden / heads; Qwen3ForCausalLM's RMSNorm of every q and k head before RoPE
(q_norm, k_norm); RoPE scaling (rope_scaling: linear, dynamic NTK over the whole
sequence, llama3, yarn with its attention factor), each computed here from transformers 4.46's
definitions; sliding windows (Mistral, Qwen2's use_sliding_window); Gemma3ForCausalLM as
transformers 4.50+ defines it (norms that multiply by 1 + w, a norm after each block before its
residual add, GeGLU with the tanh gelu, embeddings times sqrt(hidden), q/k norms, attention scaled
by query_pre_attn_scalar, windowed "local" layers with plain RoPE of rope_local_base_freq,
global ones with rope_theta and rope_scaling). It is the reference of the Qwen3 and Gemma 3
comparisons (transformers 4.46.3 has neither).

Modes:
  reference.py logits DIR --ids 1,2,3
      prints {"logits": [...]} for the last position.
  reference.py gguf-greedy FILE.gguf --ids 2,3 --steps N
      a gemma3 GGUF file (llama.cpp's layout, read with the gguf package): prints
      {"ids": greedy ids, "top": per step the 20 best [id, logprob]}.
  reference.py check --ganglion BIN --tool BIN --workdir DIR
      makes small models with `ganglion mkmodel` (llama with GQA, qwen2 with biases, tied
      embeddings, bf16 in two shards, mistral in f16, llama3 RoPE scaling with a head_dim
      of 24, mistral with head_dim 32 and linear scaling, qwen3 with yarn and plain,
      llama with dynamic NTK, Gemma 3 with local and global layers (a window that binds,
      its own RoPE bases, query_pre_attn_scalar, layer_types),
      40-token prompts past the original context of the scaled ones), runs the C tool model-logits
      on each (the engine's single-rank forward on gang_model_load's shard) and asserts that its
      logits agree with this reference within 1e-4 relative (max abs difference over max
      abs reference), and that its raw logprobs (the greedy token's and the top 5, ids in
      order) equal the log-softmax of the reference logits within 1e-4. Exit 0 on agreement, 1 on a
      mismatch, 77 when numpy is missing.
"""
import json
import os
import struct
import subprocess
import sys

try:
    import numpy as np
except ImportError:  # the CTest treats 77 as "skipped"
    print("reference.py: numpy is not installed (Debian: python3-numpy); skipping")
    sys.exit(77)

REL_TOL = 1e-4
LOGPROB_TOL = 1e-4


# ------------------------------------------------------------------------------------
# safetensors: 8-byte little-endian header length, a JSON header, then the raw data.
# ------------------------------------------------------------------------------------
def _to_f64(raw, dtype, shape):
    if dtype == "F32":
        a = np.frombuffer(raw, dtype="<f4")
    elif dtype == "F16":
        a = np.frombuffer(raw, dtype="<f2")
    elif dtype == "BF16":
        # A bfloat16 is the top half of a float32.
        u = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
        a = u.view(np.float32)
    elif dtype == "F64":
        a = np.frombuffer(raw, dtype="<f8")
    else:
        raise ValueError("unsupported dtype %s" % dtype)
    return a.astype(np.float64).reshape(shape)


def read_safetensors(path):
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8 : 8 + n].decode("utf-8"))
    base = 8 + n
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        b, e = t["data_offsets"]
        out[name] = _to_f64(blob[base + b : base + e], t["dtype"], t["shape"])
    return out


def read_model(d):
    with open(os.path.join(d, "config.json")) as f:
        cfg = json.load(f)
    index = os.path.join(d, "model.safetensors.index.json")
    tensors = {}
    if os.path.exists(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
        for name in files:
            tensors.update(read_safetensors(os.path.join(d, name)))
    else:
        tensors = read_safetensors(os.path.join(d, "model.safetensors"))
    return cfg, tensors


# ------------------------------------------------------------------------------------
# The forward pass, float64.
# ------------------------------------------------------------------------------------
def rmsnorm(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def inv_freq(cfg, d, t_len):
    """RoPE's inverse frequencies for head width d and the factor on cos and sin, from
    rope_theta and rope_scaling, as transformers 4.46 defines each rope_type: written here
    from those definitions in numpy, rounded to float32 as transformers keeps them. Dynamic
    NTK takes the length t_len of the sequence (one forward over all of it)."""
    theta = cfg.get("rope_theta", 10000.0)
    rs = cfg.get("rope_scaling") or {}
    kind = rs.get("rope_type", rs.get("type", "default"))
    if kind == "dynamic":
        ctx = cfg["max_position_embeddings"]
        grown = max(t_len, ctx)
        theta = theta * (rs["factor"] * grown / ctx - (rs["factor"] - 1)) ** (d / (d - 2))
        kind = "default"
    expo = np.arange(0, d, 2, dtype=np.float64) / d
    inv = theta ** -expo
    scale = 1.0
    if kind == "linear":
        inv = inv / rs["factor"]
    elif kind == "llama3":
        f, lo, hi = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"]
        old = rs["original_max_position_embeddings"]
        wl = 2 * np.pi / inv
        blend = (old / wl - lo) / (hi - lo)
        mid = (1 - blend) * inv / f + blend * inv
        inv = np.where(wl < old / hi, inv, np.where(wl > old / lo, inv / f, mid))
    elif kind == "yarn":
        f, ctx = rs["factor"], cfg["max_position_embeddings"]
        fast, slow = rs.get("beta_fast") or 32, rs.get("beta_slow") or 1
        scale = rs.get("attention_factor") or 0.1 * np.log(f) + 1.0

        # The pair index where a frequency makes `rot` turns over the context.
        def dim_of(rot):
            return d * np.log(ctx / (rot * 2 * np.pi)) / (2 * np.log(theta))
        lo, hi = max(np.floor(dim_of(fast)), 0), min(np.ceil(dim_of(slow)), d - 1)
        hi = hi + 0.001 if lo == hi else hi
        ramp = np.clip((np.arange(d // 2) - lo) / (hi - lo), 0, 1)
        inv = inv / f * ramp + inv * (1 - ramp)
    elif kind != "default":
        raise ValueError("rope_type %s" % kind)
    return inv.astype(np.float32).astype(np.float64), scale


def rope(x, inv, scale):
    # x [T, heads, d]; rotate_half: pairs (i, i + d/2); position t = row t.
    t_len, _, d = x.shape
    ang = np.arange(t_len, dtype=np.float64)[:, None] * inv[None, :]
    cos = scale * np.cos(np.concatenate([ang, ang], axis=-1))[:, None, :]
    sin = scale * np.sin(np.concatenate([ang, ang], axis=-1))[:, None, :]
    half = d // 2
    rot = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos + rot * sin


def layer_windows(cfg):
    """Per layer, the keys a query sees (itself included), or None: Mistral's
    sliding_window on every layer; Qwen2/3's from max_window_layers on when
    use_sliding_window; Gemma 3's local layers (layer_types, else every
    sliding_window_pattern-th layer global)."""
    n, sw = cfg["num_hidden_layers"], cfg.get("sliding_window")
    kind = cfg.get("model_type")
    if sw is None:
        return [None] * n
    if kind == "gemma3_text":
        types = cfg.get("layer_types")
        if types is None:
            pat = cfg.get("sliding_window_pattern", cfg.get("_sliding_window_pattern", 6))
            types = ["full_attention" if (i + 1) % pat == 0 else "sliding_attention"
                     for i in range(n)]
        return [sw if t == "sliding_attention" else None for t in types]
    if kind in ("qwen2", "qwen3", "qwen2_moe", "qwen3_moe"):
        if not cfg.get("use_sliding_window", False):
            return [None] * n
        first = cfg.get("max_window_layers", 0)
        return [sw if i >= first else None for i in range(n)]
    return [sw] * n


def moe_layer(w, p):
    """Whether layer prefix p holds a router (Qwen2/3-MoE's mlp.gate, Mixtral's)."""
    return p + "mlp.gate.weight" in w or p + "block_sparse_moe.gate.weight" in w


def swiglu(h, wg, wu, wd):
    g = h @ wg.T
    return ((g / (1.0 + np.exp(-g))) * (h @ wu.T)) @ wd.T


def moe_block(cfg, w, p, h):
    """A mixture-of-experts MLP in float64, token by token: softmax over the router's logits,
    the top_k (equal values: the lower id first, a stable sort), renormalised for Mixtral or
    norm_topk_prob, each chosen expert's SwiGLU weighted; plus Qwen2-MoE's shared expert
    times the sigmoid of its gate."""
    mix = p + "block_sparse_moe.gate.weight" in w
    pre = p + ("block_sparse_moe." if mix else "mlp.")
    names = ("w1", "w3", "w2") if mix else ("gate_proj", "up_proj", "down_proj")
    k = cfg["num_experts_per_tok"]
    norm = True if mix else cfg.get("norm_topk_prob", False)
    z = h @ w[pre + "gate.weight"].T
    prob = np.exp(z - z.max(axis=-1, keepdims=True))
    prob = prob / prob.sum(axis=-1, keepdims=True)
    out = np.zeros_like(h)
    for t in range(h.shape[0]):
        top = np.argsort(-prob[t], kind="stable")[:k]
        wt = prob[t][top]
        if norm:
            wt = wt / wt.sum()
        for e, we in zip(top, wt):
            ws = [w["%sexperts.%d.%s.weight" % (pre, e, n)] for n in names]
            out[t] += we * swiglu(h[t:t + 1], *ws)[0]
    sh = pre + "shared_expert."
    if sh + "gate_proj.weight" in w and w[sh + "gate_proj.weight"].size > 0:
        gate = 1.0 / (1.0 + np.exp(-(h @ w[pre + "shared_expert_gate.weight"].T)))
        out = out + gate * swiglu(h, w[sh + "gate_proj.weight"], w[sh + "up_proj.weight"],
                                  w[sh + "down_proj.weight"])
    return out


def forward_logits(cfg, w, ids):
    hidden = cfg["hidden_size"]
    heads = cfg["num_attention_heads"]
    kv_heads = cfg.get("num_key_value_heads", heads)
    d = cfg.get("head_dim") or hidden // heads
    eps = cfg.get("rms_norm_eps", 1e-6)
    n_layers = cfg["num_hidden_layers"]
    t_len = len(ids)
    gemma = cfg.get("model_type") == "gemma3_text"
    inv, scale = inv_freq(cfg, d, t_len)
    inv_local = inv
    if gemma:  # local layers: plain RoPE of base rope_local_base_freq
        local = {"rope_theta": cfg.get("rope_local_base_freq", 10000.0)}
        inv_local, _ = inv_freq(local, d, t_len)
    # Gemma's norms multiply by (1 + w); its attention divides by sqrt(query_pre_attn_scalar).
    shift = 1.0 if gemma else 0.0
    att_scale = (cfg.get("query_pre_attn_scalar", 256) if gemma else d) ** -0.5
    windows = layer_windows(cfg)

    def norm(x, name):
        return rmsnorm(x, w[name] + shift, eps)

    x = w["model.embed_tokens.weight"][np.array(ids)]
    if gemma:  # transformers keeps the embedding scale as a float32 buffer
        x = x * float(np.float32(hidden ** 0.5))
    pos = np.arange(t_len)
    causal = np.where(pos[None, :] <= pos[:, None], 0.0, -np.inf)
    for i in range(n_layers):
        p = "model.layers.%d." % i
        mask = causal
        if windows[i] is not None:
            mask = np.where(pos[:, None] - pos[None, :] < windows[i], causal, -np.inf)
        h = norm(x, p + "input_layernorm.weight")
        q = h @ w[p + "self_attn.q_proj.weight"].T
        k = h @ w[p + "self_attn.k_proj.weight"].T
        v = h @ w[p + "self_attn.v_proj.weight"].T
        if p + "self_attn.q_proj.bias" in w:
            q = q + w[p + "self_attn.q_proj.bias"]
            k = k + w[p + "self_attn.k_proj.bias"]
            v = v + w[p + "self_attn.v_proj.bias"]
        q = q.reshape(t_len, heads, d)
        k = k.reshape(t_len, kv_heads, d)
        if p + "self_attn.q_norm.weight" in w:  # Qwen3, Gemma 3: RMSNorm of every head
            q = norm(q, p + "self_attn.q_norm.weight")
            k = norm(k, p + "self_attn.k_norm.weight")
        if gemma and windows[i] is not None:
            q, k = rope(q, inv_local, 1.0), rope(k, inv_local, 1.0)
        else:
            q, k = rope(q, inv, scale), rope(k, inv, scale)
        v = v.reshape(t_len, kv_heads, d)
        rep = heads // kv_heads
        k = np.repeat(k, rep, axis=1)
        v = np.repeat(v, rep, axis=1)
        s = np.einsum("thd,shd->hts", q, k) * att_scale + mask[None]
        s = np.exp(s - s.max(axis=-1, keepdims=True))
        s = s / s.sum(axis=-1, keepdims=True)
        a = np.einsum("hts,shd->thd", s, v).reshape(t_len, heads * d)
        a = a @ w[p + "self_attn.o_proj.weight"].T
        if gemma:  # sandwich norms
            x = x + norm(a, p + "post_attention_layernorm.weight")
            h = norm(x, p + "pre_feedforward_layernorm.weight")
        else:
            x = x + a
            h = norm(x, p + "post_attention_layernorm.weight")
        if moe_layer(w, p):
            x = x + moe_block(cfg, w, p, h)
            continue
        g = h @ w[p + "mlp.gate_proj.weight"].T
        u = h @ w[p + "mlp.up_proj.weight"].T
        if gemma:  # GeGLU with PyTorch's tanh gelu
            act = 0.5 * g * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (g + 0.044715 * g ** 3)))
            x = x + norm((act * u) @ w[p + "mlp.down_proj.weight"].T,
                         p + "post_feedforward_layernorm.weight")
        else:
            x = x + ((g / (1.0 + np.exp(-g))) * u) @ w[p + "mlp.down_proj.weight"].T
    h = norm(x[-1], "model.norm.weight")
    head = w.get("lm_head.weight")
    if head is None or cfg.get("tie_word_embeddings", gemma):
        head = w["model.embed_tokens.weight"]
    return h @ head.T


# ------------------------------------------------------------------------------------
# A GGUF file (Gemma 3 as llama.cpp writes it), read with the gguf package.
# ------------------------------------------------------------------------------------
GGUF_NAMES = {"attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj",
              "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
              "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm",
              "attn_k_norm": "self_attn.k_norm",
              "post_attention_norm": "post_attention_layernorm",
              "ffn_norm": "pre_feedforward_layernorm",
              "post_ffw_norm": "post_feedforward_layernorm",
              "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}


def read_gguf_gemma3(path):
    """config and Hugging Face-named float64 weights of a gemma3 GGUF file. llama.cpp's
    converter stores Gemma's norm weights as 1 + w: 1 is taken off again here (as
    transformers' GGUF loader does), and it leaves q/k rows unpermuted for this arch."""
    import gguf
    from gguf import quants
    r = gguf.GGUFReader(path)

    def val(key, default=None):
        f = r.fields.get(key)
        return default if f is None else f.contents()
    if val("general.architecture") != "gemma3":
        raise ValueError("%s: not a gemma3 file" % path)
    hidden = val("gemma3.embedding_length")
    heads = val("gemma3.attention.head_count")
    d = val("gemma3.attention.key_length", hidden // heads)
    cfg = {"model_type": "gemma3_text", "hidden_size": hidden, "num_attention_heads": heads,
           "num_key_value_heads": val("gemma3.attention.head_count_kv", heads), "head_dim": d,
           "num_hidden_layers": val("gemma3.block_count"),
           "rms_norm_eps": val("gemma3.attention.layer_norm_rms_epsilon"),
           "rope_theta": val("gemma3.rope.freq_base"),
           "rope_local_base_freq": val("gemma3.rope.freq_base_swa", 10000.0),
           "sliding_window": val("gemma3.attention.sliding_window"),
           "sliding_window_pattern": 6, "query_pre_attn_scalar": d,
           "max_position_embeddings": val("gemma3.context_length"), "tie_word_embeddings": True}
    w = {}
    for t in r.tensors:
        a = quants.dequantize(t.data, t.tensor_type).astype(np.float64)
        if t.name == "token_embd.weight":
            name = "model.embed_tokens.weight"
        elif t.name == "output_norm.weight":
            name = "model.norm.weight"
        elif t.name == "output.weight":
            name, cfg["tie_word_embeddings"] = "lm_head.weight", False
        else:
            _, layer, kind, _ = t.name.split(".")
            name = "model.layers.%s.%s.weight" % (layer, GGUF_NAMES[kind])
        if name.endswith("norm.weight"):
            a = a - 1.0
        w[name] = a.reshape(a.shape)
    cfg["vocab_size"] = w["model.embed_tokens.weight"].shape[0]
    return cfg, w


# ------------------------------------------------------------------------------------
# The check against the C engine.
# ------------------------------------------------------------------------------------
MODELS = [
    ("llama-gqa", ["--arch", "llama", "--layers", "3", "--hidden", "64", "--heads", "8",
                   "--kv-heads", "2", "--ffn", "96", "--vocab", "301", "--seed", "3"]),
    ("qwen2-bias", ["--arch", "qwen2", "--layers", "2", "--hidden", "64", "--heads", "4",
                    "--kv-heads", "2", "--ffn", "128", "--vocab", "256", "--seed", "4"]),
    ("llama-tied", ["--arch", "llama", "--layers", "2", "--hidden", "32", "--heads", "4",
                    "--kv-heads", "4", "--ffn", "64", "--vocab", "200", "--seed", "5", "--tie"]),
    ("llama-bf16", ["--arch", "llama", "--layers", "2", "--hidden", "64", "--heads", "4",
                    "--kv-heads", "1", "--ffn", "128", "--vocab", "256", "--seed", "6",
                    "--dtype", "bf16", "--shards", "2"]),
    ("mistral-f16", ["--arch", "mistral", "--layers", "2", "--hidden", "64", "--heads", "4",
                     "--kv-heads", "2", "--ffn", "128", "--vocab", "256", "--seed", "7",
                     "--dtype", "f16"]),
    # RoPE scaling and head_dim: max-pos 8 (the original context) below the 40 positions
    # of LONG_IDS, so the rescaled low frequencies matter.
    ("llama3-scaled", ["--arch", "llama", "--layers", "2", "--hidden", "64", "--heads", "4",
                       "--kv-heads", "2", "--ffn", "96", "--vocab", "256", "--seed", "8",
                       "--head-dim", "24", "--max-pos", "64", "--rope-theta", "500000",
                       "--rope-scaling", '{"rope_type": "llama3", "factor": 32.0, '
                       '"low_freq_factor": 1.0, "high_freq_factor": 4.0, '
                       '"original_max_position_embeddings": 8}']),
    ("mistral-headdim-linear", ["--arch", "mistral", "--layers", "2", "--hidden", "48",
                                "--heads", "4", "--kv-heads", "1", "--ffn", "64", "--vocab",
                                "256", "--seed", "9", "--head-dim", "32", "--max-pos", "16",
                                "--rope-scaling", '{"type": "linear", "factor": 4.0}']),
    ("qwen3-yarn", ["--arch", "qwen3", "--layers", "2", "--hidden", "48", "--heads", "4",
                    "--kv-heads", "2", "--ffn", "96", "--vocab", "256", "--seed", "10",
                    "--head-dim", "32", "--max-pos", "16",
                    "--rope-scaling", '{"rope_type": "yarn", "factor": 4.0}']),
    ("llama-dynamic", ["--arch", "llama", "--layers", "2", "--hidden", "64", "--heads", "4",
                       "--kv-heads", "2", "--ffn", "96", "--vocab", "256", "--seed", "13",
                       "--max-pos", "16", "--rope-scaling",
                       '{"rope_type": "dynamic", "factor": 4.0}']),
    ("qwen3-plain", ["--arch", "qwen3", "--layers", "2", "--hidden", "64", "--heads", "4",
                     "--kv-heads", "4", "--ffn", "96", "--vocab", "256", "--seed", "11",
                     "--tie"]),
    # Gemma 3: 3 layers, every 3rd global; a 16-key window on the local ones (LONG_IDS is
    # 40), their own RoPE base, query_pre_attn_scalar apart from head_dim, linear scaling
    # on the global layer only. The third element edits config.json after mkmodel.
    ("gemma3-local-global", ["--arch", "gemma3", "--layers", "3", "--hidden", "48", "--heads",
                             "4", "--kv-heads", "2", "--head-dim", "32", "--ffn", "96",
                             "--vocab", "256", "--seed", "14", "--tie", "--max-pos", "64",
                             "--rope-scaling", '{"rope_type": "linear", "factor": 2.0}'],
     {"sliding_window": 16, "sliding_window_pattern": 3, "query_pre_attn_scalar": 20,
      "rope_local_base_freq": 500.0, "rope_theta": 1000000.0}),
    # Mixture of experts (issue #25): Mixtral 8 experts top-2; Qwen2-MoE 64 experts top-8
    # with a shared expert and a dense first layer; Qwen3-MoE 16 experts top-4 renormalised.
    ("mixtral-8x2", ["--arch", "mistral", "--moe", "mixtral", "--layers", "2", "--hidden", "64",
                     "--heads", "4", "--kv-heads", "2", "--ffn", "48", "--experts", "8",
                     "--top-k", "2", "--vocab", "256", "--seed", "21"]),
    ("qwen2moe-64x8-shared", ["--arch", "qwen2", "--moe", "qwen2", "--layers", "2", "--hidden",
                              "64", "--heads", "4", "--kv-heads", "2", "--ffn", "96",
                              "--moe-ffn", "16", "--shared-ffn", "64", "--experts", "64",
                              "--top-k", "8", "--dense-layers", "1", "--vocab", "256",
                              "--seed", "22"]),
    ("qwen3moe-16x4", ["--arch", "qwen3", "--moe", "qwen3", "--layers", "2", "--hidden", "64",
                       "--heads", "4", "--kv-heads", "2", "--head-dim", "32", "--ffn", "96",
                       "--moe-ffn", "32", "--experts", "16", "--top-k", "4", "--norm-topk",
                       "--vocab", "256", "--seed", "23"]),
    # Gemma 3 with layer_types instead of the pattern, every layer global but the first.
    ("gemma3-layer-types", ["--arch", "gemma3", "--layers", "2", "--hidden", "32", "--heads",
                            "2", "--kv-heads", "1", "--head-dim", "64", "--ffn", "64",
                            "--vocab", "256", "--seed", "15", "--max-pos", "64",
                            "--rope-scaling", '{"rope_type": "default"}'],
     {"sliding_window": 8, "layer_types": ["sliding_attention", "full_attention"],
      "tie_word_embeddings": False}),
]
IDS = [1, 17, 42, 5, 99, 3, 150, 7, 64, 2, 33]
LONG_IDS = [(i * 37 + 5) % 251 for i in range(40)]


def log_softmax(x):
    m = np.max(x)
    return x - (m + np.log(np.sum(np.exp(x - m))))


def logprob_error(got, ref_logits):
    """Largest difference between the engine's raw logprobs (the sampled token's and its
    top 5) and the log-softmax of the reference logits; inf when the top ids differ from
    the reference's order (value descending, then id ascending)."""
    lp = log_softmax(ref_logits)
    order = sorted(range(lp.size), key=lambda i: (-lp[i], i))[:len(got["top_ids"])]
    if len(got["top_ids"]) != 5 or list(got["top_ids"]) != order:
        print("logprobs: top ids %s, reference %s" % (got["top_ids"], order))
        return float("inf")
    err = abs(got["logprob"] - lp[got["token"]])
    for i, v in zip(got["top_ids"], got["top_logprobs"]):
        err = max(err, abs(v - lp[i]))
    return float(err)


def check(ganglion, tool, workdir):
    os.makedirs(workdir, exist_ok=True)
    failed = 0
    for name, flags, *edit in MODELS:
        d = os.path.join(workdir, name)
        subprocess.run([ganglion, "mkmodel", "--out", d] + flags, check=True,
                       stdout=subprocess.DEVNULL)
        if edit:
            with open(os.path.join(d, "config.json")) as f:
                cfg = json.load(f)
            cfg.update(edit[0])
            with open(os.path.join(d, "config.json"), "w") as f:
                json.dump(cfg, f)
        cfg, w = read_model(d)
        ids = [i % cfg["vocab_size"] for i in (LONG_IDS if "--rope-scaling" in flags else IDS)]
        out = subprocess.run([tool, d, ",".join(map(str, ids))], check=True,
                             capture_output=True, text=True).stdout
        got = np.array(json.loads(out)["logits"], dtype=np.float64)
        ref = forward_logits(cfg, w, ids)
        if got.shape != ref.shape:
            print("%s: %d logits, expected %d" % (name, got.size, ref.size))
            failed += 1
            continue
        rel = np.max(np.abs(got - ref)) / max(np.max(np.abs(ref)), 1e-30)
        ok = rel <= REL_TOL and int(np.argmax(got)) == int(np.argmax(ref))
        lp_err = logprob_error(json.loads(out), ref)
        ok = ok and lp_err <= LOGPROB_TOL
        print(json.dumps({"model": name, "rel_err": float(rel), "argmax": int(np.argmax(got)),
                          "ref_argmax": int(np.argmax(ref)), "logprob_err": lp_err,
                          "ok": bool(ok)}))
        failed += 0 if ok else 1
    return 1 if failed else 0


def main(argv):
    if len(argv) >= 2 and argv[1] == "logits":
        d = argv[2]
        ids = [int(t) for t in argv[argv.index("--ids") + 1].split(",")]
        cfg, w = read_model(d)
        print(json.dumps({"logits": [float(v) for v in forward_logits(cfg, w, ids)]}))
        return 0
    if len(argv) >= 2 and argv[1] == "gguf-greedy":
        # reference.py gguf-greedy FILE --ids 2,... --steps N: greedy ids and the
        # log-softmax of each step's logits (a forward over the whole sequence per step).
        cfg, w = read_gguf_gemma3(argv[2])
        ids = [int(t) for t in argv[argv.index("--ids") + 1].split(",")]
        out, rows = [], []
        for _ in range(int(argv[argv.index("--steps") + 1])):
            lp = log_softmax(forward_logits(cfg, w, ids + out))
            out.append(int(np.argmax(lp)))
            rows.append(sorted(((float(v), i) for i, v in enumerate(lp)), reverse=True)[:20])
        print(json.dumps({"ids": out, "top": [[[i, v] for v, i in r] for r in rows]}))
        return 0
    if len(argv) >= 2 and argv[1] == "check":
        opt = {argv[i]: argv[i + 1] for i in range(2, len(argv) - 1, 2)}
        return check(opt["--ganglion"], opt["--tool"], opt["--workdir"])
    sys.stderr.write(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
