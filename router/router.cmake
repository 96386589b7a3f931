# router/: data-parallel replicas behind one front door (`ganglion router`): the routing
# policy (pure: block hashes, per-replica LRU, load) and the process (HTTP front door on
# serve/'s server, forwarding, polling the replicas).
add_library(gang_router STATIC
  router/policy.c
  router/proxy.c
  router/stream.c
  router/discover.c
  router/router.c)
target_include_directories(gang_router PRIVATE router ${HTTP_PARSER_INCLUDE})
target_link_libraries(gang_router PUBLIC gang_serve gang_text gang_engine gang_common
  PkgConfig::UV PkgConfig::CJSON ${HTTP_PARSER_LIB} m)
