// Data movement between differently strided layouts: slice (a strided window of the input),
// flip (negative strides), pad (the input written strided into a filled output) and concat
// (blocks of rows). All copies dispatch on element size, not dtype; only pad's fill value
// needs the dtype.
#include <algorithm>
#include <cstring>

#include "backend/cpu/kernels/copy.h"
#include "backend/cpu/kernels/loops.h"
#include "backend/cpu/kernels/ops.h"

namespace lazyrt::kernels {

Kernel make_Slice(const KernelSpec& s) {
  const ir::NodeAttrs a(s.op, s.attrs);
  const auto& starts = a.ints<"starts">();
  const auto& steps = a.ints<"steps">();
  const Shape& out = s.outputs[0].shape;
  std::vector<int64_t> in_st = contiguous_strides(s.inputs[0].shape);
  std::vector<int64_t> src(out.size());
  int64_t base = 0;
  // Wrapping stride arithmetic: a huge step past a dim's one element (size 1) passes 64 bits
  // but is never applied; every offset the copy reads fits.
  for (size_t d = 0; d < out.size(); ++d) {
    src[d] = lazyrt::detail::stride_mul_add(in_st[d], steps[d]);
    base = lazyrt::detail::stride_mul_add(starts[d], in_st[d], base);
  }
  auto layout = std::make_shared<CopyLayout>(out, src, contiguous_strides(out));
  layout->src_base = base;
  return copy_kernel(std::move(layout), s.outputs[0].dtype);
}

Kernel make_Flip(const KernelSpec& s) {
  const Shape& shape = s.outputs[0].shape;
  std::vector<int64_t> st = contiguous_strides(shape);
  std::vector<int64_t> src = st;
  int64_t base = 0;
  for (int64_t d : ir::NodeAttrs(s.op, s.attrs).ints<"dims">()) {
    src[d] = -st[d];
    if (shape[d] > 0) base += (shape[d] - 1) * st[d];
  }
  auto layout = std::make_shared<CopyLayout>(shape, src, st);
  layout->src_base = base;
  return copy_kernel(std::move(layout), s.outputs[0].dtype);
}

// Output element j of a dim comes from input element i when j = low + i * (interior + 1);
// every other output element is `value`. Negative low/high crop.
Kernel make_Pad(const KernelSpec& s) {
  const ir::NodeAttrs a(s.op, s.attrs);
  const auto& low = a.ints<"low">();
  const auto& interior = a.ints<"interior">();
  const double value = a.f<"value">();
  const Shape& in = s.inputs[0].shape;
  const Shape& out = s.outputs[0].shape;
  const DType dtype = s.outputs[0].dtype;
  std::vector<int64_t> in_st = contiguous_strides(in), out_st = contiguous_strides(out);
  Shape count(in.size());
  std::vector<int64_t> dst(in.size());
  int64_t src_base = 0, dst_base = 0;
  for (size_t d = 0; d < in.size(); ++d) {
    const int64_t step = interior[d] + 1;
    // The first and last input elements that land inside the output.
    // ceil(-low / step), in unsigned arithmetic (-low of INT64_MIN, -low + step - 1 overflow).
    const uint64_t cut = low[d] >= 0 ? 0 : uint64_t{0} - static_cast<uint64_t>(low[d]);
    const auto ustep = static_cast<uint64_t>(step);
    const auto first = static_cast<int64_t>(std::min<uint64_t>(cut / ustep + (cut % ustep != 0), INT64_MAX));
    const int64_t room = out[d] - 1 - low[d];
    const int64_t last = room < 0 ? -1 : std::min(in[d] - 1, room / step);
    count[d] = std::max<int64_t>(last - first + 1, 0);
    // Wrapping, as in slice: a huge interior step between a dim's one element and nothing.
    dst[d] = lazyrt::detail::stride_mul_add(out_st[d], step);
    src_base = lazyrt::detail::stride_mul_add(first, in_st[d], src_base);
    dst_base = lazyrt::detail::stride_mul_add(lazyrt::detail::stride_mul_add(first, step, low[d]), out_st[d], dst_base);
  }
  auto layout = std::make_shared<CopyLayout>(count, in_st, dst);
  layout->src_base = src_base;
  layout->dst_base = dst_base;
  const int64_t n_out = s.outputs[0].numel();
  const bool needs_fill = shape_numel(count) != n_out;
  return visit_width(dtype_size(dtype), [&](auto tag) -> Kernel {
    using W = decltype(tag);
    return {[layout, needs_fill, dtype, value, n_out](const void* const* in, void* const* out) {
      if (needs_fill) fill_elements(out[0], dtype, value, n_out);
      layout->run(static_cast<const W*>(in[0]), static_cast<W*>(out[0]));
    }};
  });
}

Kernel make_Concat(const KernelSpec& s) {
  const int64_t dim = ir::NodeAttrs(s.op, s.attrs).i<"dim">();
  const Shape& out = s.outputs[0].shape;
  const size_t esize = dtype_size(s.outputs[0].dtype);
  int64_t outer = 1;
  for (int64_t d = 0; d < dim; ++d) outer *= out[d];
  // Bytes per outer row of each input.
  std::vector<size_t> row;
  for (const auto& t : s.inputs) {
    int64_t n = 1;
    for (size_t d = static_cast<size_t>(dim); d < t.shape.size(); ++d) n *= t.shape[d];
    row.push_back(static_cast<size_t>(n) * esize);
  }
  size_t total = 0;  // bytes of one outer row of the output
  for (size_t r : row) total += r;
  // Split across threads by outer rows, or, with one outer row (a concat along dim 0), each
  // input's copy by chunks of kCopyChunk bytes.
  constexpr int64_t kCopyChunk = kParallelGrain * 4;
  return {[outer, row, total](const void* const* in, void* const* out) {
    char* const dst = static_cast<char*>(out[0]);
    if (outer > 1) {
      parallel_for(outer, std::max<int64_t>(1, kCopyChunk / static_cast<int64_t>(std::max<size_t>(total, 1))),
                   [&](int64_t b, int64_t e) {
        char* d = dst + static_cast<size_t>(b) * total;
        for (int64_t o = b; o < e; ++o)
          for (size_t k = 0; k < row.size(); ++k) {
            if (!row[k]) continue;
            std::memcpy(d, static_cast<const char*>(in[k]) + static_cast<size_t>(o) * row[k], row[k]);
            d += row[k];
          }
      });
      return;
    }
    if (outer == 0) return;
    size_t at = 0;
    for (size_t k = 0; k < row.size(); ++k) {
      const char* src = static_cast<const char*>(in[k]);
      const auto bytes = static_cast<int64_t>(row[k]);
      parallel_for((bytes + kCopyChunk - 1) / kCopyChunk, 1, [&](int64_t b, int64_t e) {
        const int64_t first = b * kCopyChunk, last = std::min(bytes, e * kCopyChunk);
        std::memcpy(dst + at + first, src + first, static_cast<size_t>(last - first));
      });
      at += row[k];
    }
  }};
}

}  // namespace lazyrt::kernels
