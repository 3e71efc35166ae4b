# Hardening tests (issue 4): fault injection through a wrapping backend,
# hostile batches on every backend present, and a check that docs/API.md lists
# every public function. Included by tests/CMakeLists.txt; also run as a script
# (cmake -DINCLUDE_DIR=... -DDOC=... -P hardening.cmake) by that last check.

if(CMAKE_SCRIPT_MODE_FILE)
  # Every TOVL_API function declared in include/tovl/*.h must appear in the doc.
  file(GLOB headers ${INCLUDE_DIR}/tovl/*.h)
  file(READ ${DOC} doc)
  set(missing "")
  set(count 0)
  foreach(h ${headers})
    file(READ ${h} text)
    string(REGEX MATCHALL "TOVL_API[^;(]*[ *]tovl_[a-z0-9_]+\\(" decls "${text}")
    foreach(d ${decls})
      string(REGEX REPLACE ".*[ *](tovl_[a-z0-9_]+)\\($" "\\1" name "${d}")
      math(EXPR count "${count} + 1")
      string(FIND "${doc}" "${name}(" at)
      if(at EQUAL -1)
        list(APPEND missing ${name})
      endif()
    endforeach()
  endforeach()
  if(count EQUAL 0)
    message(FATAL_ERROR "no TOVL_API function found under ${INCLUDE_DIR}: the check is broken")
  endif()
  if(missing)
    message(FATAL_ERROR "${DOC} does not document: ${missing}")
  endif()
  message(STATUS "${DOC}: all ${count} public functions documented")
  return()
endif()

# Adapter import is driven through fault injection when core/import is part of
# this build (it defines tovl_adapter_build_overlay); otherwise that test skips
# and says why.
set(tovl_test_have_import 0)
if(EXISTS ${PROJECT_SOURCE_DIR}/core/import/CMakeLists.txt)
  file(GLOB tovl_import_sources ${PROJECT_SOURCE_DIR}/core/import/*.c)
  foreach(f ${tovl_import_sources})
    file(STRINGS ${f} defines REGEX "^tovl_status tovl_adapter_build_overlay\\(")
    if(defines)
      set(tovl_test_have_import 1)
    endif()
  endforeach()
endif()

tovl_add_test(test_faults test_faults.c)
target_compile_definitions(test_faults PRIVATE TOVL_TEST_HAVE_IMPORT=${tovl_test_have_import})
tovl_add_test(test_hostile test_hostile.c)
add_test(NAME test_api_doc_lists_every_function
  COMMAND ${CMAKE_COMMAND} -DINCLUDE_DIR=${PROJECT_SOURCE_DIR}/include -DDOC=${PROJECT_SOURCE_DIR}/docs/API.md
          -P ${CMAKE_CURRENT_LIST_FILE})

# Sanitizer builds (the "asan" preset): every test of this directory runs with
# the sanitizers' options, wherever ctest is started from. Deferred to the end
# of the directory so tests added by later *.cmake files get them too.
#
# Criterion reports a test's verdict before the worker process exits, and
# LeakSanitizer runs at exit: a leak changes neither the verdict nor the exit
# status. So every test also fails when its output shows a sanitizer report.
#
# Drivers loaded at run time (lavapipe through the Vulkan loader, the HIP
# runtime) keep allocations in their globals; unloaded, those blocks are
# reported from "<unknown module>", which no suppression can name. Our test
# executables therefore run with a preloaded dlclose that does nothing
# (tests/sanitizer_keep_modules.c, after the ASan runtime, which must come
# first). Tests that check unloading itself are listed in
# TOVL_SANITIZER_UNLOAD_TESTS: they keep real dlclose and run without leak
# detection (ASan and UBSan still on). docs/SANITIZERS.md has the details.
if(CMAKE_C_FLAGS MATCHES "-fsanitize=")
  set(TOVL_SANITIZER_ENV
    "ASAN_OPTIONS=halt_on_error=1:detect_leaks=1:print_stacktrace=1:detect_stack_use_after_return=1:strict_string_checks=1:check_initialization_order=1"
    "UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1"
    "LSAN_OPTIONS=suppressions=${PROJECT_SOURCE_DIR}/scripts/lsan.supp:print_suppressions=0")
  set(TOVL_SANITIZER_FAIL_REGEX
    "ERROR: AddressSanitizer" "ERROR: LeakSanitizer" "runtime error: " "SUMMARY: UndefinedBehaviorSanitizer"
    "crashed during its setup or teardown")
  # test_hip: checks that a failed open leaves libamdhip64 unloaded, and
  # ROCm 5.2 leaves static allocations behind at each unload.
  set(TOVL_SANITIZER_UNLOAD_TESTS test_hip)
  # Script tests that start our executables: the interpreter runs without
  # the preload (it is not ours to check), the tovl processes it starts get
  # it through TOVL_CHILD_LD_PRELOAD (tests/cli_campaign.py).
  set(TOVL_SANITIZER_CHILD_TESTS test_campaign_cli)

  add_library(tovl_keep_modules SHARED sanitizer_keep_modules.c)
  # The shim must not itself be instrumented or linked to the sanitizers.
  target_compile_options(tovl_keep_modules PRIVATE ${TOVL_C_FLAGS} -fno-sanitize=all)
  target_link_options(tovl_keep_modules PRIVATE -fno-sanitize=all)
  set_target_properties(tovl_keep_modules PROPERTIES C_VISIBILITY_PRESET default)
  execute_process(COMMAND ${CMAKE_C_COMPILER} -print-file-name=libasan.so
                  OUTPUT_VARIABLE tovl_libasan OUTPUT_STRIP_TRAILING_WHITESPACE)
  set(TOVL_SANITIZER_PRELOAD "")
  if(IS_ABSOLUTE "${tovl_libasan}" AND EXISTS "${tovl_libasan}")
    set(TOVL_SANITIZER_PRELOAD "LD_PRELOAD=${tovl_libasan} $<TARGET_FILE:tovl_keep_modules>")
  else()
    message(WARNING "tovl asan: libasan.so not found (${tovl_libasan}): driver leaks at unload will be reported")
  endif()
  function(tovl_set_sanitizer_env)
    get_property(tests DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR} PROPERTY TESTS)
    foreach(t ${tests})
      set_property(TEST ${t} APPEND PROPERTY ENVIRONMENT ${TOVL_SANITIZER_ENV})
      set_property(TEST ${t} APPEND PROPERTY FAIL_REGULAR_EXPRESSION ${TOVL_SANITIZER_FAIL_REGEX})
      # Our executables: a test named as its target, or as its target plus
      # one "_variant" suffix (test_vulkan_conform_subgroup4), or a part of
      # a parted test (test_vulkan.shards). Script tests (cmake -P, objdump)
      # get neither the preload nor a changed dlclose.
      string(REGEX REPLACE "_[^_]+$" "" base "${t}")
      string(REGEX REPLACE "[.][^.]+$" "" part_of "${t}")
      if(t IN_LIST TOVL_SANITIZER_CHILD_TESTS AND TOVL_SANITIZER_PRELOAD)
        string(REPLACE "LD_PRELOAD=" "TOVL_CHILD_LD_PRELOAD=" child_preload "${TOVL_SANITIZER_PRELOAD}")
        set_property(TEST ${t} APPEND PROPERTY ENVIRONMENT "${child_preload}")
      elseif(t IN_LIST TOVL_SANITIZER_UNLOAD_TESTS)
        set_property(TEST ${t} APPEND PROPERTY ENVIRONMENT "ASAN_OPTIONS=halt_on_error=1:detect_leaks=0:print_stacktrace=1")
      elseif(TOVL_SANITIZER_PRELOAD AND (TARGET "${t}" OR TARGET "${base}" OR TARGET "${part_of}"))
        set_property(TEST ${t} APPEND PROPERTY ENVIRONMENT "${TOVL_SANITIZER_PRELOAD}")
      endif()
    endforeach()
  endfunction()
  cmake_language(DEFER CALL tovl_set_sanitizer_env)
endif()
