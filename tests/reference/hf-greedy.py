#!/usr/bin/env python3
"""Greedy decoding with transformers, the reference for model semantics.

  hf-greedy.py (--model DIR | --gguf FILE) (--prompt-ids 1,2,3 | --chat TEXT | --prompt TEXT)...
               [--max-tokens N] [--no-stop] [--top5]

Loads the Hugging Face directory DIR (or, with --gguf, the GGUF file FILE through
transformers' GGUF loader: weights dequantized, tokenizer and chat template from its
metadata) in float32 (AutoModelForCausalLM), encodes each
prompt (--chat: one user message through the tokenizer's chat template with the
assistant's generation prompt; --prompt: the plain text; --prompt-ids: as given; the
option may be repeated, one kind at a time, to answer several prompts in one load), and
decodes greedily with a forward loop over past_key_values (generate() does not work on
Debian's torch 1.13): the prompt in one forward, then one token per step, the argmax of
the last position's logits (ties: the lowest id, as torch.argmax). It stops after
--max-tokens tokens or after the first end-of-sequence id of generation_config.json
(kept in the output), unless --no-stop. Deterministic: 2 threads, no sampling.

--encode-only prints only {"prompt_ids"} per prompt, without loading the model. Otherwise
it prints one JSON line per prompt, in order: {"prompt_ids", "ids", "finish": "stop" or
"length", "text", and with --top5 "top5": per step the five best [id, logit, logprob]}.
Needs the Python that `scripts/fetch-reference.sh python` prints. greedy() is also used by
hf-from-gguf.py."""
import argparse
import json
import sys


def eos_ids(model):
    """The end-of-sequence ids of the model's generation config (a list, maybe empty)."""
    cfg = getattr(model, "generation_config", None)
    eos = getattr(cfg, "eos_token_id", None) if cfg is not None else None
    if eos is None:
        eos = model.config.eos_token_id
    if eos is None:
        return []
    return list(eos) if isinstance(eos, (list, tuple)) else [int(eos)]


def greedy(model, prompt_ids, max_tokens, stop_ids=(), top5=False):
    """Greedy continuation of prompt_ids (a list of ints) by model (in eval mode): a list
    of at most max_tokens ids, ending at the first id in stop_ids; with top5, also the
    five best [id, logit, log-probability] of every step. Returns (ids, finish, steps)."""
    import torch
    from transformers import DynamicCache
    ids, steps, past = [], [], DynamicCache()
    inp = torch.tensor([prompt_ids], dtype=torch.long)
    finish = "length"
    for _ in range(max_tokens):
        with torch.no_grad():
            out = model(input_ids=inp, past_key_values=past, use_cache=True)
        past = out.past_key_values
        logits = out.logits[0, -1].float()
        nxt = int(torch.argmax(logits))
        if top5:
            v, i = torch.topk(logits, 5)
            lp = torch.log_softmax(logits.double(), dim=-1)[i]
            steps.append([[int(a), float(b), float(c)]
                          for a, b, c in zip(i.tolist(), v.tolist(), lp.tolist())])
        ids.append(nxt)
        if nxt in stop_ids:
            finish = "stop"
            break
        inp = torch.tensor([[nxt]], dtype=torch.long)
    return ids, finish, steps


def load(model_dir, with_model=True, gguf=None):
    """(model in float32 eval mode, or None without with_model; tokenizer) of the Hugging
    Face directory, or of the GGUF file gguf (model_dir is then ignored). A GGUF without
    output.weight ties the LM head (transformers 4.46 does not see that by itself)."""
    import os
    from transformers import AutoTokenizer
    kw = {}
    if gguf is not None:
        model_dir, kw["gguf_file"] = os.path.dirname(os.path.abspath(gguf)), os.path.basename(gguf)
    model = None
    if with_model:
        import torch
        from transformers import AutoModelForCausalLM
        mkw = dict(kw)
        if gguf is not None:
            import gguf as gg
            names = {t.name for t in gg.GGUFReader(gguf).tensors}
            mkw["tie_word_embeddings"] = "output.weight" not in names
        model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32, **mkw)
        model.eval()
    return model, AutoTokenizer.from_pretrained(model_dir, **kw)


def chat_ids(tok, text):
    """The ids of one user message in the chat template, with the generation prompt."""
    return list(tok.apply_chat_template([{"role": "user", "content": text}],
                                        add_generation_prompt=True, tokenize=True))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--model")
    src.add_argument("--gguf", help="a GGUF file instead of a Hugging Face directory")
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--prompt-ids", action="append")
    g.add_argument("--chat", action="append")
    g.add_argument("--prompt", action="append")
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--no-stop", action="store_true")
    ap.add_argument("--top5", action="store_true")
    ap.add_argument("--encode-only", action="store_true",
                    help="print only the prompt ids (no model load, no torch)")
    a = ap.parse_args()
    if a.max_tokens < 1:
        ap.error("--max-tokens must be at least 1")
    model, tok = load(a.model, not a.encode_only, a.gguf)
    if a.prompt_ids is not None:
        prompts = [[int(x) for x in p.split(",") if x.strip()] for p in a.prompt_ids]
    elif a.chat is not None:
        prompts = [chat_ids(tok, c) for c in a.chat]
    else:
        prompts = [list(tok(p, add_special_tokens=True)["input_ids"]) for p in a.prompt]
    if a.encode_only:
        for prompt in prompts:
            print(json.dumps({"prompt_ids": prompt}), flush=True)
        return
    import torch
    torch.set_num_threads(2)
    torch.manual_seed(0)
    stop = [] if a.no_stop else eos_ids(model)
    for prompt in prompts:
        if not prompt or min(prompt) < 0 or max(prompt) >= model.config.vocab_size:
            sys.exit("hf-greedy: prompt ids empty or outside the vocabulary")
        ids, finish, steps = greedy(model, prompt, a.max_tokens, stop, a.top5)
        res = {"prompt_ids": prompt, "ids": ids, "finish": finish,
               "text": tok.decode(ids, skip_special_tokens=False)}
        if a.top5:
            res["top5"] = steps
        print(json.dumps(res), flush=True)


if __name__ == "__main__":
    main()
