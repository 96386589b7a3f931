# Repository checks (docs/design.md section 5): the structure rules and clang-format.
#
# structure-check      scripts/check-structure.py on the source tree: files over 1,000 lines,
#                      functions over 120 lines outside tests/, bench* files under launcher/,
#                      references to files outside the repository, includes against the
#                      layering of the modules, gang_* names in comments and docs that the
#                      code does not have (scripts/check_rules.py); it lists every offender.
# format-check         scripts/check-format.py: every .c/.h/.cu equals its clang-format form
#                      (`make format` rewrites them); skipped (77) without clang-format.
# *-selftest           each checker on a fixture tree with one offender of every kind, so
#                      that a checker that can no longer fail is caught.
find_package(Python3 REQUIRED COMPONENTS Interpreter)
set(GANG_REPO_ROOT ${CMAKE_CURRENT_SOURCE_DIR}/..)
add_test(NAME structure-check
  COMMAND ${Python3_EXECUTABLE} ${GANG_REPO_ROOT}/scripts/check-structure.py
          --root ${GANG_REPO_ROOT})
add_test(NAME structure-check-selftest
  COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_SOURCE_DIR}/structure/test_checks.py structure)
add_test(NAME format-check
  COMMAND ${Python3_EXECUTABLE} ${GANG_REPO_ROOT}/scripts/check-format.py
          --root ${GANG_REPO_ROOT})
add_test(NAME format-check-selftest
  COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_SOURCE_DIR}/structure/test_checks.py format)
set_tests_properties(structure-check structure-check-selftest format-check
  format-check-selftest PROPERTIES TIMEOUT 120 SKIP_RETURN_CODE 77 LABELS structure)
