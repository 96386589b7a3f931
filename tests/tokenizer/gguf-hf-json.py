#!/usr/bin/env python3
"""The tokenizer.json transformers writes when it converts a GGUF file's tokenizer
(issue #27: for SmolLM2's byte-level vocabulary that is a decoder Sequence[ByteFallback,
Fuse, Replace("\u2581" -> " "), ByteLevel], which ganglion once refused).

  gguf-hf-json.py FILE.gguf OUT.json

Run with the reference Python (transformers and gguf, scripts/fetch-reference.sh)."""
import os
import sys

from transformers import AutoTokenizer


def main():
    path, out = os.path.abspath(sys.argv[1]), sys.argv[2]
    tok = AutoTokenizer.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path))
    with open(out, "w", encoding="utf-8") as f:
        f.write(tok.backend_tokenizer.to_str())


if __name__ == "__main__":
    main()
