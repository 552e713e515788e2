// View semantics by functionalization (views.h).
#include "ops/views.h"

#include <algorithm>

#include "autograd/autograd.h"
#include "ops/op_helpers.h"
#include "util/check.h"

namespace lazyrt::detail {

using trace::TensorImpl;
using trace::ViewOf;
using trace::ViewStep;
using Kind = trace::ViewStep::Kind;

namespace {

std::vector<int64_t> row_major(const Shape& shape) {
  std::vector<int64_t> s(shape.size());
  int64_t acc = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    s[i] = acc;
    acc = detail::stride_mul_add(acc, std::max<int64_t>(shape[i], 1));
  }
  return s;
}

TensorImpl& root_of(const ViewOf& v) {
  TensorImpl* r = v.kept_base ? v.kept_base.get() : v.base.lock().get();  // alive: the view holds
  LAZYRT_ASSERT(r, "a view outlived its base");                            // it or the caller does
  return *r;
}

// Sets grad mode for a scope.
class GradMode {
 public:
  explicit GradMode(bool on) : previous_(autograd::grad_enabled()) { autograd::set_grad_enabled(on); }
  ~GradMode() { autograd::set_grad_enabled(previous_); }
  GradMode(const GradMode&) = delete;
  GradMode& operator=(const GradMode&) = delete;

 private:
  bool previous_;
};

Tensor forward(const ViewStep& s, const Tensor& t) {
  switch (s.kind) {
    case Kind::Reshape: return apply(ir::OpKind::Reshape, {t}, {Shape(s.a)});
    case Kind::Permute: return apply(ir::OpKind::Permute, {t}, {s.a});
    case Kind::Expand: return apply(ir::OpKind::Expand, {t}, {Shape(s.a)});
    case Kind::Slice: return apply(ir::OpKind::Slice, {t}, {s.a, s.b, s.c});
    case Kind::Take: {
      Tensor r = index_select(t, s.a[0], trace::tensor_of(s.index));
      if (!s.a[1]) return r;
      Shape out = s.in;
      out.erase(out.begin() + s.a[0]);
      return reshape(r, out);
    }
    case Kind::Detach: break;
  }
  return detached_value(t);
}

// The new value of a step's input, given its old value and the new value of its output.
Tensor scatter(const ViewStep& s, const Tensor& in, const Tensor& out) {
  switch (s.kind) {
    case Kind::Reshape: return apply(ir::OpKind::Reshape, {out}, {s.in});
    case Kind::Permute: {
      std::vector<int64_t> inverse(s.a.size());
      for (size_t i = 0; i < s.a.size(); ++i) inverse[static_cast<size_t>(s.a[i])] = static_cast<int64_t>(i);
      return apply(ir::OpKind::Permute, {out}, {inverse});
    }
    case Kind::Slice: return slice_scatter(in, s.a, s.b, s.c, out);
    case Kind::Take:
      return index_copy(in, s.a[0], trace::tensor_of(s.index), s.a[1] ? unsqueeze(out, s.a[0]) : out);
    case Kind::Detach: break;
    case Kind::Expand: LAZYRT_ASSERT(false, "a write through expand()");  // refused by check_view_write
  }
  return out;
}

// The value of view `v` of `root`, derived from root's value now.
Tensor derive(TensorImpl& root, const ViewOf& v) {
  GradMode mode(v.grad);
  Tensor t = trace::tensor_of(root.shared_from_this());
  for (const ViewStep& s : v.steps) t = forward(s, t);
  return t;
}

// Gives view `t` the value `v` and v's autograd history.
void take(TensorImpl& t, const Tensor& v) {
  const auto& src = *trace::impl_of(v);
  t.set_ir(value_of(v));
  t.grad_fn = src.grad_fn;
  t.requires_grad = src.requires_grad;
}

void prune(TensorImpl& base) {
  auto& vs = base.views;
  vs.erase(std::remove_if(vs.begin(), vs.end(), [](const std::weak_ptr<TensorImpl>& w) { return w.expired(); }),
           vs.end());
}

}  // namespace

std::vector<int64_t> strides_of(const TensorImpl& t) {
  return t.strides.empty() ? row_major(t.type.shape) : t.strides;
}

std::optional<std::vector<int64_t>> view_strides(const Shape& from, const std::vector<int64_t>& strides,
                                                 const Shape& to) {
  if (from.empty() || shape_numel(from) == 0) return row_major(to);
  std::vector<int64_t> out(to.size());
  // Walk the old dims from the last, in runs that are contiguous in memory; the new dims that
  // cover a run must multiply to its size exactly.
  auto view_d = static_cast<int64_t>(to.size()) - 1;
  int64_t base_stride = strides.back(), run = 1, covered = 1;
  for (auto d = static_cast<int64_t>(from.size()) - 1; d >= 0; --d) {
    run *= from[d];
    if (d == 0 || (from[d - 1] != 1 && strides[d - 1] != run * base_stride)) {
      while (view_d >= 0 && (covered < run || to[view_d] == 1)) {
        out[view_d] = covered * base_stride;
        covered *= to[view_d];
        --view_d;
      }
      if (covered != run) return std::nullopt;
      if (d > 0) {
        base_stride = strides[d - 1];
        run = 1;
        covered = 1;
      }
    }
  }
  if (view_d != -1) return std::nullopt;
  return out;
}

bool is_contiguous(const TensorImpl& t) {
  if (t.strides.empty()) return true;
  int64_t expected = 1;
  const Shape& shape = t.type.shape;
  for (size_t i = shape.size(); i-- > 0;) {
    if (shape[i] == 0) return true;
    if (shape[i] == 1) continue;
    if (t.strides[i] != expected) return false;
    expected *= shape[i];
  }
  return true;
}

Tensor detached_value(const Tensor& t) {
  auto& s = impl_of(t, "detach");
  // In a body whose loop records gradients, the body's graph must say where they stop.
  if (autograd::in_recorded_body() && is_floating(s.type.dtype))
    return trace::tensor_of(trace::make_pending(trace::record(ir::OpKind::StopGradient, {value_of(t)})));
  if (s.is_pending()) return trace::tensor_of(trace::make_pending(s.pending()));
  auto d = trace::make_data(s.type, s.data());
  auto origin = s.detached_from.lock();
  d->detached_from = origin && origin->data() == s.data() ? origin : s.shared_from_this();
  d->dynamic = s.dynamic;
  return trace::tensor_of(std::move(d));
}

void attach_view(const Tensor& t, TensorImpl& base, ViewOf chain, std::vector<int64_t> strides,
                 int64_t storage_offset) {
  TensorImpl& r = *trace::impl_of(t);
  auto v = std::make_unique<ViewOf>();
  TensorImpl* root = &base;
  if (base.view_of) {  // a view of a view is a view of the first one's base
    *v = *base.view_of;
    root = &root_of(*base.view_of);
  } else {
    v->base = base.shared_from_this();
  }
  if (v->steps.empty())
    v->steps = std::move(chain.steps);
  else
    v->steps.insert(v->steps.end(), std::make_move_iterator(chain.steps.begin()),
                    std::make_move_iterator(chain.steps.end()));
  v->detached |= chain.detached;
  v->grad = !v->detached && chain.grad;
  // Prune the dead now and then, so that a base viewed every step (a weight's transpose in
  // each forward) keeps a short list: when the list reaches a power of two, so that making n
  // live views (split into n pieces) costs O(n) pruning, not O(n^2).
  const size_t n = root->views.size();
  if (n >= 8 && (n & (n - 1)) == 0) prune(*root);
  root->views.push_back(r.shared_from_this());
  r.view_of = std::move(v);
  r.strides = std::move(strides);
  r.storage_offset = storage_offset;
}

void make_view(const Tensor& src, const Tensor& result, ViewStep step, std::vector<int64_t> strides,
               int64_t storage_offset) {
  ViewOf chain;
  chain.detached = step.kind == Kind::Detach;
  chain.grad = autograd::grad_enabled();
  chain.steps.push_back(std::move(step));
  attach_view(result, *trace::impl_of(src), std::move(chain), std::move(strides), storage_offset);
}

bool has_live_views(TensorImpl& t) {
  if (t.views.empty()) return false;
  prune(t);
  return !t.views.empty();
}

void check_view_write(const TensorImpl& self, const char* op) {
  const Shape& shape = self.type.shape;
  for (size_t i = 0; i < self.strides.size(); ++i)
    LAZYRT_CHECK(self.strides[i] != 0 || shape[i] <= 1, op, ": unsupported operation: more than one element of the ",
                 "written-to tensor (", ir::type_str(self.type), ", an expanded view) refers to a single memory ",
                 "location; clone() it first");
  if (!self.view_of) return;
  const ViewOf& v = *self.view_of;
  for (const ViewStep& s : v.steps)
    LAZYRT_CHECK(s.kind != Kind::Expand, op, ": writing through a view that comes from expand() (",
                 ir::type_str(self.type), ") is not supported; clone() it first");
  const TensorImpl& root = root_of(v);
  LAZYRT_CHECK(v.detached || !(root.requires_grad && !root.grad_fn && autograd::grad_enabled()), op,
               ": a view of a leaf tensor that requires grad (", ir::type_str(root.type),
               ") cannot be modified in place while gradients are recorded; use NoGradGuard (no_grad) or "
               "write through .detach()");
  LAZYRT_CHECK(root.scope == trace::current_scope(), op, ": the loop body modifies a view of a tensor from outside ",
               "the loop in place (", ir::type_str(root.type), "); return the new value as part of the carry instead");
}

void propagate_write(TensorImpl& self) {
  if (!self.view_of) {
    if (has_live_views(self)) rederive_views(self, {&self});
    return;
  }
  const ViewOf& v = *self.view_of;
  TensorImpl& root = root_of(v);
  Tensor base_value;
  {
    GradMode mode(v.grad && autograd::grad_enabled());
    // The values each step reads now, then the new ones from the last step back to the base.
    std::vector<Tensor> ins;
    Tensor t = v.detached ? detached_value(trace::tensor_of(root.shared_from_this()))
                          : trace::tensor_of(root.shared_from_this());
    for (const ViewStep& s : v.steps) {
      ins.push_back(t);
      t = forward(s, t);
    }
    Tensor out = v.detached ? detached_value(trace::tensor_of(self.shared_from_this()))
                            : trace::tensor_of(self.shared_from_this());
    for (size_t i = v.steps.size(); i-- > 0;) out = scatter(v.steps[i], ins[i], out);
    base_value = out;
  }
  // Through detach() the base keeps its history, as a write to PyTorch's .data does.
  if (v.detached) root.set_ir(value_of(base_value));
  else rebind_value(root, base_value);
  rederive_views(root, {&self});
}

void rederive_views(TensorImpl& base, const std::vector<const TensorImpl*>& written) {
  prune(base);
  // Copied: deriving a value may add (short-lived) views of the base.
  const std::vector<std::weak_ptr<TensorImpl>> views = base.views;
  for (const auto& w : views) {
    std::shared_ptr<TensorImpl> v = w.lock();
    if (!v || !v->view_of || std::find(written.begin(), written.end(), v.get()) != written.end()) continue;
    // A view made in a loop body that has ended has no value to re-derive.
    if (v->scope != trace::current_scope()) continue;
    take(*v, derive(base, *v->view_of));
  }
}

}  // namespace lazyrt::detail
