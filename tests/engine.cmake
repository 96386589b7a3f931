# Generation engine: batched TP layers, KV cache, decode, sampling, TP x PP equivalence.
add_executable(test-engine unit/test-engine.c)
target_link_libraries(test-engine PRIVATE gang_model PkgConfig::CMOCKA m)
add_test(NAME unit-engine COMMAND test-engine)
set_tests_properties(unit-engine PROPERTIES TIMEOUT 300)
