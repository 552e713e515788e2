#include "autograd/autograd.h"

#include <unordered_map>

#include "trace/lazy_tensor.h"
#include "util/check.h"

namespace lazyrt::autograd {
namespace {

thread_local bool enabled = true;

Tensor snapshot(const Tensor& t) {
  Tensor s = t.detach();
  s.impl()->saved_for_backward = true;
  return s;
}

void accumulate(trace::TensorImpl& leaf, const Tensor& g) {
  Tensor grad = g.dtype() == leaf.type.dtype ? g : cast(g, leaf.type.dtype);
  LAZYRT_ASSERT(grad.shape() == leaf.type.shape, "gradient of shape ", shape_str(grad.shape()),
                " for a leaf of shape ", shape_str(leaf.type.shape));
  trace::note_grad_read(leaf);
  if (!leaf.grad) {
    leaf.set_grad_impl(grad.detach().impl());
  } else {
    Tensor existing(leaf.grad);
    existing.add_(grad);
  }
}

}  // namespace

bool grad_enabled() { return enabled; }
void set_grad_enabled(bool e) { enabled = e; }

bool should_record(ir::OpKind op, const std::vector<Tensor>& inputs) {
  if (!enabled || !grad_rule(op)) return false;
  for (const Tensor& t : inputs)
    if (t.requires_grad()) return true;
  return false;
}

void record(const Tensor& output, ir::OpKind op, const std::vector<Tensor>& inputs, ir::Attrs attrs) {
  auto node = std::make_shared<GradNode>();
  node->op = op;
  node->attrs = std::move(attrs);
  node->inputs.reserve(inputs.size());
  node->next.reserve(inputs.size());
  for (const Tensor& t : inputs) {
    node->inputs.push_back(snapshot(t));
    Edge e;
    if (t.requires_grad()) {
      if (t.impl()->grad_fn) e.node = t.impl()->grad_fn;
      else e.leaf = t.impl();
    }
    node->next.push_back(std::move(e));
  }
  node->output = snapshot(output);
  output.impl()->grad_fn = std::move(node);
  output.impl()->requires_grad = true;
}

Tensor sum_to(const Tensor& grad, const Shape& shape) {
  if (grad.shape() == shape) return grad;
  const auto lead = static_cast<int64_t>(grad.dim()) - static_cast<int64_t>(shape.size());
  LAZYRT_ASSERT(lead >= 0, "sum_to: ", shape_str(grad.shape()), " to ", shape_str(shape));
  std::vector<int64_t> dims;
  for (int64_t d = 0; d < lead; ++d) dims.push_back(d);
  for (size_t i = 0; i < shape.size(); ++i)
    if (shape[i] == 1 && grad.shape()[lead + i] != 1) dims.push_back(lead + static_cast<int64_t>(i));
  Tensor s = dims.empty() ? grad : sum(grad, dims, true);
  return reshape(s, shape);
}

void backward(const Tensor& root, const Tensor& gradient) {
  LAZYRT_CHECK(root.defined(), "backward: the tensor is undefined");
  LAZYRT_CHECK(root.requires_grad(), "backward: the tensor ", dtype_name(root.dtype()),
               shape_str(root.shape()), " does not require grad and has no grad_fn");
  Tensor seed = gradient;
  if (!seed.defined()) {
    LAZYRT_CHECK(root.numel() == 1, "backward: a gradient is needed for a non-scalar output (",
                 shape_str(root.shape()), "); pass one, or reduce the output first");
    seed = ones(root.shape(), root.dtype());
  } else {
    LAZYRT_CHECK(seed.shape() == root.shape(), "backward: gradient of shape ",
                 shape_str(seed.shape()), " for an output of shape ", shape_str(root.shape()));
  }
  NoGradGuard no_grad;
  auto& root_impl = *root.impl();
  if (!root_impl.grad_fn) {  // a leaf
    accumulate(root_impl, seed);
    return;
  }
  // Kahn's algorithm over the nodes reachable from the root: a node runs once every node
  // that feeds it a gradient has run.
  std::unordered_map<GradNode*, int> pending;
  std::vector<GradNode*> stack{root_impl.grad_fn.get()};
  pending[root_impl.grad_fn.get()] = 0;
  while (!stack.empty()) {
    GradNode* n = stack.back();
    stack.pop_back();
    LAZYRT_CHECK(!n->released,
                 "backward: trying to go through the graph a second time; its saved values were "
                 "freed by the first backward");
    for (const Edge& e : n->next) {
      if (!e.node) continue;
      auto [it, fresh] = pending.emplace(e.node.get(), 0);
      it->second++;
      if (fresh) stack.push_back(e.node.get());
    }
  }
  std::unordered_map<GradNode*, Tensor> grads;
  grads[root_impl.grad_fn.get()] = seed;
  std::vector<std::shared_ptr<GradNode>> ready{root_impl.grad_fn};
  while (!ready.empty()) {
    std::shared_ptr<GradNode> n = std::move(ready.back());
    ready.pop_back();
    Tensor g = std::move(grads[n.get()]);
    grads.erase(n.get());
    std::vector<bool> needs(n->next.size());
    for (size_t k = 0; k < n->next.size(); ++k) needs[k] = n->next[k].node || n->next[k].leaf;
    std::vector<Tensor> in_grads;
    if (g.defined()) in_grads = grad_rule(n->op)({n->op, n->inputs, n->output, n->attrs, g, needs});
    for (size_t k = 0; k < n->next.size(); ++k) {
      const Edge& e = n->next[k];
      const bool has = k < in_grads.size() && in_grads[k].defined();
      if (e.node) {
        if (has) {
          Tensor& acc = grads[e.node.get()];
          acc = acc.defined() ? acc + in_grads[k] : in_grads[k];
        }
        if (--pending[e.node.get()] == 0) ready.push_back(e.node);
      } else if (e.leaf && has) {
        accumulate(*e.leaf, in_grads[k]);
      }
    }
    n->inputs.clear();
    n->output = Tensor();
    n->released = true;
  }
}

}  // namespace lazyrt::autograd

namespace lazyrt {

NoGradGuard::NoGradGuard() : previous_(autograd::grad_enabled()) { autograd::set_grad_enabled(false); }
NoGradGuard::~NoGradGuard() { autograd::set_grad_enabled(previous_); }

Tensor Tensor::grad() const {
  trace::note_grad_read(*impl());
  const auto& g = impl()->grad;
  return g ? Tensor(g) : Tensor();
}

void Tensor::set_grad(const Tensor& g) {
  LAZYRT_CHECK(defined(), "set_grad: the tensor is undefined");
  if (g.defined())
    LAZYRT_CHECK(g.shape() == shape() && g.dtype() == dtype(), "set_grad: gradient ",
                 dtype_name(g.dtype()), shape_str(g.shape()), " for a tensor ", dtype_name(dtype()),
                 shape_str(shape()));
  impl()->set_grad_impl(g.defined() ? g.impl() : nullptr);
}

bool Tensor::is_leaf() const { return impl()->grad_fn == nullptr; }

void Tensor::backward(const Tensor& gradient) const { autograd::backward(*this, gradient); }

}  // namespace lazyrt
