#include "compile/compile.h"

#include <algorithm>

#include "compile/passes.h"
#include "util/check.h"

namespace lazyrt::compile {

using ir::Graph;

namespace {

// Every node of the graph, as traced, is one the backend runs (fusion nodes and rewrites come
// later, from the backend's own capabilities).
void check_supported(const Graph& graph, const backend::Backend& backend) {
  for (size_t i = 0; i < graph.nodes.size(); ++i) {
    const ir::Node& n = graph.nodes[i];
    if (n.op == ir::OpKind::Parameter) continue;
    std::vector<DType> dtypes;
    for (const ir::ValueRef& v : n.operands) dtypes.push_back(graph.type(v).dtype);
    if (backend.supports(n.op, dtypes)) continue;
    std::string types;
    for (DType d : dtypes) types += (types.empty() ? "" : ", ") + std::string(dtype_name(d));
    throw Error(detail::str_cat("compile: the ", backend.name(), " backend does not run ", ir::op_name(n.op),
                                " on (", types, ") (node ", i, ")"));
  }
}

}  // namespace

std::shared_ptr<runtime::Executable> compile(const Graph& traced, const std::vector<int32_t>& donations,
                                             const backend::Backend& backend) {
  ir::verify(traced);
  const bool calls = std::any_of(traced.nodes.begin(), traced.nodes.end(), [](const ir::Node& n) { return n.op == ir::OpKind::Call; });
  const Graph inlined = calls ? inline_calls(traced) : Graph();
  const Graph& graph = calls ? inlined : traced;
  check_supported(graph, backend);
  Graph optimized = order_reads_before_updates(optimize(graph, backend.capabilities()), donations);
  ir::verify(optimized);
  return lower(optimized, donations, backend);
}

std::shared_ptr<runtime::Executable> lower(const Graph& optimized, const std::vector<int32_t>& donations,
                                           const backend::Backend& backend) {
  backend::RegionExecutables regions(optimized.nodes.size());
  for (size_t i = 0; i < optimized.nodes.size(); ++i) {
    const ir::Node& n = optimized.nodes[i];
    switch (n.op) {
      case ir::OpKind::While:
        regions[i] = {compile(*n.regions[0], {}, backend), compile(*n.regions[1], {}, backend)};
        break;
      case ir::OpKind::Scan: regions[i] = {compile(*n.regions[0], {}, backend)}; break;
      case ir::OpKind::ScanVjp: {
        // The forward's carries only: the backward rebuilds them; its stacked rows are not needed.
        Graph fwd = *n.regions[1];
        fwd.outputs.resize(static_cast<size_t>(ir::NodeAttrs(n.op, n.attrs).i<"states">()));
        regions[i] = {compile(*n.regions[0], {}, backend), compile(fwd, {}, backend)};
        break;
      }
      default: break;  // fusion regions are the backend's; calls were inlined
    }
  }
  return backend.lower(optimized, donations, regions);
}

}  // namespace lazyrt::compile
