# The environment of every test in a sanitizer build (-DGANGLION_SANITIZE=...), and the
# check that no process of any test left a report.
#
# Included from the top CMakeLists.txt before the tests; gang_sanitize_tests() is called at
# the end of each folder that defines tests (the top one, for cmake/cuda.cmake's, and
# tests/), since a test's properties can only be set from its own folder. Without
# GANGLION_SANITIZE both do nothing.
#
# A report must fail CI even when the process that hit it was not the test itself: the
# multi-process tests run agents and workers that the gang restarts when one dies, so a
# worker stopped by AddressSanitizer can still leave a passing test. So every sanitizer
# writes its reports to files (log_path=build/sanitizer-reports/TEST.PID) rather than to
# stderr; the test `sanitizer-reports-clear` empties that folder before the tests and
# `sanitizer-reports` (a FIXTURES_CLEANUP of every test, so `ctest -L ...` runs it last)
# prints every report there and fails when there is one. A test's own process that hits a
# report still fails that test as well (the sanitizers' exit codes).
#
# Options: UBSan halts at its first report (the code is also built with
# -fno-sanitize-recover=undefined); ThreadSanitizer reports every race and fails at exit;
# the suppression files of tests/sanitizers/ give each suppressed report a one-line reason.
# An ENVIRONMENT a test already sets for one of these variables is kept and appended (its
# options win over these).
set(gang_san_dir ${CMAKE_BINARY_DIR}/sanitizer-reports)
set(gang_san_supp ${PROJECT_SOURCE_DIR}/tests/sanitizers)

# Sets test t's sanitizer variables (log files named for t), keeping what t set itself after
# ours, and makes t require the fixture whose cleanup checks the reports.
function(gang__san_env t)
  set(log "print_suppressions=0:log_path=${gang_san_dir}/${t}")
  set(vars
    "ASAN_OPTIONS=${log}:detect_leaks=1:detect_stack_use_after_return=1"
    "LSAN_OPTIONS=${log}:suppressions=${gang_san_supp}/lsan.supp"
    "UBSAN_OPTIONS=${log}:halt_on_error=1:print_stacktrace=1"
    "TSAN_OPTIONS=${log}:halt_on_error=0:second_deadlock_stack=1:suppressions=${gang_san_supp}/tsan.supp")
  get_test_property(${t} ENVIRONMENT own)
  if(NOT own)
    set(own)
  endif()
  set(env)
  foreach(v IN LISTS vars)
    string(REGEX REPLACE "=.*" "" name "${v}")
    set(merged "${v}")
    foreach(o IN LISTS own)
      if(o MATCHES "^${name}=(.*)")
        string(APPEND merged ":${CMAKE_MATCH_1}")
      endif()
    endforeach()
    list(APPEND env "${merged}")
  endforeach()
  foreach(o IN LISTS own)
    if(NOT o MATCHES "^(ASAN|LSAN|UBSAN|TSAN)_OPTIONS=")
      list(APPEND env "${o}")
    endif()
  endforeach()
  set_property(TEST ${t} PROPERTY ENVIRONMENT "${env}")
  set_property(TEST ${t} APPEND PROPERTY FIXTURES_REQUIRED sanitizer-reports)
endfunction()

# The sanitizer environment on every test defined so far in the calling folder.
function(gang_sanitize_tests)
  if(NOT GANGLION_SANITIZE)
    return()
  endif()
  get_property(tests DIRECTORY PROPERTY TESTS)
  foreach(t IN LISTS tests)
    if(NOT t MATCHES "^sanitizer-reports")
      gang__san_env(${t})
    endif()
  endforeach()
endfunction()

# The fixture: empty the reports folder first, check it last.
function(gang_sanitize_fixture)
  if(NOT GANGLION_SANITIZE)
    return()
  endif()
  find_package(Python3 REQUIRED COMPONENTS Interpreter)
  add_test(NAME sanitizer-reports-clear
    COMMAND ${Python3_EXECUTABLE} ${gang_san_supp}/reports.py clear ${gang_san_dir})
  add_test(NAME sanitizer-reports
    COMMAND ${Python3_EXECUTABLE} ${gang_san_supp}/reports.py check ${gang_san_dir})
  set_tests_properties(sanitizer-reports-clear PROPERTIES FIXTURES_SETUP sanitizer-reports
    LABELS sanitizer)
  set_tests_properties(sanitizer-reports PROPERTIES FIXTURES_CLEANUP sanitizer-reports
    LABELS sanitizer)
endfunction()
