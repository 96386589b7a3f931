# The examples of examples/, each smoke-run by tests/examples/run_example.py with the
# binary just built (the examples take it from $GANGLION): a local gang with an API key
# called with curl (401, text completion, chat, streamed chat), the Python client on the
# official `openai` package (including requests it must refuse), an mpirun launch
# (skipped, 77, without mpirun) and the StatefulSet overlay rendered with kubectl
# kustomize and checked Pod by Pod with `ganglion serve --check-config` (skipped, 77,
# without kubectl). local-gang and python-client serve a random model with SmolLM2's
# tokenizer files from scripts/fetch-reference.sh (and python-client runs on its Python);
# they are skipped, 77 with the reason, when that script fails. The TIMEOUT leaves room
# for a first fetch (up to 300 s). Ports are picked free at run time; a process left
# behind by an example fails its test.
find_package(Python3 REQUIRED COMPONENTS Interpreter)
foreach(example local-gang python-client mpirun kubernetes)
  add_test(NAME example-${example}
    COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_SOURCE_DIR}/examples/run_example.py
            --bin $<TARGET_FILE:ganglion> ${example})
  set_tests_properties(example-${example} PROPERTIES
    TIMEOUT 480 SKIP_RETURN_CODE 77 LABELS examples)
endforeach()
