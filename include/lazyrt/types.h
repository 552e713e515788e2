// Basic vocabulary of the public API: element types, shapes, scalars and the error type.
// Everything here is a plain value type and thread-safe to use from any thread.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace lazyrt {

/// Element type of a tensor. The order is part of the on-disk format: append only.
enum class DType : uint8_t { f32, f64, bf16, f16, i32, i64, b8 };
inline constexpr int kNumDTypes = 7;

using Shape = std::vector<int64_t>;

/// The one exception type of the public API. Messages name the call, what it was given and
/// what it expected. A call that throws leaves every tensor as it was before the call.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

const char* dtype_name(DType dtype);       // "f32", "i64", ...
size_t dtype_size(DType dtype);            // bytes per element
bool is_floating(DType dtype);             // f32, f64, bf16, f16
bool is_integral(DType dtype);             // i32, i64 (not b8)
/// PyTorch's promotion of two tensor dtypes of equal priority (bool < int < float; within a
/// category the wider type; bf16 with f16 gives f32).
DType promote_types(DType a, DType b);

std::string shape_str(const Shape& shape);  // "[2, 3]"
/// Product of the dims; throws lazyrt::Error when it does not fit in 64 bits.
int64_t shape_numel(const Shape& shape);
/// The most bytes one tensor may have (2^62): every size derived from a tensor's, rounded
/// and summed for an arena, stays far from wrapping.
inline constexpr size_t kMaxTensorBytes = size_t{1} << 62;
/// Bytes of a tensor of this shape and dtype; throws lazyrt::Error naming both when the count
/// does not fit in 64 bits or exceeds kMaxTensorBytes.
size_t shape_bytes(const Shape& shape, DType dtype);

/// A number used as an operand (x + 1, x * 0.5). It remembers whether it was written as a
/// bool, an integer or a floating value, because PyTorch's type promotion depends on it:
/// an i64 tensor minus 1 stays i64, an i64 tensor times 0.5 becomes f32.
class Scalar {
 public:
  enum class Kind : uint8_t { Bool, Int, Float };
  Scalar(double v) : value_(v), kind_(Kind::Float) {}  // NOLINT(runtime/explicit)
  Scalar(float v) : value_(v), kind_(Kind::Float) {}   // NOLINT(runtime/explicit)
  Scalar(bool v) : value_(v ? 1.0 : 0.0), kind_(Kind::Bool) {}  // NOLINT(runtime/explicit)
  template <class T, std::enable_if_t<std::is_integral_v<T> && !std::is_same_v<T, bool>, int> = 0>
  Scalar(T v) : value_(static_cast<double>(v)), kind_(Kind::Int) {}  // NOLINT(runtime/explicit)

  double to_double() const { return value_; }
  Kind kind() const { return kind_; }

 private:
  double value_;
  Kind kind_;
};

/// 128-bit structural hash of a graph: the same on every run and in every process.
struct GraphHash {
  uint64_t hi = 0;
  uint64_t lo = 0;
  bool operator==(const GraphHash& o) const { return hi == o.hi && lo == o.lo; }
  bool operator!=(const GraphHash& o) const { return !(*this == o); }
  std::string to_string() const;  // 32 lowercase hex digits
};

}  // namespace lazyrt
