// Internals shared by the files implementing the public ops (src/ops/).
#pragma once

#include <vector>

#include "ir/graph.h"
#include "lazyrt/tensor.h"

namespace lazyrt::detail {

/// Records one op of the table over these tensors, and for autograd when it must.
Tensor apply(ir::OpKind op, const std::vector<Tensor>& inputs, ir::Attrs attrs = {});
/// t itself when it already has dtype `to`, else a cast.
Tensor cast_to(const Tensor& t, DType to);
/// A constant of the graph (a scalar operand, zeros, ...).
Tensor constant_tensor(double value, DType dtype, Shape shape = {});

/// Autocast (amp.h): t in the autocast dtype for ops that run in lower precision (matmul,
/// conv), or in f32 for ops that need the range (reductions, softmax, losses); t itself when
/// autocast is off or t is not floating.
Tensor autocast_lower(const Tensor& t);
Tensor autocast_f32(const Tensor& t);

}  // namespace lazyrt::detail
