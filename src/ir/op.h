// Op kinds and the per-op facts generated from ops.def.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

namespace lazyrt::ir {

enum class OpKind : uint16_t {
#define OP(Enum, name, operands, rule, flags, attrs, aten) Enum,
#include "ir/ops.def"
#undef OP
};

// Number of rows in ops.def. Tables indexed by OpKind static_assert against it, so a table
// that misses an op does not compile.
inline constexpr int kNumOps = 0
#define OP(Enum, name, operands, rule, flags, attrs, aten) +1
#include "ir/ops.def"
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
#define OP(Enum, name, operands, rule, flags, attrs, aten) (flags),
#include "ir/ops.def"
#undef OP
};
constexpr bool has_flag_c(OpKind op, OpFlags f) { return (kOpFlags[static_cast<size_t>(op)] & f) != 0; }

enum class ResultRule : uint8_t {
  Given,           // the result types are supplied by whoever builds the node (parameters, calls)
  Full,            // from the shape and dtype attributes
  Unary,           // same type
  UnaryNumeric,    // same type; not b8
  UnaryFloat,      // same type; floating only
  UnaryToBool,     // same shape, b8
  Cast,            // same shape, the dtype attribute
  Binary,          // broadcast shape, the operands' common dtype
  BinaryNumeric,   // as Binary; not b8
  BinaryFloat,     // as Binary; floating only
  Compare,         // broadcast shape, b8
  Where,           // b8 condition, two values of one dtype; broadcast of all three
  Clamp,           // three operands of one dtype, not b8; broadcast of all three
  Reduce,          // dims removed (or kept as 1)
  ReduceFloat,     // as Reduce; floating only
  ReduceNonEmpty,  // as Reduce; reduced dims must not be empty
  ReduceNorm,      // as ReduceFloat; the p attribute must be 1, 2 or inf
  ArgReduce,       // the dim attribute removed (or kept as 1), i64; not b8; dim not empty
  Softmax,         // same type, floating only; the dim attribute in range
  Cumulative,      // operand 0's type, not b8, the dim attribute in range; further operands
                   // of that type (then floating only)
  Sort,            // i64, the dim attribute in range and of size k (0 <= k <= its size)
  Matmul,          // [..., n, k] x [..., k, m] -> [broadcast(...), n, m]
  Permute,         // dims permuted
  Reshape,         // the shape attribute, same element count
  Expand,          // the shape attribute, broadcast from the operand
  // Data movement, indexing and NN ops: rules in infer_nn.cpp.
  Slice,                 // per dim ceil((end - start) / step)
  Pad,                   // per dim low + high + n + (n - 1) * interior
  Flip,                  // same type
  Concat,                // operands of one type but for `dim`; sizes along it add up
  IndexSelect,           // `dim` takes the index's length
  Gather,                // the index's shape
  Scatter,               // operand 0's type; index and src fit it
  IndexAdd,              // operand 0's type; src is it with `dim` of the index's length
  Conv2d,                // [N, C, H, W] x [O, C / groups, kh, kw] -> [N, O, OH, OW]
  Conv2dBackwardInput,   // the input_size attribute
  Conv2dBackwardWeight,  // the weight_size attribute
  MaxPool2d,             // [N, C, OH, OW]
  MaxPool2dBackward,     // the input's type
  MaxPool2dIndices,      // [N, C, OH, OW] of i64
  AvgPool2d,             // [N, C, OH, OW]
  AvgPool2dBackward,     // the input_size attribute
  Check,           // operand 0's type; operand 1 b8; the what attribute a CheckKind
  While,           // the first `carries` operand types
  Scan,            // the carries' operand types, then the stacked outputs of the attributes
  Random,          // the shape and (floating) dtype attributes; operands i64 scalars
  Iota,            // the shape (one dim) and dtype attributes
  Gemm,            // [.., n, k] (or [.., k, n] transposed) x [.., k, m] (or [.., m, k]) -> [.., n, m]
  GemmView,        // the views' [.., n, k] x [.., k, m] -> [.., n, m], permuted by out_perm
  Fusion,          // one result per dtype attribute, of the shape attribute or one value per row (ops.def)
  Collective,      // the tensor's type (all_gather: dim 0 times world; reduce_scatter: divided
                   // by it), then the b8 scalar token; operand 1 such a token
};

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
#define OP(Enum, name, operands, rule, flags, attrs, aten) attrs,
#include "ir/ops.def"
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
