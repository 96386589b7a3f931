# Generation-engine sources of gang_model: step loop, scheduler and plan, stages, sampling.
list(APPEND GANG_MODEL_SOURCES
  model/engine.c
  model/engine-plan.c
  model/engine-run.c
  model/engine-setup.c
  model/sample.c
  model/device.c)
