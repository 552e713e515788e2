// The CPU kernel interface. A kernel is made once, at compile time, for one op with fixed
// operand types and attributes: everything that can be worked out before running (dtype
// dispatch, broadcast strides, batch offsets) is worked out then and captured. Running a
// kernel reads its input pointers, writes its output pointers and allocates nothing.
#pragma once

#include <cstddef>
#include <functional>
#include <vector>

#include "ir/graph.h"
#include "runtime/executable.h"

namespace lazyrt::kernels {

struct KernelSpec {
  ir::OpKind op;
  const ir::Attrs& attrs;
  std::vector<ir::TensorType> inputs;
  std::vector<ir::TensorType> outputs;
};

/// in: one pointer per input; out: one per output, then the workspace if one was asked for.
using KernelFn = runtime::KernelFn;

struct Kernel {
  KernelFn run;
  size_t workspace_bytes = 0;
};

/// The kernel of spec.op, through the table generated from ops.def.
Kernel make_kernel(const KernelSpec& spec);

}  // namespace lazyrt::kernels
