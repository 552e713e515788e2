// Linear algebra and neural-network ops with PyTorch's semantics. conv2d, max_pool2d and
// avg_pool2d are IR ops (the result rules check channels, groups and window sizes); these
// wrappers add what torch's functional forms add around them: unbatched inputs, a bias,
// one value standing for both spatial dims. bmm, addmm, embedding and one_hot are exact
// compositions of matmul, mul/add, index_select/where and eq.
#include <algorithm>

#include "ir/graph.h"
#include "lazyrt/tensor.h"
#include "ops/op_helpers.h"
#include "ops/views.h"
#include "trace/lazy_tensor.h"
#include "util/check.h"

namespace lazyrt {

using detail::apply;
using detail::cast_to;
using detail::constant_tensor;
using detail::impl_of;
using detail::opmath_type;
using ir::OpKind;

namespace {

std::string type_of(const Tensor& t) {
  return std::string(dtype_name(t.dtype())) + shape_str(t.shape());
}

// One value for both spatial dims, or one per dim.
std::vector<int64_t> pair_of(std::vector<int64_t> v, const char* op, const char* what) {
  LAZYRT_CHECK(v.size() == 1 || v.size() == 2, op, ": ", what,
               " takes one value or two (height, width), got ", shape_str(v));
  if (v.size() == 1) v.push_back(v[0]);
  return v;
}

// Pooling and convolution take [N, C, H, W], or [C, H, W] as a batch of one.
Tensor batched(const Tensor& input, const char* op) {
  impl_of(input, op);
  LAZYRT_CHECK(input.dim() == 3 || input.dim() == 4, op,
               ": expects a 3-D (unbatched) or 4-D (batched) input, got ", type_of(input));
  return input.dim() == 3 ? unsqueeze(input, 0) : input;
}
Tensor unbatched_like(const Tensor& out, const Tensor& input) {
  return input.dim() == 3 ? squeeze(out, 0) : out;
}

// The input of addmm / baddbmm broadcasts to the product's shape `out`.
void check_broadcasts_to(const Tensor& input, const Shape& out, const char* op) {
  const Shape& in = input.shape();
  bool fits = in.size() <= out.size();
  for (size_t i = 0; fits && i < in.size(); ++i) fits = in[i] == 1 || in[i] == out[out.size() - in.size() + i];
  LAZYRT_CHECK(fits, op, ": input ", type_of(input), " cannot be broadcast to the product's shape ", shape_str(out));
}

// beta * input + alpha * (x @ y), the arguments checked. The scalars in the operands' dtype:
// an integer addmm truncates them, as torch does. 16-bit operands compute in f32 and round once.
Tensor scaled_product_sum(const Tensor& input, const Tensor& x, const Tensor& y, Scalar beta, Scalar alpha) {
  const DType dtype = input.dtype(), t = opmath_type(dtype);
  Tensor product = matmul(cast_to(x, t), cast_to(y, t));
  if (alpha.to_double() != 1) product = product * constant_tensor(alpha.to_double(), t);
  if (beta.to_double() == 0) return cast_to(product, dtype);
  const Tensor input_t = cast_to(input, t);
  Tensor bias = beta.to_double() == 1 ? input_t : input_t * constant_tensor(beta.to_double(), t);
  return cast_to(bias + product, dtype);
}

}  // namespace

Tensor bmm(const Tensor& a, const Tensor& b) {
  impl_of(a, "bmm");
  impl_of(b, "bmm");
  LAZYRT_CHECK(a.dim() == 3 && b.dim() == 3, "bmm: expects 3-D tensors, got ", type_of(a),
               " and ", type_of(b));
  LAZYRT_CHECK(a.shape()[0] == b.shape()[0] && a.shape()[2] == b.shape()[1], "bmm: ",
               type_of(a), " and ", type_of(b), " do not fit: expected the second to be [",
               a.shape()[0], ", ", a.shape()[2], ", *]");
  return matmul(a, b);
}

Tensor addmm(const Tensor& input, const Tensor& mat1, const Tensor& mat2, Scalar beta,
             Scalar alpha) {
  impl_of(input, "addmm");
  impl_of(mat1, "addmm");
  impl_of(mat2, "addmm");
  LAZYRT_CHECK(mat1.dim() == 2 && mat2.dim() == 2, "addmm: expects 2-D mat1 and mat2, got ",
               type_of(mat1), " and ", type_of(mat2));
  LAZYRT_CHECK(mat1.shape()[1] == mat2.shape()[0], "addmm: mat1 and mat2 cannot be multiplied (",
               shape_str(mat1.shape()), " and ", shape_str(mat2.shape()), ")");
  LAZYRT_CHECK(input.dtype() == mat1.dtype() && mat1.dtype() == mat2.dtype(),
               "addmm: expects input, mat1 and mat2 of one dtype, got ", type_of(input), ", ",
               type_of(mat1), " and ", type_of(mat2));
  check_broadcasts_to(input, {mat1.shape()[0], mat2.shape()[1]}, "addmm");
  return scaled_product_sum(input, mat1, mat2, beta, alpha);
}

Tensor baddbmm(const Tensor& input, const Tensor& batch1, const Tensor& batch2, Scalar beta,
               Scalar alpha) {
  impl_of(input, "baddbmm");
  impl_of(batch1, "baddbmm");
  impl_of(batch2, "baddbmm");
  LAZYRT_CHECK(batch1.dim() == 3 && batch2.dim() == 3, "baddbmm: expects 3-D batch1 and batch2, got ",
               type_of(batch1), " and ", type_of(batch2));
  const Shape &b1 = batch1.shape(), &b2 = batch2.shape();
  LAZYRT_CHECK(b1[0] == b2[0] && b1[2] == b2[1], "baddbmm: batch1 ", type_of(batch1), " and batch2 ",
               type_of(batch2), " do not fit: expected batch2 to be [", b1[0], ", ", b1[2], ", *]");
  LAZYRT_CHECK(input.dtype() == batch1.dtype() && batch1.dtype() == batch2.dtype(),
               "baddbmm: expects input, batch1 and batch2 of one dtype, got ", type_of(input), ", ",
               type_of(batch1), " and ", type_of(batch2));
  check_broadcasts_to(input, {b1[0], b1[1], b2[2]}, "baddbmm");
  return scaled_product_sum(input, batch1, batch2, beta, alpha);
}

Tensor conv2d(const Tensor& input, const Tensor& weight, const Tensor& bias,
              std::vector<int64_t> stride, std::vector<int64_t> padding,
              std::vector<int64_t> dilation, int64_t groups) {
  Tensor x = batched(input, "conv2d");
  impl_of(weight, "conv2d");
  stride = pair_of(std::move(stride), "conv2d", "stride");
  padding = pair_of(std::move(padding), "conv2d", "padding");
  dilation = pair_of(std::move(dilation), "conv2d", "dilation");
  ir::Attrs attrs{stride, padding, dilation, groups};
  // The conv's own checks (channels, groups, sizes), then the bias's, before recording.
  const ir::TensorType out_type =
      ir::infer_types(OpKind::Conv2d, std::vector<ir::TensorType>{impl_of(x).type, impl_of(weight).type}, attrs)[0];
  if (bias.defined()) {
    const int64_t channels = out_type.shape[1];
    LAZYRT_CHECK(impl_of(bias).type.shape == Shape{channels}, "conv2d: given weight ",
                 type_of(weight), ", expected a bias of shape [", channels, "], got ",
                 type_of(bias));
    LAZYRT_CHECK(bias.dtype() == weight.dtype(), "conv2d: input ", type_of(input), " and bias ",
                 type_of(bias), " must have one dtype");
  }
  if (!bias.defined()) return unbatched_like(apply(OpKind::Conv2d, {x, weight}, std::move(attrs)), input);
  // With a bias, 16-bit tensors compute in f32 and round once (the kernel does so without).
  const DType t = opmath_type(x.dtype());
  Tensor out = apply(OpKind::Conv2d, {cast_to(x, t), cast_to(weight, t)}, std::move(attrs));
  out = out + reshape(cast_to(bias, t), {out_type.shape[1], 1, 1});
  return unbatched_like(cast_to(out, x.dtype()), input);
}

Tensor conv2d(const Tensor& input, const Tensor& weight, const Tensor& bias, std::vector<int64_t> stride,
              Padding padding, std::vector<int64_t> dilation, int64_t groups) {
  if (padding == Padding::Valid)
    return conv2d(input, weight, bias, std::move(stride), std::vector<int64_t>{0}, std::move(dilation), groups);
  stride = pair_of(std::move(stride), "conv2d", "stride");
  dilation = pair_of(std::move(dilation), "conv2d", "dilation");
  LAZYRT_CHECK(stride[0] == 1 && stride[1] == 1, "conv2d: padding='same' is not supported for strided convolutions");
  LAZYRT_CHECK(weight.defined() && weight.dim() == 4, "conv2d: expects a weight [O, C / groups, kH, kW], got ",
               weight.defined() ? type_of(weight) : std::string("an undefined tensor"));
  std::vector<int64_t> low(2), extra(2);
  for (size_t i = 0; i < 2; ++i) {
    const int64_t total = dilation[i] * (weight.shape()[2 + i] - 1);
    low[i] = total / 2;
    extra[i] = total - 2 * low[i];  // the odd one, at the end
  }
  Tensor x = extra[0] || extra[1] ? pad(input, {0, extra[1], 0, extra[0]}) : input;
  return conv2d(x, weight, bias, stride, low, dilation, groups);
}

namespace {

// max_pool2d's attributes, each checked and made a pair, for `op`'s nodes.
ir::Attrs max_pool_attrs(std::vector<int64_t> kernel_size, std::vector<int64_t> stride,
                         std::vector<int64_t> padding, std::vector<int64_t> dilation, bool ceil_mode,
                         const char* op) {
  kernel_size = pair_of(std::move(kernel_size), op, "kernel_size");
  stride = stride.empty() ? kernel_size : pair_of(std::move(stride), op, "stride");
  padding = pair_of(std::move(padding), op, "padding");
  dilation = pair_of(std::move(dilation), op, "dilation");
  return {kernel_size, stride, padding, dilation, ceil_mode};
}

}  // namespace

Tensor max_pool2d(const Tensor& input, std::vector<int64_t> kernel_size,
                  std::vector<int64_t> stride, std::vector<int64_t> padding,
                  std::vector<int64_t> dilation, bool ceil_mode) {
  Tensor x = batched(input, "max_pool2d");
  ir::Attrs a = max_pool_attrs(std::move(kernel_size), std::move(stride), std::move(padding),
                               std::move(dilation), ceil_mode, "max_pool2d");
  return unbatched_like(apply(OpKind::MaxPool2d, {x}, std::move(a)), input);
}

std::pair<Tensor, Tensor> max_pool2d_with_indices(const Tensor& input, std::vector<int64_t> kernel_size,
                                                  std::vector<int64_t> stride, std::vector<int64_t> padding,
                                                  std::vector<int64_t> dilation, bool ceil_mode) {
  Tensor x = batched(input, "max_pool2d_with_indices");
  ir::Attrs a = max_pool_attrs(std::move(kernel_size), std::move(stride), std::move(padding),
                               std::move(dilation), ceil_mode, "max_pool2d_with_indices");
  // Two nodes, so that a graph that never reads the indices (inference) drops their pass.
  Tensor indices = apply(OpKind::MaxPool2dIndices, {x}, a);
  Tensor out = apply(OpKind::MaxPool2d, {x}, std::move(a));
  return {unbatched_like(out, input), unbatched_like(indices, input)};
}

Tensor avg_pool2d(const Tensor& input, std::vector<int64_t> kernel_size,
                  std::vector<int64_t> stride, std::vector<int64_t> padding, bool ceil_mode,
                  bool count_include_pad, std::optional<int64_t> divisor_override) {
  Tensor x = batched(input, "avg_pool2d");
  kernel_size = pair_of(std::move(kernel_size), "avg_pool2d", "kernel_size");
  stride = stride.empty() ? kernel_size : pair_of(std::move(stride), "avg_pool2d", "stride");
  padding = pair_of(std::move(padding), "avg_pool2d", "padding");
  LAZYRT_CHECK(!divisor_override || *divisor_override != 0,
               "avg_pool2d: divisor_override must be non-zero");
  Tensor out = apply(OpKind::AvgPool2d, {x},
                     {kernel_size, stride, padding, ceil_mode, count_include_pad,
                      divisor_override.value_or(0)});
  return unbatched_like(out, input);
}

Tensor embedding(const Tensor& weight, const Tensor& indices, std::optional<int64_t> padding_idx) {
  impl_of(weight, "embedding");
  impl_of(indices, "embedding");
  LAZYRT_CHECK(weight.dim() == 2, "embedding: the weight must be 2-D [num_embeddings, dim], got ",
               type_of(weight));
  LAZYRT_CHECK(indices.dtype() == DType::i64 || indices.dtype() == DType::i32,
               "embedding: expects i32 or i64 indices, got ", type_of(indices));
  const int64_t num = weight.shape()[0];
  if (padding_idx) {
    LAZYRT_CHECK(*padding_idx >= -num && *padding_idx < num, "embedding: padding_idx ",
                 *padding_idx, " is not within the ", num, " embeddings of weight ",
                 type_of(weight));
    if (*padding_idx < 0) *padding_idx += num;
  }
  Shape shape = indices.shape();
  shape.push_back(weight.shape()[1]);
  Tensor out = reshape(index_select(weight, 0, reshape(indices, {-1})), shape);
  // Rows picked by padding_idx take no gradient: there the output is a detached copy of
  // itself, the same value cut off from the weight.
  if (padding_idx && out.requires_grad())
    out = where(unsqueeze(indices == *padding_idx, -1), detail::detached_value(out), out);
  return out;
}

Tensor one_hot(const Tensor& indices, int64_t num_classes) {
  impl_of(indices, "one_hot");
  LAZYRT_CHECK(indices.dtype() == DType::i64, "one_hot: expects an i64 index tensor, got ",
               type_of(indices));
  LAZYRT_CHECK(num_classes >= -1, "one_hot: num_classes must be -1 (inferred) or >= 0, got ",
               num_classes);
  if (num_classes == -1) {
    LAZYRT_CHECK(indices.numel() > 0,
                 "one_hot: cannot infer the number of classes from an empty tensor ",
                 type_of(indices));
    Tensor hi = amax(indices), lo = amin(indices);
    sync({hi, lo});
    // Exactly, as i64 (item() is a double: 2^63 - 1 would round out of range).
    const int64_t least = lo.to_vector<int64_t>()[0], most = hi.to_vector<int64_t>()[0];
    LAZYRT_CHECK(least >= 0, "one_hot: class values must be non-negative, got ", least);
    LAZYRT_CHECK(most < INT64_MAX, "one_hot: class value ", most, " leaves no room for a count of classes");
    num_classes = most + 1;
  }
  return cast(unsqueeze(indices, -1) == arange(num_classes, DType::i64), DType::i64);
}

}  // namespace lazyrt
