#include <array>

#include "backend/cpu/kernels/ops.h"

namespace lazyrt::kernels {
namespace {

using Maker = Kernel (*)(const KernelSpec&);

constexpr std::array<Maker, ir::kNumOps> kMakers = {
#define OP(Enum, name, operands, rule, flags, attrs, aten, api, grad) &make_##Enum,
#include "lazyrt/ops.def"
#undef OP
};
static_assert(kMakers.size() == ir::kNumOps, "every op in ops.def needs a kernel maker");

}  // namespace

Kernel make_kernel(const KernelSpec& spec) {
  if (spec.library)
    if (auto k = make_onednn_conv(spec)) return *std::move(k);
  return kMakers[static_cast<size_t>(spec.op)](spec);
}

}  // namespace lazyrt::kernels
