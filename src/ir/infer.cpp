// Result rules (ir/rules.h): the one place that says what shape and dtype an op produces, and
// which operands it refuses. Tracing calls infer_types() before recording a node, so a bad call
// throws before anything is built. The rules of data movement, indexing, convolution and
// pooling are in infer_nn.cpp.
#include <algorithm>
#include <limits>
#include <span>

#include "ir/gemm_view.h"
#include "ir/graph.h"
#include "ir/rules.h"
#include "util/check.h"

namespace lazyrt::ir {
namespace {

using lazyrt::detail::str_cat;

void check_same_dtype(std::string_view op, std::span<const TensorType> ts) {
  for (const auto& t : ts)
    LAZYRT_CHECK(t.dtype == ts[0].dtype, op, ": operands must have one dtype, got ",
                 types_str(ts));
}

void check_not_bool(std::string_view op, const TensorType& t) {
  LAZYRT_CHECK(t.dtype != DType::b8, op, ": does not take b8 tensors, got ", type_str(t));
}

void check_float(std::string_view op, const TensorType& t) {
  LAZYRT_CHECK(is_floating(t.dtype), op, ": expects a floating tensor (f32, f64, bf16, f16), got ",
               type_str(t));
}

void check_shape_valid(std::string_view op, const Shape& s) {
  for (int64_t d : s)
    LAZYRT_CHECK(d >= 0, op, ": negative dimension in shape ", shape_str(s));
}

// An integer constant must hold a value its dtype can represent: converting anything else
// (out of range, NaN) is undefined behaviour, not a wrapped value.
void check_value_fits(std::string_view op, double value, DType dtype) {
  bool fits = true;
  if (dtype == DType::i64) fits = value >= -0x1p63 && value < 0x1p63;
  if (dtype == DType::i32) fits = value >= -0x1p31 && value < 0x1p31;
  LAZYRT_CHECK(fits, op, ": value ", value, " does not fit ", dtype_name(dtype));
}

// The result shape of a product of [..., n, k] and [..., k, m] shapes: their batch dims
// broadcast, then n, m.
Shape product_shape(std::string_view op, const Shape& x, const Shape& y, int64_t n, int64_t m) {
  Shape bx(x.begin(), x.end() - 2), by(y.begin(), y.end() - 2);
  Shape out = bx == by ? std::move(bx) : broadcast_shapes(bx, by, str_cat(op, " batch dims"));
  out.push_back(n);
  out.push_back(m);
  return out;
}

// The `dim` attribute of an op along one dim of t, checked in range (a 0-dim t takes 0).
int64_t dim_attr(std::string_view op, const NodeAttrs& at, const TensorType& t) {
  const auto rank = static_cast<int64_t>(t.shape.size());
  const int64_t dim = at.i<"dim">();
  LAZYRT_CHECK(dim >= 0 && dim < std::max<int64_t>(rank, 1), op, ": dim ", dim, " out of range for ",
               type_str(t));
  return dim;
}

// The reduce family (sum, mean, amax, amin, prod, var, std, norm) and the arg reductions
// (dims = their one `dim`): every op of both has `keepdim`.
std::vector<TensorType> reduce_types(std::string_view op, const TensorType& in,
                                     std::span<const int64_t> dims, bool keepdim,
                                     bool non_empty) {
  const int64_t rank = static_cast<int64_t>(in.shape.size());
  for (size_t k = 0; k < dims.size(); ++k) {
    LAZYRT_CHECK(dims[k] >= 0 && dims[k] < std::max<int64_t>(rank, 1), op, ": dim ", dims[k],
                 " out of range for a tensor of rank ", rank);
    LAZYRT_CHECK(k == 0 || dims[k] > dims[k - 1], op, ": dims must be sorted and unique");
  }
  Shape out;
  for (int64_t d = 0; d < rank; ++d) {
    bool reduced = std::find(dims.begin(), dims.end(), d) != dims.end();
    if (reduced && non_empty)
      LAZYRT_CHECK(in.shape[d] != 0, op, ": cannot reduce over dim ", d,
                   " of size 0 (no identity); input ", type_str(in));
    if (!reduced) out.push_back(in.shape[d]);
    else if (keepdim) out.push_back(1);
  }
  return single_result(in.dtype, std::move(out));
}

}  // namespace

std::string types_str(std::span<const TensorType> ts) {
  std::string s;
  for (size_t i = 0; i < ts.size(); ++i) s += (i ? ", " : "") + type_str(ts[i]);
  return s;
}

std::string type_str(const TensorType& t) {
  return str_cat(dtype_name(t.dtype), shape_str(t.shape));
}

Shape broadcast_shapes(const Shape& a, const Shape& b, std::string_view what) {
  size_t n = std::max(a.size(), b.size());
  Shape out = n ? util::VectorStash<Shape>::take() : Shape();
  out.resize(n);
  for (size_t i = 0; i < n; ++i) {
    int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    LAZYRT_CHECK(da == db || da == 1 || db == 1, what, ": shapes ", shape_str(a), " and ",
                 shape_str(b), " cannot be broadcast (dim ", i, ": ", da, " vs ", db, ")");
    out[i] = da == 1 ? db : da;
  }
  return out;
}

bool broadcasts_to(const Shape& a, const Shape& to) {
  if (a.size() > to.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    const int64_t d = a[a.size() - 1 - i];
    if (d != 1 && d != to[to.size() - 1 - i]) return false;
  }
  return true;
}

FusionRows fusion_rows(const Shape& shape, int64_t reduced) {
  FusionRows r;
  const auto lead = static_cast<int64_t>(shape.size()) - reduced;
  for (int64_t d = 0; d < static_cast<int64_t>(shape.size()); ++d) {
    if (d < lead) {
      r.keep.push_back(shape[d]);
      r.drop.push_back(shape[d]);
    } else {
      r.keep.push_back(1);
      r.row *= shape[d];
    }
  }
  return r;
}

int64_t row_reduction_dims(const Graph& g, const Node& n) {
  switch (n.op) {
    case OpKind::Sum:
    case OpKind::Mean:
    case OpKind::Amax:
    case OpKind::Amin:
    case OpKind::Var:
    case OpKind::Std: break;
    default: return 0;
  }
  const TensorType& in = g.type(n.operands[0]);
  if (!is_floating(in.dtype)) return 0;
  const std::vector<int64_t>& dims = NodeAttrs(n.op, n.attrs).ints<"dims">();
  const auto rank = static_cast<int64_t>(in.shape.size());
  const auto k = static_cast<int64_t>(dims.size());
  for (int64_t j = 0; j < k; ++j)
    if (dims[static_cast<size_t>(j)] != rank - k + j) return 0;
  return k > 0 && fusion_rows(in.shape, k).row >= 2 ? k : 0;
}

namespace rules {

std::vector<TensorType> Given(OpKind op, std::span<const TensorType>, const NodeAttrs&) {
  const std::string_view name = op_name(op);
  LAZYRT_ASSERT(false, name, " has no result rule: its type is given by its builder");
  return {};
}

std::vector<TensorType> Full(OpKind op, std::span<const TensorType>, const NodeAttrs& at) {
  const std::string_view name = op_name(op);
  check_shape_valid(name, at.ints<"shape">());
  check_value_fits(name, at.f<"value">(), at.dtype<"dtype">());
  return single_result(at.dtype<"dtype">(), at.ints<"shape">());
}

std::vector<TensorType> Unary(OpKind, std::span<const TensorType> ops, const NodeAttrs&) {
  return single_result(ops[0]);
}

std::vector<TensorType> UnaryNumeric(OpKind op, std::span<const TensorType> ops, const NodeAttrs&) {
  const std::string_view name = op_name(op);
  check_not_bool(name, ops[0]);
  return single_result(ops[0]);
}

std::vector<TensorType> UnaryFloat(OpKind op, std::span<const TensorType> ops, const NodeAttrs&) {
  const std::string_view name = op_name(op);
  check_float(name, ops[0]);
  return single_result(ops[0]);
}

std::vector<TensorType> UnaryToBool(OpKind, std::span<const TensorType> ops, const NodeAttrs&) {
  return single_result(DType::b8, ops[0].shape);
}

std::vector<TensorType> Cast(OpKind, std::span<const TensorType> ops, const NodeAttrs& at) {
  return single_result(at.dtype<"dtype">(), ops[0].shape);
}

std::vector<TensorType> Binary(OpKind op, std::span<const TensorType> ops, const NodeAttrs&) {
  const std::string_view name = op_name(op);
  check_same_dtype(name, ops);
  return single_result(ops[0].dtype, broadcast_shapes(ops[0].shape, ops[1].shape, name));
}

std::vector<TensorType> BinaryNumeric(OpKind op, std::span<const TensorType> ops, const NodeAttrs&) {
  const std::string_view name = op_name(op);
  check_same_dtype(name, ops);
  check_not_bool(name, ops[0]);
  return single_result(ops[0].dtype, broadcast_shapes(ops[0].shape, ops[1].shape, name));
}

std::vector<TensorType> BinaryFloat(OpKind op, std::span<const TensorType> ops, const NodeAttrs&) {
  const std::string_view name = op_name(op);
  check_same_dtype(name, ops);
  check_float(name, ops[0]);
  return single_result(ops[0].dtype, broadcast_shapes(ops[0].shape, ops[1].shape, name));
}

std::vector<TensorType> Compare(OpKind op, std::span<const TensorType> ops, const NodeAttrs&) {
  const std::string_view name = op_name(op);
  check_same_dtype(name, ops);
  return single_result(DType::b8, broadcast_shapes(ops[0].shape, ops[1].shape, name));
}

std::vector<TensorType> Where(OpKind op, std::span<const TensorType> ops, const NodeAttrs&) {
  const std::string_view name = op_name(op);
  LAZYRT_CHECK(ops[0].dtype == DType::b8, name, ": condition must be b8, got ",
               type_str(ops[0]));
  LAZYRT_CHECK(ops[1].dtype == ops[2].dtype, name, ": values must have one dtype, got ",
               type_str(ops[1]), " and ", type_str(ops[2]));
  Shape s = broadcast_shapes(broadcast_shapes(ops[0].shape, ops[1].shape, name),
                             ops[2].shape, name);
  return single_result(ops[1].dtype, std::move(s));
}

std::vector<TensorType> Clamp(OpKind op, std::span<const TensorType> ops, const NodeAttrs&) {
  const std::string_view name = op_name(op);
  check_same_dtype(name, ops);
  check_not_bool(name, ops[0]);
  Shape s = broadcast_shapes(broadcast_shapes(ops[0].shape, ops[1].shape, name),
                             ops[2].shape, name);
  return single_result(ops[0].dtype, std::move(s));
}

std::vector<TensorType> Reduce(OpKind op, std::span<const TensorType> ops, const NodeAttrs& at) {
  const std::string_view name = op_name(op);
  return reduce_types(name, ops[0], at.ints<"dims">(), at.b<"keepdim">(), false);
}

std::vector<TensorType> ReduceFloat(OpKind op, std::span<const TensorType> ops, const NodeAttrs& at) {
  const std::string_view name = op_name(op);
  check_float(name, ops[0]);
  return reduce_types(name, ops[0], at.ints<"dims">(), at.b<"keepdim">(), false);
}

std::vector<TensorType> ReduceNonEmpty(OpKind op, std::span<const TensorType> ops, const NodeAttrs& at) {
  const std::string_view name = op_name(op);
  return reduce_types(name, ops[0], at.ints<"dims">(), at.b<"keepdim">(), true);
}

std::vector<TensorType> ReduceNorm(OpKind op, std::span<const TensorType> ops, const NodeAttrs& at) {
  const std::string_view name = op_name(op);
  check_float(name, ops[0]);
  const double p = at.f<"p">();
  LAZYRT_CHECK(p == 1 || p == 2 || p == std::numeric_limits<double>::infinity(), name,
               ": p must be 1, 2 or inf, got ", p);
  return reduce_types(name, ops[0], at.ints<"dims">(), at.b<"keepdim">(), false);
}

std::vector<TensorType> ArgReduce(OpKind op, std::span<const TensorType> ops, const NodeAttrs& at) {
  const std::string_view name = op_name(op);
  check_not_bool(name, ops[0]);
  const int64_t dim = at.i<"dim">();
  auto out = reduce_types(name, ops[0], {&dim, 1}, at.b<"keepdim">(), true);
  out[0].dtype = DType::i64;
  return out;
}

std::vector<TensorType> Softmax(OpKind op, std::span<const TensorType> ops, const NodeAttrs& at) {
  const std::string_view name = op_name(op);
  check_float(name, ops[0]);
  dim_attr(name, at, ops[0]);
  return single_result(ops[0]);
}

std::vector<TensorType> Cumulative(OpKind op, std::span<const TensorType> ops, const NodeAttrs& at) {
  const std::string_view name = op_name(op);
  check_not_bool(name, ops[0]);
  for (size_t i = 1; i < ops.size(); ++i) {
    check_float(name, ops[0]);
    LAZYRT_CHECK(ops[i] == ops[0], name, ": operands must have one type, got ", types_str(ops));
  }
  dim_attr(name, at, ops[0]);
  return single_result(ops[0]);
}

std::vector<TensorType> Sort(OpKind op, std::span<const TensorType> ops, const NodeAttrs& at) {
  const std::string_view name = op_name(op);
  const auto rank = static_cast<int64_t>(ops[0].shape.size());
  const int64_t dim = dim_attr(name, at, ops[0]), k = at.i<"k">();
  const int64_t size = rank ? ops[0].shape[dim] : 1;
  LAZYRT_CHECK(k >= 0 && k <= size, name, ": k ", k, " out of range [0, ", size, "] for ",
               type_str(ops[0]), " along dim ", dim);
  Shape out = ops[0].shape;
  if (rank) out[dim] = k;
  return single_result(DType::i64, std::move(out));
}

std::vector<TensorType> Matmul(OpKind op, std::span<const TensorType> ops, const NodeAttrs&) {
  const std::string_view name = op_name(op);
  const auto& x = ops[0];
  const auto& y = ops[1];
  LAZYRT_CHECK(x.shape.size() >= 2 && y.shape.size() >= 2, name,
               ": expects operands of rank >= 2, got ", types_str(ops));
  LAZYRT_CHECK(x.dtype == y.dtype, name, ": operands must have one dtype, got ",
               types_str(ops));
  check_not_bool(name, x);
  int64_t n = x.shape[x.shape.size() - 2], k = x.shape.back();
  int64_t k2 = y.shape[y.shape.size() - 2], m = y.shape.back();
  LAZYRT_CHECK(k == k2, name, ": inner dimensions differ: ", shape_str(x.shape), " x ",
               shape_str(y.shape), " (", k, " vs ", k2, ")");
  return single_result(x.dtype, product_shape(name, x.shape, y.shape, n, m));
}

std::vector<TensorType> Gemm(OpKind op, std::span<const TensorType> ops, const NodeAttrs& at) {
  const std::string_view name = op_name(op);
  const auto& x = ops[0];
  const auto& y = ops[1];
  LAZYRT_CHECK(x.shape.size() >= 2 && y.shape.size() >= 2 && x.dtype == y.dtype, name,
               ": expects two operands of rank >= 2 and one dtype, got ", types_str(ops));
  check_not_bool(name, x);
  const bool tx = at.b<"transpose_x">(), ty = at.b<"transpose_y">();
  const size_t rx = x.shape.size(), ry = y.shape.size();
  const int64_t n = x.shape[rx - (tx ? 1 : 2)], k = x.shape[rx - (tx ? 2 : 1)];
  const int64_t k2 = y.shape[ry - (ty ? 1 : 2)], m = y.shape[ry - (ty ? 2 : 1)];
  LAZYRT_CHECK(k == k2, name, ": inner dimensions differ: ", types_str(ops), " (", k, " vs ", k2, ")");
  return single_result(x.dtype, product_shape(name, x.shape, y.shape, n, m));
}

std::vector<TensorType> GemmView(OpKind op, std::span<const TensorType> ops, const NodeAttrs& at) {
  const std::string_view name = op_name(op);
  LAZYRT_CHECK(ops.size() == 2 || ops.size() == 3, name, ": expects 2 operands and maybe valid extents, got ",
               ops.size());
  LAZYRT_CHECK(ops.size() == 2 || (ops[2].dtype == DType::i64 && ops[2].shape == Shape{8}), name,
               ": the valid extents must be i64[8] (valid count and block of the batches, rows, columns "
               "and contracted elements), got ", type_str(ops[2]));
  const auto& x = ops[0];
  const auto& y = ops[1];
  LAZYRT_CHECK(x.dtype == y.dtype, name, ": expects two operands of one dtype, got ", types_str(ops));
  check_not_bool(name, x);
  auto view = [&](const TensorType& t, const std::vector<int64_t>& attr, const char* which) {
    const StridedView v = StridedView::decode(attr);
    LAZYRT_CHECK(attr.size() >= 5 && attr.size() % 2 == 1, name, ": the ", which, " view must be an offset "
                 "and (size, stride) pairs of rank >= 2, got ", attr.size(), " values");
    const int64_t numel = shape_numel(t.shape);
    int64_t last = v.offset;
    bool empty = false;
    for (size_t d = 0; d < v.sizes.size(); ++d) {
      LAZYRT_CHECK(v.sizes[d] >= 0 && v.strides[d] >= 0, name, ": the ", which, " view has a negative size "
                   "or stride");
      empty = empty || v.sizes[d] == 0;
      int64_t reach = 0;
      LAZYRT_CHECK(!__builtin_mul_overflow(std::max<int64_t>(v.sizes[d] - 1, 0), v.strides[d], &reach) &&
                       !__builtin_add_overflow(last, reach, &last),
                   name, ": the ", which, " view overflows");
    }
    LAZYRT_CHECK(empty || (v.offset >= 0 && last < numel), name, ": the ", which, " view reaches element ",
                 last, " of an operand of ", numel, " elements (", types_str(ops), ")");
    LAZYRT_CHECK(empty || blas_matrix(v), name, ": the ", which, " view's matrices are neither rows nor "
                 "columns of adjacent elements");
    return v.sizes;
  };
  const Shape xs = view(x, at.ints<"x_view">(), "x"), ys = view(y, at.ints<"y_view">(), "y");
  const int64_t n = xs[xs.size() - 2], k = xs.back(), k2 = ys[ys.size() - 2], m = ys.back();
  LAZYRT_CHECK(k == k2, name, ": inner dimensions differ: ", shape_str(xs), " x ", shape_str(ys));
  Shape out = product_shape(name, xs, ys, n, m);
  const auto& perm = at.ints<"out_perm">();
  if (perm.empty()) return single_result(x.dtype, std::move(out));
  LAZYRT_CHECK(perm.size() == out.size() && perm.back() == static_cast<int64_t>(out.size()) - 1, name,
               ": out_perm must permute the ", out.size(), " result dims keeping the last one last");
  std::vector<bool> seen(out.size(), false);
  Shape permuted;
  for (int64_t p : perm) {
    LAZYRT_CHECK(p >= 0 && p < static_cast<int64_t>(out.size()) && !seen[static_cast<size_t>(p)], name,
                 ": out_perm is not a permutation");
    seen[static_cast<size_t>(p)] = true;
    permuted.push_back(out[static_cast<size_t>(p)]);
  }
  return single_result(x.dtype, std::move(permuted));
}

std::vector<TensorType> Permute(OpKind op, std::span<const TensorType> ops, const NodeAttrs& at) {
  const std::string_view name = op_name(op);
  const auto& perm = at.ints<"dims">();
  const size_t rank = ops[0].shape.size();
  LAZYRT_CHECK(perm.size() == rank, name, ": ", perm.size(), " dims given for a tensor of rank ",
               rank);
  std::vector<bool> seen(rank, false);
  Shape out(rank);
  for (size_t i = 0; i < rank; ++i) {
    LAZYRT_CHECK(perm[i] >= 0 && perm[i] < static_cast<int64_t>(rank) && !seen[perm[i]], name,
                 ": dims ", shape_str(perm), " are not a permutation of rank ", rank);
    seen[perm[i]] = true;
    out[i] = ops[0].shape[perm[i]];
  }
  return single_result(ops[0].dtype, std::move(out));
}

std::vector<TensorType> Reshape(OpKind op, std::span<const TensorType> ops, const NodeAttrs& at) {
  const std::string_view name = op_name(op);
  const auto& s = at.ints<"shape">();
  check_shape_valid(name, s);
  LAZYRT_CHECK(shape_numel(s) == ops[0].numel(), name, ": cannot reshape ",
               type_str(ops[0]), " to ", shape_str(s), " (element counts differ)");
  return single_result(ops[0].dtype, std::move(s));
}

std::vector<TensorType> Expand(OpKind op, std::span<const TensorType> ops, const NodeAttrs& at) {
  const std::string_view name = op_name(op);
  const auto& s = at.ints<"shape">();
  const auto& in = ops[0].shape;
  LAZYRT_CHECK(s.size() >= in.size(), name, ": cannot expand ", shape_str(in), " to ",
               shape_str(s), " (fewer dims)");
  for (size_t i = 0; i < in.size(); ++i) {
    int64_t target = s[s.size() - in.size() + i];
    LAZYRT_CHECK(in[i] == target || in[i] == 1, name, ": cannot expand ", shape_str(in),
                 " to ", shape_str(s));
  }
  check_shape_valid(name, s);
  return single_result(ops[0].dtype, std::move(s));
}

std::vector<TensorType> Random(OpKind op, std::span<const TensorType> ops, const NodeAttrs& at) {
  const std::string_view name = op_name(op);
  for (const auto& t : ops)
    LAZYRT_CHECK(t.dtype == DType::i64 && t.shape.empty(), name,
                 ": seed and offset must be i64 scalars, got ", types_str(ops));
  const int64_t distribution = at.i<"distribution">();
  const DType dtype = at.dtype<"dtype">();
  const Shape& shape = at.ints<"shape">();
  LAZYRT_CHECK(distribution == 0 || distribution == 1, name, ": unknown distribution ",
               distribution);
  LAZYRT_CHECK(is_floating(dtype), name, ": random values must be floating, got ",
               dtype_name(dtype));
  check_shape_valid(name, shape);
  return single_result(dtype, std::move(shape));
}

std::vector<TensorType> Iota(OpKind op, std::span<const TensorType>, const NodeAttrs& at) {
  const std::string_view name = op_name(op);
  const Shape& shape = at.ints<"shape">();
  LAZYRT_CHECK(shape.size() == 1, name, ": the shape must have one dim, got ", shape_str(shape));
  check_shape_valid(name, shape);
  return single_result(at.dtype<"dtype">(), std::move(shape));
}

std::vector<TensorType> Check(OpKind op, std::span<const TensorType> ops, const NodeAttrs& at) {
  const std::string_view name = op_name(op);
  LAZYRT_CHECK(ops[1].dtype == DType::b8, name, ": the condition must be b8, got ", type_str(ops[1]));
  check_message(at.i<"what">());
  return single_result(ops[0]);
}

std::vector<TensorType> While(OpKind op, std::span<const TensorType> ops, const NodeAttrs& at) {
  const std::string_view name = op_name(op);
  const int64_t carries = at.i<"carries">();
  LAZYRT_CHECK(carries >= 0 && carries <= static_cast<int64_t>(ops.size()), name, ": ",
               carries, " carries but ", ops.size(), " operands");
  return std::vector<TensorType>(ops.begin(), ops.begin() + carries);
}

std::vector<TensorType> Scan(OpKind op, std::span<const TensorType> ops, const NodeAttrs& at) {
  const std::string_view name = op_name(op);
  const int64_t carries = at.i<"carries">(), xs = at.i<"xs">(), length = at.i<"length">();
  LAZYRT_CHECK(carries >= 0 && xs >= 0 && carries + xs <= static_cast<int64_t>(ops.size()), name,
               ": ", carries, " carries and ", xs, " stacked inputs but ", ops.size(), " operands");
  // scan_vjp's length -1: the rows are counted when it runs, by its last operand (an i64
  // scalar); then nothing is stacked.
  const bool counted = op == OpKind::ScanVjp && length == -1;
  LAZYRT_CHECK(length >= 0 || counted, name, ": negative length ", length);
  if (counted) {
    const TensorType count{DType::i64, Shape{}};
    LAZYRT_CHECK(xs == 0 && at.ints<"ys_dtypes">().empty() && carries < static_cast<int64_t>(ops.size()) &&
                     ops.back() == count,
                 name, ": a length counted when it runs (-1) needs no stacked inputs or outputs and "
                 "an i64 scalar last operand, got ", types_str(ops));
  }
  for (int64_t k = carries; k < carries + xs; ++k)
    LAZYRT_CHECK(!ops[k].shape.empty() && ops[k].shape[0] == length, name, ": stacked input ",
                 k - carries, " is ", type_str(ops[k]), ", expected ", length, " rows");
  std::vector<TensorType> out(ops.begin(), ops.begin() + carries);
  const Shape& dtypes = at.ints<"ys_dtypes">();
  const Shape& shapes = at.ints<"ys_shapes">();
  size_t pos = 0;
  for (int64_t d : dtypes) {
    LAZYRT_CHECK(d >= 0 && d <= static_cast<int64_t>(DType::b8), name, ": bad dtype ", d);
    LAZYRT_CHECK(pos < shapes.size() && shapes[pos] >= 0 &&
                     static_cast<size_t>(shapes[pos]) < shapes.size() - pos,
                 name, ": ys_shapes ", shape_str(shapes), " does not describe ", dtypes.size(),
                 " outputs");
    Shape row{length};
    row.insert(row.end(), shapes.begin() + static_cast<int64_t>(pos) + 1,
               shapes.begin() + static_cast<int64_t>(pos) + 1 + shapes[pos]);
    pos += 1 + static_cast<size_t>(shapes[pos]);
    check_shape_valid(name, row);
    out.push_back({static_cast<DType>(d), std::move(row)});
  }
  LAZYRT_CHECK(pos == shapes.size(), name, ": ys_shapes ", shape_str(shapes), " has ",
               shapes.size() - pos, " values left over");
  return out;
}

std::vector<TensorType> Fusion(OpKind op, std::span<const TensorType> ops, const NodeAttrs& at) {
  const std::string_view name = op_name(op);
  const Shape& shape = at.ints<"shape">();
  const int64_t reduced = at.i<"reduced">();
  LAZYRT_CHECK(reduced >= 0 && reduced <= static_cast<int64_t>(shape.size()), name, ": reduced ", reduced,
               " out of range for ", shape_str(shape));
  const FusionRows rows = fusion_rows(shape, reduced);
  LAZYRT_CHECK(reduced == 0 || rows.row >= 2, name, ": a row of ", rows.row, " elements (", shape_str(shape),
               ", reduced ", reduced, "); it needs at least 2");
  for (const TensorType& t : ops)
    LAZYRT_CHECK(broadcasts_to(t.shape, shape) || (reduced > 0 && broadcasts_to(t.shape, rows.drop)), name,
                 ": operand ", type_str(t), " does not broadcast to ", shape_str(shape),
                 reduced > 0 ? str_cat(" or to ", shape_str(rows.drop)) : std::string());
  const std::vector<int64_t>& dtypes = at.ints<"dtypes">();
  const std::vector<int64_t>& per_row = at.ints<"per_row">();
  LAZYRT_CHECK(per_row.size() == dtypes.size(), name, ": ", per_row.size(), " per_row forms for ",
               dtypes.size(), " results");
  std::vector<TensorType> out;
  for (size_t j = 0; j < dtypes.size(); ++j) {
    const int64_t d = dtypes[j], form = per_row[j];
    LAZYRT_CHECK(d >= 0 && d <= static_cast<int64_t>(DType::b8), name, ": bad dtype ", d);
    LAZYRT_CHECK(form == 0 || (reduced > 0 && (form == 1 || form == 2)), name, ": bad per_row form ", form,
                 " (reduced ", reduced, ")");
    out.push_back({static_cast<DType>(d), form == 0 ? shape : form == 1 ? rows.keep : rows.drop});
  }
  return out;
}

std::vector<TensorType> Collective(OpKind op, std::span<const TensorType> ops, const NodeAttrs& at) {
  const std::string_view name = op_name(op);
  const TensorType token{DType::b8, Shape{}};
  LAZYRT_CHECK(ops[1] == token, name, ": operand 1 must be the ordering token, a b8 scalar, got ",
               type_str(ops[1]));
  const int64_t world = at.i<"world">();
  LAZYRT_CHECK(world >= 1, name, ": the group's size must be at least 1, got ", world);
  LAZYRT_CHECK(at.i<"group">() >= 0, name, ": bad group id ", at.i<"group">());
  TensorType out = ops[0];
  if (op == OpKind::AllReduce || op == OpKind::ReduceScatter) {
    const std::string_view reduce = reduce_op_name(at.i<"reduce">());
    LAZYRT_CHECK(ops[0].dtype != DType::b8, name, ": does not take b8 tensors, got ", type_str(ops[0]));
    if (static_cast<ReduceOp>(at.i<"reduce">()) == ReduceOp::Mean)
      LAZYRT_CHECK(is_floating(ops[0].dtype), name, ": op=\"", reduce,
                   "\" expects a floating tensor (f32, f64, bf16, f16), got ", type_str(ops[0]));
  }
  if (op == OpKind::AllGather || op == OpKind::ReduceScatter) {
    LAZYRT_CHECK(!ops[0].shape.empty(), name, ": works along dim 0 and takes a tensor of rank >= 1, got ",
                 type_str(ops[0]));
    if (op == OpKind::AllGather) {
      LAZYRT_CHECK(ops[0].shape[0] <= std::numeric_limits<int64_t>::max() / world, name, ": ",
                   type_str(ops[0]), " gathered from ", world, " ranks is too large");
      out.shape[0] = ops[0].shape[0] * world;
    } else {
      LAZYRT_CHECK(ops[0].shape[0] % world == 0, name, ": dim 0 of ", type_str(ops[0]),
                   " must divide into the group's ", world, " ranks");
      out.shape[0] = ops[0].shape[0] / world;
    }
  }
  if (op == OpKind::Broadcast)
    LAZYRT_CHECK(at.i<"src">() >= 0 && at.i<"src">() < world, name, ": src ", at.i<"src">(),
                 " is not a rank of a group of size ", world);
  return {out, token};
}

}  // namespace rules

std::vector<TensorType> infer_types(OpKind op, std::span<const TensorType> ops, const Attrs& a) {
  const OpInfo& info = op_info(op);
  LAZYRT_CHECK(info.operands < 0 || static_cast<int>(ops.size()) == info.operands, info.name,
               ": expects ", info.operands, " operands, got ", ops.size());
  std::vector<TensorType> types = info.rule(op, ops, NodeAttrs(op, a));
  // Every result must be addressable: its byte count a checked product (TensorType::bytes()).
  for (const TensorType& t : types) {
    try {
      (void)t.bytes();
    } catch (const Error& e) {
      throw Error(detail::str_cat(op_name(op), ": ", e.what()));
    }
  }
  return types;
}

ValueRef Graph::add(OpKind op, std::vector<ValueRef> operands, Attrs attrs) {
  std::vector<TensorType> in;
  in.reserve(operands.size());
  for (ValueRef v : operands) in.push_back(type(v));
  Node n;
  n.op = op;
  n.results = infer_types(op, in, attrs);
  n.operands = std::move(operands);
  n.attrs = std::move(attrs);
  nodes.push_back(std::move(n));
  return {static_cast<int32_t>(nodes.size() - 1), 0};
}

ValueRef Graph::add_parameter(TensorType type) {
  Node n;
  n.op = OpKind::Parameter;
  n.attrs = {num_params++};
  n.results = {std::move(type)};
  nodes.push_back(std::move(n));
  return {static_cast<int32_t>(nodes.size() - 1), 0};
}

ValueRef Graph::add_full(double value, Shape shape, DType dtype) {
  return add(OpKind::Full, {}, {value, std::move(shape), dtype});
}

}  // namespace lazyrt::ir
