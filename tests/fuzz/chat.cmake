# libFuzzer target of the chat-template interpreter (fuzz-chat.c): template sources and
# messages JSON. Included by tests/fuzz/CMakeLists.txt after its clang probe: like
# fuzz-wire, it reports SKIP (exit 77) with the reason when clang cannot build it.
#
#   ctest -R fuzz-chat            15 s of fuzzing from the seeds written here
if(fuzz_why)
  add_test(NAME fuzz-chat COMMAND sh -c "echo \"fuzz-chat skipped: $1\"; exit 77" sh
                                        "${fuzz_why}")
  set_tests_properties(fuzz-chat PROPERTIES SKIP_RETURN_CODE 77 LABELS fuzz)
  return()
endif()

set(CHATFUZZ_BIN ${CMAKE_CURRENT_BINARY_DIR}/fuzz-chat)
set(CHATFUZZ_SEEDS ${CMAKE_CURRENT_BINARY_DIR}/chat-corpus)
set(CHATFUZZ_WORK ${CMAKE_CURRENT_BINARY_DIR}/chat-corpus-work)
set(CHATFUZZ_SOURCES
  ${PROJECT_SOURCE_DIR}/text/chat.c
  ${PROJECT_SOURCE_DIR}/text/chat-lex.c
  ${PROJECT_SOURCE_DIR}/text/chat-parse.c
  ${PROJECT_SOURCE_DIR}/text/chat-value.c
  ${PROJECT_SOURCE_DIR}/text/chat-ops.c
  ${PROJECT_SOURCE_DIR}/text/chat-eval.c
  ${PROJECT_SOURCE_DIR}/text/chat-exec.c
  ${PROJECT_SOURCE_DIR}/text/chat-builtins.c
  ${PROJECT_SOURCE_DIR}/text/chat-filters.c
  ${PROJECT_SOURCE_DIR}/text/chat-strings.c)
file(MAKE_DIRECTORY ${CHATFUZZ_WORK} ${CHATFUZZ_SEEDS})
file(WRITE ${CHATFUZZ_SEEDS}/chatml
  "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
  "{{ '<|im_start|>system\\nYou are helpful<|im_end|>\\n' }}{% endif %}{{'<|im_start|>' + "
  "message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}"
  "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
file(WRITE ${CHATFUZZ_SEEDS}/llama
  "{{- bos_token }}\n{%- if messages[0]['role'] == 'system' %}\n"
  "    {%- set system_message = messages[0]['content']|trim %}\n"
  "    {%- set messages = messages[1:] %}\n{%- else %}{%- set system_message = '' %}{%- endif %}\n"
  "{%- set ns = namespace(n=0) %}{%- for message in messages %}{%- set ns.n = ns.n + 1 %}\n"
  "{%- if 'tool_calls' in message %}{{- message.tool_calls[0].function.arguments | tojson(indent=4) }}"
  "{%- elif message.content is string %}{{- message['role'] + ': ' + message['content'] | trim }}"
  "{%- else %}{{- message.content | map(attribute='text') | join(', ') }}{%- endif %}"
  "{%- if not loop.last %}{{ '\\n' }}{% endif %}{%- endfor %}{{ ns.n ~ system_message[::-1] }}")
file(WRITE ${CHATFUZZ_SEEDS}/macro
  "{% macro m(a, b='x') %}{{ a|upper }}{{ b.split(',')|length }}{% endmacro %}"
  "{{ m('q') }}{{ m(b='1,2', a='z') }}{% for i in range(3) if i is odd %}{{ loop.index }}"
  "{% break %}{% endfor %}{{ raise_exception('no') if false else 'ok' }}")

add_custom_command(OUTPUT ${CHATFUZZ_BIN}
  COMMAND ${GANG_FUZZ_CLANG} ${FUZZ_CFLAGS} ${FUZZ_SANITIZE} -I${PROJECT_SOURCE_DIR}/text
          ${CMAKE_CURRENT_SOURCE_DIR}/fuzz-chat.c ${CHATFUZZ_SOURCES}
          -lcjson -lm -o ${CHATFUZZ_BIN}
  DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/fuzz-chat.c ${CHATFUZZ_SOURCES}
          ${PROJECT_SOURCE_DIR}/text/chat-internal.h ${PROJECT_SOURCE_DIR}/include/ganglion/text.h
  COMMENT "Building libFuzzer target fuzz-chat with clang"
  VERBATIM)
add_custom_target(build-fuzz-chat ALL DEPENDS ${CHATFUZZ_BIN})

add_test(NAME fuzz-chat
  COMMAND ${CHATFUZZ_BIN} -max_total_time=15 -rss_limit_mb=2048 -max_len=16384 -timeout=10
          -dict=${CMAKE_CURRENT_SOURCE_DIR}/chat.dict
          -artifact_prefix=${CMAKE_CURRENT_BINARY_DIR}/chat- ${CHATFUZZ_WORK} ${CHATFUZZ_SEEDS})
set_tests_properties(fuzz-chat PROPERTIES TIMEOUT 120 LABELS fuzz)
