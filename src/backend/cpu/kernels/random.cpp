// Random draws: element i of a draw is a pure function of (seed, offset + i) through Philox,
// so any element can be computed independently, in any order or thread.
#include <cmath>

#include "backend/cpu/kernels/loops.h"
#include "backend/cpu/kernels/ops.h"
#include "backend/cpu/kernels/philox.h"

namespace lazyrt::kernels {
namespace {

// Uniform in [0, 1) on a grid as fine as the type's mantissa (so rounding can never give 1).
inline double uniform53(uint32_t a, uint32_t b) {
  const uint64_t bits = (static_cast<uint64_t>(a) << 21) ^ (b >> 11);
  return static_cast<double>(bits & ((uint64_t{1} << 53) - 1)) * 0x1.0p-53;
}
inline double uniform_bits(uint32_t a, int bits) {
  return std::ldexp(static_cast<double>(a >> (32 - bits)), -bits);
}

template <class T>
constexpr int mantissa_bits() {
  if constexpr (std::is_same_v<T, double>) return 53;
  else if constexpr (std::is_same_v<T, float>) return 24;
  else if constexpr (std::is_same_v<T, f16>) return 11;
  else return 8;  // bf16
}

template <class T>
void draw(T* out, int64_t n, uint64_t seed, uint64_t offset, int64_t distribution) {
  constexpr int bits = mantissa_bits<T>();
  for (int64_t i = 0; i < n; ++i) {
    const PhiloxWords w = philox(offset + static_cast<uint64_t>(i), seed);
    double v;
    if (distribution == 0) {
      v = bits == 53 ? uniform53(w[0], w[1]) : uniform_bits(w[0], bits);
    } else {
      // Box-Muller on two uniforms, the first moved to (0, 1] so its log is finite.
      const double u1 = 1.0 - uniform53(w[0], w[1]);
      const double u2 = uniform53(w[2], w[3]);
      v = std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
    }
    out[i] = convert<T>(v);
  }
}

}  // namespace

Kernel make_Random(const KernelSpec& s) {
  const int64_t distribution = ir::NodeAttrs(s.op, s.attrs).i<"distribution">();
  const int64_t n = s.outputs[0].numel();
  return visit_dtype(s.outputs[0].dtype, [&](auto tag) -> Kernel {
    using T = decltype(tag);
    if constexpr (!std::is_floating_point_v<compute_t<T>>) {
      LAZYRT_ASSERT(false, "random kernel made for a non-floating dtype");
      return {};
    } else {
      return {[=](const void* const* in, void* const* out) {
        const auto seed = static_cast<uint64_t>(*static_cast<const int64_t*>(in[0]));
        const auto offset = static_cast<uint64_t>(*static_cast<const int64_t*>(in[1]));
        T* o = static_cast<T*>(out[0]);
        parallel_for(n, kParallelGrain / 8, [&](int64_t b, int64_t e) {
          draw(o + b, e - b, seed, offset + static_cast<uint64_t>(b), distribution);
        });
      }};
    }
  });
}

}  // namespace lazyrt::kernels
