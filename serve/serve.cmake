# serve/: the HTTP server (probes, chunked streaming) and client, the OpenAI-compatible API
# (parse, queue, answer, text), the metrics renderers. A libuv loop's code: the agent owns
# the loop and plugs a transport into the API's submit hook (launcher/api-fwd.c forwards
# from a member's agent to the coordinator's).
add_library(gang_serve STATIC
  serve/http.c
  serve/http-stream.c
  serve/http-client.c
  serve/metrics.c
  serve/api.c
  serve/api-parse.c
  serve/api-format.c
  serve/api-tools.c
  serve/api-out.c
  serve/api-text.c
  serve/api-chat.c
  serve/api-prep.c)
target_include_directories(gang_serve PRIVATE serve ${HTTP_PARSER_INCLUDE})
target_link_libraries(gang_serve PUBLIC gang_text gang_engine gang_common PkgConfig::UV PkgConfig::CJSON
  ${HTTP_PARSER_LIB} m)
