// Reverse-mode autograd over lazy tensors.
//
// Every op of the op table that has a gradient rule (rules.cpp) and an input requiring grad
// records a GradNode: the op, its attributes, snapshots of its inputs and output (new handles
// on the same values, so later in-place updates of the tensors cannot change them), and one
// edge per input (the input's own GradNode, or the leaf tensor whose .grad it accumulates
// into). backward() walks the nodes in reverse topological order and builds the gradients out
// of lazy ops, so forward, backward and the optimizer step trace into one pending graph.
#pragma once

#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "ir/graph.h"
#include "lazyrt/tensor.h"

namespace lazyrt::autograd {

struct GradNode;

struct Edge {
  std::shared_ptr<GradNode> node;           // the input's grad node, or
  std::shared_ptr<trace::TensorImpl> leaf;  // the leaf whose grad accumulates, or neither
  int32_t slot = 0;                         // which of the node's gradients this one adds to
};

/// Gradients in (one per slot), and which inputs need one -> one gradient per input.
using BackwardFn = std::function<std::vector<Tensor>(const std::vector<Tensor>& grads,
                                                     const std::vector<bool>& needs)>;

struct GradNode {
  ir::OpKind op;
  ir::Attrs attrs;
  std::vector<Tensor> inputs;  // snapshots
  Tensor output;               // snapshot
  std::vector<Edge> next;      // per input
  bool released = false;       // saved values freed by a backward pass
  // An op of several results (a scan) has one gradient slot per result, each fed by the
  // pass-through node of that result's tensor, and computes its inputs' gradients with
  // backward_fn (which holds what it saved) instead of the op's rule.
  int32_t slots = 1;
  BackwardFn backward_fn;

  GradNode() = default;
  GradNode(const GradNode&) = delete;
  GradNode& operator=(const GradNode&) = delete;
  ~GradNode();  // drops the nodes of `next` one at a time (util::DeferredDrop)
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

/// While alive (per thread), no op records for backward, though grad mode stays as the user
/// has it: loop bodies are traced so, and differentiated as a whole (loops.cpp). Where the loop
/// records gradients, what the body keeps out of them — detach(), ops run under no_grad —
/// becomes a stop_gradient node, so that the body's graph says so.
class BodyTrace {
 public:
  BodyTrace();
  ~BodyTrace();
  BodyTrace(const BodyTrace&) = delete;
  BodyTrace& operator=(const BodyTrace&) = delete;

 private:
  int previous_;
};

/// Grad mode is on and no body is being traced: ops record for backward.
bool recording();
/// Inside a body traced by a loop that records gradients (grad mode was on when it began).
bool in_recorded_body();

/// Whether an application of `op` to `inputs` must be recorded for backward.
bool should_record(ir::OpKind op, std::span<const Tensor> inputs);
/// Records it: `output` gets a grad node and requires grad.
void record(const Tensor& output, ir::OpKind op, std::span<const Tensor> inputs, ir::Attrs attrs);

/// Records an op of several results: `fn` gets one gradient per result (undefined where none
/// flowed) and returns one per input. Every floating output gets a grad node and requires grad.
void record_multi(const std::vector<Tensor>& outputs, ir::OpKind op, const std::vector<Tensor>& inputs,
                  BackwardFn fn);

/// Runs backward from `root` with `gradient` (undefined: ones, for a one-element root).
void backward(const Tensor& root, const Tensor& gradient);

/// The gradients of `outputs`, seeded with `grad_outputs` (undefined: no gradient), with
/// respect to `inputs`: leaves that require grad and have no .grad, which is left empty.
/// Undefined where no gradient reaches an input. Builds lazy ops, recording none.
std::vector<Tensor> grad(const std::vector<Tensor>& outputs, const std::vector<Tensor>& grad_outputs,
                         const std::vector<Tensor>& inputs);

/// Sums a broadcast gradient back to `shape` (the inverse of NumPy broadcasting).
Tensor sum_to(const Tensor& grad, const Shape& shape);

}  // namespace lazyrt::autograd
