// Math ops on paths the per-op parity fixtures do not reach: operands that are intermediate
// values (softmax may then run in place over its input's buffer), constant operands (folded
// at compile time through the op's own kernel), and a deliberate difference from torch.
// Expected values are known in closed form.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include <lazyrt/lazyrt.h>

namespace lazyrt {
namespace {

void expect_near(const std::vector<double>& got, const std::vector<double>& want, double tol = 1e-12) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], tol) << "element " << i;
}

// exp(x) proportional to 1, 2, 5 (row 0) and 1, 1, 2 (row 1).
Tensor log_weights() {
  return tensor(std::vector<double>{0, std::log(2.0), std::log(5.0), 0, 0, std::log(2.0)}, {2, 3});
}

TEST(MathOps, SoftmaxOverAnIntermediateValueWhoseBufferItMayReuse) {
  Tensor x = log_weights() * 0.5;
  Tensor y = softmax(x * 2.0, 1);  // x * 2 is read by softmax only: its buffer may be the output's
  Tensor z = log_softmax(x * 2.0 + 0.0, 1);
  mark_step();
  expect_near(y.to_vector<double>(), {1.0 / 8, 2.0 / 8, 5.0 / 8, 0.25, 0.25, 0.5});
  expect_near(z.to_vector<double>(), {std::log(1.0 / 8), std::log(2.0 / 8), std::log(5.0 / 8),
                                      std::log(0.25), std::log(0.25), std::log(0.5)});
}

TEST(MathOps, SoftmaxAlongAStridedDimOfAnIntermediateValue) {
  Tensor x = transpose(log_weights(), 0, 1) * 1.0;  // [3, 2]: rows of the original are columns
  Tensor y = softmax(x + 1.0, 0);                    // shift invariance: same as without + 1
  expect_near(y.to_vector<double>(), {1.0 / 8, 0.25, 2.0 / 8, 0.25, 5.0 / 8, 0.5});
}

TEST(MathOps, ElementwiseOpsOnConstantsFoldToTheKernelsResult) {
  Tensor c = clamp(full({3}, 5.0, DType::f64), -1.0, 1.0);
  Tensor r = round(full({2}, 2.5, DType::f64));
  Tensor s = sign(full({2}, -3.0, DType::f64));
  Tensor g = gelu(zeros({2}, DType::f64), "tanh");
  Tensor e = erf(full({1}, INFINITY, DType::f64));
  mark_step();
  expect_near(c.to_vector<double>(), {1, 1, 1});
  expect_near(r.to_vector<double>(), {2, 2});
  expect_near(s.to_vector<double>(), {-1, -1});
  expect_near(g.to_vector<double>(), {0, 0});
  expect_near(e.to_vector<double>(), {1});
}

TEST(MathOps, ArgmaxOfAnIntermediateValueAlongEachDim) {
  Tensor x = tensor(std::vector<double>{1, 7, 3, 9, 2, 9}, {2, 3}) * 2.0;
  EXPECT_EQ(argmax(x, 1).to_vector<int64_t>(), (std::vector<int64_t>{1, 0}));
  EXPECT_EQ(argmax(x, 0).to_vector<int64_t>(), (std::vector<int64_t>{1, 0, 1}));
  EXPECT_EQ(argmin(x).to_vector<int64_t>(), (std::vector<int64_t>{0}));
}

TEST(MathOps, ArangeIsRecordedLazilyAndComputedInItsDtype) {
  // Nothing of its length is made while tracing: 2^40 elements are recorded at once.
  Tensor huge = arange(int64_t{1} << 40);
  EXPECT_TRUE(huge.is_pending());
  EXPECT_EQ(huge.shape(), (Shape{int64_t{1} << 40}));
  // Each element converted from the i64 index as cast converts: f16 has 11 bits of mantissa,
  // so 2049 rounds to even (2048) and 2051 to 2052; i32 and b8 as C++ conversions would.
  EXPECT_EQ(sum(arange(1000, DType::i32)).item(), 499500);
  const std::vector<double> h = cast(arange(2052, DType::f16), DType::f64).to_vector<double>();
  EXPECT_EQ(h[2047], 2047);
  EXPECT_EQ(h[2048], 2048);
  EXPECT_EQ(h[2049], 2048);
  EXPECT_EQ(h[2051], 2052);
  EXPECT_EQ(arange(3, DType::b8).to_vector<bool>(), (std::vector<bool>{false, true, true}));
  EXPECT_EQ(arange(0, DType::f32).numel(), 0);
  // Used as an index inside a larger graph: the gather sees its computed values.
  Tensor x = tensor(std::vector<double>{10, 11, 12, 13}, {4});
  EXPECT_EQ(index_select(x, 0, flip(arange(4), {0})).to_vector<double>(), (std::vector<double>{13, 12, 11, 10}));
}

TEST(MathOps, IntegerSumsWrapAsTorchDoes) {
  // i32 and i64 arithmetic wraps on overflow in torch; in C++ it would be undefined (found by
  // graph_fuzz under UBSan). torch: index_add_ of 2^31 - 1 onto 2^31 - 1 in i32 gives -2.
  const int32_t max32 = std::numeric_limits<int32_t>::max();
  Tensor a = tensor(std::vector<int32_t>{max32, 5}, {2});
  Tensor idx = tensor(std::vector<int64_t>{0, 0}, {2});
  EXPECT_EQ(index_add(a, 0, idx, tensor(std::vector<int32_t>{max32, 0}, {2})).to_vector<int32_t>(),
            (std::vector<int32_t>{-2, 5}));
  EXPECT_EQ(scatter_add(a, 0, idx, tensor(std::vector<int32_t>{1, 0}, {2})).to_vector<int32_t>(),
            (std::vector<int32_t>{std::numeric_limits<int32_t>::min(), 5}));
  const int64_t max64 = std::numeric_limits<int64_t>::max();
  EXPECT_EQ(sum(tensor(std::vector<int64_t>{max64, 1}, {2})).to_vector<int64_t>(),
            (std::vector<int64_t>{std::numeric_limits<int64_t>::min()}));
  EXPECT_EQ(pow(tensor(std::vector<int32_t>{390625}, {1}), Scalar(int64_t{2})).to_vector<int32_t>(),
            (std::vector<int32_t>{static_cast<int32_t>(static_cast<uint32_t>(390625u * 390625u))}));
}

TEST(MathOps, RoundToDecimalsRoundsHalvesToEvenAtThatPlace) {
  Tensor x = tensor(std::vector<double>{1.25, -2.35, 1234.5678, 250}, {4});
  expect_near(round(x, 1).to_vector<double>(), {1.2, -2.4, 1234.6, 250});
  expect_near(round(x, -2).to_vector<double>(), {0, -0.0, 1200, 200});
  expect_near(round(x, 0).to_vector<double>(), {1, -2, 1235, 250});
  EXPECT_THROW(round(arange(3), 1), Error);  // torch rounds no integers
}

// Deliberately not torch's answer: torch accumulates f32 squares in f32 and overflows to inf
// here; lazyrt accumulates in double and returns the norm, 5e30, which fits in f32.
TEST(MathOps, NormOfLargeF32ValuesDoesNotOverflow) {
  Tensor x = tensor(std::vector<float>{3e30f, 4e30f}, {2});
  EXPECT_NEAR(norm(x).item(), 5e30, 5e30 * 1e-6);
}

}  // namespace
}  // namespace lazyrt
