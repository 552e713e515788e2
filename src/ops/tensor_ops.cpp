// The public tensor API: PyTorch's semantics (type promotion, broadcasting, dim wrapping,
// in-place rules) expressed as IR ops recorded through apply(), which also records them for
// autograd. Every check runs before the first node is recorded, so a call that throws leaves
// no trace.
#include <algorithm>
#include <cstring>
#include <optional>

#include "lazyrt/tensor.h"
#include "autograd/autograd.h"
#include "backend/backend.h"
#include "ops/op_helpers.h"
#include "ops/views.h"
#include "trace/lazy_tensor.h"
#include "util/check.h"
#include "util/pool.h"
#include "util/dtype_dispatch.h"

namespace lazyrt {

using ir::OpKind;
using trace::LazyValue;
using trace::record;
using detail::str_cat;
using detail::detached_value;
using detail::make_view;
using detail::strides_of;
using detail::view_strides;

// Helpers shared with the other files of src/ops (declared in ops/op_helpers.h).
namespace detail {

trace::TensorImpl& impl_of(const Tensor& t, const char* what) {
  LAZYRT_CHECK(t.defined(), what, ": the tensor is undefined");
  return *trace::impl_of(t);
}

LazyValue value_of(const Tensor& t) {
  auto& s = impl_of(t);
  // A loop body reading a tensor that requires grad from outside: the loop takes it as an
  // input it may differentiate (loops.cpp).
  if (s.requires_grad && trace::current_scope() != 0 && s.scope != trace::current_scope())
    trace::note_grad_capture(trace::impl_of(t));
  return s.value();
}
Tensor wrap(LazyValue v) { return trace::tensor_of(trace::make_pending(std::move(v))); }

namespace {

// apply() for an op no gradient is recorded for, over its operands' values.
Tensor apply_untracked(OpKind op, std::vector<LazyValue> values, ir::Attrs attrs) {
  LazyValue v = record(op, std::move(values), std::move(attrs));
  // Under no_grad inside a body whose loop records gradients: the body's graph must say that
  // the value is kept out of them.
  if (autograd::in_recorded_body() && !autograd::grad_enabled() && is_floating(v.type().dtype))
    v = record(OpKind::StopGradient, {std::move(v)});
  return wrap(std::move(v));
}

}  // namespace

Tensor apply(OpKind op, std::span<const Tensor> inputs, ir::Attrs attrs) {
  std::vector<LazyValue> values = util::VectorStash<std::vector<LazyValue>>::take();
  values.reserve(inputs.size());
  for (const Tensor& t : inputs) values.push_back(value_of(t));
  if (!autograd::should_record(op, inputs)) return apply_untracked(op, std::move(values), std::move(attrs));
  Tensor out = wrap(record(op, std::move(values), attrs));
  // As in PyTorch, an integer or bool result (a cast, an index) does not require grad.
  if (is_floating(out.dtype())) autograd::record(out, op, inputs, std::move(attrs));
  return out;
}

Tensor cast_to(const Tensor& t, DType to) { return t.dtype() == to ? t : apply(OpKind::Cast, {t}, {to}); }

DType opmath_type(DType d) { return d == DType::bf16 || d == DType::f16 ? DType::f32 : d; }

Tensor constant_tensor(double value, DType dtype, Shape shape) {
  return wrap(trace::constant(value, dtype, std::move(shape)));
}

// ---- type promotion (PyTorch's result_type) ---------------------------------------------

std::optional<DType> Promotion::merge(std::optional<DType> a, DType b) {
  return a ? promote_types(*a, b) : b;
}
void Promotion::add(const Tensor& t) {
  const ir::TensorType& type = impl_of(t).type;
  if (type.shape.empty()) zero = merge(zero, type.dtype);
  else dim = merge(dim, type.dtype);
}
void Promotion::add(Scalar s) {
  DType d = s.kind() == Scalar::Kind::Float ? DType::f32
            : s.kind() == Scalar::Kind::Int ? DType::i64 : DType::b8;
  wrapped = merge(wrapped, d);
}
std::optional<DType> Promotion::combine(std::optional<DType> higher, std::optional<DType> lower) {
  if (!higher) return lower;
  if (!lower) return higher;
  if (is_floating(*higher)) return higher;
  if (*higher == DType::b8 || is_floating(*lower)) return promote_types(*higher, *lower);
  return higher;
}
DType Promotion::result() const { return combine(dim, combine(zero, wrapped)).value_or(DType::f32); }

DType result_type(const Tensor& a, const Tensor& b) {
  Promotion p;
  p.add(a);
  p.add(b);
  return p.result();
}
DType result_type(const Tensor& a, Scalar b) {
  Promotion p;
  p.add(a);
  p.add(b);
  return p.result();
}

Tensor binary(OpKind op, const Tensor& a, const Tensor& b, DType compute) {
  return apply(op, {cast_to(a, compute), cast_to(b, compute)});
}

Tensor binary_scalar(OpKind op, const Tensor& a, Scalar b, DType compute, bool scalar_first) {
  Tensor x = cast_to(a, compute);
  if (!autograd::should_record(op, std::span<const Tensor>(&x, 1))) {
    // The constant needs no tensor of its own: it goes into the graph as a value.
    std::vector<LazyValue> values = util::VectorStash<std::vector<LazyValue>>::take();
    values.push_back(value_of(x));
    values.push_back(trace::scalar_constant(b.to_double(), compute));
    if (scalar_first) std::swap(values[0], values[1]);
    return apply_untracked(op, std::move(values), {});
  }
  Tensor c = constant_tensor(b.to_double(), compute);
  return scalar_first ? apply(op, {c, x}) : apply(op, {x, c});
}

// Arithmetic ops: the promoted type; an integer one computed in f32 for true division (the
// ArithFloat rows of ops.def).
DType arith_type(OpKind op, DType promoted) {
  if (ir::op_info(op).api == ir::Api::ArithFloat && !is_floating(promoted)) return DType::f32;
  return promoted;
}

Tensor arith(OpKind op, const Tensor& a, const Tensor& b) {
  impl_of(a, ir::op_name(op).data());
  impl_of(b, ir::op_name(op).data());
  return binary(op, a, b, arith_type(op, result_type(a, b)));
}
Tensor arith(OpKind op, const Tensor& a, Scalar b, bool scalar_first) {
  impl_of(a, ir::op_name(op).data());
  return binary_scalar(op, a, b, arith_type(op, result_type(a, b)), scalar_first);
}

Tensor unary(OpKind op, const Tensor& a) { return apply(op, {a}); }

// exp, log, ...: integer and bool inputs compute in the default float type, as in PyTorch.
Tensor unary_float(OpKind op, const Tensor& a) {
  return apply(op, {is_floating(a.dtype()) ? a : cast_to(a, DType::f32)});
}

int64_t wrap_dim(int64_t d, const Shape& shape, const char* op) {
  const auto rank = static_cast<int64_t>(shape.size());
  const int64_t r = std::max<int64_t>(rank, 1);
  LAZYRT_CHECK(d >= -r && d < r, op, ": dim ", d, " out of range for a tensor of shape ",
               shape_str(shape), " (expected ", -r, " to ", r - 1, ")");
  return d < 0 ? d + r : d;
}

std::vector<int64_t> reduce_dims(const Tensor& a, std::vector<int64_t> dims, const char* op) {
  const int64_t rank = a.dim();
  if (dims.empty()) {
    for (int64_t d = 0; d < rank; ++d) dims.push_back(d);
    return dims;
  }
  for (auto& d : dims) d = wrap_dim(d, a.shape(), op);
  std::sort(dims.begin(), dims.end());
  LAZYRT_CHECK(std::adjacent_find(dims.begin(), dims.end()) == dims.end(), op,
               ": a dim appears more than once in ", shape_str(dims));
  if (rank == 0) dims.clear();  // dim 0 of a scalar names the scalar itself
  return dims;
}

Tensor reduce(OpKind op, const Tensor& a_in, std::vector<int64_t> dims, bool keepdim, const char* name) {
  impl_of(a_in, name);
  const Tensor a = op == OpKind::Sum || op == OpKind::Mean ? autocast_f32(a_in) : a_in;
  auto d = reduce_dims(a, std::move(dims), name);
  Tensor v = op == OpKind::Sum && !is_floating(a.dtype()) ? cast_to(a, DType::i64) : a;
  return apply(op, {v}, {d, keepdim});
}

// In place: the result must keep the tensor's shape and be castable to its dtype.
bool can_cast(DType from, DType to) {
  if (is_floating(from) && !is_floating(to)) return false;
  if (from != DType::b8 && to == DType::b8) return false;
  return true;
}

// Rebinds `self` to `result` (cast to self's dtype): the handle keeps its identity, and its
// autograd history becomes the result's.
void rebind_value(trace::TensorImpl& s, const Tensor& v) {
  s.set_ir(trace::impl_of(v)->value());
  if (trace::impl_of(v)->grad_fn) {
    s.grad_fn = trace::impl_of(v)->grad_fn;
    s.requires_grad = true;
  } else if (s.grad_fn) {  // a non-leaf given an untracked value no longer has a history
    s.grad_fn = nullptr;
    s.requires_grad = false;
  }  // a leaf stays a leaf, requiring grad or not (updates under NoGradGuard)
}

void rebind(Tensor& self, const Tensor& result) {
  auto& s = *trace::impl_of(self);
  rebind_value(s, cast_to(result, s.type.dtype));
  propagate_write(s);
}

void check_in_place(const Tensor& self, const char* op) {
  auto& s = impl_of(self, op);
  LAZYRT_CHECK(!(s.requires_grad && !s.grad_fn && autograd::grad_enabled()), op,
               ": a leaf tensor that requires grad (", ir::type_str(s.type),
               ") cannot be modified in place while gradients are recorded; use NoGradGuard");
  check_view_write(s, op);
}

void assign(Tensor& self, const Tensor& result, const char* op) {
  auto& s = impl_of(self, op);
  check_in_place(self, op);
  LAZYRT_CHECK(result.shape() == s.type.shape, op, ": the result's shape ",
               shape_str(result.shape()), " does not match the tensor's shape ",
               shape_str(s.type.shape), " (in-place ops cannot broadcast the tensor itself)");
  LAZYRT_CHECK(can_cast(result.dtype(), s.type.dtype), op, ": result type ",
               dtype_name(result.dtype()), " cannot be cast to the tensor's dtype ",
               dtype_name(s.type.dtype));
  rebind(self, result);
}

template <class T>
Tensor from_vector(const std::vector<T>& data, Shape shape, DType dtype) {
  for (int64_t d : shape) LAZYRT_CHECK(d >= 0, "tensor: negative dimension in shape ", shape_str(shape));
  LAZYRT_CHECK(static_cast<int64_t>(data.size()) == shape_numel(shape), "tensor: ", data.size(),
               " values given for shape ", shape_str(shape), " (", shape_numel(shape),
               " elements)");
  return from_blob(data.data(), std::move(shape), dtype);
}

}  // namespace detail

using namespace detail;

// ---- Tensor -------------------------------------------------------------------------------

Tensor::Tensor(std::shared_ptr<trace::TensorImpl> impl) : impl_(std::move(impl)) {}

const Shape& Tensor::shape() const { return impl_of(*this).type.shape; }
int64_t Tensor::dim() const { return static_cast<int64_t>(shape().size()); }
int64_t Tensor::numel() const { return shape_numel(shape()); }
int64_t Tensor::size(int64_t d) const { return shape()[wrap_dim(d, shape(), "size")]; }
DType Tensor::dtype() const { return impl_of(*this).type.dtype; }
bool Tensor::is_pending() const { return impl_of(*this).is_pending(); }

std::shared_ptr<void> Tensor::storage() const {
  const trace::TensorImpl& t = impl_of(*this);
  if (t.is_pending() || !t.data()) return nullptr;
  return std::shared_ptr<void>(t.data(), t.data()->data());
}

template <class T>
std::vector<T> Tensor::to_vector() const {
  constexpr DType want = std::is_same_v<T, float>     ? DType::f32
                         : std::is_same_v<T, double>  ? DType::f64
                         : std::is_same_v<T, int32_t> ? DType::i32
                         : std::is_same_v<T, int64_t> ? DType::i64
                                                      : DType::b8;
  auto& s = impl_of(*this, "to_vector");
  LAZYRT_CHECK(s.type.dtype == want, "to_vector<", dtype_name(want), ">: the tensor has dtype ",
               dtype_name(s.type.dtype), "; cast it first");
  const std::shared_ptr<const void> host = host_data();
  const int64_t n = s.type.numel();
  std::vector<T> out(static_cast<size_t>(n));
  if constexpr (std::is_same_v<T, bool>) {
    const bool* p = static_cast<const bool*>(host.get());
    for (int64_t i = 0; i < n; ++i) out[i] = p[i];
  } else {
    if (n) std::memcpy(out.data(), host.get(), static_cast<size_t>(n) * sizeof(T));
  }
  return out;
}
template std::vector<float> Tensor::to_vector<float>() const;
template std::vector<double> Tensor::to_vector<double>() const;
template std::vector<int32_t> Tensor::to_vector<int32_t>() const;
template std::vector<int64_t> Tensor::to_vector<int64_t>() const;
template std::vector<bool> Tensor::to_vector<bool>() const;

double Tensor::item() const {
  LAZYRT_CHECK(numel() == 1, "item: the tensor has ", numel(), " elements (shape ",
               shape_str(shape()), "), expected exactly one");
  auto& s = impl_of(*this, "item");
  const std::shared_ptr<const void> host = host_data();
  double v = 0;
  visit_dtype(s.type.dtype, [&](auto tag) {
    using T = decltype(tag);
    v = convert<double>(*static_cast<const T*>(host.get()));
  });
  return v;
}

std::shared_ptr<const void> Tensor::host_data() const {
  auto& s = impl_of(*this, "host_data");
  trace::sync_for_read({impl_});
  return backend::current().to_host(s.data());
}

Tensor& Tensor::add_(const Tensor& other, Scalar alpha) {
  assign(*this, add(*this, other, alpha), "add_");
  return *this;
}
Tensor& Tensor::mul_(const Tensor& other) {
  assign(*this, mul(*this, other), "mul_");
  return *this;
}
Tensor& Tensor::copy_(const Tensor& src) {
  auto& s = impl_of(*this, "copy_");
  impl_of(src, "copy_");
  check_in_place(*this, "copy_");
  Tensor v = cast_to(src, s.type.dtype);
  if (v.shape() != s.type.shape) {
    LAZYRT_CHECK(ir::broadcast_shapes(v.shape(), s.type.shape, "copy_") == s.type.shape,
                 "copy_: cannot copy a tensor of shape ", shape_str(src.shape()),
                 " into one of shape ", shape_str(s.type.shape));
    v = apply(OpKind::Expand, {v}, {s.type.shape});
  }
  rebind(*this, v);
  s.value_replaced();
  return *this;
}
Tensor& Tensor::zero_() {
  auto& s = impl_of(*this, "zero_");
  check_in_place(*this, "zero_");
  rebind(*this, constant_tensor(0, s.type.dtype, s.type.shape));
  s.value_replaced();
  return *this;
}

Tensor& Tensor::requires_grad_(bool requires_grad) {
  auto& s = impl_of(*this, "requires_grad_");
  LAZYRT_CHECK(!requires_grad || is_floating(s.type.dtype),
               "requires_grad_: only floating tensors can require gradients, got ",
               dtype_name(s.type.dtype));
  s.requires_grad = requires_grad;
  return *this;
}
bool Tensor::requires_grad() const { return impl_of(*this).requires_grad; }

Tensor Tensor::sum(std::vector<int64_t> dims, bool keepdim) const {
  return lazyrt::sum(*this, std::move(dims), keepdim);
}
Tensor Tensor::mean(std::vector<int64_t> dims, bool keepdim) const {
  return lazyrt::mean(*this, std::move(dims), keepdim);
}
Tensor Tensor::reshape(Shape shape) const { return lazyrt::reshape(*this, std::move(shape)); }
Tensor Tensor::transpose(int64_t d0, int64_t d1) const { return lazyrt::transpose(*this, d0, d1); }
Tensor Tensor::matmul(const Tensor& other) const { return lazyrt::matmul(*this, other); }
Tensor Tensor::to(DType dtype) const { return cast(*this, dtype); }

// ---- creation -------------------------------------------------------------------------------

Tensor from_blob(const void* data, Shape shape, DType dtype) {
  for (int64_t d : shape) LAZYRT_CHECK(d >= 0, "from_blob: negative dimension in shape ", shape_str(shape));
  ir::TensorType type{dtype, std::move(shape)};
  LAZYRT_CHECK(data != nullptr || type.bytes() == 0, "from_blob: null data for ", dtype_name(dtype),
               shape_str(type.shape));
  auto buf = backend::current().from_host(data, type.bytes());
  return trace::tensor_of(trace::make_data(std::move(type), std::move(buf)));
}

Tensor from_blob(void* data, Shape shape, DType dtype, std::function<void()> release, bool writable) {
  for (int64_t d : shape) LAZYRT_CHECK(d >= 0, "from_blob: negative dimension in shape ", shape_str(shape));
  ir::TensorType type{dtype, std::move(shape)};
  if (type.bytes() == 0) {
    if (release) release();
    return trace::tensor_of(trace::make_data(std::move(type), backend::current().allocate(0)));
  }
  LAZYRT_CHECK(data != nullptr, "from_blob: null data for ", dtype_name(dtype), shape_str(type.shape));
  LAZYRT_CHECK(reinterpret_cast<uintptr_t>(data) % dtype_size(dtype) == 0, "from_blob: data at ", data,
               " is not aligned for ", dtype_name(dtype));
  return trace::tensor_of(trace::make_data(std::move(type), runtime::adopt(data, type.bytes(), std::move(release), writable)));
}

Tensor tensor(const std::vector<float>& d, Shape s) { return from_vector(d, std::move(s), DType::f32); }
Tensor tensor(const std::vector<double>& d, Shape s) { return from_vector(d, std::move(s), DType::f64); }
Tensor tensor(const std::vector<int32_t>& d, Shape s) { return from_vector(d, std::move(s), DType::i32); }
Tensor tensor(const std::vector<int64_t>& d, Shape s) { return from_vector(d, std::move(s), DType::i64); }
Tensor tensor(const std::vector<bool>& d, Shape s) {
  std::vector<uint8_t> bytes(d.begin(), d.end());
  return from_vector(bytes, std::move(s), DType::b8);
}

namespace {
// Device data from doubles, each converted to `dtype` on the host.
Tensor data_from_doubles(const double* values, Shape shape, DType dtype) {
  ir::TensorType type{dtype, std::move(shape)};
  std::vector<char> host(type.bytes());
  const int64_t n = type.numel();
  for (int64_t i = 0; i < n; ++i)
    fill_elements(host.data() + static_cast<size_t>(i) * dtype_size(dtype), dtype, values[i], 1);
  auto buf = backend::current().from_host(host.data(), host.size());
  return trace::tensor_of(trace::make_data(std::move(type), std::move(buf)));
}
}  // namespace

Tensor tensor(std::initializer_list<double> values, Shape shape, DType dtype) {
  for (int64_t d : shape) LAZYRT_CHECK(d >= 0, "tensor: negative dimension in shape ", shape_str(shape));
  LAZYRT_CHECK(static_cast<int64_t>(values.size()) == shape_numel(shape), "tensor: ",
               values.size(), " values given for shape ", shape_str(shape), " (",
               shape_numel(shape), " elements)");
  return data_from_doubles(values.begin(), std::move(shape), dtype);
}

Tensor scalar_tensor(double value, DType dtype) { return data_from_doubles(&value, {}, dtype); }

Tensor full(Shape shape, Scalar value, DType dtype) {
  for (int64_t d : shape) LAZYRT_CHECK(d >= 0, "full: negative dimension in shape ", shape_str(shape));
  return constant_tensor(value.to_double(), dtype, std::move(shape));
}
Tensor zeros(Shape shape, DType dtype) { return full(std::move(shape), 0, dtype); }
Tensor ones(Shape shape, DType dtype) { return full(std::move(shape), 1, dtype); }
Tensor zeros_like(const Tensor& t) { return zeros(t.shape(), t.dtype()); }
Tensor ones_like(const Tensor& t) { return ones(t.shape(), t.dtype()); }

Tensor arange(int64_t n, DType dtype) {
  LAZYRT_CHECK(n >= 0, "arange: n must be >= 0, got ", n);
  // Lazy, as every op: the values are made when the graph runs.
  try {
    return apply(OpKind::Iota, {}, {Shape{n}, dtype});
  } catch (const Error& e) {
    throw Error(str_cat("arange: ", e.what()));
  }
}

Tensor Tensor::clone() const {
  const auto& s = impl_of(*this, "clone");
  // Through an op where gradients may flow: from a tensor that requires grad, or inside a loop
  // body that will be differentiated (where nothing requires grad while it is traced).
  if (is_floating(s.type.dtype) && (s.requires_grad || autograd::in_recorded_body())) return *this * 1.0;
  return detached_value(*this);
}

Tensor Tensor::detach() const {
  auto& s = impl_of(*this, "detach");
  Tensor t = detached_value(*this);
  make_view(*this, t, {trace::ViewStep::Kind::Detach, s.type.shape, {}, {}, {}, nullptr}, strides_of(s),
            s.storage_offset);
  return t;
}

bool Tensor::is_view() const { return static_cast<bool>(impl_of(*this, "is_view").view_of); }
std::vector<int64_t> Tensor::strides() const { return strides_of(impl_of(*this, "stride")); }
int64_t Tensor::storage_offset() const { return impl_of(*this, "storage_offset").storage_offset; }
bool Tensor::is_contiguous() const { return detail::is_contiguous(impl_of(*this, "is_contiguous")); }
Tensor Tensor::contiguous() const {
  if (is_contiguous()) return *this;
  return impl_of(*this).requires_grad ? *this * 1.0 : detached_value(*this);
}

void Tensor::set_data(const Tensor& value) {
  auto& s = impl_of(*this, "set_data");
  const auto& v = impl_of(value, "set_data");
  LAZYRT_CHECK(v.type == s.type, "set_data: the new value is ", ir::type_str(v.type), ", the tensor ",
               ir::type_str(s.type), " (lazyrt keeps a tensor's shape and dtype)");
  s.set_ir(value_of(detached_value(value)));
  s.view_of.reset();
  s.strides.clear();
  s.storage_offset = 0;
  detail::propagate_write(s);
}

// ---- elementwise ----------------------------------------------------------------------------

// The plain elementwise ops of the op table (its api column): one function per row.
#define LAZYRT_API_Public(Enum, name)
#define LAZYRT_API_Internal(Enum, name)
#define LAZYRT_API_Unary(Enum, name) \
  Tensor name(const Tensor& a) { return unary(OpKind::Enum, a); }
#define LAZYRT_API_UnaryFloat(Enum, name) \
  Tensor name(const Tensor& a) { return unary_float(OpKind::Enum, a); }
#define LAZYRT_API_Arith(Enum, name)                                                 \
  Tensor name(const Tensor& a, const Tensor& b) { return arith(OpKind::Enum, a, b); } \
  Tensor name(const Tensor& a, Scalar b) { return arith(OpKind::Enum, a, b); }
#define LAZYRT_API_ArithFloat(Enum, name) LAZYRT_API_Arith(Enum, name)
#define OP(Enum, name, operands, rule, flags, attrs, aten, api, grad) LAZYRT_API_##api(Enum, name)
#include "lazyrt/ops.def"
#undef OP
#undef LAZYRT_API_Public
#undef LAZYRT_API_Internal
#undef LAZYRT_API_Unary
#undef LAZYRT_API_UnaryFloat
#undef LAZYRT_API_Arith
#undef LAZYRT_API_ArithFloat


Tensor cast(const Tensor& a, DType dtype) {
  impl_of(a, "cast");
  return cast_to(a, dtype);
}

Tensor add(const Tensor& a, const Tensor& b, Scalar alpha) {
  if (alpha.to_double() == 1) return arith(OpKind::Add, a, b);
  DType t = result_type(a, b);
  LAZYRT_CHECK(is_floating(t) || alpha.kind() != Scalar::Kind::Float, "add: alpha ",
               alpha.to_double(), " is not an integer but the result dtype is ", dtype_name(t));
  return binary(OpKind::Add, a, binary_scalar(OpKind::Mul, b, alpha, t, false), t);
}
namespace {
// PyTorch refuses subtraction whenever a bool takes part in it.
void check_sub(bool bool_operand) {
  LAZYRT_CHECK(!bool_operand,
               "sub: subtraction with a b8 operand is not supported; use logical_xor or "
               "logical_not instead");
}
}  // namespace

Tensor sub(const Tensor& a, const Tensor& b, Scalar alpha) {
  check_sub(a.dtype() == DType::b8 || b.dtype() == DType::b8);
  if (alpha.to_double() == 1) return arith(OpKind::Sub, a, b);
  DType t = result_type(a, b);
  return binary(OpKind::Sub, a, binary_scalar(OpKind::Mul, b, alpha, t, false), t);
}
Tensor pow(const Tensor& a, const Tensor& b) { return arith(OpKind::Pow, a, b); }
Tensor pow(const Tensor& a, Scalar exponent) {
  // As torch 2.x: an exponent of True is the base itself, False gives ones, for a b8 base too
  // (which has no pow otherwise). For other bases that is what the power computes anyway.
  if (impl_of(a, "pow").type.dtype == DType::b8 && exponent.kind() == Scalar::Kind::Bool)
    return exponent.to_double() != 0 ? a.clone() : ones_like(a);
  // As torch: integers to negative integer powers are refused (the exponent is known here).
  LAZYRT_CHECK(is_floating(impl_of(a, "pow").type.dtype) || exponent.kind() == Scalar::Kind::Float ||
                   exponent.to_double() >= 0,
               "pow: integers to negative integer powers are not allowed (", dtype_name(a.dtype()),
               " tensor, exponent ", static_cast<int64_t>(exponent.to_double()), ")");
  return arith(OpKind::Pow, a, exponent);
}



Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  LAZYRT_CHECK(cond.dtype() == DType::b8, "where: the condition must be b8, got ",
               dtype_name(cond.dtype()));
  DType t = result_type(a, b);
  return apply(OpKind::Where, {cond, cast_to(a, t), cast_to(b, t)});
}

Tensor operator-(const Tensor& a) { return neg(a); }
Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
Tensor operator+(const Tensor& a, Scalar b) { return arith(OpKind::Add, a, b); }
Tensor operator-(const Tensor& a, Scalar b) {
  check_sub(a.dtype() == DType::b8 || b.kind() == Scalar::Kind::Bool);
  return arith(OpKind::Sub, a, b);
}
Tensor operator*(const Tensor& a, Scalar b) { return arith(OpKind::Mul, a, b); }
Tensor operator/(const Tensor& a, Scalar b) { return arith(OpKind::Div, a, b); }
Tensor operator+(Scalar a, const Tensor& b) { return arith(OpKind::Add, b, a, true); }
Tensor operator-(Scalar a, const Tensor& b) {
  check_sub(b.dtype() == DType::b8 || a.kind() == Scalar::Kind::Bool);
  return arith(OpKind::Sub, b, a, true);
}
Tensor operator*(Scalar a, const Tensor& b) { return arith(OpKind::Mul, b, a, true); }
Tensor operator/(Scalar a, const Tensor& b) { return arith(OpKind::Div, b, a, true); }
Tensor operator==(const Tensor& a, const Tensor& b) { return eq(a, b); }
Tensor operator!=(const Tensor& a, const Tensor& b) { return ne(a, b); }
Tensor operator<(const Tensor& a, const Tensor& b) { return lt(a, b); }
Tensor operator<=(const Tensor& a, const Tensor& b) { return le(a, b); }
Tensor operator>(const Tensor& a, const Tensor& b) { return gt(a, b); }
Tensor operator>=(const Tensor& a, const Tensor& b) { return ge(a, b); }
Tensor operator==(const Tensor& a, Scalar b) { return arith(OpKind::Eq, a, b); }
Tensor operator!=(const Tensor& a, Scalar b) { return arith(OpKind::Ne, a, b); }
Tensor operator<(const Tensor& a, Scalar b) { return arith(OpKind::Lt, a, b); }
Tensor operator<=(const Tensor& a, Scalar b) { return arith(OpKind::Le, a, b); }
Tensor operator>(const Tensor& a, Scalar b) { return arith(OpKind::Gt, a, b); }
Tensor operator>=(const Tensor& a, Scalar b) { return arith(OpKind::Ge, a, b); }

// ---- reductions -----------------------------------------------------------------------------

Tensor sum(const Tensor& a, std::vector<int64_t> dims, bool keepdim) {
  return reduce(OpKind::Sum, a, std::move(dims), keepdim, "sum");
}
Tensor mean(const Tensor& a, std::vector<int64_t> dims, bool keepdim) {
  LAZYRT_CHECK(is_floating(a.dtype()), "mean: expects a floating tensor, got ",
               dtype_name(a.dtype()), "; cast it first");
  return reduce(OpKind::Mean, a, std::move(dims), keepdim, "mean");
}
Tensor amax(const Tensor& a, std::vector<int64_t> dims, bool keepdim) {
  return reduce(OpKind::Amax, a, std::move(dims), keepdim, "amax");
}
Tensor amin(const Tensor& a, std::vector<int64_t> dims, bool keepdim) {
  return reduce(OpKind::Amin, a, std::move(dims), keepdim, "amin");
}

// ---- shape ----------------------------------------------------------------------------------

namespace {
// a as `shape` (the same elements with dims of size 1 put in or taken out): always an alias.
Tensor reshaped_view(const Tensor& a, Shape shape, std::vector<int64_t> strides) {
  const auto& s = *trace::impl_of(a);
  Tensor r = apply(OpKind::Reshape, {a}, {shape});
  make_view(a, r, {trace::ViewStep::Kind::Reshape, s.type.shape, std::move(shape), {}, {}, nullptr}, std::move(strides),
            s.storage_offset);
  return r;
}
}  // namespace

Tensor reshape(const Tensor& a, Shape shape) {
  const int64_t n = a.numel();
  int64_t known = 1, infer = -1;
  bool overflow = false, zero = false;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      LAZYRT_CHECK(infer < 0, "reshape: more than one -1 in ", shape_str(shape));
      infer = static_cast<int64_t>(i);
    } else {
      LAZYRT_CHECK(shape[i] >= 0, "reshape: invalid dimension ", shape[i], " in ", shape_str(shape));
      zero = zero || shape[i] == 0;
      overflow = overflow || __builtin_mul_overflow(known, shape[i], &known);
    }
  }
  if (zero) known = 0;
  LAZYRT_CHECK(zero || !overflow, "reshape: shape ", shape_str(shape), " has more elements than a 64-bit count ",
               "can hold (the tensor has ", n, ", shape ", shape_str(a.shape()), ")");
  if (infer >= 0) {
    LAZYRT_CHECK(known != 0 && n % known == 0, "reshape: shape ", shape_str(shape),
                 " is invalid for a tensor of ", n, " elements ", shape_str(a.shape()));
    shape[infer] = n / known;
  }
  LAZYRT_CHECK(shape_numel(shape) == n, "reshape: shape ", shape_str(shape),
               " is invalid for a tensor of ", n, " elements ", shape_str(a.shape()));
  if (shape == a.shape()) return a;
  const auto& s = *trace::impl_of(a);
  auto strides = view_strides(s.type.shape, strides_of(s), shape);
  Tensor r = apply(OpKind::Reshape, {a}, {shape});
  // An alias where PyTorch's reshape is one (its view() succeeds), a copy otherwise.
  if (strides)
    make_view(a, r, {trace::ViewStep::Kind::Reshape, s.type.shape, shape, {}, {}, nullptr}, *strides, s.storage_offset);
  return r;
}

Tensor permute(const Tensor& a, std::vector<int64_t> dims) {
  const int64_t rank = a.dim();
  LAZYRT_CHECK(static_cast<int64_t>(dims.size()) == rank, "permute: ", dims.size(),
               " dims given for a tensor of rank ", rank);
  for (auto& d : dims) d = wrap_dim(d, a.shape(), "permute");
  Tensor r = apply(OpKind::Permute, {a}, {dims});
  const auto& s = *trace::impl_of(a);
  const std::vector<int64_t> from = strides_of(s);
  std::vector<int64_t> strides;
  for (int64_t d : dims) strides.push_back(from[static_cast<size_t>(d)]);
  make_view(a, r, {trace::ViewStep::Kind::Permute, s.type.shape, dims, {}, {}, nullptr}, std::move(strides),
            s.storage_offset);
  return r;
}

Tensor transpose(const Tensor& a, int64_t d0, int64_t d1) {
  const int64_t rank = a.dim();
  d0 = wrap_dim(d0, a.shape(), "transpose");
  d1 = wrap_dim(d1, a.shape(), "transpose");
  if (rank == 0 || d0 == d1) return a;
  std::vector<int64_t> perm(static_cast<size_t>(rank));
  for (int64_t i = 0; i < rank; ++i) perm[i] = i;
  std::swap(perm[d0], perm[d1]);
  return permute(a, perm);
}

Tensor expand(const Tensor& a, Shape shape) {
  const Shape& in = a.shape();
  LAZYRT_CHECK(shape.size() >= in.size(), "expand: the target ", shape_str(shape),
               " has fewer dims than the tensor ", shape_str(in));
  const size_t lead = shape.size() - in.size();
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] != -1) continue;
    LAZYRT_CHECK(i >= lead, "expand: -1 is not allowed for a new leading dim in ", shape_str(shape));
    shape[i] = in[i - lead];
  }
  if (shape == in) return a;
  Tensor r = apply(OpKind::Expand, {a}, {shape});
  const auto& s = *trace::impl_of(a);
  const std::vector<int64_t> from = strides_of(s);
  std::vector<int64_t> strides(shape.size(), 0);
  for (size_t i = lead; i < shape.size(); ++i)
    if (in[i - lead] == shape[i]) strides[i] = from[i - lead];
  make_view(a, r, {trace::ViewStep::Kind::Expand, in, shape, {}, {}, nullptr}, std::move(strides), s.storage_offset);
  return r;
}

Tensor unsqueeze(const Tensor& a, int64_t d) {
  const int64_t rank = a.dim();
  LAZYRT_CHECK(d >= -(rank + 1) && d <= rank, "unsqueeze: dim ", d,
               " out of range for a tensor of shape ", shape_str(a.shape()), " (expected ",
               -(rank + 1), " to ", rank, ")");
  if (d < 0) d += rank + 1;
  Shape s = a.shape();
  s.insert(s.begin() + d, 1);
  // PyTorch's strides: the new dim steps over the dim it is put before.
  const auto& t = *trace::impl_of(a);
  std::vector<int64_t> strides = strides_of(t);
  strides.insert(strides.begin() + d, d < rank ? detail::stride_mul_add(a.shape()[d], strides[d]) : 1);
  return reshaped_view(a, std::move(s), std::move(strides));
}

Tensor squeeze(const Tensor& a, int64_t d) {
  d = wrap_dim(d, a.shape(), "squeeze");
  if (a.dim() == 0 || a.shape()[d] != 1) return a;
  Shape s = a.shape();
  s.erase(s.begin() + d);
  std::vector<int64_t> strides = strides_of(*trace::impl_of(a));
  strides.erase(strides.begin() + d);
  return reshaped_view(a, std::move(s), std::move(strides));
}

// ---- linear algebra -------------------------------------------------------------------------

Tensor matmul(const Tensor& a_in, const Tensor& b_in) {
  impl_of(a_in, "matmul");
  impl_of(b_in, "matmul");
  const Tensor a = autocast_lower(a_in);
  const Tensor b = autocast_lower(b_in);
  const Shape& x = a.shape();
  const Shape& y = b.shape();
  LAZYRT_CHECK(!x.empty() && !y.empty(), "matmul: both operands need at least one dim, got ",
               shape_str(x), " and ", shape_str(y));
  LAZYRT_CHECK(a.dtype() == b.dtype(), "matmul: operands must have one dtype, got ",
               dtype_name(a.dtype()), " and ", dtype_name(b.dtype()));
  LAZYRT_CHECK(a.dtype() != DType::b8, "matmul: does not take b8 tensors");
  const int64_t k1 = x.back();
  const int64_t k2 = y.size() == 1 ? y[0] : y[y.size() - 2];
  LAZYRT_CHECK(k1 == k2, "matmul: inner dimensions differ: ", shape_str(x), " @ ", shape_str(y),
               " (", k1, " vs ", k2, ")");
  if (x.size() >= 2 && y.size() >= 2) {
    Shape bx(x.begin(), x.end() - 2), by(y.begin(), y.end() - 2);
    ir::broadcast_shapes(bx, by, "matmul (batch dims)");
    return apply(OpKind::Matmul, {a, b});
  }
  // 1-D operands become matrices for the product and lose that dim again after it.
  Tensor xa = x.size() == 1 ? unsqueeze(a, 0) : a;
  Tensor yb = y.size() == 1 ? unsqueeze(b, 1) : b;
  Tensor r = apply(OpKind::Matmul, {xa, yb});
  if (y.size() == 1) r = squeeze(r, -1);
  if (x.size() == 1) r = squeeze(r, y.size() == 1 ? -1 : -2);
  return r;
}

// ---- sync -----------------------------------------------------------------------------------

void mark_step() {
  trace::sync_tensors(trace::live_pending_tensors());
  trace::count_mark_step();
}

namespace {
std::vector<std::shared_ptr<trace::TensorImpl>> impls_of(const std::vector<Tensor>& ts, const char* op) {
  std::vector<std::shared_ptr<trace::TensorImpl>> impls;
  impls.reserve(ts.size());
  for (const Tensor& t : ts) impls.push_back(impl_of(t, op).shared_from_this());
  return impls;
}
}  // namespace

void sync(const std::vector<Tensor>& tensors) { trace::sync_tensors(impls_of(tensors, "sync")); }

namespace {
void mark(const Tensor& t, int64_t dim, bool soft, const char* op) {
  trace::TensorImpl& impl = impl_of(t, op);
  const auto rank = static_cast<int64_t>(impl.type.shape.size());
  LAZYRT_CHECK(dim >= -rank && dim < rank, op, ": dim ", dim, " is out of range for a tensor of shape ",
               shape_str(impl.type.shape));
  LAZYRT_CHECK(rank <= 64, op, ": a tensor of rank ", rank, " (at most 64)");
  LAZYRT_CHECK(!impl.view_of, op, ": the tensor is a view; mark the tensor it was taken from");
  const uint64_t bit = uint64_t{1} << static_cast<unsigned>(dim < 0 ? dim + rank : dim);
  (soft ? impl.dynamic.soft : impl.dynamic.hard) |= bit;
  impl.release_leaf();  // the next graph reading its data reads the mark
}
}  // namespace

void mark_dynamic(const Tensor& t, int64_t dim) { mark(t, dim, false, "mark_dynamic"); }
void maybe_mark_dynamic(const Tensor& t, int64_t dim) { mark(t, dim, true, "maybe_mark_dynamic"); }

std::vector<int64_t> dynamic_dims(const Tensor& t) {
  const trace::TensorImpl& impl = impl_of(t, "dynamic_dims");
  std::vector<int64_t> dims;
  for (size_t d = 0; d < impl.type.shape.size(); ++d)
    if (((impl.dynamic.hard | impl.dynamic.soft) >> d) & 1) dims.push_back(static_cast<int64_t>(d));
  return dims;
}


}  // namespace lazyrt
