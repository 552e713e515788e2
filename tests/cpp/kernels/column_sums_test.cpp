// Sums over leading dims with trailing dims kept (bias gradients, per-feature statistics): each
// output adds its reduced elements in the input's order in double, then rounds once, so the
// bits are those of a plain sequential loop whatever the grouping of rows the kernel uses.
#include <gtest/gtest.h>

#include <lazyrt/lazyrt.h>

#include <cmath>
#include <cstring>
#include <vector>

namespace lazyrt {
namespace {

// Values whose sums depend on the order of the additions even after rounding to f32: a quarter
// are +-2^60, the rest in [-1, 1). What is added while a +-2^60 is in the sum is lost to
// rounding, so which small values survive depends on where the large ones cancel.
std::vector<float> values(int64_t n, uint64_t seed) {
  std::vector<float> v(static_cast<size_t>(n));
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  for (float& x : v) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    const double m = static_cast<double>(s >> 40) / 8388608.0 - 1.0;  // 24 random bits in [-1, 1)
    x = (s >> 8) % 4 == 0 ? static_cast<float>(std::ldexp(m < 0 ? -1.0 : 1.0, 60)) : static_cast<float>(m);
  }
  return v;
}

bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }

}  // namespace

TEST(ColumnSums, AddTheRowsInOrderInDoubleForEveryRowCountAndWidth) {
  // Row counts around the kernel's groups of rows, widths around its vectors and chunks.
  for (int64_t rows : {1, 3, 4, 5, 9, 257})
    for (int64_t cols : {2, 7, 33, 300}) {
      const std::vector<float> a = values(rows * cols, static_cast<uint64_t>(rows * 1000 + cols));
      const Tensor t = tensor(a, {rows, cols});
      const std::vector<float> s = sum(t, {0}).to_vector<float>();
      const std::vector<float> m = mean(t, {0}).to_vector<float>();
      for (int64_t j = 0; j < cols; ++j) {
        double acc = 0;
        for (int64_t i = 0; i < rows; ++i) acc += static_cast<double>(a[static_cast<size_t>(i * cols + j)]);
        ASSERT_TRUE(same_bits(s[static_cast<size_t>(j)], static_cast<float>(acc)))
            << rows << "x" << cols << " column " << j << ": " << s[static_cast<size_t>(j)] << " vs " << acc;
        ASSERT_TRUE(same_bits(m[static_cast<size_t>(j)], static_cast<float>(acc / static_cast<double>(rows))))
            << "mean, " << rows << "x" << cols << " column " << j;
      }
    }
}

TEST(ColumnSums, SeveralReducedDimsAreAddedInTheInputsOrder) {
  // [4, 3, 5, 6] summed over dims 0 and 2: each output (j, l) adds a[i][j][k][l] for i, then k.
  const Shape shape{4, 3, 5, 6};
  const std::vector<float> a = values(4 * 3 * 5 * 6, 7);
  for (DType d : {DType::f32, DType::bf16}) {
    const Tensor t = tensor(a, shape).to(d);
    const std::vector<float> widened = t.to(DType::f32).to_vector<float>();  // bf16 values exactly
    const std::vector<float> s = sum(t, {0, 2}).to(DType::f32).to_vector<float>();
    for (int64_t j = 0; j < 3; ++j)
      for (int64_t l = 0; l < 6; ++l) {
        double acc = 0;
        for (int64_t i = 0; i < 4; ++i)
          for (int64_t k = 0; k < 5; ++k) acc += widened[static_cast<size_t>(((i * 3 + j) * 5 + k) * 6 + l)];
        // Rounded to f32, then (bf16) to the result dtype, as the kernel stores it.
        const float expected = d == DType::f32 ? static_cast<float>(acc)
                                               : static_cast<float>(scalar_tensor(static_cast<float>(acc)).to(d).item());
        ASSERT_TRUE(same_bits(s[static_cast<size_t>(j * 6 + l)], expected)) << dtype_name(d) << " (" << j << ", " << l << ")";
      }
  }
}

}  // namespace lazyrt
