# Model I/O: config.json, safetensors validation (corrupted fixtures), sharded loading, mkmodel,
# and the peak resident memory of one rank's load (forked children).
add_executable(test-model
  unit/test-model.c
  unit/model/fixtures.c
  unit/model/test-corrupt.c
  unit/model/test-rss.c)
target_include_directories(test-model PRIVATE unit/model)
target_link_libraries(test-model PRIVATE gang_model PkgConfig::CMOCKA PkgConfig::CJSON m)
add_test(NAME unit-model COMMAND test-model)
set_tests_properties(unit-model PROPERTIES TIMEOUT 300)

# `ganglion mkmodel` end to end: summary, determinism, sharded files, usage errors exit 2.
add_test(NAME cli-mkmodel
  COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/unit/model/cli-mkmodel.sh $<TARGET_FILE:ganglion>)
