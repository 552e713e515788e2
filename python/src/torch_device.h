// The lazyrt device's C++ side (torch_device.cpp): what lazyrt._torch_C's module binds.
#pragma once

#include <ATen/core/Tensor.h>
#include <pybind11/pybind11.h>

namespace lazyrt_torch {

// The Python function that computes the ops reaching the device's boxed kernel:
// fn(op name "aten::add.Tensor", positional args tuple, keyword args dict) -> the result.
void set_device_dispatcher(pybind11::object fn);

// A device tensor's shape changed in place (t_, unsqueeze_, squeeze_, transpose_, resize_), with
// contiguous strides, as the device's tensors report: its metadata only; its lazyrt value is
// rebound by the caller.
void set_device_shape(const at::Tensor& t, c10::IntArrayRef sizes);

}  // namespace lazyrt_torch
