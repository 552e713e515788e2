// The CPU kernel interface. A kernel is made once, at compile time, for one op with fixed
// operand types and attributes: everything that can be worked out before running (dtype
// dispatch, broadcast strides, batch offsets) is worked out then and captured. Running a
// kernel reads its input pointers, writes its output pointers and allocates nothing.
#pragma once

#include <cstddef>
#include <functional>
#include <optional>
#include <vector>

#include "ir/graph.h"
#include "runtime/executable.h"

namespace lazyrt::kernels {

struct KernelSpec {
  ir::OpKind op;
  const ir::Attrs& attrs;
  std::vector<ir::TensorType> inputs;
  std::vector<ir::TensorType> outputs;
  /// The backend takes library kernels (oneDNN's convolutions and f32 GEMMs) where they serve
  /// the op; the reference backend does not, and runs the hand-written ones.
  bool library = false;
};

/// in: one pointer per input; out: one per output, then the workspace if one was asked for.
using KernelFn = runtime::KernelFn;

struct Kernel {
  KernelFn run;
  size_t workspace_bytes = 0;
};

/// The kernel of spec.op, through the table generated from ops.def (or a library's, when
/// spec.library and the library serves the op).
Kernel make_kernel(const KernelSpec& spec);

/// conv2d and its backward ops through oneDNN (onednn_conv.cpp): nullopt where oneDNN does
/// not serve the operands (only f32, no empty tensors) or the geometry.
std::optional<Kernel> make_onednn_conv(const KernelSpec& spec);

}  // namespace lazyrt::kernels
