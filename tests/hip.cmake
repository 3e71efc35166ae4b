# HIP backend tests (included by tests/CMakeLists.txt).
#   test_hip              the runtime path here: unavailable with the runtime's reason, silent, nothing leaked
#   test_hip_bundle       the embedded bundle read back: every target, the four kernels, its machine, no flushing
#   test_hip_no_fused_fp  the disassembly of every code object: no fused multiply-add in rowdiff and embed,
#                         in lm_head only the tiles' range-proven f32 fma beside the unfused paths' mul and add
#   test_hip_fused_check_sees_contraction   ... and that check does see contraction of the unfused paths
#                         in a bundle built with it on
#   test_conform_hip      the conformance suite on an AMD GPU (skips with the reason without one)
#   test_hip_on_cuda      the HIP port's source compiled by nvcc and run through the CUDA backend
if(TOVL_HAVE_HIP)
  string(REPLACE ";" " " hip_targets_text "${TOVL_HIP_BUILT_TARGETS}")
  # What a default build must give with Debian's ROCm 5.2 (LLVM 15), gfx1100
  # included through its synthesized device library; elsewhere what was built.
  set(hip_required "${hip_targets_text}")
  if(TOVL_HIP_LLVM_MAJOR EQUAL 15 AND NOT TOVL_HIP_TARGETS)
    set(hip_required "gfx908 gfx90a gfx940 gfx1030 gfx1100")
  endif()

  tovl_add_test(test_hip test_hip.c)
  tovl_add_test(test_hip_bundle test_hip_bundle.c)
  target_compile_definitions(test_hip_bundle PRIVATE
    TOVL_HIP_EXPECTED_TARGETS="${hip_targets_text}" TOVL_HIP_REQUIRED_TARGETS="${hip_required}")

  if(TOVL_HIP_OBJDUMP AND TOVL_HIP_BUNDLER)
    string(REPLACE ";" "," hip_targets_csv "${TOVL_HIP_BUILT_TARGETS}")
    set(hip_check ${CMAKE_COMMAND} -DBUNDLER=${TOVL_HIP_BUNDLER} -DOBJDUMP=${TOVL_HIP_OBJDUMP}
      -DTARGETS=${hip_targets_csv})
    add_test(NAME test_hip_no_fused_fp
      COMMAND ${hip_check} -DBUNDLE=${TOVL_HIP_BUNDLE} -DWORK=${CMAKE_CURRENT_BINARY_DIR}/hip_code_objects
              -P ${PROJECT_SOURCE_DIR}/backends/hip/check_code_objects.cmake)
    # The same source built with contraction on, to prove the check can fail:
    # it turns the lm_head kernels' unfused products into fmas.
    set(hip_contracted ${CMAKE_CURRENT_BINARY_DIR}/token_overlay_contracted.hipfb)
    string(REPLACE "-ffp-contract=off" "-ffp-contract=fast" hip_contracted_command "${TOVL_HIP_BUNDLE_COMMAND}")
    add_custom_command(
      OUTPUT ${hip_contracted}
      COMMAND ${hip_contracted_command} ${PROJECT_SOURCE_DIR}/backends/hip/token_overlay.hip -o ${hip_contracted}
      DEPENDS ${PROJECT_SOURCE_DIR}/backends/hip/token_overlay.hip ${PROJECT_SOURCE_DIR}/backends/hip/token_overlay_shape.h
              ${PROJECT_SOURCE_DIR}/include/tovl/kernel_args.h ${TOVL_HIP_BUNDLE_DEPENDS}
      COMMENT "Building a HIP bundle with FMA contraction on (for test_hip_fused_check_sees_contraction)"
      VERBATIM)
    add_custom_target(tovl_hip_contracted_bundle ALL DEPENDS ${hip_contracted})
    add_test(NAME test_hip_fused_check_sees_contraction
      COMMAND ${hip_check} -DBUNDLE=${hip_contracted} -DEXPECT=fused
              -DWORK=${CMAKE_CURRENT_BINARY_DIR}/hip_code_objects_contracted
              -P ${PROJECT_SOURCE_DIR}/backends/hip/check_code_objects.cmake)
    set_tests_properties(test_hip_no_fused_fp test_hip_fused_check_sees_contraction PROPERTIES
      SKIP_REGULAR_EXPRESSION "tovl-skip: ")
  else()
    message(STATUS "tovl: test_hip_no_fused_fp left out: llvm-objdump/clang-offload-bundler ${TOVL_HIP_LLVM_MAJOR} not found")
  endif()

  tovl_add_conform_test(hip)
endif()

# The HIP port's source on NVIDIA: nvcc compiles token_overlay.hip through
# backends/hip/hip_on_cuda.h into an sm_90 cubin (the H200); the CUDA backend's
# host code loads it and the conformance suite runs it against the CPU. The
# cubin is built wherever nvcc is, as a compile check of the port's source.
# The CUDA backend's nvcc (the same cache variable), or found here when that
# backend is off.
find_program(TOVL_NVCC nvcc HINTS ENV CUDA_PATH ENV CUDA_HOME /usr/local/cuda PATH_SUFFIXES bin
  DOC "The CUDA compiler that builds the kernels' fatbin")
set(TOVL_HIP_ON_CUDA_ARCH sm_90 CACHE STRING "NVIDIA architecture test_hip_on_cuda compiles the HIP port for")
if(TOVL_NVCC)
  set(hip_on_cuda_cubin ${CMAKE_CURRENT_BINARY_DIR}/token_overlay_hip_on_cuda.cubin)
  add_custom_command(
    OUTPUT ${hip_on_cuda_cubin}
    COMMAND ${TOVL_NVCC} -x cu -include ${PROJECT_SOURCE_DIR}/backends/hip/hip_on_cuda.h
            -cubin -arch=${TOVL_HIP_ON_CUDA_ARCH} -O3 -std=c++17 --fmad=false -ftz=false -prec-div=true -prec-sqrt=true
            --Werror all-warnings -I${PROJECT_SOURCE_DIR}/include
            ${PROJECT_SOURCE_DIR}/backends/hip/token_overlay.hip -o ${hip_on_cuda_cubin}
    DEPENDS ${PROJECT_SOURCE_DIR}/backends/hip/token_overlay.hip ${PROJECT_SOURCE_DIR}/backends/hip/token_overlay_shape.h
            ${PROJECT_SOURCE_DIR}/backends/hip/hip_on_cuda.h ${PROJECT_SOURCE_DIR}/include/tovl/kernel_args.h
    COMMENT "Compiling the HIP port for ${TOVL_HIP_ON_CUDA_ARCH} with nvcc (hip_on_cuda.h)"
    VERBATIM)
  if(TOVL_HAVE_CUDA)
    tovl_embed_binary(${CMAKE_CURRENT_BINARY_DIR}/hip_on_cuda_image.c tovl_hip_on_cuda_image ${hip_on_cuda_cubin})
    tovl_add_test(test_hip_on_cuda test_hip_on_cuda.c ${CMAKE_CURRENT_BINARY_DIR}/hip_on_cuda_image.c)
    target_link_libraries(test_hip_on_cuda PRIVATE tovl_cuda_testutil)
  else()
    add_custom_target(tovl_hip_on_cuda_cubin ALL DEPENDS ${hip_on_cuda_cubin})
    message(STATUS "tovl: test_hip_on_cuda left out (the CUDA backend is not built); its cubin is still compiled")
  endif()
else()
  message(STATUS "tovl: test_hip_on_cuda left out: no nvcc found")
endif()

# The HIP port's source on the host: the kernel emulation of tests/cuda.cmake
# (tovl_cuda_emu) runs token_overlay.hip at warp widths 64 and 32. Needs no
# HIP compiler and no GPU, only a C++ compiler.
if(TARGET tovl_cuda_emu)
  set(hip_emu_dir ${PROJECT_SOURCE_DIR}/backends/hip/emu)
  add_library(tovl_hip_emu STATIC ${hip_emu_dir}/hip_emu_kernels.cpp
    ${hip_emu_dir}/hip_emu_kernels_tiles.cpp ${hip_emu_dir}/hip_emu_backend.c)
  if(NOT TOVL_HAVE_HIP)
    # The library has the HIP geometry only when it builds the HIP backend.
    target_sources(tovl_hip_emu PRIVATE ${PROJECT_SOURCE_DIR}/backends/hip/hip_geometry.c)
  endif()
  target_link_libraries(tovl_hip_emu PUBLIC tovl_cuda_emu)
  target_include_directories(tovl_hip_emu PRIVATE ${PROJECT_SOURCE_DIR}/backends/hip)
  set_target_properties(tovl_hip_emu PROPERTIES CXX_STANDARD 17 CXX_STANDARD_REQUIRED ON CXX_EXTENSIONS OFF)
  target_compile_options(tovl_hip_emu PRIVATE $<$<COMPILE_LANGUAGE:C>:${TOVL_C_FLAGS}>
                                              $<$<COMPILE_LANGUAGE:CXX>:${emu_cxx_flags}>)
  tovl_add_parted_test(test_hip_emu SUITE hip_emu PARTS "conformance_wave64" "conformance_wave64_lmhead_*"
    "conformance_wave32" "conformance_wave32_lmhead_*" "slots_in_place_*" "slots_capacity_*" "batches_*"
    SOURCES test_hip_emu.c)
  target_link_libraries(test_hip_emu PRIVATE tovl_cuda_testutil tovl_conform tovl_hip_emu)
  target_include_directories(test_hip_emu PRIVATE ${PROJECT_SOURCE_DIR}/backends)
else()
  message(STATUS "tovl: test_hip_emu left out: the kernel emulation (tests/cuda.cmake) needs a C++ compiler")
endif()
