// The reductions' building blocks (sums.h) against plain loops: run_extreme against folding
// element by element with fold_extreme (the first nan, the first of -0 and +0), and a run's sum
// given in pieces (Lanes) against run_sum over the whole run, on seeded random runs of every
// length up to 200 with nans, infinities and signed zeros mixed in; short runs, which run_sum
// adds in order, against the lanes.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "backend/cpu/kernels/sums.h"

namespace lazyrt::kernels::sums {
namespace {

bool same_bits(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }

std::vector<float> run_of(std::mt19937& rng, int64_t n) {
  std::vector<float> x(static_cast<size_t>(n));
  for (float& v : x) {
    const int r = static_cast<int>(rng() % 40);
    v = r == 0 ? 0.0f : r == 1 ? -0.0f : r == 2 ? NAN : r == 3 ? -INFINITY : r == 4 ? INFINITY
      : std::uniform_real_distribution<float>(-4, 4)(rng);
  }
  // Some runs have no nan, some are all of one sign, so every branch is taken.
  if (rng() % 3 == 0)
    for (float& v : x)
      if (v != v) v = 1.5f;
  // Runs of one sign with zeros of both signs: the extreme is a zero, and which one is first
  // decides its sign.
  const int sign = static_cast<int>(rng() % 4);
  for (float& v : x) {
    if (sign == 0 && v > 0) v = -v;  // no element above zero: the maximum may be a zero
    if (sign == 1 && v < 0) v = -v;  // none below: the minimum may be
  }
  return x;
}

template <bool kMax>
double folded(const std::vector<float>& x) {
  double acc = 0;
  for (size_t i = 0; i < x.size(); ++i) acc = fold_extreme<kMax>(acc, static_cast<double>(x[i]), i == 0);
  return acc;
}

TEST(Sums, RunExtremeIsTheElementByElementFold) {
  std::mt19937 rng(3);
  int zeros = 0, nans = 0, negative_zeros = 0;
  for (int trial = 0; trial < 4000; ++trial) {
    const auto x = run_of(rng, 1 + trial % 200);
    const double mx = run_extreme<true, float>(x.data(), static_cast<int64_t>(x.size()));
    const double mn = run_extreme<false, float>(x.data(), static_cast<int64_t>(x.size()));
    ASSERT_TRUE(same_bits(mx, folded<true>(x))) << "max, trial " << trial << ": " << mx << " vs " << folded<true>(x);
    ASSERT_TRUE(same_bits(mn, folded<false>(x))) << "min, trial " << trial << ": " << mn << " vs " << folded<false>(x);
    zeros += mx == 0 || mn == 0;
    negative_zeros += (mx == 0 && std::signbit(mx)) || (mn == 0 && std::signbit(mn));
    nans += mx != mx;
  }
  EXPECT_GT(zeros, 200);  // signed zeros were the extreme often enough to matter
  EXPECT_GT(negative_zeros, 50);
  EXPECT_GT(nans, 1000);
}

TEST(Sums, ARunGivenInPiecesSumsAsAWhole) {
  std::mt19937 rng(4);
  for (int trial = 0; trial < 2000; ++trial) {
    std::vector<float> x(static_cast<size_t>(1 + rng() % 1500));
    for (float& v : x) v = std::uniform_real_distribution<float>(-1e3f, 1e3f)(rng);
    const auto n = static_cast<int64_t>(x.size());
    const double mean = 0.25;
    Lanes sum, squares;
    int64_t at = 0;
    while (n - at > 64) {  // pieces of whole groups of kLanes, then the rest
      const int64_t piece = kLanes * (1 + static_cast<int64_t>(rng() % 4));
      sum.add<float>(x.data() + at, piece);
      squares.add<float>(x.data() + at, piece, mean, true);
      at += piece;
    }
    ASSERT_TRUE(same_bits(sum.finish<float>(x.data() + at, n - at), run_sum<float>(x.data(), n))) << trial;
    ASSERT_TRUE(same_bits(squares.finish<float>(x.data() + at, n - at, mean, true),
                          run_squared_deviations<float>(x.data(), n, mean)))
        << trial;
  }
}

// The same bits, except that any nan matches any nan: which nan an addition of two nans (or of
// a nan and inf - inf's default nan) returns depends on the operand order the compiler picks
// for a commutative addition, in every sum alike, so nans match by being nans.
bool same_value(double a, double b) { return same_bits(a, b) || (a != a && b != b); }

TEST(Sums, AShortRunIsSummedInOrderToTheLanesBits) {
  // run_sum and run_squared_deviations add runs shorter than two groups in order, without the
  // lanes; Lanes gives every run its sum the long way.
  std::mt19937 rng(5);
  int nans = 0, negative_zeros = 0;
  for (int64_t n = 0; n <= 3 * kLanes; ++n) {
    for (int trial = 0; trial < 300; ++trial) {
      const std::vector<float> x = run_of(rng, n);
      const double mean = trial % 2 ? 0.0 : -0.75;
      const double sum = run_sum<float>(x.data(), n), lanes = Lanes{}.finish<float>(x.data(), n);
      ASSERT_TRUE(same_value(sum, lanes)) << n << " " << trial << ": " << sum << " vs " << lanes;
      const double sq = run_squared_deviations<float>(x.data(), n, mean);
      const double sq_lanes = Lanes{}.finish<float>(x.data(), n, mean, true);
      ASSERT_TRUE(same_value(sq, sq_lanes)) << n << " " << trial << ": " << sq << " vs " << sq_lanes;
      nans += sum != sum;
      negative_zeros += sum == 0 && std::signbit(sum);
    }
  }
  EXPECT_GT(nans, 1000);          // nans and infinities were met often enough to matter
  EXPECT_EQ(negative_zeros, 0);  // a sum starts from +0: all -0 elements still sum to +0
}

}  // namespace
}  // namespace lazyrt::kernels::sums
