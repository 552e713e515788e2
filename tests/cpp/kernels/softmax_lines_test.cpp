// softmax and log_softmax give each line the same bits whichever loop runs it: short contiguous
// lines (16 elements or fewer, run a group at a time), long contiguous lines, and strided lines
// (the same values along dim 0 of the transposed tensor).
#include <gtest/gtest.h>

#include <lazyrt/lazyrt.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

namespace lazyrt {
namespace {

std::vector<float> line_values(int64_t lines, int64_t n) {
  std::vector<float> v(static_cast<size_t>(lines * n));
  uint64_t s = static_cast<uint64_t>(n) * 0x9E3779B97F4A7C15ull + 1;
  for (float& x : v) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    x = static_cast<float>((static_cast<double>(s >> 11) / 9007199254740992.0 - 0.5) * 40.0);
  }
  const float inf = std::numeric_limits<float>::infinity();
  // A NaN, a line of -inf, an inf, a line of zeros, a -0 (lines 1, 3, 5, 7 and 9).
  v[static_cast<size_t>(1 * n)] = std::nanf("");
  for (int64_t j = 0; j < n; ++j) v[static_cast<size_t>(3 * n + j)] = -inf;
  v[static_cast<size_t>(5 * n + n / 2)] = inf;
  for (int64_t j = 0; j < n; ++j) v[static_cast<size_t>(7 * n + j)] = 0.0f;
  v[static_cast<size_t>(9 * n)] = -0.0f;
  // Two NaNs of different payloads (kept by bf16 too) in line 11: every element of the line is a
  // NaN in every loop. Which payload an operation on two NaNs keeps is not defined (compilers
  // may swap the operands of a product), so only NaN-ness is compared there.
  if (n >= 2) {
    const uint32_t first = 0x7fc10000u, second = 0x7fc20000u;
    std::memcpy(&v[static_cast<size_t>(11 * n + 1)], &first, sizeof(float));
    std::memcpy(&v[static_cast<size_t>(11 * n + n - 1)], &second, sizeof(float));
  }
  return v;
}

}  // namespace

TEST(SoftmaxLines, ShortLongAndStridedLinesGiveTheSameBits) {
  const int64_t lines = 150;  // more than one group of short lines
  for (int64_t n : {1, 2, 5, 10, 16, 17, 40})
    for (bool log : {false, true})
      for (DType d : {DType::f32, DType::bf16}) {
        const Tensor x = tensor(line_values(lines, n), {lines, n}).to(d);
        const Tensor along_rows = log ? log_softmax(x, 1) : softmax(x, 1);
        // The same lines down the columns of a contiguous copy of the transpose (stride `lines`).
        const Tensor columns = transpose(x, 0, 1).contiguous();
        const Tensor along_columns = transpose(log ? log_softmax(columns, 0) : softmax(columns, 0), 0, 1);
        const std::vector<float> a = along_rows.to(DType::f32).to_vector<float>();
        const std::vector<float> b = along_columns.to(DType::f32).to_vector<float>();
        ASSERT_EQ(a.size(), b.size());
        for (size_t i = 0; i < a.size(); ++i)
          if (n >= 2 && i / static_cast<size_t>(n) == 11)
            ASSERT_TRUE(std::isnan(a[i]) && std::isnan(b[i])) << "element " << i << " of the line of two NaNs";
          else
            ASSERT_EQ(std::memcmp(&a[i], &b[i], sizeof(float)), 0)
              << (log ? "log_softmax" : "softmax") << " " << dtype_name(d) << " n=" << n << " element " << i
              << ": " << a[i] << " vs " << b[i];
      }
}

}  // namespace lazyrt
