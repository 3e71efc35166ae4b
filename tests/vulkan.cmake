# Vulkan backend tests (included by tests/CMakeLists.txt). In CI they run on
# Mesa's lavapipe, with the Khronos validation layer.
if(NOT TOVL_HAVE_VULKAN)
  return()
endif()

# test_vulkan.shards (vulkan_shards/*, the fixed-shape shard sets' rounds,
# minutes on lavapipe) apart from test_vulkan.rest, each with its own timeout.
tovl_add_parted_test(test_vulkan SUITE vulkan PARTS "slots_*" SOURCES test_vulkan.c)
add_test(NAME test_vulkan.shards COMMAND test_vulkan --jobs 1 --short-filename --filter "vulkan_shards/*")
set_tests_properties(test_vulkan.shards PROPERTIES TIMEOUT 1500)
target_link_libraries(test_vulkan PRIVATE ${CMAKE_DL_LIBS})
# `tovl bench` run on the device (skipped when the tools are not built).
if(TARGET tovl_cli)
  target_compile_definitions(test_vulkan PRIVATE TOVL_CLI="$<TARGET_FILE:tovl_cli>")
  add_dependencies(test_vulkan tovl_cli)
else()
  target_compile_definitions(test_vulkan PRIVATE TOVL_CLI="${PROJECT_BINARY_DIR}/tools/tovl-not-built")
endif()

# The generic conformance test, with validation on (any validation message
# makes the run fail through test_vulkan_conform below).
tovl_add_conform_test(vulkan)
set_tests_properties(test_conform_vulkan PROPERTIES ENVIRONMENT "TOVL_VULKAN_VALIDATION=1")

# Conformance + zero validation messages, at lavapipe's default subgroup size
# (8) and again at subgroup size 4 (LP_NATIVE_VECTOR_WIDTH=128).
add_executable(test_vulkan_conform test_vulkan_conform.c)
target_link_libraries(test_vulkan_conform PRIVATE tovl_testutil tovl_conform)
target_compile_options(test_vulkan_conform PRIVATE ${TOVL_C_FLAGS})
add_test(NAME test_vulkan_conform COMMAND test_vulkan_conform --short-filename)
add_test(NAME test_vulkan_conform_subgroup4 COMMAND test_vulkan_conform --short-filename)
set_tests_properties(test_vulkan_conform PROPERTIES TIMEOUT 900 ENVIRONMENT "TOVL_VULKAN_VALIDATION=1")
set_tests_properties(test_vulkan_conform_subgroup4 PROPERTIES TIMEOUT 900
  ENVIRONMENT "TOVL_VULKAN_VALIDATION=1;LP_NATIVE_VECTOR_WIDTH=128;TOVL_EXPECT_LAVAPIPE_SUBGROUP=4")

# The lm_head variants forced (by default the row variant runs below T = 56
# and the tiles from it): the tiles at subgroup size 8, the rows at 4. (One
# "_variant" suffix after the target's name: tests/hardening.cmake gives such
# tests the sanitizer preload.)
add_test(NAME test_vulkan_conform_tiles COMMAND test_vulkan_conform --short-filename)
add_test(NAME test_vulkan_conform_rows-subgroup4 COMMAND test_vulkan_conform --short-filename)
set_tests_properties(test_vulkan_conform_tiles PROPERTIES TIMEOUT 900
  ENVIRONMENT "TOVL_VULKAN_VALIDATION=1;TOVL_VULKAN_LMHEAD=tile")
set_tests_properties(test_vulkan_conform_rows-subgroup4 PROPERTIES TIMEOUT 900
  ENVIRONMENT "TOVL_VULKAN_VALIDATION=1;LP_NATIVE_VECTOR_WIDTH=128;TOVL_EXPECT_LAVAPIPE_SUBGROUP=4;TOVL_VULKAN_LMHEAD=row")

# Every float add/sub/mul of the embedded shaders must carry NoContraction
# (no FMA fusion); a run on lavapipe cannot see fusion, so check the SPIR-V.
find_program(TOVL_SPIRV_DIS spirv-dis)
if(TOVL_SPIRV_DIS)
  foreach(k rowdiff lmhead_overlay_bf16 lmhead_overlay_f32 lmhead_overlay_bf16_row lmhead_overlay_f32_row)
    add_test(NAME test_vulkan_spirv_no_contraction_${k}
      COMMAND ${CMAKE_COMMAND} -DSPIRV_DIS=${TOVL_SPIRV_DIS}
              -DSPV=${PROJECT_BINARY_DIR}/backends/vulkan/shaders/${k}.spv
              -P ${PROJECT_SOURCE_DIR}/backends/vulkan/check_no_contraction.cmake)
  endforeach()
endif()
