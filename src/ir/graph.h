// The IR: a Graph is a flat, topologically ordered list of Nodes (every operand refers to an
// earlier node), a list of outputs, and a parameter count. Graphs are plain values: passes
// take a graph and return a new one. Regions (loop bodies) are graphs owned by their node.
#pragma once

#include <atomic>

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "ir/op.h"
#include "lazyrt/types.h"
#include "util/pool.h"

namespace lazyrt::ir {

struct TensorType {
  DType dtype = DType::f32;
  Shape shape;
  int64_t numel() const { return shape_numel(shape); }
  /// Checked: throws lazyrt::Error beyond kMaxTensorBytes (shape_bytes).
  size_t bytes() const { return shape_bytes(shape, dtype); }
  bool operator==(const TensorType& o) const { return dtype == o.dtype && shape == o.shape; }
  bool operator!=(const TensorType& o) const { return !(*this == o); }
};
std::string type_str(const TensorType& t);  // "f32[2, 3]"
std::string types_str(std::span<const TensorType> ts);  // "f32[2, 3], i64[4]"

using AttrValue = std::variant<int64_t, double, bool, DType, std::vector<int64_t>>;

/// Attributes of a node, positional in the order its ops.def row declares them.
struct Attrs {
  std::vector<AttrValue> values;

  Attrs() = default;
  Attrs(std::initializer_list<AttrValue> v) : values(v) {}
  bool operator==(const Attrs& o) const { return values == o.values; }
};

// Positional reads are for code that walks every attribute (hashing, printing, serializing);
// everything else reads attributes by name through NodeAttrs.
template <AttrName N, AttrKind K, class T>
const T& NodeAttrs::read() const {
  static_assert(attr_specs::declared(N.view(), K), "no op declares an attribute of this name and kind");
  // Where each op keeps attribute N: looked up by name on the op's first read, then remembered
  // (-1: not yet). Result rules read attributes on every recorded op.
  struct Where {
    std::atomic<int32_t> at[kNumOps];
    Where() {
      for (auto& a : at) a.store(-1, std::memory_order_relaxed);
    }
  };
  static Where where;
  std::atomic<int32_t>& slot = where.at[static_cast<size_t>(op_)];
  int32_t k = slot.load(std::memory_order_relaxed);
  if (k < 0) {
    k = static_cast<int32_t>(index(N.view(), K));
    slot.store(k, std::memory_order_relaxed);
  }
  return std::get<T>(attrs_.values.at(static_cast<size_t>(k)));
}
template <AttrName N>
int64_t NodeAttrs::i() const { return read<N, AttrKind::Int, int64_t>(); }
template <AttrName N>
double NodeAttrs::f() const { return read<N, AttrKind::Float, double>(); }
template <AttrName N>
bool NodeAttrs::b() const { return read<N, AttrKind::Bool, bool>(); }
template <AttrName N>
auto NodeAttrs::dtype() const { return read<N, AttrKind::DType, DType>(); }
template <AttrName N>
const std::vector<int64_t>& NodeAttrs::ints() const { return read<N, AttrKind::Ints, std::vector<int64_t>>(); }

/// A result of a node: node index and result index.
struct ValueRef {
  int32_t node = -1;
  int32_t index = 0;
  bool operator==(const ValueRef& o) const { return node == o.node && index == o.index; }
  bool operator!=(const ValueRef& o) const { return !(*this == o); }
  bool operator<(const ValueRef& o) const {
    return node != o.node ? node < o.node : index < o.index;
  }
};

struct Graph;

struct Node {
  OpKind op = OpKind::Parameter;
  std::vector<ValueRef> operands;
  Attrs attrs;
  std::vector<TensorType> results;
  std::vector<std::shared_ptr<const Graph>> regions;
};

/// A graph's hash kept with it once it no longer changes (ir::seal). A copy starts without one,
/// so a copy that is then changed never carries its source's hash.
struct HashMemo {
  std::optional<GraphHash> value;
  HashMemo() = default;
  HashMemo(const HashMemo&) {}
  HashMemo& operator=(const HashMemo&) {
    value.reset();
    return *this;
  }
};

struct Graph {
  std::vector<Node> nodes;
  std::vector<ValueRef> outputs;
  int64_t num_params = 0;
  /// Set by seal() only: a region shared by many nodes is hashed once, not once per node.
  HashMemo hash_memo;

  const TensorType& type(ValueRef v) const { return nodes.at(v.node).results.at(v.index); }
  const Node& node(ValueRef v) const { return nodes.at(v.node); }

  /// Appends a node; infers its result types (throws lazyrt::Error on bad operands).
  ValueRef add(OpKind op, std::vector<ValueRef> operands, Attrs attrs = {});
  /// Appends the next parameter (index num_params).
  ValueRef add_parameter(TensorType type);
  /// Appends a constant filled with `value`.
  ValueRef add_full(double value, Shape shape, DType dtype);
};

/// Whether running `n` may throw because of the values it meets (an op flagged kChecked, here
/// or in one of its regions).
bool may_fail(const Node& n);

/// Result types of `op` applied to operands of these types; throws lazyrt::Error naming the op
/// and the types when they do not fit. The one shape rule, used by tracing and by passes.
std::vector<TensorType> infer_types(OpKind op, std::span<const TensorType> operands,
                                    const Attrs& attrs);

/// A copy of `s` in a vector that kept its capacity (util::VectorStash): result rules make a
/// shape for every recorded op, and dropped nodes and tensors give theirs back.
inline Shape stashed_shape(std::span<const int64_t> s) {
  Shape out = s.empty() ? Shape() : util::VectorStash<Shape>::take();
  out.assign(s.begin(), s.end());
  return out;
}

/// A result rule's one result (the shape moved in, not copied twice as a braced list would).
inline std::vector<TensorType> single_result(DType dtype, Shape shape) {
  std::vector<TensorType> r = util::VectorStash<std::vector<TensorType>>::take();
  r.resize(1);
  r[0].dtype = dtype;
  r[0].shape = std::move(shape);
  return r;
}
inline std::vector<TensorType> single_result(const TensorType& t) {
  return single_result(t.dtype, stashed_shape(t.shape));
}
inline std::vector<TensorType> single_result(TensorType&& t) { return single_result(t.dtype, std::move(t.shape)); }

/// NumPy broadcasting of two shapes; throws lazyrt::Error naming `what` on a mismatch.
Shape broadcast_shapes(const Shape& a, const Shape& b, std::string_view what);

/// Whether `a` broadcasts to `to` (NumPy rules, `to` unchanged).
bool broadcasts_to(const Shape& a, const Shape& to);

/// The per-row shapes of a fusion over `shape` whose last `reduced` dims form a row (ops.def):
/// `shape` with those dims kept as 1, and with them dropped; `row`: the elements of a row.
struct FusionRows {
  Shape keep, drop;
  int64_t row = 1;
};
FusionRows fusion_rows(const Shape& shape, int64_t reduced);
/// k > 0 when `n` is a reduction a fusion may hold: sum, mean, amax, amin, var or std of a
/// floating dtype over exactly the last k dims of its operand, forming at least 2 elements;
/// else 0.
int64_t row_reduction_dims(const Graph& g, const Node& n);

/// Checks every invariant of the graph: topological order, operand counts, attribute kinds,
/// result types equal to what the op's rule infers, parameter indices, outputs in range.
/// Throws lazyrt::Error describing the first violation.
void verify(const Graph& g);

/// Text form: one line per node, "%3 = add(%1, %2) : f32[2, 3]", then "return %3".
std::string to_text(const Graph& g);
/// Graphviz form.
std::string to_dot(const Graph& g);

/// Deterministic 128-bit structural hash: ops, attributes, types, operand structure, the
/// parameter sequence, outputs and regions, and the IR format version. Never pointer values
/// or tensor contents.
GraphHash hash_graph(const Graph& g);
/// The graph as a region that no longer changes, its hash computed now and kept with it: nodes
/// that own it hash it without walking it again.
std::shared_ptr<const Graph> seal(Graph g);

class Hasher;
/// One node's part of a graph's hash: hash_graph feeds every node of g.nodes through it, in
/// order, into a hasher of its own, and finish_graph_hash makes the graph's hash of that and
/// the rest. Extraction at a sync hashes pending IR through the same two without building
/// the graph (trace/extract.h), so both give one key for one graph.
void hash_node(Hasher& h, OpKind op, std::span<const ValueRef> operands, const Attrs& attrs,
               std::span<const TensorType> results, std::span<const std::shared_ptr<const Graph>> regions);
GraphHash finish_graph_hash(const Hasher& nodes, size_t num_nodes, int64_t num_params,
                            const std::vector<ValueRef>& outputs);

/// Bumped whenever the meaning of a graph or its hash changes.
inline constexpr uint32_t kIrFormatVersion = 3;

}  // namespace lazyrt::ir
