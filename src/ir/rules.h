// The result rules of the op table: ir::rules::Rule for each Rule named in ops.def (several ops
// may share one). Defined in infer.cpp (elementwise, reductions, linear algebra, shapes,
// control flow) and infer_nn.cpp (data movement, indexing, convolution and pooling);
// infer_types() calls the op's rule through its OpInfo.
#pragma once

#include <span>
#include <vector>

#include "ir/graph.h"

namespace lazyrt::ir::rules {

#define OP(Enum, name, operands, rule, flags, attrs, aten, api, grad) \
  std::vector<TensorType> rule(OpKind op, std::span<const TensorType> ops, const NodeAttrs& at);
#include "lazyrt/ops.def"
#undef OP

}  // namespace lazyrt::ir::rules
