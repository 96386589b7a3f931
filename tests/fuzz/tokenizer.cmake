# libFuzzer target of the tokenizer: tokenizer.json loading and encode/decode round trips
# (fuzz-tokenizer.c). Included by tests/fuzz/CMakeLists.txt after its clang probe: like
# fuzz-wire, it reports SKIP (exit 77) with the reason when clang cannot build it.
#
#   ctest -R fuzz-tokenizer       15 s of fuzzing from the seeds written here
if(fuzz_why)
  add_test(NAME fuzz-tokenizer COMMAND sh -c "echo \"fuzz-tokenizer skipped: $1\"; exit 77" sh
                                            "${fuzz_why}")
  set_tests_properties(fuzz-tokenizer PROPERTIES SKIP_RETURN_CODE 77 LABELS fuzz)
  return()
endif()

set(TOKFUZZ_BIN ${CMAKE_CURRENT_BINARY_DIR}/fuzz-tokenizer)
set(TOKFUZZ_SEEDS ${CMAKE_CURRENT_BINARY_DIR}/tok-corpus)
set(TOKFUZZ_WORK ${CMAKE_CURRENT_BINARY_DIR}/tok-corpus-work)
set(TOKFUZZ_SOURCES
  ${PROJECT_SOURCE_DIR}/text/tokenizer.c
  ${PROJECT_SOURCE_DIR}/text/tok-load.c
  ${PROJECT_SOURCE_DIR}/text/tok-bpe.c
  ${PROJECT_SOURCE_DIR}/text/tok-pretok.c
  ${PROJECT_SOURCE_DIR}/text/tok-norm.c
  ${PROJECT_SOURCE_DIR}/text/tok-decode.c)
file(MAKE_DIRECTORY ${TOKFUZZ_WORK} ${TOKFUZZ_SEEDS})
file(WRITE ${TOKFUZZ_SEEDS}/text "Hello 123 <|s|> wörld 😀  \n\tabc abcab 1212")
file(WRITE ${TOKFUZZ_SEEDS}/json
  "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1,\"ab\":2},\"merges\":[\"a b\"]},"
  "\"added_tokens\":[{\"id\":3,\"content\":\"<|s|>\",\"special\":true,\"lstrip\":true}],"
  "\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":{\"Regex\":\"\\\\s+\"},"
  "\"behavior\":\"MergedWithNext\"},\"decoder\":{\"type\":\"ByteLevel\"},"
  "\"post_processor\":{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":"
  "{\"id\":\"<|s|>\"}},{\"Sequence\":{\"id\":\"A\"}}],\"special_tokens\":{\"<|s|>\":"
  "{\"ids\":[3]}}}}")

add_custom_command(OUTPUT ${TOKFUZZ_BIN}
  COMMAND ${GANG_FUZZ_CLANG} ${FUZZ_CFLAGS} ${FUZZ_SANITIZE} -I${PROJECT_SOURCE_DIR}/text
          ${CMAKE_CURRENT_SOURCE_DIR}/fuzz-tokenizer.c ${TOKFUZZ_SOURCES}
          -lpcre2-8 -lcjson -o ${TOKFUZZ_BIN}
  DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/fuzz-tokenizer.c ${TOKFUZZ_SOURCES}
          ${PROJECT_SOURCE_DIR}/text/tok-internal.h ${PROJECT_SOURCE_DIR}/include/ganglion/text.h
  COMMENT "Building libFuzzer target fuzz-tokenizer with clang"
  VERBATIM)
add_custom_target(build-fuzz-tokenizer ALL DEPENDS ${TOKFUZZ_BIN})

add_test(NAME fuzz-tokenizer
  COMMAND ${TOKFUZZ_BIN} -max_total_time=15 -rss_limit_mb=2048 -max_len=65536
          -artifact_prefix=${CMAKE_CURRENT_BINARY_DIR}/tok- ${TOKFUZZ_WORK} ${TOKFUZZ_SEEDS})
set_tests_properties(fuzz-tokenizer PROPERTIES TIMEOUT 120 LABELS fuzz)
