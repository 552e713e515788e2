// Copies between strided layouts, the kernel of every data-movement op that moves elements
// without computing (permute, expand, slice, flip, pad): `shape` elements from src (element
// strides `src`) to dst (strides `dst`), dims merged where both sides are contiguous across
// them. Offsets are relative to the bases the caller adds; strides may be negative.
//
// The runs along the last dim are split across threads. Where the destination is contiguous
// along the last dim but the source is not, and the source is contiguous along another dim (a
// transpose: permute(0, 2, 3, 1) of a [b, t, h, d] tensor), the two dims are copied in square
// tiles: the tile's reads and its writes each stay within a few cache lines, where a run read
// with a stride would touch a line per element. Source and destination never overlap.
#pragma once

#include <algorithm>
#include <array>
#include <cstring>
#include <memory>
#include <vector>

#include "backend/cpu/kernels/loops.h"
#include "backend/cpu/kernels/ops.h"
#include "backend/cpu/kernels/parallel.h"

namespace lazyrt::kernels {

struct CopyLayout {
  std::vector<int64_t> shape, src, dst;
  int64_t numel = 0;
  int64_t src_base = 0, dst_base = 0;
  int tile_dim = -1;  // the dim copied in tiles with the last one, or -1

  static constexpr int64_t kTile = 16;

  CopyLayout(const Shape& s, const std::vector<int64_t>& src_strides, const std::vector<int64_t>& dst_strides) {
    LAZYRT_ASSERT(s.size() <= static_cast<size_t>(kMaxRank), "rank ", s.size(), " exceeds the kernel limit ",
                  kMaxRank);
    numel = shape_numel(s);
    if (numel == 0) return;  // copies nothing; its strides may pass 64 bits
    for (size_t d = 0; d < s.size(); ++d) {
      if (s[d] == 1) continue;
      if (!shape.empty() && src.back() == src_strides[d] * s[d] && dst.back() == dst_strides[d] * s[d]) {
        shape.back() *= s[d];
        src.back() = src_strides[d];
        dst.back() = dst_strides[d];
      } else {
        shape.push_back(s[d]);
        src.push_back(src_strides[d]);
        dst.push_back(dst_strides[d]);
      }
    }
    const size_t rank = shape.size();
    if (rank >= 2 && dst.back() == 1 && src.back() != 1 && shape.back() >= kTile)
      for (size_t d = rank - 1; d-- > 0;)
        if (src[d] == 1 && shape[d] >= kTile) {
          tile_dim = static_cast<int>(d);
          break;
        }
  }

  template <class W>
  void run(const W* from, W* to) const {
    if (numel == 0) return;
    from += src_base;
    to += dst_base;
    const int rank = static_cast<int>(shape.size());
    if (rank == 0) {
      *to = *from;
      return;
    }
    if (tile_dim >= 0) {
      run_tiles(from, to);
      return;
    }
    const int64_t n = shape[rank - 1], ss = src[rank - 1], ds = dst[rank - 1];
    parallel_for(numel / n, std::max<int64_t>(1, kParallelGrain / n), [&](int64_t first, int64_t last) {
      std::array<int64_t, kMaxRank> idx{};
      int64_t so = 0, doff = 0;
      place(first, rank - 1, -1, idx, so, doff);
      for (int64_t r = first; r < last; ++r) {
        if (ss == 1 && ds == 1) {
          std::memcpy(to + doff, from + so, static_cast<size_t>(n) * sizeof(W));
        } else {
          for (int64_t i = 0; i < n; ++i) to[doff + i * ds] = from[so + i * ss];
        }
        advance(rank - 1, -1, idx, so, doff);
      }
    });
  }

 private:
  // The offsets of position p of the odometer over dims [0, end) less `skip`.
  void place(int64_t p, int end, int skip, std::array<int64_t, kMaxRank>& idx, int64_t& so, int64_t& doff) const {
    for (int d = end - 1; d >= 0; --d) {
      if (d == skip) continue;
      idx[static_cast<size_t>(d)] = p % shape[static_cast<size_t>(d)];
      p /= shape[static_cast<size_t>(d)];
      so += idx[static_cast<size_t>(d)] * src[static_cast<size_t>(d)];
      doff += idx[static_cast<size_t>(d)] * dst[static_cast<size_t>(d)];
    }
  }
  // The odometer's next position.
  void advance(int end, int skip, std::array<int64_t, kMaxRank>& idx, int64_t& so, int64_t& doff) const {
    for (int d = end - 1; d >= 0; --d) {
      if (d == skip) continue;
      const auto u = static_cast<size_t>(d);
      if (++idx[u] < shape[u]) {
        so += src[u];
        doff += dst[u];
        return;
      }
      so -= src[u] * (shape[u] - 1);
      doff -= dst[u] * (shape[u] - 1);
      idx[u] = 0;
    }
  }

  // Each position of the dims other than tile_dim and the last: an m x n block (m along
  // tile_dim, read contiguously; n along the last dim, written contiguously), in tiles.
  template <class W>
  void run_tiles(const W* from, W* to) const {
    const int rank = static_cast<int>(shape.size()), t = tile_dim;
    const int64_t m = shape[static_cast<size_t>(t)], n = shape.back();
    const int64_t ss = src.back(), dt = dst[static_cast<size_t>(t)];
    parallel_for(numel / (m * n), std::max<int64_t>(1, kParallelGrain / (m * n)), [&](int64_t first, int64_t last) {
      std::array<int64_t, kMaxRank> idx{};
      int64_t so = 0, doff = 0;
      place(first, rank - 1, t, idx, so, doff);
      for (int64_t p = first; p < last; ++p) {
        const W* f = from + so;
        W* o = to + doff;
        for (int64_t i0 = 0; i0 < m; i0 += kTile) {
          const int64_t i1 = std::min(m, i0 + kTile);
          for (int64_t j0 = 0; j0 < n; j0 += kTile) {
            const int64_t j1 = std::min(n, j0 + kTile);
            for (int64_t j = j0; j < j1; ++j)
              for (int64_t i = i0; i < i1; ++i) o[i * dt + j] = f[i + j * ss];
          }
        }
        advance(rank - 1, t, idx, so, doff);
      }
    });
  }
};

// Calls fn with a value of the unsigned integer type of `bytes` bytes.
template <class Fn>
decltype(auto) visit_width(size_t bytes, Fn&& fn) {
  switch (bytes) {
    case 1: return fn(uint8_t{});
    case 2: return fn(uint16_t{});
    case 4: return fn(uint32_t{});
    case 8: return fn(uint64_t{});
  }
  LAZYRT_ASSERT(false, "bad element size ", bytes);
}

// The kernel that runs `layout` on elements of dtype's width.
inline Kernel copy_kernel(std::shared_ptr<const CopyLayout> layout, DType dtype) {
  return visit_width(dtype_size(dtype), [&](auto tag) -> Kernel {
    using W = decltype(tag);
    return {[layout](const void* const* in, void* const* out) {
      layout->run(static_cast<const W*>(in[0]), static_cast<W*>(out[0]));
    }};
  });
}

}  // namespace lazyrt::kernels
