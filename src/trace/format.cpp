// Printing in PyTorch's style: tensor([[1., 2.], [3., 4.]]) with dtype shown when it is not
// the default for its kind.
#include <cmath>
#include <cstdio>
#include <ostream>
#include <sstream>

#include "lazyrt/tensor.h"

namespace lazyrt {
namespace {

std::string fmt_float(double v, bool all_integral) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[64];
  if (all_integral && std::fabs(v) < 1e16) std::snprintf(buf, sizeof buf, "%.0f.", v);
  else std::snprintf(buf, sizeof buf, "%.4f", v);
  return buf;
}

}  // namespace

std::string Tensor::to_string() const {
  if (!defined()) return "tensor(undefined)";
  const DType d = dtype();
  std::vector<std::string> items;
  if (is_floating(d)) {
    std::vector<double> v = cast(*this, DType::f64).to_vector<double>();
    bool integral = true;
    for (double x : v)
      if (std::isfinite(x) && x != std::floor(x)) integral = false;
    for (double x : v) items.push_back(fmt_float(x, integral));
  } else if (d == DType::b8) {
    for (bool b : to_vector<bool>()) items.push_back(b ? "True" : "False");
  } else {
    for (int64_t x : cast(*this, DType::i64).to_vector<int64_t>()) items.push_back(std::to_string(x));
  }
  const Shape& s = shape();
  std::ostringstream os;
  os << "tensor(";
  size_t next = 0;
  // Recursive descent over dims; rows of the innermost dim on one line.
  auto emit = [&](auto&& self, size_t dim, int indent) -> void {
    if (dim == s.size()) {
      os << items[next++];
      return;
    }
    os << '[';
    for (int64_t i = 0; i < s[dim]; ++i) {
      if (i) {
        os << ',';
        if (dim + 1 < s.size()) os << '\n' << std::string(static_cast<size_t>(indent + 1), ' ');
        else os << ' ';
      }
      self(self, dim + 1, indent + 1);
    }
    os << ']';
  };
  emit(emit, 0, 7);
  if (d != DType::f32 && d != DType::i64 && d != DType::b8) os << ", dtype=" << dtype_name(d);
  if (s.size() > 0 && numel() == 0) os << ", size=" << shape_str(s);
  os << ')';
  return os.str();
}

std::ostream& operator<<(std::ostream& os, const Tensor& t) { return os << t.to_string(); }

}  // namespace lazyrt
