# Model I/O sources of gang_model: config.json, safetensors, shard loading, mkmodel, and the
# mixture-of-experts configs and expert tensors (issue #25).
list(APPEND GANG_MODEL_SOURCES
  model/config.c
  model/config-moe.c
  model/rope.c
  model/safetensors.c
  model/load.c
  model/load-moe.c
  model/mkmodel.c)
