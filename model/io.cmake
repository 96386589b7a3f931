# Model I/O sources of gang_model: config.json, safetensors, shard loading, mkmodel.
list(APPEND GANG_MODEL_SOURCES
  model/config.c
  model/rope.c
  model/safetensors.c
  model/load.c
  model/mkmodel.c)
