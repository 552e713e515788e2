// Graph-to-graph passes. Each takes a graph and returns a new one with the same parameters
// (count and indices) and the same outputs (count and order, possibly other values); none
// holds state. optimize() runs them in the order compile uses.
#pragma once

#include "backend/backend.h"
#include "ir/graph.h"

namespace lazyrt::compile {

/// Every call node replaced by its region's nodes over the call's operands (calls inside that
/// region too). compile runs it before anything else: no other pass, and no backend, meets a
/// call. Loop regions keep theirs until compile takes them in turn.
ir::Graph inline_calls(const ir::Graph& g);
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

/// matmul or gemm whose operand is a slice, permute or reshape (or a chain of them) of a value
/// that a GEMM can read in place (ir/gemm_view.h: its matrices rows or columns of adjacent
/// elements) -> one gemm_view reading that value; a permute that keeps the last dim last of a
/// product it alone reads -> the product written permuted (gemm_view's out_perm). The views
/// and products left unused are for DCE.
ir::Graph views_into_gemm(const ir::Graph& g);

/// A reader this many nodes or more after a value's producer is a distant one (a backward node
/// reading a forward activation): rematerialize_for_distant_readers computes such values again
/// for it, and fusion does not join a node to a group all of whose members are that far back.
inline constexpr int32_t kDistantReader = 64;

/// A large value of an elementwise node (or a full) that a node far later in the graph reads (a
/// forward activation the backward reads) is computed again just before that reader, where it
/// can be from values live there anyway (parameters, values read at or after that point, and
/// values much smaller than it, such as per-channel statistics); the reader reads the copy.
/// The original then dies at its last near reader, so a training step's arena holds fewer
/// activations; the copy is elementwise work that fusion joins to the reader's group. No
/// value's last read moves later except such small ones. Same outputs, same values.
ir::Graph rematerialize_for_distant_readers(const ir::Graph& g);
/// A reduction (sum, mean, var, std, amax, amin) whose result is much smaller than its operand
/// and which is that operand's last reader moves up to just after its operands are made (a
/// batch norm's variance for the running statistics, traced with the step's last updates, no
/// longer keeps the convolution's output alive to the end). The other nodes keep their order.
ir::Graph hoist_small_reductions(const ir::Graph& g);

/// Groups of elementwise nodes of one result shape -> one fusion node each (fusion.cpp), within
/// the backend's limits (none when it takes no fusion nodes).
ir::Graph fuse_elementwise(const ir::Graph& g, const backend::Capabilities& caps = backend::current().capabilities());

/// Reorders nodes so that, where the dependencies allow, every read of a parameter whose
/// buffer is offered for an output (donations[k] = p, as compile takes them) comes before the
/// node computing that output, which can then write into the buffer instead of beside it.
/// Otherwise keeps the order. Same nodes, same outputs.
ir::Graph order_reads_before_updates(const ir::Graph& g, const std::vector<int32_t>& donations);

/// fold, simplify, CSE, DCE, transposes into gemm, DCE, views into gemm, DCE, hoist reductions, rematerialize, DCE,
/// fuse, DCE; gemm only where the backend takes it, the memory passes and fusion only where it
/// fuses.
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
