// softmax and log_softmax along one dim. The tensor is seen as [outer, n, inner]; each of the
// outer * inner lines of n elements (stride inner) is normalized on its own, with its maximum
// subtracted first so exp never overflows, as in PyTorch's kernels:
//   softmax:     e = exp(x - max),  out = e * (1 / sum e)
//   log_softmax: out = (x - max) - log(sum exp(x - max))
// Sums are in double, the rest in f32 for the 16-bit types, whose results are rounded once.
// Lines are split across threads. Contiguous lines (the last dim) of an f32 compute type run as
// loops that vectorize (exp from vmath.h, cloned per ISA); their maxima and sums run sixteen
// partial ones over interleaved elements, combined in a fixed order. Lines of 16 elements or
// fewer (a classifier's logits) run a group of lines at a time, their exps in one loop: the same
// values, in the same order. Every pass reads element j before writing element j and
// nothing else (exps wait in a buffer on the stack where the input is still needed), so the
// output may be the input's buffer (the op is kInPlace).
#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <type_traits>

#include "backend/cpu/kernels/loops.h"
#include "backend/cpu/kernels/ops.h"
#include "backend/cpu/kernels/parallel.h"
#include "backend/cpu/kernels/sums.h"
#include "scalar/vmath.h"

namespace lazyrt::kernels {

using namespace lazyrt::scalar;  // the ops' scalar functions (scalar/elementwise_fns.h, vmath.h)
namespace {

constexpr int64_t kChunk = 1024;  // exps buffered at a time

// max(m, v) folding a line in order: the first nan once there is one.
inline float max_nan(float m, float v) { return (v > m) | ((v != v) & (m == m)) ? v : m; }

// The maximum of x[0, n) as f32; the first nan if there is one (then the whole line is nan), as
// strided lines find it. Sixteen running maxima of interleaved elements and sixteen flags of a
// nan seen, in a loop that vectorizes (one running maximum with the nan rule does not); the
// line is searched for its first nan only when a flag is up. Which of -0 and +0 is taken when
// they tie makes no difference to the results: x - max and exp of it are the same either way.
template <class T>
LAZYRT_ISA_CLONES float line_max(const T* x, int64_t n) {
  constexpr int kLanes = 16;
  float r = -std::numeric_limits<float>::infinity();
  int64_t j = 0;
  bool nan = false;
  if (n >= kLanes) {
    float part[kLanes];
    int32_t seen[kLanes];
    for (int k = 0; k < kLanes; ++k) {
      const float v = convert<float>(x[k]);
      part[k] = v;
      seen[k] = v != v;
    }
    for (j = kLanes; j + kLanes <= n; j += kLanes)
#pragma GCC unroll 1
      for (int k = 0; k < kLanes; ++k) {
        const float v = convert<float>(x[j + k]);
        seen[k] |= v != v;
        part[k] = v > part[k] ? v : part[k];
      }
    for (int k = 0; k < kLanes; ++k) {
      nan |= seen[k] != 0;
      r = part[k] > r ? part[k] : r;
    }
  }
  for (; j < n; ++j) {
    const float v = convert<float>(x[j]);
    nan |= v != v;
    r = v > r ? v : r;
  }
  if (nan)
    for (int64_t i = 0; i < n; ++i) {
      const float v = convert<float>(x[i]);
      if (v != v) return v;
    }
  return r;
}

template <class T>
LAZYRT_ISA_CLONES void exps_of(const T* x, float max, float* e, int64_t n) {
  for (int64_t j = 0; j < n; ++j) e[j] = vm::exp_f32(convert<float>(x[j]) - max);
}

// e[j] = exp(x[j] - max), j < n; returns their sum in double, from sixteen partial sums of
// interleaved elements (the elements past the last whole sixteen go to the first) added in order
// at the end. The exps are written first and then folded by the reduction kernels' loop, whose
// partial sums stay in registers (folded in the same loop as the exps, they went through the
// stack on every element).
template <class T>
double shifted_exps(const T* x, float max, float* e, int64_t n) {
  exps_of(x, max, e, n);
  double part[sums::kLanes] = {};
  const int64_t whole = n / sums::kLanes * sums::kLanes;
  sums::add_groups<float>(part, e, whole);
  for (int64_t j = whole; j < n; ++j) part[0] += e[j];
  double sum = 0;
  for (int k = 0; k < sums::kLanes; ++k) sum += part[k];
  return sum;
}

template <class T>
LAZYRT_ISA_CLONES void scaled_exps(const T* x, float max, float scale, T* y, int64_t n) {
  for (int64_t j = 0; j < n; ++j) y[j] = convert<T>(vm::exp_f32(convert<float>(x[j]) - max) * scale);
}

LAZYRT_ISA_CLONES void scale_in_place(float* y, float scale, int64_t n) {
  for (int64_t j = 0; j < n; ++j) y[j] *= scale;
}

template <class T>
LAZYRT_ISA_CLONES void shifted_logs(const T* x, float max, float log_sum, T* y, int64_t n) {
  for (int64_t j = 0; j < n; ++j) y[j] = convert<T>((convert<float>(x[j]) - max) - log_sum);
}

// One contiguous line of an f32 compute type.
template <bool kLog, class T>
void contiguous_line(const T* x, T* y, int64_t n) {
  const float max = line_max(x, n);
  float buf[kChunk];
  double sum = 0;
  for (int64_t j = 0; j < n; j += kChunk) {
    const int64_t m = std::min(kChunk, n - j);
    if constexpr (!kLog && std::is_same_v<T, float>) {
      sum += shifted_exps(x + j, max, y + j, m);  // y[j] is exp(x[j] - max) rounded, as it will stay
    } else {
      sum += shifted_exps(x + j, max, buf, m);
    }
  }
  if constexpr (kLog) {
    shifted_logs(x, max, static_cast<float>(std::log(sum)), y, n);
  } else if constexpr (std::is_same_v<T, float>) {
    scale_in_place(y, static_cast<float>(1.0 / sum), n);
  } else {
    // 16-bit: e is not stored (it would be rounded) but computed again, so the result is
    // rounded once.
    scaled_exps(x, max, static_cast<float>(1.0 / sum), y, n);
  }
}

// Short contiguous lines (n <= 16) of an f32 compute type, lines [0, count) of x and y, a group
// at a time: each line's maximum, then the exps of the whole group in one loop that vectorizes,
// then each line's sum, log and results. The same values as contiguous_line, whose maximum of
// so few elements is a fold in order, and whose sixteen partial sums hold one element each at
// most, added in order.
constexpr int64_t kShortLine = 16;
constexpr int64_t kShortGroup = 64;

LAZYRT_ISA_CLONES void exps_in_place(float* d, int64_t m) {
  for (int64_t i = 0; i < m; ++i) d[i] = vm::exp_f32(d[i]);
}

template <bool kLog, class T>
void short_lines(const T* x, T* y, int64_t count, int64_t n) {
  float d[kShortGroup * kShortLine], e[kShortGroup * kShortLine];
  for (int64_t g = 0; g < count; g += kShortGroup) {
    const int64_t lines = std::min(kShortGroup, count - g), m = lines * n;
    const T* xg = x + g * n;
    T* yg = y + g * n;
    for (int64_t l = 0; l < lines; ++l) {
      float max = -std::numeric_limits<float>::infinity();
      for (int64_t j = 0; j < n; ++j) max = max_nan(max, convert<float>(xg[l * n + j]));
      for (int64_t j = 0; j < n; ++j) d[l * n + j] = convert<float>(xg[l * n + j]) - max;
    }
    std::copy_n(d, m, e);
    exps_in_place(e, m);
    for (int64_t l = 0; l < lines; ++l) {
      double sum = 0;
      for (int64_t j = 0; j < n; ++j) sum += e[l * n + j];
      if constexpr (kLog) {
        const auto log_sum = static_cast<float>(std::log(sum));
        for (int64_t j = 0; j < n; ++j) yg[l * n + j] = convert<T>(d[l * n + j] - log_sum);
      } else {
        const auto scale = static_cast<float>(1.0 / sum);
        for (int64_t j = 0; j < n; ++j) yg[l * n + j] = convert<T>(e[l * n + j] * scale);
      }
    }
  }
}

// One line with element stride st, any floating compute type C.
template <bool kLog, class T, class C>
void strided_line(const T* xl, T* yl, int64_t n, int64_t st) {
  auto exp_of = [](C v) {
    if constexpr (std::is_same_v<C, float>) return vm::exp_f32(v);
    else return std::exp(v);
  };
  C max = n ? convert<C>(xl[0]) : C(0);
  for (int64_t j = 1; j < n; ++j) {
    const C v = convert<C>(xl[j * st]);
    if (v != v || v > max) max = v;
    if (max != max) break;
  }
  double sum = 0;
  if constexpr (kLog) {
    for (int64_t j = 0; j < n; ++j) sum += exp_of(convert<C>(xl[j * st]) - max);
    const C log_sum = static_cast<C>(std::log(sum));
    for (int64_t j = 0; j < n; ++j) yl[j * st] = convert<T>((convert<C>(xl[j * st]) - max) - log_sum);
  } else if constexpr (std::is_same_v<T, C>) {
    for (int64_t j = 0; j < n; ++j) {
      const C e = exp_of(convert<C>(xl[j * st]) - max);
      sum += e;
      yl[j * st] = e;
    }
    const C scale = static_cast<C>(1.0 / sum);
    for (int64_t j = 0; j < n; ++j) yl[j * st] *= scale;
  } else {
    for (int64_t j = 0; j < n; ++j) sum += exp_of(convert<C>(xl[j * st]) - max);
    const C scale = static_cast<C>(1.0 / sum);
    for (int64_t j = 0; j < n; ++j) yl[j * st] = convert<T>(exp_of(convert<C>(xl[j * st]) - max) * scale);
  }
}

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
        const int64_t grain = std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(n, 1));
        parallel_for(lines.outer * lines.inner, grain, [&](int64_t b, int64_t e) {
          if constexpr (std::is_same_v<C, float>) {
            if (st == 1 && n > 0 && n <= kShortLine) {  // lines l start at l * n
              short_lines<kLog>(x + b * n, y + b * n, e - b, n);
              return;
            }
          }
          for (int64_t l = b; l < e; ++l) {
            const int64_t base = (l / st) * n * st + l % st;
            if constexpr (std::is_same_v<C, float>) {
              if (st == 1) {
                contiguous_line<kLog>(x + base, y + base, n);
                continue;
              }
            }
            strided_line<kLog, T, C>(x + base, y + base, n, st);
          }
        });
      }};
    }
  });
}

}  // namespace

Kernel make_Softmax(const KernelSpec& s) { return softmax<false>(s); }
Kernel make_LogSoftmax(const KernelSpec& s) { return softmax<true>(s); }

}  // namespace lazyrt::kernels
