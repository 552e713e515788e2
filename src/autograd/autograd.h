// Reverse-mode autograd over lazy tensors.
//
// Every op of the op table that has a gradient rule (rules.cpp) and an input requiring grad
// records a GradNode: the op, its attributes, snapshots of its inputs and output (new handles
// on the same values, so later in-place updates of the tensors cannot change them), and one
// edge per input (the input's own GradNode, or the leaf tensor whose .grad it accumulates
// into). backward() walks the nodes in reverse topological order and builds the gradients out
// of lazy ops, so forward, backward and the optimizer step trace into one pending graph.
#pragma once

#include <memory>
#include <vector>

#include "ir/graph.h"
#include "lazyrt/tensor.h"

namespace lazyrt::autograd {

struct GradNode;

struct Edge {
  std::shared_ptr<GradNode> node;           // the input's grad node, or
  std::shared_ptr<trace::TensorImpl> leaf;  // the leaf whose grad accumulates, or neither
};

struct GradNode {
  ir::OpKind op;
  ir::Attrs attrs;
  std::vector<Tensor> inputs;  // snapshots
  Tensor output;               // snapshot
  std::vector<Edge> next;      // per input
  bool released = false;       // saved values freed by a backward pass
};

/// What a gradient rule sees: the op, the saved inputs and output, the attributes, the
/// gradient of the output, and which inputs want a gradient.
struct GradContext {
  ir::OpKind op;
  const std::vector<Tensor>& inputs;
  const Tensor& output;
  const ir::Attrs& attrs;
  const Tensor& grad;
  std::vector<bool> needs;

  /// The attributes by name: `c.at().ints<"dims">()`.
  ir::NodeAttrs at() const { return {op, attrs}; }
};

/// A rule returns one gradient per input (undefined where none is needed or defined).
using GradRule = std::vector<Tensor> (*)(const GradContext&);

/// The rule of `op`, or nullptr when the op is not differentiable.
GradRule grad_rule(ir::OpKind op);

bool grad_enabled();
void set_grad_enabled(bool enabled);

/// Whether an application of `op` to `inputs` must be recorded for backward.
bool should_record(ir::OpKind op, const std::vector<Tensor>& inputs);
/// Records it: `output` gets a grad node and requires grad.
void record(const Tensor& output, ir::OpKind op, const std::vector<Tensor>& inputs, ir::Attrs attrs);

/// Runs backward from `root` with `gradient` (undefined: ones, for a one-element root).
void backward(const Tensor& root, const Tensor& gradient);

/// Sums a broadcast gradient back to `shape` (the inverse of NumPy broadcasting).
Tensor sum_to(const Tensor& grad, const Shape& shape);

}  // namespace lazyrt::autograd
