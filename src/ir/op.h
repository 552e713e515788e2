// Op kinds and the per-op facts generated from ops.def.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

namespace lazyrt::ir {

enum class OpKind : uint16_t {
#define OP(Enum, name, operands, rule, flags, attrs, aten, api, grad) Enum,
#include "lazyrt/ops.def"
#undef OP
};

// Number of rows in ops.def. Tables indexed by OpKind static_assert against it, so a table
// that misses an op does not compile.
inline constexpr int kNumOps = 0
#define OP(Enum, name, operands, rule, flags, attrs, aten, api, grad) +1
#include "lazyrt/ops.def"
#undef OP
    ;

enum OpFlags : uint32_t {
  kElementwise = 1u << 0,
  kCommutative = 1u << 1,
  kInPlace = 1u << 2,
  kChecked = 1u << 3,
  kCollective = 1u << 4,
};

/// Each row's flags, for checks at compile time (has_flag() reads the same values).
inline constexpr uint32_t kOpFlags[] = {
#define OP(Enum, name, operands, rule, flags, attrs, aten, api, grad) (flags),
#include "lazyrt/ops.def"
#undef OP
};
constexpr bool has_flag_c(OpKind op, OpFlags f) { return (kOpFlags[static_cast<size_t>(op)] & f) != 0; }

/// An op's public function and type promotion (the api column of ops.def).
enum class Api : uint8_t { Unary, UnaryFloat, Arith, ArithFloat, Public, Internal };

struct TensorType;
class NodeAttrs;
/// A result rule (the Rule column of ops.def, defined in ir/rules.h): the result types of op
/// over operands of these types with these attributes; throws lazyrt::Error naming the op for
/// operands or attributes it refuses.
using ResultRule = std::vector<TensorType> (*)(OpKind op, std::span<const TensorType> operands,
                                               const NodeAttrs& at);

enum class AttrKind : uint8_t { Int, Float, Bool, DType, Ints };

struct AttrSpec {
  std::string_view name;
  AttrKind kind;
};

struct OpInfo {
  std::string_view name;
  int operands;
  ResultRule rule;
  uint32_t flags;
  std::vector<AttrSpec> attrs;
  std::string_view aten;  // the ATen overloads lazyrt.torch lowers to this op, space separated
  Api api;
};

const OpInfo& op_info(OpKind op);

/// What a check op verifies (its `what` attribute), and so the error it raises.
enum class CheckKind : int32_t {
  BernoulliProbability,  // every probability of bernoulli(p) is in [0, 1]
  IndexInBounds,         // every (wrapped) index of x[idx] is in [0, size) of the dim it indexes
  kCount,
};
/// The reduction of all_reduce and reduce_scatter (their `reduce` attribute).
enum class ReduceOp : int32_t { Sum, Mean, Max, Min, kCount };
/// "sum", "mean", "max", "min"; throws lazyrt::Error for a value that is not a ReduceOp.
std::string_view reduce_op_name(int64_t op);

/// The message of a failed check of this kind; throws lazyrt::Error for a value that is not one.
std::string_view check_message(int64_t what);

// ---- attributes by name -------------------------------------------------------------------

/// An attribute name as a template argument: ir::NodeAttrs reads `at.ints<"dims">()`.
template <size_t N>
struct AttrName {
  char chars[N];
  consteval AttrName(const char (&s)[N]) {
    for (size_t i = 0; i < N; ++i) chars[i] = s[i];
  }
  constexpr std::string_view view() const { return {chars, N - 1}; }
};

namespace attr_specs {

inline constexpr std::string_view kAttrSpecs[] = {
#define OP(Enum, name, operands, rule, flags, attrs, aten, api, grad) attrs,
#include "lazyrt/ops.def"
#undef OP
};

consteval std::string_view kind_word(AttrKind k) {
  switch (k) {
    case AttrKind::Int: return "int";
    case AttrKind::Float: return "float";
    case AttrKind::Bool: return "bool";
    case AttrKind::DType: return "dtype";
    case AttrKind::Ints: return "ints";
  }
  return "";
}

/// Whether some row of ops.def declares attribute `name` of kind `kind`: a misspelt name, or
/// one read as the wrong kind, does not compile.
consteval bool declared(std::string_view name, AttrKind kind) {
  for (std::string_view spec : kAttrSpecs) {
    while (!spec.empty()) {
      const size_t end = spec.find(' ');
      const std::string_view item = spec.substr(0, end);
      spec = end == std::string_view::npos ? std::string_view() : spec.substr(end + 1);
      const size_t colon = item.find(':');
      if (item.substr(0, colon) == name && item.substr(colon + 1) == kind_word(kind)) return true;
    }
  }
  return false;
}

}  // namespace attr_specs

struct Attrs;

/// The attributes of a node of op `op`, read by the names and kinds its ops.def row declares:
/// `NodeAttrs at(n.op, n.attrs); at.ints<"dims">(), at.b<"keepdim">()`. A name that no op
/// declares with that kind is a compile error; reading one that this op lacks is a bug
/// (asserted).
class NodeAttrs {
 public:
  NodeAttrs(OpKind op, const Attrs& attrs) : op_(op), attrs_(attrs) {}
  template <AttrName N>
  int64_t i() const;
  template <AttrName N>
  double f() const;
  template <AttrName N>
  bool b() const;
  template <AttrName N>
  auto dtype() const;
  template <AttrName N>
  const std::vector<int64_t>& ints() const;

 private:
  size_t index(std::string_view name, AttrKind kind) const;
  template <AttrName N, AttrKind K, class T>
  const T& read() const;
  OpKind op_;
  const Attrs& attrs_;
};
inline std::string_view op_name(OpKind op) { return op_info(op).name; }
inline bool has_flag(OpKind op, OpFlags f) { return (op_info(op).flags & f) != 0; }
/// The op whose name is `name`, or false.
bool op_from_name(std::string_view name, OpKind* op);

}  // namespace lazyrt::ir
