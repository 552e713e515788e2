// The places a compiled step reads Python values from (lazyrt/_reads.py's walk) and their
// checks, for lazyrt._C's compiled steps and lazyrt._torch_C's guard: a place (a closure cell,
// an entry of a dict, an attribute in an object's own dict) and what it held, compared by value
// (plain values), by identity, or by metadata (tensors of a front end's kind, and tuples, lists
// and dicts of values: lazyrt._reads.meta). Header-only: each extension module compiles its own
// copy, with its own kind of tensor (`Leaf`).
#pragma once

#include <pybind11/pybind11.h>

#include <utility>
#include <vector>

namespace lazyrt::python::reads {

namespace py = pybind11;

// Python values compared by value (int, float, bool, str, None, tuples of them): same type and
// the same object or ==, as a tuple comparison in Python does. Other values are not plain.
inline bool is_plain(py::handle v, bool nested = false) {
  PyObject* o = v.ptr();
  if (o == Py_None || PyBool_Check(o) || PyLong_CheckExact(o) || PyFloat_CheckExact(o) || PyUnicode_CheckExact(o))
    return true;
  if (!nested && PyTuple_CheckExact(o)) {
    for (py::handle x : py::reinterpret_borrow<py::tuple>(v))
      if (!is_plain(x, true)) return false;
    return true;
  }
  return false;
}
inline bool same_plain(py::handle v, py::handle expected) {
  if (v.ptr() == expected.ptr()) return true;
  if (Py_TYPE(v.ptr()) != Py_TYPE(expected.ptr()) || !is_plain(v)) return false;
  const int eq = PyObject_RichCompareBool(v.ptr(), expected.ptr(), Py_EQ);
  if (eq < 0) {
    PyErr_Clear();
    return false;
  }
  return eq == 1;
}

// What a place holds now (kind: 0 a closure cell, 1 an entry of a dict, 2 an attribute in an
// object's own dict), borrowed; nullptr where it holds nothing (or the lookup failed: the error
// is cleared).
inline PyObject* read_place(int kind, py::handle holder, py::handle key) {
  if (kind == 0) return PyCell_GET(holder.ptr());
  PyObject* dict = holder.ptr();
  if (kind == 2) {
    PyObject** d = _PyObject_GetDictPtr(dict);
    dict = d ? *d : nullptr;
  }
  if (!dict) return nullptr;
  PyObject* now = PyDict_GetItemWithError(dict, key.ptr());
  if (!now && PyErr_Occurred()) PyErr_Clear();
  return now;
}

// An item of a tuple, list or dict (key: an index, or the dict's key), borrowed; nullptr where
// there is none.
inline PyObject* item_of(PyObject* v, PyObject* key) {
  if (PyDict_CheckExact(v)) {
    PyObject* x = PyDict_GetItemWithError(v, key);
    if (!x && PyErr_Occurred()) PyErr_Clear();
    return x;
  }
  if (!PyTuple_CheckExact(v) && !PyList_CheckExact(v)) return nullptr;
  const Py_ssize_t i = PyLong_AsSsize_t(key);
  if (i == -1 && PyErr_Occurred()) {
    PyErr_Clear();
    return nullptr;
  }
  const Py_ssize_t n = PyTuple_CheckExact(v) ? PyTuple_GET_SIZE(v) : PyList_GET_SIZE(v);
  if (i < 0 || i >= n) return nullptr;
  return PyTuple_CheckExact(v) ? PyTuple_GET_ITEM(v, i) : PyList_GET_ITEM(v, i);
}

// lazyrt._reads.DEPTH and MAX_ITEMS: how deep and how large the tuples, lists and dicts are
// that a value's metadata looks into.
struct MetaLimits {
  int depth = 0;
  Py_ssize_t items = 0;
};

// The items of an exact tuple, list or dict within the limits, as (key or nullptr for an index,
// item) pairs; false for other values.
inline bool items_of(PyObject* v, const MetaLimits& limits, int depth,
                     std::vector<std::pair<PyObject*, PyObject*>>& out) {
  out.clear();
  if (depth >= limits.depth) return false;
  if (PyDict_CheckExact(v)) {
    if (PyDict_Size(v) > limits.items) return false;
    Py_ssize_t pos = 0;
    PyObject *k, *x;
    while (PyDict_Next(v, &pos, &k, &x)) out.emplace_back(k, x);
    return true;
  }
  if (!PyTuple_CheckExact(v) && !PyList_CheckExact(v)) return false;
  const Py_ssize_t n = PyTuple_CheckExact(v) ? PyTuple_GET_SIZE(v) : PyList_GET_SIZE(v);
  if (n > limits.items) return false;
  for (Py_ssize_t i = 0; i < n; ++i)
    out.emplace_back(nullptr, PyTuple_CheckExact(v) ? PyTuple_GET_ITEM(v, i) : PyList_GET_ITEM(v, i));
  return true;
}

// What a capture depends on of a value it reads from a place by its metadata, by the rules of
// lazyrt._reads.meta: a tensor of the front end's kind (`Leaf`: is(), of(), same()) by its
// metadata; an exact tuple, list or dict within the limits by its class and its keys and items'
// metadata, in order; a plain value by value; any other object by identity (held).
template <class Leaf>
struct ValueMeta {
  enum Kind { Tensor, Items, Plain, Object } kind = Object;
  PyTypeObject* type = nullptr;
  typename Leaf::Meta tensor;  // Tensor
  py::object value;            // Plain: the value; Object: the object
  std::vector<std::pair<py::object, ValueMeta>> items;  // Items: (key or index, item)

  static ValueMeta of(PyObject* v, const MetaLimits& limits, int depth = 0) {
    ValueMeta m;
    m.type = Py_TYPE(v);
    if (Leaf::is(v)) {
      m.kind = Tensor;
      m.tensor = Leaf::of(v);
      return m;
    }
    std::vector<std::pair<PyObject*, PyObject*>> items;
    if (items_of(v, limits, depth, items)) {
      m.kind = Items;
      Py_ssize_t i = 0;
      for (auto [k, x] : items) {
        py::object key = k ? py::reinterpret_borrow<py::object>(k) : py::int_(i);
        m.items.emplace_back(std::move(key), of(x, limits, depth + 1));
        ++i;
      }
      return m;
    }
    m.kind = is_plain(v) ? Plain : Object;
    m.value = py::reinterpret_borrow<py::object>(v);
    return m;
  }

  bool holds(PyObject* v, const MetaLimits& limits, int depth = 0) const {
    if (!v || Py_TYPE(v) != type) return false;
    switch (kind) {
      case Tensor: return Leaf::same(v, tensor);
      case Plain: return same_plain(v, value);
      case Object: return v == value.ptr();
      case Items: {
        std::vector<std::pair<PyObject*, PyObject*>> now;
        if (!items_of(v, limits, depth, now) || now.size() != items.size()) return false;
        for (size_t i = 0; i < now.size(); ++i) {
          const auto& [key, item] = items[i];
          if (now[i].first && now[i].first != key.ptr()) {
            const int eq = PyObject_RichCompareBool(now[i].first, key.ptr(), Py_EQ);
            if (eq != 1) {
              if (eq < 0) PyErr_Clear();
              return false;
            }
          }
          if (!item.holds(now[i].second, limits, depth + 1)) return false;
        }
        return true;
      }
    }
    return false;
  }
};

// A front end with no tensors read by metadata (lazyrt's own: its tensors are objects).
struct NoTensors {
  struct Meta {};
  static bool is(PyObject*) { return false; }
  static Meta of(PyObject*) { return {}; }
  static bool same(PyObject*, const Meta&) { return false; }
};

// The reads of a step (lazyrt._reads.python_reads, as a list of (kind, holder, key, present,
// value, how: 0 by value, 1 by identity, 2 by metadata)), checked against what their places hold
// now.
template <class Leaf>
class Reads {
 public:
  Reads() = default;
  Reads(py::handle reads, MetaLimits limits) : limits_(limits) {
    for (py::handle r : reads) {
      auto t = r.cast<py::tuple>();
      Read read{t[0].cast<int>(), py::reinterpret_borrow<py::object>(t[1]), py::reinterpret_borrow<py::object>(t[2]),
                t[3].cast<bool>(), py::reinterpret_borrow<py::object>(t[4]), t[5].cast<int>(), {}};
      if (read.how == Metadata && read.present) read.meta = ValueMeta<Leaf>::of(read.value.ptr(), limits_);
      reads_.push_back(std::move(read));
    }
  }

  bool hold() const {
    for (const Read& r : reads_) {
      PyObject* now = read_place(r.kind, r.holder, r.key);
      if (!now || !r.present) {
        if (now || r.present) return false;
        continue;
      }
      if (r.how == Metadata) {
        if (!r.meta.holds(now, limits_)) return false;
      } else if (now != r.value.ptr() && (r.how == Identity || !same_plain(now, r.value))) {
        return false;
      }
    }
    return true;
  }
  const MetaLimits& limits() const { return limits_; }
  bool empty() const { return reads_.empty(); }

 private:
  enum How { Value = 0, Identity = 1, Metadata = 2 };
  struct Read {
    int kind;
    py::object holder, key;
    bool present;
    py::object value;
    int how;
    ValueMeta<Leaf> meta;
  };
  MetaLimits limits_;
  std::vector<Read> reads_;
};

}  // namespace lazyrt::python::reads
