#include <cstdio>
#include <sstream>

#include "lazyrt/types.h"
#include "util/check.h"

namespace lazyrt {

namespace detail {
void assert_fail(const char* expr, const char* file, int line, const std::string& msg) {
  throw Error(str_cat("lazyrt internal error: ", expr, " failed at ", file, ":", line,
                      msg.empty() ? "" : ": ", msg));
}
}  // namespace detail

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::f32: return "f32";
    case DType::f64: return "f64";
    case DType::bf16: return "bf16";
    case DType::f16: return "f16";
    case DType::i32: return "i32";
    case DType::i64: return "i64";
    case DType::b8: return "b8";
  }
  return "?";
}

size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::f32: return 4;
    case DType::f64: return 8;
    case DType::bf16: return 2;
    case DType::f16: return 2;
    case DType::i32: return 4;
    case DType::i64: return 8;
    case DType::b8: return 1;
  }
  return 0;
}

bool is_floating(DType d) {
  return d == DType::f32 || d == DType::f64 || d == DType::bf16 || d == DType::f16;
}
bool is_integral(DType d) { return d == DType::i32 || d == DType::i64; }

DType promote_types(DType a, DType b) {
  if (a == b) return a;
  auto category = [](DType d) { return d == DType::b8 ? 0 : is_integral(d) ? 1 : 2; };
  int ca = category(a), cb = category(b);
  if (ca != cb) return ca > cb ? a : b;
  if (ca == 1) return DType::i64;  // i32 with i64
  // Floating: the wider one; bf16 with f16 has no exact common 16-bit type.
  if (a == DType::f64 || b == DType::f64) return DType::f64;
  return DType::f32;
}

std::string shape_str(const Shape& shape) {
  std::ostringstream os;
  os << '[';
  for (size_t i = 0; i < shape.size(); ++i) os << (i ? ", " : "") << shape[i];
  os << ']';
  return os.str();
}

int64_t shape_numel(const Shape& shape) {
  // Empty whatever the order of its dims ([2^62, 8, 0] as [0, 2^62, 8]).
  for (int64_t d : shape)
    if (d == 0) return 0;
  int64_t n = 1;
  for (int64_t d : shape)
    if (__builtin_mul_overflow(n, d, &n))
      throw Error(detail::str_cat("shape ", shape_str(shape),
                                  " has more elements than a 64-bit count can hold"));
  return n;
}

size_t shape_bytes(const Shape& shape, DType dtype) {
  const auto numel = static_cast<uint64_t>(shape_numel(shape));
  uint64_t bytes = 0;
  if (__builtin_mul_overflow(numel, static_cast<uint64_t>(dtype_size(dtype)), &bytes) || bytes > kMaxTensorBytes)
    throw Error(detail::str_cat("a ", dtype_name(dtype), shape_str(shape),
                                " tensor needs more than 2^62 bytes, the most one tensor may hold"));
  return static_cast<size_t>(bytes);
}

std::string GraphHash::to_string() const {
  char buf[33];
  std::snprintf(buf, sizeof buf, "%016llx%016llx", static_cast<unsigned long long>(hi),
                static_cast<unsigned long long>(lo));
  return buf;
}

}  // namespace lazyrt
