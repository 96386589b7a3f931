# The CUDA kernels on the CPU emulator (tests/cuda-emu/, issue #24): included by
# cmake/cuda.cmake in place of its nvcc build when GANGLION_CUDA_EMU is ON. A build of its
# own (`make cuda-emu`: build-emu/), never the main one: there the kernels are nvcc's.
#
#  - each kernels/cuda/*.cu is rewritten by tests/cuda-emu/rewrite-launch.py (its <<<>>>
#    launches into gang_emu_launch calls) and compiled as host C++ with emu-kernel.h
#    force-included; the backend's .c files are compiled as in the real build, against the
#    toolkit's headers;
#  - gang_cuda_emu (shared: emu-runtime.cpp) stands in for the CUDA runtime;
#  - libcublasLt.so.13 / libcublas.so.13 (emu-cublas.cpp) in ${CMAKE_BINARY_DIR}/cuda-emu-lib
#    stand in for cuBLAS; the backend finds them through GANGLION_CUDA_LIBRARY_DIR, its
#    ordinary run-time search;
#  - libnccl.so.2 (emu-nccl.cpp) in the same directory, for the nccl backend, which
#    cmake/cuda.cmake builds against the toolkit's nccl.h as in the real build (ranks as
#    threads of one process, on GANG_EMU_DEVICES emulated devices).
enable_language(CXX)
set(CMAKE_CXX_STANDARD 17)
set(CMAKE_CXX_STANDARD_REQUIRED ON)
find_package(CUDAToolkit REQUIRED)
find_package(Python3 REQUIRED COMPONENTS Interpreter)

set(gang_emu_dir ${PROJECT_SOURCE_DIR}/tests/cuda-emu)
set(GANG_CUDA_EMU_LIBDIR ${CMAKE_BINARY_DIR}/cuda-emu-lib)

# C++'s warnings for the emulator's sources, without the unknown pragmas (#pragma unroll is
# nvcc's); the directory's gcc options stay C's (gang_c_only_options, cmake/cuda.cmake).
set(gang_emu_cxx_warn -Wall -Wextra -Wno-unknown-pragmas)
if(GANGLION_WERROR)
  list(APPEND gang_emu_cxx_warn -Werror)
endif()

add_library(gang_cuda_emu SHARED ${gang_emu_dir}/emu-runtime.cpp)
target_include_directories(gang_cuda_emu PUBLIC ${gang_emu_dir})
target_include_directories(gang_cuda_emu SYSTEM PUBLIC ${CUDAToolkit_INCLUDE_DIRS})
gang_c_only_options(gang_cuda_emu CXX ${gang_emu_cxx_warn})
target_link_libraries(gang_cuda_emu PUBLIC Threads::Threads)

add_library(gang_cublas_emu SHARED ${gang_emu_dir}/emu-cublas.cpp)
gang_c_only_options(gang_cublas_emu CXX ${gang_emu_cxx_warn})
target_link_libraries(gang_cublas_emu PRIVATE gang_cuda_emu)
set_target_properties(gang_cublas_emu PROPERTIES LIBRARY_OUTPUT_DIRECTORY ${GANG_CUDA_EMU_LIBDIR}
  OUTPUT_NAME cublasLt NO_SONAME ON SUFFIX ".so.13")
add_custom_command(TARGET gang_cublas_emu POST_BUILD
  COMMAND ${CMAKE_COMMAND} -E copy $<TARGET_FILE:gang_cublas_emu> ${GANG_CUDA_EMU_LIBDIR}/libcublas.so.13
  COMMENT "cuda-emu: libcublas.so.13 beside libcublasLt.so.13")

# Rewrites the launches of the .cu file cu (a path under the source tree) into
# cuda-emu-src/NAME.cpp of the build, compiled with emu-kernel.h force-included; the .cpp's
# path in out_var.
# The emulated CUPTI (kernel traces), found by the same search as cuBLAS.
add_library(gang_cupti_emu SHARED ${gang_emu_dir}/emu-cupti.cpp)
gang_c_only_options(gang_cupti_emu CXX ${gang_emu_cxx_warn})
target_link_libraries(gang_cupti_emu PRIVATE gang_cuda_emu)
set_target_properties(gang_cupti_emu PROPERTIES LIBRARY_OUTPUT_DIRECTORY ${GANG_CUDA_EMU_LIBDIR}
  OUTPUT_NAME cupti NO_SONAME ON SUFFIX ".so.13")

function(gang_emu_rewrite cu out_var)
  get_filename_component(k ${cu} NAME_WE)
  set(out ${CMAKE_BINARY_DIR}/cuda-emu-src/${k}.cpp)
  add_custom_command(OUTPUT ${out}
    COMMAND ${Python3_EXECUTABLE} ${gang_emu_dir}/rewrite-launch.py ${PROJECT_SOURCE_DIR}/${cu}
            ${out}
    DEPENDS ${PROJECT_SOURCE_DIR}/${cu} ${gang_emu_dir}/rewrite-launch.py
    COMMENT "cuda-emu: rewriting the launches of ${k}.cu")
  set_source_files_properties(${out} PROPERTIES
    COMPILE_OPTIONS "-include;${gang_emu_dir}/emu-kernel.h")
  set(${out_var} ${out} PARENT_SCOPE)
endfunction()

set(gang_emu_kernel_sources)
foreach(cu IN LISTS gang_cuda_kernel_sources)
  gang_emu_rewrite(${cu} out)
  list(APPEND gang_emu_kernel_sources ${out})
endforeach()
set_source_files_properties(${gang_emu_kernel_sources} PROPERTIES
  INCLUDE_DIRECTORIES "${PROJECT_SOURCE_DIR}/kernels/cuda;${PROJECT_SOURCE_DIR}/kernels")

# Under AddressSanitizer (make sanitize-emu) the emulated kernels and the runtime stay
# uninstrumented: a kernel's threads are fibers on stacks of the runtime's own, whose
# switches ASan cannot follow. The backend's host code, the engine and the NCCL backend
# around them are instrumented as in any sanitizer build.
if(GANGLION_SANITIZE MATCHES "address")
  set_property(SOURCE ${gang_emu_kernel_sources} APPEND PROPERTY COMPILE_OPTIONS
    -fno-sanitize=address)
  target_compile_options(gang_cuda_emu PRIVATE -fno-sanitize=address)
endif()

target_sources(gang_kernels PRIVATE ${gang_cuda_host_sources} ${gang_emu_kernel_sources})
gang_c_only_options(gang_kernels CXX ${gang_emu_cxx_warn})
target_compile_definitions(gang_kernels PRIVATE GANG_HAVE_CUDA_KERNELS=1
  GANG_CUDA_LIBDIR="${GANG_CUDA_EMU_LIBDIR}")
target_link_libraries(gang_kernels PUBLIC gang_cuda_emu ${CMAKE_DL_LIBS})
add_dependencies(gang_kernels gang_cublas_emu gang_cupti_emu)
set(GANG_HAVE_CUDA_KERNELS 1)
message(STATUS "ganglion: CUDA kernels on the CPU emulator (tests/cuda-emu/); cuBLAS from "
               "${GANG_CUDA_EMU_LIBDIR}")

# The NCCL emulator, built against the nccl.h of include_dir (cmake/cuda.cmake's search).
function(gang_emu_nccl include_dir)
  add_library(gang_nccl_emu SHARED ${gang_emu_dir}/emu-nccl.cpp ${gang_emu_dir}/emu-nccl-link.cpp)
  target_include_directories(gang_nccl_emu PRIVATE ${include_dir})
  gang_c_only_options(gang_nccl_emu CXX ${gang_emu_cxx_warn})
  target_link_libraries(gang_nccl_emu PRIVATE gang_cuda_emu)
  set_target_properties(gang_nccl_emu PROPERTIES LIBRARY_OUTPUT_DIRECTORY ${GANG_CUDA_EMU_LIBDIR}
    OUTPUT_NAME nccl NO_SONAME ON SUFFIX ".so.2")
endfunction()
