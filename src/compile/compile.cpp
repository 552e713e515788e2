#include "compile/compile.h"

#include "compile/passes.h"
#include "util/check.h"

namespace lazyrt::compile {

using ir::Graph;

std::shared_ptr<runtime::Executable> compile(const Graph& graph, const std::vector<int32_t>& donations,
                                             const backend::Backend& backend) {
  ir::verify(graph);
  Graph optimized = order_reads_before_updates(optimize(graph, backend.capabilities()), donations);
  ir::verify(optimized);
  return backend.lower(optimized, donations);
}

}  // namespace lazyrt::compile
