# Model I/O: config.json, safetensors validation (corrupted fixtures), sharded loading, mkmodel.
add_executable(test-model unit/test-model.c)
target_link_libraries(test-model PRIVATE gang_model PkgConfig::CMOCKA m)
add_test(NAME unit-model COMMAND test-model)
