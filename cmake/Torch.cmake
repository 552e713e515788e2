# libtorch from the PyTorch package that ${Python_EXECUTABLE} imports (PyPI's wheel in the
# project's environment), as imported targets:
#   lazyrt::torch         libtorch's C++ API (libtorch, libtorch_cpu, libc10)
#   lazyrt::torch_python  the above and libtorch_python (PyTorch's Python bindings' C++ side)
# LAZYRT_TORCH_FOUND and LAZYRT_TORCH_VERSION say whether and which. PyTorch's own
# TorchConfig.cmake is not used: the CUDA wheel's config looks for a CUDA toolkit and takes
# libtorch from the system's library paths when it finds one there.
set(LAZYRT_TORCH_FOUND FALSE)
if(Python_EXECUTABLE)
  execute_process(
    COMMAND ${Python_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/torch_info.py
    OUTPUT_VARIABLE torch_info ERROR_QUIET RESULT_VARIABLE torch_rc OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(torch_rc EQUAL 0)
    string(REPLACE "\n" ";" torch_info "${torch_info}")
    list(GET torch_info 0 torch_dir)
    list(GET torch_info 1 LAZYRT_TORCH_VERSION)
    list(GET torch_info 2 torch_abi)
    set(torch_libs ${torch_dir}/lib/libtorch.so ${torch_dir}/lib/libtorch_cpu.so ${torch_dir}/lib/libc10.so)
    set(torch_python_lib ${torch_dir}/lib/libtorch_python.so)
    set(all_there TRUE)
    foreach(f ${torch_libs} ${torch_python_lib} ${torch_dir}/include/ATen/ATen.h)
      if(NOT EXISTS ${f})
        set(all_there FALSE)
      endif()
    endforeach()
    if(all_there)
      set(LAZYRT_TORCH_FOUND TRUE)
      if(NOT TARGET lazyrt::torch)
        add_library(lazyrt::torch INTERFACE IMPORTED GLOBAL)
        set_target_properties(lazyrt::torch PROPERTIES
          INTERFACE_INCLUDE_DIRECTORIES "${torch_dir}/include;${torch_dir}/include/torch/csrc/api/include"
          INTERFACE_LINK_LIBRARIES "${torch_libs}"
          INTERFACE_COMPILE_DEFINITIONS "_GLIBCXX_USE_CXX11_ABI=${torch_abi}")
        add_library(lazyrt::torch_python INTERFACE IMPORTED GLOBAL)
        set_target_properties(lazyrt::torch_python PROPERTIES
          INTERFACE_LINK_LIBRARIES "lazyrt::torch;${torch_python_lib}")
      endif()
      message(STATUS "PyTorch ${LAZYRT_TORCH_VERSION} (${torch_dir}) for lazyrt.torch and the benchmarks")
    endif()
  endif()
endif()
if(NOT LAZYRT_TORCH_FOUND)
  message(STATUS "PyTorch not importable by ${Python_EXECUTABLE}: lazyrt.torch and the libtorch benchmarks are left out")
endif()
