# The host/device boundary without a GPU: the engine, TP layers and pipeline on the "fake"
# kernels device (kernels/fake/), over the socket backend and over a device-memory
# communicator (unit/fake-comm.c) that counts the host synchronisations between each
# GEMM and its all-reduce. It reaches the fake device's counters (kernels/fake/) and the
# communicator vtable (parallel/comm-backend.h).
add_executable(test-fake-device unit/test-fake-device.c unit/fake-comm.c unit/engine-fixture.c
  unit/test-util.c)
target_include_directories(test-fake-device PRIVATE ${PROJECT_SOURCE_DIR}/model
  ${PROJECT_SOURCE_DIR}/kernels ${PROJECT_SOURCE_DIR}/parallel)
target_link_libraries(test-fake-device PRIVATE gang_model PkgConfig::CMOCKA m)
add_test(NAME unit-fake-device COMMAND test-fake-device)
set_tests_properties(unit-fake-device PROPERTIES TIMEOUT 300)
