# GGUF files: header refusals, dequantization of every type, a tiny hand-written model
# (config, q/k order, TP shards), tokenizer and chat template from metadata.
add_executable(test-gguf
  unit/model/test-gguf.c
  unit/model/fixtures.c)
target_include_directories(test-gguf PRIVATE unit/model ${PROJECT_SOURCE_DIR}/model)
target_link_libraries(test-gguf PRIVATE gang_model gang_chat PkgConfig::CMOCKA PkgConfig::CJSON m)
add_test(NAME unit-model-gguf COMMAND test-gguf)
set_tests_properties(unit-model-gguf PROPERTIES TIMEOUT 60)
