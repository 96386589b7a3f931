# GGUF sources of gang_model: the reader, dequantization, config from metadata, and the
# vocabulary adapters that turn a file's tokenizer.* metadata into a tokenizer.json and a
# chat template for text/ (gguf-vocab.c; SentencePiece vocabularies: gguf-vocab-spm.c).
list(APPEND GANG_MODEL_SOURCES
  model/gguf.c
  model/gguf-quant.c
  model/gguf-config.c
  model/gguf-load.c
  model/gguf-blocks.c
  model/gguf-vocab.c
  model/gguf-vocab-spm.c)
