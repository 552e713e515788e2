// Modules and losses, built only from the public tensor API (as in libtorch's frontend).
//
// A Module owns named parameters, buffers and child modules. Parameters are leaf tensors that
// require grad; their handles are stable for the module's life (optimizers, replay and
// load_state_dict rely on that), and their values change in place.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "lazyrt/tensor.h"

namespace lazyrt::nn {

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;
/// Parameters and buffers by dotted name ("0.weight", "encoder.bias"), in registration order.
using StateDict = NamedTensors;

class Module {
 public:
  explicit Module(std::string type_name = "Module");
  virtual ~Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  /// The module applied to one input. Modules that take other inputs define their own calls.
  virtual Tensor forward(const Tensor& input);
  Tensor operator()(const Tensor& input) { return forward(input); }

  std::vector<Tensor> parameters(bool recurse = true) const;
  NamedTensors named_parameters(bool recurse = true) const;
  NamedTensors named_buffers(bool recurse = true) const;
  const std::vector<std::pair<std::string, std::shared_ptr<Module>>>& children() const { return children_; }

  StateDict state_dict() const;
  /// Copies every value in place (the tensors keep their identity). All entries are checked
  /// first (names, shapes, dtypes); on any mismatch it throws and changes nothing. With
  /// strict, missing and unexpected names are errors too.
  void load_state_dict(const StateDict& state, bool strict = true);

  void train(bool on = true);
  void eval() { train(false); }
  bool is_training() const { return training_; }
  /// Clears (set_to_none) or zeroes every parameter's gradient.
  void zero_grad(bool set_to_none = true);
  const std::string& type_name() const { return type_name_; }

  Tensor register_parameter(const std::string& name, Tensor value, bool requires_grad = true);
  Tensor register_buffer(const std::string& name, Tensor value);
  template <class M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> module) {
    add_child(name, module);
    return module;
  }

 private:
  void add_child(const std::string& name, std::shared_ptr<Module> module);
  void collect(const std::string& prefix, bool recurse, bool buffers, NamedTensors* out) const;

  std::string type_name_;
  NamedTensors params_, buffers_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  bool training_ = true;
};

/// y = x W^T + b, with PyTorch's default initialisation from the seeded generator:
/// W and b uniform in [-1/sqrt(in), 1/sqrt(in)].
class Linear : public Module {
 public:
  Linear(int64_t in_features, int64_t out_features, bool bias = true);
  Tensor forward(const Tensor& input) override;
  Tensor weight, bias;  // bias undefined without one
};

/// Its children applied in order.
class Sequential : public Module {
 public:
  Sequential() : Module("Sequential") {}
  explicit Sequential(std::vector<std::shared_ptr<Module>> modules);
  Sequential& push_back(std::shared_ptr<Module> module);
  Tensor forward(const Tensor& input) override;
  size_t size() const { return children().size(); }
};

class ReLU : public Module {
 public:
  ReLU() : Module("ReLU") {}
  Tensor forward(const Tensor& x) override;
};
class Tanh : public Module {
 public:
  Tanh() : Module("Tanh") {}
  Tensor forward(const Tensor& x) override;
};
class Sigmoid : public Module {
 public:
  Sigmoid() : Module("Sigmoid") {}
  Tensor forward(const Tensor& x) override;
};
/// Zeroes elements with probability p while training (scaling the rest by 1/(1-p)).
class Dropout : public Module {
 public:
  explicit Dropout(double p = 0.5);
  Tensor forward(const Tensor& x) override;
  double p;
};

class GELU : public Module {
 public:
  explicit GELU(std::string approximate = "none") : Module("GELU"), approximate(std::move(approximate)) {}
  Tensor forward(const Tensor& x) override;
  std::string approximate;  // "none" (erf) or "tanh"
};

/// Normalizes over the trailing normalized_shape dims; weight ones and bias zeros at first.
class LayerNorm : public Module {
 public:
  explicit LayerNorm(Shape normalized_shape, double eps = 1e-5, bool elementwise_affine = true);
  Tensor forward(const Tensor& x) override;
  Shape normalized_shape;
  double eps;
  Tensor weight, bias;  // undefined without elementwise_affine
};

/// A table of num_embeddings vectors of embedding_dim, initialised from N(0, 1) (the
/// padding_idx row zero); forward takes integer indices.
class Embedding : public Module {
 public:
  Embedding(int64_t num_embeddings, int64_t embedding_dim, std::optional<int64_t> padding_idx = std::nullopt);
  Tensor forward(const Tensor& indices) override;
  std::optional<int64_t> padding_idx;
  Tensor weight;
};

/// 2-D convolution, initialised as PyTorch does: weight and bias uniform in
/// [-1/sqrt(fan_in), 1/sqrt(fan_in)] with fan_in = in_channels / groups * kH * kW.
class Conv2d : public Module {
 public:
  Conv2d(int64_t in_channels, int64_t out_channels, std::vector<int64_t> kernel_size,
         std::vector<int64_t> stride = {1}, std::vector<int64_t> padding = {0},
         std::vector<int64_t> dilation = {1}, int64_t groups = 1, bool bias = true);
  Tensor forward(const Tensor& x) override;
  std::vector<int64_t> stride, padding, dilation;
  int64_t groups;
  Tensor weight, bias;
};

class MaxPool2d : public Module {
 public:
  explicit MaxPool2d(std::vector<int64_t> kernel_size, std::vector<int64_t> stride = {},
                     std::vector<int64_t> padding = {0}, std::vector<int64_t> dilation = {1},
                     bool ceil_mode = false);
  Tensor forward(const Tensor& x) override;
  std::vector<int64_t> kernel_size, stride, padding, dilation;
  bool ceil_mode;
};

/// Batch normalization (torch.nn.BatchNorm1d / BatchNorm2d; nn::batch_norm): weight ones and
/// bias zeros with affine; with track_running_stats, the buffers running_mean (zeros),
/// running_var (ones) and num_batches_tracked (i64 0). Training normalizes by the batch and
/// updates the running statistics in place (a compiled step writes them back), momentum none
/// meaning a cumulative average; eval() normalizes by the running statistics.
class BatchNorm : public Module {
 public:
  Tensor forward(const Tensor& x) override;
  int64_t num_features;
  double eps;
  std::optional<double> momentum;
  bool affine, track_running_stats;
  Tensor weight, bias;                                         // undefined without affine
  Tensor running_mean, running_var, num_batches_tracked;       // undefined without tracking

 protected:
  BatchNorm(std::string type_name, std::vector<int64_t> input_dims, int64_t num_features, double eps,
            std::optional<double> momentum, bool affine, bool track_running_stats);

 private:
  std::vector<int64_t> input_dims_;
};
/// Over [N, C] or [N, C, L].
class BatchNorm1d : public BatchNorm {
 public:
  explicit BatchNorm1d(int64_t num_features, double eps = 1e-5, std::optional<double> momentum = 0.1,
                       bool affine = true, bool track_running_stats = true);
};
/// Over [N, C, H, W].
class BatchNorm2d : public BatchNorm {
 public:
  explicit BatchNorm2d(int64_t num_features, double eps = 1e-5, std::optional<double> momentum = 0.1,
                       bool affine = true, bool track_running_stats = true);
};

/// Group normalization (nn::group_norm) with per-channel weight (ones) and bias (zeros).
class GroupNorm : public Module {
 public:
  GroupNorm(int64_t num_groups, int64_t num_channels, double eps = 1e-5, bool affine = true);
  Tensor forward(const Tensor& x) override;
  int64_t num_groups, num_channels;
  double eps;
  Tensor weight, bias;  // undefined without affine
};

/// nn::adaptive_avg_pool2d to output_size.
class AdaptiveAvgPool2d : public Module {
 public:
  explicit AdaptiveAvgPool2d(std::vector<int64_t> output_size);
  Tensor forward(const Tensor& x) override;
  std::vector<int64_t> output_size;
};

// ---- functional layers (torch.nn.functional's names and defaults) ---------------------------
/// Batch normalization over dim 1 of [N, C, *]: with training (or no running statistics),
/// the batch's mean and biased variance normalize, and running_mean / running_var (when
/// given) are updated in place to (1 - momentum) * running + momentum * batch statistic, the
/// variance unbiased; otherwise the running statistics normalize. weight and bias: [C].
/// Without a momentum the update is a cumulative average: momentum 1 / num_batches_tracked,
/// read from that tensor (i64 []) when the graph runs, never on the host.
Tensor batch_norm(const Tensor& input, const Tensor& running_mean, const Tensor& running_var,
                  const Tensor& weight = Tensor(), const Tensor& bias = Tensor(), bool training = false,
                  std::optional<double> momentum = 0.1, double eps = 1e-5,
                  const Tensor& num_batches_tracked = Tensor());
/// Normalization of [N, C, *] over groups of C / num_groups channels (and every other dim),
/// then weight and bias per channel.
Tensor group_norm(const Tensor& input, int64_t num_groups, const Tensor& weight = Tensor(),
                  const Tensor& bias = Tensor(), double eps = 1e-5);
/// Average pooling of [N, C, H, W] (or [C, H, W]) to output_size (one value for both dims or
/// two; -1 keeps that dim), with torch's bins: output i averages input rows
/// floor(i H / OH) .. ceil((i + 1) H / OH) - 1.
Tensor adaptive_avg_pool2d(const Tensor& input, std::vector<int64_t> output_size);
/// Resizing of [N, C, H, W] to `size`, or by `scale_factor` (one value or two; the output is
/// floor(in * factor), and the factor itself maps coordinates, as torch does without
/// recompute_scale_factor). mode "nearest" (torch's, not "nearest-exact") or "bilinear"
/// (align_corners false by default).
Tensor interpolate(const Tensor& input, std::vector<int64_t> size = {}, std::vector<double> scale_factor = {},
                   const std::string& mode = "nearest", std::optional<bool> align_corners = std::nullopt);
/// softmax(q k^T * scale + mask) v over [..., L, E] queries, [..., S, E] keys and [..., S, Ev]
/// values (batch dims broadcast), scale 1 / sqrt(E) unless given. attn_mask: b8 (true keeps a
/// position) or floating (added), broadcast to [..., L, S]; is_causal masks positions j > i.
/// dropout_p drops attention weights (always: pass 0 in evaluation).
Tensor scaled_dot_product_attention(const Tensor& query, const Tensor& key, const Tensor& value,
                                    const Tensor& attn_mask = Tensor(), double dropout_p = 0,
                                    bool is_causal = false, std::optional<double> scale = std::nullopt);

// ---- losses (reduction: "mean", "sum" or "none") -------------------------------------------
Tensor mse_loss(const Tensor& input, const Tensor& target, const std::string& reduction = "mean");
/// logits [N, C] (or [N, C, d1, ...], or [C]) and integer targets [N] ([N, d1, ...], []) in
/// [0, C), or floating class probabilities of the logits' shape. With label smoothing e the
/// target distribution is (1 - e) target + e / C, as in PyTorch. Targets equal to
/// ignore_index add nothing, and "mean" averages over the others (nan when there are none).
Tensor cross_entropy(const Tensor& logits, const Tensor& target, double label_smoothing = 0,
                     const std::string& reduction = "mean", int64_t ignore_index = -100);
Tensor binary_cross_entropy_with_logits(const Tensor& input, const Tensor& target,
                                        const std::string& reduction = "mean");

}  // namespace lazyrt::nn
