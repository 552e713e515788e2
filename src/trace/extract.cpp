#include "trace/extract.h"

#include "util/check.h"

namespace lazyrt::trace {

Flattener::Flattener(std::function<bool(const LazyNode&)> expand,
                     std::function<ir::ValueRef(const LazyValue&, ir::Graph&)> leaf)
    : expand_(std::move(expand)), leaf_(std::move(leaf)) {}

ir::ValueRef Flattener::value_of(const LazyValue& v) {
  const LazyNode* n = v.node.get();
  const int32_t p = pos_.at(n);
  if (node_of_[p] >= 0) return {node_of_[p], v.index};
  // A leaf: one graph value per result used.
  auto& vals = leaf_values_[n];
  if (vals.size() <= static_cast<size_t>(v.index)) vals.resize(v.index + 1, {-1, 0});
  if (vals[v.index].node < 0) vals[v.index] = leaf_(v, graph_);
  return vals[v.index];
}

ir::ValueRef Flattener::add_root(const LazyValue& root) {
  std::vector<std::pair<const std::shared_ptr<LazyNode>*, size_t>> stack;
  if (!pos_.count(root.node.get())) stack.push_back({&root.node, 0});
  while (!stack.empty()) {
    auto [ref, k] = stack.back();
    const LazyNode* n = ref->get();
    const bool expanded = expand_(*n);
    if (expanded && k < n->operands.size()) {
      stack.back().second++;
      const auto& child = n->operands[k].node;
      if (!pos_.count(child.get())) stack.push_back({&child, 0});
      continue;
    }
    stack.pop_back();
    if (pos_.count(n)) continue;
    const auto p = static_cast<int32_t>(visited_.size());
    pos_[n] = p;
    visited_.push_back({ref, 0});
    node_of_.push_back(-1);
    if (!expanded) continue;
    ir::Node node;
    node.op = n->op;
    node.attrs = n->attrs;
    node.results = n->types;
    node.regions = n->regions;
    for (const LazyValue& v : n->operands) {
      visited_[pos_.at(v.node.get())].internal_refs++;
      node.operands.push_back(value_of(v));
    }
    graph_.nodes.push_back(std::move(node));
    node_of_[p] = static_cast<int32_t>(graph_.nodes.size() - 1);
  }
  visited_[pos_.at(root.node.get())].internal_refs++;
  return value_of(root);
}

}  // namespace lazyrt::trace
