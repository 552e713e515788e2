# Installs the built library into a prefix inside the build tree, then builds and runs a
# separate project against it through find_package(lazyrt). With the Python package, it also
# imports the installed package from the prefix.
set(LAZYRT_INSTALL_TEST_PYTHON_ARGS)
if(TARGET lazyrt_python)
  set(LAZYRT_INSTALL_TEST_PYTHON_ARGS
    -DPYTHON=${LAZYRT_PYTHON_EXECUTABLE} -DPYTHON_INSTALL_DIR=${LAZYRT_PYTHON_INSTALL_DIR}
    -DPYTHON_CHECK=${CMAKE_CURRENT_LIST_DIR}/check_python_package.py)
endif()
# The consumer and the interpreter run with LAZYRT_UNINSTRUMENTED_ENV (a sanitized build),
# passed with '|' between entries, as ';' would split the argument.
string(JOIN "|" run_env ${LAZYRT_UNINSTRUMENTED_ENV})
add_test(NAME Install.FindPackageFromSeparateProject
  COMMAND ${CMAKE_COMMAND}
    ${LAZYRT_INSTALL_TEST_PYTHON_ARGS}
    -DLAZYRT_BUILD_DIR=${PROJECT_BINARY_DIR}
    -DLAZYRT_INSTALL_LIBDIR=${CMAKE_INSTALL_LIBDIR}
    -DCONSUMER_SOURCE_DIR=${CMAKE_CURRENT_LIST_DIR}/consumer
    -DWORK_DIR=${PROJECT_BINARY_DIR}/install-test
    -DCXX_COMPILER=${CMAKE_CXX_COMPILER}
    "-DRUN_ENV=${run_env}"
    -P ${CMAKE_CURRENT_LIST_DIR}/run_install_test.cmake)
math(EXPR timeout "300 * ${LAZYRT_TEST_TIMEOUT_SCALE}")
set_tests_properties(Install.FindPackageFromSeparateProject PROPERTIES TIMEOUT ${timeout})
