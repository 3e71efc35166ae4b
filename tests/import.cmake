# Adapter and base-model import tests (issue 3). Included by tests/CMakeLists.txt.
# The PEFT fixtures of ../shared are found beside the source tree (CI copies
# shared/ there); the committed small ones are in tests/fixtures/peft_extra,
# tests/fixtures/peft_tokens and tests/fixtures/peft_families.
if(TARGET tovl_cli)
  set(tovl_import_cli "$<TARGET_FILE:tovl_cli>")
else()
  set(tovl_import_cli "${PROJECT_BINARY_DIR}/tools/tovl-not-built")
endif()
set(tovl_import_defs
  TOVL_SHARED_FIXTURES="${PROJECT_SOURCE_DIR}/../shared/fixtures/peft"
  TOVL_EXTRA_FIXTURES="${CMAKE_CURRENT_SOURCE_DIR}/fixtures/peft_extra"
  TOVL_TOKEN_FIXTURES="${CMAKE_CURRENT_SOURCE_DIR}/fixtures/peft_tokens"
  TOVL_FAMILY_FIXTURES="${CMAKE_CURRENT_SOURCE_DIR}/fixtures/peft_families"
  TOVL_CLI="${tovl_import_cli}")

tovl_add_test(test_import_fixtures test_import_fixtures.c test_import_scratch.c)
tovl_add_test(test_import_safetensors test_import_safetensors.c test_import_scratch.c)
tovl_add_test(test_import_errors test_import_errors.c test_import_scratch.c)
foreach(t test_import_fixtures test_import_safetensors test_import_errors)
  target_compile_definitions(${t} PRIVATE ${tovl_import_defs})
  if(TARGET tovl_cli)
    add_dependencies(${t} tovl_cli)
  endif()
endforeach()
