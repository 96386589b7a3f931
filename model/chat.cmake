# Chat templates (the `chat_template` of tokenizer_config.json): a bounded interpreter of
# the Jinja subset real templates use, a library of its own so that tests and the fuzzer
# link it without the rest of gang_model.
add_library(gang_chat STATIC
  model/chat.c
  model/chat-lex.c
  model/chat-parse.c
  model/chat-value.c
  model/chat-ops.c
  model/chat-eval.c
  model/chat-exec.c
  model/chat-builtins.c
  model/chat-filters.c
  model/chat-strings.c)
target_include_directories(gang_chat PRIVATE model)
target_link_libraries(gang_chat PUBLIC gang_common PkgConfig::CJSON m)
