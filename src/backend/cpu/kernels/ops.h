// One kernel maker per row of ops.def. A row without a maker is a link error.
#pragma once

#include <memory>

#include "backend/cpu/kernels/kernel.h"

namespace lazyrt::jit {
class Module;
}

namespace lazyrt::kernels {

#define OP(Enum, name, operands, rule, flags, attrs, aten, api, grad) Kernel make_##Enum(const KernelSpec& spec);
#include "lazyrt/ops.def"
#undef OP

/// Limits of one fusion node, which the fusion pass keeps to: elementwise ops in its region,
/// and operands (constants are not operands).
inline constexpr int kMaxFusedOps = 24;
inline constexpr int kMaxFusedInputs = 8;

/// The kernel of a fusion node with this region and attributes (fused.cpp; with reduced dims,
/// fused_rows.cpp); with a module, its elementwise loops are generated as machine code there
/// where the generator takes them.
Kernel make_fused(const ir::Graph& region, const std::vector<ir::TensorType>& inputs,
                  const std::vector<ir::TensorType>& outputs, const ir::Attrs& attrs,
                  const std::shared_ptr<jit::Module>& module = nullptr);
Kernel make_fused_rows(const ir::Graph& region, const std::vector<ir::TensorType>& inputs,
                       const std::vector<ir::TensorType>& outputs, const ir::Attrs& attrs,
                       const std::shared_ptr<jit::Module>& module);

/// The range check of an indexing node (index_select, gather, the scatter family, index_add)
/// on its own: a kernel that reads only the node's index (in[0]) and throws as the node's
/// kernel would. Lowering runs it before the graph's first step when the index is a graph
/// parameter, so a bad index is refused before any output is written.
runtime::KernelFn make_index_check(const KernelSpec& node);

}  // namespace lazyrt::kernels
