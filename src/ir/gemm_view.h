// gemm_view's operands: each matrix operand read as a strided view of a value's elements (in
// row-major order), so that a product reads slices, permutes and reshapes of a value where it
// lies instead of a copy of them. One definition for the shape rule (which refuses views a GEMM
// cannot read), the compile pass that makes them, and the kernel.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <vector>

namespace lazyrt::ir {

/// Elements of a value as a view: element (i0, i1, ...) at offset + sum(i_d * strides[d]).
struct StridedView {
  int64_t offset = 0;
  std::vector<int64_t> sizes, strides;

  /// The view of a whole value of this shape, row-major.
  static StridedView whole(const std::vector<int64_t>& shape) {
    StridedView v{0, shape, std::vector<int64_t>(shape.size(), 1)};
    for (size_t d = shape.size(); d-- > 1;) v.strides[d - 1] = v.strides[d] * std::max<int64_t>(shape[d], 1);
    return v;
  }
  /// gemm_view's attribute: the offset, then each dim's (size, stride).
  std::vector<int64_t> encode() const {
    std::vector<int64_t> out{offset};
    for (size_t d = 0; d < sizes.size(); ++d) {
      out.push_back(sizes[d]);
      out.push_back(strides[d]);
    }
    return out;
  }
  static StridedView decode(const std::vector<int64_t>& a) {
    StridedView v;
    if (a.empty()) return v;
    v.offset = a[0];
    for (size_t i = 1; i + 1 < a.size(); i += 2) {
      v.sizes.push_back(a[i]);
      v.strides.push_back(a[i + 1]);
    }
    return v;
  }
  bool operator==(const StridedView&) const = default;
};

/// How a BLAS GEMM reads a [rows, cols] matrix whose elements are row_stride and col_stride
/// apart: row-major with leading dimension ld (columns adjacent), or transposed (rows
/// adjacent); nullopt where neither holds (BLAS needs ld >= the adjacent extent).
struct BlasMatrix {
  bool transposed = false;
  int64_t ld = 1;
};

inline std::optional<BlasMatrix> blas_matrix(int64_t rows, int64_t cols, int64_t row_stride, int64_t col_stride) {
  if (cols <= 1 || col_stride == 1) {
    const int64_t ld = rows <= 1 ? std::max<int64_t>(cols, 1) : row_stride;
    if (ld >= std::max<int64_t>(cols, 1)) return BlasMatrix{false, ld};
  }
  if (rows <= 1 || row_stride == 1) {
    const int64_t ld = cols <= 1 ? std::max<int64_t>(rows, 1) : col_stride;
    if (ld >= std::max<int64_t>(rows, 1)) return BlasMatrix{true, ld};
  }
  return std::nullopt;
}

/// The matrix dims of a view of rank >= 2 as BLAS reads them.
inline std::optional<BlasMatrix> blas_matrix(const StridedView& v) {
  const size_t r = v.sizes.size();
  if (r < 2) return std::nullopt;
  return blas_matrix(v.sizes[r - 2], v.sizes[r - 1], v.strides[r - 2], v.strides[r - 1]);
}

}  // namespace lazyrt::ir
