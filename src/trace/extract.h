// Flattening pending IR into an ir::Graph.
//
// The DAG reachable from some roots is walked in post order (iteratively: unrolled host loops
// make deep chains) and every distinct node is emitted once. Which nodes are expanded and
// what a leaf becomes is the caller's policy: at a sync, device-data leaves become parameters;
// inside a loop region, placeholders become the carries and everything from outside the
// region becomes a captured value.
//
// A flattener builds the graph, or only hashes it: the nodes go through ir::hash_node in the
// order and with the numbering the built graph would have, so the hash equals hash_graph of
// that graph, without copying a node. A sync hashes first and builds the graph only when no
// executable is cached for the hash.
#pragma once

#include <functional>
#include <memory>
#include <unordered_map>
#include <vector>

#include "ir/graph.h"
#include "ir/hash.h"
#include "trace/lazy_tensor.h"
#include "util/ptr_map.h"

namespace lazyrt::trace {

class Flattener {
 public:
  enum class Mode { Build, HashOnly };
  /// expand(node): emit the node and walk its operands; otherwise the node is a leaf and
  /// leaf(value, flattener) returns what stands for that value in the graph (made with
  /// emit_parameter).
  Flattener(std::function<bool(const LazyNode&)> expand,
            std::function<ir::ValueRef(const LazyValue&, Flattener&)> leaf, Mode mode = Mode::Build);
  ~Flattener();
  Flattener(const Flattener&) = delete;
  Flattener& operator=(const Flattener&) = delete;

  /// Flattens everything `root` depends on; returns the graph value standing for it.
  ir::ValueRef add_root(const LazyValue& root);
  /// Emits a Parameter node of this index and type.
  ir::ValueRef emit_parameter(int64_t index, const ir::TensorType& type);

  /// Build mode: the graph (its outputs and num_params left to the caller).
  ir::Graph& graph() { return graph_; }
  /// HashOnly mode: hash_graph of the graph Build mode makes, with these outputs and
  /// num_params.
  GraphHash graph_hash(const std::vector<ir::ValueRef>& outputs, int64_t num_params) const;

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
  // The graph value of `v`, whose node is at position p.
  ir::ValueRef value_at(int32_t p, const LazyValue& v);
  static size_t& last_visited();

  std::function<bool(const LazyNode&)> expand_;
  std::function<ir::ValueRef(const LazyValue&, Flattener&)> leaf_;
  Mode mode_;
  ir::Graph graph_;
  ir::Hasher hasher_;                        // HashOnly: the nodes so far
  int32_t emitted_ = 0;                      // nodes so far
  std::vector<ir::ValueRef> operands_;       // HashOnly: scratch
  std::vector<Visited> visited_;
  util::PtrMap<int32_t> pos_;     // node -> position
  std::vector<int32_t> node_of_;  // position -> graph node
  // A leaf's graph values: result 0 by position (most leaves have one result), the others by
  // (position, result).
  std::vector<ir::ValueRef> leaf0_;
  std::unordered_map<int64_t, ir::ValueRef> leaf_values_;
  // add_root's walk: a node, its next operand to visit, where its operands' positions start
  // in operand_pos_, and whether it is expanded.
  struct Frame {
    const std::shared_ptr<LazyNode>* ref;
    size_t next;
    uint32_t first;
    bool expanded;
  };
  std::vector<Frame> stack_;
  std::vector<int32_t> operand_pos_;
};

}  // namespace lazyrt::trace
