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

# Data-parallel replicas behind `ganglion router` (tests/k8s-sim/dp_sim.py, issue #26): two
# or three 2-Pod gangs, a router Pod on --replicas-dns of a headless Service of every gang's
# Pod 0; gang a's Pod 0 killed under load (no call lost or wrong), a third gang added while
# serving (the router follows DNS); P/D: a decode gang's Pod 0 killed mid-stream (the
# stream resumes on the other decode gang with the healthy tokens). Same lock, skip and
# time rules as the scenarios above.
foreach(sc dp-kill-pod0 dp-scale pd-kill-decode)
  add_test(NAME k8s-sim-${sc}
    COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_SOURCE_DIR}/k8s-sim/dp_sim.py
            --bin $<TARGET_FILE:ganglion> --scenario ${sc})
  set_tests_properties(k8s-sim-${sc} PROPERTIES
    TIMEOUT 240 SKIP_RETURN_CODE 77 RUN_SERIAL TRUE LABELS "k8s-sim")
endforeach()
