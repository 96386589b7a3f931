# text/: the tokenizer (tokenizer.json: byte-level BPE, SentencePiece-style chains, added
# tokens, TemplateProcessing) and the chat-template interpreter (the bounded Jinja subset of
# tokenizer_config.json's chat_template). On common/ only, so that the tests, the fuzzers
# and the agent's API link it without the data plane (include/ganglion/text.h).
pkg_check_modules(PCRE2 REQUIRED IMPORTED_TARGET libpcre2-8)
add_library(gang_text STATIC
  text/tokenizer.c
  text/tok-load.c
  text/tok-bpe.c
  text/tok-pretok.c
  text/tok-norm.c
  text/tok-decode.c
  text/chat.c
  text/chat-lex.c
  text/chat-parse.c
  text/chat-value.c
  text/chat-ops.c
  text/chat-eval.c
  text/chat-exec.c
  text/chat-builtins.c
  text/chat-filters.c
  text/chat-strings.c
  text/jgram-compile.c
  text/jgram-match.c
  text/jgram-vocab.c)
target_include_directories(gang_text PRIVATE text)
target_link_libraries(gang_text PUBLIC gang_common PkgConfig::CJSON PkgConfig::PCRE2 m)
