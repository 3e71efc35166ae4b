# The tovl CLI's option parsing: both spellings of a value, --help on every
# command, unknown and incomplete options named with exit status 2; and the
# serving demo that `make run` ends with.
# Included by tests/CMakeLists.txt.
if(TARGET tovl_cli)
  tovl_add_test(test_cli test_cli.c)
  target_compile_definitions(test_cli PRIVATE
    TOVL_CLI="$<TARGET_FILE:tovl_cli>"
    TOVL_EXTRA_FIXTURES="${CMAKE_CURRENT_SOURCE_DIR}/fixtures/peft_extra"
    TOVL_SERVE_DEMO="${PROJECT_SOURCE_DIR}/scripts/serve-demo.py")
  add_dependencies(test_cli tovl_cli)
endif()
