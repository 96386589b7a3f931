# The tokenizer (tokenizer.json: byte-level BPE, added tokens, TemplateProcessing),
# a library of its own so that tests and fuzzers link it without the rest of gang_model.
pkg_check_modules(PCRE2 REQUIRED IMPORTED_TARGET libpcre2-8)
add_library(gang_tokenizer STATIC
  model/tokenizer.c
  model/tok-load.c
  model/tok-bpe.c
  model/tok-pretok.c
  model/tok-norm.c
  model/tok-decode.c)
target_include_directories(gang_tokenizer PRIVATE model)
target_link_libraries(gang_tokenizer PUBLIC gang_common PkgConfig::CJSON PkgConfig::PCRE2)
