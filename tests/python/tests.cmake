# The Python tests: pytest over tests/python, one ctest test per file (so that ctest -j runs
# them side by side), against the package in the build tree; the public-example programs of
# tests/python/programs run as one test, Python.programs (each file is small: a process apiece
# would start Python and PyTorch once more per program). Included from tests/CMakeLists.txt;
# needs the Python package (LAZYRT_BUILD_PYTHON). In a sanitized build the interpreter runs with
# LAZYRT_UNINSTRUMENTED_ENV (tests/CMakeLists.txt).
function(lazyrt_py_test name)
  add_test(NAME Python.${name}
    COMMAND ${CMAKE_COMMAND} -E env PYTHONPATH=${LAZYRT_PYTHON_BUILD_DIR} PYTHONDONTWRITEBYTECODE=1
            ${LAZYRT_UNINSTRUMENTED_ENV} ${LAZYRT_PYTHON_EXECUTABLE} -m pytest -q -p no:cacheprovider ${ARGN}
    WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
  math(EXPR timeout "600 * ${LAZYRT_TEST_TIMEOUT_SCALE}")
  set_tests_properties(Python.${name} PROPERTIES TIMEOUT ${timeout})
endfunction()
if(TARGET lazyrt_python)
  file(GLOB LAZYRT_PY_TEST_FILES CONFIGURE_DEPENDS ${CMAKE_CURRENT_LIST_DIR}/test_*.py
       ${CMAKE_CURRENT_LIST_DIR}/upstream/test_*.py)
  foreach(f ${LAZYRT_PY_TEST_FILES})
    get_filename_component(name ${f} NAME_WE)
    # The benchmark suite's smoke test runs the benchmarks' own libraries: only where they are built.
    if(name STREQUAL "test_bench_suite" AND NOT LAZYRT_BUILD_BENCH)
      continue()
    endif()
    lazyrt_py_test(${name} ${f})
  endforeach()
  file(GLOB LAZYRT_PY_PROGRAM_FILES CONFIGURE_DEPENDS ${CMAKE_CURRENT_LIST_DIR}/programs/test_*.py)
  lazyrt_py_test(programs ${LAZYRT_PY_PROGRAM_FILES})
endif()
