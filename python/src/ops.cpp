// The op table of the Python API: every public op of include/lazyrt/*.h, under PyTorch's names
// and keywords, as lazyrt.<op>(input, ...) and, where PyTorch has one, as a Tensor method.
// Adding an op is one line here (a lambda only where Python's arguments differ from C++'s).
#include <algorithm>
#include <cmath>

#include "bindings.h"

namespace lazyrt::python {

namespace {

using Operand = std::variant<Tensor, Scalar>;
using py::arg;
using py::kw_only;

Tensor t_or(const Operand& o, const Tensor& like) {
  if (const Tensor* t = std::get_if<Tensor>(&o)) return *t;
  return scalar_like(std::get<Scalar>(o), like);
}

// a (op) b where b may be a Python number: numbers keep their kind (PyTorch's promotion).
#define LAZYRT_BINARY(expr)                                                        \
  [](const Tensor& a, const Operand& other) {                                      \
    if (const Tensor* t = std::get_if<Tensor>(&other)) {                           \
      const Tensor& b = *t;                                                        \
      return expr;                                                                 \
    }                                                                              \
    const Scalar b = std::get<Scalar>(other);                                      \
    return expr;                                                                   \
  }

// A number with alpha != 1 goes through the tensor form, which checks alpha like PyTorch.
Tensor add_op(const Tensor& a, const Operand& other, Scalar alpha) {
  if (const Tensor* b = std::get_if<Tensor>(&other)) return add(a, *b, alpha);
  if (alpha.to_double() == 1) return a + std::get<Scalar>(other);
  return add(a, scalar_like(std::get<Scalar>(other), a), alpha);
}
Tensor sub_op(const Tensor& a, const Operand& other, Scalar alpha) {
  if (const Tensor* b = std::get_if<Tensor>(&other)) {
    // The C++ sub does not check alpha (add does); PyTorch refuses a float alpha for integers.
    if (alpha.kind() == Scalar::Kind::Float && alpha.to_double() != 1 && !is_floating(a.dtype()) &&
        !is_floating(b->dtype()))
      throw Error("sub: alpha " + std::to_string(alpha.to_double()) + " is not an integer but the operands are " +
                  dtype_name(a.dtype()) + " and " + dtype_name(b->dtype()));
    return sub(a, *b, alpha);
  }
  if (alpha.to_double() == 1) return a - std::get<Scalar>(other);
  return sub(a, scalar_like(std::get<Scalar>(other), a), alpha);
}

Tensor pow_op(const Tensor& a, const Operand& exponent) {
  if (const Tensor* e = std::get_if<Tensor>(&exponent)) return pow(a, *e);
  return pow(a, std::get<Scalar>(exponent));
}


// torch's (values, indices) results: a named tuple, as torch.return_types.sort / topk.
py::object values_indices(const char* name, std::pair<Tensor, Tensor> r) {
  // Never destroyed: a Python object must not be released after the interpreter finalizes.
  static auto* types = new py::dict();
  if (!types->contains(name))
    (*types)[name] = py::module_::import("collections").attr("namedtuple")(name, py::make_tuple("values", "indices"));
  return (*types)[name](r.first, r.second);
}

// An int, or a sequence of ints, as a list (None: empty).
std::vector<int64_t> int_or_ints(py::handle h, const char* what) {
  if (h.is_none()) return {};
  return py::isinstance<py::int_>(h) ? std::vector<int64_t>{h.cast<int64_t>()} : shape_from_sequence(h, what);
}

// sum/mean with PyTorch's optional dtype: the input is cast first.
template <Tensor (*Reduce)(const Tensor&, std::vector<int64_t>, bool)>
Tensor reduce_op(const Tensor& a, const Dims& dim, bool keepdim, std::optional<DType> dtype) {
  return Reduce(dtype ? cast(a, *dtype) : a, dim.dims, keepdim);
}
// var/std's degrees of freedom subtracted: `correction`, or 1 (0 when unbiased=False), as
// PyTorch takes one or the other.
double correction_of(const char* op, std::optional<bool> unbiased, std::optional<double> correction) {
  if (unbiased && correction) throw Error(std::string(op) + ": give unbiased or correction, not both");
  if (correction) return *correction;
  return unbiased.value_or(true) ? 1.0 : 0.0;
}
template <Tensor (*Reduce)(const Tensor&, std::vector<int64_t>, bool)>
Tensor minmax_op(const Tensor& a, const Dims& dim, bool keepdim) {
  return Reduce(a, dim.dims, keepdim);
}

Tensor squeeze_op(const Tensor& a, const Dims& dim) {
  if (dim.given) {
    Tensor r = a;
    std::vector<int64_t> dims = dim.dims;
    for (auto& d : dims) d = d < 0 ? d + std::max<int64_t>(a.dim(), 1) : d;
    std::sort(dims.rbegin(), dims.rend());
    for (int64_t d : dims) r = squeeze(r, d);
    return r;
  }
  Shape s;
  for (int64_t d : a.shape())
    if (d != 1) s.push_back(d);
  return reshape(a, s);
}

Tensor flatten_op(const Tensor& a, int64_t start, int64_t end) {
  const int64_t rank = a.dim();
  if (rank == 0) return reshape(a, {1});
  if (start < 0) start += rank;
  if (end < 0) end += rank;
  if (start < 0 || end >= rank || start > end)
    throw Error("flatten: start_dim and end_dim out of range for a tensor of shape " + shape_str(a.shape()));
  Shape s(a.shape().begin(), a.shape().begin() + start);
  int64_t n = 1;
  for (int64_t d = start; d <= end; ++d) n *= a.shape()[d];
  s.push_back(n);
  s.insert(s.end(), a.shape().begin() + end + 1, a.shape().end());
  return reshape(a, s);
}

Tensor t_op(const Tensor& a) {
  if (a.dim() > 2) throw Error("t: expects a tensor with at most 2 dims, got " + shape_str(a.shape()));
  return a.dim() < 2 ? a : transpose(a, 0, 1);
}

Tensor reversed(const Tensor& a) {
  std::vector<int64_t> dims;
  for (int64_t d = a.dim(); d-- > 0;) dims.push_back(d);
  return a.dim() < 2 ? a : permute(a, dims);
}

// requires_grad=True on a creation function makes a leaf that requires grad.
Tensor leaf(Tensor t, bool requires_grad) {
  if (requires_grad) t.requires_grad_();
  return t;
}

// max() and min() of every element: amax / amin in value. In gradient PyTorch's convention of
// this form, which differs from amax's: a nan result sends the gradient to the nan elements,
// split evenly (amax's rule would give nan everywhere). Built only when a gradient is recorded.
Tensor extreme_of_all(const Tensor& a, bool largest) {
  if (!a.requires_grad() || !is_floating(a.dtype())) return largest ? amax(a) : amin(a);
  const Tensor nan = isnan(a);
  const Tensor rest = masked_fill(a, nan, largest ? -INFINITY : INFINITY);
  const Tensor extreme = largest ? amax(rest) : amin(rest);
  const Tensor count = clamp(sum(cast(nan, a.dtype())), std::optional<Scalar>(1));
  const Tensor nans = sum(masked_fill(a, logical_not(nan), 0)) / count;
  return where(any(nan), nans, extreme);
}

DType fill_dtype(Scalar s) {
  switch (s.kind()) {
    case Scalar::Kind::Bool: return DType::b8;
    case Scalar::Kind::Int: return DType::i64;
    case Scalar::Kind::Float: return DType::f32;
  }
  return DType::f32;
}

// Two numbers take the dtype torch gives them (float32, int64 or bool, promoted together).
Tensor where_op(const Tensor& cond, const Operand& x, const Operand& y) {
  const Tensor* tx = std::get_if<Tensor>(&x);
  const Tensor* ty = std::get_if<Tensor>(&y);
  if (!tx && !ty) {
    const Scalar sx = std::get<Scalar>(x), sy = std::get<Scalar>(y);
    const DType dtype = promote_types(fill_dtype(sx), fill_dtype(sy));
    return where(cond, full({}, sx, dtype), full({}, sy, dtype));
  }
  const Tensor& like = tx ? *tx : *ty;
  return where(cond, t_or(x, like), t_or(y, like));
}

// torch.index_put's indices: a tuple (or list) of index tensors, None standing for a whole dim.
std::vector<Tensor> index_tensors(py::handle indices) {
  if (py::isinstance<Tensor>(indices) || !(py::isinstance<py::tuple>(indices) || py::isinstance<py::list>(indices)))
    throw py::type_error("index_put: indices must be a tuple of tensors (None for a whole dim)");
  std::vector<Tensor> out;
  for (py::handle h : indices) out.push_back(h.is_none() ? Tensor() : h.cast<Tensor>());
  return out;
}

Tensor index_fill_op(const Tensor& a, int64_t dim, const Tensor& index, const Operand& value) {
  if (const Tensor* v = std::get_if<Tensor>(&value)) return index_fill(a, dim, index, *v);
  return index_fill(a, dim, index, std::get<Scalar>(value));
}

// self takes f(self) as its new value (in-place ops rebind; a leaf that requires grad refuses).
template <class F>
py::object in_place(py::object self, F&& f) {
  Tensor& t = self.cast<Tensor&>();
  t.copy_(f(t));
  return self;
}

// mark(t, d) for a dim given as an int, or for each of a sequence of them.
void for_each_dim(const Tensor& t, py::handle dims, void (*mark)(const Tensor&, int64_t)) {
  if (py::isinstance<py::int_>(dims)) {
    mark(t, dims.cast<int64_t>());
    return;
  }
  for (py::handle d : dims) mark(t, d.cast<int64_t>());
}

}  // namespace

void bind_ops(py::module_& m, py::class_<Tensor>& cls) {
  OpBinder b(m, cls);

  // ---- the plain elementwise ops of the op table (its api column): one binding per row ----
#define LAZYRT_BIND_Public(name)
#define LAZYRT_BIND_Internal(name)
#define LAZYRT_BIND_Unary(name) b.op(#name, static_cast<Tensor (*)(const Tensor&)>(&lazyrt::name));
#define LAZYRT_BIND_UnaryFloat(name) LAZYRT_BIND_Unary(name)
#define LAZYRT_BIND_Arith(name)                                                         \
  b.op(#name, [](const Tensor& a, const Operand& other) {                              \
    if (const Tensor* t = std::get_if<Tensor>(&other)) return lazyrt::name(a, *t);      \
    return lazyrt::name(a, std::get<Scalar>(other));                                    \
  }, arg("other"));
#define LAZYRT_BIND_ArithFloat(name) LAZYRT_BIND_Arith(name)
#define OP(Enum, name, operands, rule, flags, attrs, aten, api, grad) LAZYRT_BIND_##api(name)
#include "lazyrt/ops.def"
#undef OP
#undef LAZYRT_BIND_Public
#undef LAZYRT_BIND_Internal
#undef LAZYRT_BIND_Unary
#undef LAZYRT_BIND_UnaryFloat
#undef LAZYRT_BIND_Arith
#undef LAZYRT_BIND_ArithFloat

  // ---- elementwise ----
  b.op("negative", &neg);
  b.fn("cast", &cast, arg("input"), arg("dtype"));

  // ---- elementwise, binary (other: tensor or number) ----
  b.op("add", &add_op, arg("other"), kw_only(), arg("alpha") = 1)
      .op("sub", &sub_op, arg("other"), kw_only(), arg("alpha") = 1)
      .op("subtract", &sub_op, arg("other"), kw_only(), arg("alpha") = 1)
      .op("multiply", LAZYRT_BINARY(a * b), arg("other"))
      .op("divide", LAZYRT_BINARY(a / b), arg("other"))
      .op("true_divide", LAZYRT_BINARY(a / b), arg("other"))
      .op("pow", &pow_op, arg("exponent"))
      .fn("pow", [](Scalar self, const Tensor& e) { return pow(scalar_like(self, e), e); }, arg("self"),
          arg("exponent"))
      .fn("where", &where_op, arg("condition"), arg("input"), arg("other"))
      .method("where", [](const Tensor& self, const Tensor& cond, const Operand& other) {
        return where_op(cond, self, other);
      }, arg("condition"), arg("other"));

  // ---- reductions (dim: None, an int or a sequence; None means every dim) ----
  b.op("sum", &reduce_op<sum>, arg("dim") = py::none(), arg("keepdim") = false, kw_only(),
       arg("dtype") = py::none())
      .op("mean", &reduce_op<mean>, arg("dim") = py::none(), arg("keepdim") = false, kw_only(),
          arg("dtype") = py::none())
      .op("amax", &minmax_op<amax>, arg("dim") = py::tuple(), arg("keepdim") = false)
      .op("amin", &minmax_op<amin>, arg("dim") = py::tuple(), arg("keepdim") = false)
      // max/min: of every element, elementwise of two tensors, or (values, indices) along a dim.
      .op("max", [](const Tensor& a) { return extreme_of_all(a, true); })
      .op("max", static_cast<Tensor (*)(const Tensor&, const Tensor&)>(&maximum), arg("other"))
      .op("max", [](const Tensor& a, int64_t dim, bool keepdim) { return values_indices("max", max(a, dim, keepdim)); },
          arg("dim"), arg("keepdim") = false)
      .op("min", [](const Tensor& a) { return extreme_of_all(a, false); })
      .op("min", static_cast<Tensor (*)(const Tensor&, const Tensor&)>(&minimum), arg("other"))
      .op("min", [](const Tensor& a, int64_t dim, bool keepdim) { return values_indices("min", min(a, dim, keepdim)); },
          arg("dim"), arg("keepdim") = false);

  // ---- linear algebra, activations, losses' building blocks ----
  b.op("matmul", &matmul, arg("other")).op("mm", &matmul, arg("mat2"));
  b.op("log_softmax", [](const Tensor& a, int64_t dim, std::optional<DType> dtype) { return log_softmax(a, dim, dtype); }, arg("dim"), arg("dtype") = py::none());

  // ---- shape ----
  b.fn("reshape", [](const Tensor& a, py::handle shape) { return reshape(a, shape_from_sequence(shape, "reshape")); },
       arg("input"), arg("shape"))
      .method("reshape", [](const Tensor& a, py::args shape, py::kwargs kw) {
        return reshape(a, shape_from_args(shape, kw, "shape", "reshape"));
      })
      .method("view", [](const Tensor& a, py::args shape, py::kwargs kw) {
        return view(a, shape_from_args(shape, kw, "size", "view"));
      })
      .op("transpose", &transpose, arg("dim0"), arg("dim1"))
      .op("swapaxes", &transpose, arg("axis0"), arg("axis1"))
      .fn("permute", [](const Tensor& a, py::handle dims) { return permute(a, shape_from_sequence(dims, "permute")); },
          arg("input"), arg("dims"))
      .method("permute", [](const Tensor& a, py::args dims, py::kwargs kw) {
        return permute(a, shape_from_args(dims, kw, "dims", "permute"));
      })
      .fn("expand", [](const Tensor& a, py::handle size) { return expand(a, shape_from_sequence(size, "expand")); },
          arg("input"), arg("size"))
      .method("expand", [](const Tensor& a, py::args size, py::kwargs kw) {
        return expand(a, shape_from_args(size, kw, "size", "expand"));
      })
      .op("broadcast_to", [](const Tensor& a, py::handle size) { return expand(a, shape_from_sequence(size, "broadcast_to")); },
          arg("size"))
      .op("unsqueeze", &unsqueeze, arg("dim"))
      .op("squeeze", &squeeze_op, arg("dim") = py::none())
      .op("flatten", &flatten_op, arg("start_dim") = 0, arg("end_dim") = -1)
      .op("t", &t_op);
  cls.def_property_readonly("T", &reversed);

  // ---- creation (size: separate ints or one sequence) ----
  b.fn("zeros", [](py::args size, std::optional<DType> dtype, bool rg) {
    return leaf(zeros(shape_from_args(size, "zeros"), dtype.value_or(DType::f32)), rg);
  }, kw_only(), arg("dtype") = py::none(), arg("requires_grad") = false)
      .fn("ones", [](py::args size, std::optional<DType> dtype, bool rg) {
        return leaf(ones(shape_from_args(size, "ones"), dtype.value_or(DType::f32)), rg);
      }, kw_only(), arg("dtype") = py::none(), arg("requires_grad") = false)
      .fn("full", [](py::handle size, Scalar value, std::optional<DType> dtype, bool rg) {
        return leaf(full(shape_from_sequence(size, "full"), value, dtype.value_or(fill_dtype(value))), rg);
      }, arg("size"), arg("fill_value"), kw_only(), arg("dtype") = py::none(), arg("requires_grad") = false)
      .fn("zeros_like", [](const Tensor& t, std::optional<DType> dtype, bool rg) {
        return leaf(zeros(t.shape(), dtype.value_or(t.dtype())), rg);
      }, arg("input"), kw_only(), arg("dtype") = py::none(), arg("requires_grad") = false)
      .fn("ones_like", [](const Tensor& t, std::optional<DType> dtype, bool rg) {
        return leaf(ones(t.shape(), dtype.value_or(t.dtype())), rg);
      }, arg("input"), kw_only(), arg("dtype") = py::none(), arg("requires_grad") = false)
      .fn("full_like", [](const Tensor& t, Scalar value, std::optional<DType> dtype, bool rg) {
        return leaf(full(t.shape(), value, dtype.value_or(t.dtype())), rg);
      }, arg("input"), arg("fill_value"), kw_only(), arg("dtype") = py::none(), arg("requires_grad") = false)
      .fn("scalar_tensor", [](Scalar value, DType dtype, bool rg) {
        return leaf(scalar_tensor(value.to_double(), dtype), rg);
      }, arg("s"), kw_only(), arg("dtype") = dtype_object(DType::f32), arg("requires_grad") = false)
      .fn("_arange", &arange, arg("end"), arg("dtype"));

  // ---- random numbers (the seeded counter-based generator of random.h) ----
  b.fn("manual_seed", &manual_seed, arg("seed"))
      .fn("random_state", [] {
        auto [seed, offset] = random_state();
        return py::make_tuple(seed, offset);
      }, "The generator's state tensors (seed, offset), the same tensors for the whole process.")
      .fn("rand", [](py::args size, std::optional<DType> dtype, bool rg) {
        return leaf(rand(shape_from_args(size, "rand"), dtype.value_or(DType::f32)), rg);
      }, kw_only(), arg("dtype") = py::none(), arg("requires_grad") = false)
      .fn("randn", [](py::args size, std::optional<DType> dtype, bool rg) {
        return leaf(randn(shape_from_args(size, "randn"), dtype.value_or(DType::f32)), rg);
      }, kw_only(), arg("dtype") = py::none(), arg("requires_grad") = false)
      .fn("randint", [](int64_t low, int64_t high, py::handle size, DType dtype) {
        return randint(low, high, shape_from_sequence(size, "randint"), dtype);
      }, arg("low"), arg("high"), arg("size"), kw_only(), arg("dtype") = dtype_object(DType::i64))
      .fn("randint", [](int64_t high, py::handle size, DType dtype) {
        return randint(0, high, shape_from_sequence(size, "randint"), dtype);
      }, arg("high"), arg("size"), kw_only(), arg("dtype") = dtype_object(DType::i64))
      .op("bernoulli", [](const Tensor& p) { return bernoulli(p); })
      .fn("bernoulli", [](py::handle size, double p, DType dtype) {
        return bernoulli(shape_from_sequence(size, "bernoulli"), p, dtype);
      }, arg("size"), arg("p"), kw_only(), arg("dtype") = dtype_object(DType::f32))
      .fn("dropout_mask", [](py::handle size, double p, DType dtype) {
        return dropout_mask(shape_from_sequence(size, "dropout_mask"), p, dtype);
      }, arg("size"), arg("p"), kw_only(), arg("dtype") = dtype_object(DType::f32))
      .fn("dropout", &dropout, arg("input"), arg("p") = 0.5, arg("training") = true)
      .op("multinomial", &multinomial, arg("num_samples"), arg("replacement") = false);

  // ---- math ----
  b.op("reciprocal", &reciprocal)
      .op("round", [](const Tensor& a, int64_t decimals) { return round(a, decimals); },
          kw_only(), arg("decimals") = 0).op("isinf", &isinf).op("isfinite", &isfinite)
      .op("silu", &silu)
      .op("gelu", [](const Tensor& a, const std::string& approximate) { return gelu(a, approximate); },
          kw_only(), arg("approximate") = "none")
      .op("softplus", [](const Tensor& a, Scalar beta, Scalar threshold) { return softplus(a, beta, threshold); },
          arg("beta") = 1, arg("threshold") = 20)
      .op("leaky_relu", [](const Tensor& a, Scalar slope) { return leaky_relu(a, slope); },
          arg("negative_slope") = 0.01)
      .op("clamp", [](const Tensor& a, std::optional<Operand> lo, std::optional<Operand> hi) {
        const bool tensors = (lo && std::holds_alternative<Tensor>(*lo)) || (hi && std::holds_alternative<Tensor>(*hi));
        if (!tensors) {
          std::optional<Scalar> l, h;
          if (lo) l = std::get<Scalar>(*lo);
          if (hi) h = std::get<Scalar>(*hi);
          return clamp(a, l, h);
        }
        std::optional<Tensor> l, h;
        if (lo) l = t_or(*lo, a);
        if (hi) h = t_or(*hi, a);
        return clamp(a, l, h);
      }, arg("min") = py::none(), arg("max") = py::none())
      .op("lerp", [](const Tensor& s, const Tensor& e, const Operand& w) {
        if (const Tensor* t = std::get_if<Tensor>(&w)) return lerp(s, e, *t);
        return lerp(s, e, std::get<Scalar>(w));
      }, arg("end"), arg("weight"))
      .op("addcmul", [](const Tensor& a, const Tensor& t1, const Tensor& t2, Scalar v) { return addcmul(a, t1, t2, v); },
          arg("tensor1"), arg("tensor2"), kw_only(), arg("value") = 1)
      .op("addcdiv", [](const Tensor& a, const Tensor& t1, const Tensor& t2, Scalar v) { return addcdiv(a, t1, t2, v); },
          arg("tensor1"), arg("tensor2"), kw_only(), arg("value") = 1)
      .op("nan_to_num", &nan_to_num, arg("nan") = 0.0, arg("posinf") = py::none(), arg("neginf") = py::none());

  // ---- reductions and normalization ----
  b.op("prod", [](const Tensor& a, std::optional<int64_t> dim, bool keepdim) { return prod(a, dim, keepdim); },
       arg("dim") = py::none(), arg("keepdim") = false)
      // PyTorch's spellings: (dim, unbiased, keepdim), (dim, *, correction, keepdim), (unbiased).
      .op("var", [](const Tensor& a, bool unbiased) { return var(a, {}, unbiased ? 1 : 0, false); }, arg("unbiased"))
      .op("var", [](const Tensor& a, const Dims& dim, std::optional<bool> unbiased, bool keepdim,
                    std::optional<double> correction) {
        return var(a, dim.dims, correction_of("var", unbiased, correction), keepdim);
      }, arg("dim") = py::none(), arg("unbiased") = py::none(), arg("keepdim") = false, kw_only(),
          arg("correction") = py::none())
      .op("std", [](const Tensor& a, bool unbiased) { return lazyrt::std(a, {}, unbiased ? 1 : 0, false); },
          arg("unbiased"))
      .op("std", [](const Tensor& a, const Dims& dim, std::optional<bool> unbiased, bool keepdim,
                    std::optional<double> correction) {
        return lazyrt::std(a, dim.dims, correction_of("std", unbiased, correction), keepdim);
      }, arg("dim") = py::none(), arg("unbiased") = py::none(), arg("keepdim") = false, kw_only(),
          arg("correction") = py::none())
      .op("logsumexp", [](const Tensor& a, const Dims& dim, bool keepdim) { return logsumexp(a, dim.dims, keepdim); },
          arg("dim"), arg("keepdim") = false)
      .op("argmax", &argmax, arg("dim") = py::none(), arg("keepdim") = false)
      .op("argmin", &argmin, arg("dim") = py::none(), arg("keepdim") = false)
      .op("all", [](const Tensor& a, const Dims& dim, bool keepdim) { return all(a, dim.dims, keepdim); },
          arg("dim") = py::none(), arg("keepdim") = false)
      .op("any", [](const Tensor& a, const Dims& dim, bool keepdim) { return any(a, dim.dims, keepdim); },
          arg("dim") = py::none(), arg("keepdim") = false)
      .op("norm", [](const Tensor& a, double p, const Dims& dim, bool keepdim) { return norm(a, p, dim.dims, keepdim); },
          arg("p") = 2.0, arg("dim") = py::none(), arg("keepdim") = false)
      .op("softmax", [](const Tensor& a, int64_t dim, std::optional<DType> dtype) { return softmax(a, dim, dtype); },
          arg("dim"), arg("dtype") = py::none())
      .op("cumsum", [](const Tensor& a, int64_t dim, std::optional<DType> dtype) { return cumsum(a, dim, dtype); },
          arg("dim"), kw_only(), arg("dtype") = py::none())
      .op("cumprod", [](const Tensor& a, int64_t dim, std::optional<DType> dtype) { return cumprod(a, dim, dtype); },
          arg("dim"), kw_only(), arg("dtype") = py::none())
      .op("sort", [](const Tensor& a, int64_t dim, bool descending, bool stable) {
        return values_indices("sort", sort(a, dim, descending, stable));
      }, arg("dim") = -1, arg("descending") = false, kw_only(), arg("stable") = false)
      .op("argsort", [](const Tensor& a, int64_t dim, bool descending, bool stable) {
        return argsort(a, dim, descending, stable);
      }, arg("dim") = -1, arg("descending") = false, kw_only(), arg("stable") = false)
      .op("topk", [](const Tensor& a, int64_t k, int64_t dim, bool largest, bool sorted) {
        return values_indices("topk", topk(a, k, dim, largest, sorted));
      }, arg("k"), arg("dim") = -1, arg("largest") = true, arg("sorted") = true)
      .op("clamp_min", [](const Tensor& a, const Operand& m) {
        if (const Tensor* t = std::get_if<Tensor>(&m)) return clamp_min(a, *t);
        return clamp_min(a, std::get<Scalar>(m));
      }, arg("min"))
      .op("clamp_max", [](const Tensor& a, const Operand& m) {
        if (const Tensor* t = std::get_if<Tensor>(&m)) return clamp_max(a, *t);
        return clamp_max(a, std::get<Scalar>(m));
      }, arg("max"))
      .fn("layer_norm", [](const Tensor& a, py::handle shape, std::optional<Tensor> w, std::optional<Tensor> bias,
                           double eps) { return layer_norm(a, shape_from_sequence(shape, "layer_norm"), w, bias, eps); },
          arg("input"), arg("normalized_shape"), arg("weight") = py::none(), arg("bias") = py::none(),
          arg("eps") = 1e-5);

  // ---- data movement and indexing ----
  b.fn("view", [](const Tensor& a, py::handle shape) { return view(a, shape_from_sequence(shape, "view")); },
       arg("input"), arg("shape"))
      .op("slice", [](const Tensor& a, int64_t dim, std::optional<int64_t> start, std::optional<int64_t> end,
                      int64_t step) { return slice(a, dim, start, end, step); },
          arg("dim") = 0, arg("start") = py::none(), arg("end") = py::none(), arg("step") = 1)
      // A tensor start first: pybind11 would take a tensor as an int (through __index__, a read).
      .op("narrow", static_cast<Tensor (*)(const Tensor&, int64_t, const Tensor&, int64_t)>(&narrow), arg("dim"),
          arg("start"), arg("length"))
      .op("narrow", static_cast<Tensor (*)(const Tensor&, int64_t, int64_t, int64_t)>(&narrow), arg("dim"),
          arg("start"), arg("length"))
      // Tensor.select / lazyrt.select (python/lazyrt/_tensor.py) call it for a tensor position.
      .fn("_select_at", static_cast<Tensor (*)(const Tensor&, int64_t, const Tensor&)>(&select), arg("input"),
          arg("dim"), arg("index"))
      .fn("cat", [](py::handle ts, int64_t dim) { return cat(tensors_from(ts, "cat"), dim); }, arg("tensors"),
          arg("dim") = 0)
      .fn("concat", [](py::handle ts, int64_t dim) { return cat(tensors_from(ts, "concat"), dim); }, arg("tensors"),
          arg("dim") = 0)
      .fn("stack", [](py::handle ts, int64_t dim) { return stack(tensors_from(ts, "stack"), dim); }, arg("tensors"),
          arg("dim") = 0)
      .op("split", [](const Tensor& a, py::handle size, int64_t dim) {
        std::vector<Tensor> parts = py::isinstance<py::int_>(size)
                                        ? split(a, size.cast<int64_t>(), dim)
                                        : split(a, shape_from_sequence(size, "split"), dim);
        return py::tuple(py::cast(parts));
      }, arg("split_size_or_sections"), arg("dim") = 0)
      .op("split_with_sizes", [](const Tensor& a, py::handle sizes, int64_t dim) {
        return py::tuple(py::cast(split_with_sizes(a, shape_from_sequence(sizes, "split_with_sizes"), dim)));
      }, arg("split_sizes"), arg("dim") = 0)
      .op("chunk", [](const Tensor& a, int64_t chunks, int64_t dim) { return py::tuple(py::cast(chunk(a, chunks, dim))); },
          arg("chunks"), arg("dim") = 0)
      .op("flip", [](const Tensor& a, py::handle dims) { return flip(a, shape_from_sequence(dims, "flip")); },
          arg("dims"))
      .fn("repeat", [](const Tensor& a, py::handle r) { return repeat(a, shape_from_sequence(r, "repeat")); },
          arg("input"), arg("repeats"))
      .method("repeat", [](const Tensor& a, py::args r, py::kwargs kw) {
        return repeat(a, shape_from_args(r, kw, "repeats", "repeat"));
      })
      .op("roll", [](const Tensor& a, py::handle shifts, py::handle dims) {
        return roll(a, int_or_ints(shifts, "roll"), int_or_ints(dims, "roll"));
      }, arg("shifts"), arg("dims") = py::none())
      .fn("tile", [](const Tensor& a, py::handle r) { return tile(a, shape_from_sequence(r, "tile")); },
          arg("input"), arg("dims"))
      .method("tile", [](const Tensor& a, py::args r, py::kwargs kw) {
        return tile(a, shape_from_args(r, kw, "dims", "tile"));
      })
      .fn("meshgrid", [](py::args ts, std::optional<std::string> indexing) {
        // torch.meshgrid(a, b) or torch.meshgrid([a, b]); indexing "ij" by default.
        py::handle seq = ts.size() == 1 && !py::isinstance<Tensor>(ts[0]) ? ts[0] : py::handle(ts);
        return py::tuple(py::cast(meshgrid(tensors_from(seq, "meshgrid"), indexing.value_or("ij"))));
      }, kw_only(), arg("indexing") = py::none())
      .fn("einsum", [](const std::string& eq, py::args ts) {
        py::handle seq = ts.size() == 1 && !py::isinstance<Tensor>(ts[0]) ? ts[0] : py::handle(ts);
        return einsum(eq, tensors_from(seq, "einsum"));
      }, arg("equation"))
      .fn("pad", [](const Tensor& a, py::handle p, Scalar value) { return pad(a, shape_from_sequence(p, "pad"), value); },
          arg("input"), arg("pad"), arg("value") = 0)
      .op("index_select", &index_select, arg("dim"), arg("index"))
      .op("gather", &gather, arg("dim"), arg("index"))
      .op("scatter", [](const Tensor& a, int64_t dim, const Tensor& index, const Operand& src) {
        if (const Tensor* t = std::get_if<Tensor>(&src)) return scatter(a, dim, index, *t);
        return scatter(a, dim, index, std::get<Scalar>(src));
      }, arg("dim"), arg("index"), arg("src"))
      .op("scatter_add", &scatter_add, arg("dim"), arg("index"), arg("src"))
      .op("index_add", [](const Tensor& a, int64_t dim, const Tensor& index, const Tensor& source, Scalar alpha) {
        return index_add(a, dim, index, source, alpha);
      }, arg("dim"), arg("index"), arg("source"), kw_only(), arg("alpha") = 1)
      .op("masked_fill", [](const Tensor& a, const Tensor& mask, const Operand& value) {
        if (const Tensor* t = std::get_if<Tensor>(&value)) return masked_fill(a, mask, *t);
        return masked_fill(a, mask, std::get<Scalar>(value));
      }, arg("mask"), arg("value"))
      .op("index_put", [](const Tensor& a, py::handle indices, const Tensor& values, bool accumulate) {
        return index_put(a, index_tensors(indices), values, accumulate);
      }, arg("indices"), arg("values"), arg("accumulate") = false)
      .op("index_copy", &index_copy, arg("dim"), arg("index"), arg("source"))
      .op("index_fill", &index_fill_op, arg("dim"), arg("index"), arg("value"))
      // In place: the handle (and the Python object) keeps its identity and gets the new value.
      .method("index_put_", [](py::object self, py::handle indices, const Tensor& values, bool accumulate) {
        return in_place(self, [&](const Tensor& t) { return index_put(t, index_tensors(indices), values, accumulate); });
      }, arg("indices"), arg("values"), arg("accumulate") = false)
      .method("index_copy_", [](py::object self, int64_t dim, const Tensor& index, const Tensor& source) {
        return in_place(self, [&](const Tensor& t) { return index_copy(t, dim, index, source); });
      }, arg("dim"), arg("index"), arg("source"))
      .method("index_fill_", [](py::object self, int64_t dim, const Tensor& index, const Operand& value) {
        return in_place(self, [&](const Tensor& t) { return index_fill_op(t, dim, index, value); });
      }, arg("dim"), arg("index"), arg("value"))
      .method("masked_fill_", [](py::object self, const Tensor& mask, const Operand& value) {
        return in_place(self, [&](const Tensor& t) {
          if (const Tensor* v = std::get_if<Tensor>(&value)) return masked_fill(t, mask, *v);
          return masked_fill(t, mask, std::get<Scalar>(value));
        });
      }, arg("mask"), arg("value"))
      .method("scatter_", [](py::object self, int64_t dim, const Tensor& index, const Operand& src) {
        return in_place(self, [&](const Tensor& t) {
          if (const Tensor* s = std::get_if<Tensor>(&src)) return scatter(t, dim, index, *s);
          return scatter(t, dim, index, std::get<Scalar>(src));
        });
      }, arg("dim"), arg("index"), arg("src"))
      .method("scatter_add_", [](py::object self, int64_t dim, const Tensor& index, const Tensor& src) {
        return in_place(self, [&](const Tensor& t) { return scatter_add(t, dim, index, src); });
      }, arg("dim"), arg("index"), arg("src"))
      .op("tril", &tril, arg("diagonal") = 0)
      .op("triu", &triu, arg("diagonal") = 0)
      .fn("embedding", [](const Tensor& indices, const Tensor& weight, std::optional<int64_t> padding_idx) {
        return embedding(weight, indices, padding_idx);
      }, arg("input"), arg("weight"), arg("padding_idx") = py::none())
      .fn("one_hot", &one_hot, arg("tensor"), arg("num_classes") = -1);

  // ---- linear algebra, convolution, pooling ----
  b.op("bmm", &bmm, arg("mat2"))
      .op("addmm", [](const Tensor& in, const Tensor& m1, const Tensor& m2, Scalar beta, Scalar alpha) {
        return addmm(in, m1, m2, beta, alpha);
      }, arg("mat1"), arg("mat2"), kw_only(), arg("beta") = 1, arg("alpha") = 1)
      .op("baddbmm", [](const Tensor& in, const Tensor& b1, const Tensor& b2, Scalar beta, Scalar alpha) {
        return baddbmm(in, b1, b2, beta, alpha);
      }, arg("batch1"), arg("batch2"), kw_only(), arg("beta") = 1, arg("alpha") = 1)
      .fn("conv2d", [](const Tensor& x, const Tensor& w, std::optional<Tensor> bias, py::handle stride,
                       py::handle padding, py::handle dilation, int64_t groups) {
        const auto ints = int_or_ints;
        if (py::isinstance<py::str>(padding)) {
          const auto p = padding.cast<std::string>();
          if (p != "valid" && p != "same")
            throw Error("conv2d: invalid padding string '" + p + "', should be one of 'valid', 'same'");
          return conv2d(x, w, bias.value_or(Tensor()), ints(stride, "conv2d"), p == "same" ? Padding::Same : Padding::Valid,
                        ints(dilation, "conv2d"), groups);
        }
        return conv2d(x, w, bias.value_or(Tensor()), ints(stride, "conv2d"), ints(padding, "conv2d"),
                      ints(dilation, "conv2d"), groups);
      }, arg("input"), arg("weight"), arg("bias") = py::none(), arg("stride") = 1, arg("padding") = 0,
         arg("dilation") = 1, arg("groups") = 1)
      .fn("max_pool2d", [](const Tensor& x, py::handle k, py::handle stride, py::handle padding, py::handle dilation,
                           bool ceil_mode) {
        const auto ints = int_or_ints;
        return max_pool2d(x, ints(k, "max_pool2d"), ints(stride, "max_pool2d"), ints(padding, "max_pool2d"),
                          ints(dilation, "max_pool2d"), ceil_mode);
      }, arg("input"), arg("kernel_size"), arg("stride") = py::none(), arg("padding") = 0, arg("dilation") = 1,
         arg("ceil_mode") = false)
      .fn("max_pool2d_with_indices", [](const Tensor& x, py::handle k, py::handle stride, py::handle padding,
                                        py::handle dilation, bool ceil_mode) {
        const auto ints = int_or_ints;
        const char* op = "max_pool2d_with_indices";
        return max_pool2d_with_indices(x, ints(k, op), ints(stride, op), ints(padding, op), ints(dilation, op),
                                       ceil_mode);
      }, arg("input"), arg("kernel_size"), arg("stride") = py::none(), arg("padding") = 0, arg("dilation") = 1,
         arg("ceil_mode") = false)
      .fn("avg_pool2d", [](const Tensor& x, py::handle k, py::handle stride, py::handle padding, bool ceil_mode,
                           bool count_include_pad, std::optional<int64_t> divisor_override) {
        const auto ints = int_or_ints;
        return avg_pool2d(x, ints(k, "avg_pool2d"), ints(stride, "avg_pool2d"), ints(padding, "avg_pool2d"), ceil_mode,
                          count_include_pad, divisor_override);
      }, arg("input"), arg("kernel_size"), arg("stride") = py::none(), arg("padding") = 0, arg("ceil_mode") = false,
         arg("count_include_pad") = true, arg("divisor_override") = py::none());

  // ---- sync: compiles and runs graphs, so without the GIL ----
  b.fn("mark_step", [] {
    py::gil_scoped_release release;
    mark_step();
  }, "Computes every pending tensor the calling thread recorded, as one graph.")
      .fn("sync", [](py::handle tensors) {
        std::vector<Tensor> ts = tensors_from(tensors, "sync");
        py::gil_scoped_release release;
        sync(ts);
      }, arg("tensors"), "Computes these tensors, as one graph.")
      .fn("mark_dynamic", [](const Tensor& t, py::handle dims) { for_each_dim(t, dims, mark_dynamic); },
          arg("tensor"), arg("dim"),
          "Marks a dim (or each of a list of dims) of a tensor dynamic: graphs reading its data are "
          "compiled once per bucket of that size (the next power of two), not once per size.")
      .fn("maybe_mark_dynamic", [](const Tensor& t, py::handle dims) { for_each_dim(t, dims, maybe_mark_dynamic); },
          arg("tensor"), arg("dim"),
          "As mark_dynamic, but the dim stays static in a graph where it meets a static dim of its size.")
      .fn("dynamic_dims", &dynamic_dims, arg("tensor"), "The dims of a tensor marked dynamic.");
}

}  // namespace lazyrt::python
