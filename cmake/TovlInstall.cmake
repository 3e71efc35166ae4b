# Install rules, the exported CMake package (find_package(tovl) with imported
# targets tovl::tovl and tovl::tovl_static) and the pkg-config file tovl.pc.
#
# Included by the top CMakeLists before tools/ and tests/ exist, so the rules
# are deferred to the end of the top directory: by then the tovl CLI target
# exists and every backend has added its link dependencies.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(TOVL_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/tovl CACHE STRING
    "Where tovlConfig.cmake is installed, relative to the prefix")

# tovl_flatten_link_items(OUT ITEMS...): turn link items (library names, files,
# imported targets such as PkgConfig::CJSON, static targets of this project)
# into what an installed consumer can use without our build tree:
#   OUT_CMAKE: names or files for the exported static target's interface;
#   OUT_PC:    -L/-l flags for pkg-config's Libs.private;
#   OUT_OWN:   non-imported static targets of this project, installed with libtovl.a.
# A system library (in a linker default directory) becomes its bare name, so the
# installed package does not hard-code this machine's paths.
function(tovl_flatten_link_items prefix)
  set(cmake_items "")
  set(pc_items "")
  set(own_targets "")
  set(queue ${ARGN})
  set(seen "")
  while(queue)
    list(POP_FRONT queue item)
    if(item IN_LIST seen OR item STREQUAL "")
      continue()
    endif()
    list(APPEND seen "${item}")
    if(item MATCHES "^\\$<LINK_ONLY:(.*)>$")
      list(APPEND queue "${CMAKE_MATCH_1}")
    elseif(item MATCHES "^\\$<")
      message(WARNING "tovl install: link item '${item}' is a generator expression; left out of tovl.pc")
      list(APPEND cmake_items "${item}")
    elseif(item STREQUAL "Threads::Threads")
      list(APPEND cmake_items Threads::Threads)
      list(APPEND pc_items -pthread)
    elseif(TARGET "${item}")
      get_target_property(imported "${item}" IMPORTED)
      get_target_property(type "${item}" TYPE)
      if(NOT imported)
        if(NOT type STREQUAL "STATIC_LIBRARY" AND NOT type STREQUAL "INTERFACE_LIBRARY")
          message(FATAL_ERROR "tovl install: TOVL_EXTRA_LIBS holds ${item} of type ${type}; only static "
                              "or interface libraries of this project can be installed with libtovl.a")
        endif()
        list(APPEND own_targets "${item}")
        if(type STREQUAL "STATIC_LIBRARY")
          get_target_property(out_name "${item}" OUTPUT_NAME)
          if(NOT out_name)
            set(out_name "${item}")
          endif()
          list(APPEND pc_items "-l${out_name}")
        endif()
        get_target_property(deps "${item}" INTERFACE_LINK_LIBRARIES)
        if(deps)
          list(APPEND queue ${deps})
        endif()
        continue()
      endif()
      # An imported target: its file (if any), then its own dependencies.
      if(NOT type STREQUAL "INTERFACE_LIBRARY")
        set(location "")
        foreach(prop IMPORTED_LOCATION_RELEASE IMPORTED_LOCATION_RELWITHDEBINFO IMPORTED_LOCATION_NOCONFIG
                     IMPORTED_LOCATION)
          get_target_property(loc "${item}" ${prop})
          if(loc AND NOT location)
            set(location "${loc}")
          endif()
        endforeach()
        if(location)
          list(PREPEND queue "${location}")
        endif()
      endif()
      get_target_property(deps "${item}" INTERFACE_LINK_LIBRARIES)
      if(deps)
        list(APPEND queue ${deps})
      endif()
    elseif(IS_ABSOLUTE "${item}")
      get_filename_component(dir "${item}" DIRECTORY)
      get_filename_component(file "${item}" NAME)
      set(name "")
      if(file MATCHES "^lib(.+)\\.(so(\\..*)?|a)$")
        set(name "${CMAKE_MATCH_1}")
      endif()
      if(name AND dir IN_LIST CMAKE_C_IMPLICIT_LINK_DIRECTORIES)
        list(APPEND cmake_items "${name}")
        list(APPEND pc_items "-l${name}")
      elseif(name)
        list(APPEND cmake_items "${item}")
        list(APPEND pc_items "-L${dir}" "-l${name}")
      else()
        list(APPEND cmake_items "${item}")
        list(APPEND pc_items "${item}")
      endif()
    elseif(item MATCHES "^-")
      list(APPEND cmake_items "${item}")
      list(APPEND pc_items "${item}")
    else()
      list(APPEND cmake_items "${item}")
      list(APPEND pc_items "-l${item}")
    endif()
  endwhile()
  list(REMOVE_DUPLICATES pc_items)
  set(${prefix}_CMAKE "${cmake_items}" PARENT_SCOPE)
  set(${prefix}_PC "${pc_items}" PARENT_SCOPE)
  set(${prefix}_OWN "${own_targets}" PARENT_SCOPE)
endfunction()

function(tovl_install_all)
  # Headers: the public API, the backend interface and per-backend extras.
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/tovl
          DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
          FILES_MATCHING PATTERN "*.h")

  # The static target's link interface names the extra libraries as they were
  # in the build (e.g. PkgConfig::CJSON, which an installed consumer cannot
  # see); for the install tree it names the flattened libraries instead.
  get_property(extra GLOBAL PROPERTY TOVL_EXTRA_LIBS)
  tovl_flatten_link_items(TOVL_LINK ${CMAKE_DL_LIBS} Threads::Threads m ${extra})
  if(extra)
    get_target_property(iface tovl_static INTERFACE_LINK_LIBRARIES)
    set(rewritten "")
    foreach(item ${iface})
      if(item IN_LIST extra)
        list(APPEND rewritten "$<BUILD_INTERFACE:${item}>")
      else()
        list(APPEND rewritten "${item}")
      endif()
    endforeach()
    tovl_flatten_link_items(TOVL_EXTRA ${extra})
    foreach(item ${TOVL_EXTRA_CMAKE})
      if(TARGET "${item}")
        list(APPEND rewritten "${item}") # our own static library, exported with us
      else()
        list(APPEND rewritten "$<INSTALL_INTERFACE:${item}>")
      endif()
    endforeach()
    set_property(TARGET tovl_static PROPERTY INTERFACE_LINK_LIBRARIES "${rewritten}")
  endif()

  install(TARGETS tovl tovl_static ${TOVL_LINK_OWN}
          EXPORT tovlTargets
          LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
          ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
          RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
          INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
  if(TARGET tovl_cli)
    install(TARGETS tovl_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
  endif()

  install(EXPORT tovlTargets
          NAMESPACE tovl::
          FILE tovlTargets.cmake
          DESTINATION ${TOVL_INSTALL_CMAKEDIR})

  # Which backends this build compiled in, for consumers that want to know.
  set(TOVL_COMPILED_BACKENDS cpu)
  foreach(b CUDA HIP VULKAN)
    if(TOVL_HAVE_${b})
      string(TOLOWER ${b} lower)
      list(APPEND TOVL_COMPILED_BACKENDS ${lower})
    endif()
  endforeach()
  configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/tovlConfig.cmake.in
    ${PROJECT_BINARY_DIR}/tovlConfig.cmake
    INSTALL_DESTINATION ${TOVL_INSTALL_CMAKEDIR})
  write_basic_package_version_file(${PROJECT_BINARY_DIR}/tovlConfigVersion.cmake
    VERSION ${PROJECT_VERSION}
    COMPATIBILITY SameMinorVersion) # 0.x: a minor release may break the API
  install(FILES ${PROJECT_BINARY_DIR}/tovlConfig.cmake ${PROJECT_BINARY_DIR}/tovlConfigVersion.cmake
          DESTINATION ${TOVL_INSTALL_CMAKEDIR})

  # pkg-config: the prefix is derived from the .pc file's own place, so the
  # file stays right after `cmake --install --prefix ANYWHERE`.
  file(RELATIVE_PATH TOVL_PC_TO_PREFIX "/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/")
  string(REGEX REPLACE "/$" "" TOVL_PC_TO_PREFIX "${TOVL_PC_TO_PREFIX}")
  list(JOIN TOVL_LINK_PC " " TOVL_PC_LIBS_PRIVATE)
  configure_file(${PROJECT_SOURCE_DIR}/cmake/tovl.pc.in ${PROJECT_BINARY_DIR}/tovl.pc @ONLY)
  install(FILES ${PROJECT_BINARY_DIR}/tovl.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
endfunction()

cmake_language(DEFER DIRECTORY ${PROJECT_SOURCE_DIR} CALL tovl_install_all)
