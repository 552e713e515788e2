// Internal invariants (LAZYRT_ASSERT) and user-facing errors (LAZYRT_CHECK).
//
// LAZYRT_ASSERT reports a bug in lazyrt itself, with file and line. LAZYRT_CHECK reports bad
// input from a user: the message must name the call, what it saw and what it expected.
#pragma once

#include <sstream>
#include <string>

#include "lazyrt/types.h"

namespace lazyrt::detail {

[[noreturn]] void assert_fail(const char* expr, const char* file, int line, const std::string& msg);

template <class... Args>
std::string str_cat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}

/// a + b and a * b for byte counts (arenas, workspaces, constants): throw lazyrt::Error naming
/// `what` once the result would exceed kMaxTensorBytes, so no size derived from tensor sizes
/// can wrap.
inline size_t bytes_add(size_t a, size_t b, const char* what) {
  size_t r = 0;
  if (__builtin_add_overflow(a, b, &r) || r > kMaxTensorBytes)
    throw Error(str_cat(what, ": ", a, " + ", b, " bytes is more than 2^62"));
  return r;
}
inline size_t bytes_mul(size_t a, size_t b, const char* what) {
  size_t r = 0;
  if (__builtin_mul_overflow(a, b, &r) || r > kMaxTensorBytes)
    throw Error(str_cat(what, ": ", a, " * ", b, " bytes is more than 2^62"));
  return r;
}

/// Stride arithmetic (a * b + c in two's complement). The strides and offsets of an empty
/// tensor whose other dims are huge may pass 64 bits; they address nothing, so they wrap
/// rather than overflow. Those of a tensor with elements always fit.
inline int64_t stride_mul_add(int64_t a, int64_t b, int64_t c = 0) {
  return static_cast<int64_t>(static_cast<uint64_t>(a) * static_cast<uint64_t>(b) + static_cast<uint64_t>(c));
}

}  // namespace lazyrt::detail

#define LAZYRT_ASSERT(cond, ...)                                                            \
  do {                                                                                      \
    if (!(cond))                                                                            \
      ::lazyrt::detail::assert_fail(#cond, __FILE__, __LINE__,                              \
                                    ::lazyrt::detail::str_cat("" __VA_OPT__(, ) __VA_ARGS__)); \
  } while (0)

#define LAZYRT_CHECK(cond, ...)                                                     \
  do {                                                                              \
    if (!(cond)) throw ::lazyrt::Error(::lazyrt::detail::str_cat(__VA_ARGS__));     \
  } while (0)
