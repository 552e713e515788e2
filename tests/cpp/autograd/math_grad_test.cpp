// Gradients of the math ops where finite differences cannot speak for torch: at kinks, ties
// and zeros the derivative is a convention, and lazyrt follows torch's (torch 1.13,
// FunctionsManual.cpp). The expected values are those torch.autograd gives.
#include <gtest/gtest.h>

#include <cmath>
#include <optional>
#include <vector>

#include <lazyrt/lazyrt.h>

namespace lazyrt {
namespace {

Tensor leaf(const std::vector<double>& v, Shape s) { return tensor(v, std::move(s)).requires_grad_(); }

std::vector<double> grad_of(const Tensor& t) { return t.grad().to_vector<double>(); }

TEST(MathGrad, ClampPassesTheGradientAtTheBoundsToX) {
  Tensor x = leaf({-1, 1, 0.5, -2, 2}, {5});
  sum(clamp(x, -1.0, 1.0)).backward();
  EXPECT_EQ(grad_of(x), (std::vector<double>{1, 1, 1, 0, 0}));
}

TEST(MathGrad, ClampWithTensorBoundsGivesEachBoundWhereItIsTheResult) {
  Tensor x = leaf({-1, 1, 0.5, -2, 2, 0}, {6});
  Tensor lo = leaf({-1, -1, 1, -1, -1, 0}, {6});
  Tensor hi = leaf({1, 1, -1, 1, 1, 0}, {6});  // element 2: min > max, the result is max
  sum(clamp(x, std::optional<Tensor>(lo), std::optional<Tensor>(hi))).backward();
  EXPECT_EQ(grad_of(x), (std::vector<double>{1, 1, 0, 0, 0, 1}));
  EXPECT_EQ(grad_of(lo), (std::vector<double>{0, 0, 0, 1, 0, 0}));
  EXPECT_EQ(grad_of(hi), (std::vector<double>{0, 0, 1, 0, 1, 0}));
}

TEST(MathGrad, ProdWithZerosGivesTheProductOfTheOthers) {
  Tensor x = leaf({2, 0, 3, 0, 0, 3, 2, 4, 0.5}, {3, 3});
  sum(prod(x, 1)).backward();
  EXPECT_EQ(grad_of(x), (std::vector<double>{0, 6, 0, 0, 0, 0, 2, 1, 8}));
}

TEST(MathGrad, NormGradientsAtZeroAndAtTies) {
  Tensor a = leaf({0, 0, 3, 4}, {2, 2});
  sum(norm(a, 2, {1})).backward();
  std::vector<double> ga = grad_of(a);
  EXPECT_EQ(ga[0], 0);
  EXPECT_EQ(ga[1], 0);
  EXPECT_NEAR(ga[2], 0.6, 1e-15);
  EXPECT_NEAR(ga[3], 0.8, 1e-15);
  Tensor b = leaf({3, -3, 1}, {3});
  norm(b, INFINITY).backward();
  EXPECT_EQ(grad_of(b), (std::vector<double>{0.5, -0.5, 0}));
  Tensor c = leaf({0, -2, 1}, {3});
  norm(c, 1).backward();
  EXPECT_EQ(grad_of(c), (std::vector<double>{0, -1, 1}));
}

TEST(MathGrad, StdOfAConstantSliceHasZeroGradientNotNan) {
  Tensor x = leaf({3, 3}, {2});
  lazyrt::std(x).backward();
  EXPECT_EQ(grad_of(x), (std::vector<double>{0, 0}));
}

TEST(MathGrad, RoundingOpsRecordAZeroGradientArgmaxNone) {
  Tensor x = leaf({0.4, 1.6}, {2});
  EXPECT_TRUE(sign(x).requires_grad());
  EXPECT_TRUE(floor(x).requires_grad());
  EXPECT_FALSE(argmax(x).requires_grad());
  EXPECT_FALSE(argmin(x, 0).requires_grad());
  sum(round(x) * x + ceil(x) + sign(x)).backward();
  EXPECT_EQ(grad_of(x), (std::vector<double>{0, 2}));
}

TEST(MathGrad, LogsumexpAndNanToNumAtInfinities) {
  Tensor x = leaf({-INFINITY, 0}, {2});
  logsumexp(x, {0}).backward();
  EXPECT_EQ(grad_of(x), (std::vector<double>{0, 1}));
  Tensor y = leaf({1, NAN, INFINITY}, {3});
  sum(nan_to_num(y)).backward();
  EXPECT_EQ(grad_of(y), (std::vector<double>{1, 0, 0}));
}

TEST(MathGrad, LeakyReluAtZeroTakesTheSlope) {
  Tensor x = leaf({0, -1, 1}, {3});
  sum(leaky_relu(x, 0.1)).backward();
  std::vector<double> g = grad_of(x);
  EXPECT_NEAR(g[0], 0.1, 1e-16);
  EXPECT_NEAR(g[1], 0.1, 1e-16);
  EXPECT_EQ(g[2], 1);
}

}  // namespace
}  // namespace lazyrt
