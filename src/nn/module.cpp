#include <algorithm>
#include <cmath>
#include <map>

#include "lazyrt/nn.h"
#include "lazyrt/replay.h"
#include "lazyrt/random.h"
#include "ops/op_helpers.h"
#include "ops/views.h"
#include "util/check.h"

namespace lazyrt::nn {

Module::Module(std::string type_name) : type_name_(std::move(type_name)) {}

Tensor Module::forward(const Tensor&) {
  throw Error(type_name_ + ": this module has no single-input forward");
}

Tensor Module::register_parameter(const std::string& name, Tensor value, bool requires_grad) {
  LAZYRT_CHECK(value.defined(), type_name_, ": parameter '", name, "' is undefined");
  for (const auto& [n, t] : params_) LAZYRT_CHECK(n != name, type_name_, ": parameter '", name, "' registered twice");
  Tensor p = detail::detached_value(value);
  if (requires_grad) p.requires_grad_();
  params_.emplace_back(name, p);
  return p;
}

Tensor Module::register_buffer(const std::string& name, Tensor value) {
  LAZYRT_CHECK(value.defined(), type_name_, ": buffer '", name, "' is undefined");
  buffers_.emplace_back(name, value);
  return value;
}

void Module::add_child(const std::string& name, std::shared_ptr<Module> module) {
  LAZYRT_CHECK(module != nullptr, type_name_, ": child module '", name, "' is null");
  for (const auto& [n, m] : children_) LAZYRT_CHECK(n != name, type_name_, ": child '", name, "' registered twice");
  children_.emplace_back(name, std::move(module));
}

void Module::collect(const std::string& prefix, bool recurse, bool buffers, NamedTensors* out) const {
  for (const auto& [n, t] : buffers ? buffers_ : params_) out->emplace_back(prefix + n, t);
  if (!recurse) return;
  for (const auto& [n, m] : children_) m->collect(prefix + n + ".", true, buffers, out);
}

NamedTensors Module::named_parameters(bool recurse) const {
  NamedTensors out;
  collect("", recurse, false, &out);
  return out;
}

NamedTensors Module::named_buffers(bool recurse) const {
  NamedTensors out;
  collect("", recurse, true, &out);
  return out;
}

std::vector<Tensor> Module::parameters(bool recurse) const {
  std::vector<Tensor> out;
  for (auto& [n, t] : named_parameters(recurse)) out.push_back(t);
  return out;
}

StateDict Module::state_dict() const {
  StateDict out = named_parameters();
  for (auto& entry : named_buffers()) out.push_back(std::move(entry));
  return out;
}

void Module::load_state_dict(const StateDict& state, bool strict) {
  std::map<std::string, Tensor> given(state.begin(), state.end());
  StateDict own = state_dict();
  std::vector<std::pair<Tensor, Tensor>> copies;
  for (const auto& [name, t] : own) {
    auto it = given.find(name);
    if (it == given.end()) {
      LAZYRT_CHECK(!strict, "load_state_dict: missing key '", name, "' in the state dict");
      continue;
    }
    const Tensor& v = it->second;
    LAZYRT_CHECK(v.defined() && v.shape() == t.shape(), "load_state_dict: '", name, "' has shape ",
                 v.defined() ? shape_str(v.shape()) : std::string("undefined"), ", the module expects ",
                 shape_str(t.shape()));
    LAZYRT_CHECK(v.dtype() == t.dtype(), "load_state_dict: '", name, "' has dtype ",
                 dtype_name(v.dtype()), ", the module expects ", dtype_name(t.dtype()));
    copies.emplace_back(t, v);
    given.erase(it);
  }
  LAZYRT_CHECK(!strict || given.empty(), "load_state_dict: unexpected key '",
               given.empty() ? "" : given.begin()->first, "' in the state dict");
  NoGradGuard no_grad;
  for (auto& [dst, src] : copies) dst.copy_(detail::detached_value(src));
}

void Module::train(bool on) {
  // What forward computes depends on the mode (dropout): compiled steps retrace.
  if (training_ != on) invalidate_compiled_steps();
  training_ = on;
  for (auto& [n, m] : children_) m->train(on);
}

void Module::zero_grad(bool set_to_none) {
  for (Tensor& p : parameters()) {
    if (set_to_none || !p.grad().defined()) {
      p.set_grad(Tensor());
    } else {
      Tensor g = p.grad();
      g.zero_();
    }
  }
}

// ---- layers -----------------------------------------------------------------------------------

namespace {
// Uniform in [-bound, bound), from the seeded generator.
Tensor uniform(Shape shape, double bound) { return rand(std::move(shape)) * (2 * bound) - bound; }
}  // namespace

Linear::Linear(int64_t in, int64_t out, bool with_bias) : Module("Linear") {
  LAZYRT_CHECK(in > 0 && out > 0, "Linear: features must be positive, got ", in, " and ", out);
  const double bound = 1.0 / std::sqrt(static_cast<double>(in));
  weight = register_parameter("weight", uniform({out, in}, bound));
  if (with_bias) bias = register_parameter("bias", uniform({out}, bound));
}

Tensor Linear::forward(const Tensor& x) {
  LAZYRT_CHECK(x.dim() >= 1 && x.shape().back() == weight.shape()[1], "Linear: input of shape ",
               shape_str(x.shape()), " does not end in in_features = ", weight.shape()[1]);
  Tensor y = matmul(x, transpose(weight, 0, 1));
  // Under autocast the whole linear, bias included, runs in the lower precision (as PyTorch).
  return bias.defined() ? y + detail::autocast_lower(bias) : y;
}

Sequential::Sequential(std::vector<std::shared_ptr<Module>> modules) : Module("Sequential") {
  for (auto& m : modules) push_back(std::move(m));
}

Sequential& Sequential::push_back(std::shared_ptr<Module> module) {
  register_module(std::to_string(children().size()), std::move(module));
  return *this;
}

Tensor Sequential::forward(const Tensor& input) {
  Tensor x = input;
  for (const auto& [n, m] : children()) x = m->forward(x);
  return x;
}

Tensor ReLU::forward(const Tensor& x) { return relu(x); }
Tensor Tanh::forward(const Tensor& x) { return tanh(x); }
Tensor Sigmoid::forward(const Tensor& x) { return sigmoid(x); }

Dropout::Dropout(double p_) : Module("Dropout"), p(p_) {
  LAZYRT_CHECK(p >= 0 && p <= 1, "Dropout: p must be in [0, 1], got ", p);
}
Tensor Dropout::forward(const Tensor& x) { return dropout(x, p, is_training()); }

Tensor GELU::forward(const Tensor& x) { return gelu(x, approximate); }

LayerNorm::LayerNorm(Shape shape, double eps_, bool affine)
    : Module("LayerNorm"), normalized_shape(std::move(shape)), eps(eps_) {
  if (affine) {
    weight = register_parameter("weight", ones(normalized_shape));
    bias = register_parameter("bias", zeros(normalized_shape));
  }
}

Tensor LayerNorm::forward(const Tensor& x) {
  return layer_norm(x, normalized_shape, weight.defined() ? std::optional<Tensor>(weight) : std::nullopt,
                    bias.defined() ? std::optional<Tensor>(bias) : std::nullopt, eps);
}

Embedding::Embedding(int64_t num, int64_t dim, std::optional<int64_t> pad) : Module("Embedding"), padding_idx(pad) {
  LAZYRT_CHECK(num > 0 && dim > 0, "Embedding: sizes must be positive, got ", num, " and ", dim);
  if (padding_idx) {
    LAZYRT_CHECK(*padding_idx >= -num && *padding_idx < num, "Embedding: padding_idx ", *padding_idx,
                 " out of range for ", num, " embeddings");
    if (*padding_idx < 0) *padding_idx += num;
  }
  Tensor w = randn({num, dim});
  if (padding_idx) {
    Tensor row = cast(reshape(arange(num), {num, 1}) == *padding_idx, DType::b8);
    w = masked_fill(w, row, 0);
  }
  weight = register_parameter("weight", w);
}

Tensor Embedding::forward(const Tensor& indices) { return embedding(weight, indices, padding_idx); }

Conv2d::Conv2d(int64_t in, int64_t out, std::vector<int64_t> kernel, std::vector<int64_t> stride_,
               std::vector<int64_t> padding_, std::vector<int64_t> dilation_, int64_t groups_, bool with_bias)
    : Module("Conv2d"), stride(std::move(stride_)), padding(std::move(padding_)), dilation(std::move(dilation_)),
      groups(groups_) {
  LAZYRT_CHECK(in > 0 && out > 0 && groups > 0 && in % groups == 0 && out % groups == 0,
               "Conv2d: channels ", in, " -> ", out, " must be positive and divisible by groups ", groups);
  LAZYRT_CHECK(kernel.size() == 1 || kernel.size() == 2, "Conv2d: kernel_size takes one or two values");
  const int64_t kh = kernel[0], kw = kernel.size() == 2 ? kernel[1] : kernel[0];
  const double bound = 1.0 / std::sqrt(static_cast<double>(in / groups * kh * kw));
  weight = register_parameter("weight", uniform({out, in / groups, kh, kw}, bound));
  if (with_bias) bias = register_parameter("bias", uniform({out}, bound));
}

Tensor Conv2d::forward(const Tensor& x) { return conv2d(x, weight, bias, stride, padding, dilation, groups); }

MaxPool2d::MaxPool2d(std::vector<int64_t> k, std::vector<int64_t> s, std::vector<int64_t> p,
                     std::vector<int64_t> d, bool ceil)
    : Module("MaxPool2d"), kernel_size(std::move(k)), stride(std::move(s)), padding(std::move(p)),
      dilation(std::move(d)), ceil_mode(ceil) {}

Tensor MaxPool2d::forward(const Tensor& x) {
  return max_pool2d(x, kernel_size, stride, padding, dilation, ceil_mode);
}

BatchNorm::BatchNorm(std::string type_name, std::vector<int64_t> input_dims, int64_t features, double eps_,
                     std::optional<double> momentum_, bool affine_, bool track)
    : Module(std::move(type_name)), num_features(features), eps(eps_), momentum(momentum_), affine(affine_),
      track_running_stats(track), input_dims_(std::move(input_dims)) {
  LAZYRT_CHECK(features > 0, this->type_name(), ": num_features must be positive, got ", features);
  if (affine) {
    weight = register_parameter("weight", ones({features}));
    bias = register_parameter("bias", zeros({features}));
  }
  if (track) {
    running_mean = register_buffer("running_mean", zeros({features}));
    running_var = register_buffer("running_var", ones({features}));
    num_batches_tracked = register_buffer("num_batches_tracked", zeros({}, DType::i64));
  }
}

Tensor BatchNorm::forward(const Tensor& x) {
  LAZYRT_CHECK(x.defined() && std::find(input_dims_.begin(), input_dims_.end(), x.dim()) != input_dims_.end(),
               type_name(), ": expected an input of ", input_dims_.front(),
               input_dims_.size() > 1 ? detail::str_cat(" or ", input_dims_.back()) : std::string(), " dims, got ",
               x.defined() ? shape_str(x.shape()) : std::string("an undefined tensor"));
  LAZYRT_CHECK(x.shape()[1] == num_features, type_name(), ": expected ", num_features, " channels in dim 1, got ",
               shape_str(x.shape()));
  const bool tracking = is_training() && track_running_stats;
  if (tracking) {
    NoGradGuard no_grad;
    num_batches_tracked.add_(ones({}, DType::i64));
  }
  // Running statistics are read in eval mode and updated while tracking in training.
  const bool read_running = !is_training() || track_running_stats;
  return batch_norm(x, read_running ? running_mean : Tensor(), read_running ? running_var : Tensor(), weight, bias,
                    is_training() || !running_mean.defined(), momentum, eps,
                    tracking ? num_batches_tracked : Tensor());
}

BatchNorm1d::BatchNorm1d(int64_t features, double eps, std::optional<double> momentum, bool affine, bool track)
    : BatchNorm("BatchNorm1d", {2, 3}, features, eps, momentum, affine, track) {}
BatchNorm2d::BatchNorm2d(int64_t features, double eps, std::optional<double> momentum, bool affine, bool track)
    : BatchNorm("BatchNorm2d", {4}, features, eps, momentum, affine, track) {}

GroupNorm::GroupNorm(int64_t groups, int64_t channels, double eps_, bool affine)
    : Module("GroupNorm"), num_groups(groups), num_channels(channels), eps(eps_) {
  LAZYRT_CHECK(groups > 0 && channels > 0 && channels % groups == 0, "GroupNorm: num_channels (", channels,
               ") must be divisible by num_groups (", groups, "), both positive");
  if (affine) {
    weight = register_parameter("weight", ones({channels}));
    bias = register_parameter("bias", zeros({channels}));
  }
}

Tensor GroupNorm::forward(const Tensor& x) { return group_norm(x, num_groups, weight, bias, eps); }

AdaptiveAvgPool2d::AdaptiveAvgPool2d(std::vector<int64_t> size)
    : Module("AdaptiveAvgPool2d"), output_size(std::move(size)) {}

Tensor AdaptiveAvgPool2d::forward(const Tensor& x) { return adaptive_avg_pool2d(x, output_size); }

// ---- losses -----------------------------------------------------------------------------------

namespace {
Tensor reduce_loss(const Tensor& l, const std::string& reduction, const char* op) {
  if (reduction == "mean") return mean(l);
  if (reduction == "sum") return sum(l);
  LAZYRT_CHECK(reduction == "none", op, ": reduction must be 'mean', 'sum' or 'none', got '",
               reduction, "'");
  return l;
}
}  // namespace

Tensor mse_loss(const Tensor& input, const Tensor& target, const std::string& reduction) {
  LAZYRT_CHECK(input.shape() == target.shape(), "mse_loss: input ", shape_str(input.shape()),
               " and target ", shape_str(target.shape()), " must have one shape");
  Tensor d = detail::autocast_f32(input) - detail::autocast_f32(target);
  return reduce_loss(d * d, reduction, "mse_loss");
}

Tensor cross_entropy(const Tensor& logits, const Tensor& target, double label_smoothing,
                     const std::string& reduction, int64_t ignore_index) {
  LAZYRT_CHECK(logits.defined() && target.defined(), "cross_entropy: logits and target must be defined");
  LAZYRT_CHECK(logits.dim() >= 1 && is_floating(logits.dtype()),
               "cross_entropy: logits must be floating [C], [N, C] or [N, C, d1, ...], got ",
               dtype_name(logits.dtype()), shape_str(logits.shape()));
  LAZYRT_CHECK(label_smoothing >= 0 && label_smoothing <= 1,
               "cross_entropy: label_smoothing must be in [0, 1], got ", label_smoothing);
  LAZYRT_CHECK(reduction == "mean" || reduction == "sum" || reduction == "none",
               "cross_entropy: reduction must be 'mean', 'sum' or 'none', got '", reduction, "'");
  const int64_t cdim = logits.dim() == 1 ? 0 : 1;
  const int64_t classes = logits.shape()[cdim];
  const double e = label_smoothing;
  Tensor logp = lazyrt::log_softmax(logits, cdim);
  // The smoothing term: minus the mean log-probability over the classes.
  Tensor smooth = e == 0 ? Tensor() : -sum(logp, {cdim}) * (e / static_cast<double>(classes));

  if (is_floating(target.dtype())) {
    // Class probabilities, one per logit.
    LAZYRT_CHECK(target.shape() == logits.shape(), "cross_entropy: probability targets must have the logits' shape ",
                 shape_str(logits.shape()), ", got ", dtype_name(target.dtype()), shape_str(target.shape()));
    Tensor l = -sum(detail::cast_to(target, logp.dtype()) * logp, {cdim});
    if (e != 0) l = l * (1 - e) + smooth;
    return reduce_loss(l, reduction, "cross_entropy");
  }
  Shape expected = logits.shape();
  expected.erase(expected.begin() + cdim);
  LAZYRT_CHECK(target.dtype() != DType::b8 && target.shape() == expected,
               "cross_entropy: class index targets must be integer of shape ", shape_str(expected),
               " for logits ", dtype_name(logits.dtype()), shape_str(logits.shape()), ", got ",
               dtype_name(target.dtype()), shape_str(target.shape()));
  Tensor t = detail::cast_to(target, DType::i64);
  Tensor valid = t != full({}, ignore_index, DType::i64);
  // Ignored targets pick class 0 (any class in range), then count for nothing.
  Tensor picked = where(valid, t, zeros({}, DType::i64));
  Tensor nll = -squeeze(gather(logp, cdim, unsqueeze(picked, cdim)), cdim);
  Tensor l = e == 0 ? nll : nll * (1 - e) + smooth;
  l = where(valid, l, zeros({}, l.dtype()));
  if (reduction == "mean") return sum(l) / sum(detail::cast_to(valid, l.dtype()));
  return reduce_loss(l, reduction, "cross_entropy");
}

Tensor binary_cross_entropy_with_logits(const Tensor& x_in, const Tensor& t_in, const std::string& reduction) {
  LAZYRT_CHECK(x_in.shape() == t_in.shape(), "binary_cross_entropy_with_logits: input ",
               shape_str(x_in.shape()), " and target ", shape_str(t_in.shape()), " must have one shape");
  // max(x, 0) - x t + log(1 + exp(-|x|)): no overflow for large |x|.
  const Tensor x32 = detail::autocast_f32(x_in), t32 = detail::autocast_f32(t_in);
  const Tensor& x = x32;
  const Tensor& t = t32;
  Tensor l = relu(x) - x * t + log(exp(-abs(x)) + 1);
  return reduce_loss(l, reduction, "binary_cross_entropy_with_logits");
}

}  // namespace lazyrt::nn
