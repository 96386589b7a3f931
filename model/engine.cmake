# Generation-engine sources of gang_model: step loop, scheduler, sampling.
list(APPEND GANG_MODEL_SOURCES
  model/engine.c
  model/sample.c)
