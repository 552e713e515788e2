// Small hand-built graphs shared by the IR and compile tests.
#pragma once

#include "ir/graph.h"

namespace lazyrt::testing {

inline ir::TensorType f32(Shape s) { return {DType::f32, std::move(s)}; }

}  // namespace lazyrt::testing
