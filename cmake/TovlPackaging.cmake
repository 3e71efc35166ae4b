# The C library's release packages, made by cpack from a configured build:
#   tovl_<version>_amd64.deb          installs under /usr
#   tovl-<version>-linux-x86_64.tar.gz  a relocatable prefix (bin/ include/ lib/ share/)
# Both hold what `cmake --install` installs (TovlInstall.cmake: headers, shared
# and static library, tovl.pc, the CMake package, the tovl CLI) and the docs;
# not the Python package's component (python/tovl_wheel.cmake).
#   cpack --config <build>/CPackConfig.cmake      (scripts/dist.sh runs it)
include(GNUInstallDirs)

set(TOVL_PACKAGE_MAINTAINER "tovl maintainers <maintainers@tovl.invalid>" CACHE STRING
    "Maintainer field of the .deb (name <address>)")

# The docs: the README, the changelog and docs/*.md but INSTALL.md.
install(FILES ${PROJECT_SOURCE_DIR}/README.md ${PROJECT_SOURCE_DIR}/CHANGELOG.md
        DESTINATION ${CMAKE_INSTALL_DOCDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/docs/ DESTINATION ${CMAKE_INSTALL_DOCDIR}
        FILES_MATCHING PATTERN "*.md" PATTERN "INSTALL.md" EXCLUDE) # how to install these very files

# What Debian policy asks of every package beside the docs: a copyright file
# and a changelog in Debian's format, gzip -9n. Their own component, which only
# the .deb includes. The date is SOURCE_DATE_EPOCH's when set (scripts/dist.sh
# sets it to the commit's time), so the same commit gives the same file.
# EXCLUDE_FROM_ALL: a plain `cmake --install` leaves them out.
string(TIMESTAMP TOVL_PACKAGE_DATE "%a, %d %b %Y %H:%M:%S +0000" UTC)
configure_file(${PROJECT_SOURCE_DIR}/cmake/debian/changelog.in ${PROJECT_BINARY_DIR}/debian/changelog @ONLY)
find_program(TOVL_GZIP gzip)
if(TOVL_GZIP)
  execute_process(COMMAND ${TOVL_GZIP} -9nf ${PROJECT_BINARY_DIR}/debian/changelog RESULT_VARIABLE gzip_rc)
  if(gzip_rc EQUAL 0)
    install(FILES ${PROJECT_BINARY_DIR}/debian/changelog.gz DESTINATION ${CMAKE_INSTALL_DOCDIR} COMPONENT deb EXCLUDE_FROM_ALL)
    install(FILES ${PROJECT_SOURCE_DIR}/cmake/debian/copyright DESTINATION ${CMAKE_INSTALL_DOCDIR} COMPONENT deb EXCLUDE_FROM_ALL)
  endif()
endif()

set(CPACK_PACKAGE_NAME tovl)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_VENDOR "tovl")
set(CPACK_PACKAGE_CONTACT "${TOVL_PACKAGE_MAINTAINER}")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY
    "per-adapter token overlays for multi-LoRA LLM serving, bit-exact across vendors")
set(CPACK_PACKAGE_DESCRIPTION
    "tovl applies each adapter's embedding rows and lm_head cells to a batch\n"
    "that mixes adapters, on CUDA, HIP and Vulkan GPUs and on the CPU, with the\n"
    "same bits on every vendor. The library loads each vendor's runtime when a\n"
    "backend is opened and links none, so one package serves NVIDIA, AMD and\n"
    "Vulkan machines alike.\n"
    "This package holds the C library (shared and static), its headers, the\n"
    "pkg-config file and CMake package, the tovl command line tool and the docs.")
string(REPLACE ";" "" CPACK_PACKAGE_DESCRIPTION "${CPACK_PACKAGE_DESCRIPTION}")
set(CPACK_GENERATOR "DEB;TGZ")
set(CPACK_SOURCE_GENERATOR "")
set(CPACK_PACKAGE_DIRECTORY ${PROJECT_BINARY_DIR}/packages)
set(CPACK_STRIP_FILES ON)
set(CPACK_THREADS 0)
# The default component (every install rule without COMPONENT) and, in the .deb
# alone, `deb`; the Python package's component stays out (TovlPackagingPerGenerator).
set(CPACK_INSTALL_CMAKE_PROJECTS "${PROJECT_BINARY_DIR};tovl;Unspecified;/")
set(TOVL_PACKAGE_DEB_PROJECTS "${PROJECT_BINARY_DIR};tovl;Unspecified;/;${PROJECT_BINARY_DIR};tovl;deb;/")

# Archive: one top folder named after the file.
set(CPACK_ARCHIVE_FILE_NAME "tovl-${PROJECT_VERSION}-linux-${CMAKE_SYSTEM_PROCESSOR}")
set(CPACK_PACKAGE_FILE_NAME "tovl-${PROJECT_VERSION}-linux-${CMAKE_SYSTEM_PROCESSOR}")

# Debian: the dependencies are what dpkg-shlibdeps finds the binaries need
# (libc6, libcjson1); the vendor runtimes are opened at run time and are not
# dependencies. The shlibs file and the ldconfig trigger come from cpack.
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS ON)
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS_POLICY "=")
set(CPACK_DEBIAN_PACKAGE_SECTION libdevel)
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
set(CPACK_DEBIAN_PACKAGE_RELEASE "")
# gzip, not xz: a few seconds for the 45 MB of binaries instead of minutes.
set(CPACK_DEBIAN_COMPRESSION_TYPE gzip)
# The linker cache is refreshed by an ldconfig trigger, as Debian policy asks,
# not by the ldconfig calls cpack would write into postinst and postrm (its
# own scripts are left out when the package brings them).
set(CPACK_DEBIAN_PACKAGE_CONTROL_EXTRA ${PROJECT_SOURCE_DIR}/cmake/debian/triggers
    ${PROJECT_SOURCE_DIR}/cmake/debian/postinst ${PROJECT_SOURCE_DIR}/cmake/debian/postrm)
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)

configure_file(${PROJECT_SOURCE_DIR}/cmake/TovlPackagingPerGenerator.cmake.in
               ${PROJECT_BINARY_DIR}/TovlPackagingPerGenerator.cmake @ONLY)
set(CPACK_PROJECT_CONFIG_FILE ${PROJECT_BINARY_DIR}/TovlPackagingPerGenerator.cmake)
include(CPack)
