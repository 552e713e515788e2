// The lazyrt device's C++ side (torch_device.cpp): what lazyrt._torch_C's module binds.
#pragma once

#include <pybind11/pybind11.h>

namespace lazyrt_torch {

// The Python function that computes the ops reaching the device's boxed kernel:
// fn(op name "aten::add.Tensor", positional args tuple, keyword args dict) -> the result.
void set_device_dispatcher(pybind11::object fn);

}  // namespace lazyrt_torch
