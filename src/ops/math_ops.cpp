// Math ops of the public API: elementwise functions, activations, reductions and
// normalization, with PyTorch's semantics (torch 1.13).
//
// An op is its own IR op (ops.def) where it needs a kernel or a gradient of its own:
// transcendental functions, activations, rounding, clamp (torch's gradient at the bounds),
// prod, var and std (two passes in double; std's zero gradient at 0), norm, argmax/argmin,
// softmax/log_softmax (max-subtracted). The rest are compositions of IR ops that compute what
// torch computes: reciprocal, lerp, addcmul/addcdiv, leaky_relu, isinf/isfinite, nan_to_num,
// logsumexp, all/any and layer_norm; with 16-bit tensors they compute in f32 and round once
// (opmath_type). Every check runs before the first op is recorded.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <limits>
#include <tuple>

#include "lazyrt/tensor.h"
#include "ops/op_helpers.h"
#include "ops/views.h"
#include "util/check.h"

namespace lazyrt {

using ir::OpKind;
using namespace detail;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

void check_floating(const Tensor& a, const char* op) {
  LAZYRT_CHECK(is_floating(impl_of(a, op).type.dtype), op,
               ": expects a floating tensor (f32, f64, bf16, f16), got ", dtype_name(a.dtype()),
               shape_str(a.shape()));
}

// A new handle on a's value: torch returns a new tensor even where the op changes nothing.
Tensor copy_of(const Tensor& a) { return apply(OpKind::Cast, {a}, {a.dtype()}); }

// The largest finite value of a floating dtype.
double finite_max(DType d) {
  switch (d) {
    case DType::f64: return DBL_MAX;
    case DType::bf16: return 3.38953138925153547590470800371487866880e38;
    case DType::f16: return 65504.0;
    default: return FLT_MAX;
  }
}

// Reductions of a's truth values (non-zero, nan included): amin (all) or amax (any) over b8,
// or the empty answer (true for all, false for any) when a reduced dim is empty.
Tensor truth_reduce(const Tensor& a, std::vector<int64_t> dims, bool keepdim, bool is_all,
                    const char* op) {
  impl_of(a, op);
  auto d = reduce_dims(a, std::move(dims), op);
  bool empty = false;
  for (int64_t k : d) empty = empty || a.shape()[k] == 0;
  if (empty) {
    Shape out;
    for (int64_t k = 0; k < a.dim(); ++k) {
      bool reduced = std::find(d.begin(), d.end(), k) != d.end();
      if (!reduced) out.push_back(a.shape()[k]);
      else if (keepdim) out.push_back(1);
    }
    return constant_tensor(is_all ? 1 : 0, DType::b8, out);
  }
  // a != 0 rather than a cast: a comparison records no gradient, so neither does the result.
  Tensor flags = a.dtype() == DType::b8 ? a : a != 0;
  return apply(is_all ? OpKind::Amin : OpKind::Amax, {flags}, {d, keepdim});
}

Tensor arg_extreme(OpKind op, const Tensor& a, std::optional<int64_t> dim, bool keepdim,
                   const char* name) {
  impl_of(a, name);
  LAZYRT_CHECK(a.dtype() != DType::b8, name, ": does not take b8 tensors, got b8",
               shape_str(a.shape()));
  if (!dim) {
    LAZYRT_CHECK(a.numel() > 0, name, ": the tensor ", shape_str(a.shape()),
                 " is empty; expected a dim to reduce when it has no elements");
    Tensor r = apply(op, {reshape(a, {-1})}, {int64_t{0}, false});
    return keepdim ? reshape(r, Shape(static_cast<size_t>(a.dim()), 1)) : r;
  }
  const int64_t d = wrap_dim(*dim, a.shape(), name);
  LAZYRT_CHECK(a.dim() == 0 || a.shape()[d] != 0, name, ": expected reduction dim ", d,
               " to have non-zero size; input shape ", shape_str(a.shape()));
  return apply(op, {a}, {d, keepdim});
}

Tensor variance(OpKind op, const Tensor& a, std::vector<int64_t> dims, double correction,
                bool keepdim, const char* name) {
  check_floating(a, name);
  auto d = reduce_dims(a, std::move(dims), name);
  return apply(op, {a}, {d, keepdim, correction});
}

Tensor normalize(OpKind op, const Tensor& a, int64_t dim, std::optional<DType> dtype,
                 const char* name) {
  impl_of(a, name);
  Tensor x = dtype ? cast_to(a, *dtype) : a;
  LAZYRT_CHECK(is_floating(x.dtype()), name, ": expects a floating tensor, got ",
               dtype_name(x.dtype()), shape_str(x.shape()), "; pass a floating dtype to compute in");
  return apply(op, {x}, {wrap_dim(dim, x.shape(), name)});
}

}  // namespace

// ---- elementwise ----------------------------------------------------------------------------

// torch computes 1 / a in the promoted type, true division: integers and bools give f32.
Tensor reciprocal(const Tensor& a) { return arith(OpKind::Div, a, Scalar(1), /*scalar_first=*/true); }
Tensor round(const Tensor& a, int64_t decimals) {
  if (decimals == 0) return round(a);  // integers unchanged, as torch.round(a) keeps them
  check_floating(a, "round");
  // torch scales by 10^|decimals| in a's dtype, dividing after rounding for positive decimals
  // and multiplying for negative ones, so the result is the nearest such number it computes.
  const Scalar scale(std::pow(10.0, std::fabs(static_cast<double>(decimals))));  // |INT64_MIN| too
  return decimals > 0 ? round(a * scale) / scale : round(a / scale) * scale;
}

Tensor clamp(const Tensor& a, std::optional<Scalar> min, std::optional<Scalar> max) {
  impl_of(a, "clamp");
  LAZYRT_CHECK(min || max, "clamp: at least one of min and max must be given");
  Promotion p;
  p.add(a);
  if (min) p.add(*min);
  if (max) p.add(*max);
  const DType t = p.result();
  LAZYRT_CHECK(t != DType::b8, "clamp: does not take b8 tensors with bool bounds, got b8",
               shape_str(a.shape()));
  // As torch: with both bounds, a nan bound makes every element nan (the kernel does that);
  // a single nan bound is ignored (its kernel's max(x, nan) keeps x). Promotion saw it anyway.
  const bool nan_min = min && std::isnan(min->to_double());
  const bool nan_max = max && std::isnan(max->to_double());
  if (!(min && max)) {
    if (nan_min) min.reset();
    if (nan_max) max.reset();
  }
  Tensor lo = constant_tensor(min ? min->to_double() : 0.0, t);
  Tensor hi = constant_tensor(max ? max->to_double() : 0.0, t);
  return apply(OpKind::Clamp, {cast_to(a, t), lo, hi}, {min.has_value(), max.has_value()});
}

Tensor clamp(const Tensor& a, const std::optional<Tensor>& min, const std::optional<Tensor>& max) {
  impl_of(a, "clamp");
  const bool has_min = min && min->defined(), has_max = max && max->defined();
  LAZYRT_CHECK(has_min || has_max, "clamp: at least one of min and max must be given");
  Promotion p;
  p.add(a);
  if (has_min) p.add(*min);
  if (has_max) p.add(*max);
  const DType t = p.result();
  LAZYRT_CHECK(t != DType::b8, "clamp: does not take b8 tensors with b8 bounds, got b8",
               shape_str(a.shape()));
  Shape s = a.shape();
  if (has_min) s = ir::broadcast_shapes(s, min->shape(), "clamp");
  if (has_max) s = ir::broadcast_shapes(s, max->shape(), "clamp");
  Tensor lo = has_min ? cast_to(*min, t) : constant_tensor(0, t);
  Tensor hi = has_max ? cast_to(*max, t) : constant_tensor(0, t);
  return apply(OpKind::Clamp, {cast_to(a, t), lo, hi}, {has_min, has_max});
}

namespace {
void check_lerp(const Tensor& start, const Tensor& end, const Tensor* weight) {
  check_floating(start, "lerp");
  LAZYRT_CHECK(impl_of(end, "lerp").type.dtype == start.dtype(), "lerp: expected dtype ",
               dtype_name(start.dtype()), " for end but got ", dtype_name(end.dtype()),
               shape_str(end.shape()));
  Shape s = ir::broadcast_shapes(start.shape(), end.shape(), "lerp");
  if (weight) {
    LAZYRT_CHECK(impl_of(*weight, "lerp").type.dtype == start.dtype(), "lerp: expected dtype ",
                 dtype_name(start.dtype()), " for weight but got ", dtype_name(weight->dtype()),
                 shape_str(weight->shape()));
    ir::broadcast_shapes(s, weight->shape(), "lerp");
  }
}
}  // namespace

// torch computes from the nearer end: start + w (end - start) for |w| < 0.5, else
// end - (end - start) (1 - w), all in the tensors' dtype (f32 for 16-bit tensors).
Tensor lerp(const Tensor& start_in, const Tensor& end_in, Scalar weight) {
  check_lerp(start_in, end_in, nullptr);
  const DType t = opmath_type(start_in.dtype());
  const Tensor start = cast_to(start_in, t), end = cast_to(end_in, t);
  double w = weight.to_double();
  if (t != DType::f64) w = static_cast<float>(w);  // torch tests the weight in its dtype
  Tensor wt = constant_tensor(w, t);
  Tensor diff = end - start;
  return cast_to(std::abs(w) < 0.5 ? start + wt * diff : end - diff * (1 - wt), start_in.dtype());
}

Tensor lerp(const Tensor& start_in, const Tensor& end_in, const Tensor& weight_in) {
  check_lerp(start_in, end_in, &weight_in);
  const DType t = opmath_type(start_in.dtype());
  const Tensor start = cast_to(start_in, t), end = cast_to(end_in, t), weight = cast_to(weight_in, t);
  Tensor diff = end - start;
  return cast_to(where(abs(weight) < 0.5, start + weight * diff, end - diff * (1 - weight)), start_in.dtype());
}

namespace {
// self + (value * t1) OP t2 in the promoted dtype of the three tensors (f32 for 16-bit ones,
// rounded once), as torch's kernels.
Tensor add_scaled(OpKind op, const Tensor& a, const Tensor& t1, const Tensor& t2, Scalar value,
                  const char* name) {
  impl_of(a, name);
  impl_of(t1, name);
  impl_of(t2, name);
  Promotion p;
  p.add(a);
  p.add(t1);
  p.add(t2);
  const DType result = p.result(), t = opmath_type(result);
  Shape s = ir::broadcast_shapes(ir::broadcast_shapes(a.shape(), t1.shape(), name), t2.shape(), name);
  Tensor x1 = cast_to(t1, t);
  if (value.to_double() != 1) x1 = apply(OpKind::Mul, {constant_tensor(value.to_double(), t), x1});
  return cast_to(apply(OpKind::Add, {cast_to(a, t), apply(op, {x1, cast_to(t2, t)})}), result);
}
}  // namespace

Tensor addcmul(const Tensor& a, const Tensor& t1, const Tensor& t2, Scalar value) {
  return add_scaled(OpKind::Mul, a, t1, t2, value, "addcmul");
}

Tensor addcdiv(const Tensor& a, const Tensor& t1, const Tensor& t2, Scalar value) {
  LAZYRT_CHECK(is_floating(impl_of(t1, "addcdiv").type.dtype) ||
                   is_floating(impl_of(t2, "addcdiv").type.dtype),
               "addcdiv: integer division of tensor1 (", dtype_name(t1.dtype()),
               shape_str(t1.shape()), ") by tensor2 (", dtype_name(t2.dtype()), shape_str(t2.shape()),
               ") is not supported, as in torch; cast one of them to a floating dtype");
  return add_scaled(OpKind::Div, a, t1, t2, value, "addcdiv");
}

Tensor isinf(const Tensor& a) {
  if (!is_floating(impl_of(a, "isinf").type.dtype)) return constant_tensor(0, DType::b8, a.shape());
  return abs(a) == kInf;
}

Tensor isfinite(const Tensor& a) {
  if (!is_floating(impl_of(a, "isfinite").type.dtype)) return constant_tensor(1, DType::b8, a.shape());
  return abs(a) < kInf;  // false for nan and for both infinities
}

Tensor nan_to_num(const Tensor& a, std::optional<double> nan, std::optional<double> posinf,
                  std::optional<double> neginf) {
  const DType t = impl_of(a, "nan_to_num").type.dtype;
  if (!is_floating(t)) return copy_of(a);
  Tensor r = where(isnan(a), constant_tensor(nan.value_or(0.0), t), a);
  r = where(a == kInf, constant_tensor(posinf.value_or(finite_max(t)), t), r);
  return where(a == -kInf, constant_tensor(neginf.value_or(-finite_max(t)), t), r);
}

// ---- activations ----------------------------------------------------------------------------

Tensor gelu(const Tensor& a, std::string_view approximate) {
  LAZYRT_CHECK(approximate == "none" || approximate == "tanh",
               "gelu: approximate must be \"none\" or \"tanh\", got \"", std::string(approximate), "\"");
  check_floating(a, "gelu");
  return apply(OpKind::Gelu, {a}, {approximate == "tanh"});
}

Tensor silu(const Tensor& a) {
  check_floating(a, "silu");
  return apply(OpKind::Silu, {a});
}

Tensor softplus(const Tensor& a, Scalar beta, Scalar threshold) {
  check_floating(a, "softplus");
  return apply(OpKind::Softplus, {a}, {beta.to_double(), threshold.to_double()});
}

Tensor leaky_relu(const Tensor& a, Scalar negative_slope) {
  check_floating(a, "leaky_relu");
  // 16-bit tensors multiply in f32, by the slope as given, and round once (torch's kernel).
  const Tensor x = cast_to(a, opmath_type(a.dtype()));
  return cast_to(where(x > 0, x, x * negative_slope), a.dtype());
}

// ---- reductions -----------------------------------------------------------------------------

Tensor prod(const Tensor& a, std::optional<int64_t> dim, bool keepdim) {
  impl_of(a, "prod");
  auto d = reduce_dims(a, dim ? std::vector<int64_t>{*dim} : std::vector<int64_t>{}, "prod");
  Tensor v = is_floating(a.dtype()) ? a : cast_to(a, DType::i64);
  return apply(OpKind::Prod, {v}, {d, keepdim});
}

Tensor var(const Tensor& a, std::vector<int64_t> dims, double correction, bool keepdim) {
  return variance(OpKind::Var, a, std::move(dims), correction, keepdim, "var");
}

Tensor std(const Tensor& a, std::vector<int64_t> dims, double correction, bool keepdim) {
  return variance(OpKind::Std, a, std::move(dims), correction, keepdim, "std");
}

// torch's algorithm: m = amax(x) with infinite maxima replaced by 0, then
// log(sum(exp(x - m))) + m. The maximum is a constant of the derivative (its terms cancel),
// so it is taken from a detached x.
Tensor logsumexp(const Tensor& a, std::vector<int64_t> dims, bool keepdim) {
  impl_of(a, "logsumexp");
  const DType dtype = is_floating(a.dtype()) ? a.dtype() : DType::f32;
  Tensor x = cast_to(a, opmath_type(dtype));  // 16-bit tensors in f32, rounded once
  auto d = reduce_dims(x, std::move(dims), "logsumexp");
  if (x.numel() == 0) return cast_to(log(sum(exp(x), d, keepdim)), dtype);
  Tensor m = amax(detail::detached_value(x), d, true);
  m = where(abs(m) == kInf, zeros_like(m), m);
  Tensor r = log(sum(exp(x - m), d, keepdim));
  return cast_to(r + reshape(m, r.shape()), dtype);
}

Tensor argmax(const Tensor& a, std::optional<int64_t> dim, bool keepdim) {
  return arg_extreme(OpKind::ArgMax, a, dim, keepdim, "argmax");
}
Tensor argmin(const Tensor& a, std::optional<int64_t> dim, bool keepdim) {
  return arg_extreme(OpKind::ArgMin, a, dim, keepdim, "argmin");
}

Tensor all(const Tensor& a, std::vector<int64_t> dims, bool keepdim) {
  return truth_reduce(a, std::move(dims), keepdim, true, "all");
}
Tensor any(const Tensor& a, std::vector<int64_t> dims, bool keepdim) {
  return truth_reduce(a, std::move(dims), keepdim, false, "any");
}

Tensor norm(const Tensor& a, double p, std::vector<int64_t> dims, bool keepdim) {
  check_floating(a, "norm");
  LAZYRT_CHECK(p == 1 || p == 2 || p == kInf, "norm: p must be 1, 2 or inf (INFINITY), got ", p,
               " for a tensor ", dtype_name(a.dtype()), shape_str(a.shape()));
  auto d = reduce_dims(a, std::move(dims), "norm");
  // The largest magnitude of no elements has no value (max has no identity), as in torch.
  for (int64_t k : d) {
    LAZYRT_CHECK(p != kInf || a.shape()[static_cast<size_t>(k)] != 0, "norm: the inf norm over dim ", k,
                 " of ", dtype_name(a.dtype()), shape_str(a.shape()), " is undefined: that dim is empty");
  }
  return apply(OpKind::Norm, {a}, {d, keepdim, p});
}

// ---- normalization --------------------------------------------------------------------------

// Under autocast, softmax and log_softmax compute in f32.
Tensor softmax(const Tensor& a, int64_t dim, std::optional<DType> dtype) {
  impl_of(a, "softmax");
  return normalize(OpKind::Softmax, autocast_f32(a), dim, dtype, "softmax");
}
Tensor log_softmax(const Tensor& a, int64_t dim, std::optional<DType> dtype) {
  impl_of(a, "log_softmax");
  return normalize(OpKind::LogSoftmax, autocast_f32(a), dim, dtype, "log_softmax");
}

// As torch's kernel: scale = 1 / sqrt(var + eps), y = x * scale - mean * scale, then
// y * weight + bias.
Tensor layer_norm(const Tensor& a, const Shape& normalized_shape, const std::optional<Tensor>& weight,
                  const std::optional<Tensor>& bias, double eps) {
  impl_of(a, "layer_norm");
  const auto k = static_cast<int64_t>(normalized_shape.size());
  LAZYRT_CHECK(k >= 1, "layer_norm: normalized_shape must have at least one dim, got []");
  const Shape& s = a.shape();
  bool fits = a.dim() >= k;
  for (int64_t i = 0; fits && i < k; ++i) fits = s[a.dim() - k + i] == normalized_shape[i];
  LAZYRT_CHECK(fits, "layer_norm: given normalized_shape ", shape_str(normalized_shape),
               ", expected an input of shape [*, ", shape_str(normalized_shape).substr(1),
               " but got ", dtype_name(a.dtype()), shape_str(s));
  check_floating(a, "layer_norm");
  const bool has_weight = weight && weight->defined(), has_bias = bias && bias->defined();
  for (const auto& [present, t, what] : {std::tuple{has_weight, &weight, "weight"},
                                         std::tuple{has_bias, &bias, "bias"}}) {
    if (!present) continue;
    const Tensor& p = **t;
    LAZYRT_CHECK(p.shape() == normalized_shape, "layer_norm: expected ", what,
                 " of shape normalized_shape ", shape_str(normalized_shape), ", got ",
                 dtype_name(p.dtype()), shape_str(p.shape()));
    LAZYRT_CHECK(p.dtype() == a.dtype(), "layer_norm: ", what, " has dtype ", dtype_name(p.dtype()),
                 ", expected the input's ", dtype_name(a.dtype()));
  }
  std::vector<int64_t> dims;
  for (int64_t i = a.dim() - k; i < a.dim(); ++i) dims.push_back(i);
  // Under autocast in f32 (its result too); 16-bit tensors otherwise in f32, rounded once.
  const Tensor x = autocast_f32(a);
  const DType t = opmath_type(x.dtype());
  const Tensor xt = cast_to(x, t);
  Tensor mu = mean(xt, dims, true);
  Tensor scale = rsqrt(apply(OpKind::Var, {xt}, {dims, true, 0.0}) + eps);
  Tensor y = xt * scale - mu * scale;
  if (has_weight) y = y * cast_to(*weight, t);
  if (has_bias) y = y + cast_to(*bias, t);
  return cast_to(y, x.dtype());
}

// ---- along one dim ----------------------------------------------------------------------------

namespace {

Tensor cumulative(OpKind op, const Tensor& a, int64_t dim, std::optional<DType> dtype, const char* name) {
  impl_of(a, name);
  const int64_t d = wrap_dim(dim, a.shape(), name);
  // As torch: integer and bool tensors accumulate (and give) i64 unless a dtype is given.
  const DType t = dtype ? *dtype : is_floating(a.dtype()) ? a.dtype() : DType::i64;
  LAZYRT_CHECK(t != DType::b8, name, ": cannot accumulate in b8 (dtype given for ", dtype_name(a.dtype()),
               shape_str(a.shape()), ")");
  ir::Attrs attrs = op == OpKind::Cumsum ? ir::Attrs{d, false} : ir::Attrs{d};
  return apply(op, {cast_to(a, t)}, std::move(attrs));
}

// The first k indices of each line in sorted order, and the values there.
std::pair<Tensor, Tensor> sorted_prefix(const Tensor& a, int64_t k, int64_t dim, bool descending,
                                        const char* op) {
  impl_of(a, op);
  const int64_t d = wrap_dim(dim, a.shape(), op);
  const int64_t size = a.dim() ? a.shape()[d] : 1;
  LAZYRT_CHECK(k >= 0 && k <= size, op, ": k (", k, ") out of range for a dim of size ", size, " of ",
               dtype_name(a.dtype()), shape_str(a.shape()));
  Tensor idx = apply(OpKind::Sort, {a}, {d, descending, k});
  if (a.dim() == 0) return {a.clone(), idx};  // one element: gather needs a dim
  return {gather(a, d, idx), idx};
}

}  // namespace

Tensor cumsum(const Tensor& a, int64_t dim, std::optional<DType> dtype) {
  return cumulative(OpKind::Cumsum, a, dim, dtype, "cumsum");
}
Tensor cumprod(const Tensor& a, int64_t dim, std::optional<DType> dtype) {
  return cumulative(OpKind::Cumprod, a, dim, dtype, "cumprod");
}

std::pair<Tensor, Tensor> sort(const Tensor& a, int64_t dim, bool descending, bool /*stable*/) {
  impl_of(a, "sort");
  const int64_t d = wrap_dim(dim, a.shape(), "sort");
  return sorted_prefix(a, a.dim() ? a.shape()[d] : 1, dim, descending, "sort");
}
Tensor argsort(const Tensor& a, int64_t dim, bool descending, bool stable) {
  return sort(a, dim, descending, stable).second;
}
std::pair<Tensor, Tensor> topk(const Tensor& a, int64_t k, int64_t dim, bool largest, bool /*sorted*/) {
  return sorted_prefix(a, k, dim, largest, "topk");
}

namespace {
std::pair<Tensor, Tensor> extreme_along(const Tensor& a, int64_t dim, bool keepdim, bool largest, const char* op) {
  auto [values, indices] = sorted_prefix(a, 1, dim, largest, op);  // nan sorts above every number
  const int64_t d = wrap_dim(dim, a.shape(), op);
  if (!largest && is_floating(a.dtype()) && a.dim() > 0) {
    // nan propagates through min too: the first nan of a line where there is one.
    const Tensor nan = isnan(a);
    indices = where(any(nan, {d}, true), argmax(cast(nan, DType::f32), d, true), indices);
    values = gather(a, d, indices);
  }
  if (keepdim || a.dim() == 0) return {values, indices};
  return {squeeze(values, d), squeeze(indices, d)};
}
}  // namespace

std::pair<Tensor, Tensor> max(const Tensor& a, int64_t dim, bool keepdim) {
  return extreme_along(a, dim, keepdim, true, "max");
}
std::pair<Tensor, Tensor> min(const Tensor& a, int64_t dim, bool keepdim) {
  return extreme_along(a, dim, keepdim, false, "min");
}

Tensor clamp_min(const Tensor& a, Scalar min) { return clamp(a, std::optional<Scalar>(min)); }
Tensor clamp_min(const Tensor& a, const Tensor& min) { return clamp(a, std::optional<Tensor>(min)); }
Tensor clamp_max(const Tensor& a, Scalar max) { return clamp(a, std::nullopt, std::optional<Scalar>(max)); }
Tensor clamp_max(const Tensor& a, const Tensor& max) {
  return clamp(a, std::optional<Tensor>(), std::optional<Tensor>(max));
}

}  // namespace lazyrt
