# Generation engine: batched TP layers, KV cache, decode, sampling, TP x PP equivalence.
# The test reaches the engine's internals (engine/engine-internal.h) for logits and plans.
add_executable(test-engine unit/test-engine.c unit/test-engine-gen.c unit/engine-fixture.c
  unit/test-util.c)
target_include_directories(test-engine PRIVATE ${PROJECT_SOURCE_DIR}/engine)
target_link_libraries(test-engine PRIVATE gang_engine PkgConfig::CMOCKA m)
add_test(NAME unit-engine COMMAND test-engine)
set_tests_properties(unit-engine PROPERTIES TIMEOUT 300)

# The independent numpy reference: `ganglion mkmodel` makes small models (llama with GQA,
# qwen2 with biases, tied embeddings, bf16 in shards, mistral in f16), model-logits runs
# the engine on each, tests/reference/reference.py recomputes the logits in float64 with
# its own safetensors parser and asserts agreement within 1e-4. numpy comes from the
# Debian package python3-numpy, so the system interpreter is preferred over a pyenv one.
add_executable(model-logits reference/model-logits.c)
target_include_directories(model-logits PRIVATE ${PROJECT_SOURCE_DIR}/engine)
target_link_libraries(model-logits PRIVATE gang_engine m)
find_program(GANG_SYSTEM_PYTHON3 python3 PATHS /usr/bin NO_DEFAULT_PATH)
if(NOT GANG_SYSTEM_PYTHON3)
  find_program(GANG_SYSTEM_PYTHON3 python3)
endif()
if(GANG_SYSTEM_PYTHON3)
  add_test(NAME reference-logits
    COMMAND ${GANG_SYSTEM_PYTHON3} ${CMAKE_CURRENT_SOURCE_DIR}/reference/reference.py check
            --ganglion $<TARGET_FILE:ganglion> --tool $<TARGET_FILE:model-logits>
            --workdir ${CMAKE_CURRENT_BINARY_DIR}/reference-models)
  set_tests_properties(reference-logits PROPERTIES TIMEOUT 300 SKIP_RETURN_CODE 77)
endif()

# `ganglion bench decode` on a tiny model: every layout measured, and agreeing with 1x1 by
# the logits (a token flip only at a near-tie of 1x1, bench/decode-agree.h).
add_test(NAME bench-decode-smoke
  COMMAND $<TARGET_FILE:ganglion> bench decode --layers 2 --hidden 64 --heads 4 --kv-heads 2
          --ffn 128 --vocab 128 --prompt 8 --tokens 4 --iters 1 --warmup 0 --batch 1,3)
set_tests_properties(bench-decode-smoke PROPERTIES TIMEOUT 120
  FAIL_REGULAR_EXPRESSION "\"logits_match_1x1\":false;\"error\"")

# `ganglion bench moe` on a tiny MoE shape (issue #25): EP 1 and 2 measured, EP 2 (with TP 2,
# and with TP 1: --replicated) agreeing with EP 1 by the logits, the moe lines printed, the
# all-to-all lines without the MPI peer.
add_test(NAME bench-moe-smoke
  COMMAND $<TARGET_FILE:ganglion> bench moe --layers 2 --hidden 64 --heads 4 --kv-heads 2
          --head-dim 16 --experts 8 --top-k 2 --moe-ffn 32 --vocab 128 --prompt 4 --tokens 4
          --iters 1 --warmup 0 --batch 1,3 --ep 1,2 --no-peer --replicated)
set_tests_properties(bench-moe-smoke PROPERTIES TIMEOUT 120
  FAIL_REGULAR_EXPRESSION "\"logits_match_1x1\":false;\"error\"")

# `ganglion bench decode --model` on a tiny model (tests/bench-decode-model.py): the model
# info, read bandwidth, points and roofline per storage (or a clean "refused" line), the
# layouts' agreement, the transformers peer path through a fake peer script
# (tests/fake-hf-decode.py: ok, failing, hanging), a missing reference Python, usage errors.
if(GANG_SYSTEM_PYTHON3)
  add_test(NAME bench-decode-model
    COMMAND ${GANG_SYSTEM_PYTHON3} -B ${CMAKE_CURRENT_SOURCE_DIR}/bench-decode-model.py
            $<TARGET_FILE:ganglion>)
  set_tests_properties(bench-decode-model PROPERTIES TIMEOUT 120)
endif()
