#!/usr/bin/env python3
"""The reference tokenizer of a GGUF file with a SentencePiece vocabulary
(tokenizer.ggml.model "llama"): transformers' own GGUF converter (GGUFLlamaConverter of
transformers 4.46.3, the class its GGUF loader uses) run on the file's tokenizer metadata,
saved as a tokenizer.json for the `tokenizers` package.

  gguf-spm-ref.py FILE.gguf OUT.json

Two things are added around the converter, neither changing what it computes: its merge
builder tests membership in a Python list (minutes per 10^5 tokens), so the token list is
handed over as a list whose `in` uses a set; and a BOS TemplateProcessing post-processor
when tokenizer.ggml.add_bos_token is true (the converter leaves that to the Python
tokenizer class). Run by the reference Python (`scripts/fetch-reference.sh python`)."""
import sys

import gguf
from tokenizers import processors


class FastList(list):
    """A list whose `in` is a set lookup (the converter's merge builder asks it millions
    of times)."""

    def __init__(self, items):
        super().__init__(items)
        self._set = set(items)

    def __contains__(self, x):
        return x in self._set


def main():
    path, out = sys.argv[1], sys.argv[2]
    from transformers.integrations.ggml import GGUFLlamaConverter
    r = gguf.GGUFReader(path)

    def field(key):
        f = r.fields.get(key)
        return None if f is None else f.contents()
    if field("tokenizer.ggml.model") != "llama":
        sys.exit("%s: not a SentencePiece (llama) vocabulary" % path)
    d = {"tokens": FastList(field("tokenizer.ggml.tokens")),
         "scores": field("tokenizer.ggml.scores"),
         "token_type": field("tokenizer.ggml.token_type")}
    for key, name in (("unknown_token_id", "unk_token_id"), ("bos_token_id", "bos_token_id"),
                      ("eos_token_id", "eos_token_id"), ("add_space_prefix", "add_prefix_space")):
        v = field("tokenizer.ggml." + key)
        if v is not None:
            d[name] = v
    tok = GGUFLlamaConverter(d).converted()
    bos = field("tokenizer.ggml.bos_token_id")
    if field("tokenizer.ggml.add_bos_token") and bos is not None:
        t = d["tokens"][bos]
        tok.post_processor = processors.TemplateProcessing(single=t + " $A",
                                                           special_tokens=[(t, bos)])
    tok.save(out)


if __name__ == "__main__":
    main()
