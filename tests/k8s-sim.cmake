# Kubernetes simulation: Pods as network namespaces, dnsmasq DNS, a kubelet-like prober.
#
# One CTest per scenario of tests/k8s-sim/k8s_sim.py (see tests/k8s-sim/README.md). Each
# brings a 3-Pod StatefulSet up on its own bridge, injects one fault and asserts that the
# gang serves a new generation and answers POST /v1/completions again (kill-coordinator:
# that 16 streams through the other Pods survive the death of Pod 0). They need root and
# `ip netns` (they exit 77, a visible skip, where network namespaces are not permitted),
# share one subnet and bridge (RUN_SERIAL; runs from other build trees wait on a lock),
# and each fails itself after 120 s, well inside the TIMEOUT below.
find_package(Python3 REQUIRED COMPONENTS Interpreter)
set(K8S_SIM_SCENARIOS start-order kill-worker recreate-pod freeze-agent partition update
    kill-coordinator)
foreach(sc ${K8S_SIM_SCENARIOS})
  add_test(NAME k8s-sim-${sc}
    COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_SOURCE_DIR}/k8s-sim/k8s_sim.py
            --bin $<TARGET_FILE:ganglion> --scenario ${sc})
  set_tests_properties(k8s-sim-${sc} PROPERTIES
    TIMEOUT 200 SKIP_RETURN_CODE 77 RUN_SERIAL TRUE LABELS "k8s-sim")
endforeach()
