// The functional layers of nn.h, composed from public tensor ops (so their gradients come from
// the ops'): batch and group normalization, adaptive average pooling, resizing, and scaled
// dot-product attention. 16-bit inputs compute in f32 and round once, as torch's kernels do.
// Every argument is checked before the first node is recorded.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "lazyrt/nn.h"
#include "lazyrt/random.h"
#include "ops/op_helpers.h"
#include "ops/views.h"
#include "util/check.h"

namespace lazyrt::nn {

using detail::cast_to;
using detail::opmath_type;

namespace {

std::string type_of(const Tensor& t) { return std::string(dtype_name(t.dtype())) + shape_str(t.shape()); }

// A per-channel tensor [C] checked, or undefined.
void check_channel_param(const Tensor& p, int64_t channels, DType dtype, const char* op, const char* what) {
  if (!p.defined()) return;
  LAZYRT_CHECK(p.shape() == Shape{channels}, op, ": ", what, " must be [", channels, "], got ", type_of(p));
  LAZYRT_CHECK(p.dtype() == dtype, op, ": ", what, " has dtype ", dtype_name(p.dtype()), ", expected the input's ",
               dtype_name(dtype));
}

// [C] as [1, C, 1, ...] against an input of `rank` dims.
Tensor per_channel(const Tensor& p, int64_t rank, DType t) {
  Shape s(static_cast<size_t>(rank), 1);
  s[1] = p.shape()[0];
  return reshape(cast_to(p, t), s);
}

// One value for both spatial dims, or one per dim.
template <class V>
std::vector<V> two(std::vector<V> v, const char* op, const char* what) {
  LAZYRT_CHECK(v.size() == 1 || v.size() == 2, op, ": ", what, " takes one value or two (height, width), got ",
               v.size());
  if (v.size() == 1) v.push_back(v[0]);
  return v;
}

// The weight matrices and index vectors below are ops of the graph, made when it runs: nothing
// of size out (or out * in) is computed while tracing, whatever the sizes asked for.

// The size of an [out, in] weight matrix, refused past 64 bits.
void check_matrix(const char* op, int64_t out, int64_t in) {
  int64_t n;
  LAZYRT_CHECK(!__builtin_mul_overflow(out, in, &n), op, ": ", out, " outputs from ", in,
               " inputs need a weight matrix of more than 2^63 elements");
}

// Rows 0..n-1 as an [n, 1] column, and 0..n-1 as a [1, n] row.
Tensor column(int64_t n, DType t = DType::i64) { return reshape(arange(n, t), {n, 1}); }
Tensor row(int64_t n) { return reshape(arange(n), {1, n}); }

// The [out, in] matrix that averages torch's adaptive bins: row i averages inputs
// floor(i in / out) .. ceil((i + 1) in / out) - 1, that is the j with (j + 1) out > i in and
// j out < (i + 1) in (exact in i64, as out * in fits); each weight 1 / count in f64, then t.
Tensor bin_average(int64_t in, int64_t out, DType t) {
  check_matrix("adaptive_avg_pool2d", out, in);
  const Tensor i = column(out), j = row(in);
  const Tensor in_bin = cast(logical_and((j + 1) * out > i * in, j * out < (i + 1) * in), DType::f64);
  return cast(in_bin / sum(in_bin, {1}, true), t);
}

// The [out, in] matrix of linear interpolation along one dim, with torch's source coordinates:
// align_corners: src = dst (in - 1) / (out - 1); otherwise src = (dst + 0.5) / scale - 0.5,
// clamped at 0, with scale = out / in or the given factor. Computed in R (f32, or f64 for f64
// inputs), as torch does, so the weights are torch's; summed per cell in f64.
template <class R>
Tensor linear_weights(int64_t in, int64_t out, bool align_corners, double factor, DType t) {
  check_matrix("interpolate", out, in);
  constexpr DType r = std::is_same_v<R, double> ? DType::f64 : DType::f32;
  R ratio;
  if (align_corners) ratio = out > 1 ? static_cast<R>(in - 1) / static_cast<R>(out - 1) : R(0);
  else ratio = factor > 0 ? static_cast<R>(1.0 / factor) : static_cast<R>(in) / static_cast<R>(out);
  const Tensor dst = column(out, r);
  const Tensor src = align_corners ? dst * static_cast<double>(ratio)
                                   : clamp_min((dst + 0.5) * static_cast<double>(ratio) - 0.5, 0.0);
  const Tensor i0 = clamp_max(cast(src, DType::i64), in - 1);
  const Tensor i1 = where(i0 < in - 1, i0 + 1, i0);
  const Tensor w1 = clamp(src - cast(i0, r), 0.0, 1.0), w0 = 1.0 - w1;
  const Tensor j = row(in);
  const Tensor m = cast(j == i0, DType::f64) * cast(w0, DType::f64) + cast(j == i1, DType::f64) * cast(w1, DType::f64);
  return cast(m, t);
}

// torch's nearest source index: floor(dst * scale) with scale = in / out or 1 / factor (in
// f32), capped at in - 1.
Tensor nearest_indices(int64_t in, int64_t out, double factor) {
  const float scale = factor > 0 ? static_cast<float>(1.0 / factor) : static_cast<float>(in) / static_cast<float>(out);
  return clamp_max(cast(floor(arange(out, DType::f32) * static_cast<double>(scale)), DType::i64), in - 1);
}

}  // namespace

Tensor batch_norm(const Tensor& input, const Tensor& running_mean, const Tensor& running_var, const Tensor& weight,
                  const Tensor& bias, bool training, std::optional<double> momentum, double eps,
                  const Tensor& num_batches_tracked) {
  LAZYRT_CHECK(input.defined() && input.dim() >= 2 && is_floating(input.dtype()),
               "batch_norm: expects a floating input [N, C, *], got ",
               input.defined() ? type_of(input) : std::string("an undefined tensor"));
  const int64_t channels = input.shape()[1];
  const DType dtype = input.dtype();
  check_channel_param(weight, channels, dtype, "batch_norm", "weight");
  check_channel_param(bias, channels, dtype, "batch_norm", "bias");
  LAZYRT_CHECK(running_mean.defined() == running_var.defined(),
               "batch_norm: running_mean and running_var must both be given or both be undefined");
  for (const auto* r : {&running_mean, &running_var}) {
    if (!r->defined()) continue;
    LAZYRT_CHECK(r->shape() == Shape{channels} && is_floating(r->dtype()), "batch_norm: running statistics must be ",
                 "floating [", channels, "], got ", type_of(*r));
  }
  const bool use_batch = training || !running_mean.defined();
  std::vector<int64_t> dims{0};
  int64_t count = input.shape()[0];
  for (int64_t d = 2; d < input.dim(); ++d) {
    dims.push_back(d);
    count *= input.shape()[d];
  }
  LAZYRT_CHECK(!use_batch || count > 1, "batch_norm: expected more than 1 value per channel when training, got ",
               type_of(input));
  const DType t = opmath_type(dtype);
  const Tensor x = cast_to(input, t);
  Tensor mu, var;
  if (use_batch) {
    mu = mean(x, dims, true);
    var = lazyrt::var(x, dims, 0, true);
    if (training && running_mean.defined()) {
      NoGradGuard no_grad;
      const Tensor m = reshape(detail::detached_value(mu), {channels});
      const Tensor v = reshape(detail::detached_value(var), {channels}) * (static_cast<double>(count) / (count - 1));
      // The weight of the batch: momentum, or 1 / count for a cumulative average.
      Tensor w;
      if (!momentum) {
        LAZYRT_CHECK(num_batches_tracked.defined() && num_batches_tracked.shape().empty(),
                     "batch_norm: a cumulative average (no momentum) needs num_batches_tracked, a 0-dim count");
        w = 1.0 / cast_to(num_batches_tracked, DType::f64);
      }
      auto update = [&](Tensor running, const Tensor& batch) {
        const Tensor r = cast_to(running, DType::f64), b = cast_to(batch, DType::f64);
        running.copy_(cast_to(momentum ? b * *momentum + r * (1 - *momentum) : r + (b - r) * w, running.dtype()));
      };
      update(running_mean, m);
      update(running_var, v);
    }
  } else {
    mu = per_channel(running_mean, input.dim(), t);
    var = per_channel(running_var, input.dim(), t);
  }
  // As torch's kernel: y = x * scale + (bias - mean * scale), scale = weight / sqrt(var + eps).
  Tensor scale = rsqrt(var + eps);
  if (weight.defined()) scale = scale * per_channel(weight, input.dim(), t);
  Tensor shift = -(mu * scale);
  if (bias.defined()) shift = shift + per_channel(bias, input.dim(), t);
  return cast_to(x * scale + shift, dtype);
}

Tensor group_norm(const Tensor& input, int64_t num_groups, const Tensor& weight, const Tensor& bias, double eps) {
  LAZYRT_CHECK(input.defined() && input.dim() >= 2 && is_floating(input.dtype()),
               "group_norm: expects a floating input [N, C, *], got ",
               input.defined() ? type_of(input) : std::string("an undefined tensor"));
  const int64_t n = input.shape()[0], channels = input.shape()[1];
  LAZYRT_CHECK(num_groups > 0 && channels % num_groups == 0, "group_norm: ", channels,
               " channels cannot be split into ", num_groups, " groups, for input ", type_of(input));
  check_channel_param(weight, channels, input.dtype(), "group_norm", "weight");
  check_channel_param(bias, channels, input.dtype(), "group_norm", "bias");
  const DType t = opmath_type(input.dtype());
  Tensor g = reshape(cast_to(input, t), {n, num_groups, -1});
  Tensor mu = mean(g, {2}, true);
  Tensor scale = rsqrt(lazyrt::var(g, {2}, 0, true) + eps);
  Tensor y = reshape(g * scale - mu * scale, input.shape());
  if (weight.defined()) y = y * per_channel(weight, input.dim(), t);
  if (bias.defined()) y = y + per_channel(bias, input.dim(), t);
  return cast_to(y, input.dtype());
}

// A bin of whole, equal, non-overlapping windows is an average pooling; one output per dim is
// a mean; anything else averages through the bins' matrices (out x in, each side).
Tensor adaptive_avg_pool2d(const Tensor& input, std::vector<int64_t> output_size) {
  LAZYRT_CHECK(input.defined() && (input.dim() == 3 || input.dim() == 4),
               "adaptive_avg_pool2d: expects a 3-D (unbatched) or 4-D (batched) input, got ",
               input.defined() ? type_of(input) : std::string("an undefined tensor"));
  LAZYRT_CHECK(is_floating(input.dtype()), "adaptive_avg_pool2d: expects a floating input, got ", type_of(input));
  auto out = two(std::move(output_size), "adaptive_avg_pool2d", "output_size");
  const int64_t h = input.shape()[input.dim() - 2], w = input.shape()[input.dim() - 1];
  if (out[0] == -1) out[0] = h;
  if (out[1] == -1) out[1] = w;
  LAZYRT_CHECK(out[0] > 0 && out[1] > 0, "adaptive_avg_pool2d: output_size must be positive, got [", out[0], ", ",
               out[1], "]");
  LAZYRT_CHECK(h > 0 && w > 0, "adaptive_avg_pool2d: expects non-empty spatial dims, got ", type_of(input));
  if (out[0] == 1 && out[1] == 1) return mean(input, {-2, -1}, true);
  if (h % out[0] == 0 && w % out[1] == 0)
    return avg_pool2d(input, {h / out[0], w / out[1]}, {h / out[0], w / out[1]});
  const DType t = opmath_type(input.dtype());
  Tensor y = matmul(matmul(bin_average(h, out[0], t), cast_to(input, t)), transpose(bin_average(w, out[1], t), 0, 1));
  return cast_to(y, input.dtype());
}

Tensor interpolate(const Tensor& input, std::vector<int64_t> size, std::vector<double> scale_factor,
                   const std::string& mode, std::optional<bool> align_corners) {
  LAZYRT_CHECK(input.defined() && input.dim() == 4, "interpolate: expects a 4-D input [N, C, H, W], got ",
               input.defined() ? type_of(input) : std::string("an undefined tensor"));
  LAZYRT_CHECK(mode == "nearest" || mode == "bilinear", "interpolate: mode must be 'nearest' or 'bilinear', got '",
               mode, "'");
  LAZYRT_CHECK(size.empty() != scale_factor.empty(), "interpolate: give either size or scale_factor, not ",
               size.empty() ? "neither" : "both");
  LAZYRT_CHECK(mode == "bilinear" || !align_corners.has_value(),
               "interpolate: align_corners only applies to bilinear, not '", mode, "'");
  const int64_t h = input.shape()[2], w = input.shape()[3];
  std::vector<double> factor{0, 0};
  std::vector<int64_t> out;
  if (!size.empty()) {
    out = two(std::move(size), "interpolate", "size");
  } else {
    factor = two(std::move(scale_factor), "interpolate", "scale_factor");
    LAZYRT_CHECK(factor[0] > 0 && factor[1] > 0, "interpolate: scale_factor must be positive");
    const double oh = std::floor(h * factor[0]), ow = std::floor(w * factor[1]);
    LAZYRT_CHECK(oh < 9.2e18 && ow < 9.2e18, "interpolate: scale_factor ", factor[0], ", ", factor[1],
                 " gives an output size beyond 64 bits");
    out = {static_cast<int64_t>(oh), static_cast<int64_t>(ow)};
  }
  LAZYRT_CHECK(out[0] > 0 && out[1] > 0 && h > 0 && w > 0, "interpolate: input ", type_of(input), " and output size [",
               out[0], ", ", out[1], "] must be non-empty");
  if (mode == "nearest") {
    Tensor y = index_select(input, 2, nearest_indices(h, out[0], factor[0]));
    return index_select(y, 3, nearest_indices(w, out[1], factor[1]));
  }
  LAZYRT_CHECK(is_floating(input.dtype()), "interpolate: bilinear expects a floating input, got ", type_of(input));
  const bool corners = align_corners.value_or(false);
  const DType t = opmath_type(input.dtype());
  auto weights = t == DType::f64 ? linear_weights<double> : linear_weights<float>;
  Tensor wh = weights(h, out[0], corners, factor[0], t);
  Tensor ww = weights(w, out[1], corners, factor[1], t);
  return cast_to(matmul(matmul(wh, cast_to(input, t)), transpose(ww, 0, 1)), input.dtype());
}

Tensor scaled_dot_product_attention(const Tensor& query, const Tensor& key, const Tensor& value,
                                    const Tensor& attn_mask, double dropout_p, bool is_causal,
                                    std::optional<double> scale) {
  for (const auto* t : {&query, &key, &value})
    LAZYRT_CHECK(t->defined() && t->dim() >= 2 && is_floating(t->dtype()),
                 "scaled_dot_product_attention: query, key and value must be floating with at least 2 dims, got ",
                 t->defined() ? type_of(*t) : std::string("an undefined tensor"));
  const int64_t e = query.shape().back(), l = query.shape()[query.dim() - 2], s = key.shape()[key.dim() - 2];
  LAZYRT_CHECK(key.shape().back() == e && value.shape()[value.dim() - 2] == s,
               "scaled_dot_product_attention: query ", type_of(query), ", key ", type_of(key), " and value ",
               type_of(value), " do not fit ([..., L, E], [..., S, E], [..., S, Ev])");
  LAZYRT_CHECK(dropout_p >= 0 && dropout_p < 1, "scaled_dot_product_attention: dropout_p must be in [0, 1), got ",
               dropout_p);
  LAZYRT_CHECK(!(is_causal && attn_mask.defined()),
               "scaled_dot_product_attention: give attn_mask or is_causal, not both");
  const double sc = scale ? *scale : 1.0 / std::sqrt(static_cast<double>(e));
  const DType t = opmath_type(query.dtype());
  Tensor scores = matmul(cast_to(query, t), transpose(cast_to(key, t), -2, -1)) * sc;
  if (is_causal) {
    scores = masked_fill(scores, logical_not(tril(ones({l, s}, DType::b8))), -INFINITY);
  } else if (attn_mask.defined()) {
    if (attn_mask.dtype() == DType::b8) scores = masked_fill(scores, logical_not(attn_mask), -INFINITY);
    else scores = scores + attn_mask;
  }
  Tensor weights = softmax(scores, -1);
  if (dropout_p > 0) weights = dropout(weights, dropout_p, true);
  return cast_to(matmul(weights, cast_to(value, t)), query.dtype());
}

}  // namespace lazyrt::nn
