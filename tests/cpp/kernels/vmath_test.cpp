// The f32 exp, erf and tanh of vmath.h against the C library's f64 functions rounded to f32,
// over a sample of every f32 bit pattern; and the kernels that use them (cloned per ISA, run
// through the runtime) against the same functions called one value at a time.
#include <gtest/gtest.h>

#include <lazyrt/lazyrt.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>

#include "scalar/vmath.h"

namespace lazyrt {
namespace {

// Distance in representable f32 values; 0 for two nans.
int64_t ulps(float a, float b) {
  if (std::isnan(a) && std::isnan(b)) return 0;
  if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<int64_t>::max();
  auto ordered = [](float f) {
    int32_t i;
    std::memcpy(&i, &f, 4);
    return i < 0 ? static_cast<int64_t>(INT32_MIN) - i : static_cast<int64_t>(i);
  };
  return std::llabs(ordered(a) - ordered(b));
}

template <class F, class R>
void expect_within(const char* name, F f, R ref, int64_t bound) {
  int64_t worst = 0;
  float at = 0;
  for (uint64_t u = 0; u < (uint64_t{1} << 32); u += 257) {
    const uint32_t bits = static_cast<uint32_t>(u);
    float x;
    std::memcpy(&x, &bits, 4);
    const int64_t d = ulps(f(x), static_cast<float>(ref(static_cast<double>(x))));
    if (d > worst) {
      worst = d;
      at = x;
    }
  }
  EXPECT_LE(worst, bound) << name << ": worst at " << at;
}

TEST(VectorMath, WithinTwoUlpsOfTheCorrectlyRoundedValueOverTheF32Range) {
  // Called from lambdas: the functions are always inlined, so never taken by address.
  expect_within("exp", [](float x) { return scalar::vm::exp_f32(x); }, [](double x) { return std::exp(x); }, 2);
  expect_within("erf", [](float x) { return scalar::vm::erf_f32(x); }, [](double x) { return std::erf(x); }, 2);
  expect_within("tanh", [](float x) { return scalar::vm::tanh_f32(x); }, [](double x) { return std::tanh(x); }, 2);
}

TEST(VectorMath, SpecialValuesAsTheCLibraryHasThem) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  using scalar::vm::erf_f32;
  using scalar::vm::exp_f32;
  using scalar::vm::tanh_f32;
  EXPECT_EQ(exp_f32(-inf), 0.0f);
  EXPECT_EQ(exp_f32(inf), inf);
  EXPECT_EQ(exp_f32(88.8f), inf);
  EXPECT_EQ(exp_f32(-104.0f), 0.0f);
  EXPECT_TRUE(std::isnan(exp_f32(nan)));
  // Subnormal results, as the C library's.
  for (float x : {-87.5f, -95.0f, -100.0f, -103.0f})
    EXPECT_EQ(exp_f32(x), static_cast<float>(std::exp(static_cast<double>(x)))) << x;
  EXPECT_EQ(erf_f32(inf), 1.0f);
  EXPECT_EQ(erf_f32(-inf), -1.0f);
  EXPECT_TRUE(std::isnan(erf_f32(nan)));
  EXPECT_TRUE(std::signbit(erf_f32(-0.0f)));
  EXPECT_EQ(tanh_f32(inf), 1.0f);
  EXPECT_EQ(tanh_f32(-inf), -1.0f);
  EXPECT_TRUE(std::isnan(tanh_f32(nan)));
  EXPECT_TRUE(std::signbit(tanh_f32(-0.0f)));
}

// The one-op kernels, the fused kernel and softmax run these functions inside loops compiled for
// the CPU's ISA; each element must be the bits of the scalar function (compiled here for the
// baseline), so results do not depend on which clone or kernel ran.
TEST(VectorMath, KernelsGiveTheScalarFunctionsBits) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  const int64_t n = 4099;  // not a multiple of any vector width
  std::vector<float> xs(n);
  for (auto& x : xs) x = normal(rng);
  xs[0] = std::numeric_limits<float>::quiet_NaN();
  xs[1] = -std::numeric_limits<float>::infinity();
  xs[2] = -0.0f;
  for (const char* backend : {"cpu", "reference"}) {
    set_backend(backend);
    Tensor x = tensor(xs, {n});
    struct Case {
      const char* name;
      Tensor got;
      float (*want)(float);
    };
    std::vector<Case> cases = {
        {"exp", exp(x), [](float v) { return scalar::vm::exp_f32(v); }},
        {"erf", erf(x), [](float v) { return scalar::vm::erf_f32(v); }},
        {"tanh", tanh(x), [](float v) { return scalar::vm::tanh_f32(v); }},
        // Fused on the cpu backend: exp then a multiply in one pass.
        {"exp(x) * 2", exp(x) * 2.0, [](float v) { return scalar::vm::exp_f32(v) * 2.0f; }},
        {"gelu", gelu(x),
         [](float v) { return v * 0.5f * (1.0f + scalar::vm::erf_f32(v * static_cast<float>(M_SQRT1_2))); }},
    };
    for (auto& c : cases) {
      const std::vector<float> got = c.got.to_vector<float>();
      for (int64_t i = 0; i < n; ++i) {
        const float want = c.want(xs[i]);
        if (std::isnan(want)) {
          EXPECT_TRUE(std::isnan(got[i])) << backend << " " << c.name << " at " << xs[i];
        } else {
          ASSERT_EQ(std::memcmp(&got[i], &want, 4), 0)
              << backend << " " << c.name << "(" << xs[i] << "): " << got[i] << " against " << want;
        }
      }
    }
  }
  set_backend("cpu");
}

}  // namespace
}  // namespace lazyrt
