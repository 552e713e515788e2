// Lowering of ops that own regions into a step: a while's regions are compiled into
// sub-executables that the step's kernel runs; a fusion's region becomes one fused kernel.
#pragma once

#include <memory>
#include <vector>

#include "backend/backend.h"
#include "ir/graph.h"
#include "backend/cpu/kernels/kernel.h"
#include "backend/cpu/jit/jit.h"

namespace lazyrt::backend::cpu {

/// Regions that are graphs of their own (loop bodies) come compiled in `compiled` (node's entry of
/// RegionExecutables). A fusion's region goes into `generated` (the graph's module of generated
/// kernels) when there is one.
kernels::Kernel lower_control_flow(const ir::Node& node, const std::vector<ir::TensorType>& operands,
                                   const std::vector<std::shared_ptr<runtime::Executable>>& compiled,
                                   const Backend& backend, const std::shared_ptr<jit::Module>& generated);

}  // namespace lazyrt::backend::cpu
