#include <cmath>

#include "lazyrt/optim.h"
#include "lazyrt/random.h"
#include "lazyrt/replay.h"
#include "ops/views.h"
#include "util/check.h"

namespace lazyrt::optim {
namespace {

// Zeros as device data: state is an input of every step's graph, never a constant.
Tensor zeros_data(const Shape& shape, DType dtype) {
  std::vector<char> bytes(static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype), 0);
  return from_blob(bytes.data(), shape, dtype);
}

// Keys of the values Adam and AdamW share among a step's parameters (Optimizer::per_step).
enum PerStepKey : int { kStepSize, kBias2Sqrt, kDecay };

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
  // The values shared by the parameters' updates live for this step only (also when an
  // update throws).
  struct ClearPerStep {
    std::vector<PerStep>& v;
    ~ClearPerStep() { v.clear(); }
  } clear_per_step{per_step_};
  per_step_.clear();
  Tensor skip = found_inf.defined() ? reshape(found_inf, {}) != 0 : Tensor();
  // Keeps the old value where the step is skipped.
  auto commit = [&](Tensor& dst, const Tensor& value) {
    dst.copy_(skip.defined() ? where(skip, detail::detached_value(dst), value) : value);
  };
  Tensor t = step_ + 1;
  for (size_t i = 0; i < params_.size(); ++i) {
    Tensor g = params_[i].grad();
    if (!g.defined()) continue;
    Update u = update(i, detail::detached_value(g), t);
    for (size_t k = 0; k < u.slots.size(); ++k) commit(slots_[i][k], u.slots[k]);
    commit(params_[i], u.param);
  }
  commit(step_, t);
}

Tensor Optimizer::per_step(int key, DType dtype, const std::function<Tensor()>& make) {
  for (const PerStep& e : per_step_)
    if (e.key == key && e.dtype == dtype) return e.value;
  Tensor v = make();
  per_step_.push_back({key, dtype, v});
  return v;
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
    invalidate_compiled_steps();
  options_ = o;
  set_lr(o.lr);
}

Optimizer::Update SGD::update(size_t i, const Tensor& grad, const Tensor& t) {
  const SGDOptions& options = options_;
  const Tensor& p = params()[i];
  Tensor d = options.weight_decay != 0 ? grad + p * options.weight_decay : grad;
  Update u;
  if (options.momentum != 0) {
    // PyTorch starts the buffer as a copy of the first gradient.
    const Tensor& buf = slots_[i][0];
    Tensor next = where(t == 1, d, buf * options.momentum + d * (1 - options.dampening));
    u.slots.push_back(next);
    d = options.nesterov ? d + next * options.momentum : next;
  }
  u.param = p - d * cast(lr_tensor(), d.dtype());
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
    invalidate_compiled_steps();
  options_ = o;
  set_lr(o.lr);
}

Optimizer::Update Adam::adam_update(size_t i, const Tensor& param, const Tensor& grad, const Tensor& t) {
  const AdamOptions& o = options_;
  Tensor m = slots_[i][0] * o.beta1 + grad * (1 - o.beta1);
  Tensor v = slots_[i][1] * o.beta2 + grad * grad * (1 - o.beta2);
  // Bias corrections from the step count tensor, in f64 as PyTorch computes them; the same for
  // every parameter of a dtype, so computed once a step.
  const DType d = param.dtype();
  Tensor step_size = per_step(kStepSize, d, [&] {
    Tensor bc1 = 1 - pow(full({}, o.beta1, DType::f64), t);
    return cast(lr_tensor() / bc1, d);
  });
  Tensor bc2_sqrt = per_step(kBias2Sqrt, d, [&] { return cast(sqrt(1 - pow(full({}, o.beta2, DType::f64), t)), d); });
  Tensor denom = sqrt(v) / bc2_sqrt + o.eps;
  return {param - step_size * (m / denom), {m, v}};
}

Optimizer::Update Adam::update(size_t i, const Tensor& grad, const Tensor& t) {
  const Tensor& p = params()[i];
  const double wd = options().weight_decay;
  Tensor g = wd != 0 ? grad + p * wd : grad;
  return adam_update(i, p, g, t);
}

AdamW::AdamW(std::vector<Tensor> params, AdamOptions o) : Adam(std::move(params), o) {}

Optimizer::Update AdamW::update(size_t i, const Tensor& grad, const Tensor& t) {
  const Tensor& p = params()[i];
  const double wd = options().weight_decay;
  Tensor decayed = wd != 0 ? p * per_step(kDecay, p.dtype(), [&] { return cast(1 - lr_tensor() * wd, p.dtype()); }) : p;
  return adam_update(i, decayed, grad, t);
}

}  // namespace lazyrt::optim
