#include "lazyrt/amp.h"

#include "ops/op_helpers.h"
#include "ops/views.h"
#include "util/check.h"

namespace lazyrt::amp {
namespace {
thread_local bool enabled = false;
thread_local DType lower = DType::bf16;
}  // namespace

AutocastGuard::AutocastGuard(DType dtype, bool on) : prev_enabled_(enabled), prev_dtype_(lower) {
  LAZYRT_CHECK(dtype == DType::bf16 || dtype == DType::f16, "autocast: dtype must be bf16 or f16, got ",
               dtype_name(dtype));
  enabled = on;
  lower = dtype;
}

AutocastGuard::~AutocastGuard() {
  enabled = prev_enabled_;
  lower = prev_dtype_;
}

bool autocast_enabled() { return enabled; }
DType autocast_dtype() { return lower; }

GradScaler::GradScaler(GradScalerOptions o)
    : options_(o),
      scale_(scalar_tensor(o.init_scale, DType::f32)),
      tracker_(scalar_tensor(0, DType::i32)),
      found_inf_(scalar_tensor(0, DType::f32)) {
  LAZYRT_CHECK(o.init_scale > 0 && o.growth_factor > 1 && o.backoff_factor > 0 && o.backoff_factor < 1 &&
                   o.growth_interval > 0,
               "GradScaler: invalid options");
}

Tensor GradScaler::scale(const Tensor& loss) const { return loss * cast(scale_, loss.dtype()); }

void GradScaler::unscale_(optim::Optimizer& opt) {
  LAZYRT_CHECK(!unscaled_, "GradScaler: unscale_ was already called since the last update");
  NoGradGuard no_grad;
  Tensor inv = 1.0 / cast(scale_, DType::f64);
  Tensor any_bad = zeros({}, DType::b8);
  for (const Tensor& p : opt.params()) {
    Tensor g = p.grad();
    if (!g.defined()) continue;
    g.mul_(cast(inv, g.dtype()));
    // x - x is 0 exactly when x is finite (nan and inf give nan).
    Tensor bad = amax(cast((g - g) != 0, DType::i32)) != 0;
    any_bad = logical_or(any_bad, bad);
  }
  found_inf_.copy_(cast(any_bad, DType::f32));
  unscaled_ = true;
}

void GradScaler::step(optim::Optimizer& opt) {
  if (!unscaled_) unscale_(opt);
  opt.step(found_inf_);
}

void GradScaler::update() {
  NoGradGuard no_grad;
  Tensor bad = found_inf_ != 0;
  Tensor grown = tracker_ + 1;
  Tensor grow = logical_and(logical_not(bad), grown >= options_.growth_interval);
  Tensor next_scale = where(bad, scale_ * options_.backoff_factor,
                            where(grow, scale_ * options_.growth_factor, detail::detached_value(scale_)));
  Tensor next_tracker = where(logical_or(bad, grow), zeros({}, DType::i32), grown);
  scale_.copy_(next_scale);
  tracker_.copy_(next_tracker);
  unscaled_ = false;
}

}  // namespace lazyrt::amp

namespace lazyrt::detail {

Tensor autocast_lower(const Tensor& t) {
  if (!amp::autocast_enabled() || !is_floating(t.dtype())) return t;
  return cast_to(t, amp::autocast_dtype());
}

Tensor autocast_f32(const Tensor& t) {
  if (!amp::autocast_enabled() || (t.dtype() != DType::bf16 && t.dtype() != DType::f16)) return t;
  return cast_to(t, DType::f32);
}

}  // namespace lazyrt::detail
