// Mixed precision: autocast and a gradient scaler, both without host syncs, so that a
// mixed-precision training step is one graph and can be replayed.
#pragma once

#include <vector>

#include "lazyrt/optim.h"
#include "lazyrt/tensor.h"

namespace lazyrt::amp {

/// RAII, per thread: inside, ops follow PyTorch's CPU autocast policy. matmul (and so linear)
/// and conv compute in `dtype` (bf16 by default; f16 allowed); reductions (sum, mean),
/// softmax, log_softmax and the losses compute in f32; other ops promote as usual.
class AutocastGuard {
 public:
  explicit AutocastGuard(DType dtype = DType::bf16, bool enabled = true);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  bool prev_enabled_;
  DType prev_dtype_;
};

bool autocast_enabled();
DType autocast_dtype();

struct GradScalerOptions {
  double init_scale = 65536.0;
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;
};

/// PyTorch's GradScaler with its state (scale, growth tracker, found_inf) in tensors, updated
/// in place: scale(loss), then unscale_(opt) or step(opt) (which unscales if needed and skips
/// the update inside the graph when a gradient is not finite), then update().
class GradScaler {
 public:
  explicit GradScaler(GradScalerOptions options = {});
  Tensor scale(const Tensor& loss) const;
  /// Divides the optimizer's gradients by the scale in place; records found_inf.
  void unscale_(optim::Optimizer& opt);
  /// unscale_ (unless done) and opt.step(found_inf).
  void step(optim::Optimizer& opt);
  /// Backs the scale off after a non-finite step, grows it after growth_interval finite ones.
  void update();

  const Tensor& scale_tensor() const { return scale_; }
  const Tensor& found_inf() const { return found_inf_; }
  /// The state tensors {scale, growth tracker, found_inf}, for capturing a step.
  std::vector<Tensor> state() const { return {scale_, tracker_, found_inf_}; }

 private:
  GradScalerOptions options_;
  Tensor scale_, tracker_, found_inf_;
  bool unscaled_ = false;
};

}  // namespace lazyrt::amp
