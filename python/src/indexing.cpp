// Python's indexing: t[key] and t[key] = value, read the way PyTorch reads a key, onto
// Tensor::index and Tensor::index_put_ (include/lazyrt/tensor.h). A key is an int, a slice,
// None, Ellipsis, a bool, a lazyrt tensor, a NumPy array, a list, or a tuple of these. A NumPy
// array is an index tensor, whatever its rank (as in torch 2.x; 1.13 read a multi-dim array as
// a tuple of its rows). A list is an index tensor, unless it is short and holds a slice, None,
// Ellipsis, a tensor or a sequence: then it stands for a tuple (NumPy's old rule, which
// PyTorch keeps).
#include <pybind11/numpy.h>

#include <climits>

#include "bindings.h"

namespace lazyrt::python {

namespace {

using indexing::TensorIndex;

std::string type_name(py::handle h) { return py::str(py::type::handle_of(h).attr("__name__")); }

[[noreturn]] void refuse(py::handle h) {
  throw Error("index: only integers, slices (`:`), ellipsis (`...`), None, bools, lists, NumPy arrays and int64, "
              "int32 or bool tensors are valid indices (got " + type_name(h) + ")");
}

// A slice bound: None, or anything with __index__, clamped to int64.
std::optional<int64_t> bound(py::handle h) {
  if (h.is_none()) return std::nullopt;
  py::object i = py::reinterpret_steal<py::object>(PyNumber_Index(h.ptr()));
  if (!i) throw py::error_already_set();
  int overflow = 0;
  const long long v = PyLong_AsLongLongAndOverflow(i.ptr(), &overflow);
  if (overflow) return overflow > 0 ? INT64_MAX : INT64_MIN;
  return static_cast<int64_t>(v);
}

// An index tensor from a NumPy array (or a list made into one): integers as i64, bools as a
// b8 mask (its values are known: reading them syncs nothing).
Tensor from_array(py::handle obj) {
  py::module_ np = py::module_::import("numpy");
  py::array a = np.attr("asarray")(obj);
  const char kind = a.dtype().kind();
  Shape shape(a.shape(), a.shape() + a.ndim());
  if (kind == 'b') {
    py::array_t<bool, py::array::c_style | py::array::forcecast> b(a);
    std::vector<bool> v(b.data(), b.data() + b.size());
    return tensor(v, shape);
  }
  if (kind == 'u' && a.itemsize() == 1 && py::isinstance<py::array>(obj)) {
    // A uint8 array is a uint8 tensor to torch 2.x, which reads it as a mask (nonzero: true),
    // with a deprecation warning.
    if (PyErr_WarnEx(PyExc_UserWarning,
                     "indexing with dtype uint8 is deprecated (as in torch): the array is read as a mask; "
                     "use a bool array instead", 1) != 0)
      throw py::error_already_set();
    py::array_t<uint8_t, py::array::c_style | py::array::forcecast> u(a);
    std::vector<bool> v(u.size());
    for (py::ssize_t k = 0; k < u.size(); ++k) v[static_cast<size_t>(k)] = u.data()[k] != 0;
    return tensor(v, shape);
  }
  if (kind == 'i' || kind == 'u' || (a.size() == 0 && !py::isinstance<py::array>(obj))) {  // [] is an i64 index
    py::array_t<int64_t, py::array::c_style | py::array::forcecast> i(a);
    return tensor(std::vector<int64_t>(i.data(), i.data() + i.size()), shape);
  }
  throw Error("index: arrays used as indices must hold integers or bools; got values of NumPy dtype " +
              std::string(py::str(a.dtype())));
}

bool is_sequence(py::handle h) { return PySequence_Check(h.ptr()) && !py::isinstance<py::str>(h); }

bool treat_as_tuple(py::handle key) {
  if (py::isinstance<py::tuple>(key)) return true;
  if (py::isinstance<Tensor>(key) || py::isinstance<py::array>(key) || !is_sequence(key)) return false;
  const Py_ssize_t n = PySequence_Size(key.ptr());
  if (n < 0) {
    PyErr_Clear();
    return false;
  }
  if (n >= 32) return false;
  for (Py_ssize_t i = 0; i < n; ++i) {
    py::object item = py::reinterpret_steal<py::object>(PySequence_GetItem(key.ptr(), i));
    if (!item) {
      PyErr_Clear();
      return false;
    }
    if (py::isinstance<Tensor>(item) || is_sequence(item) || PySlice_Check(item.ptr()) || item.is(py::ellipsis()) ||
        item.is_none())
      return true;
  }
  return false;
}

TensorIndex entry(py::handle h) {
  if (h.is_none()) return indexing::None;
  if (h.is(py::ellipsis())) return indexing::Ellipsis;
  if (PyBool_Check(h.ptr())) return TensorIndex(h.ptr() == Py_True);
  if (py::isinstance<Tensor>(h)) return TensorIndex(h.cast<Tensor>());
  if (PyLong_Check(h.ptr())) return TensorIndex(*bound(h));
  if (PySlice_Check(h.ptr()))
    return indexing::Slice(bound(h.attr("start")), bound(h.attr("stop")), bound(h.attr("step")));
  if (py::isinstance<py::array>(h) || is_sequence(h)) return TensorIndex(from_array(h));
  if (PyIndex_Check(h.ptr()) && !PyFloat_Check(h.ptr())) return TensorIndex(*bound(h));  // NumPy integers
  refuse(h);
}

}  // namespace

std::vector<TensorIndex> index_of_key(py::handle key) {
  std::vector<TensorIndex> out;
  if (treat_as_tuple(key)) {
    // Items are held while they are read: a sequence may make them afresh (a NumPy array's
    // items are new scalars), and a handle to a temporary would dangle.
    const Py_ssize_t n = PySequence_Size(key.ptr());
    if (n < 0) throw py::error_already_set();
    for (Py_ssize_t i = 0; i < n; ++i) {
      py::object item = py::reinterpret_steal<py::object>(PySequence_GetItem(key.ptr(), i));
      if (!item) throw py::error_already_set();
      out.push_back(entry(item));
    }
  } else {
    out.push_back(entry(key));
  }
  return out;
}

namespace {
// Whether indexing reads a pending mask (a sync): then the GIL goes while it runs.
bool reads_pending(const std::vector<TensorIndex>& ix) {
  for (const TensorIndex& i : ix)
    if (i.is_tensor() && i.tensor().dtype() == DType::b8 && i.tensor().is_pending()) return true;
  return false;
}
}  // namespace

void bind_indexing(py::class_<Tensor>& cls) {
  cls.def("__getitem__", [](const Tensor& t, py::handle key) {
    std::vector<TensorIndex> ix = index_of_key(key);
    if (!reads_pending(ix)) return t.index(std::move(ix));
    py::gil_scoped_release release;
    return t.index(std::move(ix));
  }, py::arg("key"));
  cls.def("__setitem__", [](Tensor& t, py::handle key, py::handle value) {
    std::vector<TensorIndex> ix = index_of_key(key);
    const bool release = reads_pending(ix);
    if (py::isinstance<Tensor>(value)) {
      Tensor v = value.cast<Tensor>();
      if (!release) {
        t.index_put_(std::move(ix), v);
        return;
      }
      py::gil_scoped_release r;
      t.index_put_(std::move(ix), v);
      return;
    }
    Scalar s(0.0);
    try {
      s = value.cast<Scalar>();
    } catch (const py::cast_error&) {
      throw py::type_error("can't assign a " + type_name(value) + " to a lazyrt.Tensor (a tensor or a number is expected)");
    }
    if (!release) {
      t.index_put_(std::move(ix), s);
      return;
    }
    py::gil_scoped_release r;
    t.index_put_(std::move(ix), s);
  }, py::arg("key"), py::arg("value"));
}

}  // namespace lazyrt::python
