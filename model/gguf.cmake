# GGUF sources of gang_model: the reader, dequantization, config and tokenizer from metadata.
list(APPEND GANG_MODEL_SOURCES
  model/gguf.c
  model/gguf-quant.c
  model/gguf-config.c
  model/gguf-load.c
  model/gguf-text.c
  model/gguf-spm.c)
