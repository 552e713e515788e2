// softmax and log_softmax along one dim. The tensor is seen as [outer, n, inner]; each of the
// outer * inner lines of n elements (stride inner) is normalized on its own, with its maximum
// subtracted first so exp never overflows, as in PyTorch's kernels:
//   softmax:     e = exp(x - max),  out = e * (1 / sum e)
//   log_softmax: out = (x - max) - log(sum exp(x - max))
// Sums are in double, the rest in f32 for the 16-bit types, whose results are rounded once.
// Every pass reads element j before writing element j and nothing else, so the output may be
// the input's buffer (the op is kInPlace).
#include <cmath>
#include <memory>
#include <type_traits>

#include "backend/cpu/kernels/loops.h"
#include "backend/cpu/kernels/ops.h"

namespace lazyrt::kernels {
namespace {

template <bool kLog>
Kernel softmax(const KernelSpec& s) {
  const Lines lines(s.inputs[0].shape, ir::NodeAttrs(s.op, s.attrs).i<"dim">());
  return visit_dtype(s.inputs[0].dtype, [&](auto tag) -> Kernel {
    using T = decltype(tag);
    using C = compute_t<T>;
    if constexpr (!std::is_floating_point_v<C>) {
      LAZYRT_ASSERT(false, "kernel ", ir::op_name(s.op), " made for ", dtype_name(s.inputs[0].dtype));
      return {};
    } else {
      return {[lines](const void* const* in, void* const* out) {
        const T* x = static_cast<const T*>(in[0]);
        T* y = static_cast<T*>(out[0]);
        const int64_t n = lines.n, st = lines.inner;
        for (int64_t o = 0; o < lines.outer; ++o) {
          for (int64_t i = 0; i < lines.inner; ++i) {
            const int64_t base = o * n * st + i;
            const T* xl = x + base;
            T* yl = y + base;
            // The maximum, nan if any element is nan (then the whole line is nan).
            C max = n ? convert<C>(xl[0]) : C(0);
            for (int64_t j = 1; j < n; ++j) {
              const C v = convert<C>(xl[j * st]);
              if (v != v || v > max) max = v;
              if (max != max) break;
            }
            double sum = 0;
            if constexpr (kLog) {
              for (int64_t j = 0; j < n; ++j) sum += std::exp(convert<C>(xl[j * st]) - max);
              const C log_sum = static_cast<C>(std::log(sum));
              for (int64_t j = 0; j < n; ++j) yl[j * st] = convert<T>((convert<C>(xl[j * st]) - max) - log_sum);
            } else if constexpr (std::is_same_v<T, C>) {
              for (int64_t j = 0; j < n; ++j) {
                const C e = std::exp(convert<C>(xl[j * st]) - max);
                sum += e;
                yl[j * st] = e;
              }
              const C scale = static_cast<C>(1.0 / sum);
              for (int64_t j = 0; j < n; ++j) yl[j * st] *= scale;
            } else {
              // 16-bit: e is not stored (it would be rounded) but computed again, so the
              // result is rounded once.
              for (int64_t j = 0; j < n; ++j) sum += std::exp(convert<C>(xl[j * st]) - max);
              const C scale = static_cast<C>(1.0 / sum);
              for (int64_t j = 0; j < n; ++j) yl[j * st] = convert<T>(std::exp(convert<C>(xl[j * st]) - max) * scale);
            }
          }
        }
      }};
    }
  });
}

}  // namespace

Kernel make_Softmax(const KernelSpec& s) { return softmax<false>(s); }
Kernel make_LogSoftmax(const KernelSpec& s) { return softmax<true>(s); }

}  // namespace lazyrt::kernels
