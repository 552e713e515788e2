// Result rules of the data-movement, indexing and NN ops (slice, pad, flip, concat, the
// index_select / gather / scatter family, conv2d and pooling with their backward ops).
// Called from infer_types; like every rule, they throw lazyrt::Error naming the op and the
// types when the operands do not fit, before anything is recorded.
//
// Ops whose IR name is the public name (slice, gather, conv2d, ...) report user errors from
// here; the public ops only normalize arguments (wrap dims, clamp bounds) before recording.
#include <algorithm>

#include "ir/graph.h"
#include "ir/rules.h"
#include "util/check.h"

namespace lazyrt::ir {
namespace {

using lazyrt::detail::str_cat;

int64_t rank_of(const TensorType& t) { return static_cast<int64_t>(t.shape.size()); }

void check_rank_attr(std::string_view op, std::string_view attr, const std::vector<int64_t>& v,
                     const TensorType& t) {
  LAZYRT_CHECK(static_cast<int64_t>(v.size()) == rank_of(t), op, ": ", attr, " has ", v.size(),
               " entries for a tensor ", type_str(t), " of rank ", rank_of(t));
}

void check_dim(std::string_view op, int64_t dim, const TensorType& t) {
  LAZYRT_CHECK(dim >= 0 && dim < rank_of(t), op, ": dim ", dim, " out of range for ", type_str(t));
}

void check_index_dtype(std::string_view op, const TensorType& index, bool allow_i32) {
  if (allow_i32) {
    LAZYRT_CHECK(index.dtype == DType::i64 || index.dtype == DType::i32, op,
                 ": expects an i32 or i64 index, got ", type_str(index));
  } else {
    LAZYRT_CHECK(index.dtype == DType::i64, op, ": expects an i64 index, got ", type_str(index));
  }
}

// Size arithmetic that must fit in int64: a lazyrt::Error naming the op when it does not
// (attributes such as padding or dilation come from users, and from cache entries).
struct Sizes {
  std::string_view op;
  int64_t mul(int64_t a, int64_t b) const {
    int64_t r;
    LAZYRT_CHECK(!__builtin_mul_overflow(a, b, &r), op, ": size arithmetic overflows (", a, " * ", b, ")");
    return r;
  }
  int64_t add(int64_t a, int64_t b) const {
    int64_t r;
    LAZYRT_CHECK(!__builtin_add_overflow(a, b, &r), op, ": size arithmetic overflows (", a, " + ", b, ")");
    return r;
  }
};

// Two entries, each at least `min`.
void check_pair(std::string_view op, std::string_view what, const std::vector<int64_t>& v,
                int64_t min) {
  LAZYRT_CHECK(v.size() == 2, op, ": ", what, " needs 2 values, got ", shape_str(v));
  LAZYRT_CHECK(v[0] >= min && v[1] >= min, op, ": ", what, " must be ",
               min > 0 ? "positive" : "non-negative", ", got ", shape_str(v));
}

}  // namespace

namespace rules {

// ---- data movement ---------------------------------------------------------------------------

std::vector<TensorType> Slice(OpKind kind, std::span<const TensorType> ops, const NodeAttrs& a) {
  const std::string_view op = op_name(kind);
  const TensorType& x = ops[0];
  const auto& starts = a.ints<"starts">();
  const auto& ends = a.ints<"ends">();
  const auto& steps = a.ints<"steps">();
  check_rank_attr(op, "starts", starts, x);
  check_rank_attr(op, "ends", ends, x);
  check_rank_attr(op, "steps", steps, x);
  Shape out(x.shape.size());
  for (size_t d = 0; d < x.shape.size(); ++d) {
    LAZYRT_CHECK(steps[d] > 0, op, ": step must be positive, got ", steps[d], " for dim ", d);
    LAZYRT_CHECK(0 <= starts[d] && starts[d] <= ends[d] && ends[d] <= x.shape[d], op,
                 ": range [", starts[d], ", ", ends[d], ") of dim ", d, " is not within ",
                 type_str(x));
    const int64_t span = ends[d] - starts[d];  // ceil(span / step), without overflowing
    out[d] = span / steps[d] + (span % steps[d] != 0 ? 1 : 0);
  }
  return single_result(x.dtype, std::move(out));
}

std::vector<TensorType> Pad(OpKind kind, std::span<const TensorType> ops, const NodeAttrs& a) {
  const std::string_view op = op_name(kind);
  const TensorType& x = ops[0];
  const auto& low = a.ints<"low">();
  const auto& high = a.ints<"high">();
  const auto& interior = a.ints<"interior">();
  check_rank_attr(op, "low", low, x);
  check_rank_attr(op, "high", high, x);
  check_rank_attr(op, "interior", interior, x);
  Shape out(x.shape.size());
  const Sizes z{op};
  for (size_t d = 0; d < x.shape.size(); ++d) {
    const int64_t n = x.shape[d];
    LAZYRT_CHECK(interior[d] >= 0, op, ": interior padding must be non-negative, got ",
                 interior[d]);
    out[d] = z.add(z.add(z.add(low[d], high[d]), n), z.mul(std::max<int64_t>(n - 1, 0), interior[d]));
    LAZYRT_CHECK(out[d] >= 0, op, ": padding (", low[d], ", ", high[d], ") of dim ", d,
                 " of ", type_str(x), " gives a negative size ", out[d]);
  }
  return single_result(x.dtype, std::move(out));
}

std::vector<TensorType> Flip(OpKind kind, std::span<const TensorType> ops, const NodeAttrs& a) {
  const std::string_view op = op_name(kind);
  const TensorType& x = ops[0];
  const auto& dims = a.ints<"dims">();
  for (size_t k = 0; k < dims.size(); ++k) {
    check_dim(op, dims[k], x);
    LAZYRT_CHECK(k == 0 || dims[k] > dims[k - 1], op, ": dims must be sorted and unique, got ",
                 shape_str(dims));
  }
  return {x};
}

std::vector<TensorType> Concat(OpKind kind, std::span<const TensorType> ops, const NodeAttrs& a) {
  const std::string_view op = op_name(kind);
  LAZYRT_CHECK(!ops.empty(), op, ": expects at least one operand");
  const int64_t dim = a.i<"dim">();
  const TensorType& first = ops[0];
  check_dim(op, dim, first);
  Shape out = first.shape;
  out[dim] = 0;
  for (size_t k = 0; k < ops.size(); ++k) {
    const TensorType& t = ops[k];
    bool fits = t.dtype == first.dtype && t.shape.size() == first.shape.size();
    for (size_t d = 0; fits && d < t.shape.size(); ++d)
      fits = static_cast<int64_t>(d) == dim || t.shape[d] == first.shape[d];
    LAZYRT_CHECK(fits, op, ": operands must have one dtype and equal sizes except in dim ", dim,
                 ": operand 0 is ", type_str(first), ", operand ", k, " is ", type_str(t));
    out[dim] += t.shape[dim];
  }
  return single_result(first.dtype, std::move(out));
}

// ---- indexing --------------------------------------------------------------------------------

std::vector<TensorType> IndexSelect(OpKind kind, std::span<const TensorType> ops, const NodeAttrs& a) {
  const std::string_view op = op_name(kind);
  const TensorType& x = ops[0];
  const TensorType& index = ops[1];
  const int64_t dim = a.i<"dim">();
  check_dim(op, dim, x);
  check_index_dtype(op, index, true);
  LAZYRT_CHECK(index.shape.size() <= 1, op, ": the index must be a vector, got ", type_str(index));
  Shape out = x.shape;
  out[dim] = index.numel();
  return single_result(x.dtype, std::move(out));
}

std::vector<TensorType> Gather(OpKind kind, std::span<const TensorType> ops, const NodeAttrs& a) {
  const std::string_view op = op_name(kind);
  const TensorType& x = ops[0];
  const TensorType& index = ops[1];
  const int64_t dim = a.i<"dim">();
  check_dim(op, dim, x);
  check_index_dtype(op, index, false);
  LAZYRT_CHECK(index.shape.size() == x.shape.size(), op,
               ": the index must have as many dims as the input, got ", types_str(ops));
  for (size_t d = 0; d < x.shape.size(); ++d)
    LAZYRT_CHECK(static_cast<int64_t>(d) == dim || index.shape[d] <= x.shape[d], op,
                 ": expected index ", shape_str(index.shape), " to be no larger than input ",
                 shape_str(x.shape), " apart from dim ", dim);
  return single_result(x.dtype, index.shape);
}

std::vector<TensorType> Scatter(OpKind kind, std::span<const TensorType> ops, const NodeAttrs& a) {
  const std::string_view op = op_name(kind);
  const TensorType& x = ops[0];
  const TensorType& index = ops[1];
  const TensorType& src = ops[2];
  const int64_t dim = a.i<"dim">();
  check_dim(op, dim, x);
  check_index_dtype(op, index, false);
  LAZYRT_CHECK(src.dtype == x.dtype, op, ": self and src must have one dtype, got ",
               type_str(x), " and ", type_str(src));
  LAZYRT_CHECK(index.shape.size() == x.shape.size() && src.shape.size() == x.shape.size(), op,
               ": self, index and src must have the same number of dims, got ", types_str(ops));
  for (size_t d = 0; d < x.shape.size(); ++d)
    LAZYRT_CHECK((static_cast<int64_t>(d) == dim || index.shape[d] <= x.shape[d]) &&
                     index.shape[d] <= src.shape[d],
                 op, ": expected index ", shape_str(index.shape), " to be no larger than self ",
                 shape_str(x.shape), " apart from dim ", dim, " and no larger than src ",
                 shape_str(src.shape));
  return {x};
}

std::vector<TensorType> IndexAdd(OpKind kind, std::span<const TensorType> ops, const NodeAttrs& a) {
  const std::string_view op = op_name(kind);
  const TensorType& x = ops[0];
  const TensorType& index = ops[1];
  const TensorType& src = ops[2];
  const int64_t dim = a.i<"dim">();
  check_dim(op, dim, x);
  check_index_dtype(op, index, true);
  LAZYRT_CHECK(index.shape.size() <= 1, op, ": the index must be a vector, got ", type_str(index));
  LAZYRT_CHECK(src.dtype == x.dtype, op, ": self and source must have one dtype, got ",
               type_str(x), " and ", type_str(src));
  Shape want = x.shape;
  want[dim] = index.numel();
  LAZYRT_CHECK(src.shape == want, op, ": expected source of shape ", shape_str(want), " (self ",
               shape_str(x.shape), " with dim ", dim, " of the index's length ", index.numel(),
               "), got ", shape_str(src.shape));
  return {x};
}

}  // namespace rules

namespace {

// ---- convolution -----------------------------------------------------------------------------

// Borrowed from the node's attributes: shape inference runs for every traced op.
struct ConvAttrs {
  const std::vector<int64_t>& stride;
  const std::vector<int64_t>& padding;
  const std::vector<int64_t>& dilation;
  int64_t groups;
};

// The output type of conv2d(input, weight), checking both as torch does.
TensorType conv_result(std::string_view op, const TensorType& x, const TensorType& w,
                       const ConvAttrs& c) {
  LAZYRT_CHECK(x.shape.size() == 4, op, ": expects a 4-D input [N, C, H, W], got ", type_str(x));
  LAZYRT_CHECK(w.shape.size() == 4, op, ": expects a 4-D weight [O, C / groups, kH, kW], got ",
               type_str(w));
  LAZYRT_CHECK(x.dtype == w.dtype, op, ": input and weight must have one dtype, got ",
               type_str(x), " and ", type_str(w));
  LAZYRT_CHECK(x.dtype != DType::b8, op, ": expects floating or integer tensors, got ", type_str(x));
  check_pair(op, "stride", c.stride, 1);
  check_pair(op, "padding", c.padding, 0);
  check_pair(op, "dilation", c.dilation, 1);
  LAZYRT_CHECK(c.groups > 0, op, ": groups must be positive, got ", c.groups);
  const Sizes z{op};
  const int64_t out_channels = w.shape[0];
  LAZYRT_CHECK(out_channels > 0 && out_channels % c.groups == 0, op, ": given groups=", c.groups,
               ", expected the weight's dim 0 to be a positive multiple of ", c.groups,
               ", got weight ", type_str(w));
  const int64_t in_channels = z.mul(w.shape[1], c.groups);
  LAZYRT_CHECK(x.shape[1] == in_channels, op, ": given groups=", c.groups,
               " and weight ", type_str(w), ", expected input ", type_str(x), " to have ",
               in_channels, " channels, but got ", x.shape[1]);
  Shape out{x.shape[0], out_channels, 0, 0};
  for (int k = 0; k < 2; ++k) {
    LAZYRT_CHECK(w.shape[2 + k] > 0, op, ": the weight's kernel is empty: ", type_str(w));
    const int64_t padded = z.add(x.shape[2 + k], z.mul(2, c.padding[k]));
    const int64_t span = z.add(z.mul(c.dilation[k], w.shape[2 + k] - 1), 1);
    LAZYRT_CHECK(padded >= span, op, ": the padded input size (", padded, " along dim ", 2 + k,
                 ") is smaller than the dilated kernel (", span, ") of weight ", type_str(w),
                 " (input ", type_str(x), ", padding ", shape_str(c.padding), ")");
    out[2 + k] = (padded - span) / c.stride[k] + 1;
  }
  return {x.dtype, out};
}

// conv2d and its two backward ops: stride, padding, dilation and groups in each (after the
// backward ops' input_size / weight_size).
ConvAttrs conv_attrs(const NodeAttrs& a) {
  return {a.ints<"stride">(), a.ints<"padding">(), a.ints<"dilation">(), a.i<"groups">()};
}

// ---- pooling ---------------------------------------------------------------------------------

// Borrowed from the node's attributes (or kUnitDilation).
struct PoolAttrs {
  const std::vector<int64_t>& kernel;
  const std::vector<int64_t>& stride;
  const std::vector<int64_t>& padding;
  const std::vector<int64_t>& dilation;
  bool ceil_mode;
};

// PyTorch's pooling_output_shape and pool2d_shape_check.
Shape pool_result(std::string_view op, const TensorType& x, const PoolAttrs& p) {
  LAZYRT_CHECK(x.shape.size() == 4 && x.shape[1] > 0 && x.shape[2] > 0 && x.shape[3] > 0, op,
               ": expects a 4-D input [N, C, H, W] with non-empty C, H, W, got ", type_str(x));
  check_pair(op, "kernel_size", p.kernel, 1);
  check_pair(op, "stride", p.stride, 1);
  check_pair(op, "padding", p.padding, 0);
  check_pair(op, "dilation", p.dilation, 1);
  Shape out{x.shape[0], x.shape[1], 0, 0};
  for (int k = 0; k < 2; ++k) {
    LAZYRT_CHECK(p.padding[k] <= p.kernel[k] / 2, op,
                 ": padding should be at most half of the kernel size, got padding ",
                 shape_str(p.padding), " and kernel_size ", shape_str(p.kernel));
    const Sizes z{op};
    const int64_t in = x.shape[2 + k];
    const int64_t s = p.stride[k];
    const int64_t num = z.add(z.add(z.add(in, z.mul(2, p.padding[k])), -z.add(z.mul(p.dilation[k], p.kernel[k] - 1), 1)),
                              p.ceil_mode ? s - 1 : 0);
    int64_t o = (num >= 0 ? num / s : -((-num + s - 1) / s)) + 1;  // floor division
    // The last window must start inside the input or its left padding.
    if (p.ceil_mode && z.mul(o - 1, s) >= z.add(in, p.padding[k])) --o;
    out[2 + k] = o;
  }
  LAZYRT_CHECK(out[2] >= 1 && out[3] >= 1, op, ": input ", type_str(x), " with kernel_size ",
               shape_str(p.kernel), ", stride ", shape_str(p.stride), ", padding ",
               shape_str(p.padding), " gives output size ", out[2], " x ", out[3],
               ", which is too small");
  return out;
}

// max_pool2d and max_pool2d_backward.
PoolAttrs max_pool_attrs(const NodeAttrs& a) {
  return {a.ints<"kernel">(), a.ints<"stride">(), a.ints<"padding">(), a.ints<"dilation">(),
          a.b<"ceil_mode">()};
}
// avg_pool2d and avg_pool2d_backward (after its input_size). Avg pooling has no dilation.
const std::vector<int64_t> kUnitDilation{1, 1};
PoolAttrs avg_pool_attrs(const NodeAttrs& a) {
  return {a.ints<"kernel">(), a.ints<"stride">(), a.ints<"padding">(), kUnitDilation,
          a.b<"ceil_mode">()};
}

void check_float(std::string_view op, const TensorType& t) {
  LAZYRT_CHECK(is_floating(t.dtype), op, ": expects a floating tensor (f32, f64, bf16, f16), got ",
               type_str(t));
}

// Max pooling takes integers too, as torch 2.x does (1.13 took floating tensors only); not b8.
void check_max_poolable(std::string_view op, const TensorType& t) {
  LAZYRT_CHECK(is_floating(t.dtype) || t.dtype == DType::i32 || t.dtype == DType::i64, op,
               ": expects a floating or integer tensor (f32, f64, bf16, f16, i32, i64), got ", type_str(t));
}

void check_grad(std::string_view op, const TensorType& grad, const Shape& want, DType dtype) {
  LAZYRT_CHECK(grad.shape == want && grad.dtype == dtype, op, ": expected a gradient ",
               type_str({dtype, want}), ", got ", type_str(grad));
}

}  // namespace

namespace rules {

std::vector<TensorType> Conv2d(OpKind kind, std::span<const TensorType> ops, const NodeAttrs& a) {
  const std::string_view op = op_name(kind);
  return {conv_result(op, ops[0], ops[1], conv_attrs(a))};
}

std::vector<TensorType> Conv2dBackwardInput(OpKind kind, std::span<const TensorType> ops, const NodeAttrs& a) {
  const std::string_view op = op_name(kind);
  const TensorType input{ops[0].dtype, a.ints<"input_size">()};
  LAZYRT_CHECK(input.shape.size() == 4, op, ": input_size must have 4 entries");
  TensorType out = conv_result(op, input, ops[1], conv_attrs(a));
  check_grad(op, ops[0], out.shape, out.dtype);
  return {input};

}

std::vector<TensorType> Conv2dBackwardWeight(OpKind kind, std::span<const TensorType> ops, const NodeAttrs& a) {
  const std::string_view op = op_name(kind);
  const TensorType weight{ops[0].dtype, a.ints<"weight_size">()};
  LAZYRT_CHECK(weight.shape.size() == 4, op, ": weight_size must have 4 entries");
  TensorType out = conv_result(op, ops[1], weight, conv_attrs(a));
  check_grad(op, ops[0], out.shape, out.dtype);
  return {weight};

}

std::vector<TensorType> MaxPool2d(OpKind kind, std::span<const TensorType> ops, const NodeAttrs& a) {
  const std::string_view op = op_name(kind);
  check_max_poolable(op, ops[0]);
  return single_result(ops[0].dtype, pool_result(op, ops[0], max_pool_attrs(a)));
}

std::vector<TensorType> MaxPool2dIndices(OpKind kind, std::span<const TensorType> ops, const NodeAttrs& a) {
  const std::string_view op = op_name(kind);
  check_max_poolable(op, ops[0]);
  return single_result(DType::i64, pool_result(op, ops[0], max_pool_attrs(a)));
}

std::vector<TensorType> MaxPool2dBackward(OpKind kind, std::span<const TensorType> ops, const NodeAttrs& a) {
  const std::string_view op = op_name(kind);
  check_float(op, ops[1]);
  check_grad(op, ops[0], pool_result(op, ops[1], max_pool_attrs(a)), ops[1].dtype);
  return single_result(ops[1]);
}

std::vector<TensorType> AvgPool2d(OpKind kind, std::span<const TensorType> ops, const NodeAttrs& a) {
  const std::string_view op = op_name(kind);
  LAZYRT_CHECK(is_floating(ops[0].dtype) || ops[0].dtype == DType::i64, op,
  ": expects a floating or i64 tensor, got ", type_str(ops[0]));
  LAZYRT_CHECK(a.i<"divisor">() >= 0, op, ": divisor_override must be positive, got ",
  a.i<"divisor">());
  return single_result(ops[0].dtype, pool_result(op, ops[0], avg_pool_attrs(a)));
}

std::vector<TensorType> AvgPool2dBackward(OpKind kind, std::span<const TensorType> ops, const NodeAttrs& a) {
  const std::string_view op = op_name(kind);
  const TensorType input{ops[0].dtype, a.ints<"input_size">()};
  check_grad(op, ops[0], pool_result(op, input, avg_pool_attrs(a)), input.dtype);
  return {input};

}

}  // namespace rules

}  // namespace lazyrt::ir
