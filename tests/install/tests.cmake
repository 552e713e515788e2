# Installs the built library into a prefix inside the build tree, then builds and runs a
# separate project against it through find_package(lazyrt).
add_test(NAME Install.FindPackageFromSeparateProject
  COMMAND ${CMAKE_COMMAND}
    -DLAZYRT_BUILD_DIR=${PROJECT_BINARY_DIR}
    -DLAZYRT_INSTALL_LIBDIR=${CMAKE_INSTALL_LIBDIR}
    -DCONSUMER_SOURCE_DIR=${CMAKE_CURRENT_LIST_DIR}/consumer
    -DWORK_DIR=${PROJECT_BINARY_DIR}/install-test
    -DCXX_COMPILER=${CMAKE_CXX_COMPILER}
    -P ${CMAKE_CURRENT_LIST_DIR}/run_install_test.cmake)
set_tests_properties(Install.FindPackageFromSeparateProject PROPERTIES TIMEOUT 300)
