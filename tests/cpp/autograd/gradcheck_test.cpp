// Every differentiable op of the op table against central finite differences in f64. The
// loss is sum(op(inputs) * weights) with fixed uneven weights, so every output element's
// gradient matters. An op with a gradient rule and no case here fails OpTable coverage.
#include <gtest/gtest.h>

#include <lazyrt/lazyrt.h>

#include <cmath>
#include <functional>
#include <map>
#include <random>

#include "autograd/autograd.h"
#include "ir/op.h"
#include "ops/op_helpers.h"

namespace lazyrt {
namespace {

struct GradCase {
  std::vector<Shape> shapes;
  std::function<Tensor(const std::vector<Tensor>&)> fn;
  // Inputs are drawn from [lo, hi], away from kinks the case names.
  double lo = -2, hi = 2;
  double tolerance = 1e-6;
  double eps = 1e-6;  // finite-difference step
};

Tensor f64(const std::vector<double>& v, Shape s) { return tensor(v, std::move(s)); }

std::map<std::string, GradCase> cases() {
  using V = std::vector<Tensor>;
  std::map<std::string, GradCase> c;
  // Through f32 and back: the derivative is 1, checked at f32 resolution.
  c["cast"] = {{{4}}, [](const V& x) { return cast(cast(x[0], DType::f32), DType::f64); }, -2, 2, 1e-4, 1e-2};
  c["add"] = {{{2, 3}, {3}}, [](const V& x) { return x[0] + x[1]; }};
  c["sub"] = {{{2, 1}, {2, 3}}, [](const V& x) { return x[0] - x[1]; }};
  c["pow"] = {{{2, 3}, {3}}, [](const V& x) { return pow(x[0], x[1]); }, 0.5, 2};
  // Every differentiable plain elementwise row of the op table (lazyrt/ops.def's api column):
  // one operand, or two that broadcast, drawn from [0.2, 2] (or [0.5, 2]), where each such op
  // is smooth (log, sqrt and rsqrt defined; abs, relu and sign away from 0; a divisor away
  // from 0). Rounding steps have probability zero there: the check is a zero gradient.
#define LAZYRT_DIFF_RULE true
#define LAZYRT_DIFF_NONE false
#define LAZYRT_DIFF_GRAD(...) true
#define LAZYRT_DIFF_GRAD2(...) true
#define LAZYRT_CHECK_Public(name, differentiable)
#define LAZYRT_CHECK_Internal(name, differentiable)
#define LAZYRT_CHECK_Unary(name, differentiable) \
  if (differentiable) c[#name] = {{{2, 3}}, [](const V& x) { return lazyrt::name(x[0]); }, 0.2, 2};
#define LAZYRT_CHECK_UnaryFloat(name, differentiable) LAZYRT_CHECK_Unary(name, differentiable)
#define LAZYRT_CHECK_Arith(name, differentiable) \
  if (differentiable) c[#name] = {{{2, 3}, {3}}, [](const V& x) { return lazyrt::name(x[0], x[1]); }, 0.5, 2};
#define LAZYRT_CHECK_ArithFloat(name, differentiable) LAZYRT_CHECK_Arith(name, differentiable)
#define OP(Enum, name, operands, rule, flags, attrs, aten, api, grad) LAZYRT_CHECK_##api(name, LAZYRT_DIFF_##grad)
#include "lazyrt/ops.def"
#undef OP
#undef LAZYRT_DIFF_RULE
#undef LAZYRT_DIFF_NONE
#undef LAZYRT_DIFF_GRAD
#undef LAZYRT_DIFF_GRAD2
#undef LAZYRT_CHECK_Public
#undef LAZYRT_CHECK_Internal
#undef LAZYRT_CHECK_Unary
#undef LAZYRT_CHECK_UnaryFloat
#undef LAZYRT_CHECK_Arith
#undef LAZYRT_CHECK_ArithFloat
  // Kinks and ties the rows' cases above avoid by their domain, crossed here on purpose.
  c["relu_shifted"] = {{{2, 3}}, [](const V& x) { return relu(x[0] - 1.05); }, 0.1, 2};
  c["maximum_near_ties"] = {{{2, 3}, {2, 3}}, [](const V& x) { return maximum(x[0], x[1] * 1.1 + 0.05); }};
  c["sign_times_x"] = {{{2, 3}}, [](const V& x) { return sign(x[0]) * x[0]; }};
  c["where"] = {{{2, 3}, {3}}, [](const V& x) {
    Tensor cond = tensor(std::vector<bool>{true, false, true, false, false, true}, {2, 3});
    return where(cond, x[0], x[1]);
  }};
  c["sum"] = {{{2, 3, 4}}, [](const V& x) { return sum(x[0], {0, 2}, false); }};
  c["mean"] = {{{2, 3, 4}}, [](const V& x) { return mean(x[0], {-1}, true); }};
  c["amax"] = {{{3, 4}}, [](const V& x) { return amax(x[0], {1}); }};
  c["amin"] = {{{3, 4}}, [](const V& x) { return amin(x[0], {0}, true); }};
  c["matmul"] = {{{2, 1, 3, 4}, {5, 4, 2}}, [](const V& x) { return matmul(x[0], x[1]); }};
  c["permute"] = {{{2, 3, 4}}, [](const V& x) { return permute(x[0], {2, 0, 1}); }};
  c["reshape"] = {{{2, 3, 4}}, [](const V& x) { return reshape(x[0], {4, 6}); }};
  c["expand"] = {{{3, 1}}, [](const V& x) { return expand(x[0], {2, 3, 4}); }};

  // Data movement and indexing. Index tensors are fixed; where an index repeats, the
  // gradients of the repeats must add up.
  auto i64 = [](std::vector<int64_t> v, Shape s) { return tensor(v, std::move(s)); };
  c["slice"] = {{{4, 5}}, [](const V& x) { return slice(slice(x[0], 1, -4, std::nullopt, 2), 0, 1, 4, 2); }};
  // The public pad, and pad with interior padding (what a strided slice's gradient uses).
  c["pad"] = {{{2, 3}}, [](const V& x) {
    Tensor interior = detail::apply(ir::OpKind::Pad, {x[0]},
                                    {std::vector<int64_t>{-1, 1}, std::vector<int64_t>{2, -1},
                                     std::vector<int64_t>{1, 2}, 0.0});
    return cat({flatten(pad(x[0], {1, -1, 2, 0}, 0.5)), flatten(interior)});
  }};
  c["flip"] = {{{2, 3, 4}}, [](const V& x) { return flip(x[0], {0, 2}); }};
  c["cumsum"] = {{{3, 4}}, [](const V& x) { return cat({cumsum(x[0], 1), cumsum(x[0], 0)}); }};
  // cumprod's gradient is its own op (exact where inputs are zero: see test_grad_parity.py).
  c["cumprod"] = {{{3, 5}}, [](const V& x) { return cat({flatten(cumprod(x[0], 1)), flatten(cumprod(x[0], 0))}); }};
  c["concat"] = {{{2, 3}, {2, 1}}, [](const V& x) { return cat({x[0], x[1], x[0]}, 1); }};
  c["index_select"] = {{{4, 3}}, [=](const V& x) { return index_select(x[0], 0, i64({2, 0, 2}, {3})); }};
  c["gather"] = {{{3, 4}}, [=](const V& x) {
    return gather(x[0], 1, i64({3, 3, 0, 1, 2, 1}, {3, 2}));
  }};
  // Unique rows per column: which repeated write wins is not differentiable.
  c["scatter"] = {{{3, 4}, {2, 5}}, [=](const V& x) {
    return scatter(x[0], 0, i64({2, 0, 1, 2, 0, 2, 0, 1}, {2, 4}), x[1]);
  }};
  c["scatter_add"] = {{{3, 4}, {3, 5}}, [=](const V& x) {
    return scatter_add(x[0], 0, i64({2, 0, 2, 2, 0, 0, 1, 2, 2, 1, 1, 2}, {3, 4}), x[1]);
  }};
  c["index_add"] = {{{2, 4}, {2, 3}}, [=](const V& x) {
    return index_add(x[0], 1, i64({3, 0, 3}, {3}), x[1], 1.5);
  }};

  // Convolution and pooling: groups, per-dim stride / padding / dilation, a bias.
  c["conv2d"] = {{{2, 4, 5, 6}, {6, 2, 3, 2}, {6}}, [](const V& x) {
    return conv2d(x[0], x[1], x[2], {2, 1}, {1, 2}, {1, 2}, 2);
  }};
  c["max_pool2d"] = {{{1, 2, 5, 6}}, [](const V& x) {
    return max_pool2d(x[0], {3, 2}, {2, 1}, {1, 1}, {1, 2}, true);
  }};
  c["avg_pool2d"] = {{{2, 2, 5, 6}}, [](const V& x) {
    return avg_pool2d(x[0], {3, 2}, {2, 1}, {1, 1}, true, false) +
           avg_pool2d(x[0], {3, 2}, {2, 1}, {1, 1}, true, true);
  }};
  // Math ops. Kinks (clamp bounds) have probability zero for the drawn values.
  c["gelu"] = {{{2, 3}}, [](const V& x) { return gelu(x[0] * 2); }};
  c["gelu_tanh"] = {{{2, 3}}, [](const V& x) { return gelu(x[0] * 2, "tanh"); }};
  c["silu"] = {{{2, 3}}, [](const V& x) { return silu(x[0] * 2); }};
  c["softplus"] = {{{2, 3}}, [](const V& x) { return softplus(x[0] * 2); }};
  // beta x crosses the threshold (1.5) inside the range: both pieces are checked.
  c["softplus_threshold"] = {{{3, 4}}, [](const V& x) { return softplus(x[0], 2, 1.5); }};
  c["clamp"] = {{{2, 3}, {3}, {2, 1}}, [](const V& x) { return clamp(x[0] * 2, x[1] - 1, x[2] + 1); }};
  c["clamp_scalar_bounds"] = {{{3, 4}}, [](const V& x) { return clamp(x[0], -0.5, 1.0); }};
  c["clamp_min_above_max"] = {{{2, 3}, {3}}, [](const V& x) {
    return clamp(x[0], std::optional<Tensor>(x[1] + 3), std::optional<Tensor>(x[1] - 3));
  }};
  c["prod"] = {{{2, 3, 4}}, [](const V& x) { return prod(x[0], 1); }, 0.5, 2};
  c["prod_all_negative_values"] = {{{5}}, [](const V& x) { return prod(x[0]); }, -2, -0.5};
  c["var"] = {{{2, 3, 4}}, [](const V& x) { return var(x[0], {0, 2}); }};
  c["var_correction0_keepdim"] = {{{3, 4}}, [](const V& x) { return var(x[0], {1}, 0, true); }};
  c["std"] = {{{3, 4}}, [](const V& x) { return lazyrt::std(x[0], {1}); }};
  c["norm"] = {{{3, 4}}, [](const V& x) { return norm(x[0], 2, {1}); }};
  c["norm_p1"] = {{{3, 4}}, [](const V& x) { return norm(x[0], 1, {0}, true); }};
  c["norm_pinf"] = {{{3, 4}}, [](const V& x) { return norm(x[0], INFINITY); }};
  c["softmax"] = {{{3, 4}}, [](const V& x) { return softmax(x[0], 1); }};
  c["softmax_dim0"] = {{{3, 2, 4}}, [](const V& x) { return softmax(x[0] * 3, 0); }};
  c["log_softmax"] = {{{3, 4}}, [](const V& x) { return log_softmax(x[0], -1); }};
  c["log_softmax_dim1"] = {{{2, 3, 2}}, [](const V& x) { return log_softmax(x[0] * 3, 1); }};
  // Composites of the math API: their gradients come from the IR ops' rules.
  c["logsumexp_composite"] = {{{3, 4}}, [](const V& x) { return logsumexp(x[0] * 5, {1}); }};
  c["layer_norm_composite"] = {{{3, 4}, {4}, {4}}, [](const V& x) {
    return layer_norm(x[0], {4}, x[1], x[2]);
  }};
  c["lerp_composite"] = {{{2, 3}, {3}, {2, 3}}, [](const V& x) { return lerp(x[0], x[1], x[2]); }};
  c["addcdiv_composite"] = {{{2, 3}, {2, 3}, {3}}, [](const V& x) {
    return addcdiv(x[0], x[1], x[2] + 3, 0.5);
  }};
  return c;
}

std::vector<double> draw(size_t n, double lo, double hi, std::mt19937& rng) {
  std::uniform_real_distribution<double> u(lo, hi);
  std::vector<double> v(n);
  for (double& x : v) x = u(rng);
  return v;
}

class GradCheck : public ::testing::TestWithParam<std::string> {};

TEST_P(GradCheck, MatchesFiniteDifferences) {
  const GradCase c = cases().at(GetParam());
  std::mt19937 rng(1234);
  std::vector<std::vector<double>> values;
  for (const Shape& s : c.shapes) values.push_back(draw(static_cast<size_t>(shape_numel(s)), c.lo, c.hi, rng));
  // Loss weights: fixed and uneven.
  auto loss_of = [&](const std::vector<Tensor>& xs, const std::vector<double>& w) {
    Tensor out = c.fn(xs);
    return sum(out * f64(w, out.shape()));
  };
  std::vector<Tensor> xs;
  for (size_t k = 0; k < c.shapes.size(); ++k) xs.push_back(f64(values[k], c.shapes[k]).requires_grad_());
  Shape out_shape;
  {
    NoGradGuard no_grad;
    out_shape = c.fn(xs).shape();
  }
  std::vector<double> w = draw(static_cast<size_t>(shape_numel(out_shape)), 0.5, 1.5, rng);
  loss_of(xs, w).backward();
  for (size_t k = 0; k < xs.size(); ++k) {
    ASSERT_TRUE(xs[k].grad().defined()) << "input " << k << " got no gradient";
    std::vector<double> analytic = xs[k].grad().to_vector<double>();
    NoGradGuard no_grad;
    const double eps = c.eps;
    for (size_t i = 0; i < values[k].size(); ++i) {
      auto at = [&](double delta) {
        std::vector<Tensor> ys;
        for (size_t j = 0; j < xs.size(); ++j) {
          std::vector<double> v = values[j];
          if (j == k) v[i] += delta;
          ys.push_back(f64(v, c.shapes[j]));
        }
        return loss_of(ys, w).item();
      };
      const double numeric = (at(eps) - at(-eps)) / (2 * eps);
      EXPECT_NEAR(analytic[i], numeric, c.tolerance * (1 + std::abs(numeric)))
          << "input " << k << " element " << i;
    }
  }
}

std::vector<std::string> case_names() {
  std::vector<std::string> names;
  for (const auto& [name, c] : cases()) names.push_back(name);
  return names;
}

INSTANTIATE_TEST_SUITE_P(Ops, GradCheck, ::testing::ValuesIn(case_names()),
                         [](const auto& info) { return info.param; });

TEST(GradCheckCoverage, EveryOpWithAGradientRuleHasACase) {
  auto all = cases();
  for (int i = 0; i < ir::kNumOps; ++i) {
    auto op = static_cast<ir::OpKind>(i);
    const std::string name(ir::op_name(op));
    if (autograd::grad_rule(op)) EXPECT_TRUE(all.count(name)) << "no gradient check for " << name;
    else EXPECT_FALSE(all.count(name)) << name << " has a check but no gradient rule";
  }
}

}  // namespace
}  // namespace lazyrt
