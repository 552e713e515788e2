// Graph-to-graph passes. Each takes a graph and returns a new one with the same parameters
// (count and indices) and the same outputs (count and order, possibly other values); none
// holds state. optimize() runs them in the order compile uses.
#pragma once

#include "backend/backend.h"
#include "ir/graph.h"

namespace lazyrt::compile {

/// Removes nodes no output depends on.
ir::Graph dead_code_elimination(const ir::Graph& g);
/// Merges nodes with equal op, operands (in canonical order for commutative ops), attributes
/// and result types. Parameters are never merged.
ir::Graph common_subexpression_elimination(const ir::Graph& g);
/// Replaces elementwise and shape ops whose operands are all constants (full) by a constant.
ir::Graph constant_folding(const ir::Graph& g);
/// x*1, 1*x, x/1, x+0, 0+x, x-0, x**1 -> x; neg(neg(x)) -> x; permute of permute -> one
/// permute (identity -> x); reshape of reshape -> one reshape; reshape, expand or cast to the
/// operand's own type -> x. Only where the result keeps x's exact type. An elementwise node
/// (not an output) whose operands of its shape are all reshapes of values of one other shape,
/// the others broadcasting alike in both shapes -> the node in that shape, then one reshape.
/// An elementwise node read only by a reshape, none of whose operands of its shape is made by
/// an elementwise node -> the node in the reshape's shape, on reshapes of those operands.
ir::Graph algebraic_simplification(const ir::Graph& g);

/// matmul(x, y) (batched or not) with an operand transposed in its last two dims (a permute
/// that swaps them and keeps the others), or such a transpose of a product used nowhere
/// else, -> one gemm reading the untransposed values. The transposes and products left
/// unused are for DCE.
ir::Graph transposes_into_gemm(const ir::Graph& g);

/// Groups of elementwise nodes of one result shape -> one fusion node each (fusion.cpp), within
/// the backend's limits (none when it takes no fusion nodes).
ir::Graph fuse_elementwise(const ir::Graph& g, const backend::Capabilities& caps = backend::current().capabilities());

/// Reorders nodes so that, where the dependencies allow, every read of a parameter whose
/// buffer is offered for an output (donations[k] = p, as compile takes them) comes before the
/// node computing that output, which can then write into the buffer instead of beside it.
/// Otherwise keeps the order. Same nodes, same outputs.
ir::Graph order_reads_before_updates(const ir::Graph& g, const std::vector<int32_t>& donations);

/// fold, simplify, CSE, DCE, transposes into gemm, DCE, fuse, DCE; gemm and fusion only where
/// the backend takes them.
ir::Graph optimize(const ir::Graph& g, const backend::Capabilities& caps = backend::current().capabilities());

/// Rebuilds a graph node by node with remapped operands; the passes are written on it.
class GraphRewriter {
 public:
  explicit GraphRewriter(const ir::Graph& source);
  const ir::Graph& source() const { return src_; }
  /// The new value standing for an old one.
  ir::ValueRef map(ir::ValueRef old) const;
  /// Declares that old node i's result k is now `v`.
  void set(int32_t node, int32_t index, ir::ValueRef v);
  /// Copies old node i with remapped operands, records the mapping, returns its result 0.
  ir::ValueRef copy(int32_t i);
  ir::Graph& graph() { return out_; }
  /// Remaps the outputs and returns the new graph.
  ir::Graph finish();

 private:
  const ir::Graph& src_;
  ir::Graph out_;
  std::vector<std::vector<ir::ValueRef>> map_;
};

}  // namespace lazyrt::compile
