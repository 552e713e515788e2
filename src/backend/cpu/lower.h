// Lowering for the CPU kernels: an optimized graph becomes an Executable. Constants are filled
// once, steps numbered, the outputs' sources and donations decided (an output computed straight
// into a donated buffer, or aside and copied in at the end when the parameter is still read
// after), kernels made, in-place requests and workspaces planned in one arena. Regions (loop
// bodies) come compiled, in `regions`.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "ir/graph.h"
#include "runtime/executable.h"

namespace lazyrt::backend::cpu {

std::shared_ptr<runtime::Executable> lower(const ir::Graph& optimized, const std::vector<int32_t>& donations,
                                           const RegionExecutables& regions, const Backend& backend);

/// A backend of the CPU kernels named `name`; `caps` decides how much of a graph they see fused,
/// rewritten into gemm, or given to library kernels. Never freed (the registry keeps it).
const Backend* make_backend(std::string name, Capabilities caps);

}  // namespace lazyrt::backend::cpu
