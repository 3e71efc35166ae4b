# Included right after project(tovl) when a build makes the Python package
# (CMAKE_PROJECT_tovl_INCLUDE: set by python/pyproject.toml for scikit-build-core,
# and by scripts/dist.sh for the release build). At the end of the top
# directory, once the library and CLI targets exist, it installs into the
# package, in its own component `python`:
#   tovl/libtovl.so.<ABI>  the shared library under its SONAME (a wheel holds no
#                          symlinks, so the versioned name chain would become three
#                          copies; one file under the name the loader asks for);
#   tovl/bin/tovl          the CLI, linked to that library (RUNPATH $ORIGIN/..),
#                          which the `tovl` console script runs (tovl/_cli.py).
# EXCLUDE_FROM_ALL: only an install of that component (scikit-build-core's,
# scripts/dist.sh's) puts them in; a plain `cmake --install` of the same build
# is the C install alone. The CLI of the C install links libtovl.a; this one links the shared library,
# so the wheel carries the CUDA fatbin and the HIP code objects once, not twice.
function(tovl_wheel_install)
  install(FILES $<TARGET_FILE:tovl> DESTINATION tovl RENAME libtovl.so.${TOVL_ABI_VERSION} COMPONENT python EXCLUDE_FROM_ALL)
  if(NOT TARGET tovl_cli)
    return() # TOVL_BUILD_TOOLS=OFF: a package without the CLI
  endif()
  get_target_property(sources tovl_cli SOURCES)
  list(TRANSFORM sources PREPEND ${PROJECT_SOURCE_DIR}/tools/)
  # The conformance suite's sources (tools/CMakeLists.txt's tovl_conform, which
  # links libtovl.a) built in, with its SHA-256 from nettle.
  find_package(PkgConfig REQUIRED)
  pkg_check_modules(TOVL_WHEEL_NETTLE REQUIRED IMPORTED_TARGET nettle)
  add_executable(tovl_cli_wheel ${sources} ${PROJECT_SOURCE_DIR}/tools/conform.c
    ${PROJECT_SOURCE_DIR}/tools/conform_golden.c)
  target_include_directories(tovl_cli_wheel PRIVATE ${PROJECT_SOURCE_DIR}/tools)
  target_link_libraries(tovl_cli_wheel PRIVATE tovl PkgConfig::CJSON PkgConfig::TOVL_WHEEL_NETTLE m)
  target_compile_options(tovl_cli_wheel PRIVATE ${TOVL_C_FLAGS})
  set_target_properties(tovl_cli_wheel PROPERTIES
    OUTPUT_NAME tovl
    RUNTIME_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/python-bin
    INSTALL_RPATH "$ORIGIN/..")
  install(TARGETS tovl_cli_wheel RUNTIME DESTINATION tovl/bin COMPONENT python EXCLUDE_FROM_ALL)
endfunction()
cmake_language(DEFER DIRECTORY ${CMAKE_SOURCE_DIR} CALL tovl_wheel_install)
