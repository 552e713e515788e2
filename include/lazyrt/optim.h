// Optimizers with PyTorch's update formulas, built from lazy tensor ops so that the update
// traces into the same graph as forward and backward.
//
// All optimizer state, the step count and the learning rate included, lives in tensors created
// with the optimizer (device data, not graph constants) and updated in place: every step has
// the same graph, a replayed step updates the state like a traced one, and a learning-rate
// schedule never recompiles. step(found_inf) skips the whole update where found_inf is
// non-zero, without reading it on the host (for mixed precision).
//
// Hyperparameters change through set_options()/set_lr(): the learning rate is written into its
// tensor; any other change is part of the traced graph, so it makes compiled steps retrace.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "lazyrt/tensor.h"

namespace lazyrt::detail {
class TracedFunction;
}

namespace lazyrt::optim {

class Optimizer {
 public:
  explicit Optimizer(std::vector<Tensor> params);
  virtual ~Optimizer();
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  /// One update of every parameter that has a gradient. found_inf: a one-element tensor; where
  /// it is non-zero, parameters and state keep their values.
  void step(const Tensor& found_inf = Tensor());
  /// Clears (set_to_none) or zeroes the gradients of the parameters.
  void zero_grad(bool set_to_none = true);

  const std::vector<Tensor>& params() const { return params_; }
  /// Every state tensor (step count first), for capturing a step.
  std::vector<Tensor> state() const;
  /// The step count, an f64 scalar tensor.
  const Tensor& step_count() const { return step_; }
  /// The learning rate; the f64 scalar tensor every step reads it from. set_lr writes the
  /// tensor: compiled steps use the new rate without retracing.
  double lr() const { return lr_value_; }
  void set_lr(double lr);
  const Tensor& lr_tensor() const { return lr_; }

 protected:
  /// New values of a parameter and of its state slots, from its gradient, the step count t
  /// (already advanced) and the learning rate (both f64 scalar tensors); computed from these
  /// and constants alone. step() traces it once per parameter type and records one call node
  /// (ops.def) for each parameter's update: a step records a few nodes per parameter, not one
  /// per op, and compile inlines them again.
  struct Update {
    Tensor param;
    std::vector<Tensor> slots;
  };
  virtual Update update(const Tensor& param, const Tensor& grad, const std::vector<Tensor>& slots, const Tensor& t,
                        const Tensor& lr) = 0;
  /// What update() computes has changed (an option it reads): its traced calls are dropped,
  /// and compiled steps retrace.
  void update_changed();
  /// Slot tensors of parameter i (zeros like it, made at construction).
  std::vector<std::vector<Tensor>> slots_;
  void add_slots(int per_param);

 private:
  std::unique_ptr<detail::TracedFunction> update_fn_;
  std::vector<Tensor> update_in_, update_out_;  // update_fn_'s operands and results, kept for their capacity
  std::vector<Tensor> params_;
  Tensor step_;
  Tensor lr_;
  double lr_value_ = 0;
};

struct SGDOptions {
  double lr = 1e-3;
  double momentum = 0;
  double dampening = 0;
  double weight_decay = 0;
  bool nesterov = false;
};

class SGD : public Optimizer {
 public:
  SGD(std::vector<Tensor> params, SGDOptions options);
  SGDOptions options() const;
  /// Validates and applies new options; a change other than lr makes compiled steps retrace.
  void set_options(const SGDOptions& options);

 private:
  SGDOptions options_;

 protected:
  Update update(const Tensor& param, const Tensor& grad, const std::vector<Tensor>& slots, const Tensor& t,
                const Tensor& lr) override;
};

struct AdamOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0;  // Adam: L2 added to the gradient; AdamW: decoupled
};

class Adam : public Optimizer {
 public:
  Adam(std::vector<Tensor> params, AdamOptions options);
  AdamOptions options() const;
  /// Validates and applies new options; a change other than lr makes compiled steps retrace.
  void set_options(const AdamOptions& options);

 protected:
  Update update(const Tensor& param, const Tensor& grad, const std::vector<Tensor>& slots, const Tensor& t,
                const Tensor& lr) override;
  Update adam_update(const Tensor& param, const Tensor& grad, const std::vector<Tensor>& slots, const Tensor& t,
                     const Tensor& lr);

 private:
  AdamOptions options_;
};

class AdamW : public Adam {
 public:
  /// AdamW's default weight decay is 1e-2, as in PyTorch.
  AdamW(std::vector<Tensor> params, AdamOptions options = {1e-3, 0.9, 0.999, 1e-8, 1e-2});

 protected:
  Update update(const Tensor& param, const Tensor& grad, const std::vector<Tensor>& slots, const Tensor& t,
                const Tensor& lr) override;
};

}  // namespace lazyrt::optim
