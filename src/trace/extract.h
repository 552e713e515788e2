// Flattening pending IR into an ir::Graph.
//
// The DAG reachable from some roots is walked in post order (iteratively: unrolled host loops
// make deep chains) and every distinct node is emitted once. Which nodes are expanded and
// what a leaf becomes is the caller's policy: at a sync, device-data leaves become parameters;
// inside a loop region, placeholders become the carries and everything from outside the
// region becomes a captured value.
#pragma once

#include <functional>
#include <memory>
#include <unordered_map>
#include <vector>

#include "ir/graph.h"
#include "trace/lazy_tensor.h"
#include "util/ptr_map.h"

namespace lazyrt::trace {

class Flattener {
 public:
  /// expand(node): emit the node and walk its operands; otherwise the node is a leaf and
  /// leaf(value, graph) returns what stands for that value in the graph.
  Flattener(std::function<bool(const LazyNode&)> expand,
            std::function<ir::ValueRef(const LazyValue&, ir::Graph&)> leaf);

  /// Flattens everything `root` depends on; returns the graph value standing for it.
  ir::ValueRef add_root(const LazyValue& root);

  ir::Graph& graph() { return graph_; }

  /// Every distinct node visited (expanded or leaf), in post order, each with one owning
  /// reference, and how many references to it this walk accounts for (edges from expanded
  /// nodes and roots). Used to tell which nodes outlive a sync.
  struct Visited {
    const std::shared_ptr<LazyNode>* ref;
    int64_t internal_refs;
  };
  const std::vector<Visited>& visited() const { return visited_; }
  int32_t position(const LazyNode* n) { return *pos_.find(n); }

 private:
  ir::ValueRef value_of(const LazyValue& v);

  std::function<bool(const LazyNode&)> expand_;
  std::function<ir::ValueRef(const LazyValue&, ir::Graph&)> leaf_;
  ir::Graph graph_;
  std::vector<Visited> visited_;
  util::PtrMap<int32_t> pos_;     // node -> position
  std::vector<int32_t> node_of_;  // position -> graph node
  // A leaf's graph values: result 0 by position (most leaves have one result), the others by
  // (position, result).
  std::vector<ir::ValueRef> leaf0_;
  std::unordered_map<int64_t, ir::ValueRef> leaf_values_;
};

}  // namespace lazyrt::trace
