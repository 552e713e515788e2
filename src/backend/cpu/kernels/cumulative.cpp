// Ops along one dim that look at a whole line: cumulative sums and products (and the product's
// gradient), and sorting. The tensor is seen as [outer, n, inner]; each of the outer * inner
// lines of n elements (stride inner) is handled on its own.
//
// Cumulative ops accumulate in double for floating types and in int64 for integers, rounding
// each partial result once to the result dtype, as PyTorch's CPU kernels do.
//
// argsort orders a line by value with the index as tie-break, which is what a stable sort
// gives; nan sorts above every number (last ascending, first descending), as in PyTorch. Only
// the first k positions are written (k < n: a partial sort).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <numeric>
#include <type_traits>

#include "backend/cpu/kernels/loops.h"
#include "backend/cpu/kernels/ops.h"

namespace lazyrt::kernels {
namespace {

// Lines per parallel chunk: enough elements to be worth a thread.
int64_t grain_of(const Lines& lines) { return std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(lines.n, 1)); }

template <class T>
using acc_t = std::conditional_t<std::is_floating_point_v<compute_t<T>>, double, int64_t>;

template <class T>
constexpr bool kNumeric = !std::is_same_v<T, bool>;

// Running sum (kProd: product) along each line, from the last element back with `reverse`.
template <bool kProd>
Kernel cumulative(const KernelSpec& s) {
  const ir::NodeAttrs a(s.op, s.attrs);
  const Lines lines(s.inputs[0].shape, a.i<"dim">());
  const bool reverse = !kProd && a.b<"reverse">();
  return visit_dtype(s.inputs[0].dtype, [&](auto tag) -> Kernel {
    using T = decltype(tag);
    if constexpr (!kNumeric<T>) {
      LAZYRT_ASSERT(false, "kernel ", ir::op_name(s.op), " made for b8");
      return {};
    } else {
      using C = compute_t<T>;
      using Acc = acc_t<T>;
      return {[lines, reverse](const void* const* in, void* const* out) {
        const T* x = static_cast<const T*>(in[0]);
        T* y = static_cast<T*>(out[0]);
        parallel_for(lines.count(), grain_of(lines), [&](int64_t begin, int64_t end) {
          const int64_t n = lines.n, st = lines.inner;
          for (int64_t l = begin; l < end; ++l) {
            const int64_t b = lines.base(l);
            Acc acc = kProd ? Acc(1) : Acc(0);
            for (int64_t k = 0; k < n; ++k) {
              const int64_t j = b + (reverse ? n - 1 - k : k) * st;
              const Acc v = static_cast<Acc>(convert<C>(x[j]));
              if constexpr (kProd && std::is_same_v<Acc, int64_t>) {
                // Wraps on overflow, as torch does, without signed overflow.
                acc = static_cast<int64_t>(static_cast<uint64_t>(acc) * static_cast<uint64_t>(v));
              } else if constexpr (std::is_same_v<Acc, int64_t>) {
                acc = static_cast<int64_t>(static_cast<uint64_t>(acc) + static_cast<uint64_t>(v));
              } else if constexpr (kProd) {
                acc *= v;
              } else {
                acc += v;
              }
              y[j] = convert<T>(static_cast<C>(acc));
            }
          }
        });
      }};
    }
  });
}

}  // namespace

Kernel make_Cumsum(const KernelSpec& s) { return cumulative<false>(s); }
Kernel make_Cumprod(const KernelSpec& s) { return cumulative<true>(s); }

// dL/dx of y = cumprod(x) along a line, given g = dL/dy, with no division (exact where x has
// zeros): dx_i = E_i * S_i, where E_i = x_0 ... x_{i-1} (the exclusive prefix product) and
// S_i = sum over j >= i of g_j * x_{i+1} ... x_j, which satisfies S_i = g_i + x_{i+1} S_{i+1}.
// The line is walked back for S (kept in double in the workspace), then forward for E.
Kernel make_CumprodBackward(const KernelSpec& s) {
  const Lines lines(s.inputs[1].shape, ir::NodeAttrs(s.op, s.attrs).i<"dim">());
  return visit_dtype(s.inputs[1].dtype, [&](auto tag) -> Kernel {
    using T = decltype(tag);
    using C = compute_t<T>;
    if constexpr (!std::is_floating_point_v<C>) {
      LAZYRT_ASSERT(false, "kernel cumprod_backward made for ", dtype_name(s.inputs[1].dtype));
      return {};
    } else {
      return {[lines](const void* const* in, void* const* out) {
        if (lines.n == 0) return;  // empty lines: nothing to do, and no workspace (out[1])
        const T* g = static_cast<const T*>(in[0]);
        const T* x = static_cast<const T*>(in[1]);
        T* dx = static_cast<T*>(out[0]);
        double* suffix = static_cast<double*>(out[1]);
        const int64_t n = lines.n, st = lines.inner;
        for (int64_t l = 0; l < lines.count(); ++l) {
          const int64_t b = lines.base(l);
          double acc = 0;
          for (int64_t i = n - 1; i >= 0; --i) {
            const int64_t j = b + i * st;
            acc = static_cast<double>(convert<C>(g[j])) +
                  (i + 1 < n ? static_cast<double>(convert<C>(x[j + st])) * acc : 0.0);
            suffix[i] = acc;
          }
          double prefix = 1;
          for (int64_t i = 0; i < n; ++i) {
            const int64_t j = b + i * st;
            dx[j] = convert<T>(static_cast<C>(prefix * suffix[i]));
            prefix *= static_cast<double>(convert<C>(x[j]));
          }
        }
      }, static_cast<size_t>(lines.n) * sizeof(double)};
    }
  });
}

Kernel make_Sort(const KernelSpec& s) {
  const ir::NodeAttrs a(s.op, s.attrs);
  const Lines lines(s.inputs[0].shape, a.i<"dim">());
  const bool descending = a.b<"descending">();
  const int64_t k = a.i<"k">();
  return visit_dtype(s.inputs[0].dtype, [&](auto tag) -> Kernel {
    using T = decltype(tag);
    using C = std::conditional_t<std::is_same_v<T, bool>, int, compute_t<T>>;
    // Workspace: the line's index permutation, then its keys (widened).
    const size_t ws = static_cast<size_t>(lines.n) * (sizeof(int64_t) + sizeof(C));
    return {[lines, descending, k](const void* const* in, void* const* out) {
      if (lines.n == 0) return;  // empty lines: nothing to sort, and no workspace (out[1])
      const T* x = static_cast<const T*>(in[0]);
      int64_t* y = static_cast<int64_t*>(out[0]);
      int64_t* idx = static_cast<int64_t*>(out[1]);
      C* keys = reinterpret_cast<C*>(idx + lines.n);
      const int64_t n = lines.n, st = lines.inner;
      // Strict weak orders on positions: by value (nan above every number), then by index.
      auto is_nan = [](C v) { return v != v; };
      auto ascending = [&](int64_t p, int64_t q) {
        const C u = keys[p], v = keys[q];
        if (is_nan(u) || is_nan(v)) return is_nan(u) == is_nan(v) ? p < q : is_nan(v);
        return u < v || (u == v && p < q);
      };
      auto descending_order = [&](int64_t p, int64_t q) {
        const C u = keys[p], v = keys[q];
        if (is_nan(u) || is_nan(v)) return is_nan(u) == is_nan(v) ? p < q : is_nan(u);
        return u > v || (u == v && p < q);
      };
      for (int64_t l = 0; l < lines.count(); ++l) {
        const int64_t b = lines.base(l);
        for (int64_t i = 0; i < n; ++i) keys[i] = static_cast<C>(convert<compute_t<T>>(x[b + i * st]));
        std::iota(idx, idx + n, int64_t{0});
        if (descending) std::partial_sort(idx, idx + k, idx + n, descending_order);
        else std::partial_sort(idx, idx + k, idx + n, ascending);
        const int64_t ob = (l / lines.inner) * k * st + l % lines.inner;
        for (int64_t i = 0; i < k; ++i) y[ob + i * st] = idx[i];
      }
    }, ws};
  });
}

}  // namespace lazyrt::kernels
