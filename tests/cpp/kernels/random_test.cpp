#include <gtest/gtest.h>

#include <lazyrt/lazyrt.h>

#include <cmath>

#include "backend/cpu/kernels/philox.h"

namespace lazyrt {

TEST(Philox, MatchesThePublishedKnownAnswers) {
  using kernels::philox4x32;
  EXPECT_EQ(philox4x32({0, 0, 0, 0}, {0, 0}),
            (kernels::PhiloxWords{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}));
  EXPECT_EQ(philox4x32({0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}, {0xffffffffu, 0xffffffffu}),
            (kernels::PhiloxWords{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}));
  EXPECT_EQ(philox4x32({0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}, {0xa4093822u, 0x299f31d0u}),
            (kernels::PhiloxWords{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}));
}

TEST(Random, SameSeedSameNumbersAndDrawsAdvance) {
  manual_seed(42);
  std::vector<float> a = rand({100}).to_vector<float>();
  std::vector<float> b = rand({100}).to_vector<float>();
  manual_seed(42);
  EXPECT_EQ(rand({100}).to_vector<float>(), a);
  EXPECT_EQ(rand({100}).to_vector<float>(), b);
  EXPECT_NE(a, b);
  manual_seed(43);
  EXPECT_NE(rand({100}).to_vector<float>(), a);
}

TEST(Random, EverySixtyFourBitSeedIsItsOwnStream) {
  // Seeds that one double cannot tell apart (2^53 and 2^53 + 1; 2^63 and 2^63 + 1, which also
  // overflowed i64) give different numbers; the same seed the same numbers.
  const auto draw_after = [](uint64_t seed) {
    manual_seed(seed);
    return rand({4}).to_vector<float>();
  };
  const uint64_t p53 = uint64_t{1} << 53, p63 = uint64_t{1} << 63;
  EXPECT_NE(draw_after(p53), draw_after(p53 + 1));
  EXPECT_NE(draw_after(p63), draw_after(p63 + 1));
  EXPECT_NE(draw_after(~uint64_t{0}), draw_after(p63));
  EXPECT_EQ(draw_after(~uint64_t{0}), draw_after(~uint64_t{0}));
}

TEST(Random, UniformAndNormalHaveTheRightMoments) {
  manual_seed(1);
  const int n = 200000;
  for (DType dt : {DType::f32, DType::f64}) {
    std::vector<double> u = cast(rand({n}, dt), DType::f64).to_vector<double>();
    double mean = 0, sq = 0;
    for (double x : u) {
      ASSERT_GE(x, 0.0);
      ASSERT_LT(x, 1.0);
      mean += x;
      sq += x * x;
    }
    mean /= n;
    EXPECT_NEAR(mean, 0.5, 0.005);
    EXPECT_NEAR(sq / n - mean * mean, 1.0 / 12, 0.002);
    std::vector<double> z = cast(randn({n}, dt), DType::f64).to_vector<double>();
    mean = sq = 0;
    for (double x : z) {
      mean += x;
      sq += x * x;
    }
    mean /= n;
    EXPECT_NEAR(mean, 0.0, 0.01);
    EXPECT_NEAR(std::sqrt(sq / n - mean * mean), 1.0, 0.01);
  }
}

TEST(Random, SixteenBitUniformsStayBelowOne) {
  manual_seed(3);
  for (DType dt : {DType::bf16, DType::f16}) {
    std::vector<float> v = cast(rand({50000}, dt), DType::f32).to_vector<float>();
    for (float x : v) {
      ASSERT_GE(x, 0.0f);
      ASSERT_LT(x, 1.0f);
    }
  }
}

TEST(Random, RandintBernoulliAndDropout) {
  manual_seed(5);
  std::vector<int64_t> r = randint(-3, 4, {10000}).to_vector<int64_t>();
  std::vector<int> seen(7, 0);
  for (int64_t x : r) {
    ASSERT_GE(x, -3);
    ASSERT_LT(x, 4);
    seen[x + 3]++;
  }
  for (int c : seen) EXPECT_NEAR(c, 10000 / 7, 150);
  std::vector<float> b = bernoulli(full({20000}, 0.25)).to_vector<float>();
  double ones = 0;
  for (float x : b) ones += x;
  EXPECT_NEAR(ones / 20000, 0.25, 0.01);
  std::vector<float> m = dropout(ones_like(full({1000}, 1.0)), 0.2).to_vector<float>();
  int zeros = 0;
  for (float x : m) {
    EXPECT_TRUE(x == 0.0f || x == 1.25f) << x;
    zeros += x == 0.0f;
  }
  EXPECT_NEAR(zeros, 200, 50);
  Tensor x = tensor({1, 2, 3}, {3});
  EXPECT_EQ(dropout(x, 0.5, false).to_vector<float>(), (std::vector<float>{1, 2, 3}));
}

TEST(Random, DrawsAreGraphInputsNotConstants) {
  cache::clear_memory();
  metrics::reset();
  manual_seed(9);
  Tensor w = tensor({1, 1, 1, 1}, {4});
  std::vector<std::vector<float>> seen;
  for (int step = 0; step < 5; ++step) {
    w.copy_(w * 0.5 + dropout_mask({4}, 0.5));
    mark_step();
    seen.push_back(w.to_vector<float>());
  }
  EXPECT_LE(metrics::counter("UncachedCompile"), 2);
  EXPECT_NE(seen[3], seen[4]);
  manual_seed(9);
  Tensor w2 = tensor({1, 1, 1, 1}, {4});
  for (int step = 0; step < 5; ++step) {
    w2.copy_(w2 * 0.5 + dropout_mask({4}, 0.5));
    mark_step();
  }
  EXPECT_EQ(w2.to_vector<float>(), seen[4]) << "the same seed gives the same sequence";
}

TEST(Random, InsideLoopBodiesEachIterationDrawsTheNextNumbers) {
  // A loop of three draws gives the unrolled loop's three draws (and sums), and the generator
  // continues after them (tests/cpp/trace/scan_test.cpp covers every loop form and gradients).
  manual_seed(5);
  std::vector<float> unrolled;
  float sum = 0;
  for (int i = 0; i < 3; ++i) {
    unrolled.push_back(static_cast<float>(rand({1}).item()));
    sum += unrolled.back();
  }
  const float after = static_cast<float>(rand({1}).item());
  manual_seed(5);
  Carry c = fori_loop(0, 3, [](const Tensor&, const Carry& c) { return Carry{c[0] + rand({1})}; }, {zeros({1})});
  EXPECT_FLOAT_EQ(static_cast<float>(c[0].item()), sum);
  EXPECT_EQ(static_cast<float>(rand({1}).item()), after);
  EXPECT_NE(unrolled[0], unrolled[1]);
}

}  // namespace lazyrt
