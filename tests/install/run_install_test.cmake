# cmake -P script run by the Install.FindPackageFromSeparateProject test; see tests.cmake.
cmake_minimum_required(VERSION 3.20)

foreach(var LAZYRT_BUILD_DIR LAZYRT_INSTALL_LIBDIR CONSUMER_SOURCE_DIR WORK_DIR CXX_COMPILER)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "run_install_test.cmake: -D${var}=... is required")
  endif()
endforeach()

# RUN_ENV (optional): NAME=VALUE entries separated by '|', the environment the consumer and the
# interpreter need (a sanitized library's runtime, preloaded).
string(REPLACE "|" ";" run_env "${RUN_ENV}")

set(prefix ${WORK_DIR}/prefix)
set(consumer_build ${WORK_DIR}/consumer-build)
if(IS_ABSOLUTE "${LAZYRT_INSTALL_LIBDIR}")
  message(FATAL_ERROR "absolute CMAKE_INSTALL_LIBDIR (${LAZYRT_INSTALL_LIBDIR}) cannot be relocated to a test prefix")
endif()
set(libdir ${prefix}/${LAZYRT_INSTALL_LIBDIR})

function(run_step what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "install test: ${what} failed (${rc})")
  endif()
endfunction()

# Start clean so that files left by an earlier run cannot hide a missing install rule.
file(REMOVE_RECURSE ${WORK_DIR})

run_step("cmake --install"
  ${CMAKE_COMMAND} --install ${LAZYRT_BUILD_DIR} --prefix ${prefix})

foreach(f
    ${libdir}/cmake/lazyrt/lazyrtConfig.cmake
    ${libdir}/cmake/lazyrt/lazyrtConfigVersion.cmake
    ${libdir}/cmake/lazyrt/lazyrtTargets.cmake
    ${libdir}/lazyrt-jitc
    ${prefix}/include/lazyrt/lazyrt.h)
  if(NOT EXISTS ${f})
    message(FATAL_ERROR "install test: ${f} was not installed")
  endif()
endforeach()
file(GLOB targets_files ${libdir}/cmake/lazyrt/lazyrtTargets-*.cmake)
if(NOT targets_files)
  message(FATAL_ERROR "install test: no per-configuration lazyrtTargets-*.cmake installed")
endif()

run_step("configuring the consumer"
  ${CMAKE_COMMAND} -S ${CONSUMER_SOURCE_DIR} -B ${consumer_build} -G Ninja
    -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_CXX_COMPILER=${CXX_COMPILER}
    -DCMAKE_FIND_PACKAGE_NO_PACKAGE_REGISTRY=ON)
# Guard against a lazyrt found elsewhere (/usr/local, a package registry).
file(STRINGS ${consumer_build}/CMakeCache.txt found_dir REGEX "^lazyrt_DIR:")
if(NOT found_dir STREQUAL "lazyrt_DIR:PATH=${libdir}/cmake/lazyrt")
  message(FATAL_ERROR "install test: consumer found the wrong package: ${found_dir}")
endif()
run_step("building the consumer" ${CMAKE_COMMAND} --build ${consumer_build})
# LD_LIBRARY_PATH makes the installed library, not the build tree's, the one that loads.
run_step("running the consumer"
  ${CMAKE_COMMAND} -E env LD_LIBRARY_PATH=${libdir} ${run_env} ${consumer_build}/consumer)

# The Python package: installed under the prefix, importable from there, and loading the
# installed library (found through the extension's RPATH, not LD_LIBRARY_PATH).
if(DEFINED PYTHON)
  set(pydir ${prefix}/${PYTHON_INSTALL_DIR})
  file(GLOB extension ${pydir}/lazyrt/_C*.so)
  if(NOT extension OR NOT EXISTS ${pydir}/lazyrt/__init__.py OR NOT EXISTS ${pydir}/lazyrt/nn/__init__.py)
    message(FATAL_ERROR "install test: the Python package was not installed into ${pydir}")
  endif()
  run_step("importing the installed Python package"
    ${CMAKE_COMMAND} -E env --unset=LD_LIBRARY_PATH PYTHONPATH=${pydir} PYTHONDONTWRITEBYTECODE=1 ${run_env}
      ${PYTHON} ${PYTHON_CHECK} ${prefix} ${libdir})
endif()
