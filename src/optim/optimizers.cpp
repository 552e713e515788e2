#include <cmath>

#include "lazyrt/optim.h"
#include "lazyrt/random.h"
#include "lazyrt/replay.h"
#include "ops/views.h"
#include "loops/call.h"
#include "util/check.h"

namespace lazyrt::optim {
namespace {

// Zeros as device data: state is an input of every step's graph, never a constant.
Tensor zeros_data(const Shape& shape, DType dtype) {
  std::vector<char> bytes(static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype), 0);
  return from_blob(bytes.data(), shape, dtype);
}

}  // namespace

Optimizer::Optimizer(std::vector<Tensor> params)
    : params_(std::move(params)), step_(scalar_tensor(0, DType::f64)), lr_(scalar_tensor(0, DType::f64)) {
  // A new optimizer may take over parameters a traced step updates with another one.
  invalidate_compiled_steps();
  for (size_t i = 0; i < params_.size(); ++i) {
    LAZYRT_CHECK(params_[i].defined(), "optimizer: parameter ", i, " is undefined");
    LAZYRT_CHECK(params_[i].requires_grad() && params_[i].is_leaf(), "optimizer: parameter ", i,
                 " (", dtype_name(params_[i].dtype()), shape_str(params_[i].shape()),
                 ") must be a leaf tensor that requires grad");
  }
  slots_.resize(params_.size());
  // Operands: the parameter, its gradient, its slots, t, lr; results: the parameter, the slots.
  update_fn_ = std::make_unique<detail::TracedFunction>("optimizer update", [this](const Carry& in) {
    const size_t n = in.size();
    Update u = update(in[0], in[1], std::vector<Tensor>(in.begin() + 2, in.end() - 2), in[n - 2], in[n - 1]);
    Carry out{u.param};
    out.insert(out.end(), u.slots.begin(), u.slots.end());
    return out;
  });
}

Optimizer::~Optimizer() = default;

void Optimizer::update_changed() {
  update_fn_->clear();
  invalidate_compiled_steps();
}

void Optimizer::set_lr(double lr) {
  LAZYRT_CHECK(lr >= 0, "optimizer: invalid learning rate ", lr);
  if (lr == lr_value_) return;
  // In place: the tensor keeps its identity, so compiled steps keep reading it.
  NoGradGuard no_grad;
  lr_.copy_(scalar_tensor(lr, DType::f64));
  lr_value_ = lr;
}

void Optimizer::add_slots(int per_param) {
  for (size_t i = 0; i < params_.size(); ++i)
    for (int k = 0; k < per_param; ++k) slots_[i].push_back(zeros_data(params_[i].shape(), params_[i].dtype()));
}

std::vector<Tensor> Optimizer::state() const {
  std::vector<Tensor> out{step_};
  for (const auto& s : slots_) out.insert(out.end(), s.begin(), s.end());
  return out;
}

void Optimizer::step(const Tensor& found_inf) {
  if (found_inf.defined())
    LAZYRT_CHECK(found_inf.numel() == 1, "optimizer step: found_inf must have one element, got ",
                 shape_str(found_inf.shape()));
  NoGradGuard no_grad;
  Tensor skip = found_inf.defined() ? reshape(found_inf, {}) != 0 : Tensor();
  // Keeps the old value where the step is skipped.
  auto commit = [&](Tensor& dst, const Tensor& value) {
    dst.copy_(skip.defined() ? where(skip, detail::detached_value(dst), value) : value);
  };
  // The update's operands and results live for one parameter's update (also when it throws):
  // only the vectors' capacity is kept.
  struct Clear {
    Carry& in;
    Carry& out;
    ~Clear() {
      in.clear();
      out.clear();
    }
  };
  Tensor t = step_ + 1;
  for (size_t i = 0; i < params_.size(); ++i) {
    Tensor g = params_[i].grad();
    if (!g.defined()) continue;
    Clear clear{update_in_, update_out_};
    Carry& in = update_in_;
    in.push_back(params_[i]);
    in.push_back(detail::detached_value(g));
    in.insert(in.end(), slots_[i].begin(), slots_[i].end());
    in.push_back(t);
    in.push_back(lr_);
    update_fn_->apply(in, update_out_);
    for (size_t k = 0; k < slots_[i].size(); ++k) commit(slots_[i][k], update_out_[k + 1]);
    commit(params_[i], update_out_[0]);
  }
  commit(step_, t);
}

void Optimizer::zero_grad(bool set_to_none) {
  for (Tensor& p : params_) {
    if (set_to_none || !p.grad().defined()) {
      p.set_grad(Tensor());
    } else {
      Tensor g = p.grad();
      g.zero_();
    }
  }
}

// ---- SGD --------------------------------------------------------------------------------------

namespace {

void check_sgd(const SGDOptions& o) {
  LAZYRT_CHECK(o.lr >= 0, "SGD: invalid learning rate ", o.lr);
  LAZYRT_CHECK(!o.nesterov || (o.momentum > 0 && o.dampening == 0),
               "SGD: nesterov momentum needs momentum > 0 and dampening 0");
}

void check_adam(const AdamOptions& o) {
  LAZYRT_CHECK(o.lr >= 0 && o.eps >= 0 && o.beta1 >= 0 && o.beta1 < 1 && o.beta2 >= 0 && o.beta2 < 1,
               "Adam: invalid options (lr ", o.lr, ", betas ", o.beta1, ", ", o.beta2, ", eps ", o.eps, ")");
}

}  // namespace

SGD::SGD(std::vector<Tensor> params, SGDOptions o) : Optimizer(std::move(params)), options_(o) {
  check_sgd(o);
  if (o.momentum != 0) add_slots(1);
  set_lr(o.lr);
}

SGDOptions SGD::options() const {
  SGDOptions o = options_;
  o.lr = lr();
  return o;
}

void SGD::set_options(const SGDOptions& o) {
  check_sgd(o);
  LAZYRT_CHECK((o.momentum != 0) == (options_.momentum != 0),
               "SGD: momentum cannot be switched on or off after construction (its buffers are "
               "made with the optimizer)");
  const SGDOptions& c = options_;
  if (o.momentum != c.momentum || o.dampening != c.dampening || o.weight_decay != c.weight_decay ||
      o.nesterov != c.nesterov)
    update_changed();
  options_ = o;
  set_lr(o.lr);
}

Optimizer::Update SGD::update(const Tensor& p, const Tensor& grad, const std::vector<Tensor>& slots, const Tensor& t,
                              const Tensor& lr) {
  const SGDOptions& options = options_;
  Tensor d = options.weight_decay != 0 ? grad + p * options.weight_decay : grad;
  Update u;
  if (options.momentum != 0) {
    // PyTorch starts the buffer as a copy of the first gradient.
    const Tensor& buf = slots[0];
    Tensor next = where(t == 1, d, buf * options.momentum + d * (1 - options.dampening));
    u.slots.push_back(next);
    d = options.nesterov ? d + next * options.momentum : next;
  }
  u.param = p - d * cast(lr, d.dtype());
  return u;
}

// ---- Adam / AdamW -----------------------------------------------------------------------------

Adam::Adam(std::vector<Tensor> params, AdamOptions o) : Optimizer(std::move(params)), options_(o) {
  check_adam(o);
  add_slots(2);  // exp_avg, exp_avg_sq
  set_lr(o.lr);
}

AdamOptions Adam::options() const {
  AdamOptions o = options_;
  o.lr = lr();
  return o;
}

void Adam::set_options(const AdamOptions& o) {
  check_adam(o);
  const AdamOptions& c = options_;
  if (o.beta1 != c.beta1 || o.beta2 != c.beta2 || o.eps != c.eps || o.weight_decay != c.weight_decay)
    update_changed();
  options_ = o;
  set_lr(o.lr);
}

Optimizer::Update Adam::adam_update(const Tensor& param, const Tensor& grad, const std::vector<Tensor>& slots,
                                    const Tensor& t, const Tensor& lr) {
  const AdamOptions& o = options_;
  Tensor m = slots[0] * o.beta1 + grad * (1 - o.beta1);
  Tensor v = slots[1] * o.beta2 + grad * grad * (1 - o.beta2);
  // Bias corrections from the step count, in f64 as PyTorch computes them. Every parameter's
  // call computes them alike; once inlined, compile's CSE keeps one computation per step.
  const DType d = param.dtype();
  Tensor step_size = cast(lr / (1 - pow(full({}, o.beta1, DType::f64), t)), d);
  Tensor bc2_sqrt = cast(sqrt(1 - pow(full({}, o.beta2, DType::f64), t)), d);
  Tensor denom = sqrt(v) / bc2_sqrt + o.eps;
  return {param - step_size * (m / denom), {m, v}};
}

Optimizer::Update Adam::update(const Tensor& p, const Tensor& grad, const std::vector<Tensor>& slots, const Tensor& t,
                               const Tensor& lr) {
  const double wd = options().weight_decay;
  Tensor g = wd != 0 ? grad + p * wd : grad;
  return adam_update(p, g, slots, t, lr);
}

AdamW::AdamW(std::vector<Tensor> params, AdamOptions o) : Adam(std::move(params), o) {}

Optimizer::Update AdamW::update(const Tensor& p, const Tensor& grad, const std::vector<Tensor>& slots, const Tensor& t,
                                const Tensor& lr) {
  const double wd = options().weight_decay;
  Tensor decayed = wd != 0 ? p * cast(1 - lr * wd, p.dtype()) : p;
  return adam_update(decayed, grad, slots, t, lr);
}

}  // namespace lazyrt::optim
