# engine/: the generation engine over one rank's shard: step loop, scheduler and plan,
# paged KV cache, stages, sampling (include/ganglion/engine.h).
add_library(gang_engine STATIC
  engine/engine.c
  engine/engine-sched.c
  engine/engine-kv.c
  engine/engine-events.c
  engine/engine-wire.c
  engine/engine-xfer.c
  engine/engine-request.c
  engine/engine-run.c
  engine/engine-device.c
  engine/engine-setup.c
  engine/sample.c
  engine/sample-vocab.c)
target_include_directories(gang_engine PRIVATE engine)
target_link_libraries(gang_engine PUBLIC gang_model gang_parallel gang_text m)
