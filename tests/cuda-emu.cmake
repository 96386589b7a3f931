# The GPU tests on the CUDA emulator (tests/cuda-emu/, issue #24) as one test of `make
# test`: tests/cuda-emu/run-emu.sh builds the emulator's configuration in a folder of this
# build (cuda-emu/, the same sources with GANGLION_CUDA_EMU=ON) and runs its tests labelled
# cuda-emu: test-cuda, test-cuda-step, test-cuda-blocks, test-cuda-trace (on the emulated
# CUPTI) and test-engine-cuda (its NCCL
# layouts on emulated GPUs), test-comm-nccl and test-kv-pair's NCCL pair on the device
# code nvcc compiles (there they run instead of skipping), the cuBLASLt fallback, the
# emulator's own test, the engine and the step's kernels with the device lagging the host
# (GANG_EMU_LAG_US), the decode step's counters of the real backend, and the gang's
# NCCL paths between processes (serve, MoE, P/D, k8s-sim Pods; docs/gpu.md). Only in a CUDA
# build without sanitizers (the emulator's fibers switch stacks behind ASAN's back) and not
# inside the emulator's own build.
if(GANG_HAVE_CUDA_KERNELS AND NOT GANGLION_CUDA_EMU AND NOT GANGLION_SANITIZE)
  if(GANGLION_WERROR)
    set(gang_emu_werror ON)
  else()
    set(gang_emu_werror OFF)
  endif()
  add_test(NAME cuda-emu
    COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/cuda-emu/run-emu.sh ${PROJECT_SOURCE_DIR}
            ${CMAKE_BINARY_DIR}/cuda-emu ${gang_emu_werror})
  set_tests_properties(cuda-emu PROPERTIES TIMEOUT 900)
endif()
