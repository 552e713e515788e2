// Reductions over any set of dims. Each output element accumulates over the reduced
// sub-space in a wide accumulator (double for floats, int64 for integers), in the order of the
// input's elements. When kept dims follow the last reduced one (a sum over rows, a bias
// gradient), a chunk of up to kColumns neighbouring outputs accumulates together, row after
// row of the input: the same sums in the same order, read along memory instead of down its
// columns, in a loop that vectorizes (cloned per ISA for floating types, vmath.h); a floating
// sum adds four rows to each sum per load and store of it. A floating
// sum over a contiguous run adds sixteen interleaved partial sums; a floating extreme over one
// keeps sixteen running extremes and gives what folding element by element gives (sums.h).
#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "scalar/elementwise_fns.h"
#include "backend/cpu/kernels/loops.h"
#include "backend/cpu/kernels/ops.h"
#include "backend/cpu/kernels/sums.h"

namespace lazyrt::kernels {

using namespace lazyrt::scalar;  // the ops' scalar functions (scalar/elementwise_fns.h, vmath.h)
namespace {

enum class Kind { Sum, Mean, Max, Min };

constexpr int64_t kColumns = 256;

// acc[k] folded with x[k], k < n; `first`: x holds the first reduced elements (the extremes
// take them as they are; sums start from the zeros they were given).
template <Kind K, class C, class Acc, class T>
inline void fold_body(Acc* acc, const T* x, int64_t n, bool first) {
  for (int64_t k = 0; k < n; ++k) {
    const Acc v = static_cast<Acc>(convert<C>(x[k]));
    if constexpr ((K == Kind::Sum || K == Kind::Mean) && is_signed_int_c<Acc>) {
      acc[k] = wrap_add(acc[k], v);  // wraps on overflow, as torch does
    } else if constexpr (K == Kind::Sum || K == Kind::Mean) {
      acc[k] += v;
    } else {
      acc[k] = sums::fold_extreme<K == Kind::Max>(acc[k], v, first);
    }
  }
}
template <Kind K, class C, class Acc, class T>
LAZYRT_ISA_CLONES void fold_clones(Acc* acc, const T* x, int64_t n, bool first) {
  fold_body<K, C>(acc, x, n, first);
}
template <Kind K, class C, class Acc, class T>
void fold(Acc* acc, const T* x, int64_t n, bool first) {
  if constexpr (std::is_floating_point_v<C>) fold_clones<K, C>(acc, x, n, first);
  else fold_body<K, C>(acc, x, n, first);
}

// The runs of a layout's reduced elements (offset, count, stride), in their order.
struct Runs {
  std::vector<int64_t> off, n, stride;
};

constexpr int kRowsAtOnce = 4;

// Floating sums of n <= kColumns neighbouring outputs, each over the rows the runs give (row i
// of a run at base + off + i * stride): acc[k] += x[row][k], row after row, as fold does, but
// kRowsAtOnce rows at a time, so that each sum is loaded and stored once per group of rows
// instead of once per row, and the rows are read along memory side by side. The same
// additions in the same order: the same bits.
template <class C, class T>
inline void sum_columns_body(double* acc, const T* base, int64_t n, const Runs& runs) {
  const T* rows[kRowsAtOnce];
  int held = 0;
  auto flush = [&] {
    if (held == kRowsAtOnce) {
      for (int64_t k = 0; k < n; ++k) {
        double a = acc[k];
        for (int r = 0; r < kRowsAtOnce; ++r) a += static_cast<double>(convert<C>(rows[r][k]));
        acc[k] = a;
      }
    } else {
      for (int r = 0; r < held; ++r)
        for (int64_t k = 0; k < n; ++k) acc[k] += static_cast<double>(convert<C>(rows[r][k]));
    }
    held = 0;
  };
  for (size_t r = 0; r < runs.off.size(); ++r) {
    const T* p = base + runs.off[r];
    for (int64_t i = 0; i < runs.n[r]; ++i, p += runs.stride[r]) {
      rows[held++] = p;
      if (held == kRowsAtOnce) flush();
    }
  }
  flush();
}
template <class C, class T>
LAZYRT_ISA_CLONES void sum_columns(double* acc, const T* base, int64_t n, const Runs& runs) {
  sum_columns_body<C>(acc, base, n, runs);
}

template <Kind K>
Kernel reduce(const KernelSpec& s) {
  // sum, mean, amax, amin: each has `dims`.
  const ir::NodeAttrs a(s.op, s.attrs);
  auto layout = std::make_shared<const ReduceLayout>(s.inputs[0].shape, a.ints<"dims">());
  auto runs = std::make_shared<Runs>();
  if (layout->trailing > 1)
    layout->inner.for_each_run([&](int64_t off, int64_t n, int64_t stride) {
      runs->off.push_back(off);
      runs->n.push_back(n);
      runs->stride.push_back(stride);
    });
  return visit_dtype(s.inputs[0].dtype, [&](auto tag) -> Kernel {
    using T = decltype(tag);
    using C = compute_t<T>;
    using Acc = std::conditional_t<std::is_floating_point_v<C>, double,
                                   std::conditional_t<std::is_same_v<T, bool>, bool, int64_t>>;
    return {[layout, runs](const void* const* in, void* const* out) {
      const T* x = static_cast<const T*>(in[0]);
      T* o = static_cast<T*>(out[0]);
      const int64_t count = layout->count;
      const int64_t block = layout->trailing;
      if (block > 1 && count > 0) {
        // Chunks of up to kColumns outputs of one trailing block, each over all reduced rows.
        const int64_t chunks = (block + kColumns - 1) / kColumns;
        parallel_for(layout->lead.numel * chunks,
                     std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(count * kColumns, 1)),
                     [&](int64_t b, int64_t e) {
          Acc acc[kColumns];
          for (int64_t w = b; w < e; ++w) {
            const int64_t lead = w / chunks, k0 = (w % chunks) * kColumns;
            const int64_t n = std::min(kColumns, block - k0);
            const T* base = x + layout->lead.offset_of(lead) + k0;
            std::fill_n(acc, n, Acc{});
            if constexpr ((K == Kind::Sum || K == Kind::Mean) && std::is_floating_point_v<C>) {
              sum_columns<C>(acc, base, n, *runs);
            } else {
              bool first = true;
              layout->inner.for_each_run([&](int64_t ioff, int64_t in_n, int64_t istride) {
                for (int64_t i = 0; i < in_n; ++i, first = false) fold<K, C>(acc, base + ioff + i * istride, n, first);
              });
            }
            T* dst = o + lead * block + k0;
            for (int64_t k = 0; k < n; ++k) {
              Acc r = acc[k];
              if constexpr (K == Kind::Mean) r = r / static_cast<Acc>(count);
              dst[k] = convert<T>(static_cast<C>(r));
            }
          }
        });
        return;
      }
      parallel_for(layout->outer.numel, std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(count, 1)),
                   [&](int64_t b, int64_t e) {
        for (int64_t j = b; j < e; ++j) {
          // An empty input (count 0) may have no buffer: no offset is taken from it.
          const T* base = count > 0 ? x + layout->outer.offset_of(j) : x;
          Acc acc{};
          bool first = true;
          layout->inner.for_each_run([&](int64_t ioff, int64_t in_n, int64_t istride) {
            if constexpr ((K == Kind::Sum || K == Kind::Mean) && std::is_floating_point_v<C>) {
              if (istride == 1) {
                acc += sums::run_sum<C>(base + ioff, in_n);
                return;
              }
            } else if constexpr (std::is_floating_point_v<C>) {
              if (istride == 1) {
                acc = sums::fold_extreme<K == Kind::Max>(acc, sums::run_extreme<K == Kind::Max, C>(base + ioff, in_n), first);
                first = false;
                return;
              }
            }
            for (int64_t i = 0; i < in_n; ++i, first = false) fold_body<K, C>(&acc, base + ioff + i * istride, 1, first);
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
