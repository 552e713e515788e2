// Dtype dispatch over element storage: visit_dtype calls a function with a value of a dtype's
// storage type, compute_t is the type arithmetic happens in, convert converts between storage
// types with PyTorch's rounding, fill_elements writes one value n times. Used by the kernels
// and by whatever reads or writes elements on the host (item(), constants, folding).
#pragma once

#include <cstdint>
#include <limits>
#include <type_traits>

#include "lazyrt/types.h"
#include "util/check.h"
#include "util/half.h"

namespace lazyrt {

/// Calls fn with a value of the storage type of `d`.
template <class Fn>
decltype(auto) visit_dtype(DType d, Fn&& fn) {
  switch (d) {
    case DType::f32: return fn(float{});
    case DType::f64: return fn(double{});
    case DType::bf16: return fn(bf16{});
    case DType::f16: return fn(f16{});
    case DType::i32: return fn(int32_t{});
    case DType::i64: return fn(int64_t{});
    case DType::b8: return fn(bool{});
  }
  LAZYRT_ASSERT(false, "bad dtype");
}

/// The type arithmetic happens in: float for the 16-bit floats, the storage type otherwise.
template <class T>
using compute_t = std::conditional_t<std::is_same_v<T, bf16> || std::is_same_v<T, f16>, float, T>;

template <class To, class From>
inline To convert(From v) {
  if constexpr (std::is_same_v<To, From>) {
    return v;
  } else if constexpr (std::is_same_v<From, bf16> || std::is_same_v<From, f16>) {
    return convert<To>(static_cast<float>(v));
  } else if constexpr (std::is_same_v<To, bf16> || std::is_same_v<To, f16>) {
    return To(static_cast<float>(v));
  } else if constexpr (std::is_same_v<To, bool>) {
    return v != From(0);
  } else if constexpr (std::is_integral_v<To> && std::is_floating_point_v<From>) {
    // NaN, and values out of To's range, are undefined behaviour to convert in C++; x86's
    // conversion (and so torch's on it) gives the lowest value.
    constexpr From lowest = static_cast<From>(std::numeric_limits<To>::min());  // -2^(n-1), exact
    return v >= lowest && v < -lowest ? static_cast<To>(v) : std::numeric_limits<To>::min();
  } else {
    return static_cast<To>(v);
  }
}

/// Writes `value` converted to `dtype` into n elements at dst.
inline void fill_elements(void* dst, DType dtype, double value, int64_t n) {
  visit_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    const T v = convert<T>(value);
    T* o = static_cast<T*>(dst);
    for (int64_t i = 0; i < n; ++i) o[i] = v;
  });
}

}  // namespace lazyrt
