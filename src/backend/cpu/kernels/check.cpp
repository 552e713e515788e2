// The check op: operand 0 passed through once every element of the b8 condition is true;
// otherwise lazyrt::Error with the check's message, before anything is written.
#include <algorithm>
#include <cstring>

#include "backend/cpu/kernels/ops.h"
#include "util/check.h"

namespace lazyrt::kernels {

Kernel make_Check(const KernelSpec& s) {
  const std::string_view message = ir::check_message(ir::NodeAttrs(s.op, s.attrs).i<"what">());
  const size_t bytes = s.inputs[0].bytes();
  const auto n = static_cast<size_t>(s.inputs[1].numel());
  return {[message, bytes, n](const void* const* in, void* const* out) {
    const auto* cond = static_cast<const uint8_t*>(in[1]);
    if (std::find(cond, cond + n, uint8_t{0}) != cond + n) throw Error(std::string(message));
    if (in[0] != out[0] && bytes) std::memcpy(out[0], in[0], bytes);
  }};
}

}  // namespace lazyrt::kernels
