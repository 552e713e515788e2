// Reductions beyond sum and extremes: product, variance, vector norms, and the index of the
// extreme. Accumulation is in double for floats (int64 for integer products), so f32 results
// are the correctly rounded value of a far more precise sum; variance takes two passes (mean
// first, then squared deviations), which stays accurate when the mean is large against the
// spread.
#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <type_traits>

#include "backend/cpu/kernels/loops.h"
#include "backend/cpu/kernels/ops.h"
#include "backend/cpu/kernels/parallel.h"
#include "backend/cpu/kernels/sums.h"

namespace lazyrt::kernels {
namespace {

template <class T>
using acc_t = std::conditional_t<std::is_floating_point_v<compute_t<T>>, double,
                                 std::conditional_t<std::is_same_v<T, bool>, bool, int64_t>>;

// Calls fn(x, base) for each output element in order, `base` pointing at its first input
// element; the layout's inner part walks the reduced elements from there.
template <class T, class Fn>
void for_each_output(const ReduceLayout& layout, const T* x, Fn&& fn) {
  layout.outer.for_each_run([&](int64_t off, int64_t n, int64_t stride) {
    // An empty input may have no buffer: the pointer is only offset when there is one.
    for (int64_t j = 0; j < n; ++j) fn(x ? x + off + j * stride : x);
  });
}

template <class T, class Fn>
void for_each_reduced(const ReduceLayout& layout, const T* base, Fn&& fn) {
  layout.inner.for_each_run([&](int64_t off, int64_t n, int64_t stride) {
    for (int64_t i = 0; i < n; ++i) fn(base[off + i * stride]);
  });
}

}  // namespace

Kernel make_Prod(const KernelSpec& s) {
  const ir::NodeAttrs a(s.op, s.attrs);
  auto layout = std::make_shared<const ReduceLayout>(s.inputs[0].shape, a.ints<"dims">());
  return visit_dtype(s.inputs[0].dtype, [&](auto tag) -> Kernel {
    using T = decltype(tag);
    using C = compute_t<T>;
    using Acc = acc_t<T>;
    return {[layout](const void* const* in, void* const* out) {
      T* o = static_cast<T*>(out[0]);
      for_each_output(*layout, static_cast<const T*>(in[0]), [&](const T* base) {
        Acc acc = Acc(1);
        for_each_reduced(*layout, base, [&](T v) {
          if constexpr (std::is_same_v<Acc, bool>) {
            acc = acc && convert<bool>(v);
          } else if constexpr (std::is_same_v<Acc, int64_t>) {
            // Wraps on overflow (as torch does), without the undefined signed overflow.
            acc = static_cast<int64_t>(static_cast<uint64_t>(acc) * static_cast<uint64_t>(convert<C>(v)));
          } else {
            acc *= static_cast<Acc>(convert<C>(v));
          }
        });
        *o++ = convert<T>(static_cast<C>(acc));
      });
    }};
  });
}

namespace {

// Outputs split across threads; the passes over a contiguous run of the reduced elements add
// sixteen interleaved partial sums (sums.h), other runs one element after another.
template <bool kSqrt>
Kernel variance(const KernelSpec& s) {
  const ir::NodeAttrs a(s.op, s.attrs);
  auto layout = std::make_shared<const ReduceLayout>(s.inputs[0].shape, a.ints<"dims">());
  const double correction = a.f<"correction">();
  return visit_dtype(s.inputs[0].dtype, [&](auto tag) -> Kernel {
    using T = decltype(tag);
    using C = compute_t<T>;
    if constexpr (!std::is_floating_point_v<C>) {
      LAZYRT_ASSERT(false, "kernel ", ir::op_name(s.op), " made for ", dtype_name(s.inputs[0].dtype));
      return {};
    } else {
      return {[layout, correction](const void* const* in, void* const* out) {
        const T* x = static_cast<const T*>(in[0]);
        T* o = static_cast<T*>(out[0]);
        const int64_t count = layout->count;
        const double divisor = std::max(static_cast<double>(count) - correction, 0.0);
        parallel_for(layout->outer.numel, std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(count, 1)),
                     [&](int64_t b, int64_t e) {
          for (int64_t j = b; j < e; ++j) {
            // An empty input (count 0) may have no buffer: no offset is taken from it.
            const T* base = count > 0 ? x + layout->outer.offset_of(j) : x;
            double sum = 0;
            layout->inner.for_each_run([&](int64_t off, int64_t n, int64_t stride) {
              if (stride == 1) {
                sum += sums::run_sum<C>(base + off, n);
              } else {
                for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(convert<C>(base[off + i * stride]));
              }
            });
            const double mean = sum / static_cast<double>(count);  // nan for an empty slice, and so is the variance
            double squares = 0;
            layout->inner.for_each_run([&](int64_t off, int64_t n, int64_t stride) {
              if (stride == 1) {
                squares += sums::run_squared_deviations<C>(base + off, n, mean);
              } else {
                for (int64_t i = 0; i < n; ++i) {
                  const double d = static_cast<double>(convert<C>(base[off + i * stride])) - mean;
                  squares += d * d;
                }
              }
            });
            const double v = squares / divisor;
            o[j] = convert<T>(kSqrt ? std::sqrt(v) : v);
          }
        });
      }};
    }
  });
}

}  // namespace

Kernel make_Var(const KernelSpec& s) { return variance<false>(s); }
Kernel make_Std(const KernelSpec& s) { return variance<true>(s); }

// p = 1: sum |x|; p = 2: sqrt(sum x^2); p = inf: max |x| (nan if any is nan, 0 when empty).
Kernel make_Norm(const KernelSpec& s) {
  const ir::NodeAttrs a(s.op, s.attrs);
  auto layout = std::make_shared<const ReduceLayout>(s.inputs[0].shape, a.ints<"dims">());
  const double p = a.f<"p">();
  LAZYRT_ASSERT(p == 1 || p == 2 || std::isinf(p), "norm kernel made for p = ", p);
  return visit_dtype(s.inputs[0].dtype, [&](auto tag) -> Kernel {
    using T = decltype(tag);
    if constexpr (!std::is_floating_point_v<compute_t<T>>) {
      LAZYRT_ASSERT(false, "kernel norm made for ", dtype_name(s.inputs[0].dtype));
      return {};
    } else {
      const int kind = p == 1 ? 1 : p == 2 ? 2 : 0;
      return {[layout, kind](const void* const* in, void* const* out) {
        T* o = static_cast<T*>(out[0]);
        for_each_output(*layout, static_cast<const T*>(in[0]), [&](const T* base) {
          double acc = 0;
          for_each_reduced(*layout, base, [&](T v) {
            const double a = std::fabs(convert<double>(v));
            if (kind == 1) acc += a;
            else if (kind == 2) acc += a * a;
            else if (acc == acc && (a != a || a > acc)) acc = a;
          });
          *o++ = convert<T>(kind == 2 ? std::sqrt(acc) : acc);
        });
      }};
    }
  });
}

namespace {

// The first index of the largest (kMax) or smallest element along the dim; the first nan
// wins over every number, as in torch.
template <bool kMax>
Kernel arg_extreme(const KernelSpec& s) {
  const int64_t dim = ir::NodeAttrs(s.op, s.attrs).i<"dim">();
  auto layout = std::make_shared<const ReduceLayout>(s.inputs[0].shape, std::vector<int64_t>{dim});
  return visit_dtype(s.inputs[0].dtype, [&](auto tag) -> Kernel {
    using T = decltype(tag);
    using C = compute_t<T>;
    return {[layout](const void* const* in, void* const* out) {
      int64_t* o = static_cast<int64_t*>(out[0]);
      for_each_output(*layout, static_cast<const T*>(in[0]), [&](const T* base) {
        int64_t index = 0, best_index = 0;
        C best{};
        bool best_nan = false;
        for_each_reduced(*layout, base, [&](T raw) {
          const C v = convert<C>(raw);
          if (!best_nan) {
            if (v != v) {
              best_nan = true;
              best_index = index;
            } else if (index == 0 || (kMax ? v > best : v < best)) {
              best = v;
              best_index = index;
            }
          }
          ++index;
        });
        *o++ = best_index;
      });
    }};
  });
}

}  // namespace

Kernel make_ArgMax(const KernelSpec& s) { return arg_extreme<true>(s); }
Kernel make_ArgMin(const KernelSpec& s) { return arg_extreme<false>(s); }

}  // namespace lazyrt::kernels
