// Shared machinery of the CPU kernels: the precomputed broadcast iteration of elementwise ops,
// strided copies, reductions and line-wise layouts. Dtype dispatch is util/dtype_dispatch.h.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "ir/graph.h"
#include "util/check.h"
#include "util/dtype_dispatch.h"
#include "backend/cpu/kernels/parallel.h"

namespace lazyrt::kernels {

inline constexpr int kMaxRank = 16;

/// Iteration of an elementwise op over its output, with each input broadcast to the output
/// shape. Dims are collapsed where every operand is contiguous across them, so the common
/// cases (same shapes, a scalar operand, a row vector) become one or two loops.
//
/// With repeat_runs_below > 0, innermost runs shorter than that are merged with the dim before
/// them when every input is either contiguous across the two or broadcast along the inner one
/// only (a per-channel vector against [N, C, H, W] with a small H * W): such an input is
/// "repeated", its inner stride is 0 and element j of a run is its element
/// (j / repeat[k]) * group_stride[k] past the run's offset. Only kernels that read repeat and
/// group_stride may ask for it (the fused kernel).
struct BroadcastLayout {
  int64_t numel = 0;
  std::vector<int64_t> shape;                 // collapsed output shape, innermost last
  std::vector<std::vector<int64_t>> strides;  // per input, element strides per collapsed dim
  std::vector<int64_t> repeat;                // per input when merged as above (1: not repeated)
  std::vector<int64_t> group_stride;          // per repeated input: stride between its groups

  BroadcastLayout(const Shape& out, const std::vector<Shape>& inputs, int64_t repeat_runs_below = 0);

  /// Calls inner(offsets, n, inner_strides, out_offset) for each innermost run: offsets[k] is
  /// the element offset of input k, n the run length, inner_strides[k] its stride within the
  /// run, out_offset the run's first output element. Large iterations are split across the
  /// thread pool, so inner must only write the run's own outputs.
  template <class Inner>
  void for_each_run(Inner&& inner) const {
    if (numel == 0) return;
    const size_t rank = shape.size();
    const size_t nin = strides.size();
    std::array<int64_t, 8> zero{};
    if (rank == 0) {
      inner(zero.data(), int64_t{1}, zero.data(), int64_t{0});
      return;
    }
    std::array<int64_t, 8> inner_strides{};
    for (size_t k = 0; k < nin; ++k) inner_strides[k] = strides[k][rank - 1];
    const int64_t run = shape[rank - 1];
    const int64_t rows = numel / run;
    if (rows == 1) {  // one long run: split it
      parallel_for(run, kParallelGrain, [&](int64_t b, int64_t e) {
        std::array<int64_t, 8> offs{};
        for (size_t k = 0; k < nin; ++k) offs[k] = b * inner_strides[k];
        inner(offs.data(), e - b, inner_strides.data(), b);
      });
      return;
    }
    const int64_t grain = std::max<int64_t>(1, kParallelGrain / run);
    if (rank == 2) {  // rows of a matrix: no odometer
      parallel_for(rows, grain, [&](int64_t b, int64_t e) {
        std::array<int64_t, 8> offs{};
        for (int64_t row = b; row < e; ++row) {
          for (size_t k = 0; k < nin; ++k) offs[k] = row * strides[k][0];
          inner(offs.data(), run, inner_strides.data(), row * run);
        }
      });
      return;
    }
    parallel_for(rows, grain, [&](int64_t b, int64_t e) {
      // The odometer over the outer dims, started at row b.
      std::array<int64_t, kMaxRank> idx{};
      std::array<int64_t, 8> offs{};
      int64_t r = b;
      for (int64_t d = static_cast<int64_t>(rank) - 2; d >= 0; --d) {
        idx[d] = r % shape[d];
        r /= shape[d];
        for (size_t k = 0; k < nin; ++k) offs[k] += idx[d] * strides[k][d];
      }
      for (int64_t row = b; row < e; ++row) {
        inner(offs.data(), run, inner_strides.data(), row * run);
        for (int64_t d = static_cast<int64_t>(rank) - 2; d >= 0; --d) {
          if (++idx[d] < shape[d]) {
            for (size_t k = 0; k < nin; ++k) offs[k] += strides[k][d];
            break;
          }
          for (size_t k = 0; k < nin; ++k) offs[k] -= strides[k][d] * (shape[d] - 1);
          idx[d] = 0;
        }
      }
    });
  }
};

}  // namespace lazyrt::kernels

namespace lazyrt::kernels {

/// Iteration over one strided operand in row-major order of `shape`, with dims collapsed
/// where the strides allow. for_each_run(fn) calls fn(offset, n, stride) for each innermost
/// run of n elements at element offset `offset` with element stride `stride`.
struct StridedLayout {
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;
  int64_t numel = 0;

  StridedLayout(const Shape& shape_in, const std::vector<int64_t>& strides_in) {
    LAZYRT_ASSERT(shape_in.size() <= static_cast<size_t>(kMaxRank), "rank ", shape_in.size(),
                  " exceeds the kernel limit ", kMaxRank);
    numel = shape_numel(shape_in);
    if (numel == 0) return;  // addresses nothing; its strides may pass 64 bits
    for (size_t d = 0; d < shape_in.size(); ++d) {
      if (shape_in[d] == 1) continue;
      if (!shape.empty() && strides.back() == strides_in[d] * shape_in[d]) {
        shape.back() *= shape_in[d];
        strides.back() = strides_in[d];
      } else {
        shape.push_back(shape_in[d]);
        strides.push_back(strides_in[d]);
      }
    }
  }

  /// The element offset of the i-th element in row-major order.
  int64_t offset_of(int64_t i) const {
    int64_t off = 0;
    for (size_t d = shape.size(); d-- > 0;) {
      off += (i % shape[d]) * strides[d];
      i /= shape[d];
    }
    return off;
  }

  template <class Fn>
  void for_each_run(Fn&& fn) const {
    if (numel == 0) return;
    const size_t rank = shape.size();
    if (rank == 0) {
      fn(int64_t{0}, int64_t{1}, int64_t{0});
      return;
    }
    const int64_t run = shape[rank - 1], run_stride = strides[rank - 1];
    if (rank <= 2) {  // one run, or the rows of a matrix: no odometer
      const int64_t rows = rank == 2 ? shape[0] : 1, row_stride = rank == 2 ? strides[0] : 0;
      for (int64_t r = 0; r < rows; ++r) fn(r * row_stride, run, run_stride);
      return;
    }
    std::array<int64_t, kMaxRank> idx{};
    int64_t off = 0;
    while (true) {
      fn(off, run, run_stride);
      int64_t d = static_cast<int64_t>(rank) - 2;
      for (; d >= 0; --d) {
        if (++idx[d] < shape[d]) {
          off += strides[d];
          break;
        }
        off -= strides[d] * (shape[d] - 1);
        idx[d] = 0;
      }
      if (d < 0) return;
    }
  }
};

/// Contiguous element strides of a shape.
inline std::vector<int64_t> contiguous_strides(const Shape& shape) {
  std::vector<int64_t> s(shape.size());
  int64_t st = 1;
  for (size_t d = shape.size(); d-- > 0;) {
    s[d] = st;
    st = lazyrt::detail::stride_mul_add(st, shape[d]);  // past 64 bits only for an empty shape
  }
  return s;
}

/// Iteration of a reduction over `dims` of a contiguous input: `outer` walks the kept dims in
/// row-major order (one output element each), `inner` walks the reduced dims of one output.
struct ReduceLayout {
  StridedLayout outer;  // over the kept dims, strides into the input
  StridedLayout inner;  // over the reduced dims, strides into the input
  int64_t count;        // elements per output
  // The kept dims after the last reduced one (of size > 1) form a block of `trailing` elements,
  // contiguous in the input and the output (1: the innermost dim is reduced); `lead` walks the
  // kept dims before it. Output j is lead element j / trailing, block element j % trailing.
  int64_t trailing;
  StridedLayout lead;

  static bool is_reduced(const std::vector<int64_t>& dims, size_t d) {
    return std::find(dims.begin(), dims.end(), static_cast<int64_t>(d)) != dims.end();
  }
  // The first dim of the trailing kept block.
  static size_t block_start(const Shape& in, const std::vector<int64_t>& dims) {
    size_t d = in.size();
    while (d > 0 && !(is_reduced(dims, d - 1) && in[d - 1] != 1)) --d;
    return d;
  }
  // The dims of [0, end) that are reduced (or kept), with their input strides.
  static StridedLayout part(const Shape& in, const std::vector<int64_t>& dims, bool reduced, size_t end) {
    std::vector<int64_t> st = contiguous_strides(in);
    Shape shape;
    std::vector<int64_t> strides;
    for (size_t d = 0; d < end; ++d) {
      if (is_reduced(dims, d) == reduced) {
        shape.push_back(in[d]);
        strides.push_back(st[d]);
      }
    }
    return StridedLayout(shape, strides);
  }
  static int64_t block_numel(const Shape& in, size_t start) {
    int64_t n = 1;
    for (size_t d = start; d < in.size(); ++d) n *= in[d];
    return n;
  }
  ReduceLayout(const Shape& in, const std::vector<int64_t>& dims)
      : outer(part(in, dims, false, in.size())),
        inner(part(in, dims, true, in.size())),
        count(inner.numel),
        trailing(block_numel(in, block_start(in, dims))),
        lead(part(in, dims, false, block_start(in, dims))) {}
};

/// A tensor seen as [outer, n, inner] around one dim: outer * inner lines of n elements, each
/// with stride `inner` (softmax, the cumulative ops, sorting).
struct Lines {
  int64_t outer = 1, n = 1, inner = 1;
  Lines(const Shape& shape, int64_t dim) {
    for (int64_t d = 0; d < static_cast<int64_t>(shape.size()); ++d) {
      if (d < dim) outer *= shape[d];
      else if (d == dim) n = shape[d];
      else inner *= shape[d];
    }
  }
  int64_t count() const { return outer * inner; }
  /// The offset of line l's first element.
  int64_t base(int64_t l) const { return (l / inner) * n * inner + l % inner; }
};

}  // namespace lazyrt::kernels
