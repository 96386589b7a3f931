# CUDA kernels, the NCCL backend and their tests (GANG_HAVE_CUDA).
#
# Included from the top CMakeLists.txt after the libraries exist and before tests/. All
# CUDA and NCCL build logic lives here so that a build with GANGLION_CUDA=OFF (or without
# nvcc) never sees it: the registries (kernels/backend.c, parallel/comm-registry.c) then
# keep their GANG_ENOSYS stubs.
#
# What it adds when nvcc is found:
#  - gang_kernels: kernels/cuda/*.c (host side: device pool, cuBLASLt GEMM, device query;
#    plain C compiled by the C compiler against the CUDA runtime headers) and
#    kernels/cuda/*.cu (the CUDA kernels, nvcc, sm_90 only); GANG_HAVE_CUDA_KERNELS=1.
#  - gang_parallel: parallel/comm-nccl.c whenever nccl.h is found (the toolkit, the system,
#    or the nvidia-nccl-cu13 wheel); GANG_HAVE_NCCL=1.
#  - the CUDA runtime is linked statically (CUDA::cudart_static): it loads libcuda.so.1
#    itself at run time, so the binary starts, and `ganglion info` answers, on nodes
#    without a driver. cuBLAS/cuBLASLt and NCCL are NOT linked: kernels/cuda/cuda-blas.c
#    and parallel/comm-nccl.c dlopen them when a "cuda" handle or an nccl communicator is
#    first created, so every CUDA-free process (the agent, CPU workers, `ganglion info`)
#    starts fast and also on nodes that lack these libraries. Where they are looked for is
#    common/dynlib.c's order (flag, Python environment, loader, build-time directory).
#  - tests: test-cuda (unit-cuda), test-cuda-step (unit-cuda-step: the decode step's
#    kernels), test-cuda-blocks (unit-cuda-blocks: GGUF block weights), test-cuda-trace
#    (unit-cuda-trace: kernel traces through CUPTI), test-engine-cuda (unit-engine-cuda) and
#    test-comm-nccl (unit-comm-nccl); they skip visibly when no GPU is present.

set(GANG_HAVE_CUDA_KERNELS 0)
set(GANG_HAVE_NCCL 0)
option(GANGLION_CUDA_EMU "Build the CUDA kernels for the CPU emulator of tests/cuda-emu/ (a build of its own: make cuda-emu)" OFF)
if(NOT GANG_HAVE_CUDA)
  return()
endif()

# The top-level add_compile_options() are gcc's C flags (-Wstrict-prototypes, -fsanitize=...)
# that nvcc, and C++ for the emulator, do not take. Targets copy the directory's options
# when they are created, so this rewrites a target's list: every option applies to C only,
# and sources of language lang get the options after it (CUDA: host code through
# -Xcompiler, device code through nvcc).
function(gang_c_only_options target lang)
  get_target_property(opts ${target} COMPILE_OPTIONS)
  set(fixed)
  if(opts)
    foreach(opt IN LISTS opts)
      list(APPEND fixed "$<$<COMPILE_LANGUAGE:C>:${opt}>")
    endforeach()
  endif()
  foreach(opt IN LISTS ARGN)
    list(APPEND fixed "$<$<COMPILE_LANGUAGE:${lang}>:${opt}>")
  endforeach()
  set_property(TARGET ${target} PROPERTY COMPILE_OPTIONS "${fixed}")
endfunction()

# The CUDA backend's sources, the same in both builds: host C (pool, cuBLASLt, device
# query, the backend) and the .cu kernels (nvcc's, or rewritten for the emulator).
set(gang_cuda_host_sources kernels/cuda/cuda-backend.c kernels/cuda/cuda-pool.c
  kernels/cuda/cuda-mem.c kernels/cuda/cuda-blas.c kernels/cuda/cuda-gemm.c
  kernels/cuda/cuda-device.c kernels/cuda/cuda-trace.c)
set(gang_cuda_kernel_sources kernels/cuda/cuda-ops.cu kernels/cuda/cuda-attention.cu
  kernels/cuda/cuda-matmul.cu kernels/cuda/cuda-qmatmul.cu kernels/cuda/cuda-step.cu)

if(GANGLION_CUDA_EMU)
  # The kernels run on the CPU emulator (tests/cuda-emu/): no nvcc, no CUDA runtime, no
  # NCCL; the same kernel and backend sources, the same tests.
  include(cmake/cuda-emu.cmake)
else()
  if(NOT DEFINED CMAKE_CUDA_COMPILER)
    set(CMAKE_CUDA_COMPILER ${NVCC})
  endif()
  # The target is one H200: compile for sm_90 only, which also keeps nvcc fast in CI.
  if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
    set(CMAKE_CUDA_ARCHITECTURES 90)
  endif()
  set(CMAKE_CUDA_STANDARD 17)
  set(CMAKE_CUDA_STANDARD_REQUIRED ON)
  enable_language(CUDA)
  find_package(CUDAToolkit REQUIRED)
  # Targets created before enable_language(CUDA) did not pick CMAKE_CUDA_ARCHITECTURES up.
  get_property(gang_early_targets DIRECTORY ${CMAKE_SOURCE_DIR} PROPERTY BUILDSYSTEM_TARGETS)
  foreach(t IN LISTS gang_early_targets)
    set_property(TARGET ${t} PROPERTY CUDA_ARCHITECTURES ${CMAKE_CUDA_ARCHITECTURES})
  endforeach()

  # --- kernels ----------------------------------------------------------------------
  target_sources(gang_kernels PRIVATE ${gang_cuda_host_sources} ${gang_cuda_kernel_sources})
  set(gang_cuda_warn -Xcompiler=-Wall,-Wextra)
  if(GANGLION_WERROR)
    list(APPEND gang_cuda_warn -Werror=all-warnings)
  endif()
  gang_c_only_options(gang_kernels CUDA ${gang_cuda_warn})
  target_compile_definitions(gang_kernels PRIVATE GANG_HAVE_CUDA_KERNELS=1
    GANG_CUDA_LIBDIR="${CUDAToolkit_LIBRARY_DIR}")
  target_link_libraries(gang_kernels PUBLIC CUDA::cudart_static ${CMAKE_DL_LIBS})
  set(GANG_HAVE_CUDA_KERNELS 1)

  # The PTX of the decode step's streaming kernels (the GEMV, the step attention; the
  # norms and the sampler; the block weights' GEMV), for tests/ptx-loads.py: their weight
  # and KV loads must stay 16-byte loads (ptxas -v does not show byte loads; 08e3041 had
  # turned them into sixteen each, unnoticed); for tests/sass-loads.py (their loads in
  # flight); for tests/ptx-pdl.py (nothing but read-only loads before a PDL wait); and, all
  # five files, for tests/kernel-resources.py (every launch fits a multiprocessor).
  add_library(gang_kernels_ptx OBJECT ${gang_cuda_kernel_sources})
  set_target_properties(gang_kernels_ptx PROPERTIES CUDA_PTX_COMPILATION ON
    CUDA_ARCHITECTURES 90-virtual)
  target_include_directories(gang_kernels_ptx PRIVATE
    $<TARGET_PROPERTY:gang_kernels,INCLUDE_DIRECTORIES>)
  target_compile_definitions(gang_kernels_ptx PRIVATE GANG_HAVE_CUDA_KERNELS=1)
  gang_c_only_options(gang_kernels_ptx CUDA ${gang_cuda_warn})

endif()

# --- NCCL ----------------------------------------------------------------------------
# In both builds (on the emulator libnccl.so.2 is tests/cuda-emu/emu-nccl.cpp, in the
# emulator's library directory, which is then the build-time directory the search ends
# with). Only the header is needed to build: libnccl is dlopen'ed at run time (common/dynlib.c's
# search). The header comes from GANGLION_NCCL_INCLUDE_DIR, else the toolkit or the system
# package (nccl.h beside cuda.h or in /usr/include), else the pip wheel nvidia-nccl-cu13 in
# a Python environment (site-packages/nvidia/nccl/include; scripts/install-deps.sh puts it
# into the reference venv). The library's directory, when one is found here, is compiled
# in as the last place the run-time search looks.
set(GANGLION_NCCL_INCLUDE_DIR "" CACHE PATH "directory holding nccl.h (empty = search)")
set(gang_nccl_hints ${GANGLION_NCCL_INCLUDE_DIR} ${CUDAToolkit_INCLUDE_DIRS} /usr/local/cuda/include)
foreach(py IN ITEMS /opt/ganglion-ref-venv/bin/python3 python3)
  execute_process(COMMAND ${py} -c
    "import importlib.util as u; s = u.find_spec('nvidia.nccl'); print(list(s.submodule_search_locations)[0])"
    OUTPUT_VARIABLE gang_nccl_pydir OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET
    RESULT_VARIABLE gang_nccl_pyrc TIMEOUT 20)
  if(gang_nccl_pyrc EQUAL 0 AND gang_nccl_pydir)
    list(APPEND gang_nccl_hints ${gang_nccl_pydir}/include)
  endif()
endforeach()
find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${gang_nccl_hints})
find_library(NCCL_LIBRARY NAMES nccl libnccl.so.2 HINTS ${CUDAToolkit_LIBRARY_DIR} /usr/local/cuda/lib64)
if(NCCL_INCLUDE_DIR AND GANGLION_CUDA_EMU)
  gang_emu_nccl(${NCCL_INCLUDE_DIR})
  set(GANG_HAVE_NCCL 1)
  target_sources(gang_parallel PRIVATE parallel/comm-nccl.c)
  target_include_directories(gang_parallel PRIVATE ${NCCL_INCLUDE_DIR})
  target_compile_definitions(gang_parallel PRIVATE GANG_HAVE_NCCL=1
    GANG_NCCL_LIBDIR="${GANG_CUDA_EMU_LIBDIR}")
  target_link_libraries(gang_parallel PUBLIC gang_cuda_emu ${CMAKE_DL_LIBS})
  add_dependencies(gang_parallel gang_nccl_emu)
  message(STATUS "ganglion: NCCL backend built on the emulator's libnccl.so.2 (${GANG_CUDA_EMU_LIBDIR})")
elseif(NCCL_INCLUDE_DIR)
  set(GANG_HAVE_NCCL 1)
  target_sources(gang_parallel PRIVATE parallel/comm-nccl.c)
  target_include_directories(gang_parallel PRIVATE ${NCCL_INCLUDE_DIR})
  set(gang_nccl_libdir "")
  if(NCCL_LIBRARY)
    get_filename_component(gang_nccl_libdir ${NCCL_LIBRARY} DIRECTORY)
  endif()
  target_compile_definitions(gang_parallel PRIVATE GANG_HAVE_NCCL=1
    GANG_NCCL_LIBDIR="${gang_nccl_libdir}")
  target_link_libraries(gang_parallel PUBLIC CUDA::cudart_static ${CMAKE_DL_LIBS})
  message(STATUS "ganglion: NCCL backend built (header ${NCCL_INCLUDE_DIR}; library found "
                 "at run time, build-time copy: ${NCCL_LIBRARY})")
else()
  message(STATUS "ganglion: nccl.h not found (toolkit, system, Python's nvidia.nccl): the nccl "
                 "backend stays a GANG_ENOSYS stub; set GANGLION_NCCL_INCLUDE_DIR")
endif()

# --- tests -----------------------------------------------------------------------------
# Defined here rather than in tests/CMakeLists.txt so that the GPU tests exist exactly when
# their sources are built. Both skip (cmocka skip(), printed reason) without a GPU.
enable_testing()
pkg_check_modules(CMOCKA REQUIRED IMPORTED_TARGET cmocka)
add_executable(test-cuda tests/unit/test-cuda.c tests/unit/mlp-chain.c)
target_link_libraries(test-cuda PRIVATE gang_kernels PkgConfig::CMOCKA m)
add_test(NAME unit-cuda COMMAND test-cuda)
set_tests_properties(unit-cuda PROPERTIES TIMEOUT 300 LABELS unit)
if(NOT GANGLION_CUDA_EMU)
  find_package(Python3 REQUIRED COMPONENTS Interpreter)
  add_test(NAME ptx-loads
    COMMAND ${Python3_EXECUTABLE} -B ${PROJECT_SOURCE_DIR}/tests/ptx-loads.py
            $<TARGET_OBJECTS:gang_kernels_ptx>
    COMMAND_EXPAND_LISTS)
  set_tests_properties(ptx-loads PROPERTIES TIMEOUT 60 LABELS unit)
  # A kernel launched as a programmatic dependent (--cuda-pdl) touches only what no kernel
  # writes before its wait, on every path of its PTX (which the emulator, running a
  # stream's kernels in order, cannot show); the check's own cases first.
  add_test(NAME ptx-pdl
    COMMAND ${Python3_EXECUTABLE} -B ${PROJECT_SOURCE_DIR}/tests/ptx-pdl.py
            $<TARGET_OBJECTS:gang_kernels_ptx>
    COMMAND_EXPAND_LISTS)
  add_test(NAME ptx-pdl-selftest
    COMMAND ${Python3_EXECUTABLE} -B ${PROJECT_SOURCE_DIR}/tests/ptx-pdl.py --selftest)
  set_tests_properties(ptx-pdl ptx-pdl-selftest PROPERTIES TIMEOUT 60 LABELS unit)
  # The same PTX assembled for sm_90 and read as SASS (nvdisasm from PyPI,
  # scripts/fetch-nvdisasm.sh): the decode GEMV's weight loads stay in flight GEMV_PRE at a
  # time, the norms' and the sampler's 8 a round, which only the machine code shows.
  get_filename_component(gang_cuda_bindir ${CMAKE_CUDA_COMPILER} DIRECTORY)
  add_test(NAME sass-loads
    COMMAND ${Python3_EXECUTABLE} -B ${PROJECT_SOURCE_DIR}/tests/sass-loads.py
            --ptxas ${gang_cuda_bindir}/ptxas
            --fetch ${PROJECT_SOURCE_DIR}/scripts/fetch-nvdisasm.sh
            $<TARGET_OBJECTS:gang_kernels_ptx>
    COMMAND_EXPAND_LISTS)
  set_tests_properties(sass-loads PROPERTIES TIMEOUT 120 LABELS unit SKIP_RETURN_CODE 77)
  # Registers x threads, shared memory and __launch_bounds__ of every launch against what
  # an sm_90 multiprocessor has (ptxas -v on the same PTX): "too many resources requested
  # for launch" is the device's answer, which neither the emulator nor the fake device gives.
  add_test(NAME kernel-resources
    COMMAND ${Python3_EXECUTABLE} -B ${PROJECT_SOURCE_DIR}/tests/kernel-resources.py
            --ptxas ${gang_cuda_bindir}/ptxas --src ${PROJECT_SOURCE_DIR}/kernels/cuda
            $<TARGET_OBJECTS:gang_kernels_ptx>
    COMMAND_EXPAND_LISTS)
  add_test(NAME kernel-resources-selftest
    COMMAND ${Python3_EXECUTABLE} -B ${PROJECT_SOURCE_DIR}/tests/kernel-resources.py --selftest)
  set_tests_properties(kernel-resources kernel-resources-selftest PROPERTIES TIMEOUT 60
    LABELS unit)
endif()

# Kernel traces through CUPTI (a binary of its own: CUPTI is enabled once per process).
add_executable(test-cuda-trace tests/unit/test-cuda-trace.c)
target_link_libraries(test-cuda-trace PRIVATE gang_kernels PkgConfig::CMOCKA)
add_test(NAME unit-cuda-trace COMMAND test-cuda-trace)
set_tests_properties(unit-cuda-trace PROPERTIES TIMEOUT 120 LABELS unit)
add_executable(test-cuda-step tests/unit/test-cuda-step.c)
target_link_libraries(test-cuda-step PRIVATE gang_kernels PkgConfig::CMOCKA m)
add_test(NAME unit-cuda-step COMMAND test-cuda-step)
set_tests_properties(unit-cuda-step PROPERTIES TIMEOUT 300 LABELS unit)

# The block weights of GGUF files on the GPU (issue #27): every block type against the
# dequantize-then-double reference (a binary of its own: test-cuda.c is at the file limit).
add_executable(test-cuda-blocks tests/unit/test-cuda-blocks.c tests/unit/blocks-fixture.c
  tests/unit/mlp-chain.c)
target_link_libraries(test-cuda-blocks PRIVATE gang_kernels PkgConfig::CMOCKA m)
add_test(NAME unit-cuda-blocks COMMAND test-cuda-blocks)
set_tests_properties(unit-cuda-blocks PROPERTIES TIMEOUT 300 LABELS unit)

# The engine on "cuda" against the CPU backend (shares the CPU engine tests' fixture).
add_executable(test-engine-cuda tests/unit/test-engine-cuda.c tests/unit/engine-fixture.c
  tests/unit/test-util.c)
target_include_directories(test-engine-cuda PRIVATE ${PROJECT_SOURCE_DIR}/engine)
target_link_libraries(test-engine-cuda PRIVATE gang_engine PkgConfig::CMOCKA m)
add_test(NAME unit-engine-cuda COMMAND test-engine-cuda)
set_tests_properties(unit-engine-cuda PROPERTIES TIMEOUT 300 LABELS unit)

if(GANG_HAVE_NCCL)
  add_executable(test-comm-nccl tests/unit/test-comm-nccl.c)
  target_link_libraries(test-comm-nccl PRIVATE gang_parallel gang_kernels PkgConfig::CMOCKA)
  add_test(NAME unit-comm-nccl COMMAND test-comm-nccl)
  set_tests_properties(unit-comm-nccl PROPERTIES TIMEOUT 300 LABELS unit)
endif()

# On the emulator the GPU tests run rather than skip: the emulated cuBLAS is found by the
# backend's ordinary search (GANGLION_CUDA_LIBRARY_DIR), and a test that says it found no
# GPU fails. unit-cuda-lt-fallback runs test-cuda again with the emulated cuBLASLt refusing
# the first algorithm of every plan, so every product goes through the backend's fallback
# to the next one. test-cuda-emu tests the emulator itself. The kernels' own tests (and the
# engine's) run with the backend's pool split (GANGLION_GPU_POOL_SPLIT=1: every tensor its
# own cudaMalloc, which the emulator puts between guard pages), so that an access past a
# tensor stops the test rather than reading its neighbour in the pool; the lag, delay and
# fallback runs keep the one pool, so both are exercised.
if(GANGLION_CUDA_EMU)
  set(gang_emu_env "GANGLION_CUDA_LIBRARY_DIR=${GANG_CUDA_EMU_LIBDIR};GANGLION_NCCL_LIBRARY=${GANG_CUDA_EMU_LIBDIR}")
  set(gang_emu_split "GANGLION_GPU_POOL_SPLIT=1")
  add_test(NAME unit-cuda-lt-fallback COMMAND test-cuda)
  set_tests_properties(unit-cuda-step unit-cuda-blocks PROPERTIES
    ENVIRONMENT "${gang_emu_env};${gang_emu_split}")
  # test-cuda opens a second handle beside its fixture's 2 GiB pool (test_gpu_gemv_pdl)
  set_tests_properties(unit-cuda PROPERTIES
    ENVIRONMENT "${gang_emu_env};${gang_emu_split};GANG_EMU_MEMORY_MB=4096")
  # The engine over nccl TP / PP groups and the communicator's own tests on the NCCL
  # emulator (tests/cuda-emu/emu-nccl.cpp: ranks as threads, one emulated GPU each), and
  # the P/D pair's KV transfers over NCCL: the multi-GPU cases that skip on one GPU.
  set_tests_properties(unit-engine-cuda PROPERTIES
    ENVIRONMENT "${gang_emu_env};${gang_emu_split};GANG_EMU_DEVICES=4")
  if(GANG_HAVE_NCCL)
    # The same engine cases with every NCCL operation carried out 2 ms after its last rank
    # posted it (GANG_EMU_NCCL_DELAY_US): a missing event wait shows on every rank.
    add_test(NAME engine-cuda-nccl-delay COMMAND test-engine-cuda)
    set_tests_properties(engine-cuda-nccl-delay PROPERTIES LABELS cuda-emu TIMEOUT 600
      ENVIRONMENT "${gang_emu_env};GANG_EMU_DEVICES=4;GANG_EMU_NCCL_DELAY_US=2000"
      FAIL_REGULAR_EXPRESSION "no GPU;SKIP")
    # The engine's cases and the decode step's kernels with the device running 300 us
    # behind the host (GANG_EMU_LAG_US: every stream's work deferred, as on a GPU): the
    # host reusing a pinned upload's buffer too early, or reading a result before its
    # synchronisation, shows (the first stops the process, naming the bytes).
    add_test(NAME engine-cuda-lag COMMAND test-engine-cuda)
    add_test(NAME cuda-step-lag COMMAND test-cuda-step)
    set_tests_properties(engine-cuda-lag cuda-step-lag PROPERTIES LABELS cuda-emu TIMEOUT 600
      ENVIRONMENT "${gang_emu_env};GANG_EMU_DEVICES=4;GANG_EMU_LAG_US=300"
      FAIL_REGULAR_EXPRESSION "no GPU;SKIP")
    add_test(NAME kv-pair-nccl-emu COMMAND $<TARGET_FILE:test-kv-pair>)
    # RUN_SERIAL: alone while run-emu.sh runs the others two at a time (their deadlines
    # are measured: init 700 ms, a settle's 300 ms)
    set_tests_properties(unit-comm-nccl kv-pair-nccl-emu PROPERTIES LABELS cuda-emu TIMEOUT 300
      ENVIRONMENT "${gang_emu_env};GANG_EMU_DEVICES=2" RUN_SERIAL TRUE
      FAIL_REGULAR_EXPRESSION "needs [0-9]+ GPU;failed here;SKIP:")
  endif()
  set_tests_properties(unit-cuda-lt-fallback PROPERTIES
    ENVIRONMENT "${gang_emu_env};GANG_EMU_LT_REFUSE_FIRST=1;GANG_EMU_MEMORY_MB=4096")
  set_tests_properties(unit-cuda unit-cuda-step unit-cuda-blocks unit-cuda-lt-fallback
    PROPERTIES LABELS cuda-emu TIMEOUT 900 FAIL_REGULAR_EXPRESSION "no GPU")
  set_tests_properties(unit-engine-cuda PROPERTIES LABELS cuda-emu TIMEOUT 900
    FAIL_REGULAR_EXPRESSION "no GPU;SKIP")
  # Kernel traces on the emulated CUPTI: reporting lost records, and refusing to enable.
  add_test(NAME unit-cuda-trace-unavailable COMMAND test-cuda-trace)
  set_tests_properties(unit-cuda-trace PROPERTIES
    ENVIRONMENT "${gang_emu_env};GANG_EMU_CUPTI_DROP=2")
  set_tests_properties(unit-cuda-trace-unavailable PROPERTIES
    ENVIRONMENT "${gang_emu_env};GANG_EMU_CUPTI_FAIL=enable")
  set_tests_properties(unit-cuda-trace unit-cuda-trace-unavailable PROPERTIES LABELS cuda-emu
    TIMEOUT 120 FAIL_REGULAR_EXPRESSION "no GPU;SKIP")

  gang_emu_rewrite(tests/cuda-emu/test-cuda-emu.cu gang_emu_selftest)
  add_executable(test-cuda-emu ${gang_emu_selftest})
  gang_c_only_options(test-cuda-emu CXX ${gang_emu_cxx_warn})
  target_link_libraries(test-cuda-emu PRIVATE gang_cuda_emu PkgConfig::CMOCKA)
  target_include_directories(test-cuda-emu PRIVATE ${PROJECT_SOURCE_DIR}/kernels/cuda
    ${PROJECT_SOURCE_DIR}/include)
  add_test(NAME unit-cuda-emu COMMAND test-cuda-emu)
  set_tests_properties(unit-cuda-emu PROPERTIES LABELS cuda-emu TIMEOUT 120)

  # The decode step of `ganglion bench decode --device cuda` on the emulated device: the
  # real backend's counters (its graphs, its one host sync per step) held to the design
  # as the fake device's are (tests/bench-decode-counters.py). The 1 GiB copy-bandwidth
  # buffers need a device of more than 2 GiB (mapped lazily).
  add_test(NAME bench-decode-cuda-counters
    COMMAND ${Python3_EXECUTABLE} -B ${PROJECT_SOURCE_DIR}/tests/bench-decode-counters.py
            $<TARGET_FILE:ganglion> cuda)
  set_tests_properties(bench-decode-cuda-counters PROPERTIES LABELS cuda-emu TIMEOUT 600
    ENVIRONMENT "${gang_emu_env};GANG_EMU_MEMORY_MB=8192;GANG_EMU_DEVICES=2")

  # The device check's bench decode steps, each with its own flags on a tiny shape, run by
  # bench/gpu-check.sh itself on the emulator (a flag combination the device would refuse
  # fails here first).
  add_test(NAME gpu-check-emu
    COMMAND bash ${PROJECT_SOURCE_DIR}/tests/gpu-check-emu.sh
            ${PROJECT_SOURCE_DIR}/bench/gpu-check.sh ${CMAKE_BINARY_DIR}
            ${CMAKE_BINARY_DIR}/gpu-check-emu)
  set_tests_properties(gpu-check-emu PROPERTIES LABELS cuda-emu TIMEOUT 600
    ENVIRONMENT "${gang_emu_env};GANG_EMU_MEMORY_MB=8192;GANG_EMU_DEVICES=2")

  # serve --device cuda on the emulated GPU (1x1, and TP=2 as two workers sharing it;
  # then TP=2 over NCCL as two worker processes on two emulated GPUs) against transformers
  # on the CPU: bench/gpu-reference.py, as the device check runs it on the H200
  # (tests/gpu-reference-cpu.sh; skips, 77, without the reference venv).
  add_test(NAME gpu-reference-emu
    COMMAND sh ${PROJECT_SOURCE_DIR}/tests/gpu-reference-cpu.sh ${PROJECT_SOURCE_DIR}
            $<TARGET_FILE:ganglion> ${CMAKE_BINARY_DIR}/gpu-reference-emu cuda)
  set_tests_properties(gpu-reference-emu PROPERTIES LABELS cuda-emu TIMEOUT 300
    SKIP_RETURN_CODE 77 ENVIRONMENT "${gang_emu_env}")

  # The MoE step of the device check (bench/gpu-moe-check.sh): Qwen3- and Qwen2-MoE tiny
  # models on --device cuda, EP x TP 1x1 and 2x2 (two ranks over sockets), the CPU's
  # tokens; its NCCL cases (EP 2 over NCCL: the all-to-alls between the two workers'
  # processes, one emulated GPU each) must run here.
  add_test(NAME moe-cuda-emu
    COMMAND bash ${PROJECT_SOURCE_DIR}/bench/gpu-moe-check.sh $<TARGET_FILE:ganglion>
            ${CMAKE_BINARY_DIR}/moe-cuda-emu)
  set_tests_properties(moe-cuda-emu PROPERTIES LABELS cuda-emu TIMEOUT 300
    ENVIRONMENT "${gang_emu_env};GANG_EMU_DEVICES=2"
    FAIL_REGULAR_EXPRESSION "\"match_cpu\":false;\"run\":false")
  # A rank killed inside the MoE all-to-all over NCCL (tests/mp/test_moe_kill.py with
  # GANG_MP_MOE_NCCL=1): one node of two worker processes on two emulated GPUs; the gang
  # re-forms its NCCL communicators and the request in flight gets the healthy gang's
  # tokens, killing the peer of the process that made the unique id, then that process.
  add_test(NAME moe-kill-nccl-emu
    COMMAND ${Python3_EXECUTABLE} ${PROJECT_SOURCE_DIR}/tests/mp/test_moe_kill.py
            --bin $<TARGET_FILE:ganglion>)
  set_tests_properties(moe-kill-nccl-emu PROPERTIES LABELS cuda-emu TIMEOUT 240 RUN_SERIAL TRUE
    ENVIRONMENT "${gang_emu_env};GANG_EMU_DEVICES=2;GANG_MP_MOE_NCCL=1")
  # A worker stopped (SIGSTOP) in the middle of a request, its TP group over NCCL: the
  # process that made the unique id hangs, the gang re-forms from a new id and the request
  # ends with the healthy gang's tokens (tests/cuda-emu/nccl-hang.py).
  add_test(NAME nccl-hang-emu
    COMMAND ${Python3_EXECUTABLE} ${PROJECT_SOURCE_DIR}/tests/cuda-emu/nccl-hang.py
            --bin $<TARGET_FILE:ganglion>)
  set_tests_properties(nccl-hang-emu PROPERTIES LABELS cuda-emu TIMEOUT 240 RUN_SERIAL TRUE
    ENVIRONMENT "${gang_emu_env};GANG_EMU_DEVICES=2")
  # P/D: a prefill and a decode gang (TP 2 each over NCCL, on two emulated hosts) behind a
  # router, the KV blocks moved GPU to GPU over the NCCL pair between their worker
  # processes, also after a prefill worker died (tests/cuda-emu/pd-nccl.py).
  add_test(NAME pd-nccl-emu
    COMMAND ${Python3_EXECUTABLE} ${PROJECT_SOURCE_DIR}/tests/cuda-emu/pd-nccl.py
            --bin $<TARGET_FILE:ganglion>)
  set_tests_properties(pd-nccl-emu PROPERTIES LABELS cuda-emu TIMEOUT 240 RUN_SERIAL TRUE
    ENVIRONMENT "${gang_emu_env};GANG_EMU_DEVICES=2")
  # The gang as Kubernetes Pods (tests/k8s-sim/: network namespaces, the cluster's DNS)
  # over NCCL: TP 2 inside each of 3 Pods and PP 3 across them, each worker on its own
  # emulated GPU, the communicators formed across the Pods from rank 0's unique id (the
  # NCCL emulator over TCP); a worker killed; Pod 0 recreated with a new IP (the process
  # that made the id gone); Pod 0 killed with 6 streams in flight through the other Pods
  # (every one ends with the healthy gang's tokens). Skip (77) where network namespaces
  # are not permitted.
  foreach(sc kill-worker recreate-pod kill-coordinator)
    add_test(NAME k8s-sim-nccl-emu-${sc}
      COMMAND ${Python3_EXECUTABLE} ${PROJECT_SOURCE_DIR}/tests/k8s-sim/k8s_sim.py
              --bin $<TARGET_FILE:ganglion> --scenario ${sc})
    set_tests_properties(k8s-sim-nccl-emu-${sc} PROPERTIES LABELS cuda-emu TIMEOUT 200
      SKIP_RETURN_CODE 77 RUN_SERIAL TRUE
      ENVIRONMENT "${gang_emu_env};GANG_EMU_DEVICES=2;GANG_SIM_NCCL=1")
  endforeach()
  # A GGUF file's blocks, and a tiny Gemma 3 (GeGLU), served on the CUDA backend: the
  # CPU's tokens (tests/cuda-emu/generate-vs-cpu.sh; the GGUF case skips, 77, without the
  # SmolLM2 file).
  add_test(NAME gguf-cuda-emu
    COMMAND bash ${PROJECT_SOURCE_DIR}/tests/cuda-emu/generate-vs-cpu.sh $<TARGET_FILE:ganglion>
            gguf)
  add_test(NAME gemma3-cuda-emu
    COMMAND bash ${PROJECT_SOURCE_DIR}/tests/cuda-emu/generate-vs-cpu.sh $<TARGET_FILE:ganglion>
            gemma3 ${CMAKE_BINARY_DIR}/gemma3-cuda-emu)
  set_tests_properties(gguf-cuda-emu gemma3-cuda-emu PROPERTIES LABELS cuda-emu TIMEOUT 300
    SKIP_RETURN_CODE 77 ENVIRONMENT "${gang_emu_env}")

  # What `make cuda-emu` builds: the emulated GPU tests and what they load.
  add_custom_target(cuda-emu-tests DEPENDS test-cuda test-cuda-step test-cuda-blocks
    test-cuda-trace test-engine-cuda test-cuda-emu gang_cublas_emu gang_cupti_emu ganglion)
  if(GANG_HAVE_NCCL)
    add_dependencies(cuda-emu-tests test-comm-nccl test-kv-pair gang_nccl_emu)
  endif()
endif()
