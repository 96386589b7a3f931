# GGUF files: header refusals, dequantization of every type, a tiny hand-written model
# (config, q/k order, TP shards), tokenizer and chat template from metadata.
add_executable(test-gguf
  unit/model/test-gguf.c
  unit/model/fixtures.c)
target_include_directories(test-gguf PRIVATE unit/model ${PROJECT_SOURCE_DIR}/model)
target_link_libraries(test-gguf PRIVATE gang_model gang_rendezvous PkgConfig::CMOCKA PkgConfig::CJSON m)
add_test(NAME unit-model-gguf COMMAND test-gguf)
set_tests_properties(unit-model-gguf PROPERTIES TIMEOUT 60)

# Dequantization against the gguf package (tests/unit/model/gguf-ref.py), with the Python
# of scripts/fetch-reference.sh; SKIP (77) with the reason when it cannot be had.
add_test(NAME unit-model-gguf-ref
  COMMAND sh -c "py=$(timeout 60 bash \"$1\" python 2>/dev/null | tail -1) && [ -x \"$py\" ] || { echo \"SKIP: scripts/fetch-reference.sh python failed (run it once, or scripts/install-deps.sh)\"; exit 77; }; exec \"$py\" \"$2\" \"$3\""
          sh ${PROJECT_SOURCE_DIR}/scripts/fetch-reference.sh
          ${CMAKE_CURRENT_SOURCE_DIR}/unit/model/gguf-ref.py $<TARGET_FILE:test-gguf>)
set_tests_properties(unit-model-gguf-ref PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 120)

# The blocks mapped (issue #27): equal to the --no-mmap read, resident memory within the
# file + 64 MiB as file pages, a file cut short refused; on the real SmolLM2 Q4_1 file
# (skip() saying why when it is absent).
add_executable(test-gguf-mmap
  unit/model/test-gguf-mmap.c
  unit/model/fixtures.c)
target_include_directories(test-gguf-mmap PRIVATE unit/model ${PROJECT_SOURCE_DIR}/model
  ${PROJECT_SOURCE_DIR}/kernels ${OPENBLAS_INCLUDE_DIRS})
target_link_libraries(test-gguf-mmap PRIVATE gang_model gang_kernels gang_rendezvous PkgConfig::CMOCKA PkgConfig::CJSON m)
add_test(NAME unit-model-gguf-mmap COMMAND test-gguf-mmap)
set_tests_properties(unit-model-gguf-mmap PROPERTIES TIMEOUT 120)
