# Included right after project(tovl) when scikit-build-core builds the Python
# package (CMAKE_PROJECT_tovl_INCLUDE, set in python/pyproject.toml). At the end
# of the top directory, once the shared library target exists, it installs that
# one file into the package as tovl/libtovl.so, in its own component: a wheel
# holds no symlinks, so the versioned name chain would become three copies.
function(tovl_wheel_install)
  install(FILES $<TARGET_FILE:tovl> DESTINATION tovl RENAME libtovl.so COMPONENT python)
endfunction()
cmake_language(DEFER DIRECTORY ${CMAKE_SOURCE_DIR} CALL tovl_wheel_install)
