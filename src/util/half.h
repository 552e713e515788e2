// Storage types of the 16-bit floating dtypes. Arithmetic happens in float; conversions
// round to nearest, ties to even, as PyTorch does.
#pragma once

#include <cstdint>
#include <cstring>

namespace lazyrt {

inline uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

struct bf16 {
  uint16_t bits = 0;
  bf16() = default;
  explicit bf16(float f) {
    uint32_t x = float_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) {
      bits = static_cast<uint16_t>((x >> 16) | 0x0040u);  // quiet NaN, sign kept
      return;
    }
    x += 0x7fffu + ((x >> 16) & 1u);
    bits = static_cast<uint16_t>(x >> 16);
  }
  explicit operator float() const { return bits_float(static_cast<uint32_t>(bits) << 16); }
};

struct f16 {
  uint16_t bits = 0;
  f16() = default;
  explicit f16(float f) {
    uint32_t x = float_bits(f);
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) {  // inf or NaN
      bits = static_cast<uint16_t>(sign | (ax > 0x7f800000u ? 0x7e00u : 0x7c00u));
    } else if (ax >= 0x477ff000u) {  // rounds past the largest half (65504)
      bits = static_cast<uint16_t>(sign | 0x7c00u);
    } else if (ax < 0x38800000u) {  // below the smallest normal half (2^-14)
      // Adding 0.5 leaves a float whose ulp is 2^-24, the half subnormal step, so the add
      // itself rounds to nearest even; the difference in bits is the half mantissa.
      float t = bits_float(ax) + 0.5f;
      bits = static_cast<uint16_t>(sign | (float_bits(t) - 0x3f000000u));
    } else {
      uint32_t odd = (ax >> 13) & 1u;
      ax += 0xfffu + odd;
      bits = static_cast<uint16_t>(sign | ((ax - (112u << 23)) >> 13));
    }
  }
  explicit operator float() const {
    uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
    uint32_t exp = (bits >> 10) & 0x1fu;
    uint32_t mant = bits & 0x3ffu;
    if (exp == 0x1f) return bits_float(sign | 0x7f800000u | (mant << 13));
    if (exp == 0) {
      float v = static_cast<float>(mant) * 5.9604644775390625e-8f;  // 2^-24
      return sign ? -v : v;
    }
    return bits_float(sign | ((exp + 112u) << 23) | (mant << 13));
  }
};

}  // namespace lazyrt
