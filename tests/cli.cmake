# The tovl CLI's option parsing: both spellings of a value, --help on every
# command, unknown and incomplete options named with exit status 2; and the
# serving demo that `make run` ends with; and a cross-vendor conformance
# campaign on the backends here (golden files, JUnit, run --digest), by
# tests/cli_campaign.py with the system's python3.
# Included by tests/CMakeLists.txt.
if(TARGET tovl_cli)
  tovl_add_test(test_cli test_cli.c)
  target_compile_definitions(test_cli PRIVATE
    TOVL_CLI="$<TARGET_FILE:tovl_cli>"
    TOVL_EXTRA_FIXTURES="${CMAKE_CURRENT_SOURCE_DIR}/fixtures/peft_extra"
    TOVL_SERVE_DEMO="${PROJECT_SOURCE_DIR}/scripts/serve-demo.py")
  add_dependencies(test_cli tovl_cli)
  # Not "test_cli_<variant>": under the sanitizers the interpreter must not
  # get test_cli's preload (tests/hardening.cmake hands it to the tovl runs).
  add_test(NAME test_campaign_cli
    COMMAND python3 ${CMAKE_CURRENT_SOURCE_DIR}/cli_campaign.py $<TARGET_FILE:tovl_cli>
            ${CMAKE_CURRENT_SOURCE_DIR}/golden/conform-seed-1.json ${PROJECT_SOURCE_DIR}/scripts/serve-demo.py)
  set_tests_properties(test_campaign_cli PROPERTIES TIMEOUT 900)
endif()
