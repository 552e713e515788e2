// lazyrt.Tensor: properties, operators (with Python numbers on either side), in-place updates,
// autograd, and reading values (item, bool/int/float, repr), which syncs with the GIL released.
#include "bindings.h"

namespace lazyrt::python {

// Syncs t without the GIL (other Python threads run while the graph compiles and executes), and
// gives its elements in host memory.
std::shared_ptr<const void> host_released(const Tensor& t) {
  py::gil_scoped_release release;
  return t.host_data();
}

namespace {

// The one element of a synced one-element tensor, as the Python number of its kind.
py::object element(const Tensor& t, const char* what) {
  if (t.numel() != 1)
    throw Error(std::string(what) + ": a tensor with " + std::to_string(t.numel()) + " elements (shape " +
                shape_str(t.shape()) + ") cannot be converted to a Python number; expected one element");
  const std::shared_ptr<const void> host = host_released(t);
  const void* p = host.get();
  switch (t.dtype()) {
    case DType::f32: return py::float_(*static_cast<const float*>(p));
    case DType::f64: return py::float_(*static_cast<const double*>(p));
    case DType::i32: return py::int_(*static_cast<const int32_t*>(p));
    case DType::i64: return py::int_(static_cast<long long>(*static_cast<const int64_t*>(p)));
    case DType::b8: return py::bool_(*static_cast<const uint8_t*>(p) != 0);
    case DType::bf16:
    case DType::f16: return py::float_(t.item());
  }
  return py::none();
}

Scalar negate(Scalar s) {
  switch (s.kind()) {
    case Scalar::Kind::Float: return Scalar(-s.to_double());
    case Scalar::Kind::Int: return Scalar(static_cast<int64_t>(-s.to_double()));
    case Scalar::Kind::Bool: return Scalar(static_cast<int64_t>(-s.to_double()));
  }
  return s;
}

std::string pending_repr(const Tensor& t) {
  std::string shape = "(";
  for (size_t i = 0; i < t.shape().size(); ++i) shape += (i ? ", " : "") + std::to_string(t.shape()[i]);
  shape += t.shape().size() == 1 ? ",)" : ")";
  return std::string("tensor(<not readable here>, shape=") + shape + ", dtype=lazyrt." + dtype_py_name(t.dtype()) +
         ")";
}

// True division in place needs a floating tensor, as in PyTorch.
void check_div_(const Tensor& t) {
  if (!is_floating(t.dtype()))
    throw Error(std::string("div_: the result is floating and cannot be stored in place in a ") +
                dtype_name(t.dtype()) + " tensor; use div (not in place) or cast the tensor first");
}

using Operand = std::variant<Tensor, Scalar>;
Tensor operand(const Operand& o, const Tensor& like) {
  if (const Tensor* t = std::get_if<Tensor>(&o)) return *t;
  return scalar_like(std::get<Scalar>(o), like);
}

// ---- fast paths for the arithmetic operators ------------------------------------------------
// Tracing is the hot path of every model: `a + b` between two tensors, or a tensor and a plain
// Python number, goes straight from the type's number slot to the op, skipping pybind11's
// generic dispatch (its argument vectors and overload loop), which costs about as much as
// recording the op. Anything else (NumPy scalars, other types) goes to the bound __add__ /
// __radd__ methods, as CPython's own slot would.
PyTypeObject* tensor_type = nullptr;
PyObject* error_type = nullptr;

const Tensor* tensor_of(PyObject* o) {
  if (!PyObject_TypeCheck(o, tensor_type)) return nullptr;
  auto* inst = reinterpret_cast<py::detail::instance*>(o);
  if (!inst->simple_layout || !inst->simple_holder_constructed) return nullptr;
  return static_cast<const Tensor*>(inst->simple_value_holder[0]);
}

enum class Arith { Add, Sub, Mul, Div };
// The methods the fallback calls: the bound operator of a tensor on the left, else the
// reflected one of a tensor on the right (what CPython's own slot would have done).
constexpr const char* kMethods[4][2] = {
    {"__add__", "__radd__"}, {"__sub__", "__rsub__"}, {"__mul__", "__rmul__"}, {"__truediv__", "__rtruediv__"}};

PyObject* call_method(PyObject* self, const char* name, PyObject* arg) {
  PyObject* method = PyObject_GetAttrString(self, name);
  if (!method) return nullptr;
  PyObject* r = PyObject_CallOneArg(method, arg);
  Py_DECREF(method);
  return r;
}

PyObject* fallback(Arith op, PyObject* a, PyObject* b) {
  const auto& names = kMethods[static_cast<int>(op)];
  if (PyObject_TypeCheck(a, tensor_type)) {
    PyObject* r = call_method(a, names[0], b);
    if (r != Py_NotImplemented) return r;
    Py_DECREF(r);
  }
  if (PyObject_TypeCheck(b, tensor_type)) return call_method(b, names[1], a);
  Py_RETURN_NOTIMPLEMENTED;
}

// A plain Python number (bool, int, float) as a Scalar of its kind.
std::optional<Scalar> number_of(PyObject* o) {
  if (PyFloat_CheckExact(o)) return Scalar(PyFloat_AS_DOUBLE(o));
  if (PyBool_Check(o)) return Scalar(o == Py_True);
  if (PyLong_CheckExact(o)) {
    int overflow = 0;
    const long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (!overflow) return Scalar(static_cast<int64_t>(v));
  }
  return std::nullopt;
}

template <Arith op, class A, class B>
Tensor apply_arith(const A& a, const B& b) {
  if constexpr (op == Arith::Add) return a + b;
  if constexpr (op == Arith::Sub) return a - b;
  if constexpr (op == Arith::Mul) return a * b;
  return a / b;
}

template <Arith op>
PyObject* fast_arith(PyObject* a, PyObject* b) {
  try {
    Tensor r;
    if (const Tensor* x = tensor_of(a)) {
      if (const Tensor* y = tensor_of(b)) r = apply_arith<op>(*x, *y);
      else if (std::optional<Scalar> s = number_of(b)) r = apply_arith<op>(*x, *s);
    } else if (const Tensor* y = tensor_of(b)) {
      if (std::optional<Scalar> s = number_of(a)) r = apply_arith<op>(*s, *y);
    }
    if (!r.defined()) return fallback(op, a, b);
    return py::cast(std::move(r)).release().ptr();
  } catch (const Error& e) {
    PyErr_SetString(error_type, e.what());
  } catch (py::error_already_set& e) {
    e.restore();
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
  }
  return nullptr;
}

void install_fast_arith(py::class_<Tensor>& cls, py::handle error) {
  tensor_type = reinterpret_cast<PyTypeObject*>(cls.ptr());
  error_type = error.ptr();
  PyNumberMethods* nb = tensor_type->tp_as_number;
  nb->nb_add = &fast_arith<Arith::Add>;
  nb->nb_subtract = &fast_arith<Arith::Sub>;
  nb->nb_multiply = &fast_arith<Arith::Mul>;
  nb->nb_true_divide = &fast_arith<Arith::Div>;
  PyType_Modified(tensor_type);
}

}  // namespace

void bind_tensor(py::module_& m, py::class_<Tensor>& cls) {
  cls.def(py::init([](const Tensor& other) { return Tensor(other); }), py::arg("other"),
          "A new handle on `other`'s value and state (used by subclasses such as nn.Parameter).");

  // ---- properties ----
  cls.def_property_readonly("shape", [](const Tensor& t) {
       const Shape& s = t.shape();
       py::tuple out(s.size());
       for (size_t i = 0; i < s.size(); ++i) out[i] = py::int_(s[i]);
       return out;
     })
      .def("size", [](const Tensor& t, std::optional<int64_t> d) -> py::object {
        if (d) return py::int_(t.size(*d));
        return py::module_::import("builtins").attr("tuple")(py::cast(t.shape()));
      }, py::arg("dim") = py::none())
      .def_property_readonly("dtype", &Tensor::dtype)
      .def_property_readonly("ndim", &Tensor::dim)
      .def("dim", &Tensor::dim)
      .def("numel", &Tensor::numel)
      .def("element_size", [](const Tensor& t) { return dtype_size(t.dtype()); })
      .def("is_floating_point", [](const Tensor& t) { return is_floating(t.dtype()); })
      .def("is_pending", &Tensor::is_pending, "Whether the tensor holds IR not computed yet.")
      .def_property_readonly("is_leaf", &Tensor::is_leaf)
      .def_property("requires_grad", &Tensor::requires_grad,
                    [](Tensor& t, bool on) { t.requires_grad_(on); })
      .def("requires_grad_", [](py::object self, bool on) {
        self.cast<Tensor&>().requires_grad_(on);
        return self;
      }, py::arg("requires_grad") = true)
      .def_property("grad",
                    [](const Tensor& t) -> std::optional<Tensor> {
                      Tensor g = t.grad();
                      if (!g.defined()) return std::nullopt;
                      return g;
                    },
                    [](Tensor& t, std::optional<Tensor> g) { t.set_grad(g ? *g : Tensor()); })
      .def("backward", [](const Tensor& t, std::optional<Tensor> gradient) {
        t.backward(gradient ? *gradient : Tensor());
      }, py::arg("gradient") = py::none(),
         "Accumulates gradients into the .grad of the leaves; lazy, like the forward.")
      .def("detach", &Tensor::detach)
      .def_property("data", &Tensor::detach, [](Tensor& t, const Tensor& v) { t.set_data(v); },
                    "A view that does not require grad (writes through it keep the autograd history); "
                    "assigning gives the tensor a new value of the same shape and dtype.");

  // ---- reading values ----
  cls.def("item", [](const Tensor& t) { return element(t, "item"); })
      .def("__bool__", [](const Tensor& t) {
        if (t.numel() != 1)
          throw Error("bool: the truth value of a tensor with " + std::to_string(t.numel()) +
                      " elements is ambiguous; expected one element");
        return PyObject_IsTrue(element(t, "bool").ptr()) == 1;
      })
      .def("__float__", [](const Tensor& t) { return py::float_(element(t, "float")); })
      .def("__int__", [](const Tensor& t) { return py::int_(element(t, "int")); })
      .def("__index__", [](const Tensor& t) {
        if (is_floating(t.dtype()))
          throw py::type_error("only integer tensors of a single element can be converted to an index");
        return py::int_(element(t, "index"));
      })
      .def("__len__", [](const Tensor& t) {
        if (t.dim() == 0) throw py::type_error("len() of a 0-d tensor");
        return t.shape()[0];
      })
      .def("__repr__", [](const Tensor& t) {
        try {
          py::gil_scoped_release release;
          return t.to_string();
        } catch (const Error&) {
          // Inside a loop body or a compile_step trace values are symbolic.
          return pending_repr(t);
        }
      })
      .def("data_ptr", [](const Tensor& t) {
        return reinterpret_cast<uintptr_t>(host_released(t).get());
      }, "The address of the tensor's data (syncs).");

  // ---- operators ----
  // Each takes a tensor or a Python number; a number keeps its kind (int stays int).
  cls.def("__add__", [](const Tensor& a, const Tensor& b) { return a + b; }, py::is_operator())
      .def("__add__", [](const Tensor& a, Scalar b) { return a + b; }, py::is_operator())
      .def("__radd__", [](const Tensor& a, Scalar b) { return b + a; }, py::is_operator())
      .def("__sub__", [](const Tensor& a, const Tensor& b) { return a - b; }, py::is_operator())
      .def("__sub__", [](const Tensor& a, Scalar b) { return a - b; }, py::is_operator())
      .def("__rsub__", [](const Tensor& a, Scalar b) { return b - a; }, py::is_operator())
      .def("__mul__", [](const Tensor& a, const Tensor& b) { return a * b; }, py::is_operator())
      .def("__mul__", [](const Tensor& a, Scalar b) { return a * b; }, py::is_operator())
      .def("__rmul__", [](const Tensor& a, Scalar b) { return b * a; }, py::is_operator())
      .def("__truediv__", [](const Tensor& a, const Tensor& b) { return a / b; }, py::is_operator())
      .def("__truediv__", [](const Tensor& a, Scalar b) { return a / b; }, py::is_operator())
      .def("__rtruediv__", [](const Tensor& a, Scalar b) { return b / a; }, py::is_operator())
      .def("__pow__", [](const Tensor& a, const Tensor& b) { return pow(a, b); }, py::is_operator())
      .def("__pow__", [](const Tensor& a, Scalar e) { return pow(a, e); }, py::is_operator())
      .def("__rpow__", [](const Tensor& a, Scalar b) { return pow(scalar_like(b, a), a); }, py::is_operator())
      .def("__matmul__", [](const Tensor& a, const Tensor& b) { return matmul(a, b); }, py::is_operator())
      .def("__neg__", [](const Tensor& a) { return -a; })
      .def("__pos__", [](const Tensor& a) { return a; })
      .def("__abs__", [](const Tensor& a) { return abs(a); })
      .def("__invert__", [](const Tensor& a) {
        if (a.dtype() != DType::b8) throw Error("~: bitwise not is supported for bool tensors only (logical_not)");
        return logical_not(a);
      })
      .def("__and__", [](const Tensor& a, const Tensor& b) {
        if (a.dtype() != DType::b8 || b.dtype() != DType::b8)
          throw Error("&: supported for bool tensors only (logical_and)");
        return logical_and(a, b);
      }, py::is_operator())
      .def("__or__", [](const Tensor& a, const Tensor& b) {
        if (a.dtype() != DType::b8 || b.dtype() != DType::b8)
          throw Error("|: supported for bool tensors only (logical_or)");
        return logical_or(a, b);
      }, py::is_operator());
#define LAZYRT_COMPARISON(py_name, op)                                                           \
  cls.def(py_name, [](const Tensor& a, const Tensor& b) { return a op b; }, py::is_operator()) \
      .def(py_name, [](const Tensor& a, Scalar b) { return a op b; }, py::is_operator());
  LAZYRT_COMPARISON("__eq__", ==)
  LAZYRT_COMPARISON("__ne__", !=)
  LAZYRT_COMPARISON("__lt__", <)
  LAZYRT_COMPARISON("__le__", <=)
  LAZYRT_COMPARISON("__gt__", >)
  LAZYRT_COMPARISON("__ge__", >=)
#undef LAZYRT_COMPARISON
  install_fast_arith(cls, m.attr("Error"));

  // ---- in place: the handle (and the Python object) keeps its identity ----
  auto add_ = [](py::object self, const Operand& other, Scalar alpha) {
    Tensor& t = self.cast<Tensor&>();
    t.add_(operand(other, t), alpha);
    return self;
  };
  auto sub_ = [](py::object self, const Operand& other, Scalar alpha) {
    Tensor& t = self.cast<Tensor&>();
    if (t.dtype() == DType::b8) throw Error("sub_: subtraction of a b8 tensor is not supported");
    t.add_(operand(other, t), negate(alpha));
    return self;
  };
  auto mul_ = [](py::object self, const Operand& other) {
    Tensor& t = self.cast<Tensor&>();
    t.mul_(operand(other, t));
    return self;
  };
  auto div_ = [](py::object self, const Operand& other) {
    Tensor& t = self.cast<Tensor&>();
    check_div_(t);
    t.copy_(std::holds_alternative<Tensor>(other) ? t / std::get<Tensor>(other) : t / std::get<Scalar>(other));
    return self;
  };
  cls.def("add_", add_, py::arg("other"), py::kw_only(), py::arg("alpha") = 1)
      .def("sub_", sub_, py::arg("other"), py::kw_only(), py::arg("alpha") = 1)
      .def("mul_", mul_, py::arg("other"))
      .def("div_", div_, py::arg("other"))
      .def("__iadd__", [add_](py::object self, const Operand& o) { return add_(self, o, 1); }, py::is_operator())
      .def("__isub__", [sub_](py::object self, const Operand& o) { return sub_(self, o, 1); }, py::is_operator())
      .def("__imul__", mul_, py::is_operator())
      .def("__itruediv__", div_, py::is_operator())
      .def("copy_", [](py::object self, const Tensor& src) {
        self.cast<Tensor&>().copy_(src);
        return self;
      }, py::arg("src"))
      .def("fill_", [](py::object self, Scalar value) {
        Tensor& t = self.cast<Tensor&>();
        t.copy_(full({}, value, t.dtype()));
        return self;
      }, py::arg("value"))
      .def("zero_", [](py::object self) {
        self.cast<Tensor&>().zero_();
        return self;
      });

  // ---- conversions and no-ops kept for PyTorch code ----
  cls.def("to", [](const Tensor& t, DType dtype) { return t.to(dtype); }, py::arg("dtype"))
      .def("to", [](const Tensor& t, py::object device) {
        // .to(device) is how PyTorch code moves data; lazyrt tensors live on one device.
        if (!py::isinstance<py::str>(device) && !py::hasattr(device, "type"))
          throw py::type_error("to: expected a lazyrt dtype or a device");
        return t;
      }, py::arg("device"))
      .def("float", [](const Tensor& t) { return t.to(DType::f32); })
      .def("double", [](const Tensor& t) { return t.to(DType::f64); })
      .def("half", [](const Tensor& t) { return t.to(DType::f16); })
      .def("bfloat16", [](const Tensor& t) { return t.to(DType::bf16); })
      .def("int", [](const Tensor& t) { return t.to(DType::i32); })
      .def("long", [](const Tensor& t) { return t.to(DType::i64); })
      .def("bool", [](const Tensor& t) { return t.to(DType::b8); })
      .def("cpu", [](const Tensor& t) { return t; })
      .def("contiguous", [](py::object self) -> py::object {
        const auto& t = self.cast<const Tensor&>();
        return t.is_contiguous() ? self : py::cast(t.contiguous());
      }, "This tensor when contiguous, else a contiguous copy.")
      .def("is_contiguous", [](const Tensor& t) { return t.is_contiguous(); })
      .def("stride", [](const Tensor& t, py::object dim) -> py::object {
        const std::vector<int64_t> s = t.strides();
        if (dim.is_none()) return py::tuple(py::cast(s));
        auto d = dim.cast<int64_t>();
        const auto n = static_cast<int64_t>(s.size());
        if (d < -n || d >= n)
          throw py::index_error("stride: dim " + std::to_string(d) + " out of range for a tensor of " +
                                std::to_string(n) + " dims");
        return py::int_(s[static_cast<size_t>(d < 0 ? d + n : d)]);
      }, py::arg("dim") = py::none())
      .def("storage_offset", [](const Tensor& t) { return t.storage_offset(); })
      .def("_is_view", [](const Tensor& t) { return t.is_view(); })
      .def("clone", [](const Tensor& t) { return t.clone(); });
}

}  // namespace lazyrt::python
