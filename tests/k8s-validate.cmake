# Kubernetes manifests: kustomize render + schema validation + serve --check-config.
#
# tests/k8s/validate.py renders k8s/base and every k8s/overlays/* with `kubectl kustomize`,
# validates each object against a current Kubernetes version's schemas
# (kubernetes-validate; the LeaderWorkerSet CRD against tests/k8s/schemas/), checks the
# gang wiring, and runs every simulated Pod's rendered command line and environment
# through `ganglion serve --check-config` with a model made by `ganglion mkmodel`.
# It exits 77 (skipped, with the reason printed) only when kubectl or kubernetes-validate
# is missing; scripts/install-k8s-tools.sh (run by scripts/install-deps.sh) installs them.
find_package(Python3 REQUIRED COMPONENTS Interpreter)
add_test(NAME k8s-validate
  COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_SOURCE_DIR}/k8s/validate.py
          --bin $<TARGET_FILE:ganglion>
          --k8s ${CMAKE_CURRENT_SOURCE_DIR}/../k8s)
set_tests_properties(k8s-validate PROPERTIES
  TIMEOUT 300 SKIP_RETURN_CODE 77 LABELS k8s)
