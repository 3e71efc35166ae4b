# CUDA backend tests (included by tests/CMakeLists.txt).
#   test_cuda             no-driver path, argument checks, launch geometry; on a
#                         GPU: devices, every kernel against the CPU, timing
#   test_cuda_graph       both hooks captured in a CUDA graph and replayed (GPU)
#   test_conform_cuda     the conformance suite on the CUDA backend (GPU)
#   test_cuda_emu         the CUDA kernels emulated on the host, against the CPU
#                         reference (needs no GPU; needs a C++ compiler)
# Without a driver or GPU the device tests skip with the backend's reason.
add_library(tovl_cuda_testutil STATIC test_cuda_common.c)
target_link_libraries(tovl_cuda_testutil PUBLIC tovl_testutil)
target_compile_options(tovl_cuda_testutil PRIVATE ${TOVL_C_FLAGS})

tovl_add_test(test_cuda test_cuda.c)
target_link_libraries(test_cuda PRIVATE tovl_cuda_testutil)
tovl_add_test(test_cuda_graph test_cuda_graph.c)
target_link_libraries(test_cuda_graph PRIVATE tovl_cuda_testutil)
tovl_add_conform_test(cuda)

# The emulation compiles token_overlay.cu as C++ for the host; test-only.
include(CheckLanguage)
check_language(CXX)
if(CMAKE_CXX_COMPILER)
  enable_language(CXX)
  set(emu_dir ${PROJECT_SOURCE_DIR}/backends/cuda/emu)
  add_library(tovl_cuda_emu STATIC ${emu_dir}/cuda_emu.cpp ${emu_dir}/emu_kernels.cpp ${emu_dir}/emu_backend.c)
  target_link_libraries(tovl_cuda_emu PUBLIC tovl_static)
  target_include_directories(tovl_cuda_emu PRIVATE ${PROJECT_SOURCE_DIR}/backends/cuda)
  set_target_properties(tovl_cuda_emu PROPERTIES CXX_STANDARD 17 CXX_STANDARD_REQUIRED ON CXX_EXTENSIONS OFF)
  set(emu_cxx_flags -Wall -Wextra -Wpedantic -Wshadow -ffp-contract=off -fno-fast-math)
  if(TOVL_WERROR)
    list(APPEND emu_cxx_flags -Werror)
  endif()
  target_compile_options(tovl_cuda_emu PRIVATE $<$<COMPILE_LANGUAGE:C>:${TOVL_C_FLAGS}>
                                               $<$<COMPILE_LANGUAGE:CXX>:${emu_cxx_flags}>)
  tovl_add_parted_test(test_cuda_emu SUITE cuda_emu PARTS "conformance_*" "slots_*" "bench_shape_*" SOURCES test_cuda_emu.c)
  target_link_libraries(test_cuda_emu PRIVATE tovl_cuda_testutil tovl_conform tovl_cuda_emu)
else()
  message(STATUS "tovl: no C++ compiler: test_cuda_emu (the CUDA kernels emulated on the host) left out")
endif()

# The embedded fatbin's file, which test_cuda loads through open_image.
if(TOVL_CUDA_FATBIN)
  target_compile_definitions(test_cuda PRIVATE TOVL_TEST_CUDA_FATBIN="${TOVL_CUDA_FATBIN}")
endif()
