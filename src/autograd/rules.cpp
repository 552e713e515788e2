// Gradient rules, one per row of ops.def (its grad column): the rules written by hand here
// (RULE) and the table of all of them. Each builds the input gradients out of public lazy ops,
// so they trace into the same graph as the forward. A row marked RULE without a grad_Enum
// here does not compile.
#include <algorithm>
#include <array>
#include <cmath>

#include "autograd/autograd.h"
#include "ops/op_helpers.h"
#include "util/check.h"

namespace lazyrt::autograd {
namespace {

using Grads = std::vector<Tensor>;
using C = GradContext;

Tensor zeros_of(const Tensor& t) { return zeros(t.shape(), t.dtype()); }
Tensor cast_like(const Tensor& g, const Tensor& like) {
  return g.dtype() == like.dtype() ? g : cast(g, like.dtype());
}
// dL/da for a broadcast elementwise operand a.
Tensor to_operand(const Tensor& g, const Tensor& operand) {
  return cast_like(sum_to(g, operand.shape()), operand);
}
Tensor sign_of(const Tensor& x) {
  return cast(x > 0, x.dtype()) - cast(x < 0, x.dtype());
}
// Reduced dims of a reduction put back as size-1 dims, so the output broadcasts to the input.
Tensor unreduce(const Tensor& t, const C& c) {
  const ir::NodeAttrs a = c.at();  // every reduction has dims and keepdim
  if (a.b<"keepdim">()) return t;
  Shape s = c.inputs[0].shape();
  for (int64_t d : a.ints<"dims">()) s[d] = 1;
  return reshape(t, s);
}

// A reduction's result over `dims` (keepdim or not) as size-1 dims, to broadcast against x.
Tensor unreduce_dims(const Tensor& t, const std::vector<int64_t>& dims, const Tensor& x) {
  Shape s = x.shape();
  for (int64_t d : dims) s[d] = 1;
  return reshape(t, s);
}
// The product over several dims (the public prod takes one dim or all).
Tensor prod_over(const Tensor& x, const std::vector<int64_t>& dims) {
  Tensor p = x;
  for (size_t k = dims.size(); k-- > 0;) p = prod(p, dims[k], true);
  return p;
}

// ---- rules --------------------------------------------------------------------------------
Grads grad_Cast(const C& c) {
  if (!is_floating(c.inputs[0].dtype())) return {Tensor()};
  return {cast_like(c.grad, c.inputs[0])};
}

Grads grad_Add(const C& c) {
  return {c.needs[0] ? to_operand(c.grad, c.inputs[0]) : Tensor(),
          c.needs[1] ? to_operand(c.grad, c.inputs[1]) : Tensor()};
}
Grads grad_Sub(const C& c) {
  return {c.needs[0] ? to_operand(c.grad, c.inputs[0]) : Tensor(),
          c.needs[1] ? to_operand(-c.grad, c.inputs[1]) : Tensor()};
}
Grads grad_Pow(const C& c) {
  const Tensor& a = c.inputs[0];
  const Tensor& b = c.inputs[1];
  Grads g(2);
  if (c.needs[0]) g[0] = to_operand(c.grad * b * pow(a, b - 1), a);
  if (c.needs[1]) {
    // d/db a^b = a^b log a, taken as 0 where a == 0 and b >= 0 (PyTorch's convention).
    Tensor d = c.output * log(a);
    d = where(logical_and(a == 0, b >= 0), zeros_of(d), d);
    g[1] = to_operand(c.grad * d, b);
  }
  return g;
}
// Ties split the gradient evenly, as in PyTorch.
Grads min_max_grads(const C& c, bool is_max) {
  const Tensor& a = c.inputs[0];
  const Tensor& b = c.inputs[1];
  Tensor shared = where(a == b, c.grad / 2, c.grad);
  Tensor zero = zeros_of(shared);
  Tensor a_wins = is_max ? a > b : a < b;
  Tensor b_wins = is_max ? b > a : b < a;
  return {c.needs[0] ? to_operand(where(b_wins, zero, shared), a) : Tensor(),
          c.needs[1] ? to_operand(where(a_wins, zero, shared), b) : Tensor()};
}
Grads grad_Maximum(const C& c) { return min_max_grads(c, true); }
Grads grad_Minimum(const C& c) { return min_max_grads(c, false); }
Grads grad_Where(const C& c) {
  const Tensor& cond = c.inputs[0];
  Tensor zero = zeros_of(c.grad);
  return {Tensor(), c.needs[1] ? to_operand(where(cond, c.grad, zero), c.inputs[1]) : Tensor(),
          c.needs[2] ? to_operand(where(cond, zero, c.grad), c.inputs[2]) : Tensor()};
}

Grads grad_Sum(const C& c) { return {expand(unreduce(c.grad, c), c.inputs[0].shape())}; }
Grads grad_Mean(const C& c) {
  const Tensor& x = c.inputs[0];
  const double count = static_cast<double>(x.numel()) / static_cast<double>(std::max<int64_t>(c.output.numel(), 1));
  return {expand(unreduce(c.grad, c) / count, x.shape())};
}
// The gradient goes to every element equal to the extreme, split evenly among ties.
Grads extreme_grads(const C& c) {
  const Tensor& x = c.inputs[0];
  Tensor hit = cast(x == unreduce(c.output, c), x.dtype());
  Tensor count = sum(hit, c.at().ints<"dims">(), true);
  return {hit * unreduce(c.grad, c) / count};
}
Grads grad_Amax(const C& c) { return extreme_grads(c); }
Grads grad_Amin(const C& c) { return extreme_grads(c); }

Grads grad_Matmul(const C& c) {
  const Tensor& a = c.inputs[0];
  const Tensor& b = c.inputs[1];
  Grads g(2);
  if (c.needs[0]) g[0] = sum_to(matmul(c.grad, transpose(b, -1, -2)), a.shape());
  if (c.needs[1]) g[1] = sum_to(matmul(transpose(a, -1, -2), c.grad), b.shape());
  return g;
}

Grads grad_Permute(const C& c) {
  const auto& perm = c.at().ints<"dims">();
  std::vector<int64_t> inverse(perm.size());
  for (size_t d = 0; d < perm.size(); ++d) inverse[perm[d]] = static_cast<int64_t>(d);
  return {permute(c.grad, inverse)};
}
Grads grad_Reshape(const C& c) { return {reshape(c.grad, c.inputs[0].shape())}; }
Grads grad_Expand(const C& c) { return {sum_to(c.grad, c.inputs[0].shape())}; }

// ---- data movement, indexing, convolution and pooling --------------------------------------
// Built from the IR ops directly (detail::apply): their gradients are other IR ops with
// normalized attributes that no public op spells (pad with interior padding, a full-rank
// slice, the backward kernels of conv and pooling).
using detail::apply;
using ir::OpKind;

std::vector<int64_t> negated(std::vector<int64_t> v) {
  for (auto& x : v) x = -x;
  return v;
}
// g (the shape of an index) zero-padded at the end of each dim up to `shape`.
Tensor pad_to(const Tensor& g, const Shape& shape) {
  if (g.shape() == shape) return g;
  std::vector<int64_t> high(shape.size());
  for (size_t d = 0; d < shape.size(); ++d) high[d] = shape[d] - g.shape()[d];
  return apply(OpKind::Pad, {g}, {std::vector<int64_t>(shape.size(), 0), high,
                                  std::vector<int64_t>(shape.size(), 0), 0.0});
}

// The slice's elements go back to their places; the rest of the input gets zeros.
Grads grad_Slice(const C& c) {
  const Shape& in = c.inputs[0].shape();
  const Shape& out = c.output.shape();
  const ir::NodeAttrs a = c.at();
  const auto& starts = a.ints<"starts">();
  const auto& steps = a.ints<"steps">();
  std::vector<int64_t> high(in.size()), interior(in.size());
  for (size_t d = 0; d < in.size(); ++d) {
    interior[d] = steps[d] - 1;
    high[d] = in[d] - starts[d] - out[d] - std::max<int64_t>(out[d] - 1, 0) * interior[d];
  }
  return {apply(OpKind::Pad, {c.grad}, {starts, high, interior, 0.0})};
}
// Output j holds input i when j = low + i * (interior + 1): undo the edges (padding what was
// cropped with zeros), then keep every (interior + 1)-th element.
Grads grad_Pad(const C& c) {
  const ir::NodeAttrs a = c.at();
  const auto& interior = a.ints<"interior">();
  const size_t rank = interior.size();
  Tensor g = apply(OpKind::Pad, {c.grad}, {negated(a.ints<"low">()), negated(a.ints<"high">()),
                                           std::vector<int64_t>(rank, 0), 0.0});
  if (std::any_of(interior.begin(), interior.end(), [](int64_t i) { return i > 0; })) {
    std::vector<int64_t> steps(rank);
    for (size_t d = 0; d < rank; ++d) steps[d] = interior[d] + 1;
    g = apply(OpKind::Slice, {g}, {std::vector<int64_t>(rank, 0), g.shape(), steps});
  }
  return {g};
}
Grads grad_Flip(const C& c) { return {apply(OpKind::Flip, {c.grad}, c.attrs)}; }
Grads grad_Concat(const C& c) {
  const int64_t dim = c.at().i<"dim">();
  Grads g(c.inputs.size());
  int64_t offset = 0;
  for (size_t k = 0; k < c.inputs.size(); ++k) {
    const int64_t size = c.inputs[k].shape()[dim];
    if (c.needs[k]) {
      std::vector<int64_t> starts(c.grad.dim(), 0);
      Shape ends = c.grad.shape();
      starts[dim] = offset;
      ends[dim] = offset + size;
      g[k] = apply(OpKind::Slice, {c.grad}, {starts, ends, std::vector<int64_t>(c.grad.dim(), 1)});
    }
    offset += size;
  }
  return g;
}

Grads grad_IndexSelect(const C& c) {
  return {apply(OpKind::IndexAdd, {zeros_of(c.inputs[0]), c.inputs[1], c.grad}, c.attrs), Tensor()};
}
Grads grad_Gather(const C& c) {
  return {apply(OpKind::ScatterAdd, {zeros_of(c.inputs[0]), c.inputs[1], c.grad}, c.attrs), Tensor()};
}
// The overwritten elements of self get no gradient; src's used elements get theirs back.
Grads grad_Scatter(const C& c) {
  const Tensor& index = c.inputs[1];
  Grads g(3);
  if (c.needs[0])
    g[0] = apply(OpKind::Scatter, {c.grad, index, zeros(index.shape(), c.grad.dtype())}, c.attrs);
  if (c.needs[2]) g[2] = pad_to(apply(OpKind::Gather, {c.grad, index}, c.attrs), c.inputs[2].shape());
  return g;
}
Grads grad_ScatterAdd(const C& c) {
  Grads g(3);
  if (c.needs[0]) g[0] = c.grad;
  if (c.needs[2])
    g[2] = pad_to(apply(OpKind::Gather, {c.grad, c.inputs[1]}, c.attrs), c.inputs[2].shape());
  return g;
}
Grads grad_IndexAdd(const C& c) {
  Grads g(3);
  if (c.needs[0]) g[0] = c.grad;
  if (c.needs[2]) g[2] = apply(OpKind::IndexSelect, {c.grad, c.inputs[1]}, c.attrs);
  return g;
}

Grads grad_Conv2d(const C& c) {
  const Tensor& x = c.inputs[0];
  const Tensor& w = c.inputs[1];
  const ir::NodeAttrs a = c.at();
  // The backward ops take input_size / weight_size, then conv2d's attributes.
  Grads g(2);
  if (c.needs[0])
    g[0] = apply(OpKind::Conv2dBackwardInput, {c.grad, w},
                 {x.shape(), a.ints<"stride">(), a.ints<"padding">(), a.ints<"dilation">(),
                  a.i<"groups">()});
  if (c.needs[1])
    g[1] = apply(OpKind::Conv2dBackwardWeight, {c.grad, x},
                 {w.shape(), a.ints<"stride">(), a.ints<"padding">(), a.ints<"dilation">(),
                  a.i<"groups">()});
  return g;
}
Grads grad_MaxPool2d(const C& c) {
  return {apply(OpKind::MaxPool2dBackward, {c.grad, c.inputs[0]}, c.attrs)};
}
Grads grad_AvgPool2d(const C& c) {
  const ir::NodeAttrs a = c.at();
  // avg_pool2d_backward takes input_size, then avg_pool2d's attributes.
  return {apply(OpKind::AvgPool2dBackward, {c.grad},
                {c.inputs[0].shape(), a.ints<"kernel">(), a.ints<"stride">(), a.ints<"padding">(),
                 a.b<"ceil_mode">(), a.b<"count_include_pad">(), a.i<"divisor">()})};
}

// ---- math ops (PyTorch's derivatives, torch/csrc/autograd/FunctionsManual.cpp) -----------
Grads grad_Gelu(const C& c) {
  const Tensor& x = c.inputs[0];
  if (c.at().b<"tanh">()) {  // tanh form
    const double beta = M_SQRT2 * M_2_SQRTPI * 0.5, kappa = 0.044715;
    Tensor x_sq = x * x;
    Tensor t = tanh((x + x_sq * x * kappa) * beta);
    Tensor left_derivative = (t + 1) * 0.5;
    Tensor right_derivative = x * 0.5 * (1 - t * t) * beta * (x_sq * (3 * kappa) + 1);
    return {c.grad * (left_derivative + right_derivative)};
  }
  Tensor cdf = (erf(x * M_SQRT1_2) + 1) * 0.5;
  Tensor pdf = exp(x * x * -0.5) * (M_2_SQRTPI * M_SQRT1_2 * 0.5);
  return {c.grad * (cdf + x * pdf)};
}
Grads grad_Silu(const C& c) {
  const Tensor& x = c.inputs[0];
  Tensor s = sigmoid(x);
  return {c.grad * s * (x * (1 - s) + 1)};
}
// Above the threshold softplus is x, so the gradient passes unchanged.
Grads grad_Softplus(const C& c) {
  const Tensor& x = c.inputs[0];
  const double beta = c.at().f<"beta">(), threshold = c.at().f<"threshold">();
  Tensor bx = x * beta;
  return {where(bx > threshold, c.grad, c.grad * sigmoid(bx))};
}
// torch's clamp_backward and clamp_backward_min_max: x gets the gradient where it lies within
// the bounds (inclusive); a bound gets it where it is the result. With min > max the result
// is max everywhere, so min gets nothing.
Grads grad_Clamp(const C& c) {
  const Tensor& x = c.inputs[0];
  const Tensor& lo = c.inputs[1];
  const Tensor& hi = c.inputs[2];
  const bool has_min = c.at().b<"has_min">(), has_max = c.at().b<"has_max">();
  Tensor zero = zeros_of(c.grad);
  Grads g(3);
  if (c.needs[0]) {
    Tensor inside = has_min && has_max ? logical_and(x >= lo, x <= hi) : has_min ? x >= lo : x <= hi;
    g[0] = to_operand(where(inside, c.grad, zero), x);
  }
  if (c.needs[1] && has_min) {
    Tensor hit = has_max ? logical_and(x < lo, lo < hi) : x < lo;
    g[1] = to_operand(where(hit, c.grad, zero), lo);
  }
  if (c.needs[2] && has_max) {
    Tensor hit = has_min ? logical_or(x > hi, hi < lo) : x > hi;
    g[2] = to_operand(where(hit, c.grad, zero), hi);
  }
  return g;
}

// The product of the other elements of each slice, also where some are zero: with no zero it
// is prod / x; with one zero only that element gets the product of the rest; with more, none.
Grads grad_Prod(const C& c) {
  const Tensor& x = c.inputs[0];
  const auto& dims = c.at().ints<"dims">();
  Tensor is_zero = x == 0;
  Tensor zeros_in_slice = sum(is_zero, dims, true);
  Tensor nonzero_product = unreduce_dims(prod_over(where(is_zero, ones_like(x), x), dims), dims, x);
  Tensor others = where(is_zero, where(zeros_in_slice == 1, nonzero_product, zeros_of(x)),
                        where(zeros_in_slice == 0, nonzero_product / x, zeros_of(x)));
  return {unreduce(c.grad, c) * others};
}
// torch's var_backward: 2 (x - mean) / (count - correction) times the gradient.
Tensor var_backward(const Tensor& grad, const C& c) {
  const Tensor& x = c.inputs[0];
  const double count = static_cast<double>(x.numel()) /
                       static_cast<double>(std::max<int64_t>(c.output.numel(), 1));
  const ir::NodeAttrs a = c.at();  // var and std
  const double scale = 2.0 / (count - a.f<"correction">());
  return unreduce(grad, c) * scale * (x - mean(x, a.ints<"dims">(), true));
}
Grads grad_Var(const C& c) { return {var_backward(c.grad, c)}; }
// torch's std_backward: through var with grad / (2 std), taken as 0 where std is 0 (constant
// slices get a zero gradient, not nan).
Grads grad_Std(const C& c) {
  const Tensor& s = c.output;
  return {var_backward(where(s == 0, zeros_of(s), c.grad / (s * 2)), c)};
}
// torch's norm_backward for p = 1, 2, inf: sign(x) g; x g / norm (0 where the norm is 0);
// the gradient split evenly among the elements whose |x| is the norm (or nan).
Grads grad_Norm(const C& c) {
  const Tensor& x = c.inputs[0];
  const double p = c.at().f<"p">();
  Tensor g = unreduce(c.grad, c);
  Tensor norm = unreduce(c.output, c);
  if (p == 1) return {sign_of(x) * g};
  if (p == 2) return {x * where(norm == 0, zeros_of(norm), g / norm)};
  Tensor ax = abs(x);
  Tensor hit = cast(logical_or(ax == norm, isnan(ax)), x.dtype());
  return {sign_of(x) * (g / sum(hit, c.at().ints<"dims">(), true)) * hit};
}
Grads grad_Softmax(const C& c) {
  const Tensor& y = c.output;
  const int64_t dim = c.at().i<"dim">();
  return {y * (c.grad - sum(c.grad * y, {dim}, true))};
}
Grads grad_LogSoftmax(const C& c) {
  const int64_t dim = c.at().i<"dim">();
  return {c.grad - exp(c.output) * sum(c.grad, {dim}, true)};
}
// The gradient of a running sum is the running sum of the gradient from the other end.
Grads grad_Cumsum(const C& c) {
  return {detail::apply(OpKind::Cumsum, {c.grad}, {c.at().i<"dim">(), !c.at().b<"reverse">()})};
}
Grads grad_Cumprod(const C& c) {
  return {detail::apply(OpKind::CumprodBackward, {c.grad, c.inputs[0]}, {c.at().i<"dim">()})};
}


// The table, from the grad column of ops.def: RULE names grad_Enum above, NONE has no rule,
// GRAD(e) and GRAD2(e0, e1) are expressions of g (the result's gradient), x and y (the
// operands) and out (the result); a binary op's gradients are summed to their operands'
// shapes and computed only for operands that need them.
#define LAZYRT_GRAD_RULE(Enum) grad_##Enum
#define LAZYRT_GRAD_NONE(Enum) nullptr
#define LAZYRT_GRAD_IGNORE(Enum)
#define LAZYRT_GRAD_GRAD(e)                               \
  [](const C& c) -> Grads {                               \
    [[maybe_unused]] const Tensor& g = c.grad;            \
    [[maybe_unused]] const Tensor& x = c.inputs[0];       \
    [[maybe_unused]] const Tensor& out = c.output;        \
    return {e};                                           \
  } LAZYRT_GRAD_IGNORE
#define LAZYRT_GRAD_GRAD2(e0, e1)                                                            \
  [](const C& c) -> Grads {                                                                  \
    [[maybe_unused]] const Tensor& g = c.grad;                                               \
    [[maybe_unused]] const Tensor& x = c.inputs[0];                                          \
    [[maybe_unused]] const Tensor& y = c.inputs[1];                                          \
    [[maybe_unused]] const Tensor& out = c.output;                                           \
    return {c.needs[0] ? to_operand(e0, x) : Tensor(), c.needs[1] ? to_operand(e1, y) : Tensor()}; \
  } LAZYRT_GRAD_IGNORE
constexpr std::array<GradRule, ir::kNumOps> kRules = {
#define OP(Enum, name, operands, rule, flags, attrs, aten, api, grad) LAZYRT_GRAD_##grad(Enum),
#include "lazyrt/ops.def"
#undef OP
};
#undef LAZYRT_GRAD_RULE
#undef LAZYRT_GRAD_NONE
#undef LAZYRT_GRAD_IGNORE
#undef LAZYRT_GRAD_GRAD
#undef LAZYRT_GRAD_GRAD2

}  // namespace

GradRule grad_rule(ir::OpKind op) { return kRules[static_cast<size_t>(op)]; }

}  // namespace lazyrt::autograd
