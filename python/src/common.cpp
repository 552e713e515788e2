// Conversions shared by every binding file: dtype objects, numbers, dims, shapes, tensor lists.
#include <array>

#include "bindings.h"

namespace lazyrt::python {

namespace {

std::array<py::object, kNumDTypes>& dtype_objects() {
  // Leaked on purpose: the objects live as long as the interpreter, and destroying Python
  // objects after it has finalized would crash.
  static auto* objects = new std::array<py::object, kNumDTypes>();
  return *objects;
}

// NumPy's scalar types, so that np.float32(2) counts as a float and np.int64(2) as an int.
struct NumpyScalarTypes {
  py::handle bool_, integer, floating;
};
const NumpyScalarTypes& numpy_scalar_types() {
  static NumpyScalarTypes* types = [] {
    py::module_ np = py::module_::import("numpy");
    return new NumpyScalarTypes{py::object(np.attr("bool_")).release(), py::object(np.attr("integer")).release(),
                                py::object(np.attr("floating")).release()};
  }();
  return *types;
}

}  // namespace

const char* dtype_py_name(DType d) {
  switch (d) {
    case DType::f32: return "float32";
    case DType::f64: return "float64";
    case DType::bf16: return "bfloat16";
    case DType::f16: return "float16";
    case DType::i32: return "int32";
    case DType::i64: return "int64";
    case DType::b8: return "bool";
  }
  return "?";
}

py::object dtype_object(DType d) { return dtype_objects()[static_cast<size_t>(d)]; }

void bind_dtypes(py::module_& m) {
  py::class_<DTypeObject>(m, "dtype", "The element type of a tensor: lazyrt.float32, lazyrt.int64, ...")
      .def_property_readonly("is_floating_point", [](const DTypeObject& d) { return is_floating(d.dtype); })
      .def_property_readonly("itemsize", [](const DTypeObject& d) { return dtype_size(d.dtype); })
      .def("__repr__", [](const DTypeObject& d) { return std::string("lazyrt.") + dtype_py_name(d.dtype); })
      // Pickles by name, as the attribute of lazyrt._C: unpickling gives the same object.
      .def("__reduce__", [](const DTypeObject& d) { return std::string(dtype_py_name(d.dtype)); });
  for (int i = 0; i < kNumDTypes; ++i) {
    const auto d = static_cast<DType>(i);
    py::object obj = py::cast(DTypeObject{d});
    dtype_objects()[i] = obj;
    m.attr(dtype_py_name(d)) = obj;
  }
  m.def("promote_types", &promote_types, py::arg("type1"), py::arg("type2"),
        "PyTorch's promotion of two tensor dtypes (bool < int < float, the wider within a kind).");
  // PyTorch's aliases.
  m.attr("float") = dtype_object(DType::f32);
  m.attr("double") = dtype_object(DType::f64);
  m.attr("half") = dtype_object(DType::f16);
  m.attr("int") = dtype_object(DType::i32);
  m.attr("long") = dtype_object(DType::i64);
}

DType scalar_dtype(Scalar s, DType like) {
  switch (s.kind()) {
    case Scalar::Kind::Float: return is_floating(like) ? like : DType::f32;
    case Scalar::Kind::Int: return like == DType::b8 ? DType::i64 : like;
    case Scalar::Kind::Bool: return like;
  }
  return like;
}

Tensor scalar_like(Scalar s, const Tensor& like) { return full({}, s, scalar_dtype(s, like.dtype())); }

Shape shape_from_sequence(py::handle seq, const char* op) {
  if (!py::isinstance<py::sequence>(seq) || py::isinstance<py::str>(seq) || py::isinstance<Tensor>(seq))
    throw py::type_error(std::string(op) + ": expected a sequence of ints for the shape, got " +
                         std::string(py::str(py::type::handle_of(seq).attr("__name__"))));
  Shape shape;
  for (py::object d : py::reinterpret_borrow<py::sequence>(seq)) {
    if (py::isinstance<py::bool_>(d) || !py::hasattr(d, "__index__") || py::isinstance<Tensor>(d))
      throw py::type_error(std::string(op) + ": shape entries must be ints, got " +
                           std::string(py::str(py::type::handle_of(d).attr("__name__"))));
    PyObject* index = PyNumber_Index(d.ptr());
    if (!index) throw py::error_already_set();
    int overflow = 0;
    const long long v = PyLong_AsLongLongAndOverflow(index, &overflow);
    Py_DECREF(index);
    if (overflow)
      throw Error(std::string(op) + ": shape entry " + std::string(py::str(d)) +
                  " does not fit in a 64-bit size");
    shape.push_back(static_cast<int64_t>(v));
  }
  return shape;
}

Shape shape_from_args(const py::args& args, const char* op) {
  if (args.size() == 1 && py::isinstance<py::sequence>(args[0])) return shape_from_sequence(args[0], op);
  return shape_from_sequence(args, op);
}

Shape shape_from_args(const py::args& args, const py::kwargs& kwargs, const char* key, const char* op) {
  if (kwargs.empty()) return shape_from_args(args, op);
  if (args.size() != 0 || kwargs.size() != 1 || !kwargs.contains(key))
    throw py::type_error(std::string(op) + "(): takes the sizes as separate ints, one sequence, or " + key +
                         "=sequence");
  return shape_from_sequence(kwargs[key], op);
}

std::vector<Tensor> tensors_from(py::handle seq, const char* what) {
  std::vector<Tensor> out;
  // One caster, one type lookup per element (a replay's inputs come through here every call).
  py::detail::make_caster<Tensor> tensor;
  const bool listed = PyList_Check(seq.ptr()) || PyTuple_Check(seq.ptr());
  if (!listed && tensor.load(seq, false)) {
    out.push_back(py::detail::cast_op<Tensor&>(tensor));
    return out;
  }
  if (!listed && (!py::isinstance<py::sequence>(seq) || py::isinstance<py::str>(seq)))
    throw py::type_error(std::string(what) + ": expected a tuple or list of lazyrt tensors, got " +
                         std::string(py::str(py::type::handle_of(seq).attr("__name__"))));
  auto s = py::reinterpret_borrow<py::sequence>(seq);
  out.reserve(s.size());
  size_t i = 0;
  for (py::object h : s) {
    if (!tensor.load(h, false))
      throw py::type_error(std::string(what) + ": element " + std::to_string(i) +
                           " is not a lazyrt tensor but " +
                           std::string(py::str(py::type::handle_of(h).attr("__name__"))));
    out.push_back(py::detail::cast_op<Tensor&>(tensor));
    ++i;
  }
  return out;
}

py::tuple to_tuple(const std::vector<Tensor>& ts) {
  py::tuple t(ts.size());
  for (size_t i = 0; i < ts.size(); ++i) t[i] = py::cast(ts[i]);
  return t;
}

py::list to_list(const std::vector<Tensor>& ts) {
  py::list l(ts.size());
  for (size_t i = 0; i < ts.size(); ++i) l[i] = py::cast(ts[i]);
  return l;
}

}  // namespace lazyrt::python

namespace pybind11::detail {

bool type_caster<lazyrt::Scalar>::load(handle src, bool) {
  PyObject* o = src.ptr();
  if (PyBool_Check(o)) {
    value = lazyrt::Scalar(o == Py_True);
    return true;
  }
  if (PyLong_Check(o)) {
    int overflow = 0;
    const long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (overflow) return false;
    value = lazyrt::Scalar(static_cast<int64_t>(v));
    return true;
  }
  if (PyFloat_Check(o)) {
    value = lazyrt::Scalar(PyFloat_AS_DOUBLE(o));
    return true;
  }
  // NumPy scalars (np.float32(1), np.int64(2), np.bool_(True)); 0-d arrays are not numbers.
  if (std::string_view(Py_TYPE(o)->tp_name).find("numpy.") != 0) return false;
  const auto& np = lazyrt::python::numpy_scalar_types();
  if (PyObject_IsInstance(o, np.bool_.ptr()) == 1) {
    value = lazyrt::Scalar(PyObject_IsTrue(o) == 1);
    return true;
  }
  if (PyObject_IsInstance(o, np.integer.ptr()) == 1) {
    object i = reinterpret_steal<object>(PyNumber_Index(o));
    if (!i) {
      PyErr_Clear();
      return false;
    }
    value = lazyrt::Scalar(i.cast<int64_t>());
    return true;
  }
  if (PyObject_IsInstance(o, np.floating.ptr()) == 1) {
    value = lazyrt::Scalar(PyFloat_AsDouble(o));
    return true;
  }
  return false;
}

bool type_caster<lazyrt::python::Dims>::load(handle src, bool) {
  value = {};
  if (src.is_none()) return true;
  auto as_int = [](handle h, int64_t* out) {
    if (PyBool_Check(h.ptr()) || isinstance<lazyrt::Tensor>(h)) return false;
    if (PyLong_Check(h.ptr())) {
      *out = h.cast<int64_t>();
      return true;
    }
    if (!hasattr(h, "__index__")) return false;
    *out = reinterpret_steal<int_>(PyNumber_Index(h.ptr())).cast<int64_t>();
    return true;
  };
  int64_t d = 0;
  if (as_int(src, &d)) {
    value.dims = {d};
    value.given = true;
    return true;
  }
  if (!PyTuple_Check(src.ptr()) && !PyList_Check(src.ptr())) return false;
  for (handle h : reinterpret_borrow<sequence>(src)) {
    if (!as_int(h, &d)) return false;
    value.dims.push_back(d);
  }
  value.given = true;
  return true;
}

}  // namespace pybind11::detail
