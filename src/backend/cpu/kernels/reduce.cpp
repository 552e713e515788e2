// Reductions over any set of dims. Each output element accumulates over the reduced
// sub-space in a wide accumulator (double for floats, int64 for integers).
#include <cmath>

#include "backend/cpu/kernels/elementwise_fns.h"
#include "backend/cpu/kernels/loops.h"
#include "backend/cpu/kernels/ops.h"

namespace lazyrt::kernels {
namespace {

enum class Kind { Sum, Mean, Max, Min };

template <Kind K>
Kernel reduce(const KernelSpec& s) {
  // sum, mean, amax, amin: each has `dims`.
  const ir::NodeAttrs a(s.op, s.attrs);
  auto layout = std::make_shared<const ReduceLayout>(s.inputs[0].shape, a.ints<"dims">());
  return visit_dtype(s.inputs[0].dtype, [&](auto tag) -> Kernel {
    using T = decltype(tag);
    using C = compute_t<T>;
    using Acc = std::conditional_t<std::is_floating_point_v<C>, double,
                                   std::conditional_t<std::is_same_v<T, bool>, bool, int64_t>>;
    return {[layout](const void* const* in, void* const* out) {
      const T* x = static_cast<const T*>(in[0]);
      T* o = static_cast<T*>(out[0]);
      const int64_t count = layout->count;
      parallel_for(layout->outer.numel, std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(count, 1)),
                   [&](int64_t b, int64_t e) {
        for (int64_t j = b; j < e; ++j) {
          // An empty input (count 0) may have no buffer: no offset is taken from it.
          const T* base = count > 0 ? x + layout->outer.offset_of(j) : x;
          Acc acc{};
          bool first = true;
          layout->inner.for_each_run([&](int64_t ioff, int64_t in_n, int64_t istride) {
            for (int64_t i = 0; i < in_n; ++i) {
              Acc v = static_cast<Acc>(convert<C>(base[ioff + i * istride]));
              if constexpr ((K == Kind::Sum || K == Kind::Mean) && is_signed_int_c<Acc>) {
                acc = wrap_add(acc, v);  // wraps on overflow, as torch does
              } else if constexpr (K == Kind::Sum || K == Kind::Mean) {
                acc += v;
              } else {
                if (first || v != v) {
                  acc = v;
                  first = false;
                } else if (acc == acc && (K == Kind::Max ? v > acc : v < acc)) {
                  acc = v;
                }
              }
            }
          });
          if constexpr (K == Kind::Mean) acc = acc / static_cast<Acc>(count);
          o[j] = convert<T>(static_cast<C>(acc));
        }
      });
    }};
  });
}

}  // namespace

Kernel make_Sum(const KernelSpec& s) { return reduce<Kind::Sum>(s); }
Kernel make_Mean(const KernelSpec& s) { return reduce<Kind::Mean>(s); }
Kernel make_Amax(const KernelSpec& s) { return reduce<Kind::Max>(s); }
Kernel make_Amin(const KernelSpec& s) { return reduce<Kind::Min>(s); }

}  // namespace lazyrt::kernels
