// where as a kernel of its own (its operands computed before it, so nothing fuses with it):
// every element the bits of the value its condition picks, for conditions of mixed values, every
// way an operand broadcasts into the run (a value per element, one value, one per row, one per
// column) and the dtypes whose bits it moves (NaN payloads and -0 included).
#include <gtest/gtest.h>

#include <lazyrt/lazyrt.h>
#include <lazyrt/metrics.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

namespace lazyrt {
namespace {

constexpr int64_t kRows = 6, kCols = 35;

// Values with NaN payloads, -0 and infinities among ordinary ones, from a seed.
std::vector<float> values(int64_t n, uint64_t seed) {
  std::vector<float> v(static_cast<size_t>(n));
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 3;
  for (size_t i = 0; i < v.size(); ++i) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    const uint32_t r = static_cast<uint32_t>(s >> 32);
    switch (r % 8) {
      case 0: {
        const uint32_t nan = 0x7FC00000u | (r >> 12);  // a quiet NaN with a payload
        std::memcpy(&v[i], &nan, sizeof nan);
        break;
      }
      case 1: v[i] = -0.0f; break;
      case 2: v[i] = (r & 16) ? std::numeric_limits<float>::infinity() : -std::numeric_limits<float>::infinity(); break;
      default: v[i] = static_cast<float>(static_cast<int32_t>(r % 2001) - 1000) / 8.0f;
    }
  }
  return v;
}

std::vector<bool> conditions(int64_t n, uint64_t seed) {
  std::vector<bool> c(static_cast<size_t>(n));
  uint64_t s = seed + 11;
  for (size_t i = 0; i < c.size(); ++i) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    c[i] = (s >> 40) & 1;
  }
  return c;
}

// An operand's element for output (i, j) under broadcasting: shape [R, C], [R, 1], [C] or [1].
int64_t at(const Shape& shape, int64_t i, int64_t j) {
  if (shape.size() == 2) return shape[1] == 1 ? i : i * kCols + j;
  return shape[0] == 1 ? 0 : j;
}

int64_t count(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

std::string name(const Shape& s) {
  std::string out = "[";
  for (size_t k = 0; k < s.size(); ++k) out += (k ? ", " : "") + std::to_string(s[k]);
  return out + "]";
}

bool ran_a_where_kernel() {
  for (const metrics::StepTiming& t : metrics::step_timings())
    if (t.op == "where") return true;
  return false;
}

}  // namespace

TEST(WhereKernel, PicksTheChosenValuesBitsForEveryBroadcastAndDtype) {
  const std::vector<Shape> value_shapes = {{kRows, kCols}, {1}, {kRows, 1}, {kCols}};
  const std::vector<Shape> cond_shapes = {{kRows, kCols}, {kRows, 1}, {kCols}};
  metrics::set_kernel_timings(true);
  uint64_t seed = 1;
  for (DType d : {DType::f32, DType::f64, DType::bf16, DType::i32})
    for (const Shape& cs : cond_shapes)
      for (const Shape& as : value_shapes)
        for (const Shape& bs : value_shapes) {
          auto has_rows = [](const Shape& s) { return s.size() == 2; };
          auto has_cols = [](const Shape& s) { return s.back() == kCols; };
          if (!(has_rows(cs) || has_rows(as) || has_rows(bs)) || !(has_cols(cs) || has_cols(as) || has_cols(bs)))
            continue;  // the result would be smaller than [kRows, kCols]
          ++seed;
          const std::vector<bool> c = conditions(count(cs), seed);
          const std::vector<float> av = values(count(as), seed * 3), bv = values(count(bs), seed * 5);
          Tensor ct = tensor(c, cs), at_ = tensor(av, as).to(d), bt = tensor(bv, bs).to(d);
          mark_step();  // the operands computed: where runs as a kernel of its own
          const std::vector<float> a_in = at_.to(DType::f32).to_vector<float>();  // the dtype's values, widened exactly
          const std::vector<float> b_in = bt.to(DType::f32).to_vector<float>();
          metrics::reset();
          const Tensor w = where(ct, at_, bt);
          mark_step();
          ASSERT_TRUE(ran_a_where_kernel()) << "no where kernel ran";
          ASSERT_EQ(w.shape(), (Shape{kRows, kCols}));
          const std::vector<float> got = w.to(DType::f32).to_vector<float>();
          for (int64_t i = 0; i < kRows; ++i)
            for (int64_t j = 0; j < kCols; ++j) {
              const bool pick_a = c[static_cast<size_t>(at(cs, i, j))];
              const float want = pick_a ? a_in[static_cast<size_t>(at(as, i, j))] : b_in[static_cast<size_t>(at(bs, i, j))];
              const float g = got[static_cast<size_t>(i * kCols + j)];
              ASSERT_EQ(std::memcmp(&g, &want, sizeof g), 0)
                  << dtype_name(d) << " cond " << name(cs) << " a " << name(as) << " b " << name(bs) << " at (" << i
                  << ", " << j << "): " << g << " instead of " << want;
            }
        }
  metrics::set_kernel_timings(false);
}

}  // namespace lazyrt
