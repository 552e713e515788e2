#include "autograd/autograd.h"

#include <algorithm>
#include <atomic>
#include <unordered_map>

#include "ops/views.h"
#include "trace/lazy_tensor.h"
#include "util/check.h"
#include "util/pool.h"

namespace lazyrt::autograd {
namespace {

thread_local bool enabled = true;
// Innermost body trace: 0 none, 1 a loop without gradients, 2 a loop that records them.
thread_local int body_trace = 0;
// Over all threads: how many have gradients off, and how many body traces are open. While
// none, the per-thread state is not read (a call into a shared library's thread-local storage
// on every op); a thread's own changes are counted here before it reads them.
std::atomic<int64_t> threads_without_grad{0};
std::atomic<int64_t> body_traces{0};

bool enabled_here() { return threads_without_grad.load(std::memory_order_relaxed) == 0 || enabled; }
int body_trace_here() { return body_traces.load(std::memory_order_relaxed) == 0 ? 0 : body_trace; }

Tensor snapshot(const Tensor& t) {
  Tensor s = detail::detached_value(t);
  trace::impl_of(s)->saved_for_backward = true;
  return s;
}

void accumulate(trace::TensorImpl& leaf, const Tensor& g) {
  Tensor grad = g.dtype() == leaf.type.dtype ? g : cast(g, leaf.type.dtype);
  LAZYRT_ASSERT(grad.shape() == leaf.type.shape, "gradient of shape ", shape_str(grad.shape()),
                " for a leaf of shape ", shape_str(leaf.type.shape));
  trace::note_grad_read(leaf);
  if (!leaf.grad) {
    leaf.set_grad_impl(trace::impl_of(detail::detached_value(grad)));
  } else {
    Tensor existing = trace::tensor_of(leaf.grad);
    existing.add_(grad);
  }
}

// The edge from a node to the input `t`: its grad node, or the leaf it is.
Edge edge_to(const Tensor& t) {
  Edge e;
  if (t.requires_grad()) {
    if (trace::impl_of(t)->grad_fn) e.node = trace::impl_of(t)->grad_fn;
    else e.leaf = trace::impl_of(t);
  }
  return e;
}

}  // namespace

GradNode::~GradNode() {
  util::DeferredDrop<GradNode>::Scope scope;
  for (Edge& e : next) scope.defer(e.node);
}

bool grad_enabled() { return enabled_here(); }
void set_grad_enabled(bool e) {
  if (e == enabled) return;
  enabled = e;
  if (e) threads_without_grad.fetch_sub(1, std::memory_order_relaxed);
  else threads_without_grad.fetch_add(1, std::memory_order_relaxed);
}

BodyTrace::BodyTrace() : previous_(body_trace) {
  body_traces.fetch_add(1, std::memory_order_relaxed);
  body_trace = enabled && previous_ != 1 ? 2 : 1;
}
BodyTrace::~BodyTrace() {
  body_trace = previous_;
  body_traces.fetch_sub(1, std::memory_order_relaxed);
}
bool recording() { return enabled_here() && body_trace_here() == 0; }
bool in_recorded_body() { return body_trace_here() == 2; }

bool should_record(ir::OpKind op, std::span<const Tensor> inputs) {
  if (!recording() || !grad_rule(op)) return false;
  for (const Tensor& t : inputs)
    if (t.requires_grad()) return true;
  return false;
}

void record(const Tensor& output, ir::OpKind op, std::span<const Tensor> inputs, ir::Attrs attrs) {
  auto node = util::make_pooled<GradNode>();
  node->op = op;
  node->attrs = std::move(attrs);
  node->inputs.reserve(inputs.size());
  node->next.reserve(inputs.size());
  for (const Tensor& t : inputs) {
    node->inputs.push_back(snapshot(t));
    node->next.push_back(edge_to(t));
  }
  node->output = snapshot(output);
  trace::impl_of(output)->grad_fn = std::move(node);
  trace::impl_of(output)->requires_grad = true;
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

namespace {

// Runs the engine from `root`, whose slots receive `seeds`. Kahn's algorithm over the nodes
// reachable from the root: a node runs once every node that feeds it a gradient has run.
void run_engine(std::shared_ptr<GradNode> root, std::vector<Tensor> seeds) {
  std::unordered_map<GradNode*, int> pending;
  std::vector<GradNode*> stack{root.get()};
  pending[root.get()] = 0;
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
  std::unordered_map<GradNode*, std::vector<Tensor>> grads;  // per node, per slot
  grads[root.get()] = std::move(seeds);
  std::vector<std::shared_ptr<GradNode>> ready{std::move(root)};
  while (!ready.empty()) {
    std::shared_ptr<GradNode> n = std::move(ready.back());
    ready.pop_back();
    std::vector<Tensor> g = std::move(grads[n.get()]);
    grads.erase(n.get());
    g.resize(static_cast<size_t>(n->slots));
    std::vector<bool> needs(n->next.size());
    for (size_t k = 0; k < n->next.size(); ++k) needs[k] = n->next[k].node || n->next[k].leaf;
    std::vector<Tensor> in_grads;
    const bool any = std::any_of(g.begin(), g.end(), [](const Tensor& t) { return t.defined(); });
    if (any && n->backward_fn) in_grads = n->backward_fn(g, needs);
    else if (any) in_grads = grad_rule(n->op)({n->op, n->inputs, n->output, n->attrs, g[0], needs});
    for (size_t k = 0; k < n->next.size(); ++k) {
      const Edge& e = n->next[k];
      const bool has = k < in_grads.size() && in_grads[k].defined();
      if (e.node) {
        if (has) {
          std::vector<Tensor>& slots = grads[e.node.get()];
          if (slots.size() < static_cast<size_t>(e.node->slots)) slots.resize(static_cast<size_t>(e.node->slots));
          Tensor& acc = slots[static_cast<size_t>(e.slot)];
          acc = acc.defined() ? acc + in_grads[k] : in_grads[k];
        }
        if (--pending[e.node.get()] == 0) ready.push_back(e.node);
      } else if (e.leaf && has) {
        accumulate(*e.leaf, in_grads[k]);
      }
    }
    n->inputs.clear();
    n->output = Tensor();
    n->backward_fn = nullptr;
    n->released = true;
  }
}

// A node that passes the gradients it receives on to its edges, one for one: the root of a
// run over several outputs, and the node of each result of a multi-result op.
std::shared_ptr<GradNode> pass_through(ir::OpKind op, std::vector<Edge> next) {
  auto n = util::make_pooled<GradNode>();
  n->op = op;
  n->slots = static_cast<int32_t>(next.size());
  n->next = std::move(next);
  n->backward_fn = [](const std::vector<Tensor>& g, const std::vector<bool>&) { return g; };
  return n;
}

}  // namespace

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
  auto& root_impl = *trace::impl_of(root);
  if (!root_impl.grad_fn) {  // a leaf
    accumulate(root_impl, seed);
    return;
  }
  run_engine(root_impl.grad_fn, {seed});
}

std::vector<Tensor> grad(const std::vector<Tensor>& outputs, const std::vector<Tensor>& grad_outputs,
                         const std::vector<Tensor>& inputs) {
  LAZYRT_ASSERT(outputs.size() == grad_outputs.size(), "grad: ", outputs.size(), " outputs, ",
                grad_outputs.size(), " gradients");
  for (const Tensor& x : inputs)
    LAZYRT_ASSERT(x.requires_grad() && x.is_leaf() && !trace::impl_of(x)->grad, "grad: inputs must be fresh leaves");
  std::vector<Edge> next;
  std::vector<Tensor> seeds;
  for (size_t k = 0; k < outputs.size(); ++k) {
    if (!outputs[k].requires_grad() || !grad_outputs[k].defined()) continue;
    next.push_back(edge_to(outputs[k]));
    seeds.push_back(grad_outputs[k]);
  }
  {
    NoGradGuard no_grad;
    if (!next.empty()) run_engine(pass_through(ir::OpKind::Parameter, std::move(next)), std::move(seeds));
  }
  std::vector<Tensor> out;
  for (const Tensor& x : inputs) {
    auto& impl = *trace::impl_of(x);
    out.push_back(impl.grad ? trace::tensor_of(impl.grad) : Tensor());
    impl.grad = nullptr;
  }
  return out;
}

void record_multi(const std::vector<Tensor>& outputs, ir::OpKind op, const std::vector<Tensor>& inputs,
                  BackwardFn fn) {
  auto node = util::make_pooled<GradNode>();
  node->op = op;
  node->slots = static_cast<int32_t>(outputs.size());
  for (const Tensor& t : inputs) node->next.push_back(edge_to(t));
  node->backward_fn = std::move(fn);
  for (size_t k = 0; k < outputs.size(); ++k) {
    if (!is_floating(outputs[k].dtype())) continue;  // integer results carry no gradient
    Edge e;
    e.node = node;
    e.slot = static_cast<int32_t>(k);
    auto out = pass_through(op, {std::move(e)});
    out->output = snapshot(outputs[k]);
    trace::impl_of(outputs[k])->grad_fn = std::move(out);
    trace::impl_of(outputs[k])->requires_grad = true;
  }
}

}  // namespace lazyrt::autograd

namespace lazyrt {

bool grad_enabled() { return autograd::grad_enabled(); }
void set_grad_enabled(bool on) { autograd::set_grad_enabled(on); }

NoGradGuard::NoGradGuard() : previous_(autograd::grad_enabled()) { autograd::set_grad_enabled(false); }
NoGradGuard::~NoGradGuard() { autograd::set_grad_enabled(previous_); }

Tensor Tensor::grad() const {
  trace::note_grad_read(*impl_);
  const auto& g = impl_->grad;
  return g ? trace::tensor_of(g) : Tensor();
}

void Tensor::set_grad(const Tensor& g) {
  LAZYRT_CHECK(defined(), "set_grad: the tensor is undefined");
  if (g.defined())
    LAZYRT_CHECK(g.shape() == shape() && g.dtype() == dtype(), "set_grad: gradient ",
                 dtype_name(g.dtype()), shape_str(g.shape()), " for a tensor ", dtype_name(dtype()),
                 shape_str(shape()));
  impl_->set_grad_impl(g.defined() ? trace::impl_of(g) : nullptr);
}

bool Tensor::is_leaf() const { return impl_->grad_fn == nullptr; }

void Tensor::backward(const Tensor& gradient) const { autograd::backward(*this, gradient); }

}  // namespace lazyrt
