# Labels that choose the tests of the sanitizer jobs (make sanitize, run by .ci/run after
# make test; cmake/sanitize.cmake). Included last by tests/CMakeLists.txt, so every test
# exists; a test renamed or removed fails the configure step here, which keeps this list
# true. `ctest -L unit` etc. run a group in any build.
#
#   unit      the cmocka binary of every module and the small CLI checks       ASAN+UBSAN
#   mp-fast   the multi-process scenarios that run in seconds: gang forming,
#             failures and restarts, the API and its forwarding, hostile input  ASAN+UBSAN
#   threads   the tests that start threads: the CPU kernel pool (and OpenBLAS),
#             the communicators' rank threads (and the expert-parallel exchange of
#             unit-parallel), the pipeline and the engine,
#             the HTTP server's loop thread (unit-serve), the spawner's
#             children of libuv (unit-launcher), GPU health watching (also in an
#             agent, on the fake NVML), libuv's resolver pool, the workers' step
#             and loader threads (fake device, generate, and the scenarios that
#             serve, cancel, time out, kill and restart workers with a model)   TSAN
#
# Left out of mp-fast (each runs 10-90 s under ASAN; `make test` runs them all): the real
# models' greedy agreement (gemma3_gguf, gguf_smollm2, gguf_blocks, smollm2_greedy, rope_models,
# moe_models, weight_storage), kv_capacity, serve_load, soak_restarts, text_api, structured_outputs
# (SmolLM2 at TP 1 and PP 2: 110 s without a sanitizer) and seeded_batch (SmolLM2 bf16 and
# Q4_1 in batches of 61: 106 s without a sanitizer).
set(GANG_UNIT_TESTS unit-common unit-bench unit-gpu unit-rendezvous unit-serve
  unit-launcher unit-kernels unit-kernels-blocks unit-kernels-trace unit-cuda-qblocks unit-parallel unit-comm unit-layers unit-pipeline unit-model
  cli-mkmodel unit-model-gguf unit-model-gguf-ref unit-model-gguf-mmap unit-engine unit-fake-device unit-fake-blocks unit-text
  unit-router)
if(GANG_HAVE_MPI)
  list(APPEND GANG_UNIT_TESTS mpi-comm mpi-pipeline)
endif()
list(APPEND GANG_UNIT_TESTS unit-kv-pair) # P/D's device path on the fake device (issue #26)
set_property(TEST ${GANG_UNIT_TESTS} APPEND PROPERTY LABELS unit)

set(GANG_MP_FAST bad_frames bad_model bench_smoke cancel cli dp_local dp_router flood front_door
  pd_router pd_layouts
  gang_forms
  gpu_health gpu_placement hang_worker kill_agent kill_coordinator kill_worker member_flood
  openai_client reject request_deadline restart_budget serve_model shm_hygiene
  stale_generation start_order api_surface slow_clients moe_kill budget_node0
  tokenize_off_loop)
list(TRANSFORM GANG_MP_FAST PREPEND mp-test_)
set_property(TEST ${GANG_MP_FAST} APPEND PROPERTY LABELS mp-fast)

set(GANG_THREAD_TESTS unit-kernels unit-kernels-blocks unit-comm unit-parallel unit-layers unit-pipeline unit-engine
  unit-fake-device unit-fake-blocks unit-kv-pair unit-serve unit-launcher unit-gpu unit-rendezvous fake-generate
  bench-decode-fake
  mp-test_serve_model mp-test_cancel mp-test_request_deadline mp-test_kill_worker
  mp-test_gpu_health mp-test_soak_restarts)
set_property(TEST ${GANG_THREAD_TESTS} APPEND PROPERTY LABELS threads)
