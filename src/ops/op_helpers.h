// Internal helpers shared by the files of src/ops (defined in tensor_ops.cpp). Not part of
// the public API.
#pragma once

#include <vector>

#include "ir/graph.h"
#include "lazyrt/tensor.h"

namespace lazyrt::detail {

/// The state of a defined tensor; throws lazyrt::Error naming `what` for an undefined one.
trace::TensorImpl& impl_of(const Tensor& t, const char* what = "tensor");
/// Records one op of the table over these tensors, and for autograd when it must.
Tensor apply(ir::OpKind op, const std::vector<Tensor>& inputs, ir::Attrs attrs = {});
/// t itself when it has dtype `to`, else a cast.
Tensor cast_to(const Tensor& t, DType to);
/// A constant of the graph filled with `value`.
Tensor constant_tensor(double value, DType dtype, Shape shape = {});
/// d in [-rank, rank) made non-negative (a 0-dim tensor takes 0 and -1); throws naming `op`.
int64_t wrap_dim(int64_t d, const Shape& shape, const char* op);

/// Autocast (amp.h): t in the autocast dtype for ops that run in lower precision (matmul,
/// conv), or in f32 for ops that need the range (reductions, softmax, losses); t itself when
/// autocast is off or t is not floating.
Tensor autocast_lower(const Tensor& t);
Tensor autocast_f32(const Tensor& t);

}  // namespace lazyrt::detail
