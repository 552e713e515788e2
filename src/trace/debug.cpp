#include "lazyrt/debug.h"

#include <string_view>
#include <unordered_set>

#include "ir/op.h"
#include "runtime/buffer.h"
#include "trace/lazy_tensor.h"

namespace lazyrt::debug {
namespace {

std::vector<std::shared_ptr<trace::TensorImpl>> impls(const std::vector<Tensor>& ts) {
  std::vector<std::shared_ptr<trace::TensorImpl>> out;
  for (const Tensor& t : ts)
    if (t.defined()) out.push_back(trace::impl_of(t));
  return out;
}

// A region shared by several nodes (the calls of one traced function) counts once.
int64_t count_nodes(const ir::Graph& g, std::unordered_set<const ir::Graph*>& seen) {
  int64_t n = static_cast<int64_t>(g.nodes.size());
  for (const ir::Node& node : g.nodes)
    for (const auto& r : node.regions)
      if (seen.insert(r.get()).second) n += count_nodes(*r, seen);
  return n;
}

}  // namespace

std::vector<OpRow> op_table() {
  static constexpr const char* kApi[] = {
#define OP(Enum, name, operands, rule, flags, attrs, aten, api, grad) #api,
#include "lazyrt/ops.def"
#undef OP
  };
  static constexpr bool kDifferentiable[] = {
#define OP(Enum, name, operands, rule, flags, attrs, aten, api, grad) std::string_view(#grad) != "NONE",
#include "lazyrt/ops.def"
#undef OP
  };
  std::vector<OpRow> rows;
  for (int i = 0; i < ir::kNumOps; ++i) {
    const auto op = static_cast<ir::OpKind>(i);
    const ir::OpInfo& info = ir::op_info(op);
    rows.push_back({std::string(info.name), std::string(info.aten), kApi[i], info.operands,
                    ir::has_flag(op, ir::kElementwise), kDifferentiable[i]});
  }
  return rows;
}

std::string graph_text(const std::vector<Tensor>& tensors) {
  return ir::to_text(trace::pending_graph(impls(tensors)));
}

std::string polymorphic_graph_text(const std::vector<Tensor>& tensors) {
  std::vector<std::shared_ptr<trace::TensorImpl>> pending = trace::pending_only(impls(tensors));
  if (pending.empty()) return "not polymorphic: nothing is pending";
  std::string why;
  std::optional<compile::PolymorphicGraph> pg = trace::polymorphic_graph(trace::extract_graph(pending), &why);
  return pg ? ir::to_text(pg->graph) : "not polymorphic: " + why;
}

std::string last_polymorphic_refusal() { return trace::last_polymorphic_refusal(); }

int64_t graph_node_count(const std::vector<Tensor>& tensors) {
  std::unordered_set<const ir::Graph*> seen;
  return count_nodes(trace::pending_graph(impls(tensors)), seen);
}

int64_t live_memory_bytes() { return runtime::memory_stats().live_bytes; }
int64_t peak_memory_bytes() { return runtime::memory_stats().peak_bytes; }
void reset_peak_memory() { runtime::reset_peak_memory(); }
void release_free_heap() { runtime::release_free_heap(); }

}  // namespace lazyrt::debug
