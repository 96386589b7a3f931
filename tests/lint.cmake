# Linters of the scripts (scripts/check-lint.py, which lists the files it checks):
#
# shell-lint    shellcheck on every shell script (*.sh, *.bash, sh/bash shebangs such as
#               .ci/run), with .shellcheckrc; skipped (77) without shellcheck.
# python-lint   flake8 on every Python file (*.py, python shebangs), with .flake8; skipped
#               (77) without flake8.
# Both tools are Debian packages installed by scripts/install-deps.sh.
find_package(Python3 REQUIRED COMPONENTS Interpreter)
foreach(kind shell python)
  add_test(NAME ${kind}-lint
    COMMAND ${Python3_EXECUTABLE} ${PROJECT_SOURCE_DIR}/scripts/check-lint.py ${kind}
            --root ${PROJECT_SOURCE_DIR})
  set_tests_properties(${kind}-lint PROPERTIES TIMEOUT 120 SKIP_RETURN_CODE 77 LABELS lint)
endforeach()
