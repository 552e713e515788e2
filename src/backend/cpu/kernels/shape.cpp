// Data movement: permute, expand and reshape. Each is a strided gather into a contiguous
// output; the copy dispatches on element size, not dtype.
#include <cstring>

#include "backend/cpu/kernels/loops.h"
#include "backend/cpu/kernels/ops.h"

namespace lazyrt::kernels {
namespace {

template <class W>
KernelFn gather_fn(std::shared_ptr<const StridedLayout> layout) {
  return [layout](const void* const* in, void* const* out) {
    const W* src = static_cast<const W*>(in[0]);
    W* dst = static_cast<W*>(out[0]);
    layout->for_each_run([&](int64_t off, int64_t n, int64_t stride) {
      if (stride == 1) {
        std::memcpy(dst, src + off, static_cast<size_t>(n) * sizeof(W));
      } else {
        for (int64_t i = 0; i < n; ++i) dst[i] = src[off + i * stride];
      }
      dst += n;
    });
  };
}

/// out[i] = in[offset of i under `strides`], out contiguous of `shape`.
Kernel gather(const Shape& shape, const std::vector<int64_t>& strides, DType dtype) {
  auto layout = std::make_shared<const StridedLayout>(shape, strides);
  switch (dtype_size(dtype)) {
    case 1: return {gather_fn<uint8_t>(layout)};
    case 2: return {gather_fn<uint16_t>(layout)};
    case 4: return {gather_fn<uint32_t>(layout)};
    case 8: return {gather_fn<uint64_t>(layout)};
  }
  LAZYRT_ASSERT(false, "bad element size");
  return {};
}

}  // namespace

Kernel make_Permute(const KernelSpec& s) {
  const auto& perm = ir::NodeAttrs(s.op, s.attrs).ints<"dims">();
  std::vector<int64_t> in_strides = contiguous_strides(s.inputs[0].shape);
  std::vector<int64_t> strides(perm.size());
  for (size_t d = 0; d < perm.size(); ++d) strides[d] = in_strides[perm[d]];
  return gather(s.outputs[0].shape, strides, s.outputs[0].dtype);
}

Kernel make_Expand(const KernelSpec& s) {
  const Shape& in = s.inputs[0].shape;
  const Shape& out = s.outputs[0].shape;
  std::vector<int64_t> in_strides = contiguous_strides(in);
  std::vector<int64_t> strides(out.size(), 0);
  for (size_t j = 0; j < in.size(); ++j)
    strides[out.size() - in.size() + j] = in[j] == 1 ? 0 : in_strides[j];
  return gather(out, strides, s.outputs[0].dtype);
}

Kernel make_Reshape(const KernelSpec& s) {
  const size_t bytes = s.outputs[0].bytes();
  return {[bytes](const void* const* in, void* const* out) {
    if (in[0] != out[0]) std::memcpy(out[0], in[0], bytes);
  }};
}

Kernel make_StopGradient(const KernelSpec& s) { return make_Reshape(s); }

}  // namespace lazyrt::kernels
