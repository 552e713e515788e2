// exp, erf and tanh for f32 (and where's select_bits) written so that a loop over them vectorizes: no branches, no tables,
// no calls (on a CPU with FMA); special values (nan, ±inf, underflow to subnormals and zero,
// overflow) come out of the same arithmetic plus selects. The elementwise table (elementwise_fns.h) and the row kernels
// (softmax.cpp) use them for f32 and the 16-bit dtypes (computed in f32), so an op gives the same
// bits whichever kernel runs it. f64 keeps the C library's functions.
//
// Their polynomials and range reductions are evaluated with fused multiply-adds (fma_f32, one
// rounding each; 25% fewer vector instructions than a multiply and an add, and as accurate or
// more). An FMA's result is defined to the bit, so every CPU still computes the same bits: the
// x86-64-v3 and -v4 clones and generated code use the FMA instructions those CPUs have, the
// baseline clone calls the C library's fmaf (correct, but its loops no longer vectorize: about
// ten times slower on a CPU without FMA, which no x86-64 server made since 2013 is).
//
// Accuracy against the correctly rounded result, measured over every f32 of their domains
// (tests/cpp/kernels/vmath_test.cpp checks these bounds):
// - exp_f32: at most 1 ulp. x = n ln2 + r with |r| <= ln2 / 2 (ln2 in two parts, so r is exact
//   to f32 rounding), exp(r) from a degree-6 polynomial, times 2^n built from the exponent bits
//   in two halves so that results down to the smallest subnormal are reached with one rounding.
// - erf_f32: at most 2 ulp (1 ulp over the f32 range measured; 6% of results 1 ulp off).
//   |x| < 1: x + x (2/sqrt(pi) - 1 + x^2 P(x^2)) with P of degree 5; 1 <= |x| <= 4:
//   1 - exp(-x^2) s Q(s - 0.625) with s = 1/|x| and Q of degree 9, a fit of erfc(x) exp(x^2) x;
//   beyond 4, erf is ±1 in f32. The error of x^2 in f32 scales erfc(x) by at most
//   1 + x^2 2^-24, negligible against erf's ulp. The polynomials are least-squares Chebyshev fits
//   whose coefficients were then rounded to f32 and checked in f32 arithmetic.
// - tanh_f32: at most 2 ulp. |x| < 0.625: x + x^3 P(x^2), P of degree 5; beyond, from exp_f32:
//   1 - 2 / (exp(2|x|) + 1), whose result is at least 0.55 there, so the rounding of each step
//   costs at most an ulp of it.
//
// LAZYRT_ISA_CLONES marks a loop function to be compiled three times, for x86-64-v4 (AVX-512),
// x86-64-v3 (AVX2) and the baseline, the best one the CPU runs being chosen when the library
// loads (GCC's target_clones), with every call inside inlined (flatten: a call left in the
// loop, such as a functor the inliner found too large, would stop it from vectorizing). The
// library is built with -ffp-contract=off, so every clone rounds each operation as the baseline
// does (an fma_f32 being one operation in all of them): the results are the same bits on every
// CPU.
// Kernels clone their loops over floating-point compute types only (the integer loops are
// memory-bound, and their clones would triple the build). Not in sanitized builds or with
// other compilers, where the baseline loop runs.
#pragma once

#include <bit>
#include <cstdint>
#include <type_traits>

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && !defined(LAZYRT_NO_ISA_CLONES)
#define LAZYRT_ISA_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default"), flatten))
#else
#define LAZYRT_ISA_CLONES
#endif
// Inlined into every loop whatever the inliner's budget: a call would stop the loop from
// vectorizing.
#if defined(__GNUC__)
#define LAZYRT_VM_INLINE [[gnu::always_inline]] inline
#else
#define LAZYRT_VM_INLINE inline
#endif

namespace lazyrt::scalar::vm {

/// a * b + c with one rounding (the same bits on every CPU: an FMA instruction where the CPU
/// has one, the C library's fmaf in the baseline clone).
LAZYRT_VM_INLINE float fma_f32(float a, float b, float c) { return __builtin_fmaf(a, b, c); }

/// 2^n for an integer n in [-252, 255], as the product of two normal powers of two.
LAZYRT_VM_INLINE float pow2_halves_f32(int32_t n, float& second) {
  const int32_t a = n >> 1;
  second = std::bit_cast<float>(static_cast<int32_t>((n - a + 127) << 23));
  return std::bit_cast<float>(static_cast<int32_t>((a + 127) << 23));
}

LAZYRT_VM_INLINE float exp_f32(float x) {
  // Beyond these, exp is +inf (88.7228...) or rounds to 0 (below -103.97...); nan passes both
  // selects and propagates through the arithmetic.
  const float xc = x > 89.0f ? 89.0f : (x < -104.0f ? -104.0f : x);
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const float t = fma_f32(xc, kLog2e, kRound);
  const float n = t - kRound;
  // ln2 = 0.693359375 - 2.1219444e-4; n * 0.693359375 is exact.
  const float r = fma_f32(n, 2.12194440e-4f, fma_f32(-n, 0.693359375f, xc));
  float p = 1.9875691500e-4f;
  p = fma_f32(p, r, 1.3981999507e-3f);
  p = fma_f32(p, r, 8.3334519073e-3f);
  p = fma_f32(p, r, 4.1665795894e-2f);
  p = fma_f32(p, r, 1.6666665459e-1f);
  p = fma_f32(p, r, 5.0000001201e-1f);
  p = fma_f32(p, r * r, r) + 1.0f;
  float second;
  const float first = pow2_halves_f32(std::bit_cast<int32_t>(t) - std::bit_cast<int32_t>(kRound), second);
  return (p * first) * second;
}

LAZYRT_VM_INLINE float erf_f32(float x) {
  const float ax = x < 0 ? -x : x;
  // |x| < 1: x + x (c - 1 + x^2 P(x^2)), c = 2 / sqrt(pi); the exact x carries most of it.
  const float t = x * x;
  float a = 8.387801062781364e-05f;
  a = fma_f32(a, t, -0.0008164031314663589f);
  a = fma_f32(a, t, 0.005204762332141399f);
  a = fma_f32(a, t, -0.0268617682158947f);
  a = fma_f32(a, t, 0.1128375455737114f);
  a = fma_f32(a, t, -0.37612637877464294f);
  const float small = fma_f32(x, fma_f32(t, a, 0.12837916612625122f), x);
  // 1 <= |x|: 1 - exp(-x^2) s Q(s - 0.625), s = 1 / |x|, |x| clamped to [1, 4] (erf(4) rounds
  // to 1; nan stays nan).
  const float c = ax > 4.0f ? 4.0f : (ax < 1.0f ? 1.0f : ax);
  const float s = 1.0f / c;
  const float v = s - 0.625f;
  float b = -0.04736367240548134f;
  b = fma_f32(b, v, 0.05486561730504036f);
  b = fma_f32(b, v, -0.024746179580688477f);
  b = fma_f32(b, v, -0.011217170394957066f);
  b = fma_f32(b, v, 0.04962676391005516f);
  b = fma_f32(b, v, -0.07798472791910172f);
  b = fma_f32(b, v, 0.07210138440132141f);
  b = fma_f32(b, v, -0.0012954489793628454f);
  b = fma_f32(b, v, -0.17158564925193787f);
  b = fma_f32(b, v, 0.489524781703949f);
  const float large = 1.0f - (exp_f32(-(c * c)) * s) * b;
  return ax < 1.0f ? small : (x < 0 ? -large : large);
}

LAZYRT_VM_INLINE float tanh_f32(float x) {
  const float ax = x < 0 ? -x : x;
  // |x| < 0.625: x + x t P(t), t = x^2.
  const float t = x * x;
  float a = 0.002295419806614518f;
  a = fma_f32(a, t, -0.008346530608832836f);
  a = fma_f32(a, t, 0.02176978625357151f);
  a = fma_f32(a, t, -0.053959377110004425f);
  a = fma_f32(a, t, 0.13333304226398468f);
  a = fma_f32(a, t, -0.3333333432674408f);
  const float small = fma_f32(x, t * a, x);
  // Beyond: 1 - 2 / (exp(2|x|) + 1), |x| clamped to 10 (tanh(10) rounds to 1; nan stays nan).
  const float c = ax > 10.0f ? 10.0f : ax;
  const float large = 1.0f - 2.0f / (exp_f32(2.0f * c) + 1.0f);
  // Below 2^-12 tanh(x) rounds to x, and x keeps the sign of -0 (small would not).
  return ax < 0.625f ? (ax < 0x1p-12f ? x : small) : (x < 0 ? -large : large);
}

/// where's choice without a branch: a's bits where the condition byte is non-zero, else b's.
/// A loop of these vectorizes, where a branch per element mispredicts half the time on a
/// condition of mixed signs (a ReLU's backward, a dropout mask). Any element type (its bits are
/// moved, not its value: NaN payloads and -0 pass unchanged).
template <class T>
LAZYRT_VM_INLINE T select_bits(uint8_t cond, T a, T b) {
  using U = std::conditional_t<sizeof(T) == 1, uint8_t,
                               std::conditional_t<sizeof(T) == 2, uint16_t,
                                                  std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>>>;
  static_assert(sizeof(U) == sizeof(T));
  const U m = static_cast<U>(U{0} - static_cast<U>(cond != 0));
  return std::bit_cast<T>(static_cast<U>((std::bit_cast<U>(a) & m) | (std::bit_cast<U>(b) & static_cast<U>(~m))));
}

}  // namespace lazyrt::scalar::vm
