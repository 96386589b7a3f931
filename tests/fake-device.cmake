# The host/device boundary without a GPU: the engine, TP layers and pipeline on the "fake"
# kernels device (kernels/fake/), over the socket backend and over a device-memory
# communicator (unit/fake-comm.c) that counts the host synchronisations between each
# GEMM and its all-reduce. It reaches the fake device's counters (kernels/fake/) and the
# communicator vtable (parallel/comm-backend.h).
add_executable(test-fake-device unit/test-fake-device.c unit/fake-comm.c unit/engine-fixture.c
  unit/test-util.c)
target_include_directories(test-fake-device PRIVATE ${PROJECT_SOURCE_DIR}/engine
  ${PROJECT_SOURCE_DIR}/kernels ${PROJECT_SOURCE_DIR}/parallel)
target_link_libraries(test-fake-device PRIVATE gang_engine PkgConfig::CMOCKA m)
add_test(NAME unit-fake-device COMMAND test-fake-device)
set_tests_properties(unit-fake-device PROPERTIES TIMEOUT 300)

# A GGUF file's blocks on the device path (issue #27): the real Q4_1 file moved to the
# fake device as the file's blocks, the engine's logits there against the CPU backend's.
add_executable(test-fake-blocks unit/test-fake-blocks.c unit/engine-fixture.c unit/test-util.c)
target_include_directories(test-fake-blocks PRIVATE ${PROJECT_SOURCE_DIR}/engine)
target_link_libraries(test-fake-blocks PRIVATE gang_engine PkgConfig::CMOCKA m)
add_test(NAME unit-fake-blocks COMMAND test-fake-blocks)
set_tests_properties(unit-fake-blocks PROPERTIES TIMEOUT 300)

# P/D KV transfers on the device path (issue #26): the launcher's transport between a
# prefill and a decode engine on the fake device, over a pair of fake-comm.c that takes
# device buffers only; the same tokens as over TCP, and a failing pair falls back. The
# nccl pair's case needs 2 GPUs (skipped here, saying why).
add_executable(test-kv-pair unit/test-kv-pair.c unit/fake-comm.c unit/engine-fixture.c
  unit/test-util.c)
target_include_directories(test-kv-pair PRIVATE ${PROJECT_SOURCE_DIR}/engine
  ${PROJECT_SOURCE_DIR}/kernels ${PROJECT_SOURCE_DIR}/parallel ${PROJECT_SOURCE_DIR}/launcher)
target_link_libraries(test-kv-pair PRIVATE gang_launcher gang_engine PkgConfig::CMOCKA m)
add_test(NAME unit-kv-pair COMMAND test-kv-pair)
set_tests_properties(unit-kv-pair PROPERTIES TIMEOUT 120)

# The workers (`generate` runs a local gang of worker processes) on the fake device: the
# same greedy tokens as on the CPU (Llama 1x1 and TP 2 x PP 2, Gemma 3 TP 2).
add_test(NAME fake-generate
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/fake-generate.sh $<TARGET_FILE:ganglion>
          ${CMAKE_CURRENT_BINARY_DIR}/fake-generate)
set_tests_properties(fake-generate PROPERTIES TIMEOUT 300)

# `ganglion bench decode --device fake`: the --device cuda path of the benchmark (in-memory
# model packed into each storage and moved to the device, engine on device memory, TP=2
# over host staging) on the fake device, every storage's TP=2 agreeing with its 1x1 by the
# logits; the int8 summary must be there (every storage ran).
add_test(NAME bench-decode-fake
  COMMAND $<TARGET_FILE:ganglion> bench decode --device fake --layers 2 --hidden 64 --heads 4
          --kv-heads 2 --ffn 128 --vocab 128 --prompt 8 --tokens 4 --iters 1 --warmup 0
          --batch 1,3 --gpu-memory-mb 256 --dtypes f32,bf16,int8)
set_tests_properties(bench-decode-fake PROPERTIES TIMEOUT 120
  FAIL_REGULAR_EXPRESSION "\"logits_match_1x1\":false;\"error\";\"skipped\""
  PASS_REGULAR_EXPRESSION "\"storage\":\"int8\",\"batch1_roofline_ratio\"")

# The decode step's counters on the fake device (issue #24, tests/bench-decode-counters.py):
# every point's host_syncs_per_step <= 1, allocs_per_step 0, launches_per_step the same at
# batch 1, 8 and 32, host<->device bytes per step O(batch) and never a row of logits.
if(GANG_SYSTEM_PYTHON3)
  add_test(NAME bench-decode-fake-counters
    COMMAND ${GANG_SYSTEM_PYTHON3} -B ${CMAKE_CURRENT_SOURCE_DIR}/bench-decode-counters.py
            $<TARGET_FILE:ganglion>)
  set_tests_properties(bench-decode-fake-counters PROPERTIES TIMEOUT 120)
endif()

# --shape 8b chooses Llama-3-8B's defaults (bf16 storage, the 1x1 layout); the shape flags
# given here keep the model tiny, so the line shows the table's storage and layout defaults.
add_test(NAME bench-decode-fake-8b-defaults
  COMMAND $<TARGET_FILE:ganglion> bench decode --device fake --shape 8b --layers 1 --hidden 64
          --heads 4 --kv-heads 2 --ffn 128 --vocab 128 --prompt 4 --tokens 2 --iters 1
          --warmup 0 --batch 1 --gpu-memory-mb 256)
set_tests_properties(bench-decode-fake-8b-defaults PROPERTIES TIMEOUT 60
  FAIL_REGULAR_EXPRESSION "\"error\";\"skipped\";\"tp\":2"
  PASS_REGULAR_EXPRESSION "\"storage\":\"bf16\",\"shape\":\"8b\",\"tp\":1")

# bench/gpu-check.sh without a GPU: its syntax and a dry run (tests/gpu-check-dry-run.sh).
add_test(NAME gpu-check-dry-run
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/gpu-check-dry-run.sh
          ${PROJECT_SOURCE_DIR}/bench/gpu-check.sh ${CMAKE_BINARY_DIR}
          ${CMAKE_CURRENT_BINARY_DIR}/gpu-check-dry-run)
set_tests_properties(gpu-check-dry-run PROPERTIES TIMEOUT 60)

# bench/gpu-sanitize.sh (the device check's compute-sanitizer step) with a stand-in for the
# tool: its reading of the tools' summaries and its failures.
add_test(NAME gpu-sanitize-fake
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/gpu-sanitize-fake.sh
          ${PROJECT_SOURCE_DIR}/bench/gpu-sanitize.sh ${CMAKE_CURRENT_BINARY_DIR}/gpu-sanitize-fake)
set_tests_properties(gpu-sanitize-fake PROPERTIES TIMEOUT 60)

# The device bundle made from this build and rehearsed in a stripped environment: every
# library resolved in the bundle or the device image, NCCL/cuBLASLt through a Python
# environment, the preflight and the device check from the bundle (issue #24).
add_test(NAME gpu-bundle-rehearsal
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/gpu-bundle-rehearsal.sh ${PROJECT_SOURCE_DIR}
          ${CMAKE_BINARY_DIR} ${CMAKE_CURRENT_BINARY_DIR}/gpu-bundle-rehearsal)
set_tests_properties(gpu-bundle-rehearsal PROPERTIES TIMEOUT 120 SKIP_RETURN_CODE 77)

# bench/gpu-reference.py (the device check's comparison with transformers) run here on the
# CPU with the reference venv, on tiny models of the same two families: the script, the
# configs transformers must read, and the tolerance, checked before a device is lent.
add_test(NAME gpu-reference-cpu
  COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/gpu-reference-cpu.sh ${PROJECT_SOURCE_DIR}
          ${CMAKE_BINARY_DIR}/bin/ganglion ${CMAKE_CURRENT_BINARY_DIR}/gpu-reference-cpu)
set_tests_properties(gpu-reference-cpu PROPERTIES TIMEOUT 180 SKIP_RETURN_CODE 77)
