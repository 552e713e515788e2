// Data movement: permute, expand and reshape. Permute and expand are strided copies into a
// contiguous output (copy.h); the copy dispatches on element size, not dtype.
#include <cstring>

#include "backend/cpu/kernels/copy.h"
#include "backend/cpu/kernels/loops.h"
#include "backend/cpu/kernels/ops.h"

namespace lazyrt::kernels {
namespace {

/// out[i] = in[offset of i under `strides`], out contiguous of `shape`.
Kernel gather(const Shape& shape, const std::vector<int64_t>& strides, DType dtype) {
  return copy_kernel(std::make_shared<const CopyLayout>(shape, strides, contiguous_strides(shape)), dtype);
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
