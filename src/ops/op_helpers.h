// Internal helpers of the public tensor ops (src/ops/*.cpp): recording IR ops through apply(),
// PyTorch's type promotion, and dim handling. Defined in tensor_ops.cpp. Nothing here is part
// of the public API.
#pragma once

#include <initializer_list>
#include <optional>
#include <span>
#include <vector>

#include "ir/graph.h"
#include "lazyrt/tensor.h"
#include "trace/lazy_tensor.h"

namespace lazyrt::detail {

/// The tensor's state; throws naming `what` when the tensor is undefined.
trace::TensorImpl& impl_of(const Tensor& t, const char* what = "tensor");

/// The tensor's value as an operand of a new node. Inside a loop body, a tensor that requires
/// grad from outside becomes one of the loop's differentiable inputs.
trace::LazyValue value_of(const Tensor& t);

/// Records one op of the table over these tensors, and for autograd when it must. Every IR op
/// a public op builds goes through here.
Tensor apply(ir::OpKind op, std::span<const Tensor> inputs, ir::Attrs attrs = {});
inline Tensor apply(ir::OpKind op, std::initializer_list<Tensor> inputs, ir::Attrs attrs = {}) {
  return apply(op, std::span<const Tensor>(inputs.begin(), inputs.size()), std::move(attrs));
}

/// What an in-place op does to `self` once it has its new value `v` (of self's type): self holds
/// v's value and history (a leaf stays a leaf; a non-leaf given an untracked value loses its).
/// Views are the caller's business (views.h).
void rebind_value(trace::TensorImpl& self, const Tensor& v);

/// self with the elements of self[starts:ends:steps] (normalized bounds, one per dim) replaced
/// by `value`: the inverse of a slice.
Tensor slice_scatter(const Tensor& self, const std::vector<int64_t>& starts, const std::vector<int64_t>& ends,
                     const std::vector<int64_t>& steps, const Tensor& value);

/// t as `to` (t itself when it already has that dtype).
Tensor cast_to(const Tensor& t, DType to);

/// A constant of the graph (a scalar unless a shape is given).
Tensor constant_tensor(double value, DType dtype, Shape shape = {});

/// PyTorch's result_type: operands are ranked tensors with dims, then zero-dim tensors, then
/// plain numbers. A lower rank changes the result only when it brings a higher category
/// (bool < integer < floating). Add every operand, then read result().
struct Promotion {
  std::optional<DType> dim, zero, wrapped;

  static std::optional<DType> merge(std::optional<DType> a, DType b);
  void add(const Tensor& t);
  void add(Scalar s);
  static std::optional<DType> combine(std::optional<DType> higher, std::optional<DType> lower);
  DType result() const;
};

DType result_type(const Tensor& a, const Tensor& b);
DType result_type(const Tensor& a, Scalar b);

/// op(a, b) with both operands cast to `compute`.
Tensor binary(ir::OpKind op, const Tensor& a, const Tensor& b, DType compute);
/// op(a, b) (or op(b, a) when scalar_first) with a cast to `compute` and b a constant of it.
Tensor binary_scalar(ir::OpKind op, const Tensor& a, Scalar b, DType compute, bool scalar_first);
/// An arithmetic op with PyTorch's promotion (true division always floating).
Tensor arith(ir::OpKind op, const Tensor& a, const Tensor& b);
Tensor arith(ir::OpKind op, const Tensor& a, Scalar b, bool scalar_first = false);

Tensor unary(ir::OpKind op, const Tensor& a);
/// A floating unary op: integer and bool inputs compute in f32, as in PyTorch.
Tensor unary_float(ir::OpKind op, const Tensor& a);

/// d wrapped into [0, rank) (a 0-dim tensor takes -1 and 0); throws naming `op` and the shape.
int64_t wrap_dim(int64_t d, const Shape& shape, const char* op);
/// The reduction dims of a call, wrapped, sorted and checked for duplicates; empty means all.
std::vector<int64_t> reduce_dims(const Tensor& a, std::vector<int64_t> dims, const char* op);

/// The dtype a composite op computes in: f32 for bf16 and f16, the dtype itself otherwise. A
/// composite of 16-bit tensors computes in f32 and rounds its result once, as torch's kernels
/// do; rounding each step to 16 bits would lose several bits.
DType opmath_type(DType d);

/// Autocast (amp.h): t in the autocast dtype for ops that run in lower precision (matmul,
/// conv), or in f32 for ops that need the range (reductions, softmax, losses); t itself when
/// autocast is off or t is not floating.
Tensor autocast_lower(const Tensor& t);
Tensor autocast_f32(const Tensor& t);

}  // namespace lazyrt::detail
