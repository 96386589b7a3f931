# The examples of examples/, each smoke-run by tests/examples/run_example.py with the
# binary just built (the examples take it from $GANGLION): a local gang called with curl,
# the Python client (including a request it must refuse), an mpirun launch (skipped, 77,
# without mpirun) and the StatefulSet overlay rendered with kubectl kustomize and checked
# Pod by Pod with `ganglion serve --check-config` (skipped, 77, without kubectl). Ports are
# picked free at run time; a process left behind by an example fails its test.
find_package(Python3 REQUIRED COMPONENTS Interpreter)
foreach(example local-gang python-client mpirun kubernetes)
  add_test(NAME example-${example}
    COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_SOURCE_DIR}/examples/run_example.py
            --bin $<TARGET_FILE:ganglion> ${example})
  set_tests_properties(example-${example} PROPERTIES
    TIMEOUT 240 SKIP_RETURN_CODE 77 LABELS examples)
endforeach()
