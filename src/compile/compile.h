// Compile: verify, optimize with the backend's capabilities, order reads of donated buffers
// before their updates, compile the loop regions, and hand the graph with them to the backend
// to lower into an Executable.
#pragma once

#include <memory>
#include <vector>

#include "backend/backend.h"
#include "ir/graph.h"
#include "runtime/executable.h"

namespace lazyrt::compile {

/// donations[k] = p offers parameter p's buffer for output k (-1: none). Each parameter is
/// offered at most once. The executable accepts an offer unless another output returns that
/// parameter unchanged; when the output cannot be computed in place safely (the parameter is
/// still read after it is produced), it is computed aside and copied in at the end.
/// The passes run with the backend's capabilities, and the backend lowers the result.
std::shared_ptr<runtime::Executable> compile(const ir::Graph& graph,
                                             const std::vector<int32_t>& donations = {},
                                             const backend::Backend& backend = backend::current());

/// An optimized graph (compile()'s, or one the disk cache kept) lowered by `backend`: the graphs
/// of its loop regions compiled first, each with compile(), and handed to the backend
/// (backend::RegionExecutables), so that lowering never calls back into compile.
std::shared_ptr<runtime::Executable> lower(const ir::Graph& optimized, const std::vector<int32_t>& donations = {},
                                           const backend::Backend& backend = backend::current());

}  // namespace lazyrt::compile
