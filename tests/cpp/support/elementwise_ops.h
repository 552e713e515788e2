// The elementwise ops the fused kernels run (the scalar function table), and the attribute
// variants each is tested with: shared by the tests of generated code against the interpreter.
#pragma once

#include <vector>

#include "scalar/elementwise_fns.h"
#include "ir/graph.h"

namespace lazyrt::testing {

/// Every op with a row in the elementwise function table.
inline std::vector<ir::OpKind> table_ops() {
  std::vector<ir::OpKind> ops;
  for (int i = 0; i < ir::kNumOps; ++i)
    if (scalar::has_elementwise_fn(static_cast<ir::OpKind>(i))) ops.push_back(static_cast<ir::OpKind>(i));
  return ops;
}

/// The attributes an op is tested with (one empty set for an op without attributes).
inline std::vector<ir::Attrs> attr_variants(ir::OpKind op) {
  switch (op) {
    case ir::OpKind::Gelu: return {{false}, {true}};
    case ir::OpKind::Softplus: return {{1.0, 20.0}, {2.0, 5.0}};
    case ir::OpKind::Clamp: return {{true, true}, {true, false}, {false, true}};
    default: return {{}};
  }
}

}  // namespace lazyrt::testing
